//! The pft workloads, shared by `examples/pft.rs` and `benches/pft.rs`.
//!
//! Each thread write-faults every page of its own slice of memory through
//! [`AddressSpace::fault`]: `Single` gives each thread a slice of one large
//! shared VMA, `PerThread` gives each thread a VMA of its own. With
//! `writer`, one more thread keeps doing mmap/mprotect/munmap on unrelated
//! VMAs for the whole measurement: under the old mmap_lock every one of its
//! write sections stalls all faults; per-VMA locks let faults go on.
#![allow(dead_code)]

use aspace::{Access, AddressSpace, Config, FaultLocking, MapFlags, Prot, PAGE_SIZE};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Instant;

/// Memory layout of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// One large VMA; each thread faults its own slice.
    Single,
    /// One VMA per thread.
    PerThread,
}

impl Workload {
    /// The name used on the command line and in tables.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Single => "single",
            Workload::PerThread => "per-thread",
        }
    }
}

/// One measurement point.
#[derive(Clone, Copy, Debug)]
pub struct Params {
    /// Faulting threads.
    pub threads: usize,
    /// Memory layout.
    pub workload: Workload,
    /// Run a concurrent mmap/mprotect/munmap writer.
    pub writer: bool,
    /// Fault locking mode.
    pub locking: FaultLocking,
    /// Memory each thread faults in.
    pub bytes_per_thread: u64,
    /// Clear new frames.
    pub zero: bool,
}

/// What one run measured.
#[derive(Clone, Debug)]
pub struct Sample {
    /// Faults taken.
    pub faults: u64,
    /// Wall time of the measured phase, seconds.
    pub wall: f64,
    /// CPU time of each faulting thread, seconds.
    pub cpu: Vec<f64>,
    /// Operations the writer completed.
    pub writer_ops: u64,
    /// Faults that took the per-VMA path.
    pub per_vma: u64,
}

impl Sample {
    /// Faults per second of wall time.
    pub fn faults_per_sec(&self) -> f64 {
        self.faults as f64 / self.wall
    }

    /// pft's faults/cpu: faults per thread per second of that thread's CPU
    /// time, averaged over threads.
    pub fn faults_per_cpu(&self) -> f64 {
        let per_thread = self.faults as f64 / self.cpu.len() as f64;
        let n = self.cpu.len() as f64;
        self.cpu
            .iter()
            .map(|&c| per_thread / c.max(1e-9))
            .sum::<f64>()
            / n
    }
}

/// CPU time of the calling thread, seconds.
pub fn thread_cpu_time() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the valid pointer we
    // pass; CLOCK_THREAD_CPUTIME_ID is supported on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0.0;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Where the writer maps its scratch VMAs.
const WRITER_HINT: u64 = 0x1000_0000;

fn anon() -> MapFlags {
    MapFlags::PRIVATE | MapFlags::ANONYMOUS
}

/// Persistent worker threads for repeated runs of one [`Params`] shape
/// (so thread start-up is not measured): `run()` maps fresh memory,
/// releases the workers through a barrier, and collects their results.
pub fn run(p: Params) -> Sample {
    let pages = p.bytes_per_thread / PAGE_SIZE;
    let total = pages * p.threads as u64 * PAGE_SIZE;
    let cfg = Config {
        fault_locking: p.locking,
        zero_pages: p.zero,
        memory_budget: total + (64 << 20),
        ..Config::default()
    };
    let mm = Arc::new(AddressSpace::new(cfg));
    mm.prefault_frames(total + (1 << 20));
    let rw = Prot::READ | Prot::WRITE;
    let bases: Vec<u64> = match p.workload {
        Workload::Single => {
            let b = mm
                .mmap(0, total, rw, anon())
                .expect("map the shared region");
            (0..p.threads as u64)
                .map(|t| b + t * pages * PAGE_SIZE)
                .collect()
        }
        Workload::PerThread => (0..p.threads)
            .map(|_| {
                // A guard page between regions keeps them separate VMAs.
                let b = mm
                    .mmap(0, (pages + 1) * PAGE_SIZE, rw, anon())
                    .expect("map a region");
                mm.mprotect(b + pages * PAGE_SIZE, PAGE_SIZE, Prot::NONE)
                    .expect("guard");
                b
            })
            .collect(),
    };
    let start = Arc::new(Barrier::new(p.threads + 1 + usize::from(p.writer)));
    let done = Arc::new(AtomicBool::new(false));
    let writer_ops = Arc::new(AtomicU64::new(0));
    let writer = p.writer.then(|| {
        let (mm, start, done, ops) = (mm.clone(), start.clone(), done.clone(), writer_ops.clone());
        std::thread::spawn(move || {
            start.wait();
            while !done.load(Ordering::Relaxed) {
                // Far below the workers' regions, so it never merges with
                // (and so never write-locks) their VMAs.
                let a = mm
                    .mmap(WRITER_HINT, 16 * PAGE_SIZE, rw, anon())
                    .expect("writer mmap");
                mm.mprotect(a + 4 * PAGE_SIZE, 4 * PAGE_SIZE, Prot::READ)
                    .expect("writer mprotect");
                mm.munmap(a, 16 * PAGE_SIZE).expect("writer munmap");
                ops.fetch_add(3, Ordering::Relaxed);
            }
        })
    });
    let workers: Vec<_> = bases
        .iter()
        .map(|&base| {
            let (mm, start) = (mm.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                let c0 = thread_cpu_time();
                for i in 0..pages {
                    mm.fault(base + i * PAGE_SIZE, Access::Write)
                        .expect("fault");
                }
                thread_cpu_time() - c0
            })
        })
        .collect();
    start.wait();
    let t0 = Instant::now();
    let cpu: Vec<f64> = workers
        .into_iter()
        .map(|h| h.join().expect("worker"))
        .collect();
    let wall = t0.elapsed().as_secs_f64();
    done.store(true, Ordering::Relaxed);
    if let Some(w) = writer {
        w.join().expect("writer");
    }
    let s = mm.stats();
    Sample {
        faults: pages * p.threads as u64,
        wall,
        cpu,
        writer_ops: writer_ops.load(Ordering::Relaxed),
        per_vma: s.fault_per_vma,
    }
}
