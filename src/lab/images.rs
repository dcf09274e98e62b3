//! Guest kernels and initramfs images: `--kernel` specs and the call to
//! `images/prepare.sh`, which fetches, builds and caches them (see
//! docs/lab-protocol.md section 1), and their offline keys
//! (`prepare.sh --keys`, images/README.md "Cache keys").
//!
//! - [`cache`]: the image cache directory, what a spec's images are in it,
//!   and what each entry was built from (`blklab images list`);
//! - [`index`]: the index of an image archive (its format, checked);
//! - [`archive`]: `blklab images export` and `import`;
//! - [`command`]: the `blklab images` verbs;
//! - [`nested_host`]: the host image of the nested mode
//!   (`images/build-nested-host.sh`);
//! - [`bundle`]: the QEMU bundle (`images/build-qemu-bundle.sh`), for a
//!   host without Debian's packages, and the QEMU a run uses;
//! - [`lab_tree`]: the lab tree and blklab binary an archive carries with
//!   the bundle, and the lab directory a run takes when it has no other.

pub mod archive;
pub mod bundle;
pub(crate) mod cache;
pub mod command;
pub(crate) mod index;
pub mod lab_tree;
pub(crate) mod nested_host;

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use thiserror::Error;

use crate::record::run::Manifests;

#[derive(Debug, Error)]
pub enum ImageError {
    #[error("invalid --kernel {spec:?}: {why}")]
    BadSpec { spec: String, why: String },
    #[error("kernel image {0} does not exist")]
    MissingKernel(PathBuf),
    #[error("{0} is not a bzImage (no \"HdrS\" boot header at offset 0x202)")]
    NotBzImage(PathBuf),
    #[error("modules directory {0} does not exist")]
    MissingModules(PathBuf),
    #[error("System.map {0} does not exist (map=FILE: the System.map of that kernel build)")]
    MissingMap(PathBuf),
    #[error("cannot find {0}: pass --lab-dir (the blklab source tree with images/ and guest-scripts/) or set BLKLAB_LAB_DIR")]
    NoLabDir(PathBuf),
    #[error("cannot find {prepare} (the tree this blklab was built from) and {cache} holds no imported lab tree: pass --lab-dir (the blklab source tree with images/ and guest-scripts/), set BLKLAB_LAB_DIR, or import an image archive made with `blklab images export --bundle`")]
    NoLabTree { prepare: PathBuf, cache: PathBuf },
    #[error("cannot run {script}: {source}")]
    Spawn {
        script: PathBuf,
        source: std::io::Error,
    },
    #[error("preparing the guest images failed ({status}); see the messages above")]
    Failed { status: String },
    #[error("images/prepare.sh printed an unexpected line {line:?}: {why}")]
    BadOutput { line: String, why: String },
    #[error("images/prepare.sh printed {got} results for {want} kernels")]
    Count { got: usize, want: usize },
    #[error("the instruction-count plugin: {0}")]
    Plugin(#[source] crate::lab::measure::plugin::InsnsError),
    #[error("{script} printed an unexpected key line {line:?}: {why}")]
    BadKey {
        script: PathBuf,
        line: String,
        why: String,
    },
    #[error("{script} failed ({status}): {last}")]
    KeyFailed {
        script: PathBuf,
        status: String,
        last: String,
    },
    #[error("building the nested host image failed ({status}): {last}")]
    HostFailed {
        script: PathBuf,
        status: String,
        last: String,
    },
    #[error("{script} printed {stdout:?}, not the paths of the host's kernel and initramfs (one a line)")]
    HostOutput { script: PathBuf, stdout: String },
    #[error("building the QEMU bundle failed ({status}): {last}")]
    BundleFailed {
        script: PathBuf,
        status: String,
        last: String,
    },
    #[error("{script} printed {stdout:?}, not the directory of a QEMU bundle")]
    BundleOutput { script: PathBuf, stdout: String },
}

/// The series `build:SERIES` takes: the Debian `linux-source-SERIES`
/// packages images/build-kernel.sh builds with images/kernel/guest.config
/// (5.10 from bullseye-security, which `.ci/install-deps` adds pinned to
/// that one package: the kernel before the 5.14 shared-tags fix; 6.12 from
/// bookworm-security).
pub(crate) const BUILD_SERIES: &[&str] = &["5.10", "6.12"];

/// A guest kernel as the user names it; serialised as that name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub(crate) enum KernelSpec {
    /// `debian-6.1`, `debian-6.12`: Debian's prebuilt kernels.
    Debian(String),
    /// `build:6.12`, `build:6.12+noplug`, `build:5.10`: built from
    /// linux-source-SERIES (a series of [`BUILD_SERIES`]).
    Build {
        series: String,
        patch: Option<String>,
    },
    /// `path:FILE[,modules=DIR][,map=FILE][,name=LABEL]` or a bare path.
    /// Without `map=`, images/prepare.sh takes the `System.map` beside the
    /// image, or at the top of the kernel tree for
    /// `arch/x86/boot/bzImage`, when there is one.
    Path {
        kernel: PathBuf,
        modules: Option<PathBuf>,
        map: Option<PathBuf>,
        name: Option<String>,
    },
}

