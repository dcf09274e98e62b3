//! `blklab bench --instructions`: a backend's own instructions per request,
//! counted with callgrind rather than timed.
//!
//! The backend runs under callgrind; the libblkio client (in this process,
//! not counted) drives a counted load of N requests, then, against a fresh
//! backend, 2N. The difference of the two totals divided by N is the cost
//! of a request: start-up, connection set-up and shutdown cancel out.
//! The same difference per function says where the instructions go.
//!
//! Unlike wall-clock rates, these counts repeat from run to run whatever
//! the machine's load (what does vary is how many requests each wake-up
//! finds at QD64, so the epoll and eventfd share per request moves a
//! little with the client's speed).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde::Serialize;

use super::callgrind::{self, Profile};
use super::daemon::Daemon;
use super::verdict::tally;
use super::versus_qsd::{qsd_command, qsd_version};
use super::{BenchError, Load, RwMode, Skipped, Verdict};

/// Who is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Subject {
    /// `blklab serve --disk null` (statistics on, the default).
    Blklab,
    /// `blklab serve --disk null --no-stats`.
    BlklabNoStats,
    /// qemu-storage-daemon, `null-co` with `read-zeroes=on`.
    Qsd,
}

impl Subject {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Subject::Blklab => "blklab",
            Subject::BlklabNoStats => "blklab --no-stats",
            Subject::Qsd => "qemu-storage-daemon",
        }
    }
}

/// One counted load: 4 KiB random requests on one queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CountedLoad {
    pub rw: RwMode,
    pub depth: usize,
}

/// The client's pause between a completion and the next request at QD1:
/// long enough for the backend (slowed some 50-fold by callgrind) to go
/// back to sleep, so every request costs a wake-up, as at QD1 in a guest.
pub(crate) const QD1_THINK: Duration = Duration::from_millis(1);

impl CountedLoad {
    /// `RW:QD` (`randwrite:64`, `randread:1`), as `--load` takes it.
    pub fn parse(s: &str) -> Result<CountedLoad, BenchError> {
        let bad = |why: &'static str| BenchError::BadCountedLoad {
            spec: s.to_string(),
            why,
        };
        let (rw, qd) = s.split_once(':').ok_or_else(|| bad("no ':'"))?;
        let rw = match rw {
            "randread" => RwMode::Randread,
            "randwrite" => RwMode::Randwrite,
            _ => return Err(bad("unknown RW")),
        };
        let depth: usize = qd.parse().map_err(|_| bad("QD is not a number"))?;
        if !(1..=256).contains(&depth) {
            return Err(bad("QD out of range"));
        }
        Ok(CountedLoad { rw, depth })
    }

    pub fn name(&self) -> String {
        format!("{} 4k qd{}", self.rw, self.depth)
    }

    /// The client's pause after each completion ([`QD1_THINK`] at QD1).
    pub(crate) fn think(&self) -> Duration {
        if self.depth == 1 {
            QD1_THINK
        } else {
            Duration::ZERO
        }
    }

    /// Requests of the shorter run for `--requests n`: a quarter at QD1,
    /// where every request also waits [`QD1_THINK`].
    pub(crate) fn requests(&self, n: u64) -> u64 {
        if self.depth == 1 {
            (n / 4).max(1)
        } else {
            n.max(1)
        }
    }
}

/// The loads of the recorded table: writes and reads, QD64 and QD1.
pub(crate) fn default_loads() -> Vec<CountedLoad> {
    let mut v = Vec::new();
    for depth in [64, 1] {
        for rw in [RwMode::Randwrite, RwMode::Randread] {
            v.push(CountedLoad { rw, depth });
        }
    }
    v
}

#[derive(Debug, Clone)]
pub struct InsnOpts {
    pub blklab_bin: PathBuf,
    /// The reference daemon; `None` counts blklab only.
    pub qsd_bin: Option<PathBuf>,
    pub valgrind: PathBuf,
    /// Requests of the short run (the long one does twice as many).
    pub requests: u64,
    pub loads: Vec<CountedLoad>,
    pub subjects: Vec<Subject>,
    /// Functions listed per cell.
    pub top: usize,
    /// Disk size.
    pub size: u64,
    /// Keep each run's callgrind profile here (for callgrind_annotate).
    pub keep_profiles: Option<PathBuf>,
}

