//! A hand-written vhost-user frontend driving the real `blklab serve` daemon
//! over a real Unix socket, for the things libblkio and QEMU never send:
//! malformed descriptor chains, out-of-range addresses, bogus avail indices,
//! kicks on disabled rings, disconnects, …
//!
//! The harness lays out split virtqueues by hand in a memfd-backed "guest
//! memory" that is shared with the backend through `VHOST_USER_ADD_MEM_REG`
//! (or `SET_MEM_TABLE`), and speaks the handshake the way QEMU 7.2 does.
//!
//! Setting `RAW_FRONTEND_BACKEND=qsd` runs the same tests against
//! `qemu-storage-daemon`'s vhost-user-blk export instead (the reference
//! implementation), which is handy to tell harness bugs from daemon bugs.
//! Some negative tests are stricter than QEMU, so not all of them pass there.
//! The tests of blklab's own behaviour (its counters and log over its
//! control socket, refusals QEMU does not make) cannot run there: they
//! fail at once with "not run: …", never passing without having run, so
//! the harness's failure count includes them.

mod common;

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

use blklab::bench::versus_qsd::qsd_command;
use vhost::vhost_user::message::{VhostUserConfigFlags, VhostUserHeaderFlag};
use vhost::vhost_user::{Frontend, VhostUserFrontend, VhostUserProtocolFeatures};
use vhost::{VhostBackend, VhostUserDirtyLogRegion, VhostUserMemoryRegionInfo, VringConfigData};
use vm_memory::{
    Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion,
};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

// ---------------------------------------------------------------------------
// Constants
// ---------------------------------------------------------------------------

const DISK_SIZE: u64 = 64 << 20;
const SECTOR_SIZE: u64 = 512;
const CAPACITY: u64 = DISK_SIZE / SECTOR_SIZE;
const NUM_QUEUES: usize = 2;
const QSIZE: u16 = 64;

/// Size of the guest memory (one region at guest physical address 0).
const MEM_SIZE: u64 = 4 << 20;
/// Per-queue ring area: queue q lives at `RING_BASE + q * RING_STRIDE`.
const RING_BASE: u64 = 0x1000;
const RING_STRIDE: u64 = 0x4000;
/// Data buffers (headers, payloads, status bytes, indirect tables) are bump
/// allocated from here to the end of guest memory.
const BUF_BASE: u64 = 0x10_0000;
/// An address far outside guest memory.
const OUTSIDE: u64 = 0x1_0000_0000;

/// How long to wait for a completion that must come (generous: the point
/// is that it comes, on however loaded a machine).
const WAIT: Duration = common::PATIENCE;
/// How long to wait for the backend's reply to a vhost-user message.
const MSG_TIMEOUT: Duration = common::PATIENCE;
/// How long to watch for something that must *not* happen (a request
/// processed on a disabled ring, …). Such a wait can only fail when the
/// bad thing happens; where a later request can show the outcome instead
/// (see [`Conn::serving_after`]), the tests use that.
const MAYBE_WAIT: Duration = Duration::from_millis(500);

/// The disk every blklab test here serves.
const BLKLAB_DISK: [&str; 8] = [
    "--disk",
    "mem",
    "--size",
    "64M",
    "--num-queues",
    "2",
    "--queue-size",
    "64",
];

// virtio feature bits
const VIRTIO_BLK_F_SEG_MAX: u64 = 1 << 2;
const VIRTIO_BLK_F_RO: u64 = 1 << 5;
const VIRTIO_BLK_F_FLUSH: u64 = 1 << 9;
const VIRTIO_BLK_F_MQ: u64 = 1 << 12;
const VIRTIO_BLK_F_DISCARD: u64 = 1 << 13;
const VIRTIO_BLK_F_WRITE_ZEROES: u64 = 1 << 14;
const VIRTIO_RING_F_INDIRECT_DESC: u64 = 1 << 28;
const VIRTIO_RING_F_EVENT_IDX: u64 = 1 << 29;
const VHOST_USER_F_PROTOCOL_FEATURES: u64 = 1 << 30;
/// VHOST_F_LOG_ALL: the frontend migrates the guest; the device logs the
/// pages it writes.
const VHOST_F_LOG_ALL: u64 = 1 << 26;
const VIRTIO_F_VERSION_1: u64 = 1 << 32;
/// Device-specific feature bits (0..=23) plus the ring/transport bits this
/// frontend implements. Never packed rings, IOMMU, in-order, notification data.
const DRIVER_FEATURES: u64 = 0x00ff_ffff
    | VIRTIO_RING_F_INDIRECT_DESC
    | VIRTIO_RING_F_EVENT_IDX
    | VHOST_USER_F_PROTOCOL_FEATURES
    | VIRTIO_F_VERSION_1;

// split-ring descriptor flags
const VRING_DESC_F_NEXT: u16 = 1;
const VRING_DESC_F_WRITE: u16 = 2;
const VRING_DESC_F_INDIRECT: u16 = 4;

// virtio-blk request types and status values
const VIRTIO_BLK_T_IN: u32 = 0;
const VIRTIO_BLK_T_OUT: u32 = 1;
const VIRTIO_BLK_T_FLUSH: u32 = 4;
const VIRTIO_BLK_T_GET_ID: u32 = 8;
const VIRTIO_BLK_T_DISCARD: u32 = 11;
const VIRTIO_BLK_T_WRITE_ZEROES: u32 = 13;
const VIRTIO_BLK_S_OK: u8 = 0;
const VIRTIO_BLK_S_IOERR: u8 = 1;
const VIRTIO_BLK_S_UNSUPP: u8 = 2;
/// Pre-filled into every status byte so "never written" is visible.
const STATUS_UNTOUCHED: u8 = 0xff;

const VIRTIO_BLK_CONFIG_SIZE: u32 = 60;

// ---------------------------------------------------------------------------
// The backend under test (the one function to swap)
// ---------------------------------------------------------------------------

/// The vhost-user-blk backend process under test.
enum Server {
    Blklab(common::Daemon),
    Qsd {
        daemon: blklab::bench::daemon::Daemon,
        _dir: tempfile::TempDir,
        socket: PathBuf,
    },
}

impl Server {
    /// Start the backend: `blklab serve` with a 64 MiB memory disk, 2 queues
    /// of 64 entries (or qemu-storage-daemon when `RAW_FRONTEND_BACKEND=qsd`).
    fn spawn(read_only: bool) -> Server {
        if std::env::var("RAW_FRONTEND_BACKEND").as_deref() == Ok("qsd") {
            return Self::spawn_qsd(read_only);
        }
        let mut args = BLKLAB_DISK.to_vec();
        if read_only {
            args.push("--read-only");
        }
        Server::Blklab(common::Daemon::spawn(&args, 1))
    }

    fn spawn_qsd(read_only: bool) -> Server {
        let dir = tempfile::tempdir().expect("tempdir");
        let img = dir.path().join("disk.img");
        File::create(&img)
            .and_then(|f| f.set_len(DISK_SIZE))
            .expect("create disk image");
        let socket = dir.path().join("qsd.sock");
        let daemon = blklab::bench::daemon::Daemon::start(
            "qemu-storage-daemon",
            &mut qsd_command(
                Path::new("qemu-storage-daemon"),
                &format!("driver=file,filename={},node-name=n0", img.display()),
                &socket,
                !read_only,
                NUM_QUEUES,
            ),
            std::slice::from_ref(&socket),
            common::PATIENCE,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        Server::Qsd {
            daemon,
            _dir: dir,
            socket,
        }
    }

    fn socket(&self) -> &Path {
        match self {
            Server::Blklab(d) => &d.socket,
            Server::Qsd { socket, .. } => socket,
        }
    }

    fn alive(&mut self) -> bool {
        match self {
            Server::Blklab(d) => d.alive(),
            Server::Qsd { daemon, .. } => daemon.alive(),
        }
    }

    /// Connect a new frontend and run the full handshake.
    fn connect(&self) -> Conn {
        Conn::connect(self.socket(), &Setup::default())
    }

    /// End of a test: the daemon must still be alive; then stop it.
    fn finish(mut self, conn: Conn) {
        assert!(self.alive(), "backend died");
        drop(conn);
        if let Server::Blklab(d) = &mut self {
            let st = d.terminate();
            eprintln!("blklab serve exited with {st}");
        }
    }
}

// ---------------------------------------------------------------------------
// Guest memory
// ---------------------------------------------------------------------------

/// Guest RAM: a memfd of `MEM_SIZE` bytes at guest physical address 0, mapped
/// shared here and handed to the backend by fd.
fn new_guest_memory() -> GuestMemoryMmap {
    // SAFETY: memfd_create(2) with a valid NUL-terminated name and flags; it
    // touches no memory of ours besides reading the name.
    // MFD_ALLOW_SEALING, as QEMU's memory-backend-memfd creates its memfds.
    let fd = unsafe {
        libc::memfd_create(
            c"raw-frontend-guest".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: `fd` was just returned by memfd_create, is valid and owned by
    // nobody else; the File takes sole ownership.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(MEM_SIZE).expect("ftruncate memfd");
    GuestMemoryMmap::from_ranges_with_files([(
        GuestAddress(0),
        MEM_SIZE as usize,
        Some(FileOffset::new(file, 0)),
    )])
    .expect("mmap guest memory")
}

// ---------------------------------------------------------------------------
// Connection / handshake
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq)]
enum MemMode {
    /// `VHOST_USER_ADD_MEM_REG` (what QEMU 7.2 uses with CONFIGURE_MEM_SLOTS).
    AddMemReg,
    /// The classic `VHOST_USER_SET_MEM_TABLE`.
    SetMemTable,
}

struct Setup {
    mem: MemMode,
    /// Send `SET_VRING_ENABLE(1)` for every queue at the end of the handshake.
    enable: bool,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            mem: MemMode::AddMemReg,
            enable: true,
        }
    }
}

/// One split virtqueue laid out by the frontend.
struct Vq {
    desc: u64,
    avail: u64,
    used: u64,
    kick: EventFd,
    call: EventFd,
    /// Driver-side shadow of avail->idx.
    avail_idx: u16,
    /// Used entries consumed so far.
    last_used: u16,
    /// Next descriptor table slot to hand out (rotates to exercise wrapping).
    next_desc: u16,
}

/// A connected, initialised frontend.
struct Conn {
    fe: Frontend,
    mem: GuestMemoryMmap,
    /// Frontend (our) virtual address of guest physical address 0.
    hva_base: u64,
    features: u64,
    protocol: VhostUserProtocolFeatures,
    queues: Vec<Vq>,
    epoll: Epoll,
    next_buf: u64,
    /// Buffers are allocated below this (rings moved to the end of region
    /// 0 lower it).
    buf_end: u64,
    /// Seed for write+read-back checks, so successive checks differ.
    seq: u64,
}

/// One descriptor as the frontend wants it written: (guest address, length,
/// device-writable). `NEXT` flags and `next` fields are filled in for chains.
#[derive(Clone, Copy, Debug)]
struct Seg {
    addr: u64,
    len: u32,
    write: bool,
}

fn r(addr: u64, len: u32) -> Seg {
    Seg {
        addr,
        len,
        write: false,
    }
}

fn w(addr: u64, len: u32) -> Seg {
    Seg {
        addr,
        len,
        write: true,
    }
}

/// Result of one completed virtio-blk request.
#[derive(Debug)]
struct Done {
    status: u8,
    used_len: u32,
    data: Vec<u8>,
}

/// Direction and size of a request's data.
enum Data<'a> {
    None,
    Out(&'a [u8]),
    In(usize),
}

impl Conn {
    fn connect(socket: &Path, setup: &Setup) -> Conn {
        let mut conn = Self::handshake(socket, setup.mem, new_guest_memory());
        for q in 0..NUM_QUEUES {
            conn.setup_queue(q);
        }
        if setup.enable {
            for q in 0..NUM_QUEUES {
                conn.enable(q);
            }
        }
        conn
    }

    /// Connect to `socket` and negotiate as QEMU does, guest memory `mem`
    /// given by `mem_mode`; no queue set up yet.
    fn handshake(socket: &Path, mem_mode: MemMode, mem: GuestMemoryMmap) -> Conn {
        let sock = connect_socket(socket);
        // A backend that stops answering fails the test instead of hanging it.
        sock.set_read_timeout(Some(MSG_TIMEOUT)).unwrap();
        sock.set_write_timeout(Some(MSG_TIMEOUT)).unwrap();
        let mut fe = Frontend::from_stream(sock, NUM_QUEUES as u64);

        // GET_FEATURES
        let offered = fe.get_features().expect("GET_FEATURES");
        assert_ne!(offered & VIRTIO_F_VERSION_1, 0, "VERSION_1 not offered");
        assert_ne!(
            offered & VHOST_USER_F_PROTOCOL_FEATURES,
            0,
            "PROTOCOL_FEATURES not offered"
        );
        // GET_PROTOCOL_FEATURES / SET_PROTOCOL_FEATURES
        let pf = fe.get_protocol_features().expect("GET_PROTOCOL_FEATURES");
        let want = VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::CONFIG
            | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
            | VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::LOG_SHMFD;
        let protocol = pf & want;
        fe.set_protocol_features(protocol)
            .expect("SET_PROTOCOL_FEATURES");
        // GET_QUEUE_NUM
        if protocol.contains(VhostUserProtocolFeatures::MQ) {
            let n = fe.get_queue_num().expect("GET_QUEUE_NUM");
            assert!(n >= NUM_QUEUES as u64, "GET_QUEUE_NUM = {n}");
        }
        if protocol.contains(VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS) {
            let slots = fe.get_max_mem_slots().expect("GET_MAX_MEM_SLOTS");
            assert!(slots >= 1, "GET_MAX_MEM_SLOTS = {slots}");
        }
        // SET_OWNER (from here on QEMU asks for an ack of every message that
        // has no reply of its own)
        let need_reply = protocol.contains(VhostUserProtocolFeatures::REPLY_ACK);
        if need_reply {
            fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
        }
        fe.set_owner().expect("SET_OWNER");
        // SET_FEATURES
        let features = offered & DRIVER_FEATURES;
        eprintln!("features: offered {offered:#x}, acked {features:#x}; protocol: offered {pf:?}, acked {protocol:?}");
        fe.set_features(features).expect("SET_FEATURES");

        // Memory
        let region = mem.iter().next().expect("one region");
        let info = VhostUserMemoryRegionInfo::from_guest_region(region).expect("region info");
        let hva_base = info.userspace_addr - region.start_addr().0;
        match mem_mode {
            MemMode::AddMemReg => {
                assert!(
                    protocol.contains(VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS),
                    "backend does not offer CONFIGURE_MEM_SLOTS"
                );
                fe.add_mem_region(&info).expect("ADD_MEM_REG");
            }
            MemMode::SetMemTable => {
                fe.set_mem_table(&[info]).expect("SET_MEM_TABLE");
            }
        }

        let epoll = Epoll::new().expect("epoll");
        Conn {
            fe,
            mem,
            hva_base,
            features,
            protocol,
            queues: Vec::new(),
            epoll,
            next_buf: BUF_BASE,
            buf_end: MEM_SIZE,
            seq: 0,
        }
    }

