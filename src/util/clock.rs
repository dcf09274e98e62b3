//! A cheap monotonic nanosecond clock for per-request timestamps.
//!
//! The backend reads the clock once per request (the pop time, which is
//! also the completion time of the request served before it) and once per
//! batch of completions. `Instant::now()` is a `clock_gettime` call (about
//! 20 ns through the vDSO) and `Instant` arithmetic another ~150
//! instructions per request (callgrind: `Timespec::sub_timespec`,
//! `duration_since`, `elapsed`); a [`Clock`] reading is the CPU's time-stamp
//! counter, when the kernel itself keeps time with it (its current
//! clocksource is `tsc`, so the counter is invariant and synchronised
//! across CPUs), and `clock_gettime(CLOCK_MONOTONIC)` as a plain `u64`
//! otherwise. The statistics keep raw readings ([`Clock::ticks`]: no
//! conversion on the hot path) and convert durations with
//! [`Clock::ns_per_tick`]; [`Clock::now`] is a reading in ns (one 128-bit
//! multiply).
//!
//! The counter's rate is measured once per process against
//! `CLOCK_MONOTONIC` over [`CALIBRATION`] (a few parts per million: a
//! 1 ms latency reads within a few ns).

use std::sync::OnceLock;
use std::time::Duration;

/// How long the counter's rate is measured.
pub(crate) const CALIBRATION: Duration = Duration::from_millis(5);

/// Which source a [`Clock`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// The time-stamp counter, `mult / 2^32` ns per tick.
    Tsc { mult: u64 },
    /// `clock_gettime(CLOCK_MONOTONIC)`.
    Monotonic,
}

/// A monotonic clock in nanoseconds from an arbitrary origin.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    source: Source,
}

/// `CLOCK_MONOTONIC` in ns.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we pass; CLOCK_MONOTONIC
    // always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

