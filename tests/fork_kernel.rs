//! fork against the kernel. Each scenario runs twice: on this process, which
//! really forks, with the child reporting its `/proc/self/maps`; and on an
//! [`aspace::AddressSpace`] and its `fork()`. Both must give the same VMA
//! layout in the child and in the parent.
//!
//! The layouts show where the anon_vma rules decide merges: a VMA whose
//! anon_vma chain has more than one entry (one inherited through fork)
//! does not merge with a neighbour that has no anon_vma, and VMAs with
//! different anon_vmas never merge.

mod common;

use aspace::{AddressSpace, MapFlags, Prot};
use common::kernel::parse_maps_line;
use common::*;
use std::io::Read;
use std::os::fd::FromRawFd;

/// Interior pages of the region.
const PAGES: u64 = 32;

/// One call, on interior pages of the region.
#[derive(Clone, Copy, Debug)]
enum Step {
    /// `mmap(page, pages, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED)`.
    Map(u64, u64, u32),
    /// `mprotect(page, pages, prot)`.
    Protect(u64, u64, u32),
    /// A one-byte store to the page (its first write fault).
    Touch(u64),
    /// `munmap(page, pages)`.
    Unmap(u64, u64),
}

use Step::*;

/// What a scenario does: before the fork, then in the child, then in the
/// parent.
struct Scenario {
    name: &'static str,
    before: &'static [Step],
    child: &'static [Step],
    parent: &'static [Step],
}

/// A layout: (first page, end page, perms) of each VMA in the interior.
type Layout = Vec<(u64, u64, String)>;

fn layout_of(maps: &str, r: &Region) -> Layout {
    maps.lines()
        .filter_map(parse_maps_line)
        .filter(|v| v.start >= r.lo && v.end <= r.hi)
        .map(|v| ((v.start - r.lo) / PAGE, (v.end - r.lo) / PAGE, v.perms))
        .collect()
}

/// Runs `s` on the kernel with raw system calls only, so that it may run
/// in a forked child of this multi-threaded process. Returns false if the
/// call failed.
fn kernel_step(r: &Region, s: Step) -> bool {
    let at = |p: u64| r.page(p) as *mut libc::c_void;
    // SAFETY: in every arm, the addresses are interior pages of the region,
    // which the harness reserved and where no Rust object lives; a Touch
    // goes to a page the scenario mapped writable.
    unsafe {
        match s {
            Map(p, n, prot) => {
                let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED;
                libc::mmap(at(p), (n * PAGE) as usize, prot as i32, flags, -1, 0) == at(p)
            }
            Protect(p, n, prot) => libc::mprotect(at(p), (n * PAGE) as usize, prot as i32) == 0,
            Touch(p) => {
                std::ptr::write_volatile(at(p).cast::<u8>(), 1);
                true
            }
            Unmap(p, n) => libc::munmap(at(p), (n * PAGE) as usize) == 0,
        }
    }
}

/// The scenario on the kernel: (region, child layout, parent layout), or
/// None where the kernel cannot be used.
fn on_kernel(s: &Scenario) -> Option<(Region, Layout, Layout)> {
    let k = KernelTarget::new(PAGES)?;
    let r = k.region();
    for &st in s.before {
        assert!(kernel_step(&r, st), "{}: kernel {st:?} failed", s.name);
    }
    let mut fds = [0; 2];
    // SAFETY: `fds` is an array of two ints for pipe2 to fill.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    let path = c"/proc/self/maps";
    // SAFETY: fork has no memory-safety preconditions. The child uses only
    // async-signal-safe calls (mmap, mprotect, munmap, open, read, write,
    // _exit) and plain stores: other threads of this process do not exist
    // in it, so it must not allocate or take locks.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let mut ok = true;
        for &st in s.child {
            ok &= kernel_step(&r, st);
        }
        // SAFETY: a valid C string; buffers are local arrays of the given
        // length; `_exit` ends the child without running destructors.
        unsafe {
            let fd = libc::open(path.as_ptr(), libc::O_RDONLY);
            let mut buf = [0u8; 4096];
            loop {
                let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
                if n <= 0 {
                    break;
                }
                libc::write(fds[1], buf.as_ptr().cast(), n as usize);
            }
            libc::_exit(if ok && fd >= 0 { 0 } else { 1 });
        }
    }
    // SAFETY: closing our copy of the write end so that reads see EOF.
    unsafe { libc::close(fds[1]) };
    // SAFETY: `fds[0]` is the open read end of our pipe, owned by nobody
    // else in this process; the File takes it over and closes it.
    let mut pipe = unsafe { std::fs::File::from_raw_fd(fds[0]) };
    let mut text = Vec::new();
    pipe.read_to_end(&mut text).expect("read the child's maps");
    drop(pipe);
    let mut status = 0;
    // SAFETY: waiting for our own child; `status` is a valid int.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{}: the forked child failed (status {status:#x})",
        s.name
    );
    let child = layout_of(&String::from_utf8_lossy(&text), &r);
    for &st in s.parent {
        assert!(kernel_step(&r, st), "{}: kernel {st:?} failed", s.name);
    }
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    Some((r, child, layout_of(&maps, &r)))
}

