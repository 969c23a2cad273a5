//! Soft-dirty tracking, `clear_refs` and `pagemap`, against the kernel.
//!
//! Each scenario runs the same calls on a reserved region of this process
//! and on an [`aspace::AddressSpace`], and reads `/proc/self/pagemap` (and
//! `AddressSpace::pagemap`) page by page. The present, exclusive, file,
//! swapped and uffd-wp bits must agree with the kernel. The soft-dirty bit
//! is compared too where the running kernel tracks it
//! (`CONFIG_MEM_SOFT_DIRTY`); every scenario also states the soft-dirty
//! bits it expects, from Linux's code, and both sides must show them
//! (a kernel without soft-dirty is only held to the other bits).
//!
//! `clear_refs` on the kernel side resets the whole test process: other
//! tests of this binary only ever see extra write faults from it.

mod common;

use aspace::{ClearRefs, FaultLocking, PagemapEntry};
use common::aspace_target::AspaceTarget;
use common::kernel::KernelTarget;
use common::*;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

const RW: u32 = PROT_READ | PROT_WRITE;
/// Held by every test that uses the kernel side.
static KERNEL: Mutex<()> = Mutex::new(());
const ANON: u32 = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED;
const SHARED: u32 = MAP_SHARED | MAP_ANONYMOUS | MAP_FIXED;
/// The bits compared with any kernel.
const COMPARED: u64 =
    PagemapEntry::PRESENT | PagemapEntry::EXCLUSIVE | PagemapEntry::FILE | PagemapEntry::SWAPPED;

/// One side of the comparison.
enum Side {
    Kernel(KernelTarget),
    Aspace(Box<AspaceTarget>),
}

impl Side {
    fn t(&mut self) -> &mut dyn Target {
        match self {
            Side::Kernel(k) => k,
            Side::Aspace(a) => &mut **a,
        }
    }

    /// Address of interior page `i`.
    fn page(&mut self, i: u64) -> u64 {
        self.t().region().page(i)
    }

    /// The raw pagemap entries of `n` interior pages from page `first`.
    fn pagemap(&mut self, first: u64, n: u64) -> Vec<u64> {
        let a = self.page(first);
        match self {
            Side::Kernel(_) => kernel_pagemap(a, n),
            Side::Aspace(t) => {
                t.mm.pagemap(a, n * PAGE)
                    .unwrap()
                    .iter()
                    .map(|e| e.raw())
                    .collect()
            }
        }
    }

    fn clear_refs(&mut self, v: i64) {
        match self {
            Side::Kernel(_) => kernel_clear_refs(v).unwrap(),
            Side::Aspace(t) => t.mm.clear_refs(ClearRefs::from_raw(v).unwrap()),
        }
    }

    fn write(&mut self, page: u64) {
        let a = self.page(page);
        self.t().write(a, &[page as u8 + 1]).unwrap();
    }

    fn read(&mut self, page: u64) {
        let a = self.page(page);
        let mut b = [0u8];
        self.t().read(a, &mut b).unwrap();
    }

    fn mmap(&mut self, page: u64, n: u64, prot: u32, flags: u32) {
        let a = self.page(page);
        assert_eq!(self.t().mmap(a, n * PAGE, prot, flags), Ok(a));
    }

    fn mprotect(&mut self, page: u64, n: u64, prot: u32) {
        let a = self.page(page);
        assert_eq!(self.t().mprotect(a, n * PAGE, prot), Ok(()));
    }

    /// Number of VMAs in the interior.
    fn vmas(&mut self) -> usize {
        let r = self.t().region();
        self.t()
            .layout()
            .iter()
            .filter(|v| v.start >= r.lo && v.end <= r.hi)
            .count()
    }
}

fn kernel_pagemap(addr: u64, n: u64) -> Vec<u64> {
    let f = std::fs::File::open("/proc/self/pagemap").unwrap();
    let mut b = vec![0u8; 8 * n as usize];
    f.read_exact_at(&mut b, addr / PAGE * 8).unwrap();
    b.chunks(8)
        .map(|c| u64::from_ne_bytes(c.try_into().unwrap()))
        .collect()
}

fn kernel_clear_refs(v: i64) -> Result<(), i32> {
    std::fs::write("/proc/self/clear_refs", v.to_string())
        .map_err(|e| e.raw_os_error().unwrap_or(0))
}

