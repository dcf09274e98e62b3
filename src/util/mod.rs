//! Layer 1, utilities that know nothing of virtio, devices or the lab:
//! sizes and durations with units, and host CPU time from `/proc`.

pub mod fd;
pub mod hostcpu;
pub mod schema;
pub mod text;
pub mod units;
