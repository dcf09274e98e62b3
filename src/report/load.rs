//! Reading the sides of a comparison from `blklab run` output directories:
//! a run directory's records, the shards of one plan merged into one run,
//! and the `DIR[,DIR...][:KERNEL]` arguments that name a side.
//!
//! It knows the documents of `record/` and nothing of statistics,
//! comparison rows or rendering.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use thiserror::Error;

use crate::record::result::{ResultRecord, RESULT_SCHEMA};
use crate::record::run::RunDocument;
use crate::record::RecordError;
use crate::report::comparability::{run_value, Condition};

/// Why the sides of a comparison could not be read.
#[derive(Debug, Error)]
pub enum LoadError {
    #[error("{0} is not a directory written by `blklab run` (no run.json)")]
    NotARun(PathBuf),
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Record(#[from] RecordError),
    #[error("{dir} has no results (no *.json records of blklab-run-result/1)")]
    Empty { dir: PathBuf },
    #[error("{dir} has no kernel {kernel:?} (it has: {have})")]
    NoKernel {
        dir: PathBuf,
        kernel: String,
        have: String,
    },
    #[error("{dir} holds {n} kernels ({have}); name one side as {dir}:KERNEL")]
    Ambiguous {
        dir: PathBuf,
        n: usize,
        have: String,
    },
    #[error("one directory compares its two kernels, but {dir} holds {n} ({have}); give two sides as DIR:KERNEL")]
    NotAPair {
        dir: PathBuf,
        n: usize,
        have: String,
    },
    #[error("no run directory")]
    NoRunDirectory,
    #[error("give one or two sides (DIR or DIR:KERNEL)")]
    SideCount,
    #[error("cannot merge {a} and {b}: {source}")]
    Merge {
        a: PathBuf,
        b: PathBuf,
        #[source]
        source: MergeError,
    },
    #[error("{dir} holds the records of {count} runs: run.json's run {own} and {others}; name the one to compare with --run ID")]
    SeveralRuns {
        dir: PathBuf,
        count: usize,
        /// run.json's run: its id and how many records.
        own: String,
        /// The other runs: each id, how many records and a file of them.
        others: String,
    },
    #[error("--run {id}: {dir}'s run.json is of run {own}, so the conditions of run {id}'s records cannot be checked (compare the directory that run wrote)")]
    RunWithoutDocument {
        dir: PathBuf,
        id: String,
        own: String,
    },
    #[error(
        "{kernel} {scenario} {variant} iteration {iteration} is in two of the merged directories"
    )]
    BootTwice {
        kernel: String,
        scenario: String,
        variant: String,
        iteration: u32,
    },
}

/// Why two run directories are not shards of one run.
#[derive(Debug, Error)]
pub enum MergeError {
    #[error("{0} is not a shard of a run (blklab run --shard I/N)")]
    FirstNotAShard(PathBuf),
    #[error("{0} is not a shard of a run")]
    NotAShard(PathBuf),
    #[error(
        "they are shards of different plans (kernels, scenarios, iterations or machines differ)"
    )]
    DifferentPlans,
    #[error("shard {index}/{count} is given twice")]
    GivenTwice { index: u32, count: u32 },
    #[error("their {what} differs ({a} against {b})")]
    Differs {
        what: &'static str,
        a: String,
        b: String,
    },
}

/// One side of a comparison: the records of one kernel in one run.
#[derive(Debug, Clone)]
pub(crate) struct Side {
    pub(crate) dir: PathBuf,
    pub(crate) kernel: String,
    pub(crate) run: RunDocument,
    pub(crate) records: Vec<ResultRecord>,
    /// Every record of the run the side was read from, of every kernel
    /// (shared by the sides read from one run): where the run's other
    /// kernels are found, such as an A/A pair beside the two compared.
    pub(crate) run_records: Arc<Vec<ResultRecord>>,
}

impl Side {
    /// The side of another kernel of the same run (no records when the
    /// run has none of `kernel`).
    pub(crate) fn sibling(&self, kernel: &str) -> Side {
        side_of(&self.dir, &self.run, &self.run_records, kernel)
    }
}

