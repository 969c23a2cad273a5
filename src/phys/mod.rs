//! Frames: real 4 KiB pages of memory, with per-CPU caches, and the
//! memory budget they share with page tables and VMA metadata.
//!
//! A [`FrameAllocator`] is an account over a physical memory (`Phys`,
//! `memory`): several address spaces may share an allocator (`Arc`), as
//! every process of a kernel shares its page allocator, and several
//! allocators may share a physical memory, each with its own budget (as
//! memcgs share one machine; see `account`): the allocators of
//! [`AddressSpace::new`](crate::AddressSpace::new) spaces and of memory
//! objects all share the process's ([`FrameAllocator::shared`]), so that
//! any object maps into any space. An allocator's [`Budget`] counts the
//! frames charged to it, page-table pages and metadata (VMAs, shared
//! objects' page trees) together; an allocation that would pass it fails
//! instead of growing the host process.
//!
//! Memory is obtained from the system lazily, in chunks (anonymous `mmap`
//! on unix, so a frame costs host memory only once it is first written).
//! Every frame has a reference count (page tables, shared objects and
//! copy-on-write sharers each hold one). Page-table pages are frames too
//! ([`TablePage`]: the entries are the frame's words, its lock and count
//! sit in a per-frame array beside the reference counts). Allocation and
//! freeing touch only the calling CPU's cache, which is refilled from (and
//! spills to) a global pool in batches; when the pool is dry, other CPUs'
//! caches are drained before giving up.
//!
//! Never-used frames go to a CPU a whole chunk's remainder at a time (up
//! to 512 frames, as a range in its cache), and so do frames known zero
//! (given back to the system, up to 512: on the shared physical memory
//! they are what a new space faults in), freed frames 32 at a time: a
//! CPU faulting in fresh memory takes the global pool's lock, a line every
//! CPU writes, once per 512 frames rather than once per 32. Reference
//! counts of one span are then one CPU's lines too.
//!
//! Frame contents are accessed with 8-byte atomic loads and stores (partial
//! words by compare-and-swap on the containing word), so concurrent
//! user-mode loads and stores to one page — which real programs do — are
//! not undefined behaviour here. They behave like unsynchronized memory on
//! x86-64: no tearing inside a word, no ordering.
//!
//! Isolation: a pool that zeroes frames ([`FrameAllocator::new`] with
//! `zero_new`) clears every frame it hands out again for a new page,
//! whoever freed it, so no address space sees another's bytes; frames
//! never handed out, frames whose memory was given back to the system, and
//! frames cleared when they were freed are zero and are not cleared
//! again. Free frames are kept apart by that (`cache`): a new page takes
//! a zero one when its CPU has one, a frame about to be overwritten whole
//! (a copy-on-write copy, a file read: `alloc_uninit`) a dirty one. An
//! allocator [`with_zero_freed`](FrameAllocator::with_zero_freed) clears
//! the frames it frees, 32 at a time in its CPU's cache, so the clearing
//! leaves the fault path for munmap, `MADV_DONTNEED` and drops. A pool made without zeroing (to measure metadata
//! paths) hands frames out with whatever bytes their last user left: share
//! such a pool only between spaces that trust each other. Table pages are
//! always handed out zero.
//!
//! # How host memory is accounted
//!
//! The budget charges bytes in use: data frames, page-table pages (4 KiB
//! each, charged by their page table from creation until it unlinks
//! them) and metadata (VMAs, shared objects' nodes, from the heap). What
//! the host holds besides:
//!
//! - a physical memory of its own ([`FrameAllocator::new`]) numbers its
//!   frames below `budget / 4096`, so all its chunk memory together never
//!   passes the budget, whatever it is used for; the shared one numbers
//!   up to 1 TiB of frames, but hands out never-used frames only when no
//!   freed one is cached, so its chunk memory stays within what its
//!   allocators have in use at once plus the caches below;
//! - freed frames cached for reuse (dirty, or cleared when freed) stay
//!   resident, but only up to an eighth of the frames the live
//!   allocators' budgets allow, summed (plus at most 128 dirty and, with
//!   `zero_freed`, 1024 cleared per CPU cache):
//!   past that the oldest are given back to the system (`release`:
//!   `MADV_DONTNEED` on each run of consecutive frames), so cached frames
//!   cannot add to heap metadata charged in their place;
//! - per-frame fields: a reference count, the account number and the
//!   table fields, 32 bytes per 4 KiB frame (0.8%), for each chunk
//!   obtained;
//! - table pages unlinked but still waiting out a walker's grace period
//!   are uncharged already: they are frames, so they too count within the
//!   chunks' cap; a taker that finds every list dry asks the epoch to free
//!   them (`settle`) before it gives up.
//!
//! So the host holds at most the budgets in use, an eighth of them, the per-CPU
//! caches, the per-frame fields and what the heap keeps of freed metadata
//! (`tests/host_rss.rs` measures it). [`FrameAllocator::prefault`] is the
//! exception by request: it makes never-used frames resident up front.
//!
//! One mechanism per file: this file hands frames out and takes them back
//! (reference counts, charging); `account` keeps the budgets over one
//! memory and which frame is whose; `memory` is the physical memory;
//! `cache` keeps the free frames (per-CPU
//! caches, the global pool); `release` gives cached frames' memory back;
//! `table` makes frames page-table pages; `huge` hands out and takes
//! back huge frames (512 aligned frames for a transparent huge page);
//! `reassemble` rebuilds them from free 4 KiB frames; `chunk` obtains the memory
//! behind them; `contents` reads and writes it; `budget` charges it.
//!
//! # Lines an allocation and a free write
//!
//! The fault path allocates and frees, so neither may write a line other
//! CPUs write too (see [`crate::percpu`]). A data frame's `alloc`
//! writes: the budget's per-CPU slot (its stock, and in the same line
//! the account's frame count, which `used` sums), the CPU's frame cache
//! (its mutex, lists and the memory's counts: one line, and one slot),
//! and the frame's own words (its reference count and account record,
//! stored beside each other from one directory walk), and the frame's
//! 4 KiB when it clears a dirty one (lines the CPU that freed the frame
//! wrote last; none with a zero frame). `put` writes the same lines; with
//! `zero_freed`, every 32nd `put` also clears the 32 dirty frames in its
//! CPU's cache (their lines, written last by their users: the cost the
//! fault no longer pays), under that cache's lock. Shared lines are
//! written only in batches or off the common path:
//!
//! - the budget's shared count, once per 256 frames a CPU charges or
//!   gives back (`budget`'s stock);
//! - the global pool's mutex and lists, once per 32 freed frames moved
//!   to or from a CPU cache, or per 512 zero frames (given back to the
//!   system or cleared when freed) or chunk's remainder of never-used
//!   frames moved to one, or per 512 cleared frames a `zero_freed` CPU
//!   cache spills;
//! - a frame's words are shared with the CPU that last used the frame
//!   (8 counts and 16 records a line): a frame freed on another CPU than
//!   the one that took it moves its lines, as in Linux's `struct page`;
//! - the account registry's mutex and the owning budget's count, only
//!   for a frame freed through another account than the one it is
//!   charged to (`put_foreign`: an object's page dropped by a space);
//!   frames freed through their own account, the fault path's case,
//!   compare the record with the allocator's number and go on;
//! - the `releasing` lock and the `grow` lock, when the pool holds too
//!   many resident frames (every `2 * keep` spilled) or a chunk is
//!   obtained.
//! - every CPU slot's cache and the pool, when a huge allocation finds
//!   no huge frame free whole and rebuilds one from free 4 KiB frames
//!   (`reassemble`; not retried before 512 more frees after a failure).
//!
//! # Locking
//!
//! The frame allocator's locks come after the PTE locks in the crate's
//! [lock order](crate::mm#locking) (its level 5). Among themselves: the
//! `releasing` lock, then a CPU cache's mutex, then the global pool's, then
//! the chunk directory's `grow` lock; none of them is held while calling
//! out of this module (a dry taker's epoch flush runs with none held).
//! Reference counts, budget counts and frame words are atomics. Each field
//! says what protects it.

