//! What one boot of a scenario runs with. A scenario file pins what its
//! numbers depend on (vCPUs, memory, disks, queues, queue size, the
//! backend's device model, per variant); `blklab run`'s flags may override
//! any of it, and every override of a value the scenario pinned is recorded
//! (`overridden` in each result). Variants whose device settings differ
//! cannot share the disks of one boot, so a scenario runs in one boot per
//! group of variants with the same device settings.
//!
//! Precedence, lowest first: blklab's defaults, the scenario's global
//! settings, the variant's, the command line.
//!
//! A scenario's vCPUs may follow the host (`vcpus host[:MAX]`: the cores
//! the lab may use, at most MAX) and its memory may grow with its vCPUs
//! (`memory_per_vcpu`): both are resolved here, for the usable cores given,
//! so a boot's machine holds the numbers it ran with.

use std::collections::BTreeMap;
use std::path::PathBuf;

use thiserror::Error;

use crate::device::config::{ConfigError, DiskArgs, DiskConfig};
use crate::lab::options::RunOptions;
use crate::lab::scenario::{Scenario, DEVICE_SETTINGS};
use crate::record::machine::{Machine, Override};
use crate::util::units::{format_size, parse_size, SizeError};

/// Defaults when neither the scenario nor the command line says.
pub(crate) const DEFAULT_VCPUS: u32 = 2;
pub(crate) const DEFAULT_MEMORY: &str = "1G";
pub(crate) const DEFAULT_QUEUE_SIZE: u16 = 256;

/// Device settings with their defaults (`None`: unset, the device
/// model's own default applies).
const DEVICE_DEFAULTS: &[(&str, Option<&str>)] = &[
    ("disk", Some("null")),
    ("size", Some("4G")),
    ("tags", Some("none")),
    ("depth", None),
    ("tag_scope", Some("disk")),
    ("tag_fairness", Some("off")),
    ("latency", None),
    ("read_latency", None),
    ("write_latency", None),
    ("flush_latency", None),
    ("latency_spin", Some("0")),
    ("seed", Some("1")),
    ("poll", None),
];

/// A device setting's command-line flag.
fn flag_of(name: &str) -> String {
    format!("--{}", name.replace('_', "-"))
}

/// One boot's share of a scenario: the variants it runs and what it runs
/// them with.
#[derive(Debug, Clone)]
pub(crate) struct BootSettings {
    /// Indexes into the scenario's variants, in file order.
    pub(crate) variants: Vec<usize>,
    pub(crate) machine: Machine,
    /// The device settings in effect, by name (unset ones absent).
    pub(crate) device: BTreeMap<String, String>,
    /// Flags that replaced a value the scenario pinned.
    pub(crate) overridden: Vec<Override>,
}

/// Why a scenario's machine cannot be resolved.
#[derive(Debug, Error)]
pub enum MachineError {
    #[error(
        "scenario {scenario}: memory {memory} and memory_per_vcpu {per_vcpu} at {vcpus} vCPUs: {source}"
    )]
    Memory {
        scenario: String,
        memory: String,
        per_vcpu: String,
        vcpus: u32,
        #[source]
        source: SizeError,
    },
}

/// Why a boot's device settings make no disks.
#[derive(Debug, Error)]
pub enum DeviceSettingsError {
    #[error("device setting {name}={value}: not a number")]
    NotANumber { name: String, value: String },
    #[error("device setting depth={0}: too large")]
    DepthTooLarge(u64),
    #[error(transparent)]
    Config(#[from] ConfigError),
}

impl BootSettings {
    /// The disks' options, serving on `socket`.
    pub(crate) fn disk_args(&self, socket: PathBuf) -> Result<DiskArgs, DeviceSettingsError> {
        let get = |n: &str| self.device.get(n).cloned();
        let number = |n: &str| -> Result<Option<u64>, DeviceSettingsError> {
            get(n)
                .map(|v| {
                    v.parse::<u64>()
                        .map_err(|_| DeviceSettingsError::NotANumber {
                            name: n.to_string(),
                            value: v.clone(),
                        })
                })
                .transpose()
        };
        Ok(DiskArgs {
            socket: Some(socket),
            disk: get("disk"),
            size: get("size"),
            count: self.machine.disks,
            num_queues: self.machine.num_queues,
            queue_size: self.machine.queue_size,
            tags: get("tags").unwrap_or_default(),
            depth: number("depth")?
                .map(|d| u32::try_from(d).map_err(|_| DeviceSettingsError::DepthTooLarge(d)))
                .transpose()?,
            tag_scope: get("tag_scope").unwrap_or_default(),
            tag_fairness: get("tag_fairness").unwrap_or_default(),
            latency: get("latency"),
            read_latency: get("read_latency"),
            write_latency: get("write_latency"),
            flush_latency: get("flush_latency"),
            seed: number("seed")?.unwrap_or(1),
            latency_spin: get("latency_spin").unwrap_or_default(),
            poll: get("poll"),
            ..DiskArgs::default()
        })
    }

