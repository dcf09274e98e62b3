//! Build the checked-out commit of the tree with images/build-tree.sh (the
//! `build:` kernels' configuration, incremental in the tree) into a kernel
//! directory of the bisection's output.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::Deserialize;

/// A built candidate: what `path:` needs to boot it with its System.map.
#[derive(Debug, Clone)]
pub struct Built {
    pub dir: PathBuf,
    pub vmlinuz: PathBuf,
    pub system_map: PathBuf,
    pub modules: Option<PathBuf>,
    pub kernel_version: String,
    pub seconds: Duration,
}

#[derive(Deserialize)]
struct Manifest {
    kernel_version: String,
    #[serde(default)]
    git_commit: Option<String>,
}

/// Build the tree's HEAD into `out`; the error is one line (the script's
/// own ERROR line when it has one; its messages went to our stderr).
pub fn build(
    lab_dir: &Path,
    tree: &Path,
    out: &Path,
    jobs: Option<u32>,
    commit: &str,
) -> Result<Built, String> {
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
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
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
    let status = child
        .wait()
        .map_err(|e| format!("waiting for build-tree.sh: {e}"))?;
    if !status.success() {
        return Err(last_error.unwrap_or_else(|| format!("images/build-tree.sh failed ({status})")));
    }
    let text = std::fs::read_to_string(out.join("manifest.json"))
        .map_err(|e| format!("{}: {e}", out.join("manifest.json").display()))?;
    let m: Manifest = serde_json::from_str(&text)
        .map_err(|e| format!("{}: {e}", out.join("manifest.json").display()))?;
    if m.git_commit.as_deref().is_some_and(|c| c != commit) {
        return Err(format!(
            "built {} but wanted {commit} (did something else check out another commit?)",
            m.git_commit.unwrap_or_default()
        ));
    }
    let modules = out.join("lib/modules").join(&m.kernel_version);
    Ok(Built {
        vmlinuz: out.join("vmlinuz"),
        system_map: out.join("System.map"),
        modules: modules.is_dir().then_some(modules),
        kernel_version: m.kernel_version,
        dir: out.to_path_buf(),
        seconds: start.elapsed(),
    })
}
