//! The backing object of shared anonymous mappings and memfds (like shmem): its pages
//! live in a sparse radix tree, as the page cache's xarray keeps them.
//!
//! The tree has a fixed height for the object's size and 64 slots per
//! node. Lookups are `Acquire` loads down the tree and take no lock; a
//! missing node or page is installed by compare-and-swap (the loser frees
//! its own). Nodes are freed only when the object drops, so a reader never
//! meets a freed node. A huge object costs only the nodes on the paths to
//! the pages it has touched; each node is charged to the frame pool's
//! budget.
//!
//! # Locking
//!
//! Lock-free: nodes and pages are installed by compare-and-swap; callers
//! hold the VMA (its read lock or the mmap_lock). The VMAs mapping the
//! object are indexed under their own lock ([`super::mappings`]). Order:
//! [`crate::mm`].

use crate::phys::{FrameAllocator, Pfn};
use crate::sync::{Arc, AtomicU64, Ordering};

/// Index bits resolved by one level.
const SHIFT: u32 = 6;
/// Slots per node.
const FANOUT: usize = 1 << SHIFT;

/// One node: child pointers above the last level, `pfn + 1` at the last
/// level; 0 is an empty slot.
pub(super) struct Node {
    pub(super) slots: [AtomicU64; FANOUT],
}

