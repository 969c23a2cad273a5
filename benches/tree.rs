//! Range-tree benchmarks: point lookups against BTreeMap; lookups while a
//! writer churns, against RwLock<BTreeMap> (std and parking_lot) and
//! crossbeam's SkipMap; gap search against a linear scan.
//!
//! `cargo bench --bench tree`
#![allow(missing_docs)] // criterion_group! generates undocumented items

#[path = "../tests/common/rng.rs"]
mod rng;

use aspace::tree::RangeTree;
use aspace::Range;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use crossbeam_skiplist::SkipMap;
use rng::XorShift;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

const STRIDE: u64 = 0x4000;
const LEN: u64 = 0x3000;

/// Built in one pass, like the BTreeMap it is compared with (`collect`
/// bulk-builds full nodes too).
fn tree(n: u64) -> RangeTree<u64> {
    RangeTree::from_sorted((0..n).map(|i| (Range::new(i * STRIDE, i * STRIDE + LEN), i)))
        .expect("sorted, disjoint")
}

/// Built by one insert per range (nodes about half full).
fn tree_inserted(n: u64) -> RangeTree<u64> {
    let t = RangeTree::new();
    let mut w = t.writer();
    for i in 0..n {
        w.insert(Range::new(i * STRIDE, i * STRIDE + LEN), i)
            .unwrap();
    }
    drop(w);
    t
}

fn btree(n: u64) -> BTreeMap<u64, (u64, u64)> {
    (0..n)
        .map(|i| (i * STRIDE, (i * STRIDE + LEN, i)))
        .collect()
}

fn bt_find(m: &BTreeMap<u64, (u64, u64)>, a: u64) -> Option<u64> {
    m.range(..=a)
        .next_back()
        .filter(|(_, &(e, _))| a < e)
        .map(|(_, &(_, v))| v)
}

fn lookups(c: &mut Criterion) {
    let mut g = c.benchmark_group("tree/lookup");
    g.sample_size(20)
        .measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(300));
    const BATCH: u64 = 1024;
    g.throughput(Throughput::Elements(BATCH));
    for n in [1_000u64, 100_000] {
        let t = tree(n);
        let ti = tree_inserted(n);
        let m = btree(n);
        let mut rng = XorShift::new(7);
        let addrs: Vec<u64> = (0..BATCH).map(|_| rng.next_u64() % (n * STRIDE)).collect();
        for (name, t) in [("RangeTree", &t), ("RangeTree-inserted", &ti)] {
            g.bench_with_input(BenchmarkId::new(name, n), &n, |b, _| {
                b.iter(|| {
                    let g = t.pin();
                    let mut s = 0;
                    for &a in &addrs {
                        s += t.find(a, &g).map_or(0, |(_, v)| *v);
                    }
                    s
                })
            });
        }
        g.bench_with_input(BenchmarkId::new("BTreeMap", n), &n, |b, _| {
            b.iter(|| {
                addrs
                    .iter()
                    .map(|&a| bt_find(&m, a).unwrap_or(0))
                    .sum::<u64>()
            })
        });
    }
    g.finish();
}

/// A map under test while one writer churns insert/remove.
trait Shared: Send + Sync + 'static {
    fn name() -> &'static str;
    fn build(n: u64) -> Self;
    fn lookup(&self, a: u64) -> u64;
    fn churn(&self, k: u64, n: u64);
}

impl Shared for RangeTree<u64> {
    fn name() -> &'static str {
        "RangeTree"
    }
    fn build(n: u64) -> Self {
        tree(n)
    }
    fn lookup(&self, a: u64) -> u64 {
        let g = self.pin();
        self.find(a, &g).map_or(0, |(_, v)| *v)
    }
    fn churn(&self, k: u64, _n: u64) {
        let mut w = self.writer();
        let r = Range::new(k * STRIDE, k * STRIDE + LEN);
        w.remove(r.start);
        w.insert(r, k).unwrap();
    }
}

impl Shared for std::sync::RwLock<BTreeMap<u64, (u64, u64)>> {
    fn name() -> &'static str {
        "std-RwLock-BTreeMap"
    }
    fn build(n: u64) -> Self {
        std::sync::RwLock::new(btree(n))
    }
    fn lookup(&self, a: u64) -> u64 {
        bt_find(&self.read().unwrap(), a).unwrap_or(0)
    }
    fn churn(&self, k: u64, _n: u64) {
        let mut m = self.write().unwrap();
        m.remove(&(k * STRIDE));
        m.insert(k * STRIDE, (k * STRIDE + LEN, k));
    }
}

impl Shared for parking_lot::RwLock<BTreeMap<u64, (u64, u64)>> {
    fn name() -> &'static str {
        "pl-RwLock-BTreeMap"
    }
    fn build(n: u64) -> Self {
        parking_lot::RwLock::new(btree(n))
    }
    fn lookup(&self, a: u64) -> u64 {
        bt_find(&self.read(), a).unwrap_or(0)
    }
    fn churn(&self, k: u64, _n: u64) {
        let mut m = self.write();
        m.remove(&(k * STRIDE));
        m.insert(k * STRIDE, (k * STRIDE + LEN, k));
    }
}

