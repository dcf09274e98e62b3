//! `blklab run --accel nested` end to end: the emulated host (Debian's
//! 6.12 with kvm_amd, booted under TCG with SVM) runs the lab inside it,
//! the guests under real KVM — the lab's KVM branch for real: the KVM
//! probe, `-accel kvm`, KVM's statistics over QMP — and the outer plugin
//! counts the guest's and the host's instructions apart.
//!
//! An A/A run: two boots of `smoke` on the same kernel, counting
//! instructions; and a run on a user's host's code paths (memfd RAM,
//! `--accel kvm` forced inside, /sys/kernel/tracing, kvm-clock) beside a
//! second VM. Images come from the image cache (built on first use, like
//! the other lab tests).

mod common;

use std::process::Command;
use std::sync::Mutex;

use common::read_json;
use serde_json::Value;

/// One emulated host at a time: each is a whole TCG machine.
static HOST: Mutex<()> = Mutex::new(());

fn num(v: &Value, path: &[&str]) -> f64 {
    let mut x = v;
    for p in path {
        x = &x[*p];
    }
    x.as_f64()
        .unwrap_or_else(|| panic!("{} is not a number in {v:#}", path.join(".")))
}

/// The records of the run directory `dir` (its JSON documents but run.json
/// and summary.json).
fn records_in(dir: &std::path::Path) -> Vec<Value> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.extension().is_some_and(|x| x == "json")
                && !matches!(
                    p.file_name().and_then(|n| n.to_str()),
                    Some("run.json" | "summary.json")
                )
        })
        .map(|p| read_json(&p))
        .collect()
}

