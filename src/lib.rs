//! # aspace
//!
//! A process-like virtual address space in user space, built with the
//! concurrency design Linux reached between 2022 and 2025:
//!
//! - an RCU-readable B-tree of ranges ([`tree`]) that readers walk without
//!   locks under epoch reclamation, with gap tracking for free-area search;
//! - a reference-count lock inside every VMA and a sequence-counted
//!   `mmap_lock` whose write-unlock releases every VMA write lock at once;
//! - a simulated 4-level page table with real 4 KiB frames;
//! - a page-fault path that locks only the faulting VMA.
//!
//! See `README.md` for the commands, `docs/RESULTS.md` for the measured
//! results, and `docs/ARCHITECTURE.md` in the repository for the map of
//! the code: one line per file, how a fault and an mmap flow, each
//! protocol and the model that checks it, and the lock order.
//!
//! # Example
//!
//! A space of its own, a mapping, a store through the page-fault path, a
//! guest-style access through a soft TLB, and the maps line Linux would
//! print:
//!
//! ```
//! use std::sync::Arc;
//! use aspace::{AddressSpace, Config, MapFlags, Prot, Translator};
//!
//! let mm = Arc::new(AddressSpace::new(Config::default()));
//! let a = mm.mmap(0, 1 << 20, Prot::READ | Prot::WRITE,
//!                 MapFlags::PRIVATE | MapFlags::ANONYMOUS)?;
//! mm.write(a, b"hello")?;                  // faults the page in
//! let mut cpu = Translator::new_owned(mm.clone()); // 'static, Send
//! assert_eq!(cpu.load::<u8>(a)?, b'h');    // walks once, then hits
//! cpu.store::<u32>(a + 8, 7)?;
//! mm.mprotect(a, 4096, Prot::READ)?;       // flushes every translator
//! let f = cpu.store::<u32>(a + 8, 0).unwrap_err();
//! assert_eq!(f.addr, a + 8);               // si_addr, with si_code
//! assert_eq!(mm.vmas().len(), 2);          // the mprotect split the VMA
//! print!("{}", mm.maps());                 // /proc/pid/maps format
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Feature `workloads` (off by default) adds the module `workloads`: the
//! benchmarks' instantiation workload behind a small trait, implemented
//! for [`AddressSpace`] in every mode and for the running kernel, to run
//! against a design of your own.

#![warn(missing_docs)]

pub mod addr;
pub mod error;
pub mod exec;
pub mod file;
mod lazy;
pub mod memfd;
pub mod mm;
mod percpu;
mod phys;
mod pt;
pub mod reclaim;
pub mod stats;
mod sync;
mod tlb;
pub mod translate;
pub mod tree;
pub mod uffd;
mod vma;
pub mod vmap;
// Feature `workloads`; not in loom builds.
#[cfg(all(feature = "workloads", not(aspace_loom)))]
pub mod workloads;

pub use addr::{Range, PAGE_SIZE};
pub use error::{Error, FaultError, MemoryFault, Result};
pub use file::{FileStats, MappedFile};
pub use memfd::{Memfd, MemfdFlags};
pub use mm::{
    Access, AddressSpace, Advice, Budget, Config, ConfigError, FaultLocking, FrameAllocator,
    MapFlags, MlockAllFlags, MlockFlags, MremapExtent, MremapFlags, MsyncFlags, Prot, ThpMode,
    VmaInfo, WriterLocking,
};
pub use mm::{ClearRefs, PagemapEntry};
pub use phys::Pfn;
pub use stats::Stats;
#[cfg(feature = "vm-memory")]
pub use translate::guest::GuestView;
pub use translate::{Block, Scalar, SplitLock, Translator};
pub use uffd::{Uffd, UffdBuilder};
pub use vma::{RmapHit, VmFlags};

/// The internals that the loom models in `loom_tests/` drive directly (the
/// page table, the per-VMA lock, the mmap_lock, objects made on first
/// use, the VMA pool, one speculative fault attempt): loom builds only,
/// not API.
#[cfg(aspace_loom)]
#[doc(hidden)]
pub mod loom_door {
    pub use crate::lazy::LazyArc;
    pub use crate::mm::mmap_lock::MmapLock;
    pub use crate::percpu::PerCpu;
    pub use crate::pt::{PageTable, Pte, PteFlags};
    pub use crate::vma::lock::{ReadLockError, VmaLock};

    /// One speculative fault attempt alone (`spec_fault::handle`, without
    /// the per-VMA and mmap_lock fallbacks): true if it completed the
    /// fault, false if it aborted and changed nothing.
    pub fn speculative_fault(mm: &crate::AddressSpace, addr: u64, access: crate::Access) -> bool {
        crate::mm::spec_fault::handle(mm, addr, access).is_ok()
    }

    /// Makes the VMA covering `addr` (found in the tree) the calling
    /// CPU's VMA hint, with the VMAs after it in its tree leaf as the
    /// hint's look-ahead, as a speculative fault's tree walk does; false
    /// if no VMA covers `addr`.
    pub fn set_vma_hint(mm: &crate::AddressSpace, addr: u64) -> bool {
        let g = mm.tree.pin();
        let Some(around) = mm.tree.find_around(addr, &g) else {
            return false;
        };
        mm.vma_hints.set(&around);
        true
    }

    /// A VMA pool alone (`vma/pool.rs`), driven through CPU slots the
    /// caller names (a thread "moves" by naming another), for the model of
    /// its per-CPU caches.
    #[derive(Default)]
    pub struct VmaPool(crate::vma::VmaPool);

    /// An object a [`VmaPool`] handed out.
    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    pub struct VmaObj(crate::vma::VmaRef);

    impl VmaPool {
        /// An empty pool.
        pub fn new() -> Self {
            Self::default()
        }

        /// An object through CPU slot `cpu`, and whether it was recycled.
        pub fn alloc_on(&self, cpu: usize) -> (VmaObj, bool) {
            let (v, reused) = self.0.alloc_on(cpu);
            (VmaObj(v), reused)
        }

        /// Gives `v` back through CPU slot `cpu`.
        pub fn free_on(&self, cpu: usize, v: VmaObj) {
            self.0.free_on(cpu, v.0)
        }

        /// Objects made so far.
        pub fn allocated(&self) -> usize {
            self.0.allocated()
        }

        /// Every object made is free exactly once or in `held`, and every
        /// CPU cache is within its bound (`Err`: what is wrong). Call it
        /// with no allocation or free running.
        pub fn check(&self, held: &[VmaObj]) -> Result<(), String> {
            let held: Vec<_> = held.iter().map(|o| o.0).collect();
            self.0.check(&held)
        }
    }

    /// Every present page-table entry of `mm` lies in a VMA, is writable
    /// only where the VMA is, and a private anonymous frame only where
    /// the VMA has an anon_vma (`Err`: the first violation). Call it with
    /// no writer of `mm` running.
    pub fn check_ptes(mm: &crate::AddressSpace) -> Result<(), String> {
        mm.check_ptes()
    }
}

/// The README's examples run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
