//! Stress of the speculative fault path: threads write and verify patterns
//! in pages of one large VMA while another thread splits and re-merges the
//! VMA with mprotect, forks (write-protecting every entry), and zaps other
//! pages with DONTNEED; each worker also empties its own pages now and
//! then, so they fault again. Then the same in many small VMAs (16 to 256
//! KiB, several sharing each PTE table) while a thread mprotects, unmaps,
//! remaps and moves the small VMAs between them. Zero lost bytes, no frame
//! or table leaked, and the speculative path carries the faults of small
//! VMAs (all of them, the first write of each preparing its anon_vma).
//! Last, first writes of many small VMAs (each remapped now and then, so
//! it needs its anon_vma again) while their neighbours merge into them and
//! split off again and fork runs: every pattern reads back in the parent
//! and, exactly as it was at fork, in each child, whose reverse map must
//! list both spaces.

#[path = "common/rmap.rs"]
mod rmap;
#[path = "common/rng.rs"]
mod rng;

use aspace::{
    Access, AddressSpace, Advice, Config, FaultLocking, MapFlags, MremapFlags, Prot, Stats,
    PAGE_SIZE,
};
use rng::XorShift;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, RwLock};
use std::time::{Duration, Instant};

const RW: Prot = Prot::READ.union(Prot::WRITE);
/// Two PMD spans and a bit: at least one span lies wholly inside.
const PAGES: u64 = 1100;
const WORKERS: u64 = 2;
/// The last pages belong to nobody: the churner DONTNEEDs them.
const SCRATCH: u64 = 64;

#[test]
fn speculative_faults_lose_nothing() {
    let mm = Arc::new(AddressSpace::new(Config::with_locking(
        FaultLocking::Speculative,
    )));
    let base = mm
        .mmap(
            0,
            PAGES * PAGE_SIZE,
            RW,
            MapFlags::PRIVATE | MapFlags::ANONYMOUS,
        )
        .unwrap();
    // Give the VMA its anon_vma and a few PTE tables first, as a running
    // program would have.
    for p in (0..PAGES).step_by(512) {
        mm.write(base + p * PAGE_SIZE, &[1]).unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(WORKERS as usize + 2));
    let mut hs = Vec::new();
    for t in 0..WORKERS {
        let (mm, stop, start) = (mm.clone(), stop.clone(), start.clone());
        hs.push(std::thread::spawn(move || {
            let mut rng = XorShift::new(0x9e37_79b9 ^ (t + 1));
            // Each worker owns the pages p with p % WORKERS == t.
            let mine = (PAGES - SCRATCH) / WORKERS;
            let mut gen = vec![0u8; mine as usize];
            start.wait();
            while !stop.load(Ordering::Relaxed) {
                let i = rng.next_u64() % mine;
                let a = base + (i * WORKERS + t) * PAGE_SIZE + 8;
                let dice = rng.next_u64() % 12;
                if dice == 0 {
                    // Empty the page again, so that faults keep coming to
                    // the speculative path after the first touch (and after
                    // a fork made every entry copy-on-write).
                    mm.madvise(a - 8, PAGE_SIZE, Advice::DontNeed).unwrap();
                    gen[i as usize] = 0;
                } else if dice < 4 {
                    let mut x = [0u8; 1];
                    mm.read(a, &mut x).unwrap();
                    assert_eq!(x[0], gen[i as usize], "worker {t} page {i}");
                } else {
                    let g = gen[i as usize].wrapping_add(1).max(1);
                    mm.write(a, &[g]).unwrap();
                    gen[i as usize] = g;
                }
            }
        }));
    }
    {
        let (mm, stop, start) = (mm.clone(), stop.clone(), start.clone());
        hs.push(std::thread::spawn(move || {
            let mut rng = XorShift::new(4242);
            start.wait();
            while !stop.load(Ordering::Relaxed) {
                match rng.next_u64() % 4 {
                    0 | 1 => {
                        // Split and re-merge, writable throughout.
                        let p = 1 + rng.next_u64() % (PAGES - 4);
                        let a = base + p * PAGE_SIZE;
                        mm.mprotect(a, 2 * PAGE_SIZE, RW | Prot::EXEC).unwrap();
                        mm.mprotect(a, 2 * PAGE_SIZE, RW).unwrap();
                    }
                    2 => {
                        let p = PAGES - SCRATCH + rng.next_u64() % SCRATCH;
                        mm.write(base + p * PAGE_SIZE, &[7]).unwrap();
                        mm.madvise(base + p * PAGE_SIZE, PAGE_SIZE, Advice::DontNeed)
                            .unwrap();
                    }
                    _ => drop(mm.fork().unwrap()),
                }
            }
        }));
    }
    start.wait();
    std::thread::sleep(Duration::from_millis(1500));
    stop.store(true, Ordering::Relaxed);
    let t0 = Instant::now();
    for h in hs {
        h.join().unwrap();
    }
    assert!(t0.elapsed() < Duration::from_secs(30));
    let s = mm.stats();
    print_faults("one VMA", &s);
    assert!(
        s.fault_speculative > 1000,
        "the speculative path must carry faults: {s:?}"
    );
    mm.munmap(base, PAGES * PAGE_SIZE).unwrap();
    assert_eq!(mm.frames_used(), 0, "frames leaked");
}

