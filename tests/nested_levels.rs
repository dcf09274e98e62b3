//! The instruction-count plugin's level split on real emulated hardware: a
//! busy loop in a KVM guest counts as level 2 (the guest), one in the host
//! as level 1 (the host), each to the instruction.
//!
//! The nested host image (`images/build-nested-host.sh`) boots under TCG
//! with an SVM CPU (`-cpu EPYC`), and, as `blklab run --accel nested` boots
//! it, two NUMA nodes: node 1, without vCPUs, holds the host's 2 MiB huge
//! pages, which the guest's memory is made of, and the plugin
//! (`images/build-qemu-plugin.sh`, with a control socket) is told node 1's
//! backing file (`l2ram=`): it counts a block at level 2 when its code lies
//! there. Once with one vCPU under `-icount` (as `--deterministic` runs
//! it), once with two vCPUs on two threads. Its /init runs `/lab/run/blklab`, here
//! `tests/fixtures/nested-levels/levels.c` compiled with `gcc -static`
//! (from a newc archive appended to host.cpio): it creates a KVM VM whose
//! one real-mode vCPU counts `ecx` down from [`GUEST_ITERATIONS`] and halts,
//! and runs its own loop of [`HOST_ITERATIONS`] after it, printing a
//! `LEVELS …` line before and after each loop and waiting for `go` after
//! each line. At each line the test takes a plugin dump, then answers: the
//! guest's window is the dump at `guest-end` since the one at
//! `guest-begin`, the host's likewise.
//!
//! Needs QEMU (qemu-system-x86_64 with TCG's SVM), gcc with a static libc
//! (`.ci/install-deps`), and builds or reuses the plugin and the host image
//! in the shared image cache (`BLKLAB_IMAGE_CACHE` overrides it; the host
//! image is a few minutes to build the first time). About 20 s a boot once
//! cached; two boots (one vCPU, two vCPUs).
//!
//! Run: `cargo test --test nested_levels -- --nocapture`

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

use blklab::lab::insns::{Dump, ExitKind, LevelRule};

use common::root;

/// The guest's loop: `dec ecx; jnz` this many times.
const GUEST_ITERATIONS: u64 = 3_000_000;

/// The host's loop: `dec; jnz` on a register this many times. Not
/// [`GUEST_ITERATIONS`], so counts landing in the other loop's window
/// show.
const HOST_ITERATIONS: u64 = 5_000_000;

/// Everything the guest executes: `mov ecx, N`, N times `dec ecx; jnz`,
/// `hlt`. Exact: no interrupt reaches the guest (IF is clear and the VM
/// has no interrupt controller), so it runs nothing else; TCG leaves a
/// translation block only at its end (the plugin counts a whole block when
/// it starts), `hlt`, whose intercept exits to the host, ends its block,
/// and a #VMEXIT for a host interrupt or a nested page fault happens
/// between blocks or before a block runs, the guest resuming there.
const GUEST_INSNS: u64 = 2 * GUEST_ITERATIONS + 2;

/// The exits loop: `out` to port 0xe9 and `cpuid`, each this many times.
const EXIT_ITERATIONS: u64 = 1_000;

/// The host loop's own instructions.
const HOST_LOOP_INSNS: u64 = 2 * HOST_ITERATIONS;

/// What the host's window holds at user addresses besides the loop: the
/// line protocol's side of `levels` (the return from the `write(2)` of
/// `host-begin`, the `read(2)` of `go` and its check, the `write(2)` of
/// `host-end`, the start of the next `read(2)`: no stdio, a few hundred
/// instructions of a static binary, 221 to 247 measured), and nothing
/// else: the host's only other process, /init's shell, waits for `levels`.
const HOST_USER_SLACK: u64 = 1_000;

