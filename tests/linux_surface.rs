//! The Linux surface a syscall-forwarding emulator needs, compared with the
//! running kernel: the stack limit, mmap's flags (`MAP_DROPPABLE`
//! included), madvise, mlock and the locked-memory limit, mincore, msync,
//! the `[heap]` and `[stack]` labels, VMA names, and (where the kernel
//! needs a process of its own) scenarios run in a forked child of this
//! test process, unprivileged where root would bypass a limit.
//!
//! Every expectation is written once and checked first against Linux
//! (when the kernel harness can run here), then required of aspace at the
//! same addresses.

mod common;

use aspace::{AddressSpace, Config, MapFlags, Prot};
use common::kernel::parse_maps_line;
use common::*;
use std::io::Read;
use std::os::fd::FromRawFd;

/// A one-byte store through a pipe (`copy_to_user`): the kernel takes the
/// user page-fault path, stack growth included, and returns EFAULT where
/// a user-mode store would get SIGSEGV. Only raw system calls: it runs in
/// forked children. `pipe` is [read end, write end].
fn kernel_store(pipe: [libc::c_int; 2], addr: u64) -> bool {
    let one = 1u8;
    // SAFETY: `pipe` is an open pipe of this process; the write reads one
    // byte of a local, the read stores one byte at `addr`, which the
    // caller chose inside the test region (the kernel checks the address
    // and returns EFAULT for a bad one); the drain reads into a local.
    unsafe {
        libc::write(pipe[1], (&one as *const u8).cast(), 1);
        if libc::read(pipe[0], addr as *mut libc::c_void, 1) == 1 {
            return true;
        }
        let mut scratch = 0u8;
        libc::read(pipe[0], (&mut scratch as *mut u8).cast(), 1);
    }
    false
}

/// Runs `f` in a forked child of this process and returns the bytes it
/// reported and its `/proc/self/maps`. `f` gets a copy pipe for
/// [`kernel_store`] and must use raw system calls only (the child has
/// none of this process's other threads, so it must not allocate or take
/// locks); it returns the bytes to report in a fixed buffer.
fn in_forked_child(f: impl FnOnce([libc::c_int; 2]) -> ([u8; 64], usize)) -> (Vec<u8>, String) {
    in_forked_child_reporting(c"/proc/self/maps", f)
}

/// [`in_forked_child`], reporting the file at `path` (e.g. smaps) instead
/// of the maps.
fn in_forked_child_reporting(
    path: &std::ffi::CStr,
    f: impl FnOnce([libc::c_int; 2]) -> ([u8; 64], usize),
) -> (Vec<u8>, String) {
    let mut out = [0; 2];
    let mut copy = [0; 2];
    // SAFETY: each array holds two ints for pipe2 to fill.
    unsafe {
        assert_eq!(libc::pipe2(out.as_mut_ptr(), libc::O_CLOEXEC), 0);
        assert_eq!(libc::pipe2(copy.as_mut_ptr(), libc::O_CLOEXEC), 0);
    }
    // SAFETY: fork has no memory-safety preconditions; the child runs only
    // `f` (raw system calls, see above) and the calls below.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let (res, n) = f(copy);
        // SAFETY: writes from local buffers of the given lengths; a valid
        // C string; `_exit` ends the child without running destructors.
        unsafe {
            let len = [n as u8];
            libc::write(out[1], len.as_ptr().cast(), 1);
            libc::write(out[1], res.as_ptr().cast(), n);
            let fd = libc::open(path.as_ptr(), libc::O_RDONLY);
            let mut buf = [0u8; 4096];
            loop {
                let k = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
                if k <= 0 {
                    break;
                }
                libc::write(out[1], buf.as_ptr().cast(), k as usize);
            }
            libc::_exit(0);
        }
    }
    // SAFETY: closing our copies of pipe ends the child owns now.
    unsafe {
        libc::close(out[1]);
        libc::close(copy[0]);
        libc::close(copy[1]);
    }
    // SAFETY: `out[0]` is our open read end; the File takes it over.
    let mut pipe = unsafe { std::fs::File::from_raw_fd(out[0]) };
    let mut text = Vec::new();
    pipe.read_to_end(&mut text)
        .expect("read the child's report");
    let mut status = 0;
    // SAFETY: waiting for our own child; `status` is a valid int.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "forked child failed (status {status:#x})"
    );
    let n = text[0] as usize;
    let maps = String::from_utf8_lossy(&text[1 + n..]).into_owned();
    (text[1..1 + n].to_vec(), maps)
}

/// (start, end, perms) of VMAs.
type Layout = Vec<(u64, u64, String)>;

/// The VMAs inside `r` (guards excluded) as (start, end, perms).
fn interior(maps: &str, r: &Region) -> Layout {
    maps.lines()
        .filter_map(parse_maps_line)
        .filter(|v| v.start >= r.lo && v.end <= r.hi)
        .map(|v| (v.start, v.end, v.perms))
        .collect()
}

// ---------------------------------------------------------------- stack

/// One step of a stack-limit scenario.
#[derive(Clone, Copy, Debug)]
enum StackStep {
    /// `setrlimit(RLIMIT_STACK)` soft limit, in bytes.
    Limit(u64),
    /// A one-byte store this many bytes below the stack's original start.
    StoreBelow(u64),
}

/// Interior pages of the stack scenarios' region: 12 MiB.
const STACK_REGION_PAGES: u64 = 3072;
/// The stack: 1 MiB of growsdown memory at the top of the interior.
const STACK_LEN: u64 = 1 << 20;

fn stack_top(r: &Region) -> u64 {
    r.hi
}

fn stack_start(r: &Region) -> u64 {
    stack_top(r) - STACK_LEN
}

/// Runs the scenario on the kernel in a forked child; the result of each
/// store, and the interior layout at the end.
fn stack_on_kernel(steps: &[StackStep]) -> Option<(Region, Vec<bool>, Layout)> {
    let k = KernelTarget::new(STACK_REGION_PAGES)?;
    let r = k.region();
    let (res, maps) = in_forked_child(|pipe| {
        let mut res = [0u8; 64];
        let mut n = 0;
        let start = stack_start(&r);
        // SAFETY: MAP_FIXED inside the region's interior, which the
        // harness reserved for this test (no Rust object lives there).
        let p = unsafe {
            libc::mmap(
                start as *mut libc::c_void,
                STACK_LEN as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_GROWSDOWN,
                -1,
                0,
            )
        };
        if p as u64 != start {
            // SAFETY: ends the child at once.
            unsafe { libc::_exit(2) };
        }
        for &s in steps {
            match s {
                StackStep::Limit(b) => {
                    let rl = libc::rlimit {
                        rlim_cur: b,
                        rlim_max: libc::RLIM_INFINITY,
                    };
                    // SAFETY: `rl` is a valid rlimit. Raising the hard
                    // limit needs privilege: keep the current one then.
                    unsafe {
                        let mut cur = rl;
                        libc::getrlimit(libc::RLIMIT_STACK, &mut cur);
                        let want = libc::rlimit {
                            rlim_cur: b.min(cur.rlim_max),
                            rlim_max: cur.rlim_max,
                        };
                        libc::setrlimit(libc::RLIMIT_STACK, &want);
                    }
                }
                StackStep::StoreBelow(off) => {
                    res[n] = kernel_store(pipe, start - off) as u8;
                    n += 1;
                }
            }
        }
        (res, n)
    });
    Some((
        r,
        res.iter().map(|&b| b == 1).collect(),
        interior(&maps, &r),
    ))
}

fn stack_on_aspace(r: &Region, steps: &[StackStep]) -> (Vec<bool>, Layout) {
    let t = AspaceTarget::new(*r);
    let mm: &AddressSpace = &t.mm;
    let start = stack_start(r);
    let got = mm.mmap(
        start,
        STACK_LEN,
        Prot::READ | Prot::WRITE,
        MapFlags::PRIVATE | MapFlags::ANONYMOUS | MapFlags::FIXED | MapFlags::GROWSDOWN,
    );
    assert_eq!(got, Ok(start));
    let mut res = Vec::new();
    for &s in steps {
        match s {
            StackStep::Limit(b) => mm.set_stack_limit(b),
            StackStep::StoreBelow(off) => res.push(mm.write(start - off, &[1]).is_ok()),
        }
    }
    (res, interior(&mm.maps(), r))
}

/// Runs a stack scenario on both; `want` is the result of each store, and
/// `want_start` how far below the original start the stack reaches at the
/// end (bytes).
fn stack_case(name: &str, steps: &[StackStep], want: &[bool], want_below: u64) {
    let r = match stack_on_kernel(steps) {
        Some((r, res, layout)) => {
            assert_eq!(res, want, "{name}: kernel stores");
            let s = stack_start(&r) - want_below;
            assert_eq!(
                layout,
                vec![(s, stack_top(&r), "rw-p".to_string())],
                "{name}: kernel layout"
            );
            r
        }
        None => Region::new(aspace_target::DEFAULT_REGION_START, STACK_REGION_PAGES),
    };
    let (res, layout) = stack_on_aspace(&r, steps);
    assert_eq!(res, want, "{name}: aspace stores");
    let s = stack_start(&r) - want_below;
    assert_eq!(
        layout,
        vec![(s, stack_top(&r), "rw-p".to_string())],
        "{name}: aspace layout"
    );
}

const MIB: u64 = 1 << 20;

#[test]
fn stack_grows_to_the_limit_and_no_further() {
    use StackStep::*;
    // 8 MiB limit, 1 MiB stack: 4 MiB below grows; the whole VMA may be
    // exactly 8 MiB (7 MiB below), not one page more.
    stack_case(
        "8 MiB",
        &[
            Limit(8 * MIB),
            StoreBelow(4 * MIB),
            StoreBelow(7 * MIB),
            StoreBelow(7 * MIB + 1),
            StoreBelow(8 * MIB),
        ],
        &[true, true, false, false],
        7 * MIB,
    );
}

#[test]
fn stack_limit_counts_pages_not_bytes() {
    use StackStep::*;
    // A limit one byte short of two more pages allows only one.
    stack_case(
        "1 MiB + 8191",
        &[
            Limit(MIB + 8191),
            StoreBelow(1),
            StoreBelow(4097),
            Limit(MIB + 8192),
            StoreBelow(4097),
        ],
        &[true, false, true],
        8192,
    );
}

#[test]
fn a_stack_over_a_lowered_limit_keeps_its_pages_but_cannot_grow() {
    use StackStep::*;
    stack_case(
        "lowered",
        &[
            StoreBelow(2 * MIB),
            Limit(MIB),
            StoreBelow(MIB),
            StoreBelow(2 * MIB + 1),
            Limit(u64::MAX),
            StoreBelow(2 * MIB + 1),
        ],
        &[true, true, false, true],
        2 * MIB + 4096,
    );
}

#[test]
fn an_unlimited_stack_stops_at_the_guard_gap() {
    use StackStep::*;
    // The region's bottom guard page (accessible, not a stack) sits 11 MiB
    // below the stack's start; the stack keeps a 1 MiB gap above it.
    let to_guard = (STACK_REGION_PAGES * PAGE) - STACK_LEN;
    stack_case(
        "unlimited",
        &[
            Limit(u64::MAX),
            StoreBelow(to_guard - MIB + 1),
            StoreBelow(to_guard - MIB),
        ],
        &[false, true],
        to_guard - MIB,
    );
}

#[test]
fn stack_limit_defaults_to_8_mib_and_fork_inherits_it() {
    let mm = AddressSpace::new(Config::default());
    assert_eq!(Config::default().stack_limit, 8 << 20);
    assert_eq!(mm.stack_limit(), 8 << 20);
    mm.set_stack_limit(1 << 20);
    assert_eq!(mm.fork().unwrap().stack_limit(), 1 << 20);
}

// ---------------------------------------------------------------- mmap flags

