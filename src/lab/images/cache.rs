//! The image cache directory (images/README.md, "Cache layout"): where it
//! is, which of its entries make up a spec's images (checked against the
//! spec's offline key), the lock `images/prepare.sh` holds, and what each
//! entry was built from (`blklab images list`).

use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;
use thiserror::Error;

use super::bundle::BundleKey;
use super::nested_host::NestedHostKey;
use super::{PluginKey, SpecKey};

#[derive(Debug, Error)]
pub enum CacheError {
    #[error("{spec}: {what} {path} is not in the cache with key {key} (run `blklab images build {spec}` first)")]
    NotBuilt {
        spec: String,
        what: &'static str,
        path: String,
        key: String,
    },
    #[error("the instruction-count plugin for {qemu} is not in the cache ({dir}; run `blklab images build`, or pass --no-plugin)")]
    NoPlugin { qemu: String, dir: String },
    #[error("the nested host image for {qemu} is not in the cache ({dir}; run `blklab images build --nested-host`)")]
    NoNestedHost { qemu: String, dir: String },
    #[error(
        "the QEMU bundle of {qemu} is not in the cache ({dir}; run `blklab images build --bundle`)"
    )]
    NoBundle { qemu: String, dir: String },
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot lock {path}: {source}")]
    Lock {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CacheError + '_ {
    move |source| CacheError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The image cache: `explicit` (`--cache`), else `$BLKLAB_IMAGE_CACHE`,
/// else `${XDG_CACHE_HOME:-$HOME/.cache}/blklab/images`, as images/lib.sh
/// (`image_cache`) decides it.
pub(crate) fn dir(explicit: Option<&Path>) -> PathBuf {
    if let Some(d) = explicit {
        return d.to_path_buf();
    }
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(d) = env("BLKLAB_IMAGE_CACHE") {
        return PathBuf::from(d);
    }
    let base = env("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env("HOME").unwrap_or_else(|| "/".into())).join(".cache"));
    base.join("blklab/images")
}

/// The lock `images/prepare.sh` takes on a cache (`.prepare.lock`): while
/// held, no prepare.sh reads or writes the cache's entries.
pub(crate) struct Lock {
    _file: File,
}

impl Lock {
    /// Wait for and take the cache's lock (creating the cache directory).
    pub(crate) fn take(cache: &Path) -> Result<Lock, CacheError> {
        let path = cache.join(".prepare.lock");
        std::fs::create_dir_all(cache).map_err(io(cache))?;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io(&path))?;
        // SAFETY: flock on a file descriptor this function owns; no memory
        // is passed.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
        if rc != 0 {
            return Err(CacheError::Lock {
                path,
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(Lock { _file: file })
    }
}

/// What an entry of the cache is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    Kernel,
    Initramfs,
    Fio,
    Mpstat,
    QemuPlugin,
    NestedHost,
    QemuBundle,
    /// The lab tree and blklab binary an archive made with `--bundle`
    /// carries (`lab_tree`).
    Lab,
}

/// One cache entry, installed as a whole: a directory (kernels, tools, the
/// plugin, the nested host image, the QEMU bundle, a lab tree) or an initramfs with
/// its `.manifest.json` and `.inputs-hash`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) kind: Kind,
    /// Relative to the cache: `kernel-build-6.12`, `tools/fio`,
    /// `initramfs/kernel-build-6.12.cpio.gz`.
    pub(crate) path: String,
    pub(crate) key: String,
    /// Its files, relative to the cache, sorted.
    pub(crate) files: Vec<String>,
}

/// The suffixes of an initramfs entry's files (`X.cpio.gz`,
/// `X.cpio.gz.manifest.json`, `X.cpio.gz.inputs-hash`), the inputs hash last:
/// prepare.sh takes the entry as cached only when all three agree.
pub(crate) const INITRAMFS_SUFFIXES: [&str; 3] = ["", ".manifest.json", ".inputs-hash"];

fn manifest_key(dir: &Path) -> Option<String> {
    read_json(&dir.join("manifest.json"))?
        .get("inputs_hash")?
        .as_str()
        .map(str::to_string)
}

fn read_json(path: &Path) -> Option<Value> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

/// The regular files below `root/rel` (relative to `root`), sorted.
/// Symbolic links are not followed, except a kernel's `lib/modules/KVER`
/// link to a `path:` kernel's modules directory (prepare.sh makes it): an
/// archive holds the modules themselves. Other links (a modules tree's
/// `build`, `source`) are left out.
fn files_below(root: &Path, rel: &str) -> Result<Vec<String>, CacheError> {
    let mut out = Vec::new();
    let mut stack = vec![rel.to_string()];
    while let Some(d) = stack.pop() {
        let path = root.join(&d);
        for e in std::fs::read_dir(&path).map_err(io(&path))? {
            let e = e.map_err(io(&path))?;
            let name = e.file_name().to_string_lossy().into_owned();
            let child = format!("{d}/{name}");
            let ft = e.file_type().map_err(io(&e.path()))?;
            let modules_link = ft.is_symlink()
                && d.ends_with("/lib/modules")
                && d.matches('/').count() == 2
                && e.path().is_dir();
            if ft.is_dir() || modules_link {
                stack.push(child);
            } else if ft.is_file() {
                out.push(child);
            }
        }
    }
    out.sort();
    Ok(out)
}

fn dir_entry(
    cache: &Path,
    spec: &str,
    kind: Kind,
    what: &'static str,
    path: &str,
    key: &str,
) -> Result<Entry, CacheError> {
    let not_built = || CacheError::NotBuilt {
        spec: spec.to_string(),
        what,
        path: path.to_string(),
        key: key.to_string(),
    };
    if manifest_key(&cache.join(path)).as_deref() != Some(key) {
        return Err(not_built());
    }
    Ok(Entry {
        kind,
        path: path.to_string(),
        key: key.to_string(),
        files: files_below(cache, path)?,
    })
}

/// The artifacts of the installed QEMU an archive may hold besides the
/// specs' images, by their keys: the plugin, the nested host image, the
/// QEMU bundle.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct QemuArtifacts<'a> {
    pub(crate) plugin: Option<&'a PluginKey>,
    pub(crate) nested_host: Option<&'a NestedHostKey>,
    pub(crate) bundle: Option<&'a BundleKey>,
}

/// A directory entry of a QEMU artifact under its key, or `missing` (the
/// error naming how to build it) when the cache does not have it.
fn artifact_entry(
    cache: &Path,
    kind: Kind,
    what: &'static str,
    dir: &str,
    key: &str,
    missing: impl FnOnce() -> CacheError,
) -> Result<Entry, CacheError> {
    match dir_entry(cache, what, kind, what, dir, key) {
        Err(CacheError::NotBuilt { .. }) => Err(missing()),
        other => other,
    }
}

/// The entries of `specs`' images (kernels, initramfs, fio, mpstat), each
/// once, checked to be in `cache` under the specs' keys, and those of
/// `extra`, each under its key.
pub(crate) fn entries(
    cache: &Path,
    specs: &[SpecKey],
    extra: QemuArtifacts<'_>,
) -> Result<Vec<Entry>, CacheError> {
    let mut out: Vec<Entry> = Vec::new();
    let mut push = |e: Entry| {
        if !out.iter().any(|o| o.path == e.path) {
            out.push(e);
        }
    };
    for s in specs {
        let spec = &s.spec;
        push(dir_entry(
            cache,
            spec,
            Kind::Kernel,
            "kernel",
            &s.kernel_dir,
            &s.kernel_key,
        )?);
        let hash = std::fs::read_to_string(cache.join(format!("{}.inputs-hash", s.initramfs)))
            .unwrap_or_default();
        if hash.trim() != s.key || !cache.join(&s.initramfs).is_file() {
            return Err(CacheError::NotBuilt {
                spec: spec.clone(),
                what: "initramfs",
                path: s.initramfs.clone(),
                key: s.key.clone(),
            });
        }
        push(Entry {
            kind: Kind::Initramfs,
            path: s.initramfs.clone(),
            key: s.key.clone(),
            files: INITRAMFS_SUFFIXES
                .iter()
                .map(|x| format!("{}{x}", s.initramfs))
                .collect(),
        });
        push(dir_entry(
            cache,
            spec,
            Kind::Fio,
            "fio",
            "tools/fio",
            &s.fio_key,
        )?);
        push(dir_entry(
            cache,
            spec,
            Kind::Mpstat,
            "mpstat",
            "tools/sysstat",
            &s.mpstat_key,
        )?);
    }
    if let Some(p) = extra.plugin {
        push(artifact_entry(
            cache,
            Kind::QemuPlugin,
            "plugin",
            &p.dir,
            &p.key,
            || CacheError::NoPlugin {
                qemu: p.qemu.clone(),
                dir: p.dir.clone(),
            },
        )?);
    }
    if let Some(h) = extra.nested_host {
        push(artifact_entry(
            cache,
            Kind::NestedHost,
            "nested host image",
            &h.dir,
            &h.key,
            || CacheError::NoNestedHost {
                qemu: h.qemu.clone(),
                dir: h.dir.clone(),
            },
        )?);
    }
    if let Some(b) = extra.bundle {
        push(artifact_entry(
            cache,
            Kind::QemuBundle,
            "QEMU bundle",
            &b.dir,
            &b.key,
            || CacheError::NoBundle {
                qemu: b.qemu.clone(),
                dir: b.dir.clone(),
            },
        )?);
    }
    Ok(out)
}

/// One line of `blklab images list`: a cache entry and what it was built
/// from, from its manifest.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Listed {
    pub(crate) kind: Kind,
    pub(crate) path: String,
    /// Its key (the manifest's `inputs_hash`); null for entries made
    /// before keys were recorded.
    pub(crate) key: Option<String>,
    /// The package (and version) it was built or fetched from.
    pub(crate) package: Option<String>,
    pub(crate) version: Option<String>,
    pub(crate) patch: Option<String>,
    config_sha256: Option<String>,
    /// When it was built, fetched or prepared.
    pub(crate) built_at: Option<String>,
    /// Bytes of its files.
    pub(crate) size: u64,
    /// A one-line summary.
    pub(crate) from: String,
    /// The whole manifest.
    pub(crate) manifest: Value,
}

