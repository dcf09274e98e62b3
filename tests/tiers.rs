//! The test tiers cannot drift: docs/tests.md's table has exactly one row
//! per integration test binary (and one for the unit tests), each `fast` or
//! `full`, and the `cargo test-fast` alias (.cargo/config.toml) runs
//! exactly the unit tests and the binaries whose row says `fast`.

use std::collections::BTreeMap;
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The table's first column for the unit tests.
const UNIT_ROW: &str = "unit tests";

/// The table's columns, in order.
const HEADER: &str = "| test | tier | what it proves | what it needs | time here |";

/// docs/tests.md's table: the test (a binary's name, or [`UNIT_ROW`]) →
/// its tiers (more than one when it has more than one row).
fn table() -> BTreeMap<String, Vec<String>> {
    let text = std::fs::read_to_string(root().join("docs/tests.md")).unwrap();
    let mut lines = text.lines().skip_while(|l| l.trim() != HEADER);
    assert!(
        lines.next().is_some(),
        "docs/tests.md has no table headed {HEADER}"
    );
    let mut rows: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in lines.skip(1).take_while(|l| l.starts_with('|')) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let (test, tier) = (cells[1], cells[2]);
        let name = match test
            .strip_prefix("`tests/")
            .and_then(|t| t.strip_suffix(".rs`"))
        {
            Some(binary) => binary.to_string(),
            None => test.to_string(),
        };
        rows.entry(name).or_default().push(tier.to_string());
    }
    rows
}

/// The integration test binaries: `tests/*.rs`.
fn binaries() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(root().join("tests"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The arguments of the `test-fast` alias.
fn fast_alias() -> Vec<String> {
    let text = std::fs::read_to_string(root().join(".cargo/config.toml")).unwrap();
    let config: toml::Value = toml::from_str(&text).unwrap();
    let alias = &config["alias"]["test-fast"];
    match alias {
        toml::Value::Array(args) => args
            .iter()
            .map(|a| a.as_str().expect("a string argument").to_string())
            .collect(),
        toml::Value::String(s) => s.split_whitespace().map(String::from).collect(),
        other => panic!("alias.test-fast is neither a list nor a string: {other}"),
    }
}

#[test]
fn every_test_binary_has_exactly_one_row_with_a_tier() {
    let table = table();
    let mut want = binaries();
    want.push(UNIT_ROW.to_string());
    want.sort();
    let have: Vec<String> = table.keys().cloned().collect();
    assert_eq!(have, want, "docs/tests.md's rows against tests/*.rs");
    for (test, tiers) in &table {
        assert_eq!(tiers.len(), 1, "{test} has {} rows", tiers.len());
        assert!(
            tiers[0] == "fast" || tiers[0] == "full",
            "{test}'s tier is {:?}, not fast or full",
            tiers[0]
        );
    }
    assert_eq!(table[UNIT_ROW], ["fast"], "the unit tests are fast");
}

#[test]
fn the_test_fast_alias_runs_exactly_the_fast_rows() {
    let args = fast_alias();
    assert_eq!(args.first().map(String::as_str), Some("test"), "{args:?}");
    let mut binaries = Vec::new();
    let mut rest = args[1..].iter();
    let (mut lib, mut bins) = (false, false);
    while let Some(a) = rest.next() {
        match a.as_str() {
            "--lib" => lib = true,
            "--bins" => bins = true,
            "--test" => binaries.push(rest.next().expect("--test NAME").clone()),
            other => panic!("test-fast: unexpected argument {other}"),
        }
    }
    assert!(lib && bins, "test-fast runs the unit tests: --lib --bins");
    binaries.sort();
    let fast: Vec<String> = table()
        .into_iter()
        .filter(|(test, tiers)| test != UNIT_ROW && tiers.iter().any(|t| t == "fast"))
        .map(|(test, _)| test)
        .collect();
    assert_eq!(
        binaries, fast,
        "test-fast's --test list against the fast rows"
    );
}
