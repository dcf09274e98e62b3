//! The comparability contract: every condition that changes a measured
//! number, read from each record (with its run.json for records older than
//! the fields that carry them), and the check that the records a report
//! pools and compares were measured under the same conditions.
//!
//! Each condition has a scope: a run-wide one must hold one value in every
//! record a report reads; a kernel's (its build) one value within a side;
//! a variant's (its definition, device, machine, command line) one value
//! per row on each side and the same on both sides of a row, while the two
//! variants of a `--pair` differ in it by design. A difference is a
//! refusal naming the condition and both values unless forced. The merge
//! of a run's shards checks the same list.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use crate::record::result::ResultRecord;
use crate::record::run::{Accel, RunConditions, RunDocument};
use crate::record::scenario::Variant;

/// A condition that changes the measured numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Condition {
    /// TCG, KVM or KVM nested in TCG.
    Accelerator,
    /// Why that accelerator (forced, or what the probe found).
    AcceleratorReason,
    /// `--deterministic`: guest time is instructions, not wall time.
    Deterministic,
    /// The instruction-count plugin costs the vCPUs time.
    InstructionCounting,
    Vcpus,
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
    pub(crate) const ALL: [Condition; 14] = [
        Condition::Accelerator,
        Condition::AcceleratorReason,
        Condition::Deterministic,
        Condition::InstructionCounting,
        Condition::Vcpus,
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
            Condition::Memory => qemu_option(r, "-m")
                .map(str::to_string)
                .or_else(|| r.machine.as_ref().map(|m| m.memory.clone())),
            Condition::KernelCommandLine => qemu_option(r, "-append").map(boot_dirs_named),
            Condition::QemuBinary => r
                .qemu_command_line
                .first()
                .cloned()
                .or_else(|| Some(run.qemu.path.clone())),
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

    /// A value as a difference shows it (a device model: its fields).
    fn show(self, v: &Option<String>) -> String {
        v.clone().unwrap_or_else(|| "(not recorded)".to_string())
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

/// Something that differs between what a report compares.
#[derive(Debug, Clone, Serialize)]
pub struct Difference {
    pub what: String,
    /// The condition of the contract, when it is one (a QEMU command line,
    /// the host: shown, never a condition).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub condition: Option<Condition>,
    pub a: String,
    pub b: String,
    /// Refuses the comparison unless forced.
    pub blocking: bool,
    /// The two variants of a pair, which differ by design (never blocking).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub by_design: bool,
    /// Within one side (`A` or `B`): its records disagree (`a` is the
    /// most common value, `b` the others).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub within: Option<String>,
    /// The rows it concerns (a variant's condition); empty: every row.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rows: Vec<String>,
}

impl Difference {
    /// The same difference (rows apart).
    fn same(&self, o: &Difference) -> bool {
        (&self.what, &self.a, &self.b, &self.within, self.by_design)
            == (&o.what, &o.a, &o.b, &o.within, o.by_design)
    }
}

/// A record as a difference names it: `KERNEL SCENARIO/VARIANT #N`.
fn record_name(r: &ResultRecord) -> String {
    format!("{} {}/{} #{}", r.kernel, r.scenario, r.variant, r.iteration)
}

/// The records a check reads: a side's run document and some of its
/// records.
pub(crate) struct Records<'a> {
    pub run: &'a RunDocument,
    pub records: Vec<&'a ResultRecord>,
}

impl Records<'_> {
    /// Each distinct value of `c` with the records that have it, the most
    /// common first.
    fn values(&self, c: Condition) -> Vec<(Option<String>, Vec<&ResultRecord>)> {
        let mut by: BTreeMap<Option<String>, Vec<&ResultRecord>> = BTreeMap::new();
        for r in &self.records {
            by.entry(c.value(self.run, r)).or_default().push(r);
        }
        let mut v: Vec<_> = by.into_iter().collect();
        v.sort_by_key(|(_, rs)| std::cmp::Reverse(rs.len()));
        v
    }

    /// The one value of `c` in these records, or the difference within
    /// them (`side` names them).
    fn one_value(&self, c: Condition, side: &str) -> Result<Option<String>, Difference> {
        let mut values = self.values(c);
        if values.len() <= 1 {
            return Ok(values.pop().and_then(|(v, _)| v));
        }
        let show = |(v, rs): &(Option<String>, Vec<&ResultRecord>)| {
            let example = rs.first().map(|r| record_name(r)).unwrap_or_default();
            format!("{} ({} record(s), e.g. {example})", c.show(v), rs.len())
        };
        let others: Vec<String> = values[1..].iter().map(show).collect();
        Err(Difference {
            what: c.name().to_string(),
            condition: Some(c),
            a: show(&values[0]),
            b: others.join("; "),
            blocking: true,
            by_design: false,
            within: Some(side.to_string()),
            rows: Vec::new(),
        })
    }
}

