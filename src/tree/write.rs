//! The writer: inserts, overwrites, removals and whole-tree rebuilds, each
//! published to readers with one atomic root store.
//!
//! Every write runs an [`Editor`] over the current root, stores the new
//! root with `Release`, and hands the nodes it replaced to the reclaimer as
//! one batch, which ends in the node cache ([`super::cache`]) once no
//! reader can see them.
//!
//! # Locking
//!
//! A [`TreeWriter`] holds the tree's writer mutex, level 3 of the lock
//! order in [`crate::mm`] (taken only by mmap_lock writers, so it is
//! uncontended there), or is an external writer whose caller's own lock
//! serializes the tree's writers ([`RangeTree::external_writer`]: a range
//! lock's hold of a whole forest slot). Readers are never blocked: they
//! see the old root or the new one, never a mix.

use super::cache::Spare;
use super::edit::Editor;
use super::node::{Node, NodePtr, B};
use super::{RangeTree, TreeError};
use crate::addr::Range;
use crate::reclaim::Guard;
use crate::sync::{MutPtr, MutexGuard, Ordering};

/// An overwrite that hits at least one entry in this many of the tree's
/// rebuilds the tree instead of removing them one by one.
const REBUILD_RATIO: usize = 16;

/// The most room the kept list of overwritten entries may have.
const HITS_KEPT: usize = 64;

/// `entries` as node entries, checked sorted by start, non-empty and
/// non-overlapping.
pub(super) fn sorted_entries<V>(
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

/// The writer side of a [`RangeTree`]; reads through it see the latest
/// state.
pub struct TreeWriter<'t, V> {
    /// The tree written.
    /// Protected by: see [`RangeTree`]'s fields.
    tree: &'t RangeTree<V>,
    /// The tree's spare node memory, this writer's alone while it lives
    /// (loom tracks the access from its start to this pointer's drop,
    /// before `_lock`'s: field order).
    /// Protected by: `_lock`, or the lock of an external writer's caller.
    spare: MutPtr<Option<Box<Spare<V>>>>,
    /// The tree's writer mutex, held while the writer lives; `None` for
    /// an [external](RangeTree::external_writer) writer.
    /// Protected by: owned by this writer.
    _lock: Option<MutexGuard<'t, ()>>,
}

// SAFETY: a shared writer only reads the tree (`Deref`, `tree`), which
// is `Sync` for such `V`; the spare memory behind the pointer is reached
// only through `&mut self`. (Not `Send`: a mutex guard stays on its
// thread.)
unsafe impl<V: Send + Sync> Sync for TreeWriter<'_, V> {}

const _: () = {
    const fn sync<T: Sync>() {}
    sync::<TreeWriter<'static, u64>>();
};

impl<V: Clone + Send + Sync + 'static> RangeTree<V> {
    /// Takes the writer side. Writers are serialized; readers are not
    /// blocked.
    pub fn writer(&self) -> TreeWriter<'_, V> {
        let lock = self.writer.lock();
        TreeWriter {
            tree: self,
            spare: self.spare.get_mut(),
            _lock: Some(lock),
        }
    }

    /// The writer side without the writer mutex, for a caller whose own
    /// lock serializes this tree's writers (the maple tree's "external
    /// lock": the mmap_lock there, a range lock's hold of a whole forest
    /// slot here). The mutex's lock and unlock are two read-modify-writes
    /// per store, each waiting for the stores before it to drain; the
    /// owner of a slot's bias stores a few times per call.
    ///
    /// # Safety
    /// While the writer lives, no other writer of this tree may live,
    /// whichever way it was taken: the caller's lock keeps out every
    /// other holder that writes the tree (those that take
    /// [`writer`](Self::writer) included). That lock must also order
    /// this writer after the tree's previous one and before its next
    /// (the previous holder's release happens before this caller's
    /// acquire), as a mutex does: the spare node memory is plain memory.
    /// loom checks both in the models that run such a caller
    /// ([`MutPtr`]'s tracking).
    #[inline]
    pub(crate) unsafe fn external_writer(&self) -> TreeWriter<'_, V> {
        TreeWriter {
            tree: self,
            spare: self.spare.get_mut(),
            _lock: None,
        }
    }
}

