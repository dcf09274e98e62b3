//! The QEMU options that attach served disks to a guest.

use crate::device::config::DiskConfig;

/// QEMU options for a guest using `disks`, one option per line, ready to
/// paste into a command line. `memory` is the guest RAM size as QEMU writes
/// it (`1G`); vhost-user needs it shared.
pub fn qemu_args(disks: &[DiskConfig], memory: &str) -> Vec<String> {
    let mut out = vec![
        format!("-object memory-backend-memfd,id=mem,size={memory},share=on"),
        "-machine memory-backend=mem".to_string(),
    ];
    for (i, d) in disks.iter().enumerate() {
        out.push(format!(
            "-chardev socket,id=blklab{i},path={}",
            d.socket.display()
        ));
        out.push(format!(
            "-device vhost-user-blk-pci,chardev=blklab{i},num-queues={},queue-size={}",
            d.num_queues, d.queue_size
        ));
    }
    out
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
        assert_eq!(a[0], "-object memory-backend-memfd,id=mem,size=2G,share=on");
        assert_eq!(a[2], "-chardev socket,id=blklab0,path=/tmp/vd.sock-0");
        assert_eq!(
            a[3],
            "-device vhost-user-blk-pci,chardev=blklab0,num-queues=4,queue-size=256"
        );
        assert_eq!(a[4], "-chardev socket,id=blklab1,path=/tmp/vd.sock-1");
    }
}