/// Prints where faults went, and why speculative attempts fell back.
fn print_faults(what: &str, s: &Stats) {
    println!(
        "{what}: speculative {} (anon_vma prepared {}) per-VMA {} mmap_lock {}; aborts: locked {} lookup {} needs-more {} table {} stamp {} oom {}",
        s.fault_speculative,
        s.spec_anon_vma_prepared,
        s.fault_per_vma,
        s.fault_mmap_lock,
        s.spec_abort_locked,
        s.spec_abort_lookup,
        s.spec_abort_needs_more,
        s.spec_abort_table,
        s.spec_abort_stamp,
        s.spec_abort_oom
    );
}

const FIXED: MapFlags = MapFlags::PRIVATE
    .union(MapFlags::ANONYMOUS)
    .union(MapFlags::FIXED);
const PMD: u64 = 1 << 21;
/// Small VMA sizes in pages (16 to 256 KiB), cycled: several share each
/// 2 MiB span, and spans hold the ends of VMAs that cross them.
const SMALL: [u64; 6] = [4, 16, 64, 8, 32, 12];

/// Lays small VMAs out from `base` over `bytes`: `(start, pages)`, each
/// followed by a one-page hole so none merges with the next.
fn small_layout(base: u64, bytes: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut a = base;
    for i in 0.. {
        let n = SMALL[i % SMALL.len()];
        if a + (n + 1) * PAGE_SIZE > base + bytes {
            break;
        }
        out.push((a, n));
        a += (n + 1) * PAGE_SIZE;
    }
    out
}

/// A 2 MiB-aligned free area of `bytes`, reserved and left unmapped.
fn aligned_area(mm: &AddressSpace, bytes: u64) -> u64 {
    let flags = MapFlags::PRIVATE | MapFlags::ANONYMOUS;
    let r = mm.mmap(0, bytes + PMD, Prot::NONE, flags).unwrap();
    mm.munmap(r, bytes + PMD).unwrap();
    (r + PMD - 1) & !(PMD - 1)
}

/// Single-threaded faults in small VMAs all go speculative: reads (the
/// zero page needs nothing) and writes, the first of each VMA giving it
/// its anon_vma on the speculative path, in fresh spans (the speculative
/// path makes the PTE table) and in spans other VMAs share.
#[test]
fn small_vma_faults_are_speculative() {
    let mm = AddressSpace::new(Config::with_locking(FaultLocking::Speculative));
    for access in [Access::Read, Access::Write] {
        let base = aligned_area(&mm, 4 * PMD);
        let vmas = small_layout(base, 4 * PMD);
        for &(a, n) in &vmas {
            mm.mmap(a, n * PAGE_SIZE, RW, FIXED).unwrap();
        }
        let pages: u64 = vmas.iter().map(|v| v.1).sum();
        let s0 = mm.stats();
        for &(a, n) in &vmas {
            for p in 0..n {
                mm.fault(a + p * PAGE_SIZE, access).unwrap();
            }
        }
        let s1 = mm.stats();
        let prepared = if access == Access::Write {
            vmas.len() as u64
        } else {
            0
        };
        assert_eq!(s1.faults() - s0.faults(), pages, "{s1:?}");
        assert_eq!(
            s1.fault_speculative - s0.fault_speculative,
            pages,
            "{access:?}: {s1:?}"
        );
        let got = s1.spec_anon_vma_prepared - s0.spec_anon_vma_prepared;
        assert_eq!(got, prepared, "{access:?}: {s1:?}");
    }
}

