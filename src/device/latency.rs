//! Emulated completion latency: the `--latency`, `--read-latency`,
//! `--write-latency` and `--flush-latency` values and seeded samplers.
//!
//! # Forms
//!
//! | value | meaning |
//! |---|---|
//! | `0` | no delay |
//! | `100us`, `1ms`, `2.5ms`, `750ns`, `1s` | fixed delay |
//! | `uniform:50us..150us` | uniform in `MIN..=MAX` (whole nanoseconds), `MIN <= MAX` |
//! | `normal:100us,15us` | normal with `MEAN`, `STDDEV`; negative samples become 0 |
//! | `lognormal:100us,0.5` | log-normal with **median** `MEDIAN` and shape `SIGMA` |
//!
//! Durations are a decimal number and a unit: `ns`, `us` (or `µs`), `ms`,
//! `s`; a bare `0` is also accepted. They are kept to the nanosecond, so a
//! value finer than 1 ns (`0.5ns`) is rejected rather than rounded.
//!
//! For `lognormal:MEDIAN,SIGMA` the sample is `exp(N(mu, SIGMA^2))`
//! nanoseconds with `mu = ln(MEDIAN)`: the first number is the **median**
//! (`exp(mu)`), not the mean. `SIGMA` is the standard deviation of the
//! underlying normal (of the logarithm), a plain number. The mean is
//! `MEDIAN * exp(SIGMA^2 / 2)`, e.g. `lognormal:100us,0.5` has a median of
//! 100 us and a mean of about 113.3 us.
//!
//! [`LatencySpec`] prints in the same form it parses (`Display` round-trips
//! through `FromStr`), and serde uses that string form.
//!
//! # Reproducibility
//!
//! [`LatencySampler`] draws from [`rand::rngs::StdRng`] seeded with
//! [`SeedableRng::seed_from_u64`]. A given seed (and stream) gives the same
//! sequence every time **for a given blklab build**: `StdRng`'s algorithm
//! may change between `rand` versions, so sequences are not promised across
//! dependency upgrades. [`LatencySampler::for_stream`] mixes a stream number
//! (queue, operation kind) into the seed with splitmix64, so every queue and
//! operation gets its own independent, reproducible sequence from one
//! `--seed`.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::virtio_blk::request::Op;
use rand::distributions::{Distribution, Uniform};
use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::{LogNormal, Normal};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The accepted forms, for error messages.
const FORMS: &str = "0, a duration such as 100us or 2.5ms, uniform:MIN..MAX, \
                     normal:MEAN,STDDEV or lognormal:MEDIAN,SIGMA";

/// A latency distribution, as given on the command line.
///
/// Parsing normalises every zero fixed duration (`0`, `0us`) to
/// [`LatencySpec::Zero`]; [`is_zero`](Self::is_zero) is the test for "no
/// delay" in all forms.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum LatencySpec {
    /// No delay.
    #[default]
    Zero,
    /// Always this delay.
    Fixed(Duration),
    /// Uniform over `min..=max`, in whole nanoseconds.
    Uniform { min: Duration, max: Duration },
    /// Normal; negative samples are clamped to 0.
    Normal { mean: Duration, stddev: Duration },
    /// Log-normal with median `median` (= `exp(mu)`) and `sigma` the
    /// standard deviation of the logarithm.
    LogNormal { median: Duration, sigma: f64 },
}

/// Why a latency value was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LatencyParseError {
    #[error("empty latency; expected {}", FORMS)]
    Empty,
    #[error("unknown latency {input:?}; expected {}", FORMS)]
    Unknown { input: String },
    #[error("invalid duration {input:?}: {reason}")]
    Duration { input: String, reason: &'static str },
    #[error("{kind}: expected {kind}:{expected}, got {input:?}")]
    Form {
        kind: &'static str,
        expected: &'static str,
        input: String,
    },
    #[error("uniform: MIN {min} is larger than MAX {max}")]
    UniformOrder { min: String, max: String },
    #[error("lognormal: MEDIAN must be greater than 0")]
    ZeroMedian,
    #[error("lognormal: SIGMA must be a finite number >= 0, got {input:?}")]
    Sigma { input: String },
}

