//! A real vm-memory client on an address space: a virtio split queue laid
//! out in guest memory, consumed with the virtio-queue crate through the
//! space's device view (`AddressSpace::guest_memory`): read each request,
//! write a reply, publish it in the used ring, including chains whose
//! reply buffer is read-only or unmapped (an error; nothing written) and
//! whose request is unmapped.
//!
//! `cargo test --release --features vm-memory --test virtio_queue`

use aspace::{AddressSpace, Config, GuestView, MapFlags, Prot, PAGE_SIZE};
use virtio_queue::desc::split::Descriptor;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemory, Permissions};

const RW: Prot = Prot::READ.union(Prot::WRITE);
/// Descriptor table, available ring and used ring, one page each.
const RINGS: u64 = 0x10_0000_0000;
/// Request and reply buffers.
const DATA: u64 = 0x10_0001_0000;
/// A read-only page.
const RO: u64 = 0x10_0002_0000;
/// Never mapped.
const HOLE: u64 = 0x10_0003_0000;
const SIZE: u16 = 16;
const F_NEXT: u16 = 1;
const F_WRITE: u16 = 2;

/// A device's view of the space.
type Mem<'a> = GuestView<&'a AddressSpace>;

fn fixed() -> MapFlags {
    MapFlags::PRIVATE | MapFlags::ANONYMOUS | MapFlags::FIXED
}

fn desc_table() -> u64 {
    RINGS
}
fn avail_ring() -> u64 {
    RINGS + PAGE_SIZE
}
fn used_ring() -> u64 {
    RINGS + 2 * PAGE_SIZE
}

/// The driver side: puts descriptor `i` in the table.
fn put_desc(mm: &Mem, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
    let d = Descriptor::new(addr, len, flags, next);
    mm.write_obj(d, GuestAddress(desc_table() + 16 * i as u64))
        .unwrap();
}

/// The driver side: offers the chains with these heads.
fn offer(mm: &Mem, heads: &[u16]) {
    for (slot, &h) in heads.iter().enumerate() {
        mm.write_obj(h.to_le(), GuestAddress(avail_ring() + 4 + 2 * slot as u64))
            .unwrap();
    }
    mm.write_obj((heads.len() as u16).to_le(), GuestAddress(avail_ring() + 2))
        .unwrap();
}

fn queue(mm: &Mem) -> Queue {
    let mut q = Queue::new(SIZE).unwrap();
    q.set_size(SIZE);
    let split = |a: u64| (Some(a as u32), Some((a >> 32) as u32));
    let (lo, hi) = split(desc_table());
    q.set_desc_table_address(lo, hi);
    let (lo, hi) = split(avail_ring());
    q.set_avail_ring_address(lo, hi);
    let (lo, hi) = split(used_ring());
    q.set_used_ring_address(lo, hi);
    q.set_ready(true);
    assert!(q.is_valid(mm));
    q
}

/// The device side: answers every available chain with "pong:" and the
/// request; a reply that cannot be written is reported with length 0.
fn serve(mm: &Mem, q: &mut Queue) -> Vec<(u16, Result<Vec<u8>, String>)> {
    let mut out = Vec::new();
    while let Some(chain) = q.pop_descriptor_chain(mm) {
        let head = chain.head_index();
        let mut request = Vec::new();
        let mut result = Ok(Vec::new());
        for d in chain {
            if !d.is_write_only() {
                let mut b = vec![0u8; d.len() as usize];
                match mm.read_slice(&mut b, d.addr()) {
                    Ok(()) => request.extend_from_slice(&b),
                    Err(e) => result = Err(format!("request: {e}")),
                }
            } else if result.is_ok() {
                let reply = [b"pong:".as_slice(), &request].concat();
                result = mm
                    .write_slice(&reply[..reply.len().min(d.len() as usize)], d.addr())
                    .map(|_| reply)
                    .map_err(|e| format!("reply: {e}"));
            }
        }
        let len = result.as_ref().map_or(0, |r| r.len() as u32);
        q.add_used(mm, head, len).unwrap();
        out.push((head, result));
    }
    out
}

