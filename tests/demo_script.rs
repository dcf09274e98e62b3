//! `images/demo.sh`, the README's quicker single-guest demo, run for real
//! (short fio runs) so it stays true: it builds blklab, boots a Debian guest
//! on a blklab disk, runs fio and must print the result table and exit 0.
//! (The README's first command, `blklab run`, is tests/lab_run.rs's
//! `default_run_builds_the_pair_and_reports`.)

mod common;

use std::process::Command;

#[test]
fn readme_demo_runs() {
    let root = common::root();
    let out = Command::new("bash")
        .arg(root.join("images/demo.sh"))
        .args(["--runtime", "1"])
        .current_dir(&root)
        .output()
        .expect("run images/demo.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "demo failed: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    for row in ["randread-qd1", "randread-qd16", "randwrite-qd16", "verify"] {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(row))
            .unwrap_or_else(|| panic!("no {row} row in:\n{stdout}"));
        let iops: u64 = line
            .split_whitespace()
            .nth(1)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        assert!(iops > 0, "{row}: no IOPS in {line:?}");
        assert!(line.trim_end().ends_with(" 0"), "{row}: errors in {line:?}");
    }
    assert!(
        stdout.contains("queue 0:") && stdout.contains("requests"),
        "{stdout}"
    );
    assert!(stdout.trim_end().ends_with("OK"), "{stdout}");
}
