//! The vhost-user dirty log (vhost-user spec, "Migration", with
//! VHOST_USER_PROTOCOL_F_LOG_SHMFD): a bitmap in memory the frontend
//! shares (SET_LOG_BASE), one bit per 4 KiB page of guest physical
//! address, bit `page % 8` of byte `page / 8`, as libvhost-user's
//! `vu_log_page` and Linux vhost's log lay it out. While the frontend
//! migrates the guest, every page the device writes is marked here, so that
//! QEMU sends it again.
//!
//! The bits are set with an atomic OR after the device's write (the
//! frontend reads and clears them concurrently with an atomic exchange), so
//! a page is never marked before its new bytes are in memory. The log is
//! reached only through atomics on raw pointers, never through a Rust
//! reference: the frontend writes it concurrently.

use std::fs::File;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};

use log::warn;

use crate::util::shared_file::{SharedMapError, SharedMapping};

/// The size of a page in the log.
pub(crate) const LOG_PAGE: u64 = 4096;

/// Why a log the frontend sent cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("the dirty log: {0}")]
pub(crate) struct LogError(#[from] pub(crate) SharedMapError);

/// A frontend's dirty log, mapped shared.
pub(crate) struct DirtyLog {
    /// The log's bytes: it covers `8 * len` pages.
    mapping: SharedMapping,
    /// Bytes of log.
    len: u64,
    /// A page was marked since the last [`take_marked`](Self::take_marked).
    marked: AtomicBool,
    /// Pages that were to be marked but lie beyond the log.
    beyond: AtomicU64,
    warned_beyond: AtomicBool,
}

impl std::fmt::Debug for DirtyLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirtyLog")
            .field("len", &self.len)
            .field("beyond", &self.beyond.load(Ordering::Relaxed))
            .finish()
    }
}

impl DirtyLog {
    /// Map `size` bytes of `file` at `offset` (SET_LOG_BASE's
    /// `VhostUserLog`). The file must hold them: a log beyond its file's
    /// end would raise SIGBUS at the first mark there. A file that can be
    /// sealed is first sealed against shrinking, so the check holds for the
    /// life of the mapping (QEMU seals its log memfd itself).
    pub(crate) fn map(file: &File, offset: u64, size: u64) -> Result<DirtyLog, LogError> {
        let mapping = SharedMapping::of_file(file, offset, size)?;
        Ok(DirtyLog {
            len: mapping.len(),
            mapping,
            marked: AtomicBool::new(false),
            beyond: AtomicU64::new(0),
            warned_beyond: AtomicBool::new(false),
        })
    }

    /// Pages the log covers.
    pub(crate) fn pages(&self) -> u64 {
        self.len.saturating_mul(8)
    }

    /// Mark every page that `len` bytes at guest address `gpa` touch. Pages
    /// beyond the log are not marked: they are counted (and the first one
    /// warned about).
    #[inline]
    pub(crate) fn mark(&self, gpa: u64, len: u64) {
        if len == 0 {
            return;
        }
        let first = gpa / LOG_PAGE;
        let last = gpa.saturating_add(len - 1) / LOG_PAGE;
        let pages = self.pages();
        for page in first..=last.min(pages.saturating_sub(1)) {
            let bit = 1u8 << (page % 8);
            // SAFETY: page < pages = 8 * len, so page / 8 < len: a byte of
            // the log, inside the mapping `self` owns. The frontend reads
            // and clears it concurrently, so it is only accessed
            // atomically (a byte has no alignment to meet).
            let byte = unsafe { AtomicU8::from_ptr(self.mapping.base().add((page / 8) as usize)) };
            // Release: the device's write of the page is visible before
            // the mark (the frontend's exchange of the byte is a full
            // barrier).
            byte.fetch_or(bit, Ordering::Release);
        }
        if last >= pages {
            self.beyond_log(first.max(pages), last);
        }
        self.marked.store(true, Ordering::Relaxed);
    }

