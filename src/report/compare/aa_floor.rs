//! The A/A floor. A run that measured one kernel under two labels
//! (`--kernel build:6.12 --kernel build:6.12`, the second labelled
//! `6.12-2`) holds two sides that differ only by run-to-run noise: their
//! difference per row and metric is the floor below which a delta of the
//! same run means nothing. This module finds which labels of a run are one
//! kernel, the pair a kernel comparison takes its floor from, and each
//! row's floor, computed with the inference the row's own delta uses.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use super::{pick, Key, Report, Row, Subject};
use crate::record::result::ResultRecord;
use crate::record::run::RunDocument;
use crate::report::inference::{self, Comparison, Interval, Method};
use crate::report::load::{self, Side};

/// The manifest fields that name a kernel, strongest first. The sha256 of
/// the image that booted names the bytes themselves; the hash of the
/// recipe and inputs it was built or fetched from names a recipe, and a
/// kernel build is not bit-reproducible (timestamps, build ids), so two
/// builds of one recipe need not be one image. Two labels are told apart
/// by the first field both manifests have (a label given twice in a run
/// is prepared once, so both carry the same image hash).
const IDENTITY_FIELDS: [&str; 2] = ["vmlinuz_sha256", "inputs_hash"];

/// How many characters of a hash a report shows.
const HASH_SHOWN: usize = 12;

/// The run's A/A pair a kernel comparison takes its floor from.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct AaPair {
    /// The pair's labels in run order: the floor is `second` against
    /// `first`.
    pub(crate) first: String,
    pub(crate) second: String,
    /// What makes them one kernel: the `--kernel` SPEC and the manifests'
    /// identity, when they have one.
    pub(crate) same_kernel: String,
    /// The comparison is of two labels of one kernel itself (`first` is A,
    /// `second` is B): its deltas are the floor, not findings, and its
    /// rows have no floor of their own.
    pub(crate) this_comparison: bool,
}

/// One metric's A/A floor in one row.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct AaFloor {
    /// (mean second − mean first) / |mean first| × 100.
    pub(crate) diff_pct: f64,
    /// Its interval, as % of |mean first|, by the inference the row's
    /// delta uses (Welch, bootstrap or the wider of both).
    pub(crate) ci_pct: Option<Interval>,
    pub(crate) method: Method,
    /// Samples of `first` and `second`.
    pub(crate) n: [usize; 2],
    /// The row's |delta| is not above |diff_pct|: the delta is within the
    /// floor, and the verdict does not call it an effect.
    pub(crate) within: bool,
}

impl AaFloor {
    /// The floor `aa` (second against first) beside a row's `delta` (%).
    fn new(aa: &Comparison, delta_pct: f64) -> AaFloor {
        AaFloor {
            diff_pct: aa.delta_pct,
            ci_pct: aa.ci_pct,
            method: aa.outcome.method,
            n: [aa.a.n, aa.b.n],
            within: within(delta_pct, aa.delta_pct),
        }
    }
}

/// Is a delta within the floor? Its magnitude is not above the floor's.
/// The floor is one measured difference between sides that differ only by
/// noise, so a delta no larger than it says no more than that noise did;
/// the floor's own interval is shown beside it for the reader.
fn within(delta_pct: f64, floor_pct: f64) -> bool {
    delta_pct.is_finite() && floor_pct.is_finite() && delta_pct.abs() <= floor_pct.abs()
}

/// What names a label's kernel: its `--kernel` SPEC and its image
/// manifest (a record's, else run.json's).
struct KernelId<'a> {
    spec: Option<&'a str>,
    manifest: Option<&'a Value>,
}

impl<'a> KernelId<'a> {
    fn of(run: &'a RunDocument, records: &'a [ResultRecord], label: &str) -> KernelId<'a> {
        let mine = || records.iter().filter(move |r| r.kernel == label);
        let entry = run.kernels.iter().find(|k| k.label == label);
        KernelId {
            spec: mine()
                .map(|r| r.kernel_spec.as_str())
                .next()
                .or(entry.map(|k| k.spec.as_str())),
            manifest: mine()
                .find_map(|r| r.manifests.kernel.as_ref())
                .or(entry.and_then(|k| k.manifests.kernel.as_ref())),
        }
    }

    fn field(&self, name: &str) -> Option<&'a str> {
        self.manifest?.get(name)?.as_str()
    }
}

