//! Virtual memory areas: the VMA object, its flags, its refcount lock
//! (`lock`), its anon_vma, the shared object behind shared mappings
//! (`Shmem`), and the type-stable cache of VMA objects.
//!
//! # Locking
//!
//! A VMA's fields are written only by a writer that holds the mmap_lock for
//! write *and* has write-locked this VMA (or while the VMA is detached and
//! so unreachable for new readers). They are read by
//! - writers under the mmap_lock,
//! - fault-path readers that hold the VMA read lock (they re-validate
//!   `mm_id`, `start` and `end` first, because the object may have been
//!   recycled between the tree lookup and the lock),
//! - racing readers that merely look (`is_attached`, the lock words).
//!
//! Every field is an atomic so that a stale reader of a recycled object
//! reads *some* value, never a torn one; the lock protocol decides whether
//! it may use it. The two set-once fields (`anon_vma`, `shmem`) are raw
//! `Arc` pointers that change only while the VMA is detached, except that a
//! fault may fill an empty `anon_vma` with a compare-and-swap.

mod anon;
mod flags;
pub(crate) mod lock;
mod mappings;
mod pool;
pub(crate) mod seq;
mod shmem;

pub(crate) use anon::AnonVma;
pub use anon::RmapHit;
pub(crate) use anon::{for_each_family_run, link_all, unlink_all, RmapIndex};
pub use flags::VmFlags;
pub(crate) use mappings::{Mapper, Mappings};
pub(crate) use pool::{VmaPool, VmaRef};
pub(crate) use shmem::Shmem;