    /// Connect to `socket` again over this connection's guest memory and
    /// rings, as QEMU does when its backend went away and a new one
    /// listens: each ring restarts from the used index it finds in guest
    /// memory (`virtio_queue_restore_last_avail_idx`), with its kick
    /// pending (QEMU's new host notifier starts signalled). What the
    /// driver made available past that index is served by the new backend.
    fn resume(self, socket: &Path) -> Conn {
        let Conn {
            mem,
            queues,
            next_buf,
            buf_end,
            seq,
            ..
        } = self;
        let mut c = Self::handshake(socket, MemMode::AddMemReg, mem);
        (c.next_buf, c.buf_end, c.seq) = (next_buf, buf_end, seq);
        for (q, vq) in queues.into_iter().enumerate() {
            let base: u16 = c
                .mem
                .load(GuestAddress(vq.used + 2), Ordering::Acquire)
                .unwrap();
            c.epoll
                .ctl(
                    ControlOperation::Add,
                    vq.call.as_raw_fd(),
                    EpollEvent::new(EventSet::IN, q as u64),
                )
                .expect("epoll add");
            let cfg = VringConfigData {
                queue_max_size: QSIZE,
                queue_size: QSIZE,
                flags: 0,
                desc_table_addr: c.hva_base + vq.desc,
                used_ring_addr: c.hva_base + vq.used,
                avail_ring_addr: c.hva_base + vq.avail,
                log_addr: None,
            };
            c.fe.set_vring_num(q, QSIZE).expect("SET_VRING_NUM");
            c.fe.set_vring_base(q, u16::from_le(base))
                .expect("SET_VRING_BASE");
            c.fe.set_vring_addr(q, &cfg).expect("SET_VRING_ADDR");
            c.fe.set_vring_call(q, &vq.call).expect("SET_VRING_CALL");
            vq.kick.write(1).expect("kick");
            c.fe.set_vring_kick(q, &vq.kick).expect("SET_VRING_KICK");
            c.queues.push(vq);
            c.enable(q);
        }
        c
    }

    fn setup_queue(&mut self, q: usize) {
        let base = RING_BASE + q as u64 * RING_STRIDE;
        let vq = Vq {
            desc: base,
            avail: base + 0x1000,
            used: base + 0x2000,
            kick: EventFd::new(EFD_NONBLOCK).expect("eventfd"),
            call: EventFd::new(EFD_NONBLOCK).expect("eventfd"),
            avail_idx: 0,
            last_used: 0,
            next_desc: 0,
        };
        // Clean rings.
        self.mem
            .write_slice(&[0u8; RING_STRIDE as usize], GuestAddress(base))
            .unwrap();
        self.epoll
            .ctl(
                ControlOperation::Add,
                vq.call.as_raw_fd(),
                EpollEvent::new(EventSet::IN, q as u64),
            )
            .expect("epoll add");

        self.fe.set_vring_num(q, QSIZE).expect("SET_VRING_NUM");
        self.fe.set_vring_base(q, 0).expect("SET_VRING_BASE");
        let cfg = VringConfigData {
            queue_max_size: QSIZE,
            queue_size: QSIZE,
            flags: 0,
            desc_table_addr: self.hva_base + vq.desc,
            used_ring_addr: self.hva_base + vq.used,
            avail_ring_addr: self.hva_base + vq.avail,
            log_addr: None,
        };
        self.fe.set_vring_addr(q, &cfg).expect("SET_VRING_ADDR");
        self.fe.set_vring_call(q, &vq.call).expect("SET_VRING_CALL");
        self.fe.set_vring_kick(q, &vq.kick).expect("SET_VRING_KICK");
        self.queues.push(vq);
    }

    fn enable(&mut self, q: usize) {
        self.fe.set_vring_enable(q, true).expect("SET_VRING_ENABLE");
    }

    /// Stop queue `q` (GET_VRING_BASE), lay its rings out afresh at the
    /// guest addresses `desc`, `avail` and `used` (in any region), and
    /// start it again from index 0, as a driver reset does.
    fn relocate_ring(&mut self, q: usize, desc: u64, avail: u64, used: u64) {
        self.fe.get_vring_base(q).expect("GET_VRING_BASE");
        let n = u64::from(QSIZE);
        for (at, len) in [(desc, 16 * n), (avail, 6 + 2 * n), (used, 6 + 8 * n)] {
            // A part laid out past guest memory (to test that the backend
            // refuses it) is zeroed as far as memory goes.
            let _ = self.mem.write(&vec![0u8; len as usize], GuestAddress(at));
        }
        let hva = |at: u64| self.mem.get_host_address(GuestAddress(at)).unwrap() as u64;
        let cfg = VringConfigData {
            queue_max_size: QSIZE,
            queue_size: QSIZE,
            flags: 0,
            desc_table_addr: hva(desc),
            used_ring_addr: hva(used),
            avail_ring_addr: hva(avail),
            log_addr: None,
        };
        self.fe.set_vring_num(q, QSIZE).expect("SET_VRING_NUM");
        self.fe.set_vring_base(q, 0).expect("SET_VRING_BASE");
        self.fe.set_vring_addr(q, &cfg).expect("SET_VRING_ADDR");
        let vq = &mut self.queues[q];
        vq.desc = desc;
        vq.avail = avail;
        vq.used = used;
        vq.avail_idx = 0;
        vq.last_used = 0;
        vq.next_desc = 0;
        self.fe
            .set_vring_kick(q, &self.queues[q].kick)
            .expect("SET_VRING_KICK");
        self.enable(q);
        for at in [desc, avail, used] {
            if (BUF_BASE..MEM_SIZE).contains(&at) {
                self.buf_end = self.buf_end.min(at);
            }
        }
    }

