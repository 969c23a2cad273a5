//! A writer's call allocates nothing once the space is warm (issue 28):
//! the writers-only instance (reserve 6 GiB `PROT_NONE` with
//! `MAP_NORESERVE`, make its first MiB read-write, unmap it all) in
//! every writer locking, the range modes on both the space's bias and a
//! slot's. Tree nodes come from the writer's spare memory, VMAs from the
//! pool, the entries a store overwrites go in a kept list, and an
//! unmap's victims stay in place (`Edit::few_vmas_in`): a per-call
//! allocation here costs a malloc and a free in every call, and at two
//! threads an arena's slow paths.
//!
//! A counting global allocator counts the allocations of the calling
//! thread only (tests run in parallel).

use aspace::mm::WriterLocking;
use aspace::{AddressSpace, Config, MapFlags, Prot};

#[path = "common/counting.rs"]
mod counting;
use counting::counted;

#[global_allocator]
static ALLOC: counting::Counting = counting::Counting;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

/// Instances before counting (caches, pools and kept lists fill), then
/// counted.
const WARM: usize = 2_000;
const COUNTED: usize = 2_000;

/// Allocations allowed in [`COUNTED`] instances: none a call; a few for
/// the epoch's occasional bookkeeping.
const ALLOWED: usize = COUNTED / 100;

fn instance(mm: &AddressSpace) {
    let flags = MapFlags::PRIVATE | MapFlags::ANONYMOUS | MapFlags::NORESERVE;
    let base = mm.mmap(0, 6 * GIB, Prot::NONE, flags).unwrap();
    mm.mprotect(base, MIB, Prot::READ | Prot::WRITE).unwrap();
    mm.munmap(base, 6 * GIB).unwrap();
}

fn configs() -> Vec<(&'static str, Config)> {
    let range = |space_bias, window| Config {
        writer_locking: WriterLocking::Range,
        range_bias: true,
        range_space_bias: space_bias,
        placement_window: window,
        ..Config::default()
    };
    vec![
        (
            "MmapLock",
            Config {
                writer_locking: WriterLocking::MmapLock,
                ..Config::default()
            },
        ),
        ("Range, the space's bias", range(true, 0)),
        ("Range, a slot's bias", range(false, 0)),
        ("Range, a slot's bias, windows", range(false, 1 << 40)),
    ]
}

#[test]
fn writers_only_instances_allocate_nothing_once_warm() {
    for (name, cfg) in configs() {
        let mm = AddressSpace::new(cfg);
        for _ in 0..WARM {
            instance(&mm);
        }
        let ((), seen) = counted(|| {
            for _ in 0..COUNTED {
                instance(&mm);
            }
        });
        assert!(
            seen.allocs <= ALLOWED,
            "{name}: {} allocations in {COUNTED} instances",
            seen.allocs
        );
        assert!(mm.vmas().is_empty(), "{name}: every instance unmapped");
    }
}
