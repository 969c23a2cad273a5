//! Unit tests of the page table: walks, installs, zaps, moves, frees.

use super::moves::MoveStats;
use super::*;
use crate::addr::{Range, PAGE_SIZE, PMD_SIZE};
use crate::phys::Pfn;
use crate::reclaim::Reclaimer;

fn pt() -> PageTable {
    PageTable::new(Reclaimer::deferred())
}

#[test]
fn install_lookup_update_zap() {
    let p = pt();
    let g = p.pin();
    let va = 0x7f00_0000_3000;
    assert_eq!(p.lookup(va, &g), Pte::NONE);
    let e = Pte::new(Pfn::new(42), PteFlags::USER | PteFlags::WRITE);
    p.install(va, e, &g).unwrap();
    assert_eq!(
        p.install(va, Pte::new(Pfn::new(1), PteFlags::USER), &g),
        Err(e)
    );
    assert_eq!(p.lookup(va, &g).pfn(), Pfn::new(42));
    assert!(p.lookup(va, &g).is_writable());
    let ro = p
        .update(va, &g, |old| Some(Pte::new(old.pfn(), PteFlags::USER)))
        .unwrap();
    assert!(!ro.is_writable());
    assert_eq!(p.table_pages(), 4);
    let mut zapped = vec![];
    p.zap_range(
        Range::new(va - PAGE_SIZE, va + PAGE_SIZE),
        &g,
        |a, frame| zapped.push((a, frame)),
    );
    assert_eq!(zapped, vec![(va, Some(Pfn::new(42)))]);
    assert_eq!(p.lookup(va, &g), Pte::NONE);
    p.free_tables(Range::new(0, 1 << 47), &g);
    assert_eq!(p.table_pages(), 1);
}

#[test]
fn free_tables_within_frees_only_tables_inside_the_limits() {
    let p = pt();
    let g = p.pin();
    // Two pages in one PTE table, 2 MiB-aligned table at `base`.
    let base = 0x7f00_0000_0000;
    let (a, b) = (base + PAGE_SIZE, base + 7 * PAGE_SIZE);
    p.install(a, Pte::new(Pfn::new(1), PteFlags::USER), &g)
        .unwrap();
    p.install(b, Pte::new(Pfn::new(2), PteFlags::USER), &g)
        .unwrap();
    assert_eq!(p.table_pages(), 4);
    p.zap_range(Range::new(b, b + PAGE_SIZE), &g, |_, _| {});
    // The PTE table still maps `a`: nothing is freed however wide the
    // limits.
    p.free_tables_within(Range::new(b, b + PAGE_SIZE), Range::new(0, 1 << 47), &g);
    assert_eq!(p.table_pages(), 4);
    p.zap_range(Range::new(a, a + PAGE_SIZE), &g, |_, _| {});
    // Empty now, but limits that stop short of its 2 MiB span (a VMA
    // below `a` may still use it) keep it.
    let r = Range::new(a, a + PAGE_SIZE);
    p.free_tables_within(r, Range::new(a, 1 << 47), &g);
    assert_eq!(p.table_pages(), 4);
    // Limits covering the whole hole free the PTE, PMD and PUD tables
    // on the path, though the walk visits only `r`.
    p.free_tables_within(r, Range::new(0, 1 << 47), &g);
    assert_eq!(p.table_pages(), 1);
}

