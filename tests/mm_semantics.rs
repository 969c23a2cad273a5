//! Deterministic semantics of every operation and every error case, through
//! the public API.
//!
//! Most scenarios are written once against [`Target`] and run twice by
//! [`on_both`]: first on the real kernel (a region of this process), then on
//! an `AddressSpace` with the same region layout. Every expectation is
//! therefore checked against Linux itself before it is required of aspace;
//! a scenario that fails on the kernel side is a wrong expectation, one that
//! fails on the aspace side is a discrepancy. Scenarios the kernel cannot
//! run (brk, `fault()`, frame accounting, small configurations) are
//! aspace-only and say so.
//!
//! Addresses are written as interior pages `p(i)` of the region.

mod common;

use aspace::{Access, AddressSpace, Config, FaultError, MapFlags, Prot, PAGE_SIZE};
use common::ops::{apply, Op, Outcome};
use common::*;

/// Asserts `$got == $want`, naming the target and showing its layout.
macro_rules! check {
    ($t:expr, $got:expr, $want:expr) => {{
        let got = $got;
        let want = $want;
        if got != want {
            let name = $t.name();
            panic!(
                "[{name}] `{}`\n  got:  {:?}\n  want: {:?}\n  layout:\n{}",
                stringify!($got),
                got,
                want,
                dump($t)
            );
        }
    }};
}

/// Maps `pages` pages at interior page `i` with MAP_FIXED; must succeed.
#[track_caller]
fn map(t: &mut dyn Target, i: u64, pages: u64, prot: u32, flags: u32) -> u64 {
    let a = t.region().page(i);
    let name = t.name();
    let got = t.mmap(a, pages * PAGE, prot, flags | MAP_FIXED);
    assert_eq!(got, Ok(a), "[{name}] mmap of page {i} (+{pages})");
    a
}

/// Stores a pattern over `pages` pages from `addr`; must succeed.
#[track_caller]
fn fill(t: &mut dyn Target, addr: u64, pages: u64, seed: u64) -> Vec<u8> {
    let data = pattern(seed, addr, (pages * PAGE) as usize);
    let name = t.name();
    assert_eq!(t.write(addr, &data), Ok(()), "[{name}] store at {addr:#x}");
    data
}

#[track_caller]
fn load(t: &mut dyn Target, addr: u64, len: u64) -> Res<Vec<u8>> {
    read_vec(t, addr, len as usize)
}

fn zeros(len: u64) -> Vec<u8> {
    vec![0; len as usize]
}

// ---------------------------------------------------------------- sanity

#[test]
fn flag_and_errno_values_are_linux() {
    assert_eq!(MapFlags::SHARED.bits(), libc::MAP_SHARED as u32);
    assert_eq!(MapFlags::PRIVATE.bits(), libc::MAP_PRIVATE as u32);
    assert_eq!(MapFlags::FIXED.bits(), libc::MAP_FIXED as u32);
    assert_eq!(MapFlags::ANONYMOUS.bits(), libc::MAP_ANONYMOUS as u32);
    assert_eq!(MapFlags::GROWSDOWN.bits(), libc::MAP_GROWSDOWN as u32);
    assert_eq!(MapFlags::NORESERVE.bits(), libc::MAP_NORESERVE as u32);
    assert_eq!(MapFlags::POPULATE.bits(), libc::MAP_POPULATE as u32);
    assert_eq!(
        MapFlags::FIXED_NOREPLACE.bits(),
        libc::MAP_FIXED_NOREPLACE as u32
    );
    assert_eq!(Prot::READ.bits(), libc::PROT_READ as u32);
    assert_eq!(Prot::WRITE.bits(), libc::PROT_WRITE as u32);
    assert_eq!(Prot::EXEC.bits(), libc::PROT_EXEC as u32);
    assert_eq!(Prot::GROWSDOWN.bits(), libc::PROT_GROWSDOWN as u32);
    assert_eq!(Prot::GROWSUP.bits(), libc::PROT_GROWSUP as u32);
    assert_eq!(
        aspace::MremapFlags::MAYMOVE.bits(),
        libc::MREMAP_MAYMOVE as u32
    );
    assert_eq!(aspace::MremapFlags::FIXED.bits(), libc::MREMAP_FIXED as u32);
    assert_eq!(
        aspace::MremapFlags::DONTUNMAP.bits(),
        libc::MREMAP_DONTUNMAP as u32
    );
    assert_eq!(aspace::Advice::DontNeed.to_raw(), libc::MADV_DONTNEED);
    assert_eq!(aspace::Advice::Normal.to_raw(), libc::MADV_NORMAL);
    for e in [
        libc::EPERM,
        libc::EAGAIN,
        libc::ENOMEM,
        libc::EACCES,
        libc::EFAULT,
        libc::EEXIST,
        libc::EINVAL,
    ] {
        assert_eq!(aspace::Error::from_errno(e).map(|x| x.errno()), Some(e));
    }
    assert_eq!(PAGE_SIZE, PAGE);
    assert_eq!(Config::default().task_size, TASK_SIZE);
}

