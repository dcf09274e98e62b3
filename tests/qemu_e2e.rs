//! End to end: a real Linux guest (Debian's kernel under QEMU, TCG by
//! default) does fio write+verify on two vhost-user-blk disks served by the
//! real `blklab serve`.
//!
//! The guest image is built with the recipes in `images/` into
//! `${XDG_CACHE_HOME:-$HOME/.cache}/blklab/images` (override with
//! `BLKLAB_IMAGE_CACHE`); both steps are cached, so only the first run
//! downloads a kernel package. The recipes need apt (Debian), qemu-system-x86,
//! fio, busybox-static, cpio and xz-utils; when any of that is missing the test
//! fails loudly, it never skips.
//!
//! Knobs (environment):
//! - `BLKLAB_ACCEL=kvm` boots with KVM (after a real /dev/kvm probe); the
//!   default is `tcg,thread=multi`.
//! - `BLKLAB_QEMU_TIMEOUT` seconds before QEMU is killed (default 240).
//! - `BLKLAB_E2E_CONSOLE=1` prints the whole guest console even on success.
//!
//! Run: `cargo test --test qemu_e2e -- --nocapture`

mod common;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use blklab::backend::qemu_args::{self, QemuDisk};

/// Image preparation and guest boots run one at a time: the recipes share an
/// apt lock and a cache directory, and two TCG guests on a small machine just
/// slow each other down.
static SERIAL: Mutex<()> = Mutex::new(());

use common::root;

/// A bootable guest: kernel + initramfs built by the `images/` recipes.
struct GuestImage {
    kernel: PathBuf,
    initrd: PathBuf,
    fetch_time: Duration,
    build_time: Duration,
}

/// Run one of the `images/` recipes; panic with its output when it fails.
fn run_recipe(script: &str, args: &[&std::ffi::OsStr]) -> Duration {
    let path = root().join("images").join(script);
    let start = Instant::now();
    let out = Command::new("sh")
        .arg(&path)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", path.display()));
    let took = start.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprint!("{stderr}");
    assert!(
        out.status.success(),
        "{script} {args:?} failed ({}):\n--- stdout ---\n{}\n--- stderr ---\n{stderr}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
    );
    took
}

/// Fetch Debian's kernel for `series` ("6.1" or "6.12") and build the
/// initramfs for it, both into the image cache.
fn prepare_guest(series: &str) -> GuestImage {
    let cache = common::image_cache();
    std::fs::create_dir_all(&cache).expect("create image cache dir");
    let kdir = cache.join(format!("kernel-{series}"));
    let initrd = cache.join(format!("initramfs-{series}.cpio.gz"));
    let fetch_time = run_recipe(
        "fetch-debian-kernel.sh",
        &[series.as_ref(), kdir.as_os_str()],
    );
    let build_time = run_recipe(
        "build-initramfs.sh",
        &[
            "--kernel-dir".as_ref(),
            kdir.as_os_str(),
            "--out".as_ref(),
            initrd.as_os_str(),
        ],
    );
    let kernel = kdir.join("vmlinuz");
    assert!(kernel.is_file(), "{} missing after fetch", kernel.display());
    assert!(initrd.is_file(), "{} missing after build", initrd.display());
    eprintln!(
        "[qemu_e2e] {series}: kernel fetch {:.1}s, initramfs build {:.1}s, initramfs {} bytes",
        fetch_time.as_secs_f64(),
        build_time.as_secs_f64(),
        std::fs::metadata(&initrd).map(|m| m.len()).unwrap_or(0)
    );
    GuestImage {
        kernel,
        initrd,
        fetch_time,
        build_time,
    }
}

/// True when /dev/kvm really works: it opens, reports API version 12 and
/// lets us create a VM.
fn kvm_usable() -> bool {
    const KVM_GET_API_VERSION: libc::c_ulong = 0xAE00;
    const KVM_CREATE_VM: libc::c_ulong = 0xAE01;
    // SAFETY: plain open/ioctl/close on descriptors we own; no memory is shared.
    unsafe {
        let fd = libc::open(c"/dev/kvm".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
        if fd < 0 {
            return false;
        }
        let ok = libc::ioctl(fd, KVM_GET_API_VERSION as _, 0) == 12 && {
            let vm = libc::ioctl(fd, KVM_CREATE_VM as _, 0);
            if vm >= 0 {
                libc::close(vm);
            }
            vm >= 0
        };
        libc::close(fd);
        ok
    }
}

/// QEMU accelerator arguments: TCG unless `BLKLAB_ACCEL=kvm` (opt-in: nested
/// KVM can hang guest boot on some hosts).
fn accel_args() -> Vec<String> {
    match std::env::var("BLKLAB_ACCEL").as_deref() {
        Ok("kvm") => {
            assert!(
                kvm_usable(),
                "BLKLAB_ACCEL=kvm but /dev/kvm does not work (probe failed)"
            );
            vec!["-accel".into(), "kvm".into(), "-cpu".into(), "host".into()]
        }
        Ok("tcg") | Ok("") | Err(_) => vec!["-accel".into(), "tcg,thread=multi".into()],
        Ok(other) => panic!("BLKLAB_ACCEL={other}: expected kvm or tcg"),
    }
}

/// What to boot: a guest image, the kernel command line and the vhost-user-blk
/// sockets (one virtio disk each, in order: vda, vdb, ...).
struct QemuSpec<'a> {
    kernel: &'a Path,
    initrd: &'a Path,
    append: String,
    sockets: Vec<PathBuf>,
    num_queues: u16,
    smp: u32,
    mem_mib: u32,
    /// Let a guest `reboot` reset the machine (QEMU without `-no-reboot`).
    reboot: bool,
}

