//! Translator blocks ([`aspace::Block`]): one access section around many
//! loads and stores. Every width matches `mm.read`, a miss inside a block
//! faults in and goes on, errors are the plain calls' [`MemoryFault`]s, and
//! a munmap on another thread during a long run of blocks waits for the
//! block it meets, loses no data and is seen as a fault afterwards.

use aspace::{AddressSpace, Config, FaultError, MapFlags, Prot, Scalar, PAGE_SIZE};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const RW: Prot = Prot::READ.union(Prot::WRITE);
const A: u64 = 0x10_0000_0000;

fn fixed() -> MapFlags {
    MapFlags::PRIVATE | MapFlags::ANONYMOUS | MapFlags::FIXED
}

fn mm_with(pages: u64) -> AddressSpace {
    let mm = AddressSpace::new(Config::default());
    mm.mmap(A, pages * PAGE_SIZE, RW, fixed()).unwrap();
    mm
}

/// Stores a `T` at every offset of the first page (aligned ones hit,
/// unaligned and page-crossing ones take the translator's path inside the
/// block), one block per 16 offsets: `mm.read` sees exactly its bytes,
/// and the block loads them and what `mm.write` puts there between blocks.
fn every_offset<T: Scalar>(mm: &AddressSpace) {
    let size = std::mem::size_of::<T>();
    let mut t = mm.translator();
    let bits = |off: u64| 0x8192_a3b4_c5d6_e7f8 ^ off.wrapping_mul(0x0101_0101_0101_0101);
    for start in (0..PAGE_SIZE).step_by(16) {
        mm.write(A, &vec![0u8; 2 * PAGE_SIZE as usize]).unwrap();
        {
            let mut b = t.block();
            for off in start..start + 16 {
                let v = T::from_bits(bits(off));
                b.store::<T>(A + off, v).unwrap();
                assert_eq!(b.load::<T>(A + off).unwrap(), v, "{size}-byte at {off}");
            }
        }
        // The last store of each offset overwrote the earlier ones' tails:
        // compare with the same stores replayed on a buffer.
        let mut want = [0u8; 16 + 8];
        for off in start..start + 16 {
            let i = (off - start) as usize;
            want[i..i + size].copy_from_slice(&bits(off).to_le_bytes()[..size]);
        }
        let mut got = vec![0u8; want.len()];
        mm.read(A + start, &mut got).unwrap();
        assert_eq!(
            got[..16 + size - 1],
            want[..16 + size - 1],
            "{size}-byte at {start}"
        );
        mm.write(A + start, &(!bits(start)).to_le_bytes()[..size])
            .unwrap();
        let mut b = t.block();
        assert_eq!(
            b.load::<T>(A + start).unwrap(),
            T::from_bits(!bits(start)),
            "{size}-byte load of what mm.write wrote"
        );
    }
}

#[test]
fn block_loads_and_stores_of_every_width_match_mm_read() {
    let mm = mm_with(2);
    every_offset::<u8>(&mm);
    every_offset::<u16>(&mm);
    every_offset::<u32>(&mm);
    every_offset::<u64>(&mm);
    every_offset::<i16>(&mm);
    every_offset::<i32>(&mm);
}

#[test]
fn a_miss_inside_a_block_faults_in_and_goes_on() {
    let mm = mm_with(64);
    let mut t = mm.translator();
    let mut b = t.block();
    for p in 0..64 {
        b.store::<u64>(A + p * PAGE_SIZE + 8, p * 3).unwrap();
    }
    for p in 0..64 {
        assert_eq!(b.load::<u64>(A + p * PAGE_SIZE + 8).unwrap(), p * 3);
        assert_eq!(b.load::<u32>(A + p * PAGE_SIZE + 12).unwrap(), 0);
    }
    // Bulk copies and atomics inside the block too.
    b.write(A + PAGE_SIZE - 2, &[1, 2, 3, 4]).unwrap();
    let mut four = [0u8; 4];
    b.read(A + PAGE_SIZE - 2, &mut four).unwrap();
    assert_eq!(four, [1, 2, 3, 4]);
    assert_eq!(b.fetch_add::<u32>(A + 16, 5).unwrap(), 0);
    assert_eq!(b.swap::<u16>(A + 16, 9).unwrap(), 5);
    assert_eq!(b.compare_exchange::<u8>(A + 16, 9, 1).unwrap(), Ok(9));
    drop(b);
    assert!(mm.stats().faults() >= 64, "the pages were faulted in");
    let mut x = [0u8; 8];
    mm.read(A + 63 * PAGE_SIZE + 8, &mut x).unwrap();
    assert_eq!(u64::from_le_bytes(x), 63 * 3);
}

