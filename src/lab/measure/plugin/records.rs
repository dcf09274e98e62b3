//! What a window's counts become in a result record: the profile of one
//! level against a symbol map (instructions per function, the idle and
//! entry functions' entries), the guest's `instructions` with its
//! would-be exits, a nested run's `host_instructions`.

use std::collections::BTreeMap;

use crate::lab::measure::plugin::dump::{Dump, LevelCounts, LevelRule};
use crate::lab::measure::plugin::symbol_map::SymbolMap;
use crate::lab::measure::plugin_exits::{is_interrupt_stub, NotifyArea, WouldBeExits};
use crate::record::instructions::{
    HostInstructions, InsnsWindow, Instructions, VcpuInsns, ENTRY_FUNCTIONS,
};
use crate::record::symbol_groups::{base_name, group_of, host_group_of};

/// The function whose entries count as idle entries: each idle period ends
/// with one call of `schedule_idle` (kernel/sched/core.c, called at the end
/// of `do_idle`); `do_idle` itself is the fallback for a kernel without it.
const IDLE_SYMBOLS: &[&str] = &["schedule_idle", "do_idle"];

/// A symbolised window: instructions per function (base names) and the
/// executions of the idle function's entry block.
#[derive(Debug, Clone, Default)]
pub struct Profile {
    pub(crate) kernel: u64,
    pub(crate) user: u64,
    pub(crate) per_vcpu: Vec<(u64, u64)>,
    /// base name → instructions.
    pub functions: BTreeMap<String, u64>,
    pub idle_symbol: Option<String>,
    pub idle_entries: Option<u64>,
    /// [`ENTRY_FUNCTIONS`] → entries (None: not in the System.map).
    pub(crate) entries: BTreeMap<String, Option<u64>>,
}

/// Executions of the translation block starting at `addr`: the entries of
/// the function there.
fn entries_at(window: &LevelCounts, addr: u64) -> u64 {
    window.blocks.get(&addr).map_or(0, |b| b.1)
}

/// The profile of one level of a window (`Dump::level1` of a plain TCG
/// run, or `Dump::level2` of a nested run, against the guest's System.map;
/// a nested run's `Dump::level1` against the host's `/proc/kallsyms`).
pub fn profile(window: &LevelCounts, map: &SymbolMap) -> Profile {
    let mut functions: BTreeMap<String, u64> = BTreeMap::new();
    for (addr, (insns, _)) in &window.blocks {
        *functions
            .entry(base_name(map.lookup(*addr)).to_string())
            .or_default() += insns;
    }
    let idle = IDLE_SYMBOLS
        .iter()
        .find_map(|s| map.address(s).map(|a| (s.to_string(), a)));
    let (idle_symbol, idle_entries) = match idle {
        Some((s, a)) => (Some(s), Some(entries_at(window, a))),
        None => (None, None),
    };
    let entries = ENTRY_FUNCTIONS
        .iter()
        .map(|(f, _)| {
            let at = map.entry_addresses(f);
            let n = (!at.is_empty()).then(|| at.iter().map(|a| entries_at(window, *a)).sum());
            (f.to_string(), n)
        })
        .collect();
    Profile {
        kernel: window.kernel(),
        user: window.user(),
        per_vcpu: window.vcpus.clone(),
        functions,
        idle_symbol,
        idle_entries,
        entries,
    }
}

