//! The instruction-count plugin counts retired instructions: a translation
//! block cut short counts only what ran, under plain TCG and under
//! `-icount` (how `blklab run --deterministic` runs QEMU).
//!
//! The guest is Debian's 6.1 kernel (`images/fetch-debian-kernel.sh`, in the
//! image cache) with one program as its `/init`:
//! `tests/fixtures/insns-exact/exact.c`, built here with `gcc -static`. It
//! prints `EXACT ready` and waits for a line; then one asm block of known
//! length runs [`PAGES`] iterations whose load and store each page-fault in
//! the middle of a block (a fresh page: read fault, then write fault), and
//! [`MMIO_ITERS`] iterations with a store to the `edu` PCI device's MMIO
//! register in the middle of a block (QEMU stops the block there and re-runs
//! the store alone, `cpu_io_recompile`, with or without `-icount`), and
//! [`CALLS`] calls, each the last instruction of its block, whose push
//! page-faults; it prints `EXACT end` and waits again. The test takes a
//! plugin dump at each wait; the window's user instructions are exactly
//! [`WINDOW_USER_INSNS`]. Counting each block in full when it starts, as
//! the plugin did before, gives 28 000 more here (see
//! [`OLD_WINDOW_USER_INSNS`]); the window's `cut` count shows such blocks
//! happened.
//!
//! Needs QEMU with the `edu` device, gcc with a static libc, cpio and apt
//! for the kernel (`.ci/install-deps`). About 25 s a boot; two boots.
//!
//! Run: `cargo test --test insns_exact -- --nocapture`

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

use blklab::lab::measure::plugin::Dump;

use common::guest_program::{
    compile_static, console_lines, images_script, newc_archive, plugin_dump, Qemu,
};
use common::qmp::{hmp, qmp_arg};
use common::root;

/// Fresh pages the program touches: a load then a store to each, two page
/// faults a page, each in the middle of its block.
const PAGES: u64 = 2000;

/// Device stores in the middle of a block.
const MMIO_ITERS: u64 = 1000;

/// Calls whose push page-faults, each the last instruction of its block.
const CALLS: u64 = 1000;

/// Every user instruction from the return of the first wait's `read(2)` to
/// the second wait's `syscall`, as written in exact.c's asm block: 2 + 8 a
/// page, 2 + 5 an MMIO iteration, 3 + 5 a call, 5 for the `write(2)` of
/// `EXACT end`, 5 for the `read(2)`. Nothing else runs in user space: the
/// program is the guest's only process, and it is blocked in `read(2)` at
/// both dumps.
const WINDOW_USER_INSNS: u64 = 2 + 8 * PAGES + 2 + 5 * MMIO_ITERS + 3 + 5 * CALLS + 5 + 5;

/// What counting each block in full when it starts gave for the same window
/// (measured with the plugin before it counted retired instructions). Per
/// page: the loop's block of 8 counted whole where 1 instruction retired
/// before the load faulted (7 too many), then the block from the load (7)
/// where 2 retired before the store faulted (5 too many). Per MMIO
/// iteration: the block of 5 counted whole where 1 retired before the store
/// (4 too many), and the store, re-run alone without execution callbacks,
/// never (1 too few). Per call: its block counted whole, the call again
/// when re-run after the fault (1 too many).
const OLD_WINDOW_USER_INSNS: u64 =
    WINDOW_USER_INSNS + (7 + 5) * PAGES + (4 - 1) * MMIO_ITERS + CALLS;

/// The whole boot's limit (a boot takes about 25 s on an idle 2-core
/// machine).
const TIMEOUT: Duration = Duration::from_secs(240);

/// The boots share two CPUs: one at a time.
static BOOT: Mutex<()> = Mutex::new(());

#[test]
fn plain_tcg_counts_retired_instructions_across_faults_and_device_stores() {
    exact(&["-accel", "tcg,thread=multi", "-smp", "2"]);
}

#[test]
fn icount_counts_retired_instructions_across_faults_and_device_stores() {
    exact(&[
        "-accel",
        "tcg,thread=single",
        "-icount",
        "shift=0",
        "-smp",
        "1",
    ]);
}