const MAP_32BIT: u32 = 0x40;
const MAP_DENYWRITE: u32 = 0x800;
const MAP_EXECUTABLE: u32 = 0x1000;
const MAP_LOCKED: u32 = 0x2000;
const MAP_NONBLOCK: u32 = 0x1_0000;
const MAP_STACK: u32 = 0x2_0000;
const MAP_HUGETLB: u32 = 0x4_0000;
const MAP_SYNC: u32 = 0x8_0000;
const MAP_SHARED_VALIDATE: u32 = 0x03;
const MAP_UNINITIALIZED: u32 = 0x400_0000;
const MAP_HUGE_SHIFT: u32 = 26;

/// (first page, end page, compared smaps flags) of the VMAs in the
/// interior.
fn flags_layout(t: &mut dyn Target) -> Vec<(u64, u64, Vec<String>)> {
    let r = t.region();
    t.vm_flags()
        .expect("both targets report flags")
        .into_iter()
        .filter(|&(s, e, _)| s >= r.lo && e <= r.hi)
        .map(|(s, e, f)| ((s - r.lo) / PAGE, (e - r.lo) / PAGE, f))
        .collect()
}

#[track_caller]
fn assert_flags(t: &mut dyn Target, want: &[(u64, u64, &str)]) {
    let want: Vec<(u64, u64, Vec<String>)> = want
        .iter()
        .map(|&(s, e, f)| {
            let mut v: Vec<String> = f.split_whitespace().map(str::to_string).collect();
            v.sort();
            (s, e, v)
        })
        .collect();
    assert_eq!(flags_layout(t), want, "[{}] flags\n{}", t.name(), dump(t));
}

/// Which of `n` pages from `addr` are resident (`mincore`).
fn resident(t: &mut dyn Target, addr: u64, n: u64) -> Vec<bool> {
    match t.aspace() {
        Some(mm) => mm.mincore(addr, n * PAGE).expect("aspace mincore"),
        None => t.resident(addr, n).expect("kernel mincore"),
    }
}

const PRIV_RW: &str = "rd wr mr mw me ac";

#[test]
fn mmap_ignores_unknown_flag_bits() {
    on_both(8, |t| {
        let r = t.region();
        for (i, extra) in [
            0x80_0000,
            0x4000_0000,
            MAP_UNINITIALIZED,
            MAP_DENYWRITE | MAP_EXECUTABLE,
        ]
        .into_iter()
        .enumerate()
        {
            let a = r.page(2 * i as u64);
            assert_eq!(
                t.mmap(a, PAGE, RW, ANON | MAP_FIXED | extra),
                Ok(a),
                "{extra:#x}"
            );
        }
        assert_flags(
            t,
            &[
                (0, 1, PRIV_RW),
                (2, 3, PRIV_RW),
                (4, 5, PRIV_RW),
                (6, 7, PRIV_RW),
            ],
        );
    });
}

#[test]
fn mmap_type_field_takes_only_shared_or_private_for_anonymous_memory() {
    on_both(4, |t| {
        let a = t.region().page(0);
        for ty in [0, MAP_SHARED_VALIDATE, 0x04, 0x06, 0x0c | MAP_PRIVATE, 0x0f] {
            assert_eq!(
                t.mmap(a, PAGE, RW, MAP_ANONYMOUS | MAP_FIXED | ty),
                Err(EINVAL),
                "type {ty:#x}"
            );
        }
        // MAP_SHARED_VALIDATE rejects unknown bits and MAP_SYNC, but for
        // anonymous memory the type alone already fails.
        for extra in [MAP_SYNC, 0x80_0000, MAP_STACK] {
            let f = MAP_SHARED_VALIDATE | MAP_ANONYMOUS | MAP_FIXED | extra;
            assert_eq!(t.mmap(a, PAGE, RW, f), Err(EINVAL), "validate {extra:#x}");
        }
        assert_layout(t, &[]);
    });
}

#[test]
fn map_hugetlb_without_a_huge_page_pool() {
    on_both(4, |t| {
        // Placed by the kernel: fails before any mapping is made.
        let f = ANON | MAP_HUGETLB;
        assert_eq!(t.mmap(0, PAGE, RW, f), Err(ENOMEM));
        assert_eq!(t.mmap(0, 0, RW, f), Err(EINVAL));
        assert_eq!(t.mmap(0, PAGE, RW, f | (30 << MAP_HUGE_SHIFT)), Err(ENOMEM));
        assert_eq!(t.mmap(0, PAGE, RW, f | (21 << MAP_HUGE_SHIFT)), Err(ENOMEM));
        assert_eq!(t.mmap(0, PAGE, RW, f | (25 << MAP_HUGE_SHIFT)), Err(EINVAL));
        assert_eq!(t.mmap(0, PAGE, RW, f | (12 << MAP_HUGE_SHIFT)), Err(EINVAL));
        // A hugetlb file takes MAP_SHARED_VALIDATE.
        let v = MAP_SHARED_VALIDATE | MAP_ANONYMOUS | MAP_HUGETLB;
        assert_eq!(t.mmap(0, PAGE, RW, v), Err(ENOMEM));
        // A fixed address must be aligned to the huge page size (the
        // region's pages are not 2 MiB aligned).
        let a = t.region().page(0);
        assert_ne!(a % (2 << 20), 0);
        assert_eq!(t.mmap(a, PAGE, RW, f | MAP_FIXED), Err(EINVAL));
        assert_layout(t, &[]);
    });
}

#[test]
fn map_stack_sets_nohugepage_which_keeps_vmas_apart() {
    on_both(8, |t| {
        let r = t.region();
        let (a, b, c) = (r.page(0), r.page(1), r.page(2));
        assert_eq!(t.mmap(a, PAGE, RW, ANON | MAP_FIXED | MAP_STACK), Ok(a));
        assert_eq!(t.mmap(b, PAGE, RW, ANON | MAP_FIXED | MAP_STACK), Ok(b));
        assert_eq!(t.mmap(c, PAGE, RW, ANON | MAP_FIXED), Ok(c));
        let s = r.page(5);
        let gd = ANON | MAP_FIXED | MAP_GROWSDOWN | MAP_STACK;
        assert_eq!(t.mmap(s, PAGE, RW, gd), Ok(s));
        assert_flags(
            t,
            &[
                (0, 2, "rd wr mr mw me ac nh"),
                (2, 3, PRIV_RW),
                (5, 6, "rd wr mr mw me gd ac nh"),
            ],
        );
    });
}

#[test]
fn map_sync_is_recorded_on_anonymous_memory() {
    on_both(8, |t| {
        let r = t.region();
        let (a, b) = (r.page(0), r.page(1));
        assert_eq!(t.mmap(a, PAGE, RW, ANON | MAP_FIXED | MAP_SYNC), Ok(a));
        assert_eq!(t.mmap(b, PAGE, RW, ANON | MAP_FIXED), Ok(b));
        let s = r.page(3);
        assert_eq!(
            t.mmap(s, PAGE, RW, SHARED_ANON | MAP_FIXED | MAP_SYNC),
            Ok(s)
        );
        assert_flags(
            t,
            &[
                (0, 1, "rd wr mr mw me ac sf"),
                (1, 2, PRIV_RW),
                (3, 4, "rd wr sh mr mw me ms sf"),
            ],
        );
    });
}

#[test]
fn map_locked_locks_and_populates() {
    on_both(8, |t| {
        let r = t.region();
        let (a, n) = (r.page(0), r.page(4));
        assert_eq!(
            t.mmap(a, 3 * PAGE, RW, ANON | MAP_FIXED | MAP_LOCKED),
            Ok(a)
        );
        assert_eq!(
            t.mmap(n, PAGE, PROT_NONE, ANON | MAP_FIXED | MAP_LOCKED),
            Ok(n)
        );
        assert_eq!(t.mmap(r.page(3), PAGE, RW, ANON | MAP_FIXED), Ok(r.page(3)));
        assert_flags(
            t,
            &[
                (0, 3, "rd wr mr mw me lo ac"),
                (3, 4, PRIV_RW),
                (4, 5, "mr mw me lo"),
            ],
        );
        assert_eq!(resident(t, a, 4), [true, true, true, false]);
        if let Some(mm) = t.aspace() {
            let v = mm.vmas().into_iter().find(|v| v.start == a).unwrap();
            // `sd`: aspace tracks soft-dirty (CONFIG_MEM_SOFT_DIRTY).
            assert_eq!(v.smaps_vmflags(), "VmFlags: rd wr mr mw me lo ac sd ");
        }
        // Locked pages cannot be dropped: EINVAL at the locked VMA.
        assert_eq!(t.madvise(r.page(3), 2 * PAGE, MADV_DONTNEED), Err(EINVAL));
        assert_eq!(t.madvise(a, PAGE, MADV_DONTNEED), Err(EINVAL));
    });
}

#[test]
fn map_populate_with_nonblock_does_not_populate() {
    on_both(4, |t| {
        let a = t.region().page(0);
        let f = ANON | MAP_FIXED | MAP_POPULATE | MAP_NONBLOCK;
        assert_eq!(t.mmap(a, 2 * PAGE, RW, f), Ok(a));
        assert_eq!(resident(t, a, 2), [false, false]);
        let b = t.region().page(2);
        assert_eq!(
            t.mmap(b, 2 * PAGE, RW, ANON | MAP_FIXED | MAP_POPULATE),
            Ok(b)
        );
        assert_eq!(resident(t, b, 2), [true, true]);
    });
}

#[test]
fn map_32bit_places_below_2_gib() {
    on_both(4, |t| {
        // A hint above 2 GiB (a free page of the region) is not used.
        let hint = t.region().page(0);
        let a = t.mmap(hint, 2 * PAGE, RW, ANON | MAP_32BIT).unwrap();
        assert!(
            (0x4000_0000..0x8000_0000).contains(&a),
            "[{}] {a:#x}",
            t.name()
        );
        assert_eq!(t.unmap_outside(a, 2 * PAGE), Ok(()));
        // With MAP_FIXED the address is used as given.
        let f = ANON | MAP_32BIT | MAP_FIXED;
        assert_eq!(t.mmap(hint, PAGE, RW, f), Ok(hint));
        assert_layout(t, &[(0, 1, "rw-p")]);
    });
    // Without randomization, aspace takes the lowest fit from 1 GiB, or a
    // free hint below 2 GiB.
    let mm = AddressSpace::new(Config::default());
    let f = MapFlags::PRIVATE | MapFlags::ANONYMOUS | MapFlags::BIT32;
    assert_eq!(mm.mmap(0, PAGE, Prot::READ, f), Ok(0x4000_0000));
    assert_eq!(mm.mmap(0x1000_0000, PAGE, Prot::READ, f), Ok(0x1000_0000));
    assert_eq!(
        mm.mmap(0x7fff_f000, 2 * PAGE, Prot::READ, f),
        Ok(0x4000_1000)
    );
    assert_eq!(
        mm.mmap(0, 1 << 31, Prot::READ, f),
        Err(aspace::Error::NoMem)
    );
}

// ---------------------------------------------------------------- madvise

const MADV_RANDOM: i32 = 1;
const MADV_SEQUENTIAL: i32 = 2;
const MADV_WILLNEED: i32 = 3;
const MADV_FREE: i32 = 8;
const MADV_REMOVE: i32 = 9;
const MADV_DONTFORK: i32 = 10;
const MADV_DOFORK: i32 = 11;
const MADV_HUGEPAGE: i32 = 14;
const MADV_NOHUGEPAGE: i32 = 15;
const MADV_WIPEONFORK: i32 = 18;
const MADV_KEEPONFORK: i32 = 19;
const MADV_POPULATE_READ: i32 = 22;
const MADV_POPULATE_WRITE: i32 = 23;
const MADV_DONTNEED_LOCKED: i32 = 24;

/// Interior pages 0-1 private rw, a hole at 2, 3 private read-only, 4
/// private inaccessible, 5 shared rw.
fn madvise_setup(t: &mut dyn Target) {
    let r = t.region();
    let f = ANON | MAP_FIXED;
    assert_eq!(t.mmap(r.page(0), 2 * PAGE, RW, f), Ok(r.page(0)));
    assert_eq!(t.mmap(r.page(3), PAGE, PROT_READ, f), Ok(r.page(3)));
    assert_eq!(t.mmap(r.page(4), PAGE, PROT_NONE, f), Ok(r.page(4)));
    let s = SHARED_ANON | MAP_FIXED;
    assert_eq!(t.mmap(r.page(5), PAGE, RW, s), Ok(r.page(5)));
}

