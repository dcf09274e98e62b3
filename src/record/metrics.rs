//! The metrics a report compares, each derived from one `blklab run` record
//! (`blklab-run-result/1`), and the linux-block-style row labels (I/O type,
//! queue depth, jobs, read mix) from the variant's fio arguments.

use crate::record::result::ResultRecord;

/// Which direction is better, for the reader (a delta is never hidden).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Better {
    Lower,
    Higher,
}

/// One comparable metric.
pub(crate) struct Metric {
    pub(crate) key: &'static str,
    pub(crate) title: &'static str,
    pub(crate) unit: &'static str,
    pub(crate) better: Better,
    pub(crate) get: fn(&ResultRecord) -> Option<f64>,
}

/// The sum of one backend counter over the window (all disks and queues).
fn backend_counter(
    r: &ResultRecord,
    counter: fn(&crate::stats::queue::QueueCounters) -> u64,
) -> Option<f64> {
    Some(r.backend.as_ref()?.sum(counter) as f64)
}

/// Requests the backend completed in the window (all ops).
fn backend_requests(r: &ResultRecord) -> Option<f64> {
    backend_counter(r, |c| c.requests)
}

/// IOs in the window (what every per-IO metric divides by): the block
/// layer's count of the target devices (it covers the same window as the
/// CPU counters, ramp included), else fio's.
pub(crate) fn ios(r: &ResultRecord) -> Option<f64> {
    r.checks
        .guest_block_ios
        .or(r.checks.fio_ios)
        .map(|n| n as f64)
        .filter(|n| *n > 0.0)
}

fn per_io(v: Option<f64>, r: &ResultRecord) -> Option<f64> {
    Some(v? / ios(r)?)
}

/// fio's IOPS, all directions.
pub(crate) fn iops(r: &ResultRecord) -> Option<f64> {
    Some(r.guest.fio.as_ref()?.iops())
}

/// Guest CPU busy percent (all CPUs).
pub(crate) fn guest_busy(r: &ResultRecord) -> Option<f64> {
    Some(r.guest.cpu.as_ref()?.all.busy)
}

/// Guest system CPU percent (all CPUs, mpstat's %sys).
pub(crate) fn guest_sys(r: &ResultRecord) -> Option<f64> {
    Some(r.guest.cpu.as_ref()?.all.sys)
}

/// Guest CPU seconds (all CPUs, busy = not idle) in the window.
fn guest_cpu_seconds(r: &ResultRecord) -> Option<f64> {
    let cpu = r.guest.cpu.as_ref()?;
    cpu.seconds(cpu.all.busy)
}

/// fio completion-latency percentile (µs) of the direction with most IOs.
fn fio_clat_us(r: &ResultRecord, pct: &str) -> Option<f64> {
    let job = r.guest.fio.as_ref()?.jobs.first()?;
    job.busiest()?.clat_percentile_ns(pct).map(|ns| ns / 1000.0)
}

/// CPU seconds of a host process's thread groups whose name starts with
/// `prefix` (`process`: `qemu` or `blklab`).
fn host_group_seconds(r: &ResultRecord, process: &str, prefix: &str) -> Option<f64> {
    r.host.as_ref()?.group_sum(process, prefix, |g| g.total_s)
}

/// A field of the instruction profile.
fn insns(
    r: &ResultRecord,
    f: fn(&crate::record::instructions::Instructions) -> Option<f64>,
) -> Option<f64> {
    f(r.instructions.as_ref()?)
}

/// A field of a nested run's host profile.
fn host_insns(
    r: &ResultRecord,
    f: fn(&crate::record::instructions::HostInstructions) -> Option<f64>,
) -> Option<f64> {
    f(r.host_instructions.as_ref()?)
}

// --- the block layer's mechanism ----------------------------------------
// Counts per IO of what the two regressions are made of: hardware queue
// runs, kblockd work, plug flushes, tag waits. From blk-mq's debugfs (the
// kernels that still have the counter: `run` 5.10/6.1, `queued` and
// `dispatched` 5.10) and, under TCG, from the entries of the functions of
// `record::instructions::ENTRY_FUNCTIONS`. Not in the defaults: ask with
// `--metric KEY` or `--metric all`.

/// A blk-mq debugfs counter summed over the target devices' hardware
/// queues, per IO (None when this kernel has no such counter).
fn blk_mq_per_io(
    r: &ResultRecord,
    f: fn(&crate::record::guest::BlkMqCounters) -> Option<i64>,
) -> Option<f64> {
    per_io(f(&r.guest.blk_mq.as_ref()?.sum).map(|n| n as f64), r)
}

/// Entries of `function` (one of `ENTRY_FUNCTIONS`) per IO, under TCG.
fn entries_per_io(r: &ResultRecord, function: &str) -> Option<f64> {
    *r.instructions.as_ref()?.entries_per_io.get(function)?
}

// --- KVM's view of the vCPUs ----------------------------------------------
// Under KVM: KVM's own cumulative vCPU counters over the window (QMP
// `query-stats`, `record::kvm`), summed over the vCPUs, per IO. Absent from
// TCG records and from KVM records without the statistics.

/// The sum of KVM counters `names` over the window, per IO.
fn kvm_per_io(r: &ResultRecord, names: &[&str]) -> Option<f64> {
    per_io(r.kvm.as_ref()?.sum(names), r)
}

/// KVM's exits for the reasons `names` over the window, per IO.
fn kvm_exits_per_io(r: &ResultRecord, names: &[&str]) -> Option<f64> {
    per_io(r.kvm.as_ref()?.exits_for(names), r)
}

