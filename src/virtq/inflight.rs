//! The requests a back-end has taken off a split ring and not yet put on
//! the used ring, recorded in a shared area that outlives the back-end
//! (vhost-user's INFLIGHT_SHMFD: the front-end keeps the area's file and
//! hands it to the next back-end instance), so that after a crash or a
//! restart exactly those requests are served again, once each, in the
//! order they were taken.
//!
//! The layout is libvhost-user's for split rings (QEMU's
//! `subprojects/libvhost-user`), so an area can pass between blklab and
//! any back-end built on it. Per queue, at `i * queue_region_size(queue_size)`:
//!
//! | offset | field |
//! |---|---|
//! | 0 | `features: u64` |
//! | 8 | `version: u16` (0: never used; 1: this layout) |
//! | 10 | `desc_num: u16` (the capacity: the queue size it was made for) |
//! | 12 | `last_batch_head: u16` (the head put on the used ring last) |
//! | 14 | `used_idx: u16` (the used index once that head was cleared) |
//! | 16 + 16 * head | `inflight: u8`, 5 bytes padding, `next: u16`, `counter: u64` |
//!
//! A request's life, in program order (each store a release store, so a
//! back-end that dies between any two of them leaves a state the next one
//! reads right): taken off the avail ring → `counter` and `inflight = 1`
//! ([`InflightQueue::taken`]) → served → `last_batch_head`
//! ([`InflightQueue::before_used`]) → the used entry and the used index
//! published in guest memory → `inflight = 0`, then `used_idx`
//! ([`InflightQueue::after_used`]).
//!
//! [`InflightQueue::recover`] reads it back when a ring starts. Where the
//! guest's used index is ahead of the area's `used_idx`, the back-end died
//! after publishing entries and before clearing them: the heads of those
//! used entries (read from the used ring itself, not only
//! `last_batch_head`, so a default `last_batch_head` of 0 never clears the
//! wrong head) are cleared. Every head still marked is then served again,
//! by counter, and the ring's next avail index is the used index plus
//! their number (each entry taken is either used or in flight).

