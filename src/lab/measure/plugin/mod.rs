//! Guest instruction counts from blklab's QEMU TCG plugin
//! (`images/qemu-plugin/blklab-insns.c`): building the plugin, asking it for
//! counter dumps at a variant's SYNC markers, the difference of two dumps,
//! symbolisation against the kernel's `System.map`, and the record of a
//! profile summed into the symbol groups of [`crate::record::symbol_groups`].
//!
//! A dump keeps two levels apart: level 1, the emulated machine's own code,
//! and level 2, what it ran as an SVM guest. A plain TCG run has only
//! level 1: the guest. A nested run (a host under TCG running the guest
//! under its KVM) has both: [`record`] of level 2 against the guest's
//! System.map is the guest's `instructions`, [`host_record`] of level 1
//! against the host's `/proc/kallsyms` its `host_instructions`.
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

use crate::lab::measure::plugin_exits::{exit_line, is_interrupt_stub, NotifyArea, WouldBeExits};
pub use crate::lab::measure::plugin_exits::{ExitCounts, ExitKind};
pub(crate) use crate::record::instructions::{
    HostInstructions, InsnsWindow, Instructions, VcpuInsns, ENTRY_FUNCTIONS,
};
use crate::record::symbol_groups::{base_name, group_of, host_group_of, split_module, OUTSIDE};

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

/// One level's counters in a dump: per vCPU (kernel, user) instructions,
/// and per kernel translation-block start address (instructions,
/// executions).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LevelCounts {
    pub vcpus: Vec<(u64, u64)>,
    pub blocks: BTreeMap<u64, (u64, u64)>,
    /// The level's would-be exits (format 4 and later; empty in format 3).
    pub exits: ExitCounts,
    /// The would-be exits at the plugin's last mark (its `mark=`: the
    /// guest's reads of /proc/interrupts); empty without marks.
    pub marked: ExitCounts,
}

impl LevelCounts {
    pub fn kernel(&self) -> u64 {
        self.vcpus.iter().map(|v| v.0).sum()
    }

    pub fn user(&self) -> u64 {
        self.vcpus.iter().map(|v| v.1).sum()
    }

    /// `self − earlier` (counters only grow; a block missing earlier is new).
    fn since(&self, earlier: &LevelCounts) -> LevelCounts {
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
        LevelCounts {
            vcpus,
            blocks,
            exits: self.exits.since(&earlier.exits),
            marked: self.marked.since(&earlier.marked),
        }
    }
}

/// One vCPU's world switches: VMRUNs (entries into the SVM guest) and the
/// returns to the host after them (#VMEXITs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Switches {
    pub vmruns: u64,
    pub returns: u64,
}

/// How a dump's levels were told apart.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LevelRule {
    /// By following VMRUN and the return after #VMEXIT, per vCPU.
    #[default]
    Vmrun,
    /// By where each block's code lies: level 2 in the nested guest's RAM
    /// (the plugin's `l2ram=`), exact under `-icount` too.
    Address,
}

/// One counter dump (format 5, 4 or 3, see the plugin's header comment), split by
/// level: level 1 is the emulated machine's own code (the guest of a plain
/// TCG run; the host of a nested run), level 2 what it ran in SVM guest
/// mode (a nested run's guest; nothing without SVM).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Dump {
    pub rule: LevelRule,
    pub level1: LevelCounts,
    pub level2: LevelCounts,
    /// Per vCPU.
    pub switches: Vec<Switches>,
    /// Translated blocks the VMRUN tracking saw run at both levels.
    pub mixed: u64,
    /// Under [`LevelRule::Address`], block executions whose level by
    /// address is not the VMRUN tracking's (0 otherwise).
    pub disagree: u64,
    /// Why the dump has no would-be exits (a format-3 dump, or a plugin
    /// built for a QEMU that cannot read registers); None when it has them.
    pub exits_unavailable: Option<String>,
    /// Block executions cut short (stopped before their last instruction
    /// by a fault, or restarted by QEMU at a device access), each counted
    /// only up to the instruction that stopped it (format 5).
    pub cut: u64,
    /// Instructions QEMU re-ran alone after restarting a block at a device
    /// access, counted by their memory access (format 5).
    pub reruns: u64,
    /// Why a block cut short counts in full here (a format-3 or 4 dump, or
    /// a plugin built for a QEMU without per-vCPU inline operations); None
    /// when the counts are of retired instructions.
    pub cut_unavailable: Option<String>,
    /// The plugin's marks so far (a window: between its two dumps), when
    /// it marks (`mark=`; the `marks` record); the levels' `marked` are the
    /// exit counts at the last one.
    pub marks: Option<u64>,
}

/// The kernel function whose entry the plugin marks at (`mark=`): it
/// formats the per-CPU IPI and timer lines of /proc/interrupts, so a mark
/// is the instant the guest reads those counters.
pub(crate) const MARK_SYMBOL: &str = "arch_show_interrupts";

/// The header lines of the dumps [`Dump::parse`] reads: format 5, format 4
/// (no `cut` record: blocks cut short counted in full) and format 3 (no
/// would-be exits either).
const DUMP_HEADER: &str = "blklab-insns 5";
const DUMP_HEADER_4: &str = "blklab-insns 4";
const DUMP_HEADER_3: &str = "blklab-insns 3";

/// What a format-3 or 4 dump's window says about blocks cut short.
pub const FORMAT_4_CUT: &str =
    "the plugin's dump is format 4 or older, counting a block cut short in full (rebuild it: images/build-qemu-plugin.sh)";

/// What a format-3 dump's window says about would-be exits.
pub const FORMAT_3_EXITS: &str =
    "the plugin's dump is format 3, without would-be exits (rebuild it: images/build-qemu-plugin.sh)";

/// The fields of a `vcpu` line after its index, in order.
const VCPU_FIELDS: [&str; 6] = ["kernel", "user", "l2kernel", "l2user", "vmruns", "returns"];

