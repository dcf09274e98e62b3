//! The vhost-user-blk device: a `&self` [`VhostUserBackend`] with per-queue
//! state, so each queue's worker thread runs without a shared lock.
//!
//! One [`Disk`] (configuration + storage) lives for the whole process; one
//! [`BlkBackend`] is created per vhost-user connection and shares the disk,
//! so data survives reconnects while ring state starts fresh.
//!
//! - `disk.rs`: the served disk, with `handover.rs` (its image's locks
//!   across a live migration);
//! - `worker.rs`: a queue's worker (why it woke, the turns of one
//!   wake-up), with `worker/queue.rs` (its state, and the methods that name
//!   what happens to it) and `worker/pass.rs` (one pass over the ring: pop,
//!   execute, complete, notify), unit-tested in process on virtio-queue's
//!   `MockSplitQueue` (`worker/tests.rs`);
//! - `poll.rs`: the poll modes, with `poll_window.rs` (adaptive polling's
//!   window);
//! - `events.rs`: the ids of the worker threads' epoll events;
//! - `vhost_user.rs`: the [`VhostUserBackend`] implementation, with
//!   `dirty_logging.rs` (the frontend's dirty log while it migrates);
//! - `server.rs` and `control.rs`: the sockets and the control socket;
//! - `serve.rs`: a daemon's life, from its options to the signal that
//!   ends it.
//!
//! [`VhostUserBackend`]: vhost_user_backend::VhostUserBackend

pub mod control;
pub(crate) mod deadline;
mod dirty_logging;
mod disk;
mod events;
mod handover;
pub(crate) mod kick_vring;
mod poll;
pub(crate) mod poll_window;
pub mod qemu_args;
pub mod serve;
pub(crate) mod server;
mod vhost_user;
mod worker;

use std::io;
use std::os::unix::io::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use log::info;
use vhost_user_backend::VringEpollHandler;
use virtio_bindings::virtio_blk::VIRTIO_BLK_F_FLUSH;
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::eventfd::EventFd;

use crate::backend::dirty_logging::DirtyLogging;
pub(crate) use crate::backend::disk::Disk;
use crate::backend::events::{Event, EventIds};
use crate::backend::worker::QueueState;
use crate::device::polling::PollMode;
use crate::stats::queue::QueueCounters;
use crate::virtq::split_ring::{RingError, RingLayout};

type GM = GuestMemoryAtomic<GuestMemoryMmap>;

/// One connection's device.
pub(crate) struct BlkBackend {
    disk: Arc<Disk>,
    queues: Vec<Mutex<QueueState>>,
    /// For each worker thread, the queue index of each of its vrings.
    thread_queues: Vec<Vec<usize>>,
    /// The ids of the worker threads' events.
    event_ids: EventIds,
    acked_features: AtomicU64,
    /// `--poll`: whether and how long a worker keeps polling an idle ring.
    polling: PollMode,
    /// Poll mode: one eventfd per worker thread that the worker writes to
    /// come back to its polling after letting its epoll loop run (exit
    /// requests, timers, newly enabled rings).
    repoll: Vec<EventFd>,
    /// The consumer ends of the worker exit events handed out by
    /// `exit_event`. vhost-user-backend 0.24 registers a consumer with its
    /// epoll through `into_raw_fd()` and never closes it: one eventfd per
    /// worker thread per connection would leak (the soak test counts the
    /// daemon's fds across hundreds of reconnects). Closed in `Drop`, when
    /// the last handler holding this backend, and with it the epoll the fd
    /// was registered with, is gone.
    exit_consumers: Mutex<Vec<std::os::fd::RawFd>>,
    /// The ring each queue is served from (set when a pass checks a new
    /// layout, cleared when the queue stops): a ring that overlaps another
    /// queue's is refused, or two queues could feed each other.
    rings: Mutex<Vec<Option<RingLayout>>>,
    /// The frontend's dirty log, marked while it migrates the guest.
    dirty: DirtyLogging,
}

