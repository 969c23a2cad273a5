//! The node layout: immutable B-tree nodes, their subtree summaries, and
//! the one way to turn a node pointer into a reference (tied to a pin).
//!
//! Every child slot of an internal node carries a summary of its subtree:
//! the first start, the last end, and the largest hole between two
//! consecutive entries inside it. The hole between two children is
//! `first[i + 1] - last[i]`. Summaries depend only on the subtree's
//! contents, so a path copy ([`super::edit`]) recomputes exactly the path.
//!
//! # Locking
//!
//! A node is written only while it is private to the edit that builds it
//! (under the tree's writer mutex, level 3 of the lock order in
//! [`crate::mm`]); once published it is immutable until it is retired and
//! its grace period has passed. Readers therefore hold no lock, only a
//! [`Guard`], and every node reference is bounded by one: [`node`] returns
//! a reference that lives no longer than the guard it is given, and
//! [`Internal::child`] one that lives no longer than its parent's.

use crate::addr::Range;
use crate::reclaim::Guard;

/// Maximum entries in a leaf / children in an internal node.
pub(super) const B: usize = 16;
/// Minimum fill of a non-root node.
pub(super) const MIN: usize = B / 2;

pub(super) type NodePtr<V> = *const Node<V>;

/// A leaf: up to `B` entries sorted by start.
pub(super) struct Leaf<V> {
    /// Entries in use.
    /// Protected by: immutable after publication.
    pub(super) len: usize,
    /// Entry starts, sorted.
    /// Protected by: immutable after publication.
    pub(super) starts: [u64; B],
    /// Entry ends (exclusive).
    /// Protected by: immutable after publication.
    pub(super) ends: [u64; B],
    /// Entry values (`Some` exactly below `len`).
    /// Protected by: immutable after publication.
    pub(super) vals: [Option<V>; B],
}

/// An internal node: up to `B` children with their summaries.
pub(super) struct Internal<V> {
    /// Children in use.
    /// Protected by: immutable after publication.
    pub(super) len: usize,
    /// Each child's first start.
    /// Protected by: immutable after publication.
    pub(super) firsts: [u64; B],
    /// Each child's last end.
    /// Protected by: immutable after publication.
    pub(super) lasts: [u64; B],
    /// Each child's largest inner hole.
    /// Protected by: immutable after publication.
    pub(super) gaps: [u64; B],
    /// The children. Each is retired no earlier than this node: replacing
    /// a child copies its parent, and both go in the same batch.
    /// Protected by: immutable after publication; the nodes they point to
    /// by the epoch.
    pub(super) kids: [NodePtr<V>; B],
}

/// A tree node. Both kinds live inline: a node is one allocation.
#[allow(clippy::large_enum_variant)]
pub(super) enum Node<V> {
    Leaf(Leaf<V>),
    Internal(Internal<V>),
}

// SAFETY: a node owns its values and only points to other nodes of the
// same tree; moving it to the reclaiming thread drops `V`s there (needs
// Send) and touches no child.
unsafe impl<V: Send> Send for Node<V> {}

/// Summary of a subtree: first start, last end, largest inner hole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Summary {
    /// The first entry's start.
    /// Protected by: a value (copied out of an immutable node).
    pub(super) first: u64,
    /// The last entry's end.
    /// Protected by: a value (copied out of an immutable node).
    pub(super) last: u64,
    /// The largest hole between two consecutive entries.
    /// Protected by: a value (copied out of an immutable node).
    pub(super) gap: u64,
}

