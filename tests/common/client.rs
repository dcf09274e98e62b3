//! A vhost-user-blk client on libblkio's Rust API (the `blkio` crate's
//! virtio-blk-vhost-user driver): a real third-party frontend for tests.
#![allow(dead_code)]

use std::mem::MaybeUninit;
use std::path::Path;

use blkio::{Blkio, Blkioq, Completion, MemoryRegion, ReqFlags};

/// Bytes of request buffers per queue.
pub const BUF_PER_QUEUE: usize = 1 << 20;

/// A connected disk with its queues and one mapped buffer region.
pub struct Client {
    pub blkio: Blkio,
    pub queues: Vec<ClientQueue>,
    region: MemoryRegion,
}

/// One queue and its slice of the shared buffer region.
pub struct ClientQueue {
    pub q: Blkioq,
    buf: *mut u8,
    len: usize,
}

// SAFETY: `buf` points into a memory region owned by the Client, which
// outlives its queues in every test; each queue's slice is disjoint.
unsafe impl Send for ClientQueue {}

/// A request to submit: (kind, byte offset, length, fill byte for writes).
#[derive(Clone, Copy, Debug)]
pub enum Op {
    Read,
    Write(u8),
}

impl Client {
    /// Connect to `socket` with `num_queues` queues of 128 entries.
    pub fn connect(socket: &Path, num_queues: usize) -> blkio::Result<Client> {
        Self::connect_with(socket, num_queues, 128, false)
    }

    /// Connect to a read-only disk (libblkio refuses to open a read-only
    /// device read-write).
    pub fn connect_read_only(socket: &Path, num_queues: usize) -> blkio::Result<Client> {
        Self::connect_with(socket, num_queues, 128, true)
    }

    /// Connect with a chosen virtqueue size and access mode.
    pub fn connect_with(
        socket: &Path,
        num_queues: usize,
        queue_size: i32,
        read_only: bool,
    ) -> blkio::Result<Client> {
        Self::connect_opts(socket, num_queues, queue_size, read_only, false)
    }

    /// Connect with libblkio poll queues: `do_io` busy-waits for
    /// completions instead of sleeping on the completion eventfd.
    pub fn connect_polling(socket: &Path, num_queues: usize) -> blkio::Result<Client> {
        Self::connect_opts(socket, num_queues, 128, false, true)
    }

    fn connect_opts(
        socket: &Path,
        num_queues: usize,
        queue_size: i32,
        read_only: bool,
        poll: bool,
    ) -> blkio::Result<Client> {
        let mut b = Blkio::new("virtio-blk-vhost-user")?;
        b.set_str("path", socket.to_str().expect("utf-8 path"))?;
        b.set_bool("read-only", read_only)?;
        b.connect()?;
        let (nq, npq) = if poll {
            (0, num_queues)
        } else {
            (num_queues, 0)
        };
        b.set_i32("num-queues", nq as i32)?;
        b.set_i32("num-poll-queues", npq as i32)?;
        b.set_i32("queue-size", queue_size)?;
        let mut started = b.start()?;
        if poll {
            started.queues = std::mem::take(&mut started.poll_queues);
        }
        let align = b.get_u64("mem-region-alignment")? as usize;
        let len = (BUF_PER_QUEUE * num_queues).div_ceil(align) * align;
        let region = b.alloc_mem_region(len)?;
        b.map_mem_region(&region)?;
        let queues = started
            .queues
            .into_iter()
            .enumerate()
            .map(|(i, q)| ClientQueue {
                q,
                buf: (region.addr + i * BUF_PER_QUEUE) as *mut u8,
                len: BUF_PER_QUEUE,
            })
            .collect();
        Ok(Client {
            blkio: b,
            queues,
            region,
        })
    }

    pub fn capacity(&self) -> u64 {
        self.blkio.get_u64("capacity").expect("capacity")
    }

    pub fn read_only(&self) -> bool {
        self.blkio.get_bool("read-only").expect("read-only")
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.queues.clear();
        self.blkio.unmap_mem_region(&self.region);
        self.blkio.free_mem_region(&self.region);
    }
}

