//! Prometheus metrics: a stats document as the text exposition format
//! (version 0.0.4), which [`crate::stats::http`] serves over HTTP and the
//! control socket's `prom` command answers.
//!
//! [`render`] turns a [`StatsDocument`] into metric families: every
//! per-queue counter as a `blklab_<field>_total` counter, the worker's CPU
//! time, the histograms as summaries (quantiles 0.5, 0.9, 0.99, 0.999, with
//! `_sum` and `_count`; latencies in seconds), `blklab_info` /
//! `blklab_disk_info` gauges, and the daemon's life: its start time by
//! instance (`blklab_start_time_seconds`, a new instance when the daemon
//! was restarted or replaced) and each disk's connection generation and
//! state (`blklab_disk_connections_total`, `blklab_disk_connected`).
//! Every per-queue sample carries the labels `disk="<socket path>"` and
//! `queue="<index>"`.
//!
//! **Which crate does what.** This module decides the families (names,
//! HELP texts, types, labels, values); the `prometheus` crate (TiKV's
//! client, without its protobuf feature) holds them in its data model and
//! its `TextEncoder` writes the text: HELP and TYPE lines, label and HELP
//! escaping, a summary's quantile, `_sum` and `_count` samples, and the
//! values' float syntax.
//!
//! Not `prometheus-client` (the official client): it writes OpenMetrics
//! only, and measured with 0.24.1 it cannot give today's names and types:
//!
//! | today | prometheus-client 0.24.1 |
//! |---|---|
//! | `# TYPE blklab_requests_total counter`, samples `blklab_requests_total` | `# TYPE blklab_requests counter` (registered as `blklab_requests`), or samples `blklab_requests_total_total` (registered as `blklab_requests_total`): the encoder appends `_total` to every counter sample |
//! | `# TYPE blklab_info gauge`, sample `blklab_info` | `# TYPE blklab_info info`, sample `blklab_info_info` |
//! | `# TYPE blklab_latency_seconds summary` (and the seven other summaries) | no summary type at all (`MetricType` has counter, gauge, histogram, info, unknown) |
//! | HELP text as written | a `.` appended to every HELP text (`… on the queue..`) |
//! | no end marker | `# EOF` |
//!
//! A custom `EncodeMetric` does not help: the metric type decides the
//! sample suffix, and there is no summary type to declare.
//!
//! Two differences from the hand-written text this replaces, neither in a
//! series' name, type, labels, HELP text or value as a float64: a family
//! with no samples (`blklab_worker_cpu_seconds_total` before a guest has
//! connected, every per-queue family of a document with no disk) is left
//! out instead of written as bare HELP and TYPE lines (the encoder
//! refuses an empty family, as Prometheus' Go client drops one); and a
//! counter above 2^53 is written as the shortest decimal of its float64
//! (`18446744073709552000` for `u64::MAX`) rather than its exact integer,
//! the same float64 to every reader of the format.

use log::error;
use prometheus::proto::{
    Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType, Quantile, Summary,
};
use prometheus::TextEncoder;

use crate::stats::histogram::HistSummary;
use crate::stats::queue::{QueueCounters, QueueReport, StatsDocument};

/// The `Content-Type` of the exposition text.
pub(crate) const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Picks one quantile out of a [`HistSummary`].
type PickQuantile = fn(&HistSummary) -> u64;

/// Picks one histogram out of a [`QueueReport`].
type PickHist = fn(&QueueReport) -> &HistSummary;

/// Quantiles of every summary: (quantile, field of [`HistSummary`]).
const QUANTILES: [(f64, PickQuantile); 4] = [
    (0.5, |h| h.p50),
    (0.9, |h| h.p90),
    (0.99, |h| h.p99),
    (0.999, |h| h.p999),
];

// ---------------------------------------------------------------------------
// Samples

/// Label pairs in the order given (the order they are written in).
fn labels(pairs: &[(&str, &str)]) -> Vec<LabelPair> {
    pairs
        .iter()
        .map(|(name, value)| {
            let mut l = LabelPair::default();
            l.set_name(name.to_string());
            l.set_value(value.to_string());
            l
        })
        .collect()
}

fn gauge(pairs: &[(&str, &str)], value: f64) -> Metric {
    let mut g = Gauge::default();
    g.set_value(value);
    let mut m = Metric::default();
    m.set_label(labels(pairs));
    m.set_gauge(g);
    m
}

fn counter(pairs: &[(&str, &str)], value: f64) -> Metric {
    let mut c = Counter::default();
    c.set_value(value);
    let mut m = Metric::default();
    m.set_label(labels(pairs));
    m.set_counter(c);
    m
}

