//! The vhost-user side of [`BlkBackend`]: features, configuration space,
//! memory and ring life cycle, and the dispatch of worker-thread events.

use std::fs::File;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use log::{debug, info, warn};
use vhost::vhost_user::message::{
    VhostUserInflight, VhostUserLog, VhostUserProtocolFeatures, VhostUserVirtioFeatures,
};
use vhost_user_backend::VhostUserBackend;
use vm_memory::{
    GuestAddressSpace, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion, GuestRegionMmap,
};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};

use crate::backend::events::Event;
use crate::backend::kick_vring::KickCountingVring;
use crate::backend::worker::{Mode, Wake};
use crate::backend::{BlkBackend, GM};
use crate::device::config_space;
use crate::device::polling::PollMode;
use crate::util::fd::seal_against_shrinking;
use crate::virtio_blk::features::BlkFeature;
use crate::virtq::dirty_log::DirtyLog;
use crate::virtq::inflight::InflightArea;

/// Longest GET_VRING_BASE waits for requests in service (emulated latency,
/// stalls) before completing them early.
const STOP_WAIT_MAX: Duration = Duration::from_secs(60);

/// Why a memory region the frontend sent is refused.
#[derive(Debug, thiserror::Error)]
pub(super) enum RegionError {
    #[error("cannot stat the region's file: {0}")]
    Stat(#[source] io::Error),
    #[error("region at guest address {at:#x}: mmap offset {offset:#x} + size {len:#x} exceeds its file's size {size:#x}")]
    BeyondFile {
        at: u64,
        offset: u64,
        len: u64,
        size: u64,
    },
}

/// The guest memory `mem` without its regions whose backing file is
/// shorter than the region (mmap offset + size beyond the file's size),
/// and why they were refused (`None`: all were fine).
pub(super) fn checked_memory(mem: &GuestMemoryMmap) -> (GuestMemoryMmap, Option<RegionError>) {
    let mut kept = mem.clone();
    let mut why = None;
    for r in mem.iter() {
        if let Some(e) = region_backing_error(r) {
            // The region is in `kept` (it came from `mem`), so removing it
            // cannot fail; if it did, refuse all memory rather than keep it.
            kept = match kept.remove_region(r.start_addr(), r.len()) {
                Ok((m, _)) => m,
                Err(_) => GuestMemoryMmap::new(),
            };
            why = Some(e);
        }
    }
    (kept, why)
}

/// Why region `r` cannot be accessed safely, if it cannot.
///
/// The size check holds only while the file keeps its size, so a file that
/// can be sealed is first sealed against shrinking (F_SEAL_SHRINK): then no
/// one, the frontend included, can truncate it under the mapping. QEMU's
/// `memory-backend-memfd` seals its memfds itself (`seal=on`, the default);
/// a frontend's memfd made with MFD_ALLOW_SEALING is sealed here. A file
/// that cannot be sealed (a plain file, hugetlbfs, a memfd without
/// sealing) is accepted as QEMU accepts it; a frontend that truncates it
/// after the check can still SIGBUS the daemon (README, Guarantees).
fn region_backing_error(r: &GuestRegionMmap) -> Option<RegionError> {
    let fo = r.file_offset()?;
    seal_against_shrinking(fo.file());
    let size = match fo.file().metadata() {
        Ok(m) => m.len(),
        Err(e) => return Some(RegionError::Stat(e)),
    };
    let end = fo.start().checked_add(r.len());
    match end {
        Some(end) if end <= size => None,
        _ => Some(RegionError::BeyondFile {
            at: r.start_addr().0,
            offset: fo.start(),
            len: r.len(),
            size,
        }),
    }
}

/// Why an inflight area's shape is refused.
#[derive(Debug, thiserror::Error)]
#[error("an inflight area for {queues} queue(s) of {queue_size} descriptors: this disk has {ours} queue(s) of at most 32768 descriptors")]
struct InflightShape {
    queues: u16,
    queue_size: u16,
    ours: usize,
}

impl BlkBackend {
    fn check_inflight_shape(&self, area: &VhostUserInflight) -> io::Result<()> {
        let ours = self.queues.len();
        if area.num_queues == 0
            || usize::from(area.num_queues) > ours
            || area.queue_size == 0
            || area.queue_size > 32768
        {
            let e = InflightShape {
                queues: area.num_queues,
                queue_size: area.queue_size,
                ours,
            };
            warn!("{}: {e}", self.disk.cfg.socket.display());
            return Err(io::Error::new(io::ErrorKind::InvalidInput, e));
        }
        Ok(())
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
        self.disk.cfg.features.bits()
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
            | VhostUserVirtioFeatures::LOG_ALL.bits()
    }