#[test]
fn a_nested_aa_run_counts_kvm_exits_and_the_hosts_instructions() {
    let _one = HOST.lock().unwrap_or_else(|p| p.into_inner());
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("run");
    let res = Command::new(common::blklab_bin())
        .args(["run", "--cache"])
        .arg(common::image_cache())
        .args(["--no-progress", "--accel", "nested"])
        .args(["--kernel", "build:6.12", "--kernel", "build:6.12"])
        .args(["--scenario", "smoke", "--iterations", "1", "--out"])
        .arg(&dir)
        // The first host's boot is paused from outside before its /init
        // speaks; the second stops every process in it after the first
        // boot; the third puts a soft-lockup report on its console after
        // the second boot. The outer lab must see each fall silent or
        // stall, keep its state, and go on with a fresh host while boots
        // are left: the whole plan on the second, the second boot on the
        // third, none on a fourth.
        .args(["--host-silence", "40s"])
        .env("BLKLAB_NESTED_STALL_BOOT", "1")
        .env("BLKLAB_NESTED_SILENCE_AFTER_BOOT", "0")
        .env("BLKLAB_NESTED_STALL_REPORT_AFTER_BOOT", "1")
        .env("RUST_LOG", "info")
        .output()
        .expect("run blklab");
    let stderr = String::from_utf8_lossy(&res.stderr);
    assert!(
        res.status.success(),
        "blklab run --accel nested failed:\n{stderr}"
    );
    the_silent_host_was_replaced(&dir);
    the_stall_report_gave_its_host_up(&dir, &stderr);

    let run = read_json(&dir.join("run.json"));
    assert_eq!(run["accel"], "nested", "{run:#}");
    assert_eq!(
        run["nested_host"]["vcpus"], 3,
        "smoke's 2 vCPUs and one for the host"
    );
    assert!(run["count_insns"].is_object(), "{run:#}");
    // The inner lab's own log: the real KVM probe chose KVM inside.
    let log = last_hosts_inner_log(&dir);
    assert!(log.contains("KVM probe booted the guest"), "{log}");
    // The host's clock devices, for a silent host's diagnosis.
    assert!(
        log.starts_with("host clocks: clocksource=") && log.contains(" clockevent0="),
        "{log}"
    );
    assert_eq!(run["nested_host"]["tcg_threads"], "multi", "{run:#}");

    let records = records_in(&dir);
    assert_eq!(records.len(), 4, "2 kernels x 2 variants");
    for r in &records {
        let name = format!("{} {}", r["kernel"], r["variant"]);
        assert_eq!(r["accel"], "nested", "{name}");
        assert_eq!(r["ok"], true, "{name}");
        assert_eq!(r["checks"]["fio_equals_backend"], true, "{name}");
        let cl = &r["qemu_command_line"];
        assert_eq!(
            (&cl[1], &cl[2]),
            (&"-accel".into(), &"kvm".into()),
            "{name}"
        );

        // KVM's counters, per vCPU and summed, over the window.
        let kvm = &r["kvm"];
        assert_eq!(kvm["per_vcpu"].as_array().unwrap().len(), 2, "{name}");
        let kvm_exits = num(kvm, &["counters", "exits"]);
        assert!(num(kvm, &["per_io", "exits"]) > 0.5, "{name}: {kvm:#}");
        assert!(num(kvm, &["counters", "halt_exits"]) > 0.0, "{name}");
        assert!(num(kvm, &["counters", "irq_injections"]) > 0.0, "{name}");
        // KVM's exits by reason: the host's kvm:kvm_exit tracepoint for
        // this QEMU's vCPU threads, read right after query-stats at the
        // begin and right before it at the end. The tracepoint fires once
        // per exit, as `exits` counts them, so the traced window lies
        // within the counters': never more, and short only by the exits
        // between the two reads at either end.
        let reasons = kvm["exit_reasons"]
            .as_object()
            .unwrap_or_else(|| panic!("{name}: no exit_reasons in {kvm:#}"));
        let reason = |r: &str| reasons.get(r).and_then(Value::as_f64).unwrap_or(0.0);
        let traced: f64 = reasons.values().filter_map(Value::as_f64).sum();
        let halt_exits = num(kvm, &["counters", "halt_exits"]);
        let io_exits = num(kvm, &["counters", "io_exits"]);
        eprintln!(
            "[nested] {name}: exits {kvm_exits} traced {traced}; hlt {} halt_exits {halt_exits}; io {} io_exits {io_exits}; {reasons:?}",
            reason("hlt"),
            reason("io")
        );
        let within =
            |traced: f64, counted: f64| traced <= counted && traced >= 0.9 * counted - 20.0;
        assert!(
            within(traced, kvm_exits),
            "{name}: traced {traced}, KVM's exits {kvm_exits}"
        );
        assert!(
            within(reason("hlt"), halt_exits),
            "{name}: {reasons:?} vs halt_exits {halt_exits}"
        );
        assert!(
            within(reason("io"), io_exits),
            "{name}: {reasons:?} vs io_exits {io_exits}"
        );
        assert!(
            reason("npf") > 0.0,
            "{name}: no nested page faults (virtio notifies): {reasons:?}"
        );
        let per_vcpu: f64 = kvm["per_vcpu"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|v| v["exit_reasons"].as_object().unwrap().values())
            .filter_map(Value::as_f64)
            .sum();
        assert_eq!(per_vcpu, traced, "{name}: per vCPU vs summed");

        // The same window seen by the plugin at level 2 (the guest under
        // KVM): the instructions that must exit to KVM on SVM — HLT, port
        // I/O, CPUID — as KVM's exits for those reasons. The inner lab
        // samples KVM just outside the relayed SYNCs, so KVM's window holds
        // the plugin's: never fewer there, and only a few more. (MSR exits
        // include RDMSRs the plugin does not count, NPFs include real
        // nested page faults, interrupts and interrupt windows are the
        // host's: those are not compared.)
        let w = &r["instructions"]["exits"];
        for (plugin, kvm_reason) in [("hlt", "hlt"), ("port_io", "io"), ("cpuid", "cpuid")] {
            let seen = num(w, &[plugin]);
            let exits = reason(kvm_reason);
            eprintln!("[nested] {name}: level-2 {plugin} {seen}, KVM {kvm_reason} exits {exits}");
            assert!(
                seen <= exits && seen >= 0.8 * exits - 20.0,
                "{name}: the plugin's level-2 {plugin} {seen} against KVM's {kvm_reason} exits {exits}"
            );
        }

        // The guest's instructions: level 2 only, against its System.map.
        let g = &r["instructions"];
        assert!(
            num(g, &["kernel"]) > 0.0 && num(g, &["user"]) > 0.0,
            "{name}"
        );
        assert!(
            num(g, &["functions", "blk_mq_submit_bio"]) > 0.0,
            "{name}: {g:#}"
        );

        // The host's: level 1, its kernel against its kallsyms (KVM's
        // modules by name), every exit seen as a world switch.
        let h = &r["host_instructions"];
        assert!(
            num(h, &["kernel"]) > 0.0 && num(h, &["user"]) > 0.0,
            "{name}"
        );
        assert_eq!(num(h, &["mixed_blocks"]), 0.0, "{name}");
        // Levels by address (the guest's RAM on the host's node 1), and the
        // VMRUN tracking agreeing with them block for block.
        assert_eq!(h["levels"], "address", "{name}");
        assert_eq!(num(h, &["level_disagreements"]), 0.0, "{name}");
        let fns = h["functions"].as_object().unwrap();
        for f in ["svm_vcpu_run [kvm_amd]", "kvm_arch_vcpu_ioctl_run [kvm]"] {
            assert!(
                fns.contains_key(f),
                "{name}: no {f} among the host's functions"
            );
        }
        assert!(
            !fns.contains_key("blk_mq_submit_bio"),
            "{name}: the guest's block layer counted as the host's"
        );
        let switches = num(h, &["world_switches"]);
        let returns = num(h, &["exits"]);
        assert!(
            (switches - returns).abs() <= 2.0,
            "{name}: {switches} vs {returns}"
        );
        // KVM's window holds the plugin's (the inner lab samples KVM just
        // outside the relayed SYNCs), so it sees every exit the plugin
        // saw, and a few more around the edges.
        assert!(
            kvm_exits + 2.0 >= returns,
            "{name}: KVM {kvm_exits}, plugin {returns}"
        );
        assert!(
            kvm_exits <= returns * 1.2 + 100.0,
            "{name}: KVM {kvm_exits}, plugin {returns}"
        );
        the_hosts_instructions_are_split_by_thread(&name, r);
    }

    // The report: KVM's exits and the host's instructions with CIs, and
    // the host's side of the differential profile.
    let cmp = Command::new(common::blklab_bin())
        .arg("compare")
        .arg(&dir)
        .output()
        .expect("run blklab compare");
    let text = String::from_utf8_lossy(&cmp.stdout);
    assert!(
        cmp.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&cmp.stderr)
    );
    for want in [
        "host instructions per IO (nested)",
        "KVM exits per IO",
        "/proc/kallsyms",
    ] {
        assert!(text.contains(want), "no {want:?} in:\n{text}");
    }
}

