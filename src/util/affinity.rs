//! CPU affinity with sched_setaffinity(2): pin a whole process (each of
//! its threads, and so every thread they start later) or the calling
//! thread to a set of CPUs, and let a process run anywhere again; and how
//! many CPUs the calling thread may run on (sched_getaffinity(2)).

use std::io;

/// The CPUs this machine has online.
pub(crate) fn cpu_count() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// How many CPUs the calling thread may run on (sched_getaffinity(2)):
/// what a process it starts inherits.
pub(crate) fn usable_count() -> io::Result<usize> {
    // SAFETY: an all-zero cpu_set_t is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: CPU_COUNT reads `set`, a valid cpu_set_t.
    let n = unsafe { libc::CPU_COUNT(&set) };
    Ok(usize::try_from(n).unwrap_or(0))
}

/// Restrict thread `tid` (0: the calling thread) to `cpus`.
fn set(tid: i32, cpus: &[usize]) -> io::Result<()> {
    // SAFETY: an all-zero cpu_set_t is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus {
        // SAFETY: CPU_SET writes one bit of `set`, checking `c` against
        // the set's size itself.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    let rc = unsafe { libc::sched_setaffinity(tid, std::mem::size_of_val(&set), &set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Restrict the calling thread to `cpus`.
pub(crate) fn pin_current_thread(cpus: &[usize]) -> io::Result<()> {
    set(0, cpus)
}

/// Restrict every thread of process `pid` to `cpus` (a thread that exits
/// meanwhile is skipped).
pub(crate) fn pin_process(pid: i32, cpus: &[usize]) -> io::Result<()> {
    for e in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let Some(tid) = e?.file_name().to_str().and_then(|t| t.parse().ok()) else {
            continue;
        };
        match set(tid, cpus) {
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
            other => other?,
        }
    }
    Ok(())
}

/// Let every thread of process `pid` run on any CPU again.
pub(crate) fn unpin_process(pid: i32) -> io::Result<()> {
    let all: Vec<usize> = (0..cpu_count()).collect();
    pin_process(pid, &all)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CPUs the calling thread may run on.
    fn allowed() -> Vec<usize> {
        // SAFETY: an all-zero cpu_set_t is the empty set.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is a valid cpu_set_t of the size passed.
        let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
        assert_eq!(rc, 0);
        // SAFETY: CPU_ISSET reads one bit of `set`.
        (0..cpu_count())
            .filter(|c| unsafe { libc::CPU_ISSET(*c, &set) })
            .collect()
    }

    #[test]
    fn a_thread_is_pinned_and_a_process_unpinned() {
        std::thread::spawn(|| {
            pin_current_thread(&[0]).unwrap();
            assert_eq!(allowed(), vec![0]);
            assert_eq!(usable_count().unwrap(), 1);
            // A thread started by a pinned thread inherits its CPUs.
            let inherited = std::thread::spawn(allowed).join().unwrap();
            assert_eq!(inherited, vec![0]);
        })
        .join()
        .unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        pin_process(pid, &[0]).unwrap();
        let mask = || {
            std::fs::read_to_string(format!("/proc/{pid}/status"))
                .unwrap()
                .lines()
                .find(|l| l.starts_with("Cpus_allowed_list:"))
                .unwrap()
                .split_whitespace()
                .nth(1)
                .unwrap()
                .to_string()
        };
        assert_eq!(mask(), "0");
        unpin_process(pid).unwrap();
        let all = if cpu_count() == 1 {
            "0".to_string()
        } else {
            format!("0-{}", cpu_count() - 1)
        };
        assert_eq!(mask(), all);
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(pin_process(pid, &[0]).is_err(), "a process that is gone");
    }
}
