//! fork: copy-on-write isolation, frame lifetimes across sharers, the
//! reverse map over an anon_vma family, the merge rule for fork-inherited
//! VMAs, the brk fast path's lock count, a proptest of both sides against
//! a byte oracle, and fork racing with writers.

use aspace::{AddressSpace, Config, MapFlags, MremapFlags, Prot, RmapHit};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

const PAGE: u64 = 4096;
const RW: Prot = Prot::READ.union(Prot::WRITE);
const ANON: MapFlags = MapFlags::PRIVATE.union(MapFlags::ANONYMOUS);

fn byte(mm: &AddressSpace, a: u64) -> u8 {
    let mut b = [0u8];
    mm.read(a, &mut b).unwrap();
    b[0]
}

#[test]
fn writes_never_cross_between_parent_and_child() {
    let mm = AddressSpace::new(Config::default());
    let a = mm.mmap(0, 4 * PAGE, RW, ANON).unwrap();
    for p in 0..4 {
        mm.write(a + p * PAGE, &[10 + p as u8; 64]).unwrap();
    }
    let child = mm.fork().unwrap();
    assert_eq!(child.vmas(), mm.vmas());
    assert_eq!(child.map_count(), mm.map_count());
    // Each side writes a different page, and both write page 3.
    child.write(a, b"child").unwrap();
    mm.write(a + PAGE, b"parent").unwrap();
    child.write(a + 3 * PAGE, b"C").unwrap();
    mm.write(a + 3 * PAGE, b"P").unwrap();
    let mut buf = [0u8; 6];
    mm.read(a, &mut buf[..5]).unwrap();
    assert_eq!(&buf[..5], &[10; 5]);
    child.read(a, &mut buf[..5]).unwrap();
    assert_eq!(&buf[..5], b"child");
    child.read(a + PAGE, &mut buf).unwrap();
    assert_eq!(buf, [11; 6]);
    mm.read(a + PAGE, &mut buf).unwrap();
    assert_eq!(&buf, b"parent");
    assert_eq!(byte(&mm, a + 3 * PAGE), b'P');
    assert_eq!(byte(&child, a + 3 * PAGE), b'C');
    // Page 2 was written by nobody: still shared, same frame.
    assert_eq!(mm.translate(a + 2 * PAGE), child.translate(a + 2 * PAGE));
    assert_ne!(mm.translate(a), child.translate(a));
    // A grandchild sees the child's state, and is isolated from it too.
    let gc = child.fork().unwrap();
    gc.write(a + PAGE, b"grand").unwrap();
    assert_eq!(byte(&gc, a), b'c');
    assert_eq!(byte(&child, a + PAGE), 11);
    assert_eq!(byte(&mm, a + PAGE), b'p');
}

#[test]
fn shared_mappings_stay_shared_after_fork() {
    let mm = AddressSpace::new(Config::default());
    let s = mm
        .mmap(0, 2 * PAGE, RW, MapFlags::SHARED | MapFlags::ANONYMOUS)
        .unwrap();
    mm.write(s, b"before").unwrap();
    let child = mm.fork().unwrap();
    child.write(s + 1, b"XY").unwrap();
    mm.write(s + PAGE, b"later").unwrap();
    let mut buf = [0u8; 6];
    mm.read(s, &mut buf).unwrap();
    assert_eq!(&buf, b"bXYore");
    child.read(s + PAGE, &mut buf[..5]).unwrap();
    assert_eq!(&buf[..5], b"later");
    assert_eq!(mm.translate(s), child.translate(s));
    drop(child);
    assert_eq!(mm.frames_used(), 2);
    mm.munmap(s, 2 * PAGE).unwrap();
    assert_eq!(mm.frames_used(), 0);
}