/// Build the QEMU command line for `spec`. Guest RAM is a shared memfd so
/// the vhost-user backend can map it.
fn qemu_command(spec: &QemuSpec) -> Command {
    let mut cmd = Command::new(
        std::env::var_os("BLKLAB_QEMU").unwrap_or_else(|| "qemu-system-x86_64".into()),
    );
    let mut accel = accel_args();
    if spec.reboot && accel[1].starts_with("tcg") {
        // Six boots in one QEMU: multi-threaded TCG's memory-map race in
        // early boot (QEMU issue 1921) then hits often enough to fail runs
        // here, as an assertion in iotlb_to_section or as vCPUs that stop
        // right after the MTRR messages. One TCG thread for both vCPUs has
        // no such race; the device's reset path is the same.
        accel[1] = "tcg,thread=single".into();
    }
    cmd.args(accel);
    cmd.args([
        "-smp",
        &spec.smp.to_string(),
        "-m",
        &format!("{}M", spec.mem_mib),
    ]);
    cmd.args(["-nographic", "-nic", "none"]);
    if !spec.reboot {
        cmd.arg("-no-reboot");
    }
    cmd.arg("-kernel").arg(spec.kernel);
    cmd.arg("-initrd").arg(spec.initrd);
    cmd.arg("-append").arg(&spec.append);
    // Guest RAM shared with the backend and one vhost-user-blk disk per
    // socket, as `blklab serve --print-qemu-args` and the lab write them.
    // 128 entries per queue: QEMU's own default.
    let disks: Vec<QemuDisk> = spec
        .sockets
        .iter()
        .map(|socket| QemuDisk {
            socket: socket.clone(),
            num_queues: spec.num_queues,
            queue_size: 128,
        })
        .collect();
    cmd.args(qemu_args::guest_args(
        &format!("{}M", spec.mem_mib),
        Some("q35"),
        &disks,
    ));
    cmd
}

/// A finished guest run: its console text and a few timestamps.
struct GuestRun {
    console: String,
    status: std::process::ExitStatus,
    total: Duration,
    /// QEMU start -> "BLKLAB-BEGIN" (boot, modules, init).
    to_begin: Option<Duration>,
    /// QEMU start -> "BLKLAB-FIO-JSON-BEGIN" (fio finished).
    to_fio_done: Option<Duration>,
    /// The guest never reached /init (killed by the boot watchdog).
    boot_hang: bool,
    /// What the guest itself printed on its console (no QEMU stderr).
    guest_output: String,
}

/// How long a guest may take to reach /init (normally 5-15 s under TCG).
const BOOT_WATCHDOG: Duration = Duration::from_secs(120);

/// How long a running guest may print nothing at all: every guest script
/// here prints at least once a minute, so a longer silence is a hang (a
/// reboot loop's deadline is several boots long and must not be what
/// catches one).
const SILENCE_WATCHDOG: Duration = Duration::from_secs(180);

/// Run a guest. If it printed nothing at all before the boot watchdog
/// (QEMU or the guest never got going), or QEMU aborted on a known emulator
/// bug before /init, report it, call `before_retry` and boot it once more;
/// those are the only retries. A guest
/// that spoke and then hung, or whose kernel reported a fault (oops, BUG,
/// WARN, panic, call trace) at boot or during fio, fails the test with
/// the console.
fn run_guest_with_retry(
    spec: &QemuSpec,
    control: Option<&std::path::Path>,
    mut before_retry: impl FnMut(),
) -> GuestRun {
    let run = run_guest(qemu_command(spec), qemu_timeout());
    // QEMU itself aborting on a known emulator bug before /init (not the
    // guest, not the backend) is worth a second boot, as in `blklab run`.
    let emulator_bug = (!run.boot_hang && run.to_begin.is_none() && !run.status.success())
        .then(|| blklab::lab::guest::qemu::known_emulator_bug(&run.console))
        .flatten();
    if let Some(bug) = emulator_bug {
        assert_no_kernel_fault(&run);
        eprintln!(
            "[qemu_e2e] WARNING: QEMU aborted on a known emulator bug ({bug}) before /init; booting once more.\n--- console ---\n{}",
            run.console
        );
        before_retry();
        let run = run_guest(qemu_command(spec), qemu_timeout());
        assert!(
            !run.boot_hang,
            "the guest did not reach /init\n--- console ---\n{}",
            run.console
        );
        assert_no_kernel_fault(&run);
        return run;
    }
    if !run.boot_hang {
        assert_no_kernel_fault(&run);
        return run;
    }
    assert!(
        run.guest_output.trim().is_empty(),
        "the guest did not reach /init within {BOOT_WATCHDOG:?} after printing:\n--- console ---\n{}",
        run.console
    );
    let backend = control
        .and_then(|c| blklab::backend::control::query(c, "stats").ok())
        .map(|v| v.to_string())
        .unwrap_or_default();
    eprintln!(
        "[qemu_e2e] WARNING: the guest printed nothing within {BOOT_WATCHDOG:?}; booting it once more.\n--- console ---\n{}\n--- backend stats ---\n{backend}",
        run.console
    );
    before_retry();
    let run = run_guest(qemu_command(spec), qemu_timeout());
    if run.boot_hang {
        panic!(
            "the guest did not reach /init within {BOOT_WATCHDOG:?}, twice\n--- console ---\n{}",
            run.console
        );
    }
    assert_no_kernel_fault(&run);
    run
}

