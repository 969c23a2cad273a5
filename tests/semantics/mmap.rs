//! mmap: anonymous private and shared mappings, hints, MAP_FIXED and
//! MAP_FIXED_NOREPLACE, MAP_POPULATE, unknown bits, the errors, and merging
//! with compatible neighbours.

use super::*;

#[test]
fn mmap_anonymous_private_and_shared() {
    on_both(32, |t| {
        let a = map(t, 0, 4, RW, ANON);
        let s = map(t, 8, 4, RW, SHARED_ANON);
        assert_layout(t, &[(0, 4, "rw-p"), (8, 12, "rw-s")]);
        // New anonymous memory reads zero, private and shared.
        check!(t, load(t, a, 4 * PAGE), Ok(zeros(4 * PAGE)));
        check!(t, load(t, s, 4 * PAGE), Ok(zeros(4 * PAGE)));
        check!(t, t.write(a + 100, b"private"), Ok(()));
        check!(t, t.write(s + PAGE + 5, b"shared"), Ok(()));
        check!(t, load(t, a + 100, 7), Ok(b"private".to_vec()));
        check!(t, load(t, s + PAGE + 5, 6), Ok(b"shared".to_vec()));
        // The shared mapping is an object at offset 0; private anonymous
        // memory shows offset 0 and no object.
        let l = t.layout();
        let shared: Vec<&Vma> = l.iter().filter(|v| v.start == s).collect();
        assert_eq!(shared.len(), 1, "[{}]", t.name());
        assert_eq!(shared[0].offset, 0);
        assert!(shared[0].obj.is_some());
        assert!(l
            .iter()
            .any(|v| v.start == a && v.obj.is_none() && v.offset == 0));
    });
}

#[test]
fn mmap_hint_is_used_when_free() {
    on_both(64, |t| {
        let r = t.region();
        let h = r.page(10);
        check!(t, t.mmap(h, 3 * PAGE, RW, ANON), Ok(h));
        // x86-64 rounds an unaligned hint down to its page.
        let h2 = r.page(20);
        check!(t, t.mmap(h2 + 123, PAGE, PROT_READ, ANON), Ok(h2));
        assert_layout(t, &[(10, 13, "rw-p"), (20, 21, "r--p")]);
        // A hint that overlaps a mapping is not used: the mapping goes
        // elsewhere (outside this region on both sides) and nothing here
        // changes.
        let o = apply(
            t,
            Op::Mmap {
                addr: r.page(11),
                len: PAGE,
                prot: RW,
                flags: ANON,
            },
        );
        assert!(matches!(o, Outcome::Outside(..)), "[{}] {o:?}", t.name());
        assert_layout(t, &[(10, 13, "rw-p"), (20, 21, "r--p")]);
    });
}

#[test]
fn mmap_fixed_replaces_what_it_overlaps_data_included() {
    on_both(32, |t| {
        let a = map(t, 0, 4, RW, ANON);
        let data = fill(t, a, 4, 7);
        map(t, 1, 2, RW, ANON);
        // The old middle pages are gone (zero), the new mapping merged with
        // what is left around it: one VMA.
        assert_layout(t, &[(0, 4, "rw-p")]);
        check!(t, load(t, a, PAGE), Ok(data[..PAGE as usize].to_vec()));
        check!(t, load(t, a + PAGE, 2 * PAGE), Ok(zeros(2 * PAGE)));
        check!(
            t,
            load(t, a + 3 * PAGE, PAGE),
            Ok(data[3 * PAGE as usize..].to_vec())
        );
        // Different protection: replaced, and kept apart.
        map(t, 2, 1, PROT_READ, ANON);
        assert_layout(t, &[(0, 2, "rw-p"), (2, 3, "r--p"), (3, 4, "rw-p")]);
        // Over several VMAs and a hole.
        map(t, 6, 2, RW, SHARED_ANON);
        map(t, 1, 8, PROT_NONE, ANON);
        assert_layout(t, &[(0, 1, "rw-p"), (1, 9, "---p")]);
    });
}