#[test]
fn a_frame_is_freed_exactly_when_its_last_sharer_unmaps_it() {
    let mm = AddressSpace::new(Config::default());
    let a = mm.mmap(0, 2 * PAGE, RW, ANON).unwrap();
    mm.write(a, b"x").unwrap();
    mm.write(a + PAGE, b"y").unwrap();
    assert_eq!(mm.frames_used(), 2);
    let child = mm.fork().unwrap();
    let grandchild = child.fork().unwrap();
    assert_eq!(mm.frames_used(), 2, "fork copies no frame");
    // Page 0: three sharers unmap in turn; the frame goes with the last.
    mm.munmap(a, PAGE).unwrap();
    assert_eq!(mm.frames_used(), 2);
    grandchild.munmap(a, PAGE).unwrap();
    assert_eq!(mm.frames_used(), 2);
    child.munmap(a, PAGE).unwrap();
    assert_eq!(mm.frames_used(), 1);
    // Page 1: the child copies it, so two frames exist; the original goes
    // when parent and grandchild have both dropped it.
    child.write(a + PAGE, b"z").unwrap();
    assert_eq!(mm.frames_used(), 2);
    mm.munmap(a + PAGE, PAGE).unwrap();
    assert_eq!(mm.frames_used(), 2);
    drop(grandchild);
    assert_eq!(mm.frames_used(), 1);
    assert_eq!(byte(&child, a + PAGE), b'z');
    child.munmap(a, 2 * PAGE).unwrap();
    assert_eq!(mm.frames_used(), 0);
}

#[test]
fn forking_a_large_address_space_copies_nothing_until_a_write() {
    const LEN: u64 = 64 << 20;
    let mm = AddressSpace::new(Config::default());
    let a = mm.mmap(0, LEN, RW, ANON | MapFlags::POPULATE).unwrap();
    let n = LEN / PAGE;
    assert_eq!(mm.frames_used(), n);
    mm.write(a + 5 * PAGE, b"data").unwrap();
    let child = mm.fork().unwrap();
    assert_eq!(mm.frames_used(), n, "fork copied page data");
    // Reads share.
    let mut buf = [0u8; 4];
    child.read(a + 5 * PAGE, &mut buf).unwrap();
    assert_eq!(&buf, b"data");
    mm.read(a + LEN - PAGE, &mut buf).unwrap();
    assert_eq!(mm.frames_used(), n);
    // One write copies exactly one frame, under the VMA's own lock (the
    // copy-on-write fault never falls back to the mmap_lock)...
    let before = child.stats();
    child.write(a + 5 * PAGE, b"DATA").unwrap();
    assert_eq!(mm.frames_used(), n + 1);
    let after = child.stats();
    assert_eq!(after.cow_copies, 1);
    assert_eq!(after.fault_per_vma - before.fault_per_vma, 1);
    assert_eq!(after.fault_mmap_lock, before.fault_mmap_lock);
    // ...and the parent's write to that page then reuses its frame, which
    // it now holds alone.
    mm.write(a + 5 * PAGE, b"mine").unwrap();
    assert_eq!(mm.frames_used(), n + 1);
    assert_eq!(mm.stats().cow_reuses, 1);
    assert_eq!(mm.stats().cow_copies, 0);
    mm.read(a + 5 * PAGE, &mut buf).unwrap();
    assert_eq!(&buf, b"mine");
    child.read(a + 5 * PAGE, &mut buf).unwrap();
    assert_eq!(&buf, b"DATA");
    drop(child);
    assert_eq!(mm.frames_used(), n);
    drop(mm);
}

fn heap_family(cfg: Config) -> (AddressSpace, AddressSpace, u64) {
    let mm = AddressSpace::new(cfg);
    let base = mm.brk(0).unwrap();
    mm.brk(base + 4 * PAGE).unwrap();
    mm.write(base, b"heap").unwrap();
    let child = mm.fork().unwrap();
    (mm, child, base)
}

/// brk grow, touch, shrink in the child; returns the anon_vma lock
/// acquisitions these took.
fn brk_cycles(child: &AddressSpace, base: u64, rounds: u64) -> u64 {
    let before = child.stats().anon_vma_lock;
    for r in 0..rounds {
        let top = base + 4 * PAGE + (1 + r % 8) * PAGE;
        assert_eq!(child.brk(top).unwrap(), top);
        child.write(top - PAGE, b"new").unwrap();
        assert_eq!(byte(child, top - PAGE), b'n');
        assert_eq!(child.brk(base + 4 * PAGE).unwrap(), base + 4 * PAGE);
    }
    child.stats().anon_vma_lock - before
}