/// Is this document's `schema` a result record's (of any version)?
fn is_result(schema: &str) -> bool {
    let name = |s: &str| {
        s.rsplit_once('/')
            .map_or(s.to_string(), |(n, _)| n.to_string())
    };
    name(schema) == name(RESULT_SCHEMA)
}

/// The runs `compare --run ID` names: a directory whose records belong to
/// several runs is read only when one of them is named here.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RunFilter<'a>(pub &'a [String]);

/// A run directory: run.json and every record of its run in it (files of
/// other documents are left alone; a record or run.json of a schema version
/// this blklab does not read is an error; records of another run are
/// refused, [`LoadError::SeveralRuns`]).
pub fn load_dir(dir: &Path) -> Result<(RunDocument, Vec<ResultRecord>), LoadError> {
    load_dir_of(dir, RunFilter::default())
}

/// [`load_dir`], keeping the records of the run `filter` names where the
/// directory holds several runs'.
fn load_dir_of(
    dir: &Path,
    filter: RunFilter,
) -> Result<(RunDocument, Vec<ResultRecord>), LoadError> {
    let (run, named) = load_dir_named(dir, filter)?;
    Ok((run, named.into_iter().map(|(_, r)| r).collect()))
}

/// The run a record belongs to, by id: its own `run.id` (a record older
/// than the field: run.json's run when run.json is older too). A record
/// whose boot run.json's order does not list belongs to no run of it.
fn run_id_of(run: &RunDocument, r: &ResultRecord) -> String {
    let id = match (&r.run, &run.run_id) {
        (Some(rr), _) => rr.id.clone(),
        (None, Some(_)) => return "(records without a run id)".to_string(),
        (None, None) => legacy_id(run),
    };
    if id == id_of(run) && !in_order(run, r) {
        return format!("{id} (boots its run.json does not list)");
    }
    id
}

/// Does run.json's boot order list the record's boot?
fn in_order(run: &RunDocument, r: &ResultRecord) -> bool {
    run.order.iter().any(|o| {
        o.kernel == r.kernel
            && o.scenario == r.scenario
            && o.iteration == r.iteration
            && (o.variants.is_empty() || o.variants.contains(&r.variant))
    })
}

/// How a run.json older than run ids is named: by its start.
fn legacy_id(run: &RunDocument) -> String {
    format!(
        "started-{}",
        crate::util::wallclock::utc_stamp_of(run.started_unix as i64)
    )
}

/// run.json's run id (its start for a run older than ids).
pub(crate) fn id_of(run: &RunDocument) -> String {
    run.run_id.clone().unwrap_or_else(|| legacy_id(run))
}

/// The records of run.json's run; records of other runs refused unless
/// `filter` names run.json's run (then they are left out, with a warning).
fn own_records(
    dir: &Path,
    run: &RunDocument,
    records: Vec<(String, ResultRecord)>,
    filter: RunFilter,
) -> Result<Vec<(String, ResultRecord)>, LoadError> {
    let own = id_of(run);
    let mut mine = Vec::new();
    // Each other run: its records, and a file of them.
    let mut by_run: std::collections::BTreeMap<String, (usize, String)> = Default::default();
    for (file, r) in records {
        let id = run_id_of(run, &r);
        if id == own {
            mine.push((file, r));
        } else {
            by_run.entry(id).or_insert((0, file)).0 += 1;
        }
    }
    if by_run.is_empty() {
        return Ok(mine);
    }
    if let Some(id) = filter.0.iter().find(|id| by_run.contains_key(*id)) {
        return Err(LoadError::RunWithoutDocument {
            dir: dir.to_path_buf(),
            id: id.clone(),
            own,
        });
    }
    if filter.0.contains(&own) {
        log::warn!(
            "{}: left out {} record(s) of other runs (--run {own})",
            dir.display(),
            by_run.values().map(|(n, _)| n).sum::<usize>()
        );
        return Ok(mine);
    }
    let others_text = by_run
        .iter()
        .map(|(id, (n, file))| format!("{id} ({n} record(s), e.g. {file})"))
        .collect::<Vec<_>>()
        .join(", ");
    Err(LoadError::SeveralRuns {
        dir: dir.to_path_buf(),
        count: by_run.len() + 1,
        own: format!("{own} ({} record(s))", mine.len()),
        others: others_text,
    })
}

