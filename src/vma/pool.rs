//! The type-stable VMA cache (Linux's `SLAB_TYPESAFE_BY_RCU` VMA slab).
//!
//! A freed VMA object goes straight back on the free list and may be handed
//! out again at once, for another range or another address space sharing
//! the pool. Lock-free readers may therefore hold a pointer to an object
//! that has changed identity; they re-validate after taking its refcount
//! lock. Objects are never deallocated while the pool lives, and the pool
//! lives as long as every tree that may point into it; the memory goes
//! back only when the pool itself is dropped, through the reclaimer.
//!
//! # Locking
//!
//! The free list has its own lock, taken alone (inside an mmap_lock
//! writer's edit, never around another lock); see [`crate::mm`].

use super::Vma;
use crate::sync::Mutex;
use core::ptr::NonNull;

/// A pointer to a VMA object in a [`VmaPool`]. Copyable and `Send`: the
/// object is type-stable for the pool's whole life.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct VmaRef(NonNull<Vma>);

// SAFETY: a VmaRef points into a pool whose objects are never freed while
// the pool (and so every structure holding VmaRefs) lives; all of a Vma's
// fields are atomics or protected by its lock protocol, so sharing the
// pointer across threads is sound.
unsafe impl Send for VmaRef {}
// SAFETY: as for Send.
unsafe impl Sync for VmaRef {}

impl VmaRef {
    /// The handle of a VMA object.
    ///
    /// # Safety
    /// `v` must have been allocated by a [`VmaPool`] (by [`VmaPool::alloc`])
    /// that outlives every use of the returned handle: that is what makes
    /// the handle type-stable, and [`Deref`](core::ops::Deref) relies on
    /// it.
    pub(crate) unsafe fn from_vma(v: &Vma) -> VmaRef {
        VmaRef(NonNull::from(v))
    }
}

impl core::ops::Deref for VmaRef {
    type Target = Vma;
    #[inline]
    fn deref(&self) -> &Vma {
        // SAFETY: the object was allocated by a VmaPool and is deallocated
        // only when that pool drops, after every holder of this VmaRef (the
        // tree and the address space that own the pool) is gone.
        unsafe { self.0.as_ref() }
    }
}

impl core::fmt::Debug for VmaRef {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "Vma@{:p}[{:?}]", self.0, self.range())
    }
}

/// A cache of VMA objects that recycles them at once.
pub(crate) struct VmaPool {
    inner: Mutex<PoolInner>,
}

struct PoolInner {
    free: Vec<VmaRef>,
    all: Vec<VmaRef>,
}

impl VmaPool {
    pub(crate) fn new() -> Self {
        VmaPool {
            inner: Mutex::new(PoolInner {
                free: Vec::new(),
                all: Vec::new(),
            }),
        }
    }

    /// A detached VMA object (refcount 0), recycled if one is free. The
    /// bool says whether it was recycled.
    pub(crate) fn alloc(&self) -> (VmaRef, bool) {
        let mut inner = self.inner.lock();
        if let Some(v) = inner.free.pop() {
            return (v, true);
        }
        let v = VmaRef(NonNull::from(Box::leak(Box::new(Vma::new_detached()))));
        inner.all.push(v);
        (v, false)
    }

    /// Returns a detached object for reuse; drops its backing references.
    pub(crate) fn free(&self, v: VmaRef) {
        debug_assert!(!v.lock.is_attached());
        v.set_anon_vma(None);
        v.set_shmem(None);
        v.set_name(None);
        self.inner.lock().free.push(v);
    }

    /// Objects allocated from the system so far.
    pub(crate) fn allocated(&self) -> usize {
        self.inner.lock().all.len()
    }
}

impl Default for VmaPool {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for VmaPool {
    fn drop(&mut self) {
        let inner = self.inner.get_mut();
        for v in inner.all.drain(..) {
            // SAFETY: every object was leaked from a Box in `alloc`, appears
            // once in `all`, and nobody can reach it any more: the pool is
            // dropped only after every tree and address space using it.
            unsafe { drop(Box::from_raw(v.0.as_ptr())) };
        }
    }
}
