//! A forest of range trees: the address space cut into fixed slots, each
//! its own [`RangeTree`] (root pointer, writer mutex, node cache), so that
//! writers on different slots commit at once.
//!
//! The single tree has one root and one writer mutex: every commit copies
//! the path to that root and swaps it, so two range writers
//! (`WriterLocking::Range`) on ranges terabytes apart still take turns on
//! the mutex and bounce the root's line between their CPUs. The forest
//! gives each aligned slot of `1 << shift` bytes (512 GiB for the address
//! space, [`crate::pt::ROOT_ENTRY_SPAN`]; the last slot reaches the top of
//! `u64`) a tree of its own. With one slot it is the single tree: lookups
//! pay one index and one root load, and a writer holds the slot's mutex
//! for its whole life as before.
//!
//! # Entries across slots
//!
//! An entry crossing a slot boundary is stored clipped, one piece in each
//! slot it overlaps. Values have identity (`PartialEq`: a `VmaRef` is a
//! pointer), and every read merges the pieces of one value that meet at a
//! slot boundary, so callers see the entries the single tree would hold.
//! Two distinct entries of equal value meeting exactly at a boundary read
//! as one; the address space never keeps such a pair past one edit (it
//! merges or re-stores them), and with distinct values the forest and the
//! single tree agree on every read (the property tests below compare them
//! after each step).
//!
//! # Concurrency: what each writer touches
//!
//! A write over `r` visits the slots `r` overlaps in ascending order, each
//! under that slot's mutex only, and there runs the single tree's write
//! (one path copy, one `Release` store of the slot's root). So:
//! - writers in different slots share no line of the forest: each has its
//!   slot's root, length, mutex and node cache (padded to their own cache
//!   lines);
//! - writers in one slot take turns on its mutex (one path copy each), as
//!   all writers did on the single tree;
//! - writers of *overlapping* ranges must be kept apart by the caller (the
//!   address space's range lock, or its mmap_lock): a write crossing a
//!   boundary is one atomic step per slot, not one for the whole range,
//!   and two such writes could otherwise interleave slot by slot.
//!
//! Readers pin the (shared, epoch) reclaimer once and load each slot's
//! root with `Acquire`, as they load the single root. Every address lies
//! in exactly one slot, so each write stays atomic *per address*: an
//! address mapped before and after a store never reads unmapped. A reader
//! that looks across a boundary while a crossing store is between two
//! slots sees the new value on one side and the old one on the other; the
//! pieces then have different values and are not merged, so it sees two
//! entries, each correct for every address it covers. Only whole-space
//! snapshots (`iter` of a changing space) can see such a mix, and the
//! address space takes those under its whole-space lock.
//!
//! Whole-space writes ([`ForestWriter::replace_all`],
//! [`ForestWriter::retain`]: fork, exec, purges) run slot by slot as well.
//!
//! # Walks
//!
//! A walk of many slots ([`range`](RangeForest::range), and so
//! [`iter`](RangeForest::iter)) visits only the slots a writer has ever
//! taken: a space's mappings lie in a few of its 256 slots, and a walk
//! of all of them (a whole-space reader's, `vmas()`, fork) loaded every
//! slot's root line, each its own. A slot's bit is set before its
//! writer's first store there and never cleared, so a slot left unvisited
//! was empty when the walk loaded the bit: a walk under the space's
//! whole-space lock (no writer runs) sees every entry, and one that
//! races writers reads such a slot as before their first store, as it
//! reads every slot at some moment of its own.
//!
//! # Edges
//!
//! A second bit per slot is set (once, never cleared) by a writer that
//! stores a piece reaching one of the slot's ends: an entry that crosses
//! a boundary, or one that starts or ends on it. A slot whose bit is
//! clear holds only entries strictly inside it, so a range a page inside
//! the slot meets no entry that reaches past it, and neither do its
//! neighbours. The range lock's owner of a slot's bias reads the bit
//! ([`RangeForest::edges_touched`]) to skip computing its neighbourhood
//! (`mm::edit::lock_validated`): it holds the whole slot, so no writer of
//! that slot runs while it reads, and the grant orders the last one's
//! stores before the load. The property tests check that every slot
//! holding such a piece has its bit. The same holder reads and writes
//! such a slot through its tree alone (`forest/inner.rs`,
//! [`InnerSlot`]), skipping the slot arithmetic and piece joining.
//!
//! # Unified until split
//!
//! A forest made with [`RangeForest::sliced_unified`] is one tree until
//! [`RangeForest::split`] moves its entries into the slots (range mode's,
//! while the range lock's bias holds); `forest/unified.rs` has the
//! argument.
//!
//! # Free-area searches
//!
//! [`gap_highest`](RangeForest::gap_highest) visits the slots the window
//! overlaps top-down, carrying the lowest entry start found above: slot `k`
//! is searched for holes at or above its first entry, with the hole above
//! its last entry reaching up to that carried start (which may lie slots
//! higher). An empty slot lies inside the hole that reaches down from
//! that start: the highest fit there starting at or above the slot's
//! start is the hole's highest fit whatever lies below, so the search
//! stops there (a search in an empty space visits one slot, not all).
//! After the lowest slot, the hole below every entry found is
//! tried. This visits exactly the holes of the single tree, highest first,
//! and fits each with the same arithmetic, so the answer is the single
//! tree's (Linux placement equality, `tests/kernel_diff.rs`).
//! [`gap_lowest`](RangeForest::gap_lowest) is the mirror image.
//!
//! # Locking
//!
//! Each slot's writer mutex is level 3 of the lock order in [`crate::mm`];
//! no writer holds two at once. A caller whose own lock holds a whole
//! slot against every other writer stores inside it without that mutex
//! ([`InnerSlot`](inner)). Reads take no lock.

