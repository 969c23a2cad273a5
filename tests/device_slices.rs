//! Device slices (feature `vm-memory`): what a `VolatileSlice` handed out
//! by an address space's `GuestMemory` may reach. Each scenario of issue
//! 25's first defect: a write through a read slice of a never-written
//! page, slices held across munmap, MADV_DONTNEED and a memfd shrink while
//! the frame is reused, two spaces on one pool, fork, and dirty tracking
//! of device writes across a `pagemap_scan` reset and a soft-dirty reset.
//!
//! `cargo test --release --features vm-memory --test device_slices`

use aspace::uffd::RegisterMode;
use aspace::{
    AddressSpace, Advice, ClearRefs, Config, FrameAllocator, MapFlags, Memfd, Prot, UffdBuilder,
    PAGE_SIZE,
};
use std::io::Write as _;
use std::sync::Arc;
use virtio_queue::desc::split::Descriptor;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemory, Permissions, VolatileSlice};
#[path = "common/written.rs"]
mod written;
use written::pages_of;

const P: u64 = PAGE_SIZE;
const RW: Prot = Prot::READ.union(Prot::WRITE);

fn anon() -> MapFlags {
    MapFlags::PRIVATE | MapFlags::ANONYMOUS
}

/// The one slice of a one-page range.
fn slice_of<M>(mem: &M, addr: u64, access: Permissions) -> VolatileSlice<'_, ()>
where
    M: GuestMemory<Bitmap = ()>,
{
    let mut it = mem
        .get_slices(GuestAddress(addr), 8, access)
        .expect("translates");
    let s = it.next().expect("one slice").expect("no error");
    assert!(it.next().is_none());
    s
}

fn read_u64(mm: &AddressSpace, a: u64) -> u64 {
    let mut b = [0u8; 8];
    mm.read(a, &mut b).unwrap();
    u64::from_le_bytes(b)
}

#[test]
fn a_write_through_a_read_slice_of_an_untouched_page_stays_in_that_page() {
    let a = AddressSpace::new(Config::default());
    let b = AddressSpace::new(Config::default());
    let x = a.mmap(0, P, RW, anon()).unwrap();
    let ro = a.mmap(0, P, Prot::READ, anon()).unwrap();
    let y = b.mmap(0, P, RW, anon()).unwrap();
    {
        let mem = a.guest_memory();
        slice_of(&mem, x, Permissions::Read)
            .write_obj(0xbadbad_u64, 0)
            .unwrap();
        // A read-only private mapping: the slice is still that page's own.
        slice_of(&mem, ro + 8, Permissions::Read)
            .write_obj(0xbadbad_u64, 0)
            .unwrap();
    }
    // Another space's untouched page reads zeros both ways.
    let bmem = b.guest_memory();
    assert_eq!(bmem.read_obj::<u64>(GuestAddress(y)).unwrap(), 0);
    assert_eq!(read_u64(&b, y), 0);
    // The written pages agree with themselves through both APIs.
    let amem = a.guest_memory();
    let via_bytes = amem.read_obj::<u64>(GuestAddress(x)).unwrap();
    assert_eq!(via_bytes, read_u64(&a, x));
    assert_eq!(
        amem.read_obj::<u64>(GuestAddress(ro + 8)).unwrap(),
        read_u64(&a, ro + 8)
    );
    // And this space's other untouched pages are untouched.
    let z = a.mmap(0, P, RW, anon()).unwrap();
    assert_eq!(amem.read_obj::<u64>(GuestAddress(z)).unwrap(), 0);
    assert_eq!(amem.read_obj::<u64>(GuestAddress(x + 8)).unwrap(), 0);
}

