//! A queue's worker: its state, and one pass over its ring (complete the
//! requests whose emulated time has come, pop and execute what the guest
//! made available, put them on the used ring, notify the guest).
//!
//! The pass ([`Pass`]) works on any [`UsedRing`]: vhost-user-backend's
//! `VringState` in the daemon, a bare `virtio_queue::Queue` over a
//! `MockSplitQueue` in the unit tests below, which drive it in process,
//! without a socket.

use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use log::warn;
use vhost_user_backend::{VringState, VringT};
use virtio_queue::{Queue, QueueT};
use vm_memory::{GuestAddressSpace, GuestMemoryMmap};

use crate::backend::deadline::DeadlineTimer;
use crate::backend::kick_vring::KickCountingVring;
use crate::backend::{BlkBackend, Disk, GM};
use crate::device::execute::{serve_chain, Device, Outcome};
use crate::device::faults::{FaultDecision, FaultState};
use crate::device::latency::{LatOp, LatencySampler};
use crate::device::tags::{QueueId, Tag, TagPool};
use crate::stats::queue::{current_tid, QueueStats};
use crate::virtio_blk::request::{Op, Segment, STATUS_IOERR, STATUS_OK, STATUS_UNSUPP};
use crate::virtq::guest_map::GuestMap;
use crate::virtq::split_ring::{Popped, RingError, RingLayout, SplitRing};

/// A request in service: executed, waiting for its emulated completion time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Pending {
    deadline: Instant,
    /// Pop order, to keep completions with equal deadlines in order.
    seq: u64,
    head: u16,
    used_len: u32,
    op: Op,
    /// Pop time in ticks of the queue statistics' clock
    /// ([`QueueStats::popped`]; 0 without statistics).
    popped_at: u64,
    tag: Option<Tag>,
}

impl Ord for Pending {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.deadline, self.seq).cmp(&(other.deadline, other.seq))
    }
}

impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// Why a queue's ring cannot be served: the driver broke it.
#[derive(Debug, thiserror::Error)]
pub(super) enum BrokenRing {
    /// A part of the ring, its avail index or a head it offered.
    #[error(transparent)]
    Ring(#[from] RingError),
    /// Turns told to look again twice in a row found nothing to pop.
    #[error("the avail index moves but nothing can be popped")]
    AvailMovesEmpty,
}

impl BrokenRing {
    /// A part of the ring is outside guest memory: a new memory table may
    /// put it back inside.
    fn by_memory(&self) -> bool {
        matches!(self, BrokenRing::Ring(RingError::Outside { .. }))
    }
}

/// Whether a queue's ring may be served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RingHealth {
    Usable,
    /// The driver broke the ring (extents outside guest memory, a head
    /// beyond the queue size, an avail index that moves with nothing to
    /// pop, ...): the queue is not served until the driver stops and
    /// restarts it (GET_VRING_BASE) or reconnects, as libvhost-user's
    /// `vu_panic` and QEMU's `virtio_error` do.
    Broken,
    /// Broken because a part of the ring is outside guest memory: a new
    /// memory table checks it again (the frontend may have removed the
    /// region and added it back).
    BrokenByMemory,
}

/// Why a worker serves its queue now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Wake {
    /// The guest kicked the queue.
    Kick,
    /// The queue's completion timer fired (a deadline, or the rest of a
    /// pass cut at the queue size).
    Timer,
    /// The queue's tag pool freed a command slot.
    SlotFree,
    /// The poll loop looks at a ring it polls.
    Poll,
}

/// What the worker does after a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// Turn guest notifications back on (EVENT_IDX), look again while the
    /// guest added buffers meanwhile, then wait for a kick or the timer.
    Notify,
    /// One pass, guest notifications left off: the worker goes on polling
    /// the ring (see [`BlkBackend::poll_loop`]).
    Poll,
}

/// What [`BlkBackend::serve_queue`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Served {
    /// A request was popped or completed.
    pub(super) worked: bool,
    /// The ring can be polled: it is not broken and does not wait for a
    /// command slot (its own wake-up, a driver reset or a free slot,
    /// brings it back).
    pub(super) pollable: bool,
}

impl Served {
    const NOTHING: Served = Served {
        worked: false,
        pollable: false,
    };
}

/// State owned by one queue's worker thread.
pub(super) struct QueueState {
    pub(super) index: usize,
    mem: Option<GM>,
    /// Scratch list of the current chain's buffers, reused.
    segs: Vec<Segment>,
    warned_ring: bool,
    warned_drop: bool,
    warned_signal: bool,
    health: RingHealth,
    /// The ring, checked against the memory table and translated to host
    /// pointers once; `None` after a memory change or a stop, so the next
    /// pass checks it again (a pass also checks it again when the ring's
    /// addresses or the memory table changed under it).
    ring: Option<SplitRing>,
    /// Kernel thread id of the worker serving this queue.
    worker_tid: Option<i32>,
    /// Requests in service, earliest deadline first.
    pending: BinaryHeap<Reverse<Pending>>,
    seq: u64,
    /// Fires at the earliest pending deadline.
    timer: DeadlineTimer,
    /// Latency sequences per op kind (read, write, flush, other).
    samplers: Vec<LatencySampler>,
    /// Where this queue starts looking in its tag pool's bitmap.
    tag_hint: u32,
    /// Since when the queue has been waiting for a slot.
    waiting_since: Option<Instant>,
    /// The queue's vring, kept to complete requests from `stop_vring`.
    vring: Option<KickCountingVring<GM>>,
    /// Fault injection decisions, counted per queue.
    faults: Option<RefCell<FaultState>>,
    /// Poll mode: the worker is polling this ring with notifications off.
    polling: bool,
    /// Poll mode: since when the ring has been found empty (the spin).
    idle_since: Option<Instant>,
    /// When the queue state was made: the deadline of requests served at
    /// once, which never wait for one (no clock read for them).
    epoch: Instant,
}

