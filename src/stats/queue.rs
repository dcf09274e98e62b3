//! Per-queue statistics: exact counters and log-bucket histograms, owned by
//! each queue's worker thread (behind a per-queue lock that only the worker
//! and an occasional reader take), and the JSON documents built from them.
//!
//! The stats document ([`StatsDocument`], schema [`STATS_SCHEMA`]) is a
//! contract: the control socket answers it, `--stats-out` writes it, `blklab
//! run` embeds it in every record as `backend`, and `blklab stats` and the
//! report read it back through these types. Fields are added without a new
//! major version (readers ignore what they do not know); everything that
//! old recordings may lack reads as its default.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize};

use crate::device::config::DiskConfig;
use crate::stats::histogram::{Hist, HistSummary, RunHist};
use crate::virtio_blk::request::Op;

/// Largest value the count histograms (requests per wake-up, …) resolve.
const COUNT_MAX: u64 = 1 << 16;

/// Exact event counts of one queue.
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub struct QueueCounters {
    pub requests: u64,
    pub reads: u64,
    pub writes: u64,
    pub flushes: u64,
    pub get_ids: u64,
    pub discards: u64,
    pub write_zeroes: u64,
    pub other: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub status_ioerr: u64,
    pub status_unsupp: u64,
    /// Chains returned with used length 0 because no status could be written.
    pub dropped: u64,
    /// Times the avail ring was unusable (index jumped past the queue size,
    /// ring not readable).
    pub ring_errors: u64,
    /// Guest kicks, exactly (the kick eventfd's counter, not wake-ups).
    pub kicks: u64,
    /// Wake-ups of the worker for this queue.
    pub wakeups: u64,
    /// Wake-ups that found no request.
    pub empty_wakeups: u64,
    /// Used-buffer notifications sent to the guest.
    pub notifications: u64,
    /// With EVENT_IDX: completions put on the used ring without a
    /// notification (the driver's used_event did not ask for one). The
    /// check runs after every used entry, so `notifications +
    /// notifications_suppressed` is the number of used entries. Without
    /// EVENT_IDX each pass over the ring signals once and nothing is
    /// suppressed.
    pub notifications_suppressed: u64,
    /// Times the queue found no free command slot and stopped popping.
    pub tag_waits: u64,
    /// Injected faults: IOERR by --fail-every, by --fail-range, and
    /// requests held by --stall-every.
    pub injected_fail_every: u64,
    pub injected_fail_range: u64,
    pub injected_stalls: u64,
    /// Nanoseconds the worker spun waiting for completion deadlines
    /// (--latency-spin).
    pub latency_spin_ns: u64,
    /// Poll mode (--poll): nanoseconds the worker polled this ring while
    /// it was idle, spins that found a request (hits) and spins that ran
    /// out and re-enabled guest notifications (misses).
    pub poll_spin_ns: u64,
    pub poll_hits: u64,
    pub poll_misses: u64,
}

impl QueueCounters {
    fn delta(&self, e: &QueueCounters) -> QueueCounters {
        QueueCounters {
            requests: self.requests - e.requests,
            reads: self.reads - e.reads,
            writes: self.writes - e.writes,
            flushes: self.flushes - e.flushes,
            get_ids: self.get_ids - e.get_ids,
            discards: self.discards - e.discards,
            write_zeroes: self.write_zeroes - e.write_zeroes,
            other: self.other - e.other,
            bytes_read: self.bytes_read - e.bytes_read,
            bytes_written: self.bytes_written - e.bytes_written,
            status_ioerr: self.status_ioerr - e.status_ioerr,
            status_unsupp: self.status_unsupp - e.status_unsupp,
            dropped: self.dropped - e.dropped,
            ring_errors: self.ring_errors - e.ring_errors,
            kicks: self.kicks - e.kicks,
            wakeups: self.wakeups - e.wakeups,
            empty_wakeups: self.empty_wakeups - e.empty_wakeups,
            notifications: self.notifications - e.notifications,
            notifications_suppressed: self.notifications_suppressed - e.notifications_suppressed,
            tag_waits: self.tag_waits - e.tag_waits,
            injected_fail_every: self.injected_fail_every - e.injected_fail_every,
            injected_fail_range: self.injected_fail_range - e.injected_fail_range,
            injected_stalls: self.injected_stalls - e.injected_stalls,
            latency_spin_ns: self.latency_spin_ns - e.latency_spin_ns,
            poll_spin_ns: self.poll_spin_ns - e.poll_spin_ns,
            poll_hits: self.poll_hits - e.poll_hits,
            poll_misses: self.poll_misses - e.poll_misses,
        }
    }
}