/// What the guest's window may hold at level-1 user addresses: `levels`
/// in `KVM_RUN` and back (KVM handles a #VMEXIT for a host interrupt in
/// the kernel; only the HLT returns to user space) and the protocol's
/// lines (230 to 260 measured). Far below either loop: neither loop is
/// counted in the host's user space there.
const GUEST_HOST_USER_SLACK: u64 = 1_000;

/// The whole boot's limit: boot, the two loops and power-off take about
/// 20 s on an idle 2-core machine.
const TIMEOUT: Duration = Duration::from_secs(300);

/// The host's CPU, as the nested lab boots it (src/lab/nested/host.rs):
/// EPYC without the features TCG does not emulate.
const HOST_CPU: &str =
    "EPYC,fxsr-opt=off,misalignsse=off,osvw=off,topoext=off,nrip-save=off,xsavec=off";

/// The lines `images/SCRIPT --cache CACHE` prints on stdout (its stderr
/// goes to the test's); panics if it fails.
fn script_lines(script: &str, cache: &Path) -> Vec<PathBuf> {
    let out = Command::new("sh")
        .arg(root().join("images").join(script))
        .arg("--cache")
        .arg(cache)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("cannot run images/{script}: {e}"));
    assert!(
        out.status.success(),
        "images/{script} failed: {}",
        out.status
    );
    String::from_utf8(out.stdout)
        .expect("script output is UTF-8")
        .lines()
        .map(PathBuf::from)
        .collect()
}

/// Compile levels.c into `stage/lab/run/blklab` and return the newc
/// archive of `lab`, `lab/run` and the binary.
fn run_archive(stage: &Path) -> Vec<u8> {
    common::tools::require(&["gcc", "--version"], "apt-get install gcc libc6-dev");
    let run = stage.join("lab/run");
    std::fs::create_dir_all(&run).unwrap();
    let out = Command::new("gcc")
        .args(["-static", "-O1", "-Wall", "-Wextra", "-Werror"])
        .arg(format!("-DGUEST_ITERATIONS={GUEST_ITERATIONS}"))
        .arg(format!("-DHOST_ITERATIONS={HOST_ITERATIONS}"))
        .arg(format!("-DEXIT_ITERATIONS={EXIT_ITERATIONS}"))
        .arg("-o")
        .arg(run.join("blklab"))
        .arg(root().join("tests/fixtures/nested-levels/levels.c"))
        .output()
        .expect("run gcc");
    assert!(
        out.status.success(),
        "gcc -static failed (a static libc comes with libc6-dev):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cpio = Command::new("sh")
        .arg("-c")
        .arg("cd \"$1\" && find lab | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet")
        .arg("sh")
        .arg(stage)
        .output()
        .expect("run cpio");
    assert!(cpio.status.success(), "cpio failed");
    cpio.stdout
}

/// Ask the plugin behind `ctl` for a dump into `file` and read it.
fn dump(ctl: &Path, file: &Path) -> Dump {
    let mut s = UnixStream::connect(ctl)
        .unwrap_or_else(|e| panic!("connect to the plugin at {}: {e}", ctl.display()));
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    writeln!(s, "dump {}", file.display()).unwrap();
    let mut line = String::new();
    BufReader::new(&s).read_line(&mut line).unwrap();
    assert_eq!(
        line.trim_end(),
        format!("ok {}", file.display()),
        "the plugin's answer"
    );
    Dump::read(file).unwrap_or_else(|e| panic!("{e}"))
}

/// QEMU, killed when dropped (a failed assertion must not leave it running).
struct Qemu(Child);

impl Drop for Qemu {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

/// The host's machine: its vCPUs and TCG's accelerator options.
#[derive(Debug, Clone, Copy)]
struct Machine {
    vcpus: u32,
    accel: &'static [&'static str],
}

/// The host's NUMA node 1 (no vCPUs), in MiB: its huge pages, which the
/// guest's memory is, and their overhead (as the nested lab sizes it in
/// src/lab/nested/host.rs).
const GUEST_NODE_MIB: u32 = 128;

/// 2 MiB huge pages on node 1: `levels` needs one.
const HUGE_PAGES: u32 = 8;

struct Boot<'a> {
    plugin: &'a Path,
    ctl: &'a Path,
    /// Node 1's backing file, the plugin's `l2ram=`.
    guest_node: &'a Path,
    kernel: &'a Path,
    initrd: &'a Path,
    log: &'a Path,
}