/// Borrows a node behind a pointer for as long as `pin` is held (the
/// returned borrow's lifetime is the pin's, by elision).
///
/// # Safety
/// `p` must point to a node that stays live while `pin` is held: reachable
/// from a root loaded while `pin` was held (readers), or reachable from
/// the writer's working root or built by its current edit, which runs
/// under `pin` (the writer).
#[inline(always)]
pub(super) unsafe fn node<V>(p: NodePtr<V>, _pin: &Guard) -> &Node<V> {
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

    #[inline]
    pub(super) fn from_entries(es: &[(u64, u64, V)]) -> Self {
        let mut l = Self::empty();
        for (i, (s, e, v)) in es.iter().enumerate() {
            l.starts[i] = *s;
            l.ends[i] = *e;
            l.vals[i] = Some(v.clone());
        }
        l.len = es.len();
        l
    }

    pub(super) fn entries(&self) -> Vec<(u64, u64, V)> {
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

    /// A copy (values cloned; arrays copied).
    pub(super) fn copy(&self) -> Self {
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
    pub(super) fn insert_at(&mut self, at: usize, s: u64, e: u64, v: V) {
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
    #[inline]
    pub(super) fn remove_at(&mut self, at: usize) {
        let n = self.len;
        self.starts.copy_within(at + 1..n, at);
        self.ends.copy_within(at + 1..n, at);
        self.vals[at..n].rotate_left(1);
        self.vals[n - 1] = None;
        self.len -= 1;
    }
}

impl<V> Leaf<V> {
    /// The range of entry `i`.
    #[inline]
    pub(super) fn entry(&self, i: usize) -> Range {
        Range::new(self.starts[i], self.ends[i])
    }

    /// The value of entry `i` (below `len`).
    #[inline]
    pub(super) fn val(&self, i: usize) -> &V {
        self.vals[i].as_ref().expect("slot below len holds a value")
    }
}

impl<V> Internal<V> {
    pub(super) fn from_kids(kids: &[(NodePtr<V>, Summary)]) -> Self {
        let mut n = Internal {
            len: kids.len(),
            firsts: [0; B],
            lasts: [0; B],
            gaps: [0; B],
            kids: [core::ptr::null(); B],
        };
        for (i, &k) in kids.iter().enumerate() {
            n.set(i, k);
        }
        n
    }

    /// Child `k`, borrowed no longer than this node.
    #[inline(always)]
    pub(super) fn child(&self, k: usize) -> &Node<V> {
        debug_assert!(k < self.len);
        // SAFETY: a node reference is bounded by a pin under which the node
        // stays live (see `node`). Its children stay live at least as long:
        // a child is retired either in the same batch as this node (a path
        // copy replaced both) or later (it stayed in the new tree), so its
        // grace period ends no earlier than this node's.
        unsafe { &*self.kids[k] }
    }

    /// The summary kept for child `k`.
    #[inline]
    pub(super) fn kid_summary(&self, k: usize) -> Summary {
        Summary {
            first: self.firsts[k],
            last: self.lasts[k],
            gap: self.gaps[k],
        }
    }

    pub(super) fn kid_list(&self) -> Vec<(NodePtr<V>, Summary)> {
        (0..self.len)
            .map(|i| (self.kids[i], self.kid_summary(i)))
            .collect()
    }

    /// A copy (child pointers are shared, not copied).
    pub(super) fn copy(&self) -> Self {
        Internal {
            len: self.len,
            firsts: self.firsts,
            lasts: self.lasts,
            gaps: self.gaps,
            kids: self.kids,
        }
    }

    /// Sets child `i`.
    pub(super) fn set(&mut self, i: usize, (p, s): (NodePtr<V>, Summary)) {
        self.kids[i] = p;
        self.firsts[i] = s.first;
        self.lasts[i] = s.last;
        self.gaps[i] = s.gap;
    }

    /// Inserts a child at `at` (the node has room).
    pub(super) fn insert_at(&mut self, at: usize, k: (NodePtr<V>, Summary)) {
        let n = self.len;
        self.kids.copy_within(at..n, at + 1);
        self.firsts.copy_within(at..n, at + 1);
        self.lasts.copy_within(at..n, at + 1);
        self.gaps.copy_within(at..n, at + 1);
        self.len += 1;
        self.set(at, k);
    }
}

impl<V> Node<V> {
    pub(super) fn len(&self) -> usize {
        match self {
            Node::Leaf(l) => l.len,
            Node::Internal(n) => n.len,
        }
    }

    /// The summary of this node's subtree (non-empty nodes only).
    pub(super) fn summary(&self) -> Summary {
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

/// Frees a whole subtree (the tree is being dropped: nobody can see it).
///
/// # Safety
/// `p` must be owned by the caller and reachable by nobody else.
pub(super) unsafe fn free_subtree<V>(p: NodePtr<V>) {
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
/// The lookup hot path, run once per tree level of every fault. A
/// branch-free binary search: each step is a load, a compare and a
/// conditional move, so nothing depends on the CPU guessing which way
/// the count goes (a linear count costs one compare-and-branch per key
/// here, since this crate keeps overflow checks on in release builds, and
/// its exit branch is mispredicted whenever the count changes).
#[inline(always)]
pub(super) fn rank(keys: &[u64; B], len: usize, x: u64) -> usize {
    const { assert!(B.is_power_of_two()) };
    let mut n = 0;
    let mut step = B / 2;
    while step > 0 {
        // `n` is a multiple of `2 * step`: `n | step` keys are at or below
        // `x` if the last of them, `keys[n | (step - 1)]`, is.
        let take = ((n | step) <= len) & (keys[n | (step - 1)] <= x);
        n = if take { n | step } else { n };
        step /= 2;
    }
    // `n < B` here; the last key decides whether all `B` are.
    n + usize::from((n < len) & (keys[n] <= x))
}
