//! The mmu_gather: a batch of unmapped ranges to flush and of frames to
//! free once the flush has made every old translation of them unusable.
//! One flush per operation, or earlier when the batch is full.
//!
//! # Locking
//!
//! None of its own: it runs inside its operation's locks and ends with one
//! [`TlbState`](super::TlbState) flush (the flush lock is the innermost
//! lock, see [`crate::mm`]).

use super::{Regions, TlbState};
use crate::addr::Range;
use crate::phys::{FrameAllocator, Pfn};
use crate::stats::StatCounters;

/// Frames gathered before a flush is forced (bounds the batch's memory).
const GATHER_MAX_FRAMES: usize = 4096;

/// A batch of unmapped ranges to flush and frames to free after the flush
/// (Linux's mmu_gather). Flushed once when finished, earlier only when full.
pub(crate) struct Gather<'a> {
    tlb: &'a TlbState,
    stats: &'a StatCounters,
    frames: &'a FrameAllocator,
    pending: Vec<Pfn>,
    /// Huge frames (first frame numbers) whose 512 references to drop
    /// after the flush came from one PMD leaf.
    pending_huge: Vec<Pfn>,
    pages: u64,
    /// The regions of the gathered ranges: the translators whose summary
    /// meets them are the ones the flush reaches.
    regions: Regions,
}

impl<'a> Gather<'a> {
    pub(crate) fn new(
        tlb: &'a TlbState,
        stats: &'a StatCounters,
        frames: &'a FrameAllocator,
    ) -> Self {
        Gather {
            tlb,
            stats,
            frames,
            pending: Vec::new(),
            pending_huge: Vec::new(),
            pages: 0,
            regions: Regions::NONE,
        }
    }

    /// Records that the translation of `[va, va + 4 KiB)` was removed or
    /// changed.
    pub(crate) fn add_page(&mut self, va: u64) {
        self.add_range(Range::new(va, va + crate::addr::PAGE_SIZE));
    }

    /// Records that the translations of the page-aligned range `r` were
    /// removed or changed (in O(1), whatever its size).
    pub(crate) fn add_range(&mut self, r: Range) {
        if r.is_empty() {
            return;
        }
        self.pages += crate::addr::pages(r.len());
        self.regions = self.regions.union(Regions::of_range(r));
    }

    /// Records a frame reference to drop after the flush.
    pub(crate) fn free_frame(&mut self, pfn: Pfn) {
        self.pending.push(pfn);
        if self.pending.len() >= GATHER_MAX_FRAMES {
            self.flush();
        }
    }

    /// Records the 512 references a PMD leaf held on the huge frame from
    /// `head`, to drop after the flush (freeing it whole if they were the
    /// last: `FrameAllocator::put_huge`).
    pub(crate) fn free_huge(&mut self, head: Pfn) {
        self.pending_huge.push(head);
        if self.pending_huge.len() * 512 >= GATHER_MAX_FRAMES {
            self.flush();
        }
    }

    /// Flushes what was gathered, then frees the frames.
    pub(crate) fn flush(&mut self) {
        if self.pages == 0 && self.pending.is_empty() && self.pending_huge.is_empty() {
            return;
        }
        // Frames with no range recorded (no caller does that) could be
        // anywhere: flush every translator.
        let regions = if self.regions.is_empty() {
            Regions::ALL
        } else {
            self.regions
        };
        self.tlb.flush(self.stats, self.pages, regions);
        for pfn in self.pending.drain(..) {
            self.frames.put(pfn);
        }
        for head in self.pending_huge.drain(..) {
            self.frames.put_huge(head);
        }
        self.pages = 0;
        self.regions = Regions::NONE;
    }
}

impl Drop for Gather<'_> {
    fn drop(&mut self) {
        self.flush();
    }
}
