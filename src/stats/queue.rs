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
use crate::stats::daemon::DaemonIdentity;
use crate::stats::histogram::{Hist, HistSummary, RunHist, TickHist, TickScale};
use crate::util::clock::{Clock, MonotonicTicks, TickSource, TscTicks};
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
    /// Requests in service put on the used ring before their emulated
    /// completion time because their ring or the daemon stopped and the
    /// wait for them ran out (GET_VRING_BASE after a minute, a stop after
    /// `--drain-timeout` or a second signal).
    pub completed_early: u64,
    /// Nanoseconds the worker spun waiting for completion deadlines
    /// (--latency-spin).
    pub latency_spin_ns: u64,
    /// Poll mode (--poll): nanoseconds the worker polled this ring while
    /// it was idle, spins that found a request (hits) and spins that ran
    /// out and re-enabled guest notifications (misses).
    pub poll_spin_ns: u64,
    pub poll_hits: u64,
    pub poll_misses: u64,
    /// Adaptive polling (--poll=adaptive): waits for the guest after which
    /// the poll window grew, and after which it shrank.
    pub poll_window_grows: u64,
    pub poll_window_shrinks: u64,
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
            completed_early: self.completed_early - e.completed_early,
            latency_spin_ns: self.latency_spin_ns - e.latency_spin_ns,
            poll_spin_ns: self.poll_spin_ns - e.poll_spin_ns,
            poll_hits: self.poll_hits - e.poll_hits,
            poll_misses: self.poll_misses - e.poll_misses,
            poll_window_grows: self.poll_window_grows - e.poll_window_grows,
            poll_window_shrinks: self.poll_window_shrinks - e.poll_window_shrinks,
        }
    }
}

/// The latency class of `op`: 0 read, 1 write, 2 everything else (the
/// reports' latency_read/write/other): `Op`'s first two variants are
/// read and write (a test holds them there), so a compare and a move.
#[inline(always)]
fn class(op: Op) -> usize {
    (op as usize).min(2)
}

/// [`QueueStats::record_pop`] for the queue's clock source.
type PopFn = fn(&mut QueueStats, u64, Option<Op>) -> u64;
/// [`QueueStats::record_served`] for the queue's clock source.
type ServedFn = fn(&mut QueueStats, Op, u64);

/// Where a pop's inter-arrival time goes in [`QueueStats`]'s `at_pop`:
/// the kind of the request served at once just before it (whose service
/// time it also is), or [`INTER_ARRIVAL`]: the option's own byte (`None`
/// is 7), so no mapping at all on the hot path; the report merges the
/// kinds into classes.
#[inline(always)]
fn pop_slot(served_before: Option<Op>) -> usize {
    let v = match served_before {
        Some(op) => op as usize,
        None => INTER_ARRIVAL,
    };
    v & (POP_SLOTS - 1)
}

/// Every kind of request, in `Op`'s order (`at_pop`'s first slots).
const OPS: [Op; 7] = [
    Op::Read,
    Op::Write,
    Op::Flush,
    Op::GetId,
    Op::Discard,
    Op::WriteZeroes,
    Op::Other,
];

/// `at_pop`'s inter-arrival times that are no service time.
const INTER_ARRIVAL: usize = OPS.len();
/// `at_pop`'s slots.
const POP_SLOTS: usize = 8;

/// `last_pop` before the first pop: 2^63 ticks away from any reading
/// (the counter would take a century to get there), so the first pop's
/// "inter-arrival time" is never a fast-path duration and the rare path
/// knows it for what it is.
const NO_POP: u64 = 1 << 63;

