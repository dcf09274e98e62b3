//! The reference qemu-storage-daemon: Debian 12's QEMU 7.2 build, fetched
//! and cached by `images/fetch-qsd.sh`, whatever QEMU the machine has
//! installed (the 10.0 daemon of bookworm-backports does well under half
//! 7.2's requests per CPU-second here, so ratios against it would flatter
//! blklab). `--qsd PATH` measures another daemon instead.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use super::BenchError;

/// `--qsd`: `auto` (the cached 7.2, fetched on first use) or a path.
pub(crate) fn resolve(spec: &str) -> Result<PathBuf, BenchError> {
    if spec != "auto" {
        return Ok(PathBuf::from(spec));
    }
    let lab = crate::lab::images::lab_dir(None).map_err(BenchError::NoLabDir)?;
    let script = lab.join("images/fetch-qsd.sh");
    let out = Command::new("sh")
        .arg(&script)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|source| BenchError::ScriptRun {
            script: script.clone(),
            source,
        })?;
    let path = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or("")
        .trim()
        .to_string();
    if !out.status.success() || path.is_empty() {
        return Err(BenchError::FetchQsd {
            script,
            status: out.status,
        });
    }
    Ok(PathBuf::from(path))
}
