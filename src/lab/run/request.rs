//! A run's request: its options with the kernels checked, the scenarios
//! loaded (shipped, with `--variants`, `--runtime` and `--ramp` applied)
//! and every boot unit's machine and device settings resolved and checked,
//! before anything is built or booted. Every phase of the run takes it.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::backend::qemu_args::GuestRam;
use crate::lab::guest::accel::{self, AccelError};
use crate::lab::guest::qemu::Accel;
use crate::lab::images;
use crate::lab::options::{CountInsns, HostTcg, RunArgs, RunOptions};
use crate::lab::run::error::RunError;
use crate::lab::run::settings::{self, Unit};
use crate::lab::scenario::{self, Scenario};
use crate::record::parallelism::{HostParallelism, VcpuThreads};

/// A lab run, resolved and checked: nothing is built or booted yet.
pub struct RunRequest {
    pub(crate) options: RunOptions,
    /// The lab's checkout (images/, guest-scripts/), or the lab tree an
    /// image archive brought.
    pub(crate) lab_dir: PathBuf,
    /// The scenarios as the run executes them.
    pub(crate) scenarios: Vec<Scenario>,
    /// Every scenario's boot units, in scenario order.
    pub(crate) units: Vec<Unit>,
}

impl RunRequest {
    /// `blklab run`'s flags, resolved.
    pub fn from_args(args: &RunArgs) -> Result<RunRequest, RunError> {
        RunRequest::new(args.to_options()?)
    }

    /// Check the kernels, counts, scenarios and every boot's machine and
    /// device settings, before building or booting anything. The usable
    /// host cores are read here when the options do not say.
    pub(crate) fn new(mut options: RunOptions) -> Result<RunRequest, RunError> {
        for k in &options.kernels {
            k.check()?;
        }
        if options.iterations == 0 {
            return Err(RunError::NoIterations);
        }
        if options.machine.vcpus.is_some_and(|v| v == 0 || v > 64) {
            return Err(RunError::VcpusOutOfRange);
        }
        let guest = &options.guest;
        if guest.accel == Accel::Nested && guest.deterministic {
            return Err(AccelError::NestedDeterministic.into());
        }
        if let (false, Some(flag)) = (guest.accel == Accel::Nested, options.nested.given()) {
            return Err(RunError::NestedOnly { flag });
        }
        if options.nested.host_tcg == HostTcg::Single && guest.count_insns != CountInsns::Off {
            return Err(RunError::SingleThreadedHostCounting);
        }
        // A forced KVM this host cannot give is refused before anything
        // is built.
        if guest.accel == Accel::Kvm {
            accel::refuse_unusable_kvm(guest.accel, &crate::util::kvm_host::classify())?;
        }
        let lab_dir = images::lab_dir_or_imported(
            options.place.lab_dir.get(),
            &images::cache::dir(options.place.cache.get()),
        )?;
        let scenarios: Vec<Scenario> = load_scenarios(&options.scenarios, &lab_dir)?
            .into_iter()
            .map(|s| apply_overrides(s, &options))
            .collect::<Result<_, _>>()?;
        let cores = *options.usable_cores.get_or_insert_with(usable_host_cores);
        let units = settings::units(&scenarios, &options, cores)?;
        let huge_pages = guest.accel == Accel::Nested || guest.ram == GuestRam::HugeMemfd;
        check_units(&scenarios, &units, huge_pages)?;
        Ok(RunRequest {
            options,
            lab_dir,
            scenarios,
            units,
        })
    }

    /// The host cores the run's `vcpus host` scenarios follow and its
    /// timeouts scale with.
    pub(crate) fn usable_cores(&self) -> u32 {
        self.options.usable_cores.unwrap_or(1)
    }

    /// One line per scenario whose vCPUs follow the host: what they came
    /// to here (none when `--vcpus` replaced them).
    pub(crate) fn host_vcpus_lines(&self) -> Vec<String> {
        let cores = self.usable_cores();
        self.scenarios
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                let spec = s.vcpus.filter(|v| v.follows_host())?;
                if self.options.machine.vcpus.is_some() {
                    return None;
                }
                let m = &self
                    .units
                    .iter()
                    .find(|u| u.scenario == i)?
                    .settings
                    .machine;
                Some(format!(
                    "{}: {} vCPUs, {} of memory (vcpus {spec}; {cores} usable host cores)",
                    s.name, m.vcpus, m.memory
                ))
            })
            .collect()
    }
}

/// The CPUs this process may run on (its affinity), at least 1.
fn usable_host_cores() -> u32 {
    crate::util::host::cpus().map_or(1, |n| u32::try_from(n).unwrap_or(u32::MAX).max(1))
}

