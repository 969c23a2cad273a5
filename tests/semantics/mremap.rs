//! mremap: shrinking, growing in place, moves (MAYMOVE, FIXED,
//! DONTUNMAP, several VMAs), duplicating a shared mapping, the errors, and
//! when a moved VMA merges.

use super::*;

#[test]
fn mremap_shrinks_in_place() {
    on_both(32, |t| {
        let r = t.region();
        let a = map(t, 0, 8, RW, ANON);
        let data = fill(t, a, 8, 1);
        check!(t, t.mremap(a, 8 * PAGE, 3 * PAGE, 0, 0), Ok(a));
        assert_layout(t, &[(0, 3, "rw-p")]);
        check!(
            t,
            load(t, a, 3 * PAGE),
            Ok(data[..3 * PAGE as usize].to_vec())
        );
        check!(t, load(t, r.page(3), 1), Err(EFAULT));
        // Shrinking a part in the middle of a VMA unmaps the tail part only.
        check!(t, t.mremap(a, PAGE, PAGE / 2, 0, 0), Ok(a));
        check!(t, t.mremap(a + PAGE, PAGE, 0x10, 0, 0), Ok(a + PAGE));
        assert_layout(t, &[(0, 3, "rw-p")]);
        check!(t, t.mremap(a, 2 * PAGE, PAGE, 0, 0), Ok(a));
        assert_layout(t, &[(0, 1, "rw-p"), (2, 3, "rw-p")]);
    });
}

#[test]
fn mremap_grows_in_place_when_the_next_range_is_free() {
    on_both(32, |t| {
        let r = t.region();
        let a = map(t, 0, 4, RW, ANON);
        let data = fill(t, a, 4, 2);
        check!(t, t.mremap(a, 4 * PAGE, 8 * PAGE, 0, 0), Ok(a));
        assert_layout(t, &[(0, 8, "rw-p")]);
        check!(t, load(t, a, 4 * PAGE), Ok(data));
        check!(t, load(t, r.page(4), 4 * PAGE), Ok(zeros(4 * PAGE)));
        check!(t, t.write(r.page(7), b"tail"), Ok(()));
        // Up to the next mapping exactly.
        map(t, 10, 2, PROT_READ, ANON);
        check!(t, t.mremap(a, 8 * PAGE, 10 * PAGE, 0, 0), Ok(a));
        assert_layout(t, &[(0, 10, "rw-p"), (10, 12, "r--p")]);
    });
}

#[test]
fn mremap_grow_blocked_without_maymove_is_enomem() {
    on_both(32, |t| {
        let a = map(t, 0, 4, RW, ANON);
        map(t, 5, 1, PROT_READ, ANON);
        let before = t.layout();
        check!(t, t.mremap(a, 4 * PAGE, 6 * PAGE, 0, 0), Err(ENOMEM));
        // Not at the end of its VMA: cannot grow in place either.
        check!(t, t.mremap(a, 2 * PAGE, 3 * PAGE, 0, 0), Err(ENOMEM));
        assert_eq!(t.layout(), before);
    });
}

#[test]
fn mremap_maymove_moves_the_data_and_unmaps_the_old_range() {
    on_both(32, |t| {
        let a = map(t, 0, 4, RW, ANON);
        map(t, 4, 1, PROT_READ, ANON);
        let data = fill(t, a, 4, 9);
        let n = t.mremap(a, 4 * PAGE, 8 * PAGE, MREMAP_MAYMOVE, 0);
        let name = t.name();
        let n = n.unwrap_or_else(|e| panic!("[{name}] mremap MAYMOVE: errno {e}"));
        assert_ne!(n, a);
        check!(t, load(t, n, 4 * PAGE), Ok(data));
        check!(t, load(t, n + 4 * PAGE, 4 * PAGE), Ok(zeros(4 * PAGE)));
        assert_layout(t, &[(4, 5, "r--p")]);
        check!(t, load(t, a, 1), Err(EFAULT));
        if t.region().contains(n) {
            check!(t, t.munmap(n, 8 * PAGE), Ok(()));
        } else {
            check!(t, t.unmap_outside(n, 8 * PAGE), Ok(()));
        }
    });
}

