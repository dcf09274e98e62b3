//! A nested host that went silent, seen from outside it: neither its
//! console nor its second serial port (the inner lab's log, and the
//! heartbeat the host's `/init` writes there every 15 s) moved for a while;
//! for a host without the heartbeat, its vCPU threads (the outer QEMU's,
//! named `CPU N/TCG` with `debug-threads=on`) also barely ran. The inner
//! lab cannot see this (it is what stopped), so the outer lab watches for
//! it, keeps what the host's state was, and boots a fresh host for what is
//! left. A host whose kernel reports a stall on its console is given up
//! the same way, at that line ([`GaveUp::Stall`]).
//!
//! What is kept, in one text file: QMP's view of the machine (its run
//! state, each vCPU's registers and local APIC, the interrupt
//! controllers), QEMU's threads' CPU time, what the host's console said
//! after an NMI was injected into every vCPU (the host's kernel, booted
//! with `unknown_nmi_panic`, answers an NMI it can take with a panic and a
//! backtrace; one that cannot take it says nothing), and where QEMU's own
//! threads wait: in the kernel, and their stacks when gdb is installed,
//! with QEMU's view of each vCPU when it has debug information
//! ([`vcpu_flags`]).

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::lab::guest::qemu::{Guest, Next};
use crate::lab::guest::qmp::Qmp;
use crate::lab::measure::plugin::SymbolMap;
use crate::util::procfs;

use super::vcpu_flags;

/// The share of one CPU the host's vCPUs together may use over the quiet
/// stretch and still count as silent. An idle Linux host under TCG uses
/// well under 1 %; a working one, a whole core or more.
const MAX_BUSY: f64 = 0.05;

/// How long the console is read after the NMI.
const AFTER_NMI: Duration = Duration::from_secs(20);

/// How long a QMP connection may take.
const QMP_CONNECT: Duration = Duration::from_secs(5);

/// The vCPU threads' CPU time of the QEMU process `pid`, in clock ticks
/// (`None` when the process is gone).
pub(crate) fn vcpu_ticks(pid: i32) -> Option<u64> {
    let threads = procfs::threads(pid)?;
    Some(
        threads
            .iter()
            .filter(|(_, st)| is_vcpu_thread(&st.comm))
            .map(|(_, st)| st.utime + st.stime)
            .sum(),
    )
}

/// QEMU's vCPU threads under `-name …,debug-threads=on`: `CPU 0/TCG`, or
/// single-threaded TCG's one thread for every vCPU, `ALL CPUs/TCG`.
fn is_vcpu_thread(comm: &str) -> bool {
    (comm.starts_with("CPU ") || comm.starts_with("ALL CPUs")) && comm.contains('/')
}

/// A silence: how long nothing was said, and the vCPU time meanwhile.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Silence {
    pub(crate) quiet: Duration,
    /// Over the last stretch of the watch's limit (or less, when the
    /// watch has not sampled that long).
    pub(crate) vcpu_seconds: f64,
    /// Its vCPUs used more than [`MAX_BUSY`] of a core: stuck rather than
    /// idle.
    pub(crate) busy: bool,
    /// What gave the host up.
    pub(crate) why: GaveUp,
}

/// Why a host was given up.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum GaveUp {
    /// Nothing said for the watch's limit.
    Silent,
    /// The step's timeout.
    TimedOut,
    /// The host kernel's own stall report (a soft lockup, an RCU stall, a
    /// blocked task: its first line), before any silence: such a report
    /// repeats on the console, so the host never falls quiet.
    Stall(String),
    /// A fault report of the host's kernel (an oops, a BUG: its first
    /// line) after its /init spoke.
    Fault(String),
}

impl Silence {
    /// The kernel's stall report that gave the host up, if one did.
    pub(crate) fn watchdog(&self) -> Option<&str> {
        match &self.why {
            GaveUp::Stall(report) => Some(report),
            _ => None,
        }
    }

    /// The kernel's fault report that gave the host up, if one did.
    pub(crate) fn fault(&self) -> Option<&str> {
        match &self.why {
            GaveUp::Fault(report) => Some(report),
            _ => None,
        }
    }

