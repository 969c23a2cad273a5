//! fork: a copy-on-write copy of the address space, and the reverse-map
//! walk over a page's anon_vma family.
//!
//! Linux's `dup_mmap`, modelled: under the parent's mmap_lock write side,
//! each parent VMA is write-locked (so no fault on the per-VMA path runs
//! in it while it is copied) and copied into the child. For private
//! anonymous VMAs that have an anon_vma, the child VMA gets a new anon_vma
//! chained to the parent's (same root, same lock: `anon_vma_fork`), and
//! every present page-table entry is copied: the frame gains a reference
//! and both entries lose write access, so the first write on either side
//! copies the frame (or reuses it if it holds the last reference, see
//! [`crate::fault`]). The parent's translations are flushed (through the
//! TLB model, waiting out user accesses that began before) before its
//! mmap_lock is released. VMAs without an anon_vma map only the zero page
//! and shared mappings have a backing object: their entries are not
//! copied, the child faults them again (as Linux skips such VMAs in
//! `copy_page_range`). No page data is copied by fork itself.
//!
//! The child shares the parent's frame allocator (frame accounting spans
//! the family) and VMA object cache (the reverse map of a family points at
//! VMAs of several address spaces, which must stay type-stable for all).

use super::edit::Edit;
use super::{next_id, AddressSpace};
use crate::addr::{page_align_down, Range};
use crate::error::{Error, Result};
use crate::fault::ZERO_PFN;
use crate::phys::Pfn;
use crate::pt::{Pte, PteFlags};
use crate::sync::Arc;
use crate::vma::{AnonVma, RmapHit, VmFlags};

impl AddressSpace {
    /// A copy-on-write copy of this address space, like `fork(2)`'s
    /// memory side: the same VMAs, break and map count; private
    /// anonymous pages shared write-protected until either side writes;
    /// shared mappings shared. The child is an independent
    /// `AddressSpace` that shares this one's frame allocator, so
    /// [`frames_used`](Self::frames_used) counts the whole family.
    ///
    /// Errors: `ENOMEM` if the child's page table cannot take a copied
    /// entry (nothing is leaked: the partial child is torn down). Fork
    /// itself allocates no frames, so the frame budget does not make it
    /// fail.
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
        let child =
            AddressSpace::with_parts(self.cfg.clone(), self.frames.clone(), self.pool.clone());
        // Resource limits are inherited, as the rlimits of a forked task.
        child.set_stack_limit(self.stack_limit());
        let ok = {
            let mut ced = Edit::begin(&child);
            ced.st.start_brk = ed.st.start_brk;
            ced.st.brk = ed.st.brk;
            let vmas = ed.vmas_in(Range::new(0, self.cfg.task_size));
            let mut gather = ed.gather();
            let pg = self.pt.pin();
            let cg = child.pt.pin();
            let mut ok = true;
            for v in vmas {
                // MADV_DONTFORK: the child does not get this VMA.
                if v.flags().contains(VmFlags::DONTCOPY) {
                    continue;
                }
                // dup_mmap's vma_start_write: no per-VMA fault runs in `v`
                // until the mmap_lock is released.
                ed.lock(v);
                // MADV_WIPEONFORK: the child starts with an empty VMA (no
                // anon_vma, no entries copied).
                let wipe = v.flags().contains(VmFlags::WIPEONFORK);
                let parent_anon = v.anon_vma_arc().filter(|_| !wipe);
                let anon = parent_anon
                    .as_ref()
                    .map(|pa| Arc::new(AnonVma::fork_child(pa, next_id())));
                // Locks are not inherited (dup_mmap clears VM_LOCKED).
                let flags = v.flags() - VmFlags::LOCKED;
                let nv = ced.new_vma(v.range(), v.pgoff(), flags, anon, v.shmem_arc());
                nv.set_name(v.name_arc());
                ced.insert(nv);
                if v.shmem().is_some() || parent_anon.is_none() || !ok {
                    continue;
                }
                let frames = &self.frames;
                self.pt.change_range(v.range(), &pg, |va, pte| {
                    let pfn: Pfn = pte.pfn();
                    let ro = Pte::new(pfn, pte.flags() - PteFlags::WRITE);
                    if !ok {
                        return pte;
                    }
                    if pfn != ZERO_PFN {
                        frames.get(pfn);
                    }
                    if child.pt.install(va, ro, &cg).is_err() {
                        if pfn != ZERO_PFN {
                            frames.put(pfn);
                        }
                        ok = false;
                        return pte;
                    }
                    if ro != pte {
                        gather.add_page(va);
                    }
                    ro
                });
            }
            // The parent's old writable translations must be gone before
            // anyone (the child, or a parent fault) relies on the entries
            // being read-only.
            gather.flush();
            ok
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

    /// This address space's identity, as [`RmapHit::mm_id`] reports it.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The frame mapped at `addr` now, if a page is present there and is
    /// not the shared zero page.
    pub fn translate(&self, addr: u64) -> Option<Pfn> {
        if addr >= self.cfg.task_size {
            return None;
        }
        let g = self.pt.pin();
        let pte = self.pt.lookup(page_align_down(addr), &g);
        (pte.is_present() && pte.pfn() != ZERO_PFN).then_some(pte.pfn())
    }

    /// The reverse map of the anonymous page at `addr`: every (address
    /// space, address) of its anon_vma family whose VMA covers the same
    /// page index — where this page, or a copy-on-write copy of it, may be
    /// mapped — sorted. Empty if `addr` is unmapped, shared, or in a VMA
    /// with no anon_vma yet. Takes the family's lock (counted).
    ///
    /// The walk tolerates a concurrent end-only move of any VMA in the
    /// family (brk): see [`crate::vma::anon`].
    pub fn rmap_walk(&self, addr: u64) -> Vec<RmapHit> {
        let _st = self.mmap_lock.read();
        let g = self.tree.pin();
        let Some((_, v)) = self.tree.find(addr, &g) else {
            return Vec::new();
        };
        if v.shmem().is_some() {
            return Vec::new();
        }
        let Some(anon) = v.anon_vma_arc() else {
            return Vec::new();
        };
        let pgoff = v.pgoff_of(page_align_down(addr));
        let idx = anon.root().lock(Some(&self.stats));
        let mut hits = idx.walk(pgoff);
        drop(idx);
        hits.sort();
        hits
    }
}
