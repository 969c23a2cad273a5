//! Workload drivers a researcher can run against a design of their own
//! (feature `workloads`, off by default).
//!
//! A driver runs against [`Space`], the few calls it needs from an address
//! space (mmap without a hint, mprotect, munmap, madvise) and a
//! per-thread [`Cpu`] that stores and loads words as a CPU would (faulting
//! a page in on its first store). Implemented here for [`AddressSpace`]
//! (every [`Mode`] in [`MODES`]: the stores go through a
//! [`Translator`]) and for the running kernel
//! ([`Kernel`]: libc calls and plain stores), so one program measures both
//! side by side; implement it for your own design and the same drivers run
//! on it (README: "Running the workloads against your own design";
//! `tests/workloads_toy.rs` does it for an `RwLock<BTreeMap>` toy).
//!
//! ```
//! use aspace::workloads::instantiate::{self, Kind, Params, Until};
//! use aspace::workloads::{Kernel, MODES};
//!
//! // Four checked instances per thread on two threads, in every mode.
//! let p = Params { threads: 2, kind: Kind::Instances, until: Until::Instances(4), check: true, pin: false };
//! for mode in MODES {
//!     let mm = mode.space();
//!     assert_eq!(instantiate::run(&mm, &p)?.instances, 8);
//!     assert_eq!(mm.map_count(), 0);
//! }
//! // The same program on the running kernel.
//! // SAFETY: only the driver uses it, on the mappings it makes.
//! let kernel = unsafe { Kernel::new() };
//! assert_eq!(instantiate::run(&kernel, &p)?.instances, 8);
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! [`Separate`] runs a driver with every thread in a space of its own:
//! the no-sharing ideal that one shared space's scaling is read against,
//! measured on the same machine in the same run.
//!
//! Drivers: [`instantiate`], a wasm runtime instantiating instances in
//! every thread (issue 28), and [`pft`], the kernel's pft
//! (will-it-scale's `page_fault1`: a first store to every page). The pft
//! example's aspace side, with its used frames, concurrent writer and
//! per-mode counters, stays in `benches/common/pft_workload.rs`: it needs
//! aspace's own set-up; its kernel side is [`pft`] on [`Kernel`].

pub mod instantiate;
mod kernel;
pub mod pft;
mod separate;

pub use kernel::{Kernel, KernelCpu};
pub use separate::Separate;

use crate::{
    AddressSpace, Advice, Config, FaultLocking, MapFlags, Prot, Translator, WriterLocking,
};
use std::io;
use std::sync::Barrier;
use std::time::Instant;

/// The address-space calls the drivers make. Addresses and lengths are
/// Linux's (page multiples); errors carry Linux's errno
/// ([`io::Error::raw_os_error`]) where the design has one.
pub trait Space: Sync {
    /// A thread's view of the space: made once per driver thread, on that
    /// thread, before the timed phase.
    type Cpu<'a>: Cpu
    where
        Self: 'a;

    /// `mmap(NULL, len, prot, flags, -1, 0)`: anonymous memory wherever
    /// the space places it (the drivers pass `MAP_PRIVATE |
    /// MAP_ANONYMOUS`, with `MAP_NORESERVE` for reservations); returns
    /// its start.
    fn mmap(&self, len: u64, prot: Prot, flags: MapFlags) -> io::Result<u64>;

    /// `mprotect(addr, len, prot)`.
    fn mprotect(&self, addr: u64, len: u64, prot: Prot) -> io::Result<()>;

    /// `munmap(addr, len)`.
    fn munmap(&self, addr: u64, len: u64) -> io::Result<()>;

    /// `madvise(addr, len, advice)`. The drivers give `DontNeed` (the
    /// pages read zero afterwards) and, in pft, `HugePage` or
    /// `NoHugePage` (a design without huge pages may ignore those two).
    fn madvise(&self, addr: u64, len: u64, advice: Advice) -> io::Result<()>;

    /// The calling thread's [`Cpu`].
    fn cpu(&self) -> Self::Cpu<'_>;
}

/// A thread's loads and stores into a [`Space`], as a CPU makes them: the
/// first store to a page faults it in.
pub trait Cpu {
    /// Stores `v` at `addr` (8-byte aligned).
    ///
    /// # Safety
    ///
    /// `addr..addr + 8` lies in memory the space mapped with
    /// `PROT_READ | PROT_WRITE` and that stays mapped during the call (a
    /// design that checks every access, as [`AddressSpace`] does, may
    /// ignore this; the [`Kernel`]'s stores are plain pointer stores).
    unsafe fn store(&mut self, addr: u64, v: u64) -> io::Result<()>;

    /// Loads the word at `addr` (8-byte aligned).
    ///
    /// # Safety
    ///
    /// As for [`store`](Cpu::store).
    unsafe fn load(&mut self, addr: u64) -> io::Result<u64>;
}

/// A configuration of aspace the workloads compare, by name.
#[derive(Clone, Copy, Debug)]
pub struct Mode {
    /// The name tables print.
    pub name: &'static str,
    /// The configuration (memory budget and the rest at their defaults).
    pub config: fn() -> Config,
}

/// The modes every workload table has, baseline first. A new mode is one
/// line here: its name and the `Config` that selects it.
pub const MODES: &[Mode] = &[
    Mode::new("MmapLock", || locking(FaultLocking::MmapLock)),
    Mode::new("PerVma", || locking(FaultLocking::PerVma)),
    Mode::new("Speculative", || locking(FaultLocking::Speculative)),
    Mode::new("Range", || Config {
        writer_locking: WriterLocking::Range,
        ..locking(FaultLocking::Speculative)
    }),
    // Range with per-CPU placement windows of 1 TiB (placement departs
    // from Linux's: `Config::placement_window`): two threads' mappings
    // then lie in different 512 GiB slots, where their unmaps' holes do
    // not meet (`range_lock`'s module docs).
    Mode::new("Range+windows", || Config {
        writer_locking: WriterLocking::Range,
        placement_window: 1 << 40,
        ..locking(FaultLocking::Speculative)
    }),
];