use crate::addr::{Range, PAGE_SHIFT};
use crate::stats::StatCounters;
use crate::sync::{Arc, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use crate::uffd::UffdCtx;
use lock::VmaLock;

/// Bytes of metadata charged to the budget for each VMA: the object and
/// about its share of the tree's nodes (75 bytes in `examples/footprint`;
/// Linux charges `vm_area_struct` and maple nodes to the memory cgroup
/// alike).
pub(crate) const VMA_BYTES: u64 = core::mem::size_of::<Vma>() as u64 + 80;

/// A virtual memory area. Objects come from a type-stable cache: a freed
/// VMA may be handed out again at once, so lock-free readers re-validate
/// (see the module docs).
pub struct Vma {
    /// The refcount lock, on a cache line of its own.
    /// Protected by: itself (the protocol table in `vma/lock.rs`).
    pub(crate) lock: VmaLock,
    /// The address space the object belongs to in its current life.
    /// Protected by: written while detached (just taken from the pool) and
    /// write-locked; read by lock-free readers, who re-check it after
    /// taking the read lock.
    mm_id: AtomicU64,
    /// Protected by: the VMA write lock (mmap_lock writer) for stores;
    /// stable under the VMA read lock or the mmap_lock read side, except
    /// that an end-only move (brk) may change `end` under a reader of the
    /// anon_vma family (see the `vma::anon` module docs).
    start: AtomicU64,
    /// Protected by: as `start`.
    end: AtomicU64,
    /// Protected by: as `start`.
    pgoff: AtomicU64,
    /// Protected by: the VMA write lock for stores; stable under the VMA
    /// read lock or the mmap_lock read side.
    flags: AtomicU32,
    /// Protected by: the VMA write lock, or, for the first anon_vma only,
    /// a compare-exchange from null by a fault holding the VMA read lock
    /// and the family lock (`install_anon_vma`); once set it changes only
    /// under the write lock. Dereferenced only by a holder of the VMA.
    anon_vma: AtomicPtr<AnonVma>,
    /// Protected by: the VMA write lock (set before attach, cleared after
    /// detach); dereferenced only by a holder of the VMA.
    shmem: AtomicPtr<Shmem>,
    /// Protected by: the VMA write lock; read under the mmap_lock.
    name: AtomicPtr<AnonName>,
    /// The userfault context the VMA is registered with
    /// (`vm_userfaultfd_ctx`), null if none; set with the `UFFD_*` flags.
    /// Protected by: the VMA write lock (mmap_lock writer) for stores;
    /// dereferenced only by a holder of the VMA (its read lock or the
    /// mmap_lock).
    uffd: AtomicPtr<UffdCtx>,
}

/// The name of an anonymous VMA (`PR_SET_VMA_ANON_NAME`), shared by the
/// VMAs split from one another.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct AnonName(pub(crate) Box<str>);

impl Vma {
    /// A detached VMA object. Only [`VmaPool::alloc`] calls this, which is
    /// what makes every `Vma` type-stable (see `as_ref_unchecked`).
    fn new_detached() -> Self {
        Vma {
            lock: VmaLock::new(),
            mm_id: AtomicU64::new(0),
            start: AtomicU64::new(0),
            end: AtomicU64::new(0),
            pgoff: AtomicU64::new(0),
            flags: AtomicU32::new(0),
            anon_vma: AtomicPtr::new(core::ptr::null_mut()),
            shmem: AtomicPtr::new(core::ptr::null_mut()),
            name: AtomicPtr::new(core::ptr::null_mut()),
            uffd: AtomicPtr::new(core::ptr::null_mut()),
        }
    }

    /// The address space this object currently belongs to.
    #[inline]
    pub(crate) fn mm_id(&self) -> u64 {
        self.mm_id.load(Ordering::Relaxed)
    }

    /// First address.
    #[inline]
    pub fn start(&self) -> u64 {
        self.start.load(Ordering::Relaxed)
    }

    /// First address past the end.
    #[inline]
    pub fn end(&self) -> u64 {
        self.end.load(Ordering::Relaxed)
    }

    /// `[start, end)`.
    #[inline]
    pub fn range(&self) -> Range {
        Range::new(self.start(), self.end())
    }

    /// Page offset of `start` in the backing object (`vm_pgoff`).
    #[inline]
    pub fn pgoff(&self) -> u64 {
        self.pgoff.load(Ordering::Relaxed)
    }

    /// The flags.
    #[inline]
    pub fn flags(&self) -> VmFlags {
        VmFlags::from_bits_retain(self.flags.load(Ordering::Relaxed))
    }

    /// Page offset of `addr` (inside the VMA) in the backing object.
    #[inline]
    pub(crate) fn pgoff_of(&self, addr: u64) -> u64 {
        self.pgoff() + ((addr - self.start()) >> PAGE_SHIFT)
    }

    /// True for anonymous memory with no backing object.
    #[inline]
    pub(crate) fn is_anonymous(&self) -> bool {
        self.shmem.load(Ordering::Relaxed).is_null()
    }

    /// True if `self` and `other` have the same backing: both anonymous,
    /// or both mapping the same shared object (Linux compares `vm_file`).
    /// Compares the object pointers only; the caller holds both VMAs still
    /// (the mmap_lock), so neither changes meanwhile.
    pub(crate) fn same_backing(&self, other: &Vma) -> bool {
        self.shmem.load(Ordering::Relaxed) == other.shmem.load(Ordering::Relaxed)
    }

    pub(crate) fn set_range(&self, start: u64, end: u64, pgoff: u64) {
        self.start.store(start, Ordering::Relaxed);
        self.end.store(end, Ordering::Relaxed);
        self.pgoff.store(pgoff, Ordering::Relaxed);
    }

    /// Moves only the end (start and page offset stay).
    pub(crate) fn set_end(&self, end: u64) {
        self.end.store(end, Ordering::Relaxed);
    }

    pub(crate) fn set_flags(&self, f: VmFlags) {
        self.flags.store(f.bits(), Ordering::Relaxed);
    }

    pub(crate) fn set_mm(&self, id: u64) {
        self.mm_id.store(id, Ordering::Relaxed);
    }

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
    fn put_anon(&self, a: Arc<AnonVma>) -> u64 {
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
    fn take_anon(&self) -> Option<Arc<AnonVma>> {
        let old = self.anon_vma.swap(core::ptr::null_mut(), Ordering::AcqRel);
        // SAFETY: a non-null `old` came from `Arc::into_raw` in `put_anon`
        // or `install_anon_vma`; the swap took it out of the VMA, so this
        // is its only release. Readers that could still use it hold the
        // VMA (read lock or mmap_lock), which the caller excludes.
        (!old.is_null()).then(|| unsafe { Arc::from_raw(old) })
    }

    /// This object as a `VmaRef`.
    fn as_ref_unchecked(&self) -> VmaRef {
        // SAFETY: every `Vma` lives in a `VmaPool`: `new_detached` is
        // private to this module and only `VmaPool::alloc` calls it, and
        // the pool keeps its objects until it is dropped, after every
        // holder of their handles (the tree and the address space).
        unsafe { VmaRef::from_vma(self) }
    }

    /// Fills an empty anon_vma (fault path, racing other faults of the same
    /// VMA) and links the VMA into the family's reverse map, under the
    /// family's lock (counted). Returns the anon_vma now installed.
    pub(crate) fn install_anon_vma(&self, a: Arc<AnonVma>, stats: &StatCounters) -> &AnonVma {
        let keep = a.clone();
        let mut idx = keep.root().lock(Some(stats));
        let id = a.id();
        let new = Arc::into_raw(a) as *mut AnonVma;
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
    /// new one: `Edit::new_vma`).
    pub(crate) fn set_shmem(&self, s: Option<Arc<Shmem>>) {
        let new = s.map_or(core::ptr::null_mut(), |s| Arc::into_raw(s) as *mut Shmem);
        let old = self.shmem.swap(new, Ordering::AcqRel);
        if !old.is_null() {
            // SAFETY: as in `set_anon_vma`.
            let old = unsafe { Arc::from_raw(old) };
            old.mappings.unregister(self.as_ref_unchecked());
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
        let new = n.map_or(core::ptr::null_mut(), |n| Arc::into_raw(n) as *mut AnonName);
        let old = self.name.swap(new, Ordering::AcqRel);
        if !old.is_null() {
            // SAFETY: `old` came from `Arc::into_raw` here; the swap took
            // it out of the VMA, so this is its only release, and no
            // reader holds it (they hold the mmap_lock, which our caller
            // holds for write).
            unsafe { drop(Arc::from_raw(old)) };
        }
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
        let new = c.map_or(core::ptr::null_mut(), |c| Arc::into_raw(c) as *mut UffdCtx);
        let old = self.uffd.swap(new, Ordering::AcqRel);
        if !old.is_null() {
            // SAFETY: as in `set_name`: the swap took the VMA's count out,
            // and no holder of the VMA runs now.
            unsafe { drop(Arc::from_raw(old)) };
        }
    }
}

impl Drop for Vma {
    fn drop(&mut self) {
        self.set_uffd(None);
        self.set_anon_vma(None);
        self.set_shmem(None);
        self.set_name(None);
    }
}
