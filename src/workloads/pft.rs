//! pft: the kernel's page-fault scaling test (will-it-scale's
//! `page_fault1`): each thread stores a word to every page of its share of
//! fresh private anonymous memory, so every store is a first-touch fault
//! that allocates and clears a frame. The memory is advised
//! `MADV_NOHUGEPAGE` (4 KiB faults), or 2 MiB-aligned and `MADV_HUGEPAGE`
//! with `huge` (2 MiB faults where the space maps them). Only the stores
//! are timed, from the first thread's start to the last one's end.
//!
//! This is the program `examples/kernel_pft.rs` and pft's `--kernel` run
//! on [`Kernel`](super::Kernel). On aspace it faults fresh frames through
//! a translator; pft's own aspace side (`benches/common/pft_workload.rs`:
//! frames used before, a concurrent writer, per-mode counters) sets the
//! space up with aspace's own calls.

use super::{timed_threads, Cpu, Space};
use crate::{Advice, MapFlags, Prot, PAGE_SIZE};
use std::io;

/// 2 MiB: the alignment and size of a huge page.
pub const HUGE: u64 = 2 << 20;

/// How the threads' memory is laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// One mapping; each thread faults its own slice.
    Single,
    /// One mapping per thread.
    PerThread,
    /// One mapping; thread `i` of `n` faults pages `i`, `i + n`, ...
    Interleaved,
}

impl Layout {
    /// The name used on the command line and in tables.
    pub fn name(self) -> &'static str {
        match self {
            Layout::Single => "single",
            Layout::PerThread => "per-thread",
            Layout::Interleaved => "interleaved",
        }
    }
}

/// One run.
#[derive(Clone, Copy, Debug)]
pub struct Params {
    /// Faulting threads.
    pub threads: usize,
    /// How their memory is laid out.
    pub layout: Layout,
    /// Memory each thread faults (rounded up to a page, or to 2 MiB with
    /// `huge`).
    pub bytes_per_thread: u64,
    /// 2 MiB-aligned `MADV_HUGEPAGE` memory, else `MADV_NOHUGEPAGE`.
    pub huge: bool,
    /// Bind thread `i` to the `i`-th CPU.
    pub pin: bool,
}

/// What a run measured.
#[derive(Clone, Debug)]
pub struct Sample {
    /// Pages faulted (first stores).
    pub faults: u64,
    /// Seconds from the first thread's start to the last one's end.
    pub wall: f64,
    /// Each thread's CPU seconds.
    pub cpu: Vec<f64>,
}

impl Sample {
    /// Faults per second of wall time.
    pub fn faults_per_sec(&self) -> f64 {
        self.faults as f64 / self.wall.max(1e-9)
    }

    /// pft's faults/cpu ([`faults_per_cpu`]).
    pub fn faults_per_cpu(&self) -> f64 {
        faults_per_cpu(self.faults, &self.cpu)
    }
}

/// pft's faults/cpu: `faults` shared evenly by the threads, per second of
/// each thread's CPU time (`cpu`), averaged over the threads.
pub fn faults_per_cpu(faults: u64, cpu: &[f64]) -> f64 {
    let n = cpu.len().max(1) as f64;
    let per_thread = faults as f64 / n;
    cpu.iter().map(|&c| per_thread / c.max(1e-9)).sum::<f64>() / n
}

/// A mapping of the run: where it was mapped, its length, and where its
/// faulted pages start (2 MiB-aligned with `huge`).
struct Region {
    map: u64,
    len: u64,
    base: u64,
}

/// Maps `len` bytes read-write and advises them; with `huge`, 2 MiB more
/// so that an aligned start fits.
fn region<S: Space>(space: &S, len: u64, huge: bool) -> io::Result<Region> {
    let map_len = if huge { len + HUGE } else { len };
    let flags = MapFlags::PRIVATE | MapFlags::ANONYMOUS;
    let map = space.mmap(map_len, Prot::READ | Prot::WRITE, flags)?;
    let (base, advice) = match huge {
        true => (map.next_multiple_of(HUGE), Advice::HugePage),
        false => (map, Advice::NoHugePage),
    };
    // A space without transparent huge pages may refuse the advice
    // (EINVAL), which changes nothing.
    let _ = space.madvise(map, map_len, advice);
    Ok(Region {
        map,
        len: map_len,
        base,
    })
}

/// One run of `p` on `space`: maps the memory, faults it in from
/// `p.threads` threads, unmaps it (even after an error), and returns what
/// the stores measured or the first error.
pub fn run<S: Space>(space: &S, p: &Params) -> io::Result<Sample> {
    let per = p
        .bytes_per_thread
        .next_multiple_of(if p.huge { HUGE } else { PAGE_SIZE });
    let pages = per / PAGE_SIZE;
    let sizes = match p.layout {
        Layout::PerThread => vec![per; p.threads],
        Layout::Single | Layout::Interleaved => vec![per * p.threads as u64],
    };
    let mut regions = Vec::new();
    let mut made = Ok(());
    for len in sizes {
        match region(space, len, p.huge) {
            Ok(r) => regions.push(r),
            Err(e) => {
                made = Err(e);
                break;
            }
        }
    }
    let stride = match p.layout {
        Layout::Interleaved => p.threads as u64 * PAGE_SIZE,
        Layout::Single | Layout::PerThread => PAGE_SIZE,
    };
    let start = |i: usize| match p.layout {
        Layout::PerThread => regions[i].base,
        Layout::Single => regions[0].base + i as u64 * per,
        Layout::Interleaved => regions[0].base + i as u64 * PAGE_SIZE,
    };
    let timed = made.and_then(|()| {
        timed_threads(
            space,
            p.threads,
            p.pin,
            |i, cpu| {
                let s = start(i);
                for pg in 0..pages {
                    // SAFETY: thread `i`'s pages of a read-write region
                    // mapped above, unmapped only after every thread ends.
                    unsafe { cpu.store(s + pg * stride, 1) }?;
                }
                Ok(pages)
            },
            || {},
        )
    });
    let mut unmapped = Ok(());
    for r in &regions {
        unmapped = unmapped.and(space.munmap(r.map, r.len));
    }
    let t = timed?;
    unmapped?;
    Ok(Sample {
        faults: t.count,
        wall: t.wall,
        cpu: t.cpu,
    })
}
