//! The node cache: memory of retired nodes, handed back by the reclaimer
//! and reused by the writer.
//!
//! Path copying makes every edit allocate a few nodes and retire as many.
//! Retired nodes are released by whoever runs the epoch collector, usually
//! a reader. Freeing them there would be a cross-thread free per node (the
//! allocator's arena lock then bounces between writer and readers) and
//! would pull every node's memory into the reader's cache. Instead, the
//! deferred step only pushes the edit's whole [`Batch`] onto `ready` (one
//! CAS, no allocation, no node touched); the writer later takes all ready
//! batches, drops the nodes in place and keeps their memory in `spare`,
//! from which it builds new nodes before it asks the allocator. The node
//! memory is thus only ever written by the writer's core.
//!
//! # How much is kept
//!
//! Ready batches come back in bursts, when the epoch moves on: as many
//! nodes as were retired during a grace period. A fixed cap below that
//! burst (512 nodes, first) made every burst free its surplus and every
//! gap between bursts allocate afresh: with two range-locked writers
//! instantiating, malloc and free took a third of the cycles. So `spare`
//! counts the nodes in flight (retired, not back yet) and keeps, at a
//! refill, up to the most that were in flight since the previous refill
//! (at least [`CACHE_MIN`], at most [`CACHE_LIMIT`]): what the next burst
//! may bring back. A tree that churns keeps about what the epoch already
//! held for it; one that stops keeps what its last burst brought.
//!
//! # Handing back
//!
//! Handing a batch to the reclaimer costs an `Arc` clone of the cache
//! (the deferred step may run after the tree is gone), a deferral, and
//! later the push and the `Arc`'s drop: three locked operations. The
//! writer keeps the batches it retires in its spare ([`Spare::pend`])
//! and hands them over [`PENDING`] at a time, chained, in one deferred
//! step; a large batch (a rebuild's) goes at once with those before it,
//! and so does every batch of a tree whose reclaimer is not an epoch (it
//! frees at once, or only when its owner drops: nothing to share).
//! Deferring later is always safe (the grace period only starts later);
//! the nodes come back a few edits later than they could. Batches still
//! pending when the tree drops are freed with it: no reader can reach
//! them then.
//!
//! # Locking
//!
//! `ready` is a lock-free stack (any thread pushes, the writer takes it
//! all). The spare memory ([`Spare`]) is not in the cache: it is what the
//! tree's writer mutex protects (level 3 of the lock order in
//! [`crate::mm`]), so an edit reaches it with no lock of its own (a mutex
//! of its own, always taken under the writer's, cost two locked
//! read-modify-writes an edit). The cache's drop empties `ready` into a
//! spare of its own.

use super::node::{Node, NodePtr};
use crate::sync::{AtomicPtr, Ordering};

/// Memory of retired nodes kept for reuse by the writer.
pub(super) struct NodeCache<V> {
    /// Batches whose grace period has passed: any thread pushes, the
    /// writer takes them all at once.
    /// Protected by: lock-free (pushes publish with a Release CAS, the
    /// writer takes the list with an Acquire swap).
    ready: AtomicPtr<Batch<V>>,
}

/// The writer's free node memory (module docs, `# How much is kept`), held
/// in the tree's writer mutex. Dropping it frees the memory.
pub(super) struct Spare<V> {
    /// Free node memory (contents already dropped).
    nodes: Vec<*mut Node<V>>,
    /// Nodes retired by publishes and not back through `ready` yet: a
    /// refill keeps as many as its peak (within [`CACHE_MIN`] and
    /// [`CACHE_LIMIT`]).
    nodes_out: InFlight,
    /// Emptied batches (their lists' room kept) for the next edits: an
    /// edit's garbage list and its batch come from here, not from the
    /// allocator (whose frees, with two range-locked writers, were a
    /// tenth of the cycles). Boxed: a batch travels through the
    /// reclaimer as the box's pointer.
    #[allow(clippy::vec_box)]
    batches: Vec<Box<Batch<V>>>,
    /// Batches this tree's edits retired and not yet handed to the
    /// reclaimer, chained through their `next`: handed over together
    /// once [`PENDING`] have gathered (module docs, `# Handing back`).
    pending: *mut Batch<V>,
    /// How many batches `pending` chains.
    pending_n: usize,
    /// Batches retired and not back through `ready` yet: a refill keeps
    /// as many as its peak (within [`BATCHES_KEPT`] and
    /// [`BATCHES_LIMIT`]), as for nodes (module docs).
    batches_out: InFlight,
    /// The list of entries a store overwrites, empty between stores and
    /// kept for the next (`TreeWriter::overwrite`): a store allocates no
    /// list of its own.
    pub(super) hits: Vec<(crate::addr::Range, V)>,
}

