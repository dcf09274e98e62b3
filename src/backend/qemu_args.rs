//! The QEMU options that attach served disks to a guest: the one builder
//! behind `blklab serve --print-qemu-args` (and so `images/demo.sh`), the
//! lab's guests (`lab::guest::qemu`) and the QEMU tests.
//!
//! A vhost-user backend maps the guest's RAM, so the RAM is a memfd shared
//! with it (`-object memory-backend-memfd,…,share=on`, made the machine's
//! RAM by `-machine memory-backend=mem`), and each disk is a
//! `-chardev socket` on the backend's socket plus a `-device
//! vhost-user-blk-pci` on that chardev.

use std::path::PathBuf;

use serde::Serialize;

use crate::device::config::DiskConfig;

/// One vhost-user-blk disk on a QEMU command line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QemuDisk {
    /// The backend's vhost-user socket.
    pub socket: PathBuf,
    pub num_queues: u16,
    /// Entries per virtqueue (QEMU's own default is 128).
    pub queue_size: u16,
}

impl From<&DiskConfig> for QemuDisk {
    fn from(d: &DiskConfig) -> QemuDisk {
        QemuDisk {
            socket: d.socket.clone(),
            num_queues: d.num_queues,
            queue_size: d.queue_size,
        }
    }
}

/// A value inside a QEMU `key=value,…` option: commas doubled.
fn opt_value(v: &str) -> String {
    v.replace(',', ",,")
}

/// What backs a guest's RAM shared with its backends.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub(crate) enum GuestRam {
    /// A memfd of ordinary pages.
    #[default]
    Memfd,
    /// A memfd of 2 MiB huge pages (`hugetlb=on,hugetlbsize=2M`): the RAM
    /// comes from the machine's huge-page pool only (the nested lab's host
    /// keeps that pool on a NUMA node of its own).
    HugeMemfd,
}

/// Guest RAM of `memory` (QEMU size syntax: `1G`, `1024M`) as a memfd
/// shared with the backends, as an argument vector (each option and its
/// value separate): `-object
/// memory-backend-memfd,id=mem,size=MEMORY,share=on[,hugetlb=on,hugetlbsize=2M]
/// -machine [MACHINE,]memory-backend=mem`. `machine` names the machine type
/// (`q35`) in the same `-machine` option; `None` leaves it to another
/// `-machine` option of the caller's (QEMU merges them).
pub(crate) fn shared_memory(memory: &str, machine: Option<&str>, ram: GuestRam) -> Vec<String> {
    let huge = match ram {
        GuestRam::Memfd => "",
        GuestRam::HugeMemfd => ",hugetlb=on,hugetlbsize=2M",
    };
    vec![
        "-object".into(),
        format!("memory-backend-memfd,id=mem,size={memory},share=on{huge}"),
        "-machine".into(),
        match machine {
            Some(m) => format!("{m},memory-backend=mem"),
            None => "memory-backend=mem".into(),
        },
    ]
}

/// The `-chardev socket,id=blklabI,path=SOCKET -device
/// vhost-user-blk-pci,chardev=blklabI,id=blklab-diskI,num-queues=N,queue-size=S`
/// pair of each disk, in order (the guest's vda, vdb, …), as an argument
/// vector. The device id names the disk in QMP (`query-pci`).
pub(crate) fn disks(disks: &[QemuDisk]) -> Vec<String> {
    let mut out = Vec::with_capacity(4 * disks.len());
    for (i, d) in disks.iter().enumerate() {
        out.push("-chardev".into());
        out.push(format!(
            "socket,id=blklab{i},path={}",
            opt_value(&d.socket.display().to_string())
        ));
        out.push("-device".into());
        out.push(format!(
            "vhost-user-blk-pci,chardev=blklab{i},id=blklab-disk{i},num-queues={},queue-size={}",
            d.num_queues, d.queue_size
        ));
    }
    out
}

/// [`shared_memory`] of ordinary pages and then [`disks`]: every option a guest needs to use
/// `disks`, as an argument vector.
pub fn guest_args(memory: &str, machine: Option<&str>, disks: &[QemuDisk]) -> Vec<String> {
    guest_args_on(GuestRam::Memfd, memory, machine, disks)
}

/// [`guest_args`] with the RAM backed as `ram` says.
pub(crate) fn guest_args_on(
    ram: GuestRam,
    memory: &str,
    machine: Option<&str>,
    disks: &[QemuDisk],
) -> Vec<String> {
    let mut out = shared_memory(memory, machine, ram);
    out.extend(self::disks(disks));
    out
}

/// `blklab serve --print-qemu-args`: [`guest_args`] for the served disks,
/// one `OPTION VALUE` line per option, ready to paste into a command line
/// that names its own machine type.
pub fn qemu_args(configs: &[DiskConfig], memory: &str) -> Vec<String> {
    let disks: Vec<QemuDisk> = configs.iter().map(QemuDisk::from).collect();
    guest_args(memory, None, &disks)
        .chunks(2)
        .map(|pair| pair.join(" "))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::config::DiskArgs;

    #[test]
    fn two_disks() {
        let d = DiskArgs::parse_for_test(&[
            "--socket",
            "/tmp/vd.sock",
            "--disk",
            "mem",
            "--size",
            "1G",
            "--count",
            "2",
            "--num-queues",
            "4",
        ])
        .to_configs()
        .unwrap();
        let a = qemu_args(&d, "2G");
        assert_eq!(
            a,
            [
                "-object memory-backend-memfd,id=mem,size=2G,share=on",
                "-machine memory-backend=mem",
                "-chardev socket,id=blklab0,path=/tmp/vd.sock-0",
                "-device vhost-user-blk-pci,chardev=blklab0,id=blklab-disk0,num-queues=4,queue-size=256",
                "-chardev socket,id=blklab1,path=/tmp/vd.sock-1",
                "-device vhost-user-blk-pci,chardev=blklab1,id=blklab-disk1,num-queues=4,queue-size=256",
            ]
        );
    }

    #[test]
    fn argument_vector_with_a_machine_type_and_a_comma_in_a_path() {
        let disk = QemuDisk {
            socket: "/tmp/a,b/vd.sock".into(),
            num_queues: 2,
            queue_size: 128,
        };
        assert_eq!(
            guest_args("1024M", Some("q35"), &[disk]),
            [
                "-object",
                "memory-backend-memfd,id=mem,size=1024M,share=on",
                "-machine",
                "q35,memory-backend=mem",
                "-chardev",
                "socket,id=blklab0,path=/tmp/a,,b/vd.sock",
                "-device",
                "vhost-user-blk-pci,chardev=blklab0,id=blklab-disk0,num-queues=2,queue-size=128",
            ]
        );
        assert!(disks(&[]).is_empty());
    }
}
