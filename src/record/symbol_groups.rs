//! The symbol groups of an instruction profile: which kernel subsystem a
//! function counts under. Part of the contract between the lab and the
//! report: `blklab run --count-insns` sums a window's functions into these
//! groups (`lab::measure::plugin::record`), and the report's differential profile
//! labels each function with its group.

use std::borrow::Cow;

/// The name the lab gives instructions outside the kernel's text (modules,
/// trampolines): their own group.
pub const OUTSIDE: &str = "[outside kernel text]";

/// A symbol's name and its module: `/proc/kallsyms` names a module's
/// symbols `NAME [MODULE]` (`svm_vcpu_run [kvm_amd]`), System.map has
/// none.
pub(crate) fn split_module(sym: &str) -> (&str, Option<&str>) {
    match sym.strip_suffix(']').and_then(|s| s.rsplit_once(" [")) {
        Some((name, module)) => (name, Some(module)),
        None => (sym, None),
    }
}

/// The name a profile uses: the symbol without the compiler's clone
/// suffixes (`.constprop.0`, `.isra.0`, `.part.0`, `.cold`), so that a
/// function is one row whatever the compiler did with it in either kernel;
/// a module's symbol keeps its module (`svm_vcpu_run [kvm_amd]`).
pub(crate) fn base_name(sym: &str) -> Cow<'_, str> {
    let (name, module) = split_module(sym);
    let base = name.split('.').next().unwrap_or(name);
    match module {
        Some(m) if base.len() < name.len() => Cow::Owned(format!("{base} [{m}]")),
        Some(_) => Cow::Borrowed(sym),
        None => Cow::Borrowed(base),
    }
}

/// A documented symbol group: a function belongs to the first group (in
/// [`GROUPS`] order) one of whose exact names or prefixes matches its base
/// name; else to `other`.
pub(crate) struct Group {
    pub(crate) name: &'static str,
    pub(crate) exact: &'static [&'static str],
    prefixes: &'static [&'static str],
}

