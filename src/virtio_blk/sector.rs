//! Positions on the disk, in the two units a virtio-blk request mixes:
//! 512-byte sectors (the header's `sector`, discard and write-zeroes
//! ranges; always 512 bytes whatever the logical block size, virtio 1.2,
//! 5.2.6) and bytes (what storage is addressed in). Distinct types, so a
//! sector number is never used as a byte offset; the one conversion
//! between them checks for overflow, and an extent is checked against the
//! capacity without overflowing either.

/// Bytes per virtio-blk sector.
pub(crate) const SECTOR_SIZE: u64 = 512;

/// A disk position in 512-byte sectors, as the guest wrote it (any value:
/// range checks come with the conversion to bytes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Sector(u64);

impl Sector {
    pub(crate) const fn new(n: u64) -> Sector {
        Sector(n)
    }

    /// The sector number.
    pub(crate) const fn get(self) -> u64 {
        self.0
    }

    /// The byte offset of this sector; `None` when it does not fit in 64
    /// bits (a hostile sector number).
    pub(crate) const fn to_bytes(self) -> Option<ByteOffset> {
        match self.0.checked_mul(SECTOR_SIZE) {
            Some(b) => Some(ByteOffset(b)),
            None => None,
        }
    }
}

impl std::fmt::Display for Sector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sector {}", self.0)
    }
}

/// A disk position in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct ByteOffset(u64);

impl ByteOffset {
    /// The offset in bytes.
    pub(crate) const fn get(self) -> u64 {
        self.0
    }

    /// The sector this byte is in (rounding down).
    pub(crate) const fn sector(self) -> Sector {
        Sector(self.0 / SECTOR_SIZE)
    }

    /// Whether the offset is a multiple of `align` (false for 0).
    pub(crate) const fn is_aligned(self, align: u64) -> bool {
        align != 0 && self.0 % align == 0
    }

    /// Whether `len` bytes from here end at or before `capacity` bytes,
    /// without overflowing.
    pub(crate) const fn extent_within(self, len: u64, capacity: u64) -> bool {
        match self.0.checked_add(len) {
            Some(end) => end <= capacity,
            None => false,
        }
    }
}

/// The number of whole sectors in `len` bytes.
pub(crate) const fn sectors_in(len: u64) -> u64 {
    len / SECTOR_SIZE
}

#[cfg(test)]
impl ByteOffset {
    pub(crate) const fn new(b: u64) -> ByteOffset {
        ByteOffset(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sector_to_bytes_checks_overflow() {
        assert_eq!(Sector::new(0).to_bytes(), Some(ByteOffset::new(0)));
        assert_eq!(Sector::new(3).to_bytes(), Some(ByteOffset::new(1536)));
        let last = u64::MAX / SECTOR_SIZE;
        assert_eq!(
            Sector::new(last).to_bytes(),
            Some(ByteOffset::new(last * SECTOR_SIZE))
        );
        assert_eq!(Sector::new(last + 1).to_bytes(), None);
        assert_eq!(Sector::new(u64::MAX).to_bytes(), None);
        assert_eq!(ByteOffset::new(1537).sector(), Sector::new(3));
        assert_eq!(sectors_in(4096), 8);
    }

    #[test]
    fn extents_and_alignment() {
        let cap = 1 << 20;
        assert!(ByteOffset::new(0).extent_within(cap, cap));
        assert!(ByteOffset::new(cap).extent_within(0, cap));
        assert!(!ByteOffset::new(cap - 512).extent_within(1024, cap));
        assert!(!ByteOffset::new(u64::MAX - 10).extent_within(512, u64::MAX));
        assert!(ByteOffset::new(8192).is_aligned(4096));
        assert!(!ByteOffset::new(512).is_aligned(4096));
        assert!(!ByteOffset::new(0).is_aligned(0));
    }
}
