//! Loom models of forced writes (`write_forced`, `mm/forced.rs`) against
//! the writers that can change the page under them. The page at `A` is
//! private `r-x` and already holds its own forced copy (read-only entry,
//! frame referenced by that entry alone), so a forced write there takes
//! the lookup-check-copy path at once: it holds the mmap_lock read side
//! and copies inside a counted access.
//!
//! The other writers of the matrix's "forced access" column either take
//! the mmap_lock write side (serialized) or zap and flush as DONTNEED does
//! (see `loom_tests/matrix.rs`).
#![cfg(aspace_loom)]

mod common;
use common::{cfg, fixed, model, rw};

use aspace::{AddressSpace, Advice, Prot, PAGE_SIZE};
use loom::sync::Arc;
use loom::thread;

const A: u64 = 0x4000_0000;
const B: u64 = 0x5000_0000;

/// A space with `A` mapped `r-x`, its page forced to a private copy of
/// zeros.
fn text_space() -> Arc<AddressSpace> {
    let mm = Arc::new(AddressSpace::new(cfg()));
    mm.mmap(A, PAGE_SIZE, Prot::READ | Prot::EXEC, fixed())
        .unwrap();
    mm.write_forced(A, &[0; 16]).unwrap();
    mm
}

fn bytes<const N: usize>(mm: &AddressSpace, at: u64) -> [u8; N] {
    let mut b = [0u8; N];
    mm.read(at, &mut b).unwrap();
    b
}

/// fork races a thread writing forced twice into the `r-x` page (byte 0,
/// then byte 8). Fork shares the page copy-on-write without a flush (its
/// entry is read-only already), so only the mmap_lock keeps a forced
/// write that found the page its own from landing in the frame the child
/// now shares. The child's page must be that of one instant: what it
/// reads right after fork never changes, and never shows the second
/// write without the first.
///
/// Mutation caught: `forced_page` (src/mm/forced.rs) not taking the
/// mmap_lock (`let st = self.mmap_lock.read();` replaced by
/// `let st = ();`): the first write checks the page is its own, fork
/// shares it, and the write lands in the child's page after fork returned.
#[test]
fn forced_write_vs_fork() {
    model(|| {
        let mm = text_space();
        let m2 = mm.clone();
        let t = thread::spawn(move || {
            m2.write_forced(A, &[1]).unwrap();
            m2.write_forced(A + 8, &[1]).unwrap();
        });
        let child = mm.fork().unwrap();
        let first: [u8; 9] = bytes(&child, A);
        t.join().unwrap();
        let later: [u8; 9] = bytes(&child, A);
        assert_eq!(first, later, "the child saw a forced write made after fork");
        assert!(
            first[8] == 0 || first[0] == 1,
            "the child saw the second write without the first: {first:?}"
        );
        let parent: [u8; 9] = bytes(&mm, A);
        assert_eq!((parent[0], parent[8]), (1, 1));
    });
}

/// MADV_DONTNEED (under the mmap_lock read side, like the forced write)
/// zaps `A` and frees its frame, which a fresh page at `B` then takes. A
/// forced write of 7 may land before the zap (then `A` reads 0) or after
/// it into a new copy (then 7), never in the frame's new life at `B`.
///
/// Mutation caught: `forced_page` (src/mm/forced.rs) ending its counted
/// access before the copy (`acc.model_point();` replaced by
/// `drop(acc);`): DONTNEED's flush no longer waits for the copy, frees
/// the frame, `B` takes it, and the 7 lands in `B` (loom reports the
/// copy racing the frame's zeroing for `B` as a causality violation on
/// the frame's cell). Each model explores in about a second at the
/// `loom.sh` bound.
#[test]
fn forced_write_vs_dontneed() {
    model(|| {
        let mm = text_space();
        mm.mmap(B, PAGE_SIZE, rw(), fixed()).unwrap();
        let m2 = mm.clone();
        let t = thread::spawn(move || m2.write_forced(A, &[7]).unwrap());
        mm.madvise(A, PAGE_SIZE, Advice::DontNeed).unwrap();
        mm.write(B, &[0]).unwrap();
        t.join().unwrap();
        assert_eq!(bytes::<1>(&mm, B), [0], "a forced write landed in B");
        let a = bytes::<1>(&mm, A)[0];
        assert!(a == 0 || a == 7, "A reads {a}");
        mm.munmap(A, PAGE_SIZE).unwrap();
        mm.munmap(B, PAGE_SIZE).unwrap();
        assert_eq!(mm.frames_used(), 0, "a frame leaked");
    });
}
