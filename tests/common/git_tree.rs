//! A git tree for `blklab bisect`'s tests: git with fixed names and dates,
//! commits of everything, and `blklab bisect` run on it.

use std::path::Path;
use std::process::{Command, Output, Stdio};

pub(crate) fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("LC_ALL", "C")
        .env("GIT_AUTHOR_NAME", "blklab test")
        .env("GIT_AUTHOR_EMAIL", "test@blklab.invalid")
        .env("GIT_COMMITTER_NAME", "blklab test")
        .env("GIT_COMMITTER_EMAIL", "test@blklab.invalid")
        .env("GIT_AUTHOR_DATE", "2026-01-01T00:00:00Z")
        .env("GIT_COMMITTER_DATE", "2026-01-01T00:00:00Z")
        .output()
        .expect("run git");
    assert!(
        out.status.success(),
        "git {args:?} in {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

pub(crate) fn bisect(args: &[&str]) -> Output {
    Command::new(super::blklab_bin())
        .arg("bisect")
        .args(args)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .output()
        .expect("run blklab bisect")
}

pub(crate) fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The last line of stderr: the one-line error.
pub(crate) fn error_line(o: &Output) -> String {
    stderr(o).lines().last().unwrap_or_default().to_string()
}

pub(crate) fn append(path: &Path, text: &str) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    f.write_all(text.as_bytes()).unwrap();
}

pub(crate) fn commit_all(dir: &Path, message: &str) -> String {
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", message]);
    git(dir, &["rev-parse", "HEAD"])
}
