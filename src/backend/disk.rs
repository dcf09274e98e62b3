//! The served disk: configuration, contents, per-queue statistics and
//! command-slot pools, shared by every connection for the life of the
//! process.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use vmm_sys_util::eventfd::EventFd;

use crate::backend::handover::ImageHold;
use crate::device::config::{DiskConfig, TagMode, TagScope};
use crate::device::config_space;
use crate::device::storage::{self, Storage, StorageError};
use crate::device::tags::{PoolStats, QueueId, Tag, TagPool};
use crate::stats::queue::QueueStats;

/// Why a disk cannot be opened.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("cannot create a tag wake-up eventfd: {0}")]
    TagWaker(#[source] std::io::Error),
}

/// A served disk: its configuration and contents, shared by every
/// connection for the life of the process.
pub(crate) struct Disk {
    pub cfg: DiskConfig,
    pub storage: Box<dyn Storage>,
    /// Per-queue statistics, for the life of the process. Each is locked by
    /// its queue's worker once per wake-up, and by readers.
    pub stats: Vec<Mutex<QueueStats>>,
    /// The guest-visible `writeback` config byte (CONFIG_WCE), for the
    /// current connection: each connection starts from
    /// [`Disk::CONFIGURED_WRITEBACK`] ([`Disk::reset_cache_mode`]).
    pub(super) writeback: AtomicBool,
    /// Each queue's command-slot pool and its id in it (none without
    /// `--tags`). Per-queue pools are private; a shared pool is the same
    /// `Arc` for every queue of the disk (or of the host).
    pub(super) tag_slots: Vec<Option<(Arc<TagPool>, QueueId)>>,
    /// Each queue's wake-up eventfd, written by its pool when slots free.
    pub(super) tag_wakers: Vec<Arc<EventFd>>,
    /// The daemon is stopping: no queue pops a new request; the requests
    /// in service complete (at their deadlines) before the connection
    /// closes.
    pub(super) quiescing: AtomicBool,
    /// The stop's wait for requests in service is over (its time ran out,
    /// or a second signal came): they complete at once, and a
    /// GET_VRING_BASE waiting for them stops waiting.
    pub(super) stopping: AtomicBool,
    /// Frontends that have connected since the disk was opened (the
    /// connection generation).
    connections: AtomicU64,
    /// A frontend is connected now.
    connected: AtomicBool,
    /// Who holds the image's write locks across a live migration.
    pub(super) image: ImageHold,
}

impl Disk {
    /// Open the disk's storage (file disks without a size take the image's).
    #[cfg(test)]
    pub(crate) fn open(cfg: DiskConfig) -> Result<Disk, DiskError> {
        Self::open_with_host_pool(cfg, None)
    }

    /// As [`Disk::open`]; `host_pool` is the process-wide pool used when the
    /// disk's tags are shared with host scope.
    pub(crate) fn open_with_host_pool(
        mut cfg: DiskConfig,
        host_pool: Option<Arc<TagPool>>,
    ) -> Result<Disk, DiskError> {
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
            let efd = EventFd::new(libc::EFD_NONBLOCK | libc::EFD_CLOEXEC)
                .map_err(DiskError::TagWaker)?;
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
            image: ImageHold::new(&cfg),
            cfg,
            storage,
            stats,
            writeback: AtomicBool::new(Self::CONFIGURED_WRITEBACK),
            tag_slots,
            tag_wakers,
            quiescing: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            connections: AtomicU64::new(0),
            connected: AtomicBool::new(false),
        })
    }

    /// The cache mode every connection starts in: write-back (the guest
    /// may switch to write-through through CONFIG_WCE; without FLUSH acked
    /// every write is write-through anyway).
    pub(super) const CONFIGURED_WRITEBACK: bool = true;

    /// Put the cache mode back to the configured one for a new connection,
    /// as QEMU's virtio-blk does on device reset (`original_wce`): what one
    /// guest set must not carry over to the next.
    pub(super) fn reset_cache_mode(&self) {
        self.writeback
            .store(Self::CONFIGURED_WRITEBACK, Ordering::Relaxed);
    }

    /// A frontend connected: returns its connection generation (1 for the
    /// first).
    pub(super) fn frontend_connected(&self) -> u64 {
        self.connected.store(true, Ordering::SeqCst);
        self.connections.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// The frontend's connection ended.
    pub(super) fn frontend_disconnected(&self) {
        self.connected.store(false, Ordering::SeqCst);
    }

    /// (connection generation, whether a frontend is connected now).
    pub(crate) fn connection(&self) -> (u64, bool) {
        (
            self.connections.load(Ordering::SeqCst),
            self.connected.load(Ordering::SeqCst),
        )
    }

    /// The stop's wait for requests in service is over: they complete at
    /// once (see `stopping`).
    pub(super) fn end_stop_wait(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }

    /// The daemon is stopping: pop nothing more (see `quiescing`).
    #[inline]
    pub(super) fn is_quiescing(&self) -> bool {
        self.quiescing.load(Ordering::Relaxed)
    }

    /// The pools this disk's queues draw from (one entry per distinct pool).
    pub(crate) fn tag_pool_stats(&self) -> Vec<PoolStats> {
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
    pub(super) fn put_tag(&self, q: usize, tag: Option<Tag>) {
        if let (Some(t), Some((pool, id))) = (tag, &self.tag_slots[q]) {
            pool.put(*id, t);
        }
    }

    /// Queue `q`'s connection ended: it no longer waits for a command
    /// slot (the next connection's queue registers again when it needs
    /// one). Its slots must have been given back first.
    pub(super) fn leave_tag_pool(&self, q: usize) {
        if let Some((pool, id)) = &self.tag_slots[q] {
            pool.stop_waiting(*id);
        }
    }

    /// Lock one queue's statistics.
    pub(crate) fn queue_stats(&self, q: usize) -> MutexGuard<'_, QueueStats> {
        self.stats[q].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The configuration space as the guest would read it now.
    pub(crate) fn config_space(&self) -> [u8; config_space::CONFIG_SPACE_SIZE] {
        config_space::build(&self.cfg, self.writeback.load(Ordering::Relaxed))
    }
}
