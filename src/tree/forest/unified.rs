//! A unified forest: one tree until its split.
//!
//! A forest made with [`RangeForest::sliced_unified`] starts as one tree:
//! every entry lives there whole, and every call runs the single tree's
//! own (no slot arithmetic, no piece joining). The address space makes
//! range mode's forest so while the range lock's bias holds: the bias's
//! owner is then the only writer, and slots would only cost it.
//! [`RangeForest::split`] ends it, once: under the one tree's writer
//! mutex (so no writer of it runs), it builds every slot's tree from the
//! one tree's entries, unlinks the one tree (`Release`) and retires it.
//!
//! - **Readers** load the link (`Acquire`) under their pin. Non-null, they
//!   read the one tree, which nobody writes once it is unlinked: a
//!   snapshot of the forest at the split, exactly what a reader that
//!   loaded the single tree's root then and walked it later would see.
//!   Null, they read the slots, complete before the unlink. Every
//!   address reads mapped throughout if it was mapped across the split.
//!   A reader that synchronizes with a later writer (through a lock, or a
//!   counter the writer moves) loads the link after that writer's split,
//!   so it reads the slots and the write.
//! - **Writers** of the one tree hold its writer mutex for their whole
//!   life and check the link again under it: a writer that loaded the
//!   link before the unlink then writes the slots instead of the unlinked
//!   tree. The split waits for a writer that holds the mutex.
//! - **Memory**: the unlinked tree is retired through slot 0's reclaimer
//!   (the one every pin of the forest comes from), so a reader still in
//!   it keeps it alive.
//!
//! Shared lines: a writer of the one tree writes its writer mutex, root
//! and length, as the single tree's writer does; a reader writes none
//! (the link is a load, and is written once in the forest's life).
//!
//! The loom models `forest_split_vs_reader`,
//! `forest_split_vs_unified_writer` and `forest_split_vs_reader_epoch`
//! (`loom_tests/tree.rs`) check the three.
//!
//! # Locking
//!
//! The one tree's writer mutex, level 3 of the lock order in
//! [`crate::mm`] as every slot's; the split holds it while it takes each
//! slot's in turn (one at a time, as any forest writer), and nobody takes
//! the one tree's mutex while holding a slot's.

use super::*;

/// Frees a unified forest's one tree, unlinked and retired by `split`.
///
/// # Safety
/// `p` came from `Box::into_raw` and is freed once, after no reader can
/// reach it.
unsafe fn free_unified<V>(p: *mut RangeTree<V>) {
    // SAFETY: the caller's contract.
    drop(unsafe { Box::from_raw(p) });
}

impl<V> Drop for RangeForest<V> {
    fn drop(&mut self) {
        let p = self.unified.load(Ordering::Relaxed);
        if !p.is_null() {
            // SAFETY: never split, so still owned here, and the forest
            // is being dropped: no reader or writer can reach it.
            unsafe { free_unified(p) };
        }
    }
}

impl<V: Clone + PartialEq + Send + Sync + 'static> RangeForest<V> {
    /// [`sliced`](Self::sliced), but unified until
    /// [`split`](Self::split): every entry lives in one tree, read and
    /// written as the single tree is (no slot arithmetic), and `split`
    /// moves them into the slots (module docs, "Unified until split").
    /// The one tree takes a reclaimer from `reclaimer` too.
    pub fn sliced_unified(
        shift: u32,
        space_end: u64,
        mut reclaimer: impl FnMut() -> Reclaimer,
    ) -> Self {
        let u = Box::new(RangeTree::with_reclaimer(reclaimer()));
        let f = Self::sliced(shift, space_end, reclaimer);
        f.unified.store(Box::into_raw(u), Ordering::Relaxed);
        f
    }

    /// Asks the reclaimer to free what it can now (as
    /// [`RangeTree::collect`]).
    pub fn collect(&self) {
        self.all()[0].collect();
    }

    /// True while the forest is unified (made by
    /// [`sliced_unified`](Self::sliced_unified), not yet
    /// [`split`](Self::split)).
    pub fn is_unified(&self) -> bool {
        !self.unified.load(Ordering::Acquire).is_null()
    }

    /// The unified tree and its writer (its writer mutex held), if the
    /// forest is still unified once the mutex is held.
    ///
    /// # Safety
    /// `g` must be a pin of this forest that outlives the writer.
    unsafe fn lock_unified(&self, g: &Guard) -> Option<(*mut RangeTree<V>, TreeWriter<'_, V>)> {
        let _ = g;
        let p = self.unified.load(Ordering::Acquire);
        // SAFETY: as in `one`: `g`, pinned before the load, keeps a tree
        // loaded non-null alive, and the caller keeps `g` for the
        // writer's life, so the borrow never outlives the tree.
        let u: &RangeTree<V> = unsafe { p.as_ref()? };
        let w = u.writer();
        // Under the tree's writer mutex, which `split` holds while it
        // unlinks the tree: still linked now, it stays so until this
        // writer is dropped. Unlinked, a writer's stores would be lost,
        // and a second split would build the slots again from it.
        (self.unified.load(Ordering::Acquire) == p).then_some((p, w))
    }

    /// A writer of the unified tree, if the forest is still unified once
    /// that tree's writer mutex is held.
    ///
    /// # Safety
    /// `g` must be a pin of this forest that outlives the writer.
    pub(super) unsafe fn unified_writer(&self, g: &Guard) -> Option<ForestWriter<'_, V>> {
        // SAFETY: the caller's contract.
        let (_, w) = unsafe { self.lock_unified(g) }?;
        Some(ForestWriter {
            forest: self,
            held: Some((0, w)),
            one: true,
            _pin: None,
        })
    }

    /// Moves a unified forest's entries into its slots and unlinks its
    /// one tree (nothing if it is not unified): from then on writers of
    /// different slots commit at once. Waits for the writer of the one
    /// tree, if any. Readers see the same entries throughout: the one
    /// tree until the unlink, the slots after it (module docs, "Unified
    /// until split").
    #[inline]
    pub fn split(&self) {
        // Acquire, though nothing is read here: a caller that goes on to
        // write the slots must be ordered after the split it saw (a
        // reader synchronizing with that write then sees it too).
        if !self.unified.load(Ordering::Acquire).is_null() {
            self.split_now();
        }
    }

    /// [`split`](Self::split) of a forest found unified.
    #[cold]
    #[inline(never)]
    fn split_now(&self) {
        let g = self.pin();
        // Its writer mutex: no writer of the one tree runs while the
        // entries are copied, and none starts (`unified_writer` checks
        // the link again under the mutex). None: another split won.
        // SAFETY: `g` lives until the end, after `w`.
        let Some((p, w)) = (unsafe { self.lock_unified(&g) }) else {
            return;
        };
        let entries: Vec<(Range, V)> = w.iter(&g).map(|(r, v)| (r, v.clone())).collect();
        self.sliced_writer()
            .replace_all(entries)
            .expect("a tree's entries are sorted and apart");
        // Release: a reader that loads the null sees the slots built.
        self.unified.store(core::ptr::null_mut(), Ordering::Release);
        drop(w);
        // SAFETY: unlinked above, so readers that pin from now on cannot
        // reach it; its box is handed over here and freed once, by the
        // reclaimer every pin of this forest comes from (slot 0's).
        unsafe {
            self.all()[0]
                .reclaimer
                .retire_with(&g, p, free_unified::<V>);
        }
    }
}
