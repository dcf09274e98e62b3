//! The JSON Schemas of blklab's documents (docs/schema/), generated from
//! the Rust types: the checked-in files are current, every recorded
//! document (the fixtures under tests/fixtures/, and a stats document of a
//! running daemon) loads as its type and validates against its schema, and
//! the schemas refuse what the types refuse.
//!
//! The test only compares: regenerate the files after changing a type
//! with `cargo run --example write_schemas` (`schema::REGENERATE`, which
//! the failure names).

mod common;

use std::path::{Path, PathBuf};

use blklab::record::result::ResultRecord;
use blklab::record::run::RunDocument;
use blklab::record::summary::SummaryDocument;
use blklab::record::{self, schema, Document, RecordError};
use blklab::stats::queue::StatsDocument;
use common::client::{Client, Op};
use common::Daemon;
use serde_json::{json, Value};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn schema_dir() -> PathBuf {
    root().join("docs/schema")
}

/// The checked-in schema of `T`, compiled.
fn validator<T: Document>() -> jsonschema::Validator {
    let path = schema_dir().join(format!("{}.schema.json", T::NAME));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (regenerate: {})",
            path.display(),
            schema::REGENERATE
        )
    });
    let schema: Value = serde_json::from_str(&text).unwrap();
    jsonschema::meta::validate(&schema)
        .unwrap_or_else(|e| panic!("{} is not a valid JSON Schema: {e}", path.display()));
    jsonschema::validator_for(&schema).unwrap()
}

/// Every validation error of `doc` against `v`, one per line.
fn errors(v: &jsonschema::Validator, doc: &Value) -> Vec<String> {
    v.iter_errors(doc)
        .map(|e| format!("{} at {}", e, e.instance_path))
        .collect()
}

fn assert_valid(v: &jsonschema::Validator, doc: &Value, what: &str) {
    let e = errors(v, doc);
    assert!(e.is_empty(), "{what} does not validate:\n{}", e.join("\n"));
}

/// Every value of `a` is in `b`, the same (numbers compared as numbers):
/// a document read as its type and written again keeps what it had.
fn assert_kept(a: &Value, b: &Value, at: &str) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for (k, v) in x {
                let w = y
                    .get(k)
                    .unwrap_or_else(|| panic!("{at}/{k}: dropped on the way through the types"));
                assert_kept(v, w, &format!("{at}/{k}"));
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            assert_eq!(x.len(), y.len(), "{at}: length changed");
            for (i, (v, w)) in x.iter().zip(y).enumerate() {
                assert_kept(v, w, &format!("{at}/{i}"));
            }
        }
        (Value::Number(x), Value::Number(y)) => {
            assert_eq!(x.as_f64(), y.as_f64(), "{at}: {x} became {y}")
        }
        _ => assert_eq!(a, b, "{at}"),
    }
}

/// The schema files of `dir` that are missing or differ from the ones the
/// types generate, by name.
fn stale_in(dir: &Path) -> Vec<String> {
    schema::all()
        .into_iter()
        .filter(|(name, text)| {
            std::fs::read_to_string(dir.join(name)).ok().as_deref() != Some(text.as_str())
        })
        .map(|(name, _)| name)
        .collect()
}

#[test]
fn the_checked_in_schemas_are_the_generated_ones() {
    let stale: Vec<String> = stale_in(&schema_dir())
        .into_iter()
        .map(|n| format!("docs/schema/{n}"))
        .collect();
    assert!(
        stale.is_empty(),
        "{} differ from the schemas the types generate; regenerate them with `{}` and commit them",
        stale.join(", "),
        schema::REGENERATE
    );
    let mut names: Vec<String> = schema::all().into_iter().map(|(n, _)| n).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "result.schema.json",
            "run.schema.json",
            "stats.schema.json",
            "summary.schema.json"
        ]
    );
}

