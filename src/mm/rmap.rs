//! What maps where: the frame behind an address, and the reverse map of an
//! anonymous page (every address space and address of its anon_vma family
//! where the page or a copy-on-write copy of it may be mapped).
//!
//! # Locking
//!
//! `translate` is a lock-free page-table lookup under the page table's
//! epoch. `rmap_walk` holds the mmap_lock read side (so the VMA stays) and
//! then the family's reverse-map lock; the order is in [`crate::mm`].

use super::AddressSpace;
use crate::addr::page_align_down;
use crate::phys::Pfn;
use crate::vma::RmapHit;

impl AddressSpace {
    /// This address space's identity, as [`RmapHit::mm_id`] reports it.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The frame mapped at `addr` now, if a page is present there and is
    /// not the shared zero page.
    pub fn translate(&self, addr: u64) -> Option<Pfn> {
        if addr >= self.cfg.task_size {
            return None;
        }
        let g = self.pt.pin();
        self.pt.lookup(page_align_down(addr), &g).frame()
    }

    /// The reverse map of the anonymous page at `addr`: every (address
    /// space, address) of its anon_vma family whose VMA covers the same
    /// page index — where this page, or a copy-on-write copy of it, may be
    /// mapped — sorted. Empty if `addr` is unmapped, shared, or in a VMA
    /// with no anon_vma yet. Takes the family's lock (counted).
    ///
    /// The walk tolerates a concurrent end-only move of any VMA in the
    /// family (brk): see `vma::anon`.
    pub fn rmap_walk(&self, addr: u64) -> Vec<RmapHit> {
        let _st = self.mmap_lock.read();
        let g = self.tree.pin();
        let Some((_, v)) = self.tree.find(addr, &g) else {
            return Vec::new();
        };
        if v.has_shmem() {
            return Vec::new();
        }
        let Some(anon) = v.anon_vma_arc() else {
            return Vec::new();
        };
        let pgoff = v.pgoff_of(page_align_down(addr));
        let idx = anon.root().lock(Some(&self.stats));
        let mut hits = idx.walk(pgoff);
        drop(idx);
        hits.sort();
        hits
    }
}
