//! Loom model of the vmap allocator: an allocation that spills into a
//! remote zone races with a free that triggers that zone's lazy purge.
//! Runs the real `Vmap` through src/sync.rs. `./loom.sh --test loom_vmap` runs it.
#![cfg(aspace_loom)]

use aspace::vmap::{AreaState, Mode, Vmap, VmapConfig};
use aspace::{Range, PAGE_SIZE};
use loom::sync::Arc;
use loom::thread;

const BASE: u64 = 0x1000_0000;

#[test]
fn remote_alloc_vs_lazy_purge() {
    // Bound and branch limit from the environment (loom.sh).
    let b = loom::model::Builder::new();
    b.check(|| {
        // Two zones of 2 pages; purge once more than 1 page is lazy.
        let v = Arc::new(
            Vmap::new(VmapConfig {
                window: Range::new(BASE, BASE + 4 * PAGE_SIZE),
                mode: Mode::PerCpu,
                zones: 2,
                lazy_max_bytes: PAGE_SIZE,
            })
            .unwrap(),
        );
        // Fill both zones, then free one page lazily in each.
        let all: Vec<Range> = (0..4).map(|_| v.alloc(PAGE_SIZE, 1).unwrap()).collect();
        v.free(all[0]).unwrap();
        v.free(all[2]).unwrap();
        let v2 = v.clone();
        let last = all[3];
        // This free makes zone 1 pass its threshold and purge.
        let t = thread::spawn(move || v2.free(last).unwrap());
        // This allocation finds no room at home and goes remote, or purges.
        let got = v.alloc(PAGE_SIZE, 1);
        t.join().unwrap();
        if let Ok(r) = got {
            // Never an area that is still busy, and never a lazy one that
            // has not been flushed (it would still be in the tree as Lazy).
            assert!(r != all[1], "handed out a busy page");
            let areas = v.areas();
            assert!(areas.iter().any(|a| a.0 == r && a.1 == AreaState::Busy));
        }
        let areas = v.areas();
        for w in areas.windows(2) {
            assert!(w[0].0.end <= w[1].0.start, "overlap");
        }
    });
}