/// One subject under one load.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    pub subject: Subject,
    pub load: CountedLoad,
    /// Requests of the two runs.
    pub requests: [u64; 2],
    /// Instructions the backend executed in each run.
    pub totals: [u64; 2],
    pub instructions_per_request: f64,
    /// Of those, in memset-like functions (the read path's zero fill).
    pub zero_fill_per_request: f64,
    /// Of those, in the statistics' own functions ([`is_statistics`]).
    pub statistics_per_request: f64,
    /// The most expensive functions per request (own instructions).
    pub top: Vec<(String, f64)>,
}

#[derive(Debug, Clone, Serialize)]
pub struct InsnReport {
    pub valgrind: String,
    pub qsd_version: Option<String>,
    pub requests: u64,
    pub cells: Vec<Cell>,
    pub verdicts: Vec<Verdict>,
    /// The targets this run could not judge, and why.
    pub skipped: Vec<Skipped>,
}

/// `valgrind --version`, or why valgrind cannot run.
pub fn valgrind_version(bin: &Path) -> Result<String, BenchError> {
    let out = super::version_output(
        bin,
        "Debian: apt-get install valgrind; .ci/install-deps does",
    )?;
    let v = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || v.is_empty() {
        return Err(BenchError::VersionFailed {
            bin: bin.to_path_buf(),
            status: out.status,
            stderr: None,
        });
    }
    Ok(v)
}

/// Count one subject under one load: two runs, N and 2N requests.
pub fn count(
    opts: &InsnOpts,
    subject: Subject,
    load: CountedLoad,
    dir: &Path,
) -> Result<Cell, BenchError> {
    let n = load.requests(opts.requests);
    let short = count_run(opts, subject, load, n, dir)?;
    let long = count_run(opts, subject, load, 2 * n, dir)?;
    let per = n as f64;
    if long.total <= short.total {
        return Err(BenchError::CountNotUsable {
            cell: format!("{} {}", subject.label(), load.name()),
            requests: [n, 2 * n],
            totals: [short.total, long.total],
        });
    }
    let diff = short.difference(&long, per);
    let zero_fill = diff
        .iter()
        .filter(|(f, _)| f.contains("memset"))
        .map(|(_, v)| v)
        .sum();
    let statistics = diff
        .iter()
        .filter(|(f, _)| is_statistics(f))
        .map(|(_, v)| v)
        .sum();
    Ok(Cell {
        subject,
        load,
        requests: [n, 2 * n],
        totals: [short.total, long.total],
        instructions_per_request: (long.total - short.total) as f64 / per,
        zero_fill_per_request: zero_fill,
        statistics_per_request: statistics,
        top: diff.into_iter().take(opts.top).collect(),
    })
}

/// Whether callgrind's function `name` is blklab's statistics: the
/// histogram recording of `blklab::stats` (kept out of line for this, see
/// `QueueStats::popped`) and the clock it reads. The calls themselves
/// (a few instructions each, in the caller) are not included; what is
/// left with `--no-stats` (the counters, one test of the flag per call) is
/// not statistics either.
pub(crate) fn is_statistics(name: &str) -> bool {
    name.starts_with("blklab::stats::") || name.starts_with("blklab::util::clock::")
}

