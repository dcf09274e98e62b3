//! A window's host tasks (the plugin's, [`Tasks`]) as the record's split of
//! the host's instructions by what ran them ([`HostSplit`]): each thread
//! into its part by its process (the VM's QEMU, the lab's own process) and
//! its name.

use crate::lab::measure::plugin::tasks::{TaskCount, TaskKey, Tasks};
use crate::record::host_split::{HostSplit, HostThread, PARTS};

/// How many threads a record lists.
const THREADS_KEPT: usize = 24;

/// The processes the parts are told by, in the host: the VM's QEMU and
/// the lab's own process (whose threads serve the disks too).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct HostProcesses {
    pub(crate) vmm: Option<i64>,
    pub(crate) lab: Option<i64>,
}

/// The split of `tasks`' level-1 instructions, per IO over `ios`.
pub(crate) fn split(tasks: &Tasks, procs: HostProcesses, ios: Option<f64>) -> HostSplit {
    let mut s = HostSplit {
        insns: PARTS.iter().map(|p| (p.to_string(), 0)).collect(),
        vmm_pid: procs.vmm,
        lab_pid: procs.lab,
        ..HostSplit::default()
    };
    let mut threads: Vec<HostThread> = Vec::new();
    for (key, c) in &tasks.by_task {
        let part = part_of(key, c, procs);
        for (p, n) in charges(part, c) {
            *s.insns.entry(p.to_string()).or_default() += n;
        }
        threads.push(HostThread {
            name: c.comm.clone(),
            pid: key.pid,
            tgid: c.tgid,
            part: part.to_string(),
            kernel: c.kernel,
            user: c.user,
            halt: c.halt,
            switches: c.switches,
        });
    }
    threads.sort_by_key(|t| std::cmp::Reverse(t.kernel + t.user));
    threads.truncate(THREADS_KEPT);
    s.threads = threads;
    s.total = s.insns.values().sum();
    let per = |v: u64| ios.filter(|n| *n > 0.0).map(|n| v as f64 / n);
    s.per_io = s.insns.iter().map(|(k, v)| (k.clone(), per(*v))).collect();
    s
}

/// The part a task's instructions go to (a VM's vCPU thread: `vcpu`, split
/// three ways by [`charges`]).
fn part_of(key: &TaskKey, c: &TaskCount, procs: HostProcesses) -> &'static str {
    if key.ptr == 0 || key.pid < 0 {
        return "unattributed";
    }
    if key.pid == 0 {
        // The idle tasks, one per CPU (`swapper/N`), all pid 0.
        return "idle";
    }
    if Some(c.tgid) == procs.vmm {
        return if is_vcpu_thread(&c.comm) {
            "vcpu"
        } else {
            "vmm_other"
        };
    }
    if Some(c.tgid) == procs.lab {
        return if is_backend_thread(&c.comm) {
            "backend"
        } else {
            "lab"
        };
    }
    "other"
}

/// A task's instructions by part: a vCPU thread's kernel instructions
/// outside the halt function are KVM's exit handling, those in it the
/// halt's, its user ones the VMM's; any other task's all go to its part.
fn charges(part: &'static str, c: &TaskCount) -> Vec<(&'static str, u64)> {
    if part != "vcpu" {
        return vec![(part, c.kernel + c.user)];
    }
    // The halt function runs in the kernel: its instructions are kernel
    // ones (a user count there would be the plugin's, kept where it fell).
    let halt_kernel = c.halt.min(c.kernel);
    vec![
        ("kvm_exits", c.kernel - halt_kernel),
        ("halt", c.halt),
        ("vmm_vcpu_user", c.user - (c.halt - halt_kernel).min(c.user)),
    ]
}

/// QEMU's vCPU threads under KVM with `debug-threads=on`: `CPU 0/KVM`.
fn is_vcpu_thread(comm: &str) -> bool {
    comm.starts_with("CPU ") && comm.ends_with("/KVM")
}

/// The lab's threads that serve the disks: each disk's `blklab-N` (its
/// socket and connection) and the vhost-user backend's `vring_worker`s.
fn is_backend_thread(comm: &str) -> bool {
    comm == "vring_worker"
        || comm
            .strip_prefix("blklab-")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A task: (address, pid, tgid), its name, (kernel, user, halt).
    fn task(
        t: &mut Tasks,
        (ptr, pid, tgid): (u64, i64, i64),
        comm: &str,
        (k, u, halt): (u64, u64, u64),
    ) {
        t.by_task.insert(
            TaskKey { ptr, pid },
            TaskCount {
                tgid,
                comm: comm.into(),
                kernel: k,
                user: u,
                halt,
                switches: 1,
                ..TaskCount::default()
            },
        );
    }

    #[test]
    fn each_thread_goes_to_its_part_and_the_parts_add_up() {
        let mut t = Tasks::default();
        task(&mut t, (0, -1, -1), "", (7, 0, 0));
        task(&mut t, (0x10, 0, 0), "swapper/0", (100, 0, 0));
        task(&mut t, (0x20, 501, 500), "CPU 0/KVM", (1000, 300, 400));
        task(&mut t, (0x28, 502, 500), "CPU 1/KVM", (200, 10, 0));
        task(&mut t, (0x30, 500, 500), "qemu-system-x86", (50, 60, 0));
        task(&mut t, (0x40, 301, 300), "vring_worker", (80, 90, 0));
        task(&mut t, (0x48, 302, 300), "blklab-0", (5, 5, 0));
        task(&mut t, (0x50, 300, 300), "blklab", (20, 30, 0));
        task(&mut t, (0x60, 40, 40), "kworker/0:1", (15, 0, 0));
        // Another VM's vCPU thread (the neighbour): not the lab's VM.
        task(&mut t, (0x70, 801, 800), "CPU 0/KVM", (9, 1, 3));
        let procs = HostProcesses {
            vmm: Some(500),
            lab: Some(300),
        };
        let s = split(&t, procs, Some(10.0));
        let want = [
            ("kvm_exits", 600 + 200),
            ("halt", 400),
            ("vmm_vcpu_user", 310),
            ("vmm_other", 110),
            ("backend", 180),
            ("lab", 50),
            ("idle", 100),
            ("other", 15 + 10),
            ("unattributed", 7),
        ];
        for (k, n) in want {
            assert_eq!(s.insns[k], n, "{k}");
        }
        assert_eq!(s.total, t.level1());
        assert_eq!(s.part_per_io("halt"), Some(40.0));
        // The VM's own: exits, QEMU's user space and other threads, the
        // backend; not the halts.
        assert_eq!(s.vm_per_io(), Some((800 + 310 + 110 + 180) as f64 / 10.0));
        assert_eq!(s.threads[0].name, "CPU 0/KVM");
        assert_eq!(s.threads[0].part, "vcpu");
        assert_eq!(split(&t, procs, None).part_per_io("halt"), None);
    }

    #[test]
    fn backend_threads_are_named_so() {
        assert!(is_backend_thread("vring_worker") && is_backend_thread("blklab-12"));
        assert!(!is_backend_thread("blklab-") && !is_backend_thread("blklab-metrics"));
        assert!(is_vcpu_thread("CPU 3/KVM") && !is_vcpu_thread("CPU 3/TCG"));
    }
}
