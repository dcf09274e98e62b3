//! The guest's result document of one variant (`blklab-guest-result/1`,
//! written by guest-scripts/lib/result.awk; docs/lab-protocol.md §3), as a
//! record's `guest` field.
//!
//! What blklab reads is typed. What it only carries is kept as the guest
//! wrote it: mpstat's and fio's own JSON beyond the fields the report uses
//! (`other` maps and [`GuestResult::mpstat`]), and any field a newer guest
//! adds (`other`), so a record holds the guest's document whole.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Number, Value};

/// The schema version the guest scripts write.
pub(crate) const GUEST_SCHEMA: &str = "blklab-guest-result/1";

/// Fields this blklab does not model, kept as written.
pub(crate) type Other = BTreeMap<String, Value>;

/// The guest's document.
///
/// Measurement fields are null when the variant failed before its window
/// closed; trimmed recordings (tests/fixtures) keep only what the report
/// reads, so everything but `ok` may be absent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct GuestResult {
    /// [`GUEST_SCHEMA`]; absent when the lab stood in for a document that
    /// did not parse (see `raw`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) schema: Option<String>,
    #[serde(default)]
    pub(crate) scenario: Option<String>,
    #[serde(default)]
    pub(crate) variant: Option<String>,
    #[serde(default)]
    pub(crate) ok: bool,
    /// Every error of the variant, joined by `; `.
    #[serde(default)]
    pub(crate) error: Option<String>,
    /// `uname -r`.
    #[serde(default)]
    pub(crate) kernel: Option<String>,
    /// Online CPUs.
    #[serde(default)]
    pub(crate) nr_cpus: Option<u32>,
    /// The guest's clocksource at the variant's end (`tsc`, `kvm-clock`,
    /// `hpet`, …: `/sys/devices/system/clocksource/clocksource0/current_clocksource`);
    /// null from guests that did not say.
    #[serde(default)]
    pub(crate) clocksource: Option<String>,
    #[serde(default)]
    pub settings: Option<GuestSettings>,
    /// fio's command line (null when fio did not run).
    #[serde(default)]
    fio_cmdline: Option<Vec<String>>,
    /// The target devices.
    #[serde(default)]
    pub(crate) devices: Option<Vec<String>>,
    /// Queue settings read back before fio, by device.
    #[serde(default)]
    pub(crate) queue: Option<BTreeMap<String, QueueSettings>>,
    /// A stack's maps (`stack multipath`), by the device fio ran on (null
    /// without a stack).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) paths: Option<BTreeMap<String, StackMap>>,
    /// The path devices' queue settings read back before fio (null without
    /// a stack).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    path_queue: Option<BTreeMap<String, QueueSettings>>,
    /// From /proc/uptime, before → after snapshot.
    #[serde(default)]
    wall_seconds: Option<f64>,
    #[serde(default)]
    pub cpu: Option<GuestCpu>,
    /// /proc/stat `ctxt` delta.
    #[serde(default)]
    pub(crate) context_switches: Option<i64>,
    /// /proc/stat `processes` delta.
    #[serde(default)]
    pub(crate) processes: Option<i64>,
    #[serde(default)]
    pub interrupts: Option<Interrupts>,
    /// /proc/softirqs deltas, summed over CPUs.
    #[serde(default)]
    softirqs: Option<BTreeMap<String, i64>>,
    /// /sys/block/X/stat deltas, by device.
    #[serde(default)]
    pub block: Option<BTreeMap<String, BlockDelta>>,
    /// blk-mq's debugfs attributes per hardware queue (absent from
    /// documents of guest scripts older than the section).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) blk_mq: Option<BlkMq>,
    /// What the guest counted at each edge of the window between its
    /// snapshot (right before the SYNC line) and its read after the host's
    /// reply: the host sampled in between, so the host's window differs
    /// from the guest's by at most these counts at each edge. Null without
    /// SYNC; absent from documents of guest scripts older than the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync_edges: Option<SyncEdges>,
    /// `mpstat -P ALL -o JSON` over the window, as mpstat printed it (or
    /// null): carried for people, read by nothing.
    #[serde(default)]
    pub(crate) mpstat: Option<Value>,
    #[serde(default)]
    fio_rc: Option<i64>,
    /// fio's stdout/stderr and notes before its JSON, or null.
    #[serde(default)]
    fio_log: Option<String>,
    /// fio's JSON output (null when fio wrote none that parsed).
    #[serde(default)]
    pub fio: Option<FioOutput>,
    /// The lab's stand-in for a document that did not parse: its text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) raw: Option<String>,
    #[serde(flatten)]
    pub(crate) other: Other,
}

impl GuestResult {
    /// The lab's stand-in for a result whose text did not parse.
    pub(crate) fn unparsable(error: String, raw: String) -> GuestResult {
        GuestResult {
            ok: false,
            error: Some(error),
            raw: Some(raw),
            ..GuestResult::default()
        }
    }

