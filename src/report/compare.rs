//! Building an A/B comparison from `blklab run` output directories.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;
use thiserror::Error;

use crate::record::metrics::{self, RowLabels};
use crate::record::result::{ResultRecord, RESULT_SCHEMA};
use crate::record::run::RunDocument;
use crate::record::scenario::Variant;
use crate::record::RecordError;
use crate::report::inference::{self, Comparison, DiffInDiff, Tested};
use crate::report::profile;

#[derive(Debug, Error)]
pub enum ReportError {
    #[error("{0} is not a directory written by `blklab run` (no run.json)")]
    NotARun(PathBuf),
    #[error("cannot read {path}: {why}")]
    Read { path: PathBuf, why: String },
    #[error(transparent)]
    Record(#[from] RecordError),
    #[error("{dir} has no results (no *.json records of blklab-run-result/1)")]
    Empty { dir: PathBuf },
    #[error("{dir} has no kernel {kernel:?} (it has: {have})")]
    NoKernel {
        dir: PathBuf,
        kernel: String,
        have: String,
    },
    #[error("{dir} holds {n} kernels ({have}); name one side as {dir}:KERNEL")]
    Ambiguous {
        dir: PathBuf,
        n: usize,
        have: String,
    },
    #[error("one directory compares its two kernels, but {dir} holds {n} ({have}); give two sides as DIR:KERNEL")]
    NotAPair {
        dir: PathBuf,
        n: usize,
        have: String,
    },
    #[error("unknown metric {0:?} (known: {1})")]
    UnknownMetric(String, String),
    #[error("the two sides ran different scenario sets: only in A: [{only_a}]; only in B: [{only_b}] (--force compares the common rows)")]
    ScenarioSets { only_a: String, only_b: String },
    #[error("the two sides have no scenario row in common")]
    NothingInCommon,
    #[error("the two sides differ in more than the kernel: {0} (--force compares anyway)")]
    Differs(String),
    #[error("bad --pair {0:?}: want BASE:OTHER, each VARIANT or SCENARIO/VARIANT (e.g. single-queue:host-tags)")]
    BadPair(String),
    #[error("--pair {pair}: no scenario of {side} has both variants (it has: {have})")]
    PairNotFound {
        pair: String,
        side: String,
        have: String,
    },
    #[error("the pairs match different rows on the two sides: only on A: [{only_a}]; only on B: [{only_b}] (--force compares the common rows)")]
    PairSets { only_a: String, only_b: String },
    #[error("{0}")]
    Usage(String),
    #[error("cannot merge {a} and {b}: {why}")]
    Merge { a: PathBuf, b: PathBuf, why: String },
}

/// One side of a comparison: the records of one kernel in one run.
#[derive(Debug, Clone)]
pub struct Side {
    pub dir: PathBuf,
    pub kernel: String,
    pub run: RunDocument,
    pub records: Vec<ResultRecord>,
}

/// Is this document's `schema` a result record's (of any version)?
fn is_result(schema: &str) -> bool {
    let name = |s: &str| {
        s.rsplit_once('/')
            .map_or(s.to_string(), |(n, _)| n.to_string())
    };
    name(schema) == name(RESULT_SCHEMA)
}

/// A run directory: run.json and every record in it (files of other
/// documents are left alone; a record or run.json of a schema version this
/// blklab does not read is an error).
pub fn load_dir(dir: &Path) -> Result<(RunDocument, Vec<ResultRecord>), ReportError> {
    let (run, named) = load_dir_named(dir)?;
    Ok((run, named.into_iter().map(|(_, r)| r).collect()))
}

/// [`load_dir`] with each record's file name, in file-name order.
fn load_dir_named(dir: &Path) -> Result<(RunDocument, Vec<(String, ResultRecord)>), ReportError> {
    let run_path = dir.join("run.json");
    if !run_path.is_file() {
        return Err(ReportError::NotARun(dir.to_path_buf()));
    }
    let run: RunDocument = crate::record::read(&run_path)?;
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| ReportError::Read {
            path: dir.to_path_buf(),
            why: e.to_string(),
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    let mut records = Vec::new();
    for f in files {
        let name = f.file_name().unwrap_or_default().to_string_lossy();
        if name == "run.json" || name == "summary.json" {
            continue;
        }
        let v = crate::record::read_value(&f)?;
        if crate::record::schema_of(&v).is_some_and(is_result) {
            records.push((name.into_owned(), crate::record::from_value(&f, &v)?));
        }
    }
    if records.is_empty() {
        return Err(ReportError::Empty {
            dir: dir.to_path_buf(),
        });
    }
    Ok((run, records))
}

/// Several run directories as one: the shards of one plan (`blklab run
/// --shard I/N`), merged. They must come from the same plan (run.json's
/// `shard.plan`) under the same accelerator, QEMU version and instruction
/// counting, and no boot may appear twice. The merged run is the first
/// shard's document with every shard's boots in plan order (and no shard
/// record). One directory is just [`load_dir`].
pub fn load_dirs(dirs: &[PathBuf]) -> Result<(RunDocument, Vec<ResultRecord>), ReportError> {
    let Some((first, rest)) = dirs.split_first() else {
        return Err(ReportError::Usage("no run directory".into()));
    };
    let (mut run, mut records) = load_dir_named(first)?;
    if rest.is_empty() {
        return Ok((run, records.into_iter().map(|(_, r)| r).collect()));
    }
    let merge_err = |b: &Path, why: String| ReportError::Merge {
        a: first.clone(),
        b: b.to_path_buf(),
        why,
    };
    let Some(plan) = run.shard.as_ref().map(|s| s.plan.clone()) else {
        return Err(merge_err(
            &rest[0],
            format!(
                "{} is not a shard of a run (blklab run --shard I/N)",
                first.display()
            ),
        ));
    };
    let mut shards = vec![run.shard.as_ref().map_or(0, |s| s.index)];
    let mut order = run.order.clone();
    for d in rest {
        let (r, recs) = load_dir_named(d)?;
        let Some(sh) = &r.shard else {
            return Err(merge_err(
                d,
                format!("{} is not a shard of a run", d.display()),
            ));
        };
        if sh.plan != plan || Some(sh.count) != run.shard.as_ref().map(|s| s.count) {
            return Err(merge_err(d, "they are shards of different plans (kernels, scenarios, iterations or machines differ)".into()));
        }
        if shards.contains(&sh.index) {
            return Err(merge_err(
                d,
                format!("shard {}/{} is given twice", sh.index, sh.count),
            ));
        }
        for (what, x, y) in [
            (
                "accelerator",
                format!("{:?}", run.accel),
                format!("{:?}", r.accel),
            ),
            (
                "--deterministic",
                run.deterministic.to_string(),
                r.deterministic.to_string(),
            ),
            (
                "QEMU version",
                run.qemu.version.clone().unwrap_or_default(),
                r.qemu.version.clone().unwrap_or_default(),
            ),
            (
                "instruction counting",
                run.count_insns.is_some().to_string(),
                r.count_insns.is_some().to_string(),
            ),
        ] {
            if x != y {
                return Err(merge_err(
                    d,
                    format!("their {what} differs ({x} against {y})"),
                ));
            }
        }
        shards.push(sh.index);
        order.extend(r.order.iter().cloned());
        records.extend(recs);
    }
    // As one directory would list them: by file name.
    records.sort_by(|a, b| a.0.cmp(&b.0));
    let records: Vec<ResultRecord> = records.into_iter().map(|(_, r)| r).collect();
    let mut seen = std::collections::BTreeSet::new();
    for r in &records {
        if !seen.insert((&r.kernel, &r.scenario, &r.variant, r.iteration)) {
            return Err(ReportError::Usage(format!(
                "{} {} {} iteration {} is in two of the merged directories",
                r.kernel, r.scenario, r.variant, r.iteration
            )));
        }
    }
    order.sort_by_key(|o| plan.iter().position(|p| p == o).unwrap_or(usize::MAX));
    run.order = order;
    run.shard = None;
    Ok((run, records))
}

/// Kernels of a run that have records, in run order.
pub(crate) fn kernels(run: &RunDocument, records: &[ResultRecord]) -> Vec<String> {
    let mut k: Vec<String> = run.kernels.iter().map(|k| k.label.clone()).collect();
    for r in records {
        if !k.contains(&r.kernel) {
            k.push(r.kernel.clone());
        }
    }
    k.retain(|l| records.iter().any(|r| &r.kernel == l));
    k
}

fn side_of(dir: &Path, run: &RunDocument, records: &[ResultRecord], kernel: &str) -> Side {
    Side {
        dir: dir.to_path_buf(),
        kernel: kernel.to_string(),
        run: run.clone(),
        records: records
            .iter()
            .filter(|r| r.kernel == kernel)
            .cloned()
            .collect(),
    }
}

/// `DIR[,DIR...]` or `DIR[,DIR...]:KERNEL` → (dirs, kernel). Several
/// directories are the shards of one run, merged ([`load_dirs`]).
fn split_arg(arg: &str) -> (Vec<PathBuf>, Option<String>) {
    let dirs = |s: &str| -> Option<Vec<PathBuf>> {
        let v: Vec<PathBuf> = s.split(',').map(PathBuf::from).collect();
        v.iter().all(|d| d.is_dir()).then_some(v)
    };
    if Path::new(arg).is_dir() {
        return (vec![PathBuf::from(arg)], None);
    }
    if let Some(v) = dirs(arg) {
        return (v, None);
    }
    match arg.rsplit_once(':') {
        Some((d, k)) if !k.is_empty() => match dirs(d) {
            Some(v) => (v, Some(k.to_string())),
            None => (vec![PathBuf::from(arg)], None),
        },
        _ => (vec![PathBuf::from(arg)], None),
    }
}

/// How a side's directories are shown: `DIR` or `DIR,DIR,...`.
fn dirs_label(dirs: &[PathBuf]) -> PathBuf {
    let s: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    PathBuf::from(s.join(","))
}

/// One side from `DIR` (a run with one kernel) or `DIR:KERNEL`.
pub fn load_side(arg: &str) -> Result<Side, ReportError> {
    let (dirs, kernel) = split_arg(arg);
    let (run, records) = load_dirs(&dirs)?;
    let dir = dirs_label(&dirs);
    let ks = kernels(&run, &records);
    match kernel {
        Some(k) => {
            if !ks.contains(&k) {
                return Err(ReportError::NoKernel {
                    dir,
                    kernel: k,
                    have: ks.join(", "),
                });
            }
            Ok(side_of(&dir, &run, &records, &k))
        }
        None if ks.len() == 1 => Ok(side_of(&dir, &run, &records, &ks[0])),
        None => Err(ReportError::Ambiguous {
            n: ks.len(),
            have: ks.join(", "),
            dir,
        }),
    }
}

/// The two sides of one run directory holding exactly two kernels (A is
/// the first in run order).
pub fn load_pair(arg: &str) -> Result<(Side, Side), ReportError> {
    let (dirs, _) = split_arg(arg);
    let (run, records) = load_dirs(&dirs)?;
    let dir = &dirs_label(&dirs);
    let ks = kernels(&run, &records);
    if ks.len() != 2 {
        return Err(ReportError::NotAPair {
            dir: dir.to_path_buf(),
            n: ks.len(),
            have: ks.join(", "),
        });
    }
    Ok((
        side_of(dir, &run, &records, &ks[0]),
        side_of(dir, &run, &records, &ks[1]),
    ))
}

/// What a report compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Kernel B against kernel A, row by row (scenario, variant).
    Kernels,
    /// On one kernel, each pair's other variant (B) against its base (A).
    Variants,
    /// On two kernels, each pair's effect on B against its effect on A
    /// (the difference in differences).
    Did,
}

/// One variant of a `--pair`: `VARIANT` (in every scenario that has both
/// variants of the pair) or `SCENARIO/VARIANT`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VariantRef {
    pub scenario: Option<String>,
    pub variant: String,
}