    /// The host kernel's report that gave the host up, if one did: what
    /// it reported (a stall, a fault) and the report's first line.
    pub(crate) fn kernel_report(&self) -> Option<(&'static str, &str)> {
        match &self.why {
            GaveUp::Stall(report) => Some(("a stall", report)),
            GaveUp::Fault(report) => Some(("a fault", report)),
            GaveUp::Silent | GaveUp::TimedOut => None,
        }
    }

    /// What the host did, for a host given up without a stall report.
    pub(crate) fn what(&self) -> &'static str {
        match self.why {
            GaveUp::TimedOut => "made no progress by the step's timeout",
            _ => "fell silent",
        }
    }
}

/// Whether the host has been silent for `limit`: the last time it said
/// anything (its heartbeat included, when it sends one), and samples of its
/// vCPU time, which must be idle too when it sends no heartbeat.
pub(crate) struct SilenceWatch {
    limit: Duration,
    /// Silence needs idle vCPUs too: the host sends no heartbeat, so a
    /// long quiet stretch may be a long variant.
    needs_idle: bool,
    last_output: Instant,
    /// (when, vCPU ticks), oldest first, reaching back at least `limit`.
    samples: VecDeque<(Instant, u64)>,
    per_second: f64,
}

impl SilenceWatch {
    pub(crate) fn new(limit: Duration, now: Instant) -> SilenceWatch {
        SilenceWatch {
            limit,
            needs_idle: true,
            last_output: now,
            samples: VecDeque::new(),
            per_second: procfs::clk_tck(),
        }
    }

    /// The host sends a heartbeat, which counts as output: a quiet
    /// stretch is then silence whatever its vCPUs do.
    pub(crate) fn heartbeat(&mut self) {
        self.needs_idle = false;
    }

    /// The host said something (a console line, its log grew).
    pub(crate) fn output(&mut self, now: Instant) {
        self.last_output = now;
    }

    /// Its vCPU time `ticks` at `now`: the silence, when it has lasted.
    pub(crate) fn sample(&mut self, now: Instant, ticks: u64) -> Option<Silence> {
        self.samples.push_back((now, ticks));
        let from = now.checked_sub(self.limit)?;
        // Keep one sample at or before `from`, none older.
        while self.samples.get(1).is_some_and(|(t, _)| *t <= from) {
            self.samples.pop_front();
        }
        let quiet = now.saturating_duration_since(self.last_output);
        let (first, first_ticks) = *self.samples.front()?;
        if quiet < self.limit || first > from {
            return None;
        }
        let (vcpu_seconds, busy) = self.since((first, first_ticks), now, ticks);
        (!busy || !self.needs_idle).then_some(Silence {
            quiet,
            vcpu_seconds,
            busy,
            why: GaveUp::Silent,
        })
    }

    /// The vCPU seconds from the sample `first` to `ticks` at `now`, and
    /// whether they were more than [`MAX_BUSY`] of that span.
    fn since(&self, first: (Instant, u64), now: Instant, ticks: u64) -> (f64, bool) {
        let vcpu_seconds = ticks.saturating_sub(first.1) as f64 / self.per_second;
        let span = now.saturating_duration_since(first.0).as_secs_f64();
        (vcpu_seconds, vcpu_seconds > span * MAX_BUSY)
    }

    /// The host at the step's timeout, whatever its vCPUs did: how long it
    /// has said nothing, its vCPU time over the samples kept, and whether
    /// that was more than an idle host's.
    pub(crate) fn at_timeout(&mut self, now: Instant, ticks: u64) -> Silence {
        self.samples.push_back((now, ticks));
        let first = self.samples.front().copied().unwrap_or((now, ticks));
        let (vcpu_seconds, busy) = self.since(first, now, ticks);
        Silence {
            quiet: now.saturating_duration_since(self.last_output),
            vcpu_seconds,
            busy,
            why: GaveUp::TimedOut,
        }
    }
}

