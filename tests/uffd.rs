//! Userfault handlers through the public API: many faulting threads served
//! by many handler threads, racing copies (`EEXIST`), waiters woken by
//! unregister (and kept waiting where its ENOMEM leaves them registered),
//! by dropping the handle and by munmap, synchronous
//! write-protect events, async write-protect with `pagemap_scan` under a
//! concurrent writer, the memory budget, VMA splits and merges, and bad
//! input. `kernel` at the end runs the same calls on the running kernel's
//! `userfaultfd(2)` and `PAGEMAP_SCAN` and compares errno and results.

use aspace::uffd::{
    Event, FaultKind, IoctlFlags, PageCategories, ReadWrite, RegisterMode, ScanArgs, ScanFlags,
};
use aspace::{
    AddressSpace, Config, Error, FaultError, FaultLocking, MapFlags, Memfd, Prot, Uffd,
    UffdBuilder, WriterLocking, PAGE_SIZE,
};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;
#[path = "common/written.rs"]
mod written;
use written::{pages_of, written_args};

const P: u64 = PAGE_SIZE;

fn rw() -> Prot {
    Prot::READ | Prot::WRITE
}

fn anon() -> MapFlags {
    MapFlags::PRIVATE | MapFlags::ANONYMOUS
}

/// The page a handler serves at `addr`: bytes derived from the address.
fn page_for(addr: u64) -> Vec<u8> {
    (0..P).map(|i| ((addr / P) as u8) ^ (i as u8)).collect()
}

fn errno<T: std::fmt::Debug>(r: Result<T, impl Into<Error>>) -> i32 {
    r.map_err(Into::into).unwrap_err().errno()
}

/// Waits for the next event (failing the test after a generous timeout).
fn next_event(u: &Uffd<'_>) -> Event {
    u.read_event_timeout(Duration::from_secs(20))
        .expect("an event within 20 s")
}

fn fault_addr(ev: Event) -> (FaultKind, ReadWrite, u64) {
    match ev {
        Event::Pagefault { kind, rw, addr, .. } => (kind, rw, addr),
        e => panic!("unexpected {e:?}"),
    }
}