/// One backend under callgrind, `requests` requests, then SIGTERM: its
/// profile.
fn count_run(
    opts: &InsnOpts,
    subject: Subject,
    load: CountedLoad,
    requests: u64,
    dir: &Path,
) -> Result<Profile, BenchError> {
    let tag = format!(
        "{}-{}-qd{}-{requests}",
        match subject {
            Subject::Blklab => "blklab",
            Subject::BlklabNoStats => "blklab-nostats",
            Subject::Qsd => "qsd",
        },
        load.rw,
        load.depth
    );
    let socket = dir.join(format!("{tag}.sock"));
    let out = dir.join(format!("{tag}.callgrind"));
    let _ = std::fs::remove_file(&out);
    let mut cmd = match subject {
        Subject::Qsd => {
            let qsd = opts.qsd_bin.as_deref().ok_or(BenchError::NoQsdBinary)?;
            let q = qsd_command(
                qsd,
                &format!(
                    "driver=null-co,node-name=n0,size={},read-zeroes=on",
                    opts.size
                ),
                &socket,
                true,
                1,
            );
            let mut c = callgrind::command(&opts.valgrind, &out, qsd);
            c.args(q.get_args());
            c
        }
        Subject::Blklab | Subject::BlklabNoStats => {
            let mut c = callgrind::command(&opts.valgrind, &out, &opts.blklab_bin);
            c.arg("serve")
                .arg("--socket")
                .arg(&socket)
                .args(["--disk", "null", "--num-queues", "1", "--size"])
                .arg(opts.size.to_string())
                .env("RUST_LOG", "warn");
            if subject == Subject::BlklabNoStats {
                c.arg("--no-stats");
            }
            c
        }
    };
    cmd.stdout(Stdio::null());
    let mut daemon = Daemon::start(
        subject.label(),
        &mut cmd,
        std::slice::from_ref(&socket),
        Duration::from_secs(120),
    )?;
    let mut l = Load::new(&socket);
    l.shape.depth = load.depth;
    l.shape.rw = load.rw;
    l.shape.bs = 4096;
    l.count = Some(requests);
    l.think = load.think();
    let cell = || format!("{} {}", subject.label(), load.name());
    let rep = super::run(&l).map_err(|e| BenchError::Counted {
        cell: cell(),
        source: Box::new(e),
    })?;
    if rep.errors > 0 || rep.requests != requests {
        return Err(BenchError::Incomplete {
            cell: cell(),
            requests,
            completed: rep.requests,
            failed: rep.errors,
        });
    }
    daemon.terminate(Duration::from_secs(120))?;
    drop(daemon);
    let p = Profile::read(&out)?;
    if let Some(keep) = &opts.keep_profiles {
        let to = keep.join(format!("{tag}.callgrind"));
        std::fs::create_dir_all(keep)
            .and_then(|()| std::fs::copy(&out, &to).map(|_| ()))
            .map_err(|source| BenchError::KeepProfile { path: to, source })?;
    }
    let _ = std::fs::remove_file(&out);
    Ok(p)
}

/// Count every subject under every load. `progress` gets a line per cell.
pub fn run(opts: &InsnOpts, mut progress: impl FnMut(&str)) -> Result<InsnReport, BenchError> {
    if opts.requests == 0 {
        return Err(BenchError::ZeroRequests);
    }
    let valgrind = valgrind_version(&opts.valgrind)?;
    let qsd_version = match (&opts.qsd_bin, opts.subjects.contains(&Subject::Qsd)) {
        (Some(b), true) => Some(qsd_version(b)?),
        (None, true) => return Err(BenchError::NoQsdBinary),
        _ => None,
    };
    progress(&format!(
        "{valgrind}; {}; {} and {} requests per count",
        qsd_version.as_deref().unwrap_or("blklab only"),
        opts.requests,
        2 * opts.requests
    ));
    let dir = tempfile::Builder::new()
        .prefix("blklab-insns")
        .tempdir()
        .map_err(BenchError::Tempdir)?;
    let mut cells = Vec::new();
    for load in &opts.loads {
        for &subject in &opts.subjects {
            let c = count(opts, subject, *load, dir.path())?;
            progress(&format!(
                "{:<20} {:<20} {:>8.0} instructions per request",
                load.name(),
                subject.label(),
                c.instructions_per_request
            ));
            cells.push(c);
        }
    }
    let (verdicts, skipped) = verdicts(&cells);
    Ok(InsnReport {
        valgrind,
        qsd_version,
        requests: opts.requests,
        cells,
        verdicts,
        skipped,
    })
}

fn find<'a>(cells: &'a [Cell], s: Subject, l: &CountedLoad) -> Option<&'a Cell> {
    cells.iter().find(|c| c.subject == s && c.load == *l)
}