impl<V> Default for Spare<V> {
    fn default() -> Self {
        Spare {
            nodes: Vec::new(),
            nodes_out: InFlight::default(),
            batches: Vec::new(),
            batches_out: InFlight::default(),
            pending: core::ptr::null_mut(),
            pending_n: 0,
            hits: Vec::new(),
        }
    }
}

/// Things retired and not back yet, and the most there were since the
/// last refill: what the next burst may bring back, so what a refill
/// keeps (module docs, `# How much is kept`).
#[derive(Default)]
struct InFlight {
    count: usize,
    peak: usize,
}

impl InFlight {
    /// `n` more retired.
    fn retired(&mut self, n: usize) {
        self.count += n;
        self.peak = self.peak.max(self.count);
    }

    /// One back through `ready`.
    fn back(&mut self) {
        self.count = self.count.saturating_sub(1);
    }

    /// How many to keep: the peak, within `min..=max`.
    fn keep(&self, min: usize, max: usize) -> usize {
        self.peak.clamp(min, max)
    }

    /// A refill ended: the peak starts again from what is still out.
    fn restart(&mut self) {
        self.peak = self.count;
    }
}

impl<V> Spare<V> {
    /// Free memory for one node, if any is kept.
    pub(super) fn pop(&mut self) -> Option<*mut Node<V>> {
        self.nodes.pop()
    }

    /// True if no free memory is kept.
    pub(super) fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Counts `n` nodes just retired (handed to the reclaimer).
    pub(super) fn retired(&mut self, n: usize) {
        self.nodes_out.retired(n);
    }

    /// An empty batch for an edit's garbage: a kept one, else a new one.
    pub(super) fn batch(&mut self) -> Box<Batch<V>> {
        self.batches.pop().unwrap_or_else(|| {
            Box::new(Batch {
                nodes: Vec::with_capacity(GARBAGE_ROOM),
                next: core::ptr::null_mut(),
            })
        })
    }

    /// Gives back the empty batch an edit took ([`batch`](Self::batch))
    /// and did not fill: kept whatever the limits (it was just taken).
    pub(super) fn unused_batch(&mut self, b: Box<Batch<V>>) {
        debug_assert!(b.nodes.is_empty());
        self.batches.push(b);
    }

    /// Counts a batch just retired (handed to the reclaimer).
    pub(super) fn retired_batch(&mut self) {
        self.batches_out.retired(1);
    }

    /// Keeps `b`, a batch an edit just retired, with the others not yet
    /// handed to the reclaimer, and returns them all, chained, once
    /// [`PENDING`] have gathered, or `b` is large (a rebuild's: its memory
    /// goes back without waiting for more edits), or not `gather` (a
    /// reclaimer that frees at once, or only at its owner's drop, gains
    /// nothing by the wait).
    pub(super) fn pend(&mut self, b: Box<Batch<V>>, gather: bool) -> Option<BatchPtr<V>> {
        let at_once = !gather || b.nodes.len() > GARBAGE_ROOM;
        let b = Box::into_raw(b);
        // SAFETY: `b` was just made from a box; the chain owns it.
        unsafe { (*b).next = self.pending };
        self.pending = b;
        self.pending_n += 1;
        if self.pending_n < PENDING && !at_once {
            return None;
        }
        self.pending_n = 0;
        Some(BatchPtr(core::mem::replace(
            &mut self.pending,
            core::ptr::null_mut(),
        )))
    }

