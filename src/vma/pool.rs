//! The type-stable VMA cache (Linux's `SLAB_TYPESAFE_BY_RCU` VMA slab,
//! with its per-CPU caches).
//!
//! A freed VMA object goes straight back into a free cache and may be
//! handed out again at once, for another range or another address space
//! sharing the pool. Lock-free readers may therefore hold a pointer to an
//! object that has changed identity; they re-validate after taking its
//! refcount lock. Objects are never deallocated while the pool lives, and
//! the pool lives as long as every tree that may point into it; the
//! memory goes back only when the pool itself is dropped, through the
//! reclaimer.
//!
//! # Per-CPU caches
//!
//! Each CPU slot ([`crate::percpu`]) keeps a small LIFO cache of free
//! objects (a magazine, as Linux's slab keeps per CPU): a free pushes onto
//! the freeing CPU's cache, an allocation pops the newest object there, so
//! an object freed and allocated again on one CPU (the same thread's
//! munmap, then mmap) is the same object, its lines still in that CPU's
//! cache. Behind the caches is the global list, which only batches
//! cross: a cache that passes [`CACHE_MAX`] objects moves its oldest
//! [`BATCH`] there, and an empty one takes up to [`BATCH`] from it. When
//! the global list is empty too, the allocation takes an object from any
//! CPU's cache that holds one (a thread that moved to another CPU since it
//! freed finds its object again) before it makes a new object: as with a
//! single list, the pool grows only when no object is free, except for
//! objects in flight between two locks, or freed where a racing
//! allocation had already looked.
//!
//! Lines written: the common alloc and free write only their CPU slot's
//! line (its lock, its count) and the cache's buffer, which only a thief
//! from another CPU also writes. The global list's lock and line are
//! written once per [`BATCH`] objects that cross between CPUs, and by
//! every object made (`all` must keep it for the drop). A thief reads
//! every slot's count (written by its CPU) and locks another CPU's slot:
//! only when its own cache and the global list are empty, as when the
//! pool grows or its free objects lie on other CPUs.
//!
//! # Locking
//!
//! Each CPU cache has its own lock, and so has the global list. Each is
//! taken alone, never around another lock (the pool is used inside an
//! mmap_lock writer's edit, under the locks of the crate's order: see
//! [`crate::mm`]): a batch moves out under one lock into a buffer on the
//! stack, then in under the other. A slot is shared by the threads of its
//! CPU, and a thread may move to another CPU mid-operation (it then uses
//! the slot it looked up, under that slot's lock, which is only slower);
//! each slot's lock makes its cache safe under both (the loom model
//! `loom_tests/pool.rs` races two threads on one cache).

use super::Vma;
use crate::percpu::PerCpu;
use crate::sync::counter::{self, AtomicUsize as CounterUsize};
use crate::sync::{Mutex, MutexGuard};
use core::ptr::NonNull;

/// Free objects a CPU cache keeps at most: a free that leaves more moves
/// the oldest [`BATCH`] to the global list.
#[cfg(not(aspace_loom))]
const CACHE_MAX: usize = 32;
/// Objects that move between a CPU cache and the global list at once.
#[cfg(not(aspace_loom))]
const BATCH: usize = 16;
/// Loom models reach a spill and a refill in a few steps.
#[cfg(aspace_loom)]
const CACHE_MAX: usize = 2;
/// As for [`CACHE_MAX`].
#[cfg(aspace_loom)]
const BATCH: usize = 2;

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
    /// `v` must have been allocated by a [`VmaPool`] (by
    /// [`VmaPool::alloc_on`]) that outlives every use of the returned
    /// handle: that is what makes the handle type-stable, and
    /// [`Deref`](core::ops::Deref) relies on it.
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

/// A cache of VMA objects that recycles them at once: a free cache per
/// CPU slot, in front of a global list (see the module docs).
pub(crate) struct VmaPool {
    /// Each CPU slot's free objects.
    ///
    /// Protected by: see [`CpuCache`].
    cpus: PerCpu<CpuCache>,
    /// The free objects no CPU cache holds, and every object made.
    ///
    /// Protected by: its mutex.
    global: Mutex<Global>,
}