/// Fail with the whole console when the guest kernel reported a fault.
fn assert_no_kernel_fault(run: &GuestRun) {
    let first = run
        .guest_output
        .lines()
        .find(|l| blklab::lab::guest::console::starts_fault(l));
    assert!(
        first.is_none(),
        "the guest kernel reported a fault: {}\n--- console ---\n{}",
        first.unwrap_or(""),
        run.console
    );
}

/// Run QEMU to completion, capturing the serial console, killing it after
/// `timeout` (then panicking with everything it printed).
fn run_guest(mut cmd: Command, timeout: Duration) -> GuestRun {
    let qmp_dir = tempfile::tempdir().expect("tempdir");
    let qmp_path = qmp_dir.path().join("qmp.sock");
    cmd.arg("-qmp").arg(common::qmp::qmp_arg(&qmp_path));
    eprintln!("[qemu_e2e] {:?}", cmd);
    let start = Instant::now();
    let last_output = Arc::new(Mutex::new(Instant::now()));
    let mut child: Child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start qemu-system-x86_64 (apt-get install qemu-system-x86)");
    let console = Arc::new(Mutex::new(String::new()));
    let marks: Arc<Mutex<(Option<Duration>, Option<Duration>)>> =
        Arc::new(Mutex::new((None, None)));
    let out_reader = {
        let console = console.clone();
        let marks = marks.clone();
        let last_output = last_output.clone();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            let mut buf = Vec::new();
            while r
                .read_until(b'\n', &mut buf)
                .map(|n| n > 0)
                .unwrap_or(false)
            {
                let line = String::from_utf8_lossy(&buf).replace('\r', "");
                *last_output.lock().unwrap() = Instant::now();
                let mut m = marks.lock().unwrap();
                if m.0.is_none() && line.contains("BLKLAB-BEGIN ") {
                    m.0 = Some(start.elapsed());
                }
                if m.1.is_none() && line.contains("BLKLAB-FIO-JSON-BEGIN") {
                    m.1 = Some(start.elapsed());
                }
                drop(m);
                console.lock().unwrap().push_str(&line);
                buf.clear();
            }
        })
    };
    let err_reader = {
        let mut stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stderr.read_to_string(&mut s);
            s
        })
    };
    let deadline = start + timeout;
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait for qemu") {
            break st;
        }
        let reached_init = marks.lock().unwrap().0.is_some();
        if !reached_init && start.elapsed() > BOOT_WATCHDOG.min(timeout) {
            let _ = child.kill();
            let status = child.wait().expect("wait for qemu");
            let _ = out_reader.join();
            let stderr = err_reader.join().unwrap_or_default();
            let guest_output = console.lock().unwrap().clone();
            let console = format!("{guest_output}\n--- qemu stderr ---\n{stderr}");
            return GuestRun {
                console,
                guest_output,
                status,
                total: start.elapsed(),
                to_begin: None,
                to_fio_done: None,
                boot_hang: true,
            };
        }
        let silent = last_output.lock().unwrap().elapsed();
        if Instant::now() > deadline || silent > SILENCE_WATCHDOG.min(timeout) {
            // Where the vCPUs are (or that QEMU's main loop no longer
            // answers) before it goes.
            let vcpus = common::qmp::vcpu_state(&qmp_path);
            let _ = child.kill();
            let _ = child.wait();
            let _ = out_reader.join();
            let stderr = err_reader.join().unwrap_or_default();
            panic!(
                "QEMU did not finish within {timeout:?} or was silent for {silent:?}; killed it.\n--- console ---\n{}\n--- qemu stderr ---\n{stderr}\n--- vCPUs before the kill ---\n{vcpus}",
                console.lock().unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let total = start.elapsed();
    let _ = out_reader.join();
    let stderr = err_reader.join().unwrap_or_default();
    let guest_output = console.lock().unwrap().clone();
    let mut text = guest_output.clone();
    if !stderr.is_empty() {
        text.push_str("\n--- qemu stderr ---\n");
        text.push_str(&stderr);
    }
    let (to_begin, to_fio_done) = *marks.lock().unwrap();
    GuestRun {
        console: text,
        status,
        total,
        to_begin,
        to_fio_done,
        boot_hang: false,
        guest_output,
    }
}

/// Lines strictly between `begin` and `end` marker lines.
fn between<'a>(console: &'a str, begin: &str, end: &str) -> Option<Vec<&'a str>> {
    let mut lines = console.lines();
    lines.by_ref().find(|l| l.trim_end() == begin)?;
    let mut out = Vec::new();
    for l in lines {
        if l.trim_end() == end {
            return Some(out);
        }
        out.push(l);
    }
    None
}

/// `BLKLAB-DISK vda writes=N reads=N write_sectors=N read_sectors=N` lines.
fn disk_summaries(
    console: &str,
) -> std::collections::BTreeMap<String, std::collections::BTreeMap<String, u64>> {
    let mut out = std::collections::BTreeMap::new();
    for line in console.lines() {
        let Some(rest) = line.trim().strip_prefix("BLKLAB-DISK ") else {
            continue;
        };
        let mut words = rest.split_whitespace();
        let Some(disk) = words.next() else { continue };
        let fields = words
            .filter_map(|w| w.split_once('='))
            .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
            .collect();
        out.insert(disk.to_string(), fields);
    }
    out
}

fn json_u64(v: &serde_json::Value) -> Option<u64> {
    v.as_u64()
        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
}

fn fail_with_console(what: &str, console: &str) -> ! {
    panic!("{what}\n--- guest console ---\n{console}")
}

