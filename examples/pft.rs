//! pft: page-fault scaling, PerVma and Speculative against MmapLock, in
//! the shape of mmtests' compare-kernels table.
//!
//! ```text
//! cargo run --release --example pft -- [--full] [--threads 1,2,4] [--reps N]
//!     [--workload single|per-thread|interleaved|all] [--writer|--no-writer]
//!     [--mib M] [--vma-kib K] [--seconds S] [--no-zero] [--no-pin] [--csv FILE]
//!     [--plot FILE.svg] [--frames fresh|used|zeroed|all] [--kernel] [--thp]
//! ```
//!
//! `--help` lists every option with its meaning and default (the
//! `OPTIONS` table beside the parser). The output starts with a legend
//! (the rates, Hmean, the percentages against MmapLock and the `*`) and
//! ends each table with a verdict per mode: its faults/sec against each
//! mode to its left at every thread count, and its scaling.
//!
//! What a fault is (`--frames`, one table each): `used` (the default) is
//! what the kernel's pft measures, a first store to each page through a
//! translator, into frames used before, so each fault clears its frame;
//! `zeroed` the same with frames cleared when they were freed
//! (`Config::zero_freed`: the clearing happens in an untimed munmap
//! before the run, whose cost per frame the table prints); `fresh` the
//! metadata path, never-used frames (nothing cleared) and a bare
//! `mm.fault` per page. `--kernel` runs the kernel's pft
//! (`examples/kernel_pft.rs`'s workload) in the same process beside each
//! table without the writer (after each point's aspace runs), and prints
//! the kernel's faults/cpu and faults/sec and each mode's over them.
//! `--thp` adds 2 MiB faults in GB/s: aspace's 2 MiB faults, one row per
//! `--frames` policy (`used`: huge frames used before, cleared on the
//! fault; `zeroed`: cleared when they were freed, `Config::zero_freed`;
//! `fresh`: never used), beside the kernel's `MADV_HUGEPAGE` ones, their
//! ratio, and each side's THP fault and fallback counts.
//!
//! By default (about a minute): threads 1 and the core count; both
//! workloads; rows without and with a concurrent mmap/mprotect/munmap
//! writer; 3 repetitions; the memory per thread sized so that the whole
//! run takes about `--seconds` (60), from a probe that times one full
//! run (setup, faults, teardown). `--full` is the long sweep: threads 1,
//! 2, 4, ... up to the core count, 5 repetitions, and points sized so that
//! a one-thread point faults for about 0.2 s. The plan and its expected
//! duration are printed before anything runs. The worker threads persist
//! across repetitions and modes (a barrier releases them), so only the
//! faulting phase is timed. Progress goes to stderr, on one line redrawn
//! with `\r` when stderr is a terminal, one line per point otherwise.
//! Faulting thread `i` is bound to the `i`-th CPU, as will-it-scale binds
//! its tasks: a run then measures the fault path, not where the scheduler
//! put the threads. (On the 2-core development VM, unbound faulters kept
//! both CPUs busy for only 1.35-1.6 of their 2 CPU-seconds per second,
//! bound ones 1.8-1.95: a run starts with a barrier's wakeups, which can
//! leave both faulters on one CPU until the scheduler moves one.)
//! `--no-pin` leaves them to the scheduler. `--vma-kib K` cuts each
//! region into VMAs of K KiB (an emulator's small mappings, several per
//! PTE table); each table then also prints the share of faults the
//! speculative mode completed speculatively.

#[path = "../benches/common/kernel_pft.rs"]
mod kernel_pft;
#[path = "../benches/common/machine.rs"]
mod machine;
#[path = "../benches/common/pft_sizing.rs"]
mod pft_sizing;
#[path = "../benches/common/pft_workload.rs"]
mod pft_workload;
#[path = "../benches/common/report.rs"]
mod report;

