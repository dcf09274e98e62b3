//! The vhost-user-blk device: a `&self` [`VhostUserBackend`] with per-queue
//! state, so each queue's worker thread runs without a shared lock.
//!
//! One [`Disk`] (configuration + storage) lives for the whole process; one
//! [`BlkBackend`] is created per vhost-user connection and shares the disk,
//! so data survives reconnects while ring state starts fresh.

pub mod control;
pub mod deadline;
pub mod kick_vring;
pub mod qemu_args;
pub mod server;

use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io;
use std::os::unix::io::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use log::{debug, info, warn};
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::{VhostUserBackend, VringEpollHandler, VringT};
use virtio_bindings::virtio_blk::VIRTIO_BLK_F_FLUSH;
use virtio_queue::{QueueOwnedT, QueueT};
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};
use vmm_sys_util::eventfd::EventFd;

use crate::backend::deadline::DeadlineTimer;
use crate::backend::kick_vring::KickCountingVring;
use crate::device::config::{DiskConfig, TagMode, TagScope};
use crate::device::config_space;
use crate::device::execute::{serve_chain, Device, Outcome};
use crate::device::faults::{FaultDecision, FaultState};
use crate::device::latency::{LatOp, LatencySampler};
use crate::device::storage::{self, Storage, StorageError};
use crate::device::tags::{PoolStats, QueueId, Tag, TagPool};
use crate::stats::queue::{current_tid, QueueCounters, QueueStats};
use crate::virtio_blk::features::BlkFeature;
use crate::virtio_blk::request::{Op, Segment, STATUS_IOERR, STATUS_OK, STATUS_UNSUPP};

type GM = GuestMemoryAtomic<GuestMemoryMmap>;

/// A served disk: its configuration and contents, shared by every
/// connection for the life of the process.
pub struct Disk {
    pub cfg: DiskConfig,
    pub storage: Box<dyn Storage>,
    /// Per-queue statistics, for the life of the process. Each is locked by
    /// its queue's worker once per wake-up, and by readers.
    pub stats: Vec<Mutex<QueueStats>>,
    /// The guest-visible `writeback` config byte (CONFIG_WCE).
    writeback: AtomicBool,
    /// Each queue's command-slot pool and its id in it (none without
    /// `--tags`). Per-queue pools are private; a shared pool is the same
    /// `Arc` for every queue of the disk (or of the host).
    tag_slots: Vec<Option<(Arc<TagPool>, QueueId)>>,
    /// Each queue's wake-up eventfd, written by its pool when slots free.
    tag_wakers: Vec<Arc<EventFd>>,
}

impl Disk {
    /// Open the disk's storage (file disks without a size take the image's).
    pub fn open(cfg: DiskConfig) -> Result<Disk, StorageError> {
        Self::open_with_host_pool(cfg, None)
    }

    /// As [`Disk::open`]; `host_pool` is the process-wide pool used when the
    /// disk's tags are shared with host scope.
    pub fn open_with_host_pool(
        mut cfg: DiskConfig,
        host_pool: Option<Arc<TagPool>>,
    ) -> Result<Disk, StorageError> {
        let storage = storage::open(&mut cfg)?;
        let n = usize::from(cfg.num_queues);
        let stats = (0..n)
            .map(|_| {
                let mut st = QueueStats::default();
                st.histograms = !cfg.no_stats;
                Mutex::new(st)
            })
            .collect();
        let mut tag_wakers = Vec::with_capacity(n);
        for _ in 0..n {
            let efd = EventFd::new(libc::EFD_NONBLOCK | libc::EFD_CLOEXEC).map_err(|e| {
                StorageError::Alloc {
                    size: 0,
                    msg: format!("cannot create a tag wake-up eventfd: {e}"),
                }
            })?;
            tag_wakers.push(Arc::new(efd));
        }
        let p = cfg.tags;
        let tag_slots = match p.mode {
            TagMode::None => vec![None; n],
            TagMode::PerQueue => tag_wakers
                .iter()
                .map(|w| {
                    let pool = Arc::new(TagPool::new(p.depth, false));
                    let id = pool.register(w.clone());
                    Some((pool, id))
                })
                .collect(),
            TagMode::Shared => {
                let pool = match (p.scope, host_pool) {
                    (TagScope::Host, Some(h)) => h,
                    _ => Arc::new(TagPool::new(p.depth, p.fairness)),
                };
                tag_wakers
                    .iter()
                    .map(|w| Some((pool.clone(), pool.register(w.clone()))))
                    .collect()
            }
        };
        Ok(Disk {
            cfg,
            storage,
            stats,
            writeback: AtomicBool::new(true),
            tag_slots,
            tag_wakers,
        })
    }

    /// The pools this disk's queues draw from (one entry per distinct pool).
    pub fn tag_pool_stats(&self) -> Vec<PoolStats> {
        let mut seen: Vec<*const TagPool> = Vec::new();
        let mut out = Vec::new();
        for (pool, _) in self.tag_slots.iter().flatten() {
            let ptr = Arc::as_ptr(pool);
            if !seen.contains(&ptr) {
                seen.push(ptr);
                out.push(pool.stats());
            }
        }
        out
    }

