//! `blklab run`: serve the disks in-process, boot QEMU per (kernel,
//! scenario, iteration) with the kernels interleaved, answer the guest's
//! SYNC lines with backend and host snapshots, and write one
//! self-describing JSON per (kernel, scenario, variant, iteration).
//!
//! `run` is the table of contents, one phase a function:
//! `check_arguments` → `plan` → `prepare_lab` (images, accelerator,
//! plugin, System.maps) → `write_run_document` → `boot_all` (each
//! planned boot with its retry policy, `boot_with_retry`) →
//! `write_summary`. One boot is `boot` and its console session
//! `session`; the accelerator choice is `accel`.

pub(crate) mod boot;
pub(crate) mod nested_host;
pub mod nested_inner;
pub(crate) mod plan;
pub(crate) mod progress;
pub(crate) mod session;
pub(crate) mod settings;
pub mod summary;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use log::{info, warn};
use thiserror::Error;

use crate::lab::guest::accel::{decide_accel, AccelError};
use crate::lab::guest::qemu::{self, Accel};
use crate::lab::images::nested_host::{prepare_nested_host, NestedHostImage};
use crate::lab::images::{self, KernelSpec, PreparedGuest};
use crate::lab::measure::plugin::{self as insns, SymbolMap};
use crate::lab::nested::relay::SyncRelay;
use crate::lab::options::{CountInsns, RunArgs};
use crate::lab::run::boot::{BootCtx, BootFailure, Retry};
use crate::lab::run::nested_host::{HostMachine, HostRun, NestedError};
use crate::lab::run::plan::{self as run_plan, Boot};
use crate::lab::run::progress::Progress;
use crate::lab::run::session::{run_boot, INSNS_WINDOW};
use crate::lab::run::settings::{DeviceSettingsError, Unit};
use crate::lab::scenario::{self, Scenario};
use crate::record::result::ResultRecord;
use crate::record::run::{
    new_run_id, BootOrder, HostInfo, InsnsSetup, KernelEntry, QemuInfo, RunDocument, RunStamp,
    RUN_SCHEMA,
};
use crate::record::summary::{RetriedBoot, SummaryDocument, SUMMARY_SCHEMA};
use crate::record::RecordError;
use crate::util::{host, wallclock};

/// `YYYYmmdd-HHMMSS` in UTC, the default output directory's name (also
/// `blklab bisect`'s).
use crate::util::wallclock::utc_stamp;

