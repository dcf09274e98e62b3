//! Shared helpers for the integration tests and the benches (which include
//! this module with `#[path = "../tests/common/mod.rs"] mod common;`):
//! paths, JSON files, and the real `blklab` binary started on a real Unix
//! socket and stopped cleanly.
#![allow(dead_code)]

pub(crate) mod browser;
pub(crate) mod client;
pub(crate) mod git_tree;
pub(crate) mod guest_program;
pub(crate) mod mini_frontend;
pub(crate) mod nested_boot;
pub(crate) mod offline;
pub(crate) mod qmp;
pub(crate) mod scenario_checks;
pub(crate) mod tools;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

/// The one disk that `blklab serve`'s disk options `args` describe.
pub(crate) fn disk_config(args: &[&str]) -> blklab::device::config::DiskConfig {
    use clap::Parser;
    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        disk: blklab::device::config::DiskArgs,
    }
    let argv = std::iter::once("blklab").chain(args.iter().copied());
    let mut disks = Wrap::parse_from(argv)
        .disk
        .to_configs()
        .expect("a valid disk");
    assert_eq!(disks.len(), 1, "one disk: {args:?}");
    disks.remove(0)
}

/// Path of the `blklab` binary cargo built for this test run.
pub(crate) fn blklab_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_blklab"))
}

/// The repository root.
pub(crate) fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The image cache the QEMU tests share:
/// `${BLKLAB_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/blklab/images}`
/// (what `images/prepare.sh` uses by default).
pub(crate) fn image_cache() -> PathBuf {
    if let Some(p) = std::env::var_os("BLKLAB_IMAGE_CACHE") {
        return PathBuf::from(p);
    }
    let base = match std::env::var_os("XDG_CACHE_HOME") {
        Some(x) if !x.is_empty() => PathBuf::from(x),
        _ => PathBuf::from(std::env::var_os("HOME").expect("HOME is not set")).join(".cache"),
    };
    base.join("blklab/images")
}

/// The JSON document in file `path`; panics naming the file if it cannot
/// be read or is not JSON.
pub(crate) fn read_json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

/// A running `blklab serve` process with its own temporary directory
/// (started and stopped by the library's [`blklab::bench::daemon::Daemon`]).
pub(crate) struct Daemon {
    /// The process; declared before `dir`, so it is stopped before its
    /// directory is removed.
    pub process: blklab::bench::daemon::Daemon,
    pub dir: tempfile::TempDir,
    /// The `--socket` argument given to the daemon (with `--count N` the
    /// sockets are `socket-0` … `socket-(N-1)`).
    pub socket: PathBuf,
    /// The `--control` socket, when started with one by
    /// [`Daemon::with_control`].
    pub control: Option<PathBuf>,
}

impl Daemon {
    /// Start `blklab serve --socket DIR/vd.sock ARGS…` and wait until every
    /// expected socket exists. `sockets` is the number of sockets to wait for
    /// (1 for a single disk, N for `--count N`).
    pub(crate) fn spawn(args: &[&str], sockets: usize) -> Daemon {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("vd.sock");
        Self::spawn_at(dir, socket, args, sockets)
    }

    /// [`Daemon::spawn`] with a control socket, `--control DIR/ctl.sock`
    /// ([`Daemon::control`]), waited for too.
    pub(crate) fn with_control(args: &[&str], sockets: usize) -> Daemon {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("vd.sock");
        let control = dir.path().join("ctl.sock");
        Self::start(dir, socket, Some(control), args, sockets)
    }

    /// [`Daemon::with_control`] with the daemon's stderr (its log, at
    /// `RUST_LOG=info`) in a file of the daemon's directory, returned.
    pub(crate) fn with_control_logged(args: &[&str]) -> (Daemon, PathBuf) {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("vd.sock");
        let ctl = dir.path().join("ctl.sock");
        let log = dir.path().join("stderr.log");
        let mut cmd = Command::new(blklab_bin());
        cmd.arg("serve")
            .arg("--socket")
            .arg(&socket)
            .arg("--control")
            .arg(&ctl)
            .args(args)
            .env("RUST_LOG", "info")
            .stderr(std::fs::File::create(&log).expect("log file"));
        let process = blklab::bench::daemon::Daemon::start(
            "blklab serve",
            &mut cmd,
            &[socket.clone(), ctl.clone()],
            PATIENCE,
        )
        .unwrap_or_else(|e| panic!("blklab serve {args:?}: {e}"));
        (
            Daemon {
                process,
                dir,
                socket,
                control: Some(ctl),
            },
            log,
        )
    }

