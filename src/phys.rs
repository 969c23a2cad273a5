//! Frames: real 4 KiB pages of memory, with per-CPU caches.
//!
//! Memory is obtained lazily, in chunks, up to a budget. Every frame has a
//! reference count (page tables, shared objects and copy-on-write sharers
//! each hold one). Allocation and freeing touch only the calling CPU's
//! cache, which is refilled from (and spills to) a global pool in batches;
//! when the pool is dry, other CPUs' caches are drained before giving up.
//!
//! Frame contents are accessed with 8-byte atomic loads and stores (partial
//! words by compare-and-swap on the containing word), so concurrent
//! user-mode loads and stores to one page — which real programs do — are
//! not undefined behaviour here. They behave like unsynchronized memory on
//! x86-64: no tearing inside a word, no ordering.

use crate::addr::PAGE_SIZE;
use crate::percpu::PerCpu;
use crate::sync::counter::AtomicU64 as CounterU64;
use crate::sync::{AtomicPtr, AtomicU32, Mutex, Ordering};
use std::alloc::Layout;

/// A frame number.
pub type Pfn = u32;

/// Frames per chunk obtained from the system (2 MiB; smaller under loom).
#[cfg(not(aspace_loom))]
const CHUNK_FRAMES: usize = 512;
#[cfg(aspace_loom)]
const CHUNK_FRAMES: usize = 8;

/// Frames moved between a CPU cache and the global pool at once.
const BATCH: usize = 32;
/// A CPU cache spills a batch when it holds this many.
const CACHE_MAX: usize = 4 * BATCH;

const WORDS: usize = PAGE_SIZE as usize / 8;

struct Chunk {
    mem: *mut u8,
    refs: Box<[AtomicU32]>,
}

impl Chunk {
    fn layout() -> Layout {
        Layout::from_size_align(CHUNK_FRAMES * PAGE_SIZE as usize, PAGE_SIZE as usize)
            .expect("chunk layout is valid")
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        // SAFETY: `mem` was allocated in `FrameAllocator::chunk_for` with
        // exactly this layout and is freed only here.
        unsafe { std::alloc::dealloc(self.mem, Self::layout()) };
    }
}

struct Pool {
    free: Vec<Pfn>,
    /// Frames below this number have been handed out at least once.
    fresh: u64,
}

#[derive(Default)]
struct Counts {
    allocs: CounterU64,
    frees: CounterU64,
}

/// The frame allocator.
pub struct FrameAllocator {
    budget: u64,
    zero_new: bool,
    chunks: Box<[AtomicPtr<Chunk>]>,
    grow: Mutex<()>,
    pool: Mutex<Pool>,
    caches: PerCpu<Mutex<Vec<Pfn>>>,
    counts: PerCpu<Counts>,
    reserved: CounterU64,
}

// SAFETY: chunk memory is only reached through atomic word accesses or by
// the exclusive owner of a frame (zeroing a frame just allocated); the raw
// pointers inside `Chunk` are owned by the allocator.
unsafe impl Send for FrameAllocator {}
// SAFETY: as for Send: all shared state is atomics or behind mutexes.
unsafe impl Sync for FrameAllocator {}

impl core::fmt::Debug for FrameAllocator {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("FrameAllocator")
            .field("budget", &self.budget)
            .field("used", &self.used())
            .finish()
    }
}

impl FrameAllocator {
    /// An allocator of at most `budget_bytes` of frames (rounded down to
    /// whole frames). `zero_new` clears every frame handed out by
    /// [`alloc`](Self::alloc).
    pub fn new(budget_bytes: u64, zero_new: bool) -> Self {
        // Pfn::MAX is reserved (the zero page's marker).
        let budget = (budget_bytes / PAGE_SIZE).min(Pfn::MAX as u64 - 1);
        let nchunks = (budget as usize).div_ceil(CHUNK_FRAMES);
        FrameAllocator {
            budget,
            zero_new,
            chunks: (0..nchunks)
                .map(|_| AtomicPtr::new(core::ptr::null_mut()))
                .collect(),
            grow: Mutex::new(()),
            pool: Mutex::new(Pool {
                free: Vec::new(),
                fresh: 0,
            }),
            caches: PerCpu::new(|| Mutex::new(Vec::new())),
            counts: PerCpu::new(Counts::default),
            reserved: CounterU64::new(0),
        }
    }