use crate::addr::PAGE_SIZE;
use crate::sync::counter;
use crate::sync::{Arc, Ordering};

mod account;
mod budget;
mod cache;
mod chunk;
mod contents;
mod huge;
mod memory;
mod reassemble;
mod release;
mod table;

pub use budget::Budget;
use cache::Use;
pub(crate) use huge::HUGE_FRAMES;
pub use memory::Phys;
#[cfg(not(aspace_loom))]
use memory::SHARED_PHYS_BYTES;
pub(crate) use table::TablePage;

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
///
/// Under loom each frame of a chunk is three loom objects (its count word
/// and two witnesses, see `chunk`), made with the chunk: 8 keeps a model
/// that touches a few frames cheap. A huge frame there spans 64 chunks,
/// which `huge` sets up a chunk's run at a time (`loom_tests/thp.rs`
/// allocates real ones in a pool of 6 MiB).
#[cfg(not(aspace_loom))]
const CHUNK_FRAMES: usize = 512;
#[cfg(aspace_loom)]
const CHUNK_FRAMES: usize = 8;

/// Bytes per chunk.
const CHUNK_BYTES: usize = CHUNK_FRAMES * PAGE_SIZE as usize;

/// Freed frames moved between a CPU cache and the global pool at once.
const BATCH: usize = 32;
/// A CPU cache spills a batch when it holds this many.
const CACHE_MAX: usize = 4 * BATCH;

