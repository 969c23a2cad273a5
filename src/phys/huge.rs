//! Huge frames: 512 contiguous frames whose first number is a multiple of
//! 512 (2 MiB of memory, what one PMD entry maps), for transparent huge
//! pages.
//!
//! # Where they come from
//!
//! A huge frame is taken, in this order, from the physical memory's lists
//! of whole huge frames freed as such ([`FrameAllocator::put_huge`]):
//! first those cleared when freed, by an allocator set to clear what it
//! frees (`zero_freed`: the freeing thread clears the 2 MiB with
//! streaming stores, and the fault that takes it clears nothing), then
//! dirty ones (cleared by the fault that takes them); or from the
//! never-used frames at the pool's `fresh` mark, advanced past
//! the next 512-aligned run (frames skipped on the way, never used and
//! so zero, go to the pool's `zeroed` list); or, when those run out,
//! rebuilt from the 512 free 4 KiB frames of one aligned block, freed
//! one by one (`reassemble`: what Linux's buddy allocator gets by
//! merging freed pages; counted `thp_frame_rebuilt` by the address
//! space). When no source has one (no block has all its frames free),
//! the allocation fails and the fault falls back to 4 KiB pages,
//! counted (`thp_fault_fallback`).
//!
//! # References: one count per subframe
//!
//! Every subframe keeps its own reference count and account record, as
//! a 4 KiB frame does: a huge frame is handed out with each of its 512
//! counts at 1, and an entry mapping it (a PMD leaf) holds one reference
//! on each subframe. Splitting a leaf into 512 PTEs then changes no
//! count (each PTE holds its subframe's reference), fork adds one to
//! each, and a zap drops each. A huge frame whose 512 counts are all 1
//! when its last mapping goes is freed whole (`put_huge`), back to the
//! huge list; otherwise (shared with a fork child, pinned, or split and
//! partly unmapped) its subframes are freed one by one as their counts
//! reach zero, like 4 KiB frames. This costs 512 count updates where
//! Linux's folio has one, on the rare paths (fork, a zap of a huge
//! page), and none on the fault path beyond the 512 stores of the
//! allocation (a chunk's run of count words and records at a time, one
//! directory walk per huge frame), against 2 MiB to clear.
//!
//! The budget is charged 2 MiB at once; each subframe is uncharged by
//! its own last `put` (4 KiB), or the whole by `put_huge`.
//!
//! # Locking
//!
//! The huge list's mutex is taken alone, or before the pool's (taking
//! frames from `fresh`), never under another lock of this module.

use super::cache::Use;
use super::reassemble::RebuildGate;
use super::{FrameAllocator, Pfn, CHUNK_FRAMES};
use crate::addr::PAGE_SIZE;
use crate::percpu::cpu_id;
use crate::sync::counter;
use crate::sync::Ordering;

/// Frames in a huge frame (what one PMD entry maps).
pub const HUGE_FRAMES: usize = 512;
/// Bytes in a huge frame (2 MiB).
pub const HUGE_BYTES: u64 = HUGE_FRAMES as u64 * PAGE_SIZE;

/// Huge frames freed whole, waiting for [`FrameAllocator::alloc_huge`]:
/// `dirty` ones may hold their last user's bytes, `cleared` ones were
/// cleared when freed (`zero_freed`) and are taken first, by a fault that
/// then clears nothing (as the 4 KiB caches keep zero frames apart).
///
/// Protected by: `Phys::huge`'s mutex (both lists).
#[derive(Default)]
pub(super) struct HugeFree {
    /// First frame numbers of huge frames freed uncleared.
    dirty: Vec<Pfn>,
    /// First frame numbers of huge frames cleared when freed.
    cleared: Vec<Pfn>,
    /// When a rebuild from 4 KiB frames may be tried again.
    pub(super) gate: RebuildGate,
}

impl HugeFree {
    fn len(&self) -> usize {
        self.dirty.len() + self.cleared.len()
    }
}

/// A huge frame taken from the free lists.
struct Taken {
    /// Its first frame.
    head: Pfn,
    /// It may hold someone's bytes.
    used_before: bool,
    /// It was rebuilt from free 4 KiB frames.
    rebuilt: bool,
}

/// The subframes of a huge frame a chunk at a time: each run's first
/// frame and length (one run of 512 with 2 MiB chunks; several under
/// loom's small ones).
fn runs(head: Pfn) -> impl Iterator<Item = (Pfn, usize)> {
    let n = CHUNK_FRAMES.min(HUGE_FRAMES);
    (0..HUGE_FRAMES / n).map(move |r| (Pfn::new(head.get() + (r * n) as u32), n))
}

