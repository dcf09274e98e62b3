//! KVM's own per-vCPU statistics over a variant's window, under KVM: QEMU's
//! `query-stats` (target `vcpu`, provider `kvm`; QEMU 7.1 and later) on its
//! QMP socket at the begin and the end SYNC. `query-stats-schemas`, asked
//! once per boot, says which statistics are cumulative counters: only those
//! are differenced (instant and peak values and histograms are left out).
//! A QEMU without the commands, or a host kernel without KVM's binary
//! statistics (QEMU then lists none), gives records that say so; any other
//! failure fails the boot.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use log::warn;
use serde::Deserialize;
use serde_json::{json, Value};
use thiserror::Error;

use crate::lab::guest::qmp::{Qmp, QmpError};
use crate::lab::measure::kvm_exit_tracepoint::{
    kvm_tracefs, ExitTrace, ExitTraceUnavailable, HistSample, KvmExitsError,
};
use crate::record::kvm::{KvmVcpu, KvmWindow, KVM_SOURCE};

/// How long QEMU has to open its QMP socket.
const CONNECT_WITHIN: Duration = Duration::from_secs(10);

/// Whether the run has said that this QEMU has no KVM statistics.
static WARNED: AtomicBool = AtomicBool::new(false);

/// Whether the run has said that the host cannot count exits by reason.
static WARNED_EXITS: AtomicBool = AtomicBool::new(false);

#[derive(Debug, Error)]
pub enum KvmStatsError {
    #[error(transparent)]
    Qmp(#[from] QmpError),
    #[error("QEMU's answer to {command} is not what qapi/stats.json describes: {source}")]
    Answer {
        command: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("QEMU's query-stats lists a vCPU without its qom-path")]
    NoQomPath,
    #[error("query-stats at the end lists other vCPUs than at the begin: {begin:?} then {end:?}")]
    Vcpus {
        begin: Vec<String>,
        end: Vec<String>,
    },
    #[error("{vcpu}: the cumulative counter {stat} is {end} at the end, {begin} at the begin")]
    Backwards {
        vcpu: String,
        stat: String,
        begin: u64,
        end: u64,
    },
    #[error("{vcpu}: the cumulative counter {stat} is not a number in both samples")]
    NotACounter { vcpu: String, stat: String },
    #[error(transparent)]
    Exits(#[from] KvmExitsError),
    #[error("QEMU's query-cpus-fast does not list the vCPU {vcpu} with its thread")]
    NoThread { vcpu: String },
}

/// One statistic's description (`StatsSchemaValue`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub(crate) struct StatSchema {
    pub(crate) name: String,
    #[serde(rename = "type")]
    pub(crate) kind: String,
    #[serde(default)]
    pub(crate) unit: Option<String>,
    #[serde(default)]
    pub(crate) base: Option<i8>,
    pub(crate) exponent: i16,
}

impl StatSchema {
    fn cumulative(&self) -> bool {
        self.kind == "cumulative"
    }

    /// The unit a value is in (`ns` for seconds × 10⁻⁹), if not a count.
    fn unit_text(&self) -> Option<String> {
        let unit = self.unit.as_deref()?;
        Some(match (unit, self.base, self.exponent) {
            (u, _, 0) => u.to_string(),
            ("seconds", Some(10), -3) => "ms".into(),
            ("seconds", Some(10), -6) => "µs".into(),
            ("seconds", Some(10), -9) => "ns".into(),
            (u, b, e) => format!("{}^{e} {u}", b.unwrap_or(10)),
        })
    }
}

/// `StatsSchema`: one provider's statistics for one target.
#[derive(Debug, Deserialize)]
struct SchemaAnswer {
    provider: String,
    target: String,
    stats: Vec<StatSchema>,
}

/// KVM's vCPU statistics by name.
pub(crate) type Schemas = BTreeMap<String, StatSchema>;

/// KVM's vCPU statistics from a `query-stats-schemas` answer.
pub(crate) fn parse_schemas(answer: Value) -> Result<Schemas, KvmStatsError> {
    let list: Vec<SchemaAnswer> =
        serde_json::from_value(answer).map_err(|source| KvmStatsError::Answer {
            command: "query-stats-schemas",
            source,
        })?;
    Ok(list
        .into_iter()
        .filter(|s| s.provider == "kvm" && s.target == "vcpu")
        .flat_map(|s| s.stats)
        .map(|s| (s.name.clone(), s))
        .collect())
}

/// A statistic's value (`StatsValue`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub(crate) enum StatValue {
    Scalar(u64),
    Boolean(bool),
    List(Vec<u64>),
}