impl LatencySpec {
    /// Whether every sample is zero (no delay at all).
    pub(crate) fn is_zero(&self) -> bool {
        match *self {
            LatencySpec::Zero => true,
            LatencySpec::Fixed(d) => d.is_zero(),
            LatencySpec::Uniform { max, .. } => max.is_zero(),
            LatencySpec::Normal { mean, stddev } => mean.is_zero() && stddev.is_zero(),
            LatencySpec::LogNormal { median, .. } => median.is_zero(),
        }
    }

    /// The expected value of a sample. For `Normal` this is `mean`,
    /// ignoring the small shift that clamping negatives at 0 causes when
    /// `stddev` is not small against `mean`.
    #[cfg(test)]
    pub(crate) fn mean(&self) -> Duration {
        match *self {
            LatencySpec::Zero => Duration::ZERO,
            LatencySpec::Fixed(d) => d,
            LatencySpec::Uniform { min, max } => (min + max) / 2,
            LatencySpec::Normal { mean, .. } => mean,
            LatencySpec::LogNormal { median, sigma } => {
                nanos_from_f64(median.as_nanos() as f64 * (sigma * sigma / 2.0).exp())
            }
        }
    }
}

impl FromStr for LatencySpec {
    type Err = LatencyParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.is_empty() {
            return Err(LatencyParseError::Empty);
        }
        let Some((kind, args)) = s.split_once(':') else {
            let numeric = s.starts_with(|c: char| c.is_ascii_digit() || "+-.".contains(c));
            if !numeric {
                return Err(LatencyParseError::Unknown { input: s.into() });
            }
            let d = parse_duration(s)?;
            return Ok(if d.is_zero() {
                LatencySpec::Zero
            } else {
                LatencySpec::Fixed(d)
            });
        };
        match kind.trim().to_ascii_lowercase().as_str() {
            "uniform" => {
                let form = || LatencyParseError::Form {
                    kind: "uniform",
                    expected: "MIN..MAX",
                    input: s.into(),
                };
                let (min, max) = args.split_once("..").ok_or_else(form)?;
                if max.contains("..") {
                    return Err(form());
                }
                let (min, max) = (parse_duration(min)?, parse_duration(max)?);
                if min > max {
                    return Err(LatencyParseError::UniformOrder {
                        min: FmtDuration(min).to_string(),
                        max: FmtDuration(max).to_string(),
                    });
                }
                Ok(LatencySpec::Uniform { min, max })
            }
            "normal" => {
                let (mean, stddev) = two_args(s, args, "normal", "MEAN,STDDEV")?;
                Ok(LatencySpec::Normal {
                    mean: parse_duration(mean)?,
                    stddev: parse_duration(stddev)?,
                })
            }
            "lognormal" => {
                let (median, sigma) = two_args(s, args, "lognormal", "MEDIAN,SIGMA")?;
                let median = parse_duration(median)?;
                if median.is_zero() {
                    return Err(LatencyParseError::ZeroMedian);
                }
                let sigma_err = || LatencyParseError::Sigma {
                    input: sigma.trim().into(),
                };
                let value: f64 = sigma.trim().parse().map_err(|_| sigma_err())?;
                if !value.is_finite() || value < 0.0 {
                    return Err(sigma_err());
                }
                Ok(LatencySpec::LogNormal {
                    median,
                    sigma: value,
                })
            }
            _ => Err(LatencyParseError::Unknown { input: s.into() }),
        }
    }
}

/// Splits `A,B` into exactly two parts.
fn two_args<'a>(
    input: &str,
    args: &'a str,
    kind: &'static str,
    expected: &'static str,
) -> Result<(&'a str, &'a str), LatencyParseError> {
    let mut parts = args.split(',');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(a), Some(b), None) => Ok((a, b)),
        _ => Err(LatencyParseError::Form {
            kind,
            expected,
            input: input.into(),
        }),
    }
}

