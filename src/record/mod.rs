//! Layer 6, the contract between the lab and the report: the documents a
//! run writes, as typed values that serialize and deserialize, and the
//! metrics the report derives from them.
//!
//! - [`run::RunDocument`]: `run.json` (`blklab-run/1`);
//! - [`result::ResultRecord`]: one `KERNEL.SCENARIO.VARIANT.NN.json` per
//!   variant and boot (`blklab-run-result/1`), embedding the guest's
//!   document ([`guest`]), the backend's stats document
//!   ([`crate::stats::queue::StatsDocument`], `blklab-stats/1`), the host's
//!   CPU ([`crate::util::hostcpu::ProcessCpu`]), the instruction
//!   profile ([`instructions`]), KVM's vCPU statistics ([`kvm`]) and how
//!   many of its vCPUs could run at once ([`parallelism`]);
//! - [`summary::SummaryDocument`]: `summary.json` (`blklab-run-summary/1`).
//!
//! Each carries its `schema` string; [`read`] refuses another name or
//! major version, naming the file and both versions. The JSON Schemas in
//! docs/schema/ are generated from these types ([`schema::all`]).

pub mod guest;
pub mod host_cost;
pub(crate) mod host_split;
pub(crate) mod instructions;
pub(crate) mod kvm;
pub(crate) mod machine;
pub(crate) mod metrics;
pub(crate) mod parallelism;
pub mod result;
pub mod run;
pub(crate) mod scenario;
pub mod schema;
pub mod summary;
pub mod symbol_groups;

use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use thiserror::Error;

use crate::stats::queue::{StatsDocument, STATS_SCHEMA};

/// A top-level document: its schema version and its name in docs/schema/.
pub trait Document: Serialize + DeserializeOwned + JsonSchema {
    /// The `schema` string this blklab writes and reads.
    const SCHEMA: &'static str;
    /// `docs/schema/NAME.schema.json`.
    const NAME: &'static str;
}

impl Document for StatsDocument {
    const SCHEMA: &'static str = STATS_SCHEMA;
    const NAME: &'static str = "stats";
}

#[derive(Debug, Error)]
pub enum RecordError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: document schema {found:?} is not supported: this blklab reads {supported:?}")]
    Schema {
        path: PathBuf,
        found: String,
        supported: &'static str,
    },
    #[error("{path} is not a {supported} document: {source}")]
    Parse {
        path: PathBuf,
        supported: &'static str,
        source: serde_json::Error,
    },
}

/// The JSON of a file, untyped (to look at its `schema` first).
pub fn read_value(path: &Path) -> Result<Value, RecordError> {
    let text = std::fs::read_to_string(path).map_err(|source| RecordError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|source| RecordError::Io {
        path: path.to_path_buf(),
        source: source.into(),
    })
}

/// The `schema` string of a document, if it has one.
pub(crate) fn schema_of(v: &Value) -> Option<&str> {
    v.get("schema").and_then(Value::as_str)
}

/// A document of type `T` from `v` (read from `path`): its schema version
/// checked first, then its fields.
pub(crate) fn from_value<T: Document>(path: &Path, v: &Value) -> Result<T, RecordError> {
    if let Some(found) = schema_of(v) {
        if crate::util::schema::check(found, T::SCHEMA).is_err() {
            return Err(RecordError::Schema {
                path: path.to_path_buf(),
                found: found.to_string(),
                supported: T::SCHEMA,
            });
        }
    }
    T::deserialize(v).map_err(|source| RecordError::Parse {
        path: path.to_path_buf(),
        supported: T::SCHEMA,
        source,
    })
}

/// Read a document of type `T` from `path`.
pub fn read<T: Document>(path: &Path) -> Result<T, RecordError> {
    from_value(path, &read_value(path)?)
}

/// Write a document as indented JSON with a final newline.
pub(crate) fn write<T: Serialize>(path: &Path, doc: &T) -> Result<(), RecordError> {
    let err = |source| RecordError::Write {
        path: path.to_path_buf(),
        source,
    };
    let text = serde_json::to_string_pretty(doc).map_err(|e| err(e.into()))?;
    std::fs::write(path, text + "\n").map_err(err)
}
