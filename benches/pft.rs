#![allow(missing_docs)] // criterion_group! generates undocumented items
//! pft as criterion groups: faults through every locking mode, for each
//! workload and thread count (Throughput = faults): a first store per
//! page through a translator into frames used before, cleared on the
//! fault (pft's default, `Frames::Used`), and the per-thread workload
//! again with frames cleared when freed (`-zeroed`, `Config::zero_freed`).
//!
//! `cargo bench --bench pft`

#[path = "common/machine.rs"]
mod machine;
#[path = "common/pft_workload.rs"]
mod pft_workload;

use aspace::FaultLocking;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use machine::{thread_counts, timed_runs};
use pft_workload::{Frames, Params, Workers, Workload};
use std::time::Duration;

const MIB_PER_THREAD: u64 = 16;
/// The small VMA size of the `-256k` group.
const SMALL_VMA: u64 = 256 << 10;

fn pft(c: &mut Criterion) {
    // The per-thread workload again in VMAs of 256 KiB (an emulator's
    // mappings, several per PTE table), without the writer.
    // And the per-thread workload with frames cleared when freed.
    let plan = [Workload::Single, Workload::PerThread, Workload::Interleaved]
        .into_iter()
        .flat_map(|w| {
            [
                (w, false, None, Frames::Used),
                (w, true, None, Frames::Used),
            ]
        })
        .chain([
            (Workload::PerThread, false, Some(SMALL_VMA), Frames::Used),
            (Workload::PerThread, false, None, Frames::Zeroed),
        ]);
    for (workload, writer, vma_bytes, frames) in plan {
        {
            let name = format!(
                "pft/{}{}{}{}",
                workload.name(),
                if vma_bytes.is_some() { "-256k" } else { "" },
                if frames == Frames::Zeroed {
                    "-zeroed"
                } else {
                    ""
                },
                if writer { "+writer" } else { "" }
            );
            let mut g = c.benchmark_group(name);
            g.sample_size(10)
                .measurement_time(Duration::from_secs(3))
                .warm_up_time(Duration::from_millis(500));
            for threads in thread_counts() {
                // Persistent workers, each bound to a CPU, released by a
                // barrier inside each measured run; setup and teardown are
                // not timed.
                let pool = Workers::new(threads, writer, true);
                let faults = threads as u64 * (MIB_PER_THREAD << 20) / aspace::PAGE_SIZE;
                g.throughput(Throughput::Elements(faults));
                for locking in [
                    FaultLocking::MmapLock,
                    FaultLocking::PerVma,
                    FaultLocking::Speculative,
                ] {
                    let p = Params {
                        threads,
                        workload,
                        writer,
                        locking,
                        bytes_per_thread: MIB_PER_THREAD << 20,
                        vma_bytes,
                        zero: true,
                        frames,
                    };
                    g.bench_with_input(
                        BenchmarkId::new(format!("{locking:?}"), threads),
                        &p,
                        |b, p| b.iter_custom(|iters| timed_runs(iters, || pool.run(*p).wall)),
                    );
                }
            }
            g.finish();
        }
    }
}

criterion_group!(benches, pft);
criterion_main!(benches);
