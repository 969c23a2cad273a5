//! Pinning a guest page for a device (Linux's `FOLL_PIN | FOLL_LONGTERM`):
//! the frame gains a pin, so it is neither freed nor reused while a
//! device may reach it, and only a page its mapping owns is pinned.
//!
//! Under the mmap_lock read side (which fork and the soft-dirty reset
//! exclude) and then the page's PTE lock (which every change of the entry
//! takes), [`pin_page`] makes sure that:
//!
//! - in a private mapping the frame is the mapping's own (its only plain
//!   reference): the shared zero page, a page shared copy-on-write with a
//!   fork relative and a private mapping's view of an object page are
//!   first replaced by a private copy with the same entry bits (Linux's
//!   unsharing for long-term pins), so no write through a slice — safe
//!   code may write through any slice, read slices included — reaches
//!   memory another mapping sees. In a shared mapping the frame is the
//!   object's page, which every mapping of it shares by design.
//! - the entry records a write: pinning sets its soft-dirty bit and
//!   clears the userfault write-protect bit of an async handler's VMA, as
//!   a write fault would (`uffd::scan` and `mm::soft_dirty` keep pinned
//!   pages written at their resets).
//!
//! A page inside a 2 MiB page (a PMD leaf) that the mapping owns is
//! pinned under the PMD table's lock with the leaf kept whole (its one
//! soft-dirty bit set, as Linux's GUP dirties the PMD); one it does not
//! own (the huge zero page, a huge page shared with a fork relative) is
//! unshared by a 4 KiB copy, which splits the leaf, as Linux's unsharing
//! of a shared THP does; an async write-protected leaf is split as the
//! write fault Linux takes there would split it.
//!
//! A pinned page stays its mapping's own while pinned: a write fault
//! reuses it (pins are not counted as sharers, see `phys::chunk`) and
//! fork copies it for the child (`mm::fork`).
//!
//! # Locking
//!
//! The mmap_lock read side, then PTE locks (one at a time), then the
//! frame allocator's and the TLB flush lock. Faulting a page in happens
//! with no lock held, in the caller. Order: [`crate::mm`].

use crate::addr::PAGE_SIZE;
use crate::mm::anon_vma::anon_vma_prepare;
use crate::mm::mmap_lock::MmapReadGuard;
use crate::mm::{AddressSpace, MmState};
use crate::phys::Pfn;
use crate::pt::{Pte, PteFlags, HUGE_SIZE};
use crate::reclaim::Guard;
use crate::tlb::Gather;
use crate::vma::{VmFlags, Vma};

/// Why a page could not be pinned now.
pub(super) enum Unpinned {
    /// Fault the page in for this access (with no lock held), then retry.
    Fault,
    /// No frame for the private copy.
    NoMemory,
}

/// Pins the frame `page` maps, for a device access that writes if
/// `write`, under the mmap_lock read side `_st`.
pub(super) fn pin_page(
    mm: &AddressSpace,
    _st: &MmapReadGuard<'_, MmState>,
    page: u64,
    write: bool,
) -> Result<Pfn, Unpinned> {
    let tg = mm.tree.pin();
    let Some((_, vma)) = mm.tree.find(page, &tg) else {
        return Err(Unpinned::Fault);
    };
    let g = mm.pt.pin();
    loop {
        let pte = mm.pt.lookup(page, &g);
        let f = pte.flags();
        if !pte.is_present() || !f.contains(PteFlags::USER) || (write && !pte.is_writable()) {
            return Err(Unpinned::Fault);
        }
        let shared = vma.flags().contains(VmFlags::SHARED);
        if !shared && !owned(mm, pte.pfn()) {
            unshare(mm, vma, page, pte, &g)?;
            continue;
        }
        let async_wp = f.contains(PteFlags::UFFD_WP) && vma.uffd_arc().is_some_and(|c| c.wp_async);
        if !async_wp {
            if let Some(leaf) = mm.pt.huge_at(page, &g) {
                match pin_in_leaf(mm, page, leaf, write, &g) {
                    Some(pfn) => return Ok(pfn),
                    None => continue,
                }
            }
        }
        let mut pinned = false;
        mm.pt.update(page, &g, |cur| {
            // Ownership changes only with the entry (fork, which would
            // share it, is excluded); checked again all the same.
            if cur != pte || !shared && !owned(mm, pte.pfn()) {
                return None;
            }
            mm.frames.pin(pte.pfn());
            pinned = true;
            let mut nf = f | PteFlags::SOFT_DIRTY;
            if async_wp {
                nf.remove(PteFlags::UFFD_WP);
            }
            // Only rights are added or bits recorded: nothing to flush.
            (nf != f).then(|| Pte::new(pte.pfn(), nf))
        });
        if pinned {
            return Ok(pte.pfn());
        }
    }
}

