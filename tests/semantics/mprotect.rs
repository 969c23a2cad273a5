//! mprotect: splits and merges, holes, the errors, growsdown, and stores
//! to read-only pages.

use super::*;

#[test]
fn mprotect_splits_and_merges_back() {
    on_both(32, |t| {
        let r = t.region();
        let a = map(t, 0, 8, RW, ANON);
        let data = fill(t, a, 8, 11);
        check!(t, t.mprotect(r.page(3), PAGE, PROT_READ), Ok(()));
        assert_layout(t, &[(0, 3, "rw-p"), (3, 4, "r--p"), (4, 8, "rw-p")]);
        check!(t, t.mprotect(r.page(3), PAGE, RW), Ok(()));
        assert_layout(t, &[(0, 8, "rw-p")]);
        // At the ends.
        check!(t, t.mprotect(r.page(0), 2 * PAGE, PROT_NONE), Ok(()));
        check!(
            t,
            t.mprotect(r.page(6), 2 * PAGE, PROT_READ | PROT_EXEC),
            Ok(())
        );
        assert_layout(t, &[(0, 2, "---p"), (2, 6, "rw-p"), (6, 8, "r-xp")]);
        // Over all of them at once: one VMA again.
        check!(t, t.mprotect(r.page(0), 8 * PAGE, RW), Ok(()));
        assert_layout(t, &[(0, 8, "rw-p")]);
        check!(t, load(t, a, 8 * PAGE), Ok(data));
        // Zero length: nothing to do.
        check!(t, t.mprotect(r.page(20), 0, PROT_READ), Ok(()));
    });
}

#[test]
fn mprotect_merge_into_the_next_vma_then_continue() {
    on_both(32, |t| {
        let r = t.region();
        map(t, 0, 8, RW, ANON);
        check!(t, t.mprotect(r.page(1), 2 * PAGE, PROT_NONE), Ok(()));
        // [0,1) rw, [1,3) ---, [3,8) rw. Make [2,8) rw: the piece [2,3)
        // merges into the next VMA, and the call goes on over it.
        check!(t, t.mprotect(r.page(2), 6 * PAGE, RW), Ok(()));
        assert_layout(t, &[(0, 1, "rw-p"), (1, 2, "---p"), (2, 8, "rw-p")]);
        // The same over three differently protected VMAs.
        check!(t, t.mprotect(r.page(4), PAGE, PROT_READ), Ok(()));
        check!(t, t.mprotect(r.page(0), 8 * PAGE, PROT_READ), Ok(()));
        assert_layout(t, &[(0, 8, "r--p")]);
    });
}

#[test]
fn mprotect_over_a_hole_changes_the_part_before_it() {
    on_both(32, |t| {
        let r = t.region();
        map(t, 0, 4, RW, ANON);
        map(t, 6, 2, RW, ANON);
        check!(t, t.mprotect(r.page(0), 8 * PAGE, PROT_READ), Err(ENOMEM));
        assert_layout(t, &[(0, 4, "r--p"), (6, 8, "rw-p")]);
        // Starting inside the first VMA.
        check!(t, t.mprotect(r.page(2), 5 * PAGE, PROT_NONE), Err(ENOMEM));
        assert_layout(t, &[(0, 2, "r--p"), (2, 4, "---p"), (6, 8, "rw-p")]);
        // Ending in a hole after the last VMA: applied, then ENOMEM.
        check!(t, t.mprotect(r.page(6), 4 * PAGE, PROT_READ), Err(ENOMEM));
        assert_layout(t, &[(0, 2, "r--p"), (2, 4, "---p"), (6, 8, "r--p")]);
        // Starting in a hole: nothing changes.
        check!(t, t.mprotect(r.page(4), 4 * PAGE, RW), Err(ENOMEM));
        check!(t, t.mprotect(r.page(20), PAGE, RW), Err(ENOMEM));
        assert_layout(t, &[(0, 2, "r--p"), (2, 4, "---p"), (6, 8, "r--p")]);
    });
}

#[test]
fn mprotect_einval_cases() {
    on_both(16, |t| {
        let r = t.region();
        map(t, 0, 4, RW, ANON);
        let before = t.layout();
        check!(t, t.mprotect(r.page(0) + 8, PAGE, PROT_READ), Err(EINVAL));
        check!(
            t,
            t.mprotect(r.page(0), PAGE, PROT_READ | 0x0100_0000 | 0x0200_0000),
            Err(EINVAL)
        );
        // PROT_GROWSDOWN on a VMA that does not grow down.
        check!(
            t,
            t.mprotect(r.page(1), PAGE, PROT_READ | 0x0100_0000),
            Err(EINVAL)
        );
        // A length that wraps: ENOMEM.
        check!(
            t,
            t.mprotect(r.page(0), u64::MAX - 100, PROT_READ),
            Err(ENOMEM)
        );
        assert_eq!(t.layout(), before);
    });
}

#[test]
fn mprotect_growsdown_extends_to_the_start_of_the_stack() {
    on_both(32, |t| {
        let r = t.region();
        map(t, 10, 10, RW, ANON | MAP_GROWSDOWN);
        check!(
            t,
            t.mprotect(r.page(15), PAGE, PROT_READ | 0x0100_0000),
            Ok(())
        );
        assert_layout(t, &[(10, 16, "r--p"), (16, 20, "rw-p")]);
    });
}

#[test]
fn store_to_read_only_page_fails_and_writes_nothing() {
    on_both(16, |t| {
        let a = map(t, 0, 2, RW, ANON);
        let data = fill(t, a, 2, 5);
        check!(t, t.mprotect(a, PAGE, PROT_READ), Ok(()));
        check!(t, t.write(a + 10, b"nope"), Err(EFAULT));
        check!(t, t.write(a, &zeros(PAGE)), Err(EFAULT));
        check!(t, load(t, a, 2 * PAGE), Ok(data.clone()));
        // The writable page next to it still takes stores.
        check!(t, t.write(a + PAGE, b"ok"), Ok(()));
        // PROT_NONE: neither loads nor stores.
        check!(t, t.mprotect(a, PAGE, PROT_NONE), Ok(()));
        check!(t, load(t, a, 1), Err(EFAULT));
        check!(t, t.write(a, b"x"), Err(EFAULT));
        check!(t, t.mprotect(a, PAGE, PROT_READ), Ok(()));
        check!(t, load(t, a, PAGE), Ok(data[..PAGE as usize].to_vec()));
    });
}
