//! A PATH without build tools or apt: `apt-get`, `apt-cache`, `apt`,
//! `gcc`, `gcc-12`, `cc` and `make` are replaced by scripts that record
//! the call in a log and fail loudly, so a test can run images/prepare.sh
//! or `blklab run` on imported images and prove nothing was built and no
//! package list was read.

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The tools an imported cache must not need.
pub(crate) const FORBIDDEN: &[&str] =
    &["apt-get", "apt-cache", "apt", "gcc", "gcc-12", "cc", "make"];

pub(crate) struct NoBuildTools {
    /// The PATH to give the child: the failing scripts first.
    pub path: OsString,
    /// One line per forbidden call: `TOOL ARGS...`.
    pub log: PathBuf,
}

impl NoBuildTools {
    /// Write the scripts into `dir/bin` and the log's path `dir/calls.log`.
    pub(crate) fn new(dir: &Path) -> NoBuildTools {
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let log = dir.join("calls.log");
        for tool in FORBIDDEN {
            let p = bin.join(tool);
            std::fs::write(
                &p,
                format!(
                    "#!/bin/sh\necho \"{tool} $*\" >> '{}'\necho \"FORBIDDEN: {tool} $* (the images should have come from the imported cache)\" >&2\nexit 97\n",
                    log.display()
                ),
            )
            .unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let mut path = OsString::from(&bin);
        path.push(":");
        path.push(std::env::var_os("PATH").unwrap_or_default());
        NoBuildTools { path, log }
    }

    /// The forbidden calls made so far (empty when none).
    pub(crate) fn calls(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The scripts do fail and log under this PATH (a check of the check).
    pub(crate) fn assert_armed(&self) {
        for tool in FORBIDDEN {
            let st = std::process::Command::new(tool)
                .arg("--version")
                .env("PATH", &self.path)
                .stderr(std::process::Stdio::null())
                .status()
                .unwrap();
            assert_eq!(st.code(), Some(97), "{tool} is not the failing script");
        }
        assert_eq!(self.calls().lines().count(), FORBIDDEN.len());
        std::fs::remove_file(&self.log).unwrap();
    }
}
