//! The virtio-blk device configuration space (virtio 1.2, 5.2.4).
//!
//! Layout (little endian):
//! ```text
//!  0 capacity u64            (512-byte sectors)
//!  8 size_max u32           12 seg_max u32
//! 16 geometry {u16 cylinders, u8 heads, u8 sectors}
//! 20 blk_size u32
//! 24 topology {u8 physical_block_exp, u8 alignment_offset, u16 min_io_size, u32 opt_io_size}
//! 32 writeback u8           33 unused
//! 34 num_queues u16
//! 36 max_discard_sectors u32  40 max_discard_seg u32  44 discard_sector_alignment u32
//! 48 max_write_zeroes_sectors u32  52 max_write_zeroes_seg u32
//! 56 write_zeroes_may_unmap u8  57..60 unused
//! 60 max_secure_erase_sectors u32 64 max_secure_erase_seg u32 68 secure_erase_sector_alignment u32
//! 72 zoned {...} (24 bytes)
//! ```
//! Frontends read the whole structure or single fields through GET_CONFIG;
//! only `writeback` is writable (with CONFIG_WCE).

use crate::device::config::DiskConfig;
use crate::virtio_blk::features::BlkFeature;

/// Size of the structure we expose (through the zoned characteristics).
pub(crate) const CONFIG_SPACE_SIZE: usize = 96;
/// Offset of the `writeback` byte.
pub(crate) const WRITEBACK_OFFSET: usize = 32;

/// Build the configuration space for a disk. `writeback` is the current
/// cache mode (1 = write-back, 0 = write-through).
pub(crate) fn build(cfg: &DiskConfig, writeback: bool) -> [u8; CONFIG_SPACE_SIZE] {
    let mut b = [0u8; CONFIG_SPACE_SIZE];
    let put32 = |b: &mut [u8; CONFIG_SPACE_SIZE], off: usize, v: u32| {
        b[off..off + 4].copy_from_slice(&v.to_le_bytes())
    };
    b[0..8].copy_from_slice(&(cfg.size / 512).to_le_bytes());
    put32(&mut b, 8, cfg.size_max);
    put32(&mut b, 12, cfg.seg_max());
    put32(&mut b, 20, cfg.block_size);
    // Topology: physical block = logical block, no misalignment,
    // minimum I/O one logical block, no optimal I/O size.
    b[24] = 0;
    b[25] = 0;
    b[26..28].copy_from_slice(&1u16.to_le_bytes());
    put32(&mut b, 28, 0);
    b[WRITEBACK_OFFSET] = u8::from(writeback);
    b[34..36].copy_from_slice(&cfg.num_queues.to_le_bytes());
    let align = cfg.block_size / 512;
    put32(&mut b, 36, cfg.max_discard_sectors);
    put32(&mut b, 40, cfg.max_discard_seg);
    put32(&mut b, 44, align);
    put32(&mut b, 48, cfg.max_write_zeroes_sectors);
    put32(&mut b, 52, cfg.max_write_zeroes_seg);
    b[56] = u8::from(cfg.features.has(BlkFeature::Discard));
    b
}

/// Return `size` bytes at `offset` of the configuration space, zero-padded
/// past our structure; `None` when the range is invalid (vhost-user allows
/// at most 256 bytes of config space).
pub(crate) fn read(space: &[u8; CONFIG_SPACE_SIZE], offset: u32, size: u32) -> Option<Vec<u8>> {
    let start = offset as usize;
    let end = start.checked_add(size as usize)?;
    if end > 256 {
        return None;
    }
    let mut out = vec![0u8; size as usize];
    if start < CONFIG_SPACE_SIZE {
        let n = CONFIG_SPACE_SIZE.min(end) - start;
        out[..n].copy_from_slice(&space[start..start + n]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::config::DiskArgs;

    fn cfg(extra: &[&str]) -> DiskConfig {
        let mut args = vec!["--socket", "/tmp/x.sock", "--disk", "mem", "--size", "4G"];
        args.extend_from_slice(extra);
        DiskArgs::parse_for_test(&args)
            .to_configs()
            .unwrap()
            .remove(0)
    }

    fn u32at(b: &[u8], off: usize) -> u32 {
        u32::from_le_bytes(b[off..off + 4].try_into().unwrap())
    }

    #[test]
    fn layout() {
        let c = cfg(&["--num-queues", "4", "--queue-size", "256"]);
        let b = build(&c, true);
        assert_eq!(
            u64::from_le_bytes(b[0..8].try_into().unwrap()),
            (4u64 << 30) / 512
        );
        assert_eq!(u32at(&b, 12), 254, "seg_max = queue size - 2");
        assert_eq!(u32at(&b, 20), 512);
        assert_eq!(u16::from_le_bytes(b[34..36].try_into().unwrap()), 4);
        assert_eq!(b[32], 1);
        assert!(u32at(&b, 36) > 0 && u32at(&b, 40) > 0);
        assert!(u32at(&b, 48) > 0 && u32at(&b, 52) > 0);
        assert_eq!(b[56], 1);
        assert_eq!(u16::from_le_bytes(b[26..28].try_into().unwrap()), 1);
    }

    #[test]
    fn block_size_4k() {
        let c = cfg(&["--block-size", "4096"]);
        let b = build(&c, false);
        assert_eq!(u32at(&b, 20), 4096);
        assert_eq!(u32at(&b, 44), 8, "discard alignment in sectors");
        assert_eq!(b[32], 0);
    }

    #[test]
    fn partial_reads() {
        let c = cfg(&[]);
        let b = build(&c, true);
        assert_eq!(read(&b, 0, 8).unwrap(), b[0..8].to_vec());
        assert_eq!(read(&b, 34, 2).unwrap(), b[34..36].to_vec());
        let tail = read(&b, 90, 20).unwrap();
        assert_eq!(tail.len(), 20);
        assert_eq!(&tail[..6], &b[90..96]);
        assert!(tail[6..].iter().all(|x| *x == 0));
        assert!(read(&b, 250, 10).is_none());
        assert!(read(&b, u32::MAX, 2).is_none());
    }
}
