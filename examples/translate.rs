//! translate: the soft TLB against `mm.read` and a plain slice, on one
//! and two threads, and what a flush costs with busy translators.
//!
//! ```text
//! cargo run --release --example translate -- [--loads N] [--reps R] [--widths only]
//! cargo run --release --example translate -- --only OP:WIDTH [--loads N]
//! ```
//!
//! Prints one table measured in one run: ns per 8-byte load over a hot
//! working set of 64 pages (each load on the next page), the ratios the
//! design targets (translator hit >= 20x `mm.read`, >= 0.3x the plain
//! loop, two threads >= 1.9x one), and the cost of a flush (an mprotect
//! to read-only and back, per flush) with no translators, with translators
//! on two threads (the flusher's own and another, idle or loading), and
//! with translators loading on two threads besides the flusher's; then
//! aligned loads, stores, and stores each followed by a load of the same
//! place, of every width (at every aligned slot of a word) against the
//! u64 ones (target <= 1.3x), and a u32 load+store pair loop, per call
//! and inside translator blocks of 16 pairs (`Translator::block`), against
//! the same loop over a plain `Vec` (target <= 4x). Each time is the best of
//! R repetitions, but the ratios by width and the pair ratio: the median
//! of max(R, 5) alternations, each alternation's ratio measured back to
//! back (their range is printed too). `--widths only` prints only those.
//!
//! `--only OP:WIDTH` (OP `load`, `store` or `store+load`; WIDTH `u8`..`u64`)
//! runs that one loop of N accesses on a warm translator and nothing
//! else, for instruction counts per access under callgrind (the loops are
//! `#[inline(never)]`; `--toggle-collect` names them), see
//! docs/RESULTS.md. `--only pair`, `--only block-pair` and
//! `--only plain-pair` run N u32 load+store pairs per call, in blocks, or
//! over the plain `Vec` (`pairs`, `block_pairs`, `plain_pairs`).

#[path = "../benches/common/machine.rs"]
mod machine;
#[path = "../benches/common/translate_workload.rs"]
mod translate_workload;

use aspace::workloads::thread_cpu_time;
use machine::{machine, parse_arg};
use std::time::Instant;
use translate_workload::*;

fn best(reps: usize, mut f: impl FnMut() -> f64) -> f64 {
    (0..reps).map(|_| f()).fold(f64::INFINITY, f64::min)
}

fn main() {
    let mut loads: u64 = 20_000_000;
    let mut reps = 5;
    let mut only_loop = None;
    let mut widths_only = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v = args.next().unwrap_or_default();
        match a.as_str() {
            "--loads" => loads = parse_arg(&v, |&n: &u64| n > 0).expect("--loads N"),
            "--reps" => reps = parse_arg(&v, |&n: &usize| n > 0).expect("--reps R"),
            "--only" => only_loop = Some(v),
            "--widths" if v == "only" => widths_only = true,
            _ => {
                eprintln!(
                    "usage: translate [--loads N] [--reps R] [--widths only] [--only OP:WIDTH]"
                );
                std::process::exit(2);
            }
        }
    }
    let mm = setup();
    if let Some(what) = only_loop {
        return only(&mm, &what, loads);
    }
    if widths_only {
        println!("translate: accesses by width; {}", machine());
        return widths(&mm, loads, reps);
    }
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

/// The per-width loops: (name, function) for each operation and width,
/// with `u64` last in each operation's list.
type Loop = fn(&mut aspace::Translator<'_>, u64) -> u64;

fn width_loops() -> [(&'static str, [(&'static str, Loop); 4]); 3] {
    fn st<T: aspace::Scalar>(t: &mut aspace::Translator<'_>, n: u64) -> u64 {
        stores_of::<T>(t, n);
        0
    }
    [
        (
            "load",
            [
                ("u8", loads_of::<u8>),
                ("u16", loads_of::<u16>),
                ("u32", loads_of::<u32>),
                ("u64", loads_of::<u64>),
            ],
        ),
        (
            "store",
            [
                ("u8", st::<u8>),
                ("u16", st::<u16>),
                ("u32", st::<u32>),
                ("u64", st::<u64>),
            ],
        ),
        (
            "store+load",
            [
                ("u8", store_loads_of::<u8>),
                ("u16", store_loads_of::<u16>),
                ("u32", store_loads_of::<u32>),
                ("u64", store_loads_of::<u64>),
            ],
        ),
    ]
}

