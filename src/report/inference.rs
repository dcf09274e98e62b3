//! The statistics of an A/B comparison: per-side summaries, the confidence
//! interval of the difference of means (Welch's t, or a percentile
//! bootstrap when samples are few or skewed), and the rules for calling a
//! row significant or noisy.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use statrs::distribution::{ContinuousCDF, StudentsT};

/// Fewer samples than this a side are never called significant.
pub(crate) const MIN_SAMPLES_FOR_SIGNIFICANCE: usize = 3;
/// Welch's interval needs this many samples a side and no strong skew;
/// otherwise the bootstrap is used.
pub(crate) const MIN_SAMPLES_FOR_WELCH: usize = 5;
/// |sample skewness| above this counts as skewed.
pub(crate) const SKEW_LIMIT: f64 = 1.0;
/// Bootstrap resamples (fixed seed: a report is reproducible).
pub(crate) const BOOTSTRAP_RESAMPLES: usize = 10_000;
const BOOTSTRAP_SEED: u64 = 0x626c_6b6c_6162;

/// One side's samples, summarised.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct Summary {
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

pub(crate) fn summarize(v: &[f64]) -> Summary {
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
pub(crate) fn welch_t(a: &[f64], b: &[f64]) -> Option<(f64, f64, f64)> {
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
pub(crate) fn t_quantile(confidence: f64, df: f64) -> f64 {
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
pub(crate) struct Interval {
    pub lo: f64,
    pub hi: f64,
}

/// Welch's interval of mean(b) − mean(a).
pub(crate) fn welch_interval(a: &[f64], b: &[f64], confidence: f64) -> Option<Interval> {
    let (_, df, se) = welch_t(a, b)?;
    let d = summarize(b).mean - summarize(a).mean;
    let t = t_quantile(confidence, df);
    Some(Interval {
        lo: d - t * se,
        hi: d + t * se,
    })
}

/// Two-sided p-value of Welch's test that the means are equal.
pub(crate) fn welch_p(a: &[f64], b: &[f64]) -> Option<f64> {
    let (t, df, _) = welch_t(a, b)?;
    if !t.is_finite() {
        return Some(if t.is_nan() { 1.0 } else { 0.0 });
    }
    if t == 0.0 {
        return Some(1.0);
    }
    let tail = if df.is_finite() {
        StudentsT::new(0.0, 1.0, df).ok()?.cdf(-t.abs())
    } else {
        statrs::distribution::Normal::new(0.0, 1.0)
            .ok()?
            .cdf(-t.abs())
    };
    Some((2.0 * tail).min(1.0))
}

/// The bootstrap distribution of mean(b) − mean(a): each side resampled
/// with replacement, [`BOOTSTRAP_RESAMPLES`] times from the fixed seed, the
/// differences sorted. Drawn once per comparison, it gives both the
/// interval and the p-value.
struct BootstrapDiffs(Vec<f64>);

impl BootstrapDiffs {
    /// `None` with fewer than 2 samples a side (one sample has no spread to
    /// resample).
    fn draw(a: &[f64], b: &[f64]) -> Option<BootstrapDiffs> {
        if a.len() < 2 || b.len() < 2 {
            return None;
        }
        let mut rng = StdRng::seed_from_u64(BOOTSTRAP_SEED);
        let mut resampled_mean = |v: &[f64]| {
            (0..v.len())
                .map(|_| v[rng.gen_range(0..v.len())])
                .sum::<f64>()
                / v.len() as f64
        };
        let mut diffs: Vec<f64> = (0..BOOTSTRAP_RESAMPLES)
            .map(|_| {
                let ma = resampled_mean(a);
                resampled_mean(b) - ma
            })
            .collect();
        diffs.sort_by(|x, y| x.total_cmp(y));
        Some(BootstrapDiffs(diffs))
    }

    /// Two-sided p-value: twice the share of resampled differences on the
    /// far side of 0.
    fn p(&self) -> f64 {
        let d = &self.0;
        let n = d.len() as f64;
        let below = d.iter().filter(|x| **x <= 0.0).count() as f64 / n;
        let above = d.iter().filter(|x| **x >= 0.0).count() as f64 / n;
        (2.0 * below.min(above)).min(1.0)
    }

    /// The percentile interval at `confidence`.
    fn interval(&self, confidence: f64) -> Interval {
        let diffs = &self.0;
        let q = |p: f64| {
            let i = ((diffs.len() - 1) as f64 * p).round() as usize;
            diffs[i.min(diffs.len() - 1)]
        };
        let tail = (1.0 - confidence) / 2.0;
        Interval {
            lo: q(tail),
            hi: q(1.0 - tail),
        }
    }
}

/// The bootstrap's interval and p-value of mean(b) − mean(a), from one
/// draw.
fn bootstrap(a: &[f64], b: &[f64], confidence: f64) -> (Option<Interval>, Option<f64>) {
    match BootstrapDiffs::draw(a, b) {
        Some(d) => (Some(d.interval(confidence)), Some(d.p())),
        None => (None, None),
    }
}

/// How the interval was computed.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Method {
    Welch,
    Bootstrap,
    /// Few samples: both were computed and the wider interval (and larger
    /// p-value) kept — the percentile bootstrap alone is too narrow with
    /// 2–4 samples, Welch alone leans on normality.
    Conservative,
    /// Not enough data for any interval.
    None,
}

/// What the test of "no difference" concluded, for a [`Comparison`] or a
/// [`DiffInDiff`].
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Outcome {
    pub method: Method,
    /// Two-sided p-value of "no difference" (from the same method).
    pub p_value: Option<f64>,
    /// The interval excludes 0.
    pub ci_excludes_zero: bool,
    /// Enough samples in every group, and the difference survives the
    /// multiple-comparison correction of the report it is in ([`holm`]);
    /// alone, enough samples and the interval excluding 0.
    pub significant: bool,
    /// A group's coefficient of variation exceeds |delta|.
    pub noisy: bool,
    /// Why the row cannot be significant, when that is the reason.
    pub note: Option<String>,
}

impl Outcome {
    /// The outcome of a test by `method` whose `interval` (of the
    /// difference, in any unit where 0 is "no difference") and `p_value`
    /// were computed; `enough` says every group had enough samples, and
    /// `groups` names them in the note when not.
    fn tested(
        method: Method,
        interval: Option<Interval>,
        p_value: Option<f64>,
        enough: bool,
        noisy: bool,
        groups: &str,
    ) -> Outcome {
        let excludes_zero = interval.is_some_and(|i| i.lo > 0.0 || i.hi < 0.0);
        Outcome {
            method,
            p_value,
            ci_excludes_zero: excludes_zero,
            significant: enough && excludes_zero,
            noisy,
            note: (!enough)
                .then(|| format!("fewer than {MIN_SAMPLES_FOR_SIGNIFICANCE} samples {groups}")),
        }
    }

    /// No test: `why`.
    fn untested(why: &str) -> Outcome {
        Outcome {
            method: Method::None,
            p_value: None,
            ci_excludes_zero: false,
            significant: false,
            noisy: false,
            note: Some(why.to_string()),
        }
    }
}

/// The wider of two intervals (either, when one is missing).
fn wider(x: Option<Interval>, y: Option<Interval>) -> Option<Interval> {
    match (x, y) {
        (Some(x), Some(y)) => Some(Interval {
            lo: x.lo.min(y.lo),
            hi: x.hi.max(y.hi),
        }),
        (x, y) => x.or(y),
    }
}

/// The larger of two p-values (either, when one is missing).
fn larger(x: Option<f64>, y: Option<f64>) -> Option<f64> {
    match (x, y) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, y) => x.or(y),
    }
}

