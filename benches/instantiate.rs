#![allow(missing_docs)] // criterion_group! generates undocumented items
//! The instantiation workload as criterion groups
//! (`aspace::workloads::instantiate`, the code `examples/instantiate.rs`
//! runs): instances and writers-only, every mode of
//! `aspace::workloads::MODES`, separate `PerVma` spaces (one per thread:
//! `aspace::workloads::Separate`, the no-sharing ideal) and the running
//! kernel, at each thread count (Throughput = instances). Each measured run is a fixed
//! [`INSTANCES`] per thread on one address space per mode, threads bound
//! to CPUs and released by a barrier; only the instances are timed.
//!
//! `cargo bench --bench instantiate` (one group:
//! `cargo bench --bench instantiate -- writers-only`; about 30 s in all).
//! For change detection; the modes against each other and against the
//! kernel are read from the example's tables (docs/RESULTS.md), which
//! alternate them within each repetition and run each point for a
//! second. The two differ on the kernel: its rate falls over a run (on
//! the loaded 2-core VM, writers-only at 1 thread, `--instances 32`:
//! 90k instances/s, `--instances 1000`: 28k/s, `--seconds 1`: 32k/s,
//! while MmapLock was 190k-430k/s throughout), so this bench's 32-instance
//! runs show the kernel several times faster than the example does.

#[path = "common/machine.rs"]
mod machine;

use aspace::workloads::instantiate::{self, Kind, Params, Until};
use aspace::workloads::{Kernel, Separate, Space, MODES};
use criterion::{criterion_group, criterion_main, BenchmarkGroup, BenchmarkId, Criterion};
use criterion::{measurement::WallTime, Throughput};
use machine::{thread_counts, timed_runs};
use std::time::Duration;

/// Instances per thread per measured run.
const INSTANCES: u64 = 32;

fn bench_space<S: Space>(g: &mut BenchmarkGroup<WallTime>, name: &str, space: &S, p: Params) {
    g.bench_with_input(BenchmarkId::new(name, p.threads), &p, |b, p| {
        b.iter_custom(|iters| {
            timed_runs(iters, || {
                instantiate::run(space, p).expect("instances").wall
            })
        })
    });
}

fn instantiate(c: &mut Criterion) {
    for kind in [Kind::Instances, Kind::WritersOnly] {
        let mut g = c.benchmark_group(format!("instantiate/{}", kind.name()));
        g.sample_size(10)
            .measurement_time(Duration::from_secs(1))
            .warm_up_time(Duration::from_millis(200));
        for threads in thread_counts() {
            g.throughput(Throughput::Elements(threads as u64 * INSTANCES));
            let p = Params {
                threads,
                kind,
                until: Until::Instances(INSTANCES),
                check: false,
                pin: true,
            };
            for mode in MODES {
                bench_space(&mut g, mode.name, &mode.space(), p);
            }
            let per_vma = MODES.iter().find(|m| m.name == "PerVma");
            let separate = Separate::new(per_vma.expect("MODES has PerVma"), threads);
            bench_space(&mut g, "separate", &separate, p);
            // SAFETY: only the driver uses it, on the mappings it makes.
            bench_space(&mut g, "kernel", &unsafe { Kernel::new() }, p);
        }
        g.finish();
    }
}

criterion_group!(benches, instantiate);
criterion_main!(benches);
