//! `blklab bench` against both backends: a few seconds of load on
//! qemu-storage-daemon (main loop and IOThread) and on `blklab serve`
//! (plain, --no-stats, adaptive, --poll) in one comparison, the CLI and
//! the library's load.
//!
//! No timing assertions: the figures themselves vary several-fold between
//! machines. What is checked are the relations a correct benchmark holds
//! by construction (src/bench/), whatever the machine's speed, so that a
//! broken one fails: the read/write split adds up to the requests and
//! follows the mix asked; IOPS and bandwidth are the requests over the
//! measured time; every measured request has one latency, the
//! percentiles are ordered, none is longer than the run and the
//! latencies of one queue slot do not overlap (their sum is at most
//! slots × (the measured time + the longest latency)); a process's CPU
//! time is at most the wall time of what measured it times the
//! machine's CPUs; a comparison's cells are the sums and means of their
//! rounds, and its targets are the ratios of its cells, each judged or
//! skipped with why; a daemon that does not poll while idle takes less
//! CPU idle than serving a load.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use blklab::bench::idle::IdleSpec;
use blklab::bench::versus_qsd::{self, Backend, CompareOpts};
use blklab::bench::{self, BenchError, Load, LoadShape, RwMode};
use serde_json::Value;

fn qsd() -> PathBuf {
    let p = PathBuf::from("/usr/bin/qemu-storage-daemon");
    assert!(
        p.exists(),
        "qemu-storage-daemon is missing: run .ci/install-deps (QEMU 10.0's qemu-utils from bookworm-backports)"
    );
    p
}

/// The CPUs online (`cpuN` lines of /proc/stat): no process gets more CPU
/// time than this many times the wall time.
fn cpus() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap();
    let n = stat
        .lines()
        .filter(|l| {
            l.strip_prefix("cpu")
                .is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()))
        })
        .count();
    assert!(n > 0, "no CPU in /proc/stat");
    n as f64
}

/// `/proc/PID/stat` counts CPU time in clock ticks (1/100 s): a
/// difference of two readings of user + system time may be off by a
/// tick each.
const TICKS: f64 = 0.02;

/// `a == b` to rounding.
fn same(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

fn num(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} is not a number in {v}"))
}

fn count(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} is not a count in {v}"))
}

/// What a load was asked to do.
struct Asked {
    shape: LoadShape,
    client_poll: bool,
    /// The wall time of the call that ran it (a bound on the interval its
    /// CPU samples span).
    wall: Duration,
}

/// The relations a load's report (`BenchReport` as JSON, from the library
/// or `blklab bench --json`) holds by construction.
fn check_load(r: &Value, asked: &Asked, what: &str) {
    let shape = &asked.shape;
    let ctx = format!("{what}: {r}");
    assert_eq!(
        r["load"],
        format!(
            "{} {}k q{} qd{}{}",
            shape.rw,
            shape.bs / 1024,
            shape.queues,
            shape.depth,
            if asked.client_poll {
                " poll-client"
            } else {
                ""
            }
        ),
        "{ctx}"
    );
    let requests = count(r, "requests");
    assert!(requests > 0, "{ctx}: nothing measured");
    assert_eq!(count(r, "errors"), 0, "{ctx}");
    // Every measured request is a read or a write, as the mix asked.
    let (reads, writes) = (count(r, "reads"), count(r, "writes"));
    assert_eq!(reads + writes, requests, "{ctx}");
    match shape.rw {
        RwMode::Randread => assert_eq!(writes, 0, "{ctx}"),
        RwMode::Randwrite => assert_eq!(reads, 0, "{ctx}"),
        // Each request a coin toss: both kinds among hundreds.
        RwMode::Randrw => assert!(reads > 0 && writes > 0, "{ctx}"),
    }
    // Rates over the measured interval, which is the time asked.
    let seconds = num(r, "seconds");
    assert_eq!(seconds, shape.time.as_secs_f64(), "{ctx}");
    let iops = num(r, "iops");
    assert!(same(iops, requests as f64 / seconds), "{ctx}");
    assert!(same(num(r, "bytes_per_s"), iops * shape.bs as f64), "{ctx}");
    // One latency per measured request, ordered percentiles, the mean
    // between the extremes.
    let l = &r["latency_ns"];
    assert_eq!(count(l, "count"), requests, "{ctx}");
    let ladder: Vec<u64> = ["min", "p50", "p90", "p99", "p999", "max"]
        .iter()
        .map(|k| count(l, k))
        .collect();
    assert!(ladder.windows(2).all(|w| w[0] <= w[1]), "{ctx}");
    let mean = num(l, "mean");
    assert!(
        ladder[0] as f64 <= mean && mean <= ladder[5] as f64,
        "{ctx}"
    );
    // A measured request was submitted after the load started and
    // completed before it ended: none is longer than warm-up + time (the
    // histogram keeps a value to within 1/128 above).
    let run_ns = (shape.warmup + shape.time).as_nanos() as f64;
    assert!(
        ladder[5] as f64 <= run_ns * (1.0 + 1.0 / 128.0),
        "{ctx}: a latency longer than the run"
    );
    // A slot holds one request at a time, so its requests' latencies do
    // not overlap: of the requests measured in a slot, all but the first
    // were submitted inside the measured time, the first at most `max`
    // before it. Together at most time + max, for each of the slots.
    let slots = (shape.queues * shape.depth) as f64;
    let per_slot = shape.time.as_nanos() as f64 + ladder[5] as f64;
    assert!(
        mean * requests as f64 <= slots * per_slot * (1.0 + 1e-9),
        "{ctx}: more latency than {slots} slots can hold"
    );
    // CPU time: at most every CPU for the whole call.
    let most = cpus() * asked.wall.as_secs_f64();
    let client = num(r, "client_cpu_s");
    assert!((0.0..=most + 0.01).contains(&client), "{ctx}");
    match r["backend_cpu_s"].as_f64() {
        Some(b) => {
            assert!((0.0..=most + TICKS).contains(&b), "{ctx}");
            match r["iops_per_backend_cpu_s"].as_f64() {
                Some(per) => assert!(b > 0.0 && same(per, requests as f64 / b), "{ctx}"),
                None => assert_eq!(b, 0.0, "{ctx}"),
            }
        }
        None => assert!(r["iops_per_backend_cpu_s"].is_null(), "{ctx}"),
    }
}

