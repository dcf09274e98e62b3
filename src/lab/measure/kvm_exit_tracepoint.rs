//! KVM's exits by reason over a variant's window, under KVM: a histogram
//! trigger on the `kvm:kvm_exit` tracepoint, in a tracefs instance of the
//! run's own, keyed by the exiting thread, the ISA (VMX or SVM) and the
//! exit reason. The trigger counts in the kernel as the tracepoint fires
//! (nothing goes through a ring buffer, nothing is lost while the lab
//! sleeps); the trigger's filter admits QEMU's vCPU threads only, so other
//! VMs on the host neither count nor fill the histogram, and the lab reads
//! it at the begin and the end SYNC and keeps the increase. A histogram
//! that dropped entries all the same is not an error: the records keep
//! KVM's own counters and say why they have no exits by reason. Reason
//! names are the running kernel's own, read from the tracepoint's print
//! format (`VMX_EXIT_REASONS`, `SVM_EXIT_REASONS`).
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

/// The trigger the run installs, before its filter (the size bounds the
/// distinct keys: the lab's vCPU threads × reasons, a few hundred).
const TRIGGER_KEYS: &str = "hist:keys=common_pid,isa,exit_reason:vals=hitcount:size=8192";

/// The trigger for the threads `tids`: only their exits are counted.
fn trigger_for(tids: &[u64]) -> String {
    if tids.is_empty() {
        return TRIGGER_KEYS.to_string();
    }
    let filter: Vec<String> = tids.iter().map(|t| format!("common_pid == {t}")).collect();
    format!("{TRIGGER_KEYS} if {}", filter.join(" || "))
}

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
    #[error("tracefs at {} is not readable by this user (exits by reason need root): {source}", path.display())]
    Permission {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
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

/// The tracefs to use among `roots` (the first with instances), or why
/// none can be used: none mounted, or one this user may not read.
pub(crate) fn find_tracefs(roots: &[&Path]) -> Result<PathBuf, ExitTraceUnavailable> {
    for root in roots {
        match std::fs::metadata(root.join("instances")) {
            Ok(m) if m.is_dir() => return Ok(root.to_path_buf()),
            Ok(_) => {}
            Err(e) => {
                if let Some(why) = unreadable(root, e) {
                    return Err(why);
                }
            }
        }
    }
    Err(ExitTraceUnavailable::NoTracefs)
}

/// A tracefs root whose `instances` could not be read: a permission error
/// names it; anything else (not mounted there) lets the next root be tried.
fn unreadable(root: &Path, e: std::io::Error) -> Option<ExitTraceUnavailable> {
    (e.kind() == std::io::ErrorKind::PermissionDenied).then(|| ExitTraceUnavailable::Permission {
        path: root.to_path_buf(),
        source: e,
    })
}

/// One read of the histogram.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct HistSample {
    pub(crate) hist: Hist,
    /// Keys the kernel could not add since the trigger was installed (the
    /// histogram was full): their exits are missing from `hist`.
    pub(crate) dropped: u64,
}

/// The run's histogram on `kvm:kvm_exit`: installed by [`ExitTrace::start`],
/// removed with its instance when dropped.
#[derive(Debug)]
pub(crate) struct ExitTrace {
    instance: PathBuf,
    trigger: String,
    names: ReasonNames,
}

/// The tracefs with the `kvm:kvm_exit` event, or why this host has none.
pub(crate) fn kvm_tracefs() -> Result<PathBuf, ExitTraceUnavailable> {
    let roots: Vec<&Path> = TRACEFS.iter().map(Path::new).collect();
    let root = find_tracefs(&roots)?;
    let event = root.join("events/kvm/kvm_exit");
    if !event.is_dir() {
        return Err(ExitTraceUnavailable::NoKvmEvent { path: event });
    }
    Ok(root)
}