/// One CPU slot of a [`VmaPool`].
struct CpuCache {
    /// Free objects, newest last (handed out first). Its buffer holds
    /// `CACHE_MAX + BATCH` objects, allocated on the slot's first use, so
    /// it never grows or moves.
    ///
    /// Protected by: its mutex (a slot is shared by the threads of its CPU
    /// and by threads that moved off it mid-operation; see
    /// [`crate::percpu`]).
    free: Mutex<Vec<VmaRef>>,
    /// How many objects `free` holds: what another CPU reads to decide
    /// whether to lock this slot and steal.
    ///
    /// Protected by: a counter atomic (`sync::counter`), stored `Relaxed`
    /// under `free`'s lock, read `Relaxed` without it. A stale count only
    /// makes a thief lock a slot in vain or skip one (and make an object
    /// when it need not); the objects themselves are taken only under the
    /// lock.
    held: CounterUsize,
}

/// The global list behind the CPU caches.
struct Global {
    /// Free objects moved here from CPU caches, in batches, newest last.
    free: Vec<VmaRef>,
    /// Every object made, once each: what the drop deallocates.
    all: Vec<VmaRef>,
}

/// Up to [`BATCH`] objects on their way between two locks (on the stack,
/// so that no lock is held while the other is taken).
struct Batch {
    /// The objects, in `..len`, oldest first.
    objs: [Option<VmaRef>; BATCH],
    /// How many there are.
    len: usize,
}

impl Batch {
    /// The objects `from` yields (at most [`BATCH`] are kept).
    fn collect(from: impl Iterator<Item = VmaRef>) -> Self {
        let mut b = Batch {
            objs: [None; BATCH],
            len: 0,
        };
        for (slot, v) in b.objs.iter_mut().zip(from) {
            *slot = Some(v);
            b.len += 1;
        }
        b
    }

    /// The newest object, taken out.
    fn pop(&mut self) -> Option<VmaRef> {
        self.len = self.len.checked_sub(1)?;
        self.objs[self.len].take()
    }

    /// The objects, oldest first.
    fn iter(&self) -> impl Iterator<Item = VmaRef> + '_ {
        self.objs[..self.len].iter().flatten().copied()
    }
}

impl CpuCache {
    /// An empty cache (no buffer until its first object).
    fn new() -> Self {
        CpuCache {
            free: Mutex::new(Vec::new()),
            held: CounterUsize::new(0),
        }
    }

    /// The newest free object here.
    #[inline]
    fn pop(&self) -> Option<VmaRef> {
        let mut c = self.free.lock();
        let v = c.pop();
        self.held.store(c.len(), counter::Ordering::Relaxed);
        v
    }

    /// Adds `v`; if the cache then holds more than [`CACHE_MAX`], takes
    /// its oldest [`BATCH`] back out, for the caller to move to the global
    /// list (so it never holds more than `CACHE_MAX` when its lock is
    /// dropped).
    #[inline]
    fn put(&self, v: VmaRef) -> Option<Batch> {
        let mut c = self.free.lock();
        // The common free: room, and the buffer made.
        if c.len() < CACHE_MAX && c.capacity() != 0 {
            c.push(v);
            self.held.store(c.len(), counter::Ordering::Relaxed);
            return None;
        }
        self.put_locked(c, core::iter::once(v))
    }

    /// [`put`](Self::put) for up to [`BATCH`] objects, oldest first.
    fn put_all(&self, objs: impl Iterator<Item = VmaRef>) -> Option<Batch> {
        self.put_locked(self.free.lock(), objs)
    }

    /// [`put_all`](Self::put_all) with the lock held: the cache's first
    /// object, a spill, or a refill's rest.
    #[cold]
    fn put_locked(
        &self,
        mut c: MutexGuard<'_, Vec<VmaRef>>,
        objs: impl Iterator<Item = VmaRef>,
    ) -> Option<Batch> {
        if c.capacity() == 0 {
            // Never more than `CACHE_MAX + BATCH` inside the lock.
            c.reserve_exact(CACHE_MAX + BATCH);
        }
        c.extend(objs);
        let spill = (c.len() > CACHE_MAX).then(|| Batch::collect(c.drain(..BATCH)));
        self.held.store(c.len(), counter::Ordering::Relaxed);
        spill
    }
}

