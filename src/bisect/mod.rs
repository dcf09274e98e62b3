//! `blklab bisect`: which commit of a kernel tree made a scenario's metric
//! worse. Drives real `git bisect` in the tree; each commit it asks for is
//! built with the `build:` kernels' configuration (images/build-tree.sh,
//! incremental in the tree), booted under TCG with instruction counts
//! (`--count-insns on --deterministic`, the lab runner itself) and called
//! good, bad or skip from the metric and its spread over the boots. Ends
//! with the first bad commit, the metric per tested commit and the
//! differential profile of the last good against the first bad.
//!
//! - [`options`]: the command line's options;
//! - [`git`]: revisions, the tree's state, `git bisect` and its answers;
//! - [`build`]: building the checked-out commit;
//! - [`measure`]: one lab run of a built commit, the metric per boot;
//! - [`judge`]: good/bad/skip from values, spread and boundary;
//! - [`progress`]: steps, elapsed time, estimate;
//! - [`report`]: the table, `bisect.json`, the differential profile.

pub mod build;
pub mod git;
pub mod judge;
pub mod measure;
pub mod options;
pub(crate) mod progress;
pub mod report;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use log::{info, warn};
use thiserror::Error;

use crate::lab::images;
use crate::lab::scenario;
use crate::record::metrics::{self, Better};
use git::{Git, Next};
use judge::{Boundary, Verdict};
use measure::{Measured, Setup};
use options::{BisectArgs, Threshold};
use progress::StepProgress;
use report::{BisectRecord, CommitRef, Step, BISECT_SCHEMA};