/// Parses `NUMBER UNIT` (or a bare zero) into an exact number of nanoseconds.
fn parse_duration(input: &str) -> Result<Duration, LatencyParseError> {
    let s = input.trim();
    let err = |reason| LatencyParseError::Duration {
        input: s.into(),
        reason,
    };
    if s.starts_with('-') {
        return Err(err("negative durations are not allowed"));
    }
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = (&s[..split], s[split..].trim());
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if int.is_empty() && frac.is_empty() {
        return Err(err("expected a number followed by ns, us, ms or s"));
    }
    if frac.contains('.') {
        return Err(err("not a number"));
    }
    let unit_ns: u128 = match unit {
        "ns" => 1,
        "us" | "µs" | "μs" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "" if int.bytes().chain(frac.bytes()).all(|b| b == b'0') => 1,
        "" => return Err(err("missing unit (ns, us, ms or s)")),
        _ => return Err(err("unknown unit; expected ns, us, ms or s")),
    };
    let too_large = || err("too large");
    let int_value: u128 = if int.is_empty() {
        0
    } else {
        int.parse().map_err(|_| too_large())?
    };
    let frac = frac.trim_end_matches('0');
    // unit_ns <= 10^9, so a 10th fractional digit is always below 1 ns.
    if frac.len() > 9 {
        return Err(err("finer than 1ns"));
    }
    let frac_scale = 10u128.pow(frac.len() as u32);
    let frac_value: u128 = if frac.is_empty() {
        0
    } else {
        frac.parse().expect("ascii digits")
    };
    if (frac_value * unit_ns) % frac_scale != 0 {
        return Err(err("finer than 1ns"));
    }
    let ns = int_value
        .checked_mul(unit_ns)
        .and_then(|v| v.checked_add(frac_value * unit_ns / frac_scale))
        .filter(|&v| v <= u128::from(u64::MAX))
        .ok_or_else(too_large)?;
    Ok(Duration::from_nanos(ns as u64))
}

/// Prints a duration exactly in the largest unit it reaches: `2.5ms`,
/// `750ns`, `1.000000001s`; zero prints as `0`.
pub(crate) struct FmtDuration(pub(crate) Duration);

impl fmt::Display for FmtDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ns = self.0.as_nanos();
        if ns == 0 {
            return f.write_str("0");
        }
        let (unit, name, digits) = match ns {
            1_000_000_000.. => (1_000_000_000u128, "s", 9),
            1_000_000.. => (1_000_000, "ms", 6),
            1_000.. => (1_000, "us", 3),
            _ => (1, "ns", 0),
        };
        write!(f, "{}", ns / unit)?;
        let rest = ns % unit;
        if rest != 0 {
            let frac = format!("{rest:0digits$}");
            write!(f, ".{}", frac.trim_end_matches('0'))?;
        }
        f.write_str(name)
    }
}

impl fmt::Display for LatencySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            LatencySpec::Zero => f.write_str("0"),
            LatencySpec::Fixed(d) => write!(f, "{}", FmtDuration(d)),
            LatencySpec::Uniform { min, max } => {
                write!(f, "uniform:{}..{}", FmtDuration(min), FmtDuration(max))
            }
            LatencySpec::Normal { mean, stddev } => {
                write!(f, "normal:{},{}", FmtDuration(mean), FmtDuration(stddev))
            }
            // f64's Display is the shortest string that parses back exactly.
            LatencySpec::LogNormal { median, sigma } => {
                write!(f, "lognormal:{},{}", FmtDuration(median), sigma)
            }
        }
    }
}

impl Serialize for LatencySpec {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for LatencySpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl schemars::JsonSchema for LatencySpec {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "LatencySpec".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "description": "A latency spec as on the command line: `0`, `100us`, `uniform:50us..150us`, `normal:100us,15us`, `lognormal:100us,0.5`."
        })
    }
}

/// splitmix64's output function: a bijective 64-bit mixer.
fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[derive(Debug, Clone)]
enum Dist {
    Const(Duration),
    Uniform(Uniform<u64>),
    Normal(Normal<f64>),
    LogNormal(LogNormal<f64>),
}

/// A seeded, reproducible source of latencies following a [`LatencySpec`].
///
/// See the [module documentation](self#reproducibility) for what
/// "reproducible" covers.
#[derive(Debug, Clone)]
pub(crate) struct LatencySampler {
    /// What it draws from (the tests check which spec a sampler got).
    #[cfg(test)]
    spec: LatencySpec,
    dist: Dist,
    rng: StdRng,
}

impl LatencySampler {
    /// A sampler for `spec` seeded with `seed`; the same as
    /// [`for_stream`](Self::for_stream)`(spec, seed, 0)`.
    #[cfg(test)]
    pub(crate) fn new(spec: LatencySpec, seed: u64) -> Self {
        Self::for_stream(spec, seed, 0)
    }

