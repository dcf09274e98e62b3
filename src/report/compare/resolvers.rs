//! The rows of a comparison: which rows each kind of report has (kernel
//! against kernel, variant pairs on one kernel, the pairs' difference in
//! differences), which records each row pools for the comparability
//! check, and how one row is made from the sides' records.

use super::{
    about, did_cells, labelled_profile, labels_of, other_labels, pick, row_pair, Group, Key, Mode,
    Options, PairSpec, ReportError, Resolved, Row,
};
use crate::record::run::RunDocument;
use crate::report::comparability::check::{Check, Difference};
use crate::report::comparability::refusal::{common_keys, ComparabilityError};
use crate::report::comparability::setup::setup_differences;
use crate::report::load::Side;
use crate::report::profile::RowProfile;

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

/// What a report compares: sides A and B (the same side twice for
/// variant pairs on one kernel) and the `--pair` arguments.
pub(crate) struct Subject<'a> {
    pub(crate) a: &'a Side,
    pub(crate) b: &'a Side,
    pub(crate) pairs: &'a [PairSpec],
}

/// Which rows a report of a [`Subject`] has, and how one row is made from
/// the sides' records.
pub(crate) trait RowResolver {
    /// What names a row: a (scenario, variant), or a pair resolved to
    /// its rows.
    type Key;
    const MODE: Mode;
    /// The rows, in report order, and what differs between the sides'
    /// setups besides the contract's conditions (shown, never blocking).
    fn rows(s: &Subject, force: bool) -> Result<(Vec<Self::Key>, Vec<Difference>), ReportError>;
    /// The records the rows pool and compare, for the comparability check.
    fn check<'a>(s: &Subject<'a>, keys: &[Self::Key], backend_metric: bool) -> Check<'a>;
    /// One row; its differential profiles go to `profiles`.
    fn row(s: &Subject, key: &Self::Key, opts: &Options, profiles: &mut Vec<RowProfile>) -> Row;
}

/// Kernel B against kernel A, row by row (scenario, variant).
pub(crate) struct KernelRows;

impl RowResolver for KernelRows {
    type Key = Key;
    const MODE: Mode = Mode::Kernels;

    fn rows(s: &Subject, force: bool) -> Result<(Vec<Key>, Vec<Difference>), ReportError> {
        let (a, b) = (s.a, s.b);
        let name = |(s, v): &Key| format!("{s}/{v}");
        let scenario_sets = |only_a, only_b| ComparabilityError::ScenarioSets { only_a, only_b };
        let mut common = common_keys(keys(a), &keys(b), name, force, scenario_sets)?;
        // Rows in the order the scenarios define their variants.
        common.sort_by_key(|k| (position(&a.run, k), k.clone()));
        Ok((common, setup_differences(a, b)))
    }

    fn check<'a>(s: &Subject<'a>, keys: &[Key], backend_metric: bool) -> Check<'a> {
        Check::kernels(s.a, s.b, keys, backend_metric)
    }

    fn row(s: &Subject, key: &Key, opts: &Options, profiles: &mut Vec<RowProfile>) -> Row {
        let (a, b) = (pick(s.a, key), pick(s.b, key));
        let names = (s.a.kernel.clone(), s.b.kernel.clone());
        profiles.extend(labelled_profile(
            &a,
            &b,
            opts.profile_top,
            names,
            None,
            None,
        ));
        let labels = labels_of(if a.records.is_empty() {
            &b.records
        } else {
            &a.records
        });
        let legends = [format!("A {}", s.a.kernel), format!("B {}", s.b.kernel)];
        let mut row = Row::new(key, None, labels, None);
        row.about = about(s.a, key);
        row.compared(a, b, legends, opts.confidence)
    }
}

/// On one kernel, each pair's other variant (B) against its base (A), in
/// every scenario that has both.
pub(crate) struct PairRows;

impl RowResolver for PairRows {
    type Key = Resolved;
    const MODE: Mode = Mode::Variants;

    fn rows(s: &Subject, _force: bool) -> Result<(Vec<Resolved>, Vec<Difference>), ReportError> {
        Ok((resolve_pairs(s.a, s.pairs)?, Vec::new()))
    }

    fn check<'a>(s: &Subject<'a>, keys: &[Resolved], backend_metric: bool) -> Check<'a> {
        Check::pairs(s.a, keys, backend_metric)
    }

    fn row(s: &Subject, rp: &Resolved, opts: &Options, profiles: &mut Vec<RowProfile>) -> Row {
        let (base, other) = rp;
        let pair = row_pair(rp);
        let (a, b) = (pick(s.a, base), pick(s.a, other));
        let names = (pair.base.clone(), pair.other.clone());
        profiles.extend(labelled_profile(
            &a,
            &b,
            opts.profile_top,
            names,
            Some(&pair),
            None,
        ));
        let labels = labels_of(&a.records);
        let labels_other = other_labels(&labels, &b.records);
        let legends = [format!("A {}", pair.base), format!("B {}", pair.other)];
        let mut row = Row::new(base, Some(pair), labels, labels_other);
        row.about = about(s.a, base);
        row.compared(a, b, legends, opts.confidence)
    }
}

/// On two kernels, each pair's effect on kernel B against its effect on
/// kernel A (see [`inference::DiffInDiff`]).
pub(crate) struct DidRows;

impl RowResolver for DidRows {
    type Key = Resolved;
    const MODE: Mode = Mode::Did;

    fn rows(s: &Subject, force: bool) -> Result<(Vec<Resolved>, Vec<Difference>), ReportError> {
        let (a, b) = (s.a, s.b);
        let (pa, pb) = (resolve_pairs(a, s.pairs)?, resolve_pairs(b, s.pairs)?);
        let name = |r: &Resolved| row_pair(r).name();
        let pair_sets = |only_a, only_b| ComparabilityError::PairSets { only_a, only_b };
        let common = common_keys(pa, &pb, name, force, pair_sets)?;
        Ok((common, setup_differences(a, b)))
    }

    fn check<'a>(s: &Subject<'a>, keys: &[Resolved], backend_metric: bool) -> Check<'a> {
        Check::did(s.a, s.b, keys, backend_metric)
    }

    fn row(s: &Subject, rp: &Resolved, opts: &Options, profiles: &mut Vec<RowProfile>) -> Row {
        let (base, other) = rp;
        let pair = row_pair(rp);
        let (a, b) = (s.a, s.b);
        let [ab, ao, bb, bo] = [pick(a, base), pick(a, other), pick(b, base), pick(b, other)];
        for (side, x, y) in [(a, &ab, &ao), (b, &bb, &bo)] {
            let k = &side.kernel;
            let names = (
                format!("{} on {k}", pair.base),
                format!("{} on {k}", pair.other),
            );
            let p = labelled_profile(x, y, opts.profile_top, names, Some(&pair), Some(k));
            profiles.extend(p);
        }
        let labels = labels_of(&ab.records);
        let labels_other = other_labels(&labels, &ao.records);
        let mut row = Row::new(base, Some(pair), labels, labels_other);
        row.about = about(a, base);
        row.failed_a = ab.failed + ao.failed;
        row.failed_b = bb.failed + bo.failed;
        row.did = did_cells([&ab, &ao, &bb, &bo], opts.confidence);
        row.groups = vec![
            Group::new(format!("A {} {}", a.kernel, base.1), 0, ab),
            Group::new(format!("A {} {}", a.kernel, other.1), 0, ao),
            Group::new(format!("B {} {}", b.kernel, base.1), 1, bb),
            Group::new(format!("B {} {}", b.kernel, other.1), 1, bo),
        ];
        row
    }
}
