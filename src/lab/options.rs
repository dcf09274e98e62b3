//! What a lab run is asked to do: `blklab run`'s flags as the command line
//! spells them ([`RunArgs`], which `crate::cli` embeds) and the same typed,
//! grouped and checked ([`RunOptions`]), which is what the run, `bisect`
//! and the nested mode's inner lab take. The flags become options once, at
//! the edge ([`RunArgs::to_options`]); the run resolves the options'
//! scenarios and boot units (`lab::run::request`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::backend::qemu_args::GuestRam;
use crate::lab::images::{ImageError, KernelSpec};
use crate::lab::location::LabLocation;
use crate::record::run::Accel;

/// `blklab run --count-insns`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
pub(crate) enum CountInsns {
    /// Count whenever the run ends up under TCG.
    Auto,
    /// Always count (forces TCG).
    On,
    /// Never count.
    Off,
}

/// `blklab run`: see docs/lab-protocol.md and docs/user-guide.md.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Guest kernel, repeatable: debian-6.1, debian-6.12, build:6.12,
    /// build:5.10 (before the 5.14 shared-tags fix), build:SERIES+PATCH
    /// (images/patches/PATCH.patch) or path:FILE[,modules=DIR][,name=LABEL].
    #[arg(long, value_name = "SPEC", default_values_t = ["build:6.12".to_string(), "build:6.12+noplug".to_string()])]
    pub(crate) kernel: Vec<String>,
    /// Scenario name (guest-scripts/scenarios/NAME.scn), repeatable. The
    /// default pairs the plug report's case, where the plug's cost is
    /// within the noise, with R5's, where removing it costs a kblockd run
    /// per IO.
    #[arg(long, value_name = "NAME", default_values_t = ["seed002-quick".to_string(), "plug-inverse-quick".to_string()])]
    pub(crate) scenario: Vec<String>,
    /// Boots per (kernel, scenario); kernels alternate within an iteration.
    /// A report calls nothing significant below 3.
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub(crate) iterations: u32,
    /// Override every variant's fio runtime, seconds.
    #[arg(long, value_name = "SECONDS")]
    pub(crate) runtime: Option<u64>,
    /// Override every variant's fio ramp time, seconds.
    #[arg(long, value_name = "SECONDS")]
    pub(crate) ramp: Option<u64>,
    /// Run only these variants (comma-separated).
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub(crate) variants: Option<Vec<String>>,
    /// Disks to serve (default: the scenario's `disks`).
    #[arg(long, value_name = "N")]
    pub(crate) disks: Option<u32>,
    /// Virtqueues per disk (default: the scenario's `queues`, else --vcpus).
    #[arg(long, value_name = "N")]
    pub(crate) num_queues: Option<u16>,
    /// Virtqueue size (default: the scenario's `queue_size`, else 256).
    #[arg(long, value_name = "N")]
    pub(crate) queue_size: Option<u16>,
    /// Storage of every disk: null or mem (default: the scenario's `device
    /// disk=`, else null). Every device option below likewise overrides the
    /// scenario's `device` setting of the same name; the records list each
    /// override (`overridden`).
    #[arg(long, value_name = "null|mem", value_parser = ["null", "mem"])]
    pub(crate) disk: Option<String>,
    /// Capacity of every disk (default 4G).
    #[arg(long, value_name = "SIZE")]
    pub(crate) size: Option<String>,
    /// Device command slots: none, per-queue or shared (see `serve --help`;
    /// default none).
    #[arg(long, value_name = "none|per-queue|shared")]
    pub(crate) tags: Option<String>,
    /// Slots per queue (per-queue) or in the pool (shared).
    #[arg(long, value_name = "N")]
    pub(crate) depth: Option<u32>,
    /// What a shared pool spans: disk, or host (all disks; default disk).
    #[arg(long, value_name = "disk|host")]
    pub(crate) tag_scope: Option<String>,
    /// blk-mq-style fair sharing of a shared pool (default off).
    #[arg(long, value_name = "on|off")]
    pub(crate) tag_fairness: Option<String>,
    /// Emulated completion latency (0, 50us, uniform:..., normal:..., lognormal:...).
    #[arg(long, value_name = "SPEC")]
    pub(crate) latency: Option<String>,
    #[arg(long, value_name = "SPEC")]
    pub(crate) read_latency: Option<String>,
    #[arg(long, value_name = "SPEC")]
    pub(crate) write_latency: Option<String>,
    #[arg(long, value_name = "SPEC")]
    pub(crate) flush_latency: Option<String>,
    /// Seed of the latency sequences (default 1).
    #[arg(long, value_name = "N")]
    pub(crate) seed: Option<u64>,
    /// Spin this long before emulated completions (see `serve --help`;
    /// default 0).
    #[arg(long, value_name = "DURATION")]
    pub(crate) latency_spin: Option<String>,
    /// Poll the queues: off, on, an idle spin, adaptive or adaptive:MAX
    /// (see `serve --help`; default off, notify mode).
    #[arg(long, value_name = "off|on|SPIN|adaptive[:MAX]", num_args = 0..=1, default_missing_value = "on", require_equals = true)]
    pub(crate) poll: Option<String>,
    /// Guest vCPUs (default: the scenario's `vcpus`, a count or the usable
    /// host cores for `vcpus host[:MAX]`, else 2).
    #[arg(long, value_name = "N")]
    pub(crate) vcpus: Option<u32>,
    /// Guest memory, QEMU syntax: 1G, 2048M (default: the scenario's
    /// `memory`, plus its `memory_per_vcpu` for each vCPU beyond 2, else
    /// 1G).
    #[arg(long, value_name = "SIZE")]
    pub(crate) memory: Option<String>,
    /// Accelerator: auto probes KVM by booting the guest under it; nested
    /// boots an emulated host under TCG and the guests under its KVM
    /// (counting the host's instructions apart from the guest's).
    #[arg(long, value_enum, default_value = "auto")]
    pub(crate) accel: Accel,
    /// With --accel nested: the accelerator of the lab inside the emulated
    /// host. auto probes KVM there as on a user's host; kvm is forced, as
    /// `--accel kvm` on a KVM host.
    #[arg(long, value_enum, value_name = "auto|kvm", default_value = "auto")]
    pub(crate) inner_accel: InnerAccel,
    /// With --accel nested: a second VM runs in the emulated host beside
    /// the lab's guests for the whole run (the first kernel, rebooting in a
    /// loop), as on a host shared with other VMs. The lab's KVM counts must
    /// stay its guests' own; the neighbour's exits are kept in
    /// console/nested-host.neighbour.json.
    #[arg(long)]
    pub(crate) nested_neighbour: bool,
    /// With --accel nested: how long the emulated host may say nothing
    /// (no console line, no line on its second port, where it sends the
    /// inner lab's log and a heartbeat every 15 s) before it counts as
    /// silent. A silent host's state is kept in console/ and a fresh host
    /// runs the boots it had not finished.
    #[arg(long, value_name = "DURATION", default_value = "90s", value_parser = parse_interval)]
    pub(crate) host_silence: std::time::Duration,
    /// With --accel nested: the emulated host's vCPUs (default: one more
    /// than the largest guest's, for the backend and QEMU's own threads).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=64))]
    pub(crate) host_vcpus: Option<u32>,
    /// With --accel nested: how QEMU runs the emulated host's vCPUs: multi,
    /// a thread each (TCG's default); single, every vCPU on one thread in
    /// turn (slower; no two vCPUs run at once).
    #[arg(long, value_enum, value_name = "multi|single", default_value = "multi")]
    pub(crate) host_tcg: HostTcg,
    /// QEMU binary: a name on PATH or a path. Left at its default on a
    /// host with no qemu-system-x86_64 on PATH, the image cache's QEMU
    /// bundle (`blklab images export --bundle`, imported), with its own
    /// plugin; `bundle` takes the bundle whatever the host has.
    #[arg(long, value_name = "PATH|bundle", default_value = "qemu-system-x86_64")]
    pub(crate) qemu: String,
    /// Count executed guest instructions with blklab's TCG plugin (built for
    /// the installed QEMU on first use): kernel and user per IO, idle
    /// entries, per-function and per-group profiles of each variant's
    /// window; boots with `nokaslr`. `auto` (the default) counts whenever
    /// the run is under TCG and every kernel has a System.map, and goes on
    /// without counts if the plugin cannot be built; `on` (or the bare
    /// flag) forces TCG and fails without the plugin; `off` never counts.
    #[arg(long, value_enum, value_name = "auto|on|off", default_value = "auto",
          num_args = 0..=1, default_missing_value = "on")]
    pub(crate) count_insns: CountInsns,
    /// Extra guest kernel command-line arguments, appended after blklab's
    /// own (e.g. "mitigations=off"). One string; quote it in the shell.
    #[arg(long, value_name = "ARGS")]
    pub(crate) append: Option<String>,
    /// Deterministic TCG: `-icount shift=0` with single-threaded TCG (one
    /// instruction = 1 ns of guest time). Needs TCG.
    #[arg(long)]
    pub(crate) deterministic: bool,
    /// Output directory (default blklab-results/YYYYmmdd-HHMMSS). It must
    /// be new or hold no JSON documents: a directory with run.json or
    /// records of an earlier run is refused, never written into.
    #[arg(long, value_name = "DIR")]
    pub(crate) out: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) place: LabLocation,
    /// Longest wait for a guest to boot, times ceil(vCPUs / usable host
    /// cores) for each boot.
    #[arg(long, value_name = "DURATION", default_value = "180s", value_parser = parse_interval)]
    pub(crate) boot_timeout: std::time::Duration,
    /// Longest wait between two guest steps, beyond a variant's runtime,
    /// times ceil(vCPUs / usable host cores) for each boot.
    #[arg(long, value_name = "DURATION", default_value = "300s", value_parser = parse_interval)]
    step_timeout: std::time::Duration,
    /// Longest wait for the KVM probe guest.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_interval)]
    kvm_probe_timeout: std::time::Duration,
    /// No progress bar.
    #[arg(long)]
    pub(crate) no_progress: bool,
    /// Also draw each A/B report's HTML page into report.png beside it,
    /// with a headless Chromium (warns and goes on without one).
    #[arg(long)]
    pub screenshot: bool,
    /// Print the run's boots (kernel x scenario x iteration, in the order
    /// they would run; with --shard, that shard's) as JSON and exit:
    /// nothing is built or booted.
    #[arg(long)]
    pub(crate) plan: bool,
    /// Run one slice of the plan: I of N (1-based). Shards take whole
    /// (iteration, scenario part) groups, every kernel of each, so A/B pairs
    /// stay on one machine; `blklab compare DIR,DIR,...` merges them.
    #[arg(long, value_name = "I/N", value_parser = parse_shard)]
    pub shard: Option<Shard>,
}

