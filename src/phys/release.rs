//! Giving free frames' memory back to the system, so that frames freed and
//! cached for reuse do not keep the host process above its budget, and
//! waiting for the frames on their way back to the pool when it runs dry.
//!
//! The global pool keeps up to `2 * keep` freed frames whose memory is
//! still resident (dirty ones and those cleared when freed, together) (`keep` is a sixteenth of the frames the live
//! allocators over the memory may use): reuse of recently
//! freed memory stays cheap. Past that, the thread whose spill crossed the
//! mark takes the oldest frames out, down to `keep`, sorts them and
//! discards each run of consecutive frames with one
//! `madvise(MADV_DONTNEED)`; they go to the pool's `zeroed` list, read as
//! zero (so they need no clearing when handed out again) and cost nothing
//! until written. While that runs the frames are in no list: a taker that
//! finds every list dry waits for it (`settle`).

use super::{FrameAllocator, Pfn, BATCH, CHUNK_FRAMES};
use crate::addr::PAGE_SIZE;

impl FrameAllocator {
    /// Freed frames the pool keeps resident after a release: a sixteenth
    /// of the frames the live allocators over this memory may use.
    fn keep_resident(&self) -> usize {
        let frames = (self.accounts.live_limits() / PAGE_SIZE).min(self.frames);
        (frames as usize / 16).max(4 * BATCH)
    }

    /// A pool holding more freed, resident frames than this releases some.
    pub(super) fn release_above(&self) -> usize {
        2 * self.keep_resident()
    }

    /// Gives the memory of the pool's oldest freed frames (dirty ones
    /// first, then cleared ones) back to the system, down to
    /// `keep_resident`. One thread at a time: another one
    /// already at it will see what was spilled meanwhile, or the next
    /// spill will.
    pub(super) fn release(&self) {
        let Some(_releasing) = self.releasing.try_lock() else {
            return;
        };
        let mut out: Vec<Pfn> = {
            let mut pool = self.pool.lock();
            let resident = pool.free.len() + pool.cleared.len();
            let Some(n) = resident.checked_sub(self.keep_resident()) else {
                return;
            };
            // Dirty frames first: discarding them clears them for free.
            let dirty = n.min(pool.free.len());
            let mut out: Vec<Pfn> = pool.free.drain(..dirty).collect();
            out.extend(pool.cleared.drain(..n - dirty));
            out
        };
        out.sort_unstable();
        let mut i = 0;
        while i < out.len() {
            let first = out[i];
            let mut n = 1;
            while i + n < out.len()
                && out[i + n].get() == first.get() + n as u32
                && (first.get() as usize + n) % CHUNK_FRAMES != 0
            {
                n += 1;
            }
            self.discard(first, n);
            i += n;
        }
        self.pool.lock().zeroed.extend(out);
    }

    /// Waits for frames on their way back to the pool: a release in flight
    /// (its frames are in no list while their memory is discarded) and,
    /// outside loom, page-table pages retired to the epoch, whose
    /// collector is asked to run what it can (a page table's tables are
    /// freed after a grace period; under loom they are heap pages).
    pub(super) fn settle(&self) {
        drop(self.releasing.lock());
        #[cfg(not(aspace_loom))]
        for _ in 0..4 {
            crate::sync::epoch::pin().flush();
        }
    }

    /// Discards the memory of the `n` free frames from `first` (in one
    /// chunk): afterwards they read as zero and, on unix, no longer count
    /// in the host's resident memory.
    fn discard(&self, first: Pfn, n: usize) {
        debug_assert!(first.get() as usize % CHUNK_FRAMES + n <= CHUNK_FRAMES);
        let len = n * PAGE_SIZE as usize;
        let base = self.base(first);
        #[cfg(all(unix, not(aspace_loom)))]
        {
            // SAFETY: the `n` frames from `first` lie in one chunk, a
            // private anonymous mapping of ours; they are free and in no
            // list, so nobody accesses them. MADV_DONTNEED on such memory
            // only replaces its pages with zero-fill-on-demand ones.
            let r = unsafe { libc::madvise(base.cast(), len, libc::MADV_DONTNEED) };
            if r == 0 {
                return;
            }
        }
        // Elsewhere (and if the system refused): zero them by hand, so
        // the `zeroed` list's promise holds.
        for i in 0..n {
            self.use_exclusive(Pfn::new(first.get() + i as u32));
        }
        // SAFETY: as above, the frames are ours alone and in bounds of
        // their chunk.
        unsafe { core::ptr::write_bytes(base, 0, len) };
    }
}
