//! mremap's page-table moves and TLB flushes in every
//! [`MremapExtent`] mode: data moves intact, flush counts follow the
//! extent arithmetic, whole aligned PTE tables are relinked rather than
//! copied, and readers racing with moves see the old mapping or the new
//! one (or a clean fault), never another page's frame.

#[path = "common/rng.rs"]
mod rng;

use aspace::{
    Access, AddressSpace, Advice, Config, Error, FaultError, MapFlags, MremapExtent, MremapFlags,
    Prot, Stats, PAGE_SIZE,
};
use rng::XorShift;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

const PMD: u64 = 2 << 20;
const RW: Prot = Prot::READ.union(Prot::WRITE);
/// PMD-aligned bases of the source and destination areas.
const SRC: u64 = 0x10_0000_0000;
const DST: u64 = 0x20_0000_0000;
const MODES: [MremapExtent; 3] = [
    MremapExtent::Pages(64),
    MremapExtent::Pmd,
    MremapExtent::Batched,
];

fn mm(mode: MremapExtent) -> AddressSpace {
    AddressSpace::new(Config {
        mremap_extent: mode,
        ..Config::default()
    })
}

fn fixed() -> MapFlags {
    MapFlags::PRIVATE | MapFlags::ANONYMOUS | MapFlags::FIXED
}

fn moving() -> MremapFlags {
    MremapFlags::MAYMOVE | MremapFlags::FIXED
}

/// The word every 8 bytes of page `p` holds (unique per page and tag).
fn word(tag: u64, p: u64) -> u64 {
    0x5eed_0000_0000_0000 ^ (tag << 32) ^ (p + 1)
}

fn page_bytes(tag: u64, p: u64) -> Vec<u8> {
    word(tag, p).to_le_bytes().repeat((PAGE_SIZE / 8) as usize)
}

/// Maps `pages` at `addr` and fills every page (`populated(p)`) with its
/// pattern.
fn map_filled(mm: &AddressSpace, addr: u64, pages: u64, tag: u64, populated: impl Fn(u64) -> bool) {
    mm.mmap(addr, pages * PAGE_SIZE, RW, fixed()).unwrap();
    for p in (0..pages).filter(|&p| populated(p)) {
        mm.write(addr + p * PAGE_SIZE, &page_bytes(tag, p)).unwrap();
    }
}

/// Every page of `[addr, addr + pages)` holds its pattern (or zero where
/// it was never populated).
fn check_filled(
    mm: &AddressSpace,
    addr: u64,
    pages: u64,
    tag: u64,
    populated: impl Fn(u64) -> bool,
) {
    let mut buf = vec![0u8; PAGE_SIZE as usize];
    for p in 0..pages {
        mm.read(addr + p * PAGE_SIZE, &mut buf).unwrap();
        if populated(p) {
            assert!(
                buf == page_bytes(tag, p),
                "page {p} of {addr:#x} lost its data"
            );
        } else {
            assert!(
                buf.iter().all(|&b| b == 0),
                "page {p} of {addr:#x} not zero"
            );
        }
    }
}

fn delta(after: Stats, before: Stats) -> (u64, u64, u64, u64, u64) {
    (
        after.tlb_flushes - before.tlb_flushes,
        after.tlb_pages_flushed - before.tlb_pages_flushed,
        after.tlb_shootdowns - before.tlb_shootdowns,
        after.mremap_ptes_moved - before.mremap_ptes_moved,
        after.mremap_tables_relinked - before.mremap_tables_relinked,
    )
}

