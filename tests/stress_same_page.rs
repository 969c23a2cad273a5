//! Faults, DONTNEED, mprotect, mlock, populate, fork and munmap meeting on
//! the same pages at the same time, through the public API.
//!
//! One region, shared by every thread. Its first half stays mapped the
//! whole time, with at least read permission: threads fault it, store
//! counters into it and read them back while other threads DONTNEED its
//! pages (or free them lazily), flip them between read-only and
//! read-write, mlock and munlock them, populate them with
//! `MADV_POPULATE_READ`/`WRITE`, read and name them, and fork the space.
//! Its second half is also unmapped and mapped again, page by page.
//!
//! Counted, and required to stay zero:
//! - a fault that fails on a mapped, permitted page (a read fault in the
//!   first half, or a write fault there failing with anything but
//!   `AccessDenied`);
//! - a store whose bytes read back as anything but what the thread last
//!   stored there or zero (DONTNEED, or a fresh mapping in the second
//!   half);
//! - a byte of a forked child that changes after fork returned (the child
//!   itself never writes);
//! - an mlock, munlock or `MADV_POPULATE_READ` of stable pages that
//!   fails, or a `MADV_POPULATE_WRITE` there that fails with anything but
//!   `EINVAL` (read-only just now): Linux judges each VMA as it finds it
//!   under the mmap_lock, so none of these can fail otherwise;
//! - a DONTNEED or FREE of a stable page that fails but with `EINVAL`
//!   (mlocked just now);
//! - a failure of what only reads or names the stable pages (a forced
//!   read or write, `mincore`, `pagemap`, `msync`, `set_anon_name`, advice that
//!   sets VMA flags), or a snapshot of the VMAs (`vmas`) that does not cover the
//!   stable half whole, in order, without overlaps.

#[path = "common/rng.rs"]
mod rng;

use aspace::{
    Access, AddressSpace, Advice, Config, Error, FaultError, FaultLocking, MapFlags, Prot,
    PAGE_SIZE,
};
use rng::XorShift;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// Pages that stay mapped (first half) and pages that come and go.
const STABLE: u64 = 8;
const CHURN: u64 = 8;
const WRITERS: u64 = 2;
const RW: Prot = Prot::READ.union(Prot::WRITE);

fn fixed() -> MapFlags {
    MapFlags::PRIVATE | MapFlags::ANONYMOUS | MapFlags::FIXED
}