/// Whether two labels are one kernel: the same SPEC and, where both
/// manifests name the kernel, the same strongest identity. Returns what
/// made them one.
fn same_kernel(a: &KernelId, b: &KernelId) -> Option<String> {
    let spec = a.spec.filter(|s| Some(*s) == b.spec)?;
    let shared = IDENTITY_FIELDS
        .iter()
        .find_map(|f| Some((*f, a.field(f)?, b.field(f)?)));
    match shared {
        Some((_, x, y)) if x != y => None,
        Some((f, x, _)) => {
            let shown: String = x.chars().take(HASH_SHOWN).collect();
            Some(format!("--kernel {spec}, {f} {shown}…"))
        }
        None => Some(format!("--kernel {spec}")),
    }
}

/// The run's A/A pair for a comparison of `a` against `b`, both read from
/// one run (sides of two runs have none: their deltas hold the runs'
/// differences too). When `a` and `b` are one kernel, they are the pair.
/// Otherwise the first two labels in run order of the kernel A is, else
/// of the kernel B is, else of the first kernel the run measured more than
/// once.
pub(crate) fn pair(a: &Side, b: &Side) -> Option<AaPair> {
    if a.dir != b.dir || load::id_of(&a.run) != load::id_of(&b.run) {
        return None;
    }
    let (run, records) = (&a.run, a.run_records.as_slice());
    let id = |label: &str| KernelId::of(run, records, label);
    if let Some(same) = same_kernel(&id(&a.kernel), &id(&b.kernel)) {
        return Some(AaPair {
            first: a.kernel.clone(),
            second: b.kernel.clone(),
            same_kernel: same,
            this_comparison: true,
        });
    }
    let labels = load::kernels(run, records);
    let candidates: Vec<&String> = [&a.kernel, &b.kernel].into_iter().chain(&labels).collect();
    candidates.into_iter().find_map(|label| {
        let me = id(label);
        let mut group = labels.iter().filter(|l| same_kernel(&me, &id(l)).is_some());
        let (first, second) = (group.next()?, group.next()?);
        Some(AaPair {
            first: first.clone(),
            second: second.clone(),
            same_kernel: same_kernel(&id(first), &id(second))?,
            this_comparison: false,
        })
    })
}

/// Each metric's floor in a row: the pair's records of the row's
/// (scenario, variant), second against first, beside the row's delta
/// (metrics the pair has no data for have none).
fn floors(first: &Side, second: &Side, row: &Row, confidence: f64) -> BTreeMap<String, AaFloor> {
    let key: Key = (row.scenario.clone(), row.variant.clone());
    let (f, s) = (pick(first, &key), pick(second, &key));
    row.metrics
        .iter()
        .filter_map(|(k, c)| {
            let aa = inference::compare(f.samples.get(k)?, s.samples.get(k)?, confidence);
            Some((k.clone(), AaFloor::new(&aa, c.delta_pct)))
        })
        .collect()
}

/// The subject's A/A pair, and each row's floor (none when the
/// comparison is the pair itself).
pub(crate) fn attach(subject: &Subject, rows: &mut [Row], confidence: f64) -> Option<AaPair> {
    let pair = pair(subject.a, subject.b)?;
    if !pair.this_comparison {
        let (first, second) = (
            subject.a.sibling(&pair.first),
            subject.a.sibling(&pair.second),
        );
        for row in rows.iter_mut() {
            row.aa_floor = floors(&first, &second, row, confidence);
        }
    }
    Some(pair)
}

impl Report {
    /// The comparison is of two labels of one kernel: the run's A/A pair.
    pub(crate) fn is_aa(&self) -> bool {
        self.aa_pair.as_ref().is_some_and(|p| p.this_comparison)
    }

    /// Some row has an A/A floor to show beside its deltas.
    pub(crate) fn has_floors(&self) -> bool {
        self.rows.iter().any(|r| !r.aa_floor.is_empty())
    }

