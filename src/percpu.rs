//! Per-CPU slots, so that hot paths write no shared cache line.
//!
//! A thread uses the slot of the CPU it runs on, so threads that
//! take turns on one CPU share its slot's line without bouncing it, and the
//! slots follow the machine, not the number of threads ever started.
//! Where the CPU is unknown (and in loom models, which must replay
//! deterministically), a thread falls back to an id given the first time it
//! asks, round-robin over the slots.
//!
//! The CPU number is read on every per-CPU access (five times per fault),
//! so it must cost a load, not a call: on x86-64 Linux with glibc 2.35 or
//! later, glibc registers a restartable-sequences area for every thread,
//! at `__rseq_offset` bytes from the thread pointer, and the kernel keeps
//! its `cpu_id` field current whenever the thread returns to user space.
//! We read that field directly (two loads); elsewhere, or where glibc did
//! not register the area, `sched_getcpu` (which reads the same field or
//! asks the vDSO).
//!
//! A slot is therefore shared: by threads preempted on one CPU, by a thread
//! that migrates in the middle of an operation (it may start on one slot
//! and finish on another), and by fallback ids. Every user keeps its slot's
//! contents thread-safe and correct under that sharing:
//!
//! | user | slot holds | under sharing |
//! |------|------------|---------------|
//! | `stats` | event counters | atomic adds; a snapshot sums all slots |
//! | `pt` | table-page counts | atomic adds; the sum is what counts, a slot may go negative |
//! | `phys` | frame cache, alloc/free counts, budget stock | a mutex per cache; atomic counts, summed; the stock taken and refilled by read-modify-writes, part of the shared count whichever slot holds it |
//! | `tlb` | CPU-mask bit, in-flight access counts | an access decrements the count it incremented (the guard keeps it); a flush waits on every slot in the mask, its own included |
//! | `vmap` | home zone, counters | the zone is only a locality hint (each has a lock); atomic counters |
//! | `vma::pool` | free VMA objects (a LIFO cache), their count | a mutex per cache; a thread that moved uses the slot it looked up, under its lock; the count is a hint for thieves, stored under the lock |
//! | `mm` (range writers) | map-count changes not yet folded | atomic adds; the total plus every slot is the count, a slot may go negative |
//! | `mm::range_lock` (its own array) | range requests past the gate | a request decrements the count it incremented (the guard keeps the slot); a closer sums every slot |
//!
//! # Locking
//!
//! This module takes no lock: the slot array is allocated on first use
//! and installed once by a compare-and-swap (`Release`, loaded with
//! `Acquire`; the loser frees its copy), immutable after that, and what
//! protects a slot's contents is its user's business (the table
//! above; the locks among them are ordered in the crate's [lock
//! order](crate::mm#locking)). The CPU count is computed once
//! ([`sync::once`](crate::sync::once)); fallback ids come from a counter
//! atomic ([`sync::counter`](crate::sync::counter)), which orders nothing.

use crate::sync::counter::{self, AtomicUsize};
use crate::sync::once::OnceLock;
use crate::sync::{AtomicPtr, Ordering};
use crossbeam_utils::CachePadded;

/// Number of per-CPU slots: the machine's CPUs (configured, so CPU numbers
/// from `sched_getcpu` map one to one) rounded up to a power of two, at
/// least 2.
pub fn nr_cpus() -> usize {
    static N: OnceLock<usize> = OnceLock::new();
    *N.get_or_init(|| {
        let par = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        par.max(configured_cpus()).max(2).next_power_of_two()
    })
}

#[cfg(target_os = "linux")]
fn configured_cpus() -> usize {
    // SAFETY: sysconf has no preconditions; it returns -1 on error.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
    usize::try_from(n).unwrap_or(1)
}

#[cfg(not(target_os = "linux"))]
fn configured_cpus() -> usize {
    1
}

/// The calling thread's slot, in `0..nr_cpus()`: its current CPU, or a
/// per-thread id where that is unknown.
#[inline]
pub fn cpu_id() -> usize {
    // Loom models must be deterministic: they keep per-thread ids.
    #[cfg(all(target_os = "linux", not(aspace_loom)))]
    {
        #[cfg(all(target_arch = "x86_64", target_env = "gnu"))]
        if let Some(c) = rseq::cpu() {
            return c & (nr_cpus() - 1);
        }
        // SAFETY: sched_getcpu has no preconditions; it returns -1 on error.
        let c = unsafe { libc::sched_getcpu() };
        if let Ok(c) = usize::try_from(c) {
            return c & (nr_cpus() - 1);
        }
    }
    thread_slot()
}

