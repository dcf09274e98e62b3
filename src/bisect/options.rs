//! `blklab bisect`'s options: what a bisection is asked to do. The command
//! line (`crate::cli`) embeds them; [`crate::bisect::run`] reads them.

use std::path::PathBuf;

use thiserror::Error;

use crate::lab::location::LabLocation;
use crate::lab::options::parse_interval;

/// `--threshold X`: a value of the metric, or `N%` of the good end's mean
/// (`+20%`: 20 % above it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Threshold {
    Absolute(f64),
    /// Percent relative to the good end (measured first).
    Relative(f64),
}

/// A `--threshold` that is neither a finite value nor a non-zero `N%`.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error(
    "invalid --threshold {given:?}: expected a value of the metric (12000) or a change from the good end (+20%)"
)]
pub(crate) struct BadThreshold {
    pub(crate) given: String,
}

impl std::str::FromStr for Threshold {
    type Err = BadThreshold;
    fn from_str(s: &str) -> Result<Threshold, BadThreshold> {
        let bad = || BadThreshold {
            given: s.to_string(),
        };
        let t = s.trim();
        if let Some(p) = t.strip_suffix('%') {
            let v: f64 = p.trim().parse().map_err(|_| bad())?;
            if !v.is_finite() || v == 0.0 {
                return Err(bad());
            }
            return Ok(Threshold::Relative(v));
        }
        let v: f64 = t.parse().map_err(|_| bad())?;
        if !v.is_finite() {
            return Err(bad());
        }
        Ok(Threshold::Absolute(v))
    }
}

/// `blklab bisect`: see docs/user-guide.md, "Which commit? blklab bisect".
#[derive(Debug, Clone, clap::Args)]
pub struct BisectArgs {
    /// The kernel git tree to bisect (a checkout: it is built in place,
    /// incrementally; give a `git worktree add` of your tree to leave your
    /// own checkout alone).
    #[arg(long = "git", value_name = "TREE")]
    pub(crate) tree: PathBuf,
    /// A commit without the regression (any revision git takes).
    #[arg(long, value_name = "REV")]
    pub(crate) good: String,
    /// A commit with it; GOOD must be its ancestor.
    #[arg(long, value_name = "REV")]
    pub(crate) bad: String,
    /// The scenario (guest-scripts/scenarios/NAME.scn).
    #[arg(long, value_name = "NAME")]
    pub(crate) scenario: String,
    /// The scenario's variant whose metric decides (required when the
    /// scenario has several).
    #[arg(long, value_name = "NAME")]
    pub(crate) variant: Option<String>,
    /// The metric that decides (a `blklab compare` metric key).
    #[arg(long, value_name = "KEY", default_value = "kernel_instructions_per_io")]
    pub(crate) metric: String,
    /// Bad beyond this value of the metric (12000), or this change from the
    /// good end's mean (+20%, which measures the good end first); "beyond"
    /// is the metric's worse direction.
    #[arg(long, value_name = "X", conflicts_with = "toward")]
    pub(crate) threshold: Option<Threshold>,
    /// Measure both ends and call each commit by the end it is closer to
    /// (the default when no --threshold is given).
    #[arg(long, value_name = "bad", value_parser = ["bad"])]
    pub(crate) toward: Option<String>,
    /// Boots per tested commit: the metric's spread over them decides
    /// whether a commit can be called (else it is skipped).
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub(crate) iterations: u32,
    /// Output directory (default blklab-bisect/YYYYmmdd-HHMMSS).
    #[arg(long, value_name = "DIR")]
    pub(crate) out: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) place: LabLocation,
    /// Parallel compile jobs (make -j; default: the CPUs).
    #[arg(long, value_name = "N")]
    pub(crate) jobs: Option<u32>,
    /// Guest vCPUs (default: the scenario's).
    #[arg(long, value_name = "N")]
    pub(crate) vcpus: Option<u32>,
    /// Functions in the differential profile of the last good and the first
    /// bad commit.
    #[arg(long, value_name = "N", default_value_t = 15)]
    pub(crate) top: usize,
    /// QEMU binary.
    #[arg(long, value_name = "PATH", default_value = "qemu-system-x86_64")]
    pub(crate) qemu: String,
    /// Longest wait for a guest to boot.
    #[arg(long, value_name = "DURATION", default_value = "180s", value_parser = parse_interval)]
    pub(crate) boot_timeout: std::time::Duration,
    /// No progress bar (plain log lines; also when stderr is not a terminal).
    #[arg(long)]
    pub(crate) no_progress: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_parse() {
        assert_eq!("12000".parse(), Ok(Threshold::Absolute(12000.0)));
        assert_eq!("+20%".parse(), Ok(Threshold::Relative(20.0)));
        assert_eq!("-5 %".parse(), Ok(Threshold::Relative(-5.0)));
        for bad in ["0%", "lots", "nan"] {
            assert_eq!(
                bad.parse::<Threshold>(),
                Err(BadThreshold { given: bad.into() })
            );
        }
    }
}
