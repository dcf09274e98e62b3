//! The guest machine a boot had and the command-line overrides of what a
//! scenario pins (`lab::run::settings` resolves them; results and run.json
//! record them).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The guest machine and disks a boot had (after the scenario's settings
/// and the command line's overrides).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Machine {
    pub vcpus: u32,
    /// QEMU syntax (1G, 2048M).
    pub memory: String,
    pub disks: u32,
    /// Virtqueues per disk.
    pub num_queues: u16,
    pub queue_size: u16,
}

/// A command-line flag that replaced a value the scenario pinned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Override {
    /// `vcpus`, `memory`, `disks`, `queues`, `queue_size` or `device NAME`.
    pub setting: String,
    /// The flag, e.g. `--vcpus`.
    pub flag: String,
    /// What the scenario (or the variant) says.
    pub scenario: String,
    /// What ran.
    pub used: String,
}
