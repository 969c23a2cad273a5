//! When VMAs merge (Linux's `vma_merge_new_range` and
//! `vma_merge_existing_range`), and the edits that merge them.
//!
//! The rules (flags, name, object, offsets, anon_vma compatibility) are
//! written once, in [`Proto`]; both entry points ask [`Proto::neighbours`]
//! which neighbours a range joins, then carry the answer out with the
//! primitive edits of [`Edit`]. Every edit runs in an mmap_lock writer;
//! merges that move pages between VMAs hold the family's reverse-map lock
//! (the lock order is in [`crate::mm`]).

use super::edit::{Edit, VmaSpec};
use crate::addr::{pages, Range};
use crate::error::Result;
use crate::sync::Arc;
use crate::vma::userfault::UffdCtx;
use crate::vma::{AnonName, AnonVma, RmapIndex, Shmem, VmFlags, Vma, VmaRef};

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
    /// The range's userfault context: VMAs merge only with the same one
    /// (Linux's `is_mergeable_vm_userfaultfd_ctx`). Compared, never
    /// dereferenced.
    pub(crate) uffd: *const UffdCtx,
}

impl Proto<'_> {
    /// `prev` may absorb a range starting at `prev.end()` with page offset
    /// `pgoff` (Linux's `can_vma_merge_after`).
    fn merges_after(&self, prev: &Vma, pgoff: u64) -> bool {
        // SAFETY: merge decisions run in an mmap_lock writer (`Edit`).
        let (shmem, anon) = unsafe { (prev.shmem(), prev.anon_vma()) };
        flags_mergeable(prev.flags(), self.flags)
            && prev.name() == self.name
            && prev.uffd_ptr() == self.uffd
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
            && next.uffd_ptr() == self.uffd
            && same_shmem(shmem, self.shmem)
            && anon_mergeable(self.anon, self.singular, anon)
            && pgoff + pages(len) == next.pgoff()
    }

    /// The neighbours a range of `len` bytes at page offset `pgoff` joins:
    /// `prev` (ending at its start) if it may absorb the range, `next`
    /// (starting at its end) if it may; both only if deleting `next` into
    /// `prev` is also allowed (their anon_vmas are compatible).
    fn neighbours(
        &self,
        prev: Option<VmaRef>,
        next: Option<VmaRef>,
        pgoff: u64,
        len: u64,
    ) -> (Option<VmaRef>, Option<VmaRef>) {
        let prev = prev.filter(|p| self.merges_after(p, pgoff));
        let mut next = next.filter(|n| self.merges_before(n, pgoff, len));
        if let (Some(p), Some(n)) = (prev, next) {
            // SAFETY: merge decisions run in an mmap_lock writer (`Edit`).
            let ok = unsafe { anon_compatible(p.anon_vma(), n.anon_vma()) };
            if !ok {
                next = None;
            }
        }
        (prev, next)
    }
}

