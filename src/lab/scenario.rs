//! Scenario files (`guest-scripts/scenarios/NAME.scn`): what the guest runs
//! and how many disks the host must serve for it.
//!
//! The format is documented in `docs/lab-protocol.md`; the guest parses the
//! same files with `guest-scripts/run.sh` (awk), and `tests/scenario_parsers.rs`
//! checks both parsers agree on every shipped scenario. The host parses them
//! to refuse a malformed file before booting anything and to learn the
//! `disks`/`queues` the scenario wants.

use std::path::{Path, PathBuf};

use thiserror::Error;

#[derive(Debug, Error)]
pub enum ScenarioError {
    #[error("scenario {file}:{line}: {message}")]
    Syntax {
        file: String,
        line: usize,
        message: String,
    },
    #[error("cannot read scenario {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("no scenario named {name:?} in {dir} (available: {available})")]
    Unknown {
        name: String,
        dir: PathBuf,
        available: String,
    },
}

pub(crate) use crate::record::scenario::{
    Layout, Scenario, Stack, Target, Variant, Vcpus, MAX_VCPUS,
};

/// Settings that may appear globally or per variant.
#[derive(Debug, Clone, Default)]
struct Settings {
    target: Option<Target>,
    /// `Some(None)`: `stack none` (clears a global stack).
    stack: Option<Option<Stack>>,
    sched: Option<String>,
    nr_requests: Option<u64>,
    queue_depth: Option<u64>,
    nomerges: Option<u64>,
    rq_affinity: Option<u64>,
    layout: Option<Layout>,
    /// `device` settings in the order written (a later one of the same
    /// name replaces the earlier).
    device: Vec<String>,
    runtime: Option<u64>,
    ramp: Option<u64>,
    fio_args: Vec<String>,
}

/// The names a `device NAME=VALUE` setting may have: `blklab run`'s device
/// options (`--tags` is `tags`, `--tag-scope` is `tag_scope`, …). Their
/// values are checked by the host (`lab::run::settings`), not by the parsers.
pub(crate) const DEVICE_SETTINGS: &[&str] = &[
    "disk",
    "size",
    "tags",
    "depth",
    "tag_scope",
    "tag_fairness",
    "latency",
    "read_latency",
    "write_latency",
    "flush_latency",
    "latency_spin",
    "seed",
    "poll",
];

/// The name of a `NAME=VALUE` device setting.
pub(crate) fn setting_name(s: &str) -> &str {
    s.split_once('=').map_or(s, |(n, _)| n)
}

/// `list` with `setting` added: an earlier setting of the same name goes.
fn put_setting(list: &mut Vec<String>, setting: &str) {
    let name = setting_name(setting);
    list.retain(|s| setting_name(s) != name);
    list.push(setting.to_string());
}

/// A variant's device settings: the globals it does not set, then its own.
fn merge_settings(global: &[String], own: &[String]) -> Vec<String> {
    let mut out: Vec<String> = global
        .iter()
        .filter(|g| !own.iter().any(|o| setting_name(o) == setting_name(g)))
        .cloned()
        .collect();
    out.extend(own.iter().cloned());
    out
}

/// QEMU's memory size syntax as the lab accepts it: digits with an optional
/// K, M, G or T suffix.
fn is_memory_size(s: &str) -> bool {
    let digits = s.trim_end_matches(['K', 'M', 'G', 'T']);
    s.len() - digits.len() <= 1
        && !digits.is_empty()
        && digits.len() <= 9
        && digits.bytes().all(|b| b.is_ascii_digit())
        && digits.bytes().any(|b| b != b'0')
}

const DEFAULT_RUNTIME: u64 = 10;

/// fio options run.sh sets itself, and where their value comes from.
const RESERVED_FIO: &[(&str, &str)] = &[
    ("name", "the variant name"),
    ("filename", "the target devices"),
    ("runtime", "the runtime directive"),
    ("ramp_time", "the ramp directive"),
    ("output", "run.sh"),
    ("output-format", "run.sh"),
];

fn is_variant_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

fn is_sched_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'))
}

