//! Guest instruction counts from blklab's QEMU TCG plugin
//! (`images/qemu-plugin/blklab-insns.c`):
//!
//! - [`build`]: building the plugin;
//! - [`control`]: asking it for counter dumps at a variant's SYNC markers;
//! - [`dump`]: a dump, read, and the difference of two dumps;
//! - [`tasks`]: its counts by the machine's task that ran them, and
//!   [`host_split`] those of a nested host's threads by part;
//! - [`symbol_map`]: symbolisation against the kernel's `System.map` (or a
//!   host's `/proc/kallsyms`);
//! - [`records`]: the record of a profile summed into the symbol groups of
//!   [`crate::record::symbol_groups`].
//!
//! A dump keeps two levels apart: level 1, the emulated machine's own code,
//! and level 2, what it ran as an SVM guest. A plain TCG run has only
//! level 1: the guest. A nested run (a host under TCG running the guest
//! under its KVM) has both: [`record`] of level 2 against the guest's
//! System.map is the guest's `instructions`, [`host_record`] of level 1
//! against the host's `/proc/kallsyms` its `host_instructions`.
//!
//! The window: the run asks for a dump when the guest prints `BLKLAB-SYNC
//! n begin` and again at `BLKLAB-SYNC n end`, before answering either, while
//! the guest waits on its console. The difference is exactly what the guest
//! executed for that variant (fio's start-up and exit included, boot and
//! firmware excluded), so per-IO figures divide it by the block layer's IO
//! count of the same window.

pub(crate) mod build;
pub(crate) mod control;
pub(crate) mod dump;
mod error;
pub(crate) mod host_split;
pub(crate) mod records;
pub(crate) mod symbol_map;
pub(crate) mod tasks;

pub(crate) use build::build_plugin;
pub(crate) use control::Control;
pub use dump::{Dump, LevelRule};
pub(crate) use error::InsnsError;
pub(crate) use records::exits_record;
pub(crate) use records::host_record;
pub use records::{profile, record};
pub use symbol_map::SymbolMap;

pub use crate::lab::measure::plugin_exits::ExitKind;
pub(crate) use crate::record::instructions::InsnsWindow;

/// The kernel function whose entry the plugin marks at (`mark=`): it
/// formats the per-CPU IPI and timer lines of /proc/interrupts, so a mark
/// is the instant the guest reads those counters.
pub(crate) const MARK_SYMBOL: &str = "arch_show_interrupts";
