//! Booting a guest: QEMU's command line, the KVM probe boot (for the
//! accelerator choice), and a running QEMU whose serial console we read and
//! answer.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use log::{debug, info, warn};
use serde::Serialize;
use thiserror::Error;

use crate::backend::qemu_args::{self, GuestRam};

#[derive(Debug, Error)]
pub enum QemuError {
    #[error(
        "{0} not found: install it with `apt-get install qemu-system-x86` (or pass --qemu PATH)"
    )]
    NotFound(String),
    #[error("cannot start {qemu}: {source}")]
    Spawn {
        qemu: String,
        source: std::io::Error,
    },
    #[error("QEMU exited ({status}) before the guest finished; its stderr: {stderr}; last console lines:\n{console}")]
    Exited {
        status: String,
        /// QEMU's exit status was 0: under `-no-reboot`, the guest reset
        /// itself or powered off.
        clean: bool,
        stderr: String,
        console: String,
    },
    #[error("timed out after {secs} s waiting for {what}; last console lines:\n{console}")]
    Timeout {
        secs: u64,
        what: String,
        console: String,
    },
    #[error("cannot write to the guest console: {0}")]
    Console(std::io::Error),
}

pub(crate) use crate::record::run::Accel;

/// The clocksource every lab guest under TCG boots with, whatever the
/// kernel: the TSC, trusted as it is (under KVM the guest keeps kvm-clock,
/// the clocksource a user's guests have). Under TCG with 2 vCPUs, 5.10
/// left to itself prints "tsc: Marking TSC unstable due to TSCs
/// unsynchronized" (its boot-time check across CPUs) and switches to the
/// HPET, and then every clock read (ktime_get, several per IO) is an
/// emulated MMIO read: `read_hpet` topped its instruction profile. 6.12
/// keeps the TSC by itself. `tsc=reliable` skips that check and the
/// clocksource watchdog (on 5.10 it alone is enough: "Switched to
/// clocksource tsc"); `clocksource=tsc` alone is not (the TSC is already
/// unstable). A user's `--append` comes later and wins.
pub(crate) const CLOCKSOURCE_ARGS: &str = "clocksource=tsc tsc=reliable";

/// A machine with no display, monitor or network, its serial console on
/// QEMU's stdin and stdout, that exits instead of rebooting.
pub(crate) const HEADLESS: &[&str] = &[
    "-display",
    "none",
    "-serial",
    "stdio",
    "-monitor",
    "none",
    "-no-reboot",
    "-nic",
    "none",
];

/// One vhost-user disk on the QEMU command line.
pub(crate) use crate::backend::qemu_args::QemuDisk;

/// Everything that makes up one guest's QEMU command line.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct QemuSpec {
    pub(crate) qemu: String,
    /// Kvm or Tcg (never Auto here).
    pub(crate) accel: Accel,
    pub(crate) vcpus: u32,
    /// QEMU size syntax: `1G`, `2048M`.
    pub(crate) memory: String,
    pub(crate) kernel: PathBuf,
    pub(crate) initramfs: PathBuf,
    pub(crate) append: String,
    pub(crate) disks: Vec<QemuDisk>,
    /// `-icount shift=0` with single-threaded TCG (TCG only).
    pub(crate) deterministic: bool,
    /// `-plugin` argument: the plugin's path and its arguments
    /// (`/x/libblklab-insns.so,ctl=/x/insns.sock`), TCG only.
    pub(crate) plugin: Option<String>,
    /// A QMP socket QEMU listens on (`-qmp unix:PATH,server=on,wait=off`).
    pub(crate) qmp: Option<PathBuf>,
    /// What backs the guest's RAM.
    pub(crate) ram: GuestRam,
}

