//! The worker's pass driven in process: a `MockSplitQueue` (the
//! driver's side of a split ring) over guest memory, the pass run on
//! the `Queue` it describes, and the used ring, status bytes, data and
//! queue counters read back. No socket, no threads.

use std::cell::Cell;
use std::io;
use std::path::Path;
use std::sync::Arc;

use virtio_bindings::virtio_blk::*;
use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::split::Descriptor;
use virtio_queue::desc::RawDescriptor;
use virtio_queue::mock::MockSplitQueue;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::backend::worker::pass::{with_pass, DrainStop, Drained, Mode, Turn, UsedRing};
use crate::backend::worker::queue::BrokenRing;
use crate::backend::{BlkBackend, Disk};
use crate::device::config::DiskArgs;
use crate::stats::queue::QueueCounters;
use crate::virtio_blk::request::{STATUS_IOERR, STATUS_OK, STATUS_UNSUPP};

const W: u16 = VRING_DESC_F_WRITE as u16;
const N: u16 = VRING_DESC_F_NEXT as u16;
const QSIZE: u16 = 64;
const SERIAL: &str = "worker-test";

/// The ring as the pass sees it: the queue the mock describes, and
/// the guest notifications sent.
struct MockRing {
    queue: Queue,
    signals: Cell<u32>,
    /// What the guest does when it is signalled (in the pass).
    on_signal: Option<Box<dyn Fn()>>,
}

impl UsedRing for MockRing {
    fn queue(&self) -> &Queue {
        &self.queue
    }

    fn queue_mut(&mut self) -> &mut Queue {
        &mut self.queue
    }

    fn signal_used_queue(&self) -> io::Result<()> {
        self.signals.set(self.signals.get() + 1);
        if let Some(f) = &self.on_signal {
            f();
        }
        Ok(())
    }
}

/// A one-queue backend on a 1 MiB mem disk, and 1 MiB of guest memory.
struct Rig {
    be: BlkBackend,
    mem: Arc<GuestMemoryMmap>,
}

fn rig(extra: &[&str]) -> Rig {
    let mut a = vec![
        "--socket",
        "/tmp/w.sock",
        "--disk",
        "mem",
        "--size",
        "1M",
        "--serial",
        SERIAL,
    ];
    a.extend_from_slice(extra);
    let cfg = DiskArgs::parse_for_test(&a).to_configs().unwrap().remove(0);
    Rig {
        be: BlkBackend::new(Arc::new(Disk::open(cfg).unwrap())).unwrap(),
        mem: Arc::new(GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap()),
    }
}

impl Rig {
    /// Run the worker's pass over `ring` until it would wait for a
    /// kick (EVENT_IDX: until no buffer slipped in).
    fn serve(&self, ring: &mut MockRing) -> Vec<Turn> {
        let event_idx = ring.queue.event_idx_enabled();
        let mut q = self.be.lock_queue(0);
        let mut st = self.be.disk.queue_stats(0);
        let mut turns = Vec::new();
        loop {
            let Ok(t) = with_pass(&self.be, &mut q, &mut st, &mut *ring, &self.mem, |p| {
                p.turn(event_idx, Mode::Notify)
            }) else {
                // The ring is not inside guest memory.
                return turns;
            };
            turns.push(t);
            if !t.again {
                return turns;
            }
        }
    }

    fn counters(&self) -> QueueCounters {
        self.be.disk.queue_stats(0).counters.clone()
    }

    fn header(&self, at: u64, t: u32, sector: u64) {
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&t.to_le_bytes());
        h[8..16].copy_from_slice(&sector.to_le_bytes());
        self.mem.write_slice(&h, GuestAddress(at)).unwrap();
    }

    fn range(&self, at: u64, sector: u64, num: u32, flags: u32) {
        let mut r = [0u8; 16];
        r[0..8].copy_from_slice(&sector.to_le_bytes());
        r[8..12].copy_from_slice(&num.to_le_bytes());
        r[12..16].copy_from_slice(&flags.to_le_bytes());
        self.mem.write_slice(&r, GuestAddress(at)).unwrap();
    }

    fn byte(&self, at: u64) -> u8 {
        self.mem.read_obj(GuestAddress(at)).unwrap()
    }

    fn bytes(&self, at: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0; len];
        self.mem.read_slice(&mut b, GuestAddress(at)).unwrap();
        b
    }
}

/// The driver's side of queue 0: descriptors and avail entries.
struct Driver<'m> {
    vq: MockSplitQueue<'m, GuestMemoryMmap>,
    mem: &'m GuestMemoryMmap,
    next_desc: u16,
    avail: u16,
}

