//! A virtio-blk request on the wire (virtio 1.2, 5.2.6): the request types,
//! status values and sizes, the walk from a descriptor chain to its
//! buffers, and [`Request::parse`], which turns a chain into a typed
//! request or says why it cannot be one.
//!
//! A request is device-readable bytes (a 16-byte header `{le32 type, le32
//! reserved, le64 sector}`, then data for writes, discard and write-zeroes
//! ranges) followed by device-writable bytes (data for reads and GET_ID,
//! then the one-byte status at the very end). Drivers may frame those bytes
//! over descriptors any way they like, so nothing here assumes one
//! descriptor per part.
//!
//! Everything here treats the guest as hostile: every guest address goes
//! through the [`GuestMap`]'s bounds-checked translation, and the chain
//! was walked by [`crate::virtq::split_ring`], which refuses loops and
//! over-long chains (a TTL, whose truncation is reported here). A chain is either a [`Request`], a [`ParseError::Malformed`]
//! chain answered with an error status, or a [`ParseError::Drop`] chain
//! with no status byte to answer through.

use smallvec::SmallVec;
use virtio_bindings::virtio_blk::*;
use vm_memory::VolatileSlice;

use crate::virtq::guest_map::GuestMap;

pub(crate) use crate::virtio_blk::sector::Sector;

pub(crate) const HEADER_SIZE: u64 = 16;
/// Size of one discard / write-zeroes range.
pub(crate) const RANGE_SIZE: u64 = 16;

pub(crate) const STATUS_OK: u8 = VIRTIO_BLK_S_OK as u8;
pub(crate) const STATUS_IOERR: u8 = VIRTIO_BLK_S_IOERR as u8;
pub(crate) const STATUS_UNSUPP: u8 = VIRTIO_BLK_S_UNSUPP as u8;

/// Request kinds, for statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    Read,
    Write,
    Flush,
    GetId,
    Discard,
    WriteZeroes,
    /// A type we do not implement, or a request whose header is unreadable.
    Other,
}

impl Op {
    pub(crate) fn from_type(t: u32) -> Op {
        match t {
            VIRTIO_BLK_T_IN => Op::Read,
            VIRTIO_BLK_T_OUT => Op::Write,
            VIRTIO_BLK_T_FLUSH => Op::Flush,
            VIRTIO_BLK_T_GET_ID => Op::GetId,
            VIRTIO_BLK_T_DISCARD => Op::Discard,
            VIRTIO_BLK_T_WRITE_ZEROES => Op::WriteZeroes,
            _ => Op::Other,
        }
    }
}

/// Why a chain could not be answered with a status byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DropReason {
    /// No descriptor could be read at the head.
    Empty,
    /// The chain loops, is longer than the queue allows, has a next index
    /// outside the table, a descriptor outside guest memory, or an invalid
    /// indirect table.
    Truncated,
    /// The last descriptor is not device-writable (no status byte).
    NoStatus,
    /// The last descriptor is device-writable but empty.
    EmptyStatus,
    /// The status byte's address is outside guest memory.
    StatusUnwritable,
}

impl DropReason {
    /// For the log.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            DropReason::Empty => "no readable descriptor at the head",
            DropReason::Truncated => {
                "chain loops, is longer than the queue, or has an invalid descriptor"
            }
            DropReason::NoStatus => "last descriptor is not device-writable, no status byte",
            DropReason::EmptyStatus => "status descriptor has length 0",
            DropReason::StatusUnwritable => "status byte outside guest memory",
        }
    }
}

/// Why a chain with a status byte holds no usable request (answered with
/// an error status).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Malformed {
    /// A device-readable descriptor follows a device-writable one.
    ReadableAfterWritable,
    /// Fewer device-readable bytes than a header.
    ShortHeader,
    /// The header is outside guest memory.
    HeaderUnreadable,
}

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Malformed::ReadableAfterWritable => "device-readable descriptor after a writable one",
            Malformed::ShortHeader => "chain shorter than a request header",
            Malformed::HeaderUnreadable => "request header outside guest memory",
        })
    }
}

pub(crate) use crate::virtq::split_ring::Segment;

/// Check a walked chain (`segs`, and whether the walk stopped early) for
/// the status byte every request ends with.
pub(crate) fn check_chain(segs: &[Segment], truncated: bool) -> Result<(), DropReason> {
    match segs.last() {
        None => Err(DropReason::Empty),
        // The walk ended on a descriptor that says more follow: a loop, the
        // TTL, a bad index, an unreadable descriptor.
        Some(_) if truncated => Err(DropReason::Truncated),
        Some(d) if !d.write => Err(DropReason::NoStatus),
        Some(d) if d.len == 0 => Err(DropReason::EmptyStatus),
        Some(_) => Ok(()),
    }
}

