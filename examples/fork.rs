//! Whole-space operations against the real kernel: fork, and creating and
//! dropping an idle address space.
//!
//! ```text
//! cargo run --release --example fork -- [--reps N]
//! ```
//!
//! Each row builds one layout twice: in a region of this very process
//! (for the kernel's `fork(2)`), and in an [`AddressSpace`] (for
//! `mm.fork()`). The layouts are N one-page private anonymous VMAs, every
//! page written, with alternating protections (rw-p, r--p) so that none
//! merge — one mapping, written, then every other page made read-only,
//! so they share one anon_vma as real split mappings do — and one 256 MiB
//! VMA, written. Best of `--reps` (20) each.
//!
//! The kernel column is the time from calling `fork()` until the child
//! reports through a pipe that it is running: by then the kernel has
//! copied the memory map (VMAs, anon_vma chains, page tables) and the
//! child exists, which is what `mm.fork()` returns. The child then exits
//! at once with `_exit`; its teardown (exit_mmap) is not timed, since
//! `mm.fork()` does not include the child's teardown either: dropping the
//! child is timed separately (`drop child`). The time until `fork()`
//! returns in the parent is printed too (`ret`), with the ratio against
//! it: it leaves out the child's wake-up, which a loaded machine delays,
//! so it is the stricter comparison.
//!
//! All kernel rows run before any address space is built, so the kernel
//! never copies aspace's own frames along with the layout.

#[path = "../benches/common/machine.rs"]
mod machine;

use aspace::{AddressSpace, Config, MapFlags, Prot};
use machine::{machine, parse_arg};
use std::time::{Duration, Instant};

const PAGE: u64 = 4096;
const RW: Prot = Prot::READ.union(Prot::WRITE);
const ANON: MapFlags = MapFlags::PRIVATE.union(MapFlags::ANONYMOUS);

/// One layout: `pages` pages, one VMA each (alternating protections) or
/// one VMA over all of them.
#[derive(Clone, Copy)]
struct Layout {
    name: &'static str,
    pages: u64,
    split: bool,
}

const LAYOUTS: [Layout; 4] = [
    Layout {
        name: "100 VMAs",
        pages: 100,
        split: true,
    },
    Layout {
        name: "1,000 VMAs",
        pages: 1000,
        split: true,
    },
    Layout {
        name: "10,000 VMAs",
        pages: 10_000,
        split: true,
    },
    Layout {
        name: "256 MiB, 1 VMA",
        pages: 65_536,
        split: false,
    },
];

