//! madvise: MADV_DONTNEED on private and shared mappings, and over holes.

use super::*;

#[test]
fn madvise_dontneed_zeroes_private_and_keeps_shared() {
    on_both(32, |t| {
        let a = map(t, 0, 4, RW, ANON);
        let s = map(t, 10, 4, RW, SHARED_ANON);
        fill(t, a, 4, 1);
        let sd = fill(t, s, 4, 2);
        let frames = t.aspace().map(|m| m.frames_used());
        check!(t, t.madvise(a + PAGE, 2 * PAGE, MADV_DONTNEED), Ok(()));
        check!(t, t.madvise(s, 4 * PAGE, MADV_DONTNEED), Ok(()));
        check!(t, load(t, a + PAGE, 2 * PAGE), Ok(zeros(2 * PAGE)));
        check!(t, load(t, s, 4 * PAGE), Ok(sd));
        if let (Some(m), Some(f)) = (t.aspace(), frames) {
            assert_eq!(
                f - m.frames_used(),
                2,
                "aspace: the two private frames are freed"
            );
        }
        assert_layout(t, &[(0, 4, "rw-p"), (10, 14, "rw-s")]);
    });
}

#[test]
fn madvise_over_a_hole_zaps_the_mapped_parts_then_enomem() {
    on_both(32, |t| {
        let r = t.region();
        let a = map(t, 0, 2, RW, ANON);
        let b = map(t, 4, 2, RW, ANON);
        fill(t, a, 2, 1);
        fill(t, b, 2, 2);
        check!(t, t.madvise(a, 6 * PAGE, MADV_DONTNEED), Err(ENOMEM));
        check!(t, load(t, a, 2 * PAGE), Ok(zeros(2 * PAGE)));
        check!(t, load(t, b, 2 * PAGE), Ok(zeros(2 * PAGE)));
        check!(t, t.madvise(r.page(10), PAGE, MADV_DONTNEED), Err(ENOMEM));
        check!(t, t.madvise(r.page(10), PAGE, MADV_NORMAL), Err(ENOMEM));
        check!(t, t.madvise(a + 1, PAGE, MADV_DONTNEED), Err(EINVAL));
        check!(t, t.madvise(a, 0, MADV_DONTNEED), Ok(()));
        check!(t, t.madvise(a, u64::MAX - 5, MADV_DONTNEED), Err(EINVAL));
        check!(t, t.madvise(a, 2 * PAGE, MADV_NORMAL), Ok(()));
        assert_layout(t, &[(0, 2, "rw-p"), (4, 6, "rw-p")]);
    });
}