/// The host's instructions by the thread that ran them (the plugin
/// following the host's task switches, naming tasks by the offsets from the
/// host's BTF): every part adds up to the host's total, the lab's VM's
/// vCPU threads (QEMU's pid in the record, its `CPU N/KVM` names) carry
/// KVM's exit handling, and the lab's process its serving threads.
fn the_hosts_instructions_are_split_by_thread(name: &str, r: &Value) {
    let h = &r["host_instructions"];
    let split = &h["split"];
    let total = num(h, &["total"]);
    let parts = num(split, &["total"]);
    eprintln!("[nested] {name}: host split {}", split["insns"]);
    // The same instructions, but for what ran while the plugin wrote a
    // dump (the machine runs on meanwhile).
    assert!(
        (parts - total).abs() <= 0.002 * total,
        "{name}: parts {parts}, host total {total}: {split:#}"
    );
    let part = |k: &str| num(split, &["insns", k]);
    for k in ["kvm_exits", "vmm_vcpu_user", "vmm_other", "backend", "lab"] {
        assert!(part(k) > 0.0, "{name}: nothing in {k}: {split:#}");
    }
    assert!(part("unattributed") <= 0.01 * total, "{name}: {split:#}");
    assert_eq!(split["vmm_pid"], r["host"]["qemu"]["pid"], "{name}");
    let threads = split["threads"].as_array().unwrap();
    let vcpu = threads
        .iter()
        .find(|t| t["name"] == "CPU 0/KVM")
        .unwrap_or_else(|| panic!("{name}: no vCPU thread named: {split:#}"));
    assert_eq!(vcpu["tgid"], split["vmm_pid"], "{name}: {vcpu:#}");
    assert_eq!(vcpu["part"], "vcpu", "{name}");
    assert!(
        threads
            .iter()
            .any(|t| t["name"] == "vring_worker" && t["part"] == "backend"),
        "{name}: {split:#}"
    );
}