#[test]
fn many_faulters_many_handlers() {
    const PAGES: u64 = 96;
    let mm = AddressSpace::new(Config::default());
    let a = mm.mmap(0, PAGES * P, rw(), anon()).unwrap();
    let uffd = mm.userfaultfd();
    let ioctls = uffd
        .register_with_mode(a, PAGES * P, RegisterMode::MISSING)
        .unwrap();
    assert!(ioctls.contains(IoctlFlags::COPY | IoctlFlags::ZEROPAGE | IoctlFlags::WAKE));
    assert!(!ioctls.intersects(IoctlFlags::CONTINUE | IoctlFlags::WRITE_PROTECT));
    let done = AtomicBool::new(false);
    let served = AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..3 {
            let u = uffd.clone();
            let (done, served) = (&done, &served);
            s.spawn(move || {
                while !done.load(Ordering::Acquire) {
                    let Some(ev) = u.read_event_timeout(Duration::from_millis(20)) else {
                        continue;
                    };
                    let (kind, _, addr) = fault_addr(ev);
                    assert_eq!(kind, FaultKind::Missing);
                    assert_eq!(addr % P, 0, "page-aligned address");
                    match u.copy(&page_for(addr), addr, true) {
                        Ok(n) => {
                            assert_eq!(n, P);
                            served.fetch_add(1, Ordering::Relaxed);
                        }
                        // Another handler won the page: wake our waiter.
                        Err(e) => {
                            assert_eq!(e.error, Error::Exist, "{e}");
                            u.wake(addr, P).unwrap();
                        }
                    }
                }
            });
        }
        let workers: Vec<_> = (0..4u64)
            .map(|t| {
                let mm = &mm;
                s.spawn(move || {
                    for i in 0..PAGES {
                        // Every thread touches every page, in different orders.
                        let p = a + ((i * (2 * t + 1) + t * 7) % PAGES) * P;
                        let mut b = [0u8; 2];
                        if t % 2 == 0 {
                            mm.read(p + 100, &mut b).unwrap();
                        } else {
                            mm.write(p + 4000, &page_for(p)[4000..4002]).unwrap();
                            mm.read(p + 100, &mut b).unwrap();
                        }
                        assert_eq!(b, page_for(p)[100..102]);
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        done.store(true, Ordering::Release);
    });
    assert_eq!(served.load(Ordering::Relaxed), PAGES, "one copy per page");
    for i in 0..PAGES {
        let mut b = vec![0u8; P as usize];
        mm.read(a + i * P, &mut b).unwrap();
        assert_eq!(b, page_for(a + i * P));
    }
    assert!(mm.stats().userfaults >= PAGES);
}

#[test]
fn copy_into_present_page_is_eexist_with_partial_progress() {
    let mm = AddressSpace::new(Config::default());
    let a = mm.mmap(0, 4 * P, rw(), anon()).unwrap();
    let uffd = mm.userfaultfd();
    uffd.register(a, 4 * P).unwrap();
    assert_eq!(uffd.copy(&page_for(a + P), a + P, false), Ok(P));
    let e = uffd.copy(&page_for(a + P), a + P, false).unwrap_err();
    assert_eq!((e.copied, e.error), (0, Error::Exist));
    assert_eq!(errno(uffd.zeropage(a + P, P, false)), Error::Exist.errno());
    // Three pages whose second is present: one copied, then EAGAIN.
    let e = uffd.copy(&vec![9u8; 3 * P as usize], a, false).unwrap_err();
    assert_eq!((e.copied, e.error), (P, Error::Again));
    let mut b = [0u8; 1];
    mm.read(a, &mut b).unwrap();
    assert_eq!(b, [9]);
    mm.read(a + P, &mut b).unwrap();
    assert_eq!(b, [page_for(a + P)[0]], "the present page is untouched");
    // Zeropage maps the zero page: no frame.
    let used = mm.frames_used();
    assert_eq!(uffd.zeropage(a + 3 * P, P, true), Ok(P));
    assert_eq!(mm.frames_used(), used);
    mm.read(a + 3 * P, &mut b).unwrap();
    assert_eq!(b, [0]);
}

#[test]
fn racing_copies_one_wins() {
    let mm = AddressSpace::new(Config::default());
    let a = mm.mmap(0, 64 * P, rw(), anon()).unwrap();
    let uffd = mm.userfaultfd();
    uffd.register(a, 64 * P).unwrap();
    let wins = Mutex::new(vec![0u8; 64]);
    std::thread::scope(|s| {
        for t in 1..=4u8 {
            let (u, wins) = (uffd.clone(), &wins);
            s.spawn(move || {
                for i in 0..64 {
                    match u.copy(&[t; P as usize], a + i * P, true) {
                        Ok(_) => {
                            let mut w = wins.lock().unwrap();
                            assert_eq!(w[i as usize], 0, "two copies won page {i}");
                            w[i as usize] = t;
                        }
                        Err(e) => assert_eq!(e.error, Error::Exist),
                    }
                }
            });
        }
    });
    for (i, &t) in wins.lock().unwrap().iter().enumerate() {
        let mut b = [0u8; 1];
        mm.read(a + i as u64 * P, &mut b).unwrap();
        assert_eq!(b, [t], "page {i} holds its winner's bytes");
    }
}

/// Runs a reader of `addr` that blocks, waits for its event, runs
/// `then`, and returns what the reader got: the byte, or the error.
fn blocked_read(
    mm: &AddressSpace,
    uffd: Uffd<'_>,
    addr: u64,
    then: impl FnOnce(Uffd<'_>),
) -> Result<u8, Error> {
    std::thread::scope(|s| {
        let r = s.spawn(|| {
            let mut b = [0xffu8; 1];
            mm.read(addr, &mut b).map(|()| b[0])
        });
        let (kind, rw, at) = fault_addr(next_event(&uffd));
        assert_eq!((kind, rw, at), (FaultKind::Missing, ReadWrite::Read, addr));
        then(uffd);
        r.join().unwrap()
    })
}

fn memory_kind(r: Result<u8, Error>) -> FaultError {
    match r {
        Err(Error::Memory(m)) => m.kind,
        other => panic!("expected a memory fault, got {other:?}"),
    }
}

#[test]
fn every_fault_path_delivers_and_retries() {
    for locking in [
        FaultLocking::PerVma,
        FaultLocking::MmapLock,
        FaultLocking::Speculative,
    ] {
        let mm = AddressSpace::new(Config {
            fault_locking: locking,
            ..Config::default()
        });
        let a = mm.mmap(0, 4 * P, rw(), anon()).unwrap();
        // A touched neighbour page: the speculative path has a table.
        mm.write(a + 3 * P, &[1]).unwrap();
        let uffd = mm.userfaultfd();
        uffd.register(a, 2 * P).unwrap();
        let r = blocked_read(&mm, uffd.clone(), a + P, |u| {
            u.copy(&page_for(a + P), a + P, true).unwrap();
        });
        assert!(r.is_ok(), "{locking:?}: {r:?}");
        let mut b = [0u8; 1];
        mm.read(a + P, &mut b).unwrap();
        assert_eq!(b, [page_for(a + P)[0]], "{locking:?}");
        assert_eq!(mm.stats().userfaults, 1, "{locking:?}");
    }
}

/// A guest thread blocked on a missing page; the manager unregisters the
/// range without resolving it. Linux wakes the fault, which retries as an
/// ordinary fault of the now unregistered VMA: it reads zeros, and no
/// SIGBUS reaches the guest.
#[test]
fn unregister_wakes_waiters_to_fill_normally() {
    for locking in [FaultLocking::PerVma, FaultLocking::MmapLock] {
        let mm = AddressSpace::new(Config {
            fault_locking: locking,
            ..Config::default()
        });
        let a = mm.mmap(0, 4 * P, rw(), anon()).unwrap();
        let uffd = mm.userfaultfd();
        uffd.register(a, 4 * P).unwrap();
        assert_eq!(mm.map_count(), 1);
        let u2 = uffd.clone();
        let r = blocked_read(&mm, uffd, a + P, move |u| u.unregister(a, 4 * P).unwrap());
        assert_eq!(r, Ok(0), "{locking:?}");
        assert!(u2.try_read_event().is_none());
        assert_eq!(mm.stats().sigbus, 0, "{locking:?}");
        assert_eq!(mm.stats().userfaults, 1, "{locking:?}");
    }
}

/// The manager closes its descriptor (drops the last handle) after its
/// last copy while a guest fault still waits: Linux's release wakes the
/// fault and it fills the page normally ("a manager can close the uffd
/// after the last UFFDIO_COPY without SIGBUS to the guest").
#[test]
fn dropping_the_last_handle_wakes_waiters_and_unregisters() {
    let mm = AddressSpace::new(Config::default());
    let a = mm.mmap(0, 4 * P, rw(), anon()).unwrap();
    let uffd = mm.userfaultfd();
    uffd.register(a + P, P).unwrap();
    assert_eq!(mm.map_count(), 3);
    let r = blocked_read(&mm, uffd, a + P, |u| drop(u));
    assert_eq!(r, Ok(0));
    assert_eq!(mm.stats().sigbus, 0);
    assert_eq!(mm.map_count(), 1, "released ranges merge back");
    assert!(mm.vmas().iter().all(|v| !v.flags.intersects(
        aspace::VmFlags::UFFD_MISSING | aspace::VmFlags::UFFD_WP | aspace::VmFlags::UFFD_MINOR
    )));
    mm.write(a + P, &[3]).unwrap();
}

/// Unregister fails with ENOMEM part-way (a split past `max_map_count`):
/// the fault in the part it unregistered fills normally; the fault in the
/// VMA that stays registered keeps waiting (its event still queued) until
/// the handler resolves it.
#[test]
fn unregister_enomem_keeps_waiters_of_still_registered_vmas() {
    let mm = AddressSpace::new(Config {
        max_map_count: 2,
        ..Config::default()
    });
    // Two VMAs that cannot merge: [a, a+2P) read-write, [a+2P, a+4P)
    // read-only.
    let a = mm.mmap(0, 4 * P, rw(), anon()).unwrap();
    mm.mprotect(a + 2 * P, 2 * P, Prot::READ).unwrap();
    let uffd = mm.userfaultfd();
    uffd.register(a, 4 * P).unwrap();
    assert_eq!(mm.map_count(), 2);
    std::thread::scope(|s| {
        let read = |addr: u64| {
            let mm = &mm;
            s.spawn(move || {
                let mut b = [9u8; 1];
                mm.read(addr, &mut b).map(|()| b[0])
            })
        };
        let first = read(a + P);
        assert_eq!(fault_addr(next_event(&uffd)).2, a + P);
        let second = read(a + 2 * P);
        assert_eq!(fault_addr(next_event(&uffd)).2, a + 2 * P);
        // The first VMA unregisters whole; the second must split at a+3P,
        // a third VMA: ENOMEM, and it stays registered.
        assert_eq!(uffd.unregister(a, 3 * P), Err(Error::NoMem));
        assert_eq!(mm.map_count(), 2);
        uffd.copy(&page_for(a + 2 * P), a + 2 * P, true).unwrap();
        assert_eq!(second.join().unwrap(), Ok(page_for(a + 2 * P)[0]));
        assert_eq!(first.join().unwrap(), Ok(0));
    });
    assert_eq!(mm.stats().sigbus, 0);
    assert_eq!(mm.stats().userfaults, 2);
}

#[test]
fn munmap_wakes_waiters_into_sigsegv() {
    let mm = AddressSpace::new(Config::default());
    let a = mm.mmap(0, 4 * P, rw(), anon()).unwrap();
    let uffd = mm.userfaultfd();
    uffd.register(a, 4 * P).unwrap();
    let r = blocked_read(&mm, uffd.clone(), a + 2 * P, |_| {
        mm.munmap(a, 4 * P).unwrap()
    });
    assert_eq!(memory_kind(r), FaultError::NoMapping);
    assert_eq!(
        errno(uffd.copy(&[0; P as usize], a, true)),
        Error::NoEnt.errno()
    );
}

/// A brk that shrinks a registered heap (only the heap VMA's end moves,
/// with nothing unmapped whole) wakes the faults waiting in the cut
/// pages as munmap does: they retry and find no mapping.
#[test]
fn brk_shrink_wakes_waiters_into_sigsegv() {
    for writer_locking in [WriterLocking::MmapLock, WriterLocking::Range] {
        let mm = AddressSpace::new(Config {
            writer_locking,
            ..Config::default()
        });
        let h = mm.brk(0).unwrap();
        mm.brk(h + 4 * P).unwrap();
        let uffd = mm.userfaultfd();
        uffd.register(h, 4 * P).unwrap();
        let r = blocked_read(&mm, uffd.clone(), h + 2 * P, |_| {
            assert_eq!(mm.brk(h + P), Ok(h + P));
        });
        assert_eq!(memory_kind(r), FaultError::NoMapping, "{writer_locking:?}");
        assert_eq!(mm.vmas().len(), 1);
    }
}

#[test]
fn write_protect_sync_events() {
    let mm = AddressSpace::new(Config::default());
    let a = mm.mmap(0, 4 * P, rw(), anon()).unwrap();
    let uffd = mm.userfaultfd();
    let io = uffd
        .register_with_mode(
            a,
            4 * P,
            RegisterMode::MISSING | RegisterMode::WRITE_PROTECT,
        )
        .unwrap();
    assert!(io.contains(IoctlFlags::WRITE_PROTECT));
    uffd.copy(&[1; 2 * P as usize], a, true).unwrap();
    uffd.copy_wp(&[2; P as usize], a + 2 * P, true).unwrap();
    uffd.write_protect(a, 2 * P).unwrap();
    // Reads go through; writes wait for the handler.
    let mut b = [0u8; 1];
    mm.read(a, &mut b).unwrap();
    assert_eq!(b, [1]);
    std::thread::scope(|s| {
        let w = s.spawn(|| {
            mm.write(a + P + 5, &[7]).unwrap();
            mm.write(a + 2 * P, &[8]).unwrap();
        });
        for (want, data) in [(a + P, 1u8), (a + 2 * P, 2u8)] {
            let (kind, rw, at) = fault_addr(next_event(&uffd));
            assert_eq!(
                (kind, rw, at),
                (FaultKind::WriteProtect, ReadWrite::Write, want)
            );
            let mut b = [0u8; 1];
            mm.read(want, &mut b).unwrap();
            assert_eq!(b, [data], "nothing written yet");
            uffd.remove_write_protection(want, P, true).unwrap();
        }
        w.join().unwrap();
    });
    mm.read(a + P + 5, &mut b).unwrap();
    assert_eq!(b, [7]);
    // Still protected: page 0.
    assert!(uffd.try_read_event().is_none());
    // mprotect round trip keeps the protection; fork children drop it.
    mm.mprotect(a, 4 * P, Prot::READ).unwrap();
    mm.mprotect(a, 4 * P, rw()).unwrap();
    let child = mm.fork().unwrap();
    child.write(a, &[5]).unwrap();
    std::thread::scope(|s| {
        let w = s.spawn(|| mm.write(a, &[6]).unwrap());
        let (kind, _, at) = fault_addr(next_event(&uffd));
        assert_eq!((kind, at), (FaultKind::WriteProtect, a));
        uffd.remove_write_protection(a, P, true).unwrap();
        w.join().unwrap();
    });
    child.read(a, &mut b).unwrap();
    assert_eq!(b, [5]);
    mm.read(a, &mut b).unwrap();
    assert_eq!(b, [6]);
}

#[test]
fn async_write_protect_tracks_every_write_under_a_concurrent_writer() {
    const PAGES: u64 = 256;
    let mm = AddressSpace::new(Config::default());
    let a = mm.mmap(0, PAGES * P, rw(), anon()).unwrap();
    let uffd = UffdBuilder::new().wp_async(true).create(&mm);
    uffd.register_with_mode(a, PAGES * P, RegisterMode::WRITE_PROTECT)
        .unwrap();
    mm.write(a, &vec![1u8; (PAGES * P) as usize]).unwrap();
    assert_eq!(pages_of(&mm, a, PAGES * P, true).len() as u64, PAGES);
    assert!(pages_of(&mm, a, PAGES * P, false).is_empty(), "reset");
    mm.write(a + 3 * P, &[2]).unwrap();
    assert_eq!(
        pages_of(&mm, a, PAGES * P, false),
        BTreeSet::from([a + 3 * P])
    );
    assert!(mm.stats().uffd_wp_async >= 1);
    // A writer records each page after its store returns; each scan
    // resets what it reports. Every recorded page must be in some scan.
    let stop = AtomicBool::new(false);
    let written = Mutex::new(BTreeSet::new());
    let mut reported = BTreeSet::new();
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut x = 0x9e37_79b9_7f4a_7c15u64;
            let mut tr = mm.translator();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) || n < 2000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let p = a + (x % PAGES) * P;
                if n % 2 == 0 {
                    mm.write(p + (x >> 40) % P, &[x as u8]).unwrap();
                } else {
                    // Through a soft TLB: its cached writable entries must
                    // be flushed by every scan.
                    tr.store::<u8>(p + (x >> 40) % P, x as u8).unwrap();
                }
                written.lock().unwrap().insert(p);
                n += 1;
            }
        });
        for _ in 0..200 {
            reported.extend(pages_of(&mm, a, PAGES * P, true));
        }
        stop.store(true, Ordering::Relaxed);
    });
    reported.extend(pages_of(&mm, a, PAGES * P, true));
    let written = written.into_inner().unwrap();
    let lost: Vec<_> = written.difference(&reported).collect();
    assert!(lost.is_empty(), "writes never reported: {lost:x?}");
    assert!(uffd.try_read_event().is_none(), "async: no events");
}

