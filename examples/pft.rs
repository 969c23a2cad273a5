//! pft: page-fault scaling, PerVma and Speculative against MmapLock, in
//! the shape of mmtests' compare-kernels table.
//!
//! ```text
//! cargo run --release --example pft -- [--threads 1,2,4] [--reps 5]
//!     [--workload single|per-thread|interleaved|all] [--writer|--no-writer]
//!     [--mib M] [--no-zero] [--csv FILE] [--plot FILE.svg]
//! ```
//!
//! By default: threads 1, 2, 4, ... up to the core count; both workloads;
//! rows without and with a concurrent mmap/mprotect/munmap writer; the
//! memory per thread sized so that a one-thread point takes about 0.2 s.
//! The worker threads persist across repetitions and modes (a barrier
//! releases them), so only the faulting phase is timed.

#[path = "../benches/common/machine.rs"]
mod machine;
#[path = "../benches/common/pft_workload.rs"]
mod pft_workload;

use aspace::FaultLocking;
use machine::{hmean, machine, parse_arg, parse_threads, thread_counts};
use pft_workload::{Params, Sample, Workers, Workload};
use std::fmt::Write as _;
use std::io::Write as _;

struct Args {
    threads: Vec<usize>,
    reps: usize,
    workloads: Vec<Workload>,
    writer: Vec<bool>,
    /// MiB each thread faults per repetition; `None` = calibrate.
    mib: Option<u64>,
    zero: bool,
    csv: Option<String>,
    plot: Option<String>,
}

fn usage() -> ! {
    eprintln!(
        "usage: pft [--threads 1,2,4] [--reps N] [--workload single|per-thread|interleaved|all] \
         [--writer|--no-writer] [--mib M] [--no-zero] [--csv FILE] [--plot FILE.svg]"
    );
    std::process::exit(2)
}

fn parse() -> Args {
    let mut a = Args {
        threads: thread_counts(),
        reps: 5,
        workloads: vec![Workload::Single, Workload::PerThread],
        writer: vec![false, true],
        mib: None,
        zero: true,
        csv: None,
        plot: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = || it.next().unwrap_or_else(|| usage());
        match arg.as_str() {
            "--threads" => a.threads = parse_threads(&val()).unwrap_or_else(|| usage()),
            "--reps" => a.reps = parse_arg(&val(), |&n: &usize| n > 0).unwrap_or_else(|| usage()),
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
            "--no-zero" => a.zero = false,
            "--csv" => a.csv = Some(val()),
            "--plot" => a.plot = Some(val()),
            "-h" | "--help" => usage(),
            _ => usage(),
        }
    }
    a
}

fn range(xs: &[f64]) -> (f64, f64) {
    let lo = xs.iter().cloned().fold(f64::INFINITY, f64::min);
    let hi = xs.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    (lo, hi)
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

/// MiB per thread that makes a one-thread point take about 0.2 s: one
/// probe run of 16 MiB through the per-VMA path, scaled, clamped to
/// 8..=1024 MiB, and to what lets `max_threads` threads fit in half of the
/// memory available now (frames are real memory).
fn calibrate(zero: bool, max_threads: usize) -> u64 {
    const PROBE_MIB: u64 = 16;
    let pool = Workers::new(1, false);
    let s = pool.run(Params {
        threads: 1,
        workload: Workload::PerThread,
        writer: false,
        locking: FaultLocking::PerVma,
        bytes_per_thread: PROBE_MIB << 20,
        zero,
    });
    let fit = available_mib().map_or(1024, |m| m / 2 / max_threads.max(1) as u64);
    ((PROBE_MIB as f64 * 0.2 / s.wall.max(1e-6)) as u64)
        .clamp(8, 1024)
        .min(fit.max(8))
}

/// `MemAvailable` from /proc/meminfo, in MiB.
fn available_mib() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024)
}

fn main() {
    let mut args = parse();
    let max_threads = args.threads.iter().copied().max().unwrap_or(1);
    let mib = *args
        .mib
        .get_or_insert_with(|| calibrate(args.zero, max_threads));
    println!(
        "pft on {} ({} MiB per thread per rep, {} reps, zeroing {})",
        machine(),
        mib,
        args.reps,
        if args.zero { "on" } else { "off" }
    );
    let mut csv = String::from("workload,writer,locking,threads,rep,faults,wall_s,faults_per_sec,faults_per_cpu,per_vma_faults,writer_ops,speculative_faults,spec_aborts\n");
    let mut plot_series: Vec<(String, Vec<(usize, f64)>)> = Vec::new();
    for &wl in &args.workloads {
        for &writer in &args.writer {
            let title = format!("{}{}", wl.name(), if writer { " + writer" } else { "" });
            let mut rows: Vec<Point> = Vec::new();
            let mut per_mode_sec: [Vec<(usize, f64)>; MODES.len()] = Default::default();
            for &threads in &args.threads {
                let pool = Workers::new(threads, writer);
                let mut samples: [Vec<Sample>; MODES.len()] = Default::default();
                for rep in 0..args.reps {
                    // Alternate the modes so drift hits both alike.
                    for (m, locking) in MODES.into_iter().enumerate() {
                        eprint!(
                            "\r{title}: {threads} threads, rep {}/{} {:?}        ",
                            rep + 1,
                            args.reps,
                            locking
                        );
                        let _ = std::io::stderr().flush();
                        let s = pool.run(Params {
                            threads,
                            workload: wl,
                            writer,
                            locking,
                            bytes_per_thread: mib << 20,
                            zero: args.zero,
                        });
                        let _ = writeln!(
                            csv,
                            "{},{},{:?},{},{},{},{:.6},{:.1},{:.1},{},{},{},{}",
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
                            s.spec_aborts
                        );
                        samples[m].push(s);
                    }
                }
                let cpu = |m: usize| {
                    samples[m]
                        .iter()
                        .map(Sample::faults_per_cpu)
                        .collect::<Vec<_>>()
                };
                let sec = |m: usize| {
                    samples[m]
                        .iter()
                        .map(Sample::faults_per_sec)
                        .collect::<Vec<_>>()
                };
                rows.push(Point {
                    label: format!("faults/cpu-{threads}"),
                    by_mode: core::array::from_fn(cpu),
                });
                rows.push(Point {
                    label: format!("faults/sec-{threads}"),
                    by_mode: core::array::from_fn(sec),
                });
                for (m, series) in per_mode_sec.iter_mut().enumerate() {
                    series.push((threads, hmean(&sec(m))));
                }
            }
            eprint!("\r{:70}\r", "");
            println!("\n{title}");
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
            for (m, series) in per_mode_sec.iter().enumerate() {
                plot_series.push((format!("{title}, {:?}", MODES[m]), series.clone()));
            }
        }
    }
    if let Some(path) = &args.csv {
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
