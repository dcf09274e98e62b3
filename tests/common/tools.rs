//! Host tools the tests need. A missing one fails the test with the command
//! that installs it: a test never drops its cases because a tool is absent.

use std::process::{Command, Stdio};

/// Panic, naming the install command, unless `argv` runs and succeeds.
pub(crate) fn require(argv: &[&str], install: &str) {
    let ok = Command::new(argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "`{}` does not run: this test needs it; install it with `{install}` (or run .ci/install-deps)",
        argv.join(" ")
    );
}

/// busybox: the initramfs's shell and awk, which the guest-script tests run
/// under besides dash.
pub(crate) fn require_busybox() {
    require(&["busybox", "true"], "apt-get install busybox-static");
}
