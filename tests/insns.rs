//! Guest instruction counting (`blklab run --count-insns`): the TCG plugin
//! builds and loads into the installed QEMU, a short guest run reports
//! non-zero counts, two identical deterministic runs give identical
//! block-layer per-function counts, symbolisation against a System.map
//! fixture, and the differential profile of `blklab compare` on recorded
//! plug/noplug runs (tests/fixtures/insns/, trimmed with
//! tests/fixtures/runs/trim.py from a real `blklab run --kernel build:6.12
//! --kernel build:6.12+noplug --scenario plug-qd1 --count-insns
//! --deterministic --vcpus 1 --iterations 2`).

mod common;

use std::path::{Path, PathBuf};

use std::process::{Command, Output};
use std::sync::Mutex;

use serde_json::Value;

use blklab::lab::measure::plugin::{self, Dump, SymbolMap};
use blklab::record::guest::GuestResult;
use blklab::record::symbol_groups::{self, group_of};

/// The guest tests share the image cache and two CPUs: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

use common::{read_json, root};

fn fixture(name: &str) -> PathBuf {
    root().join("tests/fixtures/insns").join(name)
}

fn text(o: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn plugin_builds_and_the_installed_qemu_loads_it() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    // The script checks the load itself (a CPU-less machine with the plugin).
    let out = Command::new("sh")
        .arg(root().join("images/build-qemu-plugin.sh"))
        .output()
        .expect("run build-qemu-plugin.sh");
    assert!(out.status.success(), "{}", text(&out));
    let so = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(so.ends_with("libblklab-insns.so"), "{so}");
    assert!(Path::new(&so).is_file());
    // A second call is a cache hit with the same path.
    let again = Command::new("sh")
        .arg(root().join("images/build-qemu-plugin.sh"))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&again.stdout).trim(), so);
    assert!(String::from_utf8_lossy(&again.stderr).contains("cached"));
    // A bad argument is refused by the plugin, and QEMU says so.
    let bad = Command::new("qemu-system-x86_64")
        .args([
            "-accel",
            "tcg",
            "-machine",
            "none",
            "-display",
            "none",
            "-nodefaults",
        ])
        .arg("-plugin")
        .arg(format!("{so},nonsense=1"))
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("unknown argument nonsense=1"),
        "{}",
        text(&bad)
    );
}