    /// Give the backend a second memory region: a new memfd of `size`
    /// bytes at guest address `at` (ADD_MEM_REG); the frontend's view of
    /// guest memory includes it from now on.
    fn add_region(&mut self, at: u64, size: u64) {
        // SAFETY: memfd_create(2) with a valid NUL-terminated name.
        let fd = unsafe {
            libc::memfd_create(
                c"raw-frontend-extra".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        assert!(fd >= 0);
        // SAFETY: a fresh fd nobody else owns.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(size).unwrap();
        let region: vm_memory::GuestRegionMmap = vm_memory::GuestRegionMmap::from_range(
            GuestAddress(at),
            size as usize,
            Some(FileOffset::new(file, 0)),
        )
        .unwrap();
        let info = VhostUserMemoryRegionInfo::from_guest_region(&region).expect("region info");
        self.fe.add_mem_region(&info).expect("ADD_MEM_REG");
        self.mem = self.mem.insert_region(std::sync::Arc::new(region)).unwrap();
    }

    /// Take the region at guest address `at` away from the backend
    /// (REM_MEM_REG); the frontend keeps its mapping.
    fn remove_region(&mut self, at: u64) {
        let region = self
            .mem
            .find_region(GuestAddress(at))
            .expect("a region there");
        let info = VhostUserMemoryRegionInfo::from_guest_region(region).expect("region info");
        self.fe.remove_mem_region(&info).expect("REM_MEM_REG");
    }

    fn has(&self, feature: u64) -> bool {
        self.features & feature != 0
    }

    /// GET_CONFIG of the whole virtio-blk config space.
    fn config(&mut self) -> Vec<u8> {
        assert!(self.protocol.contains(VhostUserProtocolFeatures::CONFIG));
        // GET_CONFIG has a reply of its own: no REPLY_ACK.
        self.fe.set_hdr_flags(VhostUserHeaderFlag::empty());
        let (_, payload) = self
            .fe
            .get_config(
                0,
                VIRTIO_BLK_CONFIG_SIZE,
                VhostUserConfigFlags::empty(),
                &[0u8; VIRTIO_BLK_CONFIG_SIZE as usize],
            )
            .expect("GET_CONFIG");
        if self.protocol.contains(VhostUserProtocolFeatures::REPLY_ACK) {
            self.fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
        }
        payload
    }

    // -- guest memory helpers ------------------------------------------------

    /// Allocate `len` bytes of guest memory (16-byte aligned), filled with
    /// `fill`.
    fn alloc(&mut self, len: usize, fill: u8) -> u64 {
        let len = (len as u64).max(1).next_multiple_of(16);
        if self.next_buf + len > self.buf_end {
            self.next_buf = BUF_BASE;
        }
        let addr = self.next_buf;
        self.next_buf += len;
        self.mem
            .write_slice(&vec![fill; len as usize], GuestAddress(addr))
            .unwrap();
        addr
    }

    fn alloc_bytes(&mut self, bytes: &[u8]) -> u64 {
        let addr = self.alloc(bytes.len(), 0);
        self.mem.write_slice(bytes, GuestAddress(addr)).unwrap();
        addr
    }

    fn read(&self, addr: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.mem.read_slice(&mut v, GuestAddress(addr)).unwrap();
        v
    }

    fn byte(&self, addr: u64) -> u8 {
        self.read(addr, 1)[0]
    }

    /// A 16-byte virtio-blk request header in guest memory.
    fn header(&mut self, typ: u32, sector: u64) -> u64 {
        self.alloc_bytes(&blk_header(typ, sector))
    }

    /// A status byte in guest memory, pre-filled with `STATUS_UNTOUCHED`.
    fn status_byte(&mut self) -> u64 {
        self.alloc(1, STATUS_UNTOUCHED)
    }

    // -- ring helpers ----------------------------------------------------------

    /// Write descriptor `idx` of a table at `table`.
    fn write_desc(&self, table: u64, idx: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let mut d = [0u8; 16];
        d[0..8].copy_from_slice(&addr.to_le_bytes());
        d[8..12].copy_from_slice(&len.to_le_bytes());
        d[12..14].copy_from_slice(&flags.to_le_bytes());
        d[14..16].copy_from_slice(&next.to_le_bytes());
        self.mem
            .write_slice(&d, GuestAddress(table + 16 * idx as u64))
            .unwrap();
    }

    /// Take `n` consecutive (modulo the queue size) descriptor slots.
    fn take_descs(&mut self, q: usize, n: usize) -> Vec<u16> {
        let vq = &mut self.queues[q];
        let v = (0..n)
            .map(|i| ((vq.next_desc as usize + i) % QSIZE as usize) as u16)
            .collect();
        vq.next_desc = ((vq.next_desc as usize + n) % QSIZE as usize) as u16;
        v
    }

    /// Write `segs` as a chain into the descriptor table of queue `q`;
    /// returns the head index (not yet made available).
    fn write_chain(&mut self, q: usize, segs: &[Seg]) -> u16 {
        assert!(!segs.is_empty() && segs.len() <= QSIZE as usize);
        let idx = self.take_descs(q, segs.len());
        let table = self.queues[q].desc;
        for (i, s) in segs.iter().enumerate() {
            let mut flags = if s.write { VRING_DESC_F_WRITE } else { 0 };
            let mut next = 0;
            if i + 1 < segs.len() {
                flags |= VRING_DESC_F_NEXT;
                next = idx[i + 1];
            }
            self.write_desc(table, idx[i], s.addr, s.len, flags, next);
        }
        idx[0]
    }

    /// Write `segs` as an indirect table in guest memory and one descriptor in
    /// queue `q` pointing at it; returns the head index.
    fn write_indirect(&mut self, q: usize, segs: &[Seg]) -> u16 {
        let table = self.alloc(16 * segs.len(), 0);
        for (i, s) in segs.iter().enumerate() {
            let mut flags = if s.write { VRING_DESC_F_WRITE } else { 0 };
            let mut next = 0;
            if i + 1 < segs.len() {
                flags |= VRING_DESC_F_NEXT;
                next = i as u16 + 1;
            }
            self.write_desc(table, i as u16, s.addr, s.len, flags, next);
        }
        self.write_indirect_head(q, table, 16 * segs.len() as u32)
    }

    /// One descriptor in queue `q` with the INDIRECT flag, pointing at an
    /// indirect table at `table` of `len` bytes.
    fn write_indirect_head(&mut self, q: usize, table: u64, len: u32) -> u16 {
        let head = self.take_descs(q, 1)[0];
        let desc = self.queues[q].desc;
        self.write_desc(desc, head, table, len, VRING_DESC_F_INDIRECT, 0);
        head
    }

    /// Put `head` into the avail ring of queue `q` and publish the new index.
    fn publish(&mut self, q: usize, head: u16) {
        let vq = &mut self.queues[q];
        let slot = vq.avail + 4 + 2 * (vq.avail_idx % QSIZE) as u64;
        self.mem
            .write_slice(&head.to_le_bytes(), GuestAddress(slot))
            .unwrap();
        vq.avail_idx = vq.avail_idx.wrapping_add(1);
        let idx = vq.avail_idx;
        self.set_avail_idx(q, idx);
    }

    /// Store avail->idx of queue `q` (release) without touching the ring.
    fn set_avail_idx(&mut self, q: usize, idx: u16) {
        let vq = &self.queues[q];
        // With EVENT_IDX, ask for a notification on the next used entry.
        let used_event = vq.avail + 4 + 2 * QSIZE as u64;
        self.mem
            .write_slice(&vq.last_used.to_le_bytes(), GuestAddress(used_event))
            .unwrap();
        fence(Ordering::SeqCst);
        self.mem
            .store(idx.to_le(), GuestAddress(vq.avail + 2), Ordering::Release)
            .unwrap();
        fence(Ordering::SeqCst);
    }

    fn kick(&self, q: usize) {
        self.queues[q].kick.write(1).expect("kick");
    }

    fn submit(&mut self, q: usize, segs: &[Seg]) -> u16 {
        let head = self.write_chain(q, segs);
        self.publish(q, head);
        self.kick(q);
        head
    }

    fn used_idx(&self, q: usize) -> u16 {
        let idx: u16 = self
            .mem
            .load(GuestAddress(self.queues[q].used + 2), Ordering::Acquire)
            .unwrap();
        u16::from_le(idx)
    }

    /// Wait up to `timeout` for the next used element of queue `q`; returns
    /// (id, len) and consumes it.
    fn wait_used(&mut self, q: usize, timeout: Duration) -> Option<(u32, u32)> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.used_idx(q) != self.queues[q].last_used {
                fence(Ordering::SeqCst);
                let vq = &mut self.queues[q];
                let elem = vq.used + 4 + 8 * (vq.last_used % QSIZE) as u64;
                vq.last_used = vq.last_used.wrapping_add(1);
                let mut b = [0u8; 8];
                self.mem.read_slice(&mut b, GuestAddress(elem)).unwrap();
                let id = u32::from_le_bytes(b[0..4].try_into().unwrap());
                let len = u32::from_le_bytes(b[4..8].try_into().unwrap());
                return Some((id, len));
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            // Sleep on the call eventfds (a lost or suppressed interrupt only
            // costs one 10 ms poll round).
            let ms = (deadline - now).as_millis().clamp(1, 10) as i32;
            let mut events = [EpollEvent::default(); NUM_QUEUES];
            let n = self.epoll.wait(ms, &mut events).unwrap_or(0);
            for ev in &events[..n] {
                let _ = self.queues[ev.data() as usize].call.read();
            }
        }
    }

    /// Like `wait_used`, but the element must come and must be `head`.
    fn expect_used(&mut self, q: usize, head: u16) -> u32 {
        let (id, len) = self.wait_used(q, WAIT).unwrap_or_else(|| {
            panic!(
                "queue {q}: no used element for head {head} within {WAIT:?} (used idx {})",
                self.used_idx(q)
            )
        });
        assert_eq!(id, head as u32, "queue {q}: used element id");
        len
    }

    /// Consume whatever used elements show up within `timeout`.
    fn drain(&mut self, q: usize, timeout: Duration) -> Vec<(u32, u32)> {
        let mut v = Vec::new();
        let deadline = Instant::now() + timeout;
        while let Some(e) = self.wait_used(q, deadline.saturating_duration_since(Instant::now())) {
            v.push(e);
        }
        v
    }

    // -- virtio-blk --------------------------------------------------------------

    /// Build the descriptors of a well-formed request (header, data, status).
    fn blk_segs(&mut self, typ: u32, sector: u64, data: &Data) -> (Vec<Seg>, Option<u64>, u64) {
        let hdr = self.header(typ, sector);
        let mut segs = vec![r(hdr, 16)];
        let mut data_addr = None;
        match data {
            Data::None => {}
            Data::Out(bytes) => {
                let a = self.alloc_bytes(bytes);
                segs.push(r(a, bytes.len() as u32));
            }
            Data::In(len) => {
                let a = self.alloc(*len, 0xa5);
                segs.push(w(a, *len as u32));
                data_addr = Some(a);
            }
        }
        let st = self.status_byte();
        segs.push(w(st, 1));
        (segs, data_addr, st)
    }

    /// Submit one well-formed request on queue `q` and wait for it.
    fn blk(&mut self, q: usize, typ: u32, sector: u64, data: Data) -> Done {
        let (segs, data_addr, st) = self.blk_segs(typ, sector, &data);
        let head = self.submit(q, &segs);
        self.finish_req(q, head, st, data_addr, &data)
    }

    /// Same as `blk`, through an indirect descriptor table.
    fn blk_indirect(&mut self, q: usize, typ: u32, sector: u64, data: Data) -> Done {
        let (segs, data_addr, st) = self.blk_segs(typ, sector, &data);
        let head = self.write_indirect(q, &segs);
        self.publish(q, head);
        self.kick(q);
        self.finish_req(q, head, st, data_addr, &data)
    }

    fn finish_req(
        &mut self,
        q: usize,
        head: u16,
        st: u64,
        data_addr: Option<u64>,
        data: &Data,
    ) -> Done {
        let used_len = self.expect_used(q, head);
        let data = match (data_addr, data) {
            (Some(a), Data::In(len)) => self.read(a, *len),
            _ => Vec::new(),
        };
        Done {
            status: self.byte(st),
            used_len,
            data,
        }
    }

    fn write_ok(&mut self, q: usize, sector: u64, bytes: &[u8]) {
        let d = self.blk(q, VIRTIO_BLK_T_OUT, sector, Data::Out(bytes));
        assert_eq!(
            d.status, VIRTIO_BLK_S_OK,
            "queue {q}: OUT sector {sector}: {d:?}"
        );
        assert_eq!(d.used_len, 1, "queue {q}: OUT used len");
    }

    fn read_ok(&mut self, q: usize, sector: u64, len: usize) -> Vec<u8> {
        let d = self.blk(q, VIRTIO_BLK_T_IN, sector, Data::In(len));
        assert_eq!(
            d.status, VIRTIO_BLK_S_OK,
            "queue {q}: IN sector {sector}: status"
        );
        assert_eq!(d.used_len, len as u32 + 1, "queue {q}: IN used len");
        d.data
    }

    /// The "still serving" check after a chain the device may drop or
    /// return at once (malformed): a fresh write on queue `q`, then its
    /// read-back. Returns the used elements that came before the write's
    /// own (the earlier chain, if the device returned it). The device
    /// serves a queue in order, so once the write is used the earlier
    /// chain has been dealt with, and whatever the device did to guest
    /// memory for it is visible: no waiting for something that may never
    /// come.
    fn serving_after(&mut self, q: usize) -> Vec<(u32, u32)> {
        self.seq += 1;
        let sector = 1024 + 16 * (self.seq % 64);
        let data = pattern(4096, self.seq * 7919 + q as u64);
        let (segs, _, st) = self.blk_segs(VIRTIO_BLK_T_OUT, sector, &Data::Out(&data));
        let head = self.submit(q, &segs);
        let mut before = Vec::new();
        let used_len = loop {
            let (id, len) = self.wait_used(q, WAIT).unwrap_or_else(|| {
                panic!(
                    "queue {q}: no used element for head {head} within {WAIT:?} (used idx {})",
                    self.used_idx(q)
                )
            });
            if id == head as u32 {
                break len;
            }
            before.push((id, len));
        };
        assert_eq!(
            (self.byte(st), used_len),
            (VIRTIO_BLK_S_OK, 1),
            "queue {q}: OUT sector {sector}"
        );
        assert!(
            self.read_ok(q, sector, 4096) == data,
            "queue {q}: read-back mismatch"
        );
        before
    }

    /// The "still serving" check run after every abuse: write a fresh pattern
    /// and read it back on queue `q`.
    fn check_serving(&mut self, q: usize) {
        self.seq += 1;
        let sector = 1024 + 16 * (self.seq % 64);
        let data = pattern(4096, self.seq * 7919 + q as u64);
        self.write_ok(q, sector, &data);
        assert!(
            self.read_ok(q, sector, 4096) == data,
            "queue {q}: read-back mismatch"
        );
    }
}

/// Connect to the backend's socket. The path exists from bind(2) on, but
/// connect(2) is refused until listen(2): retry that briefly, like
/// `Frontend::connect` does.
fn connect_socket(socket: &Path) -> UnixStream {
    let deadline = Instant::now() + common::PATIENCE;
    loop {
        match UnixStream::connect(socket) {
            Ok(s) => return s,
            Err(e)
                if e.kind() == std::io::ErrorKind::ConnectionRefused
                    && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("connect {}: {e}", socket.display()),
        }
    }
}

fn blk_header(typ: u32, sector: u64) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[0..4].copy_from_slice(&typ.to_le_bytes());
    h[8..16].copy_from_slice(&sector.to_le_bytes());
    h
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn start() -> (Server, Conn) {
    let server = Server::spawn(false);
    let conn = server.connect();
    (server, conn)
}

/// End of every test: both queues still serve a write+read-back and the
/// daemon is alive.
fn end(server: Server, mut conn: Conn) {
    for q in 0..NUM_QUEUES {
        conn.check_serving(q);
    }
    server.finish(conn);
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

/// Case 1: Good path on both queues, with ring wrap-around, batches and (if
/// offered) FLUSH, WRITE_ZEROES and DISCARD.
#[test]
fn good_path() {
    let (server, mut c) = start();
    let data = pattern(4096, 1);
    let d = c.blk(0, VIRTIO_BLK_T_OUT, 8, Data::Out(&data));
    assert_eq!((d.status, d.used_len), (VIRTIO_BLK_S_OK, 1), "OUT: {d:?}");
    let d = c.blk(0, VIRTIO_BLK_T_IN, 8, Data::In(4096));
    assert_eq!((d.status, d.used_len), (VIRTIO_BLK_S_OK, 4097));
    assert!(d.data == data, "read-back mismatch");

    // The same data is visible through queue 1.
    assert!(c.read_ok(1, 8, 4096) == data);

    // Last sector of the disk.
    let last = pattern(512, 2);
    c.write_ok(1, CAPACITY - 1, &last);
    assert!(c.read_ok(0, CAPACITY - 1, 512) == last);

    // Batches: 8 requests in flight per kick; 12 rounds wrap the 64-entry
    // rings (avail/used idx and descriptor slots) at least once.
    for round in 0..12u64 {
        let mut heads = Vec::new();
        let mut bufs = Vec::new();
        for i in 0..8u64 {
            let sector = 4096 + 8 * (round * 8 + i);
            let bytes = pattern(4096, sector);
            let (segs, _, st) = c.blk_segs(VIRTIO_BLK_T_OUT, sector, &Data::Out(&bytes));
            let head = c.write_chain(1, &segs);
            c.publish(1, head);
            heads.push(head);
            bufs.push(st);
        }
        c.kick(1);
        let mut done: Vec<u32> = (0..8)
            .map(|_| c.wait_used(1, WAIT).expect("batched completion").0)
            .collect();
        done.sort();
        let mut want: Vec<u32> = heads.iter().map(|&h| h as u32).collect();
        want.sort();
        assert_eq!(done, want, "round {round}: completed heads");
        for st in bufs {
            assert_eq!(c.byte(st), VIRTIO_BLK_S_OK);
        }
    }
    for i in 0..96u64 {
        let sector = 4096 + 8 * i;
        assert!(
            c.read_ok(0, sector, 4096) == pattern(4096, sector),
            "batch data at {sector}"
        );
    }

    if c.has(VIRTIO_BLK_F_FLUSH) {
        let d = c.blk(0, VIRTIO_BLK_T_FLUSH, 0, Data::None);
        assert_eq!((d.status, d.used_len), (VIRTIO_BLK_S_OK, 1), "FLUSH: {d:?}");
    }
    // {sector u64, num_sectors u32, flags u32}
    let seg = |sector: u64, n: u32| {
        let mut s = [0u8; 16];
        s[0..8].copy_from_slice(&sector.to_le_bytes());
        s[8..12].copy_from_slice(&n.to_le_bytes());
        s
    };
    if c.has(VIRTIO_BLK_F_WRITE_ZEROES) {
        let d = c.blk(0, VIRTIO_BLK_T_WRITE_ZEROES, 0, Data::Out(&seg(8, 8)));
        assert_eq!(d.status, VIRTIO_BLK_S_OK, "WRITE_ZEROES: {d:?}");
        assert!(c.read_ok(0, 8, 4096).iter().all(|&b| b == 0), "zeroes");
    }
    if c.has(VIRTIO_BLK_F_DISCARD) {
        let d = c.blk(1, VIRTIO_BLK_T_DISCARD, 0, Data::Out(&seg(4096, 8)));
        assert_eq!(d.status, VIRTIO_BLK_S_OK, "DISCARD: {d:?}");
    }
    end(server, c);
}

/// Same good path with SET_MEM_TABLE instead of ADD_MEM_REG.
#[test]
fn good_path_set_mem_table() {
    let server = Server::spawn(false);
    let mut c = Conn::connect(
        server.socket(),
        &Setup {
            mem: MemMode::SetMemTable,
            enable: true,
        },
    );
    let data = pattern(4096, 3);
    c.write_ok(0, 8, &data);
    assert!(c.read_ok(1, 8, 4096) == data);
    end(server, c);
}

/// Case 2: GET_ID and GET_CONFIG.
#[test]
fn get_id_and_config() {
    let (server, mut c) = start();
    let d = c.blk(0, VIRTIO_BLK_T_GET_ID, 0, Data::In(20));
    assert_eq!(d.status, VIRTIO_BLK_S_OK, "GET_ID: {d:?}");
    let id = &d.data;
    let n = id.iter().position(|&b| b == 0).unwrap_or(20);
    assert!(n > 0, "empty serial: {id:?}");
    assert!(
        id[n..].iter().all(|&b| b == 0),
        "serial not NUL padded: {id:?}"
    );
    assert!(
        id[..n].iter().all(|b| b.is_ascii_graphic() || *b == b' '),
        "serial not printable: {id:?}"
    );
    eprintln!("serial: {:?}", String::from_utf8_lossy(&id[..n]));

    let cfg = c.config();
    assert_eq!(cfg.len(), VIRTIO_BLK_CONFIG_SIZE as usize);
    let capacity = u64::from_le_bytes(cfg[0..8].try_into().unwrap());
    assert_eq!(capacity, CAPACITY, "config capacity");
    if c.has(VIRTIO_BLK_F_MQ) {
        let nq = u16::from_le_bytes(cfg[34..36].try_into().unwrap());
        assert_eq!(nq, NUM_QUEUES as u16, "config num_queues");
    } else {
        panic!("VIRTIO_BLK_F_MQ not offered");
    }
    end(server, c);
}

/// Case 3: Unknown request type.
#[test]
fn unknown_request_type() {
    let (server, mut c) = start();
    let d = c.blk(0, 0x55, 0, Data::In(512));
    assert_eq!(d.status, VIRTIO_BLK_S_UNSUPP, "type 0x55: {d:?}");
    let d = c.blk(1, 0x55, 0, Data::None);
    assert_eq!(
        d.status, VIRTIO_BLK_S_UNSUPP,
        "type 0x55 without data: {d:?}"
    );
    end(server, c);
}

/// Case 4: Out-of-range sectors, overflowing offsets, unaligned lengths.
#[test]
fn bad_sector_and_length() {
    let (server, mut c) = start();
    let cases: Vec<(&str, u32, u64, usize)> = vec![
        ("IN at sector = capacity", VIRTIO_BLK_T_IN, CAPACITY, 512),
        ("OUT at sector = capacity", VIRTIO_BLK_T_OUT, CAPACITY, 512),
        ("IN straddling the end", VIRTIO_BLK_T_IN, CAPACITY - 1, 1024),
        (
            "OUT straddling the end",
            VIRTIO_BLK_T_OUT,
            CAPACITY - 1,
            1024,
        ),
        (
            "IN sector*512+len overflows",
            VIRTIO_BLK_T_IN,
            u64::MAX / 512,
            4096,
        ),
        (
            "OUT sector*512+len overflows",
            VIRTIO_BLK_T_OUT,
            u64::MAX / 512,
            4096,
        ),
        ("IN sector*512 overflows", VIRTIO_BLK_T_IN, u64::MAX, 512),
        ("IN length 100", VIRTIO_BLK_T_IN, 0, 100),
        ("OUT length 1000", VIRTIO_BLK_T_OUT, 0, 1000),
        ("IN length 513", VIRTIO_BLK_T_IN, 0, 513),
    ];
    for (what, typ, sector, len) in cases {
        let bytes = pattern(len, 4);
        let data = if typ == VIRTIO_BLK_T_IN {
            Data::In(len)
        } else {
            Data::Out(&bytes)
        };
        let d = c.blk(0, typ, sector, data);
        assert_eq!(d.status, VIRTIO_BLK_S_IOERR, "{what}: {d:?}");
    }
    // None of the refused writes wrote anything: the disk's start and its
    // last sectors still read as zeros.
    for sector in [0, CAPACITY - 8] {
        let got = c.read_ok(0, sector, 4096);
        assert!(
            got.iter().all(|&b| b == 0),
            "sector {sector}: written by a refused request"
        );
    }
    end(server, c);
}

/// Case 5: Data descriptor outside guest memory.
#[test]
fn data_outside_guest_memory() {
    let (server, mut c) = start();
    for (what, typ, addr) in [
        ("IN data at 4 GiB", VIRTIO_BLK_T_IN, OUTSIDE),
        ("OUT data at 4 GiB", VIRTIO_BLK_T_OUT, OUTSIDE),
        (
            "IN data straddling end of RAM",
            VIRTIO_BLK_T_IN,
            MEM_SIZE - 512,
        ),
        (
            "OUT data straddling end of RAM",
            VIRTIO_BLK_T_OUT,
            MEM_SIZE - 512,
        ),
    ] {
        let hdr = c.header(typ, 16);
        let st = c.status_byte();
        let data = Seg {
            addr,
            len: 4096,
            write: typ == VIRTIO_BLK_T_IN,
        };
        let head = c.submit(0, &[r(hdr, 16), data, w(st, 1)]);
        c.expect_used(0, head);
        assert_eq!(c.byte(st), VIRTIO_BLK_S_IOERR, "{what}: status");
    }
    end(server, c);
}

/// Case 6: Header outside guest memory, or short.
#[test]
fn bad_header() {
    let (server, mut c) = start();
    // Header at 4 GiB.
    let data = c.alloc(512, 0);
    let st = c.status_byte();
    let head = c.submit(0, &[r(OUTSIDE, 16), w(data, 512), w(st, 1)]);
    c.expect_used(0, head);
    assert_eq!(c.byte(st), VIRTIO_BLK_S_IOERR, "header at 4 GiB: status");

    // Header of 8 bytes (type IN, sector 0) followed by data and status.
    let hdr = c.alloc_bytes(&blk_header(VIRTIO_BLK_T_IN, 0));
    let data = c.alloc(512, 0);
    let st = c.status_byte();
    let head = c.submit(0, &[r(hdr, 8), w(data, 512), w(st, 1)]);
    c.expect_used(0, head);
    assert_eq!(c.byte(st), VIRTIO_BLK_S_IOERR, "8-byte header: status");

    // Header of 8 bytes, directly followed by the status.
    let hdr = c.alloc_bytes(&blk_header(VIRTIO_BLK_T_FLUSH, 0));
    let st = c.status_byte();
    let head = c.submit(1, &[r(hdr, 8), w(st, 1)]);
    c.expect_used(1, head);
    assert_eq!(
        c.byte(st),
        VIRTIO_BLK_S_IOERR,
        "8-byte header, no data: status"
    );
    end(server, c);
}

/// Case 7: Chains without a usable status descriptor are dropped.
#[test]
fn bad_status_descriptor() {
    let (server, mut c) = start();
    let q = 0;

    // Only device-readable descriptors (OUT with no status).
    let hdr = c.header(VIRTIO_BLK_T_OUT, 32);
    let data = c.alloc_bytes(&pattern(512, 7));
    c.submit(q, &[r(hdr, 16), r(data, 512)]);
    eprintln!("no status: {:?}", c.serving_after(q));
    assert!(
        c.read(data, 512) == pattern(512, 7),
        "device wrote a device-readable buffer"
    );

    // Only device-readable descriptors (IN with no writable descriptor at all).
    let hdr = c.header(VIRTIO_BLK_T_IN, 32);
    c.submit(q, &[r(hdr, 16)]);
    eprintln!("header only: {:?}", c.serving_after(q));

    // Read-only status descriptor: the device must not write it.
    let hdr = c.header(VIRTIO_BLK_T_IN, 32);
    let data = c.alloc(512, 0);
    let st = c.status_byte();
    c.submit(q, &[r(hdr, 16), w(data, 512), r(st, 1)]);
    eprintln!("read-only status: {:?}", c.serving_after(q));
    assert_eq!(
        c.byte(st),
        STATUS_UNTOUCHED,
        "device wrote a read-only status byte"
    );

    // Zero-length status descriptor: the device must not write past it.
    let hdr = c.header(VIRTIO_BLK_T_IN, 32);
    let data = c.alloc(512, 0);
    let st = c.status_byte();
    c.submit(q, &[r(hdr, 16), w(data, 512), w(st, 0)]);
    eprintln!("zero-length status: {:?}", c.serving_after(q));
    assert_eq!(
        c.byte(st),
        STATUS_UNTOUCHED,
        "device wrote a zero-length status"
    );

    end(server, c);
}

/// Case 8: Descriptor loops (two-element loop, and a chain through the whole
/// table that is longer than the queue size).
#[test]
fn descriptor_loops() {
    let (server, mut c) = start();
    let q = 0;
    let table = c.queues[q].desc;

    // d0 -> d1 -> d0 …
    let hdr = c.header(VIRTIO_BLK_T_IN, 0);
    let st = c.status_byte();
    let idx = c.take_descs(q, 2);
    c.write_desc(table, idx[0], hdr, 16, VRING_DESC_F_NEXT, idx[1]);
    c.write_desc(
        table,
        idx[1],
        st,
        1,
        VRING_DESC_F_NEXT | VRING_DESC_F_WRITE,
        idx[0],
    );
    c.publish(q, idx[0]);
    c.kick(q);
    eprintln!("2-loop: {:?}", c.serving_after(q));

    // Every descriptor of the table chained in a ring: longer than QSIZE.
    let hdr = c.header(VIRTIO_BLK_T_IN, 0);
    let buf = c.alloc(512, 0);
    let head = c.take_descs(q, 1)[0];
    for i in 0..QSIZE {
        let next = (head + i + 1) % QSIZE;
        let slot = (head + i) % QSIZE;
        if i == 0 {
            c.write_desc(table, slot, hdr, 16, VRING_DESC_F_NEXT, next);
        } else {
            c.write_desc(
                table,
                slot,
                buf,
                512,
                VRING_DESC_F_NEXT | VRING_DESC_F_WRITE,
                next,
            );
        }
    }
    c.publish(q, head);
    c.kick(q);
    eprintln!("full-table loop: {:?}", c.serving_after(q));

    // A loop inside an indirect table.
    let hdr = c.header(VIRTIO_BLK_T_IN, 0);
    let st = c.status_byte();
    let itable = c.alloc(32, 0);
    c.write_desc(itable, 0, hdr, 16, VRING_DESC_F_NEXT, 1);
    c.write_desc(itable, 1, st, 1, VRING_DESC_F_NEXT | VRING_DESC_F_WRITE, 0);
    let head = c.write_indirect_head(q, itable, 32);
    c.publish(q, head);
    c.kick(q);
    eprintln!("indirect loop: {:?}", c.serving_after(q));

    end(server, c);
}

/// Case 9: Indirect descriptor tables: valid ones work, bad ones are dropped.
#[test]
fn indirect_descriptors() {
    let (server, mut c) = start();
    assert!(
        c.has(VIRTIO_RING_F_INDIRECT_DESC),
        "INDIRECT_DESC not offered"
    );
    let data = pattern(8192, 9);
    let d = c.blk_indirect(0, VIRTIO_BLK_T_OUT, 64, Data::Out(&data));
    assert_eq!(
        (d.status, d.used_len),
        (VIRTIO_BLK_S_OK, 1),
        "indirect OUT: {d:?}"
    );
    let d = c.blk_indirect(1, VIRTIO_BLK_T_IN, 64, Data::In(8192));
    assert_eq!(
        (d.status, d.used_len),
        (VIRTIO_BLK_S_OK, 8193),
        "indirect IN"
    );
    assert!(d.data == data, "indirect read-back mismatch");

    // An indirect table longer than the queue size is legal: 1 + 80 + 1
    // (fewer data segments if the device's seg_max says so).
    let mut nsegs = 80u32;
    if c.has(VIRTIO_BLK_F_SEG_MAX) {
        let cfg = c.config();
        let seg_max = u32::from_le_bytes(cfg[12..16].try_into().unwrap());
        eprintln!("seg_max = {seg_max}");
        nsegs = nsegs.min(seg_max);
    }
    let hdr = c.header(VIRTIO_BLK_T_IN, 64);
    let bufs: Vec<u64> = (0..nsegs).map(|_| c.alloc(512, 0)).collect();
    let st = c.status_byte();
    let mut segs = vec![r(hdr, 16)];
    segs.extend(bufs.iter().map(|&a| w(a, 512)));
    segs.push(w(st, 1));
    let head = c.write_indirect(0, &segs);
    c.publish(0, head);
    c.kick(0);
    let len = c.expect_used(0, head);
    assert_eq!(
        c.byte(st),
        VIRTIO_BLK_S_OK,
        "{nsegs}-segment indirect table: status"
    );
    assert_eq!(
        len,
        nsegs * 512 + 1,
        "{nsegs}-segment indirect table: used len"
    );
    let got: Vec<u8> = bufs.iter().flat_map(|&a| c.read(a, 512)).collect();
    assert!(
        got[..8192] == data[..],
        "{nsegs}-segment indirect table: data"
    );

    // Indirect table outside guest memory.
    let head = c.write_indirect_head(0, OUTSIDE, 48);
    c.publish(0, head);
    c.kick(0);
    eprintln!("indirect table at 4 GiB: {:?}", c.serving_after(0));

    // Indirect table length not a multiple of 16.
    let hdr = c.header(VIRTIO_BLK_T_IN, 0);
    let st = c.status_byte();
    let itable = c.alloc(32, 0);
    c.write_desc(itable, 0, hdr, 16, VRING_DESC_F_NEXT, 1);
    c.write_desc(itable, 1, st, 1, VRING_DESC_F_WRITE, 0);
    let head = c.write_indirect_head(0, itable, 24);
    c.publish(0, head);
    c.kick(0);
    eprintln!("indirect table of 24 bytes: {:?}", c.serving_after(0));

    end(server, c);
}

/// Case 10: avail->idx jumping by more than the queue size.
#[test]
fn avail_index_jump() {
    let (mut server, mut c) = start();
    c.check_serving(0);
    let bogus = c.queues[0].avail_idx.wrapping_add(QSIZE + 100);
    c.set_avail_idx(0, bogus);
    c.kick(0);
    eprintln!("queue 0 after avail jump: {:?}", c.drain(0, MAYBE_WAIT));
    assert!(server.alive(), "daemon died after avail idx jump");
    // Queue 1 is unaffected.
    c.check_serving(1);
    c.check_serving(1);
    assert!(server.alive());
    // A fresh connection gets a working queue 0 again.
    drop(c);
    let mut c = server.connect();
    c.check_serving(0);
    end(server, c);
}

/// Case 11: A kick on a ring that is not enabled yet is not processed; after
/// SET_VRING_ENABLE(1) (and a kick) it is.
#[test]
fn kick_before_enable() {
    let server = Server::spawn(false);
    let mut c = Conn::connect(
        server.socket(),
        &Setup {
            mem: MemMode::AddMemReg,
            enable: false,
        },
    );
    let data = pattern(4096, 11);
    let (segs, _, st) = c.blk_segs(VIRTIO_BLK_T_OUT, 200, &Data::Out(&data));
    let head = c.submit(0, &segs);
    std::thread::sleep(MAYBE_WAIT);
    assert_eq!(c.used_idx(0), 0, "request processed on a disabled ring");
    assert_eq!(
        c.byte(st),
        STATUS_UNTOUCHED,
        "status written on a disabled ring"
    );
    c.enable(0);
    c.kick(0);
    c.expect_used(0, head);
    assert_eq!(c.byte(st), VIRTIO_BLK_S_OK, "status after enable");
    c.enable(1);
    assert!(c.read_ok(1, 200, 4096) == data);
    end(server, c);
}

/// Case 12: Zero-length descriptors in the middle of a request.
#[test]
fn zero_length_data_descriptor() {
    let (server, mut c) = start();
    let data = pattern(4096, 12);
    c.write_ok(0, 300, &data);

    // IN: data, 0-length writable, status.
    let hdr = c.header(VIRTIO_BLK_T_IN, 300);
    let buf = c.alloc(4096, 0);
    let zero = c.alloc(16, 0x5a);
    let st = c.status_byte();
    let head = c.submit(0, &[r(hdr, 16), w(buf, 4096), w(zero, 0), w(st, 1)]);
    let len = c.expect_used(0, head);
    assert_eq!(
        c.byte(st),
        VIRTIO_BLK_S_OK,
        "IN with 0-length descriptor: status"
    );
    assert_eq!(len, 4097, "IN with 0-length descriptor: used len");
    assert!(c.read(buf, 4096) == data);
    assert!(
        c.read(zero, 16).iter().all(|&b| b == 0x5a),
        "0-length buffer written"
    );

    // IN split in two halves around a 0-length descriptor.
    let hdr = c.header(VIRTIO_BLK_T_IN, 300);
    let a = c.alloc(2048, 0);
    let b = c.alloc(2048, 0);
    let st = c.status_byte();
    let head = c.submit(
        1,
        &[r(hdr, 16), w(a, 2048), w(zero, 0), w(b, 2048), w(st, 1)],
    );
    c.expect_used(1, head);
    assert_eq!(c.byte(st), VIRTIO_BLK_S_OK, "split IN: status");
    assert!([c.read(a, 2048), c.read(b, 2048)].concat() == data);

    // OUT with a 0-length readable descriptor between header and data.
    let data2 = pattern(4096, 13);
    let hdr = c.header(VIRTIO_BLK_T_OUT, 308);
    let src = c.alloc_bytes(&data2);
    let st = c.status_byte();
    let head = c.submit(0, &[r(hdr, 16), r(zero, 0), r(src, 4096), w(st, 1)]);
    c.expect_used(0, head);
    assert_eq!(
        c.byte(st),
        VIRTIO_BLK_S_OK,
        "OUT with 0-length descriptor: status"
    );
    assert!(c.read_ok(0, 308, 4096) == data2);
    end(server, c);
}

/// Case 13: Read-only disk.
#[test]
fn read_only_disk() {
    let server = Server::spawn(true);
    let mut c = server.connect();
    assert!(c.has(VIRTIO_BLK_F_RO), "VIRTIO_BLK_F_RO not offered");
    let data = pattern(4096, 13);
    let d = c.blk(0, VIRTIO_BLK_T_OUT, 8, Data::Out(&data));
    assert_eq!(d.status, VIRTIO_BLK_S_IOERR, "OUT on read-only disk: {d:?}");
    if c.has(VIRTIO_BLK_F_WRITE_ZEROES) {
        let mut s = [0u8; 16];
        s[0..8].copy_from_slice(&8u64.to_le_bytes());
        s[8..12].copy_from_slice(&8u32.to_le_bytes());
        let d = c.blk(0, VIRTIO_BLK_T_WRITE_ZEROES, 0, Data::Out(&s));
        assert_ne!(
            d.status, VIRTIO_BLK_S_OK,
            "WRITE_ZEROES on read-only disk: {d:?}"
        );
    }
    for q in 0..NUM_QUEUES {
        let got = c.read_ok(q, 8, 4096);
        assert!(got.iter().all(|&b| b == 0), "read-only disk not zero");
    }
    server.finish(c);
}

/// Case 14: Disconnect mid-stream and reconnect.
#[test]
fn disconnect_and_reconnect() {
    let (mut server, mut c) = start();
    let data = pattern(65536, 14);
    c.write_ok(0, 512, &data);
    // Leave requests in flight when the frontend goes away.
    for i in 0..8u64 {
        let bytes = pattern(4096, 100 + i);
        let (segs, _, _) = c.blk_segs(VIRTIO_BLK_T_OUT, 2048 + 8 * i, &Data::Out(&bytes));
        let head = c.write_chain(1, &segs);
        c.publish(1, head);
    }
    c.kick(1);
    drop(c);
    assert!(server.alive(), "daemon died on disconnect");

    let check = |c: &mut Conn, round: usize| {
        assert!(
            c.read_ok(1, 512, 65536) == data,
            "round {round}: data after reconnect"
        );
        for i in 0..8u64 {
            // In-flight writes either happened completely or not at all.
            let got = c.read_ok(0, 2048 + 8 * i, 4096);
            assert!(
                got == pattern(4096, 100 + i) || got.iter().all(|&b| b == 0),
                "round {round}: torn in-flight write {i}"
            );
        }
        c.check_serving(round % 2);
    };
    for round in 0..2 {
        let mut c = server.connect();
        check(&mut c, round);
        // Disconnect with nothing in flight, too.
        drop(c);
        assert!(server.alive(), "daemon died on disconnect {round}");
    }
    let mut c = server.connect();
    check(&mut c, 2);
    end(server, c);
}

/// Kicks are counted exactly, whatever the timing: this frontend kicks once
/// per request in the first phase and once per 16 requests in the second,
/// and the control socket must report exactly that.
#[test]
fn kicks_counted_exactly() {
    kicks_and_notifications(true);
}

#[test]
fn kicks_and_notifications_without_event_idx() {
    kicks_and_notifications(false);
}

/// Known submission patterns, then the queue's kick and notification
/// counters. With EVENT_IDX the backend checks used_event after every
/// used entry; without it, it signals once per pass over the ring.
fn kicks_and_notifications(event_idx: bool) {
    blklab_only("blklab's kick and notification counters");
    let dir = tempfile::tempdir().unwrap();
    let ctl = dir.path().join("ctl.sock");
    let ctl_arg = ctl.to_str().unwrap().to_string();
    let mut args = BLKLAB_DISK.to_vec();
    args.extend_from_slice(&["--control", &ctl_arg]);
    if !event_idx {
        args.extend_from_slice(&["--disable-features", "event-idx"]);
    }
    let server = Server::Blklab(common::Daemon::spawn(&args, 1));
    let mut c = server.connect();
    let q0 = |doc: &serde_json::Value| doc["disks"][0]["queues"][0].clone();
    // Nothing has been submitted yet: the baseline is all zeroes.
    let base = blklab::backend::control::query(&ctl, "snapshot start").unwrap();
    assert_eq!(q0(&base)["counters"]["requests"], 0, "{base}");
    assert_eq!(q0(&base)["counters"]["kicks"], 0, "{base}");

    // Each request or batch starts only once the backend has finished the
    // pass that served the previous one (its counters show it: a queue's
    // statistics are locked for the whole pass) and so has re-armed guest
    // notifications. A request published while the worker still drains
    // would legitimately be picked up without its kick being read in that
    // pass, and the counts below would depend on timing.
    let served = |requests: u64, kicks: u64| {
        common::wait_for_counters(&ctl, 0, 0, &[("requests", requests), ("kicks", kicks)]);
    };

    // Phase 1: 20 requests, each published, kicked and waited for.
    for i in 0..20u64 {
        c.write_ok(0, 8 * i, &pattern(4096, i));
        served(i + 1, i + 1);
    }
    let a = q0(&blklab::backend::control::query(&ctl, "snapshot one-per-kick").unwrap());
    assert_eq!(a["counters"]["requests"], 20, "{a}");
    assert_eq!(a["counters"]["kicks"], 20, "one kick per request: {a}");
    // EVENT_IDX: each request's used_event asked for its own completion;
    // without it, each pass (one request here) signals once.
    assert_eq!(a["counters"]["notifications"], 20, "{a}");
    assert_eq!(a["counters"]["notifications_suppressed"], 0, "{a}");

    // Phase 2: 3 rounds of 16 requests published, then a single kick.
    for round in 0..3u64 {
        let mut heads = Vec::new();
        for i in 0..16u64 {
            let sector = 1024 + 8 * (round * 16 + i);
            let bytes = pattern(4096, sector);
            let (segs, _, st) = c.blk_segs(VIRTIO_BLK_T_OUT, sector, &Data::Out(&bytes));
            let head = c.write_chain(0, &segs);
            c.publish(0, head);
            heads.push((head, st));
        }
        c.kick(0);
        for (head, st) in heads {
            c.expect_used(0, head);
            assert_eq!(c.byte(st), VIRTIO_BLK_S_OK);
        }
        served(20 + 16 * (round + 1), 20 + round + 1);
    }
    let b = q0(&blklab::backend::control::query(&ctl, "snapshot sixteen-per-kick").unwrap());
    assert_eq!(b["counters"]["requests"], 48, "{b}");
    assert_eq!(b["counters"]["kicks"], 3, "one kick per 16 requests: {b}");
    assert_eq!(b["requests_per_kick"]["max"], 16, "{b}");
    // EVENT_IDX: used_event stays at the round's first completion while
    // the driver publishes: one notification per round, at the first used
    // entry (the check runs after every entry), and the other 15 entries
    // suppressed. Without it: one signal per pass, one pass per kick.
    assert_eq!(b["counters"]["notifications"], 3, "{b}");
    let suppressed = if event_idx { 45 } else { 0 };
    assert_eq!(b["counters"]["notifications_suppressed"], suppressed, "{b}");
    end(server, c);
}

// ---------------------------------------------------------------------------
// Hostile frontends: broken rings, log floods, bad memory, reconnects
// ---------------------------------------------------------------------------

/// `blklab serve` with the raw-frontend disk plus `extra`, a control socket,
/// and its stderr (the log) in a file; returns the server, the control
/// socket and the log file.
fn spawn_logged(extra: &[&str]) -> (Server, PathBuf, PathBuf) {
    let args: Vec<&str> = BLKLAB_DISK
        .iter()
        .copied()
        .chain(extra.iter().copied())
        .collect();
    let (d, log) = common::Daemon::with_control_logged(&args);
    let ctl = d.control().to_path_buf();
    (Server::Blklab(d), ctl, log)
}

/// The daemon's log so far, one entry per line.
fn log_lines(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// At most this many log lines may follow a guest's misbehaviour (a
/// warning or two, connection messages, the summary at disconnect).
const LOG_BOUND: usize = 40;

/// The log grew by at most [`LOG_BOUND`] lines since it had `before`.
fn assert_log_short(log: &Path, before: usize, after_what: &str) {
    let lines = log_lines(log);
    assert!(
        lines.len() - before <= LOG_BOUND,
        "{} log lines after {after_what}: {:?}",
        lines.len() - before,
        &lines[before..(before + 20).min(lines.len())]
    );
}

/// A test of blklab's own behaviour (`checks`: its counters, its log, a
/// refusal stricter than QEMU's) cannot run against qemu-storage-daemon:
/// with `RAW_FRONTEND_BACKEND=qsd` it fails saying so, so that such a run
/// counts it as not run rather than passed.
fn blklab_only(checks: &str) {
    assert!(
        std::env::var("RAW_FRONTEND_BACKEND").as_deref() != Ok("qsd"),
        "not run: this test checks {checks}, which qemu-storage-daemon does not have \
         (RAW_FRONTEND_BACKEND=qsd); run it without RAW_FRONTEND_BACKEND"
    );
}

/// Under `RAW_FRONTEND_BACKEND=qsd` a test of blklab's own behaviour fails
/// at once saying it did not run (this test binary, run again on one
/// such test), where it used to return early and pass.
#[test]
fn a_blklab_only_test_against_qsd_fails_as_not_run() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "heads_beyond_queue_size_do_not_flood_the_log"])
        .env("RAW_FRONTEND_BACKEND", "qsd")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains(
            "not run: this test checks blklab's log, which qemu-storage-daemon does not have"
        ),
        "{text}"
    );
    assert!(text.contains("0 passed; 1 failed"), "{text}");
}