/// A lab run, typed: the kernels and scenarios, how often, what the
/// command line overrides of the scenarios' settings, the guests, the
/// timeouts and where it all goes. Serialisable: the nested mode hands it
/// to the lab inside its host.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct RunOptions {
    pub(crate) kernels: Vec<KernelSpec>,
    /// Scenario names (guest-scripts/scenarios/NAME.scn).
    pub(crate) scenarios: Vec<String>,
    /// Boots per (kernel, scenario).
    pub(crate) iterations: u32,
    /// Only these variants.
    pub(crate) variants: Option<Vec<String>>,
    pub(crate) fio: FioOverrides,
    pub(crate) machine: MachineOverrides,
    pub(crate) device: DeviceOverrides,
    pub(crate) guest: GuestOptions,
    #[serde(default)]
    pub(crate) nested: NestedOptions,
    pub(crate) timeouts: Timeouts,
    /// The host cores a `vcpus host` scenario follows and the timeouts
    /// scale with (`None`: the CPUs this process may run on, read when the
    /// run is resolved; the nested mode's inner lab gets the outer host's).
    #[serde(default)]
    pub(crate) usable_cores: Option<u32>,
    pub(crate) place: LabLocation,
    /// The output directory (`None`: blklab-results/YYYYmmdd-HHMMSS).
    pub(crate) out: Option<PathBuf>,
    /// Draw the progress bar.
    pub(crate) progress: bool,
    /// Only print the plan.
    pub(crate) plan_only: bool,
    pub(crate) shard: Option<Shard>,
}

