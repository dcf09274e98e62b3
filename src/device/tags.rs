//! Device command slots ("tags"): a concurrent tag bitmap with waiters,
//! batched wake-ups and optional fair sharing, modelled on Linux blk-mq's
//! tag sets (`block/blk-mq-tag.c`) over `lib/sbitmap.c`.
//!
//! One [`TagPool`] models one budget of in-service commands:
//! - *per-queue*: one pool per virtqueue, with a single registered user;
//! - *shared*: one pool (behind an `Arc`) for all virtqueues of a disk, or for
//!   all disks of the process (`host` scope, like null_blk `shared_tags` or
//!   scsi_debug `host_max_queue`).
//!
//! # The bitmap
//! Tags live in `Vec<AtomicU64>` words, each on its own cache line. As in
//! sbitmap, a small depth is spread over several words (`bits_per_word` is
//! the largest power of two `<= 64` with `4 * bits_per_word <= depth`, so
//! depth 8 uses 4 words of 2 bits, depth 100 uses 7 words of 16 bits, depth
//! 256 and more 64-bit words), so that concurrent allocators touch different
//! cache lines. Allocation scans from the caller's `hint` (sbitmap's per-cpu
//! `alloc_hint`; here each queue worker owns its hint) and claims a bit with
//! `fetch_or` (`test_and_set_bit`); release is `fetch_and`. Bits past the
//! depth are set at construction and never handed out. There is no lock on
//! this path; its cache-line contention is part of what the model costs.
//! `in_use` is a counter updated right after the bitmap, used for idle
//! detection and the peak; it is clamped to the depth when read because it
//! can lag the bitmap by the operations in flight.
//!
//! # Fairness (blk-mq `hctx_may_queue`)
//! With fairness on and more than one registered queue, a queue may hold at
//! most `ceil(depth / active_queues)` tags even when tags are free. blk-mq
//! computes `max(ceil(depth / users), 4)`, skips the check for depth 1, marks
//! a hardware queue active on its first allocation attempt
//! (`blk_mq_tag_busy`) and inactive only later, from the timeout work once it
//! has nothing in flight (`blk_mq_tag_idle`). Here a queue is active exactly
//! while it holds tags or is waiting for one (eager deactivation). Reasons:
//! the model stays deterministic (no idle timer), the share follows the
//! load immediately, and the brief's bound is exactly `ceil(depth / active)`;
//! we drop the floor of 4 so small device depths are divided as configured
//! (with depth 1 the share is 1, i.e. no limit, as in blk-mq). The cost is
//! that `active_queues` changes at every 0 <-> 1 transition of a queue, an
//! atomic on a shared line that blk-mq's lazy scheme avoids.
//!
//! # Wake-up protocol (no lost wake-ups)
//! 1. `try_get` that fails *registers first* (sets the queue's WAITING bit,
//!    bumps `nr_waiting`), then retries the allocation once. A queue woken
//!    or succeeding clears its WAITING bit; whoever clears it owns the wake.
//! 2. `put` releases the bit, then reads `nr_waiting`; all these operations
//!    are `SeqCst`, so either the retry sees the freed slot or the put sees
//!    the waiter (Dekker). No waiter: the put is done (fast path).
//! 3. With waiters, each put adds 1 to `pending`; when `pending` reaches
//!    `wake_batch = clamp(depth / 8, 1, 8)` the putter resets it and wakes up
//!    to `pending` waiting queues, round robin (sbitmap's wake_batch).
//! 4. Overrides: the put that makes the pool idle (`in_use` 0) wakes every
//!    waiter; with fairness, a queue waiting on its share is woken by its own
//!    put once it holds less than its share, and a queue going inactive wakes
//!    every share-limited waiter (their share just grew).
//! 5. Liveness: a waiter exists only after a failed retry, i.e. the pool
//!    was full or the queue held tags; every held tag is eventually put, and
//!    every put while someone waits counts, so either batches keep coming
//!    (round robin reaches everyone) or the pool drains and the idle put
//!    wakes all. A woken queue has its eventfd written and must call
//!    `try_get` again (registering again if it fails).

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use serde::{Deserialize, Serialize};
use vmm_sys_util::eventfd::EventFd;

/// A slot index, `0..depth`.
pub(crate) type Tag = u32;

/// A registered user of a pool (a virtqueue), as returned by
/// [`TagPool::register`]. Only meaningful for the pool that issued it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct QueueId(u32);

/// How a waiting queue is woken.
pub(crate) type Waker = Box<dyn Fn() + Send + Sync>;

/// Users per pool: 64 chunks of 64 (e.g. 64 disks x 64 queues, host scope).
pub(crate) const MAX_QUEUES: usize = CHUNKS * CHUNK;
const CHUNK: usize = 64;
const CHUNKS: usize = 64;

/// Per-queue state word: held tags in the low bits, plus flags.
const WAITING: u32 = 1 << 31;
/// Set with `WAITING` when the queue waits on its fair share, not on slots.
const SHARE: u32 = 1 << 30;
const HELD: u32 = SHARE - 1;
/// Largest supported depth (the held count must fit in `HELD`).
pub(crate) const MAX_DEPTH: u32 = HELD;

#[repr(align(64))]
#[derive(Default)]
struct Padded<T>(T);

#[repr(align(64))]
#[derive(Default)]
struct QueueSlot {
    /// `held | WAITING | SHARE`; non-zero means the queue is active.
    state: AtomicU32,
    peak_held: AtomicU32,
    gets: AtomicU64,
    puts: AtomicU64,
    waits: AtomicU64,
    share_waits: AtomicU64,
    wakeups: AtomicU64,
    waker: OnceLock<Waker>,
}

