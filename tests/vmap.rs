//! vmap behaviour through the public API: a proptest against an oracle
//! and a concurrent disjointness test.

#[path = "common/rng.rs"]
mod rng;

use aspace::vmap::{AreaState, Mode, Vmap, VmapConfig};
use aspace::{Range, PAGE_SIZE};
use proptest::prelude::*;
use rng::XorShift;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

const BASE: u64 = 0x4000_0000;
const PAGES: u64 = 256;

fn vmap(zones: usize, lazy_max: u64) -> Vmap {
    Vmap::new(VmapConfig {
        window: Range::new(BASE, BASE + PAGES * PAGE_SIZE),
        mode: if zones == 1 {
            Mode::GlobalLock
        } else {
            Mode::PerCpu
        },
        zones,
        lazy_max_bytes: lazy_max,
    })
    .unwrap()
}

#[derive(Clone, Debug)]
enum Op {
    Alloc(u64, u32),
    Free(usize),
    FreeBogus(u64, u64),
    Purge,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (1u64..20, 0u32..4).prop_map(|(p, a)| Op::Alloc(p, a)),
        4 => any::<usize>().prop_map(Op::Free),
        1 => (0u64..PAGES, 1u64..4).prop_map(|(p, n)| Op::FreeBogus(p, n)),
        1 => Just(Op::Purge),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// No overlap ever; every byte of the window is free, busy or lazy
    /// exactly once; busy areas are exactly the oracle's live ones; bogus
    /// frees fail and change nothing.
    #[test]
    fn vmap_matches_oracle(zones in 1usize..4, lazy_pages in 1u64..40, ops in proptest::collection::vec(op(), 1..200)) {
        let v = vmap(zones, lazy_pages * PAGE_SIZE);
        let mut live: BTreeMap<u64, Range> = BTreeMap::new();
        for op in ops {
            match op {
                Op::Alloc(pages, al) => {
                    let align = PAGE_SIZE << al;
                    if let Ok(r) = v.alloc(pages * PAGE_SIZE, align) {
                        prop_assert_eq!(r.len(), pages * PAGE_SIZE);
                        prop_assert_eq!(r.start % align, 0);
                        prop_assert!(r.start >= BASE && r.end <= BASE + PAGES * PAGE_SIZE);
                        prop_assert!(live.values().all(|l| !l.overlaps(&r)), "overlap: {:?}", r);
                        live.insert(r.start, r);
                    }
                }
                Op::Free(i) => {
                    if !live.is_empty() {
                        let k = *live.keys().nth(i % live.len()).unwrap();
                        let r = live.remove(&k).unwrap();
                        prop_assert!(v.free(r).is_ok());
                        prop_assert!(v.free(r).is_err(), "double free accepted");
                    }
                }
                Op::FreeBogus(p, n) => {
                    let r = Range::new(BASE + p * PAGE_SIZE, BASE + (p + n) * PAGE_SIZE);
                    if !live.values().any(|l| *l == r) {
                        let before = v.areas();
                        prop_assert!(v.free(r).is_err());
                        prop_assert_eq!(v.areas(), before);
                    }
                }
                Op::Purge => v.purge_all(),
            }
            let areas = v.areas();
            for w in areas.windows(2) {
                prop_assert!(w[0].0.end <= w[1].0.start, "areas overlap: {:?}", w);
            }
            let busy: Vec<Range> = areas.iter().filter(|a| a.1 == AreaState::Busy).map(|a| a.0).collect();
            let want: Vec<Range> = live.values().copied().collect();
            prop_assert_eq!(busy, want);
        }
    }
}

/// All threads allocate, stamp each page in a side table, check that no
/// other live area owns it, and free.
#[test]
fn concurrent_allocations_are_disjoint() {
    let v = Arc::new(vmap(4, 8 * PAGE_SIZE));
    let owner: Arc<Vec<Mutex<Option<usize>>>> =
        Arc::new((0..PAGES).map(|_| Mutex::new(None)).collect());
    let hs: Vec<_> = (0..4)
        .map(|t| {
            let (v, owner) = (v.clone(), owner.clone());
            std::thread::spawn(move || {
                let mut rng = XorShift::new(77u64 + t as u64);
                for _ in 0..3000 {
                    let x = rng.next_u64();
                    let pages = 1 + x % 8;
                    let Ok(r) = v.alloc(pages * PAGE_SIZE, PAGE_SIZE) else {
                        continue;
                    };
                    let idx = |a: u64| ((a - BASE) / PAGE_SIZE) as usize;
                    for p in idx(r.start)..idx(r.end) {
                        let mut o = owner[p].lock().unwrap();
                        assert_eq!(*o, None, "page {p} handed out twice");
                        *o = Some(t);
                    }
                    for p in idx(r.start)..idx(r.end) {
                        *owner[p].lock().unwrap() = None;
                    }
                    v.free(r).unwrap();
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let s = v.stats();
    assert_eq!(s.allocs, s.frees);
    assert!(s.purges > 0);
}

/// Windows at the top of the address space, and more zones than pages:
/// zones stop at the window's end without overflowing, and a zone count
/// past `MAX_ZONES` is `EINVAL` (each zone is made up front).
#[test]
fn windows_at_the_top_and_zone_counts_are_checked() {
    use aspace::vmap::MAX_ZONES;
    use aspace::Error;
    let cfg = |window: Range, zones: usize| VmapConfig {
        window,
        mode: Mode::PerCpu,
        zones,
        lazy_max_bytes: 1 << 20,
    };
    let top = Range::new(1 << 63, u64::MAX - 4095);
    let v = Vmap::new(cfg(top, 2)).unwrap();
    assert_eq!(v.zones(), 2);
    let a = v.alloc(PAGE_SIZE, PAGE_SIZE).unwrap();
    assert!(top.start <= a.start && a.end <= top.end);
    let last = Range::new(u64::MAX - 8191, u64::MAX - 4095);
    assert_eq!(Vmap::new(cfg(last, 3)).unwrap().zones(), 1);
    assert_eq!(Vmap::new(cfg(last, MAX_ZONES)).unwrap().zones(), 1);
    assert_eq!(Vmap::new(cfg(top, MAX_ZONES + 1)).err(), Some(Error::Inval));
    assert_eq!(Vmap::new(cfg(top, usize::MAX)).err(), Some(Error::Inval));
}
