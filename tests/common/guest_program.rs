//! Guest programs the tests build themselves: a C file compiled static
//! for the guest, packed into a newc archive, and the QEMU that boots it,
//! killed when dropped (a failed assertion must not leave it running).

use std::path::Path;
use std::process::{Child, Command};

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
