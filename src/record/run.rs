//! `run.json`: what one `blklab run` was (schema [`RUN_SCHEMA`]): the
//! build, the command line, the accelerator and why, the host, QEMU, the
//! kernels, the scenarios as run and the boot order.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use crate::record::parallelism::HostParallelism;
use crate::record::scenario::Scenario;
use crate::record::Document;

/// The schema version of [`RunDocument`].
pub(crate) const RUN_SCHEMA: &str = "blklab-run/1";

/// The accelerator QEMU runs the guest with (`--accel`; a record holds
/// `kvm`, `tcg` or `nested`, never `auto`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Accel {
    /// KVM when a real probe boots a guest under it, else TCG.
    Auto,
    Kvm,
    Tcg,
    /// KVM, nested in TCG: the guests run under real KVM inside an
    /// emulated host (TCG with AMD SVM) that runs the lab, the backend and
    /// QEMU; the host's instructions are counted too.
    Nested,
}

impl Accel {
    /// How reports name it.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Accel::Auto => "auto",
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
            Accel::Nested => "kvm, nested in tcg",
        }
    }
}

/// The image recipes' `manifest.json` files of a guest (docs/lab-protocol.md
/// §1), as images/ wrote them (null when absent or unreadable). blklab reads
/// nothing in them: they are the images' contract, recorded for people.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Manifests {
    #[serde(default)]
    pub(crate) kernel: Option<Value>,
    #[serde(default)]
    pub(crate) initramfs: Option<Value>,
}

/// What the host is (for the report's "what differs besides the kernel").
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct HostInfo {
    pub(crate) hostname: Option<String>,
    /// The host kernel's release.
    pub(crate) kernel: Option<String>,
    pub(crate) cpus: Option<usize>,
    pub(crate) cpu_model: Option<String>,
}

/// The QEMU binary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct QemuInfo {
    pub(crate) path: String,
    /// The first line of `qemu --version`.
    pub(crate) version: Option<String>,
}

/// One kernel of the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct KernelEntry {
    /// The label records and reports use (unique in the run).
    pub label: String,
    /// The `--kernel` SPEC.
    pub(crate) spec: String,
    pub(crate) kernel: PathBuf,
    pub(crate) initramfs: PathBuf,
    #[serde(default)]
    pub(crate) manifests: Manifests,
}

/// One boot, in the order they ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct BootOrder {
    pub(crate) kernel: String,
    pub scenario: String,
    pub(crate) iteration: u32,
    /// The variants this boot ran (a scenario whose variants differ in
    /// device settings runs in several boots).
    #[serde(default)]
    pub variants: Vec<String>,
    /// The guest machine and disks of the boot.
    #[serde(default)]
    pub(crate) machine: Option<crate::record::machine::Machine>,
}

/// `blklab run --shard I/N`: which slice of which plan this run is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct ShardInfo {
    /// 1-based.
    pub(crate) index: u32,
    pub(crate) count: u32,
    /// Every boot of the whole run, in order (this shard's are `order`).
    /// Shards merge (`blklab compare DIR,DIR,...`) only with the same plan.
    pub(crate) plan: Vec<BootOrder>,
}

/// Instruction counting (`--count-insns`): the TCG plugin and how windows
/// are taken.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct InsnsSetup {
    pub(crate) plugin: PathBuf,
    pub(crate) window: String,
}

fn run_schema_pattern() -> String {
    crate::util::schema::pattern(RUN_SCHEMA)
}

fn check_run_schema<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    crate::util::schema::deserialize(d, RUN_SCHEMA)
}

/// `run.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "blklab run document (run.json)")]
pub struct RunDocument {
    /// [`RUN_SCHEMA`].
    #[serde(deserialize_with = "check_run_schema")]
    #[schemars(pattern(run_schema_pattern()))]
    pub(crate) schema: String,
    /// The run's identity: every record of the run carries it
    /// ([`RunRef`]); absent from runs older than the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) run_id: Option<String>,
    /// Seconds since the Unix epoch.
    pub(crate) started_unix: f64,
    pub(crate) blklab_version: String,
    /// The git commit blklab was built from.
    pub(crate) git_commit: String,
    pub(crate) command_line: Vec<String>,
    pub(crate) accel: Accel,
    /// Why this accelerator.
    pub(crate) accel_reason: String,
    /// `--deterministic` (absent from runs older than the option: false).
    #[serde(default)]
    pub(crate) deterministic: bool,
    /// Null without instruction counts.
    #[serde(default)]
    pub(crate) count_insns: Option<InsnsSetup>,
    pub(crate) host: HostInfo,
    /// The host's cores as the lab (and so QEMU) saw them and how QEMU ran
    /// the vCPUs: with each boot's vCPUs, how many could run at once
    /// (absent from runs older than the field: unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) parallelism: Option<HostParallelism>,
    pub(crate) qemu: QemuInfo,
    pub kernels: Vec<KernelEntry>,
    pub scenarios: Vec<Scenario>,
    pub(crate) iterations: u32,
    pub order: Vec<BootOrder>,
    /// `--shard I/N` (null: the whole run).
    #[serde(default)]
    pub(crate) shard: Option<ShardInfo>,
    /// `--accel nested`: the emulated host the guests ran in (absent
    /// otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) nested_host: Option<NestedHostInfo>,
}

