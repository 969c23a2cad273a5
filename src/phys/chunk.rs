//! Where frames live: chunks of memory obtained from the system, the
//! two-level directory that finds a frame's chunk, and each frame's
//! reference count and pin count, and its page-table fields.
//!
//! Pins (Linux's `FOLL_PIN`) are references held for devices, which reach
//! a frame's memory without a translation: a pinned frame is never freed
//! (a pin is a reference), and the paths that ask whether a page is
//! exclusive ignore pins ([`FrameAllocator::refcount`] counts plain
//! references only), so a pinned page stays the page of the one mapping
//! that owns it: a write fault reuses it instead of copying it away from
//! the device, and fork gives the child a copy instead of sharing it
//! ([`FrameAllocator::maybe_pinned`]). Both counts share one 64-bit word
//! (plain references below bit 32, pins above, as Linux's folio count
//! adds `GUP_PIN_COUNTING_BIAS` per pin), so one load sees both.

use super::{FrameAllocator, Pfn, CHUNK_BYTES, CHUNK_FRAMES};
use crate::addr::PAGE_SIZE;
use crate::sync::counter;
#[cfg(aspace_loom)]
use crate::sync::AtomicU32;
use crate::sync::{AtomicPtr, AtomicU64, Ordering};

/// What one pin adds to a frame's count word: pins count above bit 32,
/// plain references below.
const PIN: u64 = 1 << 32;

/// Chunk memory from the system: anonymous mmap on unix (zero, and
/// resident only once touched), a zeroed heap block elsewhere and under
/// loom. Null on failure.
fn sys_alloc() -> *mut u8 {
    #[cfg(all(unix, not(aspace_loom)))]
    {
        // SAFETY: an anonymous private mapping of a non-zero length at an
        // address of the kernel's choice affects no existing memory.
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                CHUNK_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            core::ptr::null_mut()
        } else {
            p.cast()
        }
    }
    #[cfg(not(all(unix, not(aspace_loom))))]
    {
        // SAFETY: the layout has non-zero size.
        unsafe { std::alloc::alloc_zeroed(heap_layout()) }
    }
}

#[cfg(not(all(unix, not(aspace_loom))))]
fn heap_layout() -> std::alloc::Layout {
    std::alloc::Layout::from_size_align(CHUNK_BYTES, PAGE_SIZE as usize)
        .expect("chunk layout is valid")
}

/// Returns chunk memory from [`sys_alloc`].
///
/// # Safety
/// `p` came from `sys_alloc` and is not used afterwards.
unsafe fn sys_free(p: *mut u8) {
    #[cfg(all(unix, not(aspace_loom)))]
    // SAFETY: `p` is a mapping of CHUNK_BYTES made by `sys_alloc` (caller's
    // contract) and nothing uses it any more.
    unsafe {
        libc::munmap(p.cast(), CHUNK_BYTES);
    }
    #[cfg(not(all(unix, not(aspace_loom))))]
    // SAFETY: allocated by `sys_alloc` with this layout (caller's contract).
    unsafe {
        std::alloc::dealloc(p, heap_layout())
    }
}