use std::fs::File;
use std::io;
use std::num::Wrapping;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::atomic::{AtomicU16, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use thiserror::Error;

use crate::util::shared_file::{SharedMapError, SharedMapping};

/// Queue regions are aligned to this many bytes (libvhost-user's
/// `INFLIGHT_ALIGNMENT`).
const ALIGNMENT: u64 = 64;
/// One descriptor's state.
const DESC_STATE: usize = 16;
/// The queue region's header.
const HEADER: usize = 16;
/// The layout version [`InflightQueue::recover`] writes and reads.
const VERSION: u16 = 1;
/// Longest split ring (virtio 1.2, 2.7).
const MAX_QUEUE_SIZE: u16 = 32768;

/// The bytes one queue's region takes, as libvhost-user computes them
/// (its header is covered by the alignment slack).
pub(crate) fn queue_region_size(queue_size: u16) -> u64 {
    let raw = DESC_STATE as u64 * u64::from(queue_size) + 2;
    raw.div_ceil(ALIGNMENT) * ALIGNMENT
}

/// Why an inflight area cannot be made or used.
#[derive(Debug, Error)]
pub(crate) enum InflightError {
    #[error("an inflight area for {queues} queue(s) of {queue_size} descriptors: the queue count must be at least 1 and the queue size 1 to 32768")]
    Shape { queues: u16, queue_size: u16 },
    #[error("cannot create the inflight area's memfd: {0}")]
    Create(#[source] io::Error),
    #[error("cannot size the inflight area's file to {size} bytes: {source}")]
    Resize {
        size: u64,
        #[source]
        source: io::Error,
    },
    #[error("inflight area of {size} bytes is too small for {queues} queue(s) of {queue_size} descriptors ({needed} bytes)")]
    TooSmall {
        size: u64,
        needed: u64,
        queues: u16,
        queue_size: u16,
    },
    #[error("inflight area at offset {0:#x} of its file: the offset must be a multiple of 64")]
    Misaligned(u64),
    #[error("the inflight area: {0}")]
    Map(#[from] SharedMapError),
}

/// An inflight area mapped shared: `queues` regions of `queue_size`
/// descriptor states. Unmapped when the last [`InflightQueue`] over it is
/// dropped.
#[derive(Debug)]
pub(crate) struct InflightArea {
    mapping: SharedMapping,
    queues: u16,
    queue_size: u16,
}

impl InflightArea {
    /// A new zeroed area in a memfd (sealed against shrinking and
    /// growing), as GET_INFLIGHT_FD asks: the file to hand the front-end
    /// and its size. The back-end maps it when the front-end sends it
    /// back (SET_INFLIGHT_FD).
    pub(crate) fn create(queues: u16, queue_size: u16) -> Result<(File, u64), InflightError> {
        let size = area_size(queues, queue_size)?;
        // SAFETY: memfd_create with a NUL-terminated name and flags; no
        // memory is passed. The descriptor is owned by the File below.
        let fd = unsafe {
            libc::memfd_create(
                c"blklab-inflight".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if fd < 0 {
            return Err(InflightError::Create(io::Error::last_os_error()));
        }
        // SAFETY: `fd` was just created and nothing else owns it.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(size)
            .map_err(|source| InflightError::Resize { size, source })?;
        // SAFETY: fcntl adding seals to a memfd this function owns.
        unsafe {
            libc::fcntl(
                file.as_raw_fd(),
                libc::F_ADD_SEALS,
                libc::F_SEAL_SHRINK | libc::F_SEAL_GROW,
            )
        };
        Ok((file, size))
    }

    /// Map `size` bytes at `offset` of `file` (SET_INFLIGHT_FD), laid out
    /// for `queues` queues of `queue_size` descriptors. The file must hold
    /// the whole range (it is sealed against shrinking when it takes
    /// seals, so it cannot be cut under the mapping).
    pub(crate) fn open(
        file: &File,
        offset: u64,
        size: u64,
        queues: u16,
        queue_size: u16,
    ) -> Result<InflightArea, InflightError> {
        let needed = area_size(queues, queue_size)?;
        if size < needed {
            return Err(InflightError::TooSmall {
                size,
                needed,
                queues,
                queue_size,
            });
        }
        // Its states are read with atomics: they must be aligned.
        if offset % ALIGNMENT != 0 {
            return Err(InflightError::Misaligned(offset));
        }
        // The whole range the frontend gave must be in its file, even
        // beyond the regions used here.
        Ok(InflightArea {
            mapping: SharedMapping::of_file(file, offset, size)?,
            queues,
            queue_size,
        })
    }

    /// Queue `index`'s region, or `None` beyond the area's queues.
    pub(crate) fn queue(self: &Arc<Self>, index: usize) -> Option<InflightQueue> {
        if index >= usize::from(self.queues) {
            return None;
        }
        let offset = index * queue_region_size(self.queue_size) as usize;
        // SAFETY: `offset` + the region size is inside the mapping:
        // `open` mapped `queues` regions.
        let region = unsafe { self.mapping.base().add(offset) };
        Some(InflightQueue {
            _area: self.clone(),
            region,
            capacity: self.queue_size,
            counter: 0,
            ring_size: 0,
        })
    }
}

/// Bytes for `queues` regions of `queue_size` descriptors.
fn area_size(queues: u16, queue_size: u16) -> Result<u64, InflightError> {
    if queues == 0 || queue_size == 0 || queue_size > MAX_QUEUE_SIZE {
        return Err(InflightError::Shape { queues, queue_size });
    }
    Ok(u64::from(queues) * queue_region_size(queue_size))
}

/// What [`InflightQueue::recover`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Recovered {
    /// A region never used: initialised, the ring starts where the
    /// front-end said.
    Fresh,
    /// The heads to serve again, in the order they were taken, and the
    /// next avail index (the used index plus their number).
    Resume { heads: Vec<u16>, next_avail: u16 },
    /// The region cannot describe this ring (laid out for another queue
    /// size, or a ring larger than it): initialised afresh, nothing served
    /// again.
    Reset { capacity: u16, ring_size: u16 },
}

/// One queue's region of an inflight area.
pub(crate) struct InflightQueue {
    _area: Arc<InflightArea>,
    region: *mut u8,
    /// Descriptor states in the region.
    capacity: u16,
    /// The next request's counter (pop order).
    counter: u64,
    /// The ring served: heads below it only.
    ring_size: u16,
}

// SAFETY: `region` points into the mapping `_area` keeps alive; every
// access is atomic.
unsafe impl Send for InflightQueue {}

impl InflightQueue {
    fn u16_at(&self, offset: usize) -> &AtomicU16 {
        // SAFETY: offsets 8..16 of the header, 2-aligned in a 64-aligned
        // region of the mapping.
        unsafe { AtomicU16::from_ptr(self.region.add(offset).cast()) }
    }

    fn flag(&self, head: u16) -> &AtomicU8 {
        debug_assert!(head < self.capacity);
        // SAFETY: callers keep `head` below the capacity, so the state is
        // inside the region.
        unsafe { AtomicU8::from_ptr(self.region.add(HEADER + DESC_STATE * usize::from(head))) }
    }

    fn counter_of(&self, head: u16) -> &AtomicU64 {
        // SAFETY: as for `flag`; the counter is at +8 of a 16-aligned
        // state, so 8-aligned.
        unsafe {
            AtomicU64::from_ptr(
                self.region
                    .add(HEADER + DESC_STATE * usize::from(head) + 8)
                    .cast(),
            )
        }
    }

    fn version(&self) -> &AtomicU16 {
        self.u16_at(8)
    }

    fn desc_num(&self) -> &AtomicU16 {
        self.u16_at(10)
    }

    fn last_batch_head(&self) -> &AtomicU16 {
        self.u16_at(12)
    }

    fn used_idx(&self) -> &AtomicU16 {
        self.u16_at(14)
    }

    /// A ring of `ring_size` starts with the guest's used index at
    /// `used_idx` (`used_id(i)`: the id of used entry `i` in guest
    /// memory): read what the previous back-end left (module docs).
    pub(crate) fn recover(
        &mut self,
        ring_size: u16,
        used_idx: Wrapping<u16>,
        used_id: impl Fn(Wrapping<u16>) -> u32,
    ) -> Recovered {
        self.ring_size = ring_size;
        self.counter = 0;
        let version = self.version().load(Ordering::Acquire);
        let capacity = self.desc_num().load(Ordering::Acquire);
        if version == 0 && ring_size <= self.capacity {
            self.initialise(used_idx);
            return Recovered::Fresh;
        }
        if version != VERSION || capacity != self.capacity || ring_size > self.capacity {
            self.initialise(used_idx);
            if ring_size > self.capacity {
                // Heads beyond the region cannot be recorded: not tracked.
                self.ring_size = 0;
            }
            return Recovered::Reset {
                capacity,
                ring_size,
            };
        }
        self.clear_published(used_idx, used_id);
        let mut marked: Vec<(u64, u16)> = (0..ring_size)
            .filter(|&h| self.flag(h).load(Ordering::Acquire) != 0)
            .map(|h| (self.counter_of(h).load(Ordering::Relaxed), h))
            .collect();
        marked.sort_unstable();
        self.counter = marked.last().map_or(0, |&(c, _)| c.wrapping_add(1));
        let heads: Vec<u16> = marked.into_iter().map(|(_, h)| h).collect();
        let next_avail = (used_idx + Wrapping(heads.len() as u16)).0;
        Recovered::Resume { heads, next_avail }
    }

    /// Entries published after the area last recorded the used index:
    /// their heads are no longer in flight.
    fn clear_published(&self, used_idx: Wrapping<u16>, used_id: impl Fn(Wrapping<u16>) -> u32) {
        let mut at = Wrapping(self.used_idx().load(Ordering::Acquire));
        // More than a ring's worth apart: not a state any back-end left
        // (the guest reset the ring); nothing to clear by it.
        if (used_idx - at).0 <= self.ring_size {
            while at != used_idx {
                if let Ok(h) = u16::try_from(used_id(at)) {
                    if h < self.ring_size {
                        self.flag(h).store(0, Ordering::Release);
                    }
                }
                at += Wrapping(1);
            }
        }
        self.used_idx().store(used_idx.0, Ordering::Release);
    }

    fn initialise(&self, used_idx: Wrapping<u16>) {
        for h in 0..self.capacity {
            self.flag(h).store(0, Ordering::Relaxed);
            self.counter_of(h).store(0, Ordering::Relaxed);
        }
        self.desc_num().store(self.capacity, Ordering::Relaxed);
        self.last_batch_head().store(0, Ordering::Relaxed);
        self.used_idx().store(used_idx.0, Ordering::Relaxed);
        self.version().store(VERSION, Ordering::Release);
    }

    /// `head` was taken off the avail ring: record it in flight.
    #[inline]
    pub(crate) fn taken(&mut self, head: u16) {
        if head >= self.ring_size {
            return;
        }
        self.counter_of(head).store(self.counter, Ordering::Relaxed);
        self.counter = self.counter.wrapping_add(1);
        self.flag(head).store(1, Ordering::Release);
        crash_point(Step::Marked);
    }

    /// `head` is about to go on the used ring.
    #[inline]
    pub(crate) fn before_used(&self, head: u16) {
        if head < self.ring_size {
            self.last_batch_head().store(head, Ordering::Release);
        }
        crash_point(Step::BatchHead);
    }

    /// `head` is on the used ring, whose index is now `used_idx`.
    #[inline]
    pub(crate) fn after_used(&self, head: u16, used_idx: Wrapping<u16>) {
        crash_point(Step::Published);
        if head < self.ring_size {
            self.flag(head).store(0, Ordering::Release);
        }
        crash_point(Step::Cleared);
        self.used_idx().store(used_idx.0, Ordering::Release);
    }

    /// Heads marked in flight.
    #[cfg(test)]
    pub(crate) fn in_flight(&self) -> usize {
        (0..self.ring_size.min(self.capacity))
            .filter(|&h| self.flag(h).load(Ordering::Acquire) != 0)
            .count()
    }
}

/// The points of a request's life where the tests stop a back-end dead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Taken off the avail ring, not yet recorded.
    Taken,
    /// Recorded in flight.
    Marked,
    /// Served (its data written), not yet on the used ring.
    Served,
    /// `last_batch_head` written.
    BatchHead,
    /// The used entry and index published, the head still marked.
    Published,
    /// The head cleared, the area's used index not yet written.
    Cleared,
}

#[cfg(not(test))]
#[inline(always)]
pub(crate) fn crash_point(_step: Step) {}

#[cfg(test)]
pub(crate) use crash::point as crash_point;

/// The fault hook of the crash tests: [`arm`](crash::arm) a step and an
/// occurrence; the back-end panics there, on this thread, as if killed
/// (nothing after it runs; shared memory keeps what was written).
#[cfg(test)]
pub(crate) mod crash {
    use std::cell::Cell;

    use super::Step;

    thread_local! {
        static ARMED: Cell<Option<(Step, u32)>> = const { Cell::new(None) };
    }

    /// Crash at the `nth` (from 1) time `step` is reached.
    pub(crate) fn arm(step: Step, nth: u32) {
        ARMED.with(|a| a.set(Some((step, nth))));
    }

    /// Whether the armed crash has not happened (and disarm it).
    pub(crate) fn disarm() -> bool {
        ARMED.with(|a| a.take()).is_some()
    }

    pub(crate) fn point(step: Step) {
        ARMED.with(|a| match a.get() {
            Some((s, 1)) if s == step => {
                a.set(None);
                std::panic::panic_any(Crashed(step));
            }
            Some((s, n)) if s == step => a.set(Some((s, n - 1))),
            _ => {}
        });
    }

    /// The panic payload of a planned crash.
    #[derive(Debug)]
    pub(crate) struct Crashed(pub(crate) Step);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn area(queues: u16, size: u16) -> (File, Arc<InflightArea>) {
        let (f, len) = InflightArea::create(queues, size).unwrap();
        let a = InflightArea::open(&f, 0, len, queues, size).unwrap();
        (f, Arc::new(a))
    }

    #[test]
    fn regions_are_sized_as_libvhost_user_sizes_them() {
        assert_eq!(queue_region_size(1), 64);
        assert_eq!(queue_region_size(128), 2112);
        assert_eq!(queue_region_size(256), 4160);
        // Header and states always fit.
        for qs in 1..=1024u16 {
            assert!(queue_region_size(qs) >= (HEADER + DESC_STATE * usize::from(qs)) as u64);
        }
    }

    #[test]
    fn bad_shapes_and_short_files_are_refused() {
        assert!(matches!(
            InflightArea::create(0, 128),
            Err(InflightError::Shape { .. })
        ));
        assert!(matches!(
            InflightArea::create(1, 0),
            Err(InflightError::Shape { .. })
        ));
        let (f, len) = InflightArea::create(2, 128).unwrap();
        let e = InflightArea::open(&f, 0, len - 1, 2, 128).unwrap_err();
        assert!(matches!(e, InflightError::TooSmall { .. }), "{e}");
        let e = InflightArea::open(&f, 4096, len, 2, 128).unwrap_err();
        assert!(
            matches!(e, InflightError::Map(SharedMapError::BeyondFile { .. })),
            "{e}"
        );
        let e = InflightArea::open(&f, u64::MAX - 63, len, 2, 128).unwrap_err();
        assert!(
            matches!(e, InflightError::Map(SharedMapError::BeyondFile { .. })),
            "{e}"
        );
        let e = InflightArea::open(&f, 8, len, 2, 128).unwrap_err();
        assert!(matches!(e, InflightError::Misaligned(8)), "{e}");
        // The memfd is sealed: the front-end cannot shrink it.
        assert!(f.set_len(1).is_err());
    }

    #[test]
    fn a_fresh_region_starts_where_the_front_end_said() {
        let (_f, a) = area(2, 8);
        let mut q = a.queue(1).unwrap();
        assert!(a.queue(2).is_none());
        assert_eq!(q.recover(8, Wrapping(5), |_| 0), Recovered::Fresh);
        q.taken(3);
        q.taken(1);
        assert_eq!(q.in_flight(), 2);
        // Another instance over the same region resubmits both, in order.
        let mut again = a.queue(1).unwrap();
        assert_eq!(
            again.recover(8, Wrapping(5), |_| 0),
            Recovered::Resume {
                heads: vec![3, 1],
                next_avail: 7
            }
        );
        // Queue 0 was never touched.
        assert_eq!(
            a.queue(0).unwrap().recover(8, Wrapping(0), |_| 0),
            Recovered::Fresh
        );
    }

    #[test]
    fn a_head_published_but_not_cleared_is_not_served_again() {
        let (_f, a) = area(1, 8);
        let mut q = a.queue(0).unwrap();
        q.recover(8, Wrapping(0), |_| 0);
        q.taken(0);
        q.taken(6);
        // Head 6 goes on the used ring (entry 0); the back-end dies before
        // clearing it. Head 0 is still in service.
        q.before_used(6);
        let mut next = a.queue(0).unwrap();
        let used = |i: Wrapping<u16>| if i.0 == 0 { 6 } else { 99 };
        assert_eq!(
            next.recover(8, Wrapping(1), used),
            Recovered::Resume {
                heads: vec![0],
                next_avail: 2
            }
        );
    }

    #[test]
    fn a_region_of_another_size_or_a_larger_ring_starts_afresh() {
        let (_f, a) = area(1, 8);
        let mut q = a.queue(0).unwrap();
        q.recover(8, Wrapping(0), |_| 0);
        q.taken(2);
        let mut bigger = a.queue(0).unwrap();
        assert_eq!(
            bigger.recover(16, Wrapping(0), |_| 0),
            Recovered::Reset {
                capacity: 8,
                ring_size: 16
            }
        );
        assert_eq!(bigger.in_flight(), 0);
    }
}