    /// Keeps `b` for a later edit, emptied, if fewer than the most batches
    /// in flight since the last refill are kept (within the limits) and
    /// its list did not grow past what an edit usually needs.
    pub(super) fn keep_batch(&mut self, mut b: Box<Batch<V>>) {
        b.nodes.clear();
        b.next = core::ptr::null_mut();
        let keep = self.batches_out.keep(BATCHES_KEPT, BATCHES_LIMIT);
        if self.batches.len() < keep && b.nodes.capacity() <= BATCH_ROOM_KEPT {
            self.batches.push(b);
        }
    }
}

/// Batches a tree's writer retires before it hands them to the reclaimer
/// in one deferred step (module docs, `# Handing back`).
#[cfg(not(aspace_loom))]
pub(super) const PENDING: usize = 8;
/// Loom models hand each batch over at once: the reclaimer's path runs in
/// every model that retires a node.
#[cfg(aspace_loom)]
pub(super) const PENDING: usize = 1;

/// Replaced nodes a new batch has room for before its list grows: the
/// paths of a few edits (an overwrite removes and inserts).
const GARBAGE_ROOM: usize = 16;

/// Emptied batches a refill may always keep for reuse.
const BATCHES_KEPT: usize = 64;

/// Emptied batches a refill keeps at most, however many were in flight
/// (about 150 KiB with lists of 16).
const BATCHES_LIMIT: usize = 1024;

/// The most room a kept batch's list may have: one a large edit grew is
/// freed rather than kept.
const BATCH_ROOM_KEPT: usize = 256;

/// The nodes one edit unlinked, retired together.
pub(super) struct Batch<V> {
    /// The unlinked nodes.
    /// Protected by: owned by the batch (filled by its edit, immutable
    /// while it is on its way back, emptied by the refill that keeps it).
    pub(super) nodes: Vec<NodePtr<V>>,
    /// The next batch on `ready`.
    /// Protected by: owned by the pusher until its CAS publishes it;
    /// immutable after.
    next: *mut Batch<V>,
}

impl<V> Batch<V> {
    /// A heap batch of `nodes`, owned by the returned pointer.
    #[cfg(all(test, not(aspace_loom)))]
    fn boxed(nodes: Vec<NodePtr<V>>) -> BatchPtr<V> {
        BatchPtr(Box::into_raw(Box::new(Batch {
            nodes,
            next: core::ptr::null_mut(),
        })))
    }
}

/// An owned batch on its way through the reclaimer.
pub(super) struct BatchPtr<V>(
    /// Protected by: owned (moved, never shared).
    *mut Batch<V>,
);

// SAFETY: the edit that unlinked the nodes hands their ownership over with
// the batch; whoever ends up dropping them may do so on another thread
// (needs `V: Send`).
unsafe impl<V: Send> Send for BatchPtr<V> {}

/// Free nodes a refill may always keep (about 270 KiB with 16-slot
/// nodes): enough for the garbage of a few hundred edits in flight, small
/// enough that many idle address spaces (fork children) hold little.
const CACHE_MIN: usize = 512;

/// Free nodes a refill keeps at most, however many were in flight (about
/// 4 MiB): a reader that held the epoch back for long does not leave its
/// whole backlog cached.
const CACHE_LIMIT: usize = 8192;

/// Releases the memory of a node whose contents were dropped.
///
/// # Safety
/// `p` is an allocation of a `Node<V>` (from `Box`), its value already
/// dropped, owned by the caller.
unsafe fn dealloc_node<V>(p: *mut Node<V>) {
    // SAFETY: `MaybeUninit<Node<V>>` has the layout of `Node<V>`, and its
    // drop does not touch the (already dropped) contents.
    drop(unsafe { Box::from_raw(p as *mut core::mem::MaybeUninit<Node<V>>) });
}

