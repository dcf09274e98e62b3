//! The guest's console protocol (docs/lab-protocol.md): marker lines the
//! initramfs `/init` and `guest-scripts/run.sh` print, as events.

/// Which side of a variant a SYNC line marks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    Begin,
    End,
}

/// One meaningful console line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Event {
    /// `/init` started: `BLKLAB-INIT kernel=… uptime=…`.
    Init { kernel: String },
    /// `BLKLAB-SYNC n begin|end SCENARIO VARIANT`: answer `n`.
    Sync {
        n: u64,
        phase: Phase,
        scenario: String,
        variant: String,
    },
    /// `BLKLAB-RESULT-BEGIN SCENARIO VARIANT`
    ResultBegin { scenario: String, variant: String },
    /// `BLKLAB-RESULT-END SCENARIO VARIANT`
    ResultEnd { scenario: String, variant: String },
    /// `BLKLAB-ERROR message`
    Error(String),
    /// `BLKLAB-MODULE-FAIL name`
    ModuleFail(String),
    /// `BLKLAB-END NAME rc=N`: the guest script finished.
    End { rc: i32 },
}

/// Parse one console line (carriage returns and surrounding blanks are
/// ignored). `None` for ordinary output.
pub(crate) fn parse_line(line: &str) -> Option<Event> {
    let line = line.trim_matches(|c: char| c == '\r' || c.is_whitespace());
    let mut w = line.split_whitespace();
    let tag = w.next()?;
    let rest: Vec<&str> = w.collect();
    let two = |rest: &[&str]| -> Option<(String, String)> {
        match rest {
            [s, v] => Some((s.to_string(), v.to_string())),
            _ => None,
        }
    };
    match tag {
        "BLKLAB-INIT" => Some(Event::Init {
            kernel: rest
                .iter()
                .find_map(|kv| kv.strip_prefix("kernel="))
                .unwrap_or("")
                .to_string(),
        }),
        "BLKLAB-SYNC" => match rest.as_slice() {
            [n, phase, s, v] => Some(Event::Sync {
                n: n.parse().ok()?,
                phase: match *phase {
                    "begin" => Phase::Begin,
                    "end" => Phase::End,
                    _ => return None,
                },
                scenario: s.to_string(),
                variant: v.to_string(),
            }),
            _ => None,
        },
        "BLKLAB-RESULT-BEGIN" => {
            two(&rest).map(|(scenario, variant)| Event::ResultBegin { scenario, variant })
        }
        "BLKLAB-RESULT-END" => {
            two(&rest).map(|(scenario, variant)| Event::ResultEnd { scenario, variant })
        }
        "BLKLAB-ERROR" => Some(Event::Error(rest.join(" "))),
        "BLKLAB-MODULE-FAIL" => Some(Event::ModuleFail(rest.join(" "))),
        "BLKLAB-END" => rest
            .iter()
            .find_map(|kv| kv.strip_prefix("rc="))
            .and_then(|rc| rc.parse().ok())
            .map(|rc| Event::End { rc }),
        _ => None,
    }
}

/// The lines that start a guest kernel fault report (after the
/// `[  12.345678]` timestamp): an oops, a BUG, a WARN splat, a panic, or
/// a bare stack trace; a lockup or stall ([`STALL_STARTS`]) too. Any of
/// these fails a run: a crash must be visible, never retried away.
const FAULT_STARTS: &[&str] = &[
    "------------[ cut here ]------------",
    "BUG:",
    "Oops:",
    "Oops ",
    "WARNING: CPU:",
    "WARNING: at ",
    "Kernel panic",
    "general protection fault",
    "Call Trace:",
    "watchdog: BUG:",
    "Unable to handle kernel",
    "kernel BUG at",
    "UBSAN:",
    "KASAN:",
];

/// The line that ends one fault report.
fn ends_fault(line: &str) -> bool {
    line.contains("---[ end trace") || line.contains("---[ end Kernel panic")
}

/// `line` without a leading printk timestamp (`[    4.123456] `).
fn strip_timestamp(line: &str) -> &str {
    let t = line.trim_start_matches(['\r', ' ']);
    if let Some(rest) = t.strip_prefix('[') {
        if let Some(end) = rest.find(']') {
            let stamp = &rest[..end];
            if !stamp.is_empty()
                && stamp
                    .chars()
                    .all(|c| c.is_ascii_digit() || c == '.' || c == ' ')
            {
                return rest[end + 1..].trim_start();
            }
        }
    }
    t
}

