//! Valgrind's callgrind as an instruction counter: the command that runs a
//! program under it, and a reader of its output file (the total and each
//! function's own instructions).
//!
//! callgrind counts the instructions a process executes (every thread, in
//! user space) rather than time, so two runs of the same work give the
//! same count whatever else the machine is doing. Its output format is
//! documented in valgrind's "Callgrind Format Specification": `fn=` names
//! the function the following cost lines belong to; a `calls=` line says
//! that the next cost line is the inclusive cost of a call (not the
//! caller's own); names may be compressed to `(id) name` on first use and
//! `(id)` afterwards.

use std::collections::HashMap;
use std::num::ParseIntError;
use std::path::Path;
use std::process::Command;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum CallgrindError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: not a callgrind output file ({why})")]
    Format {
        path: String,
        #[source]
        why: FormatError,
    },
}

/// Why a text is not callgrind output as [`command`] records it.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum FormatError {
    #[error("bad cost line {line:?}: {source}")]
    BadCost {
        line: String,
        #[source]
        source: ParseIntError,
    },
    #[error("cost line before any fn=: {line:?}")]
    CostBeforeFunction { line: String },
    #[error("first event is not Ir: {events:?}")]
    NotInstructions { events: String },
    #[error("bad total {line:?}: {source}")]
    BadTotal {
        line: String,
        #[source]
        source: ParseIntError,
    },
    #[error("no events: line")]
    NoEvents,
    #[error("the cost lines add up to {lines} instructions, the file says {stated}")]
    TotalMismatch { lines: u64, stated: u64 },
}

/// `valgrind --tool=callgrind` writing its counts to `out`, running
/// `program` (arguments are added by the caller).
pub(crate) fn command(valgrind: &Path, out: &Path, program: &Path) -> Command {
    let mut c = Command::new(valgrind);
    c.arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out.display()))
        // Instruction counts only (the default event), no cache or branch
        // simulation: the cheapest and exactly repeatable configuration.
        .arg("--quiet")
        .arg(program);
    c
}

/// What one callgrind output file says: the instructions executed in all,
/// and each function's own (exclusive) instructions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Profile {
    pub total: u64,
    /// Function name (as callgrind demangled it) → its own instructions.
    pub self_cost: HashMap<String, u64>,
}