/// What the check of a report's records is asked.
pub(crate) struct Check<'a> {
    /// Each side's records that the report reads, with the side's name.
    pub sides: Vec<(&'a str, Records<'a>)>,
    /// The rows: for each, the groups of records compared against each
    /// other, as (side index, records), and whether the groups are a
    /// pair's two variants (which differ by design in a variant's
    /// conditions).
    pub rows: Vec<RowGroups<'a>>,
    /// Whether the report shows a backend metric.
    pub backend_metric: bool,
}

/// The groups of one row: `across` are compared with each other (the same
/// variant on the two sides), `pair` the variants of a pair.
pub(crate) struct RowGroups<'a> {
    pub name: String,
    /// Records of one variant on side A and side B.
    pub across: Vec<[Records<'a>; 2]>,
    /// A pair's base and other variant on one side (named).
    pub pair: Vec<(&'a str, [Records<'a>; 2])>,
}

/// Whether a difference in `c` blocks: everything but the blklab version
/// where no backend metric is shown.
fn blocks(c: Condition, backend_metric: bool) -> bool {
    c != Condition::BlklabVersion || backend_metric
}

/// Every difference of the contract's conditions in what `check` reads.
pub(crate) fn differences(check: &Check) -> Vec<Difference> {
    let mut out = Vec::new();
    let mut push = |mut d: Difference| {
        if let Some(c) = d.condition {
            d.blocking = d.blocking && blocks(c, check.backend_metric);
        }
        match out.iter_mut().find(|o: &&mut Difference| o.same(&d)) {
            Some(o) => {
                for r in d.rows {
                    if !o.rows.contains(&r) {
                        o.rows.push(r);
                    }
                }
            }
            None => out.push(d),
        }
    };
    // Within each side: run-wide and kernel conditions over all its records.
    for (name, recs) in &check.sides {
        for c in Condition::ALL {
            if c.scope() != Scope::Variant {
                if let Err(d) = recs.one_value(c, name) {
                    push(d);
                }
            }
        }
    }
    for row in &check.rows {
        for [a, b] in &row.across {
            for c in Condition::ALL {
                let Some((va, vb)) = row_values(c, &row.name, [a, b], ["A", "B"], &mut push) else {
                    continue;
                };
                if va != vb && c.scope() != Scope::Kernel {
                    push(across(c, &row.name, &va, &vb, a, b));
                }
            }
        }
        for (side, [base, other]) in &row.pair {
            for c in Condition::ALL {
                let Some((vb, vo)) =
                    row_values(c, &row.name, [base, other], [side, side], &mut push)
                else {
                    continue;
                };
                if vb != vo {
                    let mut d = across(c, &row.name, &vb, &vo, base, other);
                    if c.scope() == Scope::Variant {
                        d.blocking = false;
                        d.by_design = true;
                        d.what = match c {
                            Condition::ScenarioDefinition => format!("variants {}", row.name),
                            _ => format!("variants {} ({})", row.name, c.name()),
                        };
                        d.rows.clear();
                    }
                    push(d);
                }
            }
        }
    }
    out
}

/// The values of `c` in a row's two groups; `None` when a group's records
/// disagree (a variant's condition: pushed here as a difference within
/// its side; any other was found over the whole side).
fn row_values(
    c: Condition,
    row: &str,
    groups: [&Records; 2],
    sides: [&str; 2],
    push: &mut impl FnMut(Difference),
) -> Option<(Option<String>, Option<String>)> {
    let va = groups[0].one_value(c, sides[0]);
    let vb = groups[1].one_value(c, sides[1]);
    match (va, vb) {
        (Ok(va), Ok(vb)) => Some((va, vb)),
        (Err(d), _) | (_, Err(d)) => {
            if c.scope() == Scope::Variant {
                push(Difference {
                    rows: vec![row.to_string()],
                    ..d
                });
            }
            None
        }
    }
}