impl KernelSpec {
    /// The form `images/prepare.sh` takes.
    pub(crate) fn to_prepare_arg(&self) -> String {
        match self {
            KernelSpec::Debian(s) => format!("debian-{s}"),
            KernelSpec::Build { series, patch } => match patch {
                Some(p) => format!("build:{series}+{p}"),
                None => format!("build:{series}"),
            },
            KernelSpec::Path {
                kernel,
                modules,
                map,
                name,
            } => {
                let mut s = format!("path:{}", kernel.display());
                if let Some(m) = modules {
                    s.push_str(&format!(",modules={}", m.display()));
                }
                if let Some(m) = map {
                    s.push_str(&format!(",map={}", m.display()));
                }
                if let Some(n) = name {
                    s.push_str(&format!(",name={n}"));
                }
                s
            }
        }
    }

    /// Check what can be checked before anything is built: a path kernel
    /// must exist and be a bzImage.
    pub(crate) fn check(&self) -> Result<(), ImageError> {
        if let KernelSpec::Path {
            kernel,
            modules,
            map,
            ..
        } = self
        {
            if !kernel.is_file() {
                return Err(ImageError::MissingKernel(kernel.clone()));
            }
            let mut hdr = [0u8; 0x206];
            let ok = std::fs::File::open(kernel)
                .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut hdr))
                .is_ok()
                && &hdr[0x202..0x206] == b"HdrS";
            if !ok {
                return Err(ImageError::NotBzImage(kernel.clone()));
            }
            if let Some(m) = modules {
                if !m.is_dir() {
                    return Err(ImageError::MissingModules(m.clone()));
                }
            }
            if let Some(m) = map {
                if !m.is_file() {
                    return Err(ImageError::MissingMap(m.clone()));
                }
            }
        }
        Ok(())
    }
}

impl From<KernelSpec> for String {
    fn from(k: KernelSpec) -> String {
        k.to_prepare_arg()
    }
}

impl TryFrom<String> for KernelSpec {
    type Error = ImageError;
    fn try_from(s: String) -> Result<KernelSpec, ImageError> {
        s.parse()
    }
}

