//! The later life of a forced write's private copy (`write_forced`), which
//! the kernel comparison (`forced_access.rs`) cannot see from outside:
//! fork shares it copy-on-write, mprotect(PROT_WRITE) keeps it, other
//! spaces mapping the same object never see it, a shared read-only
//! mapping is refused, and a userfault-registered range goes through its
//! handler.

use aspace::uffd::Event;
use aspace::{
    Access, AddressSpace, Config, Error, FaultError, MapFlags, Memfd, MemoryFault, Prot, PAGE_SIZE,
};

const P: u64 = PAGE_SIZE;

/// A shared read-only mapping is refused with `AccessDenied` and nothing
/// written, shared anonymous memory as a memfd.
#[test]
fn forced_write_refuses_shared_read_only() {
    let mm = AddressSpace::new(Config::default());
    let a = mm
        .mmap(0, P, Prot::READ, MapFlags::SHARED | MapFlags::ANONYMOUS)
        .unwrap();
    assert_eq!(
        mm.write_forced(a + 3, b"x"),
        Err(Error::Memory(MemoryFault {
            addr: a + 3,
            kind: FaultError::AccessDenied,
            done: 0
        }))
    );
    let mut b = [9u8; 1];
    mm.read_forced(a + 3, &mut b).unwrap();
    assert_eq!(b, [0]);
}

/// A forced write's copy is an ordinary private page: fork shares it
/// copy-on-write (a later forced write on either side copies again, the
/// other keeps its bytes), and mprotect(PROT_WRITE) keeps it and lets a
/// plain store reuse it.
#[test]
fn forced_copy_is_shared_by_fork_and_kept_by_mprotect() {
    let mm = AddressSpace::new(Config::default());
    let text = mm
        .mmap(
            0,
            2 * P,
            Prot::READ | Prot::EXEC,
            MapFlags::PRIVATE | MapFlags::ANONYMOUS,
        )
        .unwrap();
    mm.read(text, &mut [0u8; 1]).unwrap(); // the zero page first
    mm.write_forced(text, b"parent-1").unwrap();
    let child = mm.fork().unwrap();
    let read = |m: &AddressSpace| {
        let mut b = [0u8; 8];
        m.read(text, &mut b).unwrap();
        b
    };
    assert_eq!(&read(&child), b"parent-1");
    mm.write_forced(text, b"parent-2").unwrap();
    assert_eq!(
        &read(&child),
        b"parent-1",
        "the child saw the parent's write"
    );
    child.write_forced(text, b"child--1").unwrap();
    assert_eq!(&read(&mm), b"parent-2", "the parent saw the child's write");
    for m in [&mm, &child] {
        let mut t = m.translator();
        assert_eq!(
            t.store::<u8>(text, 0).map_err(|e| e.kind),
            Err(FaultError::AccessDenied)
        );
    }
    drop(child);
    let frames = mm.frames_used();
    mm.mprotect(text, 2 * P, Prot::READ | Prot::WRITE).unwrap();
    assert_eq!(&read(&mm), b"parent-2");
    mm.write(text, b"plain").unwrap();
    assert_eq!(&read(&mm), b"plaint-2");
    assert_eq!(mm.frames_used(), frames, "the store reused the copy");
    assert_eq!(mm.vmas().len(), 1);
}

/// A private mapping of an object in another space still reads the
/// object's bytes after a forced write here.
#[test]
fn forced_write_leaves_the_object_to_other_spaces() {
    let pool = std::sync::Arc::new(aspace::FrameAllocator::new(64 << 20, true));
    let a_mm = AddressSpace::with_pool(Config::default(), pool.clone());
    let b_mm = AddressSpace::with_pool(Config::default(), pool.clone());
    let obj = Memfd::new_in(&pool, "lib", P).unwrap();
    let rw = Prot::READ | Prot::WRITE;
    let w = b_mm.mmap_fd(0, P, rw, MapFlags::SHARED, &obj, 0).unwrap();
    b_mm.write(w, b"library!").unwrap();
    let rx = Prot::READ | Prot::EXEC;
    let a = a_mm.mmap_fd(0, P, rx, MapFlags::PRIVATE, &obj, 0).unwrap();
    let b = b_mm.mmap_fd(0, P, rx, MapFlags::PRIVATE, &obj, 0).unwrap();
    let read = |m: &AddressSpace, at| {
        let mut v = [0u8; 8];
        m.read(at, &mut v).unwrap();
        v
    };
    assert_eq!(&read(&a_mm, a), b"library!");
    a_mm.write_forced(a, b"patched!").unwrap();
    assert_eq!(&read(&a_mm, a), b"patched!");
    assert_eq!(&read(&b_mm, b), b"library!");
    assert_eq!(&read(&b_mm, w), b"library!");
}

/// In a range registered for missing pages, a forced write goes to the
/// handler as a write fault would, then writes into what it filled; the
/// entry stays read-only.
#[test]
fn forced_write_in_a_userfault_range_waits_for_the_handler() {
    let mm = AddressSpace::new(Config::default());
    let rx = Prot::READ | Prot::EXEC;
    let a = mm
        .mmap(0, P, rx, MapFlags::PRIVATE | MapFlags::ANONYMOUS)
        .unwrap();
    let uffd = mm.userfaultfd();
    uffd.register(a, P).unwrap();
    std::thread::scope(|s| {
        let h = uffd.clone();
        s.spawn(move || {
            let Event::Pagefault { addr, rw, .. } = h.read_event() else {
                panic!("not a page fault")
            };
            assert_eq!(rw, aspace::uffd::ReadWrite::Write);
            h.copy(&[0x11; P as usize], addr, true).unwrap();
        });
        mm.write_forced(a + 8, b"\xcc\xcc").unwrap();
    });
    let mut b = [0u8; 12];
    mm.read(a + 4, &mut b).unwrap();
    assert_eq!(
        b,
        [0x11, 0x11, 0x11, 0x11, 0xcc, 0xcc, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11]
    );
    assert!(mm.fault(a, Access::Write).is_err());
    let mut t = mm.translator();
    assert_eq!(
        t.store::<u8>(a, 0).map_err(|e| e.kind),
        Err(FaultError::AccessDenied)
    );
}
