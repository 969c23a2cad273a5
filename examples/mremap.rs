//! mremap-heavy workload: TLB flushes and shootdowns by extent mode, in
//! the shape of the Linux commit "mremap: Increase LATENCY_LIMIT of mremap
//! to reduce the number of TLB shootdowns".
//!
//! ```text
//! cargo run --release --example mremap -- [--threads 1,2,4] [--secs S]
//!     [--reps N] [--cost-ns N] [--no-big]
//! ```
//!
//! N threads share one address space; each moves its populated ranges
//! (mostly 1-16 pages, some 64-1024 pages) back and forth between two
//! places with MAYMOVE|FIXED, checking data after every move. One row per
//! thread count and mode (`pages64` = `MremapExtent::Pages(64)`, `pmd`,
//! `batched` = the default), then the commit's `NNN: Metric: X` lines per
//! mode (X = thousand mremaps per second, higher is better). `--cost-ns`
//! turns on the shootdown cost model (a flush spins N ns per other CPU).
//! Last, the flushes of one 2 MiB move per mode and the median time of a
//! populated, 2 MiB-aligned 1 GiB move against a one-page move.

#[path = "../benches/common/machine.rs"]
mod machine;
#[path = "../benches/common/mremap_workload.rs"]
mod mremap_workload;

use aspace::{MremapExtent, PAGE_SIZE};
use machine::{hmean, machine, parse_arg, parse_threads, thread_counts};
use mremap_workload::{
    flushes_for_move, median_move_time, mode_name, run, Params, Sample, Stop, MODES,
};
use std::io::Write as _;
use std::time::Duration;

struct Args {
    threads: Vec<usize>,
    secs: f64,
    reps: usize,
    cost_ns: u64,
    big: bool,
}

fn usage() -> ! {
    eprintln!("usage: mremap [--threads 1,2,4] [--secs S] [--reps N] [--cost-ns N] [--no-big]");
    std::process::exit(2)
}

fn parse() -> Args {
    let mut a = Args {
        threads: thread_counts(),
        secs: 1.5,
        reps: 1,
        cost_ns: 0,
        big: true,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = || it.next().unwrap_or_else(|| usage());
        match arg.as_str() {
            "--threads" => a.threads = parse_threads(&val()).unwrap_or_else(|| usage()),
            "--secs" => {
                a.secs =
                    parse_arg(&val(), |&s: &f64| s > 0.0 && s < 3600.0).unwrap_or_else(|| usage())
            }
            "--reps" => a.reps = parse_arg(&val(), |&n: &usize| n > 0).unwrap_or_else(|| usage()),
            "--cost-ns" => {
                a.cost_ns = parse_arg(&val(), |&n: &u64| n <= 1_000_000).unwrap_or_else(|| usage())
            }
            "--no-big" => a.big = false,
            _ => usage(),
        }
    }
    a
}

fn main() {
    let a = parse();
    println!(
        "mremap on {} ({} s per row, {} reps, shootdown cost {} ns per target CPU)",
        machine(),
        a.secs,
        a.reps,
        a.cost_ns
    );
    // ops/sec (harmonic mean over reps) per mode, per thread count.
    let mut metric: Vec<Vec<(usize, f64)>> = vec![Vec::new(); MODES.len()];
    let mut rows = Vec::new();
    for &threads in &a.threads {
        let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); MODES.len()];
        for rep in 0..a.reps {
            // Alternate the modes so drift hits all alike.
            for (m, &mode) in MODES.iter().enumerate() {
                eprint!(
                    "\r{threads} threads, rep {}/{}, {}        ",
                    rep + 1,
                    a.reps,
                    mode_name(mode)
                );
                let _ = std::io::stderr().flush();
                samples[m].push(run(Params {
                    threads,
                    mode,
                    cost_ns: a.cost_ns,
                    stop: Stop::Time(Duration::from_secs_f64(a.secs)),
                }));
            }
        }
        for (m, &mode) in MODES.iter().enumerate() {
            let s = &samples[m];
            let ops: Vec<f64> = s.iter().map(Sample::ops_per_sec).collect();
            let total_ops: u64 = s.iter().map(|x| x.ops).sum();
            let fl: u64 = s.iter().map(|x| x.stats.tlb_flushes).sum();
            let sd: u64 = s.iter().map(|x| x.stats.tlb_shootdowns).sum();
            let ops_s = hmean(&ops);
            metric[m].push((threads, ops_s));
            rows.push((
                threads,
                mode,
                ops_s,
                fl as f64 / total_ops.max(1) as f64,
                sd as f64 / total_ops.max(1) as f64,
            ));
        }
    }
    eprint!("\r{:60}\r", "");
    println!(
        "\n{:>7} {:<8} {:>12} {:>11} {:>14}",
        "threads", "mode", "ops/sec", "flushes/op", "shootdowns/op"
    );
    for (threads, mode, ops, fl, sd) in &rows {
        println!(
            "{:>7} {:<8} {:>12.0} {:>11.3} {:>14.3}",
            threads,
            mode_name(*mode),
            ops,
            fl,
            sd
        );
    }
    for (m, &mode) in MODES.iter().enumerate() {
        println!(
            "\n{} (Metric: thousand mremaps/sec, higher is better)",
            mode_name(mode)
        );
        for &(t, ops) in &metric[m] {
            println!("{t:03}:  Metric: {:>12.2}", ops / 1000.0);
        }
    }
    println!();
    for (i, &(t, _)) in metric[0].iter().enumerate() {
        let base = metric[0][i].1;
        println!(
            "{t} threads: pmd {:.2}x, batched {:.2}x the ops/sec of pages64",
            metric[1][i].1 / base,
            metric[2][i].1 / base
        );
    }
    println!();
    for (skew, what) in [(0, "2 MiB-aligned"), (1, "destination 1 page off")] {
        let f: Vec<u64> = MODES
            .iter()
            .map(|&m| flushes_for_move(m, 512, skew))
            .collect();
        println!(
            "flushes for one populated 2 MiB move, {what}: pages64 {}, pmd {}, batched {} \
             (pmd makes {:.1}x fewer than pages64)",
            f[0],
            f[1],
            f[2],
            f[0] as f64 / f[1].max(1) as f64
        );
    }
    if a.big {
        println!("\nmedian time of one MAYMOVE|FIXED move of a populated, 2 MiB-aligned mapping:");
        for mode in [
            MremapExtent::Batched,
            MremapExtent::Pmd,
            MremapExtent::Pages(64),
        ] {
            let small = median_move_time(mode, PAGE_SIZE, 2001);
            let moves = if mode == MremapExtent::Pages(64) {
                5
            } else {
                41
            };
            let big = median_move_time(mode, 1 << 30, moves);
            println!(
                "  {:<8} 1 GiB {:>10.1} us, 1 page {:>6.2} us: {:>7.0}x",
                mode_name(mode),
                big.as_secs_f64() * 1e6,
                small.as_secs_f64() * 1e6,
                big.as_secs_f64() / small.as_secs_f64().max(1e-9)
            );
        }
    }
}
