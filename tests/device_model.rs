//! The device model against libblkio traffic: command-slot budgets
//! (per-queue versus shared), emulated latency, and the statistics that
//! show them.
//!
//! Only load-independent facts are checked here: exact counters, peaks,
//! every slot returned, and lower bounds the model itself sets (a request
//! never completes before its latency, so N requests through S slots take
//! at least N / S latencies). How close a run gets to the model's IOPS is
//! a measurement, in `benches/device_model.rs` (`cargo bench`).

mod common;

use std::time::{Duration, Instant};

use common::client::{Client, Op};
use common::Daemon;
use serde_json::Value;

/// Batches of 16 reads per queue in the slot tests.
const BATCHES: u64 = 40;

/// Every queue of `c` reads `batches` batches of 16 (closed loop: 16 in
/// flight, wait for all, next), each queue in its own thread. Returns the
/// requests per queue.
fn qd16_reads(c: &mut Client, batches: u64) -> u64 {
    std::thread::scope(|s| {
        let handles: Vec<_> = c
            .queues
            .iter_mut()
            .enumerate()
            .map(|(qi, q)| {
                s.spawn(move || {
                    for _ in 0..batches {
                        let reqs: Vec<(Op, u64)> = (0..16)
                            .map(|i| (Op::Read, (qi as u64 * 64 + i) * 4096))
                            .collect();
                        for (r, _) in q.batch(&reqs, 4096) {
                            assert_eq!(r, 0);
                        }
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    });
    batches * 16
}

/// The slot budget's bound, whatever the machine's load: each request
/// holds a slot from before its pop until at least `latency` after it, so
/// `requests` through `slots` slots take at least `requests / slots`
/// latencies. Prints the IOPS for information.
fn assert_slot_bound(what: &str, requests: u64, slots: u64, latency: Duration, took: Duration) {
    let bound = latency * (requests / slots) as u32;
    eprintln!(
        "{what}: {requests} requests in {took:?} ({:.0} IOPS; the model allows at most {:.0})",
        requests as f64 / took.as_secs_f64(),
        slots as f64 / latency.as_secs_f64()
    );
    assert!(
        took >= bound,
        "{what}: {requests} requests through {slots} slots of {latency:?} took {took:?} < {bound:?}"
    );
}

#[test]
fn per_queue_tags_vs_shared_tags() {
    // 2 queues, 1 ms per request, 16 reads in flight per queue. Per-queue
    // depth 4: each queue has its own 4 slots (at most 8000 IOPS). One
    // shared pool of 4: both queues together get 4 (at most 4000 IOPS).
    let latency = Duration::from_millis(1);
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
    let d = Daemon::with_control(&per_queue, 1);
    let mut c = Client::connect(&d.socket, 2).unwrap();
    let start = Instant::now();
    let n = qd16_reads(&mut c, BATCHES);
    assert_slot_bound(
        "per-queue depth 4, one queue",
        n,
        4,
        latency,
        start.elapsed(),
    );
    // Every completion seen, so every pass that served one has ended: the
    // statistics (and the slots, returned before a pass ends) are final.
    let s = d.query("stats");
    for q in 0..2 {
        let qs = &s["disks"][0]["queues"][q];
        assert_eq!(qs["counters"]["requests"], n, "{qs}");
        // 16 available, 4 slots: the queue waited for its own slots.
        assert!(qs["counters"]["tag_waits"].as_u64().unwrap() > 0, "{qs}");
        assert!(
            qs["inflight_at_pop"]["max"].as_u64().unwrap() <= 3,
            "at most 4 in service: {qs}"
        );
    }
    let pools = s["disks"][0]["tag_pools"].as_array().unwrap();
    assert_eq!(pools.len(), 2, "one private pool per queue");
    for p in pools {
        assert_eq!(p["peak_in_use"], 4, "{p}");
        assert_eq!(p["in_use"], 0, "every slot returned: {p}");
        assert_eq!(p["gets"], n, "every request took a slot: {p}");
        assert_eq!(p["puts"], n, "{p}");
    }
    drop(c);
    drop(d);

    let mut shared = base.to_vec();
    shared.extend_from_slice(&["--tags", "shared", "--depth", "4"]);
    let d = Daemon::with_control(&shared, 1);
    let mut c = Client::connect(&d.socket, 2).unwrap();
    let start = Instant::now();
    let n = qd16_reads(&mut c, BATCHES);
    assert_slot_bound(
        "shared depth 4, both queues",
        2 * n,
        4,
        latency,
        start.elapsed(),
    );
    let s = d.query("stats");
    for q in 0..2 {
        let qs = &s["disks"][0]["queues"][q];
        assert_eq!(qs["counters"]["requests"], n, "{qs}");
        assert!(qs["counters"]["tag_waits"].as_u64().unwrap() > 0, "{qs}");
    }
    let pools = s["disks"][0]["tag_pools"].as_array().unwrap();
    assert_eq!(pools.len(), 1, "one pool for both queues");
    let p = &pools[0];
    assert_eq!(p["queues"].as_array().unwrap().len(), 2, "{p}");
    assert_eq!(p["peak_in_use"], 4, "{p}");
    // A waiting queue is woken by a put (wake batch 1 at depth 4).
    assert!(p["wakeups_sent"].as_u64().unwrap() > 0, "{p}");
    assert_eq!(p["in_use"], 0, "every slot returned: {p}");
    assert_eq!(p["gets"], 2 * n, "every request took a slot: {p}");
    assert_eq!(p["puts"], 2 * n, "{p}");
}

#[test]
fn host_wide_pool_spans_disks() {
    let d = Daemon::with_control(
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
        ],
        2,
    );
    let mut a = Client::connect(&d.socket_n(0), 1).unwrap();
    let mut b = Client::connect(&d.socket_n(1), 1).unwrap();
    let start = Instant::now();
    let (na, nb) = std::thread::scope(|s| {
        let ha = s.spawn(|| qd16_reads(&mut a, BATCHES));
        let hb = s.spawn(|| qd16_reads(&mut b, BATCHES));
        (ha.join().unwrap(), hb.join().unwrap())
    });
    // One pool of 4 for both disks: at most 4000 IOPS together.
    assert_slot_bound(
        "host-wide pool of 4, two disks",
        na + nb,
        4,
        Duration::from_millis(1),
        start.elapsed(),
    );
    let s = d.query("stats");
    for (disk, n) in [(0, na), (1, nb)] {
        let qs = &s["disks"][disk]["queues"][0];
        assert_eq!(qs["counters"]["requests"], n, "disk {disk}: {qs}");
    }
    let p0 = &s["disks"][0]["tag_pools"][0];
    let p1 = &s["disks"][1]["tag_pools"][0];
    assert_eq!(p0, p1, "both disks report the same pool");
    assert_eq!(p0["queues"].as_array().unwrap().len(), 2);
    assert_eq!(p0["peak_in_use"], 4, "{p0}");
    assert_eq!(p0["in_use"], 0, "every slot returned: {p0}");
    assert_eq!(p0["gets"], na + nb, "{p0}");
}

#[test]
fn latency_model_qd1() {
    let d = Daemon::with_control(
        &[
            "--disk",
            "null",
            "--size",
            "1G",
            "--latency",
            "1ms",
            "--seed",
            "7",
            // Spin for the whole wait: the timer fires at once and the worker
            // spins to each deadline.
            "--latency-spin",
            "1ms",
        ],
        1,
    );
    let mut c = Client::connect(&d.socket, 1).unwrap();
    // QD1 reads, 50 at a time, until the worker has spun at least once (a
    // timer wake-up later than the whole 1 ms has nothing left to spin,
    // which a loaded machine may do for a while) and at least 200 reads.
    let start = Instant::now();
    let mut n = 0u64;
    let s = common::wait_for("a --latency-spin spin", common::PATIENCE, || {
        for _ in 0..50 {
            assert_eq!(c.queues[0].read(0, 4096).0, 0);
        }
        n += 50;
        let s = d.query("stats");
        let spun = s["disks"][0]["queues"][0]["counters"]["latency_spin_ns"]
            .as_u64()
            .unwrap();
        (n >= 200 && spun > 0).then_some(s)
    });
    let took = start.elapsed();
    // QD1: one request in service at a time, each at least 1 ms (at most
    // 1000 IOPS). The accuracy of the latency (p50, p99, IOPS against
    // 1/latency) is measured by `cargo bench --bench device_model`.
    eprintln!(
        "QD1 at 1 ms: {n} reads in {took:?}, {:.0} IOPS",
        n as f64 / took.as_secs_f64()
    );
    let bound = Duration::from_millis(n);
    assert!(took >= bound, "{n} QD1 reads at 1 ms took {took:?}");
    let q = &s["disks"][0]["queues"][0];
    assert_eq!(q["counters"]["reads"], n, "{q}");
    let lat = &q["latency_read_ns"];
    assert_eq!(lat["count"], n, "{lat}");
    // Never early: every completion waits at least its latency.
    assert!(lat["min"].as_u64().unwrap() >= 999_000, "{lat}");
    assert_eq!(s["disks"][0]["config"]["latency"]["read"], "1ms");
}

#[test]
fn requests_in_service_finish_on_disconnect_and_reconnect() {
    // Slow completions outstanding when the client goes away must not leak
    // slots of a shared pool: the next connection gets the full depth.
    let d = Daemon::with_control(
        &[
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
        ],
        1,
    );
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
    // The requests left in service finish and give their slots back.
    let mut last = Value::Null;
    common::wait_until("every slot of the shared pool returned", || {
        last = d.query("stats")["disks"][0]["tag_pools"][0].clone();
        last["in_use"] == 0
    });
    eprintln!("pool after the disconnects: {last}");
    let mut c = Client::connect(&d.socket, 1).unwrap();
    let (r, data) = c.queues[0].read(3 * 4096, 4096);
    assert_eq!(r, 0);
    assert!(data.iter().all(|x| *x == 3));
}

#[test]
fn fault_injection_exact_errors() {
    // Every 5th write of the queue fails; sectors 1000..1008 always fail.
    let d = Daemon::with_control(
        &[
            "--disk",
            "mem",
            "--size",
            "16M",
            "--fail-every",
            "5:write",
            "--fail-range",
            "1000..1008",
        ],
        1,
    );
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
    let s = d.query("stats");
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
    let d = Daemon::with_control(
        &["--disk", "null", "--size", "1G", "--stall-every", "3:200ms"],
        1,
    );
    let mut c = Client::connect(&d.socket, 1).unwrap();
    let stalls =
        || d.query("stats")["disks"][0]["queues"][0]["counters"]["injected_stalls"].clone();
    let mut stalled = Vec::new();
    for i in 1..=6u64 {
        let before = stalls();
        let t = Instant::now();
        assert_eq!(
            c.queues[0].read(0, 4096).0,
            0,
            "a stalled request still succeeds"
        );
        let took = t.elapsed();
        // The completion is seen, so the pass that popped (and counted)
        // the request has ended.
        if stalls() != before {
            stalled.push(i);
            // Held for the whole stall: never early.
            assert!(took >= Duration::from_millis(200), "request {i}: {took:?}");
        }
    }
    assert_eq!(stalled, vec![3, 6]);
    assert_eq!(stalls(), 2);
}

#[test]
fn prometheus_metrics_from_the_daemon() {
    use std::io::{Read, Write};
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let addr = format!("127.0.0.1:{port}");
    let d = Daemon::with_control(&["--disk", "null", "--size", "1G", "--metrics", &addr], 1);
    let mut c = Client::connect(&d.socket, 1).unwrap();
    for _ in 0..7 {
        assert_eq!(c.queues[0].read(0, 4096).0, 0);
    }
    let deadline = Instant::now() + common::PATIENCE;
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
        .arg(d.control())
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("blklab_reads_total{"));
}
