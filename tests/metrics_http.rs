//! The Prometheus endpoint over real TCP, in-process: `blklab::stats::http::serve`
//! on an ephemeral loopback port with a fixed stats document, raw HTTP
//! requests, the exposition text parsed, and a clean shutdown; slow and
//! trickling clients against the connection limits, in-process and
//! against `blklab serve --metrics` stopped by SIGTERM.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use blklab::stats::histogram::HistSummary;
use blklab::stats::http;
use blklab::stats::queue::{DiskReport, QueueCounters, QueueStats, StatsDocument};

fn document() -> StatsDocument {
    let config =
        common::disk_config(&["--socket", "/tmp/vd.sock", "--disk", "mem", "--size", "1G"]);
    let lat = HistSummary {
        count: 100,
        min: 50_000,
        max: 900_000,
        mean: 120_000.0,
        p50: 100_000,
        p90: 200_000,
        p99: 500_000,
        p999: 900_000,
    };
    // Through QueueStats, so fields added to QueueReport get defaults.
    let mut q = QueueStats::default().report(0, None);
    q.counters = QueueCounters {
        requests: 123,
        reads: 100,
        writes: 23,
        kicks: 40,
        wakeups: 41,
        ..QueueCounters::default()
    };
    q.latency_read_ns = lat;
    q.latency_write_ns = lat;
    StatsDocument::new(vec![DiskReport {
        config: Some(config),
        queues: vec![q],
        tag_pools: Vec::new(),
        connections: 1,
        connected: true,
        connections_at_start: None,
    }])
}

/// A raw HTTP exchange: send `request`, read until the server closes.
/// Returns (status, headers lower-cased, body).
fn exchange(addr: SocketAddr, request: &[u8]) -> (u16, HashMap<String, String>, String) {
    let mut s = TcpStream::connect(addr).expect("connect");
    // Generous: a loaded machine may be slow to answer; a server that
    // never answers still fails the test.
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(request).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read answer until close");
    let text = String::from_utf8(raw).expect("UTF-8 answer");
    let (head, body) = text.split_once("\r\n\r\n").expect("head and body");
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap();
    let mut parts = status_line.splitn(3, ' ');
    assert_eq!(parts.next(), Some("HTTP/1.1"), "{status_line}");
    let status: u16 = parts.next().unwrap().parse().unwrap();
    let headers = lines
        .map(|l| {
            let (k, v) = l.split_once(':').expect("header line");
            (k.trim().to_ascii_lowercase(), v.trim().to_string())
        })
        .collect::<HashMap<_, _>>();
    // (A HEAD answer's Content-Length is that of the GET body.)
    if let (Some(len), false) = (headers.get("content-length"), request.starts_with(b"HEAD ")) {
        assert_eq!(len.parse::<usize>().unwrap(), body.len());
    }
    (status, headers, body.to_string())
}

fn get(addr: SocketAddr, path: &str) -> (u16, HashMap<String, String>, String) {
    exchange(
        addr,
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nUser-Agent: test\r\n\r\n").as_bytes(),
    )
}

/// One sample: name, labels, value.
type Sample = (String, BTreeMap<String, String>, f64);

