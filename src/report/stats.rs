//! The statistics of an A/B comparison: per-side summaries, the confidence
//! interval of the difference of means (Welch's t, or a percentile
//! bootstrap when samples are few or skewed), and the rules for calling a
//! row significant or noisy.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use statrs::distribution::{ContinuousCDF, StudentsT};

/// Fewer samples than this a side are never called significant.
pub const MIN_SAMPLES_FOR_SIGNIFICANCE: usize = 3;
/// Welch's interval needs this many samples a side and no strong skew;
/// otherwise the bootstrap is used.
pub const MIN_SAMPLES_FOR_WELCH: usize = 5;
/// |sample skewness| above this counts as skewed.
pub const SKEW_LIMIT: f64 = 1.0;
/// Bootstrap resamples (fixed seed: a report is reproducible).
pub const BOOTSTRAP_RESAMPLES: usize = 10_000;
const BOOTSTRAP_SEED: u64 = 0x626c_6b6c_6162;

/// One side's samples, summarised.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Summary {
    pub n: usize,
    pub mean: f64,
    /// Sample standard deviation (n − 1).
    pub sd: f64,
    /// sd / |mean| × 100 (0 when the mean is 0).
    pub cv_pct: f64,
    /// Adjusted Fisher–Pearson skewness (0 with fewer than 3 samples).
    pub skewness: f64,
    pub min: f64,
    pub max: f64,
}

pub fn summarize(v: &[f64]) -> Summary {
    let n = v.len();
    if n == 0 {
        return Summary {
            n,
            mean: f64::NAN,
            sd: f64::NAN,
            cv_pct: f64::NAN,
            skewness: 0.0,
            min: f64::NAN,
            max: f64::NAN,
        };
    }
    let nf = n as f64;
    let mean = v.iter().sum::<f64>() / nf;
    let m2 = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>();
    let sd = if n > 1 { (m2 / (nf - 1.0)).sqrt() } else { 0.0 };
    let skewness = if n > 2 && m2 > 0.0 {
        let m2n = m2 / nf;
        let m3n = v.iter().map(|x| (x - mean).powi(3)).sum::<f64>() / nf;
        let g1 = m3n / m2n.powf(1.5);
        g1 * (nf * (nf - 1.0)).sqrt() / (nf - 2.0)
    } else {
        0.0
    };
    Summary {
        n,
        mean,
        sd,
        cv_pct: if mean != 0.0 {
            sd / mean.abs() * 100.0
        } else {
            0.0
        },
        skewness,
        min: v.iter().cloned().fold(f64::INFINITY, f64::min),
        max: v.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
    }
}

/// Welch's t statistic and Welch–Satterthwaite degrees of freedom for
/// mean(b) − mean(a). `None` with fewer than 2 samples a side.
pub fn welch_t(a: &[f64], b: &[f64]) -> Option<(f64, f64, f64)> {
    let (sa, sb) = (summarize(a), summarize(b));
    if sa.n < 2 || sb.n < 2 {
        return None;
    }
    let va = sa.sd.powi(2) / sa.n as f64;
    let vb = sb.sd.powi(2) / sb.n as f64;
    let se = (va + vb).sqrt();
    let diff = sb.mean - sa.mean;
    if se == 0.0 {
        // No spread at all: the difference is exact.
        return Some((
            if diff == 0.0 {
                0.0
            } else {
                f64::INFINITY * diff.signum()
            },
            f64::INFINITY,
            0.0,
        ));
    }
    let df =
        (va + vb).powi(2) / (va.powi(2) / (sa.n as f64 - 1.0) + vb.powi(2) / (sb.n as f64 - 1.0));
    Some((diff / se, df, se))
}

/// Two-sided Student t quantile (e.g. 0.95 → t_{0.975, df}).
pub fn t_quantile(confidence: f64, df: f64) -> f64 {
    if !df.is_finite() {
        // The normal limit.
        return statrs::distribution::Normal::new(0.0, 1.0)
            .map(|n| n.inverse_cdf(0.5 + confidence / 2.0))
            .unwrap_or(1.96);
    }
    StudentsT::new(0.0, 1.0, df)
        .map(|t| t.inverse_cdf(0.5 + confidence / 2.0))
        .unwrap_or(f64::NAN)
}