#[test]
fn madvise_flag_advice_splits_merges_and_reports_holes() {
    on_both(8, |t| {
        madvise_setup(t);
        let r = t.region();
        let p = |i: u64| r.page(i);
        let (p0, p1, p3, p4, p5) = (p(0), p(1), p(3), p(4), p(5));
        assert_eq!(t.madvise(p0, 5 * PAGE, MADV_WIPEONFORK), Err(ENOMEM));
        assert_eq!(t.madvise(p5, PAGE, MADV_WIPEONFORK), Err(EINVAL));
        assert_eq!(t.madvise(p1, PAGE, MADV_KEEPONFORK), Ok(()));
        assert_eq!(t.madvise(p0, 6 * PAGE, MADV_DONTFORK), Err(ENOMEM));
        assert_eq!(t.madvise(p0, PAGE, MADV_DOFORK), Ok(()));
        assert_eq!(t.madvise(p3, 3 * PAGE, MADV_HUGEPAGE), Ok(()));
        assert_eq!(t.madvise(p4, PAGE, MADV_NOHUGEPAGE), Ok(()));
        assert_eq!(t.madvise(p0, PAGE, MADV_RANDOM), Ok(()));
        assert_eq!(t.madvise(p1, PAGE, MADV_SEQUENTIAL), Ok(()));
        assert_flags(
            t,
            &[
                (0, 1, "rd wr mr mw me rr ac wf"),
                (1, 2, "rd wr mr mw me sr dc ac"),
                (3, 4, "rd mr mw me dc wf hg"),
                (4, 5, "mr mw me dc wf nh"),
                (5, 6, "rd wr sh mr mw me ms dc hg"),
            ],
        );
        assert_eq!(t.madvise(p0, 2 * PAGE, MADV_NORMAL), Ok(()));
        assert_eq!(t.madvise(p0, 2 * PAGE, MADV_KEEPONFORK), Ok(()));
        assert_eq!(t.madvise(p1, PAGE, MADV_DOFORK), Ok(()));
        // Back to the same flags: the two pages merge again.
        assert_flags(
            t,
            &[
                (0, 2, PRIV_RW),
                (3, 4, "rd mr mw me dc wf hg"),
                (4, 5, "mr mw me dc wf nh"),
                (5, 6, "rd wr sh mr mw me ms dc hg"),
            ],
        );
        assert_eq!(t.madvise(p0, 6 * PAGE, MADV_HUGEPAGE), Err(ENOMEM));
        assert_eq!(t.madvise(p0, 6 * PAGE, MADV_WILLNEED), Err(ENOMEM));
        assert_eq!(t.madvise(p0, 2 * PAGE, MADV_WILLNEED), Ok(()));
    });
}

#[test]
fn madvise_free_remove_and_dontneed_locked() {
    on_both(8, |t| {
        madvise_setup(t);
        let r = t.region();
        let p = |i: u64| r.page(i);
        let (p0, p3, p5) = (p(0), p(3), p(5));
        assert_eq!(t.madvise(p0, PAGE, MADV_REMOVE), Err(EINVAL));
        assert_eq!(t.madvise(p3, 3 * PAGE, MADV_REMOVE), Err(EINVAL));
        assert_eq!(t.write(p5, b"shared"), Ok(()));
        assert_eq!(t.madvise(p5, PAGE, MADV_REMOVE), Ok(()));
        assert_eq!(read_vec(t, p5, 6), Ok(vec![0; 6]));
        // VM_MAYWRITE stays after mprotect: still allowed.
        assert_eq!(t.mprotect(p5, PAGE, PROT_READ), Ok(()));
        assert_eq!(t.madvise(p5, PAGE, MADV_REMOVE), Ok(()));
        assert_eq!(t.madvise(p5, PAGE, MADV_FREE), Err(EINVAL));
        assert_eq!(t.madvise(p0, 3 * PAGE, MADV_FREE), Err(ENOMEM));
        assert_eq!(t.madvise(p3, PAGE, MADV_FREE), Ok(()));
        assert_layout(
            t,
            &[
                (0, 2, "rw-p"),
                (3, 4, "r--p"),
                (4, 5, "---p"),
                (5, 6, "r--s"),
            ],
        );
    });
}

#[test]
fn madvise_on_locked_memory() {
    on_both(8, |t| {
        let r = t.region();
        let a = r.page(0);
        assert_eq!(
            t.mmap(a, 2 * PAGE, RW, ANON | MAP_FIXED | MAP_LOCKED),
            Ok(a)
        );
        assert_eq!(t.write(a, b"locked"), Ok(()));
        assert_eq!(t.madvise(a, PAGE, MADV_DONTNEED), Err(EINVAL));
        assert_eq!(t.madvise(a, PAGE, MADV_FREE), Err(EINVAL));
        assert_eq!(t.madvise(a, PAGE, MADV_REMOVE), Err(EINVAL));
        assert_eq!(read_vec(t, a, 6), Ok(b"locked".to_vec()));
        assert_eq!(t.madvise(a, PAGE, MADV_DONTNEED_LOCKED), Ok(()));
        assert_eq!(read_vec(t, a, 6), Ok(vec![0; 6]));
        assert_eq!(t.madvise(a, 3 * PAGE, MADV_DONTNEED_LOCKED), Err(ENOMEM));
    });
}

#[test]
fn madvise_populate_read_and_write() {
    on_both(8, |t| {
        madvise_setup(t);
        let r = t.region();
        let p = |i: u64| r.page(i);
        let (p0, p3, p4, p5) = (p(0), p(3), p(4), p(5));
        assert_eq!(t.madvise(p0, 4 * PAGE, MADV_POPULATE_WRITE), Err(ENOMEM));
        // The pages before the hole were populated, for writing.
        assert_eq!(resident(t, p0, 2), [true, true]);
        assert_eq!(t.madvise(p3, PAGE, MADV_POPULATE_WRITE), Err(EINVAL));
        assert_eq!(t.madvise(p3, PAGE, MADV_POPULATE_READ), Ok(()));
        assert_eq!(t.madvise(p4, PAGE, MADV_POPULATE_READ), Err(EINVAL));
        assert_eq!(t.madvise(p3, 3 * PAGE, MADV_POPULATE_READ), Err(EINVAL));
        assert_eq!(t.madvise(p5, PAGE, MADV_POPULATE_WRITE), Ok(()));
        assert_eq!(t.madvise(p(2), 2 * PAGE, MADV_POPULATE_READ), Err(ENOMEM));
        assert_eq!(t.madvise(p0 + 1, PAGE, MADV_POPULATE_READ), Err(EINVAL));
    });
}

/// A one-byte load through a pipe (`copy_from_user`), for forked
/// children: the byte, or None on EFAULT.
fn kernel_load(pipe: [libc::c_int; 2], addr: u64) -> Option<u8> {
    let mut b = 0u8;
    // SAFETY: `pipe` is an open pipe; the write reads one byte at `addr`
    // (the kernel checks it and returns EFAULT for a bad address), the
    // read stores into a local.
    unsafe {
        if libc::write(pipe[1], addr as *const libc::c_void, 1) != 1 {
            return None;
        }
        libc::read(pipe[0], (&mut b as *mut u8).cast(), 1);
    }
    Some(b)
}

#[test]
fn fork_honours_dontfork_and_wipeonfork() {
    // Pages 0-1 DONTFORK, 2 WIPEONFORK, 3 plain; each written with 7.
    let setup = |t: &mut dyn Target| {
        let r = t.region();
        assert_eq!(
            t.mmap(r.page(0), 4 * PAGE, RW, ANON | MAP_FIXED),
            Ok(r.page(0))
        );
        for i in 0..4 {
            assert_eq!(t.write(r.page(i), &[7]), Ok(()));
        }
        assert_eq!(t.madvise(r.page(0), 2 * PAGE, MADV_DONTFORK), Ok(()));
        assert_eq!(t.madvise(r.page(2), PAGE, MADV_WIPEONFORK), Ok(()));
    };
    // What the child sees at pages 1, 2, 3 (None: no mapping), and its
    // layout.
    let want_loads = [None, Some(0), Some(7)];
    let want_layout = |r: &Region| {
        vec![
            (r.page(2), r.page(3), "rw-p".to_string()),
            (r.page(3), r.page(4), "rw-p".to_string()),
        ]
    };
    let region = match KernelTarget::new(8) {
        Some(mut k) => {
            setup(&mut k);
            let r = k.region();
            let (res, maps) = in_forked_child(|pipe| {
                let mut out = [0u8; 64];
                for (i, p) in [1, 2, 3].into_iter().enumerate() {
                    out[2 * i] = kernel_load(pipe, r.page(p)).is_some() as u8;
                    out[2 * i + 1] = kernel_load(pipe, r.page(p)).unwrap_or(0);
                }
                (out, 6)
            });
            let loads: Vec<Option<u8>> =
                res.chunks(2).map(|c| (c[0] == 1).then_some(c[1])).collect();
            assert_eq!(loads, want_loads, "kernel child loads");
            assert_eq!(interior(&maps, &r), want_layout(&r), "kernel child layout");
            r
        }
        None => Region::new(aspace_target::DEFAULT_REGION_START, 8),
    };
    let mut t = AspaceTarget::new(region);
    setup(&mut t);
    let child = t.mm.fork().unwrap();
    let loads: Vec<Option<u8>> = [1, 2, 3]
        .into_iter()
        .map(|p| {
            let mut b = [0u8];
            child.read(region.page(p), &mut b).ok().map(|_| b[0])
        })
        .collect();
    assert_eq!(loads, want_loads, "aspace child loads");
    assert_eq!(interior(&child.maps(), &region), want_layout(&region));
    // The parent keeps its data and flags.
    let mut b = [0u8];
    t.mm.read(region.page(2), &mut b).unwrap();
    assert_eq!(b, [7]);
}

// ---------------------------------------------------------------- mlock, mincore, msync

const MLOCK_ONFAULT: u32 = 1;

/// Panics unless `[addr, addr + len)` (page-rounded as mlock rounds it)
/// lies in `t`'s region: the kernel calls below act on this process.
fn assert_in_region(t: &dyn Target, addr: u64, len: u64) {
    let r = t.region();
    let start = addr & !(PAGE - 1);
    // A length that wraps when rounded makes the kernel do nothing.
    let Some(l) = len.checked_add(addr - start).and_then(page_align) else {
        return;
    };
    assert!(
        start >= r.start && start + l <= r.end,
        "test bug: {addr:#x}+{len:#x} is outside the region"
    );
}

fn errno_of(rc: libc::c_long) -> Res<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap())
    }
}

#[test]
fn mlock_locks_populates_and_stops_at_holes() {
    on_both(8, |t| {
        madvise_setup(t);
        let r = t.region();
        let p = |i: u64| r.page(i);
        // An inaccessible VMA is locked but cannot be populated: ENOMEM.
        assert_eq!(t.mlock2(p(4), PAGE, 0), Err(ENOMEM));
        assert_eq!(t.mlock2(p(3), 3 * PAGE, 0), Err(ENOMEM));
        assert_eq!(resident(t, p(3), 3), [true, false, false]);
        // An unaligned start is rounded down.
        assert_eq!(t.mlock2(p(0) + 100, 10, 0), Ok(()));
        assert_eq!(resident(t, p(0), 2), [true, false]);
        // A hole: the VMA before it is locked, then ENOMEM.
        assert_eq!(t.mlock2(p(0), 3 * PAGE, 0), Err(ENOMEM));
        assert_eq!(t.mlock2(p(2), 2 * PAGE, 0), Err(ENOMEM));
        assert_flags(
            t,
            &[
                (0, 2, "rd wr mr mw me lo ac"),
                (3, 4, "rd mr mw me lo"),
                (4, 5, "mr mw me lo"),
                (5, 6, "rd wr sh mr mw me ms lo"),
            ],
        );
        assert_eq!(t.munlock(p(0), 6 * PAGE), Err(ENOMEM));
        assert_flags(
            t,
            &[
                (0, 2, PRIV_RW),
                (3, 4, "rd mr mw me lo"),
                (4, 5, "mr mw me lo"),
                (5, 6, "rd wr sh mr mw me ms lo"),
            ],
        );
        assert_eq!(t.munlock(p(3), 3 * PAGE), Ok(()));
        assert_eq!(t.mlock2(p(2), 0, 0), Ok(()));
        assert_eq!(t.mlock2(p(0), u64::MAX, 0), Ok(()));
    });
}

