//! What `blklab run` tells a person while it boots: on a terminal, an
//! indicatif bar (variants done of all, elapsed, an estimate of what is
//! left, what runs now); otherwise (CI logs, `--no-progress`) a plain log
//! line when each boot and each variant starts, with the same counts,
//! elapsed time and estimate, so a log read later says where a run was.

use std::cell::Cell;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use log::info;

/// Progress over a run's variants (the unit of work: one fio job set).
pub(crate) struct Progress {
    bar: Option<ProgressBar>,
    start: Instant,
    total: u64,
    done: Cell<u64>,
    boots: usize,
    /// Done when the current boot started, to give a failed boot's
    /// retry its variants back.
    boot_mark: Cell<u64>,
}

/// `d` as `1h02m03s`, `2m05s` or `7s`.
pub(crate) fn short_duration(d: Duration) -> String {
    let s = d.as_secs();
    match (s / 3600, (s / 60) % 60, s % 60) {
        (0, 0, sec) => format!("{sec}s"),
        (0, m, sec) => format!("{m}m{sec:02}s"),
        (h, m, sec) => format!("{h}h{m:02}m{sec:02}s"),
    }
}

/// What is left at the rate so far: `elapsed / done * (total - done)`;
/// `None` before anything is done.
pub(crate) fn estimate_left(elapsed: Duration, done: u64, total: u64) -> Option<Duration> {
    if done == 0 || done > total {
        return None;
    }
    Some(elapsed.mul_f64((total - done) as f64 / done as f64))
}

impl Progress {
    /// `total` variants in `boots` boots; a bar only when asked for and
    /// stderr is a terminal.
    pub(crate) fn new(total: u64, boots: usize, bar_wanted: bool) -> Progress {
        let bar = (bar_wanted && std::io::stderr().is_terminal()).then(|| {
            let pb = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            pb.set_style(
                ProgressStyle::with_template(
                    "{elapsed_precise} [{bar:30}] {pos}/{len} variants, ~{eta} left: {msg}",
                )
                .expect("valid template")
                .progress_chars("=> "),
            );
            pb
        });
        Progress {
            bar,
            start: Instant::now(),
            total,
            done: Cell::new(0),
            boots,
            boot_mark: Cell::new(0),
        }
    }

    fn counts(&self) -> String {
        let elapsed = self.start.elapsed();
        let done = self.done.get();
        let left = estimate_left(elapsed, done, self.total).map_or_else(
            || "estimate after the first variant".to_string(),
            |l| format!("about {} left", short_duration(l)),
        );
        format!(
            "{done} of {} variants done, {} elapsed, {left}",
            self.total,
            short_duration(elapsed)
        )
    }

    /// Boot `seq` (0-based) starts: `what` names kernel, scenario and
    /// iteration.
    pub(crate) fn boot(&self, seq: usize, what: &str) {
        self.boot_mark.set(self.done.get());
        match &self.bar {
            Some(pb) => pb.set_message(format!("{what}: booting")),
            None => info!(
                "boot {}/{}: {what}: booting ({})",
                seq + 1,
                self.boots,
                self.counts()
            ),
        }
    }

    /// A boot is tried again: its variants count again.
    pub(crate) fn retry(&self) {
        self.done.set(self.boot_mark.get());
        if let Some(pb) = &self.bar {
            pb.set_position(self.done.get());
        }
    }

    /// A variant starts in the current boot.
    pub(crate) fn variant(&self, what: &str) {
        match &self.bar {
            Some(pb) => pb.set_message(what.to_string()),
            None => info!(
                "variant {}/{}: {what} ({})",
                self.done.get() + 1,
                self.total,
                self.counts()
            ),
        }
    }

    /// A variant's record is written.
    pub(crate) fn variant_done(&self) {
        self.done.set(self.done.get() + 1);
        if let Some(pb) = &self.bar {
            pb.inc(1);
        }
    }

    pub(crate) fn finish(&self) {
        match &self.bar {
            Some(pb) => pb.finish_and_clear(),
            None => info!(
                "all {} variants done in {}",
                self.total,
                short_duration(self.start.elapsed())
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_estimates_read_as_a_person_would() {
        assert_eq!(short_duration(Duration::from_secs(7)), "7s");
        assert_eq!(short_duration(Duration::from_secs(125)), "2m05s");
        assert_eq!(short_duration(Duration::from_secs(3723)), "1h02m03s");
        assert_eq!(estimate_left(Duration::from_secs(60), 0, 10), None);
        assert_eq!(
            estimate_left(Duration::from_secs(60), 2, 10),
            Some(Duration::from_secs(240))
        );
        assert_eq!(
            estimate_left(Duration::from_secs(60), 10, 10),
            Some(Duration::ZERO)
        );
    }

    #[test]
    fn without_a_terminal_it_counts_and_retries_give_variants_back() {
        let p = Progress::new(4, 2, true);
        p.boot(0, "6.12 smoke #0");
        p.variant("6.12 smoke/read #0");
        p.variant_done();
        p.retry();
        assert_eq!(p.done.get(), 0, "a retried boot's variants count again");
        p.variant_done();
        p.variant_done();
        p.boot(1, "6.12-noplug smoke #0");
        p.variant_done();
        assert_eq!(p.done.get(), 3);
        assert!(
            p.counts().starts_with("3 of 4 variants done"),
            "{}",
            p.counts()
        );
        p.finish();
    }
}