impl QemuSpec {
    /// The complete argument vector (without the program).
    pub(crate) fn args(&self) -> Vec<String> {
        let mut a: Vec<String> = Vec::new();
        let mut push = |s: &[&str]| a.extend(s.iter().map(|x| x.to_string()));
        match self.accel {
            Accel::Kvm => push(&["-accel", "kvm", "-cpu", "host"]),
            _ if self.deterministic => push(&["-accel", "tcg,thread=single", "-icount", "shift=0"]),
            _ => push(&["-accel", "tcg,thread=multi"]),
        }
        if let (Some(p), false) = (&self.plugin, self.accel == Accel::Kvm) {
            push(&["-plugin", p]);
        }
        if let Some(q) = &self.qmp {
            push(&["-qmp", &format!("unix:{},server=on,wait=off", q.display())]);
        }
        push(&["-name", "blklab,debug-threads=on"]);
        push(&["-smp", &self.vcpus.to_string(), "-m", &self.memory]);
        push(HEADLESS);
        push(&["-kernel", &self.kernel.display().to_string()]);
        push(&["-initrd", &self.initramfs.display().to_string()]);
        push(&["-append", &self.append]);
        // Guest RAM shared with the backend, and the disks.
        a.extend(qemu_args::guest_args_on(
            self.ram,
            &self.memory,
            Some(self.machine()),
            &self.disks,
        ));
        a
    }

    /// The machine type. Under KVM without an HPET: a guest that takes
    /// QEMU's HPET for a timer gets its tick through QEMU's main loop, a
    /// wake-up and a `KVM_IRQ_LINE` each (about 250 a second at HZ=250,
    /// 4-7 K host instructions per IO in the nested runs), and only in
    /// some boots, which split one kernel's runs in two; with none it keeps
    /// the local APIC timer and kvm-clock, as virt-install's KVM guests do.
    /// Under TCG the machine is left as it was.
    fn machine(&self) -> &'static str {
        match self.accel {
            Accel::Kvm => "q35,hpet=off",
            _ => "q35",
        }
    }
}

/// Find `qemu` (a name on PATH or a path).
pub(crate) fn locate(qemu: &str) -> Result<PathBuf, QemuError> {
    if qemu.contains('/') {
        let p = PathBuf::from(qemu);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(QemuError::NotFound(qemu.to_string()))
        };
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(qemu))
        .find(|p| p.is_file())
        .ok_or_else(|| QemuError::NotFound(qemu.to_string()))
}

/// `qemu --version`'s first line.
pub(crate) fn version(qemu: &str) -> Option<String> {
    let out = Command::new(qemu).arg("--version").output().ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .map(|s| s.to_string())
}

/// A running guest: QEMU with its serial console on pipes.
pub(crate) struct Guest {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    /// The last console lines, for error messages.
    tail: Arc<Mutex<VecDeque<String>>>,
    stderr: Arc<Mutex<String>>,
    pub(crate) started: Instant,
}

/// QEMU dies with us, however we die (SIGKILL included).
fn die_with_parent(cmd: &mut Command) {
    // SAFETY: getpid before the fork; the closure runs between fork and
    // exec and only calls async-signal-safe functions (prctl, getppid,
    // raise).
    let parent = unsafe { libc::getpid() };
    // SAFETY: see above.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            // The parent died before prctl: do not outlive it.
            if libc::getppid() != parent {
                libc::raise(libc::SIGKILL);
            }
            Ok(())
        });
    }
}

/// A thread reading QEMU's console: each line goes to `log` (when given),
/// the last [`TAIL_LINES`] to `tail`, and every line to the receiver; the
/// receiver disconnects when the console closes.
fn read_console(
    stdout: ChildStdout,
    mut log: Option<std::fs::File>,
    tail: Arc<Mutex<VecDeque<String>>>,
) -> std::io::Result<Receiver<String>> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("blklab-console".into())
        .spawn(move || {
            each_line(stdout, |buf| {
                if let Some(f) = log.as_mut() {
                    let _ = f.write_all(buf);
                }
                let line = String::from_utf8_lossy(buf)
                    .trim_end_matches(['\n', '\r'])
                    .to_string();
                {
                    let mut t = tail.lock().unwrap_or_else(|p| p.into_inner());
                    if t.len() == TAIL_LINES {
                        t.pop_front();
                    }
                    t.push_back(line.clone());
                }
                tx.send(line).is_ok()
            })
        })?;
    Ok(rx)
}

