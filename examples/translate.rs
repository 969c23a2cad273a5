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
//! with translators loading on two threads besides the flusher's. Each
//! figure is the best of R repetitions.

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
}
