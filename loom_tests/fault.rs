//! Loom models of the fault path against mmap_lock writers, running the
//! real AddressSpace through src/sync.rs (deferred reclamation, so the
//! models explore the lock protocol rather than epoch internals).
//!
//! `./loom.sh` runs them at its preemption bound (2), like every model.
//! Each model writes the pages the race does not need before it starts
//! its threads (page tables, the anon_vma and the frame chunk then exist),
//! so the explored interleavings are those of the race itself.
#![cfg(aspace_loom)]

mod common;
use common::{cfg, fixed, model, rw};

use aspace::{Access, AddressSpace, Advice, Prot, PAGE_SIZE};
use loom::sync::Arc;
use loom::thread;

const A: u64 = 0x4000_0000;
const B: u64 = 0x5000_0000;

/// Model 3: a lock-free lookup races with the detach of its VMA and the
/// immediate reuse of the VMA object for another range.
/// mmap(MAP_FIXED, PROT_NONE) over the first page of the read-write VMA
/// `[A, A + 2 pages)` splits it (the object keeps `[A, A + PAGE_SIZE)`, a
/// new one takes the upper page), detaches and frees the object, and at
/// once takes it back from the pool for the PROT_NONE VMA
/// `[A, A + PAGE_SIZE)`. A read fault at `A + PAGE_SIZE`, mapped and
/// readable throughout, must succeed whether its lookup found the object
/// before the mmap or the upper VMA after: it never acts on the new life
/// of an object that no longer covers the address. The zero page mapped
/// at `A + PAGE_SIZE` first keeps the page tables in place, so no table
/// is made or freed in the race. (One write section keeps the model
/// exhaustive at bound 2, about 85,000 executions; munmap of `A` then
/// mmap of another address, two sections, did not finish in 300 s.)
///
/// Mutation caught: `lock_vma_under_rcu` (src/mm/fault.rs) skipping its
/// revalidation (`if vma.mm_id() != mm.id || !vma.range().contains(addr)`
/// replaced by `if false`): the fault then reads the recycled object's
/// PROT_NONE flags and reports SEGV_ACCERR for a readable page.
#[test]
fn lookup_vs_detach_and_reuse() {
    model(|| {
        let mm = Arc::new(AddressSpace::new(cfg()));
        mm.mmap(A, 2 * PAGE_SIZE, rw(), fixed()).unwrap();
        mm.fault(A + PAGE_SIZE, Access::Read).unwrap();
        let m2 = mm.clone();
        let t = thread::spawn(move || m2.fault(A + PAGE_SIZE, Access::Read));
        mm.mmap(A, PAGE_SIZE, Prot::NONE, fixed()).unwrap();
        assert_eq!(
            t.join().unwrap(),
            Ok(()),
            "a fault on a readable page failed"
        );
        assert!(mm.stats().vma_reused >= 1, "the object was recycled");
        assert_eq!(mm.frames_used(), 0);
    });
}

/// Model 4: a store through the fault path races with munmap of the same
/// page. Either the store lands first and the munmap frees its frame, or
/// the store fails with EFAULT; no frame leaks, and the next mapping at the
/// address reads zero (the old frame's data is never seen again).
///
/// Mutation caught: munmap zapping before it write-locks the VMAs it
/// removes, i.e. dropping the `self.lock(v)` loop over `victims` in
/// `Edit::unmap_into` (src/mm/edit.rs): a fault then installs a frame
/// after the zap, and it leaks.
#[test]
fn fault_vs_munmap_same_page() {
    model(|| {
        let mm = Arc::new(AddressSpace::new(cfg()));
        mm.mmap(A, PAGE_SIZE, rw(), fixed()).unwrap();
        // Give the VMA its anon_vma, then empty the page again.
        common::emptied_with_neighbour(&mm, A);
        let m2 = mm.clone();
        let t = thread::spawn(move || m2.write(A, &[0x5a]));
        mm.munmap(A, PAGE_SIZE).unwrap();
        let r = t.join().unwrap();
        assert!(
            matches!(r.map_err(|e| e.errno()), Ok(()) | Err(14)),
            "{r:?}"
        );
        assert_eq!(mm.frames_used(), 0, "the frame was freed");
        mm.mmap(A, PAGE_SIZE, rw(), fixed()).unwrap();
        let mut x = [0xffu8; 1];
        mm.read(A, &mut x).unwrap();
        assert_eq!(x, [0], "a new mapping never shows the old frame");
    });
}

/// Model 5: two faults meet on one page while `madvise(DONTNEED)` empties
/// it. The thread's install finds the entry taken (the main thread's store
/// faulted it in first); by the time it looks again, DONTNEED has zapped
/// it. The page is still mapped and writable, so the fault must succeed
/// (install again), never report `NoMapping` (a false SIGSEGV).
///
/// Mutation caught: in `fault::do_fault`, treating a taken entry like an
/// untranslatable address, i.e. replacing `if existing == Pte::NONE` by
/// `if !mm.pt.lookup(page, &g).is_present()` (the code before the fix).
#[test]
fn fault_vs_dontneed_same_page() {
    model(|| {
        let mm = Arc::new(AddressSpace::new(cfg()));
        mm.mmap(A, 2 * PAGE_SIZE, rw(), fixed()).unwrap();
        mm.write(A + PAGE_SIZE, &[1]).unwrap();
        let m2 = mm.clone();
        let t = thread::spawn(move || m2.fault(A, Access::Write));
        mm.write(A, &[7]).unwrap();
        mm.madvise(A, PAGE_SIZE, Advice::DontNeed).unwrap();
        assert_eq!(
            t.join().unwrap(),
            Ok(()),
            "a fault on a mapped, writable page failed"
        );
    });
}

