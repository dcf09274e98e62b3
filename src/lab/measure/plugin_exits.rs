//! Would-be VM exits from blklab's TCG plugin: the events a guest run under
//! plain TCG executed that would leave the guest on KVM (HLT, APIC writes,
//! port and MMIO I/O, CPUID, interrupts taken), counted exactly per vCPU
//! and level (the plugin's `exit` records, format 4), and their record
//! ([`WouldBeExits`]): each classified by why it exits, virtio notify
//! stores mapped to their disk and queue.
//!
//! Where the notify stores go. QEMU's virtio-pci (modern) device puts the
//! notify capability in BAR 4 at offset 0x3000 with a
//! `notify_off_multiplier` of 4 and `queue_notify_off` = the queue's
//! index, so queue q of a disk is notified by a store to
//! BAR4 + 0x3000 + 4·q ([`NOTIFY_OFFSET`], [`NOTIFY_MULTIPLIER`]). The
//! BAR's address is what the guest's firmware programmed; QMP's
//! `query-pci` reads it from the device (each disk's `-device` has the id
//! `blklab-diskI`, so the mapping does not rely on slot order).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::lab::guest::qmp::{Qmp, QmpError};

pub(crate) use crate::record::instructions::{GuestWindowExits, NotifyStores, WouldBeExits};

/// What a would-be exit is, with its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ExitKind {
    Hlt,
    Cpuid,
    /// WRMSR of this MSR (ECX).
    Wrmsr(u32),
    /// IN/INS from this port.
    In(u16),
    /// OUT/OUTS to this port.
    Out(u16),
    /// A store to memory-mapped I/O at this guest-physical address.
    Mmio(u64),
}

/// One `exit` record of a dump.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ExitLine {
    /// 1 or 2.
    pub(crate) level: u8,
    pub(crate) vcpu: usize,
    pub(crate) kind: ExitKind,
    pub(crate) count: u64,
    /// An MMIO store's MemoryRegion name.
    pub(crate) region: Option<String>,
}

/// `LEVEL VCPU KIND KEY N [NAME]` (after `exit`).
pub(crate) fn exit_line<'a>(mut w: impl Iterator<Item = &'a str>) -> Option<ExitLine> {
    let level: u8 = w.next()?.parse().ok().filter(|l| *l == 1 || *l == 2)?;
    let vcpu: usize = w.next()?.parse().ok()?;
    let kind = w.next()?;
    let key = u64::from_str_radix(w.next()?, 16).ok()?;
    let count: u64 = w.next()?.parse().ok()?;
    let kind = match kind {
        "hlt" if key == 0 => ExitKind::Hlt,
        "cpuid" if key == 0 => ExitKind::Cpuid,
        "wrmsr" => ExitKind::Wrmsr(u32::try_from(key).ok()?),
        "in" => ExitKind::In(u16::try_from(key).ok()?),
        "out" => ExitKind::Out(u16::try_from(key).ok()?),
        "mmio" => ExitKind::Mmio(key),
        _ => return None,
    };
    let region = w.next().map(str::to_string);
    if w.next().is_some() || region.is_some() != matches!(kind, ExitKind::Mmio(_)) {
        return None;
    }
    Some(ExitLine {
        level,
        vcpu,
        kind,
        count,
        region,
    })
}

/// One level's would-be exits.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExitCounts {
    /// (vCPU, kind) → executions.
    pub counts: BTreeMap<(usize, ExitKind), u64>,
    /// MMIO address → its MemoryRegion's name.
    pub(crate) regions: BTreeMap<u64, String>,
}

impl ExitCounts {
    pub(crate) fn add(&mut self, e: ExitLine) {
        *self.counts.entry((e.vcpu, e.kind)).or_default() += e.count;
        if let (ExitKind::Mmio(a), Some(r)) = (e.kind, e.region) {
            self.regions.insert(a, r);
        }
    }

