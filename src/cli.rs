//! The command line, as clap structures (parsed in `main.rs`).

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::disk::DiskArgs;

#[derive(Debug, Parser)]
#[command(
    name = "blklab",
    version,
    about = "An instrumented vhost-user-blk backend for measuring guest block-layer CPU cost"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
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
    /// DIR:KERNEL, or one DIR holding exactly two kernels.
    Compare(CompareArgs),
    /// Drive any vhost-user-blk socket with libblkio (IOPS, bandwidth,
    /// latency, backend CPU), or compare qemu-storage-daemon with blklab.
    Bench(BenchArgs),
}

/// `blklab bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// The vhost-user-blk socket to drive (any backend).
    #[arg(long, value_name = "PATH", required_unless_present = "compare")]
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
    /// With --compare: disk size.
    #[arg(long, value_name = "SIZE", default_value = "1G")]
    pub size: String,
    /// With --compare: the qemu-storage-daemon binary.
    #[arg(long, value_name = "PATH", default_value = "qemu-storage-daemon")]
    pub qsd: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, clap::Args)]
pub struct CompareArgs {
    /// A and B: run directories (DIR or DIR:KERNEL); one DIR with two kernels
    /// compares them in run order.
    #[arg(value_name = "SIDE", num_args = 1..=2, required = true)]
    pub sides: Vec<String>,
    /// Metrics to show (comma-separated, repeatable; `all` for every one):
    /// guest_busy_pct, guest_cpu_us_per_io, iops, host_vcpu_us_per_io,
    /// host_qemu_other_us_per_io, backend_us_per_io, kicks_per_io,
    /// requests_per_kick, notifications_per_io, ctxsw_per_io, irqs_per_io,
    /// lat_p50_us, lat_p99_us, instructions_per_io, kernel_instructions_per_io,
    /// user_instructions_per_io, idle_entries_per_io. The default adds the
    /// instruction metrics when the records have them (--count-insns).
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub metric: Vec<String>,
    /// What to print.
    #[arg(long, value_enum, default_value = "table")]
    pub format: CompareFormat,
    /// Also write every format, the HTML page and its SVG plots here.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Confidence level of the intervals.
    #[arg(long, value_name = "P", default_value_t = 0.95)]
    pub confidence: f64,
    /// Compare even when the backend configuration, the scenario
    /// definitions or the scenario sets differ (the differences are shown).
    #[arg(long)]
    pub force: bool,
    /// Functions per row in the differential instruction profile (records
    /// of `blklab run --count-insns`), ranked by |B - A| per IO.
    #[arg(long, value_name = "N", default_value_t = blklab_profile_top())]
    pub top: usize,
}

const fn blklab_profile_top() -> usize {
    crate::report::profile::DEFAULT_TOP
}

/// `blklab run --count-insns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CountInsns {
    /// Count whenever the run ends up under TCG.
    Auto,
    /// Always count (forces TCG).
    On,
    /// Never count.
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CompareFormat {
    Table,
    Markdown,
    Csv,
    Json,
}

