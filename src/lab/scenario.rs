//! Scenario files (`guest-scripts/scenarios/NAME.scn`): what the guest runs
//! and how many disks the host must serve for it.
//!
//! The format is documented in `docs/lab-protocol.md`; the guest parses the
//! same files with `guest-scripts/run.sh` (awk), and `tests/guest_scripts.rs`
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

pub(crate) use crate::record::scenario::{Layout, Scenario, Stack, Target, Variant};

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
/// values are checked by the host (`lab::settings`), not by the parsers.
pub const DEVICE_SETTINGS: &[&str] = &[
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
pub const PATH_SELECTORS: &[&str] = &["service-time", "round-robin", "queue-length"];

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
/// (`guest-scripts/lib/scenario.awk`); `tests/guest_scripts.rs` holds
/// the two to that.
pub fn parse(text: &str, file: &str, name: &str) -> Result<Scenario, ScenarioError> {
    let err = |line: usize, message: String| ScenarioError::Syntax {
        file: file.to_string(),
        line,
        message,
    };
    let mut description: Option<String> = None;
    let mut disks: u32 = 1;
    let mut queues: Option<u16> = None;
    let mut vcpus: Option<u32> = None;
    let mut memory: Option<String> = None;
    let mut queue_size: Option<u16> = None;
    let mut global = Settings::default();
    // (name, line, settings)
    let mut variants: Vec<(String, usize, Settings)> = Vec::new();
    let mut lines = 0;

    // lines() drops one trailing CR per line, like the guest's sub(/\r$/, "").
    for (i, raw) in text.lines().enumerate() {
        let lineno = i + 1;
        lines = lineno;
        let line = match raw.find('#') {
            Some(p) => &raw[..p],
            None => raw,
        };
        let words: Vec<&str> = line.split_whitespace().collect();
        let Some((&d, args)) = words.split_first() else {
            continue;
        };
        let in_variant = !variants.is_empty();
        let global_only = || -> Result<(), ScenarioError> {
            if in_variant {
                Err(err(
                    lineno,
                    format!("{d} is only allowed before the first variant"),
                ))
            } else {
                Ok(())
            }
        };
        // want_args(lo, hi): hi = None for "any number".
        let want = |lo: usize, hi: Option<usize>| -> Result<(), ScenarioError> {
            if args.len() < lo {
                return Err(err(lineno, format!("{d}: missing argument")));
            }
            if hi.is_some_and(|h| args.len() > h) {
                return Err(err(lineno, format!("{d}: too many arguments")));
            }
            Ok(())
        };
        // An unsigned decimal integer of at most 9 digits (leading zeros
        // allowed), >= min and, with a max, <= max.
        let number = |s: &str, min: u64, max: Option<u64>| -> Result<u64, ScenarioError> {
            let digits = s.trim_start_matches('0');
            let ok_form =
                !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && digits.len() <= 9;
            let v = if ok_form {
                digits.parse::<u64>().unwrap_or(0)
            } else {
                0
            };
            let ok = ok_form && v >= min && max.map_or(true, |m| v <= m);
            if ok {
                return Ok(v);
            }
            Err(err(
                lineno,
                match max {
                    Some(m) => format!("{d}: bad number '{s}' (want an integer from {min} to {m})"),
                    None => format!("{d}: bad number '{s}' (want an integer >= {min})"),
                },
            ))
        };
        let settings = match variants.last_mut() {
            Some((_, _, s)) => s,
            None => &mut global,
        };
        match d {
            "description" => {
                global_only()?;
                want(1, None)?;
                description = Some(args.join(" "));
            }
            "disks" => {
                global_only()?;
                want(1, Some(1))?;
                disks = number(args[0], 1, Some(64))? as u32;
            }
            "queues" => {
                global_only()?;
                want(1, Some(1))?;
                queues = Some(number(args[0], 1, Some(64))? as u16);
            }
            "vcpus" => {
                global_only()?;
                want(1, Some(1))?;
                vcpus = Some(number(args[0], 1, Some(64))? as u32);
            }
            "memory" => {
                global_only()?;
                want(1, Some(1))?;
                if !is_memory_size(args[0]) {
                    return Err(err(
                        lineno,
                        format!(
                            "memory: bad size '{}' (want a number with an optional K, M, G or T suffix, e.g. 2G)",
                            args[0]
                        ),
                    ));
                }
                memory = Some(args[0].to_string());
            }
            "queue_size" => {
                global_only()?;
                want(1, Some(1))?;
                let n = number(args[0], 1, Some(1024))?;
                if !n.is_power_of_two() {
                    return Err(err(
                        lineno,
                        format!(
                            "queue_size: bad number '{}' (want a power of two from 1 to 1024)",
                            args[0]
                        ),
                    ));
                }
                queue_size = Some(n as u16);
            }
            "device" => {
                want(1, None)?;
                for a in args {
                    let Some((n, v)) = a.split_once('=') else {
                        return Err(err(
                            lineno,
                            format!("device: bad setting '{a}' (want NAME=VALUE)"),
                        ));
                    };
                    if n.is_empty() || v.is_empty() {
                        return Err(err(
                            lineno,
                            format!("device: bad setting '{a}' (want NAME=VALUE)"),
                        ));
                    }
                    if !DEVICE_SETTINGS.contains(&n) {
                        return Err(err(
                            lineno,
                            format!(
                                "device: unknown setting '{n}' (want one of {})",
                                DEVICE_SETTINGS.join(", ")
                            ),
                        ));
                    }
                    put_setting(&mut settings.device, a);
                }
            }
            "queue_depth" => {
                want(1, Some(1))?;
                settings.queue_depth = Some(number(args[0], 1, None)?);
            }
            "nomerges" => {
                want(1, Some(1))?;
                settings.nomerges = Some(number(args[0], 0, Some(2))?);
            }
            "rq_affinity" => {
                want(1, Some(1))?;
                settings.rq_affinity = Some(number(args[0], 0, Some(2))?);
            }
            "layout" => {
                want(1, Some(1))?;
                settings.layout = Some(match args[0] {
                    "all" => Layout::All,
                    "per-disk" => Layout::PerDisk,
                    other => {
                        return Err(err(
                            lineno,
                            format!("layout: unknown layout '{other}' (want all or per-disk)"),
                        ))
                    }
                });
            }
            "runtime" => {
                want(1, Some(1))?;
                settings.runtime = Some(number(args[0], 1, None)?);
            }
            "ramp" => {
                want(1, Some(1))?;
                settings.ramp = Some(number(args[0], 0, None)?);
            }
            "target" => {
                want(1, None)?;
                let kind = args[0];
                let params = &args[1..];
                match kind {
                    "virtio" => {
                        if !params.is_empty() {
                            return Err(err(lineno, "target virtio takes no parameters".into()));
                        }
                    }
                    "scsi_debug" | "null_blk" => {
                        if let Some(p) = params.iter().find(|p| !is_module_param(p)) {
                            return Err(err(
                                lineno,
                                format!("target: bad module parameter '{p}' (want NAME=VALUE)"),
                            ));
                        }
                    }
                    other => {
                        return Err(err(
                            lineno,
                            format!(
                            "target: unknown kind '{other}' (want virtio, scsi_debug or null_blk)"
                        ),
                        ))
                    }
                }
                settings.target = Some(Target {
                    kind: kind.to_string(),
                    params: params.iter().map(|s| s.to_string()).collect(),
                });
            }
            "stack" => {
                want(1, None)?;
                settings.stack =
                    Some(parse_stack(args[0], &args[1..]).map_err(|m| err(lineno, m))?);
            }
            "sched" => {
                want(1, Some(1))?;
                if !is_sched_name(args[0]) {
                    return Err(err(lineno, format!("sched: bad name '{}'", args[0])));
                }
                settings.sched = Some(args[0].to_string());
            }
            "nr_requests" => {
                want(1, Some(1))?;
                settings.nr_requests = Some(number(args[0], 1, None)?);
            }
            "fio" => {
                want(1, None)?;
                for a in args {
                    let Some(opt) = a.strip_prefix("--").or_else(|| a.strip_prefix('-')) else {
                        continue;
                    };
                    if !opt.starts_with(|c: char| c.is_ascii_alphabetic()) {
                        continue;
                    }
                    let opt = opt.split('=').next().unwrap_or(opt);
                    if let Some((_, from)) = RESERVED_FIO.iter().find(|(o, _)| *o == opt) {
                        return Err(err(
                            lineno,
                            format!("fio: option --{opt} is set by run.sh (from {from})"),
                        ));
                    }
                }
                settings.fio_args.extend(args.iter().map(|s| s.to_string()));
            }
            "variant" => {
                want(1, Some(1))?;
                let n = args[0];
                if !is_variant_name(n) {
                    return Err(err(
                        lineno,
                        format!("variant: bad name '{n}' (want [A-Za-z0-9_.-]+)"),
                    ));
                }
                if let Some((_, first, _)) = variants.iter().find(|(v, _, _)| v == n) {
                    return Err(err(
                        lineno,
                        format!("variant: duplicate name '{n}' (first at line {first})"),
                    ));
                }
                variants.push((n.to_string(), lineno, Settings::default()));
            }
            other => return Err(err(lineno, format!("unknown directive '{other}'"))),
        }
    }
    if variants.is_empty() {
        return Err(err(
            lines.max(1),
            "no variants (a scenario needs at least one 'variant NAME' line)".to_string(),
        ));
    }
    let variants = variants
        .into_iter()
        .map(|(name, _, s)| {
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
        })
        .collect();
    Ok(Scenario {
        name: name.to_string(),
        description,
        disks,
        queues,
        vcpus,
        memory,
        queue_size,
        variants,
    })
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
    fn unknown_name_lists_available() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.scn"), "variant v\n").unwrap();
        let e = load("nope", dir.path()).unwrap_err().to_string();
        assert!(e.contains("\"nope\"") && e.contains("available: a"), "{e}");
        let (s, _) = load("a", dir.path()).unwrap();
        assert_eq!(s.name, "a");
    }
}