#[test]
fn mremap_maymove_fixed_unmaps_what_is_at_the_target() {
    on_both(32, |t| {
        let r = t.region();
        let a = map(t, 0, 4, RW, ANON);
        let data = fill(t, a, 4, 4);
        let b = map(t, 10, 6, PROT_READ, ANON);
        let old = load(t, b, 6 * PAGE).unwrap();
        check!(
            t,
            t.mremap(
                a,
                4 * PAGE,
                4 * PAGE,
                MREMAP_MAYMOVE | MREMAP_FIXED,
                r.page(11)
            ),
            Ok(r.page(11))
        );
        assert_layout(t, &[(10, 11, "r--p"), (11, 15, "rw-p"), (15, 16, "r--p")]);
        check!(t, load(t, r.page(11), 4 * PAGE), Ok(data.clone()));
        check!(t, load(t, b, PAGE), Ok(old[..PAGE as usize].to_vec()));
        check!(t, load(t, a, 1), Err(EFAULT));
        // Moving and growing to a free place.
        check!(
            t,
            t.mremap(
                r.page(11),
                4 * PAGE,
                6 * PAGE,
                MREMAP_MAYMOVE | MREMAP_FIXED,
                r.page(20)
            ),
            Ok(r.page(20))
        );
        assert_layout(t, &[(10, 11, "r--p"), (15, 16, "r--p"), (20, 26, "rw-p")]);
        check!(t, load(t, r.page(20), 4 * PAGE), Ok(data));
        check!(t, load(t, r.page(24), 2 * PAGE), Ok(zeros(2 * PAGE)));
        // Moving and shrinking.
        check!(
            t,
            t.mremap(
                r.page(20),
                6 * PAGE,
                2 * PAGE,
                MREMAP_MAYMOVE | MREMAP_FIXED,
                r.page(1)
            ),
            Ok(r.page(1))
        );
        assert_layout(t, &[(1, 3, "rw-p"), (10, 11, "r--p"), (15, 16, "r--p")]);
    });
}

#[test]
fn mremap_dontunmap_keeps_the_old_range_mapped_and_empty() {
    on_both(32, |t| {
        let r = t.region();
        let a = map(t, 0, 4, RW, ANON);
        let data = fill(t, a, 4, 6);
        let flags = MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP;
        check!(
            t,
            t.mremap(a, 4 * PAGE, 4 * PAGE, flags, r.page(10)),
            Ok(r.page(10))
        );
        assert_layout(t, &[(0, 4, "rw-p"), (10, 14, "rw-p")]);
        check!(t, load(t, r.page(10), 4 * PAGE), Ok(data));
        check!(t, load(t, a, 4 * PAGE), Ok(zeros(4 * PAGE)));
        // The old range is usable again.
        check!(t, t.write(a, b"again"), Ok(()));
        check!(t, load(t, a, 5), Ok(b"again".to_vec()));
        // DONTUNMAP needs equal lengths and MAYMOVE.
        check!(
            t,
            t.mremap(a, 4 * PAGE, 5 * PAGE, flags, r.page(20)),
            Err(EINVAL)
        );
        check!(
            t,
            t.mremap(a, 4 * PAGE, 4 * PAGE, MREMAP_DONTUNMAP, r.page(20)),
            Err(EINVAL)
        );
    });
}

#[test]
fn mremap_dontunmap_keeps_the_old_vma_flags() {
    // The old VMA keeps VM_ACCOUNT, so it still merges with accounted
    // neighbours. Linux always did so except 6.16 and 6.17, where the
    // move_vma refactor cleared it (fixed in 6.18 by "mm: correctly account
    // old mapping after MREMAP_DONTUNMAP remap"); the kernel side is
    // skipped on those two.
    let v = kernel::kernel_version();
    let regressed = ((6, 16)..(6, 18)).contains(&v);
    on_both(32, |t| {
        if regressed && t.aspace().is_none() {
            return;
        }
        let r = t.region();
        let a = map(t, 0, 4, RW, ANON);
        fill(t, a, 4, 1);
        let flags = MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP;
        check!(
            t,
            t.mremap(a + PAGE, 2 * PAGE, 2 * PAGE, flags, r.page(10)),
            Ok(r.page(10))
        );
        assert_layout(t, &[(0, 4, "rw-p"), (10, 12, "rw-p")]);
        let f = t.vm_flags().unwrap();
        let first = f.iter().find(|(s, _, _)| *s == a).unwrap();
        assert!(first.2.contains(&"ac".to_string()), "[{}] {f:?}", t.name());
        // A new accounted mapping right after it merges.
        map(t, 4, 2, RW, ANON);
        assert_layout(t, &[(0, 6, "rw-p"), (10, 12, "rw-p")]);
    });
}

