//! A record's `instructions` (`blklab run --count-insns`): the guest's
//! instructions over the variant's window, counted by blklab's TCG plugin
//! and symbolised against the kernel's System.map; and, for a nested run,
//! its `host_instructions`: the host's, symbolised against the host's
//! `/proc/kallsyms` (`lab::measure::plugin` produces both).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The block layer's mechanism functions whose *entries* a record counts
/// (`Instructions::entries`), each with what one entry means. An entry is
/// one execution of the translation block that starts at the function's
/// address: a call, or (rarely, for these functions) a loop jumping back
/// to the function's first instruction. Calls the compiler inlined into a
/// caller are not entries. A function missing from the kernel's System.map
/// (renamed, inlined everywhere, or not in that version) is null.
pub(crate) const ENTRY_FUNCTIONS: &[(&str, &str)] = &[
    (
        "blk_mq_run_work_fn",
        "hardware queue runs executed by kblockd (the hctx's run_work)",
    ),
    (
        "kblockd_mod_delayed_work_on",
        "work queued on kblockd: async queue runs, requeues (a pending work is not queued twice)",
    ),
    (
        "blk_mq_run_hw_queue",
        "requests to run a hardware queue, sync or async",
    ),
    (
        "blk_mq_sched_dispatch_requests",
        "hardware queue runs that reached dispatch (what 5.10/6.1's debugfs run counts)",
    ),
    (
        "__blk_mq_sched_dispatch_requests",
        "dispatch passes of a queue run",
    ),
    (
        "blk_mq_dispatch_rq_list",
        "batches handed to the driver from a queue run (what 5.10's debugfs dispatched counts)",
    ),
    ("blk_mq_flush_plug_list", "plug flushes"),
    (
        "blk_mq_dispatch_plug_list",
        "per-queue batches of a plug flush that go through insert + run",
    ),
    (
        "blk_finish_plug",
        "calls of the out-of-line blk_finish_plug (blk-core.c's own callers, __submit_bio among them, may get an inlined copy that is not counted)",
    ),
    (
        "blk_mq_get_tag",
        "single tag allocations for new requests (scheduler or driver tags; batched ones use blk_mq_get_tags)",
    ),
    (
        "blk_mq_tag_wakeup_all",
        "wake-ups of all of a tag set's waiters (a queue of a shared tag set went idle, or the queue is quiesced)",
    ),
    (
        "sbitmap_queue_wake_up",
        "tag frees that looked for waiters to wake",
    ),
    ("schedule", "calls of schedule() (sleeps and preemption points)"),
];

/// How the window was taken.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct InsnsWindow {
    /// Where the window begins and ends.
    pub(crate) method: String,
    /// `--deterministic` (`-icount`): the counts repeat exactly.
    pub(crate) deterministic: bool,
    /// Block executions the window cut short (a fault or a device access
    /// stopped them before their last instruction): each counted only the
    /// instructions that ran. Absent from records older than the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    blocks_cut: Option<u64>,
    /// Instructions QEMU ran again alone after a device access stopped
    /// their block (each counted once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) reruns: Option<u64>,
    /// Why the plugin counted blocks cut short in full (a plugin for QEMU
    /// 7.2's API, or an old dump): the counts are then high by what those
    /// blocks did not run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) cut_unavailable: Option<String>,
}

impl InsnsWindow {
    /// How a window of `method` was counted: `deterministic`, and what the
    /// plugin's window says of blocks cut short.
    pub(crate) fn of(
        method: &str,
        deterministic: bool,
        cut: u64,
        reruns: u64,
        cut_unavailable: Option<&str>,
    ) -> InsnsWindow {
        let counted = cut_unavailable.is_none();
        InsnsWindow {
            method: method.to_string(),
            deterministic,
            blocks_cut: counted.then_some(cut),
            reruns: counted.then_some(reruns),
            cut_unavailable: cut_unavailable.map(str::to_string),
        }
    }
}

/// One vCPU's instructions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct VcpuInsns {
    pub(crate) kernel: u64,
    pub(crate) user: u64,
}

