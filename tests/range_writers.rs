//! Range-locked writers (`WriterLocking::Range`) through the public API:
//! writers on disjoint ranges from several threads, placements racing for
//! gaps, merges where neighbourhoods touch, and writers against faults.
//! Each check would fail if two writers could change one VMA at once, if
//! two placements could pick one gap, or if a fault could act on a VMA a
//! writer is changing.

use aspace::{
    AddressSpace, Advice, Config, Error, FaultLocking, MapFlags, MremapFlags, Prot, VmFlags,
    WriterLocking, PAGE_SIZE,
};
use std::sync::{Arc, Barrier, Mutex};

const RW: Prot = Prot::READ.union(Prot::WRITE);
const MODES: [FaultLocking; 3] = [
    FaultLocking::Speculative,
    FaultLocking::PerVma,
    FaultLocking::MmapLock,
];

fn anon() -> MapFlags {
    MapFlags::PRIVATE | MapFlags::ANONYMOUS
}

fn space(fault_locking: FaultLocking) -> Arc<AddressSpace> {
    Arc::new(AddressSpace::new(Config {
        fault_locking,
        writer_locking: WriterLocking::Range,
        ..Config::default()
    }))
}

fn pat(t: u64, i: u64, page: u64) -> u8 {
    (t.wrapping_mul(31) ^ i.wrapping_mul(7) ^ page.wrapping_mul(13)) as u8
}

