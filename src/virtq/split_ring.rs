//! The device side of a split virtqueue (virtio 1.2 §2.7) over host
//! pointers translated once.
//!
//! vhost-user-backend keeps the queue's configuration and indices in
//! virtio-queue's `Queue`, whose accessors translate every ring address
//! through vm-memory on every access. A [`SplitRing`] checks the three ring
//! parts once per memory table or ring address change (each must lie inside
//! one guest memory region and be aligned as §2.7 requires, as libvhost-user
//! and virtio-queue's `is_valid` demand) and then reads and writes them
//! through host pointers: the avail and used indices and entries with
//! atomic accesses, descriptors with volatile 16-byte reads. The walk of a
//! descriptor chain and the notification arithmetic follow virtio-queue's
//! `DescriptorChain` and `Queue` exactly (loops and over-long chains cut by
//! a TTL, an indirect table inside an indirect table refused, chains over
//! 2^32 bytes cut, `needs_notification` as Linux's `vring_need_event`), so
//! the guest sees the same device.
//!
//! The ring holds its [`GuestMap`], which keeps the memory table it was
//! checked against mapped: after the frontend replaces the table, the old
//! pointers still point into live (old) mappings until the worker notices
//! the change and checks the ring again against the new table.

use std::num::Wrapping;
use std::sync::atomic::{fence, AtomicU16, AtomicU32, Ordering};
use std::sync::Arc;

use vm_memory::{Bytes, GuestAddress};

use super::dirty_log::DirtyLog;
use super::guest_map::GuestMap;

/// `VRING_DESC_F_NEXT`, `VRING_DESC_F_WRITE`, `VRING_DESC_F_INDIRECT`.
const F_NEXT: u16 = 1;
const F_WRITE: u16 = 2;
const F_INDIRECT: u16 = 4;
/// `VRING_USED_F_NO_NOTIFY`.
const USED_F_NO_NOTIFY: u16 = 1;
const DESC_SIZE: u64 = 16;

/// One descriptor's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Segment {
    pub addr: u64,
    pub len: u32,
    /// Device-writable.
    pub write: bool,
}

/// A split ring's place in guest memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RingLayout {
    pub desc: u64,
    pub avail: u64,
    pub used: u64,
    pub size: u16,
}

impl RingLayout {
    /// The three parts as (name, guest address, length in bytes, the
    /// alignment §2.7 requires of the guest address, the alignment our
    /// accesses need of the host address: the rings' u16/u32 atomics need
    /// theirs, descriptors are read bytewise when not 8-byte aligned).
    pub(crate) fn parts(&self) -> [Part; 3] {
        let n = u64::from(self.size);
        [
            ("descriptor table", self.desc, 16 * n, 16, 1),
            ("avail ring", self.avail, 6 + 2 * n, 2, 2),
            ("used ring", self.used, 6 + 8 * n, 4, 4),
        ]
    }

    /// The first pair of parts, one of `self` and one of `other`, whose
    /// bytes overlap (the device writes the used ring, so a used ring over
    /// any other part would have the device feed itself).
    pub(crate) fn overlap_with(&self, other: &RingLayout) -> Option<(&'static str, &'static str)> {
        let mine = self.parts();
        let theirs = other.parts();
        mine.iter().find_map(|&(a, at, len, ..)| {
            theirs
                .iter()
                .find(|&&(_, bt, blen, ..)| ranges_overlap(at, len, bt, blen))
                .map(|&(b, ..)| (a, b))
        })
    }

    /// The first two parts of this ring that overlap each other.
    fn self_overlap(&self) -> Option<(&'static str, &'static str)> {
        let p = self.parts();
        [(0, 1), (0, 2), (1, 2)].iter().find_map(|&(i, j)| {
            ranges_overlap(p[i].1, p[i].2, p[j].1, p[j].2).then_some((p[i].0, p[j].0))
        })
    }
}

/// A ring part: name, guest address, length, guest and host alignment.
pub(crate) type Part = (&'static str, u64, u64, u64, u64);

/// Whether [a, a + alen) and [b, b + blen) share a byte (ends saturate:
/// a part that wraps the address space is refused elsewhere).
fn ranges_overlap(a: u64, alen: u64, b: u64, blen: u64) -> bool {
    a < b.saturating_add(blen) && b < a.saturating_add(alen)
}

/// Why a ring cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum RingError {
    #[error("the {what} ({len} bytes at guest address {at:#x}, queue size {size}) is not inside one guest memory region")]
    Outside {
        what: &'static str,
        at: u64,
        len: u64,
        size: u16,
    },
    #[error("the {what} at guest address {at:#x} is not {align}-byte aligned (virtio 1.2 §2.7)")]
    Misaligned {
        what: &'static str,
        at: u64,
        align: u64,
    },
    #[error("the {what} at guest address {at:#x} is at host address {host:#x}, not {align}-byte aligned (the region's guest address and its mapping disagree)")]
    HostMisaligned {
        what: &'static str,
        at: u64,
        host: usize,
        align: u64,
    },
    #[error("the {a} and the {b} overlap (virtio 1.2 §2.7: the device writes the used ring)")]
    Overlap { a: &'static str, b: &'static str },
    #[error("the {part} overlaps the {other} of queue {queue}")]
    CrossQueue {
        part: &'static str,
        other: &'static str,
        queue: usize,
    },
    #[error("queue size {0} is not a power of 2 between 1 and 32768")]
    Size(u16),
    #[error("the avail index moved from {next} to {idx}, more than the queue size {size}")]
    AvailIndex { next: u16, idx: u16, size: u16 },
    #[error("the driver made descriptor {head} available, beyond the queue size {size}")]
    Head { head: u16, size: u16 },
}

