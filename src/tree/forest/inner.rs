//! One slot's tree read and written alone, by the holder of the whole
//! slot.
//!
//! The forest's calls find the slot of each address, join the pieces an
//! entry leaves in neighbouring slots, and take a slot's writer per store;
//! each is a few instructions, but together they are code the single
//! tree's caller never runs. A writer that holds a whole slot against
//! every other writer (the owner of the slot's bias in the range lock)
//! whose slot never held a piece reaching one of its ends ("Edges" in the
//! forest's docs) knows more: every entry that meets the slot lies inside
//! it, whole, in the slot's tree. Then:
//! - a lookup of an address in the slot is that tree's lookup, and a
//!   neighbour search that finds nothing in the slot continues from the
//!   slot's end (or start) through the forest; a search bounded inside
//!   the slot (the table frees' `prev_above` and `find_after_below`),
//!   and a walk of a range inside it, are that tree's alone;
//! - a store of a range strictly inside the slot is that tree's store (it
//!   reaches neither end, so the bit stays clear); a store that reaches
//!   an end goes through the forest's writer, which sets the bit, and the
//!   view must not be used after it ([`InnerSlot::keeps`]);
//! - an erase inside the slot is that tree's erase (an erase never makes
//!   a piece).
//!
//! The writer of a forest's one tree (a forest of one slot, or a
//! unified one, whose writer holds it for its whole life) has the same
//! view of the whole key space ([`ForestWriter::one_tree`]): its lookups
//! skip the forest's check for the one tree, and the same code serves
//! both.
//!
//! The forest's proptest (`forest/tests.rs`) stores and erases through
//! the view beside the single tree and reads every slot the view serves
//! through it; it fails with a view that keeps a store reaching the
//! slot's end (the edges bit then stays clear), with a neighbour search
//! that stops at the slot's end, and with the view's writer not
//! recording the slot as written (walks then skip it).
//!
//! The holder's lock keeps every other writer of the slot out, and its
//! grant orders their stores (and their bits) before its load of the
//! bit. Writers of other slots store only inside their own, so nothing
//! they do reaches into this one. Readers are unaffected: the stores are
//! the slot tree's own, one atomic step each, as through the forest.
//!
//! That hold is the slot tree's writer lock too: the view's stores skip
//! the tree's mutex ([`RangeTree::external_writer`]), whose lock and
//! unlock each waited for the edit's earlier stores to drain (3.4% of the
//! owner's writers-only call). loom's tracked cell over the tree's spare
//! node memory checks that no other writer's access overlaps the
//! owner's or goes unordered with it: the `range_slot_bias_*` models
//! (`loom_tests/range_writers.rs`) run the view's writer, and a forest
//! writer that skipped the mutex without such a hold fails
//! `forest_writers_in_one_slot` (`loom_tests/tree.rs`) and
//! `range_placements_race_for_one_gap` (`loom_tests/range_writers.rs`).

use super::{ForestWriter, RangeForest, RangeTree, TreeWriter};
use crate::addr::Range;
use crate::reclaim::Guard;

/// A view of one slot of a [`RangeForest`] whose tree holds every entry
/// meeting the slot whole (module docs), for the holder of that slot.
/// Three words (it lives in every edit): its calls take the forest, for
/// what lies outside the slot.
pub(crate) struct InnerSlot<'f, V> {
    /// The slot's tree.
    /// Protected by: its own fields (see [`RangeTree`]).
    tree: &'f RangeTree<V>,
    /// The slot's addresses.
    /// Protected by: a value.
    span: Range,
}

impl<V: Clone + PartialEq + Send + Sync + 'static> RangeForest<V> {
    /// The view of the slot whose addresses are exactly `span`, for a
    /// caller that holds all of `span` against every other writer of the
    /// forest: `None` unless the forest is split into slots, `span` is
    /// one slot, and that slot never held a piece reaching one of its
    /// ends (module docs).
    ///
    /// # Safety
    /// While the view is used, the caller's lock must keep every other
    /// writer of the forest out of `span` and order the slot's writers
    /// as [`RangeTree::external_writer`] requires: the view's
    /// [`writer`](InnerSlot::writer) is one.
    #[inline]
    pub(crate) unsafe fn inner_slot(&self, span: Range) -> Option<InnerSlot<'_, V>> {
        if span.is_empty() || self.edges_touched(span.start) {
            // One tree (the forest's calls are the tree's already), still
            // unified, or a slot with entries reaching past it.
            return None;
        }
        let k = self.slot_of(span.start);
        (span.start == self.start(k) && span.end == self.end(k)).then(|| InnerSlot {
            tree: &self.all()[k],
            span,
        })
    }
}

