//! `blklab compare` on recorded runs (tests/fixtures/runs/, trimmed copies
//! of real `blklab run` output made with tests/fixtures/runs/trim.py):
//!
//! - `aa/`: `blklab run --kernel debian-6.12 --kernel debian-6.12
//!   --scenario smoke --iterations 3 --runtime 1 --accel tcg` — one kernel
//!   against itself, interleaved;
//! - `slow/`: `blklab run --kernel debian-6.12 --scenario smoke
//!   --iterations 3 --runtime 1 --accel tcg --latency 2ms` — the same
//!   kernel on a disk with 2 ms emulated latency.
//!
//! The statistics themselves are unit-tested against textbook values in
//! src/report/stats.rs.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    common::root().join("tests/fixtures/runs").join(name)
}

fn compare(args: &[&str]) -> Output {
    Command::new(common::blklab_bin())
        .arg("compare")
        .args(args)
        .output()
        .expect("run blklab compare")
}

fn ok_stdout(o: &Output) -> String {
    assert!(
        o.status.success(),
        "blklab compare failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn err_text(o: &Output) -> String {
    assert!(!o.status.success(), "expected a failure");
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The two kernel labels of the A/A fixture.
fn aa_labels() -> (String, String) {
    let run = common::read_json(&fixture("aa/run.json"));
    let k = run["kernels"].as_array().unwrap();
    (
        k[0]["label"].as_str().unwrap().to_string(),
        k[1]["label"].as_str().unwrap().to_string(),
    )
}

fn arg(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn a_kernel_against_itself_has_no_significant_row() {
    let dir = fixture("aa");
    let out = ok_stdout(&compare(&[
        arg(&dir),
        "--metric",
        "all",
        "--format",
        "json",
    ]));
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["schema"], "blklab-compare/1");
    let rows = report["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    // Rows in the scenario's variant order.
    assert_eq!(rows[0]["variant"], "read");
    assert_eq!(rows[1]["variant"], "write");
    let mut compared = 0;
    for row in rows {
        for (k, c) in row["metrics"].as_object().unwrap() {
            assert_eq!(c["significant"], false, "{}: {k}: {c}", row["variant"]);
            assert_eq!(c["a"]["n"], 3);
            assert_eq!(c["b"]["n"], 3);
            assert!(c["ci_pct"]["lo"].as_f64().unwrap() <= c["ci_pct"]["hi"].as_f64().unwrap());
            compared += 1;
        }
    }
    assert!(compared >= 20, "{compared} comparisons");
    // The table shows each side's noise.
    let table = ok_stdout(&compare(&[arg(&dir)]));
    assert!(table.contains("cv"), "{table}");
    assert!(
        !table.lines().any(|l| l.trim_end().ends_with(" *")),
        "{table}"
    );
}

#[test]
fn markdown_csv_and_json_are_well_formed() {
    let dir = fixture("aa");
    let md = ok_stdout(&compare(&[arg(&dir), "--format", "markdown"]));
    assert!(md.starts_with("### blklab: "), "{md}");
    let tables: Vec<&str> = md.lines().filter(|l| l.starts_with('|')).collect();
    // 4 default metrics × (header + separator + 2 rows).
    assert_eq!(tables.len(), 16, "{md}");
    let cols = tables[0].matches('|').count();
    for l in &tables {
        assert_eq!(
            l.matches('|').count() - l.matches("\\|").count(),
            cols,
            "{l}"
        );
    }
    assert!(tables[1].starts_with("|---|---|---:|"), "{}", tables[1]);

    let csv = ok_stdout(&compare(&[arg(&dir), "--format", "csv"]));
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    assert_eq!(header.len(), 25);
    assert_eq!(header[0], "scenario");
    assert!(header.contains(&"delta_pct") && header.contains(&"p_value"));
    let body: Vec<&str> = lines.collect();
    assert!(body.len() >= 20, "{csv}");
    for l in &body {
        let f: Vec<&str> = l.split(',').collect();
        assert_eq!(f.len(), 25, "{l}");
        let i = header.iter().position(|h| *h == "a_mean").unwrap();
        f[i].parse::<f64>()
            .unwrap_or_else(|_| panic!("a_mean in {l}"));
        let s = header.iter().position(|h| *h == "significant").unwrap();
        assert_eq!(f[s], "false", "{l}");
    }

    let json = ok_stdout(&compare(&[
        arg(&dir),
        "--format",
        "json",
        "--metric",
        "iops,lat_p99_us",
    ]));
    let v: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["metrics"], serde_json::json!(["iops", "lat_p99_us"]));
}

#[test]
fn html_page_and_svg_plots_parse_and_hold_both_series() {
    let dir = fixture("aa");
    let out = tempfile::tempdir().unwrap();
    ok_stdout(&compare(&[arg(&dir), "--out", arg(out.path())]));
    let (a, b) = aa_labels();
    let html = std::fs::read_to_string(out.path().join("report.html")).unwrap();
    assert!(html.contains("<img src=\"plots/metric-guest_busy_pct.svg\""));
    let plots: Vec<PathBuf> = std::fs::read_dir(out.path().join("plots"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    // 4 metric plots + per variant a latency and a requests-per-kick plot.
    assert_eq!(plots.len(), 8, "{plots:?}");
    for p in &plots {
        let text = std::fs::read_to_string(p).unwrap();
        let doc = roxmltree::Document::parse(&text)
            .unwrap_or_else(|e| panic!("{} is not XML: {e}", p.display()));
        assert_eq!(doc.root_element().tag_name().name(), "svg");
        let texts: Vec<String> = doc
            .descendants()
            .filter(|n| n.tag_name().name() == "text")
            .filter_map(|n| n.text().map(|t| t.trim().to_string()))
            .collect();
        assert!(
            texts.contains(&format!("A {a}")),
            "{}: {texts:?}",
            p.display()
        );
        assert!(
            texts.contains(&format!("B {b}")),
            "{}: {texts:?}",
            p.display()
        );
        let name = p.file_name().unwrap().to_string_lossy();
        if name.starts_with("metric-") {
            // Two bars per variant, plus the two legend swatches.
            let rects = doc
                .descendants()
                .filter(|n| n.tag_name().name() == "rect")
                .count();
            assert!(rects >= 2 * 2 + 2, "{name}: {rects} rects");
        } else {
            // Two overlaid curves.
            let lines = doc
                .descendants()
                .filter(|n| n.tag_name().name() == "polyline")
                .count();
            assert!(lines >= 2, "{name}: {lines} polylines");
        }
    }
    for f in ["report.txt", "report.md", "report.csv", "report.json"] {
        assert!(out.path().join(f).is_file(), "{f}");
    }
}

#[test]
fn a_different_backend_is_refused_unless_forced() {
    let (a, _) = aa_labels();
    let side_a = format!("{}:{a}", fixture("aa").display());
    let slow = fixture("slow");
    let e = err_text(&compare(&[&side_a, arg(&slow)]));
    assert!(
        e.contains("differ in more than the kernel") && e.contains("backend configuration"),
        "{e}"
    );
    let out = ok_stdout(&compare(&[
        &side_a,
        arg(&slow),
        "--force",
        "--format",
        "json",
        "--metric",
        "iops,lat_p50_us",
    ]));
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["forced"], true);
    assert!(v["differences"]
        .as_array()
        .unwrap()
        .iter()
        .any(|d| d["what"] == "backend configuration" && d["blocking"] == true));
    // 2 ms per request at queue depth 4 caps IOPS near 2000 (a drop the
    // TCG noise of side A, cv up to 45 %, keeps from being called with 3
    // samples), and puts every completion above 2 ms: that one is certain.
    for row in v["rows"].as_array().unwrap() {
        let iops = &row["metrics"]["iops"];
        assert!(iops["delta_pct"].as_f64().unwrap() < -30.0, "{iops}");
        assert!(iops["b"]["mean"].as_f64().unwrap() < 2100.0, "{iops}");
        let p50 = &row["metrics"]["lat_p50_us"];
        assert!(p50["b"]["mean"].as_f64().unwrap() > 2000.0, "{p50}");
        assert_eq!(p50["significant"], true, "{p50}");
        assert!(p50["ci_pct"]["lo"].as_f64().unwrap() > 100.0, "{p50}");
    }
    // The table lists what differs.
    let table = ok_stdout(&compare(&[&side_a, arg(&slow), "--force"]));
    assert!(
        table.contains("besides the kernel, the sides differ in:"),
        "{table}"
    );
    assert!(table.contains("backend configuration (forced)"), "{table}");
    // Only the fields that differ.
    assert!(table.contains("latency"), "{table}");
    assert!(!table.contains("max_discard_sectors"), "{table}");
}

#[test]
fn mismatched_scenario_sets_and_empty_inputs_are_clear_errors() {
    // A copy of the A/A run without B's write results.
    let tmp = tempfile::tempdir().unwrap();
    let (_, b) = aa_labels();
    for e in std::fs::read_dir(fixture("aa")).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with(&format!("{b}.smoke.write.")) {
            continue;
        }
        std::fs::copy(&p, tmp.path().join(&name)).unwrap();
    }
    let e = err_text(&compare(&[arg(tmp.path())]));
    assert!(
        e.contains("different scenario sets") && e.contains("only in A: [smoke/write]"),
        "{e}"
    );
    let out = ok_stdout(&compare(&[arg(tmp.path()), "--force", "--format", "json"]));
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["rows"].as_array().unwrap().len(), 1);

    let empty = tempfile::tempdir().unwrap();
    let e = err_text(&compare(&[arg(empty.path())]));
    assert!(e.contains("not a directory written by `blklab run`"), "{e}");
    std::fs::copy(fixture("aa/run.json"), empty.path().join("run.json")).unwrap();
    let e = err_text(&compare(&[arg(empty.path())]));
    assert!(e.contains("has no results"), "{e}");
    let e = err_text(&compare(&[arg(&fixture("aa")), "--metric", "bogus"]));
    assert!(e.contains("unknown metric \"bogus\""), "{e}");
    let e = err_text(&compare(&[
        &format!("{}:nokernel", fixture("aa").display()),
        arg(&fixture("slow")),
    ]));
    assert!(e.contains("has no kernel \"nokernel\""), "{e}");
    let e = err_text(&compare(&[arg(&fixture("slow"))]));
    assert!(e.contains("holds 1"), "{e}");
}