/// The targets: at most half qemu-storage-daemon's instructions per
/// request (reads: apart from the zero fill, which both daemons do with
/// memset), and statistics adding at most 3 %. Each load has both; one
/// this run cannot judge (a side not counted, nothing to divide by) is
/// skipped with why.
fn verdicts(cells: &[Cell]) -> (Vec<Verdict>, Vec<Skipped>) {
    let mut v = Vec::new();
    let mut skipped = Vec::new();
    let mut skip = |what: String, target: &str, reason: String| {
        skipped.push(Skipped {
            what,
            target: target.into(),
            reason,
        })
    };
    let mut loads: Vec<CountedLoad> = Vec::new();
    for c in cells {
        if !loads.contains(&c.load) {
            loads.push(c.load);
        }
    }
    for l in &loads {
        let fill = if l.rw == RwMode::Randwrite {
            ""
        } else {
            " (without the zero fill)"
        };
        let what = format!("{}: blklab / qemu-storage-daemon{fill}", l.name());
        match (
            find(cells, Subject::Blklab, l),
            find(cells, Subject::Qsd, l),
        ) {
            (Some(b), Some(q)) => {
                let (num, den) = if l.rw == RwMode::Randwrite {
                    (b.instructions_per_request, q.instructions_per_request)
                } else {
                    (
                        b.instructions_per_request - b.zero_fill_per_request,
                        q.instructions_per_request - q.zero_fill_per_request,
                    )
                };
                if den > 0.0 {
                    let r = num / den;
                    v.push(Verdict {
                        what,
                        value: r,
                        target: "<= 0.50".into(),
                        pass: r <= 0.5,
                    });
                } else {
                    skip(
                        what,
                        "<= 0.50",
                        format!("qemu-storage-daemon's instructions per request{fill} are {den}: no ratio"),
                    );
                }
            }
            (None, _) => skip(what, "<= 0.50", "blklab was not counted".into()),
            (_, None) => skip(
                what,
                "<= 0.50",
                "qemu-storage-daemon was not counted (--blklab-only)".into(),
            ),
        }
        let what = format!(
            "{}: statistics' own instructions / all (blklab::stats, the clock; without the zero fill)",
            l.name()
        );
        match find(cells, Subject::Blklab, l) {
            Some(b) => {
                let ours = b.instructions_per_request - b.zero_fill_per_request;
                if ours > 0.0 {
                    // The statistics' own instructions, counted in the same
                    // run: exact; as a share of the request path without the
                    // zero fill (memset's, not ours). Against the --no-stats run the difference of
                    // totals also holds how differently the two runs happened
                    // to batch their wake-ups and notifications (QD64 totals
                    // move by up to ~10 % between runs of the same binary).
                    let r = b.statistics_per_request / ours;
                    v.push(Verdict {
                        what,
                        value: r,
                        target: "<= 3 %".into(),
                        pass: r <= 0.03,
                    });
                } else {
                    skip(
                        what,
                        "<= 3 %",
                        format!("blklab's instructions per request without the zero fill are {ours}: no ratio"),
                    );
                }
            }
            None => skip(what, "<= 3 %", "blklab was not counted".into()),
        }
    }
    (v, skipped)
}

