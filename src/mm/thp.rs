//! Transparent huge pages: which faults map a 2 MiB page (Linux's
//! `thp_vma_allowable_order` for anonymous memory), the huge fault itself
//! (`do_huge_pmd_anonymous_page`), `PR_SET_THP_DISABLE`, and what smaps
//! shows of them (`AnonHugePages`).
//!
//! A fault maps a huge page where [`eligible`] holds and the PMD slot of
//! its 2 MiB span is empty (no PTE table: a span with 4 KiB pages in it
//! keeps them until a collapse). A write gets a huge frame
//! (`phys::huge`), cleared, mapped writable with one PMD leaf; a read
//! gets the huge zero page (a read-only leaf of the zero page). A write
//! fault that finds no huge frame (none free whole, none to rebuild from
//! free 4 KiB frames: `thp_frame_rebuilt` counts those rebuilt) falls
//! back to a 4 KiB page and counts `thp_fault_fallback`.
//!
//! A write to a read-only leaf ([`huge_wp_fault`], Linux's
//! `do_huge_pmd_wp_page`): the huge zero page gets a huge frame of its own
//! (Linux 6.14+; a split when none is free), a page whose 512 subframes
//! only this leaf references is reused whole (made writable: after a fork
//! child is gone, after a soft-dirty reset), and a shared one is split and
//! the fault goes on as a 4 KiB copy-on-write, as Linux does since 5.8 (it
//! copies 4 KiB, not 2 MiB). A forced write into a read-only VMA splits
//! the leaf and is left to the 4 KiB paths. A leaf write-protected for a
//! userfault handler (`UFFDIO_WRITEPROTECT` over its whole 2 MiB keeps it
//! one leaf) is handed to the handler whole by the fault path
//! (`mm::fault`), as Linux's `wp_huge_pmd` does, and un-protecting the
//! whole leaf makes it writable whole; with `wp_async` it is split (Linux
//! too) and the 4 KiB page's bit cleared.
//!
//! Collapsing 4 KiB pages into huge pages is `mm::collapse`'s.
//!
//! Paths: the per-VMA and mmap_lock faults install huge pages, under
//! the PMD table's lock, holding the VMA (read lock or mmap_lock), which
//! keeps every writer of its range out; the speculative path does not:
//! where a huge page could be installed it falls back
//! (`spec_abort_needs_more`), so no leaf is ever installed with no VMA
//! held. It handles spans already mapped by a leaf like any present
//! entry (a lookup returns the 4 KiB view).

use super::fault::Step;
use super::soft_dirty;
use super::{Access, AddressSpace};
use crate::addr::Range;
use crate::phys::Pfn;
use crate::pt::{CheckedInstallError, Pte, PteFlags, HUGE_SIZE};
use crate::reclaim::Guard;
use crate::stats::Event;
use crate::sync::Ordering;
use crate::vma::{VmFlags, Vma};
use crate::ThpMode;

/// A huge frame for `mm` (see `phys::huge`), one rebuilt from free 4 KiB
/// frames counted `thp_frame_rebuilt`.
pub(crate) fn alloc_huge(mm: &AddressSpace) -> Option<Pfn> {
    let (head, rebuilt) = mm.frames.alloc_huge_noting()?;
    if rebuilt {
        mm.stats.inc(Event::thp_frame_rebuilt);
    }
    Some(head)
}

/// Whether a fault at `addr` in a VMA with `flags` and `range` (anonymous
/// and private if `anon_private`) may map the 2 MiB page around it.
pub(crate) fn eligible(
    mm: &AddressSpace,
    flags: VmFlags,
    range: Range,
    anon_private: bool,
    addr: u64,
) -> bool {
    mode_allows(mm, flags) && vma_allows(mm, flags, anon_private) && span_inside(range, addr)
}