/// Why `blklab run` failed, by kind: a bad argument or scenario, the
/// images, the accelerator, QEMU, writing the results, or a boot.
#[derive(Debug, Error)]
pub enum RunError {
    #[error(transparent)]
    Scenario(#[from] scenario::ScenarioError),
    #[error(transparent)]
    Image(#[from] images::ImageError),
    #[error(transparent)]
    Qemu(#[from] qemu::QemuError),
    #[error("--iterations must be at least 1")]
    NoIterations,
    #[error("--out {dir}: it holds {file} of an earlier run; a run writes into an empty or new directory, so that `blklab compare` never pools two runs' records (give another --out, or remove it)")]
    OutHoldsRecords { dir: PathBuf, file: String },
    #[error("--vcpus must be 1..=64")]
    VcpusOutOfRange,
    #[error(
        "--variants: scenario {scenario} has no variant {variant:?} (it has: {})",
        available.join(", ")
    )]
    NoSuchVariant {
        scenario: String,
        variant: String,
        available: Vec<String>,
    },
    #[error(
        "scenario {} is valid but not in {}: the guest only has the scenarios packed \
         into its initramfs; copy it there (the image is rebuilt automatically)",
        path.display(),
        dir.display()
    )]
    ScenarioNotShipped { path: PathBuf, dir: PathBuf },
    #[error("scenario {0} given twice")]
    ScenarioTwice(String),
    #[error("scenario {scenario} ({variants}): {vcpus} vCPUs (want 1 to 64)")]
    UnitVcpus {
        scenario: String,
        variants: String,
        vcpus: u32,
    },
    #[error(
        "scenario {scenario} ({variants}): memory {memory} is not a whole number of 2 MiB \
         huge pages, which a nested run's guests are made of"
    )]
    UnitHugePages {
        scenario: String,
        variants: String,
        memory: String,
    },
    #[error("scenario {scenario} ({variants}): device settings: {source}")]
    UnitDevice {
        scenario: String,
        variants: String,
        #[source]
        source: DeviceSettingsError,
    },
    #[error(
        "--shard {index}/{count}: this shard has no boots (the run has {groups} (iteration, scenario part) groups)"
    )]
    EmptyShard {
        index: u32,
        count: u32,
        groups: usize,
    },
    #[error(
        "images/prepare.sh named the kernels [{}], the plan [{}]: a blklab binary and lab tree of different versions?",
        prepared.join(", "),
        planned.join(", ")
    )]
    LabelMismatch {
        prepared: Vec<String>,
        planned: Vec<String>,
    },
    #[error(transparent)]
    Accel(#[from] AccelError),
    #[error(transparent)]
    Nested(#[from] NestedError),
    #[error("inside the nested host the guests would not run under KVM ({reason})")]
    NoKvmInside { reason: String },
    #[error(
        "--count-insns: no System.map next to {} (symbolisation needs the kernel's \
         System.map; self-built kernels have one, Debian's linux-image packages only a \
         placeholder: the real one is in linux-image-…-dbg)",
        kernel.display()
    )]
    NoSystemMap { kernel: PathBuf },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Insns(#[from] insns::InsnsError),
    #[error(transparent)]
    Record(#[from] RecordError),
    #[error(
        "guest {kernel}, scenario {scenario}, iteration {iteration}: the guest kernel reported a fault \
         (console kept: {}); the report, whole:\n{trace}",
        console.display()
    )]
    KernelFault {
        kernel: String,
        scenario: String,
        iteration: u32,
        console: PathBuf,
        trace: String,
    },
    /// A boot failed (twice, when its failure is worth a second boot:
    /// `first` is the first attempt's).
    #[error(
        "guest {kernel}, scenario {scenario}, iteration {iteration}: {failure} ({})",
        attempts_note(first.as_deref(), console)
    )]
    Boot {
        kernel: String,
        scenario: String,
        iteration: u32,
        console: PathBuf,
        #[source]
        failure: Box<BootFailure>,
        first: Option<Box<BootFailure>>,
    },
}

/// Where a failed boot's console is, and what the first attempt said when
/// there were two.
fn attempts_note(first: Option<&BootFailure>, console: &Path) -> String {
    match first {
        Some(first) => format!(
            "second attempt; the first failed too: {first}; console: {}",
            console.display()
        ),
        None => format!("console: {}", console.display()),
    }
}

/// Everything `blklab run` produced.
pub enum RunOutcome {
    /// `--plan`: what would run; nothing was built or booted.
    Plan(run_plan::PlanDocument),
    /// The run's records, in `out_dir`.
    Ran {
        out_dir: PathBuf,
        records: Vec<ResultRecord>,
        failures: Vec<String>,
    },
}

/// Run the lab as `args` says.
pub fn run(args: &RunArgs) -> Result<RunOutcome, RunError> {
    // First, before any thread starts: SIGINT/SIGTERM stop QEMU and
    // remove the boots' directories.
    crate::lab::guest::cleanup::install();
    let setup = check_arguments(args)?;
    let plan = plan(args, &setup);
    if args.plan {
        return Ok(RunOutcome::Plan(plan_document(args, &setup, &plan)));
    }
    check_shard_not_empty(args, &plan)?;
    let lab = prepare_lab(args, &setup, &plan, None)?;
    let stamp = write_run_document(args, &setup, &plan, &lab)?;
    let boots = match &lab.nested_host {
        Some(host) => boot_nested_host(args, &setup, &plan, &lab, host, &stamp)?,
        None => boot_all(args, &setup, &plan, &lab, &stamp, None)?,
    };
    finish(lab, boots)
}

/// The lab inside a nested host (`blklab nested-inner`): the outer lab
/// prepared the `guests`; every variant's SYNC goes through `relay` to the
/// outer lab, which counts instructions over the same window.
pub(crate) fn run_inside(
    args: &RunArgs,
    guests: Vec<PreparedGuest>,
    relay: &dyn SyncRelay,
) -> Result<RunOutcome, RunError> {
    crate::lab::guest::cleanup::install();
    let setup = check_arguments(args)?;
    let plan = plan(args, &setup);
    check_shard_not_empty(args, &plan)?;
    let lab = prepare_lab(args, &setup, &plan, Some(guests))?;
    if lab.accel != Accel::Kvm {
        return Err(RunError::NoKvmInside {
            reason: lab.accel_reason,
        });
    }
    let stamp = write_run_document(args, &setup, &plan, &lab)?;
    let boots = boot_all(args, &setup, &plan, &lab, &stamp, Some(relay))?;
    finish(lab, boots)
}