/// Keep the silent host's state in `file`: QMP's view of the machine,
/// its vCPU threads' CPU time, then what its console says after an NMI.
/// Every step that fails says so in the file; the file itself is the only
/// thing that must be written.
pub(crate) fn keep_state(
    qmp: &Path,
    guest: &mut Guest,
    silence: Silence,
    symbols: Option<&SymbolMap>,
    file: &Path,
) -> std::io::Result<()> {
    let mut text = match silence.kernel_report() {
        Some((what, report)) => format!(
            "The nested host's kernel reported {what}: {report}\n\
             Its vCPU threads used {:.2} s of CPU over the last stretch.\n",
            silence.vcpu_seconds
        ),
        None => format!(
            "The nested host {}{}: nothing on its console or in the inner lab's log for \
             {:.0} s, its vCPU threads used {:.2} s of CPU over the last stretch.\n",
            silence.what(),
            if silence.why == GaveUp::TimedOut && silence.busy {
                ", its vCPUs busy"
            } else {
                ""
            },
            silence.quiet.as_secs_f64(),
            silence.vcpu_seconds
        ),
    };
    let pid = guest.pid();
    // Where QEMU's threads wait, before the NMI may end the host.
    let _ = writeln!(
        text,
        "\n== QEMU's threads (utime+stime ticks, kernel wait)\n{}",
        threads(pid)
    );
    let _ = writeln!(
        text,
        "\n== QEMU's threads' stacks, and its vCPUs' flags when it has debug information\n{}",
        stacks(pid, &file.with_extension("gdb"))
    );
    match Qmp::connect(qmp, QMP_CONNECT) {
        Ok(mut q) => {
            machine_state(&mut q, symbols, &mut text);
            nmi_probe(&mut q, guest, &mut text);
        }
        Err(e) => {
            let _ = writeln!(text, "\n== QMP\n{e}");
        }
    }
    std::fs::write(file, text)
}

/// Every thread's user-space stack, by gdb when it is on PATH (attached
/// for a moment, at most [`GDB_LIMIT`]): which lock or condition each
/// vCPU thread sleeps on; then, when QEMU has debug information, what it
/// holds of each vCPU ([`vcpu_flags`]). `script` is where the gdb commands
/// for the latter are written.
fn stacks(pid: i32, script: &Path) -> String {
    if let Err(e) = std::fs::write(script, vcpu_flags::GDB_SCRIPT) {
        return format!("(cannot write {}: {e})", script.display());
    }
    let out = std::process::Command::new("timeout")
        .arg(GDB_LIMIT.as_secs().to_string())
        .args(["gdb", "-batch", "-nx", "-p", &pid.to_string()])
        .args(["-ex", "thread apply all bt 30", "-x"])
        .arg(script)
        .output();
    match out {
        Ok(o) => gdb_report(
            &String::from_utf8_lossy(&o.stdout),
            &String::from_utf8_lossy(&o.stderr),
            o.status,
        ),
        Err(e) => format!("(cannot run timeout/gdb: {e}; is it installed?)"),
    }
}

/// gdb's stacks and vCPU lines read out, and why the vCPUs were not
/// read when they were not.
fn gdb_report(stdout: &str, stderr: &str, status: std::process::ExitStatus) -> String {
    let mut text = vcpu_flags::annotate(stdout);
    // Stripped, gdb knows `cpus_queue` by name but not its type.
    if stderr.contains("No symbol") || stderr.contains("has unknown type") {
        text.push_str(NO_DEBUG_INFO);
    } else if !status.success() {
        let _ = write!(text, "(gdb: {status}) {}", stderr.trim());
    }
    text
}

/// What the state says of a QEMU without debug information (Debian's is
/// stripped), whose vCPUs gdb cannot read.
const NO_DEBUG_INFO: &str = "(QEMU has no debug information: its vCPUs' flags were not read)\n";

/// How long gdb may take to attach and walk every thread.
const GDB_LIMIT: Duration = Duration::from_secs(60);