/// What [`SplitRing::pop`] took off the avail ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Popped {
    pub head: u16,
    /// The walk stopped on a descriptor that says more follow (a loop, a
    /// chain longer than its table, a next index outside the table, an
    /// unreadable descriptor or indirect table, over 2^32 bytes).
    pub truncated: bool,
}

/// A split ring's indices and notification state, and host pointers to
/// its three parts.
pub(crate) struct SplitRing {
    map: GuestMap,
    layout: RingLayout,
    desc: *const u8,
    avail: *const u8,
    used: *mut u8,
    event_idx: bool,
    /// Next avail entry to pop.
    pub next_avail: Wrapping<u16>,
    /// Next used entry to fill (also the used index published).
    pub next_used: Wrapping<u16>,
    /// Used entries added since the last notification check.
    num_added: Wrapping<u16>,
    /// This ring has told the driver not to notify and not yet asked again
    /// (false when unknown: the next disable writes the flag).
    notify_off: bool,
    /// The frontend's dirty log while it migrates the guest: every write
    /// to the used ring marks its page.
    log: Option<Arc<DirtyLog>>,
}

// SAFETY: the raw pointers point into mappings `map` keeps alive; they
// are only used for atomic and volatile accesses, as the guest's own.
unsafe impl Send for SplitRing {}

/// Check that `len` bytes at `at` lie in one region, aligned to `align`
/// both as a guest address (§2.7) and as a host address (the atomic
/// accesses need it; a region whose guest address and mapping disagree
/// in their low bits would misalign every part inside it).
fn part(
    map: &GuestMap,
    (what, at, len, align, host_align): Part,
    size: u16,
) -> Result<*mut u8, RingError> {
    if at % align != 0 {
        return Err(RingError::Misaligned { what, at, align });
    }
    let host = map.host(at, len).ok_or(RingError::Outside {
        what,
        at,
        len,
        size,
    })?;
    if host as usize % host_align as usize != 0 {
        return Err(RingError::HostMisaligned {
            what,
            at,
            host: host as usize,
            align: host_align,
        });
    }
    Ok(host)
}

impl SplitRing {
    /// Check `layout` against `map` and keep pointers to it. Indices start
    /// at `next_avail` / `next_used` (the queue's, as the frontend set
    /// them).
    pub(crate) fn new(
        map: GuestMap,
        layout: RingLayout,
        event_idx: bool,
        next_avail: u16,
        next_used: u16,
    ) -> Result<SplitRing, RingError> {
        let size = layout.size;
        if size == 0 || size > 32768 || !size.is_power_of_two() {
            return Err(RingError::Size(size));
        }
        let [d, a, u] = layout.parts();
        let desc = part(&map, d, size)?;
        let avail = part(&map, a, size)?;
        let used = part(&map, u, size)?;
        if let Some((a, b)) = layout.self_overlap() {
            return Err(RingError::Overlap { a, b });
        }
        Ok(SplitRing {
            map,
            layout,
            desc,
            avail,
            used,
            event_idx,
            next_avail: Wrapping(next_avail),
            next_used: Wrapping(next_used),
            num_added: Wrapping(0),
            notify_off: false,
            log: None,
        })
    }

    pub(crate) fn map(&self) -> &GuestMap {
        &self.map
    }

    /// The memory map, to check another layout against it.
    pub(crate) fn into_map(self) -> GuestMap {
        self.map
    }

    /// Take the queue's indices (the frontend may have set them since the
    /// last pass). A used index set elsewhere starts the notification
    /// arithmetic afresh.
    #[inline]
    pub(crate) fn set_indices(&mut self, next_avail: u16, next_used: u16) {
        if self.next_used.0 != next_used {
            self.num_added = Wrapping(0);
        }
        self.next_avail = Wrapping(next_avail);
        self.next_used = Wrapping(next_used);
    }

    pub(crate) fn layout(&self) -> RingLayout {
        self.layout
    }

    /// Log the ring's writes (and, through [`log_written`], the data's) in
    /// `log` from now on; `None`: log nothing. Without a log before or
    /// after, nothing is touched (the request path's cost while the
    /// frontend does not migrate).
    ///
    /// [`log_written`]: Self::log_written
    #[inline]
    pub(crate) fn set_log(&mut self, log: Option<Arc<DirtyLog>>) {
        if log.is_some() || self.log.is_some() {
            self.replace_log(log);
        }
    }

    #[cold]
    #[inline(never)]
    fn replace_log(&mut self, log: Option<Arc<DirtyLog>>) {
        self.log = log;
    }

    /// The dirty log this ring marks, if any.
    pub(crate) fn log(&self) -> Option<&DirtyLog> {
        self.log.as_deref()
    }

    /// Mark the pages of the device-writable buffers in `segs` (a chain
    /// the device has just answered) when logging.
    #[inline]
    pub(crate) fn log_written(&self, segs: &[Segment]) {
        if let Some(log) = &self.log {
            mark_written(log, segs);
        }
    }

    /// Mark the page of `len` bytes at `offset` in the used ring when
    /// logging (after writing them).
    #[inline]
    fn log_used(&self, offset: usize, len: u64) {
        if let Some(log) = &self.log {
            mark_used(log, self.layout.used, offset, len);
        }
    }