/// A KVM counter per IO (lower is better).
const fn kvm(
    key: &'static str,
    title: &'static str,
    unit: &'static str,
    get: fn(&ResultRecord) -> Option<f64>,
) -> Metric {
    Metric {
        key,
        title,
        unit,
        better: Better::Lower,
        get,
    }
}

/// A reason of the would-be exits (`WouldBeExits::per_io`), per IO.
fn exits_per_io(r: &ResultRecord, reason: &str) -> Option<f64> {
    *r.instructions
        .as_ref()?
        .exits
        .as_ref()?
        .per_io
        .get(reason)?
}

/// A would-be exits metric: `reason` of `WouldBeExits::per_io` (lower is
/// better).
macro_rules! exits {
    ($key:expr, $title:expr, $reason:expr) => {
        Metric {
            key: $key,
            title: $title,
            unit: "",
            better: Better::Lower,
            get: |r| exits_per_io(r, $reason),
        }
    };
}

/// A part of a nested run's host instructions per IO
/// (`record::host_split`).
macro_rules! host_part {
    ($part:expr, $title:expr) => {
        Metric {
            key: concat!("host_", $part, "_instructions_per_io"),
            title: concat!("host instructions per IO in ", $title, " (nested)"),
            unit: "",
            better: Better::Lower,
            get: |r| host_split(r)?.part_per_io($part),
        }
    };
}

/// A nested run's host instructions by what ran them.
fn host_split(r: &ResultRecord) -> Option<&crate::record::host_split::HostSplit> {
    r.host_instructions.as_ref()?.split.as_ref()
}

/// A per-IO metric (lower is better).
const fn mech(
    key: &'static str,
    title: &'static str,
    get: fn(&ResultRecord) -> Option<f64>,
) -> Metric {
    Metric {
        key,
        title,
        unit: "",
        better: Better::Lower,
        get,
    }
}

/// Metrics read from the backend's own counters or CPU (blklab's code:
/// its version is a condition of a comparison that shows one).
pub(crate) fn is_backend_metric(key: &str) -> bool {
    matches!(
        key,
        "backend_us_per_io" | "kicks_per_io" | "requests_per_kick" | "notifications_per_io"
    )
}

