//! vmalloc/vfree pairs per job, GlobalLock against PerCpu zones, in the
//! shape of the "Mitigate a vmap lock contention" cover letter.
//!
//! `cargo run --release --example vmalloc -- [--jobs 1,2] [--pairs N]`

#[path = "../benches/common/vmalloc_workload.rs"]
mod vmalloc_workload;

use aspace::vmap::Mode;
use vmalloc_workload::{run, Sizes};

fn main() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut jobs: Vec<usize> = (1..=cores).collect();
    let mut pairs = 200_000u64;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--jobs" => {
                jobs = args
                    .next()
                    .and_then(|s| {
                        s.split(',')
                            .map(|x| x.trim().parse().ok().filter(|&n: &usize| n > 0))
                            .collect()
                    })
                    .unwrap_or_else(|| usage())
            }
            "--pairs" => {
                pairs = args
                    .next()
                    .and_then(|s| s.parse().ok())
                    .filter(|&n| n > 0)
                    .unwrap_or_else(|| usage())
            }
            _ => usage(),
        }
    }
    println!("vmalloc on {cores} cores, {pairs} alloc/free pairs per job");
    for (name, sizes) in [("1 page", Sizes::OnePage), ("1..64 pages", Sizes::Random64)] {
        println!("\n{name}: usec per vmalloc/vfree pair, GlobalLock vs PerCpu");
        for &j in &jobs {
            let per_pair = |mode| run(mode, j, pairs, sizes).as_secs_f64() * 1e6 / pairs as f64;
            let g = per_pair(Mode::GlobalLock);
            let p = per_pair(Mode::PerCpu);
            println!("{j:>3} {g:>8.2} vs {p:>8.2}");
        }
    }
}

fn usage() -> ! {
    eprintln!("usage: vmalloc [--jobs 1,2,4] [--pairs N]");
    std::process::exit(2)
}
