//! What an emulator needs from a translator: errors with si_addr,
//! si_code and bytes done; instruction fetch with NX; owned translators
//! moved between threads; atomics at any alignment, split locks by
//! setting.

use aspace::{
    AddressSpace, Config, FaultError, MapFlags, MemoryFault, Prot, SplitLock, Translator, PAGE_SIZE,
};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};

const RW: Prot = Prot::READ.union(Prot::WRITE);
const RX: Prot = Prot::READ.union(Prot::EXEC);
const A: u64 = 0x10_0000_0000;
const P: u64 = PAGE_SIZE;

fn fixed() -> MapFlags {
    MapFlags::PRIVATE | MapFlags::ANONYMOUS | MapFlags::FIXED
}

fn space(cfg: Config) -> AddressSpace {
    AddressSpace::new(cfg)
}

/// `(si_addr, signal, si_code, done)` of a fault.
fn info(e: MemoryFault) -> (u64, Option<i32>, Option<i32>, usize) {
    (e.addr, e.signal(), e.si_code(), e.done)
}

const SEGV: Option<i32> = Some(11);
const BUS: Option<i32> = Some(7);
const MAPERR: Option<i32> = Some(1);
const ACCERR: Option<i32> = Some(2);
const ADRALN: Option<i32> = Some(1);

#[test]
fn a_store_crossing_into_a_hole_faults_at_the_hole() {
    let mm = space(Config::default());
    mm.mmap(A, P, RW, fixed()).unwrap();
    let mut t = mm.translator();
    for (addr, len) in [(A + P - 4, 8), (A + P - 1, 2), (A + P - 2, 4)] {
        let e = match len {
            8 => t.store::<u64>(addr, !0).unwrap_err(),
            4 => t.store::<u32>(addr, !0).unwrap_err(),
            _ => t.store::<u16>(addr, !0).unwrap_err(),
        };
        assert_eq!(info(e), (A + P, SEGV, MAPERR, 0), "store at {addr:#x}");
        assert_eq!(e.kind, FaultError::NoMapping);
        let e = t.load::<u64>(A + P - 4).unwrap_err();
        assert_eq!(info(e), (A + P, SEGV, MAPERR, 0));
    }
    assert_eq!(t.load::<u64>(A + P - 8).unwrap(), 0, "nothing written");
    // Wholly in a hole: the access's own first byte.
    let e = t.store::<u32>(A + 3 * P + 6, 1).unwrap_err();
    assert_eq!(info(e), (A + 3 * P + 6, SEGV, MAPERR, 0));
    // Past the top of user space: its first byte past.
    let top = mm.config().task_size;
    mm.mmap(top - P, P, RW, fixed()).unwrap();
    let e = t.store::<u64>(top - 4, 1).unwrap_err();
    assert_eq!(info(e), (top, SEGV, MAPERR, 0));
}

#[test]
fn a_read_across_a_hole_says_how_much_it_read() {
    let mm = space(Config::default());
    mm.mmap(A, 2 * P, RW, fixed()).unwrap();
    mm.mmap(A + 3 * P, P, RW, fixed()).unwrap();
    let mut t = mm.translator();
    t.write(A, &[7u8; 8192]).unwrap();
    let mut buf = vec![0u8; 12 << 10];
    let e = t.read(A + 100, &mut buf).unwrap_err();
    assert_eq!(info(e), (A + 2 * P, SEGV, MAPERR, 2 * P as usize - 100));
    assert!(buf[..e.done].iter().all(|&b| b == 7));
    let e = t.write(A + 100, &buf).unwrap_err();
    assert_eq!(info(e), (A + 2 * P, SEGV, MAPERR, 2 * P as usize - 100));
    // The same range through mm.read says the same.
    let m = mm.read(A + 100, &mut buf).unwrap_err();
    assert_eq!(m, aspace::Error::Memory(e));
}

