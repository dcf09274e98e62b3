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
    // Each row: run, IOPS, KiB/s, p50 us, p99 us, busy%, errors (fio's
    // figures for the run's direction, 4 KiB requests; busy% from the
    // guest's /proc/stat). No figure is held to a speed; each row is held
    // to what holds by construction.
    for row in ["randread-qd1", "randread-qd16", "randwrite-qd16", "verify"] {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(row))
            .unwrap_or_else(|| panic!("no {row} row in:\n{stdout}"));
        let f: Vec<i64> = line
            .split_whitespace()
            .skip(1)
            .map(|v| {
                v.parse()
                    .unwrap_or_else(|_| panic!("{row}: {v:?} is not a number in {line:?}"))
            })
            .collect();
        let [iops, kib_s, p50, p99, busy, errors] = f[..] else {
            panic!("{row}: not 6 figures in {line:?}");
        };
        assert!(iops > 0, "{row}: no IOPS in {line:?}");
        assert_eq!(errors, 0, "{row}: errors in {line:?}");
        // fio's bandwidth and IOPS are the same IOs over the same time:
        // 4 KiB each (to fio's integer rounding of both).
        assert!(
            (kib_s - 4 * iops).abs() <= 8 + kib_s / 100,
            "{row}: {kib_s} KiB/s is not 4 KiB x {iops} IOPS in {line:?}"
        );
        // Percentiles in order; busy a share of the guest's CPU time.
        assert!(0 <= p50 && p50 <= p99, "{row}: percentiles in {line:?}");
        assert!((0..=100).contains(&busy), "{row}: busy% in {line:?}");
    }
    assert!(
        stdout.contains("queue 0:") && stdout.contains("requests"),
        "{stdout}"
    );
    assert!(stdout.trim_end().ends_with("OK"), "{stdout}");
}
