//! How much of KVM's real exits the would-be exits cover: the report's
//! rows measured under TCG (the plugin's would-be exits per IO) beside a
//! nested run of the same cases (KVM's own exits per IO, from the emulated
//! host's `kvm:kvm_exit` tracepoint), `blklab compare --coverage DIR`.
//!
//! The would-be exits count HLT, CPUID, WRMSR, port I/O, the kernel's MMIO
//! stores and interrupt entries; KVM also exits for what the plugin does
//! not see (RDMSR, MMIO loads, user-space MMIO, nested page faults, PAUSE
//! loops, interrupt windows, the host's own interrupts), so their ratio is
//! what the TCG figure leaves out, case by case.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::record::metrics;
use crate::record::result::ResultRecord;
use thiserror::Error;

use crate::record::run::Accel;
use crate::report::load::{self, LoadError, Side};

/// Why a coverage section cannot be made.
#[derive(Debug, Error)]
pub enum CoverageError {
    #[error("--coverage {dir}: {source}")]
    Load {
        dir: PathBuf,
        #[source]
        source: LoadError,
    },
    #[error("--coverage {dir} is a run under {accel}, not a nested run (`blklab run --accel nested`): it has no KVM exits to cover")]
    NotNested { dir: PathBuf, accel: &'static str },
}

/// What the would-be exits count, in words (reports print it).
pub(crate) const COUNTED: &str =
    "HLT, CPUID, WRMSR, port I/O, kernel MMIO stores (APIC, virtio notify, other), interrupt entries";
/// The kinds of real exit they do not count.
pub(crate) const NOT_COUNTED: &str = "RDMSR, MMIO loads, user-space MMIO, nested page faults \
     (EPT/NPT), PAUSE loops, interrupt windows, the host's own interrupts, hypercalls";

/// One case (kernel, scenario, variant) measured both ways.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct CoverageRow {
    pub(crate) kernel: String,
    /// `SCENARIO/VARIANT`.
    pub(crate) case: String,
    /// Would-be exits per IO under TCG (the report's side), mean of `n`.
    would_be_per_io: f64,
    pub(crate) n: usize,
    /// KVM's exits per IO in the nested run, mean of `nested_n`.
    pub(crate) kvm_exits_per_io: f64,
    nested_n: usize,
    /// `would_be_per_io` as a percentage of `kvm_exits_per_io`.
    covered_pct: f64,
}

/// The coverage section of a report.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Coverage {
    /// The nested run's directory.
    pub(crate) nested: PathBuf,
    pub(crate) counted: &'static str,
    not_counted: &'static str,
    /// The cases both runs have; empty when none.
    pub(crate) rows: Vec<CoverageRow>,
}

/// The mean of `metric` over the records of `kernel` and case `(s, v)`.
fn mean_of(
    records: &[ResultRecord],
    kernel: &str,
    (s, v): (&str, &str),
    metric: &str,
) -> Option<(f64, usize)> {
    let m = metrics::find(metric)?;
    let values: Vec<f64> = records
        .iter()
        .filter(|r| r.ok && r.kernel == kernel && r.scenario == s && r.variant == v)
        .filter_map(|r| (m.get)(r))
        .collect();
    (!values.is_empty()).then(|| {
        (
            values.iter().sum::<f64>() / values.len() as f64,
            values.len(),
        )
    })
}

/// The coverage of `cases` (a side, a scenario, a variant) by a nested
/// run in `dir`: refused unless it is a nested run.
pub(crate) fn of(cases: &[(&Side, String, String)], dir: &Path) -> Result<Coverage, CoverageError> {
    let (run, nested) = load::load_dir(dir).map_err(|source| CoverageError::Load {
        dir: dir.to_path_buf(),
        source,
    })?;
    if run.accel != Accel::Nested {
        return Err(CoverageError::NotNested {
            dir: dir.to_path_buf(),
            accel: run.accel.describe(),
        });
    }
    Ok(Coverage {
        nested: dir.to_path_buf(),
        counted: COUNTED,
        not_counted: NOT_COUNTED,
        rows: rows(cases, &nested),
    })
}

