//! fork's bulk copy: many VMAs in mixed states (anon_vma with pages, with
//! no page present, none at all with zero-page entries, shared, chained
//! from an earlier fork), spread over several PTE tables and over tables
//! far apart, then checked entry by entry: layout, bytes, reverse map,
//! frame accounting after both sides write, and that the family lock is
//! taken per run of VMAs of a family, not per VMA.

use aspace::{AddressSpace, Config, MapFlags, Prot};
use std::collections::BTreeSet;

const PAGE: u64 = 4096;
const RW: Prot = Prot::READ.union(Prot::WRITE);
const ANON: MapFlags = MapFlags::PRIVATE.union(MapFlags::ANONYMOUS);
const FIXED: MapFlags = ANON.union(MapFlags::FIXED);

/// Block A: one mapping split into one-page VMAs (one anon_vma family),
/// crossing PTE tables. Every fourth page is never written.
const A: u64 = 0x1000_0000;
const A_PAGES: u64 = 1200;
/// Block B: separate one-page mappings with holes between (a family
/// each), one PTE table apart from A and 1 GiB apart from each other in
/// pairs so that upper tables are missing between them.
const B: u64 = 0x4000_0000;
const B_MAPS: u64 = 40;
/// Block C: read-faulted only (zero-page entries, no anon_vma), split.
const C: u64 = 0x2000_0000;
const C_PAGES: u64 = 64;
/// Block D: shared anonymous, written.
const D: u64 = 0x3000_0000;
const D_PAGES: u64 = 16;

fn b_addr(i: u64) -> u64 {
    B + (i / 2) * (1 << 30) + (i % 2) * 2 * PAGE
}

/// The byte a side wrote last at page `addr` (0 = never written).
fn byte(mm: &AddressSpace, addr: u64) -> u8 {
    let mut b = [0u8];
    mm.read(addr, &mut b).unwrap();
    b[0]
}

fn tag(addr: u64, gen: u8) -> u8 {
    ((addr / PAGE) as u8 | 1).wrapping_add(gen.wrapping_mul(37))
}

/// Private pages a side can write (read-write VMAs).
fn writable_private(mm: &AddressSpace) -> Vec<u64> {
    mm.vmas()
        .iter()
        .filter(|v| !v.shared && v.prot == RW)
        .flat_map(|v| (v.start..v.end).step_by(PAGE as usize))
        .collect()
}

fn build() -> (AddressSpace, Vec<u64>) {
    let mm = AddressSpace::new(Config::default());
    let mut written = Vec::new();
    mm.mmap(A, A_PAGES * PAGE, RW, FIXED).unwrap();
    for p in 0..A_PAGES {
        let a = A + p * PAGE;
        if p % 4 != 3 {
            mm.write(a, &[tag(a, 0)]).unwrap();
            written.push(a);
        }
    }
    for p in (1..A_PAGES).step_by(2) {
        mm.mprotect(A + p * PAGE, PAGE, Prot::READ).unwrap();
    }
    for i in 0..B_MAPS {
        let a = b_addr(i);
        mm.mmap(a, PAGE, RW, FIXED).unwrap();
        // Every fifth gets an anon_vma by a write, then loses the page:
        // an anon_vma with no page present.
        mm.write(a, &[tag(a, 0)]).unwrap();
        if i % 5 == 4 {
            mm.madvise(a, PAGE, aspace::Advice::DontNeed).unwrap();
        } else {
            written.push(a);
        }
    }
    mm.mmap(C, C_PAGES * PAGE, RW, FIXED).unwrap();
    for p in 0..C_PAGES {
        assert_eq!(byte(&mm, C + p * PAGE), 0);
    }
    for p in (0..C_PAGES).step_by(2) {
        mm.mprotect(C + p * PAGE, PAGE, Prot::READ).unwrap();
    }
    mm.mmap(
        D,
        D_PAGES * PAGE,
        RW,
        MapFlags::SHARED | MapFlags::ANONYMOUS | MapFlags::FIXED,
    )
    .unwrap();
    for p in 0..D_PAGES {
        mm.write(D + p * PAGE, &[tag(D + p * PAGE, 0)]).unwrap();
    }
    (mm, written)
}

fn mm_ids(mm: &AddressSpace, addr: u64) -> BTreeSet<(u64, u64)> {
    mm.rmap_walk(addr)
        .into_iter()
        .map(|h| (h.mm_id, h.addr))
        .collect()
}