use super::{Around, RangeTree, TreeError, TreeWriter};
use crate::addr::Range;
use crate::reclaim::{Guard, Reclaimer};
use crate::sync::{AtomicPtr, AtomicU64, Ordering};
use crossbeam_utils::CachePadded;

/// The most slots a forest is cut into (a larger space gets larger slots).
const MAX_SLOTS: u64 = 4096;

/// The slots of `[0, space_end)` cut by `1 << shift` (at least 4 KiB):
/// the shift, raised until at most 4096 slots cover the space, and the
/// slot count. The range lock's shards are cut alike, so that a shard is
/// a slot.
pub(crate) fn slot_geometry(shift: u32, space_end: u64) -> (u32, usize) {
    let mut shift = shift.clamp(12, 63);
    while (space_end >> shift) > MAX_SLOTS {
        shift += 1;
    }
    (shift, space_end.div_ceil(1 << shift).max(1) as usize)
}

/// Range trees over fixed slots of the key space, read as one tree.
pub struct RangeForest<V> {
    /// log2 of a slot's size.
    /// Protected by: immutable after construction.
    shift: u32,
    /// The slots' trees, each on its own cache lines.
    /// Protected by: each tree's own fields (see [`RangeTree`]).
    trees: Trees<V>,
    /// A unified forest's one tree, holding every entry until
    /// [`split`](RangeForest::split) (module docs, "Unified until split");
    /// null otherwise.
    /// Protected by: its own writer mutex for the one store that unlinks
    /// it (`Release`, by `split`, which then retires it through slot 0's
    /// reclaimer); readers and writers load it (`Acquire`) pinned.
    unified: AtomicPtr<RangeTree<V>>,
}

/// A forest's trees: one kept inline (making a space allocates nothing
/// until it is used, `tests/creation.rs`), or one per slot.
enum Trees<V> {
    One(CachePadded<RangeTree<V>>),
    Many {
        /// The slots' trees.
        trees: Box<[CachePadded<RangeTree<V>>]>,
        /// Set for every slot a writer has taken: walks of many slots
        /// visit only those (module docs, "Walks").
        /// Protected by: set (`Release`) by the slot's writer before its
        /// first store there, under the slot's mutex; loaded (`Acquire`)
        /// by walks.
        written: SlotBits,
        /// Set for every slot that holds or once held a piece reaching
        /// one of its ends (an entry across a boundary, or one that ends
        /// at it): "Edges" in the module docs.
        /// Protected by: set by the slot's writer as it stores such a
        /// piece; read ([`RangeForest::edges_touched`]) by a caller that
        /// keeps that slot's writers out.
        edges: SlotBits,
    },
}

/// One bit per slot, each set once and never cleared.
struct SlotBits(Box<[AtomicU64]>);

impl SlotBits {
    /// `n` slots' bits, all clear.
    fn new(n: usize) -> Self {
        SlotBits((0..n.div_ceil(64)).map(|_| AtomicU64::new(0)).collect())
    }

    /// The word holding slot `k`'s bit, and the bit.
    #[inline]
    fn at(&self, k: usize) -> (&AtomicU64, u64) {
        (&self.0[k / 64], 1u64 << (k % 64))
    }

    /// Sets slot `k`'s bit: a load, and a read-modify-write (`order`) the
    /// first time only, so the line stays shared among writers.
    #[inline]
    fn set(&self, k: usize, order: Ordering) {
        let (word, bit) = self.at(k);
        if word.load(Ordering::Relaxed) & bit == 0 {
            word.fetch_or(bit, order);
        }
    }

    /// True if slot `k`'s bit is set (loaded with `order`).
    #[inline]
    fn get(&self, k: usize, order: Ordering) -> bool {
        let (word, bit) = self.at(k);
        word.load(order) & bit != 0
    }
}

impl<V> RangeForest<V> {
    /// Every slot's tree, in address order.
    #[inline]
    fn all(&self) -> &[CachePadded<RangeTree<V>>] {
        match &self.trees {
            Trees::One(t) => core::slice::from_ref(t),
            Trees::Many { trees, .. } => trees,
        }
    }
}