/// The groups, in matching order. Names, not source files: System.map has
/// no file names, so a group is its functions' naming convention.
pub(crate) const GROUPS: &[Group] = &[
    Group {
        name: "idle",
        exact: &[
            "do_idle",
            "default_idle",
            "default_idle_call",
            "arch_cpu_idle",
            "arch_cpu_idle_enter",
            "arch_cpu_idle_exit",
            "cpu_startup_entry",
            "schedule_idle",
            "play_idle_precise",
            "cpu_idle_poll",
            "mwait_idle",
            "amd_e400_idle",
        ],
        prefixes: &[
            "cpuidle_",
            "tick_nohz_idle_",
            "tick_nohz_irq_exit",
            "idle_",
            "pv_native_safe_halt",
            "native_safe_halt",
            "acpi_idle",
        ],
    },
    Group {
        name: "virtio",
        exact: &[
            "vp_notify",
            "vp_interrupt",
            "vp_vring_interrupt",
            "vring_interrupt",
        ],
        prefixes: &[
            "virtio",
            "virtqueue",
            "vring_",
            "virtblk",
            "__virtblk",
            "__virtqueue",
            "vp_",
            "vm_notify",
            "detach_buf",
            "virt_",
        ],
    },
    Group {
        name: "block",
        exact: &[
            "submit_bio",
            "submit_bio_noacct",
            "submit_bio_noacct_nocheck",
            "dd_insert_requests",
            "dd_dispatch_request",
            "dd_has_work",
            "dd_finish_request",
            "dd_prepare_request",
            "dd_bio_merge",
            "dd_limit_depth",
            "__dd_dispatch_request",
            "dd_insert_request",
            "dd_merged_requests",
            "dd_request_merge",
            "dd_request_merged",
        ],
        prefixes: &[
            "blk_",
            "__blk_",
            "blk",
            "bio_",
            "__bio_",
            "bio",
            "__submit_bio",
            "bdev_",
            "blkdev_",
            "__blkdev_",
            "elv_",
            "__elv_",
            "elevator_",
            "deadline_",
            "dd_",
            "sbitmap_",
            "__sbitmap_",
            "sbq_",
            "bvec_",
            "part_",
            "disk_",
            "update_io_ticks",
            "bd_",
            "rq_qos_",
            "__rq_qos_",
            "req_",
            "ioc_",
            "iocb_bio",
            "__bio_iov",
        ],
    },
    Group {
        name: "scheduler",
        exact: &[
            "schedule",
            "__schedule",
            "context_switch",
            "finish_task_switch",
            "__switch_to",
            "__switch_to_asm",
            "switch_mm_irqs_off",
            "try_to_wake_up",
            "wake_up_process",
            "wake_up_q",
            "ttwu_do_activate",
            "activate_task",
            "deactivate_task",
            "pick_next_task_fair",
            "put_prev_task_fair",
            "set_next_entity",
            "put_prev_entity",
            "pick_next_entity",
            "update_curr",
            "update_load_avg",
            "update_cfs_group",
            "reweight_entity",
            "check_preempt_wakeup_fair",
            "resched_curr",
            "select_task_rq_fair",
            "place_entity",
            "io_schedule",
            "io_schedule_prepare",
            "io_schedule_finish",
            "schedule_timeout",
            "prepare_to_wait_event",
            "finish_wait",
            "autoremove_wake_function",
            "default_wake_function",
            "kthread",
            "worker_thread",
            "process_one_work",
            "__queue_work",
            "queue_work_on",
            "kblockd_mod_delayed_work_on",
            "mod_delayed_work_on",
            "__queue_delayed_work",
            "insert_work",
            "wake_up_worker",
        ],
        prefixes: &[
            "sched_",
            "__sched_",
            "enqueue_",
            "dequeue_",
            "pick_next_",
            "put_prev_",
            "update_curr",
            "update_rq_clock",
            "__update_load",
            "update_load",
            "__wake_up",
            "wake_up",
            "ttwu_",
            "__ttwu",
            "check_preempt",
            "set_next_task",
            "task_tick",
            "raw_spin_rq",
            "_raw_spin_rq",
            "account_",
            "cpuacct_",
            "psi_",
            "__account",
            "worker_",
            "pwq_",
            "kick_pool",
            "rcu_note_context_switch",
            "prepare_task_switch",
            "__calc_delta",
            "avg_vruntime",
            "update_min_vruntime",
            "__enqueue_entity",
            "__dequeue_entity",
            "hrtick",
        ],
    },
    Group {
        name: "aio/io_uring/direct-io",
        exact: &[
            "do_io_getevents",
            "read_events",
            "lookup_ioctx",
            "iocb_put",
            "refill_reqs_available",
            "user_refill_reqs_available",
        ],
        prefixes: &[
            "aio_",
            "__x64_sys_io_",
            "__do_sys_io_",
            "io_uring",
            "__io_uring",
            "io_",
            "__io_",
            "iomap_dio",
            "iov_iter",
            "__iov_iter",
            "iov_",
            "__import_iovec",
            "import_",
            "pin_user_pages",
            "gup_",
            "__gup_",
            "try_grab",
            "follow_page",
            "__get_user_pages",
            "get_user_pages",
        ],
    },
    Group {
        name: "irq",
        exact: &[
            "common_interrupt",
            "asm_common_interrupt",
            "irq_exit_rcu",
            "irq_enter_rcu",
            "handle_edge_irq",
            "handle_fasteoi_irq",
            "handle_irq_event",
            "handle_irq_event_percpu",
            "__handle_irq_event_percpu",
            "note_interrupt",
            "ack_apic_edge",
            "apic_ack_irq",
            "apic_ack_edge",
        ],
        prefixes: &[
            "irq",
            "__irq",
            "handle_irq",
            "__do_softirq",
            "do_softirq",
            "__softirq",
            "softirq",
            "raise_softirq",
            "__raise_softirq",
            "tasklet",
            "run_ksoftirqd",
            "sysvec_",
            "__sysvec_",
            "asm_sysvec_",
            "irqentry_",
            "apic_",
            "native_apic",
            "lapic_",
            "x2apic",
            "ioapic",
            "msi_",
            "pci_msi",
            "generic_handle",
            "__common_interrupt",
            "ack_",
            "eoi_",
            "fixup_irqs",
            "__flush_smp_call",
            "flush_smp_call",
            "generic_smp_call",
            "smp_call_",
            "native_send_call",
            "send_call_function",
            "__x2apic",
            "default_send_IPI",
            "native_smp_send_reschedule",
            "arch_send_call",
        ],
    },
    Group {
        name: "timer",
        exact: &[
            "update_process_times",
            "scheduler_tick",
            "sched_tick",
            "jiffies_to_usecs",
            "local_clock",
            "sched_clock",
            "native_sched_clock",
            "read_tsc",
            "sched_clock_cpu",
            "update_wall_time",
            "calc_global_load",
            "run_local_timers",
            "run_posix_cpu_timers",
        ],
        prefixes: &[
            "hrtimer",
            "__hrtimer",
            "tick_",
            "__tick_",
            "timer",
            "__timer",
            "clockevents",
            "ktime_",
            "__run_timers",
            "run_timer",
            "__mod_timer",
            "mod_timer",
            "add_timer",
            "del_timer",
            "timekeeping",
            "__timekeeping",
            "clocksource",
            "lapic_next",
            "lapic_timer",
            "native_read_tsc",
            "rdtsc",
            "pvclock",
            "kvm_clock",
            "get_jiffies",
            "jiffies",
            "msecs_to",
            "usecs_to",
            "nsecs_to",
            "ns_to",
            "update_vsyscall",
            "calc_",
            "__calc",
            "sched_clock_",
            "cpu_clock",
            "posix_cpu_timers",
        ],
    },
    Group {
        name: "syscall/entry",
        exact: &[
            "do_syscall_64",
            "entry_SYSCALL_64",
            "entry_SYSCALL_64_after_hwframe",
            "entry_SYSRETQ_unsafe_stack",
            "entry_SYSRETQ_end",
            "syscall_exit_to_user_mode",
            "exit_to_user_mode_prepare",
            "syscall_trace_enter",
            "x64_sys_call",
        ],
        prefixes: &[
            "entry_",
            "syscall_",
            "__x64_sys_",
            "__do_sys_",
            "__se_sys",
            "exit_to_user_mode",
            "restore_regs_and_return",
            "swapgs_",
            "error_entry",
            "error_return",
            "paranoid_",
            "native_iret",
            "asm_exc",
            "exc_",
            "ret_from_",
        ],
    },
    Group {
        name: "memory",
        exact: &[
            "memcpy",
            "memset",
            "memmove",
            "clear_page_erms",
            "clear_page_rep",
            "copy_page",
            "kfree",
            "kmalloc_trace",
            "__kmalloc",
        ],
        prefixes: &[
            "kmem_cache_",
            "__kmem_cache",
            "kmalloc",
            "__kmalloc",
            "kfree",
            "__kfree",
            "slab_",
            "__slab_",
            "___slab_",
            "alloc_pages",
            "__alloc_pages",
            "free_pages",
            "__free_pages",
            "free_unref",
            "get_page_from",
            "rmqueue",
            "__rmqueue",
            "mempool_",
            "folio",
            "__folio",
            "page_",
            "__page_",
            "put_page",
            "get_page",
            "lru_",
            "handle_mm_fault",
            "__handle_mm_fault",
            "do_anonymous",
            "do_page_fault",
            "do_user_addr_fault",
            "copy_user",
            "copy_to_user",
            "copy_from_user",
            "_copy_",
            "__copy_",
            "rep_movs",
            "clear_user",
            "__clear_user",
            "memcg",
            "mod_memcg",
            "__mod_",
            "mod_node",
            "mod_zone",
            "vma_",
            "find_vma",
            "mmap_",
            "__mmap",
            "do_mmap",
            "unmap_",
            "zap_",
            "tlb_",
            "flush_tlb",
            "native_flush_tlb",
            "__flush_tlb",
            "pte_",
            "pmd_",
            "pud_",
            "p4d_",
            "__pte",
            "set_pte",
            "mm_",
            "__mm",
            "percpu_counter",
            "__percpu_counter",
            "obj_cgroup",
        ],
    },
    Group {
        name: "locking/rcu",
        exact: &[],
        prefixes: &[
            "_raw_spin",
            "raw_spin",
            "__raw_spin",
            "queued_spin",
            "native_queued",
            "__pv_queued",
            "_raw_read",
            "_raw_write",
            "mutex_",
            "__mutex",
            "down_",
            "up_",
            "rwsem_",
            "__rwsem",
            "rcu_",
            "__rcu",
            "call_rcu",
            "synchronize_rcu",
            "percpu_ref",
            "__percpu_ref",
            "refcount_",
            "lockref_",
            "preempt_",
            "__preempt",
            "local_bh",
            "__local_bh",
        ],
    },
    Group {
        name: "fs/vfs",
        exact: &[
            "fput",
            "fget",
            "__fget_light",
            "__fdget",
            "fdget",
            "filemap_write_and_wait_range",
        ],
        prefixes: &[
            "vfs_",
            "do_sys_",
            "ksys_",
            "__fput",
            "fput",
            "fget",
            "__fget",
            "__fdget",
            "fdget",
            "file_",
            "filemap_",
            "generic_file",
            "rw_verify",
            "security_",
            "fsnotify",
            "__fsnotify",
            "path_",
            "d_",
            "__d_",
            "dput",
            "dget",
            "inode_",
            "__inode",
            "touch_atime",
            "atime_",
            "do_filp",
            "filp_",
            "alloc_file",
            "alloc_fd",
            "close_fd",
            "__close_fd",
            "fd_install",
            "pipe_",
            "tty_",
            "n_tty",
            "uart_",
            "serial8250",
            "kernfs_",
            "sysfs_",
            "proc_",
            "seq_",
            "single_open",
            "mntput",
            "mntget",
            "lookup_",
            "link_path_walk",
            "walk_component",
            "step_into",
            "terminate_walk",
            "complete_walk",
            "getname",
            "putname",
            "strncpy_from_user",
            "simple_",
            "shmem_",
            "ramfs_",
            "generic_perform_write",
            "generic_write",
            "iterate_dir",
            "dcache_",
            "__dentry",
            "dentry_",
            "do_dentry_open",
            "do_open",
            "vfs_open",
            "may_open",
            "chrdev_open",
            "blkdev_open",
            "exec_",
            "do_execve",
            "load_elf",
            "bprm_",
            "begin_new_exec",
            "setup_arg_pages",
        ],
    },
    Group {
        name: "process",
        exact: &[
            "do_exit",
            "do_group_exit",
            "release_task",
            "copy_process",
            "kernel_clone",
            "wake_up_new_task",
            "do_wait",
            "wait_consider_task",
            "kernel_wait4",
        ],
        prefixes: &[
            "copy_",
            "dup_",
            "exit_",
            "__exit",
            "mm_release",
            "exit_mmap",
            "free_pgtables",
            "unmap_vmas",
            "put_task",
            "__put_task",
            "free_task",
            "do_notify",
            "__send_signal",
            "send_signal",
            "signal_",
            "get_signal",
            "do_signal",
            "arch_do_signal",
            "complete_signal",
            "__group_send",
            "kill_",
            "do_send",
            "futex_",
            "__futex",
            "do_futex",
        ],
    },
];