/// Each of QEMU's threads: its name, CPU ticks and where in the kernel it
/// waits (`wchan`: a vCPU halted as QEMU halts it waits on its condition
/// variable, a futex).
fn threads(pid: i32) -> String {
    let Some(threads) = procfs::threads(pid) else {
        return "(the process is gone)".into();
    };
    threads
        .iter()
        .map(|(tid, st)| {
            let wchan = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/wchan"))
                .unwrap_or_default();
            format!(
                "{} tid {tid} ticks {} wchan {}",
                st.comm,
                st.utime + st.stime,
                wchan.trim()
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The run state, the vCPUs, their registers (each RIP by the host's
/// `symbols`, when known) and local APICs, and the interrupt controllers,
/// as QMP and the human monitor show them.
fn machine_state(q: &mut Qmp, symbols: Option<&SymbolMap>, text: &mut String) {
    for command in ["query-status", "query-cpus-fast"] {
        let answer = q
            .execute(command, None)
            .map(|v| serde_json::to_string_pretty(&v).unwrap_or_default())
            .unwrap_or_else(|e| e.to_string());
        let _ = writeln!(text, "\n== {command}\n{answer}");
    }
    let cpus = q
        .execute("query-cpus-fast", None)
        .ok()
        .and_then(|v| v.as_array().map(|a| a.len()))
        .unwrap_or(1);
    let registers = human(q, "info registers -a");
    let _ = writeln!(text, "\n== each vCPU's RIP\n{}", rips(&registers, symbols));
    let _ = writeln!(text, "\n== info registers -a\n{registers}");
    let mut hmp = vec!["info pic".to_string()];
    hmp.extend((0..cpus).map(|i| format!("info lapic {i}")));
    for command in hmp {
        let _ = writeln!(text, "\n== {command}\n{}", human(q, &command));
    }
}

/// Each `CPU#N` of `info registers -a` with its RIP and whether it halted,
/// the RIP by symbol when `symbols` are known. A vCPU not yet in long mode
/// (the firmware, a kernel's early boot) has an EIP, never in the kernel's
/// symbols.
fn rips(registers: &str, symbols: Option<&SymbolMap>) -> String {
    let mut out = Vec::new();
    let mut cpu = "";
    for line in registers.lines() {
        if line.starts_with("CPU#") {
            cpu = line.trim();
        }
        let (reg, ip, symbols) = match (line.strip_prefix("RIP="), line.strip_prefix("EIP=")) {
            (Some(ip), _) => ("RIP", ip, symbols),
            (None, Some(ip)) => ("EIP", ip, None),
            (None, None) => continue,
        };
        let hex = ip.split_whitespace().next().unwrap_or("");
        let halted = line.contains("HLT=1");
        let name = u64::from_str_radix(hex, 16)
            .ok()
            .zip(symbols)
            .map_or("?", |(a, m)| m.lookup(a));
        out.push(format!("{cpu} {reg} {hex} {name} halted={halted}"));
    }
    out.join("\n")
}

/// A human-monitor command's output over QMP.
fn human(q: &mut Qmp, command: &str) -> String {
    match q.execute(
        "human-monitor-command",
        Some(json!({"command-line": command})),
    ) {
        Ok(v) => v.as_str().unwrap_or_default().to_string(),
        Err(e) => e.to_string(),
    }
}

/// Inject an NMI into every vCPU and keep what the console says for
/// [`AFTER_NMI`] (or until QEMU exits: the host panics and powers off).
fn nmi_probe(q: &mut Qmp, guest: &mut Guest, text: &mut String) {
    let _ = writeln!(
        text,
        "\n== inject-nmi, then the console for up to {AFTER_NMI:?}"
    );
    if let Err(e) = q.execute("inject-nmi", None) {
        let _ = writeln!(text, "{e}");
        return;
    }
    let end = Instant::now() + AFTER_NMI;
    let mut lines = 0;
    loop {
        let now = Instant::now();
        if now >= end {
            break;
        }
        match guest.poll_line(end - now) {
            Some(Next::Line(l)) => {
                text.push_str(&l);
                text.push('\n');
                lines += 1;
            }
            Some(Next::Closed) => {
                text.push_str("(QEMU exited)\n");
                break;
            }
            None => break,
        }
    }
    if lines == 0 {
        text.push_str("(nothing: the host did not take the NMI, or could not print)\n");
    }
}

/// Where an attempt's kept files go: `console/nested-host.attemptN.*`.
pub(crate) fn attempt_file(out_dir: &Path, attempt: u32, what: &str) -> PathBuf {
    out_dir
        .join("console")
        .join(format!("nested-host.attempt{attempt}.{what}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vcpu_threads_are_told_by_name() {
        assert!(is_vcpu_thread("CPU 12/TCG") && is_vcpu_thread("CPU 0/KVM"));
        assert!(is_vcpu_thread("ALL CPUs/TCG"));
        assert!(!is_vcpu_thread("qemu-system-x86") && !is_vcpu_thread("CPUs"));
        // This process has no vCPU thread: none of its time counts.
        assert_eq!(vcpu_ticks(std::process::id() as i32), Some(0));
    }

    #[test]
    fn each_vcpus_rip_is_named() {
        let regs = "\nCPU#0\nRAX=0\nRIP=ffffffff81000010 RFL=00000212 [----A--] CPL=0 II=0 A20=1 SMM=0 HLT=1\n\
                    CPU#1\nRIP=ffffffff81000100 RFL=00000002 [-------] CPL=0 II=0 A20=1 SMM=0 HLT=0\n";
        let map = SymbolMap::parse(
            "ffffffff81000000 T default_idle\nffffffff81000080 T vmrun_loop\n",
            Path::new("kallsyms"),
        )
        .unwrap();
        assert_eq!(
            rips(regs, Some(&map)),
            "CPU#0 RIP ffffffff81000010 default_idle halted=true\n\
             CPU#1 RIP ffffffff81000100 vmrun_loop halted=false"
        );
        assert!(rips(regs, None).starts_with("CPU#0 RIP ffffffff81000010 ? halted=true"));
        // Before long mode: the EIP, never looked up.
        let early = "CPU#2\nEIP=0000fff0 EFL=00000002 [-------] CPL=0 II=0 A20=1 SMM=0 HLT=1\n";
        assert_eq!(rips(early, Some(&map)), "CPU#2 EIP 0000fff0 ? halted=true");
    }

    #[test]
    fn silence_needs_the_whole_stretch_quiet_and_idle() {
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let mut w = SilenceWatch::new(Duration::from_secs(90), t0);
        let per_s = w.per_second as u64;
        // Busy and quiet: a long variant, not a silence.
        for n in (0..=200).step_by(5) {
            assert_eq!(w.sample(s(n), n * per_s), None, "busy at {n} s");
        }
        // Idle from 200 s on, but the console spoke at 250 s.
        let idle = 200 * per_s;
        w.output(s(250));
        for n in (205..340).step_by(5) {
            assert_eq!(w.sample(s(n), idle + n / 10), None, "{n} s");
        }
        // Quiet since 250 s and idle: silent 90 s later.
        let got = w.sample(s(340), idle + 34).expect("silent at 340 s");
        assert_eq!(got.quiet, Duration::from_secs(90));
        assert!(got.vcpu_seconds < 0.1, "{got:?}");
    }

    #[test]
    fn with_a_heartbeat_a_quiet_host_is_silent_whatever_its_vcpus_do() {
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let mut w = SilenceWatch::new(Duration::from_secs(90), t0);
        w.heartbeat();
        let per_s = w.per_second as u64;
        // A fifth of a core spinning, no line: silent 90 s after the last.
        w.output(s(10));
        for n in (10..100).step_by(5) {
            assert_eq!(w.sample(s(n), n * per_s / 5), None, "{n} s");
        }
        let got = w.sample(s(100), 20 * per_s).expect("silent at 100 s");
        assert!(got.busy && got.quiet == Duration::from_secs(90), "{got:?}");
        assert_eq!(got.why, GaveUp::Silent, "{got:?}");
    }

    #[test]
    fn a_stripped_qemu_is_said_to_have_no_debug_information() {
        use std::os::unix::process::ExitStatusExt;
        let failed = std::process::ExitStatus::from_raw(1 << 8);
        let stacks = "Thread 7 (Thread 0x7f (LWP 8347) \"CPU 2/TCG\"):\n#0  futex\n";
        let stripped = "x.gdb:1: Error in sourced command file:\n\
                        'cpus_queue' has unknown type; cast it to its declared type\n";
        let r = gdb_report(stacks, stripped, failed);
        assert!(r.starts_with(stacks) && r.ends_with(NO_DEBUG_INFO), "{r}");
        let r = gdb_report(
            stacks,
            "No symbol \"cpus_queue\" in current context.",
            failed,
        );
        assert!(r.ends_with(NO_DEBUG_INFO), "{r}");
        // Any other failure is shown as gdb said it.
        let r = gdb_report("", "ptrace: Operation not permitted.", failed);
        assert_eq!(r, "(gdb: exit status: 1) ptrace: Operation not permitted.");
        // With debug information, each vCPU read out.
        let ok = std::process::ExitStatus::from_raw(0);
        let r = gdb_report(
            "vcpu 0 halted 1 interrupt_request 0x0 hflags 0x0 hflags2 0x1 eflags 0x202\n",
            "",
            ok,
        );
        assert!(
            r.contains("= vCPU 0: halted;") && !r.contains("debug information"),
            "{r}"
        );
    }

    #[test]
    fn at_the_timeout_a_busy_host_is_told_from_an_idle_one() {
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let mut w = SilenceWatch::new(Duration::from_secs(60), t0);
        let per_s = w.per_second as u64;
        for n in (0..100).step_by(5) {
            w.sample(s(n), n * per_s);
        }
        let stuck = w.at_timeout(s(100), 100 * per_s);
        assert!(stuck.busy && stuck.why == GaveUp::TimedOut, "{stuck:?}");
        assert_eq!(stuck.quiet, Duration::from_secs(100));
        let mut w = SilenceWatch::new(Duration::from_secs(600), t0);
        w.sample(s(0), 0);
        let idle = w.at_timeout(s(50), 1);
        assert!(!idle.busy && idle.vcpu_seconds < 0.1, "{idle:?}");
    }

    #[test]
    fn a_kernel_report_says_what_it_was_and_fills_its_own_field() {
        let given_up = |why| Silence {
            quiet: Duration::ZERO,
            vcpu_seconds: 0.0,
            busy: false,
            why,
        };
        let stall = given_up(GaveUp::Stall("watchdog: BUG: soft lockup".into()));
        assert_eq!(
            stall.kernel_report(),
            Some(("a stall", "watchdog: BUG: soft lockup"))
        );
        assert_eq!(stall.fault(), None);
        let fault = given_up(GaveUp::Fault("BUG: TASK stack guard page was hit".into()));
        assert_eq!(
            fault.kernel_report(),
            Some(("a fault", "BUG: TASK stack guard page was hit"))
        );
        assert_eq!(fault.watchdog(), None);
        assert_eq!(fault.fault(), Some("BUG: TASK stack guard page was hit"));
        assert_eq!(given_up(GaveUp::Silent).kernel_report(), None);
    }

    #[test]
    fn a_host_busy_for_part_of_the_stretch_is_not_silent() {
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let mut w = SilenceWatch::new(Duration::from_secs(60), t0);
        let per_s = w.per_second as u64;
        // 10 s of a whole CPU within the last 60 s: 17 %, above the bound.
        assert_eq!(w.sample(s(0), 0), None);
        assert_eq!(w.sample(s(30), 10 * per_s), None);
        assert_eq!(w.sample(s(60), 10 * per_s), None);
        assert_eq!(w.sample(s(89), 10 * per_s), None);
        // The busy stretch has left the window: silent.
        assert!(w.sample(s(95), 10 * per_s).is_some());
        // Without a sample reaching back a whole stretch, no verdict.
        let mut w = SilenceWatch::new(Duration::from_secs(60), t0);
        assert_eq!(w.sample(s(61), 0), None);
    }
}