/// The latency class of `op`: 0 read, 1 write, 2 everything else (the
/// reports' latency_read/write/other).
#[inline]
fn class(op: Op) -> usize {
    match op {
        Op::Read => 0,
        Op::Write => 1,
        _ => 2,
    }
}

/// Everything one queue records.
#[derive(Debug, Clone)]
pub struct QueueStats {
    pub counters: QueueCounters,
    /// Requests popped per wake-up.
    pub requests_per_wakeup: RunHist,
    /// Requests popped per kick, per wake-up that had kicks (rounded).
    pub requests_per_kick: RunHist,
    /// Kicks per wake-up.
    pub kicks_per_wakeup: RunHist,
    /// Service time, pop to used, ns, by class (read, write, other;
    /// [`class`]), of requests not in `at_once`.
    latency: [Hist; 3],
    /// Service times of requests served at once whose service the next
    /// pop ended: each is also that pop's inter-arrival time, so it is
    /// recorded once, here, and reported in both (the merge is exact).
    at_once: [Hist; 3],
    /// Time between consecutive pops, ns, of pops not in `at_once`.
    inter_arrival: Hist,
    /// Requests in service when a request is popped.
    pub inflight_at_pop: RunHist,
    /// How long the queue waited for a command slot, ns.
    pub tag_wait: Hist,
    /// Kernel thread id of the worker serving this queue (for its CPU time).
    pub worker_tid: Option<i32>,
    /// The worker's CPU time when these statistics started (reset or
    /// snapshot baseline).
    cpu_baseline: Option<ThreadCpu>,
    /// False with --no-stats: counters only, no histograms.
    pub histograms: bool,
    /// When the last request was popped, ns ([`crate::util::clock::Clock`]);
    /// 0: none yet (the clock counts from boot).
    last_pop: u64,
}

impl Default for QueueStats {
    fn default() -> Self {
        QueueStats {
            counters: QueueCounters::default(),
            requests_per_wakeup: RunHist::new(Hist::new_count(COUNT_MAX)),
            requests_per_kick: RunHist::new(Hist::new_count(COUNT_MAX)),
            kicks_per_wakeup: RunHist::new(Hist::new_count(COUNT_MAX)),
            latency: std::array::from_fn(|_| Hist::new_latency()),
            at_once: std::array::from_fn(|_| Hist::new_latency()),
            inter_arrival: Hist::new_latency(),
            inflight_at_pop: RunHist::new(Hist::new_count(COUNT_MAX)),
            tag_wait: Hist::new_latency(),
            worker_tid: None,
            cpu_baseline: None,
            histograms: true,
            last_pop: 0,
        }
    }
}

impl QueueStats {
    /// A request was popped at `now_ns` (the queue's clock) with
    /// `inflight` others in service. `served_before`: the kind of the
    /// request popped just before it when that one was served at once (no
    /// emulated latency), whose service time ends at this pop: it is the
    /// time since that pop, the same value as this inter-arrival time, so
    /// its bucket is computed once for both histograms.
    ///
    /// The recording bodies here (`record_*`) are never inlined, so that
    /// `blklab bench --instructions` counts the statistics' own
    /// instructions per request exactly, as functions of their own.
    #[inline]
    pub fn popped(&mut self, now_ns: u64, inflight: u64, served_before: Option<Op>) {
        if self.histograms {
            self.record_pop(now_ns, inflight, served_before);
        }
    }

    #[inline(never)]
    fn record_pop(&mut self, now_ns: u64, inflight: u64, served_before: Option<Op>) {
        let prev = std::mem::replace(&mut self.last_pop, now_ns);
        if prev != 0 {
            let b = Hist::latency_bucket(now_ns.saturating_sub(prev));
            match served_before {
                Some(op) => self.at_once[class(op)].add(b),
                None => self.inter_arrival.add(b),
            }
        }
        // In-flight depths come in runs (always 0 without emulated
        // latency).
        self.inflight_at_pop.record(inflight);
    }