    /// A sampler for stream `stream` of `seed`: each (seed, stream) pair
    /// gives its own sequence, and for one seed distinct streams never share
    /// an RNG seed (the mixing is a bijection of `stream`).
    ///
    /// Specs that [`FromStr`] would reject (built directly: `min > max`,
    /// a non-finite sigma) are made usable rather than panicking: uniform
    /// bounds are swapped, an invalid normal/log-normal gives the constant
    /// mean/median.
    pub(crate) fn for_stream(spec: LatencySpec, seed: u64, stream: u64) -> Self {
        let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let dist = match spec {
            LatencySpec::Zero => Dist::Const(Duration::ZERO),
            LatencySpec::Fixed(d) => Dist::Const(d),
            LatencySpec::Uniform { min, max } => {
                let (a, b) = (ns(min.min(max)), ns(min.max(max)));
                Dist::Uniform(Uniform::new_inclusive(a, b))
            }
            LatencySpec::Normal { mean, stddev } => Normal::new(ns(mean) as f64, ns(stddev) as f64)
                .map_or(Dist::Const(mean), Dist::Normal),
            LatencySpec::LogNormal { median, sigma } => {
                if median.is_zero() {
                    Dist::Const(Duration::ZERO)
                } else {
                    LogNormal::new((ns(median) as f64).ln(), sigma)
                        .map_or(Dist::Const(median), Dist::LogNormal)
                }
            }
        };
        let rng = StdRng::seed_from_u64(splitmix64(seed ^ splitmix64(stream)));
        LatencySampler {
            #[cfg(test)]
            spec,
            dist,
            rng,
        }
    }

    /// The next latency.
    pub(crate) fn sample(&mut self) -> Duration {
        match &self.dist {
            Dist::Const(d) => *d,
            Dist::Uniform(u) => Duration::from_nanos(u.sample(&mut self.rng)),
            Dist::Normal(n) => nanos_from_f64(n.sample(&mut self.rng)),
            Dist::LogNormal(l) => nanos_from_f64(l.sample(&mut self.rng)),
        }
    }
}

/// Rounds to whole nanoseconds; negatives and NaN give 0, huge values
/// saturate.
fn nanos_from_f64(ns: f64) -> Duration {
    if ns.is_nan() || ns <= 0.0 {
        Duration::ZERO
    } else {
        // `as` saturates at u64::MAX.
        Duration::from_nanos(ns.round() as u64)
    }
}

/// The operation kinds that get their own latency.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum LatOp {
    /// VIRTIO_BLK_T_IN.
    Read,
    /// VIRTIO_BLK_T_OUT.
    Write,
    /// VIRTIO_BLK_T_FLUSH.
    Flush,
    /// Everything else (GET_ID, DISCARD, WRITE_ZEROES, …).
    Other,
}

impl LatOp {
    /// The latency class of a request kind: the one place an [`Op`] maps to
    /// its class (as `FaultOp::from_op` is for fault rules).
    pub(crate) fn of(op: Op) -> LatOp {
        match op {
            Op::Read => LatOp::Read,
            Op::Write => LatOp::Write,
            Op::Flush => LatOp::Flush,
            _ => LatOp::Other,
        }
    }

    /// All kinds, in [`index`](Self::index) order.
    pub(crate) const ALL: [LatOp; 4] = [LatOp::Read, LatOp::Write, LatOp::Flush, LatOp::Other];

    /// 0 ..= 3, in declaration order.
    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// The latency spec of each operation kind.
///
/// Serde: a map with `read`, `write`, `flush`, `other`, each a spec string;
/// missing kinds are `0`.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct OpLatency {
    pub read: LatencySpec,
    pub write: LatencySpec,
    pub flush: LatencySpec,
    pub other: LatencySpec,
}

impl OpLatency {
    /// The same spec for every kind.
    pub(crate) fn all(spec: LatencySpec) -> Self {
        OpLatency {
            read: spec,
            write: spec,
            flush: spec,
            other: spec,
        }
    }

    /// From the CLI flags: `--latency` (`all`) sets every kind, then
    /// `--read-latency`, `--write-latency`, `--flush-latency` override
    /// their kind. Unset kinds are [`LatencySpec::Zero`].
    pub(crate) fn from_flags(
        all: Option<LatencySpec>,
        read: Option<LatencySpec>,
        write: Option<LatencySpec>,
        flush: Option<LatencySpec>,
    ) -> Self {
        let mut l = OpLatency::all(all.unwrap_or_default());
        for (op, spec) in [
            (LatOp::Read, read),
            (LatOp::Write, write),
            (LatOp::Flush, flush),
        ] {
            if let Some(spec) = spec {
                l.set(op, spec);
            }
        }
        l
    }