#[derive(Debug, Deserialize)]
struct Stat {
    name: String,
    value: StatValue,
}

/// `StatsResult`: one object's statistics from one provider.
#[derive(Debug, Deserialize)]
struct StatsResult {
    provider: String,
    #[serde(rename = "qom-path", default)]
    qom_path: Option<String>,
    stats: Vec<Stat>,
}

/// One vCPU's statistics at one moment.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct VcpuSample {
    pub(crate) qom_path: String,
    pub(crate) values: BTreeMap<String, StatValue>,
}

/// Every vCPU's statistics at one moment, in vCPU order.
pub(crate) type Sample = Vec<VcpuSample>;

/// The KVM vCPUs of a `query-stats` answer, in vCPU order (QEMU lists
/// them last first).
pub(crate) fn parse_stats(answer: Value) -> Result<Sample, KvmStatsError> {
    let list: Vec<StatsResult> =
        serde_json::from_value(answer).map_err(|source| KvmStatsError::Answer {
            command: "query-stats",
            source,
        })?;
    let mut vcpus = list
        .into_iter()
        .filter(|r| r.provider == "kvm")
        .map(|r| {
            Ok(VcpuSample {
                qom_path: r.qom_path.ok_or(KvmStatsError::NoQomPath)?,
                values: r.stats.into_iter().map(|s| (s.name, s.value)).collect(),
            })
        })
        .collect::<Result<Sample, KvmStatsError>>()?;
    vcpus.sort_by_key(|v| qom_order(&v.qom_path));
    Ok(vcpus)
}

/// A QOM path's sort key: `device[10]` after `device[9]`.
fn qom_order(path: &str) -> (String, u64) {
    let numbered = path
        .strip_suffix(']')
        .and_then(|p| p.rsplit_once('['))
        .and_then(|(head, n)| Some((head.to_string(), n.parse().ok()?)));
    numbered.unwrap_or_else(|| (path.to_string(), 0))
}

/// The window from `begin` to `end`: each cumulative counter's increase,
/// per vCPU and summed. A counter that went down is an error, not a wrap
/// (KVM's counters are 64-bit).
pub(crate) fn window(
    schemas: &Schemas,
    begin: &Sample,
    end: &Sample,
) -> Result<KvmWindow, KvmStatsError> {
    let paths = |s: &Sample| s.iter().map(|v| v.qom_path.clone()).collect::<Vec<_>>();
    if paths(begin) != paths(end) {
        return Err(KvmStatsError::Vcpus {
            begin: paths(begin),
            end: paths(end),
        });
    }
    let mut w = KvmWindow {
        source: KVM_SOURCE.to_string(),
        ..KvmWindow::default()
    };
    for (a, z) in begin.iter().zip(end) {
        let vcpu = vcpu_window(schemas, a, z)?;
        for (k, v) in &vcpu.counters {
            *w.counters.entry(k.clone()).or_default() += v;
        }
        w.per_vcpu.push(vcpu);
    }
    w.units = w
        .counters
        .keys()
        .filter_map(|k| Some((k.clone(), schemas.get(k)?.unit_text()?)))
        .collect();
    Ok(w)
}

/// One vCPU's cumulative counters from `a` to `z` (the same vCPU).
fn vcpu_window(
    schemas: &Schemas,
    a: &VcpuSample,
    z: &VcpuSample,
) -> Result<KvmVcpu, KvmStatsError> {
    let mut counters = BTreeMap::new();
    for (name, end) in &z.values {
        if !schemas.get(name).is_some_and(StatSchema::cumulative) {
            continue;
        }
        let (Some(StatValue::Scalar(b)), StatValue::Scalar(e)) = (a.values.get(name), end) else {
            return Err(KvmStatsError::NotACounter {
                vcpu: z.qom_path.clone(),
                stat: name.clone(),
            });
        };
        let delta = e.checked_sub(*b).ok_or_else(|| KvmStatsError::Backwards {
            vcpu: z.qom_path.clone(),
            stat: name.clone(),
            begin: *b,
            end: *e,
        })?;
        counters.insert(name.clone(), delta);
    }
    Ok(KvmVcpu {
        qom_path: z.qom_path.clone(),
        counters,
        exit_reasons: BTreeMap::new(),
    })
}

