//! One QEMU guest, whatever run it belongs to:
//!
//! - [`qemu`]: QEMU's command line, a running QEMU on pipes whose serial
//!   console is read and answered, the KVM probe boot;
//! - [`qmp`]: a small QMP client on QEMU's monitor socket;
//! - [`console`]: the guest's console protocol (SYNC, results) and the
//!   kernel-fault scanner;
//! - [`accel`]: KVM or TCG, and whether instructions are counted;
//! - [`cleanup`]: what must not outlive `blklab run` (QEMU processes,
//!   socket directories) on a signal.

pub(crate) mod accel;
pub(crate) mod cleanup;
pub mod console;
pub mod qemu;
pub(crate) mod qmp;