#[test]
fn ranges_across_pmd_and_pud_boundaries() {
    let p = pt();
    let g = p.pin();
    let base = (1u64 << 30) - 4 * PAGE_SIZE; // crosses a 1 GiB boundary
    for i in 0..8 {
        p.install(
            base + i * PAGE_SIZE,
            Pte::new(Pfn::new(i as u32), PteFlags::USER),
            &g,
        )
        .unwrap();
    }
    let mut seen = vec![];
    p.for_each_present(Range::new(0, 1 << 40), &g, |va, pte| {
        seen.push((va, pte.pfn()))
    });
    assert_eq!(seen.len(), 8);
    assert!(seen.windows(2).all(|w| w[0].0 < w[1].0));
    p.change_range(Range::new(base, base + 8 * PAGE_SIZE), &g, |_, pte| {
        Pte::new(pte.pfn(), PteFlags::USER | PteFlags::WRITE)
    });
    assert!(p.lookup(base + 5 * PAGE_SIZE, &g).is_writable());
    // Move across a PMD boundary at both ends.
    let to = 5 * PMD_SIZE - 3 * PAGE_SIZE;
    let mut extents = vec![];
    let st = p.move_range(base, to, 8 * PAGE_SIZE, u64::MAX, &g, |r| extents.push(r));
    assert_eq!(
        (st.entries, st.copied, st.relinked, st.extents),
        (8, 8, 0, 3)
    );
    // Bounded by the source's 1 GiB (and PMD) boundary after 4 pages,
    // then by the destination's PMD boundary after 3 more.
    assert_eq!(
        extents,
        vec![
            Range::new(base, base + 3 * PAGE_SIZE),
            Range::new(base + 3 * PAGE_SIZE, base + 4 * PAGE_SIZE),
            Range::new(base + 4 * PAGE_SIZE, base + 8 * PAGE_SIZE),
        ]
    );
    for i in 0..8 {
        assert_eq!(p.lookup(to + i * PAGE_SIZE, &g).pfn(), Pfn::new(i as u32));
        assert_eq!(p.lookup(base + i * PAGE_SIZE, &g), Pte::NONE);
    }
    p.free_tables(Range::new(0, 2 * PMD_SIZE), &g);
    p.free_tables(Range::new(1 << 29, 1 << 31), &g);
    let before = p.table_pages();
    p.zap_range(Range::new(to, to + 8 * PAGE_SIZE), &g, |_, _| {});
    p.free_tables(Range::new(0, 1 << 47), &g);
    assert!(before > 1);
    assert_eq!(p.table_pages(), 1);
}

#[test]
fn move_relinks_whole_aligned_pte_tables() {
    let p = pt();
    let g = p.pin();
    let (from, to) = (4 * PMD_SIZE, 64 * PMD_SIZE);
    let n = 2 * 512 + 3;
    for i in 0..n {
        p.install(
            from + i * PAGE_SIZE,
            Pte::new(Pfn::new(i as u32), PteFlags::USER),
            &g,
        )
        .unwrap();
    }
    let tables = p.table_pages();
    let mut extents = 0;
    let st = p.move_range(from, to, n * PAGE_SIZE, u64::MAX, &g, |_| extents += 1);
    // Two tables swing whole; the 3-page tail is copied.
    assert_eq!(
        (st.entries, st.copied, st.relinked, st.extents),
        (n, 3, 2, 3)
    );
    assert_eq!(extents, 3);
    for i in 0..n {
        assert_eq!(p.lookup(to + i * PAGE_SIZE, &g).pfn(), Pfn::new(i as u32));
        assert_eq!(p.lookup(from + i * PAGE_SIZE, &g), Pte::NONE);
    }
    // The relinked tables are not copies: only the tail's table is new.
    assert_eq!(p.table_pages(), tables + 1);
    // Extents capped at 64 pages never relink.
    let st = p.move_range(to, from, n * PAGE_SIZE, 64 * PAGE_SIZE, &g, |_| {});
    assert_eq!(
        (st.entries, st.copied, st.relinked, st.extents),
        (n, n, 0, 17)
    );
    // A destination that already has a table falls back to copying.
    let back = p.move_range(from, to, 512 * PAGE_SIZE, u64::MAX, &g, |_| {});
    assert_eq!((back.copied, back.relinked), (512, 0));
    // Holes are skipped: nothing moves, no extent is reported.
    let none = p.move_range(1 << 40, 1 << 41, 1 << 30, u64::MAX, &g, |_| {
        panic!("nothing to move")
    });
    assert_eq!(none, MoveStats::default());
}

#[test]
fn out_of_range_addresses() {
    let p = pt();
    let g = p.pin();
    assert_eq!(p.lookup(1 << 48, &g), Pte::NONE);
    assert_eq!(
        p.install(!0xfff, Pte::new(Pfn::new(1), PteFlags::USER), &g),
        Err(Pte::NONE)
    );
    p.zap_range(Range::new(1 << 47, u64::MAX), &g, |_, _| {
        panic!("nothing there")
    });
}

