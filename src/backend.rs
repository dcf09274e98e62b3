//! The vhost-user-blk device: a `&self` [`VhostUserBackend`] with per-queue
//! state, so each queue's worker thread runs without a shared lock.
//!
//! One [`Disk`] (configuration + storage) lives for the whole process; one
//! [`BlkBackend`] is created per vhost-user connection and shares the disk,
//! so data survives reconnects while ring state starts fresh.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use log::{debug, info, warn};
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::{VhostUserBackend, VringT};
use virtio_bindings::virtio_blk::VIRTIO_BLK_F_FLUSH;
use virtio_queue::{QueueOwnedT, QueueT};
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};

use crate::config_space;
use crate::disk::DiskConfig;
use crate::features::BlkFeature;
use crate::kick_vring::KickCountingVring;
use crate::request::{
    collect_segments, execute, Device, DropReason, Op, Outcome, Segment, STATUS_IOERR, STATUS_OK,
    STATUS_UNSUPP,
};
use crate::stats::{current_tid, QueueCounters, QueueStats};
use crate::storage::{self, Storage, StorageError};

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
}

impl Disk {
    /// Open the disk's storage (file disks without a size take the image's).
    pub fn open(mut cfg: DiskConfig) -> Result<Disk, StorageError> {
        let storage = storage::open(&mut cfg)?;
        let stats = (0..cfg.num_queues)
            .map(|_| Mutex::new(QueueStats::default()))
            .collect();
        Ok(Disk {
            cfg,
            storage,
            stats,
            writeback: AtomicBool::new(true),
        })
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
}

/// One connection's device.
pub struct BlkBackend {
    disk: Arc<Disk>,
    queues: Vec<Mutex<QueueState>>,
    /// For each worker thread, the queue index of each of its vrings.
    thread_queues: Vec<Vec<usize>>,
    acked_features: AtomicU64,
    event_idx: AtomicBool,
}

impl BlkBackend {
    pub fn new(disk: Arc<Disk>) -> BlkBackend {
        let n = usize::from(disk.cfg.num_queues);
        let queues = (0..n)
            .map(|index| {
                Mutex::new(QueueState {
                    index,
                    mem: None,
                    segs: Vec::with_capacity(usize::from(disk.cfg.queue_size)),
                    warned_ring: false,
                    warned_drop: false,
                    worker_tid: None,
                })
            })
            .collect();
        let thread_queues = disk
            .cfg
            .queues_per_thread
            .iter()
            .map(|mask| (0..n).filter(|q| mask & (1u64 << q) != 0).collect())
            .collect();
        BlkBackend {
            disk,
            queues,
            thread_queues,
            acked_features: AtomicU64::new(0),
            event_idx: AtomicBool::new(false),
        }
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

    /// Serve everything the guest made available on one vring.
    fn process_vring(&self, q: &mut QueueState, vring: &KickCountingVring<GM>) {
        let Some(atomic) = q.mem.clone() else {
            return;
        };
        let mem = atomic.memory();
        let mut st = self.disk.queue_stats(q.index);
        let tid = *q.worker_tid.get_or_insert_with(current_tid);
        st.set_worker(tid);
        let mut kicks = vring.take_kicks();
        let mut popped = 0u64;
        let event_idx = vring.get_ref().get_queue().event_idx_enabled();
        let mut first = true;
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
            let (done, ring_ok) = self.drain(q, &mut st, &mut vs, &mem);
            popped += done as u64;
            if done > 0 {
                match vs.get_queue_mut().needs_notification(&*mem) {
                    Ok(true) => {
                        if let Err(e) = vs.signal_used_queue() {
                            warn!("queue {}: cannot signal the guest: {e}", q.index);
                        }
                        st.counters.notifications += 1;
                    }
                    Ok(false) => st.counters.notifications_suppressed += 1,
                    Err(_) => {
                        self.ring_error(q, &mut st, "cannot read the avail ring's used_event")
                    }
                }
            }
            // A broken ring stays broken until the driver resets it: do not
            // spin on it.
            if !event_idx || !ring_ok {
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
        st.wakeup(kicks, popped);
    }

    /// Pop, execute and complete every available chain. Returns how many
    /// chains were put on the used ring, and false if the avail ring is
    /// unusable.
    fn drain(
        &self,
        q: &mut QueueState,
        st: &mut QueueStats,
        vs: &mut vhost_user_backend::VringState<GM>,
        mem: &GuestMemoryMmap,
    ) -> (usize, bool) {
        let mut done = 0;
        loop {
            let chain = match vs.get_queue_mut().iter(mem) {
                Ok(mut it) => it.next(),
                Err(e) => {
                    self.ring_error(q, st, &format!("avail ring unusable: {e}"));
                    return (done, false);
                }
            };
            let Some(chain) = chain else {
                return (done, true);
            };
            let head = chain.head_index();
            let popped_at = Instant::now();
            // Requests are served one at a time: none other is in service.
            st.popped(popped_at, 0);
            let outcome = match collect_segments(chain, &mut q.segs) {
                Ok(()) => {
                    let dev = Device {
                        storage: self.disk.storage.as_ref(),
                        cfg: &self.disk.cfg,
                        capacity: self.disk.cfg.size,
                        writeback: self.writeback(),
                    };
                    execute(&dev, mem, &q.segs)
                }
                Err(reason) => Outcome::Dropped(reason),
            };
            let used_len = self.account(q, st, outcome);
            if vs.get_queue_mut().add_used(mem, head, used_len).is_err() {
                self.ring_error(q, st, &format!("cannot put head {head} on the used ring"));
                continue;
            }
            if let Outcome::Completed { op, .. } = outcome {
                st.completed(op, popped_at.elapsed());
            }
            done += 1;
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
            } => {
                c.requests += 1;
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
                        describe_drop(reason)
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

fn describe_drop(r: DropReason) -> &'static str {
    match r {
        DropReason::Empty => "no readable descriptor at the head",
        DropReason::Truncated => {
            "chain loops, is longer than the queue, or has an invalid descriptor"
        }
        DropReason::NoStatus => "last descriptor is not device-writable, no status byte",
        DropReason::EmptyStatus => "status descriptor has length 0",
        DropReason::StatusUnwritable => "status byte outside guest memory",
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

    fn set_event_idx(&self, enabled: bool) {
        self.event_idx.store(enabled, Ordering::Relaxed);
    }

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
        // queue's lock waits for any request still being served.
        if (queue_index as usize) < self.queues.len() {
            drop(self.lock_queue(queue_index as usize));
        }
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
        let local = usize::from(device_event);
        let (Some(&qi), Some(vring)) = (
            self.thread_queues.get(thread_id).and_then(|v| v.get(local)),
            vrings.get(local),
        ) else {
            // Not a queue event: nothing of ours is registered besides the
            // kicks. Returning an error would stop the worker thread.
            return Ok(());
        };
        let mut q = self.lock_queue(qi);
        self.process_vring(&mut q, vring);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::DiskArgs;

    fn backend(extra: &[&str]) -> BlkBackend {
        let mut a = vec!["--socket", "/tmp/b.sock", "--disk", "null", "--size", "1G"];
        a.extend_from_slice(extra);
        let cfg = DiskArgs::parse_for_test(&a).to_configs().unwrap().remove(0);
        BlkBackend::new(Arc::new(Disk::open(cfg).unwrap()))
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
