//! The editing context of an mmap_lock writer, and the VMA edits every
//! operation shares: create, split, merge, expand, remove, zap.
//!
//! Every edit follows the same protocol: write-lock each VMA it changes
//! (waiting out its readers), publish the new tree (each store is atomic
//! for lock-free readers, so an address covered before and after never
//! looks unmapped), then update the VMA's own fields, then detach what was
//! removed. New VMAs are write-locked before they are attached, so no
//! fault uses them until the mmap_lock is released.
//!
//! # Locking
//!
//! An `Edit` holds the mmap_lock write side for its whole life, and takes
//! the tree's writer, VMA write locks, family locks and PTE-table locks
//! inside it, in the order [`crate::mm`] states. A range writer
//! (`WriterLocking::Range`: [`Edit::begin_range`], [`Edit::begin_placed`])
//! holds its neighbourhood of the range lock instead, changes only VMAs
//! inside it (checked by [`Edit::lock`], in release builds too), and takes the
//! tree's writer for each store only; see `range_lock`'s module docs.
//! The owner of a slot's bias, which holds the whole slot, reads and
//! writes that slot's tree alone while no entry reaches past the slot
//! (`tree::InnerSlot`).

use super::mmap_lock::MmapWriteGuard;
use super::{AddressSpace, MapCounter, MmState};
use crate::addr::Range;
use crate::error::{Error, Result};
use crate::reclaim::Guard;
use crate::sync::Arc;
use crate::tlb::Gather;
use crate::tree::{ForestWriter, InnerSlot};
use crate::vma::{AnonVma, RmapIndex, VmaRef, VMA_BYTES};
use smallvec::SmallVec;

mod life;
mod range;
pub(crate) use life::VmaSpec;
pub(crate) use range::{lock_validated, neighbourhood, vma_hull, Reach, View};

/// An mmap_lock writer's view of the address space.
pub(crate) struct Edit<'a> {
    mm: &'a AddressSpace,
    /// The tree's writer (its mutex is uncontended: only mmap_lock
    /// writers take it), held for the whole edit; `None` for a range
    /// writer, which takes it for each store only (`with_tree`).
    /// Released before `state` (field order): inner lock first.
    tree: Option<ForestWriter<'a, VmaRef>>,
    /// The held slot's tree alone, for the owner of a slot's bias whose
    /// slot holds every entry meeting it whole (`tree::InnerSlot`): its
    /// lookups and stores inside the slot skip the forest's slot
    /// arithmetic and piece joining. Dropped (`None`) by the first store
    /// that reaches an end of the slot. For a writer of the forest's one
    /// tree (`tree`), that tree as a view of the whole space, for its
    /// lookups.
    /// Protected by: the hold of the whole slot (`state`), or the one
    /// tree's writer (`tree`).
    inner: Option<InnerSlot<'a, VmaRef>>,
    /// The mmap_lock's write side, and the state it guards.
    state: MmapWriteGuard<'a, MmState>,
    /// An epoch pin for the tree reads the edit makes, and for its
    /// tree writer's life (a unified tree's writer relies on it:
    /// `RangeForest::writer_pinned`).
    pin: Guard,
}

impl<'a> Edit<'a> {
    /// Takes the mmap_lock for write (in range mode: the whole space).
    pub(crate) fn begin(mm: &'a AddressSpace) -> Self {
        let st = mm.mmap_lock.write();
        if mm.mmap_lock.is_range_mode() && !st.holds_bias() {
            // Range mode's tree is unified while the bias holds; any
            // other writer splits it first (`range_bias`).
            mm.tree.split();
        }
        let g = mm.tree.pin();
        // SAFETY: the edit keeps `g` (`pin`) until after the writer
        // (`tree`, dropped first: field order).
        let w = unsafe { mm.tree.writer_pinned(&g) };
        // SAFETY: the view lives in the edit beside `w`, which the edit
        // keeps for its whole life (`tree` is never taken out of it).
        let inner = unsafe { w.one_tree() };
        Edit {
            mm,
            state: st,
            tree: Some(w),
            inner,
            pin: g,
        }
    }

