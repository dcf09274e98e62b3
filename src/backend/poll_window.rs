//! The adaptive poll window (`--poll=adaptive[:MAX]`): how long a worker
//! polls an idle ring before it re-enables guest notifications and sleeps.
//!
//! It follows QEMU's `adjust_polling_time` (`util/aio-posix.c`), with
//! QEMU's constants. `block` is how long the queue waited for the guest's
//! next request: from the first look that found its ring empty after the
//! worker last put something on it or popped from it, to the look that
//! found a request, whether polling found it or a kick woke the worker
//! first. After each such wait:
//!
//! - `block <= window`: polling caught it; the window stays;
//! - `block > MAX`: polling that long would have been wasted; the window
//!   shrinks, divided by [`SHRINK`] (QEMU's `poll-shrink` default 0 means
//!   reset to 0);
//! - `window < block < MAX` and `window < MAX`: a longer window would
//!   have caught it; it grows, multiplied by [`GROW`] (`poll-grow`'s
//!   default), from [`START`] when it was 0, to at most MAX;
//! - `block == MAX`: it stays.
//!
//! So a queue whose guest answers within MAX ends up polled for up to
//! MAX after each completion, and one left idle longer than MAX shrinks
//! back to 0: it sleeps at once after its next pass and costs no CPU.

use std::time::Duration;

/// The first window after 0 (QEMU: "start polling at 4 microseconds").
pub(crate) const START: Duration = Duration::from_micros(4);
/// The factor a window grows by (QEMU's `poll-grow` default, 0, means 2).
pub(crate) const GROW: u64 = 2;
/// The divisor a window shrinks by; 0 resets it (QEMU's `poll-shrink`
/// default).
pub(crate) const SHRINK: u64 = 0;

/// What one adjustment did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Adjusted {
    Kept,
    Grew,
    Shrank,
}

/// A queue's poll window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PollWindow {
    ns: u64,
    max_ns: u64,
}

impl PollWindow {
    /// A window of 0 (the first wait sleeps at once), at most `max`.
    pub(crate) fn new(max: Duration) -> PollWindow {
        PollWindow {
            ns: 0,
            max_ns: max.as_nanos() as u64,
        }
    }

    /// How long to poll an idle ring now.
    pub(crate) fn window(&self) -> Duration {
        Duration::from_nanos(self.ns)
    }

    /// Adjust to a wait of `block` for the guest's next request.
    pub(crate) fn adjust(&mut self, block: Duration) -> Adjusted {
        let block = block.as_nanos().min(u128::from(u64::MAX)) as u64;
        if block <= self.ns {
            return Adjusted::Kept;
        }
        if block > self.max_ns {
            self.ns = match SHRINK {
                0 => 0,
                s => self.ns / s,
            };
            return Adjusted::Shrank;
        }
        if self.ns >= self.max_ns || block >= self.max_ns {
            return Adjusted::Kept;
        }
        self.ns = match self.ns {
            0 => START.as_nanos() as u64,
            ns => ns.saturating_mul(GROW),
        }
        .min(self.max_ns);
        Adjusted::Grew
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: u64 = 1000;

    /// A scripted sequence of waits: each step is a wait for the guest's
    /// next request (µs) and the window after it (µs).
    #[test]
    fn the_window_grows_while_polling_would_catch_and_shrinks_when_not() {
        let mut w = PollWindow::new(Duration::from_micros(32));
        assert_eq!(w.window(), Duration::ZERO, "a new queue sleeps at once");
        let script: &[(u64, u64, Adjusted)] = &[
            // Requests 10 µs apart: each would have been caught by a
            // longer window, so it doubles from 4 µs until it catches
            // them (16 µs), and then stays.
            (10, 4, Adjusted::Grew),
            (10, 8, Adjusted::Grew),
            (10, 16, Adjusted::Grew),
            (10, 16, Adjusted::Kept),
            (3, 16, Adjusted::Kept),
            // 20 µs: within MAX, so it grows to MAX and no further.
            (20, 32, Adjusted::Grew),
            (30, 32, Adjusted::Kept),
            (32, 32, Adjusted::Kept),
            // An idle spell longer than MAX: polling would be wasted; the
            // default shrink resets it, and the queue sleeps at once.
            (1000, 0, Adjusted::Shrank),
            (50_000, 0, Adjusted::Shrank),
            // Busy again: the first quick request restarts it at 4 µs.
            (1, 4, Adjusted::Grew),
            (2, 4, Adjusted::Kept),
            // Exactly MAX: neither grows nor shrinks (QEMU's strict bounds).
            (32, 4, Adjusted::Kept),
            (33, 0, Adjusted::Shrank),
        ];
        for (i, &(block_us, window_us, what)) in script.iter().enumerate() {
            let got = w.adjust(Duration::from_micros(block_us));
            assert_eq!(
                (got, w.window()),
                (what, Duration::from_nanos(window_us * US)),
                "step {i}: a wait of {block_us} us"
            );
        }
    }

    #[test]
    fn a_bound_below_the_start_caps_it() {
        let mut w = PollWindow::new(Duration::from_micros(3));
        assert_eq!(w.adjust(Duration::from_micros(2)), Adjusted::Grew);
        assert_eq!(w.window(), Duration::from_micros(3));
        assert_eq!(w.adjust(Duration::from_micros(3)), Adjusted::Kept);
        assert_eq!(w.adjust(Duration::from_nanos(3001)), Adjusted::Shrank);
        assert_eq!(w.window(), Duration::ZERO);
    }
}
