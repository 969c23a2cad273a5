//! Range-locked writers (`WriterLocking::Range`): how an [`Edit`] begins
//! over a neighbourhood instead of the whole space, the neighbourhood
//! itself, and the placement's view that skips busy ranges. The protocol
//! is in `range_lock`'s module docs.

use super::Edit;
use crate::addr::{Range, PAGE_SIZE};
use crate::error::{Error, Result};
use crate::mm::mmap_lock::RangeHold;
use crate::mm::AddressSpace;
use crate::pt::ROOT_ENTRY_SPAN;
use crate::reclaim::Guard;
use crate::vma::VmaRef;

/// What a range writer's neighbourhood includes beyond its range widened
/// by a page on each side and the VMAs overlapping that.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Reach {
    /// Nothing more (mprotect, an mmap into free space).
    Vmas,
    /// The hole around the range up to the VMAs on either side, where an
    /// unmap frees page tables (munmap, an mmap over mapped pages).
    Hole,
}

impl<'a> Edit<'a> {
    /// A writer of `r` and its neighbourhood (`range_lock`'s module docs):
    /// in range mode, only that is locked; otherwise the mmap_lock's write
    /// side, as [`begin`](Self::begin). The neighbourhood is computed, locked,
    /// then computed again under the lock; if it grew, the writer starts
    /// over with the larger one.
    pub(crate) fn begin_range(mm: &'a AddressSpace, r: Range, reach: Reach) -> Self {
        if !mm.mmap_lock.is_range_mode() {
            return Self::begin(mm);
        }
        let (st, pin) = lock_validated(
            mm,
            |pin| neighbourhood(mm, r, reach, pin),
            |want| {
                mm.mmap_lock
                    .write_range(want)
                    .expect("range mode has a range lock")
            },
        );
        Edit {
            mm,
            state: st,
            tree: None,
            pin,
        }
    }