impl RunRequest {
    /// This host's cores as the lab (and so QEMU) sees them, and how QEMU
    /// will run the vCPUs: one at a time under `--deterministic`
    /// (single-threaded TCG), else a thread each (KVM, multi-threaded TCG,
    /// and the emulated host of `--accel nested`).
    pub(crate) fn host_parallelism(&self) -> HostParallelism {
        HostParallelism::of_this_host(vcpu_threads(&self.options))
    }

    /// One warning per distinct vCPU count of the boot units that cannot
    /// all run at once on `host`, in unit order.
    pub(crate) fn parallelism_warnings(&self, host: &HostParallelism) -> Vec<String> {
        let mut counts: Vec<u32> = Vec::new();
        for u in &self.units {
            if !counts.contains(&u.settings.machine.vcpus) {
                counts.push(u.settings.machine.vcpus);
            }
        }
        counts
            .into_iter()
            .filter_map(|v| host.with_vcpus(v).warning())
            .collect()
    }
}

/// The parallelism warnings this process has said: `blklab bisect` runs
/// the lab once per commit, and says each once.
static SAID: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Those of `lines` this process has not said yet, now counted as said.
pub(crate) fn unsaid(lines: Vec<String>) -> Vec<String> {
    let mut said = SAID.lock().unwrap_or_else(|p| p.into_inner());
    let mut out = Vec::new();
    for l in lines {
        if !said.contains(&l) {
            said.push(l.clone());
            out.push(l);
        }
    }
    out
}

/// How QEMU runs the guests' vCPUs under `options`.
fn vcpu_threads(options: &RunOptions) -> VcpuThreads {
    if options.guest.deterministic {
        VcpuThreads::Single
    } else {
        VcpuThreads::PerVcpu
    }
}

/// The scenario a run executes, after `--runtime`/`--variants`.
fn apply_overrides(mut s: Scenario, options: &RunOptions) -> Result<Scenario, RunError> {
    if let Some(filter) = &options.variants {
        for f in filter {
            if !s.variants.iter().any(|v| &v.name == f) {
                return Err(RunError::NoSuchVariant {
                    scenario: s.name.clone(),
                    variant: f.clone(),
                    available: s.variants.iter().map(|v| v.name.clone()).collect(),
                });
            }
        }
        s.variants.retain(|v| filter.contains(&v.name));
    }
    for v in &mut s.variants {
        if let Some(r) = options.fio.runtime {
            v.runtime = r;
        }
        if let Some(r) = options.fio.ramp {
            v.ramp = r;
        }
    }
    Ok(s)
}

/// Load every `--scenario`, refusing malformed ones and ones the guest
/// cannot find (they are packed into the initramfs from
/// guest-scripts/scenarios/).
fn load_scenarios(names: &[String], lab_dir: &Path) -> Result<Vec<Scenario>, RunError> {
    let dir = lab_dir.join("guest-scripts/scenarios");
    let mut out: Vec<Scenario> = Vec::new();
    for n in names {
        let (s, path) = scenario::load(n, &dir)?;
        let shipped = dir.join(format!("{}.scn", s.name));
        let same = std::fs::canonicalize(&path).ok() == std::fs::canonicalize(&shipped).ok()
            && shipped.exists();
        if !same {
            return Err(RunError::ScenarioNotShipped { path, dir });
        }
        if out.iter().any(|o| o.name == s.name) {
            return Err(RunError::ScenarioTwice(s.name));
        }
        out.push(s);
    }
    Ok(out)
}