#[test]
fn a_bulk_fork_of_mixed_vmas_copies_every_entry_and_link() {
    let (gp, written) = build();
    let base_frames = gp.frames_used();
    assert_eq!(base_frames, written.len() as u64 + D_PAGES);
    // The parent is itself a fork child: its VMAs of block A and B carry
    // two-entry chains, and it rewrites half of A (its own copies).
    let parent = gp.fork().unwrap();
    for &a in written.iter().filter(|&&a| a < B).step_by(2) {
        if parent
            .vmas()
            .iter()
            .any(|v| v.start <= a && a < v.end && v.prot == RW)
        {
            parent.write(a, &[tag(a, 1)]).unwrap();
        }
    }
    let frames_before = parent.frames_used();
    let locks_before = parent.stats().anon_vma_lock;

    let child = parent.fork().unwrap();

    // Layout, map count and anon_vma state are the parent's.
    assert_eq!(child.vmas(), parent.vmas());
    assert_eq!(child.maps(), parent.maps());
    assert_eq!(child.map_count(), parent.map_count());
    assert_eq!(parent.frames_used(), frames_before, "fork copied a frame");
    // One family lock per run of VMAs of one family: block A is one run,
    // each B mapping is one (not one per VMA: A alone has 1200 VMAs).
    let locks = parent.stats().anon_vma_lock - locks_before;
    assert!(locks <= 1 + B_MAPS, "{locks} family lock acquisitions");

    // Every page reads the same on both sides, and private pages with a
    // frame share it (the same frame, write-protected on both sides).
    for v in parent.vmas() {
        for a in (v.start..v.end).step_by(PAGE as usize) {
            assert_eq!(byte(&child, a), byte(&parent, a), "{a:#x}");
            assert_eq!(child.translate(a), parent.translate(a), "{a:#x}");
        }
    }
    // The reverse map of each written private page: the three spaces at
    // the same address.
    let ids = [gp.id(), parent.id(), child.id()];
    for &a in &written {
        if a >= D {
            continue;
        }
        let want: BTreeSet<_> = ids.iter().map(|&id| (id, a)).collect();
        assert_eq!(mm_ids(&child, a), want, "{a:#x}");
        assert_eq!(mm_ids(&parent, a), want, "{a:#x}");
    }
    // Zero-page and shared VMAs have no reverse map.
    assert!(child.rmap_walk(C).is_empty());
    assert!(child.rmap_walk(D).is_empty());

    // Both sides write every private read-write page: each gets its own
    // copy (or keeps the frame it holds alone), nothing leaks across.
    let rw = writable_private(&parent);
    assert_eq!(rw, writable_private(&child));
    for &a in &rw {
        child.write(a, &[tag(a, 2)]).unwrap();
        parent.write(a, &[tag(a, 3)]).unwrap();
    }
    for &a in &rw {
        assert_eq!(byte(&child, a), tag(a, 2), "{a:#x}");
        assert_eq!(byte(&parent, a), tag(a, 3), "{a:#x}");
        let g = if written.contains(&a) { tag(a, 0) } else { 0 };
        assert_eq!(byte(&gp, a), g, "{a:#x}");
        assert_ne!(child.translate(a), parent.translate(a));
    }
    // Shared pages are shared by all three.
    child.write(D, b"s").unwrap();
    assert_eq!(byte(&gp, D), b's');

    // Frame accounting is exact: dropping each side gives back exactly
    // the frames it alone held, and nothing is left at the end.
    let with_child = parent.frames_used();
    let child_own = rw.len() as u64;
    drop(child);
    assert_eq!(parent.frames_used(), with_child - child_own);
    drop(parent);
    assert_eq!(gp.frames_used(), base_frames);
    drop(gp);
}

#[test]
fn a_bulk_fork_of_an_empty_and_of_a_sparse_space() {
    let mm = AddressSpace::new(Config::default());
    let child = mm.fork().unwrap();
    assert!(child.vmas().is_empty());
    assert_eq!(child.map_count(), 0);
    // One page at each end of the task: the copy skips everything between.
    let top = mm.config().task_size - PAGE;
    let low = 0x10_0000;
    mm.mmap(low, PAGE, RW, FIXED).unwrap();
    mm.mmap(top, PAGE, RW, FIXED).unwrap();
    mm.write(low, b"l").unwrap();
    mm.write(top, b"t").unwrap();
    let child = mm.fork().unwrap();
    assert_eq!(child.vmas(), mm.vmas());
    assert_eq!(byte(&child, low), b'l');
    assert_eq!(byte(&child, top), b't');
    assert_eq!(mm.frames_used(), 2);
    child.write(top, b"T").unwrap();
    assert_eq!(byte(&mm, top), b't');
    assert_eq!(mm.frames_used(), 3);
    drop(child);
    assert_eq!(mm.frames_used(), 2);
}