/// One summary, its values divided by `divisor` (1e9 for ns → s; a
/// division, not a multiplication by 1e-9, so that 5050000 ns is written
/// 0.00505). Quantiles of an empty summary are NaN, as Prometheus client
/// libraries write them.
fn summary(pairs: &[(&str, &str)], h: &HistSummary, divisor: f64) -> Metric {
    let quantiles = QUANTILES
        .iter()
        .map(|(q, pick)| {
            let mut quantile = Quantile::default();
            quantile.set_quantile(*q);
            quantile.set_value(if h.count == 0 {
                f64::NAN
            } else {
                pick(h) as f64 / divisor
            });
            quantile
        })
        .collect();
    let mut s = Summary::default();
    s.set_quantile(quantiles);
    s.set_sample_count(h.count);
    s.set_sample_sum(if h.count == 0 {
        0.0
    } else {
        h.mean * h.count as f64 / divisor
    });
    let mut m = Metric::default();
    m.set_label(labels(pairs));
    m.set_summary(s);
    m
}

fn family(name: &str, help: &str, kind: MetricType, metrics: Vec<Metric>) -> MetricFamily {
    let mut f = MetricFamily::default();
    f.set_name(name.to_string());
    f.set_help(help.to_string());
    f.set_field_type(kind);
    f.set_metric(metrics);
    f
}

// ---------------------------------------------------------------------------
// Families

/// HELP text of the counter for `QueueCounters` field `field`.
fn counter_help(field: &str) -> String {
    let h = match field {
        "requests" => "Requests (descriptor chains) completed on the queue.",
        "reads" => "Read requests completed.",
        "writes" => "Write requests completed.",
        "flushes" => "Flush requests completed.",
        "get_ids" => "Get-ID requests completed.",
        "discards" => "Discard requests completed.",
        "write_zeroes" => "Write-zeroes requests completed.",
        "other" => "Requests of other (unknown) types.",
        "bytes_read" => "Bytes read by the guest.",
        "bytes_written" => "Bytes written by the guest.",
        "status_ioerr" => "Requests completed with VIRTIO_BLK_S_IOERR.",
        "status_unsupp" => "Requests completed with VIRTIO_BLK_S_UNSUPP.",
        "dropped" => "Chains returned with used length 0 because no status could be written.",
        "ring_errors" => "Times the avail ring was unusable.",
        "kicks" => "Guest kicks (exact eventfd counts, not wake-ups).",
        "wakeups" => "Wake-ups of the queue's worker.",
        "empty_wakeups" => "Worker wake-ups that found no request.",
        "notifications" => "Used-buffer notifications sent to the guest.",
        "tag_waits" => "Times the queue found no free command slot and stopped popping.",
        "completed_early" => "Requests in service completed before their emulated completion time because their ring or the daemon stopped.",
        "poll_spin_ns" => "Nanoseconds the worker polled the idle ring (--poll).",
        "poll_hits" => "Poll spins that found a request (--poll).",
        "poll_misses" => "Poll spins that ran out and re-enabled guest notifications (--poll).",
        "poll_window_grows" => "Waits for the guest after which the adaptive poll window grew (--poll=adaptive).",
        "poll_window_shrinks" => "Waits for the guest after which the adaptive poll window shrank (--poll=adaptive).",
        "notifications_suppressed" => {
            "Completions put on the used ring without a notification (EVENT_IDX: the driver's used_event did not ask for one)."
        }
        other => return format!("Per-queue counter {other}."),
    };
    h.to_string()
}

/// The counter fields of a queue, in serde_json's map order (by name:
/// deterministic).
fn counter_fields(c: &QueueCounters) -> Vec<(String, u64)> {
    match serde_json::to_value(c) {
        Ok(serde_json::Value::Object(m)) => m
            .into_iter()
            .filter_map(|(k, v)| v.as_u64().map(|n| (k, n)))
            .collect(),
        _ => Vec::new(),
    }
}

/// One summary family: per queue, each part's accessor gives a summary
/// and its extra labels; values are divided by `divisor`.
struct SummarySpec {
    name: &'static str,
    help: &'static str,
    divisor: f64,
    /// (extra label pairs, accessor)
    parts: Vec<(Vec<(&'static str, &'static str)>, PickHist)>,
}

