//! The plugin's counter dump (format 6, 5, 4 or 3; the plugin's header comment
//! has the grammar): read strictly, split into the two levels, and the
//! difference of two dumps, which is a window's counts.

use std::collections::BTreeMap;
use std::path::Path;

use crate::lab::measure::plugin::error::InsnsError;
use crate::lab::measure::plugin::tasks::Tasks;
use crate::lab::measure::plugin_exits::{exit_line, ExitCounts};

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
    pub(crate) marked: ExitCounts,
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
pub(crate) struct Switches {
    pub(crate) vmruns: u64,
    pub(crate) returns: u64,
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
    pub(crate) switches: Vec<Switches>,
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
    pub(crate) marks: Option<u64>,
    /// The counts by the machine's task that ran them (format 6, when the
    /// plugin follows task switches: its `tasks` command).
    pub tasks: Option<Tasks>,
}

/// The header lines of the dumps [`Dump::parse`] reads: format 6, format 5
/// (no `tasks` record), format 4 (no `cut` record either: blocks cut short
/// counted in full) and format 3 (no would-be exits either).
const DUMP_HEADER: &str = "blklab-insns 6";
const DUMP_HEADER_5: &str = "blklab-insns 5";
const DUMP_HEADER_4: &str = "blklab-insns 4";
const DUMP_HEADER_3: &str = "blklab-insns 3";

/// What a format-3 or 4 dump's window says about blocks cut short.
const FORMAT_4_CUT: &str =
    "the plugin's dump is format 4 or older, counting a block cut short in full (rebuild it: images/build-qemu-plugin.sh)";

/// What a format-3 dump's window says about would-be exits.
const FORMAT_3_EXITS: &str =
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
            Some(DUMP_HEADER) => 6,
            Some(DUMP_HEADER_5) => 5,
            Some(DUMP_HEADER_4) => 4,
            Some(DUMP_HEADER_3) => 3,
            _ => {
                return Err(err(
                    1,
                    "not a blklab-insns 6, 5, 4 or 3 dump (an older plugin? rebuild it: images/build-qemu-plugin.sh)",
                ))
            }
        };
        let mut parser = Parser::new(format);
        for (i, l) in lines {
            parser.record(l).map_err(|why| err(i + 1, why))?;
        }
        parser
            .finish()
            .map_err(|why| err(text.lines().count(), why))
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
            tasks: self
                .tasks
                .as_ref()
                .zip(earlier.tasks.as_ref())
                .map(|(t, t0)| t.since(t0)),
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
    pub(crate) fn levels_trusted(&self) -> bool {
        self.rule == LevelRule::Address || self.levels_consistent()
    }
}

/// [`Dump::parse`] between two records: the dump so far and which of its
/// once-only records were read. A record's error is its line's reason.
struct Parser {
    d: Dump,
    format: u8,
    /// The `exits` record was read (or none is due: format 3).
    exits: bool,
    /// The `cut` record was read (or none is due: format 4 and older).
    cut: bool,
    /// The `tasks` record was read (or none is due: format 5 and older).
    tasks: bool,
    vcpus: Option<usize>,
    /// `vcpu` records read.
    seen: usize,
    ended: bool,
    rule: bool,
    mixed: bool,
    disagree: bool,
}

impl Parser {
    fn new(format: u8) -> Parser {
        let mut d = Dump::default();
        let (exits, cut) = (format == 3, format < 5);
        if exits {
            d.exits_unavailable = Some(FORMAT_3_EXITS.to_string());
        }
        if cut {
            d.cut_unavailable = Some(FORMAT_4_CUT.to_string());
        }
        Parser {
            d,
            format,
            exits,
            cut,
            tasks: format < 6,
            vcpus: None,
            seen: 0,
            ended: false,
            rule: false,
            mixed: false,
            disagree: false,
        }
    }