impl<'m> Driver<'m> {
    fn new(mem: &'m GuestMemoryMmap) -> Driver<'m> {
        Driver {
            vq: MockSplitQueue::create(mem, GuestAddress(0), QSIZE),
            mem,
            next_desc: 0,
            avail: 0,
        }
    }

    /// The worker's view of the ring.
    fn ring(&self, event_idx: bool) -> MockRing {
        let mut queue: Queue = self.vq.create_queue().unwrap();
        // The mock lays its used ring over the end of its avail ring
        // (it adds the entry count, not their bytes): ours has its own
        // place.
        queue.try_set_used_ring_address(GuestAddress(USED)).unwrap();
        queue.set_event_idx(event_idx);
        MockRing {
            queue,
            signals: Cell::new(0),
            on_signal: None,
        }
    }

    fn desc(&self, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let d = RawDescriptor::from(Descriptor::new(addr, len, flags, next));
        self.vq.desc_table().store(i, d).unwrap();
    }

    /// Make the chain at `head` available.
    fn offer(&mut self, head: u16) {
        let slot = usize::from(self.avail % QSIZE);
        self.vq.avail().ring().ref_at(slot).unwrap().store(head);
        self.avail = self.avail.wrapping_add(1);
        self.vq.avail().idx().store(self.avail);
    }

    /// Add a chain of (address, length, flags) descriptors, linked in
    /// order, and make it available; returns its head.
    fn push(&mut self, descs: &[(u64, u32, u16)]) -> u16 {
        let head = self.next_desc;
        for (i, &(addr, len, flags)) in descs.iter().enumerate() {
            let idx = head + i as u16;
            let more = if i + 1 < descs.len() { N } else { 0 };
            self.desc(idx, addr, len, flags | more, idx + 1);
        }
        self.next_desc += descs.len() as u16;
        self.offer(head);
        head
    }

    /// The used ring: (head, length) of each entry, in order.
    fn used(&self) -> Vec<(u32, u32)> {
        let n: u16 = self.mem.read_obj(GuestAddress(USED + 2)).unwrap();
        (0..n)
            .map(|i| {
                let at = USED + 4 + 8 * u64::from(i % QSIZE);
                let id: u32 = self.mem.read_obj(GuestAddress(at)).unwrap();
                let len: u32 = self.mem.read_obj(GuestAddress(at + 4)).unwrap();
                (id, len)
            })
            .collect()
    }

    /// The driver's `used_event` (the avail ring's last field).
    fn set_used_event(&self, idx: u16) {
        let at = self.vq.avail_addr().0 + 4 + 2 * u64::from(QSIZE);
        self.mem.write_obj(idx, GuestAddress(at)).unwrap();
    }

    /// The device's `avail_event` (the used ring's last field).
    fn avail_event(&self) -> u16 {
        let at = USED + 4 + 8 * u64::from(QSIZE);
        self.mem.read_obj(GuestAddress(at)).unwrap()
    }
}

// Guest memory layout: the ring below 0x1000, request headers at
// HDR + 0x20 * k, status bytes at STATUS + k, data from 0x10000.
const HDR: u64 = 0x1000;
/// The used ring (the mock's descriptor table and avail ring end at
/// 0x486).
const USED: u64 = 0x800;
const STATUS: u64 = 0x2000;

fn hdr_at(k: u64) -> u64 {
    HDR + 0x20 * k
}

fn st_at(k: u64) -> u64 {
    STATUS + k
}

#[test]
fn one_pass_serves_every_request_type() {
    let r = rig(&[]);
    let mut d = Driver::new(&r.mem);
    r.mem
        .write_slice(&[0x5a; 4096], GuestAddress(0x10000))
        .unwrap();
    // Poison the status bytes and the read buffers.
    r.mem.write_slice(&[0xee; 8], GuestAddress(STATUS)).unwrap();
    r.mem
        .write_slice(&[0xee; 4096], GuestAddress(0x20000))
        .unwrap();
    let mut heads = Vec::new();
    // 0: write 4 KiB at sector 8.
    r.header(hdr_at(0), VIRTIO_BLK_T_OUT, 8);
    heads.push(d.push(&[(hdr_at(0), 16, 0), (0x10000, 4096, 0), (st_at(0), 1, W)]));
    // 1: read it back into two buffers.
    r.header(hdr_at(1), VIRTIO_BLK_T_IN, 8);
    heads.push(d.push(&[
        (hdr_at(1), 16, 0),
        (0x20000, 1024, W),
        (0x20400, 3072, W),
        (st_at(1), 1, W),
    ]));
    // 2: flush.
    r.header(hdr_at(2), VIRTIO_BLK_T_FLUSH, 0);
    heads.push(d.push(&[(hdr_at(2), 16, 0), (st_at(2), 1, W)]));
    // 3: get-id.
    r.header(hdr_at(3), VIRTIO_BLK_T_GET_ID, 0);
    heads.push(d.push(&[(hdr_at(3), 16, 0), (0x30000, 20, W), (st_at(3), 1, W)]));
    // 4: discard sector 8; 5: write zeroes over sectors 10..12.
    r.header(hdr_at(4), VIRTIO_BLK_T_DISCARD, 0);
    r.range(0x31000, 8, 1, 0);
    heads.push(d.push(&[(hdr_at(4), 16, 0), (0x31000, 16, 0), (st_at(4), 1, W)]));
    r.header(hdr_at(5), VIRTIO_BLK_T_WRITE_ZEROES, 0);
    r.range(0x31010, 10, 2, VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP);
    heads.push(d.push(&[(hdr_at(5), 16, 0), (0x31010, 16, 0), (st_at(5), 1, W)]));
    // 6: read the 4 KiB again.
    r.header(hdr_at(6), VIRTIO_BLK_T_IN, 8);
    heads.push(d.push(&[(hdr_at(6), 16, 0), (0x40000, 4096, W), (st_at(6), 1, W)]));

    let mut ring = d.ring(false);
    let turns = r.serve(&mut ring);
    assert_eq!(turns.len(), 1);
    assert_eq!(
        turns[0].drained,
        Drained {
            used: 7,
            popped: 7,
            stop: DrainStop::Empty,
        }
    );

    // Every chain on the used ring, in pop order, with the bytes
    // written into it (data + status).
    let lens = [1, 4097, 1, 21, 1, 1, 4097];
    let want: Vec<(u32, u32)> = heads
        .iter()
        .zip(lens)
        .map(|(h, l)| (u32::from(*h), l))
        .collect();
    assert_eq!(d.used(), want);
    for k in 0..7 {
        assert_eq!(r.byte(st_at(k)), STATUS_OK, "request {k}");
    }
    assert_eq!(r.byte(st_at(7)), 0xee, "no stray status write");

    // The data.
    assert!(r.bytes(0x20000, 4096).iter().all(|b| *b == 0x5a));
    let id = r.bytes(0x30000, 20);
    assert_eq!(&id[..SERIAL.len()], SERIAL.as_bytes());
    assert!(id[SERIAL.len()..].iter().all(|b| *b == 0));
    let after = r.bytes(0x40000, 4096);
    assert!(after[..512].iter().all(|b| *b == 0), "discarded");
    assert!(after[512..1024].iter().all(|b| *b == 0x5a));
    assert!(after[1024..2048].iter().all(|b| *b == 0), "zeroed");
    assert!(after[2048..].iter().all(|b| *b == 0x5a));

    // The counters, and one notification for the pass (no EVENT_IDX).
    let c = r.counters();
    assert_eq!(c.requests, 7);
    assert_eq!(
        (
            c.reads,
            c.writes,
            c.flushes,
            c.get_ids,
            c.discards,
            c.write_zeroes,
            c.other
        ),
        (2, 1, 1, 1, 1, 1, 0)
    );
    assert_eq!((c.bytes_read, c.bytes_written), (8192, 4096));
    assert_eq!((c.status_ioerr, c.status_unsupp), (0, 0));
    assert_eq!((c.dropped, c.ring_errors), (0, 0));
    assert_eq!((c.notifications, c.notifications_suppressed), (1, 0));
    assert_eq!(ring.signals.get(), 1);

    // Nothing new: the next pass pops nothing and signals nothing.
    let t = r.serve(&mut ring);
    assert_eq!(t[0].drained.popped, 0);
    assert_eq!(ring.signals.get(), 1);
}

#[test]
fn errors_are_answered_with_their_status_and_counted() {
    let r = rig(&[]);
    let cap = r.be.disk.cfg.size / 512;
    let mut d = Driver::new(&r.mem);
    r.mem
        .write_slice(&[0x33; 512], GuestAddress(0x10000))
        .unwrap();
    let expect = [
        // An out-of-range sector, a read straddling the end, a write
        // whose sector * 512 overflows.
        (VIRTIO_BLK_T_IN, cap, 512u32, W, STATUS_IOERR),
        (VIRTIO_BLK_T_IN, cap - 1, 1024, W, STATUS_IOERR),
        (VIRTIO_BLK_T_OUT, u64::MAX / 256, 512, 0, STATUS_IOERR),
        // A length that is not whole sectors.
        (VIRTIO_BLK_T_IN, 0, 100, W, STATUS_IOERR),
        // A type the device does not implement.
        (0x55, 0, 512, W, STATUS_UNSUPP),
    ];
    for (k, (t, sector, len, flags, _)) in expect.iter().enumerate() {
        let k = k as u64;
        r.header(hdr_at(k), *t, *sector);
        d.push(&[
            (hdr_at(k), 16, 0),
            (0x10000, *len, *flags),
            (st_at(k), 1, W),
        ]);
    }
    // A short header (malformed, but with a status byte).
    r.header(hdr_at(5), VIRTIO_BLK_T_IN, 0);
    d.push(&[(hdr_at(5), 8, 0), (st_at(5), 1, W)]);
    // Read data outside guest memory.
    r.header(hdr_at(6), VIRTIO_BLK_T_IN, 0);
    d.push(&[
        (hdr_at(6), 16, 0),
        (0x1_0000_0000, 512, W),
        (st_at(6), 1, W),
    ]);

    let mut ring = d.ring(false);
    r.serve(&mut ring);
    let used = d.used();
    assert_eq!(used.len(), 7);
    assert!(used.iter().all(|(_, len)| *len == 1), "{used:?}");
    for (k, (.., status)) in expect.iter().enumerate() {
        assert_eq!(r.byte(st_at(k as u64)), *status, "request {k}");
    }
    assert_eq!(r.byte(st_at(5)), STATUS_IOERR);
    assert_eq!(r.byte(st_at(6)), STATUS_IOERR);
    // Nothing was read into the guest or written to the disk.
    assert!(r.bytes(0x10000, 512).iter().all(|b| *b == 0x33));
    let c = r.counters();
    assert_eq!(c.requests, 7);
    assert_eq!((c.reads, c.writes, c.other), (4, 1, 2));
    assert_eq!((c.status_ioerr, c.status_unsupp), (6, 1));
    assert_eq!((c.bytes_read, c.bytes_written, c.dropped), (0, 0, 0));
}

#[test]
fn unanswerable_chains_are_returned_and_counted() {
    let r = rig(&[]);
    let mut d = Driver::new(&r.mem);
    r.mem.write_slice(&[0xee; 8], GuestAddress(STATUS)).unwrap();
    for k in 0..5 {
        r.header(hdr_at(k), VIRTIO_BLK_T_IN, 0);
    }
    let mut heads = Vec::new();
    // The status byte in a device-readable descriptor.
    heads.push(d.push(&[(hdr_at(0), 16, 0), (0x10000, 512, W), (st_at(0), 1, 0)]));
    // A zero-length status descriptor.
    heads.push(d.push(&[(hdr_at(1), 16, 0), (0x10000, 512, W), (st_at(1), 0, W)]));
    // The status byte outside guest memory.
    heads.push(d.push(&[(hdr_at(2), 16, 0), (0x1_0000_0000, 1, W)]));
    // A chain that loops: a -> b -> a -> ...
    let a = d.next_desc;
    d.desc(a, hdr_at(3), 16, N, a + 1);
    d.desc(a + 1, st_at(3), 1, W | N, a);
    d.next_desc += 2;
    d.offer(a);
    heads.push(a);
    // And a good request after them: the ring is still usable.
    heads.push(d.push(&[(hdr_at(4), 16, 0), (0x10000, 512, W), (st_at(4), 1, W)]));

    let mut ring = d.ring(false);
    let turns = r.serve(&mut ring);
    assert_eq!((turns[0].drained.popped, turns[0].drained.used), (5, 5));
    let want: Vec<(u32, u32)> = heads
        .iter()
        .zip([0, 0, 0, 0, 513])
        .map(|(h, l)| (u32::from(*h), l))
        .collect();
    assert_eq!(d.used(), want);
    // No status written for the dropped chains (the looping one's
    // status descriptor claims more follow).
    for k in 0..4 {
        assert_eq!(r.byte(st_at(k)), 0xee, "chain {k}");
    }
    assert_eq!(r.byte(st_at(4)), STATUS_OK);
    let c = r.counters();
    assert_eq!((c.dropped, c.requests, c.reads), (4, 1, 1));
    assert_eq!((c.ring_errors, c.status_ioerr), (0, 0));
}

#[test]
fn event_idx_signals_once_per_used_event() {
    let r = rig(&[]);
    let mut d = Driver::new(&r.mem);
    let push_flushes = |d: &mut Driver, n: u64| {
        for k in 0..n {
            r.header(hdr_at(k), VIRTIO_BLK_T_FLUSH, 0);
            d.push(&[(hdr_at(k), 16, 0), (st_at(k), 1, W)]);
        }
    };
    push_flushes(&mut d, 4);
    let mut ring = d.ring(true);
    // used_event 0: the first used entry crosses it, the rest do not.
    let turns = r.serve(&mut ring);
    assert_eq!(turns.len(), 1, "nothing slipped in");
    assert_eq!(d.used().len(), 4);
    let c = r.counters();
    assert_eq!((c.notifications, c.notifications_suppressed), (1, 3));
    assert_eq!(ring.signals.get(), 1);
    // Notifications were turned back on at the next avail index.
    assert_eq!(d.avail_event(), 4);

    // The driver asks to hear when the used index passes 5.
    d.set_used_event(5);
    push_flushes(&mut d, 4);
    r.serve(&mut ring);
    assert_eq!(d.used().len(), 8);
    let c = r.counters();
    assert_eq!((c.notifications, c.notifications_suppressed), (2, 6));
    assert_eq!(ring.signals.get(), 2);
    assert_eq!(d.avail_event(), 8);
}

#[test]
fn emulated_latency_holds_the_used_entry_until_its_deadline() {
    let r = rig(&["--latency", "20ms"]);
    let mut d = Driver::new(&r.mem);
    r.header(hdr_at(0), VIRTIO_BLK_T_IN, 0);
    let head = d.push(&[(hdr_at(0), 16, 0), (0x10000, 512, W), (st_at(0), 1, W)]);
    let mut ring = d.ring(false);
    let t = r.serve(&mut ring);
    // Executed (status written, counted), not yet on the used ring.
    assert_eq!((t[0].drained.popped, t[0].drained.used), (1, 0));
    assert_eq!(r.byte(st_at(0)), STATUS_OK);
    assert!(d.used().is_empty());
    assert_eq!(ring.signals.get(), 0);
    assert_eq!(r.be.lock_queue(0).pending.len(), 1);
    assert_eq!(r.counters().reads, 1);

    std::thread::sleep(std::time::Duration::from_millis(25));
    let t = r.serve(&mut ring);
    assert_eq!(t[0].completed, 1);
    assert_eq!(d.used(), vec![(u32::from(head), 513)]);
    assert_eq!(ring.signals.get(), 1);
    assert!(r.be.lock_queue(0).pending.is_empty());
}

/// While the daemon stops, a pass pops nothing (what the guest makes
/// available stays on the avail ring for the next daemon) and still
/// completes the requests in service whose time has come.
#[test]
fn a_stopping_daemon_pops_nothing_and_completes_what_is_due() {
    let r = rig(&["--latency", "20ms"]);
    let mut d = Driver::new(&r.mem);
    r.mem.write_slice(&[0xee; 2], GuestAddress(STATUS)).unwrap();
    r.header(hdr_at(0), VIRTIO_BLK_T_IN, 0);
    let head = d.push(&[(hdr_at(0), 16, 0), (0x10000, 512, W), (st_at(0), 1, W)]);
    let mut ring = d.ring(false);
    assert_eq!(r.serve(&mut ring)[0].drained.popped, 1);
    r.be.disk
        .quiescing
        .store(true, std::sync::atomic::Ordering::SeqCst);
    r.header(hdr_at(1), VIRTIO_BLK_T_IN, 0);
    d.push(&[(hdr_at(1), 16, 0), (0x10200, 512, W), (st_at(1), 1, W)]);
    std::thread::sleep(std::time::Duration::from_millis(25));
    let t = r.serve(&mut ring);
    assert_eq!(t.len(), 1);
    assert_eq!(t[0].completed, 1);
    assert_eq!(
        t[0].drained,
        Drained {
            used: 0,
            popped: 0,
            stop: DrainStop::Quiescing,
        }
    );
    assert_eq!(d.used(), vec![(u32::from(head), 513)]);
    assert_eq!(r.byte(st_at(1)), 0xee, "popped while stopping");
    assert_eq!(ring.queue.next_avail(), 1);
    assert_eq!(r.counters().requests, 1);
}

#[test]
fn injected_failures_are_ioerr_and_counted() {
    let r = rig(&["--fail-every", "2:read"]);
    let mut d = Driver::new(&r.mem);
    for k in 0..4 {
        r.header(hdr_at(k), VIRTIO_BLK_T_IN, 0);
        d.push(&[(hdr_at(k), 16, 0), (0x10000, 512, W), (st_at(k), 1, W)]);
    }
    let mut ring = d.ring(false);
    r.serve(&mut ring);
    let statuses: Vec<u8> = (0..4).map(|k| r.byte(st_at(k))).collect();
    assert_eq!(statuses, [STATUS_OK, STATUS_IOERR, STATUS_OK, STATUS_IOERR]);
    let lens: Vec<u32> = d.used().iter().map(|(_, l)| *l).collect();
    assert_eq!(lens, [513, 1, 513, 1]);
    let c = r.counters();
    assert_eq!((c.injected_fail_every, c.status_ioerr), (2, 2));
    assert_eq!((c.reads, c.bytes_read), (4, 1024));
}

#[test]
fn a_broken_avail_ring_is_counted_and_not_served() {
    let r = rig(&[]);
    let d = Driver::new(&r.mem);
    // The avail index jumps further than the queue holds.
    d.vq.avail().idx().store(QSIZE + 1);
    let mut ring = d.ring(true);
    let t = r.serve(&mut ring);
    assert_eq!(
        t[0].drained,
        Drained {
            used: 0,
            popped: 0,
            stop: DrainStop::Broken,
        }
    );
    assert!(!t[0].again);
    assert!(d.used().is_empty());
    let c = r.counters();
    assert_eq!((c.ring_errors, c.requests, c.dropped), (1, 0, 0));
}

#[test]
fn a_head_beyond_the_queue_size_breaks_the_queue() {
    let r = rig(&[]);
    let mut d = Driver::new(&r.mem);
    r.header(hdr_at(0), VIRTIO_BLK_T_FLUSH, 0);
    d.offer(QSIZE + 3);
    d.push(&[(hdr_at(0), 16, 0), (st_at(0), 1, W)]);
    let mut ring = d.ring(true);
    let t = r.serve(&mut ring);
    assert_eq!(t.len(), 1);
    assert_eq!(t[0].drained.stop, DrainStop::Broken);
    assert!(d.used().is_empty());
    assert!(r.be.lock_queue(0).is_broken());
    // Broken until the driver resets it: the good request after it is
    // not served, and nothing more is counted.
    let t = r.serve(&mut ring);
    assert_eq!(
        (t[0].drained.popped, t[0].drained.stop),
        (0, DrainStop::Broken)
    );
    assert!(d.used().is_empty());
    let c = r.counters();
    assert_eq!((c.ring_errors, c.requests, c.dropped), (1, 0, 0));
}

/// A driver that re-offers every completed chain as soon as it is
/// signalled, inside the pass (what a used ring laid over the avail
/// ring does by itself): one pass pops a queue size and says it
/// stopped with more available.
#[test]
fn a_pass_pops_at_most_a_queue_size() {
    let r = rig(&[]);
    let d = Driver::new(&r.mem);
    r.header(hdr_at(0), VIRTIO_BLK_T_FLUSH, 0);
    d.desc(0, hdr_at(0), 16, N, 1);
    d.desc(1, st_at(0), 1, W, 0);
    let avail = d.vq.avail_addr().0;
    let mut ring = d.ring(true);
    let mem = r.mem.clone();
    // Every avail slot holds head 0 (the mock zeroed them); after each
    // used entry the avail index is one ahead again, and used_event
    // asks for a signal on the next entry.
    let reoffer = move || {
        let u: u16 = mem.read_obj(GuestAddress(USED + 2)).unwrap();
        mem.write_obj(u, GuestAddress(avail + 4 + 2 * u64::from(QSIZE)))
            .unwrap();
        mem.write_obj(u.wrapping_add(1), GuestAddress(avail + 2))
            .unwrap();
    };
    reoffer();
    ring.on_signal = Some(Box::new(reoffer));
    let t = r.serve(&mut ring);
    assert_eq!(t.len(), 1, "{t:?}");
    let dr = t[0].drained;
    assert_eq!((dr.popped, dr.used), (u64::from(QSIZE), usize::from(QSIZE)));
    assert_eq!(dr.stop, DrainStop::Bounded, "{dr:?}");
    assert!(!t[0].again);
    // The next pass takes the next queue size.
    let t = r.serve(&mut ring);
    assert_eq!(t[0].drained.popped, u64::from(QSIZE));
    assert_eq!(r.counters().flushes, 2 * u64::from(QSIZE));
}

/// A ring outside guest memory breaks the queue until a new memory
/// table comes (the frontend may add the region back); a ring the driver
/// broke otherwise waits for its reset, whatever the memory does.
#[test]
fn only_a_ring_outside_memory_is_served_again_after_a_new_memory_table() {
    let r = rig(&[]);
    let d = Driver::new(&r.mem);
    let mut ring = d.ring(false);
    // The used ring beyond the 1 MiB of guest memory.
    ring.queue
        .try_set_used_ring_address(GuestAddress(0x20_0000))
        .unwrap();
    assert!(r.serve(&mut ring).is_empty(), "the ring was served");
    assert_eq!(r.counters().ring_errors, 1);
    let memory = || crate::backend::GM::new((*r.mem).clone());
    let mut q = r.be.lock_queue(0);
    assert!(q.is_broken());
    q.new_memory(memory());
    assert!(!q.is_broken());

    let mut st = r.be.disk.queue_stats(0);
    q.mark_broken(
        &mut st,
        Path::new("/tmp/w.sock"),
        &BrokenRing::AvailMovesEmpty,
    );
    assert!(q.is_broken());
    q.new_memory(memory());
    assert!(q.is_broken(), "a new memory table does not repair the ring");
    q.restart();
    assert!(!q.is_broken());
}

/// A polled pass leaves the guest's notifications off for the next ones
/// (without EVENT_IDX the used ring's NO_NOTIFY flag, with it an
/// avail_event the pass does not move), and turning them back on looks
/// once more: a request the driver offered while they were off is seen,
/// so the worker does not sleep with it on the ring.
#[test]
fn polled_passes_keep_notifications_off_and_turning_them_on_looks_again() {
    for event_idx in [false, true] {
        let r = rig(&[]);
        let mut d = Driver::new(&r.mem);
        let mut ring = d.ring(event_idx);
        let flags = |r: &Rig| r.mem.read_obj::<u16>(GuestAddress(USED)).unwrap();
        let flush = |d: &mut Driver, k: u64| {
            r.header(hdr_at(k), VIRTIO_BLK_T_FLUSH, 0);
            d.push(&[(hdr_at(k), 16, 0), (st_at(k), 1, W)]);
        };
        let polled = |ring: &mut MockRing| {
            let mut q = r.be.lock_queue(0);
            let mut st = r.be.disk.queue_stats(0);
            with_pass(&r.be, &mut q, &mut st, &mut *ring, &r.mem, |p| {
                p.turn(event_idx, Mode::Poll)
            })
            .unwrap()
        };
        let turn_on = |ring: &mut MockRing| {
            let mut q = r.be.lock_queue(0);
            let mut st = r.be.disk.queue_stats(0);
            with_pass(&r.be, &mut q, &mut st, &mut *ring, &r.mem, |p| {
                p.vq.enable_notification()
            })
            .unwrap()
        };
        flush(&mut d, 0);
        let t = polled(&mut ring);
        assert_eq!(
            (t.drained.popped, t.again),
            (1, false),
            "one pass, no look again"
        );
        let off = |r: &Rig, d: &Driver| {
            if event_idx {
                // Not moved past the request it served: the driver,
                // already past it, does not notify.
                d.avail_event() == 0
            } else {
                flags(r) == 1
            }
        };
        assert!(
            off(&r, &d),
            "event_idx {event_idx}: notifications on while polled"
        );
        // An idle polled pass leaves them off.
        assert_eq!(polled(&mut ring).drained.popped, 0);
        assert!(off(&r, &d), "event_idx {event_idx}");
        // The driver offers a request while they are off; the worker,
        // done polling, turns them on and looks: it is there.
        flush(&mut d, 1);
        assert!(
            turn_on(&mut ring),
            "event_idx {event_idx}: the last look missed it"
        );
        // Served, and turned on with nothing new: sleep.
        assert_eq!(polled(&mut ring).drained.popped, 1);
        assert!(!turn_on(&mut ring));
        if event_idx {
            assert_eq!(d.avail_event(), 2, "notify at the next index");
        } else {
            assert_eq!(flags(&r), 0);
        }
        assert_eq!(d.used().len(), 2);
    }
}

/// A back-end stopped dead at every step of a request's life, with
/// completions out of order, and a new one started on the same disk,
/// guest memory and inflight area: every request completes exactly once,
/// with its data written.
mod crash_and_resume {
    use std::panic::{catch_unwind, AssertUnwindSafe};
    use std::time::{Duration, Instant};