/// Write the summary; the run's outcome.
fn finish(lab: Lab, boots: Boots) -> Result<RunOutcome, RunError> {
    write_summary(&lab.out_dir, &boots.records, &boots.failures, boots.retried)?;
    Ok(RunOutcome::Ran {
        out_dir: lab.out_dir,
        records: boots.records,
        failures: boots.failures,
    })
}

/// What the arguments ask for, checked: nothing is built or booted yet.
struct Setup {
    specs: Vec<KernelSpec>,
    lab_dir: PathBuf,
    scenarios: Vec<Scenario>,
    /// Every scenario's boot units, in scenario order.
    units: Vec<Unit>,
}

/// Check the kernels, counts, scenarios and every boot's machine and device
/// settings, before building or booting anything.
fn check_arguments(args: &RunArgs) -> Result<Setup, RunError> {
    let specs: Vec<KernelSpec> = args
        .kernel
        .iter()
        .map(|k| k.parse())
        .collect::<Result<_, _>>()?;
    for s in &specs {
        s.check()?;
    }
    if args.iterations == 0 {
        return Err(RunError::NoIterations);
    }
    if args.vcpus.is_some_and(|v| v == 0 || v > 64) {
        return Err(RunError::VcpusOutOfRange);
    }
    if args.accel == Accel::Nested && args.deterministic {
        return Err(AccelError::NestedDeterministic.into());
    }
    let lab_dir = images::lab_dir(args.place.lab_dir.get())?;
    let scenarios: Vec<Scenario> = load_scenarios(&args.scenario, &lab_dir)?
        .into_iter()
        .map(|s| apply_overrides(s, args))
        .collect::<Result<_, _>>()?;
    let units = settings::units(&scenarios, args);
    let huge_pages = args.accel == Accel::Nested || args.huge_page_guests;
    check_units(&scenarios, &units, huge_pages)?;
    Ok(Setup {
        specs,
        lab_dir,
        scenarios,
        units,
    })
}

