//! Scenario files (`guest-scripts/scenarios/NAME.scn`): what the guest runs
//! and how many disks the host must serve for it.
//!
//! The format is documented in `docs/lab-protocol.md`; the guest parses the
//! same files with `guest-scripts/run.sh` (awk), and `tests/guest_scripts.rs`
//! checks both parsers agree on every shipped scenario. The host parses them
//! to refuse a malformed file before booting anything and to learn the
//! `disks`/`queues` the scenario wants.

use std::path::{Path, PathBuf};

use serde::Serialize;
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

/// Where a variant's IO goes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Target {
    /// `virtio`, `scsi_debug` or `null_blk`.
    pub kind: String,
    /// Module parameters (`NAME=VALUE`), for the module targets.
    pub params: Vec<String>,
}

/// One measured case of a scenario, with the globals folded in.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Variant {
    pub name: String,
    pub target: Target,
    pub sched: Option<String>,
    pub nr_requests: Option<u64>,
    pub runtime: u64,
    pub ramp: u64,
    pub fio_args: Vec<String>,
}

/// A parsed scenario file.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Scenario {
    pub name: String,
    pub description: String,
    /// Disks the host serves (default 1).
    pub disks: u32,
    /// Virtqueues per disk, when the scenario fixes it.
    pub queues: Option<u16>,
    pub variants: Vec<Variant>,
}

impl Scenario {
    /// Does any variant use the host's virtio disks?
    pub fn uses_virtio(&self) -> bool {
        self.variants.iter().any(|v| v.target.kind == "virtio")
    }
}

/// Settings that may appear globally or per variant.
#[derive(Debug, Clone, Default)]
struct Settings {
    target: Option<Target>,
    sched: Option<String>,
    nr_requests: Option<u64>,
    runtime: Option<u64>,
    ramp: Option<u64>,
    fio_args: Vec<String>,
}

