//! Loom models of a shrinking `Memfd` (`set_len`) against a fault on the
//! page it cuts off, against fork, and against a file object's writeback,
//! through the real AddressSpace and Memfd (the protocols are in
//! src/vma/mappings.rs and src/file.rs). `./loom.sh` runs them at its
//! bound.
#![cfg(aspace_loom)]

mod common;
use common::{cfg, model, rw};

use aspace::{Access, AddressSpace, Error, MapFlags, Memfd, PAGE_SIZE};
use loom::sync::Arc;
use loom::thread;

const A: u64 = 0x4000_0000;

/// A store to page 1 of a shared mapping races a shrink of the object to
/// one page (page 1 is in the object already). Either the store lands
/// before the shrink (which then zaps the entry and frees the page) or it
/// fails with SIGBUS (EFAULT); after the shrink nothing maps page 1, no
/// frame is leaked or freed twice, and growing the object again shows
/// zeros there. With `tables`, page 0 is mapped first, so the page tables
/// exist and the race is the fault's entry against the shrink's zap;
/// without, the fault also makes the tables the shrink's walk looks for.
fn store_vs_shrink(tables: bool) {
    model(move || {
        let mm = Arc::new(AddressSpace::new(cfg()));
        let m = Memfd::new_in(mm.frame_pool(), "t", 2 * PAGE_SIZE).unwrap();
        let flags = MapFlags::SHARED | MapFlags::FIXED;
        mm.mmap_fd(A, 2 * PAGE_SIZE, rw(), flags, &m, 0).unwrap();
        if tables {
            mm.write(A, &[1]).unwrap();
        }
        m.write_at(&[1], PAGE_SIZE).unwrap();
        let m2 = mm.clone();
        let t = thread::spawn(move || m2.write(A + PAGE_SIZE, &[2]));
        m.set_len(PAGE_SIZE).unwrap();
        if let Err(e) = t.join().unwrap() {
            assert_eq!(e.errno(), Error::Fault.errno(), "{e:?}");
        }
        assert!(mm.translate(A + PAGE_SIZE).is_none(), "mapped past the end");
        assert!(mm.fault(A + PAGE_SIZE, Access::Read).is_err());
        assert_eq!(mm.frames_used(), u64::from(tables), "page 0 only");
        m.set_len(2 * PAGE_SIZE).unwrap();
        let mut x = [9u8; 1];
        mm.read(A + PAGE_SIZE, &mut x).unwrap();
        assert_eq!(x, [0], "growing again shows zeros");
    });
}

/// Mutation caught: the fault's re-check of the object's end under the PTE
/// lock (`idx < shm.npages()` in `do_fault`, src/mm/fault.rs, replaced by
/// `true`): the fault then installs the page after the shrink's pass over
/// the table, and the entry maps a page past the end (the object's frame,
/// which the shrink dropped, stays mapped).
#[test]
fn store_vs_shrink_with_tables() {
    store_vs_shrink(true);
}

/// The same race where the fault makes the page tables: the shrink's walk
/// may find none, and the fence pair makes the fault see the new end.
///
/// Mutation caught: the heavy fence after the shrink lowers the end
/// (`crate::sync::asymmetric::heavy()` in `Memfd::set_len`, src/memfd.rs)
/// removed: the shrink's walk misses the table the fault just made while
/// the fault still reads the old end (and the first mutation too).
#[test]
fn store_vs_shrink_making_tables() {
    store_vs_shrink(false);
}

