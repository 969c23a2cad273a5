//! Immutable B-tree nodes and the functional (path-copying) edits on them.
//!
//! A node is never changed once another thread may see it. An edit builds
//! new nodes along the path from the root to the leaf it changes, sharing
//! every untouched subtree, and records each node it replaced in a garbage
//! list; the tree publishes the new root with one atomic store and then
//! retires the garbage through its reclaimer.
//!
//! Every child slot of an internal node carries a summary of its subtree:
//! the first start, the last end, and the largest hole between two
//! consecutive entries inside it. The hole between two children is
//! `first[i + 1] - last[i]`. Summaries depend only on the subtree's
//! contents, so a path copy recomputes exactly the path.

use crate::addr::Range;
use crate::sync::{AtomicPtr, Mutex, MutexGuard, Ordering};

/// Maximum entries in a leaf / children in an internal node.
pub(crate) const B: usize = 16;
/// Minimum fill of a non-root node.
pub(crate) const MIN: usize = B / 2;

pub(crate) type NodePtr<V> = *const Node<V>;

/// A leaf: up to `B` entries sorted by start.
pub(crate) struct Leaf<V> {
    pub(crate) len: usize,
    pub(crate) starts: [u64; B],
    pub(crate) ends: [u64; B],
    pub(crate) vals: [Option<V>; B],
}

/// An internal node: up to `B` children with their summaries.
pub(crate) struct Internal<V> {
    pub(crate) len: usize,
    pub(crate) firsts: [u64; B],
    pub(crate) lasts: [u64; B],
    pub(crate) gaps: [u64; B],
    pub(crate) kids: [NodePtr<V>; B],
}

/// A tree node. Both kinds live inline: a node is one allocation.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Node<V> {
    Leaf(Leaf<V>),
    Internal(Internal<V>),
}

// SAFETY: a node owns its values and only points to other nodes of the
// same tree; moving it to the reclaiming thread drops `V`s there (needs
// Send) and touches no child.
unsafe impl<V: Send> Send for Node<V> {}

/// Summary of a subtree: first start, last end, largest inner hole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Summary {
    pub(crate) first: u64,
    pub(crate) last: u64,
    pub(crate) gap: u64,
}

/// Borrows a node behind a pointer.
///
/// # Safety
/// `p` must point to a live node for `'a`: reachable from a root the
/// caller loaded while pinned (readers), or owned by the writer.
#[inline(always)]
pub(crate) unsafe fn node<'a, V>(p: NodePtr<V>) -> &'a Node<V> {
    // SAFETY: guaranteed by the caller.
    unsafe { &*p }
}

impl<V: Clone> Leaf<V> {
    fn empty() -> Self {
        Leaf {
            len: 0,
            starts: [0; B],
            ends: [0; B],
            vals: core::array::from_fn(|_| None),
        }
    }

    fn from_entries(es: &[(u64, u64, V)]) -> Self {
        let mut l = Self::empty();
        for (i, (s, e, v)) in es.iter().enumerate() {
            l.starts[i] = *s;
            l.ends[i] = *e;
            l.vals[i] = Some(v.clone());
        }
        l.len = es.len();
        l
    }

    fn entries(&self) -> Vec<(u64, u64, V)> {
        (0..self.len)
            .map(|i| {
                (
                    self.starts[i],
                    self.ends[i],
                    self.vals[i].clone().expect("slot below len holds a value"),
                )
            })
            .collect()
    }
}

impl<V> Internal<V> {
    fn from_kids(kids: &[(NodePtr<V>, Summary)]) -> Self {
        let mut n = Internal {
            len: kids.len(),
            firsts: [0; B],
            lasts: [0; B],
            gaps: [0; B],
            kids: [core::ptr::null(); B],
        };
        for (i, (p, s)) in kids.iter().enumerate() {
            n.kids[i] = *p;
            n.firsts[i] = s.first;
            n.lasts[i] = s.last;
            n.gaps[i] = s.gap;
        }
        n
    }

