//! The device model against libblkio traffic: command-slot budgets
//! (per-queue versus shared), emulated latency, and the statistics that
//! show them.

mod common;

use std::time::{Duration, Instant};

use common::client::{Client, Op};
use common::Daemon;
use serde_json::Value;

/// Every queue keeps 16 reads in flight (closed loop, batches of 16) for
/// `run`; returns total IOPS.
fn qd16_iops(c: &mut Client, run: Duration) -> f64 {
    let start = Instant::now();
    let total: u64 = std::thread::scope(|s| {
        let handles: Vec<_> = c
            .queues
            .iter_mut()
            .enumerate()
            .map(|(qi, q)| {
                s.spawn(move || {
                    let mut n = 0u64;
                    while start.elapsed() < run {
                        let reqs: Vec<(Op, u64)> = (0..16)
                            .map(|i| (Op::Read, (qi as u64 * 64 + i) * 4096))
                            .collect();
                        for (r, _) in q.batch(&reqs, 4096) {
                            assert_eq!(r, 0);
                        }
                        n += 16;
                    }
                    n
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    total as f64 / start.elapsed().as_secs_f64()
}

/// The throughput tests run one at a time: on a small machine, parallel
/// tests would steal each other's CPU and blur the model's numbers.
static TIMING: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn timing() -> std::sync::MutexGuard<'static, ()> {
    TIMING.lock().unwrap_or_else(|p| p.into_inner())
}

fn stats(ctl: &std::path::Path) -> Value {
    blklab::control::query(ctl, "stats").expect("stats")
}

fn spawn_with_control(args: &[&str]) -> (Daemon, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let ctl = dir.path().join("ctl.sock");
    let mut a: Vec<&str> = args.to_vec();
    let ctl_s = ctl.to_str().unwrap().to_string();
    a.extend_from_slice(&["--control", &ctl_s]);
    let sock = dir.path().join("vd.sock");
    (Daemon::spawn_at(dir, sock, &a, 1), ctl)
}

#[test]
fn per_queue_tags_vs_shared_tags() {
    // 2 queues, 1 ms per request. Per-queue depth 4: 2 x 4 / 1 ms = 8000
    // IOPS. One shared pool of 4: 4000 IOPS. The slot budget is a hard
    // upper bound; how close a run gets depends on the machine, so the
    // lower bounds are loose and the ratio is checked too.
    let _serial = timing();
    let base = [
        "--disk",
        "null",
        "--size",
        "1G",
        "--num-queues",
        "2",
        "--latency",
        "1ms",
    ];
    let mut per_queue = base.to_vec();
    per_queue.extend_from_slice(&["--tags", "per-queue", "--depth", "4"]);
    let (d, ctl) = spawn_with_control(&per_queue);
    let mut c = Client::connect(&d.socket, 2).unwrap();
    let iops = qd16_iops(&mut c, Duration::from_secs(2));
    eprintln!("per-queue depth 4, 2 queues, 1 ms: {iops:.0} IOPS");
    assert!(
        (4400.0..=8160.0).contains(&iops),
        "per-queue: {iops:.0} IOPS, expected about 8000"
    );
    let per_queue_iops = iops;
    let s = stats(&ctl);
    for q in 0..2 {
        let qs = &s["disks"][0]["queues"][q];
        assert!(qs["counters"]["tag_waits"].as_u64().unwrap() > 0, "{qs}");
        assert!(
            qs["inflight_at_pop"]["max"].as_u64().unwrap() <= 3,
            "at most 4 in service: {qs}"
        );
    }
    let pools = s["disks"][0]["tag_pools"].as_array().unwrap();
    assert_eq!(pools.len(), 2, "one private pool per queue");
    for p in pools {
        assert_eq!(p["peak_in_use"], 4);
    }
    drop(c);
    drop(d);

    let mut shared = base.to_vec();
    shared.extend_from_slice(&["--tags", "shared", "--depth", "4"]);
    let (d, ctl) = spawn_with_control(&shared);
    let mut c = Client::connect(&d.socket, 2).unwrap();
    let iops = qd16_iops(&mut c, Duration::from_secs(2));
    eprintln!("shared depth 4, 2 queues, 1 ms: {iops:.0} IOPS");
    assert!(
        (2200.0..=4080.0).contains(&iops),
        "shared: {iops:.0} IOPS, expected about 4000"
    );
    let ratio = per_queue_iops / iops;
    assert!(
        (1.5..=2.5).contains(&ratio),
        "per-queue / shared = {ratio:.2}, expected about 2"
    );
    let s = stats(&ctl);
    let pools = s["disks"][0]["tag_pools"].as_array().unwrap();
    assert_eq!(pools.len(), 1, "one pool for both queues");
    assert_eq!(pools[0]["peak_in_use"], 4);
    assert!(pools[0]["wakeups_sent"].as_u64().unwrap() > 0);
    assert_eq!(pools[0]["in_use"], 0, "every slot returned");
}

#[test]
fn host_wide_pool_spans_disks() {
    let _serial = timing();
    let dir = tempfile::tempdir().unwrap();
    let ctl = dir.path().join("ctl.sock");
    let ctl_s = ctl.to_str().unwrap().to_string();
    let sock = dir.path().join("vd.sock");
    let d = Daemon::spawn_at(
        dir,
        sock,
        &[
            "--disk",
            "null",
            "--size",
            "1G",
            "--count",
            "2",
            "--latency",
            "1ms",
            "--tags",
            "shared",
            "--depth",
            "4",
            "--tag-scope",
            "host",
            "--control",
            &ctl_s,
        ],
        2,
    );
    let mut a = Client::connect(&d.socket_n(0), 1).unwrap();
    let mut b = Client::connect(&d.socket_n(1), 1).unwrap();
    let run = Duration::from_secs(2);
    let (ia, ib) = std::thread::scope(|s| {
        let ha = s.spawn(|| qd16_iops(&mut a, run));
        let hb = s.spawn(|| qd16_iops(&mut b, run));
        (ha.join().unwrap(), hb.join().unwrap())
    });
    eprintln!("host-wide pool of 4 over 2 disks: {ia:.0} + {ib:.0} IOPS");
    assert!(
        (2200.0..=4080.0).contains(&(ia + ib)),
        "{ia:.0} + {ib:.0}, expected about 4000 together"
    );
    let s = stats(&ctl);
    let p0 = &s["disks"][0]["tag_pools"][0];
    let p1 = &s["disks"][1]["tag_pools"][0];
    assert_eq!(p0, p1, "both disks report the same pool");
    assert_eq!(p0["queues"].as_array().unwrap().len(), 2);
}

#[test]
fn latency_model_qd1() {
    let _serial = timing();
    let (d, ctl) = spawn_with_control(&[
        "--disk",
        "null",
        "--size",
        "1G",
        "--latency",
        "1ms",
        "--seed",
        "7",
        // Spin for the whole wait: the timer fires at once and the worker
        // spins to each deadline, so spinning is recorded however late
        // this busy machine's timer wake-ups are.
        "--latency-spin",
        "1ms",
    ]);
    let mut c = Client::connect(&d.socket, 1).unwrap();
    let start = Instant::now();
    let mut n = 0;
    while start.elapsed() < Duration::from_secs(1) {
        assert_eq!(c.queues[0].read(0, 4096).0, 0);
        n += 1;
    }
    let iops = n as f64 / start.elapsed().as_secs_f64();
    eprintln!("QD1 at 1 ms: {iops:.0} IOPS");
    assert!(
        (550.0..=1000.0).contains(&iops),
        "{iops:.0} IOPS at QD1 with 1 ms latency"
    );
    let s = stats(&ctl);
    let lat = &s["disks"][0]["queues"][0]["latency_read_ns"];
    let p50 = lat["p50"].as_u64().unwrap() as f64;
    assert!(
        (1_000_000.0..1_300_000.0).contains(&p50),
        "pop-to-complete p50 {p50} ns"
    );
    // Never early: every completion waits at least its latency.
    assert!(lat["min"].as_u64().unwrap() >= 999_000, "{lat}");
    // --latency-spin spun for the last stretch of the waits.
    let spun = s["disks"][0]["queues"][0]["counters"]["latency_spin_ns"]
        .as_u64()
        .unwrap();
    assert!(spun > 0, "no spin recorded");
    assert_eq!(s["disks"][0]["config"]["latency"]["read"], "1ms");
}

#[test]
fn requests_in_service_finish_on_disconnect_and_reconnect() {
    // Slow completions outstanding when the client goes away must not leak
    // slots of a shared pool: the next connection gets the full depth.
    let (d, ctl) = spawn_with_control(&[
        "--disk",
        "mem",
        "--size",
        "64M",
        "--latency",
        "50ms",
        "--tags",
        "shared",
        "--depth",
        "2",
    ]);
    for round in 0..3 {
        let mut c = Client::connect(&d.socket, 1).unwrap();
        let reqs: Vec<(Op, u64)> = (0..4).map(|i| (Op::Write(round + 1), i * 4096)).collect();
        for (r, _) in c.queues[0].batch(&reqs, 4096) {
            assert_eq!(r, 0);
        }
        // Two more in flight, then disconnect without waiting.
        let q = &mut c.queues[0];
        let buf = q.buf().as_mut_ptr();
        q.q.read(0, buf, 4096, 0, blkio::ReqFlags::empty());
        // SAFETY: inside the queue's 1 MiB buffer.
        q.q.read(
            4096,
            unsafe { buf.add(4096) },
            4096,
            1,
            blkio::ReqFlags::empty(),
        );
        // Submit them (asking for no completions).
        let mut none: [std::mem::MaybeUninit<blkio::Completion>; 0] = [];
        let mut no_wait = Duration::ZERO;
        let _ = q.q.do_io(&mut none, 0, Some(&mut no_wait), None);
        drop(c);
    }
    std::thread::sleep(Duration::from_millis(200));
    let s = stats(&ctl);
    assert_eq!(
        s["disks"][0]["tag_pools"][0]["in_use"], 0,
        "{}",
        s["disks"][0]["tag_pools"][0]
    );
    let mut c = Client::connect(&d.socket, 1).unwrap();
    let (r, data) = c.queues[0].read(3 * 4096, 4096);
    assert_eq!(r, 0);
    assert!(data.iter().all(|x| *x == 3));
}

#[test]
fn fault_injection_exact_errors() {
    // Every 5th write of the queue fails; sectors 1000..1008 always fail.
    let (d, ctl) = spawn_with_control(&[
        "--disk",
        "mem",
        "--size",
        "16M",
        "--fail-every",
        "5:write",
        "--fail-range",
        "1000..1008",
    ]);
    let mut c = Client::connect(&d.socket, 1).unwrap();
    let q = &mut c.queues[0];
    let mut failed = Vec::new();
    for i in 0..20u64 {
        if q.write(i * 4096, &[1; 4096]) != 0 {
            failed.push(i + 1);
        }
    }
    assert_eq!(failed, vec![5, 10, 15, 20], "every 5th write fails");
    // Reads are not counted by a write rule; the range fails them.
    for i in 0..10u64 {
        assert_eq!(q.read(i * 4096, 4096).0, 0);
    }
    assert_ne!(q.read(1000 * 512, 4096).0, 0, "inside the range");
    assert_ne!(q.read(996 * 512, 4096).0, 0, "overlapping its start");
    assert_eq!(q.read(1008 * 512, 4096).0, 0, "END is excluded");
    assert_eq!(q.read(992 * 512, 4096).0, 0, "ends exactly at START");
    let s = stats(&ctl);
    let c0 = &s["disks"][0]["queues"][0]["counters"];
    assert_eq!(c0["injected_fail_every"], 4);
    assert_eq!(c0["injected_fail_range"], 2);
    assert_eq!(c0["status_ioerr"], 6);
    assert_eq!(
        s["disks"][0]["config"]["faults"]["fail-every"][0],
        "5:write"
    );
}

#[test]
fn stall_every_holds_requests() {
    let (d, ctl) =
        spawn_with_control(&["--disk", "null", "--size", "1G", "--stall-every", "3:200ms"]);
    let mut c = Client::connect(&d.socket, 1).unwrap();
    let mut slow = Vec::new();
    for i in 1..=6u64 {
        let t = Instant::now();
        assert_eq!(
            c.queues[0].read(0, 4096).0,
            0,
            "a stalled request still succeeds"
        );
        if t.elapsed() >= Duration::from_millis(200) {
            slow.push(i);
        }
    }
    assert_eq!(slow, vec![3, 6]);
    let s = stats(&ctl);
    assert_eq!(s["disks"][0]["queues"][0]["counters"]["injected_stalls"], 2);
}

#[test]
fn prometheus_metrics_from_the_daemon() {
    use std::io::{Read, Write};
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let addr = format!("127.0.0.1:{port}");
    let (d, ctl) = spawn_with_control(&["--disk", "null", "--size", "1G", "--metrics", &addr]);
    let mut c = Client::connect(&d.socket, 1).unwrap();
    for _ in 0..7 {
        assert_eq!(c.queues[0].read(0, 4096).0, 0);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let body = loop {
        if let Ok(mut s) = std::net::TcpStream::connect(&addr) {
            s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                .unwrap();
            let mut text = String::new();
            s.read_to_string(&mut text).unwrap();
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "metrics endpoint did not come up"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    let sample = body
        .lines()
        .find(|l| l.starts_with("blklab_reads_total{"))
        .unwrap_or_else(|| panic!("no blklab_reads_total in {body}"));
    let value: f64 = sample.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(value >= 7.0, "{sample}");
    // Every non-comment line is `name{labels} value`.
    let payload = body.split("\r\n\r\n").nth(1).unwrap();
    for l in payload
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let v = l.rsplit(' ').next().unwrap();
        assert!(
            v.parse::<f64>().is_ok() || v == "NaN",
            "bad sample line {l:?}"
        );
    }
    // The same text through the control socket and `blklab stats --format prom`.
    let out = std::process::Command::new(common::blklab_bin())
        .args(["stats", "--format", "prom", "--control"])
        .arg(&ctl)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("blklab_reads_total{"));
}
