//! Soft-dirty tracking and `/proc/pid/clear_refs`: which pages were written
//! since the last reset, as Linux x86-64 with `CONFIG_MEM_SOFT_DIRTY`
//! tracks them.
//!
//! A page reads soft-dirty in [`pagemap`](AddressSpace::pagemap) when its
//! page-table entry has the soft-dirty bit (x86's `_PAGE_SOFT_DIRTY`) or
//! its VMA has [`VmFlags::SOFTDIRTY`]:
//!
//! - every write fault sets the entry's bit with the write access (a new
//!   frame, a copy-on-write copy, a reused frame, a shared object's page:
//!   x86's `pte_mkdirty` sets `_PAGE_SOFT_DIRTY` too); a moved entry gets it
//!   (mremap copying entries one by one; a PTE table relinked whole keeps
//!   its entries' bits, as Linux's `move_normal_pmd` does); fork's copies
//!   keep it.
//! - new memory gets the VMA bit: mmap (also when it merges into a
//!   neighbour) and brk growth. Stack growth and mremap do not set it (the
//!   moved VMA keeps the old VMA's flags), as in Linux.
//! - [`ClearRefs::SoftDirty`] clears the VMA bit of every VMA and, under
//!   each PTE table's lock, the entry bit and the write permission of every
//!   present entry, then flushes the TLB (translators included). The next
//!   write to any page faults, and the fault sets the bit again (reusing
//!   the frame when it is the entry's own, so no copy is made).
//! - a page a device has pinned (vm-memory slices, `translate::guest`)
//!   is written without a fault: pinning sets its entry's bit, and the
//!   reset leaves a pinned page's entry as it is, so it reads soft-dirty
//!   until the first reset after its last pin is dropped (as VFIO reports
//!   every pinned page dirty; Linux's `clear_soft_dirty` skips such a
//!   PTE, `pte_is_pinned`).
//! - a 2 MiB page (a PMD leaf) is reset whole, its one bit cleared and
//!   the leaf write-protected, pinned subpages or not: Linux 6.x's
//!   `clear_soft_dirty_pmd` looks at no pin, and skipping the pinned
//!   subpages alone would split the leaf. As in Linux, a device's writes
//!   through a pin held across the reset then leave the huge page reading
//!   clean until the guest writes it (a fault that reuses the page whole,
//!   pins and all: `mm::thp::huge_wp_fault`).
//!
//! Invariant: a writable present entry has `SOFT_DIRTY`, or lies in a VMA
//! with `VM_SOFTDIRTY`. So a write that needs no fault is already
//! recorded. Two paths would otherwise break it, and keep it here: a read
//! fault in a shared mapping maps the page read-only once the VMA lost its
//! bit (`shared_fault_flags`, Linux's `vma_wants_writenotify`), and
//! mprotect does not make a clean entry of such a VMA writable
//! (`needs_write_fault`, Linux's `pte_needs_soft_dirty_wp`).
//!
//! # What merges lose
//!
//! Merging ignores `VM_SOFTDIRTY` (two VMAs differing only there merge),
//! and the merged VMA has one bit for all its pages, so soft-dirty is
//! imprecise across merges, as in Linux's code (6.18, before sticky VMA
//! flags; the kernel the tests run on lacks `CONFIG_MEM_SOFT_DIRTY`, so
//! these bits follow that reading while the merges themselves are compared
//! with the kernel):
//!
//! - an mmap next to a cleared VMA that merges with it marks the whole
//!   merged VMA soft-dirty: clean pages of the old VMA read written.
//! - a change of flags (mprotect, madvise, mlock, a name) that merges a
//!   range into a neighbour gives the merged VMA the flags of the range
//!   that changed: a cleared range merged into a new VMA drops that VMA's
//!   bit, and its pages never written (with no entry of their own) read
//!   clean from then on, though the memory is new since the reset.
//!
//! Dirty tracking that must survive merges uses uffd write-protection
//! (`PAGEMAP_SCAN`) instead.
//!
//! # Locking
//!
//! [`ClearRefs::SoftDirty`] takes the mmap_lock write side and write-locks
//! each VMA whose bit it clears (so no per-VMA fault that read the old
//! flags is still running when its entries are visited); the entries are
//! changed under their PTE tables' locks (ordered against every fault's
//! install by that lock), and one flush follows before the lock is
//! released. Linux walks the entries under the read side; holding the
//! write side is stricter and keeps the protocol to one lock order. The
//! accessed-bit resets take the read side. Order: [`crate::mm`].

use super::edit::Edit;
use super::{Access, AddressSpace};
use crate::addr::Range;
use crate::error::{Error, Result};
use crate::pt::{Pte, PteFlags};
use crate::vma::VmFlags;