/// The scenario a run executes, after `--runtime`/`--variants`.
fn apply_overrides(mut s: Scenario, args: &RunArgs) -> Result<Scenario, RunError> {
    if let Some(filter) = &args.variants {
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
        if let Some(r) = args.runtime {
            v.runtime = r;
        }
        if let Some(r) = args.ramp {
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

/// The run's boots, known before anything is built.
struct Plan {
    /// The kernels' labels: the ones images/prepare.sh will give (checked
    /// when it has).
    labels: Vec<String>,
    /// Every boot of the run, in order.
    all: Vec<Boot>,
    /// The boots this run (or shard) boots.
    boots: Vec<Boot>,
}

/// Interleave the kernels' boots and take `--shard`'s slice of them.
fn plan(args: &RunArgs, setup: &Setup) -> Plan {
    let all = run_plan::boots(setup.specs.len(), setup.units.len(), args.iterations);
    Plan {
        labels: run_plan::labels(&setup.specs),
        boots: run_plan::select(all.clone(), args.shard),
        all,
    }
}

/// A shard with no boots is a mistake in `--shard`.
fn check_shard_not_empty(args: &RunArgs, plan: &Plan) -> Result<(), RunError> {
    if !plan.boots.is_empty() {
        return Ok(());
    }
    Err(RunError::EmptyShard {
        index: args.shard.map_or(0, |s| s.index),
        count: args.shard.map_or(0, |s| s.count),
        groups: plan.all.last().map_or(0, |b| b.group + 1),
    })
}

/// `--plan`: the boots of the run (or of its shard).
fn plan_document(args: &RunArgs, setup: &Setup, plan: &Plan) -> run_plan::PlanDocument {
    let (specs, labels, scenarios, units) =
        (&setup.specs, &plan.labels, &setup.scenarios, &setup.units);
    let (all, selected) = (&plan.all, &plan.boots);
    run_plan::PlanDocument {
        schema: "blklab-plan/1".into(),
        kernels: specs
            .iter()
            .zip(labels)
            .map(|(s, l)| run_plan::PlanKernel {
                label: l.clone(),
                spec: s.to_prepare_arg(),
            })
            .collect(),
        scenarios: scenarios.iter().map(|s| s.name.clone()).collect(),
        iterations: args.iterations,
        groups: all.last().map_or(0, |b| b.group + 1),
        shard: args.shard.map(|s| run_plan::PlanShard {
            index: s.index,
            count: s.count,
        }),
        boots: selected
            .iter()
            .map(|b| {
                let o = boot_order(b, units, scenarios, labels);
                run_plan::PlanBoot {
                    index: all.iter().position(|x| x == b).unwrap_or(0),
                    group: b.group,
                    kernel: o.kernel,
                    scenario: o.scenario,
                    iteration: o.iteration,
                    variants: o.variants,
                    shard: args.shard.map(|sh| run_plan::shard_of(b.group, sh.count)),
                }
            })
            .collect(),
    }
}

/// What run.json says of boot `b`: its kernel's label, scenario,
/// iteration, variants and machine.
fn boot_order(b: &Boot, units: &[Unit], scenarios: &[Scenario], labels: &[String]) -> BootOrder {
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

/// The lab a run boots in: QEMU, the output directory, the prepared
/// guests, the accelerator and, with instruction counts, the plugin and
/// each kernel's System.map.
struct Lab {
    qemu: String,
    out_dir: PathBuf,
    guests: Vec<PreparedGuest>,
    accel: Accel,
    accel_reason: String,
    plugin: Option<PathBuf>,
    /// By kernel; `Some` when instructions are counted.
    maps: Vec<Option<Arc<SymbolMap>>>,
    /// `--accel nested`: the emulated host the guests boot in.
    nested_host: Option<NestedHostImage>,
}

/// Find QEMU, make the output directory, prepare the guests' images (or
/// take the `given` ones), choose the accelerator and, to count
/// instructions, build the plugin and read each kernel's System.map.
fn prepare_lab(
    args: &RunArgs,
    setup: &Setup,
    plan: &Plan,
    given: Option<Vec<PreparedGuest>>,
) -> Result<Lab, RunError> {
    let qemu = qemu::locate(&args.qemu)?.display().to_string();
    let out_dir = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("blklab-results").join(utc_stamp()));
    refuse_earlier_records(&out_dir)?;
    for d in [out_dir.clone(), out_dir.join("console")] {
        std::fs::create_dir_all(&d).map_err(|source| RunError::Write { path: d, source })?;
    }
    log_to_results(&out_dir);
    let guests = match given {
        Some(guests) => guests,
        None => {
            info!("preparing {} guest image(s)", setup.specs.len());
            images::prepare(&setup.lab_dir, args.place.cache.get(), &setup.specs)?
        }
    };
    let prepared = labels(&guests);
    if prepared != plan.labels {
        return Err(RunError::LabelMismatch {
            prepared,
            planned: plan.labels.clone(),
        });
    }
    let (accel, accel_reason, plugin) = choose_accel(args, &setup.lab_dir, &qemu, &guests)?;
    let maps = symbol_maps(&guests, plugin.is_some())?;
    info!("accelerator: {} ({accel_reason})", accel.describe());
    let most_vcpus = setup.units.iter().map(|u| u.settings.machine.vcpus).max();
    if plugin.is_some() && args.deterministic && most_vcpus.is_some_and(|n| n > 1) {
        warn!(
            "--deterministic with more than one vCPU: single-threaded TCG shares translated blocks \
             between the vCPUs, so the plugin counts a block cut short (a fault, a device access) \
             in full there (each record's instructions.window.cut_unavailable says so)"
        );
    }
    let nested_host = match accel {
        Accel::Nested => {
            info!("preparing the nested host's image");
            Some(prepare_nested_host(
                &setup.lab_dir,
                args.place.cache.get(),
                &qemu,
            )?)
        }
        _ => None,
    };
    Ok(Lab {
        qemu,
        out_dir,
        guests,
        accel,
        accel_reason,
        plugin,
        maps,
        nested_host,
    })
}

/// Refuse an output directory that holds a run document or records: a run
/// writes only into an empty or new directory.
fn refuse_earlier_records(dir: &Path) -> Result<(), RunError> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    let mut earlier: Vec<String> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".json"))
        .collect();
    earlier.sort();
    match earlier.first() {
        None => Ok(()),
        Some(first) => Err(RunError::OutHoldsRecords {
            dir: dir.to_path_buf(),
            file: if earlier.len() == 1 {
                first.clone()
            } else {
                format!("{first} and {} more JSON document(s)", earlier.len() - 1)
            },
        }),
    }
}