/// Each thread: mmap without a hint, write a pattern, mprotect its middle
/// read-only (a split), read everything back, check the middle refuses a
/// write, munmap. Live ranges never overlap; nothing is left at the end.
#[test]
fn disjoint_writers_keep_their_patterns() {
    for mode in MODES {
        let mm = space(mode);
        let live: Arc<Mutex<Vec<(u64, u64)>>> = Arc::default();
        let threads = 4u64;
        let pages = 16u64;
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let (mm, live) = (mm.clone(), live.clone());
                std::thread::spawn(move || {
                    for i in 0..200u64 {
                        let len = pages * PAGE_SIZE;
                        let a = mm.mmap(0, len, RW, anon()).unwrap();
                        {
                            let mut l = live.lock().unwrap();
                            assert!(
                                l.iter().all(|&(s, e)| a + len <= s || e <= a),
                                "placement overlapped a live mapping"
                            );
                            l.push((a, a + len));
                        }
                        for p in 0..pages {
                            mm.write(a + p * PAGE_SIZE, &[pat(t, i, p); 64]).unwrap();
                        }
                        let mid = a + 4 * PAGE_SIZE;
                        mm.mprotect(mid, 4 * PAGE_SIZE, Prot::READ).unwrap();
                        for p in 0..pages {
                            let mut b = [0u8; 64];
                            mm.read(a + p * PAGE_SIZE, &mut b).unwrap();
                            assert_eq!(b, [pat(t, i, p); 64], "thread {t} page {p}");
                        }
                        assert!(mm.write(mid, &[1]).is_err(), "the middle is read-only");
                        live.lock().unwrap().retain(|&(s, _)| s != a);
                        mm.munmap(a, len).unwrap();
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(mm.map_count(), 0, "{mode:?}");
        assert!(mm.vmas().is_empty());
        assert_eq!(mm.frames_used(), 0);
    }
}

/// Placements race for gaps and keep what they got: every mapping is
/// distinct, and the space holds exactly their pages.
#[test]
fn concurrent_placements_never_overlap() {
    let mm = space(FaultLocking::Speculative);
    let threads = 4;
    let per = 300;
    let start = Arc::new(Barrier::new(threads));
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let (mm, start) = (mm.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                // Different protections: neighbours never merge, so every
                // mapping stays one VMA.
                let prot = if t % 2 == 0 { RW } else { Prot::READ };
                (0..per)
                    .map(|_| (mm.mmap(0, 3 * PAGE_SIZE, prot, anon()).unwrap(), prot))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut all: Vec<(u64, Prot)> = hs.into_iter().flat_map(|h| h.join().unwrap()).collect();
    all.sort_by_key(|&(a, _)| a);
    for w in all.windows(2) {
        assert!(w[0].0 + 3 * PAGE_SIZE <= w[1].0, "two placements overlap");
    }
    let mapped: u64 = mm.vmas().iter().map(|v| v.end - v.start).sum();
    assert_eq!(mapped, all.len() as u64 * 3 * PAGE_SIZE);
    for &(a, prot) in &all {
        let v = mm
            .vmas()
            .into_iter()
            .find(|v| v.start <= a && a < v.end)
            .unwrap();
        assert_eq!(v.prot, prot);
    }
}

/// Two writers whose neighbourhoods touch: each maps its half of a region
/// with `MAP_FIXED` at once; whichever goes second merges, so the region
/// is one VMA every round, as one writer after the other leaves it.
#[test]
fn fixed_mappings_that_touch_merge() {
    let mm = space(FaultLocking::Speculative);
    let half = 8 * PAGE_SIZE;
    let base = mm.mmap(0, 2 * half, RW, anon()).unwrap();
    mm.munmap(base, 2 * half).unwrap();
    let rounds = 300;
    let bar = Arc::new(Barrier::new(2));
    let hs: Vec<_> = (0..2u64)
        .map(|t| {
            let (mm, bar) = (mm.clone(), bar.clone());
            std::thread::spawn(move || {
                let a = base + t * half;
                for _ in 0..rounds {
                    bar.wait();
                    let got = mm.mmap(a, half, RW, anon() | MapFlags::FIXED).unwrap();
                    assert_eq!(got, a);
                    mm.write(a, &[t as u8 + 1]).unwrap();
                    bar.wait();
                    if t == 0 {
                        let vs = mm.vmas();
                        assert_eq!(vs.len(), 1, "the halves merged: {vs:?}");
                        assert_eq!((vs[0].start, vs[0].end), (base, base + 2 * half));
                        let mut b = [0u8; 1];
                        mm.read(base + half, &mut b).unwrap();
                        assert_eq!(b, [2]);
                        mm.munmap(base, 2 * half).unwrap();
                    }
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    assert_eq!(mm.map_count(), 0);
}

/// Two writers split and re-merge adjacent halves of one VMA at once
/// (mprotect to read-only and back): the VMA is whole again at the end.
#[test]
fn mprotects_on_touching_halves_remerge() {
    let mm = space(FaultLocking::Speculative);
    let half = 8 * PAGE_SIZE;
    let base = mm.mmap(0, 2 * half, RW, anon()).unwrap();
    let hs: Vec<_> = (0..2u64)
        .map(|t| {
            let mm = mm.clone();
            std::thread::spawn(move || {
                let a = base + t * half;
                for i in 0..500u64 {
                    let p = a + (i % 8) * PAGE_SIZE;
                    mm.mprotect(p, PAGE_SIZE, Prot::READ).unwrap();
                    mm.mprotect(p, PAGE_SIZE, RW).unwrap();
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let vs = mm.vmas();
    assert_eq!(vs.len(), 1, "{vs:?}");
    assert_eq!(
        (vs[0].start, vs[0].end, vs[0].prot),
        (base, base + 2 * half, RW)
    );
}

/// madvise that sets VMA flags and `set_anon_name` are range writers too
/// (`name::modify_each`): four threads, each with eight pages of one
/// shared VMA, name the middle of theirs, mark part of it `MADV_DONTFORK`,
/// mprotect a page next to the neighbour's zone (so neighbourhoods meet),
/// check their pages keep their pattern and their VMAs carry what they
/// set, and undo it all. The VMA is whole again at the end, unnamed and
/// forkable, with every thread's last pattern.
#[test]
fn advice_and_names_on_touching_zones_remerge() {
    for mode in MODES {
        let mm = space(mode);
        let zone = 8 * PAGE_SIZE;
        let threads = 4u64;
        let base = mm.mmap(0, threads * zone, RW, anon()).unwrap();
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let mm = mm.clone();
                std::thread::spawn(move || {
                    let z = base + t * zone;
                    let name = format!("t{t}");
                    for i in 0..150u64 {
                        for p in 0..8 {
                            mm.write(z + p * PAGE_SIZE, &[pat(t, i, p); 32]).unwrap();
                        }
                        mm.set_anon_name(z + 2 * PAGE_SIZE, 4 * PAGE_SIZE, Some(&name))
                            .unwrap();
                        mm.madvise(z + 3 * PAGE_SIZE, 2 * PAGE_SIZE, Advice::DontFork)
                            .unwrap();
                        // The zone's last page touches the next thread's.
                        mm.mprotect(z + 7 * PAGE_SIZE, PAGE_SIZE, Prot::READ)
                            .unwrap();
                        let vs = mm.vmas();
                        let at = |a: u64| vs.iter().find(|v| v.start <= a && a < v.end).unwrap();
                        for p in 0..8 {
                            let v = at(z + p * PAGE_SIZE);
                            let named = (2..6).contains(&p);
                            assert_eq!(v.name.as_deref(), named.then_some(&*name), "page {p}");
                            let dc = (3..5).contains(&p);
                            assert_eq!(v.flags.contains(VmFlags::DONTCOPY), dc, "page {p}");
                            assert_eq!(v.prot, if p == 7 { Prot::READ } else { RW });
                            let mut b = [0u8; 32];
                            mm.read(z + p * PAGE_SIZE, &mut b).unwrap();
                            assert_eq!(b, [pat(t, i, p); 32], "thread {t} round {i} page {p}");
                        }
                        mm.mprotect(z + 7 * PAGE_SIZE, PAGE_SIZE, RW).unwrap();
                        mm.madvise(z, zone, Advice::DoFork).unwrap();
                        mm.set_anon_name(z, zone, None).unwrap();
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        let vs = mm.vmas();
        assert_eq!(vs.len(), 1, "{vs:?}");
        assert_eq!((vs[0].start, vs[0].end), (base, base + threads * zone));
        assert_eq!(
            (
                vs[0].name.as_deref(),
                vs[0].flags.contains(VmFlags::DONTCOPY)
            ),
            (None, false)
        );
        for t in 0..threads {
            for p in 0..8 {
                let mut b = [0u8; 32];
                mm.read(base + t * zone + p * PAGE_SIZE, &mut b).unwrap();
                assert_eq!(b, [pat(t, 149, p); 32]);
            }
        }
    }
}

/// mremap in place is a range writer (a shrink as munmap, a grow as
/// mprotect): four threads, each with a VMA at the start of its own zone
/// of eight pages and a `PROT_NONE` guard page (which the next zone's
/// writers also lock, as their neighbour; one more guard below the
/// first zone), grow it in place (to six
/// pages, or to eight, touching the guard), fail to grow it to ten
/// without `MAYMOVE`, move it away and back (the whole-space path), and
/// shrink it, checking their pattern and that the shrunk tail is gone.
/// Every zone ends as its two pages, holding its thread's last pattern.
#[test]
fn mremap_in_place_on_touching_zones() {
    for mode in MODES {
        let mm = space(mode);
        let zone = 9 * PAGE_SIZE;
        let threads = 4u64;
        // A guard page below the first zone too: a zone's hole while its
        // VMA is away is bounded on both sides, so no other thread's move
        // is placed into it (and clobbered by the FIXED move back).
        let base = PAGE_SIZE
            + mm.mmap(0, threads * zone + PAGE_SIZE, Prot::NONE, anon())
                .unwrap();
        for t in 0..threads {
            let z = base + t * zone;
            mm.munmap(z, 8 * PAGE_SIZE).unwrap();
            mm.mmap(z, 2 * PAGE_SIZE, RW, anon() | MapFlags::FIXED)
                .unwrap();
        }
        let none = MremapFlags::empty();
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let mm = mm.clone();
                std::thread::spawn(move || {
                    let z = base + t * zone;
                    let check = |a: u64, i: u64, pages: u64| {
                        for p in 0..pages {
                            let mut b = [0u8; 32];
                            mm.read(a + p * PAGE_SIZE, &mut b).unwrap();
                            assert_eq!(b, [pat(t, i, p); 32], "thread {t} round {i} page {p}");
                        }
                    };
                    for i in 0..100u64 {
                        for p in 0..2 {
                            mm.write(z + p * PAGE_SIZE, &[pat(t, i, p); 32]).unwrap();
                        }
                        let grown = if i % 2 == 0 { 6 } else { 8 };
                        assert_eq!(
                            mm.mremap(z, 2 * PAGE_SIZE, grown * PAGE_SIZE, none, 0),
                            Ok(z)
                        );
                        for p in 2..grown {
                            mm.write(z + p * PAGE_SIZE, &[pat(t, i, p); 32]).unwrap();
                        }
                        check(z, i, grown);
                        // The guard leaves no room for ten pages: without
                        // MAYMOVE ENOMEM,
                        // with it a move away, then back with FIXED.
                        let ten = 10 * PAGE_SIZE;
                        assert_eq!(
                            mm.mremap(z, grown * PAGE_SIZE, ten, none, 0),
                            Err(Error::NoMem)
                        );
                        let away = mm
                            .mremap(z, grown * PAGE_SIZE, ten, MremapFlags::MAYMOVE, 0)
                            .unwrap();
                        assert_ne!(away, z);
                        check(away, i, grown);
                        let fixed = MremapFlags::MAYMOVE | MremapFlags::FIXED;
                        assert_eq!(mm.mremap(away, ten, grown * PAGE_SIZE, fixed, z), Ok(z));
                        assert_eq!(
                            mm.mremap(z, grown * PAGE_SIZE, 2 * PAGE_SIZE, none, 0),
                            Ok(z)
                        );
                        check(z, i, 2);
                        let mut b = [0u8; 1];
                        assert!(mm.read(z + 2 * PAGE_SIZE, &mut b).is_err(), "tail kept");
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        for t in 0..threads {
            let z = base + t * zone;
            let vs: Vec<_> = mm
                .vmas()
                .into_iter()
                .filter(|v| v.start < z + zone && z < v.end)
                .map(|v| (v.start, v.end, v.prot))
                .collect();
            let guard = z + 8 * PAGE_SIZE;
            assert_eq!(
                vs,
                vec![
                    (z, z + 2 * PAGE_SIZE, RW),
                    (guard, guard + PAGE_SIZE, Prot::NONE)
                ],
                "zone {t}"
            );
            for p in 0..2 {
                let mut b = [0u8; 32];
                mm.read(z + p * PAGE_SIZE, &mut b).unwrap();
                assert_eq!(b, [pat(t, 99, p); 32]);
            }
        }
    }
}

/// Faulting threads write and check patterns in their own VMA while
/// writers split and re-merge those VMAs (mprotect adding and removing
/// `PROT_EXEC`) and churn mappings beside them: no byte is lost, in every
/// fault mode.
#[test]
fn writers_against_faults() {
    for mode in MODES {
        let mm = space(mode);
        let pages = 32u64;
        let faulters = 2u64;
        let regions: Vec<u64> = (0..faulters)
            .map(|_| mm.mmap(0, pages * PAGE_SIZE, RW, anon()).unwrap())
            .collect();
        let vmas_before = mm.vmas();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut hs = Vec::new();
        for (t, &base) in regions.iter().enumerate() {
            let (mm, stop) = (mm.clone(), stop.clone());
            hs.push(std::thread::spawn(move || {
                let t = t as u64;
                let mut i = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) || i < 50 {
                    let p = i % pages;
                    mm.write(base + p * PAGE_SIZE + 8, &[pat(t, i, p); 32])
                        .unwrap();
                    let mut b = [0u8; 32];
                    mm.read(base + p * PAGE_SIZE + 8, &mut b).unwrap();
                    assert_eq!(b, [pat(t, i, p); 32], "{mode:?} thread {t} page {p}");
                    i += 1;
                }
            }));
        }
        let writers: Vec<_> = regions
            .iter()
            .map(|&base| {
                let mm = mm.clone();
                std::thread::spawn(move || {
                    for i in 0..300u64 {
                        let p = base + (i % 30) * PAGE_SIZE;
                        mm.mprotect(p, 2 * PAGE_SIZE, RW | Prot::EXEC).unwrap();
                        mm.mprotect(p, 2 * PAGE_SIZE, RW).unwrap();
                        let a = mm.mmap(0, 4 * PAGE_SIZE, RW, anon()).unwrap();
                        mm.write(a, &[7]).unwrap();
                        mm.munmap(a, 4 * PAGE_SIZE).unwrap();
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for h in hs {
            h.join().unwrap();
        }
        let spans = |v: Vec<aspace::VmaInfo>| {
            v.iter()
                .map(|v| (v.start, v.end, v.prot))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            spans(mm.vmas()),
            spans(vmas_before),
            "{mode:?}: merged back"
        );
    }
}

/// A brk thread grows and shrinks the heap, writing each new page, while
/// three threads map, write, mprotect and unmap elsewhere (range writers
/// beside the brk's hold). The heap stays one VMA `[start, break)`, and
/// every page holds one of the patterns written to it.
#[test]
fn brk_beside_disjoint_writers() {
    for mode in MODES {
        let mm = space(mode);
        let start = mm.brk(0).unwrap();
        let go = Arc::new(Barrier::new(4));
        let heap = {
            let (mm, go) = (mm.clone(), go.clone());
            std::thread::spawn(move || {
                go.wait();
                let mut pages = 0u64;
                for i in 0..300u64 {
                    // Grow by 1-4 pages; every third round shrink by up to
                    // half (a brk that is not page aligned rounds up).
                    let grow = 1 + i % 4;
                    let to = start + (pages + grow) * PAGE_SIZE - (i % 3);
                    assert_eq!(mm.brk(to).unwrap(), to, "round {i}");
                    for p in pages..pages + grow {
                        mm.write(start + p * PAGE_SIZE, &[pat(9, i, p); 64])
                            .unwrap();
                    }
                    pages += grow;
                    if i % 3 == 2 {
                        pages -= pages / 2;
                        let to = start + pages * PAGE_SIZE;
                        assert_eq!(mm.brk(to).unwrap(), to);
                        assert!(mm.write(to, &[1]).is_err(), "past the break");
                    }
                    let v = mm.vma_at(start).expect("the heap");
                    assert_eq!((v.start, v.end), (start, start + pages * PAGE_SIZE));
                    assert!(v.heap);
                }
                pages
            })
        };
        let others: Vec<_> = (0..3u64)
            .map(|t| {
                let (mm, go) = (mm.clone(), go.clone());
                std::thread::spawn(move || {
                    go.wait();
                    for i in 0..300u64 {
                        // Not accounted, so never merged with the heap: a
                        // placement that skips the gap a fault past the
                        // break holds may land just below the heap's start.
                        let len = 8 * PAGE_SIZE;
                        let a = mm.mmap(0, len, RW, anon() | MapFlags::NORESERVE).unwrap();
                        for p in 0..8 {
                            mm.write(a + p * PAGE_SIZE, &[pat(t, i, p); 64]).unwrap();
                        }
                        mm.mprotect(a + 2 * PAGE_SIZE, 2 * PAGE_SIZE, Prot::READ)
                            .unwrap();
                        for p in 0..8 {
                            let mut b = [0u8; 64];
                            mm.read(a + p * PAGE_SIZE, &mut b).unwrap();
                            assert_eq!(b, [pat(t, i, p); 64], "thread {t} page {p}");
                        }
                        mm.munmap(a, len).unwrap();
                    }
                })
            })
            .collect();
        for h in others {
            h.join().unwrap();
        }
        let pages = heap.join().unwrap();
        // Every heap page still holds what the brk thread last wrote there:
        // a page is written when the heap grows over it, so the rounds'
        // patterns are checked by reading each page's first byte against
        // the set of values it may hold.
        let vmas = mm.vmas();
        assert_eq!(vmas.len(), 1, "{mode:?}: only the heap is left");
        assert_eq!(
            (vmas[0].start, vmas[0].end),
            (start, start + pages * PAGE_SIZE)
        );
        for p in 0..pages {
            let mut b = [0u8; 64];
            mm.read(start + p * PAGE_SIZE, &mut b).unwrap();
            assert!(b.iter().all(|&x| x == b[0]), "{mode:?}: heap page {p} torn");
            assert!((0..300).any(|i| pat(9, i, p) == b[0]), "{mode:?}: page {p}");
        }
    }
}

/// Three threads move one break up and down at once: each brk returns
/// the break it asked for or, refused, the break it found, and whatever
/// the order, the heap is one VMA `[start, break rounded up)` at the end
/// (none when the break is back at the start), with no other VMA.
#[test]
fn racing_brks_keep_one_heap() {
    for mode in MODES {
        let mm = space(mode);
        let start = mm.brk(0).unwrap();
        // A mapping 64 pages above the start: growth stops a page below it.
        let wall = start + 64 * PAGE_SIZE;
        mm.mmap(wall, PAGE_SIZE, Prot::READ, anon() | MapFlags::FIXED)
            .unwrap();
        let go = Arc::new(Barrier::new(3));
        let hs: Vec<_> = (0..3u64)
            .map(|t| {
                let (mm, go) = (mm.clone(), go.clone());
                std::thread::spawn(move || {
                    go.wait();
                    let mut x = t + 1;
                    for _ in 0..2000 {
                        x = x
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        let to = start + (x >> 33) % (70 * PAGE_SIZE);
                        let got = mm.brk(to).unwrap();
                        if got != to {
                            // Refused: only a growth to the wall's page or
                            // past it can be.
                            assert!(to > wall - PAGE_SIZE, "brk({to:#x}) refused at {got:#x}");
                        }
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        let brk = mm.brk(0).unwrap();
        let end = brk.next_multiple_of(PAGE_SIZE);
        let vmas: Vec<_> = mm.vmas().iter().map(|v| (v.start, v.end, v.heap)).collect();
        let mut want = vec![(wall, wall + PAGE_SIZE, false)];
        if end > start {
            want.insert(0, (start, end, true));
        }
        assert_eq!(vmas, want, "{mode:?}");
    }
}

/// A range writer that frees a VMA and takes the same object again in one
/// call (`MAP_FIXED` over a mapping: the unmap gives the old VMA back to
/// the CPU's cache, and the new one comes straight out of it) leaves the
/// new VMA unlocked when the call ends: faults on it take the per-VMA
/// path, never finding it write-locked. The object's stamp still reads
/// "locked in this section" when the section takes it again, so the lock
/// does not list it twice; the section's end must still unlock it, as
/// the one entry its first lock made.
#[test]
fn a_vma_freed_and_taken_again_in_one_call_ends_unlocked() {
    let mm = AddressSpace::new(Config {
        fault_locking: FaultLocking::PerVma,
        writer_locking: WriterLocking::Range,
        range_bias: false,
        ..Config::default()
    });
    let len = 16 * PAGE_SIZE;
    let a = mm.mmap(0, len, RW, anon()).unwrap();
    for round in 0..4u8 {
        let b = mm.mmap(a, len, RW, anon() | MapFlags::FIXED).unwrap();
        assert_eq!(b, a);
        let before = mm.stats();
        mm.write(a, &[round; 64]).unwrap();
        let after = mm.stats();
        assert_eq!(
            after.retry_write_locked, before.retry_write_locked,
            "round {round}: the new VMA was still write-locked"
        );
        assert_eq!(after.fault_mmap_lock, before.fault_mmap_lock);
        assert!(after.fault_per_vma > before.fault_per_vma);
        let mut got = [0u8; 64];
        mm.read(a, &mut got).unwrap();
        assert_eq!(got, [round; 64]);
    }
}

/// Runs `call` (given the round) on a 64-page read-write mapping at `a`
/// while another thread flips its first half between read-only and
/// read-write, in both writer lockings: at least 2,000 rounds, and until
/// 3,000 flips ran meanwhile.
fn against_mprotect_flips(call: impl Fn(&AddressSpace, u64, u64, WriterLocking, u64)) {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    for writer_locking in [WriterLocking::Range, WriterLocking::MmapLock] {
        let mm = Arc::new(AddressSpace::new(Config {
            writer_locking,
            ..Config::default()
        }));
        let len = 64 * PAGE_SIZE;
        let a = mm.mmap(0, len, RW, anon()).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let flips = Arc::new(AtomicU64::new(0));
        let flipper = {
            let (mm, stop, flips) = (mm.clone(), stop.clone(), flips.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    mm.mprotect(a, len / 2, Prot::READ).unwrap();
                    mm.mprotect(a, len / 2, RW).unwrap();
                    flips.fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        let mut round = 0u64;
        while round < 2000 || (flips.load(Ordering::Relaxed) < 3000 && round < 1_000_000) {
            call(&mm, a, len, writer_locking, round);
            round += 1;
        }
        stop.store(true, Ordering::Relaxed);
        flipper.join().unwrap();
        assert!(flips.load(Ordering::Relaxed) >= 3000, "{writer_locking:?}");
    }
}

/// mlock populates each VMA as it finds it: an mprotect of half its range
/// to read-only meanwhile (failing the write faults the populate chose
/// before it) never makes mlock fail, as in Linux, which looks the VMA up
/// again (the loom model `range_slot_bias_owner_vs_whole_space_writer`
/// found it failing with `ENOMEM`).
#[test]
fn mlock_succeeds_while_its_range_is_mprotected() {
    against_mprotect_flips(|mm, a, len, locking, round| {
        assert_eq!(mm.mlock(a, len), Ok(()), "{locking:?}, round {round}");
        assert!(mm.vmas().iter().all(|v| v.flags.contains(VmFlags::LOCKED)));
        mm.munlock(a, len).unwrap();
        mm.madvise(a, len, Advice::DontNeed).unwrap();
    });
}

/// `MADV_POPULATE_WRITE` judges each VMA as it finds it: where an
/// mprotect made half the range read-only meanwhile, it fails with
/// `EINVAL` (the VMA looked up again refuses writes), as Linux, never
/// with `EFAULT` for a write fault the VMA it judged allowed.
#[test]
fn populate_write_meets_an_mprotect_with_einval_only() {
    against_mprotect_flips(|mm, a, len, locking, round| {
        let r = mm.madvise(a, len, Advice::PopulateWrite);
        assert!(
            matches!(r, Ok(()) | Err(Error::Inval)),
            "{locking:?}, round {round}: {r:?}"
        );
        mm.madvise(a, len, Advice::DontNeed).unwrap();
    });
}

/// `MAP_POPULATE` populates each VMA as it finds it: an mmap over the
/// range while another thread flips half of it to read-only and back
/// returns with every page resident, as in Linux, whose populate looks
/// the VMA up again and faults a read-only one for reading. (Stopping at
/// the first write fault the flip refused left pages unpopulated.)
///
/// Catches: the refusal taken for a failure (the arm `Err(FaultError::
/// NoMapping | FaultError::AccessDenied) => continue 'vmas` deleted in
/// `AddressSpace::populate_with`, src/mm/populate.rs): pages missing in
/// the first rounds (`mlock_succeeds_while_its_range_is_mprotected`
/// fails with `ENOMEM` the same way).
#[test]
fn map_populate_populates_every_page_while_its_range_is_mprotected() {
    against_mprotect_flips(|mm, a, len, locking, round| {
        let fixed = anon() | MapFlags::FIXED | MapFlags::POPULATE;
        assert_eq!(mm.mmap(a, len, RW, fixed), Ok(a));
        let resident = mm.mincore(a, len).unwrap();
        let missing = resident.iter().filter(|&&r| !r).count();
        assert_eq!(
            missing, 0,
            "{locking:?}, round {round}: pages not populated"
        );
    });
}

/// `max_map_count` with range writers at the limit at once: two threads
/// map pages apart (fixed, or placed in windows of their own) until
/// `ENOMEM`, each checking the limit while the other maps; the count ends
/// exactly at the limit, never past it (near the limit a range writer
/// runs as a whole-space writer, `MapCount::far_below`; when both checked
/// the shared count, one past the limit in a few rounds of 200).
///
/// Two limits: 40, where range writers always take the whole space, and
/// 20,000, where they run as range writers up to about 15,000 VMAs first.
/// With the bias on, each thread, in a slot of its own, ends up owning
/// its slot's bias and counting in that slot's part of the count
/// (`mm::map_count`).
///
/// Catches: a range writer admitted near the limit, fixed
/// (`!st.map_count_far_below(mm.cfg.max_map_count)` made `false` in
/// `Edit::begin_range`, src/mm/edit/range.rs) or placed
/// (`placed.as_ref().is_ok_and(near)` made `false` in
/// `AddressSpace::begin_range_mmap`, src/mm/mmap.rs): 41 VMAs in every
/// run here. Without the sum of the slots' parts (`MapCount::get`), or
/// a slot owner's change not stored (`MapCount::add_owner`), the count
/// ends off `vmas()`.
#[test]
fn map_count_never_passes_the_limit_with_writers_at_it_at_once() {
    for bias in [false, true] {
        for placed in [false, true] {
            for (max, rounds) in [(40usize, 200), (20_000, 10)] {
                at_the_limit(max, rounds, placed, bias);
            }
        }
    }
}

/// Two threads map pages until `ENOMEM`: fixed, in slots of their own,
/// or `placed` by the space in per-CPU windows (read-only and read-write
/// in turn, so that neighbours do not merge), with the range lock's
/// biases if `bias`.
fn at_the_limit(max: usize, rounds: usize, placed: bool, bias: bool) {
    for _ in 0..rounds {
        let mm = Arc::new(AddressSpace::new(Config {
            writer_locking: WriterLocking::Range,
            range_bias: bias,
            max_map_count: max,
            placement_window: if placed { 1 << 40 } else { 0 },
            ..Config::default()
        }));
        let start = Arc::new(Barrier::new(2));
        let hs: Vec<_> = (0..2u64)
            .map(|t| {
                let (mm, start) = (mm.clone(), start.clone());
                std::thread::spawn(move || {
                    let base = 0x1000_0000_0000 + t * 0x100_0000_0000;
                    start.wait();
                    for i in 0..max as u64 {
                        let done = if placed {
                            let prot = if i % 2 == 0 { Prot::READ } else { RW };
                            mm.mmap(0, PAGE_SIZE, prot, anon())
                        } else {
                            let a = base + 2 * i * PAGE_SIZE;
                            mm.mmap(a, PAGE_SIZE, RW, anon() | MapFlags::FIXED)
                        };
                        if done.is_err() {
                            break;
                        }
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        let n = mm.map_count();
        assert_eq!(
            n, max,
            "VMAs at the end, limit {max}, placed {placed}, bias {bias}"
        );
        assert_eq!(mm.vmas().len(), n);
        assert_eq!(
            mm.mmap(0x3000_0000_0000, PAGE_SIZE, RW, anon() | MapFlags::FIXED),
            Err(Error::NoMem)
        );
    }
}
