//! The kernel's pft, run by this process on the host kernel: each thread
//! writes one byte to every page of its share of a fresh
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

use super::pft_workload::{thread_cpu_time, Sample, Workload};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Instant;

/// 2 MiB: the alignment a `thp` mapping gets.
pub const HUGE: usize = 2 << 20;
const PAGE: usize = 4096;

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
    let per = (bytes_per_thread as usize).next_multiple_of(if thp { HUGE } else { PAGE });
    let pages = per / PAGE;
    // (mapping base, its length) of each mapping, and each thread's start.
    let (maps, starts): (Vec<Region>, Vec<usize>) = match workload {
        Workload::PerThread => {
            let maps: Vec<Region> = (0..threads).map(|_| Region::new(per, thp)).collect();
            let starts = maps.iter().map(|m| m.base).collect();
            (maps, starts)
        }
        Workload::Single | Workload::Interleaved => {
            let m = Region::new(per * threads, thp);
            let step = if workload == Workload::Single {
                per
            } else {
                PAGE
            };
            let starts = (0..threads).map(|t| m.base + t * step).collect();
            (vec![m], starts)
        }
    };
    let stride = if workload == Workload::Interleaved {
        threads * PAGE
    } else {
        PAGE
    };
    let go = Arc::new(Barrier::new(threads));
    let spans = Arc::new(Mutex::new(Vec::new()));
    let handles: Vec<_> = starts
        .into_iter()
        .enumerate()
        .map(|(i, start)| {
            let (go, spans) = (go.clone(), spans.clone());
            std::thread::spawn(move || {
                if pin {
                    crate::machine::pin_to_cpu(i);
                }
                go.wait();
                let c0 = thread_cpu_time();
                let t0 = Instant::now();
                for pg in 0..pages {
                    let p = (start + pg * stride) as *mut u8;
                    // SAFETY: `p` is inside a live private anonymous
                    // read-write mapping of ours (`maps`, unmapped only
                    // after every thread is joined); no Rust reference
                    // points into it, and each thread writes its own pages.
                    unsafe { p.write_volatile(1) };
                }
                let t1 = Instant::now();
                let cpu = thread_cpu_time() - c0;
                spans.lock().expect("spans").push((t0, t1, cpu));
            })
        })
        .collect();
    for h in handles {
        h.join().expect("kernel pft thread");
    }
    drop(maps);
    let spans = spans.lock().expect("spans");
    let first = spans.iter().map(|s| s.0).min().expect("threads");
    let last = spans.iter().map(|s| s.1).max().expect("threads");
    Sample {
        faults: (pages * threads) as u64,
        wall: (last - first).as_secs_f64(),
        cpu: spans.iter().map(|s| s.2).collect(),
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
    s.faults as f64 * PAGE as f64 / s.wall
}

/// A fresh private anonymous mapping, unmapped on drop.
struct Region {
    /// Where the threads' pages start (2 MiB-aligned with `thp`).
    base: usize,
    /// What was mapped: `map..map + len`.
    map: usize,
    len: usize,
}

impl Region {
    fn new(len: usize, thp: bool) -> Region {
        // With `thp`, 2 MiB more, so that an aligned start fits.
        let map_len = if thp { len + HUGE } else { len };
        // SAFETY: a new private anonymous mapping at an address the
        // kernel chooses: it overlaps nothing of ours.
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert!(p != libc::MAP_FAILED, "mmap of {map_len} bytes failed");
        let map = p as usize;
        let base = if thp { map.next_multiple_of(HUGE) } else { map };
        let advice = if thp {
            libc::MADV_HUGEPAGE
        } else {
            libc::MADV_NOHUGEPAGE
        };
        // SAFETY: advice on our own mapping's whole range; a kernel
        // without THP refuses it (EINVAL), which changes nothing.
        unsafe { libc::madvise(p, map_len, advice) };
        Region {
            base,
            map,
            len: map_len,
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping `new` made; the threads that wrote
        // to it are joined.
        unsafe { libc::munmap(self.map as *mut libc::c_void, self.len) };
    }
}