/// The group of a function (by its base name; a module's function by its
/// name alone).
pub fn group_of(sym: &str) -> &'static str {
    if sym == OUTSIDE {
        return "outside kernel text";
    }
    let (name, _) = split_module(sym);
    let b = name.split('.').next().unwrap_or(name);
    for g in GROUPS {
        if g.exact.contains(&b) || g.prefixes.iter().any(|p| b.starts_with(p)) {
            return g.name;
        }
    }
    "other"
}

/// The modules of the host's hypervisor: their functions are the host
/// group [`KVM_GROUP`].
pub(crate) const KVM_MODULES: &[&str] = &["kvm", "kvm_amd", "kvm_intel", "irqbypass"];

/// The host group of the hypervisor's own code (KVM and its vendor module).
pub(crate) const KVM_GROUP: &str = "kvm";

/// The group of a host kernel function (a nested run's host profile, from
/// `/proc/kallsyms`): [`KVM_GROUP`] for the functions of [`KVM_MODULES`],
/// else the function's group in [`GROUPS`] (idle, scheduler, irq, timer,
/// memory, …), other modules' functions by their names as well.
pub(crate) fn host_group_of(sym: &str) -> &'static str {
    match split_module(sym) {
        (_, Some(m)) if KVM_MODULES.contains(&m) => KVM_GROUP,
        _ => group_of(sym),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_by_base_name() {
        assert_eq!(group_of("blk_mq_flush_plug_list"), "block");
        assert_eq!(group_of("virtio_queue_rqs"), "virtio");
        assert_eq!(group_of("virtblk_add_req_batch"), "virtio");
        assert_eq!(group_of("__submit_bio"), "block");
        assert_eq!(group_of("dd_insert_requests"), "block");
        assert_eq!(group_of("schedule_idle"), "idle");
        assert_eq!(group_of("__schedule"), "scheduler");
        assert_eq!(group_of("hrtimer_interrupt"), "timer");
        assert_eq!(group_of("aio_read"), "aio/io_uring/direct-io");
        assert_eq!(group_of("zzz_unknown"), "other");
        assert_eq!(base_name("foo.constprop.0"), "foo");
        assert_eq!(group_of("blk_mq_flush_plug_list.cold"), "block");
        assert_eq!(group_of(OUTSIDE), "outside kernel text");
    }

    #[test]
    fn module_symbols_keep_their_module() {
        assert_eq!(
            split_module("svm_vcpu_run [kvm_amd]"),
            ("svm_vcpu_run", Some("kvm_amd"))
        );
        assert_eq!(split_module("schedule"), ("schedule", None));
        assert_eq!(
            base_name("svm_vcpu_run [kvm_amd]"),
            "svm_vcpu_run [kvm_amd]"
        );
        assert_eq!(
            base_name("kvm_arch_vcpu_ioctl_run.cold [kvm]"),
            "kvm_arch_vcpu_ioctl_run [kvm]"
        );
        assert_eq!(host_group_of("svm_vcpu_run [kvm_amd]"), "kvm");
        assert_eq!(host_group_of("vcpu_enter_guest.constprop.0 [kvm]"), "kvm");
        assert_eq!(host_group_of("__schedule"), "scheduler");
        assert_eq!(host_group_of("virtblk_done [virtio_blk]"), "virtio");
        assert_eq!(host_group_of("do_idle"), "idle");
        assert_eq!(host_group_of(OUTSIDE), "outside kernel text");
    }
}
