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
        m.write_at(0, &[7]).unwrap();
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