/// A confidence interval of mean(b) − mean(a), in the metric's unit.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Interval {
    pub lo: f64,
    pub hi: f64,
}

/// Welch's interval of mean(b) − mean(a).
pub fn welch_interval(a: &[f64], b: &[f64], confidence: f64) -> Option<Interval> {
    let (_, df, se) = welch_t(a, b)?;
    let d = summarize(b).mean - summarize(a).mean;
    let t = t_quantile(confidence, df);
    Some(Interval {
        lo: d - t * se,
        hi: d + t * se,
    })
}

/// Percentile-bootstrap interval of mean(b) − mean(a): resample each side
/// with replacement. `None` when a side is empty.
pub fn bootstrap_interval(a: &[f64], b: &[f64], confidence: f64) -> Option<Interval> {
    if a.is_empty() || b.is_empty() {
        return None;
    }
    let mut rng = StdRng::seed_from_u64(BOOTSTRAP_SEED);
    let mut diffs: Vec<f64> = (0..BOOTSTRAP_RESAMPLES)
        .map(|_| {
            let ma = (0..a.len())
                .map(|_| a[rng.gen_range(0..a.len())])
                .sum::<f64>()
                / a.len() as f64;
            let mb = (0..b.len())
                .map(|_| b[rng.gen_range(0..b.len())])
                .sum::<f64>()
                / b.len() as f64;
            mb - ma
        })
        .collect();
    diffs.sort_by(|x, y| x.total_cmp(y));
    let q = |p: f64| {
        let i = ((diffs.len() - 1) as f64 * p).round() as usize;
        diffs[i.min(diffs.len() - 1)]
    };
    let tail = (1.0 - confidence) / 2.0;
    Some(Interval {
        lo: q(tail),
        hi: q(1.0 - tail),
    })
}

/// How the interval was computed.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    Welch,
    Bootstrap,
    /// Not enough data for any interval.
    None,
}

/// One metric of one row, A against B.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    pub a: Summary,
    pub b: Summary,
    /// (mean B − mean A) / |mean A| × 100.
    pub delta_pct: f64,
    /// The interval of the difference, as % of |mean A|.
    pub ci_pct: Option<Interval>,
    pub method: Method,
    /// The interval excludes 0 and each side has enough samples.
    pub significant: bool,
    /// A side's coefficient of variation exceeds |delta|.
    pub noisy: bool,
    /// Why the row cannot be significant, when that is the reason.
    pub note: Option<String>,
}

