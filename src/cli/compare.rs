//! `blklab compare`'s options and the request they make, and writing
//! the reports: `compare`'s, and those `blklab run` ends with (one per pair
//! of kernels in the run).

use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::record::result::ResultRecord;
use crate::report::compare::{Compared, PairSpec, Report, Request};
use crate::report::load::Side;
use crate::report::{profile, render};

#[derive(Debug, Clone, clap::Args)]
#[command(after_help = "\
Examples:
  blklab compare runs/ab                          kernel B against kernel A, row by row
  blklab compare runs/a runs/b:6.12-noplug        the same, from two runs
  blklab compare runs/r1:5.10 --pair single-queue:host-tags --pair single-queue-none:host-tags-none
                                                  on 5.10, host-tags (B) against single-queue (A)
                                                  in every scenario that has both
  blklab compare runs/r1 --pair single-queue:host-tags
                                                  with two kernels: the pair's effect on the second
                                                  kernel against its effect on the first (DiD)

The difference in differences (DiD) is the ratio of the two kernels' ratios
mean(OTHER)/mean(BASE), computed in log space, its interval by the delta
method with Welch-Satterthwaite degrees of freedom (or a bootstrap when
samples are few or skewed), reported as a relative change.

Sides that differ in backend configuration, accelerator, vCPU count, QEMU
version, variant definitions or scenario sets are refused unless --force;
the two variants of a pair differ by design and are only listed.")]
pub struct CompareArgs {
    /// A and B: run directories (DIR or DIR:KERNEL); one DIR with two kernels
    /// compares them in run order. With --pair, one side of one kernel
    /// (DIR of one kernel, or DIR:KERNEL) compares its variants. A DIR may
    /// be DIR,DIR,...: the shards of one run (`blklab run --shard I/N`),
    /// merged (they must be of one plan, accelerator and QEMU version).
    #[arg(value_name = "SIDE", num_args = 1..=2, required = true)]
    pub sides: Vec<String>,
    /// A variant pair BASE:OTHER (repeatable): OTHER (B) against BASE (A),
    /// each VARIANT (in every scenario that has both) or SCENARIO/VARIANT.
    /// With two kernels: each kernel's pair effect and their difference in
    /// differences.
    #[arg(long, value_name = "BASE:OTHER", value_parser = parse_pair)]
    pub pair: Vec<PairSpec>,
    /// Metrics to show (comma-separated, repeatable; `all` for every one):
    /// guest_busy_pct, guest_sys_pct, guest_cpu_us_per_io, iops,
    /// host_vcpu_us_per_io, host_qemu_other_us_per_io, backend_us_per_io,
    /// kicks_per_io, requests_per_kick, notifications_per_io, ctxsw_per_io,
    /// irqs_per_io, lat_p50_us, lat_p99_us, instructions_per_io,
    /// kernel_instructions_per_io, user_instructions_per_io,
    /// idle_entries_per_io, and under KVM kvm_exits_per_io,
    /// kvm_halt_exits_per_io, kvm_io_exits_per_io, kvm_mmio_exits_per_io,
    /// kvm_irq_exits_per_io, kvm_irq_window_exits_per_io,
    /// kvm_irq_injections_per_io, kvm_halt_successful_poll_per_io,
    /// kvm_halt_attempted_poll_per_io, kvm_halt_poll_ns_per_io,
    /// kvm_halt_wait_ns_per_io. The default adds the instruction metrics
    /// when the records have them (--count-insns), and KVM's exits, HLT
    /// exits and interrupt injections per IO when they have KVM's counters.
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub metric: Vec<String>,
    /// What to print.
    #[arg(long, value_enum, default_value = "table")]
    pub format: CompareFormat,
    /// Also write every format, the HTML page and its SVG plots here.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// With --out: also draw the HTML page into report.png beside it, with
    /// a headless Chromium (warns and goes on without one).
    #[arg(long, requires = "out")]
    pub screenshot: bool,
    /// Confidence level of the intervals.
    #[arg(long, value_name = "P", default_value_t = 0.95)]
    pub confidence: f64,
    /// Compare even when a condition that changes the numbers differs
    /// between or within the sides (docs/user-guide.md lists them: the
    /// accelerator, --deterministic, instruction counting, vCPUs, memory,
    /// the kernel command line, QEMU, the scenario, the device model, the
    /// guest image, …) or the scenario sets differ. Every report format
    /// then says at its top which conditions differ.
    #[arg(long)]
    pub force: bool,
    /// A directory whose records belong to several runs (copied together)
    /// is refused; --run ID reads only the records of run ID, which must be
    /// the run its run.json describes (repeatable, one per directory).
    #[arg(long, value_name = "ID")]
    pub run: Vec<String>,
    /// A nested run of the same cases (`blklab run --accel nested
    /// --count-insns`): the report adds, per kernel and case, its rows'
    /// would-be exits per IO beside the nested run's KVM exits per IO.
    #[arg(long, value_name = "DIR")]
    pub coverage: Option<PathBuf>,
    /// Functions per row in the differential instruction profile (records
    /// of `blklab run --count-insns`), ranked by |B - A| per IO.
    #[arg(long, value_name = "N", default_value_t = blklab_profile_top())]
    pub top: usize,
}