const WORDS: usize = PAGE_SIZE as usize / 8;

/// The frame allocator: an account (a budget and the data frames charged
/// to it) over a physical memory, which several allocators and address
/// spaces may share (see the module docs and `account`).
pub struct FrameAllocator {
    /// The physical memory: frames, caches, reference counts.
    ///
    /// Protected by: immutable after creation (`Phys` says what protects
    /// each of its fields).
    phys: Arc<Phys>,
    /// This allocator's budget, which also counts the data frames charged
    /// to it (see `budget`).
    ///
    /// Protected by: immutable after creation (atomics inside).
    budget: Arc<Budget>,
    /// The account's number in `phys`'s registry, recorded in each data
    /// frame it charges.
    ///
    /// Protected by: immutable after creation.
    id: u32,
    /// Clear data frames when this allocator frees them, in batches,
    /// rather than when they are handed out again
    /// ([`with_zero_freed`](Self::with_zero_freed)).
    ///
    /// Protected by: immutable after creation.
    zero_freed: bool,
}

impl core::ops::Deref for FrameAllocator {
    type Target = Phys;

    #[inline]
    fn deref(&self) -> &Phys {
        &self.phys
    }
}

impl Drop for FrameAllocator {
    fn drop(&mut self) {
        self.phys.accounts.retire(self.id);
        // The caches of a shared memory may keep less resident now: give
        // back what is over (a memory of its own goes whole right after).
        if Arc::strong_count(&self.phys) > 1 {
            self.release();
        }
    }
}

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
    /// A physical memory of its own of at most `budget_bytes`, shared by
    /// its frames, the page tables and the metadata of the address spaces
    /// that use it, with one budget of `budget_bytes`. `zero_new` clears
    /// every frame handed out again (frames never used are zero already);
    /// it is what keeps address spaces sharing the pool from seeing each
    /// other's bytes. Objects and spaces on another physical memory cannot
    /// map its frames ([`AddressSpace::mmap_fd`](crate::AddressSpace::mmap_fd)
    /// fails with `EXDEV`); [`shared`](Self::shared) avoids that.
    pub fn new(budget_bytes: u64, zero_new: bool) -> Self {
        Self::over(Phys::new(budget_bytes, zero_new), budget_bytes)
    }

    /// An allocator with a budget of its own of `budget_bytes` over the
    /// process's shared physical memory (zeroing frames), which every
    /// allocator made this way shares: what
    /// [`AddressSpace::new`](crate::AddressSpace::new) and
    /// [`Memfd::new`](crate::Memfd::new)
    /// use, so that any object maps into any such space. Charges are
    /// per allocator: each data frame stays charged to the allocator that
    /// allocated it until it is freed, whoever maps it meanwhile (see
    /// [`crate::memfd`]'s `# Charging`). Budgets over 1 TiB get a
    /// physical memory of their own, as [`new`](Self::new).
    pub fn shared(budget_bytes: u64) -> Self {
        #[cfg(not(aspace_loom))]
        if budget_bytes <= SHARED_PHYS_BYTES {
            return Self::over(Phys::shared(), budget_bytes);
        }
        Self::new(budget_bytes, true)
    }

    /// A new account of `budget_bytes` over `phys`.
    fn over(phys: Arc<Phys>, budget_bytes: u64) -> Self {
        let budget = Arc::new(Budget::new(budget_bytes));
        let id = phys.accounts.register(budget.clone());
        FrameAllocator {
            phys,
            budget,
            id,
            zero_freed: false,
        }
    }

    /// This allocator, set to clear the data frames it frees (munmap,
    /// `MADV_DONTNEED`, a space's drop, a copy-on-write break's old
    /// frame) on the freeing thread, 32 at a time, and keep them apart as
    /// zero frames, so that faults needing a zero frame take one without
    /// clearing it (see `cache`). Frees cost the clearing instead: a
    /// choice for a space whose faults matter more than its unmaps. Has no
    /// effect on a memory that does not zero frames.
    pub fn with_zero_freed(mut self, on: bool) -> Self {
        self.zero_freed = on;
        self
    }

    /// True if this allocator clears the frames it frees
    /// ([`with_zero_freed`](Self::with_zero_freed)).
    pub fn zeroes_freed(&self) -> bool {
        self.zero_freed && self.zero_new
    }

    /// Another allocator over this one's physical memory, with a budget of
    /// its own of `budget_bytes`: objects charged to either map into
    /// spaces on the other (see [`crate::memfd`]'s `# Charging`).
    pub fn sibling(&self, budget_bytes: u64) -> FrameAllocator {
        Self::over(self.phys.clone(), budget_bytes)
    }

    /// True if this allocator's frames and `other`'s live in one physical
    /// memory, so that either's frames may be mapped by spaces on the
    /// other.
    pub fn shares_memory_with(&self, other: &FrameAllocator) -> bool {
        Arc::ptr_eq(&self.phys, &other.phys)
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
    /// frames; `None` when the budget is exhausted. A zero frame (cleared
    /// when freed, given back to the system, or never used) is taken if
    /// this CPU has one; else a dirty one is cleared here.
    pub(crate) fn alloc(&self) -> Option<Pfn> {
        let (pfn, used_before) = self.take_charged(self.zero_new)?;
        if self.zero_new && used_before {
            self.zero(pfn);
        }
        Some(pfn)
    }

    /// A frame with reference count 1 and unspecified contents (for a
    /// frame about to be overwritten whole): a dirty one if there is one,
    /// leaving zero frames to the faults that need them.
    pub(crate) fn alloc_uninit(&self) -> Option<Pfn> {
        self.take_charged(false).map(|(pfn, _)| pfn)
    }

    /// Charges and takes a frame, a zero one first if `zero`; says
    /// whether it may hold someone's bytes.
    fn take_charged(&self, zero: bool) -> Option<(Pfn, bool)> {
        let budget = &*self.budget;
        if !budget.try_charge(PAGE_SIZE) {
            return None;
        }
        let Some((pfn, used_before)) = self.take(Use::Data(budget), zero) else {
            budget.uncharge(PAGE_SIZE);
            return None;
        };
        self.use_exclusive(pfn);
        let (refs, owner) = self.frame_words(pfn);
        // Published to the last `put` by the reference count's release.
        owner.store(self.id, counter::Ordering::Relaxed);
        // A plain store: a free frame's count is 0 and nobody else changes
        // it (`try_get` adds only to a non-zero count), and unlike a swap
        // the store does not wait for the line.
        refs.store(1, Ordering::Relaxed);
        Some((pfn, used_before))
    }

    /// Adds a reference (another mapping shares the frame).
    pub(crate) fn get(&self, pfn: Pfn) {
        self.refs(pfn).fetch_add(1, Ordering::Relaxed);
    }

    /// Adds a reference unless the frame is free (its count is zero):
    /// for a holder of a frame number that may have been freed since it
    /// was read (a shared object's page being truncated), who re-checks
    /// where it read the number after this succeeds (Linux's
    /// `folio_try_get`). A frame freed and handed out again passes; the
    /// caller's re-check sees that it moved and puts the reference back.
    pub(crate) fn try_get(&self, pfn: Pfn) -> bool {
        self.refs(pfn)
            .fetch_update(Ordering::Acquire, Ordering::Acquire, |r| {
                (r != 0).then_some(r + 1)
            })
            .is_ok()
    }

    /// Drops a reference; frees the frame when it was the last. Returns
    /// true if the frame was freed.
    pub(crate) fn put(&self, pfn: Pfn) -> bool {
        let (refs, owner) = self.frame_words(pfn);
        if refs.fetch_sub(1, Ordering::AcqRel) != 1 {
            return false;
        }
        self.use_exclusive(pfn);
        // Free now; cleared here in a batch (`zero_freed`) or else by
        // whoever takes it next for a new page (see `alloc`). The charge
        // goes back to the account that took it.
        let owner = owner.load(counter::Ordering::Relaxed);
        if owner == self.id {
            self.budget.uncharge(PAGE_SIZE);
            self.give(pfn, Use::Data(&self.budget), self.zero_freed);
        } else {
            self.put_foreign(pfn, owner);
        }
        true
    }

    /// Frees a frame charged to account `owner`, another than this one.
    #[cold]
    fn put_foreign(&self, pfn: Pfn, owner: u32) {
        let Some(budget) = self.accounts.budget(owner) else {
            // No such account (a bug, asserted in debug builds): the frame
            // goes back uncounted rather than to the wrong account.
            self.give(pfn, Use::Table, self.zero_freed);
            return;
        };
        budget.uncharge(PAGE_SIZE);
        self.give(pfn, Use::Data(&budget), self.zero_freed);
        self.accounts.settle(owner, &budget);
    }

    /// The plain references of a frame: pins are not counted (see `chunk`).
    pub(crate) fn refcount(&self, pfn: Pfn) -> u32 {
        self.refs(pfn).load(Ordering::Acquire) as u32
    }

    /// Data frames charged to this allocator now, wherever they are
    /// mapped (page-table pages are counted by their page tables, and
    /// charged to the budget like data frames).
    pub fn used(&self) -> u64 {
        self.budget.frames()
    }

    /// Data frames in use in the whole physical memory, whichever
    /// allocator they are charged to.
    pub fn used_in_memory(&self) -> u64 {
        let (mut a, mut f) = (0u64, 0u64);
        for c in self.cpus.iter() {
            a += c.allocs.load(counter::Ordering::Relaxed);
            f += c.frees.load(counter::Ordering::Relaxed);
        }
        a.saturating_sub(f)
    }

    /// Frames the budget allows (were nothing else charged to it).
    pub fn budget(&self) -> u64 {
        (self.budget.limit() / PAGE_SIZE).min(self.frames)
    }

    /// Bytes of memory obtained from the system so far by the physical
    /// memory (shared with every allocator over it).
    pub fn reserved_bytes(&self) -> u64 {
        self.reserved.load(counter::Ordering::Relaxed)
    }
}

#[cfg(all(test, not(aspace_loom)))]
mod tests;