    /// The disks' configurations, serving on `socket`.
    pub(crate) fn disk_configs(
        &self,
        socket: PathBuf,
    ) -> Result<Vec<DiskConfig>, DeviceSettingsError> {
        Ok(self.disk_args(socket)?.to_configs()?)
    }
}

/// What one boot runs: a scenario's variants that share device settings,
/// and those settings.
#[derive(Debug, Clone)]
pub(crate) struct Unit {
    /// The scenario's index in the run.
    pub(crate) scenario: usize,
    pub(crate) settings: BootSettings,
    /// Which of the scenario's units (its console log's name needs it when
    /// the scenario has several).
    pub(crate) part: Option<usize>,
}

/// Every scenario's units, in scenario order, on a host whose lab may
/// use `usable_cores` CPUs.
pub(crate) fn units(
    scenarios: &[Scenario],
    options: &RunOptions,
    usable_cores: u32,
) -> Result<Vec<Unit>, MachineError> {
    let mut out = Vec::new();
    for (i, s) in scenarios.iter().enumerate() {
        let b = boot_settings(s, options, usable_cores)?;
        let several = b.len() > 1;
        for (k, settings) in b.into_iter().enumerate() {
            out.push(Unit {
                scenario: i,
                settings,
                part: several.then_some(k + 1),
            });
        }
    }
    Ok(out)
}

/// A size in QEMU's `-m` syntax, in bytes: a bare number is MiB.
fn qemu_size(s: &str) -> Result<u64, SizeError> {
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        parse_size(&format!("{s}M"))
    } else {
        parse_size(s)
    }
}

/// The guest memory of `vcpus` vCPUs: `floor` up to 2 vCPUs (as written),
/// and `per_vcpu` more for each vCPU beyond 2 (QEMU syntax).
pub(crate) fn memory_for(floor: &str, per_vcpu: &str, vcpus: u32) -> Result<String, SizeError> {
    let extra = u64::from(vcpus.saturating_sub(2));
    if extra == 0 {
        return Ok(floor.to_string());
    }
    let too_large = || SizeError::Overflow(format!("{floor} + {extra} x {per_vcpu}"));
    let total = qemu_size(per_vcpu)?
        .checked_mul(extra)
        .and_then(|a| a.checked_add(qemu_size(floor).ok()?))
        .ok_or_else(too_large)?;
    Ok(format_size(total))
}

/// The memory scenario `s` gives a guest of `vcpus` vCPUs, when it says.
fn scenario_memory(s: &Scenario, vcpus: u32) -> Result<Option<String>, MachineError> {
    let Some(per_vcpu) = &s.memory_per_vcpu else {
        return Ok(s.memory.clone());
    };
    let floor = s.memory.as_deref().unwrap_or(DEFAULT_MEMORY);
    memory_for(floor, per_vcpu, vcpus)
        .map(Some)
        .map_err(|source| MachineError::Memory {
            scenario: s.name.clone(),
            memory: floor.to_string(),
            per_vcpu: per_vcpu.clone(),
            vcpus,
            source,
        })
}

/// A variant's device settings as a map (later ones win; the parser has
/// already merged globals and variant).
fn variant_device(list: &[String]) -> BTreeMap<String, String> {
    list.iter()
        .filter_map(|s| s.split_once('='))
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
}

/// The boots a scenario needs (one per group of variants with the same
/// device settings, in the order their first variants appear) and what
/// each runs with, on a host whose lab may use `usable_cores` CPUs.
pub(crate) fn boot_settings(
    s: &Scenario,
    options: &RunOptions,
    usable_cores: u32,
) -> Result<Vec<BootSettings>, MachineError> {
    let mut groups: Vec<(BTreeMap<String, String>, Vec<usize>)> = Vec::new();
    for (i, v) in s.variants.iter().enumerate() {
        let d = variant_device(&v.device);
        match groups.iter_mut().find(|(g, _)| *g == d) {
            Some((_, idx)) => idx.push(i),
            None => groups.push((d, vec![i])),
        }
    }
    groups
        .into_iter()
        .map(|(pinned, variants)| resolve(s, options, usable_cores, &pinned, variants))
        .collect()
}

