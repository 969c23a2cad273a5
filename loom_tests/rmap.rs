//! Loom model of the reverse map against the brk fast path, running the
//! real AddressSpace through src/sync.rs (deferred reclamation).
//!
//! A parent writes its heap and forks; the child's heap is chained to the
//! parent's anon_vma, so both VMAs sit in one family's reverse map. Then a
//! reverse-map walker (from the parent, holding the family's lock) races
//! with the child moving its heap's end with brk, which with the fast path
//! takes no anon_vma lock. The walker must always find both heaps at the
//! stable page, with the right address, and for the page whose coverage
//! moves it may report the child or not (old or new end); the brk itself
//! takes the lock zero times. `./loom.sh --test loom_rmap` runs it.
#![cfg(aspace_loom)]

mod common;
use common::cfg;

use aspace::{AddressSpace, PAGE_SIZE};
use loom::sync::Arc;
use loom::thread;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.max_branches = 50_000;
    let runs = std::sync::Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    b.check(move || {
        counter.fetch_add(1, Relaxed);
        f()
    });
    let n = runs.load(Relaxed);
    eprintln!("loom_rmap: {n} executions explored");
    // Guard against a vacuous model (a single schedule explored).
    assert!(n > 1, "the model explored only one schedule");
}

/// Parent and child with a two-page heap, both pages written in the
/// parent (so shared copy-on-write with the child).
fn family() -> (Arc<AddressSpace>, Arc<AddressSpace>, u64) {
    let mm = Arc::new(AddressSpace::new(cfg()));
    let base = mm.brk(0).unwrap();
    mm.brk(base + 2 * PAGE_SIZE).unwrap();
    mm.write(base, &[1]).unwrap();
    mm.write(base + PAGE_SIZE, &[2]).unwrap();
    let child = Arc::new(mm.fork().unwrap());
    (mm, child, base)
}

/// Per model: executions in which the walker did not see the child at
/// the moving page, and in which it did (both must occur: the race is
/// really explored). One pair per test, as tests run in parallel.
type Seen = [AtomicUsize; 2];
static SHRINK_SEEN: Seen = [AtomicUsize::new(0), AtomicUsize::new(0)];
static GROW_SEEN: Seen = [AtomicUsize::new(0), AtomicUsize::new(0)];

/// Walks from the parent while the child's heap end may be moving.
fn check_walk(mm: &AddressSpace, child: &AddressSpace, base: u64, seen: &Seen) {
    // The stable page: both heaps, same address, never missed.
    let hits = mm.rmap_walk(base);
    assert_eq!(hits.len(), 2, "{hits:?}");
    assert!(hits.iter().any(|h| h.mm_id == mm.id() && h.addr == base));
    assert!(hits.iter().any(|h| h.mm_id == child.id() && h.addr == base));
    // The page at the moving end: the parent always; the child depending
    // on which end the walker read.
    let hits = mm.rmap_walk(base + PAGE_SIZE);
    assert!(hits
        .iter()
        .any(|h| h.mm_id == mm.id() && h.addr == base + PAGE_SIZE));
    let child_hits = hits.iter().filter(|h| h.mm_id == child.id()).count();
    assert!(child_hits <= 1);
    assert!(hits.iter().all(|h| h.addr == base + PAGE_SIZE));
    seen[child_hits].fetch_add(1, Relaxed);
}

/// brk shrinks the child's heap by one page while the parent walks.
fn assert_both_seen(seen: &Seen) {
    let seen: Vec<usize> = seen.iter().map(|c| c.load(Relaxed)).collect();
    assert!(
        seen.iter().all(|&n| n > 0),
        "walker saw only one end: {seen:?}"
    );
}

#[test]
fn rmap_walk_vs_brk_shrink() {
    model(|| {
        let (mm, child, base) = family();
        let locks = child.stats().anon_vma_lock;
        let (m2, c2) = (mm.clone(), child.clone());
        let walker = thread::spawn(move || check_walk(&m2, &c2, base, &SHRINK_SEEN));
        assert_eq!(child.brk(base + PAGE_SIZE).unwrap(), base + PAGE_SIZE);
        walker.join().unwrap();
        assert_eq!(child.stats().anon_vma_lock, locks, "brk took the lock");
        // After the move the child no longer covers the page.
        let hits = mm.rmap_walk(base + PAGE_SIZE);
        assert_eq!(hits.len(), 1);
        // The child's reference to the shared frame went with the shrink.
        assert_eq!(mm.frames_used(), 2);
    });
    assert_both_seen(&SHRINK_SEEN);
}

/// brk grows the child's heap by one page while the parent walks a page
/// the child's heap then newly covers.
#[test]
fn rmap_walk_vs_brk_grow() {
    model(|| {
        let (mm, child, base) = family();
        // Start the child one page short, so a grow brings the page back.
        child.brk(base + PAGE_SIZE).unwrap();
        let locks = child.stats().anon_vma_lock;
        let (m2, c2) = (mm.clone(), child.clone());
        let walker = thread::spawn(move || check_walk(&m2, &c2, base, &GROW_SEEN));
        assert_eq!(
            child.brk(base + 2 * PAGE_SIZE).unwrap(),
            base + 2 * PAGE_SIZE
        );
        walker.join().unwrap();
        assert_eq!(child.stats().anon_vma_lock, locks, "brk took the lock");
        assert_eq!(mm.rmap_walk(base + PAGE_SIZE).len(), 2);
        // The regained page reads zero in the child, the parent keeps its.
        let mut b = [9u8];
        child.read(base + PAGE_SIZE, &mut b).unwrap();
        assert_eq!(b, [0]);
        mm.read(base + PAGE_SIZE, &mut b).unwrap();
        assert_eq!(b, [2]);
    });
    assert_both_seen(&GROW_SEEN);
}