impl BlkBackend {
    pub(crate) fn new(disk: Arc<Disk>) -> io::Result<BlkBackend> {
        // A new connection (the previous one has ended): its cache mode
        // starts from the configured one.
        disk.reset_cache_mode();
        let n = usize::from(disk.cfg.num_queues);
        let queues = (0..n)
            .map(|index| QueueState::new(index, &disk).map(Mutex::new))
            .collect::<io::Result<Vec<_>>>()?;
        let thread_queues: Vec<Vec<usize>> = disk
            .cfg
            .queues_per_thread
            .iter()
            .map(|mask| (0..n).filter(|q| mask & (1u64 << q) != 0).collect())
            .collect();
        let polling = disk.cfg.poll_mode();
        let repoll = match polling {
            PollMode::Off => Vec::new(),
            _ => (0..thread_queues.len())
                .map(|_| EventFd::new(libc::EFD_NONBLOCK | libc::EFD_CLOEXEC))
                .collect::<io::Result<Vec<_>>>()?,
        };
        Ok(BlkBackend {
            disk,
            queues,
            thread_queues,
            event_ids: EventIds::new(n),
            acked_features: AtomicU64::new(0),
            polling,
            repoll,
            exit_consumers: Mutex::new(Vec::new()),
            rings: Mutex::new(vec![None; n]),
            dirty: DirtyLogging::default(),
        })
    }

    /// Register each queue's completion timer and tag wake-up with the
    /// epoll loop of the worker thread serving the queue.
    pub(crate) fn register_events(
        &self,
        handlers: &[Arc<VringEpollHandler<Arc<BlkBackend>>>],
    ) -> io::Result<()> {
        let ids = self.event_ids;
        for (thread, queues) in self.thread_queues.iter().enumerate() {
            let Some(h) = handlers.get(thread) else {
                continue;
            };
            if let Some(efd) = self.repoll.get(thread) {
                h.register_listener(
                    efd.as_raw_fd(),
                    EventSet::IN,
                    ids.encode(Event::Repoll(thread)),
                )?;
            }
            for &q in queues {
                let timer_fd = self.lock_queue(q).timer_fd();
                h.register_listener(timer_fd, EventSet::IN, ids.encode(Event::Timer(q)))?;
                if self.disk.tag_slots[q].is_some() {
                    h.register_listener(
                        self.disk.tag_wakers[q].as_raw_fd(),
                        EventSet::IN,
                        ids.encode(Event::TagFree(q)),
                    )?;
                }
            }
        }
        Ok(())
    }

    /// Queue `qi` is served from `layout` from now on, unless a part of it
    /// overlaps a part of another queue's ring.
    fn claim_ring(&self, qi: usize, layout: RingLayout) -> Result<(), RingError> {
        let mut rings = self.rings.lock().unwrap_or_else(|p| p.into_inner());
        rings[qi] = None;
        for (queue, other) in rings.iter().enumerate() {
            let Some(other) = other else { continue };
            if let Some((part, other)) = layout.overlap_with(other) {
                return Err(RingError::CrossQueue { part, other, queue });
            }
        }
        rings[qi] = Some(layout);
        Ok(())
    }

    /// Queue `qi` no longer serves a ring (stopped, or its ring refused).
    fn release_ring(&self, qi: usize) {
        self.rings.lock().unwrap_or_else(|p| p.into_inner())[qi] = None;
    }

