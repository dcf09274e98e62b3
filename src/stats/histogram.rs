//! Log-linear histograms for latencies and small counts.
//!
//! The device model records one value per request (completion latency,
//! time between pops, in-flight depth) on the hot path of a queue thread and
//! reports percentiles far less often. [`Hist`] is a fixed array of
//! log-linear buckets, HDR's layout: values below `2^m` have a bucket each
//! (exact), and every further power-of-two range `[2^k, 2^(k+1))` is split
//! into `2^(m-1)` equal buckets, so a value is kept to within `2^(1-m)` of
//! itself. Recording is a branch-free index computation (one `lzcnt`, two
//! shifts) and one increment, about 10 instructions: the hdrhistogram
//! crate this replaced spent ~70 instructions per record (callgrind,
//! `record_n_inner`: 200 instructions per request for the three values a
//! request records, 15 % of the request path), and the backend's
//! instruction budget per request is ~1,100 (`blklab bench
//! --instructions`). The layout is HDR's, so nothing about the reported
//! figures changed but their cost, and the exact sum kept beside the
//! buckets makes the mean exact.
//!
//! The queue statistics' time histograms ([`TickHist`]) are cheaper
//! still on the hot path (about 12 instructions): they are fed raw clock
//! ticks, a duration is converted to ns with one multiply, and the
//! float's exponent and top mantissa bits are its bucket in this same
//! layout (from 128 ns on; below, and past the limit, a cold path takes
//! the integer index); the sum stays in ticks and the report converts it.
//!
//! - **bounded memory**: the array is sized once from the value range and
//!   the precision (a latency histogram, 0 ..= 100 s within 0.8 %, is 3,899
//!   counters = 30 KiB; a count histogram up to 65536, exact below 2048, is
//!   7,169 counters = 56 KiB);
//! - **O(1) record**, without allocation, so it does not perturb the
//!   timing being measured;
//! - **exact merge and delta**: two histograms built by the same
//!   constructor with the same arguments have the same buckets, so they
//!   merge (per-queue into per-disk) and subtract (a snapshot from an
//!   earlier one, for per-interval statistics) exactly.
//!
//! Values above the histogram's maximum are recorded as the maximum
//! (saturation) rather than failing: an outlier must not make the daemon
//! lose a sample or error out. Everything this module reports (min, max,
//! percentiles) is clamped to that maximum too.

use serde::{Deserialize, Serialize};

/// Sub-bucket bits of count histograms: exact below 2048, within 0.1 %
/// above (3 significant digits).
const COUNT_BITS: u32 = 11;
/// Sub-bucket bits of latency histograms: exact below 256 ns, within
/// 1/128 = 0.8 % above (2 significant digits).
pub(crate) const LATENCY_BITS: u32 = 8;

/// Largest latency a [`Hist::new_latency`] histogram keeps: 100 s in ns.
pub(crate) const LATENCY_MAX_NS: u64 = 100_000_000_000;

/// A histogram of `u64` values: latencies within 0.8 %, counts exact
/// below 2048 and within 0.1 % above.
///
/// See the [module documentation](self) for the representation.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Hist {
    /// `m`: values below `2^m` are exact.
    bits: u32,
    /// The largest value kept; larger ones are recorded as this.
    limit: u64,
    counts: Box<[u64]>,
    /// The sum of the recorded (clamped) values, for an exact mean, in
    /// units of `unit` (1 but in a [`TickHist::hist`], whose sum is in
    /// clock ticks). It wraps after 2^64 ns (or ticks) of
    /// summed latency (584 years, 195 at 3 GHz), never in practice.
    sum: u64,
    /// What one unit of `sum` is worth in the buckets' unit.
    unit: f64,
}

/// The clock-tick durations a [`TickHist`] records, fixed once per
/// clock: the statistics read the raw counter on the hot path
/// ([`crate::util::clock::Clock::ticks`]) and a duration goes to its
/// nanosecond bucket with one multiply, while the sum (for the exact
/// mean) stays in ticks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct TickScale {
    /// Nanoseconds per tick.
    ns_per_tick: f64,
    /// [`LATENCY_MAX_NS`] in ticks (rounded down): longer durations are
    /// recorded as this.
    limit: u64,
}

