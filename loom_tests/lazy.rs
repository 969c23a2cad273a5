//! Loom models of objects made on first use (so that creating an address
//! space allocates nothing it does not need): two threads race the first
//! use of a `PerCpu` and of a `LazyArc`. Runs the real code through
//! src/sync.rs. `./loom.sh --test loom_lazy` runs them.
#![cfg(aspace_loom)]

mod common;
use common::model;

use aspace::loom_door::{LazyArc, PerCpu};
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

/// Two threads count in their slot of a `PerCpu` nobody has used yet:
/// both race to allocate the slot array, one array is installed, and
/// both counts are in it.
///
/// Mutation caught: in `PerCpu::install` (src/percpu.rs), publish with a
/// plain store instead of the compare-and-swap
/// (`self.slots.store(new, Ordering::Release); new`): the second array
/// replaces the first, and the count made in the first is lost.
#[test]
fn percpu_first_use_race() {
    model(|| {
        let p = Arc::new(PerCpu::new(|| AtomicUsize::new(0)));
        let p2 = p.clone();
        let t = thread::spawn(move || {
            p2.local().fetch_add(1, Ordering::Relaxed);
        });
        p.local().fetch_add(1, Ordering::Relaxed);
        t.join().unwrap();
        let sum: usize = p.iter().map(|c| c.load(Ordering::Relaxed)).sum();
        assert_eq!(sum, 2);
    });
}

/// Two threads race the first `get` of a `LazyArc` (an address space's
/// VMA pool, a tree's node cache): one value is made and kept, both see
/// it, and the loser's value is released (loom reports a leaked `Arc`).
///
/// Mutation caught: in `LazyArc::install` (src/lazy.rs), publish with a
/// plain store instead of the compare-and-swap
/// (`self.ptr.store(new, Ordering::Release)` then the `Ok` arm): each
/// thread keeps its own value, one count is lost and an `Arc` leaks.
#[test]
fn lazy_arc_first_use_race() {
    model(|| {
        let l = Arc::new(LazyArc::<AtomicUsize>::new());
        let l2 = l.clone();
        let t = thread::spawn(move || {
            l2.get().fetch_add(1, Ordering::Relaxed);
        });
        l.get().fetch_add(1, Ordering::Relaxed);
        t.join().unwrap();
        assert_eq!(l.get().load(Ordering::Relaxed), 2);
    });
}
