//! `blklab bench --compare`: identical loads against qemu-storage-daemon
//! (`null-co`, `read-zeroes=on`), in its main loop and in an IOThread, and
//! `blklab serve --disk null` with the same queues, in one run,
//! interleaved, and the ratios the targets are stated in
//! (`versus_qsd/targets.rs`; the table in `versus_qsd/table.rs`).
//!
//! Daemons: qemu-storage-daemon (main loop, and `--object iothread` with
//! the export in it: QEMU's adaptive polling), `blklab serve` (notify
//! mode), `--no-stats` (the statistics' cost), `--poll=adaptive` and
//! `--poll` (always-on polling). All run for the whole comparison (idle
//! daemons sleep in epoll); each load connects afresh. Rounds alternate
//! the backend order (A B C, C B A, …) so drift on a shared machine hits
//! every side.
//!
//! The QD1 rows pin each backend's threads to one CPU and the client's to
//! another (sched_setaffinity on every thread of the daemon, and on the
//! client's queue thread), so that a backend that polls and a client that
//! waits for it never share a CPU: on a 2-CPU machine an unpinned poller
//! competes with the very client it serves, and QD1 figures scatter by
//! an order of magnitude between rounds. The throughput row runs unpinned.
//! After the rounds each daemon's CPU is measured with its disk idle
//! (`idle.rs`).

mod table;
mod targets;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde::Serialize;

use super::daemon::Daemon;
use super::idle::{IdleCpu, IdleSpec};
use super::{BenchError, BenchReport, Load, LoadShape, Skipped, Verdict};
use crate::device::polling::PollMode;
use crate::util::affinity;

/// The backends a comparison can start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Backend {
    /// qemu-storage-daemon, the export in its main loop.
    Qsd,
    /// qemu-storage-daemon, the export in an IOThread (adaptive polling,
    /// QEMU's defaults).
    QsdIothread,
    Blklab,
    BlklabNoStats,
    BlklabAdaptive,
    BlklabPoll,
}

impl Backend {
    pub fn label(self) -> &'static str {
        match self {
            Backend::Qsd => "qemu-storage-daemon",
            Backend::QsdIothread => "qsd iothread",
            Backend::Blklab => "blklab",
            Backend::BlklabNoStats => "blklab --no-stats",
            Backend::BlklabAdaptive => "blklab adaptive",
            Backend::BlklabPoll => "blklab --poll",
        }
    }

    fn is_qsd(self) -> bool {
        matches!(self, Backend::Qsd | Backend::QsdIothread)
    }
}

/// What to compare.
#[derive(Debug, Clone)]
pub struct CompareOpts {
    /// The `blklab` binary to start (`std::env::current_exe()` from the CLI).
    pub blklab_bin: PathBuf,
    pub qsd_bin: PathBuf,
    /// The throughput row's load (the latency rows use QD1).
    pub shape: LoadShape,
    /// Disk size in bytes (both backends).
    pub size: u64,
    pub rounds: usize,
    /// `--poll` argument of the always-polling blklab (`None`: no poll
    /// rows).
    pub poll: Option<String>,
    /// The adaptive blklab's window bound, `--poll=adaptive:MAX` (`None`:
    /// no adaptive rows).
    pub adaptive: Option<String>,
    /// How each daemon's idle CPU is measured (`None`: not measured).
    pub idle: Option<IdleSpec>,
}

impl CompareOpts {
    /// The adaptive blklab's `--poll` value, checked.
    fn adaptive_poll(&self) -> Result<Option<String>, BenchError> {
        let Some(max) = &self.adaptive else {
            return Ok(None);
        };
        let value = format!("adaptive:{max}");
        match value.parse::<PollMode>() {
            Ok(PollMode::Adaptive { .. }) => Ok(Some(value)),
            _ => Err(BenchError::BadAdaptive(max.clone())),
        }
    }
}

/// The qemu-storage-daemon command that exports `blockdev` (a `--blockdev`
/// option whose node is `n0`) as a vhost-user-blk socket at `socket` with
/// `num_queues` queues.
pub fn qsd_command(
    qsd_bin: &Path,
    blockdev: &str,
    socket: &Path,
    writable: bool,
    num_queues: usize,
) -> Command {
    qsd_command_in(qsd_bin, blockdev, socket, writable, num_queues, None)
}

