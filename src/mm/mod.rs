//! The address space: [`AddressSpace`] and one file per operation.
//!
//! # Locking
//!
//! Lock order, outermost first:
//!
//! 0. A [`Memfd`](crate::Memfd)'s size lock: a shrink holds its write
//!    side and takes only a file object's writeback lock and the object's
//!    mappings lock (after 4) and what comes after them, never an
//!    mmap_lock or a VMA lock.
//! 1. `mmap_lock` (`mmap_lock::MmapLock`) — writers (mmap, munmap,
//!    mprotect, mremap, brk) take it for write; the fault fallback path,
//!    madvise, `vmas()` and forced accesses (`forced.rs`, a page at a
//!    time) take it for read. With `WriterLocking::Range` its range lock
//!    (`range_lock`) comes first: munmap, mprotect and most mmaps lock
//!    only their neighbourhood; madvise's zaps, the fault fallback and
//!    forced accesses only their VMAs, shared (`range_read`); every other
//!    user the whole space.
//! 2. VMA write locks (`vma::lock::VmaLock`) — taken only by the
//!    mmap_lock writer, on every VMA it changes, before changing it. They
//!    are all released together when the writer drops the mmap_lock (the
//!    sequence advances; with range writers, each writer's own section
//!    stamps its VMAs back one by one as it ends, except the range
//!    lock's bias's owner, whose sections are shared ones: `vma::seq`).
//! 3. The tree's writer mutex (uncontended with one writer: only mmap_lock
//!    writers take it; range writers take it for each tree store only).
//!    With range writers the tree is a forest, one mutex per 512 GiB slot
//!    (`tree::RangeForest`): a store takes the mutex of each slot it
//!    changes, one at a time, never two at once. The owner of a slot's
//!    bias, which holds the whole slot, stores inside it without the
//!    slot's mutex: its hold is that tree's lock (`tree::InnerSlot`).
//! 4. An anon_vma family's lock (`vma::anon`, shared by every
//!    address space forked from one another): taken by writers that insert
//!    a VMA with an anon_vma, split one, move its start or merge across
//!    VMAs, by `fork`, by a fault that gives a VMA its anon_vma (under the
//!    mmap_lock read side, try-locked: with the VMA read lock on the
//!    per-VMA path, with the VMA's stamp validated on the speculative
//!    one) and by `rmap_walk` (under the mmap_lock read side).
//!    Never held while waiting for a VMA lock. Not taken when only a VMA's
//!    end moves (brk), unless `Config::brk_fast_path` is off.
//!
//!    Then a file object's writeback lock (`file`, `HostFile::io`):
//!    taken by writeback (msync after the mmap_lock is dropped, munmap
//!    under its write side as a shared mapping of the object goes, the
//!    object's drop) and by a size change under the size lock (0); under
//!    it only the object's dirty-page mutex (a leaf) and frame references.
//!
//!    Then a shared object's mappings lock (`vma::mappings`, Linux's
//!    `i_mmap_rwsem`): taken by writers that add, remove or resize a VMA
//!    mapping an object (inside the anon_vma lock when both are held), by
//!    mremap while it moves such a VMA's entries, and by a shrink, which
//!    then zaps under PTE locks and flushes. Faults never take it.
//! 5. PTE-page locks (inside `pt`), then the frame allocator's
//!    per-CPU locks. The slot locks of upper-level tables (and of the
//!    root slot), under which tables are linked and unlinked, are leaves:
//!    taken under PTE locks by mremap's relink and by walks that link a
//!    table, never holding another lock of their own.
//! 6. The TLB model's flush lock (inside `tlb`), taken by each flush,
//!    under PTE locks when mremap flushes per extent. Its holder waits only
//!    for user-mode accesses in flight, which take no lock.
//! 7. A userfault context's wait-queue lock (`uffd`), a leaf: taken by a
//!    fault queuing for a handler (under its VMA read lock or the
//!    mmap_lock read side) and by wakes (fills after their installs;
//!    unregister and munmap under the mmap_lock write side). A fault
//!    sleeps for its handler holding no other lock (it drops them and
//!    retries, Linux's `VM_FAULT_RETRY`), so munmap never waits for it.
//!
//! A page fault on the per-VMA path holds only a VMA *read* lock; it may
//! try-lock the mmap_lock (to give the VMA its anon_vma) but never blocks
//! on it, because an mmap_lock writer may be waiting for that VMA. A
//! speculative fault holds no lock but the PTE table's, and try-locks the
//! mmap_lock read side for the same first anon_vma.
//!
//! What protects what:
//! - `tree`: written under the mmap_lock write side (with range writers:
//!   by the holder of a range covering what it writes, each store under
//!   the writer mutex of each slot of the forest it changes, or under the
//!   hold of the whole slot by its bias's owner); read
//!   lock-free by anyone pinned to the epoch.
//! - `MmState` (map count, brk): inside the mmap_lock (range writers only
//!   read it, and change the map count, an atomic).
//! - each VMA's fields: the `vma` module's `# Locking` section, and the
//!   `Protected by:` line on each field of `Vma`.
//! - page-table entries: PTE-page locks for changes; lock-free walks;
//!   upper-level entries linked and unlinked under their table's slot
//!   lock; table pages are freed through the epoch and only where no VMA
//!   covers them (a speculative fault still walking there fails its stamp
//!   check).
//! - frames: freed only after the TLB flush that covers their last
//!   translation (`tlb`).

