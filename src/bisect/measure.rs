//! Measure a built candidate: one lab run (the lab's own, from a request
//! made here) of the scenario's variant under deterministic TCG with
//! instruction counts, booting the kernel as a `path:` kernel with its
//! System.map, and the metric of each boot.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use thiserror::Error;

use crate::bisect::build::Built;
use crate::lab::guest::qemu::Accel;
use crate::lab::images::KernelSpec;
use crate::lab::location::{CacheOption, LabDirOption, LabLocation};
use crate::lab::options::{CountInsns, GuestOptions, RunOptions, Timeouts};
use crate::lab::run::{self, RunError, RunOutcome, RunRequest};
use crate::record::metrics::Metric;

/// Why a built commit could not be measured; one line.
#[derive(Debug, Error)]
pub enum MeasureError {
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
    pub(crate) run_dir: PathBuf,
    /// The kernel's label in that run.
    pub(crate) label: String,
    /// The metric of each boot.
    pub(crate) values: Vec<f64>,
    pub(crate) seconds: Duration,
}

/// What every measurement shares.
pub(crate) struct Setup<'a> {
    pub(crate) lab_dir: &'a Path,
    pub(crate) cache: Option<&'a Path>,
    pub(crate) scenario: &'a str,
    pub(crate) variant: &'a str,
    pub(crate) metric: &'static Metric,
    pub(crate) iterations: u32,
    pub(crate) vcpus: Option<u32>,
    pub(crate) qemu: &'a str,
    pub(crate) boot_timeout: Duration,
}

/// The lab run of `kernel`: the variant alone, counted, deterministic.
fn run_options(s: &Setup, kernel: KernelSpec, out: &Path) -> RunOptions {
    let mut o = RunOptions::new(vec![kernel], vec![s.scenario.to_string()]);
    o.variants = Some(vec![s.variant.to_string()]);
    o.iterations = s.iterations;
    o.machine.vcpus = s.vcpus;
    o.guest = GuestOptions {
        accel: Accel::Tcg,
        qemu: s.qemu.to_string(),
        count_insns: CountInsns::On,
        deterministic: true,
        ..GuestOptions::default()
    };
    o.timeouts = Timeouts {
        boot: s.boot_timeout,
        ..Timeouts::default()
    };
    o.place = LabLocation {
        cache: CacheOption {
            cache: s.cache.map(Path::to_path_buf),
        },
        lab_dir: LabDirOption {
            lab_dir: Some(s.lab_dir.to_path_buf()),
        },
    };
    o.out = Some(out.to_path_buf());
    o.progress = false;
    o
}

/// Boot `built` (labelled `label`) and read the metric.
pub(crate) fn measure(
    s: &Setup,
    built: &Built,
    label: &str,
    out: &Path,
) -> Result<Measured, MeasureError> {
    let start = Instant::now();
    let kernel = KernelSpec::Path {
        kernel: built.vmlinuz.clone(),
        modules: built.modules.clone(),
        map: Some(built.system_map.clone()),
        name: Some(label.to_string()),
    };
    let request = RunRequest::new(run_options(s, kernel, out)).map_err(MeasureError::Run)?;
    let (run_dir, records, failures) = match run::run(&request).map_err(MeasureError::Run)? {
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
        let kernel: KernelSpec = "path:/k/vmlinuz,name=abc".parse().unwrap();
        let a = run_options(&s, kernel.clone(), Path::new("/out"));
        assert_eq!(a.kernels, vec![kernel]);
        assert_eq!(a.scenarios, vec!["plug-qd1".to_string()]);
        assert_eq!(a.variants, Some(vec!["mq-deadline-10k".to_string()]));
        assert_eq!(a.iterations, 2);
        assert!(a.guest.deterministic);
        assert_eq!(a.guest.count_insns, CountInsns::On);
        assert_eq!(a.guest.accel, Accel::Tcg);
        assert_eq!(a.place.cache.get(), Some(Path::new("/cache")));
        assert_eq!(a.place.lab_dir.get(), Some(Path::new("/lab")));
        assert_eq!(a.out.as_deref(), Some(Path::new("/out")));
        assert_eq!(a.timeouts.boot, Duration::from_secs(180));
        assert!(!a.progress && !a.plan_only && a.shard.is_none());
    }
}