/// Every metric, in report order.
pub(crate) const METRICS: &[Metric] = &[
    Metric {
        key: "guest_busy_pct",
        title: "guest busy",
        unit: "%",
        better: Better::Lower,
        get: guest_busy,
    },
    Metric {
        key: "guest_sys_pct",
        title: "guest sys",
        unit: "%",
        better: Better::Lower,
        get: guest_sys,
    },
    Metric {
        key: "guest_cpu_us_per_io",
        title: "guest CPU per IO",
        unit: "µs",
        better: Better::Lower,
        get: |r| per_io(guest_cpu_seconds(r).map(|s| s * 1e6), r),
    },
    Metric {
        key: "iops",
        title: "IOPS",
        unit: "",
        better: Better::Higher,
        get: iops,
    },
    Metric {
        key: "host_vcpu_us_per_io",
        title: "host vCPU per IO",
        unit: "µs",
        better: Better::Lower,
        get: |r| per_io(host_group_seconds(r, "qemu", "vcpu").map(|s| s * 1e6), r),
    },
    Metric {
        key: "host_qemu_other_us_per_io",
        title: "host QEMU non-vCPU per IO",
        unit: "µs",
        better: Better::Lower,
        get: |r| per_io(host_group_seconds(r, "qemu", "other").map(|s| s * 1e6), r),
    },
    Metric {
        key: "backend_us_per_io",
        title: "backend CPU per IO",
        unit: "µs",
        better: Better::Lower,
        get: |r| {
            per_io(
                host_group_seconds(r, "blklab", "backend").map(|s| s * 1e6),
                r,
            )
        },
    },
    Metric {
        key: "kicks_per_io",
        title: "kicks per IO",
        unit: "",
        better: Better::Lower,
        get: |r| Some(backend_counter(r, |c| c.kicks)? / backend_requests(r).filter(|n| *n > 0.0)?),
    },
    Metric {
        key: "requests_per_kick",
        title: "requests per kick",
        unit: "",
        better: Better::Higher,
        get: |r| Some(backend_requests(r)? / backend_counter(r, |c| c.kicks).filter(|n| *n > 0.0)?),
    },
    Metric {
        key: "notifications_per_io",
        title: "guest notifications per IO",
        unit: "",
        better: Better::Lower,
        get: |r| {
            Some(
                backend_counter(r, |c| c.notifications)?
                    / backend_requests(r).filter(|n| *n > 0.0)?,
            )
        },
    },
    Metric {
        key: "ctxsw_per_io",
        title: "context switches per IO",
        unit: "",
        better: Better::Lower,
        get: |r| per_io(r.guest.context_switches.map(|n| n as f64), r),
    },
    Metric {
        key: "irqs_per_io",
        title: "interrupts per IO",
        unit: "",
        better: Better::Lower,
        get: |r| per_io(r.guest.interrupts.as_ref().map(|i| i.total as f64), r),
    },
    Metric {
        key: "lat_p50_us",
        title: "latency p50",
        unit: "µs",
        better: Better::Lower,
        get: |r| fio_clat_us(r, "50.000000"),
    },
    Metric {
        key: "lat_p99_us",
        title: "latency p99",
        unit: "µs",
        better: Better::Lower,
        get: |r| fio_clat_us(r, "99.000000"),
    },
    Metric {
        key: "instructions_per_io",
        title: "guest instructions per IO",
        unit: "",
        better: Better::Lower,
        get: |r| insns(r, |i| i.per_io).or_else(|| per_io(insns(r, |i| Some(i.total as f64)), r)),
    },
    Metric {
        key: "kernel_instructions_per_io",
        title: "guest kernel instructions per IO",
        unit: "",
        better: Better::Lower,
        get: |r| insns(r, |i| i.kernel_per_io),
    },
    Metric {
        key: "user_instructions_per_io",
        title: "guest user instructions per IO",
        unit: "",
        better: Better::Lower,
        get: |r| insns(r, |i| i.user_per_io),
    },
    Metric {
        key: "idle_entries_per_io",
        title: "guest idle entries per IO",
        unit: "",
        better: Better::Lower,
        get: |r| insns(r, |i| i.idle_entries_per_io),
    },
    Metric {
        key: "host_instructions_per_io",
        title: "host instructions per IO (nested)",
        unit: "",
        better: Better::Lower,
        get: |r| host_insns(r, |h| h.per_io),
    },
    Metric {
        key: "host_kernel_instructions_per_io",
        title: "host kernel instructions per IO (nested)",
        unit: "",
        better: Better::Lower,
        get: |r| host_insns(r, |h| h.kernel_per_io),
    },
    Metric {
        key: "host_user_instructions_per_io",
        title: "host user instructions per IO (nested)",
        unit: "",
        better: Better::Lower,
        get: |r| host_insns(r, |h| h.user_per_io),
    },
    // --- would-be VM exits (TCG, `instructions.exits`) ---
    exits!(
        "exits_per_io",
        "would-be VM exits per IO (TCG: all reasons)",
        "total"
    ),
    exits!("hlt_exits_per_io", "would-be HLT exits per IO (TCG)", "hlt"),
    exits!(
        "ipi_exits_per_io",
        "would-be IPI-send exits per IO (TCG: ICR writes)",
        "ipi"
    ),
    exits!(
        "timer_exits_per_io",
        "would-be timer-programming exits per IO (TCG: TMICT / TSC deadline)",
        "timer"
    ),
    exits!("eoi_exits_per_io", "would-be EOI exits per IO (TCG)", "eoi"),
    exits!(
        "notify_exits_per_io",
        "would-be virtio notify exits per IO (TCG: notify stores)",
        "notify"
    ),
    exits!(
        "interrupt_exits_per_io",
        "interrupts taken per IO (TCG: IDT stub entries)",
        "interrupts"
    ),
    // --- the modelled host cost (`record::host_cost`: not measured) ---
    Metric {
        key: "modelled_host_instructions_per_io",
        title: "MODELLED host instructions per IO (guest instructions + would-be exits × calibrated weights)",
        unit: "",
        better: Better::Lower,
        get: |r| Some(crate::record::host_cost::model(r)?.total_per_io),
    },
    Metric {
        key: "modelled_exit_instructions_per_io",
        title: "MODELLED host instructions per IO in exits (would-be exits × calibrated weights)",
        unit: "",
        better: Better::Lower,
        get: |r| Some(crate::record::host_cost::model(r)?.exits_per_io),
    },
    Metric {
        key: "modelled_halt_poll_us_per_io",
        title: "MODELLED halt polling per IO (each idle entry polls its idle time, at most 200 µs)",
        unit: "µs",
        better: Better::Lower,
        get: |r| crate::record::host_cost::model(r)?.halt_poll_us_per_io,
    },
    Metric {
        key: "world_switches_per_io",
        title: "world switches per IO (nested: VMRUNs)",
        unit: "",
        better: Better::Lower,
        get: |r| host_insns(r, |h| h.world_switches_per_io),
    },
    // --- the host's instructions by what ran them (`record::host_split`) ---
    Metric {
        key: "host_vm_instructions_per_io",
        title: "host instructions per IO for the VM itself: KVM's exits, QEMU, the backend; halt polling apart (nested)",
        unit: "",
        better: Better::Lower,
        get: |r| host_split(r)?.vm_per_io(),
    },
    host_part!("kvm_exits", "KVM's exit handling"),
    Metric {
        key: "host_instructions_per_kvm_exit",
        title: "host instructions per #VMEXIT in KVM's exit handling (nested: the plugin's exits of the same window)",
        unit: "",
        better: Better::Lower,
        get: |r| {
            let h = r.host_instructions.as_ref()?;
            let n = *h.split.as_ref()?.insns.get("kvm_exits")?;
            (h.exits > 0).then(|| n as f64 / h.exits as f64)
        },
    },
    host_part!("halt", "KVM's halt polling"),
    host_part!("vmm_vcpu_user", "the VMM's vCPU threads' user space"),
    host_part!("vmm_other", "the VMM's other threads"),
    host_part!("backend", "blklab's serving threads"),
    host_part!("lab", "the lab's own threads"),
    host_part!("idle", "the host's idle tasks"),
    host_part!("other", "everything else on the host"),
    host_part!("unattributed", "no known thread"),
    // --- the block layer's mechanism (see `mech`) ---
    mech(
        "hctx_runs_per_io",
        "hardware queue runs per IO (debugfs run)",
        |r| blk_mq_per_io(r, |c| c.run),
    ),
    mech(
        "hctx_queued_per_io",
        "requests allocated per IO (debugfs queued)",
        |r| blk_mq_per_io(r, |c| c.queued),
    ),
    mech(
        "hctx_dispatches_per_io",
        "driver dispatch batches per IO (debugfs dispatched)",
        |r| blk_mq_per_io(r, |c| c.dispatch_calls()),
    ),
    mech(
        "hctx_empty_dispatches_per_io",
        "dispatch batches that queued nothing per IO (debugfs dispatched 0)",
        |r| blk_mq_per_io(r, |c| c.dispatched.as_ref()?.get("0").copied()),
    ),
    mech(
        "kblockd_runs_per_io",
        "kblockd queue runs per IO (blk_mq_run_work_fn entries)",
        |r| entries_per_io(r, "blk_mq_run_work_fn"),
    ),
    mech(
        "kblockd_queued_per_io",
        "kblockd work queued per IO (kblockd_mod_delayed_work_on entries)",
        |r| entries_per_io(r, "kblockd_mod_delayed_work_on"),
    ),
    mech(
        "run_hw_queue_per_io",
        "run-queue requests per IO (blk_mq_run_hw_queue entries)",
        |r| entries_per_io(r, "blk_mq_run_hw_queue"),
    ),
    mech(
        "sched_dispatch_per_io",
        "queue runs reaching dispatch per IO (blk_mq_sched_dispatch_requests entries)",
        |r| entries_per_io(r, "blk_mq_sched_dispatch_requests"),
    ),
    mech(
        "dispatch_rq_list_per_io",
        "driver dispatch batches per IO (blk_mq_dispatch_rq_list entries)",
        |r| entries_per_io(r, "blk_mq_dispatch_rq_list"),
    ),
    mech(
        "flush_plug_per_io",
        "plug flushes per IO (blk_mq_flush_plug_list entries)",
        |r| entries_per_io(r, "blk_mq_flush_plug_list"),
    ),
    mech(
        "dispatch_plug_list_per_io",
        "plug batches inserted and run per IO (blk_mq_dispatch_plug_list entries)",
        |r| entries_per_io(r, "blk_mq_dispatch_plug_list"),
    ),
    mech(
        "get_tag_per_io",
        "tag allocations per IO (blk_mq_get_tag entries)",
        |r| entries_per_io(r, "blk_mq_get_tag"),
    ),
    mech(
        "tag_wakeups_per_io",
        "wake-ups of all tag waiters per IO (blk_mq_tag_wakeup_all entries)",
        |r| entries_per_io(r, "blk_mq_tag_wakeup_all"),
    ),
    mech(
        "sbitmap_wakeups_per_io",
        "tag frees looking for waiters per IO (sbitmap_queue_wake_up entries)",
        |r| entries_per_io(r, "sbitmap_queue_wake_up"),
    ),
    // --- end of the mechanism metrics ---
    // --- KVM's counters (see `kvm`) ---
    kvm("kvm_exits_per_io", "KVM exits per IO (exits)", "", |r| {
        kvm_per_io(r, &["exits"])
    }),
    kvm(
        "kvm_halt_exits_per_io",
        "KVM HLT exits per IO (halt_exits)",
        "",
        |r| kvm_per_io(r, &["halt_exits"]),
    ),
    kvm(
        "kvm_io_exits_per_io",
        "KVM port IO exits per IO (io_exits)",
        "",
        |r| kvm_per_io(r, &["io_exits"]),
    ),
    kvm(
        "kvm_mmio_exits_per_io",
        "KVM MMIO exits per IO (mmio_exits)",
        "",
        |r| kvm_per_io(r, &["mmio_exits"]),
    ),
    kvm(
        "kvm_irq_exits_per_io",
        "KVM external-interrupt exits per IO (irq_exits)",
        "",
        |r| kvm_per_io(r, &["irq_exits"]),
    ),
    kvm(
        "kvm_irq_window_exits_per_io",
        "KVM interrupt-window exits per IO (irq_window_exits)",
        "",
        |r| kvm_per_io(r, &["irq_window_exits"]),
    ),
    kvm(
        "kvm_irq_injections_per_io",
        "KVM interrupt injections per IO (irq_injections)",
        "",
        |r| kvm_per_io(r, &["irq_injections"]),
    ),
    kvm(
        "kvm_halt_successful_poll_per_io",
        "KVM successful halt polls per IO (halt_successful_poll)",
        "",
        |r| kvm_per_io(r, &["halt_successful_poll"]),
    ),
    kvm(
        "kvm_halt_attempted_poll_per_io",
        "KVM attempted halt polls per IO (halt_attempted_poll)",
        "",
        |r| kvm_per_io(r, &["halt_attempted_poll"]),
    ),
    kvm(
        "kvm_halt_poll_ns_per_io",
        "KVM halt-polling time per IO (halt_poll_success_ns + halt_poll_fail_ns)",
        "ns",
        |r| kvm_per_io(r, &["halt_poll_success_ns", "halt_poll_fail_ns"]),
    ),
    kvm(
        "kvm_halt_wait_ns_per_io",
        "KVM halted time per IO (halt_wait_ns)",
        "ns",
        |r| kvm_per_io(r, &["halt_wait_ns"]),
    ),
    // --- KVM's exits by reason (the host's kvm:kvm_exit tracepoint; SVM and
    // VMX names of one kind summed) ---
    kvm(
        "kvm_exit_hlt_per_io",
        "KVM exits per IO by reason: HLT",
        "",
        |r| kvm_exits_per_io(r, &["hlt"]),
    ),
    kvm(
        "kvm_exit_msr_per_io",
        "KVM exits per IO by reason: MSR access (x2APIC ICR/EOI, TSC deadline, …)",
        "",
        |r| kvm_exits_per_io(r, &["msr", "msr_write", "msr_read"]),
    ),
    kvm(
        "kvm_exit_io_per_io",
        "KVM exits per IO by reason: port I/O",
        "",
        |r| kvm_exits_per_io(r, &["io", "io_instruction"]),
    ),
    kvm(
        "kvm_exit_npf_per_io",
        "KVM exits per IO by reason: nested page fault / EPT (MMIO, e.g. virtio notify)",
        "",
        |r| kvm_exits_per_io(r, &["npf", "ept_misconfig", "ept_violation"]),
    ),
    kvm(
        "kvm_exit_interrupt_per_io",
        "KVM exits per IO by reason: host interrupt",
        "",
        |r| kvm_exits_per_io(r, &["interrupt", "external_interrupt"]),
    ),
    kvm(
        "kvm_exit_interrupt_window_per_io",
        "KVM exits per IO by reason: interrupt window",
        "",
        |r| kvm_exits_per_io(r, &["vintr", "interrupt_window"]),
    ),
];