pub mod config;
pub mod flags;
pub(crate) mod mmap_lock;
pub(crate) mod range_bias;
pub(crate) mod range_lock;
pub(crate) mod range_read;

mod access;
pub(crate) mod anon_vma;
mod brk;
#[cfg(any(test, aspace_loom))]
mod check;
mod collapse;
mod cow;
pub(crate) mod edit;
mod exec;
pub(crate) mod fault;
mod forced;
mod fork;
mod inspect;
mod madvise;
mod map_count;
mod maps;
mod merge;
mod mlock;
mod mmap;
mod mprotect;
mod mremap;
mod munmap;
mod name;
pub mod pagemap;
mod placement;
mod populate;
mod rmap;
pub mod soft_dirty;
pub(crate) mod spec_fault;
pub(crate) mod stack;
pub(crate) mod thp;
mod vma_hint;

pub use config::{Config, ConfigError, FaultLocking, MremapExtent, ThpMode, WriterLocking};
pub use flags::{Access, Advice, MapFlags, MremapFlags, Prot};
pub use inspect::MsyncFlags;
pub use maps::VmaInfo;
pub use mlock::{MlockAllFlags, MlockFlags};
pub use name::ANON_NAME_MAX;
pub use pagemap::PagemapEntry;
pub use soft_dirty::ClearRefs;

use crate::lazy::{LazyArc, LazyWith};
pub use crate::phys::{Budget, FrameAllocator};
use crate::pt::PageTable;
use crate::reclaim::Reclaimer;
use crate::stats::{StatCounters, Stats};
use crate::sync::{Arc, AtomicU64};
use crate::tlb::TlbState;
use crate::tree::RangeForest;
use crate::vma::{VmaPool, VmaRef};
use map_count::MapCount;
pub(crate) use map_count::MapCounter;
use mmap_lock::MmapLock;

/// State protected by the mmap_lock.
pub(crate) struct MmState {
    /// Number of VMAs (`mm->map_count`).
    /// Protected by: changed by mmap_lock writers, through per-CPU counts
    /// because range-locked writers change it at once (see [`MapCount`]).
    pub(crate) map_count: MapCount,
    /// The initial stack pointer (`mm->start_stack`); 0 for none (see
    /// [`AddressSpace::set_start_stack`]).
    /// Protected by: the mmap_lock (written under its write side).
    pub(crate) start_stack: u64,
    /// Flags every new mapping and heap growth gets (`mm->def_flags`:
    /// `VM_LOCKED` after `mlockall(MCL_FUTURE)`); fork children start
    /// without them.
    /// Protected by: the mmap_lock (written under its write side).
    pub(crate) def_flags: crate::vma::VmFlags,
}

