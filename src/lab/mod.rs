//! The lab: from guest kernels to numbers (`blklab run`).
//!
//! Its rooms, each importing only from the ones listed before it:
//!
//! - [`location`]: `--cache` and `--lab-dir`;
//! - [`scenario`]: the `.scn` scenario files the guest runs;
//! - [`options`]: what a run is asked to do: `blklab run`'s flags
//!   (`RunArgs`) and the same typed (`RunOptions`, which `bisect` builds
//!   directly), kept out of `run/` because the nested mode hands them to
//!   the lab inside the host (`nested::transfer`);
//! - [`guest`]: one QEMU guest, whatever the run: its command line and
//!   process, QMP, the console protocol, the accelerator choice, the
//!   cleanup on a signal;
//! - [`measure`]: what is counted around a variant, one module per
//!   source: the instruction-count plugin (its build, control socket,
//!   dump, System.map, records), the plugin's would-be VM exits, KVM's
//!   exits from the `kvm:kvm_exit` tracepoint, KVM's vCPU statistics over
//!   QMP;
//! - [`images`]: `--kernel` specs, `images/prepare.sh`, the image cache
//!   (with the plugin built for it);
//! - [`nested`]: what crosses between the two levels of `--accel
//!   nested` (the SYNC relay, the run and results disks, the records
//!   merged back), never reaching into the run;
//! - [`run`]: the run's phases, from the request to the summary.
//!
//! One boot (`run::boot`: its disks, QEMU's options and why it fails,
//! with the retry policy) and its console session (`run::session`) live
//! in `run/`, not in `guest/`: they take the run's plan, settings,
//! options and progress and write its records, while `guest/` knows a
//! QEMU process and nothing of a run. The nested mode's host boot and
//! `blklab nested-inner` are runs of their own, so they live in `run/`
//! too and `nested/` stays below it.
//!
//! The contract between the parts is docs/lab-protocol.md.

pub mod guest;
pub mod images;
pub(crate) mod location;
pub mod measure;
pub(crate) mod nested;
pub mod options;
pub mod run;
pub mod scenario;