/// `NAME=VALUE` with NAME `[A-Za-z_][A-Za-z0-9_-]*` (VALUE may be empty).
fn is_module_param(s: &str) -> bool {
    let Some((name, _)) = s.split_once('=') else {
        return false;
    };
    let mut c = name.chars();
    matches!(c.next(), Some(f) if f.is_ascii_alphabetic() || f == '_')
        && c.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// The path selectors dm-multipath offers (the modules the guest image has).
pub(crate) const PATH_SELECTORS: &[&str] = &["service-time", "round-robin", "queue-length"];

/// `stack KIND PARAM…`: None for `stack none`; the message of the error.
fn parse_stack(kind: &str, params: &[&str]) -> Result<Option<Stack>, String> {
    match kind {
        "none" => {
            if params.is_empty() {
                Ok(None)
            } else {
                Err("stack none takes no parameters".into())
            }
        }
        "multipath" => {
            for p in params {
                let (n, v) = match p.split_once('=') {
                    Some((n, v)) if !n.is_empty() && !v.is_empty() => (n, v),
                    _ => return Err(format!("stack: bad parameter '{p}' (want NAME=VALUE)")),
                };
                match n {
                    "selector" if PATH_SELECTORS.contains(&v) => {}
                    "selector" => {
                        return Err(format!(
                        "stack: unknown selector '{v}' (want service-time, round-robin or queue-length)"
                    ))
                    }
                    "path_sched" if is_sched_name(v) => {}
                    "path_sched" => return Err(format!("stack: bad path_sched '{v}'")),
                    _ => {
                        return Err(format!(
                            "stack: unknown parameter '{n}' (want selector or path_sched)"
                        ))
                    }
                }
            }
            Ok(Some(Stack {
                kind: kind.to_string(),
                params: params.iter().map(|s| s.to_string()).collect(),
            }))
        }
        other => Err(format!(
            "stack: unknown kind '{other}' (want multipath or none)"
        )),
    }
}

/// Parse scenario text; `file` names it in errors, `name` is the scenario's
/// name (the file stem). The rules and every error message are those of
/// docs/lab-protocol.md, word for word the same as the guest's parser
/// (`guest-scripts/lib/scenario.awk`); `tests/scenario_parsers.rs` holds
/// the two to that.
pub fn parse(text: &str, file: &str, name: &str) -> Result<Scenario, ScenarioError> {
    let mut p = Parser::default();
    let mut lines = 0;
    // lines() drops one trailing CR per line, like the guest's sub(/\r$/, "").
    for (i, raw) in text.lines().enumerate() {
        lines = i + 1;
        let code = raw.find('#').map_or(raw, |p| &raw[..p]);
        let words: Vec<&str> = code.split_whitespace().collect();
        let Some((&directive, args)) = words.split_first() else {
            continue;
        };
        p.line(&Line {
            file,
            no: i + 1,
            directive,
            args,
        })?;
    }
    p.finish(file, name, lines)
}

/// One directive line: where it is, its directive and its arguments.
struct Line<'a> {
    file: &'a str,
    no: usize,
    directive: &'a str,
    args: &'a [&'a str],
}

impl Line<'_> {
    /// A syntax error on this line.
    fn err(&self, message: String) -> ScenarioError {
        ScenarioError::Syntax {
            file: self.file.to_string(),
            line: self.no,
            message,
        }
    }

    /// At least `lo` arguments and, with `hi`, at most `hi`.
    fn want(&self, lo: usize, hi: Option<usize>) -> Result<(), ScenarioError> {
        let d = self.directive;
        if self.args.len() < lo {
            return Err(self.err(format!("{d}: missing argument")));
        }
        if hi.is_some_and(|h| self.args.len() > h) {
            return Err(self.err(format!("{d}: too many arguments")));
        }
        Ok(())
    }

    /// An unsigned decimal integer of at most 9 digits (leading zeros
    /// allowed), >= min and, with a max, <= max.
    fn number(&self, s: &str, min: u64, max: Option<u64>) -> Result<u64, ScenarioError> {
        let d = self.directive;
        if let Some(v) = decimal(s).filter(|&v| v >= min && max.map_or(true, |m| v <= m)) {
            return Ok(v);
        }
        Err(self.err(match max {
            Some(m) => format!("{d}: bad number '{s}' (want an integer from {min} to {m})"),
            None => format!("{d}: bad number '{s}' (want an integer >= {min})"),
        }))
    }

    /// The line's one argument, a number in `min..=max`.
    fn one_number(&self, min: u64, max: Option<u64>) -> Result<u64, ScenarioError> {
        self.want(1, Some(1))?;
        self.number(self.args[0], min, max)
    }
}