    /// Did the variant run on the host's virtio disks (true when the
    /// document does not say)?
    pub(crate) fn target_virtio(&self) -> bool {
        self.settings
            .as_ref()
            .map_or(true, |s| s.target == "virtio")
    }
}

/// One map of a variant's dm stack.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct StackMap {
    /// The dm name (`blklab-mpathN`).
    pub(crate) map: String,
    /// dm-multipath's path selector.
    pub(crate) selector: String,
    /// The target devices that are its paths.
    pub(crate) paths: Vec<String>,
}

/// The settings a variant ran with: overrides applied, `@NCPU@` replaced.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct GuestSettings {
    /// `virtio`, `scsi_debug` or `null_blk`.
    pub target: String,
    #[serde(default)]
    target_params: Vec<String>,
    /// The dm stack on the targets (`multipath`), null without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) stack: Option<String>,
    #[serde(default)]
    stack_params: Vec<String>,
    #[serde(default)]
    pub(crate) sched: Option<String>,
    #[serde(default)]
    pub(crate) nr_requests: Option<u64>,
    /// SCSI `device/queue_depth` the variant set.
    #[serde(default)]
    pub(crate) queue_depth: Option<u64>,
    #[serde(default)]
    pub(crate) nomerges: Option<u64>,
    #[serde(default)]
    pub(crate) rq_affinity: Option<u64>,
    /// fio's job layout: `all` or `per-disk`.
    #[serde(default)]
    pub(crate) layout: Option<String>,
    #[serde(default)]
    pub(crate) runtime: Option<u64>,
    #[serde(default)]
    pub(crate) ramp: Option<u64>,
    #[serde(default)]
    pub(crate) fio_args: Vec<String>,
    #[serde(flatten)]
    pub(crate) other: Other,
}

/// One device's queue settings, read back before fio.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct QueueSettings {
    #[serde(default)]
    pub(crate) scheduler: Option<String>,
    #[serde(default)]
    pub(crate) nr_requests: Option<u64>,
    #[serde(default)]
    hw_queues: Option<u64>,
    /// SCSI: device/queue_depth.
    #[serde(default)]
    device_queue_depth: Option<u64>,
    #[serde(default)]
    pub(crate) nomerges: Option<u64>,
    #[serde(default)]
    pub(crate) rq_affinity: Option<u64>,
    #[serde(flatten)]
    pub(crate) other: Other,
}

/// mpstat's reduction of /proc/stat deltas, in percent (two decimals).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct CpuPercent {
    pub(crate) usr: f64,
    pub(crate) nice: f64,
    pub(crate) sys: f64,
    pub(crate) iowait: f64,
    pub(crate) irq: f64,
    pub(crate) soft: f64,
    pub(crate) steal: f64,
    pub(crate) guest: f64,
    pub(crate) gnice: f64,
    pub(crate) idle: f64,
    /// 100 − idle.
    pub(crate) busy: f64,
}

impl CpuPercent {
    /// The ten components (all but `busy`): 100 within rounding.
    pub(crate) fn components(&self) -> [f64; 10] {
        [
            self.usr,
            self.nice,
            self.sys,
            self.iowait,
            self.irq,
            self.soft,
            self.steal,
            self.guest,
            self.gnice,
            self.idle,
        ]
    }
}

/// One CPU's row.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct CpuRow {
    pub(crate) cpu: u32,
    #[serde(flatten)]
    pub(crate) percent: CpuPercent,
}

/// Guest CPU over the window.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct GuestCpu {
    /// The CPUs present in both samples, summed.
    pub(crate) all: CpuPercent,
    #[serde(default)]
    pub(crate) per_cpu: Vec<CpuRow>,
    /// Total jiffies over all CPUs in the window.
    #[serde(default)]
    pub(crate) ticks: Option<u64>,
}

/// USER_HZ: the unit of /proc/stat on every Linux architecture blklab runs.
const USER_HZ: f64 = 100.0;

impl GuestCpu {
    /// CPU-seconds (all CPUs) that `percent` of the window stands for:
    /// `all.busy` gives the busy seconds, `all.idle` the idle ones.
    pub(crate) fn seconds(&self, percent: f64) -> Option<f64> {
        Some(percent / 100.0 * self.ticks? as f64 / USER_HZ)
    }
}

/// Interrupt deltas.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Interrupts {
    /// /proc/stat `intr` first field delta.
    pub(crate) total: i64,
    /// Numbered lines whose text contains "virtio", "scsi" or "nullb".
    #[serde(default)]
    pub(crate) lines: Vec<IrqLine>,
    /// The named lines (IPIs, timer, …), summed over CPUs.
    #[serde(default)]
    pub arch: BTreeMap<String, i64>,
}

