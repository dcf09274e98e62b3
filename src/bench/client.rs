//! A libblkio client of a vhost-user-blk socket (the `blkio` crate's
//! virtio-blk-vhost-user driver): connect, start the queues, and one
//! mapped buffer region split evenly between them. [`super::run`] drives
//! it; the tests and benches (`tests/common/client.rs`) add request helpers
//! on top.
//!
//! The region is never freed by hand: libblkio frees it once the [`Blkio`]
//! and every [`Blkioq`] of the connection are gone, so a [`Queue`] (which
//! owns its `Blkioq`) may use its part of the region for as long as it
//! lives, whatever happens to the [`Connection`].

use std::path::Path;

use blkio::{Blkio, Blkioq};

use super::{blkio_err, BenchError};

/// A connected, not yet started device: its properties can be read (e.g.
/// `max-queue-size`) before the queues are chosen.
pub(crate) struct Connected {
    blkio: Blkio,
}

/// How to start a [`Connected`] device.
#[derive(Debug, Clone, Copy)]
pub struct QueueSetup {
    pub queues: usize,
    /// Entries per virtqueue.
    pub queue_size: i32,
    /// libblkio poll queues: completions are busy-polled instead of
    /// signalled on the completion eventfd.
    pub poll: bool,
    /// Bytes of the buffer region per queue.
    pub buf_per_queue: usize,
}

/// A started device with its queues.
pub struct Connection {
    /// The queues, in order, each with its part of the buffer region
    /// (declared first: dropped before the device).
    pub queues: Vec<Queue>,
    pub blkio: Blkio,
}

/// One queue and its part of the connection's buffer region.
pub struct Queue {
    pub q: Blkioq,
    buf: *mut u8,
    len: usize,
}

// SAFETY: `buf` points into a memory region that stays mapped while this
// queue's Blkioq lives (see the module documentation); each queue's part
// is disjoint from every other queue's.
unsafe impl Send for Queue {}

impl Connected {
    /// Connect to `socket` (read-only: libblkio refuses to open a read-only
    /// device read-write).
    pub(crate) fn connect(socket: &Path, read_only: bool) -> Result<Connected, BenchError> {
        let path = socket.to_str().ok_or(BenchError::SocketNotUtf8)?;
        let mut blkio = Blkio::new("virtio-blk-vhost-user").map_err(blkio_err("create"))?;
        blkio.set_str("path", path).map_err(blkio_err("path"))?;
        blkio
            .set_bool("read-only", read_only)
            .map_err(blkio_err("read-only"))?;
        blkio.connect().map_err(blkio_err("connect"))?;
        Ok(Connected { blkio })
    }

    /// The connected device, for its properties.
    pub(crate) fn blkio(&self) -> &Blkio {
        &self.blkio
    }

    /// Start `setup.queues` queues of `setup.queue_size` entries and map
    /// `setup.buf_per_queue` bytes of buffers for each.
    pub(crate) fn start(self, setup: QueueSetup) -> Result<Connection, BenchError> {
        let mut b = self.blkio;
        let n = setup.queues as i32;
        let (nq, npq) = if setup.poll { (0, n) } else { (n, 0) };
        b.set_i32("num-queues", nq)
            .map_err(blkio_err("num-queues"))?;
        b.set_i32("num-poll-queues", npq)
            .map_err(blkio_err("num-poll-queues"))?;
        b.set_i32("queue-size", setup.queue_size)
            .map_err(blkio_err("queue-size"))?;
        let started = b.start().map_err(blkio_err("start"))?;
        let queues = if setup.poll {
            started.poll_queues
        } else {
            started.queues
        };
        let align = b
            .get_u64("mem-region-alignment")
            .map_err(blkio_err("mem-region-alignment"))?
            .max(1) as usize;
        let len = (setup.buf_per_queue * setup.queues).max(1).div_ceil(align) * align;
        let region = b.alloc_mem_region(len).map_err(blkio_err("alloc"))?;
        b.map_mem_region(&region).map_err(blkio_err("map"))?;
        let queues = queues
            .into_iter()
            .enumerate()
            .map(|(i, q)| Queue {
                q,
                // The region is `len` >= queues * buf_per_queue bytes long.
                buf: (region.addr + i * setup.buf_per_queue) as *mut u8,
                len: setup.buf_per_queue,
            })
            .collect();
        Ok(Connection { queues, blkio: b })
    }
}

impl Connection {
    /// [`Connected::connect`] and [`Connected::start`] in one.
    pub fn open(
        socket: &Path,
        read_only: bool,
        setup: QueueSetup,
    ) -> Result<Connection, BenchError> {
        Connected::connect(socket, read_only)?.start(setup)
    }
}

impl Queue {
    /// The queue's buffers.
    pub fn buf(&mut self) -> &mut [u8] {
        // SAFETY: buf/len describe this queue's disjoint part of a live,
        // mapped region (see the module documentation).
        unsafe { std::slice::from_raw_parts_mut(self.buf, self.len) }
    }

    /// Bytes of buffers.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address of `len` bytes at `offset` in the queue's buffers, for a
    /// request. Panics unless they are inside.
    pub fn ptr(&self, offset: usize, len: usize) -> *mut u8 {
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= self.len),
            "{len} bytes at {offset} are outside the queue's {} bytes of buffers",
            self.len
        );
        // SAFETY: offset is inside this queue's part of the region.
        unsafe { self.buf.add(offset) }
    }
}
