//! `blklab bench --compare`: identical loads against qemu-storage-daemon
//! (`null-co`, `read-zeroes=on`) and `blklab serve --disk null` with the same
//! queues, in one run, interleaved, and the ratios the targets are
//! stated in.
//!
//! Daemons: qemu-storage-daemon, `blklab serve`, `blklab serve --no-stats`
//! (the statistics' cost) and `blklab serve --poll` (busy-poll queues). All
//! run for the whole comparison (idle daemons sleep in epoll); each load
//! connects afresh. Rounds alternate the backend order (A B C, C B A, …) so
//! drift on a shared machine hits every side.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde::Serialize;

use super::daemon::Daemon;
use super::{BenchError, BenchReport, Load, LoadShape, Verdict};

/// The backends a comparison can start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Backend {
    Qsd,
    Blklab,
    BlklabNoStats,
    BlklabPoll,
}

impl Backend {
    pub fn label(self) -> &'static str {
        match self {
            Backend::Qsd => "qemu-storage-daemon",
            Backend::Blklab => "blklab",
            Backend::BlklabNoStats => "blklab --no-stats",
            Backend::BlklabPoll => "blklab --poll",
        }
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
    /// `--poll` argument of the polling blklab (`None`: no poll rows).
    pub poll: Option<String>,
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
    let mut c = Command::new(qsd_bin);
    c.arg("--blockdev").arg(blockdev).arg("--export").arg(format!(
        "type=vhost-user-blk,id=e0,node-name=n0,addr.type=unix,addr.path={},writable={},num-queues={num_queues}",
        socket.display(),
        if writable { "on" } else { "off" }
    ));
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
        let mut cmd = match backend {
            Backend::Qsd => qsd_command(
                &opts.qsd_bin,
                &format!(
                    "driver=null-co,node-name=n0,size={},read-zeroes=on",
                    opts.size
                ),
                &socket,
                true,
                opts.shape.queues,
            ),
            _ => {
                let mut c = Command::new(&opts.blklab_bin);
                c.arg("serve")
                    .arg("--socket")
                    .arg(&socket)
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
                        c.arg(format!("--poll={}", opts.poll.as_deref().unwrap_or("50us")));
                    }
                    _ => {}
                }
                c
            }
        };
        cmd.stdout(Stdio::null());
        let daemon = Daemon::start(
            backend.label(),
            &mut cmd,
            std::slice::from_ref(&socket),
            Duration::from_secs(20),
        )
        .map_err(|e| match e {
            BenchError::Start { name, source } if backend == Backend::Qsd => {
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

/// One row of the plan: a load and the backends it runs against.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub name: String,
    pub depth: usize,
    pub client_poll: bool,
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
    pub rounds: Vec<BenchReport>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RowResult {
    pub row: Row,
    pub cells: Vec<Cell>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CompareReport {
    pub machine: String,
    /// `qemu-storage-daemon --version`'s first line: which QEMU was measured.
    pub qsd_version: String,
    pub rows: Vec<RowResult>,
    pub verdicts: Vec<Verdict>,
}

/// The rows: throughput at `depth`, QD1 round trip, and (with `poll`) QD1
/// with a polling client against qemu-storage-daemon and `blklab --poll`.
pub(crate) fn plan(opts: &CompareOpts) -> Vec<Row> {
    // With --poll, the polling blklab joins the throughput and QD1 rows
    // too: the same loads, with the backend spinning instead of sleeping.
    let poll = |mut v: Vec<Backend>| {
        if opts.poll.is_some() {
            v.push(Backend::BlklabPoll);
        }
        v
    };
    let mut rows = vec![
        Row {
            name: format!("{} qd{}", opts.shape.rw, opts.shape.depth),
            depth: opts.shape.depth,
            client_poll: false,
            backends: poll(vec![Backend::Qsd, Backend::Blklab, Backend::BlklabNoStats]),
        },
        Row {
            name: format!("{} qd1", opts.shape.rw),
            depth: 1,
            client_poll: false,
            backends: poll(vec![Backend::Qsd, Backend::Blklab]),
        },
    ];
    if opts.poll.is_some() {
        rows.push(Row {
            name: format!("{} qd1 poll-client", opts.shape.rw),
            depth: 1,
            client_poll: true,
            backends: vec![Backend::Qsd, Backend::BlklabPoll],
        });
    }
    rows
}

/// The machine, for the record: CPUs, kernel, CPU model, load average.
pub fn machine() -> String {
    let nproc = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
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
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    format!(
        "nproc {nproc}, kernel {}, CPU {cpu}, load average {}",
        kernel.trim(),
        load.join(" ")
    )
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
    // A bad --poll is refused before any daemon starts.
    if let Some(p) = &opts.poll {
        p.parse::<crate::device::polling::PollMode>()
            .map_err(BenchError::BadPoll)?;
    }
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
    let verdicts = verdicts(&results);
    Ok(CompareReport {
        machine,
        qsd_version,
        rows: results,
        verdicts,
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
            let d = daemons.iter_mut().find(|d| d.backend == backend).ok_or(
                BenchError::DaemonMissing {
                    backend: backend.label(),
                },
            )?;
            let rep = d.measure(&rr.row, opts, round)?;
            progress(&format!(
                "round {} {:<24} {:<20} {:>9.0} IOPS  p50 {:>7.1} us  {:>9.0} IOPS/CPU-s  {} errors",
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
        };
        super::run(&load).map_err(|e| BenchError::Load {
            backend: label,
            source: Box::new(e),
        })
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
    }
}

fn cell(rows: &[RowResult], row: usize, b: Backend) -> Option<&Cell> {
    rows.get(row)?.cells.iter().find(|c| c.backend == b)
}

/// `num / den - offset` as a verdict, when `den` is positive.
fn push_ratio(
    v: &mut Vec<Verdict>,
    what: String,
    (num, den, offset): (f64, f64, f64),
    target: &str,
    pass: fn(f64) -> bool,
) {
    if den > 0.0 {
        let value = num / den - offset;
        v.push(Verdict {
            what,
            value,
            target: target.into(),
            pass: pass(value),
        });
    }
}

/// The targets as ratios within this run.
fn verdicts(rows: &[RowResult]) -> Vec<Verdict> {
    let mut v = Vec::new();
    let within_3 = |r: f64| r.abs() <= 0.03;
    // blklab (default and --poll) over qemu-storage-daemon, per row.
    type Target = (
        usize,
        &'static str,
        fn(&Cell) -> f64,
        &'static str,
        fn(f64) -> bool,
    );
    let vs_qsd: [Target; 2] = [
        (
            0,
            "IOPS per backend CPU-second",
            |c| c.iops_per_backend_cpu_s,
            ">= 2.0",
            |r| r >= 2.0,
        ),
        (1, "round trip p50", |c| c.p50_ns, "<= 0.8", |r| r <= 0.8),
    ];
    for (row, metric, get, target, pass) in vs_qsd {
        for b in [Backend::Blklab, Backend::BlklabPoll] {
            if let (Some(q), Some(c)) = (cell(rows, row, Backend::Qsd), cell(rows, row, b)) {
                push_ratio(
                    &mut v,
                    format!(
                        "{}: {metric}, {} / qemu-storage-daemon",
                        rows[row].row.name,
                        b.label()
                    ),
                    (get(c), get(q), 0.0),
                    target,
                    pass,
                );
            }
        }
    }
    if let (Some(b), Some(n)) = (
        cell(rows, 0, Backend::Blklab),
        cell(rows, 0, Backend::BlklabNoStats),
    ) {
        push_ratio(
            &mut v,
            format!(
                "{}: statistics on vs --no-stats, IOPS per backend CPU-second",
                rows[0].row.name
            ),
            (b.iops_per_backend_cpu_s, n.iops_per_backend_cpu_s, 1.0),
            "within 3 %",
            within_3,
        );
        push_ratio(
            &mut v,
            format!("{}: statistics on vs --no-stats, IOPS", rows[0].row.name),
            (b.iops, n.iops, 1.0),
            "within 3 %",
            within_3,
        );
    }
    if let Some(p) = cell(rows, 2, Backend::BlklabPoll) {
        let us = p.p50_ns / 1e3;
        v.push(Verdict {
            what: format!("{}: blklab --poll round trip p50, us", rows[2].row.name),
            value: us,
            target: "<= 3".into(),
            pass: us <= 3.0,
        });
    }
    v
}

impl CompareReport {
    /// The ratio table.
    pub fn table(&self) -> String {
        let mut s = format!(
            "machine: {}\nqemu-storage-daemon: {}\n\n",
            self.machine, self.qsd_version
        );
        s += &format!(
            "{:<26} {:<20} {:>10} {:>9} {:>9} {:>9} {:>12} {:>7}\n",
            "load", "backend", "IOPS", "p50 us", "p99 us", "CPU s", "IOPS/CPU-s", "errors"
        );
        for rr in &self.rows {
            let base = rr.cells.first();
            for (i, c) in rr.cells.iter().enumerate() {
                s += &format!(
                    "{:<26} {:<20} {:>10.0} {:>9.1} {:>9.1} {:>9.3} {:>12.0} {:>7}\n",
                    if i == 0 { rr.row.name.as_str() } else { "" },
                    c.backend.label(),
                    c.iops,
                    c.p50_ns / 1e3,
                    c.p99_ns / 1e3,
                    c.backend_cpu_s,
                    c.iops_per_backend_cpu_s,
                    c.errors
                );
                if let (Some(b), true) = (base, i > 0) {
                    let ratio = |x: f64, y: f64| if y > 0.0 { x / y } else { f64::NAN };
                    s += &format!(
                        "{:<26} {:<20} {:>9.2}x {:>8.2}x {:>8.2}x {:>9} {:>11.2}x\n",
                        "",
                        format!("  ratio to {}", short(b.backend)),
                        ratio(c.iops, b.iops),
                        ratio(c.p50_ns, b.p50_ns),
                        ratio(c.p99_ns, b.p99_ns),
                        "",
                        ratio(c.iops_per_backend_cpu_s, b.iops_per_backend_cpu_s)
                    );
                }
            }
        }
        s += "\ntargets (ratios within this run):\n";
        for v in &self.verdicts {
            let val = if v.target.contains('%') {
                format!("{:+.1} %", v.value * 100.0)
            } else {
                format!("{:.2}", v.value)
            };
            s += &format!(
                "  {:<84} {:>9}  (target {}) {}\n",
                v.what,
                val,
                v.target,
                if v.pass { "PASS" } else { "FAIL" }
            );
        }
        s
    }
}

fn short(b: Backend) -> &'static str {
    match b {
        Backend::Qsd => "qsd",
        other => other.label(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(backend: Backend, iops: f64, per_cpu: f64, p50_ns: f64) -> Cell {
        Cell {
            backend,
            requests: 1,
            errors: 0,
            seconds: 1.0,
            backend_cpu_s: 1.0,
            iops,
            iops_per_backend_cpu_s: per_cpu,
            p50_ns,
            p99_ns: p50_ns * 2.0,
            rounds: Vec::new(),
        }
    }

    fn row(name: &str, depth: usize, client_poll: bool, cells: Vec<Cell>) -> RowResult {
        RowResult {
            row: Row {
                name: name.into(),
                depth,
                client_poll,
                backends: cells.iter().map(|c| c.backend).collect(),
            },
            cells,
        }
    }

    fn find<'a>(v: &'a [Verdict], what: &str) -> &'a Verdict {
        v.iter()
            .find(|x| x.what.contains(what))
            .unwrap_or_else(|| panic!("no verdict {what:?} in {v:#?}"))
    }

    #[test]
    fn verdicts_are_the_ratios_against_their_targets() {
        let rows = vec![
            row(
                "randread qd64",
                64,
                false,
                vec![
                    cell(Backend::Qsd, 100.0, 1000.0, 50_000.0),
                    cell(Backend::Blklab, 150.0, 2100.0, 40_000.0),
                    cell(Backend::BlklabNoStats, 160.0, 2200.0, 40_000.0),
                    cell(Backend::BlklabPoll, 200.0, 1900.0, 30_000.0),
                ],
            ),
            row(
                "randread qd1",
                1,
                false,
                vec![
                    cell(Backend::Qsd, 10.0, 10.0, 100_000.0),
                    cell(Backend::Blklab, 10.0, 10.0, 85_000.0),
                    cell(Backend::BlklabPoll, 10.0, 10.0, 8_000.0),
                ],
            ),
            row(
                "randread qd1 poll-client",
                1,
                true,
                vec![
                    cell(Backend::Qsd, 10.0, 10.0, 20_000.0),
                    cell(Backend::BlklabPoll, 10.0, 10.0, 3_500.0),
                ],
            ),
        ];
        let v = verdicts(&rows);
        assert_eq!(v.len(), 7, "{v:#?}");
        let t = find(&v, "qd64: IOPS per backend CPU-second, blklab / ");
        assert!((t.value - 2.1).abs() < 1e-9 && t.pass, "{t:?}");
        let t = find(&v, "qd64: IOPS per backend CPU-second, blklab --poll /");
        assert!((t.value - 1.9).abs() < 1e-9 && !t.pass, "{t:?}");
        let t = find(&v, "qd1: round trip p50, blklab / ");
        assert!((t.value - 0.85).abs() < 1e-9 && !t.pass, "{t:?}");
        let t = find(&v, "qd1: round trip p50, blklab --poll /");
        assert!((t.value - 0.08).abs() < 1e-9 && t.pass, "{t:?}");
        // 2100 / 2200 - 1 = -4.5 %: outside 3 %.
        let t = find(&v, "statistics on vs --no-stats, IOPS per backend");
        assert!((t.value - (2100.0 / 2200.0 - 1.0)).abs() < 1e-9 && !t.pass);
        // 150 / 160 - 1 = -6.25 %.
        let t = find(&v, "statistics on vs --no-stats, IOPS");
        assert!(!t.pass);
        let t = find(&v, "blklab --poll round trip p50, us");
        assert!((t.value - 3.5).abs() < 1e-9 && !t.pass, "{t:?}");
    }

    #[test]
    fn a_missing_or_zero_denominator_gives_no_verdict() {
        let rows = vec![row(
            "randread qd64",
            64,
            false,
            vec![
                cell(Backend::Qsd, 100.0, 0.0, 50_000.0),
                cell(Backend::Blklab, 150.0, 2100.0, 40_000.0),
            ],
        )];
        let v = verdicts(&rows);
        assert!(v.is_empty(), "{v:#?}");
    }

    #[test]
    fn the_table_names_the_measured_qemu_storage_daemon() {
        let r = CompareReport {
            machine: "m".into(),
            qsd_version: "qemu-storage-daemon version 10.0.2".into(),
            rows: vec![],
            verdicts: vec![Verdict {
                what: "x".into(),
                value: 0.5,
                target: ">= 2.0".into(),
                pass: false,
            }],
        };
        let t = r.table();
        assert!(
            t.contains("qemu-storage-daemon: qemu-storage-daemon version 10.0.2"),
            "{t}"
        );
        assert!(t.contains("FAIL"), "{t}");
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
