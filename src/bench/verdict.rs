//! A target, as measured: what was compared, its value, the target it is
//! held to and whether it meets it. `--compare` and `--instructions` both
//! end with a list of these; how a value is computed is theirs to know.
//! A target this run could not judge (its side not measured, or a zero
//! to divide by) is a [`Skipped`] with its reason: listed and counted,
//! never taken for a pass.

use serde::Serialize;

/// A target from the issue, as measured.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    pub what: String,
    pub value: f64,
    pub target: String,
    pub pass: bool,
}

/// A target this run did not judge, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Skipped {
    pub what: String,
    pub target: String,
    pub reason: String,
}

/// The count line under a list of targets: `targets: 3 passed, 1 failed,
/// 2 skipped (not judged in this run)`.
pub(crate) fn tally(verdicts: &[Verdict], skipped: &[Skipped]) -> String {
    let passed = verdicts.iter().filter(|v| v.pass).count();
    format!(
        "targets: {passed} passed, {} failed, {} skipped (not judged in this run)",
        verdicts.len() - passed,
        skipped.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tally_counts_skipped_targets_apart_from_passed_ones() {
        let v = |pass| Verdict {
            what: "w".into(),
            value: 1.0,
            target: "<= 2".into(),
            pass,
        };
        let s = Skipped {
            what: "w".into(),
            target: "<= 2".into(),
            reason: "not measured".into(),
        };
        assert_eq!(
            tally(&[v(true), v(false), v(true)], &[s.clone(), s]),
            "targets: 2 passed, 1 failed, 2 skipped (not judged in this run)"
        );
        assert_eq!(
            tally(&[], &[]),
            "targets: 0 passed, 0 failed, 0 skipped (not judged in this run)"
        );
    }
}