/// A variant pair as asked for: `BASE:OTHER`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PairSpec {
    pub base: VariantRef,
    pub other: VariantRef,
}

impl PairSpec {
    /// `BASE:OTHER`, each `VARIANT` or `SCENARIO/VARIANT`; a scenario given
    /// on one side only holds for both.
    pub fn parse(s: &str) -> Result<PairSpec, ReportError> {
        let bad = || ReportError::BadPair(s.to_string());
        let (b, o) = s.split_once(':').ok_or_else(bad)?;
        let part = |x: &str| -> Result<VariantRef, ReportError> {
            let (scenario, variant) = match x.rsplit_once('/') {
                Some((sc, v)) => (Some(sc.to_string()), v.to_string()),
                None => (None, x.to_string()),
            };
            if variant.is_empty()
                || variant.contains(':')
                || scenario.as_deref().is_some_and(str::is_empty)
            {
                return Err(bad());
            }
            Ok(VariantRef { scenario, variant })
        };
        let (mut base, mut other) = (part(b)?, part(o)?);
        if base.scenario.is_none() {
            base.scenario.clone_from(&other.scenario);
        }
        if other.scenario.is_none() {
            other.scenario.clone_from(&base.scenario);
        }
        if base == other {
            return Err(bad());
        }
        Ok(PairSpec { base, other })
    }
}