impl VmaPool {
    /// An empty pool; allocates nothing until its first object.
    pub(crate) fn new() -> Self {
        VmaPool {
            cpus: PerCpu::new(CpuCache::new),
            global: Mutex::new(Global {
                free: Vec::new(),
                all: Vec::new(),
            }),
        }
    }

    /// A detached VMA object (refcount 0), recycled if one is free. The
    /// bool says whether it was recycled. `cpu` is the calling thread's
    /// CPU slot ([`cpu_id`](crate::percpu::cpu_id), read once by a caller
    /// that also charges the budget through it); any slot is correct (a
    /// thread that moved since, or a model of migration), only slower.
    #[inline]
    pub(crate) fn alloc_on(&self, cpu: usize) -> (VmaRef, bool) {
        let slot = self.cpus.get(cpu);
        match slot.pop() {
            Some(v) => (v, true),
            None => self.alloc_slow(slot),
        }
    }

    /// An allocation that found `slot` empty: a batch from the global
    /// list, else an object from any CPU's cache, else a new object.
    #[cold]
    fn alloc_slow(&self, slot: &CpuCache) -> (VmaRef, bool) {
        let mut batch = {
            let mut g = self.global.lock();
            let from = g.free.len().saturating_sub(BATCH);
            Batch::collect(g.free.drain(from..))
        };
        if let Some(v) = batch.pop() {
            // Others on this CPU may have filled the slot meanwhile: then
            // `put` moves a batch back.
            if let Some(back) = slot.put_all(batch.iter()) {
                self.global.lock().free.extend(back.iter());
            }
            return (v, true);
        }
        if let Some(v) = self.steal() {
            return (v, true);
        }
        let v = VmaRef(NonNull::from(Box::leak(Box::new(Vma::new_detached()))));
        self.global.lock().all.push(v);
        (v, false)
    }

    /// The newest object of the first CPU cache that holds one (the
    /// global list was empty): objects freed on a CPU no one allocates on
    /// any more are found before the pool grows.
    #[cold]
    fn steal(&self) -> Option<VmaRef> {
        self.cpus
            .iter()
            .filter(|s| s.held.load(counter::Ordering::Relaxed) > 0)
            .find_map(CpuCache::pop)
    }

    /// Returns a detached object for reuse, through CPU slot `cpu` (as for
    /// [`alloc_on`](Self::alloc_on)); drops its backing references.
    #[inline]
    pub(crate) fn free_on(&self, cpu: usize, v: VmaRef) {
        debug_assert!(!v.lock.is_attached());
        v.set_anon_vma(None);
        v.set_shmem(None);
        v.set_name(None);
        if let Some(spill) = self.cpus.get(cpu).put(v) {
            self.global.lock().free.extend(spill.iter());
        }
    }

    /// Objects allocated from the system so far.
    pub(crate) fn allocated(&self) -> usize {
        self.global.lock().all.len()
    }

    /// Checks that every object made is either free, once (in one CPU
    /// cache or the global list), or in `held`, and that no CPU cache
    /// holds more than [`CACHE_MAX`] or miscounts. Call it with no
    /// allocation or free running.
    #[cfg(any(test, aspace_loom))]
    pub(crate) fn check(&self, held: &[VmaRef]) -> Result<(), String> {
        let addr = |v: &VmaRef| v.0.as_ptr() as usize;
        let mut out: Vec<usize> = held.iter().map(addr).collect();
        for (i, s) in self.cpus.iter().enumerate() {
            let c = s.free.lock();
            if c.len() > CACHE_MAX || c.len() != s.held.load(counter::Ordering::Relaxed) {
                return Err(format!("CPU cache {i} holds {}", c.len()));
            }
            out.extend(c.iter().map(addr));
        }
        let g = self.global.lock();
        out.extend(g.free.iter().map(addr));
        let mut all: Vec<usize> = g.all.iter().map(addr).collect();
        out.sort_unstable();
        all.sort_unstable();
        if out != all {
            return Err(format!(
                "objects made {all:x?}, free or held {out:x?} (an object lost or in two places)"
            ));
        }
        Ok(())
    }
}