    /// `self − earlier` (counters only grow).
    pub(crate) fn since(&self, earlier: &ExitCounts) -> ExitCounts {
        let counts = self
            .counts
            .iter()
            .filter_map(|(k, n)| {
                let d = n.saturating_sub(earlier.counts.get(k).copied().unwrap_or(0));
                (d > 0).then_some((*k, d))
            })
            .collect();
        ExitCounts {
            counts,
            regions: self.regions.clone(),
        }
    }

    /// Executions of `kind`, all vCPUs.
    pub fn of(&self, kind: ExitKind) -> u64 {
        self.counts
            .iter()
            .filter(|((_, k), _)| *k == kind)
            .map(|(_, n)| n)
            .sum()
    }
}

/// The xAPIC's MMIO page (QEMU's `apic-msi` region at the default APIC
/// base) and the offsets of its registers that matter here.
const XAPIC_BASE: u64 = 0xfee0_0000;
const XAPIC_EOI: u64 = 0x0b0;
const XAPIC_ICR_LOW: u64 = 0x300;
const XAPIC_TMICT: u64 = 0x380;

/// x2APIC MSRs (0x800 + the xAPIC offset / 16) and TSC_DEADLINE.
const X2APIC_FIRST: u32 = 0x800;
const X2APIC_LAST: u32 = 0x8ff;
const X2APIC_EOI: u32 = 0x80b;
const X2APIC_ICR: u32 = 0x830;
/// x2APIC's SELF IPI register: an IPI to the writing CPU (Linux's
/// self-IPIs, irq work among them, under x2APIC; xAPIC sends them through
/// the ICR).
const X2APIC_SELF_IPI: u32 = 0x83f;
const X2APIC_TMICT: u32 = 0x838;
const MSR_TSC_DEADLINE: u32 = 0x6e0;
/// MSRs KVM always lets a 64-bit guest write without an exit, on SVM
/// (`direct_access_msrs`, `.always`) and VMX (intercepts disabled at vCPU
/// creation) alike: FS_BASE, GS_BASE, KERNEL_GS_BASE and SYSENTER_CS/ESP/
/// EIP. A guest CPU without FSGSBASE (TCG's qemu64) writes FS_BASE with
/// WRMSR on every switch to a task with its own TLS.
const PASSTHROUGH_MSRS: &[u32] = &[0xc000_0100, 0xc000_0101, 0xc000_0102, 0x174, 0x175, 0x176];

/// QEMU's virtio-pci modern notify area: offset in BAR 4, and bytes per
/// queue (`notify_off_multiplier`; `queue_notify_off` is the queue index).
pub(crate) const NOTIFY_BAR: u64 = 4;
pub(crate) const NOTIFY_OFFSET: u64 = 0x3000;
pub(crate) const NOTIFY_MULTIPLIER: u64 = 4;

/// One disk's notify area: queue q is notified at `base + 4·q`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NotifyArea {
    /// The disk's index (the `-device` order: vda, vdb, …).
    pub(crate) disk: usize,
    pub(crate) base: u64,
    pub(crate) queues: u64,
}

impl NotifyArea {
    /// The queue a store at `addr` notifies, if it is this disk's.
    fn queue(&self, addr: u64) -> Option<u64> {
        let off = addr.checked_sub(self.base)?;
        (off % NOTIFY_MULTIPLIER == 0 && off / NOTIFY_MULTIPLIER < self.queues)
            .then_some(off / NOTIFY_MULTIPLIER)
    }
}

/// The `-device` id of disk `i` (what [`notify_areas`] looks for).
pub(crate) fn disk_id(i: usize) -> String {
    format!("blklab-disk{i}")
}

