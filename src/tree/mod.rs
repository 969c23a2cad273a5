//! An RCU-readable B-tree of non-overlapping ranges, modelled on the maple
//! tree.
//!
//! Maps half-open ranges `[start, end)` of `u64` to values. Nodes hold up
//! to 16 entries (leaves) or 16 children (internal nodes). Each child slot
//! keeps a summary of its subtree — first start, last end and the largest
//! hole between consecutive entries inside it — so the free-area searches
//! ([`RangeTree::gap_lowest`], [`RangeTree::gap_highest`]) descend only
//! into subtrees whose largest hole is big enough, never scanning leaves.
//!
//! # Concurrency
//!
//! Writers are serialized (by the caller's lock, and by the tree's own
//! writer mutex, uncontended in practice). A writer never changes a node a
//! reader may see: it copies the path from the root to the leaves it
//! changes (sharing every untouched subtree), publishes the new root with
//! one `Release` store, and retires the replaced nodes through the tree's
//! [`Reclaimer`] (with epochs, eight edits' worth at a time: a replaced
//! value may be dropped only after seven more edits, or with the tree).
//! Readers pin the reclaimer, load the root with `Acquire`
//! and walk immutable nodes: they take no lock, write no shared memory,
//! never see a torn node, and never touch freed memory. Every write call
//! is atomic for readers: an address mapped before and after a `store`
//! never appears unmapped in between.
//!
//! ```
//! use aspace::tree::RangeTree;
//! use aspace::Range;
//! let t = RangeTree::new();
//! t.writer().insert(Range::new(0x1000, 0x3000), "a").unwrap();
//! let g = t.pin();
//! assert_eq!(t.find(0x2fff, &g).map(|(_, v)| *v), Some("a"));
//! assert_eq!(t.gap_lowest(0, 0x10000, 0x2000, 0x1000, &g), Some(0x3000));
//! ```
//!
//! # Layout
//!
//! - `node.rs`: the node layout and the pin-bounded node borrow;
//! - `read.rs`: lookups, neighbours and iteration;
//! - `gap.rs`: the free-area search;
//! - `write.rs`: the writer ([`TreeWriter`]);
//! - `edit.rs`: the path-copying editor the writer runs;
//! - `cache.rs`: the retired-node memory the editor reuses;
//! - `check.rs`: the invariant check;
//! - `forest.rs`: [`RangeForest`], one tree per fixed slot of the key
//!   space, read as one tree, so writers in different slots commit at once
//!   (the address space's VMAs in `WriterLocking::Range`).
//!
//! # Locking
//!
//! The tree has one lock, its writer mutex, level 3 of the lock order
//! stated once in [`crate::mm`] (the address space takes it only under the
//! mmap_lock write side); it also holds the writer's spare node memory.
//! Reads take no lock: the epoch (a [`Guard`]) keeps what they see alive.

mod cache;
mod check;
mod edit;
mod forest;
mod gap;
mod node;
mod read;
mod write;

pub(crate) use forest::{slot_geometry, InnerSlot};
pub use forest::{ForestAround, ForestWriter, RangeForest};
pub use read::Around;
pub use write::TreeWriter;

use crate::addr::Range;
use crate::lazy::LazyArc;
use crate::reclaim::{Guard, Reclaimer};
use crate::sync::{AtomicPtr, AtomicUsize, Mutex, Ordering, UnsafeCell};
use cache::{NodeCache, Spare};
use edit::Editor;
use node::{node, Node};

/// Why an insert failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TreeError {
    /// The range is empty (`start >= end`).
    EmptyRange,
    /// The range overlaps an existing entry.
    Occupied,
}

impl core::fmt::Display for TreeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            TreeError::EmptyRange => "empty range",
            TreeError::Occupied => "range overlaps an existing entry",
        })
    }
}

impl std::error::Error for TreeError {}

