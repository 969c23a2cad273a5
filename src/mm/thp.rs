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
//! fault that finds no huge frame falls back to a 4 KiB page and counts
//! `thp_fault_fallback`.
//!
//! A write to a read-only leaf (the huge zero page, or a page shared with
//! a fork child) splits it and goes on as a 4 KiB copy-on-write fault, as
//! Linux does since 5.8 (it copies 4 KiB, not 2 MiB). Linux reuses an
//! exclusive huge page whole; here the split always happens, and the
//! 4 KiB copy-on-write then reuses each page that is exclusive.
//!
//! Collapse (`MADV_COLLAPSE`, [`AddressSpace::khugepaged_scan`]): under
//! the mmap_lock write side with the VMA write-locked (so no fault, not
//! even a speculative one, is inside the span), a 2 MiB span's PTE table
//! is unlinked (`PageTable::collapse_unlink`), the span's translations
//! flushed (so no translator store can land on an old page after it is
//! copied), its pages copied into a huge frame and the leaf installed; the
//! old table goes through the epoch, the old frames back to the pool. `MADV_COLLAPSE` ignores the mode and
//! `max_ptes_none` (it fills any number of empty entries, as Linux's
//! does); khugepaged honours both. Linux's khugepaged also wants a
//! recently referenced page and at most `max_ptes_shared` shared ones;
//! this scan does not look at either.
//!
//! Paths: the per-VMA and mmap_lock faults install huge pages, under
//! the PMD table's lock, holding the VMA (read lock or mmap_lock), which
//! keeps every writer of its range out; the speculative path does not:
//! where a huge page could be installed it falls back
//! (`spec_abort_needs_more`), so no leaf is ever installed with no VMA
//! held. It handles spans already mapped by a leaf like any present
//! entry (a lookup returns the 4 KiB view).

