//! Frames: real 4 KiB pages of memory, with per-CPU caches, and the
//! memory budget they share with page tables and VMA metadata.
//!
//! One [`FrameAllocator`] is one physical memory: several address spaces
//! may share it (`Arc`), as every process of a kernel shares its page
//! allocator. Its [`Budget`] counts frames in use, page-table pages and
//! metadata (VMAs, shared objects' page trees) together; an allocation
//! that would pass it fails instead of growing the host process.
//!
//! Memory is obtained from the system lazily, in chunks (anonymous `mmap`
//! on unix, so a frame costs host memory only once it is first written).
//! Every frame has a reference count (page tables, shared objects and
//! copy-on-write sharers each hold one). Allocation and freeing touch only
//! the calling CPU's cache, which is refilled from (and spills to) a global
//! pool in batches; when the pool is dry, other CPUs' caches are drained
//! before giving up.
//!
//! Frame contents are accessed with 8-byte atomic loads and stores (partial
//! words by compare-and-swap on the containing word), so concurrent
//! user-mode loads and stores to one page — which real programs do — are
//! not undefined behaviour here. They behave like unsynchronized memory on
//! x86-64: no tearing inside a word, no ordering.
//!
//! Isolation: a pool that zeroes frames ([`FrameAllocator::new`] with
//! `zero_new`) clears every frame it hands out again, whoever freed it, so
//! no address space sees another's bytes; frames never handed out are
//! already zero and are not cleared again. A pool made without zeroing
//! (to measure metadata paths) hands frames out with whatever bytes their
//! last user left: share such a pool only between spaces that trust each
//! other.
//!
//! # Locking
//!
//! The frame allocator's locks come after the PTE locks in the crate's
//! [lock order](crate::mm#locking) (its level 5). Among themselves: a CPU
//! cache's mutex, then the global pool's, then the chunk directory's
//! `grow` lock; none of them is held while calling out of this module. Reference counts,
//! budget counts and frame words are atomics. Each field below says what
//! protects it.

use crate::addr::PAGE_SIZE;
use crate::percpu::PerCpu;
use crate::sync::counter::{self, AtomicU64 as CounterU64};
use crate::sync::frame::AtomicU64 as FrameWord;
use crate::sync::{Arc, AtomicPtr, AtomicU32, Mutex, Ordering};

/// A frame number: which 4 KiB frame of a [`FrameAllocator`].
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct Pfn(u32);

impl Pfn {
    /// The shared zero page: a frame number no allocator hands out, that
    /// reads as zeros and is never freed. Entries mapping it hold no
    /// reference.
    pub const ZERO_PAGE: Pfn = Pfn(u32::MAX);

    /// Frame number `n`.
    pub const fn new(n: u32) -> Pfn {
        Pfn(n)
    }

    /// The number.
    pub const fn get(self) -> u32 {
        self.0
    }

    /// True for [`Pfn::ZERO_PAGE`].
    pub const fn is_zero_page(self) -> bool {
        self.0 == Self::ZERO_PAGE.0
    }

    /// The number as an index into the allocator's chunks.
    #[inline]
    const fn index(self) -> usize {
        self.0 as usize
    }
}