#[derive(Debug, Error)]
pub enum BisectError {
    #[error("{0}")]
    Usage(String),
    #[error("{what}: {why}")]
    Git { what: String, why: String },
    #[error("{0}")]
    Measure(String),
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Scenario(#[from] scenario::ScenarioError),
    #[error(transparent)]
    Image(#[from] images::ImageError),
    #[error(transparent)]
    Report(#[from] crate::report::compare::ReportError),
}

/// What a bisection produced.
pub struct Outcome {
    pub out_dir: PathBuf,
    pub record: BisectRecord,
    /// The metric per tested commit and the answer.
    pub table: String,
    /// `blklab compare`'s table and differential profile, last good (A)
    /// against first bad (B).
    pub profile: Option<String>,
}

/// The user's tree while we bisect in it: `git bisect reset` (back to where
/// it was) and the user's `.config` restored, at the end or on an error.
struct TreeGuard {
    git: Git,
    saved_config: Option<PathBuf>,
    head: String,
    active: bool,
}

impl TreeGuard {
    fn new(git: &Git, out_dir: &Path) -> Result<TreeGuard, BisectError> {
        let config = git.dir().join(".config");
        let saved = out_dir.join("tree.config");
        let saved_config = if config.is_file() {
            std::fs::copy(&config, &saved).map_err(|source| BisectError::Write {
                path: saved.clone(),
                source,
            })?;
            Some(saved)
        } else {
            None
        };
        Ok(TreeGuard {
            git: git.clone(),
            saved_config,
            head: git.head_name()?,
            active: true,
        })
    }

    fn restore(&mut self) -> Result<(), BisectError> {
        if !self.active {
            return Ok(());
        }
        self.active = false;
        let reset = self.git.bisect_reset();
        let config = self.git.dir().join(".config");
        match &self.saved_config {
            Some(saved) => {
                std::fs::copy(saved, &config).map_err(|source| BisectError::Write {
                    path: config.clone(),
                    source,
                })?;
            }
            None => {
                let _ = std::fs::remove_file(&config);
            }
        }
        reset?;
        info!(
            "{} is back on {} with its own .config{}",
            self.git.dir().display(),
            self.head,
            if self.saved_config.is_some() {
                ""
            } else {
                " (none)"
            }
        );
        Ok(())
    }
}

impl Drop for TreeGuard {
    fn drop(&mut self) {
        if self.active {
            if let Err(e) = self.restore() {
                warn!("could not restore {}: {e}", self.git.dir().display());
            }
        }
    }
}

/// The variant that decides: `--variant`, else the scenario's only one.
fn pick_variant(s: &scenario::Scenario, asked: Option<&str>) -> Result<String, BisectError> {
    let names: Vec<&str> = s.variants.iter().map(|v| v.name.as_str()).collect();
    match asked {
        Some(v) if names.contains(&v) => Ok(v.to_string()),
        Some(v) => Err(BisectError::Usage(format!(
            "--variant {v:?}: scenario {} has no such variant (it has: {})",
            s.name,
            names.join(", ")
        ))),
        None if names.len() == 1 => Ok(names[0].to_string()),
        None => Err(BisectError::Usage(format!(
            "scenario {} has {} variants: choose the one that decides with --variant (one of: {})",
            s.name,
            names.len(),
            names.join(", ")
        ))),
    }
}

/// Everything checked before anything is built.
struct Checked {
    git: Git,
    good: String,
    bad: String,
    variant: String,
    metric: &'static metrics::Metric,
    lab_dir: PathBuf,
    threshold: Option<Threshold>,
}

fn check(args: &BisectArgs) -> Result<Checked, BisectError> {
    let metric = metrics::find(&args.metric).ok_or_else(|| {
        BisectError::Usage(format!(
            "--metric {:?}: no such metric (known: {})",
            args.metric,
            metrics::METRICS
                .iter()
                .map(|m| m.key)
                .collect::<Vec<_>>()
                .join(", ")
        ))
    })?;
    if args.iterations == 0 {
        return Err(BisectError::Usage("--iterations must be at least 1".into()));
    }
    if args.jobs == Some(0) {
        return Err(BisectError::Usage("--jobs must be at least 1".into()));
    }
    let lab_dir = images::lab_dir(args.place.lab_dir.as_deref())?;
    let (s, _) = scenario::load(&args.scenario, &lab_dir.join("guest-scripts/scenarios"))?;
    let variant = pick_variant(&s, args.variant.as_deref())?;
    let git = Git::open(&args.tree)?;
    for f in ["Makefile", "Kconfig", "arch/x86"] {
        if !git.dir().join(f).exists() {
            return Err(BisectError::Usage(format!(
                "--git {}: not a Linux source tree (no {f})",
                git.dir().display()
            )));
        }
    }
    let good = git.resolve(&args.good, "--good")?;
    let bad = git.resolve(&args.bad, "--bad")?;
    if good == bad {
        return Err(BisectError::Usage(format!(
            "--good {} and --bad {} are the same commit ({}): nothing to bisect",
            args.good,
            args.bad,
            &good[..12]
        )));
    }
    if !git.is_ancestor(&good, &bad)? {
        return Err(BisectError::Usage(format!(
            "--good {} is not an ancestor of --bad {}: give the older commit as --good",
            args.good, args.bad
        )));
    }
    if git.bisecting()? {
        return Err(BisectError::Usage(format!(
            "a git bisect is already under way in {} (finish it, or git bisect reset)",
            git.dir().display()
        )));
    }
    let changed = git.changed_files()?;
    if !changed.is_empty() {
        return Err(BisectError::Usage(format!(
            "{} has uncommitted changes to tracked files ({}{}): commit or stash them first \
             (bisect checks out other commits)",
            git.dir().display(),
            changed
                .iter()
                .take(3)
                .cloned()
                .collect::<Vec<_>>()
                .join(", "),
            if changed.len() > 3 { ", …" } else { "" }
        )));
    }
    Ok(Checked {
        git,
        good,
        bad,
        variant,
        metric,
        lab_dir,
        threshold: args.threshold,
    })
}

/// The bisection's state while it runs.
struct Bisection<'a> {
    args: &'a BisectArgs,
    c: &'a Checked,
    out_dir: PathBuf,
    progress: StepProgress,
    steps: Vec<Step>,
    /// Every measured commit.
    measured: BTreeMap<String, Measured>,
}

impl Bisection<'_> {
    fn setup(&self) -> Setup<'_> {
        Setup {
            lab_dir: &self.c.lab_dir,
            cache: self.args.place.cache.as_deref(),
            scenario: &self.args.scenario,
            variant: &self.c.variant,
            metric: self.c.metric,
            iterations: self.args.iterations,
            vcpus: self.args.vcpus,
            qemu: &self.args.qemu,
            boot_timeout: self.args.boot_timeout,
        }
    }

