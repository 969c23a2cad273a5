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

/// Binds the calling thread to the `i`-th CPU (modulo their number) of
/// those the process may run on; leaves it unbound if that fails.
pub fn pin_to_cpu(i: usize) {
    // SAFETY: cpu_set_t is a plain bit array, valid when zeroed.
    let mut allowed: libc::cpu_set_t = unsafe { core::mem::zeroed() };
    let size = core::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: `allowed` is a writable cpu_set_t of `size` bytes.
    if unsafe { libc::sched_getaffinity(0, size, &mut allowed) } != 0 {
        return;
    }
    let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
        .filter(|&c| {
            // SAFETY: `c` is below CPU_SETSIZE, the set's capacity.
            unsafe { libc::CPU_ISSET(c, &allowed) }
        })
        .collect();
    let Some(&cpu) = cpus.get(i % cpus.len().max(1)) else {
        return;
    };
    // SAFETY: as for `allowed`.
    let mut one: libc::cpu_set_t = unsafe { core::mem::zeroed() };
    // SAFETY: `cpu` came from the set, so it is below CPU_SETSIZE.
    unsafe { libc::CPU_SET(cpu, &mut one) };
    // SAFETY: `one` is a valid cpu_set_t of `size` bytes; 0 is this thread.
    unsafe { libc::sched_setaffinity(0, size, &one) };
}
