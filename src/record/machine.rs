//! The guest machine a boot had and the command-line overrides of what a
//! scenario pins (`lab::run::settings` resolves them; results and run.json
//! record them).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The guest machine and disks a boot had (after the scenario's settings
/// and the command line's overrides).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Machine {
    pub(crate) vcpus: u32,
    /// QEMU syntax (1G, 2048M).
    pub(crate) memory: String,
    pub(crate) disks: u32,
    /// Virtqueues per disk.
    pub(crate) num_queues: u16,
    pub(crate) queue_size: u16,
}

/// A command-line flag that replaced a value the scenario pinned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Override {
    /// `vcpus`, `memory`, `disks`, `queues`, `queue_size` or `device NAME`.
    pub(crate) setting: String,
    /// The flag, e.g. `--vcpus`.
    pub(crate) flag: String,
    /// What the scenario (or the variant) says.
    pub(crate) scenario: String,
    /// What ran.
    pub(crate) used: String,
}