/// The inner lab's log of the run's last host: kept as its attempt's when
/// that host was given up after the plan's last boot, as the planted
/// stall report makes it.
fn last_hosts_inner_log(dir: &std::path::Path) -> String {
    let log = dir.join("console/nested-host.blklab.log");
    if log.exists() {
        return std::fs::read_to_string(log).unwrap();
    }
    let summary = read_json(&dir.join("summary.json"));
    let last = summary["retried_hosts"].as_array().unwrap().last().unwrap();
    let attempt = last["attempt"].as_u64().unwrap();
    std::fs::read_to_string(dir.join(format!("console/nested-host.attempt{attempt}.blklab.log")))
        .unwrap()
}

/// The first host stalled in its boot and the second fell silent after
/// the first boot: each caught from outside within the limit, its state
/// kept (QMP's view, its console after an NMI), the first boot's records
/// kept from the second host's checkpoint, the second boot run on a third.
fn the_silent_host_was_replaced(dir: &std::path::Path) {
    let summary = read_json(&dir.join("summary.json"));
    let hosts = summary["retried_hosts"].as_array().expect("retried_hosts");
    // The paused boot first; a host may also fall silent or fault on its
    // own (the run then goes on with another, and the planted fault it had
    // not reached with it), which the records below cover.
    assert!(hosts.len() >= 3, "{summary:#}");
    the_stalled_boot_was_replaced(&hosts[0]);
    let h = hosts
        .iter()
        .find(|h| {
            h["boots_kept"] == serde_json::json!([0])
                && h.get("watchdog").is_none()
                && h.get("fault").is_none()
        })
        .unwrap_or_else(|| panic!("no host silenced after boot 0: {summary:#}"));
    let attempt = h["attempt"].as_u64().unwrap();
    assert_eq!(h["busy"], false, "idle, not stuck: {h:#}");
    let quiet = num(h, &["quiet_seconds"]);
    assert!((40.0..55.0).contains(&quiet), "{h:#}");
    assert!(num(h, &["vcpu_seconds"]) < 0.05 * quiet, "{h:#}");
    let state = std::fs::read_to_string(h["state"].as_str().unwrap()).unwrap();
    for want in [
        "query-cpus-fast",
        "CPU#2 RIP",
        "dumping local APIC state for CPU 2",
        "CPU 2/TCG tid",
        "== QEMU's threads' stacks",
    ] {
        assert!(
            state.contains(want),
            "no {want:?} in the kept state:\n{state}"
        );
    }
    // gdb (installed by CI) walked QEMU's threads, and read each vCPU as
    // QEMU holds it or said why not: Debian's QEMU has no debug
    // information.
    assert!(state.contains("CPU 0/TCG\"):"), "no stacks:\n{state}");
    assert!(
        state.contains("= vCPU 0: halted") || state.contains("its vCPUs' flags were not read"),
        "{state}"
    );
    // Every process stopped, the host's CPUs idle: each vCPU halted in the
    // kernel's idle loop, and the NMI answered with a panic from there.
    assert!(state.contains("default_idle"), "{state}");
    assert!(state.contains("NMI received for unknown reason"), "{state}");
    assert!(std::path::Path::new(h["console"].as_str().unwrap()).is_file());
    let kept_log = dir.join(format!("console/nested-host.attempt{attempt}.blklab.log"));
    let log = std::fs::read_to_string(&kept_log).unwrap();
    assert!(log.contains("silencing the host on purpose"), "{log}");
    let mut boots: Vec<u64> = records_in(dir)
        .iter()
        .map(|r| r["boot_seq"].as_u64().unwrap())
        .collect();
    boots.sort();
    assert_eq!(boots, [0, 0, 1, 1], "each boot's records once");
}

