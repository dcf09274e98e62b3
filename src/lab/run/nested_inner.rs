//! `blklab nested-inner FILE`: the lab's side inside a nested host. The
//! host's `/init` starts it with the host's console as stdin and stdout
//! and its stderr into the results. It runs the outer lab's plan under
//! KVM ([`run_inside`]), relaying every SYNC on the
//! console; its run directory, the host's `/proc/kallsyms` (to symbolise
//! the host's instructions) and, when it fails, `error.txt` go back out.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use log::{info, warn};
use thiserror::Error;

use crate::lab::guest::console::Phase;
use crate::lab::guest::qemu::Accel;
use crate::lab::images::PreparedGuest;
use crate::lab::nested::checkpoint::{self, Manifest};
use crate::lab::nested::neighbour::{Neighbour, NeighbourError};
use crate::lab::nested::relay::{self, RelayError, SyncRelay, WindowKey};
use crate::lab::nested::task_layout::TaskLayout;
use crate::lab::nested::transfer::{InnerRun, ERROR_FILE, KALLSYMS, RESULTS_ROOT, RESULTS_SERIAL};
use crate::lab::options::RunOptions;
use crate::lab::run::plan::Plan;
use crate::lab::run::{boots, finish, prepare, run_document, RunError, RunOutcome, RunRequest};
use crate::record::summary::RetriedBoot;

#[derive(Debug, Error)]
pub enum InnerError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} is not an inner run document: {source}", path.display())]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error(transparent)]
    Run(#[from] Box<RunError>),
    #[error(transparent)]
    Neighbour(#[from] NeighbourError),
}

/// Run the inner lab of `file` (`inner.json` on the run disk).
pub fn run(file: &Path) -> Result<(), InnerError> {
    let read = |source| InnerError::Read {
        path: file.to_path_buf(),
        source,
    };
    let text = std::fs::read_to_string(file).map_err(read)?;
    let inner: InnerRun = serde_json::from_str(&text).map_err(|source| InnerError::Parse {
        path: file.to_path_buf(),
        source,
    })?;
    let results = Path::new(RESULTS_ROOT);
    save_kallsyms(results);
    let console = relay::console();
    if inner.name_tasks {
        name_tasks(&console);
    }
    let relay = HostLink::new(console, &inner);
    let neighbour = match start_neighbour(&inner, results) {
        Ok(n) => n,
        Err(e) => {
            let _ = std::fs::write(results.join(ERROR_FILE), error_chain(&e));
            return Err(e.into());
        }
    };
    let outcome = run_inside(&inner.options, inner.guests, &relay);
    if let Some(n) = neighbour {
        if let Err(e) = n.finish(results) {
            warn!("{e}");
        }
    }
    match outcome {
        Ok(_) => Ok(()),
        Err(e) => {
            let _ = std::fs::write(results.join(ERROR_FILE), error_chain(&e));
            Err(InnerError::Run(Box::new(e)))
        }
    }
}

/// The neighbour VM, when the run asks for one, booted from the first
/// guest's kernel.
fn start_neighbour(inner: &InnerRun, results: &Path) -> Result<Option<Neighbour>, NeighbourError> {
    let Some(guest) = inner.guests.first().filter(|_| inner.neighbour) else {
        return Ok(None);
    };
    Neighbour::start(&inner.options.guest.qemu, &guest.kernel, results).map(Some)
}

/// The lab inside a nested host (`blklab nested-inner`): the outer lab
/// prepared the `guests`; every variant's SYNC goes through `relay` to the
/// outer lab, which counts instructions over the same window.
pub(crate) fn run_inside(
    options: &RunOptions,
    guests: Vec<PreparedGuest>,
    relay: &dyn SyncRelay,
) -> Result<RunOutcome, RunError> {
    crate::lab::guest::cleanup::install();
    let request = RunRequest::new(options.clone())?;
    let plan = Plan::new(&request);
    plan.check_not_empty()?;
    let lab = prepare::prepare_lab(&request, &plan, Some(guests))?;
    if lab.accel != Accel::Kvm {
        return Err(RunError::NoKvmInside {
            reason: lab.accel_reason,
        });
    }
    let stamp = run_document::write(&request, &plan, &lab)?;
    let boots = boots::boot_all(&request, &plan, &lab, &stamp, Some(relay))?;
    finish(lab, boots)
}

/// Tell the outer lab where this kernel keeps what names a task, so that
/// its plugin splits the host's instructions by thread. Without it the
/// split is left out, the run goes on.
fn name_tasks<R: std::io::BufRead, W: std::io::Write>(console: &relay::Relay<R, W>) {
    match TaskLayout::of_this_kernel() {
        Ok(layout) => {
            if let Err(e) = console.tasks(layout) {
                warn!("the host's task layout not relayed: {e}");
            }
        }
        Err(e) => warn!("the host's instructions are not split by thread: {e}"),
    }
}

/// The host's `/proc/kallsyms` (its kernel and the modules loaded, KVM's
/// among them) into the results.
fn save_kallsyms(results: &Path) {
    let to = results.join(KALLSYMS);
    if let Err(e) = std::fs::copy("/proc/kallsyms", &to) {
        warn!("cannot copy /proc/kallsyms to {}: {e}", to.display());
    }
}

/// An error and its sources, one per line.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(&format!("\ncaused by: {s}"));
        source = s.source();
    }
    text
}