#[test]
fn a_write_to_a_read_only_page_is_accerr() {
    let mm = space(Config::default());
    mm.mmap(A, P, RW, fixed()).unwrap();
    mm.mmap(A + P, P, Prot::READ, fixed()).unwrap();
    let mut t = mm.translator();
    let e = t.store::<u32>(A + P + 8, 1).unwrap_err();
    assert_eq!(info(e), (A + P + 8, SEGV, ACCERR, 0));
    let e = t.write(A + P - 16, &[1; 32]).unwrap_err();
    assert_eq!(info(e), (A + P, SEGV, ACCERR, 16));
    let e = t.fetch_add::<u64>(A + P - 4, 1).unwrap_err();
    assert_eq!(info(e), (A + P, SEGV, ACCERR, 0), "a split atomic");
    let e = t.compare_exchange::<u8>(A + P, 0, 1).unwrap_err();
    assert_eq!(info(e), (A + P, SEGV, ACCERR, 0));
    assert_eq!(t.load::<u64>(A + P).unwrap(), 0);
}

#[test]
fn instruction_fetch_obeys_nx() {
    let mm = space(Config::default());
    mm.mmap(A, P, RW, fixed()).unwrap();
    mm.mmap(A + P, P, RW, fixed()).unwrap();
    let mut t = mm.translator();
    t.store::<u32>(A, 0x90c3_0f0b).unwrap(); // cached, readable and writable
    assert_eq!(t.load::<u32>(A).unwrap(), 0x90c3_0f0b);
    let e = t.fetch::<u32>(A).unwrap_err();
    assert_eq!(info(e), (A, SEGV, ACCERR, 0), "rw- is NX");
    mm.mprotect(A, P, RX).unwrap();
    assert_eq!(t.fetch::<u32>(A).unwrap(), 0x90c3_0f0b);
    assert_eq!(t.load::<u32>(A).unwrap(), 0x90c3_0f0b);
    let e = t.store::<u8>(A, 0).unwrap_err();
    assert_eq!(info(e), (A, SEGV, ACCERR, 0));
    // Fetching across into the NX page: faults at its first byte, the
    // bytes before it fetched.
    let mut insn = [0u8; 8];
    let e = t.fetch_insn(A + P - 4, &mut insn).unwrap_err();
    assert_eq!(info(e), (A + P, SEGV, ACCERR, 4));
    assert_eq!(
        info(t.fetch::<u64>(A + P - 4).unwrap_err()),
        (A + P, SEGV, ACCERR, 0)
    );
    mm.mprotect(A + P, P, Prot::READ | Prot::WRITE | Prot::EXEC)
        .unwrap();
    t.fetch_insn(A + P - 4, &mut insn).unwrap();
    // And back: NX again, for cached and fresh translations alike.
    mm.mprotect(A, 2 * P, Prot::READ).unwrap();
    assert_eq!(info(t.fetch::<u8>(A).unwrap_err()), (A, SEGV, ACCERR, 0));
    assert_eq!(t.load::<u32>(A).unwrap(), 0x90c3_0f0b);
    // A fresh, never-touched r-x page reads as zeros.
    mm.mmap(A + 4 * P, P, RX, fixed()).unwrap();
    assert_eq!(t.fetch::<u64>(A + 4 * P).unwrap(), 0);
    let e = t.fetch::<u8>(A + 6 * P).unwrap_err();
    assert_eq!(info(e), (A + 6 * P, SEGV, MAPERR, 0));
}

/// A private copy-on-write page and a forked child keep NX.
#[test]
fn nx_survives_fork_and_copy_on_write() {
    let mm = space(Config::default());
    mm.mmap(A, P, RW, fixed()).unwrap();
    mm.mmap(A + P, P, RX, fixed()).unwrap();
    let mut t = mm.translator();
    t.store::<u64>(A, 1).unwrap();
    t.fetch::<u8>(A + P).unwrap();
    let child = mm.fork().unwrap();
    t.store::<u64>(A, 2).unwrap(); // copy-on-write break
    assert_eq!(t.fetch::<u8>(A).unwrap_err().kind, FaultError::AccessDenied);
    let mut c = child.translator();
    assert_eq!(c.fetch::<u8>(A).unwrap_err().kind, FaultError::AccessDenied);
    assert_eq!(c.fetch::<u8>(A + P).unwrap(), 0);
}