impl Profile {
    pub(crate) fn read(path: &Path) -> Result<Profile, CallgrindError> {
        let text = std::fs::read_to_string(path).map_err(|source| CallgrindError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Profile::parse(&text).map_err(|why| CallgrindError::Format {
            path: path.display().to_string(),
            why,
        })
    }

    /// Parse callgrind output text (one event, `Ir`, as [`command`]
    /// records; any number of parts).
    pub(crate) fn parse(text: &str) -> Result<Profile, FormatError> {
        let mut names: HashMap<String, String> = HashMap::new();
        let mut p = Profile::default();
        let mut current: Option<String> = None;
        let mut call_cost_next = false;
        let mut stated_total: Option<u64> = None;
        let mut saw_events = false;
        for line in text.lines() {
            let Some(first) = line.chars().next() else {
                continue;
            };
            if first.is_ascii_digit() || matches!(first, '+' | '-' | '*') {
                // A cost line: position, then the event counts.
                if call_cost_next {
                    // The inclusive cost of the call just described.
                    call_cost_next = false;
                    continue;
                }
                let ir = line
                    .split_ascii_whitespace()
                    .nth(1)
                    .map(|v| v.parse::<u64>())
                    .transpose()
                    .map_err(|source| FormatError::BadCost {
                        line: line.to_string(),
                        source,
                    })?
                    .unwrap_or(0);
                let Some(f) = &current else {
                    return Err(FormatError::CostBeforeFunction {
                        line: line.to_string(),
                    });
                };
                *p.self_cost.entry(f.clone()).or_default() += ir;
                p.total += ir;
            } else if let Some(v) = line.strip_prefix("fn=") {
                current = Some(resolve(&mut names, v));
            } else if line.starts_with("calls=") {
                call_cost_next = true;
            } else if let Some(v) = line.strip_prefix("cfn=") {
                // Define a compressed name without switching to it.
                resolve(&mut names, v);
            } else if let Some(v) = line.strip_prefix("events:") {
                saw_events = true;
                if v.split_ascii_whitespace().next() != Some("Ir") {
                    return Err(FormatError::NotInstructions {
                        events: v.to_string(),
                    });
                }
            } else if let Some(v) = line
                .strip_prefix("totals:")
                .or_else(|| line.strip_prefix("summary:"))
            {
                let n = v
                    .split_ascii_whitespace()
                    .next()
                    .unwrap_or("")
                    .parse::<u64>()
                    .map_err(|source| FormatError::BadTotal {
                        line: line.to_string(),
                        source,
                    })?;
                stated_total = Some(stated_total.map_or(n, |t: u64| t.max(n)));
            }
        }
        if !saw_events {
            return Err(FormatError::NoEvents);
        }
        if let Some(t) = stated_total {
            if t != p.total {
                return Err(FormatError::TotalMismatch {
                    lines: p.total,
                    stated: t,
                });
            }
        }
        Ok(p)
    }

    /// `later − self`, per function, divided by `per`: what the extra work
    /// of the longer run cost, per unit of it. Most expensive first; only
    /// functions with a positive difference.
    pub(crate) fn difference(&self, later: &Profile, per: f64) -> Vec<(String, f64)> {
        let mut v: Vec<(String, f64)> = later
            .self_cost
            .iter()
            .filter_map(|(f, &b)| {
                let a = self.self_cost.get(f).copied().unwrap_or(0);
                (b > a).then(|| (f.clone(), (b - a) as f64 / per))
            })
            .collect();
        v.sort_by(|x, y| y.1.total_cmp(&x.1).then_with(|| x.0.cmp(&y.0)));
        v
    }
}

/// A name field: `(id) name` defines id, `(id)` refers to it, anything
/// else is the name itself.
fn resolve(names: &mut HashMap<String, String>, field: &str) -> String {
    let field = field.trim();
    if let Some(rest) = field.strip_prefix('(') {
        if let Some((id, name)) = rest.split_once(')') {
            let name = name.trim();
            if name.is_empty() {
                return names
                    .get(id)
                    .cloned()
                    .unwrap_or_else(|| format!("(unknown {id})"));
            }
            names.insert(id.to_string(), name.to_string());
            return name.to_string();
        }
    }
    field.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
# callgrind format
version: 1
creator: callgrind-3.19.0
events: Ir
summary: 1110

ob=(1) /bin/prog
fl=(1) main.c
fn=(1) main
10 100
cfl=(1)
cfn=(2) work
calls=3 20
11 1000
fn=(2)
20 900
+1 5
*  5
fn=(3) helper
30 100
";

    #[test]
    fn self_costs_exclude_calls_and_resolve_compressed_names() {
        let p = Profile::parse(SAMPLE).unwrap();
        assert_eq!(p.total, 1110);
        assert_eq!(p.self_cost["main"], 100);
        assert_eq!(p.self_cost["work"], 910);
        assert_eq!(p.self_cost["helper"], 100);
    }

    #[test]
    fn a_mismatched_total_or_a_foreign_file_is_an_error() {
        let bad = SAMPLE.replace("summary: 1110", "summary: 1111");
        assert_eq!(
            Profile::parse(&bad).unwrap_err(),
            FormatError::TotalMismatch {
                lines: 1110,
                stated: 1111
            }
        );
        assert_eq!(
            Profile::parse("hello\n").unwrap_err(),
            FormatError::NoEvents
        );
        let cache = SAMPLE.replace("events: Ir", "events: Dr");
        assert!(matches!(
            Profile::parse(&cache),
            Err(FormatError::NotInstructions { .. })
        ));
    }

    #[test]
    fn difference_per_unit_lists_what_grew() {
        let a = Profile::parse(SAMPLE).unwrap();
        let b = Profile::parse(
            &SAMPLE
                .replace("20 900", "20 2900")
                .replace("summary: 1110", "summary: 3110"),
        )
        .unwrap();
        let d = a.difference(&b, 1000.0);
        assert_eq!(d, vec![("work".to_string(), 2.0)]);
    }
}
