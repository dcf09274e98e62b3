//! One pass over a queue's ring: complete the requests whose emulated
//! time has come, pop and execute what the guest made available (taking
//! a command slot for each), put them on the used ring and notify the
//! guest.
//!
//! The pass ([`Pass`]) works on any [`UsedRing`]: vhost-user-backend's
//! `VringState` in the daemon, a bare `virtio_queue::Queue` over a
//! `MockSplitQueue` in the worker's unit tests, which drive it in process,
//! without a socket. It does not know why the worker woke or what it does
//! after the pass.

use std::cmp::Reverse;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use log::warn;
use vhost_user_backend::VringState;
use virtio_queue::{Queue, QueueT};
use vm_memory::{GuestAddressSpace, GuestMemoryMmap};

use crate::backend::worker::queue::{BrokenRing, Pending, QueueState};
use crate::backend::{BlkBackend, Disk};
use crate::device::execute::{serve_chain, Device, Outcome};
use crate::device::faults::FaultDecision;
use crate::device::latency::LatOp;
use crate::device::tags::{QueueId, Tag, TagPool};
use crate::stats::queue::QueueStats;
use crate::virtio_blk::request::{Op, STATUS_IOERR, STATUS_OK, STATUS_UNSUPP};
use crate::virtq::guest_map::GuestMap;
use crate::virtq::inflight::{crash_point, Step};
use crate::virtq::split_ring::{Popped, RingError, RingLayout, SplitRing};

/// What the worker does after a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Turn guest notifications back on (EVENT_IDX), look again while the
    /// guest added buffers meanwhile, then wait for a kick or the timer.
    Notify,
    /// One pass, guest notifications left off: the worker goes on polling
    /// the ring (see [`BlkBackend::poll_loop`]).
    Poll,
}

/// The layout of `queue`'s ring.
pub(super) fn ring_layout(queue: &Queue) -> RingLayout {
    RingLayout {
        desc: queue.desc_table(),
        avail: queue.avail_ring(),
        used: queue.used_ring(),
        size: queue.size(),
    }
}

/// A ring ready for a pass, and whether it was checked afresh.
pub(super) struct Prepared {
    pub(super) ring: SplitRing,
    /// Not the cached ring: its layout is new to the queue (and must be
    /// checked against the other queues' rings).
    pub(super) fresh: bool,
}

/// The ring of `queue` over `mem`, ready for a pass: `cached` when it was
/// checked against this memory table and these addresses, otherwise
/// checked again (every part inside one region, aligned, no two parts
/// overlapping, see [`SplitRing::new`]). Indices come from the queue (the
/// frontend may have set them since the last pass).
pub(super) fn prepare_ring(
    cached: Option<SplitRing>,
    queue: &Queue,
    mem: &Arc<GuestMemoryMmap>,
) -> Result<Prepared, RingError> {
    let layout = ring_layout(queue);
    let event_idx = queue.event_idx_enabled();
    let map = match cached {
        Some(mut r) if r.map().is_of(mem) && r.layout() == layout && r.event_idx() == event_idx => {
            r.set_indices(queue.next_avail(), queue.next_used());
            return Ok(Prepared {
                ring: r,
                fresh: false,
            });
        }
        Some(r) if r.map().is_of(mem) => r.into_map(),
        _ => GuestMap::new(mem.clone()),
    };
    let ring = SplitRing::new(
        map,
        layout,
        event_idx,
        queue.next_avail(),
        queue.next_used(),
    )?;
    Ok(Prepared { ring, fresh: true })
}

/// Why a drain of the avail ring stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DrainStop {
    /// Nothing more available.
    Empty,
    /// The ring is unusable (counted, and the queue marked broken).
    Broken,
    /// No command slot was free: the queue waits for its pool's wake-up.
    NoSlot,
    /// A queue size popped with more available: the rest waits for the
    /// next pass, so that no ring state keeps a worker from its lock, its
    /// messages or its shutdown.
    Bounded,
    /// The daemon is stopping: what the guest made available stays on the
    /// avail ring for whoever serves the ring next.
    Quiescing,
}

