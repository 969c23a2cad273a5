//! The editing context of an mmap_lock writer, and the VMA edits every
//! operation shares: create, split, merge, expand, remove, zap.
//!
//! Every edit follows the same protocol: write-lock each VMA it changes
//! (waiting out its readers), publish the new tree (each store is atomic
//! for lock-free readers, so an address covered before and after never
//! looks unmapped), then update the VMA's own fields, then detach what was
//! removed. New VMAs are write-locked before they are attached, so no
//! fault uses them until the mmap_lock is released.

use super::mmap_lock::MmapWriteGuard;
use super::{AddressSpace, MmState};
use crate::addr::{pages, Range};
use crate::error::{Error, Result};
use crate::reclaim::Guard;
use crate::stats::Event;
use crate::sync::Arc;
use crate::tlb::Gather;
use crate::tree::TreeWriter;
use crate::vma::{AnonName, AnonVma, RmapIndex, Shmem, VmFlags, Vma, VmaRef, VMA_BYTES};

/// An mmap_lock writer's view of the address space.
pub(crate) struct Edit<'a> {
    pub(crate) mm: &'a AddressSpace,
    pub(crate) st: MmapWriteGuard<'a, MmState>,
    pub(crate) w: TreeWriter<'a, VmaRef>,
    pub(crate) g: Guard,
}

/// Flags equal for merging purposes (soft-dirty ignored).
pub(crate) fn flags_mergeable(a: VmFlags, b: VmFlags) -> bool {
    (a ^ b).difference(VmFlags::SOFTDIRTY).is_empty()
}

/// Linux's `is_mergeable_anon_vma` without fork history: two anon_vmas
/// are compatible if they are the same, or if either side has none yet.
pub(crate) fn anon_compatible(a: Option<&AnonVma>, b: Option<&AnonVma>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => core::ptr::eq(a, b),
        _ => true,
    }
}

fn same_shmem(a: Option<&Shmem>, b: Option<&Shmem>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => core::ptr::eq(a, b),
        (None, None) => true,
        _ => false,
    }
}

/// Linux's `is_mergeable_anon_vma` with fork history: the range being
/// merged (`src`, with `src_singular` false when it is an existing VMA
/// whose anon_vma chain has more than one entry) and the neighbour `tgt`
/// may share an anon_vma if they have the same one, or if one has none and
/// the other's chain has a single entry (a VMA that shares pages with a
/// fork relative is kept apart: `vma_had_uncowed_parents`).
pub(crate) fn anon_mergeable(
    src: Option<&AnonVma>,
    src_singular: bool,
    tgt: Option<&AnonVma>,
) -> bool {
    match (src, tgt) {
        (Some(a), Some(b)) => core::ptr::eq(a, b),
        (None, Some(b)) => b.chain_len() == 1,
        (Some(_), None) => src_singular,
        (None, None) => true,
    }
}

/// What a range about to be merged looks like.
///
/// Page offsets are anonymous addresses in pages (below 2^36 with a 2^48
/// task size) or page indexes of a shared object no longer than the task
/// size, so the sums of offsets and page counts here cannot overflow.
#[derive(Clone, Copy)]
pub(crate) struct Proto<'p> {
    pub(crate) flags: VmFlags,
    pub(crate) anon: Option<&'p AnonVma>,
    pub(crate) shmem: Option<&'p Shmem>,
    /// The range's own anon_vma chain has at most one entry (true for a
    /// new range, which has no VMA yet).
    pub(crate) singular: bool,
    /// The range's name: VMAs merge only with equal names.
    pub(crate) name: Option<&'p str>,
}

