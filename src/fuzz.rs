//! Fuzzing entry points: each takes arbitrary bytes and runs them through
//! the real code, not a copy of it. The cargo-fuzz targets in `fuzz/` call
//! these, and `tests/fuzz_regressions.rs` replays every crash input kept
//! (and the seed corpora) through the same functions, so a crash found once
//! stays fixed.
//!
//! - [`request`]: a split virtqueue laid out in guest memory built from
//!   the input, its chains popped by our [`SplitRing`] (and, to check it
//!   walks every chain as the reference does, by virtio-queue) and served
//!   by [`serve_chain`] (parse, execute, answer) on a null or mem disk;
//! - [`Daemon::vhost_user`]: raw vhost-user messages, with memfds and
//!   eventfds attached, sent to a real [`Server`] over its socket;
//! - [`Daemon::control`]: lines sent to the same server's control socket;
//! - [`scenario`]: the lab's scenario parser;
//! - [`config`]: the `serve --config` file parser.
//!
//! Nothing here panics on any input unless the code under test is wrong
//! (or, for the daemon, the server stops serving): a panic is a finding.

use std::cell::RefCell;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use crate::backend::server::{ServeError, Server};
use crate::device::config::{DiskArgs, DiskConfig};
use crate::device::execute::{serve_chain, Device, Outcome};
use crate::device::faults::FaultState;
use crate::device::storage;
use crate::virtq::guest_map::GuestMap;
use crate::virtq::split_ring::{self, RingLayout, SplitRing};

/// An input read front to back; past its end every read gives zeros (and
/// [`Input::bytes`] fewer bytes than asked for).
struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    fn new(data: &'a [u8]) -> Self {
        Input { data }
    }

    fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    fn bytes(&mut self, n: usize) -> &'a [u8] {
        let (head, tail) = self.data.split_at(n.min(self.data.len()));
        self.data = tail;
        head
    }

    fn array<const N: usize>(&mut self) -> [u8; N] {
        let mut a = [0u8; N];
        let b = self.bytes(N);
        a[..b.len()].copy_from_slice(b);
        a
    }

    fn u8(&mut self) -> u8 {
        self.array::<1>()[0]
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.array())
    }

    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.array())
    }

    fn rest(&mut self) -> &'a [u8] {
        self.bytes(self.data.len())
    }
}

/// Size of the first guest memory region of [`request`], at address 0.
pub(crate) const REQUEST_MEM_SIZE: usize = 0x1_0000;

/// The disk configurations [`request`] picks from with the low four bits
/// of its first byte: bit 0 read-only, bit 1 null (else mem), bit 2
/// 4096-byte blocks, bit 3 fault injection (fail every 3rd request and
/// sectors 8..16).
fn request_configs() -> &'static [DiskConfig] {
    static CONFIGS: OnceLock<Vec<DiskConfig>> = OnceLock::new();
    CONFIGS.get_or_init(|| {
        (0u8..16)
            .map(|v| {
                let mut a = vec![
                    "--socket",
                    "/nonexistent/fuzz.sock",
                    "--size",
                    "1M",
                    "--serial",
                    "fuzz-serial",
                ];
                a.extend_from_slice(&["--disk", if v & 2 != 0 { "null" } else { "mem" }]);
                if v & 1 != 0 {
                    a.push("--read-only");
                }
                if v & 4 != 0 {
                    a.extend_from_slice(&["--block-size", "4096"]);
                }
                if v & 8 != 0 {
                    a.extend_from_slice(&["--fail-every", "3", "--fail-range", "8..16"]);
                }
                let mut c = DiskArgs::parse_from(&a)
                    .expect("the fuzz disk options parse")
                    .to_configs()
                    .expect("the fuzz disk configurations are valid");
                c.remove(0)
            })
            .collect()
    })
}

