//! The pft workloads, shared by `examples/pft.rs` and `benches/pft.rs`.
//!
//! Each thread write-faults every page of its own slice of memory, as the
//! kernel's pft does, by default with a first store to each page through
//! a [`Translator`](aspace::Translator) (a miss, a page-table walk, the
//! fault, the store), into frames used before: a scratch mapping is
//! written and unmapped first, so the faults take freed frames that must
//! be cleared ([`Frames::Used`]: on the fault, as the kernel does;
//! [`Frames::Zeroed`]: when the scratch mapping is unmapped,
//! `Config::zero_freed`, which the run times apart as `free_s`).
//! [`Frames::Fresh`] is the metadata path: never-used frames, known zero,
//! and a bare [`AddressSpace::fault`] per page with no store. `Single` gives each thread a slice of one large
//! shared VMA, `PerThread` gives each thread a VMA of its own,
//! `Interleaved` has the threads fault alternate pages of one VMA (so they
//! share every PTE table, and its lock is the limit). With
//! `writer`, one more thread keeps doing mmap/mprotect/munmap on unrelated
//! VMAs for the whole measurement: under the old mmap_lock every one of its
//! write sections stalls all faults; per-VMA locks let faults go on.
//! Each VMA then gets its anon_vma before the timed phase (its first write
//! takes the mmap_lock in every mode, so behind the writer it waits in
//! every mode; see `give_anon_vmas`).
//!
//! With `vma_bytes`, each region is cut into VMAs of that size (an
//! emulator's small mappings), several sharing each PTE table.
//!
//! With `huge` (pft's `--thp`), each thread's region is 2 MiB-aligned and
//! advised `MADV_HUGEPAGE` (and so is the scratch mapping, whose huge
//! frames, unmapped whole, wait in the physical memory's huge list), so
//! the faults map 2 MiB pages: with used frames each clears a reused
//! huge frame, as the kernel's `MADV_HUGEPAGE` faults do. Only the
//! per-thread workload without the writer is laid out this way.
//!
//! With `pin`, faulting thread `i` is bound to the `i`-th CPU the process
//! may run on (modulo their number), so the scheduler cannot stack two
//! faulters on one CPU for part of a run (the writer stays unbound).
#![allow(dead_code)]

use aspace::{Access, AddressSpace, Config, FaultLocking, MapFlags, Prot, PAGE_SIZE};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Instant;

/// Memory layout of a run (the workloads module's pft layouts).
pub use aspace::workloads::pft::Layout as Workload;

/// Which frames the faults get, and how they fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frames {
    /// Never-used frames (known zero: nothing is cleared) and a bare
    /// `mm.fault` per page, no store: the metadata path.
    Fresh,
    /// Frames used before, cleared by the fault that takes each (as the
    /// kernel's); a first store per page through a translator.
    Used,
    /// Frames used before, cleared in batches when they were freed
    /// (`Config::zero_freed`, untimed but measured as `free_s`); a first
    /// store per page through a translator.
    Zeroed,
}

impl Frames {
    /// The name used on the command line and in tables.
    pub fn name(self) -> &'static str {
        match self {
            Frames::Fresh => "fresh",
            Frames::Used => "used",
            Frames::Zeroed => "zeroed",
        }
    }

    /// What the name means, for table titles.
    pub fn describe(self) -> &'static str {
        match self {
            Frames::Fresh => "fresh frames, bare mm.fault (metadata path)",
            Frames::Used => "used frames cleared on fault, first store via Translator",
            Frames::Zeroed => "used frames cleared at free, first store via Translator",
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
    /// Cut the memory into VMAs of this many bytes (a page multiple),
    /// neighbours differing in `PROT_EXEC` so they never merge; `None`:
    /// one VMA per region.
    pub vma_bytes: Option<u64>,
    /// Clear new frames.
    pub zero: bool,
    /// Which frames the faults get, and how they fault.
    pub frames: Frames,
    /// 2 MiB-aligned `MADV_HUGEPAGE` regions (per-thread workload, no
    /// writer): the faults map transparent huge pages.
    pub huge: bool,
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
    /// Faults that completed speculatively.
    pub speculative: u64,
    /// Speculative attempts that fell back.
    pub spec_aborts: u64,
    /// CPU seconds the untimed unmap of the scratch mapping took (which
    /// clears its frames with [`Frames::Zeroed`]); 0 for fresh frames.
    pub free_s: f64,
    /// The run's huge faults (`thp_fault_alloc`) and those that fell back
    /// to a 4 KiB page (`thp_fault_fallback`), then the scratch
    /// mapping's huge faults: the huge frames it used and freed whole,
    /// which the run's huge faults take again (and must clear).
    pub thp: ThpCounts,
}