/// An avail ring whose index is the last two bytes of guest memory (only
/// the ring's start lies inside), one request announced, EVENT_IDX on:
/// the queue is broken, counted, logged once and not served again; the
/// other queue, a new connection and SIGTERM keep working.
fn ring_end_outside_memory(extra: &[&str]) {
    blklab_only("blklab's counters and log");
    let (server, ctl, log) = spawn_logged(extra);
    let mut c = Conn::connect(
        server.socket(),
        &Setup {
            mem: MemMode::AddMemReg,
            enable: false,
        },
    );
    assert!(c.has(VIRTIO_RING_F_EVENT_IDX), "EVENT_IDX not negotiated");
    let avail = MEM_SIZE - 4;
    let cfg = VringConfigData {
        queue_max_size: QSIZE,
        queue_size: QSIZE,
        flags: 0,
        desc_table_addr: c.hva_base + c.queues[0].desc,
        used_ring_addr: c.hva_base + c.queues[0].used,
        avail_ring_addr: c.hva_base + avail,
        log_addr: None,
    };
    c.fe.set_vring_addr(0, &cfg).expect("SET_VRING_ADDR");
    c.mem
        .store(1u16.to_le(), GuestAddress(avail + 2), Ordering::Release)
        .unwrap();
    let before = log_lines(&log).len();
    c.enable(0);
    c.enable(1);
    c.kick(0);
    common::wait_for_counters(&ctl, 0, 0, &[("ring_errors", 1)]);
    // The other queue serves; the broken one is left alone.
    c.check_serving(1);
    c.kick(0);
    c.check_serving(1);
    assert_log_short(&log, before, "a broken ring");
    // A new connection is served (the server does not wait for a stuck
    // worker) and SIGTERM ends the daemon (end → finish).
    drop(c);
    let c = server.connect();
    end(server, c);
}