/// One metric of one row, A against B.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Comparison {
    pub a: Summary,
    pub b: Summary,
    /// (mean B − mean A) / |mean A| × 100.
    pub delta_pct: f64,
    /// The interval of the difference, as % of |mean A|.
    pub ci_pct: Option<Interval>,
    #[serde(flatten)]
    pub outcome: Outcome,
}

/// Compare samples `a` and `b` at `confidence` (e.g. 0.95).
pub(crate) fn compare(a: &[f64], b: &[f64], confidence: f64) -> Comparison {
    let (sa, sb) = (summarize(a), summarize(b));
    let base = sa.mean.abs();
    let delta_pct = if base > 0.0 {
        (sb.mean - sa.mean) / base * 100.0
    } else {
        0.0
    };
    let skewed = sa.skewness.abs() > SKEW_LIMIT || sb.skewness.abs() > SKEW_LIMIT;
    let many = sa.n >= MIN_SAMPLES_FOR_WELCH && sb.n >= MIN_SAMPLES_FOR_WELCH;
    let (interval, p_value, method) = if sa.n < 2 || sb.n < 2 {
        (None, None, Method::None)
    } else if many && !skewed {
        (
            welch_interval(a, b, confidence),
            welch_p(a, b),
            Method::Welch,
        )
    } else if many {
        let (interval, p) = bootstrap(a, b, confidence);
        (interval, p, Method::Bootstrap)
    } else {
        let (interval, p) = bootstrap(a, b, confidence);
        (
            wider(welch_interval(a, b, confidence), interval),
            larger(welch_p(a, b), p),
            Method::Conservative,
        )
    };
    let ci_pct = interval.filter(|_| base > 0.0).map(|i| Interval {
        lo: i.lo / base * 100.0,
        hi: i.hi / base * 100.0,
    });
    let enough = sa.n >= MIN_SAMPLES_FOR_SIGNIFICANCE && sb.n >= MIN_SAMPLES_FOR_SIGNIFICANCE;
    let noisy = sa.cv_pct.max(sb.cv_pct) > delta_pct.abs();
    Comparison {
        a: sa,
        b: sb,
        delta_pct,
        ci_pct,
        outcome: Outcome::tested(method, interval, p_value, enough, noisy, "a side"),
    }
}