/// Execute-only pages (protection keys on): a fetch works, a load faults.
#[test]
fn exec_only_pages_fetch_but_do_not_load() {
    let mm = space(Config {
        exec_only_pkey: true,
        ..Config::default()
    });
    mm.mmap(A, P, RW, fixed()).unwrap();
    let mut t = mm.translator();
    t.store::<u32>(A, 0xc3).unwrap();
    mm.mprotect(A, P, Prot::EXEC).unwrap();
    assert_eq!(t.fetch::<u32>(A).unwrap(), 0xc3);
    assert_eq!(info(t.load::<u32>(A).unwrap_err()), (A, SEGV, ACCERR, 0));
    assert_eq!(t.fetch::<u32>(A).unwrap(), 0xc3, "the fetch entry stays");
    mm.mprotect(A, P, RX).unwrap();
    assert_eq!(t.load::<u32>(A).unwrap(), 0xc3);
}

/// An owned translator moves to another thread (twice), storing and
/// reading back patterns while this thread munmaps, remaps and
/// mprotects the pages under it.
#[test]
fn an_owned_translator_moves_between_threads_under_flushes() {
    const PAGES: u64 = 8;
    let mm = Arc::new(space(Config::default()));
    mm.mmap(A, PAGES * P, RW, fixed()).unwrap();
    let mut tlb = Translator::new_owned(mm.clone());
    tlb.store::<u64>(A, 1).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let run = |mut t: Translator<'static>, seed: u64| {
        let (stop, ops) = (stop.clone(), ops.clone());
        std::thread::spawn(move || {
            let mut n = seed;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let a = A + (n % (PAGES * P / 8)) * 8;
                let v = (a << 16) | (n & 0xffff);
                if t.store::<u64>(a, v).is_ok() {
                    // Read back: ours, or a word some flush since zeroed.
                    if let Ok(r) = t.load::<u64>(a) {
                        assert!(r == v || r == 0 || r >> 16 == a, "{a:#x}: {r:#x}");
                    }
                }
                let w = t.load::<u32>(a + 4).map(|x| x as u64);
                assert!(w.is_err() || matches!(w, Ok(x) if x == 0 || x == a >> 16));
                ops.fetch_add(1, Ordering::Relaxed);
            }
            t
        })
    };
    let wait_ops = |k| {
        let s = ops.load(Ordering::Relaxed);
        while ops.load(Ordering::Relaxed) < s + k {
            std::thread::yield_now();
        }
    };
    for round in 0..2u64 {
        let h = run(tlb, round << 32);
        for i in 0..40u64 {
            wait_ops(50);
            let at = A + (i % PAGES) * P;
            match i % 3 {
                0 => {
                    mm.munmap(at, P).unwrap();
                    wait_ops(20);
                    mm.mmap(at, P, RW, fixed()).unwrap();
                }
                1 => {
                    mm.mprotect(at, P, Prot::READ).unwrap();
                    let mut a = [0u8; 4096];
                    let mut b = [0u8; 4096];
                    mm.read(at, &mut a).unwrap();
                    wait_ops(20);
                    mm.read(at, &mut b).unwrap();
                    assert!(a == b, "a store landed on a read-only page");
                    mm.mprotect(at, P, RW).unwrap();
                }
                _ => {
                    mm.mprotect(at, P, Prot::NONE).unwrap();
                    wait_ops(20);
                    mm.mprotect(at, P, RW).unwrap();
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
        tlb = h.join().unwrap();
        stop.store(false, Ordering::Relaxed);
    }
    // Back on this thread: it sees the space as it is.
    mm.write(A, &42u64.to_le_bytes()).unwrap();
    assert_eq!(tlb.load::<u64>(A).unwrap(), 42);
    drop(tlb);
    mm.munmap(A, PAGES * P).unwrap();
    assert_eq!(mm.frames_used(), 0);
}

/// Several threads add at misaligned offsets inside one line: inside a
/// word, across words of a 16-byte block, across a 16-byte boundary; and
/// compare-and-swap a misaligned lock. Totals are exact. (Catches
/// dropping the stripe lock in `split::rmw2`: a carry into the second
/// word is lost; seen failing on both of two runs.)
#[test]
fn misaligned_atomics_inside_a_line_are_exact() {
    const N: u64 = 100_000;
    const THREADS: usize = 3;
    const ONE_EACH: u64 = 1 << 32 | 1;
    let mm = space(Config::default());
    mm.mmap(A, P, RW, fixed()).unwrap();
    let go = Barrier::new(THREADS);
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| {
                let mut t = mm.translator();
                go.wait();
                for _ in 0..N {
                    t.fetch_add::<u32>(A + 2, 1).unwrap(); // in a word
                    t.fetch_add::<u32>(A + 6, 1).unwrap(); // block
                                                           // Across a 16-byte edge, changing both words each time.
                    t.fetch_add::<u64>(A + 12, ONE_EACH).unwrap();
                    t.fetch_add::<u16>(A + 31, 0x0101).unwrap();
                    // A misaligned spin lock guarding a plain counter.
                    while t.compare_exchange::<u32>(A + 45, 0, 1).unwrap().is_err() {
                        std::hint::spin_loop();
                    }
                    let v = t.load::<u64>(A + 56).unwrap();
                    t.store::<u64>(A + 56, v + 1).unwrap();
                    assert_eq!(t.swap::<u32>(A + 45, 0).unwrap(), 1);
                }
            });
        }
    });
    let total = THREADS as u64 * N;
    let mut t = mm.translator();
    assert_eq!(t.load::<u16>(A).unwrap(), 0, "neighbour untouched");
    assert_eq!(t.fetch::<u8>(A).unwrap_err().kind, FaultError::AccessDenied);
    assert_eq!(t.load::<u32>(A + 2).unwrap(), total as u32);
    assert_eq!(t.load::<u32>(A + 6).unwrap(), total as u32);
    assert_eq!(t.load::<u64>(A + 12).unwrap(), total * ONE_EACH);
    assert_eq!(t.load::<u16>(A + 31).unwrap(), (total * 0x0101) as u16);
    assert_eq!(t.load::<u64>(A + 56).unwrap(), total);
    assert_eq!(t.load::<u8>(A + 30).unwrap(), 0);
    assert_eq!(t.load::<u8>(A + 33).unwrap(), 0);
}

