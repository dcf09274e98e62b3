//! `blklab compare` on recorded runs (tests/fixtures/runs/, trimmed copies
//! of real `blklab run` output made with tests/fixtures/runs/trim.py):
//!
//! - `aa/`: `blklab run --kernel debian-6.12 --kernel debian-6.12
//!   --scenario smoke --iterations 3 --runtime 1 --accel tcg` — one kernel
//!   against itself, interleaved;
//! - `slow/`: `blklab run --kernel debian-6.12 --scenario smoke
//!   --iterations 3 --runtime 1 --accel tcg --latency 2ms` — the same
//!   kernel on a disk with 2 ms emulated latency;
//! - `pairs/`: `aa/` seen as one kernel with four variants (made by
//!   tests/fixtures/runs/make-pairs.py): the second label's records become
//!   the variants `read-again` and `write-again`, defined exactly as `read`
//!   and `write` — identically defined variants with independent samples;
//! - `three/`: `blklab run --kernel build:6.12 --kernel build:6.12
//!   --kernel build:6.12+noplug --scenario smoke --iterations 3 --runtime 1
//!   --accel tcg --count-insns off` on a 2-core machine busy with other
//!   runs (hence its spread) — a kernel under test beside an A/A pair
//!   (`6.12`, `6.12-2`: one image, the same sha256 in run.json);
//! - `../insns/plug-qd1/` (tests/insns.rs): 6.12 and 6.12-noplug, the
//!   scheduler pair none/mq-deadline at queue depth 1, with instruction
//!   profiles.
//!
//! The statistics themselves are unit-tested against textbook and
//! hand-computed values in src/report/inference.rs.

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
    // The plots are inline, each in its metric's section (and in plots/).
    let section = html
        .split("<section id=\"metric-guest_busy_pct\">")
        .nth(1)
        .expect("the guest busy section");
    let section = &section[..section.find("</section>").unwrap()];
    assert!(section.contains("<table id=\"metric-table-guest_busy_pct\""));
    assert!(section.contains("<svg role=\"img\""), "{section}");
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

/// `blklab compare DIR:KERNEL DIR:KERNEL --format json --metric all`.
fn json_report(dir: &Path, a: &str, b: &str) -> Value {
    let side = |k: &str| format!("{}:{k}", dir.display());
    let args = [&side(a), &side(b), "--metric", "all", "--format", "json"];
    serde_json::from_str(&ok_stdout(&compare(&args))).unwrap()
}