impl MmState {
    /// [`map_count`](Self::map_count)'s value.
    pub(crate) fn map_count(&self) -> usize {
        self.map_count.get()
    }

    /// True if the map count is at least `limit`.
    pub(crate) fn map_count_at_least(&self, limit: usize) -> bool {
        self.map_count.at_least(limit)
    }

    /// True if the map count is far enough below `limit` for a range
    /// writer (see [`MapCount::far_below`]).
    pub(crate) fn map_count_far_below(&self, limit: usize) -> bool {
        self.map_count.far_below(limit)
    }

    /// Adds `n` (may be negative) to the map count, in `to` (the part
    /// its writer counts in: [`MapCount`]).
    #[inline]
    pub(crate) fn add_map_count(&self, n: isize, to: MapCounter) {
        self.map_count.add(n, to);
    }
}

pub(crate) use crate::sync::counter::next_id;

/// A process-like virtual address space.
///
/// All methods take `&self`: the address space is `Send + Sync`, and any
/// number of threads may fault, read and write while others map, unmap and
/// protect. See the [module docs](self) for the locking design.
///
/// ```
/// use aspace::{AddressSpace, Config, Prot, MapFlags};
/// let mm = AddressSpace::new(Config::default());
/// let a = mm.mmap(0, 8192, Prot::READ | Prot::WRITE,
///                 MapFlags::PRIVATE | MapFlags::ANONYMOUS).unwrap();
/// mm.write(a + 4090, b"hello").unwrap();       // crosses a page boundary
/// let mut buf = [0u8; 5];
/// mm.read(a + 4090, &mut buf).unwrap();
/// assert_eq!(&buf, b"hello");
/// mm.munmap(a, 8192).unwrap();
/// assert_eq!(mm.frames_used(), 0);
/// ```
pub struct AddressSpace {
    // Field order is drop order: the tree (which points into the pool)
    // goes before the pool.
    /// The VMAs by address: one tree, or in `WriterLocking::Range` one
    /// per 512 GiB slot ([`RangeForest`]), so that range writers in
    /// different slots commit at once.
    /// Protected by: the mmap_lock write side (or, range writers, the
    /// range lock over what they change) for changes, through
    /// `edit::Edit`; read lock-free under the tree's epoch.
    pub(crate) tree: RangeForest<VmaRef>,
    /// The mmap_lock and the state it guards ([`MmState`]).
    /// Protected by: itself.
    pub(crate) mmap_lock: MmapLock<MmState>,
    /// The heap's start and break (see [`brk::Heap`] for what protects
    /// them).
    pub(crate) heap: brk::Heap,
    /// The page table.
    /// Protected by: PTE-table locks for entry changes; walked lock-free
    /// under its epoch; tables freed only where no VMA covers them, under
    /// the mmap_lock write side (see [`crate::pt`]'s docs in the source).
    /// Made on first use, behind an `Arc` that the mappings of shared
    /// objects share (a shrink zaps through it: `vma::Mappings`).
    pub(crate) pt: LazyWith<PageTable, (bool, Arc<FrameAllocator>)>,
    /// The physical memory frames come from (shared with fork relatives
    /// and with spaces made by `with_pool`).
    /// Protected by: immutable after creation (the allocator locks inside).
    pub(crate) frames: Arc<FrameAllocator>,
    /// Which CPUs may cache translations, and the flush protocol.
    /// Protected by: its own flush lock and per-CPU slots (`tlb`). Made on
    /// first use and shared like `pt`.
    pub(crate) tlb: LazyWith<TlbState, u64>,
    /// Event counters.
    /// Protected by: per-CPU relaxed atomics (statistics, no ordering).
    pub(crate) stats: StatCounters,
    /// Each CPU's last VMA of a speculative fault (`vma_hint`).
    /// Protected by: per-CPU atomics; a hint is validated by its user.
    pub(crate) vma_hints: vma_hint::VmaHints,
    /// Type-stable VMA objects: made by the first VMA, so an idle space
    /// has none. Fork children share their parent's (a reverse-map walk
    /// may reach a child's VMA objects through the parent's anon_vma
    /// families).
    /// Protected by: installed once (compare-and-swap, `LazyArc`), then
    /// immutable; the pool locks inside.
    pub(crate) pool: LazyArc<VmaPool>,
    /// Protected by: immutable after creation.
    pub(crate) cfg: Config,
    /// Protected by: immutable after creation.
    pub(crate) id: u64,
    /// `RLIMIT_STACK` (see [`AddressSpace::set_stack_limit`]).
    /// Protected by: a relaxed atomic; read once per stack growth.
    stack_limit: AtomicU64,
    /// `RLIMIT_MEMLOCK` (see [`AddressSpace::set_memlock_limit`]).
    /// Protected by: a relaxed atomic; read once per locking call.
    memlock_limit: AtomicU64,
    /// `PR_SET_THP_DISABLE` (see [`AddressSpace::set_thp_disable`]): 1
    /// when no fault maps a huge page.
    /// Protected by: a relaxed atomic; read by huge-page faults.
    thp_disabled: AtomicU64,
}

