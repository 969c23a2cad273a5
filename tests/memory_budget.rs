//! The memory budget: frames, page tables and metadata share one limit; a
//! call that would pass it fails (ENOMEM, or the fault with OutOfMemory)
//! and leaves a space that still works. Shared objects are sparse, and
//! address spaces sharing one frame pool never see each other's bytes.

use aspace::{
    Access, AddressSpace, Config, Error, FaultError, FrameAllocator, MapFlags, Prot, VmaInfo,
    PAGE_SIZE,
};
use std::sync::{Arc, Mutex, MutexGuard};

/// The tests here measure the process's RSS: each holds this lock, so no
/// other test of the binary allocates meanwhile.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

const RW: Prot = Prot::READ.union(Prot::WRITE);
const ANON: MapFlags = MapFlags::PRIVATE.union(MapFlags::ANONYMOUS);
const SHARED: MapFlags = MapFlags::SHARED.union(MapFlags::ANONYMOUS);
const TIB: u64 = 1 << 40;

fn with_budget(bytes: u64) -> AddressSpace {
    AddressSpace::new(Config {
        memory_budget: bytes,
        ..Config::default()
    })
}

/// Resident set size of this process, from /proc/self/statm.
fn rss_bytes() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").expect("statm");
    let pages: u64 = s.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

fn assert_consistent(v: &[VmaInfo], task_size: u64) {
    for w in v.windows(2) {
        assert!(w[0].end <= w[1].start, "sorted and disjoint: {v:?}");
    }
    for x in v {
        assert!(x.start < x.end && x.end <= task_size);
        assert_eq!(x.start % PAGE_SIZE, 0);
        assert_eq!(x.end % PAGE_SIZE, 0);
    }
}

/// A small mapping made now works end to end.
fn small_mapping_works(mm: &AddressSpace) {
    let a = mm.mmap(0, 2 * PAGE_SIZE, RW, ANON).unwrap();
    mm.write(a + 4094, b"ok!!").unwrap();
    let mut b = [0u8; 4];
    mm.read(a + 4094, &mut b).unwrap();
    assert_eq!(&b, b"ok!!");
    mm.munmap(a, 2 * PAGE_SIZE).unwrap();
}

#[test]
fn huge_shared_mapping_costs_what_it_touches() {
    let _serial = serial();
    let mm = AddressSpace::new(Config::default());
    let len = 64 * TIB;
    // NORESERVE: Linux's heuristic overcommit refuses 64 TiB of accounted
    // shared memory (ENOMEM); aspace keeps no commit limit, and with
    // NORESERVE both map it.
    let a = mm.mmap(0, len, RW, SHARED | MapFlags::NORESERVE).unwrap();
    // SAFETY: a fresh anonymous mapping at the kernel's choice of address
    // touches no memory of this process; it is unmapped at once.
    unsafe {
        let k = libc::mmap(
            std::ptr::null_mut(),
            len as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        );
        assert_ne!(k, libc::MAP_FAILED, "Linux maps it too");
        libc::munmap(k, len as usize);
    }
    let offs = [0, PAGE_SIZE, (len / 3) & !(PAGE_SIZE - 1), len - PAGE_SIZE];
    for (i, &o) in offs.iter().enumerate() {
        mm.write(a + o, &[i as u8 + 1; 16]).unwrap();
    }
    for (i, &o) in offs.iter().enumerate() {
        let mut b = [0u8; 16];
        mm.read(a + o, &mut b).unwrap();
        assert_eq!(b, [i as u8 + 1; 16]);
    }
    // A fork shares the object: it sees the bytes and its writes.
    let child = mm.fork().unwrap();
    child.write(a + offs[2], b"child").unwrap();
    let mut b = [0u8; 5];
    mm.read(a + offs[2], &mut b).unwrap();
    assert_eq!(&b, b"child");
    drop(child);
    assert_eq!(mm.frames_used(), offs.len() as u64);
    // Four pages, their page tables and the object's tree: well under 1 MiB.
    assert!(
        mm.memory_used() < 1 << 20,
        "{} bytes charged",
        mm.memory_used()
    );
    mm.munmap(a, len).unwrap();
    assert_eq!(mm.frames_used(), 0);
}

