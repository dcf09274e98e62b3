//! `mem`: the disk's bytes live in one anonymous, MAP_NORESERVE mapping, so
//! untouched ranges cost nothing and read as zeros (sparse RAM). Discard and
//! unmapping write-zeroes give whole pages back with MADV_DONTNEED. Data lives
//! as long as the process, across vhost-user reconnects.

use std::io;

use vm_memory::mmap::MmapRegion;
use vm_memory::{VolatileMemory, VolatileSlice};

use super::{GuestBuf, Storage, StorageError};

pub(crate) struct MemStorage {
    region: MmapRegion<()>,
    size: u64,
}

const PAGE: u64 = 4096;

impl MemStorage {
    pub(crate) fn new(size: u64) -> Result<Self, StorageError> {
        let len = usize::try_from(size).map_err(|_| StorageError::TooLarge { size })?;
        let region =
            MmapRegion::<()>::new(len).map_err(|source| StorageError::Alloc { size, source })?;
        Ok(MemStorage { region, size })
    }

    fn slice(&self, offset: u64, len: usize) -> io::Result<VolatileSlice<'_, ()>> {
        let off =
            usize::try_from(offset).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        self.region
            .get_slice(off, len)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
    }

    fn zero(&self, offset: u64, len: u64) -> io::Result<()> {
        static ZEROS: [u8; 65536] = [0; 65536];
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(ZEROS.len() as u64) as usize;
            self.slice(offset + done, n)?.copy_from(&ZEROS[..n]);
            done += n as u64;
        }
        Ok(())
    }

    /// Zero `[offset, offset+len)`, giving whole pages back to the kernel.
    fn deallocate(&self, offset: u64, len: u64) -> io::Result<()> {
        let end = offset + len;
        let first = offset.div_ceil(PAGE) * PAGE;
        let last = end / PAGE * PAGE;
        if first >= last {
            return self.zero(offset, len);
        }
        self.zero(offset, first - offset)?;
        self.zero(last, end - last)?;
        let s = self.slice(first, (last - first) as usize)?;
        let guard = s.ptr_guard_mut();
        // SAFETY: the range [first, last) lies inside our own private anonymous
        // mapping (checked by get_slice above) and is page aligned; DONTNEED
        // on a private anonymous mapping only makes it read back as zeros.
        let rc = unsafe {
            libc::madvise(
                guard.as_ptr() as *mut libc::c_void,
                (last - first) as usize,
                libc::MADV_DONTNEED,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

impl Storage for MemStorage {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_into(&self, mut offset: u64, bufs: &[GuestBuf<'_>]) -> io::Result<()> {
        for b in bufs {
            self.slice(offset, b.len())?.copy_to_volatile_slice(*b);
            offset += b.len() as u64;
        }
        Ok(())
    }

    fn write_from(&self, mut offset: u64, bufs: &[GuestBuf<'_>]) -> io::Result<()> {
        for b in bufs {
            b.copy_to_volatile_slice(self.slice(offset, b.len())?);
            offset += b.len() as u64;
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.deallocate(offset, len)
    }

    fn write_zeroes(&self, offset: u64, len: u64, unmap: bool) -> io::Result<()> {
        if unmap {
            self.deallocate(offset, len)
        } else {
            self.zero(offset, len)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::mmap::MmapRegion;

    fn guest(len: usize) -> MmapRegion<()> {
        MmapRegion::<()>::new(len).unwrap()
    }

    #[test]
    fn write_read_discard() {
        let m = MemStorage::new(1 << 20).unwrap();
        let g = guest(3 * 4096);
        let src = g.get_slice(0, 8192).unwrap();
        src.copy_from(&vec![0xabu8; 8192]);
        m.write_from(4096 * 3 + 100, &[src]).unwrap();
        let dst = g.get_slice(8192, 4096).unwrap();
        m.read_into(4096 * 3 + 100, &[dst]).unwrap();
        let mut out = vec![0u8; 4096];
        dst.copy_to(&mut out[..]);
        assert!(out.iter().all(|b| *b == 0xab));

        // Discard an unaligned range spanning whole pages: reads zeros.
        m.discard(4096 * 3 + 200, 5000).unwrap();
        let d = g.get_slice(0, 8192).unwrap();
        m.read_into(4096 * 3 + 100, &[d]).unwrap();
        let mut out = vec![0u8; 8192];
        d.copy_to(&mut out[..]);
        assert!(out[..100].iter().all(|b| *b == 0xab));
        assert!(out[100..5100].iter().all(|b| *b == 0));
        assert!(out[5100..8192].iter().all(|b| *b == 0xab));

        m.write_zeroes(4096 * 3 + 100, 8192, false).unwrap();
        m.read_into(4096 * 3 + 100, &[d]).unwrap();
        d.copy_to(&mut out[..]);
        assert!(out.iter().all(|b| *b == 0));
    }

    #[test]
    fn large_sparse() {
        // 64 GiB of address space, nothing touched: must not need the RAM.
        let m = MemStorage::new(64 << 30).unwrap();
        assert_eq!(m.size(), 64 << 30);
        let g = guest(4096);
        let s = g.get_slice(0, 4096).unwrap();
        m.read_into((64 << 30) - 4096, &[s]).unwrap();
    }
}
