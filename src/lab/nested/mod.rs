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
//! This room holds what crosses between the two levels, which both sides
//! see and which never reaches into the run itself (so neither side's run
//! depends on the other through it):
//!
//! - [`relay`]: the SYNC relay between the levels (the console protocol);
//! - [`task_layout`]: where the host's kernel keeps what names a task, for
//!   the outer plugin's split of the host's instructions by thread;
//! - [`transfer`]: what goes in (a tar on a read-only disk) and what comes
//!   out (a tar the host writes to a second disk), and the names on them;
//! - [`checkpoint`]: what the host keeps of its finished boots on the
//!   results disk as it goes, which outlives a host that stops half-way;
//! - [`merge`]: the inner records with the outer lab's counts;
//! - [`neighbour`]: a second VM beside the lab's in the host, when asked.
//!
//! The two runs are the run's own: the outer lab's side (the host's
//! machine, boot and console session) is `lab::run::nested_host`, the lab
//! inside the host (`blklab nested-inner`) `lab::run::nested_inner`.

pub(crate) mod checkpoint;
pub(crate) mod merge;
pub(crate) mod neighbour;
pub(crate) mod relay;
pub(crate) mod task_layout;
pub(crate) mod transfer;
