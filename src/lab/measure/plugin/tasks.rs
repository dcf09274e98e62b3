//! The plugin's counts by the machine's task that ran them (format 6's
//! `tasks` and `task` records; the plugin's header comment, "Tasks", says
//! how they are kept): per task, its instructions at each level and those
//! spent in KVM's halt function.

use std::collections::BTreeMap;

/// A task: its task_struct's address and its pid (-1 when the plugin did
/// not know where the pid lies). Address 0 is what a vCPU ran before its
/// first switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TaskKey {
    pub ptr: u64,
    pub pid: i64,
}

/// One task's counts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskCount {
    /// Its thread group (its process's pid); -1 unknown.
    pub tgid: i64,
    /// Its name (`comm`) when it last ran; empty when unknown.
    pub comm: String,
    pub kernel: u64,
    pub user: u64,
    pub l2kernel: u64,
    pub l2user: u64,
    /// Level-1 instructions in KVM's halt function (part of `kernel` and
    /// `user`).
    pub halt: u64,
    /// Times it was switched in.
    pub switches: u64,
}

/// A dump's tasks: the addresses the plugin hooked and each task's counts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tasks {
    /// The machine kernel's `__switch_to`.
    pub switch: u64,
    /// KVM's halt function (0: not set, no halt counted).
    pub halt: u64,
    /// Whether tasks were named (the plugin knew their fields' offsets).
    pub named: bool,
    pub by_task: BTreeMap<TaskKey, TaskCount>,
}

impl Tasks {
    /// The `tasks` record after its tag: `off` (None) or `switch ADDR halt
    /// ADDR names yes|no`.
    pub(crate) fn parse_header(words: &[&str]) -> Result<Option<Tasks>, &'static str> {
        const WANT: &str = "want 'tasks off' or 'tasks switch ADDR halt ADDR names yes|no'";
        match words {
            ["off"] => Ok(None),
            ["switch", s, "halt", h, "names", n] => Ok(Some(Tasks {
                switch: hex(s).ok_or(WANT)?,
                halt: hex(h).ok_or(WANT)?,
                named: match *n {
                    "yes" => true,
                    "no" => false,
                    _ => return Err(WANT),
                },
                by_task: BTreeMap::new(),
            })),
            _ => Err(WANT),
        }
    }

    /// A `task PTR PID TGID kernel K user U l2kernel K2 l2user U2 halt H
    /// switches S comm NAME` record after its tag (`rest`: the line after
    /// `task `; NAME is the rest of the line, maybe empty).
    pub(crate) fn parse_task(&mut self, rest: &str) -> Result<(), &'static str> {
        const WANT: &str = "want 'task PTR PID TGID kernel K user U l2kernel K2 l2user U2 halt H switches S comm NAME'";
        let (fields, comm) = match rest.split_once(" comm") {
            Some((f, c)) => (f, c.strip_prefix(' ').unwrap_or(c)),
            None => return Err(WANT),
        };
        let w: Vec<&str> = fields.split_ascii_whitespace().collect();
        let [ptr, pid, tgid, "kernel", k, "user", u, "l2kernel", k2, "l2user", u2, "halt", h, "switches", s] =
            w[..]
        else {
            return Err(WANT);
        };
        let n = |x: &str| x.parse::<u64>().map_err(|_| WANT);
        let signed = |x: &str| x.parse::<i64>().map_err(|_| WANT);
        let key = TaskKey {
            ptr: hex(ptr).ok_or(WANT)?,
            pid: signed(pid)?,
        };
        let count = TaskCount {
            tgid: signed(tgid)?,
            comm: comm.to_string(),
            kernel: n(k)?,
            user: n(u)?,
            l2kernel: n(k2)?,
            l2user: n(u2)?,
            halt: n(h)?,
            switches: n(s)?,
        };
        if self.by_task.insert(key, count).is_some() {
            return Err("a task twice");
        }
        Ok(())
    }

    /// `self − earlier`, task by task (counters only grow; a task missing
    /// earlier is new); tasks with nothing in between are left out.
    pub(crate) fn since(&self, earlier: &Tasks) -> Tasks {
        let by_task = self
            .by_task
            .iter()
            .filter_map(|(key, c)| {
                let c0 = earlier.by_task.get(key).cloned().unwrap_or_default();
                let d = TaskCount {
                    tgid: c.tgid,
                    comm: c.comm.clone(),
                    kernel: c.kernel.saturating_sub(c0.kernel),
                    user: c.user.saturating_sub(c0.user),
                    l2kernel: c.l2kernel.saturating_sub(c0.l2kernel),
                    l2user: c.l2user.saturating_sub(c0.l2user),
                    halt: c.halt.saturating_sub(c0.halt),
                    switches: c.switches.saturating_sub(c0.switches),
                };
                (d.kernel + d.user + d.l2kernel + d.l2user > 0).then_some((*key, d))
            })
            .collect();
        Tasks {
            by_task,
            ..self.clone()
        }
    }

    /// Level-1 instructions of every task (what the vCPUs' level-1 counts
    /// add up to, but for what ran while the dump was written).
    pub fn level1(&self) -> u64 {
        self.by_task.values().map(|c| c.kernel + c.user).sum()
    }
}

