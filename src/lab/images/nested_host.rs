//! The host image of the lab's nested mode (`images/build-nested-host.sh`):
//! Debian's 6.12 kernel and an initramfs with kvm_amd, the installed QEMU,
//! its libraries and firmware, booted under TCG with an SVM CPU so that the
//! lab runs inside it as on a KVM host. Its offline key (`--key`) and the
//! call that builds it or finds it in the cache.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::ImageError;

/// The recipe, relative to the lab directory.
const SCRIPT: &str = "images/build-nested-host.sh";

/// The host image ready to boot.
#[derive(Debug, Clone)]
pub(crate) struct NestedHostImage {
    /// The host's kernel (a copy of the debian-6.12 bzImage).
    pub(crate) kernel: PathBuf,
    /// `host.cpio`: uncompressed newc, a multiple of 512 bytes long; the
    /// lab appends its per-run archive (`/lab/run/...`) to it.
    pub(crate) initramfs: PathBuf,
    /// `manifest.json` beside them (null when absent or unreadable).
    pub(crate) manifest: Option<Value>,
}

/// The host image's offline key (`images/build-nested-host.sh --key`): the
/// debian-6.12 kernel's key, the installed QEMU's package and version, its
/// firmware, busybox's and libc's versions and the recipe, read locally.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NestedHostKey {
    pub key: String,
    /// Its directory, relative to the cache.
    pub(crate) dir: String,
    /// The QEMU package and version it holds.
    pub(crate) qemu: String,
    /// The key of the debian-6.12 kernel it is built from.
    pub(crate) kernel_key: String,
}

/// The host image's key for `qemu`.
pub(crate) fn nested_host_key(lab_dir: &Path, qemu: &str) -> Result<NestedHostKey, ImageError> {
    super::qemu_key(&lab_dir.join(SCRIPT), qemu)
}

/// Build the host image for `qemu` into `cache` (default: the image
/// cache), or find it there under its key; the script's progress goes to
/// our stderr as it comes.
pub(crate) fn prepare_nested_host(
    lab_dir: &Path,
    cache: Option<&Path>,
    qemu: &str,
) -> Result<NestedHostImage, ImageError> {
    let script = lab_dir.join(SCRIPT);
    let mut cmd = Command::new("sh");
    cmd.arg(&script).arg("--qemu").arg(qemu);
    if let Some(c) = cache {
        cmd.arg("--cache").arg(c);
    }
    let spawn = |source| ImageError::Spawn {
        script: script.clone(),
        source,
    };
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn)?;
    let last = super::forward_stderr(child.stderr.take());
    // stdout is two lines: the pipe holds them until the script exits.
    let out = child.wait_with_output().map_err(spawn)?;
    if !out.status.success() {
        return Err(ImageError::HostFailed {
            script,
            status: out.status.to_string(),
            last: last.unwrap_or_else(|| "no output".into()),
        });
    }
    let (kernel, initramfs) =
        parse_paths(&String::from_utf8_lossy(&out.stdout)).ok_or_else(|| {
            ImageError::HostOutput {
                script: script.clone(),
                stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            }
        })?;
    let manifest = initramfs
        .parent()
        .and_then(|d| std::fs::read_to_string(d.join("manifest.json")).ok())
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .filter(|v| !v.is_null());
    Ok(NestedHostImage {
        kernel,
        initramfs,
        manifest,
    })
}

/// The script's stdout: the kernel's path, then the initramfs's, both
/// existing files.
fn parse_paths(stdout: &str) -> Option<(PathBuf, PathBuf)> {
    let mut lines = stdout.lines().map(str::trim).filter(|l| !l.is_empty());
    let kernel = PathBuf::from(lines.next()?);
    let initramfs = PathBuf::from(lines.next()?);
    (lines.next().is_none() && kernel.is_file() && initramfs.is_file())
        .then_some((kernel, initramfs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_output_is_two_existing_files() {
        let t = tempfile::tempdir().unwrap();
        let k = t.path().join("vmlinuz");
        let i = t.path().join("host.cpio");
        std::fs::write(&k, b"bz").unwrap();
        std::fs::write(&i, b"cpio").unwrap();
        let out = format!("{}\n{}\n", k.display(), i.display());
        assert_eq!(parse_paths(&out), Some((k.clone(), i.clone())));
        assert_eq!(parse_paths(&format!("{}\n", k.display())), None);
        let three = format!("{out}{}\n", k.display());
        assert_eq!(parse_paths(&three), None);
        let missing = format!("{}\n{}\n", k.display(), t.path().join("x").display());
        assert_eq!(parse_paths(&missing), None);
    }

    #[test]
    fn a_failure_carries_the_scripts_last_line() {
        let lab = Path::new(env!("CARGO_MANIFEST_DIR"));
        let cache = tempfile::tempdir().unwrap();
        let e = prepare_nested_host(lab, Some(cache.path()), "/nonexistent/qemu").unwrap_err();
        assert!(matches!(e, ImageError::HostFailed { .. }), "{e:?}");
        assert!(
            e.to_string()
                .ends_with("build-nested-host: ERROR: /nonexistent/qemu not found: apt-get install qemu-system-x86"),
            "{e}"
        );
        assert_eq!(std::fs::read_dir(cache.path()).unwrap().count(), 0);
    }
}