    /// Runs `f` with the tree's writer: the edit's own, or (range writer)
    /// one taken for this store only.
    pub(crate) fn with_tree<R>(&mut self, f: impl FnOnce(&mut ForestWriter<'a, VmaRef>) -> R) -> R {
        match &mut self.tree {
            Some(w) => f(w),
            None => {
                // A write through the forest may store a piece reaching
                // an end of the slot: the slot's tree alone may no longer
                // hold every entry meeting it.
                self.inner = None;
                f(&mut self.mm.tree.writer())
            }
        }
    }

    /// The range this edit may change: the whole space except for a range
    /// writer.
    pub(crate) fn held(&self) -> Range {
        self.state.range()
    }

    /// Counts `n` more VMAs (fewer if negative): the owner of a slot's
    /// bias in that slot's part of the map count, any other range writer
    /// in its CPU's, any other writer in the total (`mm::map_count`).
    pub(crate) fn add_map_count(&self, n: isize) {
        let to = match self.state.owned_slot() {
            Some(k) => MapCounter::SlotOwner(k),
            None if self.is_range_writer() => MapCounter::Cpu,
            None => MapCounter::Total,
        };
        self.state.add_map_count(n, to);
    }

    /// True for a range writer.
    pub(crate) fn is_range_writer(&self) -> bool {
        self.state.is_range_writer()
    }

    /// The state the mmap_lock guards (break, start stack, map count,
    /// default flags).
    pub(crate) fn state(&self) -> &MmState {
        &self.state
    }

    /// [`state`](Self::state), to change it.
    pub(crate) fn state_mut(&mut self) -> &mut MmState {
        &mut self.state
    }

    /// The address space being edited.
    pub(crate) fn mm(&self) -> &'a AddressSpace {
        self.mm
    }

    /// Removes `r` from the tree in one store (readers see all of it
    /// unmapped at once); the caller has write-locked the VMAs in it.
    pub(super) fn erase(&mut self, r: Range) {
        match (&mut self.tree, &self.inner) {
            (Some(w), _) => w.erase_only(r),
            (None, Some(s)) if s.holds(r) => s.writer(&self.mm.tree).erase_only(r),
            (None, _) => self.mm.tree.writer().erase_only(r),
        }
    }

    /// Stores `r -> v` in one step (readers of each address see the old
    /// entry or `v`), overwriting what `r` covered.
    pub(super) fn store(&mut self, r: Range, v: VmaRef) {
        match (&mut self.tree, &self.inner) {
            (Some(w), _) => w.store_only(r, v),
            (None, Some(s)) if s.keeps(r) => s.writer(&self.mm.tree).store_only(r, v),
            (None, _) => {
                // A piece reaching an end of the slot: stored through the
                // forest, which records it, and the slot's tree alone no
                // longer holds every entry meeting the slot.
                self.inner = None;
                self.mm.tree.writer().store_only(r, v);
            }
        }
    }

    /// The entries (pieces) intersecting `r`, in order.
    fn entries_in(&self, r: Range) -> Vec<(Range, &VmaRef)> {
        match &self.inner {
            Some(s) => s.range(&self.mm.tree, r, &self.pin),
            None => self.mm.tree.range_outlined(r, &self.pin),
        }
    }

    /// The number of VMAs (`mm->map_count`).
    pub(crate) fn map_count(&self) -> usize {
        self.state.map_count()
    }

    /// True if there are at least `limit` VMAs (reads one shared count
    /// unless the count is near `limit`: `MapCount`).
    pub(crate) fn map_count_at_least(&self, limit: usize) -> bool {
        self.state.map_count_at_least(limit)
    }

