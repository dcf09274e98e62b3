//! How many of a guest's vCPUs could run at once: the host's cores as the
//! lab saw them (QEMU inherits the lab's CPU affinity), how QEMU runs the
//! vCPUs, and the guest's vCPU count. Contention between vCPUs (shared
//! tags, locks) shows only when they run in parallel, so a record says
//! whether they could ([`Parallelism`]), run.json and a record's
//! `run_conditions` the run-wide part ([`HostParallelism`]).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::util::host;

/// Where the warning sends a reader.
const SEE: &str = "see docs/user-guide.md#host-parallelism";

/// `core` or `cores`, for `n` of them.
fn cores(n: u32) -> &'static str {
    if n == 1 {
        "core"
    } else {
        "cores"
    }
}

/// How QEMU runs a guest's vCPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum VcpuThreads {
    /// A host thread per vCPU: KVM and multi-threaded TCG (`-accel
    /// tcg,thread=multi`). Under `--accel nested` the guest's vCPUs run on
    /// the emulated host's (one more than the guest's), each a thread of
    /// the outer multi-threaded TCG, so the same holds.
    PerVcpu,
    /// Single-threaded TCG (`--deterministic`, `-accel tcg,thread=single`):
    /// one vCPU at a time.
    Single,
}

/// The run-wide part: the host's cores as the lab saw them and how QEMU
/// runs the vCPUs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct HostParallelism {
    /// The host's online CPUs (/sys/devices/system/cpu/online).
    #[serde(default)]
    pub(crate) cores_online: Option<u32>,
    /// The CPUs the lab, and so QEMU, may run on (sched_getaffinity(2)).
    #[serde(default)]
    pub(crate) cores_usable: Option<u32>,
    /// The first CPU's model name (/proc/cpuinfo).
    #[serde(default)]
    pub(crate) cpu_model: Option<String>,
    pub(crate) vcpu_threads: VcpuThreads,
}

impl HostParallelism {
    /// This host's, as the calling process sees it, with `vcpu_threads`.
    pub(crate) fn of_this_host(vcpu_threads: VcpuThreads) -> HostParallelism {
        HostParallelism {
            cores_online: host::cores_online(),
            cores_usable: host::cores_usable(),
            cpu_model: host::cpu_model(),
            vcpu_threads,
        }
    }

    /// How many of `vcpus` vCPUs can run at once: the fewer of the vCPUs
    /// and the usable cores, one under single-threaded TCG (`None`: the
    /// usable cores are unknown).
    pub(crate) fn vcpus_at_once(&self, vcpus: u32) -> Option<u32> {
        match self.vcpu_threads {
            VcpuThreads::Single => Some(vcpus.min(1)),
            VcpuThreads::PerVcpu => self.cores_usable.map(|c| c.min(vcpus)),
        }
    }

    /// A guest of `vcpus` vCPUs on this host.
    pub(crate) fn with_vcpus(&self, vcpus: u32) -> Parallelism {
        Parallelism {
            host_cores_online: self.cores_online,
            host_cores_usable: self.cores_usable,
            cpu_model: self.cpu_model.clone(),
            vcpu_threads: self.vcpu_threads,
            vcpus,
            vcpus_at_once: self.vcpus_at_once(vcpus),
        }
    }

    /// The host in a few words, e.g. `2 usable of 16 online cores (AMD
    /// EPYC), multi-threaded`.
    pub(crate) fn describe(&self) -> String {
        let n = |c: Option<u32>| c.map_or("?".to_string(), |c| c.to_string());
        let model = self
            .cpu_model
            .as_ref()
            .map(|m| format!(" ({m})"))
            .unwrap_or_default();
        let threads = match self.vcpu_threads {
            VcpuThreads::PerVcpu => "a thread per vCPU",
            VcpuThreads::Single => "single-threaded TCG",
        };
        format!(
            "{} usable of {} online cores{model}, {threads}",
            n(self.cores_usable),
            n(self.cores_online)
        )
    }
}

/// A record's: the host's cores, the guest's vCPUs, and how many of them
/// could run at once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Parallelism {
    /// The host's online CPUs (/sys/devices/system/cpu/online).
    #[serde(default)]
    pub(crate) host_cores_online: Option<u32>,
    /// The CPUs the lab, and so QEMU, could run on (sched_getaffinity(2)).
    #[serde(default)]
    pub(crate) host_cores_usable: Option<u32>,
    #[serde(default)]
    pub(crate) cpu_model: Option<String>,
    pub(crate) vcpu_threads: VcpuThreads,
    /// The guest's vCPUs.
    pub(crate) vcpus: u32,
    /// How many could run at once: min(`vcpus`, `host_cores_usable`), 1
    /// under single-threaded TCG (null: the usable cores are unknown).
    #[serde(default)]
    pub(crate) vcpus_at_once: Option<u32>,
}