    /// The floor of a row's metric that its delta is within.
    pub(crate) fn within_floor<'a>(&self, row: &'a Row, key: &str) -> Option<&'a AaFloor> {
        row.aa_floor.get(key).filter(|f| f.within)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;

    use serde_json::json;

    use super::*;
    use crate::record::result::{test_cpu_all, test_record};
    use crate::report::compare::{build, KernelRows, Options};
    use crate::report::verdict::{judge, Call};

    const SHA: &str = "b32a4837f3a8f8a0f71b6268bac7ffaecb6a5ab4951f21a63c0e1f60da247e64";

    fn fixture_run() -> RunDocument {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/runs/aa");
        crate::record::read(&dir.join("run.json")).unwrap()
    }

    /// Records of kernel `label` (its SPEC and kernel manifest as given),
    /// one per guest busy % of `busy`.
    fn records(label: &str, spec: &str, manifest: Value, busy: &[f64]) -> Vec<ResultRecord> {
        busy.iter()
            .enumerate()
            .map(|(i, b)| {
                test_record(json!({
                    "kernel": label, "kernel_spec": spec, "iteration": i,
                    "manifests": {"kernel": manifest},
                    "guest": {"cpu": {"all": test_cpu_all(*b, b / 2.0, 0.0)}},
                }))
            })
            .collect()
    }

    /// The sides of one run read from `dir`, holding `all`.
    fn run_of(dir: &str, all: Vec<ResultRecord>) -> impl Fn(&str) -> Side {
        let (run, all) = (fixture_run(), Arc::new(all));
        let dir = dir.to_string();
        move |kernel| Side {
            dir: dir.clone().into(),
            kernel: kernel.to_string(),
            run: run.clone(),
            records: all.iter().filter(|r| r.kernel == kernel).cloned().collect(),
            run_records: Arc::clone(&all),
        }
    }

    fn image(sha: &str) -> Value {
        json!({"vmlinuz_sha256": sha, "inputs_hash": "same-recipe"})
    }

    /// A run of `build:6.12` twice and `build:6.12+noplug`, each side's
    /// guest busy % as given.
    fn three(first: &[f64], second: &[f64], other: &[f64]) -> impl Fn(&str) -> Side {
        let mut all = records("6.12", "build:6.12", image(SHA), first);
        all.extend(records("6.12-2", "build:6.12", image(SHA), second));
        all.extend(records(
            "6.12-noplug",
            "build:6.12+noplug",
            image("other"),
            other,
        ));
        run_of("run", all)
    }

    fn id<'a>(spec: &'a str, manifest: Option<&'a Value>) -> KernelId<'a> {
        KernelId {
            spec: Some(spec),
            manifest,
        }
    }

    #[test]
    fn one_kernel_is_one_spec_and_the_strongest_identity_both_manifests_have() {
        let (x, y) = (image(SHA), image("rebuilt"));
        let same = same_kernel(&id("build:6.12", Some(&x)), &id("build:6.12", Some(&x)));
        assert_eq!(
            same.as_deref(),
            Some("--kernel build:6.12, vmlinuz_sha256 b32a4837f3a8…")
        );
        // The same recipe built into another image is another kernel.
        assert!(same_kernel(&id("build:6.12", Some(&x)), &id("build:6.12", Some(&y))).is_none());
        assert!(same_kernel(&id("build:6.12", Some(&x)), &id("debian-6.12", Some(&x))).is_none());
        // Without an image hash on one side, the inputs hash decides.
        let recipe = json!({"inputs_hash": "same-recipe"});
        let same = same_kernel(&id("k", Some(&x)), &id("k", Some(&recipe))).unwrap();
        assert!(same.contains("inputs_hash same-recipe"), "{same}");
        let other = json!({"inputs_hash": "another"});
        assert!(same_kernel(&id("k", Some(&x)), &id("k", Some(&other))).is_none());
        // Without manifests, the spec alone.
        let same = same_kernel(&id("k", None), &id("k", Some(&x)));
        assert_eq!(same.as_deref(), Some("--kernel k"));
    }

    #[test]
    fn the_pair_is_the_first_two_labels_of_a_kernel_in_run_order() {
        let side = three(&[1.0], &[1.0], &[1.0]);
        let p = pair(&side("6.12"), &side("6.12-noplug")).unwrap();
        assert_eq!((p.first.as_str(), p.second.as_str()), ("6.12", "6.12-2"));
        assert!(!p.this_comparison);
        let p = pair(&side("6.12-noplug"), &side("6.12-2")).unwrap();
        assert_eq!((p.first.as_str(), p.second.as_str()), ("6.12", "6.12-2"));
        // The pair compared with itself.
        let p = pair(&side("6.12"), &side("6.12-2")).unwrap();
        assert!(p.this_comparison);
        // A third label of the kernel: still the first two.
        let mut all = records("6.12", "build:6.12", image(SHA), &[1.0]);
        for l in ["6.12-2", "6.12-3"] {
            all.extend(records(l, "build:6.12", image(SHA), &[1.0]));
        }
        all.extend(records("n", "build:6.12+noplug", image("other"), &[1.0]));
        let side = run_of("run", all);
        let p = pair(&side("n"), &side("6.12-3")).unwrap();
        assert_eq!((p.first.as_str(), p.second.as_str()), ("6.12", "6.12-2"));
        assert!(
            pair(&side("6.12-2"), &side("6.12-3"))
                .unwrap()
                .this_comparison
        );
    }

    #[test]
    fn a_run_without_two_labels_of_one_kernel_or_sides_of_two_runs_have_no_pair() {
        let mut all = records("6.12", "build:6.12", image(SHA), &[1.0]);
        all.extend(records("6.12-x", "build:6.12", image("rebuilt"), &[1.0]));
        all.extend(records("n", "build:6.12+noplug", image("other"), &[1.0]));
        let side = run_of("run", all);
        assert!(pair(&side("6.12"), &side("n")).is_none());
        assert!(pair(&side("6.12"), &side("6.12-x")).is_none());
        let side = three(&[1.0], &[1.0], &[1.0]);
        let elsewhere = three(&[1.0], &[1.0], &[1.0]);
        let mut b = elsewhere("6.12-noplug");
        b.dir = "another-run".into();
        assert!(pair(&side("6.12"), &b).is_none());
    }

    fn report(side: &impl Fn(&str) -> Side, a: &str, b: &str) -> Report {
        let (a, b) = (side(a), side(b));
        let subject = Subject {
            a: &a,
            b: &b,
            pairs: &[],
        };
        let opts = Options {
            confidence: 0.95,
            force: false,
            profile_top: 10,
        };
        build::<KernelRows>(&subject, &["guest_busy_pct".to_string()], &opts).unwrap()
    }

    #[test]
    fn each_row_has_the_pairs_difference_by_the_rows_own_inference() {
        let (first, second) = ([10.0, 10.2, 9.8], [12.5, 12.7, 12.3]);
        let side = three(&first, &second, &[12.0, 12.1, 11.9]);
        let r = report(&side, "6.12", "6.12-noplug");
        assert!(r.has_floors() && !r.is_aa());
        let floor = &r.rows[0].aa_floor["guest_busy_pct"];
        let aa = inference::compare(&first, &second, 0.95);
        assert_eq!(floor.diff_pct, aa.delta_pct);
        assert_eq!(floor.ci_pct, aa.ci_pct);
        assert_eq!(floor.method, aa.outcome.method);
        assert_eq!(floor.n, [3, 3]);
        // +20 % against a floor of +25 %: significant, yet within it, so no
        // effect.
        let c = &r.rows[0].metrics["guest_busy_pct"];
        assert!(c.outcome.significant && floor.within, "{c:?} {floor:?}");
        let v = &judge(&r)[0];
        assert_eq!(v.call, Call::WithinAaFloor);
        assert!(
            v.changes.is_empty() && v.within_aa_floor.len() == 1,
            "{v:?}"
        );
        assert!(
            v.words.contains("within the A/A floor of +25.0 %"),
            "{}",
            v.words
        );
    }

    #[test]
    fn a_delta_beyond_the_floor_is_called_and_the_pair_itself_is_aa() {
        let side = three(&[10.0, 10.2, 9.8], &[10.1, 10.3, 9.9], &[12.0, 12.1, 11.9]);
        let r = report(&side, "6.12", "6.12-noplug");
        assert!(!r.rows[0].aa_floor["guest_busy_pct"].within);
        assert_eq!(judge(&r)[0].call, Call::Significant);
        let r = report(&side, "6.12", "6.12-2");
        assert!(r.is_aa() && !r.has_floors());
        let v = &judge(&r)[0];
        assert_eq!(v.call, Call::Aa);
        assert!(
            v.words.starts_with("A/A: both sides are one kernel"),
            "{}",
            v.words
        );
    }

    #[test]
    fn within_is_a_magnitude_no_larger_than_the_floors() {
        assert!(within(-5.0, 5.0));
        assert!(within(3.0, -4.0));
        assert!(!within(5.1, 5.0));
        assert!(!within(f64::NAN, 5.0));
        assert!(!within(1.0, f64::NAN));
    }
}
