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
    Serve(ServeArgs),
}

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub disk: DiskArgs,
    /// Serve the disks of a TOML file instead (`[[disk]]` tables taking the
    /// same options, e.g. socket = "/tmp/a.sock", disk = "mem", size = "4G").
    #[arg(long, value_name = "FILE", conflicts_with_all = ["socket", "disk", "size"])]
    pub config: Option<PathBuf>,
    /// Print the QEMU options that attach these disks, then exit.
    #[arg(long)]
    pub print_qemu_args: bool,
    /// Guest memory size used in --print-qemu-args output.
    #[arg(long, value_name = "SIZE", default_value = "1G")]
    pub guest_memory: String,
}
