//! A run's plan: its boots in the order they run (iterations outermost,
//! then the scenarios' boot units, then the kernels, so kernels alternate
//! A B A B and drift hits both), `blklab run --plan` to print it, and
//! `--shard I/N` to run one slice of it.
//!
//! A shard takes whole *groups*: the boots of one (iteration, unit), one
//! per kernel, so every shard holds complete A/B pairs booted back to back
//! on one machine, and group `g` goes to shard `g % N + 1`. Each shard's
//! run.json records the whole plan and its slice ([`ShardInfo`]);
//! `blklab compare DIR,DIR,...` merges shards of one plan.

use serde::Serialize;

use crate::lab::images::KernelSpec;
use crate::lab::options::Shard;
use crate::lab::run::boot::Boot;
use crate::lab::run::error::RunError;
use crate::lab::run::request::RunRequest;
use crate::lab::run::settings::Unit;
use crate::lab::scenario::Scenario;
use crate::record::run::{BootOrder, ShardInfo};

/// Every boot, in run order.
pub(crate) fn boots(kernels: usize, units: usize, iterations: u32) -> Vec<Boot> {
    let mut v = Vec::new();
    for iteration in 0..iterations {
        for unit in 0..units {
            let group = iteration as usize * units + unit;
            for kernel in 0..kernels {
                v.push(Boot {
                    kernel,
                    unit,
                    iteration,
                    group,
                });
            }
        }
    }
    v
}

/// Which shard (1-based) of `count` runs group `group`.
pub(crate) fn shard_of(group: usize, count: u32) -> u32 {
    (group % count as usize) as u32 + 1
}

/// The boots of `shard` (all of them without one), in run order.
pub(crate) fn select(boots: Vec<Boot>, shard: Option<Shard>) -> Vec<Boot> {
    match shard {
        None => boots,
        Some(s) => boots
            .into_iter()
            .filter(|b| shard_of(b.group, s.count) == s.index)
            .collect(),
    }
}

/// The label `images/prepare.sh` gives a kernel SPEC (its NAME), made
/// unique as the run does (a second `6.12` is `6.12-2`), known before
/// anything is built.
pub(crate) fn labels(specs: &[KernelSpec]) -> Vec<String> {
    let names: Vec<String> = specs.iter().map(spec_name).collect();
    unique_labels(&names)
}

fn spec_name(spec: &KernelSpec) -> String {
    match spec {
        KernelSpec::Debian(series) => format!("debian-{series}"),
        KernelSpec::Build { series, patch } => match patch {
            Some(p) => format!("{series}-{p}"),
            None => series.clone(),
        },
        KernelSpec::Path { kernel, name, .. } => match name {
            Some(n) => n.clone(),
            None => kernel
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default(),
        },
    }
}

/// `names` with characters outside `[A-Za-z0-9._+-]` replaced and
/// duplicates numbered (`6.12`, `6.12-2`).
pub(crate) fn unique_labels(names: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for n in names {
        let base: String = n
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "._+-".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let mut name = base.clone();
        let mut i = 2;
        while out.contains(&name) {
            name = format!("{base}-{i}");
            i += 1;
        }
        out.push(name);
    }
    out
}

/// `blklab run --plan`: the boots a run (or one shard of it) would make.
#[derive(Debug, Clone, Serialize)]
pub struct PlanDocument {
    /// `blklab-plan/1`.
    pub(crate) schema: String,
    pub(crate) kernels: Vec<PlanKernel>,
    pub(crate) scenarios: Vec<String>,
    pub(crate) iterations: u32,
    /// (iteration, unit) groups: what `--shard` distributes.
    pub(crate) groups: usize,
    /// The shard printed (`null`: the whole run).
    pub(crate) shard: Option<PlanShard>,
    pub(crate) boots: Vec<PlanBoot>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct PlanKernel {
    pub(crate) label: String,
    pub(crate) spec: String,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct PlanShard {
    pub(crate) index: u32,
    pub(crate) count: u32,
}

/// One boot of a plan.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct PlanBoot {
    /// Position in the whole run's order.
    pub(crate) index: usize,
    pub(crate) group: usize,
    pub(crate) kernel: String,
    pub(crate) scenario: String,
    pub(crate) iteration: u32,
    pub(crate) variants: Vec<String>,
    /// The shard that runs this boot when the run is cut into
    /// `shard.count` slices (null without --shard).
    pub(crate) shard: Option<u32>,
}

/// The shard record of run.json: the whole plan and this slice.
pub(crate) fn shard_info(shard: Shard, plan: &[BootOrder]) -> ShardInfo {
    ShardInfo {
        index: shard.index,
        count: shard.count,
        plan: plan.to_vec(),
    }
}

/// The run's boots, known before anything is built.
pub(crate) struct Plan {
    /// The kernels' labels: the ones images/prepare.sh will give (checked
    /// when it has).
    pub(crate) labels: Vec<String>,
    /// Every boot of the run, in order.
    pub(crate) all: Vec<Boot>,
    /// The boots this run (or shard) boots.
    pub(crate) boots: Vec<Boot>,
    /// `--shard`'s slice, if any.
    pub(crate) shard: Option<Shard>,
}

impl Plan {
    /// Interleave the kernels' boots and take `--shard`'s slice of them.
    pub(crate) fn new(r: &RunRequest) -> Plan {
        let kernels = &r.options.kernels;
        let all = boots(kernels.len(), r.units.len(), r.options.iterations);
        Plan {
            labels: labels(kernels),
            boots: select(all.clone(), r.options.shard),
            all,
            shard: r.options.shard,
        }
    }

