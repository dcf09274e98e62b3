//! Good, bad or skip: a tested commit's metric values (one per boot)
//! against the boundary between the two ends, with their spread.
//!
//! A commit is bad when every value is on the bad side of the boundary,
//! good when every value is on the good side, and skipped (`git bisect
//! skip`) when its values straddle it: the spread does not allow a call.
//! `--toward bad` puts the boundary halfway between the ends' means, so a
//! commit is called by the end it is closer to; it refuses ends whose
//! values overlap (nothing to bisect at this spread).

use serde::Serialize;
use thiserror::Error;

/// What a tested commit is, for `git bisect`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Verdict {
    Good,
    Bad,
    Skip,
}

impl Verdict {
    /// The `git bisect` subcommand.
    pub(crate) fn git_word(self) -> &'static str {
        match self {
            Verdict::Good => "good",
            Verdict::Bad => "bad",
            Verdict::Skip => "skip",
        }
    }
}

/// The value separating good from bad, and which side is bad.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Boundary {
    pub(crate) value: f64,
    /// Bad above the value (a cost metric); else bad below it.
    pub(crate) bad_above: bool,
}

impl Boundary {
    /// Which side of the value is bad: `above` or `below`.
    pub(crate) fn bad_side(&self) -> &'static str {
        if self.bad_above {
            "above"
        } else {
            "below"
        }
    }
}

/// `--toward bad` finds no boundary: the ends' values (mean, smallest,
/// largest) overlap or are equal.
#[derive(Debug, Clone, Copy, PartialEq, Error)]
#[error(
    "the ends do not differ beyond their spread: good {:.1} ({:.1}..{:.1}), \
     bad {:.1} ({:.1}..{:.1}); nothing to bisect with this metric and variant \
     (more --iterations, another --variant or --metric)",
    good.0, good.1, good.2, bad.0, bad.1, bad.2
)]
pub struct EndsOverlap {
    pub(crate) good: (f64, f64, f64),
    pub(crate) bad: (f64, f64, f64),
}

/// Mean, smallest and largest of `v` (not empty).
pub(crate) fn spread(v: &[f64]) -> (f64, f64, f64) {
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (mean, min, max)
}

/// The verdict on `values` (not empty).
pub(crate) fn judge(values: &[f64], b: &Boundary) -> Verdict {
    let (_, min, max) = spread(values);
    let (bad, good) = if b.bad_above {
        (min > b.value, max < b.value)
    } else {
        (max < b.value, min > b.value)
    };
    match (bad, good) {
        (true, _) => Verdict::Bad,
        (_, true) => Verdict::Good,
        _ => Verdict::Skip,
    }
}

/// `--toward bad`: the boundary halfway between the ends' means, or why
/// there is none (the ends' values overlap or are equal).
pub(crate) fn toward_bad(good: &[f64], bad: &[f64]) -> Result<Boundary, EndsOverlap> {
    let (gm, gmin, gmax) = spread(good);
    let (bm, bmin, bmax) = spread(bad);
    let bad_above = bm > gm;
    let apart = if bad_above { bmin > gmax } else { bmax < gmin };
    if !apart {
        return Err(EndsOverlap {
            good: (gm, gmin, gmax),
            bad: (bm, bmin, bmax),
        });
    }
    Ok(Boundary {
        value: (gm + bm) / 2.0,
        bad_above,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commit_is_called_only_when_its_spread_is_on_one_side() {
        let b = Boundary {
            value: 12000.0,
            bad_above: true,
        };
        assert_eq!(judge(&[14700.0, 15100.0], &b), Verdict::Bad);
        assert_eq!(judge(&[9700.0, 10100.0], &b), Verdict::Good);
        assert_eq!(judge(&[11000.0, 13000.0], &b), Verdict::Skip);
        assert_eq!(judge(&[12000.0], &b), Verdict::Skip, "on the boundary");
        let lower_is_bad = Boundary {
            value: 100.0,
            bad_above: false,
        };
        assert_eq!(judge(&[90.0, 95.0], &lower_is_bad), Verdict::Bad);
        assert_eq!(judge(&[105.0], &lower_is_bad), Verdict::Good);
    }

    #[test]
    fn toward_bad_is_the_midpoint_of_separated_ends() {
        let b = toward_bad(&[10000.0, 10400.0], &[15000.0, 14600.0]).unwrap();
        assert_eq!(b.value, 12500.0);
        assert!(b.bad_above);
        // An improvement bisected as "bad" works the other way round.
        let b = toward_bad(&[15000.0], &[10000.0]).unwrap();
        assert!(!b.bad_above);
        assert_eq!(judge(&[10100.0], &b), Verdict::Bad);
        let e = toward_bad(&[10000.0, 12000.0], &[11500.0, 13000.0]).unwrap_err();
        assert_eq!(e.good, (11000.0, 10000.0, 12000.0));
        assert_eq!(e.bad, (12250.0, 11500.0, 13000.0));
        let e = e.to_string();
        assert!(e.contains("do not differ beyond their spread"), "{e}");
        assert!(
            e.contains("good 11000.0 (10000.0..12000.0), bad 12250.0"),
            "{e}"
        );
        assert!(toward_bad(&[5.0], &[5.0]).is_err());
    }
}