    /// One record (a line after the header).
    fn record(&mut self, line: &str) -> Result<(), &'static str> {
        if self.ended {
            return Err("a record after 'end'");
        }
        let mut w = line.split_ascii_whitespace();
        match w.next() {
            Some("levels") => {
                self.d.rule = match (w.next(), w.next()) {
                    (Some("vmrun"), None) => LevelRule::Vmrun,
                    (Some("address"), None) => LevelRule::Address,
                    _ => return Err("want 'levels vmrun' or 'levels address'"),
                };
                self.rule = true;
            }
            Some("disagree") => {
                self.d.disagree = decimal(w.next())?;
                self.disagree = true;
            }
            Some("vcpus") => {
                let n = decimal(w.next())? as usize;
                self.d.set_vcpus(n);
                self.vcpus = Some(n);
            }
            Some("vcpu") => self.vcpu(w)?,
            Some("mixed") => {
                self.d.mixed = decimal(w.next())?;
                self.mixed = true;
            }
            Some(tag @ ("tb" | "tb2")) => {
                let b = block_line(w).ok_or("want 'tb ADDR INSNS EXECS'")?;
                let level = if tag == "tb" {
                    &mut self.d.level1
                } else {
                    &mut self.d.level2
                };
                level.blocks.insert(b.0, (b.1, b.2));
            }
            Some("cut") if !self.cut => self.cut(w)?,
            Some("exits") if self.format >= 4 && !self.exits => self.exits(w)?,
            Some("exit") if self.d.exits_unavailable.is_none() && self.exits => {
                self.exit(w, false)?
            }
            Some("marks") if self.d.exits_unavailable.is_none() && self.exits => {
                self.d.marks = Some(decimal(w.next())?);
            }
            Some("mark") if self.d.marks.is_some() => self.exit(w, true)?,
            Some("tasks") if !self.tasks => {
                self.d.tasks = Tasks::parse_header(&w.collect::<Vec<_>>())?;
                self.tasks = true;
            }
            Some("task") => {
                let tasks = self
                    .d
                    .tasks
                    .as_mut()
                    .ok_or("a 'task' record without tasks")?;
                tasks.parse_task(line.strip_prefix("task ").unwrap_or_default())?;
            }
            Some("end") => self.ended = true,
            _ => return Err("unknown record"),
        }
        Ok(())
    }

    /// `vcpu I kernel K user U l2kernel K2 l2user U2 vmruns R returns X`.
    fn vcpu<'a>(&mut self, w: impl Iterator<Item = &'a str>) -> Result<(), &'static str> {
        let count = self.vcpus.ok_or("a 'vcpu' record before 'vcpus'")?;
        let (idx, v) = vcpu_line(w)
            .ok_or("want 'vcpu I kernel K user U l2kernel K2 l2user U2 vmruns R returns X'")?;
        if idx >= count {
            return Err("vCPU index beyond 'vcpus'");
        }
        self.d.level1.vcpus[idx] = (v[0], v[1]);
        self.d.level2.vcpus[idx] = (v[2], v[3]);
        self.d.switches[idx] = Switches {
            vmruns: v[4],
            returns: v[5],
        };
        self.seen += 1;
        Ok(())
    }

    /// `cut N R` or `cut unavailable WHY` (format 5).
    fn cut<'a>(&mut self, mut w: impl Iterator<Item = &'a str>) -> Result<(), &'static str> {
        match (w.next(), w.next()) {
            (Some("unavailable"), Some(why)) => {
                self.d.cut_unavailable =
                    Some(std::iter::once(why).chain(w).collect::<Vec<_>>().join(" "));
            }
            (c, r) => {
                self.d.cut = decimal(c)?;
                self.d.reruns = decimal(r)?;
                if w.next().is_some() {
                    return Err("want 'cut N R' or 'cut unavailable WHY'");
                }
            }
        }
        self.cut = true;
        Ok(())
    }

    /// `exits available` or `exits unavailable WHY` (format 4 and later).
    fn exits<'a>(&mut self, mut w: impl Iterator<Item = &'a str>) -> Result<(), &'static str> {
        self.d.exits_unavailable = match w.next() {
            Some("available") if w.next().is_none() => None,
            Some("unavailable") => Some(w.collect::<Vec<_>>().join(" ")),
            _ => return Err("want 'exits available' or 'exits unavailable WHY'"),
        };
        self.exits = true;
        Ok(())
    }

    /// An `exit` record, or a `mark` one (`marked`: the counts at the last
    /// mark).
    fn exit<'a>(
        &mut self,
        w: impl Iterator<Item = &'a str>,
        marked: bool,
    ) -> Result<(), &'static str> {
        let e = exit_line(w).ok_or(if marked {
            "want 'mark LEVEL VCPU KIND KEY N [NAME]'"
        } else {
            "want 'exit LEVEL VCPU KIND KEY N [NAME]'"
        })?;
        if e.vcpu >= self.vcpus.unwrap_or(0) {
            return Err("vCPU index beyond 'vcpus'");
        }
        let level = self.d.level_mut(e.level);
        if marked {
            level.marked.add(e);
        } else {
            level.exits.add(e);
        }
        Ok(())
    }

    /// The dump, once every record was read.
    fn finish(self) -> Result<Dump, &'static str> {
        if !self.ended {
            return Err("truncated dump (no 'end')");
        }
        let once = self.rule && self.mixed && self.disagree && self.exits && self.cut && self.tasks;
        if self.vcpus != Some(self.seen) || !once {
            return Err("incomplete dump (want 'levels', 'vcpus N', N 'vcpu' records, 'mixed', 'disagree', 'cut', 'exits', 'tasks')");
        }
        Ok(self.d)
    }
}

