//! Build the checked-out commit of the tree with images/build-tree.sh (the
//! `build:` kernels' configuration, incremental in the tree) into a kernel
//! directory of the bisection's output.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde::Deserialize;
use thiserror::Error;

/// Why the commit did not build; one line (the script's own messages went
/// to stderr).
#[derive(Debug, Error)]
pub enum BuildError {
    #[error("cannot run {}: {source}", script.display())]
    Spawn {
        script: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("waiting for build-tree.sh: {0}")]
    Wait(#[source] std::io::Error),
    /// The script failed and said why: its last `ERROR:` line.
    #[error("{said}")]
    Script { status: ExitStatus, said: String },
    /// The script failed without an `ERROR:` line.
    #[error("images/build-tree.sh failed ({status})")]
    Failed { status: ExitStatus },
    #[error("{}: {source}", path.display())]
    ManifestRead {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {source}", path.display())]
    ManifestParse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("built {built} but wanted {wanted} (did something else check out another commit?)")]
    WrongCommit { built: String, wanted: String },
}

/// A built candidate: what `path:` needs to boot it with its System.map.
#[derive(Debug, Clone)]
pub(crate) struct Built {
    pub(crate) vmlinuz: PathBuf,
    pub(crate) system_map: PathBuf,
    pub(crate) modules: Option<PathBuf>,
    pub(crate) kernel_version: String,
    pub(crate) seconds: Duration,
}

#[derive(Deserialize)]
struct Manifest {
    kernel_version: String,
    #[serde(default)]
    git_commit: Option<String>,
}

/// Build the tree's HEAD into `out`.
pub(crate) fn build(
    lab_dir: &Path,
    tree: &Path,
    out: &Path,
    jobs: Option<u32>,
    commit: &str,
) -> Result<Built, BuildError> {
    let script = lab_dir.join("images/build-tree.sh");
    let start = Instant::now();
    let mut cmd = Command::new("sh");
    cmd.arg(&script)
        .arg("--tree")
        .arg(tree)
        .arg("--out")
        .arg(out);
    if let Some(j) = jobs {
        cmd.arg("--jobs").arg(j.to_string());
    }
    let res = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| BuildError::Spawn {
            script: script.clone(),
            source,
        })?;
    // Pass the script's progress through, keeping its last ERROR line.
    let mut last_error = None;
    let mut child = res;
    if let Some(err) = child.stderr.take() {
        use std::io::BufRead;
        for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
            eprintln!("{line}");
            if let Some(i) = line.find("ERROR: ") {
                last_error = Some(line[i + 7..].to_string());
            }
        }
    }
    let status = child.wait().map_err(BuildError::Wait)?;
    if !status.success() {
        return Err(match last_error {
            Some(said) => BuildError::Script { status, said },
            None => BuildError::Failed { status },
        });
    }
    let manifest = out.join("manifest.json");
    let text = std::fs::read_to_string(&manifest).map_err(|source| BuildError::ManifestRead {
        path: manifest.clone(),
        source,
    })?;
    let m: Manifest = serde_json::from_str(&text).map_err(|source| BuildError::ManifestParse {
        path: manifest.clone(),
        source,
    })?;
    if m.git_commit.as_deref().is_some_and(|c| c != commit) {
        return Err(BuildError::WrongCommit {
            built: m.git_commit.unwrap_or_default(),
            wanted: commit.to_string(),
        });
    }
    let modules = out.join("lib/modules").join(&m.kernel_version);
    Ok(Built {
        vmlinuz: out.join("vmlinuz"),
        system_map: out.join("System.map"),
        modules: modules.is_dir().then_some(modules),
        kernel_version: m.kernel_version,
        seconds: start.elapsed(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_script_says_why_in_one_line() {
        let lab = tempfile::tempdir().unwrap();
        std::fs::create_dir(lab.path().join("images")).unwrap();
        let script = lab.path().join("images/build-tree.sh");
        let out = lab.path().join("out");
        std::fs::write(
            &script,
            "echo 'ERROR: no .config for this tree' >&2; exit 3\n",
        )
        .unwrap();
        let e = build(lab.path(), lab.path(), &out, None, "c0ffee").unwrap_err();
        assert!(
            matches!(&e, BuildError::Script { said, .. } if said == "no .config for this tree"),
            "{e:?}"
        );
        assert_eq!(e.to_string(), "no .config for this tree");
        std::fs::write(&script, "exit 4\n").unwrap();
        let e = build(lab.path(), lab.path(), &out, None, "c0ffee").unwrap_err();
        assert!(matches!(e, BuildError::Failed { .. }), "{e:?}");
        assert!(
            e.to_string().starts_with("images/build-tree.sh failed ("),
            "{e}"
        );
        // It succeeds but leaves no manifest.
        std::fs::write(&script, "exit 0\n").unwrap();
        let e = build(lab.path(), lab.path(), &out, None, "c0ffee").unwrap_err();
        assert!(matches!(e, BuildError::ManifestRead { .. }), "{e:?}");
    }
}