impl<V> Default for NodeCache<V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<V> NodeCache<V> {
    pub(super) fn new() -> Self {
        NodeCache {
            ready: AtomicPtr::new(core::ptr::null_mut()),
        }
    }

    /// Hands back a batch whose nodes no reader can reach any more.
    ///
    /// # Safety
    /// `b` came from [`Batch::into_ptr`]; its nodes are unlinked from the tree
    /// and their grace period has passed; nobody else uses the batch.
    pub(super) unsafe fn push_ready(&self, b: BatchPtr<V>) {
        let b = b.0;
        // `b` may head a chain of batches (`Spare::pend`): its last one
        // links to the stack.
        let mut tail = b;
        // SAFETY: we own the chain until the CAS below publishes it; each
        // link is a batch of it or null.
        unsafe {
            while !(*tail).next.is_null() {
                tail = (*tail).next;
            }
        }
        let mut head = self.ready.load(Ordering::Relaxed);
        loop {
            // SAFETY: we own the chain until the CAS below publishes it.
            unsafe { (*tail).next = head };
            // Release: the link is written before the batch is visible.
            match self
                .ready
                .compare_exchange_weak(head, b, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(h) => head = h,
            }
        }
    }

    /// Moves every ready batch into `spare`, dropping the nodes' contents,
    /// and keeps up to the most nodes in flight since the last refill
    /// (module docs).
    pub(super) fn refill(&self, spare: &mut Spare<V>) {
        let keep = spare.nodes_out.keep(CACHE_MIN, CACHE_LIMIT);
        // Acquire: pairs with the Release of `push_ready`.
        let head = self.ready.swap(core::ptr::null_mut(), Ordering::Acquire);
        // SAFETY: the swap took the whole list; each batch on it came from
        // a box (`Spare::pend`) and was handed over by `push_ready`.
        for batch in unsafe { chain(head) } {
            for &p in &batch.nodes {
                let p = p as *mut Node<V>;
                // SAFETY: the batch's nodes are past their grace period
                // and owned by us (see `push_ready`); each is dropped once,
                // then its memory is kept or released.
                unsafe {
                    core::ptr::drop_in_place(p);
                    if spare.nodes.len() < keep {
                        spare.nodes.push(p);
                    } else {
                        dealloc_node(p);
                    }
                }
                spare.nodes_out.back();
            }
            spare.batches_out.back();
            spare.keep_batch(batch);
        }
        spare.nodes_out.restart();
        spare.batches_out.restart();
    }
}

/// The batches of the chain `head` starts (linked through `next`), taken
/// back as boxes one by one.
///
/// # Safety
/// `head` is null or heads a chain of batches made by `Box::into_raw`
/// that the caller owns whole; the chain is not used after this.
unsafe fn chain<V>(mut head: *mut Batch<V>) -> impl Iterator<Item = Box<Batch<V>>> {
    core::iter::from_fn(move || {
        (!head.is_null()).then(|| {
            // SAFETY: `head` is a batch of the owned chain (the caller's
            // contract), taken back once: `head` moves past it at once.
            let batch = unsafe { Box::from_raw(head) };
            head = batch.next;
            batch
        })
    })
}

impl<V> Drop for NodeCache<V> {
    fn drop(&mut self) {
        // Batches handed back after the tree was gone: their nodes'
        // contents are dropped here, their memory with the spare.
        self.refill(&mut Spare::default());
    }
}

impl<V> Drop for Spare<V> {
    fn drop(&mut self) {
        // SAFETY: a pending batch is owned by the chain (`pend`): its
        // nodes were unlinked by the tree's edits and never handed to the
        // reclaimer. The spare drops with its tree, when no reader can
        // reach the tree any more (an unlinked tree of a forest drops
        // after its grace period), so none reads them: each is dropped and
        // freed once, here.
        for batch in unsafe { chain(self.pending) } {
            for &p in &batch.nodes {
                let p = p as *mut Node<V>;
                // SAFETY: as above.
                unsafe {
                    core::ptr::drop_in_place(p);
                    dealloc_node(p);
                }
            }
        }
        for p in self.nodes.drain(..) {
            // SAFETY: spare memory holds dropped nodes owned by the spare.
            unsafe { dealloc_node(p) };
        }
    }
}

