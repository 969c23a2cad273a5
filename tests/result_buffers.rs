//! Result buffers an untrusted length asks for (`mincore`, `pagemap`)
//! are bounded by the space's memory budget, its pool's on a shared pool
//! (where `Config::memory_budget` is not used): measured with a counting
//! allocator, the largest single allocation of the call.
use aspace::{AddressSpace, Config, Error, FrameAllocator};

#[path = "common/counting.rs"]
mod counting;

#[global_allocator]
static ALLOC: counting::Counting = counting::Counting;

/// The largest allocation `f` makes on this thread.
fn largest_allocation<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let (r, seen) = counting::counted(f);
    (r, seen.largest)
}

const POOL_BUDGET: u64 = 16 << 20;

fn space_on_small_pool() -> AddressSpace {
    let pool = std::sync::Arc::new(FrameAllocator::new(POOL_BUDGET, true));
    // The pool's budget applies; `Config::memory_budget` (4 GiB by
    // default) "is not used" (AddressSpace::with_pool's docs).
    AddressSpace::with_pool(Config::default(), pool)
}

/// mincore's result takes a byte per page, allocated before the range is
/// looked at: on a space with a 16 MiB pool it was bounded by
/// `Config::memory_budget` (4 GiB, unused on a pool), and a 2^38-byte
/// range took 64 MiB before its `ENOMEM`.
#[test]
fn mincore_of_an_unmapped_range_allocates_within_the_pool_budget() {
    let mm = space_on_small_pool();
    let (r, big) = largest_allocation(|| mm.mincore(1 << 40, 1 << 38));
    assert_eq!(r, Err(Error::NoMem));
    assert!(
        big as u64 <= POOL_BUDGET,
        "mincore allocated {big} bytes on a space whose pool budget is {POOL_BUDGET}"
    );
}

/// pagemap's result takes 8 bytes per page: bounded by the pool's budget
/// too (a 2^37-byte range took 256 MiB on a 16 MiB pool).
#[test]
fn pagemap_allocates_within_the_pool_budget() {
    let mm = space_on_small_pool();
    let (r, big) = largest_allocation(|| mm.pagemap(1 << 40, 1 << 37).map(|v| v.len()));
    assert!(r.is_ok() || r == Err(Error::NoMem));
    assert!(
        big as u64 <= POOL_BUDGET,
        "pagemap allocated {big} bytes on a space whose pool budget is {POOL_BUDGET}"
    );
}
