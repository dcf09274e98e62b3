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

use serde::Serialize;
use vmm_sys_util::eventfd::EventFd;

/// A slot index, `0..depth`.
pub type Tag = u32;

/// A registered user of a pool (a virtqueue), as returned by
/// [`TagPool::register`]. Only meaningful for the pool that issued it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QueueId(u32);

impl QueueId {
    /// The registration index (0 for the first registered queue).
    pub fn index(self) -> u32 {
        self.0
    }
}

/// How a waiting queue is woken.
pub type Waker = Box<dyn Fn() + Send + Sync>;

/// Users per pool: 64 chunks of 64 (e.g. 64 disks x 64 queues, host scope).
pub const MAX_QUEUES: usize = CHUNKS * CHUNK;
const CHUNK: usize = 64;
const CHUNKS: usize = 64;

/// Per-queue state word: held tags in the low bits, plus flags.
const WAITING: u32 = 1 << 31;
/// Set with `WAITING` when the queue waits on its fair share, not on slots.
const SHARE: u32 = 1 << 30;
const HELD: u32 = SHARE - 1;
/// Largest supported depth (the held count must fit in `HELD`).
pub const MAX_DEPTH: u32 = HELD;

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
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
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
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
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
pub struct TagPool {
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
    pub fn new(depth: u32, fairness: bool) -> TagPool {
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
    pub fn register(&self, waker: Arc<EventFd>) -> QueueId {
        self.register_waker(Box::new(move || {
            // EAGAIN only if the counter is saturated: already readable.
            let _ = waker.write(1);
        }))
    }

    /// Register a user woken by calling `waker` (from the thread doing the
    /// `put`; keep it short and non-blocking).
    pub fn register_waker(&self, waker: Waker) -> QueueId {
        let _guard = self
            .register_lock
            .lock()
            .unwrap_or_else(|e| e.into_inner());
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

    /// The number of tags.
    pub fn depth(&self) -> u32 {
        self.depth
    }

    /// Free tags to accumulate before waking waiters.
    pub fn wake_batch(&self) -> u32 {
        self.wake_batch
    }

    /// Tags in use now.
    pub fn in_use(&self) -> u32 {
        self.in_use.0.load(Ordering::Relaxed).min(self.depth)
    }

    /// A starting allocation hint for queue `q`, spread over the depth.
    pub fn initial_hint(&self, q: QueueId) -> u32 {
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
    pub fn try_get(&self, q: QueueId, hint: &mut u32) -> Option<Tag> {
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

    /// Return `tag`, taken by queue `q`, and wake waiters as due. A tag
    /// that is not held is ignored (and asserts in debug builds).
    pub fn put(&self, q: QueueId, tag: Tag) {
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
    pub fn stats(&self) -> PoolStats {
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