fn boot(m: Machine, b: &Boot) -> Qemu {
    let child = Command::new("qemu-system-x86_64")
        .args(m.accel)
        .args(["-M", "q35", "-cpu", HOST_CPU])
        .args(["-smp", &m.vcpus.to_string(), "-display", "none"])
        .args(["-m", &format!("{}M", 1024 + GUEST_NODE_MIB)])
        .args(["-object", "memory-backend-ram,id=host-node,size=1024M"])
        .arg("-object")
        .arg(format!(
            "memory-backend-file,id=guest-node,size={GUEST_NODE_MIB}M,mem-path={},share=off",
            b.guest_node.display()
        ))
        .arg("-numa")
        .arg(format!(
            "node,nodeid=0,cpus=0-{},memdev=host-node",
            m.vcpus - 1
        ))
        .args(["-numa", "node,nodeid=1,memdev=guest-node"])
        .args(["-serial", "stdio", "-monitor", "none", "-no-reboot"])
        .args(["-nic", "none", "-plugin"])
        .arg(format!(
            "{},ctl={},l2ram={}",
            b.plugin.display(),
            b.ctl.display(),
            b.guest_node.display()
        ))
        .arg("-kernel")
        .arg(b.kernel)
        .arg("-initrd")
        .arg(b.initrd)
        .arg("-append")
        .arg(format!(
            "console=ttyS0 quiet loglevel=3 panic=-1 nokaslr hugepagesz=2M hugepages=1:{HUGE_PAGES}"
        ))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(b.log).unwrap())
        .spawn()
        .expect("start qemu-system-x86_64");
    Qemu(child)
}

/// The host's four dumps, by step.
#[derive(Default)]
struct Dumps {
    steps: Vec<(String, Dump)>,
}

impl Dumps {
    fn at(&self, step: &str) -> &Dump {
        &self
            .steps
            .iter()
            .find(|(s, _)| s == step)
            .unwrap_or_else(|| panic!("no dump at {step}"))
            .1
    }

    fn window(&self, begin: &str, end: &str) -> Dump {
        self.at(end).since(self.at(begin))
    }
}

/// Read the console until `BLKLAB-HOST-END`, dumping and answering `go` at
/// each `LEVELS` line. Returns the dumps and the console.
fn drive(qemu: &mut Qemu, ctl: &Path, dir: &Path) -> (Dumps, String) {
    let (tx, rx) = mpsc::channel();
    let stdout = qemu.0.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut stdin: ChildStdin = qemu.0.stdin.take().unwrap();
    let deadline = Instant::now() + TIMEOUT;
    let (mut dumps, mut console) = (Dumps::default(), String::new());
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = match rx.recv_timeout(left) {
            Ok(l) => l,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                panic!("no BLKLAB-HOST-END within {TIMEOUT:?}; console:\n{console}")
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                panic!("QEMU closed the console before BLKLAB-HOST-END:\n{console}")
            }
        };
        let line = line.trim_end_matches('\r');
        console.push_str(line);
        console.push('\n');
        if line.starts_with("BLKLAB-HOST-END") {
            return (dumps, console);
        }
        let Some(step) = line.strip_prefix("LEVELS ") else {
            continue;
        };
        assert!(
            !step.starts_with("error"),
            "the host program failed:\n{console}"
        );
        let d = dump(ctl, &dir.join(format!("{step}.insns")));
        eprintln!("{step}: {}", summary(&d));
        dumps.steps.push((step.to_string(), d));
        stdin.write_all(b"go\n").unwrap();
        stdin.flush().unwrap();
    }
}

