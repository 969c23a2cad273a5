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
//! takes the lock zero times. `./loom.sh rmap` runs it.
#![cfg(aspace_loom)]

use aspace::{AddressSpace, Config, PAGE_SIZE};
use loom::sync::Arc;
use loom::thread;

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(
        std::env::var("LOOM_MAX_PREEMPTIONS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(2)
            .min(2),
    );
    b.max_branches = 50_000;
    b.check(f);
}

fn cfg() -> Config {
    Config {
        deferred_reclaim: true,
        memory_budget: 64 * PAGE_SIZE,
        ..Config::default()
    }
}

/// Parent and child with a two-page heap, both pages written in the
/// parent (so shared copy-on-write with the child).
fn family() -> (AddressSpace, Arc<AddressSpace>, u64) {
    let mm = AddressSpace::new(cfg());
    let base = mm.brk(0).unwrap();
    mm.brk(base + 2 * PAGE_SIZE).unwrap();
    mm.write(base, &[1]).unwrap();
    mm.write(base + PAGE_SIZE, &[2]).unwrap();
    let child = Arc::new(mm.fork().unwrap());
    (mm, child, base)
}

fn check_walk(mm: &AddressSpace, child: &AddressSpace, base: u64, moving_in_child: bool) {
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
    if child_hits == 1 {
        assert!(moving_in_child);
    }
    assert!(hits.iter().all(|h| h.addr == base + PAGE_SIZE));
}

/// brk shrinks the child's heap by one page while the parent walks.
#[test]
fn rmap_walk_vs_brk_shrink() {
    model(|| {
        let (mm, child, base) = family();
        let c2 = child.clone();
        let locks = child.stats().anon_vma_lock;
        let t = thread::spawn(move || {
            assert_eq!(c2.brk(base + PAGE_SIZE).unwrap(), base + PAGE_SIZE);
        });
        check_walk(&mm, &child, base, true);
        t.join().unwrap();
        assert_eq!(child.stats().anon_vma_lock, locks, "brk took the lock");
        // After the move the child no longer covers the page.
        let hits = mm.rmap_walk(base + PAGE_SIZE);
        assert_eq!(hits.len(), 1);
        // The child's reference to the shared frame went with the shrink.
        assert_eq!(mm.frames_used(), 2);
    });
}

/// brk grows the child's heap by one page while the parent walks a page
/// the child's heap then newly covers.
#[test]
fn rmap_walk_vs_brk_grow() {
    model(|| {
        let (mm, child, base) = family();
        // Start the child one page short, so a grow brings the page back.
        child.brk(base + PAGE_SIZE).unwrap();
        let c2 = child.clone();
        let locks = child.stats().anon_vma_lock;
        let t = thread::spawn(move || {
            assert_eq!(c2.brk(base + 2 * PAGE_SIZE).unwrap(), base + 2 * PAGE_SIZE);
        });
        check_walk(&mm, &child, base, true);
        t.join().unwrap();
        assert_eq!(child.stats().anon_vma_lock, locks, "brk took the lock");
        assert_eq!(mm.rmap_walk(base + PAGE_SIZE).len(), 2);
        // The regained page reads zero in the child, the parent keeps its.
        let mut b = [9u8];
        child.read(base + PAGE_SIZE, &mut b).unwrap();
        assert_eq!(b, [0]);
        mm.read(base + PAGE_SIZE, &mut b).unwrap();
        assert_eq!(b, [2]);
    });
}