/// Exits by reason: the host's trace and QEMU's vCPU threads, or why the
/// host cannot count them.
enum Exits {
    Counting {
        trace: ExitTrace,
        /// vCPU QOM path → its thread.
        threads: BTreeMap<String, u64>,
        begin: Option<HistSample>,
        end: Option<HistSample>,
    },
    Unavailable(String),
}

/// QEMU's vCPU threads by QOM path, from a `query-cpus-fast` answer.
pub(crate) fn parse_vcpu_threads(answer: Value) -> Result<BTreeMap<String, u64>, KvmStatsError> {
    #[derive(Deserialize)]
    struct Cpu {
        #[serde(rename = "qom-path")]
        qom_path: String,
        #[serde(rename = "thread-id")]
        thread_id: u64,
    }
    let cpus: Vec<Cpu> =
        serde_json::from_value(answer).map_err(|source| KvmStatsError::Answer {
            command: "query-cpus-fast",
            source,
        })?;
    Ok(cpus
        .into_iter()
        .map(|c| (c.qom_path, c.thread_id))
        .collect())
}

impl Exits {
    /// Start counting QEMU's exits by reason on this host.
    fn start(qmp: &mut Qmp) -> Result<Exits, KvmStatsError> {
        let unavailable = |why: ExitTraceUnavailable| {
            if !WARNED_EXITS.swap(true, Ordering::Relaxed) {
                warn!("records will have no KVM exits by reason: {why}");
            }
            Exits::Unavailable(why.to_string())
        };
        let root = match kvm_tracefs() {
            Ok(root) => root,
            Err(why) => return Ok(unavailable(why)),
        };
        let threads = parse_vcpu_threads(qmp.execute("query-cpus-fast", None)?)?;
        let tids: Vec<u64> = threads.values().copied().collect();
        let trace = match ExitTrace::start(&root, &tids) {
            Ok(t) => t,
            Err(why) => return Ok(unavailable(why)),
        };
        Ok(Exits::Counting {
            trace,
            threads,
            begin: None,
            end: None,
        })
    }

    fn begin(&mut self) -> Result<(), KvmStatsError> {
        if let Exits::Counting { trace, begin, .. } = self {
            *begin = Some(trace.sample()?);
        }
        Ok(())
    }

    fn sample_end(&mut self) -> Result<(), KvmStatsError> {
        if let Exits::Counting { trace, end, .. } = self {
            *end = Some(trace.sample()?);
        }
        Ok(())
    }

    /// Add the exits by reason from the begin to the end sample to `w`
    /// (whose vCPUs are QEMU's, in order); a warning when the histogram
    /// dropped keys (`w` then keeps KVM's counters only, and says why).
    fn end(&mut self, w: &mut KvmWindow) -> Result<Option<String>, KvmStatsError> {
        let (trace, threads, begin, end) = match self {
            Exits::Unavailable(why) => {
                w.exit_reasons_unavailable = Some(why.clone());
                return Ok(None);
            }
            Exits::Counting {
                trace,
                threads,
                begin,
                end,
            } => (trace, threads, begin, end),
        };
        let (Some(first), Some(end)) = (begin.take(), end.take()) else {
            return Ok(None);
        };
        let tids = w
            .per_vcpu
            .iter()
            .map(|v| {
                threads
                    .get(&v.qom_path)
                    .copied()
                    .ok_or_else(|| KvmStatsError::NoThread {
                        vcpu: v.qom_path.clone(),
                    })
            })
            .collect::<Result<Vec<u64>, KvmStatsError>>()?;
        w.exit_reasons_trace = Some(trace.describe());
        if end.dropped > 0 {
            let why = dropped_reason(end.dropped);
            w.exit_reasons_dropped = Some(end.dropped);
            w.exit_reasons_unavailable = Some(why.clone());
            return Ok(Some(why));
        }
        let reasons = trace.window(&tids, &first.hist, &end.hist)?;
        for (v, r) in w.per_vcpu.iter_mut().zip(reasons.per_thread) {
            v.exit_reasons = r;
        }
        w.exit_reasons = Some(reasons.total);
        Ok(None)
    }
}