fn summary(d: &Dump) -> String {
    format!(
        "level1 kernel {} user {}, level2 kernel {} user {}, vmruns {} returns {} mixed {} \
         disagree {}",
        d.level1.kernel(),
        d.level1.user(),
        d.level2.kernel(),
        d.level2.user(),
        d.vmruns(),
        d.returns(),
        d.mixed,
        d.disagree
    )
}

/// The boots share two CPUs: one at a time.
static BOOT: Mutex<()> = Mutex::new(());

/// One vCPU under `-icount` (as `blklab run --accel nested
/// --deterministic` runs the host): QEMU restarts translation blocks
/// there, some without the plugin's callbacks, so the VMRUN tracking may
/// lose transitions; the levels by address stay exact.
#[test]
fn one_vcpu_under_icount_a_guest_loop_counts_at_level_2_and_a_host_loop_at_level_1() {
    levels(Machine {
        vcpus: 1,
        accel: &["-accel", "tcg,thread=single", "-icount", "shift=0"],
    });
}

/// Two vCPUs, one TCG thread each (how `blklab run --accel nested` boots
/// the host by default): the host's scheduler may move `levels`, and with
/// it the KVM vCPU, between them; each vCPU's level is its own. Without
/// `-icount` the VMRUN tracking agrees with the address block for block.
#[test]
fn two_vcpus_a_guest_loop_counts_at_level_2_and_a_host_loop_at_level_1() {
    levels(Machine {
        vcpus: 2,
        accel: &["-accel", "tcg,thread=multi"],
    });
}

/// Whether the machine runs under `-icount`.
fn icount(m: Machine) -> bool {
    m.accel.contains(&"-icount")
}