/// The fast path's bucket of a latency of `x` ns, `x >= 128`: with 8
/// exact bits ([`LATENCY_BITS`]) a value of `e + 1` significant bits,
/// `e >= 7`, is in bucket `(e - 7) * 128 + (v >> (e - 7))`, which is
/// `e * 128 - 768 + 128 + m` where `m` is its 7 bits after the leading
/// one: an f64's biased exponent (`1023 + e`) and top 7 mantissa bits
/// are `bits >> 45`, so the bucket is that less `(1023 + 6) * 128`. The
/// truncated mantissa floors `x`, as the integer path does.
const F64_SHIFT: u32 = 52 - (LATENCY_BITS - 1);
const F64_BIAS: u64 = (1023 + LATENCY_BITS as u64 - 2) << (LATENCY_BITS - 1);

/// The buckets the fast path takes: from 128 ns on (below, the float's
/// bits are not the bucket) to the one before the last (the last holds
/// values over the limit, which are recorded as the limit).
const FAST_FIRST: u64 = 1 << (LATENCY_BITS - 1);
const FAST_LAST: u64 = LATENCY_BUCKETS as u64 - 2;

/// Buckets of [`Hist::new_latency`] (0 ..= [`LATENCY_MAX_NS`]).
const LATENCY_BUCKETS: usize = 3899;

impl TickScale {
    /// The scale of a clock of `ns_per_tick` ns per tick (positive).
    pub(crate) fn new(ns_per_tick: f64) -> TickScale {
        let ns_per_tick = if ns_per_tick.is_finite() && ns_per_tick > 0.0 {
            ns_per_tick
        } else {
            1.0
        };
        let ns = |t: u64| t as f64 * ns_per_tick;
        // The last tick count at most the limit, as the multiply rounds.
        let max = LATENCY_MAX_NS as f64;
        let mut limit = (max / ns_per_tick) as u64;
        while ns(limit) > max {
            limit -= 1;
        }
        while ns(limit + 1) <= max {
            limit += 1;
        }
        TickScale { ns_per_tick, limit }
    }

    /// `ticks` in ns, rounded down as the buckets are (at most the limit).
    fn ns(&self, ticks: u64) -> u64 {
        if ticks >= self.limit {
            LATENCY_MAX_NS
        } else {
            (ticks as f64 * self.ns_per_tick) as u64
        }
    }
}

/// Counters of a [`TickHist`]: the latency layout's 3,899 buckets
/// (0 ..= 100 s) rounded up to a power of two, so that the hot path's
/// index takes a mask instead of a bounds check.
const TICK_BUCKETS: usize = 4096;

/// Where a [`TickHist`] keeps the latency layout's bucket `i`: rotated by
/// [`F64_BIAS`], so that the hot path's position is the float's bits
/// without a subtraction.
#[inline(always)]
fn tick_position(i: usize) -> usize {
    (i + F64_BIAS as usize) & (TICK_BUCKETS - 1)
}

/// A latency histogram fed clock-tick durations on the hot path: the
/// buckets are [`Hist::new_latency`]'s, in ns (a duration goes to the
/// bucket of its ns, rounded down, with one multiply), the sum is in
/// ticks (exact; [`hist`](Self::hist) converts it for the mean).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TickHist {
    counts: Box<[u64; TICK_BUCKETS]>,
    /// The recorded (clamped) durations' sum, in ticks.
    sum: u64,
}

impl Default for TickHist {
    fn default() -> Self {
        let counts: Box<[u64]> = vec![0; TICK_BUCKETS].into_boxed_slice();
        TickHist {
            counts: counts
                .try_into()
                .unwrap_or_else(|_| unreachable!("TICK_BUCKETS counters")),
            sum: 0,
        }
    }
}

impl TickHist {
    /// Records a duration of `ticks` clock ticks (`ticks` as the wrapping
    /// difference of two readings: one that went back, a counter a few
    /// ticks apart across CPUs, counts as 0) of `scale`'s clock.
    #[inline(always)]
    pub(crate) fn record(&mut self, ticks: u64, scale: &TickScale) {
        if !self.record_fast(ticks, scale) {
            self.record_rare(ticks, scale);
        }
    }