    /// Return a command slot taken by queue `q` to its pool.
    fn put_tag(&self, q: usize, tag: Option<Tag>) {
        if let (Some(t), Some((pool, id))) = (tag, &self.tag_slots[q]) {
            pool.put(*id, t);
        }
    }

    /// The eventfd that wakes queue `q` when a slot frees.
    pub fn tag_waker(&self, q: usize) -> &Arc<EventFd> {
        &self.tag_wakers[q]
    }

    /// Lock one queue's statistics.
    pub fn queue_stats(&self, q: usize) -> MutexGuard<'_, QueueStats> {
        self.stats[q].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The configuration space as the guest would read it now.
    pub fn config_space(&self) -> [u8; config_space::CONFIG_SPACE_SIZE] {
        config_space::build(&self.cfg, self.writeback.load(Ordering::Relaxed))
    }
}

/// A request in service: executed, waiting for its emulated completion time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Pending {
    deadline: Instant,
    /// Pop order, to keep completions with equal deadlines in order.
    seq: u64,
    head: u16,
    used_len: u32,
    op: Op,
    popped_at: Instant,
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

/// State owned by one queue's worker thread.
struct QueueState {
    index: usize,
    mem: Option<GM>,
    /// Scratch list of the current chain's buffers, reused.
    segs: Vec<Segment>,
    warned_ring: bool,
    warned_drop: bool,
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
}

/// What one pass over the avail ring did.
struct DrainResult {
    /// Chains put on the used ring (completed at once or dropped).
    used: usize,
    /// Chains popped.
    popped: u64,
    /// False when the avail ring is unusable.
    ring_ok: bool,
    /// Stopped because no command slot was free.
    tag_blocked: bool,
}

/// One connection's device.
pub struct BlkBackend {
    disk: Arc<Disk>,
    queues: Vec<Mutex<QueueState>>,
    /// For each worker thread, the queue index of each of its vrings.
    thread_queues: Vec<Vec<usize>>,
    acked_features: AtomicU64,
    /// `--poll`: how long a worker keeps polling an idle ring.
    poll_spin: Option<std::time::Duration>,
    /// Poll mode: one eventfd per worker thread that the worker writes to
    /// come back to its polling after letting its epoll loop run (exit
    /// requests, timers, newly enabled rings).
    repoll: Vec<EventFd>,
}

/// Whether queue `q`'s earliest emulated completion is due within `d`.
fn due_within(q: &QueueState, now: Instant, d: std::time::Duration) -> bool {
    q.pending
        .peek()
        .is_some_and(|Reverse(p)| p.deadline <= now + d)
}

/// Longest a worker polls before returning to its epoll loop once.
const POLL_YIELD: std::time::Duration = std::time::Duration::from_millis(1);

impl BlkBackend {
    pub fn new(disk: Arc<Disk>) -> io::Result<BlkBackend> {
        let n = usize::from(disk.cfg.num_queues);
        let mut queues = Vec::with_capacity(n);
        for index in 0..n {
            let samplers = LatOp::ALL
                .iter()
                .map(|op| disk.cfg.latency.sampler(*op, disk.cfg.seed, index as u64))
                .collect();
            let tag_hint = disk.tag_slots[index]
                .as_ref()
                .map_or(0, |(p, id)| p.initial_hint(*id));
            queues.push(Mutex::new(QueueState {
                index,
                mem: None,
                segs: Vec::with_capacity(usize::from(disk.cfg.queue_size)),
                warned_ring: false,
                warned_drop: false,
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
            }));
        }
        let thread_queues: Vec<Vec<usize>> = disk
            .cfg
            .queues_per_thread
            .iter()
            .map(|mask| (0..n).filter(|q| mask & (1u64 << q) != 0).collect())
            .collect();
        let poll_spin = disk.cfg.poll_spin();
        let repoll = match poll_spin {
            Some(_) => (0..thread_queues.len())
                .map(|_| EventFd::new(libc::EFD_NONBLOCK | libc::EFD_CLOEXEC))
                .collect::<io::Result<Vec<_>>>()?,
            None => Vec::new(),
        };
        Ok(BlkBackend {
            disk,
            queues,
            thread_queues,
            acked_features: AtomicU64::new(0),
            poll_spin,
            repoll,
        })
    }

    /// Event ids (as passed to `handle_event`) of queue `q`'s completion
    /// timer and tag wake-up, above the ids vhost-user-backend reserves
    /// (0..=num_queues).
    fn timer_event(&self, q: usize) -> u16 {
        (self.queues.len() + 1 + q) as u16
    }

    fn tag_event(&self, q: usize) -> u16 {
        (2 * self.queues.len() + 1 + q) as u16
    }

    /// Event id of worker thread `t`'s re-poll eventfd (poll mode).
    fn repoll_event(&self, t: usize) -> u16 {
        (3 * self.queues.len() + 1 + t) as u16
    }