/// What a write fault adds to the entry it makes writable: dirty,
/// accessed and soft-dirty (x86's `pte_mkdirty` sets both dirty bits).
pub(crate) const WRITTEN: PteFlags = PteFlags::DIRTY
    .union(PteFlags::ACCESSED)
    .union(PteFlags::SOFT_DIRTY);

/// Entry bits a permission change keeps (the userfault write-protect bit
/// too: a protected page stays protected, `can_change_pte_writable`).
pub(crate) const KEPT: PteFlags = PteFlags::DIRTY
    .union(PteFlags::ACCESSED)
    .union(PteFlags::SOFT_DIRTY)
    .union(PteFlags::UFFD_WP);

/// True if an entry with `pte` bits in a VMA with `vma` flags must stay
/// write-protected so that its next write faults and is recorded: the VMA
/// lost its soft-dirty bit and the entry has none (Linux's
/// `pte_needs_soft_dirty_wp`).
pub(crate) fn needs_write_fault(vma: VmFlags, pte: PteFlags) -> bool {
    !vma.contains(VmFlags::SOFTDIRTY) && !pte.contains(PteFlags::SOFT_DIRTY)
}

/// The entry bits of a shared object's page mapped by a fault for
/// `access` in a shared VMA with `flags`: a write maps it written; a read
/// maps it writable only while the VMA is soft-dirty (after a reset the
/// first write must fault, Linux's `vma_wants_writenotify`).
pub(crate) fn shared_fault_flags(flags: VmFlags, access: Access) -> PteFlags {
    let f = PteFlags::from(flags);
    if access == Access::Write {
        f | WRITTEN
    } else if needs_write_fault(flags, PteFlags::empty()) {
        f - PteFlags::WRITE
    } else {
        f
    }
}

/// What [`AddressSpace::clear_refs`] resets: the values Linux accepts in
/// `/proc/pid/clear_refs` (`enum clear_refs_types`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ClearRefs {
    /// `1`: the accessed bit of every page.
    All = 1,
    /// `2`: the accessed bit of anonymous pages (VMAs with no object).
    Anon = 2,
    /// `3`: the accessed bit of object pages (memfds and shared anonymous
    /// memory, which Linux backs with a shmem file).
    Mapped = 3,
    /// `4`: soft-dirty tracking (see the [module docs](self)).
    SoftDirty = 4,
    /// `5`: the peak resident size. aspace keeps none, so this does
    /// nothing (Linux resets `VmHWM`).
    MmHiwaterRss = 5,
}

impl ClearRefs {
    /// The value written to `/proc/pid/clear_refs`; `EINVAL` for anything
    /// but 1 to 5, as Linux answers.
    pub fn from_raw(v: i64) -> Result<ClearRefs> {
        Ok(match v {
            1 => ClearRefs::All,
            2 => ClearRefs::Anon,
            3 => ClearRefs::Mapped,
            4 => ClearRefs::SoftDirty,
            5 => ClearRefs::MmHiwaterRss,
            _ => return Err(Error::Inval),
        })
    }
}

impl AddressSpace {
    /// Resets page-reference state, like writing `what` to
    /// `/proc/pid/clear_refs`.
    ///
    /// [`ClearRefs::SoftDirty`] starts a new soft-dirty interval: when it
    /// returns, every page reads clean in [`pagemap`](Self::pagemap), and
    /// any write from then on (through [`write`](Self::write), a fault or a
    /// [`Translator`](crate::Translator), whose cached translations are
    /// flushed) makes its page read soft-dirty again. A write racing the
    /// call may be recorded or not; none after it is lost.
    ///
    /// Known loss, as in Linux: VMAs merge regardless of their soft-dirty
    /// bit, and one bit covers a whole VMA. An mmap that merges with a
    /// cleared neighbour makes every page of the neighbour read soft-dirty;
    /// an mprotect (or madvise, mlock, name change) that merges a cleared
    /// range into a newer VMA makes that VMA's untouched pages read clean.
    /// See the [module docs](crate::mm::soft_dirty).
    ///
    /// ```
    /// use aspace::{AddressSpace, ClearRefs, Config, MapFlags, Prot};
    /// let mm = AddressSpace::new(Config::default());
    /// let a = mm.mmap(0, 2 * 4096, Prot::READ | Prot::WRITE,
    ///                 MapFlags::PRIVATE | MapFlags::ANONYMOUS).unwrap();
    /// mm.write(a, b"x").unwrap();
    /// mm.clear_refs(ClearRefs::SoftDirty);
    /// mm.write(a + 4096, b"y").unwrap();
    /// let pm = mm.pagemap(a, 2 * 4096).unwrap();
    /// assert!(!pm[0].is_soft_dirty() && pm[1].is_soft_dirty());
    /// ```
    pub fn clear_refs(&self, what: ClearRefs) {
        match what {
            ClearRefs::SoftDirty => self.clear_soft_dirty(),
            ClearRefs::All => self.clear_accessed(|_| true),
            ClearRefs::Anon => self.clear_accessed(|has_object| !has_object),
            ClearRefs::Mapped => self.clear_accessed(|has_object| has_object),
            ClearRefs::MmHiwaterRss => {}
        }
    }

