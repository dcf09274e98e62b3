//! `blklab run`: serve the disks in-process, boot QEMU per (kernel,
//! scenario, iteration) with the kernels interleaved, answer the guest's
//! SYNC lines with backend and host snapshots, and write one
//! self-describing JSON per (kernel, scenario, variant, iteration).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use log::{info, warn};
use serde::Deserialize;
use serde_json::Value;
use thiserror::Error;

use crate::backend::control;
use crate::backend::server::Server;
use crate::backend::Disk;
use crate::device::config::DiskConfig;
use crate::lab::console::{parse_line, Event, FaultScanner, Phase};
use crate::lab::images::{self, KernelSpec, PreparedGuest};
use crate::lab::insns::{self, Dump, InsnsWindow, SymbolMap};
use crate::lab::options::{CountInsns, RunArgs};
use crate::lab::qemu::{self, Accel, Guest, Next, QemuDisk, QemuSpec};
use crate::lab::scenario::{self, Scenario};
use crate::lab::settings::{self, BootSettings};
use crate::lab::summary;
use crate::record::guest::{GuestResult, GUEST_SCHEMA};
use crate::record::result::{Checks, HostWindow, ResultRecord, RESULT_SCHEMA};
use crate::record::run::{
    BootOrder, HostInfo, InsnsSetup, KernelEntry, QemuInfo, RunDocument, RUN_SCHEMA,
};
use crate::record::summary::{RetriedBoot, SummaryDocument, SUMMARY_SCHEMA};
use crate::record::RecordError;
use crate::stats::queue::{QueueStats, StatsDocument};
use crate::util::hostcpu;