    /// A frame with reference count 1, cleared if the allocator zeroes
    /// frames; `None` when the budget is exhausted.
    pub fn alloc(&self) -> Option<Pfn> {
        let pfn = self.alloc_uninit()?;
        if self.zero_new {
            self.zero(pfn);
        }
        Some(pfn)
    }

    /// A frame with reference count 1 and unspecified contents (for a
    /// frame about to be overwritten whole).
    pub fn alloc_uninit(&self) -> Option<Pfn> {
        let pfn = self.take()?;
        self.refs(pfn).store(1, Ordering::Relaxed);
        self.counts
            .local()
            .allocs
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Some(pfn)
    }

    fn take(&self) -> Option<Pfn> {
        let cache = self.caches.local();
        {
            let mut c = cache.lock();
            if let Some(p) = c.pop() {
                return Some(p);
            }
            if self.refill(&mut c) {
                return c.pop();
            }
        }
        // Dry: frames freed on other CPUs may sit in their caches.
        for i in 0..self.caches.len() {
            if let Some(mut c) = self.caches.get(i).try_lock() {
                if let Some(p) = c.pop() {
                    return Some(p);
                }
            }
        }
        for i in 0..self.caches.len() {
            if let Some(p) = self.caches.get(i).lock().pop() {
                return Some(p);
            }
        }
        None
    }

    /// Moves a batch from the global pool (or never-used frames) into `c`.
    fn refill(&self, c: &mut Vec<Pfn>) -> bool {
        let mut pool = self.pool.lock();
        let n = pool.free.len().min(BATCH);
        if n > 0 {
            let at = pool.free.len() - n;
            c.extend(pool.free.drain(at..));
            return true;
        }
        let fresh = pool.fresh;
        let n = (self.budget - fresh).min(BATCH as u64);
        if n == 0 {
            return false;
        }
        pool.fresh += n;
        drop(pool);
        for pfn in fresh..fresh + n {
            self.chunk_for(pfn as Pfn);
        }
        c.extend((fresh..fresh + n).rev().map(|p| p as Pfn));
        true
    }

    /// The chunk holding `pfn`, obtained from the system on first use.
    fn chunk_for(&self, pfn: Pfn) -> &Chunk {
        let slot = &self.chunks[pfn as usize / CHUNK_FRAMES];
        let mut p = slot.load(Ordering::Acquire);
        if p.is_null() {
            let _g = self.grow.lock();
            p = slot.load(Ordering::Acquire);
            if p.is_null() {
                // SAFETY: the layout has non-zero size.
                let mem = unsafe { std::alloc::alloc_zeroed(Chunk::layout()) };
                if mem.is_null() {
                    std::alloc::handle_alloc_error(Chunk::layout());
                }
                let chunk = Box::new(Chunk {
                    mem,
                    refs: (0..CHUNK_FRAMES).map(|_| AtomicU32::new(0)).collect(),
                });
                p = Box::into_raw(chunk);
                slot.store(p, Ordering::Release);
                self.reserved.fetch_add(
                    CHUNK_FRAMES as u64 * PAGE_SIZE,
                    std::sync::atomic::Ordering::Relaxed,
                );
            }
        }
        // SAFETY: `p` is non-null, was published with Release after full
        // initialization, and chunks are freed only when the allocator
        // drops (we borrow it).
        unsafe { &*p }
    }

    /// The chunk of an allocated frame (it exists: frames are handed out
    /// only after their chunk).
    #[inline]
    fn chunk(&self, pfn: Pfn) -> &Chunk {
        let p = self.chunks[pfn as usize / CHUNK_FRAMES].load(Ordering::Acquire);
        assert!(!p.is_null(), "frame {pfn} was never allocated");
        // SAFETY: non-null chunk pointers stay valid while the allocator
        // lives (see `chunk_for`).
        unsafe { &*p }
    }

