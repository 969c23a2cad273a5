//! The kernel's pft, run by this process on the host kernel
//! (`aspace::workloads::pft` on `Kernel`): each thread
//! writes a word to every page of its share of a fresh
//! `MAP_PRIVATE | MAP_ANONYMOUS` mapping (will-it-scale's `page_fault1`),
//! so every store is a page fault that allocates and clears a frame. The
//! mapping is advised `MADV_NOHUGEPAGE` (4 KiB faults), or
//! `MADV_HUGEPAGE` and 2 MiB-aligned with `thp` (2 MiB faults where the
//! kernel has THP in `always` or `madvise` mode). Thread `i` is bound to
//! the `i`-th CPU, as pft's faulters are, and only the stores are timed:
//! from the first thread's start to the last one's end. Shared by
//! `examples/kernel_pft.rs` and `examples/pft.rs` (`--kernel`), which
//! includes it beside `pft_workload` so that both sides run in one
//! process, one after the other.
#![allow(dead_code)]

use super::pft_workload::{Sample, Workload};
use aspace::workloads::{pft, Kernel};

/// One run: `threads` threads fault `bytes_per_thread` each, laid out as
/// `workload` lays out pft's regions (one mapping sliced, one per thread,
/// or pages interleaved); `pin` binds the threads. Panics if the host
/// refuses the mapping.
pub fn run(
    threads: usize,
    workload: Workload,
    bytes_per_thread: u64,
    thp: bool,
    pin: bool,
) -> Sample {
    let p = pft::Params {
        threads,
        layout: workload,
        bytes_per_thread,
        huge: thp,
        pin,
    };
    // SAFETY: only the pft driver uses it, on the mappings it makes.
    let kernel = unsafe { Kernel::new() };
    let s = pft::run(&kernel, &p).unwrap_or_else(|e| panic!("the kernel's pft: {e}"));
    Sample {
        faults: s.faults,
        wall: s.wall,
        cpu: s.cpu,
        writer_ops: 0,
        per_vma: 0,
        speculative: 0,
        spec_aborts: 0,
        free_s: 0.0,
        thp: Default::default(),
    }
}

/// The host's `thp_fault_alloc` and `thp_fault_fallback` from
/// `/proc/vmstat` (system-wide counts: a run's are the difference, less
/// whatever else faulted huge pages meanwhile); zeros where unreadable.
pub fn host_thp_faults() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/vmstat").unwrap_or_default();
    let get = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(0)
    };
    (get("thp_fault_alloc"), get("thp_fault_fallback"))
}

/// Bytes per second of a run (for `thp`: GB/s of 2 MiB faults).
pub fn bytes_per_sec(s: &Sample) -> f64 {
    s.faults as f64 * aspace::PAGE_SIZE as f64 / s.wall
}