#[test]
fn populate_stops_at_the_budget() {
    let _serial = serial();
    let budget = 32 << 20;
    let mm = with_budget(budget);
    let rss0 = rss_bytes();
    // Linux's MAP_POPULATE is best effort (__mm_populate ignores errors):
    // the mapping is made, the rest stays unpopulated.
    let len = 64 * TIB;
    let a = mm
        .mmap(0, len, Prot::READ, ANON | MapFlags::POPULATE)
        .unwrap();
    let used = mm.memory_used();
    assert!(used <= budget, "{used} charged against {budget}");
    assert!(mm.page_table_bytes() <= budget);
    assert!(
        mm.page_table_bytes() > budget / 2,
        "populate used the budget"
    );
    let grew = rss_bytes().saturating_sub(rss0);
    assert!(grew < budget + (16 << 20), "host grew {grew} bytes");
    // Populated pages read as zeros; past the budget a fault fails.
    let mut b = [1u8; 8];
    mm.read(a, &mut b).unwrap();
    assert_eq!(b, [0; 8]);
    let oom = mm.stats().fault_oom;
    assert_eq!(
        mm.fault(a + len - PAGE_SIZE, Access::Read),
        Err(FaultError::OutOfMemory)
    );
    assert_eq!(mm.stats().fault_oom, oom + 1);
    assert_consistent(&mm.vmas(), mm.config().task_size);
    assert_eq!(mm.vmas().len(), 1);
    // Unmapping gives the page tables back.
    mm.munmap(a, len).unwrap();
    assert!(mm.memory_used() < 64 << 10, "{}", mm.memory_used());
    small_mapping_works(&mm);
}

#[test]
fn exhaustion_leaves_a_consistent_space() {
    let _serial = serial();
    let budget = 1 << 20;
    let mm = with_budget(budget);
    let len = 4 << 20;
    let a = mm.mmap(0, len, RW, ANON).unwrap();
    // Write pages until the budget is spent.
    let mut n = 0;
    while n < len / PAGE_SIZE {
        match mm.fault(a + n * PAGE_SIZE, Access::Write) {
            Ok(()) => mm.write(a + n * PAGE_SIZE, &n.to_le_bytes()).unwrap(),
            Err(e) => {
                assert_eq!(e, FaultError::OutOfMemory);
                break;
            }
        }
        n += 1;
    }
    assert!(n > 100 && n < budget / PAGE_SIZE, "{n} pages in 1 MiB");
    let e = mm.write(a + n * PAGE_SIZE, b"x").unwrap_err();
    assert_eq!(e.errno(), Error::NoMem.errno(), "{e:?}");
    assert!(mm.memory_used() <= budget);
    // New mappings take metadata until there is none left: then ENOMEM.
    let mut small = Vec::new();
    let err = loop {
        let prot = if small.len() % 2 == 0 { Prot::READ } else { RW };
        match mm.mmap(
            0x1000_0000 + 2 * PAGE_SIZE * small.len() as u64,
            PAGE_SIZE,
            prot,
            ANON | MapFlags::FIXED_NOREPLACE,
        ) {
            Ok(x) => small.push(x),
            Err(e) => break e,
        }
        assert!(small.len() < 100, "metadata is charged");
    };
    assert_eq!(err, Error::NoMem);
    assert!(mm.memory_used() <= budget);
    // A split needs a VMA too: mprotect fails and changes nothing.
    let before = mm.vmas();
    assert_eq!(
        mm.mprotect(a + PAGE_SIZE, PAGE_SIZE, Prot::READ),
        Err(Error::NoMem)
    );
    assert_eq!(mm.vmas(), before);
    assert_consistent(&before, mm.config().task_size);
    // So do fork (ENOMEM) and a brk that needs a new heap VMA (the break
    // stays, as Linux's brk reports failure).
    assert!(matches!(mm.fork(), Err(Error::NoMem)));
    let brk = mm.brk(0).unwrap();
    assert_eq!(mm.brk(brk + PAGE_SIZE), Ok(brk));
    assert_eq!(mm.vmas(), before);
    // What was written is intact.
    for i in 0..n {
        let mut b = [0u8; 8];
        mm.read(a + i * PAGE_SIZE, &mut b).unwrap();
        assert_eq!(u64::from_le_bytes(b), i);
    }
    // Unmapping whole VMAs needs nothing and frees memory; then it works.
    for x in small {
        mm.munmap(x, PAGE_SIZE).unwrap();
    }
    mm.munmap(a, len).unwrap();
    assert_eq!(mm.frames_used(), 0);
    small_mapping_works(&mm);
}