impl Shared for SkipMap<u64, (u64, u64)> {
    fn name() -> &'static str {
        "SkipMap"
    }
    fn build(n: u64) -> Self {
        let m = SkipMap::new();
        for i in 0..n {
            m.insert(i * STRIDE, (i * STRIDE + LEN, i));
        }
        m
    }
    fn lookup(&self, a: u64) -> u64 {
        self.upper_bound(std::ops::Bound::Included(&a))
            .filter(|e| a < e.value().0)
            .map_or(0, |e| e.value().1)
    }
    fn churn(&self, k: u64, _n: u64) {
        self.remove(&(k * STRIDE));
        self.insert(k * STRIDE, (k * STRIDE + LEN, k));
    }
}

/// Runs `readers` lookup threads and one churning writer for the measured
/// time; returns total lookups, writer ops and the elapsed time.
fn contended<M: Shared>(
    m: &Arc<M>,
    n: u64,
    readers: usize,
    per_reader: u64,
) -> (u64, u64, Duration) {
    let start = Arc::new(Barrier::new(readers + 2));
    let stop = Arc::new(AtomicBool::new(false));
    let wops = Arc::new(AtomicU64::new(0));
    let w = {
        let (m, start, stop, wops) = (m.clone(), start.clone(), stop.clone(), wops.clone());
        std::thread::spawn(move || {
            let mut rng = XorShift::new(3);
            start.wait();
            while !stop.load(Ordering::Relaxed) {
                m.churn(rng.next_u64() % n, n);
                wops.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let rs: Vec<_> = (0..readers)
        .map(|i| {
            let (m, start) = (m.clone(), start.clone());
            std::thread::spawn(move || {
                let mut rng = XorShift::new(11 + i as u64);
                start.wait();
                let mut s = 0;
                for _ in 0..per_reader {
                    s += m.lookup(rng.next_u64() % (n * STRIDE));
                }
                s
            })
        })
        .collect();
    start.wait();
    let t0 = Instant::now();
    for r in rs {
        criterion::black_box(r.join().unwrap());
    }
    let el = t0.elapsed();
    stop.store(true, Ordering::Relaxed);
    w.join().unwrap();
    (
        per_reader * readers as u64,
        wops.load(Ordering::Relaxed),
        el,
    )
}

fn bench_contended<M: Shared>(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    n: u64,
    readers: usize,
) {
    let m = Arc::new(M::build(n));
    const PER_READER: u64 = 100_000;
    g.throughput(Throughput::Elements(PER_READER * readers as u64));
    let mut report = (0u64, 0u64, Duration::ZERO);
    g.bench_function(BenchmarkId::new(M::name(), format!("{readers}r+1w")), |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let (l, w, el) = contended(&m, n, readers, PER_READER);
                total += el;
                report = (report.0 + l, report.1 + w, report.2 + el);
            }
            total
        })
    });
    let secs = report.2.as_secs_f64().max(1e-9);
    eprintln!(
        "  {} {}r+1w: {:.2} M lookups/s, writer {:.3} M ops/s",
        M::name(),
        readers,
        report.0 as f64 / secs / 1e6,
        report.1 as f64 / secs / 1e6
    );
}

fn under_writer(c: &mut Criterion) {
    let n = 100_000;
    let cores = std::thread::available_parallelism().map_or(2, |x| x.get());
    let mut counts = vec![1, 2];
    if cores > 3 {
        counts.push(cores - 1);
    }
    let mut g = c.benchmark_group("tree/under-writer");
    g.sample_size(10)
        .measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(300));
    for readers in counts {
        bench_contended::<RangeTree<u64>>(&mut g, n, readers);
        bench_contended::<std::sync::RwLock<BTreeMap<u64, (u64, u64)>>>(&mut g, n, readers);
        bench_contended::<parking_lot::RwLock<BTreeMap<u64, (u64, u64)>>>(&mut g, n, readers);
        bench_contended::<SkipMap<u64, (u64, u64)>>(&mut g, n, readers);
    }
    g.finish();
}

fn gap_search(c: &mut Criterion) {
    // 100,000 ranges with holes of varying size; search for a size that
    // only a few holes near the top can hold.
    let n = 100_000u64;
    let t = RangeTree::new();
    let mut ranges = Vec::with_capacity(n as usize);
    {
        let mut w = t.writer();
        let mut a = 0x1000u64;
        for i in 0..n {
            let hole = if i % 9973 == 9972 { 64 } else { 1 + i % 7 } * 0x1000;
            w.insert(Range::new(a, a + 0x1000), i).unwrap();
            ranges.push((a, a + 0x1000));
            a += 0x1000 + hole;
        }
    }
    let size = 32 * 0x1000;
    let mut g = c.benchmark_group("tree/gap-search");
    g.sample_size(20)
        .measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(300));
    g.bench_function("gap-tracked", |b| {
        b.iter(|| {
            let g = t.pin();
            t.gap_lowest(0, u64::MAX, size, 0x1000, &g)
        })
    });
    g.bench_function("linear-scan", |b| {
        b.iter(|| {
            let mut prev_end = 0;
            for &(s, e) in &ranges {
                if s - prev_end >= size {
                    return Some(prev_end);
                }
                prev_end = e;
            }
            Some(prev_end)
        })
    });
    g.finish();
}

criterion_group!(benches, lookups, under_writer, gap_search);
criterion_main!(benches);
