//! What a nested host keeps of its finished boots while it runs, so that a
//! host that stops half-way loses only the boot it was in.
//!
//! After each boot the inner lab writes a tar of its results so far (the
//! records, the boots' consoles, its log, the host's kallsyms) and a
//! [`Manifest`] of the boots it finished to the results disk, in the
//! second half the end-of-run tar never reaches. Two slots take turns, so a
//! write cut short leaves the one before whole; each is a header sector
//! ([`HEADER`], the sequence number, the length and the SHA-256 of the tar)
//! and the tar after it. The header is written after the tar, each
//! followed by a flush: a header names only a tar already on the disk, and
//! the outer lab takes the newest slot whose tar matches its digest.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use thiserror::Error;

use crate::record::summary::RetriedBoot;

/// A slot header's first line.
const HEADER: &str = "BLKLAB-CHECKPOINT 1";
/// A header's sector.
const SECTOR: u64 = 512;
/// Where the slots start on the results disk (its first half is the
/// end-of-run tar's), and each slot's size.
const SLOTS_AT: u64 = 1 << 30;
const SLOT_BYTES: u64 = 512 << 20;
/// The manifest's name in a checkpoint's tar.
pub(crate) const MANIFEST: &str = "checkpoint.json";

#[derive(Debug, Error)]
pub enum CheckpointError {
    #[error("cannot write a checkpoint to {}: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("a checkpoint of {len} bytes does not fit a slot of {SLOT_BYTES}")]
    TooLarge { len: u64 },
    #[error("cannot read the checkpoints on {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What a checkpoint says of the inner run so far.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Manifest {
    /// The plan's boots (their sequence numbers) this host finished.
    pub(crate) boots_done: Vec<usize>,
    /// The summary's failures and retried boots so far.
    pub(crate) failures: Vec<String>,
    pub(crate) retried_boots: Vec<RetriedBoot>,
}

/// A slot's header.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct SlotHeader {
    seq: u64,
    len: u64,
    sha256: String,
}

fn digest(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn slot_offset(seq: u64) -> u64 {
    SLOTS_AT + (seq % 2) * SLOT_BYTES
}

/// Write checkpoint `seq` (a tar) to the results disk `disk`.
pub(crate) fn write(disk: &Path, seq: u64, tar: &[u8]) -> Result<(), CheckpointError> {
    let len = tar.len() as u64;
    if len > SLOT_BYTES - SECTOR {
        return Err(CheckpointError::TooLarge { len });
    }
    let err = |source| CheckpointError::Write {
        path: disk.to_path_buf(),
        source,
    };
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(disk)
        .map_err(err)?;
    let at = slot_offset(seq);
    f.write_all_at(tar, at + SECTOR).map_err(err)?;
    f.sync_data().map_err(err)?;
    let header = SlotHeader {
        seq,
        len,
        sha256: digest(tar),
    };
    let mut sector = format!(
        "{HEADER}\n{}\n",
        serde_json::to_string(&header).expect("a header serialises")
    )
    .into_bytes();
    sector.resize(SECTOR as usize, 0);
    f.write_all_at(&sector, at).map_err(err)?;
    f.sync_data().map_err(err)
}

/// The newest whole checkpoint on the results disk `disk`, when any.
pub(crate) fn read_newest(disk: &Path) -> Result<Option<Vec<u8>>, CheckpointError> {
    let err = |source| CheckpointError::Read {
        path: disk.to_path_buf(),
        source,
    };
    let f = File::open(disk).map_err(err)?;
    let size = f.metadata().map_err(err)?.len();
    let mut best: Option<(u64, Vec<u8>)> = None;
    for slot in 0..2 {
        let at = slot_offset(slot);
        if at + SECTOR > size {
            continue;
        }
        let Some(h) = read_header(&f, at).map_err(err)? else {
            continue;
        };
        if h.len > SLOT_BYTES - SECTOR || at + SECTOR + h.len > size {
            continue;
        }
        if best.as_ref().is_some_and(|(seq, _)| *seq >= h.seq) {
            continue;
        }
        let mut tar = vec![0; h.len as usize];
        f.read_exact_at(&mut tar, at + SECTOR).map_err(err)?;
        if digest(&tar) == h.sha256 {
            best = Some((h.seq, tar));
        }
    }
    Ok(best.map(|(_, tar)| tar))
}

/// The header at `at`, when the sector holds one.
fn read_header(f: &File, at: u64) -> std::io::Result<Option<SlotHeader>> {
    let mut sector = vec![0; SECTOR as usize];
    f.read_exact_at(&mut sector, at)?;
    let text = String::from_utf8_lossy(&sector);
    let mut lines = text.trim_end_matches('\0').lines();
    if lines.next() != Some(HEADER) {
        return Ok(None);
    }
    Ok(lines.next().and_then(|l| serde_json::from_str(l).ok()))
}

/// A tar of the directory `dir` (but `skip`, a file a writer may still be
/// growing) with `manifest` added as [`MANIFEST`]. Each file is read whole
/// before its header is written, so a file written to meanwhile is taken
/// as it was at that read, never torn.
pub(crate) fn tar_of(dir: &Path, skip: &[&str], manifest: &Manifest) -> std::io::Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    add_tree(&mut b, dir, Path::new(""), skip)?;
    let json = serde_json::to_vec_pretty(manifest).expect("a manifest serialises");
    append_bytes(&mut b, Path::new(MANIFEST), &json)?;
    b.into_inner()
}

