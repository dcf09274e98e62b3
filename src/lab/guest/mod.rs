//! One guest.

pub(crate) mod accel;
pub(crate) mod cleanup;
pub mod console;
pub mod qemu;
pub(crate) mod qmp;