#[test]
fn data_moves_intact_in_every_mode() {
    // (pages, source offset, destination offset), offsets in pages from
    // PMD-aligned bases: 2 MiB and 4 MiB aligned and unaligned moves.
    let cases = [
        (1, 0, 0),
        (1, 511, 3),
        (16, 0, 0),
        (16, 505, 0),
        (64, 0, 0),
        (64, 7, 100),
        (513, 0, 0),
        (513, 1, 0),
        (1024, 0, 0),
        (1024, 0, 1),
        (1024, 300, 300),
        (512, 0, 0),
        (512, 1, 1),
        (512, 0, 256),
    ];
    for mode in MODES {
        let mm = mm(mode);
        for (i, &(pages, so, doff)) in cases.iter().enumerate() {
            let tag = i as u64;
            let (src, dst) = (SRC + so * PAGE_SIZE, DST + doff * PAGE_SIZE);
            let len = pages * PAGE_SIZE;
            // Every third page left unpopulated: holes move as holes.
            let pop = |p: u64| p % 3 != 1;
            map_filled(&mm, src, pages, tag, pop);
            let frames = mm.frames_used();
            assert_eq!(mm.mremap(src, len, len, moving(), dst), Ok(dst));
            check_filled(&mm, dst, pages, tag, pop);
            let e = mm.read(src, &mut [0u8; 1]).map_err(|e| e.errno());
            assert_eq!(e, Err(Error::Fault.errno()), "{mode:?}");
            assert_eq!(mm.frames_used(), frames, "a move neither copies nor frees");
            // And back, letting mremap pick the place (grown by a page).
            let back = mm.mremap(dst, len, len + PAGE_SIZE, MremapFlags::MAYMOVE, 0);
            let back = back.unwrap();
            check_filled(&mm, back, pages, tag, pop);
            mm.read(back + len, &mut [0u8; 1]).unwrap();
            // DONTUNMAP leaves the old range mapped and empty.
            let third = mm
                .mremap(
                    back,
                    len,
                    len,
                    MremapFlags::MAYMOVE | MremapFlags::DONTUNMAP,
                    0,
                )
                .unwrap();
            check_filled(&mm, third, pages, tag, pop);
            check_filled(&mm, back, pages, tag, |_| false);
            mm.munmap(back, len + PAGE_SIZE).unwrap();
            mm.munmap(third, len).unwrap();
            assert_eq!(mm.frames_used(), 0, "{mode:?} case {i}");
        }
    }
}

