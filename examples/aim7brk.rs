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
//! 3 repetitions (the harmonic mean of jobs/min is printed); 4 pages per
//! job (at most 4096). The default run takes about 2 x 3 x 2 s per row.

#[path = "../benches/common/brk_workload.rs"]
mod brk_workload;
#[path = "../benches/common/machine.rs"]
mod machine;

use brk_workload::{run, Params, Sample};
use machine::thread_counts;
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

/// Harmonic mean of jobs/min over the repetitions, and the summed counts.
fn measure(args: &Args, children: usize, fast_path: bool) -> (f64, Sample) {
    let mut inv = 0.0;
    let mut total = Sample::default();
    for _ in 0..args.reps {
        let s = run(&Params {
            children,
            fast_path,
            grow_pages: args.grow,
            heap_pages: 16,
            duration: Some(Duration::from_secs_f64(args.secs)),
            jobs_per_child: None,
        });
        inv += 1.0 / s.jobs_per_min().max(1e-9);
        total.jobs += s.jobs;
        total.elapsed += s.elapsed;
        total.lock += s.lock;
        total.contended += s.contended;
    }
    (args.reps as f64 / inv, total)
}

fn main() {
    let args = parse();
    println!(
        "aim7brk: {} pages per job, {:.1} s x {} reps per cell (harmonic mean)",
        args.grow, args.secs, args.reps
    );
    println!(
        "{:>8} | {:>12} {:>10} {:>10} | {:>12} {:>10} {:>10} | {:>7}",
        "children",
        "off jobs/min",
        "locks",
        "contended",
        "on jobs/min",
        "locks",
        "contended",
        "on/off"
    );
    for &k in &args.children {
        let (off, so) = measure(&args, k, false);
        let (on, sn) = measure(&args, k, true);
        println!(
            "{:>8} | {:>12.0} {:>10} {:>10} | {:>12.0} {:>10} {:>10} | {:>6.2}x",
            k,
            off,
            so.lock,
            so.contended,
            on,
            sn.lock,
            sn.contended,
            on / off
        );
    }
}
