//! The QEMU bundle (`images/build-qemu-bundle.sh`): the installed QEMU
//! with every library it links, its ELF loader, the firmware a lab guest
//! reads and the instruction-count plugin, for a host without Debian's
//! packages. Its offline key and the call that builds it; the bundles a
//! cache holds; and the QEMU a run uses: the host's, or a bundle's when
//! the host has none (or `--qemu bundle` asks for it).
//!
//! A bundle's QEMU is its `bin/qemu-system-x86_64`, a shell wrapper that
//! execs the bundle's loader on the bundle's binary with `--library-path`
//! and `-L` the bundle's firmware: to the lab it is a QEMU like any other
//! (the same pid, so `PR_SET_PDEATHSIG` and the cleanup hold).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use thiserror::Error;

use super::ImageError;
use crate::lab::guest::qemu::{self, QemuError};

/// The recipe, relative to the lab directory.
const SCRIPT: &str = "images/build-qemu-bundle.sh";
/// A bundle's directory in the cache: this prefix and its key's first 16
/// hex digits.
pub(crate) const DIR_PREFIX: &str = "qemu-bundle-";
/// The QEMU a run starts, relative to the bundle.
const WRAPPER: &str = "bin/qemu-system-x86_64";
/// The instruction-count plugin, relative to the bundle.
const PLUGIN: &str = "plugin/libblklab-insns.so";
/// `--qemu bundle`: the cache's bundle, whatever the host has.
pub(crate) const ASK: &str = "bundle";
/// `--qemu`'s default: the host's QEMU on PATH, else the cache's bundle.
pub(crate) const DEFAULT_QEMU: &str = "qemu-system-x86_64";

/// Why no QEMU could be chosen.
#[derive(Debug, Error)]
pub enum ChooseError {
    #[error(transparent)]
    Qemu(#[from] QemuError),
    #[error("{qemu} not found on PATH and {cache} holds no QEMU bundle: install it with `apt-get install qemu-system-x86`, pass --qemu PATH, or import an image archive made with `blklab images export --bundle`")]
    Missing { qemu: String, cache: PathBuf },
    #[error("--qemu bundle: {cache} holds no QEMU bundle (import an image archive made with `blklab images export --bundle`, or give --cache DIR)")]
    NoBundle { cache: PathBuf },
}

/// The bundle's offline key (`images/build-qemu-bundle.sh --key`): the
/// installed QEMU's package, version and `--version`, the plugin's key,
/// the sha256 of its loader, libraries and firmware, and the recipe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BundleKey {
    pub key: String,
    /// Its directory, relative to the cache.
    pub(crate) dir: String,
    /// The QEMU package and version it holds.
    pub(crate) qemu: String,
}

/// The bundle's key for `qemu`.
pub(crate) fn bundle_key(lab_dir: &Path, qemu: &str) -> Result<BundleKey, ImageError> {
    super::qemu_key(&lab_dir.join(SCRIPT), qemu)
}

/// Build the bundle of `qemu` into `cache` (the plugin first, when it is
/// not there), or find it there under its key; the script's progress goes
/// to our stderr as it comes. Returns the bundle's directory.
pub(crate) fn build_bundle(
    lab_dir: &Path,
    cache: &Path,
    qemu: &str,
) -> Result<PathBuf, ImageError> {
    let script = lab_dir.join(SCRIPT);
    let spawn = |source| ImageError::Spawn {
        script: script.clone(),
        source,
    };
    let mut child = Command::new("sh")
        .arg(&script)
        .arg("--qemu")
        .arg(qemu)
        .arg("--cache")
        .arg(cache)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn)?;
    let last = super::forward_stderr(child.stderr.take());
    let out = child.wait_with_output().map_err(spawn)?;
    if !out.status.success() {
        return Err(ImageError::BundleFailed {
            script,
            status: out.status.to_string(),
            last: last.unwrap_or_else(|| "no output".into()),
        });
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    match Bundle::at(Path::new(stdout.trim())) {
        Some(b) => Ok(b.dir),
        None => Err(ImageError::BundleOutput {
            script,
            stdout: stdout.into_owned(),
        }),
    }
}

/// A bundle installed in a cache.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Bundle {
    pub(crate) dir: PathBuf,
    /// The QEMU to start (the wrapper).
    pub(crate) qemu: PathBuf,
    /// The instruction-count plugin built for it.
    pub(crate) plugin: PathBuf,
    /// The QEMU package and version it holds (its manifest's).
    pub(crate) from: String,
    /// When it was built (its manifest's `built_at`, UTC).
    built_at: String,
}