    /// Check out, build and measure `commit` as a step of `role`; the step
    /// (with its error when it could not be measured) is recorded.
    fn test(&mut self, commit: &str, role: &str) -> Result<Option<Vec<f64>>, BisectError> {
        let short = &commit[..12];
        let subject = self.c.git.subject(commit);
        let mut step = Step::new(commit, &subject, role);
        if let Some(m) = self.measured.get(commit) {
            step.set_values(&m.values);
            step.run_dir = Some(m.run_dir.clone());
            let v = m.values.clone();
            self.steps.push(step);
            return Ok(Some(v));
        }
        self.c.git.checkout(commit)?;
        self.progress
            .doing(&format!("{role} {short} \"{subject}\": building"));
        let kdir = self.out_dir.join("kernels").join(short);
        let built = build::build(
            &self.c.lab_dir,
            self.c.git.dir(),
            &kdir,
            self.args.jobs,
            commit,
        );
        let result = match built {
            Err(e) => Err(format!("build failed: {e}")),
            Ok(b) => {
                step.build_seconds = Some(b.seconds.as_secs_f64());
                info!(
                    "{short}: built {} in {:.0}s",
                    b.kernel_version,
                    b.seconds.as_secs_f64()
                );
                self.progress.doing(&format!(
                    "{role} {short}: booting under TCG, {} × {}/{}",
                    self.args.iterations, self.args.scenario, self.c.variant
                ));
                let run_dir = self.out_dir.join("runs").join(short);
                measure::measure(&self.setup(), &b, short, &run_dir)
            }
        };
        self.progress.step_done();
        match result {
            Ok(m) => {
                step.run_seconds = Some(m.seconds.as_secs_f64());
                step.run_dir = Some(m.run_dir.clone());
                step.set_values(&m.values);
                let (mean, min, max) = judge::spread(&m.values);
                info!(
                    "{short}: {} {mean:.1} ({min:.1}..{max:.1}, n={}; build {:.0}s, run {:.0}s)",
                    self.c.metric.key,
                    m.values.len(),
                    step.build_seconds.unwrap_or(0.0),
                    m.seconds.as_secs_f64()
                );
                let v = m.values.clone();
                self.measured.insert(commit.to_string(), m);
                self.steps.push(step);
                Ok(Some(v))
            }
            Err(e) => {
                warn!("{short}: cannot be measured: {e}");
                step.error = Some(e);
                self.steps.push(step);
                Ok(None)
            }
        }
    }

    /// An end of the range, which must be measurable.
    fn end(&mut self, commit: &str, role: &str) -> Result<Vec<f64>, BisectError> {
        self.test(commit, role)?.ok_or_else(|| {
            BisectError::Measure(format!(
                "the {role} {} cannot be measured: {}",
                &commit[..12],
                self.steps
                    .last()
                    .and_then(|s| s.error.clone())
                    .unwrap_or_default()
            ))
        })
    }
}

fn write_text(path: &Path, text: &str) -> Result<(), BisectError> {
    std::fs::write(path, text).map_err(|source| BisectError::Write {
        path: path.to_path_buf(),
        source,
    })
}

