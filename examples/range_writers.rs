//! range_writers: writers only, on ranges of their own. Each thread
//! repeatedly maps 1 MiB without a hint, mprotects its middle 256 KiB
//! read-only and unmaps it; no page is touched. Prints rounds per second
//! per thread count with `WriterLocking::MmapLock` (one writer at a time)
//! and `WriterLocking::Range` (writers on disjoint neighbourhoods at once)
//! side by side, and each mode's scaling over its own 1-thread rate.
//!
//! ```text
//! cargo run --release --example range_writers -- [--threads 1,2] [--secs S] [--reps N]
//! ```
//!
//! Defaults: 1 and 2 threads, 1 s per run, 5 repetitions (the median is
//! printed). The modes alternate run by run, so a slow stretch of a shared
//! machine hits both.

use aspace::{AddressSpace, Config, MapFlags, Prot, WriterLocking};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

const MAP: u64 = 1 << 20;
const PROTECT: u64 = 256 << 10;

fn round(mm: &AddressSpace) {
    let rw = Prot::READ | Prot::WRITE;
    let a = mm
        .mmap(0, MAP, rw, MapFlags::PRIVATE | MapFlags::ANONYMOUS)
        .expect("mmap");
    mm.mprotect(a + PROTECT, PROTECT, Prot::READ)
        .expect("mprotect");
    mm.munmap(a, MAP).expect("munmap");
}

/// Rounds per second of `threads` threads for `secs`.
fn run(mode: WriterLocking, threads: usize, secs: f64) -> f64 {
    let mm = Arc::new(AddressSpace::new(Config {
        writer_locking: mode,
        ..Config::default()
    }));
    let stop = Arc::new(AtomicBool::new(false));
    let total = Arc::new(AtomicU64::new(0));
    let start = Arc::new(Barrier::new(threads + 1));
    let hs: Vec<_> = (0..threads)
        .map(|_| {
            let (mm, stop, total, start) = (mm.clone(), stop.clone(), total.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    round(&mm);
                    n += 1;
                }
                total.fetch_add(n, Ordering::Relaxed);
            })
        })
        .collect();
    start.wait();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    for h in hs {
        h.join().unwrap();
    }
    total.load(Ordering::Relaxed) as f64 / t0.elapsed().as_secs_f64()
}

const USAGE: &str = "usage: cargo run --release --example range_writers -- [OPTIONS]

options:
  --threads 1,2   writing thread counts, comma-separated (default: 1,2)
  --secs S        seconds per run (default: 1)
  --reps N        repetitions of every point; the median is printed (default: 5)
  -h, --help      print this help";

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let mut threads = vec![1usize, 2];
    let mut secs = 1.0;
    let mut reps = 5;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--help" || a == "-h" {
            println!("{USAGE}");
            return;
        }
        let parsed = args.next().and_then(|v| match a.as_str() {
            "--threads" => v
                .split(',')
                .map(|t| t.parse().ok().filter(|&n| n > 0))
                .collect::<Option<Vec<usize>>>()
                .map(|t| threads = t),
            "--secs" => v.parse().ok().filter(|&s: &f64| s > 0.0).map(|s| secs = s),
            "--reps" => v.parse().ok().filter(|&n| n > 0).map(|n| reps = n),
            _ => None,
        });
        if parsed.is_none() {
            eprintln!("range_writers: bad option or value at {a}\n\n{USAGE}");
            std::process::exit(2);
        }
    }
    let modes = [WriterLocking::MmapLock, WriterLocking::Range];
    println!(
        "cargo run --release --example range_writers -- --threads {} --secs {secs} --reps {reps}",
        threads
            .iter()
            .map(|t| t.to_string())
            .collect::<Vec<_>>()
            .join(",")
    );
    println!("rounds/s (mmap 1 MiB, mprotect 256 KiB, munmap), median of {reps}");
    println!(
        "{:>7} | {:>12} {:>6} | {:>12} {:>6} | {:>11}",
        "threads", "MmapLock", "scale", "Range", "scale", "Range/Mmap"
    );
    let mut base = [0.0f64; 2];
    for (i, &t) in threads.iter().enumerate() {
        let mut samples = [Vec::new(), Vec::new()];
        for _ in 0..reps {
            for (m, &mode) in modes.iter().enumerate() {
                samples[m].push(run(mode, t, secs));
            }
        }
        let [a, b] = samples.map(median);
        if i == 0 {
            base = [a, b];
        }
        println!(
            "{:>7} | {:>12.0} {:>5.2}x | {:>12.0} {:>5.2}x | {:>10.2}x",
            t,
            a,
            a / base[0],
            b,
            b / base[1],
            b / a
        );
    }
}