    /// Wait until every pass in progress has ended (each holds its
    /// queue's lock): the passes after it see what changed before, such as
    /// dirty logging turned on or a new log, so no write the frontend must
    /// hear of goes unmarked or into a log it has already read.
    fn wait_for_passes(&self) {
        for q in 0..self.queues.len() {
            drop(self.lock_queue(q));
        }
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

    /// Log each queue's totals since the daemon started (or the last reset).
    pub(crate) fn log_summary(&self) {
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
        let syncs = self.disk.storage.syncs();
        if syncs > 0 {
            info!(
                "{}: {syncs} fdatasync calls since start (flushes and write-through)",
                self.disk.cfg.socket.display()
            );
        }
    }
}

impl Drop for BlkBackend {
    /// A frontend that went away without stopping its rings leaves requests
    /// in service: give their command slots back so a shared pool does not
    /// shrink, and take a queue that waited for one out of the pool's
    /// waiters (its fair share goes back to the others). The disk's pools
    /// outlive the connection; the next one finds them as if this one had
    /// never held anything. And close the exit-event consumers
    /// (`exit_consumers`).
    fn drop(&mut self) {
        for q in &mut self.queues {
            let q = q.get_mut().unwrap_or_else(|p| p.into_inner());
            q.release_slots(&self.disk);
            self.disk.leave_tag_pool(q.index);
        }
        let fds = std::mem::take(
            self.exit_consumers
                .get_mut()
                .unwrap_or_else(|p| p.into_inner()),
        );
        for fd in fds {
            // SAFETY: `fd` is the consumer end `exit_event` created and gave
            // to vhost-user-backend, which released ownership with
            // `into_raw_fd()` and never closes it (0.24, pinned in
            // Cargo.toml); nothing else refers to it once the handlers that
            // hold this backend are dropped, which they are: we are in the
            // backend's drop. Taking ownership closes it exactly once.
            drop(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::config::DiskArgs;
    use crate::virtio_blk::features::BlkFeature;
    use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
    use vhost_user_backend::VhostUserBackend;

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

    #[test]
    fn each_connection_starts_in_the_configured_cache_mode() {
        use crate::device::execute::{answer, Device, Outcome};
        use crate::virtio_blk::request::{Request, Segment, STATUS_OK};
        use virtio_bindings::virtio_blk::VIRTIO_BLK_T_OUT;
        use vm_memory::{Bytes, GuestAddress};

        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("img.raw");
        let img = format!("file:{}", img.display());
        let a = ["--socket", "/tmp/b.sock", "--disk", &img, "--size", "1M"];
        let cfg = DiskArgs::parse_for_test(&a).to_configs().unwrap().remove(0);
        let disk = Arc::new(Disk::open(cfg).unwrap());
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap();
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&VIRTIO_BLK_T_OUT.to_le_bytes());
        mem.write_slice(&h, GuestAddress(0x1000)).unwrap();
        let map = crate::virtq::guest_map::GuestMap::new(Arc::new(mem));
        let segs = [
            Segment {
                addr: 0x1000,
                len: 16,
                write: false,
            },
            Segment {
                addr: 0x2000,
                len: 4096,
                write: false,
            },
            Segment {
                addr: 0x4000,
                len: 1,
                write: true,
            },
        ];
        // A write as a queue worker serves it on connection `b`; returns
        // the fdatasync calls it made.
        let write = |b: &BlkBackend| {
            let before = disk.storage.syncs();
            let dev = Device {
                storage: disk.storage.as_ref(),
                cfg: &disk.cfg,
                capacity: disk.cfg.size,
                writeback: b.writeback(),
                faults: None,
            };
            let o = answer(&dev, Request::from_segments(&segs, &map));
            assert!(matches!(
                o,
                Outcome::Completed {
                    status: STATUS_OK,
                    ..
                }
            ));
            disk.storage.syncs() - before
        };
        // Connection 1 turns the write cache off: its writes are synced.
        let b1 = BlkBackend::new(disk.clone()).unwrap();
        b1.acked_features(1 << VIRTIO_BLK_F_FLUSH);
        assert_eq!(b1.get_config(32, 1), vec![1]);
        b1.set_config(32, &[0]).unwrap();
        assert_eq!(write(&b1), 1);
        drop(b1);
        // Connection 2 starts in write-back again.
        let b2 = BlkBackend::new(disk.clone()).unwrap();
        assert_eq!(b2.get_config(32, 1), vec![1]);
        b2.acked_features(1 << VIRTIO_BLK_F_FLUSH);
        assert!(b2.writeback());
        assert_eq!(write(&b2), 0);
    }

    /// A kick that epoll reported before GET_VRING_BASE unregistered the
    /// kick fd reaches `handle_event` after the ring was stopped (the race
    /// made certain by delivering the event by hand): nothing is popped
    /// or written. The same kick on the started ring is served.
    #[test]
    fn a_kick_delivered_after_the_ring_stopped_touches_nothing() {
        use vhost_user_backend::VringT;
        use vm_memory::{Bytes, GuestAddress, GuestAddressSpace};

        let b = backend(&["--num-queues", "1", "--queue-size", "16"]);
        let mem = GuestMemoryAtomic::new(
            GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap(),
        );
        b.update_memory(mem.clone()).unwrap();
        let vring = kick_vring::KickCountingVring::new(mem.clone(), 16).unwrap();
        vring.set_queue_size(16);
        vring.set_queue_info(0, 0x1000, 0x2000).unwrap();
        vring.set_enabled(true);
        let m = mem.memory();
        // A FLUSH: header at 0x3000, status at 0x3100, head 0 offered.
        m.write_slice(&4u32.to_le_bytes(), GuestAddress(0x3000))
            .unwrap();
        let desc = |i: u64, addr: u64, len: u32, flags: u16, next: u16| {
            let mut d = [0u8; 16];
            d[0..8].copy_from_slice(&addr.to_le_bytes());
            d[8..12].copy_from_slice(&len.to_le_bytes());
            d[12..14].copy_from_slice(&flags.to_le_bytes());
            d[14..16].copy_from_slice(&next.to_le_bytes());
            m.write_slice(&d, GuestAddress(16 * i)).unwrap();
        };
        desc(0, 0x3000, 16, 1, 1);
        desc(1, 0x3100, 1, 2, 0);
        m.write_obj(0xffu8, GuestAddress(0x3100)).unwrap();
        m.write_obj(1u16, GuestAddress(0x1002)).unwrap();
        let kick = b.event_ids.encode(Event::Kick(0)) as u16;
        let used_idx = || m.read_obj::<u16>(GuestAddress(0x2002)).unwrap();
        // Stopped (GET_VRING_BASE has set it not ready): left alone.
        vring.set_queue_ready(false);
        b.handle_event(kick, EventSet::IN, std::slice::from_ref(&vring), 0)
            .unwrap();
        assert_eq!(used_idx(), 0, "a stopped ring was served");
        assert_eq!(m.read_obj::<u8>(GuestAddress(0x3100)).unwrap(), 0xff);
        assert_eq!(vring.queue_next_avail(), 0);
        // Started: served.
        vring.set_queue_ready(true);
        b.handle_event(kick, EventSet::IN, std::slice::from_ref(&vring), 0)
            .unwrap();
        assert_eq!(used_idx(), 1);
        assert_eq!(m.read_obj::<u8>(GuestAddress(0x3100)).unwrap(), 0);
    }

    /// A queue size that is not a power of 2 never starts the ring, and
    /// SET_VRING_ADDR fails; a valid size lifts the refusal.
    #[test]
    fn a_queue_size_not_a_power_of_2_keeps_the_ring_stopped() {
        use vhost_user_backend::VringT;
        use virtio_queue::QueueT;
        use vm_memory::GuestAddress;

        let mem: GM = GuestMemoryAtomic::new(
            GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap(),
        );
        let vring = kick_vring::KickCountingVring::new(mem, 256).unwrap();
        vring.set_enabled(true);
        vring.set_queue_size(100);
        assert!(vring.set_queue_info(0, 0x1000, 0x2000).is_err());
        vring.set_queue_ready(true);
        assert!(!vring.started());
        assert_eq!(
            vring.get_ref().get_queue().size(),
            256,
            "the size was taken"
        );
        vring.set_queue_size(128);
        vring.set_queue_info(0, 0x1000, 0x2000).unwrap();
        vring.set_queue_ready(true);
        assert!(vring.started());
        assert_eq!(vring.get_ref().get_queue().size(), 128);
    }
}