/// A run with an A/A pair (two labels of one kernel) beside the kernel
/// under test: every row of 6.12 against 6.12-noplug carries the pair's
/// difference, which is exactly the delta and interval of the pair's own
/// comparison; a delta no larger than it is marked within the floor; the
/// pair's own comparison reads A/A.
#[test]
fn a_run_with_an_aa_pair_shows_its_floor_beside_each_delta() {
    let dir = fixture("three");
    let ab = json_report(&dir, "6.12", "6.12-noplug");
    let pair = &ab["aa_pair"];
    assert_eq!(
        (&pair["first"], &pair["second"]),
        (&"6.12".into(), &"6.12-2".into())
    );
    assert_eq!(pair["this_comparison"], false);
    let same = pair["same_kernel"].as_str().unwrap();
    assert!(
        same.contains("build:6.12") && same.contains("vmlinuz_sha256 "),
        "{same}"
    );
    let aa = json_report(&dir, "6.12", "6.12-2");
    assert_eq!(aa["aa_pair"]["this_comparison"], true);
    // (row, metric) → within the floor, for every metric of every row.
    let mut within = std::collections::BTreeMap::new();
    for (row, own) in ab["rows"]
        .as_array()
        .unwrap()
        .iter()
        .zip(aa["rows"].as_array().unwrap())
    {
        assert_eq!(row["variant"], own["variant"]);
        assert!(own.get("aa_floor").is_none(), "{own}");
        let floors = row["aa_floor"].as_object().unwrap();
        assert_eq!(floors.len(), row["metrics"].as_object().unwrap().len());
        for (k, f) in floors {
            let c = &own["metrics"][k];
            assert_eq!(f["diff_pct"], c["delta_pct"], "{k}");
            assert_eq!(f["ci_pct"], c["ci_pct"], "{k}");
            assert_eq!(f["method"], c["method"], "{k}");
            assert_eq!(f["n"], serde_json::json!([c["a"]["n"], c["b"]["n"]]));
            let delta = row["metrics"][k]["delta_pct"].as_f64().unwrap();
            let w = delta.abs() <= f["diff_pct"].as_f64().unwrap().abs();
            assert_eq!(f["within"], w, "{k}: {delta} against {f}");
            within.insert((row["variant"].as_str().unwrap().to_string(), k.clone()), w);
        }
    }
    assert!(within.values().any(|w| *w) && within.values().any(|w| !*w));
    // The verdict calls no change within the floor an effect.
    for (v, row) in ab["verdict"]
        .as_array()
        .unwrap()
        .iter()
        .zip(ab["rows"].as_array().unwrap())
    {
        for c in v["changes"].as_array().unwrap() {
            let k = c["metric"].as_str().unwrap();
            assert_eq!(row["aa_floor"][k]["within"], false, "{v}");
        }
    }
    // The table: the floor and its interval beside each delta, and the
    // mark of a delta within it.
    let table = ok_stdout(&compare(&[
        &format!("{}:6.12", dir.display()),
        &format!("{}:6.12-noplug", dir.display()),
    ]));
    let heads: Vec<&str> = table
        .lines()
        .filter(|l| l.starts_with("scenario/"))
        .collect();
    assert!(!heads.is_empty());
    for h in &heads {
        assert!(h.contains("A/A floor") && h.contains("A/A 95% CI"), "{h}");
    }
    // Its sections: the default metrics, in order, each with every row.
    let lines: Vec<&str> = table.lines().filter(|l| l.starts_with("smoke/")).collect();
    let rows = ab["rows"].as_array().unwrap();
    let shown = [
        "guest_busy_pct",
        "guest_cpu_us_per_io",
        "iops",
        "host_vcpu_us_per_io",
    ];
    assert_eq!(lines.len(), shown.len() * rows.len(), "{table}");
    for (i, line) in lines.iter().enumerate() {
        let row = &rows[i % rows.len()];
        let variant = row["variant"].as_str().unwrap();
        assert!(line.starts_with(&format!("smoke/{variant} ")), "{line}");
        let key = shown[i / rows.len()];
        let floor = row["aa_floor"][key]["diff_pct"].as_f64().unwrap();
        assert!(line.contains(&format!(" {floor:+.1}% ")), "{key}: {line}");
        let w = within[&(variant.to_string(), key.to_string())];
        assert_eq!(line.ends_with("  within A/A floor"), w, "{key}: {line}");
    }
    assert!(
        table.contains("A/A floor = this run's A/A pair, 6.12-2 against 6.12"),
        "{table}"
    );
    // Markdown and CSV carry it too.
    let md = ok_stdout(&compare(&[
        &format!("{}:6.12", dir.display()),
        &format!("{}:6.12-noplug", dir.display()),
        "--format",
        "markdown",
    ]));
    assert!(
        md.contains("| A/A floor | A/A 95% CI |") && md.contains("within A/A floor"),
        "{md}"
    );
    let csv = ok_stdout(&compare(&[
        &format!("{}:6.12", dir.display()),
        &format!("{}:6.12-noplug", dir.display()),
        "--format",
        "csv",
    ]));
    let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    assert_eq!(header.len(), 29);
    assert_eq!(
        header[25..],
        [
            "aa_floor_pct",
            "aa_ci_lo_pct",
            "aa_ci_hi_pct",
            "within_aa_floor"
        ]
    );
    // The page's table of each metric has the floor's columns and marks.
    let out = tempfile::tempdir().unwrap();
    ok_stdout(&compare(&[
        &format!("{}:6.12", dir.display()),
        &format!("{}:6.12-noplug", dir.display()),
        "--out",
        arg(out.path()),
    ]));
    let html = std::fs::read_to_string(out.path().join("report.html")).unwrap();
    let iops = html
        .split("<table id=\"metric-table-iops\"")
        .nth(1)
        .expect("the IOPS table");
    let iops = &iops[..iops.find("</table>").unwrap()];
    assert!(
        iops.contains("A/A floor (%)") && iops.contains("A/A CI high (%)"),
        "{iops}"
    );
    let w = within
        .iter()
        .filter(|((_, k), w)| k == "iops" && **w)
        .count();
    assert_eq!(iops.matches("within the A/A floor").count(), w, "{iops}");
    // The pair's own comparison is the floor, not a finding.
    let own = ok_stdout(&compare(&[
        &format!("{}:6.12", dir.display()),
        &format!("{}:6.12-2", dir.display()),
    ]));
    for h in own.lines().filter(|l| l.starts_with("scenario/")) {
        assert!(!h.contains("A/A"), "no floor column: {h}");
    }
    for l in own.lines().filter(|l| l.starts_with("smoke/")) {
        assert!(l.ends_with("  A/A") || l.ends_with("  n<3"), "{l}");
    }
    assert!(
        own.contains("  smoke/read (A/A)\n    A/A: both sides are one kernel"),
        "{own}"
    );
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

/// Every comparison of a report's rows (pairs on one kernel: `metrics`;
/// two kernels with pairs: each kernel's effect and the DiD).
fn all_cells(v: &Value) -> Vec<(String, String, Value)> {
    let mut out = Vec::new();
    for row in v["rows"].as_array().unwrap() {
        let name = format!("{}", row["pair"]);
        for (k, c) in row["metrics"].as_object().unwrap() {
            out.push((name.clone(), k.clone(), c.clone()));
        }
        if let Some(d) = row["did"].as_object() {
            for (k, c) in d {
                for part in ["a", "b", "did"] {
                    out.push((name.clone(), format!("{k}.{part}"), c[part].clone()));
                }
            }
        }
    }
    out
}

#[test]
fn variant_pairs_compare_other_against_base_on_one_kernel() {
    let dir = fixture("pairs");
    let out = ok_stdout(&compare(&[
        arg(&dir),
        "--pair",
        "read:write",
        "--format",
        "json",
        "--metric",
        "guest_sys_pct,iops,lat_p50_us",
    ]));
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["schema"], "blklab-compare/1");
    assert_eq!(v["mode"], "variants");
    assert_eq!(v["pairs"], serde_json::json!(["read:write"]));
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["pair"]["base"], "smoke/read");
    assert_eq!(rows[0]["pair"]["other"], "smoke/write");
    assert_eq!(rows[0]["labels_other"]["iotype"], "randwrite");
    // A is the base variant's records, B the other's: the means are those
    // of the records, computed here from the fixture files.
    let mean = |variant: &str, f: &dyn Fn(&Value) -> f64| {
        let v: Vec<f64> = (0..3)
            .map(|i| {
                f(&common::read_json(
                    &dir.join(format!("debian-6.12.smoke.{variant}.{i:02}.json")),
                ))
            })
            .collect();
        v.iter().sum::<f64>() / 3.0
    };
    let sys = |r: &Value| r["guest"]["cpu"]["all"]["sys"].as_f64().unwrap();
    let c = &rows[0]["metrics"]["guest_sys_pct"];
    assert!(
        (c["a"]["mean"].as_f64().unwrap() - mean("read", &sys)).abs() < 1e-9,
        "{c}"
    );
    assert!(
        (c["b"]["mean"].as_f64().unwrap() - mean("write", &sys)).abs() < 1e-9,
        "{c}"
    );
    assert_ne!(mean("read", &sys), mean("write", &sys));
    // The definitions differ by design: listed, not refused.
    let d = v["differences"].as_array().unwrap();
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0]["what"], "variants smoke/read → write");
    assert_eq!(d[0]["a"], "fio args: --rw=randread");
    assert_eq!(d[0]["b"], "fio args: --rw=randwrite");
    assert_eq!(d[0]["blocking"], false);
    assert_eq!(d[0]["by_design"], true);

    // The table says which variant is A and which is B.
    let table = ok_stdout(&compare(&[arg(&dir), "--pair", "read:write"]));
    assert!(table.contains("smoke/read → write"), "{table}");
    assert!(
        table.contains("A = smoke/read on debian-6.12, B = smoke/write on debian-6.12"),
        "{table}"
    );
    assert!(table.contains("randread→randwrite"), "{table}");
    assert!(
        table.contains("the variants of each pair differ by design"),
        "{table}"
    );
    // SCENARIO/VARIANT names the same pair; a variant no scenario has is an error.
    let explicit = ok_stdout(&compare(&[arg(&dir), "--pair", "smoke/read:write"]));
    assert_eq!(explicit, table);
    let e = err_text(&compare(&[arg(&dir), "--pair", "read:bogus"]));
    assert!(
        e.contains("no scenario of debian-6.12") && e.contains("smoke/read-again"),
        "{e}"
    );
    let e = err_text(&compare(&[arg(&dir), "--pair", "read"]));
    assert!(e.contains("want BASE:OTHER"), "{e}");

    // CSV: one line per metric with data, A = base, B = other.
    let csv = ok_stdout(&compare(&[
        arg(&dir),
        "--pair",
        "read:write",
        "--format",
        "csv",
    ]));
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    assert_eq!(&header[..3], &["kernel", "base", "other"]);
    for l in lines {
        let f: Vec<&str> = l.split(',').collect();
        assert_eq!(f.len(), header.len(), "{l}");
        assert_eq!(
            &f[..3],
            &["debian-6.12", "smoke/read", "smoke/write"],
            "{l}"
        );
    }
    // Markdown: a heading that says what is compared, well-formed tables.
    let md = ok_stdout(&compare(&[
        arg(&dir),
        "--pair",
        "read:write",
        "--format",
        "markdown",
    ]));
    assert!(
        md.starts_with("### blklab: variant pairs on debian-6.12"),
        "{md}"
    );
    let tables: Vec<&str> = md.lines().filter(|l| l.starts_with('|')).collect();
    assert_eq!(tables.len(), 4 * 3, "{md}");
}

