//! A vring that counts guest kicks exactly.
//!
//! A kick is an eventfd write; the eventfd's counter adds them up until it
//! is read. vhost-user-backend's `read_kick` reads and discards that
//! counter, so three kicks that arrive before the worker wakes look like one
//! wake-up. This wrapper reads the counter itself and keeps the value for
//! the queue's worker thread: the exact number of kicks is what tells a
//! plugged guest (several requests, one kick) from an unplugged one (a kick
//! per request).

use std::fs::File;
use std::io;
use std::os::unix::io::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::Arc;

use vhost_user_backend::{VringRwLock, VringStateGuard, VringStateMutGuard, VringT};
use virtio_queue::{Error as VirtQueError, QueueT};
use vm_memory::GuestAddressSpace;

/// [`VringRwLock`] plus an exact kick counter.
#[derive(Clone)]
pub(crate) struct KickCountingVring<M: GuestAddressSpace> {
    inner: VringRwLock<M>,
    /// Kicks read from the eventfd and not yet taken by the worker. Only
    /// the queue's own worker thread touches it on the hot path.
    kicks: Arc<AtomicU64>,
    /// A queue size the frontend set that a split ring cannot have (not a
    /// power of 2), 0 when the last size set was valid: the ring is not
    /// started, and SET_VRING_ADDR fails, until a valid size is set.
    refused_size: Arc<AtomicU16>,
    /// The refusal was logged (once per connection).
    warned_size: Arc<AtomicBool>,
    /// Kicks this vring wrote itself (at the ring's start), not yet read.
    own_kicks: Arc<AtomicU64>,
}

impl<M: GuestAddressSpace + 'static> KickCountingVring<M> {
    /// Kicks counted since the last call.
    pub(crate) fn take_kicks(&self) -> u64 {
        self.kicks.swap(0, Ordering::Relaxed)
    }

    /// Whether the ring is started: the frontend set its kick fd, has not
    /// stopped it with GET_VRING_BASE since, and its size was not refused.
    /// The device touches no other ring. (A disabled ring's kick fd is
    /// out of epoll, but requests it has in service still complete at
    /// their deadlines, as they did before the ring was disabled.)
    pub(crate) fn started(&self) -> bool {
        self.inner.get_ref().get_queue().ready() && self.refused_size.load(Ordering::Relaxed) == 0
    }

    /// Collect kicks that arrived since the worker woke up, so they are
    /// counted with the requests they announced. Call it only before
    /// looking at the avail ring again: a kick consumed after the last look
    /// would be a lost wake-up.
    pub(crate) fn collect_kicks(&self) {
        let state = self.inner.get_ref();
        let Some(kick) = state.get_kick() else { return };
        // The kick fd may be in blocking mode (it is the frontend's), so
        // never read it unpolled.
        let ready = crate::util::fd::readable_within(kick.as_raw_fd(), 0);
        if ready {
            if let Ok(n) = read_eventfd(kick) {
                let own = self.own_kicks.swap(0, Ordering::Relaxed);
                self.kicks
                    .fetch_add(n.saturating_sub(own), Ordering::Relaxed);
            }
        }
    }
}

impl<'a, M: 'a + GuestAddressSpace> VringStateGuard<'a, M> for KickCountingVring<M> {
    type G = <VringRwLock<M> as VringStateGuard<'a, M>>::G;
}

impl<'a, M: 'a + GuestAddressSpace> VringStateMutGuard<'a, M> for KickCountingVring<M> {
    type G = <VringRwLock<M> as VringStateMutGuard<'a, M>>::G;
}

/// Read an eventfd's counter: the number of writes of 1 since the last read.
/// Returns 0 when nothing is pending (non-blocking fd) .
fn read_eventfd(fd: &impl AsRawFd) -> io::Result<u64> {
    let mut buf = [0u8; 8];
    // SAFETY: reading 8 bytes into an 8-byte buffer we own from a
    // descriptor the vring owns.
    let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr() as *mut libc::c_void, 8) };
    if n == 8 {
        return Ok(u64::from_ne_bytes(buf));
    }
    let e = io::Error::last_os_error();
    if n < 0 && e.kind() == io::ErrorKind::WouldBlock {
        return Ok(0);
    }
    if n < 0 {
        return Err(e);
    }
    Err(io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "short eventfd read",
    ))
}