#[test]
fn mremap_moves_out_of_the_registration_and_drops_the_bits() {
    let mm = AddressSpace::new(Config::default());
    let a = mm.mmap(0, 4 * P, rw(), anon()).unwrap();
    let uffd = UffdBuilder::new().wp_async(true).create(&mm);
    uffd.register_with_mode(a, 4 * P, RegisterMode::WRITE_PROTECT)
        .unwrap();
    mm.write(a, &[1u8; 4 * P as usize]).unwrap();
    uffd.write_protect(a, 4 * P).unwrap();
    assert!(pages_of(&mm, a, 4 * P, false).is_empty());
    // A neighbour forces the grow to move.
    mm.mmap(a + 4 * P, P, Prot::READ, anon() | MapFlags::FIXED)
        .unwrap();
    let b = mm
        .mremap(a, 4 * P, 8 * P, aspace::MremapFlags::MAYMOVE, 0)
        .unwrap();
    assert_ne!(a, b);
    // Unregistered there, and no page keeps the bit.
    assert_eq!(pages_of(&mm, b, 8 * P, false).len(), 4);
    assert_eq!(errno(uffd.write_protect(b, P)), Error::NoEnt.errno());
    mm.write(b, &[2]).unwrap();
    assert!(uffd.try_read_event().is_none());
}