#[test]
fn an_aa_variant_pair_has_no_significant_row() {
    // read and read-again (write and write-again) are defined identically;
    // their samples are independent boots of the same kernel.
    let dir = fixture("pairs");
    let out = ok_stdout(&compare(&[
        arg(&dir),
        "--pair",
        "read:read-again",
        "--pair",
        "write:write-again",
        "--metric",
        "all",
        "--format",
        "json",
    ]));
    let v: Value = serde_json::from_str(&out).unwrap();
    let cells = all_cells(&v);
    assert!(cells.len() >= 2 * 14, "{} comparisons", cells.len());
    let mut differ = 0;
    for (row, k, c) in &cells {
        assert_eq!(c["significant"], false, "{row}: {k}: {c}");
        assert_eq!(c["a"]["n"], 3);
        assert_eq!(c["b"]["n"], 3);
        if c["a"]["mean"] != c["b"]["mean"] {
            differ += 1;
        }
    }
    // Independent samples, not the same ones twice.
    assert!(differ >= cells.len() - 2, "{differ} of {}", cells.len());
    // Identical definitions: nothing to list.
    assert_eq!(v["differences"].as_array().unwrap().len(), 0, "{v}");
    let table = ok_stdout(&compare(&[arg(&dir), "--pair", "read:read-again"]));
    assert!(
        !table.lines().any(|l| l.trim_end().ends_with(" *")),
        "{table}"
    );
}

#[test]
fn the_difference_in_differences_has_the_known_direction() {
    // background.md, the plug's follow-up: without the plug, a
    // scheduler-backed single-queue device runs its hardware queue on
    // kblockd, about one context switch per IO; with `none` nothing
    // changes. So mq-deadline's effect (against none) on 6.12-noplug
    // exceeds its effect on 6.12, in context switches and kernel
    // instructions per IO.
    let dir = fixture("../insns/plug-qd1");
    let out = ok_stdout(&compare(&[
        arg(&dir),
        "--pair",
        "none-10k:mq-deadline-10k",
        "--pair",
        "none-2k:mq-deadline-2k",
        "--metric",
        "ctxsw_per_io,kernel_instructions_per_io",
        "--format",
        "json",
    ]));
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["mode"], "did");
    assert_eq!(v["a"]["kernel"], "6.12");
    assert_eq!(v["b"]["kernel"], "6.12-noplug");
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for row in rows {
        assert_eq!(row["metrics"].as_object().unwrap().len(), 0);
        for (key, floor) in [
            ("ctxsw_per_io", 100.0),
            ("kernel_instructions_per_io", 20.0),
        ] {
            let c = &row["did"][key];
            let (ea, eb) = (
                c["a"]["delta_pct"].as_f64().unwrap(),
                c["b"]["delta_pct"].as_f64().unwrap(),
            );
            let d = c["did"]["delta_pct"].as_f64().unwrap();
            assert!(eb > ea && d > floor, "{}: {key}: {c}", row["pair"]);
            // The DiD is the ratio of the two effects' ratios.
            let want = ((1.0 + eb / 100.0) / (1.0 + ea / 100.0) - 1.0) * 100.0;
            assert!((d - want).abs() < 1e-6, "{d} vs {want}");
            assert!(
                (c["did"]["log_ratio"].as_f64().unwrap() - (1.0 + d / 100.0).ln()).abs() < 1e-9
            );
            // Two samples a group: never called.
            assert_eq!(c["did"]["n"], serde_json::json!([2, 2, 2, 2]));
            assert_eq!(c["did"]["significant"], false);
        }
    }
    // Swapping the kernels turns the direction round.
    let swapped = ok_stdout(&compare(&[
        &format!("{}:6.12-noplug", dir.display()),
        &format!("{}:6.12", dir.display()),
        "--pair",
        "none-10k:mq-deadline-10k",
        "--metric",
        "ctxsw_per_io",
        "--format",
        "json",
    ]));
    let s: Value = serde_json::from_str(&swapped).unwrap();
    let (x, y) = (
        rows[0]["did"]["ctxsw_per_io"]["did"]["log_ratio"]
            .as_f64()
            .unwrap(),
        s["rows"][0]["did"]["ctxsw_per_io"]["did"]["log_ratio"]
            .as_f64()
            .unwrap(),
    );
    assert!((x + y).abs() < 1e-9, "{x} {y}");
    // The table shows each kernel's effect next to the DiD; the profiles
    // are each kernel's, other against base.
    let table = ok_stdout(&compare(&[
        arg(&dir),
        "--pair",
        "none-10k:mq-deadline-10k",
        "--metric",
        "ctxsw_per_io",
        "--top",
        "5",
    ]));
    assert!(
        table.contains("A 6.12: B/A") && table.contains("B 6.12-noplug: B/A"),
        "{table}"
    );
    assert!(table.contains("DiD"), "{table}");
    assert!(
        table.contains("plug-qd1/none-10k → mq-deadline-10k on 6.12-noplug"),
        "{table}"
    );
    assert!(
        table.contains("A sched=none | B sched=mq-deadline"),
        "{table}"
    );
    // The HTML page plots the four groups: each kernel's base and other.
    let html = tempfile::tempdir().unwrap();
    ok_stdout(&compare(&[
        arg(&dir),
        "--pair",
        "none-10k:mq-deadline-10k",
        "--metric",
        "ctxsw_per_io",
        "--out",
        arg(html.path()),
    ]));
    for e in std::fs::read_dir(html.path().join("plots")).unwrap() {
        let p = e.unwrap().path();
        let text = std::fs::read_to_string(&p).unwrap();
        roxmltree::Document::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("latency-") {
            for g in [
                "A 6.12 none-10k",
                "A 6.12 mq-deadline-10k",
                "B 6.12-noplug none-10k",
                "B 6.12-noplug mq-deadline-10k",
            ] {
                assert!(text.contains(g), "{name}: {g}");
            }
        }
    }
    // The CSV has a line per metric with data.
    let csv = ok_stdout(&compare(&[
        arg(&dir),
        "--pair",
        "none-10k:mq-deadline-10k",
        "--format",
        "csv",
    ]));
    let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    assert!(header.contains(&"did_pct") && header.contains(&"a_effect_pct"));
    for l in csv.lines().skip(1) {
        assert_eq!(l.split(',').count(), header.len(), "{l}");
    }
}

