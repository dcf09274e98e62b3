//! The command line, as clap structures (parsed in `main.rs`).

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::device::config::DiskArgs;
use crate::lab::options::{parse_interval, RunArgs};

#[derive(Debug, Parser)]
#[command(
    name = "blklab",
    version,
    about = "An instrumented vhost-user-blk backend for measuring guest block-layer CPU cost"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// More on the terminal: `blklab run` and `bisect` show every INFO
    /// record (the backend's, QEMU's stderr) and not only their progress,
    /// decisions and warnings; -vv DEBUG. RUST_LOG, when set, decides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve virtio-blk disks over vhost-user sockets until SIGINT/SIGTERM.
    Serve(Box<ServeArgs>),
    /// Read a running daemon's statistics through its control socket.
    Stats(StatsArgs),
    /// Boot guest kernels on blklab disks, run scenarios in them and record
    /// guest, backend and host CPU (kernels interleaved A B A B ...).
    Run(Box<RunArgs>),
    /// Compare two sides of `blklab run` output: DIR (a run of one kernel),
    /// DIR:KERNEL, or one DIR holding exactly two kernels; with --pair,
    /// variants of one kernel, or their difference in differences on two.
    Compare(CompareArgs),
    /// Find the commit of a kernel tree that made a scenario's metric worse:
    /// drives `git bisect`, building, booting and measuring each commit it
    /// asks for (TCG instruction counts), and ends with the first bad
    /// commit and the differential profile against its parent.
    Bisect(Box<crate::bisect::options::BisectArgs>),
    /// Drive any vhost-user-blk socket with libblkio (IOPS, bandwidth,
    /// latency, backend CPU), or compare qemu-storage-daemon with blklab.
    Bench(BenchArgs),
    /// Guest images in the image cache: build, export to an archive,
    /// import (verified), list, and their offline keys.
    Images(crate::lab::images::command::ImagesArgs),
    /// Inside a nested host (`blklab run --accel nested`): run the outer
    /// lab's plan under KVM, relaying every SYNC on the console.
    #[command(hide = true)]
    NestedInner {
        /// The run disk's `inner.json`.
        file: PathBuf,
    },
}

/// `blklab bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// The vhost-user-blk socket to drive (any backend).
    #[arg(long, value_name = "PATH", required_unless_present_any = ["compare", "instructions"])]
    pub socket: Option<PathBuf>,
    /// Queues (one client thread each).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub queues: usize,
    /// Requests in flight per queue.
    #[arg(long, value_name = "D", default_value_t = 64)]
    pub depth: usize,
    /// Request size (4k, 64k, 1M).
    #[arg(long, value_name = "SIZE", default_value = "4k")]
    pub bs: String,
    #[arg(long, value_enum, default_value = "randread")]
    pub rw: crate::bench::RwMode,
    /// Measured time per load (after a 0.5 s warm-up).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_interval)]
    pub time: std::time::Duration,
    /// The backend's PID: report its CPU seconds and IOPS per backend
    /// CPU-second.
    #[arg(long, value_name = "PID")]
    pub backend_pid: Option<i32>,
    /// Use libblkio poll queues (the client busy-waits for completions).
    #[arg(long)]
    pub client_poll: bool,
    /// Start qemu-storage-daemon and blklab serve (null disks, --queues
    /// queues) and run identical loads against each in turn: the ratio table.
    #[arg(long, conflicts_with_all = ["socket", "backend_pid", "client_poll"])]
    pub compare: bool,
    /// With --compare: rounds (backend order alternates between rounds).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub rounds: usize,
    /// With --compare: the spin of the `blklab serve --poll` side ("off"
    /// leaves the poll rows out).
    #[arg(long, value_name = "SPIN", default_value = "50us")]
    pub poll: String,
    /// With --compare: the window bound of the `blklab serve
    /// --poll=adaptive:MAX` side ("off" leaves the adaptive rows out).
    #[arg(long, value_name = "MAX", default_value = "32us")]
    pub adaptive: String,
    /// With --compare: how long each daemon's CPU is measured with its
    /// disk idle, after the rounds ("off": not measured).
    #[arg(long, value_name = "DURATION|off", default_value = "2s")]
    pub idle_time: String,
    /// With --compare: disk size.
    #[arg(long, value_name = "SIZE", default_value = "1G")]
    pub size: String,
    /// With --compare or --instructions: the qemu-storage-daemon to
    /// measure. `auto`: Debian 12's 7.2 build, the reference, fetched once
    /// by images/fetch-qsd.sh into the image cache (nothing is installed).
    #[arg(long, value_name = "PATH|auto", default_value = "auto")]
    pub qsd: String,
    /// Count the backend's own instructions per request under valgrind's
    /// callgrind (runs of --requests and twice as many requests, the
    /// difference): blklab serve, with and without --no-stats, and
    /// qemu-storage-daemon, for 4 KiB random writes and reads at QD64 and
    /// QD1 on one queue and a null disk. With the top functions per load.
    #[arg(long, conflicts_with_all = ["socket", "backend_pid", "client_poll", "compare"])]
    pub instructions: bool,
    /// With --instructions: requests of the shorter run.
    #[arg(long, value_name = "N", default_value_t = 20_000,
          value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub requests: u64,
    /// With --instructions: count blklab only (no qemu-storage-daemon).
    #[arg(long)]
    pub blklab_only: bool,
    /// With --instructions: functions listed per load and backend.
    #[arg(long, value_name = "N", default_value_t = 12)]
    pub top: usize,
    /// With --instructions: count only these loads, RW:QD (randwrite:64,
    /// randread:1; repeatable). Default: 4 KiB random writes and reads at
    /// QD64 and QD1.
    #[arg(long = "load", value_name = "RW:QD")]
    pub loads: Vec<String>,
    /// With --instructions: keep every run's callgrind profile in DIR
    /// (`callgrind_annotate DIR/blklab-randwrite-qd64-40000.callgrind`).
    #[arg(long, value_name = "DIR")]
    pub keep_profiles: Option<PathBuf>,
    /// With --instructions: the valgrind binary.
    #[arg(long, value_name = "PATH", default_value = "valgrind")]
    pub valgrind: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

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
    pub pair: Vec<crate::report::compare::PairSpec>,
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

