//! A non-blocking timerfd that fires at a deadline: how a queue's worker
//! learns that an emulated completion is due without sleeping in its event
//! handler.

use std::io;
use std::os::unix::io::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Instant;

/// A CLOCK_MONOTONIC timerfd armed for one deadline at a time.
pub(crate) struct DeadlineTimer {
    fd: OwnedFd,
    armed_for: Option<Instant>,
}

impl DeadlineTimer {
    pub(crate) fn new() -> io::Result<DeadlineTimer> {
        // SAFETY: timerfd_create has no memory effects; the result is checked.
        let fd = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(DeadlineTimer {
            fd,
            armed_for: None,
        })
    }

    /// Fire at `deadline` (now, if it has passed); `None` disarms.
    pub(crate) fn set(&mut self, deadline: Option<Instant>) -> io::Result<()> {
        if self.armed_for == deadline {
            return Ok(());
        }
        let mut spec: libc::itimerspec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
        };
        if let Some(d) = deadline {
            // A zero it_value would disarm: wait at least a nanosecond.
            let wait = d
                .saturating_duration_since(Instant::now())
                .max(std::time::Duration::from_nanos(1));
            spec.it_value.tv_sec = wait.as_secs() as libc::time_t;
            spec.it_value.tv_nsec = wait.subsec_nanos() as libc::c_long;
        }
        // SAFETY: `spec` is a valid itimerspec; the old value is not wanted.
        let rc =
            unsafe { libc::timerfd_settime(self.fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        self.armed_for = deadline;
        Ok(())
    }

    /// Clear a pending expiry (never blocks). Returns the time it was
    /// armed for if it had fired.
    pub(crate) fn acknowledge(&mut self) -> Option<Instant> {
        let mut buf = [0u8; 8];
        // SAFETY: reading 8 bytes into our buffer from our non-blocking fd.
        let n = unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                buf.as_mut_ptr() as *mut libc::c_void,
                8,
            )
        };
        if n == 8 {
            return self.armed_for.take();
        }
        None
    }
}

/// How early adaptive polling arms a queue's completion timer: the
/// timer's lateness as this queue has seen it, so that the worker wakes
/// before the deadline and polls the rest of the way instead of
/// completing late (a timerfd fires tens of µs after its time when the
/// thread has to be woken from idle; timer slack does not apply to
/// timerfds).
///
/// The estimate follows each wake-up's lateness, up a quarter of the way
/// when it was later and down a thirty-second when it was earlier: it
/// settles near the 90th percentile of recent lateness (where the steps
/// balance, 8 times as many wake-ups below it as above), and is bounded by
/// [`TimerLead::CAP`] times the poll window's bound, so a host that wakes
/// threads very late does not turn every timer into a long spin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TimerLead {
    ns: u64,
    cap_ns: u64,
}

impl TimerLead {
    /// The bound, in multiples of the adaptive poll window's bound.
    pub(crate) const CAP: u64 = 4;

    /// No lead yet, at most `CAP` × `window_max`.
    pub(crate) fn new(window_max: std::time::Duration) -> TimerLead {
        TimerLead {
            ns: 0,
            cap_ns: (window_max.as_nanos() as u64).saturating_mul(Self::CAP),
        }
    }

    /// How early to arm the timer.
    pub(crate) fn lead(&self) -> std::time::Duration {
        std::time::Duration::from_nanos(self.ns)
    }

    /// A wake-up `late` after the time the timer was armed for.
    pub(crate) fn observe(&mut self, late: std::time::Duration) {
        let late = (late.as_nanos().min(u128::from(u64::MAX)) as u64).min(self.cap_ns);
        if late > self.ns {
            self.ns += (late - self.ns).div_ceil(4);
        } else {
            self.ns -= (self.ns - late) / 32;
        }
    }
}

impl AsRawFd for DeadlineTimer {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn readable(t: &DeadlineTimer, timeout_ms: i32) -> bool {
        crate::util::fd::readable_within(t.as_raw_fd(), timeout_ms)
    }

    /// How long to wait for an expiry that must come (generous: the point
    /// is that it comes, on however loaded a machine).
    const MUST_MS: i32 = 30_000;

    #[test]
    fn fires_at_deadline_and_never_blocks() {
        let mut t = DeadlineTimer::new().unwrap();
        assert_eq!(
            t.acknowledge(),
            None,
            "unarmed: nothing to read, no blocking"
        );
        let deadline = Instant::now() + Duration::from_millis(20);
        t.set(Some(deadline)).unwrap();
        // Never early: whenever it is readable, the deadline has passed
        // (this thread may itself be running late on a loaded machine).
        if readable(&t, 5) {
            assert!(Instant::now() >= deadline, "fired before its deadline");
        }
        assert!(readable(&t, MUST_MS));
        assert!(Instant::now() >= deadline, "fired before its deadline");
        assert_eq!(t.acknowledge(), Some(deadline));
        assert_eq!(t.acknowledge(), None);
        // A deadline in the past fires at once; disarming stops it.
        t.set(Some(Instant::now() - Duration::from_millis(1)))
            .unwrap();
        assert!(readable(&t, MUST_MS));
        t.acknowledge();
        let deadline = Instant::now() + Duration::from_millis(10);
        t.set(Some(deadline)).unwrap();
        t.set(None).unwrap();
        // A disarmed timer stays quiet past its old deadline (this wait
        // can only fail if it fires).
        assert!(!readable(&t, 30), "a disarmed timer fired");
        while Instant::now() <= deadline {
            assert!(!readable(&t, 5), "a disarmed timer fired");
        }
        assert!(!readable(&t, 0), "a disarmed timer fired");
    }

    #[test]
    fn the_lead_settles_near_the_usual_lateness_and_stays_bounded() {
        let us = Duration::from_micros;
        let mut l = TimerLead::new(us(32));
        assert_eq!(l.lead(), Duration::ZERO);
        // Nine wake-ups in ten 40 µs late, one 100 µs late: the lead goes
        // up quickly and settles between the two.
        for i in 0..2000 {
            l.observe(us(if i % 10 == 9 { 100 } else { 40 }));
        }
        let settled = l.lead();
        assert!(settled > us(40) && settled < us(100), "{settled:?}");
        // A host that gets faster: the lead follows it down, slowly.
        for _ in 0..2000 {
            l.observe(us(5));
        }
        assert!(l.lead() < us(10), "{:?}", l.lead());
        // Very late wake-ups cannot push it past 4 x 32 µs.
        for _ in 0..100 {
            l.observe(Duration::from_millis(5));
        }
        assert_eq!(l.lead(), us(128));
    }
}