/// The difference of `c` between two groups' values.
fn across(
    c: Condition,
    row: &str,
    va: &Option<String>,
    vb: &Option<String>,
    a: &Records,
    b: &Records,
) -> Difference {
    let (sa, sb) = match (c, a.records.first(), b.records.first()) {
        (Condition::DeviceModel, Some(ra), Some(rb)) => device_fields(ra, rb),
        (Condition::ScenarioDefinition, Some(ra), Some(rb)) => {
            match (&ra.scenario_definition, &rb.scenario_definition) {
                (Some(x), Some(y)) => {
                    definition_difference(x, y).unwrap_or_else(|| (c.show(va), c.show(vb)))
                }
                _ => (c.show(va), c.show(vb)),
            }
        }
        _ => (c.show(va), c.show(vb)),
    };
    let rows = match c.scope() {
        Scope::Variant => vec![row.to_string()],
        _ => Vec::new(),
    };
    Difference {
        what: c.name().to_string(),
        condition: Some(c),
        a: sa,
        b: sb,
        blocking: true,
        by_design: false,
        within: None,
        rows,
    }
}

/// How two records' backend configurations differ: the fields that differ
/// (of the first disk whose configuration differs), and the disk counts
/// when they differ.
fn device_fields(a: &ResultRecord, b: &ResultRecord) -> (String, String) {
    let (da, db) = (device_identity(a), device_identity(b));
    let disks = |d: &Value| d.as_array().map_or(0, Vec::len);
    let pick = |d: &Value, i: usize| d.get(i).cloned().unwrap_or(Value::Null);
    let i = (0..disks(&da).max(disks(&db)))
        .find(|&i| pick(&da, i) != pick(&db, i))
        .unwrap_or(0);
    let (fa, fb) = (pick(&da, i), pick(&db, i));
    let mut fields: Vec<String> = Vec::new();
    if let (Some(oa), Some(ob)) = (fa.as_object(), fb.as_object()) {
        let mut keys: Vec<&String> = oa.keys().chain(ob.keys()).collect();
        keys.sort();
        keys.dedup();
        fields = keys
            .into_iter()
            .filter(|k| oa.get(*k) != ob.get(*k))
            .cloned()
            .collect();
    }
    let show = |o: &Value, d: &Value| {
        let mut parts: Vec<String> = fields
            .iter()
            .map(|k| format!("{k}={}", o.get(k).cloned().unwrap_or(Value::Null)))
            .collect();
        if fields.is_empty() && disks(&da) == disks(&db) {
            parts.push(o.to_string());
        }
        if disks(&da) != disks(&db) {
            parts.push(format!("disks={}", disks(d)));
        }
        parts.join(" ")
    };
    (show(&fa, &da), show(&fb, &db))
}