/// Check everything `e2e-verify` reported for `disks`; panics with `context`
/// (the whole console) on the first problem.
fn check_e2e_verify(console: &str, disks: &[&str]) {
    macro_rules! fail {
        ($($t:tt)*) => { fail_with_console(&format!($($t)*), console) };
    }

    if !console
        .lines()
        .any(|l| l.trim_end() == "BLKLAB-END e2e-verify rc=0")
    {
        fail!("guest script did not end with `BLKLAB-END e2e-verify rc=0`");
    }
    let json_lines = between(console, "BLKLAB-FIO-JSON-BEGIN", "BLKLAB-FIO-JSON-END")
        .unwrap_or_else(|| fail!("no BLKLAB-FIO-JSON-BEGIN/END block on the console"));
    let json_text = json_lines.join("\n");
    let fio: serde_json::Value =
        serde_json::from_str(&json_text).unwrap_or_else(|e| fail!("fio JSON does not parse: {e}"));

    let global = &fio["global options"];
    if global["verify"].as_str() != Some("crc32c") || json_u64(&global["do_verify"]) != Some(1) {
        fail!("fio did not run with verify=crc32c do_verify=1: global options {global}");
    }
    let jobs = fio["jobs"]
        .as_array()
        .unwrap_or_else(|| fail!("fio JSON has no jobs"));
    for disk in disks {
        let job = jobs
            .iter()
            .find(|j| j["jobname"].as_str() == Some(disk))
            .unwrap_or_else(|| fail!("no fio job for {disk}"));
        let error = json_u64(&job["error"]).unwrap_or(u64::MAX);
        if error != 0 {
            fail!("fio job {disk} reported error {error}");
        }
        let written = json_u64(&job["write"]["io_bytes"]).unwrap_or(0);
        let verified = json_u64(&job["read"]["io_bytes"]).unwrap_or(0);
        let size = json_u64(&job["job options"]["size"]).unwrap_or(0);
        if written == 0 || written != size {
            fail!("fio job {disk} wrote {written} bytes, expected its size {size}");
        }
        // With do_verify every written block is read back and checked.
        if verified != written {
            fail!("fio job {disk}: verify read {verified} bytes of {written} written");
        }
        eprintln!("[qemu_e2e] fio {disk}: wrote {written} B, verified {verified} B, error 0");
    }

    let stats = disk_summaries(console);
    for disk in disks {
        let s = stats
            .get(*disk)
            .unwrap_or_else(|| fail!("no `BLKLAB-DISK {disk}` line"));
        let writes = s.get("writes").copied().unwrap_or(0);
        let sectors = s.get("write_sectors").copied().unwrap_or(0);
        if writes == 0 {
            fail!("/sys/block/{disk}/stat shows no writes");
        }
        let job = jobs
            .iter()
            .find(|j| j["jobname"].as_str() == Some(disk))
            .unwrap();
        let written = json_u64(&job["write"]["io_bytes"]).unwrap_or(0);
        if sectors * 512 < written {
            fail!("/sys/block/{disk}/stat: {sectors} sectors written < fio's {written} bytes");
        }
    }
    for (disk, s) in &stats {
        eprintln!("[qemu_e2e] stat {disk}: {s:?}");
    }
}

fn qemu_timeout() -> Duration {
    let secs = std::env::var("BLKLAB_QEMU_TIMEOUT")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(240);
    Duration::from_secs(secs)
}

/// A guest run of `e2e-verify` against `blklab serve`, plus how the daemon ended.
struct E2eOutcome {
    run: GuestRun,
    daemon_status: Option<std::process::ExitStatus>,
}

/// Start `blklab serve DAEMON_ARGS` (`disks` sockets), boot `series` with one
/// vhost-user-blk disk per socket and run `e2e-verify` with `knobs` appended
/// to the kernel command line.
fn boot_e2e(series: &str, daemon_args: &[&str], disks: usize, knobs: &str) -> E2eOutcome {
    let image = prepare_guest(series);
    let ctl_dir = tempfile::tempdir().expect("tempdir");
    let ctl = ctl_dir.path().join("ctl.sock");
    let mut args: Vec<&str> = daemon_args.to_vec();
    let ctl_s = ctl.to_str().unwrap().to_string();
    args.extend_from_slice(&["--control", &ctl_s]);
    let mut daemon = common::Daemon::spawn(&args, disks);
    let sockets = if disks == 1 && !daemon_args.contains(&"--count") {
        vec![daemon.socket.clone()]
    } else {
        (0..disks).map(|i| daemon.socket_n(i)).collect()
    };
    let spec = QemuSpec {
        kernel: &image.kernel,
        initrd: &image.initrd,
        append: format!(
            "console=ttyS0 loglevel=5 blklab.run=e2e-verify panic=-1 blklab.disks={disks} {knobs}"
        ),
        sockets,
        num_queues: 2,
        smp: 2,
        mem_mib: 1024,
        reboot: false,
    };
    let run = run_guest_with_retry(&spec, Some(&ctl), || {});

    // The daemon must not have crashed; it may legitimately have exited
    // after its frontends went away.
    let daemon_status = if daemon.alive() {
        Some(daemon.terminate())
    } else {
        daemon.exited()
    };

    let show = std::env::var("BLKLAB_E2E_CONSOLE").is_ok_and(|v| v == "1");
    if show {
        eprintln!("--- guest console ---\n{}", run.console);
    } else {
        for l in run
            .console
            .lines()
            .filter(|l| l.starts_with("BLKLAB-") && !l.starts_with("BLKLAB-FIO-JSON"))
        {
            eprintln!("[guest] {l}");
        }
    }
    let fmt =
        |d: Option<Duration>| d.map_or("n/a".to_string(), |d| format!("{:.1}s", d.as_secs_f64()));
    eprintln!(
        "[qemu_e2e] {series}: fetch {:.1}s, initramfs {:.1}s, QEMU start->script begin {}, ->fio done {}, total {:.1}s; daemon exit {:?}",
        image.fetch_time.as_secs_f64(),
        image.build_time.as_secs_f64(),
        fmt(run.to_begin),
        fmt(run.to_fio_done),
        run.total.as_secs_f64(),
        daemon_status,
    );
    assert!(
        run.status.success(),
        "QEMU exited with {}\n--- guest console ---\n{}",
        run.status,
        run.console
    );
    if let Some(st) = daemon_status {
        assert!(
            st.success() || is_sigterm(&st),
            "blklab serve exited with {st}\n--- guest console ---\n{}",
            run.console
        );
    }
    E2eOutcome { run, daemon_status }
}