/// Compare samples `a` and `b` at `confidence` (e.g. 0.95).
pub fn compare(a: &[f64], b: &[f64], confidence: f64) -> Comparison {
    let (sa, sb) = (summarize(a), summarize(b));
    let base = sa.mean.abs();
    let delta_pct = if base > 0.0 {
        (sb.mean - sa.mean) / base * 100.0
    } else {
        0.0
    };
    let skewed = sa.skewness.abs() > SKEW_LIMIT || sb.skewness.abs() > SKEW_LIMIT;
    let use_welch = sa.n >= MIN_SAMPLES_FOR_WELCH && sb.n >= MIN_SAMPLES_FOR_WELCH && !skewed;
    let (interval, method) = if use_welch {
        (welch_interval(a, b, confidence), Method::Welch)
    } else {
        match bootstrap_interval(a, b, confidence) {
            Some(i) => (Some(i), Method::Bootstrap),
            None => (None, Method::None),
        }
    };
    let ci_pct = interval.filter(|_| base > 0.0).map(|i| Interval {
        lo: i.lo / base * 100.0,
        hi: i.hi / base * 100.0,
    });
    let enough = sa.n >= MIN_SAMPLES_FOR_SIGNIFICANCE && sb.n >= MIN_SAMPLES_FOR_SIGNIFICANCE;
    let excludes_zero = interval.map(|i| i.lo > 0.0 || i.hi < 0.0).unwrap_or(false);
    let noisy = sa.cv_pct.max(sb.cv_pct) > delta_pct.abs();
    let note = if !enough {
        Some(format!(
            "fewer than {MIN_SAMPLES_FOR_SIGNIFICANCE} samples a side"
        ))
    } else {
        None
    };
    Comparison {
        a: sa,
        b: sb,
        delta_pct,
        ci_pct,
        method,
        significant: enough && excludes_zero,
        noisy,
        note,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    #[test]
    fn summary_matches_hand_computation() {
        let s = summarize(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
        assert_eq!(s.n, 8);
        assert_eq!(s.mean, 5.0);
        // Sample variance 32/7.
        assert!(close(s.sd, (32.0f64 / 7.0).sqrt(), 1e-12));
        assert!(close(s.cv_pct, (32.0f64 / 7.0).sqrt() / 5.0 * 100.0, 1e-9));
        // Adjusted skewness of this set: 0.8185 (as Excel's SKEW).
        assert!(close(s.skewness, 0.818_487, 1e-4), "{}", s.skewness);
        assert_eq!((s.min, s.max), (2.0, 9.0));
    }

    #[test]
    fn t_quantiles_are_textbook() {
        // Two-sided 95 %: t(0.975, df).
        assert!(close(t_quantile(0.95, 1.0), 12.706, 1e-3));
        assert!(close(t_quantile(0.95, 10.0), 2.228, 1e-3));
        assert!(close(t_quantile(0.95, 30.0), 2.042, 1e-3));
        assert!(close(t_quantile(0.99, 5.0), 4.032, 1e-3));
        assert!(close(t_quantile(0.95, f64::INFINITY), 1.960, 1e-3));
    }

    #[test]
    fn welch_matches_the_textbook_example() {
        // Wikipedia, "Welch's t-test", example 1: |t| = 2.46, df = 24.99
        // (cross-checked with Python's statistics module: t = 2.4554,
        // df = 24.9885; we compute B − A, A2 being larger).
        let a1 = [
            27.5, 21.0, 19.0, 23.6, 17.0, 17.9, 16.9, 20.1, 21.9, 22.6, 23.1, 19.6, 19.0, 21.7,
            21.4,
        ];
        let a2 = [
            27.1, 22.0, 20.8, 23.4, 23.4, 23.5, 25.8, 22.0, 24.8, 20.2, 21.9, 22.1, 22.9, 20.5,
            24.4,
        ];
        let (t, df, _) = welch_t(&a1, &a2).unwrap();
        assert!(close(t, 2.4554, 1e-3), "t = {t}");
        assert!(close(df, 24.9885, 1e-3), "df = {df}");
        let i = welch_interval(&a1, &a2, 0.95).unwrap();
        let d = summarize(&a2).mean - summarize(&a1).mean;
        assert!(i.lo > 0.0 && i.lo < d && d < i.hi);
        let c = compare(&a1, &a2, 0.95);
        assert_eq!(c.method, Method::Welch);
        assert!(c.significant);
    }

    #[test]
    fn bootstrap_is_reproducible_and_brackets_the_difference() {
        let a = [10.0, 10.5, 9.5];
        let b = [12.0, 12.4, 11.6];
        let i1 = bootstrap_interval(&a, &b, 0.95).unwrap();
        let i2 = bootstrap_interval(&a, &b, 0.95).unwrap();
        assert_eq!(i1, i2);
        assert!(i1.lo > 0.0 && i1.lo <= 2.0 && 2.0 <= i1.hi, "{i1:?}");
        let c = compare(&a, &b, 0.95);
        assert_eq!(c.method, Method::Bootstrap);
        assert!(c.significant, "{c:?}");
        assert!(close(c.delta_pct, 20.0, 1e-9));
    }

    #[test]
    fn too_few_samples_are_never_significant() {
        let c = compare(&[10.0, 10.1], &[20.0, 20.1], 0.95);
        assert!(!c.significant);
        assert!(c.note.is_some());
        let c = compare(&[10.0], &[20.0], 0.95);
        assert!(!c.significant);
    }

    #[test]
    fn a_against_itself_is_not_significant() {
        let a = [5.0, 5.2, 4.9, 5.1, 5.05, 4.95];
        let c = compare(&a, &a, 0.95);
        assert!(!c.significant);
        assert_eq!(c.delta_pct, 0.0);
        let i = c.ci_pct.unwrap();
        assert!(i.lo <= 0.0 && i.hi >= 0.0);
    }

    #[test]
    fn noise_is_flagged() {
        let a = [100.0, 150.0, 50.0];
        let b = [105.0, 155.0, 55.0];
        let c = compare(&a, &b, 0.95);
        assert!(c.noisy);
        assert!(!c.significant);
    }
}
