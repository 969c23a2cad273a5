//! kernel_pft: the host kernel's page-fault rate, the reference aspace's
//! pft is compared with (`pft --kernel` runs the same workload beside its
//! own tables in one process).
//!
//! ```text
//! cargo run --release --example kernel_pft -- [--threads 1,2] [--mib M] [--reps N]
//!     [--workload single|per-thread|interleaved] [--thp] [--no-pin]
//! ```
//!
//! Each thread writes a word to every page of its share of a fresh
//! `MAP_PRIVATE | MAP_ANONYMOUS` mapping advised `MADV_NOHUGEPAGE`, bound
//! to a CPU of its own, and the table gives faults/sec per thread count.
//! With `--thp` the mapping is 2 MiB-aligned and advised `MADV_HUGEPAGE`,
//! and the table gives GB/s (2 MiB faults where the kernel's THP mode is
//! `always` or `madvise`; see `/sys/kernel/mm/transparent_hugepage/enabled`).

#[path = "../benches/common/kernel_pft.rs"]
mod kernel_pft;
#[path = "../benches/common/machine.rs"]
mod machine;
#[path = "../benches/common/pft_workload.rs"]
mod pft_workload;

use machine::{hmean, machine, parse_arg, parse_threads, thread_counts};
use pft_workload::{Sample, Workload};

fn usage() -> ! {
    eprintln!(
        "usage: kernel_pft [--threads 1,2] [--mib M] [--reps N] \
         [--workload single|per-thread|interleaved] [--thp] [--no-pin]"
    );
    std::process::exit(2)
}

fn main() {
    let mut threads = thread_counts();
    threads.retain(|&n| n == 1 || n == *thread_counts().last().unwrap_or(&1));
    let (mut mib, mut reps, mut workload, mut thp, mut pin) =
        (128u64, 5usize, Workload::PerThread, false, true);
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = || it.next().unwrap_or_else(|| usage());
        match arg.as_str() {
            "--threads" => threads = parse_threads(&val()).unwrap_or_else(|| usage()),
            "--mib" => mib = parse_arg(&val(), |&n: &u64| n > 0).unwrap_or_else(|| usage()),
            "--reps" => reps = parse_arg(&val(), |&n: &usize| n > 0).unwrap_or_else(|| usage()),
            "--workload" => {
                workload = match val().as_str() {
                    "single" => Workload::Single,
                    "per-thread" => Workload::PerThread,
                    "interleaved" => Workload::Interleaved,
                    _ => usage(),
                }
            }
            "--thp" => thp = true,
            "--no-pin" => pin = false,
            _ => usage(),
        }
    }
    println!(
        "kernel pft on {}: {} MiB per thread, {} reps, {}, {}",
        machine(),
        mib,
        reps,
        workload.name(),
        if thp {
            "MADV_HUGEPAGE (GB/s)"
        } else {
            "MADV_NOHUGEPAGE (faults/sec)"
        }
    );
    for &t in &threads {
        let runs: Vec<Sample> = (0..reps)
            .map(|_| kernel_pft::run(t, workload, mib << 20, thp, pin))
            .collect();
        if thp {
            let gbs: Vec<f64> = runs
                .iter()
                .map(|s| kernel_pft::bytes_per_sec(s) / 1e9)
                .collect();
            println!("Hmean {:<16} {:>12.2}", format!("GB/s-{t}"), hmean(&gbs));
        } else {
            let per_sec: Vec<f64> = runs.iter().map(Sample::faults_per_sec).collect();
            let per_cpu: Vec<f64> = runs.iter().map(Sample::faults_per_cpu).collect();
            println!(
                "Hmean {:<16} {:>12.2}",
                format!("faults/cpu-{t}"),
                hmean(&per_cpu)
            );
            println!(
                "Hmean {:<16} {:>12.2}",
                format!("faults/sec-{t}"),
                hmean(&per_sec)
            );
        }
    }
}
