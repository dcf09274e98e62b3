//! The lab tree an image archive carries with `--bundle`: the files of
//! `images/` and `guest-scripts/` a run reads from its lab directory, and
//! the blklab binary that wrote the archive, as one cache entry
//! `lab-KEY/` (KEY: the first 16 hex digits of the sha256 of its files'
//! paths, executable bits and sha256). Imported, it is the lab directory
//! of a blklab that finds neither `--lab-dir`, `$BLKLAB_LAB_DIR` nor the
//! tree it was built from ([`super::find_lab_dir`]), so a host needs the
//! archive and nothing else.
//!
//! [`stage`] copies the tree and the binary next to the archive being
//! written (never into the cache: the exporting host has its checkout);
//! [`installed`] lists the trees a cache holds, the newest first.

use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use thiserror::Error;

/// A lab tree's directory in the cache: this prefix and its key's first
/// 16 hex digits.
pub(crate) const DIR_PREFIX: &str = "lab-";
/// The blklab binary, relative to the lab tree.
pub(crate) const BINARY: &str = "bin/blklab";
/// The script that marks a lab directory, relative to it.
pub(crate) const PREPARE: &str = "images/prepare.sh";
/// The manifest's `kind`.
const KIND: &str = "lab";

/// What a run reads from its lab directory, relative to it: a file, or
/// (ending in `/`) every regular file below a directory. `prepare.sh`
/// and what it sources and runs on a cache hit (found by tracing it on
/// imported images), every file a spec's key hashes (the kernel
/// configuration fragments and build steps, the patches, the initramfs's
/// `/init` and `guest/`, the whole of `guest-scripts/` with its
/// scenarios), and the plugin's recipe and source, whose key a run with
/// the host's own QEMU computes. Left out: what only other commands read
/// (`build-tree.sh` for bisect, `fetch-qsd.sh` for bench, `demo.sh`,
/// `build-qemu-bundle.sh`), the nested mode's recipe (refused with a
/// bundle's QEMU), the plugin's tests and the READMEs of `images/`.
pub(crate) const TREE: &[&str] = &[
    "images/prepare.sh",
    "images/lib.sh",
    "images/build-fio.sh",
    "images/fetch-sysstat.sh",
    "images/fetch-debian-kernel.sh",
    "images/build-kernel.sh",
    "images/kernel-config.sh",
    "images/kernel/",
    "images/patches/",
    "images/build-initramfs.sh",
    "images/initramfs/",
    "images/guest/",
    "images/build-qemu-plugin.sh",
    "images/qemu-plugin/blklab-insns.c",
    "images/qemu-plugin/blklab-decode.h",
    "guest-scripts/",
];

