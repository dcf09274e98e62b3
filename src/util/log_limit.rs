//! At most one log line per interval for events a local client can cause
//! at will (connections over a cap, accept failures, broken connections),
//! so that nobody can grow the host's log without bound; the lines that
//! were held back are counted in the next one.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One kind of event's log budget: a line per `interval`.
#[derive(Debug)]
pub(crate) struct LogLimit {
    interval: Duration,
    /// When the last line was let through, and how many events were held
    /// back since.
    state: Mutex<(Option<Instant>, u64)>,
}

impl LogLimit {
    pub(crate) const fn new(interval: Duration) -> LogLimit {
        LogLimit {
            interval,
            state: Mutex::new((None, 0)),
        }
    }

    /// An event happened at `now`: `Some(held_back)` when a line may be
    /// logged for it (with the number of events since the last line that
    /// were not logged), `None` when it is only counted.
    pub(crate) fn event_at(&self, now: Instant) -> Option<u64> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match st.0 {
            Some(last) if now.saturating_duration_since(last) < self.interval => {
                st.1 += 1;
                None
            }
            _ => {
                let held = std::mem::take(&mut st.1);
                st.0 = Some(now);
                Some(held)
            }
        }
    }

    /// [`event_at`](Self::event_at) now.
    pub(crate) fn event(&self) -> Option<u64> {
        self.event_at(Instant::now())
    }

    /// " (N more not logged)" for a line after `held` events were held
    /// back, or nothing.
    pub(crate) fn held_note(held: u64) -> String {
        if held == 0 {
            String::new()
        } else {
            format!(" ({held} more not logged)")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_and_the_rest_counted() {
        let l = LogLimit::new(Duration::from_secs(10));
        let t = Instant::now();
        assert_eq!(l.event_at(t), Some(0));
        for i in 1..=1000 {
            assert_eq!(l.event_at(t + Duration::from_millis(i)), None);
        }
        assert_eq!(l.event_at(t + Duration::from_secs(10)), Some(1000));
        assert_eq!(l.event_at(t + Duration::from_secs(11)), None);
        assert_eq!(l.event_at(t + Duration::from_secs(25)), Some(1));
        assert_eq!(LogLimit::held_note(0), "");
        assert_eq!(LogLimit::held_note(3), " (3 more not logged)");
    }
}