#[test]
fn concurrent_installs_one_winner_per_address() {
    use crate::sync::Arc;
    let p = Arc::new(PageTable::new(Reclaimer::epoch()));
    let hs: Vec<_> = (0..4u32)
        .map(|t| {
            let p = p.clone();
            std::thread::spawn(move || {
                let g = p.pin();
                let mut wins = 0;
                for i in 0..2048u64 {
                    if p.install(
                        0x1000_0000 + i * PAGE_SIZE,
                        Pte::new(Pfn::new(t), PteFlags::USER),
                        &g,
                    )
                    .is_ok()
                    {
                        wins += 1;
                    }
                }
                wins
            })
        })
        .collect();
    let wins: u64 = hs.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(wins, 2048);
    // 2048 pages = 4 PTE tables + 1 PMD + 1 PUD + root.
    assert_eq!(p.table_pages(), 7);
}

#[test]
fn the_root_is_made_on_first_use_and_nothing_needs_it_before() {
    let frames = Arc::new(FrameAllocator::new(1 << 30, false));
    let budget = frames.memory().clone();
    let p = PageTable::with_frames(Reclaimer::deferred(), frames);
    assert_eq!(
        p.root.load(Ordering::Relaxed),
        0,
        "creation allocates no table"
    );
    assert!(!p.tables.is_allocated());
    let g = p.pin();
    let va = 0x7f00_0000_3000;
    let all = Range::new(0, 1 << 47);
    // Every walk that creates nothing works on a missing root.
    assert_eq!(p.lookup(va, &g), Pte::NONE);
    assert_eq!(p.update(va, &g, |_| Some(Pte::NONE)), None);
    let e = Pte::new(Pfn::new(7), PteFlags::USER);
    p.sweep(all, &g);
    assert_eq!(
        p.slot_checked(va, &g, &|| false).err(),
        Some(CheckedInstallError::Invalid)
    );
    assert_eq!(p.table_pages(), 0, "a refused check links no table");
    assert_eq!(
        p.install_checked_in(va, e, &g, false, || true),
        Err(CheckedInstallError::NoTable)
    );
    p.zap_range(all, &g, |_, _| panic!("nothing to zap"));
    p.change_range(all, &g, |_, e| e);
    p.for_each_present(all, &g, |_, _| panic!("nothing present"));
    p.free_tables(all, &g);
    assert_eq!(p.missing_span(va, &g), Some((1 << 48) - va));
    // Past the 48 bits: all the way to the top, at once.
    assert_eq!(
        p.missing_span(1 << 48, &g),
        Some(0u64.wrapping_sub(1 << 48))
    );
    assert_eq!(p.missing_span(u64::MAX - 4095, &g), Some(4096));
    let dst = pt();
    let dg = dst.pin();
    assert_eq!(
        p.copy_ranges(&dst, [all], &g, &dg, |_, e| Some((e, e))),
        Ok(0)
    );
    assert_eq!(
        dst.root.load(Ordering::Relaxed),
        0,
        "copying nothing makes nothing"
    );
    assert_eq!((p.table_pages(), budget.used()), (0, 0));
    assert_eq!(p.root.load(Ordering::Relaxed), 0);
    // The first install makes it, charged like any table.
    p.install(va, e, &g).unwrap();
    assert_eq!(p.table_pages(), 4);
    assert_eq!(budget.used(), 4 * TABLE_BYTES);
    drop(g);
    drop(p);
    assert_eq!(budget.used(), 0);
}

#[test]
fn racing_first_installs_agree_on_one_root() {
    for _ in 0..50 {
        let frames = Arc::new(FrameAllocator::new(1 << 30, false));
        let budget = frames.memory().clone();
        let p = PageTable::with_frames(Reclaimer::deferred(), frames);
        let vas = [0x1000u64, 0x7f00_0000_0000];
        let start = std::sync::Barrier::new(vas.len());
        std::thread::scope(|s| {
            for (i, &va) in vas.iter().enumerate() {
                let (p, start) = (&p, &start);
                s.spawn(move || {
                    let g = p.pin();
                    start.wait();
                    let e = Pte::new(Pfn::new(i as u32 + 1), PteFlags::USER);
                    p.install(va, e, &g).unwrap();
                });
            }
        });
        let g = p.pin();
        for (i, &va) in vas.iter().enumerate() {
            assert_eq!(p.lookup(va, &g).pfn(), Pfn::new(i as u32 + 1));
        }
        // One root, and a PUD, PMD and PTE table for each address: a lost
        // race leaves no table charged.
        assert_eq!(p.table_pages(), 7);
        assert_eq!(budget.used(), 7 * TABLE_BYTES);
        drop(g);
        drop(p);
        assert_eq!(budget.used(), 0);
    }
}