const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<AddressSpace>();
    const fn unwind_safe<T: std::panic::RefUnwindSafe + std::panic::UnwindSafe>() {}
    unwind_safe::<AddressSpace>();
};

// Unwind safety. The auto traits fail only because the locks inside
// (parking_lot's, which do not poison) and the atomic cells are interior
// mutability. A space seen again after a caught panic is consistent:
// - no public method calls back into caller code (no closures), so a
//   caller's panic falls between two calls, never inside an edit;
// - the one guard a caller holds across its own code, a `Translator`,
//   unregisters its slot when dropped by the unwinding, so flushes do not
//   wait for it (tested in tests/linux_surface.rs);
// - aspace's own code returns an errno for bad input instead of panicking
//   (tests/hostile.rs), and every lock guard it holds is released by the
//   unwinding of a panic that would be a bug.
impl std::panic::RefUnwindSafe for AddressSpace {}
impl std::panic::UnwindSafe for AddressSpace {}

impl AddressSpace {
    /// An empty address space with a budget of its own of
    /// `cfg.memory_budget` bytes over the process's shared physical memory
    /// ([`FrameAllocator::shared`]), so that any memory object made with
    /// [`Memfd::new`](crate::Memfd::new) maps into it and many spaces
    /// share one copy of an object's pages; with `cfg.zero_pages` off, a
    /// physical memory of its own that does not clear frames
    /// ([`FrameAllocator::new`]). The configuration is used as given; see
    /// [`try_new`](Self::try_new) to have it checked first.
    ///
    /// Creation allocates only its allocator (two allocations: the
    /// allocator and its budget, which also counts its frames; the frames
    /// come on first use). Everything else waits for its first use: per-CPU
    /// arrays, the root page table, the VMA pool and the tree's node cache
    /// (see `tests/creation.rs`). Range mode (`WriterLocking::Range`) also
    /// makes its range lock's shards and the VMA forest's slots, one of
    /// each per 512 GiB (about 96 KiB for a 47-bit space), which its
    /// writers read from the first.
    pub fn new(cfg: Config) -> AddressSpace {
        // The space owns its allocator, so it is made here: it is what
        // `frame_pool` returns and what forks share, and making it lazily
        // would put a check on every frame access.
        let frames = Arc::new(if cfg.zero_pages {
            FrameAllocator::shared(cfg.memory_budget).with_zero_freed(cfg.zero_freed)
        } else {
            FrameAllocator::new(cfg.memory_budget, false)
        });
        Self::with_parts(cfg, frames, None)
    }

