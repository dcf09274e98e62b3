//! `null`: reads return zeros, writes are dropped (null_blk's memory_backed=0).

use std::io;

use super::{GuestBuf, Storage};

pub(crate) struct NullStorage {
    size: u64,
}

impl NullStorage {
    pub(crate) fn new(size: u64) -> Self {
        NullStorage { size }
    }
}

/// Zero every byte of `bufs`: a `memset` of each guest buffer (as
/// qemu-storage-daemon's `null-co,read-zeroes=on` does), not a copy from a
/// zero page, which reads as many bytes as it writes.
pub(super) fn zero_bufs(bufs: &[GuestBuf<'_>]) {
    for b in bufs {
        let guard = b.ptr_guard_mut();
        // SAFETY: a VolatileSlice is valid for writes of `len()` bytes at
        // its pointer while the guard lives (vm-memory's invariant: the
        // slice lies inside a mapped guest region, checked when it was
        // made). The guest may touch the same bytes concurrently, exactly
        // as with vm-memory's own copies into guest memory; bytes are
        // plain data, so no value can be invalid.
        unsafe { std::ptr::write_bytes(guard.as_ptr(), 0, b.len()) };
    }
}

impl Storage for NullStorage {
    fn size(&self) -> u64 {
        self.size
    }
    fn read_into(&self, _offset: u64, bufs: &[GuestBuf<'_>]) -> io::Result<()> {
        zero_bufs(bufs);
        Ok(())
    }
    fn write_from(&self, _offset: u64, _bufs: &[GuestBuf<'_>]) -> io::Result<()> {
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn discard(&self, _offset: u64, _len: u64) -> io::Result<()> {
        Ok(())
    }
    fn write_zeroes(&self, _offset: u64, _len: u64, _unmap: bool) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

    #[test]
    fn reads_zero_exactly_the_buffers() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap();
        mem.write_slice(&[0xff; 0x10000], GuestAddress(0)).unwrap();
        let a = mem.get_slice(GuestAddress(0x1001), 100).unwrap();
        let b = mem.get_slice(GuestAddress(0x3000), 5000).unwrap();
        NullStorage::new(1 << 20).read_into(0, &[a, b]).unwrap();
        let mut all = vec![0u8; 0x10000];
        mem.read_slice(&mut all, GuestAddress(0)).unwrap();
        for (i, byte) in all.iter().enumerate() {
            let inside =
                (0x1001..0x1001 + 100).contains(&i) || (0x3000..0x3000 + 5000).contains(&i);
            assert_eq!(*byte, if inside { 0 } else { 0xff }, "byte {i:#x}");
        }
    }
}
