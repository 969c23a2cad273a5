//! Unit tests of the tree: inserts, stores, removals, neighbours, gap
//! search at the edges, bulk builds, and the invariant check after each.

use super::*;

fn r(a: u64, b: u64) -> Range {
    Range::new(a, b)
}

fn tree_of(ranges: &[(u64, u64)]) -> RangeTree<u64> {
    let t = RangeTree::with_reclaimer(Reclaimer::deferred());
    {
        let mut w = t.writer();
        for &(a, b) in ranges {
            w.insert(r(a, b), a).unwrap();
        }
    }
    t.check_invariants().unwrap();
    t
}

#[test]
fn insert_find_and_errors() {
    let t = tree_of(&[(10, 20), (30, 40)]);
    let g = t.pin();
    assert_eq!(t.find(10, &g).map(|(e, v)| (e, *v)), Some((r(10, 20), 10)));
    assert_eq!(t.find(19, &g).map(|(e, _)| e), Some(r(10, 20)));
    assert!(t.find(20, &g).is_none());
    assert!(t.find(9, &g).is_none());
    let mut w = t.writer();
    assert_eq!(w.insert(r(15, 35), 0), Err(TreeError::Occupied));
    assert_eq!(w.insert(r(5, 5), 0), Err(TreeError::EmptyRange));
    assert_eq!(w.insert(r(6, 5), 0), Err(TreeError::EmptyRange));
    w.insert(r(20, 30), 20).unwrap();
    drop(w);
    assert_eq!(t.len(), 3);
    t.check_invariants().unwrap();
}

/// `find_around` finds what `find` finds, and every neighbour it offers
/// from the leaf is the tree's own neighbour at that distance (checked
/// across several leaves, where some neighbours lie outside the leaf).
#[test]
fn find_around_agrees_with_find_and_iter() {
    let ranges: Vec<(u64, u64)> = (0..200).map(|i| (i * 10, i * 10 + 5)).collect();
    let t = tree_of(&ranges);
    let g = t.pin();
    assert!(t.height() > 1, "several leaves");
    assert!(t.find_around(7, &g).is_none());
    assert!(t.find_around(5000, &g).is_none());
    let all: Vec<Range> = t.iter(&g).map(|(e, _)| e).collect();
    let (mut inside, mut outside) = (0, 0);
    for (k, e) in all.iter().enumerate() {
        let a = t.find_around(e.start + 2, &g).expect("found");
        assert_eq!(a.entry().0, *e);
        assert_eq!(*a.entry().1, e.start);
        for d in -2isize..=2 {
            match a.nearby(d) {
                Some((n, v)) => {
                    inside += 1;
                    let want = k.checked_add_signed(d).map(|j| all[j]);
                    assert_eq!(Some(n), want, "entry {k}, distance {d}");
                    assert_eq!(*v, n.start);
                }
                None => outside += 1,
            }
        }
    }
    assert!(inside > 0 && outside > 0);
}

#[test]
fn neighbours() {
    let t = tree_of(&[(10, 20), (30, 40), (50, 60)]);
    let g = t.pin();
    let e = |x: Option<(Range, &u64)>| x.map(|(e, _)| e);
    assert_eq!(e(t.find_after(0, &g)), Some(r(10, 20)));
    assert_eq!(e(t.find_after(20, &g)), Some(r(30, 40)));
    assert_eq!(e(t.find_after(35, &g)), Some(r(30, 40)));
    assert_eq!(e(t.find_after(60, &g)), None);
    assert_eq!(e(t.prev(30, &g)), Some(r(10, 20)));
    assert_eq!(e(t.prev(35, &g)), Some(r(10, 20)));
    assert_eq!(e(t.prev(40, &g)), Some(r(30, 40)));
    assert_eq!(e(t.prev(10, &g)), None);
    assert_eq!(e(t.next(10, &g)), Some(r(10, 20)));
    assert_eq!(e(t.next(11, &g)), Some(r(30, 40)));
    assert_eq!(e(t.next(51, &g)), None);
    let v: Vec<_> = t.range(r(15, 51), &g).map(|(e, _)| e).collect();
    assert_eq!(v, vec![r(10, 20), r(30, 40), r(50, 60)]);
    assert_eq!(t.range(r(20, 30), &g).count(), 0);
    assert_eq!(t.iter(&g).count(), 3);
}

#[test]
fn store_trims_and_returns_displaced() {
    let t = tree_of(&[(10, 20), (30, 40)]);
    let mut w = t.writer();
    let out = w.store(r(15, 35), 99);
    assert_eq!(out, vec![(r(15, 20), 10), (r(30, 35), 30)]);
    drop(w);
    let g = t.pin();
    let all: Vec<_> = t.iter(&g).map(|(e, v)| (e, *v)).collect();
    assert_eq!(all, vec![(r(10, 15), 10), (r(15, 35), 99), (r(35, 40), 30)]);
    // Store inside one entry splits it in three.
    let mut w = t.writer();
    w.store(r(17, 18), 7);
    let out = w.erase(r(0, 16));
    assert_eq!(out, vec![(r(10, 15), 10), (r(15, 16), 99)]);
    assert_eq!(w.remove(17), Some((r(17, 18), 7)));
    assert_eq!(w.remove(17), None);
    drop(w);
    t.check_invariants().unwrap();
    let all: Vec<_> = t.iter(&g).map(|(e, v)| (e, *v)).collect();
    assert_eq!(all, vec![(r(16, 17), 99), (r(18, 35), 99), (r(35, 40), 30)]);
}