/// The metrics added to the defaults when records carry instruction counts
/// (`blklab run --count-insns`): under TCG they are the deterministic CPU
/// cost, the wall-clock ones are noise.
pub(crate) const INSTRUCTION_METRICS: &[&str] = &[
    "instructions_per_io",
    "kernel_instructions_per_io",
    "user_instructions_per_io",
    "idle_entries_per_io",
    "ctxsw_per_io",
];

/// The metrics added to the defaults when records carry would-be exits.
pub(crate) const EXIT_METRICS: &[&str] = &[
    "exits_per_io",
    "hlt_exits_per_io",
    "ipi_exits_per_io",
    "timer_exits_per_io",
    "eoi_exits_per_io",
    "notify_exits_per_io",
    "interrupt_exits_per_io",
    "modelled_host_instructions_per_io",
    "modelled_halt_poll_us_per_io",
];

/// The metrics added to the defaults when records carry KVM's counters
/// (runs under KVM): how often the vCPUs left the guest, halted, and were
/// sent an interrupt.
pub(crate) const KVM_METRICS: &[&str] = &[
    "kvm_exits_per_io",
    "kvm_halt_exits_per_io",
    "kvm_irq_injections_per_io",
    "kvm_exit_hlt_per_io",
    "kvm_exit_msr_per_io",
    "kvm_exit_io_per_io",
    "kvm_exit_npf_per_io",
];

