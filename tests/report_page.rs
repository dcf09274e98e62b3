//! `report.html` in a real browser (Debian's headless Chromium; see
//! tests/common/browser.rs): pages of every kind of comparison, rendered
//! by `blklab compare --out` from recorded runs (tests/fixtures/, the runs
//! tests/compare.rs describes), load from a file URL without a console
//! message, hold real tables that sort, a table of contents, drawn plots
//! and every number of their report.json; `--screenshot` draws one.

mod common;

use std::path::Path;
use std::process::Command;

fn compare_into(out: &Path, args: &[&str]) {
    let o = Command::new(common::blklab_bin())
        .arg("compare")
        .args(args)
        .arg("--out")
        .arg(out)
        .output()
        .expect("run blklab compare");
    assert!(
        o.status.success(),
        "blklab compare {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn fixture(rel: &str) -> String {
    common::root()
        .join("tests/fixtures")
        .join(rel)
        .display()
        .to_string()
}

#[test]
fn every_kind_of_report_page_works_in_a_real_browser() {
    let aa = fixture("runs/aa");
    let pairs = fixture("runs/pairs");
    let qd1 = fixture("insns/plug-qd1");
    let three = fixture("runs/three");
    let (tested, noplug) = (format!("{three}:6.12"), format!("{three}:6.12-noplug"));
    let cases: [(&str, Vec<&str>); 5] = [
        // Two kernels, no instruction counts.
        ("kernels", vec![&aa]),
        // Two kernels beside the run's A/A pair: the floor by each delta.
        ("floor", vec![&tested, &noplug]),
        // Two kernels with the differential instruction profile.
        ("profile", vec![&qd1]),
        // Variant pairs on one kernel.
        (
            "pairs",
            vec![&pairs, "--pair", "read:write", "--pair", "read:read-again"],
        ),
        // The difference in differences, with each kernel's profile.
        ("did", vec![&qd1, "--pair", "none-10k:mq-deadline-10k"]),
    ];
    // Each page in its own thread: a browser mostly waits while it starts,
    // so the pages load side by side. A failing page's panic is re-raised
    // with its own message.
    let out = tempfile::tempdir().unwrap();
    std::thread::scope(|scope| {
        let checks: Vec<_> = cases
            .iter()
            .map(|(name, args)| {
                let dir = out.path().join(name);
                scope.spawn(move || {
                    compare_into(&dir, args);
                    common::browser::check_report_page(&dir);
                })
            })
            .collect();
        for check in checks {
            check
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        }
    });
}

#[test]
fn a_screenshot_is_drawn_beside_the_page() {
    common::browser::chromium();
    let out = tempfile::tempdir().unwrap();
    compare_into(out.path(), &[&fixture("runs/aa"), "--screenshot"]);
    let png = std::fs::read(out.path().join("report.png")).expect("report.png");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    // Width and height from the IHDR chunk: the page's layout width, and
    // the whole page rather than one window of it.
    let w = u32::from_be_bytes(png[16..20].try_into().unwrap());
    let h = u32::from_be_bytes(png[20..24].try_into().unwrap());
    assert_eq!(w, 1400);
    assert!(h > 1500, "{h} px high");
}