impl Proto<'_> {
    /// `prev` may absorb a range starting at `prev.end()` with page offset
    /// `pgoff` (Linux's `can_vma_merge_after`).
    fn merges_after(&self, prev: &Vma, pgoff: u64) -> bool {
        // SAFETY: merge decisions run in an mmap_lock writer (`Edit`).
        let (shmem, anon) = unsafe { (prev.shmem(), prev.anon_vma()) };
        flags_mergeable(prev.flags(), self.flags)
            && prev.name() == self.name
            && same_shmem(shmem, self.shmem)
            && anon_mergeable(self.anon, self.singular, anon)
            && prev.pgoff() + pages(prev.range().len()) == pgoff
    }

    /// `next` may absorb a range of `len` bytes ending at `next.start()`
    /// with page offset `pgoff` (Linux's `can_vma_merge_before`).
    fn merges_before(&self, next: &Vma, pgoff: u64, len: u64) -> bool {
        // SAFETY: merge decisions run in an mmap_lock writer (`Edit`).
        let (shmem, anon) = unsafe { (next.shmem(), next.anon_vma()) };
        flags_mergeable(next.flags(), self.flags)
            && next.name() == self.name
            && same_shmem(shmem, self.shmem)
            && anon_mergeable(self.anon, self.singular, anon)
            && pgoff + pages(len) == next.pgoff()
    }
}

impl<'a> Edit<'a> {
    /// Takes the mmap_lock for write.
    pub(crate) fn begin(mm: &'a AddressSpace) -> Self {
        let st = mm.mmap_lock.write();
        let w = mm.tree.writer();
        let g = mm.tree.pin();
        Edit { mm, st, w, g }
    }

    /// The VMA containing `addr`.
    pub(crate) fn find(&self, addr: u64) -> Option<VmaRef> {
        self.w.find(addr, &self.g).map(|(_, v)| *v)
    }

    /// The first VMA ending above `addr` (Linux's `find_vma`).
    pub(crate) fn find_after(&self, addr: u64) -> Option<VmaRef> {
        self.w.find_after(addr, &self.g).map(|(_, v)| *v)
    }

    /// The last VMA ending at or below `addr`.
    pub(crate) fn prev(&self, addr: u64) -> Option<VmaRef> {
        self.w.prev(addr, &self.g).map(|(_, v)| *v)
    }

    /// The VMA ending exactly at `addr`.
    pub(crate) fn ending_at(&self, addr: u64) -> Option<VmaRef> {
        self.prev(addr).filter(|v| v.end() == addr)
    }

    /// The VMA starting exactly at `addr`.
    pub(crate) fn starting_at(&self, addr: u64) -> Option<VmaRef> {
        self.find(addr).filter(|v| v.start() == addr)
    }

    /// The VMAs intersecting `r`, in order.
    pub(crate) fn vmas_in(&self, r: Range) -> Vec<VmaRef> {
        self.w.range(r, &self.g).map(|(_, v)| *v).collect()
    }