/// [`qsd_command`] with the export in IOThread `iothread` (created by the
/// command), when given.
fn qsd_command_in(
    qsd_bin: &Path,
    blockdev: &str,
    socket: &Path,
    writable: bool,
    num_queues: usize,
    iothread: Option<&str>,
) -> Command {
    let mut c = Command::new(qsd_bin);
    let mut export = format!(
        "type=vhost-user-blk,id=e0,node-name=n0,addr.type=unix,addr.path={},writable={},num-queues={num_queues}",
        socket.display(),
        if writable { "on" } else { "off" }
    );
    if let Some(t) = iothread {
        c.arg("--object").arg(format!("iothread,id={t}"));
        export.push_str(&format!(",iothread={t}"));
    }
    c.arg("--blockdev")
        .arg(blockdev)
        .arg("--export")
        .arg(export);
    c
}

/// A running backend daemon.
struct Running {
    backend: Backend,
    daemon: Daemon,
    socket: PathBuf,
}

impl Running {
    fn start(backend: Backend, opts: &CompareOpts, dir: &Path) -> Result<Running, BenchError> {
        let socket = dir.join(format!("{backend:?}.sock").to_lowercase());
        let mut cmd = if backend.is_qsd() {
            qsd_command_in(
                &opts.qsd_bin,
                &format!(
                    "driver=null-co,node-name=n0,size={},read-zeroes=on",
                    opts.size
                ),
                &socket,
                true,
                opts.shape.queues,
                (backend == Backend::QsdIothread).then_some("io0"),
            )
        } else {
            blklab_command(backend, opts, &socket)?
        };
        cmd.stdout(Stdio::null());
        let daemon = Daemon::start(
            backend.label(),
            &mut cmd,
            std::slice::from_ref(&socket),
            Duration::from_secs(20),
        )
        .map_err(|e| match e {
            BenchError::Start { name, source } if backend.is_qsd() => {
                BenchError::StartQsd { name, source }
            }
            e => e,
        })?;
        Ok(Running {
            backend,
            daemon,
            socket,
        })
    }
}

/// `blklab serve` on a null disk at `socket`, as `backend` runs it.
fn blklab_command(
    backend: Backend,
    opts: &CompareOpts,
    socket: &Path,
) -> Result<Command, BenchError> {
    let mut c = Command::new(&opts.blklab_bin);
    c.arg("serve")
        .arg("--socket")
        .arg(socket)
        .args(["--disk", "null", "--size"])
        .arg(opts.size.to_string())
        .arg("--num-queues")
        .arg(opts.shape.queues.to_string())
        .env("RUST_LOG", "warn");
    match backend {
        Backend::BlklabNoStats => {
            c.arg("--no-stats");
        }
        Backend::BlklabPoll => {
            c.arg(format!("--poll={}", opts.poll.as_deref().unwrap_or("on")));
        }
        Backend::BlklabAdaptive => {
            let p = opts.adaptive_poll()?.unwrap_or_else(|| "adaptive".into());
            c.arg(format!("--poll={p}"));
        }
        _ => {}
    }
    Ok(c)
}

/// One row of the plan: a load and the backends it runs against.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub name: String,
    pub depth: usize,
    pub client_poll: bool,
    /// Backend and client pinned to CPUs of their own (see the module
    /// documentation).
    pub pinned: bool,
    pub backends: Vec<Backend>,
}

/// One backend's results for one row, summed over rounds.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    pub backend: Backend,
    pub requests: u64,
    pub errors: u64,
    pub seconds: f64,
    pub backend_cpu_s: f64,
    pub iops: f64,
    pub iops_per_backend_cpu_s: f64,
    /// Mean over rounds of each round's client latency p50 / p99, ns.
    pub p50_ns: f64,
    pub p99_ns: f64,
    /// The spread over rounds: (lowest, highest) of the rounds' IOPS and
    /// IOPS per backend CPU-second.
    pub iops_range: (f64, f64),
    pub iops_per_cpu_range: (f64, f64),
    pub rounds: Vec<BenchReport>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RowResult {
    pub row: Row,
    pub cells: Vec<Cell>,
}

