//! Host-side CPU time per thread of a process, from `/proc/PID/task`
//! (read by [`crate::util::procfs`]).
//!
//! The lab samples the QEMU process (vCPU threads are named `CPU n/KVM` or
//! `CPU n/TCG` with `-name …,debug-threads=on`; everything else is device
//! emulation, the main loop and vhost-user plumbing) and its own process
//! (the in-process backend's queue workers) around each scenario.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::util::procfs;

/// Cumulative CPU ticks of one thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ThreadSample {
    pub tid: i32,
    pub name: String,
    pub utime: u64,
    pub stime: u64,
}

/// Every thread of a process at one moment.
#[derive(Debug, Clone)]
pub(crate) struct ProcessSample {
    pub pid: i32,
    pub at: std::time::Instant,
    pub threads: Vec<ThreadSample>,
}

/// Sample every thread of `pid`. Threads that exit while we read are skipped;
/// `None` when the process itself is gone.
pub(crate) fn sample(pid: i32) -> Option<ProcessSample> {
    let at = std::time::Instant::now();
    let threads = procfs::threads(pid)?
        .into_iter()
        .map(|(tid, st)| ThreadSample {
            tid,
            name: st.comm,
            utime: st.utime,
            stime: st.stime,
        })
        .collect();
    Some(ProcessSample { pid, at, threads })
}

/// CPU seconds of one group of threads over an interval.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema, PartialEq)]
#[serde(default)]
pub(crate) struct CpuSeconds {
    pub user_s: f64,
    pub sys_s: f64,
    pub total_s: f64,
    /// total_s / wall seconds × 100: percent of one host CPU.
    pub percent_of_one_cpu: f64,
}

/// One thread's CPU over an interval.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema, PartialEq)]
pub(crate) struct ThreadCpuDelta {
    pub tid: i32,
    pub name: String,
    pub user_s: f64,
    pub sys_s: f64,
}

/// A process's CPU over an interval, grouped. (Every field reads as its
/// default when absent: trimmed recordings keep only `groups`.)
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema, PartialEq)]
#[serde(default)]
pub(crate) struct ProcessCpu {
    pub pid: i32,
    pub wall_s: f64,
    pub total: CpuSeconds,
    /// Groups by role (see [`classify`]).
    pub groups: BTreeMap<String, CpuSeconds>,
    /// Every thread that ran.
    pub threads: Vec<ThreadCpuDelta>,
}

/// The group a thread belongs to, by its name, for `role` = "qemu" or
/// "backend".
pub(crate) fn classify(role: &str, name: &str) -> String {
    match role {
        "qemu" => {
            // Single-threaded TCG (--deterministic) runs every vCPU in one
            // thread, "ALL CPUs/TCG".
            if (name.starts_with("CPU ") || name.starts_with("ALL CPUs")) && name.contains('/') {
                "vcpu".into()
            } else {
                "other".into()
            }
        }
        _ => {
            // vhost-user-backend names its queue threads "vring_worker";
            // the server names each disk's accept thread "blklab-N" and
            // each connection's protocol thread "blklab-conn-N" (comm is
            // cut to 15 bytes). Everything else is the lab's own bookkeeping.
            if name == "vring_worker" {
                "backend-queues".into()
            } else if name.starts_with("blklab-conn-")
                || name.starts_with("blklab-")
                    && name[7..].starts_with(|c: char| c.is_ascii_digit())
            {
                "backend-protocol".into()
            } else {
                "lab".into()
            }
        }
    }
}

/// The CPU each thread used between `a` and `b` (threads in `b`; a thread
/// born in between counts from zero).
pub(crate) fn delta(role: &str, a: &ProcessSample, b: &ProcessSample) -> ProcessCpu {
    let hz = procfs::clk_tck();
    let wall_s = b.at.duration_since(a.at).as_secs_f64();
    let before: BTreeMap<i32, &ThreadSample> = a.threads.iter().map(|t| (t.tid, t)).collect();
    let mut groups: BTreeMap<String, CpuSeconds> = BTreeMap::new();
    let mut total = CpuSeconds::default();
    let mut threads = Vec::new();
    for t in &b.threads {
        let (u0, s0) = before
            .get(&t.tid)
            .map(|p| (p.utime, p.stime))
            .unwrap_or((0, 0));
        let user_s = t.utime.saturating_sub(u0) as f64 / hz;
        let sys_s = t.stime.saturating_sub(s0) as f64 / hz;
        let g = groups.entry(classify(role, &t.name)).or_default();
        for c in [&mut *g, &mut total] {
            c.user_s += user_s;
            c.sys_s += sys_s;
            c.total_s += user_s + sys_s;
        }
        if user_s + sys_s > 0.0 {
            threads.push(ThreadCpuDelta {
                tid: t.tid,
                name: t.name.clone(),
                user_s,
                sys_s,
            });
        }
    }
    let pct = |c: &mut CpuSeconds| {
        c.percent_of_one_cpu = if wall_s > 0.0 {
            c.total_s / wall_s * 100.0
        } else {
            0.0
        };
    };
    pct(&mut total);
    groups.values_mut().for_each(pct);
    ProcessCpu {
        pid: b.pid,
        wall_s,
        total,
        groups,
        threads,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_qemu_threads() {
        assert_eq!(classify("qemu", "CPU 1/KVM"), "vcpu");
        assert_eq!(classify("qemu", "CPU 0/TCG"), "vcpu");
        assert_eq!(classify("qemu", "ALL CPUs/TCG"), "vcpu");
        assert_eq!(classify("qemu", "qemu-system-x86"), "other");
        assert_eq!(classify("qemu", "worker"), "other");
    }

    #[test]
    fn measures_a_busy_thread() {
        // The spinner burns 0.2 s of its own CPU time (however long that
        // takes on a loaded machine), then waits, alive, for the sample.
        fn own_cpu_s() -> f64 {
            let mut ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: ts is a valid timespec for the call to fill.
            unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
            ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
        }
        let me = std::process::id() as i32;
        let a = sample(me).unwrap();
        let (busy_tx, busy_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::Builder::new()
            .name("spinner".into())
            .spawn(move || {
                let mut x = 0u64;
                while own_cpu_s() < 0.2 {
                    x = x.wrapping_add(std::hint::black_box(1));
                }
                busy_tx.send(()).unwrap();
                let _ = done_rx.recv();
                x
            })
            .unwrap();
        busy_rx.recv().unwrap();
        let b = sample(me).unwrap();
        done_tx.send(()).unwrap();
        t.join().unwrap();
        let d = delta("backend", &a, &b);
        let spin: f64 = d
            .threads
            .iter()
            .filter(|t| t.name == "spinner")
            .map(|t| t.user_s + t.sys_s)
            .sum();
        // /proc counts in clock ticks (10 ms): 0.2 s is at least 0.15 s.
        assert!(spin >= 0.15, "spinner used {spin} s: {d:?}");
        assert!(d.total.total_s >= spin);
        assert!(d.wall_s > 0.0);
    }
}