#[test]
fn ring_end_outside_memory_is_a_broken_ring() {
    ring_end_outside_memory(&[]);
}

#[test]
fn ring_end_outside_memory_is_a_broken_ring_in_poll_mode() {
    ring_end_outside_memory(&["--poll=50us"]);
}

/// A guest making heads beyond the queue size available, many times: the
/// queue is broken at the first, and the log stays short (neither
/// virtio-queue's per-request error nor anything of blklab's per request).
#[test]
fn heads_beyond_queue_size_do_not_flood_the_log() {
    blklab_only("blklab's log");
    let (mut server, ctl, log) = spawn_logged(&[]);
    let mut c = server.connect();
    c.check_serving(0);
    let before = log_lines(&log).len();
    for round in 0..40u16 {
        for i in 0..32u16 {
            c.publish(0, QSIZE + (round * 32 + i) % 1000);
        }
        c.kick(0);
        std::thread::sleep(Duration::from_millis(5));
    }
    common::wait_for_counters(&ctl, 0, 0, &[("ring_errors", 1)]);
    assert!(server.alive(), "daemon died");
    c.check_serving(1);
    assert_log_short(&log, before, "1280 bad heads");
    // A reconnect (the driver's reset) serves queue 0 again.
    drop(c);
    let c = server.connect();
    end(server, c);
}

/// A memory region declared larger than its file (a memfd of MEM_SIZE
/// bytes offered as 2 * MEM_SIZE): mapping it would let the first access
/// past the file's end kill the daemon with SIGBUS. The message is refused,
/// and the daemon serves the next frontend.
#[test]
fn memory_region_larger_than_its_file_is_refused() {
    blklab_only("a refusal stricter than qemu-storage-daemon's");
    let server = Server::spawn(false);
    for mode in [MemMode::AddMemReg, MemMode::SetMemTable] {
        let sock = connect_socket(server.socket());
        sock.set_read_timeout(Some(MSG_TIMEOUT)).unwrap();
        sock.set_write_timeout(Some(MSG_TIMEOUT)).unwrap();
        let mut fe = Frontend::from_stream(sock, NUM_QUEUES as u64);
        let offered = fe.get_features().expect("GET_FEATURES");
        let pf = fe.get_protocol_features().expect("GET_PROTOCOL_FEATURES");
        let protocol = pf
            & (VhostUserProtocolFeatures::MQ
                | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
                | VhostUserProtocolFeatures::REPLY_ACK);
        fe.set_protocol_features(protocol)
            .expect("SET_PROTOCOL_FEATURES");
        fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
        fe.set_owner().expect("SET_OWNER");
        fe.set_features(offered & DRIVER_FEATURES)
            .expect("SET_FEATURES");
        let mem = new_guest_memory();
        let region = mem.iter().next().expect("one region");
        let mut info = VhostUserMemoryRegionInfo::from_guest_region(region).expect("region info");
        info.memory_size = 2 * MEM_SIZE;
        let res = match mode {
            MemMode::AddMemReg => fe.add_mem_region(&info).is_err(),
            MemMode::SetMemTable => fe.set_mem_table(&[info]).is_err(),
        };
        assert!(
            res,
            "a region of {} bytes over a file of {MEM_SIZE} bytes was accepted",
            2 * MEM_SIZE
        );
        drop(fe);
    }
    let c = server.connect();
    end(server, c);
}

/// Guest memory the frontend could shrink after handing it over would let
/// it SIGBUS the daemon at the next access past the new end; a memfd that
/// takes seals is sealed against shrinking when the backend maps it, so the
/// frontend's own truncate fails, and the daemon keeps serving.
#[test]
fn guest_memfd_is_sealed_against_shrinking() {
    blklab_only("blklab's sealing of guest memory");
    let (server, mut c) = start();
    c.check_serving(0);
    let region = c.mem.iter().next().expect("one region");
    let file = region.file_offset().expect("memfd-backed").file();
    // SAFETY: fcntl reading the seals of our own memfd.
    let seals = unsafe { libc::fcntl(std::os::fd::AsRawFd::as_raw_fd(file), libc::F_GET_SEALS) };
    assert!(
        seals >= 0 && seals & libc::F_SEAL_SHRINK != 0,
        "seals {seals:#x}"
    );
    let e = file
        .set_len(MEM_SIZE / 2)
        .expect_err("the memfd shrank under the backend");
    assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{e}");
    c.check_serving(0);
    c.check_serving(1);
    end(server, c);
}

/// SET_VRING_CALL signals the new call fd at once, as libvhost-user does:
/// a driver that reconnected does not wait for an interrupt lost while the
/// backend was away (QEMU's vhost-user-blk qtest relies on it).
#[test]
fn set_vring_call_signals_the_new_call_fd() {
    let (server, mut c) = start();
    c.check_serving(0);
    let call = EventFd::new(EFD_NONBLOCK).expect("eventfd");
    c.fe.set_vring_call(0, &call).expect("SET_VRING_CALL");
    // REPLY_ACK: the backend has handled the message once it answered.
    let readable = common::try_wait_for(WAIT, || call.read().ok()).is_some();
    assert!(
        readable,
        "the call fd was not signalled after SET_VRING_CALL"
    );
    // The queue goes on with the new call fd.
    c.epoll
        .ctl(
            ControlOperation::Delete,
            c.queues[0].call.as_raw_fd(),
            EpollEvent::new(EventSet::IN, 0),
        )
        .expect("epoll del");
    c.epoll
        .ctl(
            ControlOperation::Add,
            call.as_raw_fd(),
            EpollEvent::new(EventSet::IN, 0),
        )
        .expect("epoll add");
    c.queues[0].call = call;
    end(server, c);
}

/// A request in service for a long time (100 s of emulated latency) while
/// the frontend stops the ring (GET_VRING_BASE waits for it): SIGTERM still
/// ends the daemon once the stop's drain time (here 1 s) is over; neither
/// wait holds the queue's lock while it sleeps.
#[test]
fn shutdown_is_not_held_by_a_request_in_service() {
    blklab_only("blklab's emulated latency and counters");
    let (server, ctl, _log) = spawn_logged(&["--latency", "100s", "--drain-timeout", "1s"]);
    let mut c = server.connect();
    let data = pattern(4096, 21);
    let (segs, _, _) = c.blk_segs(VIRTIO_BLK_T_OUT, 8, &Data::Out(&data));
    c.submit(0, &segs);
    common::wait_for_counters(&ctl, 0, 0, &[("requests", 1)]);
    let stopper = std::thread::spawn(move || {
        let r = c.fe.get_vring_base(0).map_err(|e| e.to_string());
        (r, c)
    });
    // Let GET_VRING_BASE arrive (if it has not yet, SIGTERM ends the
    // connection first and the test passes either way).
    std::thread::sleep(MAYBE_WAIT);
    let Server::Blklab(mut d) = server else {
        unreachable!()
    };
    let st = d.terminate();
    eprintln!("blklab serve exited with {st}");
    // The frontend got its answer (or the connection ended).
    let _ = stopper.join();
}

/// The write cache is per connection: a guest that turns it off (writes 0
/// to the config space's `writeback` byte) leaves the next connection in
/// the configured mode, write-back.
#[test]
fn cache_mode_starts_over_with_each_connection() {
    const VIRTIO_BLK_F_CONFIG_WCE: u64 = 1 << 11;
    const WRITEBACK: usize = 32;
    let (server, mut c) = start();
    assert!(c.has(VIRTIO_BLK_F_CONFIG_WCE), "CONFIG_WCE not offered");
    assert_eq!(c.config()[WRITEBACK], 1, "connection 1 starts write-back");
    c.fe.set_config(WRITEBACK as u32, VhostUserConfigFlags::WRITABLE, &[0])
        .expect("SET_CONFIG writeback=0");
    assert_eq!(c.config()[WRITEBACK], 0, "write-through set");
    c.check_serving(0);
    drop(c);
    for round in 0..2 {
        let mut c = server.connect();
        assert_eq!(
            c.config()[WRITEBACK],
            1,
            "connection {} starts write-back",
            round + 2
        );
        c.check_serving(round);
        if round == 1 {
            end(server, c);
            return;
        }
    }
}