#[test]
fn tables_are_frames_of_the_pool_and_go_back_to_it() {
    let frames = Arc::new(FrameAllocator::new(16 * PAGE_SIZE, false));
    let p = PageTable::with_frames(Reclaimer::deferred(), frames.clone());
    let g = p.pin();
    // One entry per 2 MiB: a PTE table each, under one root, PUD and PMD,
    // until the pool's 16 frames are tables.
    let e = Pte::new(Pfn::new(1), PteFlags::USER);
    let mut n = 0;
    while p.install(n * PMD_SIZE, e, &g).is_ok() {
        n += 1;
    }
    assert_eq!(n, 13);
    assert_eq!(p.table_pages(), 16);
    assert_eq!(frames.memory().used(), 16 * TABLE_BYTES);
    assert_eq!(frames.used(), 0, "tables are not data frames");
    assert!(frames.alloc().is_none(), "every frame is a table");
    // mremap's destination tables are forced past the budget: with no
    // frame free they are heap pages (a PUD, PMD and PTE table at 1 TiB).
    let st = p.move_range(0, 1 << 40, PAGE_SIZE, PMD_SIZE, &g, |_| {});
    assert_eq!(st.entries, 1);
    assert_eq!(p.lookup(1 << 40, &g).pfn(), e.pfn());
    assert_eq!(p.table_pages(), 19);
    assert_eq!(frames.memory().used(), 19 * TABLE_BYTES);
    drop(g);
    drop(p);
    assert_eq!(frames.memory().used(), 0);
    let back = std::iter::from_fn(|| frames.alloc()).count();
    assert_eq!(back, 16, "every table's frame is back in the pool");
}

#[test]
fn a_dropped_tables_entries_never_show_as_data() {
    // A pool that does not clear frames hands out what their last user
    // left: a table page must not leave its entries (host addresses).
    let frames = Arc::new(FrameAllocator::new(8 * PAGE_SIZE, false));
    let p = PageTable::with_frames(Reclaimer::deferred(), frames.clone());
    let g = p.pin();
    p.install(0x7f00_0000_3000, Pte::new(Pfn::new(5), PteFlags::USER), &g)
        .unwrap();
    assert_eq!(p.table_pages(), 4);
    drop(g);
    drop(p);
    let mut page = [0u8; PAGE_SIZE as usize];
    for pfn in std::iter::from_fn(|| frames.alloc()) {
        frames.read(pfn, 0, &mut page);
        assert!(page.iter().all(|&b| b == 0), "frame {pfn} holds entries");
    }
}

#[test]
fn checked_walk_makes_tables_only_while_valid() {
    let p = pt();
    let g = p.pin();
    let va = 0x4000_3000;
    // The root made, then a refusal at the next slot: one table only.
    let calls = core::cell::Cell::new(0);
    let once = || {
        calls.set(calls.get() + 1);
        calls.get() == 1
    };
    assert_eq!(
        p.slot_checked(va, &g, &once).err(),
        Some(CheckedInstallError::Invalid)
    );
    assert_eq!(p.table_pages(), 1);
    let Ok(s) = p.slot_checked(va, &g, &|| true) else {
        panic!("a valid walk makes its tables")
    };
    assert_eq!(p.table_pages(), 4);
    let e = Pte::new(Pfn::new(7), PteFlags::USER);
    s.install_checked(e, || true).unwrap();
    assert_eq!(p.lookup(va, &g), e);
    // Existing tables need no check.
    assert!(p.slot_checked(va + 4096, &g, &|| false).is_ok());
    // The sweep runs over tables and empty slots alike.
    p.sweep(Range::new(0, 1 << 47), &g);
}