    pub(crate) fn event_idx(&self) -> bool {
        self.event_idx
    }

    pub(crate) fn size(&self) -> u16 {
        self.layout.size
    }

    fn avail_u16(&self, index: usize) -> &AtomicU16 {
        // SAFETY: `new` checked that the avail ring (6 + 2 * size bytes)
        // lies in one mapped region and is 2-byte aligned; every caller's
        // index is at most size + 2 (the used_event field), so this is a
        // 2-aligned u16 inside it. The guest writes it concurrently, so it
        // is only accessed atomically.
        unsafe { AtomicU16::from_ptr(self.avail.add(2 * index) as *mut u16) }
    }

    fn used_u16(&self, offset: usize) -> &AtomicU16 {
        // SAFETY: `new` checked that the used ring (6 + 8 * size bytes)
        // lies in one mapped region and is 4-byte aligned; offsets are 0
        // (flags), 2 (idx) and 4 + 8 * size (avail_event), all 2-aligned
        // and inside it.
        unsafe { AtomicU16::from_ptr(self.used.add(offset) as *mut u16) }
    }

    fn used_u32(&self, offset: usize) -> &AtomicU32 {
        // SAFETY: as for `used_u16`; offsets are 4 + 8 * i and 8 + 8 * i
        // for i < size, 4-aligned and inside the used ring.
        unsafe { AtomicU32::from_ptr(self.used.add(offset) as *mut u32) }
    }

    /// The driver's avail index (acquire: the entries before it and their
    /// descriptors are visible after this load).
    #[inline]
    pub(crate) fn avail_idx(&self) -> Wrapping<u16> {
        Wrapping(u16::from_le(self.avail_u16(1).load(Ordering::Acquire)))
    }

    /// Entries the driver made available and we have not popped; an error
    /// when the index moved further than the ring holds.
    #[inline]
    pub(crate) fn pending(&self) -> Result<u16, RingError> {
        let idx = self.avail_idx();
        let n = (idx - self.next_avail).0;
        if n > self.layout.size {
            return Err(RingError::AvailIndex {
                next: self.next_avail.0,
                idx: idx.0,
                size: self.layout.size,
            });
        }
        Ok(n)
    }

    /// Pop the next available chain (the caller checked [`pending`]) and
    /// walk it into `segs` (cleared first).
    ///
    /// [`pending`]: Self::pending
    pub(crate) fn pop(&mut self, segs: &mut Vec<Segment>) -> Result<Popped, RingError> {
        let size = self.layout.size;
        let slot = usize::from(self.next_avail.0 % size);
        let head = u16::from_le(self.avail_u16(2 + slot).load(Ordering::Relaxed));
        self.next_avail += Wrapping(1);
        if head >= size {
            return Err(RingError::Head { head, size });
        }
        let truncated = self.walk(head, segs);
        Ok(Popped { head, truncated })
    }

    /// Walk the chain at `head` again, one the driver offered before and
    /// has not had back (a request in flight when a previous back-end
    /// stopped): as [`pop`](Self::pop) without taking an avail entry.
    pub(crate) fn walk_head(
        &self,
        head: u16,
        segs: &mut Vec<Segment>,
    ) -> Result<Popped, RingError> {
        let size = self.layout.size;
        if head >= size {
            return Err(RingError::Head { head, size });
        }
        let truncated = self.walk(head, segs);
        Ok(Popped { head, truncated })
    }

    /// The used index as the guest sees it in memory.
    pub(crate) fn used_idx_in_memory(&self) -> Wrapping<u16> {
        Wrapping(u16::from_le(self.used_u16(2).load(Ordering::Acquire)))
    }

    /// The descriptor id of used entry `at` (any index: taken modulo the
    /// ring size), as it is in memory.
    pub(crate) fn used_id_at(&self, at: Wrapping<u16>) -> u32 {
        let slot = usize::from(at.0 % self.layout.size);
        u32::from_le(self.used_u32(4 + 8 * slot).load(Ordering::Relaxed))
    }

    /// Walk the chain at `head` into `segs`, as virtio-queue's
    /// `DescriptorChain` iterates it; true when the walk stopped early.
    fn walk(&self, head: u16, segs: &mut Vec<Segment>) -> bool {
        segs.clear();
        let mut table = Table::Host(self.desc);
        let mut table_size = self.layout.size;
        let mut ttl = table_size;
        let mut index = head;
        let mut indirect = false;
        let mut bytes: u32 = 0;
        let mut last_next = false;
        loop {
            if ttl == 0 || index >= table_size {
                return last_next;
            }
            let Some(d) = self.read_desc(table, index) else {
                return last_next;
            };
            if d.flags & F_INDIRECT != 0 {
                // An indirect table inside an indirect table, or a table
                // that is not whole descriptors, ends the walk.
                if indirect || d.len % DESC_SIZE as u32 != 0 {
                    return last_next;
                }
                let n = d.len / DESC_SIZE as u32;
                if n > u32::from(u16::MAX) {
                    return last_next;
                }
                table = match self.map.host(d.addr, u64::from(d.len)) {
                    Some(p) => Table::Host(p),
                    None => Table::Guest(d.addr),
                };
                table_size = n as u16;
                ttl = table_size;
                index = 0;
                indirect = true;
                continue;
            }
            // virtio 1.2 §2.7.5.2: no chain longer than 2^32 bytes.
            match bytes.checked_add(d.len) {
                Some(b) => bytes = b,
                None => return last_next,
            }
            segs.push(Segment {
                addr: d.addr,
                len: d.len,
                write: d.flags & F_WRITE != 0,
            });
            last_next = d.flags & F_NEXT != 0;
            if !last_next {
                return false;
            }
            index = d.next;
            ttl -= 1;
        }
    }