impl<M: 'static + GuestAddressSpace> VringT<M> for KickCountingVring<M> {
    fn new(mem: M, max_queue_size: u16) -> Result<Self, VirtQueError> {
        Ok(KickCountingVring {
            inner: VringRwLock::new(mem, max_queue_size)?,
            kicks: Arc::new(AtomicU64::new(0)),
            refused_size: Arc::new(AtomicU16::new(0)),
            warned_size: Arc::new(AtomicBool::new(false)),
            own_kicks: Arc::new(AtomicU64::new(0)),
        })
    }

    fn get_ref(&self) -> <Self as VringStateGuard<'_, M>>::G {
        self.inner.get_ref()
    }

    fn get_mut(&self) -> <Self as VringStateMutGuard<'_, M>>::G {
        self.inner.get_mut()
    }

    fn add_used(&self, desc_index: u16, len: u32) -> Result<(), VirtQueError> {
        self.inner.add_used(desc_index, len)
    }

    fn signal_used_queue(&self) -> io::Result<()> {
        self.inner.signal_used_queue()
    }

    fn enable_notification(&self) -> Result<bool, VirtQueError> {
        self.inner.enable_notification()
    }

    fn disable_notification(&self) -> Result<(), VirtQueError> {
        self.inner.disable_notification()
    }

    fn needs_notification(&self) -> Result<bool, VirtQueError> {
        self.inner.needs_notification()
    }

    fn set_enabled(&self, enabled: bool) {
        self.inner.set_enabled(enabled)
    }

    fn set_queue_info(
        &self,
        desc_table: u64,
        avail_ring: u64,
        used_ring: u64,
    ) -> Result<(), VirtQueError> {
        if self.refused_size.load(Ordering::Relaxed) != 0 {
            return Err(VirtQueError::InvalidSize);
        }
        self.inner.set_queue_info(desc_table, avail_ring, used_ring)
    }

    fn queue_next_avail(&self) -> u16 {
        self.inner.queue_next_avail()
    }

    fn set_queue_next_avail(&self, base: u16) {
        self.inner.set_queue_next_avail(base)
    }

    fn set_queue_next_used(&self, idx: u16) {
        self.inner.set_queue_next_used(idx)
    }

    fn queue_used_idx(&self) -> Result<u16, VirtQueError> {
        self.inner.queue_used_idx()
    }

    /// A split ring's size is a power of 2 (virtio 1.2 §2.7: its 16-bit
    /// free-running indices are taken modulo the size, which only divides
    /// 2^16 when it is one; Linux's `vring_alloc_queue_split` and DPDK
    /// refuse others). vhost-user-backend checks only the range (1 to the
    /// maximum) and acknowledges the message; a size that is not a power
    /// of 2 is kept from the queue here (virtio-queue would log an error
    /// for every such message and keep the old size), logged once, and the
    /// ring is not started: SET_VRING_ADDR fails and no pass serves it
    /// until the frontend sets a valid size.
    fn set_queue_size(&self, num: u16) {
        if num.is_power_of_two() {
            self.refused_size.store(0, Ordering::Relaxed);
            self.inner.set_queue_size(num);
            return;
        }
        self.refused_size.store(num, Ordering::Relaxed);
        if !self.warned_size.swap(true, Ordering::Relaxed) {
            log::warn!(
                "refusing queue size {num}: a split virtqueue's size is a power of 2 (virtio 1.2 §2.7); the ring is not started until a valid size is set (further refusals not logged)"
            );
        }
    }

    fn set_queue_event_idx(&self, enabled: bool) {
        self.inner.set_queue_event_idx(enabled)
    }

    /// A ring whose size was refused is never made ready.
    fn set_queue_ready(&self, ready: bool) {
        let refused = self.refused_size.load(Ordering::Relaxed) != 0;
        self.inner.set_queue_ready(ready && !refused)
    }

    /// Keep the kick fd as the frontend made it: its file status flags
    /// (O_NONBLOCK among them) belong to the open file description the
    /// frontend shares, so changing them would change the frontend's fd
    /// too. Every read of it is polled first ([`Self::collect_kicks`]).
    ///
    /// A ring that starts is looked at once without waiting for the
    /// guest: the kick fd is written here (and that kick is not counted
    /// as the guest's). Requests a previous back-end left in flight are
    /// then served again at once, though the guest, waiting for them,
    /// may never kick again.
    fn set_kick(&self, file: Option<File>) {
        let start = file.is_some();
        self.inner.set_kick(file);
        if !start {
            return;
        }
        let state = self.inner.get_ref();
        if let Some(kick) = state.get_kick() {
            if crate::util::fd::signal_eventfd(kick.as_raw_fd()).unwrap_or(false) {
                self.own_kicks.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Read the kick counter (instead of discarding it) and report whether
    /// the ring is enabled, as the library expects. The kick fd is the
    /// frontend's and may be in blocking mode (its flags are shared with
    /// the frontend, so they are not changed here), and the frontend may
    /// have read the counter itself since epoll saw it readable: poll it
    /// first, so the worker never blocks in read(2). A read that fails (not
    /// an eventfd, say) only loses the count: it must not end the worker.
    fn read_kick(&self) -> io::Result<bool> {
        self.collect_kicks();
        Ok(self.inner.get_ref().is_enabled())
    }

    /// Set the call fd, and signal it once, as libvhost-user does
    /// (`vu_set_vring_call_exec`): a driver that reconnected must not wait
    /// for an interrupt lost while the backend was away.
    fn set_call(&self, file: Option<File>) {
        let signal = file.is_some();
        self.inner.set_call(file);
        if signal {
            // A call fd that cannot be written only loses this extra signal.
            let _ = self.inner.get_ref().signal_used_queue();
        }
    }

    fn set_err(&self, file: Option<File>) {
        self.inner.set_err(file)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::io::{FromRawFd, IntoRawFd};
    use vm_memory::{GuestAddress, GuestMemoryAtomic, GuestMemoryMmap};
    use vmm_sys_util::eventfd::EventFd;

    #[test]
    fn counts_every_kick() {
        let mem = GuestMemoryAtomic::new(
            GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap(),
        );
        let v = KickCountingVring::new(mem, 16).unwrap();
        let efd = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let dup = efd.try_clone().unwrap();
        // SAFETY: the fd is a fresh duplicate we hand over to the File.
        let file = unsafe { File::from_raw_fd(dup.into_raw_fd()) };
        v.set_kick(Some(file));
        v.set_enabled(true);
        for _ in 0..3 {
            efd.write(1).unwrap();
        }
        assert!(v.read_kick().unwrap());
        assert_eq!(v.take_kicks(), 3, "three kicks before one wake-up");
        assert_eq!(v.take_kicks(), 0);
        // Nothing pending: no error, no kicks.
        v.read_kick().unwrap();
        assert_eq!(v.take_kicks(), 0);
        efd.write(1).unwrap();
        v.read_kick().unwrap();
        efd.write(1).unwrap();
        v.read_kick().unwrap();
        assert_eq!(v.take_kicks(), 2);
    }

    /// A frontend's kick fd in blocking mode with nothing pending (the
    /// frontend read it after epoll saw it readable): `read_kick` returns.
    #[test]
    fn read_kick_never_blocks() {
        let mem = GuestMemoryAtomic::new(
            GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap(),
        );
        let v = KickCountingVring::new(mem, 16).unwrap();
        let efd = EventFd::new(0).unwrap();
        let dup = efd.try_clone().unwrap();
        // SAFETY: the fd is a fresh duplicate we hand over to the File.
        let file = unsafe { File::from_raw_fd(dup.into_raw_fd()) };
        v.set_kick(Some(file));
        v.set_enabled(true);
        let (tx, rx) = std::sync::mpsc::channel();
        let v2 = v.clone();
        std::thread::spawn(move || {
            let _ = tx.send(v2.read_kick().map_err(|e| e.to_string()));
        });
        let got = rx.recv_timeout(std::time::Duration::from_secs(30));
        assert_eq!(got, Ok(Ok(true)), "read_kick blocked on an empty kick fd");
        assert_eq!(v.take_kicks(), 0);
        efd.write(1).unwrap();
        v.read_kick().unwrap();
        assert_eq!(v.take_kicks(), 1);
    }
}