/// Holm–Bonferroni over every comparison of a report: a comparison stays
/// significant only if its p-value passes Holm's step-down threshold at
/// family-wise level `1 − confidence` (and it had enough samples and an
/// interval excluding 0). An A/A report then shows a significant row with
/// probability at most 1 − confidence, however many rows and metrics it has.
pub(crate) fn holm(comparisons: &mut [&mut Outcome], confidence: f64) {
    let alpha = 1.0 - confidence;
    let ps: Vec<Option<f64>> = comparisons.iter().map(|c| c.p_value).collect();
    let mut order: Vec<usize> = (0..ps.len()).filter(|&i| ps[i].is_some()).collect();
    let m = order.len();
    order.sort_by(|&x, &y| ps[x].unwrap_or(1.0).total_cmp(&ps[y].unwrap_or(1.0)));
    let mut passed = vec![false; comparisons.len()];
    for (rank, &i) in order.iter().enumerate() {
        if ps[i].unwrap_or(1.0) <= alpha / (m - rank) as f64 {
            passed[i] = true;
        } else {
            break;
        }
    }
    for (i, c) in comparisons.iter_mut().enumerate() {
        c.significant = c.significant && passed[i];
    }
}

/// The difference in differences of one variant pair on two kernels: the
/// pair's effect on kernel B against the same pair's effect on kernel A, as
/// a ratio of ratios,
/// `d = ln(mean(B.other)/mean(B.base)) − ln(mean(A.other)/mean(A.base))`,
/// reported as the relative change `exp(d) − 1`. Its interval is computed
/// in log space and chosen as [`compare`] chooses: the delta method
/// (var ln(mean) ≈ s²/(n·mean²), summed over the four groups, with
/// Welch–Satterthwaite degrees of freedom and a t quantile) when every
/// group has at least 5 samples and none is skewed; a percentile bootstrap
/// resampling each group when skewed; the wider of both (and the larger
/// p-value) with fewer samples.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct DiffInDiff {
    /// Samples of (A.base, A.other, B.base, B.other).
    pub n: [usize; 4],
    /// d, in natural-log units.
    pub log_ratio: f64,
    /// (exp(d) − 1) × 100: how much larger B's other/base ratio is than A's.
    pub delta_pct: f64,
    /// The interval of d, as (exp − 1) × 100.
    pub ci_pct: Option<Interval>,
    /// The delta method's standard error of d.
    pub se: Option<f64>,
    /// Welch–Satterthwaite degrees of freedom of `se`.
    pub df: Option<f64>,
    /// Significant as a [`Comparison`] is: every group with enough
    /// samples, Holm over the report.
    #[serde(flatten)]
    pub outcome: Outcome,
}

/// ln(mean(bo)/mean(bb)) − ln(mean(ao)/mean(ab)); `None` unless every mean
/// is positive.
fn did_point(g: [&[f64]; 4]) -> Option<f64> {
    let m: Vec<f64> = g
        .iter()
        .map(|v| v.iter().sum::<f64>() / v.len() as f64)
        .collect();
    if m.iter().any(|x| x.is_nan() || *x <= 0.0 || !x.is_finite()) {
        return None;
    }
    Some((m[3] / m[2]).ln() - (m[1] / m[0]).ln())
}