impl Default for VmaPool {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for VmaPool {
    fn drop(&mut self) {
        // The CPU caches and the free list hold copies of these handles.
        let g = self.global.get_mut();
        for v in g.all.drain(..) {
            // SAFETY: every object was leaked from a Box in `alloc_slow`,
            // appears once in `all`, and nobody can reach it any more: the
            // pool is dropped only after every tree and address space using
            // it.
            unsafe { drop(Box::from_raw(v.0.as_ptr())) };
        }
    }
}

#[cfg(all(test, not(aspace_loom)))]
mod tests {
    use super::*;

    /// A freed object is the next one its CPU hands out (LIFO), and an
    /// object freed on one CPU is found from another before the pool makes
    /// a new one (a thread that moved between its munmap and its mmap).
    #[test]
    fn reuse_is_lifo_and_reaches_across_cpus() {
        let p = VmaPool::new();
        let (a, fresh) = p.alloc_on(0);
        let (b, _) = p.alloc_on(0);
        assert!(!fresh);
        p.free_on(0, a);
        p.free_on(0, b);
        assert_eq!(p.alloc_on(0), (b, true), "the newest comes back first");
        p.free_on(0, b);
        // Slot 1 is empty and so is the global list: it steals.
        assert_eq!(p.alloc_on(1), (b, true));
        assert_eq!(p.alloc_on(1), (a, true));
        assert_eq!(p.allocated(), 2);
        p.check(&[a, b]).unwrap();
    }

    /// Frees past `CACHE_MAX` move batches to the global list, so a CPU
    /// cache stays bounded; another CPU takes a batch back from there, one
    /// object handed out and the rest cached, and nothing is made anew.
    #[test]
    fn spills_and_refills_move_batches() {
        let p = VmaPool::new();
        let n = 3 * CACHE_MAX;
        let objs: Vec<VmaRef> = (0..n).map(|_| p.alloc_on(0).0).collect();
        for &v in &objs {
            p.free_on(0, v);
        }
        p.check(&[]).unwrap();
        let cached = p.cpus.get(0).held.load(counter::Ordering::Relaxed);
        assert!(cached <= CACHE_MAX);
        assert_eq!(p.global.lock().free.len(), n - cached);
        let (_, reused) = p.alloc_on(1);
        assert!(reused);
        assert_eq!(
            p.cpus.get(1).held.load(counter::Ordering::Relaxed),
            BATCH - 1,
            "the rest of the batch is cached"
        );
        for _ in 1..n {
            assert!(p.alloc_on(1).1, "recycled");
        }
        assert_eq!(p.allocated(), n);
        assert!(!p.alloc_on(1).1, "all are out: a new one");
    }

    /// Threads allocating and freeing on their own and on shared slots
    /// never hold one object at once, and every object ends free once.
    #[test]
    fn concurrent_alloc_and_free_hand_out_each_object_once() {
        use std::collections::HashSet;
        let p = VmaPool::new();
        let out = std::sync::Mutex::new(HashSet::new());
        std::thread::scope(|s| {
            for t in 0..4usize {
                let (p, out) = (&p, &out);
                s.spawn(move || {
                    let mut mine = Vec::new();
                    for i in 0..3000usize {
                        // Two threads per slot, and now and then another
                        // slot (a thread that moved).
                        let cpu = if i % 7 == 0 { t + 1 } else { t / 2 };
                        if mine.len() < 40 && (i % 3 != 0 || mine.is_empty()) {
                            let (v, _) = p.alloc_on(cpu);
                            assert!(out.lock().unwrap().insert(v), "{v:?} handed out twice");
                            mine.push(v);
                        } else {
                            let v = mine.swap_remove(i % mine.len());
                            assert!(out.lock().unwrap().remove(&v));
                            p.free_on(cpu, v);
                        }
                    }
                    for v in mine {
                        out.lock().unwrap().remove(&v);
                        p.free_on(t, v);
                    }
                });
            }
        });
        p.check(&[]).unwrap();
        assert!(p.allocated() <= 4 * 40 + p.cpus.len() * CACHE_MAX);
    }
}
