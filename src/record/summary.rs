//! `summary.json` (schema [`SUMMARY_SCHEMA`]): the failures of a run, the
//! boots tried twice and, per (scenario, variant, kernel), the mean and
//! spread of the headline metrics over iterations (`lab::run::summary` computes
//! them; `summary.txt` is the same as a table).

use std::collections::BTreeMap;
use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize};

use crate::record::Document;

/// The schema version of [`SummaryDocument`].
pub const SUMMARY_SCHEMA: &str = "blklab-run-summary/1";

/// Mean and sample standard deviation of one metric.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Stat {
    pub(crate) n: usize,
    pub(crate) mean: f64,
    pub(crate) sd: f64,
}

/// One (scenario, variant, kernel) row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Row {
    pub scenario: String,
    pub variant: String,
    pub kernel: String,
    /// Records of the row, failed ones included.
    pub iterations: usize,
    pub(crate) failed: usize,
    /// Iterations the run planned for the row that left no record (the
    /// run ended first, or its mode did not reach them): not run, counted
    /// apart, neither ok nor failed. 0 in summaries older than the count.
    #[serde(default)]
    pub not_run: usize,
    /// Metric key → its statistic over the ok records.
    pub(crate) metrics: BTreeMap<String, Stat>,
}

/// A boot whose console stayed silent and that was tried once more.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RetriedBoot {
    pub(crate) kernel: String,
    pub(crate) scenario: String,
    pub(crate) iteration: u32,
    /// Why the first attempt failed.
    pub(crate) error: String,
    /// The first attempt's console log.
    pub(crate) console: PathBuf,
}

/// A nested host given up: silent, without progress by the step's
/// timeout, or with its kernel's stall or fault report on its console.
/// The outer lab kept its state and booted a fresh host for the boots it
/// had not finished, if any were left.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RetriedHost {
    /// Which host of the run (1 the first).
    pub(crate) attempt: u32,
    /// What the outer lab was waiting for when the host fell silent.
    pub(crate) waiting_for: String,
    /// How long the host had said nothing when it was given up.
    pub(crate) quiet_seconds: f64,
    /// Its vCPU threads' CPU time over the last `--host-silence` of it.
    pub(crate) vcpu_seconds: f64,
    /// Its vCPUs were busy: given up at the step's timeout, stuck rather
    /// than idle.
    #[serde(default)]
    pub(crate) busy: bool,
    /// The host kernel's own stall report that gave it up (a soft lockup,
    /// an RCU stall, a blocked task: its first line), when that came before
    /// any silence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) watchdog: Option<String>,
    /// The host kernel's fault report that gave it up (an oops, a BUG: its
    /// first line; the whole report is in its console log).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) fault: Option<String>,
    /// The plan's boots it finished, whose records were kept.
    pub(crate) boots_kept: Vec<usize>,
    /// Its state as kept (QMP's view, the console after an NMI).
    pub(crate) state: PathBuf,
    /// Its console log.
    pub(crate) console: PathBuf,
}

fn summary_schema_pattern() -> String {
    crate::util::schema::pattern(SUMMARY_SCHEMA)
}

fn check_summary_schema<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    crate::util::schema::deserialize(d, SUMMARY_SCHEMA)
}

/// `summary.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "blklab run summary (summary.json)")]
pub struct SummaryDocument {
    /// [`SUMMARY_SCHEMA`].
    #[serde(deserialize_with = "check_summary_schema")]
    #[schemars(pattern(summary_schema_pattern()))]
    pub schema: String,
    /// Seconds since the Unix epoch.
    pub finished_unix: f64,
    /// One line per failed variant or boot.
    pub failures: Vec<String>,
    #[serde(default)]
    pub retried_boots: Vec<RetriedBoot>,
    /// With `--accel nested`: the hosts that went silent and were replaced.
    #[serde(default)]
    pub retried_hosts: Vec<RetriedHost>,
    pub rows: Vec<Row>,
}

impl Document for SummaryDocument {
    const SCHEMA: &'static str = SUMMARY_SCHEMA;
    const NAME: &'static str = "summary";
}