/// `s` as an unsigned decimal integer of at most 9 digits, leading zeros
/// allowed (and not counted).
fn decimal(s: &str) -> Option<u64> {
    let digits = s.trim_start_matches('0');
    let ok_form = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && digits.len() <= 9;
    ok_form.then(|| digits.parse::<u64>().unwrap_or(0))
}

/// What the lines so far said.
#[derive(Default)]
struct Parser {
    description: Option<String>,
    disks: Option<u32>,
    queues: Option<u16>,
    vcpus: Option<Vcpus>,
    memory: Option<String>,
    memory_per_vcpu: Option<String>,
    queue_size: Option<u16>,
    kernel_append: Option<String>,
    global: Settings,
    /// (name, line, settings)
    variants: Vec<(String, usize, Settings)>,
}

impl Parser {
    /// Take one line: a scenario-wide directive, a `variant`, or a setting
    /// of the current variant (of every variant before the first).
    fn line(&mut self, l: &Line) -> Result<(), ScenarioError> {
        match l.directive {
            "description" | "disks" | "queues" | "vcpus" | "memory" | "memory_per_vcpu"
            | "kernel_append" | "queue_size" => self.scenario_wide(l),
            "variant" => self.variant(l),
            _ => match self.variants.last_mut() {
                Some((_, _, s)) => setting(s, l),
                None => setting(&mut self.global, l),
            },
        }
    }

    /// A directive allowed only before the first variant.
    fn scenario_wide(&mut self, l: &Line) -> Result<(), ScenarioError> {
        if !self.variants.is_empty() {
            return Err(l.err(format!(
                "{} is only allowed before the first variant",
                l.directive
            )));
        }
        match l.directive {
            "description" => {
                l.want(1, None)?;
                self.description = Some(l.args.join(" "));
            }
            "disks" => self.disks = Some(l.one_number(1, Some(64))? as u32),
            "queues" => self.queues = Some(l.one_number(1, Some(64))? as u16),
            "vcpus" => self.vcpus = Some(vcpus(l)?),
            "memory" => self.memory = Some(size(l, "2G")?),
            "memory_per_vcpu" => self.memory_per_vcpu = Some(size(l, "256M")?),
            "kernel_append" => {
                l.want(1, None)?;
                self.kernel_append = Some(l.args.join(" "));
            }
            // The last scenario-wide directive of `line`: queue_size.
            _ => self.queue_size = Some(queue_size(l)?),
        }
        Ok(())
    }

    /// `variant NAME`: the settings that follow are NAME's.
    fn variant(&mut self, l: &Line) -> Result<(), ScenarioError> {
        l.want(1, Some(1))?;
        let n = l.args[0];
        if !is_variant_name(n) {
            return Err(l.err(format!("variant: bad name '{n}' (want [A-Za-z0-9_.-]+)")));
        }
        if let Some((_, first, _)) = self.variants.iter().find(|(v, _, _)| v == n) {
            return Err(l.err(format!(
                "variant: duplicate name '{n}' (first at line {first})"
            )));
        }
        self.variants
            .push((n.to_string(), l.no, Settings::default()));
        Ok(())
    }