/// The delta method: (d, se, df) of the ratio of ratios.
pub(crate) fn did_delta_method(g: [&[f64]; 4]) -> Option<(f64, f64, f64)> {
    if g.iter().any(|v| v.len() < 2) {
        return None;
    }
    let d = did_point(g)?;
    let v: Vec<(f64, f64)> = g
        .iter()
        .map(|x| {
            let s = summarize(x);
            (s.sd.powi(2) / (s.n as f64 * s.mean.powi(2)), s.n as f64)
        })
        .collect();
    let var: f64 = v.iter().map(|(vi, _)| vi).sum();
    if var == 0.0 {
        return Some((d, 0.0, f64::INFINITY));
    }
    let df = var.powi(2) / v.iter().map(|(vi, n)| vi.powi(2) / (n - 1.0)).sum::<f64>();
    Some((d, var.sqrt(), df))
}

/// Interval and two-sided p-value of d from the delta method.
fn did_welch(g: [&[f64]; 4], confidence: f64) -> Option<(Interval, f64)> {
    let (d, se, df) = did_delta_method(g)?;
    if se == 0.0 {
        return Some((Interval { lo: d, hi: d }, if d == 0.0 { 1.0 } else { 0.0 }));
    }
    let t = t_quantile(confidence, df);
    let tail = StudentsT::new(0.0, 1.0, df).ok()?.cdf(-(d / se).abs());
    Some((
        Interval {
            lo: d - t * se,
            hi: d + t * se,
        },
        (2.0 * tail).min(1.0),
    ))
}

/// Percentile-bootstrap interval and p-value of d: each group resampled
/// with replacement (resamples with a non-positive mean left out).
fn did_bootstrap(g: [&[f64]; 4], confidence: f64) -> Option<(Interval, f64)> {
    if g.iter().any(|v| v.len() < 2) {
        return None;
    }
    let mut rng = StdRng::seed_from_u64(BOOTSTRAP_SEED);
    let mut ds: Vec<f64> = Vec::with_capacity(BOOTSTRAP_RESAMPLES);
    let mut buf: [Vec<f64>; 4] = Default::default();
    for _ in 0..BOOTSTRAP_RESAMPLES {
        for (k, v) in g.iter().enumerate() {
            buf[k].clear();
            buf[k].extend((0..v.len()).map(|_| v[rng.gen_range(0..v.len())]));
        }
        if let Some(d) = did_point([&buf[0], &buf[1], &buf[2], &buf[3]]) {
            ds.push(d);
        }
    }
    if ds.is_empty() {
        return None;
    }
    ds.sort_by(|x, y| x.total_cmp(y));
    let q = |p: f64| ds[(((ds.len() - 1) as f64 * p).round() as usize).min(ds.len() - 1)];
    let tail = (1.0 - confidence) / 2.0;
    let n = ds.len() as f64;
    let below = ds.iter().filter(|x| **x <= 0.0).count() as f64 / n;
    let above = ds.iter().filter(|x| **x >= 0.0).count() as f64 / n;
    Some((
        Interval {
            lo: q(tail),
            hi: q(1.0 - tail),
        },
        (2.0 * below.min(above)).min(1.0),
    ))
}