/// Model 6: a copy-on-write fault copies a frame while the parent's entry
/// is zapped by DONTNEED and the child (the frame's other sharer) goes
/// away, so the frame's last reference drops during the copy. The copier
/// must hold its own reference (taken under the PTE lock while the entry
/// still maps the frame), so the frame is freed only after the copy; loom
/// sees frame memory through `phys/chunk.rs`'s tracked cells and reports a copy
/// that is not ordered before the free.
///
/// Mutation caught: in `fault::wp_fault`, dropping the reference taken
/// under the PTE lock (`mm.frames.get(old)` and the matching
/// `mm.frames.put(old)` after the copy), as before the fix.
#[test]
fn cow_copy_vs_zap() {
    model(|| {
        let mm = Arc::new(AddressSpace::new(cfg()));
        mm.mmap(A, PAGE_SIZE, rw(), fixed()).unwrap();
        mm.write(A, &[1]).unwrap();
        let child = mm.fork().unwrap();
        let m2 = mm.clone();
        let t = thread::spawn(move || m2.write(A, &[2]));
        mm.madvise(A, PAGE_SIZE, Advice::DontNeed).unwrap();
        drop(child);
        t.join().unwrap().unwrap();
        let mut x = [0xffu8; 1];
        mm.read(A, &mut x).unwrap();
        assert!(x == [2] || x == [0], "{x:?}: neither the write nor a zap");
        mm.munmap(A, PAGE_SIZE).unwrap();
        assert_eq!(mm.frames_used(), 0, "a frame leaked");
    });
}

/// Model 7: a store races `mprotect(PROT_READ)` of its page. Once mprotect
/// has returned, no store may land: the page reads the same before and
/// after the storing thread is joined, and the store either landed before
/// (and is seen) or failed with EFAULT.
///
/// Mutation caught: mprotect not waiting for accesses in flight, i.e.
/// dropping `gather.add_page(va)` in `AddressSpace::change_protection`
/// (src/mm/mprotect.rs), so its flush covers nothing.
#[test]
fn write_vs_mprotect_read() {
    model(|| {
        let mm = Arc::new(AddressSpace::new(cfg()));
        mm.mmap(A, PAGE_SIZE, rw(), fixed()).unwrap();
        mm.write(A, &[1]).unwrap();
        common::store_vs_mprotect_read(mm.clone(), A);
    });
}

/// Model 8: fork races a thread storing twice into a written page (first
/// byte 0, then byte 8). The child must see the page of one instant: what
/// it reads right after fork never changes later, and it never shows the
/// second store without the first.
///
/// Mutation caught: fork not flushing the parent's write-protected
/// entries, i.e. dropping `gather.add_page(va)` in `copy_page_tables`
/// (src/mm/fork.rs): a store that translated before fork then lands in
/// the frame the child now shares.
#[test]
fn fork_vs_write_fault() {
    model(|| {
        let mm = Arc::new(AddressSpace::new(cfg()));
        mm.mmap(A, PAGE_SIZE, rw(), fixed()).unwrap();
        mm.write(A, &[0; 16]).unwrap();
        let m2 = mm.clone();
        let t = thread::spawn(move || {
            m2.write(A, &[1]).unwrap();
            m2.write(A + 8, &[1]).unwrap();
        });
        let child = mm.fork().unwrap();
        let (mut first, mut later) = ([0u8; 9], [0u8; 9]);
        child.read(A, &mut first).unwrap();
        t.join().unwrap();
        child.read(A, &mut later).unwrap();
        assert_eq!(first, later, "the child saw a store made after fork");
        assert!(
            first[8] == 0 || first[0] == 1,
            "the child saw the second store without the first: {first:?}"
        );
    });
}

/// Model 9: a store's precheck reads the VMA it found in the tree while
/// mprotect merges that VMA into its neighbours, freeing its object, and
/// mmap at once reuses the object for a read-only mapping elsewhere. The
/// stored-to page is writable the whole time, so the store must succeed:
/// the precheck reads flags only from a VMA it has locked and
/// revalidated, and never acts on the flags of a recycled object.
///
/// Mutation caught: `AddressSpace::precheck` (src/mm/access.rs) reading
/// `v.flags()` without the read lock and revalidation, i.e. passing
/// `|_, v| Some(v.flags())` as `flags_of` in the lock-free attempt (the
/// code before the fix).
#[test]
fn store_precheck_vs_vma_reuse() {
    model(|| {
        let mm = Arc::new(AddressSpace::new(cfg()));
        mm.mmap(A, 3 * PAGE_SIZE, rw(), fixed()).unwrap();
        mm.write(A, &[1; 3 * PAGE_SIZE as usize]).unwrap();
        // Three VMAs: read-write, read-only, read-write.
        mm.mprotect(A + PAGE_SIZE, PAGE_SIZE, Prot::READ).unwrap();
        let m2 = mm.clone();
        let t = thread::spawn(move || m2.write(A + 2 * PAGE_SIZE, &[2]));
        // Merge all three (two objects are freed); reuse a free object.
        mm.mprotect(A + PAGE_SIZE, PAGE_SIZE, rw()).unwrap();
        mm.mmap(B, PAGE_SIZE, Prot::READ, fixed()).unwrap();
        assert_eq!(
            t.join().unwrap(),
            Ok(()),
            "a store to a writable page failed"
        );
    });
}