fn locking(fault_locking: FaultLocking) -> Config {
    Config {
        fault_locking,
        writer_locking: WriterLocking::MmapLock,
        ..Config::default()
    }
}

impl Mode {
    /// A mode named `name`, whose spaces are made with `config()`.
    pub const fn new(name: &'static str, config: fn() -> Config) -> Mode {
        Mode { name, config }
    }

    /// A fresh address space in this mode.
    pub fn space(&self) -> AddressSpace {
        AddressSpace::new((self.config)())
    }
}

impl Space for AddressSpace {
    type Cpu<'a> = Translator<'a>;

    fn mmap(&self, len: u64, prot: Prot, flags: MapFlags) -> io::Result<u64> {
        Ok(AddressSpace::mmap(self, 0, len, prot, flags)?)
    }

    fn mprotect(&self, addr: u64, len: u64, prot: Prot) -> io::Result<()> {
        Ok(AddressSpace::mprotect(self, addr, len, prot)?)
    }

    fn munmap(&self, addr: u64, len: u64) -> io::Result<()> {
        Ok(AddressSpace::munmap(self, addr, len)?)
    }

    fn madvise(&self, addr: u64, len: u64, advice: Advice) -> io::Result<()> {
        Ok(AddressSpace::madvise(self, addr, len, advice)?)
    }

    fn cpu(&self) -> Translator<'_> {
        self.translator()
    }
}

impl Cpu for Translator<'_> {
    unsafe fn store(&mut self, addr: u64, v: u64) -> io::Result<()> {
        Translator::store::<u64>(self, addr, v).map_err(|m| crate::Error::Memory(m).into())
    }

    unsafe fn load(&mut self, addr: u64) -> io::Result<u64> {
        Translator::load::<u64>(self, addr).map_err(|m| crate::Error::Memory(m).into())
    }
}

/// CPU time of the calling thread, seconds (0 if the clock is unreadable).
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

/// Binds the calling thread to the `i`-th CPU (modulo their number) of
/// those the process may run on, as will-it-scale binds its tasks; leaves
/// it unbound if that fails.
pub fn pin_to_cpu(i: usize) {
    // SAFETY: cpu_set_t is a plain bit array, valid when zeroed.
    let mut allowed: libc::cpu_set_t = unsafe { core::mem::zeroed() };
    let size = core::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: `allowed` is a writable cpu_set_t of `size` bytes.
    if unsafe { libc::sched_getaffinity(0, size, &mut allowed) } != 0 {
        return;
    }
    let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
        .filter(|&c| {
            // SAFETY: `c` is below CPU_SETSIZE, the set's capacity.
            unsafe { libc::CPU_ISSET(c, &allowed) }
        })
        .collect();
    let Some(&cpu) = cpus.get(i % cpus.len().max(1)) else {
        return;
    };
    // SAFETY: as for `allowed`.
    let mut one: libc::cpu_set_t = unsafe { core::mem::zeroed() };
    // SAFETY: `cpu` came from the set, so it is below CPU_SETSIZE.
    unsafe { libc::CPU_SET(cpu, &mut one) };
    // SAFETY: `one` is a valid cpu_set_t of `size` bytes; 0 is this thread.
    unsafe { libc::sched_setaffinity(0, size, &one) };
}

/// What the threads of a [`timed_threads`] run did together.
pub(crate) struct Timed {
    /// The sum of the threads' counts.
    pub count: u64,
    /// Seconds from the first thread's start to the last one's end.
    pub wall: f64,
    /// Each thread's CPU seconds.
    pub cpu: Vec<f64>,
}

/// Runs `body(i, cpu)` on `threads` threads (thread `i` bound to the
/// `i`-th CPU with `pin`), each with its [`Cpu`] made before a barrier
/// that starts the clocks, while this thread runs `meanwhile`; returns the
/// sum of what the bodies counted and their span, or the first error.
pub(crate) fn timed_threads<'s, S: Space>(
    space: &'s S,
    threads: usize,
    pin: bool,
    body: impl Fn(usize, &mut S::Cpu<'s>) -> io::Result<u64> + Sync,
    meanwhile: impl FnOnce(),
) -> io::Result<Timed> {
    let go = Barrier::new(threads + 1);
    std::thread::scope(|sc| {
        let handles: Vec<_> = (0..threads)
            .map(|i| {
                let (go, body) = (&go, &body);
                sc.spawn(move || {
                    if pin {
                        pin_to_cpu(i);
                    }
                    let mut cpu = space.cpu();
                    go.wait();
                    let (c0, t0) = (thread_cpu_time(), Instant::now());
                    let n = body(i, &mut cpu)?;
                    let t1 = Instant::now();
                    Ok::<_, io::Error>((n, t0, t1, thread_cpu_time() - c0))
                })
            })
            .collect();
        go.wait();
        meanwhile();
        let mut spans = Vec::new();
        for h in handles {
            spans.push(h.join().expect("a workload thread panicked")?);
        }
        let first = spans.iter().map(|s| s.1).min();
        let last = spans.iter().map(|s| s.2).max();
        Ok(Timed {
            count: spans.iter().map(|s| s.0).sum(),
            wall: first.zip(last).map_or(0.0, |(a, b)| (b - a).as_secs_f64()),
            cpu: spans.iter().map(|s| s.3).collect(),
        })
    })
}