/// The guest's instructions over one variant's window. Per-IO values are
/// null without an IO count.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Instructions {
    pub(crate) window: InsnsWindow,
    /// The IOs per-IO values divide by: the guest block layer's count of
    /// the window.
    pub(crate) ios: Option<f64>,
    /// Kernel + user.
    pub(crate) total: u64,
    pub(crate) kernel: u64,
    pub(crate) user: u64,
    pub(crate) per_vcpu: Vec<VcpuInsns>,
    pub(crate) per_io: Option<f64>,
    pub(crate) kernel_per_io: Option<f64>,
    pub(crate) user_per_io: Option<f64>,
    /// The function whose entries count idle periods (`schedule_idle`).
    pub(crate) idle_symbol: Option<String>,
    pub(crate) idle_entries: Option<u64>,
    pub(crate) idle_entries_per_io: Option<f64>,
    pub(crate) context_switches_per_io: Option<f64>,
    /// [`ENTRY_FUNCTIONS`] → entries in the window (null: not in the
    /// System.map). Absent from records older than the field.
    #[serde(default)]
    pub(crate) entries: BTreeMap<String, Option<u64>>,
    /// [`ENTRY_FUNCTIONS`] → entries per IO.
    #[serde(default)]
    pub(crate) entries_per_io: BTreeMap<String, Option<f64>>,
    /// Symbol group → kernel instructions per IO.
    pub(crate) groups: BTreeMap<String, Option<f64>>,
    /// Symbol group → kernel instructions.
    pub(crate) group_insns: BTreeMap<String, u64>,
    /// Function (base name) → kernel instructions per IO. Trimmed
    /// recordings keep only functions of at least 0.5 per IO.
    pub(crate) functions: BTreeMap<String, Option<f64>>,
    /// Function (base name) → kernel instructions (absent from trimmed
    /// recordings).
    #[serde(default)]
    pub(crate) function_insns: BTreeMap<String, u64>,
    /// The guest's would-be VM exits over the window (absent from records
    /// older than the field).
    #[serde(default)]
    pub(crate) exits: Option<WouldBeExits>,
}

/// The reasons [`WouldBeExits::per_io`] gives, in order.
pub(crate) const EXIT_REASONS: &[&str] = &[
    "total",
    "hlt",
    "ipi",
    "eoi",
    "timer",
    "apic_other",
    "msr_other",
    "msr_passthrough",
    "port_io",
    "notify",
    "mmio_other",
    "cpuid",
    "interrupts",
];