/// Copy the log to `out_dir/blklab.log` and say so once: the backend's
/// and QEMU's messages go there, not to the terminal.
fn log_to_results(out_dir: &Path) {
    let path = out_dir.join("blklab.log");
    match crate::util::logging::log_to_file(&path) {
        Ok(true) => info!(
            "logs: {} (the backend's and QEMU's messages; -v shows them here too), guest consoles in {}",
            path.display(),
            out_dir.join("console").display()
        ),
        Ok(false) => {}
        Err(e) => warn!("cannot write {}: {e}", path.display()),
    }
}

/// Unique labels for the kernels (the prepared names, suffixed on clashes).
fn labels(guests: &[PreparedGuest]) -> Vec<String> {
    let names: Vec<String> = guests.iter().map(|g| g.name.clone()).collect();
    run_plan::unique_labels(&names)
}

/// The accelerator, why, and the instruction-count plugin when counting
/// (`--count-insns auto` goes on without it when it cannot be built).
fn choose_accel(
    args: &RunArgs,
    lab_dir: &Path,
    qemu: &str,
    guests: &[PreparedGuest],
) -> Result<(Accel, String, Option<PathBuf>), RunError> {
    let decision = decide_accel(
        args.accel,
        args.count_insns,
        args.deterministic,
        &crate::util::kvm_host::classify(),
        || {
            qemu::probe_kvm(
                qemu,
                &guests[0].kernel,
                &guests[0].initramfs,
                args.kvm_probe_timeout,
            )
        },
        || {
            // Every kernel needs a usable System.map (Debian's packages ship
            // a placeholder one; the real map is in linux-image-…-dbg).
            guests
                .iter()
                .all(|g| system_map(&g.kernel).is_some_and(|p| SymbolMap::read(&p).is_ok()))
        },
    )?;
    if let Some(why) = &decision.no_insns_because {
        info!("no instruction counts (--count-insns auto): {why}");
    }
    let plugin = if decision.count_insns {
        info!("building the instruction-count plugin for {qemu}");
        match insns::build_plugin(lab_dir, args.place.cache.get(), qemu) {
            Ok(p) => Some(p),
            Err(e) if args.count_insns != CountInsns::On => {
                warn!("no instruction counts (--count-insns auto): {e}");
                None
            }
            Err(e) => return Err(e.into()),
        }
    } else {
        None
    };
    Ok((decision.accel, decision.reason, plugin))
}

/// The System.map next to a kernel image.
fn system_map(kernel: &Path) -> Option<PathBuf> {
    let p = kernel.parent()?.join("System.map");
    p.is_file().then_some(p)
}

/// Each kernel's System.map when counting instructions (symbolisation
/// needs them, so they are checked before booting).
fn symbol_maps(
    guests: &[PreparedGuest],
    count_insns: bool,
) -> Result<Vec<Option<Arc<SymbolMap>>>, RunError> {
    guests
        .iter()
        .map(|g| {
            if !count_insns {
                return Ok(None);
            }
            let p = system_map(&g.kernel).ok_or_else(|| RunError::NoSystemMap {
                kernel: g.kernel.clone(),
            })?;
            Ok(Some(Arc::new(SymbolMap::read(&p)?)))
        })
        .collect()
}