    use super::*;
    use crate::virtq::inflight::{crash, InflightArea, Step};

    const REQUESTS: u64 = 8;

    fn data_at(k: u64) -> u64 {
        0x10000 + 0x1000 * k
    }

    /// Eight 4 KiB writes of byte k+1 to sector 8k, each with its status
    /// byte poisoned.
    fn offer_writes(r: &Rig, d: &mut Driver<'_>) -> Vec<u16> {
        (0..REQUESTS)
            .map(|k| {
                r.mem
                    .write_slice(&[k as u8 + 1; 4096], GuestAddress(data_at(k)))
                    .unwrap();
                r.mem.write_obj(0xeeu8, GuestAddress(st_at(k))).unwrap();
                r.header(hdr_at(k), VIRTIO_BLK_T_OUT, 8 * k);
                d.push(&[(hdr_at(k), 16, 0), (data_at(k), 4096, 0), (st_at(k), 1, W)])
            })
            .collect()
    }

    /// A back-end instance over `r`'s disk and memory, recording in the
    /// area of `file` (SET_INFLIGHT_FD).
    fn instance(r: &Rig, file: &std::fs::File, len: u64) -> Rig {
        let be = BlkBackend::new(r.be.disk.clone()).unwrap();
        let area = Arc::new(InflightArea::open(file, 0, len, 1, QSIZE).unwrap());
        be.lock_queue(0).set_inflight(area.queue(0));
        Rig {
            be,
            mem: r.mem.clone(),
        }
    }

