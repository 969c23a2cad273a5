//! Copy-on-write: a write fault on a present, read-only entry of a
//! writable VMA copies the page, reuses it when no one else maps it, or
//! writes a shared object's page in place (Linux's `do_wp_page`). A
//! forced write (`mm/forced.rs`) does the same in a private VMA that is
//! not writable, and the entry it leaves stays read-only.
//!
//! # Locking
//!
//! Called by the fault path with the VMA read-locked or the mmap_lock read
//! side held; the decision is made under the PTE table's lock while
//! holding a frame reference. Order: [`crate::mm`].

use super::anon_vma::anon_vma_prepare;
use super::fault::{alloc_frame, Step};
use crate::error::FaultError;
use crate::mm::{soft_dirty, AddressSpace};
use crate::pt::{Pte, PteFlags};
use crate::stats::Event;
use crate::vma::{VmFlags, Vma};

/// A write to a present, read-only entry of a writable VMA (or, forced, of
/// a private one that is not: the entry stays read-only). Returns false
/// if the entry changed under us (look again).
pub(super) fn wp_fault(
    mm: &AddressSpace,
    vma: &Vma,
    page: u64,
    pte: Pte,
    vma_locked: bool,
    g: &crate::reclaim::Guard,
) -> Result<bool, Step> {
    // A write-protect bit left by a registration that is gone goes with
    // the protection. A forced write (`mm/forced.rs`) breaks copy-on-write
    // in a VMA that is not writable: its copy stays read-only.
    let write = PteFlags::from(vma.flags()) & PteFlags::WRITE;
    let writable = (pte.flags() - PteFlags::UFFD_WP) | write | soft_dirty::WRITTEN;
    // A shared object's page is written in place; a private mapping of an
    // object copies it below like any page it does not own.
    if vma.has_shmem() && vma.flags().contains(VmFlags::SHARED) {
        return Ok(mm
            .pt
            .update(page, g, |cur| {
                (cur == pte).then(|| Pte::new(pte.pfn(), writable))
            })
            .is_some());
    }
    anon_vma_prepare(mm, vma, vma_locked).map_err(Step::Retry)?;
    let old = pte.pfn();
    if !old.is_zero_page() {
        // One look under the PTE lock, with the entry unchanged. If our
        // entry holds the frame's only reference, write in place (no one
        // can add another: every sharer — fork, a shared object —
        // excludes this fault). Else take a reference for the copy, as
        // Linux holds a folio reference: without it a DONTNEED or munmap
        // could zap the entry, flush and free the frame, and a fault
        // elsewhere could zero it while we read it.
        let mut referenced = false;
        let reused = mm
            .pt
            .update(page, g, |cur| {
                if cur != pte {
                    return None;
                }
                if mm.frames.refcount(old) == 1 {
                    return Some(Pte::new(old, writable));
                }
                mm.frames.get(old);
                referenced = true;
                None
            })
            .is_some();
        if reused {
            mm.stats.inc(Event::cow_reuses);
            return Ok(true);
        }
        if !referenced {
            return Ok(false); // the entry changed: look again
        }
    }
    let new = if old.is_zero_page() {
        alloc_frame(mm)
    } else {
        let n = mm.frames.alloc_uninit();
        if let Some(n) = n {
            mm.frames.copy(n, old);
        }
        mm.frames.put(old); // our reference, not the entry's
        n.ok_or(Step::Fail(FaultError::OutOfMemory))
    }?;
    let ok = mm
        .pt
        .update(page, g, |cur| (cur == pte).then(|| Pte::new(new, writable)))
        .is_some();
    if !ok {
        mm.frames.put(new);
        return Ok(false);
    }
    if !old.is_zero_page() {
        mm.stats.inc(Event::cow_copies);
        // The old translation must be gone everywhere before the entry's
        // frame reference is dropped.
        let mut gather = crate::tlb::Gather::new(&mm.tlb, &mm.stats, &mm.frames);
        gather.add_page(page);
        gather.free_frame(old);
        gather.flush();
    }
    Ok(true)
}
