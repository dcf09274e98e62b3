//! A scenario as `blklab run` executes it (after `--runtime`, `--variants`
//! …): the data the lab parses from a `.scn` file (`lab::scenario::parse`)
//! and records in `run.json` (`scenarios`) and in each result
//! (`scenario_definition`). Its JSON is also what `run.sh --check` prints
//! (docs/lab-protocol.md §3).

use std::fmt;

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

/// The most vCPUs a guest may have, and what `vcpus host` stands for.
pub(crate) const MAX_VCPUS: u32 = 64;

/// A scenario's `vcpus`: a fixed count, or the host's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(try_from = "VcpusJson", into = "VcpusJson")]
pub(crate) enum Vcpus {
    /// `vcpus N`.
    Fixed(u32),
    /// `vcpus host` (no maximum but [`MAX_VCPUS`]) or `vcpus host:MAX`:
    /// as many as the host has cores the lab may use, at most MAX.
    Host { max: Option<u32> },
}

/// How a scenario document writes [`Vcpus`]: a number, or `"host"` or
/// `"host:MAX"`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
enum VcpusJson {
    Count(u32),
    Host(#[schemars(regex(pattern = r"^host(:[0-9]+)?$"))] String),
}

impl Vcpus {
    /// The vCPUs a boot gets on a host whose lab may use `usable_cores`
    /// CPUs: the fixed count, or that many cores at most MAX (at least 1).
    pub(crate) fn resolve(self, usable_cores: u32) -> u32 {
        match self {
            Vcpus::Fixed(n) => n,
            Vcpus::Host { max } => usable_cores.min(max.unwrap_or(MAX_VCPUS)).max(1),
        }
    }

    /// Does the count follow the host?
    pub(crate) fn follows_host(self) -> bool {
        matches!(self, Vcpus::Host { .. })
    }
}

impl fmt::Display for Vcpus {
    /// As a scenario file writes it: `16`, `host`, `host:16`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Vcpus::Fixed(n) => write!(f, "{n}"),
            Vcpus::Host { max: None } => f.write_str("host"),
            Vcpus::Host { max: Some(m) } => write!(f, "host:{m}"),
        }
    }
}

impl TryFrom<VcpusJson> for Vcpus {
    type Error = String;
    fn try_from(j: VcpusJson) -> Result<Vcpus, String> {
        let host_max = |s: &str| match s.strip_prefix("host") {
            Some("") => Some(None),
            Some(rest) => rest
                .strip_prefix(':')?
                .parse::<u32>()
                .ok()
                .filter(|m| (1..=MAX_VCPUS).contains(m))
                .map(Some),
            None => None,
        };
        match j {
            VcpusJson::Count(n) => Ok(Vcpus::Fixed(n)),
            VcpusJson::Host(s) => host_max(&s)
                .map(|max| Vcpus::Host { max })
                .ok_or_else(|| format!("vcpus {s:?}: want a number, \"host\" or \"host:MAX\"")),
        }
    }
}

impl From<Vcpus> for VcpusJson {
    fn from(v: Vcpus) -> VcpusJson {
        match v {
            Vcpus::Fixed(n) => VcpusJson::Count(n),
            host => VcpusJson::Host(host.to_string()),
        }
    }
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
    /// Guest vCPUs, when the scenario says: a count, or the host's
    /// usable cores up to a maximum (`"host"`, `"host:MAX"`), as written.
    #[serde(default)]
    pub(crate) vcpus: Option<Vcpus>,
    /// Guest memory (QEMU syntax: 1G, 2048M), when the scenario fixes it;
    /// with `memory_per_vcpu`, the memory of 2 vCPUs or fewer.
    #[serde(default)]
    pub(crate) memory: Option<String>,
    /// Guest memory added for every vCPU beyond 2 (QEMU syntax), when the
    /// scenario's memory grows with its vCPUs.
    #[serde(default)]
    pub(crate) memory_per_vcpu: Option<String>,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_vcpus_resolve_to_the_usable_cores_up_to_the_maximum() {
        let host = |max| Vcpus::Host { max };
        for (v, cores, want) in [
            (Vcpus::Fixed(4), 2, 4),
            (Vcpus::Fixed(4), 64, 4),
            (host(Some(16)), 2, 2),
            (host(Some(16)), 16, 16),
            (host(Some(16)), 64, 16),
            (host(Some(48)), 16, 16),
            (host(None), 2, 2),
            (host(None), 64, 64),
            (host(None), 200, MAX_VCPUS),
            (host(Some(8)), 0, 1),
        ] {
            assert_eq!(v.resolve(cores), want, "{v} on {cores} cores");
        }
        assert!(host(None).follows_host() && !Vcpus::Fixed(2).follows_host());
    }

    #[test]
    fn vcpus_are_written_as_the_scenario_wrote_them_and_old_documents_read() {
        let host = |max| Vcpus::Host { max };
        for (v, json) in [
            (Vcpus::Fixed(2), serde_json::json!(2)),
            (host(None), serde_json::json!("host")),
            (host(Some(16)), serde_json::json!("host:16")),
        ] {
            assert_eq!(serde_json::to_value(v).unwrap(), json);
            assert_eq!(serde_json::from_value::<Vcpus>(json).unwrap(), v);
        }
        for bad in ["host:0", "host:65", "hosts", "host:", "2"] {
            assert!(
                serde_json::from_value::<Vcpus>(serde_json::json!(bad)).is_err(),
                "{bad}"
            );
        }
        // A run.json from before `vcpus host` and `memory_per_vcpu`.
        let old: Scenario = serde_json::from_value(serde_json::json!({
            "name": "s", "description": null, "disks": 1, "queues": 2, "vcpus": 2,
            "memory": "1G", "queue_size": 256, "variants": []
        }))
        .unwrap();
        assert_eq!(old.vcpus, Some(Vcpus::Fixed(2)));
        assert_eq!(old.memory_per_vcpu, None);
    }
}
