//! Loom models of the range tree: a lock-free reader walking while a
//! writer replaces the node it reads, with the old node reclaimed and its
//! memory reused by the next edit; and of the forest (one tree per slot,
//! `src/tree/forest.rs`): a store across a slot boundary against a reader,
//! writers in two slots at once, two writers in one slot; and of a
//! unified forest's split (one tree until then, range mode's while the
//! range lock's bias holds) against a reader and against a writer of the
//! one tree. Runs the real `RangeTree` and `RangeForest` through
//! src/sync.rs. `./loom.sh --test loom_tree` runs them.
#![cfg(aspace_loom)]

use aspace::reclaim::Reclaimer;
use aspace::tree::{RangeForest, RangeTree};
use aspace::Range;
use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::Arc;
use loom::thread;

/// A value that dies with the node holding it: every clone (each node
/// copy) owns a fresh liveness flag, cleared when that copy is dropped. A
/// reader that reaches a freed node reads a dead (or destroyed) flag.
struct Canary {
    tag: u64,
    alive: Arc<AtomicBool>,
}

impl Canary {
    fn new(tag: u64) -> Self {
        Canary {
            tag,
            alive: Arc::new(AtomicBool::new(true)),
        }
    }
}

impl Clone for Canary {
    fn clone(&self) -> Self {
        Canary::new(self.tag)
    }
}

impl Drop for Canary {
    fn drop(&mut self) {
        self.alive.store(false, Ordering::SeqCst);
    }
}

fn reader_vs_replace(reclaimer: fn() -> Reclaimer) {
    // Bound and branch limit from the environment (loom.sh).
    let b = loom::model::Builder::new();
    b.check(move || {
        let t = Arc::new(RangeTree::with_reclaimer(reclaimer()));
        t.writer()
            .insert(Range::new(0x1000, 0x3000), Canary::new(1))
            .unwrap();
        let t2 = t.clone();
        let r = thread::spawn(move || {
            let g = t2.pin();
            let (range, v) = t2
                .find(0x2000, &g)
                .expect("the address is mapped before and after");
            assert!(range.contains(0x2000));
            assert!(v.tag == 1 || v.tag == 2);
            assert!(
                v.alive.load(Ordering::SeqCst),
                "reader reached a reclaimed node"
            );
            if v.tag == 2 {
                assert!(
                    range == Range::new(0x1800, 0x3000) || range == Range::new(0x1800, 0x2800),
                    "{range:?}"
                );
            }
        });
        // Replace the leaf: [0x1000, 0x1800) keeps tag 1, the rest is 2.
        t.writer().store(Range::new(0x1800, 0x3000), Canary::new(2));
        // Try hard to reclaim the old leaf while the reader may still
        // hold it: only the reader's pin may keep it alive.
        for _ in 0..3 {
            t.collect();
        }
        // A second edit reuses reclaimed node memory (the tree's node
        // cache): never memory the reader may still be walking.
        t.writer().store(Range::new(0x2800, 0x3000), Canary::new(3));
        r.join().unwrap();
        t.check_invariants().unwrap();
    });
}

#[test]
fn reader_vs_replace_epoch() {
    reader_vs_replace(Reclaimer::epoch);
}

#[test]
fn reader_vs_replace_deferred() {
    reader_vs_replace(Reclaimer::deferred);
}

// The forest (`src/tree/forest.rs`): one tree per slot, read as one.

/// Slots of one page: entries cross boundaries at 0x1000 and 0x2000.
const SLOT_SHIFT: u32 = 12;

impl PartialEq for Canary {
    /// Identity of the entry (as a `VmaRef`'s): the tag, not the copy.
    fn eq(&self, other: &Self) -> bool {
        self.tag == other.tag
    }
}

/// A forest of three one-page slots holding `entries`, retired memory
/// kept until its drop (as the address space models do).
fn forest(entries: &[(u64, u64, u64)]) -> Arc<RangeForest<Canary>> {
    let f = RangeForest::sliced(SLOT_SHIFT, 0x3000, Reclaimer::deferred);
    assert_eq!(f.slots(), 3);
    for &(s, e, tag) in entries {
        f.writer().store(Range::new(s, e), Canary::new(tag));
    }
    Arc::new(f)
}