impl<V> core::fmt::Debug for RangeForest<V> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RangeForest")
            .field("shift", &self.shift)
            .field("slots", &self.all().len())
            .field("unified", &!self.unified.load(Ordering::Relaxed).is_null())
            .finish()
    }
}

impl<V: Clone + PartialEq + Send + Sync + 'static> RangeForest<V> {
    /// A forest of one slot: the single tree.
    pub fn single(reclaimer: Reclaimer) -> Self {
        RangeForest {
            shift: 63,
            trees: Trees::One(CachePadded::new(RangeTree::with_reclaimer(reclaimer))),
            unified: AtomicPtr::new(core::ptr::null_mut()),
        }
    }

    /// A forest of slots of `1 << shift` bytes (`shift` in `12..64`)
    /// covering `[0, space_end)`, the last one reaching the top of `u64`;
    /// slots grow where `space_end` would need more than 4096 of them.
    /// `reclaimer` makes each slot's policy: they must share one epoch
    /// (any [`Reclaimer::epoch`] does), since one pin covers every slot.
    pub fn sliced(shift: u32, space_end: u64, mut reclaimer: impl FnMut() -> Reclaimer) -> Self {
        let (shift, n) = slot_geometry(shift, space_end);
        RangeForest {
            shift,
            trees: Trees::Many {
                trees: (0..n)
                    .map(|_| CachePadded::new(RangeTree::with_reclaimer(reclaimer())))
                    .collect(),
                written: SlotBits::new(n),
                edges: SlotBits::new(n),
            },
            unified: AtomicPtr::new(core::ptr::null_mut()),
        }
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.all().len()
    }

    /// The one tree holding every entry, if there is one: a forest of one
    /// slot (every mode but range writers), or a unified one. The calls
    /// below then run the single tree's own, with no slot arithmetic or
    /// piece joining on the way.
    #[inline]
    fn one<'g>(&'g self, _g: &'g Guard) -> Option<&'g RangeTree<V>> {
        match &self.trees {
            Trees::One(t) => Some(t),
            Trees::Many { .. } => {
                let p = self.unified.load(Ordering::Acquire);
                // SAFETY: a non-null `unified` is a live tree: `split`
                // unlinks it before retiring it through the reclaimer
                // this forest's pins come from, so it stays valid while
                // `_g`, pinned before this load, lives.
                unsafe { p.as_ref() }
            }
        }
    }

    /// The slot holding `addr`.
    #[inline]
    fn slot_of(&self, addr: u64) -> usize {
        ((addr >> self.shift) as usize).min(self.all().len() - 1)
    }

    /// The first address of slot `k`.
    #[inline]
    fn start(&self, k: usize) -> u64 {
        if k == 0 {
            0
        } else {
            (k as u64) << self.shift
        }
    }

    /// The end of slot `k` (the last slot reaches `u64::MAX`).
    #[inline]
    fn end(&self, k: usize) -> u64 {
        if k + 1 == self.all().len() {
            u64::MAX
        } else {
            ((k + 1) as u64) << self.shift
        }
    }

    /// The slots `r` (non-empty) overlaps.
    fn slots_of(&self, r: Range) -> core::ops::RangeInclusive<usize> {
        self.slot_of(r.start)..=self.slot_of(r.end - 1)
    }

    /// Records that slot `k` is about to be written (before its writer's
    /// first store): a load, and a read-modify-write the first time only,
    /// so the line stays shared among writers.
    #[inline]
    fn mark_written(&self, k: usize) {
        if let Trees::Many { written, .. } = &self.trees {
            written.set(k, Ordering::Release);
        }
    }

    /// False if slot `k` was never written (then it is empty).
    #[inline]
    fn ever_written(&self, k: usize) -> bool {
        match &self.trees {
            Trees::Many { written, .. } => written.get(k, Ordering::Acquire),
            Trees::One(_) => true,
        }
    }

    /// Records that slot `k` holds `piece`, if it reaches one of the
    /// slot's ends ([`edges_touched`](Self::edges_touched)): a compare,
    /// and for such a piece a load (a read-modify-write the first time).
    #[inline]
    fn note_edges(&self, k: usize, piece: Range) {
        if let Trees::Many { edges, .. } = &self.trees {
            if piece.start == self.start(k) || piece.end == self.end(k) {
                edges.set(k, Ordering::Relaxed);
            }
        }
    }

    /// False if the slot of `addr` never held a piece that reaches one of
    /// its ends: every entry meeting the slot then lies inside it, away
    /// from both ends ("Edges" in the module docs). True for a forest of
    /// one tree, or one still unified. Exact only while no writer of that
    /// slot runs: the caller keeps them out (the range lock's holder of
    /// the whole slot), and the lock's grant orders their stores before
    /// this load.
    #[inline]
    pub fn edges_touched(&self, addr: u64) -> bool {
        match &self.trees {
            Trees::Many { edges, .. } if self.unified.load(Ordering::Acquire).is_null() => {
                edges.get(self.slot_of(addr), Ordering::Relaxed)
            }
            _ => true,
        }
    }

    /// The part of `r` inside slot `k`.
    fn clip(&self, r: Range, k: usize) -> Range {
        Range::new(r.start.max(self.start(k)), r.end.min(self.end(k)))
    }

    /// Pins the calling thread; read while the guard lives.
    #[inline]
    pub fn pin(&self) -> Guard {
        self.all()[0].pin()
    }

    /// `r`, a piece of the entry of value `v`, grown over the pieces of
    /// `v` that continue it across slot boundaries.
    #[inline]
    fn whole(&self, r: Range, v: &V, g: &Guard) -> Range {
        // Only a piece with an end on a slot boundary may continue: one
        // test on the lookup path (never true with one slot).
        let mask = (1u64 << self.shift) - 1;
        if self.all().len() == 1 || (r.start & mask != 0 && r.end & mask != 0) {
            return r;
        }
        self.grow(r, v, g)
    }

    /// [`whole`](Self::whole) for a piece on a boundary.
    fn grow(&self, mut r: Range, v: &V, g: &Guard) -> Range {
        let mut k = self.slot_of(r.start);
        while k > 0 && r.start == self.start(k) {
            match self.all()[k - 1].find(r.start - 1, g) {
                Some((p, pv)) if pv == v && p.end == r.start => r.start = p.start,
                _ => break,
            }
            k -= 1;
        }
        let mut k = self.slot_of(r.end - 1);
        while k + 1 < self.all().len() && r.end == self.end(k) {
            match self.all()[k + 1].find(r.end, g) {
                Some((p, pv)) if pv == v && p.start == r.end => r.end = p.end,
                _ => break,
            }
            k += 1;
        }
        r
    }

    /// The entry containing `addr`.
    #[inline]
    pub fn find<'g>(&'g self, addr: u64, g: &'g Guard) -> Option<(Range, &'g V)> {
        if let Some(t) = self.one(g) {
            return t.find(addr, g);
        }
        let (r, v) = self.all()[self.slot_of(addr)].find(addr, g)?;
        Some((self.whole(r, v, g), v))
    }

    /// The entry containing `addr`, with a view of the leaf that holds
    /// it (see [`ForestAround`]).
    #[inline]
    pub fn find_around<'g>(&'g self, addr: u64, g: &'g Guard) -> Option<ForestAround<'g, V>> {
        if let Some(t) = self.one(g) {
            let leaf = t.find_around(addr, g)?;
            return Some(ForestAround {
                range: leaf.entry().0,
                leaf,
                cut_lo: None,
                cut_hi: None,
            });
        }
        let k = self.slot_of(addr);
        let leaf = self.all()[k].find_around(addr, g)?;
        let (r, v) = leaf.entry();
        Some(ForestAround {
            range: self.whole(r, v, g),
            leaf,
            cut_lo: (k > 0).then(|| self.start(k)),
            cut_hi: (k + 1 < self.all().len()).then(|| self.end(k)),
        })
    }

    /// The first entry whose end is above `addr` (Linux's `find_vma`).
    pub fn find_after<'g>(&'g self, addr: u64, g: &'g Guard) -> Option<(Range, &'g V)> {
        if let Some(t) = self.one(g) {
            return t.find_after(addr, g);
        }
        (self.slot_of(addr)..self.all().len()).find_map(|k| {
            let (r, v) = self.all()[k].find_after(addr, g)?;
            Some((self.whole(r, v, g), v))
        })
    }

    /// The last entry whose end is at or below `addr`.
    pub fn prev<'g>(&'g self, addr: u64, g: &'g Guard) -> Option<(Range, &'g V)> {
        if let Some(t) = self.one(g) {
            return t.prev(addr, g);
        }
        let (r, v) = (0..=self.slot_of(addr))
            .rev()
            .find_map(|k| self.all()[k].prev(addr, g))?;
        let w = self.whole(r, v, g);
        if w.end <= addr {
            return Some((w, v));
        }
        // The piece found continues past `addr`: the entry before it ends
        // at or below its start.
        self.prev(w.start, g)
    }

    /// [`prev`](Self::prev) if that entry ends above `floor`: scans only
    /// the slots from `floor` to `addr` (a lookup near the top of an
    /// otherwise empty space does not visit every slot below).
    pub fn prev_above<'g>(&'g self, addr: u64, floor: u64, g: &'g Guard) -> Option<(Range, &'g V)> {
        if let Some(t) = self.one(g) {
            return t.prev(addr, g).filter(|(w, _)| w.end > floor);
        }
        let (r, v) = (self.slot_of(floor.min(addr))..=self.slot_of(addr))
            .rev()
            .find_map(|k| self.all()[k].prev(addr, g))?;
        let w = self.whole(r, v, g);
        if w.end <= addr {
            return (w.end > floor).then_some((w, v));
        }
        self.prev_above(w.start, floor, g)
    }

    /// [`find_after`](Self::find_after) if that entry starts below
    /// `ceiling`: scans only the slots from `addr` to `ceiling`.
    pub fn find_after_below<'g>(
        &'g self,
        addr: u64,
        ceiling: u64,
        g: &'g Guard,
    ) -> Option<(Range, &'g V)> {
        if let Some(t) = self.one(g) {
            return t.find_after(addr, g).filter(|(w, _)| w.start < ceiling);
        }
        let last = self.slot_of(ceiling.saturating_sub(1).max(addr));
        (self.slot_of(addr)..=last)
            .find_map(|k| {
                let (r, v) = self.all()[k].find_after(addr, g)?;
                Some((self.whole(r, v, g), v))
            })
            .filter(|(w, _)| w.start < ceiling)
    }

    /// The first entry whose start is at or above `addr`.
    pub fn next<'g>(&'g self, addr: u64, g: &'g Guard) -> Option<(Range, &'g V)> {
        if let Some(t) = self.one(g) {
            return t.next(addr, g);
        }
        let (r, v) =
            (self.slot_of(addr)..self.all().len()).find_map(|k| self.all()[k].next(addr, g))?;
        let w = self.whole(r, v, g);
        if w.start >= addr {
            return Some((w, v));
        }
        // The piece found continues an entry that starts below `addr`.
        self.next(w.end, g)
    }

    /// The entries intersecting `r`, in ascending order.
    pub fn range<'g>(
        &'g self,
        r: Range,
        g: &'g Guard,
    ) -> impl Iterator<Item = (Range, &'g V)> + 'g {
        if let Some(t) = self.one(g) {
            return t.range_vec(r, g).into_iter();
        }
        let mut out: Vec<(Range, &'g V)> = Vec::new();
        if !r.is_empty() {
            let ks = self.slots_of(r);
            let one = (ks.start() == ks.end()).then(|| *ks.start());
            if let Some(k) = one {
                // One slot (always, with one): its list as it is.
                out = self.all()[k].range_vec(r, g);
            }
            for k in ks.filter(|&k| one.is_none() && self.ever_written(k)) {
                let cut = (k > 0).then(|| self.start(k));
                append(&mut out, self.all()[k].range_vec(r, g), cut);
            }
            // The first and the last may continue beyond the slots of `r`.
            if let Some((l, v)) = out.first_mut() {
                *l = self.whole(*l, v, g);
            }
            if let Some((l, v)) = out.last_mut() {
                *l = self.whole(*l, v, g);
            }
        }
        out.into_iter()
    }

    /// All entries in ascending order.
    pub fn iter<'g>(&'g self, g: &'g Guard) -> impl Iterator<Item = (Range, &'g V)> + 'g {
        self.range(Range::new(0, u64::MAX), g)
    }

    /// Number of stored pieces (an entry crossing `n` boundaries counts
    /// `n + 1`; a figure, as [`RangeTree::len`]).
    pub fn len(&self) -> usize {
        let g = self.pin();
        self.one(&g)
            .map_or_else(|| self.all().iter().map(|t| t.len()).sum(), RangeTree::len)
    }

    /// True if there are no entries.
    pub fn is_empty(&self) -> bool {
        let g = self.pin();
        self.one(&g).map_or_else(
            || self.all().iter().all(|t| t.is_empty()),
            RangeTree::is_empty,
        )
    }

    /// Bytes of node memory reachable from the slots' roots (and a
    /// unified forest's one tree).
    pub fn memory_bytes(&self) -> usize {
        let g = self.pin();
        let unified = match &self.trees {
            Trees::One(_) => 0,
            Trees::Many { .. } => self.one(&g).map_or(0, RangeTree::memory_bytes),
        };
        unified + self.all().iter().map(|t| t.memory_bytes()).sum::<usize>()
    }

    /// The lowest `s`, a multiple of `align`, such that `[s, s + size)`
    /// lies inside `[lo, hi)` and overlaps no entry (the rules of
    /// [`RangeTree::gap_lowest`], and its answer).
    pub fn gap_lowest(&self, lo: u64, hi: u64, size: u64, align: u64, g: &Guard) -> Option<u64> {
        if let Some(t) = self.one(g) {
            return t.gap_lowest(lo, hi, size, align, g);
        }
        if size == 0 || lo >= hi || hi - lo < size {
            return None;
        }
        // The highest end of the entries below the slot searched.
        let mut below = 0;
        for k in self.slots_of(Range::new(lo, hi)) {
            let (fit, bounds) =
                self.all()[k].gap_in_slot::<true>(lo.max(below), hi, size, align, g);
            if fit.is_some() {
                return fit;
            }
            let Some((_, last)) = bounds else {
                // An empty slot: the hole from `below` covers it, and the
                // entries above start at or past its end, so a fit ending
                // inside it is the lowest (an empty space stops at its
                // first slot instead of visiting every one).
                match RangeTree::<V>::gap_free::<true>(
                    lo.max(below),
                    hi.min(self.end(k)),
                    size,
                    align,
                ) {
                    Some(s) => return Some(s),
                    None => continue,
                }
            };
            below = last;
            if last >= hi {
                return None;
            }
        }
        RangeTree::<V>::gap_free::<true>(lo.max(below), hi, size, align)
    }

    /// The highest `s`, a multiple of `align`, such that `[s, s + size)`
    /// lies inside `[lo, hi)` and overlaps no entry (the rules of
    /// [`RangeTree::gap_highest`], and its answer).
    pub fn gap_highest(&self, lo: u64, hi: u64, size: u64, align: u64, g: &Guard) -> Option<u64> {
        if let Some(t) = self.one(g) {
            return t.gap_highest(lo, hi, size, align, g);
        }
        if size == 0 || lo >= hi || hi - lo < size {
            return None;
        }
        // The lowest start of the entries above the slot searched.
        let mut above = u64::MAX;
        for k in self.slots_of(Range::new(lo, hi)).rev() {
            let (fit, bounds) =
                self.all()[k].gap_in_slot::<false>(lo, hi.min(above), size, align, g);
            if fit.is_some() {
                return fit;
            }
            let Some((first, _)) = bounds else {
                // An empty slot: the hole below `above` covers it, and the
                // entries below end at or before its start, so a fit
                // starting inside it is the highest (the mirror of
                // `gap_lowest`'s).
                match RangeTree::<V>::gap_free::<false>(
                    lo.max(self.start(k)),
                    hi.min(above),
                    size,
                    align,
                ) {
                    Some(s) => return Some(s),
                    None => continue,
                }
            };
            above = first;
            if first <= lo {
                return None;
            }
        }
        RangeTree::<V>::gap_free::<false>(lo, hi.min(above), size, align)
    }

    /// Takes the writer side: with one slot, that slot's writer mutex for
    /// the writer's whole life (as [`RangeTree::writer`]); with more, a
    /// write takes the mutex of each slot it changes, one at a time, and
    /// the writer keeps the last one until it writes another slot or is
    /// dropped (a whole-space edit, whose stores mostly meet one slot,
    /// then takes it once, not once per store). Writers of overlapping
    /// ranges must be kept apart by the caller.
    ///
    /// A writer of a unified forest writes its one tree, holding that
    /// tree's writer mutex for its whole life; [`split`](Self::split)
    /// waits for it.
    pub fn writer(&self) -> ForestWriter<'_, V> {
        if self.unified.load(Ordering::Acquire).is_null() {
            return self.sliced_writer();
        }
        let g = self.pin();
        // SAFETY: the writer keeps `g` (field order: its tree writer is
        // dropped first).
        let mut w = unsafe { self.writer_pinned(&g) };
        w._pin = Some(g);
        w
    }

    /// [`writer`](Self::writer) for a caller that holds a pin of this
    /// forest for the writer's whole life (the address space's `Edit`),
    /// which spares the writer a pin of its own.
    ///
    /// # Safety
    /// `g` must be a pin of this forest that outlives the writer.
    #[inline]
    pub(crate) unsafe fn writer_pinned(&self, g: &Guard) -> ForestWriter<'_, V> {
        if self.unified.load(Ordering::Acquire).is_null() {
            return self.sliced_writer();
        }
        // SAFETY: the caller's contract.
        unsafe { self.unified_writer(g) }.unwrap_or_else(|| self.sliced_writer())
    }

    /// A writer of the slots (or of the one slot).
    #[inline]
    fn sliced_writer(&self) -> ForestWriter<'_, V> {
        ForestWriter {
            forest: self,
            held: (self.all().len() == 1).then(|| (0, self.all()[0].writer())),
            one: self.all().len() == 1,
            _pin: None,
        }
    }

    /// Checks every slot's invariants, and that each keeps to its slot
    /// (a unified forest: its one tree's, and that the slots are empty).
    pub fn check_invariants(&self) -> Result<(), String> {
        let g = self.pin();
        if let (Trees::Many { .. }, Some(u)) = (&self.trees, self.one(&g)) {
            u.check_invariants()?;
            if self.all().iter().any(|t| !t.is_empty()) {
                return Err("a unified forest's slots hold entries".into());
            }
            return Ok(());
        }
        for (k, t) in self.all().iter().enumerate() {
            t.check_invariants()?;
            if let Some((r, _)) = t.iter(&g).find(|(r, _)| self.clip(*r, k) != *r) {
                return Err(format!("slot {k} holds {r:?} beyond its bounds"));
            }
        }
        Ok(())
    }
}

