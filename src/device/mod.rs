//! Layer 3, the device model: a disk's configuration, its virtio config
//! space, requests parsed and executed against storage, fault injection,
//! emulated latency and tag budgets. Knows nothing of vhost-user, sockets,
//! statistics or the lab.

pub mod config;
pub mod config_file;
pub(crate) mod config_space;
pub(crate) mod execute;
pub(crate) mod faults;
pub(crate) mod latency;
pub(crate) mod polling;
pub(crate) mod storage;
pub(crate) mod tags;
