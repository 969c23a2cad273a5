//! munmap: splits at both ends, unmapping nothing, the errors, and the
//! page tables a hole frees.

use super::*;

#[test]
fn munmap_splits_at_both_ends() {
    on_both(32, |t| {
        let r = t.region();
        let a = map(t, 0, 10, RW, ANON);
        let data = fill(t, a, 10, 3);
        check!(t, t.munmap(r.page(3), 2 * PAGE), Ok(()));
        assert_layout(t, &[(0, 3, "rw-p"), (5, 10, "rw-p")]);
        // Over the end of a VMA and a hole.
        check!(t, t.munmap(r.page(8), 6 * PAGE), Ok(()));
        assert_layout(t, &[(0, 3, "rw-p"), (5, 8, "rw-p")]);
        // An odd length rounds up to whole pages.
        check!(t, t.munmap(r.page(0), 100), Ok(()));
        assert_layout(t, &[(1, 3, "rw-p"), (5, 8, "rw-p")]);
        check!(
            t,
            load(t, r.page(1), 2 * PAGE),
            Ok(data[PAGE as usize..3 * PAGE as usize].to_vec())
        );
        check!(
            t,
            load(t, r.page(5), 3 * PAGE),
            Ok(data[5 * PAGE as usize..8 * PAGE as usize].to_vec())
        );
        check!(t, load(t, r.page(3), 1), Err(EFAULT));
        // Over several VMAs and holes at once.
        check!(t, t.munmap(r.page(0), 20 * PAGE), Ok(()));
        assert_layout(t, &[]);
    });
}

#[test]
fn munmap_of_nothing_succeeds() {
    on_both(32, |t| {
        let r = t.region();
        map(t, 0, 2, RW, ANON);
        check!(t, t.munmap(r.page(10), 10 * PAGE), Ok(()));
        check!(t, t.munmap(r.page(2), PAGE), Ok(()));
        assert_layout(t, &[(0, 2, "rw-p")]);
    });
}

#[test]
fn munmap_einval_cases() {
    on_both(16, |t| {
        let r = t.region();
        map(t, 0, 4, RW, ANON);
        let before = t.layout();
        check!(t, t.munmap(r.page(0) + 1, PAGE), Err(EINVAL));
        check!(t, t.munmap(r.page(0), 0), Err(EINVAL));
        check!(t, t.munmap(TASK_SIZE, PAGE), Err(EINVAL));
        check!(t, t.munmap(TASK_SIZE - PAGE, 2 * PAGE), Err(EINVAL));
        check!(t, t.munmap(r.page(0), TASK_SIZE), Err(EINVAL));
        check!(t, t.munmap(r.page(0), u64::MAX - 10), Err(EINVAL));
        check!(t, t.munmap(LAST_PAGE, PAGE), Err(EINVAL));
        assert_eq!(t.layout(), before);
    });
}

/// aspace only: page tables are host memory here. Unmapping frees the
/// tables that only the hole used (the walk reaches them through the
/// unmapped range; the neighbouring VMAs bound what may go), and keeps
/// the ones a neighbour still maps through.
#[test]
fn unmapping_frees_the_page_tables_of_the_hole() {
    let cfg = Config::default();
    let start = cfg.brk_start;
    let mm = AddressSpace::new(cfg);
    // An idle space has no table, not even a root: the first fault makes it.
    assert_eq!(mm.page_table_bytes(), 0);
    // A lone page far from everything: root, PUD, PMD and PTE tables.
    let anon = MapFlags::PRIVATE | MapFlags::ANONYMOUS | MapFlags::FIXED;
    let far = 0x7e00_0000_0000;
    mm.mmap(far, PAGE, Prot::READ | Prot::WRITE, anon).unwrap();
    mm.write(far, b"x").unwrap();
    let one_page = mm.page_table_bytes();
    mm.munmap(far, PAGE).unwrap();
    // Only the root stays (it lives as long as the space).
    assert_eq!(mm.page_table_bytes() * 4, one_page);
    // The heap crosses into a new PTE table (2 MiB) and back: the upper
    // table goes, the one still holding the heap's first page stays.
    let table = 2 << 20;
    assert_eq!(start % table, 0, "test assumes an aligned brk start");
    mm.brk(start + PAGE).unwrap();
    mm.write(start, b"low").unwrap();
    let low = mm.page_table_bytes();
    mm.brk(start + table + PAGE).unwrap();
    mm.write(start + table, b"high").unwrap();
    assert!(mm.page_table_bytes() > low);
    assert_eq!(mm.brk(start + PAGE), Ok(start + PAGE));
    assert_eq!(mm.page_table_bytes(), low);
    let mut buf = [0u8; 3];
    mm.read(start, &mut buf).unwrap();
    assert_eq!(&buf, b"low");
}