impl std::str::FromStr for KernelSpec {
    type Err = ImageError;
    fn from_str(s: &str) -> Result<Self, ImageError> {
        let bad = |why: &str| ImageError::BadSpec {
            spec: s.to_string(),
            why: why.to_string(),
        };
        if let Some(series) = s.strip_prefix("debian-") {
            return match series {
                "6.1" | "6.12" => Ok(KernelSpec::Debian(series.to_string())),
                _ => Err(bad("Debian kernels: debian-6.1 or debian-6.12")),
            };
        }
        if let Some(rest) = s.strip_prefix("build:") {
            let (series, patch) = match rest.split_once('+') {
                Some((a, b)) => (a, Some(b)),
                None => (rest, None),
            };
            if !BUILD_SERIES.contains(&series) {
                return Err(bad(&format!(
                    "self-built kernels: build:SERIES or build:SERIES+PATCH, SERIES one of {}",
                    BUILD_SERIES.join(", ")
                )));
            }
            if let Some(p) = patch {
                if p.is_empty()
                    || !p
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
                {
                    return Err(bad("PATCH names a file images/patches/PATCH.patch"));
                }
            }
            return Ok(KernelSpec::Build {
                series: series.to_string(),
                patch: patch.map(|p| p.to_string()),
            });
        }
        let body = s.strip_prefix("path:").unwrap_or(s);
        if !(s.starts_with("path:") || s.contains('/')) {
            return Err(bad(
                "expected debian-6.1, debian-6.12, build:5.10[+PATCH], build:6.12[+PATCH] or path:FILE[,modules=DIR][,map=FILE][,name=LABEL]",
            ));
        }
        let mut parts = body.split(',');
        let kernel = PathBuf::from(parts.next().unwrap_or(""));
        if kernel.as_os_str().is_empty() {
            return Err(bad("empty kernel path"));
        }
        let (mut modules, mut map, mut name) = (None, None, None);
        for p in parts {
            match p.split_once('=') {
                Some(("modules", d)) if !d.is_empty() => modules = Some(PathBuf::from(d)),
                Some(("map", f)) if !f.is_empty() => map = Some(PathBuf::from(f)),
                Some(("name", n))
                    if !n.is_empty()
                        && n.chars()
                            .all(|c| c.is_ascii_alphanumeric() || "._+-".contains(c)) =>
                {
                    name = Some(n.to_string())
                }
                _ => {
                    return Err(bad(&format!(
                        "unknown option {p:?} (modules=DIR, map=FILE, name=LABEL)"
                    )))
                }
            }
        }
        Ok(KernelSpec::Path {
            kernel,
            modules,
            map,
            name,
        })
    }
}

/// A guest ready to boot, as `images/prepare.sh` reports it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct PreparedGuest {
    pub(crate) spec: String,
    /// Short label for tables and file names.
    pub(crate) name: String,
    pub(crate) kernel: PathBuf,
    pub(crate) initramfs: PathBuf,
    pub(crate) kernel_manifest: Option<PathBuf>,
    pub(crate) initramfs_manifest: Option<PathBuf>,
}

impl PreparedGuest {
    /// Both manifests' contents (null when absent or unreadable).
    pub(crate) fn manifests(&self) -> Manifests {
        let read = |p: &Option<PathBuf>| {
            p.as_ref()
                .and_then(|p| std::fs::read_to_string(p).ok())
                .and_then(|t| serde_json::from_str::<Value>(&t).ok())
                .filter(|v| !v.is_null())
        };
        Manifests {
            kernel: read(&self.kernel_manifest),
            initramfs: read(&self.initramfs_manifest),
        }
    }
}

/// The blklab source tree (images/, guest-scripts/): `--lab-dir`, else
/// `BLKLAB_LAB_DIR`, else the tree this binary was built from.
pub(crate) fn lab_dir(explicit: Option<&Path>) -> Result<PathBuf, ImageError> {
    checked_lab_dir(given_lab_dir(
        explicit,
        std::env::var_os("BLKLAB_LAB_DIR"),
        Path::new(BUILT_TREE),
    ))
}

/// The tree this binary was built from.
const BUILT_TREE: &str = env!("CARGO_MANIFEST_DIR");

/// `--lab-dir`, else `BLKLAB_LAB_DIR`, else `built`.
fn given_lab_dir(explicit: Option<&Path>, env: Option<OsString>, built: &Path) -> PathBuf {
    match (explicit, env) {
        (Some(d), _) => d.to_path_buf(),
        (None, Some(d)) => PathBuf::from(d),
        (None, None) => built.to_path_buf(),
    }
}

