//! Every shipped scenario, cut short, in a real guest: one `blklab run`
//! of each `guest-scripts/scenarios/*.scn` on the `build:6.12` kernel
//! under QEMU with the real backend, one iteration, 1 s a variant. Each
//! variant must yield a record whose checks hold and whose settings were
//! really applied: modules load (and unload, or the next variant of the
//! same module could not load it again), the scheduler, `nr_requests`
//! and the other knobs read back from sysfs as the scenario says, the
//! scenario's disks (12 for seed002) or LUNs appear, fio's job layout is
//! the scenario's, and the backend ran the device model the variant pins
//! (`common::scenario_checks`).
//!
//! The scenarios another guest test already runs on `build:6.12`, every
//! variant checked the same way, are not booted again here
//! ([`RUN_ELSEWHERE`]).
//!
//! Images come from the shared cache (see tests/lab_run.rs); a cold cache
//! builds the 6.12 kernel first.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::scenario_checks::check_variant;
use common::{read_json, root};
use serde_json::Value;

/// Shipped scenarios whose every variant another test binary already runs
/// on `build:6.12` and checks with [`check_variant`], and where.
const RUN_ELSEWHERE: [(&str, &str); 3] = [
    (
        "seed002-quick",
        "tests/lab_run.rs: the default run, on build:6.12 and +noplug",
    ),
    (
        "plug-inverse-quick",
        "tests/lab_run.rs: the default run, on build:6.12 and +noplug",
    ),
    (
        "smoke",
        "tests/images.rs: build:6.12 and build:5.10 boot it on the TSC",
    ),
];

/// Every shipped scenario (each named in [`RUN_ELSEWHERE`] must be one).
fn shipped() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(root().join("guest-scripts/scenarios"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "scn"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    v.sort();
    assert!(v.len() >= 10, "shipped scenarios: {v:?}");
    for (name, where_) in RUN_ELSEWHERE {
        assert!(
            v.iter().any(|s| s == name),
            "{name} ({where_}) is not a shipped scenario: {v:?}"
        );
    }
    v
}

/// The shipped scenarios this test boots.
fn run_here() -> Vec<String> {
    shipped()
        .into_iter()
        .filter(|s| RUN_ELSEWHERE.iter().all(|(name, _)| s != name))
        .collect()
}

fn records(dir: &Path) -> Vec<Value> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n.ends_with(".json") && n != "run.json" && n != "summary.json"
        })
        .collect();
    files.sort();
    files.iter().map(|f| read_json(f)).collect()
}

#[test]
fn every_shipped_scenario_runs_short_in_a_guest() {
    let out = tempfile::tempdir().unwrap();
    let scenarios = run_here();
    let mut cmd = Command::new(common::blklab_bin());
    cmd.arg("run")
        .arg("--cache")
        .arg(common::image_cache())
        .args([
            "--kernel",
            "build:6.12",
            "--iterations",
            "1",
            "--runtime",
            "1",
        ])
        .args(["--count-insns", "off", "--no-progress", "--out"])
        .arg(out.path())
        .env("RUST_LOG", "info");
    for s in &scenarios {
        cmd.args(["--scenario", s]);
    }
    let o = cmd.output().expect("run blklab");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success(),
        "blklab run failed: {}",
        stderr
            .lines()
            .rev()
            .take(40)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n")
    );
    let recs = records(out.path());
    let run = read_json(&out.path().join("run.json"));
    // Every variant of every scenario has its record.
    for s in run["scenarios"].as_array().unwrap() {
        for v in s["variants"].as_array().unwrap() {
            assert!(
                recs.iter()
                    .any(|r| r["scenario"] == s["name"] && r["variant"] == v["name"]),
                "no record of {}/{}",
                s["name"],
                v["name"]
            );
        }
    }
    for r in &recs {
        check_variant(r);
    }
    // Variants whose device settings differ ran in boots of their own.
    let order = run["order"].as_array().unwrap();
    let tags_boots: Vec<&Value> = order
        .iter()
        .filter(|b| b["scenario"] == "seed000-virtio-tags")
        .collect();
    assert_eq!(tags_boots.len(), 2, "{tags_boots:?}");
    // Each polling mode of poll-modes in a boot of its own.
    let poll_boots = order
        .iter()
        .filter(|b| b["scenario"] == "poll-modes")
        .count();
    assert_eq!(poll_boots, 4);
    // The backend's slot budgets bound: at 10 ms a request, both budgets
    // make requests wait for a slot.
    for r in recs
        .iter()
        .filter(|r| r["scenario"] == "seed000-virtio-tags")
    {
        let waits: u64 = r["backend"]["disks"][0]["queues"]
            .as_array()
            .unwrap()
            .iter()
            .map(|q| q["counters"]["tag_waits"].as_u64().unwrap())
            .sum();
        assert!(waits > 0, "{}: no tag waits", r["variant"]);
    }
    // The multipath hypothesis ran on its maps.
    assert!(
        recs.iter()
            .any(|r| r["scenario"] == "seed002-scsi-debug-multipath"
                && !r["guest"]["paths"].is_null())
    );
    // seed002's 12 disks.
    assert!(recs.iter().any(|r| r["scenario"] == "seed002-randrw"
        && r["guest"]["devices"].as_array().unwrap().len() == 12));
}