    fn kid_list(&self) -> Vec<(NodePtr<V>, Summary)> {
        (0..self.len)
            .map(|i| {
                (
                    self.kids[i],
                    Summary {
                        first: self.firsts[i],
                        last: self.lasts[i],
                        gap: self.gaps[i],
                    },
                )
            })
            .collect()
    }
}

impl<V> Node<V> {
    pub(crate) fn len(&self) -> usize {
        match self {
            Node::Leaf(l) => l.len,
            Node::Internal(n) => n.len,
        }
    }

    /// The summary of this node's subtree (non-empty nodes only).
    pub(crate) fn summary(&self) -> Summary {
        match self {
            Node::Leaf(l) => {
                let mut gap = 0;
                for i in 1..l.len {
                    gap = gap.max(l.starts[i] - l.ends[i - 1]);
                }
                Summary {
                    first: l.starts[0],
                    last: l.ends[l.len - 1],
                    gap,
                }
            }
            Node::Internal(n) => {
                let mut gap = n.gaps[0];
                for i in 1..n.len {
                    gap = gap.max(n.gaps[i]).max(n.firsts[i] - n.lasts[i - 1]);
                }
                Summary {
                    first: n.firsts[0],
                    last: n.lasts[n.len - 1],
                    gap,
                }
            }
        }
    }
}

/// What an insert below a node produced: one replacement, or two after a
/// split.
enum Grown<V> {
    One((NodePtr<V>, Summary)),
    Two((NodePtr<V>, Summary), (NodePtr<V>, Summary)),
}

impl<V: Clone> Leaf<V> {
    /// A copy (values cloned; arrays copied).
    fn copy(&self) -> Self {
        Leaf {
            len: self.len,
            starts: self.starts,
            ends: self.ends,
            vals: core::array::from_fn(|i| {
                if i < self.len {
                    self.vals[i].clone()
                } else {
                    None
                }
            }),
        }
    }

    /// Inserts at `at` (the leaf has room).
    fn insert_at(&mut self, at: usize, s: u64, e: u64, v: V) {
        let n = self.len;
        self.starts.copy_within(at..n, at + 1);
        self.ends.copy_within(at..n, at + 1);
        self.vals[at..=n].rotate_right(1);
        self.starts[at] = s;
        self.ends[at] = e;
        self.vals[at] = Some(v);
        self.len += 1;
    }

    /// Removes the entry at `at`.
    fn remove_at(&mut self, at: usize) {
        let n = self.len;
        self.starts.copy_within(at + 1..n, at);
        self.ends.copy_within(at + 1..n, at);
        self.vals[at..n].rotate_left(1);
        self.vals[n - 1] = None;
        self.len -= 1;
    }
}

impl<V> Internal<V> {
    /// A copy (child pointers are shared, not copied).
    fn copy(&self) -> Self {
        Internal {
            len: self.len,
            firsts: self.firsts,
            lasts: self.lasts,
            gaps: self.gaps,
            kids: self.kids,
        }
    }

    /// Sets child `i`.
    fn set(&mut self, i: usize, (p, s): (NodePtr<V>, Summary)) {
        self.kids[i] = p;
        self.firsts[i] = s.first;
        self.lasts[i] = s.last;
        self.gaps[i] = s.gap;
    }

    /// Inserts a child at `at` (the node has room).
    fn insert_at(&mut self, at: usize, k: (NodePtr<V>, Summary)) {
        let n = self.len;
        self.kids.copy_within(at..n, at + 1);
        self.firsts.copy_within(at..n, at + 1);
        self.lasts.copy_within(at..n, at + 1);
        self.gaps.copy_within(at..n, at + 1);
        self.len += 1;
        self.set(at, k);
    }
}

/// Memory of retired nodes kept for reuse by the writer.
///
/// Path copying makes every edit allocate a few nodes and retire as many.
/// Retired nodes are released by whoever runs the epoch collector, usually
/// a reader. Freeing them there would be a cross-thread free per node (the
/// allocator's arena lock then bounces between writer and readers) and
/// would pull every node's memory into the reader's cache. Instead, the
/// deferred step only pushes the edit's whole [`Batch`] onto `ready` (one
/// CAS, no allocation, no node touched); the writer later takes all ready
/// batches, drops the nodes in place and keeps their memory in `spare`,
/// from which it builds new nodes before it asks the allocator. The node
/// memory is thus only ever written by the writer's core.
pub(crate) struct NodeCache<V> {
    /// Batches whose grace period has passed: any thread pushes, the
    /// writer takes them all at once.
    ready: AtomicPtr<Batch<V>>,
    /// Free node memory (contents already dropped). Only the writer, which
    /// is serialized by the tree's writer lock, locks this.
    spare: Mutex<Vec<*mut Node<V>>>,
}