#[test]
fn flush_counts_follow_the_extent_arithmetic() {
    struct Case {
        pages: u64,
        src_off: u64,
        dst_off: u64,
        populated: fn(u64) -> bool,
        /// Flushes for Pages(64), Pmd, Batched.
        flushes: [u64; 3],
        /// PTE tables relinked by Pmd and Batched (never by Pages(64)).
        relinked: u64,
        /// Present entries those tables carried (not copied one by one).
        carried: u64,
    }
    let all: fn(u64) -> bool = |_| true;
    let sparse: fn(u64) -> bool = |p| p == 0 || p == 700;
    let none: fn(u64) -> bool = |_| false;
    let case = |pages, src_off, dst_off, populated, flushes, relinked, carried| Case {
        pages,
        src_off,
        dst_off,
        populated,
        flushes,
        relinked,
        carried,
    };
    // case(pages, source offset, destination offset (pages from PMD-aligned
    // bases), populated, flushes [Pages(64), Pmd, Batched], relinked, carried)
    let cases = [
        // Small moves: one extent, one flush in every mode.
        case(1, 0, 0, all, [1, 1, 1], 0, 0),
        case(16, 5, 9, all, [1, 1, 1], 0, 0),
        case(64, 0, 0, all, [1, 1, 1], 0, 0),
        // 16 pages crossing the source's PMD boundary: two extents.
        case(16, 504, 0, all, [2, 2, 1], 0, 0),
        // 2 MiB aligned: 8 extents of 64 pages, or one relinked table.
        case(512, 0, 0, all, [8, 1, 1], 1, 512),
        // 4 MiB aligned.
        case(1024, 0, 0, all, [16, 2, 1], 2, 1024),
        // 513 pages: a table and one more page.
        case(513, 0, 0, all, [9, 2, 1], 1, 512),
        // 2 MiB, destination one page off: the destination's boundary
        // after 511 pages splits it (7 x 64 + 63, then 1).
        case(512, 0, 1, all, [9, 2, 1], 0, 0),
        // 2 MiB, mutually aligned but half a PMD off: two half tables.
        case(512, 256, 256, all, [8, 2, 1], 0, 0),
        // 4 MiB, both one page off: 511, then a whole table, then 1.
        case(1024, 1, 1, all, [17, 3, 1], 1, 512),
        // Sparse: pages 0 and 700 only; extents without a present entry
        // need no flush.
        case(1024, 0, 0, sparse, [2, 2, 1], 2, 2),
        // Nothing populated: nothing to flush.
        case(1024, 3, 0, none, [0, 0, 0], 0, 0),
    ];
    let pinned = pin_to(0);
    for (m, mode) in MODES.iter().enumerate() {
        for (i, c) in cases.iter().enumerate() {
            let mm = mm(*mode);
            let (src, dst) = (SRC + c.src_off * PAGE_SIZE, DST + c.dst_off * PAGE_SIZE);
            let len = c.pages * PAGE_SIZE;
            map_filled(&mm, src, c.pages, 7, c.populated);
            let present = (0..c.pages).filter(|&p| (c.populated)(p)).count() as u64;
            let before = mm.stats();
            assert_eq!(mm.mremap(src, len, len, moving(), dst), Ok(dst));
            let (flushes, pages, shootdowns, copied, relinked) = delta(mm.stats(), before);
            let what = format!("{mode:?}, case {i}");
            assert_eq!(flushes, c.flushes[m], "flushes, {what}");
            // Only this thread ever used the address space; pinned, it
            // stayed on one CPU (slots are real CPUs).
            if pinned {
                assert_eq!(shootdowns, 0, "{what}");
            }
            let relinked_want = if m == 0 { 0 } else { c.relinked };
            assert_eq!(relinked, relinked_want, "relinked tables, {what}");
            // Relinked tables carry their entries; the rest are copied.
            let carried = if m == 0 { 0 } else { c.carried };
            assert_eq!(copied, present - carried, "copied entries, {what}");
            // Flushed pages: the extents that moved something.
            if c.flushes[m] > 0 {
                assert!(
                    pages >= present && pages <= c.pages.next_multiple_of(512),
                    "{what}"
                );
            } else {
                assert_eq!(pages, 0, "{what}");
            }
            check_filled(&mm, dst, c.pages, 7, c.populated);
        }
    }
}

#[test]
fn fixed_move_over_populated_destination_is_one_flush_when_batched() {
    for (mode, want) in [
        (MremapExtent::Batched, 1),
        (MremapExtent::Pmd, 1),
        (MremapExtent::Pages(64), 8),
    ] {
        let mm = mm(mode);
        map_filled(&mm, SRC, 512, 1, |_| true);
        map_filled(&mm, DST, 512, 2, |_| true);
        let before = mm.stats();
        let len = 512 * PAGE_SIZE;
        // Unmap the destination, shrink the source's tail, move the rest.
        assert_eq!(mm.mremap(SRC, len, len - PAGE_SIZE, moving(), DST), Ok(DST));
        let (flushes, ..) = delta(mm.stats(), before);
        // The unmaps of the destination and of the source's tail gather
        // their pages; the first flush covers them too. Batched: one flush
        // for the whole call; Pmd: one per extent (the 511 pages left are
        // one extent, copied); Pages(64): 7 x 64 + 63 pages, 8 extents.
        assert_eq!(flushes, want, "{mode:?}");
        check_filled(&mm, DST, 511, 1, |_| true);
        mm.munmap(DST, len).unwrap();
        assert_eq!(mm.frames_used(), 0);
    }
}

/// Pins the calling thread to `cpu`, so that its per-CPU slot (its real
/// CPU) stays put; false if the affinity cannot be set.
fn pin_to(cpu: usize) -> bool {
    // SAFETY: `set` is a plain bit set that CPU_SET fills in;
    // sched_setaffinity(0, ..) changes only the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    }
}

/// The calling thread's CPU, which is its per-CPU slot in the address
/// space (one slot per configured CPU).
fn current_cpu() -> i32 {
    // SAFETY: sched_getcpu has no preconditions; it returns -1 on error.
    unsafe { libc::sched_getcpu() }
}

