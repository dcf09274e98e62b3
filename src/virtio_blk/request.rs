//! A virtio-blk request on the wire (virtio 1.2, 5.2.6): the request types,
//! status values and sizes, and the walk from a descriptor chain to its
//! buffers. Drivers may frame a request's bytes over descriptors any way
//! they like, so nothing here assumes one descriptor per part; the walk
//! refuses loops and over-long chains (virtio-queue's TTL, whose truncation
//! is detected here).

use virtio_bindings::virtio_blk::*;
use virtio_queue::desc::split::Descriptor;
use virtio_queue::DescriptorChain;

pub const SECTOR_SIZE: u64 = 512;
pub const HEADER_SIZE: u64 = 16;
/// Size of one discard / write-zeroes range.
pub const RANGE_SIZE: u64 = 16;

pub const STATUS_OK: u8 = VIRTIO_BLK_S_OK as u8;
pub const STATUS_IOERR: u8 = VIRTIO_BLK_S_IOERR as u8;
pub const STATUS_UNSUPP: u8 = VIRTIO_BLK_S_UNSUPP as u8;

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
    pub fn from_type(t: u32) -> Op {
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
pub enum DropReason {
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

/// One descriptor's buffer.
#[derive(Debug, Clone, Copy)]
pub struct Segment {
    pub addr: u64,
    pub len: u32,
    pub write: bool,
}

/// Walk a chain into `segs` (cleared first). Returns the drop reason when
/// the chain is unusable.
pub fn collect_segments<M>(
    chain: DescriptorChain<M>,
    segs: &mut Vec<Segment>,
) -> Result<(), DropReason>
where
    M: std::ops::Deref,
    M::Target: vm_memory::GuestMemory,
{
    segs.clear();
    let mut last: Option<Descriptor> = None;
    for d in chain {
        segs.push(Segment {
            addr: d.addr().0,
            len: d.len(),
            write: d.is_write_only(),
        });
        last = Some(d);
    }
    match last {
        None => Err(DropReason::Empty),
        // The walk ended on a descriptor that says more follow: virtio-queue
        // stopped early (loop, TTL, bad index, unreadable descriptor).
        Some(d) if d.has_next() => Err(DropReason::Truncated),
        Some(d) if !d.is_write_only() => Err(DropReason::NoStatus),
        Some(d) if d.len() == 0 => Err(DropReason::EmptyStatus),
        Some(_) => Ok(()),
    }
}
