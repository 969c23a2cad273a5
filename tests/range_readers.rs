//! Range-locked readers (`WriterLocking::Range`, `mm/range_read.rs`)
//! through the public API: MADV_DONTNEED and faults on each thread's own
//! VMA while other threads mmap, mprotect and munmap beside it, in the
//! same page tables and merging into it. Each check fails if a zap or a
//! locked fault could act on a VMA a writer is splitting or merging (a
//! page zapped that should keep its data, one kept that should read zero,
//! a fault into a VMA that is going away), or if an error differed from
//! Linux's (ENOMEM for a hole, EINVAL on a locked VMA).

use aspace::{
    Access, AddressSpace, Advice, Config, Error, FaultLocking, MapFlags, Prot, WriterLocking,
    PAGE_SIZE,
};
use std::sync::{Arc, Barrier};

const RW: Prot = Prot::READ.union(Prot::WRITE);
const MODES: [FaultLocking; 3] = [
    FaultLocking::Speculative,
    FaultLocking::PerVma,
    FaultLocking::MmapLock,
];
/// Every thread's zone lies in one PTE table (512 pages).
const BASE: u64 = 0x4000_0000;
const ZONE: u64 = 32 * PAGE_SIZE;
/// Each thread's own VMA: pages `[0, OWN)` of its zone.
const OWN: u64 = 8;
/// The pages a thread maps at the top of its zone, touching the next
/// thread's own VMA (they merge into it while read-write).
const EDGE: u64 = 3;

fn fixed() -> MapFlags {
    MapFlags::PRIVATE | MapFlags::ANONYMOUS | MapFlags::FIXED
}

fn space(fault_locking: FaultLocking) -> Arc<AddressSpace> {
    Arc::new(AddressSpace::new(Config {
        fault_locking,
        writer_locking: WriterLocking::Range,
        ..Config::default()
    }))
}

fn pat(t: u64, i: u64, page: u64) -> u8 {
    (t.wrapping_mul(31) ^ i.wrapping_mul(7) ^ page.wrapping_mul(13)) as u8 | 1
}

fn zone(t: u64) -> u64 {
    BASE + t * ZONE
}

fn read_page(mm: &AddressSpace, a: u64) -> [u8; 64] {
    let mut b = [0u8; 64];
    mm.read(a, &mut b).unwrap();
    b
}

