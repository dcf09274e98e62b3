//! A queue's worker state: what one queue's worker keeps between passes
//! (the checked ring, the requests in service, the memory table, the
//! completion timer, poll-mode bookkeeping), and the methods that name
//! what happens to it (a new memory table, a restart, a broken ring).
//!
//! Its fields are the worker's own (`worker/`); the rest of the backend
//! goes through its methods. It does not know how a pass is run.

use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use log::{info, warn};
use vm_memory::{GuestAddressSpace, GuestMemoryMmap};

use crate::backend::deadline::{DeadlineTimer, TimerLead};
use crate::backend::kick_vring::KickCountingVring;
use crate::backend::poll_window::PollWindow;
use crate::backend::{Disk, GM};
use crate::device::faults::FaultState;
use crate::device::latency::{LatOp, LatencySampler};
use crate::device::polling::PollMode;
use crate::device::tags::Tag;
use crate::stats::queue::{current_tid, QueueStats};
use crate::virtio_blk::request::{Op, Segment};
use crate::virtq::inflight::{InflightQueue, Recovered};
use crate::virtq::split_ring::{RingError, SplitRing};

/// A request in service: executed, waiting for its emulated completion time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pending {
    pub(super) deadline: Instant,
    /// Pop order, to keep completions with equal deadlines in order.
    pub(super) seq: u64,
    pub(super) head: u16,
    pub(super) used_len: u32,
    pub(super) op: Op,
    /// Pop time in ticks of the queue statistics' clock
    /// ([`QueueStats::popped`]; 0 without statistics).
    pub(super) popped_at: u64,
    pub(super) tag: Option<Tag>,
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
pub(crate) enum BrokenRing {
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

/// The queue's region of the inflight area (INFLIGHT_SHMFD), and what the
/// ring's start found in it.
pub(crate) struct Inflight {
    pub(super) area: InflightQueue,
    /// The region was read since the ring last started.
    checked: bool,
    /// Heads a previous back-end took and never put on the used ring, to
    /// serve again before anything new, in the order they were taken.
    pub(super) resubmit: VecDeque<u16>,
}

/// State owned by one queue's worker thread.
pub(crate) struct QueueState {
    pub(crate) index: usize,
    mem: Option<GM>,
    /// Scratch list of the current chain's buffers, reused.
    pub(super) segs: Vec<Segment>,
    warned_ring: bool,
    pub(super) warned_drop: bool,
    pub(super) warned_signal: bool,
    health: RingHealth,
    /// The ring, checked against the memory table and translated to host
    /// pointers once; `None` after a memory change or a stop, so the next
    /// pass checks it again (a pass also checks it again when the ring's
    /// addresses or the memory table changed under it).
    pub(super) ring: Option<SplitRing>,
    /// Kernel thread id of the worker serving this queue.
    worker_tid: Option<i32>,
    /// Requests in service, earliest deadline first.
    pub(super) pending: BinaryHeap<Reverse<Pending>>,
    pub(super) seq: u64,
    /// Fires at the earliest pending deadline.
    timer: DeadlineTimer,
    /// Latency sequences per op kind (read, write, flush, other).
    pub(super) samplers: Vec<LatencySampler>,
    /// Where this queue starts looking in its tag pool's bitmap.
    pub(super) tag_hint: u32,
    /// Since when the queue has been waiting for a slot.
    pub(super) waiting_since: Option<Instant>,
    /// The queue's vring, kept to complete requests from `stop_vring`.
    pub(super) vring: Option<KickCountingVring<GM>>,
    /// Fault injection decisions, counted per queue.
    pub(super) faults: Option<RefCell<FaultState>>,
    /// Poll mode: the worker is polling this ring with notifications off.
    polling: bool,
    /// Poll mode: since when the ring has been found empty (the spin).
    idle_since: Option<Instant>,
    /// Adaptive polling: how long an idle ring is polled.
    window: Option<PollWindow>,
    /// Adaptive polling: since when the queue has waited for the guest's
    /// next request (the first look that found its ring empty after the
    /// worker last popped or completed), asleep or not.
    guest_wait_since: Option<Instant>,
    /// Adaptive polling: how early the completion timer is armed.
    lead: Option<TimerLead>,
    /// When the queue state was made: the deadline of requests served at
    /// once, which never wait for one (no clock read for them).
    pub(super) epoch: Instant,
    /// Where the requests taken off the ring are recorded for the next
    /// back-end, when the frontend gave an area.
    pub(super) inflight: Option<Inflight>,
    /// The ring has been served since it (last) started: the disk's image
    /// was checked to be ours to serve (see `backend/handover.rs`).
    pub(super) serving: bool,
}

impl QueueState {
    /// Queue `index` of `disk`, before the guest has set it up.
    pub(crate) fn new(index: usize, disk: &Disk) -> io::Result<QueueState> {
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
            window: match disk.cfg.poll_mode() {
                PollMode::Adaptive { max } => Some(PollWindow::new(max)),
                _ => None,
            },
            guest_wait_since: None,
            lead: match disk.cfg.poll_mode() {
                PollMode::Adaptive { max } => Some(TimerLead::new(max)),
                _ => None,
            },
            epoch: Instant::now(),
            inflight: None,
            serving: false,
        })
    }

    /// SET_INFLIGHT_FD: record this queue's requests in `area` (none when
    /// the area has no region for it); read it when the ring next starts.
    pub(crate) fn set_inflight(&mut self, area: Option<InflightQueue>) {
        self.inflight = area.map(|area| Inflight {
            area,
            checked: false,
            resubmit: VecDeque::new(),
        });
    }

    /// Whether the ring's start has yet to read the inflight area.
    #[inline]
    pub(super) fn inflight_unread(&self) -> bool {
        self.inflight.as_ref().is_some_and(|i| !i.checked)
    }

    /// The ring `vq` starts: take up what the previous back-end left in
    /// the inflight area (heads to serve again, the next avail index).
    #[cold]
    #[inline(never)]
    pub(super) fn resume_inflight(&mut self, vq: &mut SplitRing, socket: &Path) {
        let index = self.index;
        let Some(inf) = self.inflight.as_mut() else {
            return;
        };
        inf.checked = true;
        let used = vq.used_idx_in_memory();
        match inf.area.recover(vq.size(), used, |i| vq.used_id_at(i)) {
            Recovered::Fresh => {}
            Recovered::Resume { heads, next_avail } => {
                if !heads.is_empty() {
                    info!(
                        "{} queue {index}: serving again {} request(s) a previous back-end left in flight",
                        socket.display(),
                        heads.len()
                    );
                }
                vq.next_avail = std::num::Wrapping(next_avail);
                vq.next_used = used;
                inf.resubmit = heads.into();
            }
            Recovered::Reset {
                capacity,
                ring_size,
            } => warn!(
                "{} queue {index}: the inflight area was laid out for {capacity} descriptors, the ring has {ring_size}: started afresh{}",
                socket.display(),
                if ring_size > capacity { ", requests not tracked" } else { "" }
            ),
        }
    }

    /// The guest memory the queue's ring lives in, once the frontend has
    /// sent a memory table.
    #[inline]
    pub(crate) fn memory(&self) -> Option<Arc<GuestMemoryMmap>> {
        self.mem.as_ref().map(|m| m.memory().into_inner())
    }

    /// A new memory table: the ring is checked against it at the next
    /// pass, and a ring broken by a part outside the old memory is served
    /// again, at once (a kick that came meanwhile was consumed while the
    /// ring could not be served).
    pub(crate) fn new_memory(&mut self, mem: GM) {
        self.mem = Some(mem);
        self.ring = None;
        if self.health == RingHealth::BrokenByMemory {
            self.health = RingHealth::Usable;
            self.wake_now();
        }
    }

    /// The driver restarts the ring (GET_VRING_BASE): check it again at
    /// the next pass, and serve it again if it was broken.
    pub(crate) fn restart(&mut self) {
        self.health = RingHealth::Usable;
        self.ring = None;
        if let Some(inf) = self.inflight.as_mut() {
            inf.checked = false;
            inf.resubmit.clear();
        }
        self.serving = false;
    }

    /// Whether the ring has been served since it (last) started.
    pub(crate) fn serving(&self) -> bool {
        self.serving
    }

    /// The driver broke the ring: not served until it resets it.
    #[inline]
    pub(crate) fn is_broken(&self) -> bool {
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
    #[inline]
    pub(crate) fn is_polling(&self) -> bool {
        self.polling
    }

    /// Poll mode: the worker polls this ring from now on.
    pub(crate) fn start_polling(&mut self) {
        self.polling = true;
    }

    /// Poll mode: the worker no longer polls this ring; returns since when
    /// it had been spinning on it idle, if it had.
    pub(crate) fn end_polling(&mut self) -> Option<Instant> {
        self.polling = false;
        self.idle_since.take()
    }

    /// Poll mode: the ring had work; returns since when it had been idle,
    /// if it had (that spin ended in a hit).
    pub(crate) fn found_work(&mut self) -> Option<Instant> {
        self.idle_since.take()
    }

    /// Poll mode: the ring had no work at `now`; returns how long it has
    /// been idle (zero when this is the first look that found nothing).
    pub(crate) fn found_idle(&mut self, now: Instant) -> Duration {
        self.guest_wait_since.get_or_insert(now);
        now - *self.idle_since.get_or_insert(now)
    }

    /// Adaptive polling: how long to poll the ring once it is idle
    /// (`None` in the other modes).
    pub(crate) fn poll_window(&self) -> Option<Duration> {
        self.window.map(|w| w.window())
    }

    /// Adaptive polling: a pass at `now` popped or completed requests
    /// (`arrived`: it popped some). The wait for the guest ends; when the
    /// guest's requests ended it, the window adjusts to how long it was.
    /// Returns the window the wait had.
    pub(crate) fn waited(&mut self, now: Instant, arrived: bool) -> Option<Duration> {
        let since = self.guest_wait_since.take()?;
        let w = self.window.as_mut().filter(|_| arrived)?;
        let had = w.window();
        w.adjust(now.saturating_duration_since(since));
        Some(had)
    }

    /// How early the completion timer is armed: `spin` (`--latency-spin`),
    /// or in adaptive mode the timer's learned lateness if that is more.
    pub(crate) fn timer_early(&self, spin: Duration) -> Duration {
        self.lead.map_or(spin, |l| l.lead().max(spin))
    }

    /// Set the completion timer to fire at `at` (off for `None`).
    pub(crate) fn set_timer(&mut self, at: Option<Instant>) {
        if let Err(e) = self.timer.set(at) {
            let what = if at.is_some() { "arm" } else { "stop" };
            warn!(
                "queue {}: cannot {what} the completion timer: {e}",
                self.index
            );
        }
    }

    /// The completion timer's fd, for the worker's epoll loop.
    pub(crate) fn timer_fd(&self) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(&self.timer)
    }

    /// The completion timer woke the worker at `now`: clear its expiry
    /// and, in adaptive mode, learn from how late it was.
    pub(crate) fn acknowledge_timer(&mut self, now: Instant) {
        if let (Some(armed), Some(lead)) = (self.timer.acknowledge(), self.lead.as_mut()) {
            lead.observe(now.saturating_duration_since(armed));
        }
    }

    /// Whether the earliest request in service is due within `d` of `now`.
    pub(crate) fn due_within(&self, now: Instant, d: Duration) -> bool {
        self.pending
            .peek()
            .is_some_and(|Reverse(p)| p.deadline <= now + d)
    }

    /// Drop the requests in service, giving their command slots back to
    /// `disk`'s pools (a shared pool must not shrink).
    pub(crate) fn release_slots(&mut self, disk: &Disk) {
        for Reverse(p) in self.pending.drain() {
            disk.put_tag(self.index, p.tag);
        }
    }

    /// Come back to this queue as soon as the epoll loop has run.
    pub(super) fn wake_now(&mut self) {
        self.set_timer(Some(Instant::now()));
    }

    /// Keep `vring`, to complete requests from `stop_vring`.
    #[inline]
    pub(super) fn keep_vring(&mut self, vring: &KickCountingVring<GM>) {
        if self.vring.is_none() {
            self.vring = Some(vring.clone());
        }
    }

    /// The kernel thread id of the worker serving this queue.
    #[inline]
    pub(super) fn worker_tid(&mut self) -> i32 {
        *self.worker_tid.get_or_insert_with(current_tid)
    }
}
