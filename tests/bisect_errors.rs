//! `blklab bisect`'s refusals, before anything is built: revisions that
//! do not exist, a directory that is not git, good == bad, good not an
//! ancestor of bad, a dirty tree, unknown metric, scenario or variant, a
//! scenario of several variants without `--variant`, a malformed
//! `--threshold`. On a tiny git tree; no kernel, no guest, under a second.
//! (The bisection itself is `tests/bisect.rs`.)

mod common;

use std::path::Path;

use common::git_tree::{append, bisect, commit_all, error_line, git, stderr};

/// A tiny git tree that looks like a kernel tree to the checks (Makefile,
/// Kconfig, arch/x86), with two commits.
fn small_tree(dir: &Path) -> (String, String) {
    std::fs::create_dir_all(dir.join("arch/x86")).unwrap();
    std::fs::write(dir.join("Makefile"), "VERSION = 6\nPATCHLEVEL = 12\n").unwrap();
    std::fs::write(dir.join("Kconfig"), "").unwrap();
    std::fs::write(dir.join("arch/x86/Kconfig"), "").unwrap();
    git(dir, &["init", "-q", "-b", "main"]);
    let a = commit_all(dir, "one");
    append(&dir.join("Kconfig"), "# two\n");
    let b = commit_all(dir, "two");
    (a, b)
}

#[test]
fn bad_input_is_refused_before_anything_is_built() {
    // Outside any git work tree (target/ is inside this repository's).
    let work = std::env::temp_dir().join(format!("blklab-bisect-errors-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    let tree = work.join("tree");
    std::fs::create_dir_all(&tree).unwrap();
    let (a, b) = small_tree(&tree);
    let out = work.join("out");
    let t = tree.to_str().unwrap().to_string();
    let o = out.to_str().unwrap().to_string();
    let base = |good: &str, bad: &str| -> Vec<String> {
        [
            "--git",
            &t,
            "--good",
            good,
            "--bad",
            bad,
            "--scenario",
            "plug-qd1",
            "--variant",
            "mq-deadline-10k",
            "--out",
            &o,
            "--no-progress",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let check = |args: Vec<String>, want: &str| {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let r = bisect(&refs);
        assert!(!r.status.success(), "{args:?} succeeded");
        let line = error_line(&r);
        assert!(
            line.starts_with("blklab: error: "),
            "{args:?}: {}",
            stderr(&r)
        );
        assert!(line.contains(want), "{args:?}: want {want:?} in {line:?}");
        assert!(!out.join("kernels").exists(), "{args:?} built something");
    };
    check(
        base("v0.0-nope", "main"),
        "--good \"v0.0-nope\": no such commit",
    );
    check(base(&a, "nope"), "--bad \"nope\": no such commit");
    check(base(&a, &a), "are the same commit");
    check(base("main", &a), "is not an ancestor of --bad");
    let mut notgit = base(&a, &b);
    notgit[1] = work.display().to_string();
    check(notgit, "not a git work tree");
    let mut metric = base(&a, &b);
    metric.extend(["--metric".into(), "speed".into()]);
    check(metric, "--metric \"speed\": no such metric");
    let mut scen = base(&a, &b);
    scen[7] = "no-such-scenario".into();
    check(scen, "no-such-scenario");
    let mut variant = base(&a, &b);
    variant[9] = "fast".into();
    check(
        variant,
        "--variant \"fast\": scenario plug-qd1 has no such variant",
    );
    let mut none = base(&a, &b);
    none.truncate(8);
    none.extend(["--out".into(), o.clone()]);
    check(none, "choose the one that decides with --variant");
    let mut th = base(&a, &b);
    th.extend(["--threshold".into(), "lots".into()]);
    let refs: Vec<&str> = th.iter().map(String::as_str).collect();
    let r = bisect(&refs);
    assert!(!r.status.success());
    assert!(stderr(&r).contains("invalid --threshold"), "{}", stderr(&r));
    append(&tree.join("Makefile"), "# local change\n");
    check(
        base(&a, &b),
        "has uncommitted changes to tracked files (Makefile)",
    );
    let _ = std::fs::remove_dir_all(&work);
}