    /// [`Daemon::spawn`] with the socket at `socket` (a stale socket already
    /// there must be replaced, not mistaken for the new one) and `dir` as
    /// the daemon's directory.
    pub(crate) fn spawn_at(
        dir: tempfile::TempDir,
        socket: PathBuf,
        args: &[&str],
        sockets: usize,
    ) -> Daemon {
        Self::start(dir, socket, None, args, sockets)
    }

    fn start(
        dir: tempfile::TempDir,
        socket: PathBuf,
        control: Option<PathBuf>,
        args: &[&str],
        sockets: usize,
    ) -> Daemon {
        let mut cmd = Command::new(blklab_bin());
        cmd.arg("serve").arg("--socket").arg(&socket);
        if let Some(c) = &control {
            cmd.arg("--control").arg(c);
        }
        cmd.args(args).env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
        );
        let mut ready: Vec<PathBuf> = if sockets == 1 && !args.contains(&"--count") {
            vec![socket.clone()]
        } else {
            (0..sockets).map(|i| socket_n(&socket, i)).collect()
        };
        ready.extend(control.clone());
        let process =
            blklab::bench::daemon::Daemon::start("blklab serve", &mut cmd, &ready, PATIENCE)
                .unwrap_or_else(|e| panic!("blklab serve {args:?}: {e}"));
        Daemon {
            process,
            dir,
            socket,
            control,
        }
    }

    /// Socket of disk `i` when started with `--count`.
    pub(crate) fn socket_n(&self, i: usize) -> PathBuf {
        socket_n(&self.socket, i)
    }

    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The control socket ([`Daemon::with_control`]).
    pub(crate) fn control(&self) -> &Path {
        self.control
            .as_deref()
            .expect("a daemon started with_control")
    }

    /// `blklab::backend::control::query` on the control socket.
    pub(crate) fn query(&self, cmd: &str) -> serde_json::Value {
        blklab::backend::control::query(self.control(), cmd)
            .unwrap_or_else(|e| panic!("control query {cmd:?}: {e}"))
    }

    pub(crate) fn pid(&self) -> i32 {
        self.process.pid()
    }

    /// True while the process is still running.
    pub(crate) fn alive(&mut self) -> bool {
        self.process.alive()
    }

    /// The exit status once the process has exited.
    pub(crate) fn exited(&mut self) -> Option<ExitStatus> {
        self.process.exited()
    }

    /// Send SIGTERM and wait for a clean exit; returns the exit status.
    pub(crate) fn terminate(&mut self) -> ExitStatus {
        self.process
            .terminate(PATIENCE)
            .unwrap_or_else(|e| panic!("{e}"))
    }
}

/// `SOCKET-i`: the socket of disk `i` of `blklab serve --count`.
fn socket_n(socket: &Path, i: usize) -> PathBuf {
    let mut s = socket.to_path_buf().into_os_string();
    s.push(format!("-{i}"));
    PathBuf::from(s)
}

/// How long a test waits for something that must happen: long enough for
/// a loaded 2-core machine (the point is that it happens, not how fast).
pub(crate) const PATIENCE: Duration = Duration::from_secs(30);

/// Poll `f` until it returns `Some`, for at most `timeout`; `None` on
/// timeout. Polls quickly at first, then every 20 ms.
pub(crate) fn try_wait_for<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
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
pub(crate) fn wait_for<T>(what: &str, timeout: Duration, f: impl FnMut() -> Option<T>) -> T {
    try_wait_for(timeout, f)
        .unwrap_or_else(|| panic!("timed out after {timeout:?} waiting for {what}"))
}

/// Wait (up to [`PATIENCE`]) until `cond` holds; panic with `what` if not.
pub(crate) fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
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
pub(crate) fn wait_for_counters(
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