/// Peak resident set of process `pid` (VmHWM), bytes.
fn peak_rss(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM");
    kb * 1024
}

/// `blklab serve` on a sparse 4 GiB image opened with O_DIRECT, with `extra`
/// arguments; the image's directory goes with the daemon.
fn direct_daemon(extra: &[&str]) -> (common::Daemon, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let img = format!("file:{}", dir.path().join("disk.img").display());
    let mut args = vec![
        "--disk",
        &img,
        "--size",
        "4G",
        "--direct",
        "--num-queues",
        "2",
        "--queue-size",
        "64",
    ];
    args.extend_from_slice(extra);
    (common::Daemon::spawn(&args, 1), dir)
}

/// Submit a read of `n` data descriptors of `len` bytes, all at the same
/// unaligned guest address (so O_DIRECT must bounce), through an indirect
/// table; returns (status, used length).
fn same_pages_read(c: &mut Conn, n: usize, len: u32) -> (u8, u32) {
    let buf = c.alloc(len as usize + 16, 0) + 1;
    let hdr = c.header(VIRTIO_BLK_T_IN, 0);
    let st = c.status_byte();
    let mut segs = vec![r(hdr, 16)];
    segs.extend(std::iter::repeat(w(buf, len)).take(n));
    segs.push(w(st, 1));
    let head = c.write_indirect(0, &segs);
    c.publish(0, head);
    c.kick(0);
    let used = c.expect_used(0, head);
    (c.byte(st), used)
}

/// A guest cannot size a host allocation: with `--direct`, requests whose
/// unaligned buffers are bounced go through a bounded buffer, and requests
/// over the advertised seg_max / size_max, or over the 2 GiB transfer limit,
/// fail with IOERR. The daemon's peak memory stays bounded throughout and
/// it keeps serving.
#[test]
fn direct_hostile_requests_bounded() {
    const MIB: u32 = 1 << 20;
    // What the daemon may grow by: the bounce buffer is 1 MiB; a
    // whole-request buffer would be 62 MiB, then 2 GiB.
    const BOUND: u64 = 32 << 20;

    // Advertised limits: seg_max = 64 - 2, size_max = 1 MiB.
    let (mut d, _dir) = direct_daemon(&[]);
    let mut c = Conn::connect(&d.socket, &Setup::default());
    let cfg = c.config();
    let size_max = u32::from_le_bytes(cfg[8..12].try_into().unwrap());
    let seg_max = u32::from_le_bytes(cfg[12..16].try_into().unwrap());
    assert_eq!((size_max, seg_max), (MIB, 62));
    c.check_serving(0);
    let base = peak_rss(d.pid());
    // At the limits: 62 MiB, bounced.
    assert_eq!(
        same_pages_read(&mut c, 62, MIB),
        (VIRTIO_BLK_S_OK, 62 * MIB + 1)
    );
    let peak = peak_rss(d.pid());
    assert!(
        peak < base + BOUND,
        "peak RSS grew from {base} to {peak} bytes"
    );
    // One segment too many, one segment too long.
    assert_eq!(
        same_pages_read(&mut c, 63, 4096),
        (VIRTIO_BLK_S_IOERR, 1),
        "over seg_max"
    );
    assert_eq!(
        same_pages_read(&mut c, 1, MIB + 512),
        (VIRTIO_BLK_S_IOERR, 1),
        "over size_max"
    );
    let peak = peak_rss(d.pid());
    assert!(
        peak < base + BOUND,
        "peak RSS grew from {base} to {peak} bytes"
    );
    c.check_serving(0);
    c.check_serving(1);
    assert!(d.alive(), "daemon died");
    drop(c);
    d.terminate();

    // No segment limits offered: 2047 MiB in one request is served
    // (bounced piece by piece), 2049 MiB is over the transfer limit.
    let (mut d, _dir) = direct_daemon(&["--disable-features", "seg-max,size-max"]);
    let mut c = Conn::connect(&d.socket, &Setup::default());
    assert!(!c.has(VIRTIO_BLK_F_SEG_MAX));
    c.check_serving(0);
    let base = peak_rss(d.pid());
    assert_eq!(
        same_pages_read(&mut c, 2047, MIB),
        (VIRTIO_BLK_S_OK, 2047 * MIB + 1)
    );
    let peak = peak_rss(d.pid());
    assert!(
        peak < base + BOUND,
        "peak RSS grew from {base} to {peak} bytes"
    );
    assert_eq!(
        same_pages_read(&mut c, 2049, MIB),
        (VIRTIO_BLK_S_IOERR, 1),
        "over the transfer limit"
    );
    let peak = peak_rss(d.pid());
    assert!(
        peak < base + BOUND,
        "peak RSS grew from {base} to {peak} bytes"
    );
    c.check_serving(0);
    c.check_serving(1);
    assert!(d.alive(), "daemon died");
    drop(c);
    d.terminate();
}

/// The backend reads and writes the rings through host pointers checked
/// once per memory table and ring address change. Rings that end exactly
/// at a region's end are served (every part's last bytes: used_event,
/// avail_event); one byte further is a broken ring, counted, the other
/// queue unaffected, and a reset with good addresses serves again.
#[test]
fn rings_ending_at_a_regions_end() {
    blklab_only("blklab's ring checks and counters");
    let (server, mut c) = start();
    let n = u64::from(QSIZE);
    // Queue 0: the used ring (4-byte aligned) as close to the end as it
    // can be, the avail ring just below it, the table below that.
    let used = (MEM_SIZE - (6 + 8 * n)) & !3;
    let avail = (used - (6 + 2 * n)) & !1;
    let desc = (avail - 16 * n) & !15;
    c.relocate_ring(0, desc, avail, used);
    // Wrap the ring a few times: every slot, and both event fields.
    for _ in 0..3 * QSIZE / 2 {
        c.check_serving(0);
    }
    c.check_serving(1);
    // Queue 1: the avail ring's used_event in the region's last 2 bytes
    // (where queue 0's used ring was: the rings of two queues must not
    // overlap, so queue 0 moves back first, and queue 1 after).
    let q0 = RING_BASE;
    let q1 = RING_BASE + RING_STRIDE;
    c.relocate_ring(0, q0, q0 + 0x1000, q0 + 0x2000);
    let avail1 = MEM_SIZE - (6 + 2 * n);
    c.relocate_ring(1, desc - 0x2000, avail1 & !1, used - 0x1000);
    for _ in 0..QSIZE {
        c.check_serving(1);
    }
    c.relocate_ring(1, q1, q1 + 0x1000, q1 + 0x2000);
    // One aligned step further: the used ring ends past memory.
    c.relocate_ring(0, desc, avail, used + 4);
    let _ = c.submit(0, &[r(BUF_BASE, 16), w(BUF_BASE + 16, 1)]);
    assert!(
        c.wait_used(0, MAYBE_WAIT).is_none(),
        "a ring past guest memory was used"
    );
    c.check_serving(1);
    // A reset with good addresses serves again.
    c.relocate_ring(0, desc, avail, used);
    c.check_serving(0);
    end(server, c);
}

/// The memory table changes under rings the backend has cached: a new
/// region's buffers are served at once (the worker does not keep using a
/// stale table), and after the region is removed its buffers are IOERR
/// while the rings in region 0 keep working.
#[test]
fn memory_table_replaced_under_cached_rings() {
    blklab_only("blklab's cached rings");
    let (server, mut c) = start();
    c.check_serving(0);
    c.check_serving(1);
    const EXTRA: u64 = 0x2_0000_0000;
    c.add_region(EXTRA, 1 << 20);
    // A write from the new region and a read into it.
    let data = pattern(4096, 99);
    c.mem
        .write_slice(&data, GuestAddress(EXTRA + 0x1000))
        .unwrap();
    for q in 0..NUM_QUEUES {
        let hdr = c.header(VIRTIO_BLK_T_OUT, 2048);
        let st = c.status_byte();
        let head = c.submit(q, &[r(hdr, 16), r(EXTRA + 0x1000, 4096), w(st, 1)]);
        c.expect_used(q, head);
        assert_eq!(
            c.byte(st),
            VIRTIO_BLK_S_OK,
            "queue {q}: write from the new region"
        );
        c.mem
            .write_slice(&[0u8; 4096], GuestAddress(EXTRA + 0x3000))
            .unwrap();
        let hdr = c.header(VIRTIO_BLK_T_IN, 2048);
        let st = c.status_byte();
        let head = c.submit(q, &[r(hdr, 16), w(EXTRA + 0x3000, 4096), w(st, 1)]);
        assert_eq!(c.expect_used(q, head), 4097);
        assert_eq!(
            c.byte(st),
            VIRTIO_BLK_S_OK,
            "queue {q}: read into the new region"
        );
        assert!(c.read(EXTRA + 0x3000, 4096) == data, "queue {q}: read-back");
    }
    c.remove_region(EXTRA);
    for q in 0..NUM_QUEUES {
        let hdr = c.header(VIRTIO_BLK_T_OUT, 2048);
        let st = c.status_byte();
        let head = c.submit(q, &[r(hdr, 16), r(EXTRA + 0x1000, 4096), w(st, 1)]);
        c.expect_used(q, head);
        assert_eq!(
            c.byte(st),
            VIRTIO_BLK_S_IOERR,
            "queue {q}: a removed region's buffer"
        );
        c.check_serving(q);
    }
    end(server, c);
}

/// The region holding a queue's rings is removed while the backend has
/// them cached: the queue is broken (never served from the old mapping),
/// the other queue serves on, and once the driver gives the queue rings in
/// guest memory again it is served again.
#[test]
fn region_with_cached_rings_removed() {
    blklab_only("blklab's cached rings and counters");
    let (server, mut c) = start();
    const EXTRA: u64 = 0x2_0000_0000;
    c.add_region(EXTRA, 1 << 20);
    c.relocate_ring(1, EXTRA, EXTRA + 0x1000, EXTRA + 0x2000);
    for _ in 0..4 {
        c.check_serving(1);
    }
    c.remove_region(EXTRA);
    // The frontend still sees the old rings: offer a request there.
    let hdr = c.header(VIRTIO_BLK_T_FLUSH, 0);
    let st = c.status_byte();
    let _ = c.submit(1, &[r(hdr, 16), w(st, 1)]);
    assert!(
        c.wait_used(1, MAYBE_WAIT).is_none(),
        "a ring outside guest memory was used"
    );
    assert_eq!(c.byte(st), STATUS_UNTOUCHED);
    c.check_serving(0);
    c.relocate_ring(
        1,
        RING_BASE + RING_STRIDE,
        RING_BASE + RING_STRIDE + 0x1000,
        RING_BASE + RING_STRIDE + 0x2000,
    );
    c.check_serving(1);
    end(server, c);
}

// ---------------------------------------------------------------------------
// Ring rules a frontend or guest can break at will (virtio 1.2 §2.7,
// vhost-user's ring life cycle)
// ---------------------------------------------------------------------------

impl Conn {
    /// Start queue `q` again (after GET_VRING_BASE) from avail index
    /// `base`, on the rings it had, the way QEMU resumes a stopped ring.
    fn restart(&mut self, q: usize, base: u16) {
        self.fe.set_vring_num(q, QSIZE).expect("SET_VRING_NUM");
        self.fe.set_vring_base(q, base).expect("SET_VRING_BASE");
        let vq = &self.queues[q];
        let cfg = VringConfigData {
            queue_max_size: QSIZE,
            queue_size: QSIZE,
            flags: 0,
            desc_table_addr: self.hva_base + vq.desc,
            used_ring_addr: self.hva_base + vq.used,
            avail_ring_addr: self.hva_base + vq.avail,
            log_addr: None,
        };
        self.fe.set_vring_addr(q, &cfg).expect("SET_VRING_ADDR");
        self.fe.set_vring_call(q, &vq.call).expect("SET_VRING_CALL");
        self.fe.set_vring_kick(q, &vq.kick).expect("SET_VRING_KICK");
        self.enable(q);
    }

    /// Offer a FLUSH on queue `q` and kick; returns its head and the
    /// address of its status byte.
    fn offer_flush(&mut self, q: usize) -> (u16, u64) {
        let hdr = self.header(VIRTIO_BLK_T_FLUSH, 0);
        let st = self.status_byte();
        (self.submit(q, &[r(hdr, 16), w(st, 1)]), st)
    }

    /// Move queue `q`'s rings into a new 1 MiB region at `at` (`off` bytes
    /// in), serve a request there, then take the region away from the
    /// backend (our mapping stays).
    fn serve_from_a_region_then_remove_it(&mut self, q: usize, at: u64, off: u64) {
        self.add_region(at, 1 << 20);
        self.relocate_ring(q, at + off, at + 0x1000 + off, at + 0x2000 + off);
        self.check_serving(q);
        self.remove_region(at);
    }

    /// Give queue `q` its own rings back, from index 0 (a driver reset).
    fn reset_rings(&mut self, q: usize) {
        let b = RING_BASE + q as u64 * RING_STRIDE;
        self.relocate_ring(q, b, b + 0x1000, b + 0x2000);
    }
}

/// The used ring laid over the avail ring, avail->idx one ahead of the
/// base: each used entry the device adds would raise the index it pops
/// against. The ring is refused (broken, counted), GET_VRING_BASE is
/// answered, the other queue serves, a new connection is served and
/// SIGTERM ends the daemon.
#[test]
fn used_ring_over_the_avail_ring_is_refused() {
    blklab_only("blklab's counters and log");
    let (server, ctl, log) = spawn_logged(&[]);
    let mut c = server.connect();
    c.fe.get_vring_base(1).expect("GET_VRING_BASE");
    c.queues[1].used = c.queues[1].avail;
    let hdr = c.header(VIRTIO_BLK_T_FLUSH, 0);
    let st = c.status_byte();
    let head = c.write_chain(1, &[r(hdr, 16), w(st, 1)]);
    c.publish(1, head);
    let before = log_lines(&log).len();
    c.restart(1, 0);
    c.kick(1);
    common::wait_for_counters(&ctl, 0, 1, &[("ring_errors", 1)]);
    assert_eq!(
        c.byte(st),
        STATUS_UNTOUCHED,
        "the overlapping ring was served"
    );
    let t = Instant::now();
    c.fe.get_vring_base(1)
        .expect("GET_VRING_BASE after the overlap");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "GET_VRING_BASE took {:?}",
        t.elapsed()
    );
    c.check_serving(0);
    assert_log_short(&log, before, "an overlapping ring");
    assert!(
        log_lines(&log)[before..]
            .iter()
            .any(|l| l.contains("avail ring and the used ring overlap")),
        "no refusal logged"
    );
    // Queue 1 gets proper rings back.
    c.reset_rings(1);
    c.check_serving(1);
    drop(c);
    let c = server.connect();
    end(server, c);
}

/// Queue 1's used ring over queue 0's avail ring: two queues that would
/// feed each other. The second ring to be served is refused.
#[test]
fn rings_of_two_queues_that_cross_are_refused() {
    blklab_only("blklab's counters and log");
    let (server, ctl, log) = spawn_logged(&[]);
    let mut c = server.connect();
    c.check_serving(0);
    c.fe.get_vring_base(1).expect("GET_VRING_BASE");
    c.queues[1].used = c.queues[0].avail;
    let before = log_lines(&log).len();
    c.restart(1, 0);
    let hdr = c.header(VIRTIO_BLK_T_FLUSH, 0);
    let st = c.status_byte();
    let _ = c.write_chain(1, &[r(hdr, 16), w(st, 1)]);
    // Only the avail index: its entry would sit in queue 0's ring.
    c.queues[1].avail_idx = 1;
    c.set_avail_idx(1, 1);
    c.kick(1);
    common::wait_for_counters(&ctl, 0, 1, &[("ring_errors", 1)]);
    assert!(log_lines(&log)[before..]
        .iter()
        .any(|l| l.contains("overlaps the avail ring of queue 0")));
    c.check_serving(0);
    c.reset_rings(1);
    end(server, c);
}