use aspace::FaultLocking;
use machine::{hmean, machine, parse_arg, parse_threads, thread_counts};
use pft_sizing::{clamp_mib, probe};
use pft_workload::{Frames, Params, Sample, Workers, Workload};
use report::range;
use std::fmt::Write as _;
use std::io::{IsTerminal as _, Write as _};
use std::time::Instant;

struct Args {
    /// The long sweep.
    full: bool,
    threads: Vec<usize>,
    /// Repetitions; `None` = 3, or 5 with `--full`.
    reps: Option<usize>,
    /// Target duration of a default run, seconds.
    seconds: f64,
    workloads: Vec<Workload>,
    writer: Vec<bool>,
    /// MiB each thread faults per repetition; `None` = calibrate.
    mib: Option<u64>,
    /// KiB per VMA; `None`: one VMA per region.
    vma_kib: Option<u64>,
    zero: bool,
    /// Bind each faulting thread to a CPU.
    pin: bool,
    csv: Option<String>,
    plot: Option<String>,
    /// What a fault is: one table per entry.
    frames: Vec<Frames>,
    /// Run the kernel's pft beside each table without the writer.
    kernel: bool,
    /// Also the 2 MiB (THP) runs.
    thp: bool,
}

/// Every option `parse` takes: (the option and its value, what it does,
/// its default). `--help` prints this table; an option added to `parse`
/// gets its row here.
const OPTIONS: &[(&str, &str, &str)] = &[
    (
        "--full",
        "the long sweep: threads 1, 2, 4, ... up to the core count, 5 reps, each point sized so one thread faults for about 0.2 s",
        "off (about a minute)",
    ),
    (
        "--threads 1,2,4",
        "faulting thread counts (1..=1024, comma-separated)",
        "1 and the core count; --full: 1, 2, 4, ... and the core count",
    ),
    ("--reps N", "repetitions of every point", "3; --full: 5"),
    (
        "--workload W",
        "single: one VMA, each thread faults its own slice; per-thread: a VMA per thread; interleaved: one VMA, thread i of n faults pages i, i+n, ... (sharing every PTE table); all: the three",
        "single and per-thread",
    ),
    (
        "--writer",
        "only the tables with a writer: one more thread looping mmap/mprotect/munmap on unrelated VMAs while the faulters run (each VMA gets its anon_vma before the timed phase)",
        "tables without and with it",
    ),
    ("--no-writer", "only the tables without the writer", "tables without and with it"),
    (
        "--mib M",
        "MiB each faulting thread faults per repetition",
        "sized by a probe run so the whole run takes --seconds (4..=256 MiB); --full: about 0.2 s of faults per point (4..=1024 MiB)",
    ),
    (
        "--vma-kib K",
        "cut each region into VMAs of K KiB (a multiple of 4; an emulator's small mappings, several per PTE table)",
        "one VMA per region",
    ),
    ("--seconds S", "the duration a default run is sized for", "60"),
    (
        "--no-zero",
        "hand out frames uncleared (fresh frames are zero anyway; reused ones are cleared)",
        "zeroing on",
    ),
    (
        "--no-pin",
        "leave the faulting threads to the scheduler",
        "faulting thread i bound to the i-th CPU",
    ),
    (
        "--csv FILE",
        "write every sample (one line per run) to FILE",
        "no file",
    ),
    ("--plot FILE.svg", "plot faults/sec against threads to FILE.svg", "no plot"),
    (
        "--frames F",
        "what a fault is, one table each: used (a first store through a translator into frames used before, cleared on the fault, as the kernel's pft), zeroed (the same with frames cleared when freed, Config::zero_freed), fresh (never-used frames and a bare mm.fault: the metadata path), all",
        "used",
    ),
    (
        "--kernel",
        "run the kernel's pft (examples/kernel_pft.rs's workload, aspace::workloads::pft on the kernel: a store to every page of a MADV_NOHUGEPAGE mapping) beside each table without the writer, and print each mode's rate over the kernel's",
        "off",
    ),
    (
        "--thp",
        "also 2 MiB faults in GB/s, side by side: aspace's and the kernel's pft on 2 MiB-aligned MADV_HUGEPAGE mappings (per-thread, 64 MiB per thread, no writer), one row per --frames policy, their ratio, and each side's thp_fault_alloc/thp_fault_fallback",
        "off",
    ),
    ("-h, --help", "print this help", ""),
];