/// One daemon's CPU with its disk idle.
#[derive(Debug, Clone, Serialize)]
pub struct IdleResult {
    pub backend: Backend,
    #[serde(flatten)]
    pub cpu: IdleCpu,
}

#[derive(Debug, Clone, Serialize)]
pub struct CompareReport {
    pub machine: String,
    /// `qemu-storage-daemon --version`'s first line: which QEMU was measured.
    pub qsd_version: String,
    /// How the pinned rows were pinned (`None`: a machine of one CPU, not
    /// pinned).
    pub pinning: Option<String>,
    pub rows: Vec<RowResult>,
    pub idle: Vec<IdleResult>,
    pub verdicts: Vec<Verdict>,
    /// The targets this run could not judge, and why.
    pub skipped: Vec<Skipped>,
}

/// The CPUs of a pinned row: the backend's, the client's (a lower one).
const BACKEND_CPU: usize = 1;
const CLIENT_CPU: usize = 0;

/// How the pinned rows are pinned on this machine.
fn pinning() -> Option<String> {
    (affinity::cpu_count() > BACKEND_CPU).then(|| {
        format!("QD1 rows: every backend thread on CPU {BACKEND_CPU}, the client's queue thread on CPU {CLIENT_CPU} (sched_setaffinity)")
    })
}

/// The names of the rows a plan can have, in order: throughput, QD1 and
/// QD1 with a polling client.
fn row_names(shape: &LoadShape) -> [String; 3] {
    [
        format!("{} qd{}", shape.rw, shape.depth),
        format!("{} qd1", shape.rw),
        format!("{} qd1 poll-client", shape.rw),
    ]
}

/// The rows: throughput at `depth`, QD1 round trip, and (with `poll`) QD1
/// with a polling client against qemu-storage-daemon and `blklab --poll`.
pub(crate) fn plan(opts: &CompareOpts) -> Vec<Row> {
    let [throughput, qd1, poll_client] = row_names(&opts.shape);
    // The polling blklabs join the throughput and QD1 rows: the same
    // loads, with the backend polling instead of sleeping.
    let polling = |mut v: Vec<Backend>| {
        if opts.adaptive.is_some() {
            v.push(Backend::BlklabAdaptive);
        }
        if opts.poll.is_some() {
            v.push(Backend::BlklabPoll);
        }
        v
    };
    let mut rows = vec![
        Row {
            name: throughput,
            depth: opts.shape.depth,
            client_poll: false,
            pinned: false,
            backends: polling(vec![
                Backend::Qsd,
                Backend::QsdIothread,
                Backend::Blklab,
                Backend::BlklabNoStats,
            ]),
        },
        Row {
            name: qd1,
            depth: 1,
            client_poll: false,
            pinned: true,
            backends: polling(vec![Backend::Qsd, Backend::QsdIothread, Backend::Blklab]),
        },
    ];
    if opts.poll.is_some() {
        rows.push(Row {
            name: poll_client,
            depth: 1,
            client_poll: true,
            pinned: true,
            backends: vec![Backend::Qsd, Backend::BlklabPoll],
        });
    }
    rows
}

/// The machine, for the record: CPUs, kernel, CPU model, load average.
pub fn machine() -> String {
    let nproc = affinity::cpu_count();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_default();
    format!(
        "nproc {nproc}, kernel {}, CPU {cpu}, load average {}",
        kernel.trim(),
        loadavg()
    )
}