fn exact(accel: &[&str]) {
    let _g = BOOT.lock().unwrap_or_else(|p| p.into_inner());
    let t0 = Instant::now();
    let cache = common::image_cache();
    let plugin = images_script(
        "build-qemu-plugin.sh",
        &["--cache".as_ref(), cache.as_os_str()],
    )
    .pop()
    .expect("build-qemu-plugin.sh prints the plugin's path");
    let kernel_dir = cache.join("kernel-6.1");
    images_script(
        "fetch-debian-kernel.sh",
        &["6.1".as_ref(), kernel_dir.as_os_str()],
    );
    let dir = tempfile::tempdir().unwrap();
    let initrd = initramfs(&dir.path().join("stage"));
    let ctl = dir.path().join("ctl.sock");
    let qmp = dir.path().join("qmp.sock");
    let log = dir.path().join("qemu.log");
    let child = Command::new("qemu-system-x86_64")
        .args(accel)
        .args(["-m", "256M", "-display", "none", "-nodefaults"])
        .args(["-serial", "stdio", "-monitor", "none", "-no-reboot"])
        .args(["-nic", "none", "-device", "edu,addr=05.0"])
        .arg("-qmp")
        .arg(qmp_arg(&qmp))
        .arg("-plugin")
        .arg(format!("{},ctl={}", plugin.display(), ctl.display()))
        .arg("-kernel")
        .arg(kernel_dir.join("vmlinuz"))
        .arg("-initrd")
        .arg(&initrd)
        .args(["-append", "console=ttyS0 quiet loglevel=3 panic=-1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("start qemu-system-x86_64");
    let mut qemu = Qemu(child);
    let (begin, end, console) = drive(&mut qemu, &ctl, &qmp, dir.path());
    let status = qemu.0.wait().unwrap();
    eprintln!("{accel:?}: {:.1} s\n{console}", t0.elapsed().as_secs_f64());
    assert!(
        status.success(),
        "QEMU: {status}: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );

    let w = end.since(&begin);
    let summary = format!(
        "kernel {} user {}, cut {} reruns {}",
        w.level1.kernel(),
        w.level1.user(),
        w.cut,
        w.reruns
    );
    eprintln!("{accel:?}: window: {summary}");
    assert_eq!(w.cut_unavailable, None);
    assert_eq!(
        w.level1.user(),
        WINDOW_USER_INSNS,
        "the window's user instructions ({summary}); counting blocks in full would give \
         {OLD_WINDOW_USER_INSNS}"
    );
    // Not vacuous: each page's two faults, each device store and each
    // call's fault cut a block short in the window, and each store was
    // re-run alone.
    assert!(w.cut >= 2 * PAGES + MMIO_ITERS + CALLS, "{summary}");
    assert!(w.reruns >= MMIO_ITERS, "{summary}");
    assert_eq!(w.level2.kernel() + w.level2.user(), 0, "{summary}");
    // The per-block profile is corrected with the totals: taken with the
    // machine stopped, each dump's kernel blocks add up to its kernel
    // count.
    for d in [&begin, &end] {
        let blocks: u64 = d.level1.blocks.values().map(|(insns, _)| insns).sum();
        assert_eq!(blocks, d.level1.kernel(), "kernel blocks vs kernel count");
    }
}

/// The plugin's test of which instructions may stop a block
/// (images/qemu-plugin/stop-test.c on `may_stop_block` of blklab-decode.h):
/// an instruction wrongly said not to would leave a block cut short there
/// counted whole.
#[test]
fn plugin_knows_which_instructions_may_stop_a_block() {
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("stop-test");
    let cc = Command::new("gcc")
        .args(["-Wall", "-Wextra", "-Werror", "-std=gnu11", "-o"])
        .arg(&exe)
        .arg(root().join("images/qemu-plugin/stop-test.c"))
        .output()
        .expect("run gcc (the plugin's build needs it too)");
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let out = Command::new(&exe).output().unwrap();
    let t = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{t}");
    assert!(t.trim_end().ends_with("79 passed, 0 failed"), "{t}");
}

/// Build exact.c as `stage/init` and return a newc archive of it with the
/// `/dev` and `/sys` it mounts.
fn initramfs(stage: &Path) -> PathBuf {
    for d in ["dev", "sys"] {
        std::fs::create_dir_all(stage.join(d)).unwrap();
    }
    let defines = [
        format!("PAGES={PAGES}"),
        format!("MMIO_ITERS={MMIO_ITERS}"),
        format!("CALLS={CALLS}"),
    ];
    let source = root().join("tests/fixtures/insns-exact/exact.c");
    compile_static(&source, &defines, &stage.join("init"));
    let archive = newc_archive(stage, ".");
    let path = stage.with_extension("cpio");
    std::fs::write(&path, archive).unwrap();
    path
}

/// Read the console, take the dumps at `EXACT ready` and `EXACT end` and
/// answer each; returns the two dumps and the console once the program has
/// powered the machine off.
fn drive(qemu: &mut Qemu, ctl: &Path, qmp: &Path, dir: &Path) -> (Dump, Dump, String) {
    let rx = console_lines(qemu);
    let mut stdin = qemu.0.stdin.take().unwrap();
    let deadline = Instant::now() + TIMEOUT;
    let (mut dumps, mut console) = (Vec::new(), String::new());
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = match rx.recv_timeout(left) {
            Ok(l) => l,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                panic!("the program did not finish within {TIMEOUT:?}; console:\n{console}")
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        };
        let line = line.trim_end_matches('\r');
        console.push_str(line);
        console.push('\n');
        assert!(
            !line.starts_with("EXACT error"),
            "the program failed:\n{console}"
        );
        if line.starts_with("EXACT ready") || line.starts_with("EXACT end") {
            dumps.push(settled_dump(
                ctl,
                qmp,
                &dir.join(format!("{}.insns", dumps.len())),
            ));
            stdin.write_all(b"go\n").unwrap();
            stdin.flush().unwrap();
        }
    }
    let [begin, end]: [Dump; 2] = dumps
        .try_into()
        .unwrap_or_else(|d: Vec<Dump>| panic!("{} dumps, not 2; console:\n{console}", d.len()));
    (begin, end, console)
}

/// A dump taken once the program waits in `read(2)`: the line it printed
/// can reach the console before it gets there, so dump, with the machine
/// stopped, until two dumps 100 ms apart hold the same user count (the
/// program is the only user-space code). Stopped, the kernel's idle work
/// does not move the counts while the dump is written.
fn settled_dump(ctl: &Path, qmp: &Path, file: &Path) -> Dump {
    let mut last: Option<Dump> = None;
    for _ in 0..100 {
        hmp(qmp, "stop", Duration::from_secs(30)).expect("QMP stop");
        let d = plugin_dump(ctl, file);
        hmp(qmp, "cont", Duration::from_secs(30)).expect("QMP cont");
        if last
            .as_ref()
            .is_some_and(|l| l.level1.user() == d.level1.user())
        {
            return d;
        }
        last = Some(d);
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("the user count did not settle: is the program waiting?");
}
