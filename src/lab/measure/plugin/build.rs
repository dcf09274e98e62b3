//! The plugin built (or found in the cache) for a QEMU by
//! `images/build-qemu-plugin.sh`.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::lab::measure::plugin::error::InsnsError;

/// Build (or find in the cache) the plugin for `qemu` with
/// `images/build-qemu-plugin.sh`; returns the shared object's path.
pub(crate) fn build_plugin(
    lab_dir: &Path,
    cache: Option<&Path>,
    qemu: &str,
) -> Result<PathBuf, InsnsError> {
    let script = lab_dir.join("images/build-qemu-plugin.sh");
    if !script.is_file() {
        return Err(InsnsError::BuildScriptMissing(script));
    }
    let mut cmd = Command::new("sh");
    cmd.arg(&script).arg("--qemu").arg(qemu);
    if let Some(c) = cache {
        cmd.arg("--cache").arg(c);
    }
    cmd.stderr(std::process::Stdio::piped());
    let out = cmd.output().map_err(|source| InsnsError::BuildScriptRun {
        script: script.clone(),
        source,
    })?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        let last = stderr
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no output");
        return Err(InsnsError::BuildFailed {
            last: last.to_string(),
            status: out.status.to_string(),
        });
    }
    let path = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or("")
        .trim()
        .to_string();
    if path.is_empty() || !Path::new(&path).is_file() {
        return Err(InsnsError::BuildNoPath {
            script,
            stderr: stderr.trim().to_string(),
        });
    }
    Ok(PathBuf::from(path))
}