/// Everything one queue records.
///
/// Times are recorded as raw clock ticks ([`Clock::ticks`]) and go to
/// nanosecond buckets with one multiply ([`TickHist`]); the reports are
/// in ns. Wake-ups come in runs of the same (kicks,
/// requests) pair (at QD1 every wake-up is (1, 1)): a run is only
/// counted, and goes into the three wake-up histograms when the pair
/// changes or a report reads them.
#[derive(Debug, Clone)]
pub struct QueueStats {
    pub counters: QueueCounters,
    /// The current run of wake-ups: its (kicks, requests) and its length
    /// (0: none yet); not yet in the three histograms below.
    wake_run: ((u64, u64), u64),
    /// Requests popped per wake-up.
    requests_per_wakeup: Hist,
    /// Requests popped per kick, per wake-up that had kicks (rounded).
    requests_per_kick: Hist,
    /// Kicks per wake-up.
    kicks_per_wakeup: Hist,
    /// Service time, pop to used, by class (read, write, other;
    /// [`class`]), of requests not in `at_pop`.
    latency: [TickHist; 3],
    /// Time between consecutive pops ([`pop_slot`]). By kind ([`OPS`]):
    /// those that ended the service of a request of that kind served at
    /// once just before: each is also that request's service time, so it
    /// is recorded once, here, and reported in both (the merge is exact).
    /// [`INTER_ARRIVAL`]: the others.
    at_pop: [TickHist; POP_SLOTS],
    /// Requests in service when a request is popped.
    pub(crate) inflight_at_pop: RunHist,
    /// How long the queue waited for a command slot, ns.
    tag_wait: Hist,
    /// Adaptive polling: the poll window each wait for the guest had, ns.
    poll_window: Hist,
    /// Adaptive polling: the poll window now, ns.
    poll_window_now_ns: u64,
    /// Kernel thread id of the worker serving this queue (for its CPU time).
    pub(crate) worker_tid: Option<i32>,
    /// The current worker's CPU time when it started serving this queue.
    worker_start: ThreadCpu,
    /// The CPU time of the queue's earlier workers (each connection has
    /// its own), each from its start to the end of its connection; `None`
    /// before the first connection ended.
    retired_cpu: Option<ThreadCpu>,
    /// The queue's worker CPU time ([`QueueStats::worker_cpu_total`]) when
    /// these statistics started (reset or snapshot baseline).
    cpu_baseline: Option<ThreadCpu>,
    /// False with --no-stats: counters only, no histograms.
    pub histograms: bool,
    /// When the last request was popped, in ticks of `clock`; [`NO_POP`]
    /// before the first.
    last_pop: u64,
    /// The clock of every time recorded here (its ticks).
    clock: Clock,
    /// `clock`'s ticks to the histograms' ns.
    scale: TickScale,
    /// The hot path's recording functions for `clock`'s source, chosen
    /// once so that a reading does not test it.
    pop_fn: PopFn,
    served_fn: ServedFn,
}

impl Default for QueueStats {
    fn default() -> Self {
        QueueStats::with_clock(*Clock::get())
    }
}

impl QueueStats {
    /// Statistics whose times are read from `clock`.
    pub(crate) fn with_clock(clock: Clock) -> QueueStats {
        let scale = TickScale::new(clock.ns_per_tick());
        let (pop_fn, served_fn): (PopFn, ServedFn) = if clock.is_tsc() {
            (
                Self::record_pop::<TscTicks>,
                Self::record_served::<TscTicks>,
            )
        } else {
            (
                Self::record_pop::<MonotonicTicks>,
                Self::record_served::<MonotonicTicks>,
            )
        };
        QueueStats {
            counters: QueueCounters::default(),
            wake_run: ((0, 0), 0),
            requests_per_wakeup: Hist::new_count(COUNT_MAX),
            requests_per_kick: Hist::new_count(COUNT_MAX),
            kicks_per_wakeup: Hist::new_count(COUNT_MAX),
            latency: Default::default(),
            at_pop: Default::default(),
            inflight_at_pop: RunHist::new(Hist::new_count(COUNT_MAX)),
            tag_wait: Hist::new_latency(),
            poll_window: Hist::new_latency(),
            poll_window_now_ns: 0,
            worker_tid: None,
            worker_start: ThreadCpu::default(),
            retired_cpu: None,
            cpu_baseline: None,
            histograms: true,
            last_pop: NO_POP,
            clock,
            scale,
            pop_fn,
            served_fn,
        }
    }