/// The overrides a boot's settings record: every flag that replaced a
/// value the scenario pinned.
#[derive(Default)]
struct Picker {
    overridden: Vec<Override>,
}

impl Picker {
    /// The command line's value over the scenario's over the default,
    /// noting a replaced scenario value.
    fn pick<T: Clone + ToString>(
        &mut self,
        (setting, flag): (&str, &str),
        cli: Option<T>,
        scenario: Option<T>,
        default: impl FnOnce() -> Option<T>,
    ) -> Option<T> {
        match (cli, scenario) {
            (Some(c), Some(p)) => {
                let (scenario, used) = (p.to_string(), c.to_string());
                if scenario != used {
                    self.overridden.push(Override {
                        setting: setting.to_string(),
                        flag: flag.to_string(),
                        scenario,
                        used,
                    });
                }
                Some(c)
            }
            (Some(c), None) => Some(c),
            (None, Some(p)) => Some(p),
            (None, None) => default(),
        }
    }
}

/// One boot's settings: the scenario's (vCPUs and memory resolved for
/// `usable_cores`) under the command line's.
fn resolve(
    s: &Scenario,
    options: &RunOptions,
    usable_cores: u32,
    pinned: &BTreeMap<String, String>,
    variants: Vec<usize>,
) -> Result<BootSettings, MachineError> {
    let mut p = Picker::default();
    let m = &options.machine;
    let scenario_vcpus = s.vcpus.map(|v| v.resolve(usable_cores));
    let vcpus = p.pick(("vcpus", "--vcpus"), m.vcpus, scenario_vcpus, || {
        Some(DEFAULT_VCPUS)
    });
    let vcpus = vcpus.unwrap_or(DEFAULT_VCPUS);
    let memory = p.pick(
        ("memory", "--memory"),
        m.memory.clone(),
        scenario_memory(s, vcpus)?,
        || Some(DEFAULT_MEMORY.to_string()),
    );
    let queue_size = p.pick(
        ("queue_size", "--queue-size"),
        m.queue_size,
        s.queue_size,
        || Some(DEFAULT_QUEUE_SIZE),
    );
    let disks = p.pick(("disks", "--disks"), m.disks, Some(s.disks), || None);
    let num_queues = p.pick(("queues", "--num-queues"), m.num_queues, s.queues, || {
        Some(vcpus.min(u32::from(u16::MAX)) as u16)
    });
    let mut device = BTreeMap::new();
    for (name, default) in DEVICE_DEFAULTS {
        let setting = format!("device {name}");
        let cli = options.device.get(name).map(str::to_string);
        let value = p.pick(
            (&setting, &flag_of(name)),
            cli,
            pinned.get(*name).cloned(),
            || default.map(str::to_string),
        );
        if let Some(v) = value {
            device.insert(name.to_string(), v);
        }
    }
    debug_assert!(DEVICE_DEFAULTS
        .iter()
        .map(|(n, _)| *n)
        .eq(DEVICE_SETTINGS.iter().copied()));
    Ok(BootSettings {
        variants,
        machine: Machine {
            vcpus,
            memory: memory.unwrap_or_default(),
            disks: disks.unwrap_or(s.disks),
            num_queues: num_queues.unwrap_or_default(),
            queue_size: queue_size.unwrap_or(DEFAULT_QUEUE_SIZE),
        },
        device,
        overridden: p.overridden,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(flags: &[&str]) -> RunOptions {
        crate::lab::options::RunArgs::from_flags(flags)
            .to_options()
            .unwrap()
    }

    fn scenario(text: &str) -> Scenario {
        crate::lab::scenario::parse(text, "t.scn", "t").unwrap()
    }

    #[test]
    fn defaults_apply_when_nothing_pins() {
        let s = scenario("variant a\n");
        let b = boot_settings(&s, &args(&[]), 2).unwrap();
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].machine.vcpus, DEFAULT_VCPUS);
        assert_eq!(b[0].machine.memory, DEFAULT_MEMORY);
        assert_eq!(b[0].machine.queue_size, DEFAULT_QUEUE_SIZE);
        assert_eq!(b[0].machine.num_queues, 2);
        assert_eq!(b[0].device.get("tags").map(String::as_str), Some("none"));
        assert!(b[0].overridden.is_empty());
    }

    #[test]
    fn the_scenario_pins_and_flags_override_with_a_record() {
        let s = scenario(
            "vcpus 8\nmemory 2G\nqueue_size 128\nqueues 4\ndevice tags=shared depth=64 tag_scope=host\nvariant a\n",
        );
        let b = boot_settings(&s, &args(&[]), 2).unwrap();
        assert_eq!(b[0].machine.vcpus, 8);
        assert_eq!(b[0].machine.memory, "2G");
        assert_eq!(b[0].machine.queue_size, 128);
        assert_eq!(b[0].machine.num_queues, 4);
        assert_eq!(b[0].device["tags"], "shared");
        assert_eq!(b[0].device["depth"], "64");
        assert!(b[0].overridden.is_empty());

        let b = boot_settings(
            &s,
            &args(&["--vcpus", "2", "--depth", "32", "--memory", "2G"]),
            2,
        )
        .unwrap();
        assert_eq!(b[0].machine.vcpus, 2);
        assert_eq!(b[0].device["depth"], "32");
        let o: Vec<(&str, &str, &str, &str)> = b[0]
            .overridden
            .iter()
            .map(|o| {
                (
                    o.setting.as_str(),
                    o.flag.as_str(),
                    o.scenario.as_str(),
                    o.used.as_str(),
                )
            })
            .collect();
        // The same memory on both sides is no override.
        assert_eq!(
            o,
            vec![
                ("vcpus", "--vcpus", "8", "2"),
                ("device depth", "--depth", "64", "32")
            ]
        );
        let d = b[0].disk_args(PathBuf::from("/tmp/x.sock")).unwrap();
        assert_eq!(d.depth, Some(32));
        assert_eq!(d.tags, "shared");
        assert_eq!(d.tag_scope, "host");
        assert_eq!(d.num_queues, 4);
    }

    #[test]
    fn host_vcpus_and_their_memory_follow_the_usable_cores() {
        let s = scenario("vcpus host:16\nmemory 1G\nmemory_per_vcpu 64M\nvariant a\n");
        let machine = |flags: &[&str], cores| {
            let b = boot_settings(&s, &args(flags), cores).unwrap();
            let m = &b[0].machine;
            (
                m.vcpus,
                m.memory.clone(),
                m.num_queues,
                b[0].overridden.len(),
            )
        };
        // Two cores: the machine of a `vcpus 2`, `memory 1G` scenario.
        assert_eq!(machine(&[], 2), (2, "1G".to_string(), 2, 0));
        assert_eq!(machine(&[], 16), (16, "1920M".to_string(), 16, 0));
        assert_eq!(machine(&[], 64), (16, "1920M".to_string(), 16, 0));
        assert_eq!(machine(&[], 1), (1, "1G".to_string(), 1, 0));
        // --vcpus overrides (recorded against the number here), and the
        // memory follows the vCPUs used; --memory overrides that.
        assert_eq!(
            machine(&["--vcpus", "4"], 16),
            (4, "1152M".to_string(), 4, 1)
        );
        assert_eq!(
            machine(&["--vcpus", "16"], 16),
            (16, "1920M".to_string(), 16, 0)
        );
        assert_eq!(
            machine(&["--memory", "4G"], 64),
            (16, "4G".to_string(), 16, 1)
        );
        let b = boot_settings(&s, &args(&["--vcpus", "4"]), 16).unwrap();
        let o = &b[0].overridden[0];
        assert_eq!((o.scenario.as_str(), o.used.as_str()), ("16", "4"));
        // Without a maximum, up to 64; without `memory`, the default floor.
        let s = scenario("vcpus host\nmemory_per_vcpu 128M\nvariant a\n");
        let b = boot_settings(&s, &args(&[]), 64).unwrap();
        assert_eq!(
            (b[0].machine.vcpus, b[0].machine.memory.as_str()),
            (64, "8960M")
        );
        let b = boot_settings(&s, &args(&[]), 200).unwrap();
        assert_eq!(b[0].machine.vcpus, 64);
        // A memory too large to add up is an error, not a wrapped number.
        let s = scenario("vcpus 64\nmemory 999999999T\nmemory_per_vcpu 999999999T\nvariant a\n");
        let e = boot_settings(&s, &args(&[]), 2).unwrap_err();
        assert!(
            matches!(&e, MachineError::Memory { vcpus: 64, .. }),
            "{e:?}"
        );
    }

    #[test]
    fn memory_grows_by_its_per_vcpu_size_beyond_two_vcpus() {
        for (floor, per, vcpus, want) in [
            ("1G", "64M", 1, "1G"),
            ("1G", "64M", 2, "1G"),
            ("1G", "64M", 3, "1088M"),
            ("1G", "512M", 4, "2G"),
            ("2048", "256", 6, "3G"),
            ("1G", "1K", 3, "1048577K"),
        ] {
            assert_eq!(
                memory_for(floor, per, vcpus).unwrap(),
                want,
                "{floor} {per} {vcpus}"
            );
        }
    }

    #[test]
    fn the_default_runs_seed002_case_is_unchanged_on_two_cores() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/guest-scripts/scenarios/seed002-quick.scn"
        );
        let s = crate::lab::scenario::parse(
            &std::fs::read_to_string(path).unwrap(),
            path,
            "seed002-quick",
        )
        .unwrap();
        let b = boot_settings(&s, &args(&[]), 2).unwrap();
        assert_eq!(b.len(), 1);
        assert_eq!(
            b[0].machine,
            Machine {
                vcpus: 2,
                memory: "1G".into(),
                disks: 2,
                num_queues: 2,
                queue_size: 256
            }
        );
        assert!(b[0].overridden.is_empty());
        assert_eq!(
            boot_settings(&s, &args(&[]), 16).unwrap()[0].machine.vcpus,
            16
        );
    }

    #[test]
    fn variants_with_different_device_settings_boot_apart() {
        let s = scenario(
            "device depth=128\nvariant host-tags\ndevice tags=shared tag_scope=host\n\
             variant per-queue\ndevice tags=per-queue\nvariant host-tags-2\n\
             device tag_scope=host tags=shared\nvariant plain\n",
        );
        let b = boot_settings(&s, &args(&[]), 2).unwrap();
        let groups: Vec<Vec<usize>> = b.iter().map(|b| b.variants.clone()).collect();
        assert_eq!(groups, vec![vec![0, 2], vec![1], vec![3]]);
        assert_eq!(b[0].device["tags"], "shared");
        assert_eq!(b[1].device["tags"], "per-queue");
        assert_eq!(b[2].device["tags"], "none");
        assert!(b.iter().all(|b| b.device["depth"] == "128"));
    }

    #[test]
    fn a_variants_polling_mode_reaches_its_disks() {
        use crate::device::polling::PollMode;
        use std::time::Duration;
        let s = scenario(
            "variant notify\ndevice poll=off\nvariant adaptive\ndevice poll=adaptive:32us\n\
             variant poll\ndevice poll=on\nvariant default\n",
        );
        let b = boot_settings(&s, &args(&[]), 2).unwrap();
        assert_eq!(b.len(), 4, "each polling mode boots apart");
        let mode =
            |b: &BootSettings| b.disk_configs(PathBuf::from("/tmp/x.sock")).unwrap()[0].poll_mode();
        assert_eq!(mode(&b[0]), PollMode::Off);
        assert_eq!(
            mode(&b[1]),
            PollMode::Adaptive {
                max: Duration::from_micros(32)
            }
        );
        assert_eq!(mode(&b[2]), PollMode::Fixed(Duration::from_micros(50)));
        // The lab's default device is notify mode, as before polling modes
        // could be chosen, so earlier records stay comparable.
        assert_eq!(mode(&b[3]), PollMode::Off);
        let off = b[0].disk_configs(PathBuf::from("/tmp/x.sock")).unwrap();
        let default = b[3].disk_configs(PathBuf::from("/tmp/x.sock")).unwrap();
        assert_eq!(off, default);
        let s = scenario("variant a\ndevice poll=sometimes\n");
        let e = boot_settings(&s, &args(&[]), 2).unwrap()[0]
            .disk_configs(PathBuf::from("/tmp/x.sock"))
            .unwrap_err();
        assert!(e.to_string().contains("\"sometimes\""), "{e}");
    }

    #[test]
    fn a_bad_device_value_is_an_error_not_a_panic() {
        let s = scenario("device depth=many\nvariant a\n");
        let b = boot_settings(&s, &args(&[]), 2).unwrap();
        let e = b[0].disk_args(PathBuf::from("/tmp/x.sock")).unwrap_err();
        assert!(
            matches!(&e, DeviceSettingsError::NotANumber { name, value } if name == "depth" && value == "many"),
            "{e:?}"
        );
        assert!(e.to_string().contains("depth=many"), "{e}");
        let s = scenario("device depth=99999999999\nvariant a\n");
        let b = boot_settings(&s, &args(&[]), 2).unwrap();
        let e = b[0].disk_configs(PathBuf::from("/tmp/x.sock")).unwrap_err();
        assert!(
            matches!(e, DeviceSettingsError::DepthTooLarge(99999999999)),
            "{e:?}"
        );
    }
}