pub(super) struct Chunk {
    /// The chunk's memory, `CHUNK_BYTES` from the system.
    ///
    /// Protected by: the pointer is immutable after creation. The bytes
    /// are guest data: shared accesses are 8-byte `sync::frame` atomics
    /// (`Relaxed`, no ordering, as on x86-64); a frame is written
    /// non-atomically only by its exclusive owner (zeroing on allocation,
    /// `prefault` of frames never handed out, under the pool lock).
    pub(super) mem: *mut u8,
    /// One count word per frame, 0 while free: plain references in the
    /// low 32 bits, pins (each also a reference) times [`PIN`] above.
    ///
    /// Protected by: atomics. `get` and `pin` add `Relaxed` (the caller
    /// already holds a reference), `put` subtracts `AcqRel` (the last put
    /// sees every user's accesses; a word with a pin is never the last),
    /// `unpin` turns its pin into a plain reference and puts that,
    /// `refcount` reads `Acquire`; while the frame is free, only the
    /// allocator writes it (`Relaxed`), handing the frame over through the
    /// cache and pool mutexes.
    pub(super) refs: Box<[AtomicU64]>,
    /// Each data frame's account: the number, in the physical memory's
    /// registry, of the allocator it is charged to (see `account`).
    ///
    /// Protected by: a counter atomic (`sync::counter`), `Relaxed`:
    /// stored by the allocation, which owns the frame, and read by the
    /// last `put`, which the count word's `AcqRel` orders after it.
    pub(super) account: Box<[counter::AtomicU32]>,
    /// The fields of each frame used as a page-table page (its lock and
    /// count; see `table`), pointing at the frame's memory.
    ///
    /// Protected by: see [`super::TablePage`].
    #[cfg(not(aspace_loom))]
    pub(super) tables: Box<[super::TablePage]>,
    /// Under loom, one tracked cell per frame stands for its memory
    /// (protected by: loom's own checking, it is the model's witness):
    /// loads, stores and copies are shared accesses, while taking a frame
    /// from the free lists, zeroing it and freeing it are exclusive. loom
    /// then reports any access to a frame that is not ordered with its
    /// freeing or reuse (a copy-on-write copy without a reference, say).
    #[cfg(aspace_loom)]
    owner: Box<[crate::sync::UnsafeCell<()>]>,
    /// Protected by: a loom atomic, `Relaxed` (a witness, see below).
    ///
    /// Under loom, a per-frame atomic that every load touches with a
    /// `Relaxed` read and every store with a `Relaxed` read-modify-write.
    /// The bytes themselves are plain `std` atomics, which loom does not
    /// see; these conflicting operations make it try every order of a
    /// store and a load of the same frame (a store landing after a fork
    /// snapshot, say). `Relaxed` adds no ordering, so it hides no race.
    #[cfg(aspace_loom)]
    touch: Box<[AtomicU32]>,
}

impl Drop for Chunk {
    fn drop(&mut self) {
        // SAFETY: `mem` came from `sys_alloc` in `FrameAllocator::chunk_for`
        // and is freed only here.
        unsafe { sys_free(self.mem) };
    }
}

/// Chunk pointers per directory page: a directory page maps 1 GiB of
/// frames, and is made only once a chunk in it is, so a pool's fixed cost
/// is one pointer per GiB of budget (fewer under loom, whose atomics are
/// costly objects).
#[cfg(not(aspace_loom))]
pub(super) const DIR_CHUNKS: usize = 512;
#[cfg(aspace_loom)]
pub(super) const DIR_CHUNKS: usize = 8;

/// One page of the chunk directory.
pub(super) struct ChunkDir {
    /// The directory page's chunks, null until obtained.
    ///
    /// Protected by: written once (null to a chunk, `Release`) under
    /// `FrameAllocator::grow`; read lock-free with `Acquire`. Chunks are
    /// freed only when the allocator drops.
    chunks: [AtomicPtr<Chunk>; DIR_CHUNKS],
}

