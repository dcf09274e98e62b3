//! A backend daemon for a measurement or a test: started with its stdin
//! closed, ready once its sockets exist, stopped with SIGTERM. The one
//! spawner behind `blklab bench --compare` (qemu-storage-daemon and
//! `blklab serve`) and the tests and benches (`tests/common`).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::BenchError;

/// How long a dropped daemon has between SIGTERM and SIGKILL.
const DROP_GRACE: Duration = Duration::from_secs(10);

/// A running daemon. Dropping it stops it: SIGTERM, then SIGKILL if it has
/// not exited within 10 s.
pub struct Daemon {
    name: String,
    child: Child,
}

/// What tells two files at one path apart: a socket created again at the
/// same path is a new inode, or the same inode number with a new ctime.
fn identity(p: &Path) -> Option<(u64, i64, i64)> {
    std::fs::metadata(p)
        .ok()
        .map(|m| (m.ino(), m.ctime(), m.ctime_nsec()))
}

impl Daemon {
    /// Start `cmd` (stdin closed; `name` names it in errors) and wait, for
    /// at most `patience`, until every path in `ready` exists. A path that
    /// already exists when the command starts (a stale socket the daemon
    /// is to replace) counts once it is a different file.
    pub fn start(
        name: &str,
        cmd: &mut Command,
        ready: &[PathBuf],
        patience: Duration,
    ) -> Result<Daemon, BenchError> {
        let stale: Vec<_> = ready.iter().map(|p| identity(p)).collect();
        let child = cmd
            .stdin(Stdio::null())
            .spawn()
            .map_err(|source| BenchError::Start {
                name: name.to_string(),
                source,
            })?;
        let mut d = Daemon {
            name: name.to_string(),
            child,
        };
        let deadline = Instant::now() + patience;
        let is_ready =
            |(p, old): (&PathBuf, &Option<_>)| identity(p).is_some_and(|id| Some(id) != *old);
        while !ready.iter().zip(&stale).all(is_ready) {
            if let Some(st) = d.exited() {
                return Err(BenchError::ExitedEarly {
                    name: name.to_string(),
                    status: st,
                });
            }
            if Instant::now() >= deadline {
                return Err(BenchError::NotReady {
                    name: name.to_string(),
                    paths: ready.to_vec(),
                    patience,
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(d)
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// The exit status once the daemon has exited; `None` while it runs.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// True while the process is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Send SIGTERM and wait up to `patience` for the daemon to exit; its
    /// exit status. A daemon that does not exit in time is killed, and the
    /// error says so.
    pub fn terminate(&mut self, patience: Duration) -> Result<ExitStatus, BenchError> {
        if let Some(st) = self.exited() {
            return Ok(st);
        }
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        unsafe {
            libc::kill(self.pid(), libc::SIGTERM);
        }
        let deadline = Instant::now() + patience;
        loop {
            if let Some(st) = self.exited() {
                return Ok(st);
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return Err(BenchError::NoExit {
                    name: self.name.clone(),
                    patience,
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.terminate(DROP_GRACE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_when_the_path_appears_and_stopped_by_sigterm() {
        let dir = tempfile::tempdir().unwrap();
        let flag = dir.path().join("ready");
        let mut d = Daemon::start(
            "sh",
            Command::new("sh")
                .arg("-c")
                .arg("touch \"$0\"; exec sleep 30")
                .arg(&flag),
            std::slice::from_ref(&flag),
            Duration::from_secs(30),
        )
        .unwrap();
        assert!(flag.exists() && d.alive());
        let st = d.terminate(Duration::from_secs(30)).unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&st),
            Some(libc::SIGTERM)
        );
        assert!(!d.alive());
    }

    #[test]
    fn a_stale_file_is_not_ready_and_early_exits_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let stale = dir.path().join("stale");
        std::fs::write(&stale, b"old").unwrap();
        let e = Daemon::start(
            "true",
            &mut Command::new("true"),
            &[stale],
            Duration::from_secs(30),
        )
        .err()
        .unwrap();
        assert!(matches!(e, BenchError::ExitedEarly { .. }), "{e}");
        assert!(e.to_string().starts_with("true exited early"), "{e}");
        let e = Daemon::start(
            "nothing",
            &mut Command::new("/nonexistent/daemon"),
            &[],
            Duration::from_secs(1),
        )
        .err()
        .unwrap();
        assert!(matches!(e, BenchError::Start { .. }), "{e}");
        let e = Daemon::start(
            "sleep",
            Command::new("sleep").arg("30"),
            &[dir.path().join("never")],
            Duration::from_millis(100),
        )
        .err()
        .unwrap();
        assert!(matches!(e, BenchError::NotReady { .. }), "{e}");
        assert!(e.to_string().contains("did not appear"), "{e}");
    }
}
