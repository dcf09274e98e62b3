//! What a nested run hands the emulated host and what it gets back.
//!
//! In: a tar on a read-only virtio disk (serial `blklab-run`), unpacked by
//! the host's `/init` into `/lab/run`: the blklab binary, `inner.json`
//! (the inner lab's arguments and guests), the guests' kernels, initramfs
//! and manifests, and the scenarios. Out: the host's `/init` writes a tar
//! of `/results` (the inner run's directory, its log, the host's
//! `/proc/kallsyms`) raw onto a second disk (serial `blklab-results`); the
//! outer lab unpacks it after the host powered off.

use std::fs::File;
use std::io::Read;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::backend::qemu_args::GuestRam;
use crate::lab::images::KernelSpec;
use crate::lab::images::PreparedGuest;
use crate::lab::location::{CacheOption, LabDirOption, LabLocation};
use crate::lab::options::{CountInsns, GuestOptions, NestedOptions, RunOptions};

/// Where the host's `/init` unpacks the run disk.
pub(crate) const RUN_ROOT: &str = "/lab/run";
/// The results disk's serial (`/sys/block/vdX/serial` in the host).
pub(crate) const RESULTS_SERIAL: &str = "blklab-results";
/// Where the inner lab writes what comes back out.
pub(crate) const RESULTS_ROOT: &str = "/results";
/// In the results: the host's kernel symbols, as the outer lab reads them.
pub(crate) const KALLSYMS: &str = "kallsyms";
/// In the results: the inner run's error, when it failed.
pub(crate) const ERROR_FILE: &str = "error.txt";
/// The results disk's size: a sparse file, only what the host writes is
/// stored.
pub(crate) const RESULTS_DISK_BYTES: u64 = 2 << 30;

/// `inner.json`: what `blklab nested-inner` runs: the outer run's
/// options, set for KVM inside the host, and the guests the outer lab
/// prepared (their files on the run disk).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct InnerRun {
    pub(crate) options: RunOptions,
    pub(crate) guests: Vec<PreparedGuest>,
    /// Boot a second VM beside the lab's guests for the whole run.
    #[serde(default)]
    pub(crate) neighbour: bool,
    /// The plan's boots an earlier host finished (their records are out
    /// already): not run again.
    #[serde(default)]
    pub(crate) skip_boots: Vec<usize>,
    /// Fault injection for the lab's own tests: after checkpointing this
    /// boot, stop every process in the host, which then sits idle and
    /// silent as a host that stopped taking interrupts does.
    #[serde(default)]
    pub(crate) silence_after_boot: Option<usize>,
    /// Fault injection for the lab's own tests: after checkpointing this
    /// boot, put a kernel soft-lockup report on the host's console, then
    /// stop every process in the host as [`Self::silence_after_boot`]
    /// does.
    #[serde(default)]
    pub(crate) stall_report_after_boot: Option<usize>,
    /// The outer plugin splits the host's instructions by task: say where
    /// the host's kernel keeps what names one (the relay's `tasks` line)
    /// before the first boot.
    #[serde(default)]
    pub(crate) name_tasks: bool,
}