/// Pins the subframe of the PMD leaf `leaf` that maps `page` (a private
/// mapping's own, writable if `write`: checked again), under the PMD
/// table's lock, which every change of the leaf takes, and marks the
/// whole leaf soft-dirty (one bit per PMD entry, as Linux's GUP dirties
/// the PMD): the leaf stays whole. `None` if the leaf changed meanwhile
/// (the caller looks again).
fn pin_in_leaf(mm: &AddressSpace, page: u64, leaf: Pte, write: bool, g: &Guard) -> Option<Pfn> {
    let sub = leaf.subpage(((page % HUGE_SIZE) / PAGE_SIZE) as u32).pfn();
    let mut pinned = false;
    mm.pt.update_huge(page, g, |cur| {
        if cur != leaf || (write && !cur.is_writable()) || !owned(mm, sub) {
            return None;
        }
        mm.frames.pin(sub);
        pinned = true;
        let nf = leaf.flags() | PteFlags::SOFT_DIRTY;
        // Only a bit recorded: nothing to flush.
        (nf != leaf.flags()).then(|| Pte::new(leaf.pfn(), nf))
    });
    pinned.then_some(sub)
}

/// Whether a private mapping's entry owns `pfn`: a frame of its own (the
/// only plain reference), not the zero page nor a shared one.
fn owned(mm: &AddressSpace, pfn: Pfn) -> bool {
    !pfn.is_zero_page() && mm.frames.refcount(pfn) == 1
}

/// Replaces `pte`, the entry of `page` in the private `vma`, by a private
/// copy of its page with the same bits (read-only stays read-only: the
/// next write fault reuses the copy). Does nothing if the entry changed
/// meanwhile (the caller looks again).
fn unshare(mm: &AddressSpace, vma: &Vma, page: u64, pte: Pte, g: &Guard) -> Result<(), Unpinned> {
    // The copy is anonymous memory: fork copies it, rmap finds it. Under
    // the mmap_lock this cannot fail.
    anon_vma_prepare(mm, vma, false).map_err(|_| Unpinned::Fault)?;
    let old = pte.pfn();
    let new = if old.is_zero_page() {
        mm.frames.alloc()
    } else {
        // A reference of our own while we copy, taken under the PTE lock
        // with the entry unchanged: a concurrent MADV_DONTNEED could
        // otherwise free the frame and a fault reuse it under our read.
        let mut referenced = false;
        mm.pt.update(page, g, |cur| {
            if cur == pte {
                mm.frames.get(old);
                referenced = true;
            }
            None
        });
        if !referenced {
            return Ok(());
        }
        let new = mm.frames.alloc_uninit();
        if let Some(new) = new {
            mm.frames.copy(new, old);
        }
        mm.frames.put(old);
        new
    };
    let new = new.ok_or(Unpinned::NoMemory)?;
    let installed = mm
        .pt
        .update(page, g, |cur| {
            (cur == pte).then(|| Pte::new(new, pte.flags()))
        })
        .is_some();
    if !installed {
        mm.frames.put(new);
        return Ok(());
    }
    if !old.is_zero_page() {
        // The old frame's translations (a translator caches them) are gone
        // everywhere before the entry's reference is dropped. The zero
        // page is never cached, so replacing it flushes nothing.
        let mut gather = Gather::new(&mm.tlb, &mm.stats, &mm.frames);
        gather.add_page(page);
        gather.free_frame(old);
        gather.flush();
    }
    Ok(())
}