fn summary_specs() -> Vec<SummarySpec> {
    vec![
        SummarySpec {
            name: "blklab_latency_seconds",
            help: "Service time of requests, pop to used, by operation.",
            divisor: 1e9,
            parts: vec![
                (vec![("op", "read")], |q| &q.latency_read_ns),
                (vec![("op", "write")], |q| &q.latency_write_ns),
                (vec![("op", "other")], |q| &q.latency_other_ns),
            ],
        },
        SummarySpec {
            name: "blklab_inter_arrival_seconds",
            help: "Time between consecutive request pops.",
            divisor: 1e9,
            parts: vec![(vec![], |q| &q.inter_arrival_ns)],
        },
        SummarySpec {
            name: "blklab_requests_per_wakeup",
            help: "Requests popped per worker wake-up.",
            divisor: 1.0,
            parts: vec![(vec![], |q| &q.requests_per_wakeup)],
        },
        SummarySpec {
            name: "blklab_requests_per_kick",
            help: "Requests popped per kick, per wake-up that had kicks (rounded).",
            divisor: 1.0,
            parts: vec![(vec![], |q| &q.requests_per_kick)],
        },
        SummarySpec {
            name: "blklab_kicks_per_wakeup",
            help: "Guest kicks per worker wake-up.",
            divisor: 1.0,
            parts: vec![(vec![], |q| &q.kicks_per_wakeup)],
        },
        SummarySpec {
            name: "blklab_inflight_at_pop",
            help: "Requests in service when a request is popped.",
            divisor: 1.0,
            parts: vec![(vec![], |q| &q.inflight_at_pop)],
        },
        SummarySpec {
            name: "blklab_tag_wait_seconds",
            help: "Time a queue waited for a free command slot.",
            divisor: 1e9,
            parts: vec![(vec![], |q| &q.tag_wait_ns)],
        },
        SummarySpec {
            name: "blklab_poll_window_seconds",
            help: "Adaptive poll window of each wait for the guest that a request ended (--poll=adaptive).",
            divisor: 1e9,
            parts: vec![(vec![], |q| &q.poll_window_ns)],
        },
    ]
}

/// Every queue of the document in document order: (disk label, queue
/// label, report).
fn queues(doc: &StatsDocument) -> Vec<(String, String, &QueueReport)> {
    doc.disks
        .iter()
        .flat_map(|d| {
            let disk = d.socket();
            d.queues
                .iter()
                .map(move |q| (disk.clone(), q.index.to_string(), q))
        })
        .collect()
}

fn info_families(doc: &StatsDocument) -> [MetricFamily; 2] {
    let build = gauge(
        &[
            ("version", &doc.blklab_version),
            ("git_commit", &doc.git_commit),
        ],
        1.0,
    );
    let disks = doc
        .disks
        .iter()
        .filter_map(|d| {
            let c = d.config.as_ref()?;
            Some(gauge(
                &[
                    ("disk", &d.socket()),
                    ("storage", &c.storage.to_string()),
                    ("size_bytes", &c.size.to_string()),
                    ("num_queues", &c.num_queues.to_string()),
                    ("queue_size", &c.queue_size.to_string()),
                ],
                1.0,
            ))
        })
        .collect();
    [
        family(
            "blklab_info",
            "Build of the blklab backend that produced these metrics.",
            MetricType::GAUGE,
            vec![build],
        ),
        family(
            "blklab_disk_info",
            "Configuration of a served disk.",
            MetricType::GAUGE,
            disks,
        ),
    ]
}

/// The daemon's start time by instance, and each disk's connection
/// generation and whether a frontend is connected.
fn lifecycle_families(doc: &StatsDocument) -> [MetricFamily; 3] {
    let start = doc
        .daemon
        .iter()
        .map(|d| {
            gauge(
                &[("instance", &d.instance), ("pid", &d.pid.to_string())],
                d.started_unix_ns as f64 / 1e9,
            )
        })
        .collect();
    let per_disk = |value: fn(&crate::stats::queue::DiskReport) -> f64,
                    make: fn(&[(&str, &str)], f64) -> Metric| {
        doc.disks
            .iter()
            .map(|d| make(&[("disk", &d.socket())], value(d)))
            .collect::<Vec<_>>()
    };
    [
        family(
            "blklab_start_time_seconds",
            "When the daemon started serving, seconds since the Unix epoch, labelled with its instance id (new when it was restarted or replaced: its counters started afresh).",
            MetricType::GAUGE,
            start,
        ),
        family(
            "blklab_disk_connections_total",
            "Frontends that have connected to the disk (its connection generation); the device's rings, latency sequences and fault schedules start over with each, the counters carry over.",
            MetricType::COUNTER,
            per_disk(|d| d.connections as f64, counter),
        ),
        family(
            "blklab_disk_connected",
            "Whether a frontend is connected to the disk now.",
            MetricType::GAUGE,
            per_disk(|d| f64::from(u8::from(d.connected)), gauge),
        ),
    ]
}