/// The CPU number from the thread's rseq area (see the module docs).
#[cfg(all(
    target_os = "linux",
    target_arch = "x86_64",
    target_env = "gnu",
    not(aspace_loom)
))]
mod rseq {
    use crate::sync::once::OnceLock;

    /// Offset of the `cpu_id` field (`struct rseq`: `u32 cpu_id_start`,
    /// then `u32 cpu_id`).
    const CPU_ID: isize = 4;

    /// Bytes from the thread pointer to `cpu_id`, if glibc registers an
    /// rseq area for its threads (`__rseq_size` is 0 when it does not, as
    /// when registration is turned off or another library holds it).
    fn offset() -> Option<isize> {
        static OFFSET: OnceLock<Option<isize>> = OnceLock::new();
        *OFFSET.get_or_init(|| {
            // SAFETY: dlsym with a NUL-terminated name and the
            // RTLD_DEFAULT pseudo-handle; it returns null if not found.
            let (off, size) = unsafe {
                (
                    libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_offset".as_ptr()),
                    libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_size".as_ptr()),
                )
            };
            if off.is_null() || size.is_null() {
                return None;
            }
            // SAFETY: glibc defines `const ptrdiff_t __rseq_offset` and
            // `const unsigned int __rseq_size`, set before any user code
            // runs and never changed.
            let (off, size) = unsafe { (*(off as *const isize), *(size as *const u32)) };
            // The area must reach past `cpu_id`.
            (size >= 8).then(|| off + CPU_ID)
        })
    }

    /// The calling thread's CPU, or `None` where glibc registered no area
    /// (or the kernel reports no CPU yet).
    #[inline]
    pub(super) fn cpu() -> Option<usize> {
        let off = offset()?;
        let tp: usize;
        // SAFETY: on x86-64 Linux the word at fs:0 is the thread pointer
        // (the TCB's self-pointer of the TLS ABI); reading it has no side
        // effects.
        unsafe {
            core::arch::asm!(
                "mov {}, qword ptr fs:[0]",
                out(reg) tp,
                options(nostack, readonly, preserves_flags)
            )
        };
        let field = (tp as isize).wrapping_add(off) as *const i32;
        // SAFETY: glibc's rseq area lives in this thread's TCB for the
        // thread's whole life, `__rseq_offset` from the thread pointer,
        // and `size >= 8` was checked. Only the kernel writes `cpu_id`,
        // on this thread's return to user space, so nothing races the
        // read; volatile keeps it from being cached across a migration.
        let c = unsafe { core::ptr::read_volatile(field) };
        usize::try_from(c).ok()
    }
}

/// A per-thread id, round-robin over the slots (the fallback).
fn thread_slot() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static ID: usize = NEXT.fetch_add(1, counter::Ordering::Relaxed) % nr_cpus();
    }
    ID.with(|id| *id)
}

/// One `T` per CPU slot, each on its own cache line (or one per index
/// the caller keeps apart, [`indexed`](Self::indexed)).
///
/// The slots are allocated on first use ([`local`](Self::local) or
/// [`get`](Self::get)), not by [`new`](Self::new): an address space that is
/// created and dropped idle allocates none of its per-CPU arrays. Until
/// then [`iter`](Self::iter) yields nothing (every slot would still hold
/// its initial value, which sums to nothing for the counters kept here).
pub struct PerCpu<T> {
    /// The first of `len` slots, each on its own cache line; null until
    /// first use.
    ///
    /// Protected by: installed once, null to an array, by a
    /// compare-and-swap (`Release` on success: the slots' initialization
    /// happens before any thread that loads the pointer with `Acquire`
    /// uses them); the loser of a race frees its own array. Never changed
    /// again until drop. A slot's contents are protected by the slot type
    /// (atomics or a mutex, see the module docs).
    slots: AtomicPtr<CachePadded<T>>,
    /// Number of slots ([`nr_cpus`] when made: a power of two).
    ///
    /// Protected by: immutable after creation.
    len: usize,
    /// Makes a slot's initial value.
    ///
    /// Protected by: immutable after creation.
    init: fn() -> T,
}

// SAFETY: the slots are shared by every thread that uses the PerCpu (so T
// must be Sync) and dropped by whichever thread drops it (so T must be
// Send), as for the `Box<[T]>` this replaces.
unsafe impl<T: Send + Sync> Sync for PerCpu<T> {}
// SAFETY: as for Sync: moving the PerCpu moves ownership of its slots.
unsafe impl<T: Send> Send for PerCpu<T> {}

