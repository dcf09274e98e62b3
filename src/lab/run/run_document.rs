//! run.json: what the run is, written before its first boot.

use crate::lab::guest::qemu;
use crate::lab::run::boot::Boot;
use crate::lab::run::error::RunError;
use crate::lab::run::nested_host::{self, HostMachine};
use crate::lab::run::plan::{self as run_plan, boot_order, Plan};
use crate::lab::run::prepare::Lab;
use crate::lab::run::request::RunRequest;
use crate::lab::run::session::INSNS_WINDOW;
use crate::record::run::{
    new_run_id, BootOrder, HostInfo, InsnsSetup, KernelEntry, QemuInfo, RunDocument, RunStamp,
    RUN_SCHEMA,
};
use crate::util::{host, wallclock};

/// run.json: what the run is (its id, versions, host, QEMU, kernels,
/// scenarios, the order of its boots), written before the first boot.
/// Returns what each of its records carries of it.
pub(crate) fn write(request: &RunRequest, plan: &Plan, lab: &Lab) -> Result<RunStamp, RunError> {
    let order_of = |boots: &[Boot]| -> Vec<BootOrder> {
        boots
            .iter()
            .map(|b| boot_order(b, &request.units, &request.scenarios, &plan.labels))
            .collect()
    };
    let started_unix = wallclock::unix_now();
    let run_doc = RunDocument {
        schema: RUN_SCHEMA.to_string(),
        run_id: Some(new_run_id(started_unix)),
        started_unix,
        blklab_version: env!("CARGO_PKG_VERSION").to_string(),
        git_commit: crate::stats::queue::GIT_COMMIT.to_string(),
        command_line: std::env::args().collect(),
        accel: lab.accel,
        accel_reason: lab.accel_reason.clone(),
        deterministic: request.options.guest.deterministic,
        count_insns: lab.plugin.as_ref().map(|p| InsnsSetup {
            plugin: p.clone(),
            window: INSNS_WINDOW.to_string(),
        }),
        host: host_info(),
        parallelism: Some(request.host_parallelism()),
        qemu: QemuInfo {
            path: lab.qemu.clone(),
            version: qemu::version(&lab.qemu),
        },
        kernels: lab
            .guests
            .iter()
            .zip(&plan.labels)
            .map(|(g, n)| KernelEntry {
                label: n.clone(),
                spec: g.spec.clone(),
                kernel: g.kernel.clone(),
                initramfs: g.initramfs.clone(),
                manifests: g.manifests(),
            })
            .collect(),
        scenarios: request.scenarios.clone(),
        iterations: request.options.iterations,
        order: order_of(&plan.boots),
        shard: request
            .options
            .shard
            .map(|sh| run_plan::shard_info(sh, &order_of(&plan.all))),
        nested_host: lab.nested_host.as_ref().map(|h| {
            let nested = &request.options.nested;
            let machine = HostMachine::new(&request.units, lab.plugin.is_some(), nested);
            nested_host::info(h, machine, nested)
        }),
    };
    crate::record::write(&lab.out_dir.join("run.json"), &run_doc)?;
    Ok(run_doc.stamp())
}

/// What the host is: name, CPUs, kernel, CPU model (for the report's
/// "what differs besides the kernel").
fn host_info() -> HostInfo {
    HostInfo {
        hostname: host::hostname(),
        kernel: host::kernel_release(),
        cpus: host::cpus(),
        cpu_model: host::cpu_model(),
    }
}