/// The inner lab's link to the outer one: the console's SYNC relay, the
/// boots an earlier host finished, and a checkpoint of the results on the
/// results disk after each boot this host finishes.
struct HostLink<R> {
    relay: R,
    skip: Vec<usize>,
    silence_after: Option<usize>,
    stall_report_after: Option<usize>,
    /// The results disk's device, when the host has one.
    disk: Option<PathBuf>,
    /// The plan's boots this host finished.
    done: Mutex<Vec<usize>>,
}

impl<R: SyncRelay> HostLink<R> {
    fn new(relay: R, inner: &InnerRun) -> HostLink<R> {
        let disk = device_with_serial(RESULTS_SERIAL);
        if disk.is_none() {
            warn!("no results disk (serial {RESULTS_SERIAL}): finished boots are not checkpointed");
        }
        HostLink {
            relay,
            skip: inner.skip_boots.clone(),
            silence_after: inner.silence_after_boot,
            stall_report_after: inner.stall_report_after_boot,
            disk,
            done: Mutex::new(Vec::new()),
        }
    }

    /// Write the results so far, with `manifest`, as checkpoint `seq`.
    fn checkpoint(&self, seq: u64, manifest: &Manifest) {
        let Some(disk) = &self.disk else { return };
        // The log is still being written; the outer lab has its live copy.
        let written = checkpoint::tar_of(Path::new(RESULTS_ROOT), &[LOG], manifest)
            .map_err(|e| e.to_string())
            .and_then(|tar| checkpoint::write(disk, seq, &tar).map_err(|e| e.to_string()));
        match written {
            Ok(()) => info!("checkpoint {seq}: boots {:?} kept", manifest.boots_done),
            Err(e) => warn!("checkpoint {seq}: {e}"),
        }
    }
}

impl<R: SyncRelay> SyncRelay for HostLink<R> {
    fn sync(&self, phase: Phase, key: WindowKey) -> Result<(), RelayError> {
        self.relay.sync(phase, key)
    }

    fn skips(&self, seq: usize) -> bool {
        self.skip.contains(&seq)
    }

    fn boot_finished(&self, seq: usize, failures: &[String], retried: &[RetriedBoot]) {
        let manifest = {
            let mut done = self.done.lock().unwrap_or_else(|p| p.into_inner());
            done.push(seq);
            Manifest {
                boots_done: done.clone(),
                failures: failures.to_vec(),
                retried_boots: retried.to_vec(),
            }
        };
        self.checkpoint(manifest.boots_done.len() as u64, &manifest);
        if self.stall_report_after == Some(seq) {
            report_a_stall();
            silence_the_host();
        }
        if self.silence_after == Some(seq) {
            silence_the_host();
        }
    }
}

/// The inner lab's log in the results, as the host's `/init` names it.
const LOG: &str = "blklab.log";

/// `/dev/vdX` of the virtio disk with `serial`.
fn device_with_serial(serial: &str) -> Option<PathBuf> {
    let entries = std::fs::read_dir("/sys/block").ok()?;
    entries.flatten().find_map(|e| {
        let name = e.file_name().to_string_lossy().into_owned();
        let s = std::fs::read_to_string(e.path().join("serial")).ok()?;
        (name.starts_with("vd") && s.trim() == serial).then(|| PathBuf::from("/dev").join(name))
    })
}

/// Fault injection ([`InnerRun::stall_report_after_boot`]): the first line
/// of a kernel soft-lockup report, as the host's kernel prints it, at
/// `KERN_EMERG` through `/dev/kmsg` so that the console shows it at the
/// host's `loglevel=3`.
fn report_a_stall() {
    let line = format!(
        "<0>watchdog: BUG: soft lockup - CPU#0 stuck for 22s! [blklab:{}] \
         (planted: a test's fault injection)\n",
        std::process::id()
    );
    warn!(
        "putting a soft-lockup report on the host's console on purpose (a test's fault injection)"
    );
    let written = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/kmsg")
        .and_then(|mut kmsg| std::io::Write::write_all(&mut kmsg, line.as_bytes()));
    if let Err(e) = written {
        warn!("could not write the planted report to /dev/kmsg: {e}");
    }
}

/// Fault injection ([`InnerRun::silence_after_boot`]): stop every process
/// of the host but its init, then this one. Nothing runs any more; the
/// host's kernel idles, and its console and log say nothing.
fn silence_the_host() {
    warn!("silencing the host on purpose (a test's fault injection)");
    // The host's /init copies the log to its second serial port with a
    // follower that polls each second: let it take this line out first.
    std::thread::sleep(std::time::Duration::from_secs(3));
    // SAFETY: kill and raise take no pointers; -1 is every process this
    // one may signal but init and itself.
    unsafe {
        libc::kill(-1, libc::SIGSTOP);
        libc::raise(libc::SIGSTOP);
    }
}
