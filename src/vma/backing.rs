//! What a VMA points to: its anon_vma, its shared object, its name and
//! its userfault context, each an `Arc` held through an atomic pointer in
//! the VMA, and the holds under which each may be read or replaced.

use super::userfault::UffdCtx;
use super::{AnonName, AnonVma, RmapIndex, Shmem, Vma, VmaRef};
use crate::stats::StatCounters;
use crate::sync::{Arc, AtomicPtr, Ordering};

/// Replaces the `Arc` an atomic pointer of a VMA holds with `new`, and
/// returns the one it held, as a swap would. Its callers are the setters
/// below and `take_anon`, whose caller has the VMA write-locked or
/// detached: one writer at a time, ordered after the last by the hold
/// that makes it one. So a load and a store replace the value, not a
/// swap: a writer making or freeing a
/// VMA sets three such pointers, mostly null over null, and a swap is a
/// locked read-modify-write each (`docs/RESULTS.md`, "Single-writer VMA
/// pointers"). Null over null stores nothing.
fn replace<T>(slot: &AtomicPtr<T>, new: Option<Arc<T>>) -> Option<Arc<T>> {
    let new = new.map_or(core::ptr::null_mut(), |n| Arc::into_raw(n) as *mut T);
    let old = slot.load(Ordering::Acquire);
    if old.is_null() && new.is_null() {
        return None;
    }
    // Release: a reader that loads `new` sees the object it points to.
    slot.store(new, Ordering::Release);
    // SAFETY: a non-null `old` came from `Arc::into_raw` in an earlier
    // store of this slot (a `replace`, or for the anon_vma `put_anon` or
    // `install_anon_vma`), and the VMA owned that count; the store
    // above took it out of the VMA, and only this writer could have (see
    // above), so this is its one release.
    (!old.is_null()).then(|| unsafe { Arc::from_raw(old) })
}

impl Vma {
    /// The anon_vma, if one was assigned.
    ///
    /// # Safety
    ///
    /// The caller holds the VMA while it uses the reference: its read
    /// lock, the mmap_lock (either side), or the VMA is detached and
    /// owned by the caller. The pointer changes from none to some under a
    /// read lock, and back only while the VMA is write-locked or detached,
    /// which every such hold excludes. [`has_anon_vma`](Self::has_anon_vma)
    /// needs no hold.
    pub(crate) unsafe fn anon_vma(&self) -> Option<&AnonVma> {
        let p = self.anon_vma.load(Ordering::Acquire);
        // SAFETY: a non-null pointer came from `Arc::into_raw` in
        // `link_anon_held`/`install_anon_vma`; that strong count is
        // released only by `unlink_anon_held`, which runs while the VMA is
        // write-locked or detached and so not held by our caller (see the
        // method's contract).
        unsafe { p.as_ref() }
    }

    /// True if an anon_vma was assigned. Reads only the pointer, so it is
    /// safe without holding the VMA (the speculative fault's snapshot).
    #[inline]
    pub(crate) fn has_anon_vma(&self) -> bool {
        !self.anon_vma.load(Ordering::Relaxed).is_null()
    }

    /// True if the VMA maps a shared object. Reads only the pointer, so it
    /// is safe without holding the VMA.
    #[inline]
    pub(crate) fn has_shmem(&self) -> bool {
        !self.shmem.load(Ordering::Relaxed).is_null()
    }

    /// The anon_vma as an owned handle.
    pub(crate) fn anon_vma_arc(&self) -> Option<Arc<AnonVma>> {
        let p = self.anon_vma.load(Ordering::Acquire);
        if p.is_null() {
            return None;
        }
        // SAFETY: `p` came from `Arc::into_raw` and the VMA still owns that
        // count (caller holds the VMA); bump it before making an Arc.
        unsafe {
            Arc::increment_strong_count(p);
            Some(Arc::from_raw(p))
        }
    }

    /// Sets the anon_vma of a VMA nobody else can see (detached) or that
    /// is write-locked, unlinking it from the old family's reverse map and
    /// linking it into the new one (each under that family's lock, counted
    /// in `stats` when given).
    pub(crate) fn set_anon_vma(&self, a: Option<Arc<AnonVma>>) {
        self.set_anon_vma_counted(a, None);
    }

    /// [`set_anon_vma`](Self::set_anon_vma), counting lock acquisitions.
    pub(crate) fn set_anon_vma_counted(
        &self,
        a: Option<Arc<AnonVma>>,
        stats: Option<&StatCounters>,
    ) {
        if let Some(old) = self.anon_vma_arc() {
            let mut idx = old.root().lock(stats);
            self.unlink_anon_held(&mut idx);
        }
        if let Some(a) = a {
            let root = a.clone();
            let mut idx = root.root().lock(stats);
            self.link_anon_held(a, &mut idx);
        }
    }

