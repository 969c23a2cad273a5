//! Event counters that every path updates cheaply.
//!
//! Each CPU slot has its own cache line of counters (see `percpu`),
//! so the fault path's only shared write stays the VMA's refcount. A
//! [`Stats`] snapshot sums the slots; it is exact once the counted
//! operations have finished, and a good estimate while they run.
//!
//! # Locking
//!
//! None: per-CPU relaxed counters, read as a sum. Order of the locks that
//! do exist: [`crate::mm`].

use crate::percpu::PerCpu;
use crate::sync::counter::{AtomicU64, Ordering};
use core::fmt;

macro_rules! counters {
    ($( $(#[$doc:meta])* $name:ident ),* $(,)?) => {
        /// One counted event.
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(usize)]
        pub(crate) enum Event { $( $name, )* }

        const NR_EVENTS: usize = [$( Event::$name ),*].len();

        /// A snapshot of an address space's counters.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct Stats {
            $( $(#[$doc])* pub $name: u64, )*
        }

        impl Stats {
            fn from_array(a: &[u64; NR_EVENTS]) -> Stats {
                Stats { $( $name: a[Event::$name as usize], )* }
            }

            /// (name, value) of every counter, in declaration order.
            pub fn counters(&self) -> [(&'static str, u64); NR_EVENTS] {
                [$( (stringify!($name), self.$name), )*]
            }
        }

        impl core::ops::Sub for Stats {
            type Output = Stats;

            /// The events between two snapshots (`later - earlier`); a
            /// counter that went backwards (snapshots of a running system
            /// are estimates) reads 0.
            fn sub(self, earlier: Stats) -> Stats {
                Stats { $( $name: self.$name.saturating_sub(earlier.$name), )* }
            }
        }
    };
}

impl fmt::Display for Stats {
    /// The non-zero counters, one `name value` per line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut any = false;
        for (name, v) in self.counters() {
            if v != 0 {
                writeln!(f, "{name:<24} {v}")?;
                any = true;
            }
        }
        if !any {
            writeln!(f, "(no events)")?;
        }
        Ok(())
    }
}

counters! {
    /// Faults completed under the faulting VMA's lock alone.
    fault_per_vma,
    /// Faults completed under the mmap_lock read side (the MmapLock mode,
    /// or a per-VMA attempt that fell back).
    fault_mmap_lock,
    /// Per-VMA attempts abandoned because the VMA was write-locked.
    retry_write_locked,
    /// Lookups that found a detached VMA and walked the tree again.
    retry_detached,
    /// Per-VMA attempts abandoned because the VMA object had been reused
    /// for another range or address space (revalidation failed).
    retry_revalidate,
    /// Per-VMA attempts abandoned because the VMA first needed an anon_vma
    /// and the mmap_lock could not be try-locked.
    retry_anon_vma,
    /// Per-VMA attempts abandoned because the lockless lookup found no VMA
    /// (the mmap_lock path gives the definitive answer).
    retry_no_vma,
    /// Per-VMA attempts abandoned for reader-count overflow.
    retry_overflow,
    /// Faults answered with SIGSEGV, no mapping (`SEGV_MAPERR`).
    segv_maperr,
    /// Faults answered with SIGSEGV, access denied (`SEGV_ACCERR`).
    segv_accerr,
    /// Faults answered with SIGBUS (no backing object).
    sigbus,
    /// Faults that ran out of memory (frames or page tables).
    fault_oom,
    /// Faults that found the page already present (raced or spurious).
    fault_spurious,
    /// Copy-on-write faults that copied a frame.
    cow_copies,
    /// Copy-on-write faults that reused the last reference in place.
    cow_reuses,
    /// TLB flushes issued (one per flushed range).
    tlb_flushes,
    /// Pages covered by those flushes.
    tlb_pages_flushed,
    /// Shootdowns sent to other CPUs of the address space.
    tlb_shootdowns,
    /// Soft TLBs ([`crate::Translator`]) of other threads that flushes
    /// invalidated (each one's entries dropped, its access in flight
    /// waited for): only those that may have cached what the flush
    /// changed (the targeted flush, `tlb` module docs).
    translator_shootdowns,
    /// Translator misses that walked the page table (an access whose
    /// page no cached entry covered with the rights it needed).
    translator_walks,
    /// Translator misses of a 4 KiB entry served by a cached 2 MiB entry
    /// (a PMD leaf cached as one translation), with no walk.
    translator_huge_hits,
    /// Page-table entries mremap moved one by one.
    mremap_ptes_moved,
    /// PTE tables mremap moved whole by relinking their PMD entry.
    mremap_tables_relinked,
    /// VMA objects handed out again from the type-stable cache.
    vma_reused,
    /// anon_vma (family root) lock acquisitions.
    anon_vma_lock,
    /// Of those, acquisitions that found the lock held (try-lock failed).
    anon_vma_lock_contended,
    /// Faults completed speculatively (no VMA lock, no mmap_lock).
    fault_speculative,
    /// Speculative attempts abandoned: the VMA was write-locked, or its
    /// stamp was not yet published (`stamp >= mm sequence`) at the snapshot.
    spec_abort_locked,
    /// Speculative attempts abandoned: no attached VMA of this address
    /// space covered the address, or the access was not allowed.
    spec_abort_lookup,
    /// Speculative attempts abandoned: the fault needs more than an
    /// install (a shared object, a copy-on-write, a huge page), or a first
    /// write found the mmap_lock taken for its anon_vma.
    spec_abort_needs_more,
    /// Speculative attempts abandoned: the PTE table was missing, or its
    /// span is not wholly inside the VMA (a neighbour could have made it).
    spec_abort_table,
    /// Speculative attempts abandoned under the PTE lock: the VMA's stamp
    /// moved (or it was detached) since the snapshot.
    spec_abort_stamp,
    /// Speculative attempts abandoned: no free frame (PerVma retries).
    spec_abort_oom,
    /// Speculative faults that gave their VMA its first anon_vma (its
    /// first write), under the mmap_lock read side, try-locked.
    spec_anon_vma_prepared,
    /// Faults handed to a userfault handler (events queued).
    userfaults,
    /// Writes to write-protected pages resolved without a handler (the
    /// `wp_async` feature: the page is only marked written).
    uffd_wp_async,
    /// Faults that mapped a 2 MiB page (Linux's `thp_fault_alloc`).
    thp_fault_alloc,
    /// Faults that could have mapped a 2 MiB page but got no huge frame
    /// (no 2 MiB of budget, or no 512 aligned free frames) and mapped a
    /// 4 KiB page (`thp_fault_fallback`).
    thp_fault_fallback,
    /// Read faults that mapped the huge zero page
    /// (`thp_zero_page_alloc` counts its one allocation in Linux; this
    /// counts its mappings).
    thp_zero_page_mapped,
    /// PMD entries split into 512 PTEs (`thp_split_pmd`).
    thp_split_pmd,
    /// 2 MiB spans collapsed into a huge page (`thp_collapse_alloc`).
    thp_collapse_alloc,
    /// Huge frames rebuilt for a THP fault or collapse from the 512 free
    /// 4 KiB frames of one aligned block, freed one by one, when no huge
    /// frame was free whole (see `phys::reassemble`). Linux's buddy
    /// allocator merges freed pages as they are freed, uncounted; its
    /// counterpart of a rebuild that needs work is a successful
    /// compaction (`compact_success`).
    thp_frame_rebuilt,
}

pub(crate) struct StatCounters {
    slots: PerCpu<[AtomicU64; NR_EVENTS]>,
}

impl StatCounters {
    pub(crate) fn new() -> Self {
        StatCounters {
            slots: PerCpu::new(|| core::array::from_fn(|_| AtomicU64::new(0))),
        }
    }

    /// Counts one event on the calling CPU's slot.
    #[inline]
    pub(crate) fn inc(&self, e: Event) {
        self.add(e, 1);
    }

    /// Counts `n` events on the calling CPU's slot.
    #[inline]
    pub(crate) fn add(&self, e: Event, n: u64) {
        // A plain load+store is enough: each slot is written by its own CPU
        // almost always; a rare collision of two threads on one slot can
        // lose a count, so use the atomic add (uncontended, no bounce).
        self.slots.local()[e as usize].fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> Stats {
        let mut sum = [0u64; NR_EVENTS];
        for slot in self.slots.iter() {
            for (s, c) in sum.iter_mut().zip(slot.iter()) {
                *s += c.load(Ordering::Relaxed);
            }
        }
        Stats::from_array(&sum)
    }
}

impl Stats {
    /// All faults that completed (either path).
    pub fn faults(&self) -> u64 {
        self.fault_per_vma + self.fault_mmap_lock + self.fault_speculative
    }

    /// Speculative attempts abandoned for any reason (each then ran the
    /// PerVma path).
    pub fn spec_aborts(&self) -> u64 {
        self.spec_abort_locked
            + self.spec_abort_lookup
            + self.spec_abort_needs_more
            + self.spec_abort_table
            + self.spec_abort_stamp
            + self.spec_abort_oom
    }

    /// Per-VMA attempts abandoned for any reason.
    pub fn retries(&self) -> u64 {
        self.retry_write_locked
            + self.retry_revalidate
            + self.retry_anon_vma
            + self.retry_no_vma
            + self.retry_overflow
    }
}

#[cfg(all(test, not(aspace_loom)))]
mod tests {
    use super::*;

    #[test]
    fn counts_sum_across_threads() {
        let c = crate::sync::Arc::new(StatCounters::new());
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let c = c.clone();
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        c.inc(Event::fault_per_vma);
                    }
                    c.add(Event::tlb_pages_flushed, 7);
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        let s = c.snapshot();
        assert_eq!(s.fault_per_vma, 4000);
        assert_eq!(s.tlb_pages_flushed, 28);
        assert_eq!(s.faults(), 4000);
    }
}