impl<T> PerCpu<T> {
    /// One slot per CPU, each made by `init` on first use. Allocates
    /// nothing.
    pub fn new(init: fn() -> T) -> Self {
        PerCpu {
            slots: AtomicPtr::new(core::ptr::null_mut()),
            len: nr_cpus(),
            init,
        }
    }

    /// `n` slots indexed by the caller ([`get`](Self::get)), not by CPU
    /// (rounded up to a power of two), each made by `init` on first use.
    /// Allocates nothing.
    pub fn indexed(n: usize, init: fn() -> T) -> Self {
        PerCpu {
            slots: AtomicPtr::new(core::ptr::null_mut()),
            len: n.max(2).next_power_of_two(),
            init,
        }
    }

    /// The slot array, allocated (race-free) on first use.
    #[inline]
    fn slots(&self) -> &[CachePadded<T>] {
        match self.made() {
            Some(s) => s,
            None => self.slice(self.install()),
        }
    }

    /// The slot array if it was allocated yet (`None` before first use).
    #[inline]
    fn made(&self) -> Option<&[CachePadded<T>]> {
        // Acquire: pairs with the Release of the install, so the slots'
        // initialization is visible before we use them.
        let p = self.slots.load(Ordering::Acquire);
        (!p.is_null()).then(|| self.slice(p))
    }

    /// The slots at `p`, a pointer `install` returned.
    #[inline]
    fn slice(&self, p: *mut CachePadded<T>) -> &[CachePadded<T>] {
        // SAFETY: a non-null pointer from `install` (or loaded from
        // `slots`, which holds only those) is the first of `len`
        // initialized slots of a boxed slice, published once and freed
        // only by `drop` (`&mut self`), so it outlives `&self`.
        unsafe { core::slice::from_raw_parts(p, self.len) }
    }

    /// Allocates the slots and publishes them, unless another thread got
    /// there first: then frees ours and returns theirs.
    #[cold]
    fn install(&self) -> *mut CachePadded<T> {
        let fresh: Box<[CachePadded<T>]> = (0..self.len)
            .map(|_| CachePadded::new((self.init)()))
            .collect();
        let new = Box::into_raw(fresh) as *mut CachePadded<T>;
        match self.slots.compare_exchange(
            core::ptr::null_mut(),
            new,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => new,
            Err(winner) => {
                // SAFETY: `new` was never published; we own it, and it was
                // a boxed slice of `len` slots.
                drop(unsafe { Box::from_raw(core::ptr::slice_from_raw_parts_mut(new, self.len)) });
                winner
            }
        }
    }

    /// The calling thread's slot.
    #[inline]
    pub fn local(&self) -> &T {
        // `len` is a power of two (`nr_cpus`): a mask, not a division.
        &self.slots()[cpu_id() & (self.len - 1)]
    }

    /// The calling thread's slot if the slots exist yet, for a reader
    /// that must not allocate them (every slot still holds its initial
    /// value until then).
    #[inline]
    pub fn local_if_made(&self) -> Option<&T> {
        self.made().map(|s| &*s[cpu_id() & (self.len - 1)])
    }

    /// Slot `cpu` (modulo the slot count).
    #[inline]
    pub fn get(&self, cpu: usize) -> &T {
        &self.slots()[cpu & (self.len - 1)]
    }

    /// All slots, for summing; none before first use.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.made().unwrap_or(&[]).iter().map(|s| &**s)
    }

    /// Number of slots.
    #[allow(clippy::len_without_is_empty)] // never empty: at least 2 slots
    pub fn len(&self) -> usize {
        self.len
    }

    /// True once the slots exist (tests of laziness).
    #[cfg(test)]
    pub(crate) fn is_allocated(&self) -> bool {
        self.made().is_some()
    }
}

impl<T> Drop for PerCpu<T> {
    fn drop(&mut self) {
        let p = self.slots.load(Ordering::Acquire);
        if !p.is_null() {
            // SAFETY: published by `install` from a boxed slice of `len`
            // slots; `&mut self` means nobody else can reach it.
            drop(unsafe { Box::from_raw(core::ptr::slice_from_raw_parts_mut(p, self.len)) });
        }
    }
}

