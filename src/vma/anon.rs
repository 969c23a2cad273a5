//! anon_vma: the reverse-map anchor of anonymous pages, its chains, and
//! the reverse map itself.
//!
//! A VMA gets an anon_vma on its first write fault (a read fault maps the
//! shared zero page and needs none). Whether two VMAs have one, and which,
//! decides whether they may merge, exactly as in Linux.
//!
//! # Families and chains
//!
//! `fork` gives each child VMA whose parent VMA has an anon_vma a new
//! anon_vma whose *parent* is the parent VMA's anon_vma and whose *root* is
//! the parent's root: every anon_vma descended from one first write fault
//! forms a family with one [`AnonRoot`], and the root's lock is shared by
//! the whole family (parent, children, grandchildren), as in Linux. New
//! pages a child faults belong to its own anon_vma.
//!
//! A VMA's anon_vma chain (Linux's `vma->anon_vma_chain`) is its anon_vma
//! and that anon_vma's ancestors: [`AnonVma::chain_len`]. A chain longer
//! than one entry marks a VMA that shares pages with a fork relative, and
//! such a VMA does not merge with a neighbour that has no anon_vma
//! (Linux's `vma_had_uncowed_parents`). The chain also keeps the ancestors
//! alive (each anon_vma holds its parent).
//!
//! # The reverse map, and why an end-only move needs no lock
//!
//! The root keeps one index, [`RmapIndex`], of every VMA linked to an
//! anon_vma of the family, ordered by `(vm_pgoff, VMA)`: the page offset of
//! the VMA's *start*, never its end. [`RmapIndex::walk`] answers "which
//! VMAs, at which addresses, may map page index `pgoff`": it scans the
//! entries whose key is at most `pgoff` and keeps those whose end lies
//! above it, computing `addr = start + (pgoff - vm_pgoff) * PAGE_SIZE`.
//! Walkers and every change of the index hold the root's lock.
//!
//! Changing a VMA's start changes its `vm_pgoff` (the address/offset
//! relation the walker computes with) and its key, so it takes the lock
//! and re-keys the entry. Inserting a VMA (split, new mapping with an
//! anon_vma, fork) and merges that move pages between VMAs take it too.
//!
//! Moving only a VMA's *end* with nothing inserted (brk growing or
//! shrinking the heap, a merge that extends a VMA over an empty range)
//! changes no key, no `vm_pgoff` and no page's owner, so it skips the
//! lock (Linux's 2009 "avoid unnecessary anon_vma lock acquisition in
//! vma_adjust()"). A walker racing with the move reads the end as one
//! atomic word and sees either the old or the new end:
//! - on a grow, the pages between the two ends are not mapped yet, so
//!   whether it reports them or not, it misses no page that is mapped;
//! - on a shrink, the move happens before the pages are zapped (under
//!   their page-table locks, then freed only after the TLB flush), so a
//!   walker that saw the old end finds each page either still mapped or
//!   already gone: both answers are a state the page table really had.
//!
//! Every other VMA's position in the index is untouched, so the walk never
//! loses a VMA.
//!
//! The kernel could not keep this shortcut after 2012: its per-anon_vma
//! index became an interval tree keyed by each VMA's `[pgoff, pgoff +
//! pages)` range, with every node caching the largest range end below it.
//! An end move changes a key and those cached maxima, so an unlocked move
//! could make a concurrent walker prune a subtree that holds a mapping of
//! the page it is looking for (and corrupt the tree for the next update).
//! Here the only end-dependent test is the walker's own, on a value it
//! reads once. The price is the walk: it visits every VMA whose start
//! offset lies at or below `pgoff` instead of only the overlapping ones.
//!
//! aspace does not record which anon_vma a page belongs to (Linux's
//! `page->mapping`), so a walk starts at the root's index, which holds
//! every VMA of the family; Linux would start at the page's own anon_vma
//! and visit the subset chained to it.
//!
//! # Locking
//!
//! - [`AnonRoot::lock`]: the family's lock; protects the index. Taken
//!   inside the mmap_lock and VMA write locks (or a VMA read lock, in the
//!   fault path), before PTE locks.
//! - a VMA's `anon_vma` pointer is non-null exactly while the VMA is in
//!   its family's index; both change together under the root's lock.