/// The options table, for `--help`.
fn help_text() -> String {
    report::help_text(
        "pft: page-fault scaling, PerVma and Speculative against MmapLock",
        "pft",
        OPTIONS,
    )
}

/// A bad command line: the options table on stderr, exit status 2.
fn usage() -> ! {
    report::usage("pft", &help_text())
}

fn parse() -> Args {
    let mut threads = None;
    let mut a = Args {
        full: false,
        threads: Vec::new(),
        reps: None,
        seconds: 60.0,
        workloads: vec![Workload::Single, Workload::PerThread],
        writer: vec![false, true],
        mib: None,
        vma_kib: None,
        zero: true,
        pin: true,
        csv: None,
        plot: None,
        frames: vec![Frames::Used],
        kernel: false,
        thp: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = || it.next().unwrap_or_else(|| usage());
        match arg.as_str() {
            "--full" => a.full = true,
            "--threads" => threads = Some(parse_threads(&val()).unwrap_or_else(|| usage())),
            "--reps" => {
                a.reps = Some(parse_arg(&val(), |&n: &usize| n > 0).unwrap_or_else(|| usage()))
            }
            "--seconds" => {
                a.seconds = parse_arg(&val(), |&s: &f64| s > 0.0).unwrap_or_else(|| usage())
            }
            "--workload" => {
                a.workloads = match val().as_str() {
                    "single" => vec![Workload::Single],
                    "per-thread" => vec![Workload::PerThread],
                    "interleaved" => vec![Workload::Interleaved],
                    "all" => vec![Workload::Single, Workload::PerThread, Workload::Interleaved],
                    _ => usage(),
                }
            }
            "--writer" => a.writer = vec![true],
            "--no-writer" => a.writer = vec![false],
            "--mib" => a.mib = Some(parse_arg(&val(), |&n: &u64| n > 0).unwrap_or_else(|| usage())),
            "--vma-kib" => {
                a.vma_kib = Some(
                    parse_arg(&val(), |&k: &u64| k > 0 && k % 4 == 0).unwrap_or_else(|| usage()),
                )
            }
            "--no-zero" => a.zero = false,
            "--no-pin" => a.pin = false,
            "--frames" => {
                a.frames = match val().as_str() {
                    "fresh" => vec![Frames::Fresh],
                    "used" => vec![Frames::Used],
                    "zeroed" => vec![Frames::Zeroed],
                    "all" => vec![Frames::Used, Frames::Zeroed, Frames::Fresh],
                    _ => usage(),
                }
            }
            "--kernel" => a.kernel = true,
            "--thp" => a.thp = true,
            "--csv" => a.csv = Some(val()),
            "--plot" => a.plot = Some(val()),
            "-h" | "--help" => {
                print!("{}", help_text());
                std::process::exit(0)
            }
            _ => usage(),
        }
    }
    a.threads = threads.unwrap_or_else(|| {
        if a.full {
            thread_counts()
        } else {
            // The ends of the sweep: one thread, and every core.
            let mut t = thread_counts();
            t.retain(|&n| n == 1 || n == *thread_counts().last().unwrap_or(&1));
            t
        }
    });
    a
}

/// The modes, in table order (the first is the baseline).
const MODES: [FaultLocking; 3] = [
    FaultLocking::MmapLock,
    FaultLocking::PerVma,
    FaultLocking::Speculative,
];

