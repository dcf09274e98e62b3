//! Shared helpers for integration tests: start the real `blklab` binary on a
//! real Unix socket and stop it cleanly.
#![allow(dead_code)]

pub mod client;
pub mod tools;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Path of the `blklab` binary cargo built for this test run.
pub fn blklab_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_blklab"))
}

/// The image cache the QEMU tests share:
/// `${BLKLAB_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/blklab/images}`
/// (what `images/prepare.sh` uses by default).
pub fn image_cache() -> PathBuf {
    if let Some(p) = std::env::var_os("BLKLAB_IMAGE_CACHE") {
        return PathBuf::from(p);
    }
    let base = match std::env::var_os("XDG_CACHE_HOME") {
        Some(x) if !x.is_empty() => PathBuf::from(x),
        _ => PathBuf::from(std::env::var_os("HOME").expect("HOME is not set")).join(".cache"),
    };
    base.join("blklab/images")
}

/// A running `blklab serve` process with its own temporary directory.
pub struct Daemon {
    pub child: Child,
    pub dir: tempfile::TempDir,
    /// The `--socket` argument given to the daemon (with `--count N` the
    /// sockets are `socket-0` … `socket-(N-1)`).
    pub socket: PathBuf,
}

impl Daemon {
    /// Start `blklab serve --socket DIR/vd.sock ARGS…` and wait until every
    /// expected socket exists. `sockets` is the number of sockets to wait for
    /// (1 for a single disk, N for `--count N`).
    pub fn spawn(args: &[&str], sockets: usize) -> Daemon {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("vd.sock");
        Self::spawn_at(dir, socket, args, sockets)
    }

    pub fn spawn_at(
        dir: tempfile::TempDir,
        socket: PathBuf,
        args: &[&str],
        sockets: usize,
    ) -> Daemon {
        // A stale socket already at the path must be replaced, not mistaken
        // for the new one: remember its inode.
        let stale = std::fs::metadata(&socket)
            .ok()
            .map(|m| (m.ino(), m.ctime(), m.ctime_nsec()));
        let child = Command::new(blklab_bin())
            .arg("serve")
            .arg("--socket")
            .arg(&socket)
            .args(args)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .spawn()
            .expect("start blklab serve");
        let mut d = Daemon {
            child,
            dir,
            socket: socket.clone(),
        };
        let paths: Vec<PathBuf> = if sockets == 1 && !args.contains(&"--count") {
            vec![d.socket.clone()]
        } else {
            (0..sockets).map(|i| d.socket_n(i)).collect()
        };
        let deadline = Instant::now() + PATIENCE;
        let ready = |p: &PathBuf| {
            std::fs::metadata(p)
                .is_ok_and(|m| Some((m.ino(), m.ctime(), m.ctime_nsec())) != stale || p != &socket)
        };
        while !paths.iter().all(ready) {
            if let Ok(Some(status)) = d.child.try_wait() {
                panic!("blklab serve exited early: {status}");
            }
            assert!(
                Instant::now() < deadline,
                "sockets {paths:?} did not appear within {PATIENCE:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        d
    }

    /// Socket of disk `i` when started with `--count`.
    pub fn socket_n(&self, i: usize) -> PathBuf {
        let mut s = self.socket.clone().into_os_string();
        s.push(format!("-{i}"));
        PathBuf::from(s)
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// True while the process is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Send SIGTERM and wait for a clean exit; returns the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        // SAFETY: kill(2) on a pid we own; no memory is involved.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(st) = self.child.try_wait().expect("wait") {
                return st;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("blklab serve did not exit within {PATIENCE:?} of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// How long a test waits for something that must happen: long enough for
/// a loaded 2-core machine (the point is that it happens, not how fast).
pub const PATIENCE: Duration = Duration::from_secs(30);

/// Poll `f` until it returns `Some`, for at most `timeout`; `None` on
/// timeout. Polls quickly at first, then every 20 ms.
pub fn try_wait_for<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_micros(500);
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

/// Poll `f` until it returns `Some` and return the value; panic with
/// `what` if that takes longer than `timeout`.
pub fn wait_for<T>(what: &str, timeout: Duration, f: impl FnMut() -> Option<T>) -> T {
    try_wait_for(timeout, f)
        .unwrap_or_else(|| panic!("timed out after {timeout:?} waiting for {what}"))
}

/// Wait (up to [`PATIENCE`]) until `cond` holds; panic with `what` if not.
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    wait_for(what, PATIENCE, || cond().then_some(()))
}

/// The cumulative statistics (`stats` on the control socket `ctl`) once
/// every `(counter, value)` of queue `queue` of disk `disk` has reached at
/// least `value`; panics with the last document after [`PATIENCE`].
///
/// A queue's statistics are locked for a whole pass of its worker, so a
/// document that shows a request counted also shows everything that pass
/// did (its kicks, notifications, returned slots): waiting for the
/// request count to reach N means waiting until the pass that served
/// request N has ended and the worker has re-armed guest notifications.
pub fn wait_for_counters(
    ctl: &Path,
    disk: usize,
    queue: usize,
    want: &[(&str, u64)],
) -> serde_json::Value {
    let mut last = serde_json::Value::Null;
    let got = try_wait_for(PATIENCE, || {
        let doc = blklab::backend::control::query(ctl, "stats").expect("control query: stats");
        let counters = &doc["disks"][disk]["queues"][queue]["counters"];
        let reached = want
            .iter()
            .all(|(name, v)| counters[*name].as_u64().is_some_and(|c| c >= *v));
        if reached {
            return Some(doc);
        }
        last = counters.clone();
        None
    });
    got.unwrap_or_else(|| {
        panic!("disk {disk} queue {queue}: counters did not reach {want:?} within {PATIENCE:?}; last: {last}")
    })
}