/// The nodes one edit unlinked, retired together.
pub(crate) struct Batch<V> {
    nodes: Vec<NodePtr<V>>,
    next: *mut Batch<V>,
}

impl<V> Batch<V> {
    /// A heap batch of `nodes`, owned by the returned pointer.
    pub(crate) fn boxed(nodes: Vec<NodePtr<V>>) -> BatchPtr<V> {
        BatchPtr(Box::into_raw(Box::new(Batch {
            nodes,
            next: core::ptr::null_mut(),
        })))
    }
}

/// An owned batch on its way through the reclaimer.
pub(crate) struct BatchPtr<V>(*mut Batch<V>);

// SAFETY: the edit that unlinked the nodes hands their ownership over with
// the batch; whoever ends up dropping them may do so on another thread
// (needs `V: Send`).
unsafe impl<V: Send> Send for BatchPtr<V> {}

/// Free nodes kept at most per tree (about 270 KiB with 16-slot nodes):
/// enough for the garbage of a few hundred edits in flight, small enough
/// that many idle address spaces (fork children) hold little.
const CACHE_MAX: usize = 512;

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

impl<V> NodeCache<V> {
    pub(crate) fn new() -> Self {
        NodeCache {
            ready: AtomicPtr::new(core::ptr::null_mut()),
            spare: Mutex::new(Vec::new()),
        }
    }

    /// Hands back a batch whose nodes no reader can reach any more.
    ///
    /// # Safety
    /// `b` came from [`Batch::boxed`]; its nodes are unlinked from the tree
    /// and their grace period has passed; nobody else uses the batch.
    pub(crate) unsafe fn push_ready(&self, b: BatchPtr<V>) {
        let b = b.0;
        let mut head = self.ready.load(Ordering::Relaxed);
        loop {
            // SAFETY: we own the batch until the CAS below publishes it.
            unsafe { (*b).next = head };
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

    /// Moves every ready batch into `spare`, dropping the nodes' contents.
    fn refill(&self, spare: &mut Vec<*mut Node<V>>) {
        // Acquire: pairs with the Release of `push_ready`.
        let mut b = self.ready.swap(core::ptr::null_mut(), Ordering::Acquire);
        while !b.is_null() {
            // SAFETY: the swap took the whole list; each batch came from
            // `Batch::boxed` and was handed over by `push_ready`.
            let batch = unsafe { Box::from_raw(b) };
            b = batch.next;
            for &p in &batch.nodes {
                let p = p as *mut Node<V>;
                // SAFETY: the batch's nodes are past their grace period
                // and owned by us (see `push_ready`); each is dropped once,
                // then its memory is kept or released.
                unsafe {
                    core::ptr::drop_in_place(p);
                    if spare.len() < CACHE_MAX {
                        spare.push(p);
                    } else {
                        dealloc_node(p);
                    }
                }
            }
        }
    }
}

impl<V> Drop for NodeCache<V> {
    fn drop(&mut self) {
        let mut spare = core::mem::take(&mut *self.spare.lock());
        self.refill(&mut spare);
        for p in spare {
            // SAFETY: spare memory holds dropped nodes owned by the cache.
            unsafe { dealloc_node(p) };
        }
    }
}

// SAFETY: the cache holds raw node memory whose contents were dropped, and
// batches of retired nodes whose `V`s it drops (needs `V: Send`); `ready` is
// synchronized by its CAS/swap, `spare` by its mutex.
unsafe impl<V: Send> Send for NodeCache<V> {}
// SAFETY: as for Send.
unsafe impl<V: Send> Sync for NodeCache<V> {}

/// Splits a list into nodes of at most `B` items, as evenly as possible.
fn chunks<T: Clone>(items: &[T]) -> Vec<Vec<T>> {
    let n = items.len().div_ceil(B).max(1);
    let base = items.len() / n;
    let extra = items.len() % n;
    let mut out = Vec::with_capacity(n);
    let mut at = 0;
    for i in 0..n {
        let k = base + usize::from(i < extra);
        out.push(items[at..at + k].to_vec());
        at += k;
    }
    out
}

/// The functional edits. `garbage` collects every node replaced.
pub(crate) struct Editor<'c, V> {
    pub(crate) garbage: Vec<NodePtr<V>>,
    cache: &'c NodeCache<V>,
    spare: MutexGuard<'c, Vec<*mut Node<V>>>,
}

impl<'c, V: Clone> Editor<'c, V> {
    /// An edit by the tree's (single, serialized) writer.
    pub(crate) fn new(cache: &'c NodeCache<V>) -> Self {
        Editor {
            garbage: Vec::new(),
            cache,
            spare: cache.spare.lock(),
        }
    }

