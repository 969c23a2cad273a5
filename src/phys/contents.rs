//! Frame contents: whole-frame zeroing and copying, byte reads and writes
//! as 8-byte atomic words, and prefaulting the host memory behind frames.

use super::{FrameAllocator, Pfn, CHUNK_FRAMES, WORDS};
use crate::addr::PAGE_SIZE;
use crate::sync::frame::AtomicU64 as FrameWord;
use crate::sync::Ordering;

impl FrameAllocator {
    /// The frame's memory as 512 atomic words.
    #[inline]
    fn words(&self, pfn: Pfn) -> &[FrameWord; WORDS] {
        // SAFETY: the frame's memory is 4096 bytes, 4096-aligned (chunks
        // are page-aligned), so it is exactly 512 aligned u64 words;
        // AtomicU64 has u64's layout; the memory lives as long as the
        // allocator (we borrow it); all shared accesses to frame memory go
        // through these 8-byte atomics.
        unsafe { &*(self.base(pfn) as *const [FrameWord; WORDS]) }
    }

    /// Clears a frame that is ours alone: just taken from the free lists
    /// (nobody else can reach it yet), or a table page on its way back to
    /// them (nobody can reach it any more).
    pub(super) fn zero(&self, pfn: Pfn) {
        self.use_exclusive(pfn);
        // SAFETY: a frame just taken from the free lists is mapped by no
        // page table and no access through an old translation remains
        // (frames are freed only after the TLB flush that removed their
        // last translation); a table page being freed is unlinked and its
        // walkers are gone: we are its only user. The 4096 bytes are in
        // bounds of its chunk.
        unsafe { core::ptr::write_bytes(self.base(pfn), 0, PAGE_SIZE as usize) };
    }

    /// Clears free frames that are ours alone and will wait in a list
    /// before anyone uses them (a batch cleared when freed). On x86-64 with
    /// streaming stores, which write around the caches: no line is read
    /// for ownership and none of the CPU's working set is evicted for
    /// lines nobody reads soon. One store fence at the end orders them
    /// before whatever publishes the frames (the cache lock's release).
    pub(super) fn zero_batch(&self, frames: &[Pfn]) {
        for &pfn in frames {
            self.use_exclusive(pfn);
            // SAFETY: the frame is free and in no list another thread can
            // take it from (the caller holds the list's lock): we are its
            // only user; its 4096 bytes are in bounds of its chunk.
            unsafe { stream_zero(self.base(pfn), 1) };
        }
        stream_fence();
    }

    /// Clears the `n` frames from `first` (in one chunk, so their memory
    /// is contiguous), which are ours alone: a huge frame's subframes,
    /// taken from the huge list (`stream`: false, the fault's store
    /// follows) or freed whole and about to wait in it (`stream`: true,
    /// written around the caches as `zero_batch` writes, fenced).
    pub(super) fn zero_run(&self, first: Pfn, n: usize, stream: bool) {
        debug_assert!(first.index() % CHUNK_FRAMES + n <= CHUNK_FRAMES);
        for i in 0..n as u32 {
            self.use_exclusive(Pfn::new(first.get() + i));
        }
        let p = self.base(first);
        if stream {
            // SAFETY: the frames are ours alone (the caller's contract);
            // their `n` pages are in bounds of one chunk.
            unsafe { stream_zero(p, n) };
            stream_fence();
        } else {
            // A page at a time, as `zero` clears (`rep stosb` each): one
            // 2 MiB `memset` may take glibc's streaming path, which leaves
            // the lines the fault's store then reads outside the cache.
            for i in 0..n {
                // SAFETY: as above; page `i` is in bounds.
                unsafe {
                    core::ptr::write_bytes(p.add(i * PAGE_SIZE as usize), 0, PAGE_SIZE as usize)
                };
            }
        }
    }

    /// Obtains and touches the memory of the next `bytes` (at most the
    /// budget's) of frames the pool will hand out, so that later
    /// allocations do not pay the host kernel's page faults (benchmarks
    /// call this before measuring): freed frames (taken before never-used
    /// ones: on a shared physical memory they are what a new space gets
    /// first), cleared now if they hold bytes, then never-used frames. Frames are touched only while free and in the pool, so
    /// repeated calls touch the same ones, and a physical memory holds no
    /// more than the largest budget prefaulted.
    pub(crate) fn prefault(&self, bytes: u64) {
        let mut n = bytes.min(self.memory().limit()) / PAGE_SIZE;
        // Holding the pool lock keeps its lists and `fresh` still: no
        // frame in them can be handed out meanwhile.
        let mut pool = self.pool.lock();
        // Freed frames still holding bytes are taken first: cleared now
        // and filed as cleared, so the allocations that get them do not
        // clear them; frames cleared before count as touched.
        let k = pool
            .free
            .len()
            .min(usize::try_from(n).unwrap_or(usize::MAX));
        let at = pool.free.len() - k;
        let dirty: Vec<Pfn> = pool.free.drain(at..).collect();
        for &pfn in &dirty {
            // Free and out of every list while we hold the pool lock.
            self.zero(pfn);
        }
        pool.cleared.extend(dirty);
        n = n.saturating_sub(pool.cleared.len() as u64);
        // `refill` takes the zeroed list from its end.
        for &pfn in pool.zeroed.iter().rev() {
            if n == 0 {
                return;
            }
            // SAFETY: the frame is free and in the pool's list, which we
            // hold locked: nobody else accesses it. Writing a zero keeps
            // the list's promise that it reads as zero.
            unsafe { core::ptr::write_volatile(self.base(pfn), 0u8) };
            n -= 1;
        }
        let frames = pool.fresh.saturating_add(n).min(self.frames);
        let mut pfn = pool.fresh;
        while pfn < frames {
            let Some(c) = self.chunk_for(Pfn::new(pfn as u32)) else {
                break;
            };
            let first = pfn as usize % CHUNK_FRAMES;
            for i in first..CHUNK_FRAMES {
                // SAFETY: page i of this chunk is frame (pfn - first + i)
                // >= fresh, never handed out (checked under the pool lock
                // we hold), so nobody else accesses it; the offset is
                // inside the chunk.
                unsafe { core::ptr::write_volatile(c.mem.add(i * PAGE_SIZE as usize), 0u8) };
            }
            pfn += (CHUNK_FRAMES - first) as u64;
        }
        drop(pool);
    }