    /// The hot path of the statistics: a duration is converted to ns
    /// with one multiply and the float's bits are its bucket (see
    /// [`F64_BIAS`]); one range check on them, an increment and an add.
    /// Returns false, recording nothing, for a duration under 128 ns, in
    /// the last bucket (which may exceed the limit) or negative (a
    /// negative float's bits are out of range too): for
    /// [`record_rare`](Self::record_rare).
    #[inline(always)]
    pub(crate) fn record_fast(&mut self, ticks: u64, scale: &TickScale) -> bool {
        let ns = ticks as i64 as f64 * scale.ns_per_tick;
        let b = ns.to_bits() >> F64_SHIFT;
        if b.wrapping_sub(F64_BIAS + FAST_FIRST) > FAST_LAST - FAST_FIRST {
            return false;
        }
        // b is bucket + F64_BIAS: its position (`tick_position`).
        self.counts[b as usize & (TICK_BUCKETS - 1)] += 1;
        self.sum = self.sum.wrapping_add(ticks);
        true
    }

    /// What [`record_fast`](Self::record_fast) leaves: under 128 ns (the
    /// integer bucket), over the limit (the limit) or negative (0).
    #[cold]
    #[inline(never)]
    pub(crate) fn record_rare(&mut self, ticks: u64, scale: &TickScale) {
        let ticks = if (ticks as i64) < 0 {
            0
        } else {
            ticks.min(scale.limit)
        };
        self.sum = self.sum.wrapping_add(ticks);
        self.counts[tick_position(index(LATENCY_BITS, scale.ns(ticks)))] += 1;
    }

    /// The histogram in ns, for reports (its mean converts the tick sum
    /// with `scale`, which must be the one recorded with).
    pub(crate) fn hist(&self, scale: &TickScale) -> Hist {
        let mut h = Hist::new_latency();
        for (i, c) in h.counts.iter_mut().enumerate() {
            *c = self.counts[tick_position(i)];
        }
        h.sum = self.sum;
        h.unit = scale.ns_per_tick;
        h
    }
}

/// A [`Hist`] fed values that mostly repeat (requests per wake-up, the
/// in-flight depth at pop): a run of one value is only counted, and goes
/// into the histogram when the value changes, so a repeated value costs
/// a compare and an increment. [`hist`](Self::hist) has every value.
#[derive(Debug, Clone)]
pub(crate) struct RunHist {
    hist: Hist,
    /// The current run: its value and length (0: none yet).
    run: (u64, u64),
}

impl RunHist {
    pub(crate) fn new(hist: Hist) -> RunHist {
        RunHist { hist, run: (0, 0) }
    }

    /// Records one value.
    #[inline]
    pub(crate) fn record(&mut self, v: u64) {
        if !self.record_same(v) {
            self.next_run(v);
        }
    }

    /// Records `v` if it is the current run's value (and says whether it
    /// was); otherwise the caller calls [`next_run`](Self::next_run).
    #[inline(always)]
    pub(crate) fn record_same(&mut self, v: u64) -> bool {
        let same = v == self.run.0;
        if same {
            self.run.1 += 1;
        }
        same
    }

    /// Records `v`, which starts a new run.
    #[cold]
    #[inline(never)]
    pub(crate) fn next_run(&mut self, v: u64) {
        let (prev, n) = std::mem::replace(&mut self.run, (v, 1));
        if n > 0 {
            self.hist.record_n(prev, n);
        }
    }

