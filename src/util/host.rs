//! What the host is: its name, kernel release, CPU count and CPU model,
//! read from /proc (each `None` when it cannot be read).

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
}
