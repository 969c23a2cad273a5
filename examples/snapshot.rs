//! Lazy snapshot restore, as VMMs do it with userfaultfd: a workload of N
//! threads writes a guest image; the image is saved into a memfd; a fresh
//! address space restores it (a) eagerly, copying every page before the
//! guest runs, and (b) lazily, through a missing-page handler that serves
//! pages on demand while a prefetcher copies the recorded working set
//! first and then the rest of the image in the background.
//! Then each restored guest runs once more under async write-protect
//! dirty tracking (`pagemap_scan`), and only the written pages are saved.
//!
//! `cargo run --release --example snapshot [image MiB] [threads]`
//! (default 128 MiB, 4 threads).

use aspace::uffd::{Event, PageCategories, RegisterMode, ScanArgs, ScanFlags};
use aspace::{AddressSpace, Config, Error, FrameAllocator, MapFlags, Memfd, Prot, UffdBuilder};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const P: u64 = aspace::PAGE_SIZE;

/// The pages the guest touches first after a restore: every 8th page,
/// recorded from the workload (the "working set" a VMM records).
fn working_set(pages: u64) -> impl Iterator<Item = u64> {
    (0..pages).step_by(8)
}

fn rw() -> Prot {
    Prot::READ | Prot::WRITE
}

fn anon() -> MapFlags {
    MapFlags::PRIVATE | MapFlags::ANONYMOUS
}

