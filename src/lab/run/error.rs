//! Why `blklab run` failed: one error, by kind, for every phase.

use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::lab::guest::accel::AccelError;
use crate::lab::guest::qemu;
use crate::lab::images;
use crate::lab::measure::plugin::InsnsError;
use crate::lab::run::boot::BootFailure;
use crate::lab::run::nested_host::NestedError;
use crate::lab::run::settings::{DeviceSettingsError, MachineError};
use crate::lab::scenario;
use crate::record::RecordError;

/// Why `blklab run` failed, by kind: a bad argument or scenario, the
/// images, the accelerator, QEMU, writing the results, or a boot.
#[derive(Debug, Error)]
pub enum RunError {
    #[error(transparent)]
    Scenario(#[from] scenario::ScenarioError),
    #[error(transparent)]
    Image(#[from] images::ImageError),
    #[error(transparent)]
    Qemu(#[from] qemu::QemuError),
    #[error(transparent)]
    QemuChoice(#[from] images::bundle::ChooseError),
    #[error(
        "--accel nested with a QEMU bundle's QEMU ({qemu}): the nested mode packs the host's \
         Debian QEMU into its emulated host; run it on a host with qemu-system-x86 installed"
    )]
    NestedWithBundle { qemu: PathBuf },
    #[error("--iterations must be at least 1")]
    NoIterations,
    #[error("--out {dir}: it holds {file} of an earlier run; a run writes into an empty or new directory, so that `blklab compare` never pools two runs' records (give another --out, or remove it)")]
    OutHoldsRecords { dir: PathBuf, file: String },
    #[error("--vcpus must be 1..=64")]
    VcpusOutOfRange,
    #[error(
        "--variants: scenario {scenario} has no variant {variant:?} (it has: {})",
        available.join(", ")
    )]
    NoSuchVariant {
        scenario: String,
        variant: String,
        available: Vec<String>,
    },
    #[error(
        "scenario {} is valid but not in {}: the guest only has the scenarios packed \
         into its initramfs; copy it there (the image is rebuilt automatically)",
        path.display(),
        dir.display()
    )]
    ScenarioNotShipped { path: PathBuf, dir: PathBuf },
    #[error("scenario {0} given twice")]
    ScenarioTwice(String),
    #[error("scenario {scenario} ({variants}): {vcpus} vCPUs (want 1 to 64)")]
    UnitVcpus {
        scenario: String,
        variants: String,
        vcpus: u32,
    },
    #[error(
        "scenario {scenario} ({variants}): memory {memory} is not a whole number of 2 MiB \
         huge pages, which a nested run's guests are made of"
    )]
    UnitHugePages {
        scenario: String,
        variants: String,
        memory: String,
    },
    #[error(transparent)]
    UnitMachine(#[from] MachineError),
    #[error("scenario {scenario} ({variants}): device settings: {source}")]
    UnitDevice {
        scenario: String,
        variants: String,
        #[source]
        source: DeviceSettingsError,
    },
    #[error(
        "--shard {index}/{count}: this shard has no boots (the run has {groups} (iteration, scenario part) groups)"
    )]
    EmptyShard {
        index: u32,
        count: u32,
        groups: usize,
    },
    #[error(
        "images/prepare.sh named the kernels [{}], the plan [{}]: a blklab binary and lab tree of different versions?",
        prepared.join(", "),
        planned.join(", ")
    )]
    LabelMismatch {
        prepared: Vec<String>,
        planned: Vec<String>,
    },
    #[error(transparent)]
    Accel(#[from] AccelError),
    #[error(transparent)]
    Nested(#[from] NestedError),
    #[error("{flag} applies to --accel nested only")]
    NestedOnly { flag: &'static str },
    #[error(
        "--host-tcg single cannot count instructions (add --count-insns off): QEMU 10.0's \
         single-threaded TCG runs blocks translated with the counting plugin's scoreboard after \
         moving it, and dies of SIGSEGV before the host boots"
    )]
    SingleThreadedHostCounting,
    #[error("inside the nested host the guests would not run under KVM ({reason})")]
    NoKvmInside { reason: String },
    #[error(
        "--count-insns: no System.map next to {} (symbolisation needs the kernel's \
         System.map; self-built kernels have one, Debian's linux-image packages only a \
         placeholder: the real one is in linux-image-…-dbg)",
        kernel.display()
    )]
    NoSystemMap { kernel: PathBuf },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Insns(#[from] InsnsError),
    #[error(transparent)]
    Record(#[from] RecordError),
    #[error(
        "guest {kernel}, scenario {scenario}, iteration {iteration}: the guest kernel reported a fault \
         (console kept: {}); the report, whole:\n{trace}",
        console.display()
    )]
    KernelFault {
        kernel: String,
        scenario: String,
        iteration: u32,
        console: PathBuf,
        trace: String,
    },
    /// A boot failed (twice, when its failure is worth a second boot:
    /// `first` is the first attempt's).
    #[error(
        "guest {kernel}, scenario {scenario}, iteration {iteration}: {failure} ({})",
        attempts_note(first.as_deref(), console)
    )]
    Boot {
        kernel: String,
        scenario: String,
        iteration: u32,
        console: PathBuf,
        #[source]
        failure: Box<BootFailure>,
        first: Option<Box<BootFailure>>,
    },
}

/// Where a failed boot's console is, and what the first attempt said when
/// there were two.
fn attempts_note(first: Option<&BootFailure>, console: &Path) -> String {
    match first {
        Some(first) => format!(
            "second attempt; the first failed too: {first}; console: {}",
            console.display()
        ),
        None => format!("console: {}", console.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_boot_names_its_console_and_its_first_attempt() {
        let q = || crate::lab::guest::qemu::QemuError::Timeout {
            secs: 180,
            what: "the guest to boot (BLKLAB-INIT)".into(),
            console: String::new(),
        };
        let console = Path::new("/out/console/k.s.01.log");
        assert_eq!(
            attempts_note(None, console),
            "console: /out/console/k.s.01.log"
        );
        assert_eq!(
            attempts_note(Some(&BootFailure::Silent(q())), console),
            "second attempt; the first failed too: timed out after 180 s waiting for the \
             guest to boot (BLKLAB-INIT); last console lines:\n; console: /out/console/k.s.01.log"
        );
        let e = RunError::Boot {
            kernel: "k".into(),
            scenario: "s".into(),
            iteration: 1,
            console: console.into(),
            failure: Box::new(BootFailure::NeverBooted),
            first: None,
        };
        assert_eq!(
            e.to_string(),
            "guest k, scenario s, iteration 1: the guest finished without booting \
             (console: /out/console/k.s.01.log)"
        );
        assert!(
            matches!(&e, RunError::Boot { failure, .. } if matches!(**failure, BootFailure::NeverBooted))
        );
        use std::error::Error as _;
        assert_eq!(
            e.source().map(|s| s.to_string()).as_deref(),
            Some("the guest finished without booting")
        );
    }
}
