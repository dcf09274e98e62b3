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

    /// Clear a pending expiry (never blocks). Returns true if it had fired.
    pub(crate) fn acknowledge(&mut self) -> bool {
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
            self.armed_for = None;
            return true;
        }
        false
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
        assert!(!t.acknowledge(), "unarmed: nothing to read, no blocking");
        let deadline = Instant::now() + Duration::from_millis(20);
        t.set(Some(deadline)).unwrap();
        // Never early: whenever it is readable, the deadline has passed
        // (this thread may itself be running late on a loaded machine).
        if readable(&t, 5) {
            assert!(Instant::now() >= deadline, "fired before its deadline");
        }
        assert!(readable(&t, MUST_MS));
        assert!(Instant::now() >= deadline, "fired before its deadline");
        assert!(t.acknowledge());
        assert!(!t.acknowledge());
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
}