    /// What a placement reads, for this edit (nothing to avoid: the
    /// ranges it may change are its own).
    pub(crate) fn view(&self) -> View<'_> {
        View::new(self.mm, &self.pin)
    }

    /// Attaches `vmas` (sorted, disjoint, write-locked) to an address space
    /// that has none, building its tree in one pass (the maple tree's
    /// `__mt_dup`: no insert per VMA).
    pub(crate) fn attach_all_sorted(&mut self, vmas: &[VmaRef]) {
        debug_assert_eq!(self.state.map_count(), 0);
        if vmas.is_empty() {
            // The tree is empty already: building an empty one would only
            // make its node cache (an idle space's fork allocates nothing).
            return;
        }
        for v in vmas {
            v.lock.mark_attached();
        }
        self.with_tree(|t| {
            t.replace_all(vmas.iter().map(|&v| (v.range(), v)))
                .expect("the VMAs are sorted and disjoint")
        });
        self.add_map_count(vmas.len() as isize);
    }

    /// The VMA containing `addr`.
    pub(crate) fn find(&self, addr: u64) -> Option<VmaRef> {
        match &self.inner {
            Some(s) => s.find(&self.mm.tree, addr, &self.pin),
            None => self.mm.tree.find_outlined(addr, &self.pin),
        }
        .map(|(_, v)| *v)
    }

    /// The first VMA ending above `addr` (Linux's `find_vma`).
    pub(crate) fn find_after(&self, addr: u64) -> Option<VmaRef> {
        match &self.inner {
            Some(s) => s.find_after(&self.mm.tree, addr, &self.pin),
            None => self.mm.tree.find_after_outlined(addr, &self.pin),
        }
        .map(|(_, v)| *v)
    }

    /// The last VMA ending at or below `addr`.
    pub(crate) fn prev(&self, addr: u64) -> Option<VmaRef> {
        match &self.inner {
            Some(s) => s.prev(&self.mm.tree, addr, &self.pin),
            None => self.mm.tree.prev_outlined(addr, &self.pin),
        }
        .map(|(_, v)| *v)
    }

    /// The range of the last VMA ending at or below `addr`, if it ends
    /// above `floor` (a look no further down than `floor`).
    pub(crate) fn prev_above(&self, addr: u64, floor: u64) -> Option<Range> {
        match &self.inner {
            Some(s) => s.prev_above(&self.mm.tree, addr, floor, &self.pin),
            None => self.mm.tree.prev_above_outlined(addr, floor, &self.pin),
        }
        .map(|(r, _)| r)
    }

    /// The range of the first VMA ending above `addr`, if it starts below
    /// `ceiling` (a look no further up than `ceiling`).
    pub(crate) fn find_after_below(&self, addr: u64, ceiling: u64) -> Option<Range> {
        match &self.inner {
            Some(s) => s.find_after_below(&self.mm.tree, addr, ceiling, &self.pin),
            None => self
                .mm
                .tree
                .find_after_below_outlined(addr, ceiling, &self.pin),
        }
        .map(|(r, _)| r)
    }

    /// The VMA ending exactly at `addr`: the one holding `addr - 1`
    /// (one lookup, where [`prev`](Self::prev) may scan the empty slots of
    /// a forest below `addr`).
    pub(crate) fn ending_at(&self, addr: u64) -> Option<VmaRef> {
        self.find(addr.checked_sub(1)?).filter(|v| v.end() == addr)
    }

    /// The VMA starting exactly at `addr`.
    pub(crate) fn starting_at(&self, addr: u64) -> Option<VmaRef> {
        self.find(addr).filter(|v| v.start() == addr)
    }

    /// The VMAs intersecting `r`, in order.
    pub(crate) fn vmas_in(&self, r: Range) -> Vec<VmaRef> {
        self.few_vmas_in(r).into_vec()
    }

    /// [`vmas_in`](Self::vmas_in) for a range that usually meets a few
    /// VMAs (an unmap's victims): kept in place, with no allocation
    /// where the edit's view serves the range (`tree::InnerSlot`).
    pub(crate) fn few_vmas_in(&self, r: Range) -> SmallVec<[VmaRef; 4]> {
        let mut out = SmallVec::new();
        match &self.inner {
            Some(s) => s.each_in(&self.mm.tree, r, &self.pin, |_, v| out.push(*v)),
            None => out.extend(
                self.mm
                    .tree
                    .range_outlined(r, &self.pin)
                    .into_iter()
                    .map(|(_, v)| *v),
            ),
        }
        out
    }

    /// Write-locks `v`: waits for its readers, and keeps new ones out until
    /// the mmap_lock is released. The one way a writer claims a VMA before
    /// changing its range, flags, backing or registration.
    ///
    /// It stamps the VMA, then sweeps its range
    /// ([`PageTable::sweep`](crate::pt::PageTable::sweep)): the lock of
    /// every PTE table covering part of it (empty tables and tables shared
    /// with other VMAs included) and, where no table covers a page, the
    /// lock of the empty slot above, under which tables are linked. A
    /// lock-free install or link that validated the old stamp under one of
    /// those locks has then happened before this returns (and the
    /// caller's later passes see its entry); any later one sees the stamp
    /// and falls back. So no writer, whatever it changes next,
    /// can be outrun by a fault that read the VMA before it: the sweep is
    /// not each writer's to remember.
    pub(crate) fn lock(&self, v: VmaRef) {
        // The range protocol's invariant: a range writer changes only VMAs
        // inside the neighbourhood it holds (new ones are not attached yet).
        // Checked in release builds too (two compares, range writers only):
        // a writer that got its hold wrong stops here instead of racing
        // the holder of that VMA (the loom model `range_brks_race`).
        assert!(
            !self.is_range_writer() || !v.lock.is_attached() || {
                let (h, r) = (self.held(), v.range());
                h.start <= r.start && r.end <= h.end
            },
            "a range writer locked a VMA outside its range"
        );
        if !v.lock.write_lock(self.state.stamp()) {
            // Locked already in this section (and swept then).
            return;
        }
        self.state.stamped(v);
        if !v.lock.is_attached() {
            // A new or detached object: no fault can reach it through
            // this tree.
            return;
        }
        // A page table made after this call is made after the stamp: a
        // fault that walks it has seen the stamp.
        if let Some(pt) = self.mm.pt.peek_ordered() {
            pt.sweep(v.range(), &pt.pin());
        }
    }

    /// Runs `f` with the lock of `anon`'s family held (counted in the
    /// stats), passing the family's reverse map; without a lock when
    /// `anon` is `None`.
    pub(crate) fn with_rmap<R>(
        &mut self,
        anon: Option<Arc<AnonVma>>,
        f: impl FnOnce(&mut Self, Option<&mut RmapIndex>) -> R,
    ) -> R {
        match anon {
            Some(a) => {
                let mm = self.mm;
                let mut idx = a.root().lock(Some(&mm.stats));
                f(self, Some(&mut idx))
            }
            None => f(self, None),
        }
    }

    /// Changes `v`'s range to `[start, end)` (with `pgoff` for `start`),
    /// storing the part it gains. The caller has write-locked `v` and makes
    /// sure the gained part is free or belongs to VMAs it is removing, and
    /// that no pages change owner (else it holds the rmap lock and calls
    /// [`set_range_in`](Self::set_range_in)).
    ///
    /// Takes the anon_vma lock when `v` has an anon_vma and its start (so
    /// its page offset and reverse-map key) moves; an end-only move skips
    /// it unless `Config::brk_fast_path` is off (see [`crate::vma::anon`]
    /// for why that is safe).
    pub(crate) fn set_range(&mut self, v: VmaRef, start: u64, end: u64, pgoff: u64) {
        let anon = v.anon_vma_arc();
        let start_moves = start != v.start() || pgoff != v.pgoff();
        let need = start_moves || !self.mm.cfg.brk_fast_path;
        self.with_rmap(anon.filter(|_| need), |ed, idx| {
            ed.set_range_in(v, start, end, pgoff, idx)
        });
    }

    /// [`set_range`](Self::set_range) with the caller holding the lock of
    /// `v`'s anon_vma family (`idx`) where that is needed: always when the
    /// start moves and `v` has an anon_vma. With the lock, the reverse-map
    /// entry is re-filed (Linux's interval-tree pre/post update).
    pub(super) fn set_range_in(
        &mut self,
        v: VmaRef,
        start: u64,
        end: u64,
        pgoff: u64,
        idx: Option<&mut RmapIndex>,
    ) {
        let old = v.range();
        let old_pgoff = v.pgoff();
        let start_moves = start != old.start || pgoff != old_pgoff;
        debug_assert!(
            !(start_moves && v.has_anon_vma() && idx.is_none()),
            "moving the start of a VMA with an anon_vma needs the rmap lock"
        );
        self.store(Range::new(start, end), v);
        // A shrink: the lost parts were overwritten by the caller's stores,
        // or must be erased now.
        if old.start < start {
            self.erase_if_owner(Range::new(old.start, start.min(old.end)), v);
        }
        if end < old.end {
            self.erase_if_owner(Range::new(end.max(old.start), old.end), v);
        }
        if start_moves {
            v.set_range(start, end, pgoff);
        } else {
            v.set_end(end);
        }
        if let Some(obj) = v.shmem_arc() {
            obj.mappings.update(v);
        }
        if let Some(idx) = idx {
            if v.has_anon_vma() {
                idx.rekey(v, old.start, old_pgoff);
            }
        }
    }

    fn erase_if_owner(&mut self, r: Range, v: VmaRef) {
        if r.is_empty() {
            return;
        }
        let parts: Vec<Range> = self
            .entries_in(r)
            .into_iter()
            .filter(|(_, x)| **x == v)
            .map(|(p, _)| p.intersect(&r).unwrap_or(p))
            .collect();
        for p in parts {
            self.erase(p);
        }
    }

    /// True if the budget has room for the metadata of `n` more VMAs
    /// (Linux: `vm_area_alloc` failing with ENOMEM). Read from this CPU's
    /// budget stock alone when it holds the bytes (`Budget::has_room`).
    pub(crate) fn vma_room(&self, n: u64) -> bool {
        self.mm.frames.memory().has_room(n * VMA_BYTES)
    }

    /// Splits `v` at `at` (strictly inside it); `v` keeps the lower part and
    /// the new VMA, returned, the upper. `check_count` applies Linux's
    /// `split_vma` limit (`map_count >= max_map_count` fails).
    pub(crate) fn split(&mut self, v: VmaRef, at: u64, check_count: bool) -> Result<VmaRef> {
        debug_assert!(v.start() < at && at < v.end());
        if check_count && self.state.map_count_at_least(self.mm.cfg.max_map_count) {
            return Err(Error::NoMem);
        }
        if !self.vma_room(1) {
            return Err(Error::NoMem);
        }
        self.lock(v);
        // A 2 MiB page across the new boundary becomes 512 PTEs first,
        // so that no PMD leaf straddles two VMAs (Linux's
        // `vma_adjust_trans_huge`).
        if at % crate::pt::HUGE_SIZE != 0 {
            if let Some(pt) = self.mm.pt.peek() {
                pt.split_huge(at, &pt.pin());
            }
        }
        // Inserting a VMA that shares the anon_vma: take its lock.
        let anon = v.anon_vma_arc();
        Ok(self.with_rmap(anon.clone(), |ed, idx| {
            let upper = Range::new(at, v.end());
            let n = ed.new_vma_in(VmaSpec::like(&v, upper, v.pgoff_of(at)), idx);
            n.lock.mark_attached();
            // One store moves [at, end) from v to n atomically for readers.
            ed.store(upper, n);
            ed.add_map_count(1);
            v.set_end(at);
            // `n` was filed first: the two cover the range throughout.
            if let Some(obj) = v.shmem_arc() {
                obj.mappings.update(v);
            }
            n
        }))
    }

    /// Zaps the page-table entries of `r` into `gather`: translations are
    /// flushed and frame references dropped when the gather flushes.
    pub(crate) fn zap(&self, r: Range, gather: &mut Gather<'_>) {
        zap_range(self.mm, r, gather);
    }

    /// Frees the page tables of the hole around `r` (no VMA covers any of
    /// it any more): from the end of the VMA before to the start of the one
    /// after.
    pub(crate) fn free_pgtables(&self, r: Range) {
        // A range writer frees only tables inside the range it holds: no
        // other writer maps there meanwhile (its neighbourhood reaches the
        // PTE tables `r` meets: `Reach::Hole`). Every writer looks no
        // further than `r` rounded out to root entries' spans
        // (`root_spans_around`: no table it may free lies beyond), and in
        // range mode's forest an unbounded look for the VMA before would
        // visit every empty 512 GiB slot below.
        let held = self.held();
        let spans = range::root_spans_around(r);
        let lo = held.start.min(r.start).max(spans.start);
        let hi = held.end.max(r.end).min(spans.end);
        // Bounded lookups: nothing beyond the clamps counts (inside a
        // slot the edit's view holds: that slot's tree alone).
        let floor = self.prev_above(r.start, lo).map_or(0, |p| p.end).max(lo);
        let ceiling = self
            .find_after_below(r.start, hi)
            .map_or(u64::MAX, |n| n.start)
            .min(hi);
        let g = self.mm.pt.pin();
        self.mm
            .pt
            .free_tables_within(r, Range::new(floor, ceiling), &g);
    }

    /// A gather bound to this address space.
    pub(crate) fn gather(&self) -> Gather<'a> {
        Gather::new(&self.mm.tlb, &self.mm.stats, &self.mm.frames)
    }
}

/// Zaps `r`'s entries into `gather` (also used under the mmap_lock read
/// side by madvise).
pub(crate) fn zap_range(mm: &AddressSpace, r: Range, gather: &mut Gather<'_>) {
    let g = mm.pt.pin();
    let gather = core::cell::RefCell::new(gather);
    mm.pt.zap_range_huge(
        r,
        &g,
        |va, frame| {
            let mut gather = gather.borrow_mut();
            gather.add_page(va);
            if let Some(pfn) = frame {
                gather.free_frame(pfn);
            }
        },
        |va, leaf| {
            let mut gather = gather.borrow_mut();
            gather.add_range(Range::new(va, va + crate::pt::HUGE_SIZE));
            if let Some(head) = leaf.frame() {
                gather.free_huge(head);
            }
        },
    );
}
