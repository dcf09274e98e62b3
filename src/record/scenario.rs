//! A scenario as `blklab run` executes it (after `--runtime`, `--variants`
//! …): the data the lab parses from a `.scn` file (`lab::scenario::parse`)
//! and records in `run.json` (`scenarios`) and in each result
//! (`scenario_definition`). Its JSON is also what `run.sh --check` prints
//! (docs/lab-protocol.md §3).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Where a variant's IO goes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Target {
    /// `virtio`, `scsi_debug` or `null_blk`.
    pub kind: String,
    /// Module parameters (`NAME=VALUE`), for the module targets.
    pub params: Vec<String>,
}

/// One measured case of a scenario, with the globals folded in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Variant {
    pub name: String,
    pub target: Target,
    /// The I/O scheduler written to `queue/scheduler` (null: left alone).
    pub sched: Option<String>,
    /// Written to `queue/nr_requests` (null: left alone).
    pub nr_requests: Option<u64>,
    /// fio runtime, seconds.
    pub runtime: u64,
    /// fio ramp_time, seconds.
    pub ramp: u64,
    /// The scenario's fio arguments (global ones first).
    pub fio_args: Vec<String>,
}

/// A parsed scenario file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Scenario {
    pub name: String,
    pub description: Option<String>,
    /// Disks the host serves (default 1).
    pub disks: u32,
    /// Virtqueues per disk, when the scenario fixes it.
    pub queues: Option<u16>,
    pub variants: Vec<Variant>,
}

impl Scenario {
    /// Does any variant use the host's virtio disks?
    pub fn uses_virtio(&self) -> bool {
        self.variants.iter().any(|v| v.target.kind == "virtio")
    }

    /// The variant named `name`.
    pub(crate) fn variant(&self, name: &str) -> Option<&Variant> {
        self.variants.iter().find(|v| v.name == name)
    }
}