/// Whether the running kernel tracks soft-dirty: a written page reads
/// soft-dirty.
fn kernel_tracks_soft_dirty() -> Option<bool> {
    let mut k = KernelTarget::new(1)?;
    let a = k.region().page(0);
    k.mmap(a, PAGE, RW, ANON).ok()?;
    k.write(a, &[1]).ok()?;
    Some(kernel_pagemap(a, 1)[0] & PagemapEntry::SOFT_DIRTY != 0)
}

/// Soft-dirty bits as a string: `D` soft-dirty, `.` clean.
fn dirty(pm: &[u64]) -> String {
    pm.iter()
        .map(|e| {
            if e & PagemapEntry::SOFT_DIRTY != 0 {
                'D'
            } else {
                '.'
            }
        })
        .collect()
}

/// The compared bits as a string per page: `-` nothing, else `p` present
/// plus `x` exclusive and `f` file.
fn shape(pm: &[u64]) -> Vec<String> {
    pm.iter()
        .map(|&e| {
            let e = e & COMPARED;
            if e == 0 {
                return "-".into();
            }
            let mut s = String::new();
            for (b, c) in [
                (PagemapEntry::PRESENT, 'p'),
                (PagemapEntry::EXCLUSIVE, 'x'),
                (PagemapEntry::FILE, 'f'),
                (PagemapEntry::SWAPPED, 's'),
            ] {
                if e & b != 0 {
                    s.push(c);
                }
            }
            s
        })
        .collect()
}

/// Runs `f` on the kernel, then on aspace; each returns its pagemap
/// snapshots (labelled). The compared bits must agree; the soft-dirty bits
/// of every snapshot must be the expected ones on aspace, and on the
/// kernel where it tracks them.
/// Labelled pagemap snapshots with their expected soft-dirty bits.
type Snapshots = Vec<(&'static str, Vec<u64>, &'static str)>;

fn compare(pages: u64, f: impl Fn(&mut Side) -> Snapshots) {
    // One scenario at a time: a fork (or a reset) of this process by
    // another test would change what this one reads.
    let _one = KERNEL.lock().unwrap_or_else(|e| e.into_inner());
    let kernel = KernelTarget::new(pages).map(|k| f(&mut Side::Kernel(k)));
    let region = Region::new(aspace_target::DEFAULT_REGION_START, pages);
    let base = AspaceTarget::new(region).mm.config().clone();
    let mut ours: Option<Snapshots> = None;
    // The speculative and mmap_lock fault paths must set the same bits.
    for locking in [
        FaultLocking::PerVma,
        FaultLocking::Speculative,
        FaultLocking::MmapLock,
    ] {
        let cfg = aspace::Config {
            fault_locking: locking,
            ..base.clone()
        };
        let got = f(&mut Side::Aspace(Box::new(AspaceTarget::with_config(
            region, cfg,
        ))));
        match &ours {
            Some(first) => {
                for ((label, a, _), (_, b, _)) in first.iter().zip(&got) {
                    let bits = |pm: &[u64]| (shape(pm), dirty(pm));
                    assert_eq!(bits(a), bits(b), "{locking:?} differs at {label}");
                }
            }
            None => ours = Some(got),
        }
    }
    check(kernel, ours.unwrap());
}

/// Checks aspace's snapshots (their soft-dirty bits as expected) and the
/// kernel's, if it ran, against them.
fn check(kernel: Option<Snapshots>, ours: Snapshots) {
    let k_dirty = kernel_tracks_soft_dirty();
    for (label, pm, want) in &ours {
        assert_eq!(dirty(pm), *want, "aspace soft-dirty bits at {label}");
    }
    let Some(kernel) = kernel else {
        eprintln!("kernel side skipped");
        return;
    };
    assert_eq!(kernel.len(), ours.len());
    for ((label, k, want), (_, a, _)) in kernel.iter().zip(&ours) {
        assert_eq!(shape(k), shape(a), "present/exclusive/file bits at {label}");
        if k_dirty == Some(true) {
            assert_eq!(dirty(k), *want, "kernel soft-dirty bits at {label}");
        }
    }
}

