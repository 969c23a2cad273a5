//! The range lock's bias (`Config::range_bias`, `src/mm/range_bias.rs`)
//! through the public API: a thread alone in a range-mode space takes the
//! whole space for each call, and the bias passes to (or, past
//! `range_bias_handovers`, ends at) the next thread that calls. Each check
//! would fail if the owner's calls and another thread's could change one
//! VMA at once, or if data written under one owner were lost under the
//! next: every thread writes patterns and reads them back, and the final
//! layout is compared with what one thread alone would leave.

use aspace::{AddressSpace, Config, MapFlags, Prot, WriterLocking, PAGE_SIZE};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Barrier};

const RW: Prot = Prot::READ.union(Prot::WRITE);
const A: u64 = 0x4000_0000;

fn anon() -> MapFlags {
    MapFlags::PRIVATE | MapFlags::ANONYMOUS
}

fn space(handovers: u32) -> Arc<AddressSpace> {
    Arc::new(AddressSpace::new(Config {
        writer_locking: WriterLocking::Range,
        range_bias: true,
        range_bias_handovers: handovers,
        ..Config::default()
    }))
}

/// One thread's round on its own 64-page zone at `base`: map, write a
/// pattern, split the middle read-only, read back, merge back, unmap half.
fn round(mm: &AddressSpace, base: u64, tag: u8) {
    let len = 64 * PAGE_SIZE;
    let fixed = anon() | MapFlags::FIXED;
    assert_eq!(mm.mmap(base, len, RW, fixed).unwrap(), base);
    let data: Vec<u8> = (0..len).map(|i| tag ^ (i / PAGE_SIZE) as u8).collect();
    mm.write(base, &data).unwrap();
    mm.mprotect(base + 16 * PAGE_SIZE, 16 * PAGE_SIZE, Prot::READ)
        .unwrap();
    assert!(
        mm.write(base + 20 * PAGE_SIZE, &[1]).is_err(),
        "the read-only middle took a write"
    );
    let mut back = vec![0u8; len as usize];
    mm.read(base, &mut back).unwrap();
    assert_eq!(back, data, "zone {base:#x} lost its pattern");
    mm.mprotect(base + 16 * PAGE_SIZE, 16 * PAGE_SIZE, RW)
        .unwrap();
    mm.munmap(base + 32 * PAGE_SIZE, 32 * PAGE_SIZE).unwrap();
}