#[test]
fn brk_end_moves_take_no_anon_vma_lock_with_the_fast_path() {
    let (mm, child, base) = heap_family(Config::default());
    // The heap in the child is chained to the parent's anon_vma and was
    // already written, so growing, touching and shrinking it move only its
    // end: no anon_vma lock at all.
    child.write(base + PAGE, b"own").unwrap();
    let frames = mm.frames_used();
    assert_eq!(brk_cycles(&child, base, 100), 0);
    assert_eq!(mm.frames_used(), frames, "shrinks freed the touched pages");
    assert_eq!(child.vmas().len(), 1);
    assert_eq!(child.vmas()[0].end, base + 4 * PAGE);
    // The reverse map followed the moves: the heap's first page is mapped
    // in both, at the same address.
    let hits = mm.rmap_walk(base);
    let ids: Vec<u64> = hits.iter().map(|h| h.mm_id).collect();
    assert_eq!(hits.len(), 2);
    assert!(ids.contains(&mm.id()) && ids.contains(&child.id()));
    assert!(hits.iter().all(|h| h.addr == base));
    // Moving the start (unmapping the heap's first page) does take it.
    let before = child.stats().anon_vma_lock;
    child.munmap(base, PAGE).unwrap();
    assert!(child.stats().anon_vma_lock > before);
}

#[test]
fn brk_end_moves_take_the_anon_vma_lock_without_the_fast_path() {
    let cfg = Config {
        brk_fast_path: false,
        ..Config::default()
    };
    let (_mm, child, base) = heap_family(cfg);
    child.write(base + PAGE, b"own").unwrap();
    // Each grow and each shrink takes it once.
    assert_eq!(brk_cycles(&child, base, 100), 200);
    let s = child.stats();
    assert!(s.anon_vma_lock_contended <= s.anon_vma_lock);
}

#[test]
fn rmap_walk_finds_every_sharer_and_follows_moves() {
    let mm = AddressSpace::new(Config::default());
    let a = mm.mmap(0, 8 * PAGE, RW, ANON).unwrap();
    for p in 0..8 {
        mm.write(a + p * PAGE, &[p as u8]).unwrap();
    }
    // No anon_vma, no reverse map: a never-written mapping.
    let z = mm.mmap(0, PAGE, Prot::READ, ANON).unwrap();
    assert_eq!(byte(&mm, z), 0);
    assert!(mm.rmap_walk(z).is_empty());
    let c1 = mm.fork().unwrap();
    let c2 = mm.fork().unwrap();
    let gc = c1.fork().unwrap();
    let family = [&mm, &c1, &c2, &gc];
    let expect = |addr_of: &dyn Fn(u64) -> Option<u64>| -> Vec<(u64, u64)> {
        let mut v: Vec<(u64, u64)> = family
            .iter()
            .filter_map(|m| addr_of(m.id()).map(|x| (m.id(), x)))
            .collect();
        v.sort();
        v
    };
    let pairs = |h: Vec<RmapHit>| -> Vec<(u64, u64)> {
        let mut v: Vec<(u64, u64)> = h.into_iter().map(|h| (h.mm_id, h.addr)).collect();
        v.sort();
        v
    };
    let page3 = a + 3 * PAGE;
    assert_eq!(pairs(mm.rmap_walk(page3)), expect(&|_| Some(page3)));
    // From any member, the same answer, and each hit maps the very frame.
    assert_eq!(pairs(gc.rmap_walk(page3 + 17)), expect(&|_| Some(page3)));
    let pfn = mm.translate(page3).unwrap();
    for m in family {
        assert_eq!(m.translate(page3), Some(pfn));
    }
    // c2 moves its mapping: its hit follows (start and pgoff based).
    let moved = c2
        .mremap(
            a,
            8 * PAGE,
            8 * PAGE,
            MremapFlags::MAYMOVE | MremapFlags::FIXED,
            a + (64 << 20),
        )
        .unwrap();
    let want = expect(&|id| {
        Some(if id == c2.id() {
            moved + 3 * PAGE
        } else {
            page3
        })
    });
    assert_eq!(pairs(mm.rmap_walk(page3)), want);
    assert_eq!(c2.translate(moved + 3 * PAGE), Some(pfn));
    // c1 unmaps the page's part of its VMA (a split and a start move).
    c1.munmap(a + 2 * PAGE, 2 * PAGE).unwrap();
    let want = expect(&|id| match id {
        x if x == c1.id() => None,
        x if x == c2.id() => Some(moved + 3 * PAGE),
        _ => Some(page3),
    });
    assert_eq!(pairs(gc.rmap_walk(page3)), want);
    // The other pieces of c1 are still found at their pages.
    assert!(pairs(mm.rmap_walk(a + 5 * PAGE)).contains(&(c1.id(), a + 5 * PAGE)));
    assert!(pairs(mm.rmap_walk(a + PAGE)).contains(&(c1.id(), a + PAGE)));
    // mprotect splits in the grandchild keep every piece in the map.
    gc.mprotect(a + PAGE, 5 * PAGE, Prot::READ).unwrap();
    for p in 0..8 {
        assert!(pairs(mm.rmap_walk(a + p * PAGE)).contains(&(gc.id(), a + p * PAGE)));
    }
    drop(gc);
    drop(c1);
    assert_eq!(
        pairs(mm.rmap_walk(page3)),
        vec![(mm.id(), page3), (c2.id(), moved + 3 * PAGE)]
            .into_iter()
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect::<Vec<_>>()
    );
}