    #[inline]
    fn refs(&self, pfn: Pfn) -> &AtomicU32 {
        &self.chunk(pfn).refs[pfn as usize % CHUNK_FRAMES]
    }

    #[inline]
    fn base(&self, pfn: Pfn) -> *mut u8 {
        let c = self.chunk(pfn);
        // SAFETY: the offset is below the chunk's size because
        // pfn % CHUNK_FRAMES < CHUNK_FRAMES.
        unsafe {
            c.mem
                .add((pfn as usize % CHUNK_FRAMES) * PAGE_SIZE as usize)
        }
    }

    /// The frame's memory as 512 atomic words.
    #[inline]
    fn words(&self, pfn: Pfn) -> &[std::sync::atomic::AtomicU64; WORDS] {
        // SAFETY: the frame's memory is 4096 bytes, 4096-aligned (chunk
        // layout), so it is exactly 512 aligned u64 words; AtomicU64 has
        // u64's layout; the memory lives as long as the allocator (we
        // borrow it); all shared accesses to frame memory go through these
        // 8-byte atomics.
        unsafe { &*(self.base(pfn) as *const [std::sync::atomic::AtomicU64; WORDS]) }
    }

    /// Adds a reference (another mapping shares the frame).
    pub fn get(&self, pfn: Pfn) {
        self.refs(pfn).fetch_add(1, Ordering::Relaxed);
    }

    /// Drops a reference; frees the frame when it was the last. Returns
    /// true if the frame was freed.
    pub fn put(&self, pfn: Pfn) -> bool {
        if self.refs(pfn).fetch_sub(1, Ordering::AcqRel) != 1 {
            return false;
        }
        self.counts
            .local()
            .frees
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut c = self.caches.local().lock();
        c.push(pfn);
        if c.len() >= CACHE_MAX {
            let at = c.len() - BATCH;
            self.pool.lock().free.extend(c.drain(at..));
        }
        true
    }

    /// The reference count of a frame.
    pub fn refcount(&self, pfn: Pfn) -> u32 {
        self.refs(pfn).load(Ordering::Acquire)
    }

    /// Clears a frame just allocated (nobody else can reach it yet).
    fn zero(&self, pfn: Pfn) {
        // SAFETY: the frame was just taken from the free lists, so no page
        // table maps it and no access through an old translation remains
        // (frames are freed only after the TLB flush that removed their
        // last translation): we are its only user. The 4096 bytes are in
        // bounds of its chunk.
        unsafe { core::ptr::write_bytes(self.base(pfn), 0, PAGE_SIZE as usize) };
    }