    /// Called on every SET_FEATURES: QEMU sets LOG_ALL when a migration
    /// starts and clears it when the migration ends or fails.
    fn acked_features(&self, features: u64) {
        debug!(
            "{}: guest acked features {features:#x}",
            self.disk.cfg.socket.display()
        );
        self.acked_features.store(features, Ordering::Relaxed);
        let log_all = features & VhostUserVirtioFeatures::LOG_ALL.bits() != 0;
        if log_all != self.dirty.log_all() {
            info!(
                "{}: dirty page logging {} (VHOST_F_LOG_ALL)",
                self.disk.cfg.socket.display(),
                if log_all { "requested" } else { "ended" }
            );
        }
        if self.dirty.set_log_all(log_all) {
            self.wait_for_passes();
        }
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::CONFIG
            | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
            | VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::INFLIGHT_SHMFD
            | VhostUserProtocolFeatures::LOG_SHMFD
    }

    /// A new, zeroed inflight area for the frontend to keep (it sends it
    /// back with SET_INFLIGHT_FD, to this back-end and to the next).
    fn get_inflight_fd(
        &self,
        request: &VhostUserInflight,
    ) -> io::Result<(VhostUserInflight, File)> {
        self.check_inflight_shape(request)?;
        let (file, size) = InflightArea::create(request.num_queues, request.queue_size)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        debug!(
            "{}: inflight area of {size} bytes for {} queue(s) of {}",
            self.disk.cfg.socket.display(),
            request.num_queues,
            request.queue_size
        );
        let reply = VhostUserInflight {
            mmap_size: size,
            mmap_offset: 0,
            num_queues: request.num_queues,
            queue_size: request.queue_size,
        };
        Ok((reply, file))
    }

    /// Map the frontend's inflight area and record every queue's requests
    /// in it; each ring reads what a previous back-end left there when it
    /// starts.
    fn set_inflight_fd(&self, area: &VhostUserInflight, file: File) -> io::Result<()> {
        self.check_inflight_shape(area)?;
        let mapped = InflightArea::open(
            &file,
            area.mmap_offset,
            area.mmap_size,
            area.num_queues,
            area.queue_size,
        )
        .map_err(|e| {
            warn!(
                "{}: refusing the inflight area: {e}",
                self.disk.cfg.socket.display()
            );
            io::Error::new(io::ErrorKind::InvalidInput, e)
        })?;
        let mapped = Arc::new(mapped);
        for q in 0..self.queues.len() {
            self.lock_queue(q).set_inflight(mapped.queue(q));
        }
        Ok(())
    }

    /// The workers write guest memory through their own mappings, so they
    /// mark the dirty log themselves.
    fn logs_dirty_pages(&self) -> bool {
        true
    }

    /// SET_LOG_BASE: map the frontend's log. One that its file does not
    /// hold is refused; vhost-user has no negative reply to SET_LOG_BASE,
    /// so the refusal ends the connection (the frontend sees it fail; the
    /// daemon accepts the next one).
    fn set_log_base(&self, log: &VhostUserLog, file: File) -> io::Result<()> {
        let (size, offset) = (log.mmap_size, log.mmap_offset);
        let log = DirtyLog::map(&file, offset, size).map_err(|e| {
            warn!(
                "{}: refusing the dirty log (SET_LOG_BASE): {e}; vhost-user has no way to refuse it in a reply, so the connection ends",
                self.disk.cfg.socket.display()
            );
            io::Error::new(io::ErrorKind::InvalidInput, e)
        })?;
        debug!(
            "{}: dirty log of {size} bytes at offset {offset} ({} pages)",
            self.disk.cfg.socket.display(),
            log.pages()
        );
        if self.dirty.set_log(log) {
            self.wait_for_passes();
        }
        Ok(())
    }