#[test]
fn mlock2_onfault_locks_without_populating() {
    on_both(8, |t| {
        let r = t.region();
        let a = r.page(0);
        assert_eq!(t.mmap(a, 2 * PAGE, RW, ANON | MAP_FIXED), Ok(a));
        assert_eq!(t.mlock2(a, 2 * PAGE, 2), Err(EINVAL));
        assert_eq!(t.mlock2(a, 0, 2), Err(EINVAL));
        assert_eq!(t.mlock2(a, 2 * PAGE, MLOCK_ONFAULT), Ok(()));
        assert_eq!(resident(t, a, 2), [false, false]);
        assert_flags(t, &[(0, 2, "rd wr mr mw me lo lf ac")]);
        // A plain lock over an on-fault one populates.
        assert_eq!(t.mlock2(a, PAGE, 0), Ok(()));
        assert_eq!(resident(t, a, 2), [true, false]);
        assert_flags(
            t,
            &[
                (0, 1, "rd wr mr mw me lo ac"),
                (1, 2, "rd wr mr mw me lo lf ac"),
            ],
        );
        assert_eq!(t.munlock(a, 2 * PAGE), Ok(()));
        assert_flags(t, &[(0, 2, PRIV_RW)]);
    });
}

#[test]
fn mincore_reports_resident_pages_and_holes() {
    on_both(12, |t| {
        madvise_setup(t);
        let r = t.region();
        let p = |i: u64| r.page(i);
        assert_eq!(t.mincore(p(0) + 1, PAGE), Err(EINVAL));
        assert_eq!(t.mincore(p(0), 3 * PAGE), Err(ENOMEM));
        assert_eq!(t.mincore(p(2), 0), Ok(vec![]));
        assert_eq!(t.mincore(TASK_SIZE - PAGE, 2 * PAGE), Err(ENOMEM));
        assert_eq!(t.write(p(1), b"x"), Ok(()));
        assert_eq!(read_vec(t, p(3), 1), Ok(vec![0]));
        assert_eq!(t.mincore(p(0), 1), Ok(vec![false]));
        assert_eq!(t.mincore(p(0), 2 * PAGE), Ok(vec![false, true]));
        // The zero page counts; a shared object's page stays resident in
        // the object after its entry is dropped.
        assert_eq!(t.mincore(p(3), PAGE), Ok(vec![true]));
        let s = p(8);
        assert_eq!(t.mmap(s, 2 * PAGE, RW, SHARED_ANON | MAP_FIXED), Ok(s));
        assert_eq!(t.write(s, b"s"), Ok(()));
        assert_eq!(t.madvise(s, 2 * PAGE, MADV_DONTNEED), Ok(()));
        assert_eq!(t.mincore(s, 2 * PAGE), Ok(vec![true, false]));
    });
}

/// mincore allocates one entry per page of whatever range it is given: a
/// huge mapping must give an errno, not a host allocation of its size
/// (a 64 TiB PROT_NONE mapping used to abort the process: "memory
/// allocation of 17179869184 bytes failed").
#[test]
fn mincore_of_a_huge_range_is_refused_not_allocated() {
    const TIB: u64 = 1 << 40;
    let none = MapFlags::PRIVATE | MapFlags::ANONYMOUS | MapFlags::NORESERVE;
    // A 1 MiB budget: 8 GiB of pages is 2 MiB of entries.
    let small = AddressSpace::new(Config {
        memory_budget: 1 << 20,
        ..Config::default()
    });
    let a = small.mmap(0, 8 << 30, Prot::NONE, none).unwrap();
    assert_eq!(small.mincore(a, 8 << 30), Err(aspace::Error::NoMem));
    assert_eq!(small.mincore(a, 1 << 30).map(|v| v.len()), Ok(1 << 18));
    // 64 TiB PROT_NONE: 16 GiB of entries, past the default 4 GiB budget.
    let mm = AddressSpace::new(Config::default());
    let a = mm.mmap(0, 64 * TIB, Prot::NONE, none).unwrap();
    assert_eq!(mm.mincore(a, 64 * TIB), Err(aspace::Error::NoMem));
    let tail = a + 64 * TIB - 4 * PAGE;
    assert_eq!(mm.mincore(tail, 4 * PAGE), Ok(vec![false; 4]));
    // The caller's buffer is the bound: too short is EFAULT, as for a
    // vector the kernel cannot write, before any page is looked at.
    let mut buf = vec![true; 1 << 20];
    assert_eq!(
        mm.mincore_into(a, 64 * TIB, &mut buf),
        Err(aspace::Error::Fault)
    );
    assert!(buf.iter().all(|&b| b), "nothing written on EFAULT");
    // Read in pieces of the caller's size, the last one included.
    mm.mprotect(tail, 4 * PAGE, Prot::READ).unwrap();
    let mut b = [0u8];
    mm.read(tail + 2 * PAGE, &mut b).unwrap();
    let start = a + 64 * TIB - (1 << 20) * PAGE;
    assert_eq!(mm.mincore_into(start, (1 << 20) * PAGE, &mut buf), Ok(()));
    let present: Vec<usize> = (0..buf.len()).filter(|&i| buf[i]).collect();
    assert_eq!(present, vec![(1 << 20) - 2]);
}

/// A range with a hole: ENOMEM, and the entries before the hole are
/// written (the kernel copies out each VMA's part before looking up the
/// next), those after it left alone. A vector too short is EFAULT.
#[test]
fn mincore_into_stops_at_a_hole_like_the_kernel() {
    // Per page: Some(resident) where written, None where left alone.
    let mut want: Option<Vec<Option<bool>>> = None;
    if let Some(mut k) = KernelTarget::new(8) {
        let r = k.region();
        assert_eq!(
            k.mmap(r.page(0), 2 * PAGE, RW, ANON | MAP_FIXED),
            Ok(r.page(0))
        );
        assert_eq!(k.write(r.page(1), b"x"), Ok(()));
        let mut v = [0xaau8; 4];
        // SAFETY: mincore reads this process's page tables and writes at
        // most 4 bytes into `v`.
        let rc = unsafe {
            libc::mincore(
                r.page(0) as *mut libc::c_void,
                (4 * PAGE) as usize,
                v.as_mut_ptr(),
            )
        };
        let err = std::io::Error::last_os_error().raw_os_error();
        assert_eq!((rc, err), (-1, Some(ENOMEM)), "kernel");
        want = Some(
            v.iter()
                .map(|&b| (b != 0xaa).then_some(b & 1 != 0))
                .collect(),
        );
        // The vector in an inaccessible page of the region: EFAULT.
        // SAFETY: as above; the kernel checks the vector's address.
        let rc = unsafe {
            libc::mincore(
                r.page(0) as *mut libc::c_void,
                PAGE as usize,
                r.page(4) as *mut u8,
            )
        };
        let err = std::io::Error::last_os_error().raw_os_error();
        assert_eq!((rc, err), (-1, Some(EFAULT)), "kernel");
    }
    let want = want.unwrap_or(vec![Some(false), Some(true), None, None]);
    let mm = AddressSpace::new(Config::default());
    let rw = Prot::READ | Prot::WRITE;
    let a = mm
        .mmap(0, 2 * PAGE, rw, MapFlags::PRIVATE | MapFlags::ANONYMOUS)
        .unwrap();
    mm.munmap(a + 2 * PAGE, 2 * PAGE).unwrap();
    mm.write(a + PAGE, b"x").unwrap();
    let run = |fill: bool| {
        let mut v = [fill; 4];
        assert_eq!(
            mm.mincore_into(a, 4 * PAGE, &mut v),
            Err(aspace::Error::NoMem)
        );
        v
    };
    let (t, f) = (run(true), run(false));
    let got: Vec<Option<bool>> = (0..4).map(|i| (t[i] == f[i]).then_some(t[i])).collect();
    assert_eq!(got, want);
    assert_eq!(mm.mincore_into(a, PAGE, &mut []), Err(aspace::Error::Fault));
}

#[test]
fn msync_argument_checks_and_holes() {
    const MS_ASYNC: u32 = 1;
    const MS_INVALIDATE: u32 = 2;
    const MS_SYNC: u32 = 4;
    on_both(12, |t| {
        madvise_setup(t);
        let r = t.region();
        let p = |i: u64| r.page(i);
        assert_eq!(t.msync(p(0), PAGE, 8), Err(EINVAL));
        assert_eq!(t.msync(p(0), PAGE, MS_ASYNC | MS_SYNC), Err(EINVAL));
        assert_eq!(t.msync(p(0) + 1, PAGE, MS_SYNC), Err(EINVAL));
        assert_eq!(t.msync(p(0), PAGE, 0), Ok(()));
        assert_eq!(t.msync(p(0), 3 * PAGE, MS_ASYNC), Err(ENOMEM));
        assert_eq!(t.msync(p(0), 3 * PAGE, MS_SYNC), Err(ENOMEM));
        assert_eq!(t.msync(p(2), 2 * PAGE, MS_SYNC), Err(ENOMEM));
        assert_eq!(t.msync(p(2), 0, MS_SYNC), Ok(()));
        assert_eq!(t.msync(p(0), u64::MAX, MS_SYNC), Ok(()));
        assert_eq!(t.msync(p(5), 4 * PAGE, MS_SYNC), Err(ENOMEM));
        assert_eq!(t.msync(p(8), 2 * PAGE, MS_SYNC), Err(ENOMEM));
        assert_eq!(t.msync(p(3), 3 * PAGE, MS_SYNC | MS_INVALIDATE), Ok(()));
        assert_eq!(t.mlock2(p(0), PAGE, 0), Ok(()));
        assert_eq!(t.msync(p(0), PAGE, MS_INVALIDATE), Err(16));
        assert_eq!(t.msync(p(0), PAGE, MS_SYNC), Ok(()));
    });
}