impl Parallelism {
    /// One line when fewer vCPUs could run at once than the guest has:
    /// contention between them cannot show.
    pub(crate) fn warning(&self) -> Option<String> {
        let at_once = self.vcpus_at_once?;
        if at_once >= self.vcpus {
            return None;
        }
        let cannot = "so contention between vCPUs (shared tags, lock contention) cannot show";
        Some(match self.vcpu_threads {
            VcpuThreads::Single => format!(
                "{} vCPUs under single-threaded TCG (--deterministic): one runs at a time, \
                 {cannot}; {SEE}",
                self.vcpus
            ),
            VcpuThreads::PerVcpu => {
                let n = self.host_cores_usable.unwrap_or(at_once);
                format!(
                    "{} vCPUs on {n} usable host {}: at most {at_once} {} at once, {cannot}; {SEE}",
                    self.vcpus,
                    cores(n),
                    if at_once == 1 { "runs" } else { "run" },
                )
            }
        })
    }

    /// The vCPUs at once as a difference shows them, e.g. `2 (16 vCPUs, 2
    /// usable host cores)`.
    pub(crate) fn describe(&self) -> String {
        let at_once = self
            .vcpus_at_once
            .map_or("(not recorded)".to_string(), |n| n.to_string());
        let how = match (self.vcpu_threads, self.host_cores_usable) {
            (VcpuThreads::Single, _) => "single-threaded TCG".to_string(),
            (VcpuThreads::PerVcpu, Some(c)) => format!("{c} usable host {}", cores(c)),
            (VcpuThreads::PerVcpu, None) => "usable host cores unknown".to_string(),
        };
        format!("{at_once} ({} vCPUs, {how})", self.vcpus)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(usable: Option<u32>, threads: VcpuThreads) -> HostParallelism {
        HostParallelism {
            cores_online: Some(16),
            cores_usable: usable,
            cpu_model: Some("AMD EPYC".into()),
            vcpu_threads: threads,
        }
    }

    #[test]
    fn vcpus_at_once_are_the_fewer_of_vcpus_and_cores_and_one_single_threaded() {
        let multi = host(Some(2), VcpuThreads::PerVcpu);
        assert_eq!(multi.vcpus_at_once(16), Some(2));
        assert_eq!(multi.vcpus_at_once(2), Some(2));
        assert_eq!(multi.vcpus_at_once(1), Some(1));
        assert_eq!(
            host(Some(16), VcpuThreads::PerVcpu).vcpus_at_once(8),
            Some(8)
        );
        let single = host(Some(16), VcpuThreads::Single);
        assert_eq!(single.vcpus_at_once(16), Some(1));
        assert_eq!(single.vcpus_at_once(1), Some(1));
        assert_eq!(host(None, VcpuThreads::PerVcpu).vcpus_at_once(4), None);
        // Unknown cores do not matter to one thread.
        assert_eq!(host(None, VcpuThreads::Single).vcpus_at_once(4), Some(1));
        let p = multi.with_vcpus(16);
        assert_eq!(
            (
                p.vcpus,
                p.vcpus_at_once,
                p.host_cores_usable,
                p.host_cores_online
            ),
            (16, Some(2), Some(2), Some(16))
        );
    }

    #[test]
    fn the_warning_names_the_vcpus_the_cores_and_why() {
        let w = host(Some(2), VcpuThreads::PerVcpu)
            .with_vcpus(16)
            .warning()
            .unwrap();
        assert_eq!(
            w,
            "16 vCPUs on 2 usable host cores: at most 2 run at once, so contention between \
             vCPUs (shared tags, lock contention) cannot show; \
             see docs/user-guide.md#host-parallelism"
        );
        let one = host(Some(1), VcpuThreads::PerVcpu)
            .with_vcpus(4)
            .warning()
            .unwrap();
        assert!(
            one.starts_with("4 vCPUs on 1 usable host core: at most 1 runs at once, "),
            "{one}"
        );
        let single = host(Some(16), VcpuThreads::Single)
            .with_vcpus(4)
            .warning()
            .unwrap();
        assert!(
            single.starts_with(
                "4 vCPUs under single-threaded TCG (--deterministic): one runs at a time, so \
                 contention"
            ),
            "{single}"
        );
        // Every vCPU can run: nothing to say; unknown cores: nothing either.
        for (usable, vcpus) in [(Some(2), 2), (Some(16), 8), (None, 16)] {
            let p = host(usable, VcpuThreads::PerVcpu).with_vcpus(vcpus);
            assert_eq!(p.warning(), None, "{usable:?} {vcpus}");
        }
        assert_eq!(
            host(Some(2), VcpuThreads::Single).with_vcpus(1).warning(),
            None
        );
    }

    #[test]
    fn described_with_vcpus_and_cores() {
        let h = host(Some(2), VcpuThreads::PerVcpu);
        assert_eq!(
            h.with_vcpus(16).describe(),
            "2 (16 vCPUs, 2 usable host cores)"
        );
        assert_eq!(
            h.describe(),
            "2 usable of 16 online cores (AMD EPYC), a thread per vCPU"
        );
        assert_eq!(
            host(Some(1), VcpuThreads::PerVcpu).with_vcpus(2).describe(),
            "1 (2 vCPUs, 1 usable host core)"
        );
        assert_eq!(
            host(Some(2), VcpuThreads::Single).with_vcpus(4).describe(),
            "1 (4 vCPUs, single-threaded TCG)"
        );
    }

    #[test]
    fn a_record_without_optional_fields_reads() {
        let p: Parallelism =
            serde_json::from_value(serde_json::json!({"vcpu_threads": "per_vcpu", "vcpus": 2}))
                .unwrap();
        assert_eq!(p.vcpus_at_once, None);
        assert_eq!(p.warning(), None);
    }
}
