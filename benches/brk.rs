#![allow(missing_docs)] // criterion_group! generates undocumented items
//! The AIM7-like brk workload as criterion groups: K forked children each
//! running grow/touch/shrink jobs, brk fast path off and on
//! (Throughput = jobs).
//!
//! `cargo bench --bench brk`

#[path = "common/brk_workload.rs"]
mod brk_workload;
#[path = "common/machine.rs"]
mod machine;

use brk_workload::{run, Params};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use machine::thread_counts;
use std::time::Duration;

const JOBS_PER_CHILD: u64 = 2000;

fn brk(c: &mut Criterion) {
    let mut g = c.benchmark_group("aim7brk");
    g.sample_size(10)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_millis(500));
    for k in thread_counts() {
        for fast_path in [false, true] {
            g.throughput(Throughput::Elements(JOBS_PER_CHILD * k as u64));
            let id = BenchmarkId::new(
                if fast_path {
                    "fast-path-on"
                } else {
                    "fast-path-off"
                },
                k,
            );
            g.bench_with_input(id, &k, |b, &k| {
                b.iter_custom(|iters| {
                    let mut t = Duration::ZERO;
                    for _ in 0..iters {
                        t += run(&Params {
                            children: k,
                            fast_path,
                            grow_pages: 4,
                            heap_pages: 16,
                            duration: None,
                            jobs_per_child: Some(JOBS_PER_CHILD),
                        })
                        .elapsed;
                    }
                    t
                })
            });
        }
    }
    g.finish();
}

criterion_group!(benches, brk);
criterion_main!(benches);
