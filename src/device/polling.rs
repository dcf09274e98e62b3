//! How a disk's queues are polled (`--poll`): not at all (notify mode: a
//! worker sleeps in epoll until the guest kicks or a timer fires), for a
//! fixed idle spin after every pass (`on`, `SPIN`), or for an adaptive
//! window that follows QEMU's `util/aio-posix.c` (`adaptive[:MAX]`; the
//! window itself is `backend/poll_window.rs`).

use std::fmt;
use std::time::Duration;

use crate::device::latency::{FmtDuration, LatencySpec};

/// `--poll` without a value, and `on`: the idle spin of always-on polling.
pub(crate) const DEFAULT_SPIN: Duration = Duration::from_micros(50);
/// `adaptive` without a bound: the longest poll window, QEMU's
/// `poll-max-ns` default for an IOThread (32768 ns there).
pub(crate) const DEFAULT_ADAPTIVE_MAX: Duration = Duration::from_micros(32);
/// The range a spin or an adaptive bound may take.
const SHORTEST: Duration = Duration::from_micros(1);
const LONGEST: Duration = Duration::from_millis(100);

/// How a disk's queues are polled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PollMode {
    /// Notify mode: guest notifications always on, the worker sleeps
    /// between wake-ups.
    Off,
    /// Always-on polling: after each pass the worker keeps polling a ring
    /// with guest notifications off until it has been idle this long.
    Fixed(Duration),
    /// Adaptive polling: the idle window grows while polling would have
    /// caught the guest's next request and shrinks when it would not, up
    /// to `max`.
    Adaptive { max: Duration },
}

/// A `--poll` value that is none of the accepted forms.
#[derive(Debug, thiserror::Error)]
#[error("invalid --poll {0:?}: expected off, on, an idle spin of 1us..=100ms (e.g. 50us), adaptive, or adaptive:MAX with MAX 1us..=100ms (e.g. adaptive:32us)")]
pub struct PollParseError(pub String);

/// A duration of 1us..=100ms.
fn bounded(text: &str) -> Option<Duration> {
    match text.parse::<LatencySpec>() {
        Ok(LatencySpec::Fixed(d)) if (SHORTEST..=LONGEST).contains(&d) => Some(d),
        _ => None,
    }
}

impl std::str::FromStr for PollMode {
    type Err = PollParseError;

    fn from_str(s: &str) -> Result<PollMode, PollParseError> {
        let bad = || PollParseError(s.to_string());
        match s {
            "off" => Ok(PollMode::Off),
            "on" => Ok(PollMode::Fixed(DEFAULT_SPIN)),
            "adaptive" => Ok(PollMode::Adaptive {
                max: DEFAULT_ADAPTIVE_MAX,
            }),
            _ => match s.strip_prefix("adaptive:") {
                Some(max) => bounded(max)
                    .map(|max| PollMode::Adaptive { max })
                    .ok_or_else(bad),
                None => bounded(s).map(PollMode::Fixed).ok_or_else(bad),
            },
        }
    }
}

impl fmt::Display for PollMode {
    /// The form `--poll` and a scenario's `device poll=` take: `off`, the
    /// spin (`50us`), `adaptive:32us`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            PollMode::Off => f.write_str("off"),
            PollMode::Fixed(spin) => write!(f, "{}", FmtDuration(spin)),
            PollMode::Adaptive { max } => write!(f, "adaptive:{}", FmtDuration(max)),
        }
    }
}

impl PollMode {
    /// The mode a disk's recorded fields describe (see `DiskConfig`):
    /// the fixed spin, else the adaptive bound, else off.
    pub(crate) fn from_fields(spin_ns: u64, adaptive_max_ns: u64) -> PollMode {
        match (spin_ns, adaptive_max_ns) {
            (0, 0) => PollMode::Off,
            (0, max) => PollMode::Adaptive {
                max: Duration::from_nanos(max),
            },
            (spin, _) => PollMode::Fixed(Duration::from_nanos(spin)),
        }
    }

    /// The recorded fields of this mode: (fixed spin, adaptive bound), ns.
    pub(crate) fn fields(self) -> (u64, u64) {
        match self {
            PollMode::Off => (0, 0),
            PollMode::Fixed(spin) => (spin.as_nanos() as u64, 0),
            PollMode::Adaptive { max } => (0, max.as_nanos() as u64),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_parses_and_prints_back() {
        let us = Duration::from_micros;
        for (text, mode, printed) in [
            ("off", PollMode::Off, "off"),
            ("on", PollMode::Fixed(us(50)), "50us"),
            ("50us", PollMode::Fixed(us(50)), "50us"),
            ("1ms", PollMode::Fixed(us(1000)), "1ms"),
            (
                "adaptive",
                PollMode::Adaptive { max: us(32) },
                "adaptive:32us",
            ),
            (
                "adaptive:64us",
                PollMode::Adaptive { max: us(64) },
                "adaptive:64us",
            ),
            (
                "adaptive:1us",
                PollMode::Adaptive { max: us(1) },
                "adaptive:1us",
            ),
        ] {
            let m: PollMode = text.parse().unwrap();
            assert_eq!(m, mode, "{text}");
            assert_eq!(m.to_string(), printed, "{text}");
            assert_eq!(printed.parse::<PollMode>().unwrap(), mode, "{printed}");
            let (spin, max) = m.fields();
            assert_eq!(PollMode::from_fields(spin, max), m, "{text}");
        }
    }

    #[test]
    fn out_of_range_and_unknown_forms_are_refused() {
        for bad in [
            "",
            "0",
            "0us",
            "500ns",
            "101ms",
            "1s",
            "adaptive:",
            "adaptive:0",
            "adaptive:200ms",
            "adaptive:fast",
            "always",
            "on:50us",
            "uniform:1us..2us",
        ] {
            let e = bad.parse::<PollMode>().unwrap_err();
            assert!(e.to_string().contains(&format!("{bad:?}")), "{bad}: {e}");
        }
    }
}