impl Interrupts {
    /// The IPIs the guest's CPUs received: `RES` (reschedule) + `CAL`
    /// (function call, single and many) + `IWI` (irq work, a self-IPI).
    /// `TLB` is not added: it counts the remote TLB flushes a CPU ran,
    /// each inside a `CAL` IPI's function calls (or from the idle loop,
    /// without an IPI), so an IPI that flushed is in both lines.
    pub fn ipis(&self) -> i64 {
        ipis(&self.arch)
    }
}

/// `RES + CAL + IWI` of named interrupt lines (see [`Interrupts::ipis`]).
fn ipis(arch: &BTreeMap<String, i64>) -> i64 {
    ["RES", "CAL", "IWI"]
        .iter()
        .filter_map(|k| arch.get(*k))
        .sum()
}

/// The guest's counts at the edges of its window (see
/// [`GuestResult::sync_edges`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SyncEdges {
    /// From the before-snapshot to the begin SYNC's reply.
    #[serde(default)]
    pub begin: Option<SyncEdge>,
    /// From the after-snapshot to the end SYNC's reply (null when it got
    /// no reply).
    #[serde(default)]
    pub end: Option<SyncEdge>,
}

/// What the guest counted from its snapshot to its read after a SYNC reply.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SyncEdge {
    /// /proc/uptime's delta.
    pub(crate) seconds: f64,
    /// /proc/stat `ctxt` delta.
    pub(crate) context_switches: i64,
    /// /proc/stat `intr` first field delta.
    pub(crate) interrupts: i64,
    /// The named interrupt lines' deltas, summed over CPUs.
    #[serde(default)]
    pub arch: BTreeMap<String, i64>,
}

impl SyncEdge {
    /// The IPIs received in the edge (as [`Interrupts::ipis`]).
    pub fn ipis(&self) -> i64 {
        ipis(&self.arch)
    }
}

/// One numbered interrupt line, summed over CPUs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct IrqLine {
    pub(crate) irq: String,
    /// The line's last word.
    pub(crate) name: String,
    pub(crate) count: i64,
}

/// One device's /sys/block/X/stat deltas (`in_flight`: the after value);
/// only the fields the kernel has.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct BlockDelta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) read_ios: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    read_merges: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    read_sectors: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    read_ticks: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) write_ios: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    write_merges: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    write_sectors: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    write_ticks: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) in_flight: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    io_ticks: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    time_in_queue: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    discard_ios: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    discard_merges: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    discard_sectors: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    discard_ticks: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    flush_ios: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    flush_ticks: Option<i64>,
}

impl BlockDelta {
    /// Reads, writes and discards completed (the IOs a per-IO cost divides
    /// by; counters that went backwards count as absent).
    pub fn ios(&self) -> u64 {
        [self.read_ios, self.write_ios, self.discard_ios]
            .into_iter()
            .flatten()
            .filter_map(|n| u64::try_from(n).ok())
            .sum()
    }
}

/// blk-mq's debugfs view of the target devices' hardware queues
/// (`/sys/kernel/debug/block/DEV/hctxN/`), before and after the window:
/// counters as deltas, gauges as both values. Which attributes a kernel has
/// differs (`attributes`); a missing one is null.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct BlkMq {
    /// Why debugfs could not be read (no CONFIG_BLK_DEBUG_FS, mount failed).
    #[serde(default)]
    pub(crate) error: Option<String>,
    /// The attributes blklab reads that this kernel has (of `dispatched`,
    /// `queued`, `run`, `dispatch_busy`, `active`, `tags`, `sched_tags`).
    #[serde(default)]
    pub(crate) attributes: Vec<String>,
    /// By device.
    #[serde(default)]
    pub(crate) devices: BTreeMap<String, BlkMqDevice>,
    /// The counters summed over every device's hardware queues.
    #[serde(default)]
    pub(crate) sum: BlkMqCounters,
    #[serde(flatten)]
    pub(crate) other: Other,
}

/// One device's hardware queues.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct BlkMqDevice {
    /// The hardware queues present in both snapshots, by number.
    #[serde(default)]
    pub(crate) hctx: Vec<Hctx>,
    /// The counters summed over the device's hardware queues.
    #[serde(default)]
    pub(crate) sum: BlkMqCounters,
    #[serde(flatten)]
    pub(crate) other: Other,
}