impl<'t, V: Clone + PartialEq + Send + Sync + 'static> ForestWriter<'t, V> {
    /// The one tree this writer holds for its whole life (a forest of
    /// one slot, or a unified one), as a view of the whole key space:
    /// every entry lies in it whole, and no other writer runs while this
    /// one lives. `None` for a writer of slots.
    ///
    /// # Safety
    /// The view must not be used after this writer is dropped: a unified
    /// tree stays linked only while its writer mutex is held (the split
    /// waits for it), and alive only while the writer's pin is. Nor may
    /// its [`writer`](InnerSlot::writer) be taken: this writer is the
    /// tree's one, for its whole life.
    #[inline]
    pub(crate) unsafe fn one_tree(&self) -> Option<InnerSlot<'t, V>> {
        match &self.held {
            Some((_, w)) if self.one => Some(InnerSlot {
                tree: w.tree(),
                span: Range::new(0, u64::MAX),
            }),
            _ => None,
        }
    }
}

/// The forest's lookups, out of line: where a view does not serve (an
/// address outside its slot, a search past its end, a writer without a
/// view), its callers call these, and keep only the view's tree calls
/// inline (the owners' paths run those, and the paths' code is what
/// their instruction cache holds).
impl<V: Clone + PartialEq + Send + Sync + 'static> RangeForest<V> {
    /// [`RangeForest::find`], out of line.
    #[inline(never)]
    pub(crate) fn find_outlined<'g>(&'g self, addr: u64, g: &'g Guard) -> Option<(Range, &'g V)> {
        self.find(addr, g)
    }

    /// [`RangeForest::find_after`], out of line.
    #[inline(never)]
    pub(crate) fn find_after_outlined<'g>(
        &'g self,
        addr: u64,
        g: &'g Guard,
    ) -> Option<(Range, &'g V)> {
        self.find_after(addr, g)
    }

    /// [`RangeForest::prev`], out of line.
    #[inline(never)]
    pub(crate) fn prev_outlined<'g>(&'g self, addr: u64, g: &'g Guard) -> Option<(Range, &'g V)> {
        self.prev(addr, g)
    }

    /// [`RangeForest::prev_above`], out of line.
    #[inline(never)]
    pub(crate) fn prev_above_outlined<'g>(
        &'g self,
        addr: u64,
        floor: u64,
        g: &'g Guard,
    ) -> Option<(Range, &'g V)> {
        self.prev_above(addr, floor, g)
    }

    /// [`RangeForest::find_after_below`], out of line.
    #[inline(never)]
    pub(crate) fn find_after_below_outlined<'g>(
        &'g self,
        addr: u64,
        ceiling: u64,
        g: &'g Guard,
    ) -> Option<(Range, &'g V)> {
        self.find_after_below(addr, ceiling, g)
    }

    /// [`RangeForest::range`] as a list, out of line.
    #[inline(never)]
    pub(crate) fn range_outlined<'g>(&'g self, r: Range, g: &'g Guard) -> Vec<(Range, &'g V)> {
        self.range(r, g).collect()
    }
}