impl<'t, V> TreeWriter<'t, V> {
    /// The tree written.
    pub(super) fn tree(&self) -> &'t RangeTree<V> {
        self.tree
    }
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
        let mut ed = Editor::new(self.tree.cache.get(), spare(&mut self.spare), &g);
        let root = ed.insert(self.tree.cur(), r.start, r.end, v);
        self.tree.publish(root, ed, 1, &g);
        Ok(())
    }

    /// Stores `r -> v`, overwriting whatever `r` covered: entries that
    /// overlap it are trimmed to their parts outside `r` (which keep their
    /// values). Returns the overwritten pieces with their values. One
    /// atomic step for readers.
    pub fn store(&mut self, r: Range, v: V) -> Vec<(Range, V)> {
        self.overwrite::<true>(r, Some(v))
    }

    /// Removes everything inside `r`, trimming entries that overlap its
    /// ends. Returns the removed pieces.
    pub fn erase(&mut self, r: Range) -> Vec<(Range, V)> {
        self.overwrite::<true>(r, None)
    }

    /// [`store`](Self::store) with no list of what it overwrote: a store
    /// of this kind allocates nothing once the writer's kept lists have
    /// grown (the address space's edits, which never read the list).
    pub fn store_only(&mut self, r: Range, v: V) {
        self.overwrite::<false>(r, Some(v));
    }

    /// [`erase`](Self::erase) with no list of what it removed.
    pub fn erase_only(&mut self, r: Range) {
        self.overwrite::<false>(r, None);
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
        let mut ed = Editor::new(self.tree.cache.get(), spare(&mut self.spare), &g);
        ed.discard_all(self.tree.cur());
        let root = ed.build(&kept);
        self.tree.publish(root, ed, -(removed as isize), &g);
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
        let mut ed = Editor::new(self.tree.cache.get(), spare(&mut self.spare), &g);
        ed.discard_all(self.tree.cur());
        let root = ed.build(&es);
        self.tree.publish(root, ed, delta, &g);
        Ok(())
    }

    /// Removes the whole entry containing `addr`.
    pub fn remove(&mut self, addr: u64) -> Option<(Range, V)> {
        let g = self.tree.pin();
        let (r, v) = self.tree.find(addr, &g).map(|(r, v)| (r, v.clone()))?;
        let mut ed = Editor::new(self.tree.cache.get(), spare(&mut self.spare), &g);
        let root = ed.remove(self.tree.cur(), r.start);
        self.tree.publish(root, ed, -1, &g);
        Some((r, v))
    }

    /// Stores `v` over `r`, or erases `r`; returns what it overwrote if
    /// `LIST` (else an empty list, never allocated).
    pub(super) fn overwrite<const LIST: bool>(
        &mut self,
        r: Range,
        v: Option<V>,
    ) -> Vec<(Range, V)> {
        if r.is_empty() {
            return Vec::new();
        }
        let g = self.tree.pin();
        // The entries overlapping `r`, in the writer's kept list.
        let mut hit = core::mem::take(&mut spare(&mut self.spare).hits);
        self.tree.range_into(r, &g, &mut hit);
        let mut ed = Editor::new(self.tree.cache.get(), spare(&mut self.spare), &g);
        // Storing over exactly one entry that starts where `r` does, and
        // at most growing it into free space: one path copy.
        if let (Some(v), [(e, ev)]) = (&v, hit.as_slice()) {
            if e.start == r.start && r.end >= e.end {
                let out = if LIST {
                    vec![(*e, ev.clone())]
                } else {
                    Vec::new()
                };
                let root = ed.replace(self.tree.cur(), r.start, r.end, v.clone());
                self.tree.publish(root, ed, 0, &g);
                self.keep_hits(hit);
                return out;
            }
        }
        // Overwriting many entries (unmapping a large part of the space):
        // one rebuild costs a copy per entry kept, where removing them one
        // by one costs a path copy each.
        if hit.len() > B && hit.len() * REBUILD_RATIO >= self.tree.len() {
            return self.tree.rebuild_over(r, v, hit, ed, &g);
        }
        let mut root = self.tree.cur();
        let mut delta: isize = 0;
        let mut out = Vec::with_capacity(if LIST { hit.len() } else { 0 });
        for (e, ev) in hit.drain(..) {
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
            if LIST {
                out.push((
                    e.intersect(&r).expect("range() yields overlapping entries"),
                    ev,
                ));
            }
        }
        if let Some(v) = v {
            root = ed.insert(root, r.start, r.end, v);
            delta += 1;
        }
        self.tree.publish(root, ed, delta, &g);
        self.keep_hits(hit);
        out
    }

    /// Puts the list of overwritten entries back, emptied, for the next
    /// store; one a large store grew is freed instead.
    fn keep_hits(&mut self, mut hit: Vec<(Range, V)>) {
        hit.clear();
        if hit.capacity() <= HITS_KEPT {
            spare(&mut self.spare).hits = hit;
        }
    }
}

