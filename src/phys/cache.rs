//! Where free frames wait: each CPU slot's cache and the global pool
//! behind them. A CPU takes frames from its cache, refilled from the pool
//! in batches (or from other CPUs' caches when the pool is dry), and gives
//! them back to its cache, which spills a batch to the pool when full.
//!
//! Free frames are kept apart by what they hold: `free` frames may hold
//! their last user's bytes (dirty), `zeroed` and `cleared` ones read as
//! zero. A taker says which it wants: a fault mapping a new anonymous
//! page wants a zero frame (zeroed, then never-used, then a dirty one it
//! clears itself), a frame about to be overwritten whole (a copy-on-write
//! copy, a file read) wants a dirty one, so that zeroed frames are left
//! to the faults that need them. An allocator set to clear freed frames
//! (`zero_freed`) clears its CPU cache's dirty frames when a batch of them
//! has gathered, under that cache's own lock: the freeing thread (munmap,
//! `MADV_DONTNEED`, a space's drop) pays for the clearing, not the next
//! fault, and no other CPU's line is written for it.

use super::{Budget, FrameAllocator, Pfn, BATCH, CACHE_MAX, CHUNK_FRAMES};

/// A CPU cache holding more zero frames than this (cleared when freed)
/// spills a chunk's worth of them to the pool's `cleared` list.
pub(super) const ZEROED_MAX: usize = 2 * CHUNK_FRAMES;
use crate::percpu::cpu_id;
use crate::sync::counter::{self, AtomicU64 as CounterU64};
use crate::sync::{Mutex, MutexGuard};

/// The global free pool, behind `FrameAllocator::pool`.
pub(super) struct Pool {
    /// Frames freed and spilled by the CPU caches, their memory still the
    /// host's (it may hold their last user's bytes); the oldest are given
    /// back to the system when there are too many (`release`).
    ///
    /// Protected by: `FrameAllocator::pool`.
    pub(super) free: Vec<Pfn>,
    /// Free frames whose memory was given back to the system: they read
    /// as zero and cost no host memory until written again.
    ///
    /// Protected by: `FrameAllocator::pool`.
    pub(super) zeroed: Vec<Pfn>,
    /// Free frames cleared by hand when freed (`zero_freed`): they read as
    /// zero, and their memory is still the host's (counted with `free`
    /// against the resident cap, see `release`).
    ///
    /// Protected by: `FrameAllocator::pool`.
    pub(super) cleared: Vec<Pfn>,
    /// Frames below this number have been handed out at least once.
    ///
    /// Protected by: `FrameAllocator::pool`.
    pub(super) fresh: u64,
}

impl Pool {
    pub(super) fn new() -> Self {
        Pool {
            free: Vec::new(),
            zeroed: Vec::new(),
            cleared: Vec::new(),
            fresh: 0,
        }
    }
}

/// One CPU slot's frames.
#[derive(Default)]
pub(super) struct CpuCache {
    /// Frames freed here or moved here from the pool's `free`; taken
    /// newest first (their lines may still be in this CPU's cache).
    pub(super) free: Vec<Pfn>,
    /// Frames known to be zero: moved here from the pool's `zeroed` or
    /// `cleared`, or cleared here when freed (`zero_freed`).
    pub(super) zeroed: Vec<Pfn>,
    /// Never-used frames reserved for this CPU, all in one chunk, taken in
    /// ascending order once the lists are empty.
    pub(super) fresh: core::ops::Range<u64>,
}

impl CpuCache {
    /// A frame, and whether it may hold someone's bytes (a freed frame
    /// may; one cleared, given back to the system or never used is zero).
    /// `zero`: the taker wants a zero frame, so zero ones come first;
    /// otherwise dirty ones do (newest first: their lines may still be in
    /// this CPU's cache).
    #[inline]
    fn pop(&mut self, zero: bool) -> Option<(Pfn, bool)> {
        if zero {
            if let Some(p) = self.zeroed.pop() {
                return Some((p, false));
            }
            if let Some(p) = self.pop_fresh() {
                return Some((p, false));
            }
            return self.free.pop().map(|p| (p, true));
        }
        if let Some(p) = self.free.pop() {
            return Some((p, true));
        }
        if let Some(p) = self.zeroed.pop() {
            return Some((p, false));
        }
        self.pop_fresh().map(|p| (p, false))
    }

    /// The next never-used frame reserved here.
    #[inline]
    fn pop_fresh(&mut self) -> Option<Pfn> {
        // Below `FrameAllocator::frames`, which is below `Pfn::ZERO_PAGE`.
        self.fresh.next().map(|p| Pfn::new(p as u32))
    }
}