/// A request's one-byte status in guest memory, looked up once before the
/// request runs and written through after.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StatusByte<'m> {
    ptr: std::ptr::NonNull<u8>,
    _map: std::marker::PhantomData<&'m GuestMap>,
}

impl StatusByte<'_> {
    /// Write the status (a volatile store: the guest reads it).
    pub(crate) fn write(&self, status: u8) {
        // SAFETY: `ptr` came from `GuestMap::host` for one byte, inside a
        // region the borrowed map keeps mapped for 'm.
        unsafe { std::ptr::write_volatile(self.ptr.as_ptr(), status) };
    }
}

/// A request's guest buffers: kept on the stack up to four slices (a 4 KiB
/// read is one), so the common request allocates nothing.
pub(crate) type Slices<'m> = SmallVec<[VolatileSlice<'m, ()>; 4]>;

/// Why a chain is not a [`Request`].
#[derive(Debug, Clone, Copy)]
pub(crate) enum ParseError<'m> {
    /// No status byte can be written: the chain goes back unanswered.
    Drop(DropReason),
    /// The chain has a status byte but no usable request: answer it with
    /// an error status written at `status`.
    Malformed {
        status: StatusByte<'m>,
        why: Malformed,
    },
}

/// A typed virtio-blk request: its header, its data buffers (as guest
/// memory segments, the header and status byte included) and where its
/// status goes. Borrows the caller's scratch segment list and the guest
/// memory; holds no heap memory of its own.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Request<'m> {
    pub op: Op,
    /// The header's type field (`op` is [`Op::Other`] for types we do not
    /// implement).
    pub request_type: u32,
    /// The header's sector (meaningful for reads and writes).
    pub sector: Sector,
    /// Device-readable bytes after the header: write data, discard and
    /// write-zeroes ranges.
    pub out_len: u64,
    /// Device-writable bytes before the status byte: read and GET_ID data.
    pub in_len: u64,
    /// Descriptors that carry data (bytes other than the header's 16 and
    /// the status byte), for the device's `seg_max`.
    pub data_segs: u64,
    /// The most data bytes one descriptor carries, for `size_max`.
    pub max_seg_len: u64,
    pub status: StatusByte<'m>,
    segs: &'m [Segment],
    map: &'m GuestMap,
}

impl<'m> Request<'m> {
    /// Parse a walked chain: `segs` and whether the walk stopped early
    /// ([`crate::virtq::split_ring::Popped::truncated`]).
    pub(crate) fn parse(
        segs: &'m [Segment],
        truncated: bool,
        map: &'m GuestMap,
    ) -> Result<Request<'m>, ParseError<'m>> {
        check_chain(segs, truncated).map_err(ParseError::Drop)?;
        Self::from_segments(segs, map)
    }