    /// Links a VMA that has no anon_vma to `a`; the caller holds the lock
    /// of `a`'s family (`idx`) and has the VMA write-locked or detached.
    pub(crate) fn link_anon_held(&self, a: Arc<AnonVma>, idx: &mut RmapIndex) {
        let id = self.put_anon(a);
        idx.insert(self.as_ref_unchecked(), id);
    }

    /// Stores `a` as the anon_vma of a VMA that has none, without filing
    /// it in the reverse map (the caller does, under the family's lock, as
    /// [`anon::link_all`] does for a batch). Returns the anon_vma's id.
    pub(super) fn put_anon(&self, a: Arc<AnonVma>) -> u64 {
        debug_assert!(!self.has_anon_vma());
        let id = a.id();
        let new = Arc::into_raw(a) as *mut AnonVma;
        self.anon_vma.store(new, Ordering::Release);
        id
    }

    /// Unlinks the VMA from its anon_vma (if any); the caller holds the
    /// lock of that anon_vma's family (`idx`) and has the VMA write-locked
    /// or detached.
    pub(crate) fn unlink_anon_held(&self, idx: &mut RmapIndex) {
        if let Some(old) = self.take_anon() {
            let found = idx.remove(self.as_ref_unchecked());
            debug_assert!(found, "VMA with an anon_vma was not in the rmap");
            drop(old);
        }
    }

    /// Takes the anon_vma out of the VMA, leaving the reverse-map entry to
    /// the caller (who removes it under the family's lock, as
    /// [`anon::unlink_all`] does for a batch). The caller has the VMA
    /// write-locked or detached.
    pub(super) fn take_anon(&self) -> Option<Arc<AnonVma>> {
        // The faults that install one (`install_anon_vma`) hold the VMA,
        // which the caller excludes, as it does every reader that could
        // still use the old one: one writer, as for the setters.
        replace(&self.anon_vma, None)
    }

    /// This object as a `VmaRef`.
    pub(super) fn as_ref_unchecked(&self) -> VmaRef {
        // SAFETY: every `Vma` lives in a `VmaPool`: `new_detached` is
        // private to this module and only `VmaPool::alloc_on` calls it
        // (through `alloc_slow`), and the pool keeps its objects until it
        // is dropped, after every holder of their handles (the tree and
        // the address space).
        unsafe { VmaRef::from_vma(self) }
    }

    /// Fills an empty anon_vma (fault path, racing other faults of the same
    /// VMA) and links the VMA into the family's reverse map, under the
    /// family's lock (counted). Returns the anon_vma now installed.
    pub(crate) fn install_anon_vma(&self, a: Arc<AnonVma>, stats: &StatCounters) -> &AnonVma {
        let id = a.id();
        let new = Arc::into_raw(a) as *mut AnonVma;
        // SAFETY: `new` holds the count `a` had, so it lives until that
        // count is released: below on a lost race (after the guard is
        // dropped), else by the VMA, which releases its anon_vma only
        // while detached or write-locked, which the caller's hold excludes
        // for as long as it uses the returned reference (and we the guard).
        let mut idx = unsafe { &*new }.root().lock(Some(stats));
        match self.anon_vma.compare_exchange(
            core::ptr::null_mut(),
            new,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => {
                idx.insert(self.as_ref_unchecked(), id);
                drop(idx);
                // SAFETY: we just published `new`; it stays alive while the
                // VMA holds it (see `anon_vma`).
                unsafe { &*new }
            }
            Err(existing) => {
                drop(idx);
                // SAFETY: `new` was never published; we own its count (the
                // guard borrowed from it was dropped just above).
                unsafe { drop(Arc::from_raw(new)) };
                // SAFETY: `existing` is non-null and owned by the VMA.
                unsafe { &*existing }
            }
        }
    }

    /// The shared backing object, if any.
    ///
    /// # Safety
    ///
    /// As for [`anon_vma`](Self::anon_vma): the caller holds the VMA while
    /// it uses the reference (the object is set and released only while
    /// the VMA is detached). [`has_shmem`](Self::has_shmem) needs no hold.
    pub(crate) unsafe fn shmem(&self) -> Option<&Shmem> {
        let p = self.shmem.load(Ordering::Acquire);
        // SAFETY: as in `anon_vma`: set from `Arc::into_raw` while detached
        // and released only while detached.
        unsafe { p.as_ref() }
    }

    /// The shared backing object as an owned handle.
    pub(crate) fn shmem_arc(&self) -> Option<Arc<Shmem>> {
        let p = self.shmem.load(Ordering::Acquire);
        if p.is_null() {
            return None;
        }
        // SAFETY: as in `anon_vma_arc`.
        unsafe {
            Arc::increment_strong_count(p);
            Some(Arc::from_raw(p))
        }
    }

