//! The path-copying editor: functional edits that build new nodes and
//! record the ones they replace.
//!
//! A node is never changed once another thread may see it. An edit builds
//! new nodes along the path from the root to the leaf it changes, sharing
//! every untouched subtree, and records each node it replaced in a garbage
//! list; the writer ([`super::write`]) publishes the new root with one
//! atomic store and then retires the garbage through its reclaimer.
//!
//! # Locking
//!
//! An [`Editor`] exists only inside a [`super::TreeWriter`], so under the
//! tree's writer mutex (level 3 of the lock order in [`crate::mm`]), or
//! the caller's lock of an external writer; it borrows the spare node
//! memory that lock protects for its whole life.
//! It reads
//! the current tree under the writer's pin: every node it borrows lives
//! as long as that pin.

use super::cache::{Batch, BatchPtr, NodeCache, Spare};
use super::node::{node, Internal, Leaf, Node, NodePtr, Summary, B, MIN};
use crate::reclaim::Guard;

/// What an insert below a node produced: one replacement, or two after a
/// split.
enum Grown<V> {
    One((NodePtr<V>, Summary)),
    Two((NodePtr<V>, Summary), (NodePtr<V>, Summary)),
}

/// The functional edits of one write. `garbage` collects every node
/// replaced.
pub(super) struct Editor<'e, V> {
    /// The nodes this edit replaced, to retire after the publish, in a
    /// batch the cache kept (or a new one).
    /// Protected by: owned by the edit (under the tree's writer lock).
    garbage: Box<Batch<V>>,
    /// Where new nodes' memory comes from.
    /// Protected by: see [`NodeCache`]'s fields.
    cache: &'e NodeCache<V>,
    /// The writer's free node memory, borrowed for the whole edit.
    /// Protected by: the tree's writer lock (held by the writer).
    spare: &'e mut Spare<V>,
    /// The writer's pin: bounds every node this edit borrows.
    /// Protected by: immutable (a shared borrow of the writer's guard).
    pin: &'e Guard,
}

impl<'e, V: Clone> Editor<'e, V> {
    /// An edit by the tree's (single, serialized) writer, with the spare
    /// memory its writer lock protects, reading the tree under `pin`.
    pub(super) fn new(cache: &'e NodeCache<V>, spare: &'e mut Spare<V>, pin: &'e Guard) -> Self {
        Editor {
            garbage: spare.batch(),
            cache,
            spare,
            pin,
        }
    }

    /// Ends the edit: its batch of replaced nodes joins those the writer
    /// has not handed over yet (the cache counts them in flight), and
    /// once enough have gathered they are returned, chained, for the
    /// caller to retire (`None` until then, or if it replaced none: its
    /// empty batch is then kept for the next edit); without `gather`, at
    /// once (`Spare::pend`).
    pub(super) fn finish(self, gather: bool) -> Option<BatchPtr<V>> {
        let n = self.garbage.nodes.len();
        self.spare.retired(n);
        if n == 0 {
            self.spare.unused_batch(self.garbage);
            return None;
        }
        self.spare.retired_batch();
        self.spare.pend(self.garbage, gather)
    }