/// Call `f` with each line `r` gives (its newline included, the last one
/// perhaps without), until the end, a read error or `f` says stop.
fn each_line(r: impl Read, mut f: impl FnMut(&[u8]) -> bool) {
    let mut r = BufReader::new(r);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match r.read_until(b'\n', &mut buf) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if !f(&buf) {
            return;
        }
    }
}

/// A thread collecting QEMU's stderr, whole, into the returned text, and
/// logging each line (INFO: the run's log file, not the terminal).
fn collect_stderr(stderr: ChildStderr, pid: u32) -> std::io::Result<Arc<Mutex<String>>> {
    let text = Arc::new(Mutex::new(String::new()));
    let e = text.clone();
    std::thread::Builder::new()
        .name("blklab-qemu-err".into())
        .spawn(move || {
            each_line(stderr, |buf| {
                let line = String::from_utf8_lossy(buf);
                info!("QEMU (pid {pid}): {}", line.trim_end());
                e.lock().unwrap_or_else(|p| p.into_inner()).push_str(&line);
                true
            })
        })?;
    Ok(text)
}

/// What [`Guest::next_line`] saw.
pub(crate) enum Next {
    Line(String),
    /// QEMU closed its console (it exited or is exiting).
    Closed,
}

const TAIL_LINES: usize = 40;

impl Guest {
    /// Start QEMU for `spec`; every console line is also appended to
    /// `console_log` when given.
    pub(crate) fn spawn(spec: &QemuSpec, console_log: Option<&Path>) -> Result<Guest, QemuError> {
        Guest::spawn_args(&spec.qemu, &spec.args(), console_log)
    }