/// [`load_dir`] with each record's file name, in file-name order.
fn load_dir_named(
    dir: &Path,
    filter: RunFilter,
) -> Result<(RunDocument, Vec<(String, ResultRecord)>), LoadError> {
    let run_path = dir.join("run.json");
    if !run_path.is_file() {
        return Err(LoadError::NotARun(dir.to_path_buf()));
    }
    let run: RunDocument = crate::record::read(&run_path)?;
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|source| LoadError::Read {
            path: dir.to_path_buf(),
            source,
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    let mut records = Vec::new();
    for f in files {
        let name = f.file_name().unwrap_or_default().to_string_lossy();
        if name == "run.json" || name == "summary.json" {
            continue;
        }
        let v = crate::record::read_value(&f)?;
        if crate::record::schema_of(&v).is_some_and(is_result) {
            records.push((name.into_owned(), crate::record::from_value(&f, &v)?));
        }
    }
    let records = own_records(dir, &run, records, filter)?;
    if records.is_empty() {
        return Err(LoadError::Empty {
            dir: dir.to_path_buf(),
        });
    }
    Ok((run, records))
}

/// Why shard `r` cannot join `run`: another plan, a shard given twice, or
/// a run-wide condition of the comparability contract that differs (the
/// records' own conditions are checked when they are compared).
fn shard_mismatch(run: &RunDocument, r: &RunDocument, seen: &[u32]) -> Option<MergeError> {
    let sh = r.shard.as_ref()?;
    let plan = run.shard.as_ref()?;
    if sh.plan != plan.plan || sh.count != plan.count {
        return Some(MergeError::DifferentPlans);
    }
    if seen.contains(&sh.index) {
        return Some(MergeError::GivenTwice {
            index: sh.index,
            count: sh.count,
        });
    }
    Condition::ALL.into_iter().find_map(|c| {
        let (a, b) = (run_value(c, run), run_value(c, r));
        (a != b).then(|| MergeError::Differs {
            what: c.name(),
            a: a.unwrap_or_default(),
            b: b.unwrap_or_default(),
        })
    })
}

/// Several run directories as one: the shards of one plan (`blklab run
/// --shard I/N`), merged. They must come from the same plan (run.json's
/// `shard.plan`) under the same accelerator, QEMU version and instruction
/// counting, and no boot may appear twice. The merged run is the first
/// shard's document with every shard's boots in plan order (and no shard
/// record). One directory is just [`load_dir`].
pub(crate) fn load_dirs(
    dirs: &[PathBuf],
    filter: RunFilter,
) -> Result<(RunDocument, Vec<ResultRecord>), LoadError> {
    let Some((first, rest)) = dirs.split_first() else {
        return Err(LoadError::NoRunDirectory);
    };
    let (mut run, mut records) = load_dir_named(first, filter)?;
    if rest.is_empty() {
        return Ok((run, records.into_iter().map(|(_, r)| r).collect()));
    }
    let merge_err = |b: &Path, source: MergeError| LoadError::Merge {
        a: first.clone(),
        b: b.to_path_buf(),
        source,
    };
    let Some(plan) = run.shard.as_ref().map(|s| s.plan.clone()) else {
        return Err(merge_err(
            &rest[0],
            MergeError::FirstNotAShard(first.clone()),
        ));
    };
    let mut shards = vec![run.shard.as_ref().map_or(0, |s| s.index)];
    let mut order = run.order.clone();
    for d in rest {
        let (r, recs) = load_dir_named(d, filter)?;
        let Some(sh) = &r.shard else {
            return Err(merge_err(d, MergeError::NotAShard(d.clone())));
        };
        if let Some(why) = shard_mismatch(&run, &r, &shards) {
            return Err(merge_err(d, why));
        }
        shards.push(sh.index);
        order.extend(r.order.iter().cloned());
        records.extend(recs);
    }
    // As one directory would list them: by file name.
    records.sort_by(|a, b| a.0.cmp(&b.0));
    let records: Vec<ResultRecord> = records.into_iter().map(|(_, r)| r).collect();
    let mut seen = std::collections::BTreeSet::new();
    for r in &records {
        if !seen.insert((&r.kernel, &r.scenario, &r.variant, r.iteration)) {
            return Err(LoadError::BootTwice {
                kernel: r.kernel.clone(),
                scenario: r.scenario.clone(),
                variant: r.variant.clone(),
                iteration: r.iteration,
            });
        }
    }
    order.sort_by_key(|o| plan.iter().position(|p| p == o).unwrap_or(usize::MAX));
    run.order = order;
    run.shard = None;
    Ok((run, records))
}

/// Kernels of a run that have records, in run order.
pub(crate) fn kernels(run: &RunDocument, records: &[ResultRecord]) -> Vec<String> {
    let mut k: Vec<String> = run.kernels.iter().map(|k| k.label.clone()).collect();
    for r in records {
        if !k.contains(&r.kernel) {
            k.push(r.kernel.clone());
        }
    }
    k.retain(|l| records.iter().any(|r| &r.kernel == l));
    k
}

fn side_of(dir: &Path, run: &RunDocument, records: &Arc<Vec<ResultRecord>>, kernel: &str) -> Side {
    Side {
        dir: dir.to_path_buf(),
        kernel: kernel.to_string(),
        run: run.clone(),
        records: records
            .iter()
            .filter(|r| r.kernel == kernel)
            .cloned()
            .collect(),
        run_records: Arc::clone(records),
    }
}

/// `DIR[,DIR...]` or `DIR[,DIR...]:KERNEL` → (dirs, kernel). Several
/// directories are the shards of one run, merged ([`load_dirs`]).
fn split_arg(arg: &str) -> (Vec<PathBuf>, Option<String>) {
    let dirs = |s: &str| -> Option<Vec<PathBuf>> {
        let v: Vec<PathBuf> = s.split(',').map(PathBuf::from).collect();
        v.iter().all(|d| d.is_dir()).then_some(v)
    };
    if Path::new(arg).is_dir() {
        return (vec![PathBuf::from(arg)], None);
    }
    if let Some(v) = dirs(arg) {
        return (v, None);
    }
    match arg.rsplit_once(':') {
        Some((d, k)) if !k.is_empty() => match dirs(d) {
            Some(v) => (v, Some(k.to_string())),
            None => (vec![PathBuf::from(arg)], None),
        },
        _ => (vec![PathBuf::from(arg)], None),
    }
}

/// How a side's directories are shown: `DIR` or `DIR,DIR,...`.
fn dirs_label(dirs: &[PathBuf]) -> PathBuf {
    let s: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    PathBuf::from(s.join(","))
}

/// A run named by a side argument's directories, and how it is shown.
struct LoadedRun {
    dir: PathBuf,
    run: RunDocument,
    records: Arc<Vec<ResultRecord>>,
    kernels: Vec<String>,
}

impl LoadedRun {
    fn load(dirs: &[PathBuf], filter: RunFilter) -> Result<LoadedRun, LoadError> {
        let (run, records) = load_dirs(dirs, filter)?;
        let kernels = kernels(&run, &records);
        Ok(LoadedRun {
            dir: dirs_label(dirs),
            run,
            records: Arc::new(records),
            kernels,
        })
    }

    fn side(&self, kernel: &str) -> Side {
        side_of(&self.dir, &self.run, &self.records, kernel)
    }

    fn ambiguous(self) -> LoadError {
        LoadError::Ambiguous {
            n: self.kernels.len(),
            have: self.kernels.join(", "),
            dir: self.dir,
        }
    }
}

/// One side from `DIR` (a run with one kernel) or `DIR:KERNEL`.
pub(crate) fn load_side(arg: &str, filter: RunFilter) -> Result<Side, LoadError> {
    let (dirs, kernel) = split_arg(arg);
    let loaded = LoadedRun::load(&dirs, filter)?;
    match kernel {
        Some(k) => {
            if !loaded.kernels.contains(&k) {
                return Err(LoadError::NoKernel {
                    have: loaded.kernels.join(", "),
                    dir: loaded.dir,
                    kernel: k,
                });
            }
            Ok(loaded.side(&k))
        }
        None if loaded.kernels.len() == 1 => Ok(loaded.side(&loaded.kernels[0])),
        None => Err(loaded.ambiguous()),
    }
}

/// The two sides of one run directory holding exactly two kernels (A is
/// the first in run order).
fn load_pair(arg: &str, filter: RunFilter) -> Result<(Side, Side), LoadError> {
    let (dirs, _) = split_arg(arg);
    let loaded = LoadedRun::load(&dirs, filter)?;
    match loaded.kernels.as_slice() {
        [x, y] => Ok((loaded.side(x), loaded.side(y))),
        ks => Err(LoadError::NotAPair {
            n: ks.len(),
            have: ks.join(", "),
            dir: loaded.dir,
        }),
    }
}

/// The sides `blklab compare` reads: A, and B unless variant pairs are
/// compared on one kernel. One argument without pairs is a run of two
/// kernels; one argument with pairs is `DIR:KERNEL` or a run of one or two
/// kernels; two arguments are two sides.
pub(crate) fn load_sides(
    args: &[String],
    pairs: bool,
    filter: RunFilter,
) -> Result<(Side, Option<Side>), LoadError> {
    match (args, pairs) {
        ([one], false) => {
            let (a, b) = load_pair(one, filter)?;
            Ok((a, Some(b)))
        }
        ([one], true) => {
            let (dirs, kernel) = split_arg(one);
            if kernel.is_some() {
                return Ok((load_side(one, filter)?, None));
            }
            let loaded = LoadedRun::load(&dirs, filter)?;
            match loaded.kernels.as_slice() {
                [k] => Ok((loaded.side(k), None)),
                [x, y] => Ok((loaded.side(x), Some(loaded.side(y)))),
                _ => Err(loaded.ambiguous()),
            }
        }
        ([x, y], _) => Ok((load_side(x, filter)?, Some(load_side(y, filter)?))),
        _ => Err(LoadError::SideCount),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::run::ShardInfo;

    fn fixture_run() -> RunDocument {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/runs/aa");
        crate::record::read(&dir.join("run.json")).unwrap()
    }

    fn shard(run: &RunDocument, index: u32) -> RunDocument {
        let mut r = run.clone();
        r.shard = Some(ShardInfo {
            index,
            count: 3,
            plan: run.order.clone(),
        });
        r
    }

    #[test]
    fn shards_of_another_plan_twice_or_elsewhere_are_told_apart() {
        let run = fixture_run();
        let first = shard(&run, 1);
        assert!(shard_mismatch(&first, &shard(&run, 2), &[1]).is_none());
        assert!(matches!(
            shard_mismatch(&first, &shard(&run, 1), &[1]),
            Some(MergeError::GivenTwice { index: 1, count: 3 })
        ));
        let mut other = shard(&run, 2);
        other.shard.as_mut().unwrap().plan.pop();
        assert!(matches!(
            shard_mismatch(&first, &other, &[1]),
            Some(MergeError::DifferentPlans)
        ));
        let mut other = shard(&run, 2);
        other.deterministic = !run.deterministic;
        let Some(MergeError::Differs { what, .. }) = shard_mismatch(&first, &other, &[1]) else {
            panic!("a shard run otherwise is refused");
        };
        assert_eq!(what, "--deterministic");
    }

    #[test]
    fn a_merge_error_keeps_its_reason_as_its_source() {
        let e = LoadError::Merge {
            a: "x".into(),
            b: "y".into(),
            source: MergeError::DifferentPlans,
        };
        let source = std::error::Error::source(&e).unwrap();
        assert!(source.downcast_ref::<MergeError>().is_some());
        assert_eq!(
            e.to_string(),
            format!("cannot merge x and y: {}", MergeError::DifferentPlans)
        );
    }
}
