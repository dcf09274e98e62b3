//! A process's CPU time in nanoseconds: the sum over its threads of the
//! first field of `/proc/PID/task/TID/schedstat` (time on a CPU, ns).
//! Unlike `/proc/PID/stat`'s clock ticks (10 ms), it can tell an idle
//! daemon's 0.1 % of a CPU from nothing within a few seconds. Threads
//! that have exited are not counted: use it over spans in which the
//! process starts and ends no threads.

/// CPU time of every live thread of process `pid` so far, ns; `None` when
/// the process is gone or the kernel keeps no schedstat.
pub(crate) fn process_cpu_ns(pid: i32) -> Option<u64> {
    let mut total = 0u64;
    for e in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        // A thread that exited meanwhile is skipped.
        if let Some(ns) = task_cpu_ns(&e.ok()?.path()) {
            total += ns;
        }
    }
    Some(total)
}

/// One thread's CPU time so far, ns, from its `/proc/PID/task/TID`
/// directory; `None` when it is gone.
fn task_cpu_ns(task: &std::path::Path) -> Option<u64> {
    let text = std::fs::read_to_string(task.join("schedstat")).ok()?;
    text.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_thread_is_counted_in_nanoseconds() {
        let pid = std::process::id() as i32;
        // This thread's own time: other tests' threads come and go, and
        // the process's sum drops when one exits.
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        let task = std::path::PathBuf::from(format!("/proc/{pid}/task/{tid}"));
        let before = task_cpu_ns(&task).unwrap();
        let start = std::time::Instant::now();
        while start.elapsed() < std::time::Duration::from_millis(30) {
            std::hint::spin_loop();
        }
        let spent = task_cpu_ns(&task).unwrap() - before;
        assert!(process_cpu_ns(pid).unwrap() >= spent);
        // At least most of the 30 ms spun (the machine may be busy), and
        // not a whole clock tick's rounding.
        assert!(spent >= 5_000_000, "{spent} ns");
        assert_ne!(spent % 10_000_000, 0, "{spent} ns looks like clock ticks");
        assert_eq!(process_cpu_ns(-1), None);
    }
}
