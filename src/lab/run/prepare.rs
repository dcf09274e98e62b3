//! The lab a run boots in, prepared: QEMU (the host's, or an imported
//! bundle's), the output directory (and the log copied into it), the
//! guests' images, the accelerator and, to count instructions, the plugin
//! (a bundle's own with its QEMU) and each kernel's System.map.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use log::{info, warn};

use crate::lab::guest::accel::decide_accel;
use crate::lab::guest::qemu::{self, Accel};
use crate::lab::images::bundle::{choose_qemu, ChosenQemu};
use crate::lab::images::nested_host::{prepare_nested_host, NestedHostImage};
use crate::lab::images::{self, cache, PreparedGuest};
use crate::lab::measure::plugin::{self, SymbolMap};
use crate::lab::options::CountInsns;
use crate::lab::run::error::RunError;
use crate::lab::run::plan::{self as run_plan, Plan};
use crate::lab::run::request::RunRequest;
use crate::util::wallclock::utc_stamp;

/// The lab a run boots in: QEMU, the output directory, the prepared
/// guests, the accelerator and, with instruction counts, the plugin and
/// each kernel's System.map.
pub(crate) struct Lab {
    pub(crate) qemu: String,
    pub(crate) out_dir: PathBuf,
    pub(crate) guests: Vec<PreparedGuest>,
    pub(crate) accel: Accel,
    pub(crate) accel_reason: String,
    pub(crate) plugin: Option<PathBuf>,
    /// By kernel; `Some` when instructions are counted.
    pub(crate) maps: Vec<Option<Arc<SymbolMap>>>,
    /// `--accel nested`: the emulated host the guests boot in.
    pub(crate) nested_host: Option<NestedHostImage>,
}

/// Find QEMU, make the output directory, prepare the guests' images (or
/// take the `given` ones), choose the accelerator and, to count
/// instructions, build the plugin and read each kernel's System.map.
pub(crate) fn prepare_lab(
    request: &RunRequest,
    plan: &Plan,
    given: Option<Vec<PreparedGuest>>,
) -> Result<Lab, RunError> {
    let chosen = choose_qemu(
        &request.options.guest.qemu,
        &cache::dir(request.options.place.cache.get()),
    )?;
    if chosen.bundle.is_some() && request.options.guest.accel == Accel::Nested {
        return Err(RunError::NestedWithBundle { qemu: chosen.path });
    }
    let qemu = chosen.path.display().to_string();
    let out_dir = request
        .options
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("blklab-results").join(utc_stamp()));
    refuse_earlier_records(&out_dir)?;
    for d in [out_dir.clone(), out_dir.join("console")] {
        std::fs::create_dir_all(&d).map_err(|source| RunError::Write { path: d, source })?;
    }
    log_to_results(&out_dir);
    if let Some(note) = chosen.note() {
        info!("{note}");
    }
    let guests = match given {
        Some(guests) => guests,
        None => {
            info!("preparing {} guest image(s)", request.options.kernels.len());
            images::prepare(
                &request.lab_dir,
                request.options.place.cache.get(),
                &request.options.kernels,
            )?
        }
    };
    let prepared = labels(&guests);
    if prepared != plan.labels {
        return Err(RunError::LabelMismatch {
            prepared,
            planned: plan.labels.clone(),
        });
    }
    let (accel, accel_reason, plugin) = choose_accel(request, &chosen, &guests)?;
    let maps = symbol_maps(&guests, plugin.is_some())?;
    info!("accelerator: {} ({accel_reason})", accel.describe());
    let most_vcpus = request.units.iter().map(|u| u.settings.machine.vcpus).max();
    if plugin.is_some() && request.options.guest.deterministic && most_vcpus.is_some_and(|n| n > 1)
    {
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
                &request.lab_dir,
                request.options.place.cache.get(),
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
    request: &RunRequest,
    chosen: &ChosenQemu,
    guests: &[PreparedGuest],
) -> Result<(Accel, String, Option<PathBuf>), RunError> {
    let guest = &request.options.guest;
    let qemu = &chosen.path.display().to_string();
    let decision = decide_accel(
        guest.accel,
        guest.count_insns,
        guest.deterministic,
        &crate::util::kvm_host::classify(),
        || {
            qemu::probe_kvm(
                qemu,
                &guests[0].kernel,
                &guests[0].initramfs,
                request.options.timeouts.kvm_probe,
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
        match plugin_for(request, chosen) {
            Ok(p) => Some(p),
            Err(e) if guest.count_insns != CountInsns::On => {
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

/// The instruction-count plugin for the chosen QEMU: a bundle's own, or
/// built (or found in the cache) for the host's.
fn plugin_for(request: &RunRequest, chosen: &ChosenQemu) -> Result<PathBuf, plugin::InsnsError> {
    if let Some(b) = &chosen.bundle {
        info!(
            "instruction-count plugin: the bundle's, {}",
            b.plugin.display()
        );
        return Ok(b.plugin.clone());
    }
    let qemu = chosen.path.display().to_string();
    info!("building the instruction-count plugin for {qemu}");
    plugin::build_plugin(&request.lab_dir, request.options.place.cache.get(), &qemu)
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

#[cfg(test)]
mod tests {
    use super::*;

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
