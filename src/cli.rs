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
