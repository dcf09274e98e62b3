//! The modelled host cost of a would-be VM exit.

/// Host instructions per exit, by exit reason: calibrated by
/// tests/exit_cost.rs in the nested lab (QEMU 10.0 TCG host with kernel
/// 6.12 kvm-amd), the mean of three runs on the lab's two-vCPU host,
/// rounded to two significant digits. `hlt` is a whole idle cycle with
/// halt polling off (the halt, the block, the timer's wake-up and the
/// interrupt's injection) less the `timer` and `eoi` exits it also holds.
pub const EXIT_WEIGHTS: &[(&str, u64)] = &[
    ("cpuid", 3_100),
    ("port_io", 3_800),
    ("mmio_other", 6_100),
    ("notify", 4_200),
    ("timer", 3_700),
    ("eoi", 3_100),
    ("ipi", 4_300),
    ("hlt", 17_000),
];
