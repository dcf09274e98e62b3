//! Executing one virtio-blk request (virtio 1.2, 5.2.6) against a disk.
//!
//! A chain is parsed by [`Request::parse`] (the wire format, in
//! [`crate::virtio_blk::request`]), executed here by [`execute`], and
//! answered by [`answer`]: [`ExecuteError::status`] is the one place an
//! error becomes a virtio status, and a chain with no status byte to write
//! is dropped with its [`DropReason`] for the caller to count.
//!
//! Everything here treats the guest as hostile: every guest address goes
//! through vm-memory's bounds-checked accessors, every length and sector is
//! checked before storage is touched, and every failure becomes either an
//! error status or a dropped chain. Nothing on the path of a read, write or
//! flush allocates.

use std::cell::RefCell;
use std::io;

use smallvec::SmallVec;
use virtio_bindings::virtio_blk::*;

use crate::device::config::DiskConfig;
use crate::device::faults::{FaultDecision, FaultState};
use crate::device::storage::Storage;
use crate::virtio_blk::features::BlkFeature;
use crate::virtio_blk::request::{
    DropReason, Malformed, Op, ParseError, Request, Segment, RANGE_SIZE, STATUS_IOERR, STATUS_OK,
    STATUS_UNSUPP,
};
use crate::virtio_blk::sector::{sectors_in, ByteOffset, Sector, SECTOR_SIZE};
use crate::virtq::guest_map::GuestMap;

/// The most data one read or write may move: QEMU's `BDRV_REQUEST_MAX_BYTES`
/// (`INT_MAX` rounded down to a sector), the limit its virtio-blk handler
/// enforces with IOERR (`virtio_blk_sect_range_ok`). It also keeps a read's
/// length inside the used element's 32-bit `len`.
pub(crate) const MAX_TRANSFER: u64 = (i32::MAX as u64 / SECTOR_SIZE) * SECTOR_SIZE;

/// What happened to one chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
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

/// A request that ran to completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Completion {
    /// Data bytes written into the chain (reads, GET_ID), the status byte
    /// not included.
    pub written: u32,
    /// Data bytes transferred (reads and writes) or covered (discard,
    /// write-zeroes).
    pub bytes: u64,
}

/// Why a request (or a malformed chain with a status byte) failed. Every
/// failure is answered: [`ExecuteError::status`] says with what.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ExecuteError {
    #[error("malformed chain: {0}")]
    Malformed(Malformed),
    #[error("unsupported request type {0}")]
    UnsupportedType(u32),
    #[error("{0} is not offered")]
    NotOffered(BlkFeature),
    #[error("range flags {0:#x} not supported")]
    UnsupportedFlags(u32),
    #[error("the disk is read-only")]
    ReadOnly,
    #[error("{len} bytes at {sector}: misaligned, or beyond the disk")]
    OutOfRange { sector: Sector, len: u64 },
    #[error("{num} sectors in one range, over the limit of {max}")]
    RangeTooLong { num: u32, max: u32 },
    #[error("{len} bytes of ranges: not a positive multiple of 16 up to {max} ranges")]
    BadRanges { len: u64, max: u32 },
    #[error("data buffers too short, or outside guest memory")]
    Buffers,
    #[error("{len} data bytes in one request, over the limit of {max}")]
    TransferTooLong { len: u64, max: u64 },
    #[error("{segs} data segments in one request, over seg_max {max}")]
    TooManySegments { segs: u64, max: u32 },
    #[error("a data segment of {len} bytes, over size_max {max}")]
    SegmentTooLong { len: u64, max: u32 },
    #[error("injected failure")]
    Injected,
    #[error("{op:?} at {sector} failed: {source}")]
    Io {
        op: Op,
        sector: Sector,
        source: io::Error,
    },
}

impl ExecuteError {
    /// The virtio status that answers this error: UNSUPP for what the
    /// device does not implement or offer, IOERR for everything else.
    pub(crate) fn status(&self) -> u8 {
        match self {
            ExecuteError::UnsupportedType(_)
            | ExecuteError::NotOffered(_)
            | ExecuteError::UnsupportedFlags(_) => STATUS_UNSUPP,
            ExecuteError::Malformed(_)
            | ExecuteError::ReadOnly
            | ExecuteError::OutOfRange { .. }
            | ExecuteError::RangeTooLong { .. }
            | ExecuteError::BadRanges { .. }
            | ExecuteError::Buffers
            | ExecuteError::TransferTooLong { .. }
            | ExecuteError::TooManySegments { .. }
            | ExecuteError::SegmentTooLong { .. }
            | ExecuteError::Injected
            | ExecuteError::Io { .. } => STATUS_IOERR,
        }
    }
}