/// Each disk's notify area from QMP's `query-pci` answer: the device with
/// id `blklab-diskI`, its BAR 4's address. `queues[i]` is disk i's queue
/// count. A disk not found (or without BAR 4 mapped) has no area.
pub(crate) fn notify_areas(query_pci: &Value, queues: &[u64]) -> Vec<NotifyArea> {
    let mut devices = Vec::new();
    collect_devices(query_pci, &mut devices);
    queues
        .iter()
        .enumerate()
        .filter_map(|(disk, &q)| {
            let id = disk_id(disk);
            let dev = devices.iter().find(|d| d["qdev_id"] == id.as_str())?;
            let bar = dev["regions"]
                .as_array()?
                .iter()
                .find(|r| r["bar"] == NOTIFY_BAR && r["type"] == "memory")?;
            let addr = bar["address"]
                .as_u64()
                .filter(|a| *a != 0 && *a != u64::MAX)?;
            Some(NotifyArea {
                disk,
                base: addr + NOTIFY_OFFSET,
                queues: q,
            })
        })
        .collect()
}

/// Ask QEMU (QMP at `qmp`) where each disk's notify area is; `queues[i]`
/// is disk i's queue count.
pub(crate) fn query_notify_areas(qmp: &Path, queues: &[u64]) -> Result<Vec<NotifyArea>, QmpError> {
    let mut q = Qmp::connect(qmp, Duration::from_secs(10))?;
    Ok(notify_areas(&q.execute("query-pci", None)?, queues))
}

/// Every device of `query-pci`'s buses, behind bridges too.
fn collect_devices<'a>(v: &'a Value, out: &mut Vec<&'a Value>) {
    for bus in v.as_array().into_iter().flatten() {
        bus_devices(&bus["devices"], out);
    }
}

fn bus_devices<'a>(devices: &'a Value, out: &mut Vec<&'a Value>) {
    for dev in devices.as_array().into_iter().flatten() {
        out.push(dev);
        if let Some(b) = dev.get("pci_bridge") {
            bus_devices(&b["devices"], out);
        }
    }
}

/// Why each would-be exit is one, by the reasons a record counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reason {
    Hlt,
    Ipi,
    Eoi,
    Timer,
    ApicOther,
    MsrOther,
    MsrPassthrough,
    Port,
    Notify(usize, u64),
    MmioOther,
    Cpuid,
}

fn classify(kind: ExitKind, notify: &[NotifyArea]) -> Reason {
    match kind {
        ExitKind::Hlt => Reason::Hlt,
        ExitKind::Cpuid => Reason::Cpuid,
        ExitKind::Wrmsr(X2APIC_ICR | X2APIC_SELF_IPI) => Reason::Ipi,
        ExitKind::Wrmsr(X2APIC_EOI) => Reason::Eoi,
        ExitKind::Wrmsr(X2APIC_TMICT | MSR_TSC_DEADLINE) => Reason::Timer,
        ExitKind::Wrmsr(X2APIC_FIRST..=X2APIC_LAST) => Reason::ApicOther,
        ExitKind::Wrmsr(m) if PASSTHROUGH_MSRS.contains(&m) => Reason::MsrPassthrough,
        ExitKind::Wrmsr(_) => Reason::MsrOther,
        ExitKind::In(_) | ExitKind::Out(_) => Reason::Port,
        ExitKind::Mmio(a) if (XAPIC_BASE..XAPIC_BASE + 0x1000).contains(&a) => {
            match a - XAPIC_BASE {
                XAPIC_ICR_LOW => Reason::Ipi,
                XAPIC_EOI => Reason::Eoi,
                XAPIC_TMICT => Reason::Timer,
                _ => Reason::ApicOther,
            }
        }
        ExitKind::Mmio(a) => notify
            .iter()
            .find_map(|n| n.queue(a).map(|q| Reason::Notify(n.disk, q)))
            .unwrap_or(Reason::MmioOther),
    }
}