/// One table row: a metric at a thread count for every mode.
struct Point {
    label: String,
    by_mode: [Vec<f64>; MODES.len()],
}

fn main() {
    let args = parse();
    let max_threads = args.threads.iter().copied().max().unwrap_or(1);
    let reps = args.reps.unwrap_or(if args.full { 5 } else { 3 });
    let vma_bytes = args.vma_kib.map(|k| k << 10);
    // One table per (workload, writer); each gets its own size, because
    // a writer slows MmapLock faults by orders of magnitude.
    let mut tables: Vec<(Workload, bool, Frames)> = Vec::new();
    for &f in &args.frames {
        for &wl in &args.workloads {
            for &w in &args.writer {
                tables.push((wl, w, f));
            }
        }
    }
    // Thread-runs of one table (a run of t threads faults t slices).
    let table_thread_runs = args.threads.iter().sum::<usize>() * reps;
    // Warm up (the first run pays for the allocator's growth), then probe.
    probe(
        Workload::PerThread,
        false,
        FaultLocking::PerVma,
        args.zero,
        args.frames[0],
        8,
        vma_bytes,
    );
    let mut sized: Vec<(Workload, bool, Frames, u64)> = Vec::new();
    let mut estimate = 0.0;
    for &(wl, writer, frames) in &tables {
        let p = MODES.map(|l| {
            let mib = if args.full { 32 } else { 8 };
            probe(wl, writer, l, args.zero, frames, mib, vma_bytes)
        });
        let per_mib: f64 = p.iter().map(|p| p.run_s_per_mib).sum();
        let pervma = MODES
            .iter()
            .position(|&m| m == FaultLocking::PerVma)
            .expect("PerVma is a mode");
        let mib = args.mib.unwrap_or_else(|| {
            if args.full {
                // A one-thread PerVma point faults for about 0.2 s.
                clamp_mib(0.2 / p[pervma].fault_s_per_mib, 1024, max_threads)
            } else {
                // An even share of the time; at most 256 MiB (64k faults
                // per thread is plenty for stable figures, and a probe
                // that ran fast by chance must not blow the budget).
                let share = args.seconds / tables.len() as f64;
                clamp_mib(
                    share / (per_mib * table_thread_runs as f64),
                    256,
                    max_threads,
                )
            }
        });
        estimate += per_mib * (mib * table_thread_runs as u64) as f64;
        sized.push((wl, writer, frames, mib));
    }
    let runs = tables.len() * args.threads.len() * reps * MODES.len();
    println!(
        "pft on {}: {} reps, zeroing {}{}",
        machine(),
        reps,
        if args.zero { "on" } else { "off" },
        if args.pin {
            ""
        } else {
            ", faulters not pinned"
        }
    );
    println!(
        "plan: {} tables x threads {:?} x {} reps x {} modes = {} runs; about {:.0} s{}",
        tables.len(),
        args.threads,
        reps,
        MODES.len(),
        runs,
        estimate,
        if args.full {
            ""
        } else {
            " (--full for the long sweep)"
        }
    );
    println!("\n{LEGEND}");
    let tty = std::io::stderr().is_terminal();
    let started = Instant::now();
    let mut csv = String::from("workload,writer,locking,threads,rep,faults,wall_s,faults_per_sec,faults_per_cpu,per_vma_faults,writer_ops,speculative_faults,spec_aborts,frames\n");
    let mut plot_series: Vec<(String, Vec<(usize, f64)>)> = Vec::new();
    let mut kernel_csv = String::new();
    for &(wl, writer, frames, mib) in &sized {
        let title = format!(
            "{}{}, {}",
            wl.name(),
            if writer { " + writer" } else { "" },
            frames.describe()
        );
        // The kernel's pft beside this table (not beside the writer's:
        // the kernel side has no writer).
        let kernel = args.kernel && !writer;
        // kernel_samples[thread-count index]
        let mut kernel_samples: Vec<Vec<Sample>> =
            args.threads.iter().map(|_| Vec::new()).collect();
        // One pool per thread count, all alive for the whole table, so
        // that each repetition runs every thread count and every mode in
        // turn: drift on the machine then hits the 1-thread and the
        // N-thread points alike, and their ratio stays honest.
        let pools: Vec<Workers> = args
            .threads
            .iter()
            .map(|&t| Workers::new(t, writer, args.pin))
            .collect();
        // samples[thread-count index][mode]
        let mut samples: Vec<[Vec<Sample>; MODES.len()]> =
            args.threads.iter().map(|_| Default::default()).collect();
        for rep in 0..reps {
            for (ti, &threads) in args.threads.iter().enumerate() {
                for (m, locking) in MODES.into_iter().enumerate() {
                    if tty {
                        eprint!(
                            "\r{title}: rep {}/{reps}, {threads} threads {locking:?}        ",
                            rep + 1,
                        );
                        let _ = std::io::stderr().flush();
                    }
                    let s = pools[ti].run(Params {
                        threads,
                        workload: wl,
                        writer,
                        locking,
                        bytes_per_thread: mib << 20,
                        vma_bytes,
                        zero: args.zero,
                        frames,
                        huge: false,
                    });
                    let _ = writeln!(
                        csv,
                        "{},{},{:?},{},{},{},{:.6},{:.1},{:.1},{},{},{},{},{}",
                        wl.name(),
                        writer,
                        locking,
                        threads,
                        rep,
                        s.faults,
                        s.wall,
                        s.faults_per_sec(),
                        s.faults_per_cpu(),
                        s.per_vma,
                        s.writer_ops,
                        s.speculative,
                        s.spec_aborts,
                        frames.name()
                    );
                    samples[ti][m].push(s);
                }
                if kernel {
                    let s = kernel_pft::run(threads, wl, mib << 20, false, args.pin);
                    let _ = writeln!(
                        kernel_csv,
                        "{},false,kernel,{},{},{},{:.6},{:.1},{:.1},0,0,0,0,kernel",
                        wl.name(),
                        threads,
                        rep,
                        s.faults,
                        s.wall,
                        s.faults_per_sec(),
                        s.faults_per_cpu()
                    );
                    kernel_samples[ti].push(s);
                }
            }
            if !tty {
                eprintln!("{title}: rep {}/{reps} done", rep + 1);
            }
        }
        drop(pools);
        if tty {
            eprint!("\r{:70}\r", "");
        }
        let mut rows: Vec<Point> = Vec::new();
        let mut per_mode_sec: [Vec<(usize, f64)>; MODES.len()] = Default::default();
        for (ti, &threads) in args.threads.iter().enumerate() {
            let metric =
                |m: usize, f: fn(&Sample) -> f64| samples[ti][m].iter().map(f).collect::<Vec<_>>();
            rows.push(Point {
                label: format!("faults/cpu-{threads}"),
                by_mode: core::array::from_fn(|m| metric(m, Sample::faults_per_cpu)),
            });
            rows.push(Point {
                label: format!("faults/sec-{threads}"),
                by_mode: core::array::from_fn(|m| metric(m, Sample::faults_per_sec)),
            });
            for (m, series) in per_mode_sec.iter_mut().enumerate() {
                series.push((threads, hmean(&metric(m, Sample::faults_per_sec))));
            }
        }
        let vmas = args
            .vma_kib
            .map_or(String::new(), |k| format!(", VMAs of {k} KiB"));
        println!("\n{title} ({mib} MiB per thread per rep{vmas})");
        println!(
            "{:<22} {:>22} {:>24} {:>24}",
            "", "MmapLock", "PerVma", "Speculative"
        );
        for r in &rows {
            let base = &r.by_mode[0];
            let a = hmean(base);
            let (alo, ahi) = range(base);
            let mut line = format!("Hmean {:<16} {:>12.2} (  0.00%)", r.label, a);
            for other in &r.by_mode[1..] {
                let b = hmean(other);
                let pct = (b - a) / a * 100.0;
                let (blo, bhi) = range(other);
                // Starred when the repetitions' ranges do not overlap.
                let star = if blo > ahi || bhi < alo { '*' } else { ' ' };
                let _ = write!(line, " {:>12.2} {}{:>7.2}%{}", b, star, pct, star);
            }
            println!("{line}");
        }
        // Scaling: each thread count's faults/sec over the first's, per
        // mode (the ratio the issues set targets on).
        if let Some(first) = per_mode_sec[0].first().map(|p| p.0) {
            for (i, &threads) in args.threads.iter().enumerate().skip(1) {
                let mut line = format!("{:<22}", format!("scaling {threads}/{first}"));
                for series in &per_mode_sec {
                    let _ = write!(line, " {:>21.2}x  ", series[i].1 / series[0].1);
                }
                println!("{line}");
            }
        }
        // The share of the Speculative mode's faults that completed
        // speculatively (the rest fell back).
        let spec = MODES.len() - 1;
        for (ti, &threads) in args.threads.iter().enumerate() {
            let (done, all) = samples[ti][spec]
                .iter()
                .fold((0, 0), |(d, a), s| (d + s.speculative, a + s.faults));
            let share = done as f64 * 100.0 / all.max(1) as f64;
            println!("{:<22} {share:>70.1}%", format!("speculative-{threads}"));
        }
        if frames != Frames::Fresh {
            // The untimed unmap that freed the frames (and, zeroed,
            // cleared them: what the clearing moved off the fault path
            // costs there).
            let all: Vec<&Sample> = samples.iter().flatten().flatten().collect();
            let ns = all.iter().map(|s| s.free_s).sum::<f64>() * 1e9
                / all.iter().map(|s| s.faults).sum::<u64>().max(1) as f64;
            println!(
                "{:<22} {ns:>11.0} ns per frame, untimed above{}",
                "scratch unmap",
                if frames == Frames::Zeroed {
                    " (clears the frames)"
                } else {
                    ""
                }
            );
        }
        if kernel {
            // The kernel's pft in this run, and each mode over it.
            // Faults/sec is the target's metric; faults/cpu is the
            // steadier one on a loaded machine.
            for (ti, &threads) in args.threads.iter().enumerate() {
                type Metric = fn(&Sample) -> f64;
                let metrics: [(&str, Metric); 2] = [
                    ("cpu", Sample::faults_per_cpu),
                    ("sec", Sample::faults_per_sec),
                ];
                for (name, f) in metrics {
                    let k = hmean(&kernel_samples[ti].iter().map(f).collect::<Vec<_>>());
                    let mut line = format!(
                        "{:<22} {k:>12.2}  aspace/kernel",
                        format!("kernel faults/{name}-{threads}")
                    );
                    for mode in &samples[ti] {
                        let a = hmean(&mode.iter().map(f).collect::<Vec<_>>());
                        let _ = write!(line, " {:>10.2}x", a / k);
                    }
                    println!("{line}");
                }
            }
        }
        for line in verdicts(&args.threads, &samples) {
            println!("{line}");
        }
        for (m, series) in per_mode_sec.iter().enumerate() {
            plot_series.push((format!("{title}, {:?}", MODES[m]), series.clone()));
        }
    }
    if args.thp {
        thp(&args);
    }
    println!("\nran in {:.0} s", started.elapsed().as_secs_f64());
    if let Some(path) = &args.csv {
        csv.push_str(&kernel_csv);
        std::fs::write(path, csv).unwrap_or_else(|e| panic!("writing {path}: {e}"));
        println!("\nsamples written to {path}");
    }
    if let Some(path) = &args.plot {
        if let Err(e) = plot(path, &plot_series, &machine()) {
            eprintln!("plot failed: {e}");
            std::process::exit(1);
        }
        println!("plot written to {path}");
    }
}

