//! A record's `kvm` (runs under KVM): KVM's own per-vCPU statistics over
//! the variant's window, read from QEMU (`lab::measure::kvm_qmp_stats` produces it).
//! Only cumulative counters are kept: their increase from the begin SYNC
//! to the end SYNC, for each vCPU and summed over them, and the sum per IO.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Where the counters come from.
pub(crate) const KVM_SOURCE: &str =
    "qmp query-stats (target vcpu, provider kvm) at the variant's BLKLAB-SYNC begin and end";

/// One vCPU's counters over the window.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct KvmVcpu {
    /// The vCPU's QOM path (`/machine/unattached/device[N]`).
    pub(crate) qom_path: String,
    /// Counter → its increase over the window.
    pub(crate) counters: BTreeMap<String, u64>,
    /// Exit reason → this vCPU's exits for it over the window (see
    /// `KvmWindow::exit_reasons`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) exit_reasons: BTreeMap<String, u64>,
}

/// KVM's vCPU statistics over one variant's window.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct KvmWindow {
    /// How the counters were read ([`KVM_SOURCE`]).
    pub(crate) source: String,
    /// Why the record has no counters (QEMU without `query-stats`, or a
    /// host kernel without KVM's binary statistics); absent when it has
    /// them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) unavailable: Option<String>,
    /// Cumulative counter (KVM's name: `exits`, `halt_exits`, …) → its
    /// increase over the window, summed over the vCPUs.
    #[serde(default)]
    pub(crate) counters: BTreeMap<String, u64>,
    /// Counter → its unit, for counters that have one (`ns`, `bytes`,
    /// `cycles`); the others are counts.
    #[serde(default)]
    pub(crate) units: BTreeMap<String, String>,
    /// Per vCPU, in vCPU order.
    #[serde(default)]
    pub(crate) per_vcpu: Vec<KvmVcpu>,
    /// The IOs per-IO values divide by (`record::metrics::ios`); null
    /// without an IO count.
    #[serde(default)]
    pub(crate) ios: Option<f64>,
    /// Counter → its sum over the vCPUs per IO (empty without an IO count).
    #[serde(default)]
    pub(crate) per_io: BTreeMap<String, f64>,
    /// Exit reason (the host kernel's name: `hlt`, `io`, `msr`, `npf`,
    /// `interrupt`, … under SVM; `hlt`, `io_instruction`, `msr_write`,
    /// `ept_misconfig`, … under VMX) → exits of QEMU's vCPU threads for it
    /// over the window, summed over the vCPUs: a hist trigger on the host's
    /// `kvm:kvm_exit` tracepoint keyed by thread, ISA and reason, read at
    /// the begin and end SYNC (`lab::measure::kvm_exit_tracepoint`). Absent, with
    /// `exit_reasons_unavailable`, when the host cannot count them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) exit_reasons: Option<BTreeMap<String, u64>>,
    /// Exit reason → exits per IO (empty without an IO count).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) exit_reasons_per_io: BTreeMap<String, f64>,
    /// Why the record has no exits by reason (no tracefs, not root, a
    /// kernel without hist triggers, a histogram that dropped entries);
    /// absent when it has them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) exit_reasons_unavailable: Option<String>,
    /// How the exits by reason were counted: the tracefs instance and the
    /// hist trigger as installed, its filter naming QEMU's vCPU threads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) exit_reasons_trace: Option<String>,
    /// Keys the histogram dropped by the window's end (it was full); the
    /// record then has no exits by reason, KVM's counters only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) exit_reasons_dropped: Option<u64>,
}

impl KvmWindow {
    /// A window without counters, and why.
    pub(crate) fn unavailable(reason: String) -> KvmWindow {
        KvmWindow {
            source: KVM_SOURCE.to_string(),
            unavailable: Some(reason),
            ..KvmWindow::default()
        }
    }

    /// The window with its per-IO values over `ios` IOs.
    pub(crate) fn with_per_io(mut self, ios: Option<f64>) -> KvmWindow {
        let ios = ios.filter(|n| *n > 0.0);
        self.ios = ios;
        self.per_io = divided(&self.counters, ios);
        self.exit_reasons_per_io = self
            .exit_reasons
            .as_ref()
            .map(|r| divided(r, ios))
            .unwrap_or_default();
        self
    }

    /// The sum of the exit reasons `names` over the window (None without
    /// exits by reason; a reason that did not occur is 0).
    pub(crate) fn exits_for(&self, names: &[&str]) -> Option<f64> {
        let reasons = self.exit_reasons.as_ref()?;
        Some(
            names
                .iter()
                .map(|n| reasons.get(*n).copied().unwrap_or(0) as f64)
                .sum(),
        )
    }

    /// The sum of `names` over the window (None when one is missing).
    pub(crate) fn sum(&self, names: &[&str]) -> Option<f64> {
        names
            .iter()
            .map(|n| self.counters.get(*n).map(|v| *v as f64))
            .sum()
    }
}

/// Each count divided by `ios` (empty without an IO count).
fn divided(counts: &BTreeMap<String, u64>, ios: Option<f64>) -> BTreeMap<String, f64> {
    match ios {
        Some(n) => counts
            .iter()
            .map(|(k, v)| (k.clone(), *v as f64 / n))
            .collect(),
        None => BTreeMap::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window() -> KvmWindow {
        KvmWindow {
            source: KVM_SOURCE.into(),
            counters: [("exits".to_string(), 3000), ("halt_exits".to_string(), 500)].into(),
            ..KvmWindow::default()
        }
    }

    #[test]
    fn per_io_divides_every_counter_by_the_ios() {
        let w = window().with_per_io(Some(1000.0));
        assert_eq!(w.ios, Some(1000.0));
        assert_eq!(w.per_io["exits"], 3.0);
        assert_eq!(w.per_io["halt_exits"], 0.5);
        for ios in [None, Some(0.0)] {
            let w = window().with_per_io(ios);
            assert_eq!((w.ios, w.per_io.is_empty()), (None, true));
        }
    }

    #[test]
    fn a_sum_needs_every_counter() {
        assert_eq!(window().sum(&["exits", "halt_exits"]), Some(3500.0));
        assert_eq!(window().sum(&["exits", "halt_wait_ns"]), None);
        assert_eq!(
            KvmWindow::unavailable("old QEMU".into()).sum(&["exits"]),
            None
        );
    }

    #[test]
    fn an_unavailable_window_says_why_and_round_trips() {
        let w = KvmWindow::unavailable("no query-stats".into());
        let v = serde_json::to_value(&w).unwrap();
        assert_eq!(v["unavailable"], "no query-stats");
        assert_eq!(serde_json::from_value::<KvmWindow>(v).unwrap(), w);
        // A window with counters leaves `unavailable` out.
        let v = serde_json::to_value(window()).unwrap();
        assert!(v.get("unavailable").is_none(), "{v}");
    }
}
