//! Image locking against QEMU's own tools, with QEMU's lock protocol
//! (OFD locks on bytes 100+perm and 200+perm, block/file-posix.c): QEMU
//! cannot write an image `blklab serve` serves, `blklab serve` refuses an
//! image qemu-storage-daemon holds writable, and read-only opens coexist.
//! For a live migration with shared storage, a destination daemon
//! (`--image-lock incoming`) opens the image its source holds, and the
//! write locks go from the source (when its frontend stops the device with
//! dirty logging on) to the destination (when its frontend starts it).

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};

use std::time::Duration;

use common::mini_frontend::MiniFrontend;
use common::{wait_for, wait_until, Daemon, PATIENCE};

fn require_qemu_tools() {
    let install = "apt-get install qemu-utils qemu-system-common";
    common::tools::require(&["qemu-io", "--version"], install);
    common::tools::require(&["qemu-storage-daemon", "--version"], install);
}

fn image(dir: &Path) -> String {
    let p = dir.join("img.raw");
    std::fs::write(&p, vec![0xabu8; 1 << 20]).unwrap();
    p.to_str().unwrap().to_string()
}

fn qemu_io(args: &[&str]) -> Output {
    Command::new("qemu-io")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run qemu-io")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `blklab serve ARGS` that must fail at start: its exit and stderr.
fn serve_refused(dir: &Path, args: &[&str]) -> String {
    let mut child = Command::new(common::blklab_bin())
        .arg("serve")
        .arg("--socket")
        .arg(dir.join("refused.sock"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = common::try_wait_for(PATIENCE, || child.try_wait().unwrap());
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
        panic!("blklab serve {args:?} served an image it must refuse");
    }
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn qemu_cannot_write_an_image_blklab_serves() {
    require_qemu_tools();
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path());
    let disk = format!("file:{img}");
    let d = Daemon::spawn(&["--disk", &disk], 1);
    let o = qemu_io(&["-f", "raw", "-c", "write -P 0x11 0 512", &img]);
    assert!(!o.status.success(), "qemu-io wrote: {}", text(&o));
    assert!(text(&o).contains("lock"), "{}", text(&o));
    // A read-only qemu-io shares writes, so it may read alongside.
    let o = qemu_io(&["-r", "-f", "raw", "-c", "read 0 512", &img]);
    assert!(o.status.success(), "{}", text(&o));
    // The image is untouched.
    assert!(std::fs::read(&img).unwrap()[..512]
        .iter()
        .all(|&b| b == 0xab));
    // A second blklab is refused as well.
    let err = serve_refused(dir.path(), &["--disk", &disk, "--read-only"]);
    assert!(err.contains("in use by another process"), "{err}");
    drop(d);
    // Released with the daemon.
    let o = qemu_io(&["-f", "raw", "-c", "write -P 0x11 0 512", &img]);
    assert!(o.status.success(), "{}", text(&o));
}

#[test]
fn blklab_refuses_an_image_qemu_holds_writable() {
    require_qemu_tools();
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path());
    let sock = dir.path().join("qsd.sock");
    let mut qsd = Command::new("qemu-storage-daemon")
        .arg("--blockdev")
        .arg(format!("driver=file,node-name=f,filename={img}"))
        .arg("--export")
        .arg(format!(
            "type=vhost-user-blk,id=e,node-name=f,addr.type=unix,addr.path={},writable=on",
            sock.display()
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start qemu-storage-daemon");
    // The export's socket exists once the image is open and locked.
    wait_for("qemu-storage-daemon's socket", PATIENCE, || {
        sock.exists().then_some(())
    });
    let disk = format!("file:{img}");
    for ro in [false, true] {
        let mut args = vec!["--disk", disk.as_str()];
        if ro {
            args.push("--read-only");
        }
        let err = serve_refused(dir.path(), &args);
        assert!(err.contains("in use by another process"), "{err}");
    }
    let _ = qsd.kill();
    let _ = qsd.wait();
    // Once QEMU is gone, blklab serves it.
    drop(Daemon::spawn(&["--disk", &disk], 1));
}

#[test]
fn read_only_opens_coexist() {
    require_qemu_tools();
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path());
    let disk = format!("file:{img}");
    let a = Daemon::spawn(&["--disk", &disk, "--read-only"], 1);
    let b = Daemon::spawn(&["--disk", &disk, "--read-only"], 1);
    // QEMU may read it alongside (qemu-io -r shares reads) …
    let o = qemu_io(&["-r", "-f", "raw", "-c", "read -P 0xab 0 512", &img]);
    assert!(o.status.success(), "{}", text(&o));
    // … but not write it, and neither may a writable blklab.
    let o = qemu_io(&["-f", "raw", "-c", "write 0 512", &img]);
    assert!(!o.status.success(), "{}", text(&o));
    let err = serve_refused(dir.path(), &["--disk", &disk]);
    assert!(err.contains("in use by another process"), "{err}");
    drop((a, b));
}

/// Whether another process holds a lock on `byte` of `img` (QEMU's lock
/// bytes: 101 "uses write", 201 "forbids others to write").
fn lock_held(img: &str, byte: i64) -> bool {
    let f = std::fs::File::open(img).unwrap();
    // SAFETY: flock is plain data; all-zero is a valid value (l_pid must
    // be 0 for OFD locks).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = byte;
    fl.l_len = 1;
    // SAFETY: fcntl on our own descriptor with a valid flock.
    let rc = unsafe {
        libc::fcntl(
            std::os::fd::AsRawFd::as_raw_fd(&f),
            libc::F_OFD_GETLK,
            &mut fl,
        )
    };
    assert_eq!(rc, 0, "F_OFD_GETLK: {}", std::io::Error::last_os_error());
    fl.l_type != libc::F_UNLCK as libc::c_short
}

/// How long to watch for a request that must not be served (one that is
/// served fails the test at once).
const MAYBE_WAIT: Duration = Duration::from_millis(500);

/// A live migration between two daemons on one image, with the messages
/// QEMU sends: the destination (`--image-lock incoming`) starts beside the
/// source; the source's frontend logs dirty pages and stops the device,
/// and the source releases the write locks; the destination's frontend
/// starts the device and the destination takes them, serving the data the
/// source wrote. The source's guest cannot resume on the image now (its
/// requests wait, unserved), until the destination lets go.
#[test]
fn a_live_migration_hands_the_image_to_the_destination() {
    require_qemu_tools();
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path());
    let disk = format!("file:{img}");
    let src = Daemon::spawn(&["--disk", &disk], 1);
    // Without the mode, a second daemon is refused.
    let err = serve_refused(dir.path(), &["--disk", &disk]);
    assert!(err.contains("in use by another process"), "{err}");
    let mut dst = Daemon::spawn(&["--disk", &disk, "--image-lock", "incoming"], 1);
    assert!(lock_held(&img, 201), "the source holds the image");

    let mut a = MiniFrontend::connect(&src.socket);
    a.write(0, &[0x11; 4096]);
    a.migration_starts();
    a.write(8, &[0x22; 4096]);
    let base = a.stop();
    assert!(!lock_held(&img, 201) && !lock_held(&img, 101), "released");

    let mut b = MiniFrontend::connect(&dst.socket);
    let both = b.read(0, 8192);
    assert!(both[..4096].iter().all(|&x| x == 0x11));
    assert!(both[4096..].iter().all(|&x| x == 0x22));
    assert!(lock_held(&img, 201), "the destination took the image");
    b.write(16, &[0x33; 512]);
    let o = qemu_io(&["-f", "raw", "-c", "write 0 512", &img]);
    assert!(!o.status.success(), "qemu-io wrote: {}", text(&o));

    // The source's guest resumes (a user's `cont` on the source QEMU):
    // not served while the destination holds the image.
    a.migration_ends();
    a.resume(base);
    assert_eq!(a.try_write(24, &[0x44; 512], MAYBE_WAIT), None);
    drop(b);
    dst.terminate();
    // The destination is gone: the next wake-up takes the image back.
    assert_eq!(a.kick_again(PATIENCE), Some(0));
    assert!(lock_held(&img, 201));
    drop(src);
}

/// A migration that fails after the source stopped the device: the guest
/// resumes on the source, which takes its write locks back before serving
/// it; a destination that started anyway serves without them and takes
/// them once the source is gone.
#[test]
fn a_failed_migration_leaves_the_image_with_its_source() {
    require_qemu_tools();
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path());
    let disk = format!("file:{img}");
    let mut src = Daemon::spawn(&["--disk", &disk], 1);
    let dst = Daemon::spawn(&["--disk", &disk, "--image-lock", "incoming"], 1);
    let mut a = MiniFrontend::connect(&src.socket);
    a.migration_starts();
    a.write(0, &[0x11; 512]);
    let base = a.stop();
    assert!(!lock_held(&img, 201));
    a.migration_ends();
    a.resume(base);
    a.write(1, &[0x22; 512]);
    assert!(lock_held(&img, 201), "the source took its image back");
    let o = qemu_io(&["-f", "raw", "-c", "write 0 512", &img]);
    assert!(!o.status.success(), "qemu-io wrote: {}", text(&o));

    let mut b = MiniFrontend::connect(&dst.socket);
    assert_eq!(b.read(0, 1024)[..512], [0x11; 512]);
    drop(a);
    src.terminate();
    wait_until("the destination takes the image", || lock_held(&img, 201));
    let o = qemu_io(&["-f", "raw", "-c", "write 0 512", &img]);
    assert!(!o.status.success(), "qemu-io wrote: {}", text(&o));
    b.write(2, &[0x33; 512]);
    drop(dst);
}

