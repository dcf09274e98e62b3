//! The command line, as clap structures (parsed in `main.rs`), and what
//! lies between them and the library: `serve`'s options ([`serve`]),
//! `compare`'s request and the reports it writes ([`compare`]), the error
//! line every command ends with ([`error_message`]).

pub mod compare;
pub mod serve;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::bench::options::BenchArgs;
use crate::lab::options::{parse_interval, RunArgs};
use compare::CompareArgs;
use serve::ServeArgs;

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

/// The error and its causes on one line, leaving out a cause whose text
/// the message before it already quotes (many errors embed their
/// source's message).
pub fn error_message(error: &(dyn std::error::Error + 'static)) -> String {
    let mut out = String::new();
    let mut cause = Some(error);
    while let Some(e) = cause {
        let text = e.to_string();
        if !out.contains(&text) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&text);
        }
        cause = e.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::{error_message, Cli};

    /// clap's own consistency checks over every subcommand (unique
    /// argument ids across flattened option sets, valid defaults), which
    /// it otherwise runs only when that subcommand is parsed.
    #[test]
    fn every_subcommand_is_consistent() {
        Cli::command().debug_assert();
    }

    /// A cause whose text its message already quotes is left out.
    #[test]
    fn the_error_line_names_each_cause_once() {
        let inner = std::io::Error::other("no such file");
        let quoting = anyhow::Error::new(std::io::Error::other(format!("open x: {inner}")));
        assert_eq!(
            error_message(quoting.context("--qsd").as_ref()),
            "--qsd: open x: no such file"
        );
        let chained = anyhow::Error::new(inner)
            .context("reading x")
            .context("blklab run");
        assert_eq!(
            error_message(chained.as_ref()),
            "blklab run: reading x: no such file"
        );
    }
}