/// Serve the chains of a split virtqueue laid out by the input.
///
/// Input: byte 0 picks the disk (see `request_configs`, low four bits),
/// write-back (bit 4), EVENT_IDX (bit 5), a second 4 KiB guest memory
/// region right after the first (bit 6, so buffers can cross regions) and
/// one far away at 1 MiB (bit 7); byte 1 the queue size (`1 << (b % 9)`).
/// The rest is the guest memory image from address 0 (at most
/// [`REQUEST_MEM_SIZE`] bytes): the descriptor table at 0, the avail ring
/// right after it and the used ring after that (4-byte aligned), and
/// whatever headers, data and indirect tables the descriptors point at.
///
/// Chains are popped and answered the way the queue worker does, at most
/// four queue sizes of them (served reads may rewrite the avail ring).
pub fn request(data: &[u8]) {
    let mut input = Input::new(data);
    let opts = input.u8();
    let qsize = 1u16 << (input.u8() % 9);
    let mut cfg = request_configs()[usize::from(opts & 0xf)].clone();
    let Ok(storage) = storage::open(&mut cfg) else {
        return;
    };
    let mem = request_memory(opts, input.rest());
    let event_idx = opts & 0x20 != 0;
    let layout = request_ring(qsize);
    let Some(mut q) = reference_queue(&layout, event_idx, &mem) else {
        return;
    };
    let mut ring = SplitRing::new(GuestMap::new(mem.clone()), layout, event_idx, 0, 0)
        .expect("a ring virtio-queue accepts, inside one region");
    let faults = (!cfg.faults.is_empty()).then(|| RefCell::new(FaultState::new(&cfg.faults)));
    let dev = Device {
        storage: storage.as_ref(),
        cfg: &cfg,
        capacity: cfg.size,
        writeback: opts & 0x10 != 0,
        faults: faults.as_ref(),
    };
    let mut segs = Vec::new();
    for _ in 0..4 * usize::from(qsize) {
        if !serve_next(&mut q, &mem, &mut ring, &dev, &mut segs) {
            break;
        }
    }
}

/// [`request`]'s guest memory: the first region holding `image`, and the
/// regions `opts` bits 6 and 7 add.
fn request_memory(opts: u8, image: &[u8]) -> Arc<GuestMemoryMmap> {
    let mut ranges = vec![(GuestAddress(0), REQUEST_MEM_SIZE)];
    if opts & 0x40 != 0 {
        ranges.push((GuestAddress(REQUEST_MEM_SIZE as u64), 0x1000));
    }
    if opts & 0x80 != 0 {
        ranges.push((GuestAddress(0x10_0000), 0x1000));
    }
    let mem = Arc::new(GuestMemoryMmap::from_ranges(&ranges).expect("fixed, valid ranges"));
    let image = &image[..image.len().min(REQUEST_MEM_SIZE)];
    mem.write_slice(image, GuestAddress(0))
        .expect("the image fits the first region");
    mem
}

/// [`request`]'s ring of `qsize` entries: the descriptor table at 0, the
/// avail ring after it, the used ring after that (4-byte aligned).
fn request_ring(qsize: u16) -> RingLayout {
    let q16 = u64::from(qsize);
    let avail = 16 * q16;
    RingLayout {
        desc: 0,
        avail,
        used: (avail + 6 + 2 * q16 + 3) & !3,
        size: qsize,
    }
}

/// virtio-queue's `Queue` over the same ring: the reference walk (`None`
/// when it finds the ring invalid).
fn reference_queue(layout: &RingLayout, event_idx: bool, mem: &GuestMemoryMmap) -> Option<Queue> {
    let mut q = Queue::new(layout.size).expect("a power of two up to 256");
    q.set_size(layout.size);
    q.try_set_desc_table_address(GuestAddress(layout.desc))
        .and_then(|()| q.try_set_avail_ring_address(GuestAddress(layout.avail)))
        .and_then(|()| q.try_set_used_ring_address(GuestAddress(layout.used)))
        .expect("aligned ring addresses");
    q.set_event_idx(event_idx);
    q.set_ready(true);
    q.is_valid(mem).then_some(q)
}

/// Pop the next chain with our ring and the reference, check they agree,
/// and serve and answer it: whether there may be more to pop.
fn serve_next(
    q: &mut Queue,
    mem: &GuestMemoryMmap,
    ring: &mut SplitRing,
    dev: &Device<'_>,
    segs: &mut Vec<split_ring::Segment>,
) -> bool {
    // The reference: virtio-queue's iterator and chain walk.
    let reference = match split_ring::reference_walk(q, mem) {
        Ok(r) => r,
        Err(_) => {
            assert!(
                ring.pending().is_err(),
                "virtio-queue refused the avail index, we did not"
            );
            return false;
        }
    };
    let pending = ring
        .pending()
        .expect("virtio-queue accepted the avail index");
    let Some((ref_head, ref_segs, ref_truncated)) = reference else {
        assert_eq!(pending, 0, "virtio-queue found nothing to pop");
        return false;
    };
    assert!(pending > 0, "virtio-queue popped a chain, we saw none");
    let popped = match ring.pop(segs) {
        Ok(p) => p,
        Err(_) => {
            // A head beyond the table: the worker marks the ring broken.
            assert!(ref_head >= q.size() && ref_segs.is_empty());
            return false;
        }
    };
    assert_eq!(popped.head, ref_head);
    assert_eq!(*segs, ref_segs, "the chain at head {ref_head}");
    assert_eq!(popped.truncated, ref_truncated && !ref_segs.is_empty());
    let used_len = match serve_chain(dev, segs, popped.truncated, ring.map()) {
        Outcome::Completed { used_len, .. } => {
            // The device never says it wrote more than the driver
            // offered it (virtio 1.2, 2.7.8.2).
            let writable: u64 = segs
                .iter()
                .filter(|s| s.write)
                .map(|s| u64::from(s.len))
                .sum();
            assert!(
                u64::from(used_len) <= writable,
                "used length {used_len} > {writable} writable bytes"
            );
            used_len
        }
        Outcome::Dropped(_) => 0,
    };
    ring.add_used(popped.head, used_len);
    let _ = ring.needs_notification();
    true
}