/// The kernel's IDT entry stubs whose entries count interrupts taken:
/// `asm_common_interrupt` (device interrupts, MSI-X included) and every
/// `asm_sysvec_*` (the APIC's system vectors: timer, IPIs, …).
pub(crate) fn is_interrupt_stub(name: &str) -> bool {
    name == "asm_common_interrupt" || name.starts_with("asm_sysvec_")
}

/// The would-be exits of one level of a window. `interrupts` are the
/// entries of the IDT stubs (stub → entries), `notify` the disks' notify
/// areas, `ios` the window's IO count (per-IO values are null without it).
pub(crate) fn record(
    exits: &ExitCounts,
    unavailable: Option<&str>,
    interrupts: BTreeMap<String, u64>,
    notify: &[NotifyArea],
    ios: Option<f64>,
) -> WouldBeExits {
    if let Some(why) = unavailable {
        return WouldBeExits {
            unavailable: Some(why.to_string()),
            ..WouldBeExits::default()
        };
    }
    let mut r = WouldBeExits::default();
    let mut notifies: BTreeMap<(usize, u64), u64> = BTreeMap::new();
    let mut per_vcpu: BTreeMap<usize, u64> = BTreeMap::new();
    for (&(vcpu, kind), &n) in &exits.counts {
        let reason = classify(kind, notify);
        if !matches!(reason, Reason::MsrPassthrough) {
            *per_vcpu.entry(vcpu).or_default() += n;
        }
        match reason {
            Reason::Hlt => r.hlt += n,
            Reason::Ipi => r.ipi += n,
            Reason::Eoi => r.eoi += n,
            Reason::Timer => r.timer += n,
            Reason::ApicOther => r.apic_other += n,
            Reason::Cpuid => r.cpuid += n,
            Reason::MsrOther | Reason::MsrPassthrough => {
                let ExitKind::Wrmsr(m) = kind else { continue };
                if matches!(reason, Reason::MsrOther) {
                    r.msr_other += n;
                } else {
                    r.msr_passthrough += n;
                }
                *r.msrs.entry(format!("{m:#x}")).or_default() += n;
            }
            Reason::Port => {
                r.port_io += n;
                let key = match kind {
                    ExitKind::In(p) => format!("in {p:#x}"),
                    ExitKind::Out(p) => format!("out {p:#x}"),
                    _ => continue,
                };
                *r.ports.entry(key).or_default() += n;
            }
            Reason::Notify(disk, queue) => {
                r.notify += n;
                *notifies.entry((disk, queue)).or_default() += n;
            }
            Reason::MmioOther => {
                let ExitKind::Mmio(a) = kind else { continue };
                r.mmio_other += n;
                let name = exits.regions.get(&a).map_or("?", String::as_str);
                *r.mmio.entry(format!("{name} {a:#x}")).or_default() += n;
            }
        }
    }
    // Interrupts taken are vCPU-less here (block entries are summed over
    // vCPUs); per_vcpu counts the plugin's exit records only.
    r.per_vcpu = (0..per_vcpu.keys().next_back().map_or(0, |m| m + 1))
        .map(|v| per_vcpu.get(&v).copied().unwrap_or(0))
        .collect();
    r.interrupts = interrupts.values().sum();
    r.interrupt_entries = interrupts;
    r.notifies = notifies
        .into_iter()
        .map(|((disk, queue), stores)| NotifyStores {
            disk,
            queue,
            stores,
        })
        .collect();
    r.total = r.hlt
        + r.ipi
        + r.eoi
        + r.timer
        + r.apic_other
        + r.msr_other
        + r.port_io
        + r.notify
        + r.mmio_other
        + r.cpuid
        + r.interrupts;
    r.ios = ios;
    r.per_io = r.per_reason(ios);
    r
}