impl core::fmt::Display for Pfn {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Frames per chunk obtained from the system (2 MiB; smaller under loom).
#[cfg(not(aspace_loom))]
const CHUNK_FRAMES: usize = 512;
#[cfg(aspace_loom)]
const CHUNK_FRAMES: usize = 8;

/// Bytes per chunk.
const CHUNK_BYTES: usize = CHUNK_FRAMES * PAGE_SIZE as usize;

/// Frames moved between a CPU cache and the global pool at once.
const BATCH: usize = 32;
/// A CPU cache spills a batch when it holds this many.
const CACHE_MAX: usize = 4 * BATCH;

const WORDS: usize = PAGE_SIZE as usize / 8;

/// Set in a free frame's reference word once the frame has been handed out
/// (its bytes may be someone's); a frame never handed out reads 0 there and
/// is known to be zero.
const USED_BEFORE: u32 = 1 << 31;

/// Bytes a CPU slot of a [`Budget`] takes from the shared count at once,
/// so that most charges write only the CPU's own cache line.
const STOCK_BATCH: u64 = 64 * PAGE_SIZE;

/// A memory budget: bytes charged by frames in use, page-table pages and
/// metadata, against a limit.
///
/// Charges are taken from a per-CPU stock refilled from the shared count in
/// batches (like memcg's per-CPU stock), so the common charge and uncharge
/// write no shared cache line. The shared count includes the stocks, so the
/// memory really in use never exceeds the limit; a charge that finds the
/// shared count full drains every stock before it fails.
pub struct Budget {
    /// The limit in bytes.
    ///
    /// Protected by: immutable after creation.
    limit: u64,
    /// Bytes charged, stocks included.
    ///
    /// Protected by: a counter atomic (`sync::counter`), `Relaxed`: the
    /// limit check is one read-modify-write, and nothing is ordered by it.
    charged: CounterU64,
    /// Bytes each CPU slot took from `charged` and has not used yet.
    ///
    /// Protected by: counter atomics, `Relaxed` (a slot is shared by the
    /// threads of its CPU; see [`crate::percpu`]).
    stock: PerCpu<CounterU64>,
}

impl core::fmt::Debug for Budget {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Budget")
            .field("limit", &self.limit)
            .field("used", &self.used())
            .finish()
    }
}

impl Budget {
    /// A budget of `limit` bytes.
    pub fn new(limit: u64) -> Self {
        Budget {
            limit,
            charged: CounterU64::new(0),
            stock: PerCpu::new(|| CounterU64::new(0)),
        }
    }

    /// A budget that never refuses (structures used on their own).
    pub fn unlimited() -> Self {
        Self::new(u64::MAX)
    }

    /// The limit in bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Charges `bytes`; false (and nothing charged) if that would pass the
    /// limit.
    pub fn try_charge(&self, bytes: u64) -> bool {
        let s = self.stock.local();
        let mut cur = s.load(Ordering::Relaxed);
        while cur >= bytes {
            match s.compare_exchange_weak(cur, cur - bytes, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(c) => cur = c,
            }
        }
        if let Some(more) = bytes.checked_add(STOCK_BATCH) {
            if self.reserve(more) {
                s.fetch_add(STOCK_BATCH, Ordering::Relaxed);
                return true;
            }
        }
        if self.reserve(bytes) {
            return true;
        }
        // Full: what other CPUs hold in stock is not in use.
        for st in self.stock.iter() {
            let x = st.swap(0, Ordering::Relaxed);
            if x > 0 {
                self.charged.fetch_sub(x, Ordering::Relaxed);
            }
        }
        self.reserve(bytes)
    }

    /// Charges `bytes` even past the limit, for memory a caller cannot do
    /// without: an address space's root table, mremap's destination tables
    /// (its source tables are freed right after), and VMAs whose room was
    /// checked just before ([`has_room`](Self::has_room)).
    pub fn force_charge(&self, bytes: u64) {
        self.charged.fetch_add(bytes, Ordering::Relaxed);
    }

    /// True if `bytes` could be charged now (a hint: others may charge
    /// before the caller does).
    pub fn has_room(&self, bytes: u64) -> bool {
        self.used()
            .checked_add(bytes)
            .is_some_and(|t| t <= self.limit)
    }

    fn reserve(&self, bytes: u64) -> bool {
        self.charged
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
                c.checked_add(bytes).filter(|&t| t <= self.limit)
            })
            .is_ok()
    }

    /// Gives back `bytes` charged earlier.
    pub fn uncharge(&self, bytes: u64) {
        let s = self.stock.local();
        let mut cur = s.fetch_add(bytes, Ordering::Relaxed) + bytes;
        // Keep one batch in stock; return the rest to the shared count.
        while cur > 2 * STOCK_BATCH {
            match s.compare_exchange_weak(cur, STOCK_BATCH, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => {
                    self.charged.fetch_sub(cur - STOCK_BATCH, Ordering::Relaxed);
                    return;
                }
                Err(c) => cur = c,
            }
        }
    }

    /// Bytes charged now (stocks not counted).
    pub fn used(&self) -> u64 {
        let stock: u64 = self.stock.iter().map(|s| s.load(Ordering::Relaxed)).sum();
        self.charged.load(Ordering::Relaxed).saturating_sub(stock)
    }
}

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

