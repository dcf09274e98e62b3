//! Fault injection, in the spirit of scsi_debug's `every_nth` and
//! null_blk's `badblocks`: the `--fail-every`, `--fail-range` and
//! `--stall-every` values and the per-queue decision state.
//!
//! # Forms
//!
//! | value | meaning |
//! |---|---|
//! | `--fail-every N` | every Nth data request (any op) completes with IOERR |
//! | `--fail-every N:OP` | every Nth request of `OP` completes with IOERR |
//! | `--fail-range START..END` | a read, write, discard or write-zeroes touching a sector in `[START, END)` completes with IOERR |
//! | `--stall-every N:DURATION` | every Nth data request is held for `DURATION`, then succeeds |
//!
//! `OP` is one of `read`, `write`, `flush`, `discard`, `write-zeroes` or
//! `any` (the default). `N >= 1`. Sectors are 512 bytes; `END` is exclusive
//! and `START < END`. `DURATION` is a fixed, non-zero duration in the form
//! of [`LatencySpec`] (`35s`, `2.5ms`); distributions are rejected.
//! `--fail-every` and `--fail-range` may be given several times.
//!
//! Every value prints in the form it parses (`Display` round-trips through
//! `FromStr`), and serde uses that string form.
//!
//! # Semantics
//!
//! - **Data ops** are read, write, flush, discard and write-zeroes. GetId
//!   and unknown requests are never failed, stalled or counted.
//! - **Counting is per queue**: each queue's worker owns one [`FaultState`]
//!   and counts only its own requests, so with several queues "every Nth"
//!   is every Nth *on that queue*. Decisions are deterministic for a fixed
//!   submission order per queue.
//! - **Every Nth** is 1-based: the Nth, 2Nth, 3Nth, … request of the
//!   matching op is hit. A `--fail-every` rule with op `any` and
//!   `--stall-every` count every data op (flush included); a rule with a
//!   specific op counts only that op.
//! - **Every data request is counted**, whatever is decided for it: a
//!   request failed by a range, failed by another rule, or stalled still
//!   advances every counter it matches. So the rules are independent of
//!   each other, and a stalled request counts towards `--fail-every`.
//! - **Precedence**: fail-every wins over fail-range, which wins over
//!   stall. A request hit by several rules gets one decision and bumps one
//!   [`FaultCounters`] field.
//! - **Ranges**: a request touching `[s, s + n)` fails if it intersects
//!   `[START, END)`, i.e. `s < END && s + n > START` (computed without
//!   overflow). Zero-length ranges touch nothing; flushes have no sectors
//!   and are never failed by a range.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::device::latency::LatencySpec;
use crate::virtio_blk::request::Op;

/// The op a `--fail-every` rule counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum FaultOp {
    Read,
    Write,
    Flush,
    Discard,
    WriteZeroes,
    /// Every data op (read, write, flush, discard, write-zeroes).
    #[default]
    Any,
}

/// Why a fault value was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FaultParseError {
    #[error("unknown op {input:?}; expected read, write, flush, discard, write-zeroes or any")]
    Op { input: String },
    #[error("{flag}: expected {expected}, got {input:?}")]
    Form {
        flag: &'static str,
        expected: &'static str,
        input: String,
    },
    #[error("{flag}: invalid count {input:?}; expected a whole number >= 1")]
    Count { flag: &'static str, input: String },
    #[error("--fail-range: invalid sector {input:?}; expected a whole number")]
    Sector { input: String },
    #[error("--fail-range: START {start} must be less than END {end} (END is exclusive)")]
    RangeOrder { start: u64, end: u64 },
    #[error("--stall-every: invalid duration {input:?}: must be greater than 0")]
    ZeroStall { input: String },
    #[error("--stall-every: invalid duration {input:?}: expected a fixed duration such as 35s, not a distribution")]
    StallDistribution { input: String },
    #[error("--stall-every: invalid duration {input:?}: {source}")]
    StallDuration {
        input: String,
        source: crate::device::latency::LatencyParseError,
    },
}

const FAIL_EVERY: &str = "--fail-every";
const FAIL_RANGE: &str = "--fail-range";
const STALL_EVERY: &str = "--stall-every";

