//! The host (Rust, `blklab::lab::scenario`) and the guest
//! (`guest-scripts/run.sh --check`, awk) parse scenario files the same way:
//! the same document for every shipped scenario and good fixture, the same
//! `FILE:LINE: message` for every malformed one.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::root;
use serde_json::Value;

fn scn_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "scn"))
        .collect();
    v.sort();
    assert!(!v.is_empty(), "no .scn files in {}", dir.display());
    v
}

/// `run.sh --check FILE` under `shell`: Ok(document) or Err(error line).
fn guest_check(shell: &[&str], file: &Path) -> Result<Value, String> {
    let out = Command::new(shell[0])
        .args(&shell[1..])
        .arg("guest-scripts/run.sh")
        .arg("--check")
        .arg(file)
        .current_dir(root())
        .stdin(Stdio::null())
        .env_remove("BLKLAB_RUNTIME")
        .env_remove("BLKLAB_RAMP")
        .env_remove("BLKLAB_VARIANTS")
        .output()
        .expect("run run.sh");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        Ok(serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
            panic!(
                "--check {} printed non-JSON ({e}): {stdout}",
                file.display()
            )
        }))
    } else {
        assert_eq!(out.status.code(), Some(2), "{}: {stdout}", file.display());
        let line = stdout
            .lines()
            .find_map(|l| l.strip_prefix("BLKLAB-ERROR "))
            .unwrap_or_else(|| panic!("no BLKLAB-ERROR line: {stdout}"));
        Err(line.to_string())
    }
}

fn host_check(file: &Path) -> Result<Value, String> {
    let text = std::fs::read_to_string(file).unwrap();
    let stem = file.file_stem().unwrap().to_string_lossy().into_owned();
    blklab::lab::scenario::parse(&text, &file.display().to_string(), &stem)
        .map(|s| serde_json::to_value(s).unwrap())
        .map_err(|e| e.to_string())
}

/// dash and busybox sh (the initramfs's shell); a missing busybox fails
/// the test with its install command.
fn shells() -> Vec<Vec<&'static str>> {
    common::tools::require_busybox();
    vec![vec!["sh"], vec!["busybox", "sh"]]
}

fn agree(file: &Path) {
    let host = host_check(file);
    for sh in shells() {
        let guest = guest_check(&sh, file);
        assert_eq!(
            host,
            guest,
            "{}: host and guest ({}) disagree",
            file.display(),
            sh.join(" ")
        );
    }
}

#[test]
fn shipped_scenarios_parse_identically() {
    for f in scn_files(&root().join("guest-scripts/scenarios")) {
        let host = host_check(&f);
        assert!(host.is_ok(), "{}: {host:?}", f.display());
        agree(&f);
    }
}

#[test]
fn fixtures_parse_or_fail_identically() {
    let files = scn_files(&root().join("tests/fixtures/scenarios"));
    let mut failures = 0;
    for f in &files {
        if host_check(f).is_err() {
            failures += 1;
        }
        agree(f);
    }
    // Every fixture but the good-* ones is malformed: each must fail, on
    // both sides.
    let good = files
        .iter()
        .filter(|f| f.file_name().unwrap().to_string_lossy().starts_with("good"))
        .count();
    assert_eq!(
        failures,
        files.len() - good,
        "{failures} of {}",
        files.len()
    );
}