/// Parse the input as scenario text (UTF-8 only; other inputs are
/// skipped, as the lab reads scenarios with `read_to_string`).
pub fn scenario(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = crate::lab::scenario::parse(text, "fuzz.scenario", "fuzz");
    }
}

/// Parse the input as a `serve --config` file (UTF-8 only, as the file is
/// read with `read_to_string`).
pub fn config(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = crate::device::config_file::parse_config_file(text, Path::new("fuzz.toml"));
    }
}

/// How long the daemon may take to answer and close a connection before
/// the harness calls it stuck (generous: the point is that it ends).
const DAEMON_PATIENCE: Duration = Duration::from_secs(120);

/// The `kick` pseudo-message of [`Daemon::vhost_user`]: write every
/// eventfd sent so far instead of sending a message.
pub(crate) const VHOST_USER_KICK: u8 = 0xff;

/// A real `blklab serve` server in this process (one 1 MiB mem disk with
/// two queues of 64, and a control socket) in a private directory, for the
/// socket-level targets.
pub struct Daemon {
    server: Option<Server>,
    socket: PathBuf,
    control: PathBuf,
    _dir: tempfile::TempDir,
}

impl Daemon {
    /// Start the server.
    pub fn start() -> Result<Daemon, ServeError> {
        // The daemon binary's runtime ignores SIGPIPE (Rust's `main` does);
        // a fuzz binary's C `main` does not, so do the same here.
        // SAFETY: setting a signal's disposition to SIG_IGN has no
        // preconditions and runs no handler.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
        let dir = tempfile::Builder::new()
            .prefix("blklab-fuzz-")
            .tempdir()
            .map_err(|source| ServeError::Bind {
                path: std::env::temp_dir(),
                source,
            })?;
        let socket = dir.path().join("vd.sock");
        let control = dir.path().join("control.sock");
        let sock = socket.to_string_lossy().into_owned();
        let cfg = DiskArgs::parse_from(&[
            "--socket",
            &sock,
            "--disk",
            "mem",
            "--size",
            "1M",
            "--num-queues",
            "2",
            "--queue-size",
            "64",
        ])
        .expect("the fuzz daemon's options parse")
        .to_configs()
        .expect("the fuzz daemon's configuration is valid");
        let server = Server::start_with_control(cfg, Some(&control))?;
        Ok(Daemon {
            server: Some(server),
            socket,
            control,
            _dir: dir,
        })
    }

