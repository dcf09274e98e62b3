//! The lab: from guest kernels to numbers (`blklab run`).
//!
//! - [`scenario`]: the `.scn` scenario files the guest runs;
//! - [`images`]: `--kernel` specs and `images/prepare.sh`;
//! - [`insns`]: the instruction-count plugin, System.map, symbol groups;
//! - [`exits`]: the plugin's would-be VM exits, classified per reason;
//! - [`location`]: `--cache` and `--lab-dir`;
//! - [`qemu`]: QEMU's command line, the KVM probe, a guest on pipes;
//! - `qmp`: a small QMP client on QEMU's monitor socket;
//! - `kvm_stats`: KVM's per-vCPU statistics over a variant's window (QMP
//!   `query-stats`, under KVM);
//! - [`console`]: the guest's console protocol (SYNC, results);
//! - [`hostcpu`]: per-thread CPU of QEMU and of this process;
//! - [`runner`]: the run's phases, from the arguments to the summary;
//! - [`nested`]: `--accel nested`, guests under KVM inside an emulated host;
//! - `accel`: KVM or TCG, and whether instructions are counted;
//! - `boot`: one boot, its disks and why it fails (its retry policy);
//! - `session`: one boot's console session and the records it writes;
//! - [`summary`]: the table printed at the end.
//!
//! The contract between the parts is docs/lab-protocol.md.

pub mod guest;
pub mod images;
pub(crate) mod location;
pub mod measure;
pub mod nested;
pub mod options;
pub mod run;
pub mod scenario;
