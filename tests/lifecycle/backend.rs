//! The backends of the lifecycle tests, the one thing a scenario swaps:
//! `blklab serve` or the reference qemu-storage-daemon, each serving one
//! raw image file as a 2-queue vhost-user-blk disk, its stderr in a log
//! file of its own (one per start, so a restart's log is apart from the
//! killed one's).

use std::path::{Path, PathBuf};
use std::process::Command;

use blklab::bench::daemon::Daemon;

use crate::common;

/// Emulated latency of `blklab serve`'s writes: drawn per request, so
/// requests complete out of the order the guest made them.
pub(crate) const WRITE_LATENCY: &str = "uniform:5ms..50ms";

/// qemu-storage-daemon's write rate limit: below what the guest issues
/// under TCG against `blklab serve`'s [`WRITE_LATENCY`] (about 540 writes a
/// second here), so that fio's writes wait inside the daemon, all of
/// them in flight, and fio takes about as long as against blklab.
pub(crate) const QSD_WRITE_IOPS: u32 = 500;

/// The options that let two `blklab serve` share one image during a live
/// migration, the source's and the destination's: the image lock's
/// shared-storage migration mode (`--image-lock`; the source keeps the
/// default, `exclusive`, and releases its write locks when QEMU stops its
/// rings with dirty logging on). The one place that names the mode.
pub(crate) const MIGRATION_SOURCE_ARGS: &[&str] = &[];
pub(crate) const MIGRATION_DESTINATION_ARGS: &[&str] = &["--image-lock", "incoming"];

/// Which daemon serves the disk.
#[derive(Clone, Debug)]
pub(crate) enum Kind {
    /// The `blklab serve` cargo built, with [`WRITE_LATENCY`].
    Blklab,
    /// qemu-storage-daemon at this path (the reference: Debian 12's 7.2,
    /// `images/fetch-qsd.sh`), its writes held in flight by a throttle
    /// filter of [`QSD_WRITE_IOPS`] (QEMU has no random latency for a
    /// file: the throttle releases writes in the order they came, then its
    /// file driver's thread pool completes them in whatever order its
    /// threads finish).
    Qsd(PathBuf),
}

/// What a daemon is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// The only daemon of its image.
    Sole,
    /// The source of a live migration; the destination's daemon opens the
    /// same image while this one still serves it.
    MigrationSource,
    MigrationDestination,
}

/// A running backend daemon (stopped when dropped).
pub(crate) struct Backend {
    pub process: Daemon,
}

impl Kind {
    /// The reference daemon: `images/fetch-qsd.sh`'s Debian 12 build of
    /// QEMU 7.2 (fetched into the image cache the first time).
    pub(crate) fn reference_qsd() -> Kind {
        let lines = common::guest_program::images_script("fetch-qsd.sh", &[]);
        let path = lines
            .last()
            .expect("fetch-qsd.sh printed the binary's path");
        Kind::Qsd(path.clone())
    }

    /// Its name in the test's output.
    pub(crate) fn name(&self) -> String {
        match self {
            Kind::Blklab => "blklab serve".into(),
            Kind::Qsd(p) => format!("qemu-storage-daemon ({})", p.display()),
        }
    }

    fn command(&self, socket: &Path, image: &Path, role: Role) -> Command {
        match self {
            Kind::Blklab => {
                let mut c = Command::new(common::blklab_bin());
                c.arg("serve").arg("--socket").arg(socket);
                c.arg("--disk").arg(format!("file:{}", image.display()));
                c.args(["--num-queues", "2", "--write-latency", WRITE_LATENCY]);
                c.args(match role {
                    Role::Sole => &[][..],
                    Role::MigrationSource => MIGRATION_SOURCE_ARGS,
                    Role::MigrationDestination => MIGRATION_DESTINATION_ARGS,
                });
                c.env("RUST_LOG", "info");
                c
            }
            Kind::Qsd(bin) => {
                // Two daemons on one image need QEMU's image locking off:
                // each would otherwise refuse the other's write permission.
                let locking = if role == Role::Sole { "auto" } else { "off" };
                let mut c = Command::new(bin);
                c.arg("--object").arg(format!(
                    "throttle-group,id=tg0,x-iops-write={QSD_WRITE_IOPS}"
                ));
                c.arg("--blockdev").arg(format!(
                    "driver=throttle,node-name=n0,throttle-group=tg0,file.driver=file,file.filename={},file.locking={locking}",
                    image.display()
                ));
                c.arg("--export").arg(format!(
                    "type=vhost-user-blk,id=e0,node-name=n0,addr.type=unix,addr.path={},writable=on,num-queues=2",
                    socket.display()
                ));
                c
            }
        }
    }

    /// Start a daemon for `image` on `socket` (a stale socket there is
    /// replaced), its log `dir/LABEL.log`; once the socket is there, the
    /// daemon, or the error with the log's tail.
    pub(crate) fn start(
        &self,
        dir: &Path,
        label: &str,
        socket: &Path,
        image: &Path,
        role: Role,
    ) -> Result<Backend, String> {
        let log = dir.join(format!("{label}.log"));
        let mut cmd = self.command(socket, image, role);
        cmd.stderr(std::fs::File::create(&log).expect("create the daemon's log"));
        eprintln!("[lifecycle] {label}: {cmd:?}");
        match Daemon::start(label, &mut cmd, &[socket.to_path_buf()], common::PATIENCE) {
            Ok(process) => Ok(Backend { process }),
            Err(e) => Err(format!(
                "{} did not start ({e}); its log {}:\n{}",
                self.name(),
                log.display(),
                tail(&log, 20)
            )),
        }
    }
}

impl Backend {
    /// SIGKILL, and wait until it is gone.
    pub(crate) fn kill9(&mut self) {
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        unsafe {
            libc::kill(self.process.pid(), libc::SIGKILL);
        }
        common::wait_until("the killed daemon to exit", || {
            self.process.exited().is_some()
        });
    }
}

/// The last `n` lines of file `path` (empty if it cannot be read).
pub(crate) fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