impl QueueState {
    /// Queue `index` of `disk`, before the guest has set it up.
    pub(super) fn new(index: usize, disk: &Disk) -> io::Result<QueueState> {
        let samplers = LatOp::ALL
            .iter()
            .map(|op| disk.cfg.latency.sampler(*op, disk.cfg.seed, index as u64))
            .collect();
        let tag_hint = disk.tag_slots[index]
            .as_ref()
            .map_or(0, |(p, id)| p.initial_hint(*id));
        Ok(QueueState {
            index,
            mem: None,
            segs: Vec::with_capacity(usize::from(disk.cfg.queue_size)),
            warned_ring: false,
            warned_drop: false,
            warned_signal: false,
            health: RingHealth::Usable,
            ring: None,
            worker_tid: None,
            pending: BinaryHeap::new(),
            seq: 0,
            timer: DeadlineTimer::new()?,
            samplers,
            tag_hint,
            waiting_since: None,
            vring: None,
            faults: (!disk.cfg.faults.is_empty())
                .then(|| RefCell::new(FaultState::new(&disk.cfg.faults))),
            polling: false,
            idle_since: None,
            epoch: Instant::now(),
        })
    }

    /// The guest memory the queue's ring lives in, once the frontend has
    /// sent a memory table.
    pub(super) fn memory(&self) -> Option<Arc<GuestMemoryMmap>> {
        self.mem.as_ref().map(|m| m.memory().into_inner())
    }

    /// A new memory table: the ring is checked against it at the next
    /// pass, and a ring broken by a part outside the old memory is served
    /// again, at once (a kick that came meanwhile was consumed while the
    /// ring could not be served).
    pub(super) fn new_memory(&mut self, mem: GM) {
        self.mem = Some(mem);
        self.ring = None;
        if self.health == RingHealth::BrokenByMemory {
            self.health = RingHealth::Usable;
            self.wake_now();
        }
    }

    /// The driver restarts the ring (GET_VRING_BASE): check it again at
    /// the next pass, and serve it again if it was broken.
    pub(super) fn restart(&mut self) {
        self.health = RingHealth::Usable;
        self.ring = None;
    }

    /// The driver broke the ring: not served until it resets it.
    pub(super) fn is_broken(&self) -> bool {
        self.health != RingHealth::Usable
    }

    /// Count an unusable ring in `st`, mark it broken (not served until the
    /// driver resets it) and say so once per queue (`socket` names the
    /// disk).
    pub(super) fn mark_broken(&mut self, st: &mut QueueStats, socket: &Path, why: &BrokenRing) {
        st.counters.ring_errors += 1;
        self.health = if why.by_memory() {
            RingHealth::BrokenByMemory
        } else {
            RingHealth::Broken
        };
        if !self.warned_ring {
            self.warned_ring = true;
            warn!(
                "{} queue {}: {why}; the queue is unusable until the driver resets it (further errors only counted)",
                socket.display(),
                self.index
            );
        }
    }

    /// Poll mode: the worker is polling this ring.
    pub(super) fn is_polling(&self) -> bool {
        self.polling
    }

    /// Poll mode: the worker polls this ring from now on.
    pub(super) fn start_polling(&mut self) {
        self.polling = true;
    }

    /// Poll mode: the worker no longer polls this ring; returns since when
    /// it had been spinning on it idle, if it had.
    pub(super) fn end_polling(&mut self) -> Option<Instant> {
        self.polling = false;
        self.idle_since.take()
    }

    /// Poll mode: the ring had work; returns since when it had been idle,
    /// if it had (that spin ended in a hit).
    pub(super) fn found_work(&mut self) -> Option<Instant> {
        self.idle_since.take()
    }

    /// Poll mode: the ring had no work at `now`; returns how long it has
    /// been idle (zero when this is the first look that found nothing).
    pub(super) fn found_idle(&mut self, now: Instant) -> Duration {
        now - *self.idle_since.get_or_insert(now)
    }

    /// Set the completion timer to fire at `at` (off for `None`).
    pub(super) fn set_timer(&mut self, at: Option<Instant>) {
        if let Err(e) = self.timer.set(at) {
            let what = if at.is_some() { "arm" } else { "stop" };
            warn!(
                "queue {}: cannot {what} the completion timer: {e}",
                self.index
            );
        }
    }

    /// The completion timer's fd, for the worker's epoll loop.
    pub(super) fn timer_fd(&self) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(&self.timer)
    }

    /// The completion timer woke the worker: clear its expiry.
    pub(super) fn acknowledge_timer(&mut self) {
        self.timer.acknowledge();
    }

    /// Whether the earliest request in service is due within `d` of `now`.
    pub(super) fn due_within(&self, now: Instant, d: Duration) -> bool {
        self.pending
            .peek()
            .is_some_and(|Reverse(p)| p.deadline <= now + d)
    }

    /// Drop the requests in service, giving their command slots back to
    /// `disk`'s pools (a shared pool must not shrink).
    pub(super) fn release_slots(&mut self, disk: &Disk) {
        for Reverse(p) in self.pending.drain() {
            disk.put_tag(self.index, p.tag);
        }
    }

    /// Come back to this queue as soon as the epoll loop has run.
    fn wake_now(&mut self) {
        self.set_timer(Some(Instant::now()));
    }

    /// Keep `vring`, to complete requests from `stop_vring`.
    fn keep_vring(&mut self, vring: &KickCountingVring<GM>) {
        if self.vring.is_none() {
            self.vring = Some(vring.clone());
        }
    }

    /// The kernel thread id of the worker serving this queue.
    fn worker_tid(&mut self) -> i32 {
        *self.worker_tid.get_or_insert_with(current_tid)
    }
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
    fn progressed(&self) -> bool {
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
    q.ring = Some(vq);
    Ok(out)
}

/// No command slot was free for the next request.
struct NoSlot;