/// The `instructions` field of a result record. `ios` is the block layer's
/// IO count of the window (per-IO fields are null without it) and
/// `context_switches` the guest's `/proc/stat` delta.
pub fn record(
    p: &Profile,
    ios: Option<f64>,
    context_switches: Option<f64>,
    window: &InsnsWindow,
) -> Instructions {
    let per = |v: f64| ios.filter(|n| *n > 0.0).map(|n| v / n);
    let groups = sum_groups(&p.functions, group_of);
    let total = p.kernel + p.user;
    Instructions {
        window: window.clone(),
        ios,
        total,
        kernel: p.kernel,
        user: p.user,
        per_vcpu: p
            .per_vcpu
            .iter()
            .map(|&(kernel, user)| VcpuInsns { kernel, user })
            .collect(),
        per_io: per(total as f64),
        kernel_per_io: per(p.kernel as f64),
        user_per_io: per(p.user as f64),
        idle_symbol: p.idle_symbol.clone(),
        idle_entries: p.idle_entries,
        idle_entries_per_io: p.idle_entries.and_then(|n| per(n as f64)),
        context_switches_per_io: context_switches.and_then(per),
        entries: p.entries.clone(),
        entries_per_io: p
            .entries
            .iter()
            .map(|(f, n)| (f.clone(), n.and_then(|n| per(n as f64))))
            .collect(),
        groups: groups
            .iter()
            .map(|(g, n)| (g.clone(), per(*n as f64)))
            .collect(),
        group_insns: groups,
        functions: p
            .functions
            .iter()
            .map(|(f, n)| (f.clone(), per(*n as f64)))
            .collect(),
        function_insns: p.functions.clone(),
        exits: None,
    }
}

/// The would-be exits of one level of a window (`unavailable`: the dump's
/// reason when it has none), its interrupts taken from the entries of the
/// IDT stubs in `map`, notify stores mapped by `notify`.
pub(crate) fn exits_record(
    level: &LevelCounts,
    unavailable: Option<&str>,
    map: &SymbolMap,
    notify: &[NotifyArea],
    ios: Option<f64>,
) -> WouldBeExits {
    let stubs = map
        .text_symbols()
        .iter()
        .filter(|(_, n)| is_interrupt_stub(n))
        .map(|(a, n)| (n.clone(), entries_at(level, *a)))
        .collect();
    let mut r =
        crate::lab::measure::plugin_exits::record(&level.exits, unavailable, stubs, notify, ios);
    if r.unavailable.is_none() {
        r.device_vectors = device_vectors(level, map);
    }
    r
}

/// The first vector of device interrupts (x86's FIRST_EXTERNAL_VECTOR).
const FIRST_EXTERNAL_VECTOR: u64 = 0x20;

/// Entries per device-interrupt vector ("0x22" → entries): the
/// executions of each vector's stub in `irq_entries_start` (`push
/// $vector; jmp asm_common_interrupt`, one per vector from 0x20 up to the
/// first system vector, `spurious_entries_start`). The stubs are IDT_ALIGN
/// apart: 8 bytes, or 16 with IBT (then the table would hold more than
/// the 224 vectors at 8). Empty when the map has neither symbol.
fn device_vectors(level: &LevelCounts, map: &SymbolMap) -> BTreeMap<String, u64> {
    let (Some(start), Some(end)) = (
        map.address("irq_entries_start"),
        map.address("spurious_entries_start"),
    ) else {
        return BTreeMap::new();
    };
    let span = end.saturating_sub(start);
    let align = if span / 8 <= 256 - FIRST_EXTERNAL_VECTOR {
        8
    } else {
        16
    };
    level
        .blocks
        .range(start..end)
        .filter(|(a, (_, execs))| (*a - start) % align == 0 && *execs > 0)
        .map(|(a, (_, execs))| {
            let vector = FIRST_EXTERNAL_VECTOR + (a - start) / align;
            (format!("{vector:#x}"), *execs)
        })
        .collect()
}

/// Kernel instructions per group of `functions` (base name →
/// instructions), grouped by `group`.
fn sum_groups(
    functions: &BTreeMap<String, u64>,
    group: fn(&str) -> &'static str,
) -> BTreeMap<String, u64> {
    let mut groups: BTreeMap<String, u64> = BTreeMap::new();
    for (f, n) in functions {
        *groups.entry(group(f).to_string()).or_default() += n;
    }
    groups
}