    /// Ends the edit: the nodes it replaced.
    pub(crate) fn finish(self) -> Vec<NodePtr<V>> {
        self.garbage
    }

    /// Places a new node (in recycled memory when there is some) and
    /// returns its pointer and summary.
    fn publish_node(&mut self, n: Node<V>) -> (NodePtr<V>, Summary) {
        let s = n.summary();
        if self.spare.is_empty() {
            self.cache.refill(&mut self.spare);
        }
        let p = match self.spare.pop() {
            Some(p) => {
                // SAFETY: `p` is free memory of a `Node<V>` handed to us by
                // the cache; writing initializes it.
                unsafe { p.write(n) };
                p
            }
            None => Box::into_raw(Box::new(n)),
        };
        (p as NodePtr<V>, s)
    }

    /// Inserts `[s, e) -> v` (which overlaps nothing) into the tree rooted
    /// at `root`; returns the new root.
    pub(crate) fn insert(&mut self, root: NodePtr<V>, s: u64, e: u64, v: V) -> NodePtr<V> {
        if root.is_null() {
            return self
                .publish_node(Node::Leaf(Leaf::from_entries(&[(s, e, v)])))
                .0;
        }
        match self.insert_rec(root, s, e, v) {
            Grown::One(k) => k.0,
            Grown::Two(a, b) => self.grow_root(vec![a, b]),
        }
    }

    fn grow_root(&mut self, mut parts: Vec<(NodePtr<V>, Summary)>) -> NodePtr<V> {
        while parts.len() > 1 {
            parts = chunks(&parts)
                .into_iter()
                .map(|c| self.publish_node(Node::Internal(Internal::from_kids(&c))))
                .collect();
        }
        parts[0].0
    }

    /// Builds a tree of sorted, non-overlapping entries bottom-up with
    /// nodes filled evenly and as full as the fill bounds allow (the
    /// maple tree's bulk mode); returns the root (null when empty).
    pub(crate) fn build(&mut self, es: &[(u64, u64, V)]) -> NodePtr<V> {
        if es.is_empty() {
            return core::ptr::null();
        }
        let leaves = chunks(es)
            .into_iter()
            .map(|c| self.publish_node(Node::Leaf(Leaf::from_entries(&c))))
            .collect();
        self.grow_root(leaves)
    }

    /// Marks every node of the tree under `p` as replaced (for an edit
    /// that rebuilds the whole tree).
    pub(crate) fn discard_all(&mut self, p: NodePtr<V>) {
        if p.is_null() {
            return;
        }
        self.garbage.push(p);
        // SAFETY: `p` is reachable from the writer's working root (see
        // `insert_rec`).
        if let Node::Internal(n) = unsafe { node(p) } {
            for &k in &n.kids[..n.len] {
                self.discard_all(k);
            }
        }
    }

