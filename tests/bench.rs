//! `blklab bench` against both backends: a few seconds of load on
//! qemu-storage-daemon (main loop and IOThread) and on `blklab serve`
//! (plain, --no-stats, adaptive, --poll) in one comparison, checking sane
//! output only (non-zero IOPS, zero errors, backend and idle CPU
//! measured). No timing assertions.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use blklab::bench::idle::IdleSpec;
use blklab::bench::versus_qsd::{self, Backend, CompareOpts};
use blklab::bench::{self, BenchError, Load, LoadShape, RwMode};

fn qsd() -> PathBuf {
    let p = PathBuf::from("/usr/bin/qemu-storage-daemon");
    assert!(
        p.exists(),
        "qemu-storage-daemon is missing: run .ci/install-deps (QEMU 10.0's qemu-utils from bookworm-backports)"
    );
    p
}

#[test]
fn compare_runs_identical_loads_on_both_backends() {
    let opts = CompareOpts {
        blklab_bin: common::blklab_bin(),
        qsd_bin: qsd(),
        shape: LoadShape {
            queues: 1,
            depth: 16,
            bs: 4096,
            rw: RwMode::Randrw,
            time: Duration::from_millis(700),
            warmup: Duration::from_millis(100),
        },
        size: 64 << 20,
        rounds: 1,
        poll: Some("20us".into()),
        adaptive: Some("32us".into()),
        idle: Some(IdleSpec {
            load: Duration::from_millis(100),
            settle: Duration::from_millis(50),
            span: Duration::from_millis(300),
        }),
    };
    let report = versus_qsd::run(&opts, |l| eprintln!("{l}")).expect("comparison runs");
    assert_eq!(report.rows.len(), 3, "throughput, QD1 and poll rows");
    let mut seen = Vec::new();
    for row in &report.rows {
        for c in &row.cells {
            seen.push(c.backend);
            assert!(
                c.requests > 0,
                "{} {}: no requests",
                row.row.name,
                c.backend.label()
            );
            assert!(c.iops > 0.0);
            assert_eq!(c.errors, 0, "{} {}", row.row.name, c.backend.label());
            assert!(c.p50_ns > 0.0);
            assert!(c.backend_cpu_s >= 0.0);
        }
    }
    for b in [
        Backend::Qsd,
        Backend::QsdIothread,
        Backend::Blklab,
        Backend::BlklabNoStats,
        Backend::BlklabAdaptive,
        Backend::BlklabPoll,
    ] {
        assert!(seen.contains(&b), "{b:?} not measured");
        // Every daemon's idle CPU, measured in ns over the span.
        let idle = report.idle.iter().find(|i| i.backend == b);
        let idle = idle.unwrap_or_else(|| panic!("{b:?}: no idle CPU"));
        assert!(
            idle.cpu.span_s >= 0.3 && idle.cpu.pct_of_cpu >= 0.0,
            "{idle:?}"
        );
    }
    // The QD1 rows ran with the backend and the client pinned apart.
    assert!(report.rows[1].row.pinned && !report.rows[0].row.pinned);
    assert!(report.pinning.is_some(), "a 2-CPU machine pins");
    let table = report.table();
    assert!(
        table.contains("qemu-storage-daemon") && table.contains("ratio to qsd"),
        "{table}"
    );
    assert!(!report.verdicts.is_empty());
    // Which qemu-storage-daemon was measured, in the table and the JSON.
    let want = Command::new(qsd()).arg("--version").output().unwrap();
    let want = String::from_utf8_lossy(&want.stdout);
    let want = want.lines().next().unwrap().trim();
    assert_eq!(report.qsd_version, want);
    assert!(
        table.contains(&format!("qemu-storage-daemon: {want}")),
        "{table}"
    );
    let json = serde_json::to_value(&report).unwrap();
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
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["requests"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(v["errors"].as_u64(), Some(0));
    assert!(v["iops"].as_f64().unwrap() > 0.0);
    assert!(v["backend_cpu_s"].as_f64().is_some(), "{v}");
    assert!(v["latency_ns"]["p50"].as_u64().unwrap() > 0);
    let s = blklab::backend::control::query(&ctl, "stats").unwrap();
    let c = &s["disks"][0]["queues"][0]["counters"];
    let writes = c["writes"].as_u64().unwrap();
    assert!(writes >= v["requests"].as_u64().unwrap(), "{c}");
    // A polled queue spins; every spin ends in a hit or a miss.
    assert!(
        c["poll_hits"].as_u64().unwrap() + c["poll_misses"].as_u64().unwrap() > 0,
        "{c}"
    );
    assert!(c["poll_spin_ns"].as_u64().is_some());
    let prom = blklab::backend::control::query(&ctl, "prom").unwrap();
    assert!(prom["prometheus"]
        .as_str()
        .unwrap()
        .contains("blklab_poll_hits_total"));
    assert!(d.terminate().success());
}

#[test]
fn library_load_against_plain_blklab() {
    let d = common::Daemon::spawn(&["--disk", "mem", "--size", "16M", "--num-queues", "2"], 1);
    let mut load = Load::new(&d.socket);
    load.shape.queues = 2;
    load.shape.depth = 8;
    load.shape.rw = RwMode::Randrw;
    load.shape.time = Duration::from_millis(400);
    load.shape.warmup = Duration::from_millis(50);
    load.backend_pid = Some(d.pid());
    let r = bench::run(&load).expect("bench runs");
    assert!(r.requests > 0 && r.iops > 0.0);
    assert_eq!(r.errors, 0);
    assert!(r.text().contains("IOPS"));
    // Bad options are refused before connecting.
    load.shape.bs = 1000;
    assert!(matches!(
        bench::run(&load),
        Err(BenchError::BadShape { bs: 1000, .. })
    ));
}