#[test]
fn gaps_on_empty_tree() {
    let t: RangeTree<u64> = RangeTree::new();
    let g = t.pin();
    assert_eq!(t.gap_lowest(0, 100, 10, 1, &g), Some(0));
    assert_eq!(t.gap_highest(0, 100, 10, 1, &g), Some(90));
    assert_eq!(t.gap_highest(0, 100, 10, 16, &g), Some(80));
    assert_eq!(t.gap_lowest(3, 100, 10, 16, &g), Some(16));
    assert_eq!(t.gap_lowest(0, 100, 101, 1, &g), None);
    assert_eq!(t.gap_lowest(0, 100, 0, 1, &g), None);
    assert_eq!(t.gap_lowest(0, 100, 1, 3, &g), None);
    assert_eq!(t.gap_lowest(100, 100, 1, 1, &g), None);
    // The range is half-open: the last usable address is u64::MAX - 1.
    assert_eq!(
        t.gap_highest(0, u64::MAX, 1 << 20, 1 << 12, &g),
        Some(u64::MAX - (1 << 20) - 0xfff)
    );
}

#[test]
fn gaps_at_the_edges() {
    let t = tree_of(&[(0, 10), (20, 30), (45, 50), (u64::MAX - 10, u64::MAX)]);
    let g = t.pin();
    assert_eq!(t.gap_lowest(0, u64::MAX, 10, 1, &g), Some(10));
    assert_eq!(t.gap_lowest(0, u64::MAX, 11, 1, &g), Some(30));
    assert_eq!(t.gap_lowest(0, u64::MAX, 15, 1, &g), Some(30));
    assert_eq!(t.gap_lowest(0, u64::MAX, 16, 1, &g), Some(50));
    assert_eq!(t.gap_lowest(0, u64::MAX, 10, 32, &g), Some(32));
    assert_eq!(t.gap_lowest(0, u64::MAX, 10, 64, &g), Some(64));
    // lo/hi cut a gap.
    assert_eq!(t.gap_lowest(12, 20, 8, 1, &g), Some(12));
    assert_eq!(t.gap_lowest(13, 20, 8, 1, &g), None);
    assert_eq!(t.gap_lowest(13, 44, 8, 1, &g), Some(30));
    assert_eq!(t.gap_lowest(13, 37, 8, 1, &g), None);
    assert_eq!(t.gap_highest(0, 45, 10, 1, &g), Some(35));
    assert_eq!(t.gap_highest(0, 40, 10, 1, &g), Some(30));
    assert_eq!(t.gap_highest(0, 20, 10, 1, &g), Some(10));
    assert_eq!(t.gap_highest(0, 19, 10, 1, &g), None);
    assert_eq!(t.gap_highest(0, u64::MAX, 5, 1, &g), Some(u64::MAX - 15));
    // Alignment larger than any gap.
    assert_eq!(t.gap_lowest(0, 1 << 20, 1, 1 << 40, &g), None);
    assert_eq!(t.gap_lowest(0, u64::MAX, 1, 1 << 40, &g), Some(1 << 40));
}

#[test]
fn full_tree_has_no_gap() {
    let ranges: Vec<(u64, u64)> = (0..1000).map(|i| (i * 10, i * 10 + 10)).collect();
    let t = tree_of(&ranges);
    let g = t.pin();
    assert_eq!(t.gap_lowest(0, 10_000, 1, 1, &g), None);
    assert_eq!(t.gap_highest(0, 10_000, 1, 1, &g), None);
    assert_eq!(t.gap_lowest(0, 10_001, 1, 1, &g), Some(10_000));
    assert!(t.height() >= 3);
}

#[test]
fn many_inserts_and_removes_keep_invariants() {
    let t = RangeTree::with_reclaimer(Reclaimer::deferred());
    let n = 5000u64;
    {
        let mut w = t.writer();
        for i in 0..n {
            let k = (i * 7919) % n;
            w.insert(r(k * 16, k * 16 + 8), k).unwrap();
        }
    }
    t.check_invariants().unwrap();
    assert_eq!(t.len(), n as usize);
    {
        let mut w = t.writer();
        for i in (0..n).step_by(3) {
            assert!(w.remove(i * 16 + 1).is_some());
        }
    }
    t.check_invariants().unwrap();
    let g = t.pin();
    for i in 0..n {
        assert_eq!(t.find(i * 16 + 3, &g).is_some(), i % 3 != 0);
    }
}