/// The events of a window that would leave the guest on KVM (a VM exit or
/// host work), counted exactly under TCG by blklab's plugin: what the guest
/// executed, not what a KVM host would see (docs/user-guide.md, "Would-be
/// VM exits"). Per-IO values are null without an IO count.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct WouldBeExits {
    /// Why there are no counts (the plugin cannot read registers, or an
    /// old dump format); null when counted.
    pub(crate) unavailable: Option<String>,
    /// The IOs per-IO values divide by.
    pub(crate) ios: Option<f64>,
    /// The sum of the reasons below.
    pub(crate) total: u64,
    /// HLT executions (idle).
    pub(crate) hlt: u64,
    /// IPIs sent: xAPIC ICR-low stores, x2APIC ICR (0x830) and SELF IPI
    /// (0x83f) WRMSRs.
    pub(crate) ipi: u64,
    /// End-of-interrupt writes: xAPIC EOI stores, x2APIC EOI WRMSRs.
    pub(crate) eoi: u64,
    /// Timer programming: xAPIC TMICT stores, x2APIC TMICT and
    /// TSC_DEADLINE WRMSRs.
    pub(crate) timer: u64,
    /// Other APIC register writes (xAPIC page, x2APIC MSRs).
    pub(crate) apic_other: u64,
    /// WRMSRs of other MSRs (by MSR in `msrs`).
    pub(crate) msr_other: u64,
    /// WRMSRs of MSRs KVM lets the guest write without an exit (FS_BASE,
    /// GS_BASE, KERNEL_GS_BASE, SYSENTER_CS/ESP/EIP; by MSR in `msrs`):
    /// counted, not in `total`. TCG's qemu64 CPU has no FSGSBASE, so its
    /// guest writes FS_BASE on each switch to a task with its own TLS,
    /// where a `-cpu host` guest uses WRFSBASE.
    #[serde(default)]
    pub(crate) msr_passthrough: u64,
    /// Port I/O instructions (by port in `ports`).
    pub(crate) port_io: u64,
    /// virtio notify stores (by disk and queue in `notifies`).
    pub(crate) notify: u64,
    /// Other MMIO stores (by region and address in `mmio`).
    pub(crate) mmio_other: u64,
    /// CPUID executions.
    pub(crate) cpuid: u64,
    /// Interrupts taken: entries of the kernel's IDT stubs.
    pub(crate) interrupts: u64,
    /// Reason (see [`EXIT_REASONS`]) → per IO.
    pub(crate) per_io: BTreeMap<String, Option<f64>>,
    /// MSR ("0x1b") → WRMSRs, for `msr_other` and `msr_passthrough`.
    pub(crate) msrs: BTreeMap<String, u64>,
    /// "in 0x3fd" / "out 0x3f8" → executions.
    pub(crate) ports: BTreeMap<String, u64>,
    /// Notify stores per disk and queue.
    pub(crate) notifies: Vec<NotifyStores>,
    /// "REGION ADDRESS" → stores, for `mmio_other`.
    pub(crate) mmio: BTreeMap<String, u64>,
    /// IDT entry stub (`asm_common_interrupt`, `asm_sysvec_*`) → entries.
    pub(crate) interrupt_entries: BTreeMap<String, u64>,
    /// Device-interrupt vector ("0x22") → interrupts taken: the entries
    /// of each vector's stub in `irq_entries_start` (they add up to
    /// `asm_common_interrupt`'s entries, each stub jumping there).
    #[serde(default)]
    pub(crate) device_vectors: BTreeMap<String, u64>,
    /// Per vCPU: the would-be exits the plugin saw executed (all but
    /// interrupts, which are counted per stub over all vCPUs).
    pub(crate) per_vcpu: Vec<u64>,
    /// The would-be exits of the guest's own window: between the plugin's
    /// marks at the guest's reads of /proc/interrupts right before the
    /// begin and end SYNC lines, where the counts above are between the
    /// host's dumps at those lines. Absent without marks (a kernel whose
    /// System.map has no `arch_show_interrupts`, a plugin that cannot read
    /// registers, records before the field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) guest_window: Option<GuestWindowExits>,
}

/// Would-be exits between two of the plugin's marks: the instants the
/// guest's kernel ran `arch_show_interrupts`, formatting the per-CPU IPI
/// and timer lines of /proc/interrupts for the guest's snapshots.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct GuestWindowExits {
    /// The marks in the window: the reads of /proc/interrupts after the
    /// begin snapshot's, the end snapshot's last (the guest scripts' read
    /// after the begin SYNC's reply, mpstat's as it starts, the end
    /// snapshot's: 3).
    pub(crate) marks: u64,
    /// IPIs sent (as `ipi`): what the guest's RES + CAL + IWI received
    /// over its own window, to the IPI (with 2 vCPUs; with more, one ICR
    /// write may reach several CPUs).
    pub(crate) ipi: u64,
    /// HLT executions.
    pub(crate) hlt: u64,
    /// End-of-interrupt writes.
    pub(crate) eoi: u64,
    /// Timer programming.
    pub(crate) timer: u64,
}

/// One queue's virtio notify stores (each a write of the queue's kick
/// eventfd through ioeventfd, and an EPT misconfig / NPF exit on KVM).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct NotifyStores {
    /// The disk's index (vda = 0).
    pub(crate) disk: usize,
    pub(crate) queue: u64,
    pub(crate) stores: u64,
}

impl WouldBeExits {
    /// The count of a reason of [`EXIT_REASONS`].
    pub(crate) fn reason(&self, reason: &str) -> Option<u64> {
        Some(match reason {
            "total" => self.total,
            "hlt" => self.hlt,
            "ipi" => self.ipi,
            "eoi" => self.eoi,
            "timer" => self.timer,
            "apic_other" => self.apic_other,
            "msr_other" => self.msr_other,
            "msr_passthrough" => self.msr_passthrough,
            "port_io" => self.port_io,
            "notify" => self.notify,
            "mmio_other" => self.mmio_other,
            "cpuid" => self.cpuid,
            "interrupts" => self.interrupts,
            _ => return None,
        })
    }