use super::chunk_map::ChunkMap;
use super::VmaRef;
use crate::addr::{pages, PAGE_SHIFT};
use crate::stats::{Event, StatCounters};
use crate::sync::{Arc, Mutex, MutexGuard};

/// The reverse-map anchor shared by the VMAs whose anonymous pages it
/// covers.
pub struct AnonVma {
    id: u64,
    root: Arc<AnonRoot>,
    /// Entries in the chain of a VMA that uses this anon_vma.
    depth: u32,
}

/// What a whole anon_vma family shares: the lock and the reverse map.
pub struct AnonRoot {
    id: u64,
    index: Mutex<RmapIndex>,
}

/// The family's reverse map: every VMA linked to one of its anon_vmas,
/// keyed by `(vm_pgoff, VMA address)` — start-based, never end-based (see
/// the module docs). Kept in sorted chunks ([`ChunkMap`]), so VMAs filed in
/// address order (first writes through a run of small mappings) allocate
/// once per chunk, not per few entries.
#[derive(Default)]
pub(crate) struct RmapIndex {
    map: ChunkMap<(u64, u64, u64), Entry>,
}

struct Entry {
    vma: VmaRef,
    /// The anon_vma the VMA uses (a family member).
    anon: u64,
}

/// One place a page may be mapped, as the reverse map reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RmapHit {
    /// The address space ([`AddressSpace::id`](crate::AddressSpace::id)).
    pub mm_id: u64,
    /// The virtual address of the page there.
    pub addr: u64,
    /// Id of the anon_vma that VMA uses.
    pub anon_vma: u64,
}

impl AnonVma {
    /// A new anon_vma heading a new family.
    pub(crate) fn new(id: u64) -> Self {
        AnonVma {
            id,
            root: Arc::new(AnonRoot {
                id,
                index: Mutex::new(RmapIndex::default()),
            }),
            depth: 1,
        }
    }

    /// The anon_vma of a child VMA forked from a VMA using `parent`
    /// (Linux's `anon_vma_fork`): same root, one longer chain.
    pub(crate) fn fork_child(parent: &Arc<AnonVma>, id: u64) -> Self {
        AnonVma {
            id,
            root: parent.root.clone(),
            depth: parent.depth + 1,
        }
    }

    /// Identity (for debugging and tests).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The family's root.
    pub fn root(&self) -> &AnonRoot {
        &self.root
    }

    /// Length of the anon_vma chain of a VMA using this anon_vma: itself
    /// and its ancestors.
    pub fn chain_len(&self) -> u32 {
        self.depth
    }

    /// True if both belong to the same family (share the root's lock).
    pub fn same_family(&self, other: &AnonVma) -> bool {
        core::ptr::eq(&*self.root, &*other.root)
    }
}

impl AnonRoot {
    /// Takes the family's lock. With `stats`, counts the acquisition, and
    /// a contended one when a try-lock fails first.
    pub(crate) fn lock(&self, stats: Option<&StatCounters>) -> MutexGuard<'_, RmapIndex> {
        let Some(stats) = stats else {
            return self.index.lock();
        };
        stats.inc(Event::anon_vma_lock);
        match self.index.try_lock() {
            Some(g) => g,
            None => {
                stats.inc(Event::anon_vma_lock_contended);
                self.index.lock()
            }
        }
    }
}

/// An index key: `(vm_pgoff, address space, vm_start)`. Start-based and
/// unique (no two VMAs of one address space share a start), and
/// independent of where VMA objects happen to be allocated, so walks visit
/// VMAs in the same order every run (which loom's replay relies on).
fn key(v: VmaRef) -> (u64, u64, u64) {
    (v.pgoff(), v.mm_id(), v.start())
}