/// The metrics added to the defaults when records carry a nested run's
/// host instruction counts.
pub(crate) const HOST_INSTRUCTION_METRICS: &[&str] = &[
    "host_instructions_per_io",
    "host_kernel_instructions_per_io",
    "host_user_instructions_per_io",
    "world_switches_per_io",
];

/// The metrics added to the defaults when records split the host's
/// instructions by what ran them: every part (`record::host_split::PARTS`).
pub(crate) const HOST_SPLIT_METRICS: &[&str] = &[
    "host_vm_instructions_per_io",
    "host_kvm_exits_instructions_per_io",
    "host_instructions_per_kvm_exit",
    "host_halt_instructions_per_io",
    "host_vmm_vcpu_user_instructions_per_io",
    "host_vmm_other_instructions_per_io",
    "host_backend_instructions_per_io",
    "host_lab_instructions_per_io",
    "host_idle_instructions_per_io",
    "host_other_instructions_per_io",
    "host_unattributed_instructions_per_io",
];

/// The default metrics for `records`: [`DEFAULT_METRICS`], plus
/// [`INSTRUCTION_METRICS`] when any record has instruction counts,
/// [`EXIT_METRICS`] when any has would-be exits counted,
/// [`KVM_METRICS`] when any has KVM's counters,
/// [`HOST_INSTRUCTION_METRICS`] when any has the host's and
/// [`HOST_SPLIT_METRICS`] when any splits them by what ran them.
pub(crate) fn default_metrics<'a>(
    records: impl IntoIterator<Item = &'a ResultRecord>,
) -> Vec<String> {
    let records: Vec<&ResultRecord> = records.into_iter().collect();
    let mut v: Vec<String> = DEFAULT_METRICS.iter().map(|s| s.to_string()).collect();
    if records.iter().any(|r| insns(r, |i| i.per_io).is_some()) {
        v.extend(INSTRUCTION_METRICS.iter().map(|s| s.to_string()));
    }
    if records.iter().any(|r| exits_per_io(r, "total").is_some()) {
        v.extend(EXIT_METRICS.iter().map(|s| s.to_string()));
    }
    if records.iter().any(|r| kvm_per_io(r, &["exits"]).is_some()) {
        v.extend(KVM_METRICS.iter().map(|s| s.to_string()));
    }
    if records
        .iter()
        .any(|r| host_insns(r, |h| h.per_io).is_some())
    {
        v.extend(HOST_INSTRUCTION_METRICS.iter().map(|s| s.to_string()));
    }
    if records.iter().any(|r| host_split(r).is_some()) {
        v.extend(HOST_SPLIT_METRICS.iter().map(|s| s.to_string()));
    }
    v
}

/// The metrics shown when none are asked for.
pub(crate) const DEFAULT_METRICS: &[&str] = &[
    "guest_busy_pct",
    "guest_cpu_us_per_io",
    "iops",
    "host_vcpu_us_per_io",
];

/// Every metric's key, comma-separated, for an unknown metric's error.
pub(crate) fn known_keys() -> String {
    METRICS.iter().map(|m| m.key).collect::<Vec<_>>().join(", ")
}

pub(crate) fn find(key: &str) -> Option<&'static Metric> {
    METRICS.iter().find(|m| m.key == key)
}

/// linux-block-style labels of a row: (iotype, qd, nj, rmix).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub(crate) struct RowLabels {
    pub(crate) iotype: String,
    pub(crate) qd: String,
    pub(crate) nj: String,
    pub(crate) rmix: String,
}

