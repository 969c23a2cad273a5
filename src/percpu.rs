//! Per-CPU slots, so that hot paths write no shared cache line.
//!
//! A thread uses the slot of the CPU it runs on (`sched_getcpu`, a
//! thread-local read where glibc has registered rseq), so threads that
//! take turns on one CPU share its slot's line without bouncing it, and the
//! slots follow the machine, not the number of threads ever started.
//! Where the CPU is unknown (and in loom models, which must replay
//! deterministically), a thread falls back to an id given the first time it
//! asks, round-robin over the slots.
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
//! | `phys` | frame cache, alloc/free counts | a mutex per cache; atomic counts, summed |
//! | `tlb` | CPU-mask bit, in-flight access counts | an access decrements the count it incremented (the guard keeps it); a flush waits on every slot in the mask, its own included |
//! | `vmap` | home zone, counters | the zone is only a locality hint (each has a lock); atomic counters |
//!
//! # Locking
//!
//! This module takes no lock: the slot array is immutable after creation,
//! and what protects a slot's contents is its user's business (the table
//! above; the locks among them are ordered in the crate's [lock
//! order](crate::mm#locking)). The CPU count is computed once
//! ([`sync::once`](crate::sync::once)); fallback ids come from a counter
//! atomic ([`sync::counter`](crate::sync::counter)), which orders nothing.

use crate::sync::counter::{AtomicUsize, Ordering};
use crate::sync::once::OnceLock;
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
        // SAFETY: sched_getcpu has no preconditions; it returns -1 on error.
        let c = unsafe { libc::sched_getcpu() };
        if let Ok(c) = usize::try_from(c) {
            return c & (nr_cpus() - 1);
        }
    }
    thread_slot()
}

/// A per-thread id, round-robin over the slots (the fallback).
fn thread_slot() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static ID: usize = NEXT.fetch_add(1, Ordering::Relaxed) % nr_cpus();
    }
    ID.with(|id| *id)
}

/// One `T` per CPU slot, each on its own cache line.
pub struct PerCpu<T> {
    /// One slot per CPU, each on its own cache line.
    ///
    /// Protected by: the array is immutable after creation; a slot's
    /// contents are protected by the slot type (atomics or a mutex, see
    /// the module docs).
    slots: Box<[CachePadded<T>]>,
}

impl<T> PerCpu<T> {
    /// One slot per CPU, each made by `init`.
    pub fn new(mut init: impl FnMut() -> T) -> Self {
        PerCpu {
            slots: (0..nr_cpus()).map(|_| CachePadded::new(init())).collect(),
        }
    }

    /// The calling thread's slot.
    #[inline]
    pub fn local(&self) -> &T {
        &self.slots[cpu_id() % self.slots.len()]
    }

    /// Slot `cpu` (modulo the slot count).
    #[inline]
    pub fn get(&self, cpu: usize) -> &T {
        &self.slots[cpu % self.slots.len()]
    }

    /// All slots, for summing.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().map(|s| &**s)
    }

    /// Number of slots.
    pub fn len(&self) -> usize {
        self.slots.len()
    }
}

impl<T: core::fmt::Debug> core::fmt::Debug for PerCpu<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
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
        p.local().fetch_add(1, Ordering::Relaxed);
        assert_eq!(
            p.iter().map(|c| c.load(Ordering::Relaxed)).sum::<usize>(),
            1
        );
        let other = std::thread::spawn(cpu_id).join().unwrap();
        assert!(other < nr_cpus());
        assert!(thread_slot() < nr_cpus());
    }
}