fn add_tree(
    b: &mut tar::Builder<Vec<u8>>,
    dir: &Path,
    rel: &Path,
    skip: &[&str],
) -> std::io::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.flatten().collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let name = rel.join(e.file_name());
        let kind = e.file_type()?;
        if kind.is_dir() {
            add_tree(b, &e.path(), &name, skip)?;
        } else if kind.is_file() && !skip.iter().any(|s| Path::new(s) == name) {
            let bytes = std::fs::read(e.path())?;
            append_bytes(b, &name, &bytes)?;
        }
    }
    Ok(())
}

fn append_bytes(b: &mut tar::Builder<Vec<u8>>, name: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut h = tar::Header::new_gnu();
    h.set_size(bytes.len() as u64);
    h.set_mode(0o644);
    h.set_cksum();
    b.append_data(&mut h, name, bytes)
}

/// The manifest of an unpacked checkpoint in `dir`, when it has one.
pub(crate) fn manifest_in(dir: &Path) -> Option<Manifest> {
    let mut text = String::new();
    File::open(dir.join(MANIFEST))
        .and_then(|mut f| f.read_to_string(&mut text))
        .ok()?;
    serde_json::from_str(&text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disk(dir: &Path) -> PathBuf {
        let p = dir.join("results.img");
        let f = File::create(&p).unwrap();
        f.set_len(2 << 30).unwrap();
        p
    }

    #[test]
    fn the_newest_whole_checkpoint_is_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let d = disk(dir.path());
        assert_eq!(read_newest(&d).unwrap(), None, "an untouched disk");
        write(&d, 1, b"first").unwrap();
        assert_eq!(read_newest(&d).unwrap().as_deref(), Some(&b"first"[..]));
        write(&d, 2, b"second").unwrap();
        assert_eq!(read_newest(&d).unwrap().as_deref(), Some(&b"second"[..]));
        write(&d, 3, b"third!").unwrap();
        assert_eq!(read_newest(&d).unwrap().as_deref(), Some(&b"third!"[..]));
    }

    #[test]
    fn a_write_cut_short_leaves_the_checkpoint_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let d = disk(dir.path());
        write(&d, 1, b"kept").unwrap();
        write(&d, 2, b"older").unwrap();
        // Checkpoint 3 reuses slot 1: its tar is written, the host stops
        // before its header; the old header no longer matches the bytes.
        let f = std::fs::OpenOptions::new().write(true).open(&d).unwrap();
        f.write_all_at(b"newer", slot_offset(3) + SECTOR).unwrap();
        assert_eq!(read_newest(&d).unwrap().as_deref(), Some(&b"older"[..]));
        // A torn header is no header.
        f.write_all_at(b"BLKLAB-CHECKPOINT 1\n{\"seq\":", slot_offset(2))
            .unwrap();
        assert_eq!(read_newest(&d).unwrap().as_deref(), Some(&b"older"[..]));
        let mut zeros = vec![0u8; SECTOR as usize];
        f.write_all_at(&zeros, slot_offset(2)).unwrap();
        zeros[..4].copy_from_slice(b"junk");
        f.write_all_at(&zeros, slot_offset(1)).unwrap();
        assert_eq!(read_newest(&d).unwrap(), None);
    }

    #[test]
    fn a_checkpoint_carries_the_directory_and_its_manifest() {
        let dir = tempfile::tempdir().unwrap();
        let results = dir.path().join("results");
        std::fs::create_dir_all(results.join("out")).unwrap();
        std::fs::write(results.join("out/a.json"), b"{}").unwrap();
        std::fs::write(results.join("blklab.log"), b"growing").unwrap();
        let m = Manifest {
            boots_done: vec![0, 1],
            failures: vec!["x".into()],
            retried_boots: Vec::new(),
        };
        let tar = tar_of(&results, &["blklab.log"], &m).unwrap();
        let d = disk(dir.path());
        write(&d, 1, &tar).unwrap();
        let back = read_newest(&d).unwrap().unwrap();
        let into = dir.path().join("back");
        crate::lab::nested::transfer::unpack_tar(&back[..], &d, &into).unwrap();
        assert_eq!(std::fs::read(into.join("out/a.json")).unwrap(), b"{}");
        assert_eq!(manifest_in(&into), Some(m));
        assert!(!into.join("blklab.log").exists());
        let e = write(&d, 1, &vec![0; SLOT_BYTES as usize]).unwrap_err();
        assert!(matches!(e, CheckpointError::TooLarge { .. }), "{e}");
    }
}
