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
//! - [`report`]: the table, `bisect.json`, the differential profile;
//! - `error`: what stops a bisection ([`BisectError`]) and why one commit
//!   could not be measured ([`StepError`]).

pub(crate) mod build;
mod error;
pub(crate) mod git;
pub(crate) mod judge;
pub(crate) mod measure;
pub mod options;
pub(crate) mod progress;
pub(crate) mod report;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use log::{info, warn};

use crate::lab::images;
use crate::lab::scenario;
use crate::record::metrics::{self, Better};
use error::short;
pub(crate) use error::{BisectError, StepError};
use git::{Git, Next};
use judge::{Boundary, Verdict};
use measure::{Measured, Setup};
use options::{BisectArgs, Threshold};
use progress::StepProgress;
use report::{BisectRecord, CommitRef, Step, BISECT_SCHEMA};

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
    let known = || names.iter().map(|n| n.to_string()).collect();
    match asked {
        Some(v) if names.contains(&v) => Ok(v.to_string()),
        Some(v) => Err(BisectError::NoSuchVariant {
            asked: v.to_string(),
            scenario: s.name.clone(),
            known: known(),
        }),
        None if names.len() == 1 => Ok(names[0].to_string()),
        None => Err(BisectError::ChooseVariant {
            scenario: s.name.clone(),
            known: known(),
        }),
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

impl Checked {
    /// `--toward bad` (no threshold): the boundary lies between the ends.
    fn toward(&self) -> bool {
        self.threshold.is_none()
    }

    /// Ends measured before the bisection proper: both toward bad, the good
    /// end for a relative threshold, none for an absolute one.
    fn ends_to_measure(&self) -> u64 {
        match self.threshold {
            None => 2,
            Some(Threshold::Relative(_)) => 1,
            Some(Threshold::Absolute(_)) => 0,
        }
    }
}

fn check(args: &BisectArgs) -> Result<Checked, BisectError> {
    let metric = metrics::find(&args.metric).ok_or_else(|| BisectError::UnknownMetric {
        name: args.metric.clone(),
    })?;
    if args.iterations == 0 {
        return Err(BisectError::ZeroIterations);
    }
    if args.jobs == Some(0) {
        return Err(BisectError::ZeroJobs);
    }
    let lab_dir = images::lab_dir(args.place.lab_dir.get())?;
    let (s, _) = scenario::load(&args.scenario, &lab_dir.join("guest-scripts/scenarios"))?;
    let variant = pick_variant(&s, args.variant.as_deref())?;
    let git = Git::open(&args.tree)?;
    let (good, bad) = check_tree(&git, args)?;
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

/// The tree is a Linux tree, clean and not mid-bisect, and `--good` is an
/// older commit than `--bad`: both commits, in full.
fn check_tree(git: &Git, args: &BisectArgs) -> Result<(String, String), BisectError> {
    for f in ["Makefile", "Kconfig", "arch/x86"] {
        if !git.dir().join(f).exists() {
            return Err(BisectError::NotKernelTree {
                tree: git.dir().to_path_buf(),
                missing: f,
            });
        }
    }
    let good = git.resolve(&args.good, "--good")?;
    let bad = git.resolve(&args.bad, "--bad")?;
    if good == bad {
        return Err(BisectError::SameCommit {
            good_rev: args.good.clone(),
            bad_rev: args.bad.clone(),
            commit: good,
        });
    }
    if !git.is_ancestor(&good, &bad)? {
        return Err(BisectError::NotAncestor {
            good_rev: args.good.clone(),
            bad_rev: args.bad.clone(),
        });
    }
    if git.bisecting()? {
        return Err(BisectError::AlreadyBisecting {
            tree: git.dir().to_path_buf(),
        });
    }
    let files = git.changed_files()?;
    if !files.is_empty() {
        return Err(BisectError::Uncommitted {
            tree: git.dir().to_path_buf(),
            files,
        });
    }
    Ok((good, bad))
}

/// A tested commit's metric per boot, or why it could not be measured.
type Tested = Result<Vec<f64>, StepError>;

/// Where `git bisect` ended: the first bad commit, or the skipped
/// commits it is among; and the last good one (its parent).
struct Answer {
    first_bad: Option<String>,
    candidates: Vec<String>,
    last_good: Option<String>,
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
            cache: self.args.place.cache.get(),
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
    fn test(&mut self, commit: &str, role: &str) -> Result<Tested, BisectError> {
        let short = short(commit);
        let subject = self.c.git.subject(commit);
        let mut step = Step::new(commit, &subject, role);
        if let Some(m) = self.measured.get(commit) {
            step.set_values(&m.values);
            step.run_dir = Some(m.run_dir.clone());
            let v = m.values.clone();
            self.steps.push(step);
            return Ok(Ok(v));
        }
        self.c.git.checkout(commit)?;
        self.progress
            .doing(&format!("{role} {short} \"{subject}\": building"));
        let result = self.build_and_measure(commit, role, &mut step);
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
                Ok(Ok(v))
            }
            Err(e) => {
                warn!("{short}: cannot be measured: {e}");
                step.error = Some(e.to_string());
                self.steps.push(step);
                Ok(Err(e))
            }
        }
    }

    /// Build the checked-out `commit` (its build time goes to `step`) and
    /// boot it.
    fn build_and_measure(
        &mut self,
        commit: &str,
        role: &str,
        step: &mut Step,
    ) -> Result<Measured, StepError> {
        let short = short(commit);
        let kdir = self.out_dir.join("kernels").join(short);
        let b = build::build(
            &self.c.lab_dir,
            self.c.git.dir(),
            &kdir,
            self.args.jobs,
            commit,
        )
        .map_err(StepError::Build)?;
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
        let run_dir = unused_dir(&self.out_dir.join("runs"), short);
        Ok(measure::measure(&self.setup(), &b, short, &run_dir)?)
    }

    /// An end of the range, which must be measurable.
    fn end(&mut self, commit: &str, role: &'static str) -> Result<Vec<f64>, BisectError> {
        self.test(commit, role)?
            .map_err(|e| BisectError::EndNotMeasured {
                role,
                commit: commit.to_string(),
                source: Box::new(e),
            })
    }

    /// The boundary between good and bad: the threshold, or halfway between
    /// the ends (measured here when needed). A measured good end must be
    /// good by it.
    fn boundary(&mut self) -> Result<Boundary, BisectError> {
        let c = self.c;
        let boundary = match c.threshold {
            Some(Threshold::Absolute(v)) => Boundary {
                value: v,
                bad_above: c.metric.better == Better::Lower,
            },
            Some(Threshold::Relative(p)) => {
                let g = self.end(&c.good, "good end")?;
                Boundary {
                    value: judge::spread(&g).0 * (1.0 + p / 100.0),
                    bad_above: p > 0.0,
                }
            }
            None => {
                let g = self.end(&c.good, "good end")?;
                let bad = self.end(&c.bad, "bad end")?;
                judge::toward_bad(&g, &bad)?
            }
        };
        if let Some(g) = self.measured.get(&c.good) {
            if judge::judge(&g.values, &boundary) != Verdict::Good {
                return Err(BisectError::GoodEndNotGood {
                    commit: c.good.clone(),
                    metric: c.metric.key,
                    boundary,
                });
            }
        }
        info!(
            "bad: {} {} {:.1}",
            c.metric.key,
            boundary.bad_side(),
            boundary.value
        );
        Ok(boundary)
    }

    /// Test each commit `git bisect` asks for, starting with `next`, until
    /// it names the first bad one or only skipped ones are left (the last
    /// good one is left for [`Bisection::last_good`]).
    fn walk(&mut self, mut next: Next, boundary: &Boundary) -> Result<Answer, BisectError> {
        let (first_bad, candidates) = loop {
            match next {
                Next::Found(sha) => break (Some(sha), Vec::new()),
                Next::OnlySkipped(list) => break (None, list),
                Next::Test { commit, steps } => {
                    self.progress.steps_left(u64::from(steps));
                    let verdict = match self.test(&commit, "candidate")? {
                        Ok(v) => judge::judge(&v, boundary),
                        Err(_) => Verdict::Skip,
                    };
                    if let Some(s) = self.steps.last_mut() {
                        s.verdict = Some(verdict);
                    }
                    info!("{}: {}", short(&commit), verdict.git_word());
                    next = self.c.git.bisect_mark(verdict.git_word(), &commit)?;
                }
            }
        };
        Ok(Answer {
            first_bad,
            candidates,
            last_good: None,
        })
    }

    /// The first bad commit's parent, with both measured (the differential
    /// profile compares them).
    fn last_good(&mut self, first_bad: Option<&String>) -> Result<Option<String>, BisectError> {
        let Some(fb) = first_bad else {
            return Ok(None);
        };
        let lg = self.c.git.parent(fb)?;
        for (commit, role) in [(fb.clone(), "first bad"), (lg.clone(), "last good")] {
            if !self.measured.contains_key(&commit) {
                self.progress.steps_left(1);
                // An unmeasurable one is recorded as such (then there is
                // no profile).
                let _recorded = self.test(&commit, role)?;
            }
        }
        Ok(Some(lg))
    }

    /// `blklab compare` of the last good (A) and the first bad (B) commit's
    /// runs into `profile_dir`, its text also in `profile.txt`; none without
    /// both.
    fn profile(&self, answer: &Answer, profile_dir: &Path) -> Result<Option<String>, BisectError> {
        let (Some(fb), Some(lg)) = (&answer.first_bad, &answer.last_good) else {
            return Ok(None);
        };
        let (Some(g), Some(f)) = (self.measured.get(lg), self.measured.get(fb)) else {
            warn!("no differential profile: the last good or the first bad commit could not be measured");
            return Ok(None);
        };
        let text = report::profile(
            (&g.run_dir, &g.label),
            (&f.run_dir, &f.label),
            self.c.metric.key,
            self.args.top,
            profile_dir,
        )?;
        write_text(&self.out_dir.join("profile.txt"), &text)?;
        Ok(Some(text))
    }

    /// `bisect.json`'s record of this bisection.
    fn record(
        self,
        answer: Answer,
        boundary: Boundary,
        profile_dir: Option<PathBuf>,
        bisect_log: PathBuf,
        start: Instant,
    ) -> BisectRecord {
        let (c, args) = (self.c, self.args);
        let commit_ref = |sha: &String| CommitRef {
            commit: sha.clone(),
            subject: c.git.subject(sha),
        };
        BisectRecord {
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
            mode: if c.toward() {
                "toward-bad"
            } else {
                "threshold"
            }
            .to_string(),
            boundary: Some(boundary),
            steps: self.steps,
            first_bad: answer.first_bad.as_ref().map(commit_ref),
            first_bad_candidates: answer.candidates,
            last_good: answer.last_good.as_ref().map(commit_ref),
            profile_dir,
            bisect_log,
            seconds: start.elapsed().as_secs_f64(),
        }
    }
}