fn aspace_step(mm: &AddressSpace, r: &Region, s: Step) {
    let res = match s {
        Map(p, n, prot) => mm
            .mmap(
                r.page(p),
                n * PAGE,
                Prot::from_bits_retain(prot),
                MapFlags::PRIVATE | MapFlags::ANONYMOUS | MapFlags::FIXED,
            )
            .map(drop),
        Protect(p, n, prot) => mm.mprotect(r.page(p), n * PAGE, Prot::from_bits_retain(prot)),
        Touch(p) => mm.write(r.page(p), &[1]),
        Unmap(p, n) => mm.munmap(r.page(p), n * PAGE),
    };
    assert_eq!(res, Ok(()), "aspace {s:?}");
}

/// The scenario on aspace, in a region at the kernel's addresses.
fn on_aspace(s: &Scenario, r: Region) -> (Layout, Layout) {
    let t = AspaceTarget::new(r);
    for &st in s.before {
        aspace_step(&t.mm, &r, st);
    }
    let child = t.mm.fork().unwrap();
    for &st in s.child {
        aspace_step(&child, &r, st);
    }
    for &st in s.parent {
        aspace_step(&t.mm, &r, st);
    }
    (layout_of(&child.maps(), &r), layout_of(&t.mm.maps(), &r))
}

fn run(s: &Scenario, want_child: &[(u64, u64, &str)], want_parent: &[(u64, u64, &str)]) {
    let want = |l: &[(u64, u64, &str)]| -> Layout {
        l.iter().map(|&(a, b, p)| (a, b, p.to_string())).collect()
    };
    let (want_child, want_parent) = (want(want_child), want(want_parent));
    // The kernel first (its layouts check the expectation itself), then
    // aspace at the same addresses.
    let r = match on_kernel(s) {
        Some((r, child, parent)) => {
            assert_eq!(child, want_child, "{}: kernel child", s.name);
            assert_eq!(parent, want_parent, "{}: kernel parent", s.name);
            r
        }
        None => Region::new(aspace_target::DEFAULT_REGION_START, PAGES),
    };
    let (child, parent) = on_aspace(s, r);
    assert_eq!(child, want_child, "{}: aspace child", s.name);
    assert_eq!(parent, want_parent, "{}: aspace parent", s.name);
}

#[test]
fn a_new_neighbour_merges_in_the_parent_but_not_in_the_child() {
    // The child's VMA is chained to the parent's anon_vma (two entries), so
    // an anon_vma-less mapping next to it stays apart; in the parent, whose
    // chain is singular, the same mapping merges.
    run(
        &Scenario {
            name: "new neighbour",
            before: &[Map(0, 8, RW), Touch(0)],
            child: &[Map(8, 4, RW)],
            parent: &[Map(8, 4, RW)],
        },
        &[(0, 8, "rw-p"), (8, 12, "rw-p")],
        &[(0, 12, "rw-p")],
    );
}

#[test]
fn an_mprotect_split_merges_back_in_the_child() {
    // Both halves keep the same anon_vma, so restoring the protection
    // merges them again.
    run(
        &Scenario {
            name: "split and merge",
            before: &[Map(0, 8, RW), Touch(0)],
            child: &[Protect(2, 2, PROT_READ), Protect(2, 2, RW)],
            parent: &[Protect(5, 1, PROT_READ)],
        },
        &[(0, 8, "rw-p")],
        &[(0, 5, "rw-p"), (5, 6, "r--p"), (6, 8, "rw-p")],
    );
}

#[test]
fn an_anon_vma_less_vma_joins_only_the_neighbour_with_a_singular_chain() {
    // The case a long fork_model run found: [10, 11) has no anon_vma; the
    // VMA below it is chained to the parent's family, the one above has
    // the child's own anon_vma. Making [10, 11) writable merges it upwards
    // only.
    run(
        &Scenario {
            name: "merge up",
            before: &[Map(0, 16, RW), Protect(10, 1, PROT_READ), Touch(0)],
            child: &[Touch(11), Protect(7, 4, RW)],
            parent: &[Protect(7, 4, RW)],
        },
        &[(0, 10, "rw-p"), (10, 16, "rw-p")],
        &[(0, 16, "rw-p")],
    );
}

#[test]
fn a_mapping_refilled_between_chained_pieces_stays_apart() {
    // After a hole is punched and mapped again in the child, the new VMA
    // has no anon_vma and both neighbours have two-entry chains.
    run(
        &Scenario {
            name: "refill",
            before: &[Map(0, 8, RW), Touch(0), Touch(7)],
            child: &[Unmap(3, 2), Map(3, 2, RW)],
            parent: &[Unmap(3, 2), Map(3, 2, RW)],
        },
        &[(0, 3, "rw-p"), (3, 5, "rw-p"), (5, 8, "rw-p")],
        &[(0, 8, "rw-p")],
    );
}

#[test]
fn vmas_with_different_anon_vmas_never_merge() {
    // In the child, [4, 8) cannot merge with the chained [0, 4) when made
    // writable, and its first write gives it an anon_vma of its own (the
    // neighbour's is not reusable: its chain is not singular). From then
    // on no protection change merges them.
    run(
        &Scenario {
            name: "different anon_vmas",
            before: &[Map(0, 4, RW), Touch(0), Map(4, 4, PROT_READ)],
            child: &[
                Protect(4, 4, RW),
                Touch(4),
                Protect(0, 8, PROT_READ),
                Protect(0, 8, RW),
            ],
            parent: &[Protect(4, 4, RW), Touch(4)],
        },
        &[(0, 4, "rw-p"), (4, 8, "rw-p")],
        &[(0, 8, "rw-p")],
    );
}