/// The host that put a (planted) soft-lockup report on its console after
/// finishing the plan's last boot: given up at that line, the line kept,
/// its boot kept from its checkpoint, and no fresh host booted for nothing.
fn the_stall_report_gave_its_host_up(dir: &std::path::Path, stderr: &str) {
    let summary = read_json(&dir.join("summary.json"));
    let hosts = summary["retried_hosts"].as_array().expect("retried_hosts");
    let h = hosts
        .iter()
        .find(|h| h.get("watchdog").is_some())
        .unwrap_or_else(|| panic!("no host given up on a stall report: {summary:#}"));
    let report = h["watchdog"].as_str().unwrap();
    assert!(
        report.starts_with("watchdog: BUG: soft lockup - CPU#0 stuck for 22s!")
            && report.contains("(planted"),
        "{h:#}"
    );
    assert_eq!(h["boots_kept"], serde_json::json!([1]), "{h:#}");
    let quiet = num(h, &["quiet_seconds"]);
    assert!(quiet < 40.0, "given up at the line, not on silence: {h:#}");
    assert!(std::path::Path::new(h["state"].as_str().unwrap()).is_file());
    assert!(
        stderr.contains("had finished every boot of the plan"),
        "{stderr}"
    );
    if hosts.len() == 3 {
        // Only the planted faults: the third host was the last.
        assert!(
            !stderr.contains("booting a fresh nested host (4 of"),
            "{stderr}"
        );
    }
}

/// The first host, paused before its /init spoke: given up on its idle
/// vCPUs alone (a booting kernel says nothing on the console), with
/// nothing to keep but its state.
fn the_stalled_boot_was_replaced(h: &Value) {
    assert_eq!(h["attempt"], 1, "{h:#}");
    assert_eq!(h["busy"], false, "idle, not stuck: {h:#}");
    assert_eq!(h["boots_kept"], serde_json::json!([]), "{h:#}");
    let waiting = h["waiting_for"].as_str().unwrap();
    assert!(waiting.contains("BLKLAB-HOST-INIT"), "{h:#}");
    let quiet = num(h, &["quiet_seconds"]);
    assert!((40.0..55.0).contains(&quiet), "{h:#}");
    let state = std::fs::read_to_string(h["state"].as_str().unwrap()).unwrap();
    // Paused in the firmware or the kernel's early boot: RIP or EIP.
    assert!(
        state.contains("CPU#2 RIP") || state.contains("CPU#2 EIP"),
        "{state}"
    );
    for want in [
        "\"status\": \"paused\"",
        "dumping local APIC state for CPU 2",
        "CPU 2/TCG tid",
    ] {
        assert!(
            state.contains(want),
            "no {want:?} in the kept state:\n{state}"
        );
    }
}