    /// Pages `first..=last` lie beyond the log: count them, warn once.
    #[cold]
    fn beyond_log(&self, first: u64, last: u64) {
        self.beyond.fetch_add(last - first + 1, Ordering::Relaxed);
        if !self.warned_beyond.swap(true, Ordering::Relaxed) {
            warn!(
                "dirty log: guest page {first:#x} (guest address {:#x}) is beyond the log's {} pages: not marked (further ones are only counted)",
                first.saturating_mul(LOG_PAGE),
                self.pages()
            );
        }
    }

    /// Whether a page was marked since the last call.
    #[inline]
    pub(crate) fn take_marked(&self) -> bool {
        self.marked.load(Ordering::Relaxed) && self.marked.swap(false, Ordering::Relaxed)
    }
}

impl Drop for DirtyLog {
    fn drop(&mut self) {
        let beyond = self.beyond.load(Ordering::Relaxed);
        if beyond > 0 {
            warn!(
                "dirty log: {beyond} guest pages beyond the log's {} were not marked",
                self.pages()
            );
        }
    }
}

/// Test helpers: a log in a memfd of its own, and its marks.
#[cfg(test)]
impl DirtyLog {
    /// Pages that could not be marked because they lie beyond the log.
    pub(crate) fn beyond(&self) -> u64 {
        self.beyond.load(Ordering::Relaxed)
    }

