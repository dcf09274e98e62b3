//! The comparability contract: every condition that changes a measured
//! number, read from each record (with its run.json for records older than
//! the fields that carry them), and the one place that decides whether the
//! records a report pools and compares were measured under the same
//! conditions.
//!
//! Each condition has a scope: a run-wide one must hold one value in every
//! record a report reads; a kernel's (its build) one value within a side;
//! a variant's (its definition, device, machine, command line) one value
//! per row on each side and the same on both sides of a row, while the two
//! variants of a `--pair` differ in it by design. A difference is a
//! refusal naming the condition and both values unless forced. A record
//! that does not say a condition's value differs from one that does,
//! except in the vCPUs at once, which records older than the field lack.
//! The merge of a run's shards checks the same list.
//!
//! - this module: the conditions, their scopes and their values;
//! - [`check`]: which records each kind of report pools and compares, and
//!   every difference of a condition among them;
//! - [`setup`]: what differs between the sides' setups besides the
//!   conditions (the QEMU command lines, the host): shown, never blocking;
//! - [`refusal`]: the row sets both sides have, the refusal over a
//!   blocking difference, and what a forced comparison went past.

pub(crate) mod check;
pub(crate) mod refusal;
pub(crate) mod setup;

use serde::Serialize;
use serde_json::Value;

use crate::record::parallelism::Parallelism;
use crate::record::result::ResultRecord;
use crate::record::run::{Accel, RunConditions, RunDocument};
use crate::record::scenario::Variant;

/// A condition that changes the measured numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Condition {
    /// TCG, KVM or KVM nested in TCG.
    Accelerator,
    /// Why that accelerator (forced, or what the probe found).
    AcceleratorReason,
    /// `--deterministic`: guest time is instructions, not wall time.
    Deterministic,
    /// The instruction-count plugin costs the vCPUs time.
    InstructionCounting,
    Vcpus,
    /// How many vCPUs could run at once (the fewer of the vCPUs and the
    /// host's usable cores, one under single-threaded TCG): contention
    /// between vCPUs shows only when they run in parallel. Unknown (a
    /// record older than the field) is no difference.
    VcpusAtOnce,
    Memory,
    /// The guest kernel's command line, each boot's own paths left out.
    KernelCommandLine,
    QemuVersion,
    QemuBinary,
    /// The variant's definition: fio's arguments, target, scheduler, …
    ScenarioDefinition,
    /// The served disks: storage, size, tags, latency, polling, faults, …
    DeviceModel,
    /// The initramfs's tools (fio, mpstat, busybox, dmsetup).
    GuestImage,
    /// The build of the kernel under test.
    KernelBuild,
    /// blklab's version and commit (blocking where a backend metric is
    /// shown: the backend is blklab's code).
    BlklabVersion,
}

/// Where a condition may differ by design.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope {
    /// Nowhere in a report.
    Run,
    /// Between the sides of a kernel comparison (it is what is compared).
    Kernel,
    /// Between the two variants of a pair.
    Variant,
}

impl Condition {
    /// Every condition, in the order reports list them.
    pub(crate) const ALL: [Condition; 15] = [
        Condition::Accelerator,
        Condition::AcceleratorReason,
        Condition::Deterministic,
        Condition::InstructionCounting,
        Condition::Vcpus,
        Condition::VcpusAtOnce,
        Condition::Memory,
        Condition::KernelCommandLine,
        Condition::QemuVersion,
        Condition::QemuBinary,
        Condition::ScenarioDefinition,
        Condition::DeviceModel,
        Condition::GuestImage,
        Condition::KernelBuild,
        Condition::BlklabVersion,
    ];