#[test]
fn mmap_fixed_noreplace_fails_with_eexist() {
    on_both(32, |t| {
        let r = t.region();
        let a = map(t, 0, 4, RW, ANON);
        for (i, n) in [(2, 2), (3, 3), (0, 8), (1, 1)] {
            check!(
                t,
                t.mmap(r.page(i), n * PAGE, RW, ANON | MAP_FIXED_NOREPLACE),
                Err(EEXIST)
            );
        }
        assert_layout(t, &[(0, 4, "rw-p")]);
        // Right after it: allowed, and it merges.
        check!(
            t,
            t.mmap(r.page(4), 2 * PAGE, RW, ANON | MAP_FIXED_NOREPLACE),
            Ok(r.page(4))
        );
        assert_layout(t, &[(0, 6, "rw-p")]);
        check!(t, load(t, a, PAGE), Ok(zeros(PAGE)));
    });
}

#[test]
fn mmap_populate_faults_pages_in() {
    on_both(32, |t| {
        let r = t.region();
        let before = t.aspace().map(|m| (m.frames_used(), m.stats().faults()));
        let a = r.page(0);
        check!(
            t,
            t.mmap(a, 8 * PAGE, RW, ANON | MAP_FIXED | MAP_POPULATE),
            Ok(a)
        );
        if let Some(res) = t.resident(a, 8) {
            assert!(
                res.iter().all(|&r| r),
                "kernel: populated pages are resident: {res:?}"
            );
        }
        if let (Some(m), Some((f0, n0))) = (t.aspace(), before) {
            assert_eq!(
                m.frames_used() - f0,
                8,
                "aspace: one frame per populated private writable page"
            );
            assert!(
                m.stats().faults() - n0 >= 8,
                "aspace: populate faults every page"
            );
        }
        // Without POPULATE nothing is present.
        let b = map(t, 10, 4, RW, ANON);
        if let Some(res) = t.resident(b, 4) {
            assert!(res.iter().all(|&r| !r), "kernel: {res:?}");
        }
        if let (Some(m), Some((f0, _))) = (t.aspace(), before) {
            assert_eq!(m.frames_used() - f0, 8);
        }
        check!(t, load(t, a, 8 * PAGE), Ok(zeros(8 * PAGE)));
        // Populated private writable memory was written (anon_vma): an
        // untouched neighbour still merges with it.
        map(t, 8, 2, RW, ANON);
        assert_layout(t, &[(0, 14, "rw-p")]);
    });
}

#[test]
fn mmap_einval_cases() {
    on_both(32, |t| {
        let r = t.region();
        map(t, 0, 2, RW, ANON);
        let want = rel_layout(t);
        let a = r.page(4);
        // Zero length, with and without FIXED.
        check!(t, t.mmap(a, 0, RW, ANON | MAP_FIXED), Err(EINVAL));
        check!(t, t.mmap(0, 0, RW, ANON), Err(EINVAL));
        // Unaligned fixed address.
        check!(t, t.mmap(a + 1, PAGE, RW, ANON | MAP_FIXED), Err(EINVAL));
        check!(
            t,
            t.mmap(a + 2048, PAGE, RW, ANON | MAP_FIXED_NOREPLACE),
            Err(EINVAL)
        );
        // Neither PRIVATE nor SHARED.
        check!(
            t,
            t.mmap(a, PAGE, RW, MAP_ANONYMOUS | MAP_FIXED),
            Err(EINVAL)
        );
        // Both: that is MAP_SHARED_VALIDATE, which anonymous mmap rejects.
        check!(
            t,
            t.mmap(
                a,
                PAGE,
                RW,
                MAP_SHARED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED
            ),
            Err(EINVAL)
        );
        // GROWSDOWN with a shared mapping.
        check!(
            t,
            t.mmap(a, PAGE, RW, SHARED_ANON | MAP_GROWSDOWN | MAP_FIXED),
            Err(EINVAL)
        );
        assert_eq!(
            rel_layout(t),
            want,
            "[{}] no error may change the layout",
            t.name()
        );
    });
}

/// Unknown flag bits: Linux's mmap ignores them (only
/// MAP_SHARED_VALIDATE rejects them), and so does aspace
/// (tests/linux_surface.rs covers the other flags).
#[test]
fn mmap_unknown_flag_bits() {
    on_both(8, |t| {
        let a = t.region().page(0);
        for f in [0x4000_0000, 0x0800_0000] {
            check!(t, t.mmap(a, PAGE, RW, ANON | MAP_FIXED | f), Ok(a));
        }
    });
}