/// Boot the host on `machine`, run `levels` in it, and check both windows:
/// the guest's loop counts at level 2, exactly, and not in the host's user
/// space; the host's loop counts at level 1 user, and nothing at level 2.
fn levels(machine: Machine) {
    let cache = common::image_cache();
    let plugin = script_lines("build-qemu-plugin.sh", &cache)
        .pop()
        .expect("build-qemu-plugin.sh prints the plugin's path");
    let image = script_lines("build-nested-host.sh", &cache);
    let [kernel, host_cpio] = &image[..] else {
        panic!("build-nested-host.sh printed {image:?}, not the kernel and host.cpio")
    };
    let dir = tempfile::tempdir().unwrap();
    let mut initrd = std::fs::read(host_cpio).unwrap();
    initrd.extend(run_archive(&dir.path().join("stage")));
    let combined = dir.path().join("combined.cpio");
    std::fs::write(&combined, initrd).unwrap();

    let ctl = dir.path().join("ctl.sock");
    let guest_node = dir.path().join("guest-node.ram");
    let log = dir.path().join("qemu.log");
    let _g = BOOT.lock().unwrap_or_else(|p| p.into_inner());
    let t0 = Instant::now();
    let b = Boot {
        plugin: &plugin,
        ctl: &ctl,
        guest_node: &guest_node,
        kernel,
        initrd: &combined,
        log: &log,
    };
    let mut qemu = boot(machine, &b);
    let (dumps, console) = drive(&mut qemu, &ctl, dir.path());
    let status = qemu.0.wait().unwrap();
    eprintln!("{machine:?}: {:?}\n{console}", t0.elapsed());
    assert!(
        status.success(),
        "QEMU: {status}: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let cpus = format!(
        " kvm=yes cpus={} node1-huge-pages={HUGE_PAGES}\n",
        machine.vcpus
    );
    assert!(console.contains(&cpus), "want{cpus}in:\n{console}");
    assert!(console.contains("BLKLAB-HOST-END rc=0"), "{console}");
    let steps: Vec<&str> = dumps.steps.iter().map(|(s, _)| s.as_str()).collect();
    assert_eq!(
        steps,
        [
            "guest-begin",
            "guest-end",
            "host-begin",
            "host-end",
            "exits-begin",
            "exits-end"
        ]
    );

    let guest = dumps.window("guest-begin", "guest-end");
    eprintln!("{machine:?}: guest window: {}", summary(&guest));
    // Real mode at 0000:1000: a user address by the plugin's rule (below
    // 0xffff800000000000).
    assert_eq!(
        guest.level2.kernel(),
        0,
        "guest window: {}",
        summary(&guest)
    );
    assert_eq!(
        guest.level2.user(),
        GUEST_INSNS,
        "guest window: level 2 is the guest's {GUEST_INSNS} instructions: {}",
        summary(&guest)
    );
    assert!(guest.vmruns() >= 1, "{}", summary(&guest));
    assert_eq!(guest.rule, LevelRule::Address);
    assert!(
        icount(machine) || guest.levels_consistent(),
        "{}",
        summary(&guest)
    );
    assert!(
        guest.level1.user() <= GUEST_HOST_USER_SLACK,
        "guest window: the guest's loop counted in the host's user space: {}",
        summary(&guest)
    );

    let host = dumps.window("host-begin", "host-end");
    eprintln!("{machine:?}: host window: {}", summary(&host));
    assert_eq!(
        host.level2.kernel() + host.level2.user(),
        0,
        "host window: the host's loop counted as guest: {}",
        summary(&host)
    );
    assert_eq!(host.vmruns(), 0, "{}", summary(&host));
    assert!(
        icount(machine) || host.levels_consistent(),
        "{}",
        summary(&host)
    );
    let user = host.level1.user();
    assert!(
        (HOST_LOOP_INSNS..=HOST_LOOP_INSNS + HOST_USER_SLACK).contains(&user),
        "host window: level 1 user {user}, want the loop's {HOST_LOOP_INSNS} + at most {HOST_USER_SLACK}: {}",
        summary(&host)
    );
    exits(&dumps);
    // From the first window on, as a dump's self-check says. Not from
    // power-on: the firmware (SeaBIOS relocates its init code to the top
    // of RAM, in node 1) counts at level 2 by address, some 400 000
    // instructions before the kernel starts, which the VMRUN tracking
    // counts at level 1.
    let after_boot = dumps.window("guest-begin", "host-end");
    assert!(
        icount(machine) || after_boot.levels_consistent(),
        "{}",
        summary(&after_boot)
    );
}

/// The would-be exits, exactly: the guest's one HLT at level 2 and nothing
/// else there; the host program's `out` to port 0xe9 and `cpuid`, each
/// [`EXIT_ITERATIONS`] times, at level 1 (no other code uses that port or,
/// in so short a window, CPUID), none at level 2.
fn exits(dumps: &Dumps) {
    let guest = dumps.window("guest-begin", "guest-end");
    assert_eq!(guest.exits_unavailable, None);
    let l2: Vec<(ExitKind, u64)> = guest
        .level2
        .exits
        .counts
        .iter()
        .map(|((_, k), n)| (*k, *n))
        .collect();
    assert_eq!(l2, [(ExitKind::Hlt, 1)], "guest window, level 2");
    let io = dumps.window("exits-begin", "exits-end");
    let l1 = &io.level1.exits;
    assert_eq!(l1.of(ExitKind::Out(0xe9)), EXIT_ITERATIONS, "{l1:?}");
    assert_eq!(l1.of(ExitKind::Cpuid), EXIT_ITERATIONS, "{l1:?}");
    assert_eq!(l1.of(ExitKind::In(0xe9)), 0, "{l1:?}");
    assert!(io.level2.exits.counts.is_empty(), "{:?}", io.level2.exits);
    // Outside the loop's window the port is not used.
    let host = dumps.window("host-begin", "host-end");
    assert_eq!(host.level1.exits.of(ExitKind::Out(0xe9)), 0);
}