#[derive(Debug, Error)]
pub enum LabTreeError {
    #[error("{lab}: {path} is missing (the lab tree an archive carries with --bundle needs it; give the blklab checkout with --lab-dir)")]
    Missing { lab: PathBuf, path: String },
    #[error("cannot find this blklab's own binary (it goes into the archive): {0}")]
    Exe(#[source] std::io::Error),
    #[error("cannot stage the lab tree at {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> LabTreeError + '_ {
    move |source| LabTreeError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The lab tree's key, as the archive's index names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabKey {
    pub key: String,
    /// Its directory, relative to the cache.
    pub dir: String,
    /// The version of the blklab binary it holds.
    pub(crate) blklab_version: String,
}

/// A lab tree staged for an export: `root/DIR/` holds the tree, the
/// binary and the manifest; removed when dropped.
#[derive(Debug)]
pub(crate) struct Staged {
    root: tempfile::TempDir,
    pub(crate) key: LabKey,
    /// Its files, relative to the root (`lab-KEY/…`), sorted.
    files: Vec<String>,
}

impl Staged {
    /// Where the entry's files are read from.
    pub(crate) fn root(&self) -> &Path {
        self.root.path()
    }

    /// Its files, relative to the root (`lab-KEY/…`), sorted.
    pub(crate) fn files(&self) -> &[String] {
        &self.files
    }
}

/// The files of [`TREE`] in `lab`, relative to it, sorted; a file or
/// directory of the list that is not there is an error.
fn tree_files(lab: &Path) -> Result<Vec<String>, LabTreeError> {
    let missing = |path: &str| LabTreeError::Missing {
        lab: lab.to_path_buf(),
        path: path.to_string(),
    };
    let mut out = Vec::new();
    for item in TREE {
        match item.strip_suffix('/') {
            None if lab.join(item).is_file() => out.push(item.to_string()),
            None => return Err(missing(item)),
            Some(d) if lab.join(d).is_dir() => out.extend(files_below(lab, d)?),
            Some(_) => return Err(missing(item)),
        }
    }
    out.sort();
    Ok(out)
}

/// The regular files below `root/rel`, relative to `root` (links and
/// other kinds skipped, as `find -type f` does for the keys).
fn files_below(root: &Path, rel: &str) -> Result<Vec<String>, LabTreeError> {
    let mut out = Vec::new();
    let mut stack = vec![rel.to_string()];
    while let Some(d) = stack.pop() {
        let path = root.join(&d);
        for e in std::fs::read_dir(&path).map_err(io(&path))? {
            let e = e.map_err(io(&path))?;
            let child = format!("{d}/{}", e.file_name().to_string_lossy());
            let ft = e.file_type().map_err(io(&e.path()))?;
            if ft.is_dir() {
                stack.push(child);
            } else if ft.is_file() {
                out.push(child);
            }
        }
    }
    Ok(out)
}

/// The hex sha256 of a file and its length.
fn sha256_file(path: &Path) -> Result<(String, u64), LabTreeError> {
    let mut f = std::fs::File::open(path).map_err(io(path))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut len = 0u64;
    loop {
        let n = f.read(&mut buf).map_err(io(path))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        len += n as u64;
    }
    Ok((hex(&h.finalize()), len))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn executable(path: &Path) -> Result<bool, LabTreeError> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path)
        .map_err(io(path))?
        .permissions()
        .mode();
    Ok(mode & 0o111 != 0)
}

/// What the key is the sha256 of: a version line, then one line per file
/// (`PATH x|- SHA256`, sorted by path, as `hash_dir` in images/lib.sh).
fn key_lines(dir: &Path, files: &[String]) -> Result<(String, u64), LabTreeError> {
    let mut lines = String::from("blklab-key lab 1\n");
    let mut size = 0;
    for f in files {
        let p = dir.join(f);
        let (sha, len) = sha256_file(&p)?;
        let x = if executable(&p)? { "x" } else { "-" };
        lines.push_str(&format!("{f} {x} {sha}\n"));
        size += len;
    }
    Ok((lines, size))
}

/// Copy the lab tree of `lab` and the binary `exe` into a new directory
/// in `near` (modes kept), key them, write the manifest and name the
/// directory by the key. The key is computed from the copies, so what
/// the archive holds is what the key says even if the checkout changes
/// meanwhile.
pub(crate) fn stage(lab: &Path, exe: &Path, near: &Path) -> Result<Staged, LabTreeError> {
    let mut files = tree_files(lab)?;
    let root = tempfile::Builder::new()
        .prefix(".blklab-lab.")
        .tempdir_in(near)
        .map_err(io(near))?;
    let work = root.path().join("stage");
    for f in &files {
        copy(&lab.join(f), &work.join(f))?;
    }
    copy(exe, &work.join(BINARY))?;
    files.push(BINARY.to_string());
    files.sort();
    let (lines, size) = key_lines(&work, &files)?;
    let key = hex(&Sha256::digest(lines.as_bytes()));
    let (blklab_sha256, _) = sha256_file(&work.join(BINARY))?;
    let manifest = serde_json::json!({
        "kind": KIND,
        "inputs_hash": key,
        "blklab_version": env!("CARGO_PKG_VERSION"),
        "blklab_sha256": blklab_sha256,
        "lab_dir": lab.display().to_string(),
        "files": files.len(),
        "size": size,
        "built_at": crate::util::wallclock::utc_iso(),
    });
    let m = work.join("manifest.json");
    let text = serde_json::to_string_pretty(&manifest).unwrap_or_default() + "\n";
    std::fs::write(&m, text).map_err(io(&m))?;
    std::fs::write(work.join("inputs"), &lines).map_err(io(&work))?;
    let dir = format!("{DIR_PREFIX}{}", &key[..16]);
    let named = root.path().join(&dir);
    std::fs::rename(&work, &named).map_err(io(&named))?;
    let mut files: Vec<String> = files.iter().map(|f| format!("{dir}/{f}")).collect();
    files.extend(["inputs", "manifest.json"].map(|f| format!("{dir}/{f}")));
    files.sort();
    Ok(Staged {
        root,
        key: LabKey {
            key,
            dir,
            blklab_version: env!("CARGO_PKG_VERSION").to_string(),
        },
        files,
    })
}

/// Copy `from` to `to` (its directory made), with its mode.
fn copy(from: &Path, to: &Path) -> Result<(), LabTreeError> {
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent).map_err(io(parent))?;
    }
    std::fs::copy(from, to).map_err(io(from))?;
    Ok(())
}

