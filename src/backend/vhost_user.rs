//! The vhost-user side of [`BlkBackend`]: features, configuration space,
//! memory and ring life cycle, and the dispatch of worker-thread events.

use std::cmp::Reverse;
use std::io;
use std::sync::atomic::Ordering;
use std::time::Instant;

use log::{debug, info, warn};
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::{VhostUserBackend, VringT};
use virtio_queue::QueueT;
use vm_memory::{GuestAddressSpace, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};

use crate::backend::events::Event;
use crate::backend::kick_vring::KickCountingVring;
use crate::backend::worker::Pass;
use crate::backend::{BlkBackend, GM};
use crate::device::config_space;
use crate::virtio_blk::features::BlkFeature;

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
        // vm-memory maps a region without looking at its file's size, and
        // touching a page past the end of the file raises SIGBUS: refuse
        // such a table (vhost-user-backend then fails the message and ends
        // the connection), and serve no ring from it meanwhile.
        if let Err(e) = check_files_cover_regions(&mem.memory()) {
            warn!("{}: {e}", self.disk.cfg.socket.display());
            for q in 0..self.queues.len() {
                self.lock_queue(q).mem = None;
            }
            return Err(e);
        }
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
        let mut pass = Pass {
            be: self,
            q: &mut q,
            st: &mut st,
            ring: &mut *vs,
            mem: &mem,
        };
        while let Some(Reverse(p)) = pass.q.pending.pop() {
            pass.finish(p, Some(Instant::now()));
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
        let Some(mine) = self.thread_queues.get(thread_id) else {
            return Ok(());
        };
        // Which queue, and why: a kick (thread-local vring index), its
        // completion timer, or a free command slot.
        let (qi, by_kick) = match self.event_ids.decode(device_event, vrings.len()) {
            Some(Event::Kick(local)) => match mine.get(local) {
                Some(&qi) => (qi, true),
                None => return Ok(()),
            },
            Some(Event::Timer(qi)) => (qi, false),
            Some(Event::TagFree(qi)) => {
                // Clear the wake-up; a pool writes it again on the next free.
                let _ = self.disk.tag_wakers[qi].read();
                (qi, false)
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

/// Every file-backed region of `mem` lies within its (regular) file. A
/// frontend that shrinks a file after sending it is not caught here.
fn check_files_cover_regions(mem: &GuestMemoryMmap) -> io::Result<()> {
    for r in mem.iter() {
        let Some(fo) = r.file_offset() else {
            continue;
        };
        let meta = fo.file().metadata()?;
        // Device files (DAX) report no size.
        if !meta.is_file() {
            continue;
        }
        let past_eof = match fo.start().checked_add(r.len()) {
            Some(end) => end > meta.len(),
            None => true,
        };
        if past_eof {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "memory region at guest address {:#x}: {} bytes at file offset {} \
                     reach past the end of its {}-byte file",
                    r.start_addr().0,
                    r.len(),
                    fo.start(),
                    meta.len()
                ),
            ));
        }
    }
    Ok(())
}
