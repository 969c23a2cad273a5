//! aim7brk: the AIM7 sbrk pattern behind "mmap: avoid unnecessary anon_vma
//! lock acquisition in vma_adjust()". A parent forks K children sharing
//! one anon_vma root; each child (its own thread) grows its heap with brk,
//! touches the new pages and shrinks it again. Prints jobs/min and the
//! anon_vma lock acquisitions and contended acquisitions with the brk fast
//! path off (lock on every end move, Linux since 2012) and on (Linux
//! 2009-2012), side by side.
//!
//! ```text
//! cargo run --release --example aim7brk -- [--children 1,2,4] [--secs S]
//!     [--reps N] [--grow PAGES]
//! ```
//!
//! Defaults: children 1, 2, 4, ... up to the core count; 2 s per run;
//! 3 repetitions (the harmonic mean of jobs/min is printed, with the range
//! of the per-repetition on/off ratios); 4 pages per job (at most 4096).
//! The two modes alternate run by run, so a slow stretch of a shared
//! machine hits both. The default run takes about 2 x 3 x 2 s per row.

#[path = "../benches/common/brk_workload.rs"]
mod brk_workload;
#[path = "../benches/common/machine.rs"]
mod machine;

use brk_workload::{run, Params, Sample};
use machine::{hmean, thread_counts};
use std::time::Duration;

struct Args {
    children: Vec<usize>,
    secs: f64,
    reps: usize,
    grow: u64,
}

fn usage() -> ! {
    eprintln!("usage: aim7brk [--children 1,2,4] [--secs S] [--reps N] [--grow PAGES]");
    std::process::exit(2)
}

fn parse() -> Args {
    let mut a = Args {
        children: thread_counts(),
        secs: 2.0,
        reps: 3,
        grow: 4,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = || it.next().unwrap_or_else(|| usage());
        match arg.as_str() {
            "--children" => {
                a.children = val()
                    .split(',')
                    .map(|s| s.trim().parse().unwrap_or_else(|_| usage()))
                    .collect();
                if a.children.is_empty() || a.children.contains(&0) {
                    usage();
                }
            }
            "--secs" => a.secs = val().parse().unwrap_or_else(|_| usage()),
            "--reps" => a.reps = val().parse().unwrap_or_else(|_| usage()),
            "--grow" => a.grow = val().parse().unwrap_or_else(|_| usage()),
            "-h" | "--help" => usage(),
            _ => usage(),
        }
    }
    // Bounds keep every run inside the default 4 GiB frame budget and
    // Duration's range.
    if !a.secs.is_finite()
        || a.secs <= 0.0
        || a.secs > 3600.0
        || a.reps == 0
        || a.grow == 0
        || a.grow > 4096
        || a.children.iter().any(|&k| k > 256)
    {
        usage();
    }
    a
}

/// One mode's repetitions in a row of the table: each run's jobs/min and
/// the summed counts.
#[derive(Default)]
struct Cell {
    rates: Vec<f64>,
    total: Sample,
}

impl Cell {
    fn add(&mut self, s: &Sample) {
        self.rates.push(s.jobs_per_min().max(1e-9));
        self.total.jobs += s.jobs;
        self.total.elapsed += s.elapsed;
        self.total.lock += s.lock;
        self.total.contended += s.contended;
    }

    /// Harmonic mean of jobs/min over the repetitions.
    fn jobs_per_min(&self) -> f64 {
        hmean(&self.rates)
    }
}

/// Runs the repetitions of both modes interleaved (off, on, off, on, ...)
/// so that a slow stretch of a shared machine hits both alike. Returns the
/// off and on cells.
fn measure(args: &Args, children: usize) -> (Cell, Cell) {
    let (mut off, mut on) = (Cell::default(), Cell::default());
    for _ in 0..args.reps {
        for fast_path in [false, true] {
            let s = run(&Params {
                children,
                fast_path,
                grow_pages: args.grow,
                heap_pages: 16,
                duration: Some(Duration::from_secs_f64(args.secs)),
                jobs_per_child: None,
            });
            if fast_path { &mut on } else { &mut off }.add(&s);
        }
    }
    (off, on)
}

fn main() {
    let args = parse();
    println!(
        "aim7brk: {} pages per job, {:.1} s x {} reps per cell, off and on interleaved (harmonic mean)",
        args.grow, args.secs, args.reps
    );
    println!(
        "{:>8} | {:>12} {:>10} {:>10} | {:>12} {:>10} {:>10} | {:>7} {:>13}",
        "children",
        "off jobs/min",
        "locks",
        "contended",
        "on jobs/min",
        "locks",
        "contended",
        "on/off",
        "per-rep range"
    );
    for &k in &args.children {
        let (off, on) = measure(&args, k);
        // Each repetition's on/off ratio (its two runs ran back to back).
        let ratios: Vec<f64> = on
            .rates
            .iter()
            .zip(&off.rates)
            .map(|(a, b)| a / b)
            .collect();
        let lo = ratios.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = ratios.iter().copied().fold(0.0, f64::max);
        let range = format!("{lo:.2}-{hi:.2}x");
        println!(
            "{:>8} | {:>12.0} {:>10} {:>10} | {:>12.0} {:>10} {:>10} | {:>6.2}x {:>13}",
            k,
            off.jobs_per_min(),
            off.total.lock,
            off.total.contended,
            on.jobs_per_min(),
            on.total.lock,
            on.total.contended,
            on.jobs_per_min() / off.jobs_per_min(),
            range
        );
    }
}
