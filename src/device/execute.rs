//! Executing one virtio-blk request (virtio 1.2, 5.2.6) against a disk.
//!
//! A request is a descriptor chain (walked by
//! [`crate::virtio_blk::request::collect_segments`]): device-readable bytes
//! (a 16-byte header `{le32 type, le32 reserved, le64 sector}` then data for
//! writes, discard and write-zeroes ranges) followed by device-writable
//! bytes (data for reads and GET_ID, then the one-byte status at the very
//! end).
//!
//! Everything here treats the guest as hostile: every guest address goes
//! through vm-memory's bounds-checked accessors, the chain walker refuses
//! loops and over-long chains (virtio-queue's TTL; we detect the truncation),
//! and every failure becomes either an error status or, when no status byte
//! can be written, a dropped chain the caller counts.

use std::io;

use virtio_bindings::virtio_blk::*;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, VolatileSlice};

use std::cell::RefCell;

use smallvec::SmallVec;

use crate::device::config::DiskConfig;
use crate::device::faults::{FaultDecision, FaultState};
use crate::device::storage::Storage;
use crate::virtio_blk::features::BlkFeature;
use crate::virtio_blk::request::{
    DropReason, Op, Segment, HEADER_SIZE, RANGE_SIZE, SECTOR_SIZE, STATUS_IOERR, STATUS_OK,
    STATUS_UNSUPP,
};

/// What happened to one chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A status was written; `used_len` bytes were written into the chain.
    Completed {
        op: Op,
        status: u8,
        used_len: u32,
        /// Data bytes transferred (reads and writes) or covered (discard,
        /// write-zeroes).
        bytes: u64,
        /// The fault injected into this request, if any.
        fault: FaultDecision,
    },
    /// The chain was malformed beyond answering.
    Dropped(DropReason),
}

/// The parts of a disk a request needs.
pub struct Device<'a> {
    pub storage: &'a dyn Storage,
    pub cfg: &'a DiskConfig,
    /// Capacity in bytes.
    pub capacity: u64,
    /// Current cache mode: false means every write is made durable before
    /// it completes (write-through).
    pub writeback: bool,
    /// The queue's fault injection, when configured.
    pub faults: Option<&'a RefCell<FaultState>>,
}

impl Device<'_> {
    /// Ask fault injection about a valid request about to touch storage.
    fn fault(&self, op: Op, ranges: &[(u64, u64)]) -> FaultDecision {
        match self.faults {
            Some(f) => f.borrow_mut().decide(op, ranges),
            None => FaultDecision::None,
        }
    }
}

/// A request's guest buffers: kept on the stack up to four slices (a 4 KiB
/// read is one), so the common request allocates nothing.
type Slices<'m> = SmallVec<[VolatileSlice<'m, ()>; 4]>;

/// Guest memory slices covering `len` bytes starting `skip` bytes into the
/// readable (`write == false`) or writable segments.
fn slices<'m>(
    mem: &'m GuestMemoryMmap,
    segs: &[Segment],
    write: bool,
    mut skip: u64,
    len: u64,
) -> Result<Slices<'m>, ()> {
    let mut out = Slices::new();
    let mut left = len;
    for s in segs.iter().filter(|s| s.write == write) {
        if left == 0 {
            break;
        }
        let slen = u64::from(s.len);
        if skip >= slen {
            skip -= slen;
            continue;
        }
        let take = (slen - skip).min(left);
        let addr = s.addr.checked_add(skip).ok_or(())?;
        for sl in GuestMemoryBackend::get_slices(mem, GuestAddress(addr), take as usize) {
            out.push(sl.map_err(|_| ())?);
        }
        left -= take;
        skip = 0;
    }
    if left != 0 {
        return Err(());
    }
    Ok(out)
}

/// Copy `out.len()` readable bytes starting `skip` bytes in.
fn read_bytes(
    mem: &GuestMemoryMmap,
    segs: &[Segment],
    skip: u64,
    out: &mut [u8],
) -> Result<(), ()> {
    let sl = slices(mem, segs, false, skip, out.len() as u64)?;
    let mut p = 0;
    for s in sl {
        s.copy_to(&mut out[p..p + s.len()]);
        p += s.len();
    }
    Ok(())
}

