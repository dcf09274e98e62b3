//! Log-bucket histograms for latencies and small counts.
//!
//! [`Hist`] wraps an HDR histogram ([`hdrhistogram::Histogram<u64>`]). The
//! device model records one value per request (completion latency,
//! requests per kick, in-flight depth) on the hot path of a queue thread and
//! reports percentiles far less often, so the representation must have:
//!
//! - **bounded memory**: the counts array is sized once from the value range
//!   and the precision, no matter how many values are recorded (a latency
//!   histogram, 1 ns ..= 100 s at 2 significant digits, is about 4 Ki
//!   counters = 31 KiB; a count histogram up to 32768 at 3 digits is about
//!   12 KiB);
//! - **O(1) record**: recording is an index computation and an increment,
//!   without allocation, so it does not perturb the timing being measured;
//! - **configurable precision**: values are kept to a fixed number of
//!   significant decimal digits. Latencies keep 2 (within 1 %, exact below
//!   256 ns): at 3 digits the 224 KiB counts arrays of the two latency
//!   histograms a request touches missed the cache on the hot path (5.9 %
//!   of the backend's CPU samples at QD64 on the development VM, 3.1 %
//!   at 2 digits). Counts keep 3 digits and are exact below 2048: counts
//!   and depths are exact.
//!
//! Two histograms built by the same constructor with the same arguments have
//! the same bucket layout, so they can be merged (per-queue into per-disk)
//! and subtracted (a snapshot from an earlier one, for per-interval
//! statistics) exactly.
//!
//! Values above the histogram's maximum are recorded as the maximum
//! (saturation) rather than failing: an outlier must not make the daemon
//! lose a sample or error out. Everything this module reports (min, max,
//! percentiles) is clamped to that maximum too.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Significant decimal digits kept by count histograms.
const SIGFIG: u8 = 3;
/// Significant decimal digits kept by latency histograms (within 1 %).
pub(crate) const LATENCY_SIGFIG: u8 = 2;

/// Largest latency a [`Hist::new_latency`] histogram keeps: 100 s in ns.
pub(crate) const LATENCY_MAX_NS: u64 = 100_000_000_000;

/// A histogram of `u64` values: latencies to 2 significant digits, counts
/// to 3 (exact below 2048).
///
/// See the [module documentation](self) for the representation.
#[derive(Debug, Clone)]
pub struct Hist {
    h: Histogram<u64>,
}

/// A fixed set of statistics of a [`Hist`], for reports and JSON output.
///
/// All values are in the unit that was recorded (nanoseconds for latency
/// histograms). An empty histogram gives all zeros.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct HistSummary {
    pub count: u64,
    pub min: u64,
    pub max: u64,
    pub mean: f64,
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub p999: u64,
}

impl Hist {
    /// A latency histogram in nanoseconds: 1 ns ..= 100 s ([`LATENCY_MAX_NS`]),
    /// [`LATENCY_SIGFIG`] significant digits. Longer latencies are recorded
    /// as 100 s.
    pub(crate) fn new_latency() -> Self {
        Self::with_bounds(LATENCY_MAX_NS, LATENCY_SIGFIG)
    }

    /// A histogram for counts such as requests per kick or in-flight depth:
    /// 0 ..= `max`, exact up to 2047 and 3 significant digits above.
    /// `max` is raised to 2 if smaller (the least range HDR histograms
    /// support). Larger values are recorded as `max`.
    pub(crate) fn new_count(max: u64) -> Self {
        Self::with_max(max)
    }

    fn with_max(max: u64) -> Self {
        Self::with_bounds(max, SIGFIG)
    }

    fn with_bounds(max: u64, sigfig: u8) -> Self {
        let h = Histogram::new_with_bounds(1, max.max(2), sigfig)
            .expect("low = 1, high >= 2 and sigfig 2 or 3 are valid HDR bounds");
        Hist { h }
    }

    /// The largest value this histogram keeps; larger values are recorded
    /// as this.
    pub fn limit(&self) -> u64 {
        self.h.high()
    }

    /// Records one value, saturating at [`limit`](Self::limit).
    #[inline]
    pub(crate) fn record(&mut self, v: u64) {
        self.h.saturating_record(v);
    }

    /// Records `v` `n` times, saturating at [`limit`](Self::limit).
    #[inline]
    pub fn record_n(&mut self, v: u64, n: u64) {
        self.h.saturating_record_n(v, n);
    }

    /// Number of recorded values.
    pub(crate) fn count(&self) -> u64 {
        self.h.len()
    }

    /// Whether nothing has been recorded (since creation or [`reset`](Self::reset)).
    pub(crate) fn is_empty(&self) -> bool {
        self.h.is_empty()
    }