/// A decimal count.
fn decimal(s: Option<&str>) -> Result<u64, &'static str> {
    number(s, 10).ok_or("bad number")
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::lab::measure::plugin_exits::ExitKind;

    /// The head of a format-3 dump by VMRUN: `levels`, `vcpus` and one
    /// `vcpu` line per (kernel, user, l2kernel, l2user, vmruns, returns),
    /// then `mixed` and `disagree 0`.
    pub(crate) fn head(vcpus: &[(u64, u64, u64, u64, u64, u64)], mixed: u64) -> String {
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
        bad(&ok.replace("blklab-insns 3", "blklab-insns 7"), 1);
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
    fn format_6_dumps_carry_the_tasks_and_a_window_their_differences() {
        let text = |k: u64| {
            head(&[(k, 0, 0, 0, 0, 0)], 0).replace("blklab-insns 3", "blklab-insns 6")
                + &format!(
                    "cut 0 0\nexits available\ntasks switch ffffffff81002a30 halt 0 names yes\n\
                     task ffff888003a0c000 312 300 kernel {k} user 0 l2kernel 0 l2user 0 halt 0 switches 2 comm CPU 0/KVM\n\
                     tb ffffffff81000100 1 1\nend\n"
                )
        };
        let a = Dump::parse(&text(10), Path::new("a")).unwrap();
        let b = Dump::parse(&text(25), Path::new("b")).unwrap();
        let t = b.since(&a).tasks.expect("tasks");
        assert_eq!(t.switch, 0xffffffff81002a30);
        assert_eq!(t.level1(), 15);
        // Format 6 must say whether it followed tasks; `tasks off` is none.
        let missing = text(1).replace("tasks switch ffffffff81002a30 halt 0 names yes\n", "");
        let e = Dump::parse(&missing, Path::new("m"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("a 'task' record without tasks"), "{e}");
        let off = text(1)
            .replace(
                "tasks switch ffffffff81002a30 halt 0 names yes",
                "tasks off",
            )
            .lines()
            .filter(|l| !l.starts_with("task "))
            .collect::<Vec<_>>()
            .join("\n")
            + "\n";
        assert_eq!(Dump::parse(&off, Path::new("o")).unwrap().tasks, None);
        let no_tasks_record = off.replace("tasks off\n", "");
        assert!(Dump::parse(&no_tasks_record, Path::new("n")).is_err());
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
}