impl FaultOp {
    /// The fault op of a request kind; `None` for GetId and unknown
    /// requests, which are never counted or failed.
    pub(crate) fn from_op(op: Op) -> Option<FaultOp> {
        match op {
            Op::Read => Some(FaultOp::Read),
            Op::Write => Some(FaultOp::Write),
            Op::Flush => Some(FaultOp::Flush),
            Op::Discard => Some(FaultOp::Discard),
            Op::WriteZeroes => Some(FaultOp::WriteZeroes),
            Op::GetId | Op::Other => None,
        }
    }

    /// The CLI name.
    pub(crate) fn name(self) -> &'static str {
        match self {
            FaultOp::Read => "read",
            FaultOp::Write => "write",
            FaultOp::Flush => "flush",
            FaultOp::Discard => "discard",
            FaultOp::WriteZeroes => "write-zeroes",
            FaultOp::Any => "any",
        }
    }

    /// Index into per-op counters.
    fn index(self) -> usize {
        match self {
            FaultOp::Read => 0,
            FaultOp::Write => 1,
            FaultOp::Flush => 2,
            FaultOp::Discard => 3,
            FaultOp::WriteZeroes => 4,
            FaultOp::Any => 5,
        }
    }
}

impl FromStr for FaultOp {
    type Err = FaultParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "read" => Ok(FaultOp::Read),
            "write" => Ok(FaultOp::Write),
            "flush" => Ok(FaultOp::Flush),
            "discard" => Ok(FaultOp::Discard),
            "write-zeroes" => Ok(FaultOp::WriteZeroes),
            "any" => Ok(FaultOp::Any),
            _ => Err(FaultParseError::Op {
                input: s.trim().into(),
            }),
        }
    }
}

impl fmt::Display for FaultOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `--fail-every N[:OP]`: every Nth request of `op` completes with IOERR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailEvery {
    pub n: u64,
    pub op: FaultOp,
}

/// `--fail-range START..END`: requests touching a sector in `[start, end)`
/// complete with IOERR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailRange {
    pub start: u64,
    pub end: u64,
}

/// `--stall-every N:DURATION`: every Nth data request is held for
/// `duration`, then succeeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StallEvery {
    pub n: u64,
    pub duration: Duration,
}

/// Parses a whole number of ASCII digits (no sign, no spaces inside).
fn parse_digits(s: &str) -> Option<u64> {
    let s = s.trim();
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Parses the `N` of `--fail-every` / `--stall-every`: `N >= 1`.
fn parse_count(flag: &'static str, s: &str) -> Result<u64, FaultParseError> {
    parse_digits(s)
        .filter(|&n| n >= 1)
        .ok_or_else(|| FaultParseError::Count {
            flag,
            input: s.trim().into(),
        })
}

impl FromStr for FailEvery {
    type Err = FaultParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let (n, op) = match s.split_once(':') {
            Some((n, op)) => {
                if op.trim().is_empty() {
                    return Err(FaultParseError::Form {
                        flag: FAIL_EVERY,
                        expected: "N or N:OP",
                        input: s.into(),
                    });
                }
                (n, op.parse()?)
            }
            None => (s, FaultOp::Any),
        };
        Ok(FailEvery {
            n: parse_count(FAIL_EVERY, n)?,
            op,
        })
    }
}

impl fmt::Display for FailEvery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.op {
            FaultOp::Any => write!(f, "{}", self.n),
            op => write!(f, "{}:{}", self.n, op),
        }
    }
}

impl FailRange {
    /// Whether `[sector, sector + nsectors)` intersects this range.
    pub(crate) fn touches(&self, sector: u64, nsectors: u64) -> bool {
        // Saturating is exact here: start < end <= u64::MAX, so a capped
        // end still compares correctly against `self.start`.
        nsectors > 0 && sector < self.end && sector.saturating_add(nsectors) > self.start
    }
}

impl FromStr for FailRange {
    type Err = FaultParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let form = || FaultParseError::Form {
            flag: FAIL_RANGE,
            expected: "START..END",
            input: s.into(),
        };
        let (start, end) = s.split_once("..").ok_or_else(form)?;
        if start.trim().is_empty() || end.trim().is_empty() || end.contains("..") {
            return Err(form());
        }
        let sector = |v: &str| {
            parse_digits(v).ok_or_else(|| FaultParseError::Sector {
                input: v.trim().into(),
            })
        };
        let (start, end) = (sector(start)?, sector(end)?);
        if start >= end {
            return Err(FaultParseError::RangeOrder { start, end });
        }
        Ok(FailRange { start, end })
    }
}

