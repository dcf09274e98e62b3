//! Statistics over the control socket, with libblkio as the guest: exact
//! kick counts for known submission patterns, snapshots, reset, config,
//! `blklab stats`, and the --stats-out file.

mod common;

use std::process::Command;

use blklab::stats::queue::{QueueReport, StatsDocument, STATS_SCHEMA};
use common::client::{Client, Op};
use common::{blklab_bin, Daemon};
use serde_json::Value;

fn query(sock: &std::path::Path, cmd: &str) -> Value {
    blklab::backend::control::query(sock, cmd).expect("control query")
}

/// A stats or snapshot answer, typed.
fn stats(sock: &std::path::Path, cmd: &str) -> StatsDocument {
    blklab::backend::control::query_stats(sock, cmd).expect("control query")
}

fn queue0(doc: &StatsDocument) -> &QueueReport {
    &doc.disks[0].queues[0]
}

#[test]
fn kicks_counted_exactly_and_snapshots() {
    let dir = tempfile::tempdir().unwrap();
    let control = dir.path().join("ctl.sock");
    let out = dir.path().join("stats.json");
    let ctl = control.to_str().unwrap().to_string();
    let outs = out.to_str().unwrap().to_string();
    let mut d = Daemon::spawn(
        &[
            "--disk",
            "mem",
            "--size",
            "16M",
            "--control",
            &ctl,
            "--stats-out",
            &outs,
        ],
        1,
    );
    let mut c = Client::connect(&d.socket, 1).expect("connect");
    let q = &mut c.queues[0];

    // Baseline after the connection's set-up (which submits nothing).
    let setup = stats(&control, "snapshot setup");
    assert_eq!(queue0(&setup).counters.requests, 0, "{setup:?}");
    assert_eq!(queue0(&setup).counters.kicks, 0, "{setup:?}");

    // Each request or batch starts once the worker has finished the pass
    // that served the previous one (a queue's statistics are locked for a
    // whole pass, so the counters show it) and so has re-armed guest
    // notifications. With EVENT_IDX, a request submitted while the worker
    // still drains is legitimately picked up without a kick (seen on a
    // loaded machine: 1 kick, 1 wake-up, 32 requests), or its kick is
    // read only after the completion: the counts would depend on timing.
    let served = |requests: u64, kicks: u64| {
        common::wait_for_counters(&control, 0, 0, &[("requests", requests), ("kicks", kicks)]);
    };

    // Unplugged pattern: one request, wait, next: the guest finds the
    // worker idle with notifications on every time, so one kick each.
    for i in 0..32u64 {
        assert_eq!(q.write(i * 4096, &[7; 4096]), 0);
        served(i + 1, i + 1);
    }
    let a = stats(&control, "snapshot qd1");
    assert_eq!(a.label.as_deref(), Some("qd1"));
    assert!(a.interval_s.unwrap() > 0.0);
    let qa = queue0(&a);
    assert_eq!(qa.counters.requests, 32);
    assert_eq!(qa.counters.writes, 32);
    assert_eq!(qa.counters.kicks, 32, "one kick per request: {qa:?}");
    assert_eq!(qa.requests_per_kick.max, 1, "{qa:?}");
    // Every wake-up is accounted for, with its kicks.
    assert_eq!(qa.kicks_per_wakeup.count, qa.counters.wakeups);

    // Plugged pattern: 16 requests added, then one kick; twice.
    for round in 0..2u64 {
        let reqs: Vec<(Op, u64)> = (0..16)
            .map(|i| (Op::Read, (round * 16 + i) * 4096))
            .collect();
        for (r, _) in q.batch(&reqs, 4096) {
            assert_eq!(r, 0);
        }
        served(32 + 16 * (round + 1), 32 + round + 1);
    }
    let b = stats(&control, "snapshot qd16");
    let qb = queue0(&b);
    assert_eq!(qb.counters.requests, 32);
    assert_eq!(qb.counters.reads, 32);
    assert_eq!(qb.counters.kicks, 2, "one kick per 16 requests: {qb:?}");
    assert_eq!(qb.requests_per_kick.max, 16);
    assert_eq!(qb.counters.bytes_read, 32 * 4096);
    assert_eq!(qb.latency_read_ns.count, 32);

    // Cumulative stats cover both phases and carry the configuration.
    let all = stats(&control, "stats");
    assert!(queue0(&all).counters.requests >= 64);
    assert_eq!(all.disks[0].config.as_ref().unwrap().size, 16 << 20);
    assert_eq!(all.schema, STATS_SCHEMA);
    assert_eq!(all.blklab_version, env!("CARGO_PKG_VERSION"));
    let commit = &all.git_commit;
    assert!(commit.len() >= 40 || commit == "unknown", "{commit}");

    // The table view.
    let view = Command::new(blklab_bin())
        .args(["stats", "--control", &ctl])
        .output()
        .unwrap();
    assert!(view.status.success());
    let text = String::from_utf8_lossy(&view.stdout);
    assert!(
        text.contains("req/kick") && text.contains("vd.sock"),
        "{text}"
    );
    let json = Command::new(blklab_bin())
        .args(["stats", "--control", &ctl, "--format", "json"])
        .output()
        .unwrap();
    let v: StatsDocument = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(v.disks[0].queues.len(), 1);

    // Reset, config, errors.
    assert_eq!(query(&control, "reset")["ok"], true);
    assert_eq!(queue0(&stats(&control, "stats")).counters.requests, 0);
    let cfg = query(&control, r#"{"cmd":"config"}"#);
    assert_eq!(cfg["disks"][0]["num_queues"], 1);
    assert!(query(&control, "frobnicate")["error"]
        .as_str()
        .unwrap()
        .contains("unknown command"));

    // The final document at exit.
    assert_eq!(q.write(0, &[1; 4096]), 0);
    drop(c);
    assert!(d.terminate().success());
    let doc = StatsDocument::from_json(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(queue0(&doc).counters.writes, 1);
    assert!(!control.exists(), "control socket removed at exit");
}

#[test]
fn stats_client_errors_clearly() {
    let out = Command::new(blklab_bin())
        .args(["stats", "--control", "/nonexistent/ctl.sock"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot query"));
    let out = Command::new(blklab_bin())
        .args(["stats", "--control", "/x", "--watch", "fast"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid interval"));
}
