//! Differential test of the range tree against a slow, obviously correct
//! oracle (a BTreeMap of start -> (end, value)), with every invariant
//! checked after every step.

use aspace::reclaim::Reclaimer;
use aspace::tree::{RangeTree, TreeError};
use aspace::Range;
use proptest::prelude::*;
use std::collections::BTreeMap;

/// The oracle: entries by start.
#[derive(Default)]
struct Oracle(BTreeMap<u64, (u64, u32)>);

impl Oracle {
    fn entries(&self) -> Vec<(Range, u32)> {
        self.0
            .iter()
            .map(|(&s, &(e, v))| (Range::new(s, e), v))
            .collect()
    }
    fn find(&self, a: u64) -> Option<(Range, u32)> {
        self.entries().into_iter().find(|(r, _)| r.contains(a))
    }
    fn overwrite(&mut self, r: Range, v: Option<u32>) -> Vec<(Range, u32)> {
        let mut out = vec![];
        for (e, ev) in self.entries() {
            if let Some(x) = e.intersect(&r) {
                out.push((x, ev));
                self.0.remove(&e.start);
                if e.start < r.start {
                    self.0.insert(e.start, (r.start, ev));
                }
                if e.end > r.end {
                    self.0.insert(r.end, (e.end, ev));
                }
            }
        }
        if let Some(v) = v {
            self.0.insert(r.start, (r.end, v));
        }
        out
    }
    fn free(&self, a: u64, b: u64) -> bool {
        self.entries()
            .iter()
            .all(|(e, _)| !e.overlaps(&Range::new(a, b)))
    }
    fn gap_lowest(&self, lo: u64, hi: u64, size: u64, align: u64) -> Option<u64> {
        // Candidates: lo aligned, and every entry end aligned.
        let mut c: Vec<u64> = vec![lo];
        c.extend(self.entries().iter().map(|(e, _)| e.end));
        c.into_iter()
            .filter_map(|x| x.max(lo).checked_add(align - 1).map(|y| y & !(align - 1)))
            .filter(|&s| s.checked_add(size).is_some_and(|e| e <= hi) && self.free(s, s + size))
            .min()
    }
    fn gap_highest(&self, lo: u64, hi: u64, size: u64, align: u64) -> Option<u64> {
        let mut c: Vec<u64> = vec![hi];
        c.extend(self.entries().iter().map(|(e, _)| e.start));
        c.into_iter()
            .filter_map(|x| x.min(hi).checked_sub(size).map(|s| s & !(align - 1)))
            .filter(|&s| s >= lo && self.free(s, s + size))
            .max()
    }
}

#[derive(Clone, Debug)]
enum Op {
    Insert(u64, u64),
    Store(u64, u64),
    Erase(u64, u64),
    /// A store that returns no list (`store_only`).
    StoreOnly(u64, u64),
    /// An erase that returns no list (`erase_only`).
    EraseOnly(u64, u64),
    Remove(u64),
    /// Keep the entries whose value is not divisible by this.
    Retain(u32),
    Find(u64),
    Neighbours(u64),
    Range(u64, u64),
    Gap(u64, u64, u64, u32, bool),
}