/// The difference in differences of the pair (base → other) between kernel
/// A and kernel B (see [`DiffInDiff`]).
pub(crate) fn did(
    a_base: &[f64],
    a_other: &[f64],
    b_base: &[f64],
    b_other: &[f64],
    confidence: f64,
) -> DiffInDiff {
    let g = [a_base, a_other, b_base, b_other];
    let s: Vec<Summary> = g.iter().map(|v| summarize(v)).collect();
    let n = [s[0].n, s[1].n, s[2].n, s[3].n];
    let point = if n.iter().all(|&k| k > 0) {
        did_point(g)
    } else {
        None
    };
    let pct = |x: f64| (x.exp() - 1.0) * 100.0;
    let Some(d) = point else {
        return DiffInDiff {
            n,
            log_ratio: f64::NAN,
            delta_pct: f64::NAN,
            ci_pct: None,
            se: None,
            df: None,
            outcome: Outcome::untested(if n.contains(&0) {
                "a group has no samples"
            } else {
                "a group's mean is not positive (no ratio)"
            }),
        };
    };
    let skewed = s.iter().any(|x| x.skewness.abs() > SKEW_LIMIT);
    let many = n.iter().all(|&k| k >= MIN_SAMPLES_FOR_WELCH);
    let (interval, p_value, method) = if n.iter().any(|&k| k < 2) {
        (None, None, Method::None)
    } else if many && !skewed {
        let w = did_welch(g, confidence);
        (w.map(|x| x.0), w.map(|x| x.1), Method::Welch)
    } else if many {
        let b = did_bootstrap(g, confidence);
        (b.map(|x| x.0), b.map(|x| x.1), Method::Bootstrap)
    } else {
        let (w, b) = (did_welch(g, confidence), did_bootstrap(g, confidence));
        (
            wider(w.map(|x| x.0), b.map(|x| x.0)),
            larger(w.map(|x| x.1), b.map(|x| x.1)),
            Method::Conservative,
        )
    };
    let (se, df) = match did_delta_method(g) {
        Some((_, se, df)) => (Some(se), Some(df).filter(|d| d.is_finite())),
        None => (None, None),
    };
    let delta_pct = pct(d);
    let enough = n.iter().all(|&k| k >= MIN_SAMPLES_FOR_SIGNIFICANCE);
    let noisy = s.iter().map(|x| x.cv_pct).fold(0.0, f64::max) > delta_pct.abs();
    DiffInDiff {
        n,
        log_ratio: d,
        delta_pct,
        ci_pct: interval.map(|i| Interval {
            lo: pct(i.lo),
            hi: pct(i.hi),
        }),
        se,
        df,
        outcome: Outcome::tested(method, interval, p_value, enough, noisy, "in a group"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Wikipedia, "Welch's t-test", example 1: the two samples.
    const WELCH_A1: [f64; 15] = [
        27.5, 21.0, 19.0, 23.6, 17.0, 17.9, 16.9, 20.1, 21.9, 22.6, 23.1, 19.6, 19.0, 21.7, 21.4,
    ];
    const WELCH_A2: [f64; 15] = [
        27.1, 22.0, 20.8, 23.4, 23.4, 23.5, 25.8, 22.0, 24.8, 20.2, 21.9, 22.1, 22.9, 20.5, 24.4,
    ];

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
        let (a1, a2) = (WELCH_A1, WELCH_A2);
        let (t, df, _) = welch_t(&a1, &a2).unwrap();
        assert!(close(t, 2.4554, 1e-3), "t = {t}");
        assert!(close(df, 24.9885, 1e-3), "df = {df}");
        let i = welch_interval(&a1, &a2, 0.95).unwrap();
        let d = summarize(&a2).mean - summarize(&a1).mean;
        assert!(i.lo > 0.0 && i.lo < d && d < i.hi);
        let c = compare(&a1, &a2, 0.95);
        assert_eq!(c.outcome.method, Method::Welch);
        assert!(c.outcome.significant);
    }

    #[test]
    fn bootstrap_is_reproducible_and_brackets_the_difference() {
        let a = [10.0, 10.5, 9.5];
        let b = [12.0, 12.4, 11.6];
        let i1 = BootstrapDiffs::draw(&a, &b).unwrap().interval(0.95);
        let i2 = BootstrapDiffs::draw(&a, &b).unwrap().interval(0.95);
        assert_eq!(i1, i2);
        assert!(i1.lo > 0.0 && i1.lo <= 2.0 && 2.0 <= i1.hi, "{i1:?}");
        let c = compare(&a, &b, 0.95);
        assert_eq!(c.outcome.method, Method::Conservative);
        assert!(c.outcome.significant, "{c:?}");
        let wi = welch_interval(&a, &b, 0.95).unwrap();
        let ci = c.ci_pct.unwrap();
        assert!(ci.lo <= wi.lo / 10.0 * 100.0 + 1e-9 && ci.hi >= wi.hi / 10.0 * 100.0 - 1e-9);
        assert!(c.outcome.p_value.unwrap() >= welch_p(&a, &b).unwrap());
        assert!(close(c.delta_pct, 20.0, 1e-9));
    }

    #[test]
    fn p_values_are_textbook() {
        // Wikipedia example 1: p = 0.021.
        let (a1, a2) = (WELCH_A1, WELCH_A2);
        let p = welch_p(&a1, &a2).unwrap();
        assert!(close(p, 0.021, 0.001), "p = {p}");
        assert_eq!(welch_p(&[1.0, 2.0], &[1.0, 2.0]), Some(1.0));
        let pb = BootstrapDiffs::draw(&a1, &a2).unwrap().p();
        assert!(pb < 0.05, "{pb}");
    }

    #[test]
    fn holm_controls_the_family() {
        let mk = |p: f64| {
            let mut c = compare(&[1.0, 2.0, 3.0], &[4.0, 5.0, 6.0], 0.95);
            c.outcome.p_value = Some(p);
            c.outcome.significant = true;
            c
        };
        // Holm at 5 % over 4: thresholds 0.0125, 0.0167, 0.025, 0.05.
        let (mut a, mut b, mut c, mut d) = (mk(0.010), mk(0.016), mk(0.051), mk(0.001));
        holm(
            &mut [
                &mut a.outcome,
                &mut b.outcome,
                &mut c.outcome,
                &mut d.outcome,
            ],
            0.95,
        );
        assert!(d.outcome.significant && a.outcome.significant && b.outcome.significant);
        assert!(!c.outcome.significant);
        let (mut a, mut b) = (mk(0.02), mk(0.001));
        holm(&mut [&mut a.outcome, &mut b.outcome], 0.95);
        assert!(b.outcome.significant && a.outcome.significant);
        // The step-down stops at the first failure: 0.03 > 0.05/2.
        let (mut a, mut b) = (mk(0.03), mk(0.04));
        holm(&mut [&mut a.outcome, &mut b.outcome], 0.95);
        assert!(!a.outcome.significant && !b.outcome.significant);
        // A second-smallest p that would pass alone does not pass after a failure.
        let (mut a, mut b, mut c) = (mk(0.02), mk(0.018), mk(0.04));
        holm(&mut [&mut a.outcome, &mut b.outcome, &mut c.outcome], 0.95);
        assert!(!a.outcome.significant && !b.outcome.significant && !c.outcome.significant);
    }

    #[test]
    fn one_sample_a_side_has_no_interval() {
        let c = compare(&[10.0], &[20.0], 0.95);
        assert_eq!(c.outcome.method, Method::None);
        assert!(c.ci_pct.is_none() && c.outcome.p_value.is_none());
    }

    #[test]
    fn too_few_samples_are_never_significant() {
        let c = compare(&[10.0, 10.1], &[20.0, 20.1], 0.95);
        assert!(!c.outcome.significant);
        assert!(c.outcome.note.is_some());
        let c = compare(&[10.0], &[20.0], 0.95);
        assert!(!c.outcome.significant);
    }

    #[test]
    fn a_against_itself_is_not_significant() {
        let a = [5.0, 5.2, 4.9, 5.1, 5.05, 4.95];
        let c = compare(&a, &a, 0.95);
        assert!(!c.outcome.significant);
        assert_eq!(c.delta_pct, 0.0);
        let i = c.ci_pct.unwrap();
        assert!(i.lo <= 0.0 && i.hi >= 0.0);
    }

    #[test]
    fn noise_is_flagged() {
        let a = [100.0, 150.0, 50.0];
        let b = [105.0, 155.0, 55.0];
        let c = compare(&a, &b, 0.95);
        assert!(c.outcome.noisy);
        assert!(!c.outcome.significant);
    }

    #[test]
    fn did_matches_the_hand_computation() {
        // Kernel A: base mean 12 (sd 2), other mean 20 (sd 2): ratio 5/3.
        // Kernel B: base mean 10 (sd 1), other mean 25 (sd 5): ratio 5/2.
        // d = ln(2.5) − ln(5/3) = ln(1.5) = 0.405465: B's effect is 50 %
        // larger. Delta method: var ln(mean) = s²/(n·mean²) =
        // 4/432, 4/1200, 1/300, 25/1875; sum 0.0292593, se 0.171053;
        // Welch–Satterthwaite df = 0.0292593² / Σ(v²/2) = 5.9923
        // (computed by hand and with Python's statistics module).
        let (ab, ao, bb, bo) = (
            [10.0, 12.0, 14.0],
            [18.0, 20.0, 22.0],
            [9.0, 10.0, 11.0],
            [20.0, 25.0, 30.0],
        );
        let (d, se, df) = did_delta_method([&ab, &ao, &bb, &bo]).unwrap();
        assert!(close(d, 1.5f64.ln(), 1e-12), "{d}");
        assert!(close(se, 0.171_053, 1e-5), "{se}");
        assert!(close(df, 5.992_32, 1e-4), "{df}");
        let (i, p) = did_welch([&ab, &ao, &bb, &bo], 0.95).unwrap();
        // t(0.975, 5.99) lies between t(0.975, 6) = 2.4469 and t(0.975, 5) = 2.5706.
        let t = (i.hi - d) / se;
        assert!(t > 2.4469 && t < 2.452, "{t}");
        assert!(close(d - i.lo, i.hi - d, 1e-12));
        // |t| = 0.405465 / 0.171053 = 2.370 on 6 df: p = 0.0557.
        assert!(p > 0.05 && p < 0.06, "{p}");
        let r = did(&ab, &ao, &bb, &bo, 0.95);
        assert!(close(r.delta_pct, 50.0, 1e-9));
        assert_eq!(r.outcome.method, Method::Conservative);
        assert_eq!(r.n, [3, 3, 3, 3]);
        // Few samples: the wider of Welch and the bootstrap, the larger p.
        let ci = r.ci_pct.unwrap();
        assert!(ci.lo <= (i.lo.exp() - 1.0) * 100.0 + 1e-9, "{ci:?}");
        assert!(ci.hi >= (i.hi.exp() - 1.0) * 100.0 - 1e-9, "{ci:?}");
        assert!(r.outcome.p_value.unwrap() >= p);
        assert!(!r.outcome.significant, "the interval includes 0: {r:?}");
        // Swapping the kernels negates d; swapping base and other too.
        let s = did(&bb, &bo, &ab, &ao, 0.95);
        assert!(close(s.log_ratio, -d, 1e-12));
        let s = did(&ao, &ab, &bo, &bb, 0.95);
        assert!(close(s.log_ratio, -d, 1e-12));
    }

    #[test]
    fn did_uses_welch_with_many_samples_and_calls_a_clear_difference() {
        // The pair doubles the metric on A and triples it on B: d = ln 1.5.
        let ab = [10.0, 10.2, 9.8, 10.1, 9.9];
        let ao: Vec<f64> = ab.iter().map(|x| x * 2.0).collect();
        let bb = [5.0, 5.1, 4.9, 5.05, 4.95];
        let bo: Vec<f64> = bb.iter().map(|x| x * 3.0).collect();
        let r = did(&ab, &ao, &bb, &bo, 0.95);
        assert_eq!(r.outcome.method, Method::Welch);
        assert!(close(r.delta_pct, 50.0, 1e-9), "{r:?}");
        assert!(r.outcome.significant && !r.outcome.noisy, "{r:?}");
        let ci = r.ci_pct.unwrap();
        assert!(ci.lo > 40.0 && ci.hi < 60.0, "{ci:?}");
        // The same pair effect on both kernels: nothing to call.
        let r = did(&ab, &ao, &bb, &bb.map(|x| x * 2.0), 0.95);
        assert!(close(r.delta_pct, 0.0, 1e-9), "{r:?}");
        assert!(
            !r.outcome.significant && r.ci_pct.unwrap().lo < 0.0,
            "{r:?}"
        );
        // No ratio without positive means.
        let r = did(&[0.0, 0.0, 0.0], &ao, &bb, &bo, 0.95);
        assert_eq!(r.outcome.method, Method::None);
        assert!(r.outcome.note.is_some() && !r.outcome.significant);
    }

    #[test]
    fn holm_covers_did_and_comparisons_together() {
        let mut c = compare(&[1.0, 2.0, 3.0], &[4.0, 5.0, 6.0], 0.95);
        c.outcome.p_value = Some(0.03);
        c.outcome.significant = true;
        let mut d = did(
            &[10.0, 10.2, 9.8],
            &[20.0, 20.4, 19.6],
            &[5.0, 5.1, 4.9],
            &[15.0, 15.3, 14.7],
            0.95,
        );
        d.outcome.p_value = Some(0.001);
        d.outcome.significant = true;
        // 0.001 <= 0.05/2, then 0.03 > 0.05/1? No: 0.03 <= 0.05: both pass.
        holm(&mut [&mut c.outcome, &mut d.outcome], 0.95);
        assert!(c.outcome.significant && d.outcome.significant);
        c.outcome.p_value = Some(0.03);
        d.outcome.p_value = Some(0.04);
        holm(&mut [&mut c.outcome, &mut d.outcome], 0.95);
        assert!(!c.outcome.significant && !d.outcome.significant);
    }
}