    /// How reports and refusals name it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Condition::Accelerator => "accelerator",
            Condition::AcceleratorReason => "accelerator reason",
            Condition::Deterministic => "--deterministic",
            Condition::InstructionCounting => "instruction counting",
            Condition::Vcpus => "vCPUs",
            Condition::VcpusAtOnce => "vCPUs at once",
            Condition::Memory => "guest memory",
            Condition::KernelCommandLine => "kernel command line",
            Condition::QemuVersion => "QEMU version",
            Condition::QemuBinary => "QEMU binary",
            Condition::ScenarioDefinition => "scenario definition",
            Condition::DeviceModel => "backend configuration",
            Condition::GuestImage => "guest image",
            Condition::KernelBuild => "kernel build",
            Condition::BlklabVersion => "blklab version",
        }
    }

    pub(crate) fn scope(self) -> Scope {
        match self {
            Condition::Vcpus
            | Condition::VcpusAtOnce
            | Condition::Memory
            | Condition::KernelCommandLine
            | Condition::ScenarioDefinition
            | Condition::DeviceModel => Scope::Variant,
            Condition::KernelBuild => Scope::Kernel,
            _ => Scope::Run,
        }
    }

    /// The condition's value for a record of `run` (`None`: the record
    /// does not say, e.g. a trimmed or older record).
    pub(crate) fn value(self, run: &RunDocument, r: &ResultRecord) -> Option<String> {
        let fallback;
        let rc = match &r.run_conditions {
            Some(rc) => rc,
            None => {
                fallback = run.conditions();
                &fallback
            }
        };
        if let Some(v) = self.run_wide(r.accel, rc) {
            return v;
        }
        match self {
            Condition::Vcpus => vcpus(r).map(|n| n.to_string()),
            Condition::VcpusAtOnce => parallelism(run, r)
                .and_then(|p| p.vcpus_at_once)
                .map(|n| n.to_string()),
            Condition::Memory => qemu_option(r, "-m")
                .map(str::to_string)
                .or_else(|| r.machine.as_ref().map(|m| m.memory.clone())),
            Condition::KernelCommandLine => qemu_option(r, "-append").map(boot_dirs_named),
            Condition::QemuBinary => r
                .qemu_command_line
                .first()
                .cloned()
                .or_else(|| Some(run.qemu.path.clone()))
                .map(|p| bundle_named(&p)),
            Condition::ScenarioDefinition => r.scenario_definition.as_ref().map(definition_text),
            Condition::DeviceModel => Some(device_identity(r).to_string()),
            Condition::GuestImage => r.manifests.initramfs.as_ref().and_then(guest_tools),
            Condition::KernelBuild => r.manifests.kernel.as_ref().map(kernel_build),
            _ => None,
        }
    }

    /// A condition's value from the accelerator and the run's conditions,
    /// which a record and its run.json both state; `None` for the
    /// conditions only a record states.
    fn run_wide(self, accel: Accel, rc: &RunConditions) -> Option<Option<String>> {
        let on_off = |b: bool| if b { "on" } else { "off" }.to_string();
        Some(match self {
            Condition::Accelerator => Some(accel.describe().to_string()),
            Condition::AcceleratorReason => Some(rc.accel_reason.clone()),
            Condition::Deterministic => Some(on_off(rc.deterministic)),
            Condition::InstructionCounting => Some(on_off(rc.count_insns)),
            Condition::QemuVersion => rc.qemu_version.clone(),
            Condition::BlklabVersion => Some(format!("{} ({})", rc.blklab_version, rc.git_commit)),
            _ => return None,
        })
    }

    /// Whether a record that does not say (`None`) differs from one that
    /// does: not for the vCPUs at once, which older records lack.
    fn unknown_differs(self) -> bool {
        self != Condition::VcpusAtOnce
    }

    /// Whether two values differ (an unknown one, only where
    /// [`Condition::unknown_differs`]).
    fn differ(self, a: &Option<String>, b: &Option<String>) -> bool {
        a != b && (self.unknown_differs() || (a.is_some() && b.is_some()))
    }

    /// A value as a difference shows it (a device model: its fields).
    fn show(self, v: &Option<String>) -> String {
        v.clone().unwrap_or_else(|| "(not recorded)".to_string())
    }
}

/// A QEMU binary as the contract compares it: a QEMU bundle's
/// (`CACHE/qemu-bundle-KEY/bin/qemu-system-x86_64`, images/build-qemu-bundle.sh)
/// by its bundle alone, `…/qemu-bundle-KEY/bin/qemu-system-x86_64`: the
/// same binary, libraries and firmware on every host that imported it,
/// wherever that host's image cache lies; any other by its path.
fn bundle_named(path: &str) -> String {
    let parts: Vec<&str> = path.rsplitn(4, '/').collect();
    match parts.as_slice() {
        [bin, "bin", dir, _] if *bin == "qemu-system-x86_64" && dir.starts_with("qemu-bundle-") => {
            format!("…/{dir}/bin/{bin}")
        }
        _ => path.to_string(),
    }
}

/// The value of a QEMU option (the argument after `opt`).
fn qemu_option<'a>(r: &'a ResultRecord, opt: &str) -> Option<&'a str> {
    let cl = &r.qemu_command_line;
    let i = cl.iter().position(|a| a == opt)?;
    cl.get(i + 1).map(String::as_str)
}

