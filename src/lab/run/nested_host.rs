//! The outer lab's side of a nested run: the emulated host's machine, its
//! boot, and its console session (the relay's SYNCs answered after the
//! plugin's dumps; the host's own markers from its `/init`).
//!
//! Host console lines (from `images/nested-host/init`):
//! `BLKLAB-HOST-INIT kernel=… kvm=yes|no cpus=N`, `BLKLAB-HOST-ERROR …`,
//! `BLKLAB-HOST-END rc=N`; the relay's lines in between.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use log::{info, warn};
use thiserror::Error;

use crate::lab::guest::console::{self, FaultScanner, Phase};
use crate::lab::guest::qemu::{Guest, Next, QemuError, HEADLESS};
use crate::lab::guest::qmp::QmpError;
use crate::lab::images::nested_host::NestedHostImage;
use crate::lab::images::PreparedGuest;
use crate::lab::measure::plugin::{self, InsnsError, SymbolMap};
use crate::lab::nested::checkpoint::{self, CheckpointError};
use crate::lab::nested::merge::{self, MergeError, Merged, Window};
use crate::lab::nested::neighbour::NEIGHBOUR_MIB;
use crate::lab::nested::relay::{self, SyncLine, TasksLine, WindowKey};
use crate::lab::nested::transfer::{self, InnerRun, RunDisk, TransferError, RESULTS_DISK_BYTES};
use crate::lab::options::{NestedOptions, RunOptions, Timeouts};
use crate::lab::run::boot::{BootFailure, SocketDir};
use crate::lab::run::host_silence::{self, GaveUp, Silence, SilenceWatch};
use crate::lab::run::planted::{self, HostFault, Planted};
use crate::lab::run::progress::Progress;
use crate::lab::run::settings::Unit;
use crate::record::run::{NestedHostInfo, RunStamp};
use crate::record::summary::RetriedHost;
use crate::util::units::parse_size;

/// The host's kernel command line: its console on the serial port, quiet
/// (the console also carries the relay).
/// `nokaslr`: the kernel at its fixed physical address, in node 0, never
/// among the guests' huge pages on node 1.
/// `unknown_nmi_panic` and `panic_all_cpu_backtrace`: an NMI from outside
/// (the silence probe's, [`host_silence`]) makes the host panic with a
/// backtrace of where it was on its console; nothing else sends it one.
const HOST_APPEND: &str = "console=ttyS0 quiet loglevel=3 panic=-1 nokaslr unknown_nmi_panic \
     sysctl.kernel.panic_all_cpu_backtrace=1";

/// The host's CPU: AMD's EPYC model, whose SVM TCG emulates, without the
/// features TCG does not emulate (QEMU drops them anyway, with a warning
/// each): among them SVM's nrip-save, so KVM in the host decodes the
/// instruction at each intercepted exit itself.
const HOST_CPU: &str =
    "EPYC,fxsr-opt=off,misalignsse=off,osvw=off,topoext=off,nrip-save=off,xsavec=off";

/// Memory the host needs besides its guest's: its initramfs (QEMU and its
/// libraries), the run disk's files unpacked, QEMU's and blklab's own. The
/// host's NUMA node 0, with every vCPU.
const HOST_OVERHEAD_MIB: u64 = 1536;

/// The host's huge page: its guests' RAM is made of them.
const HUGE_PAGE_MIB: u64 = 2;

/// What node 1 needs besides its huge pages: its own `struct page`s (1/64
/// of it), kept on the node; the host's initramfs, which QEMU loads at the
/// top of low memory (in node 1) and the kernel frees only after it has
/// taken its huge pages; the firmware's tables there; and some room.
fn guest_node_mib(huge_pages: u64) -> u64 {
    let pages_mib = huge_pages * HUGE_PAGE_MIB;
    (pages_mib + pages_mib / 32 + 160).next_multiple_of(HUGE_PAGE_MIB)
}

/// Lines of the inner lab's log shown when the host fails.
const INNER_LOG_TAIL: usize = 12;

/// The file behind the host's NUMA node 1 in the stage directory, which
/// the plugin is told is level 2's (`l2ram=`).
const GUEST_NODE_FILE: &str = "guest-node.ram";

/// The host QEMU's QMP socket in the stage directory.
const QMP_SOCKET: &str = "host.qmp";