#[test]
fn a_read_slice_of_a_private_object_mapping_never_reaches_the_object() {
    let mm = AddressSpace::new(Config::default());
    let image = Memfd::new_in(mm.frame_pool(), "image", P).unwrap();
    image.write_at(b"original", 0).unwrap();
    let private = mm
        .mmap_fd(0, P, Prot::READ, MapFlags::PRIVATE, &image, 0)
        .unwrap();
    let shared = mm.mmap_fd(0, P, RW, MapFlags::SHARED, &image, 0).unwrap();
    let mut buf = [0u8; 8];
    mm.read(private, &mut buf).unwrap(); // maps the object's page
    {
        let mem = mm.guest_memory();
        slice_of(&mem, private, Permissions::Read)
            .write_slice(b"DEVICE!!", 0)
            .unwrap();
    }
    image.read_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"original", "the object is untouched");
    mm.read(shared, &mut buf).unwrap();
    assert_eq!(&buf, b"original", "so is its shared mapping");
    // A shared mapping's slice is the object's page itself.
    {
        let mem = mm.guest_memory();
        slice_of(&mem, shared, Permissions::Write)
            .write_slice(b"shared!!", 0)
            .unwrap();
    }
    image.read_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"shared!!");
}

/// A driver that offers one chain: a request "ping" at `req` and a
/// write-only reply buffer at `reply`; the rings live at `rings`.
fn offer_ping(mm: &AddressSpace, rings: u64, req: u64, reply: u64) -> Queue {
    let mem = mm.guest_memory();
    mem.write_slice(b"ping", GuestAddress(req)).unwrap();
    let descs = [
        Descriptor::new(req, 4, 1, 1),    // NEXT
        Descriptor::new(reply, 64, 2, 0), // WRITE
    ];
    for (i, d) in descs.iter().enumerate() {
        mem.write_obj(*d, GuestAddress(rings + 16 * i as u64))
            .unwrap();
    }
    mem.write_obj(0u16, GuestAddress(rings + P + 4)).unwrap();
    mem.write_obj(1u16.to_le(), GuestAddress(rings + P + 2))
        .unwrap();
    let mut q = Queue::new(16).unwrap();
    let split = |a: u64| (Some(a as u32), Some((a >> 32) as u32));
    let (lo, hi) = split(rings);
    q.set_desc_table_address(lo, hi);
    let (lo, hi) = split(rings + P);
    q.set_avail_ring_address(lo, hi);
    let (lo, hi) = split(rings + 2 * P);
    q.set_used_ring_address(lo, hi);
    q.set_ready(true);
    q
}

#[test]
fn a_held_writer_never_writes_into_the_mapping_that_reuses_its_frame() {
    let mm = AddressSpace::new(Config::default());
    let rings = mm.mmap(0, 3 * P, RW, anon()).unwrap();
    let data = mm.mmap(0, 2 * P, RW, anon()).unwrap();
    let reply = data + P;
    let mut q = offer_ping(&mm, rings, data, reply);
    mm.write(reply, b"old reply page").unwrap();
    let mem = mm.guest_memory();
    let chain = q.pop_descriptor_chain(&mem).expect("a chain");
    let mut writer = chain.clone().writer(&mem).unwrap();
    let mut reader = chain.reader(&mem).unwrap();
    // The guest unmaps the reply page and maps new memory, which takes the
    // freed frame, and writes its own data there.
    mm.munmap(reply, P).unwrap();
    let new = mm
        .mmap(reply, P, RW, anon() | MapFlags::FIXED_NOREPLACE)
        .unwrap();
    assert_eq!(new, reply);
    mm.write(new, b"guest's own data").unwrap();
    // The device answers late.
    let mut req = [0u8; 4];
    std::io::Read::read_exact(&mut reader, &mut req).unwrap();
    writer.write_all(b"pong: device reply").unwrap();
    let mut buf = [0u8; 16];
    mm.read(new, &mut buf).unwrap();
    assert_eq!(&buf, b"guest's own data");
}

