//! The instantiation workload: a wasm runtime instantiating instances in
//! every thread at once (Wasmtime #5243's shape, issue 28).
//!
//! An instance reserves [`RESERVE`] bytes of linear memory plus a
//! [`GUARD`] region in one `PROT_NONE | MAP_NORESERVE` mapping placed by
//! the space (no hint), makes its first [`HEAP`] read-write with
//! mprotect, and then, [`ROUNDS`] times, stores a word to [`PAGES`] pages
//! of it and resets them with `MADV_DONTNEED` (a pooled instance being
//! reused); it ends with munmap. [`Kind::WritersOnly`] keeps only the
//! mmap, mprotect and munmap: the writers alone, each thread on its own
//! disjoint range. Every call is a writer of the space but the stores
//! (faults) and the DONTNEEDs, so the mmap_lock write side is where the
//! threads meet.
//!
//! [`run`] starts the threads (bound to CPUs with `pin`), makes each its
//! [`Cpu`] before a barrier, and times from the first
//! thread's start to the last one's end.

use super::{timed_threads, Cpu, Space};
use crate::{Advice, MapFlags, Prot, PAGE_SIZE};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// An instance's linear memory: 4 GiB, as a 32-bit wasm memory.
pub const RESERVE: u64 = 4 << 30;
/// The guard region after it (Wasmtime's default 2 GiB guard), in the
/// same mapping.
pub const GUARD: u64 = 2 << 30;
/// The part made read-write: 1 MiB.
pub const HEAP: u64 = 1 << 20;
/// Pages of the heap each round stores to: every 16th of its 256.
pub const PAGES: u64 = 16;
/// Rounds of stores and `MADV_DONTNEED` per instance.
pub const ROUNDS: u64 = 3;

/// What an instance does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Reserve, mprotect, [`ROUNDS`] of stores and `MADV_DONTNEED`,
    /// munmap.
    Instances,
    /// Reserve, mprotect, munmap: the writers alone, no stores.
    WritersOnly,
}

impl Kind {
    /// The name tables print.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Instances => "instances",
            Kind::WritersOnly => "writers-only",
        }
    }
}

/// How long each thread runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Until {
    /// This many instances per thread.
    Instances(u64),
    /// About this many seconds (the threads stop at the next instance's
    /// start after it).
    Seconds(f64),
}

/// One run.
#[derive(Clone, Copy, Debug)]
pub struct Params {
    /// Threads instantiating at once.
    pub threads: usize,
    /// What an instance does.
    pub kind: Kind,
    /// How long each thread runs.
    pub until: Until,
    /// Load every stored word back before the `MADV_DONTNEED` and check
    /// it reads zero after (a correctness run; off when timing).
    pub check: bool,
    /// Bind thread `i` to the `i`-th CPU.
    pub pin: bool,
}

/// What a run measured.
#[derive(Clone, Debug)]
pub struct Sample {
    /// Instances completed by all threads.
    pub instances: u64,
    /// Seconds from the first thread's start to the last one's end.
    pub wall: f64,
    /// Each thread's CPU seconds.
    pub cpu: Vec<f64>,
}

impl Sample {
    /// Instances per second of wall time, all threads together.
    pub fn per_sec(&self) -> f64 {
        self.instances as f64 / self.wall.max(1e-9)
    }

    /// Instances per CPU-second of the threads (steadier than
    /// [`per_sec`](Sample::per_sec) on a loaded machine, blind to waits).
    pub fn per_cpu_sec(&self) -> f64 {
        self.instances as f64 / self.cpu.iter().sum::<f64>().max(1e-9)
    }
}

/// The word round `round` stores to page `pg` of thread `seed`'s
/// instance: never zero, different per thread, round and page.
fn pattern(seed: u64, round: u64, pg: u64) -> u64 {
    (1 << 63) | seed << 32 | round << 16 | pg
}

/// The address of stored page `pg` of the heap at `base`.
fn page(base: u64, pg: u64) -> u64 {
    base + pg * (HEAP / PAGE_SIZE / PAGES) * PAGE_SIZE
}

/// One instance's life on `space` through `cpu` (see the module docs);
/// `seed` tells threads' patterns apart. With `check`, a word that does
/// not read back as stored, or not zero after `MADV_DONTNEED`, is an
/// error (`ErrorKind::Other`, saying where). The reservation is unmapped
/// even when a step fails.
pub fn instance<'a, S: Space>(
    space: &'a S,
    cpu: &mut S::Cpu<'a>,
    kind: Kind,
    check: bool,
    seed: u64,
) -> io::Result<()> {
    let len = RESERVE + GUARD;
    let flags = MapFlags::PRIVATE | MapFlags::ANONYMOUS | MapFlags::NORESERVE;
    let base = space.mmap(len, Prot::NONE, flags)?;
    let body = (|| {
        space.mprotect(base, HEAP, Prot::READ | Prot::WRITE)?;
        if kind == Kind::WritersOnly {
            return Ok(());
        }
        for round in 0..ROUNDS {
            for pg in 0..PAGES {
                // SAFETY: inside the heap made read-write above, mapped
                // until the munmap below.
                unsafe { cpu.store(page(base, pg), pattern(seed, round, pg)) }?;
            }
            if check {
                expect(cpu, base, |pg| pattern(seed, round, pg), "its store")?;
            }
            space.madvise(base, HEAP, Advice::DontNeed)?;
            if check {
                expect(cpu, base, |_| 0, "MADV_DONTNEED")?;
            }
        }
        Ok(())
    })();
    let unmapped = space.munmap(base, len);
    body.and(unmapped)
}

/// Checks that every stored page of the heap at `base` reads `want(pg)`.
fn expect<C: Cpu>(
    cpu: &mut C,
    base: u64,
    want: impl Fn(u64) -> u64,
    after: &str,
) -> io::Result<()> {
    for pg in 0..PAGES {
        let a = page(base, pg);
        // SAFETY: as for the stores: the caller's heap is mapped
        // read-write.
        let got = unsafe { cpu.load(a) }?;
        if got != want(pg) {
            return Err(io::Error::other(format!(
                "{a:#x} read {got:#x} after {after}, expected {:#x}",
                want(pg)
            )));
        }
    }
    Ok(())
}

/// Runs `p.threads` threads instantiating on `space` (each made its
/// [`Cpu`] before the clock starts) and returns what they did, or the
/// first error a thread met.
pub fn run<S: Space>(space: &S, p: &Params) -> io::Result<Sample> {
    let stop = AtomicBool::new(false);
    let t = timed_threads(
        space,
        p.threads,
        p.pin,
        |i, cpu| {
            let mut n = 0;
            while !match p.until {
                Until::Instances(k) => n >= k,
                Until::Seconds(_) => stop.load(Ordering::Relaxed),
            } {
                instance(space, cpu, p.kind, p.check, i as u64)?;
                n += 1;
            }
            Ok(n)
        },
        || {
            if let Until::Seconds(s) = p.until {
                std::thread::sleep(Duration::from_secs_f64(s.max(0.0)));
                stop.store(true, Ordering::Relaxed);
            }
        },
    )?;
    Ok(Sample {
        instances: t.count,
        wall: t.wall,
        cpu: t.cpu,
    })
}