#[derive(Default)]
struct Counts {
    false_faults: AtomicU64,
    bad_bytes: AtomicU64,
    child_changes: AtomicU64,
    stores: AtomicU64,
    forks: AtomicU64,
    dontneeds: AtomicU64,
    mprotects: AtomicU64,
    remaps: AtomicU64,
    false_errors: AtomicU64,
    locks: AtomicU64,
    looks: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

fn run(locking: FaultLocking, dur: Duration) {
    let mm = Arc::new(AddressSpace::new(Config::with_locking(locking)));
    let pages = STABLE + CHURN;
    let base = mm
        .mmap(
            0,
            pages * PAGE_SIZE,
            RW,
            MapFlags::PRIVATE | MapFlags::ANONYMOUS,
        )
        .unwrap();
    let page = move |p: u64| base + p * PAGE_SIZE;
    let stop = Arc::new(AtomicBool::new(false));
    let c = Arc::new(Counts::default());
    let start = Arc::new(Barrier::new(WRITERS as usize + 7));
    let mut hs = Vec::new();

    // Writers: each owns one 8-byte word in every page and stores a
    // counter there, then reads it back.
    for t in 0..WRITERS {
        let (mm, stop, c, start) = (mm.clone(), stop.clone(), c.clone(), start.clone());
        hs.push(std::thread::spawn(move || {
            let mut rng = XorShift::new(0x2545_f491 ^ (t + 1));
            let mut last = vec![0u64; pages as usize];
            let mut counter = 0u64;
            start.wait();
            while !stop.load(Ordering::Relaxed) {
                let p = rng.next_u64() % pages;
                let a = page(p) + t * 8;
                let stable = p < STABLE;
                // A read fault on a stable page must always succeed; a
                // write fault may only be refused (read-only just now).
                match mm.fault(a, Access::Read) {
                    Ok(()) => {}
                    Err(_) if !stable => {}
                    Err(e) => {
                        eprintln!("read fault on stable page {p}: {e:?}");
                        bump(&c.false_faults);
                    }
                }
                match mm.fault(a, Access::Write) {
                    Ok(()) | Err(FaultError::AccessDenied) => {}
                    Err(_) if !stable => {}
                    Err(e) => {
                        eprintln!("write fault on stable page {p}: {e:?}");
                        bump(&c.false_faults);
                    }
                }
                counter += 1;
                if mm.write(a, &counter.to_le_bytes()).is_ok() {
                    last[p as usize] = counter;
                    bump(&c.stores);
                }
                let mut b = [0u8; 8];
                if mm.read(a, &mut b).is_ok() {
                    let v = u64::from_le_bytes(b);
                    // Zero (dropped or remapped) or the last store; an
                    // older or foreign value is a lost or misplaced write.
                    if v != 0 && v != last[p as usize] {
                        eprintln!("page {p} word {t}: read {v}, stored {}", last[p as usize]);
                        bump(&c.bad_bytes);
                    }
                } else if stable {
                    eprintln!("read of stable page {p} failed");
                    bump(&c.false_faults);
                }
            }
        }));
    }

    // DONTNEED over single pages of the whole region.
    {
        let (mm, stop, c, start) = (mm.clone(), stop.clone(), c.clone(), start.clone());
        hs.push(std::thread::spawn(move || {
            let mut rng = XorShift::new(0x9e37_79b9);
            start.wait();
            while !stop.load(Ordering::Relaxed) {
                let p = rng.next_u64() % pages;
                // DONTNEED, or FREE one time in four (a page freed lazily
                // reads as it was or as zero, as after DONTNEED). The
                // churn half may be unmapped right now (ENOMEM); a stable
                // page refuses only while mlocked (EINVAL).
                let advice = if rng.next_u64() % 4 == 0 {
                    Advice::Free
                } else {
                    Advice::DontNeed
                };
                match mm.madvise(page(p), PAGE_SIZE, advice) {
                    Ok(()) => bump(&c.dontneeds),
                    Err(Error::Inval) => {}
                    Err(_) if p >= STABLE => {}
                    Err(e) => {
                        eprintln!("{advice:?} of stable page {p}: {e:?}");
                        bump(&c.false_errors);
                    }
                }
            }
        }));
    }

    // mprotect: stable pages flip between read-only and read-write.
    {
        let (mm, stop, c, start) = (mm.clone(), stop.clone(), c.clone(), start.clone());
        hs.push(std::thread::spawn(move || {
            let mut rng = XorShift::new(0x6c07_8965);
            start.wait();
            while !stop.load(Ordering::Relaxed) {
                let p = rng.next_u64() % STABLE;
                let n = 1 + rng.next_u64() % 2;
                let n = n.min(STABLE - p);
                mm.mprotect(page(p), n * PAGE_SIZE, Prot::READ).unwrap();
                std::thread::yield_now();
                mm.mprotect(page(p), n * PAGE_SIZE, RW).unwrap();
                bump(&c.mprotects);
            }
        }));
    }

    // mlock, populate and munlock stable pages: none may fail (but a
    // populate for writing meeting a read-only page, with EINVAL).
    {
        let (mm, stop, c, start) = (mm.clone(), stop.clone(), c.clone(), start.clone());
        hs.push(std::thread::spawn(move || {
            let mut rng = XorShift::new(0x1405_7b7e);
            let expect = |what: &str, r: Result<(), Error>, ok: &[Error]| {
                if let Err(e) = r {
                    if !ok.contains(&e) {
                        eprintln!("{what} of stable pages: {e:?}");
                        bump(&c.false_errors);
                    }
                }
            };
            start.wait();
            while !stop.load(Ordering::Relaxed) {
                let p = rng.next_u64() % STABLE;
                let len = (1 + rng.next_u64() % 3).min(STABLE - p) * PAGE_SIZE;
                if rng.next_u64() % 4 == 0 {
                    let onfault = aspace::MlockFlags::ONFAULT;
                    expect("mlock2", mm.mlock2(page(p), len, onfault), &[]);
                } else {
                    expect("mlock", mm.mlock(page(p), len), &[]);
                }
                let (advice, ok) = if rng.next_u64() % 2 == 0 {
                    (Advice::PopulateRead, &[][..])
                } else {
                    (Advice::PopulateWrite, &[Error::Inval][..])
                };
                expect("populate", mm.madvise(page(p), len, advice), ok);
                expect("munlock", mm.munlock(page(p), len), &[]);
                bump(&c.locks);
            }
        }));
    }

    // Readers of the stable half, and writers that only name it or set
    // flags on it: none may fail, and a snapshot covers it whole.
    {
        let (mm, stop, c, start) = (mm.clone(), stop.clone(), c.clone(), start.clone());
        hs.push(std::thread::spawn(move || {
            let mut rng = XorShift::new(0x3c6e_f372);
            let stable = base + STABLE * PAGE_SIZE;
            let fail = |what: &str, e: &dyn std::fmt::Debug| {
                eprintln!("{what} of stable pages: {e:?}");
                bump(&c.false_errors);
            };
            let advice = [
                Advice::WillNeed,
                Advice::Random,
                Advice::Sequential,
                Advice::Normal,
                Advice::HugePage,
                Advice::NoHugePage,
            ];
            let mut buf = [0u8; 64];
            start.wait();
            while !stop.load(Ordering::Relaxed) {
                let p = rng.next_u64() % STABLE;
                let len = (1 + rng.next_u64() % 3).min(STABLE - p) * PAGE_SIZE;
                let mut at = base;
                for v in mm
                    .vmas()
                    .iter()
                    .filter(|v| v.end > base && v.start < stable)
                {
                    if v.start > at || v.end <= v.start {
                        fail("a snapshot", &(at, v.start, v.end));
                    }
                    at = v.end;
                }
                if at < stable {
                    fail("a snapshot", &("ends at", at));
                }
                if let Err(e) = mm.read_forced(page(p), &mut buf) {
                    fail("a forced read", &e);
                }
                // A forced write (a debugger's) past the writers' words,
                // read-only page or not; then read back forced.
                let mark = rng.next_u64().to_le_bytes();
                let at = page(p) + PAGE_SIZE / 2;
                if let Err(e) = mm.write_forced(at, &mark) {
                    fail("a forced write", &e);
                }
                let mut back = [0u8; 8];
                match mm.read_forced(at, &mut back) {
                    // Only this thread writes there; a DONTNEED or FREE
                    // since may have zeroed it.
                    Ok(()) if back == mark || back == [0; 8] => {}
                    r => fail("a forced write read back", &(r, back, mark)),
                }
                match mm.mincore(base, STABLE * PAGE_SIZE) {
                    Ok(v) if v.len() == STABLE as usize => {}
                    r => fail("mincore", &r),
                }
                if let Err(e) = mm.pagemap(page(p), len) {
                    fail("pagemap", &e);
                }
                if let Err(e) = mm.msync(page(p), len, aspace::MsyncFlags::ASYNC) {
                    fail("msync", &e);
                }
                let name = (rng.next_u64() % 2 == 0).then_some("stress");
                if let Err(e) = mm.set_anon_name(page(p), len, name) {
                    fail("set_anon_name", &e);
                }
                let a = advice[(rng.next_u64() % advice.len() as u64) as usize];
                if let Err(e) = mm.madvise(page(p), len, a) {
                    fail("madvise", &(a, e));
                }
                bump(&c.looks);
            }
        }));
    }

    // munmap and map again, page by page, in the churn half.
    {
        let (mm, stop, c, start) = (mm.clone(), stop.clone(), c.clone(), start.clone());
        hs.push(std::thread::spawn(move || {
            let mut rng = XorShift::new(0x5851_f42d);
            start.wait();
            while !stop.load(Ordering::Relaxed) {
                let p = STABLE + rng.next_u64() % CHURN;
                mm.munmap(page(p), PAGE_SIZE).unwrap();
                std::thread::yield_now();
                assert_eq!(mm.mmap(page(p), PAGE_SIZE, RW, fixed()).unwrap(), page(p));
                bump(&c.remaps);
            }
        }));
    }

    // fork: the child's view of the stable half never changes afterwards.
    {
        let (mm, stop, c, start) = (mm.clone(), stop.clone(), c.clone(), start.clone());
        hs.push(std::thread::spawn(move || {
            let len = (STABLE * PAGE_SIZE) as usize;
            let (mut first, mut again) = (vec![0u8; len], vec![0u8; len]);
            start.wait();
            while !stop.load(Ordering::Relaxed) {
                let child = mm.fork().unwrap();
                child.read(base, &mut first).unwrap();
                // Let the parent's threads store for a while.
                std::thread::sleep(Duration::from_micros(200));
                child.read(base, &mut again).unwrap();
                let changed = first.iter().zip(&again).filter(|(a, b)| a != b).count();
                if changed > 0 {
                    eprintln!("a child saw {changed} bytes change after fork");
                    c.child_changes.fetch_add(changed as u64, Ordering::Relaxed);
                }
                bump(&c.forks);
            }
        }));
    }

    start.wait();
    let t0 = Instant::now();
    while t0.elapsed() < dur {
        std::thread::sleep(Duration::from_millis(10));
    }
    stop.store(true, Ordering::Relaxed);
    for h in hs {
        h.join().unwrap();
    }
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    eprintln!(
        "{locking:?}: {} stores, {} forks, {} DONTNEEDs, {} mprotect pairs, {} remaps, {} lock rounds, {} looks",
        get(&c.stores),
        get(&c.forks),
        get(&c.dontneeds),
        get(&c.mprotects),
        get(&c.remaps),
        get(&c.locks),
        get(&c.looks)
    );
    assert_eq!(get(&c.false_faults), 0, "faults failed on mapped pages");
    assert_eq!(get(&c.bad_bytes), 0, "stores lost or misplaced");
    assert_eq!(get(&c.child_changes), 0, "a child's bytes changed");
    assert_eq!(get(&c.false_errors), 0, "locks or populates failed");
    for (what, n) in [
        ("stores", get(&c.stores)),
        ("forks", get(&c.forks)),
        ("DONTNEEDs", get(&c.dontneeds)),
        ("mprotects", get(&c.mprotects)),
        ("remaps", get(&c.remaps)),
        ("locks", get(&c.locks)),
        ("looks", get(&c.looks)),
    ] {
        assert!(n > 0, "no {what} ran: the test exercised nothing");
    }
    drop(mm);
}

#[test]
fn per_vma_faults_dontneed_mprotect_fork_munmap_same_pages() {
    run(FaultLocking::PerVma, Duration::from_secs(3));
}

#[test]
fn mmap_lock_faults_dontneed_mprotect_fork_munmap_same_pages() {
    run(FaultLocking::MmapLock, Duration::from_secs(2));
}

#[test]
fn speculative_faults_dontneed_mprotect_fork_munmap_same_pages() {
    run(FaultLocking::Speculative, Duration::from_secs(2));
}

/// Two threads fault the same pages while one of them also drops each
/// page with DONTNEED right after faulting it: no fault on the mapped,
/// writable range may fail. (A fault whose install lost the race to the
/// other thread, and then found the entry emptied by DONTNEED, used to
/// report `NoMapping`.) On the per-VMA path, and on the speculative one,
/// which small VMAs take since their PTE tables may be shared.
#[test]
fn faults_racing_dontneed_never_fail() {
    dontneed_race(FaultLocking::PerVma);
    dontneed_race(FaultLocking::Speculative);
}

fn dontneed_race(locking: FaultLocking) {
    const N: u64 = 4;
    let mm = Arc::new(AddressSpace::new(Config::with_locking(locking)));
    let base = mm
        .mmap(
            0,
            N * PAGE_SIZE,
            RW,
            MapFlags::PRIVATE | MapFlags::ANONYMOUS,
        )
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let failures = Arc::new(AtomicU64::new(0));
    let rounds = Arc::new(AtomicU64::new(0));
    let start = Arc::new(Barrier::new(2));
    let thread = |zap: bool| {
        let (mm, stop, failures, rounds, start) = (
            mm.clone(),
            stop.clone(),
            failures.clone(),
            rounds.clone(),
            start.clone(),
        );
        std::thread::spawn(move || {
            start.wait();
            while !stop.load(Ordering::Relaxed) {
                for p in 0..N {
                    let a = base + p * PAGE_SIZE;
                    if let Err(e) = mm.fault(a, Access::Write) {
                        eprintln!("fault on mapped page {p}: {e:?}");
                        failures.fetch_add(1, Ordering::Relaxed);
                    }
                    if zap {
                        mm.madvise(a, PAGE_SIZE, Advice::DontNeed).unwrap();
                    }
                }
                rounds.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let hs = [thread(false), thread(true)];
    let t0 = Instant::now();
    while rounds.load(Ordering::Relaxed) < 2_000_000 && t0.elapsed() < Duration::from_secs(8) {
        std::thread::sleep(Duration::from_millis(10));
    }
    stop.store(true, Ordering::Relaxed);
    for h in hs {
        h.join().unwrap();
    }
    let s = mm.stats();
    // A per-VMA fault that found the page counts in both figures; a
    // speculative one counts as spurious only.
    let installs = match locking {
        FaultLocking::Speculative => s.fault_speculative,
        _ => s.fault_per_vma.saturating_sub(s.fault_spurious),
    };
    eprintln!(
        "{locking:?}: {} rounds of {N} pages, {installs} installs",
        rounds.load(Ordering::Relaxed)
    );
    assert_eq!(failures.load(Ordering::Relaxed), 0, "false SIGSEGVs");
    assert!(
        installs > 10_000,
        "the pages were rarely empty: nothing raced"
    );
}