/// Private anonymous memory: new memory is soft-dirty; a reset cleans
/// every page; a write after it (fresh frame, zero page, or the reused
/// frame) is recorded; mprotect back to writable does not hide a write.
#[test]
fn anon_writes_after_a_reset_are_recorded() {
    compare(6, |s| {
        let mut out = Vec::new();
        s.mmap(0, 4, RW, ANON);
        out.push(("fresh", s.pagemap(0, 4), "DDDD"));
        s.write(0);
        s.read(1); // the zero page
        out.push(("written", s.pagemap(0, 4), "DDDD"));
        let pfn0 = s.pagemap(0, 1)[0] & PagemapEntry::PFN_MASK;
        s.clear_refs(4);
        out.push(("cleared", s.pagemap(0, 4), "...."));
        s.write(0); // reuses the frame
        s.write(2); // a new frame
        out.push(("rewritten", s.pagemap(0, 4), "D.D."));
        assert_eq!(
            s.pagemap(0, 1)[0] & PagemapEntry::PFN_MASK,
            pfn0,
            "the write after the reset reused the frame"
        );
        s.write(1); // copies the zero page
        out.push(("zero page written", s.pagemap(0, 4), "DDD."));
        s.clear_refs(4);
        s.mprotect(0, 4, PROT_READ);
        s.mprotect(0, 4, RW);
        s.write(2);
        out.push(("mprotect round trip", s.pagemap(0, 4), "..D."));
        // Holes and the guard pages around: no entry, no bit.
        s.clear_refs(4);
        let r = s.t().region();
        let all = s.pagemap(0, r.pages());
        assert!(all[4..].iter().all(|&e| e == 0), "{all:x?}");
        out
    });
}

/// An mmap that merges with a cleared VMA makes the whole merged VMA
/// soft-dirty (Linux's `__mmap_complete`): the known loss.
#[test]
fn mmap_merging_into_a_cleared_vma_dirties_all_of_it() {
    compare(6, |s| {
        let mut out = Vec::new();
        s.mmap(0, 2, RW, ANON);
        s.write(0);
        s.write(1);
        s.clear_refs(4);
        out.push(("cleared", s.pagemap(0, 4), "...."));
        s.mmap(2, 2, RW, ANON);
        assert_eq!(s.vmas(), 1, "the new mapping merged");
        out.push(("merged", s.pagemap(0, 4), "DDDD"));
        out
    });
}

/// A flag change that merges a range into a neighbour gives the merged VMA
/// the changed range's soft-dirty bit, either way.
#[test]
fn mprotect_merges_take_the_changed_ranges_bit() {
    compare(6, |s| {
        let mut out = Vec::new();
        s.mmap(0, 2, RW, ANON);
        s.clear_refs(4);
        s.mmap(2, 2, PROT_READ, ANON);
        out.push(("apart", s.pagemap(0, 4), "..DD"));
        // The cleared range joins the new VMA: its untouched pages read
        // clean from now on, though they are new since the reset.
        s.mprotect(0, 2, PROT_READ);
        assert_eq!(s.vmas(), 1);
        out.push(("cleared range merged", s.pagemap(0, 4), "...."));
        s.mmap(4, 2, RW, ANON);
        out.push(("apart again", s.pagemap(0, 6), "....DD"));
        s.mprotect(4, 2, PROT_READ);
        assert_eq!(s.vmas(), 1);
        // A new range joins a cleared VMA: all of it reads soft-dirty.
        out.push(("new range merged", s.pagemap(0, 6), "DDDDDD"));
        out
    });
}

/// Shared anonymous memory: a read fault after a reset maps the page
/// read-only, so the first write faults and is recorded; object pages
/// read as file pages, exclusive while mapped once.
#[test]
fn shared_pages_fault_for_their_first_write_after_a_reset() {
    compare(4, |s| {
        let mut out = Vec::new();
        s.mmap(0, 3, RW, SHARED);
        s.read(0);
        s.write(1);
        out.push(("touched", s.pagemap(0, 3), "DDD"));
        s.clear_refs(4);
        s.read(2);
        out.push(("cleared", s.pagemap(0, 3), "..."));
        s.write(0);
        s.write(2);
        out.push(("written", s.pagemap(0, 3), "D.D"));
        s.clear_refs(4);
        s.mprotect(0, 3, PROT_READ);
        s.mprotect(0, 3, RW);
        s.write(1);
        out.push(("mprotect round trip", s.pagemap(0, 3), ".D."));
        out
    });
}

