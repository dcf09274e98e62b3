//! The SYNC relay between a nested lab's two levels.
//!
//! Inside the emulated host, `blklab nested-inner` runs the lab under KVM.
//! At each variant's begin and end SYNC, after its own samples and before
//! it answers the guest, it prints one line on the host's console and waits
//! for the outer lab's answer on the same console, so that the outer lab
//! takes its instruction counts over the same window while the guest waits:
//!
//! ```text
//! BLKLAB-NESTED sync SEQ begin|end KERNEL SCENARIO VARIANT ITERATION
//! BLKLAB-NESTED ok SEQ                      (the outer lab's answer)
//! ```
//!
//! Once, before its first boot, it says where the host's kernel keeps what
//! names a task and where the functions the outer plugin hooks start
//! ([`TaskLayout`]), and waits for the same answer:
//!
//! ```text
//! BLKLAB-NESTED tasks SEQ switch=HEX halt=HEX comm=N pid=N tgid=N
//! ```
//!
//! Kernel labels, scenario and variant names never hold blanks (labels are
//! made unique and blank-free by the plan, scenario and variant names are
//! single words in the scenario syntax).

use std::io::{BufRead, Write};
use std::sync::Mutex;

use thiserror::Error;

use crate::lab::guest::console::Phase;
use crate::lab::nested::task_layout::TaskLayout;
use crate::record::summary::RetriedBoot;

const TAG: &str = "BLKLAB-NESTED";

/// The variant window a SYNC line belongs to: one record's identity.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct WindowKey {
    pub(crate) kernel: String,
    pub(crate) scenario: String,
    pub(crate) variant: String,
    pub(crate) iteration: u32,
}

/// One relay line the outer lab acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SyncLine {
    pub(crate) seq: u64,
    pub(crate) phase: Phase,
    pub(crate) key: WindowKey,
}

impl SyncLine {
    /// The line the inner lab prints.
    pub(crate) fn render(&self) -> String {
        let phase = match self.phase {
            Phase::Begin => "begin",
            Phase::End => "end",
        };
        let k = &self.key;
        format!(
            "{TAG} sync {} {phase} {} {} {} {}",
            self.seq, k.kernel, k.scenario, k.variant, k.iteration
        )
    }

    /// A console line as a relay SYNC (carriage returns and surrounding
    /// blanks ignored); `None` for anything else.
    pub(crate) fn parse(line: &str) -> Option<SyncLine> {
        let mut w = line.split_whitespace();
        if (w.next()?, w.next()?) != (TAG, "sync") {
            return None;
        }
        let seq = w.next()?.parse().ok()?;
        let phase = match w.next()? {
            "begin" => Phase::Begin,
            "end" => Phase::End,
            _ => return None,
        };
        let key = WindowKey {
            kernel: w.next()?.to_string(),
            scenario: w.next()?.to_string(),
            variant: w.next()?.to_string(),
            iteration: w.next()?.parse().ok()?,
        };
        w.next().is_none().then_some(SyncLine { seq, phase, key })
    }
}

/// The `tasks` relay line: the host's [`TaskLayout`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TasksLine {
    pub(crate) seq: u64,
    pub(crate) layout: TaskLayout,
}

impl TasksLine {
    pub(crate) fn render(&self) -> String {
        format!("{TAG} tasks {} {}", self.seq, self.layout.render())
    }

    /// A console line as a `tasks` line; `None` for anything else.
    pub(crate) fn parse(line: &str) -> Option<TasksLine> {
        let mut w = line.split_whitespace();
        if (w.next()?, w.next()?) != (TAG, "tasks") {
            return None;
        }
        let seq = w.next()?.parse().ok()?;
        Some(TasksLine {
            seq,
            layout: TaskLayout::parse(w)?,
        })
    }
}

/// The outer lab's answer to SYNC `seq`.
pub(crate) fn answer(seq: u64) -> String {
    format!("{TAG} ok {seq}")
}