impl std::fmt::Display for PairSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = |r: &VariantRef| match &r.scenario {
            Some(s) => format!("{s}/{}", r.variant),
            None => r.variant.clone(),
        };
        write!(f, "{}:{}", p(&self.base), p(&self.other))
    }
}

pub use crate::report::profile::RowPair;

/// (scenario, variant).
type Key = (String, String);

/// A pair resolved to one scenario: (base, other).
type Resolved = (Key, Key);

fn row_pair((b, o): &Resolved) -> RowPair {
    RowPair {
        base: format!("{}/{}", b.0, b.1),
        other: format!("{}/{}", o.0, o.1),
    }
}

/// One row: a (scenario, variant) of two kernels, or a variant pair.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// The scenario (of the base variant, for pairs).
    pub scenario: String,
    /// The variant (the base variant, for pairs).
    pub variant: String,
    /// Pairs: the base (A) and other (B) variant of the row.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pair: Option<RowPair>,
    pub labels: RowLabels,
    /// Pairs: the other variant's labels, when they differ from the base's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub labels_other: Option<RowLabels>,
    /// Failed records left out, per side (for the difference in
    /// differences, over both variants of each kernel).
    pub failed_a: usize,
    pub failed_b: usize,
    /// metric key → comparison (only metrics with data on both sides);
    /// empty in a difference-in-differences report (see `did`).
    pub metrics: BTreeMap<String, Comparison>,
    /// Difference in differences: metric key → each kernel's pair effect
    /// and the difference in differences.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub did: BTreeMap<String, DidCell>,
    /// The row's groups of records with their samples, for plots.
    #[serde(skip)]
    pub groups: Vec<Group>,
}

impl Row {
    /// `SCENARIO/VARIANT`, or the pair's `SCENARIO/BASE → OTHER`.
    pub fn name(&self) -> String {
        match &self.pair {
            Some(p) => p.name(),
            None => format!("{}/{}", self.scenario, self.variant),
        }
    }
}

/// One metric of one row of a difference-in-differences report.
#[derive(Debug, Clone, Serialize)]
pub struct DidCell {
    /// The pair's effect on kernel A (A = base, B = other).
    pub a: Comparison,
    /// The pair's effect on kernel B.
    pub b: Comparison,
    /// B's effect against A's.
    pub did: DiffInDiff,
}

/// One group of records of a row (a side's variant), for plots.
#[derive(Debug, Clone)]
pub struct Group {
    /// The legend of its series, e.g. `A debian-6.12` or `B smoke/write`.
    pub label: String,
    /// Which side's records: 0 = A, 1 = B.
    pub side: usize,
    pub scenario: String,
    pub variant: String,
    /// metric key → sample values.
    pub samples: BTreeMap<String, Vec<f64>>,
}

impl Group {
    /// The samples of one side's records of one (scenario, variant).
    fn new(label: String, side: usize, key: &Key, samples: BTreeMap<String, Vec<f64>>) -> Group {
        Group {
            label,
            side,
            scenario: key.0.clone(),
            variant: key.1.clone(),
            samples,
        }
    }
}