/// Addresses from a small space (so ranges collide), plus the extremes.
fn addr() -> impl Strategy<Value = u64> {
    prop_oneof![
        8 => 0u64..2000,
        1 => Just(0u64),
        1 => u64::MAX - 2000..=u64::MAX,
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (addr(), 1u64..60).prop_map(|(a, l)| Op::Insert(a, a.saturating_add(l))),
        3 => (addr(), 0u64..120).prop_map(|(a, l)| Op::Store(a, a.saturating_add(l))),
        2 => (addr(), 0u64..200).prop_map(|(a, l)| Op::Erase(a, a.saturating_add(l))),
        2 => (addr(), 0u64..120).prop_map(|(a, l)| Op::StoreOnly(a, a.saturating_add(l))),
        1 => (addr(), 0u64..200).prop_map(|(a, l)| Op::EraseOnly(a, a.saturating_add(l))),
        2 => addr().prop_map(Op::Remove),
        1 => (2u32..5).prop_map(Op::Retain),
        3 => addr().prop_map(Op::Find),
        2 => addr().prop_map(Op::Neighbours),
        1 => (addr(), 0u64..300).prop_map(|(a, l)| Op::Range(a, a.saturating_add(l))),
        3 => (addr(), 0u64..3000, 1u64..80, 0u32..6, any::<bool>())
            .prop_map(|(lo, len, size, al, top)| Op::Gap(lo, lo.saturating_add(len), size, al, top)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn tree_matches_oracle(ops in proptest::collection::vec(op(), 1..250)) {
        let t: RangeTree<u32> = RangeTree::with_reclaimer(Reclaimer::deferred());
        let mut o = Oracle::default();
        for (i, op) in ops.into_iter().enumerate() {
            let tag = i as u32;
            let g = t.pin();
            match op {
                Op::Insert(a, b) => {
                    let r = Range::new(a, b);
                    let want = if r.is_empty() { Err(TreeError::EmptyRange) }
                        else if !o.free(a, b) { Err(TreeError::Occupied) } else { Ok(()) };
                    prop_assert_eq!(t.writer().insert(r, tag), want);
                    if want.is_ok() { o.0.insert(a, (b, tag)); }
                }
                Op::Store(a, b) => {
                    let r = Range::new(a, b);
                    let got = t.writer().store(r, tag);
                    let want = if r.is_empty() { vec![] } else { o.overwrite(r, Some(tag)) };
                    prop_assert_eq!(got, want);
                }
                Op::Erase(a, b) => {
                    let r = Range::new(a, b);
                    let got = t.writer().erase(r);
                    let want = if r.is_empty() { vec![] } else { o.overwrite(r, None) };
                    prop_assert_eq!(got, want);
                }
                Op::StoreOnly(a, b) => {
                    let r = Range::new(a, b);
                    t.writer().store_only(r, tag);
                    if !r.is_empty() { o.overwrite(r, Some(tag)); }
                }
                Op::EraseOnly(a, b) => {
                    let r = Range::new(a, b);
                    t.writer().erase_only(r);
                    if !r.is_empty() { o.overwrite(r, None); }
                }
                Op::Retain(k) => {
                    let before = o.0.len();
                    o.0.retain(|_, &mut (_, v)| v % k != 0);
                    prop_assert_eq!(t.writer().retain(|_, &v| v % k != 0), before - o.0.len());
                }
                Op::Remove(a) => {
                    let want = o.find(a);
                    if let Some((r, _)) = want { o.0.remove(&r.start); }
                    prop_assert_eq!(t.writer().remove(a), want);
                }
                Op::Find(a) => {
                    prop_assert_eq!(t.find(a, &g).map(|(r, v)| (r, *v)), o.find(a));
                }
                Op::Neighbours(a) => {
                    let es = o.entries();
                    let after = es.iter().find(|(r, _)| r.end > a).copied();
                    let prev = es.iter().rev().find(|(r, _)| r.end <= a).copied();
                    let next = es.iter().find(|(r, _)| r.start >= a).copied();
                    prop_assert_eq!(t.find_after(a, &g).map(|(r, v)| (r, *v)), after);
                    prop_assert_eq!(t.prev(a, &g).map(|(r, v)| (r, *v)), prev);
                    prop_assert_eq!(t.next(a, &g).map(|(r, v)| (r, *v)), next);
                }
                Op::Range(a, b) => {
                    let q = Range::new(a, b);
                    let want: Vec<_> = o.entries().into_iter().filter(|(r, _)| r.overlaps(&q)).collect();
                    let got: Vec<_> = t.range(q, &g).map(|(r, v)| (r, *v)).collect();
                    prop_assert_eq!(got, want);
                }
                Op::Gap(lo, hi, size, al, top) => {
                    let align = 1u64 << al;
                    if top {
                        let want = if lo < hi { o.gap_highest(lo, hi, size, align) } else { None };
                        prop_assert_eq!(t.gap_highest(lo, hi, size, align, &g), want, "gap_highest({}, {}, {}, {})", lo, hi, size, align);
                    } else {
                        let want = if lo < hi { o.gap_lowest(lo, hi, size, align) } else { None };
                        prop_assert_eq!(t.gap_lowest(lo, hi, size, align, &g), want, "gap_lowest({}, {}, {}, {})", lo, hi, size, align);
                    }
                }
            }
            drop(g);
            prop_assert_eq!(t.len(), o.0.len());
            if let Err(e) = t.check_invariants() {
                return Err(TestCaseError::fail(e));
            }
        }
        let g = t.pin();
        let all: Vec<_> = t.iter(&g).map(|(r, v)| (r, *v)).collect();
        prop_assert_eq!(all, o.entries());
    }
}

/// 1,000,000 ranges: the height stays within the B-tree bound for a
/// minimum fill of 8 (log8(n) + 1 levels).
#[test]
fn a_million_ranges_height_bound() {
    let t: RangeTree<u32> = RangeTree::with_reclaimer(Reclaimer::epoch());
    let n: u64 = 1_000_000;
    {
        let mut w = t.writer();
        // A scattered order exercises splits everywhere.
        let step = 7_919u64; // coprime with n
        for i in 0..n {
            let k = (i * step) % n;
            w.insert(Range::new(k * 0x2000, k * 0x2000 + 0x1000), k as u32)
                .unwrap();
        }
    }
    assert_eq!(t.len(), n as usize);
    let bound = ((n as f64).ln() / 8f64.ln()).floor() as usize + 1;
    assert!(
        t.height() <= bound,
        "height {} above bound {}",
        t.height(),
        bound
    );
    t.check_invariants().unwrap();
    let g = t.pin();
    assert_eq!(
        t.find(0x2000 * 500_000 + 5, &g).map(|(_, v)| *v),
        Some(500_000)
    );
    assert_eq!(t.gap_lowest(0, u64::MAX, 0x1000, 0x1000, &g), Some(0x1000));
    assert_eq!(
        t.gap_lowest(0, u64::MAX, 0x2000, 0x1000, &g),
        Some(n * 0x2000 - 0x1000)
    );
}