#[test]
fn mlockall_current_onfault_and_future() {
    const MCL_CURRENT: i32 = 1;
    const MCL_FUTURE: i32 = 2;
    const MCL_ONFAULT: i32 = 4;
    // In a forked child (mlockall acts on the whole process): lock the
    // current mappings on fault, then make future ones locked, map two
    // pages, and report smaps; the expected flags of the region's VMAs.
    let want: Vec<Vec<&str>> = vec![
        vec!["ac", "lf", "lo", "me", "mr", "mw", "rd", "wr"],
        vec!["ac", "lo", "me", "mr", "mw", "rd", "wr"],
    ];
    let want: Vec<Vec<String>> = want
        .into_iter()
        .map(|v| v.into_iter().map(String::from).collect())
        .collect();
    let region = match KernelTarget::new(8) {
        Some(mut k) => {
            let r = k.region();
            assert_eq!(k.mmap(r.page(0), PAGE, RW, ANON | MAP_FIXED), Ok(r.page(0)));
            let (res, smaps) = in_forked_child_reporting(c"/proc/self/smaps", |_| {
                let mut out = [0u8; 64];
                // SAFETY: mlockall and mmap on this child's own memory;
                // the mapping is MAP_FIXED inside the test region.
                unsafe {
                    out[0] = libc::mlockall(MCL_ONFAULT) as u8;
                    out[1] = libc::mlockall(MCL_CURRENT | MCL_ONFAULT) as u8;
                    out[2] = libc::mlockall(MCL_FUTURE) as u8;
                    let p = libc::mmap(
                        r.page(2) as *mut libc::c_void,
                        PAGE as usize,
                        RW as i32,
                        (ANON | MAP_FIXED) as i32,
                        -1,
                        0,
                    );
                    out[3] = (p as u64 == r.page(2)) as u8;
                }
                (out, 4)
            });
            assert_eq!(res, [u8::MAX, 0, 0, 1], "kernel mlockall results");
            let flags: Vec<Vec<String>> = common::kernel::smaps_flags_in(&smaps, r.lo, r.hi)
                .into_iter()
                .map(|(_, _, f)| comparable_flags(f))
                .collect();
            assert_eq!(flags, want, "kernel child");
            r
        }
        None => Region::new(aspace_target::DEFAULT_REGION_START, 8),
    };
    use aspace::MlockAllFlags as M;
    let t = AspaceTarget::new(region);
    let mm = &t.mm;
    let f = MapFlags::PRIVATE | MapFlags::ANONYMOUS | MapFlags::FIXED;
    mm.mmap(region.page(0), PAGE, Prot::READ | Prot::WRITE, f)
        .unwrap();
    assert_eq!(mm.mlockall(M::ONFAULT), Err(aspace::Error::Inval));
    assert_eq!(mm.mlockall(M::CURRENT | M::ONFAULT), Ok(()));
    assert_eq!(mm.mlockall(M::FUTURE), Ok(()));
    mm.mmap(region.page(2), PAGE, Prot::READ | Prot::WRITE, f)
        .unwrap();
    let flags: Vec<Vec<String>> = mm
        .vmas()
        .into_iter()
        .filter(|v| v.start >= region.lo && v.end <= region.hi)
        .map(|v| common::aspace_target::mnemonics(v.flags))
        .collect();
    assert_eq!(flags, want, "aspace");
    // The future lock populated the new mapping; munlockall clears all.
    assert_eq!(mm.mincore(region.page(2), PAGE), Ok(vec![true]));
    assert_eq!(mm.munlockall(), Ok(()));
    assert!(mm
        .vmas()
        .iter()
        .all(|v| !v.flags.contains(aspace::VmFlags::LOCKED)));
    let g = mm
        .mmap(0, PAGE, Prot::READ, MapFlags::PRIVATE | MapFlags::ANONYMOUS)
        .unwrap();
    assert!(!mm
        .vma_at(g)
        .unwrap()
        .flags
        .contains(aspace::VmFlags::LOCKED));
}

// ---------------------------------------------------------------- [heap]

/// `start_brk` of this process (field 47 of /proc/self/stat).
fn start_brk() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(47 - 3)?.parse().ok()
}

/// The path column of the maps line of the VMA containing `addr`.
fn label_at(maps: &str, addr: u64) -> Option<String> {
    maps.lines().find_map(|l| {
        let v = parse_maps_line(l)?;
        (v.start <= addr && addr < v.end)
            .then(|| l.split_whitespace().nth(5).unwrap_or("").to_string())
    })
}

#[test]
fn a_vma_that_ends_at_the_heap_start_is_not_the_heap() {
    // The kernel, in a forked child (other threads of this process may
    // move the break): a read-only page right below start_brk.
    if let Some(sb) = start_brk().filter(|&b| b % PAGE == 0) {
        let (res, maps) = in_forked_child(|_| {
            let mut out = [0u8; 64];
            // SAFETY: MAP_FIXED_NOREPLACE maps only where nothing is (it
            // fails with EEXIST otherwise); no Rust object lives in a free
            // range.
            let p = unsafe {
                libc::mmap(
                    (sb - PAGE) as *mut libc::c_void,
                    PAGE as usize,
                    libc::PROT_READ,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                    -1,
                    0,
                )
            };
            out[0] = (p as u64 == sb - PAGE) as u8;
            (out, 1)
        });
        if res[0] == 1 {
            assert_eq!(label_at(&maps, sb - PAGE).as_deref(), Some(""), "kernel");
        }
    }
    let mm = AddressSpace::new(Config::default());
    let sb = Config::default().brk_start;
    let f = MapFlags::PRIVATE | MapFlags::ANONYMOUS | MapFlags::FIXED;
    mm.mmap(sb - PAGE, PAGE, Prot::READ, f).unwrap();
    // An empty heap: nothing is the heap.
    assert_eq!(label_at(&mm.maps(), sb - PAGE).as_deref(), Some(""));
    assert_eq!(mm.brk(sb + 2 * PAGE), Ok(sb + 2 * PAGE));
    assert_eq!(label_at(&mm.maps(), sb).as_deref(), Some("[heap]"));
    assert_eq!(label_at(&mm.maps(), sb - PAGE).as_deref(), Some(""));
    // Nor is a VMA that starts at the break.
    mm.mmap(sb + 2 * PAGE, PAGE, Prot::READ, f).unwrap();
    assert_eq!(label_at(&mm.maps(), sb + 2 * PAGE).as_deref(), Some(""));
}

// ---------------------------------------------------------------- names

/// `prctl(PR_SET_VMA, PR_SET_VMA_ANON_NAME)` (or `set_anon_name`).
fn set_name(t: &mut dyn Target, addr: u64, len: u64, name: Option<&str>) -> Res<()> {
    if let Some(mm) = t.aspace() {
        return mm.set_anon_name(addr, len, name).map_err(|e| e.errno());
    }
    assert_in_region(t, addr, len);
    let c = name.map(|n| std::ffi::CString::new(n).unwrap());
    let p = c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: the range is inside the test region (checked above); the
    // name is a valid C string or null; the call only names VMAs.
    let rc = unsafe { libc::prctl(libc::PR_SET_VMA, libc::PR_SET_VMA_ANON_NAME, addr, len, p) };
    errno_of(rc as libc::c_long)
}

/// (first page, end page, path column) of the interior's VMAs.
fn labels(t: &mut dyn Target) -> Vec<(u64, u64, String)> {
    let r = t.region();
    let maps = match t.aspace() {
        Some(mm) => mm.maps(),
        None => std::fs::read_to_string("/proc/self/maps").unwrap(),
    };
    maps.lines()
        .filter_map(|l| {
            let v = parse_maps_line(l)?;
            let path = l.split_whitespace().nth(5).unwrap_or("").to_string();
            (v.start >= r.lo && v.end <= r.hi)
                .then(|| ((v.start - r.lo) / PAGE, (v.end - r.lo) / PAGE, path))
        })
        .collect()
}

/// True if the running kernel names VMAs (`CONFIG_ANON_VMA_NAME`); says
/// on stderr when it does not.
fn kernel_names_vmas() -> bool {
    let Some(mut k) = KernelTarget::new(1) else {
        return false;
    };
    let a = k.region().page(0);
    assert_eq!(k.mmap(a, PAGE, RW, ANON | MAP_FIXED), Ok(a));
    let ok = set_name(&mut k, a, PAGE, Some("probe")) == Ok(());
    if !ok {
        eprintln!("kernel side skipped: this kernel has no CONFIG_ANON_VMA_NAME");
    }
    ok
}

#[test]
fn anon_names_split_merge_and_show_in_maps() {
    on_both_if(kernel_names_vmas(), 8, |t| {
        let r = t.region();
        let p = |i: u64| r.page(i);
        assert_eq!(t.mmap(p(0), 4 * PAGE, RW, ANON | MAP_FIXED), Ok(p(0)));
        assert_eq!(
            t.mmap(p(5), 2 * PAGE, RW, SHARED_ANON | MAP_FIXED),
            Ok(p(5))
        );
        assert_eq!(set_name(t, p(1), PAGE, Some("foo")), Ok(()));
        assert_eq!(set_name(t, p(2), PAGE, Some("foo")), Ok(()));
        assert_eq!(
            labels(t),
            [
                (0, 1, String::new()),
                (1, 3, "[anon:foo]".into()),
                (3, 4, String::new()),
                (5, 7, "/dev/zero".into())
            ]
        );
        // Over a hole: the mapped parts are named, then ENOMEM.
        assert_eq!(set_name(t, p(0), 7 * PAGE, Some("bar")), Err(ENOMEM));
        assert_eq!(
            labels(t),
            [
                (0, 4, "[anon:bar]".into()),
                (5, 7, "[anon_shmem:bar]".into())
            ]
        );
        // Clearing merges back; a new mapping merges only with the unnamed.
        assert_eq!(set_name(t, p(0), 4 * PAGE, None), Ok(()));
        assert_eq!(set_name(t, p(3), PAGE, Some("z")), Ok(()));
        assert_eq!(t.mmap(p(4), PAGE, RW, ANON | MAP_FIXED), Ok(p(4)));
        assert_eq!(
            labels(t),
            [
                (0, 3, String::new()),
                (3, 4, "[anon:z]".into()),
                (4, 5, String::new()),
                (5, 7, "[anon_shmem:bar]".into())
            ]
        );
        for bad in ["a[b", "a$", "a\tb", "x\\", "`", &"y".repeat(80)] {
            assert_eq!(set_name(t, p(0), PAGE, Some(bad)), Err(EINVAL), "{bad:?}");
        }
        assert_eq!(set_name(t, p(0), PAGE, Some(&"y".repeat(79))), Ok(()));
        assert_eq!(set_name(t, p(0), PAGE, Some("a b")), Ok(()));
        assert_eq!(set_name(t, p(0) + 1, PAGE, Some("a")), Err(EINVAL));
        assert_eq!(set_name(t, p(0), 0, Some("a")), Ok(()));
        assert_eq!(set_name(t, p(7), PAGE, Some("a")), Err(ENOMEM));
    });
}

#[test]
fn anon_names_survive_mremap_and_fork() {
    let t = AspaceTarget::new(Region::new(aspace_target::DEFAULT_REGION_START, 16));
    let r = t.region();
    let mm = &t.mm;
    let f = MapFlags::PRIVATE | MapFlags::ANONYMOUS | MapFlags::FIXED;
    mm.mmap(r.page(0), 2 * PAGE, Prot::READ | Prot::WRITE, f)
        .unwrap();
    mm.set_anon_name(r.page(0), 2 * PAGE, Some("heap2"))
        .unwrap();
    let mv = aspace::MremapFlags::MAYMOVE | aspace::MremapFlags::FIXED;
    assert_eq!(
        mm.mremap(r.page(0), 2 * PAGE, 4 * PAGE, mv, r.page(8)),
        Ok(r.page(8))
    );
    assert_eq!(mm.vma_at(r.page(8)).unwrap().name.as_deref(), Some("heap2"));
    assert_eq!(mm.vma_at(r.page(11)).unwrap().end, r.page(12));
    let child = mm.fork().unwrap();
    assert!(child.maps().contains("[anon:heap2]"));
}

// ---------------------------------------------------------------- [stack]

/// `start_stack` of this process (field 28 of /proc/self/stat).
fn start_stack() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(28 - 3)?.parse().ok()
}

/// (start, end, perms, path column) of the maps lines inside `[lo, hi)`.
fn labelled(maps: &str, lo: u64, hi: u64) -> Vec<(u64, u64, String, String)> {
    maps.lines()
        .filter_map(|l| {
            let v = parse_maps_line(l)?;
            let path = l.split_whitespace().nth(5).unwrap_or("").to_string();
            (v.start >= lo && v.end <= hi).then_some((v.start, v.end, v.perms, path))
        })
        .collect()
}

