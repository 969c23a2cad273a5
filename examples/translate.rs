//! translate: the soft TLB against `mm.read` and a plain slice, on one
//! and two threads, and what a flush costs with busy translators.
//!
//! ```text
//! cargo run --release --example translate -- [--loads N] [--reps R]
//! ```
//!
//! Prints one table measured in one run: ns per 8-byte load over a hot
//! working set of 64 pages (each load on the next page), the ratios the
//! design targets (translator hit >= 20x `mm.read`, >= 0.3x the plain
//! loop, two threads >= 1.9x one), and the cost of a flush (an mprotect
//! to read-only and back, per flush) with no translators, with translators
//! on two threads (the flusher's own and another, idle or loading), and
//! with translators loading on two threads besides the flusher's; then
//! aligned loads and stores of every width against the u64 ones (target
//! <= 1.3x) and a u32 load+store pair loop against the same loop over a
//! plain `Vec` (target <= 4x). Each figure is the best of R repetitions,
//! but the pair ratio: the median of max(R, 5) alternations of the two
//! loops, each alternation's ratio measured back to back (its range is
//! printed too).

#[path = "../benches/common/machine.rs"]
mod machine;
#[path = "../benches/common/translate_workload.rs"]
mod translate_workload;

use machine::{machine, parse_arg};
use std::time::Instant;
use translate_workload::*;

fn best(reps: usize, mut f: impl FnMut() -> f64) -> f64 {
    (0..reps).map(|_| f()).fold(f64::INFINITY, f64::min)
}

fn main() {
    let mut loads: u64 = 20_000_000;
    let mut reps = 5;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v = args.next().unwrap_or_default();
        match a.as_str() {
            "--loads" => loads = parse_arg(&v, |&n: &u64| n > 0).expect("--loads N"),
            "--reps" => reps = parse_arg(&v, |&n: &usize| n > 0).expect("--reps R"),
            _ => {
                eprintln!("usage: translate [--loads N] [--reps R]");
                std::process::exit(2);
            }
        }
    }
    let mm = setup();
    let s = slice();
    let reads = (loads / 20).max(1);

    let plain_ns = best(reps, || {
        let t = Instant::now();
        plain(&s, loads);
        t.elapsed().as_secs_f64() * 1e9 / loads as f64
    });
    let mut tr = mm.translator();
    translated(&mut tr, WORDS);
    let hit_ns = best(reps, || {
        let t = Instant::now();
        translated(&mut tr, loads);
        t.elapsed().as_secs_f64() * 1e9 / loads as f64
    });
    drop(tr);
    let read_ns = best(reps, || {
        let t = Instant::now();
        mm_read(&mm, reads);
        t.elapsed().as_secs_f64() * 1e9 / reads as f64
    });
    let one = best(reps, || translated_threads(&mm, 1, loads));
    let two = best(reps, || translated_threads(&mm, 2, loads));
    let scaling = 2.0 * one / two;
    // A flush may wait for a translator that the machine descheduled
    // inside an access: fewer repetitions of fewer flushes.
    let pairs = 500;
    let flush = |busy, idle, own| {
        best(reps.min(10), || {
            flush_ns(&mm, Translators { busy, idle, own }, pairs)
        }) / 1e3
    };
    let flushes = [
        ("no translators", flush(0, 0, false)),
        ("translators on 2 threads, both idle", flush(0, 1, true)),
        ("translators on 2 threads, one loading", flush(1, 0, true)),
        ("translators loading on 2 other threads", flush(2, 0, false)),
    ];

    println!(
        "translate: 8-byte loads, 64-page working set; {}",
        machine()
    );
    println!("{:<44} {:>10}", "", "ns/load");
    println!("{:<44} {:>10.2}", "plain loop over &[u64]", plain_ns);
    println!("{:<44} {:>10.2}", "translator hit, 1 thread", hit_ns);
    println!("{:<44} {:>10.2}", "mm.read of 8 bytes", read_ns);
    println!(
        "{:<44} {:>10.2}",
        "translator hit, 2 threads (wall / loads)",
        two * 1e9 / loads as f64
    );
    println!();
    println!("{:<44} {:>10} {:>8}", "ratio", "measured", "target");
    println!(
        "{:<44} {:>9.1}x {:>7}",
        "translator vs mm.read (speedup)",
        read_ns / hit_ns,
        ">= 20x"
    );
    println!(
        "{:<44} {:>9.2}x {:>7}",
        "translator vs plain loop (speed)",
        plain_ns / hit_ns,
        ">= 0.3x"
    );
    println!(
        "{:<44} {:>9.2}x {:>7}",
        "2 threads vs 1 thread (throughput)", scaling, ">= 1.9x"
    );
    println!();
    println!("{:<44} {:>10}", "flush (mprotect, per flush)", "us");
    for (what, us) in flushes {
        println!("{what:<44} {us:>10.2}");
    }
    println!();
    widths(&mm, loads, reps);
}