/// Something that differs between what a report compares.
#[derive(Debug, Clone, Serialize)]
pub struct Difference {
    pub what: String,
    pub a: String,
    pub b: String,
    /// Refuses the comparison unless forced.
    pub blocking: bool,
    /// The two variants of a pair, which differ by design (never blocking).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub by_design: bool,
}

/// Description of a side in a report.
#[derive(Debug, Clone, Serialize)]
pub struct SideInfo {
    pub dir: PathBuf,
    pub kernel: String,
    pub kernel_spec: String,
    pub records: usize,
}

/// A complete comparison.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub schema: &'static str,
    pub mode: Mode,
    /// A's kernel (with variant pairs on one kernel, `a` and `b` are the
    /// same side and each row's `pair` says which variant is A and B).
    pub a: SideInfo,
    pub b: SideInfo,
    /// The `--pair` arguments, as given.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pairs: Vec<String>,
    pub confidence: f64,
    pub metrics: Vec<String>,
    pub rows: Vec<Row>,
    pub differences: Vec<Difference>,
    pub forced: bool,
    /// The differential instruction profile per row (records with
    /// `instructions` on both sides only); with two kernels and pairs, one
    /// per kernel and row.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub profiles: Vec<profile::RowProfile>,
}

/// What a record's device configuration is, without the per-boot socket,
/// as JSON (to name the fields that differ).
fn device_identity(r: &ResultRecord) -> Value {
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

/// The QEMU command line with what is per kernel or per boot replaced.
fn qemu_identity(r: &ResultRecord) -> String {
    let args = &r.qemu_command_line;
    let mut out = Vec::new();
    let mut skip_next = false;
    for (i, a) in args.iter().enumerate() {
        if skip_next {
            skip_next = false;
            out.push("…".to_string());
            continue;
        }
        if i == 0 {
            out.push("qemu".into());
            continue;
        }
        if a == "-kernel" || a == "-initrd" {
            skip_next = true;
        }
        if a.starts_with("socket,id=") {
            out.push(a.split(",path=").next().unwrap_or(a).to_string());
            continue;
        }
        out.push(a.clone());
    }
    out.join(" ")
}

/// The guest's vCPU count: QEMU's `-smp` (`N` or `cpus=N`), else the CPUs
/// the guest saw online.
pub(crate) fn vcpus(r: &ResultRecord) -> Option<u32> {
    let smp = r
        .qemu_command_line
        .iter()
        .position(|a| a == "-smp")
        .and_then(|i| r.qemu_command_line.get(i + 1))
        .and_then(|v| {
            v.split(',')
                .find_map(|p| p.strip_prefix("cpus=").unwrap_or(p).parse::<u32>().ok())
        });
    smp.or(r.guest.nr_cpus)
}

/// A side's distinct vCPU counts (`?` where a record says nothing).
fn vcpu_counts(s: &Side) -> String {
    let mut v: Vec<String> = Vec::new();
    for r in &s.records {
        let c = vcpus(r).map_or("?".to_string(), |n| n.to_string());
        if !v.contains(&c) {
            v.push(c);
        }
    }
    v.sort();
    v.join(", ")
}

/// A value as JSON text (objects with their keys sorted), for showing
/// what differs.
fn json_text<T: Serialize>(v: &T) -> String {
    serde_json::to_value(v).unwrap_or(Value::Null).to_string()
}

fn first_str(s: &Side, f: impl Fn(&ResultRecord) -> String) -> String {
    s.records.first().map(f).unwrap_or_default()
}

fn differences(a: &Side, b: &Side) -> Vec<Difference> {
    let mut d = Vec::new();
    let mut check = |what: &str, va: String, vb: String, blocking: bool| {
        if va != vb {
            d.push(Difference {
                what: what.to_string(),
                a: va,
                b: vb,
                blocking,
                by_design: false,
            });
        }
    };
    let dev = |s: &Side| {
        let mut set: Vec<Value> = Vec::new();
        for r in &s.records {
            let d = device_identity(r);
            if !set.contains(&d) {
                set.push(d);
            }
        }
        set
    };
    let (da, db) = (dev(a), dev(b));
    if da != db {
        // Name only the fields that differ (of the first disk's
        // configuration that differs, which is what a user changed).
        let first = |v: &[Value]| {
            v.first()
                .and_then(|d| d.get(0))
                .cloned()
                .unwrap_or(Value::Null)
        };
        let (fa, fb) = (first(&da), first(&db));
        let mut fields = Vec::new();
        if let (Some(oa), Some(ob)) = (fa.as_object(), fb.as_object()) {
            let mut keys: Vec<&String> = oa.keys().chain(ob.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                if oa.get(k) != ob.get(k) {
                    fields.push(k.clone());
                }
            }
        }
        let show = |o: &Value, disks: usize| {
            let mut parts: Vec<String> = fields
                .iter()
                .map(|k| format!("{k}={}", o.get(k).cloned().unwrap_or(Value::Null)))
                .collect();
            if fields.is_empty() {
                parts.push(o.to_string());
            }
            if disks > 1 {
                parts.push(format!("({disks} distinct configurations)"));
            }
            parts.join(" ")
        };
        let disks_a = da.first().and_then(|d| d.as_array()).map_or(0, |v| v.len());
        let disks_b = db.first().and_then(|d| d.as_array()).map_or(0, |v| v.len());
        let mut va = show(&fa, da.len());
        let mut vb = show(&fb, db.len());
        if disks_a != disks_b {
            va.push_str(&format!(" disks={disks_a}"));
            vb.push_str(&format!(" disks={disks_b}"));
        }
        check("backend configuration", va, vb, true);
    }
    check(
        "QEMU command line",
        first_str(a, qemu_identity),
        first_str(b, qemu_identity),
        false,
    );
    // What decides a guest's CPU cost besides its kernel: the emulator, how
    // it runs the guest and how many vCPUs it has.
    check(
        "QEMU version",
        json_text(&a.run.qemu.version),
        json_text(&b.run.qemu.version),
        true,
    );
    check(
        "accelerator",
        json_text(&a.run.accel),
        json_text(&b.run.accel),
        true,
    );
    check("vCPUs", vcpu_counts(a), vcpu_counts(b), true);
    check(
        "host",
        json_text(&a.run.host),
        json_text(&b.run.host),
        false,
    );
    check(
        "blklab commit",
        json_text(&a.run.git_commit),
        json_text(&b.run.git_commit),
        false,
    );
    d
}

/// A variant's definition as a side recorded it (`None` when no record has
/// one).
fn definition<'a>(side: &'a Side, (s, v): &Key) -> Option<&'a Variant> {
    side.records
        .iter()
        .find(|r| &r.scenario == s && &r.variant == v)
        .and_then(|r| r.scenario_definition.as_ref())
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