#[test]
fn write_protect_flushes_translators() {
    let mm = AddressSpace::new(Config::default());
    let a = mm.mmap(0, P, rw(), anon()).unwrap();
    let uffd = UffdBuilder::new().wp_async(true).create(&mm);
    uffd.register_with_mode(a, P, RegisterMode::WRITE_PROTECT)
        .unwrap();
    let mut tr = mm.translator();
    tr.store::<u64>(a, 1).unwrap(); // caches a writable translation
    uffd.write_protect(a, P).unwrap();
    assert!(pages_of(&mm, a, P, false).is_empty());
    tr.store::<u64>(a, 2).unwrap();
    assert_eq!(pages_of(&mm, a, P, false), BTreeSet::from([a]));
}

#[test]
fn minor_faults_continue_into_the_object() {
    let mm = AddressSpace::new(Config::default());
    let fd = Memfd::new_in(mm.frame_pool(), "img", 4 * P).unwrap();
    fd.write_at(b"object", P).unwrap();
    let a = mm
        .mmap_fd(0, 4 * P, rw(), MapFlags::SHARED, &fd, 0)
        .unwrap();
    let uffd = mm.userfaultfd();
    let io = uffd
        .register_with_mode(a, 4 * P, RegisterMode::MINOR | RegisterMode::MISSING)
        .unwrap();
    assert!(io.contains(IoctlFlags::CONTINUE));
    std::thread::scope(|s| {
        let r = s.spawn(|| {
            let mut b = [0u8; 6];
            mm.read(a + P, &mut b).unwrap();
            b
        });
        let (kind, _, at) = fault_addr(next_event(&uffd));
        assert_eq!((kind, at), (FaultKind::Minor, a + P));
        assert_eq!(uffd.continue_(a + P, P, true), Ok(P));
        assert_eq!(&r.join().unwrap(), b"object");
        // A page the object lacks is a missing fault; copy fills the object.
        let r = s.spawn(|| {
            let mut b = [0u8; 1];
            mm.read(a + 2 * P, &mut b).unwrap();
            b
        });
        let (kind, _, at) = fault_addr(next_event(&uffd));
        assert_eq!((kind, at), (FaultKind::Missing, a + 2 * P));
        uffd.copy(&[4; P as usize], a + 2 * P, true).unwrap();
        assert_eq!(r.join().unwrap(), [4]);
    });
    let mut b = [0u8; 1];
    fd.read_at(&mut b, 2 * P).unwrap();
    assert_eq!(b, [4], "the copy went into the object");
    assert_eq!(
        errno(uffd.continue_(a + 3 * P, P, true)),
        Error::Fault.errno()
    );
    assert_eq!(errno(uffd.continue_(a + P, P, true)), Error::Exist.errno());
}