/// A worker's pattern for page `p` of slot `i` at generation `gen`.
fn pattern(t: u64, i: usize, p: u64, gen: u64) -> u64 {
    (t << 56) | ((i as u64) << 36) | (p << 20) | gen
}

/// Many small VMAs, several per PTE table: two workers write and verify
/// patterns in their own (and now and then empty a page with DONTNEED, so
/// it faults again) while a third thread works on the small VMAs between
/// theirs, which share their tables: mprotect to read-only and back,
/// munmap and mmap again, mremap away and back, shrink and grow. Every
/// pattern reads back, the speculative path carries a good share of the
/// faults, and at the end no frame and no table but the root is left.
#[test]
fn small_vmas_under_neighbour_churn() {
    const BYTES: u64 = 4 * PMD;
    let mm = Arc::new(AddressSpace::new(Config::with_locking(
        FaultLocking::Speculative,
    )));
    let base = aligned_area(&mm, BYTES);
    let vmas = small_layout(base, BYTES);
    for &(a, n) in &vmas {
        mm.mmap(a, n * PAGE_SIZE, RW, FIXED).unwrap();
    }
    // Where the churner's mremap parks a VMA (free: the VMAs are mapped).
    let scratch = aligned_area(&mm, PMD);
    // Slot i belongs to worker i % 3, or to the churner when that is 2.
    let owned = |o: usize| -> Vec<(usize, u64, u64)> {
        vmas.iter()
            .enumerate()
            .filter(|(i, _)| i % 3 == o)
            .map(|(i, &(a, n))| (i, a, n))
            .collect()
    };
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(4));
    let mut hs = Vec::new();
    for t in 0..2u64 {
        let (mm, stop, start) = (mm.clone(), stop.clone(), start.clone());
        let mine = owned(t as usize);
        hs.push(std::thread::spawn(move || {
            let mut rng = XorShift::new(0x5151 + t);
            let mut gens: Vec<Vec<u64>> = mine.iter().map(|v| vec![0; v.2 as usize]).collect();
            start.wait();
            while !stop.load(Ordering::Relaxed) {
                let k = (rng.next_u64() % mine.len() as u64) as usize;
                let (i, a, n) = mine[k];
                let p = rng.next_u64() % n;
                let at = a + p * PAGE_SIZE + (p * 8) % PAGE_SIZE;
                let gen = &mut gens[k][p as usize];
                match rng.next_u64() % 12 {
                    0 => {
                        mm.madvise(a + p * PAGE_SIZE, PAGE_SIZE, Advice::DontNeed)
                            .unwrap();
                        *gen = 0;
                    }
                    1..=3 => {
                        let mut x = [0u8; 8];
                        mm.read(at, &mut x).unwrap();
                        let want = if *gen == 0 { 0 } else { pattern(t, i, p, *gen) };
                        assert_eq!(u64::from_le_bytes(x), want, "worker {t} slot {i} page {p}");
                    }
                    _ => {
                        *gen += 1;
                        mm.write(at, &pattern(t, i, p, *gen).to_le_bytes()).unwrap();
                    }
                }
            }
        }));
    }
    {
        let (mm, stop, start) = (mm.clone(), stop.clone(), start.clone());
        let mine = owned(2);
        hs.push(std::thread::spawn(move || {
            let mut rng = XorShift::new(0xc4c4);
            start.wait();
            while !stop.load(Ordering::Relaxed) {
                let (i, a, n) = mine[(rng.next_u64() % mine.len() as u64) as usize];
                let len = n * PAGE_SIZE;
                // The slot's pages hold its index from here on.
                let mark = [i as u8 | 1];
                for p in 0..n {
                    mm.write(a + p * PAGE_SIZE, &mark).unwrap();
                }
                match rng.next_u64() % 4 {
                    0 => {
                        mm.mprotect(a, len, Prot::READ).unwrap();
                        mm.mprotect(a, len, RW).unwrap();
                    }
                    1 => {
                        mm.munmap(a, len).unwrap();
                        mm.mmap(a, len, RW, FIXED).unwrap();
                        continue; // its pages are gone
                    }
                    2 => {
                        let fixed = MremapFlags::MAYMOVE | MremapFlags::FIXED;
                        assert_eq!(mm.mremap(a, len, len, fixed, scratch), Ok(scratch));
                        assert_eq!(mm.mremap(scratch, len, len, fixed, a), Ok(a));
                    }
                    _ => {
                        let half = (n / 2) * PAGE_SIZE;
                        let none = MremapFlags::empty();
                        assert_eq!(mm.mremap(a, len, half, none, 0), Ok(a));
                        assert_eq!(mm.mremap(a, half, len, none, 0), Ok(a));
                        continue; // the upper half's pages are gone
                    }
                }
                for p in 0..n {
                    let mut x = [0u8];
                    mm.read(a + p * PAGE_SIZE, &mut x).unwrap();
                    assert_eq!(x, mark, "churned slot {i} page {p}");
                }
            }
        }));
    }
    start.wait();
    std::thread::sleep(Duration::from_millis(1500));
    stop.store(true, Ordering::Relaxed);
    for h in hs {
        h.join().unwrap();
    }
    let s = mm.stats();
    print_faults("small VMAs", &s);
    assert!(
        s.fault_speculative > 1000 && 4 * s.fault_speculative > s.faults(),
        "the speculative path must carry small VMAs' faults: {s:?}"
    );
    mm.munmap(base, BYTES).unwrap();
    assert_eq!(mm.frames_used(), 0, "frames leaked");
    assert_eq!(mm.page_table_bytes(), PAGE_SIZE, "a table outlived munmap");
}

