//! Loom model of a device pin (vm-memory slices, src/translate/guest/)
//! against a memfd shrink, through the real AddressSpace, Memfd and
//! GuestView. Needs the `vm-memory` feature, which `./loom.sh` turns on;
//! it runs at the script's bound.
#![cfg(all(aspace_loom, feature = "vm-memory"))]

mod common;
use common::{cfg, model};

use aspace::{AddressSpace, MapFlags, Memfd, Prot, PAGE_SIZE};
use loom::sync::Arc;
use loom::thread;
use vm_memory::{Bytes, GuestAddress};

const A: u64 = 0x4000_0000;

/// A device reads a private read-only mapping's page, which maps the
/// object's page (mapped by a read first), while the object shrinks to
/// nothing. The read pins only a page of the mapping's own, so it first
/// copies the object's page into a private one (`unshare`); the shrink
/// zaps the mapping's entry and frees the object's page. The read sees
/// the object's byte or fails (the page is past the end); no frame is
/// leaked.
///
/// Mutation caught: `unshare` (src/translate/guest/pin.rs) copying
/// without a reference of its own (`mm.frames.get(old)` removed, and
/// `mm.frames.put(old)` after the copy): the shrink's free of the frame
/// is then unordered with the copy's read, which loom reports on the
/// frame's memory cell.
#[test]
fn unshare_copy_vs_shrink() {
    model(|| {
        let mm = Arc::new(AddressSpace::new(cfg()));
        let m = Arc::new(Memfd::new_in(mm.frame_pool(), "t", PAGE_SIZE).unwrap());
        m.write_at(&[7], 0).unwrap();
        let flags = MapFlags::PRIVATE | MapFlags::FIXED;
        mm.mmap_fd(A, PAGE_SIZE, Prot::READ, flags, &m, 0).unwrap();
        mm.read(A, &mut [0]).unwrap();
        let m2 = m.clone();
        let t = thread::spawn(move || m2.set_len(0).unwrap());
        let mem = mm.guest_memory();
        let r = mem.read_obj::<u8>(GuestAddress(A));
        t.join().unwrap();
        if let Ok(v) = r {
            assert_eq!(v, 7, "the object's byte");
        }
        drop(mem);
        mm.munmap(A, PAGE_SIZE).unwrap();
        assert_eq!(mm.frames_used(), 0, "a frame leaked");
    });
}

/// A device takes a slice of a written private page while another thread
/// forks the space; the device writes through the slice after the fork.
/// Fork gives the child its own copy of a page pinned when it copies it
/// (the parent keeps the pinned one), and a page pinned after the fork is
/// unshared from the child first: either way the device's write lands in
/// the parent's page only, and the child keeps the byte it had.
///
/// Mutation caught: fork ignoring pins (`maybe_pinned` in
/// `copy_page_tables`, src/mm/fork.rs, replaced by `false`): a page pinned
/// before the copy is then shared copy-on-write, and the device's write
/// shows in the child.
#[test]
fn pin_vs_fork() {
    use vm_memory::{GuestMemory, Permissions};
    model(|| {
        let mm = Arc::new(AddressSpace::new(cfg()));
        let flags = MapFlags::PRIVATE | MapFlags::ANONYMOUS | MapFlags::FIXED;
        mm.mmap(A, PAGE_SIZE, Prot::READ | Prot::WRITE, flags)
            .unwrap();
        mm.write(A, &[1]).unwrap();
        let m2 = mm.clone();
        let t = thread::spawn(move || m2.fork().unwrap());
        let mem = mm.guest_memory();
        let s = mem
            .get_slices(GuestAddress(A), 1, Permissions::Write)
            .unwrap()
            .next()
            .unwrap()
            .unwrap();
        let child = t.join().unwrap();
        s.write_obj(0x55u8, 0).unwrap();
        let mut x = [0u8; 1];
        child.read(A, &mut x).unwrap();
        assert_eq!(x, [1], "the parent's device write reached the child");
        mm.read(A, &mut x).unwrap();
        assert_eq!(x, [0x55], "the device writes the parent's page");
    });
}