/// Protection bits outside READ|WRITE|EXEC: the kernel's mmap ignores them
/// (it only takes the bits it knows), mprotect rejects them.
#[test]
fn mmap_and_mprotect_unknown_prot_bits() {
    on_both(16, |t| {
        let r = t.region();
        let a = r.page(0);
        check!(t, t.mmap(a, PAGE, RW | 0x10, ANON | MAP_FIXED), Ok(a));
        check!(
            t,
            t.mmap(r.page(2), PAGE, RW | 0x0100_0000, ANON | MAP_FIXED),
            Ok(r.page(2))
        );
        assert_layout(t, &[(0, 1, "rw-p"), (2, 3, "rw-p")]);
        check!(t, t.mprotect(a, PAGE, PROT_READ | 0x10), Err(EINVAL));
        check!(t, t.mprotect(a, PAGE, PROT_READ | 0x0300_0000), Err(EINVAL));
        assert_layout(t, &[(0, 1, "rw-p"), (2, 3, "rw-p")]);
    });
}

#[test]
fn mmap_enomem_past_the_task_size() {
    on_both(16, |t| {
        let r = t.region();
        let before = t.layout();
        // A fixed range crossing the end of user space.
        check!(
            t,
            t.mmap(TASK_SIZE - PAGE, 2 * PAGE, RW, ANON | MAP_FIXED),
            Err(ENOMEM)
        );
        check!(
            t,
            t.mmap(TASK_SIZE, PAGE, RW, ANON | MAP_FIXED),
            Err(ENOMEM)
        );
        check!(
            t,
            t.mmap(TASK_SIZE - PAGE, 2 * PAGE, RW, ANON | MAP_FIXED_NOREPLACE),
            Err(ENOMEM)
        );
        // Longer than user space, with or without a hint.
        check!(t, t.mmap(0, TASK_SIZE + PAGE, PROT_NONE, ANON), Err(ENOMEM));
        check!(t, t.mmap(r.page(0), 1 << 48, PROT_NONE, ANON), Err(ENOMEM));
        // A length whose page rounding overflows.
        check!(t, t.mmap(0, u64::MAX, RW, ANON), Err(ENOMEM));
        check!(
            t,
            t.mmap(r.page(0), u64::MAX - 5, RW, ANON | MAP_FIXED),
            Err(ENOMEM)
        );
        assert_eq!(t.layout(), before);
    });
}

/// aspace only (the kernel's address space is the test process's own): no
/// gap fits, in a small configured address space.
#[test]
fn mmap_enomem_when_no_gap_fits() {
    let cfg = Config {
        task_size: 64 << 20,
        mmap_base: 64 << 20,
        mmap_min_addr: 1 << 16,
        ..Config::default()
    };
    let mm = AddressSpace::new(cfg);
    let anon = MapFlags::PRIVATE | MapFlags::ANONYMOUS;
    let a = mm.mmap(0, 40 << 20, Prot::READ, anon).unwrap();
    assert!(a + (40 << 20) <= 64 << 20);
    // 24 MiB minus the 64 KiB floor are left, in at most two gaps.
    assert_eq!(
        mm.mmap(0, 24 << 20, Prot::READ, anon)
            .map_err(|e| e.errno()),
        Err(ENOMEM)
    );
    // What does fit is placed below the first mapping, inside the space.
    let b = mm.mmap(0, 8 << 20, Prot::READ, anon).unwrap();
    assert!(b >= 1 << 16 && b + (8 << 20) <= a, "{b:#x}");
    let mapped: u64 = mm.vmas().iter().map(|v| v.end - v.start).sum();
    assert_eq!(mapped, 48 << 20);
    // Below mmap_min_addr with MAP_FIXED: EPERM.
    assert_eq!(
        mm.mmap(0x1000, 0x1000, Prot::READ, anon | MapFlags::FIXED)
            .map_err(|e| e.errno()),
        Err(EPERM)
    );
}

