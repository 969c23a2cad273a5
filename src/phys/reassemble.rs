//! Rebuilding huge frames from free 4 KiB frames: when a huge allocation
//! finds no huge frame free whole and no 512-aligned run of never-used
//! frames, the 512 free frames of one aligned block, freed one at a time
//! (4 KiB pages unmapped, a split huge page unmapped page by page), are
//! taken together as a huge frame (what Linux's buddy allocator gets by
//! merging freed pages back into order-9 blocks).
//!
//! # How
//!
//! Free frames wait in the CPU caches and the pool's lists (`cache`),
//! which know nothing of blocks. A rebuild first lets in the frames on
//! their way back (`settle`: page-table pages retired to the epoch),
//! then holds the `releasing` lock (no frame is then out of the lists
//! for a release), moves every CPU cache's frames (dirty, zero and its
//! never-used range) to the pool, counts the pool's free frames per
//! 512-aligned block, and takes the lowest block whose 512 frames are
//! all free out of the lists. The
//! rebuilt frame may hold someone's bytes if any of its frames came from
//! a dirty list: the allocation then clears all 2 MiB (on a memory that
//! zeroes frames), as for a huge frame freed dirty; made only of frames
//! cleared when freed (`zero_freed`), given back to the system or never
//! used, it is taken as zero.
//!
//! # What it costs, and which lines it writes
//!
//! The 4 KiB allocation and free paths are unchanged: no count is kept
//! per block, so they write no new line. A rebuild costs one pass over
//! the free frames (a hash count of their blocks, then a filter of the
//! lists) and writes every CPU slot's cache (lock and lists), the pool,
//! the `releasing` lock and the huge list's lock: lines other CPUs write,
//! on the rare path of a huge allocation that found nothing else. It
//! empties the CPU caches, whose next takes refill from the pool. A
//! rebuild that finds no whole block is not tried again before 512 more
//! data frames were freed (the CPU slots' free counts, which
//! `used_in_memory` sums already), so a fault storm with no block to
//! rebuild pays one pass per 512 frees, not one per fault. (A block made
//! whole by fewer frees after a failure waits for the count too.)
//!
//! On the process's shared memory, whose never-used frames reach 1 TiB,
//! a huge allocation takes never-used frames first and rebuilds only
//! once they run out; a memory of its own ([`FrameAllocator::new`])
//! rebuilds once its budget's frames have all been used.
//!
//! # Locking
//!
//! `releasing`, then each CPU cache's mutex in turn with the pool's under
//! it, then the pool's alone: the module order of [`super`]. The huge
//! list's mutex is taken alone, before and after.

use super::{FrameAllocator, Pfn, HUGE_FRAMES};
use crate::sync::counter;
use std::collections::HashMap;

/// When a rebuild may be tried: protected by `Phys::huge`'s mutex.
#[derive(Default)]
pub(super) struct RebuildGate {
    /// The data frames freed in the whole memory (the CPU slots' `frees`,
    /// summed) before which no rebuild is tried again: 512 past the count
    /// at the last rebuild that found no whole block.
    retry_at: u64,
}

impl FrameAllocator {
    /// Data frames freed into the CPU caches so far, all slots summed.
    fn frees_so_far(&self) -> u64 {
        self.cpus
            .iter()
            .map(|c| c.frees.load(counter::Ordering::Relaxed))
            .sum()
    }

    /// A huge frame gathered from the free 4 KiB frames of one 512-aligned
    /// block, out of every free list, and whether it may hold someone's
    /// bytes (some of its frames were dirty). `None` if no block has all
    /// its frames free, or a rebuild found none and fewer than 512 data
    /// frames were freed since (see the module docs).
    pub(super) fn rebuild_huge(&self) -> Option<(Pfn, bool)> {
        let freed = self.frees_so_far();
        if freed < self.huge.lock().gate.retry_at {
            return None;
        }
        // Page-table pages retired to the epoch are frames on their way
        // back: let them in first.
        self.settle();
        let found = self.take_whole_block();
        if found.is_none() {
            self.huge.lock().gate.retry_at = freed.saturating_add(HUGE_FRAMES as u64);
        }
        found
    }

    /// [`rebuild_huge`](Self::rebuild_huge)'s pass: every CPU cache
    /// emptied into the pool, then the lowest block whose frames are all
    /// in the pool's lists taken out of them.
    fn take_whole_block(&self) -> Option<(Pfn, bool)> {
        // No frame is out of the lists for a release while we look.
        let _releasing = self.releasing.lock();
        for cpu in self.cpus.iter() {
            let mut c = cpu.cache.lock();
            let c = &mut *c;
            let fresh = core::mem::take(&mut c.fresh);
            let mut pool = self.pool.lock();
            pool.free.append(&mut c.free);
            // Zero frames of a CPU cache may be cleared (resident) or
            // given back to the system; filed as cleared, they count as
            // resident, so the pool's cap errs towards releasing.
            pool.cleared.append(&mut c.zeroed);
            pool.zeroed.extend(fresh.map(|p| Pfn::new(p as u32)));
        }
        let mut guard = self.pool.lock();
        let pool = &mut *guard;
        let block_of = |p: &Pfn| p.get() / HUGE_FRAMES as u32;
        let mut free_in: HashMap<u32, u32> = HashMap::new();
        for p in pool.free.iter().chain(&pool.zeroed).chain(&pool.cleared) {
            *free_in.entry(block_of(p)).or_default() += 1;
        }
        let block = free_in
            .iter()
            .filter(|&(_, &n)| n as usize == HUGE_FRAMES)
            .map(|(&b, _)| b)
            .min()?;
        let outside = |p: &Pfn| block_of(p) != block;
        let dirty = !pool.free.iter().all(outside);
        pool.free.retain(outside);
        pool.zeroed.retain(outside);
        pool.cleared.retain(outside);
        Some((Pfn::new(block * HUGE_FRAMES as u32), dirty))
    }
}