use super::edit::Edit;
use super::fault::Step;
use super::soft_dirty;
use super::{Access, AddressSpace};
use crate::addr::Range;
use crate::error::{Error, Result};
use crate::phys::Pfn;
use crate::pt::{CheckedInstallError, Pte, PteFlags, HUGE_SIZE};
use crate::reclaim::Guard;
use crate::stats::Event;
use crate::sync::Ordering;
use crate::tlb::Gather;
use crate::vma::{VmFlags, Vma};
use crate::ThpMode;

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
fn mode_allows(mm: &AddressSpace, flags: VmFlags) -> bool {
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
fn vma_allows(mm: &AddressSpace, flags: VmFlags, anon_private: bool) -> bool {
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
        let Some(head) = mm.frames.alloc_huge() else {
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
    // Write-protected for a userfault handler, or a forced write into a
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
        let Some(head) = mm.frames.alloc_huge() else {
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
    // Exclusive: no other mapping, copy-on-write sharer or pin. Counts
    // only fall while we hold the VMA (fork and pins exclude us), so a
    // stale read only sends us to the split.
    let exclusive = (0..512).all(|i| {
        let p = Pfn::new(head.get() + i);
        mm.frames.refcount(p) == 1 && !mm.frames.maybe_pinned(p)
    });
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

/// Why a span was not collapsed (Linux's `SCAN_*` results, as
/// `MADV_COLLAPSE` reports them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CollapseFail {
    /// No page table maps the span (`SCAN_PMD_NONE`): `EINVAL`, and the
    /// spans after it are left.
    NoTable,
    /// More empty entries than allowed (`SCAN_EXCEED_NONE_PTE`): `ENOMEM`.
    TooEmpty,
    /// An entry write-protected for a userfault handler
    /// (`SCAN_PTE_UFFD_WP`): `EINVAL`.
    UffdWp,
    /// A page pinned by a device (`SCAN_PAGE_COUNT`): `EINVAL`.
    Pinned,
    /// No huge frame free (`SCAN_ALLOC_HUGE_PAGE_FAIL`): `ENOMEM`.
    NoMemory,
}

impl CollapseFail {
    /// Whether `MADV_COLLAPSE` goes on to the next span after this
    /// failure (Linux's list of results it continues after).
    fn goes_on(self) -> bool {
        matches!(self, CollapseFail::UffdWp | CollapseFail::Pinned)
    }

    fn errno(self) -> Error {
        match self {
            CollapseFail::TooEmpty | CollapseFail::NoMemory => Error::NoMem,
            CollapseFail::NoTable | CollapseFail::UffdWp | CollapseFail::Pinned => Error::Inval,
        }
    }
}

/// Collapses the 2 MiB span at `start` of `v` (locked by `ed`'s caller)
/// into a huge page: its 4 KiB pages copied into a huge frame, at most
/// `max_none` of its 512 entries empty (or the zero page): the table
/// unlinked, the span's translations flushed, the pages copied, the leaf
/// installed, the old frames freed. Already huge: done.
fn collapse_span(
    mm: &AddressSpace,
    v: &Vma,
    start: u64,
    max_none: u32,
) -> core::result::Result<(), CollapseFail> {
    let Some(pt) = mm.pt.peek() else {
        return Err(CollapseFail::NoTable);
    };
    let g = pt.pin();
    if pt.huge_at(start, &g).is_some() {
        return Ok(());
    }
    let frames = &mm.frames;
    let mut fail = CollapseFail::NoTable;
    let mut head = None;
    let old = pt.collapse_unlink(start, &g, |old| {
        let none = old.iter().filter(|p| p.frame().is_none()).count();
        if none > max_none as usize {
            fail = CollapseFail::TooEmpty;
            return false;
        }
        if old.iter().any(|p| p.flags().contains(PteFlags::UFFD_WP)) {
            fail = CollapseFail::UffdWp;
            return false;
        }
        if old
            .iter()
            .filter_map(|p| p.frame())
            .any(|f| frames.maybe_pinned(f))
        {
            fail = CollapseFail::Pinned;
            return false;
        }
        head = frames.alloc_huge();
        if head.is_none() {
            fail = CollapseFail::NoMemory;
        }
        head.is_some()
    });
    let (Some(old), Some(head)) = (old, head) else {
        return Err(fail);
    };
    // The old translations go before the pages are read: a store through
    // a translator's cached entry cannot land after the copy (its access
    // in flight is waited for; a new walk finds the slot empty and its
    // fault waits for our mmap_lock).
    let span = Range::new(start, start + HUGE_SIZE);
    let mut flush = Gather::new(&mm.tlb, &mm.stats, frames);
    flush.add_range(span);
    flush.flush();
    let mut dirty = PteFlags::empty();
    for (i, p) in old.iter().enumerate() {
        if let Some(f) = p.frame() {
            frames.copy(Pfn::new(head.get() + i as u32), f);
        }
        dirty |= p.flags() & PteFlags::SOFT_DIRTY;
    }
    let leaf = Pte::new(
        head,
        PteFlags::from(v.flags()) | soft_dirty::WRITTEN | dirty | PteFlags::HUGE,
    );
    pt.install_huge(start, leaf, &g, || true)
        .expect("the slot we emptied, with the VMA locked");
    // Flushed already: the old frames go now.
    for p in old {
        if let Some(f) = p.frame() {
            frames.put(f);
        }
    }
    mm.stats.inc(Event::thp_collapse_alloc);
    Ok(())
}

/// The 2 MiB-aligned spans inside both `r` and `v`'s range.
fn spans(v: &Vma, r: Range) -> impl Iterator<Item = u64> {
    let lo = r.start.max(v.start());
    let hi = r.end.min(v.end()) & !(HUGE_SIZE - 1);
    let first = lo.checked_next_multiple_of(HUGE_SIZE).unwrap_or(u64::MAX);
    (first..hi).step_by(HUGE_SIZE as usize)
}

impl AddressSpace {
    /// `MADV_COLLAPSE` of `r` (see [`Advice::Collapse`](crate::Advice::Collapse)):
    /// under the mmap_lock write side, each VMA write-locked, every
    /// 2 MiB-aligned span inside `r` and its VMA collapsed with any number
    /// of empty entries. A span that fails stops the call with its errno
    /// (`EINVAL` for a span with no page table, `ENOMEM` with no huge
    /// frame), except a pinned or write-protected page, which leaves its
    /// span and goes on (its errno returned at the end); `ENOMEM` for a
    /// hole.
    pub(crate) fn madvise_collapse(&self, r: Range) -> Result<()> {
        let ed = Edit::begin(self);
        let mut cursor = r.start;
        let mut hole = false;
        let mut last_fail = None;
        for v in ed.vmas_in(r) {
            if v.start() > cursor {
                hole = true;
            }
            cursor = v.end();
            if !vma_allows(self, v.flags(), v.is_anonymous()) {
                return Err(Error::Inval);
            }
            ed.lock(v);
            for start in spans(&v, r) {
                if let Err(f) = collapse_span(self, &v, start, 511) {
                    last_fail = Some(f);
                    // Linux goes on past a page it cannot take now and
                    // stops at anything else (`madvise_collapse`).
                    if !f.goes_on() {
                        return Err(f.errno());
                    }
                }
            }
        }
        if hole || cursor < r.end {
            return Err(Error::NoMem);
        }
        last_fail.map_or(Ok(()), |f| Err(f.errno()))
    }

    /// One pass of khugepaged over the whole space: in every VMA the THP
    /// mode gives huge pages to, each 2 MiB-aligned span with a page table
    /// and at most [`Config::thp_max_ptes_none`](crate::Config::thp_max_ptes_none)
    /// empty entries is collapsed into a huge page. Returns how many were.
    /// Runs under the mmap_lock write side (Linux's khugepaged takes it
    /// for each collapse); call it when the space is idle, or from a
    /// thread of your own.
    pub fn khugepaged_scan(&self) -> usize {
        let ed = Edit::begin(self);
        let mut n = 0;
        for v in ed.vmas_in(Range::new(0, u64::MAX)) {
            let flags = v.flags();
            if !mode_allows(self, flags) || !vma_allows(self, flags, v.is_anonymous()) {
                continue;
            }
            let has_table = |s: u64| self.pt.peek().is_some_and(|pt| !pt.pmd_none(s, &pt.pin()));
            let todo: Vec<u64> = spans(&v, v.range()).filter(|&s| has_table(s)).collect();
            if todo.is_empty() {
                continue;
            }
            ed.lock(v);
            for start in todo {
                let max = self.cfg.thp_max_ptes_none.min(511);
                let already = self
                    .pt
                    .peek()
                    .is_some_and(|pt| pt.huge_at(start, &pt.pin()).is_some());
                if !already && collapse_span(self, &v, start, max).is_ok() {
                    n += 1;
                }
            }
        }
        n
    }

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