fn s(v: &Value, k: &str) -> Option<String> {
    v.get(k).and_then(Value::as_str).map(str::to_string)
}

fn size_of(cache: &Path, files: &[String]) -> u64 {
    files
        .iter()
        .filter_map(|f| std::fs::metadata(cache.join(f)).ok())
        .map(|m| m.len())
        .sum()
}

fn listed(cache: &Path, kind: Kind, path: &str, manifest: Value, files: &[String]) -> Listed {
    let m = &manifest;
    let (package, version) = match kind {
        Kind::Kernel => match s(m, "kind").as_deref() {
            Some("path") => (s(m, "source_path"), s(m, "kernel_version")),
            Some("build") => (s(m, "source_package"), s(m, "source_version")),
            _ => (s(m, "package"), s(m, "package_version")),
        },
        Kind::Fio => (Some("fio (source)".into()), s(m, "source_version")),
        Kind::Mpstat => (s(m, "package"), s(m, "package_version")),
        Kind::QemuPlugin | Kind::NestedHost | Kind::QemuBundle => {
            (s(m, "qemu_package"), s(m, "qemu_package_version"))
        }
        Kind::Lab => (Some("blklab".into()), s(m, "blklab_version")),
        Kind::Initramfs => (None, s(m, "kernel_version")),
    };
    let patch = m
        .get("patch")
        .and_then(|p| Some(format!("{} {}", s(p, "name")?, s(p, "sha256")?)));
    let built_at = s(m, "built_at")
        .or_else(|| s(m, "fetched_at"))
        .or_else(|| s(m, "prepared_at"));
    let mut from = match kind {
        Kind::Initramfs => format!(
            "kernel {}, fio {}",
            version.as_deref().unwrap_or("?"),
            m.pointer("/fio/version")
                .and_then(Value::as_str)
                .unwrap_or("?")
        ),
        Kind::NestedHost => format!(
            "{} {}, kernel {}",
            package.as_deref().unwrap_or("?"),
            version.as_deref().unwrap_or("?"),
            s(m, "kernel_version").as_deref().unwrap_or("?")
        ),
        _ => format!(
            "{} {}",
            package.as_deref().unwrap_or("?"),
            version.as_deref().unwrap_or("?")
        ),
    };
    if let Some(p) = m.get("patch").and_then(|p| s(p, "name")) {
        from.push_str(&format!(" +{p}"));
    }
    if let Some(c) = s(m, "config_sha256") {
        from.push_str(&format!(", config {}", &c[..c.len().min(12)]));
    }
    Listed {
        kind,
        path: path.to_string(),
        key: s(m, "inputs_hash"),
        package,
        version,
        patch,
        config_sha256: s(m, "config_sha256"),
        built_at,
        size: size_of(cache, files),
        from,
        manifest,
    }
}