#[test]
fn a_stale_schema_fails_the_comparison_until_regenerated() {
    // A copy of the generated files with one changed and one missing.
    let dir = tempfile::tempdir().unwrap();
    schema::write_all(dir.path()).unwrap();
    assert!(stale_in(dir.path()).is_empty());
    std::fs::write(dir.path().join("run.schema.json"), "{}\n").unwrap();
    std::fs::remove_file(dir.path().join("stats.schema.json")).unwrap();
    assert_eq!(
        stale_in(dir.path()),
        ["stats.schema.json", "run.schema.json"]
    );
    // The regeneration is a command of its own, named in every file.
    assert_eq!(schema::REGENERATE, "cargo run --example write_schemas");
    assert!(root().join("examples/write_schemas.rs").is_file());
    for (name, text) in schema::all() {
        assert!(
            text.contains(&format!("regenerate with `{}`", schema::REGENERATE)),
            "{name}"
        );
    }
    schema::write_all(dir.path()).unwrap();
    assert!(stale_in(dir.path()).is_empty());
}

/// Every recorded run directory of the fixtures.
fn fixture_runs() -> Vec<PathBuf> {
    let f = root().join("tests/fixtures");
    let mut dirs = vec![f.join("insns/plug-qd1")];
    for e in std::fs::read_dir(f.join("runs")).unwrap() {
        let p = e.unwrap().path();
        if p.join("run.json").is_file() {
            dirs.push(p);
        }
    }
    dirs.sort();
    dirs
}

/// Read `path` as `T`, validate it (as recorded and as written again) and
/// check that the types keep everything it had.
fn check_recorded<T: Document>(path: &Path, v: &jsonschema::Validator) -> T {
    let raw = record::read_value(path).unwrap();
    assert_valid(v, &raw, &path.display().to_string());
    let doc: T = record::read(path).unwrap_or_else(|e| panic!("{e}"));
    let again = serde_json::to_value(&doc).unwrap();
    assert_valid(v, &again, &format!("{} written again", path.display()));
    assert_kept(&raw, &again, &path.display().to_string());
    doc
}

#[test]
fn recorded_runs_load_as_their_types_and_validate() {
    let (run_v, result_v, summary_v) = (
        validator::<RunDocument>(),
        validator::<ResultRecord>(),
        validator::<SummaryDocument>(),
    );
    let stats_v = validator::<StatsDocument>();
    let (mut runs, mut results) = (0, 0);
    for dir in fixture_runs() {
        let run: RunDocument = check_recorded(&dir.join("run.json"), &run_v);
        runs += 1;
        let mut records = Vec::new();
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .filter(|p| !p.ends_with("run.json"))
            .collect();
        files.sort();
        for f in files {
            let r: ResultRecord = check_recorded(&f, &result_v);
            assert!(
                run.kernels.iter().any(|k| k.label == r.kernel),
                "{}",
                f.display()
            );
            // The embedded stats document is a stats document.
            let backend = serde_json::to_value(r.backend.as_ref().unwrap()).unwrap();
            assert_valid(&stats_v, &backend, &format!("{} backend", f.display()));
            records.push(r);
            results += 1;
        }
        // What `blklab run` would summarise from them is a summary document.
        let summary = SummaryDocument {
            schema: blklab::record::summary::SUMMARY_SCHEMA.into(),
            finished_unix: 0.0,
            failures: Vec::new(),
            retried_boots: Vec::new(),
            retried_hosts: Vec::new(),
            rows: blklab::lab::run::summary::rows(&records),
        };
        assert!(!summary.rows.is_empty());
        assert_valid(
            &summary_v,
            &serde_json::to_value(&summary).unwrap(),
            "a summary",
        );
        // The report reads the same directory through the same types.
        let (_, loaded) = blklab::report::load::load_dir(&dir).unwrap();
        assert_eq!(loaded, records);
    }
    assert_eq!(runs, 5);
    assert_eq!(results, 64, "records in the fixtures");
}

