//! Building an A/B comparison from `blklab run` output directories.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;
use thiserror::Error;

use crate::record::metrics::{self, RowLabels};
use crate::record::result::{ResultRecord, RESULT_SCHEMA};
use crate::record::run::RunDocument;
use crate::record::RecordError;
use crate::report::inference::{self, Comparison};
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
            records.push(crate::record::from_value(&f, &v)?);
        }
    }
    if records.is_empty() {
        return Err(ReportError::Empty {
            dir: dir.to_path_buf(),
        });
    }
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

/// `DIR` or `DIR:KERNEL` → (dir, kernel).
fn split_arg(arg: &str) -> (PathBuf, Option<String>) {
    if Path::new(arg).is_dir() {
        return (PathBuf::from(arg), None);
    }
    match arg.rsplit_once(':') {
        Some((d, k)) if Path::new(d).is_dir() && !k.is_empty() => {
            (PathBuf::from(d), Some(k.to_string()))
        }
        _ => (PathBuf::from(arg), None),
    }
}

/// One side from `DIR` (a run with one kernel) or `DIR:KERNEL`.
pub fn load_side(arg: &str) -> Result<Side, ReportError> {
    let (dir, kernel) = split_arg(arg);
    let (run, records) = load_dir(&dir)?;
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
pub fn load_pair(dir: &Path) -> Result<(Side, Side), ReportError> {
    let (run, records) = load_dir(dir)?;
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

/// One (scenario, variant) row.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub scenario: String,
    pub variant: String,
    pub labels: RowLabels,
    /// Failed records left out, per side.
    pub failed_a: usize,
    pub failed_b: usize,
    /// metric key → comparison (only metrics with data on both sides).
    pub metrics: BTreeMap<String, Comparison>,
    /// metric key → per-side sample values, for plots.
    #[serde(skip)]
    pub samples: BTreeMap<String, (Vec<f64>, Vec<f64>)>,
}

/// Something other than the kernel that differs between the sides.
#[derive(Debug, Clone, Serialize)]
pub struct Difference {
    pub what: String,
    pub a: String,
    pub b: String,
    /// Refuses the comparison unless forced.
    pub blocking: bool,
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
    pub a: SideInfo,
    pub b: SideInfo,
    pub confidence: f64,
    pub metrics: Vec<String>,
    pub rows: Vec<Row>,
    pub differences: Vec<Difference>,
    pub forced: bool,
    /// The differential instruction profile per row (records with
    /// `instructions` on both sides only).
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
    check(
        "QEMU version",
        json_text(&a.run.qemu.version),
        json_text(&b.run.qemu.version),
        false,
    );
    check(
        "accelerator",
        json_text(&a.run.accel),
        json_text(&b.run.accel),
        false,
    );
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
    let keys = |s: &Side| {
        let mut v: Vec<(String, String)> = Vec::new();
        for r in &s.records {
            let k = (r.scenario.clone(), r.variant.clone());
            if !v.contains(&k) {
                v.push(k);
            }
        }
        v
    };
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
    let mut common: Vec<(String, String)> = ka.into_iter().filter(|k| kb.contains(k)).collect();
    // Rows in the order the scenarios define their variants.
    let position = |(s, v): &(String, String)| -> (usize, usize) {
        a.run
            .scenarios
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
    };
    common.sort_by_key(|k| (position(k), k.clone()));
    if common.is_empty() {
        return Err(ReportError::NothingInCommon);
    }
    let mut diffs = differences(a, b);
    // A variant defined differently on the two sides is not comparable.
    for (s, v) in &common {
        let def = |side: &Side| {
            side.records
                .iter()
                .find(|r| &r.scenario == s && &r.variant == v)
                .map(|r| json_text(&r.scenario_definition))
                .unwrap_or_default()
        };
        let (da, db) = (def(a), def(b));
        if da != db {
            diffs.push(Difference {
                what: format!("definition of {s}/{v}"),
                a: da,
                b: db,
                blocking: true,
            });
        }
    }
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
    let mut profiles = Vec::new();
    let mut rows: Vec<Row> = common
        .iter()
        .map(|(s, v)| {
            fn pick<'a>(side: &'a Side, s: &str, v: &str) -> (Vec<&'a ResultRecord>, usize) {
                let all: Vec<&ResultRecord> = side
                    .records
                    .iter()
                    .filter(|r| r.scenario == s && r.variant == v)
                    .collect();
                let ok: Vec<&ResultRecord> = all.iter().copied().filter(|r| r.ok).collect();
                let failed = all.len() - ok.len();
                (ok, failed)
            }
            let (ra, fa) = pick(a, s, v);
            let (rb, fb) = pick(b, s, v);
            if let Some(p) = profile::row_profile(s, v, &ra, &rb, profile_top) {
                profiles.push(p);
            }
            let mut m = BTreeMap::new();
            let mut samples = BTreeMap::new();
            for metric in metrics::METRICS {
                let xa: Vec<f64> = ra.iter().filter_map(|r| (metric.get)(r)).collect();
                let xb: Vec<f64> = rb.iter().filter_map(|r| (metric.get)(r)).collect();
                if xa.is_empty() || xb.is_empty() {
                    continue;
                }
                m.insert(
                    metric.key.to_string(),
                    inference::compare(&xa, &xb, confidence),
                );
                samples.insert(metric.key.to_string(), (xa, xb));
            }
            let labels = ra
                .first()
                .or(rb.first())
                .map(|r| metrics::row_labels(r))
                .unwrap_or_default();
            Row {
                scenario: s.clone(),
                variant: v.clone(),
                labels,
                failed_a: fa,
                failed_b: fb,
                metrics: m,
                samples,
            }
        })
        .collect();
    // Significance is corrected over every comparison the report shows.
    {
        let mut shown: Vec<&mut Comparison> = rows
            .iter_mut()
            .flat_map(|r| {
                r.metrics
                    .iter_mut()
                    .filter(|(k, _)| metric_keys.contains(k))
                    .map(|(_, c)| c)
            })
            .collect();
        inference::holm(&mut shown, confidence);
    }
    let info = |s: &Side| SideInfo {
        dir: s.dir.clone(),
        kernel: s.kernel.clone(),
        kernel_spec: s
            .records
            .first()
            .map(|r| r.kernel_spec.clone())
            .unwrap_or_default(),
        records: s.records.len(),
    };
    Ok(Report {
        schema: "blklab-compare/1",
        a: info(a),
        b: info(b),
        confidence,
        metrics: metric_keys.to_vec(),
        rows,
        differences: diffs,
        forced: force,
        profiles,
    })
}
