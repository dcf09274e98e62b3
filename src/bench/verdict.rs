//! A target, as measured: what was compared, its value, the target it is
//! held to and whether it meets it. `--compare` and `--instructions` both
//! end with a list of these; how a value is computed is theirs to know.

use serde::Serialize;

/// A target from the issue, as measured.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    pub what: String,
    pub value: f64,
    pub target: String,
    pub pass: bool,
}