/// What one drain of the avail ring did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Drained {
    /// Chains put on the used ring (completed at once or dropped).
    pub(super) used: usize,
    /// Chains popped.
    pub(super) popped: u64,
    pub(super) stop: DrainStop,
}

/// What one [`Pass::turn`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Turn {
    /// Requests in service completed (their deadline had come).
    pub(super) completed: usize,
    /// The drain of the avail ring.
    pub(super) drained: Drained,
    /// Look again: the guest added buffers after the last look and before
    /// it saw the notifications back on (EVENT_IDX).
    pub(super) again: bool,
}

impl Turn {
    /// The turn completed or popped a request.
    pub(super) fn progressed(&self) -> bool {
        self.completed > 0 || self.drained.popped > 0
    }
}

/// The ring a worker serves: a virtio queue and the guest's used-buffer
/// notification.
pub(super) trait UsedRing {
    fn queue(&self) -> &Queue;
    fn queue_mut(&mut self) -> &mut Queue;
    fn signal_used_queue(&self) -> io::Result<()>;
}

impl<M: GuestAddressSpace> UsedRing for VringState<M> {
    fn queue(&self) -> &Queue {
        self.get_queue()
    }

    fn queue_mut(&mut self) -> &mut Queue {
        self.get_queue_mut()
    }

    fn signal_used_queue(&self) -> io::Result<()> {
        VringState::signal_used_queue(self)
    }
}

/// One locked pass over a queue: what every step of it needs.
pub(super) struct Pass<'a, R: UsedRing> {
    pub(super) be: &'a BlkBackend,
    pub(super) q: &'a mut QueueState,
    pub(super) st: &'a mut QueueStats,
    /// The vring (its call fd; the queue's indices are written back to it
    /// when the pass ends).
    pub(super) ring: &'a mut R,
    /// The split ring, read and written through its host pointers.
    pub(super) vq: &'a mut SplitRing,
}