    /// A request is popped now with `inflight` others in service; returns
    /// the time, in ticks of the queue's clock (0 without histograms), for
    /// [`completed`](Self::completed) or [`served`](Self::served).
    /// `served_before`: the kind of the request popped just before it when
    /// that one was served at once (no emulated latency), whose service
    /// time ends at this pop: it is the time since that pop, the same
    /// value as this inter-arrival time, so it is recorded once for both
    /// histograms.
    ///
    /// The recording bodies here (`record_*`, `read_clock`) are never
    /// inlined, and read the clock themselves, so that `blklab bench
    /// --instructions` counts the statistics' own instructions per
    /// request exactly, as functions of their own; the call itself and
    /// the test of `histograms` (which `--no-stats` keeps too) are the
    /// caller's.
    #[inline]
    pub fn popped(&mut self, inflight: u64, served_before: Option<Op>) -> u64 {
        if self.histograms {
            (self.pop_fn)(self, inflight, served_before)
        } else {
            0
        }
    }

    /// [`popped`](Self::popped) on clock source `C`: what is not the fast
    /// path is in cold functions, tail-called, so the fast path needs no
    /// stack frame.
    #[inline(never)]
    fn record_pop<C: TickSource>(&mut self, inflight: u64, served_before: Option<Op>) -> u64 {
        self.pop_at(C::read(), inflight, served_before)
    }

    /// [`popped`](Self::popped) at `now` ticks; returns `now`.
    #[inline(always)]
    fn pop_at(&mut self, now: u64, inflight: u64, served_before: Option<Op>) -> u64 {
        let prev = std::mem::replace(&mut self.last_pop, now);
        let slot = pop_slot(served_before);
        if !self.at_pop[slot].record_fast(now.wrapping_sub(prev), &self.scale) {
            return self.pop_rare(slot, prev, inflight);
        }
        // In-flight depths come in runs (always 0 without emulated
        // latency).
        if !self.inflight_at_pop.record_same(inflight) {
            return self.inflight_changed(inflight);
        }
        now
    }

    /// The rest of [`pop_at`](Self::pop_at) for an inter-arrival time off
    /// the fast path, or none (the first pop). Returns the pop time (read
    /// back rather than passed through, which would keep the compiler
    /// from tail-calling this).
    #[cold]
    #[inline(never)]
    fn pop_rare(&mut self, slot: usize, prev: u64, inflight: u64) -> u64 {
        let now = self.last_pop;
        if prev != NO_POP {
            self.at_pop[slot].record_rare(now.wrapping_sub(prev), &self.scale);
        }
        self.inflight_at_pop.record(inflight);
        now
    }

    /// The rest of [`pop_at`](Self::pop_at) for an in-flight depth that
    /// starts a new run; returns the pop time.
    #[cold]
    #[inline(never)]
    fn inflight_changed(&mut self, inflight: u64) -> u64 {
        self.inflight_at_pop.next_run(inflight);
        self.last_pop
    }

    /// Every service time of class `c` (see `at_pop`).
    fn latency_of(&self, c: usize) -> Hist {
        let mut h = self.latency[c].hist(&self.scale);
        for (op, a) in OPS.iter().zip(&self.at_pop) {
            if class(*op) == c {
                h.merge(&a.hist(&self.scale));
            }
        }
        h
    }

    /// Every inter-arrival time (see `at_pop`).
    fn inter_arrivals(&self) -> Hist {
        let mut h = self.at_pop[INTER_ARRIVAL].hist(&self.scale);
        for a in &self.at_pop[..INTER_ARRIVAL] {
            h.merge(&a.hist(&self.scale));
        }
        h
    }

    /// The time now in ticks of the queue's clock, to complete several
    /// requests at one time ([`completed`](Self::completed)); 0 without
    /// histograms.
    #[inline]
    pub(crate) fn now(&self) -> u64 {
        if self.histograms {
            self.read_clock()
        } else {
            0
        }
    }

    #[inline(never)]
    fn read_clock(&self) -> u64 {
        self.clock.ticks()
    }

    /// A request of kind `op`, popped at `popped_at`, completed at `done`
    /// (ticks of the queue's clock: [`popped`](Self::popped),
    /// [`now`](Self::now)).
    #[inline]
    pub(crate) fn completed(&mut self, op: Op, popped_at: u64, done: u64) {
        if self.histograms {
            self.record_completion(op, popped_at, done);
        }
    }

