//! What QEMU itself holds of each vCPU of a silent host, read by gdb when
//! the outer QEMU has debug information: whether the vCPU is halted, its
//! pending `interrupt_request` bits, and the x86 flags that decide which
//! of them it may take (`hflags`: the interrupt shadow, guest mode;
//! `hflags2`: SVM's global interrupt flag, NMI blocking, virtual
//! interrupt masking). QMP shows none of these, and they tell a vCPU that
//! cannot take its interrupts (GIF clear, NMI blocked) from one that was
//! never told of them (`CPU_INTERRUPT_HARD` missing while its local APIC
//! holds a deliverable vector).
//!
//! The bit values are QEMU 10.0's (`include/exec/cpu-interrupt.h`,
//! `target/i386/cpu.h`); a QEMU without debug information (Debian's is
//! stripped) prints gdb's "No symbol table" instead.

/// gdb commands that print one `vcpu` line per vCPU, walking QEMU's
/// `cpus_queue`.
pub(crate) const GDB_SCRIPT: &str = "\
set $c = cpus_queue.tqh_first
while $c
  set $x = (X86CPU *) $c
  printf \"vcpu %d halted %u interrupt_request 0x%x hflags 0x%x hflags2 0x%x eflags 0x%lx\\n\", \
$c->cpu_index, $c->halted, $c->interrupt_request, $x->env.hflags, $x->env.hflags2, $x->env.eflags
  set $c = $c->node.tqe_next
end
";

/// The `interrupt_request` bits [`VcpuFlags::can_take`] looks at.
const HARD: u32 = 0x0002;
const POLL: u32 = 0x0010;
const NMI: u32 = 0x0200;
const SIPI: u32 = 0x0800;

/// `interrupt_request` bits of QEMU's x86 target.
const INTERRUPTS: &[(u32, &str)] = &[
    (HARD, "HARD"),
    (0x0004, "EXITTB"),
    (POLL, "POLL"),
    (0x0020, "HALT"),
    (0x0040, "SMI"),
    (0x0080, "DEBUG"),
    (0x0100, "VIRQ"),
    (NMI, "NMI"),
    (0x0400, "INIT"),
    (SIPI, "SIPI"),
    (0x1000, "MCE"),
    (0x2000, "TPR"),
];

/// `hflags`' interrupt shadow (the instruction after STI or MOV SS).
const INHIBIT_IRQ: u32 = 1 << 3;

/// `hflags` bits that gate interrupts.
const HFLAGS: &[(u32, &str)] = &[
    (INHIBIT_IRQ, "INHIBIT_IRQ"),
    (1 << 19, "SMM"),
    (1 << 21, "GUEST"),
];

/// The `hflags2` bits [`VcpuFlags::can_take`] looks at.
const GIF: u32 = 1 << 0;
const HIF: u32 = 1 << 1;
const NMI_BLOCKED: u32 = 1 << 2;
const VINTR: u32 = 1 << 3;

/// `hflags2` bits: SVM's global interrupt flag and its company.
const HFLAGS2: &[(u32, &str)] = &[
    (GIF, "GIF"),
    (HIF, "HIF"),
    (NMI_BLOCKED, "NMI_BLOCKED"),
    (VINTR, "VINTR"),
    (1 << 8, "VGIF"),
];

/// The x86 interrupt flag in `eflags`.
const IF: u64 = 1 << 9;

/// One vCPU as gdb printed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct VcpuFlags {
    index: u32,
    halted: bool,
    interrupt_request: u32,
    hflags: u32,
    hflags2: u32,
    eflags: u64,
}