/// Boot `series` against two `blklab serve` mem disks and check fio write+verify.
fn e2e_two_disks(series: &str, fio_size: &str) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let out = boot_e2e(
        series,
        &[
            "--count",
            "2",
            "--disk",
            "mem",
            "--size",
            "256M",
            "--num-queues",
            "2",
        ],
        2,
        &format!("blklab.fio_size={fio_size}"),
    );
    check_e2e_verify(&out.run.console, &["vda", "vdb"]);
}

fn is_sigterm(st: &std::process::ExitStatus) -> bool {
    use std::os::unix::process::ExitStatusExt;
    st.signal() == Some(libc::SIGTERM)
}

/// Debian 12's 6.12 kernel (virtio_blk as a module, the rest built in):
/// 64 MiB of 4k random writes with crc32c verify on each of two disks.
#[test]
fn debian_6_12_fio_verify_two_disks() {
    e2e_two_disks("6.12", "64M");
}

/// Debian 12's default 6.1 kernel (the whole virtio stack as modules); a
/// smaller fio run since the 6.12 test already covers the volume.
#[test]
fn debian_6_1_fio_verify_two_disks() {
    e2e_two_disks("6.1", "16M");
}

/// The verify is not vacuous: a `null` disk (reads zeros, drops writes) must
/// make fio's crc32c verify fail in the guest.
#[test]
fn debian_6_12_null_disk_fails_verify() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let out = boot_e2e(
        "6.12",
        &["--disk", "null", "--size", "64M", "--num-queues", "2"],
        1,
        "blklab.fio_size=1M",
    );
    let console = &out.run.console;
    let rc = console
        .lines()
        .find_map(|l| l.trim_end().strip_prefix("BLKLAB-END e2e-verify rc="))
        .unwrap_or_else(|| fail_with_console("no `BLKLAB-END e2e-verify` line", console));
    if rc == "0" {
        fail_with_console(
            "e2e-verify passed on a null disk: verify is not checking data",
            console,
        );
    }
    let json = between(console, "BLKLAB-FIO-JSON-BEGIN", "BLKLAB-FIO-JSON-END")
        .unwrap_or_else(|| fail_with_console("no fio JSON block", console))
        .join("\n");
    let fio: serde_json::Value = serde_json::from_str(&json)
        .unwrap_or_else(|e| fail_with_console(&format!("fio JSON does not parse: {e}"), console));
    let error = fio["jobs"][0]["error"].as_u64().unwrap_or(0);
    if error == 0 {
        fail_with_console("fio reported no error on a null disk", console);
    }
    let writes = disk_summaries(console)
        .get("vda")
        .and_then(|s| s.get("writes").copied())
        .unwrap_or(0);
    if writes == 0 {
        fail_with_console("no writes reached the null disk", console);
    }
    eprintln!("[qemu_e2e] null disk: fio error {error} (verify failed as expected), {writes} writes; daemon {:?}", out.daemon_status);
}

/// The counters every queue of disk 0 reports in a stats document (control
/// socket answer or `--stats-out` file), as name -> value per queue.
fn queue_counters(doc: &serde_json::Value) -> Vec<std::collections::BTreeMap<String, u64>> {
    let disks = doc["disks"]
        .as_array()
        .unwrap_or_else(|| panic!("stats document has no disks: {doc}"));
    assert_eq!(disks.len(), 1, "expected one disk in {doc}");
    disks[0]["queues"]
        .as_array()
        .unwrap_or_else(|| panic!("stats document has no queues: {doc}"))
        .iter()
        .map(|q| {
            q["counters"]
                .as_object()
                .unwrap_or_else(|| panic!("queue without counters: {q}"))
                .iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_u64()?)))
                .collect()
        })
        .collect()
}

/// Sum of counter `name` over all queues.
fn total(queues: &[std::collections::BTreeMap<String, u64>], name: &str) -> u64 {
    queues
        .iter()
        .map(|q| {
            *q.get(name)
                .unwrap_or_else(|| panic!("no counter {name:?} in {q:?}"))
        })
        .sum()
}

/// The fields of a `PREFIX f1 f2 ...` console line (/sys/block/vda/stat).
fn stat_line(console: &str, prefix: &str) -> Vec<u64> {
    let line = console
        .lines()
        .find_map(|l| l.trim().strip_prefix(prefix))
        .unwrap_or_else(|| fail_with_console(&format!("no `{prefix}` line"), console));
    line.split_whitespace()
        .map(|w| {
            w.parse()
                .unwrap_or_else(|_| fail_with_console(&format!("bad stat field {w:?}"), console))
        })
        .collect()
}