/// A B-tree of non-overlapping ranges with lock-free readers.
pub struct RangeTree<V> {
    /// The published root (null when empty).
    /// Protected by: `writer` for stores (Release); readers load it
    /// (Acquire) under the epoch, which keeps the nodes they reach alive.
    root: AtomicPtr<Node<V>>,
    /// Number of entries (a figure: readers may see it lag the root).
    /// Protected by: `writer` for stores; read without a lock.
    len: AtomicUsize,
    /// The writer mutex: serializes the edits of writers that hold no
    /// lock of their own over the whole tree ([`RangeTree::writer`]).
    /// Protected by: itself (level 3 of the lock order in [`crate::mm`]).
    writer: Mutex<()>,
    /// The writer's spare node memory (`cache.rs`), boxed on the first
    /// edit (a forest keeps a tree per 512 GiB slot, most of them never
    /// written).
    /// Protected by: `writer`, or a caller's lock that keeps every other
    /// writer of the tree out and orders the writers it admits (a range
    /// lock's hold of a whole forest slot:
    /// [`RangeTree::external_writer`]).
    spare: UnsafeCell<Option<Box<Spare<V>>>>,
    /// How retired nodes are kept alive for readers.
    /// Protected by: immutable after construction.
    reclaimer: Reclaimer,
    /// Memory of retired nodes for the writer to reuse (shared with the
    /// deferred frees, which may run after the tree is gone). Made by the
    /// first edit: a tree that is never written allocates none.
    /// Protected by: installed once (see [`LazyArc`]); the cache's
    /// contents as its fields say.
    cache: LazyArc<NodeCache<V>>,
}

// SAFETY: nodes are immutable once published and hold `V`s; sharing the
// tree shares `&V` across threads (needs Sync) and retiring nodes may drop
// `V`s on another thread (needs Send).
unsafe impl<V: Send + Sync> Send for RangeTree<V> {}
// SAFETY: as for Send.
unsafe impl<V: Send + Sync> Sync for RangeTree<V> {}

impl<V: Clone + Send + Sync + 'static> Default for RangeTree<V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<V> core::fmt::Debug for RangeTree<V> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RangeTree")
            .field("len", &self.len.load(Ordering::Relaxed))
            .finish()
    }
}

impl<V: Clone + Send + Sync + 'static> RangeTree<V> {
    /// An empty tree with epoch reclamation.
    pub fn new() -> Self {
        Self::with_reclaimer(Reclaimer::epoch())
    }

    /// An empty tree with the given reclamation policy.
    pub fn with_reclaimer(reclaimer: Reclaimer) -> Self {
        RangeTree {
            root: AtomicPtr::new(core::ptr::null_mut()),
            len: AtomicUsize::new(0),
            writer: Mutex::new(()),
            spare: UnsafeCell::new(None),
            reclaimer,
            cache: LazyArc::new(),
        }
    }

    /// A tree holding `entries`, which must be sorted by start and
    /// non-overlapping, built in one pass with full nodes (like the maple
    /// tree's bulk mode: fewer levels than one insert at a time, which
    /// leaves nodes half full after sequential splits). Epoch
    /// reclamation.
    pub fn from_sorted(entries: impl IntoIterator<Item = (Range, V)>) -> Result<Self, TreeError> {
        let es = write::sorted_entries(entries)?;
        let t = Self::new();
        let g = t.pin();
        let mut spare = Spare::default();
        let root = Editor::new(t.cache.get(), &mut spare, &g).build(&es);
        // SAFETY: `t` is not shared yet: nothing else reaches its spare.
        unsafe { *t.spare.get_mut().deref() = Some(Box::new(spare)) };
        t.root.store(root as *mut Node<V>, Ordering::Release);
        t.len.store(es.len(), Ordering::Relaxed);
        Ok(t)
    }

    /// Pins the calling thread; read while the guard lives.
    #[inline]
    pub fn pin(&self) -> Guard {
        self.reclaimer.pin()
    }

    #[inline]
    fn root<'g>(&'g self, g: &'g Guard) -> Option<&'g Node<V>> {
        let p = self.root.load(Ordering::Acquire);
        // SAFETY: the root was published with Release after its subtree was
        // built; nodes are retired only after being unlinked, and freed
        // only after every guard pinned before that (like `g`) is gone.
        (!p.is_null()).then(|| unsafe { node(p, g) })
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// True if there are no entries.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Asks the reclaimer to free what it can now (epoch: flush this
    /// thread's deferred frees and try to advance the epoch).
    pub fn collect(&self) {
        let g = self.reclaimer.pin();
        self.reclaimer.flush(&g);
    }
}

impl<V> Drop for RangeTree<V> {
    fn drop(&mut self) {
        let p = self.root.load(Ordering::Relaxed);
        // SAFETY: the tree is being dropped, so no reader or writer can
        // reach its nodes; retired nodes are owned by the reclaimer.
        unsafe { node::free_subtree(p) };
    }
}

#[cfg(all(test, not(aspace_loom)))]
mod tests;