/// mremap moving entries one by one marks them soft-dirty (Linux's
/// `move_soft_dirty_pte`); the moved VMA keeps the old one's (cleared)
/// bit, so its untouched pages read clean; growing in place adds none.
#[test]
fn mremap_moves_mark_entries_soft_dirty() {
    compare(10, |s| {
        let mut out = Vec::new();
        s.mmap(0, 3, RW, ANON);
        s.write(0);
        s.write(1);
        s.clear_refs(4);
        let (from, to) = (s.page(0), s.page(5));
        let got = s
            .t()
            .mremap(from, 3 * PAGE, 3 * PAGE, MREMAP_MAYMOVE | MREMAP_FIXED, to);
        assert_eq!(got, Ok(to));
        out.push(("moved", s.pagemap(5, 3), "DD."));
        s.clear_refs(4);
        let got = s.t().mremap(to, 3 * PAGE, 4 * PAGE, 0, 0);
        assert_eq!(got, Ok(to));
        out.push(("grown in place", s.pagemap(5, 4), "...."));
        out
    });
}

/// fork: the child's entries keep their soft-dirty bits, and both sides'
/// pages stop being exclusive while the child lives.
#[test]
fn fork_keeps_soft_dirty_bits() {
    compare(4, |s| {
        let mut out = Vec::new();
        s.mmap(0, 3, RW, ANON);
        s.write(0);
        s.write(1);
        s.clear_refs(4);
        s.write(1);
        out.push(("parent before", s.pagemap(0, 3), ".D."));
        let a = s.page(0);
        match s {
            Side::Kernel(_) => {
                let (child, parent_during) = kernel_fork_pagemap(a, 3);
                out.push(("child", child, ".D."));
                out.push(("parent during", parent_during, ".D."));
            }
            Side::Aspace(t) => {
                let c = t.mm.fork().unwrap();
                let raw = |mm: &aspace::AddressSpace| -> Vec<u64> {
                    mm.pagemap(a, 3 * PAGE)
                        .unwrap()
                        .iter()
                        .map(|e| e.raw())
                        .collect()
                };
                out.push(("child", raw(&c), ".D."));
                out.push(("parent during", raw(&t.mm), ".D."));
            }
        }
        out.push(("parent after", s.pagemap(0, 3), ".D."));
        out
    });
}

/// Forks this process; the child reads its own pagemap of `n <= 64` pages
/// at `addr` and sends it through a pipe, then waits for the parent to read
/// its own before it exits. Returns (child's, parent's while the child
/// lives).
fn kernel_fork_pagemap(addr: u64, n: u64) -> (Vec<u64>, Vec<u64>) {
    assert!(n <= 64);
    let path = c"/proc/self/pagemap";
    let mut to_parent = [0; 2];
    let mut to_child = [0; 2];
    // SAFETY: valid arrays of two ints for pipe to fill.
    unsafe {
        assert_eq!(libc::pipe(to_parent.as_mut_ptr()), 0);
        assert_eq!(libc::pipe(to_child.as_mut_ptr()), 0);
    }
    // SAFETY: the child makes only async-signal-safe calls (open, pread,
    // write, read, _exit) on local buffers: no allocation, no lock.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // SAFETY: as above; buffers are local arrays of the given length.
        unsafe {
            let mut buf = [0u64; 64];
            let fd = libc::open(path.as_ptr(), libc::O_RDONLY);
            let len = 8 * n as usize;
            let got = libc::pread(fd, buf.as_mut_ptr().cast(), len, (addr / PAGE * 8) as i64);
            libc::write(to_parent[1], buf.as_ptr().cast(), len);
            let mut b = [0u8; 1];
            libc::read(to_child[0], b.as_mut_ptr().cast(), 1);
            libc::_exit(if got == len as isize { 0 } else { 1 });
        }
    }
    let mut child = vec![0u64; n as usize];
    // SAFETY: our pipe ends; `child` has room for `n` entries.
    unsafe {
        libc::close(to_parent[1]);
        libc::close(to_child[0]);
        let len = 8 * n as usize;
        assert_eq!(
            libc::read(to_parent[0], child.as_mut_ptr().cast(), len),
            len as isize
        );
    }
    let parent = kernel_pagemap(addr, n);
    let mut status = 0;
    // SAFETY: our pipe ends and our child.
    unsafe {
        libc::write(to_child[1], [1u8].as_ptr().cast(), 1);
        libc::close(to_child[1]);
        libc::close(to_parent[0]);
        libc::waitpid(pid, &mut status, 0);
    }
    assert_eq!(status, 0, "child status");
    (child, parent)
}