/// The 2 MiB runs, side by side: aspace's faults in 2 MiB-aligned
/// `MADV_HUGEPAGE` regions (one row per `--frames` policy: used huge
/// frames cleared on the fault, or cleared when freed; the config's
/// default locking) against the kernel's pft on `MADV_HUGEPAGE` memory,
/// GB/s per thread count (per-thread workload, 64 MiB per thread, `reps`
/// times, alternating), with each side's THP fault counts.
fn thp(args: &Args) {
    const MIB: u64 = 64;
    let reps = args.reps.unwrap_or(3);
    let locking = aspace::Config::default().fault_locking;
    println!(
        "\nTHP: per-thread, {MIB} MiB per thread per rep, 2 MiB-aligned MADV_HUGEPAGE, one store \
         per 4 KiB page; aspace: {locking:?} (GB/s, Hmean of {reps}, each row's kernel \
         reps alternating with its aspace reps)"
    );
    for &f in &args.frames {
        println!("  frames {:<7} {}", f.name(), f.describe());
    }
    println!(
        "{:<8} {:<7} {:>12} {:>13} {:>12} {:>13} {:>14} {:>11} {:>14}",
        "threads",
        "frames",
        "aspace GB/s",
        "(reps range)",
        "kernel GB/s",
        "(reps range)",
        "aspace/kernel",
        "best/best",
        "unmap us/2M"
    );
    let mut counts = Vec::new();
    for &threads in &args.threads {
        let pool = Workers::new(threads, false, args.pin);
        // Frames used before on the kernel's side too: an untimed run
        // first, whose freed huge pages the timed ones can take again (as
        // aspace's scratch mapping does for its side).
        kernel_pft::run(threads, Workload::PerThread, MIB << 20, true, args.pin);
        for &frames in &args.frames {
            let (mut ours, mut theirs) = (Vec::new(), Vec::new());
            let (mut free_s, mut pages) = (0.0, 0);
            let mut thp = pft_workload::ThpCounts::default();
            let host0 = kernel_pft::host_thp_faults();
            for _ in 0..reps {
                let s = pool.run(Params {
                    threads,
                    workload: Workload::PerThread,
                    writer: false,
                    locking,
                    bytes_per_thread: MIB << 20,
                    vma_bytes: None,
                    zero: args.zero,
                    frames,
                    huge: true,
                });
                ours.push(kernel_pft::bytes_per_sec(&s) / 1e9);
                (free_s, pages) = (free_s + s.free_s, pages + s.faults);
                thp.alloc += s.thp.alloc;
                thp.fallback += s.thp.fallback;
                thp.scratch_alloc += s.thp.scratch_alloc;
                thp.scratch_fallback += s.thp.scratch_fallback;
                let k = kernel_pft::run(threads, Workload::PerThread, MIB << 20, true, args.pin);
                theirs.push(kernel_pft::bytes_per_sec(&k) / 1e9);
            }
            let host1 = kernel_pft::host_thp_faults();
            let (a, k) = (hmean(&ours), hmean(&theirs));
            let ((alo, ahi), (klo, khi)) = (range(&ours), range(&theirs));
            // The untimed scratch unmap's CPU time per huge frame it
            // freed (with `zeroed`, the clearing moved there).
            let unmap_us = free_s * 1e6 / (pages as f64 / 512.0).max(1.0);
            println!(
                "{threads:<8} {:<7} {a:>12.2} {:>13} {k:>12.2} {:>13} {:>13.2}x {:>10.2}x {unmap_us:>14.1}",
                frames.name(),
                format!("{alo:.2}-{ahi:.2}"),
                format!("{klo:.2}-{khi:.2}"),
                a / k,
                ahi / khi
            );
            counts.push((threads, frames, thp, host1.0 - host0.0, host1.1 - host0.1));
        }
    }
    println!(
        "best/best: the fastest rep of each side over the other's (the kernel's reps were \
         bimodal on the development VM, under 2 GB/s or over 4); unmap us/2M: CPU time of the \
         untimed scratch munmap per huge frame it freed (zeroed: the clearing is there)"
    );
    println!("THP faults over the {reps} reps (2 MiB each; a fallback maps 4 KiB pages instead):");
    for (threads, frames, c, host_alloc, host_fallback) in counts {
        let expected = reps as u64 * threads as u64 * (MIB << 20) / (2 << 20);
        println!(
            "  {threads} threads, {}: aspace thp_fault_alloc {} of {expected}, thp_fault_fallback {}; \
             its used huge frames: {} made by the untimed scratch mappings ({} fell back); \
             host /proc/vmstat (kernel runs, system-wide): thp_fault_alloc {host_alloc}, \
             thp_fault_fallback {host_fallback}",
            frames.name(),
            c.alloc,
            c.fallback,
            c.scratch_alloc,
            c.scratch_fallback
        );
        if c.fallback > 0 || c.scratch_fallback > 0 {
            // The budget is 16 times the run's memory: never the reason.
            println!(
                "    aspace fell back for want of a free huge frame: none in the huge list \
                 (frames freed whole) and no 512-aligned run of never-used frames left"
            );
        }
    }
}