#[test]
fn registration_splits_and_merges_and_never_merges_across_handles() {
    let mm = AddressSpace::new(Config::default());
    let a = mm.mmap(0, 6 * P, rw(), anon()).unwrap();
    let u1 = mm.userfaultfd();
    let u2 = mm.userfaultfd();
    u1.register(a + P, P).unwrap();
    u2.register(a + 2 * P, P).unwrap();
    assert_eq!(mm.map_count(), 4);
    assert_eq!(errno(u2.register(a + P, 2 * P)), Error::Busy.errno());
    assert_eq!(errno(u2.unregister(a, 3 * P)), Error::Inval.errno());
    // Extending u1's registration merges with its own VMA only.
    u1.register(a, P).unwrap();
    assert_eq!(mm.map_count(), 3);
    u2.unregister(a + 2 * P, P).unwrap();
    u1.unregister(a, 6 * P).unwrap();
    assert_eq!(mm.map_count(), 1);
    // A different mode on part of a registration splits it.
    u1.register(a, 6 * P).unwrap();
    u1.register_with_mode(a + P, P, RegisterMode::WRITE_PROTECT)
        .unwrap();
    assert_eq!(mm.map_count(), 3);
    drop(u1);
    assert_eq!(mm.map_count(), 1);
}

#[test]
fn the_budget_is_respected() {
    let cfg = Config {
        memory_budget: 64 * P,
        ..Config::default()
    };
    let mm = AddressSpace::new(cfg);
    let a = mm.mmap(0, 256 * P, rw(), anon()).unwrap();
    let uffd = mm.userfaultfd();
    uffd.register(a, 256 * P).unwrap();
    let e = uffd
        .copy(&vec![1u8; 256 * P as usize], a, true)
        .unwrap_err();
    assert_eq!(e.error, Error::Again);
    assert!(e.copied > 0 && e.copied < 64 * P, "{e}");
    assert!(mm.memory_used() <= 64 * P);
    let next = a + e.copied;
    assert_eq!(
        errno(uffd.copy(&[1; P as usize], next, true)),
        Error::NoMem.errno()
    );
    // Zero pages cost no frame.
    assert_eq!(uffd.zeropage(next, P, true), Ok(P));
}

#[test]
fn bad_input_gives_errno_and_changes_nothing() {
    let mm = AddressSpace::new(Config::default());
    let a = mm.mmap(0, 4 * P, rw(), anon()).unwrap();
    let u = mm.userfaultfd();
    let inval = Error::Inval.errno();
    for (addr, len) in [
        (a + 1, P),
        (a, P + 1),
        (a, 0),
        (0, P),
        (a, !(P - 1)),
        (!(P - 1), P),
        (1 << 47, P),
    ] {
        assert_eq!(errno(u.register(addr, len)), inval, "{addr:#x}+{len:#x}");
        assert_eq!(errno(u.unregister(addr, len)), inval);
        assert_eq!(errno(u.wake(addr, len)), inval);
        assert_eq!(errno(u.write_protect(addr, len)), inval);
        assert_eq!(errno(u.zeropage(addr, len, true)), inval);
    }
    assert_eq!(errno(u.copy(&[0; 100], a, true)), inval);
    assert_eq!(errno(u.copy(&[], a, true)), inval);
    assert_eq!(
        errno(u.register_with_mode(a, P, RegisterMode::empty())),
        inval
    );
    assert_eq!(
        errno(u.register_with_mode(a, P, RegisterMode::from_bits_retain(8))),
        inval
    );
    assert_eq!(
        errno(u.register_with_mode(a, P, RegisterMode::MINOR)),
        inval
    );
    assert_eq!(errno(u.register(a + 8 * P, P)), inval, "no VMA");
    assert_eq!(errno(u.unregister(a + 8 * P, P)), inval, "no VMA");
    // Unregistered: ENOENT from the fills and write-protect.
    assert_eq!(
        errno(u.copy(&[0; P as usize], a, true)),
        Error::NoEnt.errno()
    );
    assert_eq!(errno(u.write_protect(a, P)), Error::NoEnt.errno());
    u.register(a, 2 * P).unwrap();
    assert_eq!(
        errno(u.copy(&[0; 3 * P as usize], a, true)),
        Error::NoEnt.errno()
    );
    assert_eq!(errno(u.write_protect(a, P)), Error::NoEnt.errno());
    assert_eq!(errno(u.copy_wp(&[0; P as usize], a, true)), inval);
    assert_eq!(errno(u.continue_(a, P, true)), inval);
    assert_eq!(mm.frames_used(), 0);
    // pagemap_scan.
    let args = written_args(false);
    assert_eq!(errno(mm.pagemap_scan(a + 1, a + P, &args)), inval);
    assert_eq!(
        errno(mm.pagemap_scan(a + P, a, &args)),
        Error::Fault.errno()
    );
    assert_eq!(
        errno(mm.pagemap_scan(a, u64::MAX, &args)),
        Error::Fault.errno()
    );
    let bad = ScanArgs {
        return_mask: PageCategories::from_bits_retain(1 << 20),
        ..args
    };
    assert_eq!(errno(mm.pagemap_scan(a, a + P, &bad)), inval);
    let check = written_args(true);
    assert_eq!(
        errno(mm.pagemap_scan(a, a + P, &check)),
        Error::Perm.errno()
    );
}

#[test]
fn scan_limits_and_categories() {
    let mm = AddressSpace::new(Config::default());
    let a = mm.mmap(0, 8 * P, rw(), anon()).unwrap();
    mm.write(a, &[1]).unwrap();
    mm.write(a + 2 * P, &[1]).unwrap();
    let mut b = [0u8; 1];
    mm.read(a + 3 * P, &mut b).unwrap(); // zero page
    let args = ScanArgs {
        category_mask: PageCategories::PRESENT,
        return_mask: PageCategories::PRESENT | PageCategories::PFNZERO,
        max_regions: 8,
        ..ScanArgs::default()
    };
    let r = mm.pagemap_scan(a, a + 8 * P, &args).unwrap();
    let got: Vec<_> = r
        .regions
        .iter()
        .map(|g| ((g.start - a) / P, (g.end - a) / P, g.categories.bits()))
        .collect();
    assert_eq!(got, [(0, 1, 8), (2, 3, 8), (3, 4, 8 | 32)]);
    let r = mm
        .pagemap_scan(
            a,
            a + 8 * P,
            &ScanArgs {
                max_pages: 2,
                ..args
            },
        )
        .unwrap();
    assert_eq!((r.regions.len(), r.walk_end), (2, a + 3 * P));
    let r = mm
        .pagemap_scan(
            a,
            a + 8 * P,
            &ScanArgs {
                max_regions: 1,
                ..args
            },
        )
        .unwrap();
    assert_eq!((r.regions.len(), r.walk_end), (1, a + 2 * P));
    // Inverted: the pages that are not present (holes of the table too).
    let r = mm
        .pagemap_scan(
            a,
            a + 8 * P,
            &ScanArgs {
                category_inverted: PageCategories::PRESENT,
                ..args
            },
        )
        .unwrap();
    let got: Vec<_> = r
        .regions
        .iter()
        .map(|g| ((g.start - a) / P, (g.end - a) / P))
        .collect();
    assert_eq!(got, [(1, 2), (4, 8)]);
}