#[test]
fn symbolisation_against_a_known_system_map() {
    let map = SymbolMap::read(&fixture("System.map")).unwrap();
    let dump_a = Dump::read(&fixture("begin.insns")).unwrap();
    let dump_b = Dump::read(&fixture("end.insns")).unwrap();
    let w = dump_b.since(&dump_a);
    assert_eq!(w.level1.kernel(), 1_000_000 - 400_000);
    assert_eq!(w.level1.user(), 300_000 - 100_000);
    assert_eq!(w.level2.kernel() + w.level2.user(), 0);
    let p = plugin::profile(&w.level1, &map);
    // Two blocks inside blk_mq_flush_plug_list (one at its entry, one 0x10
    // into it) add up; a .constprop clone is folded into its base name; a
    // module address is outside the kernel's text.
    assert_eq!(p.functions["blk_mq_flush_plug_list"], 100 + 60);
    assert_eq!(p.functions["virtblk_add_req_batch"], 50);
    assert_eq!(p.functions["__intel_pmu_enable_all"], 30);
    assert_eq!(p.functions[symbol_groups::OUTSIDE], 7);
    assert_eq!(p.functions["schedule_idle"], 8);
    assert_eq!(p.idle_symbol.as_deref(), Some("schedule_idle"));
    assert_eq!(p.idle_entries, Some(4));
    let r = serde_json::to_value(plugin::record(
        &p,
        Some(10.0),
        Some(20.0),
        &Default::default(),
    ))
    .unwrap();
    assert_eq!(r["functions"]["blk_mq_flush_plug_list"], 16.0);
    assert_eq!(r["groups"]["block"], 16.0);
    assert_eq!(r["groups"]["other"], 3.0);
    assert_eq!(r["groups"]["virtio"], 5.0);
    assert_eq!(r["kernel_per_io"], 60_000.0);
    assert_eq!(r["idle_entries_per_io"], 0.4);
    assert_eq!(r["context_switches_per_io"], 2.0);
    // Entries: executions of the block at the function's address only (10
    // of blk_mq_flush_plug_list's entry block, not the 6 of the block 0x10
    // into it); a mechanism function not in this System.map is null.
    assert_eq!(r["entries"]["blk_mq_flush_plug_list"], 10);
    assert_eq!(r["entries_per_io"]["blk_mq_flush_plug_list"], 1.0);
    assert_eq!(r["entries"]["blk_mq_run_work_fn"], Value::Null);
    assert_eq!(r["entries_per_io"]["blk_mq_run_work_fn"], Value::Null);
    // Errors name the file and line.
    let e = Dump::parse("blklab-insns 3\ntb zz 1 1\nend\n", Path::new("x.insns"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("x.insns:2"), "{e}");
    let e = SymbolMap::parse("hello\n", Path::new("S.map"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("S.map:1"), "{e}");
}

/// The plug path of 6.12 (with the per-bio plug) against the direct issue
/// of 6.12-noplug, at qd1 under scheduler none.
const PLUG_FUNCTIONS: &[&str] = &[
    "blk_mq_flush_plug_list",
    "__blk_flush_plug",
    "blk_add_rq_to_plug",
    "virtio_queue_rqs",
    "virtblk_add_req_batch",
];
const NOPLUG_FUNCTIONS: &[&str] = &["virtio_queue_rq", "blk_mq_try_issue_directly"];

#[test]
fn differential_profile_ranks_the_plug_path() {
    let out = Command::new(common::blklab_bin())
        .args(["compare", "--format", "json", "--top", "12"])
        .arg(fixture("plug-qd1"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let profiles = report["profiles"].as_array().expect("profiles");
    // Real 6.12 profiles (TSC clocksource, SLUB): no artefact on top.
    for p in profiles {
        assert_eq!(
            p["warnings"].as_array().map(Vec::len),
            Some(0),
            "{}/{}: {}",
            p["scenario"],
            p["variant"],
            p["warnings"]
        );
    }
    let none = profiles
        .iter()
        .find(|p| p["variant"] == "none-10k")
        .expect("a none-10k profile");
    let top: Vec<&str> = none["functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    let entry = |f: &str| {
        none["functions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == f)
            .unwrap_or_else(|| panic!("{f} not in the top functions {top:?}"))
    };
    for f in PLUG_FUNCTIONS {
        let e = entry(f);
        assert!(e["diff"].as_f64().unwrap() < -1.0, "{f}: {e}");
    }
    for f in NOPLUG_FUNCTIONS {
        let e = entry(f);
        assert!(e["diff"].as_f64().unwrap() > 1.0, "{f}: {e}");
    }
    // The instruction metrics join the default ones.
    let metrics: Vec<&str> = report["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap())
        .collect();
    assert!(
        metrics.contains(&"kernel_instructions_per_io"),
        "{metrics:?}"
    );
    // The table and the HTML page carry it too.
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(common::blklab_bin())
        .arg("compare")
        .arg(fixture("plug-qd1"))
        .arg("--out")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let t = String::from_utf8_lossy(&out.stdout);
    assert!(t.contains("differential profile"), "{t}");
    assert!(t.contains("blk_mq_flush_plug_list"), "{t}");
    let svg = dir.path().join("plots/profile-plug-qd1_none-10k.svg");
    let s = std::fs::read_to_string(&svg).unwrap();
    assert!(
        s.contains("<svg") && s.contains("blk_mq_flush_plug_list"),
        "{s}"
    );
    let md = std::fs::read_to_string(dir.path().join("report.md")).unwrap();
    assert!(md.contains("| function | group |"), "{md}");
}

/// tools/insns-difference.py on the recorded plug/noplug run: per-IO counts
/// by differencing the 2k and 10k variants, recomputed here from the
/// records, and the functions ranked by their A/B difference.
#[test]
fn insns_difference_tool_differences_the_recorded_run() {
    common::tools::require(&["python3", "--version"], "apt-get install python3");
    let dir = fixture("plug-qd1");
    let out = Command::new("python3")
        .arg(root().join("tools/insns-difference.py"))
        .arg(&dir)
        .args(["--functions", "40"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let t = String::from_utf8_lossy(&out.stdout).into_owned();
    // Expected kernel instructions per IO for each kernel of none-2k/10k:
    // the mean over iterations of (k(10k) - k(2k)) / (IOs(10k) - IOs(2k)).
    let per_io = |kernel: &str| -> f64 {
        let v: Vec<f64> = (0..2)
            .map(|i| {
                let r =
                    |v: &str| read_json(&dir.join(format!("{kernel}.plug-qd1.{v}.{i:02}.json")));
                let (a, b) = (r("none-2k"), r("none-10k"));
                let k = |r: &Value| r["instructions"]["kernel"].as_f64().unwrap();
                let n = |r: &Value| r["checks"]["guest_block_ios"].as_f64().unwrap();
                (k(&b) - k(&a)) / (n(&b) - n(&a))
            })
            .collect();
        v.iter().sum::<f64>() / v.len() as f64
    };
    let section = t
        .split("== ")
        .find(|s| s.starts_with("plug-qd1/none-2k vs none-10k"))
        .unwrap_or_else(|| panic!("no none section:\n{t}"));
    for kernel in ["6.12", "6.12-noplug"] {
        let block = section
            .split(&format!("\n  {kernel}:\n"))
            .nth(1)
            .unwrap_or_else(|| panic!("no {kernel} block:\n{section}"));
        let line = block
            .lines()
            .find(|l| l.trim_start().starts_with("kernel insns/IO"))
            .unwrap();
        let want = format!("{:.1} ±", per_io(kernel));
        assert!(line.contains(&want), "{kernel}: want {want} in {line:?}");
    }
    // The ranked functions: noplug - plug, so the plug path is negative.
    let ranked = section
        .split("functions, 6.12-noplug - 6.12")
        .nth(1)
        .expect("a ranked function list");
    let diff = |f: &str| -> f64 {
        let l = ranked
            .lines()
            .find(|l| l.split_whitespace().next() == Some(f))
            .unwrap_or_else(|| panic!("{f} not ranked:\n{ranked}"));
        l.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    for f in PLUG_FUNCTIONS {
        assert!(diff(f) < -1.0, "{f}: {}", diff(f));
    }
    for f in NOPLUG_FUNCTIONS {
        assert!(diff(f) > 1.0, "{f}: {}", diff(f));
    }
    // No arguments: usage, exit 2.
    let out = Command::new("python3")
        .arg(root().join("tools/insns-difference.py"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}

/// `blklab run --count-insns` of `plug-qd1`'s none-2k variant on
/// `build:6.12` into `out_dir`, with `iterations` boots of `vcpus` vCPUs
/// and `extra` options.
fn run_plug_qd1(out_dir: &Path, iterations: u32, vcpus: u32, extra: &[&str]) -> Output {
    Command::new(common::blklab_bin())
        .arg("run")
        .arg("--cache")
        .arg(common::image_cache())
        .args([
            "--no-progress",
            "--kernel",
            "build:6.12",
            "--scenario",
            "plug-qd1",
        ])
        .args(["--variants", "none-2k", "--count-insns"])
        .args([
            "--iterations",
            &iterations.to_string(),
            "--vcpus",
            &vcpus.to_string(),
        ])
        .args(extra)
        .arg("--out")
        .arg(out_dir)
        .env("RUST_LOG", "info")
        .output()
        .expect("run blklab")
}

#[test]
fn guest_counts_are_nonzero_and_block_layer_counts_repeat() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("run");
    let out = run_plug_qd1(&out_dir, 2, 1, &["--deterministic"]);
    assert!(out.status.success(), "{}", text(&out));
    let run = read_json(&out_dir.join("run.json"));
    assert_eq!(run["accel"], "tcg");
    assert_eq!(run["deterministic"], true);
    let recs: Vec<Value> = (0..2)
        .map(|i| read_json(&out_dir.join(format!("6.12.plug-qd1.none-2k.{i:02}.json"))))
        .collect();
    for r in &recs {
        let cmd = r["qemu_command_line"].to_string();
        assert!(
            cmd.contains("shift=0") && cmd.contains("libblklab-insns.so"),
            "{cmd}"
        );
        let i = &r["instructions"];
        assert_eq!(r["checks"]["guest_block_ios"], 2000, "{}", r["checks"]);
        for k in ["kernel", "user", "total"] {
            assert!(i[k].as_u64().unwrap() > 0, "{k}: {i}");
        }
        assert!(i["kernel_per_io"].as_f64().unwrap() > 1000.0);
        assert!(i["groups"]["block"].as_f64().unwrap() > 100.0);
        assert!(i["idle_entries"].as_u64().is_some());
    }
    // Identical runs: every block-layer function executed the same number
    // of instructions, except the ones whose work depends on when a
    // completion arrives (listed, and few).
    let block = |r: &Value| -> Vec<(String, u64)> {
        r["instructions"]["function_insns"]
            .as_object()
            .unwrap()
            .iter()
            .filter(|(f, _)| group_of(f) == "block")
            .map(|(f, n)| (f.clone(), n.as_u64().unwrap()))
            .collect()
    };
    let (a, b) = (block(&recs[0]), block(&recs[1]));
    let names: std::collections::BTreeSet<&String> = a.iter().chain(&b).map(|(f, _)| f).collect();
    let get = |v: &[(String, u64)], f: &str| v.iter().find(|x| x.0 == f).map_or(0, |x| x.1);
    let differing: Vec<String> = names
        .iter()
        .filter(|f| get(&a, f) != get(&b, f))
        .map(|f| format!("{f}: {} vs {}", get(&a, f), get(&b, f)))
        .collect();
    // The plug path's block-layer functions run a fixed number of
    // instructions per IO. (virtio-blk's functions are not all exact: whether
    // a request kicks depends on whether the backend was still draining.)
    for f in [
        "blk_mq_flush_plug_list",
        "__blk_flush_plug",
        "blk_add_rq_to_plug",
        "__submit_bio",
        "blk_mq_submit_bio",
        "bio_alloc_bioset",
    ] {
        assert!(get(&a, f) > 0, "{f} did not run: {a:?}");
        assert_eq!(get(&a, f), get(&b, f), "{f}");
    }
    assert!(
        differing.len() * 10 <= names.len(),
        "more than a tenth of the {} block-layer functions differ between identical runs: {differing:?}",
        names.len()
    );
}

/// The would-be exits of a real window against what the other parts of
/// the lab counted in the same window.
#[test]
fn would_be_exits_agree_with_the_backend_and_the_guest() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("run");
    let out = run_plug_qd1(&out_dir, 1, 2, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let r = read_json(&out_dir.join("6.12.plug-qd1.none-2k.00.json"));
    let e = &r["instructions"]["exits"];
    assert_eq!(e["unavailable"], Value::Null, "{e}");
    let n = |v: &Value| v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"));
    // Kicks: each notify store is one write of the queue's kick eventfd
    // (QEMU's ioeventfd on the notify address, matched in software under
    // TCG), and the backend counts the eventfd's counter, not its wake-ups.
    // Nothing kicks outside fio's run: the guest touches no target disk
    // between its snapshots and the SYNCs, so both windows hold the same
    // kicks.
    let queues = r["backend"]["disks"][0]["queues"].as_array().unwrap();
    let stores = |q: usize| {
        e["notifies"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["disk"] == 0 && s["queue"] == q)
            .map_or(0, |s| n(&s["stores"]))
    };
    for (q, c) in queues.iter().enumerate() {
        let kicks = n(&c["counters"]["kicks"]);
        assert!(kicks > 0, "queue {q}: no kicks");
        assert_eq!(kicks, stores(q), "queue {q}: kicks vs notify stores: {e}");
    }
    assert_eq!(
        n(&e["notify"]),
        e["notifies"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| n(&s["stores"]))
            .sum::<u64>()
    );
    // The windows. The guest reads its counters right before each SYNC
    // line and forks nothing until the host's reply; the plugin dumps when
    // the host reads the line. So the plugin's window is the guest's less
    // what the guest counted between its begin snapshot and the begin dump,
    // plus the same at the end: at most what it counted from each snapshot
    // to its read after the reply (`sync_edges`). Interrupts the guest's
    // kernel takes on its own in those gaps (a timer tick, a kthread woken
    // on the other CPU, about ten such IPIs a second in an idle guest) are
    // all that separates the two counts.
    let g: GuestResult = serde_json::from_value(r["guest"].clone()).unwrap();
    let guest = &r["guest"]["interrupts"];
    let gi = g.interrupts.as_ref().unwrap();
    let edges = g.sync_edges.as_ref().expect("sync_edges");
    let (eb, ee) = (edges.begin.as_ref().unwrap(), edges.end.as_ref().unwrap());
    let arch = |k: &str| gi.arch.get(k).copied().unwrap_or(0) as u64;
    let stub = |s: &str| {
        e["interrupt_entries"]
            .get(s)
            .map_or(0, |v| v.as_u64().unwrap())
    };
    // plugin ∈ [guest − begin edge, guest + end edge], to the interrupt
    let within = |what: &str, plugin: u64, guest_n: u64, begin: i64, end: i64| {
        let (lo, hi) = (guest_n as i64 - begin, guest_n as i64 + end);
        assert!(
            (lo..=hi).contains(&(plugin as i64)),
            "{what}: plugin {plugin}, guest {guest_n}, edges {begin}/{end}\n{e}\n{guest}"
        );
    };
    let edge_of =
        |x: &blklab::record::guest::SyncEdge, k: &str| x.arch.get(k).copied().unwrap_or(0);
    within(
        "timer interrupts",
        stub("asm_sysvec_apic_timer_interrupt"),
        arch("LOC"),
        edge_of(eb, "LOC"),
        edge_of(ee, "LOC"),
    );
    assert!(stub("asm_sysvec_apic_timer_interrupt") > 0);
    // IPIs, to the IPI. Every ICR write under xAPIC (qemu64) sends one IPI
    // to one CPU (2 vCPUs: a shorthand reaches the other CPU, or itself),
    // received as one of RES, CAL or IWI (`Interrupts::ipis`). TLB is not
    // one more: it counts the remote TLB flushes a CPU ran, inside CAL
    // IPIs. The plugin marks its exit counts each time the guest's kernel
    // enters arch_show_interrupts, which formats those lines: between the
    // marks of the guest's two snapshots (between them: the read after
    // the begin reply, mpstat's as it starts) the ICR writes are the IPIs
    // the guest counted in its own window, but for one in flight at each
    // mark: written by one vCPU just before a mark and counted by the
    // other just after it (seen on the 2-core VM under load). With
    // 2 vCPUs there is at most one such IPI per edge.
    let guest_ipis = gi.ipis() as u64;
    assert!(guest_ipis > 0, "{guest}");
    let gw = &e["guest_window"];
    assert!(n(&gw["marks"]) >= 2, "{gw}");
    let sent = n(&gw["ipi"]);
    assert!(
        sent.abs_diff(guest_ipis) <= 1,
        "ICR writes between the guest's reads {sent} vs its RES + CAL + IWI {guest_ipis} (TLB {}): {gw}\n{guest}",
        arch("TLB")
    );
    // Between the host's dumps (the record's other counts), the plugin's
    // IPIs sent and received differ from the guest's by what the guest's
    // kernel did in the gaps between its reads and the dumps: at most the
    // edges.
    let received = stub("asm_sysvec_call_function")
        + stub("asm_sysvec_call_function_single")
        + stub("asm_sysvec_reschedule_ipi")
        + stub("asm_sysvec_irq_work");
    within("ICR writes", n(&e["ipi"]), guest_ipis, eb.ipis(), ee.ipis());
    within("IPIs received", received, guest_ipis, eb.ipis(), ee.ipis());
    within(
        "reschedule IPIs",
        stub("asm_sysvec_reschedule_ipi"),
        arch("RES"),
        edge_of(eb, "RES"),
        edge_of(ee, "RES"),
    );
    within(
        "function-call IPIs",
        stub("asm_sysvec_call_function") + stub("asm_sysvec_call_function_single"),
        arch("CAL"),
        edge_of(eb, "CAL"),
        edge_of(ee, "CAL"),
    );
    // Within the plugin's own window every ICR write is an IPI received,
    // but for one in flight per vCPU at each dump.
    assert!(
        n(&e["ipi"]).abs_diff(received) <= 4,
        "{} ICR writes, {received} IPIs received",
        e["ipi"]
    );
    // The disk's interrupts (its MSI-X vectors, all in fio's run: no IO in
    // the gaps) are device interrupts, which all enter asm_common_interrupt
    // (with the console's serial interrupts).
    let virtio: u64 = guest["lines"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["name"].as_str().unwrap().contains("-req."))
        .map(|l| l["count"].as_i64().unwrap() as u64)
        .sum();
    assert!(virtio > 0);
    assert!(stub("asm_common_interrupt") >= virtio, "{e}\n{guest}");
    // Per vector: each vector's stub in irq_entries_start jumps to
    // asm_common_interrupt, so they add up to its entries (within one
    // interrupt per vCPU between the two at a dump). plug-qd1 has one
    // queue: its MSI-X vector's interrupts are the guest's req.0 line,
    // exactly (no IO outside fio's run).
    let vectors = e["device_vectors"].as_object().unwrap();
    let by_vector: u64 = vectors.values().map(n).sum();
    assert!(by_vector.abs_diff(stub("asm_common_interrupt")) <= 2, "{e}");
    assert_eq!(queues.len(), 1);
    assert!(
        vectors.values().any(|v| n(v) == virtio),
        "no vector with the queue's {virtio} interrupts: {vectors:?}"
    );
    // Each interrupt of a queue needs a notification of the backend (its
    // call eventfd, read by QEMU, which injects the MSI-X message); writes
    // QEMU has not read yet coalesce, and with EVENT_IDX the backend only
    // notifies when the driver's used_event asks: interrupts <= notifications.
    let notifications: u64 = queues
        .iter()
        .map(|c| n(&c["counters"]["notifications"]))
        .sum();
    assert!(
        virtio <= notifications,
        "{virtio} interrupts, {notifications} notifications"
    );
    // xAPIC: every interrupt taken ends with one EOI store (spurious
    // vectors aside), give or take one in progress per vCPU at each edge.
    assert!(n(&e["eoi"]).abs_diff(n(&e["interrupts"])) <= 4, "{e}");
    // The idle vCPUs halt; xAPIC only: no x2APIC MSR writes.
    assert!(n(&e["hlt"]) > 0);
    assert!(
        e["msrs"]
            .as_object()
            .unwrap()
            .keys()
            .all(|m| !m.starts_with("0x8")),
        "{e}"
    );
    assert_eq!(
        n(&e["total"]),
        e["per_vcpu"].as_array().unwrap().iter().map(n).sum::<u64>() + n(&e["interrupts"])
    );
}

/// The plugin's instruction decoders (images/qemu-plugin/blklab-decode.h)
/// on known encodings: images/qemu-plugin/decode-test.c, built with the
/// compiler the plugin is built with.
#[test]
fn plugin_decoders_recognise_the_exiting_instructions() {
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("decode-test");
    let src = root().join("images/qemu-plugin/decode-test.c");
    let cc = Command::new("gcc")
        .args(["-Wall", "-Wextra", "-Werror", "-std=gnu11", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("run gcc (the plugin's build needs it too)");
    assert!(cc.status.success(), "{}", text(&cc));
    let out = Command::new(&exe).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let t = String::from_utf8_lossy(&out.stdout);
    assert!(t.trim_end().ends_with("32 passed, 0 failed"), "{t}");
}