/// Each thread, over and over: writes a pattern into its own VMA, zaps
/// half of it with MADV_DONTNEED (the zapped half reads zero, the rest
/// keeps its pattern), zaps it with a range running into the hole after
/// it (ENOMEM, the VMA still zapped), faults pages back with `fault`;
/// meanwhile it maps read-write pages touching the next thread's VMA
/// (they merge into it), writes them, mprotects them read-only (a split
/// of that VMA), reads them back and unmaps them. Every thread's zaps and
/// faults meet the previous thread's writers at its VMA's edge.
#[test]
fn zaps_and_faults_beside_writers_lose_nothing() {
    for mode in MODES {
        let threads = 3u64;
        let mm = space(mode);
        for t in 0..threads {
            mm.mmap(zone(t), OWN * PAGE_SIZE, RW, fixed()).unwrap();
        }
        let start = Arc::new(Barrier::new(threads as usize));
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let (mm, start) = (mm.clone(), start.clone());
                std::thread::spawn(move || {
                    let own = zone(t);
                    // The edge pages below the next thread's VMA (the last
                    // thread's have no VMA above: they stay a VMA alone).
                    let edge = zone(t + 1) - EDGE * PAGE_SIZE;
                    start.wait();
                    for i in 0..150u64 {
                        for p in 0..OWN {
                            mm.write(own + p * PAGE_SIZE, &[pat(t, i, p); 64]).unwrap();
                        }
                        mm.mmap(edge, EDGE * PAGE_SIZE, RW, fixed()).unwrap();
                        let half = OWN / 2 * PAGE_SIZE;
                        mm.madvise(own, half, Advice::DontNeed).unwrap();
                        for p in 0..EDGE {
                            mm.write(edge + p * PAGE_SIZE, &[pat(t, i, 100 + p); 64])
                                .unwrap();
                        }
                        for p in 0..OWN {
                            let want = if p < OWN / 2 { 0 } else { pat(t, i, p) };
                            let got = read_page(&mm, own + p * PAGE_SIZE);
                            assert_eq!(got, [want; 64], "{mode:?} thread {t} round {i} page {p}");
                        }
                        mm.mprotect(edge, EDGE * PAGE_SIZE, Prot::READ).unwrap();
                        // Linux: a range running into a hole zaps the
                        // mapped part, then fails with ENOMEM.
                        assert_eq!(
                            mm.madvise(own, (OWN + 1) * PAGE_SIZE, Advice::DontNeed),
                            Err(Error::NoMem)
                        );
                        for p in 0..OWN {
                            assert_eq!(read_page(&mm, own + p * PAGE_SIZE), [0; 64]);
                            mm.fault(own + p * PAGE_SIZE, Access::Write).unwrap();
                        }
                        for p in 0..EDGE {
                            let got = read_page(&mm, edge + p * PAGE_SIZE);
                            assert_eq!(got, [pat(t, i, 100 + p); 64], "{mode:?} edge {t} {i} {p}");
                        }
                        assert!(mm.write(edge, &[1]).is_err(), "the edge is read-only");
                        mm.munmap(edge, EDGE * PAGE_SIZE).unwrap();
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        // Only the own VMAs are left, whole, and each page faulted in once.
        let v = mm.vmas();
        assert_eq!(v.len(), threads as usize, "{mode:?}: {v:?}");
        for (t, v) in v.iter().enumerate() {
            assert_eq!(
                (v.start, v.end),
                (zone(t as u64), zone(t as u64) + OWN * PAGE_SIZE)
            );
        }
        assert_eq!(mm.frames_used(), threads * OWN, "{mode:?}");
    }
}

/// DONTNEED over a range that several threads' writers keep changing: one
/// thread zaps the whole arena again and again while others map, write,
/// mprotect and unmap pages in it. A zap may come before or after each
/// writer (as in Linux), so a page reads either its pattern or zero, never
/// anything else, and the zapper gets ENOMEM exactly when its range has a
/// hole (always here: the arena is never fully mapped).
#[test]
fn a_zap_across_changing_vmas_sees_each_whole() {
    for mode in MODES {
        let mm = space(mode);
        let writers = 2u64;
        let span = writers * ZONE;
        let hs: Vec<_> = (0..writers)
            .map(|t| {
                let mm = mm.clone();
                std::thread::spawn(move || {
                    let a = zone(t) + PAGE_SIZE;
                    for i in 0..200u64 {
                        mm.mmap(a, 4 * PAGE_SIZE, RW, fixed()).unwrap();
                        for p in 0..4 {
                            mm.write(a + p * PAGE_SIZE, &[pat(t, i, p); 32]).unwrap();
                        }
                        mm.mprotect(a + PAGE_SIZE, PAGE_SIZE, Prot::READ).unwrap();
                        for p in 0..4 {
                            let mut b = [0u8; 32];
                            mm.read(a + p * PAGE_SIZE, &mut b).unwrap();
                            assert!(b == [pat(t, i, p); 32] || b == [0; 32], "{mode:?} {b:?}");
                        }
                        mm.munmap(a, 4 * PAGE_SIZE).unwrap();
                    }
                })
            })
            .collect();
        for _ in 0..300 {
            assert_eq!(mm.madvise(BASE, span, Advice::DontNeed), Err(Error::NoMem));
        }
        for h in hs {
            h.join().unwrap();
        }
        assert!(mm.vmas().is_empty());
        assert_eq!(mm.frames_used(), 0);
    }
}

/// A zap stops with EINVAL at a locked VMA, as Linux's does, after the
/// VMAs before it, while a writer maps and unmaps beside them.
#[test]
fn a_zap_stops_at_a_locked_vma_beside_a_writer() {
    let mm = space(FaultLocking::PerVma);
    mm.mmap(BASE, 2 * PAGE_SIZE, RW, fixed()).unwrap();
    mm.mmap(
        BASE + 2 * PAGE_SIZE,
        PAGE_SIZE,
        RW,
        fixed() | MapFlags::LOCKED,
    )
    .unwrap();
    let w = {
        let mm = mm.clone();
        std::thread::spawn(move || {
            for _ in 0..300 {
                mm.mmap(BASE + 4 * PAGE_SIZE, PAGE_SIZE, Prot::READ, fixed())
                    .unwrap();
                mm.munmap(BASE + 4 * PAGE_SIZE, PAGE_SIZE).unwrap();
            }
        })
    };
    for _ in 0..300 {
        mm.write(BASE, &[7]).unwrap();
        assert_eq!(
            mm.madvise(BASE, 3 * PAGE_SIZE, Advice::DontNeed),
            Err(Error::Inval)
        );
        assert_eq!(read_page(&mm, BASE)[0], 0, "the VMA before was zapped");
    }
    w.join().unwrap();
}

/// Forced writes (a debugger's `PTRACE_POKEDATA`) into each thread's own
/// read-only private VMA, which breaks copy-on-write without making it
/// writable, while the other threads map, mprotect and unmap pages
/// touching it: every forced byte reads back, ordinary writes stay
/// refused, and the VMA keeps its bounds.
#[test]
fn forced_writes_beside_writers_land() {
    let threads = 2u64;
    let mm = space(FaultLocking::PerVma);
    for t in 0..threads {
        mm.mmap(zone(t), OWN * PAGE_SIZE, Prot::READ, fixed())
            .unwrap();
    }
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let mm = mm.clone();
            std::thread::spawn(move || {
                let own = zone(t);
                let edge = zone(t + 1) - EDGE * PAGE_SIZE;
                for i in 0..150u64 {
                    // Read-only like the next thread's VMA: they merge.
                    mm.mmap(edge, EDGE * PAGE_SIZE, Prot::READ, fixed())
                        .unwrap();
                    for p in 0..OWN {
                        mm.write_forced(own + p * PAGE_SIZE, &[pat(t, i, p); 16])
                            .unwrap();
                    }
                    mm.mprotect(edge, EDGE * PAGE_SIZE, RW).unwrap();
                    for p in 0..OWN {
                        let got = read_page(&mm, own + p * PAGE_SIZE);
                        assert_eq!(got[..16], [pat(t, i, p); 16], "thread {t} round {i}");
                    }
                    assert!(mm.write(own, &[1]).is_err(), "still read-only");
                    mm.munmap(edge, EDGE * PAGE_SIZE).unwrap();
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let v = mm.vmas();
    assert_eq!(v.len(), threads as usize, "{v:?}");
    assert_eq!(mm.frames_used(), threads * OWN);
}