    /// Borrows a node of the working tree.
    ///
    /// # Safety
    /// `p` is reachable from the writer's working root (the tree's current
    /// root, or a root this edit built), or was built by this edit. Such a
    /// node is retired only by a later publish, and freed only after the
    /// grace period of that, which ends after `self.pin` is dropped.
    unsafe fn working(&self, p: NodePtr<V>) -> &'e Node<V> {
        // SAFETY: guaranteed by the caller.
        unsafe { node(p, self.pin) }
    }

    /// Records `n` as replaced by this edit.
    fn replaced(&mut self, n: &Node<V>) {
        self.garbage.nodes.push(n as NodePtr<V>);
    }

    /// Places a new node (in recycled memory when there is some) and
    /// returns its pointer and summary.
    fn publish_node(&mut self, n: Node<V>) -> (NodePtr<V>, Summary) {
        let s = n.summary();
        if self.spare.is_empty() {
            self.cache.refill(self.spare);
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

    /// Places `items` in as few nodes as the fill bounds allow, filled as
    /// evenly as possible (`make` builds a node of one share).
    fn publish_chunks<T>(
        &mut self,
        items: &[T],
        make: impl Fn(&[T]) -> Node<V>,
    ) -> Vec<(NodePtr<V>, Summary)> {
        let n = items.len().div_ceil(B).max(1);
        let (base, extra) = (items.len() / n, items.len() % n);
        let mut out = Vec::with_capacity(n);
        let mut at = 0;
        for i in 0..n {
            let k = base + usize::from(i < extra);
            out.push(self.publish_node(make(&items[at..at + k])));
            at += k;
        }
        out
    }

    /// Inserts `[s, e) -> v` (which overlaps nothing) into the tree rooted
    /// at `root`; returns the new root.
    pub(super) fn insert(&mut self, root: NodePtr<V>, s: u64, e: u64, v: V) -> NodePtr<V> {
        if root.is_null() {
            return self
                .publish_node(Node::Leaf(Leaf::from_entries(&[(s, e, v)])))
                .0;
        }
        // SAFETY: `root` is the working root (see `working`).
        let n = unsafe { self.working(root) };
        match self.insert_rec(n, s, e, v) {
            Grown::One(k) => k.0,
            Grown::Two(a, b) => self.grow_root(vec![a, b]),
        }
    }

    fn grow_root(&mut self, mut parts: Vec<(NodePtr<V>, Summary)>) -> NodePtr<V> {
        while parts.len() > 1 {
            parts = self.publish_chunks(&parts, |c| Node::Internal(Internal::from_kids(c)));
        }
        parts[0].0
    }

    /// Builds a tree of sorted, non-overlapping entries bottom-up with
    /// nodes filled evenly and as full as the fill bounds allow (the
    /// maple tree's bulk mode); returns the root (null when empty).
    pub(super) fn build(&mut self, es: &[(u64, u64, V)]) -> NodePtr<V> {
        if es.is_empty() {
            return core::ptr::null();
        }
        let leaves = self.publish_chunks(es, |c| Node::Leaf(Leaf::from_entries(c)));
        self.grow_root(leaves)
    }

    /// Marks every node of the tree under `root` as replaced (for an edit
    /// that rebuilds the whole tree).
    pub(super) fn discard_all(&mut self, root: NodePtr<V>) {
        fn rec<V>(garbage: &mut Vec<NodePtr<V>>, n: &Node<V>) {
            garbage.push(n as NodePtr<V>);
            if let Node::Internal(x) = n {
                for k in 0..x.len {
                    rec(garbage, x.child(k));
                }
            }
        }
        if !root.is_null() {
            // SAFETY: `root` is the working root (see `working`).
            let n = unsafe { self.working(root) };
            rec(&mut self.garbage.nodes, n);
        }
    }

    /// Path copy: the common case copies one fixed-size node per level;
    /// only a full node splits in two.
    fn insert_rec(&mut self, n: &'e Node<V>, s: u64, e: u64, v: V) -> Grown<V> {
        self.replaced(n);
        match n {
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
                match self.insert_rec(n.child(i), s, e, v) {
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
    pub(super) fn replace(&mut self, root: NodePtr<V>, s: u64, e: u64, v: V) -> NodePtr<V> {
        // SAFETY: `root` is the working root (see `working`).
        let n = unsafe { self.working(root) };
        self.replace_rec(n, s, e, v).0
    }

    fn replace_rec(&mut self, n: &'e Node<V>, s: u64, e: u64, v: V) -> (NodePtr<V>, Summary) {
        self.replaced(n);
        match n {
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
                let k = self.replace_rec(n.child(i), s, e, v);
                let mut m = n.copy();
                m.set(i, k);
                self.publish_node(Node::Internal(m))
            }
        }
    }

    /// Removes the entry starting at `s` (which must exist); returns the
    /// new root (null when the tree becomes empty).
    pub(super) fn remove(&mut self, root: NodePtr<V>, s: u64) -> NodePtr<V> {
        // SAFETY: `root` is the working root (see `working`).
        let mut r = self.remove_rec(unsafe { self.working(root) }, s);
        // Collapse single-child internal roots.
        while let Some((p, _)) = r {
            // SAFETY: `p` was built by this edit, or is the only child of
            // a node it built (so part of the working tree).
            match unsafe { self.working(p) } {
                Node::Internal(n) if n.len == 1 => {
                    self.garbage.nodes.push(p);
                    r = Some((n.kids[0], n.kid_summary(0)));
                }
                _ => break,
            }
        }
        r.map_or(core::ptr::null(), |(p, _)| p)
    }

    fn remove_rec(&mut self, n: &'e Node<V>, s: u64) -> Option<(NodePtr<V>, Summary)> {
        self.replaced(n);
        match n {
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
                match self.remove_rec(n.child(i), s) {
                    // SAFETY: `k` was just built by this edit.
                    Some(k) if n.len == 1 || unsafe { self.working(k.0) }.len() >= MIN => {
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
        // SAFETY: the child was just built by this edit.
        if kids.len() < 2 || unsafe { self.working(kids[i].0) }.len() >= MIN {
            return;
        }
        let j = if i + 1 < kids.len() { i + 1 } else { i - 1 };
        let (a, b) = (i.min(j), i.max(j));
        // SAFETY: each is a child of a node of the working tree or was
        // just built by this edit.
        let (na, nb) = unsafe { (self.working(kids[a].0), self.working(kids[b].0)) };
        self.replaced(na);
        self.replaced(nb);
        // Both siblings' items, in order, shared out again.
        let repl = match (na, nb) {
            (Node::Leaf(x), Node::Leaf(y)) => {
                let es: Vec<_> = x.entries().into_iter().chain(y.entries()).collect();
                self.publish_chunks(&es, |c| Node::Leaf(Leaf::from_entries(c)))
            }
            (Node::Internal(x), Node::Internal(y)) => {
                let ks: Vec<_> = x.kid_list().into_iter().chain(y.kid_list()).collect();
                self.publish_chunks(&ks, |c| Node::Internal(Internal::from_kids(c)))
            }
            _ => unreachable!("siblings are at the same height"),
        };
        kids.splice(a..=b, repl);
    }
}
