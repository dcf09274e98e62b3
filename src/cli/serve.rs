//! `blklab serve`'s options, and the daemon's options they make: the
//! disks (from `--config` or the disk options) and where it reports.

use std::path::PathBuf;

use crate::backend::serve::ServeOptions;
use crate::device::config::{ConfigError, DiskArgs, DiskConfig};
use crate::device::config_file::{check_unique_sockets, load_config_file};

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
    /// On SIGTERM or SIGINT: wait at most this long (e.g. 10s, 500ms, 0)
    /// for requests in service to reach their emulated completion time,
    /// then complete them at once; a second signal ends the wait. Either
    /// way every request in service is on the used ring before the
    /// connections close, so a guest reconnecting to the next daemon loses
    /// and repeats nothing.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_drain_timeout)]
    pub drain_timeout: std::time::Duration,
    /// Print the QEMU options that attach these disks, then exit.
    #[arg(long)]
    pub print_qemu_args: bool,
    /// Guest memory size used in --print-qemu-args output.
    #[arg(long, value_name = "SIZE", default_value = "1G")]
    pub guest_memory: String,
}

impl ServeArgs {
    /// The disks to serve: the `--config` file's, else the one or more
    /// the disk options describe.
    pub fn disks(&self) -> Result<Vec<DiskConfig>, ConfigError> {
        match &self.config {
            Some(path) => load_config_file(path),
            None => {
                let disks = self.disk.to_configs()?;
                check_unique_sockets(&disks)?;
                Ok(disks)
            }
        }
    }

    /// The daemon's options, serving `disks`.
    pub fn options(self, disks: Vec<DiskConfig>) -> ServeOptions {
        ServeOptions {
            disks,
            control: self.control,
            metrics: self.metrics,
            stats_out: self.stats_out,
            drain_timeout: self.drain_timeout,
        }
    }
}

/// `--drain-timeout`: a fixed duration, 0 included.
fn parse_drain_timeout(s: &str) -> Result<std::time::Duration, String> {
    use crate::device::latency::LatencySpec;
    match s.parse::<LatencySpec>() {
        Ok(LatencySpec::Fixed(d)) => Ok(d),
        Ok(LatencySpec::Zero) => Ok(std::time::Duration::ZERO),
        _ => Err(format!(
            "invalid duration {s:?}: expected a fixed duration, e.g. 10s, 500ms or 0"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn drain_timeouts() {
        assert_eq!(parse_drain_timeout("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_drain_timeout("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_drain_timeout("0"), Ok(Duration::ZERO));
        for bad in ["", "soon", "uniform:1ms..2ms", "-1s"] {
            assert!(parse_drain_timeout(bad).is_err(), "{bad}");
        }
    }
}
