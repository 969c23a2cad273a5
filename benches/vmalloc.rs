//! vmalloc/vfree pairs per job: GlobalLock against PerCpu zones.
//!
//! `cargo bench --bench vmalloc`
#![allow(missing_docs)] // criterion_group! generates undocumented items

#[path = "common/vmalloc_workload.rs"]
mod vmalloc_workload;

use aspace::vmap::Mode;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::time::Duration;
use vmalloc_workload::{run, Sizes};

fn vmalloc(c: &mut Criterion) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    const PAIRS: u64 = 20_000;
    for (name, sizes) in [("1page", Sizes::OnePage), ("random64", Sizes::Random64)] {
        let mut g = c.benchmark_group(format!("vmalloc/{name}"));
        g.sample_size(10)
            .measurement_time(Duration::from_secs(2))
            .warm_up_time(Duration::from_millis(300));
        for jobs in (1..=cores).filter(|j| j.is_power_of_two() || *j == cores) {
            g.throughput(Throughput::Elements(PAIRS * jobs as u64));
            for mode in [Mode::GlobalLock, Mode::PerCpu] {
                g.bench_with_input(
                    BenchmarkId::new(format!("{mode:?}"), jobs),
                    &jobs,
                    |b, &jobs| {
                        b.iter_custom(|iters| {
                            (0..iters).map(|_| run(mode, jobs, PAIRS, sizes)).sum()
                        })
                    },
                );
            }
        }
        g.finish();
    }
}

criterion_group!(benches, vmalloc);
criterion_main!(benches);
