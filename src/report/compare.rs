//! Building an A/B comparison from the sides [`load`](crate::report::load)
//! read: one builder whose rows come from one of three resolvers
//! (`compare/resolvers.rs`: kernel against kernel, variant pairs on one
//! kernel, the pairs' difference in differences on two kernels), the
//! inference per metric and row, and the report's types.
//!
//! Whether the sides may be compared at all is decided by
//! [`comparability`](crate::report::comparability): each resolver names
//! the records its rows pool and compare, and the contract checks them.
//! This module knows neither how the sides are read from disk nor how the
//! report is rendered.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Serialize;
use thiserror::Error;

use crate::record::metrics::{self, RowLabels};
use crate::record::result::ResultRecord;
use crate::record::scenario::Variant;
pub(crate) use crate::report::comparability::check::Difference;
use crate::report::comparability::refusal::{
    checked_differences, forced_conditions, ComparabilityError,
};
use crate::report::comparability::vcpus;
use crate::report::coverage::{self, Coverage, CoverageError};
use crate::report::inference::{self, Comparison, DiffInDiff, Outcome};
use crate::report::load::{self, LoadError, Side};
use crate::report::profile::{self, RowProfile};

#[derive(Debug, Error)]
pub enum ReportError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("unknown metric {0:?} (known: {known})", known = metrics::known_keys())]
    UnknownMetric(String),
    #[error(transparent)]
    Comparability(#[from] ComparabilityError),
    #[error("bad --pair {0:?}: want BASE:OTHER, each VARIANT or SCENARIO/VARIANT (e.g. single-queue:host-tags)")]
    BadPair(String),
    #[error("--pair {pair}: no scenario of {side} has both variants (it has: {have})")]
    PairNotFound {
        pair: String,
        side: String,
        have: String,
    },
    #[error("--confidence must be between 0.5 and 1 (e.g. 0.95)")]
    Confidence(f64),
    #[error(transparent)]
    Coverage(#[from] CoverageError),
}

/// What a report compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Mode {
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
pub(crate) struct VariantRef {
    pub(crate) scenario: Option<String>,
    pub(crate) variant: String,
}

/// A variant pair as asked for: `BASE:OTHER`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PairSpec {
    pub(crate) base: VariantRef,
    pub(crate) other: VariantRef,
}

impl PairSpec {
    /// `BASE:OTHER`, each `VARIANT` or `SCENARIO/VARIANT`; a scenario given
    /// on one side only holds for both.
    pub(crate) fn parse(s: &str) -> Result<PairSpec, ReportError> {
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

pub(crate) use crate::report::profile::RowPair;

mod aa_floor;
mod resolvers;
pub(crate) use aa_floor::{AaFloor, AaPair};
pub(crate) use resolvers::{DidRows, KernelRows, PairRows, RowResolver, Subject};

/// (scenario, variant).
type Key = (String, String);

/// A pair resolved to one scenario: (base, other).
type Resolved = (Key, Key);

fn row_pair((b, o): &Resolved) -> RowPair {
    RowPair::of(b, o)
}

/// One row: a (scenario, variant) of two kernels, or a variant pair.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Row {
    /// The scenario (of the base variant, for pairs).
    pub(crate) scenario: String,
    /// The variant (the base variant, for pairs).
    pub(crate) variant: String,
    /// Pairs: the base (A) and other (B) variant of the row.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) pair: Option<RowPair>,
    pub(crate) labels: RowLabels,
    /// What the row measures: its scenario's description and the
    /// variant's target and scheduler (the base variant's, for pairs).
    pub(crate) about: String,
    /// Pairs: the other variant's labels, when they differ from the base's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) labels_other: Option<RowLabels>,
    /// Failed records left out, per side (for the difference in
    /// differences, over both variants of each kernel).
    pub(crate) failed_a: usize,
    pub(crate) failed_b: usize,
    /// metric key → comparison (only metrics with data on both sides);
    /// empty in a difference-in-differences report (see `did`).
    pub(crate) metrics: BTreeMap<String, Comparison>,
    /// Difference in differences: metric key → each kernel's pair effect
    /// and the difference in differences.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) did: BTreeMap<String, DidCell>,
    /// Kernels, in a run with an A/A pair beside the kernels compared:
    /// metric key → the pair's difference in this row (see
    /// [`Report::aa_pair`]).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) aa_floor: BTreeMap<String, AaFloor>,
    /// The row's groups of records with their samples, for plots.
    #[serde(skip)]
    pub(crate) groups: Vec<Group>,
}

impl Row {
    /// `SCENARIO/VARIANT`, or the pair's `SCENARIO/BASE → OTHER`.
    pub(crate) fn name(&self) -> String {
        match &self.pair {
            Some(p) => p.name(),
            None => format!("{}/{}", self.scenario, self.variant),
        }
    }
}

/// One metric of one row of a difference-in-differences report.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct DidCell {
    /// The pair's effect on kernel A (A = base, B = other).
    pub(crate) a: Comparison,
    /// The pair's effect on kernel B.
    pub(crate) b: Comparison,
    /// B's effect against A's.
    pub(crate) did: DiffInDiff,
}