#[test]
fn a_held_slice_survives_dontneed_and_a_memfd_shrink_without_touching_reuse() {
    let mm = AddressSpace::new(Config::default());
    let a = mm.mmap(0, P, RW, anon()).unwrap();
    mm.write(a, b"before").unwrap();
    let fd = Memfd::new_in(mm.frame_pool(), "obj", P).unwrap();
    let s = mm.mmap_fd(0, P, RW, MapFlags::SHARED, &fd, 0).unwrap();
    mm.write(s, b"object").unwrap();
    let mem = mm.guest_memory();
    let anon_slice = slice_of(&mem, a, Permissions::Write);
    let obj_slice = slice_of(&mem, s, Permissions::Write);
    // The page is dropped, and the object shrunk and grown again.
    mm.madvise(a, P, Advice::DontNeed).unwrap();
    fd.set_len(0).unwrap();
    fd.set_len(P).unwrap();
    // New memory everywhere: it takes frames, the freed ones first.
    let fresh = mm.mmap(0, 4 * P, RW, anon()).unwrap();
    for i in 0..4 {
        mm.write(fresh + i * P, b"fresh!").unwrap();
    }
    mm.write(a, b"refault").unwrap();
    fd.write_at(b"regrown", 0).unwrap();
    anon_slice.write_slice(b"DEVICE", 0).unwrap();
    obj_slice.write_slice(b"DEVICE", 0).unwrap();
    let mut buf = [0u8; 6];
    for i in 0..4 {
        mm.read(fresh + i * P, &mut buf).unwrap();
        assert_eq!(&buf, b"fresh!");
    }
    mm.read(a, &mut buf).unwrap();
    assert_eq!(&buf, b"refaul");
    fd.read_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"regrow");
}

#[test]
fn a_stale_slice_of_one_space_never_reads_another_spaces_memory() {
    let pool = Arc::new(FrameAllocator::new(64 << 20, true));
    let a = AddressSpace::with_pool(Config::default(), pool.clone());
    let b = AddressSpace::with_pool(Config::default(), pool.clone());
    let x = a.mmap(0, P, RW, anon()).unwrap();
    a.write(x, b"a's data").unwrap();
    let mem = a.guest_memory();
    let stale = slice_of(&mem, x, Permissions::Read);
    a.munmap(x, P).unwrap();
    let y = b.mmap(0, 8 * P, RW, anon()).unwrap();
    for i in 0..8 {
        b.write(y + i * P, b"b secret").unwrap();
    }
    let mut buf = [0u8; 8];
    stale.read_slice(&mut buf, 0).unwrap();
    assert_ne!(&buf, b"b secret", "another space's private data");
    assert_eq!(&buf, b"a's data", "the unmapped page as it was");
}

#[test]
fn after_fork_a_parents_device_write_stays_in_the_parent() {
    let mm = AddressSpace::new(Config::default());
    let a = mm.mmap(0, P, RW, anon()).unwrap();
    mm.write(a, b"before fork").unwrap();
    let mem = mm.guest_memory();
    let dev = slice_of(&mem, a, Permissions::Write);
    let child = mm.fork().unwrap();
    // The parent's own write, then the device's.
    mm.write(a, b"parent").unwrap();
    dev.write_slice(b"device", 0).unwrap();
    let mut buf = [0u8; 11];
    child.read(a, &mut buf).unwrap();
    assert_eq!(&buf, b"before fork", "the child's copy is intact");
    mm.read(a, &mut buf).unwrap();
    assert_eq!(&buf[..6], b"device", "the parent sees its device");
    // The child's writes stay in the child.
    child.write(a, b"child!").unwrap();
    mm.read(a, &mut buf).unwrap();
    assert_eq!(&buf[..6], b"device");
    dev.write_slice(b"again!", 0).unwrap();
    child.read(a, &mut buf).unwrap();
    assert_eq!(&buf[..6], b"child!");
}