/// A request kicked just before GET_VRING_BASE, many times over: it is
/// either served before the reply (and counted in the base) or not at
/// all; nothing lands on the used ring after the reply, and after a
/// restart from the base every request has been served exactly once.
#[test]
fn nothing_is_served_after_get_vring_base() {
    blklab_only("blklab's counters");
    let (server, mut c) = start();
    for trial in 0..150 {
        let q = trial % NUM_QUEUES;
        let (head, st) = c.offer_flush(q);
        let base = c.fe.get_vring_base(q).expect("GET_VRING_BASE") as u16;
        let at_reply = c.used_idx(q);
        std::thread::sleep(Duration::from_millis(5));
        let later = c.used_idx(q);
        assert_eq!(
            at_reply, later,
            "trial {trial}: used->idx moved after GET_VRING_BASE was answered"
        );
        assert_eq!(
            base, at_reply,
            "trial {trial}: the base does not count what was served"
        );
        c.restart(q, base);
        if base != c.queues[q].avail_idx {
            c.kick(q);
        }
        c.expect_used(q, head);
        assert_eq!(c.byte(st), VIRTIO_BLK_S_OK);
        assert!(
            c.wait_used(q, Duration::from_millis(2)).is_none(),
            "trial {trial}: a request was served twice"
        );
        assert_eq!(c.used_idx(q), c.queues[q].avail_idx, "trial {trial}");
    }
    end(server, c);
}

/// SET_VRING_NUM with a size that is not a power of 2 (virtio 1.2 §2.7:
/// a split ring's is). vhost-user-backend acknowledges the message itself
/// (it checks only the range); the size is kept from the queue, the
/// refusal logged once per connection however often it comes, and the
/// ring never started with it: SET_VRING_ADDR fails (which ends the
/// connection, as every failed message does), and a ring resumed on its
/// old addresses is not served until a valid size is set. Nothing is
/// written past the ring the driver declared; the daemon serves on.
#[test]
fn a_queue_size_not_a_power_of_2_is_refused() {
    blklab_only("blklab's log");
    const BAD: u16 = 48;
    let (server, _ctl, log) = spawn_logged(&[]);
    let refusals = || {
        log_lines(&log)
            .iter()
            .filter(|l| l.contains("refusing queue size 48"))
            .count()
    };
    // Connection 1: the size, then SET_VRING_ADDR.
    let c = server.connect();
    c.fe.get_vring_base(1).expect("GET_VRING_BASE");
    for _ in 0..5 {
        c.fe.set_vring_num(1, BAD)
            .expect("SET_VRING_NUM (acknowledged)");
    }
    c.fe.set_vring_base(1, 0).expect("SET_VRING_BASE");
    let vq = &c.queues[1];
    let cfg = VringConfigData {
        queue_max_size: QSIZE,
        queue_size: BAD,
        flags: 0,
        desc_table_addr: c.hva_base + vq.desc,
        used_ring_addr: c.hva_base + vq.used,
        avail_ring_addr: c.hva_base + vq.avail,
        log_addr: None,
    };
    assert!(
        c.fe.set_vring_addr(1, &cfg).is_err(),
        "SET_VRING_ADDR accepted after a queue size of {BAD}"
    );
    drop(c);
    assert_eq!(refusals(), 1, "{:?}", log_lines(&log));

    // Connection 2: the size, then the ring resumed on its addresses.
    let mut c = server.connect();
    c.check_serving(1);
    let before = log_lines(&log).len();
    c.fe.get_vring_base(1).expect("GET_VRING_BASE");
    let base = c.queues[1].avail_idx;
    let used = c.queues[1].used;
    let tail = used + 6 + 8 * u64::from(BAD);
    let guard = vec![0xa5u8; (used + 0x1000 - tail) as usize];
    c.mem.write_slice(&guard, GuestAddress(tail)).unwrap();
    for _ in 0..5 {
        c.fe.set_vring_num(1, BAD)
            .expect("SET_VRING_NUM (acknowledged)");
    }
    c.fe.set_vring_base(1, base).expect("SET_VRING_BASE");
    c.fe.set_vring_call(1, &c.queues[1].call)
        .expect("SET_VRING_CALL");
    c.fe.set_vring_kick(1, &c.queues[1].kick)
        .expect("SET_VRING_KICK");
    c.enable(1);
    let (head, st) = c.offer_flush(1);
    assert!(
        c.wait_used(1, MAYBE_WAIT).is_none(),
        "a refused ring was served"
    );
    assert_eq!(c.byte(st), STATUS_UNTOUCHED);
    let mut now = vec![0u8; guard.len()];
    c.mem.read_slice(&mut now, GuestAddress(tail)).unwrap();
    assert!(now == guard, "written past the declared ring");
    assert_eq!(refusals(), 2, "{:?}", &log_lines(&log)[before..]);
    assert_log_short(&log, before, "five refused queue sizes");
    c.check_serving(0);
    // A valid size: the queue resumes from its base and serves the
    // request it holds.
    c.fe.get_vring_base(1).expect("GET_VRING_BASE");
    c.mem
        .write_slice(&vec![0u8; guard.len()], GuestAddress(tail))
        .unwrap();
    c.restart(1, base);
    c.kick(1);
    c.expect_used(1, head);
    assert_eq!(c.byte(st), VIRTIO_BLK_S_OK);
    end(server, c);
}

