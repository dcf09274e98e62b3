//! KVM's exits by reason over a variant's window, under KVM: a histogram
//! trigger on the `kvm:kvm_exit` tracepoint, in a tracefs instance of the
//! run's own, keyed by the exiting thread, the ISA (VMX or SVM) and the
//! exit reason. The trigger counts in the kernel as the tracepoint fires
//! (nothing goes through a ring buffer, nothing is lost while the lab
//! sleeps); the lab reads the histogram at the begin and the end SYNC and
//! keeps the increase for QEMU's vCPU threads only, so other VMs on the
//! host do not count. Reason names are the running kernel's own, read from
//! the tracepoint's print format (`VMX_EXIT_REASONS`, `SVM_EXIT_REASONS`).
//!
//! KVM's binary statistics (`kvm_stats`) count exits in a few classes
//! (`halt_exits`, `io_exits`, …); this says why every exit happened.
//! It needs root and tracefs with hist triggers (`CONFIG_HIST_TRIGGERS`,
//! Debian's kernels have it); without them records say why they have none.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use log::{debug, warn};
use thiserror::Error;

/// Where tracefs may be mounted, in order of preference.
const TRACEFS: &[&str] = &["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// The trigger the run installs (the size bounds the distinct keys: vCPU
/// threads × reasons, a few hundred even for a host full of VMs).
const TRIGGER: &str = "hist:keys=common_pid,isa,exit_reason:vals=hitcount:size=8192";

/// `KVM_ISA_VMX` and `KVM_ISA_SVM` (arch/x86/kvm/trace.h).
const ISA_VMX: u64 = 1;
const ISA_SVM: u64 = 2;

/// The instance directory prefix: `blklab-PID-N`.
const INSTANCE_PREFIX: &str = "blklab-";

static NEXT_INSTANCE: AtomicU32 = AtomicU32::new(0);

#[derive(Debug, Error)]
pub enum KvmExitsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a histogram line: {line:?}")]
    HistLine { path: PathBuf, line: String },
    #[error("{path}: the kernel dropped {dropped} keys (the histogram is full)")]
    Dropped { path: PathBuf, dropped: u64 },
    #[error(
        "{path}: the histogram went down for thread {pid} reason {reason}: {begin} then {end}"
    )]
    Backwards {
        path: PathBuf,
        pid: u64,
        reason: String,
        begin: u64,
        end: u64,
    },
}

/// Why this host cannot count exits by reason (recorded, not a failure).
#[derive(Debug, Error)]
pub(crate) enum ExitTraceUnavailable {
    #[error("no tracefs with instances at {} (mount -t tracefs nodev /sys/kernel/tracing, as root)", TRACEFS.join(" or "))]
    NoTracefs,
    #[error("{} does not exist: the kvm module is not loaded", path.display())]
    NoKvmEvent { path: PathBuf },
    #[error("cannot create the tracefs instance {}: {source}", path.display())]
    Instance {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot install a hist trigger in {} (a kernel without CONFIG_HIST_TRIGGERS?): {source}", path.display())]
    Trigger {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A histogram's key: the thread, the ISA and the raw exit reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct ExitKey {
    pub(crate) pid: u64,
    pub(crate) isa: u64,
    pub(crate) reason: u64,
}

/// A histogram read: hits per key.
pub(crate) type Hist = BTreeMap<ExitKey, u64>;

/// The running kernel's exit reason names per ISA.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ReasonNames {
    vmx: BTreeMap<u64, String>,
    svm: BTreeMap<u64, String>,
}

impl ReasonNames {
    /// The reason names of a `kvm_exit` format file: its print format
    /// holds two `__print_symbolic` tables, VMX's (for `isa == 1`) first,
    /// then SVM's, each entry `{ VALUE, "name" }` with VALUE a sum of
    /// integer literals (`0x040 + 14`).
    pub(crate) fn parse(format: &str) -> ReasonNames {
        let mut tables = format
            .split("__print_symbolic(")
            .skip(1)
            .map(symbolic_table);
        ReasonNames {
            vmx: tables.next().unwrap_or_default(),
            svm: tables.next().unwrap_or_default(),
        }
    }