    /// A range writer at an address that `search` (mmap's placement)
    /// chooses, `len` bytes there and their neighbourhood (range mode only,
    /// else `None`). The search runs on a [`View`] that skips the ranges
    /// other writers hold or wait for; its choice is then try-locked and
    /// checked again under the lock (still free, neighbourhood inside the
    /// hold); if another writer got there first, it runs again. A search
    /// that fails while others hold ranges waits for one to be released.
    pub(crate) fn begin_placed(
        mm: &'a AddressSpace,
        len: u64,
        mut search: impl FnMut(&View<'_>) -> Result<u64>,
    ) -> Option<Result<(u64, Self)>> {
        let ranges = mm.mmap_lock.ranges()?;
        Some(loop {
            let (avoid, gen, mark) = ranges.busy();
            let pin = mm.tree.pin();
            let view = View {
                mm,
                pin: &pin,
                avoid: &avoid,
            };
            let addr = match search(&view) {
                Ok(a) => a,
                Err(e) if avoid.is_empty() => break Err(e),
                Err(_) => {
                    ranges.wait_release(gen);
                    continue;
                }
            };
            let Some(r) = Range::from_len(addr, len) else {
                break Err(Error::NoMem);
            };
            let want = neighbourhood(mm, r, Reach::Vmas, &pin);
            drop(pin);
            let Some(st) = mm.mmap_lock.try_write_range(want) else {
                // Taken since the snapshot (or a hint on a busy range):
                // wait for a release, then look again.
                ranges.wait_release(gen);
                continue;
            };
            let pin = mm.tree.pin();
            // No writer since `busy`: the search, the neighbourhood and
            // the gap's usability read the tree as it is now. Else both
            // are checked again under the lock.
            let valid = st.undisturbed_since(mark) || {
                let now = neighbourhood(mm, r, Reach::Vmas, &pin);
                let view = View {
                    mm,
                    pin: &pin,
                    avoid: &[],
                };
                let usable = mm.range_usable(&view, r);
                usable && want.start <= now.start && now.end <= want.end
            };
            if valid {
                break Ok((
                    addr,
                    Edit {
                        mm,
                        state: st,
                        tree: None,
                        pin,
                    },
                ));
            }
        })
    }
}

/// The lowest (or highest) free range of `len` bytes in `[low, high)`.
fn free_area_in(
    tree: &crate::tree::RangeForest<VmaRef>,
    pin: &Guard,
    low: u64,
    high: u64,
    len: u64,
    top_down: bool,
) -> Option<u64> {
    if top_down {
        tree.gap_highest(low, high, len, PAGE_SIZE, pin)
    } else {
        tree.gap_lowest(low, high, len, PAGE_SIZE, pin)
    }
}

/// Locks the range `compute` reads off the tree (with `lock`), then
/// computes it again under the lock: if it grew (a VMA it holds whole was
/// extended meanwhile), unlocks and starts over with the union. Returns
/// the guard and an epoch pin taken under it. The protocol of range
/// writers and readers (`range_lock`'s module docs) rests on this: what
/// the holder validated can be changed only by a holder of an overlapping
/// range. When no range was held exclusive from before the first
/// computation to the grant ([`RangeLock::quiet`]), nothing it read can
/// have changed, and the second computation is skipped (one thread alone
/// always; the recomputation remains for every grant a writer preceded).
///
/// [`RangeLock::quiet`]: crate::mm::range_lock::RangeLock::quiet
pub(crate) fn lock_validated<G: RangeHold>(
    mm: &AddressSpace,
    mut compute: impl FnMut(&Guard) -> Range,
    mut lock: impl FnMut(Range) -> G,
) -> (G, Guard) {
    let mut mark = mm.mmap_lock.ranges().and_then(|l| l.quiet());
    let mut want = compute(&mm.tree.pin());
    loop {
        let held = lock(want);
        let pin = mm.tree.pin();
        if held.undisturbed_since(mark) {
            return (held, pin);
        }
        // A later round computes its union from reads made while others
        // held ranges: never skipped.
        mark = None;
        let now = compute(&pin);
        if want.start <= now.start && now.end <= want.end {
            return (held, pin);
        }
        drop(pin);
        drop(held);
        want = Range::new(want.start.min(now.start), want.end.max(now.end));
    }
}

/// `r` widened to the whole of every VMA overlapping it: what a reader of
/// those VMAs (and of the holes of `r`) locks shared.
pub(crate) fn vma_hull(mm: &AddressSpace, r: Range, pin: &Guard) -> Range {
    if r.is_empty() {
        return r;
    }
    // Only the VMAs holding the first and the last address of `r` can
    // reach past it: two point lookups, no list of the VMAs between.
    let lo = mm.tree.find(r.start, pin).map_or(r.start, |(v, _)| v.start);
    let hi = mm.tree.find(r.end - 1, pin).map_or(r.end, |(v, _)| v.end);
    Range::new(lo.min(r.start), hi.max(r.end))
}

/// How far a neighbourhood reaches past its range on each side: a page,
/// so that two writers whose ranges touch (and may merge) conflict.
const MARGIN: u64 = PAGE_SIZE;

/// A range writer's neighbourhood of `r` (`range_lock`'s module docs): `r`
/// widened by a page on each side, every VMA overlapping that, and with
/// [`Reach::Hole`] the hole around `r` up to the VMAs on either side.
pub(crate) fn neighbourhood(mm: &AddressSpace, r: Range, reach: Reach, pin: &Guard) -> Range {
    let wide = Range::new(r.start.saturating_sub(MARGIN), r.end.saturating_add(MARGIN));
    let Range {
        start: mut lo,
        end: mut hi,
    } = vma_hull(mm, wide, pin);
    if reach == Reach::Hole {
        // The hole around `r`, up to the VMAs on either side: the unmap
        // frees the page tables inside it, of every level. Clamped to `r`
        // rounded out to a root entry's span: no table it may free lies
        // beyond, so the clamp frees exactly what the whole hole would
        // (`range_lock`'s module docs), and two unmaps in different
        // 512 GiB slots do not meet.
        let (clamp_lo, clamp_hi) = (
            r.start - r.start % ROOT_ENTRY_SPAN,
            r.end
                .checked_next_multiple_of(ROOT_ENTRY_SPAN)
                .unwrap_or(u64::MAX),
        );
        // Bounded lookups (nothing beyond the clamp counts): they visit
        // the forest's slots of the clamp only.
        let floor = mm
            .tree
            .prev_above(r.start, clamp_lo, pin)
            .map_or(0, |(p, _)| p.end)
            .max(clamp_lo);
        let ceiling = mm
            .tree
            .find_after_below(r.end, clamp_hi, pin)
            .map_or(u64::MAX, |(n, _)| n.start.max(r.end))
            .min(clamp_hi);
        lo = lo.min(floor);
        hi = hi.max(ceiling);
    }
    Range::new(lo, hi)
}

/// What a placement reads (Linux's `get_unmapped_area` needs only the
/// tree): an edit's view, or a range writer's before it holds anything,
/// whose gap searches skip candidates that ranges in `avoid` (held or
/// waited for by other writers) make busy.
pub(crate) struct View<'v> {
    mm: &'v AddressSpace,
    pin: &'v Guard,
    avoid: &'v [Range],
}

impl<'v> View<'v> {
    /// A view of `mm`'s tree with nothing to avoid.
    pub(crate) fn new(mm: &'v AddressSpace, pin: &'v Guard) -> Self {
        View {
            mm,
            pin,
            avoid: &[],
        }
    }

    /// The first VMA ending above `addr` (Linux's `find_vma`).
    pub(crate) fn find_after(&self, addr: u64) -> Option<VmaRef> {
        self.mm.tree.find_after(addr, self.pin).map(|(_, v)| *v)
    }

    /// The lowest (or, with `top_down`, the highest) page-aligned free
    /// range of `len` bytes inside `[low, high)` (Linux's
    /// `unmapped_area` and `unmapped_area_topdown`) whose range, a page
    /// wider on each side, meets no range in `avoid`.
    pub(crate) fn free_area(
        &self,
        mut low: u64,
        mut high: u64,
        len: u64,
        top_down: bool,
    ) -> Option<u64> {
        loop {
            let s = free_area_in(&self.mm.tree, self.pin, low, high, len, top_down)?;
            let lo = s.saturating_sub(PAGE_SIZE);
            let hi = s.saturating_add(len).saturating_add(PAGE_SIZE);
            let Some(a) = self.avoid.iter().find(|a| a.start < hi && lo < a.end) else {
                return Some(s);
            };
            // Each step moves the window past `a`: it ends.
            if top_down {
                high = high.min(a.start.checked_sub(PAGE_SIZE)?);
            } else {
                low = low.max(a.end.checked_add(PAGE_SIZE)?);
            }
            if high < low {
                return None;
            }
        }
    }
}