/// Counters of one registered queue.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct QueueStats {
    /// Tags held now.
    pub held: u32,
    /// Most tags held at once.
    pub peak_held: u32,
    /// Successful `try_get`s.
    pub gets: u64,
    /// `put`s.
    pub puts: u64,
    /// `try_get`s that returned `None`.
    pub waits: u64,
    /// Of `waits`, those refused by the fair share while slots were free.
    pub share_waits: u64,
    /// Wake-ups sent to this queue.
    pub wakeups: u64,
    /// Waiting for a wake-up now.
    pub waiting: bool,
}

/// A snapshot of a pool's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct PoolStats {
    pub depth: u32,
    pub fairness: bool,
    pub wake_batch: u32,
    pub bits_per_word: u32,
    pub words: u32,
    pub in_use: u32,
    pub peak_in_use: u32,
    pub active_queues: u32,
    pub waiting_queues: u32,
    /// Sums over the queues.
    pub gets: u64,
    pub puts: u64,
    pub waits: u64,
    pub share_waits: u64,
    pub wakeups_sent: u64,
    /// Of `wakeups_sent`: sent because a batch of frees filled, because the
    /// pool went idle, and by fairness (own share available or a queue went
    /// inactive).
    pub batch_wakeups: u64,
    pub idle_wakeups: u64,
    pub share_wakeups: u64,
    /// Puts of a tag that was not held (ignored).
    pub bad_puts: u64,
    pub queues: Vec<QueueStats>,
}

/// A pool of `depth` tags shared by registered queues; `Send + Sync`, meant
/// to be shared through an `Arc`. See the module documentation.
pub(crate) struct TagPool {
    words: Vec<Padded<AtomicU64>>,
    depth: u32,
    shift: u32,
    fairness: bool,
    wake_batch: u32,
    nr_queues: AtomicUsize,
    queues: Box<[OnceLock<Box<[QueueSlot]>>]>,
    register_lock: Mutex<()>,
    in_use: Padded<AtomicU32>,
    peak_in_use: Padded<AtomicU32>,
    active: Padded<AtomicU32>,
    nr_waiting: Padded<AtomicU32>,
    pending: Padded<AtomicU32>,
    wake_index: AtomicUsize,
    batch_wakeups: AtomicU64,
    idle_wakeups: AtomicU64,
    share_wakeups: AtomicU64,
    bad_puts: AtomicU64,
}

enum Reason {
    Batch,
    Idle,
    Share,
}

/// sbitmap's `sbitmap_calculate_shift`: spread small depths over >= 4 words.
fn calculate_shift(depth: u32) -> u32 {
    let mut shift = 6;
    if depth >= 4 {
        while shift > 0 && (4u64 << shift) > u64::from(depth) {
            shift -= 1;
        }
    }
    shift
}

impl TagPool {
    /// A pool of `depth` tags (1..=[`MAX_DEPTH`]; panics otherwise).
    pub(crate) fn new(depth: u32, fairness: bool) -> TagPool {
        assert!(
            (1..=MAX_DEPTH).contains(&depth),
            "tag depth {depth} out of range"
        );
        let shift = calculate_shift(depth);
        let bpw = 1u32 << shift;
        let nwords = depth.div_ceil(bpw);
        let words = (0..nwords)
            .map(|w| {
                let valid = (depth - w * bpw).min(bpw);
                // Bits at and above `valid` are never allocatable.
                let unusable = if valid == 64 { 0 } else { u64::MAX << valid };
                Padded(AtomicU64::new(unusable))
            })
            .collect();
        TagPool {
            words,
            depth,
            shift,
            fairness,
            wake_batch: (depth / 8).clamp(1, 8),
            nr_queues: AtomicUsize::new(0),
            queues: (0..CHUNKS).map(|_| OnceLock::new()).collect(),
            register_lock: Mutex::new(()),
            in_use: Padded::default(),
            peak_in_use: Padded::default(),
            active: Padded::default(),
            nr_waiting: Padded::default(),
            pending: Padded::default(),
            wake_index: AtomicUsize::new(0),
            batch_wakeups: AtomicU64::new(0),
            idle_wakeups: AtomicU64::new(0),
            share_wakeups: AtomicU64::new(0),
            bad_puts: AtomicU64::new(0),
        }
    }

    /// Register a user (a virtqueue) woken by writing 1 to `waker`.
    /// Panics beyond [`MAX_QUEUES`] users.
    pub(crate) fn register(&self, waker: Arc<EventFd>) -> QueueId {
        self.register_waker(Box::new(move || {
            // EAGAIN only if the counter is saturated: already readable.
            let _ = waker.write(1);
        }))
    }

    /// Register a user woken by calling `waker` (from the thread doing the
    /// `put`; keep it short and non-blocking).
    pub(crate) fn register_waker(&self, waker: Waker) -> QueueId {
        let _guard = self.register_lock.lock().unwrap_or_else(|e| e.into_inner());
        let i = self.nr_queues.load(Ordering::Relaxed);
        assert!(i < MAX_QUEUES, "more than {MAX_QUEUES} tag pool users");
        let chunk = self.queues[i / CHUNK]
            .get_or_init(|| (0..CHUNK).map(|_| QueueSlot::default()).collect());
        if chunk[i % CHUNK].waker.set(waker).is_err() {
            unreachable!("queue slot registered twice");
        }
        self.nr_queues.store(i + 1, Ordering::Release);
        QueueId(i as u32)
    }

    /// Tags in use now.
    pub(crate) fn in_use(&self) -> u32 {
        self.in_use.0.load(Ordering::Relaxed).min(self.depth)
    }

    /// A starting allocation hint for queue `q`, spread over the depth.
    pub(crate) fn initial_hint(&self, q: QueueId) -> u32 {
        let h = u64::from(q.0).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
        ((h * u64::from(self.depth)) >> 32) as u32
    }

