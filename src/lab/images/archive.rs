//! `blklab images export` and `import`: an image archive is a plain tar
//! (its contents — bzImages, gzip'd initramfs, Debian's .ko.xz modules —
//! are compressed already) whose first member is `index.json`
//! ([`super::index`]), then every file the index names, under its path in
//! the cache.
//!
//! Import trusts nothing before it is checked: the index (format, version,
//! paths), then every member (a regular file the index names, once, with
//! its size and sha256), all of it into a staging directory inside the
//! cache that prepare.sh never looks at; only when every file is there and
//! right are the entries moved into place, each by one rename, under the
//! cache's lock.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use thiserror::Error;

use super::cache::{self, CacheError, Entry, Kind, QemuArtifacts, INITRAMFS_SUFFIXES};
use super::index::{EntryRecord, FileRecord, Index, IndexError, INDEX_NAME};
use super::lab_tree::Staged;
use super::SpecKey;

/// The largest index an import reads (a guard against a bogus archive).
const MAX_INDEX: u64 = 64 << 20;

#[derive(Debug, Error)]
pub enum ArchiveError {
    #[error(transparent)]
    Cache(#[from] CacheError),
    #[error("{archive}: {source}")]
    Index {
        archive: PathBuf,
        source: IndexError,
    },
    #[error("{archive}: not a blklab image archive: {why}")]
    NotAnArchive { archive: PathBuf, why: String },
    #[error("{archive}: member {member:?} is a {what}, not a regular file (refused: an archive holds files only)")]
    NotAFile {
        archive: PathBuf,
        member: String,
        what: String,
    },
    #[error("{archive}: member {member:?} is not in the index (refused)")]
    Unlisted { archive: PathBuf, member: String },
    #[error("{archive}: member {member:?} appears twice (refused)")]
    Twice { archive: PathBuf, member: String },
    #[error("{archive}: {member}: {what} does not match the index (the archive is damaged or was altered; nothing was imported)")]
    Mismatch {
        archive: PathBuf,
        member: String,
        what: &'static str,
    },
    #[error("{archive}: {member} is missing from the archive (nothing was imported)")]
    Missing { archive: PathBuf, member: String },
    #[error("{path} changed while it was exported ({what}); export again")]
    Changed { path: PathBuf, what: &'static str },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ArchiveError + '_ {
    move |source| ArchiveError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A reader that hashes and counts what passes through it.
struct Hashing<R> {
    inner: R,
    hash: Sha256,
    len: u64,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }
}

impl<R> Hashing<R> {
    fn new(inner: R) -> Self {
        Hashing {
            inner,
            hash: Sha256::new(),
            len: 0,
        }
    }
    fn hex(&self) -> String {
        self.hash
            .clone()
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

/// The record of the file `rel` of an entry whose files lie below `root`.
fn record(root: &Path, rel: &str) -> Result<FileRecord, ArchiveError> {
    use std::os::unix::fs::PermissionsExt;
    let path = root.join(rel);
    let f = std::fs::File::open(&path).map_err(io(&path))?;
    let executable = f.metadata().map_err(io(&path))?.permissions().mode() & 0o111 != 0;
    let mut h = Hashing::new(f);
    std::io::copy(&mut h, &mut std::io::sink()).map_err(io(&path))?;
    Ok(FileRecord {
        path: rel.to_string(),
        size: h.len,
        sha256: h.hex(),
        executable,
    })
}

/// What an export wrote.
#[derive(Debug)]
pub(crate) struct Exported {
    pub(crate) index: Index,
    /// Bytes of the archive.
    pub(crate) size: u64,
}

/// Write the images of `specs` and the QEMU artifacts of `extra` (the
/// plugin, the nested host image, the QEMU bundle) from `cache`, and the
/// staged `lab` tree from its own directory, to the archive `out` (written
/// as `out.tmp`, then renamed). Every entry of the cache must be there
/// under its key.
pub(crate) fn export(
    cache: &Path,
    specs: &[SpecKey],
    extra: QemuArtifacts<'_>,
    lab: Option<&Staged>,
    out: &Path,
) -> Result<Exported, ArchiveError> {
    // Each entry with the directory its files' paths are relative to.
    let mut entries: Vec<(Entry, &Path)> = cache::entries(cache, specs, extra)?
        .into_iter()
        .map(|e| (e, cache))
        .collect();
    if let Some(l) = lab {
        let entry = Entry {
            kind: Kind::Lab,
            path: l.key.dir.clone(),
            key: l.key.key.clone(),
            files: l.files().to_vec(),
        };
        entries.push((entry, l.root()));
    }
    let mut records = Vec::new();
    for (e, root) in &entries {
        let mut r = EntryRecord::from(e);
        for f in &e.files {
            r.files.push(record(root, f)?);
        }
        records.push(r);
    }
    let index = Index::new(specs.to_vec(), extra, lab.map(|l| l.key.clone()), records);
    index.check().map_err(|source| ArchiveError::Index {
        archive: out.to_path_buf(),
        source,
    })?;
    let tmp = PathBuf::from(format!("{}.tmp", out.display()));
    let roots: Vec<&Path> = entries.iter().map(|(_, root)| *root).collect();
    let result = write_archive(&roots, &index, &tmp);
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, out).map_err(io(out))?;
    let size = std::fs::metadata(out).map_err(io(out))?.len();
    Ok(Exported { index, size })
}

fn header(size: u64, mode: u32) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_size(size);
    h.set_mode(mode);
    h.set_mtime(0);
    h.set_uid(0);
    h.set_gid(0);
    h.set_entry_type(tar::EntryType::Regular);
    h
}

/// Write `index` and every file it names, each read from below its
/// entry's root (`roots`, one per entry of the index, in order).
fn write_archive(roots: &[&Path], index: &Index, tmp: &Path) -> Result<(), ArchiveError> {
    let file = std::fs::File::create(tmp).map_err(io(tmp))?;
    let mut tar = tar::Builder::new(std::io::BufWriter::new(file));
    let json = serde_json::to_vec_pretty(index).expect("the index serializes");
    let mut h = header(json.len() as u64, 0o644);
    tar.append_data(&mut h, INDEX_NAME, json.as_slice())
        .map_err(io(tmp))?;
    for (e, root) in index.entries.iter().zip(roots) {
        for f in &e.files {
            let path = root.join(&f.path);
            let file = std::fs::File::open(&path).map_err(io(&path))?;
            let mut h = header(f.size, if f.executable { 0o755 } else { 0o644 });
            // The file is read once more as it goes in: what the archive
            // holds must be what the index says.
            let mut reader = Hashing::new(file.take(f.size));
            tar.append_data(&mut h, &f.path, &mut reader)
                .map_err(io(tmp))?;
            if reader.len != f.size || reader.hex() != f.sha256 {
                return Err(ArchiveError::Changed {
                    path,
                    what: "size or sha256",
                });
            }
        }
    }
    // No fsync: an archive cut short by a crash is refused by import (a
    // missing file), and syncing 100 MB costs seconds on a busy runner.
    let mut w = tar.into_inner().map_err(io(tmp))?;
    w.flush().map_err(io(tmp))?;
    Ok(())
}

/// Read `archive`'s index only (checked), as `import` does first.
pub fn read_index(archive: &Path) -> Result<Index, ArchiveError> {
    let f = std::fs::File::open(archive).map_err(io(archive))?;
    let mut tar = tar::Archive::new(f);
    let mut entries = tar.entries().map_err(io(archive))?;
    first_index(archive, &mut entries)
}

fn first_index<R: Read>(
    archive: &Path,
    entries: &mut tar::Entries<'_, R>,
) -> Result<Index, ArchiveError> {
    let not = |why: String| ArchiveError::NotAnArchive {
        archive: archive.to_path_buf(),
        why,
    };
    let first = entries
        .next()
        .ok_or_else(|| not("it is empty".into()))?
        .map_err(|e| not(e.to_string()))?;
    let name = String::from_utf8_lossy(&first.path_bytes()).into_owned();
    if name != INDEX_NAME || first.header().entry_type() != tar::EntryType::Regular {
        return Err(not(format!(
            "its first member is {name:?}, not {INDEX_NAME}"
        )));
    }
    if first.size() > MAX_INDEX {
        return Err(not(format!("its index is {} bytes", first.size())));
    }
    let mut text = Vec::new();
    first
        .take(MAX_INDEX)
        .read_to_end(&mut text)
        .map_err(io(archive))?;
    let index: Index =
        serde_json::from_slice(&text).map_err(|e| not(format!("{INDEX_NAME}: {e}")))?;
    index.check().map_err(|source| ArchiveError::Index {
        archive: archive.to_path_buf(),
        source,
    })?;
    Ok(index)
}

/// What an import installed.
#[derive(Debug)]
pub(crate) struct Imported {
    pub(crate) index: Index,
    /// Files and bytes verified and installed.
    pub(crate) files: usize,
    pub(crate) bytes: u64,
}

/// Verify `archive` completely, then install its entries into `cache`
/// (see the module): on any error nothing in the cache changed.
pub(crate) fn import(archive: &Path, cache: &Path) -> Result<Imported, ArchiveError> {
    std::fs::create_dir_all(cache).map_err(io(cache))?;
    let stage = tempfile::Builder::new()
        .prefix(".import.")
        .tempdir_in(cache)
        .map_err(io(cache))?;
    let f = std::fs::File::open(archive).map_err(io(archive))?;
    let mut tar = tar::Archive::new(f);
    let mut members = tar.entries().map_err(io(archive))?;
    let index = first_index(archive, &mut members)?;
    let mut want: HashMap<&str, &FileRecord> = HashMap::new();
    for e in &index.entries {
        for f in &e.files {
            want.insert(f.path.as_str(), f);
        }
    }
    let mut seen: HashMap<String, ()> = HashMap::new();
    let (mut files, mut bytes) = (0usize, 0u64);
    for m in members {
        let m = m.map_err(|e| ArchiveError::NotAnArchive {
            archive: archive.to_path_buf(),
            why: e.to_string(),
        })?;
        let member = String::from_utf8_lossy(&m.path_bytes()).into_owned();
        let t = m.header().entry_type();
        if t != tar::EntryType::Regular {
            let what = match t {
                tar::EntryType::Symlink => "symbolic link".to_string(),
                tar::EntryType::Link => "hard link".to_string(),
                tar::EntryType::Directory => "directory".to_string(),
                other => format!("{other:?}"),
            };
            return Err(ArchiveError::NotAFile {
                archive: archive.to_path_buf(),
                member,
                what,
            });
        }
        let Some(rec) = want.get(member.as_str()) else {
            return Err(ArchiveError::Unlisted {
                archive: archive.to_path_buf(),
                member,
            });
        };
        if seen.insert(member.clone(), ()).is_some() {
            return Err(ArchiveError::Twice {
                archive: archive.to_path_buf(),
                member,
            });
        }
        let mismatch = |what| ArchiveError::Mismatch {
            archive: archive.to_path_buf(),
            member: member.clone(),
            what,
        };
        if m.size() != rec.size {
            return Err(mismatch("its size"));
        }
        // The index's paths are checked (safe_path): relative, plain
        // components; the member is written to that path below the stage.
        let dest = stage.path().join(&rec.path);
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        let mut out = std::fs::File::create(&dest).map_err(io(&dest))?;
        let mut reader = Hashing::new(m.take(rec.size));
        std::io::copy(&mut reader, &mut out).map_err(io(&dest))?;
        if reader.len != rec.size {
            return Err(mismatch("its size"));
        }
        if reader.hex() != rec.sha256 {
            return Err(mismatch("its sha256"));
        }
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = if rec.executable { 0o755 } else { 0o644 };
            std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(mode))
                .map_err(io(&dest))?;
        }
        files += 1;
        bytes += rec.size;
    }
    for e in &index.entries {
        for f in &e.files {
            if !seen.contains_key(&f.path) {
                return Err(ArchiveError::Missing {
                    archive: archive.to_path_buf(),
                    member: f.path.clone(),
                });
            }
        }
    }
    install(cache, stage.path(), &index)?;
    Ok(Imported {
        index,
        files,
        bytes,
    })
}

/// Move every entry from `stage` into `cache`, each by one rename (a
/// directory replaces the old one, which is moved aside first; an
/// initramfs's three files one by one, its inputs hash last), under the
/// cache's lock.
fn install(cache: &Path, stage: &Path, index: &Index) -> Result<(), ArchiveError> {
    let _lock = cache::Lock::take(cache)?;
    let old = stage.join(".replaced");
    std::fs::create_dir_all(&old).map_err(io(&old))?;
    for (i, e) in index.entries.iter().enumerate() {
        let dest = cache.join(&e.path);
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        if e.kind == Kind::Initramfs {
            for s in INITRAMFS_SUFFIXES {
                let rel = format!("{}{s}", e.path);
                let from = stage.join(&rel);
                let to = cache.join(&rel);
                std::fs::rename(&from, &to).map_err(io(&to))?;
            }
            continue;
        }
        let from = stage.join(&e.path);
        if dest.symlink_metadata().is_ok() {
            let aside = old.join(i.to_string());
            std::fs::rename(&dest, &aside).map_err(io(&dest))?;
        }
        std::fs::rename(&from, &dest).map_err(io(&dest))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab::images::bundle::BundleKey;
    use crate::lab::images::nested_host::NestedHostKey;

    /// A small cache with one spec's entries, as prepare.sh lays them out.
    fn cache_with_one_spec(c: &Path) -> SpecKey {
        let put = |rel: &str, body: &str| {
            let p = c.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, body).unwrap();
        };
        put("kernel-build-6.12/vmlinuz", "bzImage");
        put("kernel-build-6.12/System.map", "ffffffff81000000 T _text\n");
        put("kernel-build-6.12/lib/modules/6.12.1/modules.dep", "");
        put(
            "kernel-build-6.12/manifest.json",
            r#"{"inputs_hash": "KK"}"#,
        );
        put("tools/fio/fio", "fio");
        put("tools/fio/manifest.json", r#"{"inputs_hash": "FK"}"#);
        put("tools/sysstat/mpstat", "mpstat");
        put("tools/sysstat/manifest.json", r#"{"inputs_hash": "MK"}"#);
        put("initramfs/kernel-build-6.12.cpio.gz", "cpio");
        put("initramfs/kernel-build-6.12.cpio.gz.manifest.json", "{}");
        put("initramfs/kernel-build-6.12.cpio.gz.inputs-hash", "SK\n");
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(
                c.join("tools/fio/fio"),
                std::fs::Permissions::from_mode(0o755),
            )
            .unwrap();
        }
        SpecKey {
            spec: "build:6.12".into(),
            name: "6.12".into(),
            key: "SK".into(),
            kernel_key: "KK".into(),
            kernel_dir: "kernel-build-6.12".into(),
            initramfs: "initramfs/kernel-build-6.12.cpio.gz".into(),
            fio_key: "FK".into(),
            mpstat_key: "MK".into(),
        }
    }

    fn tree(c: &Path) -> Vec<(String, Vec<u8>)> {
        let mut out = Vec::new();
        let mut stack = vec![c.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap().flatten() {
                let p = e.path();
                let rel = p.strip_prefix(c).unwrap().to_string_lossy().into_owned();
                if rel.starts_with(".prepare.lock") {
                    continue;
                }
                if p.is_dir() {
                    stack.push(p);
                } else {
                    out.push((rel, std::fs::read(&p).unwrap()));
                }
            }
        }
        out.sort();
        out
    }

    #[test]
    fn export_then_import_gives_the_same_entries() {
        let t = tempfile::tempdir().unwrap();
        let a = t.path().join("a");
        let spec = cache_with_one_spec(&a);
        let ar = t.path().join("images.tar");
        let ex = export(
            &a,
            std::slice::from_ref(&spec),
            QemuArtifacts::default(),
            None,
            &ar,
        )
        .unwrap();
        assert_eq!(ex.index.entries.len(), 4);
        let b = t.path().join("b");
        let im = import(&ar, &b).unwrap();
        assert_eq!(im.files, 11);
        assert_eq!(tree(&a), tree(&b));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(b.join("tools/fio/fio"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755);
        // Into a cache that has older entries: replaced, nothing left over.
        std::fs::write(b.join("kernel-build-6.12/stale"), "x").unwrap();
        import(&ar, &b).unwrap();
        assert_eq!(tree(&a), tree(&b));
        // A spec that is not built under its key is refused by export.
        let mut other = spec;
        other.kernel_key = "K2".into();
        let e = export(
            &a,
            &[other],
            QemuArtifacts::default(),
            None,
            &t.path().join("x.tar"),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("not in the cache with key K2"), "{e}");
        assert!(!t.path().join("x.tar").exists());
    }

    #[test]
    fn the_nested_host_image_goes_out_and_comes_back_whole() {
        let t = tempfile::tempdir().unwrap();
        let a = t.path().join("a");
        let spec = cache_with_one_spec(&a);
        let d = a.join("nested-host-0123456789abcdef");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("vmlinuz"), "bz").unwrap();
        std::fs::write(d.join("host.cpio"), "070701").unwrap();
        std::fs::write(d.join("manifest.json"), r#"{"inputs_hash": "HK"}"#).unwrap();
        let host = NestedHostKey {
            key: "HK".into(),
            dir: "nested-host-0123456789abcdef".into(),
            qemu: "qemu-system-x86 1:10.0.2".into(),
            kernel_key: "KK".into(),
        };
        let ar = t.path().join("images.tar");
        let only_host = |h| QemuArtifacts {
            nested_host: Some(h),
            ..Default::default()
        };
        let ex = export(&a, std::slice::from_ref(&spec), only_host(&host), None, &ar).unwrap();
        assert_eq!(ex.index.entries.len(), 5);
        assert_eq!(ex.index.entries[4].kind, Kind::NestedHost);
        assert_eq!(read_index(&ar).unwrap().nested_host, Some(host.clone()));
        let b = t.path().join("b");
        import(&ar, &b).unwrap();
        assert_eq!(tree(&a), tree(&b));
        // Only the host image: no spec needed.
        let only = t.path().join("host.tar");
        let ex = export(&a, &[], only_host(&host), None, &only).unwrap();
        assert_eq!(ex.index.entries.len(), 1);
        let mut stale = host.clone();
        stale.key = "other".into();
        let e = export(&a, &[], only_host(&stale), None, &only).unwrap_err();
        assert!(e.to_string().contains("nested host image"), "{e}");
    }

    #[test]
    fn the_qemu_bundle_goes_out_and_comes_back_executable() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let a = t.path().join("a");
        let spec = cache_with_one_spec(&a);
        let d = a.join("qemu-bundle-0123456789abcdef");
        let put = |rel: &str, mode: u32| {
            let p = d.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, rel).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        put("bin/qemu-system-x86_64", 0o755);
        put("libexec/qemu-system-x86_64", 0o755);
        put("lib/ld-linux-x86-64.so.2", 0o755);
        put("lib/libc.so.6", 0o644);
        put("share/qemu/bios-256k.bin", 0o644);
        put("plugin/libblklab-insns.so", 0o644);
        std::fs::write(d.join("manifest.json"), r#"{"inputs_hash": "BK"}"#).unwrap();
        let bundle = BundleKey {
            key: "BK".into(),
            dir: "qemu-bundle-0123456789abcdef".into(),
            qemu: "qemu-system-x86 1:10.0.2".into(),
        };
        let extra = QemuArtifacts {
            bundle: Some(&bundle),
            ..Default::default()
        };
        let ar = t.path().join("images.tar");
        let ex = export(&a, std::slice::from_ref(&spec), extra, None, &ar).unwrap();
        assert_eq!(ex.index.entries[4].kind, Kind::QemuBundle);
        assert_eq!(ex.index.entries[4].files.len(), 7);
        assert_eq!(read_index(&ar).unwrap().bundle, Some(bundle.clone()));
        let b = t.path().join("b");
        import(&ar, &b).unwrap();
        assert_eq!(tree(&a), tree(&b));
        let mode = |rel: &str| {
            std::fs::metadata(b.join("qemu-bundle-0123456789abcdef").join(rel))
                .unwrap()
                .permissions()
                .mode()
                & 0o777
        };
        assert_eq!(mode("bin/qemu-system-x86_64"), 0o755);
        assert_eq!(mode("lib/ld-linux-x86-64.so.2"), 0o755, "the loader runs");
        assert_eq!(mode("lib/libc.so.6"), 0o644);
        let mut stale = bundle;
        stale.key = "other".into();
        let extra = QemuArtifacts {
            bundle: Some(&stale),
            ..Default::default()
        };
        let e = export(&a, &[], extra, None, &t.path().join("x.tar")).unwrap_err();
        assert!(e.to_string().contains("images build --bundle"), "{e}");
    }

    #[test]
    fn a_staged_lab_tree_goes_out_beside_the_cache_and_comes_back_as_an_entry() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let a = t.path().join("a");
        let spec = cache_with_one_spec(&a);
        let exe = t.path().join("blklab");
        std::fs::write(&exe, "binary").unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        let checkout = Path::new(env!("CARGO_MANIFEST_DIR"));
        let lab = super::super::lab_tree::stage(checkout, &exe, t.path()).unwrap();
        let ar = t.path().join("images.tar");
        let ex = export(
            &a,
            std::slice::from_ref(&spec),
            QemuArtifacts::default(),
            Some(&lab),
            &ar,
        )
        .unwrap();
        assert_eq!(ex.index.version, 2);
        assert_eq!(ex.index.entries[4].kind, Kind::Lab);
        assert_eq!(read_index(&ar).unwrap().lab, Some(lab.key.clone()));
        assert!(
            !a.join(&lab.key.dir).exists(),
            "the exporting cache is left alone"
        );
        let b = t.path().join("b");
        import(&ar, &b).unwrap();
        let installed = b.join(&lab.key.dir);
        assert_eq!(
            std::fs::read(installed.join("bin/blklab")).unwrap(),
            b"binary"
        );
        let mode = std::fs::metadata(installed.join("bin/blklab"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755);
        assert_eq!(
            std::fs::read(installed.join("images/prepare.sh")).unwrap(),
            std::fs::read(checkout.join("images/prepare.sh")).unwrap()
        );
        let trees = super::super::lab_tree::installed(&b);
        assert_eq!(trees.len(), 1);
        assert_eq!(trees[0].dir, installed);
        let listed = cache::list(&b).unwrap();
        assert!(listed.iter().any(|l| l.kind == Kind::Lab), "{listed:?}");
    }

    /// A change to one member: its name, header and data; false drops it.
    type Tamper = dyn Fn(&str, &mut tar::Header, &mut Vec<u8>) -> bool;

    /// Rewrite the archive's members through `f` (name, header, data) and
    /// return the new archive.
    fn rewrite(src: &Path, dst: &Path, f: impl Fn(&str, &mut tar::Header, &mut Vec<u8>) -> bool) {
        let mut ar = tar::Archive::new(std::fs::File::open(src).unwrap());
        let mut out = tar::Builder::new(std::fs::File::create(dst).unwrap());
        for m in ar.entries().unwrap() {
            let mut m = m.unwrap();
            let name = String::from_utf8_lossy(&m.path_bytes()).into_owned();
            let mut h = m.header().clone();
            let mut data = Vec::new();
            m.read_to_end(&mut data).unwrap();
            if f(&name, &mut h, &mut data) {
                h.set_size(data.len() as u64);
                h.set_cksum();
                out.append_data(&mut h, &name, data.as_slice()).unwrap();
            }
        }
        out.finish().unwrap();
    }

    #[test]
    fn tampered_archives_are_refused_and_the_cache_is_untouched() {
        let t = tempfile::tempdir().unwrap();
        let a = t.path().join("a");
        let spec = cache_with_one_spec(&a);
        let good = t.path().join("good.tar");
        export(&a, &[spec], QemuArtifacts::default(), None, &good).unwrap();
        let cases: Vec<(&str, Box<Tamper>)> = vec![
            (
                "sha256",
                Box::new(|n, _, d| {
                    if n.ends_with("vmlinuz") {
                        d[0] ^= 1;
                    }
                    true
                }),
            ),
            ("missing", Box::new(|n, _, _| !n.ends_with("System.map"))),
            (
                "version",
                Box::new(|n, _, d| {
                    if n == INDEX_NAME {
                        let mut v: serde_json::Value = serde_json::from_slice(d).unwrap();
                        v["version"] = 99.into();
                        *d = serde_json::to_vec(&v).unwrap();
                    }
                    true
                }),
            ),
            (
                "unsafe path",
                Box::new(|n, _, d| {
                    if n == INDEX_NAME {
                        let mut v: serde_json::Value = serde_json::from_slice(d).unwrap();
                        v["entries"][0]["files"][0]["path"] =
                            "kernel-build-6.12/../../escaped".into();
                        *d = serde_json::to_vec(&v).unwrap();
                    }
                    true
                }),
            ),
            (
                "symbolic link",
                Box::new(|n, h, d| {
                    if n.ends_with("System.map") {
                        h.set_entry_type(tar::EntryType::Symlink);
                        h.set_link_name("/etc/passwd").unwrap();
                        d.clear();
                    }
                    true
                }),
            ),
        ];
        for (want, f) in cases {
            let bad = t.path().join("bad.tar");
            rewrite(&good, &bad, f);
            let b = t.path().join(format!("b-{}", want.replace(' ', "-")));
            std::fs::create_dir_all(b.join("kernel-build-6.12")).unwrap();
            std::fs::write(b.join("kernel-build-6.12/vmlinuz"), "old").unwrap();
            let e = import(&bad, &b).unwrap_err().to_string();
            assert!(e.contains(want), "{want}: {e}");
            assert_eq!(
                tree(&b),
                [("kernel-build-6.12/vmlinuz".to_string(), b"old".to_vec())],
                "{want}: the cache changed"
            );
            assert!(!t.path().join("escaped").exists());
        }
        // A member twice.
        let bad = t.path().join("twice.tar");
        let mut ar = tar::Archive::new(std::fs::File::open(&good).unwrap());
        let mut out = tar::Builder::new(std::fs::File::create(&bad).unwrap());
        for m in ar.entries().unwrap() {
            let mut m = m.unwrap();
            let name = String::from_utf8_lossy(&m.path_bytes()).into_owned();
            let mut data = Vec::new();
            m.read_to_end(&mut data).unwrap();
            let n = if name.ends_with("vmlinuz") { 2 } else { 1 };
            for _ in 0..n {
                let mut h = m.header().clone();
                out.append_data(&mut h, &name, data.as_slice()).unwrap();
            }
        }
        out.finish().unwrap();
        let e = import(&bad, &t.path().join("c")).unwrap_err().to_string();
        assert!(e.contains("twice"), "{e}");
    }
}
