//! Loom models of the page table: racing table installs and PTE installs
//! (the first of them racing to make the root, which an empty page table
//! does not have), and a lock-free lookup racing a zap and table free. Runs the real
//! `PageTable` through src/sync.rs. `./loom.sh --test loom_pt` runs them.
#![cfg(aspace_loom)]

mod common;
use common::model;

use aspace::loom_door::{PageTable, Pte, PteFlags};
use aspace::reclaim::Reclaimer;
use aspace::Pfn;
use aspace::Range;
use loom::sync::Arc;
use loom::thread;

const VA: u64 = 0x7f12_3456_7000;

/// Two faults install tables and a PTE for the same address, and for its
/// neighbour in the same PTE table: exactly one install of the shared
/// address wins, both see the winner's entry, no table leaks.
#[test]
fn racing_installs() {
    model(|| {
        let pt = Arc::new(PageTable::new(Reclaimer::deferred()));
        let p2 = pt.clone();
        let t = thread::spawn(move || {
            let g = p2.pin();
            let won = p2
                .install(VA, Pte::new(Pfn::new(7), PteFlags::USER), &g)
                .is_ok();
            p2.install(VA + 0x1000, Pte::new(Pfn::new(9), PteFlags::USER), &g)
                .unwrap();
            won
        });
        let g = pt.pin();
        let won = pt
            .install(VA, Pte::new(Pfn::new(8), PteFlags::USER), &g)
            .is_ok();
        let other = t.join().unwrap();
        assert!(won ^ other, "exactly one install wins");
        let e = pt.lookup(VA, &g);
        assert_eq!(e.pfn(), Pfn::new(if won { 8 } else { 7 }));
        assert_eq!(pt.lookup(VA + 0x1000, &g).pfn(), Pfn::new(9));
        // Root + PUD + PMD + PTE tables: losers freed their copies.
        assert_eq!(pt.table_pages(), 4);
    });
}

/// Two faults in different top-level slots race the first install on an
/// empty page table: they share only the root, which neither has yet.
/// Exactly one root is made; both entries are readable after, and the
/// loser's root is freed and uncharged (root + 2 x (PUD, PMD, PTE)).
///
/// Mutation caught: in `PageTable::make_table` (src/pt/walk.rs), publish
/// with a plain store instead of the compare-and-swap
/// (`e.store(new as u64 | TABLE_BIT, Ordering::Release)` then the `Ok`
/// arm): the loser's root replaces the winner's, and the winner's entry
/// is lost.
#[test]
fn racing_first_root_install() {
    model(|| {
        let pt = Arc::new(PageTable::new(Reclaimer::deferred()));
        let far = 0x7f00_0000_0000;
        let p2 = pt.clone();
        let t = thread::spawn(move || {
            let g = p2.pin();
            p2.install(far, Pte::new(Pfn::new(2), PteFlags::USER), &g)
                .unwrap();
        });
        {
            let g = pt.pin();
            pt.install(0x1000, Pte::new(Pfn::new(1), PteFlags::USER), &g)
                .unwrap();
        }
        t.join().unwrap();
        let g = pt.pin();
        assert_eq!(pt.lookup(0x1000, &g).pfn(), Pfn::new(1));
        assert_eq!(pt.lookup(far, &g).pfn(), Pfn::new(2));
        assert_eq!(pt.table_pages(), 7);
    });
}

/// A lock-free lookup races with zap + free_tables: it sees the old entry
/// or none, never garbage.
#[test]
fn lookup_vs_zap_and_free() {
    model(|| {
        let pt = Arc::new(PageTable::new(Reclaimer::deferred()));
        {
            let g = pt.pin();
            pt.install(
                VA,
                Pte::new(Pfn::new(5), PteFlags::USER | PteFlags::WRITE),
                &g,
            )
            .unwrap();
        }
        let p2 = pt.clone();
        let t = thread::spawn(move || {
            let g = p2.pin();
            let e = p2.lookup(VA, &g);
            assert!(e == Pte::NONE || e.pfn() == Pfn::new(5), "{e:?}");
        });
        let g = pt.pin();
        let mut n = 0;
        pt.zap_range(Range::new(VA, VA + 0x1000), &g, |_, frame| {
            assert_eq!(frame, Some(Pfn::new(5)));
            n += 1;
        });
        assert_eq!(n, 1);
        pt.free_tables(Range::new(0, 1 << 47), &g);
        t.join().unwrap();
        assert_eq!(pt.table_pages(), 1);
    });
}
