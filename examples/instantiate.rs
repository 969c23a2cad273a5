//! instantiate: a wasm runtime instantiating instances in every thread
//! (issue 28), in every mode of `aspace::workloads::MODES` and, with
//! `--kernel`, on the running kernel, side by side in one run.
//!
//! ```text
//! cargo run --release --example instantiate -- [--threads 1,2] [--seconds S | --instances N]
//!     [--reps N] [--mode NAME[,NAME..]|all] [--separate] [--kernel] [--writers-only]
//!     [--no-space-bias] [--no-pin]
//! ```
//!
//! An instance (`aspace::workloads::instantiate`): mmap 4 GiB + a 2 GiB
//! guard `PROT_NONE | MAP_NORESERVE` without a hint, mprotect its first
//! 1 MiB read-write, 3 rounds of a store to 16 pages (through a
//! `Translator`; plain stores on the kernel) and `MADV_DONTNEED`, munmap.
//! `--writers-only` keeps the mmap, mprotect and munmap alone. Each
//! repetition runs every thread count and every mode in turn (then the
//! kernel), each on a fresh address space, with thread `i` bound to the
//! `i`-th CPU; the table gives instances per second (wall and CPU), each
//! count's scaling over the first, each mode over the kernel, and a
//! verdict per column. `--separate` adds the no-sharing ideal
//! (`aspace::workloads::Separate`: each thread in a `PerVma` space of its
//! own) and each mode's rate over it at every thread count: what sharing
//! one space costs on this machine, whatever its cores give. `--help` lists every option and its default.

#[path = "../benches/common/machine.rs"]
mod machine;
#[path = "../benches/common/report.rs"]
mod report;

use aspace::workloads::instantiate::{self, Kind, Params, Sample, Until};
use aspace::workloads::{Kernel, Mode, Separate, Space, MODES};
use machine::{hmean, machine, parse_arg, parse_threads, thread_counts};
use report::range;

/// Every option `parse` takes: (the option and its value, what it does,
/// its default). `--help` prints this table.
const OPTIONS: &[(&str, &str, &str)] = &[
    (
        "--threads 1,2",
        "instantiating thread counts (1..=1024, comma-separated)",
        "1 and the core count",
    ),
    (
        "--seconds S",
        "how long each thread count runs in each mode per repetition",
        "0.5",
    ),
    (
        "--instances N",
        "instances per thread per point instead of --seconds",
        "off (--seconds)",
    ),
    ("--reps N", "repetitions of every point", "3"),
    (
        "--mode NAME[,NAME..]",
        "modes of aspace::workloads::MODES (MmapLock, PerVma, Speculative, ...) to run, in that order, or all",
        "all",
    ),
    (
        "--separate",
        "also run every thread in a PerVma space of its own (aspace::workloads::Separate, the no-sharing ideal on this machine) and print each mode over it",
        "off",
    ),
    (
        "--kernel",
        "also run the same program on the running kernel (libc mmap/mprotect/madvise/munmap, plain stores, threads bound alike) and print each mode over it",
        "off",
    ),
    (
        "--writers-only",
        "instances without stores and MADV_DONTNEED: mmap, mprotect, munmap loops, each thread on its own range",
        "off (full instances)",
    ),
    (
        "--no-space-bias",
        "the range modes without the whole space's bias (Config::range_space_bias off: each slot's bias from the start), so that one thread runs the slot owner's path; they print as Range/slots and Range+windows/slots",
        "off",
    ),
    (
        "--no-pin",
        "leave the threads to the scheduler",
        "thread i bound to the i-th CPU",
    ),
    ("-h, --help", "print this help", ""),
];

const ABOUT: &str =
    "instantiate: wasm-runtime-like instantiation in every thread, per mode and beside the kernel";

struct Args {
    threads: Vec<usize>,
    until: Until,
    reps: usize,
    modes: Vec<Mode>,
    separate: bool,
    kernel: bool,
    kind: Kind,
    pin: bool,
    no_space_bias: bool,
}

fn usage() -> ! {
    report::usage(
        "instantiate",
        &report::help_text(ABOUT, "instantiate", OPTIONS),
    )
}

