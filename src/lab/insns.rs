//! Guest instruction counts from blklab's QEMU TCG plugin
//! (`images/qemu-plugin/blklab-insns.c`): building the plugin, asking it for
//! counter dumps at a variant's SYNC markers, the difference of two dumps,
//! symbolisation against the kernel's `System.map`, and the record of a
//! profile summed into the symbol groups of [`crate::record::symbol_groups`].
//!
//! The window: the runner asks for a dump when the guest prints `BLKLAB-SYNC
//! n begin` and again at `BLKLAB-SYNC n end`, before answering either, while
//! the guest waits on its console. The difference is exactly what the guest
//! executed for that variant (fio's start-up and exit included, boot and
//! firmware excluded), so per-IO figures divide it by the block layer's IO
//! count of the same window.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use thiserror::Error;

pub(crate) use crate::record::instructions::{
    InsnsWindow, Instructions, VcpuInsns, ENTRY_FUNCTIONS,
};
use crate::record::symbol_groups::{base_name, group_of, OUTSIDE};

#[derive(Debug, Error)]
pub enum InsnsError {
    #[error("cannot build the QEMU plugin: {} is missing", .0.display())]
    BuildScriptMissing(PathBuf),
    #[error("cannot build the QEMU plugin: cannot run {}: {source}", script.display())]
    BuildScriptRun {
        script: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot build the QEMU plugin: {last} ({status})")]
    BuildFailed { last: String, status: String },
    #[error(
        "cannot build the QEMU plugin: {} printed no plugin path (stderr: {stderr})",
        script.display()
    )]
    BuildNoPath { script: PathBuf, stderr: String },
    #[error("cannot reach the instruction-count plugin at {path}: {source}")]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the instruction-count plugin at {path} failed: {why}")]
    Plugin { path: PathBuf, why: String },
    #[error("the instruction-count plugin at {path} failed: {source}")]
    PluginIo {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}: {why}")]
    Parse {
        path: PathBuf,
        line: usize,
        why: String,
    },
}

/// Build (or find in the cache) the plugin for `qemu` with
/// `images/build-qemu-plugin.sh`; returns the shared object's path.
pub(crate) fn build_plugin(
    lab_dir: &Path,
    cache: Option<&Path>,
    qemu: &str,
) -> Result<PathBuf, InsnsError> {
    let script = lab_dir.join("images/build-qemu-plugin.sh");
    if !script.is_file() {
        return Err(InsnsError::BuildScriptMissing(script));
    }
    let mut cmd = Command::new("sh");
    cmd.arg(&script).arg("--qemu").arg(qemu);
    if let Some(c) = cache {
        cmd.arg("--cache").arg(c);
    }
    cmd.stderr(std::process::Stdio::piped());
    let out = cmd.output().map_err(|source| InsnsError::BuildScriptRun {
        script: script.clone(),
        source,
    })?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        let last = stderr
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no output");
        return Err(InsnsError::BuildFailed {
            last: last.to_string(),
            status: out.status.to_string(),
        });
    }
    let path = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or("")
        .trim()
        .to_string();
    if path.is_empty() || !Path::new(&path).is_file() {
        return Err(InsnsError::BuildNoPath {
            script,
            stderr: stderr.trim().to_string(),
        });
    }
    Ok(PathBuf::from(path))
}

/// The control socket of a running plugin.
pub(crate) struct Control {
    path: PathBuf,
}

impl Control {
    pub(crate) fn new(path: PathBuf) -> Control {
        Control { path }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Ask the plugin to write its counters to `file` and wait for it.
    pub(crate) fn dump(&self, file: &Path) -> Result<Dump, InsnsError> {
        let mut s = UnixStream::connect(&self.path).map_err(|source| InsnsError::Connect {
            path: self.path.clone(),
            source,
        })?;
        let io = |source| InsnsError::PluginIo {
            path: self.path.clone(),
            source,
        };
        s.set_read_timeout(Some(Duration::from_secs(60)))
            .map_err(io)?;
        writeln!(s, "dump {}", file.display()).map_err(io)?;
        let mut line = String::new();
        BufReader::new(&s).read_line(&mut line).map_err(io)?;
        let line = line.trim();
        if line.strip_prefix("ok ").is_none() {
            return Err(InsnsError::Plugin {
                path: self.path.clone(),
                why: if line.is_empty() {
                    "no answer to the dump request".into()
                } else {
                    line.to_string()
                },
            });
        }
        let d = Dump::read(file)?;
        let _ = std::fs::remove_file(file);
        Ok(d)
    }
}

/// One counter dump: per vCPU kernel/user instructions, and per kernel
/// translation-block start address (instructions, executions).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Dump {
    pub vcpus: Vec<(u64, u64)>,
    pub blocks: BTreeMap<u64, (u64, u64)>,
}

