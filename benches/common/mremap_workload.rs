//! The mremap-heavy workload shared by `examples/mremap.rs` and
//! `benches/mremap.rs`, in the shape of the customer load behind Linux's
//! "mremap: Increase LATENCY_LIMIT of mremap to reduce the number of TLB
//! shootdowns": threads of one process move populated ranges back and
//! forth (MAYMOVE|FIXED between two places) thousands of times a second,
//! mostly 1-16 pages, some 64-1024 pages, checking the data as they go.
#![allow(dead_code)] // each includer uses part of it

#[path = "../../tests/common/rng.rs"]
mod rng;

use aspace::{AddressSpace, Config, MapFlags, MremapExtent, MremapFlags, Prot, Stats, PAGE_SIZE};
use rng::XorShift;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// 2 MiB.
pub const PMD: u64 = 2 << 20;
/// Where thread `t`'s ranges live: 1 GiB each, far from mmap_base.
const AREA: u64 = 0x1000_0000_0000;
/// Large ranges each thread owns (pages); the small ones are 1..=16 pages.
pub const LARGE_PAGES: [u64; 4] = [64, 200, 512, 1024];
/// Small ranges per thread (sizes 1..=16 pages, so 3 of 4 ops are small).
const SMALL: u64 = 12;

/// How a run ends.
#[derive(Clone, Copy, Debug)]
pub enum Stop {
    /// After this long.
    Time(Duration),
    /// After this many mremaps per thread.
    Ops(u64),
}

/// One run's parameters.
#[derive(Clone, Copy, Debug)]
pub struct Params {
    /// Worker threads (each one a CPU of the shared address space).
    pub threads: usize,
    /// How mremap moves entries and flushes.
    pub mode: MremapExtent,
    /// Simulated cost of a shootdown (ns per target CPU).
    pub cost_ns: u64,
    /// When to stop.
    pub stop: Stop,
}

/// What one run measured.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sample {
    /// mremap calls, all threads.
    pub ops: u64,
    /// Seconds from the start barrier to the last thread's end.
    pub wall: f64,
    /// Counter deltas over the measured phase.
    pub stats: Stats,
}

impl Sample {
    /// mremap calls per second.
    pub fn ops_per_sec(&self) -> f64 {
        self.ops as f64 / self.wall.max(1e-9)
    }

    /// TLB flushes per mremap.
    pub fn flushes_per_op(&self) -> f64 {
        self.stats.tlb_flushes as f64 / self.ops.max(1) as f64
    }

    /// Shootdowns per mremap.
    pub fn shootdowns_per_op(&self) -> f64 {
        self.stats.tlb_shootdowns as f64 / self.ops.max(1) as f64
    }
}

/// The name the example and the bench print for a mode.
pub fn mode_name(m: MremapExtent) -> String {
    match m {
        MremapExtent::Pages(64) => "pages64".into(),
        MremapExtent::Pages(n) => format!("pages{n}"),
        MremapExtent::Pmd => "pmd".into(),
        MremapExtent::Batched => "batched".into(),
    }
}

/// The three modes, in the order they are printed.
pub const MODES: [MremapExtent; 3] = [
    MremapExtent::Pages(64),
    MremapExtent::Pmd,
    MremapExtent::Batched,
];

fn rw() -> Prot {
    Prot::READ | Prot::WRITE
}

fn fixed() -> MapFlags {
    MapFlags::PRIVATE | MapFlags::ANONYMOUS | MapFlags::FIXED
}

/// The word stored at the start of page `p` of range `r` of thread `t`.
fn stamp(t: usize, r: usize, p: u64) -> u64 {
    ((t as u64) << 48) | ((r as u64) << 32) | p
}

struct Range {
    pages: u64,
    places: [u64; 2],
    at: usize,
}

/// Thread `t`'s ranges: 12 small, then the large ones. Each has two
/// places 8 MiB apart inside its own 16 MiB window; odd ranges' second
/// place is 3 pages off the PMD grid, so moves both relink and copy.
fn ranges(t: usize) -> Vec<Range> {
    let sizes = (0..SMALL).map(|i| 1 + (i * 5) % 16).chain(LARGE_PAGES);
    sizes
        .enumerate()
        .map(|(i, pages)| {
            let win = AREA + ((t as u64) << 30) + (i as u64) * 8 * PMD;
            let skew = if i % 2 == 1 { 3 * PAGE_SIZE } else { 0 };
            Range {
                pages,
                places: [win, win + 4 * PMD + skew],
                at: 0,
            }
        })
        .collect()
}