/// Every entry of `cache` with what it was built from, by path.
pub(crate) fn list(cache: &Path) -> Result<Vec<Listed>, CacheError> {
    let mut out = Vec::new();
    if !cache.is_dir() {
        return Ok(out);
    }
    let mut top: Vec<String> = std::fs::read_dir(cache)
        .map_err(io(cache))?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    top.sort();
    for name in top {
        let kind = if name.starts_with("kernel-") && name != "kernel-src" {
            Kind::Kernel
        } else if name.starts_with("qemu-plugin-") && !name.starts_with("qemu-plugin-header-") {
            Kind::QemuPlugin
        } else if name.starts_with("nested-host-") {
            Kind::NestedHost
        } else if name.starts_with(super::bundle::DIR_PREFIX) {
            Kind::QemuBundle
        } else if name.starts_with(super::lab_tree::DIR_PREFIX) {
            Kind::Lab
        } else {
            continue;
        };
        let dir = cache.join(&name);
        if let Some(m) = read_json(&dir.join("manifest.json")) {
            let files = files_below(cache, &name)?;
            out.push(listed(cache, kind, &name, m, &files));
        }
    }
    for (kind, path) in [(Kind::Fio, "tools/fio"), (Kind::Mpstat, "tools/sysstat")] {
        if let Some(m) = read_json(&cache.join(path).join("manifest.json")) {
            let files = files_below(cache, path)?;
            out.push(listed(cache, kind, path, m, &files));
        }
    }
    if let Ok(rd) = std::fs::read_dir(cache.join("initramfs")) {
        let mut names: Vec<String> = rd
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".cpio.gz"))
            .collect();
        names.sort();
        for n in names {
            let path = format!("initramfs/{n}");
            if let Some(mut m) = read_json(&cache.join(format!("{path}.manifest.json"))) {
                // The key is the .inputs-hash beside it (the manifest's copy
                // is the same when the entry is whole).
                if let Ok(h) = std::fs::read_to_string(cache.join(format!("{path}.inputs-hash"))) {
                    m["inputs_hash"] = Value::String(h.trim().to_string());
                }
                let files: Vec<String> = INITRAMFS_SUFFIXES
                    .iter()
                    .map(|x| format!("{path}{x}"))
                    .collect();
                out.push(listed(cache, Kind::Initramfs, &path, m, &files));
            }
        }
    }
    Ok(out)
}