impl InnerRun {
    /// The inner run of the outer `options` over `guests`, whose files are
    /// (or will be) on the run disk under `guests/I/` for I = `dirs[k]`.
    /// `levels_by_address`: the outer plugin tells the guest's code from
    /// the host's by where it runs, so the guests' RAM must be the host's
    /// huge pages; otherwise it is memfd RAM, as on a user's host.
    pub(crate) fn new(
        options: &RunOptions,
        guests: &[PreparedGuest],
        dirs: &[usize],
        levels_by_address: bool,
    ) -> InnerRun {
        let at = |i: usize, file: &str| PathBuf::from(format!("{RUN_ROOT}/guests/{i}/{file}"));
        let guests: Vec<PreparedGuest> = guests
            .iter()
            .zip(dirs)
            .map(|(g, &i)| PreparedGuest {
                spec: g.spec.clone(),
                name: g.name.clone(),
                kernel: at(i, "vmlinuz"),
                initramfs: at(i, "initramfs"),
                kernel_manifest: g.kernel_manifest.as_ref().map(|_| at(i, "kernel.json")),
                initramfs_manifest: g
                    .initramfs_manifest
                    .as_ref()
                    .map(|_| at(i, "initramfs.json")),
            })
            .collect();
        let mut a = options.clone();
        // The same labels inside: each kernel by its prepared name.
        a.kernels = guests
            .iter()
            .map(|g| KernelSpec::Path {
                kernel: g.kernel.clone(),
                modules: None,
                map: None,
                name: Some(g.name.clone()),
            })
            .collect();
        let timeouts = &mut a.timeouts;
        // The probe is a guest boot, and boots in the emulated host take
        // several times as long as on hardware: give it a boot's time.
        timeouts.kvm_probe = timeouts.kvm_probe.max(timeouts.boot);
        a.guest = GuestOptions {
            // As on a KVM host: the real KVM probe decides, or --accel kvm
            // is forced; the inner lab refuses to go on without KVM.
            accel: options.nested.inner_accel.accel(),
            qemu: "qemu-system-x86_64".into(),
            count_insns: CountInsns::Off,
            append: a.guest.append,
            deterministic: false,
            ram: if levels_by_address {
                GuestRam::HugeMemfd
            } else {
                GuestRam::Memfd
            },
        };
        a.nested = NestedOptions::default();
        a.out = Some(PathBuf::from(RESULTS_ROOT).join("out"));
        a.place = LabLocation {
            cache: CacheOption {
                cache: Some(PathBuf::from("/tmp/blklab-cache")),
            },
            lab_dir: LabDirOption {
                lab_dir: Some(PathBuf::from(RUN_ROOT).join("lab")),
            },
        };
        a.progress = false;
        a.plan_only = false;
        InnerRun {
            options: a,
            guests,
            neighbour: options.nested.neighbour,
            skip_boots: Vec::new(),
            silence_after_boot: None,
            stall_report_after_boot: None,
            name_tasks: false,
        }
    }
}