#[test]
fn block_errors_are_the_plain_calls_faults() {
    let mm = AddressSpace::new(Config::default());
    mm.mmap(A, PAGE_SIZE, RW, fixed()).unwrap();
    mm.mmap(A + PAGE_SIZE, PAGE_SIZE, Prot::READ, fixed())
        .unwrap();
    mm.mmap(A + 2 * PAGE_SIZE, PAGE_SIZE, Prot::NONE, fixed())
        .unwrap();
    mm.write(A, &[1]).unwrap();
    let mut plain = mm.translator();
    let mut t = mm.translator();
    let addrs = [
        A + PAGE_SIZE - 4,     // crosses into the read-only page
        A + PAGE_SIZE,         // read-only
        A + 2 * PAGE_SIZE + 8, // PROT_NONE
        A + 3 * PAGE_SIZE,     // the hole
        u64::MAX - 3,          // past the top
    ];
    for &at in &addrs {
        let p = plain.store::<u64>(at, 1);
        let b = t.block().store::<u64>(at, 1);
        assert_eq!(p, b, "store at {at:#x}");
        assert!(b.is_err());
        let p = plain.load::<u32>(at.wrapping_add(2 * PAGE_SIZE));
        let b = t.block().load::<u32>(at.wrapping_add(2 * PAGE_SIZE));
        assert_eq!(p, b, "load at {at:#x}");
        let p = plain.fetch::<u16>(at);
        let b = t.block().fetch::<u16>(at);
        assert_eq!(p, b, "fetch at {at:#x}");
        let mut x = [0u8; 8192];
        let mut y = [0u8; 8192];
        let p = plain.read(at - PAGE_SIZE, &mut x);
        let b = t.block().read(at - PAGE_SIZE, &mut y);
        assert_eq!((p, &x[..]), (b, &y[..]), "read at {at:#x}");
    }
    // A fetch of a non-executable page, inside one block after a hit.
    let mut b = t.block();
    assert_eq!(b.load::<u8>(A).unwrap(), 1);
    let e = b.fetch::<u8>(A).unwrap_err();
    assert_eq!((e.addr, e.kind, e.done), (A, FaultError::AccessDenied, 0));
    let e = b.store::<u64>(A + PAGE_SIZE - 4, 1).unwrap_err();
    assert_eq!(
        (e.addr, e.kind, e.done),
        (A + PAGE_SIZE, FaultError::AccessDenied, 0)
    );
    // The block goes on after an error.
    b.store::<u32>(A + 4, 7).unwrap();
    assert_eq!(b.load::<u32>(A + 4).unwrap(), 7);
}

/// A guest thread runs blocks of 64 stores of a pattern and then 64 loads
/// checking it, over 16 pages, while the main thread munmaps the last
/// page: no block loses or misplaces data, and once munmap has returned
/// (a flag set after it, read between blocks) every access to the
/// unmapped page faults with `NoMapping` at that page.
#[test]
fn munmap_on_another_thread_during_blocks() {
    const PAGES: u64 = 16;
    let mm = Arc::new(mm_with(PAGES));
    let last = A + (PAGES - 1) * PAGE_SIZE;
    let unmapped = Arc::new(AtomicBool::new(false));
    let started = Arc::new(AtomicBool::new(false));
    let guest = {
        let (mm, unmapped, started) = (mm.clone(), unmapped.clone(), started.clone());
        std::thread::spawn(move || {
            let mut t = aspace::Translator::new_owned(mm);
            let (mut faults_after, mut rounds_after) = (0, 0);
            for round in 0u64.. {
                let gone = unmapped.load(Ordering::Acquire);
                let mut b = t.block();
                let at = |i: u64| A + (i * 64 + round * 4100) % (PAGES * PAGE_SIZE);
                let word = |i: u64| (round * 64 + i) as u32;
                let mut failed = Vec::new();
                for i in 0..64 {
                    match b.store::<u32>(at(i) & !3, word(i)) {
                        Ok(()) => assert!(!gone || at(i) < last, "stored into the unmapped page"),
                        Err(e) => {
                            assert!(at(i) >= last, "{e:?}");
                            assert_eq!(
                                (e.kind, e.addr, e.done),
                                (FaultError::NoMapping, at(i) & !3, 0)
                            );
                            failed.push(i);
                        }
                    }
                }
                for i in 0..64 {
                    let r = b.load::<u32>(at(i) & !3);
                    if at(i) < last {
                        assert_eq!(r.unwrap(), word(i), "lost or misplaced at round {round}");
                    } else if failed.contains(&i) || gone {
                        assert_eq!(r.unwrap_err().kind, FaultError::NoMapping);
                        faults_after += gone as u64;
                    } else if let Ok(v) = r {
                        // Unmapped in between, or still the stored word.
                        assert_eq!(v, word(i), "misplaced in the last page at round {round}");
                    }
                }
                drop(b);
                started.store(true, Ordering::Release);
                rounds_after += gone as u64;
                if rounds_after == 200 {
                    break;
                }
            }
            faults_after
        })
    };
    while !started.load(Ordering::Acquire) {
        std::thread::yield_now();
    }
    mm.munmap(last, PAGE_SIZE).unwrap();
    unmapped.store(true, Ordering::Release);
    let faults_after = guest.join().unwrap();
    assert!(faults_after > 0, "the unmap was never seen as a fault");
    assert!(mm.translate(last).is_none());
}

/// The owned form opens blocks too, on a thread of its own.
#[test]
fn owned_translator_blocks_on_another_thread() {
    let mm = Arc::new(mm_with(1));
    let mut t = aspace::Translator::new_owned(mm.clone());
    std::thread::spawn(move || {
        let mut b = t.block();
        for i in 0..512 {
            b.store::<u64>(A + 8 * i, i).unwrap();
        }
    })
    .join()
    .unwrap();
    let mut x = [0u8; 8];
    mm.read(A + 8 * 511, &mut x).unwrap();
    assert_eq!(u64::from_le_bytes(x), 511);
}

/// The rule of blocks, checked in every build: a writer of the space on
/// the thread of an open block would wait for the block for ever; the
/// flush aborts with a message instead. Run in a child process (this test
/// binary again, with only this test and a marker in its environment).
#[test]
fn a_writer_inside_an_own_block_is_caught() {
    const CHILD: &str = "ASPACE_TEST_WRITER_INSIDE_BLOCK";
    if std::env::var_os(CHILD).is_some() {
        let mm = mm_with(1);
        let mut t = mm.translator();
        let mut b = t.block();
        b.store::<u64>(A, 1).unwrap();
        let _ = mm.munmap(A, PAGE_SIZE);
        unreachable!("the flush went on past an open block of its own thread");
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_writer_inside_an_own_block_is_caught",
            "--nocapture",
        ])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the child went on: {err}");
    assert!(err.contains("open translator Block"), "{err}");
}
