//! A VMA's life in an edit: made (from the type-stable pool, stamped
//! before any field changes), attached, and detached back to the pool.

use super::Edit;
use crate::addr::Range;
use crate::percpu::cpu_id;
use crate::stats::Event;
use crate::sync::Arc;
use crate::vma::userfault::UffdCtx;
use crate::vma::{AnonName, AnonVma, RmapIndex, Shmem, VmFlags, Vma, VmaRef, VMA_BYTES};

/// A VMA to create, or a range to map: where, at which page offset, with
/// which flags and backing. Built fresh for new memory, or [`like`]
/// (Self::like) an existing VMA when one is split, grown or moved.
pub(crate) struct VmaSpec {
    pub(crate) range: Range,
    /// Page offset of `range.start` (`vm_pgoff`).
    pub(crate) pgoff: u64,
    pub(crate) flags: VmFlags,
    pub(crate) anon: Option<Arc<AnonVma>>,
    pub(crate) shmem: Option<Arc<Shmem>>,
    pub(crate) name: Option<Arc<AnonName>>,
    /// The userfault context the range is registered with.
    pub(crate) uffd: Option<Arc<UffdCtx>>,
}

impl VmaSpec {
    /// Private anonymous memory with no anon_vma, object or name yet.
    pub(crate) fn anon(range: Range, pgoff: u64, flags: VmFlags) -> Self {
        VmaSpec {
            range,
            pgoff,
            flags,
            anon: None,
            shmem: None,
            name: None,
            uffd: None,
        }
    }

    /// `range` at page offset `pgoff`, with `v`'s flags, anon_vma, object
    /// and name. The caller holds `v` (the mmap_lock write side).
    pub(crate) fn like(v: &Vma, range: Range, pgoff: u64) -> Self {
        VmaSpec {
            range,
            pgoff,
            flags: v.flags(),
            anon: v.anon_vma_arc(),
            shmem: v.shmem_arc(),
            name: v.name_arc(),
            uffd: v.uffd_arc(),
        }
    }
}

impl Edit<'_> {
    /// A new, detached, write-locked VMA as `spec` describes it (linked
    /// into its anon_vma's reverse map under that family's lock).
    pub(crate) fn new_vma(&mut self, spec: VmaSpec) -> VmaRef {
        self.new_vma_in(spec, None)
    }

    /// [`new_vma`](Self::new_vma) for a caller that may already hold the
    /// family's lock (`idx`, which must be the family of `spec.anon`).
    pub(in crate::mm) fn new_vma_in(
        &mut self,
        spec: VmaSpec,
        idx: Option<&mut RmapIndex>,
    ) -> VmaRef {
        let VmaSpec {
            range: r,
            pgoff,
            flags,
            anon,
            shmem,
            name,
            uffd,
        } = spec;
        // Callers checked for room (`vma_room`) before changing anything;
        // a concurrent charge from another space may pass the limit by a
        // VMA or two. The bytes come from this CPU's stock when it holds
        // them (an unmap's uncharge refills it), so a writer's loop writes
        // no shared line of the budget.
        let cpu = cpu_id();
        self.mm.frames.memory().force_charge_on(cpu, VMA_BYTES);
        let (v, reused) = self.mm.pool.get().alloc_on(cpu);
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
        if let Some(obj) = &shmem {
            // Filed before it is attached: a shrink then sees every VMA a
            // fault can reach (see `vma::mappings`).
            obj.mappings.register(v, self.mm.mapper());
        }
        v.set_shmem(shmem);
        v.set_name(name);
        v.set_uffd(uffd);
        v
    }

    /// Links `v`, which has no anon_vma, to `anon` (if any), with the
    /// family's lock held by the caller (`idx`) or taken here.
    pub(in crate::mm) fn link_in(
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
        self.store(v.range(), v);
        self.add_map_count(1);
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
            v.set_uffd(None);
        }
        crate::vma::unlink_all(vs, &self.mm.stats);
        self.add_map_count(-(vs.len() as isize));
        // One CPU for the batch (a thread that moves meanwhile only
        // writes its old CPU's lines).
        let (cpu, pool) = (cpu_id(), self.mm.pool.get());
        for &v in vs {
            pool.free_on(cpu, v);
        }
        self.mm
            .frames
            .memory()
            .uncharge_on(cpu, VMA_BYTES * vs.len() as u64);
    }

    /// Removes one VMA from the tree if `erase` (else its range is no
    /// longer there), as [`detach_all`](Self::detach_all) does, for a
    /// caller that may hold the lock of `v`'s anon_vma family (`idx`).
    pub(in crate::mm) fn detach_in(&mut self, v: VmaRef, erase: bool, idx: Option<&mut RmapIndex>) {
        self.lock(v);
        if erase {
            let r = v.range();
            // Erase only what still maps to `v`: a survivor may already
            // have been stored over part of it.
            let parts: Vec<Range> = self
                .entries_in(r)
                .into_iter()
                .filter(|(_, x)| **x == v)
                .map(|(r, _)| r)
                .collect();
            for p in parts {
                self.erase(p);
            }
        }
        v.lock.mark_detached();
        v.set_uffd(None);
        match idx {
            Some(idx) => v.unlink_anon_held(idx),
            None => v.set_anon_vma_counted(None, Some(&self.mm.stats)),
        }
        self.add_map_count(-1);
        let cpu = cpu_id();
        self.mm.pool.get().free_on(cpu, v);
        self.mm.frames.memory().uncharge_on(cpu, VMA_BYTES);
    }
}
