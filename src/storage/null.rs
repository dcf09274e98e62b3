//! `null`: reads return zeros, writes are dropped (null_blk's memory_backed=0).

use std::io;

use super::{GuestBuf, Storage};

pub struct NullStorage {
    size: u64,
}

impl NullStorage {
    pub fn new(size: u64) -> Self {
        NullStorage { size }
    }
}

/// Zero every byte of `bufs`.
pub(super) fn zero_bufs(bufs: &[GuestBuf<'_>]) {
    static ZEROS: [u8; 4096] = [0; 4096];
    for b in bufs {
        let mut off = 0;
        while off < b.len() {
            let n = (b.len() - off).min(ZEROS.len());
            // Offsets stay within the slice by construction.
            if let Ok(s) = b.subslice(off, n) {
                s.copy_from(&ZEROS[..n]);
            }
            off += n;
        }
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