/// One group of records of a row (a side's variant), for plots.
#[derive(Debug, Clone)]
pub(crate) struct Group {
    /// The legend of its series, e.g. `A debian-6.12` or `B smoke/write`.
    pub(crate) label: String,
    /// Which side's records: 0 = A, 1 = B.
    pub(crate) side: usize,
    pub(crate) scenario: String,
    pub(crate) variant: String,
    /// metric key → sample values.
    pub(crate) samples: BTreeMap<String, Vec<f64>>,
}

impl Group {
    /// The samples of one side's records of one (scenario, variant).
    fn new(label: String, side: usize, picked: Picked) -> Group {
        Group {
            label,
            side,
            scenario: picked.key.0.clone(),
            variant: picked.key.1.clone(),
            samples: picked.samples,
        }
    }
}

/// Description of a side in a report.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SideInfo {
    pub(crate) dir: PathBuf,
    pub(crate) kernel: String,
    pub(crate) kernel_spec: String,
    pub(crate) records: usize,
    /// The run the side's records come from.
    pub(crate) run: RunIdentity,
}

/// What a run was, from its run.json: what a reader needs to trust or
/// reproduce the numbers.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RunIdentity {
    /// When the run started, `YYYYmmdd-HHMMSS` UTC.
    pub(crate) started: String,
    pub(crate) accel: String,
    pub(crate) accel_reason: String,
    pub(crate) deterministic: bool,
    /// Guest instructions counted (`--count-insns`).
    pub(crate) instructions: bool,
    /// `qemu --version`'s first line.
    pub(crate) qemu: String,
    /// The distinct vCPU counts of the side's records.
    pub(crate) vcpus: String,
    pub(crate) iterations: u32,
    /// blklab's version and the commit it was built from.
    pub(crate) blklab: String,
    pub(crate) host: String,
}

fn run_identity(s: &Side) -> RunIdentity {
    let r = &s.run;
    let h = &r.host;
    let host = [
        h.hostname.clone(),
        h.cpus.map(|n| format!("{n} CPUs")),
        h.cpu_model.clone(),
        h.kernel.as_ref().map(|k| format!("Linux {k}")),
    ]
    .into_iter()
    .flatten()
    .collect::<Vec<_>>()
    .join(", ");
    RunIdentity {
        started: format!(
            "{} UTC",
            crate::util::wallclock::utc_stamp_of(r.started_unix as i64)
        ),
        accel: r.accel.describe().to_string(),
        accel_reason: r.accel_reason.clone(),
        deterministic: r.deterministic,
        instructions: r.count_insns.is_some(),
        qemu: r
            .qemu
            .version
            .clone()
            .unwrap_or_else(|| r.qemu.path.clone()),
        vcpus: vcpu_counts(s),
        iterations: r.iterations,
        blklab: format!("{} ({})", r.blklab_version, r.git_commit),
        host,
    }
}