/// How two variants' definitions differ: (A's, B's), the differing fields
/// only (for argument lists, the arguments only one of them has).
fn definition_difference(a: &Variant, b: &Variant) -> Option<(String, String)> {
    let mut pa: Vec<String> = Vec::new();
    let mut pb: Vec<String> = Vec::new();
    let mut field = |name: &str, x: String, y: String| {
        if x != y {
            pa.push(format!("{name}={x}"));
            pb.push(format!("{name}={y}"));
        }
    };
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    let optn = |v: &Option<u64>| v.map_or("-".into(), |n| n.to_string());
    field("target", a.target.kind.clone(), b.target.kind.clone());
    let stack = |v: &Variant| {
        v.stack.as_ref().map_or("-".into(), |s| {
            std::iter::once(s.kind.as_str())
                .chain(s.params.iter().map(String::as_str))
                .collect::<Vec<_>>()
                .join(",")
        })
    };
    field("stack", stack(a), stack(b));
    field("sched", opt(&a.sched), opt(&b.sched));
    field("nr_requests", optn(&a.nr_requests), optn(&b.nr_requests));
    field("queue_depth", optn(&a.queue_depth), optn(&b.queue_depth));
    field("nomerges", optn(&a.nomerges), optn(&b.nomerges));
    field("rq_affinity", optn(&a.rq_affinity), optn(&b.rq_affinity));
    field(
        "layout",
        a.layout.as_str().to_string(),
        b.layout.as_str().to_string(),
    );
    field("runtime", a.runtime.to_string(), b.runtime.to_string());
    field("ramp", a.ramp.to_string(), b.ramp.to_string());
    let mut list = |name: &str, x: &[String], y: &[String]| {
        let only = |p: &[String], q: &[String]| -> Vec<String> {
            p.iter().filter(|e| !q.contains(e)).cloned().collect()
        };
        let (ox, oy) = (only(x, y), only(y, x));
        if !ox.is_empty() || !oy.is_empty() {
            let show = |v: Vec<String>| {
                if v.is_empty() {
                    "-".to_string()
                } else {
                    v.join(" ")
                }
            };
            pa.push(format!("{name}: {}", show(ox)));
            pb.push(format!("{name}: {}", show(oy)));
        } else if x != y {
            pa.push(format!("{name} order: {}", x.join(" ")));
            pb.push(format!("{name} order: {}", y.join(" ")));
        }
    };
    list("target params", &a.target.params, &b.target.params);
    list("device", &a.device, &b.device);
    list("fio args", &a.fio_args, &b.fio_args);
    (!pa.is_empty()).then(|| (pa.join("; "), pb.join("; ")))
}

/// A run-wide condition's value as run.json states it (`None` for the
/// conditions only records state).
pub(crate) fn run_value(c: Condition, run: &RunDocument) -> Option<String> {
    c.run_wide(run.accel, &run.conditions()).flatten()
}

/// The run document's own run-wide values against a record's: a record
/// whose run-wide conditions are not its run.json's (a record edited, or
/// copied in with another run's id) shows as a difference within its side.
pub(crate) fn run_document_disagreements(side: &str, recs: &Records) -> Vec<Difference> {
    let mut out = Vec::new();
    for c in Condition::ALL {
        let Some(want) = run_value(c, recs.run) else {
            continue;
        };
        let off: Vec<&ResultRecord> = recs
            .records
            .iter()
            .copied()
            .filter(|r| c.value(recs.run, r).as_ref() != Some(&want))
            .collect();
        if let Some(first) = off.first() {
            out.push(Difference {
                what: c.name().to_string(),
                condition: Some(c),
                a: format!("{want} (run.json)"),
                b: format!(
                    "{} ({} record(s), e.g. {})",
                    c.show(&c.value(recs.run, first)),
                    off.len(),
                    record_name(first)
                ),
                blocking: true,
                by_design: false,
                within: Some(side.to_string()),
                rows: Vec::new(),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::result::test_record;
    use serde_json::json;

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

    #[test]
    fn definitions_differ_by_field() {
        let v = |sched: Option<&str>, args: &[&str]| Variant {
            name: "v".into(),
            target: crate::record::scenario::Target {
                kind: "scsi_debug".into(),
                params: vec!["max_queue=128".into()],
            },
            stack: None,
            sched: sched.map(str::to_string),
            nr_requests: None,
            queue_depth: None,
            nomerges: None,
            rq_affinity: None,
            device: vec!["tags=none".into()],
            layout: Default::default(),
            runtime: 20,
            ramp: 0,
            fio_args: args.iter().map(|s| s.to_string()).collect(),
        };
        let (a, b) = definition_difference(
            &v(None, &["--bs=8k", "--iodepth=64"]),
            &v(Some("mq-deadline"), &["--bs=8k", "--iodepth=16"]),
        )
        .unwrap();
        assert_eq!(a, "sched=-; fio args: --iodepth=64");
        assert_eq!(b, "sched=mq-deadline; fio args: --iodepth=16");
        assert!(definition_difference(&v(None, &[]), &v(None, &[])).is_none());
        let mut stacked = v(Some("none"), &[]);
        stacked.stack = Some(crate::record::scenario::Stack {
            kind: "multipath".into(),
            params: vec!["path_sched=mq-deadline".into()],
        });
        let (a, b) = definition_difference(&stacked, &v(Some("none"), &[])).unwrap();
        assert_eq!(a, "stack=multipath,path_sched=mq-deadline");
        assert_eq!(b, "stack=-");
    }
}
