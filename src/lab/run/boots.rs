//! Every planned boot: in order, each with its retry policy (a boot that
//! failed in a way worth it is booted once more, any other failure fails
//! the run with the boot's console named), or, with `--accel nested`, all
//! of them inside the emulated host, booted once.

use log::warn;

use crate::lab::images::nested_host::NestedHostImage;
use crate::lab::nested::relay::SyncRelay;
use crate::lab::run::boot::{BootCtx, BootFailure, Retry};
use crate::lab::run::error::RunError;
use crate::lab::run::nested_host::{self, HostMachine, HostRun};
use crate::lab::run::plan::Plan;
use crate::lab::run::prepare::Lab;
use crate::lab::run::progress::Progress;
use crate::lab::run::request::RunRequest;
use crate::lab::run::session::run_boot;
use crate::record::result::ResultRecord;
use crate::record::run::RunStamp;
use crate::record::summary::{RetriedBoot, RetriedHost};

/// What the boots produced.
pub(crate) struct Boots {
    pub(crate) records: Vec<ResultRecord>,
    pub(crate) failures: Vec<String>,
    pub(crate) retried: Vec<RetriedBoot>,
    /// With `--accel nested`, the hosts that went silent and were replaced.
    pub(crate) retried_hosts: Vec<RetriedHost>,
}

/// Boot every planned boot in order, each with its retry policy (inside a
/// nested host, every SYNC relayed to the outer lab).
pub(crate) fn boot_all(
    request: &RunRequest,
    plan: &Plan,
    lab: &Lab,
    stamp: &RunStamp,
    relay: Option<&dyn SyncRelay>,
) -> Result<Boots, RunError> {
    let total: u64 = plan
        .boots
        .iter()
        .map(|b| request.units[b.unit].settings.variants.len() as u64)
        .sum();
    let pb = Progress::new(total, plan.boots.len(), request.options.progress);
    let mut out = Boots {
        records: Vec::new(),
        failures: Vec::new(),
        retried: Vec::new(),
        retried_hosts: Vec::new(),
    };
    for (seq, boot) in plan.boots.iter().enumerate() {
        if relay.is_some_and(|r| r.skips(seq)) {
            continue;
        }
        let unit = &request.units[boot.unit];
        let vcpus = unit.settings.machine.vcpus;
        let ctx = BootCtx {
            options: &request.options,
            timeouts: request
                .options
                .timeouts
                .for_boot(vcpus, request.usable_cores()),
            seq,
            boot,
            label: &plan.labels[boot.kernel],
            guest: &lab.guests[boot.kernel],
            scenario: &request.scenarios[unit.scenario],
            unit,
            accel: lab.accel,
            qemu: &lab.qemu,
            out_dir: &lab.out_dir,
            pb: &pb,
            plugin: lab.plugin.as_deref(),
            symbols: lab.maps[boot.kernel].clone(),
            stamp,
            relay,
        };
        pb.boot(
            seq,
            &format!("{} {} #{}", ctx.label, ctx.scenario.name, boot.iteration),
        );
        let (mut records, mut failures) = boot_with_retry(&ctx, &mut out.retried)?;
        out.records.append(&mut records);
        out.failures.append(&mut failures);
        if let Some(r) = relay {
            r.boot_finished(seq, &out.failures, &out.retried);
        }
    }
    pb.finish();
    Ok(out)
}

/// `--accel nested`: boot the emulated host once; inside it the lab runs
/// every planned boot under KVM ([`run_inside`](crate::lab::run::nested_inner::run_inside)); its records come back
/// with the instructions the host and the guests executed in each window.
pub(crate) fn boot_nested_host(
    request: &RunRequest,
    plan: &Plan,
    lab: &Lab,
    host: &NestedHostImage,
    stamp: &RunStamp,
) -> Result<Boots, RunError> {
    let variants: u64 = plan
        .boots
        .iter()
        .map(|b| request.units[b.unit].settings.variants.len() as u64)
        .sum();
    let longest_variant = request
        .scenarios
        .iter()
        .flat_map(|s| &s.variants)
        .map(|v| v.runtime + v.ramp)
        .max()
        .unwrap_or(0);
    let pb = Progress::new(variants, plan.boots.len(), request.options.progress);
    let machine = HostMachine::new(
        &request.units,
        lab.plugin.is_some(),
        &request.options.nested,
    );
    let timeouts = request
        .options
        .timeouts
        .for_boot(machine.vcpus, request.usable_cores());
    let run = HostRun {
        options: &request.options,
        lab_dir: &request.lab_dir,
        guests: &lab.guests,
        labels: &plan.labels,
        boots: plan.boots.len(),
        out_dir: &lab.out_dir,
        qemu: &lab.qemu,
        image: host,
        plugin: lab.plugin.as_deref(),
        maps: &lab.maps,
        machine,
        timeouts,
        longest_variant: std::time::Duration::from_secs(longest_variant),
        silence: request.options.nested.silence,
        pb: &pb,
        stamp,
    };
    let out = nested_host::boot(&run)?;
    pb.finish();
    Ok(Boots {
        records: out.records,
        failures: out.failures,
        retried: out.retried,
        retried_hosts: out.retried_hosts,
    })
}

/// One boot, and a second when the first failed in a way worth it
/// ([`BootFailure::retry`]): the first attempt's console log is kept as
/// `*.attempt1.log` and the retry listed in summary.json. Any other
/// failure, a guest kernel fault above all, fails the run with the
/// boot's console named.
fn boot_with_retry(
    c: &BootCtx,
    retried: &mut Vec<RetriedBoot>,
) -> Result<(Vec<ResultRecord>, Vec<String>), RunError> {
    let first = match run_boot(c) {
        Ok(done) => return Ok(done),
        Err(f) => f,
    };
    if first.retry() == Retry::Never {
        return Err(boot_failed(c, first, None));
    }
    let kept = c.console_log().with_extension("attempt1.log");
    let _ = std::fs::rename(c.console_log(), &kept);
    let why = first.to_string();
    warn!(
        "{} {} #{}: the boot did not get going ({}); booting once more (console: {})",
        c.label,
        c.scenario.name,
        c.boot.iteration,
        why.lines().next().unwrap_or(""),
        kept.display()
    );
    retried.push(RetriedBoot {
        kernel: c.label.to_string(),
        scenario: c.scenario.name.clone(),
        iteration: c.boot.iteration,
        error: why,
        console: kept,
    });
    c.pb.retry();
    run_boot(c).map_err(|f| boot_failed(c, f, Some(first)))
}

/// The run's error for a boot that failed with `failure` (after `first`,
/// on a second attempt).
fn boot_failed(c: &BootCtx, failure: BootFailure, first: Option<BootFailure>) -> RunError {
    match failure {
        BootFailure::KernelFault { report } => RunError::KernelFault {
            kernel: c.label.to_string(),
            scenario: c.scenario.name.clone(),
            iteration: c.boot.iteration,
            console: c.console_log(),
            trace: report,
        },
        failure => RunError::Boot {
            kernel: c.label.to_string(),
            scenario: c.scenario.name.clone(),
            iteration: c.boot.iteration,
            console: c.console_log(),
            failure: Box::new(failure),
            first: first.map(Box::new),
        },
    }
}
