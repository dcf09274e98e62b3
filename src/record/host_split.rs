//! A nested record's host instructions split by what ran them: the
//! emulated host's threads, each in one part (the VM's vCPU threads in
//! three: KVM's exit handling, its halt polling, the VMM's user space), so
//! that the run-to-run spread of the host's cost can be read part by part.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The parts, in the order they are shown; every level-1 instruction of
/// the window is in exactly one:
/// - `kvm_exits`: the VM's vCPU threads in the kernel, outside the halt
///   function: KVM's exit handling and the VMRUN loop around it;
/// - `halt`: the vCPU threads in `kvm_vcpu_halt`: halt polling, going to
///   sleep and waking up;
/// - `vmm_vcpu_user`: the vCPU threads in user space (QEMU's own exit
///   handling);
/// - `vmm_other`: the VMM's other threads (QEMU's main loop, RCU, workers);
/// - `backend`: blklab's serving threads (`blklab-N`, `vring_worker`);
/// - `lab`: the lab process's other threads (its sampling, console,
///   control);
/// - `idle`: the host's idle tasks;
/// - `other`: everything else: kernel threads (timers, RCU, workqueues)
///   and other processes (a neighbour VM);
/// - `unattributed`: before a vCPU's first task switch was seen, or a
///   task not named yet.
pub(crate) const PARTS: [&str; 9] = [
    "kvm_exits",
    "halt",
    "vmm_vcpu_user",
    "vmm_other",
    "backend",
    "lab",
    "idle",
    "other",
    "unattributed",
];

/// One of the host's threads in the window.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct HostThread {
    /// Its name (`comm`).
    pub(crate) name: String,
    pub(crate) pid: i64,
    /// Its process's pid.
    pub(crate) tgid: i64,
    /// The [`PARTS`] key its instructions went to (a vCPU thread's: to
    /// three of them).
    pub(crate) part: String,
    pub(crate) kernel: u64,
    pub(crate) user: u64,
    /// Of `kernel` and `user`: in KVM's halt function.
    pub(crate) halt: u64,
    /// Times it was switched in.
    pub(crate) switches: u64,
}

/// The host's instructions by what ran them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct HostSplit {
    /// [`PARTS`] key → instructions.
    pub(crate) insns: BTreeMap<String, u64>,
    /// [`PARTS`] key → instructions per IO (null without an IO count).
    pub(crate) per_io: BTreeMap<String, Option<f64>>,
    /// Every part's instructions together, which is the host's
    /// instructions of the window but for what ran while the plugin wrote
    /// a dump.
    pub(crate) total: u64,
    /// The process ids the threads were told apart by: the VM's QEMU and
    /// the lab's own process (which serves the disks).
    pub(crate) vmm_pid: Option<i64>,
    pub(crate) lab_pid: Option<i64>,
    /// The threads that ran the most, most first.
    pub(crate) threads: Vec<HostThread>,
}

/// The parts that are the VM's own work, whatever the host's background
/// and timing: its exits handled in the kernel and in QEMU, QEMU's other
/// threads, the backend's serving. Halt polling is left apart: how long a
/// vCPU polls depends on when its wake-up comes, not on the IO's cost.
pub(crate) const VM_PARTS: [&str; 4] = ["kvm_exits", "vmm_vcpu_user", "vmm_other", "backend"];

impl HostSplit {
    /// Part `key`'s instructions per IO.
    pub(crate) fn part_per_io(&self, key: &str) -> Option<f64> {
        self.per_io.get(key).copied().flatten()
    }

    /// The VM's own work ([`VM_PARTS`]) per IO.
    pub(crate) fn vm_per_io(&self) -> Option<f64> {
        VM_PARTS.iter().map(|k| self.part_per_io(k)).sum()
    }
}
