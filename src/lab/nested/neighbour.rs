//! A second VM beside the lab's guests in the nested host
//! (`--nested-neighbour`): what a host shared with other VMs looks like to
//! the lab's KVM accounting. It boots the first guest kernel without an
//! initramfs, so the kernel panics at its root mount and reboots a second
//! later, forever: firmware, decompression and early boot over and over,
//! exits of every kind (port I/O, MSRs, CPUID, nested page faults, halts).
//! Its own KVM statistics over its QMP socket, from its start to the inner
//! run's end, go into the results as [`NEIGHBOUR_FILE`], so a test can see
//! that it ran, and how much, while the lab counted its own guests.

use std::path::{Path, PathBuf};

use serde::Serialize;
use thiserror::Error;

use crate::lab::guest::qemu::{Guest, QemuError};
use crate::lab::measure::kvm_qmp_stats::{KvmSampler, KvmStatsError};
use crate::record::kvm::KvmWindow;

/// The neighbour's RAM, MiB (the host makes room for it and QEMU's own).
const NEIGHBOUR_RAM_MIB: u64 = 256;

/// What the host adds to its memory for a neighbour: its RAM and QEMU's.
pub(crate) const NEIGHBOUR_MIB: u64 = NEIGHBOUR_RAM_MIB + 128;

/// In the results: the neighbour's command line and KVM window.
pub(crate) const NEIGHBOUR_FILE: &str = "neighbour.json";

/// The neighbour's kernel command line: a panic at the root mount (no
/// initramfs, no root device), a reboot a second later, a quiet console.
const NEIGHBOUR_APPEND: &str = "console=ttyS0 loglevel=0 panic=1";

#[derive(Debug, Error)]
pub enum NeighbourError {
    #[error("the neighbour VM: {0}")]
    Qemu(#[from] QemuError),
    #[error("the neighbour VM's KVM statistics: {0}")]
    Stats(#[from] KvmStatsError),
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What [`NEIGHBOUR_FILE`] holds.
#[derive(Debug, Serialize)]
struct NeighbourReport {
    qemu_command_line: Vec<String>,
    /// KVM's statistics of the neighbour's vCPU from its first sample to
    /// the end of the inner run (its exits by reason too, where the host
    /// can count them).
    kvm: Option<KvmWindow>,
}

/// The running neighbour: its QEMU and its statistics since it started.
pub(crate) struct Neighbour {
    guest: Guest,
    args: Vec<String>,
    sampler: KvmSampler,
}

impl Neighbour {
    /// Boot `kernel` under KVM with `qemu`, its console into `results`,
    /// and take its statistics' first sample.
    pub(crate) fn start(
        qemu: &str,
        kernel: &Path,
        results: &Path,
    ) -> Result<Neighbour, NeighbourError> {
        // The socket stays out of the results, which go out as a tar.
        let qmp = std::env::temp_dir().join(format!("blklab-neighbour-{}.qmp", std::process::id()));
        let args = neighbour_args(kernel, &qmp);
        let console = results.join("neighbour.console");
        let guest = Guest::spawn_args(qemu, &args, Some(&console))?;
        let mut sampler = KvmSampler::new(qmp);
        sampler.begin()?;
        log::info!("neighbour VM started (pid {})", guest.pid());
        let mut args = args;
        args.insert(0, qemu.to_string());
        Ok(Neighbour {
            guest,
            args,
            sampler,
        })
    }

    /// Its statistics since the start into `results`/[`NEIGHBOUR_FILE`];
    /// QEMU is killed when `self` goes.
    pub(crate) fn finish(mut self, results: &Path) -> Result<(), NeighbourError> {
        let kvm = self.sampler.end()?;
        if let Some(exits) = kvm.as_ref().and_then(|w| w.counters.get("exits")) {
            log::info!(
                "neighbour VM (pid {}): {exits} KVM exits during the run",
                self.guest.pid()
            );
        }
        let report = NeighbourReport {
            qemu_command_line: self.args.clone(),
            kvm,
        };
        let path = results.join(NEIGHBOUR_FILE);
        let json = serde_json::to_vec_pretty(&report).expect("a neighbour report serialises");
        std::fs::write(&path, json).map_err(|source| NeighbourError::Write { path, source })
    }
}

/// The neighbour's QEMU command line: one vCPU under KVM, rebooting (no
/// `-no-reboot`), its console on stdout, a QMP socket at `qmp`.
fn neighbour_args(kernel: &Path, qmp: &Path) -> Vec<String> {
    let qmp = format!("unix:{},server=on,wait=off", qmp.display());
    let mem = format!("{NEIGHBOUR_RAM_MIB}M");
    let kernel = kernel.display().to_string();
    [
        "-accel",
        "kvm",
        "-cpu",
        "host",
        "-name",
        "blklab-neighbour,debug-threads=on",
        "-smp",
        "1",
        "-m",
        &mem,
        "-display",
        "none",
        "-serial",
        "stdio",
        "-monitor",
        "none",
        "-nic",
        "none",
        "-kernel",
        &kernel,
        "-append",
        NEIGHBOUR_APPEND,
        "-qmp",
        &qmp,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_neighbour_reboots_under_kvm_with_its_own_qmp_socket() {
        let a = neighbour_args(Path::new("/k/vmlinuz"), Path::new("/r/n.qmp"));
        let s = a.join(" ");
        assert!(s.starts_with("-accel kvm -cpu host"), "{s}");
        assert!(
            !a.iter().any(|x| x == "-no-reboot" || x == "-initrd"),
            "{s}"
        );
        assert!(
            s.contains("-append console=ttyS0 loglevel=0 panic=1"),
            "{s}"
        );
        assert!(s.ends_with("-qmp unix:/r/n.qmp,server=on,wait=off"), "{s}");
    }
}