#[derive(Debug, Error)]
pub enum TransferError {
    #[error("cannot write the nested host's run disk {}: {source}", path.display())]
    RunDisk {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot add {} to the nested host's run disk: {source}", from.display())]
    Add {
        from: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot make the results disk {}: {source}", path.display())]
    ResultsDisk {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the nested host's results disk {} holds no tar (did the host finish?): {source}", path.display())]
    Unpack {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the nested host's results hold an unsafe path {0:?}")]
    UnsafePath(PathBuf),
}

/// The run disk being written: a tar whose paths are relative to
/// [`RUN_ROOT`].
pub(crate) struct RunDisk {
    path: PathBuf,
    tar: tar::Builder<File>,
}

impl RunDisk {
    pub(crate) fn create(path: &Path) -> Result<RunDisk, TransferError> {
        let f = File::create(path).map_err(|source| TransferError::RunDisk {
            path: path.to_path_buf(),
            source,
        })?;
        let mut tar = tar::Builder::new(f);
        tar.follow_symlinks(true);
        // busybox tar in the host reads no GNU sparse entries.
        tar.sparse(false);
        Ok(RunDisk {
            path: path.to_path_buf(),
            tar,
        })
    }

    /// Add the file `from` as `name` (its mode kept).
    pub(crate) fn add_file(&mut self, from: &Path, name: &str) -> Result<(), TransferError> {
        self.tar
            .append_path_with_name(from, name)
            .map_err(|source| TransferError::Add {
                from: from.to_path_buf(),
                source,
            })
    }

    /// Add `bytes` as the file `name`.
    pub(crate) fn add_bytes(&mut self, name: &str, bytes: &[u8]) -> Result<(), TransferError> {
        let mut h = tar::Header::new_gnu();
        h.set_size(bytes.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        self.tar
            .append_data(&mut h, name, bytes)
            .map_err(|source| TransferError::RunDisk {
                path: self.path.clone(),
                source,
            })
    }

    /// Finish the tar and pad it to whole 512-byte sectors.
    pub(crate) fn finish(self) -> Result<PathBuf, TransferError> {
        let err = |source| TransferError::RunDisk {
            path: self.path.clone(),
            source,
        };
        let f = self.tar.into_inner().map_err(err)?;
        let len = f.metadata().map_err(err)?.len();
        f.set_len(len.div_ceil(512) * 512).map_err(err)?;
        Ok(self.path)
    }
}

/// A sparse, zeroed results disk of `bytes`.
pub(crate) fn results_disk(path: &Path, bytes: u64) -> Result<(), TransferError> {
    let err = |source| TransferError::ResultsDisk {
        path: path.to_path_buf(),
        source,
    };
    let f = File::create(path).map_err(err)?;
    f.set_len(bytes).map_err(err)
}

/// Unpack the results disk's tar into `into`, refusing absolute paths and
/// `..` (the host is not trusted to write only below its results).
pub(crate) fn unpack_results(disk: &Path, into: &Path) -> Result<(), TransferError> {
    let f = File::open(disk).map_err(|source| TransferError::Unpack {
        path: disk.to_path_buf(),
        source,
    })?;
    unpack_tar(f, disk, into)
}

/// Unpack the tar `from` (read from `origin`, for errors) into `into`, as
/// [`unpack_results`].
pub(crate) fn unpack_tar(from: impl Read, origin: &Path, into: &Path) -> Result<(), TransferError> {
    let unpack = |source| TransferError::Unpack {
        path: origin.to_path_buf(),
        source,
    };
    let mut archive = tar::Archive::new(from);
    std::fs::create_dir_all(into).map_err(unpack)?;
    let mut any = false;
    for entry in archive.entries().map_err(unpack)? {
        let mut entry = entry.map_err(unpack)?;
        let path = entry.path().map_err(unpack)?.into_owned();
        let safe = path
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
        if !safe {
            return Err(TransferError::UnsafePath(path));
        }
        let kind = entry.header().entry_type();
        if !(kind.is_file() || kind.is_dir()) {
            continue;
        }
        entry.unpack_in(into).map_err(unpack)?;
        any = true;
    }
    if !any {
        return Err(unpack(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "an empty archive",
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab::guest::qemu::Accel;

    #[test]
    fn the_inner_run_keeps_the_plan_and_runs_under_kvm_inside() {
        let options = crate::lab::options::RunArgs::from_flags(&[
            "--accel",
            "nested",
            "--kernel",
            "build:6.12",
            "--kernel",
            "build:6.12",
            "--scenario",
            "smoke",
            "--iterations",
            "2",
            "--deterministic",
            "--runtime",
            "3",
            "--cache",
            "/outer/cache",
            "--shard",
            "1/2",
        ])
        .to_options()
        .unwrap();
        let g = PreparedGuest {
            spec: "build:6.12".into(),
            name: "6.12".into(),
            kernel: "/cache/k/vmlinuz".into(),
            initramfs: "/cache/i.cpio.gz".into(),
            kernel_manifest: Some("/cache/k/manifest.json".into()),
            initramfs_manifest: None,
        };
        let inner = InnerRun::new(&options, &[g.clone(), g.clone()], &[0, 0], true);
        // What the inner lab reads back.
        let text = serde_json::to_string(&inner).unwrap();
        let inner: InnerRun = serde_json::from_str(&text).unwrap();
        let a = &inner.options;
        let kernels: Vec<String> = a.kernels.iter().map(|k| k.to_prepare_arg()).collect();
        assert_eq!(
            kernels,
            vec![
                "path:/lab/run/guests/0/vmlinuz,name=6.12",
                "path:/lab/run/guests/0/vmlinuz,name=6.12"
            ]
        );
        assert_eq!(a.guest.accel, Accel::Auto);
        assert_eq!(a.guest.count_insns, CountInsns::Off);
        assert_eq!(a.guest.ram, GuestRam::HugeMemfd);
        assert!(!a.guest.deterministic && !a.progress && !a.plan_only);
        assert_eq!(a.out.as_deref(), Some(Path::new("/results/out")));
        assert_eq!(a.place.cache.get(), Some(Path::new("/tmp/blklab-cache")));
        assert_eq!(a.place.lab_dir.get(), Some(Path::new("/lab/run/lab")));
        assert_eq!(a.timeouts.kvm_probe, a.timeouts.boot);
        // What the plan is made of stays the outer run's.
        assert_eq!((a.iterations, a.fio.runtime), (2, Some(3)));
        assert_eq!(a.scenarios, vec!["smoke"]);
        assert_eq!(a.shard.map(|s| (s.index, s.count)), Some((1, 2)));
        let g0 = &inner.guests[0];
        assert_eq!(g0.spec, "build:6.12");
        assert_eq!(g0.initramfs, Path::new("/lab/run/guests/0/initramfs"));
        assert_eq!(
            g0.kernel_manifest.as_deref(),
            Some(Path::new("/lab/run/guests/0/kernel.json"))
        );
        assert_eq!(g0.initramfs_manifest, None);
        // It survives inner.json.
        let back: InnerRun = serde_json::from_str(&serde_json::to_string(&inner).unwrap()).unwrap();
        assert_eq!(back.options.kernels, a.kernels);
        assert!(!inner.neighbour);

        // Without the outer plugin: a user host's memfd RAM; the forced
        // accelerator and the neighbour handed in, the nested flags not.
        let mut options = options;
        options.nested = NestedOptions {
            inner_accel: crate::lab::options::InnerAccel::Kvm,
            neighbour: true,
            ..NestedOptions::default()
        };
        let inner = InnerRun::new(&options, &[g], &[0], false);
        let a = &inner.options;
        assert_eq!(a.guest.accel, Accel::Kvm);
        assert_eq!(a.guest.ram, GuestRam::Memfd);
        assert_eq!(a.nested, NestedOptions::default());
        assert!(inner.neighbour);
    }

    #[test]
    fn a_run_disk_is_a_sector_padded_tar_and_results_unpack_safely() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("tool");
        std::fs::write(&src, b"#!/bin/sh\n").unwrap();
        let mut d = RunDisk::create(&dir.path().join("run.tar")).unwrap();
        d.add_file(&src, "blklab").unwrap();
        d.add_bytes("inner.json", b"{}").unwrap();
        let disk = d.finish().unwrap();
        assert_eq!(std::fs::metadata(&disk).unwrap().len() % 512, 0);
        // The results disk: a tar at its start, zeros after it.
        let results = dir.path().join("results.img");
        results_disk(&results, 1 << 20).unwrap();
        {
            use std::io::Write;
            let tar_bytes = std::fs::read(&disk).unwrap();
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .open(&results)
                .unwrap();
            f.write_all(&tar_bytes).unwrap();
        }
        let out = dir.path().join("out");
        unpack_results(&results, &out).unwrap();
        assert_eq!(std::fs::read(out.join("inner.json")).unwrap(), b"{}");
        // An untouched (all-zero) disk is no results.
        let empty = dir.path().join("empty.img");
        results_disk(&empty, 1 << 20).unwrap();
        let e = unpack_results(&empty, &dir.path().join("o2")).unwrap_err();
        assert!(matches!(e, TransferError::Unpack { .. }), "{e:?}");
    }

    #[test]
    fn results_with_an_escaping_path_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let disk = dir.path().join("evil.tar");
        let mut b = tar::Builder::new(File::create(&disk).unwrap());
        let mut h = tar::Header::new_gnu();
        let data = b"x";
        h.set_size(1);
        h.set_mode(0o644);
        // tar's safe setters refuse "..": write the name bytes directly.
        let name = b"../escape";
        h.as_old_mut().name[..name.len()].copy_from_slice(name);
        h.set_cksum();
        b.append(&h, &data[..]).unwrap();
        b.into_inner().unwrap();
        let e = unpack_results(&disk, &dir.path().join("out")).unwrap_err();
        assert!(matches!(e, TransferError::UnsafePath(_)), "{e:?}");
        assert!(!dir.path().join("escape").exists());
    }
}