/// `blklab run`: see docs/lab-protocol.md and the README.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Guest kernel, repeatable: debian-6.1, debian-6.12, build:6.12,
    /// build:6.12+PATCH (images/patches/PATCH.patch) or
    /// path:FILE[,modules=DIR][,name=LABEL].
    #[arg(long, value_name = "SPEC", default_values_t = ["build:6.12".to_string(), "build:6.12+noplug".to_string()])]
    pub kernel: Vec<String>,
    /// Scenario name (guest-scripts/scenarios/NAME.scn), repeatable.
    #[arg(long, value_name = "NAME", default_values_t = ["seed002-quick".to_string()])]
    pub scenario: Vec<String>,
    /// Boots per (kernel, scenario); kernels alternate within an iteration.
    /// A report calls nothing significant below 3.
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub iterations: u32,
    /// Override every variant's fio runtime, seconds.
    #[arg(long, value_name = "SECONDS")]
    pub runtime: Option<u64>,
    /// Override every variant's fio ramp time, seconds.
    #[arg(long, value_name = "SECONDS")]
    pub ramp: Option<u64>,
    /// Run only these variants (comma-separated).
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub variants: Option<Vec<String>>,
    /// Disks to serve (default: the scenario's `disks`).
    #[arg(long, value_name = "N")]
    pub disks: Option<u32>,
    /// Virtqueues per disk (default: the scenario's `queues`, else --vcpus).
    #[arg(long, value_name = "N")]
    pub num_queues: Option<u16>,
    /// Virtqueue size.
    #[arg(long, value_name = "N", default_value_t = 256)]
    pub queue_size: u16,
    /// Storage of every disk: null or mem.
    #[arg(long, value_name = "null|mem", default_value = "null", value_parser = ["null", "mem"])]
    pub disk: String,
    /// Capacity of every disk.
    #[arg(long, value_name = "SIZE", default_value = "4G")]
    pub size: String,
    /// Device command slots: none, per-queue or shared (see `serve --help`).
    #[arg(long, value_name = "none|per-queue|shared", default_value = "none")]
    pub tags: String,
    /// Slots per queue (per-queue) or in the pool (shared).
    #[arg(long, value_name = "N")]
    pub depth: Option<u32>,
    /// What a shared pool spans: disk, or host (all disks).
    #[arg(long, value_name = "disk|host", default_value = "disk")]
    pub tag_scope: String,
    /// blk-mq-style fair sharing of a shared pool.
    #[arg(long, value_name = "on|off", default_value = "off")]
    pub tag_fairness: String,
    /// Emulated completion latency (0, 50us, uniform:..., normal:..., lognormal:...).
    #[arg(long, value_name = "SPEC")]
    pub latency: Option<String>,
    #[arg(long, value_name = "SPEC")]
    pub read_latency: Option<String>,
    #[arg(long, value_name = "SPEC")]
    pub write_latency: Option<String>,
    #[arg(long, value_name = "SPEC")]
    pub flush_latency: Option<String>,
    /// Seed of the latency sequences.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub seed: u64,
    /// Spin this long before emulated completions (see `serve --help`).
    #[arg(long, value_name = "DURATION", default_value = "0")]
    pub latency_spin: String,
    /// Busy-poll queues with this idle spin (see `serve --help`).
    #[arg(long, value_name = "SPIN", num_args = 0..=1, default_missing_value = "50us", require_equals = true)]
    pub poll: Option<String>,
    /// Guest vCPUs.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub vcpus: u32,
    /// Guest memory (QEMU syntax: 1G, 2048M).
    #[arg(long, value_name = "SIZE", default_value = "1G")]
    pub memory: String,
    /// Accelerator: auto probes KVM by booting the guest under it.
    #[arg(long, value_enum, default_value = "auto")]
    pub accel: crate::lab::qemu::Accel,
    /// QEMU binary.
    #[arg(long, value_name = "PATH", default_value = "qemu-system-x86_64")]
    pub qemu: String,
    /// Count executed guest instructions with blklab's TCG plugin (built for
    /// the installed QEMU on first use): kernel and user per IO, idle
    /// entries, per-function and per-group profiles of each variant's
    /// window; boots with `nokaslr`. `auto` (the default) counts whenever
    /// the run is under TCG and every kernel has a System.map, and goes on
    /// without counts if the plugin cannot be built; `on` (or the bare
    /// flag) forces TCG and fails without the plugin; `off` never counts.
    #[arg(long, value_enum, value_name = "auto|on|off", default_value = "auto",
          num_args = 0..=1, default_missing_value = "on")]
    pub count_insns: CountInsns,
    /// Extra guest kernel command-line arguments, appended after blklab's
    /// own (e.g. "mitigations=off"). One string; quote it in the shell.
    #[arg(long, value_name = "ARGS")]
    pub append: Option<String>,
    /// Deterministic TCG: `-icount shift=0` with single-threaded TCG (one
    /// instruction = 1 ns of guest time). Needs TCG.
    #[arg(long)]
    pub deterministic: bool,
    /// Output directory (default blklab-results/YYYYmmdd-HHMMSS).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Image cache (default $XDG_CACHE_HOME/blklab/images).
    #[arg(long, value_name = "DIR")]
    pub cache: Option<PathBuf>,
    /// The blklab source tree holding images/ and guest-scripts/ (default:
    /// $BLKLAB_LAB_DIR, else the tree this binary was built from).
    #[arg(long, value_name = "DIR")]
    pub lab_dir: Option<PathBuf>,
    /// Longest wait for a guest to boot.
    #[arg(long, value_name = "DURATION", default_value = "180s", value_parser = parse_interval)]
    pub boot_timeout: std::time::Duration,
    /// Longest wait between two guest steps, beyond a variant's runtime.
    #[arg(long, value_name = "DURATION", default_value = "300s", value_parser = parse_interval)]
    pub step_timeout: std::time::Duration,
    /// Longest wait for the KVM probe guest.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_interval)]
    pub kvm_probe_timeout: std::time::Duration,
    /// No progress bar.
    #[arg(long)]
    pub no_progress: bool,
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

/// An interval such as `1s`, `500ms`, `2.5s`.
pub fn parse_interval(s: &str) -> Result<std::time::Duration, String> {
    match s.parse::<crate::latency::LatencySpec>() {
        Ok(crate::latency::LatencySpec::Fixed(d)) if d >= std::time::Duration::from_millis(10) => {
            Ok(d)
        }
        _ => Err(format!(
            "invalid interval {s:?}: expected a duration of at least 10ms, e.g. 1s or 500ms"
        )),
    }
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
    #[arg(long, value_name = "ADDR", value_parser = crate::metrics::parse_addr)]
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