    /// Serve the ring until it is empty, then complete every request in
    /// service (in deadline order: not the order they were taken).
    fn serve_all(r: &Rig, ring: &mut MockRing) {
        r.serve(ring);
        let mut q = r.be.lock_queue(0);
        let mut st = r.be.disk.queue_stats(0);
        let far = Instant::now() + Duration::from_secs(3600);
        with_pass(&r.be, &mut q, &mut st, ring, &r.mem, |p| {
            p.complete_due(far)
        })
        .unwrap();
    }

    /// The ring as a new front-end connection sets it after the back-end
    /// died: the avail and used indices at the guest's used index.
    fn ring_after_crash(d: &Driver<'_>) -> MockRing {
        let mut ring = d.ring(false);
        let used: u16 = d.mem.read_obj(GuestAddress(USED + 2)).unwrap();
        ring.queue.set_next_avail(used);
        ring.queue.set_next_used(used);
        ring
    }

    fn crash_at(step: Step, nth: u32) {
        let first = rig(&["--write-latency", "uniform:1ms..50ms"]);
        let (file, len) = InflightArea::create(1, QSIZE).unwrap();
        let r = instance(&first, &file, len);
        let mut d = Driver::new(&first.mem);
        let heads = offer_writes(&r, &mut d);
        crash::arm(step, nth);
        let died = catch_unwind(AssertUnwindSafe(|| serve_all(&r, &mut d.ring(false))));
        let why = died.expect_err("never reached the step");
        match why.downcast_ref::<crash::Crashed>() {
            Some(crash::Crashed(at)) => assert_eq!(*at, step),
            None => std::panic::resume_unwind(why),
        }
        assert!(!crash::disarm());
        drop(r);

        let next = instance(&first, &file, len);
        serve_all(&next, &mut ring_after_crash(&d));

        let mut used: Vec<u32> = d.used().iter().map(|&(h, _)| h).collect();
        used.sort_unstable();
        let want: Vec<u32> = heads.iter().map(|&h| u32::from(h)).collect();
        assert_eq!(
            used, want,
            "{step:?} #{nth}: each request used exactly once"
        );
        for k in 0..REQUESTS {
            assert_eq!(
                r_status(&next, k),
                STATUS_OK,
                "{step:?} #{nth}: request {k}"
            );
        }
        check_disk(&next, step, nth);
        let q = next.be.lock_queue(0);
        assert_eq!(q.inflight.as_ref().unwrap().area.in_flight(), 0);
    }

