//! The end of a bisection: the metric per tested commit (a table and the
//! JSON record `bisect.json`) and the differential profile between the last
//! good and the first bad commit (`blklab compare`'s, on their runs).

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::bisect::error::BisectError;
use crate::bisect::judge::{spread, Boundary, Verdict};
use crate::report::{compare, render};

pub(crate) const BISECT_SCHEMA: &str = "blklab-bisect/1";

/// One tested commit.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Step {
    pub(crate) commit: String,
    pub(crate) subject: String,
    /// `good end`, `bad end`, `candidate` or `last good` (measured for the
    /// profile only).
    pub(crate) role: String,
    /// What was told `git bisect` (none for the ends and `last good`).
    pub(crate) verdict: Option<Verdict>,
    pub(crate) values: Vec<f64>,
    pub(crate) mean: Option<f64>,
    pub(crate) min: Option<f64>,
    pub(crate) max: Option<f64>,
    pub(crate) build_seconds: Option<f64>,
    pub(crate) run_seconds: Option<f64>,
    pub(crate) run_dir: Option<PathBuf>,
    /// Why it could not be measured (then skipped).
    pub(crate) error: Option<String>,
}

impl Step {
    pub(crate) fn new(commit: &str, subject: &str, role: &str) -> Step {
        Step {
            commit: commit.to_string(),
            subject: subject.to_string(),
            role: role.to_string(),
            verdict: None,
            values: Vec::new(),
            mean: None,
            min: None,
            max: None,
            build_seconds: None,
            run_seconds: None,
            run_dir: None,
            error: None,
        }
    }

    pub(crate) fn set_values(&mut self, v: &[f64]) {
        self.values = v.to_vec();
        if !v.is_empty() {
            let (mean, min, max) = spread(v);
            self.mean = Some(mean);
            self.min = Some(min);
            self.max = Some(max);
        }
    }
}

/// A commit named in the result.
#[derive(Debug, Clone, Serialize)]
pub struct CommitRef {
    pub(crate) commit: String,
    pub(crate) subject: String,
}

/// `bisect.json`.
#[derive(Debug, Clone, Serialize)]
pub struct BisectRecord {
    pub(crate) schema: String,
    pub(crate) tree: PathBuf,
    pub(crate) good: String,
    pub(crate) bad: String,
    pub(crate) good_rev: String,
    pub(crate) bad_rev: String,
    pub(crate) scenario: String,
    pub(crate) variant: String,
    pub(crate) metric: String,
    pub(crate) iterations: u32,
    /// `threshold` or `toward-bad`.
    pub(crate) mode: String,
    pub(crate) boundary: Option<Boundary>,
    pub(crate) steps: Vec<Step>,
    pub first_bad: Option<CommitRef>,
    /// When only skipped commits were left: the first bad is among these.
    pub(crate) first_bad_candidates: Vec<String>,
    pub(crate) last_good: Option<CommitRef>,
    /// `blklab compare`'s report of last good (A) against first bad (B).
    pub(crate) profile_dir: Option<PathBuf>,
    pub(crate) bisect_log: PathBuf,
    pub(crate) seconds: f64,
}

fn num(v: Option<f64>) -> String {
    match v {
        Some(x) if x.abs() >= 100.0 => format!("{x:.0}"),
        Some(x) => format!("{x:.3}"),
        None => "-".into(),
    }
}

fn secs(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |s| format!("{s:.0}s"))
}

