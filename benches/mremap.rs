#![allow(missing_docs)] // criterion_group! generates undocumented items
//! mremap as criterion groups: the mremap-heavy workload in the three
//! extent modes side by side, per thread count, without and with the
//! shootdown cost model (Throughput = mremap calls); and one move of a
//! populated, 2 MiB-aligned 1 GiB mapping against a one-page move.
//!
//! `cargo bench --bench mremap`

#[path = "common/machine.rs"]
mod machine;
#[path = "common/mremap_workload.rs"]
mod mremap_workload;

use aspace::{MremapExtent, PAGE_SIZE};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use machine::{thread_counts, timed_runs};
use mremap_workload::{mode_name, run, Mover, Params, Stop, MODES};
use std::time::Duration;

const OPS_PER_THREAD: u64 = 4000;
/// The cost model's setting for the "with cost" groups (ns per target CPU).
const COST_NS: u64 = 2000;

fn workload(c: &mut Criterion) {
    for cost_ns in [0, COST_NS] {
        let mut g = c.benchmark_group(format!("mremap/cost={cost_ns}ns"));
        g.sample_size(10)
            .measurement_time(Duration::from_secs(3))
            .warm_up_time(Duration::from_millis(500));
        for threads in thread_counts() {
            g.throughput(Throughput::Elements(threads as u64 * OPS_PER_THREAD));
            for mode in MODES {
                let p = Params {
                    threads,
                    mode,
                    cost_ns,
                    stop: Stop::Ops(OPS_PER_THREAD),
                };
                g.bench_with_input(BenchmarkId::new(mode_name(mode), threads), &p, |b, p| {
                    // Each run sets up in its workers, then releases them
                    // through a barrier; only the mremap phase counts.
                    b.iter_custom(|iters| timed_runs(iters, || run(*p).wall))
                });
            }
        }
        g.finish();
    }
}

fn big_move(c: &mut Criterion) {
    let mut g = c.benchmark_group("mremap/move");
    g.sample_size(10)
        .measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(200));
    for (name, len) in [("1page", PAGE_SIZE), ("1GiB", 1 << 30)] {
        for mode in [MremapExtent::Pmd, MremapExtent::Batched] {
            // Set up once: every iteration moves the same mapping.
            let mut m = Mover::new(mode, len);
            g.bench_function(BenchmarkId::new(mode_name(mode), name), |b| {
                b.iter_custom(|iters| (0..iters).map(|_| m.step()).sum())
            });
        }
    }
    g.finish();
}

criterion_group!(benches, workload, big_move);
criterion_main!(benches);
