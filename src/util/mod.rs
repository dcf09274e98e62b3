//! Layer 1, utilities that know nothing of virtio, devices or the lab:
//! sizes and durations with units, `/proc/PID/stat` (procfs) and host CPU
//! time per thread from it (hostcpu).

pub mod clock;
pub mod fd;
pub mod hostcpu;
pub(crate) mod log_limit;
pub mod procfs;
pub mod schema;
pub(crate) mod slots;
pub mod text;
pub mod units;
