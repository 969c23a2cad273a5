//! The VMA hint of the speculative fault: per CPU, the VMA its last
//! speculative fault found in the tree, so that the next faults in that
//! VMA (an emulator's or a loader's run of small mappings) skip the tree
//! walk, whose depth grows with the number of VMAs. With it, the VMAs
//! that follow it in the tree leaf the walk read (up to [`AHEAD`]): a
//! thread faulting upward through a run of small VMAs finds the next one
//! among them and walks the tree once per `AHEAD + 1` VMAs, not once per
//! VMA.
//!
//! A hint is only a candidate. The speculative fault validates it exactly
//! as it validates what the tree returns (stamp below the mm sequence,
//! then address space id, range and attachment; see
//! [`crate::mm::spec_fault`]), because the tree may also return an object
//! that was detached and recycled since: the epoch keeps tree nodes alive,
//! not the identity of the VMA objects they point to. A hint only widens
//! how stale a candidate can be, which that validation never bounded; a
//! VMA that followed the found one in its leaf is such a candidate too.
//! An object reached through a hint is still memory: VMA objects are
//! type-stable for the life of their pool ([`crate::vma::pool`]), which
//! the address space holding the hint keeps alive, and a hint only ever
//! names an object found in this space's tree (so in its pool).
//!
//! # Locking
//!
//! None. A slot is a few atomic pointers on the CPU's own line, stored
//! (`Release`) only when the CPU's fault moves to another VMA and loaded
//! (`Acquire`, so the object's making, which happened before the tree
//! published it to the storing thread, happens before our reads of it).
//! Threads sharing a slot (preempted on one CPU, or fallback ids) only
//! overwrite each other's hint. Order of the locks that exist:
//! [`crate::mm`].

use crate::percpu::PerCpu;
use crate::sync::{AtomicPtr, Ordering};
use crate::tree::ForestAround;
use crate::vma::{Vma, VmaRef};

/// How many VMAs after the hinted one a slot keeps as candidates.
pub(crate) const AHEAD: usize = 2;

/// One CPU's hint: the VMA its last tree walk found, then the VMAs after
/// it in that walk's leaf, in address order; null for none.
struct Slot {
    /// Protected by: atomics (a hint, validated by its user).
    vmas: [AtomicPtr<Vma>; AHEAD + 1],
}

/// One hint per CPU slot.
pub(crate) struct VmaHints {
    slots: PerCpu<Slot>,
}

/// The object behind a hint pointer.
///
/// # Safety
///
/// `p` is null or was stored by [`VmaHints::set`] of this space.
unsafe fn hinted(p: *mut Vma) -> Option<VmaRef> {
    // SAFETY: a non-null hint was stored by `set` from a `VmaRef` of this
    // space's tree, so it points into this space's VMA pool, whose
    // objects are never deallocated while the space (the holder of the
    // hints, and of the pool) lives.
    Some(unsafe { VmaRef::from_vma(p.as_ref()?) })
}

impl VmaHints {
    /// No hints; the slots are made on first use.
    pub(crate) fn new() -> Self {
        VmaHints {
            slots: PerCpu::new(|| Slot {
                vmas: core::array::from_fn(|_| AtomicPtr::new(core::ptr::null_mut())),
            }),
        }
    }

    /// The calling CPU's hint, if its range (read without validation:
    /// the caller validates) contains `addr`; else, for an address above
    /// it, the first VMA after it that contains `addr`, which becomes the
    /// hint (the window moves up to it).
    #[inline]
    pub(crate) fn get(&self, addr: u64) -> Option<VmaRef> {
        let slot = self.slots.local();
        // SAFETY: the slot's pointers are only stored by `set`.
        let v = unsafe { hinted(slot.vmas[0].load(Ordering::Acquire))? };
        let r = v.range();
        if r.contains(addr) {
            return Some(v);
        }
        if addr < r.end {
            return None;
        }
        self.ahead(slot, addr)
    }

    /// The VMA after the hinted one holding `addr`, moved to the front.
    #[cold]
    fn ahead(&self, slot: &Slot, addr: u64) -> Option<VmaRef> {
        for i in 1..=AHEAD {
            // SAFETY: the slot's pointers are only stored by `set`.
            let v = unsafe { hinted(slot.vmas[i].load(Ordering::Relaxed))? };
            if v.range().contains(addr) {
                for j in 0..=AHEAD {
                    let p = slot
                        .vmas
                        .get(j + i)
                        .map_or(core::ptr::null_mut(), |n| n.load(Ordering::Relaxed));
                    slot.vmas[j].store(p, Ordering::Release);
                }
                return Some(v);
            }
        }
        None
    }