    /// The disk's vhost-user socket (for tests that drive it further).
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The control socket (to read the daemon's statistics).
    pub fn control_socket(&self) -> &Path {
        &self.control
    }

    /// Send a sequence of raw vhost-user messages on one connection, then
    /// close it and wait for the daemon to close its end.
    ///
    /// Input, repeated: a request code byte ([`VHOST_USER_KICK`]: write
    /// every eventfd sent so far, nothing else follows); a flags byte (bit
    /// 7: a raw u32 header flags field follows, else version 1 plus
    /// NEED_REPLY if bit 0; bit 6: a raw u32 size field follows the body,
    /// else the body's length); a byte `n`: `n % 9` attached fds, each a
    /// kind byte (0: an eventfd; `k`: a memfd of `k` 4 KiB pages, then a
    /// u16 length and that many bytes of its contents); a u16 body length
    /// and the body. Each message goes out in one `sendmsg` with its fds.
    ///
    /// Panics if the daemon does not close the connection within
    /// `DAEMON_PATIENCE` (stuck) or cannot be connected to (stopped
    /// serving).
    pub fn vhost_user(&self, data: &[u8]) {
        let stream = UnixStream::connect(&self.socket)
            .unwrap_or_else(|e| panic!("the daemon stopped accepting connections: {e}"));
        let mut input = Input::new(data);
        let mut eventfds: Vec<EventFd> = Vec::new();
        while !input.is_empty() {
            let code = input.u8();
            if code == VHOST_USER_KICK {
                for e in &eventfds {
                    let _ = e.write(1);
                }
                continue;
            }
            let fb = input.u8();
            let flags = if fb & 0x80 != 0 {
                input.u32()
            } else {
                0x1 | if fb & 1 != 0 { 0x8 } else { 0 }
            };
            let nfds = usize::from(input.u8() % 9);
            // Our copies of the fds stay open until the message is sent.
            let mut files: Vec<File> = Vec::new();
            for _ in 0..nfds {
                let kind = input.u8();
                if kind == 0 {
                    let e = EventFd::new(libc::EFD_NONBLOCK | libc::EFD_CLOEXEC).expect("eventfd");
                    // SAFETY: dup returns a new fd that only this File owns
                    // (checked for failure first).
                    let dup = unsafe { libc::dup(e.as_raw_fd()) };
                    assert!(dup >= 0, "dup: {}", io::Error::last_os_error());
                    // SAFETY: `dup` is a fresh, owned, open fd.
                    files.push(unsafe { File::from_raw_fd(dup) });
                    eventfds.push(e);
                } else {
                    let f = memfd(u64::from(kind) * 4096);
                    let fill_len = usize::from(input.u16());
                    let fill = input.bytes(fill_len.min(usize::from(kind) * 4096));
                    let _ = (&f).write_all(fill);
                    files.push(f);
                }
            }
            let body_len = usize::from(input.u16());
            let body = input.bytes(body_len);
            let size = if fb & 0x40 != 0 {
                input.u32()
            } else {
                body.len() as u32
            };
            let mut hdr = [0u8; 12];
            hdr[0..4].copy_from_slice(&u32::from(code).to_le_bytes());
            hdr[4..8].copy_from_slice(&flags.to_le_bytes());
            hdr[8..12].copy_from_slice(&size.to_le_bytes());
            let fds: Vec<RawFd> = files.iter().map(AsRawFd::as_raw_fd).collect();
            if stream.send_with_fds(&[&hdr[..], body], &fds).is_err() {
                // The daemon closed the connection (a refused message).
                break;
            }
            drain_nonblocking(&stream);
        }
        let _ = stream.shutdown(std::net::Shutdown::Write);
        read_to_eof(&stream, "vhost-user");
    }

    /// Send the input to the control socket on one connection, close our
    /// end and read the answers: each must be one JSON value per line.
    pub fn control(&self, data: &[u8]) {
        let mut stream = UnixStream::connect(&self.control)
            .unwrap_or_else(|e| panic!("the control socket stopped accepting: {e}"));
        // The server may close early (a line that is not UTF-8): writes
        // may then fail, which is fine.
        let _ = stream.write_all(data);
        let _ = stream.shutdown(std::net::Shutdown::Write);
        let answers = read_to_eof(&stream, "control");
        for line in answers.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            if let Err(e) = serde_json::from_slice::<serde_json::Value>(line) {
                panic!(
                    "control answer is not JSON ({e}): {:?}",
                    String::from_utf8_lossy(line)
                );
            }
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            s.shutdown();
        }
    }
}

/// A memfd of `size` bytes.
fn memfd(size: u64) -> File {
    // SAFETY: the name is a NUL-terminated string; memfd_create returns a
    // new fd or -1 (checked).
    let fd = unsafe { libc::memfd_create(c"blklab-fuzz".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create: {}", io::Error::last_os_error());
    // SAFETY: `fd` is a fresh, owned, open fd.
    let f = unsafe { File::from_raw_fd(fd) };
    f.set_len(size).expect("memfd set_len");
    f
}

/// Read whatever the daemon has answered so far, without waiting.
fn drain_nonblocking(stream: &UnixStream) {
    let mut buf = [0u8; 4096];
    loop {
        // SAFETY: `buf` is valid for writes of its length; MSG_DONTWAIT
        // makes this one non-blocking receive.
        let n = unsafe {
            libc::recv(
                stream.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n <= 0 {
            return;
        }
    }
}

/// Read until the daemon closes the connection; panics if it does not
/// within `DAEMON_PATIENCE`.
fn read_to_eof(mut stream: &UnixStream, what: &str) -> Vec<u8> {
    stream
        .set_read_timeout(Some(DAEMON_PATIENCE))
        .expect("set_read_timeout");
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                panic!("the daemon did not close the {what} connection within {DAEMON_PATIENCE:?}")
            }
            // ECONNRESET and the like: closed.
            Err(_) => return out,
        }
    }
}
