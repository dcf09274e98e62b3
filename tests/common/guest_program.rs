//! Guest programs the tests build themselves: the images/ scripts that
//! give them a kernel and the plugin, a C file compiled static for the
//! guest and packed into a newc archive, the QEMU that boots it (killed
//! when dropped: a failed assertion must not leave it running), its
//! console as lines and the plugin's dumps.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use blklab::lab::measure::plugin::Dump;

/// The lines `images/SCRIPT ARGS` prints on stdout (its stderr goes to the
/// test's); panics if it fails.
pub(crate) fn images_script(script: &str, args: &[&std::ffi::OsStr]) -> Vec<PathBuf> {
    let out = Command::new("sh")
        .arg(super::root().join("images").join(script))
        .args(args)
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

/// Compile `source` statically into `out`, with `-D` `defines`.
pub(crate) fn compile_static(source: &Path, defines: &[String], out: &Path) {
    super::tools::require(&["gcc", "--version"], "apt-get install gcc libc6-dev");
    let o = Command::new("gcc")
        .args(["-static", "-O1", "-Wall", "-Wextra", "-Werror"])
        .args(defines.iter().map(|d| format!("-D{d}")))
        .arg("-o")
        .arg(out)
        .arg(source)
        .output()
        .expect("run gcc");
    assert!(
        o.status.success(),
        "gcc -static failed (a static libc comes with libc6-dev):\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A newc archive of `what` (a path under `dir`, `.` for all of it), its
/// entries sorted and owned by root.
pub(crate) fn newc_archive(dir: &Path, what: &str) -> Vec<u8> {
    super::tools::require(&["cpio", "--version"], "apt-get install cpio");
    let cpio = Command::new("sh")
        .arg("-c")
        .arg("cd \"$1\" && find \"$2\" | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet")
        .arg("sh")
        .arg(dir)
        .arg(what)
        .output()
        .expect("run cpio");
    assert!(cpio.status.success(), "cpio failed");
    cpio.stdout
}

/// QEMU, killed when dropped.
pub(crate) struct Qemu(pub Child);

impl Drop for Qemu {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

/// QEMU's console (its stdout), a line at a time, from a thread of its own
/// (so that the reader can time out).
pub(crate) fn console_lines(qemu: &mut Qemu) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    let stdout = qemu.0.stdout.take().expect("QEMU's stdout is piped");
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Ask the plugin behind `ctl` for a dump into `file` and read it.
pub(crate) fn plugin_dump(ctl: &Path, file: &Path) -> Dump {
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