    /// Parse a chain's segments (dropped unless non-empty and ending in
    /// a non-empty device-writable descriptor).
    pub(crate) fn from_segments(
        segs: &'m [Segment],
        map: &'m GuestMap,
    ) -> Result<Request<'m>, ParseError<'m>> {
        let status_seg = match segs.last() {
            None => return Err(ParseError::Drop(DropReason::Empty)),
            Some(s) if !s.write => return Err(ParseError::Drop(DropReason::NoStatus)),
            Some(s) if s.len == 0 => return Err(ParseError::Drop(DropReason::EmptyStatus)),
            Some(s) => s,
        };
        // One lookup: the status byte's slice is found before the request
        // runs (a chain without a writable status byte is dropped
        // untouched) and written through after.
        let status = status_seg
            .addr
            .checked_add(u64::from(status_seg.len) - 1)
            .and_then(|a| map.host(a, 1))
            .and_then(std::ptr::NonNull::new)
            .map(|ptr| StatusByte {
                ptr,
                _map: std::marker::PhantomData,
            })
            .ok_or(ParseError::Drop(DropReason::StatusUnwritable))?;
        let malformed = |why| ParseError::Malformed { status, why };

        // One pass: the readable and writable byte counts, whether every
        // device-readable descriptor precedes the writable ones, and the
        // data each descriptor carries (framing is free: the header may
        // share a descriptor with data, and so may the status byte).
        let (mut readable, mut writable) = (0u64, 0u64);
        let (mut seen_write, mut out_of_order) = (false, false);
        let (mut data_segs, mut max_seg_len) = (0u64, 0u64);
        let last = segs.len() - 1;
        for (i, s) in segs.iter().enumerate() {
            let len = u64::from(s.len);
            let data = if s.write {
                writable += len;
                seen_write = true;
                if i == last {
                    len - 1
                } else {
                    len
                }
            } else {
                out_of_order |= seen_write;
                let header_part = HEADER_SIZE.saturating_sub(readable).min(len);
                readable += len;
                len - header_part
            };
            if data > 0 {
                data_segs += 1;
                max_seg_len = max_seg_len.max(data);
            }
        }
        if out_of_order {
            return Err(malformed(Malformed::ReadableAfterWritable));
        }
        if readable < HEADER_SIZE {
            return Err(malformed(Malformed::ShortHeader));
        }
        let mut req = Request {
            op: Op::Other,
            request_type: 0,
            sector: Sector::new(0),
            out_len: readable - HEADER_SIZE,
            // The status descriptor is writable and not empty.
            in_len: writable - 1,
            data_segs,
            max_seg_len,
            status,
            segs,
            map,
        };
        let mut hdr = [0u8; HEADER_SIZE as usize];
        // The header almost always sits whole in the first descriptor: one
        // translation and one copy. Otherwise gather it across descriptors.
        let whole = match map.slice(segs[0].addr, HEADER_SIZE as usize) {
            Some(s) if u64::from(segs[0].len) >= HEADER_SIZE => {
                s.copy_to(&mut hdr[..]);
                true
            }
            _ => false,
        };
        if !whole && req.read_readable(0, &mut hdr).is_err() {
            return Err(malformed(Malformed::HeaderUnreadable));
        }
        req.request_type = u32::from_le_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]);
        req.op = Op::from_type(req.request_type);
        req.sector = Sector::new(u64::from_le_bytes([
            hdr[8], hdr[9], hdr[10], hdr[11], hdr[12], hdr[13], hdr[14], hdr[15],
        ]));
        Ok(req)
    }

    /// Guest slices over `len` bytes of the data the device reads (after
    /// the header), starting `skip` bytes into it.
    pub(crate) fn data_out(&self, skip: u64, len: u64) -> Result<Slices<'m>, BufferError> {
        slices(
            self.map,
            self.segs,
            false,
            HEADER_SIZE.saturating_add(skip),
            len,
        )
    }

    /// Guest slices over the first `len` bytes the device writes (never
    /// the status byte).
    pub(crate) fn data_in(&self, len: u64) -> Result<Slices<'m>, BufferError> {
        if len > self.in_len {
            return Err(BufferError);
        }
        slices(self.map, self.segs, true, 0, len)
    }

    /// Copy `out.len()` bytes of the data the device reads, starting `skip`
    /// bytes after the header.
    pub(crate) fn read_out(&self, skip: u64, out: &mut [u8]) -> Result<(), BufferError> {
        self.read_readable(HEADER_SIZE.saturating_add(skip), out)
    }

    /// Copy `out.len()` readable bytes starting `skip` bytes into the chain.
    fn read_readable(&self, skip: u64, out: &mut [u8]) -> Result<(), BufferError> {
        let sl = slices(self.map, self.segs, false, skip, out.len() as u64)?;
        let mut p = 0;
        for s in sl {
            s.copy_to(&mut out[p..p + s.len()]);
            p += s.len();
        }
        Ok(())
    }
}

/// A request's buffers do not hold the bytes asked for, or lie outside
/// guest memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BufferError;