impl InsnReport {
    /// The table, the verdicts and each cell's top functions.
    pub fn text(&self) -> String {
        let mut subjects: Vec<Subject> = Vec::new();
        let mut loads: Vec<CountedLoad> = Vec::new();
        for c in &self.cells {
            if !subjects.contains(&c.subject) {
                subjects.push(c.subject);
            }
            if !loads.contains(&c.load) {
                loads.push(c.load);
            }
        }
        let mut s = format!(
            "instructions per request (callgrind, {}): the difference of runs of N and 2N requests, / N; \
             N = {} (QD1: {}, {} ms pause after each completion, one wake-up per request); 1 queue, 4 KiB, null disk\n",
            self.valgrind,
            self.requests,
            (self.requests / 4).max(1),
            QD1_THINK.as_millis()
        );
        if let Some(q) = &self.qsd_version {
            s += &format!("reference: {q}\n");
        }
        s += &format!("{:<20}", "load");
        for sub in &subjects {
            s += &format!(" {:>20}", sub.label());
        }
        s += "\n";
        for l in &loads {
            s += &format!("{:<20}", l.name());
            for sub in &subjects {
                match find(&self.cells, *sub, l) {
                    Some(c) if c.zero_fill_per_request >= 1.0 => {
                        s += &format!(
                            " {:>20}",
                            format!(
                                "{:.0} ({:.0} fill)",
                                c.instructions_per_request, c.zero_fill_per_request
                            )
                        )
                    }
                    Some(c) => s += &format!(" {:>20.0}", c.instructions_per_request),
                    None => s += &format!(" {:>20}", "-"),
                }
            }
            s += "\n";
        }
        let with_stats: Vec<&Cell> = self
            .cells
            .iter()
            .filter(|c| c.subject == Subject::Blklab)
            .collect();
        if !with_stats.is_empty() {
            s += "\nblklab's statistics' own instructions per request (blklab::stats, the clock; same run; of the request path without the zero fill):\n";
            for c in with_stats {
                let ours = c.instructions_per_request - c.zero_fill_per_request;
                s += &format!(
                    "  {:<20} {:>6.1} of {:>6.0} ({:.1} %)\n",
                    c.load.name(),
                    c.statistics_per_request,
                    ours,
                    100.0 * c.statistics_per_request / ours.max(1.0)
                );
            }
        }
        if !self.verdicts.is_empty() || !self.skipped.is_empty() {
            s += "\ntargets:\n";
            for v in &self.verdicts {
                s += &format!(
                    "  {:<4} {}: {:.3} (target {})\n",
                    if v.pass { "ok" } else { "MISS" },
                    v.what,
                    v.value,
                    v.target
                );
            }
            for k in &self.skipped {
                s += &format!("  SKIPPED {}: {} (target {})\n", k.what, k.reason, k.target);
            }
            s += &tally(&self.verdicts, &self.skipped);
            s += "\n";
        }
        for c in &self.cells {
            if c.top.is_empty() {
                continue;
            }
            s += &format!(
                "\n{} {}: own instructions per request, most first\n",
                c.subject.label(),
                c.load.name()
            );
            for (f, n) in &c.top {
                s += &format!("  {n:>8.1}  {}\n", short_name(f));
            }
        }
        s
    }
}