fn parse_pair(s: &str) -> Result<PairSpec, String> {
    PairSpec::parse(s).map_err(|e| e.to_string())
}

const fn blklab_profile_top() -> usize {
    profile::DEFAULT_TOP
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CompareFormat {
    Table,
    Markdown,
    Csv,
    Json,
}

impl CompareArgs {
    /// The comparison these options ask for.
    pub fn request(&self) -> Request {
        Request {
            sides: self.sides.clone(),
            pairs: self.pair.clone(),
            metrics: self.metric.clone(),
            confidence: self.confidence,
            force: self.force,
            profile_top: self.top,
            runs: self.run.clone(),
            coverage: self.coverage.clone(),
        }
    }

    /// What `--out` (and `--screenshot`) ask for of `compared`: every
    /// format written to the directory, and the page's PNG.
    pub fn write_out(&self, compared: &Compared) -> Result<(), WriteReportError> {
        let Some(dir) = &self.out else {
            return Ok(());
        };
        let files = write_report(&compared.report, &compared.a, &compared.b, dir)?;
        eprintln!("wrote {} files to {}", files.len(), dir.display());
        if self.screenshot {
            screenshot(dir);
        }
        Ok(())
    }
}

impl CompareFormat {
    /// `report` in this format.
    pub fn render(self, report: &Report) -> String {
        match self {
            CompareFormat::Table => render::table(report),
            CompareFormat::Markdown => render::markdown(report),
            CompareFormat::Csv => render::csv(report),
            CompareFormat::Json => render::json(report),
        }
    }
}

/// A report directory that could not be written.
#[derive(Debug, Error)]
#[error("cannot write the report to {}", dir.display())]
pub struct WriteReportError {
    dir: PathBuf,
    #[source]
    source: std::io::Error,
}

/// Every format of `report` (of `a` against `b`), the HTML page and its
/// plots, in `dir`: the files written.
fn write_report(
    report: &Report,
    a: &Side,
    b: &Side,
    dir: &Path,
) -> Result<Vec<PathBuf>, WriteReportError> {
    crate::report::write_all(report, a, b, dir).map_err(|source| WriteReportError {
        dir: dir.to_path_buf(),
        source,
    })
}

/// After `blklab run`: each pair of kernels' report of the run in
/// `out_dir` (`records`, the run's results, choose the metrics), its table
/// printed and every format written to `compare-A-vs-B/` (with
/// `screenshot`, the page's PNG too). No report is a warning, not an error.
pub fn run_reports(
    out_dir: &Path,
    records: &[ResultRecord],
    screenshot: bool,
) -> Result<(), WriteReportError> {
    let metrics = crate::record::metrics::default_metrics(records);
    let reports = match crate::report::run_comparisons(out_dir, &metrics) {
        Ok(reports) => reports,
        Err(e) => {
            log::warn!("no A/B report: {e}");
            return Ok(());
        }
    };
    for (report, a, b) in reports {
        println!();
        print!("{}", render::table(&report));
        let dir = out_dir.join(format!("compare-{}-vs-{}", a.kernel, b.kernel));
        write_report(&report, &a, &b, &dir)?;
        println!("report: {}", dir.join("report.html").display());
        if screenshot {
            self::screenshot(&dir);
        }
    }
    Ok(())
}

/// `report.png` beside `dir/report.html`, or a warning saying why not.
fn screenshot(dir: &Path) {
    match crate::report::screenshot::screenshot(&dir.join("report.html")) {
        Ok(png) => eprintln!("screenshot: {}", png.display()),
        Err(e) => log::warn!("no screenshot: {e}"),
    }
}
