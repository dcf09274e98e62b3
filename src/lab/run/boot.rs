//! One boot of `blklab run`, around its console session: what it boots
//! ([`BootCtx`]: the kernel, the scenario's unit, the accelerator, where
//! its output goes), the disks it serves in-process ([`BootDisks`]), QEMU's
//! command line for it, and why it can fail ([`BootFailure`], whose kind
//! alone decides whether the boot is tried again: [`BootFailure::retry`]).
//! The console session itself is `session`; planning and the run's
//! documents belong to the other phases of `run/`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use thiserror::Error;

use crate::backend::server::{ServeError, Server};
use crate::backend::Disk;
use crate::device::config::DiskConfig;
use crate::lab::guest::qemu::{Accel, QemuDisk, QemuError, QemuSpec, CLOCKSOURCE_ARGS};
use crate::lab::images::PreparedGuest;
use crate::lab::measure::kvm_qmp_stats::KvmStatsError;
use crate::lab::measure::plugin::{self, InsnsError, SymbolMap};
use crate::lab::nested::relay::{RelayError, SyncRelay};
use crate::lab::options::{RunOptions, Timeouts};
use crate::lab::run::progress::Progress;
use crate::lab::run::settings::{DeviceSettingsError, Unit};
use crate::lab::scenario::Scenario;
use crate::record::run::RunStamp;
use crate::record::RecordError;

/// One boot of the plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Boot {
    /// Index of the kernel in `--kernel` order.
    pub(crate) kernel: usize,
    /// Index of the boot unit (a scenario's variants sharing device
    /// settings).
    pub(crate) unit: usize,
    pub(crate) iteration: u32,
    /// The (iteration, unit) group: the unit of sharding.
    pub(crate) group: usize,
}

/// What one boot runs and with what.
pub(crate) struct BootCtx<'a> {
    pub(crate) options: &'a RunOptions,
    /// The run's timeouts, scaled for this boot's vCPUs on the usable host
    /// cores.
    pub(crate) timeouts: Timeouts,
    /// The boot's position in the run (0-based).
    pub(crate) seq: usize,
    pub(crate) boot: &'a Boot,
    /// The kernel's label.
    pub(crate) label: &'a str,
    pub(crate) guest: &'a PreparedGuest,
    pub(crate) scenario: &'a Scenario,
    pub(crate) unit: &'a Unit,
    pub(crate) accel: Accel,
    /// The QEMU binary.
    pub(crate) qemu: &'a str,
    pub(crate) out_dir: &'a Path,
    pub(crate) pb: &'a Progress,
    /// The instruction-count plugin (--count-insns).
    pub(crate) plugin: Option<&'a Path>,
    /// The kernel's System.map (--count-insns).
    pub(crate) symbols: Option<Arc<SymbolMap>>,
    /// What each record carries of the run document.
    pub(crate) stamp: &'a RunStamp,
    /// Inside a nested host: the outer lab, told of every SYNC.
    pub(crate) relay: Option<&'a dyn SyncRelay>,
}

impl BootCtx<'_> {
    /// Where the boot's console goes (`KERNEL.SCENARIO[.pN].NN.log`: `pN`
    /// when the scenario runs in several boots).
    pub(crate) fn console_log(&self) -> PathBuf {
        let part = self.unit.part.map(|p| format!(".p{p}")).unwrap_or_default();
        self.out_dir.join("console").join(format!(
            "{}.{}{part}.{:02}.log",
            self.label, self.scenario.name, self.boot.iteration
        ))
    }
}

/// QEMU's `-plugin` argument: the plugin, its control socket, the mark
/// address and, where single-threaded TCG shares translated blocks between
/// several vCPUs (`--deterministic` with more than one), `retired=off`: the
/// plugin's per-vCPU inline operations cannot tell those vCPUs apart, so
/// it counts whole blocks there.
fn plugin_arg(plugin: &Path, ctl: &Path, mark: Option<u64>, shared_blocks: bool) -> String {
    let mut arg = format!("{},ctl={}", plugin.display(), ctl.display());
    if let Some(a) = mark {
        arg += &format!(",mark={a:x}");
    }
    if shared_blocks {
        arg += ",retired=off";
    }
    arg
}