    fn slot(&self, i: usize) -> &QueueSlot {
        debug_assert!(i < self.nr_queues.load(Ordering::Relaxed), "bad QueueId");
        &self.queues[i / CHUNK]
            .get()
            .expect("QueueId not registered with this pool")[i % CHUNK]
    }

    fn fairness_applies(&self) -> bool {
        self.fairness && self.nr_queues.load(Ordering::Relaxed) > 1
    }

    /// The fair share: `ceil(depth / active_queues)`.
    fn share(&self) -> u32 {
        let users = self.active.0.load(Ordering::SeqCst).max(1);
        self.depth.div_ceil(users)
    }

    /// Adjust `active` for a queue state change from `old` to `new`.
    fn note_transition(&self, old: u32, new: u32) {
        match (old == 0, new == 0) {
            (true, false) => {
                self.active.0.fetch_add(1, Ordering::SeqCst);
            }
            (false, true) => {
                self.active.0.fetch_sub(1, Ordering::SeqCst);
            }
            _ => {}
        }
    }

    /// Claim a free bit, scanning from `hint`; updates `hint`.
    fn alloc_bit(&self, hint: &mut u32) -> Option<Tag> {
        let h = if *hint < self.depth { *hint } else { 0 };
        let nwords = self.words.len();
        let mut idx = (h >> self.shift) as usize;
        let mut from = h & ((1 << self.shift) - 1);
        // Revisit the first word from bit 0 if we started in its middle.
        let visits = nwords + usize::from(from != 0);
        for _ in 0..visits {
            let word = &self.words[idx].0;
            let mut cur = word.load(Ordering::SeqCst);
            loop {
                let free = !cur & (u64::MAX << from);
                if free == 0 {
                    break;
                }
                let mask = 1u64 << free.trailing_zeros();
                let prev = word.fetch_or(mask, Ordering::SeqCst);
                if prev & mask == 0 {
                    let tag = ((idx as u32) << self.shift) + free.trailing_zeros();
                    let next = tag + 1;
                    *hint = if next >= self.depth { 0 } else { next };
                    return Some(tag);
                }
                cur = prev;
            }
            from = 0;
            idx += 1;
            if idx == nwords {
                idx = 0;
            }
        }
        None
    }

