//! `blklab run`: serve the disks in-process, boot QEMU per (kernel,
//! scenario, iteration) with the kernels interleaved, answer the guest's
//! SYNC lines with backend and host snapshots, and write one
//! self-describing JSON per (kernel, scenario, variant, iteration).
//!
//! [`run`] is the table of contents, one phase a module:
//!
//! - [`request`]: the request (kernels, scenarios, boot units) resolved
//!   and checked from the options, before anything is built, and the
//!   warning when the host cannot run a guest's vCPUs at once;
//! - [`plan`]: the boots, interleaved, and `--shard`'s slice (`--plan`
//!   prints them);
//! - [`prepare`]: the lab (QEMU, the output directory, images,
//!   accelerator, plugin, System.maps);
//! - [`run_document`]: the run document, run.json;
//! - [`boots`]: every planned boot with its retry policy; one boot and its
//!   failures are [`boot`] (its disks and QEMU's options from [`settings`]),
//!   its console session and records [`session`]; [`progress`] the bar;
//! - [`nested_host`]: with `--accel nested`, the emulated host booted
//!   instead, which runs the boots inside it ([`nested_inner`], `blklab
//!   nested-inner`, is that run) and brings their records back; a host
//!   that falls silent is caught from outside, its state kept, and a
//!   fresh one booted for the rest (`host_silence`);
//! - [`summary`]: summary.json and the table printed at the end;
//! - `error`: why a run failed ([`RunError`]).

pub(crate) mod boot;
pub(crate) mod boots;
mod error;
mod host_silence;
pub(crate) mod nested_host;
pub mod nested_inner;
pub(crate) mod plan;
mod planted;
pub(crate) mod prepare;
pub(crate) mod progress;
pub(crate) mod request;
pub(crate) mod run_document;
pub(crate) mod session;
pub(crate) mod settings;
pub mod summary;
mod vcpu_flags;

use std::path::PathBuf;

use log::warn;

pub(crate) use error::RunError;
pub use request::RunRequest;

use crate::lab::run::boots::Boots;
use crate::lab::run::plan::{Plan, PlanDocument};
use crate::lab::run::prepare::Lab;
use crate::record::result::ResultRecord;

/// Everything `blklab run` produced.
pub enum RunOutcome {
    /// `--plan`: what would run; nothing was built or booted.
    Plan(PlanDocument),
    /// The run's records, in `out_dir`.
    Ran {
        out_dir: PathBuf,
        records: Vec<ResultRecord>,
        failures: Vec<String>,
    },
}

/// Run the lab as `request` says.
pub fn run(request: &RunRequest) -> Result<RunOutcome, RunError> {
    // First, before any thread starts: SIGINT/SIGTERM stop QEMU and
    // remove the boots' directories.
    crate::lab::guest::cleanup::install();
    // Before anything is built: vCPUs that cannot run at once hide the
    // contention the lab is there to show.
    for w in request::unsaid(request.parallelism_warnings(&request.host_parallelism())) {
        warn!("{w}");
    }
    let plan = Plan::new(request);
    if request.options.plan_only {
        return Ok(RunOutcome::Plan(plan.document(request)));
    }
    plan.check_not_empty()?;
    for line in request.host_vcpus_lines() {
        log::info!("{line}");
    }
    let lab = prepare::prepare_lab(request, &plan, None)?;
    let stamp = run_document::write(request, &plan, &lab)?;
    let boots = match &lab.nested_host {
        Some(host) => boots::boot_nested_host(request, &plan, &lab, host, &stamp)?,
        None => boots::boot_all(request, &plan, &lab, &stamp, None)?,
    };
    finish(lab, boots)
}

/// Write the summary; the run's outcome.
pub(crate) fn finish(lab: Lab, boots: Boots) -> Result<RunOutcome, RunError> {
    summary::write(
        &lab.out_dir,
        &boots.records,
        &boots.failures,
        boots.retried,
        boots.retried_hosts,
    )?;
    Ok(RunOutcome::Ran {
        out_dir: lab.out_dir,
        records: boots.records,
        failures: boots.failures,
    })
}
