//! One result record, `KERNEL.SCENARIO.VARIANT.NN.json` (schema
//! [`RESULT_SCHEMA`]): one variant of one boot, the guest's document with
//! the backend's and the host's view of the same window.

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize};

use crate::device::config::DiskConfig;
use crate::record::guest::GuestResult;
use crate::record::instructions::{HostInstructions, Instructions};
use crate::record::kvm::KvmWindow;
use crate::record::machine::{Machine, Override};
use crate::record::parallelism::Parallelism;
use crate::record::run::{Accel, Manifests, RunConditions, RunRef};
use crate::record::scenario::Variant;
use crate::record::Document;
use crate::stats::queue::StatsDocument;
use crate::util::hostcpu::ProcessCpu;

/// The schema version of [`ResultRecord`].
pub(crate) const RESULT_SCHEMA: &str = "blklab-run-result/1";

/// Consistency of one record: fio's IO count against the guest block
/// layer's and the backend's, and the guest CPU percentages' sum. Null
/// where a side has no count (or, for the backend, the target is not the
/// virtio disks; for fio, the variant has a ramp, whose IOs fio leaves
/// out).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Checks {
    #[serde(default)]
    pub(crate) fio_ios: Option<u64>,
    #[serde(default)]
    pub(crate) guest_block_ios: Option<u64>,
    #[serde(default)]
    backend_ios: Option<u64>,
    #[serde(default)]
    fio_equals_guest_block: Option<bool>,
    #[serde(default)]
    fio_equals_backend: Option<bool>,
    #[serde(default)]
    guest_block_equals_backend: Option<bool>,
    #[serde(default)]
    guest_cpu_percent_sum: Option<f64>,
    /// A frontend connected to one of the backend's disks during the
    /// window (a disk's connection generation changed): the backend's
    /// counters span more than one connection's device, whose rings,
    /// latency sequences and fault schedules started over. Null without a
    /// backend document, or one older than the generation. (The daemon's
    /// instance cannot change within a window: the lab serves its disks in
    /// process, one server per boot, named by the document's `daemon`.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) backend_reconnected: Option<bool>,
}

impl Checks {
    /// The checks of a guest document against the backend's document of
    /// the same window.
    pub(crate) fn of(guest: &GuestResult, backend: Option<&StatsDocument>) -> Checks {
        let target_virtio = guest.target_virtio();
        let block_ios = guest
            .block
            .as_ref()
            .map(|m| m.values().map(|d| d.ios()).sum::<u64>());
        let backend_ios = backend
            .map(|b| b.sum(|c| c.reads + c.writes + c.discards + c.write_zeroes))
            .filter(|_| target_virtio);
        // With a ramp, fio leaves the ramp's IOs out of its counts while the
        // block layer and the backend see them: the counts are not comparable.
        let ramp = guest.settings.as_ref().and_then(|s| s.ramp).unwrap_or(0);
        let fio_ios = guest
            .fio
            .as_ref()
            .map(|f| f.total_ios())
            .filter(|_| ramp == 0);
        let same = |a: Option<u64>, b: Option<u64>| Some(a? == b?);
        Checks {
            fio_ios,
            guest_block_ios: block_ios,
            backend_ios,
            fio_equals_guest_block: same(fio_ios, block_ios),
            fio_equals_backend: same(fio_ios, backend_ios),
            guest_block_equals_backend: same(block_ios, backend_ios),
            guest_cpu_percent_sum: guest.cpu.as_ref().map(|c| c.all.components().iter().sum()),
            backend_reconnected: backend.and_then(StatsDocument::reconnected),
        }
    }
}

/// The host's CPU over the window: QEMU's threads and blklab's own (the
/// in-process backend), grouped by role.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct HostWindow {
    /// Seconds from the begin SYNC to the end SYNC (absent from trimmed
    /// recordings).
    #[serde(default)]
    pub(crate) wall_s: Option<f64>,
    /// Null when a sample failed.
    #[serde(default)]
    pub(crate) qemu: Option<ProcessCpu>,
    #[serde(default)]
    pub(crate) blklab: Option<ProcessCpu>,
    /// /proc/loadavg at the end.
    #[serde(default)]
    pub(crate) loadavg: Option<String>,
}