    /// Register each queue's completion timer and tag wake-up with the
    /// epoll loop of the worker thread serving the queue.
    pub fn register_events(
        &self,
        handlers: &[Arc<VringEpollHandler<Arc<BlkBackend>>>],
    ) -> io::Result<()> {
        for (thread, queues) in self.thread_queues.iter().enumerate() {
            let Some(h) = handlers.get(thread) else {
                continue;
            };
            if let Some(efd) = self.repoll.get(thread) {
                h.register_listener(
                    efd.as_raw_fd(),
                    EventSet::IN,
                    u64::from(self.repoll_event(thread)),
                )?;
            }
            for &q in queues {
                let timer_fd = self.lock_queue(q).timer.as_raw_fd();
                h.register_listener(timer_fd, EventSet::IN, u64::from(self.timer_event(q)))?;
                if self.disk.tag_slots[q].is_some() {
                    h.register_listener(
                        self.disk.tag_wakers[q].as_raw_fd(),
                        EventSet::IN,
                        u64::from(self.tag_event(q)),
                    )?;
                }
            }
        }
        Ok(())
    }

    pub fn disk(&self) -> &Arc<Disk> {
        &self.disk
    }

    fn lock_queue(&self, q: usize) -> MutexGuard<'_, QueueState> {
        // A poisoned lock means a worker panicked; its counters are still
        // meaningful, so keep going.
        self.queues[q].lock().unwrap_or_else(|p| p.into_inner())
    }

    fn writeback(&self) -> bool {
        let flush = self.acked_features.load(Ordering::Relaxed) & (1u64 << VIRTIO_BLK_F_FLUSH) != 0;
        flush && self.disk.writeback.load(Ordering::Relaxed)
    }

    /// Serve one queue: complete requests whose time has come, pop and
    /// execute what the guest made available (as far as command slots
    /// allow), notify the guest, and re-arm the completion timer. `kicks`
    /// are the guest kicks that woke us (0 for timer and slot wake-ups).
    ///
    /// `poll`: one pass only, leaving guest notifications off (the worker
    /// goes on polling the ring, see [`BlkBackend::poll_loop`]). Returns
    /// whether the pass found work, and whether the ring can be polled
    /// (false when it is broken or waits for a command slot).
    fn serve_queue(
        &self,
        q: &mut QueueState,
        vring: &KickCountingVring<GM>,
        woken_by_kick: bool,
        poll: bool,
    ) -> (bool, bool) {
        let Some(atomic) = q.mem.clone() else {
            return (false, false);
        };
        if q.vring.is_none() {
            q.vring = Some(vring.clone());
        }
        let mem = atomic.memory();
        let mut st = self.disk.queue_stats(q.index);
        let tid = *q.worker_tid.get_or_insert_with(current_tid);
        st.set_worker(tid);
        if !woken_by_kick {
            // A timer wake-up comes up to --latency-spin early: spin until
            // the earliest completion is due, so completions follow their
            // deadlines rather than the host's timer slack.
            if let Some(Reverse(p)) = q.pending.peek() {
                let spin = self.disk.cfg.latency_spin();
                let now = Instant::now();
                if p.deadline > now && p.deadline - now <= spin {
                    while Instant::now() < p.deadline {
                        std::hint::spin_loop();
                    }
                    st.counters.latency_spin_ns += now.elapsed().as_nanos() as u64;
                }
            }
        }
        let mut kicks = vring.take_kicks();
        let mut popped = 0u64;
        let event_idx = vring.get_ref().get_queue().event_idx_enabled();
        let mut first = true;
        let mut worked = false;
        let mut pollable = true;
        loop {
            if !first {
                // Kicks the guest sent while we were serving belong to this
                // wake-up: count them before looking at the ring again.
                vring.collect_kicks();
                kicks += vring.take_kicks();
            }
            first = false;
            let mut vs = vring.get_mut();
            if event_idx && vs.get_queue_mut().disable_notification(&*mem).is_err() {
                self.ring_error(q, &mut st, "cannot write the used ring's avail_event");
                break;
            }
            let completed = self.complete_due(q, &mut st, &mut vs, &mem, Instant::now());
            let d = self.drain(q, &mut st, &mut vs, &mem);
            popped += d.popped;
            worked |= completed + d.used > 0 || d.popped > 0;
            pollable = d.ring_ok && !d.tag_blocked;
            if !event_idx && completed + d.used > 0 {
                // Without EVENT_IDX: one signal for the pass (see used_added).
                self.notify_if_needed(q, &mut st, &mut vs, &mem);
            }
            // A broken ring stays broken until the driver resets it, and a
            // queue without a free slot waits for its pool's wake-up: do
            // not spin on either.
            if poll || !event_idx || !d.ring_ok || d.tag_blocked {
                break;
            }
            // Re-enable notifications, then look again: the guest may have
            // added buffers after our last look and before it saw the flag.
            match vs.get_queue_mut().enable_notification(&*mem) {
                Ok(true) => continue,
                Ok(false) => break,
                Err(_) => {
                    self.ring_error(q, &mut st, "cannot update notification state");
                    break;
                }
            }
        }
        if woken_by_kick || kicks > 0 {
            st.wakeup(kicks, popped);
        }
        if poll && q.polling {
            // The poll loop re-arms the timer when it stops polling.
            return (worked, pollable);
        }
        self.arm_timer(q);
        (worked, pollable)
    }

    /// Poll mode: keep serving every ring of worker thread `thread` that is
    /// being polled, with guest notifications off, until each has been idle
    /// for the spin time; then re-enable its notifications, look once more
    /// (a request added before the guest saw them on would otherwise wait
    /// for a kick that never comes) and leave it to epoll. Rings of the
    /// same thread are polled in turn, so none starves; after
    /// [`POLL_YIELD`] the worker lets its epoll loop run once (exit
    /// requests, timers, other events) and comes back through its re-poll
    /// eventfd. Each queue counts its spin time, hits (a spin that found a
    /// request) and misses (a spin that ran out) in its own statistics.
    fn poll_loop(&self, thread: usize, vrings: &[KickCountingVring<GM>]) {
        let Some(spin) = self.poll_spin else {
            return;
        };
        let Some(mine) = self.thread_queues.get(thread) else {
            return;
        };
        let started = Instant::now();
        loop {
            let mut any = false;
            for (local, &qi) in mine.iter().enumerate() {
                let Some(vring) = vrings.get(local) else {
                    continue;
                };
                let mut q = self.lock_queue(qi);
                if !q.polling {
                    // A ring of this thread waiting for a kick: serve it
                    // here if it has work, since the epoll loop is not
                    // running while we poll.
                    if !self.ring_has_work(&q, vring) {
                        continue;
                    }
                    q.polling = true;
                }
                if !vring.get_ref().get_queue().ready() {
                    q.polling = false;
                    q.idle_since = None;
                    continue;
                }
                let (worked, pollable) = self.serve_queue(&mut q, vring, false, true);
                let now = Instant::now();
                if !pollable {
                    // Broken ring or no command slot: its own wake-up
                    // (driver reset, slot free) brings it back.
                    self.stop_polling(&mut q, now, false);
                    continue;
                }
                if worked {
                    if let Some(since) = q.idle_since.take() {
                        let mut st = self.disk.queue_stats(qi);
                        st.counters.poll_hits += 1;
                        st.counters.poll_spin_ns += (now - since).as_nanos() as u64;
                    }
                } else {
                    match q.idle_since {
                        None => q.idle_since = Some(now),
                        // A request due within the spin is work about to
                        // happen: keep polling so it completes at its
                        // deadline, not at a late timer wake-up.
                        Some(since) if now - since >= spin && !due_within(&q, now, spin) => {
                            if self.rearm(&mut q, vring) {
                                // Work arrived before the guest saw the
                                // notifications on (it may not have
                                // kicked): keep polling.
                                any = true;
                                continue;
                            }
                            self.stop_polling(&mut q, now, true);
                            continue;
                        }
                        Some(_) => {}
                    }
                }
                any = true;
            }
            if !any {
                return;
            }
            if started.elapsed() >= POLL_YIELD {
                if let Some(efd) = self.repoll.get(thread) {
                    if efd.write(1).is_ok() {
                        return;
                    }
                }
            }
            std::hint::spin_loop();
        }
    }

    /// Whether the avail ring has a request we have not popped (one read
    /// of the avail index).
    fn ring_has_work(&self, q: &QueueState, vring: &KickCountingVring<GM>) -> bool {
        let Some(atomic) = q.mem.as_ref() else {
            return false;
        };
        let mem = atomic.memory();
        let vs = vring.get_ref();
        let queue = vs.get_queue();
        queue.ready()
            && queue
                .avail_idx(&*mem, Ordering::Acquire)
                .is_ok_and(|i| i.0 != queue.next_avail())
    }

    /// Turn guest notifications back on; true if the ring has work after all.
    fn rearm(&self, q: &mut QueueState, vring: &KickCountingVring<GM>) -> bool {
        let Some(atomic) = q.mem.clone() else {
            return false;
        };
        let mem = atomic.memory();
        let mut vs = vring.get_mut();
        vs.get_queue_mut()
            .enable_notification(&*mem)
            .unwrap_or(false)
    }

    /// Leave a ring to epoll: count the spin (a miss when it ran out) and
    /// arm the completion timer for requests still in service.
    fn stop_polling(&self, q: &mut QueueState, now: Instant, miss: bool) {
        q.polling = false;
        if let Some(since) = q.idle_since.take() {
            let mut st = self.disk.queue_stats(q.index);
            st.counters.poll_spin_ns += now.saturating_duration_since(since).as_nanos() as u64;
            if miss {
                st.counters.poll_misses += 1;
            }
        }
        self.arm_timer(q);
    }

    /// Arm queue `q`'s completion timer for its earliest deadline (off when
    /// nothing is pending), waking a little early to spin the rest (see
    /// --latency-spin).
    fn arm_timer(&self, q: &mut QueueState) {
        let spin = self.disk.cfg.latency_spin();
        let next = q
            .pending
            .peek()
            .map(|Reverse(p)| p.deadline.checked_sub(spin).unwrap_or(p.deadline));
        if let Err(e) = q.timer.set(next) {
            warn!("queue {}: cannot arm the completion timer: {e}", q.index);
        }
    }

    /// Complete every pending request whose deadline is at or before `now`.
    fn complete_due(
        &self,
        q: &mut QueueState,
        st: &mut QueueStats,
        vs: &mut vhost_user_backend::VringState<GM>,
        mem: &GuestMemoryMmap,
        now: Instant,
    ) -> usize {
        let mut n = 0;
        while let Some(Reverse(p)) = q.pending.peek().copied() {
            if p.deadline > now {
                break;
            }
            q.pending.pop();
            self.finish(q, st, vs, mem, p, Some(now));
            n += 1;
        }
        n
    }

    /// An entry was put on the used ring. With EVENT_IDX, check the
    /// guest's used_event after every entry, as QEMU does: the driver hears
    /// of its first completion while we still serve the rest, and refills
    /// the ring in parallel instead of after the whole pass (measured: +60-90
    /// % IOPS at QD64 and -20 % backend CPU per request on the development
    /// VM; see README, "What the profile showed"). The check is one read of
    /// used_event and signals at most once per driver update of it. Without
    /// EVENT_IDX every check would signal, so the pass signals once at its
    /// end instead.
    fn used_added(
        &self,
        q: &mut QueueState,
        st: &mut QueueStats,
        vs: &mut vhost_user_backend::VringState<GM>,
        mem: &GuestMemoryMmap,
    ) {
        if vs.get_queue().event_idx_enabled() {
            self.notify_if_needed(q, st, vs, mem);
        }
    }

    /// Signal the guest if the used entries added since the last check
    /// cross its `used_event` (always without EVENT_IDX).
    fn notify_if_needed(
        &self,
        q: &mut QueueState,
        st: &mut QueueStats,
        vs: &mut vhost_user_backend::VringState<GM>,
        mem: &GuestMemoryMmap,
    ) {
        match vs.get_queue_mut().needs_notification(mem) {
            Ok(true) => {
                if let Err(e) = vs.signal_used_queue() {
                    warn!("queue {}: cannot signal the guest: {e}", q.index);
                }
                st.counters.notifications += 1;
            }
            Ok(false) => st.counters.notifications_suppressed += 1,
            Err(_) => self.ring_error(q, st, "cannot read the avail ring's used_event"),
        }
    }

    /// Put a request on the used ring and give its slot back; its service
    /// time is recorded as ending at `done` (None: the caller records it).
    fn finish(
        &self,
        q: &mut QueueState,
        st: &mut QueueStats,
        vs: &mut vhost_user_backend::VringState<GM>,
        mem: &GuestMemoryMmap,
        p: Pending,
        done: Option<Instant>,
    ) {
        if vs
            .get_queue_mut()
            .add_used(mem, p.head, p.used_len)
            .is_err()
        {
            self.ring_error(
                q,
                st,
                &format!("cannot put head {} on the used ring", p.head),
            );
        }
        self.disk.put_tag(q.index, p.tag);
        self.used_added(q, st, vs, mem);
        if let Some(done) = done {
            st.completed(p.op, done.saturating_duration_since(p.popped_at));
        }
    }

    /// Pop and execute every available chain, as far as command slots
    /// allow. Requests without emulated latency complete at once; the
    /// others wait in the queue's deadline heap.
    fn drain(
        &self,
        q: &mut QueueState,
        st: &mut QueueStats,
        vs: &mut vhost_user_backend::VringState<GM>,
        mem: &GuestMemoryMmap,
    ) -> DrainResult {
        let cfg = &self.disk.cfg;
        let timed = st.histograms || !cfg.latency.is_zero() || cfg.faults.stall_every.is_some();
        let pass_start = Instant::now();
        // The last request served at once: its service time ends at the
        // next pop (or at the end of the pass).
        let mut served_at_once: Option<(Op, Instant)> = None;
        let r = self.drain_timed(q, st, vs, mem, timed, pass_start, &mut served_at_once);
        if let Some((op, at)) = served_at_once {
            st.completed(op, at.elapsed());
        }
        r
    }

    #[allow(clippy::too_many_arguments)]
    fn drain_timed(
        &self,
        q: &mut QueueState,
        st: &mut QueueStats,
        vs: &mut vhost_user_backend::VringState<GM>,
        mem: &GuestMemoryMmap,
        timed: bool,
        pass_start: Instant,
        served_at_once: &mut Option<(Op, Instant)>,
    ) -> DrainResult {
        let mut r = DrainResult {
            used: 0,
            popped: 0,
            ring_ok: true,
            tag_blocked: false,
        };
        let slots = self.disk.tag_slots[q.index].clone();
        loop {
            // Anything to pop? (Read the index only: the slot comes first.)
            let queue = vs.get_queue_mut();
            match queue.avail_idx(mem, std::sync::atomic::Ordering::Acquire) {
                Ok(idx) if idx.0 == queue.next_avail() => return r,
                Ok(_) => {}
                Err(e) => {
                    self.ring_error(q, st, &format!("avail ring unreadable: {e}"));
                    r.ring_ok = false;
                    return r;
                }
            }
            let tag = match &slots {
                None => None,
                Some((pool, id)) => match pool.try_get(*id, &mut q.tag_hint) {
                    Some(t) => {
                        if let Some(since) = q.waiting_since.take() {
                            st.tag_waited(since.elapsed());
                        }
                        Some(t)
                    }
                    None => {
                        if q.waiting_since.is_none() {
                            q.waiting_since = Some(Instant::now());
                            st.counters.tag_waits += 1;
                        }
                        r.tag_blocked = true;
                        return r;
                    }
                },
            };
            let chain = match vs.get_queue_mut().iter(mem) {
                Ok(mut it) => it.next(),
                Err(e) => {
                    self.disk.put_tag(q.index, tag);
                    self.ring_error(q, st, &format!("avail ring unusable: {e}"));
                    r.ring_ok = false;
                    return r;
                }
            };
            let Some(chain) = chain else {
                self.disk.put_tag(q.index, tag);
                return r;
            };
            let head = chain.head_index();
            // One clock read per request: it is this request's pop time and
            // the completion time of the previous one served at once. With
            // --no-stats and no emulated latency nothing needs the clock.
            let popped_at = if timed { Instant::now() } else { pass_start };
            if let Some((op, at)) = served_at_once.take() {
                st.completed(op, popped_at.saturating_duration_since(at));
            }
            st.popped(popped_at, q.pending.len() as u64);
            r.popped += 1;
            let dev = Device {
                storage: self.disk.storage.as_ref(),
                cfg: &self.disk.cfg,
                capacity: self.disk.cfg.size,
                writeback: self.writeback(),
                faults: q.faults.as_ref(),
            };
            let outcome = serve_chain(&dev, chain, &mut q.segs, mem);
            let used_len = self.account(q, st, outcome);
            let Outcome::Completed { op, fault, .. } = outcome else {
                // Malformed: returned at once, no emulated service time.
                self.disk.put_tag(q.index, tag);
                if vs.get_queue_mut().add_used(mem, head, 0).is_err() {
                    self.ring_error(q, st, &format!("cannot put head {head} on the used ring"));
                } else {
                    r.used += 1;
                    self.used_added(q, st, vs, mem);
                }
                continue;
            };
            let mut delay = q.samplers[lat_op(op).index()].sample();
            if let FaultDecision::Stall(d) = fault {
                delay += d;
            }
            let p = Pending {
                deadline: popped_at + delay,
                seq: q.seq,
                head,
                used_len,
                op,
                popped_at,
                tag,
            };
            q.seq += 1;
            if delay.is_zero() {
                self.finish(q, st, vs, mem, p, None);
                if timed {
                    *served_at_once = Some((op, popped_at));
                }
                r.used += 1;
            } else {
                q.pending.push(Reverse(p));
            }
        }
    }

    fn account(&self, q: &mut QueueState, st: &mut QueueStats, outcome: Outcome) -> u32 {
        let c = &mut st.counters;
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
                if !q.warned_drop {
                    q.warned_drop = true;
                    warn!(
                        "{} queue {}: dropped a malformed descriptor chain ({}); further drops are only counted",
                        self.disk.cfg.socket.display(),
                        q.index,
                        reason.describe()
                    );
                }
                0
            }
        }
    }

    fn ring_error(&self, q: &mut QueueState, st: &mut QueueStats, what: &str) {
        st.counters.ring_errors += 1;
        if !q.warned_ring {
            q.warned_ring = true;
            warn!(
                "{} queue {}: {what}; the queue is unusable until the driver resets it (further errors only counted)",
                self.disk.cfg.socket.display(),
                q.index
            );
        }
    }

    /// Log each queue's totals since the daemon started (or the last reset).
    pub fn log_summary(&self) {
        for i in 0..self.queues.len() {
            let c: QueueCounters = self.disk.queue_stats(i).counters.clone();
            if c.requests + c.dropped + c.ring_errors == 0 {
                continue;
            }
            info!(
                "{} queue {i}: {} requests ({} reads {} B, {} writes {} B, {} flushes, {} discards, {} write-zeroes, {} other), {} IOERR, {} UNSUPP, {} dropped chains, {} ring errors, {} kicks, {} wake-ups, {} notifications",
                self.disk.cfg.socket.display(),
                c.requests, c.reads, c.bytes_read, c.writes, c.bytes_written, c.flushes, c.discards,
                c.write_zeroes, c.other, c.status_ioerr, c.status_unsupp, c.dropped, c.ring_errors,
                c.kicks, c.wakeups, c.notifications
            );
        }
    }
}