/// The `host_instructions` field of a nested run's result record: `p` the
/// profile of the window's level 1 against the host's `/proc/kallsyms`,
/// `window` the dump difference it came from (its world switches), `ios`
/// the guest block layer's IO count of the window.
pub(crate) fn host_record(
    p: &Profile,
    window: &Dump,
    ios: Option<f64>,
    how: &InsnsWindow,
) -> HostInstructions {
    let per = |v: u64| ios.filter(|n| *n > 0.0).map(|n| v as f64 / n);
    let groups = sum_groups(&p.functions, host_group_of);
    let total = p.kernel + p.user;
    HostInstructions {
        window: how.clone(),
        ios,
        total,
        kernel: p.kernel,
        user: p.user,
        per_vcpu: p
            .per_vcpu
            .iter()
            .map(|&(kernel, user)| VcpuInsns { kernel, user })
            .collect(),
        per_io: per(total),
        kernel_per_io: per(p.kernel),
        user_per_io: per(p.user),
        world_switches: window.vmruns(),
        world_switches_per_io: per(window.vmruns()),
        exits: window.returns(),
        mixed_blocks: window.mixed,
        levels: Some(
            match window.rule {
                LevelRule::Vmrun => "vmrun",
                LevelRule::Address => "address",
            }
            .to_string(),
        ),
        level_disagreements: (window.rule == LevelRule::Address).then_some(window.disagree),
        groups: groups.iter().map(|(g, n)| (g.clone(), per(*n))).collect(),
        group_insns: groups,
        functions: p
            .functions
            .iter()
            .map(|(f, n)| (f.clone(), per(*n)))
            .collect(),
        function_insns: p.functions.clone(),
        split: None,
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::lab::measure::plugin::dump::tests::head;
    use crate::lab::measure::plugin::symbol_map::tests::{KALLSYMS, MAP};

    #[test]
    fn entries_count_executions_of_the_block_at_the_function() {
        // blk_mq_run_work_fn at ..100 (its first block ran 5 times, a later
        // block of it 9 times), sbitmap_queue_wake_up only as two full
        // clones, blk_mq_get_tag only as a .part (not an entry), schedule
        // mapped but never run.
        let map = "\
ffffffff81000000 T _stext
ffffffff81000100 t blk_mq_run_work_fn
ffffffff81000200 t sbitmap_queue_wake_up.isra.0
ffffffff81000300 t sbitmap_queue_wake_up.constprop.0
ffffffff81000380 t sbitmap_queue_wake_up.cold
ffffffff81000400 t blk_mq_get_tag.part.0
ffffffff81000500 T schedule
ffffffff81000600 T _etext
";
        let m = SymbolMap::parse(map, Path::new("System.map")).unwrap();
        let w = Dump::parse(
            "blklab-insns 3\nlevels vmrun\nvcpus 1\n\
             vcpu 0 kernel 10 user 0 l2kernel 0 l2user 0 vmruns 0 returns 0\nmixed 0\ndisagree 0\n\
             tb ffffffff81000100 50 5\ntb ffffffff81000120 90 9\n\
             tb ffffffff81000200 4 2\ntb ffffffff81000300 6 3\ntb ffffffff81000380 1 1\n\
             tb ffffffff81000400 7 7\nend\n",
            Path::new("w"),
        )
        .unwrap();
        let p = profile(&w.level1, &m);
        assert_eq!(p.entries["blk_mq_run_work_fn"], Some(5));
        assert_eq!(p.entries["sbitmap_queue_wake_up"], Some(5));
        assert_eq!(p.entries["blk_mq_get_tag"], None);
        assert_eq!(p.entries["schedule"], Some(0));
        assert_eq!(p.entries["blk_mq_tag_wakeup_all"], None);
        let r = record(&p, Some(10.0), None, &InsnsWindow::default());
        assert_eq!(r.entries_per_io["blk_mq_run_work_fn"], Some(0.5));
        assert_eq!(r.entries_per_io["schedule"], Some(0.0));
        assert_eq!(r.entries_per_io["blk_mq_get_tag"], None);
        // Without an IO count the counts stay, the per-IO values are null.
        let r = record(&p, None, None, &InsnsWindow::default());
        assert_eq!(r.entries["blk_mq_run_work_fn"], Some(5));
        assert_eq!(r.entries_per_io["blk_mq_run_work_fn"], None);
    }

    #[test]
    fn dumps_difference_and_profile() {
        let a = Dump::parse(
            &format!(
                "{}tb ffffffff81000100 40 4\nend\n",
                head(&[(100, 50, 0, 0, 0, 0)], 0)
            ),
            Path::new("a"),
        )
        .unwrap();
        let b = Dump::parse(
            &format!(
                "{}tb ffffffff81000100 60 6\ntb ffffffff81000500 30 3\n\
                 tb ffffffff81000310 7 1\nend\n",
                head(&[(300, 60, 0, 0, 0, 0)], 0)
            ),
            Path::new("b"),
        )
        .unwrap();
        let w = b.since(&a);
        assert_eq!(w.level1.kernel(), 200);
        assert_eq!(w.level1.user(), 10);
        assert_eq!(
            w.level2,
            LevelCounts {
                vcpus: vec![(0, 0)],
                ..LevelCounts::default()
            }
        );
        let m = SymbolMap::parse(MAP, Path::new("System.map")).unwrap();
        let p = profile(&w.level1, &m);
        assert_eq!(p.functions["blk_mq_flush_plug_list"], 20);
        assert_eq!(p.functions["foo"], 7);
        assert_eq!(p.idle_entries, Some(3));
        let r = record(&p, Some(2.0), Some(4.0), &InsnsWindow::default());
        assert_eq!(r.per_io, Some(105.0));
        assert_eq!(r.functions["blk_mq_flush_plug_list"], Some(10.0));
        assert_eq!(r.groups["block"], Some(10.0));
        assert_eq!(r.idle_entries_per_io, Some(1.5));
        assert_eq!(r.context_switches_per_io, Some(2.0));
        // The mechanism's entries: blk_mq_flush_plug_list's block ran 2 times
        // in the window; schedule_idle is not in the list; the rest are not
        // in this map.
        assert_eq!(r.entries["blk_mq_flush_plug_list"], Some(2));
        assert_eq!(r.entries_per_io["blk_mq_flush_plug_list"], Some(1.0));
        assert_eq!(r.entries["blk_mq_run_work_fn"], None);
        assert_eq!(r.entries_per_io["blk_mq_run_work_fn"], None);
        assert_eq!(r.entries.len(), ENTRY_FUNCTIONS.len());
    }

    #[test]
    fn exits_record_counts_interrupt_stub_entries() {
        let map = SymbolMap::parse(
            "ffffffff81000000 T _stext\nffffffff81000100 T asm_common_interrupt\n\
             ffffffff81000200 T asm_sysvec_apic_timer_interrupt\n\
             ffffffff81000300 T asm_sysvec_reschedule_ipi\nffffffff81000400 T _etext\n",
            Path::new("m"),
        )
        .unwrap();
        let w = Dump::parse(
            &format!(
                "{}exits available\nexit 1 0 hlt 0 4\ntb ffffffff81000100 9 3\n\
                 tb ffffffff81000110 9 30\ntb ffffffff81000200 5 5\nend\n",
                head(&[(1, 1, 0, 0, 0, 0)], 0).replace("blklab-insns 3", "blklab-insns 4")
            ),
            Path::new("w"),
        )
        .unwrap();
        let e = exits_record(&w.level1, None, &map, &[], Some(2.0));
        assert!(e.device_vectors.is_empty());
        assert_eq!(e.interrupt_entries["asm_common_interrupt"], 3);
        assert_eq!(e.interrupt_entries["asm_sysvec_apic_timer_interrupt"], 5);
        assert_eq!(e.interrupt_entries["asm_sysvec_reschedule_ipi"], 0);
        assert_eq!((e.interrupts, e.hlt, e.total), (8, 4, 12));
        assert_eq!(e.per_io["interrupts"], Some(4.0));
    }

    #[test]
    fn device_vectors_from_the_irq_entry_stubs() {
        // 204 stubs 8 bytes apart (vectors 0x20..0xeb), as 6.12's map has
        // them; blocks at vector 0x22's and 0x24's stubs, one inside a
        // stub (not a vector's entry), one past the table.
        let map = SymbolMap::parse(
            "ffffffff81400140 T irq_entries_start\nffffffff814007a0 T spurious_entries_start\n\
             ffffffff81400b40 T asm_common_interrupt\n",
            Path::new("m"),
        )
        .unwrap();
        let w = Dump::parse(
            &format!(
                "{}exits available\ntb ffffffff81400150 2 7\ntb ffffffff81400160 2 5\n\
                 tb ffffffff81400162 1 9\ntb ffffffff814007a0 2 4\ntb ffffffff81400798 2 1\n\
                 tb ffffffff81400b40 9 13\nend\n",
                head(&[(1, 1, 0, 0, 0, 0)], 0).replace("blklab-insns 3", "blklab-insns 4")
            ),
            Path::new("w"),
        )
        .unwrap();
        let e = exits_record(&w.level1, None, &map, &[], None);
        let v: Vec<(&str, u64)> = e
            .device_vectors
            .iter()
            .map(|(k, n)| (k.as_str(), *n))
            .collect();
        assert_eq!(v, [("0x22", 7), ("0x24", 5), ("0xeb", 1)]);
        assert_eq!(e.interrupt_entries["asm_common_interrupt"], 13);
        assert_eq!(e.device_vectors.values().sum::<u64>(), 13);
    }

    #[test]
    fn host_profile_of_a_nested_window() {
        let m = SymbolMap::parse(KALLSYMS, Path::new("kallsyms")).unwrap();
        // Level 1 is the host: KVM's run loop, the scheduler, idle, a
        // module's interrupt handler. Level 2 (the guest) is not the host's.
        let w = Dump::parse(
            &format!(
                "{}tb ffffffffc0001000 100 10\ntb ffffffffc0002040 50 10\n\
                 tb ffffffffc0010000 300 20\ntb ffffffffc0010800 20 1\n\
                 tb ffffffff81000100 80 4\ntb ffffffff81000200 30 3\n\
                 tb ffffffffc0020010 5 1\ntb2 ffffffffc0010000 999 9\nend\n",
                head(&[(400, 600, 5000, 2000, 20, 20), (185, 0, 0, 0, 0, 0)], 0)
            ),
            Path::new("w"),
        )
        .unwrap();
        let p = profile(&w.level1, &m);
        assert_eq!(p.functions["svm_vcpu_run [kvm_amd]"], 320);
        assert_eq!(p.functions["vcpu_enter_guest [kvm]"], 50);
        let r = host_record(&p, &w, Some(10.0), &InsnsWindow::default());
        assert_eq!((r.total, r.kernel, r.user), (1185, 585, 600));
        assert_eq!(r.per_io, Some(118.5));
        assert_eq!(r.kernel_per_io, Some(58.5));
        assert_eq!(r.user_per_io, Some(60.0));
        assert_eq!(
            r.per_vcpu[1],
            VcpuInsns {
                kernel: 185,
                user: 0
            }
        );
        assert_eq!((r.world_switches, r.exits, r.mixed_blocks), (20, 20, 0));
        assert_eq!(r.world_switches_per_io, Some(2.0));
        assert_eq!(r.group_insns["kvm"], 470);
        assert_eq!(r.groups["kvm"], Some(47.0));
        assert_eq!(r.group_insns["scheduler"], 80);
        assert_eq!(r.group_insns["idle"], 30);
        assert_eq!(r.group_insns["virtio"], 5);
        assert_eq!(r.functions["__schedule"], Some(8.0));
        assert_eq!(r.function_insns["virtblk_done [virtio_blk]"], 5);
        // The level-1 kernel functions add up to the level-1 kernel count.
        assert_eq!(r.function_insns.values().sum::<u64>(), r.kernel);
        // Without an IO count the counts stay, the per-IO values are null.
        let r = host_record(&p, &w, None, &InsnsWindow::default());
        assert_eq!((r.per_io, r.world_switches_per_io), (None, None));
        assert_eq!(r.groups["kvm"], None);
        assert_eq!(r.group_insns["kvm"], 470);
    }
}
