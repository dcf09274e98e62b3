//! Where a nested host's kernel keeps what names a task, and where the two
//! functions the outer plugin hooks start: what the plugin needs to split
//! the host's instructions by the thread that ran them (its header comment,
//! "Tasks" and "Halt").
//!
//! The inner lab reads them inside the host, where they are exact: the
//! offsets of `task_struct`'s `pid`, `tgid` and `comm` from the kernel's own
//! BTF (`/sys/kernel/btf/vmlinux`), the addresses of `__switch_to` and KVM's
//! `kvm_vcpu_halt` from `/proc/kallsyms` (the latter in `kvm.ko`, known only
//! once it is loaded). It hands them to the outer lab over the relay, which
//! passes them to its plugin (Debian ships the kernel's System.map only in
//! its -dbg package: nothing outside the host knows these addresses).

use std::path::Path;

use btf_rs::{Btf, Type};
use thiserror::Error;

use crate::lab::measure::plugin::{InsnsError, SymbolMap};

/// The host kernel's BTF.
const BTF: &str = "/sys/kernel/btf/vmlinux";

/// The function whose entry switches tasks: `__switch_to(prev, next)`.
const SWITCH_SYMBOL: &str = "__switch_to";

/// KVM's halt function: polls for a wake-up, then sleeps, when a guest's
/// vCPU halts; in its module, as kallsyms names module symbols.
const HALT_SYMBOL: &str = "kvm_vcpu_halt [kvm]";

/// The running kernel's symbols.
const KALLSYMS: &str = "/proc/kallsyms";