/// Check every boot's machine and device settings once, before building
/// or booting anything.
/// `huge_pages`: the guests' RAM is made of 2 MiB pages (nested runs).
fn check_units(scenarios: &[Scenario], units: &[Unit], huge_pages: bool) -> Result<(), RunError> {
    for u in units {
        let s = &scenarios[u.scenario];
        let variants = u
            .settings
            .variants
            .iter()
            .map(|&i| s.variants[i].name.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        let vcpus = u.settings.machine.vcpus;
        if vcpus == 0 || vcpus > 64 {
            return Err(RunError::UnitVcpus {
                scenario: s.name.clone(),
                variants,
                vcpus,
            });
        }
        let memory = &u.settings.machine.memory;
        if huge_pages && crate::util::units::parse_size(memory).is_ok_and(|b| b % (2 << 20) != 0) {
            return Err(RunError::UnitHugePages {
                scenario: s.name.clone(),
                variants,
                memory: memory.clone(),
            });
        }
        u.settings
            .disk_configs(PathBuf::from("/tmp/blklab-check.sock"))
            .map_err(|source| RunError::UnitDevice {
                scenario: s.name.clone(),
                variants,
                source,
            })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab::run::settings::DeviceSettingsError;

    fn args(flags: &[&str]) -> RunOptions {
        RunArgs::from_flags(flags).to_options().unwrap()
    }

    fn check(flags: &[&str]) -> Result<RunRequest, RunError> {
        RunRequest::from_args(&RunArgs::from_flags(flags))
    }

    fn scenario(text: &str) -> Scenario {
        scenario::parse(text, "t.scn", "t").unwrap()
    }

    #[test]
    fn bad_counts_are_refused_by_kind_before_anything_else() {
        let e = check(&["--iterations", "0"]).err().unwrap();
        assert!(matches!(e, RunError::NoIterations), "{e:?}");
        assert_eq!(e.to_string(), "--iterations must be at least 1");
        let e = check(&["--vcpus", "65"]).err().unwrap();
        assert!(matches!(e, RunError::VcpusOutOfRange), "{e:?}");
        let e = check(&["--accel", "nested", "--deterministic"])
            .err()
            .unwrap();
        assert!(
            matches!(e, RunError::Accel(AccelError::NestedDeterministic)),
            "{e:?}"
        );
        let e = check(&["--accel", "nested", "--host-tcg", "single"])
            .err()
            .unwrap();
        assert!(matches!(e, RunError::SingleThreadedHostCounting), "{e:?}");
        assert!(e.to_string().contains("add --count-insns off"), "{e}");
        for flags in [
            &["--inner-accel", "kvm"][..],
            &["--nested-neighbour", "--accel", "tcg"],
            &["--host-vcpus", "1"],
            &["--host-tcg", "single", "--count-insns", "off"],
        ] {
            let e = check(flags).err().unwrap();
            assert!(matches!(e, RunError::NestedOnly { .. }), "{e:?}");
            assert!(
                e.to_string().ends_with("applies to --accel nested only"),
                "{e}"
            );
        }
        let e = check(&["--kernel", "path:/nonexistent/vmlinuz"])
            .err()
            .unwrap();
        assert!(
            matches!(e, RunError::Image(images::ImageError::MissingKernel(_))),
            "{e:?}"
        );
    }

    #[test]
    fn scenarios_that_follow_the_host_resolve_for_its_cores_and_say_so() {
        let request = |flags: &[&str], cores: Option<u32>| {
            let mut o = args(flags);
            o.usable_cores = cores;
            RunRequest::new(o).unwrap()
        };
        let both = ["--scenario", "seed002-quick", "--scenario", "smoke"];
        let r = request(&both, Some(16));
        assert_eq!(
            r.host_vcpus_lines(),
            ["seed002-quick: 16 vCPUs, 1920M of memory (vcpus host:16; 16 usable host cores)"]
        );
        let vcpus: Vec<u32> = r.units.iter().map(|u| u.settings.machine.vcpus).collect();
        assert_eq!(vcpus, [16, 2]);
        let r = request(&both, Some(2));
        assert_eq!(
            r.host_vcpus_lines(),
            ["seed002-quick: 2 vCPUs, 1G of memory (vcpus host:16; 2 usable host cores)"]
        );
        // --vcpus replaces the host's count: nothing to say.
        let r = request(&["--scenario", "seed002-quick", "--vcpus", "4"], Some(16));
        assert!(r.host_vcpus_lines().is_empty());
        // Unsaid, the cores are this process's, kept for the inner lab.
        let r = request(&both, None);
        assert_eq!(r.options.usable_cores, Some(usable_host_cores()));
        assert!(r.usable_cores() >= 1);
    }

    #[test]
    fn an_unknown_variant_names_the_ones_there_are() {
        let s = scenario("variant a\nvariant b\n");
        let e = apply_overrides(s, &args(&["--variants", "a,c"])).unwrap_err();
        assert!(
            matches!(&e, RunError::NoSuchVariant { variant, available, .. }
                if variant == "c" && available == &["a", "b"]),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "--variants: scenario t has no variant \"c\" (it has: a, b)"
        );
        let s = scenario("runtime 5\nvariant a\nvariant b\n");
        let s = apply_overrides(s, &args(&["--variants", "b", "--runtime", "2"])).unwrap();
        assert_eq!(s.variants.len(), 1);
        assert_eq!(
            (s.variants[0].name.as_str(), s.variants[0].runtime),
            ("b", 2)
        );
    }

    #[test]
    fn a_unit_with_bad_settings_is_refused_by_kind() {
        let s = scenario("vcpus 64\nvariant a\n");
        let a = args(&["--vcpus", "64"]);
        let units = settings::units(std::slice::from_ref(&s), &a, 2).unwrap();
        check_units(std::slice::from_ref(&s), &units, false).unwrap();
        // A nested run's guests are made of 2 MiB pages.
        let s = scenario("memory 1025M\nvariant a\n");
        let units = settings::units(std::slice::from_ref(&s), &args(&[]), 2).unwrap();
        check_units(std::slice::from_ref(&s), &units, false).unwrap();
        let e = check_units(std::slice::from_ref(&s), &units, true).unwrap_err();
        assert!(
            matches!(&e, RunError::UnitHugePages { memory, .. } if memory == "1025M"),
            "{e:?}"
        );
        let s = scenario("memory 1026M\nvariant a\n");
        let units = settings::units(std::slice::from_ref(&s), &args(&[]), 2).unwrap();
        check_units(std::slice::from_ref(&s), &units, true).unwrap();
        let s = scenario("device tags=sideways\nvariant a\nvariant b\n");
        let units = settings::units(std::slice::from_ref(&s), &args(&[]), 2).unwrap();
        let e = check_units(std::slice::from_ref(&s), &units, false).unwrap_err();
        assert!(
            matches!(&e, RunError::UnitDevice { variants, source: DeviceSettingsError::Config(_), .. }
                if variants == "a, b"),
            "{e:?}"
        );
        assert!(
            e.to_string()
                .starts_with("scenario t (a, b): device settings: "),
            "{e}"
        );
    }

    #[test]
    fn vcpus_that_cannot_all_run_at_once_warn_once_per_count() {
        let host = |usable, vcpu_threads| HostParallelism {
            cores_online: Some(16),
            cores_usable: Some(usable),
            cpu_model: None,
            vcpu_threads,
        };
        let r = check(&["--scenario", "smoke", "--vcpus", "16"]).unwrap();
        assert_eq!(r.host_parallelism().vcpu_threads, VcpuThreads::PerVcpu);
        let w = r.parallelism_warnings(&host(2, VcpuThreads::PerVcpu));
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with("16 vCPUs on 2 usable host cores: at most 2 run at once, "),
            "{w:?}"
        );
        assert_eq!(
            r.parallelism_warnings(&host(16, VcpuThreads::PerVcpu)),
            Vec::<String>::new()
        );
        // Units of 2, 8 and again 8 vCPUs on 4 cores: the 8, once.
        let mut r = check(&["--scenario", "smoke", "--vcpus", "2"]).unwrap();
        let mut wide = r.units[0].clone();
        wide.settings.machine.vcpus = 8;
        r.units.extend([wide.clone(), wide]);
        let w = r.parallelism_warnings(&host(4, VcpuThreads::PerVcpu));
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].starts_with("8 vCPUs on 4 usable host cores"), "{w:?}");
        // --deterministic runs one vCPU at a time, whatever the cores.
        let r = check(&["--scenario", "smoke", "--vcpus", "2", "--deterministic"]).unwrap();
        let h = r.host_parallelism();
        assert_eq!(h.vcpu_threads, VcpuThreads::Single);
        let w = r.parallelism_warnings(&h);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with("2 vCPUs under single-threaded TCG (--deterministic)"),
            "{w:?}"
        );
    }

    #[test]
    fn a_warning_is_said_once_per_process() {
        let lines = || vec!["test line a".to_string(), "test line b".to_string()];
        assert_eq!(unsaid(lines()), lines());
        assert_eq!(unsaid(lines()), Vec::<String>::new());
        assert_eq!(unsaid(vec!["test line c".into()]), ["test line c"]);
    }

    #[test]
    fn scenarios_the_guest_lacks_or_given_twice_are_refused() {
        let lab = tempfile::tempdir().unwrap();
        let shipped = lab.path().join("guest-scripts/scenarios");
        std::fs::create_dir_all(&shipped).unwrap();
        std::fs::write(shipped.join("s.scn"), "variant a\n").unwrap();
        let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(load_scenarios(&names(&["s"]), lab.path()).unwrap().len(), 1);
        let e = load_scenarios(&names(&["s", "s"]), lab.path()).unwrap_err();
        assert!(
            matches!(&e, RunError::ScenarioTwice(n) if n == "s"),
            "{e:?}"
        );
        let elsewhere = lab.path().join("other.scn");
        std::fs::write(&elsewhere, "variant a\n").unwrap();
        let e = load_scenarios(&names(&[elsewhere.to_str().unwrap()]), lab.path()).unwrap_err();
        assert!(
            matches!(&e, RunError::ScenarioNotShipped { path, .. } if path == &elsewhere),
            "{e:?}"
        );
    }
}