fn write_text(path: &Path, text: &str) -> Result<(), BisectError> {
    std::fs::write(path, text).map_err(|source| BisectError::Write {
        path: path.to_path_buf(),
        source,
    })
}

/// `parent/name`, or `parent/name.N` with the first N that does not exist
/// (a run never writes into an earlier run's directory: a commit measured
/// again, or a bisect given an earlier `--out`).
fn unused_dir(parent: &Path, name: &str) -> PathBuf {
    let first = parent.join(name);
    if !first.exists() {
        return first;
    }
    let mut n = 2u64;
    loop {
        let p = parent.join(format!("{name}.{n}"));
        if !p.exists() {
            return p;
        }
        n += 1;
    }
}

/// `--out`, else `blklab-bisect/STAMP`, created.
fn out_dir(args: &BisectArgs) -> Result<PathBuf, BisectError> {
    let out_dir = args.out.clone().unwrap_or_else(|| {
        PathBuf::from("blklab-bisect").join(crate::util::wallclock::utc_stamp())
    });
    std::fs::create_dir_all(&out_dir).map_err(|source| BisectError::Write {
        path: out_dir.clone(),
        source,
    })?;
    Ok(out_dir)
}

/// Say what is about to happen to the tree, and how to undo it if
/// interrupted.
fn announce(args: &BisectArgs, c: &Checked, commits: u32, steps: u64, head: &str, out_dir: &Path) {
    info!(
        "bisecting {commits} commit(s) of {} ({}..{}) on {}/{} by {}: about {steps} step(s); the tree \
         is checked out and built in place and goes back to {head} with its .config at the end \
         (if interrupted: git -C {} bisect reset; the .config is kept in {})",
        c.git.dir().display(),
        args.good,
        args.bad,
        args.scenario,
        c.variant,
        c.metric.key,
        c.git.dir().display(),
        out_dir.join("tree.config").display()
    );
}