/// The same calls on the running kernel.
#[cfg(target_os = "linux")]
mod kernel {
    use super::*;

    const UFFD_API: u64 = 0xaa;
    const UFFDIO_API: libc::c_ulong = 0xc018_aa3f;
    const UFFDIO_REGISTER: libc::c_ulong = 0xc020_aa00;
    const UFFDIO_UNREGISTER: libc::c_ulong = 0x8010_aa01;
    const UFFDIO_COPY: libc::c_ulong = 0xc028_aa03;
    const UFFDIO_ZEROPAGE: libc::c_ulong = 0xc020_aa04;
    const PAGEMAP_SCAN: libc::c_ulong = 0xc060_6610;

    #[repr(C)]
    struct Api {
        api: u64,
        features: u64,
        ioctls: u64,
    }
    #[repr(C)]
    struct Register {
        start: u64,
        len: u64,
        mode: u64,
        ioctls: u64,
    }
    #[repr(C)]
    struct Copy {
        dst: u64,
        src: u64,
        len: u64,
        mode: u64,
        copy: i64,
    }
    #[repr(C)]
    struct Zero {
        start: u64,
        len: u64,
        mode: u64,
        zeropage: i64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct ScanArg {
        size: u64,
        flags: u64,
        start: u64,
        end: u64,
        walk_end: u64,
        vec: u64,
        vec_len: u64,
        max_pages: u64,
        category_inverted: u64,
        category_mask: u64,
        category_anyof_mask: u64,
        return_mask: u64,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Region {
        start: u64,
        end: u64,
        categories: u64,
    }

    fn last_errno() -> i32 {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
    }

    /// A userfaultfd of this process, or None (with the reason) where the
    /// kernel refuses one.
    struct Kuffd(i32);
    impl Kuffd {
        fn new() -> Option<Kuffd> {
            Self::with_features(0)
        }
        fn with_features(features: u64) -> Option<Kuffd> {
            // SAFETY: plain syscall.
            let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC) } as i32;
            if fd < 0 {
                eprintln!("userfaultfd unavailable (errno {}): skipped", last_errno());
                return None;
            }
            let mut api = Api {
                api: UFFD_API,
                features,
                ioctls: 0,
            };
            // SAFETY: `api` is a valid uffdio_api.
            assert_eq!(unsafe { libc::ioctl(fd, UFFDIO_API, &mut api) }, 0);
            Some(Kuffd(fd))
        }
        fn register(&self, start: u64, len: u64, mode: u64) -> Result<u64, i32> {
            let mut r = Register {
                start,
                len,
                mode,
                ioctls: 0,
            };
            // SAFETY: valid uffdio_register.
            match unsafe { libc::ioctl(self.0, UFFDIO_REGISTER, &mut r) } {
                0 => Ok(r.ioctls),
                _ => Err(last_errno()),
            }
        }
        fn unregister(&self, start: u64, len: u64) -> Result<(), i32> {
            let mut r = [start, len];
            // SAFETY: valid uffdio_range.
            match unsafe { libc::ioctl(self.0, UFFDIO_UNREGISTER, r.as_mut_ptr()) } {
                0 => Ok(()),
                _ => Err(last_errno()),
            }
        }
        fn copy(&self, src: &[u8], dst: u64) -> (Result<(), i32>, i64) {
            let mut c = Copy {
                dst,
                src: src.as_ptr() as u64,
                len: src.len() as u64,
                mode: 0,
                copy: 0,
            };
            // SAFETY: valid uffdio_copy; `src` is readable for `len`.
            let r = unsafe { libc::ioctl(self.0, UFFDIO_COPY, &mut c) };
            (if r == 0 { Ok(()) } else { Err(last_errno()) }, c.copy)
        }
        fn zeropage(&self, start: u64, len: u64) -> Result<(), i32> {
            let mut z = Zero {
                start,
                len,
                mode: 0,
                zeropage: 0,
            };
            // SAFETY: valid uffdio_zeropage.
            match unsafe { libc::ioctl(self.0, UFFDIO_ZEROPAGE, &mut z) } {
                0 => Ok(()),
                _ => Err(last_errno()),
            }
        }
    }
    impl Drop for Kuffd {
        fn drop(&mut self) {
            // SAFETY: our descriptor.
            unsafe { libc::close(self.0) };
        }
    }

    /// A private anonymous mapping of this process between two
    /// inaccessible guard pages (so it never merges with, or shares an
    /// anon_vma with, a mapping another test placed next to it), unmapped
    /// on drop.
    struct Map(u64, u64);
    impl Map {
        fn new(len: u64) -> Map {
            // SAFETY: a fresh mapping where the kernel chooses; nothing
            // else lives there.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    (len + 2 * P) as usize,
                    libc::PROT_NONE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(p, libc::MAP_FAILED);
            let a = p as u64 + P;
            // SAFETY: the interior of the mapping just made.
            let r = unsafe {
                libc::mprotect(
                    a as *mut libc::c_void,
                    len as usize,
                    libc::PROT_READ | libc::PROT_WRITE,
                )
            };
            assert_eq!(r, 0);
            Map(a, len)
        }
        fn vmas_in(&self) -> usize {
            let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
            maps.lines()
                .filter_map(|l| {
                    let (r, _) = l.split_once(' ')?;
                    let (s, e) = r.split_once('-')?;
                    Some((
                        u64::from_str_radix(s, 16).ok()?,
                        u64::from_str_radix(e, 16).ok()?,
                    ))
                })
                .filter(|&(s, e)| s < self.0 + self.1 && e > self.0)
                .count()
        }
    }
    impl Drop for Map {
        fn drop(&mut self) {
            // SAFETY: our own mapping, guards included.
            unsafe { libc::munmap((self.0 - P) as *mut libc::c_void, (self.1 + 2 * P) as usize) };
        }
    }