/// blk-mq's per-hardware-queue counters over the window (deltas; null
/// where the kernel has no such attribute). 5.10 has all three, 6.1 only
/// `run`, 6.12 none.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct BlkMqCounters {
    /// `queued`: requests allocated on the hardware queue
    /// (`blk_mq_rq_ctx_init`).
    #[serde(default)]
    pub(crate) queued: Option<i64>,
    /// `run`: hardware queue runs that reached dispatch
    /// (`blk_mq_sched_dispatch_requests` calls), inline and from kblockd.
    #[serde(default)]
    pub(crate) run: Option<i64>,
    /// `dispatched`: `blk_mq_dispatch_rq_list` calls by how many requests
    /// each queued to the driver; the kernel's bucket label (`"0"`, `"1"`,
    /// `"2"`, `"4"`, … `"32+"`) → calls.
    #[serde(default)]
    pub(crate) dispatched: Option<BTreeMap<String, i64>>,
}

impl BlkMqCounters {
    /// `blk_mq_dispatch_rq_list` calls (all buckets).
    pub(crate) fn dispatch_calls(&self) -> Option<i64> {
        Some(self.dispatched.as_ref()?.values().sum())
    }
}

/// A gauge read before and after the window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Gauge {
    pub(crate) before: i64,
    pub(crate) after: i64,
}

/// One hardware queue.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Hctx {
    /// N of `hctxN`.
    pub(crate) hctx: u32,
    #[serde(flatten)]
    pub(crate) counters: BlkMqCounters,
    /// `dispatch_busy`: the EWMA of "the driver was busy" over dispatches
    /// (0 … 16; not a count).
    #[serde(default)]
    pub(crate) dispatch_busy: Option<Gauge>,
    /// `active`: requests in flight counted for tag fairness (shared tag
    /// sets only; 0 otherwise).
    #[serde(default)]
    pub(crate) active: Option<Gauge>,
    /// `tags`: the driver tag set.
    #[serde(default)]
    pub(crate) tags: Option<TagsGauge>,
    /// `sched_tags`: the scheduler's tag set (null without a scheduler).
    #[serde(default)]
    pub(crate) sched_tags: Option<TagsGauge>,
}

/// A tag set's state before and after the window.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct TagsGauge {
    pub(crate) before: TagState,
    pub(crate) after: TagState,
}

/// A tag set as debugfs shows it: the set's `nr_tags`, `nr_reserved_tags`,
/// `active_queues`, and its sbitmap queue's `depth`, `busy` (tags in use),
/// `wake_batch`, `ws_active` (waiters for a tag).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct TagState {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    nr_tags: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    nr_reserved_tags: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) active_queues: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) depth: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) busy: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) wake_batch: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ws_active: Option<i64>,
}

/// fio's JSON output: the jobs' per-direction results are typed, the rest
/// is kept as fio wrote it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FioOutput {
    #[serde(default)]
    pub(crate) jobs: Vec<FioJob>,
    #[serde(flatten)]
    pub(crate) other: Other,
}

impl FioOutput {
    /// Total IOs over the jobs, reads, writes and trims.
    pub(crate) fn total_ios(&self) -> u64 {
        self.jobs
            .iter()
            .flat_map(FioJob::directions)
            .filter_map(|d| d.total_ios)
            .sum()
    }

    /// IOPS over the jobs, all directions.
    pub(crate) fn iops(&self) -> f64 {
        self.jobs
            .iter()
            .flat_map(FioJob::directions)
            .filter_map(|d| d.iops)
            .sum()
    }
}

/// One fio job (with `--group_reporting`, the group).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct FioJob {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) read: Option<FioDirection>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) write: Option<FioDirection>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) trim: Option<FioDirection>,
    #[serde(flatten)]
    pub(crate) other: Other,
}

impl FioJob {
    /// The directions the job has: read, write, trim.
    pub(crate) fn directions(&self) -> impl Iterator<Item = &FioDirection> {
        [&self.read, &self.write, &self.trim].into_iter().flatten()
    }

    /// The direction with most IOs (the last of read, write, trim on a tie;
    /// one without a count counts 0).
    pub(crate) fn busiest(&self) -> Option<&FioDirection> {
        [&self.read, &self.write, &self.trim]
            .into_iter()
            .max_by_key(|d| d.as_ref().and_then(|d| d.total_ios).unwrap_or(0))?
            .as_ref()
    }
}

/// One direction of a fio job.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct FioDirection {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) iops: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) total_ios: Option<u64>,
    /// Completion latency.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) clat_ns: Option<FioLatency>,
    #[serde(flatten)]
    pub(crate) other: Other,
}

impl FioDirection {
    /// The completion-latency percentile `pct` (fio's key, e.g.
    /// `"99.000000"`), ns.
    pub(crate) fn clat_percentile_ns(&self, pct: &str) -> Option<f64> {
        self.clat_ns.as_ref()?.percentile.get(pct)?.as_f64()
    }
}

/// A fio latency distribution.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct FioLatency {
    /// Percentile (fio's key, e.g. `"50.000000"`) → value, ns.
    #[serde(default)]
    pub(crate) percentile: BTreeMap<String, Number>,
    #[serde(flatten)]
    pub(crate) other: Other,
}