#[test]
fn compare_runs_identical_loads_on_both_backends() {
    let shape = LoadShape {
        queues: 1,
        depth: 16,
        bs: 4096,
        rw: RwMode::Randrw,
        time: Duration::from_millis(700),
        warmup: Duration::from_millis(100),
    };
    let idle_span = Duration::from_millis(300);
    let opts = CompareOpts {
        blklab_bin: common::blklab_bin(),
        qsd_bin: qsd(),
        shape,
        size: 64 << 20,
        rounds: 2,
        poll: Some("20us".into()),
        adaptive: Some("32us".into()),
        idle: Some(IdleSpec {
            load: Duration::from_millis(100),
            settle: Duration::from_millis(50),
            span: idle_span,
        }),
    };
    let started = Instant::now();
    let report = versus_qsd::run(&opts, |l| eprintln!("{l}")).expect("comparison runs");
    let wall = started.elapsed();
    assert_eq!(report.rows.len(), 3, "throughput, QD1 and poll rows");
    let json = serde_json::to_value(&report).unwrap();
    let mut seen = Vec::new();
    // Over the whole comparison: the loads ran one after another, so
    // their CPU samples span disjoint intervals of its wall time.
    let (mut backend_cpu, mut client_cpu, mut loads) = (0.0, 0.0, 0);
    for (ri, row) in report.rows.iter().enumerate() {
        let depth = if ri == 0 { shape.depth } else { 1 };
        assert_eq!(row.row.depth, depth);
        assert_eq!(row.row.client_poll, ri == 2);
        assert_eq!(
            row.cells.iter().map(|c| c.backend).collect::<Vec<_>>(),
            row.row.backends,
            "{}: a cell per backend of the row, in its order",
            row.row.name
        );
        for (ci, c) in row.cells.iter().enumerate() {
            seen.push(c.backend);
            let what = format!("{} {}", row.row.name, c.backend.label());
            assert_eq!(c.rounds.len(), opts.rounds, "{what}");
            let asked = Asked {
                shape: LoadShape { depth, ..shape },
                client_poll: row.row.client_poll,
                wall,
            };
            for (i, r) in json["rows"][ri]["cells"][ci]["rounds"]
                .as_array()
                .unwrap()
                .iter()
                .enumerate()
            {
                check_load(r, &asked, &format!("{what} round {}", i + 1));
            }
            // The cell is its rounds' sums, and rates of those sums.
            let sum = |f: fn(&bench::BenchReport) -> f64| c.rounds.iter().map(f).sum::<f64>();
            assert_eq!(
                c.requests,
                c.rounds.iter().map(|r| r.requests).sum::<u64>(),
                "{what}"
            );
            assert_eq!(c.errors, 0, "{what}");
            assert!(
                same(c.seconds, opts.rounds as f64 * shape.time.as_secs_f64()),
                "{what}"
            );
            assert!(
                same(c.backend_cpu_s, sum(|r| r.backend_cpu_s.unwrap())),
                "{what}: every round measured the backend's CPU"
            );
            assert!(same(c.iops, c.requests as f64 / c.seconds), "{what}");
            assert!(
                c.backend_cpu_s > 0.0,
                "{what}: {} requests for no CPU",
                c.requests
            );
            assert!(
                same(
                    c.iops_per_backend_cpu_s,
                    c.requests as f64 / c.backend_cpu_s
                ),
                "{what}"
            );
            // Equal rounds: the cell's IOPS is their mean, inside their
            // spread, which is their lowest and highest.
            let lo = c
                .rounds
                .iter()
                .map(|r| r.iops)
                .fold(f64::INFINITY, f64::min);
            let hi = c.rounds.iter().map(|r| r.iops).fold(0.0, f64::max);
            assert_eq!(c.iops_range, (lo, hi), "{what}");
            assert!(
                lo * (1.0 - 1e-9) <= c.iops && c.iops <= hi * (1.0 + 1e-9),
                "{what}"
            );
            // Latency: the means of the rounds' percentiles, so ordered.
            let n = c.rounds.len() as f64;
            assert!(
                same(c.p50_ns, sum(|r| r.latency_ns.p50 as f64) / n),
                "{what}"
            );
            assert!(
                same(c.p99_ns, sum(|r| r.latency_ns.p99 as f64) / n),
                "{what}"
            );
            assert!(c.p50_ns <= c.p99_ns, "{what}");
            backend_cpu += c.backend_cpu_s;
            client_cpu += sum(|r| r.client_cpu_s);
            loads += c.rounds.len();
        }
    }
    let most = cpus() * wall.as_secs_f64();
    assert!(
        backend_cpu <= most + TICKS * loads as f64,
        "{backend_cpu} s of backend CPU in {wall:?} on {} CPUs",
        cpus()
    );
    assert!(
        client_cpu <= most + 0.01 * loads as f64,
        "{client_cpu} s of client CPU in {wall:?}"
    );
    for b in [
        Backend::Qsd,
        Backend::QsdIothread,
        Backend::Blklab,
        Backend::BlklabNoStats,
        Backend::BlklabAdaptive,
        Backend::BlklabPoll,
    ] {
        assert!(seen.contains(&b), "{b:?} not measured");
        // Every daemon's idle CPU, measured in ns over the span: its share
        // of one CPU is that over the span, at most every CPU.
        let idle = report.idle.iter().find(|i| i.backend == b);
        let idle = idle.unwrap_or_else(|| panic!("{b:?}: no idle CPU"));
        let cpu = &idle.cpu;
        assert!(cpu.span_s >= idle_span.as_secs_f64(), "{idle:?}");
        assert!(
            same(
                cpu.pct_of_cpu,
                cpu.cpu_ns as f64 / (cpu.span_s * 1e9) * 100.0
            ),
            "{idle:?}"
        );
        assert!(
            (cpu.cpu_ns as f64) <= (cpu.span_s + 0.002) * 1e9 * cpus(),
            "{idle:?}"
        );
        // A daemon that polls only after serving something (blklab in
        // every mode: a spin or a window follows a pass; the daemon's main
        // loop does not poll) takes less CPU idle than serving the
        // throughput row. The IOThread's adaptive polling is QEMU's.
        if b != Backend::QsdIothread {
            let busy = report.rows[0]
                .cells
                .iter()
                .find(|c| c.backend == b)
                .unwrap();
            let busy_pct = 100.0 * busy.backend_cpu_s / busy.seconds;
            assert!(
                cpu.pct_of_cpu < busy_pct,
                "{b:?}: {:.3} % of a CPU idle, {busy_pct:.3} % busy",
                cpu.pct_of_cpu
            );
        }
    }
    // The QD1 rows ran with the backend and the client pinned apart.
    assert!(report.rows[1].row.pinned && report.rows[2].row.pinned && !report.rows[0].row.pinned);
    assert!(report.pinning.is_some(), "a 2-CPU machine pins");
    // Every target judged (all its sides measured, nothing zero to divide
    // by), each value the ratio of its cells and its pass its target's
    // test.
    assert!(report.skipped.is_empty(), "{:#?}", report.skipped);
    assert_eq!(report.verdicts.len(), 13, "{:#?}", report.verdicts);
    let cell = |row: &str, label: &str| {
        let row = report.rows.iter().find(|r| r.row.name == row).unwrap();
        row.cells
            .iter()
            .find(|c| c.backend.label() == label)
            .unwrap_or_else(|| panic!("{}: no {label}", row.row.name))
    };
    let metric = |name: &str| -> fn(&versus_qsd::Cell) -> f64 {
        match name {
            "IOPS per backend CPU-second" => |c| c.iops_per_backend_cpu_s,
            "round trip p50" => |c| c.p50_ns,
            "IOPS" => |c| c.iops,
            other => panic!("unknown metric {other:?}"),
        }
    };
    for v in &report.verdicts {
        // The value from the cells the verdict names.
        let want = if let Some(label) = v
            .what
            .strip_prefix("idle disk: ")
            .and_then(|w| w.strip_suffix(" CPU, % of one CPU"))
        {
            let i = report
                .idle
                .iter()
                .find(|i| i.backend.label() == label)
                .unwrap();
            i.cpu.pct_of_cpu
        } else {
            let (row, rest) = v.what.split_once(": ").unwrap();
            if let Some(m) = rest.strip_prefix("statistics on vs --no-stats, ") {
                let get = metric(m);
                get(cell(row, "blklab")) / get(cell(row, "blklab --no-stats")) - 1.0
            } else if rest == "blklab --poll round trip p50, us" {
                cell(row, "blklab --poll").p50_ns / 1e3
            } else {
                let (m, pair) = rest.rsplit_once(", ").unwrap();
                let (b, base) = pair.split_once(" / ").unwrap();
                let get = metric(m);
                get(cell(row, b)) / get(cell(row, base))
            }
        };
        assert!(same(v.value, want), "{v:?}: want {want}");
        let (op, bound) = v.target.split_once(' ').unwrap();
        let bound: f64 = bound
            .trim_end_matches(" %")
            .parse()
            .unwrap_or_else(|_| panic!("{v:?}: target {:?}", v.target));
        let pass = match op {
            ">=" => v.value >= bound,
            "<=" => v.value <= bound,
            "<" => v.value < bound,
            "within" => v.value.abs() <= bound / 100.0,
            _ => panic!("{v:?}: target {:?}", v.target),
        };
        assert_eq!(v.pass, pass, "{v:?}");
    }
    let table = report.table();
    assert!(
        table.contains("qemu-storage-daemon") && table.contains("ratio to qsd"),
        "{table}"
    );
    let passed = report.verdicts.iter().filter(|v| v.pass).count();
    assert!(
        table.contains(&format!(
            "targets: {passed} passed, {} failed, 0 skipped",
            13 - passed
        )),
        "{table}"
    );
    // Which qemu-storage-daemon was measured, in the table and the JSON.
    let want = Command::new(qsd()).arg("--version").output().unwrap();
    let want = String::from_utf8_lossy(&want.stdout);
    let want = want.lines().next().unwrap().trim();
    assert_eq!(report.qsd_version, want);
    assert!(
        table.contains(&format!("qemu-storage-daemon: {want}")),
        "{table}"
    );
    assert_eq!(json["qsd_version"].as_str(), Some(want));
}

