//! Collapsing 2 MiB spans of 4 KiB pages into huge pages.
//!
//! `MADV_COLLAPSE` and [`AddressSpace::khugepaged_scan`] (a pass of
//! Linux's khugepaged): under the mmap_lock write side with the VMA
//! write-locked (so no fault, not even a speculative one, is inside the
//! span), a 2 MiB span's PTE table is unlinked
//! (`PageTable::collapse_unlink`), the span's translations flushed (so no
//! translator store can land on an old page after it is copied), its
//! pages copied into a huge frame and the leaf installed; the old table
//! goes through the epoch, the old frames back to the pool.
//!
//! khugepaged's heuristics (`Limits::khugepaged`) are Linux's: a span
//! is collapsed only with at most `max_ptes_none` empty entries (or the
//! zero page), at most `max_ptes_shared` pages shared with another
//! mapping (a fork relative's copy-on-write share: a frame referenced
//! more than once), and at least one referenced page (an entry with the
//! accessed bit, which faults set and `clear_refs` clears: aspace has no
//! hardware setting it on access, nor swap, whose pages Linux wants half
//! referenced). `MADV_COLLAPSE` ignores the THP mode and all three (it
//! fills any number of empty entries, all 512 included, and copies shared pages, as Linux's
//! does since 6.1, `collapse_control::is_khugepaged`). Both refuse a
//! span with a userfault-protected or pinned page. Neither asks for a
//! writable entry: Linux 6.18 dropped its `SCAN_PAGE_RO` rule for
//! anonymous memory, and its MADV_COLLAPSE collapses a span made
//! read-only by mprotect or write-protected by fork (measured in
//! `tests/thp.rs`, `against_the_kernel`).
//!
//! # Locking
//!
//! The mmap_lock write side and the VMA's write lock (`Edit::lock`),
//! then the PTE table's lock and the PMD slot's; the order is
//! [`crate::mm`]'s.

use super::edit::Edit;
use super::soft_dirty;
use super::thp::{mode_allows, vma_allows};
use super::AddressSpace;
use crate::addr::Range;
use crate::error::{Error, Result};
use crate::phys::{FrameAllocator, Pfn};
use crate::pt::{Pte, PteFlags, HUGE_SIZE};
use crate::stats::Event;
use crate::tlb::Gather;
use crate::vma::Vma;

/// Why a span was not collapsed (Linux's `SCAN_*` results, as
/// `MADV_COLLAPSE` reports them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CollapseFail {
    /// No page table maps the span (`SCAN_PMD_NONE`): `EINVAL`, and the
    /// spans after it are left.
    NoTable,
    /// The VMA has no anon_vma yet (`SCAN_PAGE_ANON`): none of its pages
    /// was ever written, so nothing would own the huge page's reverse
    /// map. `EINVAL`, and the spans after it are left.
    NoAnonVma,
    /// More empty entries than allowed (`SCAN_EXCEED_NONE_PTE`): `ENOMEM`.
    TooEmpty,
    /// An entry write-protected for a userfault handler
    /// (`SCAN_PTE_UFFD_WP`): `EINVAL`.
    UffdWp,
    /// A page pinned by a device (`SCAN_PAGE_COUNT`): `EINVAL`.
    Pinned,
    /// More shared pages than allowed (`SCAN_EXCEED_SHARED_PTE`,
    /// khugepaged only).
    TooShared,
    /// No page referenced (`SCAN_LACK_REFERENCED_PAGE`, khugepaged only).
    NotReferenced,
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
            CollapseFail::NoTable
            | CollapseFail::NoAnonVma
            | CollapseFail::UffdWp
            | CollapseFail::Pinned
            | CollapseFail::TooShared
            | CollapseFail::NotReferenced => Error::Inval,
        }
    }
}

/// What a collapse allows of a span's 512 entries.
#[derive(Clone, Copy)]
struct Limits {
    /// Empty entries (or the zero page) at most.
    max_none: usize,
    /// Pages shared with another mapping at most.
    max_shared: usize,
    /// At least one entry must have the accessed bit.
    referenced: bool,
}

impl Limits {
    /// `MADV_COLLAPSE`'s: none (a span whose table holds only empty
    /// entries and zero pages is collapsed too, into a zeroed huge page,
    /// as the running kernel does: `tests/thp.rs`).
    const MADVISE: Limits = Limits {
        max_none: 512,
        max_shared: 512,
        referenced: false,
    };

    /// khugepaged's: the space's `thp_max_ptes_none` and
    /// `thp_max_ptes_shared`, and a referenced page.
    fn khugepaged(mm: &AddressSpace) -> Limits {
        Limits {
            max_none: mm.cfg.thp_max_ptes_none.min(511) as usize,
            max_shared: mm.cfg.thp_max_ptes_shared.min(512) as usize,
            referenced: true,
        }
    }