#[derive(Debug, Error)]
pub enum NestedError {
    #[error("the nested host's working directory: {0}")]
    Stage(#[source] Box<BootFailure>),
    #[error(transparent)]
    Transfer(#[from] TransferError),
    #[error("the nested host: {0}")]
    Qemu(#[from] QemuError),
    #[error("the nested host, before its /init spoke: {0}")]
    QemuBeforeInit(#[source] QemuError),
    #[error("the nested host could not run the lab: {0}")]
    Host(String),
    #[error("the nested host's kernel reported a fault (console: {}):\n{report}", console.display())]
    HostKernelFault { console: PathBuf, report: String },
    #[error("the instruction-count plugin at the {edge} of {window}: {source}")]
    Plugin {
        edge: &'static str,
        window: String,
        #[source]
        source: InsnsError,
    },
    #[error(transparent)]
    Merge(#[from] MergeError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error("pausing the nested host's boot on purpose: {0}")]
    PlantedStall(#[source] QmpError),
    #[error("the nested host was given up {attempts} times, silent, stalled or faulted (the last one's state: {})", state.display())]
    SilentHosts { attempts: u32, state: PathBuf },
}

/// The emulated host's machine: a vCPU more than its largest guest (for
/// the backend and QEMU's own threads) unless `--host-vcpus` says, and
/// [`HOST_OVERHEAD_MIB`] besides the guests' memory.
///
/// Counting instructions, it has two NUMA nodes. Node 0 has every vCPU
/// and the host's own memory. Node 1 has no vCPU and holds the host's
/// whole pool of 2 MiB huge pages, as many as its largest guest's RAM,
/// which the guests' RAM comes from (`hugetlb=on`) and nothing else uses.
/// So the guest's code runs from node 1 and the host's never does, and the
/// plugin, told node 1's backing file, counts each block at the level its
/// code's place says. Without counting, one node and no huge pages: the
/// guests' RAM is memfd, as on a user's host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HostMachine {
    pub(crate) vcpus: u32,
    /// Both nodes.
    pub(crate) memory_mib: u64,
    /// Node 1's: the huge pages and their overhead.
    pub(crate) guest_node_mib: u64,
    /// 2 MiB pages on node 1.
    pub(crate) huge_pages: u64,
}

impl HostMachine {
    /// The host for `units`; `levels_by_address` when the plugin counts
    /// (node 1 and its huge pages); with room for a second VM and the
    /// vCPUs `nested` asks for.
    pub(crate) fn new(
        units: &[Unit],
        levels_by_address: bool,
        nested: &NestedOptions,
    ) -> HostMachine {
        let largest = units
            .iter()
            .map(|u| u.settings.machine.vcpus)
            .max()
            .unwrap_or(1);
        let vcpus = nested.host_vcpus.unwrap_or(largest + 1);
        let neighbour = nested.neighbour;
        let guest_mib = units
            .iter()
            .filter_map(|u| parse_size(&u.settings.machine.memory).ok())
            .map(|b| b >> 20)
            .max()
            .unwrap_or(1024);
        let host_mib = HOST_OVERHEAD_MIB + if neighbour { NEIGHBOUR_MIB } else { 0 };
        if !levels_by_address {
            return HostMachine {
                vcpus,
                memory_mib: host_mib + guest_mib,
                guest_node_mib: 0,
                huge_pages: 0,
            };
        }
        let huge_pages = guest_mib.div_ceil(HUGE_PAGE_MIB);
        let guest_node_mib = guest_node_mib(huge_pages);
        HostMachine {
            vcpus,
            memory_mib: host_mib + guest_node_mib,
            guest_node_mib,
            huge_pages,
        }
    }

    /// The host's kernel command line: [`HOST_APPEND`] and the huge pages,
    /// all on node 1, when it has them.
    fn append(&self) -> String {
        if self.huge_pages == 0 {
            return HOST_APPEND.to_string();
        }
        format!(
            "{HOST_APPEND} hugepagesz={HUGE_PAGE_MIB}M hugepages=1:{}",
            self.huge_pages
        )
    }

    /// `-m`, the nodes' memory backends and `-numa`: node 1's backed by
    /// `guest_node` (a private mapping: nothing is written to the file).
    fn memory_args(&self, guest_node: &Path) -> Vec<String> {
        if self.guest_node_mib == 0 {
            return vec!["-m".into(), format!("{}M", self.memory_mib)];
        }
        let host_mib = self.memory_mib - self.guest_node_mib;
        vec![
            "-m".into(),
            format!("{}M", self.memory_mib),
            "-object".into(),
            format!("memory-backend-ram,id=host-node,size={host_mib}M"),
            "-object".into(),
            format!(
                "memory-backend-file,id=guest-node,size={}M,mem-path={},share=off",
                self.guest_node_mib,
                guest_node.display().to_string().replace(',', ",,")
            ),
            "-numa".into(),
            format!("node,nodeid=0,cpus=0-{},memdev=host-node", self.vcpus - 1),
            "-numa".into(),
            "node,nodeid=1,memdev=guest-node".into(),
        ]
    }
}

/// What run.json says of the host.
pub(crate) fn info(
    image: &NestedHostImage,
    machine: HostMachine,
    nested: &NestedOptions,
) -> NestedHostInfo {
    let by_address = machine.huge_pages > 0;
    NestedHostInfo {
        kernel: image.kernel.clone(),
        initramfs: image.initramfs.clone(),
        manifest: image.manifest.clone(),
        cpu: HOST_CPU.to_string(),
        vcpus: machine.vcpus,
        tcg_threads: Some(nested.host_tcg.qemu().to_string()),
        memory_mib: machine.memory_mib,
        guest_node_mib: by_address.then_some(machine.guest_node_mib),
        huge_pages: by_address.then_some(machine.huge_pages),
        guest_ram: Some(
            if by_address {
                "huge pages on node 1"
            } else {
                "memfd"
            }
            .to_string(),
        ),
        inner_accel: Some(nested.inner_accel.accel()),
        neighbour: nested.neighbour,
    }
}

/// What the outer lab hands the nested host's boot.
pub(crate) struct HostRun<'a> {
    pub(crate) options: &'a RunOptions,
    pub(crate) lab_dir: &'a Path,
    pub(crate) guests: &'a [PreparedGuest],
    pub(crate) labels: &'a [String],
    /// The plan's boots.
    pub(crate) boots: usize,
    pub(crate) out_dir: &'a Path,
    pub(crate) qemu: &'a str,
    pub(crate) image: &'a NestedHostImage,
    /// The instruction-count plugin, for the outer QEMU.
    pub(crate) plugin: Option<&'a Path>,
    /// The guests' System.maps, by kernel (with the plugin).
    pub(crate) maps: &'a [Option<Arc<SymbolMap>>],
    pub(crate) machine: HostMachine,
    /// The run's timeouts for a boot of the host's vCPUs (which cover the
    /// inner lab's, scaled for its guests' fewer vCPUs).
    pub(crate) timeouts: Timeouts,
    /// The longest variant's runtime and ramp.
    pub(crate) longest_variant: Duration,
    /// How long the host may say nothing before it is replaced.
    pub(crate) silence: Duration,
    pub(crate) pb: &'a Progress,
    /// What each record carries of the run document.
    pub(crate) stamp: &'a RunStamp,
}

/// Boot the host, follow its console to its end, and bring its records
/// back with the outer lab's counts. A host that falls silent is replaced
/// by a fresh one for the boots it had not finished, up to
/// [`HOST_ATTEMPTS`] hosts.
pub(crate) fn boot(r: &HostRun) -> Result<Merged, NestedError> {
    let mut kept = Merged::default();
    let mut attempt = Attempt {
        number: 1,
        skip: Vec::new(),
        planted: Planted::from_env(),
    };
    loop {
        match boot_retrying_known_bugs(r, &attempt)? {
            HostEnd::Finished(merged) => {
                kept.absorb(merged);
                return Ok(kept);
            }
            HostEnd::Silent(silent) => {
                let SilentHost {
                    partial,
                    boots_done,
                    retried,
                } = *silent;
                let state = retried.state.clone();
                attempt.planted = attempt.planted.next(&boots_done);
                attempt.skip.extend(boots_done);
                kept.absorb(partial);
                kept.retried_hosts.push(retried);
                if (0..r.boots).all(|seq| attempt.skip.contains(&seq)) {
                    info!("the nested host given up had finished every boot of the plan");
                    return Ok(kept);
                }
                if attempt.number == HOST_ATTEMPTS {
                    return Err(NestedError::SilentHosts {
                        attempts: HOST_ATTEMPTS,
                        state,
                    });
                }
                attempt.number += 1;
                r.pb.retry();
                warn!(
                    "booting a fresh nested host ({} of at most {HOST_ATTEMPTS}) for the boots left; \
                     {} finished before",
                    attempt.number,
                    attempt.skip.len()
                );
            }
        }
    }
}

/// How many hosts a run may boot when they fall silent.
const HOST_ATTEMPTS: u32 = 4;

/// Which host of the run this is, the boots earlier ones finished, and
/// the faults planted in it.
struct Attempt {
    number: u32,
    skip: Vec<usize>,
    planted: Planted,
}

/// How a host ended.
enum HostEnd {
    Finished(Merged),
    Silent(Box<SilentHost>),
}

/// A host that fell silent: the records of the boots it finished, and
/// what the summary says of it.
struct SilentHost {
    partial: Merged,
    boots_done: Vec<usize>,
    retried: RetriedHost,
}

/// One host, booted again when its QEMU aborts on a known emulator bug
/// before the host's /init.
fn boot_retrying_known_bugs(r: &HostRun, attempt: &Attempt) -> Result<HostEnd, NestedError> {
    let mut boot = 1;
    loop {
        match boot_once(r, attempt) {
            Err(NestedError::QemuBeforeInit(e)) if boot < HOST_BOOT_ATTEMPTS => {
                let text = e.to_string();
                let Some(bug) = crate::lab::guest::qemu::known_emulator_bug(&text) else {
                    return Err(NestedError::QemuBeforeInit(e));
                };
                boot += 1;
                warn!("the nested host's QEMU aborted on a known emulator bug ({bug}) before its /init; boot {boot} of at most {HOST_BOOT_ATTEMPTS}");
            }
            other => return other,
        }
    }
}

/// How often the nested host is booted when its QEMU aborts on a known
/// emulator bug before the host's /init: multi-threaded TCG's memory-map
/// race (QEMU issue 1921) costs seconds a time, and a 3-vCPU host with a
/// 2.7 GiB layout hit it twice in a row here.
const HOST_BOOT_ATTEMPTS: u32 = 4;

/// One boot of the nested host, the whole lab (less the boots earlier
/// hosts finished) inside it.
fn boot_once(r: &HostRun, attempt: &Attempt) -> Result<HostEnd, NestedError> {
    let stage = SocketDir::new(0).map_err(|e| NestedError::Stage(Box::new(e)))?;
    let run_disk = write_run_disk(r, &stage.0, attempt)?;
    let results_disk = stage.0.join("results.img");
    transfer::results_disk(&results_disk, RESULTS_DISK_BYTES)?;
    let plugin = r
        .plugin
        .map(|_| plugin::Control::new(stage.0.join("insns.sock")));
    let args = qemu_args(r, &stage.0, &run_disk, &results_disk, plugin.as_ref());
    let console = r.out_dir.join("console").join("nested-host.log");
    let _ = std::fs::remove_file(&console);
    info!(
        "booting the nested host ({} vCPUs, {} MiB) under TCG",
        r.machine.vcpus, r.machine.memory_mib
    );
    let guest = Guest::spawn_args(r.qemu, &args, Some(&console))?;
    if attempt.planted.this_host() == Some(HostFault::PausedBoot) {
        planted::stall_boot(&stage.0.join(QMP_SOCKET)).map_err(NestedError::PlantedStall)?;
    }
    let mut session = HostSession::new(r, guest, plugin, &stage.0, console);
    session.boots_seen = attempt.skip.len();
    let windows = match session.follow()? {
        Followed::Ended => std::mem::take(&mut session.windows),
        Followed::Silent(silence) => {
            let silent = session.give_up(silence, attempt.number, &results_disk)?;
            return Ok(HostEnd::Silent(Box::new(silent)));
        }
    };
    let results = stage.0.join("results");
    transfer::unpack_results(&results_disk, &results)?;
    Ok(HostEnd::Finished(merge::records(
        &destination(r),
        &results,
        windows,
    )?))
}

/// Where the host's records go.
fn destination<'a>(r: &'a HostRun) -> merge::Destination<'a> {
    merge::Destination {
        out_dir: r.out_dir,
        stamp: r.stamp,
        labels: r.labels,
        maps: r.maps,
    }
}

/// The run disk: this blklab, `inner.json` (without the boots earlier
/// hosts finished), the guests' files and the scenarios (with
/// `images/prepare.sh`, which marks a lab directory).
fn write_run_disk(r: &HostRun, stage: &Path, attempt: &Attempt) -> Result<PathBuf, NestedError> {
    let mut disk = RunDisk::create(&stage.join("run.tar"))?;
    // This very binary, through /proc/self/exe: its path may name another
    // file by now (rebuilt while a run went on) or none at all.
    disk.add_file(Path::new("/proc/self/exe"), "blklab")?;
    let dirs = add_guests(&mut disk, r.guests)?;
    let mut inner = InnerRun::new(r.options, r.guests, &dirs, r.plugin.is_some());
    inner.skip_boots = attempt.skip.clone();
    // Counting, the plugin splits the host's instructions by thread.
    inner.name_tasks = r.plugin.is_some();
    match attempt.planted.this_host() {
        Some(HostFault::Silence { after_boot: seq }) => inner.silence_after_boot = Some(seq),
        Some(HostFault::StallReport { after_boot: seq }) => {
            inner.stall_report_after_boot = Some(seq)
        }
        Some(HostFault::PausedBoot) | None => {}
    }
    let json = serde_json::to_vec_pretty(&inner).expect("an inner run serialises");
    disk.add_bytes("inner.json", &json)?;
    disk.add_file(
        &r.lab_dir.join("images/prepare.sh"),
        "lab/images/prepare.sh",
    )?;
    let scenarios = r.lab_dir.join("guest-scripts/scenarios");
    let entries = std::fs::read_dir(&scenarios).map_err(|source| TransferError::Add {
        from: scenarios.clone(),
        source,
    })?;
    for e in entries.flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "scn") {
            let name = format!(
                "lab/guest-scripts/scenarios/{}",
                e.file_name().to_string_lossy()
            );
            disk.add_file(&p, &name)?;
        }
    }
    Ok(disk.finish()?)
}