/// Pushes `hit` (one slot's pieces, from slot `k`) onto `out`, merging a
/// piece that continues the last one across the boundary.
fn append<V: PartialEq>(out: &mut Vec<(Range, V)>, hit: Vec<(Range, V)>, cut: Option<u64>) {
    for (p, v) in hit {
        match out.last_mut() {
            Some((l, lv)) if Some(p.start) == cut && l.end == p.start && *lv == v => {
                l.end = p.end;
            }
            _ => out.push((p, v)),
        }
    }
}

/// An entry found by [`RangeForest::find_around`] and the leaf holding
/// (its piece in) it, valid as long as the guard of the lookup.
pub struct ForestAround<'g, V> {
    /// The whole entry's range.
    /// Protected by: a value.
    range: Range,
    /// The slot tree's view of the leaf.
    /// Protected by: immutable nodes under the lookup's guard.
    leaf: Around<'g, V>,
    /// The slot's start, where a piece may continue one below (none for
    /// the first slot).
    /// Protected by: a value.
    cut_lo: Option<u64>,
    /// The slot's end, where a piece may continue into the next slot
    /// (none for the last slot).
    /// Protected by: a value.
    cut_hi: Option<u64>,
}

impl<'g, V> ForestAround<'g, V> {
    /// The found entry (whole, across slots).
    #[inline]
    pub fn entry(&self) -> (Range, &'g V) {
        (self.range, self.leaf.entry().1)
    }

