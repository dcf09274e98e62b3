//! The nested host's results, merged into the outer run: each record the
//! inner lab wrote, marked `nested` and given the outer lab's counts over
//! its window (the guest's instructions, the host's), written into the
//! outer run directory with the inner boots' console logs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use log::warn;
use thiserror::Error;

use crate::lab::guest::qemu::Accel;
use crate::lab::measure::plugin::host_split::{self, HostProcesses};
use crate::lab::measure::plugin::{self, Dump, InsnsWindow, SymbolMap};
use crate::lab::nested::checkpoint;
use crate::lab::nested::neighbour::NEIGHBOUR_FILE;
use crate::lab::nested::relay::WindowKey;
use crate::lab::nested::transfer::{ERROR_FILE, KALLSYMS};
use crate::record::result::ResultRecord;
use crate::record::run::RunStamp;
use crate::record::summary::{RetriedBoot, RetriedHost, SummaryDocument};
use crate::record::RecordError;
use crate::util::hostcpu::ProcessCpu;

#[derive(Debug, Error)]
pub enum MergeError {
    #[error("cannot read the nested host's results {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot copy {} into the run: {source}", path.display())]
    Copy {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Record(#[from] RecordError),
    #[error("the lab inside the nested host failed (its log: {}): {message}", log.display())]
    Inner { message: String, log: PathBuf },
}

/// One window's plugin dumps: the begin's, then the window's counts.
#[derive(Debug, Default)]
pub(crate) struct Window {
    pub(crate) begin: Option<Dump>,
    pub(crate) counted: Option<Dump>,
}

/// Where the merged records go and what symbolises their counts.
pub(crate) struct Destination<'a> {
    pub(crate) out_dir: &'a Path,
    /// The outer run's, which its records carry instead of the inner run's.
    pub(crate) stamp: &'a RunStamp,
    /// The kernels' labels and, with counts, their System.maps.
    pub(crate) labels: &'a [String],
    pub(crate) maps: &'a [Option<Arc<SymbolMap>>],
}

/// What the nested host's boots produced.
#[derive(Default)]
pub(crate) struct Merged {
    pub(crate) records: Vec<ResultRecord>,
    pub(crate) failures: Vec<String>,
    pub(crate) retried: Vec<RetriedBoot>,
    /// The hosts that went silent before the one that finished.
    pub(crate) retried_hosts: Vec<RetriedHost>,
}

impl Merged {
    /// Add a later host's results to these.
    pub(crate) fn absorb(&mut self, mut later: Merged) {
        self.records.append(&mut later.records);
        self.records.sort_by_key(|r| r.boot_seq);
        self.failures.append(&mut later.failures);
        self.retried.append(&mut later.retried);
        self.retried_hosts.append(&mut later.retried_hosts);
    }
}

/// Where the inner lab's log is kept in the outer run directory.
pub(crate) fn inner_log(out_dir: &Path) -> PathBuf {
    out_dir.join("console").join("nested-host.blklab.log")
}

/// The inner run's records from `results` (the unpacked results disk),
/// with `windows`' counts, into the outer run directory.
pub(crate) fn records(
    r: &Destination,
    results: &Path,
    mut windows: BTreeMap<WindowKey, Window>,
) -> Result<Merged, MergeError> {
    let log = inner_log(r.out_dir);
    copy_if_there(&results.join("blklab.log"), &log)?;
    let console = r.out_dir.join("console");
    copy_if_there(
        &results.join(NEIGHBOUR_FILE),
        &console.join("nested-host.neighbour.json"),
    )?;
    copy_if_there(
        &results.join("neighbour.console"),
        &console.join("nested-host.neighbour.log"),
    )?;
    // The inner boots' consoles first: a failed run names them.
    let inner = results.join("out");
    copy_consoles(&inner.join("console"), &r.out_dir.join("console"))?;
    if let Ok(message) = std::fs::read_to_string(results.join(ERROR_FILE)) {
        return Err(MergeError::Inner {
            message: message.trim().to_string(),
            log,
        });
    }
    let host_map = host_symbols(results);
    let mut out = Merged::default();
    for path in record_files(&inner)? {
        let mut record: ResultRecord = crate::record::read(&path)?;
        restamp(&mut record, r.stamp);
        let key = WindowKey {
            kernel: record.kernel.clone(),
            scenario: record.scenario.clone(),
            variant: record.variant.clone(),
            iteration: record.iteration,
        };
        let window = windows.remove(&key).and_then(|w| w.counted);
        let guest_map = r
            .labels
            .iter()
            .position(|l| *l == record.kernel)
            .and_then(|i| r.maps.get(i).cloned().flatten());
        if let Some(w) = &window {
            attach_counts(&mut record, w, guest_map, host_map.as_ref());
        }
        let name = path.file_name().expect("a record file has a name");
        crate::record::write(&r.out_dir.join(name), &record)?;
        out.records.push(record);
    }
    if let Ok(summary) = crate::record::read::<SummaryDocument>(&inner.join("summary.json")) {
        out.failures = summary.failures;
        out.retried = summary.retried_boots;
    } else if let Some(kept) = checkpoint::manifest_in(results) {
        // A host that stopped half-way: its last checkpoint's account.
        out.failures = kept.failures;
        out.retried = kept.retried_boots;
    } else {
        warn!("the nested host's run has no summary.json");
    }
    out.records.sort_by_key(|r| r.boot_seq);
    Ok(out)
}

/// An inner record as the outer run's: its accelerator, its run and run
/// conditions, and how many vCPUs could run at once on this host (the
/// inner run saw the emulated host's cores; the guest's vCPUs ran on
/// this host's).
fn restamp(record: &mut ResultRecord, stamp: &RunStamp) {
    record.accel = Accel::Nested;
    record.run = stamp.run.clone();
    record.run_conditions = Some(stamp.conditions.clone());
    record.parallelism = match (&stamp.conditions.parallelism, &record.machine) {
        (Some(h), Some(m)) => Some(h.with_vcpus(m.vcpus)),
        _ => None,
    };
}

/// The inner run's record files (every JSON but its run and summary
/// documents), by name.
fn record_files(dir: &Path) -> Result<Vec<PathBuf>, MergeError> {
    let entries = std::fs::read_dir(dir).map_err(|source| MergeError::Read {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut files: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .filter(|p| {
            !matches!(
                p.file_name().and_then(|n| n.to_str()),
                Some("run.json" | "summary.json")
            )
        })
        .collect();
    files.sort();
    Ok(files)
}

/// The inner boots' console logs, beside the host's.
fn copy_consoles(from: &Path, to: &Path) -> Result<(), MergeError> {
    let Ok(entries) = std::fs::read_dir(from) else {
        return Ok(());
    };
    for e in entries.flatten() {
        copy_if_there(&e.path(), &to.join(e.file_name()))?;
    }
    Ok(())
}

fn copy_if_there(from: &Path, to: &Path) -> Result<(), MergeError> {
    if !from.is_file() {
        return Ok(());
    }
    std::fs::copy(from, to)
        .map(|_| ())
        .map_err(|source| MergeError::Copy {
            path: from.to_path_buf(),
            source,
        })
}

/// The host's kernel symbols (its `/proc/kallsyms`, modules included).
fn host_symbols(results: &Path) -> Option<Arc<SymbolMap>> {
    let p = results.join(KALLSYMS);
    match SymbolMap::read(&p) {
        Ok(m) => Some(Arc::new(m)),
        Err(e) => {
            warn!("no host symbols: {e}");
            None
        }
    }
}

/// How a nested run's instruction windows are taken (recorded in the
/// records' `window.method`).
pub(crate) const NESTED_WINDOW: &str = "outer plugin counters at the inner lab's relayed \
     BLKLAB-SYNC begin and end (the guest waiting on its console, the host's lab on the \
     outer lab's answer): the variant's fio run including its start-up and exit; level 2 \
     (code in the guest's RAM: the host's huge pages on its NUMA node 1) is the guest, level 1 \
     the host";

/// The window's counts in `record`: the guest's instructions (level 2,
/// against its System.map) and the host's (level 1, against its
/// kallsyms).
fn attach_counts(
    record: &mut ResultRecord,
    window: &Dump,
    guest_map: Option<Arc<SymbolMap>>,
    host_map: Option<&Arc<SymbolMap>>,
) {
    if !window.levels_trusted() {
        warn!(
            "{} {}/{} #{}: the plugin's level split is inconsistent ({} VMRUNs, {} returns, \
             {} blocks seen at both levels)",
            record.kernel,
            record.scenario,
            record.variant,
            record.iteration,
            window.vmruns(),
            window.returns(),
            window.mixed
        );
    }
    let ios = crate::record::metrics::ios(record);
    // A nested host never runs under -icount (the run refuses it).
    let how = InsnsWindow::of(
        NESTED_WINDOW,
        false,
        window.cut,
        window.reruns,
        window.cut_unavailable.as_deref(),
    );
    if let Some(map) = guest_map {
        let cs = record.guest.context_switches.map(|n| n as f64);
        let p = plugin::profile(&window.level2, &map);
        let mut i = plugin::record(&p, ios, cs, &how);
        // The nested guest's: at level 2 each of them is a real #VMEXIT to
        // the host's KVM (its MMIO stores fault before they are made: not
        // seen here). Its notify areas are the host QEMU's, not known here.
        i.exits = Some(plugin::exits_record(
            &window.level2,
            window.exits_unavailable.as_deref(),
            &map,
            &[],
            ios,
        ));
        record.instructions = Some(i);
    }
    if let Some(map) = host_map {
        let p = plugin::profile(&window.level1, map);
        let mut host = plugin::host_record(&p, window, ios, &how);
        host.split = window.tasks.as_ref().map(|t| {
            let pid = |c: Option<&ProcessCpu>| c.map(|c| i64::from(c.pid));
            let procs = HostProcesses {
                vmm: record.host.as_ref().and_then(|h| pid(h.qemu.as_ref())),
                lab: record.host.as_ref().and_then(|h| pid(h.blklab.as_ref())),
            };
            host_split::split(t, procs, ios)
        });
        record.host_instructions = Some(host);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::result::test_record;
    use serde_json::json;

    #[test]
    fn a_restamped_record_has_the_outer_runs_cores_with_its_vcpus() {
        let machine = json!({"vcpus": 4, "memory": "1G", "disks": 1, "num_queues": 4,
                             "queue_size": 256});
        // The inner run saw the emulated host's 5 vCPUs as its cores.
        let inner = json!({"host_cores_usable": 5, "vcpu_threads": "per_vcpu", "vcpus": 4,
                           "vcpus_at_once": 4});
        let mut record = test_record(json!({"machine": machine, "parallelism": inner}));
        let conditions = serde_json::from_value(json!({
            "accel_reason": "forced", "deterministic": false, "count_insns": false,
            "qemu_version": null, "blklab_version": "0", "git_commit": "c",
            "parallelism": {"cores_online": 2, "cores_usable": 2, "vcpu_threads": "per_vcpu"}
        }))
        .unwrap();
        let stamp = RunStamp {
            run: None,
            conditions,
        };
        restamp(&mut record, &stamp);
        assert_eq!(record.accel, Accel::Nested);
        let p = record.parallelism.unwrap();
        assert_eq!(
            (p.vcpus, p.host_cores_usable, p.vcpus_at_once),
            (4, Some(2), Some(2))
        );
    }
}