/// Pages of each worker-owned VMA in [`first_writes_under_merge_split_fork`].
const FW_PAGES: u64 = 4;
/// Worker-owned VMAs per worker there.
const FW_SLOTS: u64 = 24;

/// The first write of a small VMA prepares its anon_vma on the speculative
/// path; this races it with everything that reads or moves anon_vmas.
/// Slot `i` is a hole, a neighbour `N` of 2 pages, then `W` of 4 pages
/// right above it, owned by worker `i % 2`. Workers remap
/// their `W` now and then (fresh: no anon_vma, the next write is a first
/// write again), write a pattern into each page and read them back. The
/// churner makes `N` writable (`W` absorbs it, its start moving down,
/// unless their anon_vmas differ) and read-only again (a split), writes
/// `N` now and then (so it has an anon_vma of its own), and remaps it. A
/// forker forks while no worker or churner is inside a call (a gate): each
/// child must read exactly the recorded pattern of every page, every page
/// of every parent VMA with an anon_vma must be in its family's reverse
/// map, and each written page's walk must list it in both spaces (the
/// child's anon_vma chained to the parent's).
#[test]
fn first_writes_under_merge_split_fork() {
    let slot = (FW_PAGES + 3) * PAGE_SIZE;
    // N, then W: a merge moves W's start (its rmap key).
    let slots = 2 * FW_SLOTS;
    let mm = Arc::new(AddressSpace::new(Config::with_locking(
        FaultLocking::Speculative,
    )));
    let base = aligned_area(&mm, slots * slot);
    let n = move |i: u64| base + i * slot + PAGE_SIZE;
    let w = move |i: u64| n(i) + 2 * PAGE_SIZE;
    for i in 0..slots {
        mm.mmap(w(i), FW_PAGES * PAGE_SIZE, RW, FIXED).unwrap();
        mm.mmap(n(i), 2 * PAGE_SIZE, Prot::READ, FIXED).unwrap();
    }
    // What each worker page holds (0: nothing written since its remap),
    // changed only under the gate's read side, together with the page.
    let expect: Arc<Vec<AtomicU64>> =
        Arc::new((0..slots * FW_PAGES).map(|_| AtomicU64::new(0)).collect());
    let gate = Arc::new(RwLock::new(()));
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(5));
    let mut hs = Vec::new();
    for t in 0..2u64 {
        let (mm, stop, start) = (mm.clone(), stop.clone(), start.clone());
        let (expect, gate) = (expect.clone(), gate.clone());
        hs.push(std::thread::spawn(move || {
            let mut rng = XorShift::new(0xf1f1 + t);
            let mut gen = 0u64;
            start.wait();
            while !stop.load(Ordering::Relaxed) {
                let i = 2 * (rng.next_u64() % FW_SLOTS) + t;
                if rng.next_u64() % 2 == 0 {
                    let _g = gate.read().unwrap();
                    mm.munmap(w(i), FW_PAGES * PAGE_SIZE).unwrap();
                    mm.mmap(w(i), FW_PAGES * PAGE_SIZE, RW, FIXED).unwrap();
                    for p in 0..FW_PAGES {
                        expect[(i * FW_PAGES + p) as usize].store(0, Ordering::Relaxed);
                    }
                }
                gen += 1;
                for p in 0..FW_PAGES {
                    let x = pattern(t, i as usize, p, gen);
                    let _g = gate.read().unwrap();
                    mm.write(w(i) + p * PAGE_SIZE + 8 * p, &x.to_le_bytes())
                        .unwrap();
                    expect[(i * FW_PAGES + p) as usize].store(x, Ordering::Relaxed);
                }
                for p in 0..FW_PAGES {
                    let mut x = [0u8; 8];
                    mm.read(w(i) + p * PAGE_SIZE + 8 * p, &mut x).unwrap();
                    let want = pattern(t, i as usize, p, gen);
                    assert_eq!(u64::from_le_bytes(x), want, "worker {t} slot {i} page {p}");
                }
            }
        }));
    }
    {
        let (mm, stop, start) = (mm.clone(), stop.clone(), start.clone());
        let gate = gate.clone();
        hs.push(std::thread::spawn(move || {
            let mut rng = XorShift::new(0x3e3e);
            start.wait();
            while !stop.load(Ordering::Relaxed) {
                let i = rng.next_u64() % slots;
                let len = 2 * PAGE_SIZE;
                let _g = gate.read().unwrap();
                match rng.next_u64() % 4 {
                    0 => {
                        mm.munmap(n(i), len).unwrap();
                        mm.mmap(n(i), len, Prot::READ, FIXED).unwrap();
                    }
                    1 => {
                        mm.mprotect(n(i), len, RW).unwrap();
                        mm.write(n(i), &[0xee]).unwrap();
                        mm.mprotect(n(i), len, Prot::READ).unwrap();
                    }
                    _ => {
                        mm.mprotect(n(i), len, RW).unwrap();
                        std::thread::yield_now();
                        mm.mprotect(n(i), len, Prot::READ).unwrap();
                    }
                }
            }
        }));
    }
    let forks = Arc::new(AtomicU64::new(0));
    {
        let (mm, stop, start) = (mm.clone(), stop.clone(), start.clone());
        let forks = forks.clone();
        hs.push(std::thread::spawn(move || {
            start.wait();
            while !stop.load(Ordering::Relaxed) {
                let (child, want) = {
                    let _g = gate.write().unwrap();
                    let child = mm.fork().unwrap();
                    let want: Vec<u64> = expect.iter().map(|e| e.load(Ordering::Relaxed)).collect();
                    rmap::check_rmap(&mm);
                    for (k, &x) in want.iter().enumerate().filter(|(_, &x)| x != 0) {
                        let (i, p) = (k as u64 / FW_PAGES, k as u64 % FW_PAGES);
                        let a = w(i) + p * PAGE_SIZE;
                        let hits = mm.rmap_walk(a);
                        for id in [mm.id(), child.id()] {
                            assert!(
                                hits.iter().any(|h| h.mm_id == id && h.addr == a),
                                "page {a:#x} ({x:#x}) of space {id} not in the rmap: {hits:?}"
                            );
                        }
                    }
                    (child, want)
                };
                for (k, &x) in want.iter().enumerate() {
                    let (i, p) = (k as u64 / FW_PAGES, k as u64 % FW_PAGES);
                    let mut got = [0u8; 8];
                    child.read(w(i) + p * PAGE_SIZE + 8 * p, &mut got).unwrap();
                    assert_eq!(u64::from_le_bytes(got), x, "child: slot {i} page {p}");
                }
                forks.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    start.wait();
    std::thread::sleep(Duration::from_millis(1500));
    stop.store(true, Ordering::Relaxed);
    for h in hs {
        h.join().unwrap();
    }
    let s = mm.stats();
    print_faults("first writes", &s);
    assert!(forks.load(Ordering::Relaxed) > 0, "no fork ran");
    assert!(
        s.spec_anon_vma_prepared > 100,
        "first writes must prepare their anon_vma speculatively: {s:?}"
    );
    mm.munmap(base, slots * slot).unwrap();
    assert_eq!(mm.frames_used(), 0, "frames leaked");
}