/// Labels from the fio arguments the variant ran with (the last of a
/// repeated argument wins, as in fio).
pub(crate) fn row_labels(r: &ResultRecord) -> RowLabels {
    let args: Vec<&str> = r
        .scenario_definition
        .as_ref()
        .map(|v| v.fio_args.iter().map(String::as_str).collect())
        .unwrap_or_default();
    let get = |name: &str| {
        args.iter()
            .rev()
            .find_map(|a| a.strip_prefix(&format!("--{name}=")))
            .map(str::to_string)
    };
    let iotype = get("rw").unwrap_or_default();
    let rmix = match iotype.as_str() {
        "randrw" | "rw" | "readwrite" => get("rwmixread").unwrap_or_else(|| "50".into()),
        "randread" | "read" => "100".into(),
        "randwrite" | "write" => "0".into(),
        _ => String::new(),
    };
    RowLabels {
        iotype,
        qd: get("iodepth").unwrap_or_else(|| "1".into()),
        nj: get("numjobs").unwrap_or_else(|| "1".into()),
        rmix,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::result::{test_cpu_all, test_record};
    use serde_json::json;

    fn rec() -> ResultRecord {
        test_record(json!({
            "checks": {"fio_ios": 2000},
            "scenario_definition": {"name": "v", "target": {"kind": "virtio", "params": []},
                "sched": null, "nr_requests": null, "runtime": 1, "ramp": 0,
                "fio_args": ["--rw=randrw", "--iodepth=1", "--numjobs=2", "--numjobs=4", "--rwmixread=70"]},
            "guest": {
                "cpu": {"all": test_cpu_all(25.0, 10.0, 1.0), "ticks": 800},
                "context_switches": 3000, "interrupts": {"total": 1000},
                "fio": {"jobs": [{"read": {"iops": 300.0, "total_ios": 1400, "clat_ns": {"percentile": {"50.000000": 150000, "99.000000": 900000}}},
                                  "write": {"iops": 100.0, "total_ios": 600}}]}
            },
            "backend": {"disks": [{"queues": [
                {"counters": {"requests": 1500, "kicks": 500, "notifications": 1400}},
                {"counters": {"requests": 500, "kicks": 500, "notifications": 400}}]}]},
            "host": {"qemu": {"groups": {"vcpu": {"total_s": 2.0}, "other": {"total_s": 0.5}}},
                     "blklab": {"groups": {"backend-queues": {"total_s": 0.2}, "backend-protocol": {"total_s": 0.0}, "lab": {"total_s": 9.0}}}}
        }))
    }
    #[test]
    fn derives_every_metric() {
        let r = rec();
        let v = |k: &str| (find(k).unwrap().get)(&r).unwrap();
        assert_eq!(v("guest_busy_pct"), 25.0);
        assert_eq!(v("guest_sys_pct"), 10.0);
        // 25 % of 800 ticks = 200 ticks = 2 s over 2000 IOs = 1000 µs.
        assert!((v("guest_cpu_us_per_io") - 1000.0).abs() < 1e-9);
        assert_eq!(v("iops"), 400.0);
        assert!((v("host_vcpu_us_per_io") - 1000.0).abs() < 1e-9);
        assert!((v("host_qemu_other_us_per_io") - 250.0).abs() < 1e-9);
        assert!((v("backend_us_per_io") - 100.0).abs() < 1e-9);
        assert_eq!(v("kicks_per_io"), 0.5);
        assert_eq!(v("requests_per_kick"), 2.0);
        assert_eq!(v("notifications_per_io"), 0.9);
        assert_eq!(v("ctxsw_per_io"), 1.5);
        assert_eq!(v("irqs_per_io"), 0.5);
        assert_eq!(v("lat_p50_us"), 150.0);
        assert_eq!(v("lat_p99_us"), 900.0);
        assert!((find("instructions_per_io").unwrap().get)(&r).is_none());
        assert_eq!(
            row_labels(&r),
            RowLabels {
                iotype: "randrw".into(),
                qd: "1".into(),
                nj: "4".into(),
                rmix: "70".into()
            }
        );
        for k in DEFAULT_METRICS {
            assert!(find(k).is_some());
        }
        // No blk_mq section and no instruction counts: no mechanism metric.
        for k in [
            "hctx_runs_per_io",
            "kblockd_runs_per_io",
            "flush_plug_per_io",
        ] {
            assert!((find(k).unwrap().get)(&r).is_none(), "{k}");
        }
    }

    #[test]
    fn host_instruction_metrics() {
        // Absent (a TCG or KVM run): no value, and not in the defaults.
        let r = rec();
        for k in HOST_INSTRUCTION_METRICS {
            assert_eq!((find(k).unwrap().get)(&r), None, "{k}");
        }
        assert_eq!(default_metrics([&r]), DEFAULT_METRICS);
        // A nested run's record: 2000 IOs.
        let mut nested = rec();
        nested.host_instructions = Some(crate::record::instructions::HostInstructions {
            ios: Some(2000.0),
            total: 6_000_000,
            kernel: 4_000_000,
            user: 2_000_000,
            per_io: Some(3000.0),
            kernel_per_io: Some(2000.0),
            user_per_io: Some(1000.0),
            world_switches: 3000,
            world_switches_per_io: Some(1.5),
            exits: 3000,
            ..Default::default()
        });
        let v = |k: &str| (find(k).unwrap().get)(&nested);
        assert_eq!(v("host_instructions_per_io"), Some(3000.0));
        assert_eq!(v("host_kernel_instructions_per_io"), Some(2000.0));
        assert_eq!(v("host_user_instructions_per_io"), Some(1000.0));
        assert_eq!(v("world_switches_per_io"), Some(1.5));
        let d = default_metrics([&r, &nested]);
        assert_eq!(&d[DEFAULT_METRICS.len()..], HOST_INSTRUCTION_METRICS);
        // Split by thread: each part per IO, the VM's own work, KVM's
        // exit handling per exit; in the defaults once a record has them.
        for k in HOST_SPLIT_METRICS {
            assert_eq!(v(k), None, "{k}");
        }
        let h = nested.host_instructions.as_mut().unwrap();
        h.split = Some(crate::record::host_split::HostSplit {
            insns: [
                ("kvm_exits", 1_500_000),
                ("halt", 100_000),
                ("backend", 500_000),
            ]
            .into_iter()
            .map(|(k, n)| (k.to_string(), n))
            .collect(),
            per_io: [("kvm_exits", 750.0), ("halt", 50.0), ("backend", 250.0)]
                .into_iter()
                .map(|(k, n)| (k.to_string(), Some(n)))
                .collect(),
            ..Default::default()
        });
        let v = |k: &str| (find(k).unwrap().get)(&nested);
        assert_eq!(v("host_kvm_exits_instructions_per_io"), Some(750.0));
        assert_eq!(v("host_halt_instructions_per_io"), Some(50.0));
        assert_eq!(v("host_instructions_per_kvm_exit"), Some(500.0));
        assert_eq!(v("host_lab_instructions_per_io"), None);
        // The VM's own: every one of its parts is needed.
        assert_eq!(v("host_vm_instructions_per_io"), None);
        let d = default_metrics([&nested]);
        assert_eq!(&d[d.len() - HOST_SPLIT_METRICS.len()..], HOST_SPLIT_METRICS);
    }

    #[test]
    fn would_be_exit_metrics() {
        let mut r = rec();
        assert_eq!((find("hlt_exits_per_io").unwrap().get)(&r), None);
        assert!(!default_metrics([&r]).contains(&"exits_per_io".to_string()));
        let mut e = crate::record::instructions::WouldBeExits {
            hlt: 3000,
            notify: 1000,
            interrupts: 500,
            total: 4500,
            ..Default::default()
        };
        e.per_io = e.per_reason(Some(2000.0));
        r.instructions = Some(crate::record::instructions::Instructions {
            exits: Some(e),
            ..Default::default()
        });
        let v = |k: &str| (find(k).unwrap_or_else(|| panic!("{k}")).get)(&r);
        assert_eq!(v("exits_per_io"), Some(2.25));
        assert_eq!(v("hlt_exits_per_io"), Some(1.5));
        assert_eq!(v("notify_exits_per_io"), Some(0.5));
        assert_eq!(v("interrupt_exits_per_io"), Some(0.25));
        assert_eq!(v("ipi_exits_per_io"), Some(0.0));
        let d = default_metrics([&r]);
        for k in EXIT_METRICS {
            assert!(d.contains(&k.to_string()), "{k}");
            assert!(find(k).is_some(), "{k}");
        }
    }

    #[test]
    fn mechanism_metrics() {
        // A 5.10-like kernel: debugfs has run, queued and dispatched; 2000 IOs.
        let hctx = |run: i64| {
            json!({"hctx": 0, "queued": 1000, "run": run, "dispatched": {"0": 100, "1": 700, "2": 100, "32+": 0},
                   "dispatch_busy": {"before": 0, "after": 0}, "active": null, "tags": null, "sched_tags": null})
        };
        let r = test_record(json!({
            "checks": {"guest_block_ios": 2000},
            "guest": {"blk_mq": {"error": null, "attributes": ["dispatched", "queued", "run"],
                "devices": {"vda": {"hctx": [hctx(500), hctx(700)],
                                    "sum": {"queued": 2000, "run": 1200, "dispatched": {"0": 200, "1": 1400, "2": 200, "32+": 0}}}},
                "sum": {"queued": 2000, "run": 1200, "dispatched": {"0": 200, "1": 1400, "2": 200, "32+": 0}}}},
            "instructions": {"window": {"method": "m", "deterministic": false}, "ios": 2000.0,
                "total": 0, "kernel": 0, "user": 0, "per_vcpu": [], "per_io": null, "kernel_per_io": null,
                "user_per_io": null, "idle_symbol": null, "idle_entries": null, "idle_entries_per_io": null,
                "context_switches_per_io": null, "groups": {}, "group_insns": {}, "functions": {},
                "entries": {"blk_mq_run_work_fn": 500, "blk_mq_dispatch_plug_list": null},
                "entries_per_io": {"blk_mq_run_work_fn": 0.25, "blk_mq_dispatch_plug_list": null}}
        }));
        let v = |k: &str| (find(k).unwrap_or_else(|| panic!("{k}")).get)(&r);
        assert_eq!(v("hctx_runs_per_io"), Some(0.6));
        assert_eq!(v("hctx_queued_per_io"), Some(1.0));
        assert_eq!(v("hctx_dispatches_per_io"), Some(0.9));
        assert_eq!(v("hctx_empty_dispatches_per_io"), Some(0.1));
        assert_eq!(v("kblockd_runs_per_io"), Some(0.25));
        // Not in the System.map, or not in the record: no value.
        assert_eq!(v("dispatch_plug_list_per_io"), None);
        assert_eq!(v("tag_wakeups_per_io"), None);
        // A 6.12 kernel: the counters are gone, the metrics are absent (not 0).
        let mut r612 = r.clone();
        r612.guest.blk_mq.as_mut().unwrap().sum = Default::default();
        assert_eq!((find("hctx_runs_per_io").unwrap().get)(&r612), None);
        assert_eq!((find("hctx_dispatches_per_io").unwrap().get)(&r612), None);
        // Every entry function has its metric or is documented as left out.
        for (f, _) in crate::record::instructions::ENTRY_FUNCTIONS {
            let has = METRICS
                .iter()
                .any(|m| m.title.contains(&format!("({f} entries)")));
            assert!(
                has || [
                    "__blk_mq_sched_dispatch_requests",
                    "blk_finish_plug",
                    "schedule"
                ]
                .contains(f),
                "{f}"
            );
        }
    }

    #[test]
    fn kvm_exit_reason_metrics_sum_both_isas_names_per_io() {
        let svm =
            json!({"hlt": 2000, "msr": 1000, "npf": 500, "io": 4, "interrupt": 30, "vintr": 2});
        let vmx = json!({"hlt": 2000, "msr_write": 900, "msr_read": 100, "ept_misconfig": 499,
            "ept_violation": 1, "io_instruction": 4, "external_interrupt": 30, "interrupt_window": 2});
        for reasons in [svm, vmx] {
            let r = test_record(json!({
                "checks": {"guest_block_ios": 1000},
                "kvm": {"source": "s", "counters": {"exits": 3536}, "exit_reasons": reasons},
            }));
            let v = |k: &str| (find(k).unwrap_or_else(|| panic!("{k}")).get)(&r);
            assert_eq!(v("kvm_exit_hlt_per_io"), Some(2.0));
            assert_eq!(v("kvm_exit_msr_per_io"), Some(1.0));
            assert_eq!(v("kvm_exit_npf_per_io"), Some(0.5));
            assert_eq!(v("kvm_exit_io_per_io"), Some(0.004));
            assert_eq!(v("kvm_exit_interrupt_per_io"), Some(0.03));
            assert_eq!(v("kvm_exit_interrupt_window_per_io"), Some(0.002));
        }
        // Without exits by reason (not counted, or an older record): absent.
        let r = test_record(json!({
            "checks": {"guest_block_ios": 1000},
            "kvm": {"source": "s", "counters": {"exits": 3536}},
        }));
        assert_eq!((find("kvm_exit_hlt_per_io").unwrap().get)(&r), None);
        // Counted, and no exit of that kind: 0.
        let r = test_record(json!({
            "checks": {"guest_block_ios": 1000},
            "kvm": {"source": "s", "counters": {}, "exit_reasons": {"hlt": 5}},
        }));
        assert_eq!((find("kvm_exit_io_per_io").unwrap().get)(&r), Some(0.0));
    }

    #[test]
    fn kvm_metrics_divide_kvm_counters_by_the_ios() {
        let counters = json!({"exits": 7000, "halt_exits": 2500, "io_exits": 4, "mmio_exits": 2,
            "irq_exits": 35, "irq_window_exits": 8, "irq_injections": 3000,
            "halt_successful_poll": 1500, "halt_attempted_poll": 2400,
            "halt_poll_success_ns": 21000000, "halt_poll_fail_ns": 5000000,
            "halt_wait_ns": 1000000000});
        let r = test_record(json!({
            "checks": {"guest_block_ios": 2000},
            "kvm": {"source": "s", "counters": counters},
        }));
        let v = |k: &str| (find(k).unwrap_or_else(|| panic!("{k}")).get)(&r);
        assert_eq!(v("kvm_exits_per_io"), Some(3.5));
        assert_eq!(v("kvm_halt_exits_per_io"), Some(1.25));
        assert_eq!(v("kvm_io_exits_per_io"), Some(0.002));
        assert_eq!(v("kvm_mmio_exits_per_io"), Some(0.001));
        assert_eq!(v("kvm_irq_exits_per_io"), Some(0.0175));
        assert_eq!(v("kvm_irq_window_exits_per_io"), Some(0.004));
        assert_eq!(v("kvm_irq_injections_per_io"), Some(1.5));
        assert_eq!(v("kvm_halt_successful_poll_per_io"), Some(0.75));
        assert_eq!(v("kvm_halt_attempted_poll_per_io"), Some(1.2));
        assert_eq!(v("kvm_halt_poll_ns_per_io"), Some(13000.0));
        assert_eq!(v("kvm_halt_wait_ns_per_io"), Some(500000.0));
        // Each KVM metric names the counters it reads, and each exists.
        let counter_metrics = METRICS
            .iter()
            .filter(|m| m.key.starts_with("kvm_") && !m.key.starts_with("kvm_exit_"));
        for m in counter_metrics {
            assert!((m.get)(&r).is_some(), "{}", m.key);
            let (_, names) = m.title.rsplit_once('(').expect("counters in the title");
            for n in names.trim_end_matches(')').split(" + ") {
                assert!(counters.get(n).is_some(), "{}: {n}", m.key);
            }
        }
        // Without an IO count, without KVM's statistics (TCG, or a QEMU
        // without them), or without the counter: absent, not 0.
        let mut no_ios = r.clone();
        no_ios.checks.guest_block_ios = None;
        let tcg = rec();
        let old_qemu = test_record(json!({
            "checks": {"guest_block_ios": 2000},
            "kvm": {"source": "s", "unavailable": "no query-stats"},
        }));
        let mut no_halt_wait = r.clone();
        no_halt_wait
            .kvm
            .as_mut()
            .unwrap()
            .counters
            .remove("halt_wait_ns");
        for m in METRICS.iter().filter(|m| m.key.starts_with("kvm_")) {
            for x in [&no_ios, &tcg, &old_qemu] {
                assert_eq!((m.get)(x), None, "{}", m.key);
            }
        }
        assert_eq!(
            (find("kvm_halt_wait_ns_per_io").unwrap().get)(&no_halt_wait),
            None
        );
        // The defaults grow by the KVM metrics only with KVM's counters.
        let plain = default_metrics([&tcg, &old_qemu]);
        assert_eq!(plain, DEFAULT_METRICS);
        let with_kvm = default_metrics([&tcg, &r]);
        assert_eq!(with_kvm[..DEFAULT_METRICS.len()], *DEFAULT_METRICS);
        assert_eq!(with_kvm[DEFAULT_METRICS.len()..], *KVM_METRICS);
        for k in KVM_METRICS {
            assert!(find(k).is_some(), "{k}");
        }
    }
}
