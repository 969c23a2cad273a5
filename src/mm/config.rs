//! Layout, budget and locking mode of an address space.

use crate::addr::PAGE_SIZE;

/// How page faults synchronize with writers of the address space.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum FaultLocking {
    /// Lock only the faulting VMA (Linux 6.4+); fall back to the mmap_lock
    /// read side when that cannot finish.
    PerVma,
    /// Take the mmap_lock read side for every fault (the pre-2023 kernel),
    /// kept as the baseline every benchmark prints beside PerVma.
    MmapLock,
    /// Fault without writing the VMA at all: snapshot it under its lock
    /// stamp, install under the PTE-table lock only if the stamp is
    /// unchanged, and fall back to `PerVma` otherwise (see `spec_fault`).
    /// The default: in the pft example's tables it is faster than `PerVma`
    /// at one thread and at two in every workload with one VMA per region,
    /// and level with it at one thread in 256 KiB VMAs (`docs/RESULTS.md`).
    #[default]
    Speculative,
}

/// How writers of the address space (mmap, munmap, mprotect, ...) exclude
/// each other and the readers that take the mmap_lock read side.
///
/// Combines with any [`FaultLocking`] mode: the lock-free fault paths
/// validate VMA stamps the same way in both (see `mm/range_lock.rs`'s
/// module docs for the protocol).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum WriterLocking {
    /// Every writer takes the mmap_lock write side: one writer at a time
    /// (Linux). The default.
    #[default]
    MmapLock,
    /// munmap, mprotect, mmap (anonymous, without `MAP_LOCKED` or
    /// `MAP_GROWSDOWN`), madvise (its zaps shared; the advice that sets
    /// VMA flags, as mprotect), `set_anon_name`, an mremap that stays
    /// in place and brk lock only the range they change, widened to the
    /// VMAs they may split or merge with (and, for munmap, the hole whose
    /// page tables it may free), so writers on disjoint ranges run at
    /// once; every other writer, and every mmap_lock reader, takes the
    /// whole address space. Linux's results are kept (placement aside:
    /// two mmaps placed at once leave a page or two between them). Near
    /// [`Config::max_map_count`] (within 6,144 VMAs of it, or a quarter
    /// of the limit if less, plus 38 per CPU) every writer takes the
    /// whole space, so the limit holds exactly unless more than 1,024
    /// range writers (a 24th of the limit if less) are admitted short of
    /// it at once.
    /// Linux's placement puts concurrent threads' mappings side by side,
    /// so their writers meet; [`Config::placement_window`] keeps them
    /// apart. With windows, on 2 cores, full instantiation at 2 threads
    /// ran 1.45-1.73x its 1-thread rate (`docs/RESULTS.md`,
    /// "Instantiation" and "Issue 28's targets after the single-writer
    /// changes"). A thread alone in the space holds the lock's
    /// bias ([`Config::range_bias`]) and takes the whole space for each
    /// call instead: at 1 thread a writers-only loop runs at 0.91-0.97x
    /// `PerVma`'s rate, against 0.7x without the bias. Once a second
    /// thread calls, each 512 GiB slot has a bias of its own, and 2
    /// threads in windows of their own run writers-only at 1.3-1.45x the
    /// one-thread biased rate (`docs/RESULTS.md`, "The range lock's
    /// bias", "The bias's owner runs shared sections" and "Slot
    /// biases").
    Range,
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

/// When anonymous memory gets transparent huge pages, as
/// `/sys/kernel/mm/transparent_hugepage/enabled` says.
///
/// A fault gets a 2 MiB page only where its aligned 2 MiB span lies wholly
/// inside one private anonymous VMA, no page-table entry of the span is in
/// use yet, the VMA is not `VM_NOHUGEPAGE` and the space has not disabled
/// them ([`AddressSpace::set_thp_disable`](crate::AddressSpace::set_thp_disable)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum ThpMode {
    /// Every eligible VMA (`[always]`).
    Always,
    /// Only VMAs advised with `MADV_HUGEPAGE` (`[madvise]`: the default,
    /// as on most distributions' kernels).
    #[default]
    Madvise,
    /// None (`[never]`); `MADV_COLLAPSE` still collapses, as in Linux.
    Never,
}