    /// Every service time of class `c` (see `at_once`).
    fn latency_of(&self, c: usize) -> Hist {
        let mut h = self.latency[c].clone();
        h.merge(&self.at_once[c]);
        h
    }

    /// Every inter-arrival time (see `at_once`).
    fn inter_arrivals(&self) -> Hist {
        let mut h = self.inter_arrival.clone();
        for a in &self.at_once {
            h.merge(a);
        }
        h
    }

    /// A request of kind `op` completed after `service_ns`.
    #[inline]
    pub fn completed(&mut self, op: Op, service_ns: u64) {
        if self.histograms {
            self.record_completion(op, service_ns);
        }
    }

    #[inline(never)]
    fn record_completion(&mut self, op: Op, service_ns: u64) {
        // The latency layout's constant bucket arithmetic (cheaper than
        // the general `record`).
        self.latency[class(op)].add(Hist::latency_bucket(service_ns));
    }

    /// The queue got a slot after waiting `waited`.
    pub(crate) fn tag_waited(&mut self, waited: Duration) {
        if !self.histograms {
            return;
        }
        self.tag_wait.record(waited.as_nanos() as u64);
    }

    /// A wake-up that found `requests` requests after `kicks` kicks.
    pub fn wakeup(&mut self, kicks: u64, requests: u64) {
        let c = &mut self.counters;
        c.wakeups += 1;
        c.kicks += kicks;
        if requests == 0 {
            c.empty_wakeups += 1;
        }
        if self.histograms {
            self.record_wakeup(kicks, requests);
        }
    }

    #[inline(never)]
    fn record_wakeup(&mut self, kicks: u64, requests: u64) {
        self.requests_per_wakeup.record(requests);
        self.kicks_per_wakeup.record(kicks);
        if let Some(per_kick) = (requests + kicks / 2).checked_div(kicks) {
            self.requests_per_kick.record(per_kick);
        }
    }

    /// Forget everything counted so far.
    pub(crate) fn reset(&mut self) {
        let tid = self.worker_tid;
        *self = QueueStats {
            worker_tid: tid,
            histograms: self.histograms,
            cpu_baseline: tid.and_then(thread_cpu),
            ..QueueStats::default()
        };
    }

    /// Record which thread serves this queue (first wake-up of a worker).
    pub(crate) fn set_worker(&mut self, tid: i32) {
        if self.worker_tid != Some(tid) {
            self.worker_tid = Some(tid);
            self.cpu_baseline = thread_cpu(tid);
        }
    }

    /// A copy to diff later reports against (see [`QueueStats::report`]),
    /// with the worker's CPU time as of now.
    pub(crate) fn baseline(&self) -> QueueStats {
        let mut b = self.clone();
        b.cpu_baseline = self.worker_tid.and_then(thread_cpu);
        b
    }

    /// The document form; `earlier` makes it a delta.
    pub fn report(&self, index: usize, earlier: Option<&QueueStats>) -> QueueReport {
        let h = |now: &Hist, then: Option<&Hist>| match then {
            Some(t) => now.delta(t).summary(),
            None => now.summary(),
        };
        let r = |now: &RunHist, then: Option<&RunHist>| {
            h(&now.hist(), then.map(RunHist::hist).as_ref())
        };
        let lat = |c: usize| {
            h(
                &self.latency_of(c),
                earlier.map(|e| e.latency_of(c)).as_ref(),
            )
        };
        QueueReport {
            index,
            counters: match earlier {
                Some(e) => self.counters.delta(&e.counters),
                None => self.counters.clone(),
            },
            requests_per_wakeup: r(
                &self.requests_per_wakeup,
                earlier.map(|e| &e.requests_per_wakeup),
            ),
            requests_per_kick: r(
                &self.requests_per_kick,
                earlier.map(|e| &e.requests_per_kick),
            ),
            requests_per_kick_values: match earlier {
                Some(e) => self
                    .requests_per_kick
                    .hist()
                    .delta(&e.requests_per_kick.hist())
                    .values(),
                None => self.requests_per_kick.hist().values(),
            },
            kicks_per_wakeup: r(&self.kicks_per_wakeup, earlier.map(|e| &e.kicks_per_wakeup)),
            latency_read_ns: lat(0),
            latency_write_ns: lat(1),
            latency_other_ns: lat(2),
            inter_arrival_ns: h(
                &self.inter_arrivals(),
                earlier.map(QueueStats::inter_arrivals).as_ref(),
            ),
            inflight_at_pop: r(&self.inflight_at_pop, earlier.map(|e| &e.inflight_at_pop)),
            tag_wait_ns: h(&self.tag_wait, earlier.map(|e| &e.tag_wait)),
            worker_cpu: self.worker_cpu_since(earlier),
        }
    }

