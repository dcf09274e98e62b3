//! What kind of `/dev/kvm` this host has, read from sysfs, `/dev` and
//! `/proc/cpuinfo` before anything boots: hardware KVM (`kvm_intel`,
//! `kvm_amd`), PVM (`kvm_pvm`, a software hypervisor that runs only
//! PVM-enabled guest kernels), none (no module, or a CPU without VMX/SVM)
//! or one this user may not open; and, for the unusable kinds, what to use
//! instead, in one line.

use std::path::{Path, PathBuf};

/// The host's KVM, as far as the lab can use it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KvmHost {
    /// Hardware virtualization: `kvm_intel` or `kvm_amd` is loaded.
    Hardware { module: &'static str },
    /// `kvm_pvm`: its guests must be PVM-enabled kernels.
    Pvm,
    /// No `/dev/kvm`; whether the CPU has VMX or SVM, and whether it runs
    /// under a hypervisor itself (nested virtualization not offered).
    Absent { cpu_virt: bool, virtualized: bool },
    /// `/dev/kvm` exists and this user cannot open it.
    NoAccess { path: PathBuf },
}

impl KvmHost {
    /// The lab's guests can run under it (it may still fail a probe).
    pub(crate) fn usable(&self) -> bool {
        matches!(self, KvmHost::Hardware { .. })
    }

    /// What was found and, when unusable, what to use instead.
    pub(crate) fn explain(&self) -> String {
        const INSTEAD: &str = "use --accel nested (KVM inside an emulated host, with KVM's own \
                               exits) or --accel tcg";
        match self {
            KvmHost::Hardware { module } => format!("/dev/kvm is hardware KVM ({module})"),
            KvmHost::Pvm => format!(
                "/dev/kvm is PVM (kvm_pvm: a software hypervisor that runs only PVM-enabled \
                 guest kernels, not the lab's): {INSTEAD}"
            ),
            KvmHost::Absent { cpu_virt: true, .. } => format!(
                "no /dev/kvm although the CPU has VMX/SVM (modprobe kvm_intel or kvm_amd): \
                 {INSTEAD}"
            ),
            KvmHost::Absent {
                cpu_virt: false,
                virtualized: true,
            } => format!(
                "no /dev/kvm: this machine is itself a VM whose CPU offers no VMX/SVM (nested \
                 virtualization is off): {INSTEAD}"
            ),
            KvmHost::Absent { .. } => format!("no /dev/kvm and no VMX/SVM in the CPU: {INSTEAD}"),
            KvmHost::NoAccess { path } => format!(
                "{} exists but this user cannot open it (add the user to the kvm group: \
                 usermod -aG kvm USER, then log in again; or run as root), or {INSTEAD}",
                path.display()
            ),
        }
    }
}

/// Where the facts are read: `/` on a real host, a fixture tree in tests.
pub(crate) fn classify_under(root: &Path) -> KvmHost {
    let module = |m: &str| root.join("sys/module").join(m).exists();
    let hardware = ["kvm_intel", "kvm_amd"].into_iter().find(|m| module(m));
    if hardware.is_none() && module("kvm_pvm") {
        return KvmHost::Pvm;
    }
    let dev = root.join("dev/kvm");
    if dev.exists() && !can_open(&dev) {
        return KvmHost::NoAccess { path: dev };
    }
    if let Some(module) = hardware {
        return KvmHost::Hardware { module };
    }
    let flags = cpu_flags(&root.join("proc/cpuinfo"));
    KvmHost::Absent {
        cpu_virt: flags.iter().any(|f| f == "vmx" || f == "svm"),
        virtualized: flags.iter().any(|f| f == "hypervisor"),
    }
}

/// This host's KVM.
pub(crate) fn classify() -> KvmHost {
    classify_under(Path::new("/"))
}

/// Whether this user may open `path` for reading and writing.
fn can_open(path: &Path) -> bool {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .is_ok()
}

/// The first CPU's flags in `/proc/cpuinfo` (none when unreadable).
fn cpu_flags(cpuinfo: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(cpuinfo).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("flags").and_then(|r| r.split_once(':')))
        .map(|(_, f)| f.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake root with `modules` in sys/module, `/dev/kvm` as a plain file
    /// when `dev`, and a cpuinfo with `flags`.
    fn root(modules: &[&str], dev: bool, flags: &str) -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        for m in modules {
            std::fs::create_dir_all(t.path().join("sys/module").join(m)).unwrap();
        }
        std::fs::create_dir_all(t.path().join("dev")).unwrap();
        std::fs::create_dir_all(t.path().join("proc")).unwrap();
        if dev {
            std::fs::write(t.path().join("dev/kvm"), "").unwrap();
        }
        let cpuinfo = format!("processor\t: 0\nflags\t\t: fpu {flags} apic\n");
        std::fs::write(t.path().join("proc/cpuinfo"), cpuinfo).unwrap();
        t
    }

    #[test]
    fn each_kind_of_kvm_is_told_apart_with_what_to_use_instead() {
        let kind = |m: &[&str], dev, flags| classify_under(root(m, dev, flags).path());
        let hw = kind(&["kvm", "kvm_amd"], true, "svm");
        assert_eq!(hw, KvmHost::Hardware { module: "kvm_amd" });
        assert!(hw.usable());
        assert_eq!(kind(&["kvm", "kvm_pvm"], true, ""), KvmHost::Pvm);
        let pvm = KvmHost::Pvm.explain();
        assert!(
            pvm.contains("PVM") && pvm.contains("--accel nested"),
            "{pvm}"
        );
        let e = kind(&[], false, "vmx").explain();
        assert!(e.contains("modprobe"), "{e}");
        let e = kind(&[], false, "hypervisor").explain();
        assert!(e.contains("nested virtualization is off"), "{e}");
        assert!(!kind(&[], false, "").usable());
    }

    #[test]
    fn a_device_this_user_cannot_open_names_the_kvm_group() {
        let t = root(&["kvm", "kvm_intel"], true, "vmx");
        let dev = t.path().join("dev/kvm");
        // A directory opens for neither reading nor writing as a file.
        std::fs::remove_file(&dev).unwrap();
        std::fs::create_dir(&dev).unwrap();
        let k = classify_under(t.path());
        assert!(matches!(k, KvmHost::NoAccess { .. }), "{k:?}");
        assert!(k.explain().contains("kvm group"), "{}", k.explain());
    }

    #[test]
    fn this_host_is_classified_from_its_own_sysfs() {
        // On the development machines and CI /dev/kvm is kvm_pvm's.
        let k = classify();
        if Path::new("/sys/module/kvm_pvm").exists() {
            assert_eq!(k, KvmHost::Pvm);
        } else if Path::new("/sys/module/kvm_amd").exists()
            || Path::new("/sys/module/kvm_intel").exists()
        {
            assert!(
                matches!(k, KvmHost::Hardware { .. } | KvmHost::NoAccess { .. }),
                "{k:?}"
            );
        } else {
            assert!(
                matches!(k, KvmHost::Absent { .. } | KvmHost::NoAccess { .. }),
                "{k:?}"
            );
        }
    }
}