    /// Obtains and touches the memory for the first `bytes` of the budget
    /// now, so that later allocations do not pay the host kernel's page
    /// faults (benchmarks call this before measuring). Only frames never
    /// handed out are touched.
    pub fn prefault(&self, bytes: u64) {
        let frames = (bytes / PAGE_SIZE).min(self.budget);
        // Holding the pool lock keeps `fresh` still: no frame at or above
        // it can be handed out meanwhile.
        let pool = self.pool.lock();
        let mut pfn = pool.fresh;
        while pfn < frames {
            let c = self.chunk_for(pfn as Pfn);
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
    pub fn read(&self, pfn: Pfn, offset: usize, buf: &mut [u8]) {
        let end = (offset.saturating_add(buf.len())).min(PAGE_SIZE as usize);
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
    pub fn write(&self, pfn: Pfn, offset: usize, data: &[u8]) {
        let end = (offset.saturating_add(data.len())).min(PAGE_SIZE as usize);
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
    pub fn copy(&self, dst: Pfn, src: Pfn) {
        let (d, s) = (self.words(dst), self.words(src));
        for (d, s) in d.iter().zip(s.iter()) {
            d.store(s.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }

    /// Frames allocated now.
    pub fn used(&self) -> u64 {
        let (mut a, mut f) = (0u64, 0u64);
        for c in self.counts.iter() {
            a += c.allocs.load(std::sync::atomic::Ordering::Relaxed);
            f += c.frees.load(std::sync::atomic::Ordering::Relaxed);
        }
        a.saturating_sub(f)
    }

    /// Frames the budget allows.
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Bytes of memory obtained from the system so far.
    pub fn reserved_bytes(&self) -> u64 {
        self.reserved.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The first byte of an allocated frame's 4096 bytes (4096-aligned).
    /// The memory stays valid while the allocator lives, whatever happens
    /// to the frame; shared accesses to it must be 8-byte atomics, as
    /// [`read`](Self::read) and [`write`](Self::write) do.
    pub(crate) fn frame_ptr(&self, pfn: Pfn) -> *mut u8 {
        self.base(pfn)
    }
}

impl Drop for FrameAllocator {
    fn drop(&mut self) {
        for slot in self.chunks.iter() {
            let p = slot.load(Ordering::Relaxed);
            if !p.is_null() {
                // SAFETY: published by `chunk_for` from Box::into_raw; the
                // allocator is being dropped, so nobody else can reach it.
                unsafe { drop(Box::from_raw(p)) };
            }
        }
    }
}

#[cfg(all(test, not(aspace_loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn alloc_free_and_refcounts() {
        let f = FrameAllocator::new(64 * PAGE_SIZE, true);
        let a = f.alloc().unwrap();
        assert_eq!(f.refcount(a), 1);
        f.get(a);
        assert!(!f.put(a));
        assert_eq!(f.used(), 1);
        assert!(f.put(a));
        assert_eq!(f.used(), 0);
    }

    #[test]
    fn budget_exhaustion_and_room_again() {
        let f = FrameAllocator::new(40 * PAGE_SIZE, false);
        let v: Vec<Pfn> = (0..40).map(|_| f.alloc().unwrap()).collect();
        assert!(f.alloc().is_none());
        let mut sorted = v.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), 40, "no frame handed out twice");
        f.put(v[7]);
        assert_eq!(f.alloc(), Some(v[7]));
        for p in v {
            f.put(p);
        }
        assert_eq!(f.used(), 0);
    }

    #[test]
    fn read_write_round_trips_and_zeroing() {
        let f = FrameAllocator::new(8 * PAGE_SIZE, true);
        let a = f.alloc().unwrap();
        let data: Vec<u8> = (0..100u8).collect();
        for off in [0usize, 1, 7, 8, 13, 4000, 3996] {
            f.write(a, off, &data[..(4096 - off).min(100)]);
            let mut back = vec![0u8; (4096 - off).min(100)];
            f.read(a, off, &mut back);
            assert_eq!(back, &data[..back.len()], "offset {off}");
        }
        let mut one = [0u8; 3];
        f.read(a, 2, &mut one);
        assert_eq!(
            one,
            [1, 2, 3],
            "the write at offset 1 left data[1..4] at 2..5"
        );
        f.put(a);
        let b = f.alloc().unwrap();
        assert_eq!(a, b);
        let mut all = vec![1u8; 4096];
        f.read(b, 0, &mut all);
        assert!(all.iter().all(|&x| x == 0), "reused frame is zeroed");
        let c = f.alloc().unwrap();
        f.write(b, 0, &[9; 4096]);
        f.copy(c, b);
        f.read(c, 0, &mut all);
        assert!(all.iter().all(|&x| x == 9));
    }

    #[test]
    fn concurrent_alloc_free_hands_out_each_frame_once() {
        let f = Arc::new(FrameAllocator::new(256 * PAGE_SIZE, false));
        let hs: Vec<_> = (0..4)
            .map(|t| {
                let f = f.clone();
                std::thread::spawn(move || {
                    for i in 0..2000u32 {
                        let mut mine = Vec::new();
                        for _ in 0..8 {
                            let p = f.alloc().unwrap();
                            f.write(p, 0, &(t * 100_000 + i).to_le_bytes());
                            mine.push(p);
                        }
                        for &p in &mine {
                            let mut b = [0u8; 4];
                            f.read(p, 0, &mut b);
                            assert_eq!(u32::from_le_bytes(b), t * 100_000 + i, "frame shared");
                        }
                        for p in mine {
                            f.put(p);
                        }
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(f.used(), 0);
    }
}