/// The parts of a disk a request needs.
pub(crate) struct Device<'a> {
    pub storage: &'a dyn Storage,
    pub cfg: &'a DiskConfig,
    /// Capacity in bytes.
    pub capacity: u64,
    /// Current cache mode: false means every request that changes data
    /// (WRITE, DISCARD, WRITE_ZEROES) is made durable before it completes
    /// (write-through).
    pub writeback: bool,
    /// The queue's fault injection, when configured.
    pub faults: Option<&'a RefCell<FaultState>>,
}

impl Device<'_> {
    /// Ask fault injection about a valid request about to touch storage,
    /// recording its decision in `fault`: injected failures fail the
    /// request (storage untouched); a stall only delays its completion.
    fn inject(
        &self,
        op: Op,
        ranges: &[(u64, u64)],
        fault: &mut FaultDecision,
    ) -> Result<(), ExecuteError> {
        *fault = match self.faults {
            Some(f) => f.borrow_mut().decide(op, ranges),
            None => FaultDecision::None,
        };
        match fault {
            FaultDecision::FailEvery | FaultDecision::FailRange => Err(ExecuteError::Injected),
            FaultDecision::None | FaultDecision::Stall(_) => Ok(()),
        }
    }

    /// Check a read or write of `len` data bytes against the limits the
    /// device advertises: `seg_max` data segments (with SEG_MAX offered),
    /// `size_max` bytes per segment (with SIZE_MAX offered), and at most
    /// [`MAX_TRANSFER`] bytes in all. A request over them fails with IOERR
    /// before storage or guest memory is touched, so a guest cannot make
    /// the daemon size a host allocation or a transfer.
    fn check_limits(&self, req: &Request<'_>, len: u64) -> Result<(), ExecuteError> {
        let cfg = self.cfg;
        if len > MAX_TRANSFER {
            return Err(ExecuteError::TransferTooLong {
                len,
                max: MAX_TRANSFER,
            });
        }
        if cfg.features.has(BlkFeature::SegMax) && req.data_segs > u64::from(cfg.seg_max()) {
            return Err(ExecuteError::TooManySegments {
                segs: req.data_segs,
                max: cfg.seg_max(),
            });
        }
        if cfg.features.has(BlkFeature::SizeMax) && req.max_seg_len > u64::from(cfg.size_max) {
            return Err(ExecuteError::SegmentTooLong {
                len: req.max_seg_len,
                max: cfg.size_max,
            });
        }
        Ok(())
    }

    /// In write-through mode, make what a request changed durable before
    /// it completes.
    fn write_through(&self) -> io::Result<()> {
        if self.writeback {
            return Ok(());
        }
        self.storage.flush()
    }

    /// The byte offset of `len` bytes at `sector`, if they are whole
    /// logical blocks inside the disk.
    fn extent(&self, sector: Sector, len: u64) -> Result<ByteOffset, ExecuteError> {
        let lbs = u64::from(self.cfg.block_size);
        match sector.to_bytes() {
            Some(offset)
                if len % lbs == 0
                    && offset.is_aligned(lbs)
                    && offset.extent_within(len, self.capacity) =>
            {
                Ok(offset)
            }
            _ => Err(ExecuteError::OutOfRange { sector, len }),
        }
    }
}

/// Serve one walked chain (its segments, and whether the walk stopped
/// early): parse, execute and answer it. Never panics on guest input.
pub(crate) fn serve_chain(
    dev: &Device<'_>,
    segs: &[Segment],
    truncated: bool,
    map: &GuestMap,
) -> Outcome {
    answer(dev, Request::parse(segs, truncated, map))
}

/// Execute a parsed chain and write its status: OK for a completion, the
/// error's [`ExecuteError::status`] otherwise.
pub(crate) fn answer(dev: &Device<'_>, parsed: Result<Request<'_>, ParseError<'_>>) -> Outcome {
    let mut fault = FaultDecision::None;
    let (op, status_byte, result) = match parsed {
        Err(ParseError::Drop(reason)) => return Outcome::Dropped(reason),
        Err(ParseError::Malformed { status, why }) => {
            (Op::Other, status, Err(ExecuteError::Malformed(why)))
        }
        Ok(req) => (req.op, req.status, execute(dev, &req, &mut fault)),
    };
    let (status, used_len, bytes) = match result {
        Ok(c) => (STATUS_OK, c.written.saturating_add(1), c.bytes),
        Err(e) => {
            if let ExecuteError::Io { .. } = e {
                log::warn!("{e}");
            }
            (e.status(), 1, 0)
        }
    };
    status_byte.write(status);
    Outcome::Completed {
        op,
        status,
        used_len,
        bytes,
        fault,
    }
}