/// Execute the request whose segments are `segs` (as produced by
/// [`collect_segments`]) and write its status. Never panics on guest input.
pub fn execute(dev: &Device<'_>, mem: &GuestMemoryMmap, segs: &[Segment]) -> Outcome {
    let status_seg = segs[segs.len() - 1];
    // One lookup: the status byte's slice is found before the request runs
    // (a chain without a writable status byte is dropped untouched) and
    // written through after.
    let Some(status_byte) = status_seg
        .addr
        .checked_add(u64::from(status_seg.len) - 1)
        .and_then(|a| GuestMemoryBackend::get_slice(mem, GuestAddress(a), 1).ok())
    else {
        return Outcome::Dropped(DropReason::StatusUnwritable);
    };

    let (op, status, used_data, bytes, fault) = run(dev, mem, segs);
    let used_len = if status == STATUS_OK {
        used_data + 1
    } else {
        1
    };
    if status_byte.write_obj::<u8>(status, 0).is_err() {
        return Outcome::Dropped(DropReason::StatusUnwritable);
    }
    Outcome::Completed {
        op,
        status,
        used_len,
        bytes,
        fault,
    }
}

/// Returns (op, status, data bytes written into the chain, bytes
/// transferred, injected fault).
fn run(
    dev: &Device<'_>,
    mem: &GuestMemoryMmap,
    segs: &[Segment],
) -> (Op, u8, u32, u64, FaultDecision) {
    let mut fault = FaultDecision::None;
    let (op, status, used, bytes) = run_checked(dev, mem, segs, &mut fault);
    (op, status, used, bytes, fault)
}

/// A valid request's fault decision: IOERR for injected failures (storage
/// untouched), otherwise go on (a stall only delays the completion).
fn injected(dev: &Device<'_>, op: Op, ranges: &[(u64, u64)], fault: &mut FaultDecision) -> bool {
    *fault = dev.fault(op, ranges);
    matches!(fault, FaultDecision::FailEvery | FaultDecision::FailRange)
}

fn run_checked(
    dev: &Device<'_>,
    mem: &GuestMemoryMmap,
    segs: &[Segment],
    fault: &mut FaultDecision,
) -> (Op, u8, u32, u64) {
    // Device-readable descriptors must all precede device-writable ones.
    if let Some(first_w) = segs.iter().position(|s| s.write) {
        if segs[first_w..].iter().any(|s| !s.write) {
            return (Op::Other, STATUS_IOERR, 0, 0);
        }
    }
    let readable: u64 = segs
        .iter()
        .filter(|s| !s.write)
        .map(|s| u64::from(s.len))
        .sum();
    let writable: u64 = segs
        .iter()
        .filter(|s| s.write)
        .map(|s| u64::from(s.len))
        .sum();
    if readable < HEADER_SIZE {
        return (Op::Other, STATUS_IOERR, 0, 0);
    }
    let mut hdr = [0u8; HEADER_SIZE as usize];
    // The header almost always sits whole in the first descriptor: one
    // guest-memory lookup. Otherwise gather it across descriptors.
    let whole = segs[0].len as u64 >= HEADER_SIZE
        && mem.read_slice(&mut hdr, GuestAddress(segs[0].addr)).is_ok();
    if !whole && read_bytes(mem, segs, 0, &mut hdr).is_err() {
        return (Op::Other, STATUS_IOERR, 0, 0);
    }
    let rtype = u32::from_le_bytes(hdr[0..4].try_into().unwrap_or_default());
    let sector = u64::from_le_bytes(hdr[8..16].try_into().unwrap_or_default());
    let op = Op::from_type(rtype);
    let out_len = readable - HEADER_SIZE; // data after the header
    let in_len = writable - 1; // data before the status byte
    let cfg = dev.cfg;

    let range_ok = |len: u64| -> bool {
        let lbs = u64::from(cfg.block_size);
        let Some(offset) = sector.checked_mul(SECTOR_SIZE) else {
            return false;
        };
        len % lbs == 0
            && offset % lbs == 0
            && offset
                .checked_add(len)
                .is_some_and(|end| end <= dev.capacity)
    };

    match op {
        Op::Read => {
            if !range_ok(in_len) {
                return (op, STATUS_IOERR, 0, 0);
            }
            if injected(dev, op, &[(sector, in_len / SECTOR_SIZE)], fault) {
                return (op, STATUS_IOERR, 0, 0);
            }
            let Ok(bufs) = slices(mem, segs, true, 0, in_len) else {
                return (op, STATUS_IOERR, 0, 0);
            };
            match dev.storage.read_into(sector * SECTOR_SIZE, &bufs) {
                Ok(()) => (op, STATUS_OK, in_len as u32, in_len),
                Err(e) => io_error(op, "read", sector, &e),
            }
        }
        Op::Write => {
            if cfg.read_only || !range_ok(out_len) {
                return (op, STATUS_IOERR, 0, 0);
            }
            if injected(dev, op, &[(sector, out_len / SECTOR_SIZE)], fault) {
                return (op, STATUS_IOERR, 0, 0);
            }
            let Ok(bufs) = slices(mem, segs, false, HEADER_SIZE, out_len) else {
                return (op, STATUS_IOERR, 0, 0);
            };
            let r = dev
                .storage
                .write_from(sector * SECTOR_SIZE, &bufs)
                .and_then(|()| {
                    if dev.writeback {
                        Ok(())
                    } else {
                        dev.storage.flush()
                    }
                });
            match r {
                Ok(()) => (op, STATUS_OK, 0, out_len),
                Err(e) => io_error(op, "write", sector, &e),
            }
        }
        Op::Flush if injected(dev, op, &[], fault) => (op, STATUS_IOERR, 0, 0),
        Op::Flush => match dev.storage.flush() {
            Ok(()) => (op, STATUS_OK, 0, 0),
            Err(e) => io_error(op, "flush", sector, &e),
        },
        Op::GetId => {
            let mut id = [0u8; VIRTIO_BLK_ID_BYTES as usize];
            let s = cfg.serial.as_bytes();
            let n = s.len().min(id.len());
            id[..n].copy_from_slice(&s[..n]);
            let n = in_len.min(id.len() as u64);
            let Ok(bufs) = slices(mem, segs, true, 0, n) else {
                return (op, STATUS_IOERR, 0, 0);
            };
            let mut p = 0;
            for b in bufs {
                b.copy_from(&id[p..p + b.len()]);
                p += b.len();
            }
            (op, STATUS_OK, n as u32, 0)
        }
        Op::Discard | Op::WriteZeroes => discard_or_zero(dev, mem, segs, op, out_len, fault),
        Op::Other => (op, STATUS_UNSUPP, 0, 0),
    }
}

