//! Layer 1, utilities that know nothing of virtio, devices or the lab:
//! sizes and durations with units, `/proc/PID/stat` (procfs) and host CPU
//! time per thread from it (hostcpu), a process's CPU time in ns
//! (schedstat), CPU affinity (affinity), what the host is (host) and its
//! kind of KVM (kvm_host), the wall
//! clock and its UTC timestamps (wallclock).

pub(crate) mod affinity;
pub(crate) mod clock;
pub(crate) mod fd;
pub(crate) mod host;
pub(crate) mod hostcpu;
pub(crate) mod kvm_host;
pub(crate) mod log_limit;
pub mod logging;
pub(crate) mod procfs;
pub(crate) mod schedstat;
pub(crate) mod schema;
pub(crate) mod shared_file;
pub(crate) mod slots;
pub(crate) mod text;
pub(crate) mod units;
pub(crate) mod wallclock;