impl fmt::Display for FailRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}..{}", self.start, self.end)
    }
}

impl FromStr for StallEvery {
    type Err = FaultParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let form = || FaultParseError::Form {
            flag: STALL_EVERY,
            expected: "N:DURATION",
            input: s.into(),
        };
        let (n, duration) = s.split_once(':').ok_or_else(form)?;
        if n.trim().is_empty() || duration.trim().is_empty() {
            return Err(form());
        }
        let n = parse_count(STALL_EVERY, n)?;
        let input = || duration.trim().to_string();
        let duration = match duration.parse::<LatencySpec>() {
            Ok(LatencySpec::Fixed(d)) if !d.is_zero() => d,
            Ok(LatencySpec::Zero) | Ok(LatencySpec::Fixed(_)) => {
                return Err(FaultParseError::ZeroStall { input: input() })
            }
            Ok(_) => return Err(FaultParseError::StallDistribution { input: input() }),
            Err(source) => {
                return Err(FaultParseError::StallDuration {
                    input: input(),
                    source,
                })
            }
        };
        Ok(StallEvery { n, duration })
    }
}

impl fmt::Display for StallEvery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.n, LatencySpec::Fixed(self.duration))
    }
}

macro_rules! serde_as_string {
    ($($t:ty),*) => {$(
        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(self)
            }
        }

        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let s = String::deserialize(deserializer)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }

        impl schemars::JsonSchema for $t {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                stringify!($t).into()
            }

            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                schemars::json_schema!({
                    "type": "string",
                    "description": "The command line's form of the option."
                })
            }
        }
    )*};
}

serde_as_string!(FaultOp, FailEvery, FailRange, StallEvery);

/// All fault rules of one disk.
#[derive(Default, Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct FaultConfig {
    #[serde(alias = "fail_every")]
    pub fail_every: Vec<FailEvery>,
    #[serde(alias = "fail_ranges")]
    pub fail_ranges: Vec<FailRange>,
    #[serde(alias = "stall_every")]
    pub stall_every: Option<StallEvery>,
}

impl FaultConfig {
    /// Whether no fault is configured (no per-request work is needed).
    pub(crate) fn is_empty(&self) -> bool {
        self.fail_every.is_empty() && self.fail_ranges.is_empty() && self.stall_every.is_none()
    }
}

/// What to do with one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FaultDecision {
    /// Execute it normally.
    None,
    /// Complete with IOERR without touching storage (`--fail-every`).
    FailEvery,
    /// Complete with IOERR without touching storage (`--fail-range`).
    FailRange,
    /// Execute it normally, but complete it only after this long.
    Stall(Duration),
}

/// How many faults a [`FaultState`] injected.
#[derive(Debug, Default, Clone, Serialize)]
pub(crate) struct FaultCounters {
    pub injected_fail_every: u64,
    pub injected_fail_range: u64,
    pub injected_stalls: u64,
}

/// Per-queue, deterministic decision state (counters of requests seen per
/// op); owned by one queue's worker, no atomics.
#[derive(Debug, Clone)]
pub(crate) struct FaultState {
    cfg: FaultConfig,
    /// Requests seen, indexed by [`FaultOp::index`]; `Any` counts every
    /// data op.
    seen: [u64; 6],
    counters: FaultCounters,
}

impl FaultState {
    pub(crate) fn new(cfg: &FaultConfig) -> FaultState {
        FaultState {
            cfg: cfg.clone(),
            seen: [0; 6],
            counters: FaultCounters::default(),
        }
    }