/// Configuration of an [`AddressSpace`](crate::AddressSpace).
///
/// The defaults are Linux x86-64's with 4-level paging and no
/// randomization.
#[derive(Clone, Debug)]
pub struct Config {
    /// First address past user space (`TASK_SIZE`): at most 2^47, the
    /// user half that x86-64's 4-level paging addresses, as the page table
    /// has 4 levels (its walks refuse addresses past 2^48, so memory
    /// mapped there could never be touched).
    pub task_size: u64,
    /// Lowest address a mapping may use (`vm.mmap_min_addr`).
    pub mmap_min_addr: u64,
    /// Top of the top-down mmap area: placement searches below it.
    pub mmap_base: u64,
    /// Guard gap kept below growsdown (stack) mappings (`stack_guard_gap`).
    pub stack_guard_gap: u64,
    /// Maximum number of VMAs (`vm.max_map_count`): a call that would
    /// pass it fails with `ENOMEM`, changing nothing (see
    /// [`WriterLocking::Range`] for range writers near it).
    pub max_map_count: usize,
    /// Where the heap (brk area) starts, until
    /// [`AddressSpace::set_start_brk`](crate::AddressSpace::set_start_brk)
    /// moves it (exec does, to the page after the program's bss);
    /// [`AddressSpace::exec_reset`](crate::AddressSpace::exec_reset)
    /// returns to it.
    pub brk_start: u64,
    /// The budget of the allocator
    /// [`AddressSpace::new`](crate::AddressSpace::new) makes (over the
    /// process's shared physical memory, see
    /// [`FrameAllocator::shared`](crate::FrameAllocator::shared)): frames
    /// charged to the space (its private pages and copy-on-write copies,
    /// not the pages of objects it maps, which their own allocators pay
    /// for), page-table pages and VMA/object metadata together. A call
    /// that would pass it fails with ENOMEM, a fault with `OutOfMemory`.
    /// Spaces made with
    /// [`AddressSpace::with_pool`](crate::AddressSpace::with_pool) use
    /// their pool's budget instead.
    pub memory_budget: u64,
    /// Clear frames handed out again (turn off only to measure metadata
    /// paths; fresh frames are zero anyway). On, the default,
    /// [`AddressSpace::new`](crate::AddressSpace::new) uses the process's
    /// shared physical memory, which always clears them; off, it makes a
    /// physical memory of its own that does not (objects on the shared
    /// one then cannot be mapped into the space: `EXDEV`). A pool given to
    /// [`AddressSpace::with_pool`](crate::AddressSpace::with_pool) has its
    /// own switch ([`FrameAllocator::new`](crate::FrameAllocator::new)),
    /// which is what keeps the spaces on it from seeing each other's bytes.
    pub zero_pages: bool,
    /// Clear the space's data frames when they are freed (munmap,
    /// `MADV_DONTNEED`, copy-on-write breaks, the space's drop), 32 at a
    /// time on the freeing thread, rather than on the fault that takes
    /// them again: faults needing a zero page then take a cleared frame
    /// and the unmaps pay for the clearing
    /// ([`FrameAllocator::with_zero_freed`](crate::FrameAllocator::with_zero_freed)).
    /// Off by default, as Linux without `init_on_free`. Used by
    /// [`AddressSpace::new`](crate::AddressSpace::new) with `zero_pages`
    /// on; a pool given to
    /// [`AddressSpace::with_pool`](crate::AddressSpace::with_pool) has its
    /// own setting.
    pub zero_freed: bool,
    /// How faults lock.
    pub fault_locking: FaultLocking,
    /// How writers lock (default [`WriterLocking::MmapLock`]; with the
    /// `range-writers-default` feature, a testing aid that runs the
    /// existing tests in the other mode, [`WriterLocking::Range`]; with
    /// `range-unbiased-default`, that mode without its bias).
    pub writer_locking: WriterLocking,
    /// With [`WriterLocking::Range`]: the first thread to lock anything
    /// holds the whole space between and during its calls at the cost of
    /// two read-modify-writes of a line of its own per call, its writers
    /// skipping the neighbourhoods, until another thread locks anything; the bias then
    /// passes to that thread (after the first one's call ends), at most
    /// [`range_bias_handovers`](Config::range_bias_handovers) times, and
    /// is off for good after that. On by default (with the
    /// `range-unbiased-default` feature, a testing aid, off): a space
    /// changed by one thread at a time pays for the range lock only once
    /// another thread writes. After that, each 512 GiB slot has a bias of
    /// its own, passed and ended alike: a thread that keeps to slots no
    /// other thread touches (as with
    /// [`placement_window`](Config::placement_window)) takes the whole
    /// slot for each call there. See `docs/RESULTS.md`, "The range lock's
    /// bias" and "Slot biases".
    pub range_bias: bool,
    /// With [`range_bias`](Config::range_bias): whether the whole space
    /// has a bias first (default true). Off, the slots' biases hold from
    /// the start: a process that knows it will change its space from
    /// many threads at once skips the whole-space bias's hand-overs, and
    /// a single thread runs the slot owner's path (its VMA tree split in
    /// slots, its write sections its own), which is how
    /// `docs/RESULTS.md` measures that path at one thread
    /// (`examples/instantiate.rs --no-space-bias`). Off by default too
    /// with the `range-slots-default` feature, a testing aid that runs
    /// the existing tests on that path.
    pub range_space_bias: bool,
    /// How many times the range lock's bias (and each slot's) may pass
    /// from one thread to another before it is off for good (default 4;
    /// 0: the first other thread's request ends it). Each pass costs that thread a heavy
    /// fence (`membarrier`) and perhaps a wait for the owner's call.
    pub range_bias_handovers: u32,
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
    /// Use deferred-to-drop reclamation instead of epochs (leaks until the
    /// address space is dropped). Loom builds only, where epochs would
    /// explode the state space; ordinary builds have no such field, so it
    /// appears in no user's struct literal.
    #[cfg(aspace_loom)]
    #[doc(hidden)]
    pub deferred_reclaim: bool,
    /// Initial stack limit in bytes (`RLIMIT_STACK`'s soft limit; default
    /// 8 MiB, `u64::MAX` for unlimited): the largest size a growsdown VMA
    /// may grow to. Change it at run time with
    /// [`AddressSpace::set_stack_limit`](crate::AddressSpace::set_stack_limit).
    pub stack_limit: u64,
    /// Initial locked-memory limit in bytes (`RLIMIT_MEMLOCK`'s soft
    /// limit; default 8 MiB, Linux's default): what mlock, mlock2,
    /// mlockall, `MAP_LOCKED`, locked mremap growth and locked brk
    /// growth may lock in all. 0 refuses every lock (`EPERM`); `u64::MAX`
    /// is unlimited, as `RLIM_INFINITY` or a task with `CAP_IPC_LOCK`.
    /// Change it at run time with
    /// [`AddressSpace::set_memlock_limit`](crate::AddressSpace::set_memlock_limit).
    pub memlock_limit: u64,
    /// Whether `PROT_EXEC` alone makes memory execute-only: data loads of
    /// it fault (`EFAULT` for `read`, `AccessDenied` for a fault or a
    /// translator load), as Linux x86-64 does on CPUs with protection keys
    /// (`pku` and `ospke` in `/proc/cpuinfo`) by giving such mappings its
    /// execute-only key. Off (the default): any access implies read, as on
    /// CPUs without them. The mapping's key goes with its protection:
    /// mprotect to anything but `PROT_EXEC` removes it, and VMAs with and
    /// without it do not merge.
    pub exec_only_pkey: bool,
    /// Place mappings that transparent huge pages could back 2 MiB-aligned,
    /// as Linux 6.7+ built with `CONFIG_TRANSPARENT_HUGEPAGE` does
    /// whatever its THP mode: private anonymous memory with no hint and a
    /// length that is a multiple of 2 MiB (mmap and mremap moves), and host
    /// files on ext2/3/4 or XFS (see `mm/placement.rs`'s module docs for
    /// the exact rule, measured on Linux 6.18). On by default, the
    /// behaviour of the kernel this crate is compared with; off: the plain
    /// top-down fit of older kernels or kernels without THP.
    pub thp_placement: bool,
    /// Per-CPU placement windows: the size in bytes of each window (0, the
    /// default: off, Linux's placement). When non-zero, a placement that
    /// searches for room (mmap without a usable hint, a moving mremap)
    /// first searches top-down inside the calling thread's window: the
    /// window of per-CPU slot `k` is `[mmap_base - (k + 1) * size,
    /// mmap_base - k * size)`. Only when the window has no room (or lies
    /// partly below `mmap_min_addr`) does it search the whole area as
    /// Linux does. Threads on different CPUs thus place side by side only
    /// with themselves, and with
    /// [`WriterLocking::Range`] their writers' neighbourhoods do not meet
    /// (two reservations placed at once by Linux's top-down search are
    /// adjacent, and each writer's neighbourhood is the other's range).
    ///
    /// **This changes where mappings land compared with Linux**: a
    /// mapping made on CPU 1 lands `size` bytes below one made on CPU 0,
    /// not next to it; fewer adjacent VMAs merge; the windows of slots
    /// above 0 take address space below the usual top-down area (keep
    /// `nr_cpus * size` well clear of the heap, `brk_start`). Semantics
    /// tests and the kernel comparisons run with it off. Must be a
    /// multiple of the page size. With [`Config::range_bias`], windows
    /// apply only once a writer without the bias has run (until then the
    /// thread alone in the space places as Linux does).
    pub placement_window: u64,
    /// What a translator's atomic operation whose operand splits a 64-byte
    /// cache line or a page does: succeed ([`SplitLock::Warn`](crate::SplitLock::Warn), the
    /// default) or fail with `SIGBUS`/`BUS_ADRALN` ([`SplitLock::Fatal`](crate::SplitLock::Fatal)),
    /// as Linux's `split_lock_detect` boot parameter chooses.
    pub split_lock: crate::translate::SplitLock,
    /// When faults map transparent huge pages (default
    /// [`ThpMode::Madvise`]).
    pub thp: ThpMode,
    /// `khugepaged/max_ptes_none`: how many of a 2 MiB span's 512
    /// entries may be empty for a collapse to fill them (default 511, as
    /// Linux's).
    pub thp_max_ptes_none: u32,
    /// `khugepaged/max_ptes_shared`: how many of a 2 MiB span's pages may
    /// be shared with another mapping (a fork relative, copy-on-write)
    /// for [`khugepaged_scan`](crate::AddressSpace::khugepaged_scan) to
    /// collapse it (default 256, half of 512, as Linux's;
    /// `MADV_COLLAPSE` ignores it, as Linux's does).
    pub thp_max_ptes_shared: u32,
}