impl FrameAllocator {
    /// A huge frame: its first frame number, every subframe's reference
    /// count 1, charged 2 MiB, zero if the allocator zeroes frames.
    /// `None` if the budget has no 2 MiB of room or no huge frame is free
    /// and none can be rebuilt from free 4 KiB frames (see the module
    /// docs).
    #[cfg(test)]
    pub(crate) fn alloc_huge(&self) -> Option<Pfn> {
        self.alloc_huge_noting().map(|(head, _)| head)
    }

    /// [`alloc_huge`](Self::alloc_huge), saying whether the huge frame
    /// was rebuilt from free 4 KiB frames (`reassemble`), for the caller's
    /// statistics.
    pub(crate) fn alloc_huge_noting(&self) -> Option<(Pfn, bool)> {
        let budget = &**self.memory();
        if !budget.try_charge(HUGE_BYTES) {
            return None;
        }
        let Some(Taken {
            head,
            used_before,
            rebuilt,
        }) = self.take_huge()
        else {
            budget.uncharge(HUGE_BYTES);
            return None;
        };
        // A chunk's run at a time: one directory walk per run, not per
        // subframe.
        for (first, n) in runs(head) {
            if self.zero_new && used_before {
                self.zero_run(first, n, false);
            }
            let (refs, owners) = self.frame_run(first, n);
            for (i, (refs, owner)) in refs.iter().zip(owners).enumerate() {
                self.use_exclusive(Pfn::new(first.get() + i as u32));
                owner.store(self.id, counter::Ordering::Relaxed);
                refs.store(1, Ordering::Relaxed);
            }
        }
        self.count_huge(budget, false);
        Some((head, rebuilt))
    }

    /// Counts a huge frame's 512 data frames in (`out` false) or out, in
    /// the CPU slot's counts and the account's, under the slot's cache
    /// lock as every writer of those counts holds it.
    fn count_huge(&self, budget: &super::Budget, out: bool) {
        let cpu = cpu_id();
        let slot = self.cpus.get(cpu);
        let _c = slot.cache.lock();
        let count = if out { &slot.frees } else { &slot.allocs };
        count.store(
            count.load(counter::Ordering::Relaxed) + HUGE_FRAMES as u64,
            counter::Ordering::Relaxed,
        );
        budget.count_frames(cpu, out, HUGE_FRAMES as u64);
    }

    /// A free huge frame: one cleared when freed, else a dirty one, else
    /// one cut from the never-used frames, else one rebuilt from free
    /// 4 KiB frames.
    fn take_huge(&self) -> Option<Taken> {
        let taken = |(head, used_before), rebuilt| Taken {
            head,
            used_before,
            rebuilt,
        };
        {
            let mut huge = self.huge.lock();
            if let Some(head) = huge.cleared.pop() {
                return Some(taken((head, false), false));
            }
            if let Some(head) = huge.dirty.pop() {
                return Some(taken((head, true), false));
            }
        }
        if let Some(head) = self.cut_fresh() {
            return Some(taken((head, false), false));
        }
        self.rebuild_huge().map(|t| taken(t, true))
    }

    /// The first 512-aligned run of never-used frames, the pool's `fresh`
    /// mark advanced past it.
    fn cut_fresh(&self) -> Option<Pfn> {
        let mut pool = self.pool.lock();
        let fresh = pool.fresh;
        let first = fresh.checked_next_multiple_of(HUGE_FRAMES as u64)?;
        let end = first.checked_add(HUGE_FRAMES as u64)?;
        if end > self.frames {
            return None;
        }
        // Every chunk behind the run and behind the never-used frames
        // skipped to align it (which go to the zeroed list and must be
        // usable as any frame there), obtained now: one or two under
        // 2 MiB chunks; many under loom's small ones, where the skipped
        // frames can span chunks nobody has obtained yet.
        let chunk = super::CHUNK_FRAMES as u64;
        let mut c = fresh - fresh % chunk;
        while c < end {
            self.chunk_for(Pfn::new(c as u32))?;
            c += chunk;
        }
        // Skipped never-used frames are zero: they wait with the others.
        pool.zeroed
            .extend((fresh..first).map(|p| Pfn::new(p as u32)));
        pool.fresh = end;
        Some(Pfn::new(first as u32))
    }