/// The spare memory a writer holds, made on the tree's first edit.
fn spare<V>(held: &mut MutPtr<Option<Box<Spare<V>>>>) -> &mut Spare<V> {
    // SAFETY: a writer's spare is its alone while it lives (its mutex,
    // or its caller's lock: `RangeTree::external_writer`), and `held` is
    // borrowed mutably for as long as the reference lives: one at a time.
    unsafe { held.deref() }.get_or_insert_with(Box::default)
}

/// The writer's steps that read or publish the tree itself, apart from the
/// spare memory an edit borrows meanwhile. Private to this module: only a
/// [`TreeWriter`], the holder of the writer mutex, calls them.
impl<V: Clone + Send + Sync + 'static> RangeTree<V> {
    fn cur(&self) -> NodePtr<V> {
        self.root.load(Ordering::Relaxed)
    }

    /// `TreeWriter::overwrite` by rebuilding the whole tree in one
    /// pass: the entries outside `r`, the parts of `hit` (the entries
    /// overlapping `r`) outside it, and `v` over `r`.
    fn rebuild_over(
        &self,
        r: Range,
        v: Option<V>,
        hit: Vec<(Range, V)>,
        mut ed: Editor<'_, V>,
        g: &Guard,
    ) -> Vec<(Range, V)> {
        let mut es: Vec<(u64, u64, V)> = Vec::with_capacity(self.len() - hit.len() + 3);
        for (e, ev) in self.iter(g) {
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
        let delta = es.len() as isize - self.len() as isize;
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
    fn publish(&self, root: NodePtr<V>, ed: Editor<'_, V>, delta: isize, g: &Guard) {
        self.root.store(root as *mut Node<V>, Ordering::Release);
        let len = self.len.load(Ordering::Relaxed) as isize + delta;
        self.len.store(len as usize, Ordering::Relaxed);
        let Some(batch) = ed.finish(self.reclaimer.is_epoch()) else {
            return;
        };
        // One deferred step per `PENDING` edits (`cache.rs`, "Handing
        // back"), and a cheap one: it only hands their batches back to
        // the writer's node cache.
        let cache = self.cache.arc();
        self.reclaimer.defer(g, move || {
            // SAFETY: the chained batches' nodes were unlinked by this
            // edit or by earlier ones of this tree's writer (not reachable
            // from the new root), and this runs only after every reader
            // pinned before this publish is gone, which includes every
            // reader pinned before those unlinks; the chain is handed
            // over exactly once.
            unsafe { cache.push_ready(batch) };
        });
    }
}
