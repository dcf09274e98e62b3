//! `file:PATH`: a raw image. Reads and writes go straight between guest
//! memory and the file with preadv/pwritev; flush is fdatasync; discard
//! punches a hole; write-zeroes zeroes a range (or punches with UNMAP).
//! The image is locked with QEMU's protocol ([`lock_like_qemu`]), so
//! neither a second daemon nor QEMU (qemu-io, qemu-img,
//! qemu-storage-daemon, a guest's disk) can write an image we serve, and
//! we refuse one that QEMU holds open for writing.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use super::null::zero_bufs;
use super::{total_len, GuestBuf, Storage, StorageError};

pub(crate) struct FileStorage {
    file: File,
    size: u64,
    read_only: bool,
    direct: bool,
    /// Alignment O_DIRECT needs for offsets, lengths and buffer addresses.
    align: usize,
    /// fdatasync calls that succeeded (flushes and write-through syncs).
    syncs: AtomicU64,
}

// QEMU's image locking (block/file-posix.c: raw_apply_lock_bytes,
// raw_check_lock_bytes): shared OFD locks on single bytes. Byte
// PERM_BASE + i means "I use permission 1 << i", byte SHARED_BASE + i
// "nobody else may use permission 1 << i". An opener takes its locks, then
// tests (F_OFD_GETLK for a write lock) that nobody else holds the
// "unshared" byte of a permission it uses, or the "use" byte of a
// permission it does not share. OFD locks belong to the open file
// description, so they also keep a second open in the same process away,
// and go with the last descriptor of it.
const PERM_BASE: i64 = 100;
const SHARED_BASE: i64 = 200;
/// BLK_PERM_CONSISTENT_READ, BLK_PERM_WRITE, BLK_PERM_WRITE_UNCHANGED,
/// BLK_PERM_RESIZE (bits 0..3 of QEMU's permission mask).
const PERM_CONSISTENT_READ: u32 = 0;
const PERM_WRITE: u32 = 1;
const PERM_WRITE_UNCHANGED: u32 = 2;
const PERM_RESIZE: u32 = 3;
const PERM_COUNT: u32 = 4;

/// One OFD lock request or test on byte `offset`.
fn ofd_lock(
    file: &File,
    cmd: libc::c_int,
    ltype: libc::c_int,
    offset: i64,
) -> io::Result<libc::flock> {
    // SAFETY: flock is plain data; all-zero is a valid value (l_pid must
    // be 0 for OFD locks).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = ltype as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = offset as libc::off_t;
    fl.l_len = 1;
    // SAFETY: fcntl on our own descriptor with a valid, exclusively
    // borrowed flock for the call.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), cmd, &mut fl) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fl)
}

/// What an opener uses and what it keeps others from using, as QEMU's
/// permission masks (bits [`PERM_CONSISTENT_READ`] … [`PERM_RESIZE`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Perms {
    used: u32,
    unshared: u32,
}

const fn bit(p: u32) -> u32 {
    1 << p
}

impl Perms {
    /// A disk that reads and writes, sharing reads and unchanged writes
    /// but not writes or resizes (QEMU's default for a writable image).
    const WRITER: Perms = Perms {
        used: bit(PERM_CONSISTENT_READ) | bit(PERM_WRITE),
        unshared: bit(PERM_WRITE) | bit(PERM_RESIZE),
    };
    /// A read-only disk: it reads, and keeps writers away (QEMU's default
    /// for a read-only image).
    const READER: Perms = Perms {
        used: bit(PERM_CONSISTENT_READ),
        unshared: bit(PERM_WRITE) | bit(PERM_RESIZE),
    };
    /// A writable disk waiting for its image (a live migration's
    /// destination): it reads and shares everything, so it coexists with
    /// the writer it takes over from.
    const WAITING: Perms = Perms {
        used: bit(PERM_CONSISTENT_READ),
        unshared: 0,
    };
}