impl Drop for BlkBackend {
    /// A frontend that went away without stopping its rings leaves requests
    /// in service: give their command slots back so a shared pool does not
    /// shrink.
    fn drop(&mut self) {
        for (qi, q) in self.queues.iter_mut().enumerate() {
            let q = q.get_mut().unwrap_or_else(|p| p.into_inner());
            for Reverse(p) in q.pending.drain() {
                self.disk.put_tag(qi, p.tag);
            }
        }
    }
}

/// The latency class of a request kind.
fn lat_op(op: Op) -> LatOp {
    match op {
        Op::Read => LatOp::Read,
        Op::Write => LatOp::Write,
        Op::Flush => LatOp::Flush,
        _ => LatOp::Other,
    }
}

impl VhostUserBackend for BlkBackend {
    type Bitmap = ();
    type Vring = KickCountingVring<GM>;

    fn num_queues(&self) -> usize {
        self.queues.len()
    }

    fn max_queue_size(&self) -> usize {
        usize::from(self.disk.cfg.queue_size)
    }

    fn features(&self) -> u64 {
        self.disk.cfg.features.bits() | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
    }

    fn acked_features(&self, features: u64) {
        debug!(
            "{}: guest acked features {features:#x}",
            self.disk.cfg.socket.display()
        );
        self.acked_features.store(features, Ordering::Relaxed);
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::CONFIG
            | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
            | VhostUserProtocolFeatures::REPLY_ACK
    }

