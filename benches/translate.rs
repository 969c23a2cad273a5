#![allow(missing_docs)] // criterion_group! generates undocumented items
//! The soft TLB as criterion groups: 8-byte loads over a hot 64-page
//! working set through a translator (1 and 2 threads), `mm.read` and a
//! plain slice (Throughput = loads); aligned loads, stores and a store
//! then a load of the same place of every width (at every aligned slot
//! of a word; the ratios to `u64` are printed by the `translate` example),
//! and a u32 load+store pair loop against a plain `Vec`
//! (Throughput = accesses or pairs); and flushes with and without busy
//! translators.
//!
//! `cargo bench --bench translate`

#[path = "common/machine.rs"]
mod machine;
#[path = "common/translate_workload.rs"]
mod translate_workload;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::time::Duration;
use translate_workload::*;

const LOADS: u64 = 1 << 16;

fn loads(c: &mut Criterion) {
    let mm = setup();
    let s = slice();
    let mut g = c.benchmark_group("translate/load8");
    g.throughput(Throughput::Elements(LOADS))
        .measurement_time(Duration::from_secs(2));
    g.bench_function("plain_slice", |b| b.iter(|| plain(&s, LOADS)));
    {
        let mut t = mm.translator();
        g.bench_function("translator_1t", |b| b.iter(|| translated(&mut t, LOADS)));
    }
    g.bench_function("mm_read", |b| b.iter(|| mm_read(&mm, LOADS)));
    for threads in [1, 2] {
        // Every thread does LOADS loads per iteration.
        g.throughput(Throughput::Elements(LOADS * threads as u64));
        g.bench_function(format!("translator_threads/{threads}"), |b| {
            b.iter_custom(|iters| {
                Duration::from_secs_f64(translated_threads(&mm, threads, iters * LOADS))
            })
        });
    }
    g.finish();

    let mut g = c.benchmark_group("translate/width");
    g.throughput(Throughput::Elements(LOADS))
        .measurement_time(Duration::from_secs(2));
    let mut v = slice();
    g.bench_function("plain_vec/load/u64", |b| b.iter(|| plain(&v, LOADS)));
    g.bench_function("plain_vec/store/u64", |b| {
        b.iter(|| plain_stores(&mut v, LOADS))
    });
    {
        let mut t = mm.translator();
        macro_rules! widths {
            ($($w:ty),*) => {$(
                let name = stringify!($w);
                g.bench_function(format!("translator/load/{name}"), |b| {
                    b.iter(|| loads_of::<$w>(&mut t, LOADS))
                });
                g.bench_function(format!("translator/store/{name}"), |b| {
                    b.iter(|| stores_of::<$w>(&mut t, LOADS))
                });
                g.bench_function(format!("translator/store_load/{name}"), |b| {
                    b.iter(|| store_loads_of::<$w>(&mut t, LOADS))
                });
            )*};
        }
        widths!(u8, u16, u32, u64);
        let mut p = vec![0u32; 2 * WORDS as usize];
        g.bench_function("plain_vec/load_store_pair/u32", |b| {
            b.iter(|| plain_pairs(&mut p, LOADS))
        });
        g.bench_function("translator/load_store_pair/u32", |b| {
            b.iter(|| pairs(&mut t, LOADS))
        });
    }
    g.finish();

    let mut g = c.benchmark_group("translate/flush");
    g.sample_size(10).measurement_time(Duration::from_secs(2));
    for (name, busy, own) in [("none", 0, false), ("two_threads_one_loading", 1, true)] {
        let tr = Translators { busy, idle: 0, own };
        g.bench_function(format!("mprotect_translators/{name}"), |b| {
            // One iteration is one mprotect pair (two flushes).
            b.iter_custom(|iters| {
                Duration::from_secs_f64(flush_ns(&mm, tr, iters) * 2.0 * iters as f64 / 1e9)
            })
        });
    }
    g.finish();
}

criterion_group!(benches, loads);
criterion_main!(benches);
