//! The translator's row of writers beyond munmap and mprotect
//! (`translator.rs`): writers after which the page's old frame lives on
//! elsewhere (moved, shared with a fork child, or freed and taken by a
//! new page at `B`). A thread's translator caches the writable entry of
//! `A` and stores 7 through it while the main thread runs the writer; a
//! store may land before the writer returns, or afterwards through a
//! fresh translation, but never through the stale entry into the frame's
//! new life: what the writer's snapshot read right after it returned
//! never changes.
//!
//! Each catches: deleting the wait in `tlb::shoot_translators`
//! (`if !done() { wait_until(done) }`, src/tlb/mod.rs): a store whose
//! access began before the flush lands in the frame after the writer
//! returned.
#![cfg(aspace_loom)]

mod common;
use common::{cfg, fixed, model, rw};

use aspace::{AddressSpace, Advice, MapFlags, Memfd, MremapFlags, PAGE_SIZE};
use loom::sync::Arc;
use loom::thread;

const A: u64 = 0x4000_0000;
const B: u64 = 0x5000_0000;
const C: u64 = 0x6000_0000;

/// Reads one byte.
fn byte(mm: &AddressSpace, at: u64) -> u8 {
    let mut x = [0u8; 1];
    mm.read(at, &mut x).unwrap();
    x[0]
}

/// Maps a fresh page at `B` and writes 0 to it: it takes the frame the
/// writer just freed, if any.
fn reuse_at_b(mm: &AddressSpace) -> u8 {
    mm.mmap(B, PAGE_SIZE, rw(), fixed()).unwrap();
    mm.write(B, &[0]).unwrap();
    0
}

/// The race: `setup` maps `A` (written: 1), the thread stores 7 there
/// through its translator, `writer` returns `(space to look at, address,
/// byte read right after it returned)`, and that byte must still be there
/// after the join.
fn store_vs(
    setup: fn(&AddressSpace) -> Option<Memfd>,
    writer: fn(&AddressSpace, Option<&Memfd>) -> (Option<AddressSpace>, u64, u8),
) {
    model(move || {
        let mm = Arc::new(AddressSpace::new(cfg()));
        let obj = setup(&mm);
        mm.write(A, &[1]).unwrap();
        let m2 = mm.clone();
        let t = thread::spawn(move || {
            let mut tr = m2.translator();
            let _ = tr.load::<u8>(A);
            let _ = tr.store::<u8>(A, 7);
        });
        let (other, at, seen) = writer(&mm, obj.as_ref());
        t.join().unwrap();
        let space = other.as_ref().unwrap_or(&mm);
        assert_eq!(
            byte(space, at),
            seen,
            "a store landed after the writer returned"
        );
    });
}

fn anon(mm: &AddressSpace) -> Option<Memfd> {
    mm.mmap(A, PAGE_SIZE, rw(), fixed()).unwrap();
    None
}

/// mremap moves `A`'s page to `C`.
#[test]
fn translator_store_vs_mremap_move() {
    store_vs(anon, |mm, _| {
        let f = MremapFlags::MAYMOVE | MremapFlags::FIXED;
        mm.mremap(A, PAGE_SIZE, PAGE_SIZE, f, C).unwrap();
        (None, C, byte(mm, C))
    });
}

/// mremap(MREMAP_DONTUNMAP) moves the page to `C` and leaves `A` mapped
/// and empty (a later store there faults in a page of its own).
#[test]
fn translator_store_vs_mremap_dontunmap() {
    store_vs(anon, |mm, _| {
        let f = MremapFlags::MAYMOVE | MremapFlags::FIXED | MremapFlags::DONTUNMAP;
        mm.mremap(A, PAGE_SIZE, PAGE_SIZE, f, C).unwrap();
        (None, C, byte(mm, C))
    });
}

/// mremap shrinks a two-page VMA at `A - PAGE_SIZE` to its first page,
/// freeing `A`'s frame, which `B` then takes.
#[test]
fn translator_store_vs_mremap_shrink() {
    store_vs(
        |mm| {
            mm.mmap(A - PAGE_SIZE, 2 * PAGE_SIZE, rw(), fixed())
                .unwrap();
            None
        },
        |mm, _| {
            let r = mm.mremap(
                A - PAGE_SIZE,
                2 * PAGE_SIZE,
                PAGE_SIZE,
                MremapFlags::empty(),
                0,
            );
            assert_eq!(r, Ok(A - PAGE_SIZE));
            (None, B, reuse_at_b(mm))
        },
    );
}

/// MADV_DONTNEED frees `A`'s frame, which `B` then takes.
#[test]
fn translator_store_vs_dontneed() {
    store_vs(anon, |mm, _| {
        mm.madvise(A, PAGE_SIZE, Advice::DontNeed).unwrap();
        (None, B, reuse_at_b(mm))
    });
}

/// MADV_FREE frees `A`'s frame (at once here), which `B` then takes.
#[test]
fn translator_store_vs_madv_free() {
    store_vs(anon, |mm, _| {
        mm.madvise(A, PAGE_SIZE, Advice::Free).unwrap();
        (None, B, reuse_at_b(mm))
    });
}

/// fork shares `A`'s frame with the child, copy-on-write: the child's
/// page never changes after fork returned.
#[test]
fn translator_store_vs_fork() {
    store_vs(anon, |mm, _| {
        let child = mm.fork().unwrap();
        let seen = byte(&child, A);
        (Some(child), A, seen)
    });
}

/// A shrink of the memory object `A` maps (shared) to nothing frees its
/// page, which `B` then takes.
#[test]
fn translator_store_vs_memfd_shrink() {
    store_vs(
        |mm| {
            let m = Memfd::new_in(mm.frame_pool(), "t", PAGE_SIZE).unwrap();
            let f = MapFlags::SHARED | MapFlags::FIXED;
            mm.mmap_fd(A, PAGE_SIZE, rw(), f, &m, 0).unwrap();
            Some(m)
        },
        |mm, m| {
            m.unwrap().set_len(0).unwrap();
            (None, B, reuse_at_b(mm))
        },
    );
}
