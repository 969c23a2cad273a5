//! Lock-free reads: point lookups, neighbours, range iteration and the
//! size figures.
//!
//! # Locking
//!
//! None: every read takes the caller's [`Guard`] (a pin of the tree's
//! reclaimer), loads the root with `Acquire` and walks immutable nodes. It
//! takes no lock of the order in [`crate::mm`] and writes no shared memory.
//! Each returned reference lives no longer than the guard.

use super::node::{rank, Leaf, Node};
use super::RangeTree;
use crate::addr::Range;
use crate::reclaim::Guard;

impl<V: Clone + Send + Sync + 'static> RangeTree<V> {
    /// The entry containing `addr`.
    #[inline]
    pub fn find<'g>(&'g self, addr: u64, g: &'g Guard) -> Option<(Range, &'g V)> {
        self.find_around(addr, g).map(|a| a.entry())
    }

    /// The entry containing `addr`, with a view of the leaf that holds
    /// it: its neighbours there come without another descent.
    #[inline]
    pub fn find_around<'g>(&'g self, addr: u64, g: &'g Guard) -> Option<Around<'g, V>> {
        let mut n = self.root(g)?;
        loop {
            match n {
                Node::Internal(x) => {
                    let i = rank(&x.firsts, x.len, addr);
                    if i == 0 {
                        return None;
                    }
                    n = x.child(i - 1);
                }
                Node::Leaf(l) => {
                    let i = rank(&l.starts, l.len, addr);
                    if i == 0 || l.ends[i - 1] <= addr {
                        return None;
                    }
                    return Some(Around { leaf: l, at: i - 1 });
                }
            }
        }
    }

    /// The first entry whose end is above `addr` (Linux's `find_vma`).
    pub fn find_after<'g>(&'g self, addr: u64, g: &'g Guard) -> Option<(Range, &'g V)> {
        let mut n = self.root(g)?;
        loop {
            match n {
                Node::Internal(x) => {
                    let i = x.lasts[..x.len].partition_point(|&e| e <= addr);
                    if i == x.len {
                        return None;
                    }
                    n = x.child(i);
                }
                Node::Leaf(l) => {
                    let i = l.ends[..l.len].partition_point(|&e| e <= addr);
                    if i == l.len {
                        return None;
                    }
                    return Some((l.entry(i), l.vals[i].as_ref()?));
                }
            }
        }
    }

    /// The last entry whose end is at or below `addr`.
    pub fn prev<'g>(&'g self, addr: u64, g: &'g Guard) -> Option<(Range, &'g V)> {
        fn rec<V>(n: &Node<V>, addr: u64) -> Option<(Range, &V)> {
            match n {
                Node::Internal(x) => {
                    // Children whose first entry ends by `addr` may hold it;
                    // try the last candidate, then the one before.
                    let i = x.firsts[..x.len].partition_point(|&f| f < addr);
                    for k in (0..i).rev() {
                        if let Some(r) = rec(x.child(k), addr) {
                            return Some(r);
                        }
                        if x.lasts[k] <= addr {
                            break;
                        }
                    }
                    None
                }
                Node::Leaf(l) => {
                    let i = l.ends[..l.len].partition_point(|&e| e <= addr);
                    (i > 0).then(|| (l.entry(i - 1), l.val(i - 1)))
                }
            }
        }
        rec(self.root(g)?, addr)
    }

    /// The first entry whose start is at or above `addr`.
    pub fn next<'g>(&'g self, addr: u64, g: &'g Guard) -> Option<(Range, &'g V)> {
        fn rec<V>(n: &Node<V>, addr: u64) -> Option<(Range, &V)> {
            match n {
                Node::Internal(x) => {
                    let i = x.lasts[..x.len].partition_point(|&e| e <= addr);
                    (i..x.len).find_map(|k| rec(x.child(k), addr))
                }
                Node::Leaf(l) => {
                    let i = l.starts[..l.len].partition_point(|&s| s < addr);
                    (i < l.len).then(|| (l.entry(i), l.val(i)))
                }
            }
        }
        rec(self.root(g)?, addr)
    }

    /// The entries intersecting `r`, in ascending order.
    pub fn range<'g>(
        &'g self,
        r: Range,
        g: &'g Guard,
    ) -> impl Iterator<Item = (Range, &'g V)> + 'g {
        self.range_vec(r, g).into_iter()
    }

    /// [`range`](Self::range) as the list it builds (the forest takes a
    /// slot's list as it is).
    pub(super) fn range_vec<'g>(&'g self, r: Range, g: &'g Guard) -> Vec<(Range, &'g V)> {
        let mut out = Vec::new();
        self.walk(r, g, |e, v| out.push((e, v)));
        out
    }

    /// The entries intersecting `r`, cloned onto `out` in ascending order
    /// (a writer's kept list: no allocation once it has grown).
    pub(super) fn range_into(&self, r: Range, g: &Guard, out: &mut Vec<(Range, V)>)
    where
        V: Clone,
    {
        self.walk(r, g, |e, v| out.push((e, v.clone())));
    }

    /// Calls `f` on each entry intersecting `r`, in ascending order. The
    /// descent takes `f` as a trait object: one copy of it serves every
    /// caller (generic over `f`, the writers' paths ran two, 1.3 KiB
    /// each, `docs/RESULTS.md`, "The slot owner's code in one copy").
    pub(super) fn walk<'g>(&'g self, r: Range, g: &'g Guard, mut f: impl FnMut(Range, &'g V)) {
        fn rec<'g, V>(n: &'g Node<V>, r: Range, f: &mut dyn FnMut(Range, &'g V)) {
            match n {
                Node::Internal(x) => {
                    for k in 0..x.len {
                        if x.lasts[k] > r.start && x.firsts[k] < r.end {
                            rec(x.child(k), r, f);
                        }
                    }
                }
                Node::Leaf(l) => {
                    for i in 0..l.len {
                        let e = l.entry(i);
                        if e.overlaps(&r) {
                            f(e, l.val(i));
                        }
                    }
                }
            }
        }
        if !r.is_empty() {
            if let Some(root) = self.root(g) {
                rec(root, r, &mut f);
            }
        }
    }

    /// All entries in ascending order.
    pub fn iter<'g>(&'g self, g: &'g Guard) -> impl Iterator<Item = (Range, &'g V)> + 'g {
        self.range(Range::new(0, u64::MAX), g)
    }

    /// Bytes of node memory reachable from the current root.
    pub fn memory_bytes(&self) -> usize {
        fn rec<V>(n: &Node<V>) -> usize {
            core::mem::size_of::<Node<V>>()
                + match n {
                    Node::Internal(x) => (0..x.len).map(|k| rec(x.child(k))).sum(),
                    Node::Leaf(_) => 0,
                }
        }
        let g = self.pin();
        self.root(&g).map_or(0, rec)
    }

    /// Levels of nodes (0 for an empty tree, 1 for a single leaf).
    pub fn height(&self) -> usize {
        let g = self.pin();
        let mut h = 0;
        let mut n = self.root(&g);
        while let Some(x) = n {
            h += 1;
            n = match x {
                Node::Internal(i) => Some(i.child(0)),
                Node::Leaf(_) => None,
            };
        }
        h
    }
}

/// An entry found by [`RangeTree::find_around`] and the leaf holding it,
/// valid as long as the guard of the lookup.
pub struct Around<'g, V> {
    /// The leaf (immutable once published).
    leaf: &'g Leaf<V>,
    /// The found entry's index in it.
    at: usize,
}

impl<'g, V> Around<'g, V> {
    /// The found entry.
    #[inline]
    pub fn entry(&self) -> (Range, &'g V) {
        (self.leaf.entry(self.at), self.leaf.val(self.at))
    }

    /// The entry `d` places after the found one (before it if `d` is
    /// negative), if it lies in the same leaf. `None` says nothing of the
    /// tree beyond the leaf: the caller looks such a neighbour up itself.
    #[inline]
    pub fn nearby(&self, d: isize) -> Option<(Range, &'g V)> {
        let i = self
            .at
            .checked_add_signed(d)
            .filter(|&i| i < self.leaf.len)?;
        Some((self.leaf.entry(i), self.leaf.val(i)))
    }
}