impl RmapIndex {
    /// Links `vma` (using anon_vma `anon`) under its current start and
    /// page offset.
    pub(crate) fn insert(&mut self, vma: VmaRef, anon: u64) {
        let old = self.map.insert(key(vma), Entry { vma, anon });
        debug_assert!(old.is_none(), "two VMAs filed under one rmap key");
    }

    /// Unlinks `vma` (filed under its current start and page offset).
    /// Returns whether it was there.
    pub(crate) fn remove(&mut self, vma: VmaRef) -> bool {
        let k = key(vma);
        if self.map.get(&k).is_some_and(|e| e.vma == vma) {
            self.map.remove(&k);
            return true;
        }
        // Filed under an out-of-date key (a start moved without a re-key,
        // which is a bug caught by the debug assertion in `walk`): find it
        // the slow way rather than leave a stale entry behind.
        debug_assert!(false, "rmap entry of {vma:?} filed under a stale key");
        let stale = self.map.iter().find(|(_, e)| e.vma == vma).map(|(k, _)| *k);
        stale.is_some_and(|k| self.map.remove(&k).is_some())
    }

    /// Links a batch of VMAs (each with the anon_vma id it uses). A batch
    /// that is large next to the index rebuilds it in one pass of the two
    /// sorted sequences instead of inserting entry by entry.
    pub(crate) fn insert_many(&mut self, batch: Vec<(VmaRef, u64)>) {
        if batch.len() < REBUILD_MIN || batch.len() * 4 < self.map.len() {
            for (v, anon) in batch {
                self.insert(v, anon);
            }
            return;
        }
        let mut new: Vec<_> = batch
            .into_iter()
            .map(|(vma, anon)| (key(vma), Entry { vma, anon }))
            .collect();
        new.sort_unstable_by_key(|(k, _)| *k);
        let old = core::mem::take(&mut self.map);
        let total = old.len() + new.len();
        self.map = ChunkMap::from_sorted(merge_sorted(old.into_sorted(), new.into_iter()));
        debug_assert_eq!(self.map.len(), total, "two VMAs filed under one rmap key");
    }

    /// Unlinks a batch of VMAs (filed under their current keys). A batch
    /// that is large next to the index rebuilds it in one pass.
    pub(crate) fn remove_many(&mut self, vmas: &[VmaRef]) {
        if vmas.len() < REBUILD_MIN || vmas.len() * 4 < self.map.len() {
            for &v in vmas {
                self.remove(v);
            }
            return;
        }
        let mut gone: Vec<_> = vmas.iter().map(|&v| key(v)).collect();
        gone.sort_unstable();
        let before = self.map.len();
        self.map.retain(|k, _| gone.binary_search(k).is_err());
        debug_assert_eq!(
            before - self.map.len(),
            vmas.len(),
            "rmap batch not all filed"
        );
    }

    /// Re-files `vma` from its old start and page offset under its
    /// current ones (after its start moved; Linux's interval-tree pre/post
    /// update).
    pub(crate) fn rekey(&mut self, vma: VmaRef, old_start: u64, old_pgoff: u64) {
        let old = (old_pgoff, vma.mm_id(), old_start);
        match self.map.remove(&old) {
            Some(e) => {
                debug_assert!(e.vma == vma);
                let clash = self.map.insert(key(vma), e);
                debug_assert!(clash.is_none(), "two VMAs filed under one rmap key");
            }
            // Not filed here: the caller locked another family's map.
            None => debug_assert!(false, "re-keying {vma:?}, not in this rmap"),
        }
    }