/// What a user's KVM host runs, inside the emulated host: no instruction
/// counting, so the guests' RAM is memfd (no huge pages), `--accel kvm`
/// forced inside (no probe), tracefs at /sys/kernel/tracing, the guest on
/// kvm-clock; and a second VM rebooting beside the lab's the whole time,
/// whose exits must not reach the lab's counts.
#[test]
fn a_user_hosts_paths_beside_a_neighbour_vm_count_the_labs_own_exits() {
    let _one = HOST.lock().unwrap_or_else(|p| p.into_inner());
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("run");
    let res = Command::new(common::blklab_bin())
        .args(["run", "--cache"])
        .arg(common::image_cache())
        .args(["--no-progress", "--accel", "nested", "--count-insns", "off"])
        .args(["--inner-accel", "kvm", "--nested-neighbour"])
        .args(["--kernel", "build:6.12", "--scenario", "smoke"])
        .args(["--iterations", "1", "--out"])
        .arg(&dir)
        .env("RUST_LOG", "info")
        .output()
        .expect("run blklab");
    let stderr = String::from_utf8_lossy(&res.stderr);
    assert!(res.status.success(), "blklab run failed:\n{stderr}");

    let run = read_json(&dir.join("run.json"));
    let host = &run["nested_host"];
    assert_eq!(host["guest_ram"], "memfd", "{host:#}");
    assert_eq!(host["inner_accel"], "kvm", "{host:#}");
    assert_eq!(host["neighbour"], true, "{host:#}");
    assert!(host["huge_pages"].is_null(), "{host:#}");
    let log = std::fs::read_to_string(dir.join("console/nested-host.blklab.log")).unwrap();
    assert!(log.contains("forced with --accel kvm"), "{log}");
    assert!(!log.contains("KVM probe booted"), "{log}");

    let neighbour = read_json(&dir.join("console/nested-host.neighbour.json"));
    let neighbour_exits = num(&neighbour, &["kvm", "counters", "exits"]);
    eprintln!("[nested] the neighbour's KVM exits over the inner run: {neighbour_exits}");
    assert!(neighbour_exits > 1000.0, "{neighbour:#}");

    let records = records_in(&dir);
    assert_eq!(records.len(), 2, "1 kernel x 2 variants");
    for r in &records {
        let name = r["variant"].to_string();
        assert_eq!(r["ok"], true, "{name}");
        let cl: Vec<&str> = r["qemu_command_line"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        let line = cl.join(" ");
        assert!(line.contains("-accel kvm"), "{name}: {line}");
        assert!(line.contains("memory-backend-memfd"), "{name}: {line}");
        assert!(!line.contains("hugetlb"), "{name}: {line}");
        assert!(!line.contains("clocksource="), "{name}: {line}");
        assert_eq!(r["guest"]["clocksource"], "kvm-clock", "{name}");

        // Counted through /sys/kernel/tracing, filtered to this QEMU's two
        // vCPU threads; within KVM's own per-VM count of the same window,
        // which the neighbour's exits would have overrun.
        let kvm = &r["kvm"];
        let trace = kvm["exit_reasons_trace"].as_str().unwrap_or_default();
        assert!(
            trace.starts_with("/sys/kernel/tracing/instances/blklab-"),
            "{name}: {kvm:#}"
        );
        assert_eq!(
            trace.matches("common_pid == ").count(),
            2,
            "{name}: {trace}"
        );
        assert!(kvm["exit_reasons_dropped"].is_null(), "{name}: {kvm:#}");
        let traced: f64 = kvm["exit_reasons"]
            .as_object()
            .unwrap_or_else(|| panic!("{name}: no exit_reasons in {kvm:#}"))
            .values()
            .filter_map(Value::as_f64)
            .sum();
        let exits = num(kvm, &["counters", "exits"]);
        eprintln!("[nested] {name}: the lab's exits {exits}, traced {traced}");
        assert!(
            traced <= exits && traced >= 0.9 * exits - 20.0,
            "{name}: traced {traced}, KVM's exits {exits}"
        );
    }
}