    #[inline]
    fn read_desc(&self, table: Table, index: u16) -> Option<Desc> {
        match table {
            Table::Host(p) => {
                // SAFETY: index < the table's size, and the table (direct:
                // checked by `new`; indirect: by `GuestMap::host` for its
                // whole length) lies in one mapped region. The guest may
                // write it concurrently, so it is read volatilely: as two
                // u64 when 8-byte aligned (the descriptor table always is,
                // §2.7), bytewise otherwise (an indirect table may be
                // anywhere).
                let at = unsafe { p.add(16 * usize::from(index)) };
                if at as usize % 8 == 0 {
                    // SAFETY: as above; `at` is 8-byte aligned.
                    let [lo, hi] = unsafe { std::ptr::read_volatile(at as *const [u64; 2]) };
                    let hi = u64::from_le(hi);
                    Some(Desc {
                        addr: u64::from_le(lo),
                        len: hi as u32,
                        flags: (hi >> 32) as u16,
                        next: (hi >> 48) as u16,
                    })
                } else {
                    // SAFETY: as above; a byte array has no alignment.
                    let raw = unsafe { std::ptr::read_volatile(at as *const [u8; 16]) };
                    Some(Desc::from_bytes(raw))
                }
            }
            Table::Guest(base) => {
                // An indirect table across regions: vm-memory's checked
                // read, region by region.
                let at = base.checked_add(DESC_SIZE * u64::from(index))?;
                let mut b = [0u8; 16];
                self.map
                    .memory()
                    .read_slice(&mut b, GuestAddress(at))
                    .ok()?;
                Some(Desc::from_bytes(b))
            }
        }
    }

    /// Put `head` on the used ring with `len` bytes written, and publish
    /// the used index (release: the entry and the data are visible first).
    #[inline]
    pub(crate) fn add_used(&mut self, head: u16, len: u32) {
        let slot = usize::from(self.next_used.0 % self.layout.size);
        self.used_u32(4 + 8 * slot)
            .store(u32::from(head).to_le(), Ordering::Relaxed);
        self.used_u32(8 + 8 * slot)
            .store(len.to_le(), Ordering::Relaxed);
        self.next_used += Wrapping(1);
        self.num_added += Wrapping(1);
        self.used_u16(2)
            .store(self.next_used.0.to_le(), Ordering::Release);
        if let Some(log) = &self.log {
            mark_used_entry(log, self.layout.used, slot);
        }
    }

    /// Whether the used entries added since the last check must be
    /// signalled: with EVENT_IDX when they cross the driver's used_event
    /// (Linux's `vring_need_event`), without it always.
    #[inline]
    pub(crate) fn needs_notification(&mut self) -> bool {
        // Complete the used ring writes before reading used_event.
        fence(Ordering::SeqCst);
        if !self.event_idx {
            self.num_added = Wrapping(0);
            return true;
        }
        let used_event = Wrapping(u16::from_le(
            self.avail_u16(2 + usize::from(self.layout.size))
                .load(Ordering::Relaxed),
        ));
        let new = self.next_used;
        let old = new - self.num_added;
        self.num_added = Wrapping(0);
        new - used_event - Wrapping(1) < new - old
    }

    /// Ask the driver for notifications again (EVENT_IDX: avail_event =
    /// next_avail; otherwise clear NO_NOTIFY), then say whether entries
    /// arrived meanwhile (look again before sleeping). The fence between
    /// the write and the read pairs with the driver's between its avail
    /// index write and its read of avail_event or the flags (virtio 1.2
    /// §2.7.13.3 and .4): either the driver sees notifications on and
    /// notifies, or this read sees its entry.
    pub(crate) fn enable_notification(&mut self) -> bool {
        self.notify_off = false;
        if self.event_idx {
            let off = 4 + 8 * usize::from(self.layout.size);
            self.used_u16(off)
                .store(self.next_avail.0.to_le(), Ordering::Relaxed);
            self.log_used(off, 2);
        } else {
            self.used_u16(0).store(0, Ordering::Relaxed);
            self.log_used(0, 2);
        }
        fence(Ordering::SeqCst);
        Wrapping(u16::from_le(self.avail_u16(1).load(Ordering::Relaxed))) != self.next_avail
    }

    /// Whether this ring told the driver not to notify and has not asked
    /// again since.
    pub(crate) fn notifications_off(&self) -> bool {
        self.notify_off
    }

    /// Tell the driver not to notify. Without EVENT_IDX: set
    /// VRING_USED_F_NO_NOTIFY (once: the flag stays until
    /// [`enable_notification`](Self::enable_notification)). With it,
    /// avail_event is left where the last enable put it, as QEMU's
    /// `virtio_queue_set_notification` does: once past it the driver does
    /// not notify (until its 16-bit index comes round to it again).
    #[inline]
    pub(crate) fn disable_notification(&mut self) {
        if !self.event_idx && !self.notify_off {
            self.used_u16(0)
                .store(USED_F_NO_NOTIFY.to_le(), Ordering::Relaxed);
            self.log_used(0, 2);
        }
        self.notify_off = true;
    }
}