impl Dump {
    pub fn read(path: &Path) -> Result<Dump, InsnsError> {
        let text = std::fs::read_to_string(path).map_err(|source| InsnsError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Dump::parse(&text, path)
    }

    /// Level 1's or level 2's counts (an exit record's `level`).
    fn level_mut(&mut self, level: u8) -> &mut LevelCounts {
        if level == 1 {
            &mut self.level1
        } else {
            &mut self.level2
        }
    }

    pub fn parse(text: &str, path: &Path) -> Result<Dump, InsnsError> {
        let err = |line: usize, why: &str| InsnsError::Parse {
            path: path.to_path_buf(),
            line,
            why: why.to_string(),
        };
        let mut lines = text.lines().enumerate();
        let format = match lines.next().map(|(_, l)| l) {
            Some(DUMP_HEADER) => 5,
            Some(DUMP_HEADER_4) => 4,
            Some(DUMP_HEADER_3) => 3,
            _ => {
                return Err(err(
                    1,
                    "not a blklab-insns 5, 4 or 3 dump (an older plugin? rebuild it: images/build-qemu-plugin.sh)",
                ))
            }
        };
        let mut d = Dump::default();
        let mut exits = format == 3;
        if exits {
            d.exits_unavailable = Some(FORMAT_3_EXITS.to_string());
        }
        let mut cut = format < 5;
        if cut {
            d.cut_unavailable = Some(FORMAT_4_CUT.to_string());
        }
        let (mut vcpus, mut seen, mut ended) = (None, 0usize, false);
        let (mut rule, mut mixed, mut disagree) = (false, false, false);
        for (i, l) in lines {
            let n = i + 1;
            if ended {
                return Err(err(n, "a record after 'end'"));
            }
            let mut w = l.split_ascii_whitespace();
            match w.next() {
                Some("levels") => {
                    d.rule = match (w.next(), w.next()) {
                        (Some("vmrun"), None) => LevelRule::Vmrun,
                        (Some("address"), None) => LevelRule::Address,
                        _ => return Err(err(n, "want 'levels vmrun' or 'levels address'")),
                    };
                    rule = true;
                }
                Some("disagree") => {
                    d.disagree = number(w.next(), 10).ok_or_else(|| err(n, "bad number"))?;
                    disagree = true;
                }
                Some("vcpus") => {
                    let v = number(w.next(), 10).ok_or_else(|| err(n, "bad number"))?;
                    d.set_vcpus(v as usize);
                    vcpus = Some(v as usize);
                }
                Some("vcpu") => {
                    let count = vcpus.ok_or_else(|| err(n, "a 'vcpu' record before 'vcpus'"))?;
                    let (idx, v) = vcpu_line(w).ok_or_else(|| {
                        err(n, "want 'vcpu I kernel K user U l2kernel K2 l2user U2 vmruns R returns X'")
                    })?;
                    if idx >= count {
                        return Err(err(n, "vCPU index beyond 'vcpus'"));
                    }
                    d.level1.vcpus[idx] = (v[0], v[1]);
                    d.level2.vcpus[idx] = (v[2], v[3]);
                    d.switches[idx] = Switches {
                        vmruns: v[4],
                        returns: v[5],
                    };
                    seen += 1;
                }
                Some("mixed") => {
                    d.mixed = number(w.next(), 10).ok_or_else(|| err(n, "bad number"))?;
                    mixed = true;
                }
                Some(tag @ ("tb" | "tb2")) => {
                    let b = block_line(w).ok_or_else(|| err(n, "want 'tb ADDR INSNS EXECS'"))?;
                    let level = if tag == "tb" {
                        &mut d.level1
                    } else {
                        &mut d.level2
                    };
                    level.blocks.insert(b.0, (b.1, b.2));
                }
                Some("cut") if !cut => {
                    match (w.next(), w.next()) {
                        (Some("unavailable"), Some(why)) => {
                            d.cut_unavailable =
                                Some(std::iter::once(why).chain(w).collect::<Vec<_>>().join(" "));
                        }
                        (c, r) => {
                            d.cut = number(c, 10).ok_or_else(|| err(n, "bad number"))?;
                            d.reruns = number(r, 10).ok_or_else(|| err(n, "bad number"))?;
                            if w.next().is_some() {
                                return Err(err(n, "want 'cut N R' or 'cut unavailable WHY'"));
                            }
                        }
                    }
                    cut = true;
                }
                Some("exits") if format >= 4 && !exits => {
                    d.exits_unavailable = match w.next() {
                        Some("available") if w.next().is_none() => None,
                        Some("unavailable") => Some(w.collect::<Vec<_>>().join(" ")),
                        _ => {
                            return Err(err(n, "want 'exits available' or 'exits unavailable WHY'"))
                        }
                    };
                    exits = true;
                }
                Some("exit") if d.exits_unavailable.is_none() && exits => {
                    let e = exit_line(w)
                        .ok_or_else(|| err(n, "want 'exit LEVEL VCPU KIND KEY N [NAME]'"))?;
                    if e.vcpu >= vcpus.unwrap_or(0) {
                        return Err(err(n, "vCPU index beyond 'vcpus'"));
                    }
                    d.level_mut(e.level).exits.add(e);
                }
                Some("marks") if d.exits_unavailable.is_none() && exits => {
                    d.marks = Some(number(w.next(), 10).ok_or_else(|| err(n, "bad number"))?);
                }
                Some("mark") if d.marks.is_some() => {
                    let e = exit_line(w)
                        .ok_or_else(|| err(n, "want 'mark LEVEL VCPU KIND KEY N [NAME]'"))?;
                    if e.vcpu >= vcpus.unwrap_or(0) {
                        return Err(err(n, "vCPU index beyond 'vcpus'"));
                    }
                    d.level_mut(e.level).marked.add(e);
                }
                Some("end") => ended = true,
                _ => return Err(err(n, "unknown record")),
            }
        }
        let last = text.lines().count();
        if !ended {
            return Err(err(last, "truncated dump (no 'end')"));
        }
        if vcpus != Some(seen) || !(rule && mixed && disagree && exits && cut) {
            return Err(err(
                last,
                "incomplete dump (want 'levels', 'vcpus N', N 'vcpu' records, 'mixed', 'disagree', 'cut', 'exits')",
            ));
        }
        Ok(d)
    }

    fn set_vcpus(&mut self, n: usize) {
        self.level1.vcpus = vec![(0, 0); n];
        self.level2.vcpus = vec![(0, 0); n];
        self.switches = vec![Switches::default(); n];
    }

    /// `self − earlier`, each level apart.
    pub fn since(&self, earlier: &Dump) -> Dump {
        let switches = self
            .switches
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let s0 = earlier.switches.get(i).copied().unwrap_or_default();
                Switches {
                    vmruns: s.vmruns.saturating_sub(s0.vmruns),
                    returns: s.returns.saturating_sub(s0.returns),
                }
            })
            .collect();
        Dump {
            rule: self.rule,
            level1: self.level1.since(&earlier.level1),
            level2: self.level2.since(&earlier.level2),
            switches,
            mixed: self.mixed.saturating_sub(earlier.mixed),
            disagree: self.disagree.saturating_sub(earlier.disagree),
            exits_unavailable: self
                .exits_unavailable
                .clone()
                .or_else(|| earlier.exits_unavailable.clone()),
            cut: self.cut.saturating_sub(earlier.cut),
            reruns: self.reruns.saturating_sub(earlier.reruns),
            cut_unavailable: self
                .cut_unavailable
                .clone()
                .or_else(|| earlier.cut_unavailable.clone()),
            marks: self
                .marks
                .zip(earlier.marks)
                .map(|(m, m0)| m.saturating_sub(m0)),
        }
    }

    pub fn vmruns(&self) -> u64 {
        self.switches.iter().map(|s| s.vmruns).sum()
    }

    pub fn returns(&self) -> u64 {
        self.switches.iter().map(|s| s.returns).sum()
    }

    /// The plugin's self-check on its VMRUN tracking: no translated block
    /// ran at both levels, each vCPU's VMRUNs and returns differ by at most
    /// one (a vCPU may be in the guest when a dump is taken), and, by
    /// address, no block ran at a level other than its address's.
    pub fn levels_consistent(&self) -> bool {
        self.mixed == 0
            && self.disagree == 0
            && self
                .switches
                .iter()
                .all(|s| s.vmruns.abs_diff(s.returns) <= 1)
    }

    /// Whether the counts' split into levels can be trusted: always by
    /// address; by VMRUN, when the tracking checked out.
    pub fn levels_trusted(&self) -> bool {
        self.rule == LevelRule::Address || self.levels_consistent()
    }
}