fn checked_lab_dir(dir: PathBuf) -> Result<PathBuf, ImageError> {
    let prepare = dir.join(lab_tree::PREPARE);
    if !prepare.is_file() {
        return Err(ImageError::NoLabDir(prepare));
    }
    Ok(dir)
}

/// The lab directory a run (or `blklab images`) uses, and the line that
/// says so when it is an imported lab tree.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct FoundLabDir {
    pub(crate) dir: PathBuf,
    pub(crate) note: Option<String>,
}

/// The lab directory as [`lab_dir`] finds it; but when neither
/// `--lab-dir` nor `BLKLAB_LAB_DIR` is given and the tree this binary was
/// built from is not here (a binary copied to another machine, as an
/// archive made with `--bundle` carries it), the newest lab tree imported
/// into `cache`, as the newest bundle's QEMU is taken.
pub(crate) fn find_lab_dir(
    explicit: Option<&Path>,
    cache: &Path,
) -> Result<FoundLabDir, ImageError> {
    choose_lab_dir(
        explicit,
        std::env::var_os("BLKLAB_LAB_DIR"),
        Path::new(BUILT_TREE),
        cache,
    )
}

fn choose_lab_dir(
    explicit: Option<&Path>,
    env: Option<OsString>,
    built: &Path,
    cache: &Path,
) -> Result<FoundLabDir, ImageError> {
    if explicit.is_some() || env.is_some() || built.join(lab_tree::PREPARE).is_file() {
        let dir = checked_lab_dir(given_lab_dir(explicit, env, built))?;
        return Ok(FoundLabDir { dir, note: None });
    }
    let trees = lab_tree::installed(cache);
    let Some(tree) = trees.first() else {
        return Err(ImageError::NoLabTree {
            prepare: built.join(lab_tree::PREPARE),
            cache: cache.to_path_buf(),
        });
    };
    let of = if trees.len() > 1 {
        format!("; the newest of {} in the cache", trees.len())
    } else {
        String::new()
    };
    let note = format!(
        "lab tree: the imported one, {} (blklab {}'s images/ and guest-scripts/, exported {}; no --lab-dir, no BLKLAB_LAB_DIR, and the tree this blklab was built from, {}, is not here{of})",
        tree.dir.display(),
        tree.blklab_version,
        tree.built_at,
        built.display()
    );
    Ok(FoundLabDir {
        dir: tree.dir.clone(),
        note: Some(note),
    })
}

/// [`find_lab_dir`], its line (an imported lab tree's) logged.
pub(crate) fn lab_dir_or_imported(
    explicit: Option<&Path>,
    cache: &Path,
) -> Result<PathBuf, ImageError> {
    let found = find_lab_dir(explicit, cache)?;
    if let Some(note) = &found.note {
        log::info!("{note}");
    }
    Ok(found.dir)
}

/// Run `images/prepare.sh` for `specs` (its progress goes to our stderr)
/// and return one prepared guest per spec, in order.
pub(crate) fn prepare(
    lab_dir: &Path,
    cache: Option<&Path>,
    specs: &[KernelSpec],
) -> Result<Vec<PreparedGuest>, ImageError> {
    for s in specs {
        s.check()?;
    }
    // The same kernel may be given twice (an A/A comparison): prepare it
    // once and hand out the same guest for each occurrence.
    let mut unique: Vec<KernelSpec> = Vec::new();
    for s in specs {
        if !unique.contains(s) {
            unique.push(s.clone());
        }
    }
    let prepared = prepare_unique(lab_dir, cache, &unique)?;
    Ok(specs
        .iter()
        .map(|s| {
            let i = unique
                .iter()
                .position(|u| u == s)
                .expect("every spec is in unique");
            prepared[i].clone()
        })
        .collect())
}