/// Run `f` over a pass on queue `q`'s ring in `mem`: the ring is checked
/// (or taken from the queue's cache), its indices taken from the vring's
/// queue, and written back when `f` returns. `Err`: the ring cannot be
/// served (the queue is then marked broken and the error counted).
#[inline]
pub(super) fn with_pass<R: UsedRing, T>(
    be: &BlkBackend,
    q: &mut QueueState,
    st: &mut QueueStats,
    ring: &mut R,
    mem: &Arc<GuestMemoryMmap>,
    f: impl FnOnce(&mut Pass<'_, R>) -> T,
) -> Result<T, BrokenRing> {
    let prepared = prepare_ring(q.ring.take(), ring.queue(), mem).and_then(|p| {
        if p.fresh {
            be.claim_ring(q.index, p.ring.layout())?;
        }
        Ok(p.ring)
    });
    let mut vq = match prepared {
        Ok(vq) => vq,
        Err(e) => {
            be.release_ring(q.index);
            let why = BrokenRing::from(e);
            q.mark_broken(st, &be.disk.cfg.socket, &why);
            return Err(why);
        }
    };
    if q.inflight_unread() {
        q.resume_inflight(&mut vq, &be.disk.cfg.socket);
    }
    vq.set_log(be.dirty.current());
    let out = f(&mut Pass {
        be,
        q: &mut *q,
        st: &mut *st,
        ring: &mut *ring,
        vq: &mut vq,
    });
    let queue = ring.queue_mut();
    queue.set_next_avail(vq.next_avail.0);
    queue.set_next_used(vq.next_used.0);
    if vq.log().is_some_and(|log| log.take_marked()) {
        be.dirty.kick();
    }
    q.ring = Some(vq);
    Ok(out)
}

/// No command slot was free for the next request.
struct NoSlot;

impl<R: UsedRing> Pass<'_, R> {
    /// One look at the ring: in [`Mode::Poll`] turn guest notifications
    /// off (they stay off until the poll loop enables them again), complete
    /// the requests whose time has come, pop and execute what the guest
    /// made available, and notify the guest. Then, with EVENT_IDX and in
    /// [`Mode::Notify`], turn notifications back on and say whether to look
    /// again. (In notify mode with EVENT_IDX the driver stops notifying by
    /// itself once it is past avail_event, so there is nothing to turn off
    /// for the pass.)
    pub(super) fn turn(&mut self, event_idx: bool, mode: Mode) -> Turn {
        if mode == Mode::Poll {
            self.vq.disable_notification();
        }
        let completed = self.complete_due(Instant::now());
        let drained = self.drain();
        if !event_idx && completed + drained.used > 0 {
            // Without EVENT_IDX: one signal for the pass (see used_added).
            self.notify_if_needed();
        }
        // Only an emptied ring waits for the guest: a broken ring stays
        // broken until the driver resets it, a queue without a free slot
        // waits for its pool's wake-up (do not spin on either), and a pass
        // cut at the queue size comes back through the timer. Re-enable
        // notifications, then look again: the guest may have added buffers
        // after our last look and before it saw the flag.
        let again = event_idx
            && mode == Mode::Notify
            && drained.stop == DrainStop::Empty
            && self.vq.enable_notification();
        Turn {
            completed,
            drained,
            again,
        }
    }

    /// Complete every pending request whose deadline is at or before `now`
    /// (one clock read for their service times, when any is due).
    pub(super) fn complete_due(&mut self, now: Instant) -> usize {
        let mut n = 0;
        let mut done = None;
        while let Some(Reverse(p)) = self.q.pending.peek().copied() {
            if p.deadline > now {
                break;
            }
            self.q.pending.pop();
            let at = *done.get_or_insert_with(|| self.st.now());
            self.finish(p, Some(at));
            n += 1;
        }
        n
    }

    /// An entry was put on the used ring. With EVENT_IDX, check the
    /// guest's used_event after every entry, as QEMU does: the driver hears
    /// of its first completion while we still serve the rest, and refills
    /// the ring in parallel instead of after the whole pass (measured: +60-90
    /// % IOPS at QD64 and -20 % backend CPU per request on the development
    /// VM; see docs/benchmarks.md, "What the profile showed"). The check is one read of
    /// used_event and signals at most once per driver update of it. Without
    /// EVENT_IDX every check would signal, so the pass signals once at its
    /// end instead.
    #[inline]
    fn used_added(&mut self) {
        if self.vq.event_idx() {
            self.notify_if_needed();
        }
    }

    /// Signal the guest if the used entries added since the last check
    /// cross its `used_event` (always without EVENT_IDX).
    fn notify_if_needed(&mut self) {
        if self.vq.needs_notification() {
            if let Err(e) = self.ring.signal_used_queue() {
                // The call fd is the frontend's: say so once per queue,
                // never per request.
                if !self.q.warned_signal {
                    self.q.warned_signal = true;
                    warn!(
                        "{} queue {}: cannot signal the guest: {e} (further failures not logged)",
                        self.be.disk.cfg.socket.display(),
                        self.q.index
                    );
                }
            }
            self.st.counters.notifications += 1;
        } else {
            self.st.counters.notifications_suppressed += 1;
        }
    }

    /// Put a request on the used ring and give its slot back; its service
    /// time is recorded as ending at `done` (ticks of the statistics'
    /// clock, [`QueueStats::now`]; None: the caller records it).
    ///
    /// Always inlined, as are [`complete_or_hold`](Self::complete_or_hold)
    /// and [`account`](Self::account): the drain has two instantiations
    /// (the avail ring's, and the inflight area's after a restart), and
    /// with two call sites LLVM would keep these out of line on the
    /// request path (+130 instructions per request at QD1, counted).
    #[inline(always)]
    pub(super) fn finish(&mut self, p: Pending, done: Option<u64>) {
        self.be.disk.put_tag(self.q.index, p.tag);
        if self.q.is_broken() {
            // The ring is not touched again until the driver resets it.
            return;
        }
        self.put_used(p.head, p.used_len);
        self.used_added();
        if let Some(done) = done {
            self.st.completed(p.op, p.popped_at, done);
        }
    }

    /// Put `head` on the used ring with `len` bytes written, recording
    /// in the inflight area (when there is one) that it is no longer in
    /// flight, in the order a back-end dying at any point needs.
    #[inline]
    fn put_used(&mut self, head: u16, len: u32) {
        match &self.q.inflight {
            None => self.vq.add_used(head, len),
            Some(_) => self.put_used_tracked(head, len),
        }
    }

    /// [`put_used`](Self::put_used) with an inflight area: out of line,
    /// so the path without one stays as short as it was.
    #[inline(never)]
    fn put_used_tracked(&mut self, head: u16, len: u32) {
        if let Some(inf) = &self.q.inflight {
            inf.area.before_used(head);
        }
        self.vq.add_used(head, len);
        if let Some(inf) = &self.q.inflight {
            inf.area.after_used(head, self.vq.next_used);
        }
    }

    /// `head` was taken off the avail ring: record it in the inflight
    /// area (out of line, as [`put_used_tracked`](Self::put_used_tracked)).
    #[inline(never)]
    fn record_taken(&mut self, head: u16) {
        if let Some(inf) = self.q.inflight.as_mut() {
            inf.area.taken(head);
        }
    }

    /// The driver broke the ring: count it and stop serving the queue.
    fn ring_broke(&mut self, e: RingError) {
        self.q
            .mark_broken(self.st, &self.be.disk.cfg.socket, &BrokenRing::Ring(e));
    }

    /// Pop and execute every available chain, as far as command slots
    /// allow. Requests without emulated latency complete at once; the
    /// others wait in the queue's deadline heap.
    pub(super) fn drain(&mut self) -> Drained {
        if self.be.disk.is_quiescing() {
            // Checked under the queue's lock, once per pass: once the stop
            // has held this lock after raising the flag, nothing is popped.
            return Drained {
                used: 0,
                popped: 0,
                stop: DrainStop::Quiescing,
            };
        }
        let timed = self.st.histograms;
        // The last request served at once: its service time ends at the
        // next pop (or at the end of the pass).
        let mut served_at_once: Option<(Op, u64)> = None;
        let r = if self
            .q
            .inflight
            .as_ref()
            .is_some_and(|i| !i.resubmit.is_empty())
        {
            self.drain_again(timed, &mut served_at_once)
        } else {
            self.drain_timed::<false>(timed, &mut served_at_once)
        };
        if let Some((op, at)) = served_at_once {
            self.st.served(op, at);
        }
        r
    }

    /// Once after a restart: serve the requests a previous back-end left
    /// in flight, then drain the avail ring.
    #[cold]
    #[inline(never)]
    fn drain_again(&mut self, timed: bool, served_at_once: &mut Option<(Op, u64)>) -> Drained {
        let again = self.drain_timed::<true>(timed, served_at_once);
        if again.stop != DrainStop::Empty {
            return again;
        }
        let rest = self.drain_timed::<false>(timed, served_at_once);
        Drained {
            used: again.used + rest.used,
            popped: again.popped + rest.popped,
            stop: rest.stop,
        }
    }

    /// The drain: for each available chain, take a command slot, pop and
    /// serve the chain, and complete it at once or schedule its
    /// completion. `timed`: record service times (the statistics'
    /// histograms are on), `served_at_once` holding the last request
    /// completed at once. `AGAIN`: the chains are the inflight area's
    /// heads to serve again (the drain is `Empty` when none is left), not
    /// the avail ring's. Always inlined: its other call sites are the
    /// restart's (see [`finish`](Self::finish)).
    #[inline(always)]
    fn drain_timed<const AGAIN: bool>(
        &mut self,
        timed: bool,
        served_at_once: &mut Option<(Op, u64)>,
    ) -> Drained {
        let mut r = Drained {
            used: 0,
            popped: 0,
            stop: DrainStop::Empty,
        };
        let disk: &Disk = &self.be.disk;
        let slots = disk.tag_slots[self.q.index].as_ref();
        let no_latency = disk.cfg.latency.is_zero();
        loop {
            if let Some(stop) = self.stop_before_pop::<AGAIN>(r.popped) {
                r.stop = stop;
                return r;
            }
            let Ok(tag) = self.take_slot(slots) else {
                r.stop = DrainStop::NoSlot;
                return r;
            };
            let Some(head) = self.pop::<AGAIN>(tag) else {
                r.stop = DrainStop::Broken;
                return r;
            };
            r.popped += 1;
            // One clock read per request: it is this request's pop time and
            // the completion time of the previous one served at once. With
            // --no-stats nothing needs it (emulated latency reads the
            // system clock for its deadline below). The request served at
            // once before this one completes now: its service time is this
            // inter-arrival time.
            let served_before = served_at_once.take().map(|(op, _)| op);
            let popped_at = self.st.popped(self.q.pending.len() as u64, served_before);
            let outcome = self.serve_popped(head.truncated);
            crash_point(Step::Served);
            let used_len = self.account(outcome);
            let Outcome::Completed { op, fault, .. } = outcome else {
                // Malformed: returned at once, no emulated service time.
                disk.put_tag(self.q.index, tag);
                self.put_used(head.head, 0);
                r.used += 1;
                self.used_added();
                continue;
            };
            // Its data and status are in guest memory: mark their pages
            // while the frontend logs.
            self.vq.log_written(&self.q.segs);
            let p = Pending {
                deadline: self.q.epoch,
                seq: self.q.seq,
                head: head.head,
                used_len,
                op,
                popped_at,
                tag,
            };
            self.q.seq += 1;
            if self.complete_or_hold(p, fault, no_latency) {
                if timed {
                    *served_at_once = Some((op, popped_at));
                }
                r.used += 1;
            }
        }
    }

    /// Why the drain stops before its next pop, if it does: the ring is
    /// broken, empty, or a queue size was popped in this pass. Reads the
    /// avail index only: the command slot comes before the pop.
    #[inline]
    fn stop_before_pop<const AGAIN: bool>(&mut self, popped: u64) -> Option<DrainStop> {
        if self.q.is_broken() {
            return Some(DrainStop::Broken);
        }
        if AGAIN {
            let left = self.q.inflight.as_ref().map_or(0, |i| i.resubmit.len());
            return (left == 0).then_some(DrainStop::Empty);
        }
        match self.vq.pending() {
            Ok(0) => Some(DrainStop::Empty),
            Ok(_) if popped >= u64::from(self.vq.size()) => Some(DrainStop::Bounded),
            Ok(_) => None,
            Err(e) => {
                self.ring_broke(e);
                Some(DrainStop::Broken)
            }
        }
    }

    /// A command slot from the queue's tag pool (`Ok(None)` when the disk
    /// has no pool); counts the wait for one, which starts when none is
    /// free and ends when one is taken.
    #[inline(always)]
    fn take_slot(
        &mut self,
        slots: Option<&(Arc<TagPool>, QueueId)>,
    ) -> Result<Option<Tag>, NoSlot> {
        let Some((pool, id)) = slots else {
            return Ok(None);
        };
        match pool.try_get(*id, &mut self.q.tag_hint) {
            Some(t) => {
                if let Some(since) = self.q.waiting_since.take() {
                    self.st.tag_waited(since.elapsed());
                }
                Ok(Some(t))
            }
            None => {
                if self.q.waiting_since.is_none() {
                    self.q.waiting_since = Some(Instant::now());
                    self.st.counters.tag_waits += 1;
                }
                Err(NoSlot)
            }
        }
    }

    /// Pop the next chain into the queue's segment list, holding `tag`
    /// (first the requests a previous back-end left in flight, then the
    /// avail ring's, each recorded in the inflight area); `None` when the
    /// driver broke the ring (the slot is given back).
    #[inline(always)]
    fn pop<const AGAIN: bool>(&mut self, tag: Option<Tag>) -> Option<Popped> {
        let popped = if AGAIN {
            let head = self
                .q
                .inflight
                .as_mut()
                .and_then(|i| i.resubmit.pop_front());
            self.vq
                .walk_head(head.unwrap_or(u16::MAX), &mut self.q.segs)
        } else {
            let p = self.vq.pop(&mut self.q.segs);
            if let Ok(p) = &p {
                crash_point(Step::Taken);
                if self.q.inflight.is_some() {
                    self.record_taken(p.head);
                }
            }
            p
        };
        match popped {
            Ok(p) => Some(p),
            Err(e) => {
                // virtio 1.2 §2.7.13.1: a head is a descriptor index. One
                // beyond the table cannot be put on the used ring: the
                // driver broke the ring, as libvhost-user and QEMU judge it.
                self.be.disk.put_tag(self.q.index, tag);
                self.ring_broke(e);
                None
            }
        }
    }

    /// Parse, execute and answer the chain just popped (`truncated`: its
    /// walk stopped early).
    #[inline]
    fn serve_popped(&mut self, truncated: bool) -> Outcome {
        let disk = &*self.be.disk;
        let dev = Device {
            storage: disk.storage.as_ref(),
            cfg: &disk.cfg,
            capacity: disk.cfg.size,
            writeback: self.be.writeback(),
            faults: self.q.faults.as_ref(),
        };
        serve_chain(&dev, &self.q.segs, truncated, self.vq.map())
    }

    /// Complete a served request at once, or hold it in the deadline heap
    /// for its emulated service time (its op's latency sample, plus an
    /// injected stall). True when it completed at once.
    #[inline(always)]
    fn complete_or_hold(&mut self, mut p: Pending, fault: FaultDecision, no_latency: bool) -> bool {
        let mut delay = if no_latency {
            Duration::ZERO
        } else {
            self.q.samplers[LatOp::of(p.op).index()].sample()
        };
        if let FaultDecision::Stall(d) = fault {
            delay += d;
        }
        if delay.is_zero() {
            // Its deadline stays the epoch: only requests with a delay
            // wait for theirs.
            self.finish(p, None);
            return true;
        }
        p.deadline = Instant::now() + delay;
        self.q.pending.push(Reverse(p));
        false
    }

    /// Count a chain's outcome; returns its used length.
    #[inline(always)]
    fn account(&mut self, outcome: Outcome) -> u32 {
        let c = &mut self.st.counters;
        match outcome {
            Outcome::Completed {
                op,
                status,
                used_len,
                bytes,
                fault,
            } => {
                c.requests += 1;
                match fault {
                    FaultDecision::None => {}
                    FaultDecision::FailEvery => c.injected_fail_every += 1,
                    FaultDecision::FailRange => c.injected_fail_range += 1,
                    FaultDecision::Stall(_) => c.injected_stalls += 1,
                }
                match op {
                    Op::Read => c.reads += 1,
                    Op::Write => c.writes += 1,
                    Op::Flush => c.flushes += 1,
                    Op::GetId => c.get_ids += 1,
                    Op::Discard => c.discards += 1,
                    Op::WriteZeroes => c.write_zeroes += 1,
                    Op::Other => c.other += 1,
                }
                match status {
                    STATUS_OK => match op {
                        Op::Read => c.bytes_read += bytes,
                        Op::Write => c.bytes_written += bytes,
                        _ => {}
                    },
                    STATUS_IOERR => c.status_ioerr += 1,
                    STATUS_UNSUPP => c.status_unsupp += 1,
                    _ => {}
                }
                used_len
            }
            Outcome::Dropped(reason) => {
                c.dropped += 1;
                if !self.q.warned_drop {
                    self.q.warned_drop = true;
                    warn!(
                        "{} queue {}: dropped a malformed descriptor chain ({}); further drops are only counted",
                        self.be.disk.cfg.socket.display(),
                        self.q.index,
                        reason.describe()
                    );
                }
                0
            }
        }
    }
}