fn human(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

/// `blklab images list` as text: one line per entry.
pub(crate) fn list_table(entries: &[Listed]) -> String {
    let mut out = String::new();
    if entries.is_empty() {
        out.push_str("(no images in the cache)\n");
        return out;
    }
    let w = entries.iter().map(|e| e.path.len()).max().unwrap_or(0);
    out.push_str(&format!(
        "{:<11} {:<w$} {:<16} {:>9}  {:<20}  BUILT FROM\n",
        "KIND", "PATH", "KEY", "SIZE", "WHEN"
    ));
    for e in entries {
        let kind = serde_json::to_value(e.kind)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        let key = e
            .key
            .as_deref()
            .map(|k| k[..k.len().min(16)].to_string())
            .unwrap_or_else(|| "-".into());
        out.push_str(&format!(
            "{kind:<11} {:<w$} {key:<16} {:>9}  {:<20}  {}\n",
            e.path,
            human(e.size),
            e.built_at.as_deref().unwrap_or("-"),
            e.from
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_dir_follows_the_option_then_the_environment() {
        assert_eq!(dir(Some(Path::new("/x"))), PathBuf::from("/x"));
        // The environment is the process's; only check the explicit case
        // and the shape of the default.
        let d = dir(None);
        assert!(
            std::env::var_os("BLKLAB_IMAGE_CACHE").is_some() || d.ends_with("blklab/images"),
            "{}",
            d.display()
        );
    }

    #[test]
    fn entries_check_keys_and_follow_only_the_modules_link() {
        let t = tempfile::tempdir().unwrap();
        let c = t.path();
        let mods = t.path().join("outside/6.1.0");
        std::fs::create_dir_all(mods.join("kernel")).unwrap();
        std::fs::write(mods.join("kernel/a.ko"), b"ko").unwrap();
        std::os::unix::fs::symlink("/nonexistent", mods.join("build")).unwrap();
        let k = c.join("kernel-path-0123");
        std::fs::create_dir_all(k.join("lib/modules")).unwrap();
        std::os::unix::fs::symlink(&mods, k.join("lib/modules/6.1.0")).unwrap();
        std::fs::write(k.join("vmlinuz"), b"bz").unwrap();
        std::fs::write(k.join("manifest.json"), r#"{"inputs_hash": "K1"}"#).unwrap();
        for (d, key) in [("tools/fio", "F"), ("tools/sysstat", "M")] {
            std::fs::create_dir_all(c.join(d)).unwrap();
            std::fs::write(
                c.join(d).join("manifest.json"),
                format!(r#"{{"inputs_hash": "{key}"}}"#),
            )
            .unwrap();
        }
        std::fs::create_dir_all(c.join("initramfs")).unwrap();
        let i = "initramfs/kernel-path-0123.cpio.gz";
        std::fs::write(c.join(i), b"cpio").unwrap();
        std::fs::write(c.join(format!("{i}.manifest.json")), "{}").unwrap();
        std::fs::write(c.join(format!("{i}.inputs-hash")), "S1\n").unwrap();
        let mut spec = SpecKey {
            spec: "path:/x/bzImage".into(),
            name: "bzImage".into(),
            key: "S1".into(),
            kernel_key: "K1".into(),
            kernel_dir: "kernel-path-0123".into(),
            initramfs: i.into(),
            fio_key: "F".into(),
            mpstat_key: "M".into(),
        };
        let e = entries(c, &[spec.clone(), spec.clone()], QemuArtifacts::default()).unwrap();
        assert_eq!(e.len(), 4, "each entry once: {e:?}");
        assert_eq!(
            e[0].files,
            [
                "kernel-path-0123/lib/modules/6.1.0/kernel/a.ko",
                "kernel-path-0123/manifest.json",
                "kernel-path-0123/vmlinuz"
            ]
        );
        spec.kernel_key = "K2".into();
        let err = entries(c, &[spec.clone()], QemuArtifacts::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("not in the cache with key K2"), "{err}");
        spec.kernel_key = "K1".into();
        spec.key = "S2".into();
        let err = entries(c, &[spec], QemuArtifacts::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("initramfs"), "{err}");
        let listed = list(c).unwrap();
        let kinds: Vec<Kind> = listed.iter().map(|l| l.kind).collect();
        assert_eq!(
            kinds,
            [Kind::Kernel, Kind::Fio, Kind::Mpstat, Kind::Initramfs]
        );
        assert_eq!(listed[3].key.as_deref(), Some("S1"));
        assert_eq!(listed[0].size, 2 + 21 + 2, "a.ko, manifest.json, vmlinuz");
    }

    #[test]
    fn a_nested_host_entry_is_checked_by_its_key_and_listed() {
        let t = tempfile::tempdir().unwrap();
        let c = t.path();
        let d = c.join("nested-host-0123456789abcdef");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("vmlinuz"), b"bz").unwrap();
        std::fs::write(d.join("host.cpio"), b"cpio").unwrap();
        std::fs::write(
            d.join("manifest.json"),
            r#"{"kind": "nested-host", "inputs_hash": "H1", "qemu_package": "qemu-system-x86",
                "qemu_package_version": "1:10.0.2", "kernel_version": "6.12.118", "built_at": "T"}"#,
        )
        .unwrap();
        let mut key = NestedHostKey {
            key: "H1".into(),
            dir: "nested-host-0123456789abcdef".into(),
            qemu: "qemu-system-x86 1:10.0.2".into(),
            kernel_key: "K".into(),
        };
        let e = entries(
            c,
            &[],
            QemuArtifacts {
                nested_host: Some(&key),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].kind, Kind::NestedHost);
        assert_eq!(
            e[0].files,
            [
                "nested-host-0123456789abcdef/host.cpio",
                "nested-host-0123456789abcdef/manifest.json",
                "nested-host-0123456789abcdef/vmlinuz"
            ]
        );
        key.key = "H2".into();
        let err = entries(
            c,
            &[],
            QemuArtifacts {
                nested_host: Some(&key),
                ..Default::default()
            },
        )
        .unwrap_err();
        assert!(matches!(err, CacheError::NoNestedHost { .. }), "{err}");
        assert!(err.to_string().contains("--nested-host"), "{err}");
        let listed = list(c).unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].kind, Kind::NestedHost);
        assert_eq!(listed[0].key.as_deref(), Some("H1"));
        assert_eq!(listed[0].from, "qemu-system-x86 1:10.0.2, kernel 6.12.118");
        let table = list_table(&listed);
        assert!(
            table
                .lines()
                .nth(1)
                .unwrap()
                .starts_with("nested-host nested-host-0123456789abcdef H1"),
            "{table}"
        );
    }

    #[test]
    fn a_qemu_bundle_is_checked_by_its_key_and_listed() {
        let t = tempfile::tempdir().unwrap();
        let c = t.path();
        let d = c.join("qemu-bundle-0123456789abcdef");
        for f in [
            "bin/qemu-system-x86_64",
            "lib/libc.so.6",
            "share/qemu/bios-256k.bin",
        ] {
            std::fs::create_dir_all(d.join(f).parent().unwrap()).unwrap();
            std::fs::write(d.join(f), b"x").unwrap();
        }
        std::fs::write(
            d.join("manifest.json"),
            r#"{"kind": "qemu-bundle", "inputs_hash": "B1", "qemu_package": "qemu-system-x86",
                "qemu_package_version": "1:10.0.2", "built_at": "T"}"#,
        )
        .unwrap();
        let mut key = BundleKey {
            key: "B1".into(),
            dir: "qemu-bundle-0123456789abcdef".into(),
            qemu: "qemu-system-x86 1:10.0.2".into(),
        };
        let with = |k: &BundleKey| {
            entries(
                c,
                &[],
                QemuArtifacts {
                    bundle: Some(k),
                    ..Default::default()
                },
            )
        };
        let e = with(&key).unwrap();
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].kind, Kind::QemuBundle);
        assert_eq!(e[0].files.len(), 4, "{:?}", e[0].files);
        key.key = "B2".into();
        let err = with(&key).unwrap_err();
        assert!(matches!(err, CacheError::NoBundle { .. }), "{err}");
        assert!(err.to_string().contains("--bundle"), "{err}");
        let listed = list(c).unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].kind, Kind::QemuBundle);
        assert_eq!(listed[0].from, "qemu-system-x86 1:10.0.2");
        assert!(list_table(&listed).contains("qemu-bundle qemu-bundle-0123456789abcdef B1"));
    }
}