    #[test]
    fn register_copy_zeropage_errno_like_the_kernel() {
        let Some(k) = Kuffd::new() else { return };
        let km = Map::new(4 * P);
        let mm = AddressSpace::new(Config::default());
        let a = mm.mmap(0, 4 * P, rw(), anon()).unwrap();
        let u = mm.userfaultfd();
        let ours = IoctlFlags::all().bits();
        // Bad ranges and modes, no VMA.
        for (off, len, mode) in [(1, P, 1), (0, P + 1, 1), (0, 0, 1), (0, P, 0), (0, P, 8)] {
            let want = k.register(km.0 + off, len, mode).unwrap_err();
            let got =
                errno(u.register_with_mode(a + off, len, RegisterMode::from_bits_retain(mode)));
            assert_eq!(got, want, "register +{off} {len} mode {mode}");
        }
        assert_eq!(
            k.register(km.0, P, 4),
            Err(Error::Inval.errno()),
            "MINOR on anon"
        );
        // Split into three, like the kernel; ioctls masked to ours.
        let kio = k.register(km.0 + P, 2 * P, 1 | 2).unwrap();
        let io = u
            .register_with_mode(
                a + P,
                2 * P,
                RegisterMode::MISSING | RegisterMode::WRITE_PROTECT,
            )
            .unwrap();
        assert_eq!(kio & ours, io.bits());
        assert_eq!(km.vmas_in(), 3);
        assert_eq!(mm.map_count(), 3);
        let kio = k.register(km.0 + P, P, 1).unwrap();
        let io = u.register(a + P, P).unwrap();
        assert_eq!(kio & ours, io.bits(), "already registered with more modes");
        // Copies: unregistered ENOENT, EEXIST, partial.
        let page = vec![5u8; P as usize];
        assert_eq!(k.copy(&page, km.0).0, Err(Error::NoEnt.errno()));
        assert_eq!(errno(u.copy(&page, a, true)), Error::NoEnt.errno());
        assert_eq!(k.copy(&page, km.0 + P), (Ok(()), P as i64));
        assert_eq!(u.copy(&page, a + P, true), Ok(P));
        let (r, n) = k.copy(&page, km.0 + P);
        assert_eq!(
            (r, n),
            (Err(Error::Exist.errno()), -(Error::Exist.errno() as i64))
        );
        assert_eq!(errno(u.copy(&page, a + P, true)), Error::Exist.errno());
        assert_eq!(k.zeropage(km.0 + P, P), Err(Error::Exist.errno()));
        assert_eq!(errno(u.zeropage(a + P, P, true)), Error::Exist.errno());
        let two = vec![6u8; 2 * P as usize];
        // Copy across the registered VMA's end: ENOENT.
        assert_eq!(k.copy(&two, km.0 + 2 * P).0, Err(Error::NoEnt.errno()));
        assert_eq!(errno(u.copy(&two, a + 2 * P, true)), Error::NoEnt.errno());
        // Unregister merges back, except that the refused copy into the
        // first page gave its VMA an anon_vma of its own (Linux prepares
        // it before checking the registration).
        k.unregister(km.0, 4 * P).unwrap();
        u.unregister(a, 4 * P).unwrap();
        assert_eq!(km.vmas_in(), 2);
        assert_eq!(mm.map_count(), 2);
    }

    /// A thread blocked in a user-mode fault on a registered missing
    /// page; the manager unregisters the range, or closes the descriptor,
    /// without resolving it. The kernel wakes the fault, which retries as
    /// an ordinary fault and reads zeros (no SIGBUS, which would kill this
    /// test process): what `unregister_wakes_waiters_to_fill_normally` and
    /// `dropping_the_last_handle_wakes_waiters_and_unregisters` require of
    /// aspace.
    #[test]
    fn a_waiting_fault_survives_unregister_and_close_like_the_kernel() {
        for close in [false, true] {
            let Some(k) = Kuffd::new() else { return };
            let km = Map::new(2 * P);
            k.register(km.0, 2 * P, 1).unwrap();
            let addr = km.0 + P;
            // SAFETY: a readable page of our own mapping; the load blocks
            // in the kernel until the fault is resolved or woken.
            let t =
                std::thread::spawn(move || unsafe { std::ptr::read_volatile(addr as *const u8) });
            // The fault's `struct uffd_msg`: event 0x12 (PAGEFAULT), the
            // page's address at byte 16.
            let mut msg = [0u8; 32];
            // SAFETY: reads at most 32 bytes into `msg`.
            let n = unsafe { libc::read(k.0, msg.as_mut_ptr().cast(), msg.len()) };
            assert_eq!(n, 32);
            assert_eq!(msg[0], 0x12);
            assert_eq!(u64::from_ne_bytes(msg[16..24].try_into().unwrap()), addr);
            if close {
                drop(k);
            } else {
                k.unregister(km.0, 2 * P).unwrap();
            }
            assert_eq!(t.join().unwrap(), 0, "close: {close}");
        }
    }

    fn kscan(start: u64, end: u64, a: &ScanArgs) -> Result<Vec<(u64, u64, u64)>, i32> {
        let f = std::fs::File::open("/proc/self/pagemap").unwrap();
        let mut v = vec![Region::default(); 64];
        let mut arg = ScanArg {
            size: std::mem::size_of::<ScanArg>() as u64,
            flags: a.flags.bits(),
            start,
            end,
            vec: v.as_mut_ptr() as u64,
            vec_len: a.max_regions.min(64) as u64,
            max_pages: a.max_pages,
            category_inverted: a.category_inverted.bits(),
            category_mask: a.category_mask.bits(),
            category_anyof_mask: a.category_anyof_mask.bits(),
            return_mask: a.return_mask.bits(),
            ..ScanArg::default()
        };
        use std::os::fd::AsRawFd;
        // SAFETY: `arg` is a valid pm_scan_arg and `v` holds vec_len regions.
        let n = unsafe { libc::ioctl(f.as_raw_fd(), PAGEMAP_SCAN, &mut arg) };
        if n < 0 {
            return Err(last_errno());
        }
        Ok(v[..n as usize]
            .iter()
            .map(|r| ((r.start - start) / P, (r.end - start) / P, r.categories))
            .collect())
    }

