//! What `blklab bisect` tells a person while it works: each step (which
//! commit, building or measuring), step k of about n (git's own "roughly
//! N steps" plus the steps done), elapsed time and an estimate of what is
//! left at the mean step time so far. On a terminal an indicatif bar; plain
//! log lines otherwise (CI logs, `--no-progress`).

use std::io::IsTerminal;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use log::info;

use crate::lab::run::progress::{estimate_left, short_duration};

pub(crate) struct StepProgress {
    bar: Option<ProgressBar>,
    start: Instant,
    done: u64,
    total: u64,
}

impl StepProgress {
    /// About `total` steps; a bar only when wanted and stderr is a terminal.
    pub(crate) fn new(total: u64, bar_wanted: bool) -> StepProgress {
        let bar = (bar_wanted && std::io::stderr().is_terminal()).then(|| {
            let pb = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            pb.set_style(
                ProgressStyle::with_template(
                    "{elapsed_precise} [{bar:20}] bisect step {pos}/~{len}: {msg}",
                )
                .expect("valid template")
                .progress_chars("=> "),
            );
            pb
        });
        StepProgress {
            bar,
            start: Instant::now(),
            done: 0,
            total,
        }
    }

    /// git's estimate changed: `left` steps after the current one.
    pub(crate) fn steps_left(&mut self, left: u64) {
        self.total = self.done + 1 + left;
        if let Some(pb) = &self.bar {
            pb.set_length(self.total);
        }
    }

    pub(crate) fn line(&self, what: &str) -> String {
        let elapsed = self.start.elapsed();
        let left = estimate_left(elapsed, self.done, self.total).map_or_else(
            || "estimate after the first step".to_string(),
            |l| format!("about {} left", short_duration(l)),
        );
        format!(
            "bisect step {}/~{}: {what} ({} elapsed, {left})",
            self.done + 1,
            self.total,
            short_duration(elapsed)
        )
    }

    /// What the current step does now.
    pub(crate) fn doing(&self, what: &str) {
        match &self.bar {
            Some(pb) => pb.set_message(what.to_string()),
            None => info!("{}", self.line(what)),
        }
    }

    /// The current step is done.
    pub(crate) fn step_done(&mut self) {
        self.done += 1;
        self.total = self.total.max(self.done);
        if let Some(pb) = &self.bar {
            pb.set_position(self.done);
        }
    }

    pub(crate) fn finish(&self) {
        if let Some(pb) = &self.bar {
            pb.finish_and_clear();
        }
        info!(
            "bisect: {} step(s) in {}",
            self.done,
            short_duration(self.start.elapsed())
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_count_up_and_follow_gits_estimate() {
        let mut p = StepProgress::new(4, false);
        assert!(p
            .line("building abc")
            .starts_with("bisect step 1/~4: building abc"));
        assert!(p.line("x").contains("estimate after the first step"));
        p.step_done();
        p.steps_left(1);
        assert!(
            p.line("x").starts_with("bisect step 2/~3: x"),
            "{}",
            p.line("x")
        );
        assert!(p.line("x").contains("left"));
        p.step_done();
        p.step_done();
        p.step_done();
        assert_eq!(p.total, 4, "never fewer steps than done");
        p.finish();
    }
}