/// Reads the firmware (SeaBIOS) does on a virtio disk before Linux runs: one
/// 512-byte read of sector 0 on queue 0, within the first quarter second of
/// QEMU's start, seconds before the guest's /init (observed with the control
/// socket while booting). Linux never sees it, so /sys/block/vda/stat lacks it.
const FIRMWARE_READS: u64 = 1;
const FIRMWARE_READ_BYTES: u64 = 512;

/// Exact accounting: a guest fio run's IOs, the guest block layer's request
/// counts and `blklab serve`'s request counts for the disk all agree.
///
/// One mem disk, 2 queues, `-smp 2`; the guest runs `images/guest/e2e-count`
/// (scheduler `none`, `nomerges=2`, two randrw fio jobs pinned to CPU 0 and
/// CPU 1, an fsync every 250 IOs) and prints /sys/block/vda/stat before fio
/// and as the very last thing it does. After QEMU has exited the backend's
/// counters are read through `--control` and must equal the `--stats-out`
/// document written at SIGTERM.
///
/// Why each comparison is exact:
/// - /sys/block/vda/stat counts every request the block layer completes,
///   after merging and splitting, i.e. the requests put on the virtqueues:
///   fields 1 reads, 3 sectors read, 5 writes, 7 sectors written, 12
///   discards, 16 flushes. Linux's boot-time IO (the partition scan: three 4k
///   reads) is in both, so the *totals* match, not just the fio window.
/// - Except for three things, each accounted for exactly:
///   - the firmware's read ([`FIRMWARE_READS`]), before Linux;
///   - fsync: blkdev_fsync issues an empty REQ_PREFLUSH write, which the
///     block layer accounts as a write of 0 sectors when its flush sequence
///     ends, but which never reaches the device: only the flush request of
///     the flush machinery does (field 16). Flush queues are per hardware
///     queue and each fio job's fsyncs are synchronous, so no two coalesce:
///     guest flushes == fio fsyncs == stat writes - fio writes (boot writes
///     nothing), and device writes = stat writes - fio fsyncs.
///   - GET_ID (reading /sys/block/vda/serial) is a driver-private
///     passthrough request that the block layer never accounts; the script
///     reads the serial exactly once, so `get_ids` is 1.
/// - Over the fio window (stat after - before) reads and writes equal fio's
///   completed `total_ios` exactly: direct IO, 4k blocks, no merging.
/// - Per queue: blk-mq maps CPU n to hardware queue n here (2 vectors, 2
///   CPUs) and the job pinned to CPU n submits on it; only fio writes and
///   flushes, so queue n's writes and flushes equal job `cpuN`'s writes and
///   fsyncs exactly. Reads also hold the boot reads (on whichever CPU ran
///   the scan), so per queue only `>=`.
#[test]
fn debian_6_12_fio_count_equals_backend_count() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let ios_per_job = 4000u64;
    let image = prepare_guest("6.12");
    let dir = tempfile::tempdir().expect("tempdir");
    let ctl = dir.path().join("ctl.sock");
    let stats_out = dir.path().join("stats.json");
    let socket = dir.path().join("vd.sock");
    let (ctl_s, out_s) = (ctl.to_str().unwrap(), stats_out.to_str().unwrap());
    let args = [
        "--disk",
        "mem",
        "--size",
        "256M",
        "--num-queues",
        "2",
        "--control",
        ctl_s,
        "--stats-out",
        out_s,
    ];
    let mut daemon = common::Daemon::spawn_at(dir, socket.clone(), &args, 1);
    let spec = QemuSpec {
        kernel: &image.kernel,
        initrd: &image.initrd,
        append: format!(
            "console=ttyS0 loglevel=5 blklab.run=e2e-count panic=-1 blklab.ios={ios_per_job}"
        ),
        sockets: vec![socket],
        num_queues: 2,
        smp: 2,
        mem_mib: 1024,
        reboot: false,
    };
    // A retry boots a fresh guest: count from zero again.
    let run = run_guest_with_retry(&spec, Some(&ctl), || {
        blklab::backend::control::query(&ctl, "reset").expect("reset the backend's statistics");
    });
    let console = run.console.as_str();
    for l in console
        .lines()
        .filter(|l| l.starts_with("BLKLAB-") && !l.starts_with("BLKLAB-FIO-JSON"))
    {
        eprintln!("[guest] {l}");
    }
    if std::env::var("BLKLAB_E2E_CONSOLE").is_ok_and(|v| v == "1") {
        eprintln!("--- guest console ---\n{console}");
    }
    assert!(
        run.status.success(),
        "QEMU exited with {}\n--- guest console ---\n{console}",
        run.status
    );
    assert!(daemon.alive(), "blklab serve died during the guest run");

    // QEMU is gone: the counters are final. Read them live, then at exit.
    let live = blklab::backend::control::query(&ctl, "stats").expect("query the control socket");
    let status = daemon.terminate();
    assert!(
        status.success() || is_sigterm(&status),
        "blklab serve exited with {status}"
    );
    let text = std::fs::read_to_string(&stats_out).expect("read --stats-out");
    let fin: serde_json::Value = serde_json::from_str(&text).expect("--stats-out is JSON");
    let queues = queue_counters(&live);
    assert_eq!(
        queues,
        queue_counters(&fin),
        "control-socket stats after QEMU exited differ from --stats-out"
    );

    macro_rules! fail {
        ($($t:tt)*) => { fail_with_console(&format!($($t)*), console) };
    }
    if !console
        .lines()
        .any(|l| l.trim_end() == "BLKLAB-END e2e-count rc=0")
    {
        fail!("guest script did not end with `BLKLAB-END e2e-count rc=0`");
    }
    let json = between(console, "BLKLAB-FIO-JSON-BEGIN", "BLKLAB-FIO-JSON-END")
        .unwrap_or_else(|| fail!("no fio JSON block"))
        .join("\n");
    let fio: serde_json::Value =
        serde_json::from_str(&json).unwrap_or_else(|e| fail!("fio JSON does not parse: {e}"));
    // (reads, writes, fsyncs) fio completed, per job cpu0, cpu1.
    let job_ios: Vec<(u64, u64, u64)> = ["cpu0", "cpu1"]
        .iter()
        .map(|name| {
            let job = fio["jobs"]
                .as_array()
                .and_then(|j| j.iter().find(|j| j["jobname"].as_str() == Some(name)))
                .unwrap_or_else(|| fail!("no fio job {name}"));
            let error = json_u64(&job["error"]).unwrap_or(u64::MAX);
            if error != 0 {
                fail!("fio job {name} reported error {error}");
            }
            let r = json_u64(&job["read"]["total_ios"]).unwrap_or(0);
            let w = json_u64(&job["write"]["total_ios"]).unwrap_or(0);
            if r + w != ios_per_job || r == 0 || w == 0 {
                fail!("fio job {name} did {r} reads + {w} writes, expected {ios_per_job} IOs of both kinds");
            }
            (r, w, json_u64(&job["sync"]["total_ios"]).unwrap_or(0))
        })
        .collect();
    let fio_reads: u64 = job_ios.iter().map(|j| j.0).sum();
    let fio_writes: u64 = job_ios.iter().map(|j| j.1).sum();
    let fio_syncs: u64 = job_ios.iter().map(|j| j.2).sum();

    let before = stat_line(console, "BLKLAB-COUNT-STAT-BEFORE ");
    let after = stat_line(console, "BLKLAB-COUNT-STAT-AFTER ");
    if after.len() < 17 || before.len() != after.len() {
        fail!(
            "/sys/block/vda/stat has {} fields, expected 17 (flush counts need Linux >= 5.5)",
            after.len()
        );
    }
    // 0-based: 0 reads, 1 read merges, 2 sectors read, 4 writes, 5 write
    // merges, 6 sectors written, 8 in flight, 11 discards, 15 flushes.
    let (g_reads, g_writes, g_discards, g_flushes) = (after[0], after[4], after[11], after[15]);
    let d = |i: usize| after[i] - before[i];
    eprintln!(
        "[qemu_e2e] fio: {fio_reads} reads + {fio_writes} writes + {fio_syncs} fsyncs (jobs {job_ios:?}); guest stat total: {g_reads} reads, {g_writes} writes, {g_discards} discards, {g_flushes} flushes; fio window: {} reads, {} writes, {} flushes",
        d(0),
        d(4),
        d(15)
    );
    for (i, q) in queues.iter().enumerate() {
        eprintln!("[qemu_e2e] backend queue {i}: {q:?}");
    }

    // The fio window, guest side: every fio read or write is one request,
    // nothing else reads. Each fio fsync (blkdev_fsync -> blkdev_issue_flush)
    // is an empty REQ_PREFLUSH write: the block layer accounts it as one
    // write of 0 sectors when its flush sequence ends, but the request itself
    // never reaches the device; only the flush machinery's flush request
    // does (counted in field 16, once per flush actually issued, so several
    // concurrent fsyncs can share one).
    assert_eq!(d(0), fio_reads, "guest reads during fio != fio's reads");
    assert_eq!(
        d(4),
        fio_writes + fio_syncs,
        "guest writes during fio != fio's writes + fsyncs (empty preflush writes)"
    );
    assert_eq!(
        d(6),
        fio_writes * 8,
        "guest sectors written != fio's 4k writes"
    );
    assert_eq!((d(1), d(5)), (0, 0), "merges despite nomerges=2");
    assert_eq!(after[8], 0, "requests still in flight at the end");
    assert_eq!(
        g_flushes, fio_syncs,
        "guest flushes != fio's fsyncs (nothing coalesces: see above)"
    );
    // Boot does not write, so the empty preflush writes are exactly fio's
    // fsyncs and the device-visible writes are the stat writes minus those.
    assert_eq!(before[4], 0, "writes before fio");
    let g_device_writes = g_writes - fio_syncs;

    // Backend totals == guest block layer totals (device-visible requests),
    // plus the firmware's read, which happens before Linux runs.
    let b = |name: &str| total(&queues, name);
    assert_eq!(
        b("reads"),
        g_reads + FIRMWARE_READS,
        "backend reads != guest stat reads + the firmware's {FIRMWARE_READS}"
    );
    assert_eq!(
        b("bytes_read"),
        after[2] * 512 + FIRMWARE_READ_BYTES,
        "bytes read != guest sectors read + the firmware's {FIRMWARE_READ_BYTES} B"
    );
    assert_eq!(
        b("writes") + b("write_zeroes"),
        g_device_writes,
        "backend writes (+ write zeroes) != guest stat writes - empty preflush writes"
    );
    assert_eq!(
        b("bytes_written"),
        after[6] * 512,
        "bytes written != guest sectors written"
    );
    assert_eq!(
        b("discards"),
        g_discards,
        "backend discards != guest stat discards"
    );
    assert_eq!(
        b("flushes"),
        g_flushes,
        "backend flushes != guest stat flushes"
    );
    // And so == fio's own counts (plus Linux's boot-time reads).
    assert_eq!(
        b("reads"),
        FIRMWARE_READS + before[0] + fio_reads,
        "backend reads != firmware + partition scan + fio reads"
    );
    assert_eq!(b("writes"), fio_writes, "backend writes != fio's writes");
    assert_eq!(b("bytes_written"), fio_writes * 4096);
    // The one serial read, invisible to /sys/block/vda/stat.
    if !console.contains("BLKLAB-COUNT-SERIAL blklab-mem") {
        fail!("guest did not read serial blklab-mem");
    }
    assert_eq!(
        b("get_ids"),
        1,
        "expected exactly one GET_ID (one serial read)"
    );
    let ops = [
        "reads",
        "writes",
        "flushes",
        "get_ids",
        "discards",
        "write_zeroes",
        "other",
    ];
    assert_eq!(
        b("requests"),
        ops.iter().map(|o| b(o)).sum::<u64>(),
        "requests != sum of the op counters"
    );
    assert_eq!(
        b("requests"),
        FIRMWARE_READS + g_reads + g_device_writes + g_discards + g_flushes + 1,
        "backend requests != firmware + guest device-visible requests + 1 GET_ID"
    );
    for bad in [
        "other",
        "status_ioerr",
        "status_unsupp",
        "dropped",
        "ring_errors",
    ] {
        assert_eq!(b(bad), 0, "backend counted {bad}");
    }
    if !console.contains("write_cache=write-back") || g_flushes == 0 {
        fail!("expected a write-back cache and flushes from fio's fsyncs");
    }

    // Per queue: CPU n submits on queue n, and only fio writes and fsyncs.
    assert_eq!(queues.len(), 2);
    if !console.contains(" hw_queues=2 ") {
        fail!("guest does not see 2 hardware queues");
    }
    for (q, (r, w, syncs)) in job_ios.iter().enumerate() {
        assert_eq!(
            queues[q]["writes"], *w,
            "queue {q} writes != fio job cpu{q}'s writes"
        );
        assert_eq!(
            queues[q]["flushes"], *syncs,
            "queue {q} flushes != fio job cpu{q}'s fsyncs"
        );
        assert!(
            queues[q]["reads"] >= *r,
            "queue {q} reads < fio job cpu{q}'s reads"
        );
        assert!(queues[q]["requests"] > 0, "queue {q} saw no requests");
    }
    eprintln!(
        "[qemu_e2e] count: QEMU start->script begin {:?}, total {:.1}s",
        run.to_begin,
        run.total.as_secs_f64()
    );
}