    #[test]
    fn holes_in_the_range_like_the_kernel() {
        let Some(k) = Kuffd::new() else { return };
        let km = Map::new(4 * P);
        // SAFETY: a page of our own mapping, which nothing else uses.
        let r = unsafe { libc::munmap((km.0 + P) as *mut libc::c_void, P as usize) };
        assert_eq!(r, 0);
        let mm = AddressSpace::new(Config::default());
        let a = mm.mmap(0, 4 * P, rw(), anon()).unwrap();
        mm.munmap(a + P, P).unwrap();
        let u = mm.userfaultfd();
        let kio = k
            .register(km.0, 4 * P, 1 | 2)
            .map(|io| io & IoctlFlags::all().bits());
        let io = u
            .register_with_mode(
                a,
                4 * P,
                RegisterMode::MISSING | RegisterMode::WRITE_PROTECT,
            )
            .map(|io| io.bits())
            .map_err(|e| e.errno());
        assert_eq!(io, kio, "a range with a hole registers its VMAs");
        assert_eq!(
            errno(u.register(a + P, P)),
            k.register(km.0 + P, P, 1).unwrap_err()
        );
        assert_eq!(errno(u.write_protect(a + P, P)), Error::NoEnt.errno());
        assert_eq!(
            errno(u.unregister(a + P, P)),
            k.unregister(km.0 + P, P).unwrap_err()
        );
        assert_eq!(
            u.unregister(a, 4 * P).is_ok(),
            k.unregister(km.0, 4 * P).is_ok()
        );
    }

    #[test]
    fn async_write_protect_scans_like_the_kernel() {
        const WP_UNPOPULATED: u64 = 1 << 13;
        const WP_ASYNC: u64 = 1 << 15;
        let Some(k) = Kuffd::with_features(WP_ASYNC | WP_UNPOPULATED) else {
            return;
        };
        let km = Map::new(16 * P);
        let mm = AddressSpace::new(Config::default());
        let a = mm.mmap(0, 16 * P, rw(), anon()).unwrap();
        let u = UffdBuilder::new().wp_async(true).create(&mm);
        k.register(km.0, 16 * P, 2).unwrap();
        u.register_with_mode(a, 16 * P, RegisterMode::WRITE_PROTECT)
            .unwrap();
        let touch = |pages: &[u64]| {
            for &i in pages {
                // SAFETY: inside our own writable mapping.
                unsafe { std::ptr::write_volatile((km.0 + i * P + 8) as *mut u8, 1) };
                mm.write(a + i * P + 8, &[1]).unwrap();
            }
        };
        let check = |what: &str| {
            let args = ScanArgs {
                flags: ScanFlags::WP_MATCHING | ScanFlags::CHECK_WPASYNC,
                category_mask: PageCategories::WRITTEN,
                return_mask: PageCategories::WRITTEN,
                max_regions: 64,
                ..ScanArgs::default()
            };
            let want = kscan(km.0, km.0 + 16 * P, &args);
            let got = mm.pagemap_scan(a, a + 16 * P, &args).map(|r| {
                r.regions
                    .iter()
                    .map(|g| ((g.start - a) / P, (g.end - a) / P, g.categories.bits()))
                    .collect::<Vec<_>>()
            });
            assert_eq!(got.map_err(|e| e.errno()), want, "{what}");
        };
        touch(&(0..16).collect::<Vec<_>>());
        check("every page written");
        check("reset");
        touch(&[3, 4, 9, 15]);
        check("some written");
        check("reset again");
        // A VMA that is not WP-allowed: EPERM under CHECK_WPASYNC.
        k.unregister(km.0, 16 * P).unwrap();
        u.unregister(a, 16 * P).unwrap();
        check("unregistered");
    }

    #[test]
    fn pagemap_scan_like_the_kernel() {
        let km = Map::new(16 * P);
        let mm = AddressSpace::new(Config::default());
        let a = mm.mmap(0, 16 * P, rw(), anon()).unwrap();
        let mut kb = [0u8; 1];
        for i in [0u64, 1, 5, 9, 10, 11] {
            // SAFETY: inside our own writable mapping.
            unsafe { *((km.0 + i * P) as *mut u8) = 1 };
            mm.write(a + i * P, &[1]).unwrap();
        }
        for i in [3u64, 12] {
            // SAFETY: inside our own readable mapping.
            kb[0] = unsafe { std::ptr::read_volatile((km.0 + i * P) as *const u8) };
            mm.read(a + i * P, &mut kb).unwrap();
        }
        let base = ScanArgs {
            return_mask: PageCategories::PRESENT
                | PageCategories::PFNZERO
                | PageCategories::WRITTEN,
            max_regions: 64,
            ..ScanArgs::default()
        };
        let cases = [
            ScanArgs {
                category_mask: PageCategories::PRESENT,
                ..base
            },
            ScanArgs {
                category_anyof_mask: PageCategories::PFNZERO,
                ..base
            },
            ScanArgs {
                category_mask: PageCategories::PRESENT,
                max_pages: 3,
                ..base
            },
            ScanArgs {
                category_mask: PageCategories::PRESENT,
                category_inverted: PageCategories::PFNZERO,
                max_regions: 2,
                ..base
            },
        ];
        for (i, c) in cases.iter().enumerate() {
            let want = kscan(km.0, km.0 + 16 * P, c);
            let got = mm.pagemap_scan(a, a + 16 * P, c).map(|r| {
                r.regions
                    .iter()
                    .map(|g| ((g.start - a) / P, (g.end - a) / P, g.categories.bits()))
                    .collect::<Vec<_>>()
            });
            assert_eq!(got.map_err(|e| e.errno()), want, "case {i}: {c:?}");
        }
        for (s, e) in [(km.0 + 1, km.0 + P), (km.0 + P, km.0)] {
            let want = kscan(s, e, &base).unwrap_err();
            let got = mm.pagemap_scan(a + (s - km.0), a.wrapping_add(e.wrapping_sub(km.0)), &base);
            assert_eq!(errno(got), want, "{s:#x}..{e:#x}");
        }
    }
}