    /// The worker's CPU seconds since the baseline (`earlier`'s, else our own).
    fn worker_cpu_since(&self, earlier: Option<&QueueStats>) -> Option<ThreadCpu> {
        let now = thread_cpu(self.worker_tid?)?;
        let base = match earlier {
            Some(e) => e.cpu_baseline,
            None => self.cpu_baseline,
        }
        .unwrap_or(ThreadCpu {
            user_s: 0.0,
            sys_s: 0.0,
        });
        Some(ThreadCpu {
            user_s: (now.user_s - base.user_s).max(0.0),
            sys_s: (now.sys_s - base.sys_s).max(0.0),
        })
    }
}

/// User and system CPU seconds of one thread.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct ThreadCpu {
    pub user_s: f64,
    pub sys_s: f64,
}

/// CPU time of thread `tid` of this process, from /proc (no cost to the
/// thread itself).
pub(crate) fn thread_cpu(tid: i32) -> Option<ThreadCpu> {
    let st = crate::util::procfs::thread(None, tid)?;
    Some(ThreadCpu {
        user_s: st.user_s(),
        sys_s: st.sys_s(),
    })
}

/// The kernel thread id of the calling thread.
pub(crate) fn current_tid() -> i32 {
    // SAFETY: gettid has no memory effects.
    unsafe { libc::gettid() }
}

/// One queue in a stats document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct QueueReport {
    /// The virtqueue's index in its disk.
    #[serde(default)]
    pub index: usize,
    pub counters: QueueCounters,
    /// Requests popped per wake-up.
    #[serde(default)]
    pub requests_per_wakeup: HistSummary,
    /// Requests popped per kick, per wake-up that had kicks (rounded).
    #[serde(default)]
    pub requests_per_kick: HistSummary,
    /// The requests-per-kick distribution: (requests, kicks) pairs.
    #[serde(default)]
    pub requests_per_kick_values: Vec<(u64, u64)>,
    #[serde(default)]
    pub kicks_per_wakeup: HistSummary,
    /// Service time, pop to used, ns, by op.
    #[serde(default)]
    pub latency_read_ns: HistSummary,
    #[serde(default)]
    pub latency_write_ns: HistSummary,
    #[serde(default)]
    pub latency_other_ns: HistSummary,
    /// Time between consecutive pops, ns.
    #[serde(default)]
    pub inter_arrival_ns: HistSummary,
    /// Requests in service when a request is popped.
    #[serde(default)]
    pub inflight_at_pop: HistSummary,
    /// How long the queue waited for a command slot, ns.
    #[serde(default)]
    pub tag_wait_ns: HistSummary,
    /// The worker thread's CPU time over the document's span (null when
    /// the queue has not been served yet).
    #[serde(default)]
    pub worker_cpu: Option<ThreadCpu>,
}

/// The git commit blklab was built from (`unknown` outside a checkout).
pub(crate) const GIT_COMMIT: &str = env!("BLKLAB_GIT_COMMIT");

/// One disk in a stats document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct DiskReport {
    /// The disk's complete configuration. Always written; absent only
    /// from trimmed recordings (tests/fixtures/runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<DiskConfig>,
    pub queues: Vec<QueueReport>,
    /// The command-slot pools the disk's queues draw from (cumulative).
    #[serde(default)]
    pub tag_pools: Vec<crate::device::tags::PoolStats>,
}