/// Each distinct guest's kernel, initramfs and manifests under
/// `guests/I/` (an A/A run names one kernel twice); each guest's I.
fn add_guests(disk: &mut RunDisk, guests: &[PreparedGuest]) -> Result<Vec<usize>, TransferError> {
    let mut dirs = Vec::new();
    let mut seen: Vec<&Path> = Vec::new();
    for g in guests {
        if let Some(i) = seen.iter().position(|k| *k == g.kernel) {
            dirs.push(i);
            continue;
        }
        let i = seen.len();
        seen.push(&g.kernel);
        disk.add_file(&g.kernel, &format!("guests/{i}/vmlinuz"))?;
        disk.add_file(&g.initramfs, &format!("guests/{i}/initramfs"))?;
        for (m, name) in [
            (&g.kernel_manifest, "kernel.json"),
            (&g.initramfs_manifest, "initramfs.json"),
        ] {
            if let Some(m) = m.as_ref().filter(|m| m.is_file()) {
                disk.add_file(m, &format!("guests/{i}/{name}"))?;
            }
        }
        dirs.push(i);
    }
    Ok(dirs)
}

/// The outer QEMU's command line: multi-threaded TCG (never `-icount`:
/// the guest inside stops making progress there) with an AMD CPU model
/// whose SVM TCG emulates, two NUMA nodes
/// ([`HostMachine::memory_args`]), the plugin told node 1's file, the
/// host's kernel and initramfs, and the two transfer disks.
fn qemu_args(
    r: &HostRun,
    stage: &Path,
    run_disk: &Path,
    results_disk: &Path,
    plugin: Option<&plugin::Control>,
) -> Vec<String> {
    let guest_node = stage.join(GUEST_NODE_FILE);
    let mut a: Vec<String> = Vec::new();
    let mut push = |s: &[&str]| a.extend(s.iter().map(|x| x.to_string()));
    push(&[
        "-accel",
        &format!("tcg,thread={}", r.options.nested.host_tcg.qemu()),
    ]);
    push(&["-M", "q35", "-cpu", HOST_CPU]);
    if let (Some(p), Some(ctl)) = (r.plugin, plugin) {
        push(&[
            "-plugin",
            &format!(
                "{},ctl={},l2ram={}",
                p.display(),
                ctl.path().display(),
                guest_node.display()
            ),
        ]);
    }
    push(&["-name", "blklab-host,debug-threads=on"]);
    push(&[
        "-qmp",
        &format!(
            "unix:{},server=on,wait=off",
            stage.join(QMP_SOCKET).display()
        ),
    ]);
    push(&["-smp", &r.machine.vcpus.to_string()]);
    a.extend(r.machine.memory_args(&guest_node));
    let mut push = |s: &[&str]| a.extend(s.iter().map(|x| x.to_string()));
    push(HEADLESS);
    push(&["-kernel", &r.image.kernel.display().to_string()]);
    push(&["-initrd", &r.image.initramfs.display().to_string()]);
    push(&["-append", &r.machine.append()]);
    // The inner lab's log, live (the host's ttyS1; a host that ends
    // replaces it with the results disk's copy, the same text).
    push(&[
        "-chardev",
        &format!(
            "file,id=innerlog,path={}",
            merge::inner_log(r.out_dir).display()
        ),
        "-device",
        "isa-serial,chardev=innerlog",
    ]);
    for (id, file, extra) in [
        ("run", run_disk, ",readonly=on"),
        ("results", results_disk, ""),
    ] {
        push(&[
            "-drive",
            &format!("file={},if=none,id={id},format=raw{extra}", file.display()),
            "-device",
            &format!("virtio-blk-pci,drive={id},serial=blklab-{id}"),
        ]);
    }
    a
}