/// Mark the pages of the device-writable buffers in `segs` (out of the
/// request path's line: only while the frontend migrates).
#[cold]
#[inline(never)]
fn mark_written(log: &DirtyLog, segs: &[Segment]) {
    for s in segs.iter().filter(|s| s.write) {
        log.mark(s.addr, u64::from(s.len));
    }
}

/// Mark `len` bytes at `offset` of the used ring at guest address `used`.
#[cold]
#[inline(never)]
fn mark_used(log: &DirtyLog, used: u64, offset: usize, len: u64) {
    log.mark(used + offset as u64, len);
}

/// Mark used ring entry `slot` and the used index of the used ring at
/// guest address `used`.
#[cold]
#[inline(never)]
fn mark_used_entry(log: &DirtyLog, used: u64, slot: usize) {
    log.mark(used + 4 + 8 * slot as u64, 8);
    log.mark(used + 2, 2);
}

/// virtio-queue's own walk of the next chain of `q` over `mem`, as
/// (head, segments, whether the walk stopped on a descriptor with NEXT):
/// the reference [`SplitRing::pop`] is checked against (the `request` fuzz
/// target, this module's tests). `Err` when virtio-queue refuses the avail
/// index, `Ok(None)` when it finds nothing to pop.
pub(crate) fn reference_walk(
    q: &mut virtio_queue::Queue,
    mem: &vm_memory::GuestMemoryMmap,
) -> Result<Option<(u16, Vec<Segment>, bool)>, virtio_queue::Error> {
    use virtio_queue::QueueOwnedT;
    Ok(q.iter(mem)?.next().map(|chain| {
        let head = chain.head_index();
        let mut v = Vec::new();
        let mut more = false;
        for d in chain {
            v.push(Segment {
                addr: d.addr().0,
                len: d.len(),
                write: d.is_write_only(),
            });
            more = d.has_next();
        }
        (head, v, more)
    }))
}

#[derive(Clone, Copy)]
enum Table {
    Host(*const u8),
    Guest(u64),
}

/// A descriptor (virtio 1.2 §2.7.5), little-endian on the wire.
#[derive(Debug, Clone, Copy)]
struct Desc {
    addr: u64,
    len: u32,
    flags: u16,
    next: u16,
}

impl Desc {
    fn from_bytes(b: [u8; 16]) -> Desc {
        let [a0, a1, a2, a3, a4, a5, a6, a7, l0, l1, l2, l3, f0, f1, n0, n1] = b;
        Desc {
            addr: u64::from_le_bytes([a0, a1, a2, a3, a4, a5, a6, a7]),
            len: u32::from_le_bytes([l0, l1, l2, l3]),
            flags: u16::from_le_bytes([f0, f1]),
            next: u16::from_le_bytes([n0, n1]),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use virtio_queue::{Queue, QueueT};
    use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

    use super::*;

    const QS: u16 = 16;

    /// Guest memory with a ring of QS entries: descriptor table at 0,
    /// avail ring at 0x100, used ring at 0x200; buffers above 0x1000.
    fn setup(regions: &[(u64, usize)]) -> Arc<GuestMemoryMmap> {
        let r: Vec<_> = regions.iter().map(|&(a, l)| (GuestAddress(a), l)).collect();
        Arc::new(GuestMemoryMmap::from_ranges(&r).unwrap())
    }

    fn layout() -> RingLayout {
        RingLayout {
            desc: 0,
            avail: 0x100,
            used: 0x200,
            size: QS,
        }
    }

    fn ring(mem: &Arc<GuestMemoryMmap>, event_idx: bool) -> SplitRing {
        SplitRing::new(GuestMap::new(mem.clone()), layout(), event_idx, 0, 0).unwrap()
    }

    fn desc(mem: &GuestMemoryMmap, table: u64, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let mut b = [0u8; 16];
        b[0..8].copy_from_slice(&addr.to_le_bytes());
        b[8..12].copy_from_slice(&len.to_le_bytes());
        b[12..14].copy_from_slice(&flags.to_le_bytes());
        b[14..16].copy_from_slice(&next.to_le_bytes());
        mem.write_slice(&b, GuestAddress(table + 16 * u64::from(i)))
            .unwrap();
    }

    fn offer(mem: &GuestMemoryMmap, idx: u16, head: u16) {
        let slot = u64::from(idx % QS);
        mem.write_obj(head, GuestAddress(0x104 + 2 * slot)).unwrap();
        mem.write_obj(idx.wrapping_add(1), GuestAddress(0x102))
            .unwrap();
    }

    /// virtio-queue's walk of the next chain, as (head, segments, whether
    /// it stopped on a descriptor with NEXT).
    fn reference(mem: &GuestMemoryMmap, q: &mut Queue) -> Option<(u16, Vec<Segment>, bool)> {
        reference_walk(q, mem).ok().flatten()
    }

    /// A small deterministic generator.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            self.0 >> 33
        }
    }