    /// One allocation attempt for `qs`. On failure, `register` records the
    /// queue as waiting (before the caller's retry); an already waiting
    /// queue gets its SHARE flag refreshed.
    fn attempt(&self, qs: &QueueSlot, hint: &mut u32, register: bool) -> Result<Tag, bool> {
        // Reserve a held slot first: it makes the queue active for the
        // share computation and bounds concurrent takers of one queue.
        let prev = qs.state.fetch_add(1, Ordering::SeqCst);
        self.note_transition(prev, prev + 1);
        let held = prev & HELD;
        let share_ok = !self.fairness_applies() || held < self.share();
        let tag = if share_ok { self.alloc_bit(hint) } else { None };
        if let Some(tag) = tag {
            if prev & WAITING != 0 {
                self.clear_waiting(qs, false);
            }
            let now = self.in_use.0.fetch_add(1, Ordering::SeqCst) + 1;
            let now = now.min(self.depth);
            if now > self.peak_in_use.0.load(Ordering::Relaxed) {
                self.peak_in_use.0.fetch_max(now, Ordering::Relaxed);
            }
            if held + 1 > qs.peak_held.load(Ordering::Relaxed) {
                qs.peak_held.fetch_max(held + 1, Ordering::Relaxed);
            }
            qs.gets.fetch_add(1, Ordering::Relaxed);
            return Ok(tag);
        }
        let share_flag = if share_ok { 0 } else { SHARE };
        if register {
            // Count first so that nr_waiting never under-counts WAITING bits.
            self.nr_waiting.0.fetch_add(1, Ordering::SeqCst);
        }
        let update = |s: u32| {
            let dropped = s - 1;
            if register || s & WAITING != 0 {
                (dropped & !SHARE) | WAITING | share_flag
            } else {
                dropped
            }
        };
        let old = match qs
            .state
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |s| Some(update(s)))
        {
            Ok(old) | Err(old) => old,
        };
        self.note_transition(old, update(old));
        if register && old & WAITING != 0 {
            self.nr_waiting.0.fetch_sub(1, Ordering::SeqCst);
        }
        Err(!share_ok)
    }

    /// Clear `qs`'s WAITING flag (only if SHARE is set, with `share_only`).
    /// Returns whether this call cleared it (and so owns the wake-up).
    fn clear_waiting(&self, qs: &QueueSlot, share_only: bool) -> bool {
        let res = qs
            .state
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |s| {
                if s & WAITING == 0 || (share_only && s & SHARE == 0) {
                    None
                } else {
                    Some(s & !(WAITING | SHARE))
                }
            });
        match res {
            Ok(old) => {
                self.note_transition(old, old & HELD);
                self.nr_waiting.0.fetch_sub(1, Ordering::SeqCst);
                true
            }
            Err(_) => false,
        }
    }

    fn wake_one(&self, qs: &QueueSlot, share_only: bool, reason: &Reason) -> bool {
        if !self.clear_waiting(qs, share_only) {
            return false;
        }
        qs.wakeups.fetch_add(1, Ordering::Relaxed);
        let counter = match reason {
            Reason::Batch => &self.batch_wakeups,
            Reason::Idle => &self.idle_wakeups,
            Reason::Share => &self.share_wakeups,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if let Some(waker) = qs.waker.get() {
            waker();
        }
        true
    }

    /// Wake up to `max` waiting queues, round robin.
    fn wake(&self, max: u32, share_only: bool, reason: Reason) {
        let n = self.nr_queues.load(Ordering::Acquire);
        if n == 0 {
            return;
        }
        let start = self.wake_index.load(Ordering::Relaxed) % n;
        let mut woken = 0;
        for k in 0..n {
            if woken >= max {
                break;
            }
            let i = (start + k) % n;
            if self.wake_one(self.slot(i), share_only, &reason) {
                woken += 1;
                self.wake_index.store(i + 1, Ordering::Relaxed);
            }
        }
    }

    /// Take a tag for queue `q`, scanning from `hint` (the caller's own,
    /// updated in place; start with [`TagPool::initial_hint`]). Never
    /// blocks. On `None` the queue is recorded as waiting: it will be woken
    /// (its eventfd written) when it may retry.
    pub(crate) fn try_get(&self, q: QueueId, hint: &mut u32) -> Option<Tag> {
        let qs = self.slot(q.0 as usize);
        if let Ok(tag) = self.attempt(qs, hint, true) {
            return Some(tag);
        }
        // Registered as waiting: retry once, so a put that freed slots
        // before it could see us is not missed.
        match self.attempt(qs, hint, false) {
            Ok(tag) => Some(tag),
            Err(by_share) => {
                qs.waits.fetch_add(1, Ordering::Relaxed);
                if by_share {
                    qs.share_waits.fetch_add(1, Ordering::Relaxed);
                }
                None
            }
        }
    }

    /// Queue `q` stops waiting for a tag (its user went away, e.g. its
    /// connection ended while it waited): it is no longer counted as
    /// waiting, nor as active once it holds nothing, and with fairness the
    /// queues waiting on their share are woken (it just grew). Its tags
    /// must have been put back first. A later `try_get` registers it again.
    pub(crate) fn stop_waiting(&self, q: QueueId) {
        let qs = self.slot(q.0 as usize);
        if self.clear_waiting(qs, false)
            && qs.state.load(Ordering::SeqCst) == 0
            && self.fairness_applies()
        {
            self.wake(u32::MAX, true, Reason::Share);
        }
    }

    /// Return `tag`, taken by queue `q`, and wake waiters as due. A tag
    /// that is not held is ignored (and asserts in debug builds).
    pub(crate) fn put(&self, q: QueueId, tag: Tag) {
        let qs = self.slot(q.0 as usize);
        if tag >= self.depth {
            self.bad_puts.fetch_add(1, Ordering::Relaxed);
            debug_assert!(false, "put of tag {tag} >= depth {}", self.depth);
            return;
        }
        let mask = 1u64 << (tag & ((1 << self.shift) - 1));
        let prev = self.words[(tag >> self.shift) as usize]
            .0
            .fetch_and(!mask, Ordering::SeqCst);
        if prev & mask == 0 {
            self.bad_puts.fetch_add(1, Ordering::Relaxed);
            debug_assert!(false, "double put of tag {tag}");
            return;
        }
        let was_last = self.in_use.0.fetch_sub(1, Ordering::SeqCst) == 1;
        let old = qs.state.fetch_sub(1, Ordering::SeqCst);
        if old & HELD == 0 {
            // Put through the wrong queue: undo the underflow.
            qs.state.fetch_add(1, Ordering::SeqCst);
            debug_assert!(false, "put of tag {tag} by a queue holding none");
            return;
        }
        let new = old - 1;
        self.note_transition(old, new);
        qs.puts.fetch_add(1, Ordering::Relaxed);
        if self.nr_waiting.0.load(Ordering::SeqCst) == 0 {
            return;
        }
        self.wake_after_put(qs, new, was_last);
    }

    fn wake_after_put(&self, qs: &QueueSlot, new: u32, was_last: bool) {
        if was_last {
            self.pending.0.store(0, Ordering::Relaxed);
            self.wake(u32::MAX, false, Reason::Idle);
            return;
        }
        if self.fairness_applies() {
            if new & SHARE != 0 && new & HELD < self.share() {
                self.wake_one(qs, true, &Reason::Share);
            }
            if new == 0 {
                // A queue went inactive: every share grew.
                self.wake(u32::MAX, true, Reason::Share);
            }
        }
        let n = self.pending.0.fetch_add(1, Ordering::SeqCst) + 1;
        if n >= self.wake_batch
            && self
                .pending
                .0
                .compare_exchange(n, 0, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        {
            self.wake(n, false, Reason::Batch);
        }
    }

    /// A snapshot of the counters (not atomic as a whole).
    pub(crate) fn stats(&self) -> PoolStats {
        let n = self.nr_queues.load(Ordering::Acquire);
        let queues: Vec<QueueStats> = (0..n)
            .map(|i| {
                let qs = self.slot(i);
                let state = qs.state.load(Ordering::Relaxed);
                QueueStats {
                    held: state & HELD,
                    peak_held: qs.peak_held.load(Ordering::Relaxed),
                    gets: qs.gets.load(Ordering::Relaxed),
                    puts: qs.puts.load(Ordering::Relaxed),
                    waits: qs.waits.load(Ordering::Relaxed),
                    share_waits: qs.share_waits.load(Ordering::Relaxed),
                    wakeups: qs.wakeups.load(Ordering::Relaxed),
                    waiting: state & WAITING != 0,
                }
            })
            .collect();
        let sum = |f: fn(&QueueStats) -> u64| queues.iter().map(f).sum::<u64>();
        PoolStats {
            depth: self.depth,
            fairness: self.fairness,
            wake_batch: self.wake_batch,
            bits_per_word: 1 << self.shift,
            words: self.words.len() as u32,
            in_use: self.in_use(),
            peak_in_use: self.peak_in_use.0.load(Ordering::Relaxed),
            active_queues: self.active.0.load(Ordering::Relaxed),
            waiting_queues: queues.iter().filter(|q| q.waiting).count() as u32,
            gets: sum(|q| q.gets),
            puts: sum(|q| q.puts),
            waits: sum(|q| q.waits),
            share_waits: sum(|q| q.share_waits),
            wakeups_sent: sum(|q| q.wakeups),
            batch_wakeups: self.batch_wakeups.load(Ordering::Relaxed),
            idle_wakeups: self.idle_wakeups.load(Ordering::Relaxed),
            share_wakeups: self.share_wakeups.load(Ordering::Relaxed),
            bad_puts: self.bad_puts.load(Ordering::Relaxed),
            queues,
        }
    }
}

impl std::fmt::Debug for TagPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TagPool")
            .field("depth", &self.depth)
            .field("fairness", &self.fairness)
            .field("in_use", &self.in_use())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
impl TagPool {
    /// Free tags to accumulate before waking waiters.
    pub(crate) fn wake_batch(&self) -> u32 {
        self.wake_batch
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::atomic::AtomicBool;
    use std::sync::Barrier;
    use std::thread;
    use std::time::{Duration, Instant};

    fn efd() -> Arc<EventFd> {
        Arc::new(EventFd::new(libc::EFD_NONBLOCK).unwrap())
    }

    /// Consume the eventfd's count; whether it was signalled.
    fn signalled(efd: &EventFd) -> bool {
        efd.read().is_ok()
    }

    /// Wait up to `ms` for the eventfd to become readable.
    fn wait_readable(efd: &EventFd, ms: i32) -> bool {
        use std::os::unix::io::AsRawFd;
        let mut pfd = libc::pollfd {
            fd: efd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, ms) };
        r == 1
    }

    /// A tiny deterministic PRNG for the stress loops.
    struct XorShift(u64);
    impl XorShift {
        fn next(&mut self) -> u32 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 >> 32) as u32
        }
    }

    #[test]
    fn layout_spreads_small_depths_and_hands_out_every_tag_once() {
        for (depth, bpw, words) in [
            (1, 64, 1),
            (3, 64, 1),
            (8, 2, 4),
            (100, 16, 7),
            (256, 64, 4),
            (300, 64, 5),
        ] {
            let pool = TagPool::new(depth, false);
            let s = pool.stats();
            assert_eq!((s.bits_per_word, s.words), (bpw, words), "depth {depth}");
            let q = pool.register(efd());
            let mut hint = pool.initial_hint(q);
            let tags: HashSet<Tag> = (0..depth)
                .map(|_| pool.try_get(q, &mut hint).unwrap())
                .collect();
            assert_eq!(tags, (0..depth).collect::<HashSet<_>>());
            assert_eq!(pool.try_get(q, &mut hint), None);
            assert_eq!(pool.in_use(), depth);
            for t in tags {
                pool.put(q, t);
            }
            assert_eq!(pool.in_use(), 0);
        }
    }

    /// How long a test waits for something that must happen (generous:
    /// the point is that it happens, on however loaded a machine).
    const PATIENCE: Duration = Duration::from_secs(30);

    /// Operations each stress thread does at least.
    const STRESS_OPS: u64 = 64 * 400;

    /// Four threads take and put tags at random (each holding at most half
    /// the depth) for at least [`STRESS_OPS`] operations each, and on until
    /// the pool has been contended (a take refused for lack of slots).
    fn stress(depth: u32, fairness: bool) {
        let pool = Arc::new(TagPool::new(depth, fairness));
        let contended = Arc::new(AtomicBool::new(false));
        let holders = Arc::new(AtomicU32::new(0));
        let owners: Arc<Vec<AtomicU32>> = Arc::new((0..depth).map(|_| AtomicU32::new(0)).collect());
        let max_hold = (depth / 2).max(2) as usize;
        let start = Arc::new(Barrier::new(4));
        let handles: Vec<_> = (0..4u32)
            .map(|me| {
                let (pool, holders, owners, start, contended) = (
                    pool.clone(),
                    holders.clone(),
                    owners.clone(),
                    start.clone(),
                    contended.clone(),
                );
                thread::spawn(move || {
                    let me = me + 1;
                    let waker = efd();
                    let q = pool.register(waker.clone());
                    let mut hint = pool.initial_hint(q);
                    let mut rng = XorShift(0x9E37_79B9 * u64::from(me));
                    let mut held: Vec<Tag> = Vec::new();
                    let mut ops = 0u64;
                    start.wait();
                    let deadline = Instant::now() + PATIENCE;
                    while (ops < STRESS_OPS || !contended.load(Ordering::SeqCst))
                        && Instant::now() < deadline
                    {
                        for _ in 0..64 {
                            let take =
                                held.is_empty() || (held.len() < max_hold && rng.next() % 2 == 0);
                            if take {
                                if let Some(t) = pool.try_get(q, &mut hint) {
                                    let h = holders.fetch_add(1, Ordering::SeqCst) + 1;
                                    assert!(h <= depth, "{h} holders > depth {depth}");
                                    let prev = owners[t as usize].swap(me, Ordering::SeqCst);
                                    assert_eq!(
                                        prev, 0,
                                        "tag {t} handed to {me} while held by {prev}"
                                    );
                                    held.push(t);
                                } else {
                                    contended.store(true, Ordering::SeqCst);
                                    signalled(&waker);
                                    thread::yield_now();
                                }
                            } else {
                                let t = held.swap_remove(rng.next() as usize % held.len());
                                assert_eq!(owners[t as usize].swap(0, Ordering::SeqCst), me);
                                holders.fetch_sub(1, Ordering::SeqCst);
                                pool.put(q, t);
                            }
                            assert!(pool.in_use() <= depth);
                            ops += 1;
                        }
                    }
                    for t in held {
                        assert_eq!(owners[t as usize].swap(0, Ordering::SeqCst), me);
                        holders.fetch_sub(1, Ordering::SeqCst);
                        pool.put(q, t);
                    }
                    ops
                })
            })
            .collect();
        let ops: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
        let s = pool.stats();
        assert!(ops >= 4 * STRESS_OPS, "only {ops} operations");
        assert_eq!(s.in_use, 0);
        assert_eq!(s.gets, s.puts);
        assert!(s.gets > 100);
        assert_eq!(s.bad_puts, 0);
        assert!(s.peak_in_use <= depth);
        assert!(
            s.waits > 0,
            "depth {depth}: never contended in {PATIENCE:?}"
        );
        // Every queue is idle and no one was left waiting (no lost wake-up).
        assert_eq!(s.active_queues, 0, "{s:?}");
        assert_eq!(s.waiting_queues, 0, "{s:?}");
        assert!(s.queues.iter().all(|q| q.held == 0));
    }

    #[test]
    fn stress_never_over_allocates_depth_8() {
        stress(8, false);
    }

    #[test]
    fn stress_never_over_allocates_depth_100() {
        stress(100, false);
    }

    #[test]
    fn stress_never_over_allocates_depth_300_and_with_fairness() {
        stress(300, false);
        stress(8, true);
        stress(100, true);
    }

    #[test]
    fn fairness_caps_each_active_queue_at_its_share() {
        let pool = TagPool::new(16, true);
        let qs: Vec<QueueId> = (0..3).map(|_| pool.register(efd())).collect();
        let mut hints = [0u32; 3];
        // Make all three active.
        for i in 0..3 {
            pool.try_get(qs[i], &mut hints[i]).unwrap();
        }
        let mut held = [1u32; 3];
        for i in 0..3 {
            while pool.try_get(qs[i], &mut hints[i]).is_some() {
                held[i] += 1;
            }
        }
        assert_eq!(held, [6, 6, 4]);
        let s = pool.stats();
        assert_eq!(s.in_use, 16);
        assert_eq!(s.active_queues, 3);
        assert_eq!(s.queues[0].share_waits, 1, "q0 refused by its share");
        assert_eq!(s.queues[2].share_waits, 0, "q2 refused for lack of slots");
        assert!(s.queues.iter().all(|q| q.peak_held <= 6));
    }

    #[test]
    fn fairness_off_lets_one_queue_take_everything() {
        let pool = TagPool::new(16, false);
        let qs: Vec<QueueId> = (0..3).map(|_| pool.register(efd())).collect();
        let mut hint = 0;
        let a = pool.try_get(qs[1], &mut hint).unwrap();
        let b = pool.try_get(qs[2], &mut hint).unwrap();
        let mut n = 0;
        while pool.try_get(qs[0], &mut hint).is_some() {
            n += 1;
        }
        assert_eq!(n, 14, "q0 takes all that is free despite 3 active queues");
        pool.put(qs[1], a);
        pool.put(qs[2], b);
        assert!(pool.try_get(qs[0], &mut hint).is_some());
        assert!(pool.try_get(qs[0], &mut hint).is_some());
        assert_eq!(pool.stats().queues[0].peak_held, 16);
        // With one registered user (a per-queue pool), fairness never limits.
        let single = TagPool::new(16, true);
        let q = single.register(efd());
        assert!((0..16).all(|_| single.try_get(q, &mut hint).is_some()));
    }

    #[test]
    fn fairness_bound_holds_under_threads() {
        let pool = Arc::new(TagPool::new(16, true));
        let start = Arc::new(Barrier::new(3));
        // Set once a queue has held its whole share: every thread goes on
        // until then (at least ITERS steps each).
        const ITERS: u32 = 20_000;
        let reached = Arc::new(AtomicBool::new(false));
        let handles: Vec<_> = (0..3u64)
            .map(|me| {
                let (pool, start, reached) = (pool.clone(), start.clone(), reached.clone());
                thread::spawn(move || {
                    let waker = efd();
                    let q = pool.register(waker.clone());
                    let mut hint = pool.initial_hint(q);
                    // One tag held throughout keeps the queue active.
                    let anchor = pool.try_get(q, &mut hint).unwrap();
                    start.wait();
                    let mut rng = XorShift(77 + me);
                    let mut held = vec![];
                    let mut max_seen = 1;
                    let deadline = Instant::now() + PATIENCE;
                    let mut steps = 0;
                    while (steps < ITERS || !reached.load(Ordering::SeqCst))
                        && Instant::now() < deadline
                    {
                        steps += 1;
                        if rng.next() % 2 == 0 {
                            if let Some(t) = pool.try_get(q, &mut hint) {
                                held.push(t);
                                max_seen = max_seen.max(held.len() + 1);
                                assert!(held.len() < 6, "queue holds {} > 6", held.len() + 1);
                                if max_seen == 6 {
                                    reached.store(true, Ordering::SeqCst);
                                }
                            } else {
                                signalled(&waker);
                            }
                        } else if let Some(t) = held.pop() {
                            pool.put(q, t);
                        }
                    }
                    for t in held {
                        pool.put(q, t);
                    }
                    start.wait();
                    pool.put(q, anchor);
                    max_seen
                })
            })
            .collect();
        let seen: Vec<usize> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let s = pool.stats();
        assert!(s.queues.iter().all(|q| q.peak_held <= 6), "{s:?}");
        assert!(seen.contains(&6), "share never reached: {seen:?}");
        assert_eq!(s.in_use, 0);
    }

    fn no_lost_wakeup(depth: u32, threads: u32, fairness: bool) {
        const ITERS: u32 = 2000;
        let pool = Arc::new(TagPool::new(depth, fairness));
        let start = Arc::new(Barrier::new(threads as usize));
        let attempted = Arc::new(Barrier::new(threads as usize));
        let handles: Vec<_> = (0..threads)
            .map(|me| {
                let (pool, start, attempted) = (pool.clone(), start.clone(), attempted.clone());
                thread::spawn(move || {
                    let waker = efd();
                    let q = pool.register(waker.clone());
                    let mut hint = pool.initial_hint(q);
                    let mut waits = 0u32;
                    start.wait();
                    // Every thread tries once while the others hold what they
                    // got: with more threads than tags, some of them find the
                    // pool empty, whatever the scheduler does, so the loop
                    // below always starts with queues waiting for a wake-up.
                    let first = pool.try_get(q, &mut hint);
                    attempted.wait();
                    let got_first = first.is_some();
                    match first {
                        Some(tag) => pool.put(q, tag),
                        None => waits += 1,
                    }
                    for i in 0..ITERS {
                        let tag = loop {
                            if let Some(t) = pool.try_get(q, &mut hint) {
                                break t;
                            }
                            waits += 1;
                            if !wait_readable(&waker, PATIENCE.as_millis() as i32) {
                                panic!(
                                    "thread {me} iteration {i}: no wake-up in {PATIENCE:?}, in use {}/{depth}: {:?}",
                                    pool.in_use(),
                                    pool.stats()
                                );
                            }
                            assert!(signalled(&waker));
                        };
                        for _ in 0..(i % 7) * 20 {
                            std::hint::spin_loop();
                        }
                        if i % 5 == 0 {
                            thread::yield_now();
                        }
                        pool.put(q, tag);
                    }
                    (q, waits, u32::from(got_first))
                })
            })
            .collect();
        let ends: Vec<(QueueId, u32, u32)> =
            handles.into_iter().map(|h| h.join().unwrap()).collect();
        let waits: u32 = ends.iter().map(|&(_, w, _)| w).sum();
        let firsts: u32 = ends.iter().map(|&(_, _, f)| f).sum();
        let s = pool.stats();
        assert!(
            firsts < threads,
            "{firsts} of {threads} threads got one of {depth} tags"
        );
        assert_eq!(s.gets, u64::from(ITERS * threads + firsts));
        for (q, _, first) in ends {
            assert_eq!(s.queues[q.0 as usize].gets, u64::from(ITERS + first));
        }
        assert!(waits > 0, "depth {depth}, {threads} threads: never waited");
        assert_eq!(s.waiting_queues, 0);
        assert_eq!(s.in_use, 0);
    }

    #[test]
    fn no_lost_wakeup_depth_1() {
        no_lost_wakeup(1, 3, false);
        no_lost_wakeup(1, 4, true);
    }

    #[test]
    fn no_lost_wakeup_depth_2() {
        no_lost_wakeup(2, 4, false);
        no_lost_wakeup(2, 3, true);
    }

    #[test]
    fn frees_are_batched_but_wake_the_waiter() {
        let pool = TagPool::new(64, false);
        assert_eq!(pool.wake_batch(), 8);
        let (e0, e1) = (efd(), efd());
        let (q0, q1) = (pool.register(e0.clone()), pool.register(e1.clone()));
        let (mut h0, mut h1) = (0, 0);
        let mut held: Vec<Tag> = (0..64)
            .map(|_| pool.try_get(q0, &mut h0).unwrap())
            .collect();
        let mut puts = 0;
        for round in 0..50 {
            assert_eq!(pool.try_get(q1, &mut h1), None);
            assert!(pool.stats().queues[1].waiting);
            for k in 1..=8 {
                pool.put(q0, held.pop().unwrap());
                puts += 1;
                assert_eq!(signalled(&e1), k == 8, "round {round}, free {k}");
            }
            assert!(!pool.stats().queues[1].waiting);
            // Refill to full for the next round (without failing: q0 never waits).
            for _ in 0..8 {
                held.push(pool.try_get(q0, &mut h0).unwrap());
            }
        }
        let s = pool.stats();
        assert_eq!(s.wakeups_sent, 50);
        assert_eq!(s.batch_wakeups, 50);
        assert!(s.wakeups_sent < puts);
        assert!(!signalled(&e0));
    }

    #[test]
    fn idle_pool_wakes_every_remaining_waiter() {
        let pool = TagPool::new(16, false);
        assert_eq!(pool.wake_batch(), 2);
        let q0 = pool.register(efd());
        let mut hint = 0;
        let held: Vec<Tag> = (0..16)
            .map(|_| pool.try_get(q0, &mut hint).unwrap())
            .collect();
        let waiters: Vec<(QueueId, Arc<EventFd>)> = (0..20)
            .map(|_| {
                let e = efd();
                let q = pool.register(e.clone());
                assert_eq!(pool.try_get(q, &mut hint), None);
                (q, e)
            })
            .collect();
        let mut woken = 0;
        for (k, t) in held.into_iter().enumerate() {
            pool.put(q0, t);
            woken += waiters.iter().filter(|(_, e)| signalled(e)).count();
            if k < 15 {
                // A batch of n frees wakes n waiters.
                assert_eq!(woken, k.div_ceil(2) * 2, "after {} puts", k + 1);
            }
        }
        assert_eq!(woken, 20, "the idle put wakes the rest");
        let s = pool.stats();
        assert_eq!((s.batch_wakeups, s.idle_wakeups), (14, 6));
        assert_eq!(s.waiting_queues, 0);
        assert_eq!(s.active_queues, 0);
    }

    #[test]
    fn share_limited_queue_is_woken_by_its_share_or_an_idle_queue() {
        let pool = TagPool::new(16, true);
        let e: Vec<Arc<EventFd>> = (0..3).map(|_| efd()).collect();
        let q: Vec<QueueId> = e.iter().map(|e| pool.register(e.clone())).collect();
        let mut hint = 0;
        let mut mine: Vec<Tag> = vec![];
        let other1 = pool.try_get(q[1], &mut hint).unwrap();
        let other2 = pool.try_get(q[2], &mut hint).unwrap();
        while let Some(t) = pool.try_get(q[0], &mut hint) {
            mine.push(t);
        }
        assert_eq!(mine.len(), 6);
        // Its own put brings it under its share: woken at once, no batch.
        pool.put(q[0], mine.pop().unwrap());
        assert!(signalled(&e[0]));
        mine.push(pool.try_get(q[0], &mut hint).unwrap());
        assert_eq!(pool.try_get(q[0], &mut hint), None);
        assert!(!signalled(&e[0]));
        // q2 goes inactive: two active queues, share 8.
        pool.put(q[2], other2);
        assert!(signalled(&e[0]));
        assert_eq!(pool.stats().active_queues, 2);
        mine.push(pool.try_get(q[0], &mut hint).unwrap());
        mine.push(pool.try_get(q[0], &mut hint).unwrap());
        assert_eq!(pool.try_get(q[0], &mut hint), None);
        assert_eq!(mine.len(), 8);
        let s = pool.stats();
        assert_eq!(s.share_wakeups, 2);
        assert_eq!(s.queues[0].share_waits, 3);
        for t in mine {
            pool.put(q[0], t);
        }
        pool.put(q[1], other1);
        assert_eq!(pool.stats().active_queues, 0);
    }

    /// A waiting queue whose user goes away stops counting as waiting and
    /// active, and is not woken by later puts.
    #[test]
    fn a_queue_that_stops_waiting_is_neither_waiting_nor_active() {
        let pool = TagPool::new(2, false);
        let (e0, e1) = (efd(), efd());
        let (q0, q1) = (pool.register(e0.clone()), pool.register(e1.clone()));
        let (mut h0, mut h1) = (0, 0);
        let held: Vec<Tag> = (0..2).map(|_| pool.try_get(q0, &mut h0).unwrap()).collect();
        assert_eq!(pool.try_get(q1, &mut h1), None);
        let s = pool.stats();
        assert_eq!((s.active_queues, s.waiting_queues), (2, 1));
        pool.stop_waiting(q1);
        let s = pool.stats();
        assert_eq!((s.active_queues, s.waiting_queues), (1, 0));
        for t in held {
            pool.put(q0, t);
        }
        let s = pool.stats();
        assert_eq!((s.in_use, s.active_queues, s.wakeups_sent), (0, 0, 0));
        assert!(!signalled(&e1), "a queue that left was woken");
        // Not waiting: a second call changes nothing; it registers again.
        pool.stop_waiting(q1);
        assert_eq!(pool.stats().active_queues, 0);
        assert!(pool.try_get(q1, &mut h1).is_some());
    }

    /// With fairness, a queue that leaves while waiting for slots makes
    /// the others' share grow: a queue waiting on its share is woken.
    #[test]
    fn a_queue_that_stops_waiting_gives_its_share_back() {
        let pool = TagPool::new(4, true);
        let (e0, e1) = (efd(), efd());
        let (q0, q1) = (pool.register(e0.clone()), pool.register(e1.clone()));
        let (mut h0, mut h1) = (0, 0);
        for _ in 0..4 {
            pool.try_get(q0, &mut h0).unwrap();
        }
        // The pool is full: q1 waits for slots, and q0, over its share of
        // 2 now that q1 is active, waits on its share.
        assert_eq!(pool.try_get(q1, &mut h1), None);
        assert_eq!(pool.try_get(q0, &mut h0), None);
        let s = pool.stats();
        assert_eq!((s.active_queues, s.waiting_queues), (2, 2));
        assert_eq!(s.queues[0].share_waits, 1);
        pool.stop_waiting(q1);
        let s = pool.stats();
        assert_eq!((s.active_queues, s.waiting_queues), (1, 0));
        assert!(signalled(&e0), "the share waiter was not woken");
        assert!(!signalled(&e1));
    }

    #[test]
    fn stats_count_peak_waits_and_ignore_double_put() {
        let pool = TagPool::new(4, false);
        let q = pool.register(efd());
        let mut hint = 0;
        let a = pool.try_get(q, &mut hint).unwrap();
        let b = pool.try_get(q, &mut hint).unwrap();
        let c = pool.try_get(q, &mut hint).unwrap();
        pool.put(q, b);
        pool.put(q, c);
        let s = pool.stats();
        assert_eq!((s.in_use, s.peak_in_use, s.waits), (1, 3, 0));
        let rest: Vec<Tag> = (0..3)
            .map(|_| pool.try_get(q, &mut hint).unwrap())
            .collect();
        assert_eq!(pool.try_get(q, &mut hint), None);
        assert_eq!(pool.try_get(q, &mut hint), None);
        let s = pool.stats();
        assert_eq!(
            (s.in_use, s.peak_in_use, s.waits, s.gets, s.puts),
            (4, 4, 2, 6, 2)
        );
        assert_eq!(s.queues[0].held, 4);
        assert_eq!(s.queues[0].peak_held, 4);
        assert!(s.queues[0].waiting);
        assert_eq!(s.active_queues, 1);
        pool.put(q, a);
        // Double put: asserts in debug builds, ignored either way.
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pool.put(q, a)));
        assert_eq!(r.is_err(), cfg!(debug_assertions));
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pool.put(q, 99)));
        assert_eq!(r.is_err(), cfg!(debug_assertions));
        let s = pool.stats();
        assert_eq!((s.in_use, s.puts, s.bad_puts), (3, 3, 2));
        assert_eq!(s.queues[0].held, 3);
        for t in rest {
            pool.put(q, t);
        }
        let s = pool.stats();
        assert_eq!(
            (s.in_use, s.peak_in_use, s.active_queues, s.waiting_queues),
            (0, 4, 0, 0)
        );
        assert_eq!(s.wakeups_sent, 1, "the idle put woke the waiting queue");
    }
}