/// Aligned loads and stores of every width, and load+store pairs against
/// a plain `Vec`.
fn widths(mm: &aspace::AddressSpace, n: u64, reps: usize) {
    let ns = |f: &mut dyn FnMut()| {
        best(reps, || {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e9 / n as f64
        })
    };
    let mut t = mm.translator();
    translated(&mut t, WORDS);
    let mut v = slice();
    let vec_load = ns(&mut || {
        plain(&v, n);
    });
    let vec_store = ns(&mut || plain_stores(&mut v, n));
    let row = |w: &str, load: f64, store: f64| (w.to_string(), load, store);
    let rows = [
        row(
            "u8",
            ns(&mut || {
                loads_of::<u8>(&mut t, n);
            }),
            ns(&mut || stores_of::<u8>(&mut t, n)),
        ),
        row(
            "u16",
            ns(&mut || {
                loads_of::<u16>(&mut t, n);
            }),
            ns(&mut || stores_of::<u16>(&mut t, n)),
        ),
        row(
            "u32",
            ns(&mut || {
                loads_of::<u32>(&mut t, n);
            }),
            ns(&mut || stores_of::<u32>(&mut t, n)),
        ),
        row(
            "u64",
            ns(&mut || {
                loads_of::<u64>(&mut t, n);
            }),
            ns(&mut || stores_of::<u64>(&mut t, n)),
        ),
    ];
    let (l64, s64) = (rows[3].1, rows[3].2);
    println!("aligned accesses by width (ns each; x: vs the u64 one, target <= 1.3x)");
    println!(
        "{:<20} {:>8} {:>7} {:>8} {:>7}",
        "", "load", "x", "store", "x"
    );
    println!(
        "{:<20} {:>8.2} {:>7} {:>8.2} {:>7}",
        "plain Vec<u64>", vec_load, "", vec_store, ""
    );
    for (w, l, s) in &rows {
        println!(
            "{:<20} {:>8.2} {:>6.2}x {:>8.2} {:>6.2}x",
            format!("translator {w}"),
            l,
            l / l64,
            s,
            s / s64
        );
    }
    let mut p = vec![0u32; 2 * WORDS as usize];
    let pair = pair_ratio(&mut p, &mut t, n, reps.max(5));
    println!("{:<44} {:>10}", "u32 load+store pair (ns per pair)", "ns");
    println!("{:<44} {:>10.2}", "plain Vec<u32> (best)", pair.vec_best);
    println!("{:<44} {:>10.2}", "translator (best)", pair.tr_best);
    println!(
        "{:<44} {:>9.2}x {:>7}",
        "translator vs plain Vec (time, median)", pair.median, "<= 4x"
    );
    println!(
        "{:<44} {:>10}",
        format!("  range over {} alternations", pair.rounds),
        format!("{:.2}-{:.2}x", pair.lo, pair.hi)
    );
}

/// The pair loop against the plain one, measured in `rounds`
/// alternations (a plain run, then a translator run, each of `n` pairs):
/// each alternation gives one ratio, taken while the machine was in one
/// state, and the median of those is the figure, so that load from other
/// processes on a small machine moves it little.
struct PairRatio {
    rounds: usize,
    vec_best: f64,
    tr_best: f64,
    median: f64,
    lo: f64,
    hi: f64,
}

fn pair_ratio(p: &mut [u32], t: &mut aspace::Translator<'_>, n: u64, rounds: usize) -> PairRatio {
    let time = |f: &mut dyn FnMut()| {
        let at = Instant::now();
        f();
        at.elapsed().as_secs_f64() * 1e9 / n as f64
    };
    let (mut vec_best, mut tr_best) = (f64::INFINITY, f64::INFINITY);
    let mut ratios = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let v = time(&mut || plain_pairs(p, n));
        let x = time(&mut || pairs(t, n));
        vec_best = vec_best.min(v);
        tr_best = tr_best.min(x);
        ratios.push(x / v);
    }
    ratios.sort_by(f64::total_cmp);
    PairRatio {
        rounds,
        vec_best,
        tr_best,
        median: ratios[rounds / 2],
        lo: ratios[0],
        hi: ratios[rounds - 1],
    }
}