/// What the THP counters said of a run (all zero without `huge`).
#[derive(Clone, Copy, Debug, Default)]
pub struct ThpCounts {
    /// The run's faults that mapped a 2 MiB page.
    pub alloc: u64,
    /// The run's faults that could have mapped one but got no huge frame.
    pub fallback: u64,
    /// Huge faults of the scratch mapping (huge frames used before).
    pub scratch_alloc: u64,
    /// Of those, the ones that fell back to 4 KiB.
    pub scratch_fallback: u64,
}

impl Sample {
    /// Faults per second of wall time.
    pub fn faults_per_sec(&self) -> f64 {
        self.faults as f64 / self.wall
    }

    /// pft's faults/cpu: faults per thread per second of that thread's CPU
    /// time, averaged over threads.
    pub fn faults_per_cpu(&self) -> f64 {
        aspace::workloads::pft::faults_per_cpu(self.faults, &self.cpu)
    }
}

/// CPU time of the calling thread, seconds (the workloads module's).
pub use aspace::workloads::thread_cpu_time;

/// Where the writer maps its scratch VMAs.
const WRITER_HINT: u64 = 0x1000_0000;

fn anon() -> MapFlags {
    MapFlags::PRIVATE | MapFlags::ANONYMOUS
}

/// What the workers of one run share: the address space and where each
/// faulting thread starts.
struct Job {
    mm: Arc<AddressSpace>,
    bases: Vec<u64>,
    pages: u64,
    /// Pages from one fault of a thread to its next.
    stride: u64,
    /// Store through a translator (else a bare fault).
    store: bool,
}

/// State shared by a [`Workers`] pool and its threads.
struct Shared {
    /// Everyone (faulters, the writer if any, the driver) meets here to
    /// start a run, or to quit.
    start: Barrier,
    /// Faulters and the driver meet here when the faults are done.
    faulted: Barrier,
    /// Everyone meets here after the writer has stopped.
    end: Barrier,
    job: Mutex<Option<Arc<Job>>>,
    cpu: Mutex<Vec<f64>>,
    /// When each faulter started and finished its faults: the run's wall
    /// time is from the first start to the last finish, as the faulters
    /// saw them (the driver may be descheduled around the barriers on a
    /// loaded machine, so its own clock would not bound the faults).
    spans: Mutex<Vec<Option<(Instant, Instant)>>>,
    writer_done: AtomicBool,
    writer_ops: AtomicU64,
    quit: AtomicBool,
}

/// Persistent worker threads for repeated runs of one shape (thread count,
/// with or without the writer), so that thread start-up is never measured:
/// [`Workers::run`] maps fresh memory, releases the threads through a
/// barrier, and times only the faulting phase.
pub struct Workers {
    threads: usize,
    writer: bool,
    shared: Arc<Shared>,
    handles: Vec<std::thread::JoinHandle<()>>,
}

impl Workers {
    /// Starts `threads` faulting threads, plus the writer thread if
    /// `writer`; `pin` binds each faulter to a CPU of its own.
    pub fn new(threads: usize, writer: bool, pin: bool) -> Workers {
        let all = threads + usize::from(writer) + 1;
        let shared = Arc::new(Shared {
            start: Barrier::new(all),
            faulted: Barrier::new(threads + 1),
            end: Barrier::new(all),
            job: Mutex::new(None),
            cpu: Mutex::new(vec![0.0; threads]),
            spans: Mutex::new(vec![None; threads]),
            writer_done: AtomicBool::new(false),
            writer_ops: AtomicU64::new(0),
            quit: AtomicBool::new(false),
        });
        let mut handles: Vec<_> = (0..threads)
            .map(|i| {
                let sh = shared.clone();
                std::thread::spawn(move || {
                    if pin {
                        crate::machine::pin_to_cpu(i);
                    }
                    faulter(&sh, i)
                })
            })
            .collect();
        if writer {
            let sh = shared.clone();
            handles.push(std::thread::spawn(move || writer_loop(&sh)));
        }
        Workers {
            threads,
            writer,
            shared,
            handles,
        }
    }