    /// An empty address space whose frames, page tables and metadata come
    /// from `pool`, which other address spaces may share (as processes
    /// share one kernel's memory). The pool's budget and its zeroing
    /// switch apply; `cfg.memory_budget`, `cfg.zero_pages` and `cfg.zero_freed` are not used.
    ///
    /// ```
    /// use aspace::{AddressSpace, Config, FrameAllocator, MapFlags, Prot};
    /// use std::sync::Arc;
    /// let pool = Arc::new(FrameAllocator::new(64 << 20, true));
    /// let a = AddressSpace::with_pool(Config::default(), pool.clone());
    /// let b = AddressSpace::with_pool(Config::default(), pool.clone());
    /// let rw = Prot::READ | Prot::WRITE;
    /// let anon = MapFlags::PRIVATE | MapFlags::ANONYMOUS;
    /// a.write(a.mmap(0, 4096, rw, anon).unwrap(), b"a").unwrap();
    /// b.write(b.mmap(0, 4096, rw, anon).unwrap(), b"b").unwrap();
    /// assert_eq!(pool.used(), 2);
    /// ```
    ///
    /// Allocates nothing until first use (range mode: but its range lock
    /// and VMA forest, as [`new`](Self::new) says).
    pub fn with_pool(cfg: Config, pool: Arc<FrameAllocator>) -> AddressSpace {
        Self::with_parts(cfg, pool, None)
    }

    /// An empty address space, after [`Config::validate`] accepts the
    /// configuration.
    ///
    /// ```
    /// use aspace::{AddressSpace, Config};
    /// let bad = Config { brk_start: 1 << 60, ..Config::default() };
    /// let e = AddressSpace::try_new(bad).unwrap_err();
    /// assert_eq!(e.field, "brk_start");
    /// assert!(AddressSpace::try_new(Config::x86_32()).is_ok());
    /// ```
    pub fn try_new(cfg: Config) -> Result<AddressSpace, ConfigError> {
        cfg.validate()?;
        Ok(Self::new(cfg))
    }

    /// An empty space on `frames`, sharing `pool` if given (a fork
    /// child's) or making its own VMA pool on its first VMA.
    pub(crate) fn with_parts(
        cfg: Config,
        frames: Arc<FrameAllocator>,
        pool: Option<Arc<VmaPool>>,
    ) -> Self {
        // Deferred reclamation exists only for loom models (see `Config`).
        #[cfg(aspace_loom)]
        let deferred_reclaim = cfg.deferred_reclaim;
        #[cfg(not(aspace_loom))]
        let deferred_reclaim = false;
        let reclaimer = || {
            if deferred_reclaim {
                Reclaimer::deferred()
            } else {
                Reclaimer::epoch()
            }
        };
        let start_brk = cfg.brk_start;
        let stack_limit = cfg.stack_limit;
        let memlock_limit = cfg.memlock_limit;
        // Range writers: the tree a forest, the range lock sharded alike
        // (a root entry's span each), the map count per CPU.
        let ranged = cfg.writer_locking == WriterLocking::Range;
        let slot_shift = crate::pt::ROOT_ENTRY_SPAN.trailing_zeros();
        let ranges = ranged.then(|| {
            range_lock::RangeLock::with_biases(
                slot_shift,
                cfg.task_size,
                cfg.range_bias && cfg.range_space_bias,
                cfg.range_bias,
                cfg.range_bias_handovers,
            )
        });
        AddressSpace {
            // With the bias, unified until a writer other than its owner
            // comes (`Edit::begin`): the owner's writers and every lookup
            // then run on one tree.
            tree: if ranged && cfg.range_bias && cfg.range_space_bias {
                RangeForest::sliced_unified(slot_shift, cfg.task_size, reclaimer)
            } else if ranged {
                RangeForest::sliced(slot_shift, cfg.task_size, reclaimer)
            } else {
                RangeForest::single(reclaimer())
            },
            mmap_lock: MmapLock::with_ranges(
                MmState {
                    map_count: MapCount::new(ranges.as_ref().map(range_lock::RangeLock::slots)),
                    start_stack: 0,
                    def_flags: crate::vma::VmFlags::empty(),
                },
                ranges,
            ),
            heap: brk::Heap::new(start_brk),
            pt: LazyWith::new((deferred_reclaim, frames.clone()), |(deferred, frames)| {
                let r = if *deferred {
                    Reclaimer::deferred()
                } else {
                    Reclaimer::epoch()
                };
                PageTable::with_frames(r, frames.clone())
            }),
            frames,
            tlb: LazyWith::new(cfg.shootdown_cost_ns, |&ns| TlbState::new(ns)),
            stats: StatCounters::new(),
            vma_hints: vma_hint::VmaHints::new(),
            pool: pool.map_or_else(LazyArc::new, LazyArc::from_arc),
            cfg,
            id: next_id(),
            stack_limit: AtomicU64::new(stack_limit),
            memlock_limit: AtomicU64::new(memlock_limit),
            thp_disabled: AtomicU64::new(0),
        }
    }