/// Runs `work(t)` on `threads` threads released at once, and joins them.
fn at_once(threads: u64, work: impl Fn(u64) + Send + Sync + 'static) {
    let (go, work) = (Arc::new(Barrier::new(threads as usize)), Arc::new(work));
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let (go, work) = (go.clone(), work.clone());
            std::thread::spawn(move || {
                go.wait();
                work(t);
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
}

/// The layout `round` leaves at `base`: one read-write VMA of 32 pages.
fn left_by_round(mm: &AddressSpace, base: u64) -> bool {
    mm.vmas()
        .iter()
        .any(|v| v.start == base && v.end == base + 32 * PAGE_SIZE && v.prot == RW)
}

/// Threads that call one after another (the main thread, then workers
/// joined in turn): each takes the bias over from the last, until the
/// handovers are spent and the range lock takes every call; every zone
/// keeps its pattern and layout across the changes of owner.
#[test]
fn threads_in_turn_take_the_bias_over_and_keep_their_data() {
    for handovers in [0, 1, 4] {
        let mm = space(handovers);
        round(&mm, A, 0x11);
        for t in 1..8u64 {
            let m = mm.clone();
            std::thread::spawn(move || round(&m, A + t * (1 << 30), t as u8))
                .join()
                .unwrap();
        }
        for t in 0..8u64 {
            assert!(left_by_round(&mm, A + t * (1 << 30)), "zone {t}");
            let mut b = [0u8; 1];
            mm.read(A + t * (1 << 30) + 3 * PAGE_SIZE, &mut b).unwrap();
            let tag = if t == 0 { 0x11 } else { t as u8 };
            assert_eq!(b[0], tag ^ 3, "zone {t} after {handovers} handovers");
        }
        assert_eq!(mm.vmas().len(), 8);
    }
}

/// Threads that all call at once from the start, on touching zones (each
/// zone's neighbourhood meets the next one's), while the owner of the
/// moment runs its calls on the whole space: the revocations and
/// handovers happen under load, and every zone still ends as one thread
/// alone would leave it.
#[test]
fn threads_at_once_revoke_the_bias_under_load() {
    for handovers in [0, 4, 1000] {
        let mm = space(handovers);
        let threads = 4u64;
        let m = mm.clone();
        at_once(threads, move |t| {
            for i in 0..50u64 {
                // Zones 64 pages apart: a zone's unmapped upper half is the
                // next zone's margin.
                let base = A + (t * 50 + i) * 64 * PAGE_SIZE;
                round(&m, base, (t * 50 + i) as u8);
            }
        });
        let v = mm.vmas();
        assert_eq!(v.len() as u64, threads * 50, "handovers {handovers}");
        for z in 0..threads * 50 {
            assert!(left_by_round(&mm, A + z * 64 * PAGE_SIZE), "zone {z}");
        }
    }
}

/// Placements without a hint by the owner and by threads revoking the
/// bias never share a gap.
#[test]
fn placements_across_a_revocation_never_overlap() {
    for handovers in [0, 4] {
        let mm = space(handovers);
        let go = Arc::new(Barrier::new(3));
        let hs: Vec<_> = (0..3)
            .map(|_| {
                let (mm, go) = (mm.clone(), go.clone());
                std::thread::spawn(move || {
                    go.wait();
                    (0..200)
                        .map(|_| mm.mmap(0, 2 * PAGE_SIZE, RW, anon()).unwrap())
                        .collect::<Vec<u64>>()
                })
            })
            .collect();
        let mut all: Vec<u64> = hs.into_iter().flat_map(|h| h.join().unwrap()).collect();
        all.sort_unstable();
        for w in all.windows(2) {
            assert!(
                w[0] + 2 * PAGE_SIZE <= w[1],
                "{:#x} and {:#x} overlap",
                w[0],
                w[1]
            );
        }
        assert_eq!(all.len(), 600);
    }
}

/// Faults stay speculative across the bias's end. While the bias holds,
/// its owner's writers run shared sections of the address space's
/// sequence (as the classic mode's writers do); the first writer after
/// the bias ends puts the sequence at its top for good, and every writer
/// from then on stamps its VMAs back below it. Either way, a VMA a
/// finished writer locked reads unlocked again, so a fault in it completes
/// without a lock: each phase's first faults must count as speculative.
/// Fails if a VMA stayed write-locked after its writer (an owner's writer
/// running its own section while the sequence is low, or own sections
/// that do not raise the sequence): its faults fall back to the locked
/// paths.
#[test]
fn faults_stay_speculative_across_the_bias_end() {
    let mm = Arc::new(AddressSpace::new(Config {
        writer_locking: WriterLocking::Range,
        range_bias: true,
        range_bias_handovers: 0,
        fault_locking: aspace::FaultLocking::Speculative,
        ..Config::default()
    }));
    let fixed = anon() | MapFlags::FIXED;
    // Speculative faults that a write of `n` pages at `a` (not yet
    // present, in a VMA the last writer changed) completes.
    let spec_writes = |mm: &AddressSpace, a: u64, n: u64| {
        let before = mm.stats().fault_speculative;
        for p in 0..n {
            mm.write(a + p * PAGE_SIZE, &[p as u8 + 1]).unwrap();
        }
        mm.stats().fault_speculative - before
    };
    // The owner (this thread): its mprotect splits the zone under a
    // shared section.
    mm.mmap(A, 64 * PAGE_SIZE, RW, fixed).unwrap();
    spec_writes(&mm, A, 1);
    mm.mprotect(A + 32 * PAGE_SIZE, 32 * PAGE_SIZE, Prot::READ)
        .unwrap();
    assert_eq!(
        spec_writes(&mm, A + PAGE_SIZE, 8),
        8,
        "the owner's VMA stayed locked after its section"
    );
    // Another thread's writer ends the bias (no handovers) and runs its
    // own section: it splits the owner's VMA again.
    let m2 = mm.clone();
    std::thread::spawn(move || {
        m2.mprotect(A + 16 * PAGE_SIZE, 8 * PAGE_SIZE, Prot::READ)
            .unwrap();
    })
    .join()
    .unwrap();
    assert_eq!(
        spec_writes(&mm, A + 9 * PAGE_SIZE, 4),
        4,
        "a VMA of an own section stayed locked after it"
    );
    // A VMA only the owner's sections locked (the read-only half) reads
    // unlocked under the raised sequence too.
    let before = mm.stats().fault_speculative;
    let mut b = [0u8; 1];
    for p in 48..52 {
        mm.read(A + p * PAGE_SIZE, &mut b).unwrap();
    }
    assert_eq!(mm.stats().fault_speculative - before, 4);
    mm.read(A + 3 * PAGE_SIZE, &mut b).unwrap();
    assert_eq!(b, [3]);
}

/// Once the space's bias has ended, each 512 GiB slot's bias serves the
/// thread that keeps to it ("Slot biases" in `src/mm/range_bias.rs`):
/// four threads each run rounds in a slot of their own, while another
/// thread maps and unmaps a mapping across the boundary of two of those
/// slots (ending their biases, each waiting for its owner's call) and
/// this thread walks the whole space. The first slot's thread also
/// flips the protection of a page `Y` just below that mapping (which
/// merges with `Y` when both are read-write). Every zone ends as one
/// thread alone would leave it, `Y` keeps its byte, and the mapping
/// across the boundary keeps its bytes. Fails if a slot's owner and a
/// request across its boundary could change one VMA at once.
#[test]
fn threads_in_slots_of_their_own_keep_their_data_as_slot_biases_end() {
    const SLOT: u64 = 1 << 39;
    for handovers in [0, 4] {
        let mm = space(handovers);
        // The space's bias: this thread claims it, the next ones end it.
        mm.mmap(A, PAGE_SIZE, RW, anon() | MapFlags::FIXED).unwrap();
        let threads = 4u64;
        let go = Arc::new(Barrier::new(threads as usize + 1));
        let zone = |t: u64, i: u64| (t + 1) * SLOT + SLOT / 2 + i * 64 * PAGE_SIZE;
        let y = 2 * SLOT - 2 * PAGE_SIZE;
        mm.mmap(y, PAGE_SIZE, RW, anon() | MapFlags::FIXED).unwrap();
        mm.write(y, &[0x77]).unwrap();
        let mut hs: Vec<_> = (0..threads)
            .map(|t| {
                let (mm, go) = (mm.clone(), go.clone());
                std::thread::spawn(move || {
                    go.wait();
                    for i in 0..100u64 {
                        round(&mm, zone(t, i), (t * 100 + i) as u8);
                        if t == 0 {
                            for prot in [Prot::READ, RW] {
                                mm.mprotect(y, PAGE_SIZE, prot).unwrap();
                                let mut b = [0u8; 1];
                                mm.read(y, &mut b).unwrap();
                                assert_eq!(b, [0x77], "Y lost its byte");
                            }
                        }
                    }
                })
            })
            .collect();
        let (m, g) = (mm.clone(), go.clone());
        hs.push(std::thread::spawn(move || {
            g.wait();
            let at = 2 * SLOT - PAGE_SIZE;
            for i in 0..50u8 {
                let fixed = anon() | MapFlags::FIXED;
                m.mmap(at, 2 * PAGE_SIZE, RW, fixed).unwrap();
                m.write(at + PAGE_SIZE - 1, &[i, i ^ 0x5a]).unwrap();
                let mut b = [0u8; 2];
                m.read(at + PAGE_SIZE - 1, &mut b).unwrap();
                assert_eq!(b, [i, i ^ 0x5a], "the mapping across the boundary");
                m.munmap(at, 2 * PAGE_SIZE).unwrap();
            }
        }));
        while !hs.iter().all(|h| h.is_finished()) {
            let v = mm.vmas();
            assert!(v.windows(2).all(|w| w[0].end <= w[1].start));
        }
        for h in hs {
            h.join().unwrap();
        }
        for t in 0..threads {
            for i in 0..100 {
                assert!(left_by_round(&mm, zone(t, i)), "thread {t} zone {i}");
            }
        }
        let v = mm.vmas();
        assert!(v
            .iter()
            .any(|v| v.start == y && v.end == y + PAGE_SIZE && v.prot == RW));
        assert_eq!(v.len() as u64, threads * 100 + 2);
    }
}

/// A slot's owner changes a page `Y` just below a 512 GiB boundary
/// while another thread maps across that boundary beside `Y` (so that
/// the mapping may merge with `Y`), in many fresh spaces: the request
/// across the boundary ends the slot's bias and must wait for the
/// owner's call first. Each space ends with `Y` and the mapping as one
/// read-write VMA, `Y` keeping its byte, as any order of the calls
/// leaves them. A stress test of the path: the request ends the slot's
/// bias during the owner's toggles in nearly every space (the owner's later
/// calls take the usual path). Whether it then waits for a call in
/// progress is the loom model
/// `range_slot_bias_owner_vs_request_across_slots`'s to check: here the
/// request's heavy fence (`membarrier`, microseconds) outlasts the
/// owner's call, so the count it then reads is zero.
#[test]
fn a_request_across_a_slot_boundary_waits_for_the_slots_owner() {
    const SLOT: u64 = 1 << 39;
    let (y, at) = (2 * SLOT - 2 * PAGE_SIZE, 2 * SLOT - PAGE_SIZE);
    // Both threads spin at the start (a sleeping barrier wakes one of
    // them tens of microseconds late on a VM, after the other is done).
    let start = |go: &AtomicU32| {
        go.fetch_add(1, Ordering::SeqCst);
        while go.load(Ordering::SeqCst) < 2 {
            std::hint::spin_loop();
        }
    };
    for _ in 0..300 {
        let mm = space(0);
        mm.mmap(A, PAGE_SIZE, RW, anon() | MapFlags::FIXED).unwrap();
        let go = Arc::new(AtomicU32::new(0));
        let (m, g) = (mm.clone(), go.clone());
        let owner = std::thread::spawn(move || {
            // Ends the space's bias, then claims the slot's.
            m.mmap(y, PAGE_SIZE, RW, anon() | MapFlags::FIXED).unwrap();
            m.write(y, &[0x77]).unwrap();
            start(&g);
            for _ in 0..16 {
                m.mprotect(y, PAGE_SIZE, Prot::READ).unwrap();
                m.mprotect(y, PAGE_SIZE, RW).unwrap();
            }
        });
        let (m, g) = (mm.clone(), go.clone());
        let across = std::thread::spawn(move || {
            start(&g);
            let fixed = anon() | MapFlags::FIXED;
            m.mmap(at, 2 * PAGE_SIZE, RW, fixed).unwrap();
        });
        owner.join().unwrap();
        across.join().unwrap();
        let v: Vec<_> = mm.vmas().into_iter().filter(|v| v.start >= y).collect();
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(
            (v[0].start, v[0].end, v[0].prot),
            (y, at + 2 * PAGE_SIZE, RW)
        );
        let mut b = [0u8; 2];
        mm.read(y, &mut b[..1]).unwrap();
        mm.read(at, &mut b[1..]).unwrap();
        assert_eq!(b, [0x77, 0]);
    }
}

/// Without the whole space's bias (`Config::range_space_bias` off), each
/// slot's bias holds from the start: one thread alone runs the slot
/// owner's path (`examples/instantiate.rs --no-space-bias` measures it),
/// then threads in slots of their own each own theirs, and a thread that
/// comes to another's slot ends that slot's bias. Every zone keeps its
/// pattern and layout, and the map count stays the number of VMAs.
#[test]
fn slot_biases_hold_from_the_start_without_the_space_bias() {
    const SLOT: u64 = 1 << 39;
    for handovers in [0, 4] {
        let mm = Arc::new(AddressSpace::new(Config {
            writer_locking: WriterLocking::Range,
            range_bias: true,
            range_space_bias: false,
            range_bias_handovers: handovers,
            ..Config::default()
        }));
        let zone = |t: u64, i: u64| (t + 1) * SLOT + SLOT / 2 + i * 64 * PAGE_SIZE;
        // One thread alone, in slot 1.
        for i in 0..50 {
            round(&mm, zone(0, i), i as u8);
        }
        // Threads in slots of their own; thread 0 works in slot 1, the
        // main thread's, and takes its bias over (or, without handovers,
        // ends it).
        let threads = 3u64;
        let m = mm.clone();
        at_once(threads, move |t| {
            for i in 50..100u64 {
                round(&m, zone(t, i), (t * 100 + i) as u8);
            }
        });
        for t in 0..threads {
            let first = if t == 0 { 0 } else { 50 };
            for i in first..100 {
                assert!(left_by_round(&mm, zone(t, i)), "thread {t} zone {i}");
            }
        }
        assert_eq!(mm.vmas().len() as u64, 100 + (threads - 1) * 50);
        assert_eq!(mm.map_count(), mm.vmas().len());
    }
}