// ---------------------------------------------------------------- mmap

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
        assert!(matches!(o, Outcome::Outside(_)), "[{}] {o:?}", t.name());
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

fn aspace_target_start() -> u64 {
    common::aspace_target::DEFAULT_REGION_START
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
/// The limit is inclusive: map_count never exceeds it.
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

// ---------------------------------------------------------------- munmap

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

// ---------------------------------------------------------------- mprotect

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

// ---------------------------------------------------------------- mremap

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

// ---------------------------------------------------------------- madvise

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

// ---------------------------------------------------------------- merging

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

// ------------------------------------------------------- loads and stores

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

// ---------------------------------------------------------------- maps()

#[test]
fn maps_lines_have_the_proc_format() {
    let k = KernelTarget::new(32);
    let region = k
        .as_ref()
        .map_or(Region::new(aspace_target_start(), 32), |k| k.region());
    let mut a = AspaceTarget::new(region);
    let setup = |t: &mut dyn Target| {
        let r = t.region();
        map(t, 0, 2, RW, ANON);
        map(t, 2, 1, PROT_READ | PROT_EXEC, ANON);
        map(t, 4, 3, RW, SHARED_ANON);
        map(t, 8, 1, PROT_NONE, ANON);
        check!(t, t.mprotect(r.page(5), PAGE, PROT_READ), Ok(()));
    };
    setup(&mut a);
    let mine: Vec<String> =
        a.mm.maps()
            .lines()
            .map(str::to_string)
            .filter(|l| parse_line_start(l).is_some_and(|s| s >= region.start && s < region.end))
            .collect();
    // Exact text for private anonymous memory (note the trailing space).
    let p0 = region.page(0);
    assert!(
        mine.contains(&format!(
            "{:08x}-{:08x} rw-p 00000000 00:00 0 ",
            p0,
            p0 + 2 * PAGE
        )),
        "{mine:#?}"
    );
    assert!(mine.contains(&format!(
        "{:08x}-{:08x} r-xp 00000000 00:00 0 ",
        p0 + 2 * PAGE,
        p0 + 3 * PAGE
    )));
    assert!(mine.contains(&format!(
        "{:08x}-{:08x} ---p 00000000 00:00 0 ",
        p0 + 8 * PAGE,
        p0 + 9 * PAGE
    )));
    // Shared anonymous memory: a deleted /dev/zero object, its page offset,
    // the path in column 74.
    let sh: Vec<&String> = mine
        .iter()
        .filter(|l| l.contains(" rw-s ") || l.contains(" r--s "))
        .collect();
    assert!(
        sh.iter()
            .all(|l| l.ends_with(" /dev/zero (deleted)") && l.find('/') == Some(73)),
        "{sh:#?}"
    );
    assert!(sh.iter().any(|l| l.contains(&format!(
        "{:08x}-{:08x} r--s 00001000 00:01 ",
        p0 + 5 * PAGE,
        p0 + 6 * PAGE
    ))));
    // Against the kernel's own lines, inode numbers masked.
    if let Some(mut k) = k {
        setup(&mut k);
        let mask = |l: &String| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let inode = if f[4] == "0" { "0" } else { "INO" };
            let head = format!("{} {} {} {} {}", f[0], f[1], f[2], f[3], inode);
            (head, f[5..].join(" "), l.ends_with(' '), l.find('/'))
        };
        let theirs: Vec<_> = k.maps_lines().iter().map(mask).collect();
        let ours: Vec<_> = mine.iter().map(mask).collect();
        // The path column position depends on the inode's width: compare
        // it only where the widths agree.
        let strip = |v: &Vec<(String, String, bool, Option<usize>)>| {
            v.iter()
                .map(|(h, p, s, _)| (h.clone(), p.clone(), *s))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            strip(&ours),
            strip(&theirs),
            "maps() against /proc/self/maps"
        );
    }
}

fn parse_line_start(l: &str) -> Option<u64> {
    u64::from_str_radix(l.split('-').next()?, 16).ok()
}