fn number(s: Option<&str>, radix: u32) -> Option<u64> {
    s.and_then(|x| u64::from_str_radix(x, radix).ok())
}

/// `I kernel K user U l2kernel K2 l2user U2 vmruns R returns X` (after
/// `vcpu`): the index and the six values.
fn vcpu_line<'a>(mut w: impl Iterator<Item = &'a str>) -> Option<(usize, [u64; 6])> {
    let idx = number(w.next(), 10)? as usize;
    let mut v = [0; 6];
    for (slot, name) in v.iter_mut().zip(VCPU_FIELDS) {
        if w.next()? != name {
            return None;
        }
        *slot = number(w.next(), 10)?;
    }
    w.next().is_none().then_some((idx, v))
}

/// `ADDR INSNS EXECS` (after `tb` or `tb2`).
fn block_line<'a>(mut w: impl Iterator<Item = &'a str>) -> Option<(u64, u64, u64)> {
    let b = (
        number(w.next(), 16)?,
        number(w.next(), 10)?,
        number(w.next(), 10)?,
    );
    w.next().is_none().then_some(b)
}

/// A kernel's text symbols: from its System.map, or from a running
/// kernel's `/proc/kallsyms` (whose module symbols,
/// `ADDRESS t NAME\t[MODULE]`, are named `NAME [MODULE]`).
#[derive(Debug, Clone)]
pub struct SymbolMap {
    /// (address, name), sorted by address.
    syms: Vec<(u64, String)>,
    /// End of the kernel's text (`_etext`), when the map has it.
    etext: Option<u64>,
    /// Addresses of modules' other symbols (data, read-only data), sorted:
    /// a module's text ends before them.
    module_data: Vec<u64>,
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
        let err = |line: usize, why: String| InsnsError::Parse {
            path: path.to_path_buf(),
            line,
            why,
        };
        let (mut syms, mut module_data) = (Vec::new(), Vec::new());
        let mut etext = None;
        for (i, l) in text.lines().enumerate() {
            let w: Vec<&str> = l.split_ascii_whitespace().collect();
            if w.is_empty() {
                continue;
            }
            let module = match w[..] {
                [_, _, _] => None,
                [_, _, _, m] if m.len() > 2 && m.starts_with('[') && m.ends_with(']') => Some(m),
                _ => return Err(err(i + 1, "want 'ADDRESS TYPE NAME [MODULE]'".into())),
            };
            let addr = u64::from_str_radix(w[0], 16)
                .map_err(|_| err(i + 1, format!("bad address {:?}", w[0])))?;
            if w[2] == "_etext" && module.is_none() {
                etext = Some(addr);
            }
            match (w[1], module) {
                ("T" | "t" | "W" | "w", None) => syms.push((addr, w[2].to_string())),
                ("T" | "t" | "W" | "w", Some(m)) => syms.push((addr, format!("{} {m}", w[2]))),
                (_, Some(_)) => module_data.push(addr),
                (_, None) => {}
            }
        }
        if syms.is_empty() {
            return Err(err(
                0,
                "no text symbols (T/t/W/w): not a real System.map (Debian's linux-image \
                 packages ship a placeholder; the real one is in the matching \
                 linux-image-…-dbg package)"
                    .into(),
            ));
        }
        if syms.iter().all(|(a, _)| *a == 0) {
            return Err(err(
                0,
                "every address is 0: /proc/kallsyms read without the right to see \
                 addresses (read it as root; kernel.kptr_restrict)"
                    .into(),
            ));
        }
        syms.sort();
        module_data.sort_unstable();
        Ok(SymbolMap {
            syms,
            etext,
            module_data,
        })
    }

    /// The function holding `addr`: the text symbol at or below it, or
    /// `[outside kernel text]` (trampolines, and modules System.map does
    /// not know) when it is below the first symbol, or past `_etext` and
    /// the symbol below is the kernel's own, or a module's with a module's
    /// data symbol in between (the module's text ended: e.g. its init code,
    /// whose symbols kallsyms drops once it ran).
    pub(crate) fn lookup(&self, addr: u64) -> &str {
        let (at, name) = match self.syms.partition_point(|(a, _)| *a <= addr) {
            0 => return OUTSIDE,
            i => (self.syms[i - 1].0, self.syms[i - 1].1.as_str()),
        };
        if self.etext.is_some_and(|e| addr >= e) {
            let data = self.module_data.partition_point(|a| *a <= addr);
            let ended = data > 0 && self.module_data[data - 1] > at;
            if split_module(name).1.is_none() || ended {
                return OUTSIDE;
            }
        }
        name
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
fn entries_at(window: &LevelCounts, addr: u64) -> u64 {
    window.blocks.get(&addr).map_or(0, |b| b.1)
}

/// The profile of one level of a window (`Dump::level1` of a plain TCG
/// run, or `Dump::level2` of a nested run, against the guest's System.map;
/// a nested run's `Dump::level1` against the host's `/proc/kallsyms`).
pub fn profile(window: &LevelCounts, map: &SymbolMap) -> Profile {
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
    let groups = sum_groups(&p.functions, group_of);
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
            .map(|(g, n)| (g.clone(), per(*n as f64)))
            .collect(),
        group_insns: groups,
        functions: p
            .functions
            .iter()
            .map(|(f, n)| (f.clone(), per(*n as f64)))
            .collect(),
        function_insns: p.functions.clone(),
        exits: None,
    }
}