    #[test]
    fn walks_every_chain_as_virtio_queue_does() {
        let mut rng = Rng(7);
        for round in 0..3000u16 {
            let mem = setup(&[(0, 0x10000), (0x10000, 0x1000)]);
            // Random descriptors in the table and an indirect table at
            // 0x800 (or straddling the two regions at 0xfff8).
            let itable = if rng.next() % 4 == 0 { 0xfff8 } else { 0x800 };
            for (table, n) in [(0u64, QS), (itable, 8)] {
                for i in 0..n {
                    let flags = (rng.next() % 8) as u16;
                    let next = (rng.next() % u64::from(QS + 2)) as u16;
                    let len = match rng.next() % 6 {
                        0 => 0,
                        1 => u32::MAX - (rng.next() % 3) as u32,
                        2 => 16 * (rng.next() % 10) as u32,
                        _ => (rng.next() % 5000) as u32,
                    };
                    let addr = if flags & F_INDIRECT != 0 && rng.next() % 3 != 0 {
                        itable
                    } else {
                        rng.next() % 0x12000
                    };
                    desc(&mem, table, i, addr, len, flags, next);
                }
            }
            let head = (rng.next() % u64::from(QS + 1)) as u16;
            let idx = round;
            offer(&mem, idx, head);
            let mut q: Queue = Queue::new(QS).unwrap();
            q.try_set_desc_table_address(GuestAddress(0)).unwrap();
            q.try_set_avail_ring_address(GuestAddress(0x100)).unwrap();
            q.try_set_used_ring_address(GuestAddress(0x200)).unwrap();
            q.set_ready(true);
            q.set_next_avail(idx);
            let mut r =
                SplitRing::new(GuestMap::new(mem.clone()), layout(), false, idx, 0).unwrap();
            assert_eq!(r.pending(), Ok(1));
            let (rh, rsegs, rmore) = reference(&mem, &mut q).unwrap();
            let mut segs = Vec::new();
            match r.pop(&mut segs) {
                Ok(p) => {
                    assert_eq!(p.head, rh);
                    assert_eq!(segs, rsegs, "round {round}");
                    assert_eq!(p.truncated, rmore, "round {round}");
                }
                Err(e) => {
                    assert_eq!(e, RingError::Head { head, size: QS });
                    assert!(rsegs.is_empty());
                }
            }
        }
    }

    #[test]
    fn used_entries_and_notifications_match_virtio_queue() {
        let mut rng = Rng(3);
        for event_idx in [false, true] {
            let mem = setup(&[(0, 0x10000)]);
            let mut q: Queue = Queue::new(QS).unwrap();
            q.try_set_desc_table_address(GuestAddress(0)).unwrap();
            q.try_set_avail_ring_address(GuestAddress(0x100)).unwrap();
            q.try_set_used_ring_address(GuestAddress(0x200)).unwrap();
            q.set_event_idx(event_idx);
            q.set_ready(true);
            let mut r = ring(&mem, event_idx);
            for i in 0..500u32 {
                let head = (rng.next() % u64::from(QS)) as u16;
                let len = rng.next() as u32;
                // Ours first, then the reference over the same memory.
                r.add_used(head, len);
                let ours_idx: u16 = mem.read_obj(GuestAddress(0x202)).unwrap();
                let slot = 0x204 + 8 * u64::from((ours_idx.wrapping_sub(1)) % QS);
                let ours: (u32, u32) = (
                    mem.read_obj(GuestAddress(slot)).unwrap(),
                    mem.read_obj(GuestAddress(slot + 4)).unwrap(),
                );
                q.add_used(&*mem, head, len).unwrap();
                assert_eq!(ours, (u32::from(head), len));
                assert_eq!(r.next_used.0, q.next_used());
                if rng.next() % 3 == 0 {
                    // The driver moves used_event somewhere near.
                    let ev = (r.next_used.0)
                        .wrapping_add((rng.next() % 8) as u16)
                        .wrapping_sub(4);
                    mem.write_obj(ev, GuestAddress(0x104 + 2 * u64::from(QS)))
                        .unwrap();
                }
                if rng.next() % 2 == 0 || i % 7 == 0 {
                    assert_eq!(
                        r.needs_notification(),
                        q.needs_notification(&*mem).unwrap(),
                        "entry {i}, event_idx {event_idx}"
                    );
                }
            }
        }
    }

    #[test]
    fn notifications_on_and_off_write_what_virtio_queue_writes() {
        for event_idx in [false, true] {
            let mem = setup(&[(0, 0x10000)]);
            let mut r = ring(&mem, event_idx);
            offer(&mem, 0, 1);
            r.disable_notification();
            let flags: u16 = mem.read_obj(GuestAddress(0x200)).unwrap();
            assert_eq!(flags, if event_idx { 0 } else { USED_F_NO_NOTIFY });
            // One entry available and not popped: look again.
            assert!(r.enable_notification());
            let mut segs = Vec::new();
            desc(&mem, 0, 1, 0x1000, 1, F_WRITE, 0);
            r.pop(&mut segs).unwrap();
            assert!(!r.enable_notification());
            if event_idx {
                let ev: u16 = mem
                    .read_obj(GuestAddress(0x204 + 8 * u64::from(QS)))
                    .unwrap();
                assert_eq!(ev, 1, "avail_event = next_avail");
            } else {
                let flags: u16 = mem.read_obj(GuestAddress(0x200)).unwrap();
                assert_eq!(flags, 0);
            }
        }
    }