/// Why a window whose histogram dropped `n` keys has no exits by reason.
fn dropped_reason(n: u64) -> String {
    format!(
        "the kvm:kvm_exit histogram dropped {n} key(s) (it was full): exits by reason \
         would be short, so this record has KVM's counters only"
    )
}

/// Where the sampler stands with QEMU.
enum Conn {
    /// Not connected yet (QEMU may still be starting).
    Closed,
    Open {
        qmp: Qmp,
        schemas: Schemas,
        exits: Box<Exits>,
    },
    /// This QEMU or host has no KVM statistics, and why.
    Unavailable(String),
}

/// One boot's KVM statistics: connected at the first sample, sampled at
/// each variant's begin and end SYNC.
pub(crate) struct KvmSampler {
    path: PathBuf,
    conn: Conn,
    begin: Option<Sample>,
}

impl KvmSampler {
    /// A sampler for QEMU's QMP socket at `path` (`-qmp unix:PATH,…`).
    pub(crate) fn new(path: PathBuf) -> KvmSampler {
        KvmSampler {
            path,
            conn: Conn::Closed,
            begin: None,
        }
    }

    /// The begin SYNC: the counters the window starts from.
    pub(crate) fn begin(&mut self) -> Result<(), KvmStatsError> {
        self.begin = self.sample()?;
        if let Conn::Open { exits, .. } = &mut self.conn {
            exits.begin()?;
        }
        Ok(())
    }

    /// The end SYNC: the window since the begin SYNC (the reason instead,
    /// without KVM statistics; None without a begin).
    pub(crate) fn end(&mut self) -> Result<Option<KvmWindow>, KvmStatsError> {
        let Some(first) = self.begin.take() else {
            return Ok(self.unavailable());
        };
        // The exits by reason are read after query-stats at the begin and
        // before it at the end: their window lies within the counters'.
        if let Conn::Open { exits, .. } = &mut self.conn {
            exits.sample_end()?;
        }
        let Some(last) = self.sample()? else {
            return Ok(self.unavailable());
        };
        let Conn::Open { schemas, exits, .. } = &mut self.conn else {
            return Ok(None);
        };
        let mut w = window(schemas, &first, &last)?;
        if let Some(why) = exits.end(&mut w)? {
            warn!("KVM exits by reason: {why}");
        }
        Ok(Some(w))
    }

    /// The window of a QEMU without KVM statistics.
    fn unavailable(&self) -> Option<KvmWindow> {
        match &self.conn {
            Conn::Unavailable(why) => Some(KvmWindow::unavailable(why.clone())),
            _ => None,
        }
    }

