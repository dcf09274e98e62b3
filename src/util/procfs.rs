//! The one reader of `/proc/PID/stat` and `/proc/PID/task/TID/stat` lines
//! (stat(5)): a process's or a thread's name and CPU time, in clock ticks
//! and in seconds.
//!
//! The line is `PID (COMM) STATE PPID …`, and COMM is whatever the thread
//! set with `prctl(PR_SET_NAME)` or `pthread_setname_np`: up to 15 bytes
//! that may hold spaces and parentheses (`CPU 0/TCG`, `a) R (b`). The
//! kernel writes no parenthesis after COMM's closing one, so the fields are
//! read after the last `)` on the line and COMM is everything between the
//! first `(` and that `)`.

use std::path::Path;

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`, USER_HZ): the unit of
/// `utime` and `stime`. 100 if sysconf does not say.
pub(crate) fn clk_tck() -> f64 {
    // SAFETY: sysconf has no memory effects.
    let v = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if v > 0 {
        v as f64
    } else {
        100.0
    }
}

/// What blklab reads of one `stat` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stat {
    /// The process or thread name (`comm`, field 2), without parentheses.
    pub comm: String,
    /// User CPU time in clock ticks (field 14).
    pub utime: u64,
    /// System CPU time in clock ticks (field 15).
    pub stime: u64,
}

impl Stat {
    /// Parse one `stat` line; `None` if it is not one.
    pub(crate) fn parse(text: &str) -> Option<Stat> {
        let open = text.find('(')?;
        let close = text.rfind(')')?;
        let comm = text.get(open + 1..close)?.to_string();
        // fields[0] is field 3 (state); utime and stime are fields 14, 15.
        let fields: Vec<&str> = text.get(close + 1..)?.split_ascii_whitespace().collect();
        Some(Stat {
            comm,
            utime: fields.get(11)?.parse().ok()?,
            stime: fields.get(12)?.parse().ok()?,
        })
    }

    /// Read and parse the `stat` file at `path`; `None` if it is gone
    /// (the thread or process exited) or unreadable.
    pub(crate) fn read(path: &Path) -> Option<Stat> {
        Stat::parse(&std::fs::read_to_string(path).ok()?)
    }

    /// User CPU seconds.
    pub(crate) fn user_s(&self) -> f64 {
        self.utime as f64 / clk_tck()
    }

    /// System CPU seconds.
    pub(crate) fn sys_s(&self) -> f64 {
        self.stime as f64 / clk_tck()
    }

    /// User + system CPU seconds.
    pub(crate) fn cpu_s(&self) -> f64 {
        (self.utime + self.stime) as f64 / clk_tck()
    }
}

/// `/proc/PID/stat`: the whole process (every thread, exited ones
/// included).
pub(crate) fn process(pid: i32) -> Option<Stat> {
    Stat::read(Path::new(&format!("/proc/{pid}/stat")))
}

/// `/proc/PID/task/TID/stat`: one thread of process `pid`; `None` for the
/// process reading it (`/proc/self/…`).
pub(crate) fn thread(pid: Option<i32>, tid: i32) -> Option<Stat> {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/task/{tid}/stat"),
        None => format!("/proc/self/task/{tid}/stat"),
    };
    Stat::read(Path::new(&path))
}

/// Every thread of process `pid` as (tid, stat), by tid. Threads that exit
/// while they are read are left out; `None` when the process is gone.
pub(crate) fn threads(pid: i32) -> Option<Vec<(i32, Stat)>> {
    let dir = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut out: Vec<(i32, Stat)> = dir
        .flatten()
        .filter_map(|e| {
            let tid = e.file_name().to_str()?.parse::<i32>().ok()?;
            Some((tid, Stat::read(&e.path().join("stat"))?))
        })
        .collect();
    out.sort_by_key(|(tid, _)| *tid);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stat line with `comm` and utime 250, stime 31 (fields 14, 15).
    fn line(comm: &str) -> String {
        format!("1234 ({comm}) S 1 2 3 4 5 6 7 8 9 10 250 31 0 0 20 0 9 0 100 0 0\n")
    }

    fn parsed(comm: &str) -> Stat {
        Stat::parse(&line(comm)).unwrap_or_else(|| panic!("{comm:?} does not parse"))
    }

    #[test]
    fn names_with_spaces_and_parentheses() {
        for comm in [
            "blklab",
            "CPU 0/TCG",
            "ALL CPUs/TCG",
            "a) b",
            "(",
            ")",
            ") S 1 2 3 4 5 6 7 8 9 10 11 12",
            "x (y) z",
            "(sd-pam)",
            "",
            " ",
        ] {
            let s = parsed(comm);
            assert_eq!((s.comm.as_str(), s.utime, s.stime), (comm, 250, 31));
        }
    }

    #[test]
    fn rejects_what_is_not_a_stat_line() {
        assert_eq!(Stat::parse(""), None);
        assert_eq!(Stat::parse("garbage"), None);
        assert_eq!(Stat::parse("1 (x)"), None);
        assert_eq!(Stat::parse("1 (x) S 1 2 3 4 5 6 7 8 9 10 11"), None);
        assert_eq!(Stat::parse("1 (x) S 1 2 3 4 5 6 7 8 9 10 -1 12"), None);
        assert_eq!(Stat::parse(") 1 (x S 1 2 3 4 5 6 7 8 9 10 11 12"), None);
        // No space after the ')' is still the fields.
        let s = Stat::parse("7 (a)S 1 2 3 4 5 6 7 8 9 10 11 12").unwrap();
        assert_eq!((s.utime, s.stime), (11, 12));
    }

    #[test]
    fn seconds_are_ticks_over_clk_tck() {
        let s = parsed("x");
        let hz = clk_tck();
        assert!(hz > 0.0);
        assert_eq!(s.user_s(), 250.0 / hz);
        assert_eq!(s.sys_s(), 31.0 / hz);
        assert_eq!(s.cpu_s(), 281.0 / hz);
    }

    #[test]
    fn reads_this_process_and_its_threads() {
        let me = std::process::id() as i32;
        // SAFETY: gettid has no memory effects.
        let tid = unsafe { libc::gettid() };
        assert!(process(me).is_some());
        let mine = thread(None, tid).expect("our own thread's stat");
        assert_eq!(thread(Some(me), tid).map(|s| s.comm), Some(mine.comm));
        let all = threads(me).expect("our own tasks");
        assert!(all.iter().any(|(t, _)| *t == tid), "{all:?}");
        assert!(all.windows(2).all(|w| w[0].0 < w[1].0));
        assert_eq!(process(-1), None);
        assert_eq!(threads(-1), None);
    }
}