struct Chunk {
    /// The chunk's memory, `CHUNK_BYTES` from the system.
    ///
    /// Protected by: the pointer is immutable after creation. The bytes
    /// are guest data: shared accesses are 8-byte `sync::frame` atomics
    /// (`Relaxed`, no ordering, as on x86-64); a frame is written
    /// non-atomically only by its exclusive owner (zeroing on allocation,
    /// `prefault` of frames never handed out, under the pool lock).
    mem: *mut u8,
    /// One reference count per frame, with `USED_BEFORE` while free.
    ///
    /// Protected by: atomics. `get` adds `Relaxed` (the caller already
    /// holds a reference), `put` subtracts `AcqRel` (the last put sees
    /// every user's accesses), `refcount` reads `Acquire`; while the frame
    /// is free, only the allocator writes it (`Relaxed`), handing the
    /// frame over through the cache and pool mutexes.
    refs: Box<[AtomicU32]>,
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
const DIR_CHUNKS: usize = 512;
#[cfg(aspace_loom)]
const DIR_CHUNKS: usize = 8;

/// One page of the chunk directory.
struct ChunkDir {
    /// The directory page's chunks, null until obtained.
    ///
    /// Protected by: written once (null to a chunk, `Release`) under
    /// `FrameAllocator::grow`; read lock-free with `Acquire`. Chunks are
    /// freed only when the allocator drops.
    chunks: [AtomicPtr<Chunk>; DIR_CHUNKS],
}

/// The global free pool, behind `FrameAllocator::pool`.
struct Pool {
    /// Frames freed and spilled by the CPU caches.
    ///
    /// Protected by: `FrameAllocator::pool`.
    free: Vec<Pfn>,
    /// Frames below this number have been handed out at least once.
    ///
    /// Protected by: `FrameAllocator::pool`.
    fresh: u64,
}

/// Allocation and free counts of one CPU slot.
#[derive(Default)]
struct Counts {
    /// Frames allocated here.
    ///
    /// Protected by: a counter atomic (`sync::counter`), `Relaxed`.
    allocs: CounterU64,
    /// Frames freed here.
    ///
    /// Protected by: a counter atomic (`sync::counter`), `Relaxed`.
    frees: CounterU64,
}

/// The frame allocator: one physical memory, shareable by many address
/// spaces (see the module docs).
pub struct FrameAllocator {
    /// Frame numbers available (the budget in frames).
    ///
    /// Protected by: immutable after creation.
    frames: u64,
    /// Whether frames handed out again are cleared.
    ///
    /// Protected by: immutable after creation.
    zero_new: bool,
    /// The budget frames, page tables and metadata are charged to.
    ///
    /// Protected by: immutable after creation (the budget is atomics).
    budget: Arc<Budget>,
    /// Two-level chunk directory, filled on first use.
    ///
    /// Protected by: each slot written once (null to a directory page,
    /// `Release`) under `grow`; read lock-free with `Acquire`.
    dirs: Box<[AtomicPtr<ChunkDir>]>,
    /// Serializes obtaining chunks and directory pages from the system.
    ///
    /// Protected by: immutable after creation (it is the lock).
    grow: Mutex<()>,
    /// The global pool of free and never-used frames.
    ///
    /// Protected by: its mutex.
    pool: Mutex<Pool>,
    /// Each CPU slot's cache of free frames.
    ///
    /// Protected by: each cache's mutex (a slot is shared by the threads
    /// of its CPU; see [`crate::percpu`]).
    caches: PerCpu<Mutex<Vec<Pfn>>>,
    /// Allocation and free counts per CPU slot.
    ///
    /// Protected by: counter atomics (see `Counts`).
    counts: PerCpu<Counts>,
    /// Bytes obtained from the system.
    ///
    /// Protected by: a counter atomic (`sync::counter`), `Relaxed`,
    /// added to under `grow`.
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
            .field("frames", &self.frames)
            .field("used", &self.used())
            .field("budget", &self.budget)
            .finish()
    }
}

