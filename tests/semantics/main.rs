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

#[path = "../common/mod.rs"]
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

// After `check!`, which they use.
mod access;
mod brk;
mod madvise;
mod maps;
mod mmap;
mod mprotect;
mod mremap;
mod munmap;
mod stack;

fn aspace_target_start() -> u64 {
    common::aspace_target::DEFAULT_REGION_START
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