impl<'f, V: Clone + PartialEq + Send + Sync + 'static> InnerSlot<'f, V> {
    /// True if a store of `r` keeps the view valid: `r` lies strictly
    /// inside the slot, reaching neither end.
    #[inline]
    pub(crate) fn keeps(&self, r: Range) -> bool {
        self.span.start < r.start && r.end < self.span.end
    }

    /// True if `r` lies in the slot (ends included): an erase of it, or
    /// a walk of it, is the slot tree's alone.
    #[inline]
    pub(crate) fn holds(&self, r: Range) -> bool {
        self.span.contains_range(&r)
    }

    /// The slot's writer, for this store, the slot recorded as written
    /// first (the forest's walks visit only such slots). It skips the
    /// slot tree's mutex: the view's holder keeps every other writer of
    /// the slot out ([`RangeForest::inner_slot`]'s contract).
    #[inline]
    pub(crate) fn writer(&self, forest: &RangeForest<V>) -> TreeWriter<'f, V> {
        // SAFETY: the view was made by `inner_slot`, whose caller holds
        // the whole slot, against every other writer, in a lock that
        // orders them (`one_tree`'s views never get here: its contract).
        let w = unsafe { self.tree.external_writer() };
        forest.mark_written(forest.slot_of(self.span.start));
        w
    }

    /// [`RangeForest::find`].
    #[inline]
    pub(crate) fn find<'g>(
        &'g self,
        forest: &'g RangeForest<V>,
        addr: u64,
        g: &'g Guard,
    ) -> Option<(Range, &'g V)> {
        if self.span.contains(addr) {
            self.tree.find(addr, g)
        } else {
            forest.find_outlined(addr, g)
        }
    }

    /// [`RangeForest::find_after`].
    #[inline]
    pub(crate) fn find_after<'g>(
        &'g self,
        forest: &'g RangeForest<V>,
        addr: u64,
        g: &'g Guard,
    ) -> Option<(Range, &'g V)> {
        if !self.span.contains(addr) {
            return forest.find_after_outlined(addr, g);
        }
        // Nothing after `addr` in the slot: the first entry beyond it
        // (none reaches back into it).
        self.tree
            .find_after(addr, g)
            .or_else(|| forest.find_after_outlined(self.span.end, g))
    }

    /// [`RangeForest::prev`].
    #[inline]
    pub(crate) fn prev<'g>(
        &'g self,
        forest: &'g RangeForest<V>,
        addr: u64,
        g: &'g Guard,
    ) -> Option<(Range, &'g V)> {
        if addr <= self.span.start || addr > self.span.end {
            return forest.prev_outlined(addr, g);
        }
        // Nothing before `addr` in the slot: the last entry below it.
        self.tree
            .prev(addr, g)
            .or_else(|| forest.prev_outlined(self.span.start, g))
    }

    /// [`RangeForest::prev_above`]: the slot tree's own where `floor`
    /// and `addr` lie in the slot (an entry below the slot ends at or
    /// below its start, so at or below `floor`).
    #[inline]
    pub(crate) fn prev_above<'g>(
        &'g self,
        forest: &'g RangeForest<V>,
        addr: u64,
        floor: u64,
        g: &'g Guard,
    ) -> Option<(Range, &'g V)> {
        if self.span.start <= floor && addr <= self.span.end {
            self.tree.prev(addr, g).filter(|(w, _)| w.end > floor)
        } else {
            forest.prev_above_outlined(addr, floor, g)
        }
    }

    /// [`RangeForest::find_after_below`]: the slot tree's own where
    /// `addr` and `ceiling` lie in the slot (an entry above the slot
    /// starts at or above its end, so at or above `ceiling`).
    #[inline]
    pub(crate) fn find_after_below<'g>(
        &'g self,
        forest: &'g RangeForest<V>,
        addr: u64,
        ceiling: u64,
        g: &'g Guard,
    ) -> Option<(Range, &'g V)> {
        if self.span.start <= addr && ceiling <= self.span.end {
            self.tree
                .find_after(addr, g)
                .filter(|(w, _)| w.start < ceiling)
        } else {
            forest.find_after_below_outlined(addr, ceiling, g)
        }
    }

    /// Calls `f` on each entry intersecting `r`, in ascending order, as
    /// [`range`](Self::range) lists them, with no list inside the slot.
    #[inline]
    pub(crate) fn each_in<'g>(
        &'g self,
        forest: &'g RangeForest<V>,
        r: Range,
        g: &'g Guard,
        mut f: impl FnMut(Range, &'g V),
    ) {
        if self.holds(r) {
            self.tree.walk(r, g, f);
        } else {
            for (e, v) in forest.range_outlined(r, g) {
                f(e, v);
            }
        }
    }

    /// [`RangeForest::range`], as a list.
    #[inline]
    pub(crate) fn range<'g>(
        &'g self,
        forest: &'g RangeForest<V>,
        r: Range,
        g: &'g Guard,
    ) -> Vec<(Range, &'g V)> {
        if self.holds(r) && !r.is_empty() {
            self.tree.range_vec(r, g)
        } else {
            forest.range_outlined(r, g)
        }
    }
}