/// One CPU slot of the allocator: its cache and its counts.
pub(super) struct CpuFrames {
    /// Free and never-used frames.
    ///
    /// Protected by: its mutex (a slot is shared by the threads of its CPU;
    /// see [`crate::percpu`]).
    pub(super) cache: Mutex<CpuCache>,
    /// Data frames taken from this slot's cache.
    ///
    /// Protected by: written only under `cache`'s lock (a load and a
    /// store: no locked add on the fault path), read with `Relaxed` loads
    /// by [`FrameAllocator::used`].
    pub(super) allocs: CounterU64,
    /// Data frames freed into this slot's cache.
    ///
    /// Protected by: as `allocs`.
    pub(super) frees: CounterU64,
}

impl CpuFrames {
    pub(super) fn new() -> Self {
        CpuFrames {
            cache: Mutex::new(CpuCache::default()),
            allocs: CounterU64::new(0),
            frees: CounterU64::new(0),
        }
    }
}

/// What a frame is taken for or given back from: data frames are counted
/// in the memory's counts and their account's ([`FrameAllocator::used`]);
/// page-table pages are counted by their page table.
#[derive(Clone, Copy)]
pub(super) enum Use<'a> {
    /// A page of data (anonymous or a shared object's), charged to the
    /// account whose budget this is.
    Data(&'a Budget),
    /// A page-table page.
    Table,
}

/// Adds one to a count whose writers all hold one lock.
#[inline]
fn bump_locked(count: &CounterU64) {
    count.store(
        count.load(counter::Ordering::Relaxed) + 1,
        counter::Ordering::Relaxed,
    );
}

/// A frame from `c`, the cache of `slot`, CPU slot `cpu` (locked by the
/// caller), counted there and in its account's slot `cpu` if it is a
/// data frame; a zero one first if `zero`.
#[inline]
fn take_from(
    slot: &CpuFrames,
    cpu: usize,
    c: &mut CpuCache,
    u: Use,
    zero: bool,
) -> Option<(Pfn, bool)> {
    let p = c.pop(zero)?;
    if let Use::Data(budget) = u {
        bump_locked(&slot.allocs);
        budget.count_frame(cpu, false);
    }
    Some(p)
}

impl FrameAllocator {
    /// Takes a frame for `u`, a zero one if there is one and `zero` (the
    /// taker wants a zero frame), else preferably a dirty one; says
    /// whether it may hold someone's bytes.
    #[inline]
    pub(super) fn take(&self, u: Use, zero: bool) -> Option<(Pfn, bool)> {
        self.take_local(u, zero).or_else(|| self.take_dry(u, zero))
    }

    /// A frame from this CPU's cache, refilled from the pool; a data frame
    /// is counted here.
    #[inline]
    fn take_local(&self, u: Use, zero: bool) -> Option<(Pfn, bool)> {
        let cpu = cpu_id();
        let slot = self.cpus.get(cpu);
        let mut c = slot.cache.lock();
        if let Some(p) = take_from(slot, cpu, &mut c, u, zero) {
            return Some(p);
        }
        if self.refill(&mut c, zero) {
            return take_from(slot, cpu, &mut c, u, zero);
        }
        None
    }

    /// [`take`](Self::take) once the pool is dry: frames freed on other
    /// CPUs may sit in their caches. When those are empty too, waits for
    /// the frames on their way back ([`settle`](Self::settle)) and looks
    /// once more.
    #[cold]
    fn take_dry(&self, u: Use, zero: bool) -> Option<(Pfn, bool)> {
        self.take_other(u, zero).or_else(|| {
            self.settle();
            self.take_local(u, zero)
                .or_else(|| self.take_other(u, zero))
        })
    }

    /// A frame from any CPU's cache, counted where it was taken.
    fn take_other(&self, u: Use, zero: bool) -> Option<(Pfn, bool)> {
        for i in 0..self.cpus.len() {
            let other = self.cpus.get(i);
            if let Some(mut c) = other.cache.try_lock() {
                if let Some(p) = take_from(other, i, &mut c, u, zero) {
                    return Some(p);
                }
            }
        }
        for i in 0..self.cpus.len() {
            let other = self.cpus.get(i);
            if let Some(p) = take_from(other, i, &mut other.cache.lock(), u, zero) {
                return Some(p);
            }
        }
        None
    }