    /// Write-locks `v`: waits for its readers, and keeps new ones out until
    /// the mmap_lock is released.
    pub(crate) fn lock(&self, v: VmaRef) {
        v.lock.write_lock(self.st.seq());
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

    /// A new, detached, write-locked VMA (linked into its anon_vma's
    /// reverse map under that family's lock).
    pub(crate) fn new_vma(
        &mut self,
        r: Range,
        pgoff: u64,
        flags: VmFlags,
        anon: Option<Arc<AnonVma>>,
        shmem: Option<Arc<Shmem>>,
    ) -> VmaRef {
        self.new_vma_in(r, pgoff, flags, anon, shmem, None)
    }

    /// [`new_vma`](Self::new_vma) for a caller that may already hold the
    /// family's lock (`idx`, which must be `anon`'s family).
    fn new_vma_in(
        &mut self,
        r: Range,
        pgoff: u64,
        flags: VmFlags,
        anon: Option<Arc<AnonVma>>,
        shmem: Option<Arc<Shmem>>,
        idx: Option<&mut RmapIndex>,
    ) -> VmaRef {
        // Callers checked for room (`vma_room`) before changing anything;
        // a concurrent charge from another space may pass the limit by a
        // VMA or two.
        self.mm.frames.memory().force_charge(VMA_BYTES);
        let (v, reused) = self.mm.pool.alloc();
        if reused {
            self.mm.stats.inc(Event::vma_reused);
        }
        // Stamp before any field changes: a speculative fault still holding
        // this object from its previous life then sees a new stamp.
        self.lock(v);
        v.set_mm(self.mm.id);
        v.set_range(r.start, r.end, pgoff);
        v.set_flags(flags);
        self.link_in(v, anon, idx);
        v.set_shmem(shmem);
        v
    }

    /// Links `v`, which has no anon_vma, to `anon` (if any), with the
    /// family's lock held by the caller (`idx`) or taken here.
    fn link_in(&self, v: VmaRef, anon: Option<Arc<AnonVma>>, idx: Option<&mut RmapIndex>) {
        match (anon, idx) {
            (None, _) => {}
            (Some(a), Some(idx)) => v.link_anon_held(a, idx),
            (Some(a), None) => v.set_anon_vma_counted(Some(a), Some(&self.mm.stats)),
        }
    }

    /// Attaches a new VMA over a range no VMA covers.
    pub(crate) fn insert(&mut self, v: VmaRef) {
        v.lock.mark_attached();
        self.w.store(v.range(), v);
        self.st.map_count += 1;
    }

    /// Removes VMAs whose ranges are no longer in the tree: unlinks them
    /// from their anon_vmas' reverse maps, waits out transient readers and
    /// recycles the objects. Each anon_vma family's lock is taken once per
    /// run of consecutive VMAs of that family, and its reverse map updated
    /// as a batch (unmapping many VMAs, and teardown).
    pub(crate) fn detach_all(&mut self, vs: &[VmaRef]) {
        for &v in vs {
            self.lock(v);
            v.lock.mark_detached();
        }
        crate::vma::unlink_all(vs, &self.mm.stats);
        self.st.map_count -= vs.len();
        for &v in vs {
            self.mm.pool.free(v);
        }
        self.mm
            .frames
            .memory()
            .uncharge(VMA_BYTES * vs.len() as u64);
    }

    /// Removes one VMA from the tree if `erase` (else its range is no
    /// longer there), as [`detach_all`](Self::detach_all) does, for a
    /// caller that may hold the lock of `v`'s anon_vma family (`idx`).
    fn detach_in(&mut self, v: VmaRef, erase: bool, idx: Option<&mut RmapIndex>) {
        self.lock(v);
        if erase {
            let r = v.range();
            // Erase only what still maps to `v`: a survivor may already
            // have been stored over part of it.
            let parts: Vec<Range> = self
                .w
                .range(r, &self.g)
                .filter(|(_, x)| **x == v)
                .map(|(r, _)| r)
                .collect();
            for p in parts {
                self.w.erase(p);
            }
        }
        v.lock.mark_detached();
        match idx {
            Some(idx) => v.unlink_anon_held(idx),
            None => v.set_anon_vma_counted(None, Some(&self.mm.stats)),
        }
        self.st.map_count -= 1;
        self.mm.pool.free(v);
        self.mm.frames.memory().uncharge(VMA_BYTES);
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
    fn set_range_in(
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
        self.w.store(Range::new(start, end), v);
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
            .w
            .range(r, &self.g)
            .filter(|(_, x)| **x == v)
            .map(|(p, _)| p.intersect(&r).unwrap_or(p))
            .collect();
        for p in parts {
            self.w.erase(p);
        }
    }

    /// True if the budget has room for the metadata of `n` more VMAs
    /// (Linux: `vm_area_alloc` failing with ENOMEM).
    pub(crate) fn vma_room(&self, n: u64) -> bool {
        self.mm.frames.memory().has_room(n * VMA_BYTES)
    }

    /// Splits `v` at `at` (strictly inside it); `v` keeps the lower part and
    /// the new VMA, returned, the upper. `check_count` applies Linux's
    /// `split_vma` limit (`map_count >= max_map_count` fails).
    pub(crate) fn split(&mut self, v: VmaRef, at: u64, check_count: bool) -> Result<VmaRef> {
        debug_assert!(v.start() < at && at < v.end());
        if check_count && self.st.map_count >= self.mm.cfg.max_map_count {
            return Err(Error::NoMem);
        }
        if !self.vma_room(1) {
            return Err(Error::NoMem);
        }
        self.lock(v);
        // Inserting a VMA that shares the anon_vma: take its lock.
        let anon = v.anon_vma_arc();
        Ok(self.with_rmap(anon.clone(), |ed, idx| {
            let upper = Range::new(at, v.end());
            let n = ed.new_vma_in(upper, v.pgoff_of(at), v.flags(), anon, v.shmem_arc(), idx);
            n.set_name(v.name_arc());
            n.lock.mark_attached();
            // One store moves [at, end) from v to n atomically for readers.
            ed.w.store(upper, n);
            ed.st.map_count += 1;
            v.set_end(at);
            n
        }))
    }

    /// Gives `v` an anon_vma from `from` if it has none (Linux's
    /// `dup_anon_vma` when a merge joins them).
    fn inherit_anon(&self, v: VmaRef, from: Option<Arc<AnonVma>>, idx: Option<&mut RmapIndex>) {
        if !v.has_anon_vma() {
            self.link_in(v, from, idx);
        }
    }

    /// The anon_vma whose family lock a merge of these VMAs (and a range
    /// with `extra`) takes: they are merge-compatible, so at most one
    /// family is involved.
    fn merge_family(vs: &[Option<VmaRef>], extra: Option<&Arc<AnonVma>>) -> Option<Arc<AnonVma>> {
        extra
            .cloned()
            .or_else(|| vs.iter().flatten().find_map(|v| v.anon_vma_arc()))
    }

    /// Maps a new range `r` with no VMA in it: merges with the neighbours
    /// where Linux would (`vma_merge_new_range`), else inserts a new VMA.
    /// Returns the VMA that covers `r`.
    pub(crate) fn map_new(
        &mut self,
        r: Range,
        pgoff: u64,
        flags: VmFlags,
        anon: Option<Arc<AnonVma>>,
        shmem: Option<Arc<Shmem>>,
    ) -> VmaRef {
        self.map_new_named(r, pgoff, flags, anon, shmem, None)
    }

    /// [`map_new`](Self::map_new) for a range with a name (mremap moving
    /// or growing a named VMA).
    pub(crate) fn map_new_named(
        &mut self,
        r: Range,
        pgoff: u64,
        flags: VmFlags,
        anon: Option<Arc<AnonVma>>,
        shmem: Option<Arc<Shmem>>,
        name: Option<Arc<AnonName>>,
    ) -> VmaRef {
        let proto = Proto {
            flags,
            anon: anon.as_deref(),
            shmem: shmem.as_deref(),
            singular: true,
            name: name.as_deref().map(|n| &*n.0),
        };
        let prev = self.ending_at(r.start);
        let next = self.starting_at(r.end);
        let left = prev.is_some_and(|p| proto.merges_after(&p, pgoff));
        let mut right = next.is_some_and(|n| proto.merges_before(&n, pgoff, r.len()));
        if left && right {
            // Deleting next also needs prev and next compatible.
            let (p, n) = (prev.unwrap(), next.unwrap());
            // SAFETY: this `Edit` holds the mmap_lock write side.
            right = unsafe { anon_compatible(p.anon_vma(), n.anon_vma()) };
        }
        match (left, right) {
            (true, true) => {
                let (p, n) = (prev.unwrap(), next.unwrap());
                self.lock(p);
                self.lock(n);
                // next's pages move to prev: an importer, under the lock.
                let fam = Self::merge_family(&[prev, next], anon.as_ref());
                self.with_rmap(fam, |ed, mut idx| {
                    ed.inherit_anon(p, anon.or_else(|| n.anon_vma_arc()), idx.as_deref_mut());
                    ed.set_range_in(p, p.start(), n.end(), p.pgoff(), idx.as_deref_mut());
                    ed.detach_in(n, false, idx);
                });
                p
            }
            (true, false) => {
                let p = prev.unwrap();
                self.lock(p);
                self.inherit_anon(p, anon, None);
                // Only prev's end moves, over an empty range.
                self.set_range(p, p.start(), r.end, p.pgoff());
                p
            }
            (false, true) => {
                let n = next.unwrap();
                self.lock(n);
                self.inherit_anon(n, anon, None);
                self.set_range(n, r.start, n.end(), pgoff);
                n
            }
            (false, false) => {
                let v = self.new_vma(r, pgoff, flags, anon, shmem);
                v.set_name(name);
                self.insert(v);
                v
            }
        }
    }

    /// Applies new flags to `[s, e)` inside `v`, merging with neighbours
    /// where Linux would (`vma_merge_existing_range`), else splitting.
    /// Returns the VMA that now covers `[s, e)`.
    pub(crate) fn modify_flags(
        &mut self,
        v: VmaRef,
        s: u64,
        e: u64,
        flags: VmFlags,
    ) -> Result<VmaRef> {
        let name = v.name_arc();
        self.modify(v, s, e, flags, name)
    }

    /// [`modify_flags`](Self::modify_flags) that also gives `[s, e)` the
    /// name `name` (Linux's `vma_modify_flags_name`).
    pub(crate) fn modify(
        &mut self,
        v: VmaRef,
        s: u64,
        e: u64,
        flags: VmFlags,
        name: Option<Arc<AnonName>>,
    ) -> Result<VmaRef> {
        let left_side = s == v.start();
        let right_side = e == v.end();
        let pgoff = v.pgoff_of(s);
        let anon = v.anon_vma_arc();
        let shmem = v.shmem_arc();
        let proto = Proto {
            flags,
            anon: anon.as_deref(),
            shmem: shmem.as_deref(),
            singular: anon.as_ref().is_none_or(|a| a.chain_len() == 1),
            name: name.as_deref().map(|n| &*n.0),
        };
        let prev = if left_side { self.ending_at(s) } else { None };
        let next = if right_side {
            self.starting_at(e)
        } else {
            None
        };
        let left = prev.is_some_and(|p| proto.merges_after(&p, pgoff));
        let mut right = next.is_some_and(|n| proto.merges_before(&n, pgoff, e - s));
        if left && right {
            let (p, n) = (prev.unwrap(), next.unwrap());
            // SAFETY: this `Edit` holds the mmap_lock write side.
            right = unsafe { anon_compatible(p.anon_vma(), n.anon_vma()) };
        }
        self.lock(v);
        // Every merge here moves pages between VMAs: under the rmap lock of
        // the family they join. Only the neighbours that merge count: a
        // neighbour left alone may belong to another family.
        let fam = match (left, right) {
            (true, true) => Self::merge_family(&[prev, next], anon.as_ref()),
            (true, false) => Self::merge_family(&[prev], anon.as_ref()),
            (false, true) => Self::merge_family(&[next], anon.as_ref()),
            (false, false) => None,
        };
        match (left, right) {
            (true, true) => {
                let (p, n) = (prev.unwrap(), next.unwrap());
                self.lock(p);
                self.lock(n);
                self.with_rmap(fam, |ed, mut idx| {
                    ed.inherit_anon(p, anon.or_else(|| n.anon_vma_arc()), idx.as_deref_mut());
                    ed.set_range_in(p, p.start(), n.end(), p.pgoff(), idx.as_deref_mut());
                    ed.detach_in(v, false, idx.as_deref_mut());
                    ed.detach_in(n, false, idx);
                });
                Ok(p)
            }
            (true, false) => {
                let p = prev.unwrap();
                self.lock(p);
                self.with_rmap(fam, |ed, mut idx| {
                    ed.inherit_anon(p, anon, idx.as_deref_mut());
                    ed.set_range_in(p, p.start(), e, p.pgoff(), idx.as_deref_mut());
                    if right_side {
                        ed.detach_in(v, false, idx);
                    } else {
                        ed.set_range_in(v, e, v.end(), v.pgoff_of(e), idx);
                    }
                });
                Ok(p)
            }
            (false, true) => {
                let n = next.unwrap();
                self.lock(n);
                self.with_rmap(fam, |ed, mut idx| {
                    ed.inherit_anon(n, anon, idx.as_deref_mut());
                    if left_side {
                        // `n` takes over `v`'s start (and reverse-map key):
                        // unlink `v` first. Readers that still find `v` in
                        // the tree until `n` is stored see it detached and
                        // look again.
                        ed.detach_in(v, false, idx.as_deref_mut());
                        ed.set_range_in(n, s, n.end(), pgoff, idx);
                    } else {
                        ed.set_range_in(n, s, n.end(), pgoff, idx.as_deref_mut());
                        ed.set_range_in(v, v.start(), s, v.pgoff(), idx);
                    }
                });
                Ok(n)
            }
            (false, false) => {
                let mut mid = v;
                if s > v.start() {
                    mid = self.split(v, s, true)?;
                }
                if e < mid.end() {
                    self.split(mid, e, true)?;
                }
                mid.set_flags(flags);
                mid.set_name(name);
                Ok(mid)
            }
        }
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
        let floor = self.prev(r.start).map_or(0, |p| p.end());
        let ceiling = self.find_after(r.start).map_or(u64::MAX, |n| n.start());
        let g = self.mm.pt.pin();
        self.mm
            .pt
            .free_tables_within(r, Range::new(floor, ceiling), &g);
    }

    /// A gather bound to this address space.
    pub(crate) fn gather(&self) -> Gather<'a> {
        Gather::new(&self.mm.tlb, &self.mm.stats, &self.mm.frames)
    }

    /// Unmaps `[start, end)` (page-aligned, inside the task): Linux's
    /// `do_vmi_munmap` after argument checks. Splits at both ends, removes
    /// every VMA inside, zaps their pages and frees page tables; one TLB
    /// flush covers it all.
    pub(crate) fn unmap(&mut self, r: Range) -> Result<()> {
        let mut gather = self.gather();
        let res = self.unmap_into(r, &mut gather);
        gather.flush();
        res
    }

    /// [`unmap`](Self::unmap) with the flush left to `gather` (an operation
    /// that unmaps several ranges flushes once). The zapped frames are freed
    /// only when `gather` flushes; detached VMAs and page-table pages are
    /// safe to release first (VMA objects are type-stable and tables go
    /// through the epoch).
    pub(crate) fn unmap_into(&mut self, r: Range, gather: &mut Gather<'_>) -> Result<()> {
        let Some(first) = self.find_after(r.start) else {
            return Ok(());
        };
        if first.start() >= r.end {
            return Ok(());
        }
        // A middle split needs one more VMA; head/tail-only unmaps may run
        // at the limit.
        if first.start() < r.start
            && r.end < first.end()
            && self.st.map_count >= self.mm.cfg.max_map_count
        {
            return Err(Error::NoMem);
        }
        if first.start() < r.start {
            self.split(first, r.start, false)?;
        }
        // `first` starts below `r.end`, so `r.end > 0`.
        if let Some(last) = self.find(r.end - 1) {
            if last.end() > r.end {
                self.split(last, r.end, false)?;
            }
        }
        let victims = self.vmas_in(r);
        for &v in &victims {
            self.lock(v);
        }
        // Point of no return: one store clears the range for readers.
        self.w.erase(r);
        self.zap(r, gather);
        self.detach_all(&victims);
        self.free_pgtables(r);
        Ok(())
    }
}

/// Zaps `r`'s entries into `gather` (also used under the mmap_lock read
/// side by madvise).
pub(crate) fn zap_range(mm: &AddressSpace, r: Range, gather: &mut Gather<'_>) {
    let g = mm.pt.pin();
    mm.pt.zap_range(r, &g, |va, frame| {
        gather.add_page(va);
        if let Some(pfn) = frame {
            gather.free_frame(pfn);
        }
    });
}