/// Whether the THP mode gives a VMA with `flags` huge pages on faults
/// (and khugepaged's collapses).
pub(super) fn mode_allows(mm: &AddressSpace, flags: VmFlags) -> bool {
    match mm.cfg.thp {
        ThpMode::Always => true,
        ThpMode::Madvise => flags.contains(VmFlags::HUGEPAGE),
        ThpMode::Never => false,
    }
}

/// Whether a VMA with `flags` may have huge pages at all, whatever the
/// mode (what `MADV_COLLAPSE` checks): anonymous and private, not
/// `VM_NOHUGEPAGE`, not registered for userfaults, in a space without
/// `PR_SET_THP_DISABLE`.
pub(super) fn vma_allows(mm: &AddressSpace, flags: VmFlags, anon_private: bool) -> bool {
    anon_private
        && !mm.thp_disable()
        && !flags.intersects(
            VmFlags::NOHUGEPAGE
                | VmFlags::SHARED
                | VmFlags::UFFD_MISSING
                | VmFlags::UFFD_MINOR
                | VmFlags::UFFD_WP,
        )
}

/// Whether the 2 MiB-aligned span holding `addr` lies inside `range`.
fn span_inside(range: Range, addr: u64) -> bool {
    let start = addr & !(HUGE_SIZE - 1);
    start >= range.start && start.checked_add(HUGE_SIZE).is_some_and(|e| e <= range.end)
}

/// The huge fault: maps the 2 MiB page around `addr` in `vma` if it is
/// eligible and its PMD slot is empty. `Ok(true)`: mapped (or mapped by a
/// racing fault); `Ok(false)`: go on with a 4 KiB page. The caller holds
/// `vma` and has given it its anon_vma for a write.
pub(crate) fn huge_fault(
    mm: &AddressSpace,
    vma: &Vma,
    addr: u64,
    access: Access,
    g: &Guard,
) -> Result<bool, Step> {
    let flags = vma.flags();
    // A forced write into a read-only VMA (`mm/forced.rs`) takes the
    // 4 KiB path, whose copy-on-write rules it relies on.
    let forced_write = access == Access::Write && !flags.contains(VmFlags::WRITE);
    if forced_write || !eligible(mm, flags, vma.range(), vma.is_anonymous(), addr) {
        return Ok(false);
    }
    let start = addr & !(HUGE_SIZE - 1);
    if !mm.pt.pmd_none(start, g) {
        return Ok(false);
    }
    let leaf = if access == Access::Write {
        let Some(head) = alloc_huge(mm) else {
            mm.stats.inc(Event::thp_fault_fallback);
            return Ok(false);
        };
        Pte::new(
            head,
            PteFlags::from(flags) | soft_dirty::WRITTEN | PteFlags::HUGE,
        )
    } else {
        Pte::new(
            Pfn::ZERO_PAGE,
            (PteFlags::from(flags) - PteFlags::WRITE) | PteFlags::HUGE,
        )
    };
    match mm.pt.install_huge(start, leaf, g, || true) {
        Ok(()) => {
            mm.stats.inc(if leaf.pfn().is_zero_page() {
                Event::thp_zero_page_mapped
            } else {
                Event::thp_fault_alloc
            });
            Ok(true)
        }
        Err(e) => {
            if let Some(head) = leaf.frame() {
                mm.frames.put_huge(head);
            }
            // A racing fault filled the slot (with a leaf, or a table):
            // the caller looks again.
            Ok(matches!(e, CheckedInstallError::Taken(p) if p.is_huge()))
        }
    }
}