    #[inline(never)]
    fn record_completion(&mut self, op: Op, popped_at: u64, done: u64) {
        self.completed_at(op, popped_at, done);
    }

    #[inline(always)]
    fn completed_at(&mut self, op: Op, popped_at: u64, done: u64) {
        let scale = self.scale;
        self.latency[class(op)].record(done.wrapping_sub(popped_at), &scale);
    }

    /// A request of kind `op` popped at `popped_at` and served at once
    /// completes now (the end of a pass, with no pop to end its service).
    #[inline]
    pub(crate) fn served(&mut self, op: Op, popped_at: u64) {
        if self.histograms {
            (self.served_fn)(self, op, popped_at);
        }
    }

    /// [`served`](Self::served) on clock source `C`.
    #[inline(never)]
    fn record_served<C: TickSource>(&mut self, op: Op, popped_at: u64) {
        self.completed_at(op, popped_at, C::read());
    }

    /// The queue got a slot after waiting `waited`.
    pub(crate) fn tag_waited(&mut self, waited: Duration) {
        if !self.histograms {
            return;
        }
        self.tag_wait.record(waited.as_nanos() as u64);
    }

    /// Adaptive polling: a wait for the guest that had a poll window of
    /// `had` ended with a request, and the window is now `now`.
    pub(crate) fn poll_window_adjusted(&mut self, had: Duration, now: Duration) {
        if now > had {
            self.counters.poll_window_grows += 1;
        } else if now < had {
            self.counters.poll_window_shrinks += 1;
        }
        self.poll_window_now_ns = now.as_nanos() as u64;
        if self.histograms {
            self.poll_window.record(had.as_nanos() as u64);
        }
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
        if self.wake_run.0 == (kicks, requests) {
            self.wake_run.1 += 1;
        } else {
            self.next_wake_run(kicks, requests);
        }
    }

    /// A wake-up unlike the last: the last one's run goes into the
    /// histograms.
    #[inline(never)]
    fn next_wake_run(&mut self, kicks: u64, requests: u64) {
        let ((k, r), n) = std::mem::replace(&mut self.wake_run, ((kicks, requests), 1));
        Self::add_wakeups(
            [
                &mut self.requests_per_wakeup,
                &mut self.kicks_per_wakeup,
                &mut self.requests_per_kick,
            ],
            k,
            r,
            n,
        );
    }

    /// `n` wake-ups that found `requests` requests after `kicks` kicks
    /// into the histograms of requests per wake-up, kicks per wake-up and
    /// requests per kick.
    fn add_wakeups(
        [per_wakeup, kicks_per, per_kick]: [&mut Hist; 3],
        kicks: u64,
        requests: u64,
        n: u64,
    ) {
        if n == 0 {
            return;
        }
        per_wakeup.record_n(requests, n);
        kicks_per.record_n(kicks, n);
        if let Some(pk) = (requests + kicks / 2).checked_div(kicks) {
            per_kick.record_n(pk, n);
        }
    }

    /// The wake-up histograms with the current run: requests per
    /// wake-up, kicks per wake-up, requests per kick.
    fn wake_hists(&self) -> [Hist; 3] {
        let mut h = [
            self.requests_per_wakeup.clone(),
            self.kicks_per_wakeup.clone(),
            self.requests_per_kick.clone(),
        ];
        let [a, b, c] = &mut h;
        let ((k, r), n) = self.wake_run;
        Self::add_wakeups([a, b, c], k, r, n);
        h
    }

    /// Forget everything counted so far.
    pub(crate) fn reset(&mut self) {
        *self = QueueStats {
            worker_tid: self.worker_tid,
            worker_start: self.worker_start,
            retired_cpu: self.retired_cpu,
            histograms: self.histograms,
            cpu_baseline: self.worker_cpu_total(),
            ..QueueStats::with_clock(self.clock)
        };
    }

    /// Record which thread serves this queue (first wake-up of a worker).
    /// Never inlined, like the recording functions: `blklab bench
    /// --instructions` counts its check on every wake-up as the
    /// statistics'.
    #[inline(never)]
    pub(crate) fn set_worker(&mut self, tid: i32) {
        if self.worker_tid != Some(tid) {
            self.retire_worker();
            self.worker_tid = Some(tid);
            self.worker_start = thread_cpu(tid).unwrap_or_default();
        }
    }