    /// A reason's name: the kernel's (lower case, spaces as `_`), or the
    /// ISA and the number.
    pub(crate) fn name(&self, isa: u64, reason: u64) -> String {
        let (table, isa_name, code) = match isa {
            ISA_VMX => (&self.vmx, "vmx", reason & 0xffff),
            ISA_SVM => (&self.svm, "svm", reason),
            _ => return format!("isa{isa}_{reason:#x}"),
        };
        match table.get(&code) {
            Some(n) => n.to_ascii_lowercase().replace(' ', "_"),
            None => format!("{isa_name}_{code:#x}"),
        }
    }
}

/// The `{ VALUE, "name" }` entries at the start of one `__print_symbolic`
/// argument list (up to its closing parenthesis).
fn symbolic_table(text: &str) -> BTreeMap<u64, String> {
    let mut table = BTreeMap::new();
    let mut depth = 0usize;
    let mut end = text.len();
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' if depth == 0 => {
                end = i;
                break;
            }
            ')' => depth -= 1,
            _ => {}
        }
    }
    for entry in text[..end].split('{').skip(1) {
        let Some((value, rest)) = entry.split_once(',') else {
            continue;
        };
        let name = rest.split('"').nth(1);
        if let (Some(v), Some(n)) = (literal_sum(value), name) {
            table.insert(v, n.to_string());
        }
    }
    table
}

/// `0x040 + 14` → 78.
fn literal_sum(text: &str) -> Option<u64> {
    text.split('+')
        .map(|t| {
            let t = t.trim().trim_start_matches('(').trim_end_matches(')');
            match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
                Some(hex) => u64::from_str_radix(hex, 16).ok(),
                None => t.parse().ok(),
            }
        })
        .sum()
}

/// The lines of a `hist` file: hits per key, and what the kernel dropped.
pub(crate) fn parse_hist(text: &str, path: &Path) -> Result<(Hist, u64), KvmExitsError> {
    let mut hist = Hist::new();
    let mut dropped = 0;
    for line in text.lines().map(str::trim) {
        if let Some(n) = line.strip_prefix("Dropped:") {
            dropped = n.trim().parse().unwrap_or(0);
        }
        let Some(body) = line.strip_prefix('{') else {
            continue;
        };
        let bad = || KvmExitsError::HistLine {
            path: path.to_path_buf(),
            line: line.to_string(),
        };
        let (keys, hits) = body.split_once('}').ok_or_else(bad)?;
        let hits: u64 = hits
            .trim()
            .strip_prefix("hitcount:")
            .and_then(|h| h.trim().parse().ok())
            .ok_or_else(bad)?;
        let field = |name: &str| -> Option<u64> {
            keys.split(',')
                .filter_map(|kv| kv.split_once(':'))
                .find(|(k, _)| k.trim() == name)
                .and_then(|(_, v)| v.trim().parse().ok())
        };
        let key = ExitKey {
            pid: field("common_pid").ok_or_else(bad)?,
            isa: field("isa").ok_or_else(bad)?,
            reason: field("exit_reason").ok_or_else(bad)?,
        };
        *hist.entry(key).or_default() += hits;
    }
    Ok((hist, dropped))
}

/// Exits by reason name over a window, for each of `tids` (in order) and
/// summed over them.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ExitReasons {
    pub(crate) total: BTreeMap<String, u64>,
    pub(crate) per_thread: Vec<BTreeMap<String, u64>>,
}

/// The increase from `begin` to `end` for the threads `tids`.
pub(crate) fn window(
    names: &ReasonNames,
    tids: &[u64],
    begin: &Hist,
    end: &Hist,
    path: &Path,
) -> Result<ExitReasons, KvmExitsError> {
    let mut w = ExitReasons {
        per_thread: vec![BTreeMap::new(); tids.len()],
        ..ExitReasons::default()
    };
    // A key of the begin missing at the end went down to 0: the histogram
    // was cleared under the run.
    let keys = end
        .keys()
        .chain(begin.keys().filter(|k| !end.contains_key(k)));
    for key in keys {
        let Some(slot) = tids.iter().position(|t| *t == key.pid) else {
            continue;
        };
        let a = begin.get(key).copied().unwrap_or(0);
        let z = end.get(key).copied().unwrap_or(0);
        let name = names.name(key.isa, key.reason);
        let delta = z.checked_sub(a).ok_or_else(|| KvmExitsError::Backwards {
            path: path.to_path_buf(),
            pid: key.pid,
            reason: name.clone(),
            begin: a,
            end: z,
        })?;
        if delta > 0 {
            *w.per_thread[slot].entry(name.clone()).or_default() += delta;
            *w.total.entry(name).or_default() += delta;
        }
    }
    Ok(w)
}

