//! A modelled host cost per IO for records that count the guest's
//! would-be exits (`instructions.exits`, plain TCG or a nested run's
//! level 2): what the same guest would cost a KVM host, as
//!
//! ```text
//! guest instructions per IO
//!   + Σ over exit reasons (would-be exits per IO × the reason's weight)
//! ```
//!
//! and, apart from it because it is time rather than instructions, the
//! halt polling the host would do at each idle entry. The weights are host
//! instructions per exit, measured in the nested lab (`tests/exit_cost.rs`:
//! a KVM guest doing one kind of exit N times, the host counted by the
//! plugin) and checked there against [`EXIT_WEIGHTS`]; docs/user-guide.md
//! says how they were calibrated and what they leave out.
//!
//! Nothing here is measured: every renderer marks it *modelled*.

use crate::record::instructions::WouldBeExits;
use crate::record::result::ResultRecord;

/// Host instructions one exit of each reason costs a KVM host (kernel and
/// user), calibrated by `tests/exit_cost.rs` in the nested lab: QEMU 10.0's
/// TCG emulating an AMD EPYC host, Debian's 6.12 kernel with `kvm-amd`, a
/// minimal VMM (the user-space exits' cost is KVM's and a `KVM_RUN` round
/// trip, not QEMU's device emulation); the mean of three runs on the
/// lab's two-vCPU host, rounded to two significant digits. `hlt` is an idle
/// cycle with `halt_poll_ns=0` (halt, block, wake by a timer, inject the
/// interrupt), less the `timer` and `eoi` weights the cycle also paid.
pub const EXIT_WEIGHTS: &[(&str, u64)] = &[
    ("hlt", 17_000),
    ("ipi", 4_300),
    ("timer", 3_700),
    ("eoi", 3_100),
    ("port_io", 3_800),
    ("notify", 4_200),
    ("mmio_other", 6_100),
    ("cpuid", 3_100),
];

/// Would-be exit reasons without a calibration of their own, and the
/// calibrated reason whose weight stands in for theirs: other APIC and MSR
/// writes take KVM's WRMSR path as an EOI does; an interrupt delivered to a
/// running vCPU costs a host-interrupt exit and an injection, a
/// kernel-handled exit's round trip as CPUID's is.
const BORROWED_WEIGHTS: &[(&str, &str)] = &[
    ("apic_other", "eoi"),
    ("msr_other", "eoi"),
    ("interrupts_running", "cpuid"),
];

/// KVM's default `halt_poll_ns` on x86: how long a vCPU that halts polls
/// for a wake-up before it sleeps.
const HALT_POLL_NS: f64 = 200_000.0;

/// One term of the modelled cost: host instructions per IO.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Term {
    /// "guest instructions", or an exit reason.
    pub(crate) name: String,
    /// Exits per IO (None for the guest's instructions).
    count_per_io: Option<f64>,
    /// Host instructions per IO.
    pub(crate) per_io: f64,
}

/// The modelled host cost of one record's window.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ModelledHostCost {
    /// The guest's instructions, then each exit reason with a weight.
    pub(crate) terms: Vec<Term>,
    /// Σ exits × weights per IO.
    pub(crate) exits_per_io: f64,
    /// Guest instructions + exits, per IO.
    pub(crate) total_per_io: f64,
    /// Halt polling per IO, µs: each idle entry polls for its idle time,
    /// at most [`HALT_POLL_NS`] (None without the guest's idle time).
    pub(crate) halt_poll_us_per_io: Option<f64>,
}

/// The weight of `reason` (its own, or the one it borrows).
pub(crate) fn weight(reason: &str) -> Option<u64> {
    let own = |r: &str| EXIT_WEIGHTS.iter().find(|(n, _)| *n == r).map(|(_, w)| *w);
    own(reason).or_else(|| {
        let (_, from) = BORROWED_WEIGHTS.iter().find(|(n, _)| *n == reason)?;
        own(from)
    })
}

/// Each weighted reason's count in `e`: interrupts taken while the vCPU
/// ran are the interrupts less the HLTs (each idle entry ends with the
/// interrupt that woke it, which the `hlt` weight pays for).
fn counts(e: &WouldBeExits) -> Vec<(&'static str, u64)> {
    vec![
        ("hlt", e.hlt),
        ("ipi", e.ipi),
        ("timer", e.timer),
        ("eoi", e.eoi),
        ("apic_other", e.apic_other),
        ("msr_other", e.msr_other),
        ("port_io", e.port_io),
        ("notify", e.notify),
        ("mmio_other", e.mmio_other),
        ("cpuid", e.cpuid),
        ("interrupts_running", e.interrupts.saturating_sub(e.hlt)),
    ]
}

/// The guest's idle seconds in the window (all CPUs).
fn guest_idle_seconds(r: &ResultRecord) -> Option<f64> {
    let cpu = r.guest.cpu.as_ref()?;
    cpu.seconds(cpu.all.idle)
}