/// A recorded run whose run.json lists each boot's variants (copied from
/// `tests/fixtures/runs/aa`, the variants filled in from its records):
/// every planned variant run has its record, so none is not run; with a
/// record taken away, its row counts it as not run (never as run), the
/// table names it, and the summary still validates.
#[test]
fn a_planned_run_without_its_record_is_counted_as_not_run() {
    use blklab::lab::run::summary;
    let from = root().join("tests/fixtures/runs/aa");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut records: Vec<ResultRecord> = Vec::new();
    for e in std::fs::read_dir(&from).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "json") && !p.ends_with("run.json") {
            records.push(record::read(&p).unwrap());
        }
    }
    let mut run: Value = record::read_value(&from.join("run.json")).unwrap();
    for b in run["order"].as_array_mut().unwrap() {
        let mut variants: Vec<String> = records
            .iter()
            .filter(|r| {
                b["kernel"] == r.kernel.as_str()
                    && b["scenario"] == r.scenario.as_str()
                    && b["iteration"] == r.iteration
            })
            .map(|r| r.variant.clone())
            .collect();
        variants.sort();
        assert!(!variants.is_empty(), "{b}");
        b["variants"] = json!(variants);
    }
    std::fs::write(dir.join("run.json"), run.to_string()).unwrap();
    let order = summary::run_order(dir);
    let planned: usize = order.iter().map(|b| b.variants.len()).sum();
    assert_eq!(planned, records.len());
    assert!(summary::not_run(&order, &records).is_empty());
    assert!(summary::rows_planned(&records, &order)
        .iter()
        .all(|r| r.not_run == 0));
    assert!(!summary::table_planned(&records, &order).contains("not run"));

    let gone = records.remove(0);
    let rows = summary::rows_planned(&records, &order);
    let row = rows
        .iter()
        .find(|r| {
            r.kernel == gone.kernel && r.scenario == gone.scenario && r.variant == gone.variant
        })
        .unwrap();
    assert_eq!(row.not_run, 1, "{row:?}");
    assert_eq!(rows.iter().map(|r| r.not_run).sum::<usize>(), 1);
    let missing = format!(
        "{} {}/{} #{}",
        gone.kernel, gone.scenario, gone.variant, gone.iteration
    );
    assert_eq!(
        summary::not_run(&order, &records),
        std::slice::from_ref(&missing)
    );
    let table = summary::table_planned(&records, &order);
    assert!(
        table.contains(&format!(
            "not run: 1 of {planned} planned variant runs left no record: {missing}\n"
        )),
        "{table}"
    );
    let doc = SummaryDocument {
        schema: blklab::record::summary::SUMMARY_SCHEMA.into(),
        finished_unix: 0.0,
        failures: Vec::new(),
        retried_boots: Vec::new(),
        retried_hosts: Vec::new(),
        rows,
    };
    let v = serde_json::to_value(&doc).unwrap();
    assert_valid(
        &validator::<SummaryDocument>(),
        &v,
        "a summary with a run not run",
    );
    // A run directory without a readable run.json plans nothing to tell.
    assert!(summary::run_order(&dir.join("nothing")).is_empty());
}

#[test]
fn a_live_stats_document_validates() {
    let v = validator::<StatsDocument>();
    let dir = tempfile::tempdir().unwrap();
    let ctl = dir.path().join("ctl.sock");
    let d = Daemon::spawn(
        &[
            "--disk",
            "mem",
            "--size",
            "16M",
            "--num-queues",
            "2",
            "--tags",
            "shared",
            "--depth",
            "8",
            "--latency",
            "uniform:10us..20us",
            "--fail-every",
            "50:write",
            "--control",
            ctl.to_str().unwrap(),
        ],
        1,
    );
    let mut c = Client::connect(&d.socket, 2).expect("connect");
    for q in c.queues.iter_mut() {
        assert_eq!(q.write(0, &[3; 4096]), 0);
        let reqs: Vec<(Op, u64)> = (0..8).map(|i| (Op::Read, i * 4096)).collect();
        for (r, _) in q.batch(&reqs, 4096) {
            assert_eq!(r, 0);
        }
    }
    for cmd in ["stats", "snapshot live"] {
        let raw = blklab::backend::control::query(&ctl, cmd).unwrap();
        assert_valid(&v, &raw, cmd);
        let doc: StatsDocument = blklab::backend::control::stats_answer(&raw, cmd).unwrap();
        assert!(doc.sum(|c| c.requests) >= 18 || cmd != "stats", "{doc:?}");
        assert_eq!(doc.disks[0].tag_pools.len(), 1);
        let again = serde_json::to_value(&doc).unwrap();
        assert_kept(&raw, &again, cmd);
        assert_valid(&v, &again, &format!("{cmd} written again"));
    }
}