/// The guest's vCPU count: QEMU's `-smp` (`N` or `cpus=N`), else the CPUs
/// the guest saw online.
pub(crate) fn vcpus(r: &ResultRecord) -> Option<u32> {
    let smp = qemu_option(r, "-smp").and_then(|v| {
        v.split(',')
            .find_map(|p| p.strip_prefix("cpus=").unwrap_or(p).parse::<u32>().ok())
    });
    smp.or(r.guest.nr_cpus)
}

/// How many of a record's vCPUs could run at once, on what host: the
/// record's own, else its run conditions' host with its vCPUs (`None`: a
/// record and run older than the fields).
pub(crate) fn parallelism(run: &RunDocument, r: &ResultRecord) -> Option<Parallelism> {
    if let Some(p) = &r.parallelism {
        return Some(p.clone());
    }
    let host = match &r.run_conditions {
        Some(rc) => rc.parallelism.as_ref(),
        None => run.parallelism.as_ref(),
    }?;
    Some(host.with_vcpus(vcpus(r)?))
}

/// A value as JSON text (objects with their keys sorted).
pub(crate) fn json_text<T: Serialize>(v: &T) -> String {
    serde_json::to_value(v).unwrap_or(Value::Null).to_string()
}

/// A variant's definition as JSON, without its name (the two variants of
/// an A/A pair are defined alike under two names).
fn definition_text(v: &Variant) -> String {
    let mut j = serde_json::to_value(v).unwrap_or(Value::Null);
    if let Some(o) = j.as_object_mut() {
        o.remove("name");
    }
    j.to_string()
}

/// What a record's device configuration is, without the per-boot socket
/// and serial, as JSON (to name the fields that differ).
pub(crate) fn device_identity(r: &ResultRecord) -> Value {
    let mut d = serde_json::to_value(&r.device).unwrap_or(Value::Null);
    if let Some(a) = d.as_array_mut() {
        for disk in a {
            if let Some(o) = disk.as_object_mut() {
                o.remove("socket");
                o.remove("serial");
            }
        }
    }
    d
}

/// The initramfs manifest's tools, without what belongs to the kernel
/// (its version, modules and paths).
fn guest_tools(m: &Value) -> Option<String> {
    let keys = [
        "fio",
        "mpstat_sha256",
        "dmsetup_sha256",
        "busybox_sha256",
        "guest_files_sha256",
    ];
    let mut o = serde_json::Map::new();
    for k in keys {
        if let Some(v) = m.get(k) {
            let v = match (k, v) {
                ("fio", Value::Object(f)) => {
                    let mut f = f.clone();
                    f.remove("path");
                    Value::Object(f)
                }
                _ => v.clone(),
            };
            o.insert(k.to_string(), v);
        }
    }
    (!o.is_empty()).then(|| Value::Object(o).to_string())
}

/// A kernel manifest's identity: its image's sha256 (the whole manifest,
/// less its build time, when it has none).
fn kernel_build(m: &Value) -> String {
    if let Some(s) = m.get("sha256").and_then(Value::as_str) {
        return format!("sha256 {s}");
    }
    let mut m = m.clone();
    if let Some(o) = m.as_object_mut() {
        o.remove("built_at");
    }
    m.to_string()
}