impl Bundle {
    /// The bundle in `dir`: a manifest of kind `qemu-bundle`, the wrapper
    /// and the plugin.
    pub(crate) fn at(dir: &Path) -> Option<Bundle> {
        let text = std::fs::read_to_string(dir.join("manifest.json")).ok()?;
        let m: Value = serde_json::from_str(&text).ok()?;
        if m.get("kind").and_then(Value::as_str) != Some("qemu-bundle") {
            return None;
        }
        let s = |k: &str| m.get(k).and_then(Value::as_str).unwrap_or("?").to_string();
        let (qemu, plugin) = (dir.join(WRAPPER), dir.join(PLUGIN));
        (qemu.is_file() && plugin.is_file()).then(|| Bundle {
            dir: dir.to_path_buf(),
            qemu,
            plugin,
            from: format!("{} {}", s("qemu_package"), s("qemu_package_version")),
            built_at: s("built_at"),
        })
    }

    /// The bundle whose QEMU `qemu` is (a path to a bundle's wrapper, or
    /// a link to one), if any.
    pub(crate) fn of_qemu(qemu: &Path) -> Option<Bundle> {
        let real = std::fs::canonicalize(qemu).ok()?;
        let dir = real.parent()?.parent()?;
        Bundle::at(dir).filter(|b| std::fs::canonicalize(&b.qemu).ok().as_ref() == Some(&real))
    }
}

/// The bundles installed in `cache`, the newest built first.
pub(crate) fn installed(cache: &Path) -> Vec<Bundle> {
    let Ok(rd) = std::fs::read_dir(cache) else {
        return Vec::new();
    };
    let mut out: Vec<Bundle> = rd
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(DIR_PREFIX))
        .filter_map(|e| Bundle::at(&e.path()))
        .collect();
    out.sort_by(|a, b| (&b.built_at, &b.dir).cmp(&(&a.built_at, &a.dir)));
    out
}

/// Why a run uses the QEMU it uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Why {
    /// `--qemu` named it (a name on PATH or a path).
    Named,
    /// `--qemu bundle`.
    AskedForBundle,
    /// `--qemu` left at its default, and the host has no QEMU on PATH.
    NoneOnPath,
}

/// The QEMU a run uses.
#[derive(Debug, Clone)]
pub(crate) struct ChosenQemu {
    pub(crate) path: PathBuf,
    /// The bundle it is from, when it is a bundle's.
    pub(crate) bundle: Option<Bundle>,
    pub(crate) why: Why,
    /// How many bundles the cache holds (the newest is taken).
    bundles: usize,
}

impl ChosenQemu {
    /// The line that says a bundle's QEMU runs, and why; none for the
    /// host's.
    pub(crate) fn note(&self) -> Option<String> {
        let b = self.bundle.as_ref()?;
        let why = match self.why {
            Why::Named => "as --qemu names it".to_string(),
            Why::AskedForBundle => "--qemu bundle".to_string(),
            Why::NoneOnPath => format!("no {DEFAULT_QEMU} on PATH"),
        };
        let of = if self.bundles > 1 {
            format!("; the newest of {} bundles in the cache", self.bundles)
        } else {
            String::new()
        };
        Some(format!(
            "QEMU: the bundle's, {} ({}, its own loader, libraries, firmware and plugin; {why}{of})",
            b.qemu.display(),
            b.from
        ))
    }
}

/// The QEMU a run uses for `--qemu requested` with the image cache
/// `cache`: `bundle` takes the cache's newest bundle; the default takes
/// the host's `qemu-system-x86_64` on PATH, else the cache's newest
/// bundle; anything else is found as named (a bundle's wrapper named by
/// its path is that bundle's).
pub(crate) fn choose_qemu(requested: &str, cache: &Path) -> Result<ChosenQemu, ChooseError> {
    choose_with(requested, cache, qemu::locate)
}