#[test]
fn a_pair_on_one_kernel_has_the_differential_profile_of_other_against_base() {
    // On 6.12-noplug mq-deadline runs the queue on kblockd: scheduler
    // instructions and dd_* functions that `none` never executes.
    let dir = fixture("../insns/plug-qd1");
    let out = ok_stdout(&compare(&[
        &format!("{}:6.12-noplug", dir.display()),
        "--pair",
        "none-10k:mq-deadline-10k",
        "--format",
        "json",
    ]));
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["mode"], "variants");
    // The default metrics add the instruction metrics, as for kernels.
    assert!(v["metrics"]
        .as_array()
        .unwrap()
        .contains(&Value::from("kernel_instructions_per_io")));
    let p = &v["profiles"].as_array().unwrap()[0];
    assert_eq!(p["pair"]["other"], "plug-qd1/mq-deadline-10k");
    let f = p["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "dd_has_work")
        .expect("dd_has_work in the top functions");
    assert_eq!(f["a"]["mean"], 0.0);
    assert!(
        f["diff"].as_f64().unwrap() > 100.0 && f["separated"] == true,
        "{f}"
    );
    let kernel = p["totals"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "kernel instructions")
        .unwrap();
    assert!(kernel["diff"].as_f64().unwrap() > 1000.0, "{kernel}");
    // The HTML page has the profile plot and, per row, both variants' curves.
    let out = tempfile::tempdir().unwrap();
    ok_stdout(&compare(&[
        &format!("{}:6.12-noplug", dir.display()),
        "--pair",
        "none-10k:mq-deadline-10k",
        "--out",
        arg(out.path()),
    ]));
    let plots: Vec<String> = std::fs::read_dir(out.path().join("plots"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(plots.iter().any(|p| p.starts_with("profile-")), "{plots:?}");
    for p in &plots {
        let text = std::fs::read_to_string(out.path().join("plots").join(p)).unwrap();
        roxmltree::Document::parse(&text).unwrap_or_else(|e| panic!("{p}: {e}"));
        if p.starts_with("latency-") {
            assert!(
                text.contains("A plug-qd1/none-10k") && text.contains("B plug-qd1/mq-deadline-10k"),
                "{p}"
            );
        }
        if p.starts_with("metric-") {
            assert!(
                text.contains("A base on 6.12-noplug") && text.contains("B other on 6.12-noplug"),
                "{p}"
            );
        }
    }
}

#[test]
fn an_aa_difference_in_differences_has_no_significant_row() {
    // aa's two kernels are one kernel image: the pair's effect is the same.
    let out = ok_stdout(&compare(&[
        arg(&fixture("aa")),
        "--pair",
        "read:write",
        "--metric",
        "all",
        "--format",
        "json",
    ]));
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["mode"], "did");
    let cells = all_cells(&v);
    assert!(cells.len() >= 3 * 14, "{}", cells.len());
    // The pair itself has effects (a write is not a read: notifications
    // per IO differ by some 14 % with a cv of 1.5 %), the same on both
    // kernels: the DiD calls none of them.
    let mut effects = 0;
    for (row, k, c) in &cells {
        if k.ends_with(".did") {
            assert_eq!(c["significant"], false, "{row}: {k}: {c}");
        } else if c["significant"] == true {
            effects += 1;
        }
    }
    assert!(effects >= 1, "no pair effect on either kernel");
    // Four groups of 3 in each DiD, plus the pair's definitions listed.
    let c = &v["rows"][0]["did"]["iops"]["did"];
    assert_eq!(c["n"], serde_json::json!([3, 3, 3, 3]));
    assert!(v["differences"]
        .as_array()
        .unwrap()
        .iter()
        .any(|d| d["by_design"] == true));
}

/// A copy of `aa/` whose second kernel's run (run.json and its records)
/// is edited by `edit_run` and `edit_record`; returns (tempdir, side A,
/// side B).
fn edited_aa(
    edit_run: impl Fn(&mut Value),
    edit_record: impl Fn(&mut Value),
) -> (tempfile::TempDir, String, String) {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = aa_labels();
    for e in std::fs::read_dir(fixture("aa")).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        let mut v = common::read_json(&p);
        if name == "run.json" {
            edit_run(&mut v);
        } else if name.starts_with(&format!("{b}.")) {
            edit_record(&mut v);
        } else {
            continue;
        }
        std::fs::write(tmp.path().join(&name), serde_json::to_string(&v).unwrap()).unwrap();
    }
    let side_a = format!("{}:{a}", fixture("aa").display());
    let side_b = format!("{}:{b}", tmp.path().display());
    (tmp, side_a, side_b)
}