    /// One measured run of `p` (whose `threads` and `writer` must be this
    /// pool's).
    pub fn run(&self, p: Params) -> Sample {
        assert_eq!(
            (p.threads, p.writer),
            (self.threads, self.writer),
            "pool shape"
        );
        let (mm, bases, pages, free_s) = setup(p);
        // The scratch mapping's huge faults made the huge frames used
        // before (they are not the run's: `setup_stats` below).
        let scratch = mm.stats();
        let stride = if p.workload == Workload::Interleaved {
            p.threads as u64
        } else {
            1
        };
        settle_garbage();
        // Setup's own faults (the scratch mapping's, `give_anon_vmas`)
        // are not the run's: `s` below counts from here.
        let setup_stats = mm.stats();
        let sh = &self.shared;
        *sh.job.lock().expect("job") = Some(Arc::new(Job {
            mm: mm.clone(),
            bases,
            pages,
            stride,
            store: p.frames != Frames::Fresh,
        }));
        sh.writer_done.store(false, Ordering::Relaxed);
        sh.writer_ops.store(0, Ordering::Relaxed);
        sh.start.wait();
        sh.faulted.wait();
        let wall = {
            let spans = sh.spans.lock().expect("spans");
            let spans = spans.iter().map(|s| s.expect("every faulter ran"));
            let first = spans.clone().map(|(a, _)| a).min().expect("threads");
            let last = spans.map(|(_, b)| b).max().expect("threads");
            (last - first).as_secs_f64()
        };
        sh.writer_done.store(true, Ordering::Relaxed);
        sh.end.wait();
        *sh.job.lock().expect("job") = None;
        let s = mm.stats() - setup_stats;
        Sample {
            faults: pages * p.threads as u64,
            wall,
            cpu: sh.cpu.lock().expect("cpu").clone(),
            writer_ops: sh.writer_ops.load(Ordering::Relaxed),
            per_vma: s.fault_per_vma,
            speculative: s.fault_speculative,
            spec_aborts: s.spec_aborts(),
            free_s,
            thp: ThpCounts {
                alloc: s.thp_fault_alloc,
                fallback: s.thp_fault_fallback,
                scratch_alloc: scratch.thp_fault_alloc,
                scratch_fallback: scratch.thp_fault_fallback,
            },
        }
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.shared.quit.store(true, Ordering::Relaxed);
        self.shared.start.wait();
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

fn current_job(sh: &Shared) -> Arc<Job> {
    sh.job
        .lock()
        .expect("job")
        .clone()
        .expect("a job is posted before start")
}

fn faulter(sh: &Shared, i: usize) {
    loop {
        sh.start.wait();
        if sh.quit.load(Ordering::Relaxed) {
            return;
        }
        let job = current_job(sh);
        let base = job.bases[i];
        // Made before the clock starts (it registers with the space).
        let mut tlb = job.store.then(|| job.mm.translator());
        let c0 = thread_cpu_time();
        let t0 = Instant::now();
        if let Some(tlb) = &mut tlb {
            for pg in 0..job.pages {
                tlb.store::<u8>(base + pg * job.stride * PAGE_SIZE, 1)
                    .expect("first store");
            }
        } else {
            for pg in 0..job.pages {
                job.mm
                    .fault(base + pg * job.stride * PAGE_SIZE, Access::Write)
                    .expect("fault");
            }
        }
        let t1 = Instant::now();
        drop(tlb);
        sh.cpu.lock().expect("cpu")[i] = thread_cpu_time() - c0;
        sh.spans.lock().expect("spans")[i] = Some((t0, t1));
        drop(job);
        sh.faulted.wait();
        sh.end.wait();
    }
}

fn writer_loop(sh: &Shared) {
    let rw = Prot::READ | Prot::WRITE;
    loop {
        sh.start.wait();
        if sh.quit.load(Ordering::Relaxed) {
            return;
        }
        let job = current_job(sh);
        let mut ops = 0;
        while !sh.writer_done.load(Ordering::Relaxed) {
            // Far below the workers' regions, so it never merges with (and
            // so never write-locks) their VMAs.
            let a = job
                .mm
                .mmap(WRITER_HINT, 16 * PAGE_SIZE, rw, anon())
                .expect("writer mmap");
            job.mm
                .mprotect(a + 4 * PAGE_SIZE, 4 * PAGE_SIZE, Prot::READ)
                .expect("writer mprotect");
            job.mm.munmap(a, 16 * PAGE_SIZE).expect("writer munmap");
            ops += 3;
        }
        sh.writer_ops.store(ops, Ordering::Relaxed);
        drop(job);
        sh.end.wait();
    }
}

/// Lets the epoch collector release what earlier runs retired (their
/// trees, page tables and node caches) before the measured phase, so a
/// run is not charged for the previous one's teardown, and the memory it
/// held is back with the allocator before this run's frames are faulted.
/// (Without this, the second mode of each repetition ran about 10%
/// slower with zeroing on, whichever mode it was.)
fn settle_garbage() {
    let r = aspace::reclaim::Reclaimer::epoch();
    for _ in 0..64 {
        let g = r.pin();
        r.flush(&g);
    }
}

/// A fresh address space laid out for `p`, its frames obtained in advance
/// (and, unless fresh frames are asked for, used and freed): returns it,
/// each faulting thread's base, the pages per thread, and the seconds the
/// scratch mapping's unmap took.
fn setup(p: Params) -> (Arc<AddressSpace>, Vec<u64>, u64, f64) {
    let pages = p.bytes_per_thread / PAGE_SIZE;
    let total = pages * p.threads as u64 * PAGE_SIZE;
    let used = p.frames != Frames::Fresh;
    let cfg = Config {
        fault_locking: p.locking,
        zero_pages: p.zero,
        zero_freed: p.frames == Frames::Zeroed,
        // Used frames: a budget 16 times the memory, so that the pool
        // keeps the scratch mapping's freed frames resident (it gives
        // back what passes an eighth of the live budgets), as the
        // kernel's free lists keep theirs; the budget is a cap, not an
        // allocation.
        memory_budget: if used { 16 * total } else { total } + (64 << 20),
        ..Config::default()
    };
    let mm = Arc::new(AddressSpace::new(cfg));
    // Huge frames start at 512-frame boundaries: room for the skip.
    let slack = if p.huge { HUGE } else { 0 };
    mm.prefault_frames(total + (1 << 20) + slack);
    let free_s = if used {
        use_frames(&mm, total, p.huge)
    } else {
        0.0
    };
    let rw = Prot::READ | Prot::WRITE;
    if p.huge {
        assert!(
            p.workload == Workload::PerThread && !p.writer && p.vma_bytes.is_none(),
            "huge pages: per-thread workload, no writer, one VMA per region"
        );
        let bases = (0..p.threads)
            .map(|_| huge_region(&mm, pages * PAGE_SIZE))
            .collect();
        return (mm, bases, pages, free_s);
    }
    let bases: Vec<u64> = match p.workload {
        Workload::Interleaved => {
            let b = mm
                .mmap(0, total, rw, anon())
                .expect("map the shared region");
            (0..p.threads as u64).map(|t| b + t * PAGE_SIZE).collect()
        }
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
    if let Some(vma) = p.vma_bytes {
        let region = match p.workload {
            Workload::PerThread => pages * PAGE_SIZE,
            Workload::Single | Workload::Interleaved => total,
        };
        let starts = match p.workload {
            Workload::PerThread => bases.clone(),
            Workload::Single | Workload::Interleaved => vec![bases[0]],
        };
        for b in starts {
            split_vmas(&mm, b, region, vma);
        }
    }
    if p.writer {
        give_anon_vmas(&mm, &bases, pages, p);
    }
    (mm, bases, pages, free_s)
}

/// 2 MiB: a huge page.
const HUGE: u64 = 2 << 20;

/// Maps `len` bytes (a 2 MiB multiple) 2 MiB-aligned and advised
/// `MADV_HUGEPAGE`, as the kernel's pft's `thp` regions, and returns
/// where they start. The unadvised slack around them keeps two regions
/// separate VMAs.
fn huge_region(mm: &AddressSpace, len: u64) -> u64 {
    let len = len.next_multiple_of(HUGE);
    let m = mm
        .mmap(0, len + HUGE, Prot::READ | Prot::WRITE, anon())
        .expect("map a huge region");
    let b = m.next_multiple_of(HUGE);
    mm.madvise(b, len, aspace::Advice::HugePage)
        .expect("MADV_HUGEPAGE");
    b
}

/// Writes a word into every page of a scratch mapping of `bytes` and
/// unmaps it, so that the frames the run then faults in were used
/// before; returns the CPU seconds the unmap took (with `zero_freed`, the
/// frames are cleared in it). With `huge`, the scratch mapping is a huge
/// region: its huge frames are freed whole to the huge list, where the
/// run's huge faults take them again.
fn use_frames(mm: &AddressSpace, bytes: u64, huge: bool) -> f64 {
    let rw = Prot::READ | Prot::WRITE;
    let (a, bytes) = if huge {
        // (The unadvised slack around it stays mapped, never touched.)
        (huge_region(mm, bytes), bytes.next_multiple_of(HUGE))
    } else {
        let a = mm
            .mmap(0, bytes, rw, anon())
            .expect("map the scratch region");
        (a, bytes)
    };
    let mut tlb = mm.translator();
    for pg in 0..bytes / PAGE_SIZE {
        tlb.store::<u64>(a + pg * PAGE_SIZE, 0x5a5a_5a5a_5a5a_5a5a)
            .expect("dirty a frame");
    }
    drop(tlb);
    // CPU time: the unmap runs on this thread alone.
    let c0 = thread_cpu_time();
    mm.munmap(a, bytes).expect("unmap the scratch region");
    thread_cpu_time() - c0
}

/// Gives every VMA the faulters will write its anon_vma before the run,
/// by a write fault and `MADV_DONTNEED` on its first page (the anon_vma
/// stays, the page goes): the first write of a VMA takes the mmap_lock
/// (read side, to prepare the anon_vma) in every mode, and behind the
/// writer, which re-takes the write side as soon as it drops it, that one
/// fault waited up to some 16 ms, while a 16 MiB run faults for about
/// 0.3 ms. The writer rows measure faults going on beside the writer, not
/// that one wait per VMA.
fn give_anon_vmas(mm: &AddressSpace, bases: &[u64], pages: u64, p: Params) {
    let regions: Vec<(u64, u64)> = match p.workload {
        Workload::PerThread => bases.iter().map(|&b| (b, pages * PAGE_SIZE)).collect(),
        Workload::Single | Workload::Interleaved => {
            vec![(bases[0], pages * p.threads as u64 * PAGE_SIZE)]
        }
    };
    let step = p
        .vma_bytes
        .map_or(u64::MAX, |v| v.max(PAGE_SIZE) & !(PAGE_SIZE - 1));
    for (base, len) in regions {
        let mut a = base;
        while a < base + len {
            mm.fault(a, Access::Write).expect("first write");
            mm.madvise(a, PAGE_SIZE, aspace::Advice::DontNeed)
                .expect("drop the page");
            a = a.saturating_add(step);
        }
    }
}

/// Cuts `[base, base + len)` into VMAs of `vma` bytes: every other one
/// gains `PROT_EXEC`, so neighbours differ in flags and never merge (the
/// workers' write faults are allowed in both).
fn split_vmas(mm: &AddressSpace, base: u64, len: u64, vma: u64) {
    let vma = vma.max(PAGE_SIZE) & !(PAGE_SIZE - 1);
    let rwx = Prot::READ | Prot::WRITE | Prot::EXEC;
    let mut a = base + vma;
    while a < base + len {
        let n = vma.min(base + len - a);
        mm.mprotect(a, n, rwx).expect("split into VMAs");
        a += 2 * vma;
    }
}
