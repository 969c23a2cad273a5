//! The mappings of a shared object (Linux's `i_mmap`): every VMA, in every
//! address space, that maps a [`Shmem`](super::Shmem), with the range and
//! page offset it maps, so that shrinking the object
//! ([`Memfd::set_len`](crate::Memfd::set_len)) can zap the pages past the
//! new end wherever they are mapped.
//!
//! An entry names the address space by its page table and TLB (both behind
//! an `Arc`, [`Mapper`]): an [`AddressSpace`](crate::AddressSpace) is a
//! plain value that may move, so the object cannot point at it.
//!
//! # Truncation
//!
//! A shrink to `n` pages ([`Mappings::zap_from`], called by `set_len`):
//!
//! 1. stores the new end (`Shmem::set_npages`), then a heavy fence
//!    (`sync::asymmetric`);
//! 2. under this lock, for each entry in registration order, zaps the
//!    entries of pages `>= n` under their PTE-table locks, shared pages
//!    and private copy-on-write copies alike (Linux's `even_cows`), and
//!    flushes that space's TLB before the frame references drop;
//! 3. then the object drops its own frames past the end.
//!
//! Why no fault maps a page being freed: an object fault takes a
//! reference on the object's frame that fails once the frame is free, and
//! re-reads the slot after it ([`Shmem::get_frame`](super::Shmem)); it
//! then installs its entry under the PTE-table lock, re-checking the end
//! there after a light fence (`fault.rs`). Either that lock section comes
//! before step 2's pass over the same table, which then clears the entry
//! (the fault's VMA is registered before it is attached, so the pass
//! visits it), or after it, and then it reads the new end (the pass holds
//! the lock after the store) and backs out with SIGBUS. If step 2 found no
//! table at all there, the fault made it after the walk looked, and the
//! fence pair makes it read the new end. Frames are freed only in step 2's
//! flushes and in step 3, both after every entry that mapped them is gone
//! and flushed; a fault that read a slot before step 3 holds its own
//! reference (or failed to take one and looks again, finding the end).
//!
//! Why no entry escapes the pass: every change to which VMAs map the
//! object in a space, and where, is made under this lock, so the pass sees
//! each VMA either before or after a change and never a torn range:
//! - a new VMA is registered before it is attached ([`Mappings::register`]),
//!   and its range holds no entry of another mapping;
//! - a VMA's range is re-read after each change ([`Mappings::update`]),
//!   and edits that move pages from one VMA to another extend the
//!   receiver before they shrink or unregister the giver (a merge), so the
//!   union of the registered ranges covers every entry at every instant;
//! - fork copies entries from a parent VMA to its copy, which registers
//!   later and so is visited later: an entry copied before the pass
//!   cleared the parent's is found in the copy (the copy holds both tables'
//!   locks while it copies, so the pass sees the child's entry);
//! - mremap moves entries under this lock.
//!
//! A VMA leaves the index when its object reference is released (the VMA
//! object going back to its pool), after its entries were zapped or moved.
//!
//! # Locking
//!
//! One mutex per object, [`Mappings::lock`]. Order (see [`crate::mm`]):
//! inside the mmap_lock, VMA write locks and an anon_vma family's lock;
//! before PTE-table locks, the frame allocator's locks and the TLB flush
//! lock. A shrink takes it inside the object's size lock and takes no
//! mmap_lock or VMA lock, so it never waits for an address space's writer
//! while holding it. Faults never take it.

use super::VmaRef;
use crate::addr::{Range, PAGE_SHIFT};
use crate::phys::FrameAllocator;
use crate::pt::PageTable;
use crate::stats::StatCounters;
use crate::sync::{Arc, Mutex, MutexGuard};
use crate::tlb::{Gather, TlbState};
use std::collections::{BTreeMap, HashMap};

/// An address space as a shared object's mapping sees it: its page table
/// and TLB, shared with it.
#[derive(Clone)]
pub(crate) struct Mapper {
    pub(crate) pt: Arc<PageTable>,
    pub(crate) tlb: Arc<TlbState>,
}

/// The mappings of one shared object.
pub(crate) struct Mappings {
    /// Protected by: itself.
    index: Mutex<MapIndex>,
    /// TLB flushes made by shrinks (they belong to no address space's
    /// counters: the object has no handle on those).
    /// Protected by: per-CPU relaxed atomics.
    stats: StatCounters,
}

/// The registered VMAs, in registration order.
#[derive(Default)]
pub(crate) struct MapIndex {
    entries: BTreeMap<u64, Entry>,
    seq_of: HashMap<VmaRef, u64>,
    next_seq: u64,
}

struct Entry {
    vma: VmaRef,
    /// The VMA's range and page offset when last registered or updated.
    range: Range,
    pgoff: u64,
    space: Mapper,
}

impl Mappings {
    pub(crate) fn new() -> Self {
        Mappings {
            index: Mutex::new(MapIndex::default()),
            stats: StatCounters::new(),
        }
    }