#[derive(Debug, Error)]
pub(crate) enum LayoutError {
    #[error(transparent)]
    Symbols(#[from] InsnsError),
    #[error("{KALLSYMS} has no {0}")]
    NoSymbol(&'static str),
    #[error("the kernel's BTF ({BTF}): {0}")]
    Btf(#[source] btf_rs::Error),
    #[error("the kernel's BTF ({BTF}) has no task_struct member {0}")]
    NoMember(&'static str),
}

/// What the plugin needs to name tasks and count halts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TaskLayout {
    /// `__switch_to`'s address.
    pub(crate) switch: u64,
    /// `kvm_vcpu_halt`'s address, when KVM is loaded.
    pub(crate) halt: Option<u64>,
    /// Byte offsets in `task_struct`.
    pub(crate) comm: u32,
    pub(crate) pid: u32,
    pub(crate) tgid: u32,
}

impl TaskLayout {
    /// This kernel's, from `/proc/kallsyms` and its BTF.
    pub(crate) fn of_this_kernel() -> Result<TaskLayout, LayoutError> {
        let (switch, halt) = hooks(&SymbolMap::read(Path::new(KALLSYMS))?)?;
        let btf = Btf::from_file(BTF).map_err(LayoutError::Btf)?;
        let offset = |m| member_offset(&btf, "task_struct", m);
        Ok(TaskLayout {
            switch,
            halt,
            comm: offset("comm")?,
            pid: offset("pid")?,
            tgid: offset("tgid")?,
        })
    }

    /// The relay's words for it (after `tasks SEQ`).
    pub(crate) fn render(&self) -> String {
        format!(
            "switch={:x} halt={:x} comm={} pid={} tgid={}",
            self.switch,
            self.halt.unwrap_or(0),
            self.comm,
            self.pid,
            self.tgid
        )
    }

    /// The relay's words back (`None` when any is missing or malformed).
    pub(crate) fn parse<'a>(words: impl Iterator<Item = &'a str>) -> Option<TaskLayout> {
        let (mut switch, mut halt, mut comm, mut pid, mut tgid) = (None, None, None, None, None);
        for w in words {
            let (k, v) = w.split_once('=')?;
            match k {
                "switch" => switch = Some(u64::from_str_radix(v, 16).ok()?),
                "halt" => halt = Some(u64::from_str_radix(v, 16).ok()?),
                "comm" => comm = Some(v.parse().ok()?),
                "pid" => pid = Some(v.parse().ok()?),
                "tgid" => tgid = Some(v.parse().ok()?),
                _ => return None,
            }
        }
        Some(TaskLayout {
            switch: switch?,
            halt: halt.filter(|h| *h != 0),
            comm: comm?,
            pid: pid?,
            tgid: tgid?,
        })
    }

    /// The plugin's `tasks` command for it.
    pub(crate) fn plugin_command(&self) -> String {
        format!(
            "tasks switch={:x} comm={} pid={} tgid={} halt={:x}",
            self.switch,
            self.comm,
            self.pid,
            self.tgid,
            self.halt.unwrap_or(0)
        )
    }
}

/// Where the plugin hooks in: `__switch_to`, and KVM's halt function
/// when KVM is loaded.
fn hooks(map: &SymbolMap) -> Result<(u64, Option<u64>), LayoutError> {
    let switch = map
        .address(SWITCH_SYMBOL)
        .ok_or(LayoutError::NoSymbol(SWITCH_SYMBOL))?;
    Ok((switch, map.address(HALT_SYMBOL)))
}

/// The byte offset of member `member` of struct `name`, looking into
/// anonymous structs and unions on the way.
fn member_offset(btf: &Btf, name: &str, member: &'static str) -> Result<u32, LayoutError> {
    let types = btf.resolve_types_by_name(name).map_err(LayoutError::Btf)?;
    types
        .iter()
        .find_map(|t| match t {
            Type::Struct(s) if !s.members.is_empty() => find_member(btf, s, member, 0),
            _ => None,
        })
        .map(|bits| bits / 8)
        .ok_or(LayoutError::NoMember(member))
}

/// The bit offset of `member` in `s` (or in an anonymous member of it).
fn find_member(btf: &Btf, s: &btf_rs::Struct, member: &str, base: u32) -> Option<u32> {
    for m in &s.members {
        let at = base + m.bit_offset();
        let name = btf.resolve_name(m).unwrap_or_default();
        if name == member {
            return Some(at);
        }
        if name.is_empty() {
            if let Ok(Type::Struct(inner) | Type::Union(inner)) = btf.resolve_chained_type(m) {
                if let Some(found) = find_member(btf, &inner, member, at) {
                    return Some(found);
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_relay_words_round_trip_and_malformed_ones_are_refused() {
        let l = TaskLayout {
            switch: 0xffffffff81002a30,
            halt: Some(0xffffffffc0a01230),
            comm: 3000,
            pid: 2504,
            tgid: 2508,
        };
        let words = l.render();
        assert_eq!(
            words,
            "switch=ffffffff81002a30 halt=ffffffffc0a01230 comm=3000 pid=2504 tgid=2508"
        );
        assert_eq!(TaskLayout::parse(words.split(' ')), Some(l));
        assert_eq!(
            l.plugin_command(),
            "tasks switch=ffffffff81002a30 comm=3000 pid=2504 tgid=2508 halt=ffffffffc0a01230"
        );
        let no_halt = TaskLayout { halt: None, ..l };
        assert_eq!(
            TaskLayout::parse(no_halt.render().split(' ')),
            Some(no_halt)
        );
        for bad in [
            "switch=ffff halt=0 comm=1 pid=2",
            "switch=zz halt=0 comm=1 pid=2 tgid=3",
            "switch=ffff halt=0 comm=1 pid=2 tgid=3 extra=1",
            "switch=ffff halt=0 comm=-1 pid=2 tgid=3",
        ] {
            assert_eq!(TaskLayout::parse(bad.split(' ')), None, "{bad}");
        }
    }

    #[test]
    fn the_hooks_are_the_kernels_switch_and_kvms_halt() {
        let map = |text: &str| SymbolMap::parse(text, Path::new("kallsyms")).unwrap();
        let with_kvm = map("ffffffff81002a30 T __switch_to\n\
             ffffffff81ff0000 D __switch_to_data\n\
             ffffffffc0a01230 t kvm_vcpu_halt\t[kvm]\n");
        assert_eq!(
            hooks(&with_kvm).unwrap(),
            (0xffffffff81002a30, Some(0xffffffffc0a01230))
        );
        let without_kvm = map("ffffffff81002a30 T __switch_to\n");
        assert_eq!(hooks(&without_kvm).unwrap(), (0xffffffff81002a30, None));
        let no_switch = map("ffffffff81002000 T schedule\n");
        assert!(matches!(
            hooks(&no_switch),
            Err(LayoutError::NoSymbol("__switch_to"))
        ));
    }
}