/// The would-be exits of one level of a window (`unavailable`: the dump's
/// reason when it has none), its interrupts taken from the entries of the
/// IDT stubs in `map`, notify stores mapped by `notify`.
pub(crate) fn exits_record(
    level: &LevelCounts,
    unavailable: Option<&str>,
    map: &SymbolMap,
    notify: &[NotifyArea],
    ios: Option<f64>,
) -> WouldBeExits {
    let stubs = map
        .syms
        .iter()
        .filter(|(_, n)| is_interrupt_stub(n))
        .map(|(a, n)| (n.clone(), entries_at(level, *a)))
        .collect();
    let mut r =
        crate::lab::measure::plugin_exits::record(&level.exits, unavailable, stubs, notify, ios);
    if r.unavailable.is_none() {
        r.device_vectors = device_vectors(level, map);
    }
    r
}

/// The first vector of device interrupts (x86's FIRST_EXTERNAL_VECTOR).
const FIRST_EXTERNAL_VECTOR: u64 = 0x20;

/// Entries per device-interrupt vector ("0x22" → entries): the
/// executions of each vector's stub in `irq_entries_start` (`push
/// $vector; jmp asm_common_interrupt`, one per vector from 0x20 up to the
/// first system vector, `spurious_entries_start`). The stubs are IDT_ALIGN
/// apart: 8 bytes, or 16 with IBT (then the table would hold more than
/// the 224 vectors at 8). Empty when the map has neither symbol.
fn device_vectors(level: &LevelCounts, map: &SymbolMap) -> BTreeMap<String, u64> {
    let (Some(start), Some(end)) = (
        map.address("irq_entries_start"),
        map.address("spurious_entries_start"),
    ) else {
        return BTreeMap::new();
    };
    let span = end.saturating_sub(start);
    let align = if span / 8 <= 256 - FIRST_EXTERNAL_VECTOR {
        8
    } else {
        16
    };
    level
        .blocks
        .range(start..end)
        .filter(|(a, (_, execs))| (*a - start) % align == 0 && *execs > 0)
        .map(|(a, (_, execs))| {
            let vector = FIRST_EXTERNAL_VECTOR + (a - start) / align;
            (format!("{vector:#x}"), *execs)
        })
        .collect()
}

/// Kernel instructions per group of `functions` (base name →
/// instructions), grouped by `group`.
fn sum_groups(
    functions: &BTreeMap<String, u64>,
    group: fn(&str) -> &'static str,
) -> BTreeMap<String, u64> {
    let mut groups: BTreeMap<String, u64> = BTreeMap::new();
    for (f, n) in functions {
        *groups.entry(group(f).to_string()).or_default() += n;
    }
    groups
}