    /// Every vCPU's statistics now (None without KVM statistics).
    fn sample(&mut self) -> Result<Option<Sample>, KvmStatsError> {
        if let Conn::Closed = self.conn {
            self.conn = open(&self.path)?;
        }
        let Conn::Open { qmp, .. } = &mut self.conn else {
            return Ok(None);
        };
        let args = json!({"target": "vcpu", "providers": [{"provider": "kvm"}]});
        match qmp.execute("query-stats", Some(args)) {
            Ok(answer) => parse_stats(answer).map(Some),
            Err(e) if e.is_command_not_found() => {
                self.conn = unavailable(format!("QEMU has no query-stats (QEMU < 7.1): {e}"));
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// Connect to QEMU and read KVM's vCPU statistics' schema.
fn open(path: &Path) -> Result<Conn, KvmStatsError> {
    let mut qmp = Qmp::connect(path, CONNECT_WITHIN)?;
    let schemas = match qmp.execute("query-stats-schemas", Some(json!({"provider": "kvm"}))) {
        Ok(answer) => parse_schemas(answer)?,
        Err(e) if e.is_command_not_found() => {
            return Ok(unavailable(format!(
                "QEMU has no query-stats-schemas (QEMU < 7.1): {e}"
            )))
        }
        Err(e) => return Err(e.into()),
    };
    if schemas.is_empty() {
        return Ok(unavailable(
            "QEMU lists no KVM vCPU statistics (the host kernel has no KVM binary statistics, Linux < 5.14)"
                .into(),
        ));
    }
    let exits = Box::new(Exits::start(&mut qmp)?);
    Ok(Conn::Open {
        qmp,
        schemas,
        exits,
    })
}

/// No KVM statistics, and why (said once per run).
fn unavailable(why: String) -> Conn {
    if !WARNED.swap(true, Ordering::Relaxed) {
        warn!("records will have no KVM statistics: {why}");
    }
    Conn::Unavailable(why)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab::guest::qmp::tests::fake_qemu;

    const SCHEMAS: &str = include_str!("testdata/query-stats-schemas.qemu-doc.json");
    const BEGIN: &str = include_str!("testdata/query-stats.qemu-doc.begin.json");
    const END: &str = include_str!("testdata/query-stats.qemu-doc.end.json");
    const REC_SCHEMAS: &str =
        include_str!("testdata/query-stats-schemas.qemu-10.0-kvm-linux-6.18-nested.json");
    const REC_BEGIN: &str =
        include_str!("testdata/query-stats.qemu-10.0-kvm-linux-6.18-nested-seabios.begin.json");
    const REC_END: &str =
        include_str!("testdata/query-stats.qemu-10.0-kvm-linux-6.18-nested-seabios.end.json");

    /// The `return` of a recorded QMP answer.
    fn answer(text: &str) -> Value {
        let mut v: Value = serde_json::from_str(text).unwrap();
        v["return"].take()
    }

    fn schemas() -> Schemas {
        parse_schemas(answer(SCHEMAS)).unwrap()
    }

    fn sample(text: &str) -> Sample {
        parse_stats(answer(text)).unwrap()
    }

    /// Exits counted over a fixture histogram for one vCPU (thread 7):
    /// `begin` and `end` are the hist file's text at each SYNC.
    fn exits_over(begin: &str, end: &str) -> (KvmWindow, Option<String>) {
        let t = tempfile::tempdir().unwrap();
        let instance = t.path().join("blklab-fixture");
        let trace = ExitTrace::in_fixture(&instance, &[7]);
        let hist = instance.join("events/kvm/kvm_exit/hist");
        let mut exits = Exits::Counting {
            trace,
            threads: [("/machine/unattached/device[0]".to_string(), 7)].into(),
            begin: None,
            end: None,
        };
        std::fs::write(&hist, begin).unwrap();
        exits.begin().unwrap();
        std::fs::write(&hist, end).unwrap();
        exits.sample_end().unwrap();
        let mut w = KvmWindow {
            counters: [("exits".to_string(), 40)].into(),
            per_vcpu: vec![KvmVcpu {
                qom_path: "/machine/unattached/device[0]".into(),
                counters: [("exits".to_string(), 40)].into(),
                exit_reasons: BTreeMap::new(),
            }],
            ..KvmWindow::default()
        };
        let warning = exits.end(&mut w).unwrap();
        (w, warning)
    }

    #[test]
    fn a_histogram_that_dropped_keys_is_a_warning_and_the_counters_stay() {
        let line =
            |hits: u64| format!("{{ common_pid: 7, isa: 2, exit_reason: 120 }} hitcount: {hits}\n");
        let totals = |dropped: u64| {
            format!("\nTotals:\n    Hits: 1\n    Entries: 1\n    Dropped: {dropped}\n")
        };
        // A full histogram: the window goes on with KVM's counters, says
        // why it has no reasons, and the sampler is told to warn.
        let (w, warning) = exits_over(&line(3), &(line(30) + &totals(2)));
        let why = warning.expect("a warning");
        assert!(why.contains("dropped 2 key(s)"), "{why}");
        assert_eq!(w.exit_reasons, None);
        assert_eq!(w.exit_reasons_dropped, Some(2));
        assert_eq!(w.exit_reasons_unavailable.as_deref(), Some(why.as_str()));
        assert_eq!(w.counters["exits"], 40);
        let trace = w.exit_reasons_trace.unwrap();
        assert!(trace.ends_with("if common_pid == 7"), "{trace}");
        // Nothing dropped: the reasons, no warning.
        let (w, warning) = exits_over(&line(3), &(line(30) + &totals(0)));
        assert_eq!(warning, None);
        assert_eq!(w.exit_reasons, Some([("hlt".to_string(), 27)].into()));
        assert_eq!(w.exit_reasons_dropped, None);
    }

    #[test]
    fn the_schema_keeps_kvm_vcpu_statistics_only() {
        let s = schemas();
        assert_eq!(s["exits"].kind, "cumulative");
        assert_eq!(s["guest_mode"].kind, "instant");
        assert_eq!(s["halt_wait_hist"].kind, "log2-histogram");
        assert_eq!(s["halt_wait_ns"].unit_text().as_deref(), Some("ns"));
        assert_eq!(s["exits"].unit_text(), None);
        assert_eq!(s["blocking"].unit_text().as_deref(), Some("boolean"));
        // The vm target's statistics are not the vCPUs'.
        assert!(!s.contains_key("max_mmu_page_hash_collisions"));
        assert!(!s.contains_key("remote_tlb_flush"));
    }

    #[test]
    fn a_sample_lists_the_vcpus_in_order_with_every_kind_of_value() {
        let b = sample(BEGIN);
        let paths: Vec<&str> = b.iter().map(|v| v.qom_path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "/machine/unattached/device[0]",
                "/machine/unattached/device[1]"
            ]
        );
        let v0 = &b[0].values;
        assert_eq!(v0["exits"], StatValue::Scalar(57922));
        assert_eq!(v0["directed_yield_attempted"], StatValue::Scalar(106));
        assert_eq!(v0["blocking"], StatValue::Boolean(true));
        assert!(matches!(&v0["halt_wait_hist"], StatValue::List(l) if l.len() == 32));
    }

    #[test]
    fn a_recorded_answer_of_qemu_10_under_kvm_reads_and_differences() {
        let s = parse_schemas(answer(REC_SCHEMAS)).unwrap();
        assert_eq!(s["halt_wait_ns"].unit_text().as_deref(), Some("ns"));
        assert_eq!(s["guest_mode"].unit_text().as_deref(), Some("boolean"));
        let (b, e) = (
            parse_stats(answer(REC_BEGIN)).unwrap(),
            parse_stats(answer(REC_END)).unwrap(),
        );
        let paths: Vec<&str> = e.iter().map(|v| v.qom_path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "/machine/unattached/device[0]",
                "/machine/unattached/device[2]"
            ]
        );
        assert_eq!(b[0].values["guest_mode"], StatValue::Boolean(false));
        let w = window(&s, &b, &e).unwrap();
        // Every cumulative counter of the schema is in the window, nothing
        // else is.
        let cumulative: Vec<&String> = s
            .values()
            .filter(|x| x.cumulative())
            .map(|x| &x.name)
            .collect();
        assert_eq!(w.counters.keys().collect::<Vec<_>>(), cumulative);
        let scalar = |x: &Sample, cpu: usize, k: &str| match x[cpu].values[k] {
            StatValue::Scalar(n) => n,
            ref v => panic!("{k}: {v:?}"),
        };
        for k in ["exits", "insn_emulation", "halt_wait_ns"] {
            let d: Vec<u64> = (0..2)
                .map(|c| scalar(&e, c, k) - scalar(&b, c, k))
                .collect();
            assert_eq!(w.per_vcpu[0].counters[k], d[0], "{k}");
            assert_eq!(w.per_vcpu[1].counters[k], d[1], "{k}");
            assert_eq!(w.counters[k], d[0] + d[1], "{k}");
        }
        // SeaBIOS ran on vCPU 0; vCPU 1 sat halted, waiting for its SIPI.
        assert!(w.per_vcpu[0].counters["exits"] > 0);
        assert_eq!(w.per_vcpu[1].counters["exits"], 0);
        assert!(w.per_vcpu[1].counters["halt_wait_ns"] > 1_000_000_000);
    }

    #[test]
    fn qom_paths_sort_by_number() {
        let mut p = vec!["/m/device[10]", "/m/device[9]", "/m/device[0]"];
        p.sort_by_key(|a| qom_order(a));
        assert_eq!(p, ["/m/device[0]", "/m/device[9]", "/m/device[10]"]);
    }

    #[test]
    fn the_window_differences_cumulative_counters_per_vcpu_and_sums_them() {
        let (b, e) = (sample(BEGIN), sample(END));
        let w = window(&schemas(), &b, &e).unwrap();
        let own = |s: &Sample, cpu: usize, k: &str| match &s[cpu].values[k] {
            StatValue::Scalar(n) => *n,
            v => panic!("{k}: {v:?}"),
        };
        for k in ["exits", "halt_exits", "irq_injections", "halt_wait_ns"] {
            let d0 = own(&e, 0, k) - own(&b, 0, k);
            let d1 = own(&e, 1, k) - own(&b, 1, k);
            assert_eq!(w.per_vcpu[0].counters[k], d0, "{k}");
            assert_eq!(w.per_vcpu[1].counters[k], d1, "{k}");
            assert_eq!(w.counters[k], d0 + d1, "{k}");
        }
        assert_eq!(w.per_vcpu[1].qom_path, "/machine/unattached/device[1]");
        assert_eq!(w.units["halt_poll_success_ns"], "ns");
        assert!(!w.units.contains_key("exits"));
        assert_eq!(w.source, KVM_SOURCE);
        assert_eq!(w.unavailable, None);
    }

    #[test]
    fn what_is_not_cumulative_is_not_differenced() {
        let (b, e) = (sample(BEGIN), sample(END));
        let w = window(&schemas(), &b, &e).unwrap();
        // guest_mode (instant) goes from 1 down to 0 in the fixture: left
        // out, not an error; histograms and booleans are left out too.
        assert_eq!(b[0].values["guest_mode"], StatValue::Scalar(1));
        assert_eq!(e[0].values["guest_mode"], StatValue::Scalar(0));
        for k in ["guest_mode", "blocking", "halt_wait_hist"] {
            assert!(!w.counters.contains_key(k), "{k}");
        }
        // A statistic the schema does not list is left out as well.
        let mut s = schemas();
        s.remove("exits");
        assert!(!window(&s, &b, &e).unwrap().counters.contains_key("exits"));
        // The same statistic declared cumulative would be an error.
        let mut s = schemas();
        s.get_mut("guest_mode").unwrap().kind = "cumulative".into();
        assert!(matches!(
            window(&s, &b, &e),
            Err(KvmStatsError::Backwards { stat, begin: 1, end: 0, .. }) if stat == "guest_mode"
        ));
    }

    #[test]
    fn a_counter_that_goes_backwards_is_an_error_not_a_wrap() {
        let (b, mut e) = (sample(BEGIN), sample(END));
        e[1].values.insert("exits".into(), StatValue::Scalar(5));
        let err = window(&schemas(), &b, &e).unwrap_err();
        assert!(
            matches!(&err, KvmStatsError::Backwards { vcpu, stat, begin: 48000, end: 5 }
                if vcpu == "/machine/unattached/device[1]" && stat == "exits"),
            "{err:?}"
        );
    }

    #[test]
    fn other_vcpus_or_a_counter_that_changed_kind_are_errors() {
        let (b, e) = (sample(BEGIN), sample(END));
        let one = e[..1].to_vec();
        assert!(matches!(
            window(&schemas(), &b, &one),
            Err(KvmStatsError::Vcpus { .. })
        ));
        let mut odd = e.clone();
        odd[0]
            .values
            .insert("exits".into(), StatValue::Boolean(true));
        assert!(matches!(
            window(&schemas(), &b, &odd),
            Err(KvmStatsError::NotACounter { stat, .. }) if stat == "exits"
        ));
        let mut gone = b.clone();
        gone[0].values.remove("exits");
        assert!(matches!(
            window(&schemas(), &gone, &e),
            Err(KvmStatsError::NotACounter { .. })
        ));
    }

    #[test]
    fn answers_of_another_shape_are_refused() {
        assert!(matches!(
            parse_stats(json!({"not": "a list"})),
            Err(KvmStatsError::Answer {
                command: "query-stats",
                ..
            })
        ));
        assert!(matches!(
            parse_stats(json!([{"provider": "kvm", "stats": []}])),
            Err(KvmStatsError::NoQomPath)
        ));
        assert!(matches!(
            parse_schemas(json!([{"provider": "kvm", "target": "vcpu", "stats": [{"name": "x"}]}])),
            Err(KvmStatsError::Answer {
                command: "query-stats-schemas",
                ..
            })
        ));
    }

    /// A fake QEMU answering the capabilities, then `answers` in turn.
    fn sampler_against(
        dir: &Path,
        answers: Vec<String>,
    ) -> (KvmSampler, std::thread::JoinHandle<Vec<Value>>) {
        let path = dir.join("qmp.sock");
        let mut script = vec![vec![r#"{"return": {}, "id": 1}"#.to_string()]];
        script.extend(answers.into_iter().map(|a| vec![a]));
        let server = fake_qemu(&path, script);
        (KvmSampler::new(path), server)
    }

    /// `text` (a recorded answer) as the answer to command `id`.
    fn with_id(text: &str, id: u64) -> String {
        let mut v: Value = serde_json::from_str(text).unwrap();
        v["id"] = json!(id);
        v.to_string()
    }

    #[test]
    fn a_sampler_asks_the_schema_once_then_samples_each_edge() {
        let dir = tempfile::tempdir().unwrap();
        let (mut k, server) = sampler_against(
            dir.path(),
            vec![with_id(SCHEMAS, 2), with_id(BEGIN, 3), with_id(END, 4)],
        );
        k.begin().unwrap();
        let w = k.end().unwrap().expect("a window");
        assert_eq!(w.counters["exits"], 4000 + 3000);
        drop(k);
        let got = server.join().unwrap();
        assert_eq!(got[1]["execute"], "query-stats-schemas");
        assert_eq!(got[1]["arguments"], json!({"provider": "kvm"}));
        for cmd in &got[2..] {
            assert_eq!(cmd["execute"], "query-stats");
            assert_eq!(
                cmd["arguments"],
                json!({"target": "vcpu", "providers": [{"provider": "kvm"}]})
            );
        }
        assert_eq!(got.len(), 4);
    }

    #[test]
    fn a_qemu_without_query_stats_gives_windows_that_say_why() {
        let dir = tempfile::tempdir().unwrap();
        let (mut k, server) = sampler_against(
            dir.path(),
            vec![r#"{"id": 2, "error": {"class": "CommandNotFound", "desc": "The command query-stats-schemas has not been found"}}"#.into()],
        );
        k.begin().unwrap();
        let w = k.end().unwrap().expect("a window saying why");
        let why = w.unavailable.as_deref().unwrap();
        assert!(
            why.contains("QEMU < 7.1") && why.contains("CommandNotFound"),
            "{why}"
        );
        assert!(w.counters.is_empty() && w.per_vcpu.is_empty());
        // Later variants ask QEMU nothing more.
        k.begin().unwrap();
        assert_eq!(k.end().unwrap(), Some(w));
        drop(k);
        assert_eq!(server.join().unwrap().len(), 2);
    }

    #[test]
    fn a_host_without_kvm_statistics_gives_windows_that_say_why() {
        // What QEMU 10 answers when KVM registered no statistics.
        let dir = tempfile::tempdir().unwrap();
        let (mut k, server) =
            sampler_against(dir.path(), vec![r#"{"return": [], "id": 2}"#.into()]);
        k.begin().unwrap();
        let w = k.end().unwrap().expect("a window saying why");
        assert!(w.unavailable.unwrap().contains("no KVM vCPU statistics"));
        drop(k);
        server.join().unwrap();
    }

    #[test]
    fn any_other_error_fails() {
        let dir = tempfile::tempdir().unwrap();
        let (mut k, server) = sampler_against(
            dir.path(),
            vec![
                with_id(SCHEMAS, 2),
                r#"{"id": 3, "error": {"class": "GenericError", "desc": "KVM stats: failed to read data"}}"#.into(),
            ],
        );
        let e = k.begin().unwrap_err();
        assert!(
            matches!(&e, KvmStatsError::Qmp(QmpError::Command { class, .. }) if class == "GenericError"),
            "{e:?}"
        );
        drop(k);
        server.join().unwrap();
    }
}