#[cfg(target_arch = "x86_64")]
#[inline]
fn tsc() -> u64 {
    // SAFETY: RDTSC exists on every x86_64 CPU and has no memory effects.
    unsafe { core::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
#[inline]
fn tsc() -> u64 {
    0
}

/// A source of [`Clock::ticks`] as a type, to choose it once (a function
/// pointer to code monomorphised for it) instead of testing the clock's
/// source on every reading.
pub(crate) trait TickSource {
    fn read() -> u64;
}

/// The time-stamp counter's ticks ([`Source::Tsc`]).
pub(crate) struct TscTicks;

impl TickSource for TscTicks {
    #[inline(always)]
    fn read() -> u64 {
        tsc()
    }
}

/// `CLOCK_MONOTONIC`'s ns ([`Source::Monotonic`]).
pub(crate) struct MonotonicTicks;

impl TickSource for MonotonicTicks {
    #[inline(always)]
    fn read() -> u64 {
        monotonic_ns()
    }
}

/// Whether the kernel keeps time with the TSC (then the counter is
/// invariant and synchronised across CPUs: the kernel checked).
fn kernel_uses_tsc() -> bool {
    cfg!(target_arch = "x86_64")
        && std::fs::read_to_string(
            "/sys/devices/system/clocksource/clocksource0/current_clocksource",
        )
        .is_ok_and(|s| s.trim() == "tsc")
}

/// A (counter, monotonic ns) pair read as close together as this thread
/// can: the middle of the tightest of 32 counter-clock-counter brackets.
fn bracketed_pair() -> (u64, u64) {
    let mut best = (u64::MAX, 0, 0);
    for _ in 0..32 {
        let a = tsc();
        let m = monotonic_ns();
        let b = tsc();
        let width = b.wrapping_sub(a);
        if b >= a && width < best.0 {
            best = (width, a + width / 2, m);
        }
    }
    (best.1, best.2)
}

impl Clock {
    /// The process's clock (measured on first use).
    pub(crate) fn get() -> &'static Clock {
        static CLOCK: OnceLock<Clock> = OnceLock::new();
        CLOCK.get_or_init(|| {
            if kernel_uses_tsc() {
                Clock::calibrated()
            } else {
                Clock::monotonic()
            }
        })
    }

    /// A clock on `clock_gettime(CLOCK_MONOTONIC)`.
    pub(crate) fn monotonic() -> Clock {
        Clock {
            source: Source::Monotonic,
        }
    }

    /// A TSC clock whose rate is measured now against CLOCK_MONOTONIC
    /// (falls back to the monotonic clock when the counter does not move).
    /// Each end of the measurement is the tightest of several
    /// counter-clock-counter brackets, so a preemption while reading (a
    /// busy host) cannot skew the rate.
    fn calibrated() -> Clock {
        let (t0, m0) = bracketed_pair();
        // Sleep rather than spin: a counted run (callgrind) executes the
        // same instructions however long the calibration takes.
        std::thread::sleep(CALIBRATION);
        let (t1, m1) = bracketed_pair();
        let ticks = t1.wrapping_sub(t0);
        if ticks == 0 || t1 < t0 || m1 <= m0 {
            return Clock::monotonic();
        }
        let mult = ((u128::from(m1 - m0) << 32) / u128::from(ticks)) as u64;
        if mult == 0 {
            return Clock::monotonic();
        }
        Clock {
            source: Source::Tsc { mult },
        }
    }

    #[cfg(test)]
    pub(crate) fn source(&self) -> Source {
        self.source
    }

    /// A TSC clock of `mult / 2^32` ns per tick, to test conversions (its
    /// readings are the real counter's).
    #[cfg(test)]
    pub(crate) fn tsc_with(mult: u64) -> Clock {
        Clock {
            source: Source::Tsc { mult },
        }
    }

    /// The raw reading: counter ticks ([`ns_per_tick`](Self::ns_per_tick)
    /// ns each), or ns on the monotonic clock. The statistics record
    /// ticks on the hot path and convert at report time, so a reading is
    /// the counter itself, without the multiply of [`now`](Self::now).
    /// Always inlined: the statistics' functions that read it count it as
    /// theirs (`blklab bench --instructions`).
    #[inline(always)]
    pub(crate) fn ticks(&self) -> u64 {
        match self.source {
            Source::Tsc { .. } => TscTicks::read(),
            Source::Monotonic => MonotonicTicks::read(),
        }
    }

    /// Whether [`ticks`](Self::ticks) are [`TscTicks`] (else
    /// [`MonotonicTicks`]).
    pub(crate) fn is_tsc(&self) -> bool {
        matches!(self.source, Source::Tsc { .. })
    }

    /// Nanoseconds per tick of [`ticks`](Self::ticks) (1 on the monotonic
    /// clock).
    pub(crate) fn ns_per_tick(&self) -> f64 {
        match self.source {
            Source::Tsc { mult } => mult as f64 / (1u64 << 32) as f64,
            Source::Monotonic => 1.0,
        }
    }

    /// `ticks` in ns, as [`now`](Self::now) converts a reading.
    #[cfg(test)]
    #[inline]
    pub(crate) fn ticks_to_ns(&self, ticks: u64) -> u64 {
        match self.source {
            Source::Tsc { mult } => ((u128::from(ticks) * u128::from(mult)) >> 32) as u64,
            Source::Monotonic => ticks,
        }
    }

    /// Nanoseconds since an arbitrary origin (the same for every thread).
    /// Never inlined: `blklab bench --instructions` counts the statistics'
    /// clock reads as this function's.
    #[cfg(test)]
    #[inline(never)]
    pub(crate) fn now(&self) -> u64 {
        self.ticks_to_ns(self.ticks())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_follows_the_monotonic_clock() {
        for c in [*Clock::get(), Clock::monotonic()] {
            // Each reading of `c` is bracketed by monotonic readings, so a
            // preemption between them widens the allowed range instead of
            // failing the test.
            let (m0a, a, m0b) = (monotonic_ns(), c.now(), monotonic_ns());
            std::thread::sleep(Duration::from_millis(50));
            let (m1a, b, m1b) = (monotonic_ns(), c.now(), monotonic_ns());
            assert!(b >= a, "{c:?} went back");
            let got = (b - a) as f64;
            let (lo, hi) = ((m1a - m0b) as f64, (m1b - m0a) as f64);
            // The rate is measured to a few parts per million; allow 0.5 %.
            assert!(
                got >= lo * 0.995 && got <= hi * 1.005,
                "{c:?}: {got} ns, monotonic between {lo} and {hi}"
            );
        }
    }

    #[test]
    fn ticks_convert_to_the_clocks_nanoseconds() {
        let m = Clock::monotonic();
        assert_eq!(m.ns_per_tick(), 1.0);
        assert_eq!(m.ticks_to_ns(12_345), 12_345);
        let (a, t, b) = (monotonic_ns(), m.ticks(), monotonic_ns());
        assert!(a <= t && t <= b);
        // 3 ticks per ns (a 3 GHz counter).
        let c = Clock::tsc_with((1u64 << 32) / 3);
        assert!((c.ns_per_tick() - 1.0 / 3.0).abs() < 1e-9);
        assert_eq!(c.ticks_to_ns(3_000_000_000), 999_999_999);
        let g = *Clock::get();
        let (t0, n0) = (g.ticks(), g.now());
        assert!(g.ticks_to_ns(t0) <= n0);
    }

    #[test]
    fn the_source_is_the_kernels() {
        let tsc = matches!(Clock::get().source(), Source::Tsc { .. });
        assert_eq!(tsc, kernel_uses_tsc());
    }
}