#[test]
fn update_inside_a_leaf_splits_it_only_for_a_change() {
    let p = pt();
    let g = p.pin();
    let va = 0x7f00_0040_0000;
    let leaf = Pte::new(
        Pfn::new(512),
        PteFlags::USER | PteFlags::WRITE | PteFlags::HUGE,
    );
    p.install_huge(va, leaf, &g, || true).unwrap();
    let page = va + 5 * PAGE_SIZE;
    let view = leaf.subpage(5);
    // Nothing changed, or the same entry back: the leaf stays whole.
    let mut seen = None;
    assert_eq!(
        p.update(page, &g, |cur| {
            seen = Some(cur);
            None
        }),
        None
    );
    assert_eq!(seen, Some(view), "the page's 4 KiB view");
    assert_eq!(p.update(page, &g, Some), Some(view));
    assert_eq!(p.huge_at(va, &g), Some(leaf));
    assert_eq!(p.splits(), 0);
    // A 4 KiB change: split, that page changed, the rest as they were.
    let ro = Pte::new(view.pfn(), PteFlags::USER);
    assert_eq!(p.update(page, &g, |_| Some(ro)), Some(ro));
    assert_eq!(p.huge_at(va, &g), None);
    assert_eq!(p.splits(), 1);
    assert_eq!(p.lookup(page, &g), ro);
    assert_eq!(p.lookup(va + 6 * PAGE_SIZE, &g), leaf.subpage(6));
    assert_eq!(p.lookup(va, &g), leaf.subpage(0));
}

/// A table retired on one CPU and freed after the grace period on another
/// (the deferred free runs on whichever thread collects) goes back to the
/// cache of the CPU that retired it, whose cache holds its lines.
#[cfg(target_os = "linux")]
#[test]
fn retired_tables_go_back_to_the_cpu_that_retired_them() {
    let &[a, b, ..] = crate::percpu::allowed_cpus().as_slice() else {
        return; // one CPU: nothing to tell apart
    };
    let frames = Arc::new(FrameAllocator::new(64 * PAGE_SIZE, false));
    // The deferred reclaimer frees what was retired when the page table
    // is dropped: on the second thread below.
    let p = PageTable::with_frames(Reclaimer::deferred(), frames.clone());
    let va = 0x7f00_0000_3000;
    let slot = std::thread::scope(|s| {
        s.spawn(|| {
            crate::percpu::pin_to(a);
            let g = p.pin();
            p.install(va, Pte::new(Pfn::new(42), PteFlags::USER), &g)
                .unwrap();
            p.zap_range(Range::new(va, va + PAGE_SIZE), &g, |_, _| {});
            let slot = crate::percpu::cpu_id();
            // The PTE, PMD and PUD tables on the path are retired here.
            p.free_tables(Range::new(0, 1 << 47), &g);
            assert_eq!(p.table_pages(), 1);
            slot
        })
        .join()
        .unwrap()
    });
    std::thread::scope(|s| {
        s.spawn(|| {
            crate::percpu::pin_to(b);
            assert_ne!(crate::percpu::cpu_id(), slot, "two CPU slots");
            drop(p);
        });
    });
    assert_eq!(
        frames.cached_dirty_on(slot).len(),
        3,
        "the three retired tables are back in the retiring CPU's cache"
    );
}

/// The filled PMD slots of a range are those with a PTE table, in order,
/// found across missing PMD, PUD and root-entry spans and at the range's
/// edges (a span starting before the range's start counts, one starting
/// at its end does not).
#[test]
fn filled_pmds_are_the_spans_with_a_table() {
    let p = pt();
    let g = p.pin();
    let at = [
        PMD_SIZE,                 // the second span of the first GiB
        (1 << 30) + 5 * PMD_SIZE, // the next GiB
        (1 << 39) + 3 * PMD_SIZE, // the next root entry
        (7 << 39) + PAGE_SIZE,    // six root entries later, mid-span
        (7 << 39) + 2 * PMD_SIZE, // the range's end: not counted
    ];
    for (i, &va) in at.iter().enumerate() {
        p.install(va, Pte::new(Pfn::new(i as u32), PteFlags::USER), &g)
            .unwrap();
    }
    let mut seen = vec![];
    p.for_each_filled_pmd(PMD_SIZE + PAGE_SIZE, (7 << 39) + 2 * PMD_SIZE, &g, |va| {
        seen.push(va)
    });
    let want: Vec<u64> = at[..4].iter().map(|va| va & !(PMD_SIZE - 1)).collect();
    assert_eq!(seen, want);
    for &va in &want {
        assert!(!p.pmd_none(va, &g));
    }
}