/// The host's console session.
struct HostSession<'a> {
    r: &'a HostRun<'a>,
    guest: Guest,
    plugin: Option<plugin::Control>,
    stage: &'a Path,
    console: PathBuf,
    deadline: Instant,
    waiting_for: String,
    booted: bool,
    fault: FaultScanner,
    windows: BTreeMap<WindowKey, Window>,
    /// The (kernel, scenario, iteration) of the last window, for progress.
    last_boot: Option<(String, String, u32)>,
    boots_seen: usize,
    watch: SilenceWatch,
    /// The inner lab's log's length when last looked at.
    log_len: u64,
}

/// How a host's console session ended, when not in an error.
enum Followed {
    /// `BLKLAB-HOST-END`: the results disk holds the whole run.
    Ended,
    /// The host fell silent.
    Silent(Silence),
}

/// How often a quiet host's vCPU time is sampled.
const SILENCE_POLL: Duration = Duration::from_secs(5);

impl<'a> HostSession<'a> {
    fn new(
        r: &'a HostRun<'a>,
        guest: Guest,
        plugin: Option<plugin::Control>,
        stage: &'a Path,
        console: PathBuf,
    ) -> HostSession<'a> {
        HostSession {
            r,
            guest,
            plugin,
            stage,
            console,
            deadline: Instant::now() + r.timeouts.boot,
            waiting_for: "the nested host to boot (BLKLAB-HOST-INIT)".into(),
            booted: false,
            fault: FaultScanner::default(),
            windows: BTreeMap::new(),
            last_boot: None,
            boots_seen: 0,
            watch: SilenceWatch::new(r.silence, Instant::now()),
            log_len: 0,
        }
    }

    /// The longest the inner lab may be silent: a guest's boot, a step
    /// and the longest variant, all inside the host.
    fn inner_step(&self) -> Duration {
        let t = &self.r.timeouts;
        t.boot + t.step + self.r.longest_variant
    }

    /// Follow the console to `BLKLAB-HOST-END` (the windows counted are
    /// left in `windows`), or until the host falls silent.
    fn follow(&mut self) -> Result<Followed, NestedError> {
        loop {
            if Instant::now() >= self.deadline {
                self.show_inner_log();
                return Ok(Followed::Silent(self.stuck()));
            }
            let line = match self.next_line()? {
                Some(Next::Line(l)) => l,
                Some(Next::Closed) if self.fault.started() => return self.faulted(),
                Some(Next::Closed) => return Err(self.closed()),
                None => match self.silence() {
                    Some(s) => return Ok(Followed::Silent(s)),
                    None => continue,
                },
            };
            if let Some(report) = console::stall_report(&line) {
                return Ok(Followed::Silent(self.stalled(report)));
            }
            if self.fault.feed(&line) {
                if self.fault.complete() {
                    return self.faulted();
                }
                continue;
            }
            if let Some(sync) = SyncLine::parse(&line) {
                self.on_sync(sync)?;
            } else if let Some(tasks) = TasksLine::parse(&line) {
                self.on_tasks(tasks)?;
            } else if let Some(rest) = marker(&line, "BLKLAB-HOST-INIT") {
                self.booted = true;
                if rest.split_whitespace().any(|w| w.starts_with("heartbeat=")) {
                    self.watch.heartbeat();
                }
                info!("nested host booted ({rest})");
                self.expect("the lab inside the nested host".into());
            } else if let Some(rest) = marker(&line, "BLKLAB-HOST-ERROR") {
                return Err(NestedError::Host(rest.to_string()));
            } else if let Some(rest) = marker(&line, "BLKLAB-HOST-END") {
                let status = self.guest.wait_exit(Duration::from_secs(120));
                info!("nested host finished ({rest}; QEMU {status})");
                return Ok(Followed::Ended);
            }
        }
    }

    /// The next console line within [`SILENCE_POLL`] (`None`: none came),
    /// or the step's timeout.
    fn next_line(&mut self) -> Result<Option<Next>, NestedError> {
        let now = Instant::now();
        if now >= self.deadline {
            let e = self.guest.next_line(self.deadline, &self.waiting_for);
            return Ok(Some(e.inspect_err(|_| self.show_inner_log())?));
        }
        let next = self.guest.poll_line(SILENCE_POLL.min(self.deadline - now));
        if next.is_some() {
            self.watch.output(Instant::now());
        }
        Ok(next)
    }

    /// The host whose kernel reported a stall (`report`, its first line).
    fn stalled(&mut self, report: &str) -> Silence {
        Silence {
            why: GaveUp::Stall(report.to_string()),
            ..self.stuck()
        }
    }

    /// The host whose kernel reported a fault. Once its /init has spoken
    /// the host is given up like a silent one and a fresh host runs the
    /// boots left: the host's kernel is the lab's own, never the kernel
    /// under test, so its faults are the emulation's (or the host KVM's)
    /// and not the measurement's. Before that the run fails, since a
    /// fresh host would fault in its boot the same way.
    fn faulted(&mut self) -> Result<Followed, NestedError> {
        if !self.booted {
            return Err(self.kernel_fault());
        }
        let first = self.fault.first_line().unwrap_or_default();
        Ok(Followed::Silent(Silence {
            why: GaveUp::Fault(first),
            ..self.stuck()
        }))
    }

    /// The host at the step's timeout (its vCPUs busy or not).
    fn stuck(&mut self) -> Silence {
        let ticks = host_silence::vcpu_ticks(self.guest.pid()).unwrap_or(0);
        self.watch.at_timeout(Instant::now(), ticks)
    }

    /// Whether the host has fallen silent: its inner log stopped growing
    /// too, and its vCPUs are idle unless it sends a heartbeat. Before its
    /// /init speaks, the kernel's boot is quiet on the console (`quiet`),
    /// so only idle vCPUs tell a stalled boot from a slow one.
    fn silence(&mut self) -> Option<Silence> {
        let now = Instant::now();
        let log = std::fs::metadata(merge::inner_log(self.r.out_dir)).map_or(0, |m| m.len());
        if log != self.log_len {
            self.log_len = log;
            self.watch.output(now);
        }
        let ticks = host_silence::vcpu_ticks(self.guest.pid())?;
        self.watch.sample(now, ticks)
    }

    /// Give the silent host up: keep its state and logs, stop it, and take
    /// the records of the boots it finished from its last checkpoint.
    fn give_up(
        &mut self,
        silence: Silence,
        attempt: u32,
        results_disk: &Path,
    ) -> Result<SilentHost, NestedError> {
        let out = self.r.out_dir;
        match silence.kernel_report() {
            Some((what, report)) => warn!(
                "the nested host's kernel reported {what} while waiting for {} ({report}); keeping its state",
                self.waiting_for
            ),
            None => warn!(
                "the nested host {} while waiting for {} ({:.0} s without a line, {:.2} s of vCPU time); keeping its state",
                silence.what(),
                self.waiting_for,
                silence.quiet.as_secs_f64(),
                silence.vcpu_seconds
            ),
        }
        // The checkpoint first: its kallsyms name the vCPUs' RIPs (none
        // before the first: Debian ships the kernel's System.map only in
        // its -dbg package).
        let kept = self.kept_boots(results_disk);
        let symbols = SymbolMap::read(&self.stage.join("checkpoint").join(transfer::KALLSYMS)).ok();
        let state = host_silence::attempt_file(out, attempt, "state.txt");
        if let Err(e) = host_silence::keep_state(
            &self.stage.join(QMP_SOCKET),
            &mut self.guest,
            silence.clone(),
            symbols.as_ref(),
            &state,
        ) {
            warn!("cannot write {}: {e}", state.display());
        }
        let status = self.guest.wait_exit(Duration::ZERO);
        info!("the silent nested host stopped (QEMU {status})");
        let console = host_silence::attempt_file(out, attempt, "log");
        let _ = std::fs::rename(&self.console, &console);
        let log = host_silence::attempt_file(out, attempt, "blklab.log");
        let _ = std::fs::rename(merge::inner_log(out), &log);
        let (partial, boots_done) = kept?;
        info!(
            "kept the records of boots {boots_done:?} from the silent host's checkpoint ({})",
            state.display()
        );
        Ok(SilentHost {
            retried: RetriedHost {
                attempt,
                waiting_for: self.waiting_for.clone(),
                quiet_seconds: silence.quiet.as_secs_f64(),
                vcpu_seconds: silence.vcpu_seconds,
                busy: silence.busy,
                watchdog: silence.watchdog().map(str::to_string),
                fault: silence.fault().map(str::to_string),
                boots_kept: boots_done.clone(),
                state,
                console,
            },
            partial,
            boots_done,
        })
    }

    /// The records of the boots a stopped host finished, from the newest
    /// checkpoint on its results disk, with this session's windows.
    fn kept_boots(&mut self, results_disk: &Path) -> Result<(Merged, Vec<usize>), NestedError> {
        let Some(tar) = checkpoint::read_newest(results_disk)? else {
            return Ok((Merged::default(), Vec::new()));
        };
        let into = self.stage.join("checkpoint");
        transfer::unpack_tar(&tar[..], results_disk, &into)?;
        let manifest = checkpoint::manifest_in(&into).unwrap_or_default();
        let windows = std::mem::take(&mut self.windows);
        let merged = merge::records(&destination(self.r), &into, windows)?;
        Ok((merged, manifest.boots_done))
    }

    fn expect(&mut self, what: String) {
        self.deadline = Instant::now() + self.inner_step();
        self.waiting_for = what;
    }

    /// A relayed SYNC: the plugin's dump for its window, then the answer.
    fn on_sync(&mut self, sync: SyncLine) -> Result<(), NestedError> {
        let key = &sync.key;
        let name = format!(
            "{} {}/{} #{}",
            key.kernel, key.scenario, key.variant, key.iteration
        );
        let dump = match &self.plugin {
            Some(ctl) => {
                let edge = match sync.phase {
                    Phase::Begin => "begin",
                    Phase::End => "end",
                };
                let file = self.stage.join(format!("{edge}.insns"));
                Some(ctl.dump(&file).map_err(|source| NestedError::Plugin {
                    edge,
                    window: name.clone(),
                    source,
                })?)
            }
            None => None,
        };
        match sync.phase {
            Phase::Begin => {
                self.progress_boot(key);
                self.r.pb.variant(&name);
                self.windows.insert(
                    key.clone(),
                    Window {
                        begin: dump,
                        counted: None,
                    },
                );
            }
            Phase::End => {
                let w = self.windows.entry(key.clone()).or_default();
                w.counted = match (w.begin.take(), dump) {
                    (Some(first), Some(last)) => Some(last.since(&first)),
                    _ => None,
                };
                self.r.pb.variant_done();
            }
        }
        self.guest.answer(&relay::answer(sync.seq))?;
        self.expect(format!("the lab inside the nested host after {name}"));
        Ok(())
    }

    /// The host's task layout: to the plugin, which follows the host's
    /// task switches from then on; then the answer.
    fn on_tasks(&mut self, tasks: TasksLine) -> Result<(), NestedError> {
        if let Some(ctl) = &self.plugin {
            ctl.command(&tasks.layout.plugin_command())
                .map_err(|source| NestedError::Plugin {
                    edge: "start",
                    window: "the host's task layout".into(),
                    source,
                })?;
            info!(
                "the host's instructions are split by thread ({})",
                tasks.layout.render()
            );
        }
        self.guest.answer(&relay::answer(tasks.seq))?;
        Ok(())
    }

    /// Tell the progress bar when the windows move to another boot.
    fn progress_boot(&mut self, key: &WindowKey) {
        let b = (key.kernel.clone(), key.scenario.clone(), key.iteration);
        if self.last_boot.as_ref() != Some(&b) {
            self.r
                .pb
                .boot(self.boots_seen, &format!("{} {} #{}", b.0, b.1, b.2));
            self.boots_seen += 1;
            self.last_boot = Some(b);
        }
    }

    /// The console closed before `BLKLAB-HOST-END` with no kernel fault
    /// report begun (one that was is [`Self::faulted`]'s).
    fn closed(&mut self) -> NestedError {
        let e = self.guest.exited_error();
        if !self.booted {
            warn!("the nested host never said BLKLAB-HOST-INIT");
            return NestedError::QemuBeforeInit(e);
        }
        NestedError::Qemu(e)
    }

    /// Where the inner lab stood: the end of its log, which the host
    /// copies to its second serial port as it is written.
    fn show_inner_log(&self) {
        let path = merge::inner_log(self.r.out_dir);
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if text.trim().is_empty() {
            return;
        }
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(INNER_LOG_TAIL)..].join("\n");
        warn!(
            "the lab inside the nested host, its last log lines ({}):\n{tail}",
            path.display()
        );
    }

    fn kernel_fault(&self) -> NestedError {
        NestedError::HostKernelFault {
            console: self.console.clone(),
            report: self.fault.report(),
        }
    }
}