// ---------------------------------------------------------------- brk

/// aspace only: the test process's own brk belongs to its allocator.
#[test]
fn brk_grows_shrinks_keeps_data_and_fails_with_the_old_break() {
    let cfg = Config::default();
    let start = cfg.brk_start;
    let mm = AddressSpace::new(cfg);
    assert_eq!(mm.brk(0), Ok(start));
    // Grow by 3 pages and a bit: the heap VMA is page-rounded.
    let b1 = start + 3 * PAGE + 5;
    assert_eq!(mm.brk(b1), Ok(b1));
    assert_eq!(mm.brk(0), Ok(b1));
    let heap: Vec<_> = mm.vmas().into_iter().filter(|v| v.heap).collect();
    assert_eq!(heap.len(), 1);
    assert_eq!((heap[0].start, heap[0].end), (start, start + 4 * PAGE));
    assert_eq!(heap[0].prot, Prot::READ | Prot::WRITE);
    assert!(
        mm.maps()
            .lines()
            .any(|l| l.starts_with(&format!("{start:08x}-")) && l.ends_with(" [heap]")),
        "{}",
        mm.maps()
    );
    mm.write(start, b"heap data").unwrap();
    mm.write(start + 3 * PAGE, b"top").unwrap();
    // Shrink: the data below the new break survives, the rest is unmapped.
    assert_eq!(mm.brk(start + PAGE), Ok(start + PAGE));
    let mut buf = [0u8; 9];
    mm.read(start, &mut buf).unwrap();
    assert_eq!(&buf, b"heap data");
    assert_eq!(
        mm.read(start + 2 * PAGE, &mut buf).map_err(|e| e.errno()),
        Err(EFAULT)
    );
    // Grow again: the new part reads zero.
    assert_eq!(mm.brk(start + 4 * PAGE), Ok(start + 4 * PAGE));
    let mut top = [1u8; 3];
    mm.read(start + 3 * PAGE, &mut top).unwrap();
    assert_eq!(top, [0, 0, 0]);
    // A mapping 10 pages above the start: brk must stay a page below it.
    let anon = MapFlags::PRIVATE | MapFlags::ANONYMOUS | MapFlags::FIXED;
    mm.mmap(start + 10 * PAGE, PAGE, Prot::READ, anon).unwrap();
    let before = mm.vmas();
    let cur = start + 4 * PAGE;
    assert_eq!(
        mm.brk(start + 20 * PAGE),
        Ok(cur),
        "into a mapping: old break"
    );
    assert_eq!(
        mm.brk(start + 9 * PAGE + 1),
        Ok(cur),
        "less than a page below it: old break"
    );
    assert_eq!(mm.vmas().len(), before.len());
    assert_eq!(mm.brk(start + 9 * PAGE), Ok(start + 9 * PAGE));
    // Below the start of the heap: unchanged.
    assert_eq!(mm.brk(start - PAGE), Ok(start + 9 * PAGE));
    // Back to the start: the heap VMA goes away.
    assert_eq!(mm.brk(start), Ok(start));
    assert!(mm
        .vmas()
        .iter()
        .all(|v| v.end <= start || v.start >= start + PAGE));
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
    let empty = mm.page_table_bytes();
    // A lone page far from everything: PUD, PMD and PTE tables.
    let anon = MapFlags::PRIVATE | MapFlags::ANONYMOUS | MapFlags::FIXED;
    let far = 0x7e00_0000_0000;
    mm.mmap(far, PAGE, Prot::READ | Prot::WRITE, anon).unwrap();
    mm.write(far, b"x").unwrap();
    let one_page = mm.page_table_bytes();
    assert!(one_page > empty);
    mm.munmap(far, PAGE).unwrap();
    assert_eq!(mm.page_table_bytes(), empty);
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

// ----------------------------------------------- frames and bad input

/// aspace only: every frame comes back once everything is unmapped.
#[test]
fn frames_are_all_freed_when_everything_is_unmapped() {
    let mm = AddressSpace::new(Config::default());
    let anon = MapFlags::PRIVATE | MapFlags::ANONYMOUS;
    let shared = MapFlags::SHARED | MapFlags::ANONYMOUS;
    let rw = Prot::READ | Prot::WRITE;
    let a = mm.mmap(0, 16 * PAGE, rw, anon).unwrap();
    let s = mm.mmap(0, 4 * PAGE, rw, shared).unwrap();
    let p = mm.mmap(0, 8 * PAGE, rw, anon | MapFlags::POPULATE).unwrap();
    for i in 0..16 {
        mm.write(a + i * PAGE, &[i as u8 + 1; 64]).unwrap();
    }
    mm.write(s, &[7; 3 * PAGE as usize]).unwrap();
    let mut buf = [0u8; 16];
    mm.read(p, &mut buf).unwrap();
    assert!(mm.frames_used() >= 16 + 3 + 8);
    mm.mprotect(a + 4 * PAGE, 4 * PAGE, Prot::READ).unwrap();
    mm.mprotect(a + 4 * PAGE, 4 * PAGE, rw).unwrap();
    let b = mm
        .mremap(a, 16 * PAGE, 32 * PAGE, aspace::MremapFlags::MAYMOVE, 0)
        .unwrap();
    mm.madvise(b, 2 * PAGE, aspace::Advice::DontNeed).unwrap();
    let d = mm
        .mremap(s, 0, 4 * PAGE, aspace::MremapFlags::MAYMOVE, 0)
        .unwrap();
    mm.munmap(s, 4 * PAGE).unwrap();
    assert!(
        mm.frames_used() > 0,
        "the duplicate still maps the shared object"
    );
    for (addr, len) in [(b, 32 * PAGE), (p, 8 * PAGE), (d, 4 * PAGE)] {
        mm.munmap(addr, len).unwrap();
    }
    assert_eq!(mm.vmas().len(), 0);
    assert_eq!(mm.frames_used(), 0);
}

/// Bad arguments to every call: never a panic, always an error (the
/// kernel's errno, where the kernel can run the call), never a change.
#[test]
fn bad_input_never_panics_and_never_changes_anything() {
    let log: std::cell::RefCell<Vec<(&'static str, Vec<String>)>> = Default::default();
    on_both(16, |t| {
        let r = t.region();
        map(t, 0, 4, RW, ANON);
        map(t, 6, 2, RW, SHARED_ANON);
        fill(t, r.page(0), 4, 1);
        let before = t.layout();
        let a = r.page(0);
        // Every range is rejected before the kernel looks at any mapping:
        // unaligned, wrapping, or at/above the task size.
        let bad = [
            (a + 1, PAGE),
            (a + 4095, 1),
            (a, u64::MAX),
            (a, u64::MAX - PAGE + 2),
            (LAST_PAGE, PAGE),
            (u64::MAX, 1),
            (TASK_SIZE, PAGE),
            (1 << 63, 1 << 63),
        ];
        let mut results = Vec::new();
        for (addr, len) in bad {
            let mut res = Vec::new();
            for prot in [PROT_READ, RW, 0xffff_ffff] {
                res.push(t.mprotect(addr, len, prot).map(|_| 0));
            }
            res.push(t.munmap(addr, len).map(|_| 0));
            res.push(t.madvise(addr, len, MADV_DONTNEED).map(|_| 0));
            res.push(t.madvise(addr, len, MADV_NORMAL).map(|_| 0));
            for flags in [
                ANON | MAP_FIXED,
                ANON | MAP_FIXED_NOREPLACE,
                SHARED_ANON | MAP_FIXED,
            ] {
                res.push(t.mmap(addr, len, RW, flags));
            }
            for (flags, new) in [
                (0, 0),
                (MREMAP_MAYMOVE, 0),
                (MREMAP_MAYMOVE | MREMAP_FIXED, addr),
                (7, addr),
            ] {
                res.push(t.mremap(addr, len, len, flags, new));
                res.push(t.mremap(addr, PAGE, len, flags, new));
            }
            if addr >= TASK_SIZE {
                res.push(t.write(addr, b"x").map(|_| 0));
                res.push(load(t, addr, len.min(8)).map(|_| 0));
            }
            let name = t.name();
            assert_eq!(
                t.layout(),
                before,
                "[{name}] bad input at {addr:#x}+{len:#x} changed the layout"
            );
            assert!(
                res.iter().all(|x| x.is_err()),
                "[{name}] {addr:#x}+{len:#x}: {res:?}"
            );
            results.push(format!("bad range #{}: {res:?}", results.len()));
        }
        log.borrow_mut().push((t.name(), results));
    });
    let log = log.into_inner();
    if log.len() == 2 {
        let diffs: Vec<String> = log[0]
            .1
            .iter()
            .zip(&log[1].1)
            .filter(|(k, a)| k != a)
            .map(|(k, a)| format!("kernel {k}\naspace {a}"))
            .collect();
        assert!(
            diffs.is_empty(),
            "errno of bad calls differ:\n{}",
            diffs.join("\n")
        );
    }
}