#[test]
fn compare_refuses_bad_polling_options_before_starting_daemons() {
    let opts = CompareOpts {
        blklab_bin: common::blklab_bin(),
        // No daemon may start: a missing qemu-storage-daemon would fail
        // differently.
        qsd_bin: "/nonexistent/qemu-storage-daemon".into(),
        shape: LoadShape {
            queues: 1,
            depth: 16,
            bs: 4096,
            rw: RwMode::Randread,
            time: Duration::from_millis(100),
            warmup: Duration::from_millis(10),
        },
        size: 64 << 20,
        rounds: 1,
        poll: Some("bogus".into()),
        adaptive: None,
        idle: None,
    };
    let err = versus_qsd::run(&opts, |_| {}).expect_err("a bad --poll is refused");
    assert!(matches!(err, BenchError::BadPoll(_)), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("invalid --poll \"bogus\""), "{msg}");
    let opts = CompareOpts {
        poll: None,
        adaptive: Some("fast".into()),
        ..opts
    };
    let err = versus_qsd::run(&opts, |_| {}).expect_err("a bad --adaptive is refused");
    assert!(matches!(err, BenchError::BadAdaptive(_)), "{err}");
    assert!(err.to_string().contains("--adaptive \"fast\""), "{err}");
}

#[test]
fn bench_cli_reports_backend_cpu_and_poll_counters() {
    // blklab serve --poll with a control socket; `blklab bench` with the
    // backend's PID and a polling client; then the poll counters.
    let dir = tempfile::tempdir().unwrap();
    let ctl = dir.path().join("ctl.sock");
    let spawned = Instant::now();
    let mut d = common::Daemon::spawn_at(
        tempfile::tempdir().unwrap(),
        dir.path().join("vd.sock"),
        &[
            "--disk",
            "null",
            "--size",
            "64M",
            "--poll=20us",
            "--control",
            ctl.to_str().unwrap(),
        ],
        1,
    );
    let pid = d.pid().to_string();
    let started = Instant::now();
    let out = Command::new(common::blklab_bin())
        .args(["bench", "--socket"])
        .arg(&d.socket)
        .args([
            "--depth",
            "4",
            "--rw",
            "randwrite",
            "--time",
            "500ms",
            "--client-poll",
            "--json",
        ])
        .args(["--backend-pid", &pid])
        .output()
        .unwrap();
    let wall = started.elapsed();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    // The CLI's defaults: one queue, 4 KiB, 500 ms warm-up.
    let asked = Asked {
        shape: LoadShape {
            queues: 1,
            depth: 4,
            bs: 4096,
            rw: RwMode::Randwrite,
            time: Duration::from_millis(500),
            warmup: Duration::from_millis(500),
        },
        client_poll: true,
        wall,
    };
    check_load(&v, &asked, "blklab bench --json");
    assert!(v["backend_cpu_s"].as_f64().is_some(), "{v}");
    let s = blklab::backend::control::query(&ctl, "stats").unwrap();
    let lived = spawned.elapsed();
    let c = &s["disks"][0]["queues"][0]["counters"];
    // The backend served every write the client measured, and more (the
    // warm-up's and the stragglers').
    let writes = c["writes"].as_u64().unwrap();
    assert!(writes >= count(&v, "writes"), "{c}");
    // A polled queue spins; every spin ends in a hit or a miss, and one
    // queue's spins, one after another in its worker, took at most the
    // daemon's life.
    assert!(
        c["poll_hits"].as_u64().unwrap() + c["poll_misses"].as_u64().unwrap() > 0,
        "{c}"
    );
    let spin_ns = c["poll_spin_ns"].as_u64().unwrap();
    assert!(
        (spin_ns as u128) <= lived.as_nanos(),
        "{spin_ns} ns of spinning in {lived:?}: {c}"
    );
    let prom = blklab::backend::control::query(&ctl, "prom").unwrap();
    assert!(prom["prometheus"]
        .as_str()
        .unwrap()
        .contains("blklab_poll_hits_total"));
    assert!(d.terminate().success());
}

