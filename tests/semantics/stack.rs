//! Stack growth: the grown stack's anon_vma, the guard gap, growth past
//! a failed access, and mremap in place next to a stack.

use super::*;

#[test]
fn stack_growth_gives_the_stack_an_anon_vma() {
    // A load just below a growsdown VMA grows it (the guard gap to the
    // mapping below is respected). The kernel gives the grown stack an
    // anon_vma, so a piece moved away keeps its page offset and does not
    // merge; an untouched stack piece does.
    on_both(600, |t| {
        let r = t.region();
        map(t, 48, 2, RW, ANON | MAP_GROWSDOWN);
        map(t, 400, 2, RW, ANON | MAP_GROWSDOWN);
        check!(t, load(t, r.page(399), 8), Ok(zeros(8)));
        assert_layout(t, &[(48, 50, "rw-p"), (399, 402, "rw-p")]);
        check!(
            t,
            t.mremap(
                r.page(401),
                PAGE,
                PAGE,
                MREMAP_MAYMOVE | MREMAP_FIXED,
                r.page(50)
            ),
            Ok(r.page(50))
        );
        assert_layout(t, &[(48, 50, "rw-p"), (50, 51, "rw-p"), (399, 401, "rw-p")]);
        // Without growth (and no store), the moved piece merges.
        map(t, 500, 2, RW, ANON | MAP_GROWSDOWN);
        check!(
            t,
            t.mremap(
                r.page(501),
                PAGE,
                PAGE,
                MREMAP_MAYMOVE | MREMAP_FIXED,
                r.page(47)
            ),
            Ok(r.page(47))
        );
        assert_layout(
            t,
            &[
                (47, 50, "rw-p"),
                (50, 51, "rw-p"),
                (399, 401, "rw-p"),
                (500, 501, "rw-p"),
            ],
        );
    });
}

#[test]
fn stack_growth_respects_the_guard_gap() {
    on_both(600, |t| {
        let r = t.region();
        map(t, 0, 1, RW, ANON);
        map(t, 100, 2, RW, ANON | MAP_GROWSDOWN);
        // 99 pages above an accessible mapping: within the 256-page guard
        // gap, so no growth.
        check!(t, load(t, r.page(99), 1), Err(EFAULT));
        check!(t, t.write(r.page(99), b"x"), Err(EFAULT));
        assert_layout(t, &[(0, 1, "rw-p"), (100, 102, "rw-p")]);
        // The mapping below is made inaccessible: no longer counts.
        check!(t, t.mprotect(r.page(0), PAGE, PROT_NONE), Ok(()));
        check!(t, t.write(r.page(99), b"x"), Ok(()));
        assert_layout(t, &[(0, 1, "---p"), (99, 102, "rw-p")]);
    });
}

#[test]
fn an_access_that_fails_past_a_hole_still_grows_the_stack_below_it() {
    // Loads and stores go page by page: one that crosses a hole just below
    // a growsdown VMA grows that VMA, even when the VMA's protection then
    // fails the access. (Found by kernel_diff, seed 1532.) The mapping
    // below is itself growsdown, so the guard gap does not apply.
    on_both(16, |t| {
        let r = t.region();
        map(t, 4, 1, RW, ANON | MAP_GROWSDOWN);
        map(t, 6, 1, PROT_NONE, ANON | MAP_GROWSDOWN);
        check!(t, load(t, r.page(4), 3 * PAGE), Err(EFAULT));
        assert_layout(t, &[(4, 5, "rw-p"), (5, 7, "---p")]);
        map(t, 9, 1, RW, ANON | MAP_GROWSDOWN);
        map(t, 11, 1, PROT_READ, ANON | MAP_GROWSDOWN);
        check!(
            t,
            t.write(r.page(9), &[7u8; 3 * PAGE as usize]),
            Err(EFAULT)
        );
        assert_layout(
            t,
            &[
                (4, 5, "rw-p"),
                (5, 7, "---p"),
                (9, 10, "rw-p"),
                (10, 12, "r--p"),
            ],
        );
        // The store reached the page before the hole, as a memcpy would.
        check!(t, load(t, r.page(9), 2), Ok(vec![7u8; 2]));
    });
}

#[test]
fn mremap_grow_in_place_ignores_the_stack_guard_gap() {
    // vma_expandable only checks for an overlapping mapping: the guard gap
    // below a growsdown VMA does not stop mremap.
    on_both(600, |t| {
        let a = map(t, 0, 2, RW, ANON);
        map(t, 10, 2, RW, ANON | MAP_GROWSDOWN);
        check!(t, t.mremap(a, 2 * PAGE, 10 * PAGE, 0, 0), Ok(a));
        assert_layout(t, &[(0, 10, "rw-p"), (10, 12, "rw-p")]);
    });
}
