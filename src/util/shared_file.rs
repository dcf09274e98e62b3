//! A range of a file another process shares with this one (a frontend's
//! memfd: the inflight area, the dirty log), mapped shared, read-write.
//!
//! The file must hold the whole range: a mapping past the file's end
//! raises SIGBUS at the first access there and would kill the daemon. A
//! file that takes seals is first sealed against shrinking, so the check
//! holds for the mapping's life (QEMU seals its own memfds). The mapping
//! is reached only through raw pointers: the other process writes it
//! concurrently, so its users access it with atomics.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

use crate::util::fd::seal_against_shrinking;

/// Why a range of a shared file cannot be mapped.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SharedMapError {
    #[error("mmap size 0")]
    Empty,
    #[error("cannot stat the file: {0}")]
    Stat(#[source] io::Error),
    #[error("mmap offset {offset:#x} + size {len:#x} exceeds the file's size {size:#x}")]
    BeyondFile { offset: u64, len: u64, size: u64 },
    #[error("mmap offset {offset:#x} + size {len:#x} does not fit in the address space")]
    TooLarge { offset: u64, len: u64 },
    #[error("cannot map the file: {0}")]
    Map(#[source] io::Error),
}

/// `len` bytes of a file from `offset`, mapped shared; unmapped when
/// dropped.
pub(crate) struct SharedMapping {
    /// The range's first byte (inside `map`, which starts at the page
    /// below).
    base: *mut u8,
    len: u64,
    map: *mut libc::c_void,
    map_len: usize,
}

// SAFETY: the pointers point into a shared mapping this value owns until
// it is dropped; its users access it only with atomic operations.
unsafe impl Send for SharedMapping {}
// SAFETY: as above; nothing is mutated through `&self` but the mapping's
// bytes, atomically.
unsafe impl Sync for SharedMapping {}

impl std::fmt::Debug for SharedMapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedMapping")
            .field("len", &self.len)
            .finish()
    }
}

impl SharedMapping {
    /// Map `len` bytes of `file` from `offset` (any offset: the mapping
    /// starts at the page below it).
    pub(crate) fn of_file(file: &File, offset: u64, len: u64) -> Result<Self, SharedMapError> {
        if len == 0 {
            return Err(SharedMapError::Empty);
        }
        seal_against_shrinking(file);
        let size = file.metadata().map_err(SharedMapError::Stat)?.len();
        if !offset.checked_add(len).is_some_and(|end| end <= size) {
            return Err(SharedMapError::BeyondFile { offset, len, size });
        }
        // SAFETY: sysconf has no memory arguments.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
        let delta = offset % page;
        let too_large = |_| SharedMapError::TooLarge { offset, len };
        let map_len = usize::try_from(len + delta).map_err(too_large)?;
        let file_off = libc::off_t::try_from(offset - delta).map_err(too_large)?;
        // SAFETY: a new shared mapping of a file we hold open, at no fixed
        // address, inside the file (checked above); the kernel checks the
        // descriptor, length and offset.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                file_off,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(SharedMapError::Map(io::Error::last_os_error()));
        }
        Ok(SharedMapping {
            // SAFETY: delta < page <= map_len, inside the mapping.
            base: unsafe { (map as *mut u8).add(delta as usize) },
            len,
            map,
            map_len,
        })
    }

    /// The range's first byte.
    pub(crate) fn base(&self) -> *mut u8 {
        self.base
    }

    /// The range's length in bytes.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }
}

impl Drop for SharedMapping {
    fn drop(&mut self) {
        // SAFETY: the mapping `of_file` made, unmapped once, here; no
        // pointer into it outlives `self`.
        unsafe { libc::munmap(self.map, self.map_len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memfd(len: u64) -> File {
        // SAFETY: memfd_create with a NUL-terminated name; the File owns
        // the new descriptor.
        let fd =
            unsafe { libc::memfd_create(c"shared-file-test".as_ptr(), libc::MFD_ALLOW_SEALING) };
        assert!(fd >= 0);
        // SAFETY: `fd` is new and owned by nobody else.
        let f = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        f.set_len(len).unwrap();
        f
    }

    #[test]
    fn a_range_its_file_does_not_hold_is_refused() {
        let f = memfd(4096);
        assert!(matches!(
            SharedMapping::of_file(&f, 0, 4097),
            Err(SharedMapError::BeyondFile {
                offset: 0,
                len: 4097,
                size: 4096
            })
        ));
        assert!(matches!(
            SharedMapping::of_file(&f, u64::MAX, 2),
            Err(SharedMapError::BeyondFile { .. })
        ));
        assert!(matches!(
            SharedMapping::of_file(&f, 0, 0),
            Err(SharedMapError::Empty)
        ));
        // Sealed: the other process cannot shrink it under the mapping.
        assert!(f.set_len(100).is_err());
    }

    #[test]
    fn an_unaligned_range_maps_its_own_bytes() {
        let f = memfd(8192);
        std::os::unix::fs::FileExt::write_at(&f, &[7, 9], 5000).unwrap();
        let m = SharedMapping::of_file(&f, 5000, 2).unwrap();
        assert_eq!(m.len(), 2);
        // SAFETY: two bytes inside the mapping, read once.
        let got = unsafe { [*m.base(), *m.base().add(1)] };
        assert_eq!(got, [7, 9]);
    }
}