fn parse_pair(s: &str) -> Result<crate::report::compare::PairSpec, String> {
    crate::report::compare::PairSpec::parse(s).map_err(|e| e.to_string())
}

const fn blklab_profile_top() -> usize {
    crate::report::profile::DEFAULT_TOP
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CompareFormat {
    Table,
    Markdown,
    Csv,
    Json,
}

#[derive(Debug, clap::Args)]
pub struct StatsArgs {
    /// The daemon's --control socket.
    #[arg(long, value_name = "PATH")]
    pub control: PathBuf,
    /// Output: a per-queue table, or the JSON document.
    #[arg(long, value_enum, default_value = "table")]
    pub format: StatsFormat,
    /// Repeat every interval (e.g. 1s, 500ms), showing rates over it.
    #[arg(long, value_name = "INTERVAL", value_parser = parse_interval)]
    pub watch: Option<std::time::Duration>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StatsFormat {
    Table,
    Json,
    /// Prometheus text exposition.
    Prom,
}

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub disk: DiskArgs,
    /// Serve the disks of a TOML file instead (`[[disk]]` tables taking the
    /// same options, e.g. socket = "/tmp/a.sock", disk = "mem", size = "4G").
    #[arg(long, value_name = "FILE", conflicts_with_all = ["socket", "disk", "size"])]
    pub config: Option<PathBuf>,
    /// Serve statistics on this Unix socket (JSON lines: stats, snapshot
    /// LABEL, reset, config); read them with `blklab stats --control PATH`.
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
    /// Serve Prometheus metrics over HTTP at ADDR (GET /metrics), e.g.
    /// 9188 or 127.0.0.1:9188 (loopback unless an address says otherwise).
    #[arg(long, value_name = "ADDR", value_parser = crate::stats::http::parse_addr)]
    pub metrics: Option<std::net::SocketAddr>,
    /// Write the final statistics (JSON) to FILE at exit.
    #[arg(long, value_name = "FILE")]
    pub stats_out: Option<PathBuf>,
    /// Print the QEMU options that attach these disks, then exit.
    #[arg(long)]
    pub print_qemu_args: bool,
    /// Guest memory size used in --print-qemu-args output.
    #[arg(long, value_name = "SIZE", default_value = "1G")]
    pub guest_memory: String,
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    /// clap's own consistency checks over every subcommand (unique
    /// argument ids across flattened option sets, valid defaults), which
    /// it otherwise runs only when that subcommand is parsed.
    #[test]
    fn every_subcommand_is_consistent() {
        Cli::command().debug_assert();
    }
}
