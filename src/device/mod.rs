//! Layer 3, the device model: a disk's configuration, its virtio config
//! space, requests parsed and executed against storage, fault injection,
//! emulated latency and tag budgets. Knows nothing of vhost-user, sockets,
//! statistics or the lab.

pub mod config;
pub mod config_space;
pub mod execute;
pub mod faults;
pub mod latency;
pub mod storage;
pub mod tags;