    /// Every place page index `pgoff` of the family may be mapped: each
    /// linked VMA whose `[vm_pgoff, vm_pgoff + pages)` holds `pgoff`, with
    /// the address of that page in it. The caller holds the root's lock
    /// (it has `&self` through the guard), so starts and page offsets are
    /// stable; each VMA's end is read once and may be the end before or
    /// after a concurrent end-only move.
    pub(crate) fn walk(&self, pgoff: u64) -> Vec<RmapHit> {
        let mut out = Vec::new();
        for (&(key, _, _), e) in self.map.up_to(&(pgoff, u64::MAX, u64::MAX)) {
            let v = e.vma;
            let start = v.start();
            let vpgoff = v.pgoff();
            debug_assert_eq!(key, vpgoff, "rmap key out of date for {v:?}");
            let end = v.end();
            if end <= start || vpgoff > pgoff {
                continue;
            }
            if pgoff - vpgoff < pages(end - start) {
                out.push(RmapHit {
                    mm_id: v.mm_id(),
                    addr: start + ((pgoff - vpgoff) << PAGE_SHIFT),
                    anon_vma: e.anon,
                });
            }
        }
        out
    }
}

/// Batches at least this large may rebuild the index.
const REBUILD_MIN: usize = 64;

/// Merges two sequences sorted by key into one.
fn merge_sorted<K: Ord, V>(
    a: impl Iterator<Item = (K, V)>,
    b: impl Iterator<Item = (K, V)>,
) -> impl Iterator<Item = (K, V)> {
    let (mut a, mut b) = (a.peekable(), b.peekable());
    core::iter::from_fn(move || match (a.peek(), b.peek()) {
        (Some(x), Some(y)) if y.0 < x.0 => b.next(),
        (Some(_), _) => a.next(),
        (None, _) => b.next(),
    })
}

impl core::fmt::Debug for AnonVma {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "AnonVma({}, root {}, chain {})",
            self.id, self.root.id, self.depth
        )
    }
}

impl core::fmt::Debug for AnonRoot {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "AnonRoot({})", self.id)
    }
}

/// Splits `items` into runs of consecutive items whose anon_vmas (`anon`)
/// belong to one family, skipping items without one, and calls `f(the
/// run's first anon_vma, run)` for each: the batches that each need one
/// acquisition of a family's lock.
pub(crate) fn for_each_family_run<T>(
    items: &[T],
    anon: impl Fn(&T) -> Option<&AnonVma>,
    mut f: impl FnMut(&AnonVma, &[T]),
) {
    let mut rest = items;
    while let Some(first) = rest.iter().position(|x| anon(x).is_some()) {
        rest = &rest[first..];
        let head = anon(&rest[0]).expect("found above");
        let run = rest
            .iter()
            .position(|x| !anon(x).is_some_and(|a| a.same_family(head)))
            .unwrap_or(rest.len());
        f(head, &rest[..run]);
        rest = &rest[run..];
    }
}

/// Links each VMA of `links` (detached or write-locked, with no
/// anon_vma) to its anon_vma, all of the family whose lock the caller
/// holds (`idx`), filing them in the reverse map as one batch (fork).
pub(crate) fn link_all(
    idx: &mut RmapIndex,
    links: impl IntoIterator<Item = (VmaRef, Arc<AnonVma>)>,
) {
    let batch: Vec<(VmaRef, u64)> = links.into_iter().map(|(v, a)| (v, v.put_anon(a))).collect();
    idx.insert_many(batch);
}

/// Unlinks every VMA of `vmas` (detached, or write-locked by the caller)
/// from its anon_vma, taking each family's lock once per run of
/// consecutive VMAs of that family and updating its reverse map as one
/// batch (teardown, unmapping many VMAs).
pub(crate) fn unlink_all(vmas: &[VmaRef], stats: &StatCounters) {
    for_each_family_run(
        vmas,
        // SAFETY: the VMAs are detached or write-locked by the caller.
        |v| unsafe { v.anon_vma() },
        |anon, run| {
            let mut idx = anon.root().lock(Some(stats));
            idx.remove_many(run);
            let released: Vec<_> = run.iter().map(|v| v.take_anon()).collect();
            drop(idx);
            // The anon_vmas (and the ancestors they alone kept) are freed
            // outside the family's lock.
            drop(released);
        },
    );
}