    /// Drops the references a huge mapping held on the 512 subframes from
    /// `head`. If they were the last ones on every subframe (nobody else
    /// maps, shares or pins any of them) and the frame is this account's,
    /// the huge frame is freed whole, kept for the next [`alloc_huge`]
    /// (cleared first if this allocator clears what it frees,
    /// [`zeroes_freed`](Self::zeroes_freed)); otherwise each subframe is
    /// put as a 4 KiB frame.
    ///
    /// [`alloc_huge`]: Self::alloc_huge
    pub(crate) fn put_huge(&self, head: Pfn) {
        let whole = runs(head).all(|(first, n)| {
            let (refs, owners) = self.frame_run(first, n);
            refs.iter().zip(owners).all(|(refs, owner)| {
                // Acquire: the last user's accesses happen before our reuse.
                refs.load(Ordering::Acquire) == 1
                    && owner.load(counter::Ordering::Relaxed) == self.id
            })
        });
        if !whole {
            for i in 0..HUGE_FRAMES as u32 {
                self.put(Pfn::new(head.get() + i));
            }
            return;
        }
        // Every count is ours alone: no reference can be added to a frame
        // nobody else holds (`try_get` is for objects' pages, which huge
        // frames never are; pins need a mapping entry, and ours is gone).
        for (first, n) in runs(head) {
            let (refs, _) = self.frame_run(first, n);
            for (i, refs) in refs.iter().enumerate() {
                self.use_exclusive(Pfn::new(first.get() + i as u32));
                refs.store(0, Ordering::Relaxed);
            }
        }
        let budget = &**self.memory();
        budget.uncharge(HUGE_BYTES);
        self.count_huge(budget, true);
        // Beyond a sixteenth of the budget in huge frames kept resident,
        // the frame is broken up for the 4 KiB caches (which give memory
        // back to the system when they hold too much).
        let keep = (budget.limit() / HUGE_BYTES / 16).max(1) as usize;
        if self.huge.lock().len() >= keep {
            for i in 0..HUGE_FRAMES as u32 {
                self.give(Pfn::new(head.get() + i), Use::Table, false);
            }
            return;
        }
        let clear = self.zeroes_freed();
        if clear {
            // Free and in no list: ours alone while it is cleared, with
            // no lock held (2 MiB of stores, on the freeing thread).
            for (first, n) in runs(head) {
                self.zero_run(first, n, true);
            }
        }
        // (Two frees racing past the check above keep one more: harmless.)
        let mut huge = self.huge.lock();
        if clear {
            huge.cleared.push(head);
        } else {
            huge.dirty.push(head);
        }
    }

    /// The memory of the huge frame from `head` as one 2 MiB span (its
    /// subframes' memory in order), if it is one: always outside loom
    /// builds, whose chunks hold fewer than 512 frames. What
    /// [`frame_ptr`](Self::frame_ptr) says of a frame holds of it.
    pub(crate) fn huge_frame_ptr(&self, head: Pfn) -> Option<*mut u8> {
        let one_chunk = CHUNK_FRAMES % HUGE_FRAMES == 0 && head.index() % HUGE_FRAMES == 0;
        one_chunk.then(|| self.frame_ptr(head))
    }

    /// Huge frames free in the physical memory's huge list.
    #[cfg(test)]
    pub(crate) fn free_huge_frames(&self) -> usize {
        self.huge.lock().len()
    }

    /// Huge frames free in the huge list that were cleared when freed.
    #[cfg(test)]
    pub(crate) fn cleared_huge_frames(&self) -> usize {
        self.huge.lock().cleared.len()
    }
}

