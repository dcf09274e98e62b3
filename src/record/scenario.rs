//! A scenario as `blklab run` executes it (after `--runtime`, `--variants`
//! …): the data the lab parses from a `.scn` file (`lab::scenario::parse`)
//! and records in `run.json` (`scenarios`) and in each result
//! (`scenario_definition`). Its JSON is also what `run.sh --check` prints
//! (docs/lab-protocol.md §3).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Where a variant's IO goes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Target {
    /// `virtio`, `scsi_debug` or `null_blk`.
    pub(crate) kind: String,
    /// Module parameters (`NAME=VALUE`), for the module targets.
    pub(crate) params: Vec<String>,
}

/// A device-mapper stack built on a variant's target devices; fio then runs
/// on the stack's devices instead of the targets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Stack {
    /// `multipath`: one request-based dm-multipath map per logical unit,
    /// its paths the target devices showing that unit (SCSI disks with the
    /// same channel:target:lun on different hosts; any other device is a
    /// map of one path).
    pub(crate) kind: String,
    /// `selector=service-time|round-robin|queue-length` (the path selector,
    /// default service-time as multipath-tools), `path_sched=NAME` (the
    /// I/O scheduler of the path devices; the variant's `sched` and queue
    /// knobs apply to the maps).
    pub(crate) params: Vec<String>,
}

/// How fio's jobs cover a variant's target devices.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Layout {
    /// One job section over every device (`--filename=DEV1:DEV2:…`); its
    /// `numjobs` jobs spread their IO over all of them.
    #[default]
    All,
    /// One job section per device (`--name=VARIANT.DEV --filename=DEV`),
    /// so `numjobs` is per device (seed 002's jobs per LUN).
    PerDisk,
}

impl Layout {
    /// The name used in scenario files.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Layout::All => "all",
            Layout::PerDisk => "per-disk",
        }
    }
}

/// One measured case of a scenario, with the globals folded in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Variant {
    pub(crate) name: String,
    pub(crate) target: Target,
    /// A dm stack on the targets (null: fio runs on the targets).
    #[serde(default)]
    pub(crate) stack: Option<Stack>,
    /// The I/O scheduler written to `queue/scheduler` (null: left alone).
    pub(crate) sched: Option<String>,
    /// Written to `queue/nr_requests` (null: left alone).
    pub(crate) nr_requests: Option<u64>,
    /// Written to `device/queue_depth` (SCSI devices; null: left alone).
    #[serde(default)]
    pub(crate) queue_depth: Option<u64>,
    /// Written to `queue/nomerges` (0, 1 or 2; null: left alone).
    #[serde(default)]
    pub(crate) nomerges: Option<u64>,
    /// Written to `queue/rq_affinity` (0, 1 or 2; null: left alone).
    #[serde(default)]
    pub(crate) rq_affinity: Option<u64>,
    /// The backend's device model for this variant (`blklab run`'s device
    /// options as `NAME=VALUE`, globals first, the variant's replacing
    /// globals of the same name). Variants whose settings differ run in
    /// separate boots.
    #[serde(default)]
    pub(crate) device: Vec<String>,
    /// fio's job layout over the target devices.
    #[serde(default)]
    pub(crate) layout: Layout,
    /// fio runtime, seconds.
    pub(crate) runtime: u64,
    /// fio ramp_time, seconds.
    pub(crate) ramp: u64,
    /// The scenario's fio arguments (global ones first).
    pub(crate) fio_args: Vec<String>,
}

/// A parsed scenario file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Scenario {
    pub name: String,
    pub(crate) description: Option<String>,
    /// Disks the host serves (default 1).
    pub(crate) disks: u32,
    /// Virtqueues per disk, when the scenario fixes it.
    pub(crate) queues: Option<u16>,
    /// Guest vCPUs, when the scenario fixes them.
    #[serde(default)]
    pub(crate) vcpus: Option<u32>,
    /// Guest memory (QEMU syntax: 1G, 2048M), when the scenario fixes it.
    #[serde(default)]
    pub(crate) memory: Option<String>,
    /// Virtqueue size, when the scenario fixes it.
    #[serde(default)]
    pub(crate) queue_size: Option<u16>,
    /// Guest kernel command-line arguments for every boot of the scenario,
    /// after blklab's own and before `--append` (`kernel_append`).
    #[serde(default)]
    pub(crate) kernel_append: Option<String>,
    pub variants: Vec<Variant>,
}

impl Scenario {
    /// Does any variant use the host's virtio disks?
    #[cfg(test)]
    pub(crate) fn uses_virtio(&self) -> bool {
        self.variants.iter().any(|v| v.target.kind == "virtio")
    }

    /// The variant named `name`.
    pub(crate) fn variant(&self, name: &str) -> Option<&Variant> {
        self.variants.iter().find(|v| v.name == name)
    }
}