/// The modelled host cost of `r`'s window: None without would-be exits
/// counted, guest instructions or IOs.
pub(crate) fn model(r: &ResultRecord) -> Option<ModelledHostCost> {
    let i = r.instructions.as_ref()?;
    let e = i.exits.as_ref().filter(|e| e.unavailable.is_none())?;
    let ios = i.ios.filter(|n| *n > 0.0)?;
    let guest = i.per_io?;
    let mut terms = vec![Term {
        name: "guest instructions".into(),
        count_per_io: None,
        per_io: guest,
    }];
    for (reason, n) in counts(e) {
        let w = weight(reason)? as f64;
        let count = n as f64 / ios;
        terms.push(Term {
            name: reason.to_string(),
            count_per_io: Some(count),
            per_io: count * w,
        });
    }
    let exits_per_io = terms[1..].iter().map(|t| t.per_io).sum();
    Some(ModelledHostCost {
        terms,
        exits_per_io,
        total_per_io: guest + exits_per_io,
        halt_poll_us_per_io: halt_poll_us(e.hlt, guest_idle_seconds(r), ios),
    })
}

/// Halt polling per IO, µs: `hlt` idle entries over `idle_s` seconds of
/// idle, each polling for the mean idle time up to [`HALT_POLL_NS`].
fn halt_poll_us(hlt: u64, idle_s: Option<f64>, ios: f64) -> Option<f64> {
    if hlt == 0 {
        return Some(0.0);
    }
    let mean_idle_ns = idle_s? * 1e9 / hlt as f64;
    Some(hlt as f64 * mean_idle_ns.min(HALT_POLL_NS) / 1000.0 / ios)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::result::test_record;
    use serde_json::json;

    fn record(exits: serde_json::Value, cpu: serde_json::Value) -> ResultRecord {
        let mut e = json!({
            "unavailable": null, "ios": 1000.0, "total": 0, "hlt": 0, "ipi": 0, "eoi": 0,
            "timer": 0, "apic_other": 0, "msr_other": 0, "port_io": 0, "notify": 0,
            "mmio_other": 0, "cpuid": 0, "interrupts": 0, "per_io": {}, "msrs": {},
            "ports": {}, "notifies": [], "mmio": {}, "interrupt_entries": {}, "per_vcpu": []
        });
        for (k, v) in exits.as_object().unwrap() {
            e[k] = v.clone();
        }
        test_record(json!({
            "guest": {"cpu": cpu},
            "instructions": {
                "window": {"method": "m", "deterministic": true}, "ios": 1000.0,
                "total": 10_000_000u64, "kernel": 8_000_000u64, "user": 2_000_000u64,
                "per_vcpu": [], "per_io": 10_000.0, "kernel_per_io": 8000.0,
                "user_per_io": 2000.0, "idle_symbol": null, "idle_entries": null,
                "idle_entries_per_io": null, "context_switches_per_io": null,
                "entries": {}, "entries_per_io": {}, "groups": {}, "group_insns": {},
                "functions": {}, "exits": e
            }
        }))
    }

    fn w(reason: &str) -> f64 {
        weight(reason).unwrap() as f64
    }

    #[test]
    fn every_weighted_reason_has_a_weight_and_every_weight_is_used() {
        let e = WouldBeExits::default();
        for (reason, _) in counts(&e) {
            assert!(weight(reason).is_some(), "{reason} has no weight");
        }
        for (reason, _) in EXIT_WEIGHTS {
            assert!(
                counts(&e).iter().any(|(r, _)| r == reason),
                "{reason} weighs nothing"
            );
        }
    }

    #[test]
    fn the_model_adds_each_reasons_exits_times_its_weight_to_the_guests_instructions() {
        let r = record(
            json!({"hlt": 500, "timer": 1000, "notify": 250, "interrupts": 800, "msr_other": 100}),
            json!({"all": {"usr": 0, "nice": 0, "sys": 50, "iowait": 0, "irq": 0, "soft": 0,
                    "steal": 0, "guest": 0, "gnice": 0, "idle": 50, "busy": 50}, "ticks": 200}),
        );
        let m = model(&r).unwrap();
        let exits = 0.5 * w("hlt")
            + 1.0 * w("timer")
            + 0.25 * w("notify")
            + 0.3 * w("interrupts_running")
            + 0.1 * w("msr_other");
        assert!((m.exits_per_io - exits).abs() < 1e-6, "{m:?}");
        assert!((m.total_per_io - 10_000.0 - exits).abs() < 1e-6);
        assert_eq!(m.terms[0].per_io, 10_000.0);
        let t = m
            .terms
            .iter()
            .find(|t| t.name == "interrupts_running")
            .unwrap();
        assert_eq!(t.count_per_io, Some(0.3));
        // 1 s idle over 500 HLTs: 2 ms each, polled for 200 µs each.
        assert!((m.halt_poll_us_per_io.unwrap() - 0.5 * 200.0).abs() < 1e-9);
    }

    #[test]
    fn short_idle_periods_poll_for_their_length_only() {
        // 10 ms idle over 1000 HLTs: 10 µs each, all of it polled.
        assert!((halt_poll_us(1000, Some(0.01), 100.0).unwrap() - 100.0).abs() < 1e-9);
        assert_eq!(halt_poll_us(0, None, 100.0), Some(0.0));
        assert_eq!(halt_poll_us(5, None, 100.0), None);
    }

    #[test]
    fn no_model_without_counted_exits() {
        let mut r = record(json!({"unavailable": "old plugin"}), json!(null));
        assert_eq!(model(&r), None);
        r.instructions = None;
        assert_eq!(model(&r), None);
    }
}
