//! Schema versions of the JSON documents blklab writes and reads.
//!
//! Every document carries a `schema` string `NAME/MAJOR` (`blklab-stats/1`,
//! `blklab-run-result/1`, …; `NAME/MAJOR.MINOR` is read as `MAJOR`). A
//! reader accepts its own name and major version, whatever fields the
//! document adds (new fields do not change the major version), and refuses
//! anything else with both versions named.

use std::fmt;

use serde::{Deserialize, Deserializer};

/// A document's `schema` is not the one this blklab reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SchemaMismatch {
    /// What the document says.
    pub found: String,
    /// What this blklab reads.
    pub supported: &'static str,
}

impl fmt::Display for SchemaMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "document schema {:?} is not supported: this blklab reads {:?}",
            self.found, self.supported
        )
    }
}

impl std::error::Error for SchemaMismatch {}

/// `NAME/MAJOR[.MINOR]` → (NAME, MAJOR).
fn name_and_major(s: &str) -> Option<(&str, &str)> {
    let (name, version) = s.rsplit_once('/')?;
    let major = version.split('.').next()?;
    (!name.is_empty() && !major.is_empty() && major.bytes().all(|b| b.is_ascii_digit()))
        .then_some((name, major))
}

/// Accept `found` when it has `supported`'s name and major version.
pub(crate) fn check(found: &str, supported: &'static str) -> Result<(), SchemaMismatch> {
    match (name_and_major(found), name_and_major(supported)) {
        (Some(f), Some(s)) if f == s => Ok(()),
        _ => Err(SchemaMismatch {
            found: found.to_string(),
            supported,
        }),
    }
}

/// The JSON Schema `pattern` of a `schema` field that reads `supported`
/// (`NAME/MAJOR`): that name and major version, any minor version.
pub(crate) fn pattern(supported: &str) -> String {
    let (name, major) = name_and_major(supported).expect("a NAME/MAJOR schema string");
    let mut escaped = String::new();
    for c in name.chars() {
        if r".^$*+?()[]{}|\".contains(c) {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    format!("^{escaped}/{major}(\\.[0-9]+)?$")
}

/// Deserialize a `schema` field and [`check`] it against `supported`: a
/// document of another name or major version fails to read, naming both.
pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
    d: D,
    supported: &'static str,
) -> Result<String, D::Error> {
    let found = String::deserialize(d)?;
    check(&found, supported).map_err(serde::de::Error::custom)?;
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_name_and_major_only() {
        assert!(check("blklab-stats/1", "blklab-stats/1").is_ok());
        assert!(check("blklab-stats/1.3", "blklab-stats/1").is_ok());
        let e = check("blklab-stats/2", "blklab-stats/1").unwrap_err();
        assert_eq!(
            e.to_string(),
            "document schema \"blklab-stats/2\" is not supported: this blklab reads \"blklab-stats/1\""
        );
        assert!(check("blklab-run/1", "blklab-stats/1").is_err());
        assert!(check("blklab-stats", "blklab-stats/1").is_err());
        assert!(check("blklab-stats/x", "blklab-stats/1").is_err());
        assert!(check("", "blklab-stats/1").is_err());
    }

    #[test]
    fn pattern_matches_what_check_accepts() {
        assert_eq!(
            pattern("blklab-run-result/1"),
            "^blklab-run-result/1(\\.[0-9]+)?$"
        );
    }
}
