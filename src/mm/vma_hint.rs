//! The VMA hint of the speculative fault: per CPU, the VMA its last
//! speculative fault found in the tree, so that the next faults in that
//! VMA (an emulator's or a loader's run of small mappings) skip the tree
//! walk, whose depth grows with the number of VMAs.
//!
//! A hint is only a candidate. The speculative fault validates it exactly
//! as it validates what the tree returns (stamp below the mm sequence,
//! then address space id, range and attachment; see
//! [`crate::mm::spec_fault`]), because the tree may also return an object
//! that was detached and recycled since: the epoch keeps tree nodes alive,
//! not the identity of the VMA objects they point to. A hint only widens
//! how stale a candidate can be, which that validation never bounded.
//! An object reached through a hint is still memory: VMA objects are
//! type-stable for the life of their pool ([`crate::vma::pool`]), which
//! the address space holding the hint keeps alive, and a hint only ever
//! names an object found in this space's tree (so in its pool).
//!
//! # Locking
//!
//! None. A slot is one atomic pointer on the CPU's own line, stored
//! (`Release`) only when the CPU's fault moves to another VMA and loaded
//! (`Acquire`, so the object's making, which happened before the tree
//! published it to the storing thread, happens before our reads of it).
//! Threads sharing a slot (preempted on one CPU, or fallback ids) only
//! overwrite each other's hint. Order of the locks that exist:
//! [`crate::mm`].

use crate::percpu::PerCpu;
use crate::sync::{AtomicPtr, Ordering};
use crate::vma::{Vma, VmaRef};

/// One hint per CPU slot.
pub(crate) struct VmaHints {
    /// The VMA object each CPU's last speculative fault found in the
    /// tree; null for none.
    /// Protected by: atomics (a hint, validated by its user).
    slots: PerCpu<AtomicPtr<Vma>>,
}

impl VmaHints {
    /// No hints; the slots are made on first use.
    pub(crate) fn new() -> Self {
        VmaHints {
            slots: PerCpu::new(|| AtomicPtr::new(core::ptr::null_mut())),
        }
    }

    /// The calling CPU's hint, if its range (read without validation:
    /// the caller validates) contains `addr`.
    #[inline]
    pub(crate) fn get(&self, addr: u64) -> Option<VmaRef> {
        let p = self.slots.local().load(Ordering::Acquire);
        // SAFETY: a non-null hint was stored by `set` from a `VmaRef` of
        // this space's tree, so it points into this space's VMA pool,
        // whose objects are never deallocated while the space (the holder
        // of `self`, and of the pool) lives.
        let v = unsafe { VmaRef::from_vma(p.as_ref()?) };
        v.range().contains(addr).then_some(v)
    }

    /// Makes `v` (found in this space's tree) the calling CPU's hint,
    /// writing the slot only if it changes.
    #[inline]
    pub(crate) fn set(&self, v: VmaRef) {
        let slot = self.slots.local();
        let p = &*v as *const Vma as *mut Vma;
        if slot.load(Ordering::Relaxed) != p {
            slot.store(p, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{Access, AddressSpace, Config, FaultError, MapFlags, Prot, PAGE_SIZE};

    fn anon() -> MapFlags {
        MapFlags::PRIVATE | MapFlags::ANONYMOUS
    }

    /// A speculative fault leaves its VMA as the CPU's hint, and the next
    /// faults in that VMA complete speculatively through it.
    #[test]
    fn a_fault_leaves_its_vma_as_the_hint() {
        let mm = AddressSpace::new(Config::default());
        let rw = Prot::READ | Prot::WRITE;
        let a = mm.mmap(0, 64 * PAGE_SIZE, rw, anon()).unwrap();
        mm.fault(a, Access::Write).unwrap();
        mm.fault(a + PAGE_SIZE, Access::Write).unwrap();
        // The thread may have moved to another CPU between the fault and
        // this look; fault once more until both ran on one CPU.
        let hinted = (0..100).any(|i| {
            mm.fault(a + (2 + i % 60) * PAGE_SIZE, Access::Write)
                .unwrap();
            mm.vma_hints
                .get(a + 63 * PAGE_SIZE)
                .is_some_and(|v| v.start() == a)
        });
        assert!(hinted, "no hint after faults in one VMA");
        assert!(mm.stats().fault_speculative >= 2);
    }

    /// A hint whose object was taken back for another range is refused:
    /// the old address faults as a hole, the new range as itself.
    #[test]
    fn a_stale_hint_is_refused() {
        let mm = AddressSpace::new(Config::default());
        let rw = Prot::READ | Prot::WRITE;
        let a = mm.mmap(0, 16 * PAGE_SIZE, rw, anon()).unwrap();
        mm.fault(a, Access::Write).unwrap();
        mm.fault(a + PAGE_SIZE, Access::Write).unwrap();
        mm.munmap(a, 16 * PAGE_SIZE).unwrap();
        let b = mm
            .mmap(a + (64 << 20), 16 * PAGE_SIZE, rw, anon() | MapFlags::FIXED)
            .unwrap();
        assert!(mm.stats().vma_reused >= 1, "the object was recycled");
        assert!(mm.vma_hints.get(a + 2 * PAGE_SIZE).is_none());
        assert_eq!(
            mm.fault(a + 2 * PAGE_SIZE, Access::Write),
            Err(FaultError::NoMapping)
        );
        mm.fault(b, Access::Write).unwrap();
        mm.fault(b + PAGE_SIZE, Access::Write).unwrap();
        assert!(mm.translate(b + PAGE_SIZE).is_some());
        assert_eq!(mm.frames_used(), 2);
    }
}