/// Every variant's fio timing, replaced (seconds).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct FioOverrides {
    pub(crate) runtime: Option<u64>,
    pub(crate) ramp: Option<u64>,
}

/// The machine's settings, replacing the scenario's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct MachineOverrides {
    pub(crate) vcpus: Option<u32>,
    /// QEMU size syntax.
    pub(crate) memory: Option<String>,
    pub(crate) disks: Option<u32>,
    pub(crate) num_queues: Option<u16>,
    pub(crate) queue_size: Option<u16>,
}

/// Device settings (`DEVICE_SETTINGS` names) given on the command line,
/// replacing the scenario's of the same name; checked with each boot's
/// disks.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DeviceOverrides(BTreeMap<String, String>);

impl DeviceOverrides {
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }
}

/// How the guests run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct GuestOptions {
    pub(crate) accel: Accel,
    /// The QEMU binary.
    pub(crate) qemu: String,
    pub(crate) count_insns: CountInsns,
    /// Extra kernel command-line arguments.
    pub(crate) append: Option<String>,
    /// `-icount shift=0` with single-threaded TCG.
    pub(crate) deterministic: bool,
    /// What backs each guest's RAM: ordinary pages, or 2 MiB huge pages
    /// for the run inside a nested host (whose huge-page pool is the part
    /// of its memory the plugin counts as the guest's).
    pub(crate) ram: GuestRam,
}