/// `--only OP:WIDTH` (e.g. `store:u8`): warms a translator, then runs
/// only that loop, `n` accesses, once, for an instruction count per
/// access (`valgrind --tool=callgrind --collect-atstart=no
/// --toggle-collect='*translate_workload::stores_of*'`).
fn only(mm: &aspace::AddressSpace, what: &str, n: u64) {
    if let Some(f) = pair_loop(what) {
        let mut t = mm.translator();
        translated(&mut t, WORDS);
        let mut p = vec![0u32; 2 * WORDS as usize];
        f(&mut t, &mut p, n);
        println!("{what}: {n} pairs, word 0 {}", p[0]);
        return;
    }
    let (op, width) = what.split_once(':').unwrap_or((what, ""));
    let found = width_loops()
        .into_iter()
        .filter(|(o, _)| *o == op)
        .flat_map(|(_, loops)| loops)
        .find(|(w, _)| *w == width);
    let Some((_, f)) = found else {
        eprintln!(
            "--only OP:WIDTH: OP is load, store or store+load; WIDTH u8, u16, u32 or u64; \
             or --only pair, block-pair or plain-pair"
        );
        std::process::exit(2);
    };
    let mut t = mm.translator();
    translated(&mut t, WORDS);
    println!("{what}: {n} accesses, sum {}", f(&mut t, n));
}