/// The metric per tested commit, in test order.
pub(crate) fn table(rec: &BisectRecord) -> String {
    let mut rows: Vec<[String; 8]> = vec![[
        "commit".into(),
        "role".into(),
        "verdict".into(),
        format!("{} mean", rec.metric),
        "min..max".into(),
        "n".into(),
        "build/run".into(),
        "subject".into(),
    ]];
    for s in &rec.steps {
        rows.push([
            s.commit.chars().take(12).collect(),
            s.role.clone(),
            s.verdict.map_or("-", Verdict::git_word).to_string(),
            num(s.mean),
            format!("{}..{}", num(s.min), num(s.max)),
            s.values.len().to_string(),
            format!("{}/{}", secs(s.build_seconds), secs(s.run_seconds)),
            match &s.error {
                Some(e) => format!("{} [{}]", s.subject, e),
                None => s.subject.clone(),
            },
        ]);
    }
    let widths: Vec<usize> = (0..8)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in &rows {
        let line: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if i == 7 {
                    c.clone()
                } else {
                    format!("{c:<w$}", w = widths[i])
                }
            })
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    // A skipped commit is counted apart: never taken for a good or bad one.
    let called = |v: Verdict| rec.steps.iter().filter(|s| s.verdict == Some(v)).count();
    out.push_str(&format!(
        "called: {} good, {} bad, {} skipped (not called: no build, no run or values on both sides)\n",
        called(Verdict::Good),
        called(Verdict::Bad),
        called(Verdict::Skip)
    ));
    if let Some(b) = &rec.boundary {
        out.push_str(&format!(
            "bad: {} {} {} ({}); a commit whose values straddle it is skipped\n",
            rec.metric,
            if b.bad_above { "above" } else { "below" },
            num(Some(b.value)),
            rec.mode
        ));
    }
    match (&rec.first_bad, rec.first_bad_candidates.is_empty()) {
        (Some(f), _) => out.push_str(&format!("first bad commit: {} {}\n", f.commit, f.subject)),
        (None, false) => out.push_str(&format!(
            "only skipped commits are left; the first bad commit is one of: {}\n",
            rec.first_bad_candidates.join(" ")
        )),
        (None, true) => out.push_str("no first bad commit\n"),
    }
    out
}

/// The differential profile of `good` (A) against `bad` (B): `blklab
/// compare DIR_A:LABEL_A DIR_B:LABEL_B` on the metric, its report files
/// written to `out`; returns the text.
pub(crate) fn profile(
    good: (&Path, &str),
    bad: (&Path, &str),
    metric: &str,
    top: usize,
    out: &Path,
) -> Result<String, BisectError> {
    let compared = compare::run(&compare::Request {
        sides: vec![
            format!("{}:{}", good.0.display(), good.1),
            format!("{}:{}", bad.0.display(), bad.1),
        ],
        pairs: Vec::new(),
        metrics: vec![metric.to_string()],
        confidence: 0.95,
        force: false,
        runs: Vec::new(),
        coverage: None,
        profile_top: top,
    })?;
    let text = render::table(&compared.report);
    crate::report::write_all(&compared.report, &compared.a, &compared.b, out).map_err(
        |source| BisectError::Write {
            path: out.to_path_buf(),
            source,
        },
    )?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_lists_every_tested_commit_and_the_answer() {
        let mut good = Step::new(&"a".repeat(40), "base", "good end");
        good.set_values(&[10000.0, 10200.0]);
        let mut cand = Step::new(&"b".repeat(40), "block: remove the plug", "candidate");
        cand.set_values(&[15000.0, 15100.0]);
        cand.verdict = Some(Verdict::Bad);
        let mut broken = Step::new(&"c".repeat(40), "does not build", "candidate");
        broken.verdict = Some(Verdict::Skip);
        broken.error = Some("make failed".into());
        let rec = BisectRecord {
            schema: BISECT_SCHEMA.into(),
            tree: "/t".into(),
            good: "a".repeat(40),
            bad: "d".repeat(40),
            good_rev: "v1".into(),
            bad_rev: "v2".into(),
            scenario: "plug-qd1".into(),
            variant: "mq-deadline-10k".into(),
            metric: "kernel_instructions_per_io".into(),
            iterations: 2,
            mode: "toward-bad".into(),
            boundary: Some(Boundary {
                value: 12500.0,
                bad_above: true,
            }),
            steps: vec![good, cand, broken],
            first_bad: Some(CommitRef {
                commit: "b".repeat(40),
                subject: "block: remove the plug".into(),
            }),
            first_bad_candidates: Vec::new(),
            last_good: None,
            profile_dir: None,
            bisect_log: "/o/bisect-log.txt".into(),
            seconds: 1.0,
        };
        let t = table(&rec);
        assert!(t.contains("bbbbbbbbbbbb  candidate  bad"), "{t}");
        assert!(t.contains("15050"), "{t}");
        assert!(t.contains("15000..15100"), "{t}");
        assert!(t.contains("does not build [make failed]"), "{t}");
        // The good end is measured, not called; the broken commit skipped.
        assert!(
            t.contains("called: 0 good, 1 bad, 1 skipped (not called: "),
            "{t}"
        );
        assert!(
            t.contains("bad: kernel_instructions_per_io above 12500 (toward-bad)"),
            "{t}"
        );
        assert!(
            t.contains(&format!(
                "first bad commit: {} block: remove the plug",
                "b".repeat(40)
            )),
            "{t}"
        );
    }
}