    /// The entry `d` places after the found one (before it if `d` is
    /// negative), if it lies in the same leaf and wholly in this slot.
    /// `None` says nothing of the tree beyond: the caller looks such a
    /// neighbour up itself.
    #[inline]
    pub fn nearby(&self, d: isize) -> Option<(Range, &'g V)> {
        self.leaf
            .nearby(d)
            .filter(|(r, _)| Some(r.start) != self.cut_lo && Some(r.end) != self.cut_hi)
    }
}

/// The writer side of a [`RangeForest`]; reads through it see the latest
/// state.
pub struct ForestWriter<'t, V> {
    /// The forest written.
    /// Protected by: see [`RangeForest`]'s fields.
    forest: &'t RangeForest<V>,
    /// The last slot written and its writer (with one tree, that tree's,
    /// held for the writer's life): at most one slot's mutex is held at a
    /// time, so no two writers can each hold a slot the other waits for.
    /// Dropped before `_pin`.
    /// Protected by: owned by this writer.
    held: Option<(usize, TreeWriter<'t, V>)>,
    /// True if `held` is the one tree holding every entry (one slot, or
    /// the unified tree) for the writer's life.
    /// Protected by: immutable.
    one: bool,
    /// Keeps a unified forest's one tree alive while `held` writes it.
    /// Protected by: owned by this writer.
    _pin: Option<Guard>,
}