impl FrameAllocator {
    /// The chunk holding `pfn`, obtained from the system on first use;
    /// `None` if the system refuses.
    pub(super) fn chunk_for(&self, pfn: Pfn) -> Option<&Chunk> {
        let c = pfn.index() / CHUNK_FRAMES;
        let dir_slot = &self.dirs[c / DIR_CHUNKS];
        let mut p = core::ptr::null_mut();
        let mut dir = dir_slot.load(Ordering::Acquire);
        if !dir.is_null() {
            // SAFETY: published with Release after initialization; freed
            // only when the allocator drops (we borrow it).
            p = unsafe { &*dir }.chunks[c % DIR_CHUNKS].load(Ordering::Acquire);
        }
        if p.is_null() {
            let _g = self.grow.lock();
            dir = dir_slot.load(Ordering::Acquire);
            if dir.is_null() {
                dir = Box::into_raw(Box::new(ChunkDir {
                    chunks: core::array::from_fn(|_| AtomicPtr::new(core::ptr::null_mut())),
                }));
                dir_slot.store(dir, Ordering::Release);
            }
            // SAFETY: as above; we hold the grow lock, so nobody else
            // publishes into it meanwhile.
            let slot = &unsafe { &*dir }.chunks[c % DIR_CHUNKS];
            p = slot.load(Ordering::Acquire);
            if p.is_null() {
                let mem = sys_alloc();
                if mem.is_null() {
                    return None;
                }
                let chunk = Box::new(Chunk {
                    mem,
                    refs: (0..CHUNK_FRAMES).map(|_| AtomicU64::new(0)).collect(),
                    account: (0..CHUNK_FRAMES)
                        .map(|_| counter::AtomicU32::new(0))
                        .collect(),
                    #[cfg(not(aspace_loom))]
                    tables: super::TablePage::chunk_pages(mem, c * CHUNK_FRAMES),
                    #[cfg(aspace_loom)]
                    owner: (0..CHUNK_FRAMES)
                        .map(|_| crate::sync::UnsafeCell::new(()))
                        .collect(),
                    #[cfg(aspace_loom)]
                    touch: (0..CHUNK_FRAMES).map(|_| AtomicU32::new(0)).collect(),
                });
                p = Box::into_raw(chunk);
                slot.store(p, Ordering::Release);
                self.reserved
                    .fetch_add(CHUNK_BYTES as u64, counter::Ordering::Relaxed);
            }
        }
        // SAFETY: `p` is non-null, was published with Release after full
        // initialization, and chunks are freed only when the allocator
        // drops (we borrow it).
        Some(unsafe { &*p })
    }

    /// The chunk of an allocated frame (it exists: frames are handed out
    /// only after their chunk).
    #[inline]
    pub(super) fn chunk(&self, pfn: Pfn) -> &Chunk {
        let c = pfn.index() / CHUNK_FRAMES;
        let dir = self.dirs[c / DIR_CHUNKS].load(Ordering::Acquire);
        assert!(!dir.is_null(), "frame {pfn} was never allocated");
        // SAFETY: non-null directory and chunk pointers stay valid while
        // the allocator lives (see `chunk_for`).
        let p = unsafe { &*dir }.chunks[c % DIR_CHUNKS].load(Ordering::Acquire);
        assert!(!p.is_null(), "frame {pfn} was never allocated");
        // SAFETY: as above.
        unsafe { &*p }
    }

    /// The frame's count word (see `Chunk::refs`).
    #[inline]
    pub(super) fn refs(&self, pfn: Pfn) -> &AtomicU64 {
        &self.chunk(pfn).refs[pfn.index() % CHUNK_FRAMES]
    }

    /// The frame's count word and account number (see `Chunk::refs` and
    /// `Chunk::account`), found with one directory walk (the walk's
    /// `Acquire` loads are not merged across two calls).
    #[inline]
    pub(super) fn frame_words(&self, pfn: Pfn) -> (&AtomicU64, &counter::AtomicU32) {
        let (c, i) = (self.chunk(pfn), pfn.index() % CHUNK_FRAMES);
        (&c.refs[i], &c.account[i])
    }

    /// The count words and account records of the `n` frames from
    /// `first`, which lie in one chunk (`first % CHUNK_FRAMES + n` at most
    /// `CHUNK_FRAMES`), from one directory walk: a huge frame's 512
    /// subframes are set up and checked a chunk at a time.
    #[inline]
    pub(super) fn frame_run(&self, first: Pfn, n: usize) -> (&[AtomicU64], &[counter::AtomicU32]) {
        let (c, i) = (self.chunk(first), first.index() % CHUNK_FRAMES);
        (&c.refs[i..i + n], &c.account[i..i + n])
    }

    /// Pins the frame for a device: a reference that
    /// [`refcount`](Self::refcount) does not count. The caller holds a
    /// reference (the entry mapping the frame, under its PTE lock).
    #[cfg(any(feature = "vm-memory", test))]
    pub(crate) fn pin(&self, pfn: Pfn) {
        self.refs(pfn).fetch_add(PIN, Ordering::Relaxed);
    }

