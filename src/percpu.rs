//! Per-CPU slots, so that hot paths write no shared cache line.
//!
//! User space has no stable "current CPU", so each thread is given a CPU id
//! the first time it asks, round-robin over [`nr_cpus`] slots. With no more
//! threads than cores every thread owns its slot; beyond that, threads share
//! slots, which is why every slot's contents are themselves thread-safe
//! (atomics or a lock that is almost never contended).

use crossbeam_utils::CachePadded;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Number of per-CPU slots: the machine's parallelism rounded up to a power
/// of two (at least 2).
pub fn nr_cpus() -> usize {
    static N: OnceLock<usize> = OnceLock::new();
    *N.get_or_init(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .max(2)
            .next_power_of_two()
    })
}

/// The calling thread's CPU id, in `0..nr_cpus()`.
#[inline]
pub fn cpu_id() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static ID: usize = NEXT.fetch_add(1, Ordering::Relaxed) % nr_cpus();
    }
    ID.with(|id| *id)
}

/// One `T` per CPU slot, each on its own cache line.
pub struct PerCpu<T> {
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

    /// Always false: there is at least one slot.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
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
        assert_eq!(a, cpu_id());
        assert!(a < nr_cpus());
        assert!(nr_cpus().is_power_of_two());
        let p = PerCpu::new(|| AtomicUsize::new(0));
        p.local().fetch_add(1, Ordering::Relaxed);
        assert_eq!(
            p.iter().map(|c| c.load(Ordering::Relaxed)).sum::<usize>(),
            1
        );
        let other = std::thread::spawn(cpu_id).join().unwrap();
        assert!(other < nr_cpus());
    }
}