impl DiskReport {
    /// The disk's socket path as text (`?` when the document has no
    /// configuration).
    pub(crate) fn socket(&self) -> String {
        self.config
            .as_ref()
            .map_or_else(|| "?".to_string(), |c| c.socket.display().to_string())
    }
}

/// The schema version of [`StatsDocument`].
pub const STATS_SCHEMA: &str = "blklab-stats/1";

fn stats_schema() -> String {
    STATS_SCHEMA.to_string()
}

fn stats_schema_pattern() -> String {
    crate::util::schema::pattern(STATS_SCHEMA)
}

fn check_stats_schema<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    crate::util::schema::deserialize(d, STATS_SCHEMA)
}

/// A complete stats document: what, when, from which build.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "blklab stats document")]
pub struct StatsDocument {
    /// [`STATS_SCHEMA`]. Documents written before it existed have none and
    /// read as version 1; another major version does not read.
    #[serde(default = "stats_schema", deserialize_with = "check_stats_schema")]
    #[schemars(pattern(stats_schema_pattern()))]
    pub schema: String,
    #[serde(default)]
    pub blklab_version: String,
    /// The git commit blklab was built from.
    #[serde(default)]
    pub git_commit: String,
    /// Wall-clock time of the document, ns since the Unix epoch.
    #[serde(default)]
    pub time_unix_ns: u128,
    /// For snapshots: the label and the seconds the delta covers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval_s: Option<f64>,
    pub disks: Vec<DiskReport>,
}