    /// Copies `buf.len()` bytes from the frame at `offset` (clamped to the
    /// frame: bytes past its end are left untouched).
    pub(crate) fn read(&self, pfn: Pfn, offset: usize, buf: &mut [u8]) {
        let end = (offset.saturating_add(buf.len())).min(PAGE_SIZE as usize);
        self.use_shared(pfn, false);
        let words = self.words(pfn);
        let mut pos = offset;
        while pos < end {
            let w = words[pos / 8].load(Ordering::Relaxed).to_le_bytes();
            let lo = pos % 8;
            let n = (8 - lo).min(end - pos);
            buf[pos - offset..pos - offset + n].copy_from_slice(&w[lo..lo + n]);
            pos += n;
        }
    }

    /// Copies `data` into the frame at `offset` (clamped to the frame).
    pub(crate) fn write(&self, pfn: Pfn, offset: usize, data: &[u8]) {
        let end = (offset.saturating_add(data.len())).min(PAGE_SIZE as usize);
        self.use_shared(pfn, true);
        let words = self.words(pfn);
        let mut pos = offset;
        while pos < end {
            let word = &words[pos / 8];
            let lo = pos % 8;
            let n = (8 - lo).min(end - pos);
            let src = &data[pos - offset..pos - offset + n];
            if n == 8 {
                word.store(
                    u64::from_le_bytes(src.try_into().expect("8 bytes")),
                    Ordering::Relaxed,
                );
            } else {
                let _ = word.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                    let mut b = old.to_le_bytes();
                    b[lo..lo + n].copy_from_slice(src);
                    Some(u64::from_le_bytes(b))
                });
            }
            pos += n;
        }
    }

    /// Copies a whole frame.
    pub(crate) fn copy(&self, dst: Pfn, src: Pfn) {
        self.use_shared(src, false);
        self.use_shared(dst, true);
        let (d, s) = (self.words(dst), self.words(src));
        for (d, s) in d.iter().zip(s.iter()) {
            d.store(s.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }

    /// The first byte of an allocated frame's 4096 bytes (4096-aligned).
    /// The memory stays valid while the allocator lives, whatever happens
    /// to the frame; shared accesses to it must be 8-byte atomics, as
    /// [`read`](Self::read) and [`write`](Self::write) do.
    pub(crate) fn frame_ptr(&self, pfn: Pfn) -> *mut u8 {
        self.base(pfn)
    }
}

/// Clears the `pages` 4 KiB pages at `p`: with streaming stores on x86-64
/// (no line read for ownership, none of the CPU's working set evicted),
/// which need a [`stream_fence`] before the pages are published.
///
/// # Safety
///
/// `p` is 4096-aligned, the `pages * 4096` bytes from it are in bounds of
/// one chunk, and nobody else reaches them until the caller publishes
/// them.
unsafe fn stream_zero(p: *mut u8, pages: usize) {
    #[cfg(all(target_arch = "x86_64", not(aspace_loom)))]
    // SAFETY: the caller's contract: each 16-byte store below is aligned
    // (p is 4096-aligned) and in bounds. SSE2 is part of x86-64.
    unsafe {
        use core::arch::x86_64::{__m128i, _mm_setzero_si128, _mm_stream_si128};
        let p = p.cast::<__m128i>();
        for i in 0..pages * PAGE_SIZE as usize / 16 {
            _mm_stream_si128(p.add(i), _mm_setzero_si128());
        }
    }
    #[cfg(not(all(target_arch = "x86_64", not(aspace_loom))))]
    // SAFETY: as above.
    unsafe {
        core::ptr::write_bytes(p, 0, pages * PAGE_SIZE as usize)
    };
}

/// Orders [`stream_zero`]'s stores before whatever publishes the pages
/// (a lock's release).
fn stream_fence() {
    #[cfg(all(target_arch = "x86_64", not(aspace_loom)))]
    // SAFETY: a fence has no preconditions.
    unsafe {
        core::arch::x86_64::_mm_sfence()
    };
}
