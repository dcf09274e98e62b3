//! The accelerator a run boots its guests under (KVM or TCG) and whether
//! it counts instructions: what `--accel`, `--count-insns` and
//! `--deterministic` ask, and, under `--accel auto`, what a KVM probe boot
//! says. It decides only; the probe and the System.map check are passed in.

use log::debug;
use thiserror::Error;

use crate::lab::guest::qemu::Accel;
use crate::lab::options::CountInsns;
use crate::util::kvm_host::KvmHost;

/// A combination of options no accelerator satisfies.
#[derive(Debug, Error)]
pub enum AccelError {
    #[error(
        "{what} needs TCG (QEMU's plugins and -icount do not run under KVM); drop --accel kvm"
    )]
    NeedsTcg { what: &'static str },
    #[error(
        "--deterministic with --accel nested: under -icount the guest inside the emulated host \
         stops making progress (measured: a one-vCPU guest spinning in \
         queued_spin_lock_slowpath for minutes while booting; without the counting plugin, one \
         that never finished after its first variant); run nested without --deterministic"
    )]
    NestedDeterministic,
    #[error("--accel kvm: {0}")]
    KvmUnusable(String),
}

/// What `blklab run` chose: the accelerator, why, and whether it counts
/// instructions.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct AccelDecision {
    pub(crate) accel: Accel,
    pub(crate) reason: String,
    pub(crate) count_insns: bool,
    /// Why `--count-insns auto` takes no counts, when it takes none.
    pub(crate) no_insns_because: Option<String>,
}

/// `--accel kvm` on a host whose `/dev/kvm` the lab cannot use: refused,
/// with what was found and what to use instead. Other choices pass.
pub(crate) fn refuse_unusable_kvm(want: Accel, kvm: &KvmHost) -> Result<(), AccelError> {
    if want == Accel::Kvm && !kvm.usable() {
        return Err(AccelError::KvmUnusable(kvm.explain()));
    }
    Ok(())
}