// SAFETY: the cache holds batches of retired nodes whose `V`s it drops
// (needs `V: Send`); `ready` is synchronized by its CAS/swap.
unsafe impl<V: Send> Send for NodeCache<V> {}
// SAFETY: as for Send.
unsafe impl<V: Send> Sync for NodeCache<V> {}

#[cfg(all(test, not(aspace_loom)))]
mod tests {
    use super::*;
    use crate::tree::node::Leaf;
    use std::sync::Arc;

    /// `n` retired leaves, back from the reclaimer as one ready batch.
    fn burst(cache: &NodeCache<u64>, spare: &mut Spare<u64>, n: usize) {
        let nodes: Vec<NodePtr<u64>> = (0..n)
            .map(|_| Box::into_raw(Box::new(Node::Leaf(Leaf::from_entries(&[])))) as NodePtr<u64>)
            .collect();
        spare.retired(n);
        spare.retired_batch();
        // SAFETY: the nodes were never linked into a tree: nobody else
        // can reach them.
        unsafe { cache.push_ready(Batch::boxed(nodes)) };
    }

    /// A leaf holding one entry of value `v`, as an edit unlinks it.
    fn leaf<V: Clone>(v: V) -> NodePtr<V> {
        Box::into_raw(Box::new(Node::Leaf(Leaf::from_entries(&[(0, 1, v)])))) as NodePtr<V>
    }

    /// A batch of `n` retired leaves of value `v`, counted as an edit's.
    fn retire<V: Clone>(spare: &mut Spare<V>, n: usize, v: V) -> Box<Batch<V>> {
        let mut b = spare.batch();
        b.nodes.extend((0..n).map(|_| leaf(v.clone())));
        spare.retired(n);
        spare.retired_batch();
        b
    }

    /// A writer's retired batches wait in its spare and go to the
    /// reclaimer `PENDING` at a time, chained, and a large one at once
    /// with those before it; the refill takes every node of a chain back.
    /// Batches still pending when the spare drops (with its tree) have
    /// their nodes' contents dropped then, once.
    #[test]
    fn retired_batches_are_handed_over_together() {
        let v = Arc::new(());
        let cache = NodeCache::<Arc<()>>::new();
        let mut spare = Spare::default();
        for _ in 0..PENDING - 1 {
            let b = retire(&mut spare, 1, v.clone());
            assert!(spare.pend(b, true).is_none(), "handed over before PENDING");
        }
        let b = retire(&mut spare, 1, v.clone());
        let chain = spare
            .pend(b, true)
            .expect("the PENDING-th batch hands all over");
        assert_eq!(Arc::strong_count(&v), 1 + PENDING);
        // SAFETY: the nodes were never linked into a tree.
        unsafe { cache.push_ready(chain) };
        cache.refill(&mut spare);
        assert_eq!(spare.nodes.len(), PENDING, "a node of the chain lost");
        assert_eq!(Arc::strong_count(&v), 1, "contents dropped at the refill");
        let b = retire(&mut spare, 1, v.clone());
        assert!(spare.pend(b, true).is_none());
        let b = retire(&mut spare, GARBAGE_ROOM + 1, v.clone());
        let chain = spare.pend(b, true).expect("a large batch goes at once");
        // SAFETY: as above.
        unsafe { cache.push_ready(chain) };
        cache.refill(&mut spare);
        assert_eq!(spare.nodes.len(), PENDING + GARBAGE_ROOM + 2);
        let b = retire(&mut spare, 1, v.clone());
        let chain = spare.pend(b, false).expect("no gathering: at once");
        // SAFETY: as above.
        unsafe { cache.push_ready(chain) };
        cache.refill(&mut spare);
        let b = retire(&mut spare, 3, v.clone());
        assert!(spare.pend(b, true).is_none());
        assert_eq!(Arc::strong_count(&v), 4);
        drop(spare);
        assert_eq!(Arc::strong_count(&v), 1, "a pending node not dropped");
    }