    /// SET_LOG_FD: the eventfd written after a pass that marked the log.
    fn set_log_fd(&self, file: File) -> io::Result<()> {
        self.dirty.set_kick(file)
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

    /// The library has already mapped the frontend's regions and installed
    /// them in `mem` when it calls this. A region whose file is shorter
    /// than the mapping would kill the whole process (every `--count`
    /// disk) with SIGBUS at the first access past the file's end: such
    /// regions are removed again and the message is refused. The workers
    /// see memory only through their own copy, set here after the check,
    /// so they never see an unchecked region.
    fn update_memory(&self, mem: GM) -> io::Result<()> {
        let (checked, refused) = checked_memory(&mem.memory());
        if let Some(why) = &refused {
            // Take the refused regions out of the library's view too.
            mem.lock()
                .unwrap_or_else(|p| p.into_inner())
                .replace(checked.clone());
            warn!(
                "{}: refusing a memory region: {why}",
                self.disk.cfg.socket.display()
            );
        }
        let ours = GM::new(checked);
        for q in 0..self.queues.len() {
            self.lock_queue(q).new_memory(ours.clone());
        }
        match refused {
            None => Ok(()),
            Some(why) => Err(io::Error::new(io::ErrorKind::InvalidInput, why)),
        }
    }

    fn queues_per_thread(&self) -> Vec<u64> {
        self.disk.cfg.queues_per_thread.clone()
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        match new_event_consumer_and_notifier(EventFlag::NONBLOCK | EventFlag::CLOEXEC) {
            Ok(pair) => {
                // The library leaks the consumer's fd; the backend closes it
                // when dropped (see `BlkBackend::exit_consumers`).
                self.exit_consumers
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(std::os::fd::AsRawFd::as_raw_fd(&pair.0));
                Some(pair)
            }
            Err(e) => {
                warn!("cannot create a worker exit event: {e}");
                None
            }
        }
    }

    fn stop_vring(&self, queue_index: u32) -> io::Result<()> {
        // The vring is already unregistered from its worker (and no longer
        // ready, so its timer wake-ups leave it alone); taking the queue's
        // lock waits for a pass in progress. Requests still in service
        // complete at their deadlines before GET_VRING_BASE is answered, so
        // the guest gets every buffer back. The wait never holds the
        // queue's lock, is bounded, and ends at once when the daemon's
        // stop has run out of time.
        let qi = queue_index as usize;
        if qi >= self.queues.len() {
            return Ok(());
        }
        self.complete_in_service(qi, Instant::now() + STOP_WAIT_MAX, |be, q| {
            be.hand_back(q);
            // The driver restarts the ring from here.
            q.restart();
            be.release_ring(qi);
        });
        self.lock_queue(qi).set_timer(None);
        self.after_stop();
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
        let Some(mine) = self.thread_queues.get(thread_id) else {
            return Ok(());
        };
        // Which queue, and why: a kick (thread-local vring index), its
        // completion timer, or a free command slot.
        let (qi, wake) = match self.event_ids.decode(device_event, vrings.len()) {
            Some(Event::Kick(local)) => match mine.get(local) {
                Some(&qi) => (qi, Wake::Kick),
                None => return Ok(()),
            },
            Some(Event::Timer(qi)) => (qi, Wake::Timer),
            Some(Event::TagFree(qi)) => {
                // Clear the wake-up; a pool writes it again on the next free.
                let _ = self.disk.tag_wakers[qi].read();
                (qi, Wake::SlotFree)
            }
            Some(Event::Repoll(t)) if t == thread_id && !self.repoll.is_empty() => {
                if let Some(efd) = self.repoll.get(thread_id) {
                    let _ = efd.read();
                }
                self.poll_loop(thread_id, vrings);
                return Ok(());
            }
            // Nothing else of ours is registered. Returning an error would
            // stop the worker thread.
            Some(Event::Repoll(_)) | None => return Ok(()),
        };
        let Some(local) = mine.iter().position(|&x| x == qi) else {
            return Ok(());
        };
        let Some(vring) = vrings.get(local) else {
            return Ok(());
        };
        let mut q = self.lock_queue(qi);
        if wake != Wake::Kick {
            q.acknowledge_timer(Instant::now());
        }
        // Serve only a started ring, checked under the queue's lock:
        // GET_VRING_BASE marks the ring stopped before it takes this lock,
        // so a wake-up that epoll reported before the kick fd was
        // unregistered finds it stopped and leaves it alone, and one that
        // got here first ends its pass before the base is read.
        if !vring.started() {
            return Ok(());
        }
        if self.polling == PollMode::Off {
            self.serve_queue(&mut q, vring, wake, Mode::Notify);
            return Ok(());
        }
        q.start_polling();
        if !self.serve_polled(&mut q, vring, wake).pollable {
            self.stop_polling(&mut q, Instant::now(), false);
        }
        drop(q);
        self.poll_loop(thread_id, vrings);
        Ok(())
    }
}

impl BlkBackend {
    /// A ring stopped (GET_VRING_BASE). After the last ring of a
    /// migration's source stops (dirty logging on), the image's write
    /// locks go to the destination.
    fn after_stop(&self) {
        if self.dirty.log_all() && !self.any_ring_serving() {
            self.disk.hand_over_image();
        }
    }

    /// Whether any ring has been served since it (last) started.
    fn any_ring_serving(&self) -> bool {
        (0..self.queues.len()).any(|q| self.lock_queue(q).serving())
    }
}