    /// With a dirty log, every used ring write marks the pages it wrote
    /// (the entry, the index, the flags or avail_event), and the data of
    /// an answered chain marks its device-writable buffers' pages; without
    /// one nothing is marked.
    #[test]
    fn a_logged_ring_marks_the_pages_it_writes() {
        // The used ring at 0x2fc0 (134 bytes): entry 7 (0x2ffc..0x3004)
        // crosses from page 2 into page 3, avail_event is at 0x3044.
        let lay = RingLayout {
            used: 0x2fc0,
            ..layout()
        };
        for event_idx in [false, true] {
            let mem = setup(&[(0, 0x10000)]);
            let mut r = SplitRing::new(GuestMap::new(mem.clone()), lay, event_idx, 0, 0).unwrap();
            let log = Arc::new(DirtyLog::in_memfd(8));
            r.add_used(1, 0);
            r.set_log(Some(log.clone()));
            assert!(log.take_pages().is_empty(), "marked before logging");
            r.add_used(1, 0);
            assert_eq!(log.take_pages(), [2], "entry 1 and the index");
            for _ in 2..7 {
                r.add_used(1, 0);
            }
            log.take_pages();
            r.add_used(3, 512);
            assert_eq!(log.take_pages(), [2, 3], "entry 7 crosses a page");
            r.disable_notification();
            r.disable_notification();
            let flags = if event_idx { vec![] } else { vec![2] };
            assert_eq!(log.take_pages(), flags, "the flags, written once");
            r.enable_notification();
            let field = if event_idx { 3 } else { 2 };
            assert_eq!(log.take_pages(), [field], "avail_event or the flags");
            let segs = [
                Segment {
                    addr: 0x5000,
                    len: 16,
                    write: false,
                },
                Segment {
                    addr: 0x6ff0,
                    len: 0x1011,
                    write: true,
                },
                Segment {
                    addr: 0x9000,
                    len: 1,
                    write: true,
                },
            ];
            r.log_written(&segs);
            assert_eq!(log.take_pages(), [6, 7, 8, 9], "the writable buffers");
            r.set_log(None);
            r.add_used(1, 0);
            r.log_written(&segs);
            r.enable_notification();
            assert!(log.take_pages().is_empty(), "marked after logging");
        }
    }

    /// Polling keeps notifications off across passes with one write of
    /// the flag; with EVENT_IDX avail_event is not moved while they are
    /// off, only when they are enabled again.
    #[test]
    fn notifications_stay_off_with_one_write_until_enabled() {
        let flags = |mem: &GuestMemoryMmap| mem.read_obj::<u16>(GuestAddress(0x200)).unwrap();
        let avail_event = |mem: &GuestMemoryMmap| {
            mem.read_obj::<u16>(GuestAddress(0x204 + 8 * u64::from(QS)))
                .unwrap()
        };
        let mem = setup(&[(0, 0x10000)]);
        let mut r = ring(&mem, false);
        r.disable_notification();
        assert_eq!(flags(&mem), USED_F_NO_NOTIFY);
        // Written once: a second disable does not store it again.
        mem.write_obj(0u16, GuestAddress(0x200)).unwrap();
        r.disable_notification();
        assert_eq!(flags(&mem), 0, "the flag was written twice");
        assert!(!r.enable_notification());
        assert_eq!(flags(&mem), 0);
        r.disable_notification();
        assert_eq!(flags(&mem), USED_F_NO_NOTIFY, "off again after an enable");

        let mem = setup(&[(0, 0x10000)]);
        let mut r = ring(&mem, true);
        mem.write_obj(7u16, GuestAddress(0x204 + 8 * u64::from(QS)))
            .unwrap();
        r.disable_notification();
        assert_eq!(flags(&mem), 0, "EVENT_IDX: the flags stay 0");
        assert_eq!(avail_event(&mem), 7, "avail_event left where it was");
        r.set_indices(3, 3);
        mem.write_obj(3u16, GuestAddress(0x102)).unwrap();
        assert!(!r.enable_notification(), "nothing new: sleep");
        assert_eq!(avail_event(&mem), 3, "enabled: avail_event = next_avail");
    }

    #[test]
    fn rings_must_be_aligned_inside_one_region_and_of_a_valid_size() {
        // Two adjacent regions: a ring across their boundary is refused
        // even though every byte is guest memory.
        let mem = setup(&[(0, 0x1000), (0x1000, 0x1000)]);
        let map = || GuestMap::new(mem.clone());
        let ok = |l: RingLayout| SplitRing::new(map(), l, true, 0, 0).map(|_| ());
        assert_eq!(ok(layout()), Ok(()));
        // Ring parts that end exactly at the region's end are fine.
        let at_end = RingLayout {
            desc: 0x1000,
            avail: 0x2000 - (6 + 2 * u64::from(QS)),
            used: 0x1000 - (6 + 8 * u64::from(QS)) - 2,
            size: QS,
        };
        assert_eq!(ok(at_end), Ok(()));
        let table_at_end = RingLayout {
            desc: 0x1000 - 16 * u64::from(QS),
            avail: 0x1000,
            used: 0x1100,
            size: QS,
        };
        assert_eq!(ok(table_at_end), Ok(()));
        for (l, what) in [
            (
                RingLayout {
                    desc: 0x1000 - 16 * u64::from(QS) + 16,
                    ..layout()
                },
                "descriptor table",
            ),
            (
                RingLayout {
                    avail: 0x1000 - (6 + 2 * u64::from(QS)) + 2,
                    ..layout()
                },
                "avail ring",
            ),
            (
                RingLayout {
                    used: 0x1000 - (6 + 8 * u64::from(QS)) + 2,
                    ..layout()
                },
                "used ring",
            ),
            (
                RingLayout {
                    used: 0x2000,
                    ..layout()
                },
                "used ring",
            ),
            (
                RingLayout {
                    desc: u64::MAX - 15,
                    ..layout()
                },
                "descriptor table",
            ),
        ] {
            match ok(l) {
                Err(RingError::Outside { what: w, .. })
                | Err(RingError::Misaligned { what: w, .. }) => {
                    assert_eq!(w, what, "{l:?}")
                }
                other => panic!("{l:?}: {other:?}"),
            }
        }
        assert!(matches!(
            ok(RingLayout {
                avail: 0x101,
                ..layout()
            }),
            Err(RingError::Misaligned { align: 2, .. })
        ));
        assert!(matches!(
            ok(RingLayout {
                used: 0x202,
                ..layout()
            }),
            Err(RingError::Misaligned { align: 4, .. })
        ));
        assert!(matches!(
            ok(RingLayout {
                desc: 8,
                ..layout()
            }),
            Err(RingError::Misaligned { align: 16, .. })
        ));
        for size in [0, 3, 65535] {
            assert_eq!(
                ok(RingLayout { size, ..layout() }),
                Err(RingError::Size(size))
            );
        }
    }