#[test]
fn fork_inherited_vmas_do_not_merge_with_new_neighbours() {
    let mm = AddressSpace::new(Config::default());
    let a = mm.mmap(0, 2 * PAGE, RW, ANON).unwrap();
    mm.write(a, b"x").unwrap();
    let child = mm.fork().unwrap();
    // In the parent (chain of one), a new adjacent mapping merges...
    mm.mmap(a + 2 * PAGE, PAGE, RW, ANON | MapFlags::FIXED)
        .unwrap();
    assert_eq!(mm.vmas().len(), 1);
    // ...in the child (chain of two) it stays apart, as in Linux.
    child
        .mmap(a + 2 * PAGE, PAGE, RW, ANON | MapFlags::FIXED)
        .unwrap();
    assert_eq!(child.vmas().len(), 2);
    // Splitting and re-joining by mprotect in the child still merges: the
    // pieces share one anon_vma.
    child.mprotect(a, PAGE, Prot::READ).unwrap();
    assert_eq!(child.vmas().len(), 3);
    child.mprotect(a, PAGE, RW).unwrap();
    assert_eq!(child.vmas().len(), 2);
}

// ---------------------------------------------------------------------
// Proptest: fork, writes, mprotect, munmap, mmap on both sides against a
// byte oracle per address space.

const NP: u64 = 16;
const BASE: u64 = 0x2000_0000_0000;

#[derive(Clone, Debug)]
enum Op {
    /// The child becomes a fresh fork of side `from` (0 parent, 1 child).
    Fork {
        from: usize,
    },
    Write {
        who: usize,
        page: u64,
        off: u64,
        len: u64,
        seed: u8,
    },
    Protect {
        who: usize,
        page: u64,
        pages: u64,
        prot: u8,
    },
    Unmap {
        who: usize,
        page: u64,
        pages: u64,
    },
    Map {
        who: usize,
        page: u64,
        pages: u64,
    },
}

fn prot_of(p: u8) -> Prot {
    match p {
        0 => RW,
        1 => Prot::READ,
        _ => Prot::NONE,
    }
}

fn op() -> impl Strategy<Value = Op> {
    let who = 0..2usize;
    prop_oneof![
        1 => (0..2usize).prop_map(|from| Op::Fork { from }),
        6 => (who.clone(), 0..NP, 0..PAGE, 1..PAGE, any::<u8>()).prop_map(|(who, page, off, len, seed)| {
            Op::Write { who, page, off, len: len.min(PAGE - off), seed }
        }),
        2 => (who.clone(), 0..NP, 1..5u64, 0..3u8).prop_map(|(who, page, pages, prot)| Op::Protect { who, page, pages, prot }),
        1 => (who.clone(), 0..NP, 1..4u64).prop_map(|(who, page, pages)| Op::Unmap { who, page, pages }),
        1 => (who, 0..NP, 1..4u64).prop_map(|(who, page, pages)| Op::Map { who, page, pages }),
    ]
}

/// page -> (protection, bytes).
type Oracle = BTreeMap<u64, (Prot, Vec<u8>)>;