fn prepare_unique(
    lab_dir: &Path,
    cache: Option<&Path>,
    specs: &[KernelSpec],
) -> Result<Vec<PreparedGuest>, ImageError> {
    let script = lab_dir.join("images/prepare.sh");
    let mut cmd = Command::new("sh");
    cmd.arg(&script);
    if let Some(c) = cache {
        cmd.arg("--cache").arg(c);
    }
    cmd.args(specs.iter().map(|s| s.to_prepare_arg()));
    let out = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|source| ImageError::Spawn {
            script: script.clone(),
            source,
        })?;
    if !out.status.success() {
        return Err(ImageError::Failed {
            status: out.status.to_string(),
        });
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut guests = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let g: PreparedGuest = serde_json::from_str(line).map_err(|e| ImageError::BadOutput {
            line: line.to_string(),
            why: e.to_string(),
        })?;
        guests.push(g);
    }
    if guests.len() != specs.len() {
        return Err(ImageError::Count {
            got: guests.len(),
            want: specs.len(),
        });
    }
    Ok(guests)
}

/// A spec's offline key and where its images live in the cache
/// (`images/prepare.sh --keys`): computed from the repository alone (the
/// recipes, configuration fragments, patch, series, guest scripts), before
/// anything is built, without apt or the network.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpecKey {
    pub(crate) spec: String,
    pub(crate) name: String,
    /// The spec's key: its initramfs's, which covers the kernel's, fio's
    /// and mpstat's keys and the guest scripts.
    pub key: String,
    pub(crate) kernel_key: String,
    /// The kernel's directory, relative to the cache.
    pub(crate) kernel_dir: String,
    /// The initramfs, relative to the cache.
    pub(crate) initramfs: String,
    pub(crate) fio_key: String,
    pub(crate) mpstat_key: String,
}

/// The instruction-count plugin's key for the installed QEMU
/// (`images/build-qemu-plugin.sh --key`, read from the dpkg database and
/// `qemu --version`, nothing else).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PluginKey {
    pub(crate) key: String,
    /// Its directory, relative to the cache.
    pub(crate) dir: String,
    /// The QEMU package and version it is for.
    pub(crate) qemu: String,
}

/// Parse and check `specs` (as `--kernel` takes them).
pub(crate) fn parse_specs(specs: &[String]) -> Result<Vec<KernelSpec>, ImageError> {
    let parsed: Vec<KernelSpec> = specs.iter().map(|s| s.parse()).collect::<Result<_, _>>()?;
    for s in &parsed {
        s.check()?;
    }
    Ok(parsed)
}

/// Run `sh SCRIPT ARGS...` for its JSON lines on stdout (its stderr is
/// kept for the error).
fn json_lines<T: serde::de::DeserializeOwned>(
    script: &Path,
    args: &[String],
) -> Result<Vec<T>, ImageError> {
    let out = Command::new("sh")
        .arg(script)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|source| ImageError::Spawn {
            script: script.to_path_buf(),
            source,
        })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(ImageError::KeyFailed {
            script: script.to_path_buf(),
            status: out.status.to_string(),
            last: stderr
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("no output")
                .to_string(),
        });
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            serde_json::from_str(line).map_err(|e| ImageError::BadKey {
                script: script.to_path_buf(),
                line: line.to_string(),
                why: e.to_string(),
            })
        })
        .collect()
}

/// Each spec's offline key (`images/prepare.sh --keys`), in order.
pub(crate) fn keys(lab_dir: &Path, specs: &[KernelSpec]) -> Result<Vec<SpecKey>, ImageError> {
    if specs.is_empty() {
        return Ok(Vec::new());
    }
    let mut args = vec!["--keys".to_string()];
    args.extend(specs.iter().map(|s| s.to_prepare_arg()));
    let keys: Vec<SpecKey> = json_lines(&lab_dir.join("images/prepare.sh"), &args)?;
    if keys.len() != specs.len() {
        return Err(ImageError::Count {
            got: keys.len(),
            want: specs.len(),
        });
    }
    Ok(keys)
}