/// Guest memory slices covering `len` bytes starting `skip` bytes into the
/// readable (`write == false`) or writable segments.
fn slices<'m>(
    map: &'m GuestMap,
    segs: &[Segment],
    write: bool,
    mut skip: u64,
    len: u64,
) -> Result<Slices<'m>, BufferError> {
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
        let addr = s.addr.checked_add(skip).ok_or(BufferError)?;
        let take_len = usize::try_from(take).map_err(|_| BufferError)?;
        if !map.slices(addr, take_len, |sl| out.push(sl)) {
            return Err(BufferError);
        }
        left -= take;
        skip = 0;
    }
    if left != 0 {
        return Err(BufferError);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

    const W: bool = true;

    fn seg(addr: u64, len: u32, write: bool) -> Segment {
        Segment { addr, len, write }
    }

    fn mem() -> GuestMap {
        GuestMap::new(std::sync::Arc::new(
            GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap(),
        ))
    }

    fn header(m: &GuestMap, at: u64, t: u32, sector: u64) {
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&t.to_le_bytes());
        h[8..16].copy_from_slice(&sector.to_le_bytes());
        m.memory().write_slice(&h, GuestAddress(at)).unwrap();
    }

    #[test]
    fn parses_header_lengths_and_status() {
        let m = mem();
        header(&m, 0x1000, VIRTIO_BLK_T_IN, 7);
        let segs = [
            seg(0x1000, 16, false),
            seg(0x2000, 1024, W),
            seg(0x3000, 512, W),
            seg(0x4000, 1, W),
        ];
        let r = Request::from_segments(&segs, &m).unwrap();
        assert_eq!(r.op, Op::Read);
        assert_eq!(r.request_type, VIRTIO_BLK_T_IN);
        assert_eq!(r.sector, Sector::new(7));
        assert_eq!((r.out_len, r.in_len), (0, 1536));
        assert_eq!(r.data_in(1536).unwrap().len(), 2);
        assert_eq!(r.data_in(1537).unwrap_err(), BufferError);
        r.status.write(0x42);
        assert_eq!(
            m.memory().read_obj::<u8>(GuestAddress(0x4000)).unwrap(),
            0x42
        );
    }

    #[test]
    fn header_and_data_gathered_across_descriptors() {
        let m = mem();
        header(&m, 0x1000, VIRTIO_BLK_T_OUT, u64::MAX);
        m.memory()
            .write_slice(&[1, 2, 3, 4], GuestAddress(0x1010))
            .unwrap();
        // Header split 3 + 13, data in the second descriptor's tail.
        let segs = [
            seg(0x1000, 3, false),
            seg(0x1003, 13 + 4, false),
            seg(0x4000, 1, W),
        ];
        let r = Request::from_segments(&segs, &m).unwrap();
        assert_eq!(
            (r.op, r.sector, r.out_len),
            (Op::Write, Sector::new(u64::MAX), 4)
        );
        let mut b = [0u8; 3];
        r.read_out(1, &mut b).unwrap();
        assert_eq!(b, [2, 3, 4]);
        assert!(r.read_out(2, &mut b).is_err());
        assert_eq!(r.data_out(0, 4).unwrap().len(), 1);
    }

    #[test]
    fn data_segments_and_their_largest() {
        let m = mem();
        header(&m, 0x1000, VIRTIO_BLK_T_OUT, 0);
        let counts = |segs: &[Segment]| {
            let r = Request::from_segments(segs, &m).unwrap();
            (r.data_segs, r.max_seg_len)
        };
        // Header, three data descriptors, status.
        assert_eq!(
            counts(&[
                seg(0x1000, 16, false),
                seg(0x2000, 512, false),
                seg(0x3000, 4096, false),
                seg(0x2000, 512, false),
                seg(0x4000, 1, W)
            ]),
            (3, 4096)
        );
        // Header with data, header split, status with data, empty data
        // descriptors: only the data bytes count.
        assert_eq!(
            counts(&[seg(0x1000, 16 + 1024, false), seg(0x4000, 1, W)]),
            (1, 1024)
        );
        assert_eq!(
            counts(&[
                seg(0x1000, 10, false),
                seg(0x100a, 6 + 100, false),
                seg(0x2000, 0, false),
                seg(0x4000, 1, W)
            ]),
            (1, 100)
        );
        assert_eq!(
            counts(&[seg(0x1000, 16, false), seg(0x2000, 513, W)]),
            (1, 512)
        );
        assert_eq!(counts(&[seg(0x1000, 16, false), seg(0x4000, 1, W)]), (0, 0));
        // Lengths are summed in 64 bits: 2 x 4 GiB - 1.
        assert_eq!(
            counts(&[
                seg(0x1000, 16, false),
                seg(0x2000, u32::MAX, W),
                seg(0x2000, u32::MAX, W),
                seg(0x4000, 1, W)
            ]),
            (2, u64::from(u32::MAX))
        );
    }

    #[test]
    fn malformed_and_dropped() {
        let m = mem();
        header(&m, 0x1000, VIRTIO_BLK_T_IN, 0);
        let err = |segs: &[Segment]| match Request::from_segments(segs, &m) {
            Err(ParseError::Malformed { why, .. }) => Ok(why),
            Err(ParseError::Drop(r)) => Err(r),
            Ok(_) => panic!("parsed"),
        };
        assert_eq!(
            err(&[seg(0x1000, 8, false), seg(0x4000, 1, W)]),
            Ok(Malformed::ShortHeader)
        );
        assert_eq!(
            err(&[
                seg(0x1000, 16, false),
                seg(0x2000, 512, W),
                seg(0x1000, 16, false),
                seg(0x4000, 1, W)
            ]),
            Ok(Malformed::ReadableAfterWritable)
        );
        assert_eq!(
            err(&[
                seg(0x1000, 3, false),
                seg(0xffff_0000, 13, false),
                seg(0x4000, 1, W)
            ]),
            Ok(Malformed::HeaderUnreadable)
        );
        assert_eq!(
            err(&[seg(0x1000, 16, false), seg(0x10000, 1, W)]),
            Err(DropReason::StatusUnwritable)
        );
        assert_eq!(
            err(&[seg(0x1000, 16, false), seg(u64::MAX, 2, W)]),
            Err(DropReason::StatusUnwritable)
        );
        assert_eq!(err(&[]), Err(DropReason::Empty));
    }
}