    /// The scenario, once every line is read (`lines` of them).
    fn finish(self, file: &str, name: &str, lines: usize) -> Result<Scenario, ScenarioError> {
        if self.variants.is_empty() {
            return Err(ScenarioError::Syntax {
                file: file.to_string(),
                line: lines.max(1),
                message: "no variants (a scenario needs at least one 'variant NAME' line)"
                    .to_string(),
            });
        }
        let global = self.global;
        let variants = self
            .variants
            .into_iter()
            .map(|(name, _, s)| variant_of(&global, name, s))
            .collect();
        Ok(Scenario {
            name: name.to_string(),
            description: self.description,
            disks: self.disks.unwrap_or(1),
            queues: self.queues,
            vcpus: self.vcpus,
            memory: self.memory,
            memory_per_vcpu: self.memory_per_vcpu,
            queue_size: self.queue_size,
            kernel_append: self.kernel_append,
            variants,
        })
    }
}

/// `vcpus N`, `vcpus host` or `vcpus host:MAX` (N and MAX from 1 to 64).
fn vcpus(l: &Line) -> Result<Vcpus, ScenarioError> {
    l.want(1, Some(1))?;
    let a = l.args[0];
    let count = |s: &str| {
        decimal(s)
            .filter(|n| (1..=u64::from(MAX_VCPUS)).contains(n))
            .map(|n| n as u32)
    };
    let v = match a.strip_prefix("host") {
        Some("") => Some(Vcpus::Host { max: None }),
        Some(rest) => rest
            .strip_prefix(':')
            .and_then(count)
            .map(|m| Vcpus::Host { max: Some(m) }),
        None => count(a).map(Vcpus::Fixed),
    };
    v.ok_or_else(|| {
        l.err(format!(
            "vcpus: bad count '{a}' (want an integer from 1 to 64, host, or host:MAX with MAX from 1 to 64)"
        ))
    })
}

/// `memory SIZE` or `memory_per_vcpu SIZE` (`example` in the error).
fn size(l: &Line, example: &str) -> Result<String, ScenarioError> {
    l.want(1, Some(1))?;
    if !is_memory_size(l.args[0]) {
        return Err(l.err(format!(
            "{}: bad size '{}' (want a number with an optional K, M, G or T suffix, e.g. {example})",
            l.directive, l.args[0]
        )));
    }
    Ok(l.args[0].to_string())
}

/// `queue_size N`: a power of two up to 1024.
fn queue_size(l: &Line) -> Result<u16, ScenarioError> {
    let n = l.one_number(1, Some(1024))?;
    if !n.is_power_of_two() {
        return Err(l.err(format!(
            "queue_size: bad number '{}' (want a power of two from 1 to 1024)",
            l.args[0]
        )));
    }
    Ok(n as u16)
}

/// A setting of the current variant (of every variant before the first),
/// or an unknown directive.
fn setting(s: &mut Settings, l: &Line) -> Result<(), ScenarioError> {
    match l.directive {
        "device" => device(s, l)?,
        "queue_depth" => s.queue_depth = Some(l.one_number(1, None)?),
        "nomerges" => s.nomerges = Some(l.one_number(0, Some(2))?),
        "rq_affinity" => s.rq_affinity = Some(l.one_number(0, Some(2))?),
        "layout" => s.layout = Some(layout(l)?),
        "runtime" => s.runtime = Some(l.one_number(1, None)?),
        "ramp" => s.ramp = Some(l.one_number(0, None)?),
        "target" => s.target = Some(target(l)?),
        "stack" => {
            l.want(1, None)?;
            s.stack = Some(parse_stack(l.args[0], &l.args[1..]).map_err(|m| l.err(m))?);
        }
        "sched" => s.sched = Some(sched(l)?),
        "nr_requests" => s.nr_requests = Some(l.one_number(1, None)?),
        "fio" => fio(s, l)?,
        other => return Err(l.err(format!("unknown directive '{other}'"))),
    }
    Ok(())
}

/// `device NAME=VALUE…`, each NAME one of [`DEVICE_SETTINGS`].
fn device(s: &mut Settings, l: &Line) -> Result<(), ScenarioError> {
    l.want(1, None)?;
    for a in l.args {
        let bad = || l.err(format!("device: bad setting '{a}' (want NAME=VALUE)"));
        let Some((n, v)) = a.split_once('=') else {
            return Err(bad());
        };
        if n.is_empty() || v.is_empty() {
            return Err(bad());
        }
        if !DEVICE_SETTINGS.contains(&n) {
            return Err(l.err(format!(
                "device: unknown setting '{n}' (want one of {})",
                DEVICE_SETTINGS.join(", ")
            )));
        }
        put_setting(&mut s.device, a);
    }
    Ok(())
}