/// The plugin's key for `qemu` (`images/build-qemu-plugin.sh --key`).
pub(crate) fn plugin_key(lab_dir: &Path, qemu: &str) -> Result<PluginKey, ImageError> {
    qemu_key(&lab_dir.join("images/build-qemu-plugin.sh"), qemu)
}

/// The one JSON line `script --key --qemu QEMU` prints: the key of an
/// image tied to the installed QEMU.
pub(crate) fn qemu_key<K: serde::de::DeserializeOwned>(
    script: &Path,
    qemu: &str,
) -> Result<K, ImageError> {
    let args = ["--key".to_string(), "--qemu".to_string(), qemu.to_string()];
    let mut keys: Vec<K> = json_lines(script, &args)?;
    match keys.pop() {
        Some(k) if keys.is_empty() => Ok(k),
        _ => Err(ImageError::BadKey {
            script: script.to_path_buf(),
            line: String::new(),
            why: "expected one JSON line".into(),
        }),
    }
}

/// Copy a script's stderr to ours line by line; returns its last
/// non-empty line (the `NAME: ERROR: …` of a failure).
pub(crate) fn forward_stderr(stderr: Option<impl std::io::Read>) -> Option<String> {
    let mut last = None;
    let ours = std::io::stderr();
    for line in BufReader::new(stderr?).lines().map_while(Result::ok) {
        let _ = writeln!(ours.lock(), "{line}");
        if !line.trim().is_empty() {
            last = Some(line);
        }
    }
    last
}