/// The entry holding `addr`, checked live: `(range, tag)`.
fn found(f: &RangeForest<Canary>, addr: u64) -> Option<(Range, u64)> {
    let g = f.pin();
    let (r, v) = f.find(addr, &g)?;
    assert!(
        v.alive.load(Ordering::SeqCst),
        "reader reached a dropped copy"
    );
    assert!(r.contains(addr), "{r:?} lacks {addr:#x}");
    Some((r, v.tag))
}

/// A store across a slot boundary (a VMA split or mprotect crossing it)
/// against a lock-free reader on both sides: each address reads mapped
/// throughout, by the old entry or the new one, and never by a range
/// larger than its own entry's.
///
/// Catches: the crossing store done as erase-then-insert in each slot
/// (`Some(v) => t.store(c, v.clone())` made
/// `Some(v) => { t.erase(c); t.store(c, v.clone()) }` in
/// `ForestWriter::overwrite`): the reader finds `0xf00` unmapped; and the
/// pieces merged by adjacency alone (`pv == v &&` dropped from both
/// loops of `RangeForest::grow`): between the two slots' commits the
/// reader at `0x1100` reads the old entry over `[0x700, 0x1800)`, its
/// piece joined to the new entry's piece in slot 0.
#[test]
fn forest_crossing_store_vs_reader() {
    loom::model::Builder::new().check(|| {
        let f = forest(&[(0x800, 0x1800, 1)]);
        let f2 = f.clone();
        let r = thread::spawn(move || {
            for addr in [0xf00, 0x1100] {
                let (r, tag) = found(&f2, addr).expect("mapped before and after");
                let whole = if tag == 5 {
                    Range::new(0x700, 0x1400)
                } else {
                    Range::new(0x800, 0x1800)
                };
                assert!(
                    whole.start <= r.start && r.end <= whole.end,
                    "{addr:#x}: tag {tag} read over {r:?}"
                );
            }
        });
        f.writer().store(Range::new(0x700, 0x1400), Canary::new(5));
        r.join().unwrap();
        assert_eq!(found(&f, 0xf00), Some((Range::new(0x700, 0x1400), 5)));
        f.check_invariants().unwrap();
    });
}

/// Two writers in different slots commit at once (slot 0 and slot 2,
/// each under its own slot's mutex) while a reader finds an entry
/// crossing slots 0 and 1: it reads that entry whole throughout, and each
/// writer's address as before or after its store.
///
/// Catches: a store not clipped to each slot (`let c = self.forest.clip(r,
/// k);` made `let c = r;` in `ForestWriter::overwrite`): slot 0 then holds
/// the crossing entry whole, beyond its bounds (the invariant check after
/// the writers fails).
#[test]
fn forest_writers_in_two_slots_vs_crossing_reader() {
    loom::model::Builder::new().check(|| {
        let f = forest(&[(0x800, 0x1800, 1), (0x2000, 0x2800, 2)]);
        let (f2, f3) = (f.clone(), f.clone());
        let r = thread::spawn(move || {
            assert_eq!(found(&f2, 0x1000), Some((Range::new(0x800, 0x1800), 1)));
            let tag = found(&f2, 0x2180).map(|(_, t)| t);
            assert!(tag == Some(2) || tag == Some(4), "{tag:?}");
        });
        let w = thread::spawn(move || {
            f3.writer()
                .store(Range::new(0x2100, 0x2200), Canary::new(4));
        });
        f.writer().store(Range::new(0x100, 0x200), Canary::new(3));
        w.join().unwrap();
        r.join().unwrap();
        assert_eq!(found(&f, 0x180), Some((Range::new(0x100, 0x200), 3)));
        assert_eq!(found(&f, 0x2180), Some((Range::new(0x2100, 0x2200), 4)));
        f.check_invariants().unwrap();
    });
}

/// Two writers in one slot: the slot's writer mutex makes each write
/// atomic, as the single tree's. Two inserts race for overlapping free
/// ranges of slot 1: exactly one gets them.
///
/// Catches: the slot mutex removed (`_lock: self.writer.lock()` made
/// `_lock: Box::leak(Box::new(crate::sync::Mutex::new(()))).lock()` in
/// `RangeTree::writer`, src/tree/write.rs): both inserts pass their
/// check and the slot holds two overlapping entries.
#[test]
fn forest_writers_in_one_slot() {
    loom::model::Builder::new().check(|| {
        let f = forest(&[]);
        let f2 = f.clone();
        let w = thread::spawn(move || {
            f2.writer()
                .insert(Range::new(0x1100, 0x1300), Canary::new(1))
                .is_ok()
        });
        let mine = f
            .writer()
            .insert(Range::new(0x1200, 0x1400), Canary::new(2))
            .is_ok();
        let theirs = w.join().unwrap();
        assert!(mine != theirs, "exactly one insert wins: {mine} {theirs}");
        f.check_invariants().unwrap();
    });
}