/// A guest that reboots: one daemon and one QEMU, the guest rebooting itself
/// five times (a machine reset each time: QEMU stops the rings, the new
/// kernel's driver sets the device up again on the same connection). Every
/// boot verifies what the boot before wrote (fio `--verify_only`), then
/// writes and verifies with a new seed (`images/guest/e2e-reboot`).
#[test]
fn debian_6_12_reboot_loop_verifies_every_boot() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let image = prepare_guest("6.12");
    let ctl_dir = tempfile::tempdir().expect("tempdir");
    let ctl = ctl_dir.path().join("ctl.sock");
    let ctl_s = ctl.to_str().unwrap().to_string();
    let mut daemon = common::Daemon::spawn(
        &[
            "--disk",
            "mem",
            "--size",
            "64M",
            "--num-queues",
            "2",
            "--control",
            &ctl_s,
        ],
        1,
    );
    // Six boots: the first and five reboots.
    const ROUNDS: usize = 6;
    let spec = QemuSpec {
        kernel: &image.kernel,
        initrd: &image.initrd,
        append: format!(
            "console=ttyS0 loglevel=5 blklab.run=e2e-reboot blklab.rounds={ROUNDS} blklab.fio_size=8M"
        ),
        sockets: vec![daemon.socket.clone()],
        num_queues: 2,
        smp: 2,
        mem_mib: 1024,
        reboot: true,
    };
    // Six boots: give them six boots' time.
    let run = run_guest(qemu_command(&spec), qemu_timeout() * ROUNDS as u32);
    assert_no_kernel_fault(&run);
    let console = &run.console;
    let rounds: Vec<&str> = console
        .lines()
        .filter_map(|l| l.trim_end().strip_prefix("BLKLAB-REBOOT-ROUND "))
        .collect();
    let want: Vec<String> = (0..ROUNDS)
        .map(|n| {
            let prev = if n == 0 { "skip" } else { "0" };
            format!("{n} prev={prev} write=0")
        })
        .collect();
    assert_eq!(
        rounds, want,
        "every boot verifies the last one's data and its own\n--- console ---\n{console}"
    );
    assert!(
        console
            .lines()
            .any(|l| l.trim_end() == format!("BLKLAB-REBOOT-DONE {ROUNDS}")),
        "no BLKLAB-REBOOT-DONE\n--- console ---\n{console}"
    );
    assert!(
        run.status.success(),
        "QEMU exited with {}\n--- console ---\n{console}",
        run.status
    );
    // One daemon served all six boots, without a ring error or a dropped
    // chain, and is still serving.
    assert!(daemon.alive(), "blklab serve died during the reboots");
    let stats = blklab::backend::control::query(&ctl, "stats").expect("stats");
    let queues = queue_counters(&stats);
    assert_eq!(total(&queues, "ring_errors"), 0, "{stats}");
    assert_eq!(total(&queues, "dropped"), 0, "{stats}");
    assert!(total(&queues, "writes") > 0, "{stats}");
    let status = daemon.terminate();
    assert!(
        status.success() || is_sigterm(&status),
        "blklab serve exited with {status}"
    );
}