#[test]
fn library_load_against_plain_blklab() {
    let d =
        common::Daemon::with_control(&["--disk", "mem", "--size", "16M", "--num-queues", "2"], 1);
    let mut load = Load::new(&d.socket);
    load.shape.queues = 2;
    load.shape.depth = 8;
    load.shape.rw = RwMode::Randrw;
    load.shape.time = Duration::from_millis(400);
    load.shape.warmup = Duration::from_millis(50);
    load.backend_pid = Some(d.pid());
    let started = Instant::now();
    let r = bench::run(&load).expect("bench runs");
    let asked = Asked {
        shape: load.shape,
        client_poll: false,
        wall: started.elapsed(),
    };
    check_load(&serde_json::to_value(&r).unwrap(), &asked, "library load");
    assert!(r.backend_cpu_s.is_some());
    // The backend served at least the reads and the writes measured.
    let s = d.query("stats");
    let total = |key: &str| -> u64 {
        s["disks"][0]["queues"]
            .as_array()
            .unwrap()
            .iter()
            .map(|q| q["counters"][key].as_u64().unwrap())
            .sum()
    };
    assert!(
        total("reads") >= r.reads && total("writes") >= r.writes,
        "{s}"
    );
    let text = r.text();
    assert!(
        text.contains(&format!(
            "{} requests ({} reads, {} writes)",
            r.requests, r.reads, r.writes
        )),
        "{text}"
    );
    // Bad options are refused before connecting.
    load.shape.bs = 1000;
    assert!(matches!(
        bench::run(&load),
        Err(BenchError::BadShape { bs: 1000, .. })
    ));
}