impl Edit<'_> {
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

    /// `p` absorbs everything up to `n`'s end, and `n` and `mid` (the VMA
    /// being modified, if any) go: the merge of both neighbours. Pages
    /// move between VMAs, so it runs under the family's rmap lock.
    fn merge_both(
        &mut self,
        p: VmaRef,
        n: VmaRef,
        mid: Option<VmaRef>,
        anon: Option<Arc<AnonVma>>,
    ) {
        self.lock(p);
        self.lock(n);
        let fam = Self::merge_family(&[Some(p), Some(n)], anon.as_ref());
        self.with_rmap(fam, |ed, mut idx| {
            ed.inherit_anon(p, anon.or_else(|| n.anon_vma_arc()), idx.as_deref_mut());
            ed.set_range_in(p, p.start(), n.end(), p.pgoff(), idx.as_deref_mut());
            if let Some(v) = mid {
                ed.detach_in(v, false, idx.as_deref_mut());
            }
            ed.detach_in(n, false, idx);
        });
    }

    /// Maps a new range (`spec.range`, with no VMA in it): merges with the
    /// neighbours where Linux would (`vma_merge_new_range`), else inserts
    /// a new VMA. Returns the VMA that covers the range.
    pub(crate) fn map_new(&mut self, spec: VmaSpec) -> VmaRef {
        let (r, pgoff) = (spec.range, spec.pgoff);
        let proto = Proto {
            flags: spec.flags,
            anon: spec.anon.as_deref(),
            shmem: spec.shmem.as_deref(),
            singular: true,
            name: spec.name.as_deref().map(|n| &*n.0),
            uffd: spec.uffd.as_ref().map_or(core::ptr::null(), Arc::as_ptr),
        };
        let (prev, next) = proto.neighbours(
            self.ending_at(r.start),
            self.starting_at(r.end),
            pgoff,
            r.len(),
        );
        match (prev, next) {
            (Some(p), Some(n)) => {
                // next's pages move to prev: an importer, under the lock.
                self.merge_both(p, n, None, spec.anon);
                p
            }
            (Some(p), None) => {
                self.lock(p);
                self.inherit_anon(p, spec.anon, None);
                // Only prev's end moves, over an empty range.
                self.set_range(p, p.start(), r.end, p.pgoff());
                p
            }
            (None, Some(n)) => {
                self.lock(n);
                self.inherit_anon(n, spec.anon, None);
                self.set_range(n, r.start, n.end(), pgoff);
                n
            }
            (None, None) => {
                let v = self.new_vma(spec);
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
        let uffd = v.uffd_arc();
        self.modify_uffd(v, s, e, flags, name, uffd)
    }

    /// [`modify`](Self::modify) that also registers `[s, e)` with the
    /// userfault context `uffd` (none: unregistered), as Linux's
    /// `vma_modify_flags_uffd` does for `UFFDIO_REGISTER` and
    /// `UFFDIO_UNREGISTER`.
    pub(crate) fn modify_uffd(
        &mut self,
        v: VmaRef,
        s: u64,
        e: u64,
        flags: VmFlags,
        name: Option<Arc<AnonName>>,
        uffd: Option<Arc<UffdCtx>>,
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
            uffd: uffd.as_ref().map_or(core::ptr::null(), Arc::as_ptr),
        };
        // Only a change that reaches an end of `v` can join the neighbour
        // on that side.
        let (prev, next) = proto.neighbours(
            left_side.then(|| self.ending_at(s)).flatten(),
            right_side.then(|| self.starting_at(e)).flatten(),
            pgoff,
            e - s,
        );
        self.lock(v);
        // Every merge here moves pages between VMAs: under the rmap lock of
        // the family they join. Only the neighbours that merge count: a
        // neighbour left alone may belong to another family.
        let merged: Result<VmaRef> = match (prev, next) {
            (Some(p), Some(n)) => {
                self.merge_both(p, n, Some(v), anon);
                Ok(p)
            }
            (Some(p), None) => {
                self.lock(p);
                let fam = Self::merge_family(&[prev], anon.as_ref());
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
            (None, Some(n)) => {
                self.lock(n);
                let fam = Self::merge_family(&[next], anon.as_ref());
                self.with_rmap(fam, |ed, mut idx| {
                    ed.inherit_anon(n, anon, idx.as_deref_mut());
                    if left_side {
                        // `n` takes over `v`'s start (and reverse-map key):
                        // unlink `v` first. Readers that still find `v` in
                        // the tree until `n` is stored see it detached and
                        // look again.
                        // `n` is filed over `v`'s range first, so that a
                        // shrink of their object never finds it unmapped.
                        if let Some(obj) = n.shmem_arc() {
                            obj.mappings.cover(n, Range::new(s, n.end()), pgoff);
                        }
                        ed.detach_in(v, false, idx.as_deref_mut());
                        ed.set_range_in(n, s, n.end(), pgoff, idx);
                    } else {
                        ed.set_range_in(n, s, n.end(), pgoff, idx.as_deref_mut());
                        ed.set_range_in(v, v.start(), s, v.pgoff(), idx);
                    }
                });
                Ok(n)
            }
            (None, None) => {
                let mut mid = v;
                if s > v.start() {
                    mid = self.split(v, s, true)?;
                }
                if e < mid.end() {
                    self.split(mid, e, true)?;
                }
                mid.set_flags(flags);
                mid.set_name(name);
                mid.set_uffd(uffd);
                Ok(mid)
            }
        };
        // The result takes exactly `flags`, as Linux's callers reset the
        // merged VMA's flags to the new ones: a merge target's
        // VM_SOFTDIRTY (the only bit that may differ) gives way to `v`'s.
        let merged = merged?;
        merged.set_flags(flags);
        Ok(merged)
    }
}