/// run.json: what the run is (its id, versions, host, QEMU, kernels,
/// scenarios, the order of its boots), written before the first boot.
/// Returns what each of its records carries of it.
fn write_run_document(
    args: &RunArgs,
    setup: &Setup,
    plan: &Plan,
    lab: &Lab,
) -> Result<RunStamp, RunError> {
    let order_of = |boots: &[Boot]| -> Vec<BootOrder> {
        boots
            .iter()
            .map(|b| boot_order(b, &setup.units, &setup.scenarios, &plan.labels))
            .collect()
    };
    let started_unix = wallclock::unix_now();
    let run_doc = RunDocument {
        schema: RUN_SCHEMA.to_string(),
        run_id: Some(new_run_id(started_unix)),
        started_unix,
        blklab_version: env!("CARGO_PKG_VERSION").to_string(),
        git_commit: crate::stats::queue::GIT_COMMIT.to_string(),
        command_line: std::env::args().collect(),
        accel: lab.accel,
        accel_reason: lab.accel_reason.clone(),
        deterministic: args.deterministic,
        count_insns: lab.plugin.as_ref().map(|p| InsnsSetup {
            plugin: p.clone(),
            window: INSNS_WINDOW.to_string(),
        }),
        host: host_info(),
        qemu: QemuInfo {
            path: lab.qemu.clone(),
            version: qemu::version(&lab.qemu),
        },
        kernels: lab
            .guests
            .iter()
            .zip(&plan.labels)
            .map(|(g, n)| KernelEntry {
                label: n.clone(),
                spec: g.spec.clone(),
                kernel: g.kernel.clone(),
                initramfs: g.initramfs.clone(),
                manifests: g.manifests(),
            })
            .collect(),
        scenarios: setup.scenarios.clone(),
        iterations: args.iterations,
        order: order_of(&plan.boots),
        shard: args
            .shard
            .map(|sh| run_plan::shard_info(sh, &order_of(&plan.all))),
        nested_host: lab
            .nested_host
            .as_ref()
            .map(|h| nested_host::info(h, HostMachine::for_units(&setup.units))),
    };
    crate::record::write(&lab.out_dir.join("run.json"), &run_doc)?;
    Ok(run_doc.stamp())
}

/// What the host is: name, CPUs, kernel, CPU model (for the report's
/// "what differs besides the kernel").
fn host_info() -> HostInfo {
    HostInfo {
        hostname: host::hostname(),
        kernel: host::kernel_release(),
        cpus: host::cpus(),
        cpu_model: host::cpu_model(),
    }
}

/// What the boots produced.
struct Boots {
    records: Vec<ResultRecord>,
    failures: Vec<String>,
    retried: Vec<RetriedBoot>,
}

/// Boot every planned boot in order, each with its retry policy (inside a
/// nested host, every SYNC relayed to the outer lab).
fn boot_all(
    args: &RunArgs,
    setup: &Setup,
    plan: &Plan,
    lab: &Lab,
    stamp: &RunStamp,
    relay: Option<&dyn SyncRelay>,
) -> Result<Boots, RunError> {
    let total: u64 = plan
        .boots
        .iter()
        .map(|b| setup.units[b.unit].settings.variants.len() as u64)
        .sum();
    let pb = Progress::new(total, plan.boots.len(), !args.no_progress);
    let mut out = Boots {
        records: Vec::new(),
        failures: Vec::new(),
        retried: Vec::new(),
    };
    for (seq, boot) in plan.boots.iter().enumerate() {
        let unit = &setup.units[boot.unit];
        let ctx = BootCtx {
            args,
            seq,
            boot,
            label: &plan.labels[boot.kernel],
            guest: &lab.guests[boot.kernel],
            scenario: &setup.scenarios[unit.scenario],
            unit,
            accel: lab.accel,
            qemu: &lab.qemu,
            out_dir: &lab.out_dir,
            pb: &pb,
            plugin: lab.plugin.as_deref(),
            symbols: lab.maps[boot.kernel].clone(),
            stamp,
            relay,
        };
        pb.boot(
            seq,
            &format!("{} {} #{}", ctx.label, ctx.scenario.name, boot.iteration),
        );
        let (mut records, mut failures) = boot_with_retry(&ctx, &mut out.retried)?;
        out.records.append(&mut records);
        out.failures.append(&mut failures);
    }
    pb.finish();
    Ok(out)
}

/// `--accel nested`: boot the emulated host once; inside it the lab runs
/// every planned boot under KVM ([`run_inside`]); its records come back
/// with the instructions the host and the guests executed in each window.
fn boot_nested_host(
    args: &RunArgs,
    setup: &Setup,
    plan: &Plan,
    lab: &Lab,
    host: &NestedHostImage,
    stamp: &RunStamp,
) -> Result<Boots, RunError> {
    let variants: u64 = plan
        .boots
        .iter()
        .map(|b| setup.units[b.unit].settings.variants.len() as u64)
        .sum();
    let longest_variant = setup
        .scenarios
        .iter()
        .flat_map(|s| &s.variants)
        .map(|v| v.runtime + v.ramp)
        .max()
        .unwrap_or(0);
    let pb = Progress::new(variants, plan.boots.len(), !args.no_progress);
    let run = HostRun {
        args,
        lab_dir: &setup.lab_dir,
        guests: &lab.guests,
        labels: &plan.labels,
        out_dir: &lab.out_dir,
        qemu: &lab.qemu,
        image: host,
        plugin: lab.plugin.as_deref(),
        maps: &lab.maps,
        machine: HostMachine::for_units(&setup.units),
        longest_variant: std::time::Duration::from_secs(longest_variant),
        pb: &pb,
        stamp,
    };
    let out = nested_host::boot(&run)?;
    pb.finish();
    Ok(Boots {
        records: out.records,
        failures: out.failures,
        retried: out.retried,
    })
}