/// The destination of a migration whose source is qemu-storage-daemon
/// (which does not hand its image over): it opens the image qsd holds,
/// serves once its frontend starts the device, and takes the write locks
/// when qsd exits.
#[test]
fn an_incoming_daemon_takes_the_image_when_qemu_releases_it() {
    require_qemu_tools();
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path());
    let sock = dir.path().join("qsd.sock");
    let mut qsd = Command::new("qemu-storage-daemon")
        .arg("--blockdev")
        .arg(format!("driver=file,node-name=f,filename={img}"))
        .arg("--export")
        .arg(format!(
            "type=vhost-user-blk,id=e,node-name=f,addr.type=unix,addr.path={},writable=on",
            sock.display()
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start qemu-storage-daemon");
    wait_for("qemu-storage-daemon's socket", PATIENCE, || {
        sock.exists().then_some(())
    });
    let disk = format!("file:{img}");
    let d = Daemon::spawn(&["--disk", &disk, "--image-lock", "incoming"], 1);
    let mut b = MiniFrontend::connect(&d.socket);
    b.write(0, &[0x55; 512]);
    let _ = qsd.kill();
    let _ = qsd.wait();
    wait_until("blklab takes the image", || lock_held(&img, 201));
    let o = qemu_io(&["-f", "raw", "-c", "write 0 512", &img]);
    assert!(!o.status.success(), "qemu-io wrote: {}", text(&o));
    drop(d);
}