#[test]
fn a_device_write_through_a_slice_held_across_a_scan_reset_is_reported() {
    let mm = AddressSpace::new(Config::default());
    let a = mm.mmap(0, 4 * P, RW, anon()).unwrap();
    let uffd = UffdBuilder::new().wp_async(true).create(&mm);
    uffd.register_with_mode(a, 4 * P, RegisterMode::WRITE_PROTECT)
        .unwrap();
    mm.write(a, &[1u8; 4 * P as usize]).unwrap();
    {
        let mem = mm.guest_memory();
        let dev = slice_of(&mem, a + P, Permissions::Write);
        assert!(pages_of(&mm, a, 4 * P, true).contains(&(a + P)));
        dev.write_obj(7u64, 0).unwrap();
        assert!(pages_of(&mm, a, 4 * P, false).contains(&(a + P)));
    }
    // The slice is gone: the next reset still reports its write.
    assert!(
        pages_of(&mm, a, 4 * P, true).contains(&(a + P)),
        "the device's write after the reset"
    );
    // A slice taken after a reset, written and dropped before the scan.
    pages_of(&mm, a, 4 * P, true);
    assert!(pages_of(&mm, a, 4 * P, false).is_empty(), "reset");
    {
        let mem = mm.guest_memory();
        slice_of(&mem, a + 2 * P, Permissions::Write)
            .write_obj(9u64, 0)
            .unwrap();
        // Read slices can be written too.
        slice_of(&mem, a + 3 * P, Permissions::Read)
            .write_obj(9u64, 0)
            .unwrap();
    }
    let got = pages_of(&mm, a, 4 * P, true);
    assert!(got.contains(&(a + 2 * P)) && got.contains(&(a + 3 * P)));
    // Once no slice is held, the pages are clean again after a reset.
    assert!(pages_of(&mm, a, 4 * P, false).is_empty());
}

#[test]
fn a_device_write_through_a_slice_held_across_clear_refs_is_soft_dirty() {
    let mm = AddressSpace::new(Config::default());
    let a = mm.mmap(0, 2 * P, RW, anon()).unwrap();
    mm.write(a, &[1u8; 2 * P as usize]).unwrap();
    {
        let mem = mm.guest_memory();
        let dev = slice_of(&mem, a, Permissions::Write);
        mm.clear_refs(ClearRefs::SoftDirty);
        dev.write_obj(7u64, 0).unwrap();
        let pm = mm.pagemap(a, 2 * P).unwrap();
        assert!(pm[0].is_soft_dirty(), "the device's write");
        assert!(!pm[1].is_soft_dirty());
    }
    mm.clear_refs(ClearRefs::SoftDirty);
    {
        // A read slice, written all the same.
        let mem = mm.guest_memory();
        slice_of(&mem, a + P, Permissions::Read)
            .write_obj(7u64, 0)
            .unwrap();
    }
    let pm = mm.pagemap(a, 2 * P).unwrap();
    assert!(!pm[0].is_soft_dirty() && pm[1].is_soft_dirty());
}

#[test]
fn a_view_pins_each_frame_once_and_releases_its_pins_at_quiescence() {
    let mm = AddressSpace::new(Config::default());
    let a = mm.mmap(0, 2 * P, RW, anon()).unwrap();
    mm.write(a, &[1u8; 2 * P as usize]).unwrap();
    let mut mem = mm.guest_memory();
    for _ in 0..1000 {
        mem.read_obj::<u64>(GuestAddress(a + 8)).unwrap();
        mem.write_obj(5u64, GuestAddress(a + P - 4)).unwrap(); // two pages
    }
    assert_eq!(mem.pinned_frames(), 2);
    mm.munmap(a, 2 * P).unwrap();
    assert_eq!(mm.frames_used(), 2, "pinned frames outlive the mapping");
    mem.release_pins();
    assert_eq!(mem.pinned_frames(), 0);
    assert_eq!(mm.frames_used(), 0, "and go at the quiescence point");
    // Dropping a view releases what it pinned the same way.
    let b = mm.mmap(0, P, RW, anon()).unwrap();
    mm.write(b, b"x").unwrap();
    {
        let mem = mm.guest_memory();
        let _s = slice_of(&mem, b, Permissions::Read);
        mm.munmap(b, P).unwrap();
        assert_eq!(mm.frames_used(), 1);
    }
    assert_eq!(mm.frames_used(), 0);
}

#[test]
fn an_owned_view_keeps_its_space_and_frames() {
    let mm = Arc::new(AddressSpace::new(Config::default()));
    let a = mm.mmap(0, P, RW, anon()).unwrap();
    let mem = aspace::GuestView::new(mm.clone());
    mem.write_obj(0x77u64, GuestAddress(a)).unwrap();
    let t = std::thread::spawn(move || mem.read_obj::<u64>(GuestAddress(a)).unwrap());
    assert_eq!(t.join().unwrap(), 0x77);
    assert_eq!(read_u64(&mm, a), 0x77);
}