    /// Every value recorded, the current run included.
    pub(crate) fn hist(&self) -> Hist {
        let mut h = self.hist.clone();
        let (v, n) = self.run;
        if n > 0 {
            h.record_n(v, n);
        }
        h
    }
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

/// The bucket of `v` with `bits` exact bits: `v` itself below `2^bits`,
/// otherwise `shift * 2^(bits-1) + (v >> shift)` where `shift` is how many
/// low bits the bucket drops.
#[inline(always)]
fn index(bits: u32, v: u64) -> usize {
    let significant = u64::BITS - v.leading_zeros();
    let shift = significant.saturating_sub(bits);
    ((u64::from(shift) << (bits - 1)) + (v >> shift)) as usize
}

/// The values bucket `i` holds: `(lowest, highest)`.
fn bounds(bits: u32, i: usize) -> (u64, u64) {
    let i = i as u64;
    let shift = (i >> (bits - 1)).max(1) - 1;
    let low = (i - (shift << (bits - 1))) << shift;
    (low, low + ((1u64 << shift) - 1))
}

impl Hist {
    /// A latency histogram in nanoseconds: 0 ..= 100 s ([`LATENCY_MAX_NS`]),
    /// within 0.8 % ([`LATENCY_BITS`]). Longer latencies are recorded as
    /// 100 s.
    pub(crate) fn new_latency() -> Self {
        Self::with_bounds(LATENCY_MAX_NS, LATENCY_BITS)
    }

    /// A histogram for counts such as requests per kick or in-flight depth:
    /// 0 ..= `max`, exact up to 2047 and within 0.1 % above. `max` is
    /// raised to 2 if smaller. Larger values are recorded as `max`.
    pub(crate) fn new_count(max: u64) -> Self {
        Self::with_bounds(max, COUNT_BITS)
    }

    fn with_bounds(max: u64, bits: u32) -> Self {
        let limit = max.max(2);
        Hist {
            bits,
            limit,
            counts: vec![0; index(bits, limit) + 1].into_boxed_slice(),
            sum: 0,
            unit: 1.0,
        }
    }

    /// The largest value this histogram keeps; larger values are recorded
    /// as this.
    #[cfg(test)]
    pub(crate) fn limit(&self) -> u64 {
        self.limit
    }

    /// Records one value, saturating at [`limit`](Self::limit).
    #[inline]
    pub(crate) fn record(&mut self, v: u64) {
        let v = v.min(self.limit);
        self.sum = self.sum.wrapping_add(self.in_sum_units(v));
        if let Some(c) = self.counts.get_mut(index(self.bits, v)) {
            *c += 1;
        }
    }

    /// Records `v` `n` times, saturating at [`limit`](Self::limit).
    #[inline]
    pub(crate) fn record_n(&mut self, v: u64, n: u64) {
        let v = v.min(self.limit);
        self.sum = self.sum.wrapping_add(self.in_sum_units(v).wrapping_mul(n));
        if let Some(c) = self.counts.get_mut(index(self.bits, v)) {
            *c = c.saturating_add(n);
        }
    }

    /// Number of recorded values.
    pub(crate) fn count(&self) -> u64 {
        self.counts.iter().fold(0u64, |a, &c| a.saturating_add(c))
    }

    /// Whether nothing has been recorded (since creation or [`reset`](Self::reset)).
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.counts.iter().all(|&c| c == 0)
    }