/// The emulated host of a nested run: its image, its machine under TCG,
/// and the QEMU inside it (the outer one's binary).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct NestedHostInfo {
    pub(crate) kernel: PathBuf,
    pub(crate) initramfs: PathBuf,
    /// The image recipe's manifest (null when absent).
    #[serde(default)]
    pub(crate) manifest: Option<Value>,
    /// QEMU's `-cpu` for the host.
    pub(crate) cpu: String,
    pub(crate) vcpus: u32,
    /// How QEMU ran the host's vCPUs (`-accel tcg,thread=`): `multi`, a
    /// thread each, or `single`, one thread for all (`--host-tcg`); null in
    /// runs older than the option (multi).
    #[serde(default)]
    pub(crate) tcg_threads: Option<String>,
    /// Both NUMA nodes' memory.
    pub(crate) memory_mib: u64,
    /// Node 1's memory (no vCPUs): the host's huge pages, which its guests'
    /// RAM is made of, and their overhead.
    #[serde(default)]
    pub(crate) guest_node_mib: Option<u64>,
    /// 2 MiB huge pages on node 1.
    #[serde(default)]
    pub(crate) huge_pages: Option<u64>,
    /// What the inner guests' RAM is: `huge pages on node 1` (counting
    /// instructions: the plugin tells the levels apart by address) or
    /// `memfd` (as on a user's host); null in older runs.
    #[serde(default)]
    pub(crate) guest_ram: Option<String>,
    /// The inner lab's `--accel`: `auto` (the KVM probe) or `kvm`.
    #[serde(default)]
    pub(crate) inner_accel: Option<Accel>,
    /// A second VM ran beside the lab's guests (`--nested-neighbour`).
    #[serde(default)]
    pub(crate) neighbour: bool,
}

impl RunDocument {
    /// The run-wide conditions its records were measured under.
    pub(crate) fn conditions(&self) -> RunConditions {
        RunConditions {
            accel_reason: self.accel_reason.clone(),
            deterministic: self.deterministic,
            count_insns: self.count_insns.is_some(),
            qemu_version: self.qemu.version.clone(),
            blklab_version: self.blklab_version.clone(),
            git_commit: self.git_commit.clone(),
            parallelism: self.parallelism.clone(),
        }
    }

    /// What a record of this run carries to say so.
    pub(crate) fn run_ref(&self) -> Option<RunRef> {
        Some(RunRef {
            id: self.run_id.clone()?,
            shard: self.shard.as_ref().map(|s| ShardRef {
                index: s.index,
                count: s.count,
            }),
        })
    }
}

/// What every record of a run carries of its run.json.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RunStamp {
    pub(crate) run: Option<RunRef>,
    pub(crate) conditions: RunConditions,
}

impl RunDocument {
    /// What its records carry of it.
    pub(crate) fn stamp(&self) -> RunStamp {
        RunStamp {
            run: self.run_ref(),
            conditions: self.conditions(),
        }
    }
}

/// Which run a record belongs to: its run.json's `run_id`, and the shard
/// (`--shard I/N`) that measured it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct RunRef {
    pub(crate) id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) shard: Option<ShardRef>,
}

/// `--shard I/N` of a record's run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct ShardRef {
    /// 1-based.
    pub(crate) index: u32,
    pub(crate) count: u32,
}

/// The run-wide conditions that change a record's numbers, copied from
/// run.json into each record, so that a record copied into another run's
/// directory still says what it was measured under.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct RunConditions {
    /// Why the accelerator (run.json's `accel_reason`).
    pub(crate) accel_reason: String,
    /// `--deterministic`.
    pub(crate) deterministic: bool,
    /// Guest instructions counted (the plugin costs the vCPUs time).
    pub(crate) count_insns: bool,
    /// The first line of `qemu --version`.
    pub(crate) qemu_version: Option<String>,
    pub(crate) blklab_version: String,
    pub(crate) git_commit: String,
    /// The host's cores and how QEMU ran the vCPUs (run.json's
    /// `parallelism`; absent from records older than the field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) parallelism: Option<HostParallelism>,
}

/// A new run's identity: its start (`YYYYmmdd-HHMMSS` UTC) and 32 random
/// bits, so that two runs started in the same second differ.
pub(crate) fn new_run_id(started_unix: f64) -> String {
    let stamp = crate::util::wallclock::utc_stamp_of(started_unix as i64);
    format!("{stamp}-{:08x}", rand::random::<u32>())
}

impl Document for RunDocument {
    const SCHEMA: &'static str = RUN_SCHEMA;
    const NAME: &'static str = "run";
}
