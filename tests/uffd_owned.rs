//! The owned userfault handle ([`Uffd::owned`]): a spawned handler thread
//! owns it and serves the faults of other threads, and dropping it while a
//! fault waits wakes that fault, which runs again as an ordinary fault
//! (`FaultError::HandlerGone`'s docs).

use aspace::uffd::{Event, FaultKind, ReadWrite};
use aspace::{AddressSpace, Config, MapFlags, Prot, Uffd, PAGE_SIZE};
use std::sync::Arc;
use std::thread;

const P: u64 = PAGE_SIZE;

fn space_with(pages: u64) -> (Arc<AddressSpace>, u64) {
    let mm = Arc::new(AddressSpace::new(Config::default()));
    let a = mm
        .mmap(
            0,
            pages * P,
            Prot::READ | Prot::WRITE,
            MapFlags::PRIVATE | MapFlags::ANONYMOUS,
        )
        .unwrap();
    (mm, a)
}

/// The pattern the handler fills page `i` with.
fn pattern(i: u64) -> u8 {
    0x40 + i as u8
}

/// A handler thread that owns the only handle serves every page two
/// faulting threads touch, each page with its own pattern; the faulting
/// threads see exactly those patterns (and their own stores on top).
#[test]
fn spawned_handler_owns_its_handle_and_serves_other_threads() {
    const PAGES: u64 = 16;
    let (mm, a) = space_with(PAGES);
    let uffd = Uffd::owned(mm.clone());
    uffd.register(a, PAGES * P).unwrap();
    let handler = thread::spawn(move || {
        let mut served = 0;
        while served < PAGES {
            let Event::Pagefault { kind, addr, .. } = uffd.read_event() else {
                panic!("not a page fault");
            };
            assert_eq!(kind, FaultKind::Missing);
            let i = (addr - a) / P;
            // Two threads may fault on one page: the second copy finds it
            // filled (EEXIST) and only wakes.
            if uffd.copy(&[pattern(i); P as usize], addr, true).is_ok() {
                served += 1;
            }
        }
        uffd
    });
    let workers: Vec<_> = (0..2u64)
        .map(|w| {
            let mm = mm.clone();
            thread::spawn(move || {
                for i in 0..PAGES {
                    let at = a + i * P + 8 * w;
                    let mut b = [0u8; 8];
                    mm.read(at, &mut b).unwrap();
                    assert_eq!(b, [pattern(i); 8]);
                    mm.write(at + 16, &[w as u8; 8]).unwrap();
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let uffd = handler.join().unwrap();
    for i in 0..PAGES {
        let mut b = [0u8; 32];
        mm.read(a + i * P, &mut b).unwrap();
        assert_eq!(&b[..16], &[pattern(i); 16], "page {i}");
        assert_eq!(&b[16..24], &[0; 8]);
        assert_eq!(&b[24..32], &[1; 8]);
    }
    drop(uffd);
}

/// The handler thread reads the event, then ends without resolving it:
/// its handle, the last one, is dropped while the fault waits. The fault
/// wakes, runs again as an ordinary fault (zeros, no SIGBUS), and the
/// range is no longer registered.
#[test]
fn dropping_the_owned_handle_wakes_a_waiting_fault() {
    let (mm, a) = space_with(2);
    let uffd = Uffd::owned(mm.clone());
    uffd.register(a, 2 * P).unwrap();
    let handler = thread::spawn(move || {
        let ev = uffd.read_event();
        let Event::Pagefault { kind, rw, addr, .. } = ev else {
            panic!("not a page fault");
        };
        assert_eq!((kind, rw, addr), (FaultKind::Missing, ReadWrite::Read, a));
        // `uffd` is dropped here with the fault still waiting.
    });
    let m2 = mm.clone();
    let faulting = thread::spawn(move || {
        let mut b = [9u8; 8];
        m2.read(a + 3, &mut b).map(|()| b)
    });
    handler.join().unwrap();
    assert_eq!(faulting.join().unwrap(), Ok([0u8; 8]));
    // Released: the other page faults in without a handler.
    mm.write(a + P, b"free").unwrap();
    let v = mm.vmas();
    assert!(v.iter().all(|v| !v.smaps_vmflags().contains("um")));
    assert_eq!(Arc::strong_count(&mm), 1, "the handle gave its space back");
}