#[test]
fn the_vma_holding_start_stack_is_the_stack_through_growth_and_splits() {
    // This process: the VMA around start_stack is `[stack]`.
    let Some(ss) = start_stack().filter(|&s| s != 0) else {
        eprintln!("kernel side skipped: no start_stack in /proc/self/stat");
        return;
    };
    let own = std::fs::read_to_string("/proc/self/maps").unwrap();
    let (lo, hi) = own
        .lines()
        .filter_map(parse_maps_line)
        .find(|v| v.start <= ss && ss <= v.end)
        .map(|v| (v.start, v.end))
        .expect("a VMA holds start_stack");
    assert_eq!(
        label_at(&own, ss).as_deref(),
        Some("[stack]"),
        "this process"
    );
    // A forked child (whose only thread runs on another stack) grows the
    // main stack 1 MiB below start_stack, then makes a read-only page 8
    // pages below it: three VMAs, of which only the top one holds
    // start_stack.
    let grown = (ss - (1 << 20)) & !(PAGE - 1);
    let ro = (ss & !(PAGE - 1)) - 8 * PAGE;
    let (res, maps) = in_forked_child(|pipe| {
        let mut out = [0u8; 64];
        out[0] = kernel_store(pipe, grown) as u8;
        // SAFETY: a page of the main thread's stack, which no thread of
        // this child uses (the child runs on the forking thread's stack).
        out[1] = unsafe { libc::mprotect(ro as *mut libc::c_void, PAGE as usize, libc::PROT_READ) }
            as u8;
        (out, 2)
    });
    assert_eq!(res, [1, 0], "kernel child: store and mprotect");
    let kernel = labelled(&maps, grown, hi);
    let want = vec![
        (grown, ro, "rw-p".to_string(), String::new()),
        (ro, ro + PAGE, "r--p".to_string(), String::new()),
        (ro + PAGE, hi, "rw-p".to_string(), "[stack]".to_string()),
    ];
    assert_eq!(kernel, want, "kernel child");
    // aspace, at the same addresses.
    let mm = AddressSpace::new(Config::default());
    let f = MapFlags::PRIVATE | MapFlags::ANONYMOUS | MapFlags::FIXED | MapFlags::GROWSDOWN;
    assert_eq!(mm.mmap(lo, hi - lo, Prot::READ | Prot::WRITE, f), Ok(lo));
    assert_eq!(labelled(&mm.maps(), lo, hi)[0].3, "", "no start_stack yet");
    mm.set_start_stack(ss);
    assert_eq!(mm.start_stack(), ss);
    assert_eq!(label_at(&mm.maps(), ss).as_deref(), Some("[stack]"));
    mm.write(grown, b"x").unwrap();
    assert_eq!(
        labelled(&mm.maps(), grown, hi),
        [(grown, hi, "rw-p".to_string(), "[stack]".to_string())]
    );
    mm.mprotect(ro, PAGE, Prot::READ).unwrap();
    assert_eq!(labelled(&mm.maps(), grown, hi), want, "aspace");
    assert!(mm.vma_at(ss).unwrap().stack);
    assert!(!mm.vma_at(ro).unwrap().stack);
    // A fork child has the same initial stack.
    let child = mm.fork().unwrap();
    assert_eq!(
        labelled(&child.maps(), grown, hi),
        want,
        "aspace fork child"
    );
}

#[test]
fn start_stack_on_a_boundary_labels_both_neighbours() {
    // Linux's rule is inclusive at both ends (vm_start <= start_stack <=
    // vm_end): the kernel's own start_stack cannot be put on a page
    // boundary from a test, so this is aspace alone, by the rule.
    let mm = AddressSpace::new(Config::default());
    let a = 0x7000_0000_0000;
    let f = MapFlags::PRIVATE | MapFlags::ANONYMOUS | MapFlags::FIXED;
    mm.mmap(a, 2 * PAGE, Prot::READ, f).unwrap();
    mm.mmap(a + 2 * PAGE, 2 * PAGE, Prot::READ | Prot::WRITE, f)
        .unwrap();
    mm.mmap(a + 5 * PAGE, PAGE, Prot::READ, f).unwrap();
    mm.set_start_stack(a + 2 * PAGE);
    let l = labelled(&mm.maps(), a, a + 6 * PAGE);
    let paths: Vec<&str> = l.iter().map(|v| v.3.as_str()).collect();
    assert_eq!(paths, ["[stack]", "[stack]", ""]);
    mm.set_start_stack(0);
    assert!(mm.vmas().iter().all(|v| !v.stack));
    // The heap label wins over the stack's, as in show_map_vma.
    let sb = Config::default().brk_start;
    mm.brk(sb + PAGE).unwrap();
    mm.set_start_stack(sb + 10);
    assert_eq!(label_at(&mm.maps(), sb).as_deref(), Some("[heap]"));
}

// ---------------------------------------------------------------- unwind safety

#[test]
fn a_panic_while_a_translator_is_live_leaves_the_space_usable() {
    fn unwind_safe<T: std::panic::RefUnwindSafe + std::panic::UnwindSafe>() {}
    unwind_safe::<AddressSpace>();
    let mm = AddressSpace::new(Config::default());
    let a = mm
        .mmap(
            0,
            2 * PAGE,
            Prot::READ | Prot::WRITE,
            MapFlags::PRIVATE | MapFlags::ANONYMOUS,
        )
        .unwrap();
    let caught = std::panic::catch_unwind(|| {
        let mut t = mm.translator();
        t.store(a, 7u8).unwrap();
        panic!("caller bug while its translator caches a page");
    });
    assert!(caught.is_err());
    // The unwound translator no longer holds up flushes: mprotect and
    // munmap complete, and the space shows what was stored.
    let mut b = [0u8];
    mm.read(a, &mut b).unwrap();
    assert_eq!(b, [7]);
    mm.mprotect(a, PAGE, Prot::READ).unwrap();
    assert!(mm.translator().store(a, 1u8).is_err());
    mm.munmap(a, 2 * PAGE).unwrap();
    assert_eq!(mm.frames_used(), 0);
    assert_eq!(mm.map_count(), 0);
}

// ---------------------------------------------------------------- MAP_DROPPABLE

const MAP_DROPPABLE: u32 = 0x08;
const DROP_ANON: u32 = MAP_DROPPABLE | MAP_ANONYMOUS;
const MADV_DONTDUMP: i32 = 16;
const MADV_DODUMP: i32 = 17;
const DROPPABLE_RW: &str = "rd wr mr mw me nr wf dd dp";

/// True if the running kernel has `MAP_DROPPABLE` (6.11+); says on stderr
/// when it does not.
fn kernel_has_droppable() -> bool {
    let Some(mut k) = KernelTarget::new(1) else {
        return false;
    };
    let a = k.region().page(0);
    let ok = k.mmap(a, PAGE, RW, DROP_ANON | MAP_FIXED) == Ok(a);
    if !ok {
        eprintln!("kernel side skipped: no MAP_DROPPABLE (Linux < 6.11)");
    }
    ok
}

#[test]
fn map_droppable_flag_rules_vm_flags_and_locks() {
    on_both_if(kernel_has_droppable(), 12, |t| {
        let r = t.region();
        let p = |i: u64| r.page(i);
        let fx = DROP_ANON | MAP_FIXED;
        for bad in [
            fx | MAP_LOCKED,
            fx | MAP_GROWSDOWN,
            fx | MAP_HUGETLB,
            (fx & !MAP_DROPPABLE) | 0x09,
            (fx & !MAP_DROPPABLE) | 0x0a,
            (fx & !MAP_DROPPABLE) | 0x0c,
            (fx & !MAP_DROPPABLE) | 0x0f,
        ] {
            assert_eq!(t.mmap(p(0), PAGE, RW, bad), Err(EINVAL), "{bad:#x}");
        }
        assert_eq!(t.mmap(p(0), 0, RW, fx), Err(EINVAL));
        assert_eq!(t.mmap(p(0), 2 * PAGE, RW, fx), Ok(p(0)));
        // A neighbour with the same flags merges; MAP_STACK adds nh.
        assert_eq!(t.mmap(p(2), PAGE, RW, fx), Ok(p(2)));
        assert_eq!(t.mmap(p(4), PAGE, RW, fx | MAP_STACK), Ok(p(4)));
        assert_eq!(
            t.mmap(p(6), PAGE, RW, fx | MAP_POPULATE | MAP_SYNC),
            Ok(p(6))
        );
        assert_flags(
            t,
            &[
                (0, 3, DROPPABLE_RW),
                (4, 5, "rd wr mr mw me nr wf dd dp nh"),
                (6, 7, "rd wr mr mw me nr wf dd dp sf"),
            ],
        );
        assert_eq!(resident(t, p(6), 1), [true]);
        // mlock populates droppable memory but does not lock it.
        assert_eq!(resident(t, p(0), 3), [false; 3]);
        assert_eq!(t.mlock2(p(0), 2 * PAGE, 0), Ok(()));
        assert_eq!(t.mlock2(p(2), PAGE, MLOCK_ONFAULT), Ok(()));
        assert_eq!(resident(t, p(0), 3), [true; 3]);
        // Dump and fork advice: droppable memory is never kept.
        assert_eq!(t.madvise(p(0), PAGE, MADV_KEEPONFORK), Err(EINVAL));
        assert_eq!(t.madvise(p(0), PAGE, MADV_DODUMP), Err(EINVAL));
        assert_eq!(t.madvise(p(0), PAGE, MADV_WIPEONFORK), Ok(()));
        assert_eq!(t.madvise(p(0), PAGE, MADV_DONTDUMP), Ok(()));
        assert_eq!(t.madvise(p(0), PAGE, MADV_FREE), Ok(()));
        assert_eq!(t.mprotect(p(1), PAGE, PROT_READ), Ok(()));
        assert_flags(
            t,
            &[
                (0, 1, DROPPABLE_RW),
                (1, 2, "rd mr mw me nr wf dd dp"),
                (2, 3, DROPPABLE_RW),
                (4, 5, "rd wr mr mw me nr wf dd dp nh"),
                (6, 7, "rd wr mr mw me nr wf dd dp sf"),
            ],
        );
        // DONTDUMP / DODUMP on ordinary memory.
        assert_eq!(t.mmap(p(8), 2 * PAGE, RW, ANON | MAP_FIXED), Ok(p(8)));
        assert_eq!(t.madvise(p(8), PAGE, MADV_DONTDUMP), Ok(()));
        assert_flags(
            t,
            &[
                (0, 1, DROPPABLE_RW),
                (1, 2, "rd mr mw me nr wf dd dp"),
                (2, 3, DROPPABLE_RW),
                (4, 5, "rd wr mr mw me nr wf dd dp nh"),
                (6, 7, "rd wr mr mw me nr wf dd dp sf"),
                (8, 9, "rd wr mr mw me ac dd"),
                (9, 10, PRIV_RW),
            ],
        );
        assert_eq!(t.madvise(p(8), PAGE, MADV_DODUMP), Ok(()));
        assert_flags(
            t,
            &[
                (0, 1, DROPPABLE_RW),
                (1, 2, "rd mr mw me nr wf dd dp"),
                (2, 3, DROPPABLE_RW),
                (4, 5, "rd wr mr mw me nr wf dd dp nh"),
                (6, 7, "rd wr mr mw me nr wf dd dp sf"),
                (8, 10, PRIV_RW),
            ],
        );
    });
}