fn parse() -> Args {
    let mut a = Args {
        threads: {
            let mut t = thread_counts();
            let last = *t.last().unwrap_or(&1);
            t.retain(|&n| n == 1 || n == last);
            t
        },
        until: Until::Seconds(0.5),
        reps: 3,
        modes: MODES.to_vec(),
        separate: false,
        kernel: false,
        kind: Kind::Instances,
        pin: true,
        no_space_bias: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = || it.next().unwrap_or_else(|| usage());
        match arg.as_str() {
            "--threads" => a.threads = parse_threads(&val()).unwrap_or_else(|| usage()),
            "--seconds" => {
                let s = parse_arg(&val(), |&s: &f64| s > 0.0 && s < 1e6);
                a.until = Until::Seconds(s.unwrap_or_else(|| usage()));
            }
            "--instances" => {
                let n = parse_arg(&val(), |&n: &u64| n > 0);
                a.until = Until::Instances(n.unwrap_or_else(|| usage()));
            }
            "--reps" => a.reps = parse_arg(&val(), |&n: &usize| n > 0).unwrap_or_else(|| usage()),
            "--mode" => {
                let name = val();
                if name != "all" {
                    a.modes = name
                        .split(',')
                        .map(|n| {
                            let m = MODES.iter().find(|m| m.name.eq_ignore_ascii_case(n));
                            *m.unwrap_or_else(|| usage())
                        })
                        .collect();
                }
            }
            "--separate" => a.separate = true,
            "--kernel" => a.kernel = true,
            "--writers-only" => a.kind = Kind::WritersOnly,
            "--no-space-bias" => a.no_space_bias = true,
            "--no-pin" => a.pin = false,
            "-h" | "--help" => {
                print!("{}", report::help_text(ABOUT, "instantiate", OPTIONS));
                std::process::exit(0)
            }
            _ => usage(),
        }
    }
    if a.no_space_bias {
        for m in &mut a.modes {
            *m = without_space_bias(*m);
        }
    }
    a
}

/// `m` without the whole space's bias, if it is a range mode
/// (`--no-space-bias`).
fn without_space_bias(m: Mode) -> Mode {
    fn config_of(name: &str) -> aspace::Config {
        (MODES
            .iter()
            .find(|m| m.name == name)
            .expect("a mode of MODES")
            .config)()
    }
    match m.name {
        "Range" => Mode::new("Range/slots", || aspace::Config {
            range_space_bias: false,
            ..config_of("Range")
        }),
        "Range+windows" => Mode::new("Range+windows/slots", || aspace::Config {
            range_space_bias: false,
            ..config_of("Range+windows")
        }),
        _ => m,
    }
}