/// The rest of `line` after its marker `tag`, when it is one.
fn marker<'l>(line: &'l str, tag: &str) -> Option<&'l str> {
    let line = line.trim();
    let rest = line.strip_prefix(tag)?;
    (rest.is_empty() || rest.starts_with(' ')).then(|| rest.trim())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab::run::settings;
    use crate::lab::scenario;

    #[test]
    fn the_host_has_a_vcpu_more_than_its_largest_guest_and_room_for_its_memory() {
        let s = |t: &str| scenario::parse(t, "t.scn", "t").unwrap();
        let scenarios = [
            s("vcpus 2\nmemory 1G\nvariant a\n"),
            s("vcpus 4\nmemory 2048M\nvariant b\n"),
        ];
        let units = settings::units(
            &scenarios,
            &crate::lab::options::RunArgs::from_flags(&[])
                .to_options()
                .unwrap(),
            2,
        )
        .unwrap();
        let m = HostMachine::new(&units, true, &NestedOptions::default());
        // Node 1: 1024 huge pages, their struct pages (64 MiB) and 160 MiB.
        assert_eq!(
            m,
            HostMachine {
                vcpus: 5,
                memory_mib: HOST_OVERHEAD_MIB + 2048 + 64 + 160,
                guest_node_mib: 2048 + 64 + 160,
                huge_pages: 1024,
            }
        );
        assert!(m.append().ends_with(" hugepagesz=2M hugepages=1:1024"));
        let a = m.memory_args(Path::new("/s/guest-node.ram"));
        assert_eq!(
            a,
            [
                "-m",
                "3808M",
                "-object",
                "memory-backend-ram,id=host-node,size=1536M",
                "-object",
                "memory-backend-file,id=guest-node,size=2272M,mem-path=/s/guest-node.ram,share=off",
                "-numa",
                "node,nodeid=0,cpus=0-4,memdev=host-node",
                "-numa",
                "node,nodeid=1,memdev=guest-node"
            ]
        );
        // Not counting: one node, no huge pages, room for a neighbour.
        let neighbour = NestedOptions {
            neighbour: true,
            ..NestedOptions::default()
        };
        let m = HostMachine::new(&units, false, &neighbour);
        assert_eq!(
            (m.vcpus, m.memory_mib, m.huge_pages),
            (5, HOST_OVERHEAD_MIB + NEIGHBOUR_MIB + 2048, 0)
        );
        // `--host-vcpus` decides the vCPUs, whatever the guests have.
        let one = NestedOptions {
            host_vcpus: Some(1),
            ..NestedOptions::default()
        };
        assert_eq!(HostMachine::new(&units, true, &one).vcpus, 1);
        assert_eq!(m.append(), HOST_APPEND);
        let mib = HOST_OVERHEAD_MIB + NEIGHBOUR_MIB + 2048;
        assert_eq!(
            m.memory_args(Path::new("/s/guest-node.ram")),
            ["-m".to_string(), format!("{mib}M")]
        );
    }

    #[test]
    fn host_markers_are_whole_words() {
        assert_eq!(
            marker("BLKLAB-HOST-INIT kernel=6.12 kvm=yes\r", "BLKLAB-HOST-INIT"),
            Some("kernel=6.12 kvm=yes")
        );
        assert_eq!(marker("BLKLAB-HOST-END", "BLKLAB-HOST-END"), Some(""));
        assert_eq!(marker("BLKLAB-HOST-ENDING", "BLKLAB-HOST-END"), None);
        assert_eq!(marker("x BLKLAB-HOST-END", "BLKLAB-HOST-END"), None);
    }
}