impl<R: UsedRing> Pass<'_, R> {
    /// One look at the ring: turn guest notifications off (EVENT_IDX),
    /// complete the requests whose time has come, pop and execute what the
    /// guest made available, and notify the guest. Then, with EVENT_IDX
    /// and in [`Mode::Notify`], turn notifications back on and say whether
    /// to look again.
    pub(super) fn turn(&mut self, event_idx: bool, mode: Mode) -> Turn {
        if event_idx {
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
    pub(super) fn finish(&mut self, p: Pending, done: Option<u64>) {
        self.be.disk.put_tag(self.q.index, p.tag);
        if self.q.is_broken() {
            // The ring is not touched again until the driver resets it.
            return;
        }
        self.vq.add_used(p.head, p.used_len);
        self.used_added();
        if let Some(done) = done {
            self.st.completed(p.op, p.popped_at, done);
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
        let timed = self.st.histograms;
        // The last request served at once: its service time ends at the
        // next pop (or at the end of the pass).
        let mut served_at_once: Option<(Op, u64)> = None;
        let r = self.drain_timed(timed, &mut served_at_once);
        if let Some((op, at)) = served_at_once {
            self.st.served(op, at);
        }
        r
    }

    /// The drain: for each available chain, take a command slot, pop and
    /// serve the chain, and complete it at once or schedule its
    /// completion. `timed`: record service times (the statistics'
    /// histograms are on), `served_at_once` holding the last request
    /// completed at once.
    #[inline]
    fn drain_timed(&mut self, timed: bool, served_at_once: &mut Option<(Op, u64)>) -> Drained {
        let mut r = Drained {
            used: 0,
            popped: 0,
            stop: DrainStop::Empty,
        };
        let disk: &Disk = &self.be.disk;
        let slots = disk.tag_slots[self.q.index].as_ref();
        let no_latency = disk.cfg.latency.is_zero();
        loop {
            if let Some(stop) = self.stop_before_pop(r.popped) {
                r.stop = stop;
                return r;
            }
            let Ok(tag) = self.take_slot(slots) else {
                r.stop = DrainStop::NoSlot;
                return r;
            };
            let Some(head) = self.pop(tag) else {
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
            let used_len = self.account(outcome);
            let Outcome::Completed { op, fault, .. } = outcome else {
                // Malformed: returned at once, no emulated service time.
                disk.put_tag(self.q.index, tag);
                self.vq.add_used(head.head, 0);
                r.used += 1;
                self.used_added();
                continue;
            };
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
    fn stop_before_pop(&mut self, popped: u64) -> Option<DrainStop> {
        if self.q.is_broken() {
            return Some(DrainStop::Broken);
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
    #[inline]
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

    /// Pop the next chain into the queue's segment list, holding `tag`;
    /// `None` when the driver broke the ring (the slot is given back).
    #[inline]
    fn pop(&mut self, tag: Option<Tag>) -> Option<Popped> {
        match self.vq.pop(&mut self.q.segs) {
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
    #[inline]
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

/// What the turns of one wake-up did together.
struct Turns {
    /// Guest kicks that belong to this wake-up.
    kicks: u64,
    popped: u64,
    served: Served,
    /// The last turn stopped at the queue size with more available.
    bounded: bool,
}

impl Turns {
    /// Add what turn `t` did.
    #[inline]
    fn add(&mut self, t: &Turn) {
        let d = &t.drained;
        self.popped += d.popped;
        self.served.worked |= t.completed + d.used > 0 || d.popped > 0;
        self.served.pollable = !matches!(d.stop, DrainStop::Broken | DrainStop::NoSlot);
        self.bounded = d.stop == DrainStop::Bounded;
    }
}

impl BlkBackend {
    /// Serve one queue, woken by `wake`: complete requests whose time has
    /// come, pop and execute what the guest made available (as far as
    /// command slots allow), notify the guest, and re-arm the completion
    /// timer. In [`Mode::Poll`], one pass only, leaving guest
    /// notifications off (the worker goes on polling the ring).
    pub(super) fn serve_queue(
        &self,
        q: &mut QueueState,
        vring: &KickCountingVring<GM>,
        wake: Wake,
        mode: Mode,
    ) -> Served {
        let Some(mem) = q.memory() else {
            return Served::NOTHING;
        };
        q.keep_vring(vring);
        if q.is_broken() {
            // Not served until the driver resets it; a kick must not even
            // look at the ring.
            return Served::NOTHING;
        }
        let mut st = self.disk.queue_stats(q.index);
        st.set_worker(q.worker_tid());
        if wake != Wake::Kick {
            self.spin_to_deadline(q, &mut st);
        }
        let turns = self.turn_until_settled(q, &mut st, vring, &mem, mode);
        if q.is_broken() {
            drop(st);
            self.release_broken(q);
            return Served {
                worked: turns.served.worked,
                pollable: false,
            };
        }
        if wake == Wake::Kick || turns.kicks > 0 {
            st.wakeup(turns.kicks, turns.popped);
        }
        if mode == Mode::Poll && q.is_polling() {
            // The poll loop re-arms the timer when it stops polling.
            return turns.served;
        }
        self.arm_timer(q);
        if turns.bounded {
            // More is available: come back after the epoll loop has run
            // (messages, other queues, the exit event).
            q.wake_now();
        }
        turns.served
    }

    /// A wake-up other than a kick comes up to --latency-spin early: spin
    /// until the earliest completion is due, so completions follow their
    /// deadlines rather than the host's timer slack.
    fn spin_to_deadline(&self, q: &QueueState, st: &mut QueueStats) {
        let Some(Reverse(p)) = q.pending.peek() else {
            return;
        };
        let spin = self.disk.cfg.latency_spin();
        let now = Instant::now();
        if p.deadline > now && p.deadline - now <= spin {
            while Instant::now() < p.deadline {
                std::hint::spin_loop();
            }
            st.counters.latency_spin_ns += now.elapsed().as_nanos() as u64;
        }
    }

    /// Turn over the ring until it settles: in [`Mode::Notify`] with
    /// EVENT_IDX, look again while the guest added buffers before it saw
    /// the notifications back on. Counts the kicks of the wake-up.
    #[inline]
    fn turn_until_settled(
        &self,
        q: &mut QueueState,
        st: &mut QueueStats,
        vring: &KickCountingVring<GM>,
        mem: &Arc<GuestMemoryMmap>,
        mode: Mode,
    ) -> Turns {
        let mut turns = Turns {
            kicks: vring.take_kicks(),
            popped: 0,
            served: Served {
                worked: false,
                pollable: true,
            },
            bounded: false,
        };
        let event_idx = vring.get_ref().get_queue().event_idx_enabled();
        // Turns in a row that were told to look again and found nothing.
        let mut idle_agains = 0u32;
        loop {
            let mut vs = vring.get_mut();
            let Ok(t) = with_pass(self, q, st, &mut *vs, mem, |p| p.turn(event_idx, mode)) else {
                // The ring is not inside guest memory (checked once per
                // memory table or ring address change).
                turns.served.pollable = false;
                return turns;
            };
            turns.add(&t);
            if !t.again {
                return turns;
            }
            // A turn told to look again finds what the guest added after
            // the previous look, so two in a row finding nothing mean the
            // avail index moves without anything to pop: never spin on it.
            idle_agains = if t.progressed() { 0 } else { idle_agains + 1 };
            if idle_agains >= 2 {
                q.mark_broken(st, &self.disk.cfg.socket, &BrokenRing::AvailMovesEmpty);
                turns.served.pollable = false;
                return turns;
            }
            drop(vs);
            // Kicks the guest sent while we were serving belong to this
            // wake-up: count them before looking at the ring again.
            vring.collect_kicks();
            turns.kicks += vring.take_kicks();
        }
    }

    /// GET_VRING_BASE: put the requests in service whose deadline has come
    /// (all of them with `all`) on the used ring and signal the guest;
    /// returns the earliest deadline still pending.
    pub(super) fn complete_for_stop(&self, q: &mut QueueState, all: bool) -> Option<Instant> {
        if q.pending.is_empty() {
            return None;
        }
        let (Some(vring), Some(mem)) = (q.vring.clone(), q.memory()) else {
            self.release_broken(q);
            return None;
        };
        let mut st = self.disk.queue_stats(q.index);
        let mut vs = vring.get_mut();
        let now = Instant::now();
        let now_ticks = st.now();
        let done = with_pass(self, q, &mut st, &mut *vs, &mem, |pass| {
            let mut n = 0;
            while let Some(Reverse(p)) = pass.q.pending.peek().copied() {
                if !all && p.deadline > now {
                    break;
                }
                pass.q.pending.pop();
                pass.finish(p, Some(now_ticks));
                n += 1;
            }
            n
        });
        match done {
            Ok(n) if n > 0 && !q.is_broken() => {
                let _ = vs.signal_used_queue();
            }
            Ok(_) => {}
            Err(_) => {
                drop(vs);
                drop(st);
                self.release_broken(q);
                return None;
            }
        }
        q.pending.peek().map(|Reverse(p)| p.deadline)
    }

    /// A broken queue serves nothing more until the driver resets it: give
    /// its requests' command slots back (a shared pool must not shrink)
    /// and stop its completion timer.
    pub(super) fn release_broken(&self, q: &mut QueueState) {
        q.release_slots(&self.disk);
        q.end_polling();
        q.set_timer(None);
    }

    /// Arm queue `q`'s completion timer for its earliest deadline (off when
    /// nothing is pending), waking a little early to spin the rest (see
    /// --latency-spin).
    pub(super) fn arm_timer(&self, q: &mut QueueState) {
        let spin = self.disk.cfg.latency_spin();
        let next = q
            .pending
            .peek()
            .map(|Reverse(p)| p.deadline.checked_sub(spin).unwrap_or(p.deadline));
        q.set_timer(next);
    }
}

#[cfg(test)]
mod tests {
    //! The worker's pass driven in process: a `MockSplitQueue` (the
    //! driver's side of a split ring) over guest memory, the pass run on
    //! the `Queue` it describes, and the used ring, status bytes, data and
    //! queue counters read back. No socket, no threads.

    use std::cell::Cell;
    use std::sync::Arc;

    use virtio_bindings::virtio_blk::*;
    use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
    use virtio_queue::desc::split::Descriptor;
    use virtio_queue::desc::RawDescriptor;
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::{Bytes, GuestAddress};

    use super::*;
    use crate::device::config::DiskArgs;
    use crate::stats::queue::QueueCounters;

    const W: u16 = VRING_DESC_F_WRITE as u16;
    const N: u16 = VRING_DESC_F_NEXT as u16;
    const QSIZE: u16 = 64;
    const SERIAL: &str = "worker-test";

    /// The ring as the pass sees it: the queue the mock describes, and
    /// the guest notifications sent.
    struct MockRing {
        queue: Queue,
        signals: Cell<u32>,
        /// What the guest does when it is signalled (in the pass).
        on_signal: Option<Box<dyn Fn()>>,
    }

    impl UsedRing for MockRing {
        fn queue(&self) -> &Queue {
            &self.queue
        }

        fn queue_mut(&mut self) -> &mut Queue {
            &mut self.queue
        }

        fn signal_used_queue(&self) -> io::Result<()> {
            self.signals.set(self.signals.get() + 1);
            if let Some(f) = &self.on_signal {
                f();
            }
            Ok(())
        }
    }

    /// A one-queue backend on a 1 MiB mem disk, and 1 MiB of guest memory.
    struct Rig {
        be: BlkBackend,
        mem: Arc<GuestMemoryMmap>,
    }

    fn rig(extra: &[&str]) -> Rig {
        let mut a = vec![
            "--socket",
            "/tmp/w.sock",
            "--disk",
            "mem",
            "--size",
            "1M",
            "--serial",
            SERIAL,
        ];
        a.extend_from_slice(extra);
        let cfg = DiskArgs::parse_for_test(&a).to_configs().unwrap().remove(0);
        Rig {
            be: BlkBackend::new(Arc::new(Disk::open(cfg).unwrap())).unwrap(),
            mem: Arc::new(GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap()),
        }
    }

    impl Rig {
        /// Run the worker's pass over `ring` until it would wait for a
        /// kick (EVENT_IDX: until no buffer slipped in).
        fn serve(&self, ring: &mut MockRing) -> Vec<Turn> {
            let event_idx = ring.queue.event_idx_enabled();
            let mut q = self.be.lock_queue(0);
            let mut st = self.be.disk.queue_stats(0);
            let mut turns = Vec::new();
            loop {
                let Ok(t) = with_pass(&self.be, &mut q, &mut st, &mut *ring, &self.mem, |p| {
                    p.turn(event_idx, Mode::Notify)
                }) else {
                    // The ring is not inside guest memory.
                    return turns;
                };
                turns.push(t);
                if !t.again {
                    return turns;
                }
            }
        }

        fn counters(&self) -> QueueCounters {
            self.be.disk.queue_stats(0).counters.clone()
        }

        fn header(&self, at: u64, t: u32, sector: u64) {
            let mut h = [0u8; 16];
            h[0..4].copy_from_slice(&t.to_le_bytes());
            h[8..16].copy_from_slice(&sector.to_le_bytes());
            self.mem.write_slice(&h, GuestAddress(at)).unwrap();
        }

        fn range(&self, at: u64, sector: u64, num: u32, flags: u32) {
            let mut r = [0u8; 16];
            r[0..8].copy_from_slice(&sector.to_le_bytes());
            r[8..12].copy_from_slice(&num.to_le_bytes());
            r[12..16].copy_from_slice(&flags.to_le_bytes());
            self.mem.write_slice(&r, GuestAddress(at)).unwrap();
        }

        fn byte(&self, at: u64) -> u8 {
            self.mem.read_obj(GuestAddress(at)).unwrap()
        }

        fn bytes(&self, at: u64, len: usize) -> Vec<u8> {
            let mut b = vec![0; len];
            self.mem.read_slice(&mut b, GuestAddress(at)).unwrap();
            b
        }
    }

    /// The driver's side of queue 0: descriptors and avail entries.
    struct Driver<'m> {
        vq: MockSplitQueue<'m, GuestMemoryMmap>,
        mem: &'m GuestMemoryMmap,
        next_desc: u16,
        avail: u16,
    }

    impl<'m> Driver<'m> {
        fn new(mem: &'m GuestMemoryMmap) -> Driver<'m> {
            Driver {
                vq: MockSplitQueue::create(mem, GuestAddress(0), QSIZE),
                mem,
                next_desc: 0,
                avail: 0,
            }
        }

        /// The worker's view of the ring.
        fn ring(&self, event_idx: bool) -> MockRing {
            let mut queue: Queue = self.vq.create_queue().unwrap();
            // The mock lays its used ring over the end of its avail ring
            // (it adds the entry count, not their bytes): ours has its own
            // place.
            queue.try_set_used_ring_address(GuestAddress(USED)).unwrap();
            queue.set_event_idx(event_idx);
            MockRing {
                queue,
                signals: Cell::new(0),
                on_signal: None,
            }
        }

        fn desc(&self, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
            let d = RawDescriptor::from(Descriptor::new(addr, len, flags, next));
            self.vq.desc_table().store(i, d).unwrap();
        }

        /// Make the chain at `head` available.
        fn offer(&mut self, head: u16) {
            let slot = usize::from(self.avail % QSIZE);
            self.vq.avail().ring().ref_at(slot).unwrap().store(head);
            self.avail = self.avail.wrapping_add(1);
            self.vq.avail().idx().store(self.avail);
        }

        /// Add a chain of (address, length, flags) descriptors, linked in
        /// order, and make it available; returns its head.
        fn push(&mut self, descs: &[(u64, u32, u16)]) -> u16 {
            let head = self.next_desc;
            for (i, &(addr, len, flags)) in descs.iter().enumerate() {
                let idx = head + i as u16;
                let more = if i + 1 < descs.len() { N } else { 0 };
                self.desc(idx, addr, len, flags | more, idx + 1);
            }
            self.next_desc += descs.len() as u16;
            self.offer(head);
            head
        }

        /// The used ring: (head, length) of each entry, in order.
        fn used(&self) -> Vec<(u32, u32)> {
            let n: u16 = self.mem.read_obj(GuestAddress(USED + 2)).unwrap();
            (0..n)
                .map(|i| {
                    let at = USED + 4 + 8 * u64::from(i % QSIZE);
                    let id: u32 = self.mem.read_obj(GuestAddress(at)).unwrap();
                    let len: u32 = self.mem.read_obj(GuestAddress(at + 4)).unwrap();
                    (id, len)
                })
                .collect()
        }

        /// The driver's `used_event` (the avail ring's last field).
        fn set_used_event(&self, idx: u16) {
            let at = self.vq.avail_addr().0 + 4 + 2 * u64::from(QSIZE);
            self.mem.write_obj(idx, GuestAddress(at)).unwrap();
        }

        /// The device's `avail_event` (the used ring's last field).
        fn avail_event(&self) -> u16 {
            let at = USED + 4 + 8 * u64::from(QSIZE);
            self.mem.read_obj(GuestAddress(at)).unwrap()
        }
    }

    // Guest memory layout: the ring below 0x1000, request headers at
    // HDR + 0x20 * k, status bytes at STATUS + k, data from 0x10000.
    const HDR: u64 = 0x1000;
    /// The used ring (the mock's descriptor table and avail ring end at
    /// 0x486).
    const USED: u64 = 0x800;
    const STATUS: u64 = 0x2000;

    fn hdr_at(k: u64) -> u64 {
        HDR + 0x20 * k
    }

    fn st_at(k: u64) -> u64 {
        STATUS + k
    }

    #[test]
    fn one_pass_serves_every_request_type() {
        let r = rig(&[]);
        let mut d = Driver::new(&r.mem);
        r.mem
            .write_slice(&[0x5a; 4096], GuestAddress(0x10000))
            .unwrap();
        // Poison the status bytes and the read buffers.
        r.mem.write_slice(&[0xee; 8], GuestAddress(STATUS)).unwrap();
        r.mem
            .write_slice(&[0xee; 4096], GuestAddress(0x20000))
            .unwrap();
        let mut heads = Vec::new();
        // 0: write 4 KiB at sector 8.
        r.header(hdr_at(0), VIRTIO_BLK_T_OUT, 8);
        heads.push(d.push(&[(hdr_at(0), 16, 0), (0x10000, 4096, 0), (st_at(0), 1, W)]));
        // 1: read it back into two buffers.
        r.header(hdr_at(1), VIRTIO_BLK_T_IN, 8);
        heads.push(d.push(&[
            (hdr_at(1), 16, 0),
            (0x20000, 1024, W),
            (0x20400, 3072, W),
            (st_at(1), 1, W),
        ]));
        // 2: flush.
        r.header(hdr_at(2), VIRTIO_BLK_T_FLUSH, 0);
        heads.push(d.push(&[(hdr_at(2), 16, 0), (st_at(2), 1, W)]));
        // 3: get-id.
        r.header(hdr_at(3), VIRTIO_BLK_T_GET_ID, 0);
        heads.push(d.push(&[(hdr_at(3), 16, 0), (0x30000, 20, W), (st_at(3), 1, W)]));
        // 4: discard sector 8; 5: write zeroes over sectors 10..12.
        r.header(hdr_at(4), VIRTIO_BLK_T_DISCARD, 0);
        r.range(0x31000, 8, 1, 0);
        heads.push(d.push(&[(hdr_at(4), 16, 0), (0x31000, 16, 0), (st_at(4), 1, W)]));
        r.header(hdr_at(5), VIRTIO_BLK_T_WRITE_ZEROES, 0);
        r.range(0x31010, 10, 2, VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP);
        heads.push(d.push(&[(hdr_at(5), 16, 0), (0x31010, 16, 0), (st_at(5), 1, W)]));
        // 6: read the 4 KiB again.
        r.header(hdr_at(6), VIRTIO_BLK_T_IN, 8);
        heads.push(d.push(&[(hdr_at(6), 16, 0), (0x40000, 4096, W), (st_at(6), 1, W)]));

        let mut ring = d.ring(false);
        let turns = r.serve(&mut ring);
        assert_eq!(turns.len(), 1);
        assert_eq!(
            turns[0].drained,
            Drained {
                used: 7,
                popped: 7,
                stop: DrainStop::Empty,
            }
        );

        // Every chain on the used ring, in pop order, with the bytes
        // written into it (data + status).
        let lens = [1, 4097, 1, 21, 1, 1, 4097];
        let want: Vec<(u32, u32)> = heads
            .iter()
            .zip(lens)
            .map(|(h, l)| (u32::from(*h), l))
            .collect();
        assert_eq!(d.used(), want);
        for k in 0..7 {
            assert_eq!(r.byte(st_at(k)), STATUS_OK, "request {k}");
        }
        assert_eq!(r.byte(st_at(7)), 0xee, "no stray status write");

        // The data.
        assert!(r.bytes(0x20000, 4096).iter().all(|b| *b == 0x5a));
        let id = r.bytes(0x30000, 20);
        assert_eq!(&id[..SERIAL.len()], SERIAL.as_bytes());
        assert!(id[SERIAL.len()..].iter().all(|b| *b == 0));
        let after = r.bytes(0x40000, 4096);
        assert!(after[..512].iter().all(|b| *b == 0), "discarded");
        assert!(after[512..1024].iter().all(|b| *b == 0x5a));
        assert!(after[1024..2048].iter().all(|b| *b == 0), "zeroed");
        assert!(after[2048..].iter().all(|b| *b == 0x5a));

        // The counters, and one notification for the pass (no EVENT_IDX).
        let c = r.counters();
        assert_eq!(c.requests, 7);
        assert_eq!(
            (
                c.reads,
                c.writes,
                c.flushes,
                c.get_ids,
                c.discards,
                c.write_zeroes,
                c.other
            ),
            (2, 1, 1, 1, 1, 1, 0)
        );
        assert_eq!((c.bytes_read, c.bytes_written), (8192, 4096));
        assert_eq!((c.status_ioerr, c.status_unsupp), (0, 0));
        assert_eq!((c.dropped, c.ring_errors), (0, 0));
        assert_eq!((c.notifications, c.notifications_suppressed), (1, 0));
        assert_eq!(ring.signals.get(), 1);

        // Nothing new: the next pass pops nothing and signals nothing.
        let t = r.serve(&mut ring);
        assert_eq!(t[0].drained.popped, 0);
        assert_eq!(ring.signals.get(), 1);
    }

    #[test]
    fn errors_are_answered_with_their_status_and_counted() {
        let r = rig(&[]);
        let cap = r.be.disk.cfg.size / 512;
        let mut d = Driver::new(&r.mem);
        r.mem
            .write_slice(&[0x33; 512], GuestAddress(0x10000))
            .unwrap();
        let expect = [
            // An out-of-range sector, a read straddling the end, a write
            // whose sector * 512 overflows.
            (VIRTIO_BLK_T_IN, cap, 512u32, W, STATUS_IOERR),
            (VIRTIO_BLK_T_IN, cap - 1, 1024, W, STATUS_IOERR),
            (VIRTIO_BLK_T_OUT, u64::MAX / 256, 512, 0, STATUS_IOERR),
            // A length that is not whole sectors.
            (VIRTIO_BLK_T_IN, 0, 100, W, STATUS_IOERR),
            // A type the device does not implement.
            (0x55, 0, 512, W, STATUS_UNSUPP),
        ];
        for (k, (t, sector, len, flags, _)) in expect.iter().enumerate() {
            let k = k as u64;
            r.header(hdr_at(k), *t, *sector);
            d.push(&[
                (hdr_at(k), 16, 0),
                (0x10000, *len, *flags),
                (st_at(k), 1, W),
            ]);
        }
        // A short header (malformed, but with a status byte).
        r.header(hdr_at(5), VIRTIO_BLK_T_IN, 0);
        d.push(&[(hdr_at(5), 8, 0), (st_at(5), 1, W)]);
        // Read data outside guest memory.
        r.header(hdr_at(6), VIRTIO_BLK_T_IN, 0);
        d.push(&[
            (hdr_at(6), 16, 0),
            (0x1_0000_0000, 512, W),
            (st_at(6), 1, W),
        ]);

        let mut ring = d.ring(false);
        r.serve(&mut ring);
        let used = d.used();
        assert_eq!(used.len(), 7);
        assert!(used.iter().all(|(_, len)| *len == 1), "{used:?}");
        for (k, (.., status)) in expect.iter().enumerate() {
            assert_eq!(r.byte(st_at(k as u64)), *status, "request {k}");
        }
        assert_eq!(r.byte(st_at(5)), STATUS_IOERR);
        assert_eq!(r.byte(st_at(6)), STATUS_IOERR);
        // Nothing was read into the guest or written to the disk.
        assert!(r.bytes(0x10000, 512).iter().all(|b| *b == 0x33));
        let c = r.counters();
        assert_eq!(c.requests, 7);
        assert_eq!((c.reads, c.writes, c.other), (4, 1, 2));
        assert_eq!((c.status_ioerr, c.status_unsupp), (6, 1));
        assert_eq!((c.bytes_read, c.bytes_written, c.dropped), (0, 0, 0));
    }

    #[test]
    fn unanswerable_chains_are_returned_and_counted() {
        let r = rig(&[]);
        let mut d = Driver::new(&r.mem);
        r.mem.write_slice(&[0xee; 8], GuestAddress(STATUS)).unwrap();
        for k in 0..5 {
            r.header(hdr_at(k), VIRTIO_BLK_T_IN, 0);
        }
        let mut heads = Vec::new();
        // The status byte in a device-readable descriptor.
        heads.push(d.push(&[(hdr_at(0), 16, 0), (0x10000, 512, W), (st_at(0), 1, 0)]));
        // A zero-length status descriptor.
        heads.push(d.push(&[(hdr_at(1), 16, 0), (0x10000, 512, W), (st_at(1), 0, W)]));
        // The status byte outside guest memory.
        heads.push(d.push(&[(hdr_at(2), 16, 0), (0x1_0000_0000, 1, W)]));
        // A chain that loops: a -> b -> a -> ...
        let a = d.next_desc;
        d.desc(a, hdr_at(3), 16, N, a + 1);
        d.desc(a + 1, st_at(3), 1, W | N, a);
        d.next_desc += 2;
        d.offer(a);
        heads.push(a);
        // And a good request after them: the ring is still usable.
        heads.push(d.push(&[(hdr_at(4), 16, 0), (0x10000, 512, W), (st_at(4), 1, W)]));

        let mut ring = d.ring(false);
        let turns = r.serve(&mut ring);
        assert_eq!((turns[0].drained.popped, turns[0].drained.used), (5, 5));
        let want: Vec<(u32, u32)> = heads
            .iter()
            .zip([0, 0, 0, 0, 513])
            .map(|(h, l)| (u32::from(*h), l))
            .collect();
        assert_eq!(d.used(), want);
        // No status written for the dropped chains (the looping one's
        // status descriptor claims more follow).
        for k in 0..4 {
            assert_eq!(r.byte(st_at(k)), 0xee, "chain {k}");
        }
        assert_eq!(r.byte(st_at(4)), STATUS_OK);
        let c = r.counters();
        assert_eq!((c.dropped, c.requests, c.reads), (4, 1, 1));
        assert_eq!((c.ring_errors, c.status_ioerr), (0, 0));
    }

    #[test]
    fn event_idx_signals_once_per_used_event() {
        let r = rig(&[]);
        let mut d = Driver::new(&r.mem);
        let push_flushes = |d: &mut Driver, n: u64| {
            for k in 0..n {
                r.header(hdr_at(k), VIRTIO_BLK_T_FLUSH, 0);
                d.push(&[(hdr_at(k), 16, 0), (st_at(k), 1, W)]);
            }
        };
        push_flushes(&mut d, 4);
        let mut ring = d.ring(true);
        // used_event 0: the first used entry crosses it, the rest do not.
        let turns = r.serve(&mut ring);
        assert_eq!(turns.len(), 1, "nothing slipped in");
        assert_eq!(d.used().len(), 4);
        let c = r.counters();
        assert_eq!((c.notifications, c.notifications_suppressed), (1, 3));
        assert_eq!(ring.signals.get(), 1);
        // Notifications were turned back on at the next avail index.
        assert_eq!(d.avail_event(), 4);

        // The driver asks to hear when the used index passes 5.
        d.set_used_event(5);
        push_flushes(&mut d, 4);
        r.serve(&mut ring);
        assert_eq!(d.used().len(), 8);
        let c = r.counters();
        assert_eq!((c.notifications, c.notifications_suppressed), (2, 6));
        assert_eq!(ring.signals.get(), 2);
        assert_eq!(d.avail_event(), 8);
    }

    #[test]
    fn emulated_latency_holds_the_used_entry_until_its_deadline() {
        let r = rig(&["--latency", "20ms"]);
        let mut d = Driver::new(&r.mem);
        r.header(hdr_at(0), VIRTIO_BLK_T_IN, 0);
        let head = d.push(&[(hdr_at(0), 16, 0), (0x10000, 512, W), (st_at(0), 1, W)]);
        let mut ring = d.ring(false);
        let t = r.serve(&mut ring);
        // Executed (status written, counted), not yet on the used ring.
        assert_eq!((t[0].drained.popped, t[0].drained.used), (1, 0));
        assert_eq!(r.byte(st_at(0)), STATUS_OK);
        assert!(d.used().is_empty());
        assert_eq!(ring.signals.get(), 0);
        assert_eq!(r.be.lock_queue(0).pending.len(), 1);
        assert_eq!(r.counters().reads, 1);

        std::thread::sleep(std::time::Duration::from_millis(25));
        let t = r.serve(&mut ring);
        assert_eq!(t[0].completed, 1);
        assert_eq!(d.used(), vec![(u32::from(head), 513)]);
        assert_eq!(ring.signals.get(), 1);
        assert!(r.be.lock_queue(0).pending.is_empty());
    }

    #[test]
    fn injected_failures_are_ioerr_and_counted() {
        let r = rig(&["--fail-every", "2:read"]);
        let mut d = Driver::new(&r.mem);
        for k in 0..4 {
            r.header(hdr_at(k), VIRTIO_BLK_T_IN, 0);
            d.push(&[(hdr_at(k), 16, 0), (0x10000, 512, W), (st_at(k), 1, W)]);
        }
        let mut ring = d.ring(false);
        r.serve(&mut ring);
        let statuses: Vec<u8> = (0..4).map(|k| r.byte(st_at(k))).collect();
        assert_eq!(statuses, [STATUS_OK, STATUS_IOERR, STATUS_OK, STATUS_IOERR]);
        let lens: Vec<u32> = d.used().iter().map(|(_, l)| *l).collect();
        assert_eq!(lens, [513, 1, 513, 1]);
        let c = r.counters();
        assert_eq!((c.injected_fail_every, c.status_ioerr), (2, 2));
        assert_eq!((c.reads, c.bytes_read), (4, 1024));
    }

    #[test]
    fn a_broken_avail_ring_is_counted_and_not_served() {
        let r = rig(&[]);
        let d = Driver::new(&r.mem);
        // The avail index jumps further than the queue holds.
        d.vq.avail().idx().store(QSIZE + 1);
        let mut ring = d.ring(true);
        let t = r.serve(&mut ring);
        assert_eq!(
            t[0].drained,
            Drained {
                used: 0,
                popped: 0,
                stop: DrainStop::Broken,
            }
        );
        assert!(!t[0].again);
        assert!(d.used().is_empty());
        let c = r.counters();
        assert_eq!((c.ring_errors, c.requests, c.dropped), (1, 0, 0));
    }

    #[test]
    fn a_head_beyond_the_queue_size_breaks_the_queue() {
        let r = rig(&[]);
        let mut d = Driver::new(&r.mem);
        r.header(hdr_at(0), VIRTIO_BLK_T_FLUSH, 0);
        d.offer(QSIZE + 3);
        d.push(&[(hdr_at(0), 16, 0), (st_at(0), 1, W)]);
        let mut ring = d.ring(true);
        let t = r.serve(&mut ring);
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].drained.stop, DrainStop::Broken);
        assert!(d.used().is_empty());
        assert!(r.be.lock_queue(0).is_broken());
        // Broken until the driver resets it: the good request after it is
        // not served, and nothing more is counted.
        let t = r.serve(&mut ring);
        assert_eq!(
            (t[0].drained.popped, t[0].drained.stop),
            (0, DrainStop::Broken)
        );
        assert!(d.used().is_empty());
        let c = r.counters();
        assert_eq!((c.ring_errors, c.requests, c.dropped), (1, 0, 0));
    }

    /// A driver that re-offers every completed chain as soon as it is
    /// signalled, inside the pass (what a used ring laid over the avail
    /// ring does by itself): one pass pops a queue size and says it
    /// stopped with more available.
    #[test]
    fn a_pass_pops_at_most_a_queue_size() {
        let r = rig(&[]);
        let d = Driver::new(&r.mem);
        r.header(hdr_at(0), VIRTIO_BLK_T_FLUSH, 0);
        d.desc(0, hdr_at(0), 16, N, 1);
        d.desc(1, st_at(0), 1, W, 0);
        let avail = d.vq.avail_addr().0;
        let mut ring = d.ring(true);
        let mem = r.mem.clone();
        // Every avail slot holds head 0 (the mock zeroed them); after each
        // used entry the avail index is one ahead again, and used_event
        // asks for a signal on the next entry.
        let reoffer = move || {
            let u: u16 = mem.read_obj(GuestAddress(USED + 2)).unwrap();
            mem.write_obj(u, GuestAddress(avail + 4 + 2 * u64::from(QSIZE)))
                .unwrap();
            mem.write_obj(u.wrapping_add(1), GuestAddress(avail + 2))
                .unwrap();
        };
        reoffer();
        ring.on_signal = Some(Box::new(reoffer));
        let t = r.serve(&mut ring);
        assert_eq!(t.len(), 1, "{t:?}");
        let dr = t[0].drained;
        assert_eq!((dr.popped, dr.used), (u64::from(QSIZE), usize::from(QSIZE)));
        assert_eq!(dr.stop, DrainStop::Bounded, "{dr:?}");
        assert!(!t[0].again);
        // The next pass takes the next queue size.
        let t = r.serve(&mut ring);
        assert_eq!(t[0].drained.popped, u64::from(QSIZE));
        assert_eq!(r.counters().flushes, 2 * u64::from(QSIZE));
    }
}