    /// [`ClearRefs::SoftDirty`]: the protocol is in the module docs.
    fn clear_soft_dirty(&self) {
        let ed = Edit::begin(self);
        let vmas = ed.vmas_in(Range::new(0, self.cfg.task_size));
        for &v in &vmas {
            let f = v.flags();
            if f.contains(VmFlags::SOFTDIRTY) {
                // Drains the per-VMA faults that read the old flags.
                ed.lock(v);
                v.set_flags(f - VmFlags::SOFTDIRTY);
            }
        }
        let mut gather = ed.gather();
        let g = self.pt.pin();
        let frames = &self.frames;
        for v in &vmas {
            self.pt.change_range(v.range(), &g, |va, pte| {
                // Pins are taken under the read side we exclude. A pinned
                // page of a PMD leaf (whose lock `change_range` holds
                // while it asks) is cleared with the leaf, as Linux's
                // `clear_soft_dirty_pmd`, which looks at no pin: no split.
                if frames.maybe_pinned(pte.pfn()) && self.pt.huge_at(va, &g).is_none() {
                    return pte;
                }
                if pte.is_writable() {
                    gather.add_page(va);
                }
                Pte::new(
                    pte.pfn(),
                    pte.flags() - PteFlags::WRITE - PteFlags::SOFT_DIRTY,
                )
            });
        }
        gather.flush();
    }

    /// Clears the accessed bit of the entries of the VMAs `pick(has an
    /// object)` selects, under the mmap_lock read side. No flush: like
    /// Linux's `ptep_test_and_clear_young` on x86, a stale translation only
    /// delays the next accessed mark.
    fn clear_accessed(&self, pick: impl Fn(bool) -> bool) {
        let _st = self.mmap_lock.read();
        let tg = self.tree.pin();
        let g = self.pt.pin();
        for (r, v) in self.tree.range(Range::new(0, self.cfg.task_size), &tg) {
            if !pick(v.has_shmem()) {
                continue;
            }
            self.pt.change_range(r, &g, |_, pte| {
                Pte::new(pte.pfn(), pte.flags() - PteFlags::ACCESSED)
            });
        }
    }
}

#[cfg(all(test, not(aspace_loom)))]
mod tests {
    use super::*;
    use crate::{Config, MapFlags, Prot, PAGE_SIZE};

    #[test]
    fn raw_values_follow_linux() {
        for v in 1..=5 {
            assert_eq!(ClearRefs::from_raw(v).unwrap() as i64, v);
        }
        for v in [0, 6, -1, i64::MAX] {
            assert_eq!(ClearRefs::from_raw(v), Err(Error::Inval));
        }
    }

    #[test]
    fn accessed_bits_clear_by_kind() {
        let mm = AddressSpace::new(Config::default());
        let rw = Prot::READ | Prot::WRITE;
        let anon = mm
            .mmap(0, PAGE_SIZE, rw, MapFlags::PRIVATE | MapFlags::ANONYMOUS)
            .unwrap();
        let shared = mm
            .mmap(0, PAGE_SIZE, rw, MapFlags::SHARED | MapFlags::ANONYMOUS)
            .unwrap();
        mm.write(anon, b"a").unwrap();
        mm.write(shared, b"s").unwrap();
        let accessed = |a| {
            let g = mm.pt.pin();
            mm.pt.lookup(a, &g).flags().contains(PteFlags::ACCESSED)
        };
        assert!(accessed(anon) && accessed(shared));
        mm.clear_refs(ClearRefs::Anon);
        assert!(!accessed(anon) && accessed(shared));
        mm.write(anon, b"b").unwrap(); // no fault: the entry is writable
        mm.clear_refs(ClearRefs::Mapped);
        assert!(!accessed(shared));
        mm.clear_refs(ClearRefs::MmHiwaterRss);
        // Soft-dirty state is not touched by the accessed-bit resets.
        let pm = mm.pagemap(anon, PAGE_SIZE).unwrap();
        assert!(pm[0].is_soft_dirty());
    }
}