impl<V> core::ops::Deref for ForestWriter<'_, V> {
    type Target = RangeForest<V>;
    fn deref(&self) -> &RangeForest<V> {
        self.forest
    }
}

impl<V: Clone + PartialEq + Send + Sync + 'static> ForestWriter<'_, V> {
    /// Runs `f` with slot `k`'s writer: the held one if it is `k`'s, else
    /// `k`'s, taken after the held one is released.
    fn with_slot<R>(&mut self, k: usize, f: impl FnOnce(&mut TreeWriter<'_, V>) -> R) -> R {
        if self.one {
            let (_, w) = self
                .held
                .as_mut()
                .expect("one tree's writer, held for life");
            return f(w);
        }
        if self.held.as_ref().is_some_and(|(j, _)| *j != k) {
            // Released before the next is taken: one mutex at a time.
            self.held = None;
        }
        let forest = self.forest;
        let (_, w) = self.held.get_or_insert_with(|| {
            let w = forest.all()[k].writer();
            forest.mark_written(k);
            (k, w)
        });
        f(w)
    }

    /// Inserts `r -> v` into a free range.
    pub fn insert(&mut self, r: Range, v: V) -> Result<(), TreeError> {
        if r.is_empty() {
            return Err(TreeError::EmptyRange);
        }
        if self.one {
            // The single tree checks for overlap itself.
            return self.with_slot(0, |t| t.insert(r, v));
        }
        let ks = self.forest.slots_of(r);
        if ks.start() == ks.end() {
            // Inside one slot (nearly every insert): any entry meeting `r`
            // has a piece there, so that slot's tree checks for overlap
            // itself, as the single tree does.
            let k = *ks.start();
            self.forest.note_edges(k, r);
            return self.with_slot(k, |t| t.insert(r, v));
        }
        let g = self.forest.pin();
        let occupied = self.forest.range(r, &g).next().is_some();
        drop(g);
        if occupied {
            return Err(TreeError::Occupied);
        }
        for k in self.forest.slots_of(r) {
            let c = self.forest.clip(r, k);
            self.forest.note_edges(k, c);
            // Free when checked, and no overlapping writer runs (the
            // forest's rule): the insert cannot fail.
            self.with_slot(k, |t| t.insert(c, v.clone()))?;
        }
        Ok(())
    }

    /// Stores `r -> v`, overwriting whatever `r` covered (see
    /// [`TreeWriter::store`]); returns the overwritten pieces. One atomic
    /// step for readers of each address.
    pub fn store(&mut self, r: Range, v: V) -> Vec<(Range, V)> {
        self.overwrite::<true>(r, Some(v))
    }

    /// Removes everything inside `r`, trimming entries that overlap its
    /// ends. Returns the removed pieces.
    pub fn erase(&mut self, r: Range) -> Vec<(Range, V)> {
        self.overwrite::<true>(r, None)
    }

    /// [`store`](Self::store) with no list of what it overwrote
    /// ([`TreeWriter::store_only`]).
    pub fn store_only(&mut self, r: Range, v: V) {
        self.overwrite::<false>(r, Some(v));
    }

    /// [`erase`](Self::erase) with no list of what it removed.
    pub fn erase_only(&mut self, r: Range) {
        self.overwrite::<false>(r, None);
    }

    /// Stores `v` over `r`, or erases `r`, slot by slot; returns what it
    /// overwrote if `LIST`.
    fn overwrite<const LIST: bool>(&mut self, r: Range, v: Option<V>) -> Vec<(Range, V)> {
        let mut out = Vec::new();
        // The single tree, or a range inside one slot (nearly every
        // store): that slot's writer, no clipping or joining.
        let ks = if self.one {
            0..=0
        } else if r.is_empty() {
            return out;
        } else {
            self.forest.slots_of(r)
        };
        if ks.start() == ks.end() {
            if v.is_some() && !self.one {
                self.forest.note_edges(*ks.start(), r);
            }
            return self.with_slot(*ks.start(), |t| t.overwrite::<LIST>(r, v));
        }
        for k in ks {
            let c = self.forest.clip(r, k);
            if v.is_some() {
                self.forest.note_edges(k, c);
            }
            let hit = self.with_slot(k, |t| match &v {
                Some(v) => t.store(c, v.clone()),
                None => t.erase(c),
            });
            if out.is_empty() {
                out = hit;
            } else {
                let cut = (k > 0).then(|| self.forest.start(k));
                append(&mut out, hit, cut);
            }
        }
        out
    }

    /// Removes the whole entry containing `addr`.
    pub fn remove(&mut self, addr: u64) -> Option<(Range, V)> {
        let (r, v) = {
            let g = self.forest.pin();
            self.forest.find(addr, &g).map(|(r, v)| (r, v.clone()))?
        };
        self.erase(r);
        Some((r, v))
    }

    /// Keeps only the entries for which `keep` (called once per whole
    /// entry) returns true, rebuilding each slot that loses one in one
    /// pass. Returns how many entries were removed. One atomic step per
    /// slot.
    pub fn retain(&mut self, mut keep: impl FnMut(Range, &V) -> bool) -> usize {
        let gone: Vec<Range> = {
            let g = self.forest.pin();
            self.forest
                .iter(&g)
                .filter(|(r, v)| !keep(*r, v))
                .map(|(r, _)| r)
                .collect()
        };
        if gone.is_empty() {
            return 0;
        }
        let ks = if self.one {
            0..=0
        } else {
            self.forest
                .slots_of(Range::new(gone[0].start, gone[gone.len() - 1].end))
        };
        for k in ks {
            self.with_slot(k, |t| {
                t.retain(|p, _| {
                    let i = gone.partition_point(|x| x.end <= p.start);
                    gone.get(i).is_none_or(|x| x.start > p.start)
                })
            });
        }
        gone.len()
    }

    /// Replaces the whole contents with `entries` (sorted by start and
    /// non-overlapping), each slot built in one pass as
    /// [`TreeWriter::replace_all`] does. One atomic step per slot; on bad
    /// input nothing changes.
    pub fn replace_all(
        &mut self,
        entries: impl IntoIterator<Item = (Range, V)>,
    ) -> Result<(), TreeError> {
        if self.one {
            return self.with_slot(0, |t| t.replace_all(entries));
        }
        let es = super::write::sorted_entries(entries)?;
        let mut at = 0;
        for k in 0..self.forest.all().len() {
            let (s, e) = (self.forest.start(k), self.forest.end(k));
            let mut part = Vec::new();
            while let Some((es_s, es_e, v)) = es.get(at) {
                if *es_s >= e {
                    break;
                }
                part.push((Range::new((*es_s).max(s), (*es_e).min(e)), v.clone()));
                if *es_e > e {
                    break;
                }
                at += 1;
            }
            if part.is_empty() && self.forest.all()[k].is_empty() {
                continue;
            }
            for p in &part {
                self.forest.note_edges(k, p.0);
            }
            self.with_slot(k, |t| t.replace_all(part))
                .expect("clipped pieces of sorted entries are sorted");
        }
        Ok(())
    }
}

mod inner;
mod unified;

pub(crate) use inner::InnerSlot;

#[cfg(all(test, not(aspace_loom)))]
mod tests;
