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
//! [`Reclaimer`]. Readers pin the reclaimer, load the root with `Acquire`
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

mod node;

use crate::addr::Range;
use crate::reclaim::{Guard, Reclaimer};
use crate::sync::{Arc, AtomicPtr, AtomicUsize, Mutex, MutexGuard, Ordering};
use node::{node, Editor, Node, NodeCache, NodePtr, Summary, B, MIN};

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
    root: AtomicPtr<Node<V>>,
    len: AtomicUsize,
    writer: Mutex<()>,
    reclaimer: Reclaimer,
    /// Memory of retired nodes for the writer to reuse (shared with the
    /// deferred frees, which may run after the tree is gone).
    cache: Arc<NodeCache<V>>,
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
            reclaimer,
            cache: Arc::new(NodeCache::new()),
        }
    }

    /// A tree holding `entries`, which must be sorted by start and
    /// non-overlapping, built in one pass with full nodes (like the maple
    /// tree's bulk mode: fewer levels than one insert at a time, which
    /// leaves nodes half full after sequential splits). Epoch
    /// reclamation.
    pub fn from_sorted(entries: impl IntoIterator<Item = (Range, V)>) -> Result<Self, TreeError> {
        let es = sorted_entries(entries)?;
        let t = Self::new();
        let root = Editor::new(&t.cache).build(&es);
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
    fn root<'g>(&'g self, _g: &'g Guard) -> Option<&'g Node<V>> {
        let p = self.root.load(Ordering::Acquire);
        // SAFETY: the root was published with Release after its subtree was
        // built; nodes are retired only after being unlinked, and freed
        // only after every guard pinned before that (like `_g`) is gone.
        (!p.is_null()).then(|| unsafe { node(p) })
    }

    /// The entry containing `addr`.
    #[inline]
    pub fn find<'g>(&'g self, addr: u64, g: &'g Guard) -> Option<(Range, &'g V)> {
        let mut n = self.root(g)?;
        loop {
            match n {
                Node::Internal(x) => {
                    let i = node::rank(&x.firsts, x.len, addr);
                    if i == 0 {
                        return None;
                    }
                    // SAFETY: children of a live node are live (see `root`).
                    n = unsafe { node(x.kids[i - 1]) };
                }
                Node::Leaf(l) => {
                    let i = node::rank(&l.starts, l.len, addr);
                    if i == 0 || l.ends[i - 1] <= addr {
                        return None;
                    }
                    return Some((node::entry(l, i - 1), l.vals[i - 1].as_ref()?));
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
                    // SAFETY: as in `find`.
                    n = unsafe { node(x.kids[i]) };
                }
                Node::Leaf(l) => {
                    let i = l.ends[..l.len].partition_point(|&e| e <= addr);
                    if i == l.len {
                        return None;
                    }
                    return Some((node::entry(l, i), l.vals[i].as_ref()?));
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
                        // SAFETY: as in `find`.
                        if let Some(r) = rec(unsafe { node(x.kids[k]) }, addr) {
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
                    (i > 0).then(|| {
                        (
                            node::entry(l, i - 1),
                            l.vals[i - 1].as_ref().expect("slot holds a value"),
                        )
                    })
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
                    for k in i..x.len {
                        // SAFETY: as in `find`.
                        if let Some(r) = rec(unsafe { node(x.kids[k]) }, addr) {
                            return Some(r);
                        }
                    }
                    None
                }
                Node::Leaf(l) => {
                    let i = l.starts[..l.len].partition_point(|&s| s < addr);
                    (i < l.len).then(|| {
                        (
                            node::entry(l, i),
                            l.vals[i].as_ref().expect("slot holds a value"),
                        )
                    })
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
        fn rec<'g, V>(n: &'g Node<V>, r: Range, out: &mut Vec<(Range, &'g V)>) {
            match n {
                Node::Internal(x) => {
                    for k in 0..x.len {
                        if x.lasts[k] > r.start && x.firsts[k] < r.end {
                            // SAFETY: as in `find`.
                            rec(unsafe { node(x.kids[k]) }, r, out);
                        }
                    }
                }
                Node::Leaf(l) => {
                    for i in 0..l.len {
                        let e = node::entry(l, i);
                        if e.overlaps(&r) {
                            out.push((e, l.vals[i].as_ref().expect("slot holds a value")));
                        }
                    }
                }
            }
        }
        let mut out = Vec::new();
        if !r.is_empty() {
            if let Some(root) = self.root(g) {
                rec(root, r, &mut out);
            }
        }
        out.into_iter()
    }

    /// All entries in ascending order.
    pub fn iter<'g>(&'g self, g: &'g Guard) -> impl Iterator<Item = (Range, &'g V)> + 'g {
        self.range(Range::new(0, u64::MAX), g)
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// True if there are no entries.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of node memory reachable from the current root.
    pub fn memory_bytes(&self) -> usize {
        fn rec<V>(n: &Node<V>) -> usize {
            core::mem::size_of::<Node<V>>()
                + match n {
                    // SAFETY: as in `find` (the caller's pin below).
                    Node::Internal(x) => x.kids[..x.len]
                        .iter()
                        .map(|&k| rec(unsafe { node(k) }))
                        .sum(),
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
                // SAFETY: as in `find`.
                Node::Internal(i) => Some(unsafe { node(i.kids[0]) }),
                Node::Leaf(_) => None,
            };
        }
        h
    }

    /// The lowest `s`, a multiple of `align`, such that `[s, s + size)`
    /// lies inside `[lo, hi)` and overlaps no entry. `None` if there is
    /// none, or for `size == 0`, an `align` that is not a power of two, or
    /// `lo >= hi`.
    pub fn gap_lowest(&self, lo: u64, hi: u64, size: u64, align: u64, g: &Guard) -> Option<u64> {
        if size == 0 || !align.is_power_of_two() || lo >= hi || hi - lo < size {
            return None;
        }
        let q = GapQuery {
            lo,
            hi,
            size,
            align,
        };
        let Some(root) = self.root(g) else {
            return q.fit_low(0, u64::MAX);
        };
        let s = root.summary();
        q.fit_low(0, s.first)
            .or_else(|| q.low_in(root, s))
            .or_else(|| q.fit_low(s.last, u64::MAX))
    }

    /// The highest `s`, a multiple of `align`, such that `[s, s + size)`
    /// lies inside `[lo, hi)` and overlaps no entry (same rules as
    /// [`gap_lowest`](Self::gap_lowest)).
    pub fn gap_highest(&self, lo: u64, hi: u64, size: u64, align: u64, g: &Guard) -> Option<u64> {
        if size == 0 || !align.is_power_of_two() || lo >= hi || hi - lo < size {
            return None;
        }
        let q = GapQuery {
            lo,
            hi,
            size,
            align,
        };
        let Some(root) = self.root(g) else {
            return q.fit_high(0, u64::MAX);
        };
        let s = root.summary();
        q.fit_high(s.last, u64::MAX)
            .or_else(|| q.high_in(root, s))
            .or_else(|| q.fit_high(0, s.first))
    }

    /// Asks the reclaimer to free what it can now (epoch: flush this
    /// thread's deferred frees and try to advance the epoch).
    pub fn collect(&self) {
        let g = self.reclaimer.pin();
        self.reclaimer.flush(&g);
    }

    /// Takes the writer side. Writers are serialized; readers are not
    /// blocked.
    pub fn writer(&self) -> TreeWriter<'_, V> {
        TreeWriter {
            tree: self,
            _lock: self.writer.lock(),
        }
    }

    /// Checks every structural invariant: entries sorted and disjoint and
    /// non-empty, summaries exact, node fill between the minimum and `B`
    /// (the root excepted), all leaves at one depth, `len` exact.
    pub fn check_invariants(&self) -> Result<(), String> {
        let g = self.pin();
        let Some(root) = self.root(&g) else {
            return if self.is_empty() {
                Ok(())
            } else {
                Err(format!("empty root but len {}", self.len()))
            };
        };
        let mut count = 0;
        let mut leaf_depth = None;
        let mut last_end = 0u64;
        check(root, true, 1, &mut leaf_depth, &mut count, &mut last_end)?;
        if count != self.len() {
            return Err(format!("len {} but {} entries", self.len(), count));
        }
        Ok(())
    }
}

/// An overwrite that hits at least one entry in this many of the tree's
/// rebuilds the tree instead of removing them one by one.
const REBUILD_RATIO: usize = 16;

/// `entries` as node entries, checked sorted by start, non-empty and
/// non-overlapping.
fn sorted_entries<V>(
    entries: impl IntoIterator<Item = (Range, V)>,
) -> Result<Vec<(u64, u64, V)>, TreeError> {
    let it = entries.into_iter();
    let mut es: Vec<(u64, u64, V)> = Vec::with_capacity(it.size_hint().0);
    for (r, v) in it {
        if r.is_empty() {
            return Err(TreeError::EmptyRange);
        }
        if es.last().is_some_and(|&(_, end, _)| end > r.start) {
            return Err(TreeError::Occupied);
        }
        es.push((r.start, r.end, v));
    }
    Ok(es)
}

fn check<V>(
    n: &Node<V>,
    is_root: bool,
    depth: usize,
    leaf_depth: &mut Option<usize>,
    count: &mut usize,
    last_end: &mut u64,
) -> Result<(), String> {
    let len = n.len();
    if len == 0 || len > B || (!is_root && len < MIN) {
        return Err(format!("node fill {len} at depth {depth}"));
    }
    match n {
        Node::Leaf(l) => {
            match leaf_depth {
                Some(d) if *d != depth => return Err(format!("leaves at depths {d} and {depth}")),
                _ => *leaf_depth = Some(depth),
            }
            for i in 0..l.len {
                if l.starts[i] >= l.ends[i] {
                    return Err(format!("empty entry {:?}", node::entry(l, i)));
                }
                if *count > 0 && l.starts[i] < *last_end {
                    return Err(format!(
                        "entry {:?} overlaps or is out of order",
                        node::entry(l, i)
                    ));
                }
                if l.vals[i].is_none() {
                    return Err("slot without a value".into());
                }
                *last_end = l.ends[i];
                *count += 1;
            }
        }
        Node::Internal(x) => {
            for k in 0..x.len {
                // SAFETY: the caller holds a guard (check_invariants).
                let c = unsafe { node(x.kids[k]) };
                let s = c.summary();
                let want = Summary {
                    first: x.firsts[k],
                    last: x.lasts[k],
                    gap: x.gaps[k],
                };
                if s != want {
                    return Err(format!("stale summary {want:?}, subtree has {s:?}"));
                }
                check(c, false, depth + 1, leaf_depth, count, last_end)?;
            }
        }
    }
    Ok(())
}

/// A free-area query.
#[derive(Clone, Copy)]
struct GapQuery {
    lo: u64,
    hi: u64,
    size: u64,
    align: u64,
}

impl GapQuery {
    /// The lowest fit inside the hole `[a, b)`.
    fn fit_low(&self, a: u64, b: u64) -> Option<u64> {
        let s = crate::addr::align_up(a.max(self.lo), self.align)?;
        let end = s.checked_add(self.size)?;
        (end <= b.min(self.hi)).then_some(s)
    }

    /// The highest fit inside the hole `[a, b)`.
    fn fit_high(&self, a: u64, b: u64) -> Option<u64> {
        let top = b.min(self.hi);
        let s = crate::addr::align_down(top.checked_sub(self.size)?, self.align);
        (s >= a.max(self.lo) && s.checked_add(self.size)? <= top).then_some(s)
    }

    /// True if a subtree spanning `[first, last)` with largest inner hole
    /// `gap` may hold a fit.
    fn worth(&self, s: Summary) -> bool {
        s.gap >= self.size && s.last > self.lo && s.first < self.hi
    }

    /// The lowest fit in the holes inside a subtree.
    fn low_in<V>(&self, n: &Node<V>, s: Summary) -> Option<u64> {
        if !self.worth(s) {
            return None;
        }
        match n {
            Node::Leaf(l) => (1..l.len).find_map(|i| self.fit_low(l.ends[i - 1], l.starts[i])),
            Node::Internal(x) => {
                for k in 0..x.len {
                    if k > 0 {
                        if let Some(f) = self.fit_low(x.lasts[k - 1], x.firsts[k]) {
                            return Some(f);
                        }
                        if x.firsts[k] >= self.hi {
                            return None;
                        }
                    }
                    let ks = Summary {
                        first: x.firsts[k],
                        last: x.lasts[k],
                        gap: x.gaps[k],
                    };
                    // SAFETY: the query runs under the caller's guard.
                    if let Some(f) = self.low_in(unsafe { node(x.kids[k]) }, ks) {
                        return Some(f);
                    }
                }
                None
            }
        }
    }

    /// The highest fit in the holes inside a subtree.
    fn high_in<V>(&self, n: &Node<V>, s: Summary) -> Option<u64> {
        if !self.worth(s) {
            return None;
        }
        match n {
            Node::Leaf(l) => (1..l.len)
                .rev()
                .find_map(|i| self.fit_high(l.ends[i - 1], l.starts[i])),
            Node::Internal(x) => {
                for k in (0..x.len).rev() {
                    if k + 1 < x.len {
                        if let Some(f) = self.fit_high(x.lasts[k], x.firsts[k + 1]) {
                            return Some(f);
                        }
                        if x.lasts[k] <= self.lo {
                            return None;
                        }
                    }
                    let ks = Summary {
                        first: x.firsts[k],
                        last: x.lasts[k],
                        gap: x.gaps[k],
                    };
                    // SAFETY: as in `low_in`.
                    if let Some(f) = self.high_in(unsafe { node(x.kids[k]) }, ks) {
                        return Some(f);
                    }
                }
                None
            }
        }
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

/// The writer side of a [`RangeTree`]; reads through it see the latest
/// state.
pub struct TreeWriter<'t, V> {
    tree: &'t RangeTree<V>,
    _lock: MutexGuard<'t, ()>,
}

impl<V> core::ops::Deref for TreeWriter<'_, V> {
    type Target = RangeTree<V>;
    fn deref(&self) -> &RangeTree<V> {
        self.tree
    }
}

impl<V: Clone + Send + Sync + 'static> TreeWriter<'_, V> {
    /// Inserts `r -> v` into a free range.
    pub fn insert(&mut self, r: Range, v: V) -> Result<(), TreeError> {
        if r.is_empty() {
            return Err(TreeError::EmptyRange);
        }
        let g = self.tree.pin();
        if self
            .tree
            .find_after(r.start, &g)
            .is_some_and(|(e, _)| e.start < r.end)
        {
            return Err(TreeError::Occupied);
        }
        let mut ed = Editor::new(&self.tree.cache);
        let root = ed.insert(self.cur(), r.start, r.end, v);
        self.publish(root, ed, 1, &g);
        Ok(())
    }

    /// Stores `r -> v`, overwriting whatever `r` covered: entries that
    /// overlap it are trimmed to their parts outside `r` (which keep their
    /// values). Returns the overwritten pieces with their values. One
    /// atomic step for readers.
    pub fn store(&mut self, r: Range, v: V) -> Vec<(Range, V)> {
        self.overwrite(r, Some(v))
    }

    /// Removes everything inside `r`, trimming entries that overlap its
    /// ends. Returns the removed pieces.
    pub fn erase(&mut self, r: Range) -> Vec<(Range, V)> {
        self.overwrite(r, None)
    }

    /// Keeps only the entries for which `keep` returns true, rebuilding
    /// the tree in one pass with full nodes (cheaper than removing many
    /// entries one by one: a batch purge of lazily freed areas, say).
    /// Returns how many entries were removed. One atomic step for readers.
    pub fn retain(&mut self, mut keep: impl FnMut(Range, &V) -> bool) -> usize {
        let g = self.tree.pin();
        let all = self.tree.len();
        let kept: Vec<(u64, u64, V)> = self
            .tree
            .iter(&g)
            .filter(|(r, v)| keep(*r, v))
            .map(|(r, v)| (r.start, r.end, v.clone()))
            .collect();
        let removed = all - kept.len();
        if removed == 0 {
            return 0;
        }
        let mut ed = Editor::new(&self.tree.cache);
        ed.discard_all(self.cur());
        let root = ed.build(&kept);
        self.publish(root, ed, -(removed as isize), &g);
        removed
    }

    /// Replaces the whole contents with `entries` (sorted by start and
    /// non-overlapping), built in one pass with full nodes as
    /// [`RangeTree::from_sorted`] does; the old nodes are retired as one
    /// batch. This is how a whole tree is duplicated (fork's `__mt_dup`):
    /// one build, never one insert per entry. One atomic step for readers;
    /// on bad input nothing changes.
    pub fn replace_all(
        &mut self,
        entries: impl IntoIterator<Item = (Range, V)>,
    ) -> Result<(), TreeError> {
        let es = sorted_entries(entries)?;
        let g = self.tree.pin();
        let delta = es.len() as isize - self.tree.len() as isize;
        let mut ed = Editor::new(&self.tree.cache);
        ed.discard_all(self.cur());
        let root = ed.build(&es);
        self.publish(root, ed, delta, &g);
        Ok(())
    }

    /// Removes the whole entry containing `addr`.
    pub fn remove(&mut self, addr: u64) -> Option<(Range, V)> {
        let g = self.tree.pin();
        let (r, v) = self.tree.find(addr, &g).map(|(r, v)| (r, v.clone()))?;
        let mut ed = Editor::new(&self.tree.cache);
        let root = ed.remove(self.cur(), r.start);
        self.publish(root, ed, -1, &g);
        Some((r, v))
    }

    fn cur(&self) -> NodePtr<V> {
        self.tree.root.load(Ordering::Relaxed)
    }

    fn overwrite(&mut self, r: Range, v: Option<V>) -> Vec<(Range, V)> {
        if r.is_empty() {
            return Vec::new();
        }
        let g = self.tree.pin();
        let hit: Vec<(Range, V)> = self
            .tree
            .range(r, &g)
            .map(|(e, v)| (e, v.clone()))
            .collect();
        let mut ed = Editor::new(&self.tree.cache);
        // Storing over exactly one entry that starts where `r` does, and
        // at most growing it into free space: one path copy.
        if let (Some(v), [(e, ev)]) = (&v, hit.as_slice()) {
            if e.start == r.start && r.end >= e.end {
                let root = ed.replace(self.cur(), r.start, r.end, v.clone());
                self.publish(root, ed, 0, &g);
                return vec![(*e, ev.clone())];
            }
        }
        // Overwriting many entries (unmapping a large part of the space):
        // one rebuild costs a copy per entry kept, where removing them one
        // by one costs a path copy each.
        if hit.len() > B && hit.len() * REBUILD_RATIO >= self.tree.len() {
            return self.rebuild_over(r, v, hit, ed, &g);
        }
        let mut root = self.cur();
        let mut delta: isize = 0;
        let mut out = Vec::with_capacity(hit.len());
        for (e, ev) in hit {
            root = ed.remove(root, e.start);
            delta -= 1;
            if e.start < r.start {
                root = ed.insert(root, e.start, r.start, ev.clone());
                delta += 1;
            }
            if e.end > r.end {
                root = ed.insert(root, r.end, e.end, ev.clone());
                delta += 1;
            }
            out.push((
                e.intersect(&r).expect("range() yields overlapping entries"),
                ev,
            ));
        }
        if let Some(v) = v {
            root = ed.insert(root, r.start, r.end, v);
            delta += 1;
        }
        self.publish(root, ed, delta, &g);
        out
    }

    /// [`overwrite`](Self::overwrite) by rebuilding the whole tree in one
    /// pass: the entries outside `r`, the parts of `hit` (the entries
    /// overlapping `r`) outside it, and `v` over `r`.
    fn rebuild_over(
        &mut self,
        r: Range,
        v: Option<V>,
        hit: Vec<(Range, V)>,
        mut ed: Editor<'_, V>,
        g: &Guard,
    ) -> Vec<(Range, V)> {
        let mut es: Vec<(u64, u64, V)> = Vec::with_capacity(self.tree.len() - hit.len() + 3);
        for (e, ev) in self.tree.iter(g) {
            if !e.overlaps(&r) {
                es.push((e.start, e.end, ev.clone()));
                continue;
            }
            if e.start < r.start {
                es.push((e.start, r.start, ev.clone()));
            }
            if e.end > r.end {
                es.push((r.end, e.end, ev.clone()));
            }
        }
        if let Some(v) = v {
            let at = es.partition_point(|&(s, _, _)| s < r.start);
            es.insert(at, (r.start, r.end, v));
        }
        let delta = es.len() as isize - self.tree.len() as isize;
        ed.discard_all(self.cur());
        let root = ed.build(&es);
        self.publish(root, ed, delta, g);
        hit.into_iter()
            .map(|(e, ev)| {
                let part = e.intersect(&r).expect("range() yields overlapping entries");
                (part, ev)
            })
            .collect()
    }

    /// Publishes `root` with one Release store, then retires what the edit
    /// replaced.
    fn publish(&mut self, root: NodePtr<V>, ed: Editor<'_, V>, delta: isize, g: &Guard) {
        self.tree
            .root
            .store(root as *mut Node<V>, Ordering::Release);
        let len = self.tree.len.load(Ordering::Relaxed) as isize + delta;
        self.tree.len.store(len as usize, Ordering::Relaxed);
        let garbage = ed.finish();
        if garbage.is_empty() {
            return;
        }
        // One deferred step per edit (not per node), and a cheap one: it
        // only hands the batch back to the writer's node cache.
        let batch = node::Batch::boxed(garbage);
        let cache = self.tree.cache.clone();
        self.tree.reclaimer.defer(g, move || {
            // SAFETY: the batch's nodes were unlinked by this edit (not
            // reachable from the new root), and this runs only after every
            // reader pinned before the publish is gone; the batch is
            // handed over exactly once.
            unsafe { cache.push_ready(batch) };
        });
    }
}

#[cfg(all(test, not(aspace_loom)))]
mod tests;
