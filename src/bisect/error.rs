//! What can stop a bisection, and why one commit could not be measured:
//! named kinds carrying their cause (`#[source]`) or the values they are
//! about, so callers and tests match on a kind. The messages are the one
//! line a user reads; they must not know how the bisection proceeds.

use std::path::PathBuf;

use thiserror::Error;

use super::build::BuildError;
use super::git::GitError;
use super::judge::{Boundary, EndsOverlap};
use super::measure::MeasureError;
use crate::lab::{images, scenario};
use crate::record::metrics;

#[derive(Debug, Error)]
pub enum BisectError {
    #[error("--metric {name:?}: no such metric (known: {})", metrics::known_keys())]
    UnknownMetric { name: String },
    #[error("--iterations must be at least 1")]
    ZeroIterations,
    #[error("--jobs must be at least 1")]
    ZeroJobs,
    #[error(
        "--variant {asked:?}: scenario {scenario} has no such variant (it has: {})",
        known.join(", ")
    )]
    NoSuchVariant {
        asked: String,
        scenario: String,
        known: Vec<String>,
    },
    #[error(
        "scenario {scenario} has {} variants: choose the one that decides with --variant (one of: {})",
        known.len(),
        known.join(", ")
    )]
    ChooseVariant {
        scenario: String,
        known: Vec<String>,
    },
    #[error("--git {}: not a Linux source tree (no {missing})", tree.display())]
    NotKernelTree {
        tree: PathBuf,
        missing: &'static str,
    },
    #[error(
        "--good {good_rev} and --bad {bad_rev} are the same commit ({}): nothing to bisect",
        short(commit)
    )]
    SameCommit {
        good_rev: String,
        bad_rev: String,
        commit: String,
    },
    #[error(
        "--good {good_rev} is not an ancestor of --bad {bad_rev}: give the older commit as --good"
    )]
    NotAncestor { good_rev: String, bad_rev: String },
    #[error(
        "a git bisect is already under way in {} (finish it, or git bisect reset)",
        tree.display()
    )]
    AlreadyBisecting { tree: PathBuf },
    #[error(
        "{} has uncommitted changes to tracked files ({}): commit or stash them first \
         (bisect checks out other commits)",
        tree.display(),
        first_three(files)
    )]
    Uncommitted { tree: PathBuf, files: Vec<String> },
    #[error(transparent)]
    Git(#[from] GitError),
    /// An end of the range (`good end`, `bad end`) could not be measured.
    #[error("the {role} {} cannot be measured: {source}", short(commit))]
    EndNotMeasured {
        role: &'static str,
        commit: String,
        #[source]
        source: Box<StepError>,
    },
    #[error(transparent)]
    EndsOverlap(#[from] EndsOverlap),
    #[error(
        "the good end {} is not good by the boundary ({metric} {} {:.1}): a wrong --threshold?",
        short(commit),
        boundary.bad_side(),
        boundary.value
    )]
    GoodEndNotGood {
        commit: String,
        metric: &'static str,
        boundary: Boundary,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Scenario(#[from] scenario::ScenarioError),
    #[error(transparent)]
    Image(#[from] images::ImageError),
    #[error(transparent)]
    Report(#[from] crate::report::compare::ReportError),
}

/// Why one commit could not be measured (it is then skipped; at an end of
/// the range the bisection stops with [`BisectError::EndNotMeasured`]).
#[derive(Debug, Error)]
pub enum StepError {
    #[error("build failed: {0}")]
    Build(#[source] BuildError),
    #[error(transparent)]
    Measure(#[from] MeasureError),
}

/// A commit's first 12 hex digits (a full one has 40).
pub(crate) fn short(commit: &str) -> &str {
    commit.get(..12).unwrap_or(commit)
}

/// The first three of `files`, and an ellipsis when there are more.
fn first_three(files: &[String]) -> String {
    let mut s = files.iter().take(3).cloned().collect::<Vec<_>>().join(", ");
    if files.len() > 3 {
        s.push_str(", …");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uncommitted_files_are_named_up_to_three() {
        let e = BisectError::Uncommitted {
            tree: PathBuf::from("/t"),
            files: ["a", "b", "c", "d"].map(String::from).to_vec(),
        };
        assert!(
            e.to_string()
                .starts_with("/t has uncommitted changes to tracked files (a, b, c, …): "),
            "{e}"
        );
        let e = BisectError::Uncommitted {
            tree: PathBuf::from("/t"),
            files: vec!["Makefile".into()],
        };
        assert!(e.to_string().contains("(Makefile): commit or stash"), "{e}");
    }
}
