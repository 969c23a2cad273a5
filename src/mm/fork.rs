//! fork: a copy-on-write copy of the address space.
//!
//! Linux's `dup_mmap`, modelled: under the parent's mmap_lock write side,
//! each parent VMA is write-locked (so no fault on the per-VMA path runs
//! in it while it is copied) and copied into the child. For private
//! anonymous VMAs that have an anon_vma, the child VMA gets a new anon_vma
//! chained to the parent's (same root, same lock: `anon_vma_fork`), and
//! every present page-table entry is copied: the frame gains a reference
//! and both entries lose write access, so the first write on either side
//! copies the frame (or reuses it if it holds the last reference, see
//! [`crate::mm::fault`]). The parent's translations are flushed (through
//! the TLB model, waiting out user accesses that began before) before its
//! mmap_lock is released. VMAs without an anon_vma map only the zero page
//! and shared mappings have a backing object: their entries are not
//! copied, the child faults them again (as Linux skips such VMAs in
//! `copy_page_range`). No page data is copied by fork itself, but for
//! pages a device has pinned (vm-memory slices, `translate::guest`): the
//! child gets a copy of such a page and the parent keeps its entry as it
//! was (Linux's `copy_present_page` for `folio_needs_cow_for_dma`), so the
//! device keeps reaching the parent's page and never the child's.
//!
//! Everything is done in bulk, as Linux's fork since `__mt_dup`: one pass
//! over the parent's VMAs decides what each copy is (`Dup`); the copies
//! are linked to their anon_vma families one lock acquisition per run of
//! consecutive VMAs of a family, with the reverse map filed as a batch;
//! the child's tree is built in one pass with full nodes (never one
//! insert, path copy and retired batch per VMA); and the page tables are
//! copied a PTE table at a time, skipping missing tables
//! ([`crate::pt::PageTable::copy_ranges`]), with one TLB flush for the
//! parent's write-protected entries.
//!
//! The child shares the parent's frame allocator (frame accounting spans
//! the family) and VMA object cache (the reverse map of a family points at
//! VMAs of several address spaces, which must stay type-stable for all).
//!
//! # Locking
//!
//! The parent's mmap_lock write side and the child's (no one else can see
//! the child yet), then family locks one run at a time, then the parent's
//! and child's PTE-table locks one table pair at a time; see [`crate::mm`].

use super::edit::{Edit, VmaSpec};
use super::{next_id, AddressSpace};
use crate::addr::Range;
use crate::error::{Error, Result};
use crate::phys::Pfn;
use crate::pt::{Pte, PteFlags};
use crate::stats::StatCounters;
use crate::sync::Arc;
use crate::tlb::Gather;
use crate::uffd::UFFD_FLAGS;
use crate::vma::{for_each_family_run, link_all, AnonVma, VmFlags, VmaRef};

impl AddressSpace {
    /// A copy-on-write copy of this address space, like `fork(2)`'s
    /// memory side: the same VMAs, break and map count; private
    /// anonymous pages shared write-protected until either side writes;
    /// shared mappings shared. The child is an independent
    /// `AddressSpace` that shares this one's frame allocator, so
    /// [`frames_used`](Self::frames_used) counts the whole family.
    ///
    /// Errors: `ENOMEM` if the child's page table cannot take a copied
    /// entry, or no frame is left for the child's copy of a page a device
    /// has pinned (nothing is leaked: the partial child is torn down).
    /// Fork allocates no other frames.
    ///
    /// ```
    /// use aspace::{AddressSpace, Config, Prot, MapFlags};
    /// let mm = AddressSpace::new(Config::default());
    /// let a = mm.mmap(0, 4096, Prot::READ | Prot::WRITE,
    ///                 MapFlags::PRIVATE | MapFlags::ANONYMOUS).unwrap();
    /// mm.write(a, b"parent").unwrap();
    /// let child = mm.fork().unwrap();
    /// assert_eq!(mm.frames_used(), 1);             // shared, not copied
    /// child.write(a, b"child!").unwrap();          // copy-on-write
    /// assert_eq!(mm.frames_used(), 2);
    /// let mut buf = [0u8; 6];
    /// mm.read(a, &mut buf).unwrap();
    /// assert_eq!(&buf, b"parent");
    /// ```
    pub fn fork(&self) -> Result<AddressSpace> {
        let ed = Edit::begin(self);
        // The child's VMAs must fit the memory budget (its page tables are
        // charged as they are copied).
        if !ed.vma_room(ed.map_count() as u64) {
            return Err(Error::NoMem);
        }
        // A parent with no VMA pool yet has no VMA: the child makes its own.
        let child =
            AddressSpace::with_parts(self.cfg.clone(), self.frames.clone(), self.pool.shared());
        // Resource limits are inherited, as the rlimits of a forked task.
        child.set_stack_limit(self.stack_limit());
        // MMF_DISABLE_THP is in MMF_INIT_MASK: the child inherits it.
        child.set_thp_disable(self.thp_disable());
        child.set_memlock_limit(self.memlock_limit());
        let ok = {
            let mut ced = Edit::begin(&child);
            let (from, to) = (ed.state(), ced.state_mut());
            child.heap.copy_from(&self.heap);
            to.start_stack = from.start_stack;
            let vmas = ed.vmas_in(Range::new(0, self.cfg.task_size));
            // dup_mmap's vma_start_write: no per-VMA fault runs in a parent
            // VMA until the mmap_lock is released. All are locked before
            // any anon_vma lock is taken (never held while waiting for a
            // VMA lock).
            for &v in &vmas {
                ed.lock(v);
            }
            let mut dups = Vec::with_capacity(vmas.len());
            for v in vmas {
                // MADV_DONTFORK: the child does not get this VMA.
                if v.flags().contains(VmFlags::DONTCOPY) {
                    continue;
                }
                // Locks are not inherited (dup_mmap clears VM_LOCKED and
                // VM_LOCKONFAULT).
                // Nor are userfault registrations (dup_userfaultfd without
                // UFFD_FEATURE_EVENT_FORK).
                let flags = v.flags() - VmFlags::LOCKED - VmFlags::LOCKONFAULT - UFFD_FLAGS;
                // The copy's anon_vma is linked below, in bulk.
                let copy = ced.new_vma(VmaSpec {
                    flags,
                    anon: None,
                    uffd: None,
                    ..VmaSpec::like(&v, v.range(), v.pgoff())
                });
                // MADV_WIPEONFORK: the child starts with an empty VMA (no
                // anon_vma, no entries copied).
                let wipe = v.flags().contains(VmFlags::WIPEONFORK);
                dups.push(Dup {
                    parent: v,
                    copy,
                    anon: v.anon_vma_arc().filter(|_| !wipe),
                });
            }
            link_anon_vmas(&dups, &self.stats);
            let copies: Vec<VmaRef> = dups.iter().map(|d| d.copy).collect();
            ced.attach_all_sorted(&copies);
            // An idle space's page table and TLB are not made for nothing.
            !dups.iter().any(Dup::copies_ptes)
                || copy_page_tables(self, &child, &dups, &mut ed.gather())
        };
        drop(ed);
        if !ok {
            // Dropping the child unmaps what was copied: frame references
            // and anon_vma links are released.
            drop(child);
            return Err(Error::NoMem);
        }
        Ok(child)
    }
}