impl HostWindow {
    /// The process's groups whose name starts with `prefix`: the sum of
    /// `field` (`None` without the process).
    pub(crate) fn group_sum(
        &self,
        process: &str,
        prefix: &str,
        field: impl Fn(&crate::util::hostcpu::CpuSeconds) -> f64,
    ) -> Option<f64> {
        let p = match process {
            "qemu" => self.qemu.as_ref(),
            "blklab" => self.blklab.as_ref(),
            _ => None,
        }?;
        Some(
            p.groups
                .iter()
                .filter(|(k, _)| k.starts_with(prefix))
                .map(|(_, g)| field(g))
                .sum(),
        )
    }
}

fn result_schema_pattern() -> String {
    crate::util::schema::pattern(RESULT_SCHEMA)
}

fn check_result_schema<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    crate::util::schema::deserialize(d, RESULT_SCHEMA)
}

/// One result record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "blklab run result record (KERNEL.SCENARIO.VARIANT.NN.json)")]
pub struct ResultRecord {
    /// [`RESULT_SCHEMA`].
    #[serde(deserialize_with = "check_result_schema")]
    #[schemars(pattern(result_schema_pattern()))]
    pub(crate) schema: String,
    /// The run the record belongs to (absent from records older than the
    /// field: those belong to the run whose `order` lists their boot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) run: Option<RunRef>,
    /// The run-wide conditions it was measured under (absent from records
    /// older than the field: their run.json's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) run_conditions: Option<RunConditions>,
    /// The kernel's label in the run.
    pub kernel: String,
    /// Its `--kernel` SPEC.
    pub(crate) kernel_spec: String,
    pub scenario: String,
    pub variant: String,
    pub iteration: u32,
    /// The boot's position in the run's order.
    pub(crate) boot_seq: usize,
    /// The guest's verdict on the variant.
    pub(crate) ok: bool,
    /// Seconds since the Unix epoch (absent from trimmed recordings).
    #[serde(default)]
    pub(crate) finished_unix: Option<f64>,
    pub(crate) accel: Accel,
    pub(crate) qemu_command_line: Vec<String>,
    #[serde(default)]
    pub(crate) manifests: Manifests,
    /// The served disks' configurations.
    pub(crate) device: Vec<DiskConfig>,
    /// The guest machine (absent from records of blklab before scenarios
    /// pinned it).
    #[serde(default)]
    pub(crate) machine: Option<Machine>,
    /// Settings the command line changed from what the scenario pins.
    #[serde(default)]
    pub(crate) overridden: Vec<Override>,
    /// The host's cores, the guest's vCPUs and how many of them could run
    /// at once (absent from records older than the field: unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) parallelism: Option<Parallelism>,
    /// The variant as run (null if the guest ran one the host does not
    /// know).
    pub(crate) scenario_definition: Option<Variant>,
    pub(crate) checks: Checks,
    pub(crate) guest: GuestResult,
    /// The backend's stats document over the window (a snapshot delta;
    /// null when the window was not measured).
    pub backend: Option<StatsDocument>,
    /// Null when the window was not measured.
    pub host: Option<HostWindow>,
    /// With `--count-insns` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) instructions: Option<Instructions>,
    /// Under KVM only: KVM's vCPU statistics over the window (absent from
    /// TCG records and from records older than the field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) kvm: Option<KvmWindow>,
    /// Nested runs with `--count-insns` only: the host's instructions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) host_instructions: Option<HostInstructions>,
}

impl Document for ResultRecord {
    const SCHEMA: &'static str = RESULT_SCHEMA;
    const NAME: &'static str = "result";
}

/// A record for unit tests: `fields` over a minimal valid record.
#[cfg(test)]
pub(crate) fn test_record(fields: serde_json::Value) -> ResultRecord {
    let mut v = serde_json::json!({
        "schema": RESULT_SCHEMA, "kernel": "k", "kernel_spec": "k", "scenario": "s",
        "variant": "v", "iteration": 0, "boot_seq": 0, "ok": true, "accel": "tcg",
        "qemu_command_line": [], "device": [], "scenario_definition": null,
        "checks": {}, "guest": {}, "backend": null, "host": null,
    });
    for (k, x) in fields.as_object().expect("an object") {
        v[k] = x.clone();
    }
    serde_json::from_value(v).expect("a valid test record")
}