/// The `host_instructions` field of a nested run's result record: `p` the
/// profile of the window's level 1 against the host's `/proc/kallsyms`,
/// `window` the dump difference it came from (its world switches), `ios`
/// the guest block layer's IO count of the window.
pub fn host_record(
    p: &Profile,
    window: &Dump,
    ios: Option<f64>,
    how: &InsnsWindow,
) -> HostInstructions {
    let per = |v: u64| ios.filter(|n| *n > 0.0).map(|n| v as f64 / n);
    let groups = sum_groups(&p.functions, host_group_of);
    let total = p.kernel + p.user;
    HostInstructions {
        window: how.clone(),
        ios,
        total,
        kernel: p.kernel,
        user: p.user,
        per_vcpu: p
            .per_vcpu
            .iter()
            .map(|&(kernel, user)| VcpuInsns { kernel, user })
            .collect(),
        per_io: per(total),
        kernel_per_io: per(p.kernel),
        user_per_io: per(p.user),
        world_switches: window.vmruns(),
        world_switches_per_io: per(window.vmruns()),
        exits: window.returns(),
        mixed_blocks: window.mixed,
        levels: Some(
            match window.rule {
                LevelRule::Vmrun => "vmrun",
                LevelRule::Address => "address",
            }
            .to_string(),
        ),
        level_disagreements: (window.rule == LevelRule::Address).then_some(window.disagree),
        groups: groups.iter().map(|(g, n)| (g.clone(), per(*n))).collect(),
        group_insns: groups,
        functions: p
            .functions
            .iter()
            .map(|(f, n)| (f.clone(), per(*n)))
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
            "blklab-insns 3\nlevels vmrun\nvcpus 1\n\
             vcpu 0 kernel 10 user 0 l2kernel 0 l2user 0 vmruns 0 returns 0\nmixed 0\ndisagree 0\n\
             tb ffffffff81000100 50 5\ntb ffffffff81000120 90 9\n\
             tb ffffffff81000200 4 2\ntb ffffffff81000300 6 3\ntb ffffffff81000380 1 1\n\
             tb ffffffff81000400 7 7\nend\n",
            Path::new("w"),
        )
        .unwrap();
        let p = profile(&w.level1, &m);
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
            &format!(
                "{}tb ffffffff81000100 40 4\nend\n",
                head(&[(100, 50, 0, 0, 0, 0)], 0)
            ),
            Path::new("a"),
        )
        .unwrap();
        let b = Dump::parse(
            &format!(
                "{}tb ffffffff81000100 60 6\ntb ffffffff81000500 30 3\n\
                 tb ffffffff81000310 7 1\nend\n",
                head(&[(300, 60, 0, 0, 0, 0)], 0)
            ),
            Path::new("b"),
        )
        .unwrap();
        let w = b.since(&a);
        assert_eq!(w.level1.kernel(), 200);
        assert_eq!(w.level1.user(), 10);
        assert_eq!(
            w.level2,
            LevelCounts {
                vcpus: vec![(0, 0)],
                ..LevelCounts::default()
            }
        );
        let m = SymbolMap::parse(MAP, Path::new("System.map")).unwrap();
        let p = profile(&w.level1, &m);
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
    }

    /// The head of a format-3 dump by VMRUN: `levels`, `vcpus` and one
    /// `vcpu` line per (kernel, user, l2kernel, l2user, vmruns, returns),
    /// then `mixed` and `disagree 0`.
    fn head(vcpus: &[(u64, u64, u64, u64, u64, u64)], mixed: u64) -> String {
        let mut s = format!("blklab-insns 3\nlevels vmrun\nvcpus {}\n", vcpus.len());
        for (i, (k, u, k2, u2, r, x)) in vcpus.iter().enumerate() {
            s += &format!(
                "vcpu {i} kernel {k} user {u} l2kernel {k2} l2user {u2} vmruns {r} returns {x}\n"
            );
        }
        s + &format!("mixed {mixed}\ndisagree 0\n")
    }

    #[test]
    fn dumps_keep_the_levels_apart() {
        // vCPU 0 ran the host and entered the guest 3 times (in the guest at
        // the second dump); vCPU 1 only the host. One address started a
        // block at each level (the guest's module at the host's kvm_amd's
        // address).
        let a = Dump::parse(
            &format!(
                "{}tb ffffffffc0001000 10 1\ntb2 ffffffffc0001000 40 4\nend\n",
                head(&[(100, 50, 1000, 500, 5, 5), (70, 7, 0, 0, 0, 0)], 0)
            ),
            Path::new("a"),
        )
        .unwrap();
        let b = Dump::parse(
            &format!(
                "{}tb ffffffffc0001000 30 3\ntb2 ffffffffc0001000 40 4\n\
                 tb2 ffffffff81000100 9 1\nend\n",
                head(&[(300, 60, 1600, 700, 8, 7), (90, 8, 0, 0, 0, 0)], 0)
            ),
            Path::new("b"),
        )
        .unwrap();
        assert_eq!(a.level1.blocks[&0xffffffffc0001000], (10, 1));
        assert_eq!(a.level2.blocks[&0xffffffffc0001000], (40, 4));
        let w = b.since(&a);
        assert_eq!(w.level1.vcpus, vec![(200, 10), (20, 1)]);
        assert_eq!(w.level2.vcpus, vec![(600, 200), (0, 0)]);
        assert_eq!((w.level1.kernel(), w.level2.kernel()), (220, 600));
        // Unchanged blocks drop out of the window, each level on its own.
        assert_eq!(
            w.level1.blocks.clone().into_iter().collect::<Vec<_>>(),
            vec![(0xffffffffc0001000, (20, 2))]
        );
        assert_eq!(
            w.level2.blocks.clone().into_iter().collect::<Vec<_>>(),
            vec![(0xffffffff81000100, (9, 1))]
        );
        assert_eq!((w.vmruns(), w.returns()), (3, 2));
        assert!(w.levels_consistent());
        // The self-check: two VMRUNs without a return, or a block seen at
        // both levels.
        let mut bad = w.clone();
        bad.switches[0].vmruns += 1;
        assert!(!bad.levels_consistent());
        let mut bad = w.clone();
        bad.mixed = 1;
        assert!(!bad.levels_consistent());
        assert!(!bad.levels_trusted());
    }

    #[test]
    fn levels_by_address_are_trusted_whatever_the_vmrun_tracking_says() {
        // Under -icount: the VMRUN tracking lost transitions (a return
        // without its VMRUN, blocks at both levels, 12 executions at a
        // level other than their address's); the counts stand by address.
        let text = |a: u64, d: u64| {
            head(&[(100, 0, 40, 0, 3, 3 + a)], a)
                .replace("levels vmrun", "levels address")
                .replace("disagree 0", &format!("disagree {d}"))
                + "end\n"
        };
        let a = Dump::parse(&text(0, 0), Path::new("a")).unwrap();
        let b = Dump::parse(&text(1, 12), Path::new("b")).unwrap();
        assert_eq!(b.rule, LevelRule::Address);
        let w = b.since(&a);
        assert_eq!((w.disagree, w.mixed, w.rule), (12, 1, LevelRule::Address));
        assert!(!w.levels_consistent());
        assert!(w.levels_trusted());
        // By VMRUN the same window is not.
        let w = Dump {
            rule: LevelRule::Vmrun,
            ..w
        };
        assert!(!w.levels_trusted());
    }

    #[test]
    fn dumps_are_read_strictly() {
        let ok = format!(
            "{}tb ffffffff81000100 1 1\nend\n",
            head(&[(1, 2, 3, 4, 5, 5)], 0)
        );
        assert!(Dump::parse(&ok, Path::new("t")).is_ok());
        let bad = |text: &str, line: usize| {
            let e = Dump::parse(text, Path::new("t")).unwrap_err().to_string();
            assert!(e.starts_with(&format!("t:{line}: ")), "{text:?}: {e}");
        };
        // A format-1 dump, a truncated one, junk.
        bad(
            "blklab-insns 1\nvcpus 1\nvcpu 0 kernel 1 user 1\ntb ffffffff81000100 1 1\nend\n",
            1,
        );
        bad(&ok.replace("blklab-insns 3", "blklab-insns 6"), 1);
        bad(&ok.replace("end\n", ""), 7);
        bad("junk\n", 1);
        // A vcpu line of format 1, with a field missing, extra or misnamed.
        bad(
            &ok.replace(" l2kernel 3 l2user 4 vmruns 5 returns 5", ""),
            4,
        );
        bad(&ok.replace("returns 5", "returns 5 x"), 4);
        bad(&ok.replace("l2user", "l2usr"), 4);
        // An index beyond the vCPU count; a missing vcpu, mixed, disagree
        // or levels record; an unknown rule.
        bad(&ok.replace("vcpu 0 ", "vcpu 1 "), 4);
        bad(&ok.replace("vcpus 1", "vcpus 2"), 8);
        bad(&ok.replace("mixed 0\n", ""), 7);
        bad(&ok.replace("disagree 0\n", ""), 7);
        bad(&ok.replace("levels vmrun\n", ""), 7);
        bad(&ok.replace("levels vmrun", "levels cr3"), 2);
        // Bad block lines, a record after the end.
        bad(&ok.replace("tb ", "tb3 "), 7);
        bad(&ok.replace("1 1\n", "1\n"), 7);
        bad(&ok.replace("tb ffffffff81000100", "tb2 zz"), 7);
        bad(&format!("{ok}tb 1 1 1\n"), 9);
    }

    #[test]
    fn format_4_dumps_carry_exits_per_level() {
        let text = |hlt: u64, notify: u64| {
            head(&[(1, 2, 3, 4, 5, 5), (1, 1, 0, 0, 0, 0)], 0).replace("blklab-insns 3", "blklab-insns 4")
                + &format!(
                    "exits available\nexit 1 0 hlt 0 {hlt}\nexit 1 1 wrmsr 830 2\nexit 2 0 out 80 7\n\
                     exit 1 0 mmio febf3000 {notify} virtio-pci-notify\ntb ffffffff81000100 1 1\nend\n"
                )
        };
        let a = Dump::parse(&text(10, 4), Path::new("a")).unwrap();
        let b = Dump::parse(&text(15, 9), Path::new("b")).unwrap();
        assert_eq!(a.exits_unavailable, None);
        assert_eq!(a.level1.exits.of(ExitKind::Wrmsr(0x830)), 2);
        assert_eq!(a.level2.exits.of(ExitKind::Out(0x80)), 7);
        assert_eq!(a.level1.exits.of(ExitKind::Out(0x80)), 0);
        assert_eq!(a.level1.exits.regions[&0xfebf3000], "virtio-pci-notify");
        let w = b.since(&a);
        assert_eq!(w.level1.exits.of(ExitKind::Hlt), 5);
        assert_eq!(w.level1.exits.of(ExitKind::Mmio(0xfebf3000)), 5);
        assert_eq!(w.level1.exits.of(ExitKind::Wrmsr(0x830)), 0);
        assert_eq!(w.level2.exits.of(ExitKind::Out(0x80)), 0);
        // Unavailable: the reason, and no exit records may follow.
        let u = head(&[(1, 2, 3, 4, 5, 5)], 0).replace("blklab-insns 3", "blklab-insns 4")
            + "exits unavailable plugin API version 1\nend\n";
        let d = Dump::parse(&u, Path::new("u")).unwrap();
        assert_eq!(d.exits_unavailable.as_deref(), Some("plugin API version 1"));
        let bad = |t: &str| assert!(Dump::parse(t, Path::new("t")).is_err(), "{t}");
        bad(&u.replace("end\n", "exit 1 0 hlt 0 1\nend\n"));
        // Format 4 needs its exits line; format 3 has none and says so.
        bad(&text(1, 1).replace("exits available\n", ""));
        bad(&text(1, 1).replace("exit 1 1 wrmsr", "exit 1 2 wrmsr"));
        bad(&text(1, 1).replace(" virtio-pci-notify", ""));
        let f3 = format!("{}end\n", head(&[(1, 2, 3, 4, 5, 5)], 0));
        let d = Dump::parse(&f3, Path::new("f3")).unwrap();
        assert_eq!(d.exits_unavailable.as_deref(), Some(FORMAT_3_EXITS));
        bad(&f3.replace("end\n", "exits available\nend\n"));
        // A window from a format-3 dump to a format-4 one has no exits.
        let w = b.since(&d);
        assert_eq!(w.exits_unavailable.as_deref(), Some(FORMAT_3_EXITS));
    }

    #[test]
    fn format_5_dumps_count_blocks_cut_short() {
        let text = |cut: &str| {
            head(&[(100, 20, 0, 0, 0, 0)], 0).replace("blklab-insns 3", "blklab-insns 5")
                + &format!("{cut}\nexits available\ntb ffffffff81000100 1 1\nend\n")
        };
        let a = Dump::parse(&text("cut 4 1"), Path::new("a")).unwrap();
        let b = Dump::parse(&text("cut 10 3"), Path::new("b")).unwrap();
        assert_eq!((a.cut, a.reruns, a.cut_unavailable.clone()), (4, 1, None));
        let w = b.since(&a);
        assert_eq!((w.cut, w.reruns, w.cut_unavailable), (6, 2, None));
        // A plugin that cannot tell says why.
        let u = Dump::parse(
            &text("cut unavailable plugin API version 1"),
            Path::new("u"),
        )
        .unwrap();
        assert_eq!(u.cut_unavailable.as_deref(), Some("plugin API version 1"));
        assert_eq!(
            b.since(&u).cut_unavailable.as_deref(),
            Some("plugin API version 1")
        );
        // Format 5 needs its cut record, with two numbers; format 4 has
        // none and says so.
        let bad = |t: &str| assert!(Dump::parse(t, Path::new("t")).is_err(), "{t}");
        bad(&text("cut 4 1").replace("cut 4 1\n", ""));
        bad(&text("cut 4"));
        bad(&text("cut 4 1 2"));
        bad(&text("cut x 1"));
        bad(&text("cut 4 1\ncut 4 1"));
        let f4 = text("cut 4 1")
            .replace("blklab-insns 5", "blklab-insns 4")
            .replace("cut 4 1\n", "");
        let d = Dump::parse(&f4, Path::new("f4")).unwrap();
        assert_eq!(d.cut_unavailable.as_deref(), Some(FORMAT_4_CUT));
        bad(&f4.replace("exits", "cut 1 1\nexits"));
        assert_eq!(b.since(&d).cut_unavailable.as_deref(), Some(FORMAT_4_CUT));
    }

    #[test]
    fn marks_carry_the_exits_at_the_last_mark() {
        let text = |marks: &str| {
            head(&[(100, 20, 0, 0, 0, 0), (1, 1, 0, 0, 0, 0)], 0)
                .replace("blklab-insns 3", "blklab-insns 5")
                + &format!(
                    "cut 0 0\nexits available\nexit 1 0 mmio fee00300 9 apic-msi\n{marks}\
                     tb ffffffff81000100 1 1\nend\n"
                )
        };
        let a = Dump::parse(
            &text("marks 3\nmark 1 0 mmio fee00300 5 apic-msi\n"),
            Path::new("a"),
        )
        .unwrap();
        let b = Dump::parse(
            &text("marks 7\nmark 1 0 mmio fee00300 8 apic-msi\nmark 1 1 wrmsr 830 2\n"),
            Path::new("b"),
        )
        .unwrap();
        assert_eq!(a.marks, Some(3));
        assert_eq!(a.level1.marked.of(ExitKind::Mmio(0xfee0_0300)), 5);
        let w = b.since(&a);
        assert_eq!(w.marks, Some(4));
        assert_eq!(w.level1.marked.of(ExitKind::Mmio(0xfee0_0300)), 3);
        assert_eq!(w.level1.marked.of(ExitKind::Wrmsr(0x830)), 2);
        assert_eq!(w.level1.exits.of(ExitKind::Mmio(0xfee0_0300)), 0);
        // Without marks (no mark=) there are none, and a window with one
        // side unmarked has none either.
        let u = Dump::parse(&text(""), Path::new("u")).unwrap();
        assert_eq!(u.marks, None);
        assert_eq!(b.since(&u).marks, None);
        // A mark record needs its marks record first, and a whole line.
        let bad = |t: &str| assert!(Dump::parse(t, Path::new("t")).is_err(), "{t}");
        bad(&text("mark 1 0 hlt 0 1\n"));
        bad(&text("marks x\n"));
        bad(&text("marks 1\nmark 1 0 hlt 0\n"));
        bad(&text("marks 1\nmark 1 5 hlt 0 1\n"));
    }

    #[test]
    fn exits_record_counts_interrupt_stub_entries() {
        let map = SymbolMap::parse(
            "ffffffff81000000 T _stext\nffffffff81000100 T asm_common_interrupt\n\
             ffffffff81000200 T asm_sysvec_apic_timer_interrupt\n\
             ffffffff81000300 T asm_sysvec_reschedule_ipi\nffffffff81000400 T _etext\n",
            Path::new("m"),
        )
        .unwrap();
        let w = Dump::parse(
            &format!(
                "{}exits available\nexit 1 0 hlt 0 4\ntb ffffffff81000100 9 3\n\
                 tb ffffffff81000110 9 30\ntb ffffffff81000200 5 5\nend\n",
                head(&[(1, 1, 0, 0, 0, 0)], 0).replace("blklab-insns 3", "blklab-insns 4")
            ),
            Path::new("w"),
        )
        .unwrap();
        let e = exits_record(&w.level1, None, &map, &[], Some(2.0));
        assert!(e.device_vectors.is_empty());
        assert_eq!(e.interrupt_entries["asm_common_interrupt"], 3);
        assert_eq!(e.interrupt_entries["asm_sysvec_apic_timer_interrupt"], 5);
        assert_eq!(e.interrupt_entries["asm_sysvec_reschedule_ipi"], 0);
        assert_eq!((e.interrupts, e.hlt, e.total), (8, 4, 12));
        assert_eq!(e.per_io["interrupts"], Some(4.0));
    }

    #[test]
    fn device_vectors_from_the_irq_entry_stubs() {
        // 204 stubs 8 bytes apart (vectors 0x20..0xeb), as 6.12's map has
        // them; blocks at vector 0x22's and 0x24's stubs, one inside a
        // stub (not a vector's entry), one past the table.
        let map = SymbolMap::parse(
            "ffffffff81400140 T irq_entries_start\nffffffff814007a0 T spurious_entries_start\n\
             ffffffff81400b40 T asm_common_interrupt\n",
            Path::new("m"),
        )
        .unwrap();
        let w = Dump::parse(
            &format!(
                "{}exits available\ntb ffffffff81400150 2 7\ntb ffffffff81400160 2 5\n\
                 tb ffffffff81400162 1 9\ntb ffffffff814007a0 2 4\ntb ffffffff81400798 2 1\n\
                 tb ffffffff81400b40 9 13\nend\n",
                head(&[(1, 1, 0, 0, 0, 0)], 0).replace("blklab-insns 3", "blklab-insns 4")
            ),
            Path::new("w"),
        )
        .unwrap();
        let e = exits_record(&w.level1, None, &map, &[], None);
        let v: Vec<(&str, u64)> = e
            .device_vectors
            .iter()
            .map(|(k, n)| (k.as_str(), *n))
            .collect();
        assert_eq!(v, [("0x22", 7), ("0x24", 5), ("0xeb", 1)]);
        assert_eq!(e.interrupt_entries["asm_common_interrupt"], 13);
        assert_eq!(e.device_vectors.values().sum::<u64>(), 13);
    }

    /// A host's /proc/kallsyms: the kernel's text, then modules' symbols
    /// past `_etext`.
    const KALLSYMS: &str = "\
ffffffff81000000 T _stext
ffffffff81000100 T __schedule
ffffffff81000200 t do_idle
ffffffff81000300 T _etext
ffffffff81000400 d some_data
ffffffffc0001000 t kvm_arch_vcpu_ioctl_run\t[kvm]
ffffffffc0002000 t vcpu_enter_guest.constprop.0\t[kvm]
ffffffffc0010000 t svm_vcpu_run\t[kvm_amd]
ffffffffc0010800 t svm_vcpu_run.cold\t[kvm_amd]
ffffffffc0020000 t virtblk_done\t[virtio_blk]
ffffffffc0020100 d virtblk_data\t[virtio_blk]
";

    #[test]
    fn kallsyms_with_module_symbols() {
        let m = SymbolMap::parse(KALLSYMS, Path::new("kallsyms")).unwrap();
        assert_eq!(m.lookup(0xffffffff81000150), "__schedule");
        // Past _etext: a module's symbol names its module, the kernel's
        // last symbol does not stretch that far.
        assert_eq!(m.lookup(0xffffffffc0010010), "svm_vcpu_run [kvm_amd]");
        assert_eq!(m.lookup(0xffffffffc0010900), "svm_vcpu_run.cold [kvm_amd]");
        assert_eq!(m.lookup(0xffffffff81000350), OUTSIDE);
        assert_eq!(m.lookup(0xffffffffc0000fff), OUTSIDE);
        assert_eq!(m.lookup(0xffffffffc00200ff), "virtblk_done [virtio_blk]");
        // Past a module's data: its text has ended (a freed init section).
        assert_eq!(m.lookup(0xffffffffc0020100), OUTSIDE);
        assert_eq!(m.lookup(0xffffffffc0030000), OUTSIDE);
        assert_eq!(
            m.address("kvm_arch_vcpu_ioctl_run [kvm]"),
            Some(0xffffffffc0001000)
        );
        // A non-root read: every address 0. A malformed module column.
        let zero = "0000000000000000 T _stext\n0000000000000000 t svm_vcpu_run\t[kvm_amd]\n";
        let e = SymbolMap::parse(zero, Path::new("k"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("as root"), "{e}");
        assert!(SymbolMap::parse("ffffffff81000000 T f kvm\n", Path::new("k")).is_err());
        assert!(SymbolMap::parse("ffffffff81000000 T f [kvm] x\n", Path::new("k")).is_err());
    }

    #[test]
    fn host_profile_of_a_nested_window() {
        let m = SymbolMap::parse(KALLSYMS, Path::new("kallsyms")).unwrap();
        // Level 1 is the host: KVM's run loop, the scheduler, idle, a
        // module's interrupt handler. Level 2 (the guest) is not the host's.
        let w = Dump::parse(
            &format!(
                "{}tb ffffffffc0001000 100 10\ntb ffffffffc0002040 50 10\n\
                 tb ffffffffc0010000 300 20\ntb ffffffffc0010800 20 1\n\
                 tb ffffffff81000100 80 4\ntb ffffffff81000200 30 3\n\
                 tb ffffffffc0020010 5 1\ntb2 ffffffffc0010000 999 9\nend\n",
                head(&[(400, 600, 5000, 2000, 20, 20), (185, 0, 0, 0, 0, 0)], 0)
            ),
            Path::new("w"),
        )
        .unwrap();
        let p = profile(&w.level1, &m);
        assert_eq!(p.functions["svm_vcpu_run [kvm_amd]"], 320);
        assert_eq!(p.functions["vcpu_enter_guest [kvm]"], 50);
        let r = host_record(&p, &w, Some(10.0), &InsnsWindow::default());
        assert_eq!((r.total, r.kernel, r.user), (1185, 585, 600));
        assert_eq!(r.per_io, Some(118.5));
        assert_eq!(r.kernel_per_io, Some(58.5));
        assert_eq!(r.user_per_io, Some(60.0));
        assert_eq!(
            r.per_vcpu[1],
            VcpuInsns {
                kernel: 185,
                user: 0
            }
        );
        assert_eq!((r.world_switches, r.exits, r.mixed_blocks), (20, 20, 0));
        assert_eq!(r.world_switches_per_io, Some(2.0));
        assert_eq!(r.group_insns["kvm"], 470);
        assert_eq!(r.groups["kvm"], Some(47.0));
        assert_eq!(r.group_insns["scheduler"], 80);
        assert_eq!(r.group_insns["idle"], 30);
        assert_eq!(r.group_insns["virtio"], 5);
        assert_eq!(r.functions["__schedule"], Some(8.0));
        assert_eq!(r.function_insns["virtblk_done [virtio_blk]"], 5);
        // The level-1 kernel functions add up to the level-1 kernel count.
        assert_eq!(r.function_insns.values().sum::<u64>(), r.kernel);
        // Without an IO count the counts stay, the per-IO values are null.
        let r = host_record(&p, &w, None, &InsnsWindow::default());
        assert_eq!((r.per_io, r.world_switches_per_io), (None, None));
        assert_eq!(r.groups["kvm"], None);
        assert_eq!(r.group_insns["kvm"], 470);
    }
}