    /// vhost-user-backend sets EVENT_IDX on every vring's queue itself;
    /// the worker reads it from there.
    fn set_event_idx(&self, _enabled: bool) {}

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        config_space::read(&self.disk.config_space(), offset, size).unwrap_or_default()
    }

    fn set_config(&self, offset: u32, buf: &[u8]) -> io::Result<()> {
        if offset as usize == config_space::WRITEBACK_OFFSET
            && buf.len() == 1
            && self.disk.cfg.features.has(BlkFeature::ConfigWce)
        {
            info!(
                "{}: guest set cache mode to {}",
                self.disk.cfg.socket.display(),
                if buf[0] != 0 {
                    "write-back"
                } else {
                    "write-through"
                }
            );
            self.disk.writeback.store(buf[0] != 0, Ordering::Relaxed);
            return Ok(());
        }
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "config space write of {} bytes at {offset} not supported",
                buf.len()
            ),
        ))
    }

    fn update_memory(&self, mem: GM) -> io::Result<()> {
        for q in 0..self.queues.len() {
            self.lock_queue(q).mem = Some(mem.clone());
        }
        Ok(())
    }

    fn queues_per_thread(&self) -> Vec<u64> {
        self.disk.cfg.queues_per_thread.clone()
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        match new_event_consumer_and_notifier(EventFlag::NONBLOCK | EventFlag::CLOEXEC) {
            Ok(pair) => Some(pair),
            Err(e) => {
                warn!("cannot create a worker exit event: {e}");
                None
            }
        }
    }

    fn stop_vring(&self, queue_index: u32) -> io::Result<()> {
        // The vring is already unregistered from its worker; taking the
        // queue's lock waits for a pass in progress. Requests still in
        // service complete (at their deadlines) before GET_VRING_BASE is
        // answered, so the guest gets every buffer back.
        let qi = queue_index as usize;
        if qi >= self.queues.len() {
            return Ok(());
        }
        let mut q = self.lock_queue(qi);
        if q.pending.is_empty() {
            return Ok(());
        }
        let (Some(vring), Some(atomic)) = (q.vring.clone(), q.mem.clone()) else {
            return Ok(());
        };
        if let Some(Reverse(last)) = q.pending.iter().max() {
            let wait = last.deadline.saturating_duration_since(Instant::now());
            // The control thread may wait; bound it so a stalled request
            // cannot hold the frontend forever.
            std::thread::sleep(wait.min(std::time::Duration::from_secs(60)));
        }
        let mem = atomic.memory();
        let mut st = self.disk.queue_stats(qi);
        let mut vs = vring.get_mut();
        while let Some(Reverse(p)) = q.pending.pop() {
            self.finish(&mut q, &mut st, &mut vs, &mem, p, Some(Instant::now()));
        }
        let _ = vs.signal_used_queue();
        drop(vs);
        let _ = q.timer.set(None);
        Ok(())
    }

    fn handle_event(
        &self,
        device_event: u16,
        evset: EventSet,
        vrings: &[Self::Vring],
        thread_id: usize,
    ) -> io::Result<()> {
        if !evset.contains(EventSet::IN) {
            return Ok(());
        }
        let n = self.queues.len();
        let ev = usize::from(device_event);
        let Some(mine) = self.thread_queues.get(thread_id) else {
            return Ok(());
        };
        // Which queue, and why: a kick (thread-local vring index), its
        // completion timer, or a free command slot.
        let (qi, by_kick) = if ev < vrings.len() {
            match mine.get(ev) {
                Some(&qi) => (qi, true),
                None => return Ok(()),
            }
        } else if (n + 1..2 * n + 1).contains(&ev) {
            (ev - n - 1, false)
        } else if (2 * n + 1..3 * n + 1).contains(&ev) {
            let qi = ev - 2 * n - 1;
            // Clear the wake-up; a pool writes it again on the next free.
            let _ = self.disk.tag_wakers[qi].read();
            (qi, false)
        } else if ev == usize::from(self.repoll_event(thread_id)) && !self.repoll.is_empty() {
            if let Some(efd) = self.repoll.get(thread_id) {
                let _ = efd.read();
            }
            self.poll_loop(thread_id, vrings);
            return Ok(());
        } else {
            // Nothing else of ours is registered. Returning an error would
            // stop the worker thread.
            return Ok(());
        };
        let Some(local) = mine.iter().position(|&x| x == qi) else {
            return Ok(());
        };
        let Some(vring) = vrings.get(local) else {
            return Ok(());
        };
        let mut q = self.lock_queue(qi);
        if !by_kick {
            q.timer.acknowledge();
            // Serve only a started ring: a stopped one (GET_VRING_BASE
            // answered) must not be touched.
            if !vring.get_ref().get_queue().ready() {
                return Ok(());
            }
        }
        if self.poll_spin.is_none() {
            self.serve_queue(&mut q, vring, by_kick, false);
            return Ok(());
        }
        if !vring.get_ref().get_queue().ready() {
            return Ok(());
        }
        q.polling = true;
        let (_, pollable) = self.serve_queue(&mut q, vring, by_kick, true);
        if !pollable {
            self.stop_polling(&mut q, Instant::now(), false);
        }
        drop(q);
        self.poll_loop(thread_id, vrings);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::config::DiskArgs;

    fn backend(extra: &[&str]) -> BlkBackend {
        let mut a = vec!["--socket", "/tmp/b.sock", "--disk", "null", "--size", "1G"];
        a.extend_from_slice(extra);
        let cfg = DiskArgs::parse_for_test(&a).to_configs().unwrap().remove(0);
        BlkBackend::new(Arc::new(Disk::open(cfg).unwrap())).unwrap()
    }

    #[test]
    fn offered_features_follow_switches() {
        let b = backend(&[]);
        let f = b.features();
        assert_ne!(f & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits(), 0);
        for feat in BlkFeature::ALL {
            assert_eq!(f & feat.mask() != 0, feat != BlkFeature::Ro, "{feat}");
        }
        let b = backend(&["--disable-features", "event-idx,flush", "--read-only"]);
        let f = b.features();
        assert_eq!(f & BlkFeature::EventIdx.mask(), 0);
        assert_eq!(f & BlkFeature::Flush.mask(), 0);
        assert_ne!(f & BlkFeature::Ro.mask(), 0);
        let p = b.protocol_features();
        for need in [
            VhostUserProtocolFeatures::MQ,
            VhostUserProtocolFeatures::CONFIG,
            VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS,
            VhostUserProtocolFeatures::REPLY_ACK,
        ] {
            assert!(p.contains(need));
        }
    }

    #[test]
    fn queues_and_threads() {
        let b = backend(&["--num-queues", "4", "--queue-size", "64"]);
        assert_eq!(b.num_queues(), 4);
        assert_eq!(b.max_queue_size(), 64);
        assert_eq!(b.queues_per_thread(), vec![1, 2, 4, 8]);
        assert_eq!(b.thread_queues, vec![vec![0], vec![1], vec![2], vec![3]]);
        let b = backend(&["--num-queues", "4", "--queues-per-thread", "0x5,0xa"]);
        assert_eq!(b.thread_queues, vec![vec![0, 2], vec![1, 3]]);
    }

    #[test]
    fn config_space_and_write_cache_toggle() {
        let b = backend(&["--num-queues", "3"]);
        let c = b.get_config(0, 60);
        assert_eq!(c.len(), 60);
        assert_eq!(
            u64::from_le_bytes(c[0..8].try_into().unwrap()),
            (1 << 30) / 512
        );
        assert_eq!(u16::from_le_bytes(c[34..36].try_into().unwrap()), 3);
        assert_eq!(c[32], 1);
        b.set_config(32, &[0]).unwrap();
        assert_eq!(b.get_config(32, 1), vec![0]);
        // Flush acked + write-through: requests must flush; write-back after.
        b.acked_features(1 << VIRTIO_BLK_F_FLUSH);
        assert!(!b.writeback());
        b.set_config(32, &[1]).unwrap();
        assert!(b.writeback());
        // Anything else in config space is read-only.
        assert!(b.set_config(0, &[0; 8]).is_err());
        assert!(b.get_config(250, 10).is_empty());
        let nowce = backend(&["--disable-features", "config-wce"]);
        assert!(nowce.set_config(32, &[0]).is_err());
    }
}