/// An edit of a JSON document.
type Edit = dyn Fn(&mut Value);

#[test]
fn a_different_accelerator_vcpu_count_or_qemu_is_refused_unless_forced() {
    let cases: Vec<(&str, Box<Edit>, Box<Edit>)> = vec![
        (
            "accelerator",
            Box::new(|r| r["accel"] = "kvm".into()),
            Box::new(|r| r["accel"] = "kvm".into()),
        ),
        // KVM nested in TCG against plain TCG.
        (
            "accelerator",
            Box::new(|r| r["accel"] = "nested".into()),
            Box::new(|r| r["accel"] = "nested".into()),
        ),
        (
            "QEMU version",
            Box::new(|r| r["qemu"]["version"] = "QEMU emulator version 10.0.2".into()),
            Box::new(|_| {}),
        ),
        (
            "vCPUs",
            Box::new(|_| {}),
            Box::new(|r| {
                let cl = r["qemu_command_line"].as_array_mut().unwrap();
                let i = cl.iter().position(|a| a == "-smp").unwrap();
                cl[i + 1] = "4".into();
                r["guest"]["nr_cpus"] = 4.into();
            }),
        ),
    ];
    for (what, edit_run, edit_record) in cases {
        let (_tmp, a, b) = edited_aa(edit_run, edit_record);
        for pair in [None, Some("read:write")] {
            let mut args = vec![a.as_str(), b.as_str()];
            if let Some(p) = pair {
                args.extend(["--pair", p]);
            }
            let e = err_text(&compare(&args));
            assert!(
                e.contains("differ in more than the kernel") && e.contains(what),
                "{what}: {e}"
            );
            args.extend(["--force", "--format", "json", "--metric", "iops"]);
            let v: Value = serde_json::from_str(&ok_stdout(&compare(&args))).unwrap();
            assert_eq!(v["forced"], true);
            let d = v["differences"].as_array().unwrap();
            assert!(
                d.iter().any(|d| d["what"] == what && d["blocking"] == true),
                "{what}: {d:?}"
            );
            // Only the edited difference blocks.
            assert_eq!(
                d.iter().filter(|d| d["blocking"] == true).count(),
                1,
                "{d:?}"
            );
        }
    }
    // The same copy unedited compares without --force.
    let (_tmp, a, b) = edited_aa(|_| {}, |_| {});
    ok_stdout(&compare(&[&a, &b]));
}

/// Sides whose devices were polled differently are not comparable:
/// adaptive polling against notify mode is refused unless forced, and the
/// difference names the field. A record from before the polling modes
/// existed (no `poll_*` fields) reads as notify mode and compares with a
/// new notify-mode record without --force.
#[test]
fn a_different_polling_mode_is_refused_unless_forced() {
    let set = |spin: u64, max: u64| {
        move |r: &mut Value| {
            for d in r["device"].as_array_mut().unwrap() {
                d["poll_spin_ns"] = spin.into();
                d["poll_adaptive_max_ns"] = max.into();
            }
        }
    };
    let (_tmp, a, b) = edited_aa(|_| {}, set(0, 32_000));
    let e = err_text(&compare(&[&a, &b]));
    assert!(
        e.contains("backend configuration") && e.contains("poll_adaptive_max_ns"),
        "{e}"
    );
    let v: Value = serde_json::from_str(&ok_stdout(&compare(&[
        &a, &b, "--force", "--format", "json", "--metric", "iops",
    ])))
    .unwrap();
    assert_eq!(v["forced"], true);
    let (_tmp, a, b) = edited_aa(|_| {}, set(50_000, 0));
    let e = err_text(&compare(&[&a, &b]));
    assert!(e.contains("poll_spin_ns"), "{e}");
    let (_tmp, a, b) = edited_aa(|_| {}, set(0, 0));
    ok_stdout(&compare(&[&a, &b]));
}

/// `aa/` cut into the three shards `blklab run --shard I/3` would have
/// written (one iteration each: the run has one boot unit, so a group is an
/// iteration with both kernels), in `root`: each with the whole plan and
/// its own boots in run.json.
fn aa_as_shards(root: &Path) -> Vec<PathBuf> {
    let src = fixture("aa");
    let run = common::read_json(&src.join("run.json"));
    let plan = run["order"].clone();
    (0..3u64)
        .map(|i| {
            let d = root.join(format!("shard{}", i + 1));
            std::fs::create_dir_all(&d).unwrap();
            let mut r = run.clone();
            let order: Vec<Value> = plan
                .as_array()
                .unwrap()
                .iter()
                .filter(|o| o["iteration"] == i)
                .cloned()
                .collect();
            assert_eq!(order.len(), 2, "both kernels of iteration {i}");
            r["order"] = Value::Array(order);
            r["shard"] = serde_json::json!({"index": i + 1, "count": 3, "plan": plan});
            std::fs::write(d.join("run.json"), serde_json::to_vec_pretty(&r).unwrap()).unwrap();
            for e in std::fs::read_dir(&src).unwrap() {
                let p = e.unwrap().path();
                let name = p.file_name().unwrap().to_string_lossy().to_string();
                if name.ends_with(&format!(".{i:02}.json")) {
                    std::fs::copy(&p, d.join(&name)).unwrap();
                }
            }
            d
        })
        .collect()
}