    /// Path copy: the common case copies one fixed-size node per level;
    /// only a full node splits in two.
    fn insert_rec(&mut self, p: NodePtr<V>, s: u64, e: u64, v: V) -> Grown<V> {
        self.garbage.push(p);
        // SAFETY: `p` is reachable from the writer's working root; the
        // writer is the only one who frees nodes, and only after publish.
        match unsafe { node(p) } {
            Node::Leaf(l) => {
                let at = l.starts[..l.len].partition_point(|&x| x < s);
                if l.len < B {
                    let mut n = l.copy();
                    n.insert_at(at, s, e, v);
                    return Grown::One(self.publish_node(Node::Leaf(n)));
                }
                let mut es = l.entries();
                es.insert(at, (s, e, v));
                let h = es.len() / 2;
                Grown::Two(
                    self.publish_node(Node::Leaf(Leaf::from_entries(&es[..h]))),
                    self.publish_node(Node::Leaf(Leaf::from_entries(&es[h..]))),
                )
            }
            Node::Internal(n) => {
                let i = n.firsts[..n.len]
                    .partition_point(|&f| f <= s)
                    .saturating_sub(1);
                match self.insert_rec(n.kids[i], s, e, v) {
                    Grown::One(k) => {
                        let mut m = n.copy();
                        m.set(i, k);
                        Grown::One(self.publish_node(Node::Internal(m)))
                    }
                    Grown::Two(a, b) if n.len < B => {
                        let mut m = n.copy();
                        m.set(i, a);
                        m.insert_at(i + 1, b);
                        Grown::One(self.publish_node(Node::Internal(m)))
                    }
                    Grown::Two(a, b) => {
                        let mut kids = n.kid_list();
                        kids.splice(i..=i, [a, b]);
                        let h = kids.len() / 2;
                        Grown::Two(
                            self.publish_node(Node::Internal(Internal::from_kids(&kids[..h]))),
                            self.publish_node(Node::Internal(Internal::from_kids(&kids[h..]))),
                        )
                    }
                }
            }
        }
    }

    /// Replaces the value of the entry starting at `s` (which must exist)
    /// and optionally its end (which must not reach the next entry);
    /// returns the new root. One path copy, no structural change.
    pub(crate) fn replace(&mut self, root: NodePtr<V>, s: u64, e: u64, v: V) -> NodePtr<V> {
        self.replace_rec(root, s, e, v).0
    }

    fn replace_rec(&mut self, p: NodePtr<V>, s: u64, e: u64, v: V) -> (NodePtr<V>, Summary) {
        self.garbage.push(p);
        // SAFETY: as in `insert_rec`.
        match unsafe { node(p) } {
            Node::Leaf(l) => {
                let at = l.starts[..l.len].partition_point(|&x| x < s);
                debug_assert_eq!(l.starts[at], s);
                let mut n = l.copy();
                n.ends[at] = e;
                n.vals[at] = Some(v);
                self.publish_node(Node::Leaf(n))
            }
            Node::Internal(n) => {
                let i = n.firsts[..n.len]
                    .partition_point(|&f| f <= s)
                    .saturating_sub(1);
                let k = self.replace_rec(n.kids[i], s, e, v);
                let mut m = n.copy();
                m.set(i, k);
                self.publish_node(Node::Internal(m))
            }
        }
    }

    /// Removes the entry starting at `s` (which must exist); returns the
    /// new root (null when the tree becomes empty).
    pub(crate) fn remove(&mut self, root: NodePtr<V>, s: u64) -> NodePtr<V> {
        let mut r = self.remove_rec(root, s);
        // Collapse single-child internal roots.
        while let Some((p, _)) = r {
            // SAFETY: `p` was just built by this editor.
            match unsafe { node(p) } {
                Node::Internal(n) if n.len == 1 => {
                    self.garbage.push(p);
                    r = Some((
                        n.kids[0],
                        Summary {
                            first: n.firsts[0],
                            last: n.lasts[0],
                            gap: n.gaps[0],
                        },
                    ));
                }
                _ => break,
            }
        }
        r.map_or(core::ptr::null(), |(p, _)| p)
    }