#[test]
fn virtio_queue_requests_and_replies() {
    let space = AddressSpace::new(Config::default());
    space.mmap(RINGS, 3 * PAGE_SIZE, RW, fixed()).unwrap();
    space.mmap(DATA, 2 * PAGE_SIZE, RW, fixed()).unwrap();
    space.mmap(RO, PAGE_SIZE, Prot::READ, fixed()).unwrap();
    let mm = space.guest_memory();
    // Chain 0: request "ping" -> reply buffer crossing a page boundary.
    mm.write_slice(b"ping", GuestAddress(DATA)).unwrap();
    put_desc(&mm, 0, DATA, 4, F_NEXT, 1);
    put_desc(&mm, 1, DATA + PAGE_SIZE - 4, 64, F_WRITE, 0);
    // Chain 2: the reply buffer is read-only.
    mm.write_slice(b"ro", GuestAddress(DATA + 0x100)).unwrap();
    put_desc(&mm, 2, DATA + 0x100, 2, F_NEXT, 3);
    put_desc(&mm, 3, RO + 8, 64, F_WRITE, 0);
    // Chain 4: the reply buffer starts mapped and runs into a hole.
    mm.write_slice(b"hole", GuestAddress(DATA + 0x200)).unwrap();
    put_desc(&mm, 4, DATA + 0x200, 4, F_NEXT, 5);
    put_desc(&mm, 5, DATA + 2 * PAGE_SIZE - 4, 64, F_WRITE, 0);
    // Chain 6: the request itself is unmapped.
    put_desc(&mm, 6, HOLE, 8, F_NEXT, 7);
    put_desc(&mm, 7, DATA + 0x300, 64, F_WRITE, 0);
    offer(&mm, &[0, 2, 4, 6]);

    let mut q = queue(&mm);
    let served = serve(&mm, &mut q);
    assert_eq!(served.len(), 4);
    assert_eq!(served[0], (0, Ok(b"pong:ping".to_vec())));
    assert_eq!(served[1].0, 2);
    assert!(served[1].1.is_err(), "{:?}", served[1]);
    assert_eq!(served[2].0, 4);
    assert!(served[2].1.is_err(), "{:?}", served[2]);
    assert_eq!(served[3].0, 6);
    assert!(served[3].1.is_err(), "{:?}", served[3]);

    // The reply crossed a page; the refused replies wrote nothing.
    let mut reply = [0u8; 9];
    mm.read_slice(&mut reply, GuestAddress(DATA + PAGE_SIZE - 4))
        .unwrap();
    assert_eq!(&reply, b"pong:ping");
    let mut ro = [0xffu8; 64];
    mm.read_slice(&mut ro, GuestAddress(RO + 8)).unwrap();
    assert_eq!(ro, [0u8; 64], "nothing written to the read-only page");
    let mut tail = [0xffu8; 4];
    mm.read_slice(&mut tail, GuestAddress(DATA + 2 * PAGE_SIZE - 4))
        .unwrap();
    assert_eq!(tail, [0u8; 4], "nothing written before the hole");
    let mut untouched = [0xffu8; 8];
    mm.read_slice(&mut untouched, GuestAddress(DATA + 0x300))
        .unwrap();
    assert_eq!(untouched, [0u8; 8]);

    // The used ring: four entries, with the lengths written.
    let idx: u16 = mm.read_obj(GuestAddress(used_ring() + 2)).unwrap();
    assert_eq!(u16::from_le(idx), 4);
    let used: Vec<(u32, u32)> = (0..4)
        .map(|i| {
            let at = used_ring() + 4 + 8 * i;
            let id: u32 = mm.read_obj(GuestAddress(at)).unwrap();
            let len: u32 = mm.read_obj(GuestAddress(at + 4)).unwrap();
            (u32::from_le(id), u32::from_le(len))
        })
        .collect();
    assert_eq!(used, vec![(0, 9), (2, 0), (4, 0), (6, 0)]);
}

#[test]
fn permissions_and_faulting_through_guest_memory() {
    let space = AddressSpace::new(Config::default());
    space.mmap(DATA, 2 * PAGE_SIZE, RW, fixed()).unwrap();
    space.mmap(RO, PAGE_SIZE, Prot::READ, fixed()).unwrap();
    let mut mm = space.guest_memory();
    assert!(mm.check_range(GuestAddress(RO), 16, Permissions::Read));
    assert!(!mm.check_range(GuestAddress(RO), 16, Permissions::Write));
    assert!(!mm.check_range(GuestAddress(RO), 16, Permissions::ReadWrite));
    assert!(!mm.check_range(GuestAddress(HOLE), 1, Permissions::Read));
    assert!(!mm.check_range(GuestAddress(u64::MAX - 1), 4, Permissions::Read));
    assert!(mm.check_range(
        GuestAddress(DATA),
        2 * PAGE_SIZE as usize,
        Permissions::Write
    ));
    assert!(!mm.check_range(
        GuestAddress(DATA),
        2 * PAGE_SIZE as usize + 1,
        Permissions::Read
    ));
    // Reads of never-written memory see zeros, from a zeroed frame of the
    // page's own: a device never gets the shared zero page (safe code may
    // write through any slice).
    let frames = space.frames_used();
    let mut z = [0xffu8; 32];
    mm.read_slice(&mut z, GuestAddress(RO)).unwrap();
    assert_eq!(z, [0u8; 32]);
    assert_eq!(space.frames_used(), frames + 1);
    // Atomic accesses (as virtio-queue uses for ring indices).
    mm.store(
        7u32,
        GuestAddress(DATA + 8),
        std::sync::atomic::Ordering::Release,
    )
    .unwrap();
    assert_eq!(
        mm.load::<u32>(GuestAddress(DATA + 8), std::sync::atomic::Ordering::Acquire)
            .unwrap(),
        7
    );
    assert!(mm
        .store(1u8, GuestAddress(RO), std::sync::atomic::Ordering::Relaxed)
        .is_err());
    // The guest's translator sees the device's writes, and the other way.
    let mut t = space.translator();
    assert_eq!(t.load::<u32>(DATA + 8).unwrap(), 7);
    t.store::<u64>(DATA + 16, 0x1234).unwrap();
    let v: u64 = mm.read_obj(GuestAddress(DATA + 16)).unwrap();
    assert_eq!(v, 0x1234);
    // After a fork, a device write breaks copy-on-write like a CPU write
    // (the view pins nothing across the fork: a pinned page would be
    // copied for the child instead, see tests/device_slices.rs).
    mm.release_pins();
    let child = space.fork().unwrap();
    mm.write_obj(0x5678u64, GuestAddress(DATA + 16)).unwrap();
    let c: u64 = child
        .guest_memory()
        .read_obj(GuestAddress(DATA + 16))
        .unwrap();
    assert_eq!(c, 0x1234);
    assert_eq!(t.load::<u64>(DATA + 16).unwrap(), 0x5678);
}