    fn free_all(spare: &mut Spare<u64>) {
        for p in spare.nodes.drain(..) {
            // SAFETY: spare memory holds dropped nodes owned by the cache.
            unsafe { dealloc_node(p) };
        }
    }

    /// A refill keeps the batches it empties for the next edits (their
    /// lists' room too): as many as were in flight, within
    /// `BATCHES_KEPT..=BATCHES_LIMIT`, but not one a large edit grew; an
    /// edit then takes a kept batch rather than a new one.
    #[test]
    fn a_refill_keeps_emptied_batches_for_the_next_edits() {
        let cache = NodeCache::<u64>::new();
        let mut spare = Spare::default();
        for _ in 0..BATCHES_KEPT + 3 {
            burst(&cache, &mut spare, 2);
        }
        burst(&cache, &mut spare, BATCH_ROOM_KEPT + 1);
        cache.refill(&mut spare);
        assert_eq!(spare.batches.len(), BATCHES_KEPT + 3);
        assert_eq!((spare.batches_out.count, spare.batches_out.peak), (0, 0));
        // Nothing in flight since: a burst pushed unannounced keeps only
        // the floor.
        spare.batches.clear();
        for _ in 0..BATCHES_KEPT + 3 {
            let nodes =
                vec![Box::into_raw(Box::new(Node::Leaf(Leaf::from_entries(&[])))) as NodePtr<u64>];
            spare.retired(1);
            // SAFETY: as in `burst`.
            unsafe { cache.push_ready(Batch::boxed(nodes)) };
        }
        cache.refill(&mut spare);
        assert_eq!(spare.batches.len(), BATCHES_KEPT);
        assert!(spare
            .batches
            .iter()
            .all(|b| b.nodes.is_empty() && b.nodes.capacity() <= BATCH_ROOM_KEPT));
        let kept: *const Batch<u64> = &**spare.batches.last().unwrap();
        let b = spare.batch();
        assert!(core::ptr::eq(&*b, kept), "an edit allocated a new batch");
        assert!(b.nodes.capacity() >= 1, "its room was not kept");
        spare.keep_batch(b);
        free_all(&mut spare);
    }

    /// A burst larger than `CACHE_MIN` is kept whole when that many nodes
    /// were in flight (a fixed cap freed the surplus, and the writer then
    /// allocated afresh); once the churn stops, a refill keeps no more
    /// than the last peak, and never more than `CACHE_LIMIT`.
    #[test]
    fn a_refill_keeps_what_was_in_flight_within_the_limits() {
        let cache = NodeCache::<u64>::new();
        let mut spare = Spare::default();
        burst(&cache, &mut spare, 3 * CACHE_MIN);
        cache.refill(&mut spare);
        assert_eq!(spare.nodes.len(), 3 * CACHE_MIN);
        assert_eq!((spare.nodes_out.count, spare.nodes_out.peak), (0, 0));
        free_all(&mut spare);
        burst(&cache, &mut spare, 10);
        cache.refill(&mut spare);
        assert_eq!(spare.nodes.len(), 10);
        // Nothing counted in flight (the peak reset at the last refill):
        // only `CACHE_MIN` is kept of an unexpected burst.
        let nodes: Vec<NodePtr<u64>> = (0..CACHE_MIN + 5)
            .map(|_| Box::into_raw(Box::new(Node::Leaf(Leaf::from_entries(&[])))) as NodePtr<u64>)
            .collect();
        // SAFETY: as in `burst`.
        unsafe { cache.push_ready(Batch::boxed(nodes)) };
        cache.refill(&mut spare);
        assert_eq!(spare.nodes.len(), CACHE_MIN);
        // However many were in flight, at most `CACHE_LIMIT` stay.
        free_all(&mut spare);
        burst(&cache, &mut spare, CACHE_LIMIT + 7);
        cache.refill(&mut spare);
        assert_eq!(spare.nodes.len(), CACHE_LIMIT);
    }
}