/// `cpu.all` for unit tests: `busy`, `sys` and `soft` as given, idle the
/// rest, usr the remainder.
#[cfg(test)]
pub(crate) fn test_cpu_all(busy: f64, sys: f64, soft: f64) -> serde_json::Value {
    serde_json::json!({
        "usr": busy - sys - soft, "nice": 0.0, "sys": sys, "iowait": 0.0, "irq": 0.0,
        "soft": soft, "steal": 0.0, "guest": 0.0, "gnice": 0.0, "idle": 100.0 - busy,
        "busy": busy,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn checks_compare_counts() {
        let guest: GuestResult = serde_json::from_value(json!({
            "settings": {"target": "virtio"},
            "fio": {"jobs": [{"read": {"total_ios": 10}, "write": {"total_ios": 5}, "trim": {"total_ios": 0}}]},
            "block": {"vda": {"read_ios": 10, "write_ios": 5}},
            "cpu": {"all": {"usr": 10.0, "nice": 0.0, "sys": 20.0, "iowait": 0.0, "irq": 0.0,
                             "soft": 5.0, "steal": 0.0, "guest": 0.0, "gnice": 0.0, "idle": 65.0,
                             "busy": 35.0}},
        }))
        .unwrap();
        let backend = StatsDocument::from_json(
            r#"{"disks": [{"queues": [
                {"counters": {"reads": 6, "writes": 5}}, {"counters": {"reads": 4, "writes": 0}}]}]}"#,
        )
        .unwrap();
        let c = Checks::of(&guest, Some(&backend));
        assert_eq!(c.fio_ios, Some(15));
        assert_eq!(c.guest_block_ios, Some(15));
        assert_eq!(c.backend_ios, Some(15));
        assert_eq!(c.fio_equals_backend, Some(true));
        assert_eq!(c.guest_block_equals_backend, Some(true));
        assert_eq!(c.guest_cpu_percent_sum, Some(100.0));
        // A document older than the connection generation says nothing.
        assert_eq!(c.backend_reconnected, None);
        let backend = StatsDocument::from_json(
            r#"{"disks": [{"queues": [{"counters": {"reads": 1, "writes": 0}}]}]}"#,
        )
        .unwrap();
        assert_eq!(
            Checks::of(&guest, Some(&backend)).fio_equals_backend,
            Some(false)
        );
        // Without the backend's window, or off the virtio disks: no backend count.
        let c = Checks::of(&guest, None);
        assert_eq!((c.backend_ios, c.fio_equals_backend), (None, None));
        let mut scsi = guest.clone();
        scsi.settings.as_mut().unwrap().target = "scsi_debug".into();
        assert_eq!(Checks::of(&scsi, Some(&backend)).backend_ios, None);
        // A ramp leaves fio's count out.
        let mut ramp = guest;
        ramp.settings.as_mut().unwrap().ramp = Some(1);
        let c = Checks::of(&ramp, Some(&backend));
        assert_eq!((c.fio_ios, c.fio_equals_guest_block), (None, None));
    }

    /// The check says whether a disk's connection generation moved during
    /// the window, on any disk.
    #[test]
    fn checks_say_when_the_backend_reconnected() {
        let guest: GuestResult =
            serde_json::from_value(json!({"settings": {"target": "virtio"}})).unwrap();
        let window = |gens: &[(u64, u64)]| {
            let disks: Vec<_> = gens
                .iter()
                .map(|(at_start, now)| {
                    json!({"queues": [], "connections": now, "connected": true,
                           "connections_at_start": at_start})
                })
                .collect();
            let doc = StatsDocument::deserialize(json!({ "disks": disks })).unwrap();
            Checks::of(&guest, Some(&doc)).backend_reconnected
        };
        assert_eq!(window(&[(1, 1)]), Some(false));
        assert_eq!(window(&[(1, 1), (2, 3)]), Some(true));
        assert_eq!(window(&[(0, 1)]), Some(true));
        // A whole-life document (no baseline) is no window.
        let whole = StatsDocument::deserialize(
            json!({"disks": [{"queues": [], "connections": 4, "connected": true}]}),
        )
        .unwrap();
        assert_eq!(Checks::of(&guest, Some(&whole)).backend_reconnected, None);
    }

    #[test]
    fn a_record_of_another_major_version_does_not_read() {
        let mut v = serde_json::to_value(test_record(json!({}))).unwrap();
        v["schema"] = json!("blklab-run-result/2");
        let e = serde_json::from_value::<ResultRecord>(v)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("blklab-run-result/2") && e.contains("reads \"blklab-run-result/1\""),
            "{e}"
        );
    }
}