    /// Drops a pin taken by [`pin`](Self::pin); frees the frame if it was
    /// its last reference. The pin becomes a plain reference first, so
    /// the frame never looks free (or less referenced than it is) in
    /// between.
    #[cfg(any(feature = "vm-memory", test))]
    pub(crate) fn unpin(&self, pfn: Pfn) {
        self.refs(pfn).fetch_sub(PIN - 1, Ordering::Relaxed);
        self.put(pfn);
    }

    /// Whether a device may hold the frame (Linux's
    /// `folio_maybe_dma_pinned`): exact while the caller excludes new pins
    /// (holding the PTE lock of the one entry that maps an exclusive
    /// page); a pin being dropped may still read as held.
    pub(crate) fn maybe_pinned(&self, pfn: Pfn) -> bool {
        !pfn.is_zero_page() && self.refs(pfn).load(Ordering::Acquire) >= PIN
    }

    #[inline]
    pub(super) fn base(&self, pfn: Pfn) -> *mut u8 {
        let c = self.chunk(pfn);
        // SAFETY: the offset is below the chunk's size because
        // pfn % CHUNK_FRAMES < CHUNK_FRAMES.
        unsafe { c.mem.add((pfn.index() % CHUNK_FRAMES) * PAGE_SIZE as usize) }
    }

    /// Marks an exclusive use of the frame's memory (loom only: see
    /// `Chunk::owner`).
    #[inline(always)]
    pub(super) fn use_exclusive(&self, _pfn: Pfn) {
        #[cfg(aspace_loom)]
        self.chunk(_pfn).owner[_pfn.index() % CHUNK_FRAMES].with_mut(|_| ());
    }

    /// Marks a shared use of the frame's memory, a store if `_store`
    /// (loom only: see `Chunk::owner` and `Chunk::touch`).
    #[inline(always)]
    pub(super) fn use_shared(&self, _pfn: Pfn, _store: bool) {
        #[cfg(aspace_loom)]
        {
            let (c, i) = (self.chunk(_pfn), _pfn.index() % CHUNK_FRAMES);
            c.owner[i].with(|_| ());
            if _store {
                c.touch[i].fetch_add(1, Ordering::Relaxed);
            } else {
                c.touch[i].load(Ordering::Relaxed);
            }
        }
    }
}

impl Drop for super::Phys {
    fn drop(&mut self) {
        for d in self.dirs.iter() {
            let d = d.load(Ordering::Relaxed);
            if d.is_null() {
                continue;
            }
            // SAFETY: published by `chunk_for` from Box::into_raw; the
            // allocator is being dropped, so nobody else can reach it.
            let dir = unsafe { Box::from_raw(d) };
            for slot in dir.chunks.iter() {
                let p = slot.load(Ordering::Relaxed);
                if !p.is_null() {
                    // SAFETY: as for the directory page.
                    unsafe { drop(Box::from_raw(p)) };
                }
            }
        }
    }
}

#[cfg(all(test, not(aspace_loom)))]
mod tests {
    use super::*;

    #[test]
    fn pins_hold_a_frame_without_counting_as_references() {
        let f = FrameAllocator::new(1 << 20, true);
        let a = f.alloc().unwrap();
        assert!(!f.maybe_pinned(a) && !f.maybe_pinned(Pfn::ZERO_PAGE));
        f.pin(a);
        f.pin(a);
        assert!(f.maybe_pinned(a));
        assert_eq!(f.refcount(a), 1, "pins are not plain references");
        // The mapping's reference goes: the pinned frame stays.
        assert!(!f.put(a));
        assert_eq!((f.refcount(a), f.used()), (0, 1));
        assert!(f.try_get(a), "a pinned frame is not free");
        f.put(a);
        f.unpin(a);
        assert_eq!(f.used(), 1);
        f.unpin(a);
        assert_eq!(f.used(), 0, "the last pin frees it");
    }
}
