//! Layout, budget and locking mode of an address space.

use crate::addr::PAGE_SIZE;

/// How page faults synchronize with writers of the address space.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum FaultLocking {
    /// Lock only the faulting VMA (Linux 6.4+); fall back to the mmap_lock
    /// read side when that cannot finish.
    #[default]
    PerVma,
    /// Take the mmap_lock read side for every fault (the pre-2023 kernel),
    /// kept as the baseline every benchmark prints beside PerVma.
    MmapLock,
    /// Fault without writing the VMA at all: snapshot it under its lock
    /// stamp, install under the PTE-table lock only if the stamp is
    /// unchanged, and fall back to `PerVma` otherwise (see `spec_fault`).
    Speculative,
}

/// How mremap moves page-table entries and when it flushes the TLB.
///
/// Entries always move in extents bounded by the next PMD (2 MiB) boundary
/// of both the source and the destination; a mode may bound them further
/// and decides how many flushes the move costs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum MremapExtent {
    /// Extents of at most this many pages, one flush after each extent
    /// that moved a present entry (Linux before 4.18: `LATENCY_LIMIT` of
    /// 64 pages). `Pages(0)` is treated as `Pages(1)`.
    Pages(u64),
    /// Extents bounded by PMD boundaries only, one flush per extent that
    /// moved a present entry (Linux 4.18+); whole, PMD-aligned extents
    /// move by relinking their PTE table.
    Pmd,
    /// PMD-bounded extents as [`Pmd`](MremapExtent::Pmd), but one flush
    /// covers the whole call, issued before any frame can be freed and
    /// before the old range can be reused.
    #[default]
    Batched,
}

/// Configuration of an [`AddressSpace`](crate::AddressSpace).
///
/// The defaults are Linux x86-64's with 4-level paging and no
/// randomization.
#[derive(Clone, Debug)]
pub struct Config {
    /// First address past user space (`TASK_SIZE`).
    pub task_size: u64,
    /// Lowest address a mapping may use (`vm.mmap_min_addr`).
    pub mmap_min_addr: u64,
    /// Top of the top-down mmap area: placement searches below it.
    pub mmap_base: u64,
    /// Guard gap kept below growsdown (stack) mappings (`stack_guard_gap`).
    pub stack_guard_gap: u64,
    /// Maximum number of VMAs (`vm.max_map_count`).
    pub max_map_count: usize,
    /// Where the heap (brk area) starts.
    pub brk_start: u64,
    /// Bytes of real memory the frames may use.
    pub memory_budget: u64,
    /// Clear new anonymous frames (turn off only to measure metadata paths).
    pub zero_pages: bool,
    /// How faults lock.
    pub fault_locking: FaultLocking,
    /// How mremap moves page-table entries and batches TLB flushes.
    pub mremap_extent: MremapExtent,
    /// Simulated cost of one TLB shootdown, in nanoseconds: a flush spins
    /// this long for every other CPU of the address space (0 = off, the
    /// default). Lets a benchmark show the weight of shootdowns.
    pub shootdown_cost_ns: u64,
    /// Skip the anon_vma lock when an adjustment moves only a VMA's end
    /// with nothing inserted (brk growing or shrinking the heap): Linux's
    /// 2009 vma_adjust fast path. `false` takes the lock for every
    /// adjustment of a VMA with an anon_vma, as Linux since 2012.
    pub brk_fast_path: bool,
    /// Use deferred-to-drop reclamation instead of epochs (loom models only;
    /// leaks until the address space is dropped).
    #[doc(hidden)]
    pub deferred_reclaim: bool,
}

/// Linux x86-64 `TASK_SIZE` with 4-level paging.
pub const DEFAULT_TASK_SIZE: u64 = (1 << 47) - PAGE_SIZE;

impl Default for Config {
    fn default() -> Self {
        Config {
            task_size: DEFAULT_TASK_SIZE,
            mmap_min_addr: 65536,
            // TASK_SIZE minus the minimum stack gap (128 MiB), as Linux
            // computes mmap_base without randomization.
            mmap_base: DEFAULT_TASK_SIZE - (128 << 20),
            stack_guard_gap: 256 * PAGE_SIZE,
            max_map_count: 65530,
            brk_start: 0x5555_5600_0000,
            memory_budget: 4 << 30,
            zero_pages: true,
            fault_locking: FaultLocking::PerVma,
            mremap_extent: MremapExtent::Batched,
            shootdown_cost_ns: 0,
            deferred_reclaim: false,
            brk_fast_path: true,
        }
    }
}

impl Config {
    /// The default layout with a given fault locking mode.
    pub fn with_locking(fault_locking: FaultLocking) -> Self {
        Config {
            fault_locking,
            ..Config::default()
        }
    }
}
