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
use crate::addr::Range;
use crate::error::{Error, Result};
use crate::reclaim::Guard;
use crate::stats::Event;
use crate::sync::Arc;
use crate::tlb::Gather;
use crate::tree::TreeWriter;
use crate::vma::{AnonVma, RmapIndex, Shmem, VmFlags, VmaRef, VMA_BYTES};

/// An mmap_lock writer's view of the address space.
pub(crate) struct Edit<'a> {
    pub(crate) mm: &'a AddressSpace,
    pub(crate) st: MmapWriteGuard<'a, MmState>,
    pub(crate) w: TreeWriter<'a, VmaRef>,
    pub(crate) g: Guard,
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
    pub(super) fn new_vma_in(
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
        let (v, reused) = self.mm.pool.get().alloc();
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
    pub(super) fn link_in(
        &self,
        v: VmaRef,
        anon: Option<Arc<AnonVma>>,
        idx: Option<&mut RmapIndex>,
    ) {
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
            self.mm.pool.get().free(v);
        }
        self.mm
            .frames
            .memory()
            .uncharge(VMA_BYTES * vs.len() as u64);
    }

    /// Removes one VMA from the tree if `erase` (else its range is no
    /// longer there), as [`detach_all`](Self::detach_all) does, for a
    /// caller that may hold the lock of `v`'s anon_vma family (`idx`).
    pub(super) fn detach_in(&mut self, v: VmaRef, erase: bool, idx: Option<&mut RmapIndex>) {
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
        self.mm.pool.get().free(v);
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
