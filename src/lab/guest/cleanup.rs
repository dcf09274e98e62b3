//! What must not outlive `blklab run`: QEMU processes and the boots'
//! socket directories. QEMU also gets PR_SET_PDEATHSIG (SIGKILL), so it
//! dies with us however we die; SIGINT and SIGTERM are caught (blocked in
//! every thread, taken by one watcher thread), which kills and reaps the
//! QEMU processes, removes the directories and exits with 128 + signal.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, Once};

use log::warn;

#[derive(Default)]
pub(crate) struct Registry {
    pids: Vec<i32>,
    dirs: Vec<PathBuf>,
}

pub(crate) static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    pids: Vec::new(),
    dirs: Vec::new(),
});

pub(crate) fn lock() -> std::sync::MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

impl Registry {
    /// A child to kill on a signal; reap it with the registry locked
    /// and [`Registry::untrack_pid`] it in the same critical section,
    /// so a reaped (and possibly reused) pid is never killed.
    pub(crate) fn track_pid(&mut self, pid: i32) {
        self.pids.push(pid);
    }
    pub(crate) fn untrack_pid(&mut self, pid: i32) {
        self.pids.retain(|&p| p != pid);
    }
}

pub(crate) fn track_dir(p: &Path) {
    lock().dirs.push(p.to_path_buf());
}

pub(crate) fn untrack_dir(p: &Path) {
    lock().dirs.retain(|d| d != p);
}

/// Install the SIGINT/SIGTERM watcher (once per process). Call before
/// starting any thread, so every thread inherits the blocked mask.
pub(crate) fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let set = match crate::backend::server::block_termination_signals() {
            Ok(set) => set,
            Err(e) => {
                warn!("cannot block SIGINT/SIGTERM ({e}); a signal may leave QEMU running");
                return;
            }
        };
        let spawned = std::thread::Builder::new()
            .name("blklab-signals".into())
            .spawn(move || {
                let name = crate::backend::server::wait_for_signal(&set);
                let sig = if name == "SIGINT" { libc::SIGINT } else { libc::SIGTERM };
                // Keep the registry locked to the end: nobody starts
                // or reaps a child meanwhile.
                let reg = lock();
                warn!(
                    "received {name}: stopping {} QEMU process(es) and removing the boot directories",
                    reg.pids.len()
                );
                for &pid in &reg.pids {
                    // SAFETY: kill and waitpid on our own child (still
                    // unreaped: reaping happens under this lock).
                    unsafe {
                        libc::kill(pid, libc::SIGKILL);
                        libc::waitpid(pid, std::ptr::null_mut(), 0);
                    }
                }
                for d in &reg.dirs {
                    let _ = std::fs::remove_dir_all(d);
                }
                std::process::exit(128 + sig);
            });
        if let Err(e) = spawned {
            warn!("cannot start the signal watcher ({e}); a signal may leave QEMU running");
        }
    });
}