fn plot(
    path: &str,
    series: &[(String, Vec<(usize, f64)>)],
    machine: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (900, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let max_t = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.0))
        .max()
        .unwrap_or(1);
    let max_y = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.1))
        .fold(1.0, f64::max)
        / 1e6;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("pft: faults/sec against threads ({machine})"),
            ("sans-serif", 18),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0usize..max_t + 1, 0f64..max_y * 1.1)?;
    chart
        .configure_mesh()
        .x_desc("threads")
        .y_desc("million faults/sec (Hmean)")
        .draw()?;
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let style = if name.ends_with("PerVma") || name.ends_with("Speculative") {
            color.stroke_width(3)
        } else {
            color.stroke_width(1)
        };
        chart
            .draw_series(LineSeries::new(
                pts.iter().map(|&(t, y)| (t, y / 1e6)),
                style,
            ))?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        chart.draw_series(
            pts.iter()
                .map(|&(t, y)| Circle::new((t, y / 1e6), 3, color.filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

/// How to read the tables, printed once before them.
const LEGEND: &str = "\
how to read the tables:
  faults/cpu-N  faults per second of each faulting thread's own CPU time, averaged over the N threads
  faults/sec-N  faults per second of wall time, all N faulting threads together
  Hmean         the harmonic mean of that rate over the repetitions (mmtests' mean of rates)
  (  0.00%)     MmapLock, the first column, is the baseline; each other column's percentage is
                its change from MmapLock on the same row (+ faster, - slower)
  *  ...%*      starred: the repetitions' ranges of the two modes do not overlap, so the
                difference is larger than the run-to-run spread; unstarred, it may be noise
  scaling N/1   faults/sec at N threads over faults/sec at 1 thread, per mode
  speculative-N the share of the Speculative mode's faults that completed speculatively
  verdict       per mode, its faults/sec against each mode to its left at every thread count
                (the ratio of Hmeans: faster or slower by more than 3% at every count, level
                within 3%, or mixed; \"ranges apart\": the counts where the reps' ranges do not
                overlap, as * marks them)";

/// One line per mode: how its faults/sec compare with every mode before
/// it in `MODES`, at each thread count, and how it scales
/// (`report::verdicts`).
fn verdicts(threads: &[usize], samples: &[[Vec<Sample>; MODES.len()]]) -> Vec<String> {
    let names = MODES.map(|m| format!("{m:?}"));
    report::verdicts(&names, threads, |ti, m| {
        samples[ti][m].iter().map(Sample::faults_per_sec).collect()
    })
}
