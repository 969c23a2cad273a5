#![allow(missing_docs)] // criterion_group! generates undocumented items
//! pft as criterion groups: faults through every locking mode, for each
//! workload and thread count (Throughput = faults): a first store per
//! page through a translator into frames used before, cleared on the
//! fault (pft's default, `Frames::Used`), and the per-thread workload
//! again with frames cleared when freed (`-zeroed`, `Config::zero_freed`).
//!
//! `cargo bench --bench pft` (one group: `cargo bench --bench pft -- 'single\+writer'`)
//!
//! It runs the same workload code as `examples/pft.rs`
//! (`common/pft_workload.rs`: fresh space, frames obtained in advance,
//! pinned faulters released by a barrier, only the faulting phase timed),
//! but each run faults 16 MiB per thread (4096 faults, 0.2-0.6 ms), where
//! the example faults up to 256 MiB (1 GiB with `--full`). Two things
//! weigh on so short a run that the example's longer ones average out:
//!
//! - **The first write of a VMA** prepares its anon_vma under the
//!   mmap_lock (read side) in every mode. Behind the `+writer` thread,
//!   which re-takes the write side as soon as it drops it, that one fault
//!   waited up to some 16 ms: `single+writer` PerVma at 1 thread measured
//!   0.81 M faults/s here against 9.1 M/s in the example. With the writer,
//!   the workload now gives every VMA its anon_vma before the timed phase
//!   (`give_anon_vmas`), in the bench and the example alike, and the rows
//!   at one thread agree (4.8 and 5.5 M/s PerVma, bench and example at
//!   16 MiB, on the loaded 2-core machine).
//! - **Faulters plus the writer above the core count**: at 2 threads on 2
//!   cores the writer shares a CPU with a faulter, and a run's wall time
//!   is mostly whether a scheduler slice (milliseconds) fell inside it.
//!   These rows (and any row on a loaded machine) order PerVma and
//!   Speculative either way from run to run.
//!
//! So this bench is for criterion's change detection, one machine, run
//! against run; PerVma against Speculative is read from the example's
//! tables (docs/RESULTS.md), whose runs are longer and alternate the modes
//! within each repetition.

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
                        huge: false,
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