const DEFAULT_RUNTIME: u64 = 10;

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// Parse scenario text; `file` names it in errors, `name` is the scenario's
/// name (the file stem).
pub fn parse(text: &str, file: &str, name: &str) -> Result<Scenario, ScenarioError> {
    let err = |line: usize, message: String| ScenarioError::Syntax {
        file: file.to_string(),
        line,
        message,
    };
    let mut description = String::new();
    let mut disks: u32 = 1;
    let mut queues: Option<u16> = None;
    let mut global = Settings::default();
    // (name, line, settings)
    let mut variants: Vec<(String, usize, Settings)> = Vec::new();

    for (i, raw) in text.lines().enumerate() {
        let lineno = i + 1;
        let line = match raw.find('#') {
            Some(p) => &raw[..p],
            None => raw,
        };
        let words: Vec<&str> = line.split_whitespace().collect();
        let Some((&directive, args)) = words.split_first() else {
            continue;
        };
        let in_variant = !variants.is_empty();
        let number = |what: &str| -> Result<u64, ScenarioError> {
            match args {
                [] => Err(err(lineno, format!("{what}: missing argument"))),
                [v] => v.parse::<u64>().map_err(|_| {
                    err(
                        lineno,
                        format!("{what}: {v:?} is not a non-negative integer"),
                    )
                }),
                _ => Err(err(lineno, format!("{what}: expected one argument"))),
            }
        };
        let global_only = |what: &str| -> Result<(), ScenarioError> {
            if in_variant {
                Err(err(
                    lineno,
                    format!("{what} is a global directive; put it before the first variant"),
                ))
            } else {
                Ok(())
            }
        };
        let settings = match variants.last_mut() {
            Some((_, _, s)) => s,
            None => &mut global,
        };
        match directive {
            "description" => {
                global_only("description")?;
                description = args.join(" ");
            }
            "disks" => {
                global_only("disks")?;
                let n = number("disks")?;
                if n == 0 || n > 64 {
                    return Err(err(lineno, format!("disks: {n} is out of range 1..=64")));
                }
                disks = n as u32;
            }
            "queues" => {
                global_only("queues")?;
                let n = number("queues")?;
                if n == 0 || n > 64 {
                    return Err(err(lineno, format!("queues: {n} is out of range 1..=64")));
                }
                queues = Some(n as u16);
            }
            "runtime" => {
                let n = number("runtime")?;
                if n == 0 {
                    return Err(err(lineno, "runtime: must be at least 1".to_string()));
                }
                settings.runtime = Some(n);
            }
            "ramp" => settings.ramp = Some(number("ramp")?),
            "nr_requests" => {
                let n = number("nr_requests")?;
                if n == 0 {
                    return Err(err(lineno, "nr_requests: must be at least 1".to_string()));
                }
                settings.nr_requests = Some(n);
            }
            "sched" => match args {
                [s] if valid_name(s) => settings.sched = Some(s.to_string()),
                [s] => return Err(err(lineno, format!("sched: invalid scheduler name {s:?}"))),
                [] => return Err(err(lineno, "sched: missing argument".to_string())),
                _ => return Err(err(lineno, "sched: expected one argument".to_string())),
            },
            "target" => {
                let Some((&kind, params)) = args.split_first() else {
                    return Err(err(lineno, "target: missing argument".to_string()));
                };
                match kind {
                    "virtio" => {
                        if !params.is_empty() {
                            return Err(err(lineno, "target virtio takes no parameters".into()));
                        }
                    }
                    "scsi_debug" | "null_blk" => {
                        if let Some(p) = params.iter().find(|p| {
                            let mut kv = p.splitn(2, '=');
                            let k = kv.next().unwrap_or("");
                            kv.next().is_none() || k.is_empty()
                        }) {
                            return Err(err(
                                lineno,
                                format!("target {kind}: parameter {p:?} is not NAME=VALUE"),
                            ));
                        }
                    }
                    other => {
                        return Err(err(
                            lineno,
                            format!(
                                "target: unknown target {other:?} (virtio, scsi_debug or null_blk)"
                            ),
                        ))
                    }
                }
                settings.target = Some(Target {
                    kind: kind.to_string(),
                    params: params.iter().map(|s| s.to_string()).collect(),
                });
            }
            "fio" => {
                if args.is_empty() {
                    return Err(err(lineno, "fio: missing argument".to_string()));
                }
                settings.fio_args.extend(args.iter().map(|s| s.to_string()));
            }
            "variant" => match args {
                [n] if valid_name(n) => {
                    if variants.iter().any(|(v, _, _)| v == n) {
                        return Err(err(lineno, format!("variant {n:?} defined twice")));
                    }
                    variants.push((n.to_string(), lineno, Settings::default()));
                }
                [n] => {
                    return Err(err(
                        lineno,
                        format!("variant: invalid name {n:?} (letters, digits, _ . -)"),
                    ))
                }
                [] => return Err(err(lineno, "variant: missing argument".to_string())),
                _ => return Err(err(lineno, "variant: expected one argument".to_string())),
            },
            other => return Err(err(lineno, format!("unknown directive {other:?}"))),
        }
    }
    if variants.is_empty() {
        return Err(err(
            text.lines().count().max(1),
            "no variant (a scenario needs at least one `variant NAME`)".to_string(),
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
                sched: s.sched.or_else(|| global.sched.clone()),
                nr_requests: s.nr_requests.or(global.nr_requests),
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
        variants,
    })
}

/// Load a scenario by name (from `dir`) or by path (anything with a `/` or
/// ending in `.scn`).
pub fn load(name_or_path: &str, dir: &Path) -> Result<(Scenario, PathBuf), ScenarioError> {
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
pub fn available(dir: &Path) -> Vec<String> {
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
        assert_eq!(s.description, "a b c");
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
            ("bogus 1\nvariant v\n", 1, "unknown directive"),
            ("variant v\nruntime\n", 2, "missing argument"),
            ("runtime x\nvariant v\n", 1, "not a non-negative integer"),
            ("runtime -1\nvariant v\n", 1, "not a non-negative integer"),
            ("variant v\nvariant v\n", 2, "defined twice"),
            ("# only\ndisks 2\n", 2, "no variant"),
            ("variant a/b\n", 1, "invalid name"),
            ("variant v\ndisks 2\n", 2, "global directive"),
            ("disks 0\nvariant v\n", 1, "out of range"),
            ("target nvme\nvariant v\n", 1, "unknown target"),
            ("target null_blk foo\nvariant v\n", 1, "not NAME=VALUE"),
            ("fio\nvariant v\n", 1, "missing argument"),
            ("runtime 1 2\nvariant v\n", 1, "one argument"),
        ];
        for (text, line, msg) in cases {
            let (l, m) = line_of(p(text).unwrap_err());
            assert_eq!(l, *line, "{text:?}: {m}");
            assert!(m.contains(msg), "{text:?}: {m}");
        }
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
