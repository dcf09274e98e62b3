//! Why the plugin could not be built, reached, or its output read.

use std::path::PathBuf;

use thiserror::Error;

/// The plugin's error, by what failed: its build, its control socket, or
/// reading a dump or a symbol map.
#[derive(Debug, Error)]
pub enum InsnsError {
    #[error("cannot build the QEMU plugin: {} is missing", .0.display())]
    BuildScriptMissing(PathBuf),
    #[error("cannot build the QEMU plugin: cannot run {}: {source}", script.display())]
    BuildScriptRun {
        script: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot build the QEMU plugin: {last} ({status})")]
    BuildFailed { last: String, status: String },
    #[error(
        "cannot build the QEMU plugin: {} printed no plugin path (stderr: {stderr})",
        script.display()
    )]
    BuildNoPath { script: PathBuf, stderr: String },
    #[error("cannot reach the instruction-count plugin at {path}: {source}")]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the instruction-count plugin at {path} failed: {why}")]
    Plugin { path: PathBuf, why: String },
    #[error("the instruction-count plugin at {path} failed: {source}")]
    PluginIo {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}: {why}")]
    Parse {
        path: PathBuf,
        line: usize,
        why: String,
    },
}