/// One counter family per `QueueCounters` field: the field list comes
/// from serde, so a new field appears here without a change to this
/// module.
fn counter_families(queues: &[(String, String, &QueueReport)]) -> Vec<MetricFamily> {
    let per_queue: Vec<Vec<(String, u64)>> = queues
        .iter()
        .map(|(_, _, q)| counter_fields(&q.counters))
        .collect();
    counter_fields(&QueueCounters::default())
        .into_iter()
        .map(|(field, _)| {
            let samples = queues
                .iter()
                .zip(&per_queue)
                .filter_map(|((disk, queue, _), fields)| {
                    let (_, v) = fields.iter().find(|(k, _)| *k == field)?;
                    Some(counter(&[("disk", disk), ("queue", queue)], *v as f64))
                })
                .collect();
            let name = format!("blklab_{field}_total");
            family(&name, &counter_help(&field), MetricType::COUNTER, samples)
        })
        .collect()
}

fn worker_families(queues: &[(String, String, &QueueReport)]) -> [MetricFamily; 2] {
    let cpu = queues
        .iter()
        .filter_map(|(disk, queue, q)| Some((disk, queue, q.worker_cpu?)))
        .flat_map(|(disk, queue, cpu)| {
            [("user", cpu.user_s), ("sys", cpu.sys_s)]
                .map(|(mode, v)| counter(&[("disk", disk), ("queue", queue), ("mode", mode)], v))
        })
        .collect();
    let window = queues
        .iter()
        .map(|(disk, queue, q)| {
            gauge(
                &[("disk", disk), ("queue", queue)],
                q.poll_window_now_ns as f64 / 1e9,
            )
        })
        .collect();
    [
        family(
            "blklab_worker_cpu_seconds_total",
            "CPU time of the worker thread serving the queue, by mode.",
            MetricType::COUNTER,
            cpu,
        ),
        family(
            "blklab_poll_window_now_seconds",
            "The queue's adaptive poll window now (--poll=adaptive).",
            MetricType::GAUGE,
            window,
        ),
    ]
}

fn summary_families(queues: &[(String, String, &QueueReport)]) -> Vec<MetricFamily> {
    summary_specs()
        .into_iter()
        .map(|spec| {
            let samples = queues
                .iter()
                .flat_map(|(disk, queue, q)| {
                    spec.parts.iter().map(move |(extra, pick)| {
                        let mut pairs = vec![("disk", disk.as_str()), ("queue", queue.as_str())];
                        pairs.extend(extra.iter().copied());
                        summary(&pairs, pick(q), spec.divisor)
                    })
                })
                .collect();
            family(spec.name, spec.help, MetricType::SUMMARY, samples)
        })
        .collect()
}

/// The metric families of `doc`, in a fixed order, each family's samples
/// in document order; families without samples left out.
fn families(doc: &StatsDocument) -> Vec<MetricFamily> {
    let queues = queues(doc);
    let mut all = Vec::new();
    all.extend(info_families(doc));
    all.extend(lifecycle_families(doc));
    all.extend(counter_families(&queues));
    all.extend(worker_families(&queues));
    all.extend(summary_families(&queues));
    all.retain(|f| !f.get_metric().is_empty());
    all
}