/// Fork races a shrink of an object a private mapping maps, with a
/// copy-on-write copy of page 1 (fork copies that entry to the child).
/// Whichever comes first, once both are done neither space maps page 1:
/// the child's VMA is filed after the parent's, so the shrink visits the
/// parent first, and an entry fork copied before that visit is found in
/// the child.
///
/// Mutation caught: the shrink visiting the mappings newest first
/// (`idx.entries.values()` replaced by `idx.entries.values().rev()` in
/// `Mappings::zap_from`, src/vma/mappings.rs): it then clears the child's
/// (still empty) table, fork copies the parent's entry, and only then is
/// the parent's cleared.
#[test]
fn fork_vs_shrink() {
    model(|| {
        let mm = Arc::new(AddressSpace::new(cfg()));
        let m = Memfd::new_in(mm.frame_pool(), "f", 2 * PAGE_SIZE).unwrap();
        let flags = MapFlags::PRIVATE | MapFlags::FIXED;
        mm.mmap_fd(A, 2 * PAGE_SIZE, rw(), flags, &m, 0).unwrap();
        mm.write(A + PAGE_SIZE, &[1]).unwrap();
        let m2 = m.clone();
        let t = thread::spawn(move || m2.set_len(PAGE_SIZE).unwrap());
        let child = mm.fork().unwrap();
        t.join().unwrap();
        for (who, s) in [("parent", &*mm), ("child", &child)] {
            assert!(
                s.translate(A + PAGE_SIZE).is_none(),
                "{who} maps past the end"
            );
        }
    });
}

/// MADV_REMOVE of a shared mapping's page (which zeroes the object's frame
/// under the mmap_lock read side, without the object's size lock) races
/// a shrink of the object to nothing, after which a second space on the
/// same pool writes a private page (taking the frame the shrink freed, if
/// the pool hands it out again). The second space's page keeps what it
/// wrote: the hole punch zeroes only frames the object still holds, under
/// a reference of its own. Catches: `zero_range`'s `try_get` (src/vma/
/// shmem.rs) replaced by `true` with its `put` deleted (the pre-fix code:
/// zeros written into a frame already freed and reused).
#[test]
fn remove_vs_shrink_and_reuse() {
    model(|| {
        let mm = Arc::new(AddressSpace::new(cfg()));
        let other = AddressSpace::with_pool(cfg(), mm.frame_pool().clone());
        let m = Memfd::new_in(mm.frame_pool(), "t", PAGE_SIZE).unwrap();
        let flags = MapFlags::SHARED | MapFlags::FIXED;
        mm.mmap_fd(A, PAGE_SIZE, rw(), flags, &m, 0).unwrap();
        mm.write(A, &[1]).unwrap();
        let private = MapFlags::PRIVATE | MapFlags::ANONYMOUS | MapFlags::FIXED;
        other.mmap(A, PAGE_SIZE, rw(), private).unwrap();
        let m2 = mm.clone();
        let t = thread::spawn(move || m2.madvise(A, PAGE_SIZE, aspace::Advice::Remove));
        m.set_len(0).unwrap();
        other.write(A, &[0x55]).unwrap();
        t.join().unwrap().unwrap();
        let mut x = [0u8; 1];
        other.read(A, &mut x).unwrap();
        assert_eq!(x, [0x55], "the hole punch zeroed another space's page");
    });
}

/// A writeback of a file object (`sync_all`, as msync and munmap write
/// back) races a shrink of the object from two pages to one, page 1
/// dirty. Whichever comes first, the host file ends one page long: a
/// writeback never writes a page the shrink dropped back into the file
/// (Linux: truncation waits for the page's writeback), and the frame it
/// copies is held by a reference taken while it lives.
///
/// Mutation caught: the shrink's writeback lock (`let _io = ...io_lock()`
/// in `Memfd::set_len`, src/memfd.rs) removed: the writeback takes page 1
/// and the old size, the shrink cuts the host file, the writeback copies
/// the page (not freed yet) and its `pwrite` grows the file back to two
/// pages.
#[test]
fn writeback_vs_shrink() {
    let path = std::env::temp_dir().join(format!("aspace-loom-wb-{}", std::process::id()));
    let p = path.clone();
    model(move || {
        std::fs::write(&p, vec![7u8; 2 * PAGE_SIZE as usize]).unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&p)
            .unwrap();
        let frames = Arc::new(aspace::FrameAllocator::new(16 * PAGE_SIZE, true));
        let m = Memfd::from_file_in(&frames, &file, "wb").unwrap();
        m.write_at(&[1], PAGE_SIZE).unwrap();
        let m2 = m.clone();
        let t = thread::spawn(move || m2.set_len(PAGE_SIZE));
        m.sync_all().unwrap();
        t.join().unwrap().unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().len(), PAGE_SIZE);
    });
    let _ = std::fs::remove_file(&path);
}