    /// A log of `bytes` bytes (8 pages each) in a fresh memfd.
    pub(crate) fn in_memfd(bytes: u64) -> DirtyLog {
        use std::os::fd::FromRawFd;
        // SAFETY: memfd_create with a NUL-terminated name.
        let fd = unsafe { libc::memfd_create(c"dirty-log".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
        // SAFETY: a fresh descriptor nobody else owns.
        let f = unsafe { File::from_raw_fd(fd) };
        f.set_len(bytes).unwrap();
        DirtyLog::map(&f, 0, bytes).unwrap()
    }

    /// The pages marked, in order; clears them (as the frontend's sync
    /// does).
    pub(crate) fn take_pages(&self) -> Vec<u64> {
        let mut pages = Vec::new();
        for i in 0..self.len {
            // SAFETY: i < len: a byte of the log, accessed atomically.
            let byte = unsafe { AtomicU8::from_ptr(self.mapping.base().add(i as usize)) };
            let b = byte.swap(0, Ordering::SeqCst);
            pages.extend(
                (0..8)
                    .filter(|bit| b & (1 << bit) != 0)
                    .map(|bit| 8 * i + bit),
            );
        }
        pages
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::FromRawFd;

    fn memfd(size: u64, sealing: bool) -> File {
        let flags = libc::MFD_CLOEXEC | if sealing { libc::MFD_ALLOW_SEALING } else { 0 };
        // SAFETY: memfd_create with a NUL-terminated name.
        let fd = unsafe { libc::memfd_create(c"dirty-log-test".as_ptr(), flags) };
        assert!(fd >= 0);
        // SAFETY: a fresh descriptor nobody else owns.
        let f = unsafe { File::from_raw_fd(fd) };
        f.set_len(size).unwrap();
        f
    }

    /// The bytes of `f` from `offset`, `len` of them.
    fn bytes(f: &File, offset: u64, len: usize) -> Vec<u8> {
        use std::os::unix::fs::FileExt;
        let mut b = vec![0u8; len];
        f.read_exact_at(&mut b, offset).unwrap();
        b
    }

    /// The pages set in a log's bytes.
    fn set_pages(b: &[u8]) -> Vec<u64> {
        (0..b.len() as u64 * 8)
            .filter(|p| b[(p / 8) as usize] & (1 << (p % 8)) != 0)
            .collect()
    }

    #[test]
    fn marks_every_page_a_range_touches_and_nothing_else() {
        let f = memfd(4096, true);
        let log = DirtyLog::map(&f, 0, 64).unwrap();
        assert_eq!(log.pages(), 512);
        assert!(!log.take_marked());
        log.mark(0x1000, 1);
        log.mark(0x2fff, 2); // pages 2 and 3
        log.mark(0x9000, 0x2000); // pages 9 and 10, exactly
        log.mark(0x20000, 0); // nothing
        assert!(log.take_marked());
        assert!(!log.take_marked(), "taken");
        let b = bytes(&f, 0, 64);
        assert_eq!(set_pages(&b), [1, 2, 3, 9, 10]);
        // libvhost-user's layout: bit page % 8 of byte page / 8.
        assert_eq!(b[0], 0b0000_1110);
        assert_eq!(b[1], 0b0000_0110);
        assert_eq!(log.beyond(), 0);
        assert_eq!(log.take_pages(), [1, 2, 3, 9, 10]);
        assert!(log.take_pages().is_empty(), "cleared");
    }

    #[test]
    fn marks_are_ors_the_frontend_clears() {
        let f = memfd(4096, false);
        let log = DirtyLog::map(&f, 0, 8).unwrap();
        use std::os::unix::fs::FileExt;
        f.write_all_at(&[0b1000_0000], 0).unwrap();
        log.mark(0, 1);
        assert_eq!(bytes(&f, 0, 1), [0b1000_0001], "the frontend's bit kept");
        f.write_all_at(&[0], 0).unwrap();
        log.mark(0x1000, 1);
        assert_eq!(bytes(&f, 0, 1), [0b0000_0010], "cleared bits stay clear");
    }

    #[test]
    fn pages_beyond_the_log_are_counted_never_written() {
        let f = memfd(8192, true);
        // The log's 2 bytes (16 pages) at offset 4096 + 100; the bytes
        // around it must stay untouched.
        let log = DirtyLog::map(&f, 4196, 2).unwrap();
        assert_eq!(log.pages(), 16);
        log.mark(15 * LOG_PAGE, 3 * LOG_PAGE); // pages 15, 16, 17
        log.mark(u64::MAX - 10, 100); // the last page of the address space
        log.mark(1 << 40, 1);
        assert_eq!(log.beyond(), 2 + 1 + 1);
        let b = bytes(&f, 4096, 200);
        assert!(b[..100].iter().all(|&x| x == 0));
        assert_eq!(b[100..102], [0, 0b1000_0000]);
        assert!(b[102..].iter().all(|&x| x == 0));
        assert!(bytes(&f, 0, 4096).iter().all(|&x| x == 0));
    }

    #[test]
    fn a_log_its_file_does_not_hold_is_refused() {
        let f = memfd(4096, true);
        assert!(matches!(
            DirtyLog::map(&f, 0, 4097),
            Err(LogError(SharedMapError::BeyondFile {
                offset: 0,
                len: 4097,
                size: 4096
            }))
        ));
        assert!(matches!(
            DirtyLog::map(&f, 4000, 100),
            Err(LogError(SharedMapError::BeyondFile { .. }))
        ));
        assert!(matches!(
            DirtyLog::map(&f, u64::MAX, 2),
            Err(LogError(SharedMapError::BeyondFile { .. }))
        ));
        assert!(matches!(
            DirtyLog::map(&f, 0, 0),
            Err(LogError(SharedMapError::Empty))
        ));
        let e = DirtyLog::map(&f, 0, 8192).unwrap_err().to_string();
        assert!(e.contains("exceeds the file's size 0x1000"), "{e}");
        DirtyLog::map(&f, 4000, 96).unwrap();
    }

    #[test]
    fn a_sealable_log_is_sealed_against_shrinking() {
        let f = memfd(4096, true);
        let _log = DirtyLog::map(&f, 0, 4096).unwrap();
        assert!(f.set_len(100).is_err(), "the log's file shrank under it");
        // One that cannot be sealed is taken as it is.
        let g = memfd(4096, false);
        let _log = DirtyLog::map(&g, 0, 4096).unwrap();
    }
}