#[test]
fn shootdowns_reach_every_other_cpu_of_the_mask() {
    // Slots are real CPUs: keep each thread on one, or the mask would
    // collect every CPU the thread visited.
    if !pin_to(0) {
        return;
    }
    for mode in MODES {
        let mm = Arc::new(mm(mode));
        map_filled(&mm, SRC, 1024, 3, |_| true);
        // Another thread becomes a CPU of the address space by reading it.
        let m2 = mm.clone();
        let other = std::thread::spawn(move || {
            pin_to(1 % std::thread::available_parallelism().map_or(1, |n| n.get()));
            m2.read(SRC, &mut [0u8; 8]).unwrap();
            current_cpu()
        })
        .join()
        .unwrap();
        let same_cpu = other == current_cpu();
        let before = mm.stats();
        let len = 1024 * PAGE_SIZE;
        mm.mremap(SRC, len, len, moving(), DST).unwrap();
        let (flushes, _, shootdowns, ..) = delta(mm.stats(), before);
        assert!(flushes > 0);
        // Two CPUs in the mask: one shootdown per flush (none if the two
        // threads share a CPU slot).
        assert_eq!(shootdowns, if same_cpu { 0 } else { flushes }, "{mode:?}");
    }
}

#[test]
fn one_gib_move_relinks_tables_instead_of_copying() {
    let mm = AddressSpace::new(Config {
        memory_budget: 2 << 30,
        ..Config::default()
    });
    let len = 1 << 30;
    // Read faults map the zero page: every entry present, no memory used.
    mm.mmap(SRC, len, Prot::READ, fixed() | MapFlags::POPULATE)
        .unwrap();
    let before = mm.stats();
    assert_eq!(mm.mremap(SRC, len, len, moving(), DST), Ok(DST));
    let (flushes, pages, _, copied, relinked) = delta(mm.stats(), before);
    assert_eq!((flushes, copied, relinked), (1, 0, 512));
    assert_eq!(pages, len / PAGE_SIZE);
    let mut b = [1u8; 1];
    mm.read(DST + len - 1, &mut b).unwrap();
    assert_eq!(b, [0]);
    assert_eq!(
        mm.read(SRC, &mut b).map_err(|e| e.errno()),
        Err(Error::Fault.errno())
    );
}

