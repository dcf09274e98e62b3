//! Image locking against QEMU's own tools, with QEMU's lock protocol
//! (OFD locks on bytes 100+perm and 200+perm, block/file-posix.c): QEMU
//! cannot write an image `blklab serve` serves, `blklab serve` refuses an
//! image qemu-storage-daemon holds writable, and read-only opens coexist.

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::{wait_for, Daemon, PATIENCE};

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