/// A lab tree installed in a cache.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LabTree {
    /// The lab directory: `CACHE/lab-KEY`.
    pub(crate) dir: PathBuf,
    /// The version of the blklab that exported it (its manifest's).
    pub(crate) blklab_version: String,
    /// When it was exported (its manifest's `built_at`, UTC).
    pub(crate) built_at: String,
}

impl LabTree {
    /// The lab tree in `dir`: a manifest of kind `lab` and `images/prepare.sh`.
    pub(crate) fn at(dir: &Path) -> Option<LabTree> {
        let text = std::fs::read_to_string(dir.join("manifest.json")).ok()?;
        let m: Value = serde_json::from_str(&text).ok()?;
        if m.get("kind").and_then(Value::as_str) != Some(KIND) {
            return None;
        }
        let s = |k: &str| m.get(k).and_then(Value::as_str).unwrap_or("?").to_string();
        dir.join(PREPARE).is_file().then(|| LabTree {
            dir: dir.to_path_buf(),
            blklab_version: s("blklab_version"),
            built_at: s("built_at"),
        })
    }
}

/// The lab trees installed in `cache`, the newest exported first.
pub(crate) fn installed(cache: &Path) -> Vec<LabTree> {
    let Ok(rd) = std::fs::read_dir(cache) else {
        return Vec::new();
    };
    let mut out: Vec<LabTree> = rd
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(DIR_PREFIX))
        .filter_map(|e| LabTree::at(&e.path()))
        .collect();
    out.sort_by(|a, b| (&b.built_at, &b.dir).cmp(&(&a.built_at, &a.dir)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use std::process::Command;

    fn checkout() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
    }

    /// A fake binary with mode 0755.
    fn exe(dir: &Path) -> PathBuf {
        let p = dir.join("blklab-bin");
        std::fs::write(&p, b"\x7fELF not really").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    #[test]
    fn the_tree_is_what_a_run_reads_and_nothing_else() {
        let t = tempfile::tempdir().unwrap();
        let s = stage(&checkout(), &exe(t.path()), t.path()).unwrap();
        let dir = s.key.dir.clone();
        assert!(dir.starts_with(DIR_PREFIX) && dir.len() == DIR_PREFIX.len() + 16);
        let has = |f: &str| s.files.contains(&format!("{dir}/{f}"));
        for f in [
            "images/prepare.sh",
            "images/lib.sh",
            "images/build-initramfs.sh",
            "images/kernel/guest.config",
            "images/patches/noplug.patch",
            "images/initramfs/init",
            "guest-scripts/lab.sh",
            "guest-scripts/README.md",
            "guest-scripts/scenarios/smoke.scn",
            BINARY,
            "manifest.json",
            "inputs",
        ] {
            assert!(has(f), "{f} is not in {:?}", s.files);
        }
        for f in [
            "images/README.md",
            "images/demo.sh",
            "images/build-tree.sh",
            "images/build-qemu-bundle.sh",
            "images/qemu-plugin/decode-test.c",
        ] {
            assert!(!has(f), "{f} is in the tree");
        }
        let root = s.root().join(&dir);
        let mode = |f: &str| {
            std::fs::metadata(root.join(f))
                .unwrap()
                .permissions()
                .mode()
                & 0o111
        };
        assert_ne!(mode(BINARY), 0, "the binary stays executable");
        assert_eq!(
            mode("guest-scripts/lab.sh") != 0,
            std::fs::metadata(checkout().join("guest-scripts/lab.sh"))
                .unwrap()
                .permissions()
                .mode()
                & 0o111
                != 0
        );
        let tree = LabTree::at(&root).unwrap();
        assert_eq!(tree.blklab_version, env!("CARGO_PKG_VERSION"));
        assert!(s.files().iter().all(|f| f.starts_with(&format!("{dir}/"))));
        // The same content, the same key; another binary, another key.
        let again = stage(&checkout(), &exe(t.path()), t.path()).unwrap();
        assert_eq!(again.key, s.key);
        let other = t.path().join("other");
        std::fs::write(&other, b"another binary").unwrap();
        assert_ne!(stage(&checkout(), &other, t.path()).unwrap().key, s.key);
    }

    #[test]
    fn the_staged_tree_gives_the_checkouts_keys() {
        let t = tempfile::tempdir().unwrap();
        let s = stage(&checkout(), &exe(t.path()), t.path()).unwrap();
        let keys = |lab: &Path| {
            let o = Command::new("sh")
                .arg(lab.join(PREPARE))
                .args([
                    "--keys",
                    "build:6.12",
                    "build:6.12+noplug",
                    "build:5.10",
                    "debian-6.12",
                ])
                .output()
                .unwrap();
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            String::from_utf8(o.stdout).unwrap()
        };
        let here = keys(&checkout());
        assert_eq!(here.lines().count(), 4, "{here}");
        assert_eq!(keys(&s.root().join(&s.key.dir)), here);
    }

    #[test]
    fn a_missing_file_is_named_and_trees_are_found_newest_first() {
        let t = tempfile::tempdir().unwrap();
        let e = stage(t.path(), &exe(t.path()), t.path()).unwrap_err();
        assert!(matches!(e, LabTreeError::Missing { .. }), "{e}");
        assert!(e.to_string().contains("images/prepare.sh"), "{e}");
        let cache = t.path().join("cache");
        let put = |name: &str, when: &str, kind: &str| {
            let d = cache.join(name);
            std::fs::create_dir_all(d.join("images")).unwrap();
            std::fs::write(d.join(PREPARE), "").unwrap();
            std::fs::write(
                d.join("manifest.json"),
                format!(r#"{{"kind": "{kind}", "blklab_version": "0.1.0", "built_at": "{when}"}}"#),
            )
            .unwrap();
            d
        };
        assert_eq!(installed(&cache), Vec::new());
        let old = put("lab-old", "2026-01-01T00:00:00Z", KIND);
        let new = put("lab-new", "2026-02-01T00:00:00Z", KIND);
        put("lab-other", "2026-03-01T00:00:00Z", "qemu-bundle");
        put("qemu-bundle-x", "2026-03-01T00:00:00Z", KIND);
        let dirs: Vec<PathBuf> = installed(&cache).into_iter().map(|l| l.dir).collect();
        assert_eq!(dirs, [new.clone(), old]);
        std::fs::remove_file(new.join(PREPARE)).unwrap();
        assert_eq!(LabTree::at(&new), None, "no prepare.sh: not a lab tree");
    }
}
