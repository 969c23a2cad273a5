//! Loom models of the range tree: a lock-free reader walking while a
//! writer replaces the node it reads, with the old node reclaimed and its
//! memory reused by the next edit. Runs
//! the real `RangeTree` through src/sync.rs. `./loom.sh --test loom_tree` runs them.
#![cfg(aspace_loom)]

use aspace::reclaim::Reclaimer;
use aspace::tree::RangeTree;
use aspace::Range;
use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::Arc;
use loom::thread;

/// A value that dies with the node holding it: every clone (each node
/// copy) owns a fresh liveness flag, cleared when that copy is dropped. A
/// reader that reaches a freed node reads a dead (or destroyed) flag.
struct Canary {
    tag: u64,
    alive: Arc<AtomicBool>,
}

impl Canary {
    fn new(tag: u64) -> Self {
        Canary {
            tag,
            alive: Arc::new(AtomicBool::new(true)),
        }
    }
}

impl Clone for Canary {
    fn clone(&self) -> Self {
        Canary::new(self.tag)
    }
}

impl Drop for Canary {
    fn drop(&mut self) {
        self.alive.store(false, Ordering::SeqCst);
    }
}

fn reader_vs_replace(reclaimer: fn() -> Reclaimer) {
    // Bound and branch limit from the environment (loom.sh).
    let b = loom::model::Builder::new();
    b.check(move || {
        let t = Arc::new(RangeTree::with_reclaimer(reclaimer()));
        t.writer()
            .insert(Range::new(0x1000, 0x3000), Canary::new(1))
            .unwrap();
        let t2 = t.clone();
        let r = thread::spawn(move || {
            let g = t2.pin();
            let (range, v) = t2
                .find(0x2000, &g)
                .expect("the address is mapped before and after");
            assert!(range.contains(0x2000));
            assert!(v.tag == 1 || v.tag == 2);
            assert!(
                v.alive.load(Ordering::SeqCst),
                "reader reached a reclaimed node"
            );
            if v.tag == 2 {
                assert!(
                    range == Range::new(0x1800, 0x3000) || range == Range::new(0x1800, 0x2800),
                    "{range:?}"
                );
            }
        });
        // Replace the leaf: [0x1000, 0x1800) keeps tag 1, the rest is 2.
        t.writer().store(Range::new(0x1800, 0x3000), Canary::new(2));
        // Try hard to reclaim the old leaf while the reader may still
        // hold it: only the reader's pin may keep it alive.
        for _ in 0..3 {
            t.collect();
        }
        // A second edit reuses reclaimed node memory (the tree's node
        // cache): never memory the reader may still be walking.
        t.writer().store(Range::new(0x2800, 0x3000), Canary::new(3));
        r.join().unwrap();
        t.check_invariants().unwrap();
    });
}

#[test]
fn reader_vs_replace_epoch() {
    reader_vs_replace(Reclaimer::epoch);
}

#[test]
fn reader_vs_replace_deferred() {
    reader_vs_replace(Reclaimer::deferred);
}
