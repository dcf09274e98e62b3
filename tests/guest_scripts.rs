//! guest-scripts/ without QEMU: the scenario parser (`run.sh --check`) on
//! every shipped scenario and on malformed fixtures, the run-time view of a
//! scenario (environment overrides, @NCPU@), lab.sh's argument errors, the
//! JSON checker, the CPU reduction against sysstat's own mpstat, and the
//! result document computed from recorded snapshots.
//!
//! Every shell test runs under `sh` (dash on Debian) and under `busybox sh`
//! with `AWK="busybox awk"` -- what the initramfs has. A missing busybox
//! fails the test with its install command.

mod common;

use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::root;

/// (label, shell argv, AWK value)
fn shells() -> Vec<(&'static str, Vec<&'static str>, Option<&'static str>)> {
    common::tools::require_busybox();
    vec![
        ("sh", vec!["sh"], None),
        ("busybox sh", vec!["busybox", "sh"], Some("busybox awk")),
    ]
}

fn awks() -> Vec<Vec<&'static str>> {
    common::tools::require_busybox();
    vec![vec!["awk"], vec!["busybox", "awk"]]
}

/// Run SHELL guest-scripts/SCRIPT ARGS in the repository root with a clean
/// BLKLAB_* environment plus `env`.
fn run_script(
    shell: &[&str],
    awk: Option<&str>,
    script: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> Output {
    let mut c = Command::new(shell[0]);
    c.args(&shell[1..])
        .arg(format!("guest-scripts/{script}"))
        .args(args)
        .current_dir(root())
        .stdin(Stdio::null());
    for (k, _) in std::env::vars() {
        if k.starts_with("BLKLAB_") || k == "AWK" {
            c.env_remove(k);
        }
    }
    if let Some(a) = awk {
        c.env("AWK", a);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run guest script")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn check(shell: &[&str], awk: Option<&str>, scn: &str) -> Output {
    run_script(shell, awk, "run.sh", &["--check", scn], &[])
}

fn variant_names(doc: &Value) -> Vec<String> {
    doc["variants"]
        .as_array()
        .expect("variants array")
        .iter()
        .map(|v| v["name"].as_str().unwrap().to_string())
        .collect()
}

fn fio_args(v: &Value) -> Vec<String> {
    v["fio_args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

fn has_args(v: &Value, want: &[&str]) {
    let args = fio_args(v);
    for w in want {
        assert!(
            args.iter().any(|a| a == w),
            "variant {}: fio args {args:?} lack {w}",
            v["name"]
        );
    }
}

fn target_params(v: &Value) -> Vec<String> {
    v["target"]["params"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

const SEED000_FIO: &[&str] = &[
    "--ioengine=libaio",
    "--rw=randread",
    "--bs=8k",
    "--iodepth=64",
    "--iodepth_batch_submit=16",
    "--iodepth_batch_complete_min=16",
    "--numjobs=16",
    "--direct=1",
];

#[test]
fn shipped_scenarios_parse_with_the_expected_variants() {
    let expected: BTreeMap<&str, Vec<&str>> = [
        ("smoke", vec!["read", "write"]),
        ("seed000-randread", vec!["none", "mq-deadline"]),
        (
            "seed002-randrw",
            vec![
                "j20-r100",
                "j20-r70",
                "j20-r0",
                "j40-r100",
                "j40-r70",
                "j40-r0",
                "lun-j2-r100",
                "lun-j3-r100",
            ],
        ),
        (
            "seed002-quick",
            vec!["j2-r100", "j2-r0", "j4-r100", "j4-r0"],
        ),
        (
            "seed002-scale",
            vec![
                "j20-r100", "j20-r70", "j20-r0", "j40-r100", "j40-r70", "j40-r0",
            ],
        ),
        (
            "seed000-scale",
            vec![
                "host-tags",
                "single-queue",
                "host-tags-none",
                "single-queue-none",
            ],
        ),
        (
            "plug-inverse",
            vec!["mq-deadline", "none", "null-mq-deadline", "null-none"],
        ),
        ("plug-inverse-quick", vec!["mq-deadline"]),
        ("plug-inverse-paced", vec!["mq-deadline"]),
        (
            "seed000-virtio-tags",
            vec!["host-tags", "per-queue", "host-tags-none", "per-queue-none"],
        ),
        (
            "seed002-scsi-debug-wide",
            vec!["j6-r100-dl", "j6-r100-none"],
        ),
        (
            "seed002-scsi-debug-multipath",
            vec![
                "mp-none-paths-dl",
                "mp-dl-paths-none",
                "mp-none-paths-none",
                "direct-dl",
                "direct-none",
                "mp-none-paths-none-noutil",
                "direct-none-noutil",
            ],
        ),
        (
            "seed002-scsi-debug",
            vec![
                "lun-j2-r100-dl",
                "lun-j2-r0-dl",
                "lun-j2-r100-none",
                "lun-j2-r0-none",
                "all-j20-r100-dl",
            ],
        ),
        (
            "plug-qd1",
            vec!["none-2k", "none-10k", "mq-deadline-2k", "mq-deadline-10k"],
        ),
        (
            "seed000-scsi-debug",
            vec![
                "host-tags",
                "single-queue",
                "host-tags-none",
                "single-queue-none",
                "host-tags-1ms",
                "single-queue-1ms",
                "host-tags-1ms-none",
                "single-queue-1ms-none",
                "host-tags-jiffy",
                "single-queue-jiffy",
            ],
        ),
        (
            "seed000-null-blk",
            vec!["shared", "per-queue", "shared-none", "per-queue-none"],
        ),
        (
            "seed000-conditions",
            vec![
                "host-tags-1ms-2lun",
                "single-queue-1ms-2lun",
                "host-tags-4ms-2lun",
                "single-queue-4ms-2lun",
                "null-shared-timer",
                "null-single-queue-timer",
            ],
        ),
        (
            "poll-modes",
            vec!["notify", "adaptive", "adaptive-1ms", "always-poll"],
        ),
    ]
    .into_iter()
    .collect();

    let dir = root().join("guest-scripts/scenarios");
    let mut shipped: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| {
            let p = e.unwrap().path();
            (p.extension()? == "scn").then(|| p.file_stem().unwrap().to_string_lossy().into())
        })
        .collect();
    shipped.sort();
    let mut want: Vec<String> = expected.keys().map(|s| s.to_string()).collect();
    want.sort();
    assert_eq!(
        shipped, want,
        "shipped scenarios vs the ones this test knows"
    );

    for (label, shell, awk) in shells() {
        for (name, variants) in &expected {
            // by path and by name: the same document
            let path = format!("guest-scripts/scenarios/{name}.scn");
            let out = check(&shell, awk, &path);
            let stdout = text(&out.stdout);
            assert!(
                out.status.success(),
                "[{label}] {path}: {}\n{stdout}{}",
                out.status,
                text(&out.stderr)
            );
            assert_eq!(
                stdout.lines().count(),
                1,
                "[{label}] {path}: one line: {stdout}"
            );
            let doc: Value = serde_json::from_str(&stdout)
                .unwrap_or_else(|e| panic!("[{label}] {path}: not JSON ({e}): {stdout}"));
            let by_name = check(&shell, awk, name);
            assert_eq!(text(&by_name.stdout), stdout, "[{label}] {name} by name");
            assert_eq!(doc["name"], *name);
            assert!(
                doc["description"].as_str().is_some_and(|d| !d.is_empty()),
                "[{label}] {name}: description"
            );
            assert_eq!(variant_names(&doc), *variants, "[{label}] {name}");
            for v in doc["variants"].as_array().unwrap() {
                for key in [
                    "name",
                    "target",
                    "sched",
                    "nr_requests",
                    "runtime",
                    "ramp",
                    "fio_args",
                ] {
                    assert!(
                        v.get(key).is_some(),
                        "[{label}] {name}: variant lacks {key}"
                    );
                }
                assert!(v["runtime"].as_u64().unwrap() >= 1);
                // Self-contained: the backend's storage is pinned.
                let device: Vec<&str> = v["device"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| d.as_str().unwrap())
                    .collect();
                for want in ["disk=", "size="] {
                    assert!(
                        device.iter().any(|d| d.starts_with(want)),
                        "[{label}] {name}: variant {} does not pin device {want}",
                        v["name"]
                    );
                }
            }
            // Self-contained: the machine is pinned, or follows the host
            // (`vcpus host[:MAX]`), whose virtqueues may follow the vCPUs.
            let follows_host = doc["vcpus"].as_str().is_some_and(|v| v.starts_with("host"));
            for key in ["vcpus", "memory", "queues", "queue_size"] {
                assert!(
                    !doc[key].is_null() || (key == "queues" && follows_host),
                    "[{label}] {name}: the scenario does not pin {key}"
                );
            }
            check_scenario_content(name, &doc);
        }
    }
}

/// What each scenario must contain to reproduce its case.
fn check_scenario_content(name: &str, doc: &Value) {
    let vs = doc["variants"].as_array().unwrap();
    match name {
        "smoke" => {
            assert_eq!(doc["disks"], 1);
            for v in vs {
                assert_eq!(v["runtime"], 2);
                has_args(
                    v,
                    &["--ioengine=libaio", "--direct=1", "--bs=4k", "--iodepth=4"],
                );
                assert_eq!(v["target"]["kind"], "virtio");
            }
            has_args(&vs[0], &["--rw=randread"]);
            has_args(&vs[1], &["--rw=randwrite"]);
        }
        "seed000-randread" => {
            assert_eq!(doc["disks"], 1);
            for v in vs {
                has_args(v, SEED000_FIO);
                assert_eq!(v["nr_requests"], 128);
                assert_eq!(v["sched"], v["name"]);
                assert_eq!(v["target"]["kind"], "virtio");
            }
        }
        "seed002-randrw" | "seed002-quick" | "seed002-scale" => {
            assert_eq!(doc["disks"], if name == "seed002-quick" { 2 } else { 12 });
            // The default run's case and the reporter's scale follow the
            // host (2 vCPUs and 1G on a 2-core host, as always).
            match name {
                "seed002-quick" => assert_eq!(doc["vcpus"], "host:16"),
                "seed002-scale" => assert_eq!(doc["vcpus"], "host:48"),
                _ => assert_eq!(doc["vcpus"], 2),
            }
            if name != "seed002-randrw" {
                assert_eq!(
                    (&doc["memory"], &doc["memory_per_vcpu"]),
                    (&"1G".into(), &"64M".into())
                );
            }
            for v in vs {
                has_args(
                    v,
                    &[
                        "--ioengine=libaio",
                        "--rw=randrw",
                        "--bs=4k",
                        "--iodepth=1",
                        "--direct=1",
                    ],
                );
                assert_eq!(v["sched"], "none");
                let n = v["name"].as_str().unwrap();
                let (per_disk, n) = match n.strip_prefix("lun-") {
                    Some(rest) => (true, rest),
                    None => (false, n),
                };
                let (j, r) = n[1..].split_once("-r").unwrap();
                has_args(v, &[&format!("--numjobs={j}"), &format!("--rwmixread={r}")]);
                assert_eq!(v["layout"], if per_disk { "per-disk" } else { "all" });
                if name == "seed002-quick" {
                    assert_eq!(v["runtime"], 5);
                }
            }
        }
        "plug-inverse" | "plug-inverse-quick" | "plug-inverse-paced" => {
            assert_eq!(doc["queues"], 1);
            if name == "plug-inverse-quick" {
                // The default run's contrasting case: one vCPU (no vCPU
                // spinning on a lock a descheduled vCPU holds), a fixed IO
                // count (fio's start-up weighs the same in every run).
                assert_eq!(doc["vcpus"], 1);
                has_args(&vs[0], &["--number_ios=15000"]);
            }
            if name == "plug-inverse-paced" {
                // The nested floor's case: the same at a fixed pace, below
                // what the slowest nested run managed.
                assert_eq!(doc["vcpus"], 1);
                has_args(&vs[0], &["--number_ios=6000", "--rate_iops=500"]);
            }
            for v in vs {
                let n = v["name"].as_str().unwrap();
                if let Some(sched) = n.strip_prefix("null-") {
                    assert_eq!(v["target"]["kind"], "null_blk");
                    let p = target_params(v);
                    assert!(p.contains(&"submit_queues=1".into()), "{p:?}");
                    assert_eq!(v["sched"], sched);
                } else {
                    assert_eq!(v["target"]["kind"], "virtio");
                    assert_eq!(v["sched"], n);
                }
                has_args(
                    v,
                    &[
                        "--ioengine=io_uring",
                        "--rw=randread",
                        "--iodepth=16",
                        "--numjobs=1",
                    ],
                );
            }
        }
        "seed000-virtio-tags" => {
            for v in vs {
                has_args(v, SEED000_FIO);
                assert_eq!(v["target"]["kind"], "virtio");
                assert_eq!(v["nr_requests"], 128);
                let n = v["name"].as_str().unwrap();
                let device: Vec<&str> = v["device"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| d.as_str().unwrap())
                    .collect();
                if n.starts_with("host-tags") {
                    for want in ["tags=shared", "tag_scope=host", "depth=128"] {
                        assert!(device.contains(&want), "{n}: {device:?}");
                    }
                } else {
                    for want in ["tags=per-queue", "depth=64"] {
                        assert!(device.contains(&want), "{n}: {device:?}");
                    }
                }
                let want_sched = if n.ends_with("-none") {
                    "none"
                } else {
                    "mq-deadline"
                };
                assert_eq!(v["sched"], want_sched);
            }
        }
        "seed002-scsi-debug-wide" => {
            assert_eq!(doc["vcpus"], 8);
            for v in vs {
                assert_eq!(v["target"]["kind"], "scsi_debug");
                let p = target_params(v);
                for want in ["max_luns=12", "host_max_queue=128", "submit_queues=@NCPU@"] {
                    assert!(p.contains(&want.into()), "{p:?}");
                }
                has_args(v, &["--iodepth=1", "--numjobs=6", "--rw=randrw"]);
                let n = v["name"].as_str().unwrap();
                assert_eq!(
                    v["sched"],
                    if n.ends_with("-dl") {
                        "mq-deadline"
                    } else {
                        "none"
                    }
                );
            }
        }
        "seed002-scsi-debug-multipath" => {
            for v in vs {
                assert_eq!(v["target"]["kind"], "scsi_debug");
                let p = target_params(v);
                for want in ["max_luns=12", "host_max_queue=128", "fake_rw=1"] {
                    assert!(p.contains(&want.into()), "{p:?}");
                }
                has_args(
                    v,
                    &["--ioengine=libaio", "--rw=randrw", "--bs=4k", "--iodepth=1"],
                );
                let n = v["name"].as_str().unwrap();
                // mp-MAPSCHED-paths-PATHSCHED: a map over both hosts' paths;
                // direct-SCHED: one host, the LUNs themselves.
                if let Some(rest) = n.strip_prefix("mp-") {
                    assert!(p.contains(&"add_host=2".into()), "{n}: two paths per LUN");
                    assert_eq!(v["stack"]["kind"], "multipath", "{n}");
                    let (map, paths) = rest.split_once("-paths-").unwrap();
                    let paths = paths.trim_end_matches("-noutil");
                    let name = |s: &str| if s == "dl" { "mq-deadline" } else { "none" };
                    assert_eq!(v["sched"], name(map), "{n}");
                    assert_eq!(
                        v["stack"]["params"],
                        serde_json::json!([format!("path_sched={}", name(paths))]),
                        "{n}"
                    );
                } else {
                    assert!(n.starts_with("direct-"), "{n}");
                    assert!(v["stack"].is_null(), "{n}");
                    assert!(!p.contains(&"add_host=2".into()), "{n}");
                }
                assert_eq!(
                    fio_args(v).contains(&"--disk_util=0".to_string()),
                    n.ends_with("-noutil"),
                    "{n}"
                );
            }
        }
        "seed002-scsi-debug" => {
            for v in vs {
                assert_eq!(v["target"]["kind"], "scsi_debug");
                let p = target_params(v);
                for want in [
                    "max_luns=12",
                    "host_max_queue=128",
                    "submit_queues=@NCPU@",
                    "fake_rw=1",
                ] {
                    assert!(p.contains(&want.into()), "{p:?}");
                }
                has_args(
                    v,
                    &[
                        "--ioengine=libaio",
                        "--rw=randrw",
                        "--bs=4k",
                        "--iodepth=1",
                        "--direct=1",
                    ],
                );
                let n = v["name"].as_str().unwrap();
                assert_eq!(
                    v["layout"],
                    if n.starts_with("lun-") {
                        "per-disk"
                    } else {
                        "all"
                    }
                );
                assert_eq!(
                    v["sched"],
                    if n.ends_with("-dl") {
                        "mq-deadline"
                    } else {
                        "none"
                    }
                );
            }
        }
        "seed000-scale" => {
            // The 1 ms variants of seed000-scsi-debug, on the host's vCPUs.
            assert_eq!(doc["vcpus"], "host:32");
            for v in vs {
                has_args(v, SEED000_FIO);
                assert_eq!(v["runtime"], 20);
                assert_eq!(v["target"]["kind"], "scsi_debug");
                let p = target_params(v);
                let n = v["name"].as_str().unwrap();
                let queues: &[&str] = if n.starts_with("host-tags") {
                    &["host_max_queue=128", "submit_queues=@NCPU@"]
                } else {
                    &["max_queue=128", "submit_queues=1"]
                };
                for want in queues.iter().chain(&["fake_rw=1", "ndelay=1000000"]) {
                    assert!(p.contains(&want.to_string()), "{n}: {p:?}");
                }
                let sched = if n.ends_with("-none") {
                    "none"
                } else {
                    "mq-deadline"
                };
                assert_eq!(v["sched"], sched, "{n}");
            }
        }
        "seed000-scsi-debug" => {
            for v in vs {
                has_args(v, SEED000_FIO);
                assert_eq!(v["target"]["kind"], "scsi_debug");
                let p = target_params(v);
                let n = v["name"].as_str().unwrap();
                if n.starts_with("host-tags") {
                    assert!(p.contains(&"host_max_queue=128".into()), "{p:?}");
                    assert!(p.contains(&"submit_queues=@NCPU@".into()), "{p:?}");
                } else {
                    assert!(p.contains(&"max_queue=128".into()), "{p:?}");
                    assert!(p.contains(&"submit_queues=1".into()), "{p:?}");
                }
                assert!(p.contains(&"fake_rw=1".into()), "RAM-less: {p:?}");
                // A command takes 10 us, or 1 ms (the reporter's one jiffy).
                // (-jiffy: scsi_debug's default delay, no parameter.)
                if n.ends_with("-jiffy") {
                    assert!(!p.iter().any(|x| x.contains("delay=")), "{n}: {p:?}");
                } else {
                    let ndelay = if n.contains("-1ms") {
                        "ndelay=1000000"
                    } else {
                        "ndelay=10000"
                    };
                    assert!(p.contains(&ndelay.into()), "{n}: {p:?}");
                }
                let want_sched = if n.ends_with("-none") {
                    "none"
                } else {
                    "mq-deadline"
                };
                assert_eq!(v["sched"], want_sched);
            }
        }
        "seed000-null-blk" => {
            for v in vs {
                has_args(v, SEED000_FIO);
                assert_eq!(v["target"]["kind"], "null_blk");
                let p = target_params(v);
                for want in ["queue_mode=2", "irqmode=0", "submit_queues=@NCPU@"] {
                    assert!(p.contains(&want.into()), "{p:?}");
                }
                let n = v["name"].as_str().unwrap();
                let shared = if n.starts_with("shared") { 1 } else { 0 };
                assert!(
                    p.contains(&format!("shared_tag_bitmap={shared}")),
                    "{n}: {p:?}"
                );
                let want_sched = if n.ends_with("-none") {
                    "none"
                } else {
                    "mq-deadline"
                };
                assert_eq!(v["sched"], want_sched);
            }
        }
        "seed000-conditions" => {
            for v in vs {
                has_args(v, SEED000_FIO);
                assert_eq!(v["sched"], "mq-deadline");
                let n = v["name"].as_str().unwrap();
                let p = target_params(v);
                let host_wide = n.starts_with("host-tags") || n.starts_with("null-shared");
                if n.ends_with("-2lun") {
                    assert_eq!(v["target"]["kind"], "scsi_debug");
                    assert_eq!(v["layout"], "per-disk", "{n}");
                    has_args(v, &["--numjobs=8"]);
                    let ndelay = if n.contains("-4ms-") {
                        "ndelay=4000000"
                    } else {
                        "ndelay=1000000"
                    };
                    for want in ["max_luns=2", ndelay] {
                        assert!(p.contains(&want.into()), "{n}: {p:?}");
                    }
                    let tags = if host_wide {
                        "host_max_queue=128"
                    } else {
                        "max_queue=128"
                    };
                    assert!(p.contains(&tags.into()), "{n}: {p:?}");
                } else {
                    assert_eq!(v["target"]["kind"], "null_blk");
                    for want in ["irqmode=2", "completion_nsec=1000000", "hw_queue_depth=128"] {
                        assert!(p.contains(&want.into()), "{n}: {p:?}");
                    }
                    let (queues, shared) = if host_wide { ("@NCPU@", 1) } else { ("1", 0) };
                    assert!(p.contains(&format!("submit_queues={queues}")), "{n}: {p:?}");
                    assert!(
                        p.contains(&format!("shared_tag_bitmap={shared}")),
                        "{n}: {p:?}"
                    );
                }
            }
        }
        "plug-qd1" => {
            assert_eq!(doc["queues"], 1);
            for v in vs {
                has_args(
                    v,
                    &[
                        "--ioengine=libaio",
                        "--rw=randread",
                        "--iodepth=1",
                        "--numjobs=1",
                    ],
                );
                let n = v["name"].as_str().unwrap();
                let (sched, count) = n.rsplit_once('-').unwrap();
                assert_eq!(v["sched"], sched);
                let ios = if count == "2k" { 2000 } else { 10000 };
                has_args(v, &[&format!("--number_ios={ios}")]);
            }
        }
        "poll-modes" => {
            // One QD1 job on one queue; only the device's polling differs.
            assert_eq!(
                (doc["disks"].as_u64(), doc["queues"].as_u64()),
                (Some(1), Some(1))
            );
            let mut polls = Vec::new();
            for v in vs {
                has_args(
                    v,
                    &[
                        "--ioengine=libaio",
                        "--rw=randread",
                        "--iodepth=1",
                        "--numjobs=1",
                    ],
                );
                assert_eq!(v["sched"], "none");
                let poll: Vec<&str> = v["device"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter_map(|d| d.as_str()?.strip_prefix("poll="))
                    .collect();
                polls.extend(poll);
                assert_eq!(v["fio_args"], vs[0]["fio_args"]);
            }
            assert_eq!(polls, ["off", "adaptive:32us", "adaptive:1ms", "on"]);
        }
        other => panic!("no content check for {other}"),
    }
}

#[test]
fn malformed_scenarios_fail_with_file_and_line() {
    let cases: &[(&str, u32, &str)] = &[
        ("unknown-directive", 4, "unknown directive 'iodepth'"),
        ("missing-argument", 5, "sched: missing argument"),
        (
            "bad-number",
            3,
            "runtime: bad number '10s' (want an integer >= 1)",
        ),
        (
            "zero-runtime",
            3,
            "runtime: bad number '0' (want an integer >= 1)",
        ),
        (
            "duplicate-variant",
            5,
            "variant: duplicate name 'a' (first at line 2)",
        ),
        (
            "no-variants",
            4,
            "no variants (a scenario needs at least one 'variant NAME' line)",
        ),
        (
            "empty",
            1,
            "no variants (a scenario needs at least one 'variant NAME' line)",
        ),
        (
            "bad-variant-name",
            2,
            "variant: bad name 'j20/r100' (want [A-Za-z0-9_.-]+)",
        ),
        (
            "global-in-variant",
            3,
            "disks is only allowed before the first variant",
        ),
        (
            "bad-target",
            2,
            "target: unknown kind 'nvme' (want virtio, scsi_debug or null_blk)",
        ),
        (
            "bad-module-param",
            3,
            "target: bad module parameter 'irqmode' (want NAME=VALUE)",
        ),
        ("virtio-params", 2, "target virtio takes no parameters"),
        (
            "reserved-fio-option",
            3,
            "fio: option --runtime is set by run.sh (from the runtime directive)",
        ),
        ("too-many-arguments", 3, "sched: too many arguments"),
        (
            "bad-device-setting",
            2,
            "device: bad setting 'tags' (want NAME=VALUE)",
        ),
        (
            "unknown-device-setting",
            2,
            "device: unknown setting 'speed' (want one of disk, size, tags, depth, tag_scope, \
             tag_fairness, latency, read_latency, write_latency, flush_latency, latency_spin, \
             seed, poll)",
        ),
        (
            "bad-memory",
            1,
            "memory: bad size '2X' (want a number with an optional K, M, G or T suffix, e.g. 2G)",
        ),
        (
            "bad-queue-size",
            1,
            "queue_size: bad number '100' (want a power of two from 1 to 1024)",
        ),
        (
            "bad-layout",
            2,
            "layout: unknown layout 'diagonal' (want all or per-disk)",
        ),
        (
            "bad-nomerges",
            2,
            "nomerges: bad number '3' (want an integer from 0 to 2)",
        ),
        (
            "vcpus-in-variant",
            2,
            "vcpus is only allowed before the first variant",
        ),
        (
            "bad-vcpus-host-max",
            2,
            "vcpus: bad count 'host:65' (want an integer from 1 to 64, host, or host:MAX with MAX from 1 to 64)",
        ),
        (
            "bad-vcpus-word",
            1,
            "vcpus: bad count 'hosts' (want an integer from 1 to 64, host, or host:MAX with MAX from 1 to 64)",
        ),
        (
            "bad-vcpus-host-empty",
            1,
            "vcpus: bad count 'host:' (want an integer from 1 to 64, host, or host:MAX with MAX from 1 to 64)",
        ),
        (
            "bad-memory-per-vcpu",
            2,
            "memory_per_vcpu: bad size '64MB' (want a number with an optional K, M, G or T suffix, e.g. 256M)",
        ),
        (
            "memory-per-vcpu-in-variant",
            2,
            "memory_per_vcpu is only allowed before the first variant",
        ),
        (
            "too-many-disks",
            2,
            "disks: bad number '65' (want an integer from 1 to 64)",
        ),
        (
            "bad-stack-kind",
            2,
            "stack: unknown kind 'lvm' (want multipath or none)",
        ),
        ("bad-stack-none-params", 2, "stack none takes no parameters"),
        (
            "bad-stack-param",
            2,
            "stack: unknown parameter 'paths' (want selector or path_sched)",
        ),
        (
            "bad-stack-path-sched",
            2,
            "stack: bad path_sched 'mq/deadline'",
        ),
        (
            "bad-stack-selector",
            1,
            "stack: unknown selector 'random' (want service-time, round-robin or queue-length)",
        ),
        (
            "bad-stack-setting",
            2,
            "stack: bad parameter '=x' (want NAME=VALUE)",
        ),
    ];
    let dir = root().join("tests/fixtures/scenarios");
    let mut bad_files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| {
            e.unwrap()
                .path()
                .file_stem()
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|n| !n.starts_with("good"))
        .collect();
    bad_files.sort();
    let mut listed: Vec<String> = cases.iter().map(|c| c.0.to_string()).collect();
    listed.sort();
    assert_eq!(
        bad_files, listed,
        "every malformed fixture has an expected error"
    );

    for (label, shell, awk) in shells() {
        for (name, line, msg) in cases {
            let path = format!("tests/fixtures/scenarios/{name}.scn");
            let out = check(&shell, awk, &path);
            assert_eq!(out.status.code(), Some(2), "[{label}] {name}: {:?}", out);
            assert_eq!(
                text(&out.stdout),
                format!("BLKLAB-ERROR scenario {path}:{line}: {msg}\n"),
                "[{label}] {name}"
            );
            // run mode rejects it the same way, before looking for devices or fio
            let out = run_script(&shell, awk, "run.sh", &[&path], &[]);
            assert_eq!(out.status.code(), Some(2), "[{label}] {name} (run)");
            assert_eq!(
                text(&out.stdout),
                format!("BLKLAB-ERROR scenario {path}:{line}: {msg}\n"),
                "[{label}] {name} (run)"
            );
        }
        let out = check(&shell, awk, "no-such-scenario");
        assert_eq!(out.status.code(), Some(2));
        assert!(
            text(&out.stdout).starts_with("BLKLAB-ERROR scenario ")
                && text(&out.stdout).contains("no-such-scenario.scn: no such scenario file"),
            "[{label}] {}",
            text(&out.stdout)
        );
    }
}

#[test]
fn good_fixture_parses_to_the_exact_document() {
    let want: Value = serde_json::json!({
        "name": "good-everything",
        "description": "a good scenario",
        "disks": 3,
        "queues": 2,
        "vcpus": 4,
        "memory": "2G",
        "memory_per_vcpu": null,
        "queue_size": 128,
        "kernel_append": "clocksource=hpet foo=1",
        "variants": [
            {"name": "first",
             "target": {"kind": "null_blk", "params": ["queue_mode=2", "submit_queues=@NCPU@"]},
             "sched": "mq-deadline", "nr_requests": 64, "runtime": 7, "ramp": 1,
             "queue_depth": 16, "nomerges": 2, "rq_affinity": 1, "layout": "per-disk",
             "stack": null,
             "device": ["tags=shared", "depth=64"],
             "fio_args": ["--rw=randread", "--bs=4k", "--iodepth=8"]},
            {"name": "second.v-2_x",
             "target": {"kind": "virtio", "params": []},
             "sched": "none", "nr_requests": 32, "runtime": 3, "ramp": 0,
             "queue_depth": 16, "nomerges": 0, "rq_affinity": 1, "layout": "all",
             "stack": null,
             "device": ["tags=shared", "latency=20us", "depth=16"],
             "fio_args": ["--rw=randread", "--bs=4k", "--iodepth=8", "--numjobs=@NCPU@", "--rwmixread=70"]},
            {"name": "third",
             "target": {"kind": "scsi_debug", "params": []},
             "sched": "mq-deadline", "nr_requests": 64, "runtime": 7, "ramp": 1,
             "queue_depth": 4, "nomerges": 2, "rq_affinity": 1, "layout": "per-disk",
             "stack": null,
             "device": ["tags=shared", "depth=64"],
             "fio_args": ["--rw=randread", "--bs=4k", "--iodepth=8", "\"--name-ish=it's\\fine\""]}
        ]
    });
    for (label, shell, awk) in shells() {
        let out = check(&shell, awk, "tests/fixtures/scenarios/good-everything.scn");
        assert!(out.status.success(), "[{label}] {out:?}");
        let got: Value = serde_json::from_slice(&out.stdout).expect("JSON");
        assert_eq!(got, want, "[{label}]");
    }
}

/// The run-time view of a scenario: what run.sh evals (scenario.awk mode=sh).
fn sh_view(awk: &[&str], scn: &str, ncpu: &str, env: &[(&str, &str)]) -> Output {
    let path = root().join(scn);
    let mut c = Command::new(awk[0]);
    c.args(&awk[1..])
        .args(["-v", "mode=sh", "-v", &format!("ncpu={ncpu}")])
        .arg("-f")
        .arg(root().join("guest-scripts/lib/json.awk"))
        .arg("-f")
        .arg(root().join("guest-scripts/lib/scenario.awk"))
        .arg(&path)
        .env("SCN_FILE", scn)
        .env("SCN_NAME", Path::new(scn).file_stem().unwrap());
    for (k, _) in std::env::vars() {
        if k.starts_with("BLKLAB_") {
            c.env_remove(k);
        }
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

/// eval the assignments in sh and print the named variables, one a line
fn eval_vars(assignments: &[u8], vars: &[&str]) -> Vec<String> {
    let script = format!(
        "eval \"$(cat)\"; {}",
        vars.iter()
            .map(|v| format!("printf '%s\\n' \"${v}\";"))
            .collect::<String>()
    );
    let mut child = Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(assignments).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    text(&out.stdout).lines().map(String::from).collect()
}

#[test]
fn run_time_view_applies_overrides_filter_and_ncpu() {
    for awk in awks() {
        let out = sh_view(
            &awk,
            "guest-scripts/scenarios/seed000-scsi-debug.scn",
            "7",
            &[
                ("BLKLAB_RUNTIME", "3"),
                ("BLKLAB_RAMP", "2"),
                ("BLKLAB_VARIANTS", "zzz,host-tags-none,single-queue"),
            ],
        );
        assert!(out.status.success(), "{awk:?}: {out:?}");
        let v = eval_vars(
            &out.stdout,
            &[
                "SCN_NV",
                "SCN_V1_NAME",
                "SCN_V2_NAME",
                "SCN_V1_PARAMS",
                "SCN_V1_RUNTIME",
                "SCN_V1_RAMP",
                "SCN_V1_SCHED",
                "SCN_V2_PARAMS",
            ],
        );
        assert_eq!(v[0], "2", "{awk:?}");
        // scenario order, not filter order
        assert_eq!(v[1], "single-queue");
        assert_eq!(v[2], "host-tags-none");
        assert!(v[3].contains("submit_queues=1"), "{}", v[3]);
        assert_eq!(v[4], "3");
        assert_eq!(v[5], "2");
        assert_eq!(v[6], "mq-deadline");
        assert!(
            v[7].contains("submit_queues=7") && !v[7].contains("@NCPU@"),
            "{}",
            v[7]
        );

        // quoting survives eval
        let out = sh_view(
            &awk,
            "tests/fixtures/scenarios/good-everything.scn",
            "2",
            &[],
        );
        assert!(out.status.success());
        let v = eval_vars(
            &out.stdout,
            &["SCN_V3_FIO", "SCN_V2_FIO", "SCN_DESCRIPTION", "SCN_QUEUES"],
        );
        assert_eq!(
            v[0],
            "--rw=randread --bs=4k --iodepth=8 \"--name-ish=it's\\fine\""
        );
        assert_eq!(
            v[1],
            "--rw=randread --bs=4k --iodepth=8 --numjobs=2 --rwmixread=70"
        );
        assert_eq!(v[2], "a good scenario");
        assert_eq!(v[3], "2");

        for (var, val, msg) in [
            (
                "BLKLAB_RUNTIME",
                "0",
                "BLKLAB-ERROR BLKLAB_RUNTIME=0: bad number (want an integer >= 1)\n",
            ),
            (
                "BLKLAB_RAMP",
                "x",
                "BLKLAB-ERROR BLKLAB_RAMP=x: bad number (want an integer >= 0)\n",
            ),
            (
                "BLKLAB_VARIANTS",
                "nope",
                "BLKLAB-ERROR smoke: no variant matches BLKLAB_VARIANTS=nope\n",
            ),
        ] {
            let out = sh_view(
                &awk,
                "guest-scripts/scenarios/smoke.scn",
                "2",
                &[(var, val)],
            );
            assert_eq!(out.status.code(), Some(2), "{awk:?} {var}");
            assert_eq!(text(&out.stdout), msg, "{awk:?} {var}");
        }
    }
    // and run.sh stops with status 2 before doing anything
    for (label, shell, awk) in shells() {
        let out = run_script(
            &shell,
            awk,
            "run.sh",
            &["smoke"],
            &[("BLKLAB_VARIANTS", "nope")],
        );
        assert_eq!(out.status.code(), Some(2), "[{label}]");
        assert_eq!(
            text(&out.stdout),
            "BLKLAB-ERROR smoke: no variant matches BLKLAB_VARIANTS=nope\n",
            "[{label}]"
        );
    }
}

#[test]
fn lab_sh_reports_unknown_and_missing_scenarios() {
    for (label, shell, awk) in shells() {
        let out = run_script(&shell, awk, "lab.sh", &[], &[]);
        assert_eq!(out.status.code(), Some(2), "[{label}]");
        assert!(
            text(&out.stdout).starts_with("BLKLAB-ERROR lab: no scenarios"),
            "[{label}]"
        );

        // unknown scenarios are reported up front; a known one with an empty
        // variant filter fails with 2 as well (nothing boots a device here)
        let out = run_script(
            &shell,
            awk,
            "lab.sh",
            &[],
            &[
                ("BLKLAB_SCENARIOS", "nope,smoke,,also-nope"),
                ("BLKLAB_VARIANTS", "none-such"),
            ],
        );
        assert_eq!(out.status.code(), Some(2), "[{label}] {out:?}");
        let stdout = text(&out.stdout);
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(lines.len(), 3, "[{label}] {stdout}");
        assert!(
            lines[0].starts_with("BLKLAB-ERROR lab: unknown scenario 'nope' (have: "),
            "{stdout}"
        );
        assert!(
            lines[0].contains("seed002-quick") && lines[0].contains("smoke"),
            "{stdout}"
        );
        assert!(
            lines[1].starts_with("BLKLAB-ERROR lab: unknown scenario 'also-nope'"),
            "{stdout}"
        );
        assert_eq!(
            lines[2],
            "BLKLAB-ERROR smoke: no variant matches BLKLAB_VARIANTS=none-such"
        );
    }
}

fn awk_run(awk: &[&str], progs: &[&str], files: &[PathBuf], env: &[(&str, String)]) -> Output {
    let mut c = Command::new(awk[0]);
    c.args(&awk[1..]);
    for p in progs {
        c.arg("-f").arg(root().join("guest-scripts/lib").join(p));
    }
    c.args(files);
    for (k, v) in env {
        c.env(k, v);
    }
    c.stdin(Stdio::null()).output().unwrap()
}

#[test]
fn jsoncheck_accepts_json_and_rejects_the_rest() {
    let good = [
        "{}",
        "[]",
        "0",
        "\"x\"",
        "{\"a\": [1, -2.5e+3, true, false, null, {\"b\": \"\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\"}]}",
        "{\n  \"multi\":\n  [\n 1,\n 2\n ]\n}\n",
    ];
    let bad = [
        "",
        "{",
        "{\"a\":1,}",
        "[1 2]",
        "{\"a\" 1}",
        "01",
        "[nan]",
        "\"a\\q\"",
        "{} {}",
        "[1]]",
        "{\"a\":}",
        "'x'",
        "[\"tab\there\"]",
    ];
    let dir = std::env::temp_dir().join(format!("blklab-jsoncheck-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for awk in awks() {
        for (i, (doc, ok)) in good
            .iter()
            .map(|d| (d, true))
            .chain(bad.iter().map(|d| (d, false)))
            .enumerate()
        {
            let f = dir.join(format!("{i}.json"));
            std::fs::write(&f, doc).unwrap();
            let out = awk_run(&awk, &["jsoncheck.awk"], &[f], &[]);
            assert_eq!(
                out.status.success(),
                ok,
                "{awk:?} {doc:?}: {}",
                text(&out.stdout)
            );
            // and serde agrees
            assert_eq!(
                serde_json::from_str::<Value>(doc).is_ok(),
                ok,
                "serde on {doc:?}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

const PCT: [&str; 10] = [
    "usr", "nice", "sys", "iowait", "irq", "soft", "steal", "guest", "gnice", "idle",
];

fn check_pct_row(row: &Value, ctx: &str) {
    let sum: f64 = PCT.iter().map(|k| row[*k].as_f64().unwrap()).sum();
    assert!(
        (sum - 100.0).abs() <= 0.05 + 1e-9,
        "{ctx}: components sum to {sum}: {row}"
    );
    let busy = row["busy"].as_f64().unwrap();
    let idle = row["idle"].as_f64().unwrap();
    assert!(
        (busy + idle - 100.0).abs() < 1e-9,
        "{ctx}: busy {busy} idle {idle}"
    );
}

/// Sum of the eight non-guest fields of the cpuN lines, per CPU.
fn stat_ticks(path: &Path) -> BTreeMap<String, u64> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .map(|l| {
            let f: Vec<u64> = l
                .split_whitespace()
                .skip(1)
                .map(|x| x.parse().unwrap())
                .collect();
            (
                l.split_whitespace().next().unwrap().to_string(),
                f[..8].iter().sum(),
            )
        })
        .collect()
}

#[test]
fn cpu_reduction_matches_sysstat_mpstat() {
    let dir = root().join("tests/fixtures/cpu");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| {
            let n = e.unwrap().file_name().to_string_lossy().into_owned();
            n.strip_suffix(".before").map(String::from)
        })
        .collect();
    names.sort();
    assert!(names.len() >= 8, "fixtures: {names:?}");
    for awk in awks() {
        for name in &names {
            let before = dir.join(format!("{name}.before"));
            let after = dir.join(format!("{name}.after"));
            let out = awk_run(
                &awk,
                &["cpu.awk", "cpustat.awk"],
                &[before.clone(), after.clone()],
                &[],
            );
            assert!(out.status.success(), "{awk:?} {name}: {out:?}");
            let ours: Value = serde_json::from_slice(&out.stdout)
                .unwrap_or_else(|e| panic!("{awk:?} {name}: {e}: {}", text(&out.stdout)));
            let mp: Value = serde_json::from_str(
                &std::fs::read_to_string(dir.join(format!("{name}.mpstat.json"))).unwrap(),
            )
            .unwrap();
            let rows = mp["sysstat"]["hosts"][0]["statistics"][0]["cpu-load"]
                .as_array()
                .unwrap();
            let mut ours_rows: BTreeMap<String, &Value> = BTreeMap::new();
            ours_rows.insert("all".into(), &ours["all"]);
            for r in ours["per_cpu"].as_array().unwrap() {
                ours_rows.insert(r["cpu"].to_string(), r);
            }
            let mp_cpus: Vec<String> = rows
                .iter()
                .map(|r| r["cpu"].as_str().unwrap().to_string())
                .collect();
            let mut ours_cpus: Vec<String> = ours_rows.keys().cloned().collect();
            let mut mp_sorted = mp_cpus.clone();
            mp_sorted.sort();
            ours_cpus.sort();
            assert_eq!(ours_cpus, mp_sorted, "{awk:?} {name}: CPUs shown");
            for r in rows {
                let cpu = r["cpu"].as_str().unwrap();
                let o = ours_rows[cpu];
                for k in PCT {
                    let (a, b) = (o[k].as_f64().unwrap(), r[k].as_f64().unwrap());
                    assert!(
                        (a - b).abs() < 1e-9,
                        "{awk:?} {name} cpu {cpu} {k}: ours {a}, mpstat {b}"
                    );
                }
                // guest-skew has guest time growing faster than user time: mpstat's
                // correction makes its components not sum to 100, ours neither
                if name != "guest-skew" {
                    check_pct_row(o, &format!("{awk:?} {name} cpu {cpu}"));
                }
            }
            // ticks: for the plain samples, the sum of the eight non-guest
            // field deltas over the CPUs (computed here, not by awk)
            if name == "sample" || name == "busy" {
                let (b, a) = (stat_ticks(&before), stat_ticks(&after));
                let want: u64 = a.iter().map(|(k, v)| v - b[k]).sum();
                assert_eq!(
                    ours["ticks"].as_u64().unwrap(),
                    want,
                    "{awk:?} {name} ticks"
                );
            }
        }
    }
}

/// /proc-style sections of a snapshot file: section name -> lines
fn sections(path: &Path) -> BTreeMap<String, Vec<String>> {
    let mut m: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut cur = String::new();
    for l in std::fs::read_to_string(path).unwrap().lines() {
        if let Some(s) = l.strip_prefix('@') {
            cur = s.to_string();
            m.entry(cur.clone()).or_default();
        } else {
            m.get_mut(&cur).unwrap().push(l.to_string());
        }
    }
    m
}

fn stat_value(sec: &BTreeMap<String, Vec<String>>, key: &str) -> u64 {
    sec["stat"]
        .iter()
        .find(|l| l.split_whitespace().next() == Some(key))
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap()
}

/// `v` without its null object members (null and absent read alike).
fn without_nulls(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .filter(|(_, x)| !x.is_null())
                .map(|(k, x)| (k, without_nulls(x)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.into_iter().map(without_nulls).collect()),
        other => other,
    }
}

#[test]
fn result_document_from_recorded_snapshots() {
    let dir = root().join("tests/fixtures/result");
    let before = dir.join("loop0-randwrite.before");
    let after = dir.join("loop0-randwrite.after");
    let (sb, sa) = (sections(&before), sections(&after));
    let tmp = std::env::temp_dir().join(format!("blklab-result-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let fio = tmp.join("fio.json");
    std::fs::write(
        &fio,
        "{\n  \"fio version\" : \"fio-3.33\",\n  \"jobs\" : []\n}\n",
    )
    .unwrap();
    let log = tmp.join("fio.log");
    std::fs::write(&log, "note: a \"quoted\" \\ line\n\ttabbed\n").unwrap();
    let err = "first \"error\"\nsecond \\ line\u{1}";

    for awk in awks() {
        let env: Vec<(&str, String)> = vec![
            ("R_SCENARIO", "smoke".into()),
            ("R_VARIANT", "write".into()),
            ("R_OK", "false".into()),
            ("R_ERROR", err.into()),
            ("R_KERNEL", "6.12.0-test".into()),
            ("R_NCPU", "2".into()),
            ("R_KIND", "null_blk".into()),
            ("R_PARAMS", "queue_mode=2 submit_queues=2".into()),
            ("R_SCHED", "".into()),
            ("R_NR", "128".into()),
            ("R_RUNTIME", "2".into()),
            ("R_RAMP", "0".into()),
            ("R_FIOARGS", "--rw=randwrite --bs=4k".into()),
            ("R_FIOCMD", "fio --name=write --rw=randwrite".into()),
            ("R_DEVICES", "loop0".into()),
            ("R_QUEUE", "{\"loop0\": {\"scheduler\": \"none\"}}".into()),
            ("R_BEFORE", before.to_string_lossy().into()),
            ("R_AFTER", after.to_string_lossy().into()),
            ("R_MPSTAT", "".into()),
            ("R_FIO", fio.to_string_lossy().into()),
            ("R_FIO_RC", "0".into()),
            ("R_FIO_LOG", log.to_string_lossy().into()),
        ];
        let out = awk_run(
            &awk,
            &["json.awk", "cpu.awk", "blkmq.awk", "result.awk"],
            &[],
            &env,
        );
        assert!(out.status.success(), "{awk:?}: {out:?}");
        let doc: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{awk:?}: not JSON: {e}\n{}", text(&out.stdout)));
        assert_eq!(doc["schema"], "blklab-guest-result/1");
        // The host reads the same document as its type, and writes it
        // back whole.
        let typed: blklab::record::guest::GuestResult =
            serde_json::from_value(doc.clone()).expect("a GuestResult");
        assert_eq!(typed.settings.as_ref().unwrap().target, "null_blk");
        assert!(typed.block.as_ref().unwrap()["loop0"].ios() > 1000);
        assert!(typed.cpu.is_some() && typed.interrupts.is_some());
        // (A field this test's abbreviated queue settings leave out comes
        // back as null.)
        assert_eq!(
            without_nulls(serde_json::to_value(&typed).unwrap()),
            without_nulls(doc.clone())
        );
        assert_eq!(doc["ok"], false);
        assert_eq!(doc["error"], err);
        assert_eq!(doc["fio_log"], "note: a \"quoted\" \\ line\n\ttabbed");
        assert_eq!(doc["settings"]["target"], "null_blk");
        assert_eq!(
            doc["settings"]["target_params"],
            serde_json::json!(["queue_mode=2", "submit_queues=2"])
        );
        assert_eq!(doc["settings"]["sched"], Value::Null);
        assert_eq!(doc["settings"]["nr_requests"], 128);
        assert_eq!(doc["fio_cmdline"][1], "--name=write");
        assert_eq!(doc["devices"], serde_json::json!(["loop0"]));
        assert_eq!(doc["queue"]["loop0"]["scheduler"], "none");
        assert_eq!(doc["mpstat"], Value::Null);
        assert_eq!(doc["fio"]["fio version"], "fio-3.33");
        assert_eq!(doc["fio_rc"], 0);

        // deltas computed here from the raw snapshot text
        let up = |s: &BTreeMap<String, Vec<String>>| -> f64 {
            s["uptime"][0]
                .split_whitespace()
                .next()
                .unwrap()
                .parse()
                .unwrap()
        };
        let wall = doc["wall_seconds"].as_f64().unwrap();
        assert!((wall - (up(&sa) - up(&sb))).abs() < 0.006, "wall {wall}");
        assert_eq!(
            doc["context_switches"].as_u64().unwrap(),
            stat_value(&sa, "ctxt") - stat_value(&sb, "ctxt")
        );
        assert_eq!(
            doc["processes"].as_u64().unwrap(),
            stat_value(&sa, "processes") - stat_value(&sb, "processes")
        );
        assert_eq!(
            doc["interrupts"]["total"].as_u64().unwrap(),
            stat_value(&sa, "intr") - stat_value(&sb, "intr")
        );

        let blk = |s: &BTreeMap<String, Vec<String>>| -> Vec<u64> {
            s["block loop0"][0]
                .split_whitespace()
                .map(|x| x.parse().unwrap())
                .collect()
        };
        let (bb, ba) = (blk(&sb), blk(&sa));
        let b = &doc["block"]["loop0"];
        assert_eq!(b["write_ios"].as_u64().unwrap(), ba[4] - bb[4]);
        assert_eq!(b["write_sectors"].as_u64().unwrap(), ba[6] - bb[6]);
        assert_eq!(b["read_ios"].as_u64().unwrap(), ba[0] - bb[0]);
        assert_eq!(b["in_flight"].as_u64().unwrap(), ba[8]);
        assert_eq!(b.as_object().unwrap().len(), ba.len().min(17));
        assert!(b["write_ios"].as_u64().unwrap() > 1000);

        // interrupt lines: exactly the numbered ones mentioning virtio/scsi/nullb, summed over CPUs
        let irqs = |s: &BTreeMap<String, Vec<String>>| -> BTreeMap<String, (String, u64)> {
            let lines = &s["interrupts"];
            let ncpu = lines[0].split_whitespace().count();
            lines[1..]
                .iter()
                .filter_map(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    let irq = f[0].trim_end_matches(':');
                    if !irq.chars().all(|c| c.is_ascii_digit()) {
                        return None;
                    }
                    let rest = f[1 + ncpu..].join(" ");
                    if !(rest.contains("virtio") || rest.contains("scsi") || rest.contains("nullb"))
                    {
                        return None;
                    }
                    let n: u64 = f[1..=ncpu].iter().map(|x| x.parse::<u64>().unwrap()).sum();
                    Some((irq.to_string(), (f.last().unwrap().to_string(), n)))
                })
                .collect()
        };
        let (ib, ia) = (irqs(&sb), irqs(&sa));
        let lines = doc["interrupts"]["lines"].as_array().unwrap();
        assert_eq!(lines.len(), ia.len());
        assert!(!lines.is_empty());
        for l in lines {
            let irq = l["irq"].as_str().unwrap();
            assert_eq!(l["name"], ia[irq].0);
            assert_eq!(
                l["count"].as_u64().unwrap(),
                ia[irq].1 - ib[irq].1,
                "irq {irq}"
            );
        }
        assert!(doc["interrupts"]["arch"]["LOC"].as_u64().is_some());
        let soft = |s: &BTreeMap<String, Vec<String>>, k: &str| -> u64 {
            let l = s["softirqs"]
                .iter()
                .find(|l| l.trim_start().starts_with(&format!("{k}:")))
                .unwrap();
            l.split_whitespace()
                .skip(1)
                .map(|x| x.parse::<u64>().unwrap())
                .sum()
        };
        assert_eq!(
            doc["softirqs"]["BLOCK"].as_u64().unwrap(),
            soft(&sa, "BLOCK") - soft(&sb, "BLOCK")
        );
        check_pct_row(&doc["cpu"]["all"], "result all");

        // without snapshots (a variant that failed early) the measurements are null
        let mut env2 = env.clone();
        for (k, v) in env2.iter_mut() {
            if *k == "R_BEFORE"
                || *k == "R_AFTER"
                || *k == "R_FIO"
                || *k == "R_FIO_LOG"
                || *k == "R_FIO_RC"
            {
                *v = String::new();
            }
        }
        let out = awk_run(
            &awk,
            &["json.awk", "cpu.awk", "blkmq.awk", "result.awk"],
            &[],
            &env2,
        );
        let doc: Value = serde_json::from_slice(&out.stdout).expect("JSON without snapshots");
        let typed: blklab::record::guest::GuestResult =
            serde_json::from_value(doc.clone()).expect("a GuestResult without snapshots");
        assert!(typed.cpu.is_none() && typed.fio.is_none());
        assert_eq!(
            without_nulls(serde_json::to_value(&typed).unwrap()),
            without_nulls(doc.clone())
        );
        for k in [
            "cpu",
            "block",
            "interrupts",
            "wall_seconds",
            "fio",
            "fio_rc",
            "fio_log",
        ] {
            assert_eq!(doc[k], Value::Null, "{k}");
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

/// The number of `key=` in a tag set's debugfs text, before the reserved
/// tags' part.
fn tag_value(lines: &[String], key: &str) -> Option<i64> {
    lines
        .iter()
        .take_while(|l| l.as_str() != "breserved_tags:")
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.parse().ok())
}

/// The `blk_mq` section from real debugfs snapshots (run.sh's own, from
/// booted guests: tests/fixtures/blkmq/KERNEL-SCHED.{before,after}, the
/// blklab 5.10 and 6.12 kernels, 2 hardware queues, 4k randread qd4 for
/// 2 s), checked against the raw text.
#[test]
fn blk_mq_section_from_debugfs_snapshots() {
    let dir = root().join("tests/fixtures/blkmq");
    let tmp = std::env::temp_dir().join(format!("blklab-blkmq-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let doc_of = |awk: &[&str], before: &Path, after: &Path, err: &str| -> Value {
        let env: Vec<(&str, String)> = vec![
            ("R_OK", "true".into()),
            ("R_DEVICES", "vda".into()),
            ("R_BEFORE", before.to_string_lossy().into()),
            ("R_AFTER", after.to_string_lossy().into()),
            ("R_BLKMQ_ERROR", err.into()),
        ];
        let out = awk_run(
            awk,
            &["json.awk", "cpu.awk", "blkmq.awk", "result.awk"],
            &[],
            &env,
        );
        assert!(out.status.success(), "{awk:?}: {out:?}");
        let doc: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{awk:?}: not JSON: {e}\n{}", text(&out.stdout)));
        let typed: blklab::record::guest::GuestResult =
            serde_json::from_value(doc.clone()).expect("a GuestResult");
        assert_eq!(
            without_nulls(serde_json::to_value(&typed).unwrap()),
            without_nulls(doc.clone())
        );
        doc
    };
    for awk in awks() {
        for (kernel, sched) in [
            ("5.10", "none"),
            ("5.10", "mq-deadline"),
            ("6.12", "none"),
            ("6.12", "mq-deadline"),
        ] {
            let what = format!("{awk:?} {kernel}-{sched}");
            let before = dir.join(format!("{kernel}-{sched}.before"));
            let after = dir.join(format!("{kernel}-{sched}.after"));
            let (sb, sa) = (sections(&before), sections(&after));
            let doc = doc_of(&awk, &before, &after, "");
            let bq = &doc["blk_mq"];
            assert_eq!(bq["error"], Value::Null, "{what}");
            let hctx = bq["devices"]["vda"]["hctx"].as_array().unwrap();
            assert_eq!(hctx.len(), 2, "{what}: {bq}");
            let one = |s: &BTreeMap<String, Vec<String>>, h: usize, a: &str| -> Option<i64> {
                s.get(&format!("blkmq vda hctx{h} {a}"))
                    .map(|l| l[0].trim().parse().unwrap())
            };
            let mut sum_queued = 0;
            for (h, x) in hctx.iter().enumerate() {
                assert_eq!(x["hctx"], h, "{what}");
                for c in ["queued", "run"] {
                    match (one(&sb, h, c), one(&sa, h, c)) {
                        (Some(b), Some(a)) => assert_eq!(x[c], a - b, "{what} hctx{h} {c}"),
                        _ => assert_eq!(x[c], Value::Null, "{what} hctx{h} {c}"),
                    }
                }
                sum_queued += x["queued"].as_i64().unwrap_or(0);
                for g in ["dispatch_busy", "active"] {
                    assert_eq!(x[g]["before"], one(&sb, h, g).unwrap(), "{what} {g}");
                    assert_eq!(x[g]["after"], one(&sa, h, g).unwrap(), "{what} {g}");
                }
                // the dispatched histogram: bucket label -> delta, in the kernel's order
                let key = format!("blkmq vda hctx{h} dispatched");
                match (sb.get(&key), sa.get(&key)) {
                    (Some(b), Some(a)) => {
                        let d = x["dispatched"].as_object().unwrap();
                        assert_eq!(d.len(), a.len(), "{what}");
                        for (lb, la) in b.iter().zip(a) {
                            let (fb, fa): (Vec<&str>, Vec<&str>) = (
                                lb.split_whitespace().collect(),
                                la.split_whitespace().collect(),
                            );
                            assert_eq!(fb[0], fa[0]);
                            let n = fa[1].parse::<i64>().unwrap() - fb[1].parse::<i64>().unwrap();
                            assert_eq!(d[fa[0]], n, "{what} bucket {}", fa[0]);
                        }
                        assert!(d.contains_key("0") && d.contains_key("32+"), "{what}");
                    }
                    _ => assert_eq!(x["dispatched"], Value::Null, "{what}"),
                }
                for t in ["tags", "sched_tags"] {
                    let key = format!("blkmq vda hctx{h} {t}");
                    match (sb.get(&key), sa.get(&key)) {
                        (Some(b), Some(a)) => {
                            for k in [
                                "nr_tags",
                                "active_queues",
                                "depth",
                                "busy",
                                "wake_batch",
                                "ws_active",
                            ] {
                                assert_eq!(
                                    x[t]["before"][k],
                                    tag_value(b, k).unwrap(),
                                    "{what} {t} {k}"
                                );
                                assert_eq!(
                                    x[t]["after"][k],
                                    tag_value(a, k).unwrap(),
                                    "{what} {t} {k}"
                                );
                            }
                        }
                        _ => assert_eq!(x[t], Value::Null, "{what} {t}"),
                    }
                }
            }
            // Which attributes each kernel has (from its source, seen here):
            // 5.10 all, 6.12 none of the counters.
            let attrs: Vec<&str> = bq["attributes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap())
                .collect();
            let counters = ["dispatched", "queued", "run"];
            if kernel == "5.10" {
                assert!(
                    counters.iter().all(|c| attrs.contains(c)),
                    "{what}: {attrs:?}"
                );
                // One request allocated per IO (4k random reads do not merge).
                let ios = doc["block"]["vda"]["read_ios"].as_i64().unwrap();
                assert_eq!(bq["sum"]["queued"], sum_queued, "{what}");
                assert_eq!(sum_queued, ios, "{what}");
                // With a scheduler every request goes through a queue run and
                // one dispatch; without one they are issued directly.
                let run = bq["sum"]["run"].as_i64().unwrap();
                let ones = bq["sum"]["dispatched"]["1"].as_i64().unwrap();
                if sched == "none" {
                    assert!(run < ios / 10 && ones < ios / 10, "{what}: {bq}");
                } else {
                    assert!(run >= ios && ones >= ios * 9 / 10, "{what}: {bq}");
                }
            } else {
                assert!(
                    !counters.iter().any(|c| attrs.contains(c)),
                    "{what}: {attrs:?}"
                );
                for c in counters {
                    assert_eq!(bq["sum"][c], Value::Null, "{what}");
                }
            }
            assert!(
                attrs.contains(&"dispatch_busy") && attrs.contains(&"tags"),
                "{what}"
            );
            assert_eq!(attrs.contains(&"sched_tags"), sched != "none", "{what}");
            assert_eq!(hctx[0]["sched_tags"].is_null(), sched == "none", "{what}");

            // An attribute missing from one snapshot is null, the rest stays.
            let cut = tmp.join("cut.after");
            let text = std::fs::read_to_string(&after).unwrap();
            let mut out = String::new();
            let mut skip = false;
            for l in text.lines() {
                if l.starts_with('@') {
                    skip = l == "@blkmq vda hctx1 queued" || l == "@blkmq vda hctx1 tags";
                }
                if !skip {
                    out.push_str(l);
                    out.push('\n');
                }
            }
            std::fs::write(&cut, out).unwrap();
            let d2 = doc_of(&awk, &before, &cut, "");
            let h1 = &d2["blk_mq"]["devices"]["vda"]["hctx"][1];
            assert_eq!(h1["queued"], Value::Null, "{what}");
            assert_eq!(h1["tags"], Value::Null, "{what}");
            assert_eq!(h1["dispatch_busy"], hctx[1]["dispatch_busy"], "{what}");
            assert_eq!(d2["blk_mq"]["sum"]["queued"], hctx[0]["queued"], "{what}");
        }
        // No debugfs: the error, no hardware queues, the rest of the document.
        let plain = tmp.join("plain");
        let text = std::fs::read_to_string(dir.join("6.12-none.before")).unwrap();
        let cut = text.split("\n@blkmq").next().unwrap().to_string() + "\n";
        std::fs::write(&plain, cut).unwrap();
        let doc = doc_of(&awk, &plain, &plain, "no /sys/kernel/debug/block");
        assert_eq!(doc["blk_mq"]["error"], "no /sys/kernel/debug/block");
        assert_eq!(doc["blk_mq"]["attributes"], serde_json::json!([]));
        assert_eq!(
            doc["blk_mq"]["devices"]["vda"]["hctx"],
            serde_json::json!([])
        );
        assert_eq!(doc["blk_mq"]["sum"]["queued"], Value::Null);
        assert!(doc["block"]["vda"].is_object());
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

/// The files of guest-scripts/lib/ that run.sh sources, sorted.
fn sourced_libs() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(root().join("guest-scripts/lib"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".sh"))
        .collect();
    v.sort();
    v
}

/// `SHELL -c SCRIPT` in the repository root with LIB=guest-scripts/lib,
/// AWK (`awk` by default, as run.sh's), a clean BLKLAB_* environment plus
/// `env`, and `stdin` on stdin.
fn run_sh(
    shell: &[&str],
    awk: Option<&str>,
    script: &str,
    env: &[(&str, &str)],
    stdin: &str,
) -> Output {
    let mut c = Command::new(shell[0]);
    c.args(&shell[1..])
        .args(["-c", script])
        .current_dir(root())
        .env("LIB", "guest-scripts/lib")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, _) in std::env::vars() {
        if k.starts_with("BLKLAB_") || k == "AWK" {
            c.env_remove(k);
        }
    }
    c.env("AWK", awk.unwrap_or("awk"));
    for (k, v) in env {
        c.env(k, v);
    }
    let mut child = c.spawn().expect("run sh -c");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn every_lib_file_states_its_contract_and_sources_silently() {
    let libs = sourced_libs();
    assert!(!libs.is_empty());
    let run_sh_text = std::fs::read_to_string(root().join("guest-scripts/run.sh")).unwrap();
    for name in &libs {
        let text = std::fs::read_to_string(root().join("guest-scripts/lib").join(name)).unwrap();
        let mut lines = text.lines();
        // .ci/shellcheck picks sourced files by this first line
        assert_eq!(lines.next(), Some("# shellcheck shell=sh"), "{name}");
        let head: String = text
            .lines()
            .take_while(|l| l.starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n");
        assert!(
            head.contains(&format!("# guest-scripts/lib/{name}: ")),
            "{name}: the header names the file"
        );
        for part in ["Provides:", "Expects of its caller:", "Must not:"] {
            assert!(head.contains(part), "{name}: the header has no {part}");
        }
        assert!(
            run_sh_text.contains(&format!(
                "# shellcheck source=guest-scripts/lib/{name}\n. \"$LIB/{name}\"\n"
            )),
            "run.sh sources {name} with its shellcheck source= line"
        );
    }
    // Sourcing defines functions and variables and nothing else: no output,
    // alone or all together in run.sh's order.
    let all: String = libs.iter().map(|n| format!(". \"$LIB/{n}\"; ")).collect();
    for (label, shell, awk) in shells() {
        for script in libs
            .iter()
            .map(|n| format!(". \"$LIB/{n}\""))
            .chain([all.clone()])
        {
            let out = run_sh(&shell, awk, &script, &[], "");
            assert!(out.status.success(), "[{label}] {script}: {out:?}");
            assert_eq!(text(&out.stdout), "", "[{label}] {script}");
            assert_eq!(text(&out.stderr), "", "[{label}] {script}");
        }
    }
}

#[test]
fn common_helpers_order_devices_and_write_json_numbers() {
    let script = r#". "$LIB/common.sh"; . "$LIB/modules.sh"
        printf 'vdaa\nvdb\nsda\nvda\n' | sort_devs | tr '\n' ' '; echo
        echo "$(jnum 12) $(jnum '') $(jnum -1) $(jnum 3x)"
        param_value nr_devices 1 queue_mode=2 nr_devices=3 irqmode=0
        param_value max_luns 1 queue_mode=2
        SCN_NAME=scn VNAME=var ERR=""
        fail "first"; fail "second"; echo "ERR=$ERR""#;
    for (label, shell, awk) in shells() {
        let out = run_sh(&shell, awk, script, &[], "");
        assert!(out.status.success(), "[{label}] {out:?}");
        assert_eq!(
            text(&out.stdout),
            "sda vda vdb vdaa \n12 null null null\n3\n1\n\
             BLKLAB-ERROR scn var: first\nBLKLAB-ERROR scn var: second\n\
             ERR=first; second\n",
            "[{label}]"
        );
    }
}

/// The snapshots' reader: a file as it is, leading blanks and a last line
/// without its newline included, with the shell's builtins only (a PATH
/// without cat, awk or anything else still copies).
#[test]
fn copy_file_copies_with_the_shells_builtins() {
    let tmp = tempfile::tempdir().unwrap();
    let f = tmp.path().join("f");
    std::fs::write(
        &f,
        "           CPU0       CPU1\n  0:   12  3   IO-APIC\n\nlast",
    )
    .unwrap();
    let script = format!(
        r#". "$LIB/common.sh"; PATH=/nonexistent; copy_file {}"#,
        f.display()
    );
    for (label, shell, awk) in shells() {
        let out = run_sh(&shell, awk, &script, &[], "");
        assert!(out.status.success(), "[{label}] {out:?}");
        assert_eq!(
            text(&out.stdout),
            "           CPU0       CPU1\n  0:   12  3   IO-APIC\n\nlast\n",
            "[{label}]"
        );
    }
}

#[test]
fn sync_point_waits_for_its_reply_and_fails_at_end_of_input() {
    let script = r#". "$LIB/common.sh"; . "$LIB/sync.sh"
        SCN_NAME=scn VNAME=var ERR="" SYNC_TIMEOUT=20
        sync_point begin echo "snapshot 1"; echo "rc=$? ERR=$ERR"
        sync_point end echo "snapshot 2"; echo "rc=$? ERR=$ERR""#;
    for (label, shell, awk) in shells() {
        let tmp = tempfile::tempdir().unwrap();
        let seq = tmp.path().join("seq");
        let seq = seq.to_str().unwrap();
        let env = [("BLKLAB_SYNC", "1"), ("BLKLAB_SYNC_SEQ_FILE", seq)];

        // The command (the snapshot) runs right before the line. The reply
        // is the line with the number, blanks and CR ignored; other lines
        // are ignored (said on stderr).
        let out = run_sh(&shell, awk, script, &env, "hello\n1\n 2 \r\n");
        assert!(out.status.success(), "[{label}] {out:?}");
        assert_eq!(
            text(&out.stdout),
            "snapshot 1\nBLKLAB-SYNC 1 begin scn var\nrc=0 ERR=\n\
             snapshot 2\nBLKLAB-SYNC 2 end scn var\nrc=0 ERR=\n",
            "[{label}]"
        );
        assert!(
            text(&out.stderr)
                .contains("ignoring console input 'hello' while waiting for SYNC reply 1"),
            "[{label}] {}",
            text(&out.stderr)
        );

        // The count goes on across runs of the same boot; at end of input
        // the variant fails at once (not after SYNC_TIMEOUT).
        let t0 = std::time::Instant::now();
        let out = run_sh(&shell, awk, script, &env, "");
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(15),
            "[{label}]"
        );
        let e3 = "end of input while waiting for the reply to BLKLAB-SYNC 3 (begin)";
        let e4 = "end of input while waiting for the reply to BLKLAB-SYNC 4 (end)";
        assert_eq!(
            text(&out.stdout),
            format!(
                "snapshot 1\nBLKLAB-SYNC 3 begin scn var\nBLKLAB-ERROR scn var: {e3}\nrc=1 ERR={e3}\n\
                 snapshot 2\nBLKLAB-SYNC 4 end scn var\nBLKLAB-ERROR scn var: {e4}\nrc=1 ERR={e3}; {e4}\n"
            ),
            "[{label}]"
        );

        // Without BLKLAB_SYNC=1 there is no handshake, only the command.
        let out = run_sh(&shell, awk, script, &[], "");
        assert_eq!(
            text(&out.stdout),
            "snapshot 1\nrc=0 ERR=\nsnapshot 2\nrc=0 ERR=\n",
            "[{label}]"
        );
    }
}

#[test]
fn blkmq_files_lists_the_readable_attributes_of_the_targets_hardware_queues() {
    let tmp = tempfile::tempdir().unwrap();
    let block = tmp.path().join("block");
    for (dev, hctx, attrs) in [
        (
            "vda",
            "hctx0",
            &["tags", "queued", "dispatched", "state"][..],
        ),
        ("vda", "hctx1", &["run"][..]),
        ("vda", "sched", &["queued"][..]),
        ("vdb", "hctx0", &["active"][..]),
    ] {
        let d = block.join(dev).join(hctx);
        std::fs::create_dir_all(&d).unwrap();
        for a in attrs {
            std::fs::write(d.join(a), "1\n").unwrap();
        }
    }
    let debugfs = tmp.path().to_str().unwrap();
    let script = r#". "$LIB/common.sh"; . "$LIB/blkmq.sh"
        DEVS="vda vdc"; blkmq_prepare; blkmq_files; echo "err=$BLKMQ_ERR""#;
    for (label, shell, awk) in shells() {
        let out = run_sh(&shell, awk, script, &[("BLKLAB_DEBUGFS", debugfs)], "");
        assert!(out.status.success(), "[{label}] {out:?}");
        // per queue in BLKMQ_ATTRS order; not vdb (no target), not sched/,
        // not an attribute outside the list, nothing for a missing device
        let want: String = [
            "hctx0/dispatched",
            "hctx0/queued",
            "hctx0/tags",
            "hctx1/run",
        ]
        .iter()
        .map(|f| format!("{debugfs}/block/vda/{f}\n"))
        .collect();
        assert_eq!(text(&out.stdout), want + "err=\n", "[{label}]");
    }
}