/// `--host-tcg`: how QEMU runs a nested run's emulated host's vCPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum HostTcg {
    /// A thread per vCPU (`-accel tcg,thread=multi`).
    #[default]
    Multi,
    /// Every vCPU on one thread in turn (`-accel tcg,thread=single`).
    Single,
}

impl HostTcg {
    /// QEMU's word for it (`thread=…`).
    pub(crate) fn qemu(self) -> &'static str {
        match self {
            HostTcg::Multi => "multi",
            HostTcg::Single => "single",
        }
    }
}

/// `--inner-accel`: how the lab inside a nested host chooses its
/// accelerator.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum InnerAccel {
    /// The KVM probe decides, as `--accel auto` on a user's host.
    #[default]
    Auto,
    /// KVM, without a probe, as `--accel kvm`.
    Kvm,
}

impl InnerAccel {
    /// The inner lab's `--accel`.
    pub(crate) fn accel(self) -> Accel {
        match self {
            InnerAccel::Auto => Accel::Auto,
            InnerAccel::Kvm => Accel::Kvm,
        }
    }
}

/// How a nested run's emulated host is set up (`--accel nested` only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct NestedOptions {
    pub(crate) inner_accel: InnerAccel,
    /// A second VM beside the lab's guests in the host.
    pub(crate) neighbour: bool,
    /// How long the host may say nothing before it is replaced.
    #[serde(default = "default_host_silence")]
    pub(crate) silence: Duration,
    /// The host's vCPUs, when given (else one more than the largest
    /// guest's).
    #[serde(default)]
    pub(crate) host_vcpus: Option<u32>,
    /// How QEMU runs them.
    #[serde(default)]
    pub(crate) host_tcg: HostTcg,
}

/// `--host-silence`'s default.
const HOST_SILENCE: Duration = Duration::from_secs(90);

fn default_host_silence() -> Duration {
    HOST_SILENCE
}

impl Default for NestedOptions {
    fn default() -> NestedOptions {
        NestedOptions {
            inner_accel: InnerAccel::Auto,
            neighbour: false,
            silence: HOST_SILENCE,
            host_vcpus: None,
            host_tcg: HostTcg::Multi,
        }
    }
}

impl NestedOptions {
    /// The flag that was given, when any differs from its default.
    pub(crate) fn given(&self) -> Option<&'static str> {
        if self.inner_accel != InnerAccel::Auto {
            Some("--inner-accel")
        } else if self.neighbour {
            Some("--nested-neighbour")
        } else if self.silence != HOST_SILENCE {
            Some("--host-silence")
        } else if self.host_vcpus.is_some() {
            Some("--host-vcpus")
        } else if self.host_tcg != HostTcg::Multi {
            Some("--host-tcg")
        } else {
            None
        }
    }
}

/// The longest waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Timeouts {
    /// For a guest to boot.
    pub(crate) boot: Duration,
    /// Between two guest steps, beyond a variant's runtime.
    pub(crate) step: Duration,
    /// For the KVM probe guest.
    pub(crate) kvm_probe: Duration,
}