#[test]
fn a_pinned_page_stays_the_guests_page_through_write_protection() {
    // The guest's own write to a pinned page that lost write access
    // (mprotect, a userfault write-protect) reuses the page instead of
    // copying it away from the device.
    let mm = AddressSpace::new(Config::default());
    let a = mm.mmap(0, P, RW, anon()).unwrap();
    mm.write(a, b"guest 1").unwrap();
    let mem = mm.guest_memory();
    let dev = slice_of(&mem, a, Permissions::Write);
    mm.mprotect(a, P, Prot::READ).unwrap();
    mm.mprotect(a, P, RW).unwrap();
    mm.write(a, b"guest 2").unwrap();
    let mut buf = [0u8; 7];
    dev.read_slice(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"guest 2", "the device sees the guest's write");
    dev.write_slice(b"device!", 0).unwrap();
    mm.read(a, &mut buf).unwrap();
    assert_eq!(&buf, b"device!", "and the guest the device's");
    // The same after a read slice unshared a page shared with a child.
    let child = mm.fork().unwrap();
    let b = mm.mmap(0, P, RW, anon()).unwrap();
    mm.write(b, b"shared").unwrap();
    let child2 = mm.fork().unwrap();
    let rd = slice_of(&mem, b, Permissions::Read);
    mm.write(b, b"mine!!").unwrap();
    let mut six = [0u8; 6];
    rd.read_slice(&mut six, 0).unwrap();
    assert_eq!(&six, b"mine!!");
    child2.read(b, &mut six).unwrap();
    assert_eq!(&six, b"shared");
    drop(child);
}

#[test]
fn fork_fails_cleanly_when_no_frame_is_left_for_a_pinned_pages_copy() {
    let pool = Arc::new(FrameAllocator::new(1 << 20, true));
    let mm = AddressSpace::with_pool(Config::default(), pool.clone());
    let a = mm.mmap(0, P, RW, anon()).unwrap();
    mm.write(a, b"pinned").unwrap();
    let mem = mm.guest_memory();
    let _dev = slice_of(&mem, a, Permissions::Write);
    // Use up the budget.
    let big = mm.mmap(0, 1 << 20, RW, anon()).unwrap();
    let mut n = 0;
    while mm.write(big + n * P, b"x").is_ok() {
        n += 1;
    }
    // Give memory back a page at a time: every fork fails whole until
    // one has room for the child's tables and the copy.
    let mut failed = 0;
    let child = loop {
        let used = pool.memory().used();
        match mm.fork() {
            Ok(child) => break child,
            Err(e) => assert_eq!(e, aspace::Error::NoMem),
        }
        assert_eq!(pool.memory().used(), used, "nothing leaked");
        failed += 1;
        n -= 1;
        mm.munmap(big + n * P, P).unwrap();
    };
    assert!(failed > 0);
    let mut buf = [0u8; 6];
    child.read(a, &mut buf).unwrap();
    assert_eq!(&buf, b"pinned");
}

const HUGE: u64 = 2 << 20;

/// A space with one 2 MiB page, written at its first byte (madvise mode,
/// `MADV_HUGEPAGE`), and its address.
fn huge_page() -> (AddressSpace, u64) {
    let mm = AddressSpace::new(Config {
        thp: aspace::ThpMode::Madvise,
        ..Config::default()
    });
    let m = mm.mmap(0, 2 * HUGE, RW, anon()).unwrap();
    let a = m.next_multiple_of(HUGE);
    mm.madvise(a, HUGE, Advice::HugePage).unwrap();
    mm.write(a, &[1]).unwrap();
    (mm, a)
}