/// One boot, and a second when the first failed in a way worth it
/// ([`BootFailure::retry`]): the first attempt's console log is kept as
/// `*.attempt1.log` and the retry listed in summary.json. Any other
/// failure, a guest kernel fault above all, fails the run with the
/// boot's console named.
fn boot_with_retry(
    c: &BootCtx,
    retried: &mut Vec<RetriedBoot>,
) -> Result<(Vec<ResultRecord>, Vec<String>), RunError> {
    let first = match run_boot(c) {
        Ok(done) => return Ok(done),
        Err(f) => f,
    };
    if first.retry() == Retry::Never {
        return Err(boot_failed(c, first, None));
    }
    let kept = c.console_log().with_extension("attempt1.log");
    let _ = std::fs::rename(c.console_log(), &kept);
    let why = first.to_string();
    warn!(
        "{} {} #{}: the boot did not get going ({}); booting once more (console: {})",
        c.label,
        c.scenario.name,
        c.boot.iteration,
        why.lines().next().unwrap_or(""),
        kept.display()
    );
    retried.push(RetriedBoot {
        kernel: c.label.to_string(),
        scenario: c.scenario.name.clone(),
        iteration: c.boot.iteration,
        error: why,
        console: kept,
    });
    c.pb.retry();
    run_boot(c).map_err(|f| boot_failed(c, f, Some(first)))
}

/// The run's error for a boot that failed with `failure` (after `first`,
/// on a second attempt).
fn boot_failed(c: &BootCtx, failure: BootFailure, first: Option<BootFailure>) -> RunError {
    match failure {
        BootFailure::KernelFault { report } => RunError::KernelFault {
            kernel: c.label.to_string(),
            scenario: c.scenario.name.clone(),
            iteration: c.boot.iteration,
            console: c.console_log(),
            trace: report,
        },
        failure => RunError::Boot {
            kernel: c.label.to_string(),
            scenario: c.scenario.name.clone(),
            iteration: c.boot.iteration,
            console: c.console_log(),
            failure: Box::new(failure),
            first: first.map(Box::new),
        },
    }
}