/// An operand across a line or a page: exact totals under `Warn` (the
/// default); `BUS_ADRALN` and nothing written under `Fatal`.
#[test]
fn split_locks_follow_the_setting() {
    const N: u64 = 10_000;
    for setting in [SplitLock::Warn, SplitLock::Fatal] {
        let mm = space(Config {
            split_lock: setting,
            ..Config::default()
        });
        mm.mmap(A, 2 * P, RW, fixed()).unwrap();
        let (line, page) = (A + 60, A + P - 2);
        if setting == SplitLock::Fatal {
            let mut t = mm.translator();
            let e = t.fetch_add::<u64>(line, 1).unwrap_err();
            assert_eq!(info(e), (line, BUS, ADRALN, 0));
            assert_eq!(e.kind, FaultError::Alignment);
            let e = t.compare_exchange::<u32>(page, 0, 1).unwrap_err();
            assert_eq!(info(e), (page, BUS, ADRALN, 0));
            assert_eq!(t.fetch_add::<u64>(A + 56, 1).unwrap(), 0, "in a line");
            assert_eq!(t.load::<u64>(line).unwrap(), 0, "nothing written");
            assert_eq!(t.load::<u32>(page).unwrap(), 0);
            continue;
        }
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    let mut t = mm.translator();
                    for _ in 0..N {
                        t.fetch_add::<u64>(line, 1).unwrap();
                        t.fetch_add::<u32>(page, 1).unwrap();
                    }
                });
            }
        });
        let mut t = mm.translator();
        assert_eq!(t.load::<u64>(line).unwrap(), 2 * N);
        assert_eq!(t.load::<u32>(page).unwrap(), 2 * N as u32);
        assert_eq!(t.swap::<u32>(page, 7).unwrap(), 2 * N as u32);
        assert_eq!(t.load::<u32>(page).unwrap(), 7);
    }
}