    /// Start `qemu` with `args` (a whole command line of its own, such as
    /// a nested host's); the console as in [`Guest::spawn`].
    pub(crate) fn spawn_args(
        qemu: &str,
        args: &[String],
        console_log: Option<&Path>,
    ) -> Result<Guest, QemuError> {
        debug!("{} {}", qemu, shell_words(args));
        let mut cmd = Command::new(qemu);
        cmd.args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        die_with_parent(&mut cmd);
        // Registered under the registry's lock, so a signal that arrives
        // now either sees the child or comes after it is tracked.
        let mut registry = crate::lab::guest::cleanup::lock();
        let mut child = cmd.spawn().map_err(|source| {
            if source.kind() == std::io::ErrorKind::NotFound {
                QemuError::NotFound(qemu.to_string())
            } else {
                QemuError::Spawn {
                    qemu: qemu.to_string(),
                    source,
                }
            }
        })?;
        registry.track_pid(child.id() as i32);
        drop(registry);
        let no_thread = |source| QemuError::Spawn {
            qemu: qemu.to_string(),
            source,
        };
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take().expect("piped stderr");
        let log = console_log.and_then(|p| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .map_err(|e| warn!("cannot write console log {}: {e}", p.display()))
                .ok()
        });
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        let lines = read_console(stdout, log, tail.clone()).map_err(no_thread)?;
        let stderr = collect_stderr(stderr, child.id()).map_err(no_thread)?;
        Ok(Guest {
            stdin: child.stdin.take(),
            child,
            lines,
            tail,
            stderr,
            started: Instant::now(),
        })
    }

    pub(crate) fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// The next console line, waiting at most until `deadline`.
    pub(crate) fn next_line(&mut self, deadline: Instant, what: &str) -> Result<Next, QemuError> {
        let wait = deadline.saturating_duration_since(Instant::now());
        match self.lines.recv_timeout(wait) {
            Ok(l) => Ok(Next::Line(l)),
            Err(RecvTimeoutError::Disconnected) => Ok(Next::Closed),
            Err(RecvTimeoutError::Timeout) => Err(QemuError::Timeout {
                secs: (deadline - self.started).as_secs().max(1),
                what: what.to_string(),
                console: self.console_tail(),
            }),
        }
    }

    /// The next console line if one comes within `wait`.
    pub(crate) fn poll_line(&mut self, wait: Duration) -> Option<Next> {
        match self.lines.recv_timeout(wait) {
            Ok(l) => Some(Next::Line(l)),
            Err(RecvTimeoutError::Disconnected) => Some(Next::Closed),
            Err(RecvTimeoutError::Timeout) => None,
        }
    }

    /// Type a line on the guest's console.
    pub(crate) fn answer(&mut self, text: &str) -> Result<(), QemuError> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| QemuError::Console(std::io::ErrorKind::BrokenPipe.into()))?;
        stdin
            .write_all(format!("{text}\n").as_bytes())
            .and_then(|_| stdin.flush())
            .map_err(QemuError::Console)
    }

    pub(crate) fn console_tail(&self) -> String {
        self.tail
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    }

    pub(crate) fn stderr_text(&self) -> String {
        self.stderr
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .trim()
            .to_string()
    }

    /// Wait for QEMU to exit by itself (the guest powers off) until
    /// `timeout`, then kill it. Returns its exit status text.
    pub(crate) fn wait_exit(&mut self, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            match self.try_reap() {
                Ok(Some(st)) => return st.to_string(),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                _ => {
                    warn!("QEMU (pid {}) did not exit; killing it", self.pid());
                    return match self.kill_reap() {
                        Ok(st) => format!("killed ({st})"),
                        Err(e) => format!("killed ({e})"),
                    };
                }
            }
        }
    }

    /// `try_wait`, untracking the pid (see [`crate::lab::guest::cleanup`])
    /// in the same critical section as the reap.
    fn try_reap(&mut self) -> std::io::Result<Option<std::process::ExitStatus>> {
        let mut registry = crate::lab::guest::cleanup::lock();
        let st = self.child.try_wait();
        if !matches!(st, Ok(None)) {
            registry.untrack_pid(self.pid());
        }
        st
    }

    /// Kill and reap, untracking the pid in the same critical section.
    fn kill_reap(&mut self) -> std::io::Result<std::process::ExitStatus> {
        let mut registry = crate::lab::guest::cleanup::lock();
        let _ = self.child.kill();
        let st = self.child.wait();
        registry.untrack_pid(self.pid());
        st
    }

    /// The error for a console that closed before the guest finished.
    pub(crate) fn exited_error(&mut self) -> QemuError {
        let status = self.wait_exit(Duration::from_secs(5));
        // Give the stderr reader a moment to collect the last words.
        std::thread::sleep(Duration::from_millis(100));
        QemuError::Exited {
            clean: status == "exit status: 0",
            status,
            stderr: if self.stderr_text().is_empty() {
                "(empty)".into()
            } else {
                self.stderr_text()
            },
            console: self.console_tail(),
        }
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        if let Ok(None) = self.try_reap() {
            let _ = self.kill_reap();
        }
    }
}