/// The guest after a restore: `threads` threads read the working set, then
/// write one byte into every 16th page (none of them in the working set).
/// Returns the time to the first completed access.
fn run_guest(mm: &AddressSpace, base: u64, pages: u64, threads: u64, start: Instant) -> Duration {
    let first = AtomicU64::new(u64::MAX);
    std::thread::scope(|s| {
        for t in 0..threads {
            let first = &first;
            s.spawn(move || {
                let mut b = [0u8; 8];
                for p in working_set(pages).filter(|p| (p / 8) % threads == t) {
                    mm.read(base + p * P, &mut b).unwrap();
                    first.fetch_min(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
                    assert_eq!(b[0], (p as u8) ^ 0x5a, "page {p} restored");
                }
                for p in (5..pages).step_by(16).filter(|p| (p / 16) % threads == t) {
                    mm.write(base + p * P + 8, &[1]).unwrap();
                }
            });
        }
    });
    Duration::from_nanos(first.load(Ordering::Relaxed))
}

/// Dirty tracking over one more guest run: returns the pages saved.
fn track_and_save(mm: &AddressSpace, base: u64, pages: u64, threads: u64, out: &Memfd) -> u64 {
    let uffd = UffdBuilder::new().wp_async(true).create(mm);
    uffd.register_with_mode(base, pages * P, RegisterMode::WRITE_PROTECT)
        .unwrap();
    // Report the written pages and write-protect them again, in one pass
    // (`max_regions: 0` only resets).
    let scan = |max_regions| ScanArgs {
        flags: ScanFlags::WP_MATCHING,
        category_mask: PageCategories::WRITTEN,
        return_mask: PageCategories::WRITTEN,
        max_regions,
        ..ScanArgs::default()
    };
    mm.pagemap_scan(base, base + pages * P, &scan(0)).unwrap();
    run_guest(mm, base, pages, threads, Instant::now());
    let dirty = mm
        .pagemap_scan(base, base + pages * P, &scan(usize::MAX))
        .unwrap();
    let mut saved = 0;
    let mut buf = vec![0u8; P as usize];
    for r in dirty.regions {
        for a in (r.start..r.end).step_by(P as usize) {
            mm.read(a, &mut buf).unwrap();
            out.write_at(a - base, &buf).unwrap();
            saved += 1;
        }
    }
    saved
}

struct Row {
    first: Duration,
    total: Duration,
    faults: u64,
    prefetched: u64,
    dirty: u64,
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mib: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(128);
    let threads: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(4);
    let pages = mib * (1 << 20) / P;
    let pool = Arc::new(FrameAllocator::new((4 * mib) << 20, true));
    let cfg = Config::default();

    // The guest writes its image; the snapshot is a memfd of its pages.
    let guest = AddressSpace::with_pool(cfg.clone(), pool.clone());
    let base = guest.mmap(0, pages * P, rw(), anon()).unwrap();
    std::thread::scope(|s| {
        for t in 0..threads {
            let guest = &guest;
            s.spawn(move || {
                for p in (0..pages).filter(|p| p % threads == t) {
                    guest
                        .write(base + p * P, &[(p as u8) ^ 0x5a; P as usize])
                        .unwrap();
                }
            });
        }
    });
    let image = Memfd::new_in(&pool, "snapshot", pages * P).unwrap();
    let mut buf = vec![0u8; P as usize];
    for p in 0..pages {
        guest.read(base + p * P, &mut buf).unwrap();
        image.write_at(p * P, &buf).unwrap();
    }
    drop(guest);
    let dirty_out = Memfd::new_in(&pool, "dirty", pages * P).unwrap();

    // (a) Eager: copy everything, then run.
    let eager = {
        let mm = AddressSpace::with_pool(cfg.clone(), pool.clone());
        let at = mm.mmap(0, pages * P, rw(), anon()).unwrap();
        let start = Instant::now();
        for p in 0..pages {
            image.read_at(p * P, &mut buf).unwrap();
            mm.write(at + p * P, &buf).unwrap();
        }
        let first = run_guest(&mm, at, pages, threads, start);
        let total = start.elapsed();
        let dirty = track_and_save(&mm, at, pages, threads, &dirty_out);
        Row {
            first,
            total,
            faults: 0,
            prefetched: 0,
            dirty,
        }
    };

    // (b) Lazy: a missing-page handler serves faults; a prefetcher copies
    // the working set; the guest runs at once.
    let lazy = {
        let mm = AddressSpace::with_pool(cfg, pool.clone());
        let at = mm.mmap(0, pages * P, rw(), anon()).unwrap();
        let uffd = mm.userfaultfd();
        uffd.register(at, pages * P).unwrap();
        let done = AtomicBool::new(false);
        let (served, prefetched) = (AtomicU64::new(0), AtomicU64::new(0));
        let start = Instant::now();
        let first = std::thread::scope(|s| {
            for _ in 0..2 {
                let (u, image, done, served) = (uffd.clone(), &image, &done, &served);
                s.spawn(move || {
                    let mut buf = vec![0u8; P as usize];
                    while !done.load(Ordering::Acquire) {
                        let Some(Event::Pagefault { addr, .. }) =
                            u.read_event_timeout(Duration::from_millis(5))
                        else {
                            continue;
                        };
                        image.read_at(addr - at, &mut buf).unwrap();
                        match u.copy(&buf, addr, true) {
                            Ok(_) => {
                                served.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(e) if e.error == Error::Exist => u.wake(addr, P).unwrap(),
                            Err(e) => panic!("copy: {e}"),
                        }
                    }
                });
            }
            {
                let (u, image, prefetched, done) = (uffd.clone(), &image, &prefetched, &done);
                s.spawn(move || {
                    let mut buf = vec![0u8; P as usize];
                    let rest = (0..pages).filter(|p| p % 8 != 0);
                    for p in working_set(pages).chain(rest) {
                        image.read_at(p * P, &mut buf).unwrap();
                        if u.copy(&buf, at + p * P, true).is_ok() {
                            prefetched.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    // Every page is present: no fault needs a handler now.
                    done.store(true, Ordering::Release);
                });
            }
            run_guest(&mm, at, pages, threads, start)
        });
        let total = start.elapsed();
        drop(uffd);
        let dirty = track_and_save(&mm, at, pages, threads, &dirty_out);
        Row {
            first,
            total,
            faults: served.into_inner(),
            prefetched: prefetched.into_inner(),
            dirty,
        }
    };

    println!("{mib} MiB image ({pages} pages), {threads} guest threads");
    println!("{:<28} {:>14} {:>14}", "", "(a) eager", "(b) lazy");
    let ms = |d: Duration| format!("{:.3} ms", d.as_secs_f64() * 1e3);
    println!(
        "{:<28} {:>14} {:>14}",
        "time to first access",
        ms(eager.first),
        ms(lazy.first)
    );
    println!(
        "{:<28} {:>14} {:>14}",
        "total restore",
        ms(eager.total),
        ms(lazy.total)
    );
    println!(
        "{:<28} {:>14} {:>14}",
        "faults served", eager.faults, lazy.faults
    );
    println!(
        "{:<28} {:>14} {:>14}",
        "pages prefetched", eager.prefetched, lazy.prefetched
    );
    println!(
        "{:<28} {:>14} {:>14}",
        "dirty pages saved", eager.dirty, lazy.dirty
    );
}
