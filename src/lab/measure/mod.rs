//! Measurements, by source.

pub(crate) mod kvm_exit_tracepoint;
pub(crate) mod kvm_qmp_stats;
pub mod plugin;
pub(crate) mod plugin_exits;