/// Execute `req` against the disk. `fault` is set to the fault injected
/// into it, also when the request then fails.
pub(crate) fn execute(
    dev: &Device<'_>,
    req: &Request<'_>,
    fault: &mut FaultDecision,
) -> Result<Completion, ExecuteError> {
    let (op, sector) = (req.op, req.sector);
    let io = |source| ExecuteError::Io { op, sector, source };
    match op {
        Op::Read => {
            let len = req.in_len;
            dev.check_limits(req, len)?;
            // The used element's length is 32 bits: a read whose length
            // does not fit is refused, never reported truncated.
            let written = u32::try_from(len).ok().filter(|w| *w < u32::MAX).ok_or(
                ExecuteError::TransferTooLong {
                    len,
                    max: MAX_TRANSFER,
                },
            )?;
            let offset = dev.extent(sector, len)?;
            dev.inject(op, &[(sector.get(), sectors_in(len))], fault)?;
            let bufs = req.data_in(len).map_err(|_| ExecuteError::Buffers)?;
            dev.storage.read_into(offset.get(), &bufs).map_err(io)?;
            Ok(Completion {
                written,
                bytes: len,
            })
        }
        Op::Write => {
            let len = req.out_len;
            if dev.cfg.read_only {
                return Err(ExecuteError::ReadOnly);
            }
            dev.check_limits(req, len)?;
            let offset = dev.extent(sector, len)?;
            dev.inject(op, &[(sector.get(), sectors_in(len))], fault)?;
            let bufs = req.data_out(0, len).map_err(|_| ExecuteError::Buffers)?;
            dev.storage.write_from(offset.get(), &bufs).map_err(io)?;
            dev.write_through().map_err(io)?;
            Ok(Completion {
                written: 0,
                bytes: len,
            })
        }
        Op::Flush => {
            dev.inject(op, &[], fault)?;
            dev.storage.flush().map_err(io)?;
            Ok(Completion {
                written: 0,
                bytes: 0,
            })
        }
        Op::GetId => {
            let mut id = [0u8; VIRTIO_BLK_ID_BYTES as usize];
            let s = dev.cfg.serial.as_bytes();
            let n = s.len().min(id.len());
            id[..n].copy_from_slice(&s[..n]);
            let n = req.in_len.min(id.len() as u64);
            let bufs = req.data_in(n).map_err(|_| ExecuteError::Buffers)?;
            let mut p = 0;
            for b in bufs {
                b.copy_from(&id[p..p + b.len()]);
                p += b.len();
            }
            Ok(Completion {
                written: n as u32,
                bytes: 0,
            })
        }
        Op::Discard | Op::WriteZeroes => discard_or_zero(dev, req, fault),
        Op::Other => Err(ExecuteError::UnsupportedType(req.request_type)),
    }
}

/// One validated discard / write-zeroes range.
#[derive(Clone, Copy)]
struct Range {
    offset: ByteOffset,
    len: u64,
    unmap: bool,
}

/// Ranges per request kept on the stack (the default limit is 32).
const INLINE_RANGES: usize = 32;

fn discard_or_zero(
    dev: &Device<'_>,
    req: &Request<'_>,
    fault: &mut FaultDecision,
) -> Result<Completion, ExecuteError> {
    let op = req.op;
    let Ranges { ranges, sectors } = read_ranges(dev, req)?;
    dev.inject(op, &sectors, fault)?;
    let mut total = 0;
    for r in ranges {
        let done = if op == Op::Discard {
            dev.storage.discard(r.offset.get(), r.len)
        } else {
            dev.storage.write_zeroes(r.offset.get(), r.len, r.unmap)
        };
        done.map_err(|source| ExecuteError::Io {
            op,
            sector: r.offset.sector(),
            source,
        })?;
        total += r.len;
    }
    // Write-through covers every request that changes data, not only
    // WRITE: discarded and zeroed ranges are durable before completion.
    dev.write_through().map_err(|source| ExecuteError::Io {
        op,
        sector: req.sector,
        source,
    })?;
    Ok(Completion {
        written: 0,
        bytes: total,
    })
}

