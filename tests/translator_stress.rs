//! A stress test of translators racing with munmap, remap, mprotect and
//! madvise(DONTNEED), on borrowed and owned translators.

#[path = "common/rng.rs"]
mod rng;

use aspace::{AddressSpace, Advice, Config, MapFlags, Prot, Translator, PAGE_SIZE};
use rng::XorShift;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

const RW: Prot = Prot::READ.union(Prot::WRITE);
const A: u64 = 0x10_0000_0000;

fn fixed() -> MapFlags {
    MapFlags::PRIVATE | MapFlags::ANONYMOUS | MapFlags::FIXED
}

/// The value a stress writer stores at `addr`: it names the address, so a
/// read can tell a word that came from another page (a stale frame).
fn tagged(addr: u64, tid: u64, n: u64) -> u64 {
    (addr >> 3) << 20 | tid << 16 | (n & 0xffff)
}

fn check_word(addr: u64, v: u64) {
    assert!(
        v == 0 || v >> 20 == addr >> 3,
        "{addr:#x} holds {v:#x}, a word written at {:#x}",
        (v >> 20) << 3
    );
}

fn check_bytes(addr: u64, b: &[u8]) {
    for (i, w) in b.chunks_exact(8).enumerate() {
        check_word(
            addr + 8 * i as u64,
            u64::from_le_bytes(w.try_into().unwrap()),
        );
    }
}

/// Translators read and write while another thread munmaps and remaps,
/// mprotects and DONTNEEDs the same pages. Every word read was written at
/// that address (or is zero); while a range is read-only nothing in it
/// changes, so no store goes through a stale writable entry.
#[test]
fn stress_translators_against_flushes() {
    const PAGES: u64 = 8;
    const ROUNDS: u64 = 200;
    let mm = AddressSpace::new(Config {
        memory_budget: 64 * PAGE_SIZE,
        ..Config::default()
    });
    mm.mmap(A, PAGES * PAGE_SIZE, RW, fixed()).unwrap();
    let stop = AtomicBool::new(false);
    let ok_ops = AtomicU64::new(0);
    let ops = AtomicU64::new(0);
    std::thread::scope(|s| {
        for tid in 0..2u64 {
            let (mm, stop, ok_ops, ops) = (&mm, &stop, &ok_ops, &ops);
            s.spawn(move || {
                let mut t: Translator<'_> = mm.translator();
                let mut rng = XorShift::new(tid.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let x = rng.next_u64();
                    let addr = A + (x % (PAGES * PAGE_SIZE / 8)) * 8;
                    n += 1;
                    let ok = match x >> 60 {
                        0..=6 => t.store::<u64>(addr, tagged(addr, tid, n)).is_ok(),
                        7..=8 => t
                            .swap::<u64>(addr, tagged(addr, tid, n))
                            .map(|v| check_word(addr, v))
                            .is_ok(),
                        9..=13 => t.load::<u64>(addr).map(|v| check_word(addr, v)).is_ok(),
                        _ => {
                            // 24 bytes, often crossing a page.
                            let a = (addr + 4096 - 8).min(A + PAGES * PAGE_SIZE - 24);
                            let mut b = [0u8; 24];
                            let r = t.read(a, &mut b);
                            if r.is_ok() {
                                check_bytes(a, &b);
                            }
                            r.is_ok()
                        }
                    };
                    if ok {
                        ok_ops.fetch_add(1, Ordering::Relaxed);
                    }
                    ops.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        let mut rng = XorShift::new(0x1234_5678u64);
        // Lets the translators run a while.
        let let_run = || {
            let seen = ops.load(Ordering::Relaxed);
            while ops.load(Ordering::Relaxed) < seen + 100 {
                std::thread::yield_now();
            }
        };
        for _ in 0..ROUNDS {
            let_run();
            let x = rng.next_u64();
            let p = x % PAGES;
            let len = (1 + (x >> 8) % 3).min(PAGES - p) * PAGE_SIZE;
            let at = A + p * PAGE_SIZE;
            match (x >> 16) % 4 {
                0 => {
                    mm.munmap(at, len).unwrap();
                    let_run();
                    mm.mmap(at, len, RW, fixed()).unwrap();
                }
                1 => {
                    mm.mprotect(at, len, Prot::READ).unwrap();
                    let mut before = vec![0u8; len as usize];
                    mm.read(at, &mut before).unwrap();
                    check_bytes(at, &before);
                    let_run();
                    let mut after = vec![0u8; len as usize];
                    mm.read(at, &mut after).unwrap();
                    assert!(before == after, "a store landed in a read-only range");
                    mm.mprotect(at, len, RW).unwrap();
                }
                2 => mm.madvise(at, len, Advice::DontNeed).unwrap(),
                _ => {
                    // Unmap and map read-only: the fresh range reads zero
                    // and stays zero however stale the writers' entries.
                    mm.munmap(at, len).unwrap();
                    mm.mmap(at, len, Prot::READ, fixed()).unwrap();
                    let_run();
                    let mut b = vec![0u8; len as usize];
                    mm.read(at, &mut b).unwrap();
                    assert!(b.iter().all(|&v| v == 0), "a store landed in a new mapping");
                    mm.mprotect(at, len, RW).unwrap();
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert!(ok_ops.load(Ordering::Relaxed) > 0);
    let mut all = vec![0u8; (PAGES * PAGE_SIZE) as usize];
    mm.read(A, &mut all).unwrap();
    check_bytes(A, &all);
    mm.munmap(A, PAGES * PAGE_SIZE).unwrap();
    assert_eq!(mm.frames_used(), 0, "no frame leaked");
}
