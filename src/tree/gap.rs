//! Free-area search: the lowest or highest aligned hole of a given size in
//! a window, found through the subtree summaries (Linux's
//! `mas_empty_area` / `mas_empty_area_rev`).
//!
//! A search looks at the hole before the first entry, the holes inside the
//! tree and the hole after the last entry, nearest end first; it descends
//! only into subtrees whose largest hole is big enough, and stops once the
//! subtrees left lie beyond the window. The lowest and the highest search
//! are one walk ([`GapQuery`]) in opposite directions.
//!
//! # Locking
//!
//! None: a lock-free read under the caller's [`Guard`], like every read
//! (see [`super::read`] and the lock order in [`crate::mm`]).

use super::node::{Node, Summary};
use super::RangeTree;
use crate::reclaim::Guard;

impl<V: Clone + Send + Sync + 'static> RangeTree<V> {
    /// The lowest `s`, a multiple of `align`, such that `[s, s + size)`
    /// lies inside `[lo, hi)` and overlaps no entry. `None` if there is
    /// none, or for `size == 0`, an `align` that is not a power of two, or
    /// `lo >= hi`.
    pub fn gap_lowest(&self, lo: u64, hi: u64, size: u64, align: u64, g: &Guard) -> Option<u64> {
        GapQuery::<true>::new(lo, hi, size, align)?.search(self.root(g))
    }

    /// The highest `s`, a multiple of `align`, such that `[s, s + size)`
    /// lies inside `[lo, hi)` and overlaps no entry (same rules as
    /// [`gap_lowest`](Self::gap_lowest)).
    pub fn gap_highest(&self, lo: u64, hi: u64, size: u64, align: u64, g: &Guard) -> Option<u64> {
        GapQuery::<false>::new(lo, hi, size, align)?.search(self.root(g))
    }

    /// For one slot of a [`super::RangeForest`]: the best fit inside
    /// `[lo, hi)` among this tree's holes except the one beyond its far
    /// end (below its first entry for the highest fit, above its last for
    /// the lowest), which other slots bound; and the tree's
    /// `(first start, last end)`, `None` when empty. One root load: the
    /// fit and the bounds come from one version of the tree.
    pub(super) fn gap_in_slot<const LOWEST: bool>(
        &self,
        lo: u64,
        hi: u64,
        size: u64,
        align: u64,
        g: &Guard,
    ) -> (Option<u64>, Option<(u64, u64)>) {
        let Some(root) = self.root(g) else {
            return (None, None);
        };
        let s = root.summary();
        let (lo, hi) = if LOWEST {
            (lo, hi.min(s.last))
        } else {
            (lo.max(s.first), hi)
        };
        let fit = GapQuery::<LOWEST>::new(lo, hi, size, align).and_then(|q| q.search(Some(root)));
        (fit, Some((s.first, s.last)))
    }

    /// The best fit inside `[lo, hi)` when all of it is free.
    pub(super) fn gap_free<const LOWEST: bool>(
        lo: u64,
        hi: u64,
        size: u64,
        align: u64,
    ) -> Option<u64> {
        GapQuery::<LOWEST>::new(lo, hi, size, align)?.search::<V>(None)
    }
}

/// A free-area query: the lowest fit when `LOWEST`, else the highest.
#[derive(Clone, Copy)]
struct GapQuery<const LOWEST: bool> {
    /// The window's start.
    /// Protected by: a value owned by the search.
    lo: u64,
    /// The window's end (exclusive).
    /// Protected by: a value owned by the search.
    hi: u64,
    /// The hole size wanted.
    /// Protected by: a value owned by the search.
    size: u64,
    /// The alignment of the fit (a power of two).
    /// Protected by: a value owned by the search.
    align: u64,
}

impl<const LOWEST: bool> GapQuery<LOWEST> {
    /// The query, or `None` when no fit can exist: `size == 0`, an `align`
    /// that is not a power of two, or a window `[lo, hi)` smaller than
    /// `size`.
    fn new(lo: u64, hi: u64, size: u64, align: u64) -> Option<Self> {
        (size != 0 && align.is_power_of_two() && lo < hi && hi - lo >= size).then_some(GapQuery {
            lo,
            hi,
            size,
            align,
        })
    }

    /// The best fit in the tree under `root` (or an empty tree).
    fn search<V>(&self, root: Option<&Node<V>>) -> Option<u64> {
        let Some(root) = root else {
            return self.fit(0, u64::MAX);
        };
        let s = root.summary();
        let (below, above) = ((0, s.first), (s.last, u64::MAX));
        let (near, far) = if LOWEST {
            (below, above)
        } else {
            (above, below)
        };
        self.fit(near.0, near.1)
            .or_else(|| self.inside(root, s))
            .or_else(|| self.fit(far.0, far.1))
    }

    /// The best fit inside the hole `[a, b)`.
    fn fit(&self, a: u64, b: u64) -> Option<u64> {
        if LOWEST {
            let s = crate::addr::align_up(a.max(self.lo), self.align)?;
            let end = s.checked_add(self.size)?;
            (end <= b.min(self.hi)).then_some(s)
        } else {
            let top = b.min(self.hi);
            let s = crate::addr::align_down(top.checked_sub(self.size)?, self.align);
            (s >= a.max(self.lo) && s.checked_add(self.size)? <= top).then_some(s)
        }
    }

    /// `0..n` in search order (ascending for the lowest fit).
    fn in_order(n: usize) -> impl Iterator<Item = usize> {
        (0..n).map(move |i| if LOWEST { i } else { n - 1 - i })
    }

    /// True if a subtree spanning `[first, last)` with largest inner hole
    /// `gap` may hold a fit.
    fn worth(&self, s: Summary) -> bool {
        s.gap >= self.size && s.last > self.lo && s.first < self.hi
    }

    /// True if the subtree `s`, and so every one after it in search order,
    /// lies beyond the window.
    fn beyond(&self, s: Summary) -> bool {
        if LOWEST {
            s.first >= self.hi
        } else {
            s.last <= self.lo
        }
    }

    /// The best fit in the holes inside the subtree `n` (summary `s`).
    fn inside<V>(&self, n: &Node<V>, s: Summary) -> Option<u64> {
        if !self.worth(s) {
            return None;
        }
        match n {
            // Hole `j` lies between entries `j - 1` and `j`.
            Node::Leaf(l) => Self::in_order(l.len - 1)
                .map(|h| h + 1)
                .find_map(|j| self.fit(l.ends[j - 1], l.starts[j])),
            Node::Internal(x) => {
                let mut before = None;
                for k in Self::in_order(x.len) {
                    let ks = x.kid_summary(k);
                    if let Some(p) = before.replace(k) {
                        // The hole between this child and the one searched
                        // before it.
                        let (a, b) = (p.min(k), p.max(k));
                        if let Some(f) = self.fit(x.lasts[a], x.firsts[b]) {
                            return Some(f);
                        }
                        if self.beyond(ks) {
                            return None;
                        }
                    }
                    if let Some(f) = self.inside(x.child(k), ks) {
                        return Some(f);
                    }
                }
                None
            }
        }
    }
}