impl StatsDocument {
    pub fn new(disks: Vec<DiskReport>) -> StatsDocument {
        StatsDocument {
            schema: stats_schema(),
            blklab_version: env!("CARGO_PKG_VERSION").to_string(),
            git_commit: GIT_COMMIT.to_string(),
            time_unix_ns: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0),
            label: None,
            interval_s: None,
            disks,
        }
    }

    /// Every queue of every disk.
    pub(crate) fn queues(&self) -> impl Iterator<Item = &QueueReport> {
        self.disks.iter().flat_map(|d| d.queues.iter())
    }

    /// The sum of one counter over every queue of every disk.
    pub fn sum(&self, counter: impl Fn(&QueueCounters) -> u64) -> u64 {
        self.queues().map(|q| counter(&q.counters)).sum()
    }

    /// Read a document from JSON text: a document of another major schema
    /// version is an error naming both versions.
    pub fn from_json(text: &str) -> Result<StatsDocument, serde_json::Error> {
        serde_json::from_str(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wakeups_and_kicks() {
        let mut s = QueueStats::default();
        // Plugged guest: 16 requests, one kick. Unplugged: one per kick.
        s.wakeup(1, 16);
        for _ in 0..4 {
            s.wakeup(1, 1);
        }
        s.wakeup(0, 0);
        let r = s.report(0, None);
        assert_eq!(r.counters.kicks, 5);
        assert_eq!(r.counters.wakeups, 6);
        assert_eq!(r.counters.empty_wakeups, 1);
        assert_eq!(r.requests_per_kick.count, 5);
        assert_eq!(r.requests_per_kick.max, 16);
        assert_eq!(r.requests_per_kick.p50, 1);
        let kicks: u64 = r.requests_per_kick_values.iter().map(|(_, n)| n).sum();
        assert_eq!(kicks, 5);
        assert_eq!(r.requests_per_kick_values.last(), Some(&(16, 1)));
        assert_eq!(r.kicks_per_wakeup.count, 6);
    }

    #[test]
    fn delta_report() {
        let mut s = QueueStats::default();
        s.counters.requests = 10;
        s.completed(Op::Read, 100_000);
        let earlier = s.clone();
        s.counters.requests = 25;
        s.completed(Op::Read, 300_000);
        s.completed(Op::Write, 50_000);
        let d = s.report(1, Some(&earlier));
        assert_eq!(d.index, 1);
        assert_eq!(d.counters.requests, 15);
        assert_eq!(d.latency_read_ns.count, 1);
        // Latency histograms keep 2 significant digits (within 1 %).
        assert!((d.latency_read_ns.p50 as f64 - 300_000.0).abs() < 3_000.0);
        assert_eq!(d.latency_write_ns.count, 1);
        s.reset();
        assert_eq!(s.report(0, None).counters.requests, 0);
    }

    #[test]
    fn inter_arrival() {
        let mut s = QueueStats::default();
        let t = 1_000_000_000u64;
        s.popped(t, 0, None);
        s.popped(t + 10_000, 1, None);
        s.popped(t + 30_000, 2, Some(Op::Write));
        s.popped(t + 30_100, 2, Some(Op::Read));
        s.popped(t + 30_200, 2, None);
        let r = s.report(0, None);
        assert_eq!(r.inter_arrival_ns.count, 4);
        assert!(r.inter_arrival_ns.max.abs_diff(20_000) < 200);
        assert_eq!(r.inflight_at_pop.count, 5);
        assert_eq!(r.inflight_at_pop.max, 2);
        assert_eq!(r.inflight_at_pop.p50, 2);
        // The request served before a pop completes at it.
        assert_eq!(r.latency_write_ns.count, 1);
        assert!(r.latency_write_ns.max.abs_diff(20_000) < 200);
        assert_eq!(r.latency_read_ns.count, 1);
        assert_eq!(r.latency_read_ns.max, 100);
        // A snapshot taken mid-run counts the run up to then only.
        let snap = s.baseline();
        s.popped(t + 30_300, 2, None);
        s.popped(t + 30_400, 0, None);
        let d = s.report(0, Some(&snap));
        assert_eq!(d.inflight_at_pop.count, 2);
        assert_eq!(d.inflight_at_pop.min, 0);
        assert_eq!(d.inflight_at_pop.max, 2);
    }

    #[test]
    fn documents_read_back_and_check_their_schema() {
        let mut s = QueueStats::default();
        s.wakeup(1, 3);
        s.completed(Op::Read, 20_000);
        let mut doc = StatsDocument::new(vec![DiskReport {
            config: None,
            queues: vec![s.report(0, None)],
            tag_pools: Vec::new(),
        }]);
        doc.label = Some("x".into());
        let text = serde_json::to_string(&doc).unwrap();
        assert!(text.starts_with(r#"{"schema":"blklab-stats/1","#), "{text}");
        assert_eq!(StatsDocument::from_json(&text).unwrap(), doc);
        // Before the schema field: version 1; unknown fields are ignored.
        let old = r#"{"disks":[{"queues":[{"counters":{"kicks":2}}]}],"new":1}"#;
        let d = StatsDocument::from_json(old).unwrap();
        assert_eq!(d.schema, STATS_SCHEMA);
        assert_eq!(d.sum(|c| c.kicks), 2);
        let e = StatsDocument::from_json(r#"{"schema":"blklab-stats/2","disks":[]}"#)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"blklab-stats/2\"") && e.contains("reads \"blklab-stats/1\""),
            "{e}"
        );
    }

    #[test]
    fn own_thread_cpu() {
        let tid = current_tid();
        // Burn CPU until the kernel has charged this thread a tick (its
        // stat counts in clock ticks; an optimised loop of a fixed length
        // may finish inside one). black_box keeps the loop from being
        // folded away; the bound only stops a broken stat from hanging.
        let mut x = 0u64;
        let start = std::time::Instant::now();
        let c = loop {
            for i in 0..1_000_000u64 {
                x = std::hint::black_box(x.wrapping_add(i * i));
            }
            let c = thread_cpu(tid).expect("our own thread's stat");
            if c.user_s + c.sys_s > 0.0 || start.elapsed() > std::time::Duration::from_secs(60) {
                break c;
            }
        };
        assert!(
            c.user_s + c.sys_s > 0.0,
            "no CPU time charged after {:?}",
            start.elapsed()
        );
        let mut s = QueueStats::default();
        s.set_worker(tid);
        let base = s.baseline();
        for i in 0..20_000_000u64 {
            x = x.wrapping_add(i ^ x);
        }
        assert!(x != 1);
        let d = s.report(0, Some(&base)).worker_cpu.unwrap();
        let total = s.report(0, None).worker_cpu.unwrap();
        assert!(d.user_s + d.sys_s <= total.user_s + total.sys_s + 1e-9);
    }
}
