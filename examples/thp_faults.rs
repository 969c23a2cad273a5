//! Faulting in anonymous memory with and without transparent huge pages:
//! one byte stored through a translator into every 4 KiB page of a fresh
//! 2 MiB-aligned mapping, `MADV_HUGEPAGE` against `MADV_NOHUGEPAGE`, each
//! on a fresh space over a physical memory of its own made resident
//! first (so neither pays the host's page faults, and neither clears
//! frames: never-used frames are zero). Prints both rates and their ratio,
//! from one run.
//!
//! `cargo run --release --example thp_faults [MiB]` (default 256).

use aspace::{AddressSpace, Advice, Config, FrameAllocator, MapFlags, Prot};
use std::sync::Arc;
use std::time::Instant;

const BASE: u64 = 0x4000_0000;

fn run(mib: u64, advice: Advice) -> (f64, u64) {
    let len = mib << 20;
    // A physical memory of its own, made resident up front: both runs
    // get frames never used before (no clearing) whose host pages exist.
    let pool = Arc::new(FrameAllocator::new(len + (64 << 20), true));
    let mm = AddressSpace::with_pool(Config::default(), pool);
    mm.prefault_frames(len + (32 << 20));
    let f = MapFlags::PRIVATE | MapFlags::ANONYMOUS | MapFlags::FIXED;
    let a = mm.mmap(BASE, len, Prot::READ | Prot::WRITE, f).unwrap();
    mm.madvise(a, len, advice).unwrap();
    let mut t = mm.translator();
    let start = Instant::now();
    for off in (0..len).step_by(4096) {
        t.store::<u8>(a + off, 1).unwrap();
    }
    let secs = start.elapsed().as_secs_f64();
    (len as f64 / secs / 1e9, mm.stats().thp_fault_alloc)
}

fn main() {
    let mib: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(256);
    // Warm-up, then the two side by side.
    run(mib.min(64), Advice::HugePage);
    let (small, _) = run(mib, Advice::NoHugePage);
    let (huge, n) = run(mib, Advice::HugePage);
    println!("{mib} MiB, one store per 4 KiB page, fresh space, frames resident:");
    println!("  4 KiB pages (MADV_NOHUGEPAGE): {small:.2} GB/s");
    println!("  2 MiB pages (MADV_HUGEPAGE):   {huge:.2} GB/s ({n} huge faults)");
    println!("  ratio: {:.1}x", huge / small);
}
