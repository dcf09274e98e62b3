//! A connection's dirty logging: the frontend's log (SET_LOG_BASE), its
//! eventfd (SET_LOG_FD), and whether the workers mark it now.
//!
//! QEMU acks VHOST_F_LOG_ALL (SET_FEATURES) when a migration starts and
//! clears it when the migration ends or fails; the log itself may come
//! before (QEMU sends SET_LOG_BASE first) and may be replaced while the
//! guest runs (a larger log after memory hotplug). Logging is on while both
//! are there. A worker takes the log once per pass ([`current`]): with
//! logging off that is one relaxed load and nothing else.
//!
//! [`current`]: DirtyLogging::current

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use log::warn;

use crate::util::fd::signal_eventfd;
use crate::virtq::dirty_log::DirtyLog;

/// The log, the log's eventfd and the acked LOG_ALL, under one lock.
#[derive(Default)]
struct Inner {
    log: Option<Arc<DirtyLog>>,
    kick: Option<File>,
    log_all: bool,
}

/// A connection's dirty logging.
#[derive(Default)]
pub(crate) struct DirtyLogging {
    /// LOG_ALL is acked and a log is set: the workers mark it.
    on: AtomicBool,
    inner: Mutex<Inner>,
    warned_kick: AtomicBool,
}

impl DirtyLogging {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The log a pass marks: `None` while logging is off.
    #[inline]
    pub(crate) fn current(&self) -> Option<Arc<DirtyLog>> {
        if !self.on.load(Ordering::Acquire) {
            return None;
        }
        self.current_log()
    }

    #[cold]
    #[inline(never)]
    fn current_log(&self) -> Option<Arc<DirtyLog>> {
        self.lock().log.clone()
    }

    /// Whether the frontend has LOG_ALL acked.
    pub(crate) fn log_all(&self) -> bool {
        self.lock().log_all
    }

    /// SET_FEATURES: LOG_ALL acked or not. True when what the workers mark
    /// changed (the caller then waits for the passes in progress).
    pub(crate) fn set_log_all(&self, log_all: bool) -> bool {
        let mut g = self.lock();
        g.log_all = log_all;
        self.update(&g)
    }

    /// SET_LOG_BASE: mark `log` from now on. True when what the workers
    /// mark changed.
    pub(crate) fn set_log(&self, log: DirtyLog) -> bool {
        let mut g = self.lock();
        g.log = Some(Arc::new(log));
        self.update(&g)
    }

    /// SET_LOG_FD: the eventfd written after a pass that marked the log
    /// (never blocking, its flags left as the frontend set them: see
    /// [`kick`](Self::kick)).
    pub(crate) fn set_kick(&self, file: File) -> io::Result<()> {
        self.lock().kick = Some(file);
        Ok(())
    }

    /// Turn logging on or off after a change; true when it is on now or
    /// was on before.
    fn update(&self, g: &Inner) -> bool {
        let on = g.log_all && g.log.is_some();
        let was = self.on.swap(on, Ordering::AcqRel);
        on || was
    }

    /// Tell the frontend that the log has new marks (libvhost-user's
    /// `vu_log_kick`): write 1 to the log's eventfd, if it sent one. A full
    /// counter needs no second write; another failure is warned about once.
    pub(crate) fn kick(&self) {
        let g = self.lock();
        let Some(f) = g.kick.as_ref() else {
            return;
        };
        match signal_eventfd(f.as_raw_fd()) {
            Ok(_) => {}
            Err(e) => {
                if !self.warned_kick.swap(true, Ordering::Relaxed) {
                    warn!(
                        "cannot write the dirty log's eventfd: {e} (further failures not logged)"
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::FromRawFd;
    use vmm_sys_util::eventfd::EventFd;

    #[test]
    fn logging_is_on_with_log_all_and_a_log_only() {
        let d = DirtyLogging::default();
        assert!(d.current().is_none());
        assert!(!d.set_log_all(true), "no log yet: nothing changes");
        assert!(d.current().is_none());
        assert!(d.set_log(DirtyLog::in_memfd(8)));
        assert!(d.current().is_some());
        let log = d.current().unwrap();
        assert!(d.set_log(DirtyLog::in_memfd(16)), "a new log while on");
        assert!(!Arc::ptr_eq(&log, &d.current().unwrap()));
        assert!(d.set_log_all(false));
        assert!(d.current().is_none());
        assert!(!d.set_log_all(false));
        assert!(!d.set_log(DirtyLog::in_memfd(8)), "a log while off");
        assert!(d.set_log_all(true));
        assert!(d.current().is_some());
    }

    #[test]
    fn a_kick_writes_the_eventfd_and_never_blocks() {
        let d = DirtyLogging::default();
        d.kick(); // none set
        let efd = EventFd::new(0).unwrap();
        // SAFETY: a duplicate of the eventfd, owned by the File.
        let dup = unsafe { File::from_raw_fd(libc::dup(efd.as_raw_fd())) };
        d.set_kick(dup).unwrap();
        d.kick();
        d.kick();
        assert_eq!(efd.read().unwrap(), 2);
        // A pipe nobody reads: the writes stop when it is full, the
        // worker does not.
        let mut fds = [0; 2];
        // SAFETY: pipe(2) fills the two-element array.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: both ends are fresh descriptors, owned by the Files.
        let (_r, w) = unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) };
        d.set_kick(w).unwrap();
        for _ in 0..100_000 {
            d.kick();
        }
    }
}