fn apply(mm: &AddressSpace, o: &mut Oracle, op: &Op) {
    let addr = |p: u64| BASE + p * PAGE;
    match *op {
        Op::Fork { .. } => unreachable!(),
        Op::Write {
            page,
            off,
            len,
            seed,
            ..
        } => {
            let data: Vec<u8> = (0..len).map(|i| seed.wrapping_add(i as u8) | 1).collect();
            let r = mm.write(addr(page) + off, &data);
            match o.get_mut(&page) {
                Some((p, bytes)) if p.contains(Prot::WRITE) => {
                    assert!(r.is_ok(), "{op:?}: {r:?}");
                    bytes[off as usize..(off + len) as usize].copy_from_slice(&data);
                }
                _ => assert!(r.is_err(), "{op:?} succeeded"),
            }
        }
        Op::Protect {
            page, pages, prot, ..
        } => {
            let pages = pages.min(NP - page);
            let r = mm.mprotect(addr(page), pages * PAGE, prot_of(prot));
            let mut hole = false;
            for p in page..page + pages {
                match o.get_mut(&p) {
                    Some((pp, _)) => *pp = prot_of(prot),
                    None => {
                        hole = true;
                        break;
                    }
                }
            }
            assert_eq!(r.is_err(), hole, "{op:?}: {r:?}");
        }
        Op::Unmap { page, pages, .. } => {
            let pages = pages.min(NP - page);
            mm.munmap(addr(page), pages * PAGE).unwrap();
            for p in page..page + pages {
                o.remove(&p);
            }
        }
        Op::Map { page, pages, .. } => {
            let pages = pages.min(NP - page);
            mm.mmap(addr(page), pages * PAGE, RW, ANON | MapFlags::FIXED)
                .unwrap();
            for p in page..page + pages {
                o.insert(p, (RW, vec![0; PAGE as usize]));
            }
        }
    }
}

