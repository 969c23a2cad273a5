//! Sizing a pft run (`examples/pft.rs`): probe runs that time one
//! thread per MiB, and the clamp that keeps points within the memory
//! available.

use super::pft_workload::{Frames, Params, Workers, Workload};
use aspace::FaultLocking;
use std::time::Instant;

/// What a probe run measured: the seconds one thread takes per MiB, for
/// the faulting phase alone and for a whole run (setup, faults, teardown).
#[derive(Clone, Copy)]
pub struct Probe {
    /// Seconds per MiB of the faulting phase.
    pub fault_s_per_mib: f64,
    /// Seconds per MiB of a whole run.
    pub run_s_per_mib: f64,
}

/// Times one full one-thread run of `mib` MiB of a table's workload in
/// one mode.
pub fn probe(
    wl: Workload,
    writer: bool,
    locking: FaultLocking,
    zero: bool,
    frames: Frames,
    mib: u64,
    vma_bytes: Option<u64>,
) -> Probe {
    let pool = Workers::new(1, writer, false);
    let t0 = Instant::now();
    let s = pool.run(Params {
        threads: 1,
        workload: wl,
        writer,
        locking,
        bytes_per_thread: mib << 20,
        vma_bytes,
        zero,
        frames,
        huge: false,
    });
    let run = t0.elapsed().as_secs_f64();
    Probe {
        fault_s_per_mib: s.wall.max(1e-6) / mib as f64,
        run_s_per_mib: run.max(1e-6) / mib as f64,
    }
}

/// MiB per thread, clamped to 4..=`max` and to what lets `max_threads`
/// threads fit in half of the memory available now (frames are real
/// memory).
pub fn clamp_mib(mib: f64, max: u64, max_threads: usize) -> u64 {
    let fit = available_mib().map_or(max, |m| m / 2 / max_threads.max(1) as u64);
    (mib as u64).clamp(4, max).min(fit.max(4))
}

/// `MemAvailable` from /proc/meminfo, in MiB.
fn available_mib() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024)
}
