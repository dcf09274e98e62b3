//! `blklab run --accel nested`: the guests run under real KVM inside an
//! emulated host.
//!
//! The outer lab boots the host (Debian's kernel with kvm_amd, QEMU, a
//! small userland: `images/build-nested-host.sh`) under TCG with `-cpu
//! EPYC`, whose SVM TCG emulates; inside it `blklab nested-inner` runs the
//! lab exactly as on a real KVM host (the backend in process, QEMU `-accel
//! kvm` for each boot, the guest scripts). Every instruction of the host
//! (its kernel with KVM, QEMU, blklab) and of the guests is executed by the
//! outer QEMU, whose plugin counts both levels apart.
//!
//! - [`relay`]: the SYNC relay between the levels (the console protocol);
//! - [`transfer`]: what goes in (a tar on a read-only disk) and what comes
//!   out (a tar the host writes to a second disk);
//! - [`host`]: the outer lab's side: the host's machine and its console
//!   session;
//! - [`inner`]: `blklab nested-inner`, the lab's side inside the host;
//! - [`merge`]: the inner records with the outer lab's counts.

pub(crate) mod merge;
pub(crate) mod relay;
pub(crate) mod transfer;
