//! The lab: from guest kernels to numbers (`blklab run`).
//!
//! - [`scenario`]: the `.scn` scenario files the guest runs;
//! - [`images`]: `--kernel` specs and `images/prepare.sh`;
//! - [`insns`]: the instruction-count plugin, System.map, symbol groups;
//! - [`qemu`]: QEMU's command line, the KVM probe, a guest on pipes;
//! - [`console`]: the guest's console protocol (SYNC, results);
//! - [`hostcpu`]: per-thread CPU of QEMU and of this process;
//! - [`runner`]: the interleaved boots and the records they produce;
//! - [`summary`]: the table printed at the end.
//!
//! The contract between the parts is docs/lab-protocol.md.

pub(crate) mod cleanup;
pub mod console;
pub mod images;
pub mod insns;
pub mod options;
pub mod plan;
pub(crate) mod progress;
pub mod qemu;
pub mod runner;
pub mod scenario;
pub(crate) mod settings;
pub mod summary;