/// Decide the accelerator and instruction counting. `probe` is the real
/// KVM probe (a boot under KVM, seconds to `/init`, or why not), called
/// only when `want` is `Auto` and nothing forces TCG; `maps_usable` says
/// whether every kernel has a usable System.map, asked only when `auto`
/// could count. Instruction counts and `--deterministic` need TCG
/// (plugins and -icount do not run under KVM).
pub(crate) fn decide_accel<E: std::fmt::Display>(
    want: Accel,
    count: CountInsns,
    deterministic: bool,
    kvm: &KvmHost,
    probe: impl FnOnce() -> Result<f64, E>,
    maps_usable: impl FnOnce() -> bool,
) -> Result<AccelDecision, AccelError> {
    let forced = count == CountInsns::On;
    let needs_tcg = match (forced, deterministic) {
        (true, true) => Some("--count-insns and --deterministic"),
        (true, false) => Some("--count-insns"),
        (false, true) => Some("--deterministic"),
        (false, false) => None,
    };
    let (accel, reason) = match (needs_tcg, want) {
        (_, Accel::Nested) if deterministic => return Err(AccelError::NestedDeterministic),
        // The emulated host runs under TCG: instruction counts apply to it.
        (_, Accel::Nested) => (
            Accel::Nested,
            "forced with --accel nested: KVM inside an emulated (TCG) host".to_string(),
        ),
        (Some(what), Accel::Kvm) => return Err(AccelError::NeedsTcg { what }),
        (Some(what), _) => (Accel::Tcg, format!("{what} needs TCG")),
        (None, Accel::Kvm) => {
            refuse_unusable_kvm(Accel::Kvm, kvm)?;
            (Accel::Kvm, "forced with --accel kvm".to_string())
        }
        (None, Accel::Tcg) => (Accel::Tcg, "forced with --accel tcg".to_string()),
        // Nothing is booted to learn what the host's files say.
        (None, Accel::Auto) if !kvm.usable() => {
            (Accel::Tcg, format!("KVM unusable: {}", kvm.explain()))
        }
        (None, Accel::Auto) => match probe() {
            Ok(secs) => (
                Accel::Kvm,
                format!("KVM probe booted the guest in {secs:.1} s"),
            ),
            Err(why) => {
                debug!("KVM not usable ({why}); using TCG");
                (Accel::Tcg, format!("KVM probe failed: {why}"))
            }
        },
    };
    // Under TCG, instruction counts are the deterministic CPU-cost answer:
    // `auto` takes them whenever it can.
    let (count_insns, no_insns_because) = match count {
        CountInsns::On => (true, None),
        CountInsns::Off => (false, None),
        CountInsns::Auto if accel == Accel::Kvm => (
            false,
            Some("the guests run under KVM, where QEMU's plugins do not run".to_string()),
        ),
        CountInsns::Auto if !maps_usable() => {
            (false, Some("a kernel has no usable System.map".to_string()))
        }
        CountInsns::Auto => (true, None),
    };
    Ok(AccelDecision {
        accel,
        reason,
        count_insns,
        no_insns_because,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HW: KvmHost = KvmHost::Hardware { module: "kvm_amd" };

    fn decide(
        want: Accel,
        count: CountInsns,
        det: bool,
        probe: Result<f64, String>,
        maps: bool,
    ) -> Result<AccelDecision, AccelError> {
        super::decide_accel(want, count, det, &HW, move || probe, move || maps)
    }

    #[test]
    fn a_kvm_probe_that_boots_chooses_kvm_without_instruction_counts() {
        let d = decide(Accel::Auto, CountInsns::Auto, false, Ok(1.5), true).unwrap();
        assert_eq!(d.accel, Accel::Kvm);
        assert_eq!(d.reason, "KVM probe booted the guest in 1.5 s");
        assert!(!d.count_insns);
        assert!(d.no_insns_because.unwrap().contains("KVM"));
    }

    #[test]
    fn a_failed_kvm_probe_chooses_tcg_and_counts_when_maps_are_usable() {
        let d = decide(
            Accel::Auto,
            CountInsns::Auto,
            false,
            Err("cannot open /dev/kvm: gone".into()),
            true,
        )
        .unwrap();
        assert_eq!(d.accel, Accel::Tcg);
        assert_eq!(d.reason, "KVM probe failed: cannot open /dev/kvm: gone");
        assert!(d.count_insns && d.no_insns_because.is_none());
        let d = decide(Accel::Auto, CountInsns::Auto, false, Err("x".into()), false).unwrap();
        assert_eq!(d.accel, Accel::Tcg);
        assert!(!d.count_insns);
        assert!(d.no_insns_because.unwrap().contains("System.map"));
    }

    #[test]
    fn nested_never_probes_and_counts_like_tcg() {
        let no_probe = || -> Result<f64, String> { panic!("probed") };
        for (count, maps, counts) in [
            (CountInsns::Auto, true, true),
            (CountInsns::Auto, false, false),
            (CountInsns::On, false, true),
            (CountInsns::Off, true, false),
        ] {
            let d =
                super::decide_accel(Accel::Nested, count, false, &HW, no_probe, || maps).unwrap();
            assert_eq!(d.accel, Accel::Nested);
            assert_eq!(d.count_insns, counts, "{count:?} maps={maps}");
        }
        // The guest inside stops making progress under -icount.
        let e = super::decide_accel(Accel::Nested, CountInsns::Auto, true, &HW, no_probe, || {
            true
        })
        .unwrap_err();
        assert!(matches!(e, AccelError::NestedDeterministic), "{e:?}");
        assert!(e.to_string().contains("run nested without --deterministic"));
    }

    #[test]
    fn forced_choices_never_probe() {
        let no_probe = || -> Result<f64, String> { panic!("probed") };
        let d = super::decide_accel(Accel::Kvm, CountInsns::Off, false, &HW, no_probe, || true)
            .unwrap();
        assert_eq!((d.accel, d.count_insns), (Accel::Kvm, false));
        let d = super::decide_accel(Accel::Tcg, CountInsns::Off, false, &HW, no_probe, || true)
            .unwrap();
        assert_eq!((d.accel, d.count_insns), (Accel::Tcg, false));
        // --count-insns on and --deterministic force TCG, even under auto.
        let d = super::decide_accel(Accel::Auto, CountInsns::On, false, &HW, no_probe, || false)
            .unwrap();
        assert_eq!((d.accel, d.count_insns), (Accel::Tcg, true));
        assert_eq!(d.reason, "--count-insns needs TCG");
        let d = super::decide_accel(Accel::Auto, CountInsns::Auto, true, &HW, no_probe, || true)
            .unwrap();
        assert_eq!((d.accel, d.count_insns), (Accel::Tcg, true));
        assert_eq!(d.reason, "--deterministic needs TCG");
        let e = super::decide_accel(Accel::Kvm, CountInsns::On, true, &HW, no_probe, || true)
            .unwrap_err();
        assert!(
            matches!(
                e,
                AccelError::NeedsTcg {
                    what: "--count-insns and --deterministic"
                }
            ),
            "{e:?}"
        );
        assert!(
            e.to_string()
                .contains("--count-insns and --deterministic needs TCG"),
            "{e}"
        );
    }

    #[test]
    fn an_unusable_kvm_is_named_before_anything_boots() {
        let no_probe = || -> Result<f64, String> { panic!("probed") };
        let d = super::decide_accel(
            Accel::Auto,
            CountInsns::Auto,
            false,
            &KvmHost::Pvm,
            no_probe,
            || true,
        )
        .unwrap();
        assert_eq!(d.accel, Accel::Tcg);
        assert!(
            d.reason.starts_with("KVM unusable: /dev/kvm is PVM")
                && d.reason.contains("--accel nested"),
            "{}",
            d.reason
        );
        let e = super::decide_accel(
            Accel::Kvm,
            CountInsns::Off,
            false,
            &KvmHost::Pvm,
            no_probe,
            || true,
        )
        .unwrap_err();
        assert!(matches!(e, AccelError::KvmUnusable(_)), "{e:?}");
        assert!(
            e.to_string().starts_with("--accel kvm: /dev/kvm is PVM"),
            "{e}"
        );
    }
}