#[derive(Debug, Error)]
pub enum RunError {
    #[error(transparent)]
    Scenario(#[from] scenario::ScenarioError),
    #[error(transparent)]
    Image(#[from] images::ImageError),
    #[error(transparent)]
    Qemu(#[from] qemu::QemuError),
    #[error("{0}")]
    Config(String),
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Insns(#[from] insns::InsnsError),
    #[error(transparent)]
    Record(#[from] RecordError),
    #[error("cannot serve the disks: {0}")]
    Serve(#[from] crate::backend::server::ServeError),
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
    #[error("guest {kernel}, scenario {scenario}, iteration {iteration}: {why}")]
    Guest {
        kernel: String,
        scenario: String,
        iteration: u32,
        why: String,
    },
}

use crate::lab::plan::{self as run_plan, Boot};
use crate::lab::progress::Progress;

/// What one boot runs: a scenario's variants that share device settings,
/// and those settings.
#[derive(Debug, Clone)]
struct Unit {
    scenario: usize,
    settings: BootSettings,
    /// Which of the scenario's units (its console log's name needs it when
    /// the scenario has several).
    part: Option<usize>,
}

/// Every scenario's units, in scenario order.
fn units(scenarios: &[Scenario], args: &RunArgs) -> Vec<Unit> {
    let mut out = Vec::new();
    for (i, s) in scenarios.iter().enumerate() {
        let b = settings::boot_settings(s, args);
        let several = b.len() > 1;
        for (k, settings) in b.into_iter().enumerate() {
            out.push(Unit {
                scenario: i,
                settings,
                part: several.then_some(k + 1),
            });
        }
    }
    out
}

/// The scenario a run executes, after `--runtime`/`--variants`.
fn apply_overrides(mut s: Scenario, args: &RunArgs) -> Result<Scenario, RunError> {
    if let Some(filter) = &args.variants {
        for f in filter {
            if !s.variants.iter().any(|v| &v.name == f) {
                return Err(RunError::Config(format!(
                    "--variants: scenario {} has no variant {f:?} (it has: {})",
                    s.name,
                    s.variants
                        .iter()
                        .map(|v| v.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
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
pub(crate) fn load_scenarios(names: &[String], lab_dir: &Path) -> Result<Vec<Scenario>, RunError> {
    let dir = lab_dir.join("guest-scripts/scenarios");
    let mut out: Vec<Scenario> = Vec::new();
    for n in names {
        let (s, path) = scenario::load(n, &dir)?;
        let shipped = dir.join(format!("{}.scn", s.name));
        let same = std::fs::canonicalize(&path).ok() == std::fs::canonicalize(&shipped).ok()
            && shipped.exists();
        if !same {
            return Err(RunError::Config(format!(
                "scenario {} is valid but not in {}: the guest only has the scenarios packed \
                 into its initramfs; copy it there (the image is rebuilt automatically)",
                path.display(),
                dir.display()
            )));
        }
        if out.iter().any(|o| o.name == s.name) {
            return Err(RunError::Config(format!("scenario {} given twice", s.name)));
        }
        out.push(s);
    }
    Ok(out)
}

/// Check every boot's machine and device settings once, before building
/// or booting anything.
fn check_units(scenarios: &[Scenario], units: &[Unit]) -> Result<(), RunError> {
    for u in units {
        let s = &scenarios[u.scenario];
        let names = u
            .settings
            .variants
            .iter()
            .map(|&i| s.variants[i].name.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        let vcpus = u.settings.machine.vcpus;
        if vcpus == 0 || vcpus > 64 {
            return Err(RunError::Config(format!(
                "scenario {} ({names}): {vcpus} vCPUs (want 1 to 64)",
                s.name
            )));
        }
        u.settings
            .disk_args(PathBuf::from("/tmp/blklab-check.sock"))
            .and_then(|d| d.to_configs().map_err(|e| e.to_string()))
            .map_err(|e| {
                RunError::Config(format!(
                    "scenario {} ({names}): device settings: {e}",
                    s.name
                ))
            })?;
    }
    Ok(())
}

/// A private directory for one boot's sockets (a fresh `blklab-run-*`
/// directory of mode 0700 made by `tempfile`, never one that already
/// existed), removed on drop, or by [`crate::lab::cleanup`] on SIGINT/SIGTERM.
struct SocketDir(PathBuf);

impl SocketDir {
    fn new(seq: usize) -> Result<SocketDir, RunError> {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::Builder::new()
            .prefix(&format!("blklab-run-{seq}-"))
            .permissions(std::fs::Permissions::from_mode(0o700))
            .tempdir()
            .map_err(|source| RunError::Write {
                path: std::env::temp_dir(),
                source,
            })?;
        // Ownership moves to SocketDir (and the cleanup registry), which
        // removes it.
        let p = dir.keep();
        crate::lab::cleanup::track_dir(&p);
        Ok(SocketDir(p))
    }
}

impl Drop for SocketDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
        crate::lab::cleanup::untrack_dir(&self.0);
    }
}

/// Backend and host state at a variant's begin SYNC.
struct Begin {
    scenario: String,
    variant: String,
    at: Instant,
    backend: Vec<Vec<QueueStats>>,
    qemu: Option<hostcpu::ProcessSample>,
    me: Option<hostcpu::ProcessSample>,
    insns: Option<Dump>,
}

/// What the host measured over one variant's window.
struct Measured {
    /// The backend's snapshot delta.
    backend: StatsDocument,
    host: HostWindow,
    /// The plugin's counters over the window (with --count-insns).
    insns: Option<Dump>,
}

/// How `instructions` windows are taken (recorded in run.json and records).
const INSNS_WINDOW: &str = "plugin counters at the variant's BLKLAB-SYNC begin and end \
     (guest waiting on its console): the variant's fio run including its start-up and exit";

/// The System.map next to a kernel image.
/// What `blklab run` chose: the accelerator, why, and whether it counts
/// instructions.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct AccelDecision {
    pub accel: Accel,
    pub reason: String,
    pub count_insns: bool,
    /// Why `--count-insns auto` takes no counts, when it takes none.
    pub no_insns_because: Option<String>,
}

/// Decide the accelerator and instruction counting. `probe` is the real
/// KVM probe (a boot under KVM, seconds to `/init`, or why not), called
/// only when `want` is `Auto` and nothing forces TCG; `maps_usable` says
/// whether every kernel has a usable System.map, asked only when `auto`
/// could count. Instruction counts and `--deterministic` need TCG
/// (plugins and -icount do not run under KVM).
pub(crate) fn decide_accel(
    want: Accel,
    count: CountInsns,
    deterministic: bool,
    probe: impl FnOnce() -> Result<f64, String>,
    maps_usable: impl FnOnce() -> bool,
) -> Result<AccelDecision, RunError> {
    let forced = count == CountInsns::On;
    let needs_tcg = match (forced, deterministic) {
        (true, true) => Some("--count-insns and --deterministic"),
        (true, false) => Some("--count-insns"),
        (false, true) => Some("--deterministic"),
        (false, false) => None,
    };
    let (accel, reason) = match (needs_tcg, want) {
        (Some(what), Accel::Kvm) => {
            return Err(RunError::Config(format!(
            "{what} needs TCG (QEMU's plugins and -icount do not run under KVM); drop --accel kvm"
        )))
        }
        (Some(what), _) => (Accel::Tcg, format!("{what} needs TCG")),
        (None, Accel::Kvm) => (Accel::Kvm, "forced with --accel kvm".to_string()),
        (None, Accel::Tcg) => (Accel::Tcg, "forced with --accel tcg".to_string()),
        (None, Accel::Auto) => match probe() {
            Ok(secs) => (
                Accel::Kvm,
                format!("KVM probe booted the guest in {secs:.1} s"),
            ),
            Err(why) => {
                info!("KVM not usable ({why}); using TCG");
                (Accel::Tcg, format!("KVM probe failed: {why}"))
            }
        },
    };
    // Under TCG, instruction counts are the deterministic CPU-cost answer:
    // `auto` takes them whenever it can.
    let (count_insns, no_insns_because) = match count {
        CountInsns::On => (true, None),
        CountInsns::Off => (false, None),
        CountInsns::Auto if accel != Accel::Tcg => (
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

fn system_map(kernel: &Path) -> Option<PathBuf> {
    let p = kernel.parent()?.join("System.map");
    p.is_file().then_some(p)
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// `YYYYmmdd-HHMMSS` in UTC, for the default output directory.
pub(crate) fn utc_stamp() -> String {
    let secs = unix_now() as i64;
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}-{:02}{:02}{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// What the host is: name, CPUs, kernel, CPU model (for the report's
/// "what differs besides the kernel").
fn host_info() -> HostInfo {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .ok()
            .map(|s| s.trim().to_string())
    };
    let cpu_model = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|t| {
        t.lines()
            .find_map(|l| l.strip_prefix("model name"))
            .map(|l| l.trim_start_matches([' ', '\t', ':']).to_string())
    });
    HostInfo {
        hostname: read("/proc/sys/kernel/hostname"),
        kernel: read("/proc/sys/kernel/osrelease"),
        cpus: std::thread::available_parallelism().map(|n| n.get()).ok(),
        cpu_model,
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

/// Unique labels for the kernels (the prepared names, suffixed on clashes).
fn labels(guests: &[PreparedGuest]) -> Vec<String> {
    let names: Vec<String> = guests.iter().map(|g| g.name.clone()).collect();
    run_plan::unique_labels(&names)
}

/// Run the lab as `args` says.
pub fn run(args: &RunArgs) -> Result<RunOutcome, RunError> {
    // First, before any thread starts: SIGINT/SIGTERM stop QEMU and
    // remove the boots' directories.
    crate::lab::cleanup::install();
    let specs: Vec<KernelSpec> = args
        .kernel
        .iter()
        .map(|k| k.parse())
        .collect::<Result<_, _>>()?;
    for s in &specs {
        s.check()?;
    }
    if args.iterations == 0 {
        return Err(RunError::Config("--iterations must be at least 1".into()));
    }
    if args.vcpus.is_some_and(|v| v == 0 || v > 64) {
        return Err(RunError::Config("--vcpus must be 1..=64".into()));
    }
    let lab_dir = images::lab_dir(args.lab_dir.as_deref())?;
    let scenarios: Vec<Scenario> = load_scenarios(&args.scenario, &lab_dir)?
        .into_iter()
        .map(|s| apply_overrides(s, args))
        .collect::<Result<_, _>>()?;
    let units = units(&scenarios, args);
    check_units(&scenarios, &units)?;
    // The plan, known before anything is built: its labels are the ones
    // images/prepare.sh will give (checked below).
    let planned_labels = run_plan::labels(&specs);
    let all_boots = run_plan::boots(specs.len(), units.len(), args.iterations);
    let order_of = |boots: &[Boot], names: &[String]| -> Vec<BootOrder> {
        boots
            .iter()
            .map(|b| boot_order(b, &units, &scenarios, names))
            .collect()
    };
    let boots = run_plan::select(all_boots.clone(), args.shard);
    if args.plan {
        return Ok(RunOutcome::Plan(plan_document(
            args,
            &specs,
            &planned_labels,
            &scenarios,
            &units,
            &all_boots,
            &boots,
        )));
    }
    if boots.is_empty() {
        return Err(RunError::Config(format!(
            "--shard {}/{}: this shard has no boots (the run has {} (iteration, scenario part) groups)",
            args.shard.map_or(0, |s| s.index),
            args.shard.map_or(0, |s| s.count),
            all_boots.last().map_or(0, |b| b.group + 1)
        )));
    }
    let qemu_path = qemu::locate(&args.qemu)?;
    let qemu_bin = qemu_path.display().to_string();
    let out_dir = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("blklab-results").join(utc_stamp()));
    for d in [out_dir.clone(), out_dir.join("console")] {
        std::fs::create_dir_all(&d).map_err(|source| RunError::Write { path: d, source })?;
    }

    info!("preparing {} guest image(s)", specs.len());
    let guests = images::prepare(&lab_dir, args.cache.as_deref(), &specs)?;
    let names = labels(&guests);
    if names != planned_labels {
        return Err(RunError::Config(format!(
            "images/prepare.sh named the kernels [{}], the plan [{}]: a blklab binary and lab tree of different versions?",
            names.join(", "),
            planned_labels.join(", ")
        )));
    }
    let forced = args.count_insns == CountInsns::On;
    let decision = decide_accel(
        args.accel,
        args.count_insns,
        args.deterministic,
        || {
            qemu::probe_kvm(
                &qemu_bin,
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
    let (accel, accel_why) = (decision.accel, decision.reason);
    let mut count_insns = decision.count_insns;
    if let Some(why) = &decision.no_insns_because {
        info!("no instruction counts (--count-insns auto): {why}");
    }
    let plugin = if count_insns {
        info!("building the instruction-count plugin for {qemu_bin}");
        match insns::build_plugin(&lab_dir, args.cache.as_deref(), &qemu_bin) {
            Ok(p) => Some(p),
            Err(e) if !forced => {
                warn!("no instruction counts (--count-insns auto): {e}");
                count_insns = false;
                None
            }
            Err(e) => return Err(e.into()),
        }
    } else {
        None
    };
    // Symbolisation needs each kernel's System.map, checked before booting.
    let mut maps: Vec<Option<Arc<SymbolMap>>> = Vec::new();
    for g in &guests {
        maps.push(if count_insns {
            let p = system_map(&g.kernel).ok_or_else(|| {
                RunError::Config(format!(
                    "--count-insns: no System.map next to {} (symbolisation needs the kernel's \
                     System.map; self-built kernels have one, Debian's linux-image packages only a \
                     placeholder: the real one is in linux-image-…-dbg)",
                    g.kernel.display()
                ))
            })?;
            Some(Arc::new(SymbolMap::read(&p)?))
        } else {
            None
        });
    }
    info!("accelerator: {accel:?} ({accel_why})");

    let total: u64 = boots
        .iter()
        .map(|b| units[b.unit].settings.variants.len() as u64)
        .sum();
    let run_doc = RunDocument {
        schema: RUN_SCHEMA.to_string(),
        started_unix: unix_now(),
        blklab_version: env!("CARGO_PKG_VERSION").to_string(),
        git_commit: crate::stats::queue::GIT_COMMIT.to_string(),
        command_line: std::env::args().collect(),
        accel,
        accel_reason: accel_why.clone(),
        deterministic: args.deterministic,
        count_insns: plugin.as_ref().map(|p| InsnsSetup {
            plugin: p.clone(),
            window: INSNS_WINDOW.to_string(),
        }),
        host: host_info(),
        qemu: QemuInfo {
            path: qemu_bin.clone(),
            version: qemu::version(&qemu_bin),
        },
        kernels: guests
            .iter()
            .zip(&names)
            .map(|(g, n)| KernelEntry {
                label: n.clone(),
                spec: g.spec.clone(),
                kernel: g.kernel.clone(),
                initramfs: g.initramfs.clone(),
                manifests: g.manifests(),
            })
            .collect(),
        scenarios: scenarios.clone(),
        iterations: args.iterations,
        order: order_of(&boots, &names),
        shard: args
            .shard
            .map(|sh| run_plan::shard_info(sh, &order_of(&all_boots, &names))),
    };
    crate::record::write(&out_dir.join("run.json"), &run_doc)?;

    let pb = Progress::new(total, boots.len(), !args.no_progress);
    let mut records = Vec::new();
    let mut failures = Vec::new();
    let mut retried: Vec<RetriedBoot> = Vec::new();
    for (seq, boot) in boots.iter().enumerate() {
        let g = &guests[boot.kernel];
        let unit = &units[boot.unit];
        let s = &scenarios[unit.scenario];
        pb.boot(
            seq,
            &format!("{} {} #{}", names[boot.kernel], s.name, boot.iteration),
        );
        let ctx = BootCtx {
            args,
            seq,
            boot,
            label: &names[boot.kernel],
            guest: g,
            scenario: s,
            unit,
            accel,
            qemu: &qemu_bin,
            out_dir: &out_dir,
            pb: &pb,
            plugin: plugin.as_deref(),
            symbols: maps[boot.kernel].clone(),
        };
        // A boot whose console stayed silent (QEMU or the guest never got
        // going: no kernel output at all), or whose QEMU aborted on a known
        // emulator bug before /init (qemu::KNOWN_EMULATOR_BUGS), is tried
        // once more; the first attempt's console log is kept as
        // *.attempt1.log and the retry is listed in summary.json. Nothing
        // else is retried: a guest kernel
        // fault (oops, BUG, WARN, panic, call trace) at boot or during fio
        // fails the run with the report printed whole, and so does any
        // other failure after the guest spoke.
        let console = console_log_path(&out_dir, &names[boot.kernel], s, unit, boot.iteration);
        let fail = |f: BootFailure, earlier: Option<&str>| match f {
            BootFailure::KernelFault(trace) => RunError::KernelFault {
                kernel: names[boot.kernel].clone(),
                scenario: s.name.clone(),
                iteration: boot.iteration,
                console: console.clone(),
                trace,
            },
            BootFailure::Silent(why) | BootFailure::EmulatorBug(why) | BootFailure::Other(why) => {
                RunError::Guest {
                    kernel: names[boot.kernel].clone(),
                    scenario: s.name.clone(),
                    iteration: boot.iteration,
                    why: match earlier {
                        Some(first) => format!(
                            "{why} (second attempt; the first failed too: {first}; console: {})",
                            console.display()
                        ),
                        None => format!("{why} (console: {})", console.display()),
                    },
                }
            }
        };
        let (mut recs, mut fails) = match run_boot(&ctx) {
            Ok(r) => r,
            Err(BootFailure::Silent(first) | BootFailure::EmulatorBug(first)) => {
                let kept = console.with_extension("attempt1.log");
                let _ = std::fs::rename(&console, &kept);
                warn!(
                    "{} {} #{}: the boot did not get going ({}); booting once more (console: {})",
                    names[boot.kernel],
                    s.name,
                    boot.iteration,
                    first.lines().next().unwrap_or(""),
                    kept.display()
                );
                retried.push(RetriedBoot {
                    kernel: names[boot.kernel].clone(),
                    scenario: s.name.clone(),
                    iteration: boot.iteration,
                    error: first.clone(),
                    console: kept,
                });
                pb.retry();
                run_boot(&ctx).map_err(|f| fail(f, Some(&first)))?
            }
            Err(f) => return Err(fail(f, None)),
        };
        records.append(&mut recs);
        failures.append(&mut fails);
    }
    pb.finish();
    let table = summary::table(&records);
    let sum_doc = SummaryDocument {
        schema: SUMMARY_SCHEMA.to_string(),
        finished_unix: unix_now(),
        failures: failures.clone(),
        retried_boots: retried,
        rows: summary::rows(&records),
    };
    crate::record::write(&out_dir.join("summary.json"), &sum_doc)?;
    std::fs::write(out_dir.join("summary.txt"), &table).map_err(|source| RunError::Write {
        path: out_dir.join("summary.txt"),
        source,
    })?;
    Ok(RunOutcome::Ran {
        out_dir,
        records,
        failures,
    })
}

/// `--plan`: the boots of the run (or of its shard).
fn plan_document(
    args: &RunArgs,
    specs: &[KernelSpec],
    labels: &[String],
    scenarios: &[Scenario],
    units: &[Unit],
    all: &[Boot],
    selected: &[Boot],
) -> run_plan::PlanDocument {
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

struct BootCtx<'a> {
    args: &'a RunArgs,
    seq: usize,
    boot: &'a Boot,
    label: &'a str,
    guest: &'a PreparedGuest,
    scenario: &'a Scenario,
    unit: &'a Unit,
    accel: Accel,
    qemu: &'a str,
    out_dir: &'a Path,
    pb: &'a Progress,
    plugin: Option<&'a Path>,
    symbols: Option<Arc<SymbolMap>>,
}

/// Where a boot's console goes (`KERNEL.SCENARIO[.pN].NN.log`: `pN` when
/// the scenario runs in several boots).
fn console_log_path(
    out_dir: &Path,
    label: &str,
    scenario: &Scenario,
    unit: &Unit,
    iteration: u32,
) -> PathBuf {
    let part = unit.part.map(|p| format!(".p{p}")).unwrap_or_default();
    out_dir.join("console").join(format!(
        "{label}.{}{part}.{iteration:02}.log",
        scenario.name
    ))
}

/// Why a boot failed, by what `blklab run` does about it.
#[derive(Debug)]
enum BootFailure {
    /// Nothing at all came from the guest's console (QEMU or the guest never
    /// got going): worth a second boot.
    Silent(String),
    /// QEMU itself aborted on a known emulator bug
    /// ([`qemu::KNOWN_EMULATOR_BUGS`]) before the guest reached `/init`,
    /// with no guest kernel fault on the console: worth a second boot too.
    EmulatorBug(String),
    /// The guest kernel reported a fault: the report, whole. Never retried.
    KernelFault(String),
    /// Anything else after the guest spoke (or before QEMU started).
    Other(String),
}

impl From<String> for BootFailure {
    fn from(s: String) -> Self {
        BootFailure::Other(s)
    }
}

/// How long to keep reading a fault report after its first line when its
/// end marker does not come (a hung guest prints no more).
const FAULT_TAIL: Duration = Duration::from_secs(15);

/// Boot one guest, run one scenario, return its records and the failed
/// variants. An `Err` is a boot that did not complete (QEMU failed, a wait
/// timed out, the guest kernel faulted).
fn run_boot(c: &BootCtx) -> Result<(Vec<ResultRecord>, Vec<String>), BootFailure> {
    let disks = BootDisks::start(c)?;
    let plugin = c
        .plugin
        .map(|_| insns::Control::new(disks.sockets.0.join("insns.sock")));
    let spec = qemu_spec(c, &disks.configs, plugin.as_ref());
    let mut command_line = vec![c.qemu.to_string()];
    command_line.extend(spec.args());
    let console_log = console_log_path(c.out_dir, c.label, c.scenario, c.unit, c.boot.iteration);
    let _ = std::fs::remove_file(&console_log);
    let guest = Guest::spawn(&spec, Some(&console_log)).map_err(|e| e.to_string())?;
    let mut session = Session::new(c, guest, plugin, disks, command_line);
    let rc = loop {
        let line = session.next_line()?;
        if session.scan_fault(&line)? || session.collect(&line) {
            continue;
        }
        let Some(ev) = parse_line(&line) else {
            continue;
        };
        if let Some(rc) = session.on_event(ev)? {
            break rc;
        }
    };
    session.finish(rc)
}

/// The disks one boot serves in-process, on sockets in a directory of
/// their own. (Fields drop in order: the server stops before its sockets'
/// directory goes.)
struct BootDisks {
    server: Server,
    disks: Vec<Arc<Disk>>,
    configs: Vec<DiskConfig>,
    sockets: SocketDir,
}

impl BootDisks {
    /// Start serving the scenario's disks.
    fn start(c: &BootCtx) -> Result<BootDisks, BootFailure> {
        let sockets = SocketDir::new(c.seq).map_err(|e| e.to_string())?;
        let configs: Vec<DiskConfig> = c
            .unit
            .settings
            .disk_args(sockets.0.join("vd.sock"))
            .and_then(|d| d.to_configs().map_err(|e| e.to_string()))
            .map_err(|e| format!("device settings: {e}"))?;
        let server = Server::start(configs.clone()).map_err(|e| e.to_string())?;
        let disks = server.disks();
        Ok(BootDisks {
            server,
            disks,
            configs,
            sockets,
        })
    }
}

/// The guest kernel's command line for one boot.
fn kernel_append(c: &BootCtx) -> String {
    let mut append = format!(
        // loglevel=5: the console shows KERN_WARNING and worse, so a WARN
        // splat reaches the fault scanner (`quiet` would hide it).
        "console=ttyS0 loglevel=5 panic=-1 {} blklab.run=lab blklab.scenarios={} blklab.sync=1",
        crate::lab::qemu::CLOCKSOURCE_ARGS,
        c.scenario.name
    );
    if let Some(extra) = &c.args.append {
        append.push(' ');
        append.push_str(extra);
    }
    if let Some(r) = c.args.runtime {
        append.push_str(&format!(" blklab.runtime={r}"));
    }
    if let Some(r) = c.args.ramp {
        append.push_str(&format!(" blklab.ramp={r}"));
    }
    // The unit's variants, when the boot runs fewer than the scenario file
    // has (--variants, or variants with other device settings).
    let names: Vec<&str> = c
        .unit
        .settings
        .variants
        .iter()
        .map(|&i| c.scenario.variants[i].name.as_str())
        .collect();
    if c.args.variants.is_some() || c.unit.part.is_some() {
        append.push_str(&format!(" blklab.variants={}", names.join(",")));
    }
    // Kernel addresses must be System.map's.
    if c.plugin.is_some() {
        append.push_str(" nokaslr");
    }
    append
}

/// What QEMU runs for one boot: the guest, its disks and, with
/// `--count-insns`, the plugin with its control socket.
fn qemu_spec(c: &BootCtx, configs: &[DiskConfig], plugin: Option<&insns::Control>) -> QemuSpec {
    QemuSpec {
        qemu: c.qemu.to_string(),
        accel: c.accel,
        vcpus: c.unit.settings.machine.vcpus,
        memory: c.unit.settings.machine.memory.clone(),
        kernel: c.guest.kernel.clone(),
        initramfs: c.guest.initramfs.clone(),
        append: kernel_append(c),
        disks: configs
            .iter()
            .map(|d| QemuDisk {
                socket: d.socket.clone(),
                num_queues: d.num_queues,
                queue_size: d.queue_size,
            })
            .collect(),
        deterministic: c.args.deterministic,
        plugin: match (c.plugin, plugin) {
            (Some(p), Some(ctl)) => Some(format!("{},ctl={}", p.display(), ctl.path().display())),
            _ => None,
        },
    }
}

/// One boot in progress: the guest, what it has said and what the host
/// measured. (Fields drop in order: QEMU goes before the disks it uses.)
struct Session<'a> {
    guest: Guest,
    /// The instruction-count plugin's control socket (--count-insns).
    plugin: Option<insns::Control>,
    disks: BootDisks,
    c: &'a BootCtx<'a>,
    command_line: Vec<String>,
    qemu_pid: i32,
    my_pid: i32,
    /// When the next console line is due, and what it is waited for.
    deadline: Instant,
    waiting_for: String,
    booted: bool,
    /// Anything at all came from the console.
    spoke: bool,
    fault: FaultScanner,
    /// The open variant window.
    begin: Option<Begin>,
    /// Closed windows whose result has not come yet, by (scenario, variant).
    measured: BTreeMap<(String, String), Measured>,
    /// The result document being read: (scenario, variant, lines).
    collecting: Option<(String, String, Vec<String>)>,
    records: Vec<ResultRecord>,
    failures: Vec<String>,
    guest_errors: Vec<String>,
}

impl<'a> Session<'a> {
    /// A session for a guest just started, waiting for it to boot.
    fn new(
        c: &'a BootCtx<'a>,
        guest: Guest,
        plugin: Option<insns::Control>,
        disks: BootDisks,
        command_line: Vec<String>,
    ) -> Session<'a> {
        Session {
            qemu_pid: guest.pid(),
            my_pid: std::process::id() as i32,
            guest,
            plugin,
            disks,
            c,
            command_line,
            deadline: Instant::now() + c.args.boot_timeout,
            waiting_for: "the guest to boot (BLKLAB-INIT)".to_string(),
            booted: false,
            spoke: false,
            fault: FaultScanner::default(),
            begin: None,
            measured: BTreeMap::new(),
            collecting: None,
            records: Vec::new(),
            failures: Vec::new(),
            guest_errors: Vec::new(),
        }
    }

    /// Wait for `what` until `deadline` from now on.
    fn expect(&mut self, within: Duration, what: String) {
        self.deadline = Instant::now() + within;
        self.waiting_for = what;
    }

    /// The next console line, or why none comes: a fault report already
    /// begun, a silent guest (worth a second boot), or anything else.
    fn next_line(&mut self) -> Result<String, BootFailure> {
        let line = match self.guest.next_line(self.deadline, &self.waiting_for) {
            Ok(Next::Line(l)) => l,
            Ok(Next::Closed) | Err(_) if self.fault.started() => {
                return Err(BootFailure::KernelFault(self.fault.report()))
            }
            Ok(Next::Closed) if !self.spoke => {
                return Err(BootFailure::Silent(self.guest.exited_error().to_string()))
            }
            Ok(Next::Closed) => {
                let why = self.guest.exited_error().to_string();
                return Err(match qemu::known_emulator_bug(&self.guest.stderr_text()) {
                    Some(bug) if !self.booted => BootFailure::EmulatorBug(format!("{bug}: {why}")),
                    _ => why.into(),
                });
            }
            Err(e) if !self.spoke => return Err(BootFailure::Silent(e.to_string())),
            Err(e) => return Err(e.to_string().into()),
        };
        self.spoke = true;
        Ok(line)
    }

    /// Feed the fault scanner: true when the line is part of a kernel fault
    /// report (whose end fails the boot; its first line shortens the wait).
    fn scan_fault(&mut self, line: &str) -> Result<bool, BootFailure> {
        if !self.fault.feed(line) {
            return Ok(false);
        }
        if self.fault.complete() {
            return Err(BootFailure::KernelFault(self.fault.report()));
        }
        if self.fault.report().lines().count() == 1 {
            warn!("{}: the guest kernel reports a fault: {line}", self.c.label);
            self.deadline = self.deadline.min(Instant::now() + FAULT_TAIL);
            self.waiting_for = "the rest of the guest kernel's fault report".into();
        }
        Ok(true)
    }

    /// Inside a result document: keep the line (true), unless it ends it.
    fn collect(&mut self, line: &str) -> bool {
        match self.collecting.as_mut() {
            Some((_, _, buf)) if !line.starts_with("BLKLAB-RESULT-END") => {
                buf.push(line.to_string());
                true
            }
            _ => false,
        }
    }

    /// Act on one console event; the guest scripts' exit status at the end.
    fn on_event(&mut self, ev: Event) -> Result<Option<i32>, BootFailure> {
        let c = self.c;
        match ev {
            Event::Init { kernel } => {
                self.booted = true;
                info!("{} booted ({kernel})", c.label);
                self.expect(
                    c.args.step_timeout,
                    "the guest to start the scenario".into(),
                );
            }
            Event::ModuleFail(m) => self.guest_errors.push(format!("module {m} failed to load")),
            Event::Error(m) => {
                warn!("{} {}: guest: {m}", c.label, c.scenario.name);
                self.guest_errors.push(m);
            }
            Event::Sync {
                n,
                phase,
                scenario,
                variant,
            } => {
                match phase {
                    Phase::Begin => self.begin_window(scenario, variant)?,
                    Phase::End => self.end_window(scenario, variant)?,
                }
                self.guest
                    .answer(&n.to_string())
                    .map_err(|e| e.to_string())?;
            }
            Event::ResultBegin { scenario, variant } => {
                self.collecting = Some((scenario, variant, Vec::new()));
            }
            Event::ResultEnd { scenario, variant } => {
                if let Some((s0, v0, lines)) = self.collecting.take() {
                    if (s0.as_str(), v0.as_str()) != (scenario.as_str(), variant.as_str()) {
                        return Err(format!(
                            "result framing mismatch: began {s0}/{v0}, ended {scenario}/{variant}"
                        )
                        .into());
                    }
                    self.on_result(scenario, variant, &lines.join("\n"))?;
                }
            }
            Event::End { rc } => return Ok(Some(rc)),
        }
        Ok(None)
    }

    /// A variant's begin SYNC: the plugin's counters, the backend's
    /// baselines and the host's CPU, before the guest goes on.
    fn begin_window(&mut self, scenario: String, variant: String) -> Result<(), BootFailure> {
        let c = self.c;
        c.pb.variant(&format!(
            "{} {}/{} #{}",
            c.label, scenario, variant, c.boot.iteration
        ));
        let dump = match &self.plugin {
            Some(ctl) => Some(
                ctl.dump(&self.disks.sockets.0.join("begin.insns"))
                    .map_err(|e| format!("{scenario}/{variant} begin: {e}"))?,
            ),
            None => None,
        };
        self.begin = Some(Begin {
            insns: dump,
            backend: control::baselines(&self.disks.disks),
            qemu: hostcpu::sample(self.qemu_pid),
            me: hostcpu::sample(self.my_pid),
            at: Instant::now(),
            scenario,
            variant: variant.clone(),
        });
        let (rt, ramp) = c
            .scenario
            .variant(&variant)
            .map(|v| (v.runtime, v.ramp))
            .unwrap_or((0, 0));
        self.expect(
            Duration::from_secs(rt + ramp) + c.args.step_timeout,
            format!("variant {variant} to finish"),
        );
        Ok(())
    }

    /// A variant's end SYNC: what the backend, the host and the plugin
    /// counted since its begin.
    fn end_window(&mut self, scenario: String, variant: String) -> Result<(), BootFailure> {
        let b = self
            .begin
            .take()
            .filter(|b| b.scenario == scenario && b.variant == variant);
        if let Some(b) = b {
            let insns_window = match (&self.plugin, &b.insns) {
                (Some(ctl), Some(first)) => Some(
                    ctl.dump(&self.disks.sockets.0.join("end.insns"))
                        .map_err(|e| format!("{scenario}/{variant} end: {e}"))?
                        .since(first),
                ),
                _ => None,
            };
            let mut doc = control::report(&self.disks.disks, Some(&b.backend));
            doc.label = Some(format!("{scenario}/{variant}"));
            doc.interval_s = Some(b.at.elapsed().as_secs_f64());
            let qemu_now = hostcpu::sample(self.qemu_pid);
            let me_now = hostcpu::sample(self.my_pid);
            let delta = |role: &str, a: &Option<hostcpu::ProcessSample>, z| match (a, z) {
                (Some(a), Some(z)) => Some(hostcpu::delta(role, a, z)),
                _ => None,
            };
            let host = HostWindow {
                wall_s: Some(b.at.elapsed().as_secs_f64()),
                qemu: delta("qemu", &b.qemu, qemu_now.as_ref()),
                blklab: delta("backend", &b.me, me_now.as_ref()),
                loadavg: std::fs::read_to_string("/proc/loadavg")
                    .ok()
                    .map(|s| s.trim().to_string()),
            };
            self.measured.insert(
                (scenario, variant.clone()),
                Measured {
                    backend: doc,
                    host,
                    insns: insns_window,
                },
            );
        } else {
            warn!("end SYNC for {scenario}/{variant} without its begin");
        }
        self.expect(self.c.args.step_timeout, format!("the result of {variant}"));
        Ok(())
    }

    /// A variant's result document: its record, written.
    fn on_result(
        &mut self,
        scenario: String,
        variant: String,
        text: &str,
    ) -> Result<(), BootFailure> {
        let c = self.c;
        let guest = match guest_result(text) {
            Ok(g) => g,
            Err((what, e)) => {
                self.failures.push(format!(
                    "{} {scenario}/{variant} #{}: the guest's result is not {what} ({e})",
                    c.label, c.boot.iteration
                ));
                GuestResult::unparsable(format!("unparsable result: {e}"), text.to_string())
            }
        };
        if !guest.ok {
            self.failures.push(format!(
                "{} {scenario}/{variant} #{}: {}",
                c.label,
                c.boot.iteration,
                guest.error.as_deref().unwrap_or("failed")
            ));
        }
        let measured = self.measured.remove(&(scenario.clone(), variant.clone()));
        let record = assemble_record(
            c,
            &self.command_line,
            &self.disks.configs,
            scenario,
            variant,
            guest,
            measured,
        );
        let file = c.out_dir.join(format!(
            "{}.{}.{}.{:02}.json",
            c.label, record.scenario, record.variant, c.boot.iteration
        ));
        crate::record::write(&file, &record).map_err(|e| e.to_string())?;
        self.records.push(record);
        c.pb.variant_done();
        self.expect(c.args.step_timeout, "the next variant".into());
        Ok(())
    }

    /// The guest scripts ended with `rc`: wait for QEMU, stop the disks,
    /// and count what is missing as failures.
    fn finish(self, rc: i32) -> Result<(Vec<ResultRecord>, Vec<String>), BootFailure> {
        let Session {
            mut guest,
            disks,
            c,
            booted,
            records,
            mut failures,
            guest_errors,
            ..
        } = self;
        let status = guest.wait_exit(Duration::from_secs(30));
        drop(guest);
        disks.server.shutdown();
        if !booted {
            return Err(BootFailure::Other(
                "the guest finished without booting".into(),
            ));
        }
        let expected = c.unit.settings.variants.len();
        if records.len() < expected {
            failures.push(format!(
                "{} {} #{}: {} of {expected} variants produced a result (guest rc={rc}, QEMU {status}){}",
                c.label,
                c.scenario.name,
                c.boot.iteration,
                records.len(),
                if guest_errors.is_empty() {
                    String::new()
                } else {
                    format!("; guest errors: {}", guest_errors.join("; "))
                }
            ));
        } else if rc != 0 && failures.is_empty() {
            failures.push(format!(
                "{} {} #{}: guest scripts exited with rc={rc}{}",
                c.label,
                c.scenario.name,
                c.boot.iteration,
                if guest_errors.is_empty() {
                    String::new()
                } else {
                    format!(": {}", guest_errors.join("; "))
                }
            ));
        }
        Ok((records, failures))
    }
}

/// The guest's result document from its text, or what it is not (JSON, a
/// guest result of the supported schema) and why.
fn guest_result(text: &str) -> Result<GuestResult, (&'static str, String)> {
    let v: Value = serde_json::from_str(text).map_err(|e| ("JSON", e.to_string()))?;
    let what = "a blklab-guest-result/1 document";
    if let Some(s) = crate::record::schema_of(&v) {
        crate::util::schema::check(s, GUEST_SCHEMA).map_err(|e| (what, e.to_string()))?;
    }
    GuestResult::deserialize(&v).map_err(|e| (what, e.to_string()))
}

/// One variant's record: the guest's document with what the host measured
/// over its window (none when the window was not measured) and, with
/// `--count-insns`, the symbolised instruction profile.
fn assemble_record(
    c: &BootCtx,
    command_line: &[String],
    configs: &[DiskConfig],
    scenario: String,
    variant: String,
    guest: GuestResult,
    measured: Option<Measured>,
) -> ResultRecord {
    let (backend, host, window) = match measured {
        Some(m) => (Some(m.backend), Some(m.host), m.insns),
        None => (None, None, None),
    };
    let mut record = ResultRecord {
        schema: RESULT_SCHEMA.to_string(),
        kernel: c.label.to_string(),
        kernel_spec: c.guest.spec.clone(),
        scenario_definition: c.scenario.variant(&variant).cloned(),
        machine: Some(c.unit.settings.machine.clone()),
        overridden: c.unit.settings.overridden.clone(),
        scenario,
        variant,
        iteration: c.boot.iteration,
        boot_seq: c.seq,
        ok: guest.ok,
        finished_unix: Some(unix_now()),
        accel: c.accel,
        qemu_command_line: command_line.to_vec(),
        manifests: c.guest.manifests(),
        device: configs.to_vec(),
        checks: Checks::of(&guest, backend.as_ref()),
        guest,
        backend,
        host,
        instructions: None,
    };
    if let (Some(w), Some(map)) = (window, &c.symbols) {
        let p = insns::profile(&w, map);
        let ios = crate::record::metrics::ios(&record);
        let cs = record.guest.context_switches.map(|n| n as f64);
        let how = InsnsWindow {
            method: INSNS_WINDOW.to_string(),
            deterministic: c.args.deterministic,
        };
        record.instructions = Some(insns::record(&p, ios, cs, &how));
    }
    record
}

#[cfg(test)]
mod tests {
    use crate::lab::options::CountInsns;
    use crate::lab::qemu::Accel;

    fn decide(
        want: Accel,
        count: CountInsns,
        det: bool,
        probe: Result<f64, String>,
        maps: bool,
    ) -> Result<AccelDecision, RunError> {
        super::decide_accel(want, count, det, move || probe, move || maps)
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
    fn forced_choices_never_probe() {
        let no_probe = || -> Result<f64, String> { panic!("probed") };
        let d = super::decide_accel(Accel::Kvm, CountInsns::Off, false, no_probe, || true).unwrap();
        assert_eq!((d.accel, d.count_insns), (Accel::Kvm, false));
        let d = super::decide_accel(Accel::Tcg, CountInsns::Off, false, no_probe, || true).unwrap();
        assert_eq!((d.accel, d.count_insns), (Accel::Tcg, false));
        // --count-insns on and --deterministic force TCG, even under auto.
        let d =
            super::decide_accel(Accel::Auto, CountInsns::On, false, no_probe, || false).unwrap();
        assert_eq!((d.accel, d.count_insns), (Accel::Tcg, true));
        assert_eq!(d.reason, "--count-insns needs TCG");
        let d =
            super::decide_accel(Accel::Auto, CountInsns::Auto, true, no_probe, || true).unwrap();
        assert_eq!((d.accel, d.count_insns), (Accel::Tcg, true));
        assert_eq!(d.reason, "--deterministic needs TCG");
        let e =
            super::decide_accel(Accel::Kvm, CountInsns::On, true, no_probe, || true).unwrap_err();
        assert!(
            e.to_string()
                .contains("--count-insns and --deterministic needs TCG"),
            "{e}"
        );
    }

    use super::*;

    #[test]
    fn stamp_format() {
        let s = utc_stamp();
        assert_eq!(s.len(), 15, "{s}");
        assert!(s.starts_with("20"), "{s}");
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