    fn r_status(r: &Rig, k: u64) -> u8 {
        r.byte(st_at(k))
    }

    /// Read every sector back through a fresh instance without an area.
    fn check_disk(r: &Rig, step: Step, nth: u32) {
        let reader = Rig {
            be: BlkBackend::new(r.be.disk.clone()).unwrap(),
            mem: Arc::new(GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap()),
        };
        let mut d = Driver::new(&reader.mem);
        for k in 0..REQUESTS {
            reader.header(hdr_at(k), VIRTIO_BLK_T_IN, 8 * k);
            d.push(&[(hdr_at(k), 16, 0), (data_at(k), 4096, W), (st_at(k), 1, W)]);
        }
        reader.serve(&mut d.ring(false));
        for k in 0..REQUESTS {
            let got = reader.bytes(data_at(k), 4096);
            assert!(
                got.iter().all(|&b| b == k as u8 + 1),
                "{step:?} #{nth}: sector {} holds {:#x}..",
                8 * k,
                got[0]
            );
        }
    }

    #[test]
    fn every_step_of_every_request() {
        for step in [
            Step::Taken,
            Step::Marked,
            Step::Served,
            Step::BatchHead,
            Step::Published,
            Step::Cleared,
        ] {
            for nth in 1..=REQUESTS as u32 {
                crash_at(step, nth);
            }
        }
    }

    /// Without a crash the area ends empty, and a restart serves nothing
    /// again.
    #[test]
    fn a_clean_stop_leaves_nothing_to_serve_again() {
        let first = rig(&["--write-latency", "uniform:1ms..50ms"]);
        let (file, len) = InflightArea::create(1, QSIZE).unwrap();
        let r = instance(&first, &file, len);
        let mut d = Driver::new(&first.mem);
        offer_writes(&r, &mut d);
        serve_all(&r, &mut d.ring(false));
        assert_eq!(d.used().len(), REQUESTS as usize);
        drop(r);
        let next = instance(&first, &file, len);
        serve_all(&next, &mut ring_after_crash(&d));
        assert_eq!(d.used().len(), REQUESTS as usize, "nothing completed twice");
    }
}