/// One parent VMA and its copy in the child.
struct Dup {
    parent: VmaRef,
    copy: VmaRef,
    /// The parent's anon_vma: the copy gets a child of it.
    anon: Option<Arc<AnonVma>>,
}

impl Dup {
    /// Whether the parent's page-table entries are copied: private
    /// memory with an anon_vma (anonymous, or a private object mapping
    /// with copies) has pages of its own; the rest
    /// maps only the zero page or a shared object, and the child faults it
    /// again (Linux's `vma_needs_copy`).
    fn copies_ptes(&self) -> bool {
        self.anon.is_some()
            && !(self.parent.has_shmem() && self.parent.flags().contains(VmFlags::SHARED))
    }
}

/// Gives each copy whose parent has an anon_vma a new anon_vma chained to
/// it (`anon_vma_fork`), filed in the family's reverse map. Consecutive
/// VMAs of one family (a split mapping, say) are linked under one
/// acquisition of the family's lock.
fn link_anon_vmas(dups: &[Dup], stats: &StatCounters) {
    for_each_family_run(
        dups,
        |d| d.anon.as_deref(),
        |family, run| {
            // The new anon_vmas are made before the lock is taken.
            let links: Vec<_> = run
                .iter()
                .map(|d| {
                    let parent = d.anon.as_ref().expect("the run has anon_vmas");
                    (d.copy, Arc::new(AnonVma::fork_child(parent, next_id())))
                })
                .collect();
            link_all(&mut family.root().lock(Some(stats)), links);
        },
    );
}

/// Copies the page-table entries of every VMA that needs it, a PTE table
/// at a time: both sides lose write access and the frame gains a
/// reference; a pinned page the parent owns alone is copied for the child
/// instead (its entry in the parent stays as it is). The parent's changed
/// translations are gathered and flushed before the parent's mmap_lock is
/// released, so no one (the child, or a parent fault) relies on an entry
/// being read-only while a writable translation survives. False if the child's page table could not take
/// an entry, or no frame was left for a pinned page's copy (the copy stops
/// there).
fn copy_page_tables(
    mm: &AddressSpace,
    child: &AddressSpace,
    dups: &[Dup],
    gather: &mut Gather<'_>,
) -> bool {
    let (pg, cg) = (mm.pt.pin(), child.pt.pin());
    let frames = &mm.frames;
    let ranges = dups
        .iter()
        .filter(|d| d.copies_ptes())
        .map(|d| d.parent.range());
    let ok = mm
        .pt
        .copy_ranges(&child.pt, ranges, &pg, &cg, |va, pte| {
            let pfn: Pfn = pte.pfn();
            // Pins are taken under this PTE lock and the mmap_lock read
            // side, which we exclude: none appears while we look. A pinned
            // anonymous page is its entry's own (`translate::guest` pins
            // nothing else in a private mapping); an object page pinned
            // through a shared mapping, which a private one reads, stays
            // shared.
            if frames.maybe_pinned(pfn) && frames.refcount(pfn) == 1 {
                let copy = frames.alloc_uninit()?;
                frames.copy(copy, pfn);
                return Some((pte, Pte::new(copy, pte.flags() - PteFlags::UFFD_WP)));
            }
            if !pfn.is_zero_page() {
                frames.get(pfn);
            }
            let ro = Pte::new(pfn, pte.flags() - PteFlags::WRITE);
            if ro != pte {
                gather.add_page(va);
            }
            // The parent keeps its write-protect bits; the child, not
            // registered, drops them (copy_present_pte).
            Some((ro, Pte::new(pfn, ro.flags() - PteFlags::UFFD_WP)))
        })
        .is_ok();
    gather.flush();
    ok
}
