//! The forest against the single tree: random stores, erases, inserts,
//! removals, retains and rebuilds over small slots (so that entries cross
//! boundaries often), every read compared after each step.

use super::*;
use proptest::prelude::*;

/// Slots of one page; the space is `SLOTS` of them.
const SHIFT: u32 = 12;
const SLOT: u64 = 1 << SHIFT;
const SLOTS: u64 = 16;
/// Keys go a little past the last slot's start (it reaches `u64::MAX`).
const SPAN: u64 = (SLOTS + 2) * SLOT;

fn r(a: u64, b: u64) -> Range {
    Range::new(a, b)
}

fn forest() -> RangeForest<u64> {
    RangeForest::sliced(SHIFT, SLOTS * SLOT, Reclaimer::deferred)
}

#[derive(Clone, Debug)]
enum Op {
    Store(u64, u64),
    Erase(u64, u64),
    Insert(u64, u64),
    Remove(u64),
    Retain(u64),
    Replace(Vec<(u64, u64)>),
    /// A store through the slot's view where it serves (`InnerSlot`),
    /// else through the forest's writer.
    ViewStore(u64, u64),
    /// An erase likewise.
    ViewErase(u64, u64),
}

/// A range inside one slot, a byte or more from both of its ends
/// (sometimes from one).
fn inside() -> impl Strategy<Value = (u64, u64)> {
    (0..SLOTS + 1, 0..SLOT, 1..SLOT).prop_map(|(k, off, len)| {
        let s = k * SLOT + off;
        (s, (s + len).min((k + 1) * SLOT))
    })
}

/// A range of 1 byte to three slots anywhere in the keys, often on a
/// slot boundary.
fn range() -> impl Strategy<Value = (u64, u64)> {
    (0..SPAN, 1..3 * SLOT, any::<bool>()).prop_map(|(s, len, snap)| {
        let s = if snap { s & !(SLOT - 1) } else { s };
        let e = if snap {
            (s + len).next_multiple_of(SLOT)
        } else {
            s + len
        };
        (s, e)
    })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => range().prop_map(|(a, b)| Op::Store(a, b)),
        2 => range().prop_map(|(a, b)| Op::Erase(a, b)),
        2 => range().prop_map(|(a, b)| Op::Insert(a, b)),
        1 => (0..SPAN).prop_map(Op::Remove),
        1 => (0..4u64).prop_map(Op::Retain),
        1 => proptest::collection::vec(range(), 0..8).prop_map(Op::Replace),
        3 => inside().prop_map(|(a, b)| Op::ViewStore(a, b)),
        1 => inside().prop_map(|(a, b)| Op::ViewErase(a, b)),
        1 => range().prop_map(|(a, b)| Op::ViewErase(a, b)),
    ]
}

/// A gap query: window, size and alignment, often on slot boundaries.
fn gap() -> impl Strategy<Value = (u64, u64, u64, u64)> {
    (0..SPAN + SLOT, 0..SPAN + SLOT, 1..4 * SLOT, 0..14u32).prop_map(|(a, b, size, al)| {
        let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
        let hi = if hi >= SPAN { u64::MAX } else { hi };
        (lo, hi, size, 1 << al)
    })
}

/// Sorted, disjoint ranges from random ones (first wins).
fn disjoint(rs: &[(u64, u64)]) -> Vec<Range> {
    let mut out: Vec<Range> = Vec::new();
    let mut rs = rs.to_vec();
    rs.sort();
    for (a, b) in rs {
        if out.last().is_none_or(|l| l.end <= a) {
            out.push(r(a, b));
        }
    }
    out
}

type Seen = Vec<(Range, u64)>;

fn seen<'g>(it: impl Iterator<Item = (Range, &'g u64)>) -> Seen {
    it.map(|(r, v)| (r, *v)).collect()
}

fn one(x: Option<(Range, &u64)>) -> Option<(Range, u64)> {
    x.map(|(r, v)| (r, *v))
}

/// [`RangeForest::inner_slot`] for these tests.
fn slot_view(f: &RangeForest<u64>, span: Range) -> Option<InnerSlot<'_, u64>> {
    // SAFETY: the tests write each forest from their one thread, and not
    // through another writer while a view's writer lives.
    unsafe { f.inner_slot(span) }
}