// A writer shares reads and unchanged writes, as QEMU's.
const _: () = assert!(
    ((1 << PERM_COUNT) - 1) & !Perms::WRITER.unshared
        == bit(PERM_CONSISTENT_READ) | bit(PERM_WRITE_UNCHANGED)
);

/// Lock `file` as QEMU would for an opener with `perms`: shared locks on
/// the bytes of the permissions it uses and of those it does not share.
/// `Ok(false)` when another open file (QEMU or a second blklab) holds a
/// conflicting lock: it forbids what we use, or uses what we forbid. So two
/// read-only opens coexist; a writer excludes any other writer and any
/// reader that does not share writes (QEMU's default for a read-only
/// open), and vice versa. Locks taken before a conflict was seen stay
/// taken (the caller drops the file, or releases them).
fn lock_like_qemu(file: &File, perms: Perms) -> io::Result<bool> {
    let all = (1u32 << PERM_COUNT) - 1;
    let Perms { used, unshared } = perms;
    let shared = all & !unshared;
    // A shared lock is refused (EAGAIN/EACCES) only by an exclusive one
    // on the byte (QEMU takes none, another tool might): a conflict too.
    let take = |off: i64| -> io::Result<bool> {
        match ofd_lock(file, libc::F_OFD_SETLK, libc::F_RDLCK, off) {
            Ok(_) => Ok(true),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EACCES)) => Ok(false),
            Err(e) => Err(e),
        }
    };
    for i in 0..PERM_COUNT {
        if used & bit(i) != 0 && !take(PERM_BASE + i64::from(i))? {
            return Ok(false);
        }
        if unshared & bit(i) != 0 && !take(SHARED_BASE + i64::from(i))? {
            return Ok(false);
        }
    }
    // Checked after taking ours (as QEMU does), so two openers racing
    // each see the other.
    for i in 0..PERM_COUNT {
        let held = |off: i64| -> io::Result<bool> {
            let fl = ofd_lock(file, libc::F_OFD_GETLK, libc::F_WRLCK, off)?;
            Ok(fl.l_type != libc::F_UNLCK as libc::c_short)
        };
        if used & bit(i) != 0 && held(SHARED_BASE + i64::from(i))? {
            return Ok(false);
        }
        if shared & bit(i) == 0 && held(PERM_BASE + i64::from(i))? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Unlock the bytes a writer locks beyond those of [`Perms::WAITING`].
fn unlock_writer_bytes(file: &File) -> io::Result<()> {
    let (w, waiting) = (Perms::WRITER, Perms::WAITING);
    for i in 0..PERM_COUNT {
        if w.used & !waiting.used & bit(i) != 0 {
            ofd_lock(
                file,
                libc::F_OFD_SETLK,
                libc::F_UNLCK,
                PERM_BASE + i64::from(i),
            )?;
        }
        if w.unshared & !waiting.unshared & bit(i) != 0 {
            ofd_lock(
                file,
                libc::F_OFD_SETLK,
                libc::F_UNLCK,
                SHARED_BASE + i64::from(i),
            )?;
        }
    }
    Ok(())
}

/// Most iovecs one preadv/pwritev takes (IOV_MAX on Linux).
const IOV_MAX: usize = 1024;

/// Size of the bounce buffer O_DIRECT uses for unaligned guest buffers: a
/// request of any length is bounced through it piece by piece, so the
/// guest never sizes a host allocation.
const BOUNCE_CHUNK: usize = 1 << 20;

impl FileStorage {
    /// Open `path`; `size` None uses the image's size, a larger size grows
    /// the image (sparsely). `waiting`: a writable image is opened as a
    /// live migration's destination, with only the locks of a reader that
    /// shares writes, beside the writer it takes over from (see
    /// [`Storage::take_write_locks`]); otherwise with a writer's (or a
    /// reader's) locks.
    pub(crate) fn open_with(
        path: &Path,
        size: Option<u64>,
        read_only: bool,
        direct: bool,
        block_size: u32,
        waiting: bool,
    ) -> Result<Self, StorageError> {
        let name = path.display().to_string();
        let mut opts = OpenOptions::new();
        opts.read(true).write(!read_only);
        if size.is_some() && !read_only {
            opts.create(true);
        }
        if direct {
            opts.custom_flags(libc::O_DIRECT);
        }
        let file = opts.open(path).map_err(|source| StorageError::Open {
            path: name.clone(),
            source,
        })?;
        let perms = match (read_only, waiting) {
            (true, _) => Perms::READER,
            (false, false) => Perms::WRITER,
            (false, true) => Perms::WAITING,
        };
        match lock_like_qemu(&file, perms) {
            Ok(true) => {}
            Ok(false) => return Err(StorageError::Locked(name)),
            Err(source) => return Err(StorageError::Open { path: name, source }),
        }
        let meta = file.metadata().map_err(|source| StorageError::Open {
            path: name.clone(),
            source,
        })?;
        let len = if meta.is_file() {
            meta.len()
        } else {
            // A block device: ask for its size by seeking to the end.
            // SAFETY: lseek on our own descriptor.
            let end = unsafe { libc::lseek(file.as_raw_fd(), 0, libc::SEEK_END) };
            if end < 0 {
                return Err(StorageError::Open {
                    path: name,
                    source: io::Error::last_os_error(),
                });
            }
            end as u64
        };
        let size = match size {
            Some(s) => {
                if s > len && meta.is_file() {
                    if read_only {
                        return Err(StorageError::Resize {
                            path: name,
                            source: io::Error::new(
                                io::ErrorKind::InvalidInput,
                                format!("image has {len} bytes, --size asks for {s} and the disk is read-only"),
                            ),
                        });
                    }
                    file.set_len(s).map_err(|source| StorageError::Resize {
                        path: name.clone(),
                        source,
                    })?;
                }
                s
            }
            None => {
                if len == 0 {
                    return Err(StorageError::EmptyImage { path: name });
                }
                len
            }
        };
        if size % u64::from(block_size) != 0 {
            return Err(StorageError::Unaligned {
                path: name,
                size,
                block: block_size,
            });
        }
        Ok(FileStorage {
            file,
            size,
            read_only,
            direct,
            align: block_size.max(512) as usize,
            syncs: AtomicU64::new(0),
        })
    }

    fn aligned(&self, offset: u64, bufs: &[GuestBuf<'_>]) -> bool {
        let a = self.align;
        offset % a as u64 == 0
            && bufs
                .iter()
                .all(|b| b.len() % a == 0 && (b.ptr_guard().as_ptr() as usize) % a == 0)
    }

    /// preadv/pwritev over guest buffers, looping over short transfers.
    fn vectored(&self, write: bool, offset: u64, bufs: &[GuestBuf<'_>]) -> io::Result<()> {
        // Flatten into (ptr, len) once; guards for `()` bitmaps are no-ops,
        // so the pointers stay valid while `bufs` borrows guest memory.
        let mut iov: Vec<libc::iovec> = bufs
            .iter()
            .filter(|b| !b.is_empty())
            .map(|b| libc::iovec {
                iov_base: if write {
                    b.ptr_guard().as_ptr() as *mut libc::c_void
                } else {
                    b.ptr_guard_mut().as_ptr() as *mut libc::c_void
                },
                iov_len: b.len(),
            })
            .collect();
        let mut start = 0usize;
        let mut pos = offset;
        while start < iov.len() {
            let end = (start + IOV_MAX).min(iov.len());
            let chunk = &iov[start..end];
            // SAFETY: every iovec points into a mapped guest memory region of
            // at least iov_len bytes (VolatileSlices are bounds-checked when
            // created) that stays mapped while `bufs` is borrowed.
            let n = unsafe {
                if write {
                    libc::pwritev(
                        self.file.as_raw_fd(),
                        chunk.as_ptr(),
                        chunk.len() as i32,
                        pos as i64,
                    )
                } else {
                    libc::preadv(
                        self.file.as_raw_fd(),
                        chunk.as_ptr(),
                        chunk.len() as i32,
                        pos as i64,
                    )
                }
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            let mut n = n as usize;
            if n == 0 {
                if write {
                    return Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        "pwritev wrote nothing",
                    ));
                }
                // End of file inside the disk (image shrank): zeros.
                for v in &iov[start..] {
                    // SAFETY: as above, the iovec is inside mapped guest memory.
                    unsafe { std::ptr::write_bytes(v.iov_base as *mut u8, 0, v.iov_len) };
                }
                return Ok(());
            }
            pos += n as u64;
            while n > 0 && start < iov.len() {
                if n >= iov[start].iov_len {
                    n -= iov[start].iov_len;
                    start += 1;
                } else {
                    // SAFETY: advancing within the same iovec.
                    iov[start].iov_base =
                        unsafe { (iov[start].iov_base as *mut u8).add(n) } as *mut libc::c_void;
                    iov[start].iov_len -= n;
                    n = 0;
                }
            }
        }
        Ok(())
    }

    /// O_DIRECT with unaligned guest buffers: go through an aligned bounce
    /// buffer of at most [`BOUNCE_CHUNK`] bytes, one aligned window of the
    /// file at a time (read-modify-write of partial blocks at either end).
    fn bounced(&self, write: bool, offset: u64, bufs: &[GuestBuf<'_>]) -> io::Result<()> {
        let len = total_len(bufs);
        let a = self.align as u64;
        let end = offset + len;
        let aligned_end = end.div_ceil(a) * a;
        let mut win = offset / a * a;
        let chunk = (BOUNCE_CHUNK as u64 / a).max(1) * a;
        let mut buf = AlignedBuf::new(chunk.min(aligned_end - win) as usize, self.align)?;
        let mut guest = GuestCursor::new(bufs);
        while win < end {
            let win_end = (win + chunk).min(aligned_end);
            let b = &mut buf.as_mut()[..(win_end - win) as usize];
            // The guest's part of this window.
            let (lo, hi) = (offset.max(win) - win, end.min(win_end) - win);
            let (lo, hi) = (lo as usize, hi as usize);
            if !write || lo != 0 || hi != b.len() {
                self.read_full(b, win)?;
            }
            if write {
                guest.copy_out(&mut b[lo..hi]);
                self.file.write_all_at(b, win)?;
            } else {
                guest.copy_in(&b[lo..hi]);
            }
            win = win_end;
        }
        Ok(())
    }

    /// Fill `buf` from `offset`; bytes past the end of the file read as zeros.
    fn read_full(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let mut done = 0;
        while done < buf.len() {
            match self.file.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => {
                    buf[done..].fill(0);
                    break;
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn fallocate(&self, mode: i32, offset: u64, len: u64) -> io::Result<()> {
        // SAFETY: fallocate on our own descriptor; no memory involved.
        let rc = unsafe { libc::fallocate(self.file.as_raw_fd(), mode, offset as i64, len as i64) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn write_zero_bytes(&self, offset: u64, len: u64) -> io::Result<()> {
        let chunk = AlignedBuf::new(1 << 20, self.align)?;
        let mut done = 0u64;
        let mut chunk = chunk;
        while done < len {
            let n = (len - done).min(1 << 20) as usize;
            self.file
                .write_all_at(&chunk.as_mut()[..n], offset + done)?;
            done += n as u64;
        }
        Ok(())
    }
}

fn unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) | Some(libc::EINVAL)
    )
}

impl Storage for FileStorage {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_into(&self, offset: u64, bufs: &[GuestBuf<'_>]) -> io::Result<()> {
        if total_len(bufs) == 0 {
            zero_bufs(bufs);
            return Ok(());
        }
        if self.direct && !self.aligned(offset, bufs) {
            return self.bounced(false, offset, bufs);
        }
        self.vectored(false, offset, bufs)
    }

    fn write_from(&self, offset: u64, bufs: &[GuestBuf<'_>]) -> io::Result<()> {
        if total_len(bufs) == 0 {
            return Ok(());
        }
        if self.direct && !self.aligned(offset, bufs) {
            return self.bounced(true, offset, bufs);
        }
        self.vectored(true, offset, bufs)
    }

    fn release_write_locks(&self) -> io::Result<()> {
        if self.read_only {
            return Ok(());
        }
        unlock_writer_bytes(&self.file)
    }

    fn take_write_locks(&self) -> io::Result<bool> {
        if self.read_only {
            return Ok(true);
        }
        if lock_like_qemu(&self.file, Perms::WRITER)? {
            return Ok(true);
        }
        // Back to a waiting reader's locks: what was taken before the
        // conflict showed must not keep the holder from its own.
        unlock_writer_bytes(&self.file)?;
        Ok(false)
    }

    fn flush(&self) -> io::Result<()> {
        self.file.sync_data()?;
        self.syncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn syncs(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        match self.fallocate(
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset,
            len,
        ) {
            Err(e) if unsupported(&e) => self.write_zero_bytes(offset, len),
            r => r,
        }
    }

    fn write_zeroes(&self, offset: u64, len: u64, unmap: bool) -> io::Result<()> {
        let mode = if unmap {
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE
        } else {
            libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE
        };
        match self.fallocate(mode, offset, len) {
            Err(e) if unsupported(&e) => self.write_zero_bytes(offset, len),
            r => r,
        }
    }
}

/// A position in a list of guest buffers, for copying a request's data
/// through the bounce buffer in order.
struct GuestCursor<'a, 'b> {
    bufs: &'a [GuestBuf<'b>],
    idx: usize,
    off: usize,
}

impl<'a, 'b> GuestCursor<'a, 'b> {
    fn new(bufs: &'a [GuestBuf<'b>]) -> Self {
        GuestCursor {
            bufs,
            idx: 0,
            off: 0,
        }
    }

    /// Walk the next `len` guest bytes as (buffer, offset in it, length,
    /// offset in the walk) pieces.
    fn walk(&mut self, len: usize, mut each: impl FnMut(&GuestBuf<'b>, usize, usize, usize)) {
        let mut p = 0;
        while p < len && self.idx < self.bufs.len() {
            let b = &self.bufs[self.idx];
            let n = (b.len() - self.off).min(len - p);
            each(b, self.off, n, p);
            p += n;
            self.off += n;
            if self.off == b.len() {
                self.idx += 1;
                self.off = 0;
            }
        }
    }

    /// Copy the next `out.len()` guest bytes into `out`.
    fn copy_out(&mut self, out: &mut [u8]) {
        self.walk(out.len(), |b, off, n, p| {
            if let Ok(s) = b.subslice(off, n) {
                s.copy_to(&mut out[p..p + n]);
            }
        });
    }

    /// Copy `data` into the next `data.len()` guest bytes.
    fn copy_in(&mut self, data: &[u8]) {
        self.walk(data.len(), |b, off, n, p| {
            if let Ok(s) = b.subslice(off, n) {
                s.copy_from(&data[p..p + n]);
            }
        });
    }
}

/// A zeroed heap buffer with the alignment O_DIRECT needs.
struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    layout: std::alloc::Layout,
}

impl AlignedBuf {
    fn new(len: usize, align: usize) -> io::Result<Self> {
        let layout = std::alloc::Layout::from_size_align(len.max(align), align.max(4096))
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: layout has a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr =
            std::ptr::NonNull::new(p).ok_or_else(|| io::Error::from(io::ErrorKind::OutOfMemory))?;
        Ok(AlignedBuf { ptr, layout })
    }

    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: ptr is a live allocation of layout.size() initialised bytes.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in new().
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

#[cfg(test)]
impl FileStorage {
    /// [`open_with`](Self::open_with) with the locks of a writer (or a
    /// reader).
    pub(crate) fn open(
        path: &Path,
        size: Option<u64>,
        read_only: bool,
        direct: bool,
        block_size: u32,
    ) -> Result<Self, StorageError> {
        Self::open_with(path, size, read_only, direct, block_size, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::mmap::MmapRegion;
    use vm_memory::VolatileMemory;

    #[test]
    fn rw_flush_discard_lock() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("img.raw");
        let f = FileStorage::open(&p, Some(1 << 20), false, false, 512).unwrap();
        assert_eq!(f.size(), 1 << 20);
        // A second open is refused by the lock, writable or read-only.
        assert!(matches!(
            FileStorage::open(&p, None, false, false, 512),
            Err(StorageError::Locked(_))
        ));
        assert!(matches!(
            FileStorage::open(&p, None, true, false, 512),
            Err(StorageError::Locked(_))
        ));
        let g = MmapRegion::<()>::new(16384).unwrap();
        let a = g.get_slice(0, 1000).unwrap();
        let b = g.get_slice(4096, 24).unwrap();
        a.copy_from(&vec![1u8; 1000]);
        b.copy_from(&[2u8; 24]);
        f.write_from(512, &[a, b]).unwrap();
        f.flush().unwrap();
        let c = g.get_slice(8192, 1024).unwrap();
        f.read_into(512, &[c]).unwrap();
        let mut out = vec![0u8; 1024];
        c.copy_to(&mut out[..]);
        assert!(out[..1000].iter().all(|x| *x == 1));
        assert!(out[1000..].iter().all(|x| *x == 2));
        f.discard(0, 4096).unwrap();
        f.read_into(512, &[c]).unwrap();
        c.copy_to(&mut out[..]);
        assert!(out.iter().all(|x| *x == 0));
        f.write_from(512, &[a, b]).unwrap();
        f.write_zeroes(512, 512, false).unwrap();
        f.read_into(512, &[c]).unwrap();
        c.copy_to(&mut out[..]);
        assert!(out[..512].iter().all(|x| *x == 0));
        assert!(out[512..1000].iter().all(|x| *x == 1));
        drop(f);
        // Lock released with the file; two read-only opens coexist, and
        // keep a writer away.
        let f2 = FileStorage::open(&p, None, true, false, 512).unwrap();
        assert_eq!(f2.size(), 1 << 20);
        let f3 = FileStorage::open(&p, None, true, false, 512).unwrap();
        assert!(matches!(
            FileStorage::open(&p, None, false, false, 512),
            Err(StorageError::Locked(_))
        ));
        drop((f2, f3));
        FileStorage::open(&p, None, false, false, 512).unwrap();
    }

    /// A live migration's image hand-over: the destination opens the
    /// image beside its writer, takes the writer's locks only once the
    /// writer has released them, and then keeps the old writer (and any
    /// other) away; a failed attempt leaves nothing that keeps the holder
    /// from taking its locks back.
    #[test]
    fn a_waiting_open_takes_the_image_over_once_its_writer_releases_it() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("img.raw");
        let src = FileStorage::open(&p, Some(1 << 20), false, false, 512).unwrap();
        let dst = FileStorage::open_with(&p, None, false, false, 512, true).unwrap();
        assert!(!dst.take_write_locks().unwrap(), "the writer holds it");
        src.release_write_locks().unwrap();
        assert!(
            src.take_write_locks().unwrap(),
            "a failed attempt left locks"
        );
        src.release_write_locks().unwrap();
        assert!(dst.take_write_locks().unwrap());
        assert!(!src.take_write_locks().unwrap(), "taken over");
        assert!(matches!(
            FileStorage::open(&p, None, false, false, 512),
            Err(StorageError::Locked(_))
        ));
        // A waiting open keeps nothing away but those that do not share
        // reads: a second one coexists.
        drop(FileStorage::open_with(&p, None, false, false, 512, true).unwrap());
        dst.release_write_locks().unwrap();
        assert!(src.take_write_locks().unwrap(), "handed back");
        // Read-only disks hold their locks throughout.
        drop((src, dst));
        let ro = FileStorage::open_with(&p, None, true, false, 512, true).unwrap();
        ro.release_write_locks().unwrap();
        assert!(matches!(
            FileStorage::open(&p, None, false, false, 512),
            Err(StorageError::Locked(_))
        ));
        assert!(ro.take_write_locks().unwrap());
    }

    #[test]
    fn direct_unaligned_bounce() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("img.raw");
        let f = match FileStorage::open(&p, Some(1 << 20), false, true, 512) {
            Ok(f) => f,
            // tmpfs has no O_DIRECT; the bounce path is still exercised below
            // through the non-direct file.
            Err(_) => FileStorage::open(&p, Some(1 << 20), false, false, 512).unwrap(),
        };
        let g = MmapRegion::<()>::new(16384).unwrap();
        let a = g.get_slice(3, 512).unwrap();
        a.copy_from(&[7u8; 512]);
        f.bounced(true, 1024, &[a]).unwrap();
        let c = g.get_slice(5000, 512).unwrap();
        f.bounced(false, 1024, &[c]).unwrap();
        let mut out = vec![0u8; 512];
        c.copy_to(&mut out[..]);
        assert!(out.iter().all(|x| *x == 7));
    }

    #[test]
    fn bounce_in_chunks_over_many_buffers() {
        // 3 MiB + 1 KiB at an unaligned offset, from and into unaligned
        // buffers of odd sizes: bounced through BOUNCE_CHUNK-sized windows,
        // with read-modify-write at both ends.
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("img.raw");
        let f = FileStorage::open(&p, Some(8 << 20), false, true, 512)
            .or_else(|_| FileStorage::open(&p, Some(8 << 20), false, false, 512))
            .unwrap();
        let len = 3 * BOUNCE_CHUNK + 1024;
        let g = MmapRegion::<()>::new(2 * len + 16384).unwrap();
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4099) as u8).collect();
        let cuts = [0, 1, 777, BOUNCE_CHUNK + 3, 2 * BOUNCE_CHUNK - 5, len];
        let bufs = |base: usize| -> Vec<GuestBuf<'_>> {
            cuts.windows(2)
                .map(|w| g.get_slice(base + 1 + w[0], w[1] - w[0]).unwrap())
                .collect()
        };
        let src = bufs(0);
        let mut p = 0;
        for b in &src {
            b.copy_from(&data[p..p + b.len()]);
            p += b.len();
        }
        // Surrounding bytes that must survive.
        let edge = g.get_slice(len + 4096, 4096).unwrap();
        edge.copy_from(&[0xaau8; 4096]);
        f.bounced(true, 100, &[edge]).unwrap();
        f.bounced(true, 100 + 4096 + len as u64, &[edge]).unwrap();
        f.bounced(true, 100 + 4096, &src).unwrap();
        let dst = bufs(len + 8192);
        f.bounced(false, 100 + 4096, &dst).unwrap();
        let mut got = Vec::new();
        for b in &dst {
            let mut v = vec![0u8; b.len()];
            b.copy_to(&mut v[..]);
            got.extend(v);
        }
        assert!(got == data, "bounced data differs");
        for at in [100, 100 + 4096 + len as u64] {
            edge.copy_from(&[0u8; 4096]);
            f.bounced(false, at, &[edge]).unwrap();
            let mut around = vec![0u8; 4096];
            edge.copy_to(&mut around[..]);
            assert!(around.iter().all(|x| *x == 0xaa), "neighbour at {at}");
        }
    }

    #[test]
    fn open_errors() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("none.raw");
        assert!(matches!(
            FileStorage::open(&missing, None, false, false, 512),
            Err(StorageError::Open { .. })
        ));
        let empty = dir.path().join("empty.raw");
        std::fs::write(&empty, b"").unwrap();
        assert!(matches!(
            FileStorage::open(&empty, None, false, false, 512),
            Err(StorageError::EmptyImage { .. })
        ));
        let odd = dir.path().join("odd.raw");
        std::fs::write(&odd, vec![0u8; 1000]).unwrap();
        assert!(matches!(
            FileStorage::open(&odd, None, false, false, 512),
            Err(StorageError::Unaligned { .. })
        ));
    }
}