    /// Decides for one request about to be executed. `ranges` are the
    /// `(start sector, number of sectors)` it touches (one for read/write,
    /// the segments for discard/write-zeroes, none needed for flush).
    /// GetId and unknown requests get [`FaultDecision::None`] and are not
    /// counted.
    pub(crate) fn decide(&mut self, op: Op, ranges: &[(u64, u64)]) -> FaultDecision {
        let Some(fop) = FaultOp::from_op(op) else {
            return FaultDecision::None;
        };
        // Count first, unconditionally: every data request advances the
        // counters it matches, whatever is decided for it.
        self.seen[fop.index()] += 1;
        self.seen[FaultOp::Any.index()] += 1;
        let seen = &self.seen;
        let all = seen[FaultOp::Any.index()];

        let fail_every = self.cfg.fail_every.iter().any(|rule| {
            (rule.op == fop || rule.op == FaultOp::Any) && seen[rule.op.index()] % rule.n == 0
        });
        if fail_every {
            self.counters.injected_fail_every += 1;
            return FaultDecision::FailEvery;
        }

        if fop != FaultOp::Flush {
            let hit = self.cfg.fail_ranges.iter().any(|range| {
                ranges
                    .iter()
                    .any(|&(sector, nsectors)| range.touches(sector, nsectors))
            });
            if hit {
                self.counters.injected_fail_range += 1;
                return FaultDecision::FailRange;
            }
        }

        if let Some(stall) = self.cfg.stall_every {
            if all % stall.n == 0 {
                self.counters.injected_stalls += 1;
                return FaultDecision::Stall(stall.duration);
            }
        }
        FaultDecision::None
    }
}

