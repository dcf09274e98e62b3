//! What can go wrong in `blklab bench`: one named kind per failure, each
//! carrying its cause (`#[source]`) or the values it is about, so callers
//! and tests match on a kind. The messages are what the user reads; they
//! must not know how the loads or daemons are run.

use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

use thiserror::Error;

use super::callgrind::CallgrindError;

#[derive(Debug, Error)]
pub enum BenchError {
    /// A libblkio call failed; `what` names the call or property.
    #[error("libblkio: {what}: {source}")]
    Blkio {
        what: &'static str,
        #[source]
        source: blkio::Error,
    },
    #[error(
        "invalid benchmark option: queues and depth must be at least 1 and bs a multiple of 512 \
         (got queues {queues}, depth {depth}, bs {bs})"
    )]
    BadShape {
        queues: usize,
        depth: usize,
        bs: usize,
    },
    #[error(
        "invalid benchmark option: depth {depth} exceeds the device's largest queue size {max}"
    )]
    DepthOverQueueSize { depth: usize, max: i32 },
    #[error("invalid benchmark option: the disk ({capacity} bytes) is smaller than one {bs}-byte request")]
    DiskTooSmall { capacity: u64, bs: u64 },
    #[error("invalid benchmark option: a counted load needs at least 1 request")]
    NoRequests,
    #[error("invalid benchmark option: --requests must be at least 1")]
    ZeroRequests,
    #[error("invalid benchmark option: the socket path must be UTF-8")]
    SocketNotUtf8,
    #[error("invalid benchmark option: {0}")]
    BadPoll(#[source] crate::device::polling::PollParseError),
    #[error("invalid benchmark option: --adaptive {0:?}: expected off or a poll window bound of 1us..=100ms, e.g. 32us")]
    BadAdaptive(String),
    /// A size option (`--bs`, `--size`) that is not a size.
    #[error("{option}")]
    BadSize {
        option: &'static str,
        #[source]
        source: crate::util::units::SizeError,
    },
    #[error("--idle-time: {0}")]
    BadIdleTime(String),
    /// `--qsd` names no usable daemon.
    #[error("--qsd")]
    Qsd(#[source] Box<BenchError>),
    #[error("--socket is required")]
    NoSocket,
    #[error("cannot find the blklab binary")]
    CurrentExe(#[source] std::io::Error),
    #[error("cannot write the report as JSON: {0}")]
    Json(#[source] serde_json::Error),
    #[error("cannot pin a thread or process to its CPUs: {0}")]
    Pin(#[source] std::io::Error),
    #[error("cannot read the CPU time of process {pid} (/proc/{pid}/task/*/schedstat)")]
    Schedstat { pid: i32 },
    #[error(
        "invalid benchmark option: --load {spec:?}: {why} (expected RW:QD with RW randread or \
         randwrite and QD 1..=256, e.g. randwrite:64)"
    )]
    BadCountedLoad { spec: String, why: &'static str },
    #[error("invalid benchmark option: counting qemu-storage-daemon needs its binary")]
    NoQsdBinary,
    #[error("cannot start {name}: {source}")]
    Start {
        name: String,
        #[source]
        source: std::io::Error,
    },
    /// qemu-storage-daemon could not be started: most likely not installed.
    #[error("cannot start {name}: {source} (Debian: .ci/install-deps installs qemu-utils)")]
    StartQsd {
        name: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{name} exited early: {status}")]
    ExitedEarly { name: String, status: ExitStatus },
    #[error("{name}: {paths:?} did not appear within {patience:?}")]
    NotReady {
        name: String,
        paths: Vec<PathBuf>,
        patience: Duration,
    },
    #[error("{name} did not exit within {patience:?} of SIGTERM")]
    NoExit { name: String, patience: Duration },
    #[error("daemon missing")]
    DaemonMissing { backend: &'static str },
    #[error("{name} exited during the comparison")]
    ExitedDuringComparison { name: &'static str },
    #[error("client thread {0} panicked")]
    Panicked(usize),
    #[error("cannot start the client thread: {0}")]
    Thread(#[source] std::io::Error),
    #[error("no completion within 30 s ({in_flight} requests in flight)")]
    Stalled { in_flight: usize },
    #[error("cannot read /proc/{pid}/stat")]
    ProcStat { pid: i32 },
    #[error("tempdir: {0}")]
    Tempdir(#[source] std::io::Error),
    /// `BIN --version` could not run; `hint` says how to install it.
    #[error("cannot run {} --version: {source} ({hint})", bin.display())]
    VersionRun {
        bin: PathBuf,
        hint: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// `BIN --version` ran but failed or said nothing; its stderr, when
    /// the message quotes it.
    #[error("{} --version failed ({status}){}", bin.display(), colon_before(stderr.as_deref()))]
    VersionFailed {
        bin: PathBuf,
        status: ExitStatus,
        stderr: Option<String>,
    },
    #[error("--qsd auto needs images/fetch-qsd.sh: {0}")]
    NoLabDir(#[source] crate::lab::images::ImageError),
    #[error("cannot run {}: {source}", script.display())]
    ScriptRun {
        script: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} failed ({status}): no qemu-storage-daemon 7.2 (give one with --qsd PATH)", script.display())]
    FetchQsd { script: PathBuf, status: ExitStatus },
    /// One backend's load of a comparison failed.
    #[error("{backend}: {source}")]
    Load {
        backend: &'static str,
        #[source]
        source: Box<BenchError>,
    },
    /// A counted load under callgrind failed; `cell` is `SUBJECT LOAD`.
    #[error("{cell} under callgrind: {source}")]
    Counted {
        cell: String,
        #[source]
        source: Box<BenchError>,
    },
    #[error("{cell}: {completed} of {requests} requests completed, {failed} failed")]
    Incomplete {
        cell: String,
        requests: u64,
        completed: u64,
        failed: u64,
    },
    #[error(
        "{cell}: {} requests took no more instructions than {} ({} vs {}): the count is not usable",
        requests[1], requests[0], totals[1], totals[0]
    )]
    CountNotUsable {
        cell: String,
        requests: [u64; 2],
        totals: [u64; 2],
    },
    #[error(transparent)]
    Callgrind(#[from] CallgrindError),
    #[error("keeping {}: {source}", path.display())]
    KeepProfile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// `": TEXT"`, or nothing without a text.
fn colon_before(text: Option<&str>) -> String {
    text.map(|t| format!(": {t}")).unwrap_or_default()
}

/// `map_err` for a libblkio call named `what`.
pub(crate) fn blkio_err(what: &'static str) -> impl FnOnce(blkio::Error) -> BenchError {
    move |source| BenchError::Blkio { what, source }
}