    /// The non-empty buckets, ascending: (index, count).
    fn nonempty(&self) -> impl Iterator<Item = (usize, u64)> + '_ {
        self.counts
            .iter()
            .enumerate()
            .filter(|&(_, &c)| c > 0)
            .map(|(i, &c)| (i, c))
    }

    /// The highest value bucket `i` holds, at most the limit.
    fn highest(&self, i: usize) -> u64 {
        self.clamp(bounds(self.bits, i).1)
    }

    /// Smallest recorded value (to the histogram's precision: the lowest
    /// value of its bucket); 0 when empty.
    pub(crate) fn min(&self) -> u64 {
        self.nonempty()
            .next()
            .map_or(0, |(i, _)| self.clamp(bounds(self.bits, i).0))
    }

    /// Largest recorded value (to the histogram's precision: the highest
    /// value of its bucket, at most [`limit`](Self::limit)); 0 when empty.
    pub(crate) fn max(&self) -> u64 {
        self.nonempty().last().map_or(0, |(i, _)| self.highest(i))
    }

    /// Mean of the recorded values (exact: their sum over their count;
    /// in ticks' histograms, the sum of the ticks recorded times the
    /// clock's ns per tick); 0.0 when empty.
    pub(crate) fn mean(&self) -> f64 {
        match self.count() {
            0 => 0.0,
            n => self.sum as f64 * self.unit / n as f64,
        }
    }

    /// Value `v` (in the buckets' unit) in the sum's unit.
    fn in_sum_units(&self, v: u64) -> u64 {
        if self.unit == 1.0 {
            v
        } else {
            (v as f64 / self.unit).round() as u64
        }
    }

    /// The value at percentile `p` (0 ..= 100; out-of-range values are
    /// clamped, NaN counts as 0): the highest value of the bucket in which
    /// the `ceil(p % of the count)`-th value lies (at least the first), so
    /// `percentile(100.0)` is [`max`](Self::max) and `percentile(0.0)` is
    /// [`min`](Self::min) to within one bucket. 0 when empty.
    pub(crate) fn percentile(&self, p: f64) -> u64 {
        let total = self.count();
        if total == 0 {
            return 0;
        }
        let p = if p.is_nan() { 0.0 } else { p.clamp(0.0, 100.0) };
        let rank = ((p / 100.0 * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0u64;
        for (i, c) in self.nonempty() {
            seen = seen.saturating_add(c);
            if seen >= rank {
                return self.highest(i);
            }
        }
        self.max()
    }

    /// Adds every value recorded in `other` to this histogram. Exact when
    /// both were built by the same constructor with the same arguments;
    /// otherwise `other`'s buckets are re-recorded here (saturating).
    pub(crate) fn merge(&mut self, other: &Hist) {
        if self.same_layout(other) {
            for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
                *a = a.saturating_add(*b);
            }
            self.sum = self.sum.wrapping_add(other.sum);
            return;
        }
        for (i, c) in other.nonempty() {
            self.record_n(other.highest(i), c);
        }
    }

    /// Forgets every recorded value; the range and precision stay.
    pub(crate) fn reset(&mut self) {
        self.counts.fill(0);
        self.sum = 0;
    }

    /// The values recorded in `self` but not in `earlier`, where `earlier`
    /// is a snapshot (clone) of this same histogram taken before: what was
    /// recorded in between. Buckets where `earlier` holds more than `self`
    /// (it was not an earlier snapshot, or `self` was reset since) give 0
    /// instead of failing.
    pub(crate) fn delta(&self, earlier: &Hist) -> Hist {
        let mut d = self.clone();
        if self.same_layout(earlier) {
            let mut shrank = false;
            for (a, b) in d.counts.iter_mut().zip(earlier.counts.iter()) {
                shrank |= *b > *a;
                *a = a.saturating_sub(*b);
            }
            d.sum = if shrank {
                // Not a snapshot of this histogram: the sum of what is left,
                // to the buckets' precision.
                d.bucket_sum()
            } else {
                self.sum.wrapping_sub(earlier.sum)
            };
            return d;
        }
        d.reset();
        for (i, c) in self.nonempty() {
            let value = self.highest(i);
            let before = earlier
                .counts
                .get(index(earlier.bits, value.min(earlier.limit)))
                .copied()
                .unwrap_or(0);
            let n = c.saturating_sub(before);
            if n > 0 {
                d.record_n(value, n);
            }
        }
        d
    }

    /// The sum of the recorded values as their buckets' middles (in the
    /// sum's unit).
    fn bucket_sum(&self) -> u64 {
        self.nonempty().fold(0u64, |a, (i, c)| {
            let (lo, hi) = bounds(self.bits, i);
            let mid = self.in_sum_units((lo + (hi - lo) / 2).min(self.limit));
            a.wrapping_add(mid.wrapping_mul(c))
        })
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
        self.nonempty().map(|(i, c)| (self.highest(i), c)).collect()
    }

    /// The non-empty power-of-two buckets, ascending, as
    /// `(inclusive upper bound, count)`.
    ///
    /// The bucket with upper bound `2^k - 1` holds the values in
    /// `2^(k-1) ..= 2^k - 1` (values with `k` significant bits); the first
    /// possible bucket, upper bound 0, holds the zeros. The upper bounds are
    /// thus 0, 1, 3, 7, 15, …: these boundaries coincide with bucket
    /// boundaries, so the counts are exact. The counts sum to
    /// [`count`](Self::count). For a Prometheus histogram, use the bounds as
    /// `le` and accumulate the counts.
    #[cfg(test)]
    pub(crate) fn buckets(&self) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        for (i, n) in self.nonempty() {
            let low = bounds(self.bits, i).0;
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
        v.min(self.limit)
    }

    fn same_layout(&self, other: &Hist) -> bool {
        self.bits == other.bits && self.limit == other.limit && self.unit == other.unit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Latency histograms keep values within 0.8 %: within 1 % (+1 for
    /// rounding).
    fn assert_near(got: u64, want: u64) {
        let tol = want / 100 + 1;
        assert!(got.abs_diff(want) <= tol, "got {got}, want {want} ± {tol}");
    }

    fn recorded(h: &Hist) -> Vec<(u64, u64)> {
        h.values()
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
        // Buckets beyond 2048 (buckets wider than 1) are still exact:
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
    fn the_latency_layout_fits_a_ticks_histogram() {
        assert_eq!(Hist::new_latency().counts.len(), LATENCY_BUCKETS);
        const { assert!(LATENCY_BUCKETS <= TICK_BUCKETS) };
        assert_eq!(index(LATENCY_BITS, LATENCY_MAX_NS), LATENCY_BUCKETS - 1);
        // Positions are distinct.
        let mut seen = vec![false; TICK_BUCKETS];
        for i in 0..LATENCY_BUCKETS {
            assert!(!std::mem::replace(&mut seen[tick_position(i)], true));
        }
        // The float's bits are the bucket from 128 on.
        for v in [128u64, 129, 255, 256, 1000, 65_535, 1 << 30, LATENCY_MAX_NS] {
            let b = (v as f64).to_bits() >> F64_SHIFT;
            assert_eq!(b - F64_BIAS, index(LATENCY_BITS, v) as u64, "{v}");
        }
    }

    #[test]
    fn every_value_lies_in_its_buckets_bounds() {
        for bits in [COUNT_BITS, LATENCY_BITS, 2] {
            let mut prev_high = None;
            // Every bucket up to 2^40 in order, and values around each
            // power of two.
            for i in 0..index(bits, 1 << 40) {
                let (lo, hi) = bounds(bits, i);
                assert!(lo <= hi);
                if let Some(p) = prev_high {
                    assert_eq!(lo, p + 1, "bits {bits}: bucket {i} is contiguous");
                }
                prev_high = Some(hi);
                assert_eq!(index(bits, lo), i);
                assert_eq!(index(bits, hi), i);
            }
            for k in 0..64 {
                for v in [
                    (1u64 << k) - 1,
                    1u64 << k,
                    (1u64 << k) + 1,
                    u64::MAX >> (63 - k),
                ] {
                    let (lo, hi) = bounds(bits, index(bits, v));
                    assert!(lo <= v && v <= hi, "bits {bits}: {v} in [{lo}, {hi}]");
                    // Within 2^(1-bits) of the value.
                    assert!((hi - lo) as f64 <= (v as f64) * 2f64.powi(1 - bits as i32));
                }
            }
        }
        assert_eq!(Hist::new_latency().counts.len(), 3899);
        assert_eq!(Hist::new_count(1 << 16).counts.len(), 7169);
    }

    #[test]
    fn the_mean_is_exact_and_survives_merge_and_delta() {
        let mut h = Hist::new_latency();
        h.record(1_000_003);
        h.record(7);
        let snap = h.clone();
        h.record_n(999_999_937, 2);
        assert_eq!(h.mean(), (1_000_003.0 + 7.0 + 2.0 * 999_999_937.0) / 4.0);
        let d = h.delta(&snap);
        assert_eq!(d.mean(), 999_999_937.0);
        let mut m = Hist::new_latency();
        m.merge(&h);
        m.merge(&snap);
        assert_eq!(
            m.mean(),
            (2.0 * 1_000_003.0 + 2.0 * 7.0 + 2.0 * 999_999_937.0) / 6.0
        );
    }

    #[test]
    fn a_run_histogram_holds_every_value_and_its_current_run() {
        let mut r = RunHist::new(Hist::new_count(1000));
        let mut h = Hist::new_count(1000);
        for v in [0, 0, 0, 5, 5, 1, 0, 0, 7, 7, 7, 7] {
            r.record(v);
            h.record(v);
        }
        assert_eq!(r.hist(), h);
        let snap = r.clone();
        r.record(7);
        r.record(3);
        h.record(7);
        h.record(3);
        assert_eq!(r.hist(), h);
        assert_eq!(r.hist().delta(&snap.hist()).values(), vec![(3, 1), (7, 1)]);
    }

    #[test]
    fn ticks_go_to_the_buckets_of_their_nanoseconds() {
        // Ticks of 1 ns (the monotonic clock), of a 3 GHz counter, of an
        // odd rate, and slower than 1 GHz.
        for ns_per_tick in [1.0, 1.0 / 3.0, 0.416_666_67, 2.5] {
            let scale = TickScale::new(ns_per_tick);
            let floor_ns = |t: u64| ((t as f64 * ns_per_tick) as u64).min(LATENCY_MAX_NS);
            // Every tick count to 2^16, each side of the fast path's ends
            // and of every power of two, and the limit.
            let mut ticks: Vec<u64> = (0..1 << 16).collect();
            let fast_lo = (128.0 / ns_per_tick) as u64;
            for t in [fast_lo, scale.limit] {
                for d in 0..4 {
                    ticks.push(t.saturating_sub(d));
                    ticks.push(t + d);
                }
            }
            for k in 16..50 {
                ticks.extend([(1u64 << k) - 1, 1 << k, (1 << k) + 1, (3 << k) / 2]);
            }
            let mut h = TickHist::default();
            let mut want = Hist::new_latency();
            let mut sum = 0u64;
            for &t in &ticks {
                h.record(t, &scale);
                want.record(floor_ns(t));
                sum += t.min(scale.limit);
            }
            assert_eq!(
                h.hist(&scale).counts,
                want.counts,
                "{ns_per_tick} ns per tick"
            );
            assert_eq!(h.sum, sum, "{ns_per_tick} ns per tick");
            // Nothing beyond the last bucket.
            let total: u64 = h.counts.iter().sum();
            assert_eq!(total, ticks.len() as u64);
            assert!(scale.limit as f64 * ns_per_tick <= LATENCY_MAX_NS as f64);
            assert!((scale.limit + 1) as f64 * ns_per_tick > LATENCY_MAX_NS as f64);
            // Longer than the limit: the limit; a clock that went back: 0.
            let mut h = TickHist::default();
            h.record(u64::MAX / 2, &scale);
            assert_eq!((h.hist(&scale).max(), h.sum), (LATENCY_MAX_NS, scale.limit));
            let mut h = TickHist::default();
            h.record(5u64.wrapping_sub(9), &scale);
            let r = h.hist(&scale);
            assert_eq!((r.count(), r.max(), h.sum), (1, 0, 0));
        }
    }

    #[test]
    fn a_ticks_histogram_reports_nanoseconds_and_an_exact_mean() {
        // 4 ticks per ns.
        let scale = TickScale::new(0.25);
        let mut th = TickHist::default();
        let mut ns = Hist::new_latency();
        for t in [400u64, 4_000, 40_001, 4_000_000, 17] {
            th.record(t, &scale);
            ns.record(t / 4);
        }
        let mut h = th.hist(&scale);
        let (a, b) = (h.summary(), ns.summary());
        assert_eq!(
            (a.count, a.min, a.max, a.p50, a.p99),
            (b.count, b.min, b.max, b.p50, b.p99)
        );
        assert_eq!(
            a.mean,
            (400.0 + 4_000.0 + 40_001.0 + 4_000_000.0 + 17.0) / 4.0 / 5.0
        );
        // Merge and delta keep the tick sum.
        let snap = h.clone();
        th.record(8_000, &scale);
        h = th.hist(&scale);
        assert_eq!(h.delta(&snap).mean(), 2_000.0);
        let mut m = TickHist::default().hist(&scale);
        m.merge(&h);
        assert_eq!(m.mean(), h.mean());
        // Not the same layout as a ns histogram: merged value by value.
        let mut x = Hist::new_latency();
        x.merge(&h);
        assert_eq!(x.count(), h.count());
        assert_eq!(x.max(), h.max());
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
