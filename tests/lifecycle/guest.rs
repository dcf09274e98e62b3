//! The guests of the lifecycle tests: QEMU booting the lifecycle image
//! (`images/lifecycle/lifecycle-fio` as its init's program) with one
//! vhost-user-blk disk whose chardev reconnects (`reconnect-ms=1000`), its
//! RAM a memfd shared with the backend, a QMP socket, and its console read
//! a line at a time into a channel the scenario watches (both QEMUs of a
//! migration into one channel, each line naming its QEMU).

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use blklab::backend::qemu_args::{self, QemuDisk};

use crate::common;

/// How long QEMU waits before it connects again to a backend that went
/// away (QEMU 10's `reconnect-ms` of a socket chardev).
pub(crate) const RECONNECT_MS: u32 = 1000;

/// A bootable guest: Debian's 6.12 kernel and an initramfs with
/// `lifecycle-fio`, both built by the `images/` recipes into the image
/// cache (cached after the first run).
pub(crate) struct Image {
    pub kernel: PathBuf,
    pub initrd: PathBuf,
}

impl Image {
    /// Fetch the kernel and build the initramfs (`--extra-dir
    /// images/lifecycle`, written apart from the other tests' initramfs).
    pub(crate) fn prepare() -> Image {
        let cache = common::image_cache();
        std::fs::create_dir_all(&cache).expect("create the image cache");
        let kdir = cache.join("kernel-6.12");
        let initrd = cache.join("initramfs-6.12-lifecycle.cpio.gz");
        let extra = common::root().join("images/lifecycle");
        common::guest_program::images_script(
            "fetch-debian-kernel.sh",
            &["6.12".as_ref(), kdir.as_os_str()],
        );
        common::guest_program::images_script(
            "build-initramfs.sh",
            &[
                "--kernel-dir".as_ref(),
                kdir.as_os_str(),
                "--extra-dir".as_ref(),
                extra.as_os_str(),
                "--out".as_ref(),
                initrd.as_os_str(),
            ],
        );
        let kernel = kdir.join("vmlinuz");
        assert!(kernel.is_file(), "{} missing after fetch", kernel.display());
        assert!(initrd.is_file(), "{} missing after build", initrd.display());
        Image { kernel, initrd }
    }
}

/// What one QEMU boots: the image, the kernel command line's knobs for
/// `lifecycle-fio` and the backend's socket.
pub(crate) struct Spec<'a> {
    pub image: &'a Image,
    /// `blklab.KEY=VALUE` words for the guest program.
    pub knobs: String,
    pub socket: PathBuf,
}

/// Guest RAM; small, since a migration copies all of it.
const MEM: &str = "512M";
const NUM_QUEUES: u16 = 2;
const VCPUS: u32 = 2;

/// A console line and the QEMU that printed it.
pub(crate) struct Line {
    pub guest: &'static str,
    pub text: String,
}

/// A running QEMU; killed when dropped.
pub(crate) struct Guest {
    child: Child,
    pub qmp: PathBuf,
    console: Arc<Mutex<String>>,
    stdout: Option<JoinHandle<()>>,
    stderr: Option<JoinHandle<String>>,
}

/// The accelerator: TCG unless `BLKLAB_ACCEL=kvm`, as in the other QEMU
/// tests.
fn accel() -> &'static str {
    match std::env::var("BLKLAB_ACCEL").as_deref() {
        Ok("kvm") => "kvm",
        _ => "tcg,thread=multi",
    }
}

/// QEMU's command line for `spec`: the lab's shared-memory and disk
/// options, the disk's chardev reconnecting after [`RECONNECT_MS`].
fn command(spec: &Spec, qmp: &Path, incoming: Option<&str>) -> Command {
    let mut cmd = Command::new(
        std::env::var_os("BLKLAB_QEMU").unwrap_or_else(|| "qemu-system-x86_64".into()),
    );
    cmd.args(["-accel", accel(), "-smp", &VCPUS.to_string(), "-m", MEM]);
    cmd.args(["-nographic", "-nic", "none", "-no-reboot"]);
    cmd.arg("-kernel").arg(&spec.image.kernel);
    cmd.arg("-initrd").arg(&spec.image.initrd);
    cmd.arg("-append").arg(format!(
        "console=ttyS0 loglevel=5 panic=-1 blklab.run=lifecycle-fio {}",
        spec.knobs
    ));
    let disk = QemuDisk {
        socket: spec.socket.clone(),
        num_queues: NUM_QUEUES,
        queue_size: 128,
    };
    for arg in qemu_args::guest_args(MEM, Some("q35"), &[disk]) {
        if arg.starts_with("socket,id=blklab") {
            cmd.arg(format!("{arg},reconnect-ms={RECONNECT_MS}"));
        } else {
            cmd.arg(arg);
        }
    }
    cmd.arg("-qmp").arg(common::qmp::qmp_arg(qmp));
    if let Some(uri) = incoming {
        cmd.args(["-incoming", uri]);
    }
    cmd
}

impl Guest {
    /// Start QEMU `name` for `spec` (waiting for a migration from `incoming`
    /// when given), its QMP socket in `dir`, its console lines sent to `tx`.
    pub(crate) fn start(
        name: &'static str,
        spec: &Spec,
        incoming: Option<&str>,
        dir: &Path,
        tx: Sender<Line>,
    ) -> Guest {
        let qmp = dir.join(format!("{name}.qmp"));
        let mut cmd = command(spec, &qmp, incoming);
        eprintln!("[lifecycle] {name}: {cmd:?}");
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start qemu-system-x86_64 (apt-get install qemu-system-x86)");
        let console = Arc::new(Mutex::new(String::new()));
        let stdout = child.stdout.take().expect("piped stdout");
        let text = console.clone();
        let out = std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            let mut buf = Vec::new();
            while r.read_until(b'\n', &mut buf).is_ok_and(|n| n > 0) {
                let line = String::from_utf8_lossy(&buf).replace('\r', "");
                text.lock().unwrap().push_str(&line);
                let _ = tx.send(Line {
                    guest: name,
                    text: line.trim_end().to_string(),
                });
                buf.clear();
            }
        });
        let mut stderr = child.stderr.take().expect("piped stderr");
        let err = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stderr.read_to_string(&mut s);
            s
        });
        Guest {
            child,
            qmp,
            console,
            stdout: Some(out),
            stderr: Some(err),
        }
    }

    /// The QMP command `command` with `arguments` (`null` for none).
    pub(crate) fn qmp(
        &self,
        command: &str,
        arguments: serde_json::Value,
    ) -> Result<serde_json::Value, String> {
        common::qmp::execute(&self.qmp, command, arguments, Duration::from_secs(30))
    }

    /// Everything QEMU printed on its console so far.
    pub(crate) fn console(&self) -> String {
        self.console.lock().unwrap().clone()
    }

    /// Wait up to `patience` for QEMU to exit; kill it if it has not. Its
    /// exit status (`None`: killed) and its stderr.
    pub(crate) fn finish(&mut self, patience: Duration) -> (Option<ExitStatus>, String) {
        let status = common::try_wait_for(patience, || self.child.try_wait().ok().flatten());
        if status.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if let Some(h) = self.stdout.take() {
            let _ = h.join();
        }
        let stderr = self
            .stderr
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        (status, stderr)
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}