/// Kernel fork timings of one layout: (fork until the child runs, fork
/// until it returns in the parent), best of `reps` each.
fn kernel_fork(l: Layout, reps: usize) -> (Duration, Duration) {
    let len = (l.pages * PAGE) as usize;
    // SAFETY: a fresh PROT_NONE reservation with a guard page at each end,
    // at an address of the kernel's choosing: nothing else lives there.
    let base = unsafe {
        let r = libc::mmap(
            core::ptr::null_mut(),
            len + 2 * PAGE as usize,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        );
        assert_ne!(r, libc::MAP_FAILED, "reserve the region");
        r.cast::<u8>().add(PAGE as usize)
    };
    // SAFETY: `base..base + len` is the interior of our reservation; the
    // stores go to pages just mapped writable; mprotect stays inside.
    unsafe {
        let m = libc::mmap(
            base.cast(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        );
        assert_eq!(m, base.cast(), "map the layout");
        for p in 0..l.pages as usize {
            base.add(p * PAGE as usize).write_volatile(p as u8 | 1);
        }
        if l.split {
            for p in (1..l.pages as usize).step_by(2) {
                let at = base.add(p * PAGE as usize).cast();
                assert_eq!(libc::mprotect(at, PAGE as usize, libc::PROT_READ), 0);
            }
        }
    }
    let mut best_run = Duration::MAX;
    let mut best_ret = Duration::MAX;
    for _ in 0..reps {
        let mut fds = [0; 2];
        // SAFETY: `fds` is an array of two ints for pipe2 to fill.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        let t0 = Instant::now();
        // SAFETY: the child only writes one byte to the pipe and calls
        // `_exit` (both async-signal-safe): it allocates nothing and takes
        // no lock.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: a one-byte buffer on the stack; `_exit` runs no
            // destructors.
            unsafe {
                libc::write(fds[1], [1u8].as_ptr().cast(), 1);
                libc::_exit(0);
            }
        }
        let ret = t0.elapsed();
        assert!(pid > 0, "fork failed");
        let mut b = [0u8];
        // SAFETY: reading one byte into a local buffer from our pipe.
        let n = unsafe { libc::read(fds[0], b.as_mut_ptr().cast(), 1) };
        let run = t0.elapsed();
        assert_eq!(n, 1, "the child reports it runs");
        let mut status = 0;
        // SAFETY: waiting for our own child; closing our own pipe ends.
        unsafe {
            libc::waitpid(pid, &mut status, 0);
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
        best_run = best_run.min(run);
        best_ret = best_ret.min(ret);
    }
    // SAFETY: unmapping our own reservation, which nothing refers to.
    unsafe { libc::munmap(base.sub(PAGE as usize).cast(), len + 2 * PAGE as usize) };
    (best_run, best_ret)
}

/// aspace timings of one layout: (`mm.fork()`, dropping the child), best
/// of `reps` each.
fn aspace_fork(l: Layout, reps: usize) -> (Duration, Duration) {
    let mm = AddressSpace::new(Config::default());
    mm.prefault_frames(l.pages * PAGE);
    let a = mm
        .mmap(0, l.pages * PAGE, RW, ANON)
        .expect("map the layout");
    for p in 0..l.pages {
        mm.write(a + p * PAGE, &[p as u8 | 1]).expect("write");
    }
    if l.split {
        for p in (1..l.pages).step_by(2) {
            mm.mprotect(a + p * PAGE, PAGE, Prot::READ)
                .expect("mprotect");
        }
    }
    assert_eq!(
        mm.map_count() as u64,
        if l.split { l.pages } else { 1 },
        "layout"
    );
    let mut best_fork = Duration::MAX;
    let mut best_drop = Duration::MAX;
    for _ in 0..reps {
        let t0 = Instant::now();
        let child = mm.fork().expect("fork");
        best_fork = best_fork.min(t0.elapsed());
        let t1 = Instant::now();
        drop(child);
        best_drop = best_drop.min(t1.elapsed());
    }
    (best_fork, best_drop)
}

/// Creating and dropping an idle address space: (new, drop), best of
/// `reps` each.
fn create_drop(reps: usize) -> (Duration, Duration) {
    let mut best_new = Duration::MAX;
    let mut best_drop = Duration::MAX;
    for _ in 0..reps {
        let t0 = Instant::now();
        let mm = AddressSpace::new(Config::default());
        best_new = best_new.min(t0.elapsed());
        let t1 = Instant::now();
        drop(mm);
        best_drop = best_drop.min(t1.elapsed());
    }
    (best_new, best_drop)
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn main() {
    let mut reps = 20;
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match (arg.as_str(), it.next()) {
            ("--reps", Some(v)) => {
                reps = parse_arg(&v, |&n: &usize| n > 0 && n <= 10_000).unwrap_or_else(|| usage())
            }
            _ => usage(),
        }
    }
    println!("fork on {}, best of {reps}", machine());
    // Every kernel row first: see the module docs.
    let kernel: Vec<_> = LAYOUTS.iter().map(|&l| kernel_fork(l, reps)).collect();
    println!(
        "{:<16} {:>12} {:>10} {:>12} {:>7} {:>9} {:>12}",
        "layout", "kernel fork", "(ret)", "mm.fork()", "ratio", "(vs ret)", "drop child"
    );
    for (&l, &(krun, kret)) in LAYOUTS.iter().zip(&kernel) {
        let (f, d) = aspace_fork(l, reps);
        println!(
            "{:<16} {:>9.1} us {:>7.1} us {:>9.1} us {:>6.2}x {:>8.2}x {:>9.1} us",
            l.name,
            us(krun),
            us(kret),
            us(f),
            us(f) / us(krun),
            us(f) / us(kret),
            us(d)
        );
    }
    let (n, d) = create_drop(reps);
    println!(
        "create + drop of an idle space: {:.1} us ({:.1} us new, {:.1} us drop)",
        us(n) + us(d),
        us(n),
        us(d)
    );
}

fn usage() -> ! {
    eprintln!("usage: fork [--reps N]");
    std::process::exit(2)
}