impl Dump {
    pub fn read(path: &Path) -> Result<Dump, InsnsError> {
        let text = std::fs::read_to_string(path).map_err(|source| InsnsError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Dump::parse(&text, path)
    }

    pub fn parse(text: &str, path: &Path) -> Result<Dump, InsnsError> {
        let err = |line: usize, why: &str| InsnsError::Parse {
            path: path.to_path_buf(),
            line,
            why: why.to_string(),
        };
        let mut d = Dump::default();
        let mut ended = false;
        let mut lines = text.lines().enumerate();
        match lines.next() {
            Some((_, "blklab-insns 1")) => {}
            _ => return Err(err(1, "not a blklab-insns 1 dump")),
        }
        let num = |s: Option<&str>, radix: u32, line: usize| -> Result<u64, InsnsError> {
            s.and_then(|x| u64::from_str_radix(x, radix).ok())
                .ok_or_else(|| err(line, "bad number"))
        };
        for (i, l) in lines {
            let n = i + 1;
            let mut w = l.split_ascii_whitespace();
            match w.next() {
                Some("vcpus") => {}
                Some("vcpu") => {
                    let idx = num(w.next(), 10, n)? as usize;
                    if w.next() != Some("kernel") {
                        return Err(err(n, "want 'vcpu I kernel K user U'"));
                    }
                    let k = num(w.next(), 10, n)?;
                    if w.next() != Some("user") {
                        return Err(err(n, "want 'vcpu I kernel K user U'"));
                    }
                    let u = num(w.next(), 10, n)?;
                    if d.vcpus.len() <= idx {
                        d.vcpus.resize(idx + 1, (0, 0));
                    }
                    d.vcpus[idx] = (k, u);
                }
                Some("tb") => {
                    let a = num(w.next(), 16, n)?;
                    let ins = num(w.next(), 10, n)?;
                    let ex = num(w.next(), 10, n)?;
                    d.blocks.insert(a, (ins, ex));
                }
                Some("end") => ended = true,
                _ => return Err(err(n, "unknown record")),
            }
        }
        if !ended {
            return Err(err(text.lines().count(), "truncated dump (no 'end')"));
        }
        Ok(d)
    }

    /// `self − earlier` (counters only grow; a block missing earlier is new).
    pub fn since(&self, earlier: &Dump) -> Dump {
        let vcpus = self
            .vcpus
            .iter()
            .enumerate()
            .map(|(i, (k, u))| {
                let (k0, u0) = earlier.vcpus.get(i).copied().unwrap_or((0, 0));
                (k.saturating_sub(k0), u.saturating_sub(u0))
            })
            .collect();
        let blocks = self
            .blocks
            .iter()
            .filter_map(|(a, (i, e))| {
                let (i0, e0) = earlier.blocks.get(a).copied().unwrap_or((0, 0));
                let (di, de) = (i.saturating_sub(i0), e.saturating_sub(e0));
                (de > 0 || di > 0).then_some((*a, (di, de)))
            })
            .collect();
        Dump { vcpus, blocks }
    }

    pub fn kernel(&self) -> u64 {
        self.vcpus.iter().map(|v| v.0).sum()
    }

    pub fn user(&self) -> u64 {
        self.vcpus.iter().map(|v| v.1).sum()
    }
}

/// The kernel's text symbols from its System.map.
#[derive(Debug, Clone)]
pub struct SymbolMap {
    /// (address, name), sorted by address.
    syms: Vec<(u64, String)>,
    /// End of the kernel's text (`_etext`), when the map has it.
    etext: Option<u64>,
}

impl SymbolMap {
    pub fn read(path: &Path) -> Result<SymbolMap, InsnsError> {
        let text = std::fs::read_to_string(path).map_err(|source| InsnsError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        SymbolMap::parse(&text, path)
    }

    pub fn parse(text: &str, path: &Path) -> Result<SymbolMap, InsnsError> {
        let mut syms = Vec::new();
        let mut etext = None;
        for (i, l) in text.lines().enumerate() {
            let w: Vec<&str> = l.split_ascii_whitespace().collect();
            if w.is_empty() {
                continue;
            }
            if w.len() < 3 {
                return Err(InsnsError::Parse {
                    path: path.to_path_buf(),
                    line: i + 1,
                    why: "want 'ADDRESS TYPE NAME'".into(),
                });
            }
            let addr = u64::from_str_radix(w[0], 16).map_err(|_| InsnsError::Parse {
                path: path.to_path_buf(),
                line: i + 1,
                why: format!("bad address {:?}", w[0]),
            })?;
            if w[2] == "_etext" {
                etext = Some(addr);
            }
            if matches!(w[1], "T" | "t" | "W" | "w") {
                syms.push((addr, w[2].to_string()));
            }
        }
        if syms.is_empty() {
            return Err(InsnsError::Parse {
                path: path.to_path_buf(),
                line: 0,
                why: "no text symbols (T/t/W/w): not a real System.map (Debian's linux-image \
                      packages ship a placeholder; the real one is in the matching \
                      linux-image-…-dbg package)"
                    .into(),
            });
        }
        syms.sort();
        Ok(SymbolMap { syms, etext })
    }

    /// The function holding `addr`: the text symbol at or below it, or
    /// `[outside kernel text]` (modules, trampolines) when it is past
    /// `_etext` or below the first symbol.
    pub(crate) fn lookup(&self, addr: u64) -> &str {
        if self.etext.is_some_and(|e| addr >= e) {
            return OUTSIDE;
        }
        match self.syms.partition_point(|(a, _)| *a <= addr) {
            0 => OUTSIDE,
            i => &self.syms[i - 1].1,
        }
    }

    /// The address of a function, by exact name.
    pub(crate) fn address(&self, name: &str) -> Option<u64> {
        self.syms.iter().find(|(_, n)| n == name).map(|(a, _)| *a)
    }

    /// Where `name` is entered: its exact symbol, else its full compiler
    /// clones (`name.isra.0`, `name.constprop.1`, …), each entered by a
    /// call. Never a `.cold` part (jumped to) or a `.part` (the tail of a
    /// partly inlined function, whose head runs in its callers). Empty when
    /// it is absent (inlined, renamed, not in this version).
    pub(crate) fn entry_addresses(&self, name: &str) -> Vec<u64> {
        if let Some(a) = self.address(name) {
            return vec![a];
        }
        self.syms
            .iter()
            .filter(|(_, n)| {
                base_name(n) == name && n != name && !n.contains(".cold") && !n.contains(".part")
            })
            .map(|(a, _)| *a)
            .collect()
    }
}

/// The function whose entries count as idle entries: each idle period ends
/// with one call of `schedule_idle` (kernel/sched/core.c, called at the end
/// of `do_idle`); `do_idle` itself is the fallback for a kernel without it.
pub(crate) const IDLE_SYMBOLS: &[&str] = &["schedule_idle", "do_idle"];

/// A symbolised window: instructions per function (base names) and the
/// executions of the idle function's entry block.
#[derive(Debug, Clone, Default)]
pub struct Profile {
    pub kernel: u64,
    pub user: u64,
    pub per_vcpu: Vec<(u64, u64)>,
    /// base name → instructions.
    pub functions: BTreeMap<String, u64>,
    pub idle_symbol: Option<String>,
    pub idle_entries: Option<u64>,
    /// [`ENTRY_FUNCTIONS`] → entries (None: not in the System.map).
    pub entries: BTreeMap<String, Option<u64>>,
}

/// Executions of the translation block starting at `addr`: the entries of
/// the function there.
fn entries_at(window: &Dump, addr: u64) -> u64 {
    window.blocks.get(&addr).map_or(0, |b| b.1)
}

pub fn profile(window: &Dump, map: &SymbolMap) -> Profile {
    let mut functions: BTreeMap<String, u64> = BTreeMap::new();
    for (addr, (insns, _)) in &window.blocks {
        *functions
            .entry(base_name(map.lookup(*addr)).to_string())
            .or_default() += insns;
    }
    let idle = IDLE_SYMBOLS
        .iter()
        .find_map(|s| map.address(s).map(|a| (s.to_string(), a)));
    let (idle_symbol, idle_entries) = match idle {
        Some((s, a)) => (Some(s), Some(entries_at(window, a))),
        None => (None, None),
    };
    let entries = ENTRY_FUNCTIONS
        .iter()
        .map(|(f, _)| {
            let at = map.entry_addresses(f);
            let n = (!at.is_empty()).then(|| at.iter().map(|a| entries_at(window, *a)).sum());
            (f.to_string(), n)
        })
        .collect();
    Profile {
        kernel: window.kernel(),
        user: window.user(),
        per_vcpu: window.vcpus.clone(),
        functions,
        idle_symbol,
        idle_entries,
        entries,
    }
}

/// The `instructions` field of a result record. `ios` is the block layer's
/// IO count of the window (per-IO fields are null without it) and
/// `context_switches` the guest's `/proc/stat` delta.
pub fn record(
    p: &Profile,
    ios: Option<f64>,
    context_switches: Option<f64>,
    window: &InsnsWindow,
) -> Instructions {
    let per = |v: f64| ios.filter(|n| *n > 0.0).map(|n| v / n);
    let mut groups: BTreeMap<&str, u64> = BTreeMap::new();
    for (f, n) in &p.functions {
        *groups.entry(group_of(f)).or_default() += n;
    }
    let total = p.kernel + p.user;
    Instructions {
        window: window.clone(),
        ios,
        total,
        kernel: p.kernel,
        user: p.user,
        per_vcpu: p
            .per_vcpu
            .iter()
            .map(|&(kernel, user)| VcpuInsns { kernel, user })
            .collect(),
        per_io: per(total as f64),
        kernel_per_io: per(p.kernel as f64),
        user_per_io: per(p.user as f64),
        idle_symbol: p.idle_symbol.clone(),
        idle_entries: p.idle_entries,
        idle_entries_per_io: p.idle_entries.and_then(|n| per(n as f64)),
        context_switches_per_io: context_switches.and_then(per),
        entries: p.entries.clone(),
        entries_per_io: p
            .entries
            .iter()
            .map(|(f, n)| (f.clone(), n.and_then(|n| per(n as f64))))
            .collect(),
        groups: groups
            .iter()
            .map(|(g, n)| (g.to_string(), per(*n as f64)))
            .collect(),
        group_insns: groups.iter().map(|(g, n)| (g.to_string(), *n)).collect(),
        functions: p
            .functions
            .iter()
            .map(|(f, n)| (f.clone(), per(*n as f64)))
            .collect(),
        function_insns: p.functions.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAP: &str = "\
ffffffff81000000 T _stext
ffffffff81000100 t blk_mq_flush_plug_list
ffffffff81000200 T virtio_queue_rqs
ffffffff81000300 t foo.constprop.0
ffffffff81000400 D some_data
ffffffff81000500 T schedule_idle
ffffffff81000600 T _etext
";

    #[test]
    fn lookup() {
        let m = SymbolMap::parse(MAP, Path::new("System.map")).unwrap();
        assert_eq!(m.lookup(0xffffffff81000100), "blk_mq_flush_plug_list");
        assert_eq!(m.lookup(0xffffffff811001ff), OUTSIDE);
        assert_eq!(m.lookup(0xffffffff810001ff), "blk_mq_flush_plug_list");
        assert_eq!(m.lookup(0xffffffff81000450), "foo.constprop.0");
        assert_eq!(m.lookup(0xffffffff80000000), OUTSIDE);
    }

    #[test]
    fn entries_count_executions_of_the_block_at_the_function() {
        // blk_mq_run_work_fn at ..100 (its first block ran 5 times, a later
        // block of it 9 times), sbitmap_queue_wake_up only as two full
        // clones, blk_mq_get_tag only as a .part (not an entry), schedule
        // mapped but never run.
        let map = "\
ffffffff81000000 T _stext
ffffffff81000100 t blk_mq_run_work_fn
ffffffff81000200 t sbitmap_queue_wake_up.isra.0
ffffffff81000300 t sbitmap_queue_wake_up.constprop.0
ffffffff81000380 t sbitmap_queue_wake_up.cold
ffffffff81000400 t blk_mq_get_tag.part.0
ffffffff81000500 T schedule
ffffffff81000600 T _etext
";
        let m = SymbolMap::parse(map, Path::new("System.map")).unwrap();
        let w = Dump::parse(
            "blklab-insns 1\nvcpus 1\nvcpu 0 kernel 10 user 0\n\
             tb ffffffff81000100 50 5\ntb ffffffff81000120 90 9\n\
             tb ffffffff81000200 4 2\ntb ffffffff81000300 6 3\ntb ffffffff81000380 1 1\n\
             tb ffffffff81000400 7 7\nend\n",
            Path::new("w"),
        )
        .unwrap();
        let p = profile(&w, &m);
        assert_eq!(p.entries["blk_mq_run_work_fn"], Some(5));
        assert_eq!(p.entries["sbitmap_queue_wake_up"], Some(5));
        assert_eq!(p.entries["blk_mq_get_tag"], None);
        assert_eq!(p.entries["schedule"], Some(0));
        assert_eq!(p.entries["blk_mq_tag_wakeup_all"], None);
        let r = record(&p, Some(10.0), None, &InsnsWindow::default());
        assert_eq!(r.entries_per_io["blk_mq_run_work_fn"], Some(0.5));
        assert_eq!(r.entries_per_io["schedule"], Some(0.0));
        assert_eq!(r.entries_per_io["blk_mq_get_tag"], None);
        // Without an IO count the counts stay, the per-IO values are null.
        let r = record(&p, None, None, &InsnsWindow::default());
        assert_eq!(r.entries["blk_mq_run_work_fn"], Some(5));
        assert_eq!(r.entries_per_io["blk_mq_run_work_fn"], None);
    }

    #[test]
    fn dumps_difference_and_profile() {
        let a = Dump::parse(
            "blklab-insns 1\nvcpus 1\nvcpu 0 kernel 100 user 50\ntb ffffffff81000100 40 4\nend\n",
            Path::new("a"),
        )
        .unwrap();
        let b = Dump::parse(
            "blklab-insns 1\nvcpus 1\nvcpu 0 kernel 300 user 60\ntb ffffffff81000100 60 6\n\
             tb ffffffff81000500 30 3\ntb ffffffff81000310 7 1\nend\n",
            Path::new("b"),
        )
        .unwrap();
        let w = b.since(&a);
        assert_eq!(w.kernel(), 200);
        assert_eq!(w.user(), 10);
        let m = SymbolMap::parse(MAP, Path::new("System.map")).unwrap();
        let p = profile(&w, &m);
        assert_eq!(p.functions["blk_mq_flush_plug_list"], 20);
        assert_eq!(p.functions["foo"], 7);
        assert_eq!(p.idle_entries, Some(3));
        let r = record(&p, Some(2.0), Some(4.0), &InsnsWindow::default());
        assert_eq!(r.per_io, Some(105.0));
        assert_eq!(r.functions["blk_mq_flush_plug_list"], Some(10.0));
        assert_eq!(r.groups["block"], Some(10.0));
        assert_eq!(r.idle_entries_per_io, Some(1.5));
        assert_eq!(r.context_switches_per_io, Some(2.0));
        // The mechanism's entries: blk_mq_flush_plug_list's block ran 2 times
        // in the window; schedule_idle is not in the list; the rest are not
        // in this map.
        assert_eq!(r.entries["blk_mq_flush_plug_list"], Some(2));
        assert_eq!(r.entries_per_io["blk_mq_flush_plug_list"], Some(1.0));
        assert_eq!(r.entries["blk_mq_run_work_fn"], None);
        assert_eq!(r.entries_per_io["blk_mq_run_work_fn"], None);
        assert_eq!(r.entries.len(), ENTRY_FUNCTIONS.len());
        assert!(Dump::parse("blklab-insns 1\nvcpus 1\n", Path::new("t")).is_err());
        assert!(Dump::parse("junk\n", Path::new("t")).is_err());
    }
}
