//! Many address spaces on one frame pool, as a sandbox or emulator host
//! keeps them: host RSS per space with 4 written pages, and the time to
//! create and drop one.
//!
//! `cargo run --release --example many_spaces [spaces] [--private]`
//! (default 10,000 spaces on one pool; `--private` gives each space a pool
//! of its own, as `AddressSpace::new` does, for comparison).

use aspace::{AddressSpace, Config, FrameAllocator, MapFlags, Prot, PAGE_SIZE};
use std::sync::Arc;
use std::time::Instant;

/// Resident set size of this process, from /proc/self/statm.
fn rss_bytes() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: u64 = s.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// `mm` with 4 pages mapped and written.
fn with_4_pages(mm: AddressSpace, tag: u64) -> AddressSpace {
    let rw = Prot::READ | Prot::WRITE;
    let a = mm
        .mmap(
            0,
            4 * PAGE_SIZE,
            rw,
            MapFlags::PRIVATE | MapFlags::ANONYMOUS,
        )
        .unwrap();
    for p in 0..4 {
        mm.write(a + p * PAGE_SIZE, &tag.to_le_bytes()).unwrap();
    }
    mm
}

/// A space on `pool`.
fn on(pool: &Arc<FrameAllocator>) -> AddressSpace {
    AddressSpace::with_pool(Config::default(), pool.clone())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let private = args.iter().any(|a| a == "--private");
    let n: usize = args
        .iter()
        .find(|a| !a.starts_with("--"))
        .map(|s| s.parse().expect("a number of spaces"))
        .unwrap_or(10_000);
    if private {
        return private_pools(n);
    }
    let pool = Arc::new(FrameAllocator::new(4 << 30, true));

    // Warm up the allocator and the pool so the baseline holds their
    // fixed costs.
    drop(on(&pool));

    // Idle spaces first, kept alive so that the next measurement cannot
    // reuse their memory.
    let rss0 = rss_bytes();
    let idle: Vec<AddressSpace> = (0..n).map(|_| on(&pool)).collect();
    println!(
        "{n} idle spaces: {:.1} KiB of host RSS per space",
        rss_bytes().saturating_sub(rss0) as f64 / n as f64 / 1024.0
    );

    let rss0 = rss_bytes();
    let charged0 = pool.memory().used();
    let mut spaces = Vec::with_capacity(n);
    for i in 0..n {
        spaces.push(with_4_pages(on(&pool), i as u64));
    }
    let rss = rss_bytes() - rss0;
    println!(
        "{n} spaces with 4 written pages each: {:.1} KiB of host RSS per space (target <= 64 KiB; Linux ~32 KiB), {} KiB charged to the pool per space",
        rss as f64 / n as f64 / 1024.0,
        (pool.memory().used() - charged0) / n as u64 / 1024
    );
    drop(spaces);
    drop(idle);
    assert_eq!(pool.used(), 0);

    // Create + drop, empty and with 4 written pages.
    let reps = n.max(1);
    let t = Instant::now();
    for _ in 0..reps {
        drop(on(&pool));
    }
    let empty = t.elapsed().as_secs_f64() * 1e6 / reps as f64;
    let t = Instant::now();
    for i in 0..reps {
        drop(with_4_pages(on(&pool), i as u64));
    }
    let written = t.elapsed().as_secs_f64() * 1e6 / reps as f64;
    println!(
        "create + drop: {empty:.1} us empty, {written:.1} us with 4 written pages (target < 100 us)"
    );
}

/// Spaces made with `AddressSpace::new`: each has a pool of its own.
fn private_pools(n: usize) {
    let rss0 = rss_bytes();
    let idle: Vec<AddressSpace> = (0..n)
        .map(|_| AddressSpace::new(Config::default()))
        .collect();
    let rss1 = rss_bytes();
    let written: Vec<AddressSpace> = (0..n)
        .map(|i| with_4_pages(AddressSpace::new(Config::default()), i as u64))
        .collect();
    let rss2 = rss_bytes();
    println!(
        "private pools: {:.1} KiB of host RSS per idle space, {:.1} KiB per space with 4 written pages",
        (rss1 - rss0) as f64 / n as f64 / 1024.0,
        (rss2 - rss1) as f64 / n as f64 / 1024.0
    );
    drop((idle, written));
}