#[test]
fn from_sorted_builds_full_nodes_and_rejects_bad_input() {
    for n in [0u64, 1, 15, 16, 17, 100, 4097] {
        let t = RangeTree::from_sorted((0..n).map(|i| (r(i * 16, i * 16 + 8), i))).unwrap();
        t.check_invariants().unwrap();
        assert_eq!(t.len(), n as usize);
        let g = t.pin();
        for i in 0..n {
            assert_eq!(t.find(i * 16 + 7, &g).map(|(_, v)| *v), Some(i));
            assert_eq!(t.find(i * 16 + 8, &g), None);
        }
        // Later edits work on a bulk-built tree.
        t.writer().insert(r(n * 16, n * 16 + 4), n).unwrap();
        t.check_invariants().unwrap();
    }
    // Bulk building packs nodes: fewer levels than sequential inserts,
    // which leave nodes half full.
    let bulk = RangeTree::from_sorted((0..100_000u64).map(|i| (r(i * 16, i * 16 + 8), i))).unwrap();
    let one_by_one = RangeTree::new();
    {
        let mut w = one_by_one.writer();
        for i in 0..100_000u64 {
            w.insert(r(i * 16, i * 16 + 8), i).unwrap();
        }
    }
    assert!(bulk.height() < one_by_one.height());
    assert_eq!(
        RangeTree::from_sorted([(r(0, 8), 0), (r(4, 12), 1)]).err(),
        Some(TreeError::Occupied)
    );
    assert_eq!(
        RangeTree::from_sorted([(r(16, 24), 0), (r(0, 8), 1)]).err(),
        Some(TreeError::Occupied)
    );
    assert_eq!(
        RangeTree::from_sorted([(r(8, 8), 0)]).err(),
        Some(TreeError::EmptyRange)
    );
}

#[test]
fn replace_all_swaps_the_contents_in_one_step() {
    let t = RangeTree::new();
    {
        let mut w = t.writer();
        for i in 0..50u64 {
            w.insert(r(i * 16, i * 16 + 8), i).unwrap();
        }
    }
    for n in [0u64, 1, 17, 300, 3] {
        t.writer()
            .replace_all((0..n).map(|i| (r(i * 32 + 4, i * 32 + 20), 1000 + i)))
            .unwrap();
        t.check_invariants().unwrap();
        assert_eq!(t.len(), n as usize);
        let g = t.pin();
        assert_eq!(t.find(0, &g), None);
        for i in 0..n {
            assert_eq!(t.find(i * 32 + 19, &g).map(|(_, v)| *v), Some(1000 + i));
            assert_eq!(t.find(i * 32 + 20, &g), None);
        }
    }
    // Bad input changes nothing.
    let before: Vec<_> = t.iter(&t.pin()).map(|(e, v)| (e, *v)).collect();
    assert_eq!(
        t.writer().replace_all([(r(0, 8), 0), (r(4, 12), 1)]),
        Err(TreeError::Occupied)
    );
    assert_eq!(
        t.writer().replace_all([(r(8, 8), 0)]),
        Err(TreeError::EmptyRange)
    );
    let after: Vec<_> = t.iter(&t.pin()).map(|(e, v)| (e, *v)).collect();
    assert_eq!(before, after);
    t.check_invariants().unwrap();
}

#[test]
fn a_store_or_erase_over_many_entries_rebuilds_in_one_step() {
    let fill = |t: &RangeTree<u64>| {
        let mut w = t.writer();
        for i in 0..200u64 {
            w.insert(r(i * 16, i * 16 + 8), i).unwrap();
        }
    };
    // Over entries 100..=150 (51 of 200: rebuilt, not removed one by one),
    // trimming the two at the ends.
    let over = r(100 * 16 + 3, 150 * 16 + 5);
    for store in [true, false] {
        let t = RangeTree::new();
        fill(&t);
        let got = if store {
            t.writer().store(over, 999)
        } else {
            t.writer().erase(over)
        };
        t.check_invariants().unwrap();
        assert_eq!(got.len(), 51);
        assert_eq!(got[0], (r(1603, 1608), 100));
        assert_eq!(got[50], (r(2400, 2405), 150));
        let g = t.pin();
        let all: Vec<_> = t.iter(&g).map(|(e, v)| (e, *v)).collect();
        let mut want: Vec<_> = (0..100u64).map(|i| (r(i * 16, i * 16 + 8), i)).collect();
        want.push((r(1600, 1603), 100));
        if store {
            want.push((over, 999));
        }
        want.push((r(2405, 2408), 150));
        want.extend((151..200u64).map(|i| (r(i * 16, i * 16 + 8), i)));
        assert_eq!(all, want);
        assert_eq!(t.len(), want.len());
    }
}

#[test]
fn rank_counts_keys_at_or_below() {
    // Every fill, every probe between and on the keys, and stale slots
    // past `len` (which the count must ignore).
    for len in 0..=node::B {
        let mut keys = [u64::MAX; node::B];
        for (i, k) in keys.iter_mut().enumerate().take(len) {
            *k = 10 * (i as u64 + 1);
        }
        keys[len..].fill(0);
        for x in 0..=10 * (node::B as u64 + 1) {
            let want = keys[..len].iter().filter(|&&k| k <= x).count();
            assert_eq!(node::rank(&keys, len, x), want, "len {len} x {x}");
        }
    }
}
