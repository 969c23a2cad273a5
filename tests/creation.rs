//! Creation allocates nothing it does not need until first use (issue 14):
//! an idle address space owns its physical memory and nothing else (range
//! mode: its range lock and VMA forest too), gives back everything when
//! dropped, and is fully usable afterwards. Every writer locking is
//! checked in every build, whatever its default.
//!
//! A counting global allocator counts the allocations of the calling
//! thread only (tests run in parallel).

use aspace::mm::WriterLocking;
use aspace::{AddressSpace, Config, FrameAllocator, MapFlags, Prot};
use std::sync::Arc;

#[path = "common/counting.rs"]
mod counting;
use counting::{counted, still_live};

#[global_allocator]
static ALLOC: counting::Counting = counting::Counting;

/// What `AddressSpace::new` legitimately allocates: the physical memory it
/// owns, i.e. the `Arc<FrameAllocator>`, that allocator's `Arc<Budget>`
/// (shared with the page table, which charges its tables to it) and its
/// chunk directory (a slot per 1 GiB of budget; the chunks themselves come
/// on first use). Per-CPU arrays, the root page table, the VMA pool and
/// the tree's node cache all wait for their first use.
const NEW_ALLOCS: usize = 3;

/// What range mode (`WriterLocking::Range`) adds at creation, needed by
/// its first range writer: the range lock's shards and its gate, and the
/// VMA forest's slots with their two bit sets (one slot and one shard per
/// 512 GiB); with the bias (`Config::range_bias`), the one tree the forest
/// stays until a second writer comes.
fn range_allocs(bias: bool) -> usize {
    5 + usize::from(bias)
}

/// Bytes of those, at most, for the largest task size (2^47: 256 slots of
/// 512 GiB): the shards at 256 bytes each, the slots' trees at 128.
const RANGE_BYTES: usize = 100 << 10;

/// Every writer locking, with what its creation adds to [`NEW_ALLOCS`]
/// (whatever the build's default, so that each build checks all three).
fn lockings() -> [(&'static str, Config, usize); 3] {
    let range = |bias| Config {
        writer_locking: WriterLocking::Range,
        range_bias: bias,
        range_space_bias: true,
        ..Config::default()
    };
    [
        (
            "MmapLock",
            Config {
                writer_locking: WriterLocking::MmapLock,
                ..Config::default()
            },
            0,
        ),
        ("Range", range(true), range_allocs(true)),
        ("Range without its bias", range(false), range_allocs(false)),
    ]
}

fn warm_up() {
    // Process-wide one-time setup (CPU count, membarrier registration,
    // the epoch's thread registration) is not the space's.
    let mm = AddressSpace::new(Config::default());
    let a = mm
        .mmap(
            0,
            4096,
            Prot::READ | Prot::WRITE,
            MapFlags::PRIVATE | MapFlags::ANONYMOUS,
        )
        .unwrap();
    mm.write(a, b"warm").unwrap();
    drop(mm.fork().unwrap());
}

#[test]
fn creating_an_idle_space_allocates_only_its_physical_memory() {
    warm_up();
    // The physical memory's bytes, as MmapLock mode (first) makes them.
    let mut own_bytes = 0;
    for (name, cfg, extra) in lockings() {
        let (mm, seen) = counted(|| AddressSpace::new(cfg.clone()));
        let allocs = seen.allocs;
        assert!(
            allocs <= NEW_ALLOCS + extra,
            "{name}: AddressSpace::new made {allocs} allocations"
        );
        if extra == 0 {
            own_bytes = seen.bytes;
        } else {
            let bytes = seen.bytes.saturating_sub(own_bytes);
            assert!(bytes <= RANGE_BYTES, "{name}: {bytes} bytes more");
        }
        assert_eq!(still_live(), allocs, "{name}");
        drop(mm);
        assert_eq!(
            still_live(),
            0,
            "{name}: dropping the space frees all creation made"
        );
        // Nor does its fork: the child shares the parent's frames and
        // makes the rest on first use (range mode: but its lock and forest).
        // A first fork makes what the parent's whole-space lock keeps from
        // its first use (range mode without the bias: the lock's list of
        // holds), not counted; the child's lock, which fork takes, makes
        // its own.
        let mm = AddressSpace::new(cfg.clone());
        drop(mm.fork().unwrap());
        let holds = usize::from(!cfg.range_bias && extra > 0);
        let (child, seen) = counted(|| mm.fork().unwrap());
        assert_eq!(
            seen.allocs,
            extra + holds,
            "{name}: fork of an idle space made {} allocations",
            seen.allocs
        );
        drop(child);
    }
}

#[test]
fn a_space_on_a_shared_pool_allocates_nothing_until_used() {
    warm_up();
    let pool = Arc::new(FrameAllocator::new(64 << 20, true));
    for (name, cfg, extra) in lockings() {
        // On a given pool, a space needs nothing of its own until first
        // use (range mode: but its lock and forest).
        let (mm, seen) = counted(|| AddressSpace::with_pool(cfg.clone(), pool.clone()));
        assert_eq!(
            seen.allocs, extra,
            "{name}: with_pool made {} allocations",
            seen.allocs
        );
        assert!(seen.bytes <= RANGE_BYTES, "{name}: {} bytes", seen.bytes);
        drop(mm);
    }
}

#[test]
fn a_lazily_created_space_is_fully_usable() {
    let rw = Prot::READ | Prot::WRITE;
    let anon = MapFlags::PRIVATE | MapFlags::ANONYMOUS;
    let pool = Arc::new(FrameAllocator::new(64 << 20, true));
    let mm = AddressSpace::with_pool(Config::default(), pool.clone());
    assert_eq!(
        (mm.page_table_bytes(), mm.vma_objects(), mm.map_count()),
        (0, 0, 0)
    );
    // An idle space's child gets VMAs of its own.
    let early = mm.fork().unwrap();
    let a = mm.mmap(0, 3 * 4096, rw, anon).unwrap();
    mm.write(a + 4090, b"hello").unwrap();
    let mut buf = [0u8; 5];
    mm.read(a + 4090, &mut buf).unwrap();
    assert_eq!(&buf, b"hello");
    assert!(mm.page_table_bytes() > 0 && mm.vma_objects() == 1);
    let b = early.mmap(0, 4096, rw, anon).unwrap();
    early.write(b, b"early").unwrap();
    let child = mm.fork().unwrap();
    child.write(a + 4090, b"child").unwrap();
    mm.read(a + 4090, &mut buf).unwrap();
    assert_eq!(&buf, b"hello");
    child.read(a + 4090, &mut buf).unwrap();
    assert_eq!(&buf, b"child");
    early.read(b, &mut buf).unwrap();
    assert_eq!(&buf, b"early");
    mm.munmap(a, 3 * 4096).unwrap();
    assert_eq!(mm.map_count(), 0);
    child.read(a + 4090, &mut buf).unwrap();
    assert_eq!(&buf, b"child");
    drop((mm, child, early));
    assert_eq!(pool.used(), 0);
    assert_eq!(pool.memory().used(), 0);
}
