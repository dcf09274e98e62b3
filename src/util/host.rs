//! What the host is: its name, kernel release, CPU count, online and
//! usable cores and CPU model, read from /proc and /sys (each `None` when
//! it cannot be read).

fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

/// The host's name.
pub(crate) fn hostname() -> Option<String> {
    read_trimmed("/proc/sys/kernel/hostname")
}

/// The running kernel's release (`uname -r`).
pub(crate) fn kernel_release() -> Option<String> {
    read_trimmed("/proc/sys/kernel/osrelease")
}

/// The CPUs this process may run on.
pub(crate) fn cpus() -> Option<usize> {
    std::thread::available_parallelism().map(|n| n.get()).ok()
}

/// The host's online CPUs (/sys/devices/system/cpu/online), whatever this
/// process may run on.
pub(crate) fn cores_online() -> Option<u32> {
    cpu_list_count(&read_trimmed("/sys/devices/system/cpu/online")?)
}

/// The CPUs this process (and so a QEMU it starts, which inherits its
/// affinity) may run on: its sched_getaffinity(2) mask, not cgroup quotas.
pub(crate) fn cores_usable() -> Option<u32> {
    let n = crate::util::affinity::usable_count().ok()?;
    u32::try_from(n).ok().filter(|&n| n > 0)
}

/// How many CPUs a kernel CPU list names (`0-3,8,10-11`: 7).
fn cpu_list_count(list: &str) -> Option<u32> {
    let mut n = 0u32;
    for part in list.trim().split(',') {
        let (lo, hi) = match part.split_once('-') {
            Some((lo, hi)) => (lo.parse::<u32>().ok()?, hi.parse::<u32>().ok()?),
            None => {
                let c = part.parse::<u32>().ok()?;
                (c, c)
            }
        };
        n = n.checked_add(hi.checked_sub(lo)?.checked_add(1)?)?;
    }
    Some(n)
}

/// The first CPU's model name from /proc/cpuinfo.
pub(crate) fn cpu_model() -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    cpu_model_of(&text)
}

fn cpu_model_of(cpuinfo: &str) -> Option<String> {
    cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_string())
}

#[cfg(test)]
mod tests {
    #[test]
    fn cpu_model_is_the_first_model_name() {
        let text =
            "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nprocessor\t: 1\nmodel name\t: other\n";
        assert_eq!(super::cpu_model_of(text).as_deref(), Some("AMD EPYC 7B13"));
        assert_eq!(super::cpu_model_of("processor\t: 0\n"), None);
    }

    #[test]
    fn a_cpu_list_counts_its_ranges_and_single_cpus() {
        assert_eq!(super::cpu_list_count("0-1\n"), Some(2));
        assert_eq!(super::cpu_list_count("0"), Some(1));
        assert_eq!(super::cpu_list_count("0-3,8,10-11"), Some(7));
        for bad in ["", "x", "3-1", "0-", "0,,1"] {
            assert_eq!(super::cpu_list_count(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn this_host_has_at_least_one_usable_core_and_no_more_than_online() {
        let usable = super::cores_usable().unwrap();
        assert!(usable >= 1);
        if let Some(online) = super::cores_online() {
            assert!(usable <= online, "{usable} usable of {online} online");
        }
    }
}