/// clear_refs accepts 1 to 5, as Linux does, and refuses the rest.
#[test]
fn clear_refs_values_match_the_kernel() {
    let _one = KERNEL.lock().unwrap_or_else(|e| e.into_inner());
    for v in [0i64, 1, 2, 3, 5, 6, 42, -1] {
        let ours = ClearRefs::from_raw(v).map(|_| ()).map_err(|e| e.errno());
        if KernelTarget::new(1).is_some() {
            assert_eq!(kernel_clear_refs(v), ours, "clear_refs {v}");
        }
        if let Ok(c) = ClearRefs::from_raw(v) {
            let a = AspaceTarget::new(Region::new(aspace_target::DEFAULT_REGION_START, 1));
            a.mm.clear_refs(c);
        }
    }
}

/// pagemap's arguments: unaligned EINVAL, the range stops at the task
/// size, an empty range reads nothing.
#[test]
fn pagemap_arguments() {
    let a = AspaceTarget::new(Region::new(aspace_target::DEFAULT_REGION_START, 1));
    let mm = &a.mm;
    assert_eq!(mm.pagemap(1, PAGE).unwrap_err().errno(), EINVAL);
    assert!(mm.pagemap(0, 0).unwrap().is_empty());
    let top = TASK_SIZE - PAGE;
    assert_eq!(mm.pagemap(top, u64::MAX).unwrap().len(), 1);
    assert!(mm.pagemap(TASK_SIZE, PAGE).unwrap().is_empty());
    let mut buf = [PagemapEntry::default(); 4];
    assert_eq!(mm.pagemap_into(top, &mut buf), Ok(1));
    assert_eq!(mm.pagemap_into(0, &mut []), Ok(0));
}

/// brk growth makes the heap VMA soft-dirty again (Linux's
/// `do_brk_flags`); aspace only, since the test process's break is not
/// the test's to move.
#[test]
fn brk_growth_dirties_the_heap() {
    let mm = aspace::AddressSpace::new(aspace::Config::default());
    let base = mm.brk(0).unwrap();
    mm.brk(base + PAGE).unwrap();
    mm.write(base, b"h").unwrap();
    mm.clear_refs(ClearRefs::SoftDirty);
    assert!(!mm.pagemap(base, PAGE).unwrap()[0].is_soft_dirty());
    mm.brk(base + 2 * PAGE).unwrap();
    let pm = mm.pagemap(base, 2 * PAGE).unwrap();
    assert!(pm[0].is_soft_dirty() && pm[1].is_soft_dirty(), "{pm:?}");
}

/// A writer thread stores into pages in turn while the main thread resets
/// and reads out: every page written by a store that began after the reset
/// returned reads soft-dirty. Once through `write`, once through a
/// translator (whose cached writable translations the reset must flush).
#[test]
fn no_write_after_a_reset_is_lost() {
    for translator in [false, true] {
        writer_vs_reset(translator);
    }
}

fn writer_vs_reset(translator: bool) {
    const PAGES: u64 = 16;
    let mm = Arc::new(aspace::AddressSpace::new(aspace::Config::default()));
    let rw = aspace::Prot::READ | aspace::Prot::WRITE;
    let base = mm
        .mmap(
            0,
            PAGES * PAGE,
            rw,
            aspace::MapFlags::PRIVATE | aspace::MapFlags::ANONYMOUS,
        )
        .unwrap();
    // Completed stores: store `i` went to page `i % PAGES`.
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (mm, done, stop) = (mm.clone(), done.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut t = translator.then(|| mm.translator());
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let a = base + (i % PAGES) * PAGE;
                match &mut t {
                    Some(t) => t.store::<u64>(a, i).unwrap(),
                    None => mm.write(a, &i.to_ne_bytes()).unwrap(),
                }
                done.store(i, Ordering::SeqCst);
            }
        })
    };
    for _ in 0..300 {
        mm.clear_refs(ClearRefs::SoftDirty);
        let start = done.load(Ordering::SeqCst);
        std::thread::yield_now();
        let end = done.load(Ordering::SeqCst);
        let pm = mm.pagemap(base, PAGES * PAGE).unwrap();
        // Store `start + 1` may have begun before the reset returned;
        // every later one began after it.
        for i in start + 2..=end.min(start + 1 + PAGES) {
            let p = (i % PAGES) as usize;
            assert!(
                pm[p].is_soft_dirty(),
                "store {i} to page {p} after the reset is lost ({start}..={end}, translator: {translator})"
            );
        }
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
}