/// `arg` with each boot's own socket directory (`$TMPDIR/blklab-run-SEQ-RANDOM`,
/// made fresh per boot: the plugin's `ctl=` and QMP's sockets live there)
/// named `…/blklab-run-…`, whatever the temporary directory it is in, so
/// that two runs' command lines differ only where an option, a device or a
/// value does.
pub(crate) fn boot_dirs_named(arg: &str) -> String {
    const DIR: &str = "blklab-run-";
    let mut out = String::with_capacity(arg.len());
    let mut rest = arg;
    while let Some(at) = rest.find(DIR) {
        let starts_segment = at == 0 || rest[..at].ends_with('/');
        let after = &rest[at + DIR.len()..];
        let end = after.find(['/', ',', ' ']).unwrap_or(after.len());
        let per_boot = after[..end].split_once('-').is_some_and(|(seq, tail)| {
            !seq.is_empty() && seq.bytes().all(|c| c.is_ascii_digit()) && !tail.is_empty()
        });
        if starts_segment && per_boot {
            // The path before the directory: from the option's value on.
            let path_start = rest[..at].rfind(['=', ',', ' ', ':']).map_or(0, |i| i + 1);
            out.push_str(&rest[..path_start]);
            if path_start < at {
                out.push_str("…/");
            }
            out.push_str(DIR);
            out.push('…');
            rest = &after[end..];
        } else {
            out.push_str(&rest[..at + DIR.len()]);
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// A run-wide condition's value as run.json states it (`None` for the
/// conditions only records state).
pub(crate) fn run_value(c: Condition, run: &RunDocument) -> Option<String> {
    c.run_wide(run.accel, &run.conditions()).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::result::test_record;
    use serde_json::json;

    #[test]
    fn a_bundles_qemu_is_named_by_its_bundle_wherever_its_cache_is() {
        let a = "/root/.cache/blklab/images/qemu-bundle-1b2df965ce8bc6b7/bin/qemu-system-x86_64";
        let b = "/home/u/c/qemu-bundle-1b2df965ce8bc6b7/bin/qemu-system-x86_64";
        assert_eq!(bundle_named(a), bundle_named(b));
        assert_eq!(
            bundle_named(a),
            "…/qemu-bundle-1b2df965ce8bc6b7/bin/qemu-system-x86_64"
        );
        assert_ne!(
            bundle_named(a),
            bundle_named("/c/qemu-bundle-0000000000000000/bin/qemu-system-x86_64"),
            "another bundle is another binary"
        );
        for other in [
            "/usr/bin/qemu-system-x86_64",
            "qemu-system-x86_64",
            "/opt/qemu/bin/qemu-system-x86_64",
            "/x/qemu-bundle-1/libexec/qemu-system-x86_64",
        ] {
            assert_eq!(bundle_named(other), other);
        }
    }

    #[test]
    fn only_per_boot_directory_names_are_replaced() {
        assert_eq!(
            boot_dirs_named("/t/blklab-run-12-aZ9/s"),
            "…/blklab-run-…/s"
        );
        assert_eq!(boot_dirs_named("blklab-run-3-x"), "blklab-run-…");
        assert_eq!(
            boot_dirs_named("a=/x/blklab-run-0-p/s,b=/y/blklab-run-1-q/s"),
            "a=…/blklab-run-…/s,b=…/blklab-run-…/s"
        );
        assert_eq!(
            boot_dirs_named("unix:/tmp/blklab-run-3-abc/qmp.sock,server=on"),
            "unix:…/blklab-run-…/qmp.sock,server=on"
        );
        for kept in [
            "/t/blklab-run-x-aZ9/s",
            "/t/blklab-run-12/s",
            "/t/blklab-run-12-/s",
            "/t/my-blklab-run-1-a/s",
            "blklab-run-result/1",
        ] {
            assert_eq!(boot_dirs_named(kept), kept);
        }
    }

    #[test]
    fn parallelism_is_the_records_else_its_run_conditions_with_its_vcpus() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/runs/aa");
        let mut run: RunDocument =
            crate::record::read(&std::path::Path::new(dir).join("run.json")).unwrap();
        let host = json!({"cores_online": 4, "cores_usable": 2, "vcpu_threads": "per_vcpu"});
        let smp4 = json!(["q", "-smp", "4"]);
        // A record and run older than the fields: unknown.
        let old = test_record(json!({ "qemu_command_line": smp4 }));
        assert_eq!(parallelism(&run, &old), None);
        assert_eq!(Condition::VcpusAtOnce.value(&run, &old), None);
        // Its run.json says the host: the record's vCPUs on it.
        run.parallelism = Some(serde_json::from_value(host.clone()).unwrap());
        let p = parallelism(&run, &old).unwrap();
        assert_eq!((p.vcpus, p.vcpus_at_once), (4, Some(2)));
        // The record's run conditions say it first.
        let mut rc = serde_json::to_value(run.conditions()).unwrap();
        rc["parallelism"]["cores_usable"] = 8.into();
        let r = test_record(json!({ "qemu_command_line": smp4, "run_conditions": rc }));
        assert_eq!(Condition::VcpusAtOnce.value(&run, &r).as_deref(), Some("4"));
        // The record's own, above all.
        let own = json!({"vcpu_threads": "single", "vcpus": 4, "vcpus_at_once": 1});
        let r = test_record(json!({ "qemu_command_line": smp4, "parallelism": own }));
        assert_eq!(Condition::VcpusAtOnce.value(&run, &r).as_deref(), Some("1"));
    }

    #[test]
    fn vcpus_come_from_smp_else_the_guest() {
        let r = |cl: Value, n: Value| {
            test_record(json!({"qemu_command_line": cl, "guest": {"nr_cpus": n}}))
        };
        assert_eq!(vcpus(&r(json!(["q", "-smp", "4"]), json!(2))), Some(4));
        assert_eq!(
            vcpus(&r(json!(["q", "-smp", "sockets=1,cpus=8"]), json!(null))),
            Some(8)
        );
        assert_eq!(vcpus(&r(json!(["q"]), json!(2))), Some(2));
        assert_eq!(vcpus(&r(json!(["q"]), json!(null))), None);
    }
}