/// The lines with which a kernel's own watchdogs report a stall: a soft or
/// hard lockup, an RCU stall, a task blocked for minutes. In the emulated
/// host of `--accel nested` they mean the host stopped making progress
/// (as when the emulator lost one of its vCPUs' interrupts), not a fault
/// of the kernels measured.
const STALL_STARTS: &[&str] = &[
    "watchdog: BUG: soft lockup",
    "watchdog: Watchdog detected hard LOCKUP",
    "rcu: INFO: rcu_",
    "INFO: rcu_",
    "INFO: task ",
];

/// `line` without its timestamp when it starts a kernel's stall report
/// ([`STALL_STARTS`]).
pub(crate) fn stall_report(line: &str) -> Option<&str> {
    let l = strip_timestamp(line).trim_end_matches(['\r', '\n']);
    STALL_STARTS.iter().any(|p| l.starts_with(p)).then_some(l)
}

/// Whether `line` starts a guest kernel fault report: a fault's or a
/// stall's.
pub fn starts_fault(line: &str) -> bool {
    let l = strip_timestamp(line);
    FAULT_STARTS.iter().any(|p| l.starts_with(p)) || stall_report(line).is_some()
}

/// Collects a guest kernel fault report from the console, whole: from its
/// first line to `---[ end trace …]---`, or `MAX_LINES`, whichever comes
/// first (a panic that powers the guest off ends it too: the caller
/// finishes it when the console closes).
#[derive(Debug, Default)]
pub(crate) struct FaultScanner {
    lines: Vec<String>,
    done: bool,
}

impl FaultScanner {
    /// The most lines one report keeps (a stack trace is a few dozen).
    pub(crate) const MAX_LINES: usize = 400;

    /// Feed one console line; true while a fault report is open or done.
    pub(crate) fn feed(&mut self, line: &str) -> bool {
        if self.done {
            return true;
        }
        if self.lines.is_empty() && !starts_fault(line) {
            return false;
        }
        let l = line.trim_end_matches(['\r', '\n']);
        self.lines.push(l.to_string());
        if ends_fault(l) || self.lines.len() >= Self::MAX_LINES {
            self.done = true;
        }
        true
    }

    /// A fault report has started.
    pub(crate) fn started(&self) -> bool {
        !self.lines.is_empty()
    }

    /// The report is complete (its end marker or `MAX_LINES` seen).
    pub(crate) fn complete(&self) -> bool {
        self.done
    }

    /// The report's first line, without its timestamp.
    pub(crate) fn first_line(&self) -> Option<String> {
        let first = self.lines.first()?;
        Some(strip_timestamp(first).trim_end().to_string())
    }

