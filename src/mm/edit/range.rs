//! Range-locked writers (`WriterLocking::Range`): how an [`Edit`] begins
//! over a neighbourhood instead of the whole space, the neighbourhood
//! itself, and the placement's view that skips busy ranges. The protocol
//! is in `range_lock`'s module docs.

use super::{Edit, MmapWriteGuard};
use crate::addr::{Range, PAGE_SIZE};
use crate::error::{Error, Result};
use crate::mm::mmap_lock::RangeHold;
use crate::mm::range_lock::{RangeLock, Wait};
use crate::mm::AddressSpace;
use crate::mm::MmState;
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
    /// over with the larger one. The owner of the range lock's bias takes
    /// the whole space instead (`range_bias`), as does a writer near
    /// `max_map_count` (`MapCount::far_below`); the owner of a slot's
    /// bias, its whole slot.
    pub(crate) fn begin_range(mm: &'a AddressSpace, r: Range, reach: Reach) -> Self {
        if !mm.mmap_lock.is_range_mode() || mm.mmap_lock.bias_likely_mine() {
            return Self::begin(mm);
        }
        // Before any read or lock: this writer's stores go to the slots.
        mm.tree.split();
        // The owner of the bias of `r`'s slot: the whole slot (granted by
        // one out-of-line copy, `write_slot`), the neighbourhood checked
        // inside it under the grant (`neighbourhood_in_slot`), as the
        // space's owner takes the whole space. The edit is made here, in
        // the place this call returns it to: made in a helper and returned
        // through an `Option`, it was copied once more (192 bytes, read
        // back before its stores had left the store buffer). Anyone else,
        // a neighbourhood past the slot, or a count near `max_map_count`:
        // the usual path.
        if let Some(st) = mm.mmap_lock.write_slot(r.start) {
            let pin = mm.tree.pin();
            let inside = neighbourhood_in_slot(mm, st.range(), Some(r), || {
                neighbourhood(mm, r, reach, &pin)
            });
            if inside && st.map_count_far_below(mm.cfg.max_map_count) {
                return Self::holding(mm, st, pin);
            }
        }
        let (st, pin) = lock_validated(
            mm,
            r.start,
            Some(r),
            |pin| neighbourhood(mm, r, reach, pin),
            |want| {
                mm.mmap_lock
                    .try_write_range(want)
                    .expect("range mode has a range lock")
                    .ok()
            },
            |want| {
                mm.mmap_lock
                    .write_range(want)
                    .expect("range mode has a range lock")
            },
        );
        if !st.map_count_far_below(mm.cfg.max_map_count) {
            // Near `max_map_count`: the whole space, whose check is exact.
            drop(pin);
            drop(st);
            return Self::begin(mm);
        }
        Self::holding(mm, st, pin)
    }

    /// A range writer's edit, holding `state` (its neighbourhood, or
    /// more) and pinned by `pin`, taken under it. The caller checked
    /// `MmState::map_count_far_below` first. Out of line: one copy for
    /// every caller (inlined, each codegen unit of its callers kept a
    /// copy of its own, and the slot owner's path ran two).
    #[inline(never)]
    fn holding(mm: &'a AddressSpace, state: MmapWriteGuard<'a, MmState>, pin: Guard) -> Self {
        // The owner of a slot's bias holds the whole slot: its tree alone
        // may serve it (`tree::InnerSlot`).
        let inner = state.owned_slot().and_then(|_| {
            // SAFETY: the edit keeps `state`, the grant of the slot's
            // bias, for as long as the view (dropped first: field order).
            // The grant keeps every other writer out of the whole slot,
            // and the bias orders its holders: a revoker's acquire of the
            // owner's count-out (`range_bias`), a request's of the
            // previous grant's release (`range_lock`).
            unsafe { mm.tree.inner_slot(state.range()) }
        });
        Edit {
            mm,
            state,
            tree: None,
            inner,
            pin,
        }
    }

    /// A range writer at an address that `search` (mmap's placement)
    /// chooses, `len` bytes there and their neighbourhood (range mode only,
    /// else `None`). The search runs on a [`View`] that skips candidates
    /// near ranges other writers hold or wait for; its choice is then
    /// try-locked and checked again under the lock (still free,
    /// neighbourhood inside the hold); if another writer got there first,
    /// it runs again. A search that fails after skipping a busy candidate
    /// waits for that range's release. `near` is where the search is
    /// likely to land (the placement window, else below `mmap_base`): the
    /// re-check is skipped when the hold lies in that address's shard of
    /// the range lock and nothing changed there since the search began.
    /// The edit goes to `into` (made there: the caller keeps it), the
    /// address chosen is returned.
    #[inline(always)]
    pub(crate) fn begin_placed(
        mm: &'a AddressSpace,
        len: u64,
        near: u64,
        into: &mut Option<Self>,
        mut search: impl FnMut(&View<'_>) -> Result<u64>,
    ) -> Option<Result<u64>> {
        let ranges = mm.mmap_lock.ranges()?;
        // As `begin_range`'s.
        mm.tree.split();
        if let Some(slot) = ranges.slot_likely_mine(near) {
            if let Some(addr) = Self::place_in_slot(mm, slot, len, &mut search, into) {
                return Some(Ok(addr));
            }
        }
        Some(loop {
            let mark = ranges.mark(near);
            let pin = mm.tree.pin();
            let view = View {
                mm,
                pin: &pin,
                busy: Some(ranges),
                skipped: core::cell::Cell::new(None),
            };
            let addr = match search(&view) {
                Ok(a) => a,
                Err(e) => match view.skipped.get() {
                    None => break Err(e),
                    Some(w) => {
                        drop(pin);
                        ranges.wait(w);
                        continue;
                    }
                },
            };
            let Some(r) = Range::from_len(addr, len) else {
                break Err(Error::NoMem);
            };
            let want = neighbourhood(mm, r, Reach::Vmas, &pin);
            // The try-lock waits for nothing, so the search's pin carries
            // on under the hold (one pin a placement, not two).
            let st = match mm.mmap_lock.try_write_range(want)? {
                Ok(st) => st,
                // Taken since the search (or a hint on a busy range):
                // wait for its release, unpinned, then look again.
                Err(w) => {
                    drop(pin);
                    ranges.wait(w);
                    continue;
                }
            };
            // No writer in the shard since the search began: the search,
            // the neighbourhood and the gap's usability read the tree as it
            // is now. A stack's guard gap above the hold may reach into the
            // next shard, which the mark does not cover. Else all is
            // checked again under the lock.
            let gap = want.end.saturating_add(mm.cfg.stack_guard_gap);
            let valid = (st.undisturbed_since(mark) && ranges.same_shard(want.start, gap)) || {
                let now = neighbourhood(mm, r, Reach::Vmas, &pin);
                let view = View::new(mm, &pin);
                let usable = mm.range_usable(&view, r);
                usable && want.start <= now.start && now.end <= want.end
            };
            if valid {
                *into = Some(Self::holding(mm, st, pin));
                break Ok(addr);
            }
        })
    }

    /// [`begin_placed`](Self::begin_placed) for the owner of the slot's
    /// bias (or its claimant): the whole slot held first, the search and
    /// the neighbourhood read under it, with nothing busy to skip ("Slot
    /// biases" in `range_bias`). `None` (nothing held) if the slot is not
    /// granted at once, or the choice or its neighbourhood reaches past
    /// the slot, or the search fails: the usual path then runs, and gives
    /// the search's error. The edit is made in `into`.
    #[inline]
    fn place_in_slot(
        mm: &'a AddressSpace,
        slot: Range,
        len: u64,
        search: &mut impl FnMut(&View<'_>) -> Result<u64>,
        into: &mut Option<Self>,
    ) -> Option<u64> {
        let st = mm.mmap_lock.write_slot(slot.start)?;
        let pin = mm.tree.pin();
        let addr = search(&View::new(mm, &pin)).ok()?;
        let r = Range::from_len(addr, len)?;
        // The search ran under the hold, so its choice (a stack's guard
        // gap above included) needs no check again.
        if !neighbourhood_in_slot(mm, slot, Some(r), || {
            neighbourhood(mm, r, Reach::Vmas, &pin)
        }) {
            return None;
        }
        *into = Some(Self::holding(mm, st, pin));
        Some(addr)
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
/// the guard and an epoch pin held under it. The protocol of range
/// writers and readers (`range_lock`'s module docs) rests on this: what
/// the holder validated can be changed only by a holder of an overlapping
/// range. When the hold lies in the range lock's shard of `at` (where
/// `compute` reads) and no range was held exclusive there, nor the whole
/// space by a writer, from before the first computation to the grant
/// ([`RangeLock::mark`]), nothing it read can have changed, and the
/// second computation is skipped (one thread alone always; the
/// recomputation remains for every grant a writer of that shard
/// preceded).
///
/// The first request is `try_lock`, made still pinned: granted (the
/// common case, a writer alone in its shard), the pin of the first
/// computation carries on, and the holder pins once. A pin is only
/// memory safety: every read under it loads the tree as it is then, and
/// the grant's `Acquire` orders those reads after the last holder's
/// changes, whenever the pin was taken. A request that waits (`lock`)
/// never holds a pin: a sleeper pinned would hold back every thread's
/// reclamation for as long as it sleeps.
///
/// The owner of the slot's bias of `at` (or its claimant) requests the
/// whole slot instead, granted at once, and computes under it, once:
/// nothing to mark or validate ("Slot biases" in `range_bias`). Not even
/// that computation if `within` says where it stays (`compute` is `within`
/// widened by at most a page on each side, grown to the whole of every
/// VMA it meets, plus holes clamped to root entries' spans, as
/// [`neighbourhood`] computes it): `within` a page inside the slot, in a
/// slot that never held an entry reaching one of its ends
/// ([`RangeForest::edges_touched`]), leaves every VMA it may meet inside
/// the slot. A range reaching past the slot takes the usual path, which
/// ends the biases of the slots it spans.
///
/// [`RangeLock::mark`]: crate::mm::range_lock::RangeLock::mark
/// [`RangeForest::edges_touched`]: crate::tree::RangeForest::edges_touched
#[inline]
pub(crate) fn lock_validated<G: RangeHold>(
    mm: &AddressSpace,
    at: u64,
    within: Option<Range>,
    mut compute: impl FnMut(&Guard) -> Range,
    mut try_lock: impl FnMut(Range) -> Option<G>,
    mut lock: impl FnMut(Range) -> G,
) -> (G, Guard) {
    if let Some(slot) = mm.mmap_lock.ranges().and_then(|l| l.slot_likely_mine(at)) {
        if let Some(held) = try_lock(slot) {
            let pin = mm.tree.pin();
            if neighbourhood_in_slot(mm, slot, within, || compute(&pin)) {
                return (held, pin);
            }
        }
    }
    let mut mark = mm.mmap_lock.ranges().and_then(|l| l.mark(at));
    let mut pin = mm.tree.pin();
    let mut want = compute(&pin);
    let mut held = match try_lock(want) {
        Some(held) => held,
        None => {
            drop(pin);
            let held = lock(want);
            pin = mm.tree.pin();
            held
        }
    };
    loop {
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
        held = lock(want);
        pin = mm.tree.pin();
    }
}

/// `r` widened to the whole of every VMA overlapping it: what a reader of
/// those VMAs (and of the holes of `r`) locks shared.
pub(crate) fn vma_hull(mm: &AddressSpace, r: Range, pin: &Guard) -> Range {
    if r.is_empty() {
        return r;
    }
    // Only the VMAs holding the first and the last address of `r` can
    // reach past it, and both are found from the lowest VMA meeting `r`:
    // it holds the first address if it starts at or below it, and the
    // last too if it ends at or past `r`'s end (a range in one VMA, or in
    // a hole beside one: one lookup); else a second lookup finds the VMA
    // holding the last address. No list of the VMAs between.
    let Some((v, _)) = mm.tree.find_after_below(r.start, r.end, pin) else {
        return r;
    };
    let hi = if v.end >= r.end {
        v.end
    } else {
        mm.tree.find(r.end - 1, pin).map_or(r.end, |(w, _)| w.end)
    };
    Range::new(v.start.min(r.start), hi.max(r.end))
}

/// How far a neighbourhood reaches past its range on each side: a page,
/// so that two writers whose ranges touch (and may merge) conflict.
const MARGIN: u64 = PAGE_SIZE;

/// True if the neighbourhood `compute` gives (of `within`, when known:
/// [`neighbourhood`], either reach) lies inside `slot`, a whole slot the
/// caller holds. Known without computing it when `within` lies a page
/// inside the slot and no entry of the slot ever reached one of its ends
/// ([`RangeForest::edges_touched`]): every VMA `within` widened by a page
/// meets lies inside too, and a hole clamped to its root entries' spans
/// stays in the slot. Else computed and compared.
///
/// [`RangeForest::edges_touched`]: crate::tree::RangeForest::edges_touched
#[inline]
fn neighbourhood_in_slot(
    mm: &AddressSpace,
    slot: Range,
    within: Option<Range>,
    compute: impl FnOnce() -> Range,
) -> bool {
    known_inside(mm, slot, within) || computed_inside(slot, compute)
}

/// `neighbourhood_in_slot`'s check without computing: one copy, out of
/// line (generic over the computation, the whole function had a copy per
/// caller, five, of which the slot owner's path ran two).
#[inline(never)]
fn known_inside(mm: &AddressSpace, slot: Range, within: Option<Range>) -> bool {
    within.is_some_and(|r| {
        r.start >= slot.start.saturating_add(MARGIN)
            && r.end.checked_add(MARGIN).is_some_and(|e| e <= slot.end)
            && !mm.tree.edges_touched(slot.start)
    })
}

/// `neighbourhood_in_slot`'s computation, where the slot's edges do not
/// settle it (out of line, and cold: the owner's path keeps only the
/// check in its instruction cache).
#[cold]
#[inline(never)]
fn computed_inside(slot: Range, compute: impl FnOnce() -> Range) -> bool {
    slot.contains_range(&compute())
}

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
        let Range {
            start: clamp_lo,
            end: clamp_hi,
        } = root_spans_around(r);
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

/// `r` rounded out to whole root entries' spans (512 GiB,
/// `pt::ROOT_ENTRY_SPAN`): no page table an unmap of `r` may free lies
/// beyond (the largest, a PUD table, covers one such span, and the root
/// is never freed), so an unmap's hole clamped to it frees what the whole
/// hole would.
pub(crate) fn root_spans_around(r: Range) -> Range {
    Range::new(
        r.start - r.start % ROOT_ENTRY_SPAN,
        r.end
            .checked_next_multiple_of(ROOT_ENTRY_SPAN)
            .unwrap_or(u64::MAX),
    )
}

/// What a placement reads (Linux's `get_unmapped_area` needs only the
/// tree): an edit's view, or a range writer's before it holds anything,
/// whose gap searches skip candidates near ranges that other writers hold
/// or wait for in `busy`.
pub(crate) struct View<'v> {
    mm: &'v AddressSpace,
    pin: &'v Guard,
    busy: Option<&'v RangeLock>,
    /// What the last skipped candidate waits for.
    skipped: core::cell::Cell<Option<Wait>>,
}

impl<'v> View<'v> {
    /// A view of `mm`'s tree with nothing to avoid.
    pub(crate) fn new(mm: &'v AddressSpace, pin: &'v Guard) -> Self {
        View {
            mm,
            pin,
            busy: None,
            skipped: core::cell::Cell::new(None),
        }
    }

    /// The first VMA that ends after `addr`, if it starts below
    /// `ceiling`: reads only the forest's slots from `addr` to `ceiling`,
    /// so a placement near the top of its slot does not read the trees of
    /// the slots above, which other range writers are changing.
    pub(crate) fn find_after_below(&self, addr: u64, ceiling: u64) -> Option<VmaRef> {
        self.mm
            .tree
            .find_after_below(addr, ceiling, self.pin)
            .map(|(_, v)| *v)
    }

    /// The lowest (or, with `top_down`, the highest) page-aligned free
    /// range of `len` bytes inside `[low, high)` (Linux's
    /// `unmapped_area` and `unmapped_area_topdown`) whose range, a page
    /// wider on each side, meets no range held or waited for in `busy`.
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
            let Some((a, w)) = self.busy.and_then(|b| b.busy_near(Range::new(lo, hi))) else {
                return Some(s);
            };
            self.skipped.set(Some(w));
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

#[cfg(all(test, not(aspace_loom)))]
mod tests {
    use super::*;
    use crate::mm::range_read::tests::space;
    use crate::{MapFlags, Prot};

    const A: u64 = 0x4000_0000;
    const P: u64 = PAGE_SIZE;

    /// Maps `[A + lo * P, A + hi * P)`, alternating protections so that
    /// neighbours do not merge.
    fn map(mm: &AddressSpace, lo: u64, hi: u64, prot: Prot) {
        let flags = MapFlags::PRIVATE | MapFlags::ANONYMOUS | MapFlags::FIXED;
        mm.mmap(A + lo * P, (hi - lo) * P, prot, flags).unwrap();
    }

    fn pages(lo: u64, hi: u64) -> Range {
        Range::new(A + lo * P, A + hi * P)
    }

    /// The hull is `r` widened to the whole of every VMA it meets, in
    /// each case of its lookups: `r` in one VMA, in a hole beside one, in
    /// a hole alone, across several VMAs and holes (the second lookup),
    /// and ending inside a VMA that starts past the first one `r` meets.
    #[test]
    fn the_hull_holds_every_vma_met_whole_and_nothing_else() {
        let mm = space();
        map(&mm, 10, 20, Prot::READ | Prot::WRITE);
        map(&mm, 20, 30, Prot::READ);
        map(&mm, 40, 50, Prot::READ | Prot::WRITE);
        let pin = mm.tree.pin();
        let hull = |lo, hi| vma_hull(&mm, pages(lo, hi), &pin);
        // Inside one VMA: that VMA (one lookup).
        assert_eq!(hull(12, 15), pages(10, 20));
        // A hole up to a VMA that reaches past the end: the hole and it.
        assert_eq!(hull(35, 41), pages(35, 50));
        // A hole alone: itself.
        assert_eq!(hull(32, 38), pages(32, 38));
        // From inside the first VMA to inside the third: all three whole.
        assert_eq!(hull(15, 45), pages(10, 50));
        // From inside the first to inside the second, which it touches.
        assert_eq!(hull(15, 25), pages(10, 30));
        // From a hole to a hole, over a VMA: the hole ends kept.
        assert_eq!(hull(5, 35), pages(5, 35));
        // Ending inside a VMA that is not the first met: grown to its end.
        assert_eq!(hull(25, 41), pages(20, 50));
        // Empty: itself.
        assert_eq!(vma_hull(&mm, Range::new(A, A), &pin), Range::new(A, A));
    }

    /// A neighbourhood is the range a page wider on each side, grown to
    /// the VMAs there; with `Reach::Hole`, also the holes on either side
    /// up to the next VMAs.
    #[test]
    fn a_neighbourhood_reaches_a_page_past_its_range_and_munmaps_the_holes() {
        let mm = space();
        map(&mm, 10, 20, Prot::READ | Prot::WRITE);
        map(&mm, 40, 50, Prot::READ | Prot::WRITE);
        let pin = mm.tree.pin();
        // Touching the VMA below through the margin page.
        assert_eq!(
            neighbourhood(&mm, pages(20, 25), Reach::Vmas, &pin),
            pages(10, 26)
        );
        // Inside a VMA: the VMA.
        assert_eq!(
            neighbourhood(&mm, pages(12, 14), Reach::Vmas, &pin),
            pages(10, 20)
        );
        // An unmap in the hole: the hole whole, up to both VMAs.
        assert_eq!(
            neighbourhood(&mm, pages(25, 30), Reach::Hole, &pin),
            pages(20, 40)
        );
    }
}