impl<T: core::fmt::Debug> core::fmt::Debug for PerCpu<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// The CPUs the calling thread may run on, in ascending order (tests).
#[cfg(all(test, target_os = "linux", not(aspace_loom)))]
pub(crate) fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is a plain bit array, valid when zeroed.
    let mut allowed: libc::cpu_set_t = unsafe { core::mem::zeroed() };
    let size = core::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: `allowed` is a writable cpu_set_t of `size` bytes.
    assert_eq!(unsafe { libc::sched_getaffinity(0, size, &mut allowed) }, 0);
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `c` is below CPU_SETSIZE, the set's capacity.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &allowed) })
        .collect()
}

/// Binds the calling thread to CPU `cpu`, one of [`allowed_cpus`]
/// (tests); the kernel moves the thread there before this returns.
#[cfg(all(test, target_os = "linux", not(aspace_loom)))]
pub(crate) fn pin_to(cpu: usize) {
    let size = core::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: as for `allowed` in `allowed_cpus`.
    let mut one: libc::cpu_set_t = unsafe { core::mem::zeroed() };
    // SAFETY: `cpu` is an allowed CPU, so below CPU_SETSIZE.
    unsafe { libc::CPU_SET(cpu, &mut one) };
    // SAFETY: `one` is a valid set of `size` bytes; 0 is this thread.
    assert_eq!(unsafe { libc::sched_setaffinity(0, size, &one) }, 0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_stable_and_in_range() {
        let a = cpu_id();
        assert!(a < nr_cpus());
        assert_eq!(
            thread_slot(),
            thread_slot(),
            "a thread keeps its fallback id"
        );
        assert!(nr_cpus().is_power_of_two());
        let p = PerCpu::new(|| AtomicUsize::new(0));
        assert_eq!(p.iter().count(), 0, "nothing before first use");
        p.local().fetch_add(1, Ordering::Relaxed);
        assert_eq!(
            p.iter().map(|c| c.load(Ordering::Relaxed)).sum::<usize>(),
            1
        );
        let other = std::thread::spawn(cpu_id).join().unwrap();
        assert!(other < nr_cpus());
        assert!(thread_slot() < nr_cpus());
    }

    /// The rseq read gives the CPU the thread is bound to, on every CPU
    /// (a wrong offset or field would give another number, or none).
    #[cfg(all(target_os = "linux", target_arch = "x86_64", target_env = "gnu"))]
    #[test]
    fn the_rseq_cpu_is_the_cpu_the_thread_runs_on() {
        std::thread::spawn(|| {
            let mut checked = 0;
            for cpu in allowed_cpus() {
                pin_to(cpu);
                // The kernel moves us before sched_setaffinity returns.
                let got = rseq::cpu();
                if got.is_some() {
                    assert_eq!(got, Some(cpu), "rseq cpu_id on CPU {cpu}");
                    assert_eq!(cpu_id(), cpu & (nr_cpus() - 1));
                    checked += 1;
                }
            }
            // glibc 2.35+ registers the area unless told not to.
            eprintln!("rseq cpu_id checked on {checked} CPUs");
        })
        .join()
        .unwrap();
    }

    /// Slots that count their making and dropping, to check that a lost
    /// install race frees its copy.
    static MADE: AtomicUsize = AtomicUsize::new(0);
    static DROPPED: AtomicUsize = AtomicUsize::new(0);
    struct Tracked(AtomicUsize);
    impl Drop for Tracked {
        fn drop(&mut self) {
            DROPPED.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn first_use_races_install_one_array_and_leak_nothing() {
        for _ in 0..50 {
            let p = PerCpu::new(|| {
                MADE.fetch_add(1, Ordering::Relaxed);
                Tracked(AtomicUsize::new(0))
            });
            assert!(!p.is_allocated());
            assert_eq!(
                MADE.load(Ordering::Relaxed),
                DROPPED.load(Ordering::Relaxed)
            );
            let start = std::sync::Barrier::new(4);
            let seen: Vec<usize> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..4)
                    .map(|_| {
                        s.spawn(|| {
                            start.wait();
                            p.local().0.fetch_add(1, Ordering::Relaxed);
                            p.get(0) as *const Tracked as usize
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            assert!(seen.iter().all(|&a| a == seen[0]), "one array for all");
            assert_eq!(
                p.iter().map(|t| t.0.load(Ordering::Relaxed)).sum::<usize>(),
                4
            );
            // Only the winner's slots are alive.
            let alive = MADE.load(Ordering::Relaxed) - DROPPED.load(Ordering::Relaxed);
            assert_eq!(alive, p.len());
            drop(p);
            assert_eq!(
                MADE.load(Ordering::Relaxed),
                DROPPED.load(Ordering::Relaxed)
            );
        }
    }
}