    /// The spec for `op`.
    pub(crate) fn get(&self, op: LatOp) -> &LatencySpec {
        match op {
            LatOp::Read => &self.read,
            LatOp::Write => &self.write,
            LatOp::Flush => &self.flush,
            LatOp::Other => &self.other,
        }
    }

    /// Replaces the spec for `op`.
    pub(crate) fn set(&mut self, op: LatOp, spec: LatencySpec) {
        match op {
            LatOp::Read => self.read = spec,
            LatOp::Write => self.write = spec,
            LatOp::Flush => self.flush = spec,
            LatOp::Other => self.other = spec,
        }
    }

    /// Whether no kind has any delay.
    #[inline]
    pub(crate) fn is_zero(&self) -> bool {
        LatOp::ALL.iter().all(|&op| self.get(op).is_zero())
    }

    /// The sampler for `op` on queue `queue`: stream `queue * 4 + op.index()`
    /// of `seed`, so every (queue, kind) has its own reproducible sequence.
    pub(crate) fn sampler(&self, op: LatOp, seed: u64, queue: u64) -> LatencySampler {
        let stream = queue.wrapping_mul(LatOp::ALL.len() as u64) + op.index() as u64;
        LatencySampler::for_stream(*self.get(op), seed, stream)
    }
}

#[cfg(test)]
impl LatencySampler {
    /// The spec this sampler draws from.
    pub(crate) fn spec(&self) -> &LatencySpec {
        &self.spec
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const N: usize = 100_000;

    fn us(v: u64) -> Duration {
        Duration::from_micros(v)
    }

    fn parse(s: &str) -> LatencySpec {
        s.parse()
            .unwrap_or_else(|e| panic!("{s:?} should parse: {e}"))
    }

    fn parse_err(s: &str) -> String {
        match s.parse::<LatencySpec>() {
            Ok(v) => panic!("{s:?} should not parse, got {v:?}"),
            Err(e) => e.to_string(),
        }
    }

    /// Samples in nanoseconds, as f64.
    fn samples(spec: &str, seed: u64) -> Vec<f64> {
        let mut s = LatencySampler::new(parse(spec), seed);
        (0..N).map(|_| s.sample().as_nanos() as f64).collect()
    }

    fn mean(v: &[f64]) -> f64 {
        v.iter().sum::<f64>() / v.len() as f64
    }

    fn stddev(v: &[f64]) -> f64 {
        let m = mean(v);
        (v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (v.len() - 1) as f64).sqrt()
    }

    fn median(v: &[f64]) -> f64 {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
    }

    fn assert_rel(got: f64, want: f64, tol: f64, what: &str) {
        let rel = (got - want).abs() / want;
        assert!(
            rel <= tol,
            "{what}: got {got}, want {want} ± {tol:e} (off by {rel:e})"
        );
    }

    #[test]
    fn parses_zero_and_fixed() {
        assert_eq!(parse("0"), LatencySpec::Zero);
        assert_eq!(parse("0us"), LatencySpec::Zero);
        assert_eq!(parse(" 0.0ms "), LatencySpec::Zero);
        assert_eq!(parse("100us"), LatencySpec::Fixed(us(100)));
        assert_eq!(parse("100µs"), LatencySpec::Fixed(us(100)));
        assert_eq!(parse("100μs"), LatencySpec::Fixed(us(100))); // Greek mu
        assert_eq!(parse("1ms"), LatencySpec::Fixed(us(1000)));
        assert_eq!(parse("2.5ms"), LatencySpec::Fixed(us(2500)));
        assert_eq!(
            parse("750ns"),
            LatencySpec::Fixed(Duration::from_nanos(750))
        );
        assert_eq!(parse("1s"), LatencySpec::Fixed(Duration::from_secs(1)));
        assert_eq!(
            parse("0.25s"),
            LatencySpec::Fixed(Duration::from_millis(250))
        );
        assert_eq!(parse(".5us"), LatencySpec::Fixed(Duration::from_nanos(500)));
        assert_eq!(
            parse("1.000000001s"),
            LatencySpec::Fixed(Duration::from_nanos(1_000_000_001))
        );
        assert!(parse("0").is_zero());
        assert!(!parse("1ns").is_zero());
    }

    #[test]
    fn parses_distributions() {
        assert_eq!(
            parse("uniform:50us..150us"),
            LatencySpec::Uniform {
                min: us(50),
                max: us(150)
            }
        );
        assert_eq!(
            parse("uniform:0..1ms"),
            LatencySpec::Uniform {
                min: Duration::ZERO,
                max: us(1000)
            }
        );
        assert_eq!(
            parse("uniform:1ms..1ms"),
            LatencySpec::Uniform {
                min: us(1000),
                max: us(1000)
            }
        );
        assert_eq!(
            parse("normal:100us,15us"),
            LatencySpec::Normal {
                mean: us(100),
                stddev: us(15)
            }
        );
        assert_eq!(
            parse("normal: 100us , 0"),
            LatencySpec::Normal {
                mean: us(100),
                stddev: Duration::ZERO
            }
        );
        assert_eq!(
            parse("lognormal:100us,0.5"),
            LatencySpec::LogNormal {
                median: us(100),
                sigma: 0.5
            }
        );
        assert_eq!(
            parse("LogNormal:1ms,0"),
            LatencySpec::LogNormal {
                median: us(1000),
                sigma: 0.0
            }
        );
        assert!(parse("uniform:0..0").is_zero());
        assert!(parse("normal:0,0").is_zero());
        assert!(!parse("normal:0,1us").is_zero());
    }

    #[test]
    fn rejects_bad_values() {
        let cases = [
            ("uniform:5ms..1ms", "larger than MAX"),
            ("normal:100us", "expected normal:MEAN,STDDEV"),
            ("normal:1ms,2ms,3ms", "expected normal:MEAN,STDDEV"),
            ("lognormal:x,1", "invalid duration \"x\""),
            ("lognormal:100us,x", "SIGMA must be"),
            ("lognormal:100us,-1", "SIGMA must be"),
            ("lognormal:100us,inf", "SIGMA must be"),
            ("lognormal:100us,NaN", "SIGMA must be"),
            ("lognormal:0,1", "MEDIAN must be greater than 0"),
            ("fast", "unknown latency \"fast\""),
            ("gamma:1ms,2", "unknown latency"),
            ("", "empty latency"),
            ("-1ms", "negative"),
            ("-0", "negative"),
            ("normal:-100us,15us", "negative"),
            ("uniform:-5us..1ms", "negative"),
            ("100", "missing unit"),
            ("100 lightyears", "unknown unit"),
            ("1.2.3ms", "not a number"),
            ("0.5ns", "finer than 1ns"),
            ("1.0000000001s", "finer than 1ns"),
            ("99999999999999999999s", "too large"),
            ("uniform:1ms", "expected uniform:MIN..MAX"),
            ("uniform:1ms..2ms..3ms", "expected uniform:MIN..MAX"),
            ("ms", "unknown latency"),
            (".ms", "expected a number"),
        ];
        for (input, want) in cases {
            let e = parse_err(input);
            assert!(e.contains(want), "{input:?}: error {e:?} lacks {want:?}");
        }
        // The "unknown" message lists the accepted forms.
        assert!(parse_err("fast").contains("uniform:MIN..MAX"));
    }

    #[test]
    fn display_round_trips() {
        let cases = [
            ("0", "0"),
            ("100us", "100us"),
            ("1ms", "1ms"),
            ("2.5ms", "2.5ms"),
            ("2500us", "2.5ms"),
            ("750ns", "750ns"),
            ("1000ns", "1us"),
            ("1.000000001s", "1.000000001s"),
            ("90s", "90s"),
            ("uniform:50us..150us", "uniform:50us..150us"),
            ("uniform:0..1.5us", "uniform:0..1.5us"),
            ("normal:100us,15us", "normal:100us,15us"),
            ("normal:100µs,0", "normal:100us,0"),
            ("lognormal:100us,0.5", "lognormal:100us,0.5"),
            ("lognormal:1.25ms,0.1", "lognormal:1.25ms,0.1"),
            ("lognormal:1ms,2", "lognormal:1ms,2"),
        ];
        for (input, shown) in cases {
            let spec = parse(input);
            assert_eq!(spec.to_string(), shown, "{input:?}");
            assert_eq!(parse(shown), spec, "{input:?}");
        }
        let odd = LatencySpec::LogNormal {
            median: Duration::from_nanos(123_456_789),
            sigma: 0.1 + 0.2,
        };
        assert_eq!(parse(&odd.to_string()), odd);
    }

    #[test]
    fn serde_uses_the_string_form() {
        let spec = parse("uniform:50us..150us");
        let json = serde_json::to_string(&spec).unwrap();
        assert_eq!(json, "\"uniform:50us..150us\"");
        assert_eq!(serde_json::from_str::<LatencySpec>(&json).unwrap(), spec);
        let e = serde_json::from_str::<LatencySpec>("\"uniform:5ms..1ms\"").unwrap_err();
        assert!(e.to_string().contains("larger than MAX"), "{e}");

        let ops = OpLatency::from_flags(
            Some(parse("1ms")),
            None,
            Some(parse("lognormal:2ms,0.5")),
            None,
        );
        let json = serde_json::to_string(&ops).unwrap();
        assert_eq!(
            json,
            r#"{"read":"1ms","write":"lognormal:2ms,0.5","flush":"1ms","other":"1ms"}"#
        );
        assert_eq!(serde_json::from_str::<OpLatency>(&json).unwrap(), ops);
        let partial: OpLatency = serde_json::from_str(r#"{"flush":"5ms"}"#).unwrap();
        assert_eq!(partial.flush, parse("5ms"));
        assert!(partial.read.is_zero());
        assert!(serde_json::from_str::<OpLatency>(r#"{"fluhs":"5ms"}"#).is_err());
    }

    #[test]
    fn fixed_and_zero_are_exact() {
        let mut z = LatencySampler::new(LatencySpec::Zero, 1);
        let mut f = LatencySampler::new(parse("2.5ms"), 1);
        for _ in 0..N {
            assert_eq!(z.sample(), Duration::ZERO);
            assert_eq!(f.sample(), us(2500));
        }
    }

    #[test]
    fn uniform_moments() {
        let v = samples("uniform:50us..150us", 42);
        assert!(v.iter().all(|&x| (50_000.0..=150_000.0).contains(&x)));
        assert_rel(mean(&v), 100_000.0, 0.01, "uniform mean");
        // Uses the whole range.
        let (lo, hi) = v
            .iter()
            .fold((f64::MAX, 0.0f64), |(l, h), &x| (l.min(x), h.max(x)));
        assert!(lo < 50_100.0 && hi > 149_900.0, "{lo} {hi}");
    }

    #[test]
    fn normal_moments() {
        let v = samples("normal:100us,15us", 42);
        assert!(v.iter().all(|&x| x >= 0.0));
        assert_rel(mean(&v), 100_000.0, 0.01, "normal mean");
        assert_rel(stddev(&v), 15_000.0, 0.03, "normal stddev");
    }

    #[test]
    fn normal_clamps_at_zero() {
        let v = samples("normal:10us,100us", 7);
        assert!(v.iter().all(|&x| x >= 0.0));
        // About 46 % of N(10, 100) is negative and becomes 0.
        let zeros = v.iter().filter(|&&x| x == 0.0).count() as f64 / N as f64;
        assert!((0.43..0.49).contains(&zeros), "{zeros}");
    }

    #[test]
    fn lognormal_moments() {
        let spec = parse("lognormal:100us,0.5");
        let v = samples("lognormal:100us,0.5", 42);
        assert!(v.iter().all(|&x| x > 0.0));
        assert_rel(median(&v), 100_000.0, 0.02, "lognormal median");
        let want_mean = 100_000.0 * (0.5f64 * 0.5 / 2.0).exp();
        assert_rel(mean(&v), want_mean, 0.03, "lognormal mean");
        assert_rel(spec.mean().as_nanos() as f64, want_mean, 1e-5, "spec mean");
    }

    #[test]
    fn same_seed_same_sequence() {
        for spec in [
            "uniform:1us..1ms",
            "normal:100us,15us",
            "lognormal:100us,0.5",
        ] {
            let a = samples(spec, 1234);
            assert_eq!(a, samples(spec, 1234), "{spec}");
            assert_ne!(a, samples(spec, 1235), "{spec}");
            let spec = parse(spec);
            let mut s0 = LatencySampler::for_stream(spec, 1234, 0);
            let mut s1 = LatencySampler::for_stream(spec, 1234, 1);
            let mut s1b = LatencySampler::for_stream(spec, 1234, 1);
            let x0: Vec<_> = (0..1000).map(|_| s0.sample()).collect();
            let x1: Vec<_> = (0..1000).map(|_| s1.sample()).collect();
            let x1b: Vec<_> = (0..1000).map(|_| s1b.sample()).collect();
            assert_ne!(x0, x1);
            assert_eq!(x1, x1b);
            // new() is stream 0.
            let mut n = LatencySampler::new(spec, 1234);
            assert_eq!(x0, (0..1000).map(|_| n.sample()).collect::<Vec<_>>());
        }
        // Streams of one seed and the same stream of different seeds do not collide.
        let seeds: std::collections::HashSet<u64> = (0..1000u64)
            .flat_map(|st| {
                [
                    splitmix64(7 ^ splitmix64(st)),
                    splitmix64(8 ^ splitmix64(st)),
                ]
            })
            .collect();
        assert_eq!(seeds.len(), 2000);
    }

    #[test]
    fn op_latency_flags() {
        let none = OpLatency::from_flags(None, None, None, None);
        assert!(none.is_zero());
        assert_eq!(none, OpLatency::default());

        let all = OpLatency::from_flags(Some(parse("1ms")), None, None, None);
        for op in LatOp::ALL {
            assert_eq!(*all.get(op), parse("1ms"));
        }
        assert!(!all.is_zero());

        let l = OpLatency::from_flags(
            Some(parse("1ms")),
            Some(parse("100us")),
            None,
            Some(parse("normal:5ms,1ms")),
        );
        assert_eq!(*l.get(LatOp::Read), parse("100us"));
        assert_eq!(*l.get(LatOp::Write), parse("1ms"));
        assert_eq!(*l.get(LatOp::Flush), parse("normal:5ms,1ms"));
        assert_eq!(*l.get(LatOp::Other), parse("1ms"));

        // Per-op flags without --latency: the rest stay zero.
        let w = OpLatency::from_flags(None, None, Some(parse("20us")), None);
        assert!(w.get(LatOp::Read).is_zero());
        assert_eq!(*w.get(LatOp::Write), parse("20us"));
        assert!(w.get(LatOp::Other).is_zero());

        let mut s = l;
        s.set(LatOp::Other, LatencySpec::Zero);
        assert!(s.other.is_zero());
        for (i, op) in LatOp::ALL.into_iter().enumerate() {
            assert_eq!(op.index(), i);
        }
    }

    #[test]
    fn op_latency_samplers_are_independent() {
        let l = OpLatency::all(parse("uniform:1us..1ms"));
        let seq = |op, queue| {
            let mut s = l.sampler(op, 99, queue);
            (0..100).map(|_| s.sample()).collect::<Vec<_>>()
        };
        let mut all = Vec::new();
        for queue in 0..4 {
            for op in LatOp::ALL {
                let a = seq(op, queue);
                assert_eq!(a, seq(op, queue));
                all.push(a);
            }
        }
        for i in 0..all.len() {
            for j in i + 1..all.len() {
                assert_ne!(all[i], all[j], "streams {i} and {j}");
            }
        }
        assert_eq!(l.sampler(LatOp::Flush, 99, 2).spec(), l.get(LatOp::Flush));
    }

    #[test]
    fn directly_built_odd_specs_do_not_panic() {
        let mut u = LatencySampler::new(
            LatencySpec::Uniform {
                min: us(10),
                max: us(5),
            },
            1,
        );
        for _ in 0..1000 {
            let d = u.sample();
            assert!(d >= us(5) && d <= us(10));
        }
        let mut l = LatencySampler::new(
            LatencySpec::LogNormal {
                median: us(10),
                sigma: f64::NAN,
            },
            1,
        );
        assert_eq!(l.sample(), us(10));
        let mut z = LatencySampler::new(
            LatencySpec::LogNormal {
                median: Duration::ZERO,
                sigma: 1.0,
            },
            1,
        );
        assert_eq!(z.sample(), Duration::ZERO);
        assert!(LatencySpec::Fixed(Duration::ZERO).is_zero());
    }
}
