//! Loom model of a user-mode read racing with mremap of the same page,
//! running the real AddressSpace through src/sync.rs.
//!
//! `./loom.sh --test loom_mremap` runs it (preemption bound 2, a few seconds). The
//! reader may hold the old translation (inside `begin_access`) while the
//! page moves; the move's TLB flush waits for it. Right after the move the page's new home is unmapped
//! (freeing the frame) and another mapping takes a frame and fills it, so
//! a reader that kept a stale translation past a flush would see the other
//! mapping's byte. It must see the moved data or a clean EFAULT.
#![cfg(aspace_loom)]

mod common;
use common::fixed;

use aspace::{AddressSpace, Config, MremapExtent, MremapFlags, Prot, PAGE_SIZE};
use loom::sync::Arc;
use loom::thread;

const A: u64 = 0x4000_0000;
const B: u64 = 0x5000_0000;
const C: u64 = 0x6000_0000;

fn read_vs_mremap(mode: MremapExtent) {
    // Bound and branch limit from the environment (loom.sh).
    let b = loom::model::Builder::new();
    b.check(move || {
        let mm = Arc::new(AddressSpace::new(Config {
            deferred_reclaim: true,
            memory_budget: 64 * PAGE_SIZE,
            mremap_extent: mode,
            ..Config::default()
        }));
        let rw = Prot::READ | Prot::WRITE;
        mm.mmap(A, PAGE_SIZE, rw, fixed()).unwrap();
        mm.write(A, &[0x5a]).unwrap();
        // The mover is spawned and the reader is this thread, which keeps
        // running after the spawn, so a preemption can stop the reader
        // anywhere inside its access (the window in which it holds a
        // translation included, see `AccessGuard::model_point`) and run
        // the mover. (Checked: with the flush's wait for in-flight accesses
        // removed, this model fails.)
        let m2 = mm.clone();
        let mover = thread::spawn(move || {
            let flags = MremapFlags::MAYMOVE | MremapFlags::FIXED;
            assert_eq!(m2.mremap(A, PAGE_SIZE, PAGE_SIZE, flags, B), Ok(B));
            m2.munmap(B, PAGE_SIZE).unwrap();
            m2.mmap(C, PAGE_SIZE, rw, fixed()).unwrap();
            m2.write(C, &[0x33]).unwrap();
        });
        let mut x = [0u8; 1];
        let r = mm.read(A, &mut x).map(|()| x[0]);
        mover.join().unwrap();
        assert!(
            matches!(r.map_err(|e| e.errno()), Ok(0x5a) | Err(14)),
            "{r:?}"
        );
        assert_eq!(mm.frames_used(), 1);
    });
}

#[test]
fn read_vs_mremap_batched() {
    read_vs_mremap(MremapExtent::Batched);
}

#[test]
fn read_vs_mremap_pages64() {
    read_vs_mremap(MremapExtent::Pages(64));
}

#[test]
fn read_vs_mremap_pmd() {
    read_vs_mremap(MremapExtent::Pmd);
}