#[test]
fn mremap_error_cases() {
    on_both(32, |t| {
        let r = t.region();
        let a = map(t, 0, 2, RW, ANON);
        map(t, 2, 2, PROT_READ, ANON);
        let s = map(t, 10, 2, RW, SHARED_ANON);
        let before = t.layout();
        let mm = MREMAP_MAYMOVE;
        let fx = MREMAP_FIXED;
        // Growing a range that spans two VMAs: EFAULT.
        check!(t, t.mremap(a, 4 * PAGE, 6 * PAGE, mm, 0), Err(EFAULT));
        check!(t, t.mremap(a, 4 * PAGE, 6 * PAGE, 0, 0), Err(EFAULT));
        check!(
            t,
            t.mremap(a, 3 * PAGE, 5 * PAGE, mm | fx, r.page(20)),
            Err(EFAULT)
        );
        // FIXED without MAYMOVE.
        check!(
            t,
            t.mremap(a, 2 * PAGE, 2 * PAGE, fx, r.page(20)),
            Err(EINVAL)
        );
        // Overlapping old and new ranges.
        check!(
            t,
            t.mremap(a, 2 * PAGE, 2 * PAGE, mm | fx, r.page(1)),
            Err(EINVAL)
        );
        check!(
            t,
            t.mremap(r.page(1), PAGE, 2 * PAGE, mm | fx, r.page(0)),
            Err(EINVAL)
        );
        // Unaligned old or new address.
        check!(t, t.mremap(a + 1, PAGE, PAGE, mm, 0), Err(EINVAL));
        check!(
            t,
            t.mremap(a, PAGE, PAGE, mm | fx, r.page(20) + 1),
            Err(EINVAL)
        );
        // Unknown flag, zero or wrapping new length.
        check!(t, t.mremap(a, PAGE, PAGE, mm | 8, 0), Err(EINVAL));
        check!(t, t.mremap(a, PAGE, 0, mm, 0), Err(EINVAL));
        check!(t, t.mremap(a, PAGE, u64::MAX - 10, mm, 0), Err(EINVAL));
        // Old length 0 duplicates only shared mappings.
        check!(t, t.mremap(a, 0, PAGE, mm, 0), Err(EINVAL));
        // A zero-length old range strictly inside the new one overlaps it
        // (the raw ends are compared), even over a hole: EINVAL before the
        // lookup's EFAULT (kernel_diff seeds 3207, 4406).
        check!(
            t,
            t.mremap(r.page(6), 0, 4 * PAGE, mm | fx, r.page(5)),
            Err(EINVAL)
        );
        // At the new range's start it does not overlap: the lookup fails.
        check!(
            t,
            t.mremap(r.page(5), 0, 4 * PAGE, mm | fx, r.page(5)),
            Err(EFAULT)
        );
        // Not mapped.
        check!(t, t.mremap(r.page(5), PAGE, 2 * PAGE, mm, 0), Err(EFAULT));
        check!(
            t,
            t.mremap(r.page(5), PAGE, PAGE, mm | fx, r.page(20)),
            Err(EFAULT)
        );
        check!(t, t.mremap(TASK_SIZE, PAGE, 2 * PAGE, mm, 0), Err(EFAULT));
        // Growing without MAYMOVE into the next VMA.
        check!(t, t.mremap(a, 2 * PAGE, 3 * PAGE, 0, 0), Err(ENOMEM));
        check!(t, t.mremap(s, 2 * PAGE, 3 * PAGE, 0, 0), Ok(s));
        check!(t, t.mremap(s, 3 * PAGE, 2 * PAGE, 0, 0), Ok(s));
        assert_eq!(
            t.layout(),
            before,
            "[{}] failed calls changed the layout",
            t.name()
        );
    });
}