/// A ring aligned in guest addresses whose region is then moved by one
/// byte in the backend's mapping (the region removed and a region one
/// byte lower added: the guest address and the mapping now disagree in
/// their low bits). vhost-user-backend checks nothing at a memory change;
/// the ring is refused when it is checked against the new table, never
/// accessed with misaligned atomics, and the daemon serves on.
#[test]
fn a_ring_misaligned_in_the_host_mapping_is_refused() {
    blklab_only("blklab's counters and log");
    let (server, ctl, log) = spawn_logged(&[]);
    let mut c = server.connect();
    const EXTRA: u64 = 0x2_0000_0000;
    c.serve_from_a_region_then_remove_it(1, EXTRA, 0x10);
    // The backend alone gets the moved region (our view keeps the old one).
    // SAFETY: memfd_create(2) with a valid NUL-terminated name.
    let fd = unsafe { libc::memfd_create(c"raw-frontend-moved".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: a fresh fd nobody else owns.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len((1 << 20) + 4096).unwrap();
    let moved: vm_memory::GuestRegionMmap = vm_memory::GuestRegionMmap::from_range(
        GuestAddress(EXTRA - 1),
        (1 << 20) + 4096,
        Some(FileOffset::new(file, 0)),
    )
    .unwrap();
    let info = VhostUserMemoryRegionInfo::from_guest_region(&moved).unwrap();
    let before = log_lines(&log).len();
    c.fe.add_mem_region(&info).expect("ADD_MEM_REG");
    c.kick(1);
    common::wait_for_counters(&ctl, 0, 1, &[("ring_errors", 1)]);
    assert!(
        log_lines(&log)[before..]
            .iter()
            .any(|l| l.contains("the region's guest address and its mapping disagree")),
        "{:?}",
        &log_lines(&log)[before..]
    );
    c.check_serving(0);
    c.fe.remove_mem_region(&info).expect("REM_MEM_REG");
    c.reset_rings(1);
    end(server, c);
}

/// The region holding a queue's rings is removed, the guest kicks, and
/// the same region is added back: the queue serves the request it was
/// kicked for without another kick, and serves on.
#[test]
fn a_queue_whose_memory_comes_back_is_served() {
    blklab_only("blklab's counters");
    let (server, ctl, _) = spawn_logged(&[]);
    let mut c = server.connect();
    const EXTRA: u64 = 0x2_0000_0000;
    c.serve_from_a_region_then_remove_it(1, EXTRA, 0);
    let (head, st) = c.offer_flush(1);
    common::wait_for_counters(&ctl, 0, 1, &[("ring_errors", 1)]);
    assert!(
        c.wait_used(1, MAYBE_WAIT).is_none(),
        "served without its memory"
    );
    let region = c.mem.find_region(GuestAddress(EXTRA)).unwrap();
    let info = VhostUserMemoryRegionInfo::from_guest_region(region).unwrap();
    c.fe.add_mem_region(&info).expect("ADD_MEM_REG again");
    c.expect_used(1, head);
    assert_eq!(c.byte(st), VIRTIO_BLK_S_OK);
    c.check_serving(1);
    end(server, c);
}

// ---------------------------------------------------------------------------
// Stopping, replacing and reconnecting the daemon
// ---------------------------------------------------------------------------

/// One request offered to the backend: its head, status byte and sector.
struct Offered {
    head: u16,
    status: u64,
    sector: u64,
}

/// Offer `n` 4 KiB writes on queue `q` (sectors `first`, `first + 8`, …,
/// each its own pattern, seeded by its sector) and kick once; nothing is
/// waited for.
fn offer_writes(c: &mut Conn, q: usize, first: u64, n: u64) -> Vec<Offered> {
    let offered = (0..n)
        .map(|i| {
            let sector = first + 8 * i;
            let data = pattern(4096, sector);
            let (segs, _, status) = c.blk_segs(VIRTIO_BLK_T_OUT, sector, &Data::Out(&data));
            let head = c.write_chain(q, &segs);
            c.publish(q, head);
            Offered {
                head,
                status,
                sector,
            }
        })
        .collect();
    c.kick(q);
    offered
}

/// The used entries of queue `q` (`used`, as (id, len)) are exactly the
/// requests `offered`, each once, completed OK.
fn assert_used_once(c: &Conn, q: usize, offered: &[Offered], used: &[(u32, u32)]) {
    let mut got: Vec<u32> = used.iter().map(|(id, _)| *id).collect();
    let mut want: Vec<u32> = offered.iter().map(|o| u32::from(o.head)).collect();
    got.sort_unstable();
    want.sort_unstable();
    assert_eq!(got, want, "queue {q}: used entries");
    assert!(used.iter().all(|(_, len)| *len == 1), "queue {q}: {used:?}");
    for o in offered {
        assert_eq!(
            c.byte(o.status),
            VIRTIO_BLK_S_OK,
            "queue {q}: head {}",
            o.head
        );
    }
}

/// Send `sig` to daemon `d`, without waiting for it.
fn signal(d: &common::Daemon, sig: libc::c_int) {
    // SAFETY: kill(2) on our own child's pid; no memory is involved.
    assert_eq!(unsafe { libc::kill(d.pid(), sig) }, 0);
}

/// Wait until the daemon has closed `c`'s vhost-user connection (end of
/// file on its socket: the daemon sends nothing unasked on it).
fn wait_for_close(c: &Conn) {
    let fd = c.fe.as_raw_fd();
    common::wait_until("the daemon to close the connection", || {
        let mut b = 0u8;
        // SAFETY: recv(2) of at most one byte into `b`, which we own;
        // MSG_PEEK leaves anything there queued.
        let n = unsafe {
            libc::recv(
                fd,
                (&mut b as *mut u8).cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        n == 0
    });
}

/// Wait for daemon `d` to exit by itself; it must succeed.
fn wait_for_exit(d: &mut common::Daemon) {
    let st = common::wait_for("the daemon to exit", common::PATIENCE, || d.exited());
    assert!(st.success(), "blklab serve exited with {st}");
}

/// A `blklab serve` of the raw-frontend disk plus `extra`, writing its final
/// statistics into a file of `out`; returns the daemon, its control
/// socket, its log and the statistics file.
fn spawn_with_stats_out(
    extra: &[&str],
    out: &tempfile::TempDir,
) -> (common::Daemon, PathBuf, PathBuf, PathBuf) {
    let stats = out.path().join("stats.json");
    let stats_arg = stats.display().to_string();
    let mut args = extra.to_vec();
    args.extend(["--stats-out", &stats_arg]);
    let (server, ctl, log) = spawn_logged(&args);
    let Server::Blklab(d) = server else {
        unreachable!("spawn_logged starts blklab")
    };
    (d, ctl, log, stats)
}

/// `completed_early` of every queue in a stats document.
fn completed_early(doc: &serde_json::Value) -> Vec<u64> {
    (0..NUM_QUEUES)
        .map(|q| {
            doc["disks"][0]["queues"][q]["counters"]["completed_early"]
                .as_u64()
                .expect("completed_early")
        })
        .collect()
}

/// SIGTERM with writes in service that complete out of order (emulated
/// latency): the daemon pops nothing more, completes every one at its
/// emulated time onto the used ring, and only then closes the connection.
#[test]
fn a_stop_completes_every_request_in_service_before_closing() {
    blklab_only("blklab's emulated latency and graceful stop");
    let out = tempfile::tempdir().unwrap();
    let (mut d, ctl, log, stats) = spawn_with_stats_out(
        &[
            "--write-latency",
            "uniform:2s..5s",
            "--drain-timeout",
            "3600s",
        ],
        &out,
    );
    let mut c = Conn::connect(&d.socket, &Setup::default());
    let offered: Vec<_> = (0..NUM_QUEUES)
        .map(|q| offer_writes(&mut c, q, 4096 * q as u64, 8))
        .collect();
    for q in 0..NUM_QUEUES {
        common::wait_for_counters(&ctl, 0, q, &[("requests", 8)]);
    }
    signal(&d, libc::SIGTERM);
    wait_for_close(&c);
    for (q, offered) in offered.iter().enumerate() {
        let used = c.drain(q, Duration::ZERO);
        assert_used_once(&c, q, offered, &used);
    }
    wait_for_exit(&mut d);
    // Each at its emulated time, none cut short.
    assert_eq!(completed_early(&common::read_json(&stats)), [0, 0]);
    assert!(
        log_lines(&log)
            .iter()
            .any(|l| l.contains("every request in service is on the used ring")),
        "{:?}",
        log_lines(&log)
    );
}

/// Requests whose emulated time is an hour away: the stop waits for them
/// for `--drain-timeout` only, then completes them at once, still before
/// closing; the statistics count them as completed early.
#[test]
fn a_stop_past_its_drain_time_completes_the_rest_at_once() {
    blklab_only("blklab's emulated latency and graceful stop");
    let out = tempfile::tempdir().unwrap();
    let (mut d, ctl, _log, stats) = spawn_with_stats_out(
        &["--write-latency", "3600s", "--drain-timeout", "300ms"],
        &out,
    );
    let mut c = Conn::connect(&d.socket, &Setup::default());
    let offered: Vec<_> = (0..NUM_QUEUES)
        .map(|q| offer_writes(&mut c, q, 0, 5))
        .collect();
    for q in 0..NUM_QUEUES {
        common::wait_for_counters(&ctl, 0, q, &[("requests", 5)]);
    }
    assert_eq!((c.used_idx(0), c.used_idx(1)), (0, 0));
    signal(&d, libc::SIGTERM);
    wait_for_close(&c);
    for (q, offered) in offered.iter().enumerate() {
        let used = c.drain(q, Duration::ZERO);
        assert_used_once(&c, q, offered, &used);
    }
    wait_for_exit(&mut d);
    assert_eq!(completed_early(&common::read_json(&stats)), [5, 5]);
}

/// A second SIGTERM while the stop waits (here for an hour) ends the wait:
/// the requests in service complete at once, onto the used ring, before
/// the connection closes.
#[test]
fn a_second_signal_completes_the_requests_in_service_at_once() {
    blklab_only("blklab's emulated latency and graceful stop");
    let out = tempfile::tempdir().unwrap();
    let (mut d, ctl, log, stats) = spawn_with_stats_out(
        &["--write-latency", "3600s", "--drain-timeout", "3600s"],
        &out,
    );
    let mut c = Conn::connect(&d.socket, &Setup::default());
    let offered: Vec<_> = (0..NUM_QUEUES)
        .map(|q| offer_writes(&mut c, q, 0, 3))
        .collect();
    for q in 0..NUM_QUEUES {
        common::wait_for_counters(&ctl, 0, q, &[("requests", 3)]);
    }
    signal(&d, libc::SIGTERM);
    // The first signal must have been taken before the second is sent
    // (two pending SIGTERMs are one).
    common::wait_until("the stop to wait for 6 requests", || {
        log_lines(&log)
            .iter()
            .any(|l| l.contains("completing 6 request(s) in service"))
    });
    signal(&d, libc::SIGTERM);
    wait_for_close(&c);
    for (q, offered) in offered.iter().enumerate() {
        let used = c.drain(q, Duration::ZERO);
        assert_used_once(&c, q, offered, &used);
    }
    wait_for_exit(&mut d);
    assert_eq!(completed_early(&common::read_json(&stats)), [3, 3]);
}

/// The daemon replaced under a running guest: SIGTERM with writes in
/// service (completing out of order), more writes made available while it
/// stops; the next daemon, on the same socket and image, reached as QEMU
/// reconnects (each ring from its used index, its kick pending), serves
/// exactly the writes the first did not pop: none lost, none twice, and
/// every write's data is on the image.
#[test]
fn a_replaced_daemon_serves_on_from_the_used_index() {
    blklab_only("blklab's graceful stop");
    let img_dir = tempfile::tempdir().unwrap();
    let img = format!("file:{}", img_dir.path().join("disk.img").display());
    let args = [
        "--disk",
        &img,
        "--size",
        "64M",
        "--num-queues",
        "2",
        "--queue-size",
        "64",
        "--write-latency",
        "uniform:300ms..1500ms",
    ];
    let (mut first_daemon, log) = common::Daemon::with_control_logged(&args);
    let ctl = first_daemon.control().to_path_buf();
    let mut c = Conn::connect(&first_daemon.socket, &Setup::default());
    let first: Vec<_> = (0..NUM_QUEUES)
        .map(|q| offer_writes(&mut c, q, 8192 * q as u64, 8))
        .collect();
    for q in 0..NUM_QUEUES {
        common::wait_for_counters(&ctl, 0, q, &[("requests", 8)]);
    }
    signal(&first_daemon, libc::SIGTERM);
    common::wait_until("the stop to begin", || {
        log_lines(&log)
            .iter()
            .any(|l| l.contains("request(s) in service before closing"))
    });
    // Made available while the daemon stops: left on the avail ring.
    let later: Vec<_> = (0..NUM_QUEUES)
        .map(|q| offer_writes(&mut c, q, 8192 * q as u64 + 1024, 6))
        .collect();
    wait_for_close(&c);
    for q in 0..NUM_QUEUES {
        let used = c.drain(q, Duration::ZERO);
        assert_used_once(&c, q, &first[q], &used);
        for o in &later[q] {
            assert_eq!(c.byte(o.status), STATUS_UNTOUCHED, "popped while stopping");
        }
    }
    wait_for_exit(&mut first_daemon);

    let mut next = common::Daemon::spawn_at(
        tempfile::tempdir().unwrap(),
        first_daemon.socket.clone(),
        &args,
        1,
    );
    let mut c = c.resume(&next.socket);
    for (q, later) in later.iter().enumerate() {
        let used: Vec<(u32, u32)> = (0..later.len())
            .map(|i| {
                c.wait_used(q, WAIT).unwrap_or_else(|| {
                    panic!("queue {q}: {i} of {} later writes served", later.len())
                })
            })
            .collect();
        assert_used_once(&c, q, later, &used);
        assert_eq!(c.wait_used(q, MAYBE_WAIT), None, "queue {q}: served twice");
    }
    for o in first.iter().chain(&later).flatten() {
        assert!(
            c.read_ok(0, o.sector, 4096) == pattern(4096, o.sector),
            "sector {}: not the data written",
            o.sector
        );
    }
    drop(c);
    next.terminate();
}

/// The stats document of a daemon's control socket `ctl`.
fn stats_doc(ctl: &Path) -> serde_json::Value {
    blklab::backend::control::query(ctl, "stats").expect("control query: stats")
}

/// Connections that end with requests in service, and with queues waiting
/// for a command slot, give every slot back and leave no waiter behind,
/// round after round, with per-queue and shared pools; each connection is
/// counted in the disk's connection generation, under one daemon identity.
#[test]
fn command_slots_come_back_when_connections_end_with_requests_in_service() {
    blklab_only("blklab's tag pools and counters");
    for tags in ["per-queue", "shared"] {
        let (server, ctl, _) =
            spawn_logged(&["--tags", tags, "--depth", "4", "--write-latency", "3600s"]);
        let Server::Blklab(d) = &server else {
            unreachable!()
        };
        let daemon = stats_doc(&ctl)["daemon"].clone();
        assert_eq!(daemon["pid"].as_i64(), Some(i64::from(d.pid())), "{daemon}");
        const ROUNDS: u64 = 8;
        for round in 1..=ROUNDS {
            let mut c = server.connect();
            for q in 0..NUM_QUEUES {
                offer_writes(&mut c, q, 0, 6);
            }
            // Every pool full and every queue waiting for a slot.
            common::wait_until("full pools with every queue waiting", || {
                let doc = stats_doc(&ctl);
                let disk = &doc["disks"][0];
                disk["connections"] == round
                    && disk["connected"] == true
                    && disk["tag_pools"].as_array().unwrap().iter().all(|p| {
                        p["in_use"] == p["depth"]
                            && p["waiting_queues"].as_u64()
                                == Some(p["queues"].as_array().unwrap().len() as u64)
                    })
            });
            drop(c);
            common::wait_until("every slot back and no waiter left", || {
                let doc = stats_doc(&ctl);
                let disk = &doc["disks"][0];
                disk["connected"] == false
                    && disk["tag_pools"].as_array().unwrap().iter().all(|p| {
                        p["in_use"] == 0
                            && p["waiting_queues"] == 0
                            && p["active_queues"] == 0
                            && p["gets"] == p["puts"]
                    })
            });
        }
        let doc = stats_doc(&ctl);
        assert_eq!(doc["daemon"], daemon, "one daemon throughout");
        assert_eq!(doc["disks"][0]["connections"], ROUNDS);
        // A snapshot (a delta) says which connections its window saw.
        let snap = |label: &str| {
            blklab::backend::control::query(&ctl, &format!("snapshot {label}")).unwrap()
        };
        let first = snap("rounds");
        assert_eq!(first["disks"][0]["connections_at_start"], 0, "{first}");
        assert_eq!(first["disks"][0]["connections"], ROUNDS);
        let second = snap("none");
        assert_eq!(second["disks"][0]["connections_at_start"], ROUNDS);
        // The next connection has the whole depth: reads are served.
        let mut c = server.connect();
        for q in 0..NUM_QUEUES {
            assert_eq!(c.read_ok(q, 0, 4096).len(), 4096);
        }
        server.finish(c);
    }
}

// ---------------------------------------------------------------------------
// Dirty logging (VHOST_F_LOG_ALL, LOG_SHMFD, SET_LOG_BASE, SET_LOG_FD)
// ---------------------------------------------------------------------------

/// A memfd of `len` bytes (a dirty log, as QEMU's `vhost_log_alloc` makes
/// one).
fn log_memfd(len: u64) -> File {
    // SAFETY: memfd_create(2) with a valid NUL-terminated name.
    let fd = unsafe { libc::memfd_create(c"raw-frontend-log".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: a fresh fd nobody else owns.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(len).expect("size the log");
    file
}

/// The guest pages marked in a log's bytes, in order.
fn marked_pages(log: &File, len: usize) -> Vec<u64> {
    use std::os::unix::fs::FileExt;
    let mut b = vec![0u8; len];
    log.read_exact_at(&mut b, 0).expect("read the log");
    (0..8 * len as u64)
        .filter(|p| b[(p / 8) as usize] & (1 << (p % 8)) != 0)
        .collect()
}

impl Conn {
    /// SET_LOG_BASE with LOG_SHMFD: `size` bytes of `log` at offset 0.
    fn set_log_base(&mut self, log: &File, size: u64) -> vhost::Result<()> {
        // SET_LOG_BASE has a reply of its own: no REPLY_ACK.
        self.fe.set_hdr_flags(VhostUserHeaderFlag::empty());
        let r = self.fe.set_log_base(
            0,
            Some(VhostUserDirtyLogRegion {
                mmap_size: size,
                mmap_offset: 0,
                mmap_handle: log.as_raw_fd(),
            }),
        );
        if self.protocol.contains(VhostUserProtocolFeatures::REPLY_ACK) {
            self.fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
        }
        r
    }

    /// SET_FEATURES with LOG_ALL on or off, as QEMU sends it when a
    /// migration starts and when it ends.
    fn log_all(&mut self, on: bool) {
        let f = if on {
            self.features | VHOST_F_LOG_ALL
        } else {
            self.features
        };
        self.fe.set_features(f).expect("SET_FEATURES");
    }

    /// One request on queue 0 whose buffers are at the given guest
    /// addresses: `segs`, then wait for it; returns its status byte.
    fn logged_request(&mut self, segs: &[Seg], status: u64) -> u8 {
        let head = self.submit(0, segs);
        self.expect_used(0, head);
        self.byte(status)
    }

    /// A read (8 KiB into a buffer that crosses two page boundaries), a
    /// write (its 8 KiB payload on pages of its own) and a GET_ID, each
    /// with its status byte, at fixed guest addresses on pages nothing else
    /// uses. Returns the pages the device writes: the read's data, the
    /// GET_ID buffer and the status bytes (not the headers, not the write's
    /// payload).
    fn logged_requests(&mut self) -> Vec<u64> {
        const AT: u64 = 0x30_0000;
        let hdr = |c: &mut Conn, i: u64, typ: u32| {
            let a = AT + 16 * i;
            c.mem
                .write_slice(&blk_header(typ, 64), GuestAddress(a))
                .unwrap();
            a
        };
        let (read_hdr, write_hdr, id_hdr) = (
            hdr(self, 0, VIRTIO_BLK_T_IN),
            hdr(self, 1, VIRTIO_BLK_T_OUT),
            hdr(self, 2, VIRTIO_BLK_T_GET_ID),
        );
        let payload = AT + 0x1000;
        self.mem
            .write_slice(&pattern(8192, 9), GuestAddress(payload))
            .unwrap();
        let (read_data, read_st, write_st) = (AT + 0x4800, AT + 0x8000, AT + 0x8fff);
        let (id_buf, id_st) = (AT + 0xa000, AT + 0xb010);
        for st in [read_st, write_st, id_st] {
            self.mem
                .write_slice(&[STATUS_UNTOUCHED], GuestAddress(st))
                .unwrap();
        }
        let write = [r(write_hdr, 16), r(payload, 8192), w(write_st, 1)];
        assert_eq!(self.logged_request(&write, write_st), VIRTIO_BLK_S_OK);
        let read = [r(read_hdr, 16), w(read_data, 8192), w(read_st, 1)];
        assert_eq!(self.logged_request(&read, read_st), VIRTIO_BLK_S_OK);
        assert!(self.read(read_data, 8192) == pattern(8192, 9));
        let id = [r(id_hdr, 16), w(id_buf, 20), w(id_st, 1)];
        assert_eq!(self.logged_request(&id, id_st), VIRTIO_BLK_S_OK);
        let page = |a: u64| a / 4096;
        vec![
            page(read_data),
            page(read_data) + 1,
            page(read_data) + 2,
            page(read_st),
            page(id_buf),
            page(id_st),
        ]
    }
}

/// VHOST_F_LOG_ALL and LOG_SHMFD offered; with a log set (SET_LOG_BASE)
/// and LOG_ALL acked, exactly the pages the device writes are marked: the
/// data of device-writable buffers, the status bytes and the used ring
/// (entries, index, avail_event), never a page it only reads. Nothing is
/// marked before LOG_ALL or after it is cleared. SET_LOG_FD's eventfd is
/// written after the marks.
#[test]
fn the_dirty_log_marks_exactly_the_pages_the_device_writes() {
    // qemu-storage-daemon 7.2 (libvhost-user) answers SET_LOG_BASE with an
    // 8-byte body where the vhost crate's frontend reads a 16-byte
    // VhostUserLog (QEMU reads whatever size the header gives): the
    // harness would wait for ever.
    blklab_only("a SET_LOG_BASE reply of the size the vhost crate's frontend reads");
    let (server, mut c) = start();
    let offered = c.fe.get_features().expect("GET_FEATURES");
    assert_ne!(offered & VHOST_F_LOG_ALL, 0, "LOG_ALL not offered");
    assert!(
        c.protocol.contains(VhostUserProtocolFeatures::LOG_SHMFD),
        "LOG_SHMFD not offered"
    );
    // 128 bytes cover the 4 MiB of guest memory; QEMU's log is a whole
    // number of 8-byte chunks, and the rest of the page stays unused.
    let log = log_memfd(4096);
    c.set_log_base(&log, 4096).expect("SET_LOG_BASE");
    let kick = EventFd::new(EFD_NONBLOCK).expect("eventfd");
    c.fe.set_log_fd(kick.as_raw_fd()).expect("SET_LOG_FD");
    c.logged_requests();
    assert_eq!(
        marked_pages(&log, 4096),
        Vec::<u64>::new(),
        "before LOG_ALL"
    );
    assert!(
        kick.read().is_err(),
        "the log fd was written before LOG_ALL"
    );

    c.log_all(true);
    let mut want = c.logged_requests();
    // The used ring of queue 0 (entries, index and avail_event) is one page.
    want.push(c.queues[0].used / 4096);
    want.sort_unstable();
    // The marks of a pass come before the log fd's write at its end.
    common::wait_for("the log fd's write", WAIT, || kick.read().ok());
    assert_eq!(marked_pages(&log, 4096), want, "with LOG_ALL");

    c.log_all(false);
    // Cleared, as QEMU's sync clears what it read.
    std::os::unix::fs::FileExt::write_all_at(&log, &[0u8; 4096], 0).unwrap();
    c.logged_requests();
    assert_eq!(marked_pages(&log, 4096), Vec::<u64>::new(), "after LOG_ALL");
    end(server, c);
}

/// A log its file does not hold (mmap size beyond the memfd's end) would
/// raise SIGBUS at the first mark: SET_LOG_BASE is refused with a warning
/// that says why, and since vhost-user has no negative reply to it the
/// connection ends; the daemon serves the next one.
#[test]
fn a_dirty_log_beyond_its_file_is_refused_and_the_daemon_serves_on() {
    blklab_only("blklab's log");
    let (mut server, _ctl, daemon_log) = spawn_logged(&[]);
    let mut c = server.connect();
    c.check_serving(0);
    let log = log_memfd(4096);
    assert!(
        c.set_log_base(&log, 8192).is_err(),
        "a log of 8192 bytes over a file of 4096 was accepted"
    );
    assert!(server.alive(), "the daemon died");
    common::wait_until("the refusal in the log", || {
        log_lines(&daemon_log).iter().any(|l| {
            l.contains("refusing the dirty log (SET_LOG_BASE)")
                && l.contains("exceeds the file's size 0x1000")
        })
    });
    drop(c);
    let c = server.connect();
    end(server, c);
}
