//! The JSON Schemas of blklab's documents, generated from their types
//! (`docs/schema/*.schema.json`; `tests/schema.rs` checks that the files
//! are current and validates recorded documents against them).

use serde_json::Value;

use crate::record::result::ResultRecord;
use crate::record::run::RunDocument;
use crate::record::summary::SummaryDocument;
use crate::record::Document;
use crate::stats::queue::StatsDocument;

/// How to regenerate the checked-in files.
pub const REGENERATE: &str = "BLKLAB_WRITE_SCHEMAS=1 cargo test --test schema";

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