/// The load average (1, 5, 15 minutes) now.
pub(crate) fn loadavg() -> String {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    load.split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The first line of `BIN --version` (e.g. "qemu-storage-daemon version
/// 10.0.2 (Debian 1:10.0.2+ds-2+deb13u1~bpo12+1)").
pub(crate) fn qsd_version(bin: &Path) -> Result<String, BenchError> {
    let out = super::version_output(bin, "Debian: .ci/install-deps installs qemu-utils")?;
    let text = String::from_utf8_lossy(&out.stdout);
    match text.lines().next().map(str::trim) {
        Some(l) if out.status.success() && !l.is_empty() => Ok(l.to_string()),
        _ => Err(BenchError::VersionFailed {
            bin: bin.to_path_buf(),
            status: out.status,
            stderr: Some(String::from_utf8_lossy(&out.stderr).trim().to_string()),
        }),
    }
}

/// Run the comparison. `progress` gets one line per measurement.
pub fn run(
    opts: &CompareOpts,
    mut progress: impl FnMut(&str),
) -> Result<CompareReport, BenchError> {
    // Bad polling options are refused before any daemon starts.
    if let Some(p) = &opts.poll {
        p.parse::<PollMode>().map_err(BenchError::BadPoll)?;
    }
    opts.adaptive_poll()?;
    let qsd_version = qsd_version(&opts.qsd_bin)?;
    progress(&format!("measuring {qsd_version}"));
    let rows = plan(opts);
    let dir = tempfile::Builder::new()
        .prefix("blklab-bench")
        .tempdir()
        .map_err(BenchError::Tempdir)?;
    let mut daemons = start_daemons(&rows, opts, dir.path())?;
    let machine = machine();
    let mut results: Vec<RowResult> = rows.iter().map(RowResult::empty).collect();
    for round in 0..opts.rounds.max(1) {
        measure_round(round, &mut results, &mut daemons, opts, &mut progress)?;
    }
    for cell in results.iter_mut().flat_map(|rr| rr.cells.iter_mut()) {
        cell.sum_rounds();
    }
    let idle = match opts.idle {
        Some(spec) => Some(measure_idle(&mut daemons, spec, &mut progress)?),
        None => None,
    };
    let judged = targets::verdicts(&results, idle.as_deref(), opts);
    Ok(CompareReport {
        machine,
        qsd_version,
        pinning: pinning(),
        rows: results,
        idle: idle.unwrap_or_default(),
        verdicts: judged.verdicts,
        skipped: judged.skipped,
    })
}

/// Every backend the rows name, once each, in the order they first appear.
fn start_daemons(rows: &[Row], opts: &CompareOpts, dir: &Path) -> Result<Vec<Running>, BenchError> {
    let mut wanted: Vec<Backend> = Vec::new();
    for r in rows {
        for b in &r.backends {
            if !wanted.contains(b) {
                wanted.push(*b);
            }
        }
    }
    wanted
        .into_iter()
        .map(|b| Running::start(b, opts, dir))
        .collect()
}

/// One round: each row's backends in turn, in the plan's order on even
/// rounds and the reverse on odd ones.
fn measure_round(
    round: usize,
    results: &mut [RowResult],
    daemons: &mut [Running],
    opts: &CompareOpts,
    progress: &mut impl FnMut(&str),
) -> Result<(), BenchError> {
    for rr in results.iter_mut() {
        let mut order: Vec<usize> = (0..rr.cells.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for ci in order {
            let backend = rr.cells[ci].backend;
            let d = find(daemons, backend)?;
            let rep = d.measure(&rr.row, opts, round)?;
            progress(&format!(
                "round {} {:<30} {:<20} {:>9.0} IOPS  p50 {:>7.1} us  {:>9.0} IOPS/CPU-s  {} errors",
                round + 1,
                rr.row.name,
                backend.label(),
                rep.iops,
                rep.latency_ns.p50 as f64 / 1e3,
                rep.iops_per_backend_cpu_s.unwrap_or(0.0),
                rep.errors
            ));
            rr.cells[ci].rounds.push(rep);
        }
    }
    Ok(())
}

fn find(daemons: &mut [Running], backend: Backend) -> Result<&mut Running, BenchError> {
    daemons
        .iter_mut()
        .find(|d| d.backend == backend)
        .ok_or(BenchError::DaemonMissing {
            backend: backend.label(),
        })
}

/// Each daemon's CPU with its disk idle, one after another.
fn measure_idle(
    daemons: &mut [Running],
    spec: IdleSpec,
    progress: &mut impl FnMut(&str),
) -> Result<Vec<IdleResult>, BenchError> {
    let mut out = Vec::new();
    for d in daemons.iter_mut() {
        if !d.daemon.alive() {
            return Err(BenchError::ExitedDuringComparison {
                name: d.backend.label(),
            });
        }
        let cpu = super::idle::measure(&d.socket, d.daemon.pid(), spec)?;
        progress(&format!(
            "idle {:<20} {:>8.3} % of a CPU ({} us of CPU in {:.1} s)",
            d.backend.label(),
            cpu.pct_of_cpu,
            cpu.cpu_ns / 1000,
            cpu.span_s
        ));
        out.push(IdleResult {
            backend: d.backend,
            cpu,
        });
    }
    Ok(out)
}

impl Running {
    /// One load of `row` against this daemon in round `round` (its seed).
    fn measure(
        &mut self,
        row: &Row,
        opts: &CompareOpts,
        round: usize,
    ) -> Result<BenchReport, BenchError> {
        let label = self.backend.label();
        if !self.daemon.alive() {
            return Err(BenchError::ExitedDuringComparison { name: label });
        }
        let pin = row.pinned && pinning().is_some();
        let load = Load {
            socket: self.socket.clone(),
            shape: LoadShape {
                depth: row.depth,
                ..opts.shape
            },
            client_poll: row.client_poll,
            backend_pid: Some(self.daemon.pid()),
            seed: round as u64 + 1,
            count: None,
            think: Duration::ZERO,
            client_cpus: pin.then(|| vec![CLIENT_CPU]),
        };
        if pin {
            affinity::pin_process(self.daemon.pid(), &[BACKEND_CPU]).map_err(BenchError::Pin)?;
        }
        let rep = super::run(&load).map_err(|e| BenchError::Load {
            backend: label,
            source: Box::new(e),
        });
        if pin {
            affinity::unpin_process(self.daemon.pid()).map_err(BenchError::Pin)?;
        }
        rep
    }
}

impl RowResult {
    /// `row` with an empty cell per backend.
    fn empty(row: &Row) -> RowResult {
        RowResult {
            row: row.clone(),
            cells: row.backends.iter().map(|b| Cell::empty(*b)).collect(),
        }
    }
}

impl Cell {
    fn empty(backend: Backend) -> Cell {
        Cell {
            backend,
            requests: 0,
            errors: 0,
            seconds: 0.0,
            backend_cpu_s: 0.0,
            iops: 0.0,
            iops_per_backend_cpu_s: 0.0,
            p50_ns: 0.0,
            p99_ns: 0.0,
            iops_range: (0.0, 0.0),
            iops_per_cpu_range: (0.0, 0.0),
            rounds: Vec::new(),
        }
    }

    /// The totals and rates over the rounds measured.
    fn sum_rounds(&mut self) {
        let n = self.rounds.len().max(1) as f64;
        self.requests = self.rounds.iter().map(|r| r.requests).sum();
        self.errors = self.rounds.iter().map(|r| r.errors).sum();
        self.seconds = self.rounds.iter().map(|r| r.seconds).sum();
        self.backend_cpu_s = self.rounds.iter().filter_map(|r| r.backend_cpu_s).sum();
        self.iops = self.requests as f64 / self.seconds.max(1e-9);
        self.iops_per_backend_cpu_s = if self.backend_cpu_s > 0.0 {
            self.requests as f64 / self.backend_cpu_s
        } else {
            0.0
        };
        // Mean over the rounds of a per-round percentile.
        let mean = |pct: fn(&BenchReport) -> u64| {
            self.rounds.iter().map(|r| pct(r) as f64).sum::<f64>() / n
        };
        let (p50, p99) = (mean(|r| r.latency_ns.p50), mean(|r| r.latency_ns.p99));
        self.p50_ns = p50;
        self.p99_ns = p99;
        self.iops_range = range(self.rounds.iter().map(|r| r.iops));
        self.iops_per_cpu_range = range(
            self.rounds
                .iter()
                .map(|r| r.iops_per_backend_cpu_s.unwrap_or(0.0)),
        );
    }
}

/// (lowest, highest) of `v`; (0, 0) when empty.
fn range(v: impl Iterator<Item = f64>) -> (f64, f64) {
    v.fold(None, |acc: Option<(f64, f64)>, x| {
        Some(acc.map_or((x, x), |(lo, hi)| (lo.min(x), hi.max(x))))
    })
    .unwrap_or((0.0, 0.0))
}

/// The cell of `b` in row `row`.
fn cell(rows: &[RowResult], row: usize, b: Backend) -> Option<&Cell> {
    rows.get(row)?.cells.iter().find(|c| c.backend == b)
}

/// A comparison's options for tests: randread QD64 for 1 s, the polling
/// rows when `poll`, idle CPU measured when `idle`.
#[cfg(test)]
pub(super) fn test_opts(idle: bool, poll: bool) -> CompareOpts {
    CompareOpts {
        blklab_bin: "blklab".into(),
        qsd_bin: "qsd".into(),
        shape: LoadShape {
            queues: 1,
            depth: 64,
            bs: 4096,
            rw: super::RwMode::Randread,
            time: Duration::from_secs(1),
            warmup: Duration::ZERO,
        },
        size: 1 << 30,
        rounds: 1,
        poll: poll.then(|| "50us".into()),
        adaptive: poll.then(|| "32us".into()),
        idle: idle.then_some(crate::bench::idle::IdleSpec::DEFAULT),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_has_both_daemons_every_mode_and_pins_the_qd1_rows() {
        let opts = test_opts(false, true);
        let rows = plan(&opts);
        let names: Vec<(&str, bool)> = rows.iter().map(|r| (r.name.as_str(), r.pinned)).collect();
        assert_eq!(
            names,
            [
                ("randread qd64", false),
                ("randread qd1", true),
                ("randread qd1 poll-client", true)
            ]
        );
        for b in [
            Backend::Qsd,
            Backend::QsdIothread,
            Backend::Blklab,
            Backend::BlklabAdaptive,
            Backend::BlklabPoll,
        ] {
            assert!(
                rows[0].backends.contains(&b) && rows[1].backends.contains(&b),
                "{b:?}"
            );
        }
        assert_eq!(
            opts.adaptive_poll().unwrap().as_deref(),
            Some("adaptive:32us")
        );
        let without = CompareOpts {
            poll: None,
            adaptive: None,
            ..opts.clone()
        };
        let rows = plan(&without);
        assert_eq!(rows.len(), 2);
        assert!(!rows[1].backends.contains(&Backend::BlklabAdaptive));
        let bad = CompareOpts {
            adaptive: Some("fast".into()),
            ..opts
        };
        assert!(matches!(
            bad.adaptive_poll(),
            Err(BenchError::BadAdaptive(_))
        ));
    }

    #[test]
    fn the_iothread_export_runs_in_its_iothread() {
        let c = qsd_command_in(
            Path::new("qsd"),
            "driver=null-co,node-name=n0",
            Path::new("/tmp/s.sock"),
            true,
            2,
            Some("io0"),
        );
        let args: Vec<String> = c
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(args[..2], ["--object", "iothread,id=io0"]);
        assert!(
            args.last().unwrap().ends_with(",num-queues=2,iothread=io0"),
            "{args:?}"
        );
        let plain = qsd_command(
            Path::new("qsd"),
            "driver=null-co,node-name=n0",
            Path::new("/tmp/s.sock"),
            true,
            2,
        );
        assert!(!plain
            .get_args()
            .any(|a| a.to_string_lossy().contains("iothread")));
    }

    #[test]
    fn spread_is_the_lowest_and_highest_round() {
        assert_eq!(range([3.0, 1.0, 2.0].into_iter()), (1.0, 3.0));
        assert_eq!(range(std::iter::empty()), (0.0, 0.0));
    }

    #[test]
    fn qsd_version_reads_the_first_line_or_says_why_not() {
        let v =
            qsd_version(Path::new("qemu-storage-daemon")).expect("installed by .ci/install-deps");
        assert!(v.starts_with("qemu-storage-daemon version "), "{v}");
        let e = qsd_version(Path::new("/nonexistent/qsd")).unwrap_err();
        assert!(matches!(e, BenchError::VersionRun { .. }), "{e}");
        assert!(e.to_string().contains("/nonexistent/qsd"), "{e}");
        let e = qsd_version(Path::new("false")).unwrap_err();
        assert!(matches!(e, BenchError::VersionFailed { .. }), "{e}");
        assert!(e.to_string().contains("--version failed"), "{e}");
    }
}