/// Why the relay failed (the outer lab went away, or said something else).
#[derive(Debug, Error)]
pub enum RelayError {
    #[error("cannot write the relay line to the console: {0}")]
    Write(#[source] std::io::Error),
    #[error("cannot read the outer lab's answer from the console: {0}")]
    Read(#[source] std::io::Error),
    #[error("the console closed while waiting for the outer lab's answer to SYNC {seq}")]
    Closed { seq: u64 },
}

/// The inner lab's end of the relay: its console (stdout for the lines,
/// stdin for the answers). One SYNC at a time.
pub(crate) struct Relay<R, W> {
    io: Mutex<RelayIo<R, W>>,
}

struct RelayIo<R, W> {
    input: R,
    output: W,
    seq: u64,
}

impl<R: BufRead, W: Write> Relay<R, W> {
    pub(crate) fn new(input: R, output: W) -> Relay<R, W> {
        Relay {
            io: Mutex::new(RelayIo {
                input,
                output,
                seq: 0,
            }),
        }
    }

    /// Print the SYNC for `key`'s `phase` and wait for its answer (lines
    /// that are not it, such as the console's echo of earlier answers or
    /// stray output, are skipped).
    pub(crate) fn sync(&self, phase: Phase, key: WindowKey) -> Result<(), RelayError> {
        self.ask(|seq| SyncLine { seq, phase, key }.render())
    }

    /// Say where the host's kernel keeps what names a task, and wait for
    /// the outer lab to have told its plugin.
    pub(crate) fn tasks(&self, layout: TaskLayout) -> Result<(), RelayError> {
        self.ask(|seq| TasksLine { seq, layout }.render())
    }

    /// Print the line `line` renders for the next sequence number and wait
    /// for its answer (lines that are not it, such as the console's echo
    /// of earlier answers or stray output, are skipped).
    fn ask(&self, line: impl FnOnce(u64) -> String) -> Result<(), RelayError> {
        let mut io = self.io.lock().unwrap_or_else(|p| p.into_inner());
        io.seq += 1;
        let seq = io.seq;
        writeln!(io.output, "{}", line(seq)).map_err(RelayError::Write)?;
        io.output.flush().map_err(RelayError::Write)?;
        let want = answer(seq);
        let mut buf = String::new();
        loop {
            buf.clear();
            if io.input.read_line(&mut buf).map_err(RelayError::Read)? == 0 {
                return Err(RelayError::Closed { seq });
            }
            if buf.trim() == want {
                return Ok(());
            }
        }
    }
}

/// The inner lab's link to the outer one, when the lab runs inside a
/// nested host: a boot's session calls `sync` at each SYNC; the run asks
/// which boots an earlier host already finished, and says when one ends.
pub(crate) trait SyncRelay {
    fn sync(&self, phase: Phase, key: WindowKey) -> Result<(), RelayError>;

    /// The plan's boot `seq` was finished by an earlier host: not run.
    fn skips(&self, _seq: usize) -> bool {
        false
    }

    /// The plan's boot `seq` ended; `failures` and `retried` are the run's
    /// so far.
    fn boot_finished(&self, _seq: usize, _failures: &[String], _retried: &[RetriedBoot]) {}
}

impl<R: BufRead, W: Write> SyncRelay for Relay<R, W> {
    fn sync(&self, phase: Phase, key: WindowKey) -> Result<(), RelayError> {
        Relay::sync(self, phase, key)
    }
}

/// The relay on this process's stdin and stdout (the host's console).
pub(crate) fn console() -> Relay<std::io::BufReader<std::io::Stdin>, std::io::Stdout> {
    Relay::new(std::io::BufReader::new(std::io::stdin()), std::io::stdout())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> WindowKey {
        WindowKey {
            kernel: "6.12".into(),
            scenario: "smoke".into(),
            variant: "randread-qd1".into(),
            iteration: 2,
        }
    }

    #[test]
    fn a_sync_line_round_trips_and_nothing_else_parses() {
        let l = SyncLine {
            seq: 7,
            phase: Phase::End,
            key: key(),
        };
        assert_eq!(
            l.render(),
            "BLKLAB-NESTED sync 7 end 6.12 smoke randread-qd1 2"
        );
        assert_eq!(SyncLine::parse(&format!("{}\r", l.render())), Some(l));
        for bad in [
            "BLKLAB-NESTED ok 7",
            "BLKLAB-NESTED sync 7 middle 6.12 smoke v 2",
            "BLKLAB-NESTED sync x begin 6.12 smoke v 2",
            "BLKLAB-NESTED sync 7 begin 6.12 smoke v",
            "BLKLAB-NESTED sync 7 begin 6.12 smoke v 2 extra",
            "[   1.0] BLKLAB-NESTED sync 7 begin 6.12 smoke v 2",
        ] {
            assert_eq!(SyncLine::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn sync_waits_for_its_own_answer() {
        // The console echoes an earlier answer and prints noise first.
        let input = "BLKLAB-NESTED ok 0\nnoise\nBLKLAB-NESTED ok 1\r\n";
        let mut out = Vec::new();
        {
            let r = Relay::new(input.as_bytes(), &mut out);
            r.sync(Phase::Begin, key()).unwrap();
            // No answer to the second: the console closes.
            let e = r.sync(Phase::End, key()).unwrap_err();
            assert!(matches!(e, RelayError::Closed { seq: 2 }), "{e:?}");
        }
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text,
            "BLKLAB-NESTED sync 1 begin 6.12 smoke randread-qd1 2\n\
             BLKLAB-NESTED sync 2 end 6.12 smoke randread-qd1 2\n"
        );
    }
}
