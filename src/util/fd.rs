//! One `poll(2)` helper for every wait on a file descriptor, an eventfd
//! signal that never blocks, and the seal that keeps a shared file from
//! shrinking under a mapping of it.

use std::io;
use std::os::fd::{AsRawFd, RawFd};

/// What [`poll_readable`] saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ready {
    /// `fds[i]` is readable (the first such, in order).
    Readable(usize),
    /// The timeout passed with nothing readable.
    Timeout,
}

/// Wait up to `timeout_ms` (-1: for ever, 0: not at all) until one of `fds`
/// is readable; interrupted waits are resumed. An fd that reports an error
/// or hang-up without data is an error naming its events.
pub(crate) fn poll_readable(fds: &[RawFd], timeout_ms: i32) -> io::Result<Ready> {
    let mut p: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    loop {
        // SAFETY: `p` is a valid, exclusively borrowed array of `p.len()`
        // pollfd for the duration of the call.
        let rc = unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, timeout_ms) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if rc == 0 {
            return Ok(Ready::Timeout);
        }
        if let Some(i) = p.iter().position(|x| x.revents & libc::POLLIN != 0) {
            return Ok(Ready::Readable(i));
        }
        if let Some(x) = p.iter().find(|x| x.revents != 0) {
            return Err(io::Error::other(format!(
                "fd {} poll events {:#x}",
                x.fd, x.revents
            )));
        }
    }
}

/// Whether `fd` becomes readable within `timeout_ms` (errors count as not).
pub(crate) fn readable_within(fd: RawFd, timeout_ms: i32) -> bool {
    matches!(poll_readable(&[fd], timeout_ms), Ok(Ready::Readable(_)))
}

/// Add 1 to an eventfd's counter (or write 8 bytes to a pipe) without
/// ever blocking and without changing the descriptor's flags, which it
/// may share with another process: polled for room first. `Ok(false)`:
/// no room (an eventfd at its maximum count already signals; a full pipe
/// is unread), nothing written.
pub(crate) fn signal_eventfd(fd: RawFd) -> io::Result<bool> {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one valid pollfd, exclusively borrowed for the call.
    let rc = unsafe { libc::poll(&mut p, 1, 0) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    if p.revents & libc::POLLOUT == 0 {
        return Ok(false);
    }
    let one = 1u64.to_ne_bytes();
    // SAFETY: writing 8 bytes from an 8-byte buffer we own.
    let n = unsafe { libc::write(fd, one.as_ptr().cast(), one.len()) };
    if n == 8 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    match e.kind() {
        io::ErrorKind::WouldBlock => Ok(false),
        _ if n >= 0 => Err(io::Error::new(
            io::ErrorKind::WriteZero,
            "short eventfd write",
        )),
        _ => Err(e),
    }
}

/// Wait until `listen_fd` has a connection (true) or `wake_fd` is
/// readable (false: time to stop). A queued Unix connection makes accept()
/// return at once, so the accept that follows never blocks.
pub(crate) fn listener_or_wake(listen_fd: RawFd, wake_fd: RawFd) -> io::Result<bool> {
    loop {
        match poll_readable(&[wake_fd, listen_fd], -1)? {
            Ready::Readable(0) => return Ok(false),
            Ready::Readable(_) => return Ok(true),
            Ready::Timeout => continue,
        }
    }
}

/// Add F_SEAL_SHRINK to `f` when it takes seals; true when it has it.
pub(crate) fn seal_against_shrinking(f: &std::fs::File) -> bool {
    let fd = f.as_raw_fd();
    // SAFETY: fcntl on a descriptor `f` owns, reading its seals;
    // no memory is passed.
    let seals = unsafe { libc::fcntl(fd, libc::F_GET_SEALS) };
    if seals < 0 {
        return false; // not a memfd (or shmem file) that takes seals
    }
    if seals & libc::F_SEAL_SHRINK != 0 {
        return true;
    }
    // SAFETY: as above, adding a seal; fails harmlessly (EPERM) when the
    // file is sealed against further sealing.
    unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmm_sys_util::eventfd::EventFd;

    /// A blocking eventfd at its maximum count (a frontend can put it
    /// there): the signal returns at once and leaves its flags alone.
    #[test]
    fn an_eventfd_signal_never_blocks() {
        let e = EventFd::new(0).unwrap();
        assert!(signal_eventfd(e.as_raw_fd()).unwrap());
        assert_eq!(e.read().unwrap(), 1);
        e.write(u64::MAX - 1).unwrap();
        assert!(!signal_eventfd(e.as_raw_fd()).unwrap());
        // SAFETY: fcntl reading the flags of a descriptor `e` owns.
        let flags = unsafe { libc::fcntl(e.as_raw_fd(), libc::F_GETFL) };
        assert_eq!(flags & libc::O_NONBLOCK, 0);
        assert_eq!(e.read().unwrap(), u64::MAX - 1);
    }

    #[test]
    fn readable_timeout_and_order() {
        let a = EventFd::new(0).unwrap();
        let b = EventFd::new(0).unwrap();
        assert_eq!(
            poll_readable(&[a.as_raw_fd(), b.as_raw_fd()], 0).unwrap(),
            Ready::Timeout
        );
        assert!(!readable_within(a.as_raw_fd(), 0));
        b.write(1).unwrap();
        assert_eq!(
            poll_readable(&[a.as_raw_fd(), b.as_raw_fd()], -1).unwrap(),
            Ready::Readable(1)
        );
        a.write(1).unwrap();
        assert_eq!(
            poll_readable(&[a.as_raw_fd(), b.as_raw_fd()], -1).unwrap(),
            Ready::Readable(0)
        );
        assert!(readable_within(a.as_raw_fd(), 0));
    }
}