#[test]
fn droppable_memory_is_wiped_in_fork_children_and_never_locked() {
    const MCL_CURRENT: i32 = 1;
    const MCL_FUTURE: i32 = 2;
    const MCL_ONFAULT: i32 = 4;
    // Page 0: droppable, written with 7. In the child: the value it loads
    // (0: wiped)
    // at page 0; then mlockall(MCL_CURRENT | MCL_FUTURE) and a droppable
    // page at 2 (populated, not locked); then MCL_FUTURE | MCL_ONFAULT,
    // a droppable page at 4 (populated: its lock, dropped, no longer says
    // on-fault) and a MAP_POPULATE page at 6 (not populated: locks on
    // fault). The residency of pages 2, 4, 6 follows.
    let want_res = [0, 0, 1, 1, 0];
    let want_flags = [
        vec!["dd", "dp", "me", "mr", "mw", "nr", "rd", "wf", "wr"],
        vec!["dd", "dp", "me", "mr", "mw", "nr", "rd", "wf", "wr"],
        vec!["dd", "dp", "me", "mr", "mw", "nr", "rd", "wf", "wr"],
        vec!["ac", "lf", "lo", "me", "mr", "mw", "rd", "wr"],
    ];
    let want_flags: Vec<Vec<String>> = want_flags
        .iter()
        .map(|v| v.iter().map(|s| s.to_string()).collect())
        .collect();
    let region = if kernel_has_droppable() {
        let mut k = KernelTarget::new(8).unwrap();
        let r = k.region();
        assert_eq!(
            k.mmap(r.page(0), PAGE, RW, DROP_ANON | MAP_FIXED),
            Ok(r.page(0))
        );
        assert_eq!(k.write(r.page(0), &[7]), Ok(()));
        let (res, smaps) = in_forked_child_reporting(c"/proc/self/smaps", |pipe| {
            let mut out = [0u8; 64];
            out[0] = kernel_load(pipe, r.page(0)).unwrap_or(0xff);
            let map = |page: u64, flags: u32| {
                // SAFETY: MAP_FIXED inside the test region, where no Rust
                // object lives.
                let p = unsafe {
                    libc::mmap(
                        r.page(page) as *mut libc::c_void,
                        PAGE as usize,
                        RW as i32,
                        (flags | MAP_FIXED) as i32,
                        -1,
                        0,
                    )
                };
                p as u64 == r.page(page)
            };
            let res = |page: u64| {
                let mut v = 0u8;
                // SAFETY: one page of our own memory; one byte out.
                unsafe { libc::mincore(r.page(page) as *mut libc::c_void, PAGE as usize, &mut v) };
                v & 1
            };
            // SAFETY: mlockall on this child's own memory.
            out[1] = unsafe { libc::mlockall(MCL_CURRENT | MCL_FUTURE) } as u8;
            out[1] |= !map(2, DROP_ANON) as u8;
            out[2] = res(2);
            // SAFETY: as above.
            out[1] |= unsafe { libc::mlockall(MCL_FUTURE | MCL_ONFAULT) } as u8;
            out[1] |= !map(4, DROP_ANON) as u8;
            out[1] |= !map(6, ANON | MAP_POPULATE) as u8;
            out[3] = res(4);
            out[4] = res(6);
            (out, 5)
        });
        assert_eq!(res, want_res, "kernel child");
        let flags: Vec<Vec<String>> = common::kernel::smaps_flags_in(&smaps, r.lo, r.hi)
            .into_iter()
            .map(|(_, _, f)| comparable_flags(f))
            .collect();
        assert_eq!(flags, want_flags, "kernel child");
        r
    } else {
        Region::new(aspace_target::DEFAULT_REGION_START, 8)
    };
    use aspace::MlockAllFlags as M;
    let mut t = AspaceTarget::new(region);
    let r = region;
    let fx = MapFlags::from_bits_retain(DROP_ANON | MAP_FIXED);
    assert_eq!(
        t.mm.mmap(r.page(0), PAGE, Prot::READ | Prot::WRITE, fx),
        Ok(r.page(0))
    );
    assert_eq!(t.write(r.page(0), &[7]), Ok(()));
    let c = t.mm.fork().unwrap();
    let mut b = [0xffu8];
    c.read(r.page(0), &mut b).unwrap();
    let mut got = vec![b[0], 0];
    let rw = Prot::READ | Prot::WRITE;
    c.mlockall(M::CURRENT | M::FUTURE).unwrap();
    c.mmap(r.page(2), PAGE, rw, fx).unwrap();
    got.push(c.mincore(r.page(2), PAGE).unwrap()[0] as u8);
    c.mlockall(M::FUTURE | M::ONFAULT).unwrap();
    c.mmap(r.page(4), PAGE, rw, fx).unwrap();
    let pop = MapFlags::PRIVATE | MapFlags::ANONYMOUS | MapFlags::FIXED | MapFlags::POPULATE;
    c.mmap(r.page(6), PAGE, rw, pop).unwrap();
    got.push(c.mincore(r.page(4), PAGE).unwrap()[0] as u8);
    got.push(c.mincore(r.page(6), PAGE).unwrap()[0] as u8);
    assert_eq!(got, want_res, "aspace child");
    let flags: Vec<Vec<String>> = c
        .vmas()
        .into_iter()
        .filter(|v| v.start >= r.lo && v.end <= r.hi)
        .map(|v| common::aspace_target::mnemonics(v.flags))
        .collect();
    assert_eq!(flags, want_flags, "aspace child");
}

// ---------------------------------------------------------------- RLIMIT_MEMLOCK

/// One step of a locked-memory scenario; pages are interior page numbers.
#[derive(Clone, Copy, Debug)]
enum Lk {
    /// `setrlimit(RLIMIT_MEMLOCK)` soft limit, bytes.
    Limit(u64),
    /// mmap(page, pages, RW, private anonymous fixed | extra flags).
    Map(u64, u64, u32),
    Unmap(u64, u64),
    /// mlock2(page, raw length, flags).
    Mlock(u64, u64, u32),
    Munlock(u64, u64),
    Mlockall(i32),
    Munlockall,
    /// mremap(page, old pages, new pages, flags, new page).
    Mremap(u64, u64, u64, u32, u64),
    /// brk(start + pages) (the break's start differs on each side).
    Brk(u64),
    /// Whether heap page `n` (from the break's start) is resident: 1 or 0.
    HeapResident(u64),
}

/// Runs `steps` in a forked child of this process that has dropped its
/// privileges (all uids to `nobody`, so no `CAP_IPC_LOCK`; dumpable again
/// so that it can read its own smaps). Returns each step's errno (0 for
/// success; for brk, 0 if the break moved, else 1), the residency of the
/// pages `resident` lists, and the child's smaps.
fn lk_on_kernel(r: Region, steps: &[Lk], resident: &[u64]) -> (Vec<u8>, Vec<bool>, String) {
    assert!(steps.len() + resident.len() <= 64);
    let (res, smaps) = in_forked_child_reporting(c"/proc/self/smaps", |_| {
        let mut out = [0u8; 64];
        let p = |i: u64| r.page(i);
        let err = || std::io::Error::last_os_error().raw_os_error().unwrap_or(0) as u8;
        // SAFETY: setresuid/prctl/sbrk only change this child's
        // credentials, dumpability and break.
        let start_brk = unsafe {
            if libc::setresuid(65534, 65534, 65534) != 0 {
                libc::_exit(3);
            }
            libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0);
            libc::sbrk(0) as u64
        };
        let start_brk = (start_brk + PAGE - 1) & !(PAGE - 1);
        for (i, &s) in steps.iter().enumerate() {
            // SAFETY: every address is a page of the test region (MAP_FIXED
            // and mremap destinations included) or the child's own heap;
            // no Rust object lives in either.
            out[i] = unsafe {
                match s {
                    Lk::Limit(b) => {
                        let mut rl: libc::rlimit = std::mem::zeroed();
                        libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut rl);
                        rl.rlim_cur = b.min(rl.rlim_max);
                        if libc::setrlimit(libc::RLIMIT_MEMLOCK, &rl) == 0 {
                            0
                        } else {
                            err()
                        }
                    }
                    Lk::Map(a, n, f) => {
                        let q = libc::mmap(
                            p(a) as *mut libc::c_void,
                            (n * PAGE) as usize,
                            RW as i32,
                            (ANON | MAP_FIXED | f) as i32,
                            -1,
                            0,
                        );
                        if q == libc::MAP_FAILED {
                            err()
                        } else {
                            0
                        }
                    }
                    Lk::Unmap(a, n) => {
                        libc::munmap(p(a) as *mut libc::c_void, (n * PAGE) as usize);
                        0
                    }
                    Lk::Mlock(a, len, f) => {
                        if libc::syscall(libc::SYS_mlock2, p(a), len, f) == 0 {
                            0
                        } else {
                            err()
                        }
                    }
                    Lk::Munlock(a, n) => {
                        if libc::munlock(p(a) as *const libc::c_void, (n * PAGE) as usize) == 0 {
                            0
                        } else {
                            err()
                        }
                    }
                    Lk::Mlockall(f) => {
                        if libc::mlockall(f) == 0 {
                            0
                        } else {
                            err()
                        }
                    }
                    Lk::Munlockall => {
                        libc::munlockall();
                        0
                    }
                    Lk::Mremap(a, o, n, f, d) => {
                        let q = libc::syscall(libc::SYS_mremap, p(a), o * PAGE, n * PAGE, f, p(d));
                        if q == -1 {
                            err()
                        } else {
                            0
                        }
                    }
                    Lk::Brk(n) => {
                        let want = start_brk + n * PAGE;
                        (libc::syscall(libc::SYS_brk, want) as u64 != want) as u8
                    }
                    Lk::HeapResident(n) => {
                        let mut v = 0u8;
                        libc::mincore(
                            (start_brk + n * PAGE) as *mut libc::c_void,
                            PAGE as usize,
                            &mut v,
                        );
                        v & 1
                    }
                }
            };
        }
        for (j, &pg) in resident.iter().enumerate() {
            let mut v = 0u8;
            // SAFETY: one page of our own memory; one byte out.
            let rc = unsafe { libc::mincore(p(pg) as *mut libc::c_void, PAGE as usize, &mut v) };
            out[steps.len() + j] = if rc == 0 { v & 1 } else { 2 };
        }
        (out, steps.len() + resident.len())
    });
    let (errs, res) = res.split_at(steps.len());
    (errs.to_vec(), res.iter().map(|&b| b == 1).collect(), smaps)
}

/// The same steps on aspace (memlock limit as the child's: 8 MiB, the
/// kernel's default, until a `Limit` step).
fn lk_on_aspace(r: Region, steps: &[Lk], resident: &[u64]) -> (Vec<u8>, Vec<bool>, AspaceTarget) {
    let t = AspaceTarget::with_config(r, Config::default());
    let mm = &t.mm;
    let p = |i: u64| r.page(i);
    let e = |x: aspace::Result<()>| x.err().map_or(0, |e| e.errno() as u8);
    let rw = Prot::READ | Prot::WRITE;
    let start_brk = mm.brk(0).unwrap();
    let errs = steps
        .iter()
        .map(|&s| match s {
            Lk::Limit(b) => {
                mm.set_memlock_limit(b);
                0
            }
            Lk::Map(a, n, f) => e(mm
                .mmap(
                    p(a),
                    n * PAGE,
                    rw,
                    MapFlags::from_bits_retain(ANON | MAP_FIXED | f),
                )
                .map(drop)),
            Lk::Unmap(a, n) => e(mm.munmap(p(a), n * PAGE)),
            Lk::Mlock(a, len, f) => {
                e(mm.mlock2(p(a), len, aspace::MlockFlags::from_bits_retain(f)))
            }
            Lk::Munlock(a, n) => e(mm.munlock(p(a), n * PAGE)),
            Lk::Mlockall(f) => e(mm.mlockall(aspace::MlockAllFlags::from_bits_retain(f as u32))),
            Lk::Munlockall => e(mm.munlockall()),
            Lk::Mremap(a, o, n, f, d) => e(mm
                .mremap(
                    p(a),
                    o * PAGE,
                    n * PAGE,
                    aspace::MremapFlags::from_bits_retain(f),
                    p(d),
                )
                .map(drop)),
            Lk::Brk(n) => (mm.brk(start_brk + n * PAGE).unwrap() != start_brk + n * PAGE) as u8,
            Lk::HeapResident(n) => mm.mincore(start_brk + n * PAGE, PAGE).unwrap()[0] as u8,
        })
        .collect();
    let res = resident
        .iter()
        .map(|&pg| mm.mincore(p(pg), PAGE).unwrap()[0])
        .collect();
    (errs, res, t)
}

/// Runs a locked-memory scenario on both sides and checks the errnos,
/// the residency of `resident` and the interior's flags against `want`.
fn lk_case(
    steps: &[Lk],
    want: &[i32],
    resident: &[u64],
    want_res: &[bool],
    flags: &[(u64, u64, &str)],
) {
    let want: Vec<u8> = want.iter().map(|&e| e as u8).collect();
    let fl: Vec<(u64, u64, Vec<String>)> = flags
        .iter()
        .map(|&(s, e, f)| {
            let mut v: Vec<String> = f.split_whitespace().map(str::to_string).collect();
            v.sort();
            (s, e, v)
        })
        .collect();
    let region = match KernelTarget::new(24) {
        Some(k) => {
            let r = k.region();
            let (errs, res, smaps) = lk_on_kernel(r, steps, resident);
            for (i, s) in steps.iter().enumerate() {
                assert_eq!(errs[i], want[i], "kernel, step {i} {s:?}");
            }
            assert_eq!(res, want_res, "kernel residency");
            let got: Vec<(u64, u64, Vec<String>)> =
                common::kernel::smaps_flags_in(&smaps, r.lo, r.hi)
                    .into_iter()
                    .map(|(s, e, f)| ((s - r.lo) / PAGE, (e - r.lo) / PAGE, comparable_flags(f)))
                    .collect();
            assert_eq!(got, fl, "kernel flags");
            r
        }
        None => Region::new(aspace_target::DEFAULT_REGION_START, 24),
    };
    let (errs, res, mut t) = lk_on_aspace(region, steps, resident);
    for (i, s) in steps.iter().enumerate() {
        assert_eq!(errs[i], want[i], "aspace, step {i} {s:?}");
    }
    assert_eq!(res, want_res, "aspace residency");
    assert_eq!(flags_layout(&mut t), fl, "aspace flags");
}