/// The view of the slot holding `a`, if it serves.
fn view(f: &RangeForest<u64>, a: u64) -> Option<InnerSlot<'_, u64>> {
    let k = f.slot_of(a);
    slot_view(f, r(f.start(k), f.end(k)))
}

/// Runs `op` on both (values: `id`, distinct per op); the results agree.
fn apply(f: &RangeForest<u64>, t: &RangeTree<u64>, op: &Op, id: u64) {
    match op {
        Op::ViewStore(a, b) => {
            if let Some(v) = view(f, *a).filter(|v| v.keeps(r(*a, *b))) {
                let hit = v.writer(f).store(r(*a, *b), id);
                assert_eq!(hit, t.writer().store(r(*a, *b), id));
                return;
            }
        }
        Op::ViewErase(a, b) => {
            if let Some(v) = view(f, *a).filter(|v| v.holds(r(*a, *b))) {
                assert_eq!(v.writer(f).erase(r(*a, *b)), t.writer().erase(r(*a, *b)));
                return;
            }
        }
        _ => {}
    }
    let (mut fw, mut tw) = (f.writer(), t.writer());
    match op {
        Op::Store(a, b) | Op::ViewStore(a, b) => {
            assert_eq!(fw.store(r(*a, *b), id), tw.store(r(*a, *b), id))
        }
        Op::Erase(a, b) | Op::ViewErase(a, b) => {
            assert_eq!(fw.erase(r(*a, *b)), tw.erase(r(*a, *b)))
        }
        Op::Insert(a, b) => assert_eq!(fw.insert(r(*a, *b), id), tw.insert(r(*a, *b), id)),
        Op::Remove(a) => assert_eq!(fw.remove(*a), tw.remove(*a)),
        Op::Retain(m) => assert_eq!(fw.retain(|_, v| v % 4 != *m), tw.retain(|_, v| v % 4 != *m)),
        Op::Replace(rs) => {
            let es: Vec<(Range, u64)> = disjoint(rs).into_iter().map(|x| (x, id)).collect();
            // Distinct values per entry: the same id for all would make
            // neighbours meeting at a boundary one entry.
            let es: Vec<(Range, u64)> = es
                .into_iter()
                .enumerate()
                .map(|(i, (x, v))| (x, v * 64 + i as u64))
                .collect();
            assert_eq!(fw.replace_all(es.clone()), tw.replace_all(es));
        }
    }
}