fn hex(s: &str) -> Option<u64> {
    u64::from_str_radix(s, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tasks(lines: &[&str]) -> Tasks {
        let mut t =
            Tasks::parse_header(&["switch", "ffffffff81002000", "halt", "0", "names", "yes"])
                .unwrap()
                .unwrap();
        for l in lines {
            t.parse_task(l).unwrap();
        }
        t
    }

    #[test]
    fn a_task_record_keeps_its_name_with_spaces_or_none() {
        let t = tasks(&[
            "ffff888003a0c000 312 300 kernel 10 user 5 l2kernel 7 l2user 1 halt 4 switches 3 comm CPU 0/KVM",
            "0 -1 -1 kernel 2 user 0 l2kernel 0 l2user 0 halt 0 switches 0 comm ",
        ]);
        let k = TaskKey {
            ptr: 0xffff888003a0c000,
            pid: 312,
        };
        let c = &t.by_task[&k];
        assert_eq!((c.tgid, c.comm.as_str()), (300, "CPU 0/KVM"));
        assert_eq!((c.kernel, c.user, c.l2kernel, c.l2user), (10, 5, 7, 1));
        assert_eq!((c.halt, c.switches), (4, 3));
        assert_eq!(t.by_task[&TaskKey { ptr: 0, pid: -1 }].comm, "");
        assert_eq!(t.level1(), 17);
    }

    #[test]
    fn malformed_task_records_are_refused() {
        let mut t = tasks(&[]);
        for bad in [
            "ffff 1 1 kernel 1 user 1 l2kernel 1 l2user 1 halt 1 switches 1",
            "zz 1 1 kernel 1 user 1 l2kernel 1 l2user 1 halt 1 switches 1 comm a",
            "ffff 1 1 kernel -1 user 1 l2kernel 1 l2user 1 halt 1 switches 1 comm a",
            "ffff 1 1 user 1 kernel 1 l2kernel 1 l2user 1 halt 1 switches 1 comm a",
        ] {
            assert!(t.parse_task(bad).is_err(), "{bad}");
        }
        t.parse_task("ffff 1 1 kernel 1 user 1 l2kernel 1 l2user 1 halt 0 switches 1 comm a")
            .unwrap();
        assert!(t
            .parse_task("ffff 1 1 kernel 1 user 1 l2kernel 1 l2user 1 halt 0 switches 1 comm a")
            .is_err());
        assert!(Tasks::parse_header(&["switch", "x"]).is_err());
        assert_eq!(Tasks::parse_header(&["off"]), Ok(None));
    }

    #[test]
    fn a_window_is_each_tasks_difference_and_leaves_idle_tasks_out() {
        let first = tasks(&[
            "a 1 1 kernel 10 user 5 l2kernel 0 l2user 0 halt 2 switches 1 comm x",
            "b 2 2 kernel 3 user 0 l2kernel 0 l2user 0 halt 0 switches 1 comm y",
        ]);
        let last = tasks(&[
            "a 1 1 kernel 15 user 9 l2kernel 0 l2user 0 halt 3 switches 4 comm x2",
            "b 2 2 kernel 3 user 0 l2kernel 0 l2user 0 halt 0 switches 1 comm y",
            "c 3 1 kernel 1 user 0 l2kernel 0 l2user 0 halt 0 switches 1 comm z",
        ]);
        let w = last.since(&first);
        assert_eq!(w.by_task.len(), 2);
        let a = &w.by_task[&TaskKey { ptr: 0xa, pid: 1 }];
        assert_eq!((a.kernel, a.user, a.halt, a.switches), (5, 4, 1, 3));
        assert_eq!(a.comm, "x2");
        assert_eq!(w.by_task[&TaskKey { ptr: 0xc, pid: 3 }].kernel, 1);
        assert_eq!(w.level1(), 10);
    }
}
