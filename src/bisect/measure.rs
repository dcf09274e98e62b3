//! Measure a built candidate: one `blklab run` (the lab runner itself) of
//! the scenario's variant under TCG with `--count-insns on
//! --deterministic`, booting the kernel as a `path:` kernel with its
//! System.map, and the metric of each boot.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Parser;
use thiserror::Error;

use crate::bisect::build::Built;
use crate::lab::options::RunArgs;
use crate::lab::run::{self, RunError, RunOutcome};
use crate::record::metrics::Metric;

/// Why a built commit could not be measured; one line.
#[derive(Debug, Error)]
pub enum MeasureError {
    /// The `blklab run` arguments made for it do not parse.
    #[error("{0}")]
    RunArgs(#[source] clap::Error),
    /// The lab run failed.
    #[error("{0}")]
    Run(#[source] RunError),
    #[error("the lab planned instead of running")]
    Planned,
    #[error("the guest run failed: {}", failures.join("; "))]
    GuestFailed { failures: Vec<String> },
    #[error("boot {iteration} of {label} has no {metric} (no instruction counts?)")]
    NoValue {
        iteration: u32,
        label: String,
        metric: &'static str,
    },
    #[error("the run recorded no {metric} of variant {variant}")]
    NoValues {
        metric: &'static str,
        variant: String,
    },
}

/// What one commit measured.
#[derive(Debug, Clone)]
pub(crate) struct Measured {
    /// The run directory (records, consoles), for `blklab compare`.
    pub run_dir: PathBuf,
    /// The kernel's label in that run.
    pub label: String,
    /// The metric of each boot.
    pub values: Vec<f64>,
    pub seconds: Duration,
}

#[derive(Parser)]
struct RunLine {
    #[command(flatten)]
    run: RunArgs,
}

/// What every measurement shares.
pub(crate) struct Setup<'a> {
    pub lab_dir: &'a Path,
    pub cache: Option<&'a Path>,
    pub scenario: &'a str,
    pub variant: &'a str,
    pub metric: &'static Metric,
    pub iterations: u32,
    pub vcpus: Option<u32>,
    pub qemu: &'a str,
    pub boot_timeout: Duration,
}

/// The `blklab run` arguments for `kernel` (a `path:` spec).
fn run_args(s: &Setup, kernel: &str, out: &Path) -> Result<RunArgs, MeasureError> {
    let mut argv: Vec<String> = vec![
        "run".into(),
        "--kernel".into(),
        kernel.into(),
        "--scenario".into(),
        s.scenario.into(),
        "--variants".into(),
        s.variant.into(),
        "--iterations".into(),
        s.iterations.to_string(),
        "--count-insns".into(),
        "on".into(),
        "--deterministic".into(),
        "--accel".into(),
        "tcg".into(),
        "--no-progress".into(),
        "--qemu".into(),
        s.qemu.into(),
        "--boot-timeout".into(),
        format!("{}ms", s.boot_timeout.as_millis()),
        "--lab-dir".into(),
        s.lab_dir.display().to_string(),
        "--out".into(),
        out.display().to_string(),
    ];
    if let Some(c) = s.cache {
        argv.push("--cache".into());
        argv.push(c.display().to_string());
    }
    if let Some(v) = s.vcpus {
        argv.push("--vcpus".into());
        argv.push(v.to_string());
    }
    RunLine::try_parse_from(argv)
        .map(|l| l.run)
        .map_err(MeasureError::RunArgs)
}

/// Boot `built` (labelled `label`) and read the metric.
pub(crate) fn measure(
    s: &Setup,
    built: &Built,
    label: &str,
    out: &Path,
) -> Result<Measured, MeasureError> {
    let start = Instant::now();
    let mut spec = format!(
        "path:{},map={}",
        built.vmlinuz.display(),
        built.system_map.display()
    );
    if let Some(m) = &built.modules {
        spec.push_str(&format!(",modules={}", m.display()));
    }
    spec.push_str(&format!(",name={label}"));
    let args = run_args(s, &spec, out)?;
    let (run_dir, records, failures) = match run::run(&args).map_err(MeasureError::Run)? {
        RunOutcome::Ran {
            out_dir,
            records,
            failures,
        } => (out_dir, records, failures),
        RunOutcome::Plan(_) => return Err(MeasureError::Planned),
    };
    if !failures.is_empty() {
        return Err(MeasureError::GuestFailed { failures });
    }
    let mut values = Vec::new();
    for r in records.iter().filter(|r| r.variant == s.variant) {
        match (s.metric.get)(r) {
            Some(v) if v.is_finite() => values.push(v),
            _ => {
                return Err(MeasureError::NoValue {
                    iteration: r.iteration,
                    label: label.to_string(),
                    metric: s.metric.key,
                })
            }
        }
    }
    if values.is_empty() {
        return Err(MeasureError::NoValues {
            metric: s.metric.key,
            variant: s.variant.to_string(),
        });
    }
    Ok(Measured {
        run_dir,
        label: label.to_string(),
        values,
        seconds: start.elapsed(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_run_is_a_deterministic_counting_tcg_run_of_one_variant() {
        let metric = crate::record::metrics::find("kernel_instructions_per_io").unwrap();
        let s = Setup {
            lab_dir: Path::new("/lab"),
            cache: Some(Path::new("/cache")),
            scenario: "plug-qd1",
            variant: "mq-deadline-10k",
            metric,
            iterations: 2,
            vcpus: None,
            qemu: "qemu-system-x86_64",
            boot_timeout: Duration::from_secs(180),
        };
        let a = run_args(&s, "path:/k/vmlinuz,name=abc", Path::new("/out")).unwrap();
        assert_eq!(a.kernel, vec!["path:/k/vmlinuz,name=abc".to_string()]);
        assert_eq!(a.scenario, vec!["plug-qd1".to_string()]);
        assert_eq!(a.variants, Some(vec!["mq-deadline-10k".to_string()]));
        assert_eq!(a.iterations, 2);
        assert!(a.deterministic);
        assert_eq!(a.count_insns, crate::lab::options::CountInsns::On);
        assert_eq!(a.accel, crate::lab::guest::qemu::Accel::Tcg);
        assert_eq!(a.place.cache.get(), Some(Path::new("/cache")));
        assert_eq!(a.boot_timeout, Duration::from_secs(180));
    }
}