    /// The queue's worker is done (its connection ended): its CPU time so
    /// far joins the earlier workers', so the queue's worker CPU time
    /// covers every connection since the statistics started.
    pub(crate) fn retire_worker(&mut self) {
        let Some(tid) = self.worker_tid.take() else {
            return;
        };
        let spent =
            thread_cpu(tid).map_or_else(ThreadCpu::default, |now| now.since(self.worker_start));
        self.retired_cpu = Some(self.retired_cpu.unwrap_or_default().plus(spent));
    }

    /// The CPU time of every worker that has served this queue, each
    /// since it started serving it (`None` before the first).
    fn worker_cpu_total(&self) -> Option<ThreadCpu> {
        let current = self
            .worker_tid
            .and_then(thread_cpu)
            .map(|now| now.since(self.worker_start));
        match (self.retired_cpu, current) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or_default().plus(b.unwrap_or_default())),
        }
    }

    /// A copy to diff later reports against (see [`QueueStats::report`]),
    /// with the worker's CPU time as of now.
    pub(crate) fn baseline(&self) -> QueueStats {
        let mut b = self.clone();
        b.cpu_baseline = self.worker_cpu_total();
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
        let [per_wakeup, kicks_per, per_kick] = self.wake_hists();
        let then = earlier.map(QueueStats::wake_hists);
        let w = |now: &Hist, i: usize| h(now, then.as_ref().map(|t| &t[i]));
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
            requests_per_wakeup: w(&per_wakeup, 0),
            requests_per_kick: w(&per_kick, 2),
            requests_per_kick_values: match &then {
                Some(t) => per_kick.delta(&t[2]).values(),
                None => per_kick.values(),
            },
            kicks_per_wakeup: w(&kicks_per, 1),
            latency_read_ns: lat(0),
            latency_write_ns: lat(1),
            latency_other_ns: lat(2),
            inter_arrival_ns: h(
                &self.inter_arrivals(),
                earlier.map(QueueStats::inter_arrivals).as_ref(),
            ),
            inflight_at_pop: r(&self.inflight_at_pop, earlier.map(|e| &e.inflight_at_pop)),
            tag_wait_ns: h(&self.tag_wait, earlier.map(|e| &e.tag_wait)),
            poll_window_ns: h(&self.poll_window, earlier.map(|e| &e.poll_window)),
            poll_window_now_ns: self.poll_window_now_ns,
            worker_cpu: self.worker_cpu_since(earlier),
        }
    }

    /// The workers' CPU seconds since the baseline (`earlier`'s, else our
    /// own).
    fn worker_cpu_since(&self, earlier: Option<&QueueStats>) -> Option<ThreadCpu> {
        let now = self.worker_cpu_total()?;
        let base = match earlier {
            Some(e) => e.cpu_baseline,
            None => self.cpu_baseline,
        };
        Some(now.since(base.unwrap_or_default()))
    }
}

/// User and system CPU seconds of one thread.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
pub(crate) struct ThreadCpu {
    pub(crate) user_s: f64,
    pub(crate) sys_s: f64,
}

impl ThreadCpu {
    fn plus(self, o: ThreadCpu) -> ThreadCpu {
        ThreadCpu {
            user_s: self.user_s + o.user_s,
            sys_s: self.sys_s + o.sys_s,
        }
    }