const EAGAIN: i32 = 11;
const MCL_CURRENT: i32 = 1;
const MCL_FUTURE: i32 = 2;
const MCL_ONFAULT: i32 = 4;

#[test]
fn memlock_limit_bounds_mlock_map_locked_mlockall_and_mremap() {
    use Lk::*;
    const L: u64 = 4 * PAGE;
    let steps = [
        Limit(L),
        Map(0, 16, 0),
        Mlock(0, 5 * PAGE, 0),
        Mlock(0, 4 * PAGE, 0),
        Mlock(0, 4 * PAGE, 0),
        Mlock(1, 4 * PAGE, 0),
        Mlock(1, 3 * PAGE, 0),
        Mlock(8, PAGE, MLOCK_ONFAULT),
        Mlock(0, u64::MAX, 0),
        Mlock(0, u64::MAX - (PAGE - 1), 0),
        Munlock(0, 16),
        Map(16, 5, MAP_LOCKED),
        Map(16, 4, MAP_LOCKED),
        Mlockall(MCL_CURRENT),
        Mlockall(MCL_FUTURE),
        Map(21, 1, 0),
        Munlockall,
        Map(21, 1, 0),
        Unmap(16, 8),
        Map(16, 3, 0),
        Mlock(16, 3 * PAGE, 0),
        Mremap(16, 3, 4, 0, 0),
        Mremap(16, 4, 5, 0, 0),
        Mremap(16, 4, 5, MREMAP_MAYMOVE, 0),
        Mremap(16, 4, 5, MREMAP_MAYMOVE | MREMAP_FIXED, 10),
        Limit(0),
        Mlock(0, PAGE, 0),
        Mlock(0, 0, 0),
        Mlock(0, PAGE, 2),
        Mlockall(MCL_FUTURE),
        Mlockall(0),
        Map(22, 1, MAP_LOCKED),
        Map(22, 0, MAP_LOCKED),
        Munlock(16, 1),
    ];
    let want = [
        0, 0, ENOMEM, 0, 0, ENOMEM, 0, ENOMEM, 0, ENOMEM, 0, EAGAIN, 0, ENOMEM, 0, EAGAIN, 0, 0, 0,
        0, 0, 0, EAGAIN, EAGAIN, EAGAIN, 0, EPERM, EPERM, EINVAL, EPERM, EINVAL, EPERM, EINVAL, 0,
    ];
    // The in-place growth of the locked VMA (page 19) was populated.
    lk_case(
        &steps,
        &want,
        &[16, 19],
        &[true, true],
        &[(0, 17, PRIV_RW), (17, 20, "rd wr mr mw me ac lo")],
    );
}

#[test]
fn mlockall_future_locks_and_populates_brk_growth_not_mremap_growth() {
    use Lk::*;
    let steps = [
        Brk(2),
        Mlockall(MCL_FUTURE),
        // The heap's growth is a new, locked VMA, populated.
        Brk(4),
        HeapResident(1),
        HeapResident(2),
        HeapResident(3),
        // New mappings are locked; growing a locked VMA populates the
        // new part.
        Map(0, 2, 0),
        Mremap(0, 2, 3, 0, 0),
        // MCL_FUTURE does not lock the growth of an unlocked VMA.
        Map(8, 2, 0),
        Munlock(8, 2),
        Mremap(8, 2, 3, 0, 0),
        // On fault: the heap's growth is locked but not populated.
        Mlockall(MCL_FUTURE | MCL_ONFAULT),
        Brk(6),
        HeapResident(4),
        HeapResident(5),
        // Locked heap growth counts against the limit: 2 + 2 + 3 pages
        // are locked; 2 more pass 8, 1 more fits.
        Limit(8 * PAGE),
        Brk(8),
        Brk(7),
        Brk(6),
    ];
    let want = [0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0];
    lk_case(
        &steps,
        &want,
        &[0, 1, 2, 8, 9, 10],
        &[true, true, true, true, true, false],
        &[(0, 3, "rd wr mr mw me ac lo"), (8, 11, PRIV_RW)],
    );
}

// ---------------------------------------------------------------- found by kernel_diff

#[test]
fn mremap_dontunmap_unlocks_the_whole_old_vma_without_splitting_it() {
    on_both(16, |t| {
        let r = t.region();
        let p = |i: u64| r.page(i);
        assert_eq!(t.mmap(p(0), 4 * PAGE, RW, ANON | MAP_FIXED), Ok(p(0)));
        assert_eq!(t.mlock2(p(0), 4 * PAGE, 0), Ok(()));
        let mv = MREMAP_MAYMOVE | MREMAP_DONTUNMAP | MREMAP_FIXED;
        assert_eq!(t.mremap(p(1), PAGE, PAGE, mv, p(8)), Ok(p(8)));
        assert_flags(t, &[(0, 4, PRIV_RW), (8, 9, "rd wr mr mw me ac lo")]);
        // An on-fault lock of a shared mapping, moved whole.
        assert_eq!(
            t.mmap(p(10), 2 * PAGE, RW, SHARED_ANON | MAP_FIXED),
            Ok(p(10))
        );
        assert_eq!(t.mlock2(p(10), 2 * PAGE, MLOCK_ONFAULT), Ok(()));
        assert_eq!(t.mremap(p(10), 2 * PAGE, 2 * PAGE, mv, p(13)), Ok(p(13)));
        assert_flags(
            t,
            &[
                (0, 4, PRIV_RW),
                (8, 9, "rd wr mr mw me ac lo"),
                (10, 12, "rd wr sh mr mw me ms"),
                (13, 15, "rd wr sh mr mw me ms lo lf"),
            ],
        );
    });
}

#[test]
fn madvise_populate_read_needs_read_permission() {
    on_both(8, |t| {
        let r = t.region();
        let p = |i: u64| r.page(i);
        assert_eq!(t.mmap(p(0), PAGE, PROT_WRITE, ANON | MAP_FIXED), Ok(p(0)));
        assert_eq!(t.mmap(p(2), PAGE, PROT_EXEC, ANON | MAP_FIXED), Ok(p(2)));
        assert_eq!(t.madvise(p(0), PAGE, MADV_POPULATE_READ), Err(EINVAL));
        assert_eq!(t.madvise(p(0), 3 * PAGE, MADV_POPULATE_READ), Err(EINVAL));
        assert_eq!(t.madvise(p(2), PAGE, MADV_POPULATE_READ), Err(EINVAL));
        assert_eq!(t.madvise(p(0), PAGE, MADV_POPULATE_WRITE), Ok(()));
        assert_eq!(resident(t, p(0), 1), [true]);
    });
}

#[test]
fn mprotect_populates_a_private_locked_vma_made_writable() {
    on_both(16, |t| {
        let r = t.region();
        let p = |i: u64| r.page(i);
        let rx = PROT_READ | PROT_EXEC;
        assert_eq!(
            t.mmap(p(0), 6 * PAGE, rx, ANON | MAP_FIXED | MAP_LOCKED),
            Ok(p(0))
        );
        // Over a hole: the VMA's part is made writable and populated, then
        // ENOMEM.
        assert_eq!(t.mprotect(p(4), 8 * PAGE, RW), Err(ENOMEM));
        assert_eq!(resident(t, p(4), 2), [true, true]);
        // It has its anon_vma now, so it keeps its charge when made
        // read-only again, and does not merge with the untouched part.
        assert_eq!(t.mprotect(p(2), 3 * PAGE, PROT_READ), Ok(()));
        assert_flags(
            t,
            &[
                (0, 2, "rd ex mr mw me lo"),
                (2, 4, "rd mr mw me lo"),
                (4, 5, "rd mr mw me lo ac"),
                (5, 6, "rd wr mr mw me lo ac"),
            ],
        );
        // Not for an on-fault lock.
        assert_eq!(
            t.mmap(p(8), 2 * PAGE, PROT_READ, ANON | MAP_FIXED),
            Ok(p(8))
        );
        assert_eq!(t.mlock2(p(8), 2 * PAGE, MLOCK_ONFAULT), Ok(()));
        assert_eq!(t.mprotect(p(8), 2 * PAGE, RW), Ok(()));
        assert_eq!(resident(t, p(8), 2), [false, false]);
    });
}

/// Execute-only memory as the running kernel makes it: with protection
/// keys (x86-64 with PKU) `PROT_EXEC` alone is unreadable, and the key
/// goes with the protection (mprotect to `R|X` makes it readable again);
/// a VMA with the key does not merge with an `R|X` neighbour. The kernel
/// is probed (`kernel_exec_only`) and aspace configured to match; the
/// layouts are compared with `/proc/self/maps` through the kernel target.
#[test]
fn exec_only_memory_like_the_kernel() {
    let exec_only = common::kernel::kernel_exec_only();
    let mm = AddressSpace::new(Config {
        exec_only_pkey: exec_only,
        ..Config::default()
    });
    let anon = MapFlags::PRIVATE | MapFlags::ANONYMOUS;
    let a = mm
        .mmap(0, 3 * 4096, Prot::READ | Prot::WRITE, anon)
        .unwrap();
    mm.write(a, &[5; 3 * 4096]).unwrap();
    mm.mprotect(a + 4096, 4096, Prot::EXEC).unwrap();
    let mut b = [0u8; 1];
    let r = mm.read(a + 4096, &mut b).map_err(|e| e.errno());
    assert_eq!(r.is_err(), exec_only, "exec-only read: {r:?}");
    if exec_only {
        assert_eq!(r, Err(14));
        let mut tr = mm.translator();
        assert!(
            tr.load::<u8>(a + 4096).is_err(),
            "a translator load read it"
        );
        assert!(tr.load::<u8>(a).is_ok());
    }
    // R|X on the neighbours: with the key the middle stays apart.
    mm.mprotect(a, 4096, Prot::READ | Prot::EXEC).unwrap();
    mm.mprotect(a + 2 * 4096, 4096, Prot::READ | Prot::EXEC)
        .unwrap();
    assert_eq!(mm.vmas().len(), 3);
    mm.mprotect(a + 4096, 4096, Prot::READ | Prot::EXEC)
        .unwrap();
    assert_eq!(mm.vmas().len(), 1, "the key went with the protection");
    mm.read(a + 4096, &mut b).unwrap();
    assert_eq!(b, [5]);

    // The same calls on the kernel: the read fails exactly where aspace's
    // does, and the layouts agree.
    let len = 3 * 4096;
    // SAFETY: a fresh private mapping of the kernel's choice, ours alone.
    let k = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(k, libc::MAP_FAILED);
    let k = k as u64;
    let kread = common::kernel::kernel_loads;
    let kprotect = |addr: u64, prot: i32| {
        // SAFETY: inside our own mapping.
        let r = unsafe { libc::mprotect(addr as *mut libc::c_void, 4096, prot) };
        assert_eq!(r, 0);
    };
    let kvmas = || {
        std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .filter_map(parse_maps_line)
            .filter(|v| v.start < k + len as u64 && k < v.end)
            .count()
    };
    kprotect(k + 4096, libc::PROT_EXEC);
    assert_eq!(kread(k + 4096), !exec_only, "the kernel's exec-only read");
    kprotect(k, libc::PROT_READ | libc::PROT_EXEC);
    kprotect(k + 2 * 4096, libc::PROT_READ | libc::PROT_EXEC);
    assert_eq!(kvmas(), 3);
    kprotect(k + 4096, libc::PROT_READ | libc::PROT_EXEC);
    assert_eq!(kvmas(), 1);
    assert!(kread(k + 4096));
    // SAFETY: our own mapping, unused from here on.
    unsafe { libc::munmap(k as *mut libc::c_void, len) };
}
