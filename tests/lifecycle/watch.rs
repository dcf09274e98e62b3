//! The host's view of a lifecycle run while it happens: the guest's
//! console lines as they come (from every QEMU the guest runs in), its
//! last progress line, its end line, and a time-stamped note of everything
//! the host did, for the failure message.

use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use crate::guest::Line;
use crate::outcome::field;

/// `BLKLAB-LIFE-PROGRESS`: what the guest's disk had completed and had in
/// flight at one second.
#[derive(Clone, Debug)]
pub(crate) struct Progress {
    pub writes: u64,
    pub inflight_writes: u64,
}

pub(crate) struct Watch {
    rx: Receiver<Line>,
    start: Instant,
    /// Every console line so far, every QEMU's, in the order they came.
    pub lines: Vec<String>,
    /// `BLKLAB-LIFE-FIO-START`'s `writes`: what fio is to write.
    total_writes: Option<u64>,
    pub progress: Option<Progress>,
    /// The QEMU that printed `BLKLAB-LIFE-END`, once one has.
    pub ended: Option<&'static str>,
    /// What happened when (seconds since the watch began).
    pub notes: Vec<String>,
}

/// How often [`Watch::until`] looks at its condition while no line comes.
const TICK: Duration = Duration::from_millis(200);

impl Watch {
    pub(crate) fn new(rx: Receiver<Line>) -> Watch {
        Watch {
            rx,
            start: Instant::now(),
            lines: Vec::new(),
            total_writes: None,
            progress: None,
            ended: None,
            notes: Vec::new(),
        }
    }

    /// Note what the host did or saw, with the time.
    pub(crate) fn note(&mut self, what: String) {
        let line = format!("{:7.1}s {what}", self.start.elapsed().as_secs_f64());
        eprintln!("[lifecycle] {line}");
        self.notes.push(line);
    }

    fn take(&mut self, line: Line) {
        let text = line.text;
        if let Some(rest) = text.strip_prefix("BLKLAB-LIFE-PROGRESS ") {
            let num = |k| field(rest, k).and_then(|v| v.parse().ok());
            if let (Some(writes), Some(inflight_writes)) = (num("writes"), num("inflight_writes")) {
                self.progress = Some(Progress {
                    writes,
                    inflight_writes,
                });
            }
        } else if let Some(rest) = text.strip_prefix("BLKLAB-LIFE-FIO-START ") {
            self.total_writes = field(rest, "writes").and_then(|v| v.parse().ok());
        } else if text.starts_with("BLKLAB-LIFE-END ") {
            self.ended = Some(line.guest);
        }
        if text.starts_with("BLKLAB-") && !text.starts_with("BLKLAB-LIFE-FIO-JSON") {
            eprintln!("[{}] {text}", line.guest);
        }
        self.lines.push(text);
    }

    /// Take console lines until `cond` holds (looked at on each line and
    /// every [`TICK`]), the guest has printed its end line, every QEMU has
    /// closed its console, or `patience` has passed; whether `cond` held.
    pub(crate) fn until(
        &mut self,
        patience: Duration,
        mut cond: impl FnMut(&Watch) -> bool,
    ) -> bool {
        let deadline = Instant::now() + patience;
        loop {
            if cond(self) {
                return true;
            }
            let now = Instant::now();
            if self.ended.is_some() || now >= deadline {
                return false;
            }
            match self.rx.recv_timeout(TICK.min(deadline - now)) {
                Ok(line) => self.take(line),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return cond(self),
            }
        }
    }

    /// What fio is to write, once it has started.
    pub(crate) fn total_writes(&self) -> u64 {
        self.total_writes.unwrap_or(0)
    }

    /// Wait until fio has started; fail with the console if the guest does
    /// not get there.
    pub(crate) fn fio_started(&mut self, patience: Duration, console: &str) {
        if !self.until(patience, |w| w.total_writes.is_some()) {
            panic!(
                "the guest did not start fio within {patience:?}\n--- console ---\n{console}\n{}",
                self.lines.join("\n")
            );
        }
        self.note(format!("fio started: {} writes", self.total_writes()));
    }

    /// Take the lines already sent and forget the progress seen so far:
    /// after the backend was killed, the next progress line is the first
    /// to count only what completed before the kill.
    pub(crate) fn forget_progress(&mut self) {
        while let Ok(line) = self.rx.try_recv() {
            self.take(line);
        }
        self.progress = None;
    }

    /// Wait for act `k` of `parts - 1`: the guest's writes at `k/parts` of
    /// fio's and beyond the first progress line counted from here (after
    /// [`Watch::forget_progress`]: the backend started since the kill has
    /// completed writes); why not, when they do not get there.
    pub(crate) fn kill_point(
        &mut self,
        k: u64,
        parts: u64,
        patience: Duration,
    ) -> Result<(), String> {
        let target = self.total_writes() * k / parts;
        let mut before = self.progress.as_ref().map(|p| p.writes);
        let reached = self.until(patience, |w| {
            w.progress.as_ref().is_some_and(|p| {
                let b = *before.get_or_insert(p.writes);
                p.writes >= target && p.writes > b
            })
        });
        if reached {
            return Ok(());
        }
        let last = self
            .progress
            .as_ref()
            .map_or("none".into(), |p| format!("{p:?}"));
        let why = if self.ended.is_some() {
            "the guest ended first"
        } else {
            "no such progress"
        };
        let e = format!(
            "waiting for {target} writes done (more than {before:?}): {why}; last progress {last}"
        );
        self.note(e.clone());
        Err(e)
    }
}
