//! Whether a comparison goes ahead: the rows both sides have, the refusal
//! over a blocking difference of the contract's conditions, and what a
//! forced comparison (`--force`) went past, which every report format
//! shows at its top.

use thiserror::Error;

use super::check::{differences, run_document_disagreements, Check, Difference};

/// Why two sides are not compared (each names what `--force` does).
#[derive(Debug, Error)]
pub enum ComparabilityError {
    #[error("the two sides ran different scenario sets: only in A: [{only_a}]; only in B: [{only_b}] (--force compares the common rows)")]
    ScenarioSets { only_a: String, only_b: String },
    #[error("the pairs match different rows on the two sides: only on A: [{only_a}]; only on B: [{only_b}] (--force compares the common rows)")]
    PairSets { only_a: String, only_b: String },
    #[error("the two sides have no scenario row in common")]
    NothingInCommon,
    #[error("the two sides differ in more than the kernel: {} (--force compares anyway)", blocking_list(.0))]
    Differs(Vec<Difference>),
}

/// The keys both sides have, in A's order. A key on one side only is
/// refused (by `mismatch`, given the names only on A and only on B)
/// unless forced; no key in common is always refused.
pub(crate) fn common_keys<K: PartialEq>(
    ka: Vec<K>,
    kb: &[K],
    name: impl Fn(&K) -> String,
    force: bool,
    mismatch: impl FnOnce(String, String) -> ComparabilityError,
) -> Result<Vec<K>, ComparabilityError> {
    let only = |x: &[K], y: &[K]| -> Vec<String> {
        x.iter().filter(|k| !y.contains(k)).map(&name).collect()
    };
    let (only_a, only_b) = (only(&ka, kb), only(kb, &ka));
    if (!only_a.is_empty() || !only_b.is_empty()) && !force {
        return Err(mismatch(only_a.join(", "), only_b.join(", ")));
    }
    let common: Vec<K> = ka.into_iter().filter(|k| kb.contains(k)).collect();
    if common.is_empty() {
        return Err(ComparabilityError::NothingInCommon);
    }
    Ok(common)
}

/// Every difference of the contract's conditions among the records
/// `check` reads (each side's records against its run.json first), then
/// the setups' other differences (`setup`); refused over the blocking
/// ones unless forced.
pub(crate) fn checked_differences(
    check: &Check,
    setup: Vec<Difference>,
    force: bool,
) -> Result<Vec<Difference>, ComparabilityError> {
    let mut diffs = Vec::new();
    for (name, recs) in &check.sides {
        diffs.extend(run_document_disagreements(name, recs));
    }
    diffs.extend(differences(check));
    diffs.extend(setup);
    let blocking: Vec<Difference> = diffs.iter().filter(|d| d.blocking).cloned().collect();
    if !blocking.is_empty() && !force {
        return Err(ComparabilityError::Differs(blocking));
    }
    Ok(diffs)
}

/// The blocking differences, for their error.
fn blocking_list(blocking: &[Difference]) -> String {
    forced_conditions(blocking).join("; ")
}

/// The blocking differences a forced comparison went past, one line each
/// (the FORCED banner of every report format).
pub(crate) fn forced_conditions(diffs: &[Difference]) -> Vec<String> {
    diffs
        .iter()
        .filter(|d| d.blocking)
        .map(|d| {
            let rows = if d.rows.is_empty() {
                String::new()
            } else {
                format!(" ({})", d.rows.join(", "))
            };
            match &d.within {
                Some(side) => format!("{}{rows} within side {side}: {} / {}", d.what, d.a, d.b),
                None => format!("{}{rows}: A {} / B {}", d.what, d.a, d.b),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_keys_refuse_a_one_sided_key_unless_forced() {
        let name = |k: &u32| k.to_string();
        let sets = |only_a, only_b| ComparabilityError::ScenarioSets { only_a, only_b };
        let e = common_keys(vec![1, 2, 3], &[3, 2, 4], name, false, sets).unwrap_err();
        assert!(
            matches!(&e, ComparabilityError::ScenarioSets { only_a, only_b } if only_a == "1" && only_b == "4"),
            "{e}"
        );
        let common = common_keys(vec![1, 2, 3], &[3, 2, 4], name, true, sets).unwrap();
        assert_eq!(common, [2, 3], "in A's order");
        assert!(matches!(
            common_keys(vec![1], &[2], name, true, sets),
            Err(ComparabilityError::NothingInCommon)
        ));
    }
}