/// The run's histogram on `kvm:kvm_exit`: installed by [`ExitTrace::start`],
/// removed with its instance when dropped.
#[derive(Debug)]
pub(crate) struct ExitTrace {
    instance: PathBuf,
    names: ReasonNames,
}

impl ExitTrace {
    /// Install the trigger in a new tracefs instance, or say why the host
    /// cannot count exits by reason.
    pub(crate) fn start() -> Result<ExitTrace, ExitTraceUnavailable> {
        let root = TRACEFS
            .iter()
            .map(Path::new)
            .find(|p| p.join("instances").is_dir())
            .ok_or(ExitTraceUnavailable::NoTracefs)?;
        let event = root.join("events/kvm/kvm_exit");
        if !event.is_dir() {
            return Err(ExitTraceUnavailable::NoKvmEvent { path: event });
        }
        remove_stale_instances(&root.join("instances"));
        let instance = root.join("instances").join(format!(
            "{INSTANCE_PREFIX}{}-{}",
            std::process::id(),
            NEXT_INSTANCE.fetch_add(1, Ordering::Relaxed)
        ));
        if let Err(source) = std::fs::create_dir(&instance) {
            return Err(ExitTraceUnavailable::Instance {
                path: instance,
                source,
            });
        }
        let format = std::fs::read_to_string(event.join("format")).unwrap_or_default();
        let trace = ExitTrace {
            names: ReasonNames::parse(&format),
            instance,
        };
        let trigger = trace.trigger_file();
        if let Err(source) = std::fs::write(&trigger, TRIGGER) {
            return Err(ExitTraceUnavailable::Trigger {
                path: trigger,
                source,
            });
        }
        debug!(
            "counting KVM exits by reason in {}",
            trace.instance.display()
        );
        Ok(trace)
    }

    fn trigger_file(&self) -> PathBuf {
        self.instance.join("events/kvm/kvm_exit/trigger")
    }

    fn hist_file(&self) -> PathBuf {
        self.instance.join("events/kvm/kvm_exit/hist")
    }

    /// The histogram now.
    pub(crate) fn sample(&self) -> Result<Hist, KvmExitsError> {
        let path = self.hist_file();
        let text = std::fs::read_to_string(&path).map_err(|source| KvmExitsError::Read {
            path: path.clone(),
            source,
        })?;
        let (hist, dropped) = parse_hist(&text, &path)?;
        if dropped > 0 {
            return Err(KvmExitsError::Dropped { path, dropped });
        }
        Ok(hist)
    }

    /// Exits by reason of the threads `tids` from `begin` to `end`.
    pub(crate) fn window(
        &self,
        tids: &[u64],
        begin: &Hist,
        end: &Hist,
    ) -> Result<ExitReasons, KvmExitsError> {
        window(&self.names, tids, begin, end, &self.hist_file())
    }
}

impl Drop for ExitTrace {
    fn drop(&mut self) {
        remove_instance(&self.instance);
    }
}

/// Remove the trigger, then the instance (tracefs refuses to remove an
/// instance whose events still have triggers).
fn remove_instance(instance: &Path) {
    let trigger = instance.join("events/kvm/kvm_exit/trigger");
    if let Err(e) = std::fs::write(&trigger, format!("!{TRIGGER}")) {
        debug!("removing the trigger in {}: {e}", trigger.display());
    }
    if let Err(e) = std::fs::remove_dir(instance) {
        warn!(
            "cannot remove the tracefs instance {}: {e}",
            instance.display()
        );
    }
}