    /// Smallest recorded value (to the histogram's precision); 0 when empty.
    pub(crate) fn min(&self) -> u64 {
        if self.is_empty() {
            return 0;
        }
        self.clamp(self.h.min())
    }

    /// Largest recorded value (to the histogram's precision, at most
    /// [`limit`](Self::limit)); 0 when empty.
    pub(crate) fn max(&self) -> u64 {
        if self.is_empty() {
            return 0;
        }
        self.clamp(self.h.max())
    }

    /// Mean of the recorded values (each counted at the middle of its
    /// bucket); 0.0 when empty.
    pub(crate) fn mean(&self) -> f64 {
        if self.is_empty() {
            return 0.0;
        }
        self.h.mean()
    }

    /// The value at percentile `p` (0 ..= 100; out-of-range values are
    /// clamped, NaN counts as 0): the largest value of the bucket below or
    /// in which `p` % of the recorded values lie, so `percentile(100.0)` is
    /// [`max`](Self::max) and `percentile(0.0)` is [`min`](Self::min) to
    /// within one bucket. 0 when empty.
    pub(crate) fn percentile(&self, p: f64) -> u64 {
        if self.is_empty() {
            return 0;
        }
        let p = if p.is_nan() { 0.0 } else { p.clamp(0.0, 100.0) };
        self.clamp(self.h.value_at_quantile(p / 100.0))
    }

    /// Adds every value recorded in `other` to this histogram. Exact when
    /// both were built by the same constructor with the same arguments;
    /// otherwise `other`'s buckets are re-recorded here (saturating).
    pub(crate) fn merge(&mut self, other: &Hist) {
        if self.h.add(&other.h).is_err() {
            for v in other.h.iter_recorded() {
                self.h
                    .saturating_record_n(v.value_iterated_to(), v.count_at_value());
            }
        }
    }

    /// Forgets every recorded value; the range and precision stay.
    pub fn reset(&mut self) {
        self.h.reset();
    }

    /// The values recorded in `self` but not in `earlier`, where `earlier`
    /// is a snapshot (clone) of this same histogram taken before: what was
    /// recorded in between. Buckets where `earlier` holds more than `self`
    /// (it was not an earlier snapshot, or `self` was reset since) give 0
    /// instead of failing.
    pub(crate) fn delta(&self, earlier: &Hist) -> Hist {
        if self.same_layout(earlier) {
            let mut d = self.clone();
            if d.h.subtract(&earlier.h).is_ok() {
                return d;
            }
        }
        let mut d = self.clone();
        d.h.reset();
        for v in self.h.iter_recorded() {
            let value = v.value_iterated_to();
            let n = v
                .count_at_value()
                .saturating_sub(earlier.h.count_at(value.min(earlier.h.high())));
            if n > 0 {
                d.h.saturating_record_n(value, n);
            }
        }
        d
    }

    /// Count, min, max, mean and the 50th, 90th, 99th and 99.9th percentiles.
    pub(crate) fn summary(&self) -> HistSummary {
        HistSummary {
            count: self.count(),
            min: self.min(),
            max: self.max(),
            mean: self.mean(),
            p50: self.percentile(50.0),
            p90: self.percentile(90.0),
            p99: self.percentile(99.0),
            p999: self.percentile(99.9),
        }
    }

    /// Every recorded value with its count, ascending (exact for values
    /// below 2048; larger ones to the histogram's precision). For small
    /// counts such as requests per kick: the whole distribution.
    pub(crate) fn values(&self) -> Vec<(u64, u64)> {
        self.h
            .iter_recorded()
            .map(|v| (self.clamp(v.value_iterated_to()), v.count_at_value()))
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    /// The non-empty power-of-two buckets, ascending, as
    /// `(inclusive upper bound, count)`.
    ///
    /// The bucket with upper bound `2^k - 1` holds the values in
    /// `2^(k-1) ..= 2^k - 1` (values with `k` significant bits); the first
    /// possible bucket, upper bound 0, holds the zeros. The upper bounds are
    /// thus 0, 1, 3, 7, 15, …: these boundaries coincide with HDR bucket
    /// boundaries, so the counts are exact. The counts sum to
    /// [`count`](Self::count). For a Prometheus histogram, use the bounds as
    /// `le` and accumulate the counts.
    pub fn buckets(&self) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        for v in self.h.iter_recorded() {
            let n = v.count_at_value();
            if n == 0 {
                continue;
            }
            let low = self.h.lowest_equivalent(v.value_iterated_to());
            let bits = u64::BITS - low.leading_zeros();
            let upper = if bits >= u64::BITS {
                u64::MAX
            } else {
                (1u64 << bits) - 1
            };
            match out.last_mut() {
                Some((u, c)) if *u == upper => *c = c.saturating_add(n),
                _ => out.push((upper, n)),
            }
        }
        out
    }