/// aspace only: `max_map_count` (the kernel's is a system-wide sysctl).
/// The limit is inclusive: map_count never exceeds it (range writers
/// near it take the whole space: `WriterLocking::Range`'s docs).
#[test]
fn max_map_count_limits_mmap_split_and_munmap() {
    let max = 6;
    let mm = AddressSpace::new(Config {
        max_map_count: max,
        ..Config::default()
    });
    let base = 0x1000_0000u64;
    let anon = MapFlags::PRIVATE | MapFlags::ANONYMOUS | MapFlags::FIXED;
    // Alternate protections so that nothing merges.
    for i in 0..max as u64 {
        let prot = if i % 2 == 0 {
            Prot::READ
        } else {
            Prot::READ | Prot::WRITE
        };
        mm.mmap(base + i * 4 * PAGE, 4 * PAGE, prot, anon).unwrap();
    }
    assert_eq!(mm.map_count(), max);
    let before: Vec<_> = mm.vmas().iter().map(|v| (v.start, v.end, v.prot)).collect();
    let snap = || {
        mm.vmas()
            .iter()
            .map(|v| (v.start, v.end, v.prot))
            .collect::<Vec<_>>()
    };
    let e = |r: aspace::Result<()>| r.map_err(|e| e.errno());
    // One more mapping: ENOMEM.
    assert_eq!(
        mm.mmap(base + 100 * PAGE, PAGE, Prot::READ, anon)
            .map_err(|e| e.errno()),
        Err(ENOMEM)
    );
    // Splitting a VMA (mprotect in the middle, or at one end): ENOMEM.
    assert_eq!(e(mm.mprotect(base + PAGE, PAGE, Prot::NONE)), Err(ENOMEM));
    assert_eq!(e(mm.mprotect(base, PAGE, Prot::NONE)), Err(ENOMEM));
    // munmap of a middle page needs one more VMA: ENOMEM.
    assert_eq!(e(mm.munmap(base + PAGE, PAGE)), Err(ENOMEM));
    assert_eq!(snap(), before, "no failed call may change the layout");
    // Unmapping a head or a whole VMA works at the limit.
    assert_eq!(e(mm.munmap(base, PAGE)), Ok(()));
    assert_eq!(e(mm.munmap(base + 4 * PAGE, 4 * PAGE)), Ok(()));
    assert_eq!(mm.map_count(), max - 1);
    // Merging mprotect needs no new VMA.
    assert_eq!(
        e(mm.mprotect(base + 8 * PAGE, 4 * PAGE, Prot::READ | Prot::WRITE)),
        Ok(())
    );
    assert_eq!(mm.map_count(), max - 2);
}

#[test]
fn adjacent_anonymous_mappings_merge_when_compatible() {
    on_both(64, |t| {
        let r = t.region();
        map(t, 0, 2, RW, ANON);
        map(t, 2, 2, RW, ANON);
        map(t, 6, 2, RW, ANON);
        map(t, 4, 2, RW, ANON); // fills the gap: merges both sides
        assert_layout(t, &[(0, 8, "rw-p")]);
        // Different protection, NORESERVE (no VM_ACCOUNT), shared: apart.
        map(t, 8, 2, PROT_READ, ANON);
        map(t, 10, 2, RW, ANON | MAP_NORESERVE);
        map(t, 12, 2, RW, SHARED_ANON);
        map(t, 14, 2, RW, SHARED_ANON);
        assert_layout(
            t,
            &[
                (0, 8, "rw-p"),
                (8, 10, "r--p"),
                (10, 12, "rw-p"),
                (12, 14, "rw-s"),
                (14, 16, "rw-s"),
            ],
        );
        // Read-only private memory made writable is charged (VM_ACCOUNT)
        // and then merges with writable neighbours.
        check!(t, t.mprotect(r.page(8), 2 * PAGE, RW), Ok(()));
        assert_layout(
            t,
            &[
                (0, 10, "rw-p"),
                (10, 12, "rw-p"),
                (12, 14, "rw-s"),
                (14, 16, "rw-s"),
            ],
        );
        // Unfaulted writable memory made read-only loses VM_ACCOUNT (Linux
        // 6.2+), so it merges with a fresh read-only neighbour.
        map(t, 20, 2, RW, ANON);
        check!(t, t.mprotect(r.page(20), 2 * PAGE, PROT_READ), Ok(()));
        map(t, 22, 2, PROT_READ, ANON);
        assert_layout(
            t,
            &[
                (0, 10, "rw-p"),
                (10, 12, "rw-p"),
                (12, 14, "rw-s"),
                (14, 16, "rw-s"),
                (20, 24, "r--p"),
            ],
        );
        // Written memory keeps it, and stays apart.
        map(t, 30, 2, RW, ANON);
        fill(t, r.page(30), 1, 1);
        check!(t, t.mprotect(r.page(30), 2 * PAGE, PROT_READ), Ok(()));
        map(t, 32, 2, PROT_READ, ANON);
        assert_layout(
            t,
            &[
                (0, 10, "rw-p"),
                (10, 12, "rw-p"),
                (12, 14, "rw-s"),
                (14, 16, "rw-s"),
                (20, 24, "r--p"),
                (30, 32, "r--p"),
                (32, 34, "r--p"),
            ],
        );
    });
}