/// `layout all|per-disk`.
fn layout(l: &Line) -> Result<Layout, ScenarioError> {
    l.want(1, Some(1))?;
    match l.args[0] {
        "all" => Ok(Layout::All),
        "per-disk" => Ok(Layout::PerDisk),
        other => Err(l.err(format!(
            "layout: unknown layout '{other}' (want all or per-disk)"
        ))),
    }
}

/// `target KIND PARAM…`.
fn target(l: &Line) -> Result<Target, ScenarioError> {
    l.want(1, None)?;
    let (kind, params) = (l.args[0], &l.args[1..]);
    match kind {
        "virtio" if !params.is_empty() => {
            return Err(l.err("target virtio takes no parameters".into()))
        }
        "virtio" => {}
        "scsi_debug" | "null_blk" => {
            if let Some(p) = params.iter().find(|p| !is_module_param(p)) {
                return Err(l.err(format!(
                    "target: bad module parameter '{p}' (want NAME=VALUE)"
                )));
            }
        }
        other => {
            return Err(l.err(format!(
                "target: unknown kind '{other}' (want virtio, scsi_debug or null_blk)"
            )))
        }
    }
    Ok(Target {
        kind: kind.to_string(),
        params: params.iter().map(|s| s.to_string()).collect(),
    })
}

/// `sched NAME`.
fn sched(l: &Line) -> Result<String, ScenarioError> {
    l.want(1, Some(1))?;
    if !is_sched_name(l.args[0]) {
        return Err(l.err(format!("sched: bad name '{}'", l.args[0])));
    }
    Ok(l.args[0].to_string())
}

/// `fio ARG…`, refusing the options run.sh sets itself.
fn fio(s: &mut Settings, l: &Line) -> Result<(), ScenarioError> {
    l.want(1, None)?;
    for a in l.args {
        let Some(opt) = a.strip_prefix("--").or_else(|| a.strip_prefix('-')) else {
            continue;
        };
        if !opt.starts_with(|c: char| c.is_ascii_alphabetic()) {
            continue;
        }
        let opt = opt.split('=').next().unwrap_or(opt);
        if let Some((_, from)) = RESERVED_FIO.iter().find(|(o, _)| *o == opt) {
            return Err(l.err(format!(
                "fio: option --{opt} is set by run.sh (from {from})"
            )));
        }
    }
    s.fio_args.extend(l.args.iter().map(|s| s.to_string()));
    Ok(())
}

/// Variant `name` with settings `s`: each unset one from the globals, else
/// its default.
fn variant_of(global: &Settings, name: String, s: Settings) -> Variant {
    let mut fio_args = global.fio_args.clone();
    fio_args.extend(s.fio_args);
    Variant {
        name,
        target: s
            .target
            .or_else(|| global.target.clone())
            .unwrap_or(Target {
                kind: "virtio".to_string(),
                params: Vec::new(),
            }),
        stack: s.stack.or_else(|| global.stack.clone()).flatten(),
        sched: s.sched.or_else(|| global.sched.clone()),
        nr_requests: s.nr_requests.or(global.nr_requests),
        queue_depth: s.queue_depth.or(global.queue_depth),
        nomerges: s.nomerges.or(global.nomerges),
        rq_affinity: s.rq_affinity.or(global.rq_affinity),
        device: merge_settings(&global.device, &s.device),
        layout: s.layout.or(global.layout).unwrap_or_default(),
        runtime: s.runtime.or(global.runtime).unwrap_or(DEFAULT_RUNTIME),
        ramp: s.ramp.or(global.ramp).unwrap_or(0),
        fio_args,
    }
}

