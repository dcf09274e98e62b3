//! `blklab serve` killed with SIGKILL while writes are in service and
//! complete out of order (emulated latency), then started again on the
//! same socket and image, with a frontend that does what QEMU's
//! vhost-user-blk does across a back-end's death: it keeps the inflight
//! area (VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD) and hands it to the new
//! back-end, and restarts the ring from the used index in guest memory.
//!
//! With the area every write completes exactly once and its data is on
//! the image. Without it (the frontend does not negotiate the feature)
//! the same kill completes a write twice: the check that catches it is the
//! same, so the test shows it can fail.
//!
//! No guest: the frontend is the `vhost` crate's, driving a ring it lays
//! out itself in a memfd, as tests/raw_frontend.rs does.

mod common;

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use vhost::vhost_user::message::{VhostUserHeaderFlag, VhostUserInflight};
use vhost::vhost_user::{Frontend, VhostUserFrontend, VhostUserProtocolFeatures};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vm_memory::{Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

const QSIZE: u16 = 64;
const MEM_SIZE: usize = 1 << 20;
const DESC: u64 = 0x1000;
const AVAIL: u64 = 0x2000;
const USED: u64 = 0x3000;
const STATUS: u64 = 0x8000;
const HDR: u64 = 0x10000;
const DATA: u64 = 0x20000;
/// Writes in flight at the kill.
const WRITES: u16 = 16;
const BLOCK: u32 = 4096;

const VIRTIO_F_VERSION_1: u64 = 1 << 32;
const VHOST_USER_F_PROTOCOL_FEATURES: u64 = 1 << 30;
const VIRTIO_BLK_T_OUT: u32 = 1;
const DESC_F_NEXT: u16 = 1;
const DESC_F_WRITE: u16 = 2;

/// The image, the socket and the daemon serving them.
struct Served {
    dir: tempfile::TempDir,
    daemon: Option<blklab::bench::daemon::Daemon>,
}

impl Served {
    fn new() -> Served {
        let dir = tempfile::tempdir().expect("tempdir");
        File::create(dir.path().join("disk.img"))
            .and_then(|f| f.set_len(8 << 20))
            .expect("image");
        let mut s = Served { dir, daemon: None };
        s.start();
        s
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("vd.sock")
    }

    fn image(&self) -> PathBuf {
        self.dir.path().join("disk.img")
    }

    /// `blklab serve` on the image, writes completing 5 to 50 ms after
    /// they are taken (so out of order); a stale socket is replaced.
    fn start(&mut self) {
        let disk = format!("file:{}", self.image().display());
        let mut cmd = Command::new(common::blklab_bin());
        cmd.arg("serve")
            .arg("--socket")
            .arg(self.socket())
            .args(["--disk", &disk, "--queue-size", "64"])
            .args(["--write-latency", "uniform:5ms..50ms"])
            .env("RUST_LOG", "info");
        let d = blklab::bench::daemon::Daemon::start(
            "blklab serve",
            &mut cmd,
            &[self.socket()],
            common::PATIENCE,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        self.daemon = Some(d);
    }

    fn kill(&mut self) {
        let mut d = self.daemon.take().expect("a daemon");
        // SAFETY: kill(2) on the daemon's pid, a process this test started.
        assert_eq!(unsafe { libc::kill(d.pid(), libc::SIGKILL) }, 0);
        common::wait_until("the killed daemon to exit", || d.exited().is_some());
    }
}

/// Guest memory: a memfd at guest address 0.
fn guest_memory() -> GuestMemoryMmap {
    // SAFETY: memfd_create with a NUL-terminated name; the fd is owned by
    // the File below.
    let fd = unsafe { libc::memfd_create(c"inflight-guest".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: `fd` is new and owned by nobody else.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(MEM_SIZE as u64).unwrap();
    GuestMemoryMmap::from_ranges_with_files([(
        GuestAddress(0),
        MEM_SIZE,
        Some(FileOffset::new(file, 0)),
    )])
    .unwrap()
}

/// One frontend connection: the handshake QEMU makes at a (re)connect,
/// the inflight area given back when `area` is set.
struct Conn {
    _fe: Frontend,
    _kick: EventFd,
    _call: EventFd,
}

/// The inflight area the frontend keeps across back-ends.
struct Area {
    info: VhostUserInflight,
    file: File,
}

fn connect(socket: &Path, mem: &GuestMemoryMmap, area: &mut Option<Area>, inflight: bool) -> Conn {
    let sock = UnixStream::connect(socket).expect("connect");
    sock.set_read_timeout(Some(common::PATIENCE)).unwrap();
    let mut fe = Frontend::from_stream(sock, 1);
    let offered = fe.get_features().unwrap();
    let mut pf = fe.get_protocol_features().unwrap()
        & (VhostUserProtocolFeatures::REPLY_ACK | VhostUserProtocolFeatures::INFLIGHT_SHMFD);
    if !inflight {
        pf.remove(VhostUserProtocolFeatures::INFLIGHT_SHMFD);
    }
    assert_eq!(
        pf.contains(VhostUserProtocolFeatures::INFLIGHT_SHMFD),
        inflight,
        "INFLIGHT_SHMFD offered"
    );
    fe.set_protocol_features(pf).unwrap();
    fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
    fe.set_owner().unwrap();
    fe.set_features(offered & (VIRTIO_F_VERSION_1 | VHOST_USER_F_PROTOCOL_FEATURES))
        .unwrap();
    if inflight {
        if area.is_none() {
            let ask = VhostUserInflight {
                num_queues: 1,
                queue_size: QSIZE,
                ..Default::default()
            };
            let (info, file) = fe.get_inflight_fd(&ask).expect("GET_INFLIGHT_FD");
            *area = Some(Area { info, file });
        }
        let a = area.as_ref().unwrap();
        fe.set_inflight_fd(&a.info, a.file.as_raw_fd())
            .expect("SET_INFLIGHT_FD");
    }
    let region = mem.iter().next().unwrap();
    let info = VhostUserMemoryRegionInfo::from_guest_region(region).unwrap();
    let hva = info.userspace_addr;
    fe.set_mem_table(&[info]).unwrap();
    // As QEMU after a back-end died: the ring restarts at the used index.
    let used: u16 = mem.read_obj(GuestAddress(USED + 2)).unwrap();
    fe.set_vring_num(0, QSIZE).unwrap();
    fe.set_vring_base(0, used).unwrap();
    let cfg = VringConfigData {
        queue_max_size: QSIZE,
        queue_size: QSIZE,
        flags: 0,
        desc_table_addr: hva + DESC,
        used_ring_addr: hva + USED,
        avail_ring_addr: hva + AVAIL,
        log_addr: None,
    };
    fe.set_vring_addr(0, &cfg).unwrap();
    let call = EventFd::new(EFD_NONBLOCK).unwrap();
    let kick = EventFd::new(EFD_NONBLOCK).unwrap();
    fe.set_vring_call(0, &call).unwrap();
    fe.set_vring_kick(0, &kick).unwrap();
    fe.set_vring_enable(0, true).unwrap();
    // The guest kicks once: its requests are on the ring already.
    kick.write(1).unwrap();
    Conn {
        _fe: fe,
        _kick: kick,
        _call: call,
    }
}

/// Write WRITES chains (header, 4 KiB of byte k+1 for sector 8k, status)
/// and make them available at once.
fn offer_writes(mem: &GuestMemoryMmap) {
    for k in 0..WRITES {
        let hdr = HDR + 0x20 * u64::from(k);
        let data = DATA + u64::from(BLOCK) * u64::from(k);
        let status = STATUS + u64::from(k);
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&VIRTIO_BLK_T_OUT.to_le_bytes());
        h[8..16].copy_from_slice(&(8 * u64::from(k)).to_le_bytes());
        mem.write_slice(&h, GuestAddress(hdr)).unwrap();
        mem.write_slice(&vec![k as u8 + 1; BLOCK as usize], GuestAddress(data))
            .unwrap();
        mem.write_obj(0xeeu8, GuestAddress(status)).unwrap();
        let first = 3 * k;
        desc(mem, first, hdr, 16, DESC_F_NEXT, first + 1);
        desc(mem, first + 1, data, BLOCK, DESC_F_NEXT, first + 2);
        desc(mem, first + 2, status, 1, DESC_F_WRITE, 0);
        mem.write_obj(first, GuestAddress(AVAIL + 4 + 2 * u64::from(k)))
            .unwrap();
    }
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    mem.write_obj(WRITES, GuestAddress(AVAIL + 2)).unwrap();
}

fn desc(mem: &GuestMemoryMmap, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
    let mut d = [0u8; 16];
    d[0..8].copy_from_slice(&addr.to_le_bytes());
    d[8..12].copy_from_slice(&len.to_le_bytes());
    d[12..14].copy_from_slice(&flags.to_le_bytes());
    d[14..16].copy_from_slice(&next.to_le_bytes());
    mem.write_slice(&d, GuestAddress(DESC + 16 * u64::from(i)))
        .unwrap();
}

fn used_idx(mem: &GuestMemoryMmap) -> u16 {
    mem.read_obj(GuestAddress(USED + 2)).unwrap()
}

/// The heads on the used ring, in order.
fn used_heads(mem: &GuestMemoryMmap) -> Vec<u32> {
    (0..used_idx(mem))
        .map(|i| {
            mem.read_obj(GuestAddress(USED + 4 + 8 * u64::from(i % QSIZE)))
                .unwrap()
        })
        .collect()
}

/// Kill the daemon once some writes completed and others are still in
/// service, start it again, reconnect; returns the used ring's heads once
/// WRITES entries are there (or what is there when no more come).
fn kill_and_resume(inflight: bool) -> (Served, GuestMemoryMmap, Vec<u32>) {
    let mut served = Served::new();
    let mem = guest_memory();
    let mut area = None;
    offer_writes(&mem);
    let first = connect(&served.socket(), &mem, &mut area, inflight);
    common::wait_until("some writes to complete", || used_idx(&mem) >= 3);
    served.kill();
    let at_kill = used_idx(&mem);
    assert!(at_kill < WRITES, "every write completed before the kill");
    drop(first);
    served.start();
    let _second = connect(&served.socket(), &mem, &mut area, inflight);
    // Every write comes back (or, without the area, more or fewer than
    // that: then wait until the ring settles).
    let settled = common::try_wait_for(Duration::from_secs(10), || {
        (used_idx(&mem) >= WRITES).then_some(())
    });
    if settled.is_none() || !inflight {
        std::thread::sleep(Duration::from_millis(300));
    }
    eprintln!("killed with {at_kill} of {WRITES} writes completed");
    let heads = used_heads(&mem);
    (served, mem, heads)
}

#[test]
fn a_killed_daemon_resumes_from_the_inflight_area() {
    let (mut served, mem, heads) = kill_and_resume(true);
    let mut sorted = heads.clone();
    sorted.sort_unstable();
    let want: Vec<u32> = (0..u32::from(WRITES)).map(|k| 3 * k).collect();
    assert_eq!(sorted, want, "each write completed exactly once: {heads:?}");
    for k in 0..u64::from(WRITES) {
        let s: u8 = mem.read_obj(GuestAddress(STATUS + k)).unwrap();
        assert_eq!(s, 0, "write {k}: status {s}");
    }
    served.kill();
    let image = std::fs::read(served.image()).unwrap();
    for k in 0..usize::from(WRITES) {
        let at = k * BLOCK as usize;
        assert!(
            image[at..at + BLOCK as usize]
                .iter()
                .all(|&b| b == k as u8 + 1),
            "write {k} not on the image"
        );
    }
}

/// The control: the same kill without the area completes a write twice,
/// as QEMU sees it ("is not a head").
#[test]
fn without_the_area_a_write_completes_twice() {
    let (mut served, _mem, heads) = kill_and_resume(false);
    let mut sorted = heads.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert!(
        sorted.len() < heads.len(),
        "no write completed twice without the inflight area: {heads:?}"
    );
    served.kill();
}

/// An inflight area the daemon cannot use is refused with a clear error
/// (the connection ends: GET_INFLIGHT_FD and SET_INFLIGHT_FD have no
/// negative reply), and the next frontend is served.
#[test]
fn a_bad_inflight_area_is_refused_and_the_daemon_serves_on() {
    let mut served = Served::new();
    let handshake = |sock: &Path| {
        let s = UnixStream::connect(sock).expect("connect");
        s.set_read_timeout(Some(common::PATIENCE)).unwrap();
        let mut fe = Frontend::from_stream(s, 1);
        fe.get_features().unwrap();
        fe.set_protocol_features(
            VhostUserProtocolFeatures::REPLY_ACK | VhostUserProtocolFeatures::INFLIGHT_SHMFD,
        )
        .unwrap();
        fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
        fe
    };
    // More queues than the disk has, and a queue size of 0.
    for (num_queues, queue_size) in [(2, QSIZE), (1, 0)] {
        let mut fe = handshake(&served.socket());
        let ask = VhostUserInflight {
            num_queues,
            queue_size,
            ..Default::default()
        };
        assert!(
            fe.get_inflight_fd(&ask).is_err(),
            "{num_queues}x{queue_size}"
        );
    }
    // An area its file does not hold.
    let mut fe = handshake(&served.socket());
    // SAFETY: memfd_create with a NUL-terminated name; the File owns it.
    let fd = unsafe { libc::memfd_create(c"short-area".as_ptr(), libc::MFD_CLOEXEC) };
    // SAFETY: `fd` is new and owned by nobody else.
    let short = unsafe { File::from_raw_fd(fd) };
    short.set_len(100).unwrap();
    let area = VhostUserInflight {
        mmap_size: 4096,
        mmap_offset: 0,
        num_queues: 1,
        queue_size: QSIZE,
    };
    assert!(fe.set_inflight_fd(&area, short.as_raw_fd()).is_err());
    drop(fe);
    // The daemon serves on.
    let mem = guest_memory();
    offer_writes(&mem);
    let _c = connect(&served.socket(), &mem, &mut None, true);
    common::wait_until("every write to complete", || used_idx(&mem) == WRITES);
    served.kill();
}