impl ExitTrace {
    /// Install the trigger for the vCPU threads `tids` in a new instance
    /// of the tracefs at `root` ([`kvm_tracefs`]).
    pub(crate) fn start(root: &Path, tids: &[u64]) -> Result<ExitTrace, ExitTraceUnavailable> {
        let event = root.join("events/kvm/kvm_exit");
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
            trigger: trigger_for(tids),
            instance,
        };
        let file = trace.trigger_file();
        if let Err(source) = std::fs::write(&file, &trace.trigger) {
            return Err(ExitTraceUnavailable::Trigger { path: file, source });
        }
        debug!("counting KVM exits by reason: {}", trace.describe());
        Ok(trace)
    }

    /// A trace over an instance directory the caller made (a fixture: its
    /// `events/kvm/kvm_exit/hist` is whatever the test writes there).
    #[cfg(test)]
    pub(crate) fn in_fixture(instance: &Path, tids: &[u64]) -> ExitTrace {
        std::fs::create_dir_all(instance.join("events/kvm/kvm_exit")).unwrap();
        ExitTrace {
            instance: instance.to_path_buf(),
            trigger: trigger_for(tids),
            names: ReasonNames::parse(include_str!("testdata/kvm_exit.format.linux-6.12-svm")),
        }
    }

    /// Where and how the exits are counted: the instance and the trigger.
    pub(crate) fn describe(&self) -> String {
        format!("{}: {}", self.instance.display(), self.trigger)
    }

    fn trigger_file(&self) -> PathBuf {
        self.instance.join("events/kvm/kvm_exit/trigger")
    }

    fn hist_file(&self) -> PathBuf {
        self.instance.join("events/kvm/kvm_exit/hist")
    }

    /// The histogram now, and what it has dropped.
    pub(crate) fn sample(&self) -> Result<HistSample, KvmExitsError> {
        let path = self.hist_file();
        let text = std::fs::read_to_string(&path).map_err(|source| KvmExitsError::Read {
            path: path.clone(),
            source,
        })?;
        let (hist, dropped) = parse_hist(&text, &path)?;
        Ok(HistSample { hist, dropped })
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
        remove_instance(&self.instance, &self.trigger);
    }
}

/// Remove the trigger, then the instance (tracefs refuses to remove an
/// instance whose events still have triggers).
fn remove_instance(instance: &Path, trigger: &str) {
    let file = instance.join("events/kvm/kvm_exit/trigger");
    if let Err(e) = std::fs::write(&file, format!("!{trigger}")) {
        debug!("removing the trigger in {}: {e}", file.display());
    }
    if let Err(e) = std::fs::remove_dir(instance) {
        warn!(
            "cannot remove the tracefs instance {}: {e}",
            instance.display()
        );
    }
}

/// A stale instance's trigger, as its `trigger` file lists it (one per
/// line, with the kernel's own additions after ` [active]` or similar).
fn installed_trigger(instance: &Path) -> Option<String> {
    let text = std::fs::read_to_string(instance.join("events/kvm/kvm_exit/trigger")).ok()?;
    let line = text.lines().find(|l| l.starts_with("hist:"))?;
    Some(line.split(" [").next().unwrap_or(line).to_string())
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
                let trigger = installed_trigger(&entry.path());
                remove_instance(&entry.path(), trigger.as_deref().unwrap_or(TRIGGER_KEYS));
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
    fn the_trigger_counts_the_labs_threads_only() {
        assert_eq!(
            trigger_for(&[101, 102]),
            "hist:keys=common_pid,isa,exit_reason:vals=hitcount:size=8192 \
             if common_pid == 101 || common_pid == 102"
        );
        assert_eq!(trigger_for(&[]), TRIGGER_KEYS);
    }

    #[test]
    fn tracefs_is_the_first_root_with_instances_and_unreadable_is_not_unmounted() {
        let t = tempfile::tempdir().unwrap();
        let (a, b) = (t.path().join("tracing"), t.path().join("debug/tracing"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(b.join("instances")).unwrap();
        // Not mounted at the first (an empty mount point), mounted at the second.
        assert_eq!(find_tracefs(&[&a, &b]).unwrap(), b);
        std::fs::create_dir_all(a.join("instances")).unwrap();
        assert_eq!(find_tracefs(&[&a, &b]).unwrap(), a);
        let none = t.path().join("none");
        assert!(matches!(
            find_tracefs(&[&none]),
            Err(ExitTraceUnavailable::NoTracefs)
        ));
        // Root-only permissions (tracefs's default mode is 0700) are named
        // as such, with the path, not as a missing mount.
        let denied = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        let why = unreadable(&a, denied).unwrap();
        assert!(
            why.to_string().contains("not readable by this user")
                && why.to_string().contains("tracing"),
            "{why}"
        );
        let missing = std::io::Error::from(std::io::ErrorKind::NotFound);
        assert!(unreadable(&a, missing).is_none());
    }

    #[test]
    fn malformed_hist_lines_are_errors_and_drops_are_counted() {
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