/// A memfd mapped shared and privately: its pages read as file pages
/// (exclusive while one entry maps them), a private copy as an anonymous
/// page; both kinds record writes after a reset.
#[test]
fn memfd_pages_read_as_file_pages() {
    const SHARED_FD: u32 = MAP_SHARED | MAP_FIXED;
    const PRIVATE_FD: u32 = MAP_PRIVATE | MAP_FIXED;
    let steps = |s: &mut Side, map: &mut dyn FnMut(&mut Side, u64, u32)| {
        let mut out = Vec::new();
        map(s, 0, SHARED_FD);
        map(s, 5, PRIVATE_FD);
        s.write(0);
        s.read(5); // the object's page 0, also mapped shared
        s.read(6); // the object's page 1, mapped once
        s.write(7); // a private copy of page 2
        out.push(("touched", s.pagemap(0, 9), "DDDD.DDDD"));
        s.clear_refs(4);
        out.push(("cleared", s.pagemap(0, 9), "........."));
        s.write(1);
        s.write(6); // copy-on-write of a file page
        s.write(7); // the private copy, reused
        out.push(("written", s.pagemap(0, 9), ".D....DD."));
        out
    };
    let _one = KERNEL.lock().unwrap_or_else(|e| e.into_inner());
    let kernel = KernelTarget::new(10).map(|k| {
        let name = c"soft_dirty";
        // SAFETY: a valid C string.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), 0) };
        assert!(fd >= 0);
        // SAFETY: our descriptor.
        assert_eq!(unsafe { libc::ftruncate(fd, (4 * PAGE) as i64) }, 0);
        let mut s = Side::Kernel(k);
        let out = steps(&mut s, &mut |s, page, flags| {
            let a = s.page(page);
            // SAFETY: `a` and the 4 pages after it lie in the region's
            // interior, which no Rust object uses.
            let p = unsafe {
                libc::mmap(
                    a as *mut libc::c_void,
                    (4 * PAGE) as usize,
                    (PROT_READ | PROT_WRITE) as i32,
                    flags as i32,
                    fd,
                    0,
                )
            };
            assert_eq!(p as u64, a);
        });
        // SAFETY: our descriptor; the mappings keep the object.
        unsafe { libc::close(fd) };
        out
    });
    let region = Region::new(aspace_target::DEFAULT_REGION_START, 10);
    let a = AspaceTarget::new(region);
    let memfd = aspace::Memfd::new_in(a.mm.frame_pool(), "soft_dirty", 4 * PAGE).unwrap();
    let mut s = Side::Aspace(Box::new(a));
    let ours = steps(&mut s, &mut |s, page, flags| {
        let a = s.page(page);
        let Side::Aspace(t) = s else { unreachable!() };
        let got = t.mm.mmap_fd(
            a,
            4 * PAGE,
            aspace::Prot::READ | aspace::Prot::WRITE,
            aspace::MapFlags::from_bits_retain(flags),
            &memfd,
            0,
        );
        assert_eq!(got, Ok(a));
    });
    check(kernel, ours);
}

/// The speculative fault path installs written entries soft-dirty, as the
/// per-VMA path does (it runs only where a PTE table's whole 2 MiB span
/// lies inside the VMA, so this needs a large mapping; aspace only).
#[test]
fn speculative_faults_record_writes() {
    let mm = aspace::AddressSpace::new(aspace::Config {
        fault_locking: FaultLocking::Speculative,
        ..aspace::Config::default()
    });
    let len = 4 << 20;
    let rw = aspace::Prot::READ | aspace::Prot::WRITE;
    let anon = aspace::MapFlags::PRIVATE | aspace::MapFlags::ANONYMOUS;
    let base = mm.mmap(0, len, rw, anon).unwrap();
    // A span of one PTE table inside the VMA; its first write gives the
    // VMA its anon_vma and the span its table.
    let span = (base + (2 << 20) - 1) & !((2 << 20) - 1);
    mm.write(span, b"a").unwrap();
    mm.clear_refs(ClearRefs::SoftDirty);
    let before = mm.stats().fault_speculative;
    mm.write(span + PAGE, b"b").unwrap();
    assert_eq!(
        mm.stats().fault_speculative,
        before + 1,
        "a speculative fault"
    );
    let pm = mm.pagemap(span, 3 * PAGE).unwrap();
    assert!(!pm[0].is_soft_dirty() && pm[1].is_soft_dirty() && !pm[2].is_soft_dirty());
    assert!(pm[1].is_present() && pm[1].is_exclusive());
}