/// Runs the workload once on a fresh address space.
pub fn run(p: Params) -> Sample {
    let mm = Arc::new(AddressSpace::new(Config {
        mremap_extent: p.mode,
        shootdown_cost_ns: p.cost_ns,
        memory_budget: 1 << 30,
        ..Config::default()
    }));
    let ready = Arc::new(Barrier::new(p.threads + 1));
    let go = Arc::new(Barrier::new(p.threads + 1));
    let stop = Arc::new(AtomicBool::new(false));
    let hs: Vec<_> = (0..p.threads)
        .map(|t| {
            let (mm, ready, go, stop) = (mm.clone(), ready.clone(), go.clone(), stop.clone());
            std::thread::spawn(move || {
                // Set up in the worker, so that only workers are CPUs of
                // the address space.
                let mut rs = ranges(t);
                for (i, r) in rs.iter().enumerate() {
                    mm.mmap(r.places[0], r.pages * PAGE_SIZE, rw(), fixed())
                        .expect("mmap");
                    for pg in 0..r.pages {
                        let a = r.places[0] + pg * PAGE_SIZE;
                        mm.write(a, &stamp(t, i, pg).to_le_bytes()).expect("write");
                    }
                }
                ready.wait();
                go.wait();
                let mut rng =
                    XorShift::new(0x9e37_79b9_7f4a_7c15_u64 ^ ((t as u64 + 1) * 0x1234_5678));
                let mut ops = 0u64;
                let mut w = [0u8; 8];
                loop {
                    match p.stop {
                        Stop::Ops(n) if ops >= n => break,
                        Stop::Time(_) if stop.load(Ordering::Relaxed) => break,
                        _ => {}
                    }
                    let i = (rng.next_u64() % rs.len() as u64) as usize;
                    let r = &mut rs[i];
                    let len = r.pages * PAGE_SIZE;
                    let (from, to) = (r.places[r.at], r.places[1 - r.at]);
                    let got = mm.mremap(
                        from,
                        len,
                        len,
                        MremapFlags::MAYMOVE | MremapFlags::FIXED,
                        to,
                    );
                    assert_eq!(got, Ok(to), "mremap");
                    r.at = 1 - r.at;
                    ops += 1;
                    // Check the first, the last and one more page.
                    let mid = rng.next_u64() % r.pages;
                    for pg in [0, r.pages - 1, mid] {
                        mm.read(to + pg * PAGE_SIZE, &mut w).expect("read");
                        assert_eq!(u64::from_le_bytes(w), stamp(t, i, pg), "moved data");
                    }
                }
                ops
            })
        })
        .collect();
    ready.wait();
    let before = mm.stats();
    go.wait();
    let t0 = Instant::now();
    if let Stop::Time(d) = p.stop {
        std::thread::sleep(d);
        stop.store(true, Ordering::Relaxed);
    }
    let ops: u64 = hs.into_iter().map(|h| h.join().expect("worker")).sum();
    let wall = t0.elapsed().as_secs_f64();
    Sample {
        ops,
        wall,
        stats: diff(mm.stats(), before),
    }
}

fn diff(a: Stats, b: Stats) -> Stats {
    Stats {
        tlb_flushes: a.tlb_flushes - b.tlb_flushes,
        tlb_pages_flushed: a.tlb_pages_flushed - b.tlb_pages_flushed,
        tlb_shootdowns: a.tlb_shootdowns - b.tlb_shootdowns,
        mremap_ptes_moved: a.mremap_ptes_moved - b.mremap_ptes_moved,
        mremap_tables_relinked: a.mremap_tables_relinked - b.mremap_tables_relinked,
        ..Stats::default()
    }
}

/// Flushes of one MAYMOVE|FIXED move of `pages` populated pages from a
/// PMD-aligned place to one `skew` pages past a PMD boundary.
pub fn flushes_for_move(mode: MremapExtent, pages: u64, skew: u64) -> u64 {
    let mm = AddressSpace::new(Config {
        mremap_extent: mode,
        ..Config::default()
    });
    let (a, b) = (AREA, AREA + (1 << 30) + skew * PAGE_SIZE);
    let len = pages * PAGE_SIZE;
    mm.mmap(a, len, rw(), fixed() | MapFlags::POPULATE)
        .expect("mmap");
    let before = mm.stats().tlb_flushes;
    mm.mremap(a, len, len, MremapFlags::MAYMOVE | MremapFlags::FIXED, b)
        .expect("mremap");
    mm.stats().tlb_flushes - before
}

/// A populated mapping moving back and forth between two PMD-aligned
/// places (MAYMOVE|FIXED).
pub struct Mover {
    mm: AddressSpace,
    places: [u64; 2],
    at: usize,
    len: u64,
}

impl Mover {
    /// Maps and populates (writes) `len` bytes.
    pub fn new(mode: MremapExtent, len: u64) -> Mover {
        let mm = AddressSpace::new(Config {
            mremap_extent: mode,
            memory_budget: len + (64 << 20),
            ..Config::default()
        });
        let places = [AREA, AREA + (4 << 30)];
        mm.prefault_frames(len);
        mm.mmap(places[0], len, rw(), fixed() | MapFlags::POPULATE)
            .expect("mmap");
        Mover {
            mm,
            places,
            at: 0,
            len,
        }
    }

    /// Moves the mapping to its other place; returns how long it took.
    pub fn step(&mut self) -> Duration {
        let (from, to) = (self.places[self.at], self.places[1 - self.at]);
        let t = Instant::now();
        self.mm
            .mremap(
                from,
                self.len,
                self.len,
                MremapFlags::MAYMOVE | MremapFlags::FIXED,
                to,
            )
            .expect("mremap");
        let d = t.elapsed();
        self.at = 1 - self.at;
        d
    }
}

/// The median time of one move of a populated `len`-byte mapping, over
/// `moves` moves back and forth.
pub fn median_move_time(mode: MremapExtent, len: u64, moves: usize) -> Duration {
    let mut m = Mover::new(mode, len);
    let mut times: Vec<Duration> = (0..moves.max(1)).map(|_| m.step()).collect();
    times.sort();
    times[times.len() / 2]
}
