//! A small vhost-user frontend (the `vhost` crate's) for tests that send
//! what QEMU sends around a live migration and libblkio never does: a
//! dirty log (SET_LOG_BASE), SET_FEATURES with VHOST_F_LOG_ALL, and
//! GET_VRING_BASE followed by a restart of the ring. One queue of 16
//! entries in a memfd-backed guest memory; one request at a time (header,
//! data, status at fixed guest addresses, descriptor 0 the head).
//! `tests/raw_frontend.rs` has the full harness.
#![allow(dead_code)]

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

use vhost::vhost_user::message::VhostUserHeaderFlag;
use vhost::vhost_user::{Frontend, VhostUserFrontend, VhostUserProtocolFeatures};
use vhost::{VhostBackend, VhostUserDirtyLogRegion, VhostUserMemoryRegionInfo, VringConfigData};
use vm_memory::{Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

const MEM_SIZE: u64 = 1 << 20;
const QSIZE: u16 = 16;
const DESC: u64 = 0;
const AVAIL: u64 = 0x1000;
const USED: u64 = 0x2000;
const HEADER: u64 = 0x1_0000;
const STATUS: u64 = 0x1_0100;
const DATA: u64 = 0x2_0000;
/// The largest request's data.
pub(crate) const MAX_DATA: usize = 0x1_0000;

/// VHOST_F_LOG_ALL.
const LOG_ALL: u64 = 1 << 26;
/// VHOST_USER_F_PROTOCOL_FEATURES, VIRTIO_F_VERSION_1.
const DRIVER_FEATURES: u64 = (1 << 30) | (1 << 32);

/// A memfd of `len` bytes.
fn memfd(name: &std::ffi::CStr, len: u64) -> File {
    // SAFETY: memfd_create(2) with a valid NUL-terminated name.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: a fresh fd nobody else owns.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(len).expect("size a memfd");
    file
}

/// A connected frontend with queue 0 started.
pub(crate) struct MiniFrontend {
    fe: Frontend,
    mem: GuestMemoryMmap,
    hva_base: u64,
    features: u64,
    kick: EventFd,
    call: EventFd,
    avail_idx: u16,
    used_seen: u16,
    log: Option<File>,
}

impl MiniFrontend {
    /// Connect to `socket`, negotiate (LOG_SHMFD and REPLY_ACK among the
    /// protocol features), share the guest memory and start queue 0.
    pub(crate) fn connect(socket: &Path) -> MiniFrontend {
        let sock = UnixStream::connect(socket).expect("connect to the daemon");
        sock.set_read_timeout(Some(super::PATIENCE)).unwrap();
        let mut fe = Frontend::from_stream(sock, 1);
        let offered = fe.get_features().expect("GET_FEATURES");
        let pf = fe.get_protocol_features().expect("GET_PROTOCOL_FEATURES");
        let want = VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::LOG_SHMFD
            | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS;
        assert!(pf.contains(want), "protocol features {pf:?}");
        fe.set_protocol_features(want)
            .expect("SET_PROTOCOL_FEATURES");
        fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
        fe.set_owner().expect("SET_OWNER");
        let features = offered & DRIVER_FEATURES;
        fe.set_features(features).expect("SET_FEATURES");
        let file = memfd(c"mini-frontend-guest", MEM_SIZE);
        let mem = GuestMemoryMmap::from_ranges_with_files([(
            GuestAddress(0),
            MEM_SIZE as usize,
            Some(FileOffset::new(file, 0)),
        )])
        .expect("map guest memory");
        let region = mem.iter().next().expect("one region");
        let info = VhostUserMemoryRegionInfo::from_guest_region(region).expect("region info");
        let hva_base = info.userspace_addr;
        fe.add_mem_region(&info).expect("ADD_MEM_REG");
        let mut m = MiniFrontend {
            fe,
            mem,
            hva_base,
            features,
            kick: EventFd::new(EFD_NONBLOCK).expect("eventfd"),
            call: EventFd::new(EFD_NONBLOCK).expect("eventfd"),
            avail_idx: 0,
            used_seen: 0,
            log: None,
        };
        m.fe.set_vring_call(0, &m.call).expect("SET_VRING_CALL");
        m.start_ring(0);
        m
    }

    /// SET_VRING_NUM/BASE/ADDR/KICK and SET_VRING_ENABLE: queue 0 runs
    /// from avail index `base` (the used index in memory is the driver's).
    fn start_ring(&mut self, base: u16) {
        self.fe.set_vring_num(0, QSIZE).expect("SET_VRING_NUM");
        self.fe.set_vring_base(0, base).expect("SET_VRING_BASE");
        let cfg = VringConfigData {
            queue_max_size: QSIZE,
            queue_size: QSIZE,
            flags: 0,
            desc_table_addr: self.hva_base + DESC,
            used_ring_addr: self.hva_base + USED,
            avail_ring_addr: self.hva_base + AVAIL,
            log_addr: None,
        };
        self.fe.set_vring_addr(0, &cfg).expect("SET_VRING_ADDR");
        self.fe
            .set_vring_kick(0, &self.kick)
            .expect("SET_VRING_KICK");
        self.fe.set_vring_enable(0, true).expect("SET_VRING_ENABLE");
    }

    /// A live migration starts, as QEMU starts it: a dirty log
    /// (SET_LOG_BASE, a memfd covering the guest's memory), then
    /// SET_FEATURES with LOG_ALL.
    pub(crate) fn migration_starts(&mut self) {
        let len = MEM_SIZE / 4096 / 8;
        let log = memfd(c"mini-frontend-log", len);
        self.fe.set_hdr_flags(VhostUserHeaderFlag::empty());
        self.fe
            .set_log_base(
                0,
                Some(VhostUserDirtyLogRegion {
                    mmap_size: len,
                    mmap_offset: 0,
                    mmap_handle: log.as_raw_fd(),
                }),
            )
            .expect("SET_LOG_BASE");
        self.fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
        self.log = Some(log);
        self.fe
            .set_features(self.features | LOG_ALL)
            .expect("SET_FEATURES");
    }

    /// SET_FEATURES without LOG_ALL (the migration ended or failed).
    pub(crate) fn migration_ends(&mut self) {
        self.fe.set_features(self.features).expect("SET_FEATURES");
    }

    /// GET_VRING_BASE: the device stops (QEMU stops the VM); returns the
    /// base.
    pub(crate) fn stop(&mut self) -> u16 {
        self.fe.get_vring_base(0).expect("GET_VRING_BASE") as u16
    }

    /// Start queue 0 again from `base` (the guest resumes on this side).
    pub(crate) fn resume(&mut self, base: u16) {
        self.start_ring(base);
    }

    /// Offer one request (`typ`, `sector`, `data`: out bytes for a write,
    /// the buffer's length for a read) and kick; its status byte reads
    /// 0xff until the device answers.
    fn offer(&mut self, typ: u32, sector: u64, data: &[u8], read_len: usize) {
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&typ.to_le_bytes());
        h[8..16].copy_from_slice(&sector.to_le_bytes());
        self.mem.write_slice(&h, GuestAddress(HEADER)).unwrap();
        self.mem.write_obj(0xffu8, GuestAddress(STATUS)).unwrap();
        let (len, flags) = if typ == 0 {
            (read_len, 2u16)
        } else {
            self.mem.write_slice(data, GuestAddress(DATA)).unwrap();
            (data.len(), 0)
        };
        assert!(len <= MAX_DATA);
        self.desc(0, HEADER, 16, 1, 1);
        self.desc(1, DATA, len as u32, flags | 1, 2);
        self.desc(2, STATUS, 1, 2, 0);
        let slot = AVAIL + 4 + 2 * u64::from(self.avail_idx % QSIZE);
        self.mem.write_obj(0u16, GuestAddress(slot)).unwrap();
        self.avail_idx = self.avail_idx.wrapping_add(1);
        fence(Ordering::SeqCst);
        self.mem
            .store(
                self.avail_idx.to_le(),
                GuestAddress(AVAIL + 2),
                Ordering::Release,
            )
            .unwrap();
        fence(Ordering::SeqCst);
        self.kick.write(1).expect("kick");
    }

    fn desc(&self, i: u64, addr: u64, len: u32, flags: u16, next: u16) {
        let mut d = [0u8; 16];
        d[0..8].copy_from_slice(&addr.to_le_bytes());
        d[8..12].copy_from_slice(&len.to_le_bytes());
        d[12..14].copy_from_slice(&flags.to_le_bytes());
        d[14..16].copy_from_slice(&next.to_le_bytes());
        self.mem
            .write_slice(&d, GuestAddress(DESC + 16 * i))
            .unwrap();
    }

    /// Wait up to `wait` for the request offered last; its status byte.
    fn completion(&mut self, wait: Duration) -> Option<u8> {
        let deadline = Instant::now() + wait;
        loop {
            let used: u16 = self
                .mem
                .load(GuestAddress(USED + 2), Ordering::Acquire)
                .unwrap();
            if u16::from_le(used) != self.used_seen {
                self.used_seen = self.used_seen.wrapping_add(1);
                return Some(self.mem.read_obj(GuestAddress(STATUS)).unwrap());
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Write `data` at `sector`; its status, or `None` when it was not
    /// answered within `wait` (it stays offered: see [`Self::kick_again`]).
    pub(crate) fn try_write(&mut self, sector: u64, data: &[u8], wait: Duration) -> Option<u8> {
        self.offer(1, sector, data, 0);
        self.completion(wait)
    }

    /// Write `data` at `sector`; it must be answered, and its status is OK.
    pub(crate) fn write(&mut self, sector: u64, data: &[u8]) {
        let st = self.try_write(sector, data, super::PATIENCE);
        assert_eq!(st, Some(0), "a write at sector {sector}");
    }

    /// Read `len` bytes at `sector`; it must be answered OK.
    pub(crate) fn read(&mut self, sector: u64, len: usize) -> Vec<u8> {
        self.offer(0, sector, &[], len);
        let st = self.completion(super::PATIENCE);
        assert_eq!(st, Some(0), "a read at sector {sector}");
        let mut b = vec![0u8; len];
        self.mem.read_slice(&mut b, GuestAddress(DATA)).unwrap();
        b
    }

    /// Kick again and wait up to `wait` for the request offered last.
    pub(crate) fn kick_again(&mut self, wait: Duration) -> Option<u8> {
        self.kick.write(1).expect("kick");
        self.completion(wait)
    }
}