/// A complete comparison.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub(crate) schema: &'static str,
    /// Forced over these differences (each `CONDITION: A … / B …`): every
    /// report format says so at its top. Empty unless forced over one.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) forced_over: Vec<String>,
    /// The records' vCPUs that could not all run at once (one line per
    /// distinct case: contention between vCPUs cannot show in them):
    /// every report format says so at its top, after `forced_over`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) parallelism_warnings: Vec<String>,
    pub(crate) mode: Mode,
    /// A's kernel (with variant pairs on one kernel, `a` and `b` are the
    /// same side and each row's `pair` says which variant is A and B).
    pub(crate) a: SideInfo,
    pub(crate) b: SideInfo,
    /// The `--pair` arguments, as given.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) pairs: Vec<String>,
    pub(crate) confidence: f64,
    pub(crate) metrics: Vec<String>,
    pub(crate) rows: Vec<Row>,
    pub(crate) differences: Vec<Difference>,
    pub(crate) forced: bool,
    /// The differential instruction profile per row (records with
    /// `instructions` on both sides only); with two kernels and pairs, one
    /// per kernel and row.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) profiles: Vec<profile::RowProfile>,
    /// `--coverage DIR`: the rows' would-be exits beside a nested run's
    /// KVM exits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) coverage: Option<Coverage>,
    /// Kernels: the run's A/A pair (one kernel under two labels), when the
    /// sides come from one run that has one; each row's `aa_floor` is its
    /// difference, unless the comparison is the pair itself.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) aa_pair: Option<AaPair>,
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

/// A variant's definition as a side recorded it (`None` when no record has
/// one).
fn definition<'a>(side: &'a Side, (s, v): &Key) -> Option<&'a Variant> {
    side.records
        .iter()
        .find(|r| &r.scenario == s && &r.variant == v)
        .and_then(|r| r.scenario_definition.as_ref())
}

/// What a row measures: the scenario's description, then the variant's
/// target and scheduler as the side recorded them.
fn about(side: &Side, key: &Key) -> String {
    let description = side
        .run
        .scenarios
        .iter()
        .find(|sc| sc.name == key.0)
        .and_then(|sc| sc.description.clone())
        .unwrap_or_else(|| format!("scenario {}", key.0));
    match definition(side, key) {
        Some(v) => format!(
            "{description}; variant {}: {} disk, scheduler {}",
            key.1,
            v.target.kind,
            v.sched.as_deref().unwrap_or("the kernel's default")
        ),
        None => format!("{description}; variant {}", key.1),
    }
}

/// A side's records of one (scenario, variant): the ok ones, how many
/// failed, and their samples.
struct Picked<'a> {
    key: &'a Key,
    records: Vec<&'a ResultRecord>,
    failed: usize,
    samples: BTreeMap<String, Vec<f64>>,
}

fn pick<'a>(side: &'a Side, key: &'a Key) -> Picked<'a> {
    let (s, v) = key;
    let all: Vec<&ResultRecord> = side
        .records
        .iter()
        .filter(|r| &r.scenario == s && &r.variant == v)
        .collect();
    let records: Vec<&ResultRecord> = all.iter().copied().filter(|r| r.ok).collect();
    Picked {
        key,
        failed: all.len() - records.len(),
        samples: samples(&records),
        records,
    }
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
            return Err(ReportError::UnknownMetric(k.clone()));
        }
    }
    Ok(())
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
        run: run_identity(s),
    }
}

/// The labels of a pair's other variant, when they differ from the base's.
fn other_labels(base: &RowLabels, other: &[&ResultRecord]) -> Option<RowLabels> {
    let o = labels_of(other);
    (!other.is_empty() && &o != base).then_some(o)
}

/// Holm over every comparison and difference in differences the report
/// shows (the metrics asked for).
fn correct(rows: &mut [Row], metric_keys: &[String], confidence: f64) {
    let mut shown: Vec<&mut Outcome> = Vec::new();
    for r in rows.iter_mut() {
        for (k, c) in r.metrics.iter_mut() {
            if metric_keys.contains(k) {
                shown.push(&mut c.outcome);
            }
        }
        for (k, c) in r.did.iter_mut() {
            if metric_keys.contains(k) {
                shown.push(&mut c.a.outcome);
                shown.push(&mut c.b.outcome);
                shown.push(&mut c.did.outcome);
            }
        }
    }
    inference::holm(&mut shown, confidence);
}

