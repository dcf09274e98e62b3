//! The nested host booted with a small static C program as its
//! `/lab/run/blklab`, driven line by line with a plugin dump at each
//! `LEVELS step` line (tests/nested_levels.rs, tests/exit_cost.rs).
//!
//! The nested host image (`images/build-nested-host.sh`) boots under TCG
//! with an SVM CPU (`-cpu EPYC`), and, as `blklab run --accel nested` boots
//! it, two NUMA nodes: node 1, without vCPUs, holds the host's 2 MiB huge
//! pages, which the KVM guest's memory is made of, and the plugin
//! (`images/build-qemu-plugin.sh`, with a control socket) is told node 1's
//! backing file (`l2ram=`): it counts a block at level 2 when its code lies
//! there. The program (compiled with `gcc -static`, from a newc archive
//! appended to host.cpio) prints `LEVELS STEP` lines and waits for a line
//! `go` after each; at each line [`run`] takes a plugin dump, then answers.

use std::io::Write;
use std::path::Path;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

use blklab::lab::measure::plugin::Dump;

use super::guest_program::{
    compile_static, console_lines, images_script, newc_archive, plugin_dump, Qemu,
};
use super::root;

/// The host's CPU, as the nested lab boots it (src/lab/run/nested_host.rs):
/// EPYC without the features TCG does not emulate.
const HOST_CPU: &str =
    "EPYC,fxsr-opt=off,misalignsse=off,osvw=off,topoext=off,nrip-save=off,xsavec=off";

/// The host's NUMA node 1 (no vCPUs), in MiB: its huge pages, which the
/// guest's memory is, and their overhead (as the nested lab sizes it in
/// src/lab/run/nested_host.rs).
const GUEST_NODE_MIB: u32 = 128;

/// 2 MiB huge pages on node 1: the programs need one.
pub(crate) const HUGE_PAGES: u32 = 8;

/// The host's machine: its vCPUs and TCG's accelerator options.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Machine {
    pub vcpus: u32,
    pub accel: &'static [&'static str],
}

impl Machine {
    /// One vCPU under `-icount` (as `blklab run --accel nested
    /// --deterministic` runs the host).
    pub(crate) const ICOUNT: Machine = Machine {
        vcpus: 1,
        accel: &["-accel", "tcg,thread=single", "-icount", "shift=0"],
    };

    /// Two vCPUs, one TCG thread each (how `blklab run --accel nested`
    /// boots the host by default).
    pub(crate) const TWO_VCPUS: Machine = Machine {
        vcpus: 2,
        accel: &["-accel", "tcg,thread=multi"],
    };

    /// Whether the machine runs under `-icount`.
    pub(crate) fn icount(self) -> bool {
        self.accel.contains(&"-icount")
    }
}

/// The program to run: a C file under tests/fixtures/nested-levels and its
/// `-D` defines.
pub(crate) struct Program<'a> {
    pub source: &'a str,
    pub defines: &'a [(&'a str, u64)],
    /// The whole boot's limit.
    pub timeout: Duration,
}

/// The dumps taken at the program's `LEVELS` lines, by step.
#[derive(Default)]
pub(crate) struct Dumps {
    pub steps: Vec<(String, Dump)>,
}

impl Dumps {
    pub(crate) fn at(&self, step: &str) -> &Dump {
        &self
            .steps
            .iter()
            .find(|(s, _)| s == step)
            .unwrap_or_else(|| panic!("no dump at {step}"))
            .1
    }

    /// The counts between the dumps at `begin` and `end`.
    pub(crate) fn window(&self, begin: &str, end: &str) -> Dump {
        self.at(end).since(self.at(begin))
    }

    pub(crate) fn step_names(&self) -> Vec<&str> {
        self.steps.iter().map(|(s, _)| s.as_str()).collect()
    }
}

/// A dump's counts on one line.
pub(crate) fn summary(d: &Dump) -> String {
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

/// Boot the host on `machine` with `program` as its run binary, dump at
/// each `LEVELS` line, and check that the host ran it on KVM and that it
/// and QEMU exited 0. Returns the dumps and the console.
pub(crate) fn run(machine: Machine, program: &Program) -> (Dumps, String) {
    let cache = super::image_cache();
    let plugin = images_script(
        "build-qemu-plugin.sh",
        &["--cache".as_ref(), cache.as_os_str()],
    )
    .pop()
    .expect("build-qemu-plugin.sh prints the plugin's path");
    let image = images_script(
        "build-nested-host.sh",
        &["--cache".as_ref(), cache.as_os_str()],
    );
    let [kernel, host_cpio] = &image[..] else {
        panic!("build-nested-host.sh printed {image:?}, not the kernel and host.cpio")
    };
    let dir = tempfile::tempdir().unwrap();
    let mut initrd = std::fs::read(host_cpio).unwrap();
    initrd.extend(run_archive(&dir.path().join("stage"), program));
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
    let (dumps, console) = drive(&mut qemu, &ctl, dir.path(), program.timeout);
    let status = qemu.0.wait().unwrap();
    eprintln!("{machine:?}: {:?}\n{console}", t0.elapsed());
    assert!(
        status.success(),
        "QEMU: {status}: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let cpus = format!(
        " kvm=yes cpus={} node1-huge-pages={HUGE_PAGES} heartbeat=15\n",
        machine.vcpus
    );
    assert!(console.contains(&cpus), "want{cpus}in:\n{console}");
    assert!(console.contains("BLKLAB-HOST-END rc=0"), "{console}");
    (dumps, console)
}

/// Compile the program into `stage/lab/run/blklab` and return the newc
/// archive of `lab`, `lab/run` and the binary.
fn run_archive(stage: &Path, program: &Program) -> Vec<u8> {
    let run = stage.join("lab/run");
    std::fs::create_dir_all(&run).unwrap();
    let defines: Vec<String> = program
        .defines
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let source = root()
        .join("tests/fixtures/nested-levels")
        .join(program.source);
    compile_static(&source, &defines, &run.join("blklab"));
    newc_archive(stage, "lab")
}

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

/// Read the console until `BLKLAB-HOST-END`, dumping and answering `go` at
/// each `LEVELS` line. Returns the dumps and the console.
fn drive(qemu: &mut Qemu, ctl: &Path, dir: &Path, timeout: Duration) -> (Dumps, String) {
    let rx = console_lines(qemu);
    let mut stdin: ChildStdin = qemu.0.stdin.take().unwrap();
    let deadline = Instant::now() + timeout;
    let (mut dumps, mut console) = (Dumps::default(), String::new());
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = match rx.recv_timeout(left) {
            Ok(l) => l,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                panic!("no BLKLAB-HOST-END within {timeout:?}; console:\n{console}")
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
        let d = plugin_dump(ctl, &dir.join(format!("{step}.insns")));
        eprintln!("{step}: {}", summary(&d));
        dumps.steps.push((step.to_string(), d));
        stdin.write_all(b"go\n").unwrap();
        stdin.flush().unwrap();
    }
}