    /// Takes the lock (an mremap holds it while it moves entries).
    pub(crate) fn lock(&self) -> MutexGuard<'_, MapIndex> {
        self.index.lock()
    }

    /// Files `v` (write-locked or detached, its range set) as a mapping in
    /// `space`.
    pub(crate) fn register(&self, v: VmaRef, space: Mapper) {
        let mut idx = self.lock();
        let seq = idx.next_seq;
        idx.next_seq += 1;
        let old = idx.seq_of.insert(v, seq);
        debug_assert!(old.is_none(), "{v:?} registered twice");
        idx.entries.insert(
            seq,
            Entry {
                vma: v,
                range: v.range(),
                pgoff: v.pgoff(),
                space,
            },
        );
    }

    /// Re-reads `v`'s range and page offset (after the caller, holding
    /// `v` write-locked, changed them).
    pub(crate) fn update(&self, v: VmaRef) {
        self.lock().set(v, v.range(), v.pgoff());
    }

    /// Files `v` as mapping `range` from page `pgoff` before its fields
    /// say so (a merge that unregisters the giver before it extends the
    /// receiver: see the module docs).
    pub(crate) fn cover(&self, v: VmaRef, range: Range, pgoff: u64) {
        self.lock().set(v, range, pgoff);
    }

    /// Removes `v` (no entry of its range maps the object any more).
    pub(crate) fn unregister(&self, v: VmaRef) {
        let mut idx = self.lock();
        if let Some(seq) = idx.seq_of.remove(&v) {
            idx.entries.remove(&seq);
        }
    }

    /// Number of registered VMAs.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// Step 2 of a shrink (module docs): zaps, in every mapping, the
    /// entries of object pages `from` and up, flushing each space's TLB
    /// before the frame references (of `frames`) drop.
    pub(crate) fn zap_from(&self, from: u64, frames: &FrameAllocator) {
        let idx = self.lock();
        for e in idx.entries.values() {
            let pages = e.range.len() >> PAGE_SHIFT;
            let first = from.max(e.pgoff);
            if first - e.pgoff >= pages {
                continue;
            }
            let start = e.range.start + ((first - e.pgoff) << PAGE_SHIFT);
            let r = Range::new(start, e.range.end);
            let mut gather = Gather::new(&e.space.tlb, &self.stats, frames);
            let g = e.space.pt.pin();
            e.space.pt.zap_range(r, &g, |va, frame| {
                gather.add_page(va);
                if let Some(pfn) = frame {
                    gather.free_frame(pfn);
                }
            });
            drop(g);
            gather.flush();
        }
    }
}

impl MapIndex {
    fn set(&mut self, v: VmaRef, range: Range, pgoff: u64) {
        if let Some(seq) = self.seq_of.get(&v) {
            let e = self.entries.get_mut(seq).expect("indexed");
            debug_assert!(e.vma == v);
            e.range = range;
            e.pgoff = pgoff;
        }
    }
}

#[cfg(all(test, not(aspace_loom)))]
mod tests {
    use crate::addr::PAGE_SIZE as PAGE;
    use crate::{AddressSpace, Config, MapFlags, Memfd, MremapFlags, Prot};

    /// VMAs of `mm` mapping an object (all of them, here).
    fn object_vmas(mm: &AddressSpace) -> usize {
        mm.vmas().iter().filter(|v| v.shmem_id.is_some()).count()
    }

    #[test]
    fn the_index_follows_every_edit() {
        let rw = Prot::READ | Prot::WRITE;
        let mm = AddressSpace::new(Config::default());
        let m = Memfd::new_in(mm.frame_pool(), "idx", 16 * PAGE).unwrap();
        let filed = || m.pages().mappings.len();
        let a = mm
            .mmap_fd(0, 8 * PAGE, rw, MapFlags::SHARED, &m, 0)
            .unwrap();
        mm.mprotect(a + 2 * PAGE, 2 * PAGE, Prot::READ).unwrap(); // split
        assert_eq!((filed(), object_vmas(&mm)), (3, 3));
        mm.mprotect(a + 2 * PAGE, 2 * PAGE, rw).unwrap(); // merge back
        assert_eq!((filed(), object_vmas(&mm)), (1, 1));
        // Extend the next VMA down over the whole of one (merge.rs's
        // `left_side` case, which files the receiver first).
        mm.mprotect(a, 4 * PAGE, Prot::READ).unwrap();
        mm.mprotect(a, 4 * PAGE, rw).unwrap();
        assert_eq!((filed(), object_vmas(&mm)), (1, 1));
        let moved = mm
            .mremap(
                a + 4 * PAGE,
                4 * PAGE,
                4 * PAGE,
                MremapFlags::MAYMOVE | MremapFlags::FIXED,
                a + 64 * PAGE,
            )
            .unwrap();
        assert_eq!((filed(), object_vmas(&mm)), (2, 2));
        let c = mm.fork().unwrap();
        assert_eq!(filed(), 4);
        drop(c);
        assert_eq!(filed(), 2);
        mm.munmap(moved, 4 * PAGE).unwrap();
        mm.munmap(a, 4 * PAGE).unwrap();
        assert_eq!(filed(), 0);
        // Written, moved and forked, then shrunk: nothing maps past the end.
        let a = mm
            .mmap_fd(0, 8 * PAGE, rw, MapFlags::PRIVATE, &m, 0)
            .unwrap();
        mm.write(a + 6 * PAGE, b"cow").unwrap();
        let b = mm
            .mremap(
                a,
                8 * PAGE,
                8 * PAGE,
                MremapFlags::MAYMOVE | MremapFlags::FIXED,
                a + 128 * PAGE,
            )
            .unwrap();
        let c = mm.fork().unwrap();
        m.set_len(5 * PAGE).unwrap();
        for s in [&mm, &c] {
            assert!(s.translate(b + 6 * PAGE).is_none());
            assert!(s.read(b + 6 * PAGE, &mut [0u8; 3]).is_err());
        }
        drop(c);
        mm.munmap(b, 8 * PAGE).unwrap();
        assert_eq!(filed(), 0);
    }
}