/// Shards of one plan merge into the run they are slices of: `compare
/// s1,s2,s3` gives exactly the unsharded run's rows, sample counts and
/// means; a shard given twice, shards of another plan and directories that
/// are not shards are refused.
#[test]
fn shards_of_one_plan_merge_into_the_unsharded_comparison() {
    let tmp = tempfile::tempdir().unwrap();
    let shards = aa_as_shards(tmp.path());
    let list: Vec<&str> = shards.iter().map(|p| arg(p)).collect();
    let merged = list.join(",");
    let whole: Value = serde_json::from_str(&ok_stdout(&compare(&[
        arg(&fixture("aa")),
        "--format",
        "json",
    ])))
    .unwrap();
    let got: Value =
        serde_json::from_str(&ok_stdout(&compare(&[&merged, "--format", "json"]))).unwrap();
    let cells = |v: &Value| -> Vec<(String, String, Value, Value, Value)> {
        all_cells(v)
            .into_iter()
            .map(|(row, metric, c)| {
                (
                    row,
                    metric,
                    c["a"]["n"].clone(),
                    c["a"]["mean"].clone(),
                    c["b"]["mean"].clone(),
                )
            })
            .collect()
    };
    assert!(!cells(&whole).is_empty());
    assert_eq!(
        cells(&got),
        cells(&whole),
        "merged shards against the unsharded run"
    );
    for (_, _, n, _, _) in cells(&got) {
        assert_eq!(n, 3);
    }
    // The shards in another order, and two sides of merged shards.
    let (ka, kb) = aa_labels();
    let reversed = format!("{},{},{}", list[2], list[0], list[1]);
    let two: Value = serde_json::from_str(&ok_stdout(&compare(&[
        &format!("{reversed}:{ka}"),
        &format!("{merged}:{kb}"),
        "--format",
        "json",
    ])))
    .unwrap();
    assert_eq!(cells(&two), cells(&whole));

    let e = err_text(&compare(&[&format!("{},{}", list[0], list[0])]));
    assert!(e.contains("given twice"), "{e}");
    let e = err_text(&compare(&[&format!("{},{}", arg(&fixture("aa")), list[0])]));
    assert!(e.contains("not a shard"), "{e}");
    // A shard of another plan (one more iteration in it).
    let other = tmp.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    let mut r = common::read_json(&shards[1].join("run.json"));
    let mut extra = r["shard"]["plan"][0].clone();
    extra["iteration"] = 9.into();
    r["shard"]["plan"].as_array_mut().unwrap().push(extra);
    std::fs::write(other.join("run.json"), serde_json::to_vec(&r).unwrap()).unwrap();
    for e in std::fs::read_dir(&shards[1]).unwrap() {
        let p = e.unwrap().path();
        if p.file_name().unwrap() != "run.json" {
            std::fs::copy(&p, other.join(p.file_name().unwrap())).unwrap();
        }
    }
    let e = err_text(&compare(&[&format!("{},{}", list[0], arg(&other))]));
    assert!(e.contains("different plans"), "{e}");
}

/// A copy of `aa/` in a temporary directory as a run of today's blklab
/// writes it: run.json with a run id and every record carrying it.
fn aa_with_run_id(id: &str) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(fixture("aa")).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        let mut v = common::read_json(&p);
        if name == "run.json" {
            v["run_id"] = id.into();
        } else {
            v["run"] = serde_json::json!({ "id": id });
        }
        std::fs::write(tmp.path().join(&name), serde_json::to_string(&v).unwrap()).unwrap();
    }
    tmp
}

/// A copy of the record `from` in `dir` as `to`, edited.
fn plant(dir: &Path, from: &str, to: &str, edit: impl Fn(&mut Value)) {
    let mut v = common::read_json(&dir.join(from));
    edit(&mut v);
    std::fs::write(dir.join(to), serde_json::to_string(&v).unwrap()).unwrap();
}

/// Samples of side A in the first row of a JSON report.
fn a_samples(v: &Value) -> Value {
    v["rows"][0]["metrics"]["iops"]["a"]["n"].clone()
}

/// A directory holding the records of two runs (copied together, or an
/// `--out` re-used) is refused with both runs named; `--run` picks run.json's
/// run; a record whose boot run.json does not list, or whose own conditions
/// are not its run's, is never pooled silently.
#[test]
fn records_of_another_run_are_refused_naming_both_runs() {
    let (ka, _) = aa_labels();
    let own = "20261203-120000-0000aaaa";
    let other = "20261204-090000-0000bbbb";
    let tmp = aa_with_run_id(own);
    let dir = arg(tmp.path()).to_string();
    let json = |extra: &[&str]| -> Value {
        let mut args = vec![dir.as_str(), "--format", "json", "--metric", "iops"];
        args.extend(extra);
        serde_json::from_str(&ok_stdout(&compare(&args))).unwrap()
    };
    assert_eq!(a_samples(&json(&[])), 3);
    let read0 = format!("{ka}.smoke.read.00.json");
    plant(
        tmp.path(),
        &read0,
        &format!("{ka}.smoke.read.07.json"),
        |r| {
            r["run"]["id"] = other.into();
            r["iteration"] = 7.into();
        },
    );
    let e = err_text(&compare(&[&dir]));
    assert!(
        e.contains(own) && e.contains(other) && e.contains("--run ID"),
        "{e}"
    );
    assert!(e.contains(&format!("{ka}.smoke.read.07.json")), "{e}");
    // --run names run.json's run: its records only.
    assert_eq!(a_samples(&json(&["--run", own])), 3);
    // The other run has no run.json here: its conditions cannot be checked.
    let e = err_text(&compare(&[&dir, "--run", other]));
    assert!(e.contains("cannot be checked"), "{e}");
    std::fs::remove_file(tmp.path().join(format!("{ka}.smoke.read.07.json"))).unwrap();

    // A record with this run's id whose boot run.json does not list.
    plant(
        tmp.path(),
        &read0,
        &format!("{ka}.smoke.read.07.json"),
        |r| {
            r["iteration"] = 7.into();
        },
    );
    let e = err_text(&compare(&[&dir]));
    assert!(e.contains("boots its run.json does not list"), "{e}");
    std::fs::remove_file(tmp.path().join(format!("{ka}.smoke.read.07.json"))).unwrap();

    // A record of this run and boot whose accelerator says kvm: its own
    // conditions are checked against its run.json's and its side's.
    plant(
        tmp.path(),
        &read0,
        &format!("{ka}.smoke.read.09.json"),
        |r| {
            r["accel"] = "kvm".into();
        },
    );
    let e = err_text(&compare(&[&dir]));
    assert!(
        e.contains("accelerator") && e.contains("within side A") && e.contains("kvm"),
        "{e}"
    );
    let v = json(&["--force"]);
    assert_eq!(a_samples(&v), 4, "forced: the planted record is pooled");
    assert!(
        v["forced_over"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l.as_str().unwrap().starts_with("accelerator within side A")),
        "{v}"
    );

    // A run older than run ids: a record whose boot its run.json does not
    // list is another run's.
    let legacy = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(fixture("aa")).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, legacy.path().join(p.file_name().unwrap())).unwrap();
    }
    plant(
        legacy.path(),
        &read0,
        &format!("{ka}.smoke.read.07.json"),
        |r| {
            r["iteration"] = 7.into();
        },
    );
    let e = err_text(&compare(&[arg(legacy.path())]));
    assert!(
        e.contains("started-") && e.contains("boots its run.json does not list"),
        "{e}"
    );
}