/// The Prometheus text exposition (format 0.0.4) of `doc`.
///
/// Deterministic: families in a fixed order, and within a family the
/// disks and queues in document order. Every family with samples has one
/// `# HELP` and one `# TYPE` line before them.
pub(crate) fn render(doc: &StatsDocument) -> String {
    let mut out = String::new();
    // The encoder fails only on a family without samples or without a
    // name, which `families` never gives.
    if let Err(e) = TextEncoder::new().encode_utf8(&families(doc), &mut out) {
        error!("metrics: cannot encode the exposition: {e}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::config::DiskArgs;
    use crate::stats::queue::{DiskReport, QueueStats, ThreadCpu};
    use std::collections::{BTreeMap, HashMap, HashSet};

    /// One sample line.
    #[derive(Debug, Clone)]
    struct Sample {
        name: String,
        labels: BTreeMap<String, String>,
        value: f64,
    }

    /// A parsed exposition: samples, and per family (HELP, TYPE) lines.
    #[derive(Debug, Default)]
    struct Exposition {
        samples: Vec<Sample>,
        types: HashMap<String, String>,
    }

    fn is_name(s: &str) -> bool {
        let mut b = s.bytes();
        matches!(b.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_' || c == b':')
            && b.all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b':')
    }

    /// Parse `{k="v",…}` starting after `{`; returns labels and the rest.
    fn parse_labels(mut s: &str) -> Result<(BTreeMap<String, String>, &str), String> {
        let mut out = BTreeMap::new();
        loop {
            if let Some(rest) = s.strip_prefix('}') {
                return Ok((out, rest));
            }
            let eq = s.find('=').ok_or("label without =")?;
            let key = &s[..eq];
            if !is_name(key) {
                return Err(format!("bad label name {key:?}"));
            }
            s = s[eq + 1..]
                .strip_prefix('"')
                .ok_or("label value not quoted")?;
            let mut val = String::new();
            let mut chars = s.char_indices();
            let end = loop {
                match chars.next().ok_or("unterminated label value")? {
                    (i, '"') => break i,
                    (_, '\\') => match chars.next().ok_or("dangling escape")?.1 {
                        '\\' => val.push('\\'),
                        '"' => val.push('"'),
                        'n' => val.push('\n'),
                        c => return Err(format!("bad escape \\{c}")),
                    },
                    (_, '\n') => return Err("raw newline in label value".into()),
                    (_, c) => val.push(c),
                }
            };
            if out.insert(key.to_string(), val).is_some() {
                return Err(format!("duplicate label {key}"));
            }
            s = &s[end + 1..];
            s = s.strip_prefix(',').unwrap_or(s);
        }
    }

    fn parse_value(v: &str) -> Result<f64, String> {
        match v {
            "NaN" => Ok(f64::NAN),
            "+Inf" => Ok(f64::INFINITY),
            "-Inf" => Ok(f64::NEG_INFINITY),
            _ => v.parse().map_err(|_| format!("bad value {v:?}")),
        }
    }

    /// The family a sample belongs to, given the declared TYPEs.
    fn family_of(name: &str, types: &HashMap<String, String>) -> Option<String> {
        if types.contains_key(name) {
            return Some(name.to_string());
        }
        for suffix in ["_sum", "_count"] {
            if let Some(base) = name.strip_suffix(suffix) {
                if types.get(base).map(String::as_str) == Some("summary") {
                    return Some(base.to_string());
                }
            }
        }
        None
    }

    /// Parse and validate: every line well formed, one HELP and one TYPE
    /// per family before its samples, a family's samples contiguous, no
    /// duplicate series.
    fn parse(text: &str) -> Result<Exposition, String> {
        let mut e = Exposition::default();
        let mut helps: HashSet<String> = HashSet::new();
        let mut done: HashSet<String> = HashSet::new();
        let mut current: Option<String> = None;
        let mut series: HashSet<(String, BTreeMap<String, String>)> = HashSet::new();
        if !text.is_empty() && !text.ends_with('\n') {
            return Err("no final newline".into());
        }
        for (n, line) in text.lines().enumerate() {
            let err = |m: String| format!("line {}: {m}: {line:?}", n + 1);
            if line.is_empty() {
                return Err(err("empty line".into()));
            }
            if let Some(c) = line.strip_prefix('#') {
                let mut w = c.trim_start().splitn(3, ' ');
                let (kw, name) = (w.next().unwrap_or(""), w.next().unwrap_or(""));
                let rest = w.next().unwrap_or("");
                if kw != "HELP" && kw != "TYPE" {
                    continue;
                }
                if !is_name(name) {
                    return Err(err("bad metric name".into()));
                }
                if done.contains(name) || current.as_deref() == Some(name) && kw == "HELP" {
                    return Err(err("family declared after its samples".into()));
                }
                if kw == "HELP" {
                    if !helps.insert(name.to_string()) {
                        return Err(err("second HELP".into()));
                    }
                } else {
                    if !["counter", "gauge", "summary", "histogram", "untyped"].contains(&rest) {
                        return Err(err("bad TYPE".into()));
                    }
                    if e.types.insert(name.to_string(), rest.to_string()).is_some() {
                        return Err(err("second TYPE".into()));
                    }
                }
                continue;
            }
            let name_end = line
                .find(['{', ' '])
                .ok_or_else(|| err("no value".into()))?;
            let name = &line[..name_end];
            if !is_name(name) {
                return Err(err("bad metric name".into()));
            }
            let (labels, rest) = match line[name_end..].strip_prefix('{') {
                Some(l) => parse_labels(l).map_err(err)?,
                None => (BTreeMap::new(), &line[name_end..]),
            };
            let rest = rest
                .strip_prefix(' ')
                .ok_or_else(|| err("no space".into()))?;
            let mut parts = rest.split(' ');
            let value = parse_value(parts.next().unwrap_or("")).map_err(err)?;
            if let Some(ts) = parts.next() {
                ts.parse::<i64>().map_err(|_| err("bad timestamp".into()))?;
            }
            if parts.next().is_some() {
                return Err(err("trailing fields".into()));
            }
            let fam =
                family_of(name, &e.types).ok_or_else(|| err("no TYPE before sample".into()))?;
            if !helps.contains(&fam) {
                return Err(err("no HELP before sample".into()));
            }
            if current.as_deref() != Some(fam.as_str()) {
                if done.contains(&fam) {
                    return Err(err("family samples not contiguous".into()));
                }
                if let Some(c) = current.take() {
                    done.insert(c);
                }
                current = Some(fam.clone());
            }
            if e.types[&fam] == "summary" && name == fam && !labels.contains_key("quantile") {
                return Err(err("summary sample without quantile".into()));
            }
            if !series.insert((name.to_string(), labels.clone())) {
                return Err(err("duplicate series".into()));
            }
            e.samples.push(Sample {
                name: name.to_string(),
                labels,
                value,
            });
        }
        Ok(e)
    }

    fn find<'a>(e: &'a Exposition, name: &str, want: &[(&str, &str)]) -> Vec<&'a Sample> {
        e.samples
            .iter()
            .filter(|s| {
                s.name == name
                    && want
                        .iter()
                        .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .collect()
    }

    fn one(e: &Exposition, name: &str, want: &[(&str, &str)]) -> f64 {
        let v = find(e, name, want);
        assert_eq!(v.len(), 1, "{name} {want:?}: {v:?}");
        v[0].value
    }

    fn summary_of(seed: u64, count: u64) -> HistSummary {
        HistSummary {
            count,
            min: seed,
            max: seed * 100,
            mean: seed as f64 * 3.5,
            p50: seed * 2,
            p90: seed * 5,
            p99: seed * 20,
            p999: seed * 50,
        }
    }

    fn queue(index: usize, base: u64) -> QueueReport {
        // Distinct values in every field.
        let c = QueueCounters {
            requests: base + 1,
            reads: base + 2,
            writes: base + 3,
            flushes: base + 4,
            get_ids: base + 5,
            discards: base + 6,
            write_zeroes: base + 7,
            other: base + 8,
            bytes_read: base * 4096 + 9,
            bytes_written: base * 4096 + 10,
            status_ioerr: base + 11,
            status_unsupp: base + 12,
            dropped: base + 13,
            ring_errors: base + 14,
            kicks: base + 15,
            wakeups: base + 16,
            empty_wakeups: base + 17,
            notifications: base + 18,
            notifications_suppressed: base + 19,
            ..QueueCounters::default()
        };
        // Through QueueStats, so fields added to QueueReport get defaults.
        let mut r = QueueStats::default().report(index, None);
        r.counters = c;
        r.requests_per_wakeup = summary_of(1, 10);
        r.requests_per_kick = summary_of(2, 10);
        r.kicks_per_wakeup = summary_of(3, 10);
        r.latency_read_ns = summary_of(100_000 + base, 1000);
        r.latency_write_ns = summary_of(200_000, 500);
        r.latency_other_ns = HistSummary::default();
        r.inter_arrival_ns = summary_of(5_000, 999);
        r.inflight_at_pop = summary_of(4, 999);
        r.worker_cpu = (index == 0).then_some(ThreadCpu {
            user_s: 1.25,
            sys_s: 0.5,
        });
        r
    }

    fn disk(socket: &str, queues: usize) -> DiskReport {
        let config =
            DiskArgs::parse_for_test(&["--socket", socket, "--disk", "mem", "--size", "1G"])
                .to_configs()
                .unwrap()
                .remove(0);
        DiskReport {
            config: Some(config),
            queues: (0..queues)
                .map(|q| queue(q, 1000 * (q as u64 + 1)))
                .collect(),
            tag_pools: Vec::new(),
            connections: 3,
            connected: true,
            connections_at_start: None,
        }
    }

    fn document() -> StatsDocument {
        let mut doc = StatsDocument::new(vec![
            disk("/tmp/a.sock", 2),
            disk("/tmp/we\"ird\\dir/b\nc.sock", 1),
        ]);
        doc.disks[1].connected = false;
        doc.daemon = Some(crate::stats::daemon::DaemonIdentity {
            pid: 7,
            started_unix_ns: 1_700_000_000_500_000_000,
            instance: "00112233445566778899aabbccddeeff".into(),
        });
        doc
    }

    #[test]
    fn metrics_render_parses_and_declares_every_family_once() {
        let doc = document();
        let text = render(&doc);
        let e = parse(&text).unwrap_or_else(|m| panic!("{m}\n{text}"));
        // 3 queues * (19 counters + 6 summary families' series...) at least.
        assert!(e.samples.len() > 100, "{}", e.samples.len());
        // Every declared family has samples here.
        for fam in e.types.keys() {
            assert!(
                e.samples
                    .iter()
                    .any(|s| family_of(&s.name, &e.types).as_deref() == Some(fam)),
                "no samples for {fam}"
            );
        }
        // Deterministic.
        assert_eq!(text, render(&doc));
        assert_eq!(e.types["blklab_requests_total"], "counter");
        assert_eq!(e.types["blklab_latency_seconds"], "summary");
        assert_eq!(e.types["blklab_info"], "gauge");
        assert_eq!(e.types["blklab_disk_info"], "gauge");
    }

    #[test]
    fn metrics_counters_equal_document() {
        let doc = document();
        let e = parse(&render(&doc)).unwrap();
        let fields = counter_fields(&QueueCounters::default());
        let names: Vec<&str> = fields.iter().map(|(k, _)| k.as_str()).collect();
        for f in [
            "requests",
            "reads",
            "writes",
            "flushes",
            "get_ids",
            "discards",
            "write_zeroes",
            "other",
            "bytes_read",
            "bytes_written",
            "status_ioerr",
            "status_unsupp",
            "dropped",
            "ring_errors",
            "kicks",
            "wakeups",
            "empty_wakeups",
            "notifications",
            "notifications_suppressed",
        ] {
            assert!(names.contains(&f), "{f} missing from {names:?}");
        }
        for d in &doc.disks {
            let sock = d.socket();
            for q in &d.queues {
                let qi = q.index.to_string();
                for (k, v) in counter_fields(&q.counters) {
                    let got = one(
                        &e,
                        &format!("blklab_{k}_total"),
                        &[("disk", &sock), ("queue", &qi)],
                    );
                    assert_eq!(got, v as f64, "{k} of {sock:?} queue {qi}");
                }
            }
        }
        // A known value, spelled out.
        let r = one(
            &e,
            "blklab_requests_total",
            &[("disk", "/tmp/a.sock"), ("queue", "1")],
        );
        assert_eq!(r, doc.disks[0].queues[1].counters.requests as f64);
        assert!(render(&doc).contains("blklab_requests_total{disk=\"/tmp/a.sock\",queue=\"0\"} "));
        // Worker CPU only where present.
        let cpu = find(&e, "blklab_worker_cpu_seconds_total", &[]);
        assert_eq!(cpu.len(), 4, "two queue-0 workers, user and sys each");
        assert_eq!(
            one(
                &e,
                "blklab_worker_cpu_seconds_total",
                &[("disk", "/tmp/a.sock"), ("queue", "0"), ("mode", "user")]
            ),
            1.25
        );
    }

    #[test]
    fn metrics_summaries_in_seconds() {
        let doc = document();
        let e = parse(&render(&doc)).unwrap();
        let q = &doc.disks[0].queues[1];
        let l = |op: &str, quantile: &str| {
            one(
                &e,
                "blklab_latency_seconds",
                &[
                    ("disk", "/tmp/a.sock"),
                    ("queue", "1"),
                    ("op", op),
                    ("quantile", quantile),
                ],
            )
        };
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * b.abs().max(1.0);
        let h = q.latency_read_ns;
        assert!(close(l("read", "0.5"), h.p50 as f64 / 1e9));
        assert!(close(l("read", "0.9"), h.p90 as f64 / 1e9));
        assert!(close(l("read", "0.99"), h.p99 as f64 / 1e9));
        assert!(close(l("read", "0.999"), h.p999 as f64 / 1e9));
        assert!(l("read", "0.5") < 0.01, "seconds, not ns");
        // 5050000 ns prints as exactly 0.00505 (no 0.005050000000000001).
        assert!(render(&doc).contains("op=\"read\",quantile=\"0.999\"} 0.00505\n"));
        let base = [("disk", "/tmp/a.sock"), ("queue", "1"), ("op", "read")];
        assert_eq!(one(&e, "blklab_latency_seconds_count", &base), 1000.0);
        assert!(close(
            one(&e, "blklab_latency_seconds_sum", &base),
            h.mean * 1000.0 / 1e9
        ));
        // Empty histogram: NaN quantiles, zero count and sum.
        assert!(l("other", "0.5").is_nan());
        let other = [("disk", "/tmp/a.sock"), ("queue", "1"), ("op", "other")];
        assert_eq!(one(&e, "blklab_latency_seconds_count", &other), 0.0);
        assert_eq!(one(&e, "blklab_latency_seconds_sum", &other), 0.0);
        // Inter-arrival in seconds; counts unscaled.
        let qa = [("disk", "/tmp/a.sock"), ("queue", "1")];
        let ia: Vec<_> = find(&e, "blklab_inter_arrival_seconds", &qa);
        assert_eq!(ia.len(), 4);
        assert!(ia.iter().all(|s| s.value < 1e-3));
        let mut kq = qa.to_vec();
        kq.push(("quantile", "0.99"));
        assert_eq!(
            one(&e, "blklab_requests_per_kick", &kq),
            q.requests_per_kick.p99 as f64
        );
        for fam in [
            "blklab_requests_per_wakeup",
            "blklab_kicks_per_wakeup",
            "blklab_inflight_at_pop",
        ] {
            assert_eq!(find(&e, fam, &qa).len(), 4, "{fam}");
        }
        for (fam, h) in [
            ("blklab_requests_per_wakeup", q.requests_per_wakeup),
            ("blklab_kicks_per_wakeup", q.kicks_per_wakeup),
            ("blklab_inflight_at_pop", q.inflight_at_pop),
        ] {
            assert_eq!(one(&e, &format!("{fam}_count"), &qa), h.count as f64);
            assert!(close(
                one(&e, &format!("{fam}_sum"), &qa),
                h.mean * h.count as f64
            ));
        }
    }

    #[test]
    fn metrics_label_escaping_and_info() {
        let doc = document();
        let text = render(&doc);
        assert!(
            text.contains(r#"disk="/tmp/we\"ird\\dir/b\nc.sock""#),
            "{text}"
        );
        let e = parse(&text).unwrap();
        let weird = "/tmp/we\"ird\\dir/b\nc.sock";
        assert!(
            one(
                &e,
                "blklab_requests_total",
                &[("disk", weird), ("queue", "0")]
            ) > 0.0
        );
        assert_eq!(
            one(
                &e,
                "blklab_disk_info",
                &[
                    ("disk", weird),
                    ("storage", "mem"),
                    ("size_bytes", "1073741824"),
                    ("num_queues", "1"),
                    ("queue_size", "256"),
                ]
            ),
            1.0
        );
        assert_eq!(
            one(
                &e,
                "blklab_info",
                &[
                    ("version", &doc.blklab_version),
                    ("git_commit", &doc.git_commit)
                ]
            ),
            1.0
        );
    }

    #[test]
    fn metrics_name_the_daemon_and_each_connection() {
        let doc = document();
        let e = parse(&render(&doc)).unwrap();
        assert_eq!(e.types["blklab_start_time_seconds"], "gauge");
        assert_eq!(
            one(
                &e,
                "blklab_start_time_seconds",
                &[
                    ("instance", "00112233445566778899aabbccddeeff"),
                    ("pid", "7")
                ]
            ),
            1_700_000_000.5
        );
        assert_eq!(e.types["blklab_disk_connections_total"], "counter");
        assert_eq!(
            one(
                &e,
                "blklab_disk_connections_total",
                &[("disk", "/tmp/a.sock")]
            ),
            3.0
        );
        assert_eq!(
            one(&e, "blklab_disk_connected", &[("disk", "/tmp/a.sock")]),
            1.0
        );
        let weird = "/tmp/we\"ird\\dir/b\nc.sock";
        assert_eq!(one(&e, "blklab_disk_connected", &[("disk", weird)]), 0.0);
    }

    #[test]
    fn metrics_empty_document_is_valid() {
        let text = render(&StatsDocument::new(Vec::new()));
        let e = parse(&text).unwrap();
        assert_eq!(e.samples.len(), 1, "only blklab_info");
    }

    #[test]
    fn metrics_parser_rejects_bad_text() {
        assert!(parse("x 1\n").is_err(), "no TYPE");
        assert!(parse("# HELP x h\n# TYPE x gauge\nx{a=\"b} 1\n").is_err());
        assert!(parse("# HELP x h\n# TYPE x gauge\n# TYPE x gauge\nx 1\n").is_err());
        assert!(parse("# HELP x h\n# TYPE x gauge\nx one\n").is_err());
        assert!(parse("# HELP x h\n# TYPE x gauge\nx 1\n").is_ok());
    }
}