/// How a comparison is computed and what it lets through.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Options {
    /// The confidence of the intervals, and 1 − the family-wise level of
    /// the multiple-comparison correction (e.g. 0.95).
    pub(crate) confidence: f64,
    /// Compare the common rows of sides whose rows or setups differ.
    pub(crate) force: bool,
    /// Functions per row in the differential instruction profile.
    pub(crate) profile_top: usize,
}

/// Every metric's comparison of `b`'s samples against `a`'s (metrics with
/// data on both sides).
fn compare_samples(a: &Picked, b: &Picked, confidence: f64) -> BTreeMap<String, Comparison> {
    a.samples
        .iter()
        .filter_map(|(key, xa)| {
            let xb = b.samples.get(key)?;
            Some((key.clone(), inference::compare(xa, xb, confidence)))
        })
        .collect()
}

/// Every metric's difference in differences of the four groups (A base,
/// A other, B base, B other), with each kernel's pair effect.
fn did_cells(g: [&Picked; 4], confidence: f64) -> BTreeMap<String, DidCell> {
    let mut did = BTreeMap::new();
    for m in metrics::METRICS {
        let s: Vec<&Vec<f64>> = g.iter().filter_map(|x| x.samples.get(m.key)).collect();
        let [ab, ao, bb, bo] = s.as_slice() else {
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
    did
}

/// The differential profile of a row (`other` against `base` records),
/// its series named by `labels`.
fn labelled_profile(
    base: &Picked,
    other: &Picked,
    top: usize,
    labels: (String, String),
    pair: Option<&RowPair>,
    kernel: Option<&str>,
) -> Option<RowProfile> {
    let key = base.key;
    let mut p = profile::row_profile(&key.0, &key.1, &base.records, &other.records, top)?;
    (p.a_label, p.b_label) = labels;
    p.pair = pair.cloned();
    p.kernel = kernel.map(str::to_string);
    Some(p)
}

impl Row {
    /// A row of `key` (a pair's base) with no failures, cells or groups yet.
    fn new(
        key: &Key,
        pair: Option<RowPair>,
        labels: RowLabels,
        labels_other: Option<RowLabels>,
    ) -> Row {
        Row {
            scenario: key.0.clone(),
            variant: key.1.clone(),
            pair,
            labels,
            about: String::new(),
            labels_other,
            failed_a: 0,
            failed_b: 0,
            metrics: BTreeMap::new(),
            did: BTreeMap::new(),
            aa_floor: BTreeMap::new(),
            groups: Vec::new(),
        }
    }

    /// The row's cells and groups with two groups: B against A, legends
    /// `labels`.
    fn compared(mut self, a: Picked, b: Picked, labels: [String; 2], confidence: f64) -> Row {
        self.failed_a = a.failed;
        self.failed_b = b.failed;
        self.metrics = compare_samples(&a, &b, confidence);
        let [la, lb] = labels;
        self.groups = vec![Group::new(la, 0, a), Group::new(lb, 1, b)];
        self
    }
}

/// The comparison of `subject` with the rows resolver `R` gives: its rows,
/// what differs, the differential profiles and the multiple-comparison
/// correction.
pub(crate) fn build<R: RowResolver>(
    subject: &Subject,
    metric_keys: &[String],
    opts: &Options,
) -> Result<Report, ReportError> {
    check_metric_keys(metric_keys)?;
    let (keys, setup) = R::rows(subject, opts.force)?;
    let backend_metric = metric_keys.iter().any(|k| metrics::is_backend_metric(k));
    let check = R::check(subject, &keys, backend_metric);
    let differences = checked_differences(&check, setup, opts.force)?;
    let parallelism_warnings = check.parallelism_warnings();
    let forced_over = if opts.force {
        forced_conditions(&differences)
    } else {
        Vec::new()
    };
    let mut profiles = Vec::new();
    let mut rows: Vec<Row> = keys
        .iter()
        .map(|k| R::row(subject, k, opts, &mut profiles))
        .collect();
    correct(&mut rows, metric_keys, opts.confidence);
    let aa_pair = if R::MODE == Mode::Kernels {
        aa_floor::attach(subject, &mut rows, opts.confidence)
    } else {
        None
    };
    Ok(Report {
        schema: "blklab-compare/1",
        mode: R::MODE,
        a: info(subject.a),
        b: info(subject.b),
        pairs: subject.pairs.iter().map(|p| p.to_string()).collect(),
        confidence: opts.confidence,
        metrics: metric_keys.to_vec(),
        rows,
        differences,
        forced: opts.force,
        forced_over,
        parallelism_warnings,
        coverage: None,
        profiles,
        aa_pair,
    })
}

/// What `blklab compare` was asked.
#[derive(Debug, Clone)]
pub struct Request {
    /// `DIR`, `DIR:KERNEL`, or two of them.
    pub(crate) sides: Vec<String>,
    pub(crate) pairs: Vec<PairSpec>,
    /// Empty: the defaults for the records; `all`: every metric.
    pub(crate) metrics: Vec<String>,
    pub(crate) confidence: f64,
    pub(crate) force: bool,
    pub(crate) profile_top: usize,
    /// `--run ID`: the run to read in a directory holding several runs'
    /// records.
    pub(crate) runs: Vec<String>,
    /// `--coverage DIR`: a nested run of the same cases.
    pub(crate) coverage: Option<PathBuf>,
}

impl Request {
    fn options(&self) -> Options {
        Options {
            confidence: self.confidence,
            force: self.force,
            profile_top: self.profile_top,
        }
    }

    /// The metrics asked for: as given, every metric for `all`, else the
    /// defaults for the sides' records.
    fn metric_keys(&self, a: &Side, b: Option<&Side>) -> Vec<String> {
        if self.metrics.is_empty() {
            metrics::default_metrics(a.records.iter().chain(b.iter().flat_map(|b| &b.records)))
        } else if self.metrics.iter().any(|m| m == "all") {
            metrics::METRICS.iter().map(|m| m.key.to_string()).collect()
        } else {
            self.metrics.clone()
        }
    }
}

/// A report and the sides it read (the same side twice for variant pairs
/// on one kernel).
pub struct Compared {
    pub report: Report,
    pub(crate) a: Side,
    pub(crate) b: Side,
}

/// `blklab compare`: one DIR holding two kernels, or two sides, compare
/// kernels (with `--pair`, the pairs' difference in differences); one side
/// of one kernel (`DIR` of one kernel, or `DIR:KERNEL`) with `--pair`
/// compares the pairs' variants.
pub fn run(req: &Request) -> Result<Compared, ReportError> {
    if !(req.confidence > 0.5 && req.confidence < 1.0) {
        return Err(ReportError::Confidence(req.confidence));
    }
    let filter = load::RunFilter(&req.runs);
    let (a, b) = load::load_sides(&req.sides, !req.pairs.is_empty(), filter)?;
    let keys = req.metric_keys(&a, b.as_ref());
    let opts = req.options();
    let subject = Subject {
        a: &a,
        b: b.as_ref().unwrap_or(&a),
        pairs: &req.pairs,
    };
    let report = match (&b, req.pairs.is_empty()) {
        (None, _) => build::<PairRows>(&subject, &keys, &opts)?,
        (Some(_), true) => build::<KernelRows>(&subject, &keys, &opts)?,
        (Some(_), false) => build::<DidRows>(&subject, &keys, &opts)?,
    };
    let b = b.unwrap_or_else(|| a.clone());
    let mut report = report;
    if let Some(dir) = &req.coverage {
        report.coverage = Some(coverage::of(&cases(&report, [&a, &b]), dir)?);
    }
    Ok(Compared { report, a, b })
}

/// The cases of the report's rows on each side: (side, scenario, variant),
/// once each.
fn cases<'a>(report: &Report, sides: [&'a Side; 2]) -> Vec<(&'a Side, String, String)> {
    let mut out: Vec<(&Side, String, String)> = Vec::new();
    for row in &report.rows {
        let mut keys = vec![(row.scenario.clone(), row.variant.clone())];
        if let Some((s, v)) = row.pair.as_ref().and_then(|p| p.other.split_once('/')) {
            keys.push((s.to_string(), v.to_string()));
        }
        for side in sides {
            for (s, v) in &keys {
                let seen = |(x, a, b): &(&Side, String, String)| {
                    x.kernel == side.kernel && a == s && b == v
                };
                if !out.iter().any(seen) {
                    out.push((side, s.clone(), v.clone()));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