/// A write fault on the read-only PMD leaf `leaf` covering `page` of
/// `vma` (Linux's `do_huge_pmd_wp_page`). The huge zero page gets a huge
/// frame of its own, cleared (Linux 6.14+'s `do_huge_zero_wp_pmd`;
/// `thp_fault_alloc`, or `thp_fault_fallback` when none is free); a page
/// whose 512 subframes this leaf alone references (a fork child gone, or
/// a soft-dirty reset) is reused whole, made writable and written. True
/// if the leaf was replaced (or changed under us: the caller looks
/// again); false: the caller splits it and copies 4 KiB.
pub(crate) fn huge_wp_fault(mm: &AddressSpace, vma: &Vma, page: u64, leaf: Pte, g: &Guard) -> bool {
    let flags = vma.flags();
    // Write-protected for an async userfault context (a handler's own
    // are delivered before this, `mm::fault`), or a forced write into a
    // read-only VMA: the 4 KiB paths know those rules.
    if !flags.contains(VmFlags::WRITE)
        || leaf.flags().contains(PteFlags::UFFD_WP) && flags.contains(VmFlags::UFFD_WP)
    {
        return false;
    }
    let writable = (PteFlags::from(flags) | soft_dirty::WRITTEN) - PteFlags::UFFD_WP;
    let Some(head) = leaf.frame() else {
        // The huge zero page: a THP of our own if the VMA still allows one.
        if !eligible(mm, flags, vma.range(), vma.is_anonymous(), page) {
            return false;
        }
        let Some(head) = alloc_huge(mm) else {
            mm.stats.inc(Event::thp_fault_fallback);
            return false;
        };
        let new = Pte::new(head, writable | PteFlags::HUGE);
        if mm
            .pt
            .update_huge(page, g, |cur| (cur == leaf).then_some(new))
            .is_some()
        {
            mm.stats.inc(Event::thp_fault_alloc);
        } else {
            mm.frames.put_huge(head);
        }
        return true;
    };
    // Exclusive: no other mapping or copy-on-write sharer. A pinned
    // subframe is the mapping's own (pins are taken only on owned pages,
    // fork copies pinned ones, and `refcount` does not count pins), and
    // is reused as the 4 KiB write fault reuses it (`mm::cow`). Counts
    // only fall while we hold the VMA (fork excludes us), so a stale
    // read only sends us to the split.
    let exclusive = (0..512).all(|i| mm.frames.refcount(Pfn::new(head.get() + i)) == 1);
    if !exclusive {
        return false;
    }
    let new = Pte::new(head, leaf.flags() | writable);
    if mm
        .pt
        .update_huge(page, g, |cur| (cur == leaf).then_some(new))
        .is_some()
    {
        mm.stats.inc(Event::cow_reuses);
    }
    true
}

impl AddressSpace {
    /// Disables transparent huge pages for the whole space, or enables them
    /// again, like `prctl(PR_SET_THP_DISABLE, disable)`: faults from now on
    /// map 4 KiB pages whatever the mode and the VMAs' flags; huge pages
    /// already mapped stay. Fork children inherit the setting.
    pub fn set_thp_disable(&self, disable: bool) {
        self.thp_disabled
            .store(u64::from(disable), Ordering::Relaxed);
    }

    /// `prctl(PR_GET_THP_DISABLE)`: true if transparent huge pages are
    /// disabled for this space.
    pub fn thp_disable(&self) -> bool {
        self.thp_disabled.load(Ordering::Relaxed) != 0
    }

    /// The bytes of the VMA containing `addr` that huge pages of its own
    /// map, as the `AnonHugePages:` line of `/proc/pid/smaps` shows them
    /// (in bytes, not kB; the huge zero page is not counted); `None` if no
    /// VMA contains `addr`.
    pub fn anon_huge_pages(&self, addr: u64) -> Option<u64> {
        let _st = self.mmap_lock.read();
        let tg = self.tree.pin();
        let (r, _) = self.tree.find(addr, &tg)?;
        let Some(pt) = self.pt.peek() else {
            return Some(0);
        };
        let g = pt.pin();
        let mut bytes = 0;
        pt.for_each_huge(r.start, r.end, &g, |va, leaf| {
            if va >= r.start && va + HUGE_SIZE <= r.end && leaf.frame().is_some() {
                bytes += HUGE_SIZE;
            }
        });
        Some(bytes)
    }
}