impl ClientQueue {
    /// The queue's buffer as a byte slice.
    pub fn buf(&mut self) -> &mut [u8] {
        // SAFETY: buf/len describe this queue's disjoint part of a live,
        // mapped region (see Client::connect).
        unsafe { std::slice::from_raw_parts_mut(self.buf, self.len) }
    }

    /// Wait for `n` completions; returns their (user_data, ret).
    pub fn wait(&mut self, n: usize) -> Vec<(usize, i32)> {
        let mut out = Vec::with_capacity(n);
        let mut comps: Vec<MaybeUninit<Completion>> =
            (0..n).map(|_| MaybeUninit::uninit()).collect();
        while out.len() < n {
            let want = n - out.len();
            let mut timeout = std::time::Duration::from_secs(30);
            let got = self
                .q
                .do_io(&mut comps[..want], want, Some(&mut timeout), None)
                .expect("do_io");
            assert!(got > 0, "no completion within 30 s ({} of {n})", out.len());
            for c in &comps[..got] {
                // SAFETY: do_io initialised the first `got` entries.
                let c = unsafe { c.assume_init_ref() };
                out.push((c.user_data, c.ret));
            }
        }
        out
    }

    /// Submit a batch of reads/writes of `len` bytes each, at most
    /// BUF_PER_QUEUE / len at once, and wait for all. Write buffers are
    /// filled with their fill byte; read data is returned per request.
    pub fn batch(&mut self, reqs: &[(Op, u64)], len: usize) -> Vec<(i32, Vec<u8>)> {
        assert!(
            reqs.len() * len <= self.len,
            "batch too large for the buffer"
        );
        for (i, (op, off)) in reqs.iter().enumerate() {
            let p = i * len;
            match op {
                Op::Write(fill) => {
                    self.buf()[p..p + len].fill(*fill);
                    // SAFETY: p..p+len is inside this queue's buffer.
                    let ptr = unsafe { self.buf.add(p) };
                    self.q.write(*off, ptr, len, i, ReqFlags::empty());
                }
                Op::Read => {
                    self.buf()[p..p + len].fill(0xcc);
                    // SAFETY: as above.
                    let ptr = unsafe { self.buf.add(p) };
                    self.q.read(*off, ptr, len, i, ReqFlags::empty());
                }
            }
        }
        let done = self.wait(reqs.len());
        let mut out = vec![(i32::MIN, Vec::new()); reqs.len()];
        for (ud, ret) in done {
            let p = ud * len;
            let data = match reqs[ud].0 {
                Op::Read => self.buf()[p..p + len].to_vec(),
                Op::Write(_) => Vec::new(),
            };
            out[ud] = (ret, data);
        }
        out
    }

    pub fn write(&mut self, off: u64, data: &[u8]) -> i32 {
        self.buf()[..data.len()].copy_from_slice(data);
        self.q
            .write(off, self.buf, data.len(), 0, ReqFlags::empty());
        self.wait(1)[0].1
    }

    pub fn read(&mut self, off: u64, len: usize) -> (i32, Vec<u8>) {
        self.buf()[..len].fill(0xcc);
        self.q.read(off, self.buf, len, 0, ReqFlags::empty());
        let r = self.wait(1)[0].1;
        (r, self.buf()[..len].to_vec())
    }

    pub fn flush(&mut self) -> i32 {
        self.q.flush(0, ReqFlags::empty());
        self.wait(1)[0].1
    }

    pub fn discard(&mut self, off: u64, len: u64) -> i32 {
        self.q.discard(off, len, 0, ReqFlags::empty());
        self.wait(1)[0].1
    }

    pub fn write_zeroes(&mut self, off: u64, len: u64, unmap: bool) -> i32 {
        let flags = if unmap {
            ReqFlags::empty()
        } else {
            ReqFlags::NO_UNMAP
        };
        self.q.write_zeroes(off, len, 0, flags);
        self.wait(1)[0].1
    }
}