/// Run the bisection `args` asks for.
pub fn run(args: &BisectArgs) -> Result<Outcome, BisectError> {
    // Before any thread starts (the lab's SIGINT/SIGTERM watcher).
    crate::lab::guest::cleanup::install();
    let start = Instant::now();
    let c = check(args)?;
    let out_dir = out_dir(args)?;
    let n = c.git.count(&c.good, &c.bad)?;
    let mut guard = TreeGuard::new(&c.git, &out_dir)?;
    let ends = c.ends_to_measure();
    let log2 = (f64::from(n.max(1))).log2().ceil() as u64;
    announce(args, &c, n, log2 + ends, &guard.head, &out_dir);
    let mut b = Bisection {
        args,
        c: &c,
        out_dir: out_dir.clone(),
        progress: StepProgress::new(log2 + ends, !args.no_progress),
        steps: Vec::new(),
        measured: BTreeMap::new(),
    };
    let next = c.git.bisect_start(&c.bad, &c.good)?;
    let steps_left = match &next {
        Next::Test { steps, .. } => u64::from(*steps),
        _ => 0,
    };
    b.progress.steps_left(steps_left + ends);
    let boundary = b.boundary()?;
    let mut answer = b.walk(next, &boundary)?;
    let log_path = out_dir.join("bisect-log.txt");
    write_text(&log_path, &c.git.bisect_log()?)?;
    answer.last_good = b.last_good(answer.first_bad.as_ref())?;
    b.progress.finish();
    guard.restore()?;
    let profile_dir = out_dir.join("profile");
    let profile = b.profile(&answer, &profile_dir)?;
    let profile_dir = profile.as_ref().map(|_| profile_dir);
    let record = b.record(answer, boundary, profile_dir, log_path, start);
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