/// Linux x86-64 `TASK_SIZE` with 4-level paging.
pub const DEFAULT_TASK_SIZE: u64 = (1 << 47) - PAGE_SIZE;

/// The largest [`Config::task_size`]: the user half of x86-64's 4-level
/// paging, all a 4-level page table addresses as user space.
pub const MAX_TASK_SIZE: u64 = 1 << 47;

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
            zero_freed: false,
            fault_locking: FaultLocking::Speculative,
            writer_locking: if cfg!(feature = "range-writers-default") {
                WriterLocking::Range
            } else {
                WriterLocking::MmapLock
            },
            range_bias: !cfg!(feature = "range-unbiased-default"),
            range_space_bias: !cfg!(feature = "range-slots-default"),
            range_bias_handovers: super::range_bias::DEFAULT_HANDOVERS,
            mremap_extent: MremapExtent::Batched,
            shootdown_cost_ns: 0,
            #[cfg(aspace_loom)]
            deferred_reclaim: false,
            brk_fast_path: true,
            stack_limit: 8 << 20,
            memlock_limit: 8 << 20,
            exec_only_pkey: false,
            thp_placement: true,
            placement_window: 0,
            split_lock: crate::translate::SplitLock::Warn,
            thp: ThpMode::Madvise,
            thp_max_ptes_none: 511,
            thp_max_ptes_shared: 256,
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