fn io_error(op: Op, what: &str, sector: u64, e: &io::Error) -> (Op, u8, u32, u64) {
    log::warn!("{what} at sector {sector} failed: {e}");
    (op, STATUS_IOERR, 0, 0)
}

fn discard_or_zero(
    dev: &Device<'_>,
    mem: &GuestMemoryMmap,
    segs: &[Segment],
    op: Op,
    len: u64,
    fault: &mut FaultDecision,
) -> (Op, u8, u32, u64) {
    let cfg = dev.cfg;
    let (feature, max_seg, max_sectors) = if op == Op::Discard {
        (
            BlkFeature::Discard,
            cfg.max_discard_seg,
            cfg.max_discard_sectors,
        )
    } else {
        (
            BlkFeature::WriteZeroes,
            cfg.max_write_zeroes_seg,
            cfg.max_write_zeroes_sectors,
        )
    };
    if !cfg.features.has(feature) {
        return (op, STATUS_UNSUPP, 0, 0);
    }
    if cfg.read_only {
        return (op, STATUS_IOERR, 0, 0);
    }
    if len == 0 || len % RANGE_SIZE != 0 || len / RANGE_SIZE > u64::from(max_seg) {
        return (op, STATUS_IOERR, 0, 0);
    }
    let mut raw = vec![0u8; len as usize];
    if read_bytes(mem, segs, HEADER_SIZE, &mut raw).is_err() {
        return (op, STATUS_IOERR, 0, 0);
    }
    // Validate every range before touching the storage.
    let mut ranges = Vec::with_capacity(raw.len() / RANGE_SIZE as usize);
    let lbs = u64::from(cfg.block_size);
    for r in raw.chunks_exact(RANGE_SIZE as usize) {
        let sector = u64::from_le_bytes(r[0..8].try_into().unwrap_or_default());
        let num = u32::from_le_bytes(r[8..12].try_into().unwrap_or_default());
        let flags = u32::from_le_bytes(r[12..16].try_into().unwrap_or_default());
        let allowed = if op == Op::WriteZeroes {
            VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP
        } else {
            0
        };
        if flags & !allowed != 0 {
            return (op, STATUS_UNSUPP, 0, 0);
        }
        let bytes = u64::from(num) * SECTOR_SIZE;
        let Some(offset) = sector.checked_mul(SECTOR_SIZE) else {
            return (op, STATUS_IOERR, 0, 0);
        };
        let in_range = offset
            .checked_add(bytes)
            .is_some_and(|end| end <= dev.capacity);
        if num > max_sectors || !in_range || offset % lbs != 0 || bytes % lbs != 0 {
            return (op, STATUS_IOERR, 0, 0);
        }
        ranges.push((
            offset,
            bytes,
            flags & VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP != 0,
        ));
    }
    let sectors: Vec<(u64, u64)> = ranges
        .iter()
        .map(|(o, b, _)| (o / SECTOR_SIZE, b / SECTOR_SIZE))
        .collect();
    if injected(dev, op, &sectors, fault) {
        return (op, STATUS_IOERR, 0, 0);
    }
    let mut total = 0;
    for (offset, bytes, unmap) in ranges {
        let r = if op == Op::Discard {
            dev.storage.discard(offset, bytes)
        } else {
            dev.storage.write_zeroes(offset, bytes, unmap)
        };
        if let Err(e) = r {
            return io_error(op, "discard/write-zeroes", offset / SECTOR_SIZE, &e);
        }
        total += bytes;
    }
    (op, STATUS_OK, 0, total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::config::DiskArgs;
    use crate::device::storage::MemStorage;
    use crate::virtio_blk::request::collect_segments;
    use virtio_bindings::virtio_ring::{
        VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE,
    };
    use virtio_queue::desc::split::Descriptor;
    use virtio_queue::desc::RawDescriptor;
    use virtio_queue::mock::MockSplitQueue;
    use virtio_queue::{Queue, QueueOwnedT, QueueT};

    const W: u16 = VRING_DESC_F_WRITE as u16;
    const N: u16 = VRING_DESC_F_NEXT as u16;

    struct Env {
        mem: GuestMemoryMmap,
        cfg: DiskConfig,
        storage: MemStorage,
    }

    fn env(extra: &[&str]) -> Env {
        let mut a = vec![
            "--socket",
            "/tmp/t.sock",
            "--disk",
            "mem",
            "--size",
            "1M",
            "--serial",
            "test-serial",
        ];
        a.extend_from_slice(extra);
        let cfg = DiskArgs::parse_for_test(&a).to_configs().unwrap().remove(0);
        Env {
            mem: GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x100000)]).unwrap(),
            storage: MemStorage::new(cfg.size).unwrap(),
            cfg,
        }
    }

    fn hdr(e: &Env, at: u64, t: u32, sector: u64) {
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&t.to_le_bytes());
        h[8..16].copy_from_slice(&sector.to_le_bytes());
        e.mem.write_slice(&h, GuestAddress(at)).unwrap();
    }

    /// Build a chain from (addr, len, flags) with NEXT links filled in, run
    /// it, return the outcome and the status byte.
    fn run_chain(e: &Env, descs: &[(u64, u32, u16)]) -> (Outcome, u8) {
        let vq = MockSplitQueue::new(&e.mem, 16);
        let raw: Vec<RawDescriptor> = descs
            .iter()
            .enumerate()
            .map(|(i, (a, l, f))| {
                let more = if i + 1 < descs.len() { N } else { 0 };
                RawDescriptor::from(Descriptor::new(*a, *l, *f | more, (i + 1) as u16))
            })
            .collect();
        vq.build_desc_chain(&raw).unwrap();
        let mut q: Queue = vq.create_queue().unwrap();
        let chain = q.iter(&e.mem).unwrap().next().unwrap();
        let mut segs = Vec::new();
        let out = match collect_segments(chain, &mut segs) {
            Ok(()) => {
                let dev = Device {
                    storage: &e.storage,
                    cfg: &e.cfg,
                    capacity: e.cfg.size,
                    writeback: true,
                    faults: None,
                };
                execute(&dev, &e.mem, &segs)
            }
            Err(r) => Outcome::Dropped(r),
        };
        let last = descs.last().unwrap();
        let st = e
            .mem
            .read_obj::<u8>(GuestAddress(
                last.0.wrapping_add(u64::from(last.1.max(1)) - 1),
            ))
            .unwrap_or(0xff);
        (out, st)
    }

    #[test]
    fn write_then_read() {
        let e = env(&[]);
        e.mem
            .write_slice(&[0x5a; 4096], GuestAddress(0x10000))
            .unwrap();
        hdr(&e, 0x8000, VIRTIO_BLK_T_OUT, 8);
        let (o, st) = run_chain(&e, &[(0x8000, 16, 0), (0x10000, 4096, 0), (0x9000, 1, W)]);
        assert_eq!(st, STATUS_OK);
        assert_eq!(
            o,
            Outcome::Completed {
                op: Op::Write,
                status: STATUS_OK,
                used_len: 1,
                bytes: 4096,
                fault: FaultDecision::None
            }
        );
        hdr(&e, 0x8000, VIRTIO_BLK_T_IN, 8);
        // Data split over two descriptors, status in its own.
        let (o, st) = run_chain(
            &e,
            &[
                (0x8000, 16, 0),
                (0x20000, 1024, W),
                (0x30000, 3072, W),
                (0x9000, 1, W),
            ],
        );
        assert_eq!(st, STATUS_OK);
        assert_eq!(
            o,
            Outcome::Completed {
                op: Op::Read,
                status: STATUS_OK,
                used_len: 4097,
                bytes: 4096,
                fault: FaultDecision::None
            }
        );
        let mut buf = vec![0u8; 3072];
        e.mem.read_slice(&mut buf, GuestAddress(0x30000)).unwrap();
        assert!(buf.iter().all(|b| *b == 0x5a));
    }

    #[test]
    fn header_split_across_descriptors() {
        // The header's 16 bytes over two readable descriptors (the slow
        // path of the header read), for a write and a read of sector 3.
        let e = env(&[]);
        let split_hdr = |t: u32| {
            let mut h = [0u8; 16];
            h[0..4].copy_from_slice(&t.to_le_bytes());
            h[8..16].copy_from_slice(&3u64.to_le_bytes());
            e.mem.write_slice(&h[..5], GuestAddress(0x8000)).unwrap();
            e.mem.write_slice(&h[5..], GuestAddress(0xa000)).unwrap();
        };
        e.mem
            .write_slice(&[0x77; 512], GuestAddress(0x10000))
            .unwrap();
        split_hdr(VIRTIO_BLK_T_OUT);
        let (o, st) = run_chain(
            &e,
            &[
                (0x8000, 5, 0),
                (0xa000, 11, 0),
                (0x10000, 512, 0),
                (0x9000, 1, W),
            ],
        );
        assert_eq!(st, STATUS_OK);
        assert!(matches!(
            o,
            Outcome::Completed {
                op: Op::Write,
                bytes: 512,
                ..
            }
        ));
        split_hdr(VIRTIO_BLK_T_IN);
        let (o, st) = run_chain(
            &e,
            &[
                (0x8000, 5, 0),
                (0xa000, 11, 0),
                (0x20000, 512, W),
                (0x9000, 1, W),
            ],
        );
        assert_eq!(st, STATUS_OK);
        assert!(matches!(
            o,
            Outcome::Completed {
                op: Op::Read,
                used_len: 513,
                ..
            }
        ));
        let mut b = [0u8; 512];
        e.mem.read_slice(&mut b, GuestAddress(0x20000)).unwrap();
        assert!(b.iter().all(|x| *x == 0x77));
    }

    #[test]
    fn header_and_data_in_one_descriptor_status_with_data() {
        // Any framing is legal: header+data in one readable descriptor,
        // data+status in one writable descriptor.
        let e = env(&[]);
        hdr(&e, 0x8000, VIRTIO_BLK_T_OUT, 0);
        e.mem
            .write_slice(&[0x11; 512], GuestAddress(0x8010))
            .unwrap();
        let (_, st) = run_chain(&e, &[(0x8000, 16 + 512, 0), (0x9000, 1, W)]);
        assert_eq!(st, STATUS_OK);
        hdr(&e, 0x8000, VIRTIO_BLK_T_IN, 0);
        let (o, st) = run_chain(&e, &[(0x8000, 16, 0), (0x20000, 513, W)]);
        assert_eq!(st, STATUS_OK);
        assert!(matches!(o, Outcome::Completed { used_len: 513, .. }));
        let mut b = [0u8; 512];
        e.mem.read_slice(&mut b, GuestAddress(0x20000)).unwrap();
        assert!(b.iter().all(|x| *x == 0x11));
    }

    #[test]
    fn error_statuses() {
        let e = env(&[]);
        let cap = e.cfg.size / 512;
        // Out-of-range sector.
        hdr(&e, 0x8000, VIRTIO_BLK_T_IN, cap);
        assert_eq!(
            run_chain(&e, &[(0x8000, 16, 0), (0x20000, 512, W), (0x9000, 1, W)]).1,
            STATUS_IOERR
        );
        // Straddling the end.
        hdr(&e, 0x8000, VIRTIO_BLK_T_IN, cap - 1);
        assert_eq!(
            run_chain(&e, &[(0x8000, 16, 0), (0x20000, 1024, W), (0x9000, 1, W)]).1,
            STATUS_IOERR
        );
        // Overflowing sector * 512.
        hdr(&e, 0x8000, VIRTIO_BLK_T_OUT, u64::MAX / 256);
        assert_eq!(
            run_chain(&e, &[(0x8000, 16, 0), (0x20000, 512, 0), (0x9000, 1, W)]).1,
            STATUS_IOERR
        );
        // Length not a multiple of 512.
        hdr(&e, 0x8000, VIRTIO_BLK_T_IN, 0);
        assert_eq!(
            run_chain(&e, &[(0x8000, 16, 0), (0x20000, 100, W), (0x9000, 1, W)]).1,
            STATUS_IOERR
        );
        // Unknown type.
        hdr(&e, 0x8000, 0x55, 0);
        let (o, st) = run_chain(&e, &[(0x8000, 16, 0), (0x9000, 1, W)]);
        assert_eq!(st, STATUS_UNSUPP);
        assert!(matches!(
            o,
            Outcome::Completed {
                op: Op::Other,
                used_len: 1,
                ..
            }
        ));
        // Short header.
        hdr(&e, 0x8000, VIRTIO_BLK_T_IN, 0);
        assert_eq!(
            run_chain(&e, &[(0x8000, 8, 0), (0x9000, 1, W)]).1,
            STATUS_IOERR
        );
        // Data outside guest memory.
        hdr(&e, 0x8000, VIRTIO_BLK_T_IN, 0);
        assert_eq!(
            run_chain(
                &e,
                &[(0x8000, 16, 0), (0x1_0000_0000, 512, W), (0x9000, 1, W)]
            )
            .1,
            STATUS_IOERR
        );
        // Header outside guest memory.
        assert_eq!(
            run_chain(&e, &[(0xffff_0000_0000, 16, 0), (0x9000, 1, W)]).1,
            STATUS_IOERR
        );
        // Data range crossing the end of guest memory.
        assert_eq!(
            run_chain(&e, &[(0x8000, 16, 0), (0xff000, 0x2000, W), (0x9000, 1, W)]).1,
            STATUS_IOERR
        );
        // Readable after writable.
        hdr(&e, 0x8000, VIRTIO_BLK_T_IN, 0);
        assert_eq!(
            run_chain(
                &e,
                &[
                    (0x8000, 16, 0),
                    (0x20000, 512, W),
                    (0x8000, 16, 0),
                    (0x9000, 1, W)
                ]
            )
            .1,
            STATUS_IOERR
        );
    }

    #[test]
    fn read_only() {
        let e = env(&["--read-only"]);
        hdr(&e, 0x8000, VIRTIO_BLK_T_OUT, 0);
        assert_eq!(
            run_chain(&e, &[(0x8000, 16, 0), (0x20000, 512, 0), (0x9000, 1, W)]).1,
            STATUS_IOERR
        );
        hdr(&e, 0x8000, VIRTIO_BLK_T_IN, 0);
        assert_eq!(
            run_chain(&e, &[(0x8000, 16, 0), (0x20000, 512, W), (0x9000, 1, W)]).1,
            STATUS_OK
        );
        let mut r = [0u8; 32];
        r[8..12].copy_from_slice(&8u32.to_le_bytes());
        e.mem.write_slice(&r[..16], GuestAddress(0x10000)).unwrap();
        hdr(&e, 0x8000, VIRTIO_BLK_T_DISCARD, 0);
        assert_eq!(
            run_chain(&e, &[(0x8000, 16, 0), (0x10000, 16, 0), (0x9000, 1, W)]).1,
            STATUS_IOERR
        );
    }

    #[test]
    fn block_size_4k_alignment() {
        let e = env(&["--block-size", "4096"]);
        hdr(&e, 0x8000, VIRTIO_BLK_T_IN, 1);
        assert_eq!(
            run_chain(&e, &[(0x8000, 16, 0), (0x20000, 4096, W), (0x9000, 1, W)]).1,
            STATUS_IOERR
        );
        hdr(&e, 0x8000, VIRTIO_BLK_T_IN, 8);
        assert_eq!(
            run_chain(&e, &[(0x8000, 16, 0), (0x20000, 512, W), (0x9000, 1, W)]).1,
            STATUS_IOERR
        );
        assert_eq!(
            run_chain(&e, &[(0x8000, 16, 0), (0x20000, 4096, W), (0x9000, 1, W)]).1,
            STATUS_OK
        );
    }

    #[test]
    fn get_id() {
        let e = env(&[]);
        hdr(&e, 0x8000, VIRTIO_BLK_T_GET_ID, 0);
        e.mem
            .write_slice(&[0xee; 20], GuestAddress(0x20000))
            .unwrap();
        let (o, st) = run_chain(&e, &[(0x8000, 16, 0), (0x20000, 20, W), (0x9000, 1, W)]);
        assert_eq!(st, STATUS_OK);
        assert!(matches!(
            o,
            Outcome::Completed {
                op: Op::GetId,
                used_len: 21,
                ..
            }
        ));
        let mut id = [0u8; 20];
        e.mem.read_slice(&mut id, GuestAddress(0x20000)).unwrap();
        assert_eq!(&id[..11], b"test-serial");
        assert!(id[11..].iter().all(|b| *b == 0));
    }

    #[test]
    fn flush_ok() {
        let e = env(&[]);
        hdr(&e, 0x8000, VIRTIO_BLK_T_FLUSH, 0);
        let (o, st) = run_chain(&e, &[(0x8000, 16, 0), (0x9000, 1, W)]);
        assert_eq!(st, STATUS_OK);
        assert!(matches!(
            o,
            Outcome::Completed {
                op: Op::Flush,
                used_len: 1,
                ..
            }
        ));
    }

    fn range(e: &Env, at: u64, sector: u64, num: u32, flags: u32) {
        let mut r = [0u8; 16];
        r[0..8].copy_from_slice(&sector.to_le_bytes());
        r[8..12].copy_from_slice(&num.to_le_bytes());
        r[12..16].copy_from_slice(&flags.to_le_bytes());
        e.mem.write_slice(&r, GuestAddress(at)).unwrap();
    }

    #[test]
    fn discard_and_write_zeroes() {
        let e = env(&[]);
        e.mem
            .write_slice(&[0x77; 8192], GuestAddress(0x10000))
            .unwrap();
        hdr(&e, 0x8000, VIRTIO_BLK_T_OUT, 0);
        assert_eq!(
            run_chain(&e, &[(0x8000, 16, 0), (0x10000, 8192, 0), (0x9000, 1, W)]).1,
            STATUS_OK
        );
        // Two ranges in one request.
        range(&e, 0x30000, 0, 1, 0);
        range(&e, 0x30010, 4, 2, 0);
        hdr(&e, 0x8000, VIRTIO_BLK_T_DISCARD, 0);
        let (o, st) = run_chain(&e, &[(0x8000, 16, 0), (0x30000, 32, 0), (0x9000, 1, W)]);
        assert_eq!(st, STATUS_OK);
        assert!(matches!(o, Outcome::Completed { bytes: 1536, .. }));
        hdr(&e, 0x8000, VIRTIO_BLK_T_IN, 0);
        run_chain(&e, &[(0x8000, 16, 0), (0x20000, 8192, W), (0x9000, 1, W)]);
        let mut b = vec![0u8; 8192];
        e.mem.read_slice(&mut b, GuestAddress(0x20000)).unwrap();
        assert!(b[..512].iter().all(|x| *x == 0));
        assert!(b[512..2048].iter().all(|x| *x == 0x77));
        assert!(b[2048..3072].iter().all(|x| *x == 0));
        assert!(b[3072..].iter().all(|x| *x == 0x77));
        // Discard with UNMAP flag: UNSUPP. Write-zeroes with UNMAP: fine.
        range(&e, 0x30000, 8, 1, VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP);
        assert_eq!(
            run_chain(&e, &[(0x8000, 16, 0), (0x30000, 16, 0), (0x9000, 1, W)]).1,
            STATUS_OK
        );
        hdr(&e, 0x8000, VIRTIO_BLK_T_DISCARD, 0);
        assert_eq!(
            run_chain(&e, &[(0x8000, 16, 0), (0x30000, 16, 0), (0x9000, 1, W)]).1,
            STATUS_UNSUPP
        );
        hdr(&e, 0x8000, VIRTIO_BLK_T_WRITE_ZEROES, 0);
        assert_eq!(
            run_chain(&e, &[(0x8000, 16, 0), (0x30000, 16, 0), (0x9000, 1, W)]).1,
            STATUS_OK
        );
        // Reserved flag bits: UNSUPP.
        range(&e, 0x30000, 8, 1, 0x80);
        assert_eq!(
            run_chain(&e, &[(0x8000, 16, 0), (0x30000, 16, 0), (0x9000, 1, W)]).1,
            STATUS_UNSUPP
        );
        // Out of range, and over the per-request sector limit.
        range(&e, 0x30000, e.cfg.size / 512, 1, 0);
        assert_eq!(
            run_chain(&e, &[(0x8000, 16, 0), (0x30000, 16, 0), (0x9000, 1, W)]).1,
            STATUS_IOERR
        );
        range(&e, 0x30000, 0, e.cfg.max_write_zeroes_sectors + 1, 0);
        assert_eq!(
            run_chain(&e, &[(0x8000, 16, 0), (0x30000, 16, 0), (0x9000, 1, W)]).1,
            STATUS_IOERR
        );
        // Payload not a multiple of 16 / empty.
        assert_eq!(
            run_chain(&e, &[(0x8000, 16, 0), (0x30000, 10, 0), (0x9000, 1, W)]).1,
            STATUS_IOERR
        );
        assert_eq!(
            run_chain(&e, &[(0x8000, 16, 0), (0x9000, 1, W)]).1,
            STATUS_IOERR
        );
    }

    #[test]
    fn features_off_unsupp() {
        let e = env(&["--disable-features", "discard,write-zeroes"]);
        range(&e, 0x30000, 0, 1, 0);
        hdr(&e, 0x8000, VIRTIO_BLK_T_DISCARD, 0);
        assert_eq!(
            run_chain(&e, &[(0x8000, 16, 0), (0x30000, 16, 0), (0x9000, 1, W)]).1,
            STATUS_UNSUPP
        );
        hdr(&e, 0x8000, VIRTIO_BLK_T_WRITE_ZEROES, 0);
        assert_eq!(
            run_chain(&e, &[(0x8000, 16, 0), (0x30000, 16, 0), (0x9000, 1, W)]).1,
            STATUS_UNSUPP
        );
    }

    #[test]
    fn dropped_chains() {
        let e = env(&[]);
        hdr(&e, 0x8000, VIRTIO_BLK_T_IN, 0);
        // No writable descriptor: no status.
        assert_eq!(
            run_chain(&e, &[(0x8000, 16, 0), (0x20000, 512, 0)]).0,
            Outcome::Dropped(DropReason::NoStatus)
        );
        // Zero-length status descriptor.
        assert_eq!(
            run_chain(&e, &[(0x8000, 16, 0), (0x20000, 512, W), (0x9000, 0, W)]).0,
            Outcome::Dropped(DropReason::EmptyStatus)
        );
        // Status outside guest memory.
        assert_eq!(
            run_chain(&e, &[(0x8000, 16, 0), (0x1_0000_0000, 1, W)]).0,
            Outcome::Dropped(DropReason::StatusUnwritable)
        );
        // Status address overflowing.
        assert_eq!(
            run_chain(&e, &[(0x8000, 16, 0), (u64::MAX, 2, W)]).0,
            Outcome::Dropped(DropReason::StatusUnwritable)
        );
    }

    #[test]
    fn zero_length_data_buffer_ok() {
        let e = env(&[]);
        hdr(&e, 0x8000, VIRTIO_BLK_T_IN, 0);
        let (o, st) = run_chain(
            &e,
            &[
                (0x8000, 16, 0),
                (0x20000, 512, W),
                (0x21000, 0, W),
                (0x9000, 1, W),
            ],
        );
        assert_eq!(st, STATUS_OK);
        assert!(matches!(o, Outcome::Completed { used_len: 513, .. }));
    }

    #[test]
    fn looping_chain_is_truncated() {
        let e = env(&[]);
        let vq = MockSplitQueue::new(&e.mem, 16);
        hdr(&e, 0x8000, VIRTIO_BLK_T_IN, 0);
        // 0 -> 1 -> 0 -> ...
        let d0 = RawDescriptor::from(Descriptor::new(0x8000, 16, N, 1));
        let d1 = RawDescriptor::from(Descriptor::new(0x9000, 1, N | W, 0));
        vq.desc_table().store(0, d0).unwrap();
        vq.desc_table().store(1, d1).unwrap();
        vq.avail().ring().ref_at(0).unwrap().store(0u16);
        vq.avail().idx().store(1u16);
        let mut q: Queue = vq.create_queue().unwrap();
        let chain = q.iter(&e.mem).unwrap().next().unwrap();
        let mut segs = Vec::new();
        assert_eq!(
            collect_segments(chain, &mut segs),
            Err(DropReason::Truncated)
        );
        assert_eq!(segs.len(), 16, "walk bounded by the queue size");
    }

    #[test]
    fn bad_indirect_table_is_dropped() {
        let e = env(&[]);
        let vq = MockSplitQueue::new(&e.mem, 16);
        let d0 = RawDescriptor::from(Descriptor::new(
            0x1_0000_0000,
            64,
            VRING_DESC_F_INDIRECT as u16,
            0,
        ));
        vq.desc_table().store(0, d0).unwrap();
        vq.avail().ring().ref_at(0).unwrap().store(0u16);
        vq.avail().idx().store(1u16);
        let mut q: Queue = vq.create_queue().unwrap();
        let chain = q.iter(&e.mem).unwrap().next().unwrap();
        let mut segs = Vec::new();
        assert!(collect_segments(chain, &mut segs).is_err());
        // And a queue whose avail index jumped too far is refused by iter().
        vq.avail().idx().store(100u16);
        let mut q: Queue = vq.create_queue().unwrap();
        assert!(q.iter(&e.mem).is_err());
        let _ = q.size();
    }
}