fn check(mm: &AddressSpace, o: &Oracle, what: &str) {
    let mut buf = vec![0u8; PAGE as usize];
    for p in 0..NP {
        let r = mm.read(BASE + p * PAGE, &mut buf);
        match o.get(&p) {
            Some((prot, bytes)) if !prot.is_empty() => {
                assert!(r.is_ok(), "{what}: page {p} unreadable");
                assert!(buf == *bytes, "{what}: page {p} differs");
            }
            _ => assert!(r.is_err(), "{what}: page {p} readable"),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        // Reproducible runs, and no regression files written into the tree.
        rng_seed: proptest::test_runner::RngSeed::Fixed(0xF04B_CA5E),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn fork_model(ops in proptest::collection::vec(op(), 1..60)) {
        let parent = AddressSpace::new(Config::default());
        parent.mmap(BASE, NP * PAGE, RW, ANON | MapFlags::FIXED).unwrap();
        let mut po: Oracle = (0..NP).map(|p| (p, (RW, vec![0; PAGE as usize]))).collect();
        let mut child: Option<AddressSpace> = None;
        let mut co: Oracle = Oracle::new();
        for op in &ops {
            match *op {
                Op::Fork { from } => {
                    let (src, so) = match (&child, from) {
                        (Some(c), 1) => (c, &co),
                        _ => (&parent, &po),
                    };
                    let new = src.fork().unwrap();
                    co = so.clone();
                    child = Some(new);
                }
                Op::Write { who, .. } | Op::Protect { who, .. } | Op::Unmap { who, .. } | Op::Map { who, .. } => {
                    match (who, &child) {
                        (1, Some(c)) => apply(c, &mut co, op),
                        _ => apply(&parent, &mut po, op),
                    }
                }
            }
            check(&parent, &po, "parent");
            if let Some(c) = &child {
                check(c, &co, "child");
                // Every written page of the child is found by the reverse
                // map at its own address.
                for (&p, (prot, bytes)) in &co {
                    let a = BASE + p * PAGE;
                    if !prot.is_empty() && bytes.iter().any(|&b| b != 0) && c.translate(a).is_some() {
                        prop_assert!(c.rmap_walk(a).iter().any(|h| h.mm_id == c.id() && h.addr == a));
                    }
                }
            }
        }
        // The family shares one allocator: once the child is gone and the
        // parent unmaps everything, no frame is left.
        drop(child);
        parent.munmap(BASE, NP * PAGE).unwrap();
        prop_assert_eq!(parent.frames_used(), 0);
    }
}

#[test]
fn family_frames_return_to_zero_after_random_sharing() {
    let mm = AddressSpace::new(Config::default());
    let a = mm.mmap(0, 32 * PAGE, RW, ANON).unwrap();
    let mut kids = Vec::new();
    for round in 0..6u64 {
        for p in (round..32).step_by(3) {
            mm.write(a + p * PAGE, &[round as u8 + 1]).unwrap();
        }
        let k = mm.fork().unwrap();
        for p in (0..32).step_by(round as usize + 2) {
            k.write(a + p * PAGE + 7, &[0xee]).unwrap();
        }
        kids.push(k);
    }
    for (i, k) in kids.iter().enumerate() {
        k.munmap(a + (i as u64) * PAGE, 4 * PAGE).unwrap();
    }
    mm.munmap(a, 32 * PAGE).unwrap();
    assert!(mm.frames_used() > 0);
    let last = kids.pop().unwrap();
    drop(kids);
    last.munmap(a, 32 * PAGE).unwrap();
    assert_eq!(mm.frames_used(), 0);
}

// ---------------------------------------------------------------------
// fork racing with writers in the parent.

/// A page's content for generation `gen` of page `p`: every 8-byte word
/// equal, so a torn page is visible (generation 0 is the zero page).
fn pattern(p: u64, gen: u64) -> Vec<u8> {
    let w = if gen == 0 { 0 } else { (p << 32) | gen };
    w.to_le_bytes().repeat(PAGE as usize / 8)
}

/// Decodes a page: Some(generation) if all words agree and name page `p`.
fn decode(p: u64, buf: &[u8]) -> Option<u64> {
    let w0 = u64::from_le_bytes(buf[..8].try_into().unwrap());
    if buf
        .chunks(8)
        .any(|c| u64::from_le_bytes(c.try_into().unwrap()) != w0)
    {
        return None;
    }
    if w0 == 0 {
        return Some(0);
    }
    (w0 >> 32 == p).then_some(w0 & 0xffff_ffff)
}

#[test]
fn fork_while_threads_write_in_the_parent_loses_nothing() {
    const PAGES: u64 = 64;
    const WRITERS: u64 = 2;
    const FORKS: usize = 24;
    let mm = Arc::new(AddressSpace::new(Config::default()));
    let a = mm.mmap(0, PAGES * PAGE, RW, ANON).unwrap();
    let done: Arc<Vec<AtomicU64>> = Arc::new((0..PAGES).map(|_| AtomicU64::new(0)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (mm, done, stop) = (mm.clone(), done.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut gen = 0;
                while !stop.load(Ordering::Relaxed) {
                    gen += 1;
                    for p in (w..PAGES).step_by(WRITERS as usize) {
                        mm.write(a + p * PAGE, &pattern(p, gen)).unwrap();
                        done[p as usize].store(gen, Ordering::SeqCst);
                    }
                }
                gen
            })
        })
        .collect();
    let mut buf = vec![0u8; PAGE as usize];
    let mut last = vec![0u64; PAGES as usize];
    for _ in 0..FORKS {
        // Fork only once every page has been written again since the last
        // fork (so both writers moved on), and every fork overlaps writes
        // and their copy-on-write faults. Waiting on each page rather than
        // on a total keeps one writer's head start from passing for both.
        while done
            .iter()
            .zip(&last)
            .any(|(d, &l)| d.load(Ordering::SeqCst) <= l)
        {
            std::thread::yield_now();
        }
        let lo: Vec<u64> = done.iter().map(|d| d.load(Ordering::SeqCst)).collect();
        last.clone_from(&lo);
        let child = mm.fork().unwrap();
        let hi: Vec<u64> = done.iter().map(|d| d.load(Ordering::SeqCst) + 1).collect();
        // Each page of the snapshot is one whole generation, written no
        // earlier than before the fork began and no later than the write
        // in progress when it ended.
        for p in 0..PAGES {
            child.read(a + p * PAGE, &mut buf).unwrap();
            let g = decode(p, &buf).unwrap_or_else(|| panic!("page {p} torn in the child"));
            assert!(
                lo[p as usize] <= g && g <= hi[p as usize],
                "page {p}: {g} not in {lo:?}..{hi:?}",
                lo = lo[p as usize],
                hi = hi[p as usize]
            );
        }
        // The child is its own: writing it does not disturb the parent.
        child.write(a, &pattern(0, 0xdead)).unwrap();
        drop(child);
    }
    stop.store(true, Ordering::Relaxed);
    // Each fork waited for a new generation of every page.
    for h in writers {
        assert!(
            h.join().unwrap() >= FORKS as u64,
            "the writers made progress"
        );
    }
    assert!(mm.stats().cow_copies + mm.stats().cow_reuses > 0);
    // The parent kept every last write.
    for p in 0..PAGES {
        mm.read(a + p * PAGE, &mut buf).unwrap();
        assert_eq!(
            decode(p, &buf),
            Some(done[p as usize].load(Ordering::SeqCst)),
            "page {p}"
        );
    }
    mm.munmap(a, PAGES * PAGE).unwrap();
    assert_eq!(mm.frames_used(), 0);
}

/// With the fast path on, the anon_vma lock is taken where Linux takes it
/// (a first fault linking a new anon_vma, a split inserting a VMA, a start
/// moving, a merge removing a VMA) and not where only an end moves with
/// nothing inserted (mremap growing in place, like brk). With the fast path
/// off, that end move takes it too.
#[test]
fn anon_vma_lock_is_taken_where_linux_takes_it() {
    for fast_path in [true, false] {
        let mm = AddressSpace::new(Config {
            brk_fast_path: fast_path,
            ..Config::default()
        });
        let locks = |f: &dyn Fn()| {
            let before = mm.stats().anon_vma_lock;
            f();
            mm.stats().anon_vma_lock - before
        };
        // Mapping takes nothing: no anon_vma until the first write.
        let a = mm.mmap(0, 8 * PAGE, RW, ANON).unwrap();
        assert_eq!(mm.stats().anon_vma_lock, 0);
        assert_eq!(locks(&|| mm.write(a, b"x").unwrap()), 1, "first fault");
        assert_eq!(locks(&|| mm.write(a + PAGE, b"y").unwrap()), 0);
        // Unmapping the tail splits the VMA (Linux's munmap does too).
        assert!(locks(&|| mm.munmap(a + 6 * PAGE, 2 * PAGE).unwrap()) > 0);
        // Growing in place moves only the end.
        let grow = locks(&|| {
            let got = mm.mremap(a, 6 * PAGE, 8 * PAGE, MremapFlags::empty(), 0);
            assert_eq!(got, Ok(a));
        });
        assert_eq!(grow, if fast_path { 0 } else { 1 }, "end-only move");
        // A split, the merge that undoes it, and a start move all take it.
        assert!(locks(&|| mm.mprotect(a + PAGE, PAGE, Prot::READ).unwrap()) > 0);
        assert_eq!(mm.vmas().len(), 3);
        assert!(locks(&|| mm.mprotect(a + PAGE, PAGE, RW).unwrap()) > 0);
        assert_eq!(mm.vmas().len(), 1);
        assert!(locks(&|| mm.munmap(a, PAGE).unwrap()) > 0);
        // The data followed every change.
        assert_eq!(byte(&mm, a + PAGE), b'y');
        assert_eq!(mm.vmas()[0].start, a + PAGE);
        assert_eq!(mm.vmas()[0].end, a + 8 * PAGE);
    }
}

/// Found by a long run of `fork_model`: in a child, a VMA without an
/// anon_vma merges into the next VMA, which has an anon_vma of its own,
/// while the previous VMA belongs to the parent's family. The merge moves
/// the next VMA's start, so its reverse-map entry must be re-filed in its
/// own family, not the previous VMA's.
#[test]
fn rmap_follows_a_merge_that_moves_a_start_down() {
    let mm = AddressSpace::new(Config::default());
    let base = 0x2000_0000_0000;
    let at = |p: u64| base + p * PAGE;
    mm.mmap(base, 16 * PAGE, RW, ANON | MapFlags::FIXED)
        .unwrap();
    mm.mprotect(at(10), PAGE, Prot::READ).unwrap();
    // Pages 0..10 get the parent's anon_vma; the child inherits a chain.
    mm.write(at(0), b"a").unwrap();
    let child = mm.fork().unwrap();
    // The child's [11, 16) gets an anon_vma of a new family.
    child.write(at(11), b"b").unwrap();
    // [10, 11) becomes writable and merges into [11, 16) only: [0, 10)'s
    // chain is not singular, so it does not merge with an anon_vma-less
    // VMA.
    child.mprotect(at(7), 4 * PAGE, RW).unwrap();
    let layout: Vec<(u64, u64)> = child.vmas().iter().map(|v| (v.start, v.end)).collect();
    assert_eq!(layout, vec![(at(0), at(10)), (at(10), at(16))]);
    child.write(at(10), b"c").unwrap();
    for p in [0, 10, 11] {
        let hits = child.rmap_walk(at(p));
        assert!(
            hits.iter()
                .any(|h| h.mm_id == child.id() && h.addr == at(p)),
            "page {p}: {hits:?}"
        );
    }
    // The parent is found for its own page 0 only.
    assert!(child.rmap_walk(at(0)).iter().any(|h| h.mm_id == mm.id()));
    assert!(child
        .rmap_walk(at(11))
        .iter()
        .all(|h| h.mm_id == child.id()));
}