/// A function name without its Rust hash suffix, cut to 110 characters.
fn short_name(f: &str) -> String {
    let f = match f.rfind("::h") {
        Some(i) if f[i + 3..].chars().all(|c| c.is_ascii_hexdigit()) && f.len() - i == 19 => {
            &f[..i]
        }
        _ => f,
    };
    if f.chars().count() > 110 {
        let cut: String = f.chars().take(107).collect();
        format!("{cut}...")
    } else {
        f.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(subject: Subject, rw: RwMode, depth: usize, per: f64, fill: f64) -> Cell {
        Cell {
            subject,
            load: CountedLoad { rw, depth },
            requests: [1, 2],
            totals: [0, 0],
            instructions_per_request: per,
            zero_fill_per_request: fill,
            statistics_per_request: 40.0,
            top: vec![],
        }
    }

    #[test]
    fn verdicts_compare_with_the_reference_and_leave_the_zero_fill_out_of_reads() {
        let cells = vec![
            cell(Subject::Blklab, RwMode::Randwrite, 64, 1400.0, 0.0),
            cell(Subject::BlklabNoStats, RwMode::Randwrite, 64, 1380.0, 0.0),
            cell(Subject::Qsd, RwMode::Randwrite, 64, 2900.0, 0.0),
            cell(Subject::Blklab, RwMode::Randread, 64, 5600.0, 4100.0),
            cell(Subject::Qsd, RwMode::Randread, 64, 6900.0, 4100.0),
        ];
        let (v, skipped) = verdicts(&cells);
        assert_eq!(v.len(), 4, "{v:?}");
        assert!(skipped.is_empty(), "{skipped:?}");
        assert!(v[0].pass && (v[0].value - 1400.0 / 2900.0).abs() < 1e-9);
        // Statistics: 40 of 1400 is within 3 %; of a read's 1500 without
        // the fill too (2.7 %).
        assert!(v[1].pass && (v[1].value - 40.0 / 1400.0).abs() < 1e-9);
        assert!(!v[2].pass, "1500 / 2800 > 0.5: {:?}", v[2]);
        assert!(v[2].what.contains("without the zero fill"));
        assert!(v[3].pass && (v[3].value - 40.0 / 1500.0).abs() < 1e-9);
        let mut heavy = cells.clone();
        heavy[0].statistics_per_request = 50.0;
        assert!(!verdicts(&heavy).0[1].pass, "50 of 1400 is over 3 %");
    }

    #[test]
    fn targets_a_run_cannot_judge_are_skipped_with_why() {
        // --blklab-only: no reference to divide by.
        let cells = vec![
            cell(Subject::Blklab, RwMode::Randwrite, 64, 1400.0, 0.0),
            cell(Subject::BlklabNoStats, RwMode::Randwrite, 64, 1380.0, 0.0),
        ];
        let (v, skipped) = verdicts(&cells);
        assert_eq!(v.len(), 1, "only the statistics' share: {v:?}");
        assert_eq!(
            skipped,
            [Skipped {
                what: "randwrite 4k qd64: blklab / qemu-storage-daemon".into(),
                target: "<= 0.50".into(),
                reason: "qemu-storage-daemon was not counted (--blklab-only)".into(),
            }]
        );
        // Nothing left without the zero fill: no share to take.
        let cells = vec![
            cell(Subject::Blklab, RwMode::Randread, 64, 4100.0, 4100.0),
            cell(Subject::Qsd, RwMode::Randread, 64, 4100.0, 4100.0),
        ];
        let (v, skipped) = verdicts(&cells);
        assert!(v.is_empty(), "{v:?}");
        assert_eq!(skipped.len(), 2, "{skipped:?}");
        assert!(
            skipped[0].reason.ends_with("are 0: no ratio"),
            "{skipped:?}"
        );
        let report = InsnReport {
            valgrind: "valgrind-3.19.0".into(),
            qsd_version: None,
            requests: 1,
            cells,
            verdicts: v,
            skipped,
        };
        let t = report.text();
        assert!(t.contains("\n  SKIPPED randread 4k qd64: blklab / qemu-storage-daemon (without the zero fill): qemu-storage-daemon's"), "{t}");
        assert!(
            t.contains("targets: 0 passed, 0 failed, 2 skipped (not judged in this run)"),
            "{t}"
        );
    }

    #[test]
    fn loads_parse_and_refuse_nonsense() {
        let l = CountedLoad::parse("randwrite:64").unwrap();
        assert_eq!((l.rw, l.depth), (RwMode::Randwrite, 64));
        assert_eq!(CountedLoad::parse("randread:1").unwrap().depth, 1);
        for (bad, why) in [
            ("randwrite", "no ':'"),
            ("randrw:4", "unknown RW"),
            ("randread:0", "QD out of range"),
            ("randread:999", "QD out of range"),
            ("randread:x", "QD is not a number"),
            ("write:x", "unknown RW"),
            ("", "no ':'"),
        ] {
            let e = CountedLoad::parse(bad).unwrap_err();
            assert!(
                matches!(&e, BenchError::BadCountedLoad { spec, why: w } if spec == bad && *w == why),
                "{bad}: {e:?}"
            );
            assert!(e.to_string().contains("RW:QD"), "{bad}: {e}");
        }
    }

    #[test]
    fn statistics_are_the_stats_modules_and_the_clock() {
        assert!(is_statistics(
            "blklab::stats::queue::QueueStats::record_pop"
        ));
        assert!(is_statistics("blklab::util::clock::Clock::now"));
        assert!(!is_statistics("blklab::backend::worker::Pass<R>::drain"));
        assert!(!is_statistics("blklab::virtq::split_ring::SplitRing::pop"));
    }

    #[test]
    fn names_lose_their_hash() {
        assert_eq!(
            short_name("blklab::backend::worker::Pass<R>::drain::h0123456789abcdef"),
            "blklab::backend::worker::Pass<R>::drain"
        );
        assert_eq!(short_name("memset"), "memset");
    }
}