/// A discard or write-zeroes request's ranges, every one validated before
/// any touches the storage.
struct Ranges {
    ranges: SmallVec<[Range; INLINE_RANGES]>,
    /// Each range as (sector, sectors), for fault injection.
    sectors: SmallVec<[(u64, u64); INLINE_RANGES]>,
}

fn read_ranges(dev: &Device<'_>, req: &Request<'_>) -> Result<Ranges, ExecuteError> {
    let (cfg, op) = (dev.cfg, req.op);
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
        return Err(ExecuteError::NotOffered(feature));
    }
    if cfg.read_only {
        return Err(ExecuteError::ReadOnly);
    }
    let len = req.out_len;
    if len == 0 || len % RANGE_SIZE != 0 || len / RANGE_SIZE > u64::from(max_seg) {
        return Err(ExecuteError::BadRanges { len, max: max_seg });
    }
    let mut raw: SmallVec<[u8; INLINE_RANGES * RANGE_SIZE as usize]> =
        SmallVec::from_elem(0, len as usize);
    req.read_out(0, &mut raw)
        .map_err(|_| ExecuteError::Buffers)?;
    let allowed = if op == Op::WriteZeroes {
        VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP
    } else {
        0
    };
    let mut out = Ranges {
        ranges: SmallVec::new(),
        sectors: SmallVec::new(),
    };
    for r in raw.chunks_exact(RANGE_SIZE as usize) {
        let (range, sector, num) = check_range(dev, r, allowed, max_sectors)?;
        out.ranges.push(range);
        out.sectors.push((sector.get(), u64::from(num)));
    }
    Ok(out)
}