/// Quote words for a shell, for logs and the recorded command line.
pub(crate) fn shell_words(args: &[String]) -> String {
    args.iter()
        .map(|a| {
            if !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=,:@%+".contains(c))
            {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Why KVM is not usable.
#[derive(Debug, Error)]
pub(crate) enum KvmProbeError {
    #[error("cannot open /dev/kvm: {0}")]
    DevKvm(#[source] std::io::Error),
    #[error(transparent)]
    Start(#[from] QemuError),
    #[error("QEMU exited ({status}) before the guest started: {last}")]
    Exited { status: String, last: String },
    #[error("the guest did not start within {secs} s under KVM")]
    NoBoot { secs: u64 },
}

/// The real KVM probe: `/dev/kvm` must open, and `kernel`+`initramfs` must
/// boot under KVM to the initramfs's first line within `timeout` (nested
/// KVM often passes every ioctl yet hangs or faults in early boot). Returns
/// the seconds to `/init`, or why not.
pub(crate) fn probe_kvm(
    qemu: &str,
    kernel: &Path,
    initramfs: &Path,
    timeout: Duration,
) -> Result<f64, KvmProbeError> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .map_err(KvmProbeError::DevKvm)?;
    let spec = QemuSpec {
        qemu: qemu.to_string(),
        accel: Accel::Kvm,
        vcpus: 1,
        memory: "256M".into(),
        kernel: kernel.to_path_buf(),
        initramfs: initramfs.to_path_buf(),
        // No such script: /init says so and powers off.
        append: "console=ttyS0 quiet panic=-1 blklab.run=kvm-probe".into(),
        disks: Vec::new(),
        deterministic: false,
        plugin: None,
        qmp: None,
        ram: GuestRam::Memfd,
    };
    let mut g = Guest::spawn(&spec, None)?;
    let deadline = Instant::now() + timeout;
    loop {
        match g.next_line(deadline, "the KVM probe guest") {
            Ok(Next::Line(l)) => {
                if l.contains("BLKLAB-INIT") {
                    let secs = g.started.elapsed().as_secs_f64();
                    g.wait_exit(Duration::from_secs(10));
                    return Ok(secs);
                }
            }
            Ok(Next::Closed) => {
                let st = g.wait_exit(Duration::from_secs(2));
                std::thread::sleep(Duration::from_millis(100));
                let err = g.stderr_text();
                let last = err.lines().last().unwrap_or("no output").to_string();
                return Err(KvmProbeError::Exited { status: st, last });
            }
            Err(_) => {
                return Err(KvmProbeError::NoBoot {
                    secs: timeout.as_secs(),
                })
            }
        }
    }
}

/// QEMU's own crashes that are known bugs of the emulator, not of the
/// guest or the backend: (what its stderr says, what it is).
///
/// - `iotlb_to_section: Assertion` in system/physmem.c: multi-threaded TCG
///   races a memory-map update while the guest's firmware and early kernel
///   program the PCI devices (QEMU issue 1921: "after Probing EDD…, with
///   higher -smp"). Seen here once with QEMU 10.0, 1.25 s into a Debian
///   6.12 boot, before the kernel had found any disk.
/// - `msix_table_mmio_write: Assertion` in hw/pci/msix.c: a store
///   dispatched to a device's MSI-X table at an offset past the table's
///   end, in the same early-boot window (the nested host's QEMU 10.0,
///   before its console had printed a line; the same image booted
///   unchanged in every other run). The guest is Debian's stock kernel,
///   which never writes past a table it sized itself: a stale memory map
///   sending a store to the wrong region is the race above.
pub(crate) const KNOWN_EMULATOR_BUGS: &[(&str, &str)] = &[
    (
        "iotlb_to_section: Assertion",
        "QEMU's multi-threaded TCG memory-map race in early boot (QEMU issue 1921)",
    ),
    (
        "msix_table_mmio_write: Assertion",
        "a store sent past a device's MSI-X table in early boot under multi-threaded TCG (the memory-map race of QEMU issue 1921)",
    ),
];

/// Which known QEMU bug `stderr` shows, if any.
pub fn known_emulator_bug(stderr: &str) -> Option<&'static str> {
    KNOWN_EMULATOR_BUGS
        .iter()
        .find(|(sig, _)| stderr.contains(sig))
        .map(|(_, what)| *what)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(accel: Accel) -> QemuSpec {
        QemuSpec {
            qemu: "qemu-system-x86_64".into(),
            accel,
            vcpus: 4,
            memory: "2G".into(),
            kernel: "/k/vmlinuz".into(),
            initramfs: "/k/initrd".into(),
            append: "console=ttyS0 blklab.run=lab".into(),
            disks: vec![QemuDisk {
                socket: "/tmp/s-0".into(),
                num_queues: 4,
                queue_size: 256,
            }],
            deterministic: false,
            plugin: None,
            qmp: None,
            ram: GuestRam::Memfd,
        }
    }

    #[test]
    fn command_line() {
        let a = spec(Accel::Tcg).args();
        let s = shell_words(&a);
        assert!(s.starts_with("-accel tcg,thread=multi -name blklab,debug-threads=on -smp 4 -m 2G"));
        assert!(s.contains("memory-backend-memfd,id=mem,size=2G,share=on"));
        assert!(s.contains("-append 'console=ttyS0 blklab.run=lab'"));
        assert!(s.contains(
            "-chardev socket,id=blklab0,path=/tmp/s-0 -device vhost-user-blk-pci,chardev=blklab0,id=blklab-disk0,num-queues=4,queue-size=256"
        ));
        let k = shell_words(&spec(Accel::Kvm).args());
        assert!(k.starts_with("-accel kvm -cpu host"));
        // No HPET under KVM; TCG's machine as it was.
        assert!(
            k.contains("-machine q35,hpet=off,memory-backend=mem"),
            "{k}"
        );
        assert!(s.contains("-machine q35,memory-backend=mem"), "{s}");
        let mut d = spec(Accel::Tcg);
        d.deterministic = true;
        d.plugin = Some("/p/libblklab-insns.so,ctl=/s/insns.sock".into());
        let s = shell_words(&d.args());
        assert!(
            s.starts_with("-accel tcg,thread=single -icount shift=0 -plugin /p/libblklab-insns.so,ctl=/s/insns.sock -name"),
            "{s}"
        );
        assert!(!s.contains("-qmp"), "{s}");
        let mut q = spec(Accel::Kvm);
        q.qmp = Some("/s/qmp.sock".into());
        let s = shell_words(&q.args());
        assert!(
            s.starts_with("-accel kvm -cpu host -qmp unix:/s/qmp.sock,server=on,wait=off -name"),
            "{s}"
        );
    }

    #[test]
    fn missing_qemu_is_named() {
        let e = locate("no-such-qemu-binary").unwrap_err().to_string();
        assert!(e.contains("apt-get install qemu-system-x86"), "{e}");
        let mut s = spec(Accel::Tcg);
        s.qemu = "/nonexistent/qemu".into();
        let e = Guest::spawn(&s, None).err().unwrap().to_string();
        assert!(e.contains("not found"), "{e}");
    }

    #[test]
    fn probe_fails_cleanly_without_a_kernel() {
        // Whatever /dev/kvm does here, a missing kernel cannot boot.
        let r = probe_kvm(
            "qemu-system-x86_64",
            Path::new("/nonexistent/vmlinuz"),
            Path::new("/nonexistent/initrd"),
            Duration::from_secs(10),
        );
        assert!(r.is_err());
    }

    #[test]
    fn known_emulator_bugs_are_recognised_by_their_assertion() {
        let stderr = "qemu-system-x86_64: system/physmem.c:2678: iotlb_to_section: Assertion `section_index < d->map.sections_nb' failed.";
        assert!(known_emulator_bug(stderr).unwrap().contains("1921"));
        let stderr = "qemu-system-x86_64: ../hw/pci/msix.c:228: msix_table_mmio_write: Assertion `addr + size <= dev->msix_entries_nr * PCI_MSIX_ENTRY_SIZE' failed.";
        assert!(known_emulator_bug(stderr).unwrap().contains("MSI-X"));
        assert_eq!(
            known_emulator_bug("qemu-system-x86_64: -m 1Q: invalid"),
            None
        );
    }
}