#[cfg(all(test, not(aspace_loom)))]
mod tests {
    use super::*;

    #[test]
    fn frames_freed_one_by_one_make_huge_frames_again() {
        // 4 MiB: two blocks, every frame taken as a 4 KiB frame, written,
        // and freed one by one.
        let a = FrameAllocator::new(4 << 20, true);
        let all: Vec<Pfn> = std::iter::from_fn(|| a.alloc()).collect();
        assert_eq!(all.len(), 2 * HUGE_FRAMES);
        for &p in &all {
            a.write(p, 100, b"x");
            a.put(p);
        }
        let (h1, rebuilt) = a.alloc_huge_noting().expect("a block rebuilt");
        assert!(rebuilt);
        assert_eq!(h1.get() as usize % HUGE_FRAMES, 0);
        // Made of dirty frames: cleared by the allocation.
        for i in 0..HUGE_FRAMES as u32 {
            let mut b = [1u8];
            a.read(Pfn::new(h1.get() + i), 100, &mut b);
            assert_eq!(b, [0], "subframe {i} kept its bytes");
            assert_eq!(a.refcount(Pfn::new(h1.get() + i)), 1);
        }
        let (h2, rebuilt) = a.alloc_huge_noting().unwrap();
        assert!(rebuilt && h2 != h1);
        assert_eq!(a.used(), 2 * HUGE_FRAMES as u64);
        a.put_huge(h1);
        a.put_huge(h2);
        assert_eq!((a.used(), a.memory().used()), (0, 0));
        // Freed whole: the huge list serves them now, nothing rebuilt.
        let (h, rebuilt) = a.alloc_huge_noting().unwrap();
        assert!(!rebuilt);
        a.put_huge(h);
    }

    #[test]
    fn a_block_with_a_frame_in_use_stays_apart_and_a_failed_rebuild_waits_for_frees() {
        let a = FrameAllocator::new(4 << 20, true);
        let all: Vec<Pfn> = std::iter::from_fn(|| a.alloc()).collect();
        // One frame of each block stays in use. In address order: the
        // order frames come in depends on the CPUs the thread ran on
        // (each CPU draws from a reserve of its own).
        let (mut kept, freed): (Vec<Pfn>, Vec<Pfn>) =
            all.into_iter().partition(|p| p.get() % 512 == 3);
        kept.sort_by_key(|p| p.get());
        assert_eq!(kept.len(), 2);
        for p in freed {
            a.put(p);
        }
        assert_eq!(a.alloc_huge(), None);
        // The first block is whole again, but one free is not 512: the
        // failed rebuild is not tried again yet.
        a.put(kept[0]);
        assert_eq!(a.alloc_huge(), None);
        // 512 frees later it is.
        let churn: Vec<Pfn> = (0..HUGE_FRAMES).map(|_| a.alloc().unwrap()).collect();
        for p in churn {
            a.put(p);
        }
        let (h, rebuilt) = a.alloc_huge_noting().expect("the whole block");
        assert!(rebuilt);
        assert_eq!(h, Pfn::new(0));
        a.put_huge(h);
        a.put(kept[1]);
    }

    #[test]
    fn a_block_of_frames_cleared_when_freed_is_not_cleared_again() {
        // 3 MiB: no second block of never-used frames, so the second
        // huge frame can only be rebuilt. Frames cleared when freed
        // (zero_freed, 32 at a time) and never-used ones make a zero
        // block; a plain allocator's dirty frames make a dirty one. The
        // 32 frees must meet in one CPU cache to make a batch: a thread
        // moved between CPUs would leave two partial batches dirty.
        super::super::tests::stay_on_this_cpu();
        for zero_freed in [true, false] {
            let a = FrameAllocator::new(3 << 20, true).with_zero_freed(zero_freed);
            let some: Vec<Pfn> = (0..32).map(|_| a.alloc().unwrap()).collect();
            for &p in &some {
                a.write(p, 0, b"x");
                a.put(p);
            }
            // A byte planted in a free frame (only this test writes it)
            // shows whether the allocation clears the block.
            a.write(some[5], 9, b"y");
            let (h, rebuilt) = a.alloc_huge_noting().expect("the block rebuilt");
            assert!(rebuilt);
            let mut b = [0u8; 10];
            a.read(some[5], 0, &mut b);
            let want: &[u8] = if zero_freed {
                b"\0\0\0\0\0\0\0\0\0y"
            } else {
                &[0; 10]
            };
            assert_eq!(b, want, "zero_freed {zero_freed}");
            a.put_huge(h);
        }
    }
}
