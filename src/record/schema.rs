//! The JSON Schemas of blklab's documents, generated from their types
//! (`docs/schema/*.schema.json`; `tests/schema.rs` checks that the files
//! are current and validates recorded documents against them; the
//! command in [`REGENERATE`] rewrites them).

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::record::result::ResultRecord;
use crate::record::run::RunDocument;
use crate::record::summary::SummaryDocument;
use crate::record::{Document, RecordError};
use crate::stats::queue::StatsDocument;

/// How to regenerate the checked-in files (`examples/write_schemas.rs`,
/// which calls [`write_all`] on `docs/schema/`).
pub const REGENERATE: &str = "cargo run --example write_schemas";

/// The schema of one document type, as a JSON value.
pub(crate) fn of<T: Document>() -> Value {
    let mut v = schemars::schema_for!(T).to_value();
    if let Some(o) = v.as_object_mut() {
        o.insert(
            "$comment".into(),
            Value::String(format!(
                "{}: generated from blklab's Rust types (blklab::record::schema); regenerate with `{REGENERATE}`",
                T::SCHEMA
            )),
        );
    }
    v
}

fn file<T: Document>() -> (String, String) {
    let text = serde_json::to_string_pretty(&of::<T>()).expect("schemas serialize");
    (format!("{}.schema.json", T::NAME), text + "\n")
}

/// Every document's schema: (file name in docs/schema/, its text).
pub fn all() -> Vec<(String, String)> {
    vec![
        file::<StatsDocument>(),
        file::<RunDocument>(),
        file::<ResultRecord>(),
        file::<SummaryDocument>(),
    ]
}

/// Write every document's schema into `dir` (made if missing), replacing
/// what is there; the files written.
pub fn write_all(dir: &Path) -> Result<Vec<PathBuf>, RecordError> {
    let write = |path: &Path, source| RecordError::Write {
        path: path.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(|e| write(dir, e))?;
    all()
        .into_iter()
        .map(|(name, text)| {
            let path = dir.join(name);
            std::fs::write(&path, text).map_err(|e| write(&path, e))?;
            Ok(path)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_all_writes_every_schema_as_generated() {
        let dir = tempfile::tempdir().unwrap();
        let into = dir.path().join("schema");
        let written = write_all(&into).unwrap();
        let all = all();
        assert_eq!(written.len(), all.len());
        for ((name, text), path) in all.iter().zip(&written) {
            assert_eq!(*path, into.join(name));
            assert_eq!(std::fs::read_to_string(path).unwrap(), *text);
            assert!(
                text.contains(&format!("regenerate with `{REGENERATE}`")),
                "{name}"
            );
        }
        // A stale file is replaced.
        std::fs::write(&written[0], "{}").unwrap();
        write_all(&into).unwrap();
        assert_eq!(std::fs::read_to_string(&written[0]).unwrap(), all[0].1);
        // A directory that cannot be made is an error naming it.
        let blocked = dir.path().join("file");
        std::fs::write(&blocked, "").unwrap();
        let e = write_all(&blocked.join("schema")).unwrap_err();
        assert!(e.to_string().contains("file/schema"), "{e}");
    }
}