/// Parse exposition text, checking every line, that each family has one
/// HELP and one TYPE before its samples, and that its samples are
/// contiguous.
fn parse(text: &str) -> Vec<Sample> {
    let mut types: HashMap<String, String> = HashMap::new();
    let mut helps: HashSet<String> = HashSet::new();
    let mut done: HashSet<String> = HashSet::new();
    let mut current = String::new();
    let mut out = Vec::new();
    assert!(text.ends_with('\n'));
    for line in text.lines() {
        if let Some(c) = line.strip_prefix("# ") {
            let mut w = c.splitn(3, ' ');
            let (kw, name, rest) = (w.next().unwrap(), w.next().unwrap(), w.next().unwrap());
            assert!(!done.contains(name) && current != name, "late {kw}: {line}");
            match kw {
                "HELP" => assert!(helps.insert(name.into()), "second HELP: {line}"),
                "TYPE" => assert!(
                    types.insert(name.into(), rest.into()).is_none(),
                    "second TYPE: {line}"
                ),
                _ => {}
            }
            continue;
        }
        let end = line.find(['{', ' ']).expect("name");
        let name = &line[..end];
        let mut labels = BTreeMap::new();
        let mut rest = &line[end..];
        if let Some(mut l) = rest.strip_prefix('{') {
            loop {
                if let Some(r) = l.strip_prefix('}') {
                    rest = r;
                    break;
                }
                let (k, r) = l.split_once("=\"").expect("label=\"");
                let mut v = String::new();
                let mut it = r.char_indices();
                let close = loop {
                    match it.next().expect("closing quote") {
                        (i, '"') => break i,
                        (_, '\\') => match it.next().unwrap().1 {
                            'n' => v.push('\n'),
                            c @ ('\\' | '"') => v.push(c),
                            c => panic!("bad escape {c}: {line}"),
                        },
                        (_, c) => v.push(c),
                    }
                };
                labels.insert(k.to_string(), v);
                l = &r[close + 1..];
                l = l.strip_prefix(',').unwrap_or(l);
            }
        }
        let value = rest.strip_prefix(' ').expect("space before value");
        let value: f64 = match value {
            "NaN" => f64::NAN,
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("bad value: {line}")),
        };
        let fam = if types.contains_key(name) {
            name.to_string()
        } else {
            let base = name
                .strip_suffix("_sum")
                .or_else(|| name.strip_suffix("_count"))
                .unwrap_or_else(|| panic!("no TYPE for {line}"));
            assert_eq!(
                types.get(base).map(String::as_str),
                Some("summary"),
                "{line}"
            );
            base.to_string()
        };
        assert!(helps.contains(&fam), "no HELP for {line}");
        if fam != current {
            assert!(!done.contains(&fam), "family split: {line}");
            done.insert(std::mem::replace(&mut current, fam));
        }
        out.push((name.to_string(), labels, value));
    }
    out
}