    /// A shard with no boots is a mistake in `--shard`.
    pub(crate) fn check_not_empty(&self) -> Result<(), RunError> {
        if !self.boots.is_empty() {
            return Ok(());
        }
        Err(RunError::EmptyShard {
            index: self.shard.map_or(0, |s| s.index),
            count: self.shard.map_or(0, |s| s.count),
            groups: self.all.last().map_or(0, |b| b.group + 1),
        })
    }

    /// `--plan`: the boots of the run (or of its shard).
    pub(crate) fn document(&self, r: &RunRequest) -> PlanDocument {
        let (specs, labels, scenarios, units) =
            (&r.options.kernels, &self.labels, &r.scenarios, &r.units);
        let (all, selected) = (&self.all, &self.boots);
        PlanDocument {
            schema: "blklab-plan/1".into(),
            kernels: specs
                .iter()
                .zip(labels)
                .map(|(s, l)| PlanKernel {
                    label: l.clone(),
                    spec: s.to_prepare_arg(),
                })
                .collect(),
            scenarios: scenarios.iter().map(|s| s.name.clone()).collect(),
            iterations: r.options.iterations,
            groups: all.last().map_or(0, |b| b.group + 1),
            shard: self.shard.map(|s| PlanShard {
                index: s.index,
                count: s.count,
            }),
            boots: selected
                .iter()
                .map(|b| {
                    let o = boot_order(b, units, scenarios, labels);
                    PlanBoot {
                        index: all.iter().position(|x| x == b).unwrap_or(0),
                        group: b.group,
                        kernel: o.kernel,
                        scenario: o.scenario,
                        iteration: o.iteration,
                        variants: o.variants,
                        shard: self.shard.map(|sh| shard_of(b.group, sh.count)),
                    }
                })
                .collect(),
        }
    }
}

/// What run.json says of boot `b`: its kernel's label, scenario,
/// iteration, variants and machine.
pub(crate) fn boot_order(
    b: &Boot,
    units: &[Unit],
    scenarios: &[Scenario],
    labels: &[String],
) -> BootOrder {
    let u = &units[b.unit];
    let s = &scenarios[u.scenario];
    BootOrder {
        kernel: labels[b.kernel].clone(),
        scenario: s.name.clone(),
        iteration: b.iteration,
        variants: u
            .settings
            .variants
            .iter()
            .map(|&i| s.variants[i].name.clone())
            .collect(),
        machine: Some(u.settings.machine.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_parse_and_refuse_nonsense() {
        assert_eq!(
            "2/3".parse::<Shard>().unwrap(),
            Shard { index: 2, count: 3 }
        );
        assert_eq!(
            "1/1".parse::<Shard>().unwrap(),
            Shard { index: 1, count: 1 }
        );
        for bad in ["0/3", "4/3", "1/0", "x/3", "3", "", "1/1001", "-1/3"] {
            let e = bad.parse::<Shard>().unwrap_err();
            assert!(e.contains("I/N"), "{bad}: {e}");
        }
    }

    #[test]
    fn kernels_alternate_and_shards_take_whole_groups() {
        let all = boots(2, 3, 2);
        assert_eq!(all.len(), 12);
        let ks: Vec<usize> = all.iter().map(|b| b.kernel).collect();
        assert_eq!(ks, [0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1]);
        // Three shards: every boot in exactly one, each with both kernels
        // of every group it has, in run order.
        let mut seen = Vec::new();
        for i in 1..=3 {
            let s = select(all.clone(), Some(Shard { index: i, count: 3 }));
            assert_eq!(s.len(), 4, "shard {i}");
            for pair in s.chunks(2) {
                assert_eq!(pair[0].group, pair[1].group);
                assert_eq!((pair[0].kernel, pair[1].kernel), (0, 1));
            }
            seen.extend(s);
        }
        seen.sort_by_key(|b| (b.group, b.kernel));
        assert_eq!(seen, all);
        // More shards than groups: the extra ones are empty.
        assert!(select(all.clone(), Some(Shard { index: 7, count: 7 })).is_empty());
        assert_eq!(select(all.clone(), None), all);
    }

    #[test]
    fn labels_are_known_before_building_and_unique() {
        let specs: Vec<KernelSpec> = [
            "build:6.12",
            "build:6.12+noplug",
            "debian-6.12",
            "build:6.12",
            "path:/x/y/bzImage",
            "path:/b/bzImage,name=mine",
        ]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
        assert_eq!(
            labels(&specs),
            [
                "6.12",
                "6.12-noplug",
                "debian-6.12",
                "6.12-2",
                "bzImage",
                "mine"
            ]
        );
        assert_eq!(
            unique_labels(&["6.12".into(), "6.12".into(), "a b".into()]),
            ["6.12", "6.12-2", "a_b"]
        );
    }
}