    /// `self - o`, each part at least 0.
    fn since(self, o: ThreadCpu) -> ThreadCpu {
        ThreadCpu {
            user_s: (self.user_s - o.user_s).max(0.0),
            sys_s: (self.sys_s - o.sys_s).max(0.0),
        }
    }
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
    pub(crate) index: usize,
    pub counters: QueueCounters,
    /// Requests popped per wake-up.
    #[serde(default)]
    pub(crate) requests_per_wakeup: HistSummary,
    /// Requests popped per kick, per wake-up that had kicks (rounded).
    #[serde(default)]
    pub requests_per_kick: HistSummary,
    /// The requests-per-kick distribution: (requests, kicks) pairs.
    #[serde(default)]
    pub(crate) requests_per_kick_values: Vec<(u64, u64)>,
    #[serde(default)]
    pub kicks_per_wakeup: HistSummary,
    /// Service time, pop to used, ns, by op.
    #[serde(default)]
    pub latency_read_ns: HistSummary,
    #[serde(default)]
    pub latency_write_ns: HistSummary,
    #[serde(default)]
    pub(crate) latency_other_ns: HistSummary,
    /// Time between consecutive pops, ns.
    #[serde(default)]
    pub(crate) inter_arrival_ns: HistSummary,
    /// Requests in service when a request is popped.
    #[serde(default)]
    pub(crate) inflight_at_pop: HistSummary,
    /// How long the queue waited for a command slot, ns.
    #[serde(default)]
    pub(crate) tag_wait_ns: HistSummary,
    /// Adaptive polling: the poll window of each wait for the guest that a
    /// request ended (its size over the document's span), ns.
    #[serde(default)]
    pub(crate) poll_window_ns: HistSummary,
    /// Adaptive polling: the poll window at the time of the document, ns.
    #[serde(default)]
    pub(crate) poll_window_now_ns: u64,
    /// The CPU time of the worker threads serving the queue over the
    /// document's span, the workers of every connection in it counted
    /// (null when the queue has not been served yet).
    #[serde(default)]
    pub(crate) worker_cpu: Option<ThreadCpu>,
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
    /// The disk's connection generation: how many frontends have connected
    /// to it since the daemon started (n while the n-th is connected, 0
    /// before the first). What a connection's device keeps (its rings,
    /// latency sequences, fault schedules, cache mode) starts over with
    /// each; the statistics here and the tag pools carry over.
    #[serde(default)]
    pub connections: u64,
    /// A frontend is connected now.
    #[serde(default)]
    pub connected: bool,
    /// In a delta (a snapshot, a lab record's window): `connections` when
    /// its baseline was taken. When it differs from `connections` a
    /// frontend connected during the window, and the window's counters
    /// span more than one connection's device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connections_at_start: Option<u64>,
}