#[test]
fn metrics_over_http() {
    let scrapes = Arc::new(AtomicUsize::new(0));
    let counted = scrapes.clone();
    let source: Arc<dyn Fn() -> StatsDocument + Send + Sync> = Arc::new(move || {
        counted.fetch_add(1, Ordering::SeqCst);
        document()
    });
    let shutdown = Arc::new(AtomicBool::new(false));
    let (addr, handle) = http::serve(
        http::parse_addr("127.0.0.1:0").unwrap(),
        source,
        shutdown.clone(),
    )
    .expect("bind an ephemeral loopback port");
    assert!(addr.ip().is_loopback());
    assert_ne!(addr.port(), 0);

    // The metrics.
    let (status, headers, body) = get(addr, "/metrics");
    assert_eq!(status, 200, "{body}");
    assert!(
        headers["content-type"].starts_with("text/plain; version=0.0.4"),
        "{headers:?}"
    );
    assert_eq!(headers["connection"], "close");
    assert!(body.contains("blklab_requests_total"));
    let samples = parse(&body);
    let value = |name: &str, want: &[(&str, &str)]| -> f64 {
        let v: Vec<&Sample> = samples
            .iter()
            .filter(|(n, l, _)| {
                n == name
                    && want
                        .iter()
                        .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
            })
            .collect();
        assert_eq!(v.len(), 1, "{name} {want:?}");
        v[0].2
    };
    let q0 = [("disk", "/tmp/vd.sock"), ("queue", "0")];
    assert_eq!(value("blklab_requests_total", &q0), 123.0);
    assert_eq!(value("blklab_kicks_total", &q0), 40.0);
    let p99 = value(
        "blklab_latency_seconds",
        &[
            ("disk", "/tmp/vd.sock"),
            ("queue", "0"),
            ("op", "read"),
            ("quantile", "0.99"),
        ],
    );
    assert!((p99 - 0.0005).abs() < 1e-12, "{p99}");
    assert_eq!(scrapes.load(Ordering::SeqCst), 1);

    // HEAD: same headers, no body.
    let (status, headers, body) = exchange(addr, b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(status, 200);
    assert!(body.is_empty());
    assert!(headers["content-length"].parse::<usize>().unwrap() > 100);

    // The index page links to /metrics.
    let (status, headers, body) = get(addr, "/");
    assert_eq!(status, 200);
    assert!(headers["content-type"].starts_with("text/html"));
    assert!(body.contains("href=\"/metrics\""), "{body}");

    // Unknown path, other method, garbage, bad header.
    assert_eq!(get(addr, "/nope").0, 404);
    assert_eq!(
        exchange(addr, b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n").0,
        405
    );
    assert_eq!(exchange(addr, b"garbage\r\n\r\n").0, 400);
    assert_eq!(
        exchange(addr, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\n").0,
        400
    );
    assert_eq!(
        exchange(addr, b"GET /metrics HTTP/1.1\r\nno colon\r\n\r\n").0,
        400
    );

    // A client that connects and sends nothing does not block the server:
    // the next scrape is answered (on a thread of its own), and the server
    // gives up on the idle one (its read timeout) and closes it.
    let mut idle = TcpStream::connect(addr).unwrap();
    assert_eq!(get(addr, "/metrics").0, 200);
    idle.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut rest = Vec::new();
    idle.read_to_end(&mut rest)
        .expect("the server closes the idle connection");
    assert!(
        rest.is_empty(),
        "no answer to a request never sent: {rest:?}"
    );

    // Shutdown: the thread ends (it checks the flag at least every 100 ms
    // while idle).
    shutdown.store(true, Ordering::SeqCst);
    let t = Instant::now();
    while !handle.is_finished() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "metrics thread still running 30 s after shutdown"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    handle.join().expect("metrics thread did not panic");
    // The port is closed.
    assert!(TcpStream::connect(addr).is_err());
}

/// A connection that sends `request` (if any), then one byte every 90 ms
/// for as long as the server keeps it (at most `limit`). Returns whether
/// the server closed it (a failed write or EOF), from its thread.
fn trickler(
    addr: SocketAddr,
    request: &'static [u8],
    limit: Duration,
) -> std::thread::JoinHandle<bool> {
    sender(addr, request, b"x", Duration::from_millis(90), limit)
}

/// A connection that sends `request`, then `piece` after every `pause`
/// for as long as the server keeps it (at most `limit`). Returns whether
/// the server closed it (a failed write), from its thread.
fn sender(
    addr: SocketAddr,
    request: &'static [u8],
    piece: &'static [u8],
    pause: Duration,
    limit: Duration,
) -> std::thread::JoinHandle<bool> {
    let mut s = TcpStream::connect(addr).expect("connect");
    std::thread::spawn(move || {
        if s.write_all(request).is_err() {
            return true;
        }
        let t = Instant::now();
        while t.elapsed() < limit {
            if s.write_all(piece).is_err() {
                return true;
            }
            std::thread::sleep(pause);
        }
        false
    })
}

fn serve_document() -> (SocketAddr, Arc<AtomicBool>, std::thread::JoinHandle<()>) {
    let shutdown = Arc::new(AtomicBool::new(false));
    let (addr, handle) = http::serve(
        http::parse_addr("127.0.0.1:0").unwrap(),
        Arc::new(document),
        shutdown.clone(),
    )
    .expect("bind an ephemeral loopback port");
    (addr, shutdown, handle)
}

#[test]
fn trickling_clients_do_not_block_other_scrapes() {
    let (addr, shutdown, handle) = serve_document();
    // One trickles after its request (into the lingering close), one
    // trickles its request head and never ends it.
    let after = trickler(
        addr,
        b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
        common::PATIENCE * 4,
    );
    let head = trickler(
        addr,
        b"GET /metrics HTTP/1.1\r\nX-Slow: ",
        common::PATIENCE * 4,
    );
    // Another scrape is answered meanwhile (exchange waits up to 30 s).
    for _ in 0..3 {
        let (status, _, body) = get(addr, "/metrics");
        assert_eq!(status, 200, "{body}");
    }
    // And the server ends both trickles itself (deadlines), long before
    // the tricklers would give up.
    assert!(after.join().unwrap(), "the server kept a trickling client");
    assert!(
        head.join().unwrap(),
        "the server kept a trickling request head"
    );
    shutdown.store(true, Ordering::SeqCst);
    handle.join().unwrap();
}

#[test]
fn connections_beyond_the_cap_get_503() {
    let (addr, shutdown, handle) = serve_document();
    // Hold every slot with silent connections, then scrape: 503. Silent
    // connections are dropped after READ_TIMEOUT, so on a slow machine a
    // round may see them gone (200); retry with fresh ones.
    let mut saw_503 = false;
    for _ in 0..20 {
        let held: Vec<TcpStream> = (0..http::MAX_CONNECTIONS)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect();
        let (status, headers, _) = get(addr, "/metrics");
        drop(held);
        assert!(status == 503 || status == 200, "{status}");
        if status == 503 {
            assert_eq!(headers["retry-after"], "1");
            saw_503 = true;
            break;
        }
    }
    assert!(saw_503, "never refused a connection beyond the cap");
    // The slots come back.
    common::wait_for("a free slot", common::PATIENCE, || {
        (get(addr, "/metrics").0 == 200).then_some(())
    });
    shutdown.store(true, Ordering::SeqCst);
    handle.join().unwrap();
}

#[test]
fn sigterm_ends_the_daemon_while_a_client_trickles() {
    // A free port (released again just before the daemon binds it).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let metrics = format!("127.0.0.1:{port}");
    let mut d = common::Daemon::spawn(&["--disk", "mem", "--size", "1M", "--metrics", &metrics], 1);
    let addr: SocketAddr = metrics.parse().unwrap();
    common::wait_for("the metrics port", common::PATIENCE, || {
        TcpStream::connect(addr).ok()
    });
    let after = trickler(
        addr,
        b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
        common::PATIENCE * 4,
    );
    let head = trickler(
        addr,
        b"GET /metrics HTTP/1.1\r\nX-Slow: ",
        common::PATIENCE * 4,
    );
    assert_eq!(get(addr, "/metrics").0, 200);
    // SIGTERM, and a clean exit within PATIENCE (terminate panics if not),
    // whatever the tricklers do.
    let status = d.terminate();
    assert!(status.success(), "{status:?}");
    assert!(after.join().unwrap());
    assert!(head.join().unwrap());
}

#[test]
fn oversized_and_stalled_heads_are_refused() {
    let (addr, shutdown, handle) = serve_document();
    // A head over MAX_HEAD: 431, without waiting for its end.
    let mut big = b"GET /metrics HTTP/1.1\r\nX-Big: ".to_vec();
    big.resize(big.len() + http::MAX_HEAD, b'a');
    let (status, _, body) = exchange(addr, &big);
    assert_eq!(status, 431, "{body}");
    // So many header lines that they are refused alike.
    let many = format!("GET /metrics HTTP/1.1\r\n{}\r\n", "a: b\r\n".repeat(100));
    assert_eq!(exchange(addr, many.as_bytes()).0, 431);
    // A head begun and never ended: 408 once the read timeout has passed.
    let t = Instant::now();
    let (status, _, _) = exchange(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n");
    assert_eq!(status, 408);
    assert!(t.elapsed() >= Duration::from_secs(1), "{:?}", t.elapsed());
    // A client that floods after its request is cut off (the lingering
    // close drains a bounded amount), and scrapes go on meanwhile.
    let flood = sender(
        addr,
        b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
        &[b'x'; 4096],
        Duration::from_millis(1),
        common::PATIENCE * 4,
    );
    assert_eq!(get(addr, "/metrics").0, 200);
    assert!(flood.join().unwrap(), "the server kept a flooding client");
    shutdown.store(true, Ordering::SeqCst);
    handle.join().unwrap();
}