/// Readers and faulters hammer two places while a mover mremaps a
/// populated range between them (and drops and refills some pages with
/// madvise, so frames are freed and reused meanwhile). Every read sees its
/// own page's pattern (or zero where the mover dropped it) or a clean
/// EFAULT; never another page's bytes.
fn race(mode: MremapExtent, dur: Duration) {
    const PAGES: u64 = 1030;
    let mm = Arc::new(mm(mode));
    // A and B are PMD-aligned (tables relink), C is not (entries copy).
    let places = [SRC, DST, DST + 64 * PMD + 3 * PAGE_SIZE];
    map_filled(&mm, places[0], PAGES, 0, |_| true);
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let readers = 2;
    let start = Arc::new(Barrier::new(readers + 1));
    let mut hs = vec![];
    for r in 0..readers {
        let (mm, stop, reads, start) = (mm.clone(), stop.clone(), reads.clone(), start.clone());
        hs.push(std::thread::spawn(move || {
            let mut rng = XorShift::new(0x2545_f491_4f6c_dd1d_u64 ^ (r as u64 + 1));
            let mut buf = [0u8; 64];
            let (mut ok, mut faults) = (0u64, 0u64);
            start.wait();
            while !stop.load(Ordering::Relaxed) {
                let x = rng.next_u64();
                let p = x % PAGES;
                let base = places[(x >> 20) as usize % 3];
                let addr = base + p * PAGE_SIZE + (x >> 40) % 63 * 64;
                if x & (1 << 33) != 0 {
                    // A fault alone: the page is there or the place is empty.
                    match mm.fault(addr, Access::Read) {
                        Ok(()) | Err(FaultError::NoMapping) => {}
                        Err(e) => panic!("fault at {addr:#x}: {e:?}"),
                    }
                    continue;
                }
                match mm.read(addr, &mut buf) {
                    Ok(()) => {
                        ok += 1;
                        for w in buf.chunks(8) {
                            let v = u64::from_le_bytes(w.try_into().unwrap());
                            assert!(
                                v == word(0, p) || v == 0,
                                "{mode:?}: page {p} at {addr:#x} read {v:#x}"
                            );
                        }
                    }
                    Err(e) if e.errno() == Error::Fault.errno() => faults += 1,
                    Err(e) => panic!("read: {e:?}"),
                }
            }
            reads.fetch_add(ok, Ordering::Relaxed);
            (ok, faults)
        }));
    }
    start.wait();
    let t0 = Instant::now();
    let len = PAGES * PAGE_SIZE;
    let mut at = 0;
    let mut moves = 0u64;
    let mut rng = XorShift::new(0x9e37_79b9_7f4a_7c15_u64);
    while t0.elapsed() < dur || moves < 30 {
        let to = (at + 1) % 3;
        assert_eq!(
            mm.mremap(places[at], len, len, moving(), places[to]),
            Ok(places[to])
        );
        at = to;
        moves += 1;
        // Drop a few pages and write their pattern back.
        let x = rng.next_u64();
        let p = x % (PAGES - 4);
        let a = places[at] + p * PAGE_SIZE;
        mm.madvise(a, 4 * PAGE_SIZE, Advice::DontNeed).unwrap();
        for q in p..p + 4 {
            mm.write(places[at] + q * PAGE_SIZE, &page_bytes(0, q))
                .unwrap();
        }
    }
    stop.store(true, Ordering::Relaxed);
    for h in hs {
        h.join().unwrap();
    }
    check_filled(&mm, places[at], PAGES, 0, |_| true);
    assert!(
        reads.load(Ordering::Relaxed) > 0,
        "the readers saw the mapping"
    );
    let s = mm.stats();
    assert!(s.tlb_flushes >= moves, "every move flushed");
    // Moves between A and B relink whole tables (except with 64-page
    // extents); moves to and from C copy entries.
    assert!(s.mremap_ptes_moved > 0);
    assert_eq!(
        s.mremap_tables_relinked > 0,
        mode != MremapExtent::Pages(64),
        "{mode:?}"
    );
    mm.munmap(places[at], len).unwrap();
    assert_eq!(mm.frames_used(), 0);
}

#[test]
fn readers_race_moves_batched() {
    race(MremapExtent::Batched, Duration::from_millis(700));
}

#[test]
fn readers_race_moves_pmd() {
    race(MremapExtent::Pmd, Duration::from_millis(700));
}

#[test]
fn readers_race_moves_pages64() {
    race(MremapExtent::Pages(64), Duration::from_millis(700));
}

#[test]
fn munmap_mprotect_madvise_flush_once_per_call() {
    let mm = mm(MremapExtent::Batched);
    // Three VMAs (alternating protections keep them apart), 300 pages
    // each, populated, across PMD boundaries.
    let n = 300;
    let len = n * PAGE_SIZE;
    let setup = |mm: &AddressSpace| {
        for i in 0..3 {
            map_filled(mm, SRC + i * len, n, i, |_| true);
        }
        mm.mprotect(SRC + len, len, Prot::READ).unwrap();
    };
    let flushes = |mm: &AddressSpace, f: &dyn Fn(&AddressSpace)| {
        let before = mm.stats().tlb_flushes;
        f(mm);
        mm.stats().tlb_flushes - before
    };
    setup(&mm);
    assert_eq!(
        flushes(&mm, &|mm| mm.mprotect(SRC, 3 * len, Prot::READ).unwrap()),
        1
    );
    assert_eq!(
        flushes(&mm, &|mm| mm
            .madvise(SRC, 3 * len, Advice::DontNeed)
            .unwrap()),
        1
    );
    mm.munmap(SRC, 3 * len).unwrap();
    setup(&mm);
    assert_eq!(flushes(&mm, &|mm| mm.munmap(SRC, 3 * len).unwrap()), 1);
    assert_eq!(mm.frames_used(), 0);
}