const MB: u64 = 1 << 20;
const HUGE: u64 = 2 * MB;

/// aspace only (the kernel target cannot empty its own address space):
/// the default layout (no randomization, `mmap_base` =
/// `0x7ffff7fff000`, where Linux ends `ld.so` under `setarch -R`) puts a
/// first 2 MiB mapping at `0x7ffff7c00000`, a 4 KiB one under
/// `mmap_base`; with the setting off, the plain fit.
#[test]
fn placement_in_a_fresh_default_space() {
    let anon = MapFlags::PRIVATE | MapFlags::ANONYMOUS;
    let mm = AddressSpace::new(Config::default());
    assert_eq!(mm.mmap(0, HUGE, Prot::READ, anon), Ok(0x7fff_f7c0_0000));
    assert_eq!(mm.mmap(0, PAGE, Prot::READ, anon), Ok(0x7fff_f7ff_e000));
    let plain = AddressSpace::new(Config {
        thp_placement: false,
        ..Config::default()
    });
    assert_eq!(plain.mmap(0, HUGE, Prot::READ, anon), Ok(0x7fff_f7df_f000));
}

/// aspace only: `MAP_32BIT` (bottom-up in `[1 GiB, 2 GiB)`) as Linux 6.18
/// places it with randomization off (`setarch -R`; with it on, the window's
/// start moves at every call): a 2 MiB mapping 2 MiB above the window's
/// aligned start, the padded length's room being aligned; the plain fit
/// when only an exact hole is left; the boundary inside a larger hole.
#[test]
fn placement_in_the_32bit_window() {
    let g = 0x4000_0000u64;
    let anon = MapFlags::PRIVATE | MapFlags::ANONYMOUS;
    let bit32 = anon | MapFlags::BIT32;
    let mm = AddressSpace::new(Config::default());
    assert_eq!(mm.mmap(0, HUGE, Prot::READ, bit32), Ok(g + HUGE));
    assert_eq!(mm.munmap(g + HUGE, HUGE), Ok(()));
    assert_eq!(mm.mmap(0, PAGE, Prot::READ, bit32), Ok(g));
    assert_eq!(mm.munmap(g, PAGE), Ok(()));
    let fixed = anon | MapFlags::FIXED | MapFlags::NORESERVE;
    assert_eq!(mm.mmap(g, 1 << 30, Prot::NONE, fixed), Ok(g));
    assert_eq!(mm.munmap(g + 10 * MB, HUGE), Ok(()));
    assert_eq!(mm.mmap(0, HUGE, Prot::READ, bit32), Ok(g + 10 * MB));
    assert_eq!(mm.munmap(g + 10 * MB, HUGE), Ok(()));
    assert_eq!(mm.munmap(g + 30 * MB + PAGE, 2 * HUGE), Ok(()));
    assert_eq!(mm.mmap(0, HUGE, Prot::READ, bit32), Ok(g + 32 * MB));
}

/// aspace only: when the padded length fits nowhere, the plain search
/// places the mapping (Linux retries without the padding).
#[test]
fn placement_when_the_padded_length_fits_nowhere() {
    let cfg = Config {
        task_size: 64 * MB,
        mmap_base: 64 * MB,
        mmap_min_addr: 1 << 16,
        brk_start: 1 << 20,
        ..Config::default()
    };
    let mm = AddressSpace::new(cfg);
    let anon = MapFlags::PRIVATE | MapFlags::ANONYMOUS;
    let fixed = anon | MapFlags::FIXED;
    // Only [2 MiB, 4 MiB) and [60 MiB, 62 MiB) stay free.
    assert_eq!(
        mm.mmap(1 << 16, 2 * MB - (1 << 16), Prot::NONE, fixed),
        Ok(1 << 16)
    );
    assert_eq!(mm.mmap(4 * MB, 56 * MB, Prot::NONE, fixed), Ok(4 * MB));
    assert_eq!(mm.mmap(62 * MB, 2 * MB, Prot::NONE, fixed), Ok(62 * MB));
    assert_eq!(mm.mmap(0, HUGE, Prot::READ, anon), Ok(60 * MB));
    assert_eq!(mm.mmap(0, HUGE, Prot::READ, anon), Ok(2 * MB));
    assert_eq!(
        mm.mmap(0, HUGE, Prot::READ, anon).map_err(|e| e.errno()),
        Err(ENOMEM)
    );
}