/// Every read of the forest gives the single tree's answer.
fn compare(
    f: &RangeForest<u64>,
    t: &RangeTree<u64>,
    probes: &[u64],
    gaps: &[(u64, u64, u64, u64)],
) {
    f.check_invariants().unwrap();
    let (gf, gt) = (f.pin(), t.pin());
    let all = seen(t.iter(&gt));
    assert_eq!(seen(f.iter(&gf)), all);
    // A slot that holds a piece reaching one of its ends says so (the
    // slot's bit, never cleared, may also stay from an entry since gone).
    for (e, _) in &all {
        for k in f.slots_of(*e) {
            let c = f.clip(*e, k);
            if c.start == f.start(k) || c.end == f.end(k) {
                assert!(f.edges_touched(f.start(k)), "slot {k} holds {c:?}");
            }
        }
    }
    let mut points: Vec<u64> = probes.to_vec();
    // Every entry's edges and the slot boundaries, with their neighbours.
    for (e, _) in &all {
        points.extend([e.start, e.end, e.start.saturating_sub(1), e.end - 1]);
    }
    points.extend((0..=SLOTS + 1).flat_map(|k| [k * SLOT, (k * SLOT).saturating_sub(1)]));
    for &a in &points {
        assert_eq!(one(f.find(a, &gf)), one(t.find(a, &gt)), "find {a:#x}");
        assert_eq!(
            one(f.find_after(a, &gf)),
            one(t.find_after(a, &gt)),
            "find_after {a:#x}"
        );
        assert_eq!(one(f.prev(a, &gf)), one(t.prev(a, &gt)), "prev {a:#x}");
        assert_eq!(one(f.next(a, &gf)), one(t.next(a, &gt)), "next {a:#x}");
        for &b in probes {
            let p = one(t.prev(a, &gt)).filter(|(e, _)| e.end > b);
            assert_eq!(one(f.prev_above(a, b, &gf)), p, "prev_above {a:#x} {b:#x}");
            let n = one(t.find_after(a, &gt)).filter(|(e, _)| e.start < b);
            assert_eq!(
                one(f.find_after_below(a, b, &gf)),
                n,
                "find_after_below {a:#x} {b:#x}"
            );
        }
        match (f.find_around(a, &gf), t.find_around(a, &gt)) {
            (None, None) => {}
            (Some(x), Some(y)) => {
                assert_eq!(one(Some(x.entry())), one(Some(y.entry())));
                // A neighbour the forest offers is the tree's neighbour.
                let i = all.iter().position(|(e, _)| *e == x.entry().0).unwrap();
                for d in -2isize..=2 {
                    if let Some(n) = x.nearby(d) {
                        let j = i.checked_add_signed(d).unwrap();
                        assert_eq!(one(Some(n)), Some(all[j]), "nearby {d} of {a:#x}");
                    }
                }
            }
            (x, y) => panic!("find_around {a:#x}: {:?} vs {:?}", x.is_some(), y.is_some()),
        }
        for &b in &points {
            if a < b {
                assert_eq!(seen(f.range(r(a, b), &gf)), seen(t.range(r(a, b), &gt)));
            }
        }
    }
    // Each slot its view serves reads as the single tree through it.
    for k in 0..f.all().len() {
        let Some(v) = slot_view(f, r(f.start(k), f.end(k))) else {
            continue;
        };
        for &a in &points {
            assert_eq!(
                one(v.find(f, a, &gf)),
                one(t.find(a, &gt)),
                "view {k}: find {a:#x}"
            );
            assert_eq!(
                one(v.find_after(f, a, &gf)),
                one(t.find_after(a, &gt)),
                "view {k}: find_after {a:#x}"
            );
            assert_eq!(
                one(v.prev(f, a, &gf)),
                one(t.prev(a, &gt)),
                "view {k}: prev {a:#x}"
            );
            for &b in probes
                .iter()
                .chain([f.start(k) + 1, f.end(k).min(SPAN) - 1].iter())
            {
                if a < b {
                    assert_eq!(
                        seen(v.range(f, r(a, b), &gf).into_iter()),
                        seen(t.range(r(a, b), &gt)),
                        "view {k}: range {a:#x} {b:#x}"
                    );
                    let mut each = Vec::new();
                    v.each_in(f, r(a, b), &gf, |e, x| each.push((e, *x)));
                    assert_eq!(each, seen(t.range(r(a, b), &gt)), "view {k}: each_in");
                    // Bounded neighbours, as the table frees look for them.
                    assert_eq!(
                        one(v.prev_above(f, b, a, &gf)),
                        one(t.prev(b, &gt).filter(|(w, _)| w.end > a)),
                        "view {k}: prev_above {b:#x} {a:#x}"
                    );
                    assert_eq!(
                        one(v.find_after_below(f, a, b, &gf)),
                        one(t.find_after(a, &gt).filter(|(w, _)| w.start < b)),
                        "view {k}: find_after_below {a:#x} {b:#x}"
                    );
                }
            }
        }
    }
    for &(lo, hi, size, align) in gaps {
        assert_eq!(
            f.gap_highest(lo, hi, size, align, &gf),
            t.gap_highest(lo, hi, size, align, &gt),
            "gap_highest {lo:#x} {hi:#x} {size:#x} {align:#x}"
        );
        assert_eq!(
            f.gap_lowest(lo, hi, size, align, &gf),
            t.gap_lowest(lo, hi, size, align, &gt),
            "gap_lowest {lo:#x} {hi:#x} {size:#x} {align:#x}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn forest_reads_as_the_single_tree(
        ops in proptest::collection::vec(op(), 1..40),
        probes in proptest::collection::vec(0..SPAN + SLOT, 4),
        gaps in proptest::collection::vec(gap(), 24),
    ) {
        let (f, t) = (forest(), RangeTree::with_reclaimer(Reclaimer::deferred()));
        for (i, op) in ops.iter().enumerate() {
            apply(&f, &t, op, i as u64 + 1);
            compare(&f, &t, &probes, &gaps);
        }
    }

    /// A unified forest reads as the single tree before its split, after
    /// it, and across it, wherever in the history it comes.
    #[test]
    fn unified_forest_reads_as_the_single_tree_across_its_split(
        ops in proptest::collection::vec(op(), 1..40),
        split_at in 0..45usize,
        probes in proptest::collection::vec(0..SPAN + SLOT, 4),
        gaps in proptest::collection::vec(gap(), 24),
    ) {
        let f = RangeForest::sliced_unified(SHIFT, SLOTS * SLOT, Reclaimer::deferred);
        let t = RangeTree::with_reclaimer(Reclaimer::deferred());
        for (i, op) in ops.iter().enumerate() {
            if i == split_at {
                f.split();
                prop_assert!(!f.is_unified());
                compare(&f, &t, &probes, &gaps);
            }
            apply(&f, &t, op, i as u64 + 1);
            prop_assert_eq!(f.is_unified(), i < split_at);
            compare(&f, &t, &probes, &gaps);
        }
    }
}

/// The view serves only a split forest's slot, given exactly, whose
/// pieces all lie inside it; a store through the forest that reaches the
/// slot's end ends it.
#[test]
fn a_slot_view_serves_only_a_slot_whose_entries_lie_inside_it() {
    let single: RangeForest<u64> = RangeForest::single(Reclaimer::deferred());
    assert!(slot_view(&single, r(0, u64::MAX)).is_none());
    let unified = RangeForest::<u64>::sliced_unified(SHIFT, SLOTS * SLOT, Reclaimer::deferred);
    assert!(slot_view(&unified, r(SLOT, 2 * SLOT)).is_none());
    unified.split();
    assert!(slot_view(&unified, r(SLOT, 2 * SLOT)).is_some());
    let f = forest();
    assert!(slot_view(&f, r(SLOT, 2 * SLOT)).is_some());
    assert!(slot_view(&f, r(SLOT, 2 * SLOT - 1)).is_none(), "not a slot");
    assert!(slot_view(&f, r(SLOT, 3 * SLOT)).is_none(), "two slots");
    let v = slot_view(&f, r(SLOT, 2 * SLOT)).unwrap();
    assert!(v.keeps(r(SLOT + 1, 2 * SLOT - 1)));
    assert!(!v.keeps(r(SLOT, SLOT + 1)) && !v.keeps(r(SLOT + 1, 2 * SLOT)));
    v.writer(&f).store(r(SLOT + 8, SLOT + 16), 1);
    let g = f.pin();
    assert_eq!(one(f.find(SLOT + 8, &g)), Some((r(SLOT + 8, SLOT + 16), 1)));
    assert_eq!(one(v.find_after(&f, SLOT + 16, &g)), None);
    drop(g);
    f.writer().store(r(2 * SLOT - 8, 2 * SLOT + 8), 2);
    assert!(slot_view(&f, r(SLOT, 2 * SLOT)).is_none());
    assert!(slot_view(&f, r(2 * SLOT, 3 * SLOT)).is_none());
    assert!(slot_view(&f, r(3 * SLOT, 4 * SLOT)).is_some());
}

/// The writer of a forest's one tree views the whole key space through
/// it (a unified forest's crossing entries whole); a writer of slots has
/// no such view.
#[test]
fn the_one_tree_writer_views_the_whole_space() {
    let single: RangeForest<u64> = RangeForest::single(Reclaimer::deferred());
    let unified = RangeForest::<u64>::sliced_unified(SHIFT, SLOTS * SLOT, Reclaimer::deferred);
    for f in [&single, &unified] {
        f.writer().store(r(SLOT - 8, SLOT + 8), 1);
        let w = f.writer();
        // SAFETY: as above.
        let v = unsafe { w.one_tree() }.expect("one tree");
        let g = f.pin();
        assert_eq!(one(v.find(f, SLOT, &g)), Some((r(SLOT - 8, SLOT + 8), 1)));
        assert_eq!(
            one(v.find_after(f, 0, &g)),
            Some((r(SLOT - 8, SLOT + 8), 1))
        );
        assert_eq!(
            one(v.prev(f, 2 * SLOT, &g)),
            Some((r(SLOT - 8, SLOT + 8), 1))
        );
        assert!(v.keeps(r(SLOT - 8, SLOT + 8)));
    }
    unified.split();
    // SAFETY: not used.
    assert!(unsafe { unified.writer().one_tree() }.is_none());
}

/// A unified forest keeps every entry in its one tree, crossing entries
/// whole; the split moves them into the slots in pieces, and reads do
/// not change.
#[test]
fn unified_forest_splits_into_slots() {
    let f = RangeForest::sliced_unified(SHIFT, SLOTS * SLOT, Reclaimer::deferred);
    assert!(f.is_unified());
    f.writer().store(r(SLOT / 2, 3 * SLOT + 5), 7);
    f.writer().store(r(5 * SLOT, 5 * SLOT + 1), 8);
    assert_eq!(f.len(), 2, "one entry each in the one tree");
    assert!(f.all().iter().all(|t| t.is_empty()), "no slot written");
    f.check_invariants().unwrap();
    let before = seen(f.iter(&f.pin()));
    f.split();
    assert!(!f.is_unified());
    assert_eq!(f.len(), 5, "one piece per slot");
    assert_eq!(seen(f.iter(&f.pin())), before);
    f.check_invariants().unwrap();
    f.split();
    assert_eq!(
        seen(f.iter(&f.pin())),
        before,
        "a second split does nothing"
    );
    // Writers now write slots.
    f.writer().store(r(SLOT, 2 * SLOT), 9);
    assert!(!f.all()[1].is_empty());
    f.check_invariants().unwrap();
}

/// The split waits for the writer of the one tree, and a writer made
/// once it is split writes the slots (with epoch reclamation, so the one
/// tree is retired and freed as in a space).
#[test]
fn split_waits_for_the_unified_writer() {
    let f = RangeForest::sliced_unified(SHIFT, SLOTS * SLOT, Reclaimer::epoch);
    let mut w = f.writer();
    w.store(r(0, 2 * SLOT), 1);
    std::thread::scope(|s| {
        let h = s.spawn(|| f.split());
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(f.is_unified(), "split before the writer was done");
        w.store(r(2 * SLOT, 3 * SLOT), 2);
        drop(w);
        h.join().unwrap();
    });
    assert!(!f.is_unified());
    let g = f.pin();
    assert_eq!(
        seen(f.iter(&g)),
        vec![(r(0, 2 * SLOT), 1), (r(2 * SLOT, 3 * SLOT), 2)]
    );
    f.check_invariants().unwrap();
}

/// A VMA-like entry across three slots is stored in three pieces and read
/// as one; storing over its middle slot leaves two entries, each whole.
#[test]
fn crossing_entry_reads_whole() {
    let f = forest();
    f.writer().store(r(SLOT / 2, 3 * SLOT + 5), 7);
    assert_eq!(f.len(), 4, "one piece per slot");
    let g = f.pin();
    for a in [SLOT / 2, SLOT, 2 * SLOT + 1, 3 * SLOT + 4] {
        assert_eq!(one(f.find(a, &g)), Some((r(SLOT / 2, 3 * SLOT + 5), 7)));
    }
    drop(g);
    f.writer().store(r(SLOT, 2 * SLOT), 8);
    let g = f.pin();
    assert_eq!(
        seen(f.iter(&g)),
        vec![
            (r(SLOT / 2, SLOT), 7),
            (r(SLOT, 2 * SLOT), 8),
            (r(2 * SLOT, 3 * SLOT + 5), 7)
        ]
    );
}

/// Gap searches carry a hole across empty and partly used slots: the
/// fit found spans slots with no entry of their own.
#[test]
fn gaps_span_slots() {
    let f = forest();
    f.writer().store(r(SLOT / 2, SLOT / 2 + 1), 1);
    f.writer().store(r(6 * SLOT + 3, 7 * SLOT), 2);
    let g = f.pin();
    assert_eq!(
        f.gap_lowest(0, u64::MAX, 5 * SLOT, 1, &g),
        Some(SLOT / 2 + 1)
    );
    assert_eq!(
        f.gap_highest(0, 6 * SLOT + 3, 5 * SLOT, SLOT, &g),
        Some(SLOT)
    );
    assert_eq!(f.gap_highest(0, 6 * SLOT + 3, 6 * SLOT, 1, &g), None);
}

/// One slot is the single tree: one writer holds its mutex.
#[test]
fn single_slot_holds_its_writer() {
    let f: RangeForest<u64> = RangeForest::single(Reclaimer::deferred());
    assert_eq!(f.slots(), 1);
    let mut w = f.writer();
    w.store(r(0, u64::MAX), 1);
    assert!(
        f.all()[0].writer.try_lock().is_none(),
        "the writer holds the slot"
    );
    drop(w);
    let g = f.pin();
    assert_eq!(one(f.find(u64::MAX - 1, &g)), Some((r(0, u64::MAX), 1)));
}
