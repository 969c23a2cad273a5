//! The vmalloc workload shared by `examples/vmalloc.rs` and
//! `benches/vmalloc.rs`: `jobs` threads each do alloc/free pairs.
#![allow(dead_code)]

#[path = "../../tests/common/rng.rs"]
mod rng;

use aspace::vmap::{Mode, Vmap, VmapConfig};
use rng::XorShift;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// Sizes of the pairs.
#[derive(Clone, Copy, Debug)]
pub enum Sizes {
    /// One page each.
    OnePage,
    /// 1 to 64 pages, random.
    Random64,
}

/// Runs `jobs` threads of `pairs` alloc/free pairs each on a fresh
/// allocator; returns the wall time of the measured phase.
pub fn run(mode: Mode, jobs: usize, pairs: u64, sizes: Sizes) -> Duration {
    let v = Arc::new(
        Vmap::new(VmapConfig {
            mode,
            ..VmapConfig::default()
        })
        .expect("default vmap config"),
    );
    let start = Arc::new(Barrier::new(jobs + 1));
    let hs: Vec<_> = (0..jobs)
        .map(|j| {
            let (v, start) = (v.clone(), start.clone());
            std::thread::spawn(move || {
                let mut rng = XorShift::new(0x9e37_79b9_7f4a_7c15u64 ^ (j as u64 + 1));
                start.wait();
                for _ in 0..pairs {
                    let x = rng.next_u64();
                    let pages = match sizes {
                        Sizes::OnePage => 1,
                        Sizes::Random64 => 1 + x % 64,
                    };
                    let r = v.alloc(pages * 4096, 4096).expect("vmalloc");
                    v.free(r).expect("vfree");
                }
            })
        })
        .collect();
    start.wait();
    let t0 = Instant::now();
    for h in hs {
        h.join().expect("job");
    }
    t0.elapsed()
}