/// `blklab run --out DIR` refuses a directory that holds an earlier run's
/// documents before it prepares or boots anything.
#[test]
fn a_run_refuses_an_output_directory_with_records() {
    let tmp = aa_with_run_id("20261203-120000-0000aaaa");
    let o = Command::new(common::blklab_bin())
        .args(["run", "--scenario", "smoke", "--no-progress", "--out"])
        .arg(tmp.path())
        .current_dir(common::root())
        .output()
        .unwrap();
    let e = err_text(&o);
    assert!(e.contains("of an earlier run"), "{e}");
    assert!(!e.contains("preparing"), "{e}");
}

/// One case per condition of the comparability contract: side B's copy
/// edited in that condition alone is refused with the condition and both
/// values named; forced, it compares, and every format says so first.
#[test]
fn every_condition_is_refused_unless_forced_and_a_forced_report_says_so_first() {
    let set_arg = |flag: &'static str, f: fn(&str) -> String| {
        move |r: &mut Value| {
            let cl = r["qemu_command_line"].as_array_mut().unwrap();
            let i = cl.iter().position(|a| a == flag).unwrap();
            cl[i + 1] = f(cl[i + 1].as_str().unwrap()).into();
        }
    };
    let none = || -> Box<Edit> { Box::new(|_| {}) };
    let cases: Vec<(&str, &str, Box<Edit>, Box<Edit>)> = vec![
        (
            "accelerator reason",
            "KVM probe failed",
            Box::new(|r| r["accel_reason"] = "KVM probe failed: no /dev/kvm".into()),
            none(),
        ),
        (
            "--deterministic",
            "on",
            Box::new(|r| r["deterministic"] = true.into()),
            none(),
        ),
        (
            "instruction counting",
            "on",
            Box::new(|r| {
                r["count_insns"] = serde_json::json!({"plugin": "/p.so", "window": "sync"})
            }),
            none(),
        ),
        (
            "guest memory",
            "2G",
            none(),
            Box::new(set_arg("-m", |_| "2G".into())),
        ),
        (
            "kernel command line",
            "mitigations=off",
            none(),
            Box::new(set_arg("-append", |a| format!("{a} mitigations=off"))),
        ),
        (
            "QEMU binary",
            "/opt/qemu/bin/qemu-system-x86_64",
            none(),
            Box::new(|r| r["qemu_command_line"][0] = "/opt/qemu/bin/qemu-system-x86_64".into()),
        ),
        (
            "scenario definition",
            "--iodepth=8",
            none(),
            Box::new(|r| {
                let args = r["scenario_definition"]["fio_args"].as_array_mut().unwrap();
                for a in args.iter_mut() {
                    if a == "--iodepth=4" {
                        *a = "--iodepth=8".into();
                    }
                }
            }),
        ),
        (
            "guest image",
            "fio-3.33",
            none(),
            Box::new(|r| {
                r["manifests"]["initramfs"] = serde_json::json!({
                    "fio": {"path": "/x/fio", "version": "fio-3.33", "sha256": "ab"},
                    "busybox_sha256": "cd"})
            }),
        ),
        (
            "kernel build",
            "sha256 0123",
            none(),
            Box::new(|r| {
                if r["variant"] == "read" && r["iteration"] == 1 {
                    r["manifests"]["kernel"] = serde_json::json!({"sha256": "0123"});
                }
            }),
        ),
    ];
    for (what, value, edit_run, edit_record) in cases {
        let (tmp, a, b) = edited_aa(edit_run, edit_record);
        let e = err_text(&compare(&[&a, &b]));
        assert!(
            e.contains("differ in more than the kernel") && e.contains(what) && e.contains(value),
            "{what}: {e}"
        );
        // Every format at once: --out writes them all.
        let out = tmp.path().join("report");
        ok_stdout(&compare(&[
            &a,
            &b,
            "--force",
            "--metric",
            "iops",
            "--out",
            arg(&out),
        ]));
        let file = |name: &str| std::fs::read_to_string(out.join(name)).unwrap();
        let v: Value = serde_json::from_str(&file("report.json")).unwrap();
        let over = v["forced_over"].as_array().unwrap();
        assert_eq!(over.len(), 1, "{what}: only the edited condition: {over:?}");
        assert!(
            over[0].as_str().unwrap().starts_with(what),
            "{what}: {over:?}"
        );
        assert!(file("report.txt").starts_with("FORCED: "), "{what}");
        let md = file("report.md");
        assert!(
            md.lines().nth(2).unwrap().starts_with("**FORCED: "),
            "{what}: {md}"
        );
        let csv = file("report.csv");
        assert!(
            csv.starts_with("# FORCED: ") && csv.contains(what),
            "{what}: {csv}"
        );
        let html = file("report.html");
        let (banner, verdict) = (html.find("class=\"forced\""), html.find("id=\"verdict\""));
        assert!(
            banner.is_some() && banner < verdict,
            "{what}: no banner first"
        );
    }
}