/// Load a scenario by name (from `dir`) or by path (anything with a `/` or
/// ending in `.scn`).
pub(crate) fn load(name_or_path: &str, dir: &Path) -> Result<(Scenario, PathBuf), ScenarioError> {
    let path = if name_or_path.contains('/') || name_or_path.ends_with(".scn") {
        PathBuf::from(name_or_path)
    } else {
        let p = dir.join(format!("{name_or_path}.scn"));
        if !p.exists() {
            return Err(ScenarioError::Unknown {
                name: name_or_path.to_string(),
                dir: dir.to_path_buf(),
                available: available(dir).join(", "),
            });
        }
        p
    };
    let text = std::fs::read_to_string(&path).map_err(|source| ScenarioError::Read {
        path: path.clone(),
        source,
    })?;
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let scenario = parse(&text, &path.display().to_string(), &stem)?;
    Ok((scenario, path))
}

/// Names of the scenarios in `dir`, sorted.
pub(crate) fn available(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| {
                    let p = e.path();
                    if p.extension()? != "scn" {
                        return None;
                    }
                    Some(p.file_stem()?.to_string_lossy().into_owned())
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str) -> Result<Scenario, ScenarioError> {
        parse(text, "t.scn", "t")
    }

    fn line_of(e: ScenarioError) -> (usize, String) {
        match e {
            ScenarioError::Syntax { line, message, .. } => (line, message),
            other => panic!("unexpected {other}"),
        }
    }

    #[test]
    fn globals_fold_into_variants() {
        let s = p("# c\ndescription a b  c\ndisks 3\nqueues 2\nruntime 7\nsched none\n\
                   fio --rw=randread --bs=4k\n\nvariant one\nvariant two # x\n  sched mq-deadline\n  \
                   runtime 3\n  fio --numjobs=2\n  target null_blk shared_tags=1 submit_queues=@NCPU@\n")
            .unwrap();
        assert_eq!(s.description.as_deref(), Some("a b c"));
        assert_eq!(s.disks, 3);
        assert_eq!(s.queues, Some(2));
        assert_eq!(s.variants.len(), 2);
        let (a, b) = (&s.variants[0], &s.variants[1]);
        assert_eq!(a.name, "one");
        assert_eq!(a.sched.as_deref(), Some("none"));
        assert_eq!(a.runtime, 7);
        assert_eq!(a.target.kind, "virtio");
        assert_eq!(a.fio_args, vec!["--rw=randread", "--bs=4k"]);
        assert_eq!(b.sched.as_deref(), Some("mq-deadline"));
        assert_eq!(b.runtime, 3);
        assert_eq!(b.fio_args, vec!["--rw=randread", "--bs=4k", "--numjobs=2"]);
        assert_eq!(b.target.kind, "null_blk");
        assert_eq!(
            b.target.params,
            vec!["shared_tags=1", "submit_queues=@NCPU@"]
        );
        assert!(s.uses_virtio());
    }

    #[test]
    fn defaults() {
        let s = p("variant v\n").unwrap();
        assert_eq!(s.disks, 1);
        assert_eq!(s.queues, None);
        assert_eq!(s.variants[0].runtime, DEFAULT_RUNTIME);
        assert_eq!(s.variants[0].ramp, 0);
        assert_eq!(s.variants[0].sched, None);
    }

    #[test]
    fn errors_name_the_line() {
        let cases: &[(&str, usize, &str)] = &[
            ("bogus 1\nvariant v\n", 1, "unknown directive 'bogus'"),
            ("variant v\nruntime\n", 2, "runtime: missing argument"),
            (
                "runtime x\nvariant v\n",
                1,
                "runtime: bad number 'x' (want an integer >= 1)",
            ),
            (
                "runtime +5\nvariant v\n",
                1,
                "runtime: bad number '+5' (want an integer >= 1)",
            ),
            (
                "runtime 0\nvariant v\n",
                1,
                "runtime: bad number '0' (want an integer >= 1)",
            ),
            (
                "variant v\nvariant v\n",
                2,
                "variant: duplicate name 'v' (first at line 1)",
            ),
            (
                "# only\ndisks 2\n",
                2,
                "no variants (a scenario needs at least one 'variant NAME' line)",
            ),
            ("", 1, "no variants"),
            (
                "variant a/b\n",
                1,
                "variant: bad name 'a/b' (want [A-Za-z0-9_.-]+)",
            ),
            (
                "variant v\ndisks 2\n",
                2,
                "disks is only allowed before the first variant",
            ),
            (
                "disks 0\nvariant v\n",
                1,
                "disks: bad number '0' (want an integer from 1 to 64)",
            ),
            (
                "disks 65\nvariant v\n",
                1,
                "disks: bad number '65' (want an integer from 1 to 64)",
            ),
            (
                "target nvme\nvariant v\n",
                1,
                "target: unknown kind 'nvme' (want virtio, scsi_debug or null_blk)",
            ),
            (
                "target null_blk foo\nvariant v\n",
                1,
                "target: bad module parameter 'foo' (want NAME=VALUE)",
            ),
            (
                "target virtio x=1\nvariant v\n",
                1,
                "target virtio takes no parameters",
            ),
            (
                "sched mq.deadline\nvariant v\n",
                1,
                "sched: bad name 'mq.deadline'",
            ),
            ("fio\nvariant v\n", 1, "fio: missing argument"),
            (
                "fio --runtime=3\nvariant v\n",
                1,
                "fio: option --runtime is set by run.sh (from the runtime directive)",
            ),
            (
                "fio -name=x\nvariant v\n",
                1,
                "fio: option --name is set by run.sh (from the variant name)",
            ),
            ("runtime 1 2\nvariant v\n", 1, "runtime: too many arguments"),
        ];
        for (text, line, msg) in cases {
            let (l, m) = line_of(p(text).unwrap_err());
            assert_eq!(l, *line, "{text:?}: {m}");
            assert!(m.starts_with(msg), "{text:?}: {m}");
        }
        // Leading zeros are decimal; CRs and comments are ignored.
        let s = p("disks 012\r\nvariant v # c\r\n").unwrap();
        assert_eq!(s.disks, 12);
    }

    #[test]
    fn vcpus_are_a_count_or_the_hosts_and_memory_may_grow_with_them() {
        let vcpus = |arg: &str| p(&format!("vcpus {arg}\nvariant v\n")).map(|s| s.vcpus);
        let host = |max| Some(Some(Vcpus::Host { max }));
        assert_eq!(vcpus("16").ok(), Some(Some(Vcpus::Fixed(16))));
        assert_eq!(vcpus("host").ok(), host(None));
        assert_eq!(vcpus("host:48").ok(), host(Some(48)));
        assert_eq!(vcpus("host:064").ok(), host(Some(64)));
        let bad = "(want an integer from 1 to 64, host, or host:MAX with MAX from 1 to 64)";
        for arg in [
            "0", "65", "host:0", "host:65", "host:", "hosts", "host:x", "HOST", "-1",
        ] {
            let (l, m) = line_of(vcpus(arg).unwrap_err());
            assert_eq!((l, m), (1, format!("vcpus: bad count '{arg}' {bad}")));
        }
        let s = p("memory 2G\nmemory_per_vcpu 128M\nvariant v\n").unwrap();
        assert_eq!(
            (s.memory.as_deref(), s.memory_per_vcpu.as_deref()),
            (Some("2G"), Some("128M"))
        );
        let (l, m) = line_of(p("memory_per_vcpu 0\nvariant v\n").unwrap_err());
        assert_eq!(
            (l, m.as_str()),
            (
                1,
                "memory_per_vcpu: bad size '0' (want a number with an optional K, M, G or T suffix, e.g. 256M)"
            )
        );
        let (l, m) = line_of(p("variant v\nmemory_per_vcpu 1G\n").unwrap_err());
        assert_eq!(
            (l, m.as_str()),
            (
                2,
                "memory_per_vcpu is only allowed before the first variant"
            )
        );
    }

    #[test]
    fn unknown_name_lists_available() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.scn"), "variant v\n").unwrap();
        let e = load("nope", dir.path()).unwrap_err().to_string();
        assert!(e.contains("\"nope\"") && e.contains("available: a"), "{e}");
        let (s, _) = load("a", dir.path()).unwrap();
        assert_eq!(s.name, "a");
    }
}