    /// Moves frames from the global pool into `c`: for a taker that wants
    /// zero frames (`zero`), up to a chunk's worth of cleared ones; else
    /// (and first for other takers) a batch of 32 dirty ones; else up to
    /// a chunk's worth of zeroed ones, given back to the system (after
    /// the dirty ones: their first write costs a host page fault, which
    /// pft measured at 10-30 times the clearing of a resident frame).
    /// Only when the pool holds no freed frame at all, the never-used
    /// frames up to the end of the next chunk. (Zero frames move 512 at a
    /// time: a space on the shared physical memory faults those in after
    /// another space freed them, and 32 at a time took the pool's lock 16
    /// times as often as fresh frames, which pft measured as 25-30% fewer
    /// faults/cpu.)
    fn refill(&self, c: &mut CpuCache, zero: bool) -> bool {
        let mut guard = self.pool.lock();
        let pool = &mut *guard;
        if (!zero || pool.cleared.is_empty()) && Self::refill_dirty(pool, c) {
            return true;
        }
        for list in [&mut pool.cleared, &mut pool.zeroed] {
            let n = list.len().min(CHUNK_FRAMES);
            if n > 0 {
                let at = list.len() - n;
                c.zeroed.extend(list.drain(at..));
                return true;
            }
        }
        let fresh = pool.fresh;
        // Never past the end of a chunk, so one chunk backs the span.
        let to_chunk_end = CHUNK_FRAMES as u64 - fresh % CHUNK_FRAMES as u64;
        let n = (self.frames - fresh).min(to_chunk_end);
        if n == 0 || self.chunk_for(Pfn::new(fresh as u32)).is_none() {
            return false;
        }
        pool.fresh += n;
        drop(guard);
        debug_assert!(c.fresh.is_empty(), "refilled before the span ran out");
        c.fresh = fresh..fresh + n;
        true
    }

    /// Moves a batch of dirty frames from the pool into `c`, if it has any.
    fn refill_dirty(pool: &mut Pool, c: &mut CpuCache) -> bool {
        let n = pool.free.len().min(BATCH);
        let at = pool.free.len() - n;
        c.free.extend(pool.free.drain(at..));
        n > 0
    }

    /// Puts a free frame (reference count 0, uncharged) into this CPU's
    /// cache, spilling a batch to the pool when the cache is full; a data
    /// frame is counted out there and in its account's slot. With
    /// `clear` (the freeing allocator's `zero_freed`, on a memory that
    /// zeroes frames), every 32nd dirty frame clears the cache's dirty
    /// ones, which then wait as zero frames.
    #[inline]
    pub(super) fn give(&self, pfn: Pfn, u: Use, clear: bool) {
        self.give_on(cpu_id(), pfn, u, clear);
    }

    /// The dirty frames waiting in the cache of CPU slot `cpu` (tests).
    #[cfg(all(test, not(aspace_loom)))]
    pub(crate) fn cached_dirty_on(&self, cpu: usize) -> Vec<Pfn> {
        self.cpus.get(cpu).cache.lock().free.clone()
    }

    /// [`give`](Self::give) into the cache of CPU slot `cpu` (which may be
    /// another CPU's: a frame freed for it after a grace period, on
    /// whichever thread ran the deferred free, goes back to the CPU that
    /// last wrote it).
    pub(super) fn give_on(&self, cpu: usize, pfn: Pfn, u: Use, clear: bool) {
        let slot = self.cpus.get(cpu);
        let mut c = slot.cache.lock();
        if let Use::Data(budget) = u {
            bump_locked(&slot.frees);
            budget.count_frame(cpu, true);
        }
        c.free.push(pfn);
        if clear && self.zero_new && c.free.len() >= BATCH {
            self.clear_dirty(c);
        } else if c.free.len() >= CACHE_MAX {
            self.spill(c);
        }
    }

    /// Clears the dirty frames of the cache `c` (this CPU's, locked) and
    /// files them as zero; spills a chunk's worth of zero frames to the
    /// pool's `cleared` list when it holds more than two. The frames stay
    /// in `c` under its lock while they are cleared, so no taker finds
    /// every list dry meanwhile; a taker of this CPU waits for the batch
    /// (about 10 us), others try other caches first (`take_other`).
    #[cold]
    fn clear_dirty(&self, mut c: MutexGuard<'_, CpuCache>) {
        // Free, in this locked cache: nobody else can reach them.
        self.zero_batch(&c.free);
        let cache = &mut *c;
        cache.zeroed.append(&mut cache.free);
        if c.zeroed.len() <= ZEROED_MAX {
            return;
        }
        // The oldest go: the newest are likelier still in this CPU's cache.
        let over = {
            let mut pool = self.pool.lock();
            pool.cleared.extend(c.zeroed.drain(..CHUNK_FRAMES));
            pool.free.len() + pool.cleared.len() > self.release_above()
        };
        drop(c);
        if over {
            self.release();
        }
    }

    /// Moves a batch from the full cache `c` to the pool; gives memory back
    /// to the system if the pool then holds too much.
    #[cold]
    fn spill(&self, mut c: MutexGuard<'_, CpuCache>) {
        let at = c.free.len() - BATCH;
        let over = {
            let mut pool = self.pool.lock();
            pool.free.extend(c.free.drain(at..));
            pool.free.len() + pool.cleared.len() > self.release_above()
        };
        drop(c);
        if over {
            self.release();
        }
    }
}
