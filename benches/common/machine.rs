//! Helpers the examples and benches share: thread counts, the machine's
//! description, harmonic means, binding a thread to a CPU.
#![allow(dead_code)] // each includer uses part of it

/// Thread counts 1, 2, 4, ... below the core count, then the core count.
pub fn thread_counts() -> Vec<usize> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut v = vec![];
    let mut t = 1;
    while t < cores {
        v.push(t);
        t *= 2;
    }
    v.push(cores);
    v
}

/// "N cores, CPU model".
pub fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    format!("{cores} cores, {model}")
}

/// Harmonic mean (the mean of rates, as mmtests reports them).
pub fn hmean(xs: &[f64]) -> f64 {
    xs.len() as f64 / xs.iter().map(|x| 1.0 / x).sum::<f64>()
}

/// Parses `s` as a `T` that passes `ok`.
pub fn parse_arg<T: std::str::FromStr>(s: &str, ok: impl Fn(&T) -> bool) -> Option<T> {
    s.trim().parse().ok().filter(ok)
}

/// Parses a comma-separated list of thread counts (1..=1024).
pub fn parse_threads(s: &str) -> Option<Vec<usize>> {
    s.split(',')
        .map(|t| parse_arg(t, |&n: &usize| (1..=1024).contains(&n)))
        .collect()
}

/// Criterion's `iter_custom` body for a run that reports its own measured
/// seconds: the sum over `iters` runs.
pub fn timed_runs(iters: u64, mut run: impl FnMut() -> f64) -> std::time::Duration {
    (0..iters)
        .map(|_| std::time::Duration::from_secs_f64(run()))
        .sum()
}

/// Binds the calling thread to the `i`-th CPU (the workloads module's).
#[allow(unused_imports)] // each includer uses part of it
pub use aspace::workloads::pin_to_cpu;