    #[test]
    fn an_avail_index_beyond_the_ring_is_an_error() {
        let mem = setup(&[(0, 0x10000)]);
        let r = ring(&mem, false);
        mem.write_obj(QS + 1, GuestAddress(0x102)).unwrap();
        assert!(matches!(r.pending(), Err(RingError::AvailIndex { .. })));
        mem.write_obj(QS, GuestAddress(0x102)).unwrap();
        assert_eq!(r.pending(), Ok(QS));
    }

    #[test]
    fn a_ring_keeps_its_memory_mapped_after_the_table_is_dropped() {
        let mem = setup(&[(0, 0x10000)]);
        let mut r = ring(&mem, true);
        drop(mem);
        // The frontend replaced the table; the worker still holds the ring
        // until its next pass: its pointers stay valid.
        r.add_used(0, 1);
        assert_eq!(r.next_used.0, 1);
        assert!(
            r.map()
                .memory()
                .read_obj::<u16>(GuestAddress(0x202))
                .unwrap()
                == 1
        );
    }

    #[test]
    fn overlapping_parts_are_refused() {
        let mem = setup(&[(0, 0x10000)]);
        let ok = |l: RingLayout| SplitRing::new(GuestMap::new(mem.clone()), l, true, 0, 0);
        // The used ring over the avail ring (the layout whose used entries
        // would raise the avail index), over the table, one byte into it.
        for (l, a, b) in [
            (
                RingLayout {
                    used: 0x100,
                    ..layout()
                },
                "avail ring",
                "used ring",
            ),
            (
                RingLayout {
                    used: 0x0,
                    ..layout()
                },
                "descriptor table",
                "used ring",
            ),
            (
                RingLayout {
                    avail: 0xfe,
                    ..layout()
                },
                "descriptor table",
                "avail ring",
            ),
            (
                RingLayout {
                    used: 0x100 + 6 + 2 * u64::from(QS) - 2,
                    ..layout()
                },
                "avail ring",
                "used ring",
            ),
        ] {
            assert_eq!(ok(l).err(), Some(RingError::Overlap { a, b }), "{l:?}");
        }
        // Touching is not overlapping.
        let touching = RingLayout {
            desc: 0,
            avail: 16 * u64::from(QS),
            used: (16 * u64::from(QS) + 6 + 2 * u64::from(QS) + 3) & !3,
            size: QS,
        };
        assert!(ok(touching).is_ok());
    }

    #[test]
    fn rings_of_two_queues_overlap_when_any_parts_do() {
        let a = layout();
        let apart = RingLayout {
            desc: 0x1000,
            avail: 0x1100,
            used: 0x1200,
            size: QS,
        };
        assert_eq!(a.overlap_with(&apart), None);
        let crossing = RingLayout {
            used: a.avail,
            ..apart
        };
        assert_eq!(crossing.overlap_with(&a), Some(("used ring", "avail ring")));
        assert_eq!(a.overlap_with(&crossing), Some(("avail ring", "used ring")));
        assert_eq!(
            a.overlap_with(&a),
            Some(("descriptor table", "descriptor table"))
        );
    }

    #[test]
    fn parts_misaligned_in_the_host_mapping_are_refused() {
        // A region at an odd guest address: guest-aligned parts inside it
        // are misaligned in the mapping (which is page-aligned).
        let mem = setup(&[(0x1_0001, 0x10000)]);
        let l = RingLayout {
            desc: 0x1_0010,
            avail: 0x1_1010,
            used: 0x1_2010,
            size: QS,
        };
        match SplitRing::new(GuestMap::new(mem.clone()), l, true, 0, 0) {
            Err(RingError::HostMisaligned { what, align, .. }) => {
                assert_eq!((what, align), ("avail ring", 2))
            }
            other => panic!("{:?}", other.map(|_| ())),
        }
        // The used ring alone misaligned: 4-byte aligned guest address,
        // host offset 2 mod 4.
        let mem = setup(&[(0x1_0002, 0x10000)]);
        let l = RingLayout {
            desc: 0x1_0012 + 0xe,
            avail: 0x1_1002,
            used: 0x1_2004,
            size: QS,
        };
        match SplitRing::new(GuestMap::new(mem), l, true, 0, 0) {
            Err(RingError::HostMisaligned { what, align, .. }) => {
                assert_eq!((what, align), ("used ring", 4))
            }
            other => panic!("{:?}", other.map(|_| ())),
        }
    }
}