impl Node {
    fn new() -> Node {
        Node {
            slots: core::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

/// Bytes a node costs, charged to the budget while it exists.
const NODE_BYTES: u64 = core::mem::size_of::<Node>() as u64;

/// Levels needed to index `npages` pages (at least one).
fn height_for(npages: u64) -> u32 {
    let mut h = 1;
    while h * SHIFT < 64 && npages > 1 << (h * SHIFT) {
        h += 1;
    }
    h
}

/// The backing object of a shared anonymous mapping: a fixed number of
/// pages, each allocated on first touch.
///
/// The object holds one reference on each frame it has; every PTE mapping
/// one holds one more.
pub struct Shmem {
    /// Identity, printed as the inode number in `maps()`.
    pub(crate) id: u64,
    /// The name of a [`Memfd`](crate::Memfd) (`maps()` shows
    /// `/memfd:NAME (deleted)`); `None` for a shared anonymous mapping.
    /// Protected by: immutable after creation.
    pub(crate) name: Option<Box<str>>,
    /// Pages the tree can index (the largest size).
    /// Protected by: immutable after creation.
    npages: u64,
    /// Pages below the object's end (`ceil(size / 4096)`): a fault at or
    /// past it is SIGBUS.
    /// Protected by: an atomic, stored by the owner's resize (under a
    /// [`Memfd`](crate::Memfd)'s size lock); a shrink lowers it before it
    /// zaps the mappings, and faults re-read it under the PTE lock (see
    /// [`super::mappings`]).
    end: AtomicU64,
    pub(super) height: u32,
    /// The root node lives in the object (its cost is the mapping's).
    pub(super) root: Node,
    pub(crate) frames: Arc<FrameAllocator>,
    /// The host file whose page cache the object is, if any: pages are
    /// read from it on first touch and written back to it
    /// ([`crate::file`]).
    /// Protected by: immutable after creation (see [`crate::file`]).
    pub(crate) host: Option<crate::file::HostFile>,
    /// Every VMA mapping the object (Linux's `i_mmap`).
    /// Protected by: its own lock (see [`super::mappings`]).
    pub(crate) mappings: super::Mappings,
}

impl Shmem {
    pub(crate) fn new(id: u64, npages: u64, frames: Arc<FrameAllocator>) -> Self {
        Self::named(id, None, npages, npages, frames, None)
    }

    /// An object named `name` (a memfd) indexing up to `npages` pages, of
    /// which the first `end` are inside it, the page cache of `host` if
    /// given.
    pub(crate) fn named(
        id: u64,
        name: Option<Box<str>>,
        npages: u64,
        end: u64,
        frames: Arc<FrameAllocator>,
        host: Option<crate::file::HostFile>,
    ) -> Self {
        Shmem {
            id,
            name,
            npages,
            end: AtomicU64::new(end),
            height: height_for(npages),
            root: Node::new(),
            frames,
            host,
            mappings: super::Mappings::new(),
        }
    }

    /// Whether mappings of the object are placed 2 MiB-aligned: it is a
    /// host file on a file system whose mmap aligns them (`mm/placement.rs`,
    /// `# Huge-page alignment`).
    pub(crate) fn aligns_placement(&self) -> bool {
        self.host.as_ref().is_some_and(|h| h.aligns_placement())
    }

    /// The slot index of page `index` at `level` (0: the last level).
    pub(super) fn slot(index: u64, level: u32) -> usize {
        ((index >> (level * SHIFT)) as usize) & (FANOUT - 1)
    }

    /// The child node behind an interior slot, creating it within the
    /// budget if missing. `None` when the budget is spent.
    pub(super) fn child_or_make<'a>(&'a self, slot: &'a AtomicU64) -> Option<&'a Node> {
        let mut p = slot.load(Ordering::Acquire);
        if p == 0 {
            let budget = self.frames.memory();
            if !budget.try_charge(NODE_BYTES) {
                return None;
            }
            let new = Box::into_raw(Box::new(Node::new()));
            match slot.compare_exchange(0, new as u64, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => p = new as u64,
                Err(winner) => {
                    // SAFETY: `new` was never published; we own it.
                    unsafe { drop(Box::from_raw(new)) };
                    budget.uncharge(NODE_BYTES);
                    p = winner;
                }
            }
        }
        // SAFETY: a non-zero interior slot holds a node from Box::into_raw,
        // published with Release after initialization; nodes are freed
        // only when the object drops, and we borrow it.
        Some(unsafe { &*(p as *const Node) })
    }

    /// The last-level slot of page `index`, making the nodes above it
    /// (`None` when the budget has no room for one).
    pub(super) fn leaf_slot(&self, index: u64) -> Option<&AtomicU64> {
        debug_assert!(index < self.npages);
        let mut node = &self.root;
        for level in (1..self.height).rev() {
            node = self.child_or_make(&node.slots[Self::slot(index, level)])?;
        }
        Some(&node.slots[Self::slot(index, 0)])
    }

    /// Size in pages: a fault at this index or past it is SIGBUS.
    pub(crate) fn npages(&self) -> u64 {
        self.end.load(Ordering::Acquire)
    }

    /// Sets the size in pages (at most the capacity given at creation).
    pub(crate) fn set_npages(&self, end: u64) {
        debug_assert!(end <= self.npages);
        self.end.store(end, Ordering::Release);
    }

    /// The frame of page `index`, if it has one (nothing is allocated).
    pub(crate) fn resident(&self, index: u64) -> Option<Pfn> {
        if index >= self.npages {
            return None;
        }
        let mut node = &self.root;
        for level in (1..self.height).rev() {
            let p = node.slots[Self::slot(index, level)].load(Ordering::Acquire);
            if p == 0 {
                return None;
            }
            // SAFETY: as in `child_or_make`: a published node, freed only
            // when the object drops.
            node = unsafe { &*(p as *const Node) };
        }
        let v = node.slots[Self::slot(index, 0)].load(Ordering::Acquire);
        (v != 0).then(|| Pfn::new((v - 1) as u32))
    }

    /// True if page `index` has a frame (it is resident in the object).
    pub(crate) fn has_frame(&self, index: u64) -> bool {
        self.resident(index).is_some()
    }

    /// Zero-fills the pages of `range` (indices) that have a frame:
    /// `MADV_REMOVE`'s hole punch, which every mapping of the object sees.
    /// The frames stay allocated to the object. Visits only the nodes that
    /// exist, so a huge, sparse range costs what it holds.
    ///
    /// Runs under the mmap_lock read side, without the object's size lock
    /// (which comes before the mmap_lock), so a shrink may free a frame it
    /// visits: each frame is zeroed only while a reference taken here
    /// keeps it from being freed and reused, and only if the slot still
    /// holds it once that reference is taken (else it is no longer the
    /// object's page and is skipped).
    pub(crate) fn zero_range(&self, range: core::ops::Range<u64>) {
        let zeros = [0u8; crate::addr::PAGE_SIZE as usize];
        let end = range.end.min(self.npages);
        self.visit(
            &self.root,
            self.height - 1,
            0,
            range.start,
            end,
            &mut |slot, pfn| {
                if !self.frames.try_get(pfn) {
                    return; // freed by a shrink: no longer the object's
                }
                if slot.load(Ordering::Acquire) == u64::from(pfn.get()) + 1 {
                    self.frames.write(pfn, 0, &zeros);
                }
                self.frames.put(pfn);
            },
        );
    }

    /// Drops the object's frames of the pages from index `from` on (a
    /// shrinking `ftruncate`), after the end was lowered and the mappings
    /// zapped ([`super::mappings`]); copies by offset are excluded by the
    /// [`Memfd`](crate::Memfd)'s size lock, and a fault that still reads a
    /// slot takes its reference only while the frame lives
    /// ([`get_frame`](Self::get_frame)).
    pub(crate) fn truncate_from(&self, from: u64) {
        self.visit(
            &self.root,
            self.height - 1,
            0,
            from,
            self.npages,
            &mut |slot, pfn| {
                slot.store(0, Ordering::Release);
                self.frames.put(pfn);
            },
        );
    }

    /// Calls `f` on the slot and frame of every page in `[start, end)` below `node`
    /// (at `level`, covering pages from `base`), skipping empty subtrees.
    fn visit(
        &self,
        node: &Node,
        level: u32,
        base: u64,
        start: u64,
        end: u64,
        f: &mut impl FnMut(&AtomicU64, Pfn),
    ) {
        let span = 1u64 << (level * SHIFT);
        for (i, s) in node.slots.iter().enumerate() {
            let Some(lo) = (i as u64)
                .checked_mul(span)
                .and_then(|o| o.checked_add(base))
            else {
                break;
            };
            if lo >= end {
                break;
            }
            if lo.saturating_add(span) <= start {
                continue;
            }
            let v = s.load(Ordering::Acquire);
            if v == 0 {
                continue;
            }
            if level == 0 {
                f(s, Pfn::new((v - 1) as u32));
            } else {
                // SAFETY: as in `resident`.
                let child = unsafe { &*(v as *const Node) };
                self.visit(child, level - 1, lo, start, end, f);
            }
        }
    }

    /// Frees the nodes below `node` (at `level`) and drops the object's
    /// frame references. Returns the number of nodes freed.
    fn release(&self, node: &Node, level: u32) -> u64 {
        let mut freed = 0;
        for s in node.slots.iter() {
            let v = s.load(Ordering::Relaxed);
            if v == 0 {
                continue;
            }
            if level == 0 {
                self.frames.put(Pfn::new((v - 1) as u32));
            } else {
                // SAFETY: a non-zero interior slot owns a node from
                // Box::into_raw; the object is being dropped, so nobody
                // else can reach it.
                let child = unsafe { Box::from_raw(v as *mut Node) };
                freed += 1 + self.release(&child, level - 1);
                self.frames.memory().uncharge(NODE_BYTES);
            }
        }
        freed
    }
}

/// Node memory freed at once past which the heap is asked to give its free
/// memory back to the system.
const TRIM_BYTES: u64 = 1 << 20;

impl Drop for Shmem {
    fn drop(&mut self) {
        // A file object's last user is gone: what it wrote reaches the
        // file (errors cannot be reported here; `Memfd::sync_all` and
        // `msync` report them).
        let _ = self.writeback(0, u64::MAX);
        let freed = self.release(&self.root, self.height - 1);
        if freed * NODE_BYTES >= TRIM_BYTES {
            give_back_heap();
        }
    }
}

/// Asks the allocator to return free heap memory to the system. A sparse
/// object's nodes are heap memory charged to the budget; once uncharged,
/// glibc keeps them resident in its arenas, and frames then charged in
/// their place would take the host past the budget (`tests/host_rss.rs`,
/// nodes then data). Elsewhere nothing is done.
fn give_back_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free heap memory; it takes no
    // pointers and is safe to call from any thread.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(all(test, not(aspace_loom)))]
mod tests {
    use super::*;
    use crate::addr::PAGE_SIZE;

    #[test]
    fn heights() {
        assert_eq!(height_for(0), 1);
        assert_eq!(height_for(64), 1);
        assert_eq!(height_for(65), 2);
        assert_eq!(height_for(1 << 35), 6);
        assert_eq!(height_for(u64::MAX), 11);
    }

    #[test]
    fn huge_object_costs_what_it_touches() {
        let frames = Arc::new(FrameAllocator::new(1 << 20, true));
        let npages = (64u64 << 40) / PAGE_SIZE;
        let s = Shmem::new(1, npages, frames.clone());
        let idx = [0, 1, 63, 64, 4095, npages / 2, npages - 1];
        let pfns: Vec<Pfn> = idx.iter().map(|&i| s.frame(i).unwrap()).collect();
        for (&i, &p) in idx.iter().zip(&pfns) {
            assert_eq!(s.frame(i).ok(), Some(p), "stable frame for page {i}");
        }
        assert_eq!(frames.used(), idx.len() as u64);
        let used = frames.memory().used();
        assert!(used < 64 << 10, "{used} bytes for 7 pages of 64 TiB");
        drop(s);
        assert_eq!(frames.used(), 0);
        assert_eq!(frames.memory().used(), 0);
    }

    #[test]
    fn out_of_budget_is_none_not_abort() {
        let frames = Arc::new(FrameAllocator::new(8 * PAGE_SIZE, true));
        let s = Shmem::new(1, 1 << 30, frames.clone());
        let got = (0..64u64).filter_map(|i| s.frame(i << 20).ok()).count();
        assert!(got > 0 && got < 8, "{got} pages within 8 pages of budget");
        drop(s);
        assert_eq!(frames.memory().used(), 0);
    }
}