#[test]
fn mremap_shrink_or_noop_with_an_old_range_past_its_vma() {
    // Shrinking unmaps [addr + new_len, addr + old_len) whatever it covers,
    // before the old range is checked against its VMA; a same-size call
    // without flags returns at once.
    on_both(32, |t| {
        let r = t.region();
        let a = map(t, 0, 2, RW, ANON);
        map(t, 4, 4, PROT_READ, ANON);
        check!(t, t.mremap(a, 2 * PAGE, 2 * PAGE, 0, 0), Ok(a));
        check!(t, t.mremap(a, 6 * PAGE, 6 * PAGE, 0, 0), Ok(a));
        check!(t, t.mremap(a, 6 * PAGE, PAGE, 0, 0), Ok(a));
        assert_layout(t, &[(0, 1, "rw-p"), (6, 8, "r--p")]);
        // With MAYMOVE|FIXED: the shrink comes first, then the move.
        check!(
            t,
            t.mremap(
                r.page(6),
                4 * PAGE,
                PAGE,
                MREMAP_MAYMOVE | MREMAP_FIXED,
                r.page(20)
            ),
            Ok(r.page(20))
        );
        assert_layout(t, &[(0, 1, "rw-p"), (20, 21, "r--p")]);
    });
}

/// Since Linux 6.17 ("mm/mremap: permit mremap() move of multiple VMAs"),
/// a MREMAP_FIXED move without resize may span several VMAs and the gaps
/// between them; each VMA moves to the same offset. Before, EFAULT. aspace
/// models the current kernel; the kernel side is held to what its version
/// does.
#[test]
fn mremap_fixed_same_size_moves_several_vmas() {
    let modern = kernel::kernel_version() >= (6, 17);
    on_both(64, |t| {
        let r = t.region();
        let a = map(t, 0, 2, RW, ANON);
        fill(t, a, 2, 1);
        map(t, 2, 2, PROT_READ, ANON);
        let c = map(t, 5, 1, RW, ANON);
        let cd = fill(t, c, 1, 2);
        let got = t.mremap(
            a,
            6 * PAGE,
            6 * PAGE,
            MREMAP_MAYMOVE | MREMAP_FIXED,
            r.page(20),
        );
        if t.aspace().is_none() && !modern {
            check!(t, got, Err(EFAULT));
            return;
        }
        check!(t, got, Ok(r.page(20)));
        assert_layout(t, &[(20, 22, "rw-p"), (22, 24, "r--p"), (25, 26, "rw-p")]);
        check!(t, load(t, r.page(25), PAGE), Ok(cd));
        // With a resize it is still EFAULT.
        check!(
            t,
            t.mremap(
                r.page(20),
                6 * PAGE,
                7 * PAGE,
                MREMAP_MAYMOVE | MREMAP_FIXED,
                r.page(40)
            ),
            Err(EFAULT)
        );
    });
}

#[test]
fn mremap_dontunmap_overlap_is_einval_even_without_fixed() {
    on_both(32, |t| {
        let r = t.region();
        let a = map(t, 0, 4, RW, ANON);
        let f = MREMAP_MAYMOVE | MREMAP_DONTUNMAP;
        check!(
            t,
            t.mremap(a, 4 * PAGE, 4 * PAGE, f, r.page(2)),
            Err(EINVAL)
        );
        check!(
            t,
            t.mremap(r.page(20), PAGE, PAGE, f, r.page(20)),
            Err(EINVAL)
        );
        assert_layout(t, &[(0, 4, "rw-p")]);
    });
}

#[test]
fn mremap_old_len_zero_duplicates_a_shared_mapping() {
    on_both(32, |t| {
        let r = t.region();
        let s = map(t, 0, 4, RW, SHARED_ANON);
        check!(t, t.write(s + PAGE, b"one"), Ok(()));
        let d = r.page(10);
        check!(
            t,
            t.mremap(s + PAGE, 0, 2 * PAGE, MREMAP_MAYMOVE | MREMAP_FIXED, d),
            Ok(d)
        );
        assert_layout(t, &[(0, 4, "rw-s"), (10, 12, "rw-s")]);
        let l = t.layout();
        let (o, c) = (
            l.iter().find(|v| v.start == s).unwrap(),
            l.iter().find(|v| v.start == d).unwrap(),
        );
        assert_eq!(o.obj, c.obj, "[{}] same object", t.name());
        assert_eq!(c.offset, PAGE, "[{}] offset of the copy", t.name());
        check!(t, load(t, d, 3), Ok(b"one".to_vec()));
        check!(t, t.write(d + PAGE, b"two"), Ok(()));
        check!(t, load(t, s + 2 * PAGE, 3), Ok(b"two".to_vec()));
    });
}