/// The would-be exits between two of the plugin's marks (`marked`, the
/// window's differences of the counts at its last marks; `marks` how many
/// marks the window had).
pub(crate) fn guest_window(marked: &ExitCounts, marks: u64) -> GuestWindowExits {
    let r = record(marked, None, BTreeMap::new(), &[], None);
    GuestWindowExits {
        marks,
        ipi: r.ipi,
        hlt: r.hlt,
        eoi: r.eoi,
        timer: r.timer,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn line(s: &str) -> Option<ExitLine> {
        exit_line(s.split_ascii_whitespace())
    }

    #[test]
    fn exit_lines_are_read_strictly() {
        assert_eq!(
            line("1 0 wrmsr 830 7"),
            Some(ExitLine {
                level: 1,
                vcpu: 0,
                kind: ExitKind::Wrmsr(0x830),
                count: 7,
                region: None
            })
        );
        assert_eq!(line("2 1 out 80 3").unwrap().kind, ExitKind::Out(0x80));
        let m = line("1 0 mmio fee000b0 5 apic-msi").unwrap();
        assert_eq!(
            (m.kind, m.region.as_deref()),
            (ExitKind::Mmio(0xfee000b0), Some("apic-msi"))
        );
        for bad in [
            "3 0 hlt 0 1",           // no level 3
            "1 0 hlt 1 1",           // hlt has no key
            "1 0 mmio fee000b0 5",   // an MMIO store names its region
            "1 0 out 80 3 x",        // only MMIO has a name
            "1 0 in 10000 1",        // ports are 16 bits
            "1 0 wrmsr 100000000 1", // MSRs are 32 bits
            "1 0 vmcall 0 1",        // unknown kind
            "1 x hlt 0 1",
            "1 0 hlt 0",
        ] {
            assert_eq!(line(bad), None, "{bad}");
        }
    }

    fn counts(items: &[(usize, ExitKind, u64)]) -> ExitCounts {
        let mut c = ExitCounts::default();
        for &(vcpu, kind, count) in items {
            c.add(ExitLine {
                level: 1,
                vcpu,
                kind,
                count,
                region: matches!(kind, ExitKind::Mmio(_)).then(|| "r".to_string()),
            });
        }
        c
    }

    #[test]
    fn every_exit_is_classified_by_why_it_exits() {
        let area = NotifyArea {
            disk: 1,
            base: 0xfe00_3000,
            queues: 2,
        };
        let c = counts(&[
            (0, ExitKind::Hlt, 10),
            (1, ExitKind::Hlt, 1),
            (0, ExitKind::Mmio(0xfee0_0300), 4), // xAPIC ICR low: IPI
            (0, ExitKind::Mmio(0xfee0_0310), 4), // ICR high: other APIC
            (0, ExitKind::Wrmsr(0x830), 2),      // x2APIC ICR: IPI
            (1, ExitKind::Wrmsr(0x83f), 1),      // x2APIC SELF IPI: IPI
            (0, ExitKind::Mmio(0xfee0_00b0), 6), // EOI
            (1, ExitKind::Wrmsr(0x80b), 1),
            (0, ExitKind::Mmio(0xfee0_0380), 3), // TMICT
            (0, ExitKind::Wrmsr(0x6e0), 2),      // TSC deadline
            (0, ExitKind::Wrmsr(0x838), 1),
            (0, ExitKind::Wrmsr(0x1b), 1), // APIC base: other MSR
            (0, ExitKind::Wrmsr(0xc000_0100), 12), // FS_BASE: no exit on KVM
            (1, ExitKind::Wrmsr(0x175), 1), // SYSENTER_ESP: neither
            (0, ExitKind::Out(0x3f8), 20),
            (0, ExitKind::In(0x3fd), 5),
            (0, ExitKind::Mmio(0xfe00_3000), 7), // disk 1 queue 0
            (1, ExitKind::Mmio(0xfe00_3004), 2), // disk 1 queue 1
            (0, ExitKind::Mmio(0xfe00_3008), 1), // past the queues
            (0, ExitKind::Cpuid, 9),
        ]);
        let irqs: BTreeMap<String, u64> = [
            ("asm_common_interrupt".to_string(), 8),
            ("asm_sysvec_apic_timer_interrupt".to_string(), 3),
        ]
        .into();
        let r = record(&c, None, irqs, &[area], Some(2.0));
        assert_eq!((r.hlt, r.ipi, r.eoi, r.timer), (11, 7, 7, 6));
        assert_eq!((r.apic_other, r.msr_other, r.port_io), (4, 1, 25));
        assert_eq!(
            (r.notify, r.mmio_other, r.cpuid, r.interrupts),
            (9, 1, 9, 11)
        );
        assert_eq!(r.total, 11 + 7 + 7 + 6 + 4 + 1 + 25 + 9 + 1 + 9 + 11);
        assert_eq!(r.msrs["0x1b"], 1);
        assert_eq!(r.msr_passthrough, 13);
        assert_eq!(r.msrs["0xc0000100"], 12);
        assert_eq!(r.ports["out 0x3f8"], 20);
        assert_eq!(r.mmio["r 0xfe003008"], 1);
        assert_eq!(
            r.notifies,
            vec![
                NotifyStores {
                    disk: 1,
                    queue: 0,
                    stores: 7
                },
                NotifyStores {
                    disk: 1,
                    queue: 1,
                    stores: 2
                }
            ]
        );
        assert_eq!(r.per_io["hlt"], Some(5.5));
        assert_eq!(r.per_io["notify"], Some(4.5));
        assert_eq!(r.per_vcpu.iter().sum::<u64>() + r.interrupts, r.total);
        // Unavailable: no counts, the reason.
        let r = record(&c, Some("no registers"), BTreeMap::new(), &[area], None);
        assert_eq!(
            (r.total, r.unavailable.as_deref()),
            (0, Some("no registers"))
        );
    }

    #[test]
    fn windows_difference_exits() {
        let a = counts(&[(0, ExitKind::Hlt, 10), (0, ExitKind::Out(0x80), 1)]);
        let b = counts(&[
            (0, ExitKind::Hlt, 15),
            (0, ExitKind::Out(0x80), 1),
            (1, ExitKind::Cpuid, 2),
        ]);
        let w = b.since(&a);
        assert_eq!(w.of(ExitKind::Hlt), 5);
        assert_eq!(w.of(ExitKind::Out(0x80)), 0);
        assert_eq!(w.of(ExitKind::Cpuid), 2);
        assert_eq!(w.counts.len(), 2);
    }

    #[test]
    fn notify_areas_from_query_pci() {
        // The shape of QEMU's answer: a disk on the root bus, one behind a
        // bridge, a device without an id.
        let dev = |id: &str, bar4: u64| {
            json!({"qdev_id": id, "regions": [
                {"bar": 1, "type": "memory", "address": 0xfebf_1000u64, "size": 4096},
                {"bar": 4, "type": "memory", "address": bar4, "size": 16384, "prefetch": true, "mem_type_64": true}
            ]})
        };
        let q = json!([{"bus": 0, "devices": [
            dev("", 0xfe00_0000),
            dev("blklab-disk0", 0xfe00_4000),
            {"qdev_id": "bridge", "regions": [], "pci_bridge": {"devices": [dev("blklab-disk1", 0xfd00_0000)]}}
        ]}]);
        let a = notify_areas(&q, &[4, 1, 1]);
        assert_eq!(
            a,
            vec![
                NotifyArea {
                    disk: 0,
                    base: 0xfe00_7000,
                    queues: 4
                },
                NotifyArea {
                    disk: 1,
                    base: 0xfd00_3000,
                    queues: 1
                },
            ]
        );
        assert_eq!(a[0].queue(0xfe00_700c), Some(3));
        assert_eq!(a[0].queue(0xfe00_7010), None);
        assert_eq!(a[0].queue(0xfe00_7002), None);
        assert_eq!(a[0].queue(0xfe00_6ffc), None);
    }
}
