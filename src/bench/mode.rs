//! What `blklab bench` does, as one of its three modes, and running it:
//! the report rendered as text or JSON, and how many requests failed (the
//! command's exit status).

use serde::Serialize;

use super::instructions::{self, InsnOpts};
use super::versus_qsd::{self, CompareOpts};
use super::{BenchError, Load};

/// One `blklab bench` invocation.
#[derive(Debug, Clone)]
pub enum BenchMode {
    /// Drive one socket with one load (`--socket`).
    Load(Load),
    /// qemu-storage-daemon against `blklab serve`, the ratio table
    /// (`--compare`).
    Compare(CompareOpts),
    /// The backends' instructions per request under callgrind
    /// (`--instructions`).
    Instructions(InsnOpts),
}

/// What a mode printed, and how many of its requests failed.
#[derive(Debug)]
pub struct BenchOutcome {
    /// The report: text, or pretty JSON; ends in a newline.
    pub output: String,
    pub failed_requests: u64,
}

impl BenchMode {
    /// The command as the user gave it, for the message of a failure:
    /// `blklab bench --compare`, `blklab bench SOCKET`.
    pub fn command(&self) -> String {
        match self {
            BenchMode::Load(load) => format!("blklab bench {}", load.socket.display()),
            BenchMode::Compare(_) => "blklab bench --compare".to_string(),
            BenchMode::Instructions(_) => "blklab bench --instructions".to_string(),
        }
    }

    /// Run the mode (`progress` gets the comparisons' progress lines) and
    /// render its report, as JSON when `json`.
    pub fn run(&self, json: bool, progress: impl FnMut(&str)) -> Result<BenchOutcome, BenchError> {
        match self {
            BenchMode::Load(load) => {
                let report = super::run(load)?;
                let failed_requests = report.errors;
                Ok(BenchOutcome {
                    output: render(json, &report, || report.text())?,
                    failed_requests,
                })
            }
            BenchMode::Compare(opts) => compare(opts, json, progress),
            BenchMode::Instructions(opts) => instructions(opts, json, progress),
        }
    }
}

fn compare(
    opts: &CompareOpts,
    json: bool,
    progress: impl FnMut(&str),
) -> Result<BenchOutcome, BenchError> {
    let report = versus_qsd::run(opts, progress)?;
    let failed_requests = report
        .rows
        .iter()
        .flat_map(|r| r.cells.iter())
        .map(|c| c.errors)
        .sum();
    Ok(BenchOutcome {
        output: render(json, &report, || report.table())?,
        failed_requests,
    })
}

fn instructions(
    opts: &InsnOpts,
    json: bool,
    progress: impl FnMut(&str),
) -> Result<BenchOutcome, BenchError> {
    let report = instructions::run(opts, progress)?;
    Ok(BenchOutcome {
        output: render(json, &report, || report.text())?,
        failed_requests: 0,
    })
}

/// `report` as pretty JSON and a newline when `json`, else its `text`.
fn render<T: Serialize>(
    json: bool,
    report: &T,
    text: impl FnOnce() -> String,
) -> Result<String, BenchError> {
    if json {
        let doc = serde_json::to_string_pretty(report).map_err(BenchError::Json)?;
        Ok(doc + "\n")
    } else {
        Ok(text())
    }
}