impl Timeouts {
    /// The waits for a boot of `vcpus` vCPUs on `usable_cores` host cores:
    /// the boot and step timeouts times ceil(vcpus / cores), at least 1
    /// (vCPUs beyond the cores take turns on them under TCG).
    pub(crate) fn for_boot(self, vcpus: u32, usable_cores: u32) -> Timeouts {
        let factor = vcpus.div_ceil(usable_cores.max(1)).max(1);
        Timeouts {
            boot: self.boot.saturating_mul(factor),
            step: self.step.saturating_mul(factor),
            kvm_probe: self.kvm_probe,
        }
    }
}

impl Default for Timeouts {
    /// The command line's defaults.
    fn default() -> Timeouts {
        Timeouts {
            boot: Duration::from_secs(180),
            step: Duration::from_secs(300),
            kvm_probe: Duration::from_secs(30),
        }
    }
}

impl Default for GuestOptions {
    /// The command line's defaults.
    fn default() -> GuestOptions {
        GuestOptions {
            accel: Accel::Auto,
            qemu: "qemu-system-x86_64".into(),
            count_insns: CountInsns::Auto,
            append: None,
            deterministic: false,
            ram: GuestRam::Memfd,
        }
    }
}

impl RunOptions {
    /// `kernels` × `scenarios`, three iterations, everything else as the
    /// command line's defaults.
    pub(crate) fn new(kernels: Vec<KernelSpec>, scenarios: Vec<String>) -> RunOptions {
        RunOptions {
            kernels,
            scenarios,
            iterations: 3,
            variants: None,
            fio: FioOverrides::default(),
            machine: MachineOverrides::default(),
            device: DeviceOverrides::default(),
            guest: GuestOptions::default(),
            nested: NestedOptions::default(),
            timeouts: Timeouts::default(),
            usable_cores: None,
            place: LabLocation::default(),
            out: None,
            progress: true,
            plan_only: false,
            shard: None,
        }
    }
}

impl RunArgs {
    /// The options these flags ask for; a kernel spec that does not parse
    /// is refused here.
    pub(crate) fn to_options(&self) -> Result<RunOptions, ImageError> {
        let kernels = self
            .kernel
            .iter()
            .map(|k| k.parse())
            .collect::<Result<_, _>>()?;
        Ok(RunOptions {
            kernels,
            scenarios: self.scenario.clone(),
            iterations: self.iterations,
            variants: self.variants.clone(),
            fio: FioOverrides {
                runtime: self.runtime,
                ramp: self.ramp,
            },
            machine: MachineOverrides {
                vcpus: self.vcpus,
                memory: self.memory.clone(),
                disks: self.disks,
                num_queues: self.num_queues,
                queue_size: self.queue_size,
            },
            device: self.device_overrides(),
            guest: GuestOptions {
                accel: self.accel,
                qemu: self.qemu.clone(),
                count_insns: self.count_insns,
                append: self.append.clone(),
                deterministic: self.deterministic,
                ram: GuestRam::Memfd,
            },
            nested: NestedOptions {
                inner_accel: self.inner_accel,
                neighbour: self.nested_neighbour,
                silence: self.host_silence,
                host_vcpus: self.host_vcpus,
                host_tcg: self.host_tcg,
            },
            timeouts: Timeouts {
                boot: self.boot_timeout,
                step: self.step_timeout,
                kvm_probe: self.kvm_probe_timeout,
            },
            usable_cores: None,
            place: self.place.clone(),
            out: self.out.clone(),
            progress: !self.no_progress,
            plan_only: self.plan,
            shard: self.shard,
        })
    }

    /// The device flags given, by their scenario setting's name.
    fn device_overrides(&self) -> DeviceOverrides {
        let given = [
            ("disk", self.disk.clone()),
            ("size", self.size.clone()),
            ("tags", self.tags.clone()),
            ("depth", self.depth.map(|d| d.to_string())),
            ("tag_scope", self.tag_scope.clone()),
            ("tag_fairness", self.tag_fairness.clone()),
            ("latency", self.latency.clone()),
            ("read_latency", self.read_latency.clone()),
            ("write_latency", self.write_latency.clone()),
            ("flush_latency", self.flush_latency.clone()),
            ("latency_spin", self.latency_spin.clone()),
            ("seed", self.seed.map(|s| s.to_string())),
            ("poll", self.poll.clone()),
        ];
        DeviceOverrides(
            given
                .into_iter()
                .filter_map(|(name, value)| Some((name.to_string(), value?)))
                .collect(),
        )
    }
}