/// `blklab images build`: prepare `specs` as `blklab run` does and, with
/// `qemu`, build the instruction-count plugin for it; returns the prepared
/// guests and the plugin's path.
pub(crate) fn build(
    lab_dir: &Path,
    cache: &Path,
    specs: &[KernelSpec],
    qemu: Option<&str>,
) -> Result<(Vec<PreparedGuest>, Option<PathBuf>), ImageError> {
    let guests = if specs.is_empty() {
        Vec::new()
    } else {
        prepare(lab_dir, Some(cache), specs)?
    };
    let plugin = match qemu {
        Some(q) => Some(
            crate::lab::measure::plugin::build_plugin(lab_dir, Some(cache), q)
                .map_err(ImageError::Plugin)?,
        ),
        None => None,
    };
    Ok((guests, plugin))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_specs() {
        assert_eq!(
            "debian-6.12".parse::<KernelSpec>().unwrap(),
            KernelSpec::Debian("6.12".into())
        );
        assert_eq!(
            "build:6.12+noplug".parse::<KernelSpec>().unwrap(),
            KernelSpec::Build {
                series: "6.12".into(),
                patch: Some("noplug".into())
            }
        );
        assert_eq!(
            "build:5.10".parse::<KernelSpec>().unwrap().to_prepare_arg(),
            "build:5.10"
        );
        assert_eq!(
            "build:5.10+hosttags".parse::<KernelSpec>().unwrap(),
            KernelSpec::Build {
                series: "5.10".into(),
                patch: Some("hosttags".into())
            }
        );
        let e = "build:5.4".parse::<KernelSpec>().unwrap_err().to_string();
        assert!(e.contains("5.10, 6.12"), "{e}");
        let p: KernelSpec = "path:/b/bzImage,modules=/m,name=mine".parse().unwrap();
        assert_eq!(p.to_prepare_arg(), "path:/b/bzImage,modules=/m,name=mine");
        let p: KernelSpec = "path:/b/bzImage,map=/b/System.map".parse().unwrap();
        assert_eq!(p.to_prepare_arg(), "path:/b/bzImage,map=/b/System.map");
        let bare: KernelSpec = "./arch/x86/boot/bzImage".parse().unwrap();
        assert_eq!(bare.to_prepare_arg(), "path:./arch/x86/boot/bzImage");
        for bad in [
            "debian-5.10",
            "build:9.99",
            "build:6.12+",
            "vmlinuz",
            "path:",
            "path:/x,foo=1",
            "path:/x,map=",
        ] {
            let e = bad.parse::<KernelSpec>().unwrap_err().to_string();
            assert!(e.contains("invalid --kernel"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_lab_dir_is_the_flag_the_environment_the_built_tree_then_an_imported_tree() {
        let t = tempfile::tempdir().unwrap();
        let lab = |name: &str, manifest: Option<&str>| {
            let d = t.path().join(name);
            std::fs::create_dir_all(d.join("images")).unwrap();
            std::fs::write(d.join(lab_tree::PREPARE), "").unwrap();
            if let Some(m) = manifest {
                std::fs::write(d.join("manifest.json"), m).unwrap();
            }
            d
        };
        let (flag, env, built) = (lab("flag", None), lab("env", None), lab("built", None));
        let cache = t.path().join("cache");
        let gone = t.path().join("gone");
        let choose = |f: Option<&Path>, e: Option<&Path>, b: &Path| {
            choose_lab_dir(f, e.map(|e| e.as_os_str().to_owned()), b, &cache)
        };
        let found = |dir: &Path| FoundLabDir {
            dir: dir.to_path_buf(),
            note: None,
        };
        assert_eq!(
            choose(Some(&flag), Some(&env), &built).unwrap(),
            found(&flag)
        );
        assert_eq!(choose(None, Some(&env), &built).unwrap(), found(&env));
        assert_eq!(choose(None, None, &built).unwrap(), found(&built));
        // No built tree and nothing imported: every remedy named.
        let e = choose(None, None, &gone).unwrap_err();
        assert!(matches!(e, ImageError::NoLabTree { .. }), "{e}");
        assert!(e.to_string().contains("images export --bundle"), "{e}");
        let manifest = |when: &str| {
            format!(r#"{{"kind": "lab", "blklab_version": "0.1.0", "built_at": "{when}"}}"#)
        };
        let old = lab(
            "cache/lab-0000000000000001",
            Some(&manifest("2026-01-01T00:00:00Z")),
        );
        let c = choose(None, None, &gone).unwrap();
        assert_eq!(c.dir, old);
        let note = c.note.unwrap();
        assert!(note.starts_with("lab tree: the imported one"), "{note}");
        assert!(note.contains("exported 2026-01-01T00:00:00Z"), "{note}");
        let new = lab(
            "cache/lab-0000000000000002",
            Some(&manifest("2026-02-01T00:00:00Z")),
        );
        let c = choose(None, None, &gone).unwrap();
        assert_eq!(c.dir, new);
        assert!(c.note.unwrap().contains("the newest of 2"));
        // A flag or the environment is never replaced by an imported tree.
        let e = choose(Some(&gone), None, &gone).unwrap_err();
        assert!(matches!(e, ImageError::NoLabDir(_)), "{e}");
        let e = choose(None, Some(&gone), &gone).unwrap_err();
        assert!(matches!(e, ImageError::NoLabDir(_)), "{e}");
    }

    #[test]
    fn path_kernels_are_checked() {
        let e = "path:/nonexistent/bzImage"
            .parse::<KernelSpec>()
            .unwrap()
            .check()
            .unwrap_err()
            .to_string();
        assert!(e.contains("does not exist"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("notakernel");
        std::fs::write(&f, vec![0u8; 4096]).unwrap();
        let e = format!("path:{}", f.display())
            .parse::<KernelSpec>()
            .unwrap()
            .check()
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a bzImage"), "{e}");
        let mut img = vec![0u8; 4096];
        img[0x202..0x206].copy_from_slice(b"HdrS");
        std::fs::write(&f, img).unwrap();
        let spec: KernelSpec = format!("path:{},modules=/nonexistent", f.display())
            .parse()
            .unwrap();
        assert!(spec.check().unwrap_err().to_string().contains("modules"));
        let spec: KernelSpec = format!("path:{},map=/nonexistent/System.map", f.display())
            .parse()
            .unwrap();
        assert!(spec.check().unwrap_err().to_string().contains("System.map"));
    }
}
