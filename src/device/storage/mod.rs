//! Disk contents: `null`, `mem` (sparse RAM) and `file:PATH` (raw image).
//!
//! I/O moves data directly between guest memory ([`VolatileSlice`]s of the
//! guest's mapped regions) and the storage, without an intermediate copy.

mod file;
mod mem;
mod null;

use std::io;

use thiserror::Error;
use vm_memory::VolatileSlice;

pub(crate) use file::FileStorage;
pub(crate) use mem::MemStorage;
pub(crate) use null::NullStorage;

use crate::device::config::{DiskConfig, ImageLock, StorageSpec};

/// A guest buffer: a slice of mapped guest memory.
pub(crate) type GuestBuf<'a> = VolatileSlice<'a, ()>;

#[derive(Debug, Error)]
pub enum StorageError {
    #[error("cannot open image {path}: {source}")]
    Open { path: String, source: io::Error },
    #[error("image {0} is in use by another process (it holds a conflicting lock: another blklab, or QEMU)")]
    Locked(String),
    #[error("image {path} is empty and no --size was given")]
    EmptyImage { path: String },
    #[error("image {path}: size {size} is not a multiple of the block size {block}")]
    Unaligned { path: String, size: u64, block: u32 },
    #[error("cannot size image {path}: {source}")]
    Resize { path: String, source: io::Error },
    #[error("cannot allocate {size} bytes of RAM for a mem disk: larger than the address space")]
    TooLarge { size: u64 },
    #[error("cannot allocate {size} bytes of RAM for a mem disk: {source}")]
    Alloc {
        size: u64,
        source: vm_memory::mmap::MmapRegionError,
    },
}

/// What a disk's contents can do. Offsets and lengths are in bytes and have
/// been checked against the capacity by the caller.
pub(crate) trait Storage: Send + Sync {
    /// Capacity in bytes.
    fn size(&self) -> u64;
    /// Fill `bufs` (in order) with the bytes starting at `offset`.
    fn read_into(&self, offset: u64, bufs: &[GuestBuf<'_>]) -> io::Result<()>;
    /// Store the bytes of `bufs` (in order) starting at `offset`.
    fn write_from(&self, offset: u64, bufs: &[GuestBuf<'_>]) -> io::Result<()>;
    /// Make completed writes durable.
    fn flush(&self) -> io::Result<()>;
    /// Deallocate a range; it reads back as zeros afterwards.
    fn discard(&self, offset: u64, len: u64) -> io::Result<()>;
    /// Zero a range; `unmap` allows deallocating it.
    fn write_zeroes(&self, offset: u64, len: u64, unmap: bool) -> io::Result<()>;
    /// How many times [`Storage::flush`] made data durable (fdatasync
    /// calls that succeeded) since the storage was opened: 0 for storage
    /// with nothing to make durable.
    fn syncs(&self) -> u64 {
        0
    }
    /// Release the image locks that keep other writers away, keeping
    /// those of a reader that shares writes: a live migration hands the
    /// image to its destination. Storage without locks has nothing to do.
    fn release_write_locks(&self) -> io::Result<()> {
        Ok(())
    }
    /// Take the locks of a writer (back): `Ok(false)`, holding the same
    /// locks as before, while another process holds a conflicting one.
    fn take_write_locks(&self) -> io::Result<bool> {
        Ok(true)
    }
}

/// Open the storage a disk configuration names. For file disks with no size
/// the image's size is used and written back into `cfg.size`.
pub(crate) fn open(cfg: &mut DiskConfig) -> Result<Box<dyn Storage>, StorageError> {
    Ok(match &cfg.storage {
        StorageSpec::Null => Box::new(NullStorage::new(cfg.size)),
        StorageSpec::Mem => Box::new(MemStorage::new(cfg.size)?),
        StorageSpec::File(path) => {
            let size = (cfg.size != 0).then_some(cfg.size);
            let waiting = cfg.image_lock == ImageLock::Incoming;
            let f = FileStorage::open_with(
                path,
                size,
                cfg.read_only,
                cfg.direct,
                cfg.block_size,
                waiting,
            )?;
            cfg.size = f.size();
            Box::new(f)
        }
    })
}

/// Total length of a list of guest buffers.
pub(crate) fn total_len(bufs: &[GuestBuf<'_>]) -> u64 {
    bufs.iter().map(|b| b.len() as u64).sum()
}
