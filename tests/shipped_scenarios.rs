//! Every shipped scenario, cut short, in a real guest: one `blklab run`
//! of each `guest-scripts/scenarios/*.scn` on the `build:6.12` kernel
//! under QEMU with the real backend, one iteration, 1 s a variant. Each
//! variant must yield a record whose checks hold and whose settings were
//! really applied: modules load (and unload, or the next variant of the
//! same module could not load it again), the scheduler, `nr_requests`
//! and the other knobs read back from sysfs as the scenario says, the
//! scenario's disks (12 for seed002) or LUNs appear, fio's job layout is
//! the scenario's, and the backend ran the device model the variant pins.
//!
//! Images come from the shared cache (see tests/lab_run.rs); a cold cache
//! builds the 6.12 kernel first.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{read_json, root};
use serde_json::Value;

fn shipped() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(root().join("guest-scripts/scenarios"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "scn"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    v.sort();
    assert!(v.len() >= 10, "shipped scenarios: {v:?}");
    v
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

fn u(v: &Value) -> Option<u64> {
    v.as_u64()
}

/// The most requests fio can have issued and not seen complete when a
/// time-based job stops: fio counts issued IOs, the block layer completed
/// ones, so they may differ by at most what is in flight.
fn in_flight_bound(def: &Value, sections: u64) -> u64 {
    let arg = |name: &str| -> u64 {
        def["fio_args"]
            .as_array()
            .unwrap()
            .iter()
            .rev()
            .filter_map(|a| a.as_str()?.strip_prefix(&format!("--{name}=")))
            .find_map(|x| x.parse().ok())
            .unwrap_or(1)
    };
    arg("iodepth") * arg("numjobs") * sections
}

/// A `stack multipath` variant on scsi_debug: one dm map per LUN, fio on
/// the maps, each map's paths that LUN on every host, the paths' scheduler
/// read back.
fn check_multipath(
    what: &str,
    def: &Value,
    g: &Value,
    devices: &[&str],
    luns: usize,
    hosts: usize,
) {
    assert_eq!(def["stack"]["kind"], "multipath", "{what}");
    assert_eq!(devices.len(), luns, "{what}: {devices:?}");
    assert!(devices.iter().all(|d| d.starts_with("dm-")), "{what}");
    let maps = g["paths"].as_object().unwrap();
    assert_eq!(maps.len(), luns, "{what}: {maps:?}");
    let mut all_paths: Vec<&str> = Vec::new();
    for d in devices {
        let m = &maps[*d];
        assert!(
            m["map"].as_str().unwrap().starts_with("blklab-mpath"),
            "{what}: {m}"
        );
        let paths: Vec<&str> = m["paths"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_str().unwrap())
            .collect();
        assert_eq!(paths.len(), hosts, "{what} {d}: {paths:?}");
        assert!(paths.iter().all(|p| p.starts_with("sd")), "{what}");
        all_paths.extend(paths);
    }
    all_paths.sort();
    all_paths.dedup();
    assert_eq!(all_paths.len(), luns * hosts, "{what}: a path in two maps");
    let path_sched = def["stack"]["params"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|p| p.as_str()?.strip_prefix("path_sched="));
    let path_queue = g["path_queue"].as_object().unwrap();
    assert_eq!(path_queue.len(), luns * hosts, "{what}");
    if let Some(s) = path_sched {
        for (dev, q) in path_queue {
            assert_eq!(q["scheduler"], s, "{what} path {dev}");
        }
    }
}

fn check_variant(r: &Value) {
    let what = format!("{}/{}", r["scenario"], r["variant"]);
    assert_eq!(r["ok"], true, "{what}: {}", r["guest"]["error"]);
    let def = &r["scenario_definition"];
    let g = &r["guest"];
    let c = &r["checks"];
    let kind = def["target"]["kind"].as_str().unwrap();
    let devices: Vec<&str> = g["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap())
        .collect();

    // The target devices.
    match kind {
        "virtio" => {
            let want = r["machine"]["disks"].as_u64().unwrap() as usize;
            assert_eq!(devices.len(), want, "{what}: {devices:?}");
            assert!(devices.iter().all(|d| d.starts_with("vd")), "{what}");
            // Every IO the guest's block layer completed on the disks is a
            // request the backend served, exactly.
            assert_eq!(c["guest_block_equals_backend"], true, "{what}: {c}");
        }
        "scsi_debug" => {
            let p: Vec<&str> = def["target"]["params"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_str().unwrap())
                .collect();
            let param = |name: &str| -> usize {
                p.iter()
                    .find_map(|x| x.strip_prefix(&format!("{name}=")))
                    .map_or(1, |n| n.parse().unwrap())
            };
            let luns = param("max_luns") * param("num_tgts");
            let hosts = param("add_host");
            if def["stack"].is_null() {
                assert_eq!(devices.len(), luns * hosts, "{what}: {devices:?}");
                assert!(devices.iter().all(|d| d.starts_with("sd")), "{what}");
            } else {
                check_multipath(&what, def, g, &devices, luns, hosts);
            }
        }
        "null_blk" => {
            assert_eq!(devices.len(), 1, "{what}: {devices:?}");
            assert!(devices[0].starts_with("nullb"), "{what}");
        }
        other => panic!("{what}: unknown target {other}"),
    }

    // fio ran, in the scenario's layout, and its IOs are the block layer's.
    assert_eq!(g["fio_rc"], 0, "{what}");
    let names: Vec<&str> = g["fio_cmdline"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a.as_str()?.strip_prefix("--name="))
        .collect();
    let sections = if def["layout"] == "per-disk" {
        devices.len()
    } else {
        1
    };
    assert_eq!(names.len(), sections, "{what}: {names:?}");
    let fio = u(&c["fio_ios"]).unwrap();
    let block = u(&c["guest_block_ios"]).unwrap();
    assert!(fio > 0 && block > 0, "{what}: {c}");
    assert!(
        fio.abs_diff(block) <= in_flight_bound(def, sections as u64),
        "{what}: fio {fio} vs block layer {block}"
    );
    let sum = c["guest_cpu_percent_sum"].as_f64().unwrap();
    assert!((sum - 100.0).abs() < 0.1, "{what}: cpu sums to {sum}");

    // The queue settings, as read back from sysfs before fio ran.
    let queue = g["queue"].as_object().unwrap();
    assert_eq!(queue.len(), devices.len(), "{what}");
    for (dev, q) in queue {
        if let Some(s) = def["sched"].as_str() {
            assert_eq!(q["scheduler"], s, "{what} {dev}");
        }
        for (knob, read_back) in [
            ("nr_requests", "nr_requests"),
            ("queue_depth", "device_queue_depth"),
            ("nomerges", "nomerges"),
            ("rq_affinity", "rq_affinity"),
        ] {
            if let Some(n) = u(&def[knob]) {
                assert_eq!(u(&q[read_back]), Some(n), "{what} {dev} {knob}");
            }
        }
    }

    // The machine and the backend's device model the variant pins.
    assert_eq!(
        u(&g["nr_cpus"]),
        u(&r["machine"]["vcpus"]),
        "{what}: guest CPUs"
    );
    let disk = &r["device"][0];
    for s in def["device"].as_array().unwrap() {
        let (name, value) = s.as_str().unwrap().split_once('=').unwrap();
        match name {
            "tags" => assert_eq!(disk["tags"]["mode"], value, "{what}"),
            "depth" => assert_eq!(disk["tags"]["depth"].to_string(), value, "{what}"),
            "tag_scope" => assert_eq!(disk["tags"]["scope"], value, "{what}"),
            "poll" => {
                let mode = (u(&disk["poll_spin_ns"]), u(&disk["poll_adaptive_max_ns"]));
                let want = match value {
                    "off" => (0, 0),
                    "on" => (50_000, 0),
                    "adaptive:32us" => (0, 32_000),
                    "adaptive:1ms" => (0, 1_000_000),
                    other => panic!("{what}: poll={other} is not checked here"),
                };
                assert_eq!(mode, (Some(want.0), Some(want.1)), "{what}");
                // A polled device's worker polled (each idle poll ends in
                // a hit or a miss), a notify-mode one never did.
                let polls: u64 = r["backend"]["disks"][0]["queues"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|q| {
                        u(&q["counters"]["poll_hits"]).unwrap()
                            + u(&q["counters"]["poll_misses"]).unwrap()
                    })
                    .sum();
                assert_eq!(polls > 0, value != "off", "{what}: {polls} polls");
            }
            _ => {}
        }
    }
    assert!(r["overridden"].as_array().unwrap().is_empty(), "{what}");
}

#[test]
fn every_shipped_scenario_runs_short_in_a_guest() {
    let out = tempfile::tempdir().unwrap();
    let scenarios = shipped();
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
