//! A snapshot of the guest's memory regions with a cheap translation from
//! guest addresses to host memory.
//!
//! vm-memory's bounds-checked accessors look the region up on every access
//! (`to_region_addr`, ~190 instructions a call, three or four calls per
//! ring operation: 576 instructions per request in callgrind). A
//! [`GuestMap`] lists the regions once, when the memory table changes, and
//! translates a guest range with a binary search over that short list.
//! It holds the memory table's `Arc`, so every host pointer it hands out
//! stays mapped as long as the map lives, even when the frontend replaces
//! the table meanwhile: a worker that still uses an old map reads and
//! writes the old mappings, never unmapped memory.

use std::sync::Arc;

use vm_memory::{
    GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion, VolatileSlice,
};

/// One region: guest physical start, length, host address.
#[derive(Debug, Clone, Copy)]
struct Region {
    start: u64,
    len: u64,
    host: *mut u8,
}

/// The guest's memory as a sorted list of regions, kept alive by the
/// memory table's `Arc`.
pub(crate) struct GuestMap {
    mem: Arc<GuestMemoryMmap>,
    /// Sorted by `start`, non-overlapping (vm-memory refuses overlaps).
    regions: Vec<Region>,
}

impl std::fmt::Debug for GuestMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.regions.iter().map(|r| (r.start, r.len)))
            .finish()
    }
}

// SAFETY: the raw host pointers point into mappings owned by `mem`, which
// is itself Send + Sync; a GuestMap only hands them out as VolatileSlices
// or for volatile/atomic accesses, as vm-memory does for the same memory.
unsafe impl Send for GuestMap {}
// SAFETY: as above; nothing in a GuestMap is mutated after construction.
unsafe impl Sync for GuestMap {}

impl GuestMap {
    /// List `mem`'s regions.
    pub(crate) fn new(mem: Arc<GuestMemoryMmap>) -> GuestMap {
        let mut regions: Vec<Region> = GuestMemoryBackend::iter(&*mem)
            .filter_map(|r| {
                let host = r.get_host_address(vm_memory::MemoryRegionAddress(0)).ok()?;
                Some(Region {
                    start: r.start_addr().0,
                    len: r.len(),
                    host,
                })
            })
            .filter(|r| r.len > 0)
            .collect();
        regions.sort_by_key(|r| r.start);
        GuestMap { mem, regions }
    }

    /// The memory table this map was made from.
    pub(crate) fn memory(&self) -> &GuestMemoryMmap {
        &self.mem
    }

    /// Whether this map was made from `mem` (the same table, not an equal
    /// one).
    pub(crate) fn is_of(&self, mem: &Arc<GuestMemoryMmap>) -> bool {
        Arc::ptr_eq(&self.mem, mem)
    }

    /// The host address of `len` bytes at guest address `gpa`, when they
    /// lie inside one region (`len` may be 0: then `gpa` must be inside a
    /// region).
    #[inline]
    pub(crate) fn host(&self, gpa: u64, len: u64) -> Option<*mut u8> {
        // The last region starting at or before gpa.
        let i = self.regions.partition_point(|r| r.start <= gpa);
        let r = self.regions.get(i.checked_sub(1)?)?;
        let off = gpa - r.start;
        if off >= r.len || len > r.len - off {
            return None;
        }
        // SAFETY: off < r.len, so the result is inside the region's
        // mapping (`add` within one allocation).
        Some(unsafe { r.host.add(off as usize) })
    }

    /// `len` bytes at `gpa` as one volatile slice, when they lie inside
    /// one region.
    #[inline]
    pub(crate) fn slice(&self, gpa: u64, len: usize) -> Option<VolatileSlice<'_>> {
        let p = self.host(gpa, len as u64)?;
        // SAFETY: `host` checked that [p, p + len) lies inside a region's
        // mapping, which `self.mem` keeps mapped for as long as the
        // returned slice borrows `self`; guest memory is only accessed
        // volatilely (the guest writes it concurrently).
        Some(unsafe { VolatileSlice::new(p, len) })
    }

    /// `len` bytes at `gpa` as volatile slices, one per region they cross
    /// (vm-memory's checked walk; the common one-region case is
    /// [`slice`](Self::slice)). `None` when any byte is outside guest
    /// memory.
    pub(crate) fn slices<'a>(
        &'a self,
        gpa: u64,
        len: usize,
        mut push: impl FnMut(VolatileSlice<'a>),
    ) -> bool {
        if let Some(s) = self.slice(gpa, len) {
            push(s);
            return true;
        }
        for s in GuestMemoryBackend::get_slices(&*self.mem, GuestAddress(gpa), len) {
            match s {
                Ok(s) => push(s),
                Err(_) => return false,
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::Bytes;

    fn map(regions: &[(u64, usize)]) -> GuestMap {
        let r: Vec<_> = regions.iter().map(|&(a, l)| (GuestAddress(a), l)).collect();
        GuestMap::new(Arc::new(GuestMemoryMmap::from_ranges(&r).unwrap()))
    }

    #[test]
    fn translates_inside_one_region_only() {
        let m = map(&[(0x1000, 0x1000), (0x4000, 0x2000)]);
        assert!(m.host(0x1000, 0x1000).is_some());
        assert!(m.host(0x1fff, 1).is_some());
        assert!(m.host(0x1fff, 2).is_none(), "ends past the region");
        assert!(m.host(0x2000, 0).is_none(), "between regions");
        assert!(m.host(0xfff, 1).is_none(), "below the first region");
        assert!(m.host(0x5fff, 1).is_some());
        assert!(m.host(0x6000, 1).is_none(), "past the last region");
        assert!(m.host(u64::MAX, 1).is_none());
        assert!(m.host(0x4000, u64::MAX).is_none());
    }

    #[test]
    fn slices_are_the_guest_bytes_and_cross_regions_only_when_adjacent() {
        let m = map(&[(0x1000, 0x1000), (0x2000, 0x1000)]);
        m.memory()
            .write_slice(&[1, 2, 3, 4], GuestAddress(0x1ffe))
            .unwrap();
        let s = m.slice(0x1ffe, 2).unwrap();
        let mut b = [0u8; 2];
        s.copy_to(&mut b[..]);
        assert_eq!(b, [1, 2]);
        assert!(m.slice(0x1ffe, 4).is_none(), "crosses into the next region");
        let mut got = Vec::new();
        assert!(m.slices(0x1ffe, 4, |s| {
            let mut v = vec![0u8; s.len()];
            s.copy_to(&mut v[..]);
            got.extend(v);
        }));
        assert_eq!(got, [1, 2, 3, 4]);
        assert!(!m.slices(0x2ffe, 4, |_| {}), "ends outside guest memory");
    }

    #[test]
    fn a_map_keeps_its_table_and_knows_it() {
        let mem = Arc::new(GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x1000)]).unwrap());
        let m = GuestMap::new(mem.clone());
        assert!(m.is_of(&mem));
        let other = Arc::new(GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x1000)]).unwrap());
        assert!(!m.is_of(&other));
        drop(mem);
        // Still mapped: the map holds the table.
        assert!(m.slice(0, 16).is_some());
    }
}