/// Run the bisection `args` asks for.
pub fn run(args: &BisectArgs) -> Result<Outcome, BisectError> {
    // Before any thread starts (the lab's SIGINT/SIGTERM watcher).
    crate::lab::cleanup::install();
    let start = Instant::now();
    let c = check(args)?;
    let out_dir = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("blklab-bisect").join(crate::lab::runner::utc_stamp()));
    std::fs::create_dir_all(&out_dir).map_err(|source| BisectError::Write {
        path: out_dir.clone(),
        source,
    })?;
    let n = c.git.count(&c.good, &c.bad)?;
    let mut guard = TreeGuard::new(&c.git, &out_dir)?;
    let toward = c.threshold.is_none();
    let ends = if toward {
        2
    } else if matches!(c.threshold, Some(Threshold::Relative(_))) {
        1
    } else {
        0
    };
    let log2 = (f64::from(n.max(1))).log2().ceil() as u64;
    info!(
        "bisecting {n} commit(s) of {} ({}..{}) on {}/{} by {}: about {} step(s); the tree \
         is checked out and built in place and goes back to {} with its .config at the end \
         (if interrupted: git -C {} bisect reset; the .config is kept in {})",
        c.git.dir().display(),
        args.good,
        args.bad,
        args.scenario,
        c.variant,
        c.metric.key,
        log2 + ends,
        guard.head,
        c.git.dir().display(),
        out_dir.join("tree.config").display()
    );
    let mut b = Bisection {
        args,
        c: &c,
        out_dir: out_dir.clone(),
        progress: StepProgress::new(log2 + ends, !args.no_progress),
        steps: Vec::new(),
        measured: BTreeMap::new(),
    };
    let mut next = c.git.bisect_start(&c.bad, &c.good)?;
    let steps_left = |n: &Next| match n {
        Next::Test { steps, .. } => u64::from(*steps),
        _ => 0,
    };
    b.progress.steps_left(steps_left(&next) + ends);
    let boundary = match c.threshold {
        Some(Threshold::Absolute(v)) => Boundary {
            value: v,
            bad_above: c.metric.better == Better::Lower,
        },
        Some(Threshold::Relative(p)) => {
            let g = b.end(&c.good, "good end")?;
            Boundary {
                value: judge::spread(&g).0 * (1.0 + p / 100.0),
                bad_above: p > 0.0,
            }
        }
        None => {
            let g = b.end(&c.good, "good end")?;
            let bad = b.end(&c.bad, "bad end")?;
            judge::toward_bad(&g, &bad).map_err(BisectError::Measure)?
        }
    };
    if let Some(g) = b.measured.get(&c.good) {
        if judge::judge(&g.values, &boundary) != Verdict::Good {
            return Err(BisectError::Measure(format!(
                "the good end {} is not good by the boundary ({} {} {:.1}): a wrong --threshold?",
                &c.good[..12],
                c.metric.key,
                if boundary.bad_above { "above" } else { "below" },
                boundary.value
            )));
        }
    }
    info!(
        "bad: {} {} {:.1}",
        c.metric.key,
        if boundary.bad_above { "above" } else { "below" },
        boundary.value
    );
    let (first_bad, candidates) = loop {
        match next {
            Next::Found(sha) => break (Some(sha), Vec::new()),
            Next::OnlySkipped(list) => break (None, list),
            Next::Test { commit, steps } => {
                b.progress.steps_left(u64::from(steps));
                let verdict = match b.test(&commit, "candidate")? {
                    Some(v) => judge::judge(&v, &boundary),
                    None => Verdict::Skip,
                };
                if let Some(s) = b.steps.last_mut() {
                    s.verdict = Some(verdict);
                }
                info!("{}: {}", &commit[..12], verdict.git_word());
                next = c.git.bisect_mark(verdict.git_word(), &commit)?;
            }
        }
    };
    let log_path = out_dir.join("bisect-log.txt");
    write_text(&log_path, &c.git.bisect_log()?)?;
    // The differential profile needs the last good commit (the first bad
    // one's parent) measured too.
    let last_good = match &first_bad {
        Some(fb) => {
            let lg = c.git.parent(fb)?;
            for (commit, role) in [(fb.clone(), "first bad"), (lg.clone(), "last good")] {
                if !b.measured.contains_key(&commit) {
                    b.progress.steps_left(1);
                    b.test(&commit, role)?;
                }
            }
            Some(lg)
        }
        None => None,
    };
    b.progress.finish();
    guard.restore()?;
    let profile_dir = out_dir.join("profile");
    let profile = match (&first_bad, &last_good) {
        (Some(fb), Some(lg)) => match (b.measured.get(lg), b.measured.get(fb)) {
            (Some(g), Some(f)) => {
                let text = report::profile(
                    (&g.run_dir, &g.label),
                    (&f.run_dir, &f.label),
                    c.metric.key,
                    args.top,
                    &profile_dir,
                )?;
                write_text(&out_dir.join("profile.txt"), &text)?;
                Some(text)
            }
            _ => {
                warn!("no differential profile: the last good or the first bad commit could not be measured");
                None
            }
        },
        _ => None,
    };
    let commit_ref = |sha: &String| CommitRef {
        commit: sha.clone(),
        subject: c.git.subject(sha),
    };
    let record = BisectRecord {
        schema: BISECT_SCHEMA.to_string(),
        tree: c.git.dir().to_path_buf(),
        good: c.good.clone(),
        bad: c.bad.clone(),
        good_rev: args.good.clone(),
        bad_rev: args.bad.clone(),
        scenario: args.scenario.clone(),
        variant: c.variant.clone(),
        metric: c.metric.key.to_string(),
        iterations: args.iterations,
        mode: if toward { "toward-bad" } else { "threshold" }.to_string(),
        boundary: Some(boundary),
        steps: b.steps,
        first_bad: first_bad.as_ref().map(commit_ref),
        first_bad_candidates: candidates,
        last_good: last_good.as_ref().map(commit_ref),
        profile_dir: profile.as_ref().map(|_| profile_dir.clone()),
        bisect_log: log_path,
        seconds: start.elapsed().as_secs_f64(),
    };
    let table = report::table(&record);
    write_text(&out_dir.join("bisect.txt"), &table)?;
    let json = serde_json::to_string_pretty(&record).expect("the record serialises");
    write_text(&out_dir.join("bisect.json"), &json)?;
    Ok(Outcome {
        out_dir,
        record,
        table,
        profile,
    })
}