/// Why a boot failed. Its kind decides what `blklab run` does about it
/// ([`BootFailure::retry`]).
#[derive(Debug, Error)]
pub enum BootFailure {
    /// Nothing at all came from the guest's console (QEMU or the guest
    /// never got going): QEMU exited or the wait for the boot timed out.
    #[error(transparent)]
    Silent(QemuError),
    /// QEMU itself aborted on a known emulator bug
    /// ([`crate::lab::guest::qemu::KNOWN_EMULATOR_BUGS`]) before the guest reached
    /// `/init`, with no guest kernel fault on the console.
    #[error("{bug}: {source}")]
    EmulatorBug {
        bug: &'static str,
        #[source]
        source: QemuError,
    },
    /// The guest kernel reported a fault (oops, BUG, WARN, panic, call
    /// trace): the report, whole.
    #[error("the guest kernel reported a fault:\n{report}")]
    KernelFault { report: String },
    /// QEMU did not start, or after the guest spoke it exited, a wait timed
    /// out or its console could not be written.
    #[error(transparent)]
    Qemu(#[from] QemuError),
    /// Inside a nested host, the guest reset itself (or powered off) after
    /// it spoke, with no kernel fault on its console: QEMU exited 0 under
    /// `-no-reboot`. Seen once in about forty nested boots, in the middle
    /// of a result document; a nested guest's emulated SVM is the likely
    /// cause, so it is tried once more (a second reset fails the run).
    #[error("the guest reset itself inside the nested host: {0}")]
    NestedGuestReset(#[source] QemuError),
    /// The boot's private socket directory could not be made.
    #[error("cannot write {}: {source}", path.display())]
    SocketDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The unit's device settings make no disks.
    #[error("device settings: {0}")]
    DeviceSettings(#[source] DeviceSettingsError),
    /// The disks could not be served.
    #[error(transparent)]
    Serve(#[from] ServeError),
    /// The instruction-count plugin failed at a variant's window `edge`
    /// (`SCENARIO/VARIANT begin` or `end`).
    #[error("{edge}: {source}")]
    Plugin {
        edge: String,
        #[source]
        source: InsnsError,
    },
    /// Inside a nested host: the outer lab could not be told of a SYNC.
    #[error("relaying the SYNC to the outer lab: {0}")]
    Relay(#[from] RelayError),
    /// KVM's statistics could not be read at a variant's window `edge`
    /// (`SCENARIO/VARIANT begin` or `end`), under KVM; a QEMU without them
    /// is not a failure (the records say why they have none).
    #[error("{edge}: KVM statistics: {source}")]
    KvmStats {
        edge: String,
        #[source]
        source: KvmStatsError,
    },
    /// A result document ended under another name than it began.
    #[error("result framing mismatch: began {began}, ended {ended}")]
    ResultFraming { began: String, ended: String },
    /// A variant's record could not be written.
    #[error(transparent)]
    WriteRecord(#[from] RecordError),
    /// The guest scripts ended, but the guest never said it booted.
    #[error("the guest finished without booting")]
    NeverBooted,
}

/// What `blklab run` does about a failed boot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retry {
    /// Boot once more (the first attempt's console log is kept).
    Once,
    /// Fail the run.
    Never,
}

impl BootFailure {
    /// The retry policy: a boot that never got going (a silent console, or
    /// QEMU aborting on a known emulator bug before `/init`) is tried once
    /// more; anything after the guest spoke, a guest kernel fault above
    /// all, fails the run, and so does a failure of the host's own request.
    pub(crate) fn retry(&self) -> Retry {
        match self {
            BootFailure::Silent(_)
            | BootFailure::EmulatorBug { .. }
            | BootFailure::NestedGuestReset(_) => Retry::Once,
            BootFailure::KernelFault { .. }
            | BootFailure::Qemu(_)
            | BootFailure::SocketDir { .. }
            | BootFailure::DeviceSettings(_)
            | BootFailure::Serve(_)
            | BootFailure::Plugin { .. }
            | BootFailure::Relay(_)
            | BootFailure::KvmStats { .. }
            | BootFailure::ResultFraming { .. }
            | BootFailure::WriteRecord(_)
            | BootFailure::NeverBooted => Retry::Never,
        }
    }
}

/// A private directory for one boot's sockets (a fresh `blklab-run-*`
/// directory of mode 0700 made by `tempfile`, never one that already
/// existed), removed on drop, or by [`crate::lab::guest::cleanup`] on SIGINT/SIGTERM.
pub(crate) struct SocketDir(pub PathBuf);

impl SocketDir {
    pub(crate) fn new(seq: usize) -> Result<SocketDir, BootFailure> {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::Builder::new()
            .prefix(&format!("blklab-run-{seq}-"))
            .permissions(std::fs::Permissions::from_mode(0o700))
            .tempdir()
            .map_err(|source| BootFailure::SocketDir {
                path: std::env::temp_dir(),
                source,
            })?;
        // Ownership moves to SocketDir (and the cleanup registry), which
        // removes it.
        let p = dir.keep();
        crate::lab::guest::cleanup::track_dir(&p);
        Ok(SocketDir(p))
    }
}

impl Drop for SocketDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
        crate::lab::guest::cleanup::untrack_dir(&self.0);
    }
}

/// The disks one boot serves in-process, on sockets in a directory of
/// their own. (Fields drop in order: the server stops before its sockets'
/// directory goes.)
pub(crate) struct BootDisks {
    pub(crate) server: Server,
    pub(crate) disks: Vec<Arc<Disk>>,
    pub(crate) configs: Vec<DiskConfig>,
    pub(crate) sockets: SocketDir,
}

impl BootDisks {
    /// Start serving the unit's disks.
    pub(crate) fn start(c: &BootCtx) -> Result<BootDisks, BootFailure> {
        let sockets = SocketDir::new(c.seq)?;
        let configs = c
            .unit
            .settings
            .disk_configs(sockets.0.join("vd.sock"))
            .map_err(BootFailure::DeviceSettings)?;
        let server = Server::start(configs.clone())?;
        let disks = server.disks();
        Ok(BootDisks {
            server,
            disks,
            configs,
            sockets,
        })
    }
}

/// The guest kernel's command line for one boot.
fn kernel_append(c: &BootCtx) -> String {
    let base = format!(
        // loglevel=5: the console shows KERN_WARNING and worse, so a WARN
        // splat reaches the fault scanner (`quiet` would hide it).
        "console=ttyS0 loglevel=5 panic=-1 {}blklab.run=lab blklab.scenarios={} blklab.sync=1",
        clocksource_args(c.accel),
        c.scenario.name
    );
    let mut append = with_appends(
        base,
        c.scenario.kernel_append.as_deref(),
        c.options.guest.append.as_deref(),
    );
    if let Some(r) = c.options.fio.runtime {
        append.push_str(&format!(" blklab.runtime={r}"));
    }
    if let Some(r) = c.options.fio.ramp {
        append.push_str(&format!(" blklab.ramp={r}"));
    }
    // The unit's variants, when the boot runs fewer than the scenario file
    // has (--variants, or variants with other device settings).
    let names: Vec<&str> = c
        .unit
        .settings
        .variants
        .iter()
        .map(|&i| c.scenario.variants[i].name.as_str())
        .collect();
    if c.options.variants.is_some() || c.unit.part.is_some() {
        append.push_str(&format!(" blklab.variants={}", names.join(",")));
    }
    // Kernel addresses must be System.map's.
    if c.plugin.is_some() {
        append.push_str(" nokaslr");
    }
    append
}

/// `base` with the scenario's `kernel_append`, then `--append`'s, after
/// it: the kernel takes the last of a repeated argument, so the user's
/// wins over the scenario's, which wins over blklab's.
fn with_appends(mut base: String, scenario: Option<&str>, user: Option<&str>) -> String {
    for extra in [scenario, user].into_iter().flatten() {
        base.push(' ');
        base.push_str(extra);
    }
    base
}

/// The clocksource arguments for a guest under `accel`, with a trailing
/// blank: TCG's ([`CLOCKSOURCE_ARGS`]); none under KVM, where the guest
/// keeps kvm-clock as on a user's host.
fn clocksource_args(accel: Accel) -> String {
    match accel {
        Accel::Kvm => String::new(),
        _ => format!("{CLOCKSOURCE_ARGS} "),
    }
}

/// What QEMU runs for one boot: the guest, its disks, with
/// `--count-insns` the plugin with its control socket and, given `qmp`, a
/// QMP socket (for KVM's statistics).
pub(crate) fn qemu_spec(
    c: &BootCtx,
    configs: &[DiskConfig],
    plugin: Option<&plugin::Control>,
    qmp: Option<&Path>,
) -> QemuSpec {
    QemuSpec {
        qemu: c.qemu.to_string(),
        accel: c.accel,
        vcpus: c.unit.settings.machine.vcpus,
        memory: c.unit.settings.machine.memory.clone(),
        kernel: c.guest.kernel.clone(),
        initramfs: c.guest.initramfs.clone(),
        append: kernel_append(c),
        disks: configs
            .iter()
            .map(|d| QemuDisk {
                socket: d.socket.clone(),
                num_queues: d.num_queues,
                queue_size: d.queue_size,
            })
            .collect(),
        deterministic: c.options.guest.deterministic,
        plugin: match (c.plugin, plugin) {
            (Some(p), Some(ctl)) => {
                // The plugin marks its counts where the guest's kernel
                // formats /proc/interrupts' IPI lines (the guest's window).
                let mark = c
                    .symbols
                    .as_ref()
                    .and_then(|m| m.address(plugin::MARK_SYMBOL));
                let shared_blocks =
                    c.options.guest.deterministic && c.unit.settings.machine.vcpus > 1;
                Some(plugin_arg(p, ctl.path(), mark, shared_blocks))
            }
            _ => None,
        },
        qmp: qmp.map(Path::to_path_buf),
        ram: c.options.guest.ram,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plugin_counts_whole_blocks_where_vcpus_share_them() {
        let (p, ctl) = (
            Path::new("/p/libblklab-insns.so"),
            Path::new("/s/insns.sock"),
        );
        assert_eq!(
            plugin_arg(p, ctl, Some(0xffffffff81000000), false),
            "/p/libblklab-insns.so,ctl=/s/insns.sock,mark=ffffffff81000000"
        );
        assert_eq!(
            plugin_arg(p, ctl, None, true),
            "/p/libblklab-insns.so,ctl=/s/insns.sock,retired=off"
        );
    }

    #[test]
    fn the_scenarios_arguments_come_after_blklabs_and_the_users_last() {
        let base = || "console=ttyS0 clocksource=tsc".to_string();
        assert_eq!(
            with_appends(
                base(),
                Some("clocksource=hpet"),
                Some("clocksource=acpi_pm")
            ),
            "console=ttyS0 clocksource=tsc clocksource=hpet clocksource=acpi_pm"
        );
        assert_eq!(with_appends(base(), None, None), base());
        assert_eq!(
            with_appends(base(), None, Some("x=1")),
            "console=ttyS0 clocksource=tsc x=1"
        );
    }

    #[test]
    fn only_tcg_guests_are_told_their_clocksource() {
        assert_eq!(clocksource_args(Accel::Kvm), "");
        for a in [Accel::Tcg, Accel::Auto] {
            assert_eq!(clocksource_args(a), "clocksource=tsc tsc=reliable ");
        }
    }

    fn exited() -> QemuError {
        QemuError::Exited {
            status: "exit status: 1".into(),
            clean: false,
            stderr: String::new(),
            console: String::new(),
        }
    }

    fn timed_out() -> QemuError {
        QemuError::Timeout {
            secs: 180,
            what: "the guest to boot (BLKLAB-INIT)".into(),
            console: String::new(),
        }
    }

    fn io() -> std::io::Error {
        std::io::ErrorKind::PermissionDenied.into()
    }

    #[test]
    fn a_boot_that_never_got_going_is_tried_once_more() {
        assert_eq!(BootFailure::Silent(exited()).retry(), Retry::Once);
        assert_eq!(BootFailure::Silent(timed_out()).retry(), Retry::Once);
        let bug = BootFailure::EmulatorBug {
            bug: "QEMU TCG assertion",
            source: exited(),
        };
        assert_eq!(bug.retry(), Retry::Once);
        assert!(bug
            .to_string()
            .starts_with("QEMU TCG assertion: QEMU exited"));
        let reset = BootFailure::NestedGuestReset(QemuError::Exited {
            status: "exit status: 0".into(),
            clean: true,
            stderr: String::new(),
            console: String::new(),
        });
        assert_eq!(reset.retry(), Retry::Once);
        assert!(reset.to_string().starts_with(
            "the guest reset itself inside the nested host: QEMU exited (exit status: 0)"
        ));
    }

    #[test]
    fn a_guest_kernel_fault_is_never_retried() {
        let f = BootFailure::KernelFault {
            report: "BUG: kernel NULL pointer dereference".into(),
        };
        assert_eq!(f.retry(), Retry::Never);
    }

    #[test]
    fn failures_after_the_guest_spoke_or_of_the_host_are_never_retried() {
        let never = [
            BootFailure::Qemu(exited()),
            BootFailure::Qemu(timed_out()),
            BootFailure::Qemu(QemuError::Console(io())),
            BootFailure::SocketDir {
                path: "/tmp".into(),
                source: io(),
            },
            BootFailure::DeviceSettings(DeviceSettingsError::DepthTooLarge(1 << 40)),
            BootFailure::Serve(ServeError::NotASocket {
                path: "/tmp/x".into(),
            }),
            BootFailure::Plugin {
                edge: "s/v begin".into(),
                source: InsnsError::Plugin {
                    path: "/tmp/insns.sock".into(),
                    why: "gone".into(),
                },
            },
            BootFailure::KvmStats {
                edge: "s/v end".into(),
                source: KvmStatsError::NoQomPath,
            },
            BootFailure::ResultFraming {
                began: "s/a".into(),
                ended: "s/b".into(),
            },
            BootFailure::WriteRecord(RecordError::Write {
                path: "/tmp/r.json".into(),
                source: io(),
            }),
            BootFailure::NeverBooted,
        ];
        for f in never {
            assert_eq!(f.retry(), Retry::Never, "{f:?}");
        }
    }

    #[test]
    fn a_failure_keeps_its_cause() {
        use std::error::Error as _;
        let f = BootFailure::Plugin {
            edge: "s/v end".into(),
            source: InsnsError::Plugin {
                path: "/tmp/insns.sock".into(),
                why: "gone".into(),
            },
        };
        assert!(matches!(
            f.source().and_then(|s| s.downcast_ref::<InsnsError>()),
            Some(InsnsError::Plugin { .. })
        ));
        assert!(f
            .to_string()
            .starts_with("s/v end: the instruction-count plugin"));
        let k = BootFailure::KvmStats {
            edge: "s/v begin".into(),
            source: KvmStatsError::Qmp(crate::lab::guest::qmp::QmpError::Closed {
                path: "/tmp/qmp.sock".into(),
            }),
        };
        assert!(matches!(
            k.source().and_then(|s| s.downcast_ref::<KvmStatsError>()),
            Some(KvmStatsError::Qmp(_))
        ));
        assert_eq!(
            k.to_string(),
            "s/v begin: KVM statistics: QEMU's QMP socket /tmp/qmp.sock closed"
        );
    }
}