/// Pinning pages inside a 2 MiB page for a device keeps the huge page
/// whole (Linux pins a THP's subpage through its PMD): read and write
/// slices of three of its pages pin three subframes, write through to
/// the page the guest sees, and set the leaf's one soft-dirty bit; no
/// split. A huge page shared with a fork child is unshared by a 4 KiB copy
/// (a split, as Linux's unsharing of a shared THP).
#[test]
fn pins_inside_a_huge_page_keep_it_whole() {
    let (mm, a) = huge_page();
    assert_eq!(mm.stats().thp_fault_alloc, 1);
    mm.clear_refs(ClearRefs::SoftDirty);
    assert!(!mm.pagemap(a + 511 * P, P).unwrap()[0].is_soft_dirty());
    {
        let mem = mm.guest_memory();
        // A read pin first: the leaf is read-only and clean after the
        // reset, so only the pin marks it (a write pin's fault would).
        slice_of(&mem, a + 300 * P, Permissions::Read)
            .write_obj(0x300u64, 0)
            .unwrap();
        assert_eq!(mm.stats().thp_split_pmd, 0);
        assert!(mm.pagemap(a + 511 * P, P).unwrap()[0].is_soft_dirty());
        slice_of(&mem, a + 7 * P, Permissions::Write)
            .write_obj(0x77u64, 0)
            .unwrap();
        slice_of(&mem, a, Permissions::Read)
            .read_obj::<u8>(0)
            .unwrap();
        assert_eq!(mem.pinned_frames(), 3);
        assert_eq!(mm.stats().thp_split_pmd, 0, "pins split nothing");
        assert_eq!(mm.anon_huge_pages(a), Some(HUGE));
        assert_eq!(read_u64(&mm, a + 7 * P), 0x77);
        assert_eq!(read_u64(&mm, a + 300 * P), 0x300);
        // One bit for the whole leaf, as Linux's PMD.
        assert!(mm.pagemap(a + 511 * P, P).unwrap()[0].is_soft_dirty());
    }
    // Pins released: the huge page is still one, and goes whole.
    assert_eq!(mm.anon_huge_pages(a), Some(HUGE));
    // Shared with a child: the pin unshares by a 4 KiB copy.
    let child = mm.fork().unwrap();
    {
        let mem = mm.guest_memory();
        slice_of(&mem, a + 9 * P, Permissions::Write)
            .write_obj(0x99u64, 0)
            .unwrap();
    }
    assert_eq!(mm.stats().thp_split_pmd, 1);
    assert_eq!(read_u64(&mm, a + 9 * P), 0x99);
    assert_eq!(read_u64(&child, a + 9 * P), 0);
    assert_eq!(read_u64(&child, a + 7 * P), 0x77);
}

/// `clear_refs` (soft-dirty) over a 2 MiB page with a pinned subpage
/// resets the leaf whole, as Linux 6.x's `clear_soft_dirty_pmd` (which
/// looks at no pin): no split, every page clean, and the device's pin
/// still reaches the page the guest sees, whose next write reuses the
/// huge page whole. (The running kernel has no `CONFIG_MEM_SOFT_DIRTY`:
/// not compared.)
#[test]
fn clear_refs_over_a_pinned_huge_page_resets_the_leaf_whole() {
    let (mm, a) = huge_page();
    let mem = mm.guest_memory();
    let dev = slice_of(&mem, a + 7 * P, Permissions::Write);
    assert_eq!(mem.pinned_frames(), 1);
    mm.clear_refs(ClearRefs::SoftDirty);
    assert_eq!(mm.stats().thp_split_pmd, 0, "the reset split the leaf");
    assert_eq!(mm.anon_huge_pages(a), Some(HUGE));
    let pm = mm.pagemap(a, HUGE).unwrap();
    assert!(pm.iter().all(|e| !e.is_soft_dirty()), "the pinned page too");
    dev.write_obj(0x77u64, 0).unwrap();
    assert_eq!(read_u64(&mm, a + 7 * P), 0x77);
    // The guest's write faults, reuses the pinned huge page whole.
    mm.write(a + 9 * P, &[9]).unwrap();
    assert_eq!(mm.stats().thp_split_pmd, 0);
    assert!(mm.pagemap(a + 7 * P, P).unwrap()[0].is_soft_dirty());
    dev.write_obj(0x78u64, 0).unwrap();
    assert_eq!(read_u64(&mm, a + 7 * P), 0x78, "the pin reaches the page");
}
