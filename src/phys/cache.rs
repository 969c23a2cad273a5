//! Where free frames wait: each CPU slot's cache and the global pool
//! behind them. A CPU takes frames from its cache, refilled from the pool
//! in batches (or from other CPUs' caches when the pool is dry), and gives
//! them back to its cache, which spills a batch to the pool when full.

use super::{Budget, FrameAllocator, Pfn, BATCH, CACHE_MAX, CHUNK_FRAMES};
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
    /// Frames moved here from the pool's `zeroed` (known to be zero).
    pub(super) zeroed: Vec<Pfn>,
    /// Never-used frames reserved for this CPU, all in one chunk, taken in
    /// ascending order once the lists are empty.
    pub(super) fresh: core::ops::Range<u64>,
}

impl CpuCache {
    /// A frame, and whether it may hold someone's bytes (a freed frame
    /// may; one given back to the system or never used is zero).
    #[inline]
    fn pop(&mut self) -> Option<(Pfn, bool)> {
        if let Some(p) = self.free.pop() {
            return Some((p, true));
        }
        if let Some(p) = self.zeroed.pop() {
            return Some((p, false));
        }
        // Below `FrameAllocator::frames`, which is below `Pfn::ZERO_PAGE`.
        self.fresh.next().map(|p| (Pfn::new(p as u32), false))
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
/// data frame.
#[inline]
fn take_from(slot: &CpuFrames, cpu: usize, c: &mut CpuCache, u: Use) -> Option<(Pfn, bool)> {
    let p = c.pop()?;
    if let Use::Data(budget) = u {
        bump_locked(&slot.allocs);
        budget.count_frame(cpu, false);
    }
    Some(p)
}

impl FrameAllocator {
    /// Takes a frame for `u`; says whether it may hold someone's bytes.
    #[inline]
    pub(super) fn take(&self, u: Use) -> Option<(Pfn, bool)> {
        self.take_local(u).or_else(|| self.take_dry(u))
    }

    /// A frame from this CPU's cache, refilled from the pool; a data frame
    /// is counted here.
    #[inline]
    fn take_local(&self, u: Use) -> Option<(Pfn, bool)> {
        let cpu = cpu_id();
        let slot = self.cpus.get(cpu);
        let mut c = slot.cache.lock();
        if let Some(p) = take_from(slot, cpu, &mut c, u) {
            return Some(p);
        }
        if self.refill(&mut c) {
            return take_from(slot, cpu, &mut c, u);
        }
        None
    }

    /// [`take`](Self::take) once the pool is dry: frames freed on other
    /// CPUs may sit in their caches. When those are empty too, waits for
    /// the frames on their way back ([`settle`](Self::settle)) and looks
    /// once more.
    #[cold]
    fn take_dry(&self, u: Use) -> Option<(Pfn, bool)> {
        self.take_other(u).or_else(|| {
            self.settle();
            self.take_local(u).or_else(|| self.take_other(u))
        })
    }

    /// A frame from any CPU's cache, counted where it was taken.
    fn take_other(&self, u: Use) -> Option<(Pfn, bool)> {
        for i in 0..self.cpus.len() {
            let other = self.cpus.get(i);
            if let Some(mut c) = other.cache.try_lock() {
                if let Some(p) = take_from(other, i, &mut c, u) {
                    return Some(p);
                }
            }
        }
        for i in 0..self.cpus.len() {
            let other = self.cpus.get(i);
            if let Some(p) = take_from(other, i, &mut other.cache.lock(), u) {
                return Some(p);
            }
        }
        None
    }

    /// Moves a batch of freed frames from the global pool into `c` (those
    /// whose memory is still the host's first, 32), or else up to a
    /// chunk's worth of zeroed ones (a space on the shared physical memory
    /// faults those in after another space freed them: 32 at a time took
    /// the pool's lock 16 times as often as fresh frames, which pft
    /// measured as 25-30% fewer faults/cpu), or else the never-used
    /// frames up to the end of the next chunk.
    fn refill(&self, c: &mut CpuCache) -> bool {
        let mut pool = self.pool.lock();
        let n = pool.free.len().min(BATCH);
        if n > 0 {
            let at = pool.free.len() - n;
            c.free.extend(pool.free.drain(at..));
            return true;
        }
        let n = pool.zeroed.len().min(CHUNK_FRAMES);
        if n > 0 {
            let at = pool.zeroed.len() - n;
            c.zeroed.extend(pool.zeroed.drain(at..));
            return true;
        }
        let fresh = pool.fresh;
        // Never past the end of a chunk, so one chunk backs the span.
        let to_chunk_end = CHUNK_FRAMES as u64 - fresh % CHUNK_FRAMES as u64;
        let n = (self.frames - fresh).min(to_chunk_end);
        if n == 0 || self.chunk_for(Pfn::new(fresh as u32)).is_none() {
            return false;
        }
        pool.fresh += n;
        drop(pool);
        debug_assert!(c.fresh.is_empty(), "refilled before the span ran out");
        c.fresh = fresh..fresh + n;
        true
    }

    /// Puts a free frame (reference count 0, uncharged) into this CPU's
    /// cache, spilling a batch to the pool when the cache is full; a data
    /// frame is counted out there and in its account's slot.
    #[inline]
    pub(super) fn give(&self, pfn: Pfn, u: Use) {
        let cpu = cpu_id();
        let slot = self.cpus.get(cpu);
        let mut c = slot.cache.lock();
        if let Use::Data(budget) = u {
            bump_locked(&slot.frees);
            budget.count_frame(cpu, true);
        }
        c.free.push(pfn);
        if c.free.len() >= CACHE_MAX {
            self.spill(c);
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
            pool.free.len() > self.release_above()
        };
        drop(c);
        if over {
            self.release();
        }
    }
}