/// Instances left by blklab processes that no longer run (killed before
/// they could remove theirs).
fn remove_stale_instances(instances: &Path) {
    let Ok(dir) = std::fs::read_dir(instances) else {
        return;
    };
    for entry in dir.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let pid = name
            .strip_prefix(INSTANCE_PREFIX)
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<u32>().ok());
        if let Some(pid) = pid {
            if !Path::new(&format!("/proc/{pid}")).exists() {
                remove_instance(&entry.path());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FORMAT: &str = include_str!("testdata/kvm_exit.format.linux-6.12-svm");
    const HIST: &str = include_str!("testdata/kvm_exit.hist.linux-6.12-svm");

    #[test]
    fn reason_names_come_from_the_kernels_tables() {
        let n = ReasonNames::parse(FORMAT);
        assert_eq!(n.name(ISA_SVM, 0x78), "hlt");
        assert_eq!(n.name(ISA_SVM, 0x7b), "io");
        assert_eq!(n.name(ISA_SVM, 0x7c), "msr");
        assert_eq!(n.name(ISA_SVM, 0x400), "npf");
        assert_eq!(n.name(ISA_SVM, 0x60), "interrupt");
        // An exception exit: 0x040 + vector in the kernel's table.
        assert_eq!(n.name(ISA_SVM, 0x40 + 14), "pf_excp");
        assert_eq!(n.name(ISA_VMX, 12), "hlt");
        assert_eq!(n.name(ISA_VMX, 30), "io_instruction");
        assert_eq!(n.name(ISA_VMX, 32), "msr_write");
        // VMX's high bits (entry failure etc.) are not the basic reason.
        assert_eq!(n.name(ISA_VMX, 0x8000_000c), "hlt");
        assert_eq!(n.name(ISA_SVM, 0x7777), "svm_0x7777");
        assert_eq!(n.name(3, 1), "isa3_0x1");
    }

    #[test]
    fn literal_sums() {
        assert_eq!(literal_sum(" 0x040 + 14 "), Some(78));
        assert_eq!(literal_sum("12"), Some(12));
        assert_eq!(literal_sum("x"), None);
    }

    #[test]
    fn a_hist_file_parses_and_a_window_keeps_the_vcpu_threads() {
        let path = Path::new("hist");
        let (end, dropped) = parse_hist(HIST, path).unwrap();
        assert_eq!(dropped, 0);
        assert!(!end.is_empty());
        let names = ReasonNames::parse(FORMAT);
        let pids: Vec<u64> = {
            let mut p: Vec<u64> = end.keys().map(|k| k.pid).collect();
            p.dedup();
            p
        };
        let w = window(&names, &pids, &Hist::new(), &end, path).unwrap();
        let hits: u64 = end.values().sum();
        assert_eq!(w.total.values().sum::<u64>(), hits);
        assert_eq!(w.per_thread.len(), pids.len());
        // A thread not asked for does not count.
        let w1 = window(&names, &pids[..1], &Hist::new(), &end, path).unwrap();
        assert_eq!(w1.total, w1.per_thread[0]);
        // From a sample to itself: nothing.
        let w0 = window(&names, &pids, &end, &end, path).unwrap();
        assert!(w0.total.is_empty());
        // Backwards is an error.
        assert!(matches!(
            window(&names, &pids, &end, &Hist::new(), path),
            Err(KvmExitsError::Backwards { .. })
        ));
    }

    #[test]
    fn malformed_hist_lines_and_drops_are_errors() {
        let path = Path::new("hist");
        let bad = "{ common_pid: 12, isa: 2 } hitcount: 3\n";
        assert!(matches!(
            parse_hist(bad, path),
            Err(KvmExitsError::HistLine { .. })
        ));
        let text = "{ common_pid: 12, isa: 2, exit_reason: 120 } hitcount: 3\n\nTotals:\n    Hits: 3\n    Entries: 1\n    Dropped: 5\n";
        let (h, dropped) = parse_hist(text, path).unwrap();
        assert_eq!(dropped, 5);
        assert_eq!(
            h[&ExitKey {
                pid: 12,
                isa: 2,
                reason: 120
            }],
            3
        );
    }
}
