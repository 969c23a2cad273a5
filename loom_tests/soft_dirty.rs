//! Loom model of soft-dirty tracking: `clear_refs(SoftDirty)` against a
//! fault at the same page, running the real AddressSpace through
//! src/sync.rs (see `loom_tests/fault.rs` for the setup conventions).
#![cfg(aspace_loom)]

mod common;
use common::{cfg, model, rw};

use aspace::{Access, AddressSpace, ClearRefs, MapFlags, PAGE_SIZE};
use loom::sync::Arc;
use loom::thread;

const A: u64 = 0x4000_0000;

/// A read fault in a shared mapping (whose VMA is soft-dirty, so the
/// fault may map the page writable) races the soft-dirty reset. However
/// they interleave, the write after the reset faults and is recorded: the
/// fault either finished before the reset's pass over the entries (which
/// write-protects what it installed) or read the VMA's flags after the
/// reset (and mapped the page read-only).
///
/// Mutation caught: `clear_soft_dirty` (src/mm/soft_dirty.rs) clearing the
/// VMA bit without write-locking the VMA (`ed.lock(v)` removed): a per-VMA
/// fault that read the old flags installs a writable, clean entry after
/// the pass, and the next write is lost.
#[test]
fn shared_read_fault_vs_reset() {
    model(|| {
        let mm = Arc::new(AddressSpace::new(cfg()));
        let shared = MapFlags::SHARED | MapFlags::ANONYMOUS | MapFlags::FIXED;
        mm.mmap(A, PAGE_SIZE, rw(), shared).unwrap();
        // The object's page exists: the race allocates nothing.
        common::emptied_with_neighbour(&mm, A);
        let m2 = mm.clone();
        let t = thread::spawn(move || m2.fault(A, Access::Read));
        mm.clear_refs(ClearRefs::SoftDirty);
        t.join().unwrap().unwrap();
        mm.write(A, &[2]).unwrap();
        let pm = mm.pagemap(A, PAGE_SIZE).unwrap();
        assert!(pm[0].is_soft_dirty(), "the write after the reset is lost");
    });
}
