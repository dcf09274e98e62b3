//! A vhost-user-blk client on libblkio for tests and benches: the
//! library's [`blklab::bench::client`] connection (the one `blklab bench`
//! drives) with request helpers that wait for their completions.
#![allow(dead_code)]

use std::mem::MaybeUninit;
use std::ops::{Deref, DerefMut};
use std::path::Path;

use blkio::{Blkio, Completion, ReqFlags};
use blklab::bench::client::{Connection, Queue, QueueSetup};
use blklab::bench::BenchError;

/// Bytes of request buffers per queue.
pub(crate) const BUF_PER_QUEUE: usize = 1 << 20;

/// A connected disk with its queues (dropped before the device).
pub(crate) struct Client {
    pub queues: Vec<ClientQueue>,
    pub blkio: Blkio,
}

/// One queue and its [`BUF_PER_QUEUE`] bytes of buffers (the library's
/// [`Queue`], which it dereferences to: `q.q` is the `Blkioq`).
pub(crate) struct ClientQueue(Queue);

impl Deref for ClientQueue {
    type Target = Queue;
    fn deref(&self) -> &Queue {
        &self.0
    }
}

impl DerefMut for ClientQueue {
    fn deref_mut(&mut self) -> &mut Queue {
        &mut self.0
    }
}

/// A request to submit: (kind, byte offset, length, fill byte for writes).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Op {
    Read,
    Write(u8),
}

impl Client {
    /// Connect to `socket` with `num_queues` queues of 128 entries.
    pub(crate) fn connect(socket: &Path, num_queues: usize) -> Result<Client, BenchError> {
        Self::connect_opts(socket, num_queues, false, false)
    }

    /// Connect to a read-only disk (libblkio refuses to open a read-only
    /// device read-write).
    pub(crate) fn connect_read_only(
        socket: &Path,
        num_queues: usize,
    ) -> Result<Client, BenchError> {
        Self::connect_opts(socket, num_queues, true, false)
    }

    /// Connect with libblkio poll queues: `do_io` busy-waits for
    /// completions instead of sleeping on the completion eventfd.
    pub(crate) fn connect_polling(socket: &Path, num_queues: usize) -> Result<Client, BenchError> {
        Self::connect_opts(socket, num_queues, false, true)
    }

    fn connect_opts(
        socket: &Path,
        num_queues: usize,
        read_only: bool,
        poll: bool,
    ) -> Result<Client, BenchError> {
        let setup = QueueSetup {
            queues: num_queues,
            queue_size: 128,
            poll,
            buf_per_queue: BUF_PER_QUEUE,
        };
        let c = Connection::open(socket, read_only, setup)?;
        Ok(Client {
            queues: c.queues.into_iter().map(ClientQueue).collect(),
            blkio: c.blkio,
        })
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.blkio.get_u64("capacity").expect("capacity")
    }

    pub(crate) fn read_only(&self) -> bool {
        self.blkio.get_bool("read-only").expect("read-only")
    }
}

impl ClientQueue {
    /// Wait for `n` completions; returns their (user_data, ret).
    pub(crate) fn wait(&mut self, n: usize) -> Vec<(usize, i32)> {
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
    pub(crate) fn batch(&mut self, reqs: &[(Op, u64)], len: usize) -> Vec<(i32, Vec<u8>)> {
        assert!(
            reqs.len() * len <= self.len(),
            "batch too large for the buffer"
        );
        for (i, (op, off)) in reqs.iter().enumerate() {
            let p = i * len;
            match op {
                Op::Write(fill) => {
                    self.buf()[p..p + len].fill(*fill);
                    let ptr = self.ptr(p, len);
                    self.q.write(*off, ptr, len, i, ReqFlags::empty());
                }
                Op::Read => {
                    self.buf()[p..p + len].fill(0xcc);
                    let ptr = self.ptr(p, len);
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

    pub(crate) fn write(&mut self, off: u64, data: &[u8]) -> i32 {
        self.buf()[..data.len()].copy_from_slice(data);
        let ptr = self.ptr(0, data.len());
        self.q.write(off, ptr, data.len(), 0, ReqFlags::empty());
        self.wait(1)[0].1
    }

    pub(crate) fn read(&mut self, off: u64, len: usize) -> (i32, Vec<u8>) {
        self.buf()[..len].fill(0xcc);
        let ptr = self.ptr(0, len);
        self.q.read(off, ptr, len, 0, ReqFlags::empty());
        let r = self.wait(1)[0].1;
        (r, self.buf()[..len].to_vec())
    }

    pub(crate) fn flush(&mut self) -> i32 {
        self.q.flush(0, ReqFlags::empty());
        self.wait(1)[0].1
    }

    pub(crate) fn discard(&mut self, off: u64, len: u64) -> i32 {
        self.q.discard(off, len, 0, ReqFlags::empty());
        self.wait(1)[0].1
    }

    pub(crate) fn write_zeroes(&mut self, off: u64, len: u64, unmap: bool) -> i32 {
        let flags = if unmap {
            ReqFlags::empty()
        } else {
            ReqFlags::NO_UNMAP
        };
        self.q.write_zeroes(off, len, 0, flags);
        self.wait(1)[0].1
    }
}
