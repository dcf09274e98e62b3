//! A kernel's text symbols, from its System.map or a running kernel's
//! `/proc/kallsyms`: the function at an address, and where a function is
//! entered.

use std::path::Path;

use crate::lab::measure::plugin::error::InsnsError;
use crate::record::symbol_groups::{base_name, split_module, OUTSIDE};

/// A kernel's text symbols: from its System.map, or from a running
/// kernel's `/proc/kallsyms` (whose module symbols,
/// `ADDRESS t NAME\t[MODULE]`, are named `NAME [MODULE]`).
#[derive(Debug, Clone)]
pub struct SymbolMap {
    /// (address, name), sorted by address.
    syms: Vec<(u64, String)>,
    /// End of the kernel's text (`_etext`), when the map has it.
    etext: Option<u64>,
    /// Addresses of modules' other symbols (data, read-only data), sorted:
    /// a module's text ends before them.
    module_data: Vec<u64>,
}

impl SymbolMap {
    pub fn read(path: &Path) -> Result<SymbolMap, InsnsError> {
        let text = std::fs::read_to_string(path).map_err(|source| InsnsError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        SymbolMap::parse(&text, path)
    }

    pub fn parse(text: &str, path: &Path) -> Result<SymbolMap, InsnsError> {
        let err = |line: usize, why: String| InsnsError::Parse {
            path: path.to_path_buf(),
            line,
            why,
        };
        let (mut syms, mut module_data) = (Vec::new(), Vec::new());
        let mut etext = None;
        for (i, l) in text.lines().enumerate() {
            let w: Vec<&str> = l.split_ascii_whitespace().collect();
            if w.is_empty() {
                continue;
            }
            let module = match w[..] {
                [_, _, _] => None,
                [_, _, _, m] if m.len() > 2 && m.starts_with('[') && m.ends_with(']') => Some(m),
                _ => return Err(err(i + 1, "want 'ADDRESS TYPE NAME [MODULE]'".into())),
            };
            let addr = u64::from_str_radix(w[0], 16)
                .map_err(|_| err(i + 1, format!("bad address {:?}", w[0])))?;
            if w[2] == "_etext" && module.is_none() {
                etext = Some(addr);
            }
            match (w[1], module) {
                ("T" | "t" | "W" | "w", None) => syms.push((addr, w[2].to_string())),
                ("T" | "t" | "W" | "w", Some(m)) => syms.push((addr, format!("{} {m}", w[2]))),
                (_, Some(_)) => module_data.push(addr),
                (_, None) => {}
            }
        }
        if syms.is_empty() {
            return Err(err(
                0,
                "no text symbols (T/t/W/w): not a real System.map (Debian's linux-image \
                 packages ship a placeholder; the real one is in the matching \
                 linux-image-…-dbg package)"
                    .into(),
            ));
        }
        if syms.iter().all(|(a, _)| *a == 0) {
            return Err(err(
                0,
                "every address is 0: /proc/kallsyms read without the right to see \
                 addresses (read it as root; kernel.kptr_restrict)"
                    .into(),
            ));
        }
        syms.sort();
        module_data.sort_unstable();
        Ok(SymbolMap {
            syms,
            etext,
            module_data,
        })
    }

    /// The function holding `addr`: the text symbol at or below it, or
    /// `[outside kernel text]` (trampolines, and modules System.map does
    /// not know) when it is below the first symbol, or past `_etext` and
    /// the symbol below is the kernel's own, or a module's with a module's
    /// data symbol in between (the module's text ended: e.g. its init code,
    /// whose symbols kallsyms drops once it ran).
    pub(crate) fn lookup(&self, addr: u64) -> &str {
        let (at, name) = match self.syms.partition_point(|(a, _)| *a <= addr) {
            0 => return OUTSIDE,
            i => (self.syms[i - 1].0, self.syms[i - 1].1.as_str()),
        };
        if self.etext.is_some_and(|e| addr >= e) {
            let data = self.module_data.partition_point(|a| *a <= addr);
            let ended = data > 0 && self.module_data[data - 1] > at;
            if split_module(name).1.is_none() || ended {
                return OUTSIDE;
            }
        }
        name
    }

    /// Every text symbol, (address, name), sorted by address.
    pub(crate) fn text_symbols(&self) -> &[(u64, String)] {
        &self.syms
    }

    /// The address of a function, by exact name.
    pub(crate) fn address(&self, name: &str) -> Option<u64> {
        self.syms.iter().find(|(_, n)| n == name).map(|(a, _)| *a)
    }

    /// Where `name` is entered: its exact symbol, else its full compiler
    /// clones (`name.isra.0`, `name.constprop.1`, …), each entered by a
    /// call. Never a `.cold` part (jumped to) or a `.part` (the tail of a
    /// partly inlined function, whose head runs in its callers). Empty when
    /// it is absent (inlined, renamed, not in this version).
    pub(crate) fn entry_addresses(&self, name: &str) -> Vec<u64> {
        if let Some(a) = self.address(name) {
            return vec![a];
        }
        self.syms
            .iter()
            .filter(|(_, n)| {
                base_name(n) == name && n != name && !n.contains(".cold") && !n.contains(".part")
            })
            .map(|(a, _)| *a)
            .collect()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) const MAP: &str = "\
ffffffff81000000 T _stext
ffffffff81000100 t blk_mq_flush_plug_list
ffffffff81000200 T virtio_queue_rqs
ffffffff81000300 t foo.constprop.0
ffffffff81000400 D some_data
ffffffff81000500 T schedule_idle
ffffffff81000600 T _etext
";

    #[test]
    fn lookup() {
        let m = SymbolMap::parse(MAP, Path::new("System.map")).unwrap();
        assert_eq!(m.lookup(0xffffffff81000100), "blk_mq_flush_plug_list");
        assert_eq!(m.lookup(0xffffffff811001ff), OUTSIDE);
        assert_eq!(m.lookup(0xffffffff810001ff), "blk_mq_flush_plug_list");
        assert_eq!(m.lookup(0xffffffff81000450), "foo.constprop.0");
        assert_eq!(m.lookup(0xffffffff80000000), OUTSIDE);
    }

    /// A host's /proc/kallsyms: the kernel's text, then modules' symbols
    /// past `_etext`.
    pub(crate) const KALLSYMS: &str = "\
ffffffff81000000 T _stext
ffffffff81000100 T __schedule
ffffffff81000200 t do_idle
ffffffff81000300 T _etext
ffffffff81000400 d some_data
ffffffffc0001000 t kvm_arch_vcpu_ioctl_run\t[kvm]
ffffffffc0002000 t vcpu_enter_guest.constprop.0\t[kvm]
ffffffffc0010000 t svm_vcpu_run\t[kvm_amd]
ffffffffc0010800 t svm_vcpu_run.cold\t[kvm_amd]
ffffffffc0020000 t virtblk_done\t[virtio_blk]
ffffffffc0020100 d virtblk_data\t[virtio_blk]
";

    #[test]
    fn kallsyms_with_module_symbols() {
        let m = SymbolMap::parse(KALLSYMS, Path::new("kallsyms")).unwrap();
        assert_eq!(m.lookup(0xffffffff81000150), "__schedule");
        // Past _etext: a module's symbol names its module, the kernel's
        // last symbol does not stretch that far.
        assert_eq!(m.lookup(0xffffffffc0010010), "svm_vcpu_run [kvm_amd]");
        assert_eq!(m.lookup(0xffffffffc0010900), "svm_vcpu_run.cold [kvm_amd]");
        assert_eq!(m.lookup(0xffffffff81000350), OUTSIDE);
        assert_eq!(m.lookup(0xffffffffc0000fff), OUTSIDE);
        assert_eq!(m.lookup(0xffffffffc00200ff), "virtblk_done [virtio_blk]");
        // Past a module's data: its text has ended (a freed init section).
        assert_eq!(m.lookup(0xffffffffc0020100), OUTSIDE);
        assert_eq!(m.lookup(0xffffffffc0030000), OUTSIDE);
        assert_eq!(
            m.address("kvm_arch_vcpu_ioctl_run [kvm]"),
            Some(0xffffffffc0001000)
        );
        // A non-root read: every address 0. A malformed module column.
        let zero = "0000000000000000 T _stext\n0000000000000000 t svm_vcpu_run\t[kvm_amd]\n";
        let e = SymbolMap::parse(zero, Path::new("k"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("as root"), "{e}");
        assert!(SymbolMap::parse("ffffffff81000000 T f kvm\n", Path::new("k")).is_err());
        assert!(SymbolMap::parse("ffffffff81000000 T f [kvm] x\n", Path::new("k")).is_err());
    }
}