fn parse_shard(s: &str) -> Result<Shard, String> {
    s.parse()
}

/// An interval such as `1s`, `500ms`, `2.5s`.
pub(crate) fn parse_interval(s: &str) -> Result<std::time::Duration, String> {
    match s.parse::<crate::device::latency::LatencySpec>() {
        Ok(crate::device::latency::LatencySpec::Fixed(d))
            if d >= std::time::Duration::from_millis(10) =>
        {
            Ok(d)
        }
        _ => Err(format!(
            "invalid interval {s:?}: expected a duration of at least 10ms, e.g. 1s or 500ms"
        )),
    }
}

/// `--shard I/N`: slice `index` (1-based) of `count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Shard {
    pub index: u32,
    pub count: u32,
}

impl FromStr for Shard {
    type Err = String;
    fn from_str(s: &str) -> Result<Shard, String> {
        let bad = |why: &str| {
            format!(
                "invalid --shard {s:?}: {why} (expected I/N with 1 <= I <= N <= 1000, e.g. 2/3)"
            )
        };
        let (i, n) = s.split_once('/').ok_or_else(|| bad("no '/'"))?;
        let index: u32 = i.trim().parse().map_err(|_| bad("I is not a number"))?;
        let count: u32 = n.trim().parse().map_err(|_| bad("N is not a number"))?;
        if count == 0 || count > 1000 {
            return Err(bad("N out of range"));
        }
        if index == 0 || index > count {
            return Err(bad("I out of range"));
        }
        Ok(Shard { index, count })
    }
}

#[cfg(test)]
impl RunArgs {
    /// `blklab run FLAGS…` parsed as the command line would be, for tests.
    pub(crate) fn from_flags(flags: &[&str]) -> RunArgs {
        #[derive(clap::Parser)]
        struct Line {
            #[command(flatten)]
            run: RunArgs,
        }
        let mut v = vec!["blklab"];
        v.extend_from_slice(flags);
        <Line as clap::Parser>::parse_from(v).run
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_options_defaults_are_the_command_lines() {
        let from_flags = RunArgs::from_flags(&[]).to_options().unwrap();
        let made = RunOptions::new(from_flags.kernels.clone(), from_flags.scenarios.clone());
        assert_eq!(
            serde_json::to_value(&made).unwrap(),
            serde_json::to_value(&from_flags).unwrap()
        );
    }

    #[test]
    fn boot_and_step_timeouts_scale_with_vcpus_per_usable_core() {
        let t = Timeouts::default();
        let secs = |t: Timeouts| (t.boot.as_secs(), t.step.as_secs(), t.kvm_probe.as_secs());
        for (vcpus, cores, factor) in [
            (2, 2, 1),
            (1, 2, 1),
            (3, 2, 2),
            (16, 2, 8),
            (16, 16, 1),
            (17, 16, 2),
            (64, 64, 1),
            (64, 2, 32),
            (2, 0, 2),
        ] {
            assert_eq!(
                secs(t.for_boot(vcpus, cores)),
                (180 * factor, 300 * factor, 30),
                "{vcpus} vCPUs on {cores} cores"
            );
        }
    }

    #[test]
    fn every_device_setting_has_its_flag_and_a_bad_kernel_is_refused() {
        let o = RunArgs::from_flags(&[
            "--disk=mem",
            "--size=1G",
            "--tags=shared",
            "--depth=8",
            "--tag-scope=host",
            "--tag-fairness=on",
            "--latency=10us",
            "--read-latency=1us",
            "--write-latency=2us",
            "--flush-latency=3us",
            "--latency-spin=1us",
            "--seed=7",
            "--poll=adaptive",
        ])
        .to_options()
        .unwrap();
        for name in crate::lab::scenario::DEVICE_SETTINGS {
            assert!(o.device.get(name).is_some(), "{name}");
        }
        assert_eq!(o.device.get("depth"), Some("8"));
        assert_eq!(o.device.get("poll"), Some("adaptive"));
        assert!(RunArgs::from_flags(&["--kernel", "debian-9"])
            .to_options()
            .is_err());
    }
}