    /// This space as the mappings of a shared object see it (its page
    /// table and TLB, made now if need be).
    pub(crate) fn mapper(&self) -> crate::vma::Mapper {
        crate::vma::Mapper {
            pt: self.pt.arc(),
            tlb: self.tlb.arc(),
        }
    }

    /// The configuration this address space was made with.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Event counters (faults by path, retries, TLB flushes, ...).
    pub fn stats(&self) -> Stats {
        let mut s = self.stats.snapshot();
        // Splits are counted where they happen, in the page table (a
        // 4 KiB change of a huge page splits it, whichever path made it).
        s.thp_split_pmd = self.pt.peek().map_or(0, PageTable::splits);
        s
    }

    /// Frames allocated now by this address space's allocator (shared with
    /// its fork children, and with every space made on the same pool).
    pub fn frames_used(&self) -> u64 {
        self.frames.used()
    }

    /// The physical memory this address space allocates from.
    pub fn frame_pool(&self) -> &Arc<FrameAllocator> {
        &self.frames
    }

    /// Bytes charged now to this address space's memory budget (shared
    /// like [`frames_used`](Self::frames_used)): frames in use, page-table
    /// pages and VMA metadata.
    pub fn memory_used(&self) -> u64 {
        self.frames.memory().used()
    }

    /// Obtains and touches the memory for `bytes` of frames now, so the
    /// faults that later use it do not pay the host kernel's own page
    /// faults (benchmarks call this before they measure).
    pub fn prefault_frames(&self, bytes: u64) {
        self.frames.prefault(bytes);
    }

    /// Bytes of page-table memory in use.
    pub fn page_table_bytes(&self) -> u64 {
        self.pt.table_bytes()
    }

    /// Number of VMAs.
    pub fn map_count(&self) -> usize {
        self.mmap_lock.read().map_count()
    }

    /// VMA objects allocated from the system by this address space's
    /// type-stable cache (recycled objects are not counted again).
    pub fn vma_objects(&self) -> usize {
        self.pool.peek().map_or(0, VmaPool::allocated)
    }

    /// Bytes of one VMA object (Linux's `vm_area_struct` is 192).
    pub const VMA_OBJECT_BYTES: usize = core::mem::size_of::<crate::vma::Vma>();

    /// Bytes of metadata per VMA now: the VMA object plus its share of the
    /// tree's nodes.
    pub fn metadata_bytes_per_vma(&self) -> usize {
        let n = self.tree.len().max(1);
        Self::VMA_OBJECT_BYTES + self.tree.memory_bytes() / n
    }
}

impl core::fmt::Debug for AddressSpace {
    /// A summary: identity, VMA count, resident frames, break, and the
    /// configuration.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let (map_count, brk) = {
            let st = self.mmap_lock.read();
            (st.map_count(), self.heap.brk())
        };
        f.debug_struct("AddressSpace")
            .field("id", &self.id)
            .field("map_count", &map_count)
            .field("frames_used", &self.frames_used())
            .field("brk", &format_args!("{brk:#x}"))
            .field("stack_limit", &self.stack_limit())
            .field("memlock_limit", &self.memlock_limit())
            .field("config", &self.cfg)
            .finish()
    }
}