#[test]
fn the_schemas_refuse_what_the_types_refuse() {
    let result_v = validator::<ResultRecord>();
    let stats_v = validator::<StatsDocument>();
    let run_v = validator::<RunDocument>();
    let path = fixture_runs()[0].join("run.json");
    let run = record::read_value(&path).unwrap();
    let rec_path = std::fs::read_dir(&fixture_runs()[0])
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| !p.ends_with("run.json"))
        .unwrap();
    let rec = record::read_value(&rec_path).unwrap();
    let backend = rec["backend"].clone();

    // (document, how it is broken, validator, does the type read it?)
    let mut bad: Vec<(Value, &str, &jsonschema::Validator, bool)> = Vec::new();
    let mut with = |base: &Value, f: &dyn Fn(&mut Value), what, v, reads| {
        let mut d = base.clone();
        f(&mut d);
        bad.push((d, what, v, reads));
    };
    with(
        &rec,
        &|d| d["iteration"] = json!("zero"),
        "a string for a number",
        &result_v,
        false,
    );
    with(
        &rec,
        &|d| d["ok"] = json!(1),
        "a number for a bool",
        &result_v,
        false,
    );
    with(
        &rec,
        &|d| {
            d.as_object_mut().unwrap().remove("kernel");
        },
        "no kernel",
        &result_v,
        false,
    );
    with(
        &rec,
        &|d| d["schema"] = json!("blklab-run-result/2"),
        "another major version",
        &result_v,
        false,
    );
    with(
        &rec,
        &|d| d["checks"]["fio_ios"] = json!(-1),
        "a negative count",
        &result_v,
        false,
    );
    with(
        &rec,
        &|d| d["accel"] = json!("hvf"),
        "an unknown accelerator",
        &result_v,
        false,
    );
    with(
        &rec,
        &|d| d["guest"]["cpu"]["all"]["busy"] = json!("high"),
        "a string in the guest's CPU",
        &result_v,
        false,
    );
    with(
        &backend,
        &|d| d["disks"] = json!(5),
        "disks not a list",
        &stats_v,
        false,
    );
    with(
        &backend,
        &|d| d["schema"] = json!("blklab-stats/2"),
        "another major version",
        &stats_v,
        false,
    );
    with(
        &backend,
        &|d| {
            d["disks"][0]["queues"][0]
                .as_object_mut()
                .unwrap()
                .remove("counters");
        },
        "a queue without counters",
        &stats_v,
        false,
    );
    with(
        &run,
        &|d| d["kernels"][0]["label"] = json!(null),
        "a null label",
        &run_v,
        false,
    );
    for (doc, what, v, reads) in &bad {
        assert!(!errors(v, doc).is_empty(), "the schema accepts {what}");
        let typed = match v {
            v if std::ptr::eq(*v, &result_v) => {
                serde_json::from_value::<ResultRecord>(doc.clone()).is_ok()
            }
            v if std::ptr::eq(*v, &stats_v) => {
                serde_json::from_value::<StatsDocument>(doc.clone()).is_ok()
            }
            _ => serde_json::from_value::<RunDocument>(doc.clone()).is_ok(),
        };
        assert_eq!(typed, *reads, "the type and the schema disagree on {what}");
    }

    // What both accept: fields they do not know (forward compatibility),
    // and a minor version.
    let mut newer = rec.clone();
    newer["a_field_from_the_future"] = json!({"x": 1});
    newer["schema"] = json!("blklab-run-result/1.1");
    assert_valid(&result_v, &newer, "a newer minor version");
    serde_json::from_value::<ResultRecord>(newer).unwrap();

    // A file of another major version fails to read, naming the file and
    // both versions.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("x.json");
    let mut old = rec;
    old["schema"] = json!("blklab-run-result/2");
    std::fs::write(&file, old.to_string()).unwrap();
    let e = record::read::<ResultRecord>(&file).unwrap_err();
    assert!(matches!(e, RecordError::Schema { .. }), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains(&file.display().to_string())
            && text.contains("\"blklab-run-result/2\"")
            && text.contains("\"blklab-run-result/1\""),
        "{text}"
    );
}