    fn clamp(&self, v: u64) -> u64 {
        v.min(self.h.high())
    }

    fn same_layout(&self, other: &Hist) -> bool {
        self.h.low() == other.h.low()
            && self.h.high() == other.h.high()
            && self.h.sigfig() == other.h.sigfig()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Latency histograms keep 2 significant digits: within 1 % (+1 for
    /// rounding).
    fn assert_near(got: u64, want: u64) {
        let tol = want / 100 + 1;
        assert!(got.abs_diff(want) <= tol, "got {got}, want {want} ± {tol}");
    }

    fn recorded(h: &Hist) -> Vec<(u64, u64)> {
        h.h.iter_recorded()
            .map(|v| (v.value_iterated_to(), v.count_at_value()))
            .collect()
    }

    fn assert_same(a: &Hist, b: &Hist) {
        assert_eq!(a.count(), b.count());
        assert_eq!(a.min(), b.min());
        assert_eq!(a.max(), b.max());
        assert_eq!(recorded(a), recorded(b));
        assert_eq!(a.summary(), b.summary());
    }

    #[test]
    fn uniform_percentiles() {
        let mut h = Hist::new_latency();
        for v in 1..=100_000u64 {
            h.record(v);
        }
        assert_eq!(h.count(), 100_000);
        assert_eq!(h.min(), 1);
        assert_near(h.max(), 100_000);
        assert_near(h.percentile(50.0), 50_000);
        assert_near(h.percentile(90.0), 90_000);
        assert_near(h.percentile(99.0), 99_000);
        assert_near(h.percentile(99.9), 99_900);
        assert_near(h.percentile(100.0), 100_000);
        assert_eq!(h.percentile(0.0), 1);
        // Out-of-range percentiles clamp.
        assert_eq!(h.percentile(150.0), h.percentile(100.0));
        assert_eq!(h.percentile(-3.0), h.percentile(0.0));
        assert_eq!(h.percentile(f64::NAN), h.percentile(0.0));
        let mean = h.mean();
        assert!((mean - 50_000.5).abs() < 50.0, "mean {mean}");
        let s = h.summary();
        assert_eq!(s.count, 100_000);
        assert_eq!(s.p50, h.percentile(50.0));
        assert_eq!(s.p999, h.percentile(99.9));
    }

    #[test]
    fn small_values_are_exact() {
        let mut h = Hist::new_count(256);
        for v in 0..=100u64 {
            h.record(v);
        }
        assert_eq!(h.min(), 0);
        assert_eq!(h.max(), 100);
        assert_eq!(h.percentile(50.0), 50);
        assert_eq!(h.percentile(100.0), 100);
        assert!((h.mean() - 50.0).abs() < 1e-9);
    }

    #[test]
    fn skewed_distribution() {
        // 99 % fast (10 us), 0.9 % slow (1 ms), 0.1 % very slow (50 ms).
        let mut h = Hist::new_latency();
        h.record_n(10_000, 99_000);
        h.record_n(1_000_000, 900);
        h.record_n(50_000_000, 100);
        assert_eq!(h.count(), 100_000);
        assert_near(h.min(), 10_000);
        assert_near(h.percentile(50.0), 10_000);
        assert_near(h.percentile(90.0), 10_000);
        assert_near(h.percentile(99.0), 10_000);
        assert_near(h.percentile(99.5), 1_000_000);
        // Not exactly at 99.9: a boundary is at the mercy of float rounding.
        assert_near(h.percentile(99.85), 1_000_000);
        assert_near(h.percentile(99.95), 50_000_000);
        assert_near(h.max(), 50_000_000);
        let want_mean = (10_000.0 * 99_000.0 + 1e6 * 900.0 + 5e7 * 100.0) / 100_000.0;
        let mean = h.mean();
        assert!(
            (mean - want_mean).abs() / want_mean < 0.001,
            "mean {mean} want {want_mean}"
        );
    }

    #[test]
    fn merge_equals_recording_both() {
        let mut a = Hist::new_latency();
        let mut b = Hist::new_latency();
        let mut both = Hist::new_latency();
        for v in (1..50_000u64).map(|i| i * 37 % 1_000_003) {
            a.record(v);
            both.record(v);
        }
        for v in (1..30_000u64).map(|i| i * i % 10_000_019) {
            b.record(v);
            both.record(v);
        }
        a.merge(&b);
        assert_same(&a, &both);
    }

    #[test]
    fn merge_from_wider_histogram_saturates() {
        let mut small = Hist::new_count(100);
        let mut wide = Hist::new_count(10_000);
        wide.record(5);
        wide.record(5_000);
        small.merge(&wide);
        assert_eq!(small.count(), 2);
        assert_eq!(small.min(), 5);
        assert_eq!(small.max(), 100);
    }

    #[test]
    fn delta_equals_recording_only_new_values() {
        let mut h = Hist::new_latency();
        for v in 1..=20_000u64 {
            h.record(v * 3);
        }
        let snapshot = h.clone();
        let mut new_only = Hist::new_latency();
        for v in 1..=5_000u64 {
            h.record(v * 11);
            new_only.record(v * 11);
        }
        assert_same(&h.delta(&snapshot), &new_only);
        // Nothing new: empty delta.
        let d = h.delta(&h);
        assert!(d.is_empty());
        assert_eq!(d.summary(), HistSummary::default());
        // Against an empty snapshot: everything.
        assert_same(&h.delta(&Hist::new_latency()), &h);
    }

    #[test]
    fn delta_against_non_snapshot_saturates() {
        let mut earlier = Hist::new_count(1000);
        earlier.record_n(7, 10);
        earlier.record(9);
        let mut now = Hist::new_count(1000);
        now.record_n(7, 4); // fewer than "earlier": bucket gives 0
        now.record_n(8, 3);
        let d = now.delta(&earlier);
        assert_eq!(d.count(), 3);
        assert_eq!(d.min(), 8);
        assert_eq!(d.max(), 8);
    }

    #[test]
    fn saturation_at_max() {
        let mut h = Hist::new_count(1000);
        assert_eq!(h.limit(), 1000);
        h.record(10);
        h.record(5_000);
        h.record(u64::MAX);
        assert_eq!(h.count(), 3);
        assert_eq!(h.max(), 1000);
        assert_eq!(h.percentile(100.0), 1000);
        assert_eq!(h.percentile(50.0), 1000);

        let mut l = Hist::new_latency();
        l.record(u64::MAX);
        l.record(LATENCY_MAX_NS * 2);
        assert_eq!(l.count(), 2);
        assert_eq!(l.max(), LATENCY_MAX_NS);
        assert_eq!(l.percentile(99.0), LATENCY_MAX_NS);

        // A tiny max is raised to 2.
        let mut t = Hist::new_count(0);
        t.record(7);
        assert_eq!(t.max(), 2);
    }

    #[test]
    fn empty_histogram() {
        let mut h = Hist::new_latency();
        for _ in 0..2 {
            assert!(h.is_empty());
            assert_eq!(h.count(), 0);
            assert_eq!(h.min(), 0);
            assert_eq!(h.max(), 0);
            assert_eq!(h.mean(), 0.0);
            assert_eq!(h.percentile(0.0), 0);
            assert_eq!(h.percentile(50.0), 0);
            assert_eq!(h.percentile(100.0), 0);
            assert_eq!(h.summary(), HistSummary::default());
            assert!(h.buckets().is_empty());
            // Record, then reset: back to empty.
            h.record(12_345);
            assert_eq!(h.count(), 1);
            h.reset();
        }
    }

    #[test]
    fn buckets_are_log2_and_sum_to_count() {
        let mut h = Hist::new_count(1 << 20);
        h.record(0);
        h.record(1);
        h.record(2);
        h.record(3);
        h.record(4);
        h.record(7);
        h.record(8);
        h.record_n(1000, 5);
        h.record(1 << 19);
        assert_eq!(
            h.buckets(),
            vec![
                (0, 1),
                (1, 1),
                (3, 2),
                (7, 2),
                (15, 1),
                (1023, 5),
                ((1 << 20) - 1, 1)
            ]
        );

        let mut l = Hist::new_latency();
        for v in 1..=100_000u64 {
            l.record(v * v % 99_999_989);
        }
        l.record(u64::MAX);
        let b = l.buckets();
        assert_eq!(b.iter().map(|&(_, c)| c).sum::<u64>(), l.count());
        assert!(b.windows(2).all(|w| w[0].0 < w[1].0));
        for &(upper, count) in &b {
            assert!(count > 0);
            assert!(upper == 0 || (upper + 1).is_power_of_two(), "{upper}");
        }
        // Buckets beyond 2048 (HDR buckets wider than 1) are still exact:
        // every value recorded below 2^k counts in a bucket <= 2^k - 1.
        let mut e = Hist::new_latency();
        e.record((1 << 30) - 1);
        e.record(1 << 30);
        let b = e.buckets();
        assert_eq!(b.len(), 2);
        assert_eq!(b[0], ((1 << 30) - 1, 1));
        assert_eq!(b[1], ((1 << 31) - 1, 1));
    }

    #[test]
    fn summary_serializes() {
        let mut h = Hist::new_count(64);
        h.record(4);
        let s = h.summary();
        let json = serde_json::to_string(&s).unwrap();
        assert!(json.contains("\"p999\":4"), "{json}");
        let back: HistSummary = serde_json::from_str(&json).unwrap();
        assert_eq!(back, s);
    }
}
