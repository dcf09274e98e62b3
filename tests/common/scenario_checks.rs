//! What every record of a shipped scenario's variant must show, whichever
//! test ran it: its checks hold and its settings were really applied
//! (modules, the scheduler and the queue knobs read back from sysfs, the
//! scenario's disks or LUNs, fio's job layout, the device model the
//! variant pins). `tests/shipped_scenarios.rs` runs every shipped scenario
//! through it; the tests that already boot a scenario (`tests/lab_run.rs`,
//! `tests/images.rs`) check their records with it too.

use serde_json::Value;

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

pub(crate) fn check_variant(r: &Value) {
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