    fn remove_rec(&mut self, p: NodePtr<V>, s: u64) -> Option<(NodePtr<V>, Summary)> {
        self.garbage.push(p);
        // SAFETY: as in `insert_rec`.
        match unsafe { node(p) } {
            Node::Leaf(l) => {
                let at = l.starts[..l.len].partition_point(|&x| x < s);
                debug_assert_eq!(l.starts[at], s, "removed entry exists");
                if l.len == 1 {
                    return None;
                }
                let mut n = l.copy();
                n.remove_at(at);
                Some(self.publish_node(Node::Leaf(n)))
            }
            Node::Internal(n) => {
                let i = n.firsts[..n.len]
                    .partition_point(|&f| f <= s)
                    .saturating_sub(1);
                match self.remove_rec(n.kids[i], s) {
                    // SAFETY: `k` was just built by this editor.
                    Some(k) if n.len == 1 || unsafe { node(k.0) }.len() >= MIN => {
                        let mut m = n.copy();
                        m.set(i, k);
                        Some(self.publish_node(Node::Internal(m)))
                    }
                    r => {
                        let mut kids = n.kid_list();
                        match r {
                            None => {
                                kids.remove(i);
                            }
                            Some(k) => {
                                kids[i] = k;
                                self.rebalance(&mut kids, i);
                            }
                        }
                        (!kids.is_empty())
                            .then(|| self.publish_node(Node::Internal(Internal::from_kids(&kids))))
                    }
                }
            }
        }
    }

    /// If child `i` is under-full, merges it with a neighbour (or shares
    /// their items evenly when both do not fit in one node).
    fn rebalance(&mut self, kids: &mut Vec<(NodePtr<V>, Summary)>, i: usize) {
        // SAFETY: the child was just built by this editor.
        if kids.len() < 2 || unsafe { node(kids[i].0) }.len() >= MIN {
            return;
        }
        let j = if i + 1 < kids.len() { i + 1 } else { i - 1 };
        let (a, b) = (i.min(j), i.max(j));
        // SAFETY: both are live nodes of the working tree.
        let (na, nb) = unsafe { (node(kids[a].0), node(kids[b].0)) };
        self.garbage.push(kids[a].0);
        self.garbage.push(kids[b].0);
        let repl: Vec<(NodePtr<V>, Summary)> = match (na, nb) {
            (Node::Leaf(x), Node::Leaf(y)) => {
                let mut es = x.entries();
                es.extend(y.entries());
                chunks(&es)
                    .into_iter()
                    .map(|c| self.publish_node(Node::Leaf(Leaf::from_entries(&c))))
                    .collect()
            }
            (Node::Internal(x), Node::Internal(y)) => {
                let mut ks = x.kid_list();
                ks.extend(y.kid_list());
                chunks(&ks)
                    .into_iter()
                    .map(|c| self.publish_node(Node::Internal(Internal::from_kids(&c))))
                    .collect()
            }
            _ => unreachable!("siblings are at the same height"),
        };
        kids.splice(a..=b, repl);
    }
}

/// Frees a whole subtree (the tree is being dropped: nobody can see it).
///
/// # Safety
/// `p` must be owned by the caller and reachable by nobody else.
pub(crate) unsafe fn free_subtree<V>(p: NodePtr<V>) {
    if p.is_null() {
        return;
    }
    // SAFETY: the caller owns the subtree; every node came from Box::into_raw.
    let b = unsafe { Box::from_raw(p as *mut Node<V>) };
    if let Node::Internal(n) = &*b {
        for &k in &n.kids[..n.len] {
            // SAFETY: children of an owned node are owned too.
            unsafe { free_subtree(k) };
        }
    }
}

/// How many of `keys[..len]` (sorted) are at or below `x`.
///
/// The lookup hot path: with at most `B` keys a branch-free count beats a
/// binary search, whose branches the CPU cannot predict; the compiler
/// turns it into vector compares.
#[inline(always)]
pub(crate) fn rank(keys: &[u64; B], len: usize, x: u64) -> usize {
    keys[..len].iter().map(|&k| usize::from(k <= x)).sum()
}

/// The range of leaf entry `i`.
#[inline]
pub(crate) fn entry(l: &Leaf<impl Sized>, i: usize) -> Range {
    Range::new(l.starts[i], l.ends[i])
}
