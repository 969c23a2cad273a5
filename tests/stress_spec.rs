//! Stress of the speculative fault path: threads write and verify patterns
//! in pages of one large VMA (whole 2 MiB spans, so faults go
//! speculative) while another thread splits and re-merges the VMA with
//! mprotect, forks (write-protecting every entry), and zaps other pages
//! with DONTNEED; each worker also empties its own pages now and then, so
//! they fault again. Zero lost bytes, no frame leaked.

#[path = "common/rng.rs"]
mod rng;

use aspace::{AddressSpace, Advice, Config, FaultLocking, MapFlags, Prot, PAGE_SIZE};
use rng::XorShift;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

const RW: Prot = Prot::READ.union(Prot::WRITE);
/// Two PMD spans and a bit: at least one span lies wholly inside.
const PAGES: u64 = 1100;
const WORKERS: u64 = 2;
/// The last pages belong to nobody: the churner DONTNEEDs them.
const SCRATCH: u64 = 64;

#[test]
fn speculative_faults_lose_nothing() {
    let mm = Arc::new(AddressSpace::new(Config::with_locking(
        FaultLocking::Speculative,
    )));
    let base = mm
        .mmap(
            0,
            PAGES * PAGE_SIZE,
            RW,
            MapFlags::PRIVATE | MapFlags::ANONYMOUS,
        )
        .unwrap();
    // Give the VMA its anon_vma and a few PTE tables first, as a running
    // program would have.
    for p in (0..PAGES).step_by(512) {
        mm.write(base + p * PAGE_SIZE, &[1]).unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(WORKERS as usize + 2));
    let mut hs = Vec::new();
    for t in 0..WORKERS {
        let (mm, stop, start) = (mm.clone(), stop.clone(), start.clone());
        hs.push(std::thread::spawn(move || {
            let mut rng = XorShift::new(0x9e37_79b9 ^ (t + 1));
            // Each worker owns the pages p with p % WORKERS == t.
            let mine = (PAGES - SCRATCH) / WORKERS;
            let mut gen = vec![0u8; mine as usize];
            start.wait();
            while !stop.load(Ordering::Relaxed) {
                let i = rng.next_u64() % mine;
                let a = base + (i * WORKERS + t) * PAGE_SIZE + 8;
                let dice = rng.next_u64() % 12;
                if dice == 0 {
                    // Empty the page again, so that faults keep coming to
                    // the speculative path after the first touch (and after
                    // a fork made every entry copy-on-write).
                    mm.madvise(a - 8, PAGE_SIZE, Advice::DontNeed).unwrap();
                    gen[i as usize] = 0;
                } else if dice < 4 {
                    let mut x = [0u8; 1];
                    mm.read(a, &mut x).unwrap();
                    assert_eq!(x[0], gen[i as usize], "worker {t} page {i}");
                } else {
                    let g = gen[i as usize].wrapping_add(1).max(1);
                    mm.write(a, &[g]).unwrap();
                    gen[i as usize] = g;
                }
            }
        }));
    }
    {
        let (mm, stop, start) = (mm.clone(), stop.clone(), start.clone());
        hs.push(std::thread::spawn(move || {
            let mut rng = XorShift::new(4242);
            start.wait();
            while !stop.load(Ordering::Relaxed) {
                match rng.next_u64() % 4 {
                    0 | 1 => {
                        // Split and re-merge, writable throughout.
                        let p = 1 + rng.next_u64() % (PAGES - 4);
                        let a = base + p * PAGE_SIZE;
                        mm.mprotect(a, 2 * PAGE_SIZE, RW | Prot::EXEC).unwrap();
                        mm.mprotect(a, 2 * PAGE_SIZE, RW).unwrap();
                    }
                    2 => {
                        let p = PAGES - SCRATCH + rng.next_u64() % SCRATCH;
                        mm.write(base + p * PAGE_SIZE, &[7]).unwrap();
                        mm.madvise(base + p * PAGE_SIZE, PAGE_SIZE, Advice::DontNeed)
                            .unwrap();
                    }
                    _ => drop(mm.fork().unwrap()),
                }
            }
        }));
    }
    start.wait();
    std::thread::sleep(Duration::from_millis(1500));
    stop.store(true, Ordering::Relaxed);
    let t0 = Instant::now();
    for h in hs {
        h.join().unwrap();
    }
    assert!(t0.elapsed() < Duration::from_secs(30));
    let s = mm.stats();
    println!(
        "speculative {} per-VMA {} mmap_lock {}; aborts: locked {} lookup {} needs-more {} table {} stamp {} oom {}",
        s.fault_speculative,
        s.fault_per_vma,
        s.fault_mmap_lock,
        s.spec_abort_locked,
        s.spec_abort_lookup,
        s.spec_abort_needs_more,
        s.spec_abort_table,
        s.spec_abort_stamp,
        s.spec_abort_oom
    );
    assert!(
        s.fault_speculative > 1000,
        "the speculative path must carry faults: {s:?}"
    );
    mm.munmap(base, PAGES * PAGE_SIZE).unwrap();
    assert_eq!(mm.frames_used(), 0, "frames leaked");
}