#[cfg(test)]
impl FaultState {
    pub(crate) fn counters(&self) -> &FaultCounters {
        &self.counters
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fe(s: &str) -> Result<FailEvery, FaultParseError> {
        s.parse()
    }
    fn fr(s: &str) -> Result<FailRange, FaultParseError> {
        s.parse()
    }
    fn se(s: &str) -> Result<StallEvery, FaultParseError> {
        s.parse()
    }

    fn state(cfg: FaultConfig) -> FaultState {
        FaultState::new(&cfg)
    }

    #[test]
    fn parse_fail_every_forms() {
        assert_eq!(
            fe("3").unwrap(),
            FailEvery {
                n: 3,
                op: FaultOp::Any
            }
        );
        for (s, op) in [
            ("5:read", FaultOp::Read),
            ("5:write", FaultOp::Write),
            ("5:flush", FaultOp::Flush),
            ("5:discard", FaultOp::Discard),
            ("5:write-zeroes", FaultOp::WriteZeroes),
            ("5:any", FaultOp::Any),
            (" 5:WRITE ", FaultOp::Write),
        ] {
            assert_eq!(fe(s).unwrap(), FailEvery { n: 5, op }, "{s}");
        }
        assert_eq!(fe("1").unwrap().n, 1);
        assert_eq!(fe(&u64::MAX.to_string()).unwrap().n, u64::MAX);
    }

    #[test]
    fn parse_fail_every_bad() {
        assert!(matches!(fe("0"), Err(FaultParseError::Count { .. })));
        assert!(matches!(fe("0:write"), Err(FaultParseError::Count { .. })));
        assert!(matches!(fe("5:bogus"), Err(FaultParseError::Op { .. })));
        assert!(matches!(fe(""), Err(FaultParseError::Count { .. })));
        assert!(matches!(fe(":write"), Err(FaultParseError::Count { .. })));
        assert!(matches!(fe("5:"), Err(FaultParseError::Form { .. })));
        assert!(matches!(fe("-1"), Err(FaultParseError::Count { .. })));
        assert!(matches!(fe("+3"), Err(FaultParseError::Count { .. })));
        assert!(matches!(fe("x"), Err(FaultParseError::Count { .. })));
        assert!(matches!(fe("5:read:x"), Err(FaultParseError::Op { .. })));
        assert!(matches!(
            fe("99999999999999999999"),
            Err(FaultParseError::Count { .. })
        ));
        let msg = fe("5:bogus").unwrap_err().to_string();
        assert!(
            msg.contains("bogus") && msg.contains("write-zeroes"),
            "{msg}"
        );
        let msg = fe("0").unwrap_err().to_string();
        assert!(
            msg.contains("--fail-every") && msg.contains(">= 1"),
            "{msg}"
        );
    }

    #[test]
    fn parse_fail_range() {
        assert_eq!(fr("0..1").unwrap(), FailRange { start: 0, end: 1 });
        assert_eq!(
            fr(" 2048 .. 4096 ").unwrap(),
            FailRange {
                start: 2048,
                end: 4096
            }
        );
        let max = format!("0..{}", u64::MAX);
        assert_eq!(fr(&max).unwrap().end, u64::MAX);
        assert_eq!(
            fr("10..5"),
            Err(FaultParseError::RangeOrder { start: 10, end: 5 })
        );
        assert_eq!(
            fr("10..10"),
            Err(FaultParseError::RangeOrder { start: 10, end: 10 })
        );
        assert!(matches!(fr("x..y"), Err(FaultParseError::Sector { .. })));
        assert!(matches!(fr("1..y"), Err(FaultParseError::Sector { .. })));
        assert!(matches!(fr("-1..5"), Err(FaultParseError::Sector { .. })));
        for bad in ["", "10", "..5", "5..", "..", "1..2..3", "1...3"] {
            assert!(fr(bad).is_err(), "{bad:?}");
        }
        assert!(matches!(fr("10"), Err(FaultParseError::Form { .. })));
        assert!(matches!(fr("..5"), Err(FaultParseError::Form { .. })));
        assert!(matches!(fr("5.."), Err(FaultParseError::Form { .. })));
        let msg = fr("10..5").unwrap_err().to_string();
        assert!(msg.contains("10") && msg.contains("exclusive"), "{msg}");
    }

    #[test]
    fn parse_stall_every() {
        assert_eq!(
            se("10:35s").unwrap(),
            StallEvery {
                n: 10,
                duration: Duration::from_secs(35)
            }
        );
        assert_eq!(se("1:2.5ms").unwrap().duration, Duration::from_micros(2500));
        assert_eq!(se("3:750ns").unwrap().duration, Duration::from_nanos(750));
        for bad in ["3:0s", "3:0", "3:0ms"] {
            let e = se(bad).unwrap_err();
            assert!(matches!(e, FaultParseError::ZeroStall { .. }), "{bad}");
            assert!(e.to_string().contains("greater than 0"), "{e}");
        }
        let e = se("3:uniform:1ms..2ms").unwrap_err();
        assert!(matches!(e, FaultParseError::StallDistribution { .. }));
        assert!(e.to_string().contains("distribution"), "{e}");
        assert!(matches!(
            se("3:normal:1ms,1us"),
            Err(FaultParseError::StallDistribution { .. })
        ));
        assert!(matches!(
            se("3:5"),
            Err(FaultParseError::StallDuration { .. })
        ));
        assert!(matches!(
            se("3:5parsecs"),
            Err(FaultParseError::StallDuration { .. })
        ));
        assert!(matches!(se("0:1s"), Err(FaultParseError::Count { .. })));
        assert!(matches!(se("x:1s"), Err(FaultParseError::Count { .. })));
        for bad in ["", "10", "10:", ":35s", "35s"] {
            assert!(
                matches!(se(bad), Err(FaultParseError::Form { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn display_round_trips() {
        for s in [
            "3",
            "1:read",
            "7:write",
            "2:flush",
            "4:discard",
            "9:write-zeroes",
        ] {
            assert_eq!(fe(s).unwrap().to_string(), s);
        }
        assert_eq!(fe("5:any").unwrap().to_string(), "5");
        assert_eq!(fe(" 5:Write ").unwrap().to_string(), "5:write");
        for s in [
            "0..1",
            "2048..4096",
            &format!("{}..{}", u64::MAX - 1, u64::MAX),
        ] {
            assert_eq!(fr(s).unwrap().to_string(), s);
        }
        for s in ["10:35s", "1:2.5ms", "3:750ns", "2:1.000000001s"] {
            assert_eq!(se(s).unwrap().to_string(), s);
        }
        assert_eq!(se("2:1000ms").unwrap().to_string(), "2:1s");
        for op in [
            FaultOp::Read,
            FaultOp::Write,
            FaultOp::Flush,
            FaultOp::Discard,
            FaultOp::WriteZeroes,
            FaultOp::Any,
        ] {
            assert_eq!(op.to_string().parse::<FaultOp>().unwrap(), op);
            let fe = FailEvery { n: 6, op };
            assert_eq!(fe.to_string().parse::<FailEvery>().unwrap(), fe);
        }
    }

    #[test]
    fn serde_uses_strings() {
        let cfg = FaultConfig {
            fail_every: vec![fe("3:write").unwrap(), fe("5").unwrap()],
            fail_ranges: vec![fr("100..200").unwrap()],
            stall_every: Some(se("10:35s").unwrap()),
        };
        let json = serde_json::to_string(&cfg).unwrap();
        assert_eq!(
            json,
            r#"{"fail-every":["3:write","5"],"fail-ranges":["100..200"],"stall-every":"10:35s"}"#
        );
        assert_eq!(serde_json::from_str::<FaultConfig>(&json).unwrap(), cfg);
        let toml_src = "fail_every = [\"2:read\"]\nfail-ranges = [\"0..8\"]\n";
        let parsed: FaultConfig = toml::from_str(toml_src).unwrap();
        assert_eq!(parsed.fail_every, vec![fe("2:read").unwrap()]);
        assert_eq!(parsed.fail_ranges, vec![fr("0..8").unwrap()]);
        assert_eq!(parsed.stall_every, None);
        assert_eq!(
            serde_json::from_str::<FaultConfig>("{}").unwrap(),
            FaultConfig::default()
        );
        let err = serde_json::from_str::<FaultConfig>(r#"{"fail-ranges":["10..5"]}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("less than END"), "{err}");
        assert!(serde_json::from_str::<FaultConfig>(r#"{"bogus":1}"#).is_err());
    }

    #[test]
    fn is_empty() {
        assert!(FaultConfig::default().is_empty());
        let cfg = FaultConfig {
            stall_every: Some(se("1:1s").unwrap()),
            ..Default::default()
        };
        assert!(!cfg.is_empty());
        let cfg = FaultConfig {
            fail_ranges: vec![fr("0..1").unwrap()],
            ..Default::default()
        };
        assert!(!cfg.is_empty());
        let cfg = FaultConfig {
            fail_every: vec![fe("1").unwrap()],
            ..Default::default()
        };
        assert!(!cfg.is_empty());
    }

    #[test]
    fn empty_config_never_fails_or_counts() {
        let mut st = state(FaultConfig::default());
        for op in [Op::Read, Op::Write, Op::Flush, Op::Discard, Op::WriteZeroes] {
            for _ in 0..10 {
                assert_eq!(st.decide(op, &[(0, 8)]), FaultDecision::None);
            }
        }
        let c = st.counters();
        assert_eq!(
            (
                c.injected_fail_every,
                c.injected_fail_range,
                c.injected_stalls
            ),
            (0, 0, 0)
        );
    }

    #[test]
    fn every_third_write_exactly() {
        let mut st = state(FaultConfig {
            fail_every: vec![fe("3:write").unwrap()],
            ..Default::default()
        });
        let mut failed = Vec::new();
        for i in 1..=30u64 {
            // Reads interleaved: never failed, never counted for `write`.
            assert_eq!(st.decide(Op::Read, &[(i, 1)]), FaultDecision::None);
            assert_eq!(st.decide(Op::Flush, &[]), FaultDecision::None);
            if st.decide(Op::Write, &[(i, 8)]) == FaultDecision::FailEvery {
                failed.push(i);
            }
        }
        assert_eq!(failed, (1..=10).map(|k| 3 * k).collect::<Vec<_>>());
        assert_eq!(st.counters().injected_fail_every, 10);
        assert_eq!(st.counters().injected_fail_range, 0);
        assert_eq!(st.counters().injected_stalls, 0);
    }

    #[test]
    fn every_one_fails_all() {
        let mut st = state(FaultConfig {
            fail_every: vec![fe("1:read").unwrap()],
            ..Default::default()
        });
        for _ in 0..5 {
            assert_eq!(st.decide(Op::Read, &[(0, 1)]), FaultDecision::FailEvery);
            assert_eq!(st.decide(Op::Write, &[(0, 1)]), FaultDecision::None);
        }
        assert_eq!(st.counters().injected_fail_every, 5);
    }

    #[test]
    fn any_counts_all_data_ops_but_not_get_id() {
        let mut st = state(FaultConfig {
            fail_every: vec![fe("2").unwrap()],
            ..Default::default()
        });
        let ops = [Op::Read, Op::Write, Op::Flush, Op::Discard, Op::WriteZeroes];
        let mut decisions = Vec::new();
        for (i, op) in ops.iter().cycle().take(10).enumerate() {
            // GetId and Other between every data request: never counted.
            assert_eq!(st.decide(Op::GetId, &[]), FaultDecision::None);
            assert_eq!(st.decide(Op::Other, &[(0, 1)]), FaultDecision::None);
            let d = st.decide(*op, &[(i as u64, 1)]);
            decisions.push(d == FaultDecision::FailEvery);
        }
        assert_eq!(
            decisions,
            [false, true, false, true, false, true, false, true, false, true]
        );
        assert_eq!(st.counters().injected_fail_every, 5);
    }

    #[test]
    fn flush_counted_only_for_flush_or_any() {
        for (op, fails) in [
            (FaultOp::Flush, true),
            (FaultOp::Any, true),
            (FaultOp::Read, false),
            (FaultOp::Write, false),
            (FaultOp::Discard, false),
            (FaultOp::WriteZeroes, false),
        ] {
            let mut st = state(FaultConfig {
                fail_every: vec![FailEvery { n: 1, op }],
                ..Default::default()
            });
            let d = st.decide(Op::Flush, &[]);
            assert_eq!(d == FaultDecision::FailEvery, fails, "{op}");
        }
    }

    #[test]
    fn per_op_counters_are_independent() {
        let mut st = state(FaultConfig {
            fail_every: vec![fe("2:read").unwrap(), fe("3:discard").unwrap()],
            ..Default::default()
        });
        let seq = [
            (Op::Read, FaultDecision::None),
            (Op::Discard, FaultDecision::None),
            (Op::Read, FaultDecision::FailEvery),
            (Op::Discard, FaultDecision::None),
            (Op::WriteZeroes, FaultDecision::None),
            (Op::Discard, FaultDecision::FailEvery),
            (Op::Read, FaultDecision::None),
            (Op::Read, FaultDecision::FailEvery),
        ];
        for (i, (op, want)) in seq.into_iter().enumerate() {
            assert_eq!(st.decide(op, &[(0, 1)]), want, "request {i}");
        }
        assert_eq!(st.counters().injected_fail_every, 3);
    }

    #[test]
    fn states_are_independent_per_queue() {
        let cfg = FaultConfig {
            fail_every: vec![fe("2:write").unwrap()],
            ..Default::default()
        };
        let (mut q0, mut q1) = (FaultState::new(&cfg), FaultState::new(&cfg));
        assert_eq!(q0.decide(Op::Write, &[(0, 1)]), FaultDecision::None);
        assert_eq!(q1.decide(Op::Write, &[(0, 1)]), FaultDecision::None);
        assert_eq!(q0.decide(Op::Write, &[(0, 1)]), FaultDecision::FailEvery);
        assert_eq!(q1.decide(Op::Write, &[(0, 1)]), FaultDecision::FailEvery);
        assert_eq!(q0.counters().injected_fail_every, 1);
        assert_eq!(q1.counters().injected_fail_every, 1);
    }

    #[test]
    fn range_boundaries() {
        let r = FailRange {
            start: 100,
            end: 200,
        };
        assert!(!r.touches(92, 8), "ends exactly at START");
        assert!(r.touches(93, 8), "last sector is START");
        assert!(r.touches(199, 1), "starts at END-1");
        assert!(!r.touches(200, 8), "starts at END");
        assert!(r.touches(0, 1000), "covers the range");
        assert!(r.touches(150, 1), "inside");
        assert!(!r.touches(150, 0), "zero length");

        let mut st = state(FaultConfig {
            fail_ranges: vec![r],
            ..Default::default()
        });
        for op in [Op::Read, Op::Write, Op::Discard, Op::WriteZeroes] {
            assert_eq!(st.decide(op, &[(92, 8)]), FaultDecision::None, "{op:?}");
            assert_eq!(st.decide(op, &[(199, 1)]), FaultDecision::FailRange);
            assert_eq!(st.decide(op, &[(200, 8)]), FaultDecision::None);
            // Any of several segments.
            assert_eq!(
                st.decide(op, &[(0, 8), (300, 8), (120, 1)]),
                FaultDecision::FailRange
            );
            assert_eq!(st.decide(op, &[]), FaultDecision::None);
        }
        assert_eq!(st.decide(Op::Flush, &[(150, 1)]), FaultDecision::None);
        assert_eq!(st.decide(Op::GetId, &[(150, 1)]), FaultDecision::None);
        assert_eq!(st.decide(Op::Other, &[(150, 1)]), FaultDecision::None);
        assert_eq!(st.counters().injected_fail_range, 8);
    }

    #[test]
    fn range_overflow_safe() {
        let top = FailRange {
            start: u64::MAX - 10,
            end: u64::MAX,
        };
        assert!(top.touches(u64::MAX - 1, u64::MAX));
        assert!(top.touches(u64::MAX - 20, u64::MAX));
        assert!(!top.touches(u64::MAX, u64::MAX), "sector MAX is outside");
        assert!(!top.touches(u64::MAX - 20, 10), "ends exactly at START");
        assert!(top.touches(u64::MAX - 20, 11));
        let low = FailRange { start: 0, end: 8 };
        assert!(!low.touches(u64::MAX - 1, u64::MAX));
        assert!(low.touches(0, u64::MAX));
        let mut st = state(FaultConfig {
            fail_ranges: vec![top, low],
            ..Default::default()
        });
        assert_eq!(
            st.decide(Op::Write, &[(u64::MAX - 1, u64::MAX)]),
            FaultDecision::FailRange
        );
        assert_eq!(
            st.decide(Op::Write, &[(1 << 40, u64::MAX >> 2)]),
            FaultDecision::None
        );
    }

    #[test]
    fn stall_every_nth_with_duration() {
        let mut st = state(FaultConfig {
            stall_every: Some(se("4:35s").unwrap()),
            ..Default::default()
        });
        let ops = [Op::Read, Op::Write, Op::Flush, Op::Discard, Op::WriteZeroes];
        let mut stalled = Vec::new();
        for i in 1..=20u64 {
            assert_eq!(st.decide(Op::GetId, &[]), FaultDecision::None);
            match st.decide(ops[(i % 5) as usize], &[(i, 1)]) {
                FaultDecision::Stall(d) => {
                    assert_eq!(d, Duration::from_secs(35));
                    stalled.push(i);
                }
                d => assert_eq!(d, FaultDecision::None),
            }
        }
        assert_eq!(stalled, [4, 8, 12, 16, 20]);
        assert_eq!(st.counters().injected_stalls, 5);
        assert_eq!(st.counters().injected_fail_every, 0);
    }

    #[test]
    fn precedence() {
        // Request 6 is hit by fail-every (every 3rd), the range and the
        // stall (every 2nd): fail-every wins.
        let mut st = state(FaultConfig {
            fail_every: vec![fe("3").unwrap()],
            fail_ranges: vec![fr("1000..2000").unwrap()],
            stall_every: Some(se("2:1ms").unwrap()),
        });
        let stall = FaultDecision::Stall(Duration::from_millis(1));
        let seq = [
            // (request sector, expected)
            (0, FaultDecision::None),         // 1
            (0, stall),                       // 2
            (1500, FaultDecision::FailEvery), // 3: fail-every over range
            (1500, FaultDecision::FailRange), // 4: range over stall
            (1500, FaultDecision::FailRange), // 5
            (1500, FaultDecision::FailEvery), // 6: all three
            (0, FaultDecision::None),         // 7
            (0, stall),                       // 8
            (0, FaultDecision::FailEvery),    // 9
        ];
        for (i, (sector, want)) in seq.into_iter().enumerate() {
            assert_eq!(
                st.decide(Op::Write, &[(sector, 8)]),
                want,
                "request {}",
                i + 1
            );
        }
        let c = st.counters().clone();
        assert_eq!(
            (
                c.injected_fail_every,
                c.injected_fail_range,
                c.injected_stalls
            ),
            (3, 2, 2)
        );
        assert_eq!(
            serde_json::to_string(&c).unwrap(),
            r#"{"injected_fail_every":3,"injected_fail_range":2,"injected_stalls":2}"#
        );
    }

    #[test]
    fn stalled_and_range_failed_requests_count_for_fail_every() {
        let mut st = state(FaultConfig {
            fail_every: vec![fe("2:read").unwrap()],
            fail_ranges: vec![fr("0..10").unwrap()],
            stall_every: Some(se("1:1us").unwrap()),
        });
        let stall = FaultDecision::Stall(Duration::from_micros(1));
        // Read 1: in range -> FailRange (counted). Read 2 -> FailEvery.
        assert_eq!(st.decide(Op::Read, &[(0, 1)]), FaultDecision::FailRange);
        assert_eq!(st.decide(Op::Read, &[(50, 1)]), FaultDecision::FailEvery);
        // Read 3: stalled (counted). Read 4 -> FailEvery.
        assert_eq!(st.decide(Op::Read, &[(50, 1)]), stall);
        assert_eq!(st.decide(Op::Read, &[(50, 1)]), FaultDecision::FailEvery);
        let c = st.counters();
        assert_eq!(
            (
                c.injected_fail_every,
                c.injected_fail_range,
                c.injected_stalls
            ),
            (2, 1, 1)
        );
    }
}