fn choose_with(
    requested: &str,
    cache: &Path,
    locate: impl Fn(&str) -> Result<PathBuf, QemuError>,
) -> Result<ChosenQemu, ChooseError> {
    let bundle_of_cache = |why| {
        let all = installed(cache);
        let bundles = all.len();
        all.into_iter().next().map(|b| ChosenQemu {
            path: b.qemu.clone(),
            bundle: Some(b),
            why,
            bundles,
        })
    };
    if requested == ASK {
        return bundle_of_cache(Why::AskedForBundle).ok_or_else(|| ChooseError::NoBundle {
            cache: cache.to_path_buf(),
        });
    }
    match locate(requested) {
        Ok(path) => {
            let bundle = Bundle::of_qemu(&path);
            Ok(ChosenQemu {
                path,
                bundles: usize::from(bundle.is_some()),
                bundle,
                why: Why::Named,
            })
        }
        Err(QemuError::NotFound(_)) if requested == DEFAULT_QEMU => {
            bundle_of_cache(Why::NoneOnPath).ok_or_else(|| ChooseError::Missing {
                qemu: requested.to_string(),
                cache: cache.to_path_buf(),
            })
        }
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bundle's layout in `cache/name`, built at `when` (no real QEMU:
    /// what is read is the manifest and which files exist).
    fn fake_bundle(cache: &Path, name: &str, when: &str) -> PathBuf {
        let d = cache.join(name);
        std::fs::create_dir_all(d.join("bin")).unwrap();
        std::fs::create_dir_all(d.join("plugin")).unwrap();
        std::fs::write(d.join(WRAPPER), "#!/bin/sh\n").unwrap();
        std::fs::write(d.join(PLUGIN), "so").unwrap();
        std::fs::write(
            d.join("manifest.json"),
            format!(
                r#"{{"kind": "qemu-bundle", "qemu_package": "qemu-system-x86",
                    "qemu_package_version": "1:10.0.2", "built_at": "{when}"}}"#
            ),
        )
        .unwrap();
        d
    }

    fn not_found(q: &str) -> Result<PathBuf, QemuError> {
        Err(QemuError::NotFound(q.to_string()))
    }

    #[test]
    fn a_bundle_is_its_manifest_wrapper_and_plugin() {
        let t = tempfile::tempdir().unwrap();
        let d = fake_bundle(t.path(), "qemu-bundle-00", "2026-01-01T00:00:00Z");
        let b = Bundle::at(&d).unwrap();
        assert_eq!(b.qemu, d.join("bin/qemu-system-x86_64"));
        assert_eq!(b.from, "qemu-system-x86 1:10.0.2");
        assert_eq!(Bundle::of_qemu(&b.qemu).unwrap().dir, d);
        let link = t.path().join("qemu");
        std::os::unix::fs::symlink(&b.qemu, &link).unwrap();
        assert_eq!(
            Bundle::of_qemu(&link).unwrap().dir,
            d,
            "a link to a wrapper"
        );
        assert_eq!(Bundle::of_qemu(&d.join("manifest.json")), None);
        std::fs::remove_file(d.join(PLUGIN)).unwrap();
        assert_eq!(Bundle::at(&d), None, "no plugin: not a whole bundle");
        let nested = fake_bundle(t.path(), "nested-host-00", "x");
        std::fs::write(nested.join("manifest.json"), r#"{"kind": "nested-host"}"#).unwrap();
        assert_eq!(Bundle::at(&nested), None);
    }

    #[test]
    fn the_host_qemu_comes_first_then_the_newest_bundle() {
        let t = tempfile::tempdir().unwrap();
        let cache = t.path();
        let host = |_: &str| Ok(PathBuf::from("/usr/bin/qemu-system-x86_64"));
        // The host's QEMU, whatever the cache holds.
        let c = choose_with(DEFAULT_QEMU, cache, host).unwrap();
        assert_eq!(c.path, PathBuf::from("/usr/bin/qemu-system-x86_64"));
        assert!(c.bundle.is_none() && c.note().is_none());
        // Nothing on PATH and no bundle: both remedies named.
        let e = choose_with(DEFAULT_QEMU, cache, not_found).unwrap_err();
        assert!(matches!(e, ChooseError::Missing { .. }), "{e}");
        assert!(
            e.to_string().contains("apt-get install qemu-system-x86"),
            "{e}"
        );
        assert!(e.to_string().contains("export --bundle"), "{e}");
        let e = choose_with(ASK, cache, host).unwrap_err();
        assert!(matches!(e, ChooseError::NoBundle { .. }), "{e}");
        // A named QEMU that is not there is not replaced by a bundle.
        fake_bundle(cache, "qemu-bundle-old", "2026-01-01T00:00:00Z");
        let e = choose_with("/opt/qemu", cache, not_found).unwrap_err();
        assert!(matches!(e, ChooseError::Qemu(_)), "{e}");
        // Nothing on PATH: the bundle, said so.
        let c = choose_with(DEFAULT_QEMU, cache, not_found).unwrap();
        assert_eq!(c.why, Why::NoneOnPath);
        assert_eq!(c.path, cache.join("qemu-bundle-old/bin/qemu-system-x86_64"));
        let note = c.note().unwrap();
        assert!(note.contains("no qemu-system-x86_64 on PATH"), "{note}");
        // The newest of two, for the default and for `bundle`.
        let new = fake_bundle(cache, "qemu-bundle-new", "2026-02-01T00:00:00Z");
        for (req, locate) in [(DEFAULT_QEMU, not_found as fn(&str) -> _), (ASK, not_found)] {
            let c = choose_with(req, cache, locate).unwrap();
            assert_eq!(c.bundle.as_ref().unwrap().dir, new, "{req}");
            assert!(
                c.note().unwrap().contains("the newest of 2 bundles"),
                "{req}"
            );
        }
        // `bundle` even when the host has a QEMU.
        let c = choose_with(ASK, cache, host).unwrap();
        assert_eq!(c.why, Why::AskedForBundle);
        // A bundle's wrapper named by its path is that bundle's.
        let wrapper = cache.join("qemu-bundle-old/bin/qemu-system-x86_64");
        let c = choose_with(wrapper.to_str().unwrap(), cache, qemu::locate).unwrap();
        assert_eq!(c.why, Why::Named);
        assert_eq!(c.bundle.unwrap().dir, cache.join("qemu-bundle-old"));
    }
}