    /// Makes the VMA a tree walk found (`around`, in this space's tree)
    /// the calling CPU's hint, with the VMAs after it in its leaf as the
    /// look-ahead, writing the slot only if the hint changes.
    #[inline]
    pub(crate) fn set(&self, around: &ForestAround<'_, VmaRef>) {
        let slot = self.slots.local();
        let ptr = |v: &VmaRef| &**v as *const Vma as *mut Vma;
        let p = ptr(around.entry().1);
        if slot.vmas[0].load(Ordering::Relaxed) == p {
            return;
        }
        slot.vmas[0].store(p, Ordering::Release);
        for (d, s) in (1..).zip(&slot.vmas[1..]) {
            let n = around
                .nearby(d)
                .map_or(core::ptr::null_mut(), |(_, n)| ptr(n));
            s.store(n, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::AHEAD;
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

    /// A fault through a run of small VMAs walks the tree once per
    /// `AHEAD + 1` of them: the VMAs after the hinted one are found through
    /// the hint's look-ahead, which moves up to each.
    #[test]
    fn the_next_vmas_come_from_the_look_ahead() {
        let mm = AddressSpace::new(Config::default());
        let rw = Prot::READ | Prot::WRITE;
        let n = 4 * (AHEAD as u64 + 1);
        let a = mm.mmap(0, n * 4 * PAGE_SIZE, rw, anon()).unwrap();
        // Cut it into VMAs of four pages, as pft does.
        for i in (1..n).step_by(2) {
            mm.mprotect(a + i * 4 * PAGE_SIZE, 4 * PAGE_SIZE, rw | Prot::EXEC)
                .unwrap();
        }
        // The thread may move to another CPU between two calls: retry the
        // whole run until one ran on one CPU.
        let ok = (0..100).any(|_| {
            let g = mm.tree.pin();
            mm.vma_hints.set(&mm.tree.find_around(a, &g).unwrap());
            (1..=AHEAD as u64).all(|i| {
                let at = a + i * 4 * PAGE_SIZE;
                mm.vma_hints
                    .get(at + PAGE_SIZE)
                    .is_some_and(|v| v.start() == at)
                    && mm.vma_hints.get(at).is_some_and(|v| v.start() == at)
            }) && mm.vma_hints.get(a).is_none()
        });
        assert!(ok, "the look-ahead did not find the next VMAs");
        // Faulting every page of every VMA in order completes each
        // speculatively; the run's VMAs are all hinted or walked.
        for p in 0..n * 4 {
            mm.fault(a + p * PAGE_SIZE, Access::Write).unwrap();
        }
        assert_eq!(mm.stats().fault_speculative, n * 4);
    }

    /// A look-ahead entry whose object was taken back for another range
    /// is refused too: the old address faults as a hole.
    #[test]
    fn a_stale_look_ahead_entry_is_refused() {
        let mm = AddressSpace::new(Config::default());
        let rw = Prot::READ | Prot::WRITE;
        let a = mm.mmap(0, 32 * PAGE_SIZE, rw, anon()).unwrap();
        mm.mprotect(a + 16 * PAGE_SIZE, 16 * PAGE_SIZE, rw | Prot::EXEC)
            .unwrap();
        let b = a + 16 * PAGE_SIZE;
        // The hint is `[a, b)`, its look-ahead the object of
        // `[b, b + 16 pages)`, which is then unmapped and taken back for a
        // range far above.
        let g = mm.tree.pin();
        mm.vma_hints.set(&mm.tree.find_around(a, &g).unwrap());
        drop(g);
        mm.munmap(b, 16 * PAGE_SIZE).unwrap();
        let c = mm
            .mmap(a + (64 << 20), 16 * PAGE_SIZE, rw, anon() | MapFlags::FIXED)
            .unwrap();
        assert!(mm.stats().vma_reused >= 1, "the object was recycled");
        assert_eq!(
            mm.fault(b + PAGE_SIZE, Access::Write),
            Err(FaultError::NoMapping)
        );
        assert!(mm.translate(b + PAGE_SIZE).is_none());
        mm.fault(c, Access::Write).unwrap();
        assert_eq!(mm.frames_used(), 1);
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