/// A pair loop of `--only`: `pair`, `block-pair` or `plain-pair`.
type PairLoop = fn(&mut aspace::Translator<'_>, &mut [u32], u64);

fn pair_loop(what: &str) -> Option<PairLoop> {
    Some(match what {
        "pair" => |t, _, n| pairs(t, n),
        "block-pair" => |t, _, n| block_pairs(t, n),
        "plain-pair" => |_, p, n| plain_pairs(p, n),
        _ => return None,
    })
}

/// Aligned loads and stores of every width (at every aligned slot of a
/// word), a store then a load of the same place, and load+store pairs
/// against a plain `Vec`. Each width's figure against the `u64` one is
/// the median of max(3R, 15) alternations (every width timed back to
/// back, in an order rotated each round, in thread CPU time), as for the
/// pair ratio.
fn widths(mm: &aspace::AddressSpace, n: u64, reps: usize) {
    let time = |f: &mut dyn FnMut()| {
        let at = Instant::now();
        f();
        at.elapsed().as_secs_f64() * 1e9 / n as f64
    };
    // The width loops: more, shorter rounds, each loop timed in the
    // thread's CPU time (time descheduled on a loaded machine left out).
    let rounds = (3 * reps).max(15);
    let chunk = (n / 4).max(1);
    let cpu_time = |f: &mut dyn FnMut()| {
        let at = thread_cpu_time();
        f();
        (thread_cpu_time() - at) * 1e9 / chunk as f64
    };
    let mut t = mm.translator();
    translated(&mut t, WORDS);
    let mut v = slice();
    let vec_load = best(reps, || {
        time(&mut || {
            plain(&v, n);
        })
    });
    let vec_store = best(reps, || time(&mut || plain_stores(&mut v, n)));
    let ops = width_loops();
    // ns[op][width][round]
    let mut ns = vec![vec![Vec::new(); 4]; ops.len()];
    for r in 0..rounds {
        for (o, (_, loops)) in ops.iter().enumerate() {
            for k in 0..loops.len() {
                let w = (k + r) % loops.len();
                let f = loops[w].1;
                ns[o][w].push(cpu_time(&mut || {
                    f(&mut t, chunk);
                }));
            }
        }
    }
    println!(
        "aligned accesses by width, every aligned slot of a word (ns each in thread CPU \
         time, best of {rounds} rounds of {chunk}; x: vs the u64 one, median of the rounds' \
         ratios [range], target <= 1.3x)"
    );
    println!(
        "{:<16} {:>7} {:>6} {:>13} {:>7} {:>6} {:>13} {:>7} {:>6} {:>13}",
        "", "load", "x", "", "store", "x", "", "st+ld", "x", ""
    );
    println!(
        "{:<16} {:>7.2} {:>6} {:>13} {:>7.2}",
        "plain Vec<u64>", vec_load, "", "", vec_store
    );
    for w in 0..4 {
        let mut line = format!("{:<16}", format!("translator {}", ops[0].1[w].0));
        for per_w in &ns {
            let best = per_w[w].iter().copied().fold(f64::INFINITY, f64::min);
            let mut ratios: Vec<f64> = (0..rounds).map(|r| per_w[w][r] / per_w[3][r]).collect();
            ratios.sort_by(f64::total_cmp);
            let range = format!("[{:.2}-{:.2}]", ratios[0], ratios[rounds - 1]);
            line += &format!(" {best:>7.2} {:>5.2}x {range:>13}", ratios[rounds / 2]);
        }
        println!("{line}");
    }
    let mut p = vec![0u32; 2 * WORDS as usize];
    let pair = pair_ratio(&mut p, &mut t, n, reps.max(5));
    println!("{:<44} {:>10}", "u32 load+store pair (ns per pair)", "ns");
    println!("{:<44} {:>10.2}", "plain Vec<u32> (best)", pair.vec_best);
    println!(
        "{:<44} {:>10.2}",
        "translator, per call (best)", pair.tr_best
    );
    println!(
        "{:<44} {:>10.2}",
        format!("translator, blocks of {BLOCK_PAIRS} pairs (best)"),
        pair.block_best
    );
    for (what, r) in [("per call", &pair.per_call), ("blocks", &pair.blocks)] {
        println!(
            "{:<44} {:>9.2}x {:>7}",
            format!("translator {what} vs plain Vec (time, median)"),
            r.median,
            "<= 4x"
        );
        println!(
            "{:<44} {:>10}",
            format!("  range over {} alternations", pair.rounds),
            format!("{:.2}-{:.2}x", r.lo, r.hi)
        );
    }
}

/// The pair loops (per call and in blocks) against the plain one,
/// measured in `rounds` alternations (a plain run, a per-call run, a
/// block run, each of `n` pairs): each alternation gives one ratio per
/// translator loop, taken while the machine was in one state, and the
/// median of those is the figure, so that load from other processes on a
/// small machine moves it little.
struct PairRatio {
    rounds: usize,
    vec_best: f64,
    tr_best: f64,
    block_best: f64,
    per_call: Ratios,
    blocks: Ratios,
}

/// The median and range of one loop's alternation ratios.
struct Ratios {
    median: f64,
    lo: f64,
    hi: f64,
}

impl Ratios {
    fn of(mut ratios: Vec<f64>) -> Self {
        ratios.sort_by(f64::total_cmp);
        Ratios {
            median: ratios[ratios.len() / 2],
            lo: ratios[0],
            hi: ratios[ratios.len() - 1],
        }
    }
}

fn pair_ratio(p: &mut [u32], t: &mut aspace::Translator<'_>, n: u64, rounds: usize) -> PairRatio {
    let time = |f: &mut dyn FnMut()| {
        let at = Instant::now();
        f();
        at.elapsed().as_secs_f64() * 1e9 / n as f64
    };
    let (mut vec_best, mut tr_best, mut block_best) = (f64::INFINITY, f64::INFINITY, f64::INFINITY);
    let (mut per_call, mut blocks) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let v = time(&mut || plain_pairs(p, n));
        let x = time(&mut || pairs(t, n));
        let b = time(&mut || block_pairs(t, n));
        vec_best = vec_best.min(v);
        tr_best = tr_best.min(x);
        block_best = block_best.min(b);
        per_call.push(x / v);
        blocks.push(b / v);
    }
    PairRatio {
        rounds,
        vec_best,
        tr_best,
        block_best,
        per_call: Ratios::of(per_call),
        blocks: Ratios::of(blocks),
    }
}