    /// Each reason per IO (null without an IO count).
    pub(crate) fn per_reason(&self, ios: Option<f64>) -> BTreeMap<String, Option<f64>> {
        EXIT_REASONS
            .iter()
            .map(|r| {
                let n = self.reason(r).unwrap_or(0) as f64;
                (r.to_string(), ios.filter(|i| *i > 0.0).map(|i| n / i))
            })
            .collect()
    }
}

/// The host's instructions over one variant's window of a nested run (the
/// host under TCG, the guest under the host's KVM): level 1 of blklab's
/// TCG plugin on the outer QEMU (the host kernel with KVM, the host's
/// QEMU, blklab and every other host process), its kernel functions
/// symbolised against the host's `/proc/kallsyms`. Per-IO values divide by
/// the guest's IO count and are null without one.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct HostInstructions {
    pub(crate) window: InsnsWindow,
    /// The IOs per-IO values divide by: the guest block layer's count of
    /// the window.
    pub(crate) ios: Option<f64>,
    /// Kernel + user.
    pub(crate) total: u64,
    pub(crate) kernel: u64,
    pub(crate) user: u64,
    pub(crate) per_vcpu: Vec<VcpuInsns>,
    pub(crate) per_io: Option<f64>,
    pub(crate) kernel_per_io: Option<f64>,
    pub(crate) user_per_io: Option<f64>,
    /// VMRUNs: the host's entries into the guest (world switches).
    pub(crate) world_switches: u64,
    pub(crate) world_switches_per_io: Option<f64>,
    /// The #VMEXITs the plugin saw (returns to the host after a VMRUN):
    /// per vCPU within one of its VMRUNs (a vCPU may be in the guest at
    /// either end of the window).
    pub(crate) exits: u64,
    /// Translated blocks the plugin's VMRUN tracking saw run at both
    /// levels in the window: 0 unless that tracking went wrong (QEMU keys a
    /// block by the SVM guest-mode flag, so a block runs at one level
    /// only). Under `-icount` it loses transitions; the split is then by
    /// address (`levels`).
    pub(crate) mixed_blocks: u64,
    /// How the host's instructions were told from the guest's: `vmrun`
    /// (following VMRUN and #VMEXIT) or `address` (by where each block's
    /// code lies: the guest's RAM is the host's huge pages, on a NUMA node
    /// of their own).
    #[serde(default)]
    pub(crate) levels: Option<String>,
    /// By address: block executions in the window whose level by address
    /// is not the VMRUN tracking's (0 without `-icount`).
    #[serde(default)]
    pub(crate) level_disagreements: Option<u64>,
    /// Host symbol group → kernel instructions per IO
    /// (`symbol_groups::host_group_of`: `kvm` for KVM's modules).
    pub(crate) groups: BTreeMap<String, Option<f64>>,
    /// Host symbol group → kernel instructions.
    pub(crate) group_insns: BTreeMap<String, u64>,
    /// Function (base name, a module's as `NAME [MODULE]`) → kernel
    /// instructions per IO.
    pub(crate) functions: BTreeMap<String, Option<f64>>,
    /// Function → kernel instructions (absent from trimmed recordings).
    #[serde(default)]
    pub(crate) function_insns: BTreeMap<String, u64>,
    /// The instructions by what ran them (when the plugin followed the
    /// host's tasks; absent from older records).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) split: Option<crate::record::host_split::HostSplit>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_says_how_blocks_cut_short_were_counted() {
        let w = InsnsWindow::of("sync", true, 12, 3, None);
        assert_eq!(
            (w.blocks_cut, w.reruns, w.cut_unavailable),
            (Some(12), Some(3), None)
        );
        let w = InsnsWindow::of("sync", false, 0, 0, Some("plugin API version 1"));
        assert_eq!((w.blocks_cut, w.reruns), (None, None));
        assert_eq!(w.cut_unavailable.as_deref(), Some("plugin API version 1"));
        // Records older than the fields read as "not said".
        let old: InsnsWindow =
            serde_json::from_str(r#"{"method": "sync", "deterministic": false}"#).unwrap();
        assert_eq!((old.blocks_cut, old.cut_unavailable), (None, None));
    }
}