/// How to read the table, printed once before it.
const LEGEND: &str = "\
how to read the table:
  inst/sec-N     instances per second of wall time, all N threads together (Hmean over the reps)
  inst/cpu-N     instances per CPU-second of the N threads (steadier on a loaded machine; blind to
                 time spent waiting for a lock, so read it beside inst/sec)
  (lo-hi)        the reps' range of inst/sec
  scaling N/1    inst/sec at N threads over inst/sec at the first count, per column (a lock every
                 writer takes keeps it near 1.0x; writers that do not meet approach N)
  /separate-N    each mode's inst/sec over separate spaces' at N threads, one PerVma space per thread
                 (--separate: the rate nothing shared gives on this machine; 1.00x is the ideal)
  /kernel-N      each mode's inst/sec over the kernel's at N threads (--kernel)
  verdict        per column, its inst/sec against each column to its left at every thread count
                 (ratio of Hmeans: faster or slower by more than 3% at every count, level within
                 3%, or mixed; \"ranges apart\": the counts where the reps' ranges do not overlap)";

fn run_one<S: Space>(space: &S, args: &Args, threads: usize) -> Sample {
    let p = Params {
        threads,
        kind: args.kind,
        until: args.until,
        check: false,
        pin: args.pin,
    };
    instantiate::run(space, &p).unwrap_or_else(|e| panic!("instantiate, {threads} threads: {e}"))
}

fn main() {
    let args = parse();
    let mut names: Vec<String> = args.modes.iter().map(|m| m.name.to_string()).collect();
    // The columns after the modes: separate spaces, then the kernel.
    let separate = args.separate.then_some(names.len());
    if separate.is_some() {
        names.push("separate".into());
    }
    if args.kernel {
        names.push("kernel".into());
    }
    let per_point = match args.until {
        Until::Seconds(s) => format!("{s} s per point"),
        Until::Instances(n) => format!("{n} instances per thread per point"),
    };
    println!(
        "instantiate on {}: {}, {per_point}, {} reps{}",
        machine(),
        args.kind.name(),
        args.reps,
        if args.pin { "" } else { ", threads not pinned" }
    );
    println!(
        "an instance: mmap {} GiB + {} GiB guard PROT_NONE|MAP_NORESERVE (no hint), mprotect {} KiB rw, {}, munmap",
        instantiate::RESERVE >> 30,
        instantiate::GUARD >> 30,
        instantiate::HEAP >> 10,
        match args.kind {
            Kind::Instances => format!(
                "{} x ({} page stores + MADV_DONTNEED)",
                instantiate::ROUNDS,
                instantiate::PAGES
            ),
            Kind::WritersOnly => "no stores".into(),
        }
    );
    println!("\n{LEGEND}\n");
    // samples[thread-count index][column]: the modes, separate spaces,
    // then the kernel.
    let mut samples: Vec<Vec<Vec<Sample>>> = args
        .threads
        .iter()
        .map(|_| vec![Vec::new(); names.len()])
        .collect();
    for rep in 0..args.reps {
        for (ti, &threads) in args.threads.iter().enumerate() {
            for (m, mode) in args.modes.iter().enumerate() {
                let s = run_one(&mode.space(), &args, threads);
                samples[ti][m].push(s);
            }
            if let Some(c) = separate {
                let per_vma = MODES.iter().find(|m| m.name == "PerVma");
                let sep = Separate::new(per_vma.expect("MODES has PerVma"), threads);
                samples[ti][c].push(run_one(&sep, &args, threads));
            }
            if args.kernel {
                // SAFETY: only the driver uses it, on mappings it made.
                let k = unsafe { Kernel::new() };
                samples[ti][names.len() - 1].push(run_one(&k, &args, threads));
            }
        }
        eprintln!("rep {}/{} done", rep + 1, args.reps);
    }
    let rates = |ti: usize, c: usize, f: fn(&Sample) -> f64| -> Vec<f64> {
        samples[ti][c].iter().map(f).collect()
    };
    let mut head = format!("{:<18}", "");
    for n in &names {
        head.push_str(&format!(" {n:>24}"));
    }
    println!("{head}");
    for (ti, &threads) in args.threads.iter().enumerate() {
        for (label, f) in [
            ("sec", Sample::per_sec as fn(&Sample) -> f64),
            ("cpu", Sample::per_cpu_sec),
        ] {
            let mut line = format!("{:<18}", format!("inst/{label}-{threads}"));
            for c in 0..names.len() {
                let xs = rates(ti, c, f);
                let cell = if label == "sec" {
                    let (lo, hi) = range(&xs);
                    format!("{:.0} ({lo:.0}-{hi:.0})", hmean(&xs))
                } else {
                    format!("{:.0}", hmean(&xs))
                };
                line.push_str(&format!(" {cell:>24}"));
            }
            println!("{line}");
        }
    }
    let sec = |ti: usize, c: usize| hmean(&rates(ti, c, Sample::per_sec));
    for (ti, &threads) in args.threads.iter().enumerate().skip(1) {
        let mut line = format!("{:<18}", format!("scaling {threads}/{}", args.threads[0]));
        for c in 0..names.len() {
            line.push_str(&format!(" {:>23.2}x", sec(ti, c) / sec(0, c)));
        }
        println!("{line}");
    }
    let over = |label: &str, k: usize| {
        for (ti, &threads) in args.threads.iter().enumerate() {
            let mut line = format!("{:<18}", format!("/{label}-{threads}"));
            for m in 0..args.modes.len() {
                line.push_str(&format!(" {:>23.2}x", sec(ti, m) / sec(ti, k)));
            }
            println!("{line}");
        }
    };
    if let Some(c) = separate {
        over("separate", c);
    }
    if args.kernel {
        over("kernel", names.len() - 1);
    }
    for line in report::verdicts(&names, &args.threads, |ti, c| rates(ti, c, Sample::per_sec)) {
        println!("{line}");
    }
}