/// Keys (scenario, variant) of a side, in record order.
fn keys(s: &Side) -> Vec<Key> {
    let mut v: Vec<Key> = Vec::new();
    for r in &s.records {
        let k = (r.scenario.clone(), r.variant.clone());
        if !v.contains(&k) {
            v.push(k);
        }
    }
    v
}

/// Where a (scenario, variant) comes in a run: the scenario's position, then
/// the variant's in it.
fn position(run: &RunDocument, (s, v): &Key) -> (usize, usize) {
    run.scenarios
        .iter()
        .enumerate()
        .find_map(|(i, sc)| {
            (&sc.name == s).then(|| {
                let j = sc
                    .variants
                    .iter()
                    .position(|x| &x.name == v)
                    .unwrap_or(usize::MAX);
                (i, j)
            })
        })
        .unwrap_or((usize::MAX, usize::MAX))
}

/// The rows of `pairs` on `side`: each pair in every scenario that has
/// both of its variants (in run order), pairs in the order given.
fn resolve_pairs(side: &Side, pairs: &[PairSpec]) -> Result<Vec<Resolved>, ReportError> {
    let have = keys(side);
    let mut scenarios: Vec<String> = Vec::new();
    let mut sorted = have.clone();
    sorted.sort_by_key(|k| (position(&side.run, k), k.clone()));
    for (s, _) in &sorted {
        if !scenarios.contains(s) {
            scenarios.push(s.clone());
        }
    }
    let mut out: Vec<Resolved> = Vec::new();
    for p in pairs {
        let mut found = false;
        for s in &scenarios {
            if p.base.scenario.as_ref().is_some_and(|x| x != s) {
                continue;
            }
            let base = (s.clone(), p.base.variant.clone());
            let other = (
                p.other.scenario.clone().unwrap_or_else(|| s.clone()),
                p.other.variant.clone(),
            );
            if have.contains(&base) && have.contains(&other) {
                found = true;
                if !out.contains(&(base.clone(), other.clone())) {
                    out.push((base, other));
                }
            }
        }
        if !found {
            return Err(ReportError::PairNotFound {
                pair: p.to_string(),
                side: format!("{} in {}", side.kernel, side.dir.display()),
                have: sorted
                    .iter()
                    .map(|(s, v)| format!("{s}/{v}"))
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
    }
    Ok(out)
}

/// A side's ok records of one (scenario, variant) and how many failed.
fn pick<'a>(side: &'a Side, (s, v): &Key) -> (Vec<&'a ResultRecord>, usize) {
    let all: Vec<&ResultRecord> = side
        .records
        .iter()
        .filter(|r| &r.scenario == s && &r.variant == v)
        .collect();
    let ok: Vec<&ResultRecord> = all.iter().copied().filter(|r| r.ok).collect();
    let failed = all.len() - ok.len();
    (ok, failed)
}

/// Every metric's samples over `records` (metrics without data left out).
fn samples(records: &[&ResultRecord]) -> BTreeMap<String, Vec<f64>> {
    metrics::METRICS
        .iter()
        .filter_map(|m| {
            let v: Vec<f64> = records.iter().filter_map(|r| (m.get)(r)).collect();
            (!v.is_empty()).then(|| (m.key.to_string(), v))
        })
        .collect()
}

fn labels_of(records: &[&ResultRecord]) -> RowLabels {
    records
        .first()
        .map(|r| metrics::row_labels(r))
        .unwrap_or_default()
}

fn check_metric_keys(metric_keys: &[String]) -> Result<(), ReportError> {
    for k in metric_keys {
        if metrics::find(k).is_none() {
            return Err(ReportError::UnknownMetric(
                k.clone(),
                metrics::METRICS
                    .iter()
                    .map(|m| m.key)
                    .collect::<Vec<_>>()
                    .join(", "),
            ));
        }
    }
    Ok(())
}

fn refuse_blocking(diffs: &[Difference], force: bool) -> Result<(), ReportError> {
    let blocking: Vec<&Difference> = diffs.iter().filter(|d| d.blocking).collect();
    if !blocking.is_empty() && !force {
        return Err(ReportError::Differs(
            blocking
                .iter()
                .map(|d| format!("{}: A {} / B {}", d.what, d.a, d.b))
                .collect::<Vec<_>>()
                .join("; "),
        ));
    }
    Ok(())
}

/// A variant defined differently on the two sides is not comparable.
fn definitions_across(a: &Side, b: &Side, keys: &[Key]) -> Vec<Difference> {
    let mut out = Vec::new();
    for k in keys {
        let def = |side: &Side| definition(side, k).map(json_text).unwrap_or_default();
        let (da, db) = (def(a), def(b));
        if da != db {
            out.push(Difference {
                what: format!("definition of {}/{}", k.0, k.1),
                a: da,
                b: db,
                blocking: true,
                by_design: false,
            });
        }
    }
    out
}

/// How the variants of each pair differ (by design: never blocking).
fn pair_definitions(side: &Side, rows: &[Resolved]) -> Vec<Difference> {
    let mut out = Vec::new();
    for r in rows {
        let (Some(x), Some(y)) = (definition(side, &r.0), definition(side, &r.1)) else {
            continue;
        };
        if let Some((da, db)) = definition_difference(x, y) {
            out.push(Difference {
                what: format!("variants {}", row_pair(r).name()),
                a: da,
                b: db,
                blocking: false,
                by_design: true,
            });
        }
    }
    out
}

fn info(s: &Side) -> SideInfo {
    SideInfo {
        dir: s.dir.clone(),
        kernel: s.kernel.clone(),
        kernel_spec: s
            .records
            .first()
            .map(|r| r.kernel_spec.clone())
            .unwrap_or_default(),
        records: s.records.len(),
    }
}

/// Holm over every comparison and difference in differences the report
/// shows (the metrics asked for).
fn correct(rows: &mut [Row], metric_keys: &[String], confidence: f64) {
    let mut shown: Vec<&mut dyn Tested> = Vec::new();
    for r in rows.iter_mut() {
        for (k, c) in r.metrics.iter_mut() {
            if metric_keys.contains(k) {
                shown.push(c);
            }
        }
        for (k, c) in r.did.iter_mut() {
            if metric_keys.contains(k) {
                shown.push(&mut c.a);
                shown.push(&mut c.b);
                shown.push(&mut c.did);
            }
        }
    }
    inference::holm(&mut shown, confidence);
}

/// Build the comparison of `b` against `a` (profiles with
/// [`profile::DEFAULT_TOP`] functions a row).
pub(crate) fn build(
    a: &Side,
    b: &Side,
    metric_keys: &[String],
    confidence: f64,
    force: bool,
) -> Result<Report, ReportError> {
    build_with_top(a, b, metric_keys, confidence, force, profile::DEFAULT_TOP)
}

/// [`build`] with `profile_top` functions per row in the differential
/// instruction profile.
pub fn build_with_top(
    a: &Side,
    b: &Side,
    metric_keys: &[String],
    confidence: f64,
    force: bool,
    profile_top: usize,
) -> Result<Report, ReportError> {
    check_metric_keys(metric_keys)?;
    let (ka, kb) = (keys(a), keys(b));
    let only_a: Vec<String> = ka
        .iter()
        .filter(|k| !kb.contains(k))
        .map(|(s, v)| format!("{s}/{v}"))
        .collect();
    let only_b: Vec<String> = kb
        .iter()
        .filter(|k| !ka.contains(k))
        .map(|(s, v)| format!("{s}/{v}"))
        .collect();
    if (!only_a.is_empty() || !only_b.is_empty()) && !force {
        return Err(ReportError::ScenarioSets {
            only_a: only_a.join(", "),
            only_b: only_b.join(", "),
        });
    }
    let mut common: Vec<Key> = ka.into_iter().filter(|k| kb.contains(k)).collect();
    // Rows in the order the scenarios define their variants.
    common.sort_by_key(|k| (position(&a.run, k), k.clone()));
    if common.is_empty() {
        return Err(ReportError::NothingInCommon);
    }
    let mut diffs = differences(a, b);
    diffs.extend(definitions_across(a, b, &common));
    refuse_blocking(&diffs, force)?;
    let mut profiles = Vec::new();
    let mut rows: Vec<Row> = common
        .iter()
        .map(|k| {
            let (ra, fa) = pick(a, k);
            let (rb, fb) = pick(b, k);
            if let Some(mut p) = profile::row_profile(&k.0, &k.1, &ra, &rb, profile_top) {
                p.a_label.clone_from(&a.kernel);
                p.b_label.clone_from(&b.kernel);
                profiles.push(p);
            }
            let (sa, sb) = (samples(&ra), samples(&rb));
            let m = sa
                .iter()
                .filter_map(|(key, xa)| {
                    let xb = sb.get(key)?;
                    Some((key.clone(), inference::compare(xa, xb, confidence)))
                })
                .collect();
            Row {
                scenario: k.0.clone(),
                variant: k.1.clone(),
                pair: None,
                labels: labels_of(if ra.is_empty() { &rb } else { &ra }),
                labels_other: None,
                failed_a: fa,
                failed_b: fb,
                metrics: m,
                did: BTreeMap::new(),
                groups: vec![
                    Group::new(format!("A {}", a.kernel), 0, k, sa),
                    Group::new(format!("B {}", b.kernel), 1, k, sb),
                ],
            }
        })
        .collect();
    correct(&mut rows, metric_keys, confidence);
    Ok(Report {
        schema: "blklab-compare/1",
        mode: Mode::Kernels,
        a: info(a),
        b: info(b),
        pairs: Vec::new(),
        confidence,
        metrics: metric_keys.to_vec(),
        rows,
        differences: diffs,
        forced: force,
        profiles,
    })
}

/// The labels of a pair's other variant, when they differ from the base's.
fn other_labels(base: &RowLabels, other: &[&ResultRecord]) -> Option<RowLabels> {
    let o = labels_of(other);
    (!other.is_empty() && &o != base).then_some(o)
}

/// Variant against variant on one kernel: for each pair, its other variant
/// (B) against its base (A), in every scenario that has both.
pub fn build_pairs(
    side: &Side,
    pairs: &[PairSpec],
    metric_keys: &[String],
    confidence: f64,
    force: bool,
    profile_top: usize,
) -> Result<Report, ReportError> {
    check_metric_keys(metric_keys)?;
    let resolved = resolve_pairs(side, pairs)?;
    let diffs = pair_definitions(side, &resolved);
    let mut profiles = Vec::new();
    let mut rows: Vec<Row> = resolved
        .iter()
        .map(|rp| {
            let (base, other) = rp;
            let (ra, fa) = pick(side, base);
            let (rb, fb) = pick(side, other);
            let pair = row_pair(rp);
            if let Some(mut p) = profile::row_profile(&base.0, &base.1, &ra, &rb, profile_top) {
                p.a_label.clone_from(&pair.base);
                p.b_label.clone_from(&pair.other);
                p.pair = Some(pair.clone());
                profiles.push(p);
            }
            let (sa, sb) = (samples(&ra), samples(&rb));
            let m = sa
                .iter()
                .filter_map(|(key, xa)| {
                    let xb = sb.get(key)?;
                    Some((key.clone(), inference::compare(xa, xb, confidence)))
                })
                .collect();
            let labels = labels_of(&ra);
            Row {
                scenario: base.0.clone(),
                variant: base.1.clone(),
                labels_other: other_labels(&labels, &rb),
                labels,
                failed_a: fa,
                failed_b: fb,
                metrics: m,
                did: BTreeMap::new(),
                groups: vec![
                    Group::new(format!("A {}", pair.base), 0, base, sa),
                    Group::new(format!("B {}", pair.other), 1, other, sb),
                ],
                pair: Some(pair),
            }
        })
        .collect();
    correct(&mut rows, metric_keys, confidence);
    Ok(Report {
        schema: "blklab-compare/1",
        mode: Mode::Variants,
        a: info(side),
        b: info(side),
        pairs: pairs.iter().map(|p| p.to_string()).collect(),
        confidence,
        metrics: metric_keys.to_vec(),
        rows,
        differences: diffs,
        forced: force,
        profiles,
    })
}

/// The difference in differences: each pair's effect on kernel B against
/// its effect on kernel A (see [`inference::DiffInDiff`]).
pub fn build_did(
    a: &Side,
    b: &Side,
    pairs: &[PairSpec],
    metric_keys: &[String],
    confidence: f64,
    force: bool,
    profile_top: usize,
) -> Result<Report, ReportError> {
    check_metric_keys(metric_keys)?;
    let (pa, pb) = (resolve_pairs(a, pairs)?, resolve_pairs(b, pairs)?);
    let name = |r: &Resolved| row_pair(r).name();
    let only_a: Vec<String> = pa.iter().filter(|r| !pb.contains(r)).map(name).collect();
    let only_b: Vec<String> = pb.iter().filter(|r| !pa.contains(r)).map(name).collect();
    if (!only_a.is_empty() || !only_b.is_empty()) && !force {
        return Err(ReportError::PairSets {
            only_a: only_a.join(", "),
            only_b: only_b.join(", "),
        });
    }
    let common: Vec<Resolved> = pa.into_iter().filter(|r| pb.contains(r)).collect();
    if common.is_empty() {
        return Err(ReportError::NothingInCommon);
    }
    let mut used: Vec<Key> = Vec::new();
    for (x, y) in &common {
        for k in [x, y] {
            if !used.contains(k) {
                used.push(k.clone());
            }
        }
    }
    let mut diffs = differences(a, b);
    diffs.extend(definitions_across(a, b, &used));
    refuse_blocking(&diffs, force)?;
    diffs.extend(pair_definitions(a, &common));
    let mut profiles = Vec::new();
    let mut rows: Vec<Row> = common
        .iter()
        .map(|rp| {
            let (base, other) = rp;
            let pair = row_pair(rp);
            let (rab, fab) = pick(a, base);
            let (rao, fao) = pick(a, other);
            let (rbb, fbb) = pick(b, base);
            let (rbo, fbo) = pick(b, other);
            for (side, rx, ry) in [(a, &rab, &rao), (b, &rbb, &rbo)] {
                if let Some(mut p) = profile::row_profile(&base.0, &base.1, rx, ry, profile_top) {
                    p.a_label = format!("{} on {}", pair.base, side.kernel);
                    p.b_label = format!("{} on {}", pair.other, side.kernel);
                    p.pair = Some(pair.clone());
                    p.kernel = Some(side.kernel.clone());
                    profiles.push(p);
                }
            }
            let s = [samples(&rab), samples(&rao), samples(&rbb), samples(&rbo)];
            let mut did = BTreeMap::new();
            for m in metrics::METRICS {
                let g: Vec<&Vec<f64>> = s.iter().filter_map(|x| x.get(m.key)).collect();
                let [ab, ao, bb, bo] = g.as_slice() else {
                    continue;
                };
                did.insert(
                    m.key.to_string(),
                    DidCell {
                        a: inference::compare(ab, ao, confidence),
                        b: inference::compare(bb, bo, confidence),
                        did: inference::did(ab, ao, bb, bo, confidence),
                    },
                );
            }
            let labels = labels_of(&rab);
            let [sab, sao, sbb, sbo] = s;
            Row {
                scenario: base.0.clone(),
                variant: base.1.clone(),
                labels_other: other_labels(&labels, &rao),
                labels,
                failed_a: fab + fao,
                failed_b: fbb + fbo,
                metrics: BTreeMap::new(),
                did,
                groups: vec![
                    Group::new(format!("A {} {}", a.kernel, base.1), 0, base, sab),
                    Group::new(format!("A {} {}", a.kernel, other.1), 0, other, sao),
                    Group::new(format!("B {} {}", b.kernel, base.1), 1, base, sbb),
                    Group::new(format!("B {} {}", b.kernel, other.1), 1, other, sbo),
                ],
                pair: Some(pair),
            }
        })
        .collect();
    correct(&mut rows, metric_keys, confidence);
    Ok(Report {
        schema: "blklab-compare/1",
        mode: Mode::Did,
        a: info(a),
        b: info(b),
        pairs: pairs.iter().map(|p| p.to_string()).collect(),
        confidence,
        metrics: metric_keys.to_vec(),
        rows,
        differences: diffs,
        forced: force,
        profiles,
    })
}

/// What `blklab compare` was asked.
#[derive(Debug, Clone)]
pub struct Request {
    /// `DIR`, `DIR:KERNEL`, or two of them.
    pub sides: Vec<String>,
    pub pairs: Vec<PairSpec>,
    /// Empty: the defaults for the records; `all`: every metric.
    pub metrics: Vec<String>,
    pub confidence: f64,
    pub force: bool,
    pub profile_top: usize,
}

/// A report and the sides it read (the same side twice for variant pairs
/// on one kernel).
pub struct Compared {
    pub report: Report,
    pub a: Side,
    pub b: Side,
}

/// `blklab compare`: one DIR holding two kernels, or two sides, compare
/// kernels (with `--pair`, the pairs' difference in differences); one side
/// of one kernel (`DIR` of one kernel, or `DIR:KERNEL`) with `--pair`
/// compares the pairs' variants.
pub fn run(req: &Request) -> Result<Compared, ReportError> {
    if !(req.confidence > 0.5 && req.confidence < 1.0) {
        return Err(ReportError::Usage(
            "--confidence must be between 0.5 and 1 (e.g. 0.95)".into(),
        ));
    }
    let (a, b) = match (req.sides.as_slice(), req.pairs.is_empty()) {
        ([one], true) => {
            let (a, b) = load_pair(one)?;
            (a, Some(b))
        }
        ([one], false) => {
            let (dirs, kernel) = split_arg(one);
            if kernel.is_some() {
                (load_side(one)?, None)
            } else {
                let (run, records) = load_dirs(&dirs)?;
                let dir = dirs_label(&dirs);
                let ks = kernels(&run, &records);
                match ks.as_slice() {
                    [k] => (side_of(&dir, &run, &records, k), None),
                    [x, y] => (
                        side_of(&dir, &run, &records, x),
                        Some(side_of(&dir, &run, &records, y)),
                    ),
                    _ => {
                        return Err(ReportError::Ambiguous {
                            n: ks.len(),
                            have: ks.join(", "),
                            dir,
                        })
                    }
                }
            }
        }
        ([x, y], _) => (load_side(x)?, Some(load_side(y)?)),
        _ => {
            return Err(ReportError::Usage(
                "give one or two sides (DIR or DIR:KERNEL)".into(),
            ))
        }
    };
    let keys: Vec<String> = if req.metrics.is_empty() {
        metrics::default_metrics(a.records.iter().chain(b.iter().flat_map(|b| &b.records)))
    } else if req.metrics.iter().any(|m| m == "all") {
        metrics::METRICS.iter().map(|m| m.key.to_string()).collect()
    } else {
        req.metrics.clone()
    };
    let (c, f, t) = (req.confidence, req.force, req.profile_top);
    Ok(match b {
        None => Compared {
            report: build_pairs(&a, &req.pairs, &keys, c, f, t)?,
            b: a.clone(),
            a,
        },
        Some(b) if req.pairs.is_empty() => Compared {
            report: build_with_top(&a, &b, &keys, c, f, t)?,
            a,
            b,
        },
        Some(b) => Compared {
            report: build_did(&a, &b, &req.pairs, &keys, c, f, t)?,
            a,
            b,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::result::test_record;
    use serde_json::json;

    #[test]
    fn pairs_parse() {
        let p = PairSpec::parse("single-queue:host-tags").unwrap();
        assert_eq!(p.base.variant, "single-queue");
        assert_eq!(p.other.variant, "host-tags");
        assert_eq!(p.base.scenario, None);
        let p = PairSpec::parse("seed000-scsi-debug/single-queue:host-tags").unwrap();
        assert_eq!(p.other.scenario.as_deref(), Some("seed000-scsi-debug"));
        assert_eq!(
            p.to_string(),
            "seed000-scsi-debug/single-queue:seed000-scsi-debug/host-tags"
        );
        let p = PairSpec::parse("a/x:b/y").unwrap();
        assert_eq!(
            row_pair(&(("a".into(), "x".into()), ("b".into(), "y".into()))).name(),
            "a/x → b/y"
        );
        assert_eq!(p.other.scenario.as_deref(), Some("b"));
        for bad in ["x", "x:", ":y", "x:x", "/x:y", "x:y:z"] {
            assert!(PairSpec::parse(bad).is_err(), "{bad}");
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