/// summary.json and summary.txt: the table of every record, the failed
/// variants and the retried boots.
fn write_summary(
    out_dir: &Path,
    records: &[ResultRecord],
    failures: &[String],
    retried: Vec<RetriedBoot>,
) -> Result<(), RunError> {
    // The planned variant runs that left no record are counted as not run.
    let order = summary::run_order(out_dir);
    let sum_doc = SummaryDocument {
        schema: SUMMARY_SCHEMA.to_string(),
        finished_unix: wallclock::unix_now(),
        failures: failures.to_vec(),
        retried_boots: retried,
        rows: summary::rows_planned(records, &order),
    };
    crate::record::write(&out_dir.join("summary.json"), &sum_doc)?;
    let txt = out_dir.join("summary.txt");
    std::fs::write(&txt, summary::table_planned(records, &order))
        .map_err(|source| RunError::Write { path: txt, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(flags: &[&str]) -> RunArgs {
        RunArgs::from_flags(flags)
    }

    fn scenario(text: &str) -> Scenario {
        scenario::parse(text, "t.scn", "t").unwrap()
    }

    #[test]
    fn an_output_directory_with_an_earlier_runs_documents_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("out");
        // New, or existing and empty (or holding consoles only): written into.
        refuse_earlier_records(&dir).unwrap();
        std::fs::create_dir_all(dir.join("console")).unwrap();
        std::fs::write(dir.join("blklab.log"), "").unwrap();
        refuse_earlier_records(&dir).unwrap();
        std::fs::write(dir.join("run.json"), "{}").unwrap();
        let e = refuse_earlier_records(&dir).unwrap_err();
        assert!(matches!(e, RunError::OutHoldsRecords { .. }), "{e:?}");
        assert!(
            e.to_string().contains("holds run.json of an earlier run"),
            "{e}"
        );
        std::fs::write(dir.join("k.s.v.01.json"), "{}").unwrap();
        let e = refuse_earlier_records(&dir).unwrap_err().to_string();
        assert!(e.contains("k.s.v.01.json and 1 more"), "{e}");
    }

    #[test]
    fn bad_counts_are_refused_by_kind_before_anything_else() {
        let e = check_arguments(&args(&["--iterations", "0"]))
            .err()
            .unwrap();
        assert!(matches!(e, RunError::NoIterations), "{e:?}");
        assert_eq!(e.to_string(), "--iterations must be at least 1");
        let e = check_arguments(&args(&["--vcpus", "65"])).err().unwrap();
        assert!(matches!(e, RunError::VcpusOutOfRange), "{e:?}");
        let e = check_arguments(&args(&["--accel", "nested", "--deterministic"]))
            .err()
            .unwrap();
        assert!(
            matches!(e, RunError::Accel(AccelError::NestedDeterministic)),
            "{e:?}"
        );
        let e = check_arguments(&args(&["--kernel", "path:/nonexistent/vmlinuz"]))
            .err()
            .unwrap();
        assert!(
            matches!(e, RunError::Image(images::ImageError::MissingKernel(_))),
            "{e:?}"
        );
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
        let units = settings::units(std::slice::from_ref(&s), &a);
        check_units(std::slice::from_ref(&s), &units, false).unwrap();
        // A nested run's guests are made of 2 MiB pages.
        let s = scenario("memory 1025M\nvariant a\n");
        let units = settings::units(std::slice::from_ref(&s), &args(&[]));
        check_units(std::slice::from_ref(&s), &units, false).unwrap();
        let e = check_units(std::slice::from_ref(&s), &units, true).unwrap_err();
        assert!(
            matches!(&e, RunError::UnitHugePages { memory, .. } if memory == "1025M"),
            "{e:?}"
        );
        let s = scenario("memory 1026M\nvariant a\n");
        let units = settings::units(std::slice::from_ref(&s), &args(&[]));
        check_units(std::slice::from_ref(&s), &units, true).unwrap();
        let s = scenario("device tags=sideways\nvariant a\nvariant b\n");
        let units = settings::units(std::slice::from_ref(&s), &args(&[]));
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

    #[test]
    fn a_failed_boot_names_its_console_and_its_first_attempt() {
        let q = || crate::lab::guest::qemu::QemuError::Timeout {
            secs: 180,
            what: "the guest to boot (BLKLAB-INIT)".into(),
            console: String::new(),
        };
        let console = Path::new("/out/console/k.s.01.log");
        assert_eq!(
            attempts_note(None, console),
            "console: /out/console/k.s.01.log"
        );
        assert_eq!(
            attempts_note(Some(&BootFailure::Silent(q())), console),
            "second attempt; the first failed too: timed out after 180 s waiting for the \
             guest to boot (BLKLAB-INIT); last console lines:\n; console: /out/console/k.s.01.log"
        );
        let e = RunError::Boot {
            kernel: "k".into(),
            scenario: "s".into(),
            iteration: 1,
            console: console.into(),
            failure: Box::new(BootFailure::NeverBooted),
            first: None,
        };
        assert_eq!(
            e.to_string(),
            "guest k, scenario s, iteration 1: the guest finished without booting \
             (console: /out/console/k.s.01.log)"
        );
        assert!(
            matches!(&e, RunError::Boot { failure, .. } if matches!(**failure, BootFailure::NeverBooted))
        );
        use std::error::Error as _;
        assert_eq!(
            e.source().map(|s| s.to_string()).as_deref(),
            Some("the guest finished without booting")
        );
    }

    #[test]
    fn labels_are_unique() {
        let g = |n: &str| PreparedGuest {
            spec: n.into(),
            name: n.into(),
            kernel: "/k".into(),
            initramfs: "/i".into(),
            kernel_manifest: None,
            initramfs_manifest: None,
        };
        assert_eq!(
            labels(&[g("6.12"), g("6.12"), g("a b")]),
            vec!["6.12", "6.12-2", "a_b"]
        );
    }
}
