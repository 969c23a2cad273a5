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
mod backing;
mod chunk_map;
mod flags;
pub(crate) mod lock;
mod mappings;
mod pagecache;
mod pool;
pub(crate) mod seq;
mod shmem;
pub(crate) mod userfault;

pub(crate) use anon::AnonVma;
pub use anon::RmapHit;
pub(crate) use anon::{for_each_family_run, link_all, unlink_all, RmapIndex};
pub use flags::VmFlags;
pub(crate) use mappings::{Mapper, Mappings};
pub(crate) use pool::{VmaPool, VmaRef};
pub(crate) use shmem::Shmem;

use crate::addr::{Range, PAGE_SHIFT};
use crate::sync::{AtomicPtr, AtomicU32, AtomicU64, Ordering};
use lock::VmaLock;
use userfault::UffdCtx;

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
    /// A detached VMA object. Only [`VmaPool::alloc_on`] calls this (when
    /// no object is free), which is what makes every `Vma` type-stable
    /// (see `as_ref_unchecked`).
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

    /// Asks the CPU to bring this object's cache lines in: a hint that
    /// reads nothing (any address may be prefetched) and writes nothing.
    /// The speculative fault warms the VMAs just after the one it looked
    /// up, which a thread faulting through a run of small VMAs reaches
    /// next (their first line read there was otherwise a cache miss).
    #[inline]
    pub(crate) fn prefetch(&self) {
        #[cfg(target_arch = "x86_64")]
        {
            use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            let p = (self as *const Vma).cast::<i8>();
            for off in (0..core::mem::size_of::<Vma>()).step_by(64) {
                // SAFETY: `p + off` stays inside this object; a prefetch
                // never faults and has no architectural effect.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(p.add(off)) };
            }
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
}

impl Drop for Vma {
    fn drop(&mut self) {
        self.set_uffd(None);
        self.set_anon_vma(None);
        self.set_shmem(None);
        self.set_name(None);
    }
}