impl FrameAllocator {
    /// A physical memory of at most `budget_bytes`, shared by its frames,
    /// the page tables and the metadata of the address spaces that use it.
    /// `zero_new` clears every frame handed out again by
    /// [`alloc`](Self::alloc) (frames never used are zero already); it is
    /// what keeps address spaces sharing the pool from seeing each other's
    /// bytes.
    pub fn new(budget_bytes: u64, zero_new: bool) -> Self {
        // Numbers from the zero page's up are never handed out.
        let frames = (budget_bytes / PAGE_SIZE).min(u64::from(Pfn::ZERO_PAGE.get()) - 1);
        let nchunks = (frames as usize).div_ceil(CHUNK_FRAMES);
        FrameAllocator {
            frames,
            zero_new,
            budget: Arc::new(Budget::new(budget_bytes)),
            dirs: (0..nchunks.div_ceil(DIR_CHUNKS))
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

    /// The budget frames, page tables and metadata are charged to.
    pub fn memory(&self) -> &Arc<Budget> {
        &self.budget
    }

    /// True if this pool clears frames it hands out again.
    pub fn zeroes_frames(&self) -> bool {
        self.zero_new
    }

    /// A frame with reference count 1, zero if the allocator zeroes
    /// frames; `None` when the budget is exhausted.
    pub fn alloc(&self) -> Option<Pfn> {
        let (pfn, used_before) = self.take_charged()?;
        if self.zero_new && used_before {
            self.zero(pfn);
        }
        Some(pfn)
    }

    /// A frame with reference count 1 and unspecified contents (for a
    /// frame about to be overwritten whole).
    pub fn alloc_uninit(&self) -> Option<Pfn> {
        self.take_charged().map(|(pfn, _)| pfn)
    }

    /// Charges and takes a frame; says whether it was used before.
    fn take_charged(&self) -> Option<(Pfn, bool)> {
        if !self.budget.try_charge(PAGE_SIZE) {
            return None;
        }
        let Some(pfn) = self.take() else {
            self.budget.uncharge(PAGE_SIZE);
            return None;
        };
        self.use_exclusive(pfn);
        let was = self.refs(pfn).swap(1, Ordering::Relaxed);
        self.counts
            .local()
            .allocs
            .fetch_add(1, counter::Ordering::Relaxed);
        Some((pfn, was & USED_BEFORE != 0))
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
        // Never past the end of a chunk, so one chunk backs the batch.
        let to_chunk_end = CHUNK_FRAMES as u64 - fresh % CHUNK_FRAMES as u64;
        let n = (self.frames - fresh).min(BATCH as u64).min(to_chunk_end);
        if n == 0 || self.chunk_for(Pfn::new(fresh as u32)).is_none() {
            return false;
        }
        pool.fresh += n;
        drop(pool);
        c.extend((fresh..fresh + n).rev().map(|p| Pfn::new(p as u32)));
        true
    }

    /// The chunk holding `pfn`, obtained from the system on first use;
    /// `None` if the system refuses.
    fn chunk_for(&self, pfn: Pfn) -> Option<&Chunk> {
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
                    refs: (0..CHUNK_FRAMES).map(|_| AtomicU32::new(0)).collect(),
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
    fn chunk(&self, pfn: Pfn) -> &Chunk {
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

    #[inline]
    fn refs(&self, pfn: Pfn) -> &AtomicU32 {
        &self.chunk(pfn).refs[pfn.index() % CHUNK_FRAMES]
    }

    #[inline]
    fn base(&self, pfn: Pfn) -> *mut u8 {
        let c = self.chunk(pfn);
        // SAFETY: the offset is below the chunk's size because
        // pfn % CHUNK_FRAMES < CHUNK_FRAMES.
        unsafe { c.mem.add((pfn.index() % CHUNK_FRAMES) * PAGE_SIZE as usize) }
    }

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

    /// Marks an exclusive use of the frame's memory (loom only: see
    /// `Chunk::owner`).
    #[inline(always)]
    fn use_exclusive(&self, _pfn: Pfn) {
        #[cfg(aspace_loom)]
        self.chunk(_pfn).owner[_pfn.index() % CHUNK_FRAMES].with_mut(|_| ());
    }

    /// Marks a shared use of the frame's memory, a store if `_store`
    /// (loom only: see `Chunk::owner` and `Chunk::touch`).
    #[inline(always)]
    fn use_shared(&self, _pfn: Pfn, _store: bool) {
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

    /// Adds a reference (another mapping shares the frame).
    pub fn get(&self, pfn: Pfn) {
        self.refs(pfn).fetch_add(1, Ordering::Relaxed);
    }

    /// Drops a reference; frees the frame when it was the last. Returns
    /// true if the frame was freed.
    pub fn put(&self, pfn: Pfn) -> bool {
        let refs = self.refs(pfn);
        if refs.fetch_sub(1, Ordering::AcqRel) != 1 {
            return false;
        }
        self.use_exclusive(pfn);
        // Free now; whoever takes it next clears it (see `alloc`).
        refs.store(USED_BEFORE, Ordering::Relaxed);
        self.counts
            .local()
            .frees
            .fetch_add(1, counter::Ordering::Relaxed);
        self.budget.uncharge(PAGE_SIZE);
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
        self.refs(pfn).load(Ordering::Acquire) & !USED_BEFORE
    }

    /// Clears a frame just allocated (nobody else can reach it yet).
    fn zero(&self, pfn: Pfn) {
        self.use_exclusive(pfn);
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
        let frames = (bytes / PAGE_SIZE).min(self.frames);
        // Holding the pool lock keeps `fresh` still: no frame at or above
        // it can be handed out meanwhile.
        let pool = self.pool.lock();
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
    pub fn read(&self, pfn: Pfn, offset: usize, buf: &mut [u8]) {
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
    pub fn write(&self, pfn: Pfn, offset: usize, data: &[u8]) {
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
    pub fn copy(&self, dst: Pfn, src: Pfn) {
        self.use_shared(src, false);
        self.use_shared(dst, true);
        let (d, s) = (self.words(dst), self.words(src));
        for (d, s) in d.iter().zip(s.iter()) {
            d.store(s.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }

    /// Frames allocated now.
    pub fn used(&self) -> u64 {
        let (mut a, mut f) = (0u64, 0u64);
        for c in self.counts.iter() {
            a += c.allocs.load(counter::Ordering::Relaxed);
            f += c.frees.load(counter::Ordering::Relaxed);
        }
        a.saturating_sub(f)
    }

    /// Frames the budget allows (were nothing else charged to it).
    pub fn budget(&self) -> u64 {
        self.frames
    }

    /// Bytes of memory obtained from the system so far.
    pub fn reserved_bytes(&self) -> u64 {
        self.reserved.load(counter::Ordering::Relaxed)
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
    fn budget_stocks_are_drained_before_a_charge_fails() {
        let b = Arc::new(Budget::new(4 * STOCK_BATCH));
        // Another thread charges and gives back: its CPU slot keeps stock.
        let b2 = b.clone();
        std::thread::spawn(move || {
            assert!(b2.try_charge(PAGE_SIZE));
            b2.uncharge(PAGE_SIZE);
        })
        .join()
        .unwrap();
        assert_eq!(b.used(), 0);
        // All of the limit can still be charged here, and no more.
        assert!(b.try_charge(4 * STOCK_BATCH));
        assert!(!b.try_charge(1));
        assert_eq!(b.used(), 4 * STOCK_BATCH);
        b.uncharge(4 * STOCK_BATCH);
        assert_eq!(b.used(), 0);
        assert!(b.has_room(4 * STOCK_BATCH) && !b.has_room(4 * STOCK_BATCH + 1));
    }

    #[test]
    fn frames_and_metadata_share_the_budget() {
        let f = FrameAllocator::new(8 * PAGE_SIZE, true);
        f.memory().force_charge(6 * PAGE_SIZE);
        let v: Vec<Pfn> = std::iter::from_fn(|| f.alloc()).collect();
        assert_eq!(v.len(), 2);
        assert_eq!(f.memory().used(), 8 * PAGE_SIZE);
        for p in v {
            f.put(p);
        }
        f.memory().uncharge(6 * PAGE_SIZE);
        assert_eq!(f.memory().used(), 0);
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