impl DiskReport {
    /// In a delta: whether a frontend connected to the disk during it
    /// (`None` for a document that is no delta, or older than the field).
    pub(crate) fn reconnected(&self) -> Option<bool> {
        Some(self.connections_at_start? != self.connections)
    }

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
    time_unix_ns: u128,
    /// For snapshots: the label and the seconds the delta covers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval_s: Option<f64>,
    /// The daemon whose statistics these are (absent from documents older
    /// than the field). Two documents of the same instance can be
    /// subtracted; a new instance started its statistics afresh.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daemon: Option<DaemonIdentity>,
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
            daemon: None,
            disks,
        }
    }

    /// Every queue of every disk.
    pub(crate) fn queues(&self) -> impl Iterator<Item = &QueueReport> {
        self.disks.iter().flat_map(|d| d.queues.iter())
    }

    /// When the document was made, ns since the Unix epoch.
    pub(crate) fn time_unix_ns(&self) -> u128 {
        self.time_unix_ns
    }

    /// Set when the document was made (documents written by hand in tests).
    #[cfg(test)]
    pub(crate) fn set_time_unix_ns(&mut self, t: u128) {
        self.time_unix_ns = t;
    }

    /// In a delta: whether a frontend connected to any disk during it
    /// (`None` when no disk says, see [`DiskReport::reconnected`]).
    pub(crate) fn reconnected(&self) -> Option<bool> {
        self.disks
            .iter()
            .filter_map(DiskReport::reconnected)
            .reduce(|a, b| a || b)
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

    /// Statistics on the monotonic clock: a tick is a ns.
    fn ns_stats() -> QueueStats {
        QueueStats::with_clock(Clock::monotonic())
    }

    #[test]
    fn classes_are_read_write_and_the_rest() {
        assert_eq!(class(Op::Read), 0);
        assert_eq!(class(Op::Write), 1);
        for op in [
            Op::Flush,
            Op::GetId,
            Op::Discard,
            Op::WriteZeroes,
            Op::Other,
        ] {
            assert_eq!(class(op), 2, "{op:?}");
        }
    }

    #[test]
    fn pop_slots_are_the_kinds() {
        for (i, op) in OPS.iter().enumerate() {
            assert_eq!(pop_slot(Some(*op)), i, "{op:?}");
        }
        assert_eq!(pop_slot(None), INTER_ARRIVAL);
        const { assert!(INTER_ARRIVAL < POP_SLOTS && POP_SLOTS.is_power_of_two()) };
    }

    #[test]
    fn times_in_ticks_report_nanoseconds() {
        // A 3 GHz counter: durations in ticks, reports in ns.
        let mut s = QueueStats::with_clock(Clock::tsc_with((1u64 << 32) / 3));
        let t = 3_000_000_000u64;
        s.pop_at(t, 0, None);
        s.pop_at(t + 30_000, 0, None);
        s.pop_at(t + 90_000, 0, Some(Op::Write));
        s.pop_at(t + 90_300, 0, Some(Op::Flush));
        s.completed_at(Op::Read, t, t + 3_000_000);
        let r = s.report(0, None);
        assert_eq!(r.inter_arrival_ns.count, 3);
        assert_eq!(r.inter_arrival_ns.min, 99, "{r:?}");
        assert!(r.inter_arrival_ns.max.abs_diff(20_000) <= 200, "{r:?}");
        assert!(
            (r.inter_arrival_ns.mean - 30_100.0 / 3.0).abs() < 0.01,
            "{r:?}"
        );
        // The flush served at once: 300 ticks, 99.99... ns (exact below
        // 256 ns, rounded down).
        assert_eq!(r.latency_other_ns.count, 1);
        assert_eq!(r.latency_other_ns.max, 99, "{r:?}");
        assert_eq!(r.latency_write_ns.count, 1);
        assert!((r.latency_write_ns.mean - 20_000.0).abs() < 0.01, "{r:?}");
        assert!(r.latency_read_ns.p50.abs_diff(1_000_000) <= 10_000, "{r:?}");
        assert!((r.latency_read_ns.mean - 1_000_000.0).abs() < 0.1, "{r:?}");
    }

    #[test]
    fn the_hot_path_reads_either_clock() {
        for clock in [*Clock::get(), Clock::monotonic()] {
            let mut s = QueueStats::with_clock(clock);
            let t0 = s.popped(0, None);
            std::thread::sleep(Duration::from_millis(2));
            let t1 = s.popped(0, None);
            let t2 = s.popped(1, Some(Op::Read));
            s.served(Op::Write, t2);
            let done = s.now();
            s.completed(Op::Flush, t0, done);
            assert!(t0 < t1 && t1 <= t2 && t2 <= done, "{clock:?}");
            let r = s.report(0, None);
            assert_eq!(r.inter_arrival_ns.count, 2, "{clock:?}");
            // The 2 ms sleep, in ns whatever the clock's ticks.
            assert!(r.inter_arrival_ns.max >= 1_900_000, "{clock:?}: {r:?}");
            assert!(r.inter_arrival_ns.max < 10_000_000_000, "{clock:?}: {r:?}");
            assert_eq!(
                (
                    r.latency_read_ns.count,
                    r.latency_write_ns.count,
                    r.latency_other_ns.count
                ),
                (1, 1, 1)
            );
            assert!(r.latency_other_ns.min >= 1_900_000, "{clock:?}: {r:?}");
            assert_eq!((r.inflight_at_pop.count, r.inflight_at_pop.max), (3, 1));
            // Without histograms nothing reads the clock.
            let mut n = QueueStats::with_clock(clock);
            n.histograms = false;
            assert_eq!((n.popped(0, None), n.now()), (0, 0));
        }
    }

    #[test]
    fn wakeups_and_kicks() {
        let mut s = ns_stats();
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
        let mut s = ns_stats();
        s.counters.requests = 10;
        s.completed_at(Op::Read, 0, 100_000);
        let earlier = s.clone();
        s.counters.requests = 25;
        s.completed_at(Op::Read, 0, 300_000);
        s.completed_at(Op::Write, 0, 50_000);
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
        let mut s = ns_stats();
        let t = 1_000_000_000u64;
        s.pop_at(t, 0, None);
        s.pop_at(t + 10_000, 1, None);
        s.pop_at(t + 30_000, 2, Some(Op::Write));
        s.pop_at(t + 30_100, 2, Some(Op::Read));
        s.pop_at(t + 30_200, 2, None);
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
        s.pop_at(t + 30_300, 2, None);
        s.pop_at(t + 30_400, 0, None);
        let d = s.report(0, Some(&snap));
        assert_eq!(d.inflight_at_pop.count, 2);
        assert_eq!(d.inflight_at_pop.min, 0);
        assert_eq!(d.inflight_at_pop.max, 2);
    }

    #[test]
    fn documents_read_back_and_check_their_schema() {
        let mut s = ns_stats();
        s.wakeup(1, 3);
        s.completed_at(Op::Read, 0, 20_000);
        let mut doc = StatsDocument::new(vec![DiskReport {
            config: None,
            queues: vec![s.report(0, None)],
            tag_pools: Vec::new(),
            connections: 2,
            connected: true,
            connections_at_start: Some(1),
        }]);
        doc.label = Some("x".into());
        doc.daemon = Some(DaemonIdentity::new());
        let text = serde_json::to_string(&doc).unwrap();
        assert!(text.starts_with(r#"{"schema":"blklab-stats/1","#), "{text}");
        assert_eq!(StatsDocument::from_json(&text).unwrap(), doc);
        // Before the schema field: version 1; unknown fields are ignored.
        let old = r#"{"disks":[{"queues":[{"counters":{"kicks":2}}]}],"new":1}"#;
        let d = StatsDocument::from_json(old).unwrap();
        assert_eq!(d.schema, STATS_SCHEMA);
        assert_eq!(d.sum(|c| c.kicks), 2);
        // Older than the daemon's identity and the connection generation:
        // neither said.
        assert_eq!(d.daemon, None);
        assert_eq!((d.disks[0].connections, d.disks[0].connected), (0, false));
        assert_eq!(d.reconnected(), None);
        let e = StatsDocument::from_json(r#"{"schema":"blklab-stats/2","disks":[]}"#)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"blklab-stats/2\"") && e.contains("reads \"blklab-stats/1\""),
            "{e}"
        );
    }

    /// Burn this thread's CPU until the kernel has charged it a tick.
    fn burn_a_tick() -> ThreadCpu {
        let tid = current_tid();
        let mut x = 0u64;
        let start = std::time::Instant::now();
        loop {
            for i in 0..1_000_000u64 {
                x = std::hint::black_box(x.wrapping_add(i * i));
            }
            let c = thread_cpu(tid).expect("our own thread's stat");
            if c.user_s + c.sys_s > 0.0 || start.elapsed() > std::time::Duration::from_secs(60) {
                return c;
            }
        }
    }

    /// Each connection has its own worker thread: the queue's worker CPU
    /// counts the one of a connection that ended, and a baseline taken
    /// between connections leaves it out.
    #[test]
    fn worker_cpu_counts_the_workers_of_every_connection() {
        let s = ns_stats();
        assert_eq!(s.report(0, None).worker_cpu, None, "never served");
        let mut s = std::thread::spawn(move || {
            let mut s = s;
            s.set_worker(current_tid());
            burn_a_tick();
            s.retire_worker();
            s
        })
        .join()
        .unwrap();
        let first = s.report(0, None).worker_cpu.expect("a worker served");
        assert!(first.user_s + first.sys_s > 0.0, "{first:?}");
        let between = s.baseline();
        s.set_worker(current_tid());
        let since = s.report(0, Some(&between)).worker_cpu.unwrap();
        let total = s.report(0, None).worker_cpu.unwrap();
        let sum = |c: ThreadCpu| c.user_s + c.sys_s;
        assert!(sum(total) >= sum(first), "{total:?} < {first:?}");
        assert!(sum(since) <= sum(total) - sum(first) + 1e-9, "{since:?}");
        // A reset forgets the earlier workers' time too.
        s.reset();
        let after = s.report(0, None).worker_cpu.unwrap();
        let now = s.worker_cpu_total().unwrap();
        assert!(sum(after) <= sum(now) - sum(first) + 1e-9, "{after:?}");
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
        let mut s = ns_stats();
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
