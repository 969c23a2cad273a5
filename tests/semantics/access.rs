//! Loads and stores: across page and VMA boundaries, into forbidden
//! pages, and what `fault()` reports.

use super::*;

#[test]
fn loads_and_stores_cross_page_and_vma_boundaries() {
    on_both(32, |t| {
        let r = t.region();
        let a = map(t, 0, 2, RW, ANON);
        map(t, 2, 2, RW | PROT_EXEC, ANON);
        assert_layout(t, &[(0, 2, "rw-p"), (2, 4, "rwxp")]);
        let data = pattern(1, a + PAGE - 100, 3 * PAGE as usize);
        check!(t, t.write(a + PAGE - 100, &data), Ok(()));
        check!(t, load(t, a + PAGE - 100, 3 * PAGE), Ok(data.clone()));
        check!(t, load(t, a, PAGE - 100), Ok(zeros(PAGE - 100)));
        // Into a hole: EFAULT.
        check!(t, load(t, r.page(3), 2 * PAGE), Err(EFAULT));
        // A write-only page is readable on x86 (PROT_WRITE implies read).
        check!(t, t.mprotect(a, PAGE, PROT_WRITE), Ok(()));
        check!(t, load(t, a + PAGE - 100, 100), Ok(data[..100].to_vec()));
    });
}

#[test]
fn store_spanning_into_a_forbidden_page() {
    // The store fails with EFAULT on both sides; the forbidden page is
    // untouched. The page before it: the kernel has written it (a real
    // memcpy stops at the faulting page); aspace's contract is to write
    // nothing when a mapped page of the range forbids the store. Each side
    // is held to its own rule.
    on_both(32, |t| {
        let a = map(t, 0, 2, RW, ANON);
        let old = fill(t, a, 2, 8);
        check!(t, t.mprotect(a + PAGE, PAGE, PROT_READ), Ok(()));
        let data = pattern(9, a + PAGE - 16, 32);
        check!(t, t.write(a + PAGE - 16, &data), Err(EFAULT));
        check!(
            t,
            load(t, a + PAGE, PAGE),
            Ok(old[PAGE as usize..].to_vec())
        );
        let first = load(t, a, PAGE).unwrap();
        let mut written = old[..PAGE as usize].to_vec();
        written[PAGE as usize - 16..].copy_from_slice(&data[..16]);
        if t.aspace().is_some() {
            assert_eq!(
                first,
                old[..PAGE as usize].to_vec(),
                "aspace writes nothing"
            );
        } else {
            assert_eq!(
                first, written,
                "the kernel wrote the bytes before the faulting page"
            );
        }
    });
}

/// aspace only: the fault entry point tells a missing mapping from a
/// forbidden access.
#[test]
fn fault_distinguishes_no_mapping_from_access_denied() {
    let mut t = AspaceTarget::new(Region::new(aspace_target_start(), 32));
    let rg = t.region();
    let r = map(&mut t, 0, 1, RW, ANON);
    let ro = map(&mut t, 1, 1, PROT_READ, ANON);
    let none = map(&mut t, 2, 1, PROT_NONE, ANON);
    let x = map(&mut t, 3, 1, PROT_EXEC, ANON);
    let m = &t.mm;
    let before = m.stats();
    assert_eq!(m.fault(r, Access::Write), Ok(()));
    assert_eq!(m.fault(r, Access::Read), Ok(()));
    assert_eq!(m.fault(r, Access::Exec), Err(FaultError::AccessDenied));
    assert_eq!(m.fault(ro, Access::Read), Ok(()));
    assert_eq!(m.fault(ro, Access::Write), Err(FaultError::AccessDenied));
    assert_eq!(m.fault(none, Access::Read), Err(FaultError::AccessDenied));
    assert_eq!(m.fault(none, Access::Write), Err(FaultError::AccessDenied));
    assert_eq!(m.fault(x, Access::Exec), Ok(()));
    assert_eq!(
        m.fault(rg.page(10), Access::Read),
        Err(FaultError::NoMapping)
    );
    assert_eq!(
        m.fault(TASK_SIZE + PAGE, Access::Read),
        Err(FaultError::NoMapping)
    );
    assert_eq!(m.fault(0, Access::Write), Err(FaultError::NoMapping));
    let s = m.stats();
    assert_eq!(s.segv_maperr - before.segv_maperr, 3);
    assert_eq!(s.segv_accerr - before.segv_accerr, 4);
}