/// One 16-byte range (sector, sectors, flags) checked against the flags
/// `allowed`, the longest range and the disk: the range, its sector and
/// length in sectors.
fn check_range(
    dev: &Device<'_>,
    r: &[u8],
    allowed: u32,
    max_sectors: u32,
) -> Result<(Range, Sector, u32), ExecuteError> {
    let le32 = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let sector = Sector::new(u64::from_le_bytes([
        r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7],
    ]));
    let num = le32(&r[8..12]);
    let flags = le32(&r[12..16]);
    if flags & !allowed != 0 {
        return Err(ExecuteError::UnsupportedFlags(flags));
    }
    let bytes = u64::from(num) * SECTOR_SIZE;
    let Some(offset) = sector.to_bytes() else {
        return Err(ExecuteError::OutOfRange { sector, len: bytes });
    };
    if num > max_sectors {
        return Err(ExecuteError::RangeTooLong {
            num,
            max: max_sectors,
        });
    }
    let lbs = u64::from(dev.cfg.block_size);
    if !offset.extent_within(bytes, dev.capacity) || !offset.is_aligned(lbs) || bytes % lbs != 0 {
        return Err(ExecuteError::OutOfRange { sector, len: bytes });
    }
    let range = Range {
        offset,
        len: bytes,
        unmap: flags & VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP != 0,
    };
    Ok((range, sector, num))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::config::DiskArgs;
    use crate::device::storage::MemStorage;
    use crate::virtq::split_ring::{RingLayout, SplitRing};
    use std::sync::Arc;
    use virtio_bindings::virtio_ring::{
        VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE,
    };
    use virtio_queue::desc::split::Descriptor;
    use virtio_queue::desc::RawDescriptor;
    use virtio_queue::mock::MockSplitQueue;
    use virtio_queue::{Queue, QueueT};
    use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

    const W: u16 = VRING_DESC_F_WRITE as u16;
    const N: u16 = VRING_DESC_F_NEXT as u16;

    struct Env {
        mem: Arc<GuestMemoryMmap>,
        cfg: DiskConfig,
        storage: MemStorage,
    }

    impl Env {
        fn map(&self) -> GuestMap {
            GuestMap::new(self.mem.clone())
        }
    }

    /// The ring of the 16-entry mock queue `vq`, with the used ring after
    /// the avail ring: the mock lays its own over the avail ring's end (it
    /// adds the entry count, not their bytes); a pop never writes it, but
    /// the ring check refuses overlapping parts.
    fn mock_layout(vq: &MockSplitQueue<GuestMemoryMmap>) -> RingLayout {
        RingLayout {
            desc: vq.desc_table_addr().0,
            avail: vq.avail_addr().0,
            used: (vq.avail_addr().0 + 6 + 2 * 16 + 3) & !3,
            size: 16,
        }
    }

    /// Pop the next chain of the mock queue `vq` (laid out in `mem`) the
    /// way the worker does.
    fn pop(
        mem: &Arc<GuestMemoryMmap>,
        vq: &MockSplitQueue<GuestMemoryMmap>,
    ) -> (Vec<Segment>, bool) {
        let layout = mock_layout(vq);
        let mut ring = SplitRing::new(GuestMap::new(mem.clone()), layout, false, 0, 0).unwrap();
        ring.pending().expect("a sane avail index");
        let mut segs = Vec::new();
        let p = ring.pop(&mut segs).unwrap();
        (segs, p.truncated)
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
            mem: Arc::new(GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x100000)]).unwrap()),
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
        run_chain_on(e, &e.storage, true, descs)
    }

    /// [`run_chain`] against `storage`, in write-back or write-through mode.
    fn run_chain_on(
        e: &Env,
        storage: &dyn Storage,
        writeback: bool,
        descs: &[(u64, u32, u16)],
    ) -> (Outcome, u8) {
        let vq = MockSplitQueue::new(&*e.mem, 16);
        let raw: Vec<RawDescriptor> = descs
            .iter()
            .enumerate()
            .map(|(i, (a, l, f))| {
                let more = if i + 1 < descs.len() { N } else { 0 };
                RawDescriptor::from(Descriptor::new(*a, *l, *f | more, (i + 1) as u16))
            })
            .collect();
        vq.build_desc_chain(&raw).unwrap();
        let (segs, truncated) = pop(&e.mem, &vq);
        let dev = Device {
            storage,
            cfg: &e.cfg,
            capacity: e.cfg.size,
            writeback,
            faults: None,
        };
        let out = serve_chain(&dev, &segs, truncated, &e.map());
        let last = descs.last().unwrap();
        let st = e
            .mem
            .read_obj::<u8>(GuestAddress(
                last.0.wrapping_add(u64::from(last.1.max(1)) - 1),
            ))
            .unwrap_or(0xff);
        (out, st)
    }

    /// A read of 4 GiB (4096 device-writable descriptors over the same
    /// 1 MiB) would need a used length of 4 GiB + 1: IOERR, not a
    /// truncated used length.
    #[test]
    fn a_read_longer_than_a_used_length_is_refused() {
        let e = env(&[]);
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x200000)]).unwrap();
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&VIRTIO_BLK_T_IN.to_le_bytes());
        mem.write_slice(&h, GuestAddress(0x8000)).unwrap();
        mem.write_obj(0xeeu8, GuestAddress(0x9000)).unwrap();
        let mut segs = vec![Segment {
            addr: 0x8000,
            len: 16,
            write: false,
        }];
        segs.extend((0..4096).map(|_| Segment {
            addr: 0x100000,
            len: 0x100000,
            write: true,
        }));
        segs.push(Segment {
            addr: 0x9000,
            len: 1,
            write: true,
        });
        let storage = crate::device::storage::NullStorage::new(8 << 30);
        let dev = Device {
            storage: &storage,
            cfg: &e.cfg,
            capacity: 8 << 30,
            writeback: true,
            faults: None,
        };
        let map = GuestMap::new(Arc::new(mem));
        let o = answer(&dev, Request::from_segments(&segs, &map));
        let mem = map.memory();
        assert!(
            matches!(
                o,
                Outcome::Completed {
                    op: Op::Read,
                    status: STATUS_IOERR,
                    used_len: 1,
                    bytes: 0,
                    ..
                }
            ),
            "{o:?}"
        );
        assert_eq!(
            mem.read_obj::<u8>(GuestAddress(0x9000)).unwrap(),
            STATUS_IOERR
        );
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
        let vq = MockSplitQueue::new(&*e.mem, 16);
        hdr(&e, 0x8000, VIRTIO_BLK_T_IN, 0);
        // 0 -> 1 -> 0 -> ...
        let d0 = RawDescriptor::from(Descriptor::new(0x8000, 16, N, 1));
        let d1 = RawDescriptor::from(Descriptor::new(0x9000, 1, N | W, 0));
        vq.desc_table().store(0, d0).unwrap();
        vq.desc_table().store(1, d1).unwrap();
        vq.avail().ring().ref_at(0).unwrap().store(0u16);
        vq.avail().idx().store(1u16);
        let (segs, truncated) = pop(&e.mem, &vq);
        assert_eq!(
            crate::virtio_blk::request::check_chain(&segs, truncated),
            Err(DropReason::Truncated)
        );
        assert_eq!(segs.len(), 16, "walk bounded by the queue size");
    }

    #[test]
    fn bad_indirect_table_is_dropped() {
        let e = env(&[]);
        let vq = MockSplitQueue::new(&*e.mem, 16);
        let d0 = RawDescriptor::from(Descriptor::new(
            0x1_0000_0000,
            64,
            VRING_DESC_F_INDIRECT as u16,
            0,
        ));
        vq.desc_table().store(0, d0).unwrap();
        vq.avail().ring().ref_at(0).unwrap().store(0u16);
        vq.avail().idx().store(1u16);
        let (segs, truncated) = pop(&e.mem, &vq);
        assert!(crate::virtio_blk::request::check_chain(&segs, truncated).is_err());
        // And a queue whose avail index jumped too far is refused.
        vq.avail().idx().store(100u16);
        let ring = SplitRing::new(e.map(), mock_layout(&vq), false, 0, 0).unwrap();
        assert!(ring.pending().is_err());
        let q: Queue = vq.create_queue().unwrap();
        let _ = q.size();
    }

    #[test]
    fn each_error_has_one_status() {
        use ExecuteError as E;
        let io = || io::Error::other("x");
        let sector = Sector::new(1);
        for (e, st) in [
            (E::Malformed(Malformed::ShortHeader), STATUS_IOERR),
            (E::UnsupportedType(0x55), STATUS_UNSUPP),
            (E::NotOffered(BlkFeature::Discard), STATUS_UNSUPP),
            (E::UnsupportedFlags(0x80), STATUS_UNSUPP),
            (E::ReadOnly, STATUS_IOERR),
            (E::OutOfRange { sector, len: 512 }, STATUS_IOERR),
            (E::RangeTooLong { num: 9, max: 8 }, STATUS_IOERR),
            (E::BadRanges { len: 10, max: 1 }, STATUS_IOERR),
            (E::Buffers, STATUS_IOERR),
            (
                E::TransferTooLong {
                    len: 1 << 32,
                    max: MAX_TRANSFER,
                },
                STATUS_IOERR,
            ),
            (E::TooManySegments { segs: 9, max: 8 }, STATUS_IOERR),
            (
                E::SegmentTooLong {
                    len: 8192,
                    max: 4096,
                },
                STATUS_IOERR,
            ),
            (E::Injected, STATUS_IOERR),
            (
                E::Io {
                    op: Op::Read,
                    sector,
                    source: io(),
                },
                STATUS_IOERR,
            ),
        ] {
            assert_eq!(e.status(), st, "{e}");
        }
    }

    #[test]
    fn out_of_range_writes_touch_nothing() {
        let e = env(&[]);
        let cap = e.cfg.size / 512;
        e.mem
            .write_slice(&[0x3c; 2048], GuestAddress(0x10000))
            .unwrap();
        let zero_chain = |sector: u64, len: u32| {
            // Two writes, then the last two sectors read back as zeros.
            hdr(&e, 0x8000, VIRTIO_BLK_T_OUT, sector);
            run_chain(&e, &[(0x8000, 16, 0), (0x10000, len, 0), (0x9000, 1, W)]).1
        };
        // At the capacity, crossing the end, and far beyond.
        assert_eq!(zero_chain(cap, 512), STATUS_IOERR);
        assert_eq!(zero_chain(cap - 1, 1024), STATUS_IOERR);
        assert_eq!(zero_chain(cap - 2, 2048), STATUS_IOERR);
        assert_eq!(zero_chain(u64::MAX / 512, 512), STATUS_IOERR);
        // Write-zeroes and discard ranges crossing the end.
        for t in [VIRTIO_BLK_T_WRITE_ZEROES, VIRTIO_BLK_T_DISCARD] {
            range(&e, 0x30000, cap - 1, 2, 0);
            hdr(&e, 0x8000, t, 0);
            assert_eq!(
                run_chain(&e, &[(0x8000, 16, 0), (0x30000, 16, 0), (0x9000, 1, W)]).1,
                STATUS_IOERR
            );
        }
        hdr(&e, 0x8000, VIRTIO_BLK_T_IN, cap - 4);
        e.mem
            .write_slice(&[0xee; 2048], GuestAddress(0x20000))
            .unwrap();
        assert_eq!(
            run_chain(&e, &[(0x8000, 16, 0), (0x20000, 2048, W), (0x9000, 1, W)]).1,
            STATUS_OK
        );
        let mut b = vec![0u8; 2048];
        e.mem.read_slice(&mut b, GuestAddress(0x20000)).unwrap();
        assert!(b.iter().all(|x| *x == 0), "nothing written near the end");
    }

    /// A read or write of `n` data descriptors of `len` bytes each at
    /// sector 0 (all over the same guest pages).
    fn segs_chain(t: u32, n: usize, len: u32) -> Vec<(u64, u32, u16)> {
        let f = if t == VIRTIO_BLK_T_IN { W } else { 0 };
        let mut d = vec![(0x8000, 16, 0)];
        d.extend(std::iter::repeat((0x20000, len, f)).take(n));
        d.push((0x9000, 1, W));
        d
    }

    #[test]
    fn advertised_segment_limits_are_enforced() {
        // seg_max = queue size - 2 = 6; size_max = 4096.
        let e = env(&["--queue-size", "8", "--size-max", "4096"]);
        assert_eq!(e.cfg.seg_max(), 6);
        for t in [VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT] {
            hdr(&e, 0x8000, t, 0);
            assert_eq!(run_chain(&e, &segs_chain(t, 6, 4096)).1, STATUS_OK);
            assert_eq!(run_chain(&e, &segs_chain(t, 7, 512)).1, STATUS_IOERR);
            assert_eq!(run_chain(&e, &segs_chain(t, 1, 8192)).1, STATUS_IOERR);
        }
        // Data sharing a descriptor with the header or the status byte
        // counts as the data it carries.
        hdr(&e, 0x8000, VIRTIO_BLK_T_OUT, 0);
        assert_eq!(
            run_chain(&e, &[(0x8000, 16 + 4096, 0), (0x9000, 1, W)]).1,
            STATUS_OK
        );
        assert_eq!(
            run_chain(&e, &[(0x8000, 16 + 4608, 0), (0x9000, 1, W)]).1,
            STATUS_IOERR
        );
        hdr(&e, 0x8000, VIRTIO_BLK_T_IN, 0);
        assert_eq!(
            run_chain(&e, &[(0x8000, 16, 0), (0x20000, 4097, W)]).1,
            STATUS_OK
        );
        // What the guest was not told is not enforced.
        let e = env(&[
            "--queue-size",
            "8",
            "--size-max",
            "4096",
            "--disable-features",
            "seg-max,size-max",
        ]);
        for t in [VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT] {
            hdr(&e, 0x8000, t, 0);
            assert_eq!(run_chain(&e, &segs_chain(t, 7, 512)).1, STATUS_OK);
            assert_eq!(run_chain(&e, &segs_chain(t, 1, 8192)).1, STATUS_OK);
        }
    }

    #[test]
    fn transfers_over_the_maximum_are_refused() {
        // 2 GiB, and 4 GiB (a used length that does not fit 32 bits), of
        // read buffers: refused before guest memory or storage is touched
        // (the buffers lie outside guest memory, the disk is 1 MiB: either
        // would fail later with another error), whatever the segment
        // limits say.
        let e = env(&["--disable-features", "seg-max,size-max"]);
        let dev = Device {
            storage: &e.storage,
            cfg: &e.cfg,
            capacity: e.cfg.size,
            writeback: true,
            faults: None,
        };
        let seg = |addr, len, write| Segment { addr, len, write };
        for (t, write) in [(VIRTIO_BLK_T_IN, true), (VIRTIO_BLK_T_OUT, false)] {
            hdr(&e, 0x8000, t, 0);
            for data in [
                vec![seg(0x1_0000_0000, 0x8000_0000, write)],
                vec![
                    seg(0x1_0000_0000, 0x8000_0000, write),
                    seg(0x1_0000_0000, 0x8000_0000, write),
                ],
            ] {
                let mut segs = vec![seg(0x8000, 16, false)];
                segs.extend(data);
                segs.push(seg(0x9000, 1, true));
                let map = e.map();
                let req = Request::from_segments(&segs, &map).unwrap();
                let r = execute(&dev, &req, &mut FaultDecision::None);
                assert!(
                    matches!(r, Err(ExecuteError::TransferTooLong { max, .. }) if max == MAX_TRANSFER),
                    "{r:?}"
                );
                let o = answer(&dev, Ok(req));
                assert!(matches!(
                    o,
                    Outcome::Completed {
                        status: STATUS_IOERR,
                        used_len: 1,
                        ..
                    }
                ));
            }
        }
        assert_eq!(MAX_TRANSFER, 0x7fff_fe00);
    }

    #[test]
    fn write_through_makes_every_data_change_durable() {
        let e = env(&[]);
        let dir = tempfile::tempdir().unwrap();
        let file = crate::device::storage::FileStorage::open(
            &dir.path().join("img.raw"),
            Some(e.cfg.size),
            false,
            false,
            512,
        )
        .unwrap();
        let write = [(0x8000, 16, 0), (0x10000, 4096, 0), (0x9000, 1, W)];
        let ranges = [(0x8000, 16, 0), (0x30000, 16, 0), (0x9000, 1, W)];
        range(&e, 0x30000, 8, 8, 0);
        for (t, chain) in [
            (VIRTIO_BLK_T_OUT, &write),
            (VIRTIO_BLK_T_WRITE_ZEROES, &ranges),
            (VIRTIO_BLK_T_DISCARD, &ranges),
        ] {
            hdr(&e, 0x8000, t, 0);
            // Write-back: no sync; write-through: one, before completion.
            let before = file.syncs();
            assert_eq!(run_chain_on(&e, &file, true, chain).1, STATUS_OK);
            assert_eq!(file.syncs(), before, "type {t}, write-back");
            assert_eq!(run_chain_on(&e, &file, false, chain).1, STATUS_OK);
            assert_eq!(file.syncs(), before + 1, "type {t}, write-through");
        }
        // Reads change nothing: no sync in either mode.
        hdr(&e, 0x8000, VIRTIO_BLK_T_IN, 0);
        let before = file.syncs();
        let read = [(0x8000, 16, 0), (0x20000, 4096, W), (0x9000, 1, W)];
        assert_eq!(run_chain_on(&e, &file, false, &read).1, STATUS_OK);
        assert_eq!(file.syncs(), before);
    }

    /// Storage whose every operation fails.
    struct Broken;

    impl Storage for Broken {
        fn size(&self) -> u64 {
            1 << 20
        }
        fn read_into(&self, _: u64, _: &[crate::device::storage::GuestBuf<'_>]) -> io::Result<()> {
            Err(io::Error::other("broken"))
        }
        fn write_from(&self, _: u64, _: &[crate::device::storage::GuestBuf<'_>]) -> io::Result<()> {
            Err(io::Error::other("broken"))
        }
        fn flush(&self) -> io::Result<()> {
            Err(io::Error::other("broken"))
        }
        fn discard(&self, _: u64, _: u64) -> io::Result<()> {
            Err(io::Error::other("broken"))
        }
        fn write_zeroes(&self, _: u64, _: u64, _: bool) -> io::Result<()> {
            Err(io::Error::other("broken"))
        }
    }

    #[test]
    fn storage_errors_are_ioerr_and_keep_the_injected_fault() {
        // Every request stalled; the storage then fails: IOERR, and the
        // stall is still reported (it is counted and delays the answer).
        let e = env(&["--stall-every", "1:1ms"]);
        let faults = RefCell::new(FaultState::new(&e.cfg.faults));
        let dev = Device {
            storage: &Broken,
            cfg: &e.cfg,
            capacity: e.cfg.size,
            writeback: false,
            faults: Some(&faults),
        };
        let stall = FaultDecision::Stall(std::time::Duration::from_millis(1));
        hdr(&e, 0x8000, VIRTIO_BLK_T_IN, 0);
        let segs = [
            Segment {
                addr: 0x8000,
                len: 16,
                write: false,
            },
            Segment {
                addr: 0x20000,
                len: 512,
                write: true,
            },
            Segment {
                addr: 0x9000,
                len: 1,
                write: true,
            },
        ];
        let map = e.map();
        let o = answer(&dev, Request::from_segments(&segs, &map));
        assert_eq!(
            o,
            Outcome::Completed {
                op: Op::Read,
                status: STATUS_IOERR,
                used_len: 1,
                bytes: 0,
                fault: stall,
            }
        );
        assert_eq!(
            e.mem.read_obj::<u8>(GuestAddress(0x9000)).unwrap(),
            STATUS_IOERR
        );
        // A write-through write fails at its write, before the flush.
        hdr(&e, 0x8000, VIRTIO_BLK_T_OUT, 0);
        let mut w = segs;
        w[1].write = false;
        let mut fault = FaultDecision::None;
        let r = execute(&dev, &Request::from_segments(&w, &map).unwrap(), &mut fault);
        assert!(matches!(r, Err(ExecuteError::Io { op: Op::Write, .. })));
        assert_eq!(fault, stall);
    }
}