    /// Why the span's old entries `old` may not be collapsed within
    /// these limits, or `None`: the rules of the module docs, pins
    /// looked up in `frames`, in Linux's order (`hpage_collapse_scan_pmd`).
    fn refuse(self, old: &[Pte], frames: &FrameAllocator) -> Option<CollapseFail> {
        let none = old.iter().filter(|p| p.frame().is_none()).count();
        if none > self.max_none {
            return Some(CollapseFail::TooEmpty);
        }
        if old.iter().any(|p| p.flags().contains(PteFlags::UFFD_WP)) {
            return Some(CollapseFail::UffdWp);
        }
        let pages = || old.iter().filter_map(|p| p.frame());
        // Pins are not counted by `refcount`: a frame referenced more
        // than once is mapped elsewhere too.
        if pages().filter(|&f| frames.refcount(f) > 1).count() > self.max_shared {
            return Some(CollapseFail::TooShared);
        }
        if pages().any(|f| frames.maybe_pinned(f)) {
            return Some(CollapseFail::Pinned);
        }
        let young = |p: &Pte| p.flags().contains(PteFlags::ACCESSED);
        if self.referenced && !old.iter().filter(|p| p.frame().is_some()).any(young) {
            return Some(CollapseFail::NotReferenced);
        }
        None
    }
}

/// Collapses the 2 MiB span at `start` of `v` (locked by `ed`'s caller)
/// into a huge page within `limits`: its 4 KiB pages copied into a huge
/// frame, the table unlinked, the span's translations flushed, the pages
/// copied, the leaf installed, the old frames freed. Already huge: done.
fn collapse_span(
    mm: &AddressSpace,
    v: &Vma,
    start: u64,
    limits: Limits,
) -> core::result::Result<(), CollapseFail> {
    let Some(pt) = mm.pt.peek() else {
        return Err(CollapseFail::NoTable);
    };
    let g = pt.pin();
    if pt.huge_at(start, &g).is_some() {
        return Ok(());
    }
    if !v.has_anon_vma() {
        // Checked after the table, as Linux's scan finds no table first.
        return Err(if pt.pmd_none(start, &g) {
            CollapseFail::NoTable
        } else {
            CollapseFail::NoAnonVma
        });
    }
    let frames = &mm.frames;
    let mut fail = CollapseFail::NoTable;
    let mut head = None;
    let old = pt.collapse_unlink(start, &g, |old| {
        if let Some(f) = limits.refuse(old, frames) {
            fail = f;
            return false;
        }
        head = super::thp::alloc_huge(mm);
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
    let (first, hi) = span_bounds(v, r);
    (first..hi).step_by(HUGE_SIZE as usize)
}

/// Where [`spans`] start, and the end of the last one (no span if the
/// first is not below it).
fn span_bounds(v: &Vma, r: Range) -> (u64, u64) {
    let lo = r.start.max(v.start());
    let hi = r.end.min(v.end()) & !(HUGE_SIZE - 1);
    let first = lo.checked_next_multiple_of(HUGE_SIZE).unwrap_or(u64::MAX);
    (first, hi)
}

impl AddressSpace {
    /// `MADV_COLLAPSE` of `r` (see [`Advice::Collapse`](crate::Advice::Collapse)):
    /// under the mmap_lock write side, each VMA write-locked, every
    /// 2 MiB-aligned span inside `r` and its VMA collapsed with any number
    /// of empty entries. A span that fails stops the call with its errno
    /// (`EINVAL` for a span with no page table or in a VMA never
    /// written, which has no anon_vma; `ENOMEM` with no huge
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
                if let Err(f) = collapse_span(self, &v, start, Limits::MADVISE) {
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
    /// mode gives huge pages to, each 2 MiB-aligned span with a page table,
    /// at most [`Config::thp_max_ptes_none`](crate::Config::thp_max_ptes_none)
    /// empty entries, at most
    /// [`Config::thp_max_ptes_shared`](crate::Config::thp_max_ptes_shared)
    /// pages shared with another mapping and at least one referenced page
    /// (accessed since the last [`clear_refs`](Self::clear_refs) of the
    /// accessed bits) is collapsed into a huge page, as Linux's khugepaged
    /// chooses. Returns how many were.
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
            // The spans with a page table, found by the table walk, which
            // steps over missing tables whole: a huge VMA mostly empty
            // costs a few walks, not one per 2 MiB.
            let mut todo: Vec<u64> = Vec::new();
            if let Some(pt) = self.pt.peek() {
                let (first, hi) = span_bounds(&v, v.range());
                pt.for_each_filled_pmd(first, hi, &pt.pin(), |s| todo.push(s));
            }
            if todo.is_empty() {
                continue;
            }
            ed.lock(v);
            for start in todo {
                let already = self
                    .pt
                    .peek()
                    .is_some_and(|pt| pt.huge_at(start, &pt.pin()).is_some());
                if !already && collapse_span(self, &v, start, Limits::khugepaged(self)).is_ok() {
                    n += 1;
                }
            }
        }
        n
    }
}