/// Linux's `TASK_SIZE` for a 32-bit (compat) task on x86-64: 4 GiB less
/// two pages.
pub const X86_32_TASK_SIZE: u64 = 0xffff_e000;

/// Why a [`Config`] cannot make a working address space
/// ([`Config::validate`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConfigError {
    /// The field at fault.
    pub field: &'static str,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl core::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "invalid aspace Config: {} {}", self.field, self.reason)
    }
}

impl std::error::Error for ConfigError {}

impl Config {
    /// The layout of a 32-bit guest (an x86 compat task on x86-64): task
    /// size 4 GiB less two pages, the mmap area below it (less the
    /// 128 MiB stack gap), the heap at 0x0900_0000 above a classic ELF
    /// image at 0x0804_8000. The other fields are the defaults.
    pub fn x86_32() -> Self {
        Config {
            task_size: X86_32_TASK_SIZE,
            mmap_base: X86_32_TASK_SIZE - (128 << 20),
            brk_start: 0x0900_0000,
            ..Config::default()
        }
    }

    /// Checks that the layout is consistent: every address and size
    /// page-aligned, `mmap_min_addr < mmap_base <= task_size <= 2^47`, the
    /// heap start in `[mmap_min_addr, mmap_base)` (so that the heap can
    /// grow), a non-zero map count.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let err = |field, reason| Err(ConfigError { field, reason });
        let aligned = |v: u64| v % PAGE_SIZE == 0;
        // 4-level paging: the page table addresses 48 bits, and refuses
        // walks past them.
        if self.task_size == 0 || !aligned(self.task_size) || self.task_size > MAX_TASK_SIZE {
            return err(
                "task_size",
                "must be a non-zero multiple of the page size, at most 2^47",
            );
        }
        if !aligned(self.mmap_min_addr) || self.mmap_min_addr >= self.task_size {
            return err("mmap_min_addr", "must be page-aligned and below task_size");
        }
        if !aligned(self.mmap_base)
            || self.mmap_base <= self.mmap_min_addr
            || self.mmap_base > self.task_size
        {
            return err(
                "mmap_base",
                "must be page-aligned, above mmap_min_addr and at most task_size",
            );
        }
        if !aligned(self.brk_start)
            || self.brk_start < self.mmap_min_addr
            || self.brk_start >= self.mmap_base
        {
            return err(
                "brk_start",
                "must be page-aligned, at or above mmap_min_addr and below mmap_base \
                 (else the heap can never grow)",
            );
        }
        if !aligned(self.stack_guard_gap) || self.stack_guard_gap >= self.task_size {
            return err(
                "stack_guard_gap",
                "must be page-aligned and below task_size",
            );
        }
        if self.max_map_count == 0 {
            return err("max_map_count", "must be at least 1");
        }
        if !aligned(self.placement_window) {
            return err("placement_window", "must be a multiple of the page size");
        }
        Ok(())
    }
}