    /// Sets the backing object of a detached VMA. Releasing an object
    /// takes the VMA out of the object's mappings (the caller registers a
    /// new one: `Edit::new_vma`); releasing a file object from a shared
    /// mapping (munmap, or the VMA replaced by a split or merge) writes
    /// back the dirty pages of its range ([`crate::file`]: host I/O
    /// under the caller's locks, the mmap_lock write side among them; an
    /// error is not reported here, the pages stay dirty for the next
    /// sync or the object's drop).
    pub(crate) fn set_shmem(&self, s: Option<Arc<Shmem>>) {
        if let Some(old) = replace(&self.shmem, s) {
            old.mappings.unregister(self.as_ref_unchecked());
            if old.host.is_some() && self.flags().contains(super::VmFlags::SHARED) {
                let r = self.range();
                let first = self.pgoff();
                let pages = (r.end - r.start) >> crate::addr::PAGE_SHIFT;
                let _ = old.writeback(first, first.saturating_add(pages));
            }
        }
    }

    /// The VMA's name, if any. The caller holds the mmap_lock (either
    /// side): names change only under its write side.
    pub(crate) fn name(&self) -> Option<&str> {
        let p = self.name.load(Ordering::Acquire);
        // SAFETY: a non-null pointer came from `Arc::into_raw` in
        // `set_name`, whose count is released only by a later `set_name`,
        // which runs under the mmap_lock write side; the caller holds the
        // mmap_lock, so it does not run now.
        unsafe { p.as_ref() }.map(|n| &*n.0)
    }

    /// The name as an owned handle (for a VMA made from this one).
    pub(crate) fn name_arc(&self) -> Option<Arc<AnonName>> {
        let p = self.name.load(Ordering::Acquire);
        if p.is_null() {
            return None;
        }
        // SAFETY: as in `name`; bump the count the VMA owns before making
        // an Arc of it.
        unsafe {
            Arc::increment_strong_count(p);
            Some(Arc::from_raw(p))
        }
    }

    /// Sets the name; the caller holds the mmap_lock write side and has
    /// this VMA write-locked or detached.
    pub(crate) fn set_name(&self, n: Option<Arc<AnonName>>) {
        // No reader holds the old name: readers hold the mmap_lock (or
        // the VMA's range), which our caller holds for write.
        drop(replace(&self.name, n));
    }
}

impl Vma {
    /// The userfault context, as a pointer only compared (merge rules),
    /// never dereferenced.
    #[inline]
    pub(crate) fn uffd_ptr(&self) -> *const UffdCtx {
        self.uffd.load(Ordering::Relaxed)
    }

    /// The userfault context as an owned handle. The caller holds the VMA
    /// (its read lock or the mmap_lock).
    pub(crate) fn uffd_arc(&self) -> Option<Arc<UffdCtx>> {
        let p = self.uffd.load(Ordering::Acquire);
        if p.is_null() {
            return None;
        }
        // SAFETY: `p` came from `Arc::into_raw` in `set_uffd`; that count
        // is released only by a later `set_uffd`, under the VMA write
        // lock, which the caller's hold excludes. Bump it before making an
        // Arc of it.
        unsafe {
            Arc::increment_strong_count(p);
            Some(Arc::from_raw(p))
        }
    }

    /// Sets the userfault context; the caller has the VMA write-locked or
    /// detached.
    pub(crate) fn set_uffd(&self, c: Option<Arc<UffdCtx>>) {
        // No holder of the VMA runs now (see above).
        drop(replace(&self.uffd, c));
    }
}

#[cfg(all(test, not(aspace_loom)))]
mod tests {
    use super::*;
    use crate::vma::AnonName;

    fn name(s: &str) -> Arc<AnonName> {
        Arc::new(AnonName(s.into()))
    }

    /// The setters' load and store keep a swap's counts: the VMA owns one
    /// count of what it points to, a replaced object's count is released
    /// once, setting the same object again keeps one, and dropping the
    /// VMA releases the last.
    #[test]
    fn a_replaced_pointer_releases_its_count_once() {
        let v = Vma::new_detached();
        let (a, b) = (name("a"), name("b"));
        v.set_name(Some(a.clone()));
        assert_eq!((Arc::strong_count(&a), v.name()), (2, Some("a")));
        v.set_name(Some(a.clone()));
        assert_eq!(Arc::strong_count(&a), 2, "the same object again");
        v.set_name(Some(b.clone()));
        assert_eq!((Arc::strong_count(&a), Arc::strong_count(&b)), (1, 2));
        assert_eq!(v.name(), Some("b"));
        v.set_name(None);
        assert_eq!((Arc::strong_count(&b), v.name()), (1, None));
        v.set_name(None);
        assert_eq!(v.name(), None, "none over none");
        v.set_name(Some(b.clone()));
        drop(v);
        assert_eq!(Arc::strong_count(&b), 1, "the VMA's drop releases it");
    }
}