    /// The report's lines so far, joined.
    pub(crate) fn report(&self) -> String {
        self.lines.join("\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_markers() {
        assert_eq!(
            parse_line("BLKLAB-INIT kernel=6.12.0 uptime=1.23\r"),
            Some(Event::Init {
                kernel: "6.12.0".into()
            })
        );
        assert_eq!(
            parse_line("BLKLAB-SYNC 3 end seed002-quick j2-r100"),
            Some(Event::Sync {
                n: 3,
                phase: Phase::End,
                scenario: "seed002-quick".into(),
                variant: "j2-r100".into()
            })
        );
        assert_eq!(parse_line("BLKLAB-SYNC x end a b"), None);
        assert_eq!(parse_line("BLKLAB-SYNC 1 middle a b"), None);
        assert_eq!(
            parse_line("BLKLAB-RESULT-BEGIN smoke read"),
            Some(Event::ResultBegin {
                scenario: "smoke".into(),
                variant: "read".into()
            })
        );
        assert_eq!(
            parse_line("BLKLAB-END lab rc=2"),
            Some(Event::End { rc: 2 })
        );
        assert_eq!(
            parse_line("BLKLAB-ERROR scenario x.scn:3: bad"),
            Some(Event::Error("scenario x.scn:3: bad".into()))
        );
        assert_eq!(parse_line("[    1.0] virtio_blk virtio1: [vda]"), None);
        assert_eq!(parse_line(""), None);
    }

    /// A WARN splat as 6.12 prints it (shortened): one report, start to end.
    const SPLAT: &str = "[    4.210000] ------------[ cut here ]------------
[    4.210100] WARNING: CPU: 1 PID: 77 at block/blk-mq.c:1234 blk_mq_start_request+0x1/0x2
[    4.210200] Modules linked in: null_blk
[    4.210300] CPU: 1 UID: 0 PID: 77 Comm: fio Not tainted 6.12.0 #1
[    4.210400] RIP: 0010:blk_mq_start_request+0x1/0x2
[    4.210500] Call Trace:
[    4.210600]  <TASK>
[    4.210700]  virtio_queue_rqs+0x10/0x20
[    4.210800]  __x64_sys_io_submit+0x30/0x40
[    4.210900]  </TASK>
[    4.211000] ---[ end trace 0000000000000000 ]---";

    #[test]
    fn a_fault_report_is_collected_whole() {
        let mut f = FaultScanner::default();
        assert!(!f.feed("BLKLAB-INIT kernel=6.12.0 uptime=1.0"));
        assert!(!f.feed("[    1.0] virtio_blk virtio1: [vda] 131072 512-byte logical blocks"));
        assert!(!f.started());
        for l in SPLAT.lines() {
            assert!(f.feed(l));
        }
        assert!(f.complete());
        assert_eq!(f.report(), SPLAT);
        let first = SPLAT.lines().next().unwrap();
        assert_eq!(f.first_line().as_deref(), Some(strip_timestamp(first)));
        // Lines after the end belong to no report.
        assert!(f.feed("BLKLAB-SYNC 1 end a b"));
        assert_eq!(f.report(), SPLAT);
    }

    #[test]
    fn a_kernel_watchdogs_stall_reports_are_told_from_other_faults() {
        for (l, report) in [
            (
                "[   45.403762] watchdog: BUG: soft lockup - CPU#1 stuck for 26s! [qemu-system-x86:179]\r",
                "watchdog: BUG: soft lockup - CPU#1 stuck for 26s! [qemu-system-x86:179]",
            ),
            (
                "[   60.0] rcu: INFO: rcu_preempt detected stalls on CPUs/tasks:",
                "rcu: INFO: rcu_preempt detected stalls on CPUs/tasks:",
            ),
            (
                "[  130.0] INFO: task kworker/0:1:80 blocked for more than 120 seconds.",
                "INFO: task kworker/0:1:80 blocked for more than 120 seconds.",
            ),
            (
                "watchdog: Watchdog detected hard LOCKUP on cpu 1",
                "watchdog: Watchdog detected hard LOCKUP on cpu 1",
            ),
        ] {
            assert_eq!(stall_report(l), Some(report), "{l}");
            assert!(starts_fault(l), "a stall is a fault in a measured guest: {l}");
        }
        for l in [
            "[   12.5] BUG: kernel NULL pointer dereference, address: 0000000000000008",
            "[    0.9] Kernel panic - not syncing: NMI: Not continuing",
            "[   12.5] Call Trace:",
            "BLKLAB-HOST-ALIVE uptime=30.1",
            "",
        ] {
            assert_eq!(stall_report(l), None, "{l}");
        }
    }

    #[test]
    fn each_kind_of_fault_is_recognised_and_ordinary_lines_are_not() {
        for l in [
            "[   12.5] BUG: kernel NULL pointer dereference, address: 0000000000000008",
            "[   12.5] Oops: general protection fault, probably for non-canonical address",
            "Oops: 0000 [#1] PREEMPT SMP",
            "[    0.9] Kernel panic - not syncing: VFS: Unable to mount root fs",
            "[   30.0] watchdog: BUG: soft lockup - CPU#0 stuck for 22s! [fio:80]",
            "[  130.0] INFO: task fio:80 blocked for more than 120 seconds.",
            "[   12.5] Call Trace:",
            "[   12.5] kernel BUG at mm/slub.c:100!",
            "\r[    3.0] WARNING: CPU: 0 PID: 1 at fs/aio.c:1 io_getevents+0x1/0x2",
        ] {
            assert!(starts_fault(l), "{l}");
        }
        for l in [
            "[    1.0] virtio_blk virtio1: 2/0/0 default/read/poll queues",
            "BLKLAB-ERROR fio failed",
            "fio: BUG in the job file",
            "[    1.0] random: crng init done",
            "",
        ] {
            assert!(!starts_fault(l), "{l}");
        }
    }

    #[test]
    fn a_report_without_an_end_stops_at_the_limit() {
        let mut f = FaultScanner::default();
        f.feed("[ 1.0] Kernel panic - not syncing: Attempted to kill init!");
        for i in 0..FaultScanner::MAX_LINES + 10 {
            f.feed(&format!("[ 1.0] line {i}"));
        }
        assert!(f.complete());
        assert_eq!(f.report().lines().count(), FaultScanner::MAX_LINES);
    }
}