#[test]
fn shared_anonymous_grown_by_mremap_has_no_backing_past_its_object() {
    on_both(32, |t| {
        let r = t.region();
        let s = map(t, 0, 2, RW, SHARED_ANON);
        check!(t, t.write(s, b"kept"), Ok(()));
        check!(t, t.mremap(s, 2 * PAGE, 4 * PAGE, 0, 0), Ok(s));
        assert_layout(t, &[(0, 4, "rw-s")]);
        check!(t, load(t, s, 4), Ok(b"kept".to_vec()));
        check!(t, load(t, r.page(2), 1), Err(EFAULT));
        check!(t, t.write(r.page(3), b"x"), Err(EFAULT));
        check!(t, t.write(r.page(1), b"in"), Ok(()));
        if let Some(m) = t.aspace() {
            assert_eq!(m.fault(r.page(2), Access::Read), Err(FaultError::Bus));
            assert_eq!(m.fault(r.page(3), Access::Write), Err(FaultError::Bus));
            assert_eq!(m.fault(r.page(1), Access::Write), Ok(()));
        }
    });
}

#[test]
fn moved_vma_merges_only_if_never_written() {
    on_both(64, |t| {
        let r = t.region();
        // Untouched: mremap resets its page offset to the new address, so
        // it merges with its new neighbour.
        map(t, 10, 2, RW, ANON);
        let a = map(t, 0, 2, RW, ANON);
        check!(
            t,
            t.mremap(
                a,
                2 * PAGE,
                2 * PAGE,
                MREMAP_MAYMOVE | MREMAP_FIXED,
                r.page(12)
            ),
            Ok(r.page(12))
        );
        assert_layout(t, &[(10, 14, "rw-p")]);
        // Only read (zero page, no anon_vma): the same.
        map(t, 20, 2, RW, ANON);
        let b = map(t, 0, 2, RW, ANON);
        check!(t, load(t, b, 2 * PAGE), Ok(zeros(2 * PAGE)));
        check!(
            t,
            t.mremap(
                b,
                2 * PAGE,
                2 * PAGE,
                MREMAP_MAYMOVE | MREMAP_FIXED,
                r.page(22)
            ),
            Ok(r.page(22))
        );
        assert_layout(t, &[(10, 14, "rw-p"), (20, 24, "rw-p")]);
        // Written (anon_vma): it keeps its page offset and stays apart.
        map(t, 30, 2, RW, ANON);
        let c = map(t, 0, 2, RW, ANON);
        let data = fill(t, c, 2, 3);
        check!(
            t,
            t.mremap(
                c,
                2 * PAGE,
                2 * PAGE,
                MREMAP_MAYMOVE | MREMAP_FIXED,
                r.page(32)
            ),
            Ok(r.page(32))
        );
        assert_layout(
            t,
            &[
                (10, 14, "rw-p"),
                (20, 24, "rw-p"),
                (30, 32, "rw-p"),
                (32, 34, "rw-p"),
            ],
        );
        check!(t, load(t, r.page(32), 2 * PAGE), Ok(data.clone()));
        // Moved back next to where its offset fits, it merges again.
        check!(
            t,
            t.mremap(
                r.page(32),
                2 * PAGE,
                2 * PAGE,
                MREMAP_MAYMOVE | MREMAP_FIXED,
                r.page(0)
            ),
            Ok(r.page(0))
        );
        map(t, 2, 1, RW, ANON);
        assert_layout(
            t,
            &[
                (0, 3, "rw-p"),
                (10, 14, "rw-p"),
                (20, 24, "rw-p"),
                (30, 32, "rw-p"),
            ],
        );
        check!(t, load(t, r.page(0), 2 * PAGE), Ok(data));
    });
}