#[cfg(all(test, not(aspace_loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_huge_frame_is_512_aligned_frames_charged_2_mib() {
        let a = FrameAllocator::new(8 << 20, true);
        let head = a.alloc_huge().expect("a fresh memory has huge frames");
        assert_eq!(head.get() as usize % HUGE_FRAMES, 0);
        assert_eq!(a.memory().used(), HUGE_BYTES);
        assert_eq!(a.used(), HUGE_FRAMES as u64);
        for i in 0..HUGE_FRAMES as u32 {
            assert_eq!(a.refcount(Pfn::new(head.get() + i)), 1);
        }
        // 4 KiB frames taken after it are other frames.
        let small = a.alloc().unwrap();
        assert!(small.get() < head.get() || small.get() >= head.get() + HUGE_FRAMES as u32);
        a.put(small);
        a.put_huge(head);
        assert_eq!(a.memory().used(), 0);
        assert_eq!(a.used(), 0);
        assert_eq!(a.free_huge_frames(), 1);
        // The freed huge frame comes back whole, cleared.
        a.write(Pfn::new(head.get() + 7), 100, b"x");
        let again = a.alloc_huge().unwrap();
        assert_eq!(again, head);
        let mut b = [1u8];
        a.read(Pfn::new(head.get() + 7), 100, &mut b);
        assert_eq!(b, [0]);
        a.put_huge(again);
    }

    #[test]
    fn only_a_huge_frame_used_before_is_cleared() {
        // `take_huge`'s flag is what makes `alloc_huge` clear: set for
        // one freed whole (its bytes are someone's), clear for one cut
        // from the never-used frames (known zero: no 2 MiB to clear).
        let a = FrameAllocator::new(8 << 20, true);
        let fresh = a.take_huge().unwrap();
        assert!(!fresh.used_before && !fresh.rebuilt);
        a.put_huge(a.alloc_huge().unwrap());
        let again = a.take_huge().unwrap();
        assert!(again.used_before && !again.rebuilt);
        assert_ne!(again.head, fresh.head);
    }

    #[test]
    fn a_huge_frame_freed_by_a_zero_freed_allocator_is_cleared_then_taken_as_is() {
        let a = FrameAllocator::new(8 << 20, true).with_zero_freed(true);
        let head = a.alloc_huge().unwrap();
        for i in [0, 7, 511] {
            a.write(Pfn::new(head.get() + i), 4095, b"x");
        }
        a.put_huge(head);
        assert_eq!(a.cleared_huge_frames(), 1);
        // Cleared at the free: the bytes are gone while it waits.
        for i in [0, 7, 511] {
            let mut b = [1u8];
            a.read(Pfn::new(head.get() + i), 4095, &mut b);
            assert_eq!(b, [0], "subframe {i} not cleared at free");
        }
        // Taken first, and not cleared again (a byte planted in the free
        // frame, which only this test writes, is still there).
        a.write(Pfn::new(head.get() + 9), 0, b"y");
        let again = a.alloc_huge().unwrap();
        assert_eq!(again, head);
        let mut b = [0u8];
        a.read(Pfn::new(head.get() + 9), 0, &mut b);
        assert_eq!(b, *b"y", "a cleared huge frame was cleared again");
        assert_eq!(a.cleared_huge_frames(), 0);
        // An allocator that does not clear at free keeps it dirty.
        let d = FrameAllocator::new(8 << 20, true);
        d.put_huge(d.alloc_huge().unwrap());
        assert_eq!((d.free_huge_frames(), d.cleared_huge_frames()), (1, 0));
        a.put_huge(again);
    }

    #[test]
    fn no_huge_frame_past_the_budget_or_the_memory() {
        // 3 MiB of budget: one huge frame, then none (2 MiB more would
        // pass it), while 4 KiB frames still come.
        let a = FrameAllocator::new(3 << 20, true);
        let h = a.alloc_huge().unwrap();
        assert_eq!(a.alloc_huge(), None);
        assert_eq!(a.memory().used(), HUGE_BYTES);
        assert!(a.alloc().is_some_and(|p| a.put(p)));
        a.put_huge(h);
        // A memory of 1 MiB has no 512 frames at all.
        let tiny = FrameAllocator::new(1 << 20, true);
        assert_eq!(tiny.alloc_huge(), None);
        assert_eq!(tiny.memory().used(), 0);
    }

    #[test]
    fn shared_subframes_are_freed_one_by_one() {
        let a = FrameAllocator::new(8 << 20, true);
        let head = a.alloc_huge().unwrap();
        // A second mapping of one subframe (a split and fork, say).
        let sub = Pfn::new(head.get() + 3);
        a.get(sub);
        a.put_huge(head);
        assert_eq!(a.free_huge_frames(), 0);
        assert_eq!(a.used(), 1);
        assert_eq!(a.refcount(sub), 1);
        assert!(a.put(sub));
        assert_eq!(a.used(), 0);
        assert_eq!(a.memory().used(), 0);
    }

    #[test]
    fn frames_skipped_to_align_a_huge_frame_stay_usable() {
        let a = FrameAllocator::new(4 << 20, true);
        // Move `fresh` off a 512 boundary: a CPU cache takes a chunk's
        // remainder; hand what it holds back to the pool.
        let p = a.alloc().unwrap();
        let h = a.alloc_huge().unwrap();
        assert_eq!(h.get() as usize % HUGE_FRAMES, 0);
        // 4 MiB of memory: one huge frame and the rest in 4 KiB frames,
        // every one of them still to be had.
        let mut got = vec![p];
        while let Some(f) = a.alloc() {
            got.push(f);
        }
        assert_eq!(got.len() + HUGE_FRAMES, 1024);
        for f in got {
            a.put(f);
        }
        a.put_huge(h);
        assert_eq!(a.memory().used(), 0);
    }
}