impl VcpuFlags {
    /// A `vcpu …` line of [`GDB_SCRIPT`].
    fn parse(line: &str) -> Option<VcpuFlags> {
        let mut w = line.split_whitespace();
        if w.next()? != "vcpu" {
            return None;
        }
        let index = w.next()?.parse().ok()?;
        let mut field = |name: &str| -> Option<u64> {
            (w.next()? == name).then_some(())?;
            let v = w.next()?;
            match v.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16).ok(),
                None => v.parse().ok(),
            }
        };
        Some(VcpuFlags {
            index,
            halted: field("halted")? != 0,
            interrupt_request: u32::try_from(field("interrupt_request")?).ok()?,
            hflags: u32::try_from(field("hflags")?).ok()?,
            hflags2: u32::try_from(field("hflags2")?).ok()?,
            eflags: field("eflags")?,
        })
    }

    /// The vCPU in words: its pending requests, the gates, and what QEMU
    /// would let it take now (its `x86_cpu_pending_interrupt`).
    fn describe(&self) -> String {
        format!(
            "vCPU {}: {}; requests [{}]; IF {}; hflags [{}]; hflags2 [{}]; can take: {}",
            self.index,
            if self.halted { "halted" } else { "running" },
            names(self.interrupt_request, INTERRUPTS),
            u8::from(self.eflags & IF != 0),
            names(self.hflags, HFLAGS),
            names(self.hflags2, HFLAGS2),
            self.can_take()
        )
    }

    /// What QEMU 10.0's `x86_cpu_pending_interrupt` would deliver:
    /// nothing but POLL and SIPI while GIF is clear; NMI unless blocked;
    /// HARD when IF allows it (or, in a guest with virtual interrupt
    /// masking, the host's IF saved at VMRUN) and no shadow.
    fn can_take(&self) -> &'static str {
        let has = |bit: u32| self.interrupt_request & bit != 0;
        let h2 = |bit: u32| self.hflags2 & bit != 0;
        if has(POLL | SIPI) {
            return "POLL/SIPI";
        }
        if !h2(GIF) {
            return "nothing (GIF clear)";
        }
        if has(NMI) && !h2(NMI_BLOCKED) {
            return "NMI";
        }
        let hard_open = if h2(VINTR) {
            h2(HIF)
        } else {
            self.eflags & IF != 0 && self.hflags & INHIBIT_IRQ == 0
        };
        match (has(HARD), hard_open) {
            (true, true) => "HARD",
            (true, false) => "nothing (HARD masked)",
            (false, _) => "nothing (no HARD request)",
        }
    }
}

/// The names of `bits` set in `value`, and any unnamed rest in hex.
fn names(value: u32, bits: &[(u32, &str)]) -> String {
    let mut out: Vec<String> = bits
        .iter()
        .filter(|(v, _)| value & v != 0)
        .map(|(_, n)| n.to_string())
        .collect();
    let rest = value & !bits.iter().fold(0, |a, (v, _)| a | v);
    if rest != 0 {
        out.push(format!("0x{rest:x}"));
    }
    out.join(" ")
}

/// gdb's output with each `vcpu` line followed by its reading.
pub(crate) fn annotate(gdb_output: &str) -> String {
    let mut out = String::with_capacity(gdb_output.len());
    for line in gdb_output.lines() {
        out.push_str(line);
        out.push('\n');
        if let Some(v) = VcpuFlags::parse(line) {
            out.push_str("  = ");
            out.push_str(&v.describe());
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_halted_vcpu_without_its_hard_request_is_read_as_never_told() {
        let out = annotate(
            "Thread 1 ...\nvcpu 0 halted 1 interrupt_request 0x0 hflags 0x404033 \
             hflags2 0x1 eflags 0x202\n",
        );
        assert!(out.contains(
            "  = vCPU 0: halted; requests []; IF 1; hflags [0x404033]; hflags2 [GIF]; \
             can take: nothing (no HARD request)\n"
        ));
        assert!(out.starts_with("Thread 1 ...\nvcpu 0 halted 1"));
    }

    #[test]
    fn gif_clear_blocks_even_an_nmi() {
        let v = VcpuFlags::parse(
            "vcpu 2 halted 1 interrupt_request 0x202 hflags 0x0 hflags2 0x0 eflags 0x202",
        )
        .unwrap();
        assert_eq!(v.index, 2);
        assert_eq!(v.can_take(), "nothing (GIF clear)");
        assert!(v.describe().contains("requests [HARD NMI]"));
    }

    #[test]
    fn the_gates_decide_between_nmi_and_hard() {
        let v = |ir: u32, hflags: u32, hflags2: u32, eflags: u64| VcpuFlags {
            index: 0,
            halted: true,
            interrupt_request: ir,
            hflags,
            hflags2,
            eflags,
        };
        assert_eq!(v(0x202, 0, 0x1, 0x202).can_take(), "NMI");
        assert_eq!(v(0x202, 0, 0x5, 0x202).can_take(), "HARD");
        assert_eq!(v(0x2, 0, 0x1, 0x2).can_take(), "nothing (HARD masked)");
        assert_eq!(
            v(0x2, 1 << 3, 0x1, 0x202).can_take(),
            "nothing (HARD masked)"
        );
        // In a guest with virtual interrupt masking, the host's IF (HIF).
        assert_eq!(v(0x2, 0, 0x1 | 0x8 | 0x2, 0x2).can_take(), "HARD");
        assert_eq!(
            v(0x2, 0, 0x1 | 0x8, 0x202).can_take(),
            "nothing (HARD masked)"
        );
        assert_eq!(v(0x800, 0, 0, 0).can_take(), "POLL/SIPI");
    }

    #[test]
    fn other_lines_and_malformed_vcpu_lines_pass_through_unread() {
        let text = "No symbol table is loaded.\nvcpu x halted 1\nvcpu 1 halted\n";
        assert_eq!(annotate(text), text);
        assert_eq!(names(0x4002, INTERRUPTS), "HARD 0x4000");
    }
}