/// Each case that both the side's records and the nested run's have with
/// their exit counts.
fn rows(cases: &[(&Side, String, String)], nested: &[ResultRecord]) -> Vec<CoverageRow> {
    let mut rows = Vec::new();
    for (side, s, v) in cases {
        let case = (s.as_str(), v.as_str());
        let Some((would_be, n)) = mean_of(&side.records, &side.kernel, case, "exits_per_io") else {
            continue;
        };
        let Some((kvm, nested_n)) = mean_of(nested, &side.kernel, case, "kvm_exits_per_io") else {
            continue;
        };
        rows.push(CoverageRow {
            kernel: side.kernel.clone(),
            case: format!("{s}/{v}"),
            would_be_per_io: would_be,
            n,
            kvm_exits_per_io: kvm,
            nested_n,
            covered_pct: if kvm > 0.0 {
                100.0 * would_be / kvm
            } else {
                f64::NAN
            },
        });
    }
    rows
}
/// The section as text lines (table and Markdown share them).
pub(crate) fn lines(c: &Coverage) -> Vec<String> {
    let mut out = vec![
        format!(
            "would-be exits (TCG) against KVM's exits in the nested run {}:",
            c.nested.display()
        ),
        format!("  counted: {}; not counted: {}", c.counted, c.not_counted),
    ];
    if c.rows.is_empty() {
        out.push("  (the nested run has none of these cases with KVM's exit counts)".to_string());
    }
    for r in &c.rows {
        out.push(format!(
            "  {} {}: {:.2} would-be exits per IO (n={}) against {:.2} KVM exits per IO (n={}): {:.0} % covered",
            r.kernel, r.case, r.would_be_per_io, r.n, r.kvm_exits_per_io, r.nested_n, r.covered_pct
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::instructions::WouldBeExits;
    use crate::record::kvm::KvmWindow;

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name)
    }

    /// A recorded TCG record of plug-qd1 none-2k on 6.12.
    fn tcg_record() -> ResultRecord {
        crate::record::read(&fixture("insns/plug-qd1/6.12.plug-qd1.none-2k.00.json")).unwrap()
    }

    #[test]
    fn a_case_measured_both_ways_shows_the_share_of_kvm_exits_covered() {
        let mut tcg = tcg_record();
        let ios = metrics::ios(&tcg).unwrap();
        let exits = WouldBeExits {
            total: (1.5 * ios) as u64,
            per_io: [("total".to_string(), Some(1.5))].into(),
            ..WouldBeExits::default()
        };
        tcg.instructions.as_mut().unwrap().exits = Some(exits);
        let mut nested = tcg_record();
        nested.instructions = None;
        nested.kvm = Some(KvmWindow {
            counters: [("exits".to_string(), (4.0 * ios) as u64)].into(),
            ..KvmWindow::default()
        });
        let side = Side {
            dir: "a".into(),
            kernel: tcg.kernel.clone(),
            run: crate::record::read(&fixture("runs/aa/run.json")).unwrap(),
            records: vec![tcg.clone()],
            run_records: Default::default(),
        };
        let case = |v: &str| (&side, "plug-qd1".to_string(), v.to_string());
        let rows = rows(&[case("none-2k"), case("none-10k")], &[nested]);
        assert_eq!(rows.len(), 1, "only the case both runs have: {rows:?}");
        let r = &rows[0];
        assert_eq!((r.n, r.nested_n), (1, 1));
        assert!((r.would_be_per_io - 1.5).abs() < 1e-9, "{r:?}");
        assert!((r.kvm_exits_per_io - 4.0).abs() < 1e-3, "{r:?}");
        assert!((r.covered_pct - 37.5).abs() < 0.1, "{r:?}");
        let c = Coverage {
            nested: "n".into(),
            counted: COUNTED,
            not_counted: NOT_COUNTED,
            rows,
        };
        let text = lines(&c).join("\n");
        assert!(
            text.contains("38 % covered") && text.contains("RDMSR"),
            "{text}"
        );
    }

    #[test]
    fn a_run_that_is_not_nested_is_refused() {
        let e = of(&[], &fixture("runs/aa")).unwrap_err();
        assert!(matches!(e, CoverageError::NotNested { .. }), "{e:?}");
        assert!(e.to_string().contains("not a nested run"), "{e}");
    }
}