#[test]
fn spaces_sharing_a_pool_never_see_each_others_bytes() {
    let _serial = serial();
    // The pool zeroes reused frames; a space's Config cannot turn it off.
    let pool = Arc::new(FrameAllocator::new(16 << 20, true));
    let cfg = Config {
        zero_pages: false,
        ..Config::default()
    };
    let pages = 256;
    let len = pages * PAGE_SIZE;
    let a = AddressSpace::with_pool(cfg.clone(), pool.clone());
    let x = a.mmap(0, len, RW, ANON).unwrap();
    let s = a.mmap(0, len, RW, SHARED).unwrap();
    a.write(x, &vec![0xa5; len as usize]).unwrap();
    a.write(s, &vec![0x5a; len as usize]).unwrap();
    assert_eq!(pool.used(), 2 * pages);
    drop(a);
    assert_eq!(pool.used(), 0);

    let b = AddressSpace::with_pool(cfg, pool.clone());
    let y = b.mmap(0, len, RW, ANON).unwrap();
    let t = b.mmap(0, len, Prot::READ, SHARED).unwrap();
    let mut page = vec![0u8; PAGE_SIZE as usize];
    for i in 0..pages {
        // A write fault gives a frame; every other byte must be zero.
        b.write(y + i * PAGE_SIZE, &[1]).unwrap();
        b.read(y + i * PAGE_SIZE, &mut page).unwrap();
        assert!(page[1..].iter().all(|&c| c == 0), "private page {i}");
        // A read of a shared object allocates its frame.
        b.read(t + i * PAGE_SIZE, &mut page).unwrap();
        assert!(page.iter().all(|&c| c == 0), "shared page {i}");
    }
    assert_eq!(pool.used(), 2 * pages, "B reused A's frames");
}

#[test]
fn accounting_returns_to_zero_after_drop() {
    let _serial = serial();
    let pool = Arc::new(FrameAllocator::new(64 << 20, true));
    let spaces: Vec<AddressSpace> = (0..4)
        .map(|_| AddressSpace::with_pool(Config::default(), pool.clone()))
        .collect();
    let mut children = Vec::new();
    for mm in &spaces {
        let a = mm.mmap(0, 64 * PAGE_SIZE, RW, ANON).unwrap();
        mm.write(a, &[7; 20000]).unwrap();
        let s = mm.mmap(0, TIB, RW, SHARED).unwrap();
        mm.write(s + TIB / 2, b"shared").unwrap();
        mm.mprotect(a + PAGE_SIZE, PAGE_SIZE, Prot::READ).unwrap();
        // Merging back and unmapping a whole VMA free VMAs.
        mm.mprotect(a + PAGE_SIZE, PAGE_SIZE, RW).unwrap();
        mm.mprotect(a + PAGE_SIZE, PAGE_SIZE, Prot::READ).unwrap();
        mm.munmap(a, PAGE_SIZE).unwrap();
        let b = mm
            .mremap(
                a + 2 * PAGE_SIZE,
                62 * PAGE_SIZE,
                128 * PAGE_SIZE,
                aspace::MremapFlags::MAYMOVE,
                0,
            )
            .unwrap();
        mm.write(b + 100 * PAGE_SIZE, b"grown").unwrap();
        let _ = mm.brk(mm.brk(0).unwrap() + 8 * PAGE_SIZE).unwrap();
        let c = mm.fork().unwrap();
        c.write(b, b"cow").unwrap();
        children.push(c);
    }
    assert!(pool.used() > 0 && pool.memory().used() > pool.used() * PAGE_SIZE);
    drop(children);
    drop(spaces);
    assert_eq!(pool.used(), 0);
    assert_eq!(pool.memory().used(), 0, "tables and VMAs uncharged");
}

#[test]
fn a_space_with_no_budget_refuses_calmly() {
    let _serial = serial();
    let mm = with_budget(0);
    assert_eq!(mm.mmap(0, PAGE_SIZE, RW, ANON), Err(Error::NoMem));
    assert_eq!(mm.map_count(), 0);
    assert_eq!(mm.fault(0x10000, Access::Read), Err(FaultError::NoMapping));
}