// A unified forest (`RangeForest::sliced_unified`, `src/tree/forest/unified.rs`): one tree until
// `split` moves its entries into the slots.

/// A unified forest of three one-page slots holding `entries` in its one
/// tree.
fn unified(entries: &[(u64, u64, u64)], reclaimer: fn() -> Reclaimer) -> Arc<RangeForest<Canary>> {
    let f = RangeForest::sliced_unified(SLOT_SHIFT, 0x3000, reclaimer);
    for &(s, e, tag) in entries {
        f.writer().store(Range::new(s, e), Canary::new(tag));
    }
    assert!(f.is_unified());
    Arc::new(f)
}

/// The split against a lock-free reader of each entry (at its middle):
/// each reads whole and live throughout, from the one tree before the
/// unlink and from the slots after it, however hard the splitter collects
/// what it retired.
fn split_vs_reader(reclaimer: fn() -> Reclaimer, entries: &'static [(u64, u64, u64)]) {
    loom::model::Builder::new().check(move || {
        let f = unified(entries, reclaimer);
        let f2 = f.clone();
        let r = thread::spawn(move || {
            for &(s, e, tag) in entries {
                let want = Some((Range::new(s, e), tag));
                assert_eq!(found(&f2, s + (e - s) / 2), want);
            }
        });
        f.split();
        for _ in 0..3 {
            f.collect();
        }
        r.join().unwrap();
        assert!(!f.is_unified());
        f.check_invariants().unwrap();
    });
}

/// [`split_vs_reader`] of an entry crossing two slots and one inside a
/// slot.
///
/// Catches: the one tree unlinked before the slots are built (the
/// `self.unified.store(core::ptr::null_mut(), Ordering::Release);` line
/// of `RangeForest::split_now` moved above its `replace_all`): the reader
/// then finds the slots empty, and `0x1000` unmapped.
#[test]
fn forest_split_vs_reader() {
    split_vs_reader(
        Reclaimer::deferred,
        &[(0x800, 0x1800, 1), (0x2000, 0x2800, 2)],
    );
}

/// [`split_vs_reader`] with epoch reclamation: the split retires the one
/// tree while a pinned reader may still walk it; the reader's pin keeps
/// it (and the values in it) alive.
///
/// Catches: the one tree freed at once instead of retired
/// (`self.all()[0].reclaimer.retire_with(&g, p, free_unified::<V>)` made
/// `free_unified(p)` in `RangeForest::split_now`): the reader walks a
/// freed tree (loom saw it find `0x1000` unmapped).
#[test]
fn forest_split_vs_reader_epoch() {
    split_vs_reader(Reclaimer::epoch, &[(0x800, 0x1800, 1)]);
}

/// The split against a writer of the one tree: the writer's store is
/// never lost, whichever comes first (the split waits for the writer's
/// hold of the one tree; a writer that loaded the one tree before the
/// split unlinked it sees the unlink under its mutex and writes the
/// slots).
///
/// Catches: the writer's check of the link under the one tree's mutex
/// dropped (`(self.unified.load(Ordering::Acquire) == p).then_some((p,
/// w))` made `Some((p, w))` in `RangeForest::lock_unified`): the writer
/// then stores into the unlinked tree after the split, and its entry is
/// lost.
#[test]
fn forest_split_vs_unified_writer() {
    loom::model::Builder::new().check(|| {
        let f = unified(&[(0x800, 0x1800, 1)], Reclaimer::deferred);
        let f2 = f.clone();
        let w = thread::spawn(move || {
            f2.writer()
                .store(Range::new(0x2100, 0x2200), Canary::new(4));
        });
        f.split();
        w.join().unwrap();
        assert_eq!(found(&f, 0x2180), Some((Range::new(0x2100, 0x2200), 4)));
        assert_eq!(found(&f, 0x1000), Some((Range::new(0x800, 0x1800), 1)));
        f.check_invariants().unwrap();
    });
}