/// blklab's own version is a condition where the report shows a backend
/// metric (the backend is its code), shown but not refused elsewhere.
#[test]
fn the_blklab_version_blocks_only_with_a_backend_metric() {
    let (_tmp, a, b) = edited_aa(|r| r["git_commit"] = "0123abcd".into(), |_| {});
    let v: Value = serde_json::from_str(&ok_stdout(&compare(&[
        &a, &b, "--format", "json", "--metric", "iops",
    ])))
    .unwrap();
    let d = v["differences"].as_array().unwrap();
    assert!(
        d.iter()
            .any(|d| d["what"] == "blklab version" && d["blocking"] == false),
        "{d:?}"
    );
    let e = err_text(&compare(&[&a, &b, "--metric", "iops,backend_us_per_io"]));
    assert!(
        e.contains("blklab version") && e.contains("0123abcd"),
        "{e}"
    );
    let forced = ok_stdout(&compare(&[
        &a,
        &b,
        "--metric",
        "iops,backend_us_per_io",
        "--force",
    ]));
    let first = forced.lines().nth(1).unwrap_or_default();
    assert!(
        forced.starts_with("FORCED: ") && first.contains("blklab version"),
        "{forced}"
    );
}

/// Kernel `label`'s records of `aa/` and its run.json, edited by
/// `edit_run` and `edit_record`, alone in a new directory; returns
/// (tempdir, side).
fn edited_side(
    label: &str,
    edit_run: impl Fn(&mut Value),
    edit_record: impl Fn(&mut Value),
) -> (tempfile::TempDir, String) {
    let tmp = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(fixture("aa")).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        let mut v = common::read_json(&p);
        if name == "run.json" {
            edit_run(&mut v);
        } else if name.starts_with(&format!("{label}.")) {
            edit_record(&mut v);
        } else {
            continue;
        }
        std::fs::write(tmp.path().join(&name), serde_json::to_string(&v).unwrap()).unwrap();
    }
    let side = format!("{}:{label}", tmp.path().display());
    (tmp, side)
}

/// A side of `aa/` measured on `usable` of 16 host cores (its 2 vCPUs a
/// thread each), in run.json and every record; `None`: as recorded, before
/// the field.
fn side_on_cores(label: &str, usable: Option<u32>) -> (tempfile::TempDir, String) {
    let host = move |r: &mut Value| {
        if let Some(u) = usable {
            r["parallelism"] = serde_json::json!({"cores_online": 16, "cores_usable": u,
                "cpu_model": "AMD EPYC", "vcpu_threads": "per_vcpu"});
        }
    };
    let record = move |r: &mut Value| {
        if let Some(u) = usable {
            r["parallelism"] = serde_json::json!({"host_cores_online": 16,
                "host_cores_usable": u, "cpu_model": "AMD EPYC", "vcpu_threads": "per_vcpu",
                "vcpus": 2, "vcpus_at_once": u.min(2)});
        }
    };
    edited_side(label, host, record)
}

/// Contention between vCPUs shows only when they run at once: sides whose
/// records could run a different number of vCPUs at once are refused
/// unless forced, naming both; other host cores that run every vCPU are a
/// setup difference only, and a record older than the field compares with
/// one that has it. A side whose vCPUs could not all run at once has the
/// warning in every format, after the forced banner.
#[test]
fn a_different_number_of_vcpus_at_once_is_refused_unless_forced_and_warned() {
    let (la, lb) = aa_labels();
    let warning = "warning: 2 vCPUs on 1 usable host core: at most 1 runs at once, \
                   so contention between vCPUs (shared tags, lock contention) cannot show";
    let (_ta, a) = side_on_cores(&la, Some(1));
    let (tb, b) = side_on_cores(&lb, Some(16));
    let e = err_text(&compare(&[&a, &b]));
    assert!(
        e.contains("differ in more than the kernel")
            && e.contains("vCPUs at once")
            && e.contains("1 (2 vCPUs, 1 usable host core)")
            && e.contains("2 (2 vCPUs, 16 usable host cores)"),
        "{e}"
    );
    let out = tb.path().join("report");
    ok_stdout(&compare(&[
        &a,
        &b,
        "--force",
        "--metric",
        "iops",
        "--out",
        arg(&out),
    ]));
    let file = |name: &str| std::fs::read_to_string(out.join(name)).unwrap();
    let v: Value = serde_json::from_str(&file("report.json")).unwrap();
    let over = v["forced_over"].as_array().unwrap();
    assert_eq!(over.len(), 1, "{over:?}");
    assert!(
        over[0]
            .as_str()
            .unwrap()
            .starts_with("vCPUs at once (smoke/"),
        "{over:?}"
    );
    let warnings = v["parallelism_warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        format!("warning: {}", warnings[0].as_str().unwrap()).starts_with(warning),
        "{warnings:?}"
    );
    let txt = file("report.txt");
    let first_lines: Vec<&str> = txt.lines().take(4).collect();
    assert!(txt.starts_with("FORCED: "), "{txt}");
    assert!(
        first_lines.iter().any(|l| l.starts_with(warning)),
        "{first_lines:?}"
    );
    assert!(
        file("report.md").contains(&format!("**Warning**: {}", &warning[9..])),
        "markdown"
    );
    assert!(file("report.csv").contains(&format!("# {warning}")), "csv");
    let html = file("report.html");
    let (note, verdict) = (
        html.find("class=\"parallelism\""),
        html.find("id=\"verdict\""),
    );
    assert!(
        note.is_some() && note < verdict,
        "no warning before the verdict"
    );

    // 2 and 16 usable cores both run the 2 vCPUs: the cores are shown, not
    // refused, and nothing is warned.
    let (_ta, a) = side_on_cores(&la, Some(2));
    let v: Value = serde_json::from_str(&ok_stdout(&compare(&[
        &a, &b, "--format", "json", "--metric", "iops",
    ])))
    .unwrap();
    let d = v["differences"].as_array().unwrap();
    assert!(
        d.iter().any(|d| d["what"] == "host cores"
            && d["blocking"] == false
            && d["a"]
                .as_str()
                .unwrap()
                .starts_with("2 usable of 16 online cores")),
        "{d:?}"
    );
    assert!(v.get("parallelism_warnings").is_none(), "{v}");

    // A side recorded before the field against one on 1 core: unknown is
    // no difference, and the known side's warning is still said.
    let (_ta, a) = side_on_cores(&la, Some(1));
    let (_tb, b) = side_on_cores(&lb, None);
    let txt = ok_stdout(&compare(&[&a, &b, "--metric", "iops"]));
    assert!(txt.starts_with(warning), "{txt}");
}
