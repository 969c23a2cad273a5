//! snapshot: restore a guest image from a snapshot eagerly (copy every
//! page, then run) and lazily (run at once; a userfault handler serves
//! missing pages on demand while a prefetcher fills the recorded working
//! set first and then the rest), then track the pages one more run dirties
//! and save only those.
//!
//! ```text
//! cargo run --release --example snapshot -- [--mib M] [--threads N] [--handlers H]
//! ```
//!
//! The workload: N threads write a guest image of M MiB (every page
//! carries its index and a generation), then touch a working set of one
//! page in 8. The snapshot is a [`Memfd`] holding the present pages
//! (found with `pagemap_scan`). Each restore builds a fresh address space
//! and runs the same working-set pass, checking every byte it reads
//! against the snapshot. Dirty tracking registers the restored image with
//! an async write-protect handler, resets it with one `pagemap_scan`
//! (`WP_MATCHING`), lets the threads dirty one page in 16, and saves the
//! pages the next scan reports as written. Printed for both restores,
//! side by side: time to the first guest access, time until every page is
//! in place, faults the handler served, pages the prefetcher placed, and
//! dirty pages saved.

#[path = "../benches/common/machine.rs"]
mod machine;

use aspace::uffd::{Event, PageCategories, RegisterMode, ScanArgs, ScanFlags, Uffd, UffdBuilder};
use aspace::{AddressSpace, Config, Error, MapFlags, Memfd, Prot, PAGE_SIZE};
use machine::{machine, parse_arg};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const PAGE: usize = PAGE_SIZE as usize;
/// One page in `HOT` is in the working set.
const HOT: u64 = 8;
/// One page in `DIRTY` is written by the tracked run.
const DIRTY: u64 = 16;
/// Pages the prefetcher copies at once after the working set.
const FILL_RUN: u64 = 64;

struct Opts {
    mib: u64,
    threads: usize,
    handlers: usize,
}

fn opts() -> Opts {
    let mut o = Opts {
        mib: 256,
        threads: 2,
        handlers: 2,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v = args.next().unwrap_or_default();
        match a.as_str() {
            "--mib" => o.mib = parse_arg(&v, |&n: &u64| (1..=4096).contains(&n)).expect("--mib M"),
            "--threads" => {
                o.threads = parse_arg(&v, |&n: &usize| (1..=64).contains(&n)).expect("--threads N")
            }
            "--handlers" => {
                o.handlers =
                    parse_arg(&v, |&n: &usize| (1..=64).contains(&n)).expect("--handlers H")
            }
            _ => {
                eprintln!("usage: snapshot [--mib M] [--threads N] [--handlers H]");
                std::process::exit(2);
            }
        }
    }
    o
}

fn space(mib: u64) -> AddressSpace {
    AddressSpace::new(Config {
        memory_budget: (3 * mib + 64) << 20,
        ..Config::default()
    })
}

fn anon() -> MapFlags {
    MapFlags::PRIVATE | MapFlags::ANONYMOUS
}

fn rw() -> Prot {
    Prot::READ | Prot::WRITE
}

/// The bytes of page `i` in generation `gen`: its index and generation in
/// every 8-byte word, so a misplaced or stale page shows.
fn page_bytes(i: u64, gen: u64, out: &mut [u8]) {
    let word = (i << 8 | gen).to_le_bytes();
    for c in out.chunks_exact_mut(8) {
        c.copy_from_slice(&word);
    }
}

/// Runs `f(thread, page)` over `pages` split between `threads` threads.
fn parallel(threads: usize, pages: &[u64], f: impl Fn(usize, u64) + Sync) {
    let per = pages.len().div_ceil(threads).max(1);
    std::thread::scope(|s| {
        for (t, part) in pages.chunks(per).enumerate() {
            let f = &f;
            s.spawn(move || part.iter().for_each(|&p| f(t, p)));
        }
    });
}

/// Every page of the image, written with generation 1.
fn write_image(mm: &AddressSpace, base: u64, pages: u64, threads: usize) {
    let all: Vec<u64> = (0..pages).collect();
    parallel(threads, &all, |_, i| {
        let mut buf = vec![0u8; PAGE];
        page_bytes(i, 1, &mut buf);
        mm.write(base + i * PAGE_SIZE, &buf)
            .expect("write the image");
    });
}

/// The guest's working-set pass: reads the first word of every hot page
/// and checks it. Returns the time of the first access's completion.
fn run_working_set(
    mm: &AddressSpace,
    base: u64,
    hot: &[u64],
    threads: usize,
    t0: Instant,
) -> Duration {
    let first = AtomicU64::new(u64::MAX);
    parallel(threads, hot, |_, i| {
        let mut w = [0u8; 8];
        mm.read(base + i * PAGE_SIZE, &mut w)
            .expect("read the image");
        let mut want = [0u8; 8];
        page_bytes(i, 1, &mut want);
        assert_eq!(w, want, "page {i} restored wrong");
        first.fetch_min(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
    });
    Duration::from_nanos(first.load(Ordering::Relaxed))
}

/// The snapshot: the present pages of the image, found with one scan.
fn take_snapshot(mm: &AddressSpace, base: u64, pages: u64) -> Memfd {
    let len = pages * PAGE_SIZE;
    let snap = Memfd::new("snapshot", len).expect("snapshot object");
    let args = ScanArgs {
        category_mask: PageCategories::PRESENT,
        return_mask: PageCategories::PRESENT,
        max_regions: usize::MAX,
        ..ScanArgs::default()
    };
    let found = mm
        .pagemap_scan(base, base + len, &args)
        .expect("scan the image");
    let mut buf = vec![0u8; PAGE];
    for r in &found.regions {
        for a in (r.start..r.end).step_by(PAGE) {
            mm.read(a, &mut buf).expect("read the image");
            snap.write_at(&buf, a - base).expect("save a page");
        }
    }
    snap
}

#[derive(Default)]
struct Row {
    first_access: Duration,
    total: Duration,
    faults: u64,
    prefetched: u64,
    dirty_saved: u64,
}

/// Restore (a): copy every page, then run.
fn restore_eager(o: &Opts, snap: &Memfd, pages: u64, hot: &[u64]) -> (AddressSpace, u64, Row) {
    let mm = space(o.mib);
    let base = mm.mmap(0, pages * PAGE_SIZE, rw(), anon()).expect("map");
    let t0 = Instant::now();
    let all: Vec<u64> = (0..pages).collect();
    parallel(o.threads, &all, |_, i| {
        let mut buf = vec![0u8; PAGE];
        snap.read_at(&mut buf, i * PAGE_SIZE)
            .expect("read the snapshot");
        mm.write(base + i * PAGE_SIZE, &buf)
            .expect("restore a page");
    });
    let total = t0.elapsed();
    let first_access = run_working_set(&mm, base, hot, o.threads, t0);
    let row = Row {
        first_access,
        total,
        ..Row::default()
    };
    (mm, base, row)
}

/// Places pages `[first, first + n)` from the snapshot where they are not
/// there already (one `copy` per run of missing pages): returns how many
/// this call placed.
fn place(uffd: &Uffd<'_>, snap: &Memfd, base: u64, first: u64, n: u64, buf: &mut [u8]) -> u64 {
    let buf = &mut buf[..(n * PAGE_SIZE) as usize];
    snap.read_at(buf, first * PAGE_SIZE)
        .expect("read the snapshot");
    let (mut done, mut placed) = (0, 0);
    while done < n {
        let at = (done * PAGE_SIZE) as usize;
        match uffd.copy(&buf[at..], base + (first + done) * PAGE_SIZE, true) {
            Ok(b) => {
                placed += b / PAGE_SIZE;
                break;
            }
            // Stopped at a page already there (the handler or the
            // prefetcher placed it): count what went in, skip that page.
            Err(e) if e.error == Error::Exist || e.error == Error::Again => {
                placed += e.copied / PAGE_SIZE;
                done += e.copied / PAGE_SIZE + 1;
            }
            Err(e) => panic!("copy at page {}: {e}", first + done),
        }
    }
    placed
}

/// Restore (b): register the empty image for missing pages, start the
/// handlers and the prefetcher, and run at once.
fn restore_lazy(o: &Opts, snap: &Memfd, pages: u64, hot: &[u64]) -> (AddressSpace, u64, Row) {
    let mm = space(o.mib);
    let base = mm.mmap(0, pages * PAGE_SIZE, rw(), anon()).expect("map");
    let mut row = Row::default();
    {
        let uffd = mm.userfaultfd();
        let t0 = Instant::now();
        uffd.register_with_mode(base, pages * PAGE_SIZE, RegisterMode::MISSING)
            .expect("register");
        let stop = AtomicBool::new(false);
        let served = AtomicU64::new(0);
        let prefetched = AtomicU64::new(0);
        std::thread::scope(|s| {
            for _ in 0..o.handlers {
                let (uffd, stop, served) = (uffd.clone(), &stop, &served);
                s.spawn(move || {
                    let mut buf = vec![0u8; PAGE];
                    while !stop.load(Ordering::Relaxed) {
                        let Some(Event::Pagefault { addr, .. }) =
                            uffd.read_event_timeout(Duration::from_millis(5))
                        else {
                            continue;
                        };
                        if place(&uffd, snap, base, (addr - base) / PAGE_SIZE, 1, &mut buf) == 0 {
                            // The prefetcher placed it first: wake the fault.
                            uffd.wake(addr, PAGE_SIZE).expect("wake");
                        }
                        served.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
            // The prefetcher: the recorded working set first, then the rest.
            let prefetch = {
                let (uffd, prefetched) = (uffd.clone(), &prefetched);
                s.spawn(move || {
                    let mut buf = vec![0u8; PAGE * FILL_RUN as usize];
                    for &i in hot {
                        let n = place(&uffd, snap, base, i, 1, &mut buf);
                        prefetched.fetch_add(n, Ordering::Relaxed);
                    }
                    for i in (0..pages).step_by(FILL_RUN as usize) {
                        let n = place(&uffd, snap, base, i, FILL_RUN.min(pages - i), &mut buf);
                        prefetched.fetch_add(n, Ordering::Relaxed);
                    }
                    t0.elapsed()
                })
            };
            row.first_access = run_working_set(&mm, base, hot, o.threads, t0);
            row.total = prefetch.join().expect("prefetcher");
            stop.store(true, Ordering::Relaxed);
        });
        row.faults = served.load(Ordering::Relaxed);
        row.prefetched = prefetched.load(Ordering::Relaxed);
        // Dropping `uffd` unregisters the image.
    }
    (mm, base, row)
}

/// One more run under an async write-protect handler: reset, dirty one
/// page in `DIRTY`, and save exactly the pages the scan reports written.
/// Returns the pages saved; checks they are the pages written.
fn track_and_save(mm: &AddressSpace, base: u64, pages: u64, threads: usize, snap: &Memfd) -> u64 {
    let len = pages * PAGE_SIZE;
    let uffd = UffdBuilder::new().wp_async(true).create(mm);
    uffd.register_with_mode(base, len, RegisterMode::WRITE_PROTECT)
        .expect("register for write-protect");
    // Report the written pages and write-protect them again, in one pass.
    let written = ScanArgs {
        flags: ScanFlags::WP_MATCHING,
        category_mask: PageCategories::WRITTEN,
        return_mask: PageCategories::WRITTEN,
        max_regions: usize::MAX,
        ..ScanArgs::default()
    };
    // Reset: every page written so far is write-protected.
    mm.pagemap_scan(base, base + len, &written).expect("reset");
    let dirty: Vec<u64> = (0..pages).filter(|i| i % DIRTY == 3).collect();
    parallel(threads, &dirty, |_, i| {
        let mut buf = vec![0u8; PAGE];
        page_bytes(i, 2, &mut buf);
        mm.write(base + i * PAGE_SIZE, &buf).expect("dirty a page");
    });
    let found = mm.pagemap_scan(base, base + len, &written).expect("scan");
    let mut saved = Vec::new();
    let mut buf = vec![0u8; PAGE];
    for r in &found.regions {
        for a in (r.start..r.end).step_by(PAGE) {
            mm.read(a, &mut buf).expect("read a dirty page");
            snap.write_at(&buf, a - base).expect("save a dirty page");
            saved.push((a - base) / PAGE_SIZE);
        }
    }
    assert_eq!(saved, dirty, "the scan reports exactly the pages written");
    saved.len() as u64
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn main() {
    let o = opts();
    let pages = (o.mib << 20) / PAGE_SIZE;
    println!(
        "snapshot on {}: {} MiB image, {} guest threads, {} handler threads",
        machine(),
        o.mib,
        o.threads,
        o.handlers
    );

    let src = space(o.mib);
    let base = src
        .mmap(0, pages * PAGE_SIZE, rw(), anon())
        .expect("map the image");
    let t = Instant::now();
    write_image(&src, base, pages, o.threads);
    let hot: Vec<u64> = (0..pages).step_by(HOT as usize).collect();
    run_working_set(&src, base, &hot, o.threads, Instant::now());
    println!("image written in {}", ms(t.elapsed()));
    let t = Instant::now();
    let snap = take_snapshot(&src, base, pages);
    println!("snapshot taken in {} ({} pages)", ms(t.elapsed()), pages);
    drop(src);

    let (a_mm, a_base, mut a) = restore_eager(&o, &snap, pages, &hot);
    let (b_mm, b_base, mut b) = restore_lazy(&o, &snap, pages, &hot);
    // Both images now hold the snapshot: track one more run on each.
    let a_snap = Memfd::new("snapshot-a", pages * PAGE_SIZE).expect("object");
    let b_snap = Memfd::new("snapshot-b", pages * PAGE_SIZE).expect("object");
    a.dirty_saved = track_and_save(&a_mm, a_base, pages, o.threads, &a_snap);
    b.dirty_saved = track_and_save(&b_mm, b_base, pages, o.threads, &b_snap);

    println!();
    println!(
        "{:<28} {:>16} {:>16}",
        "", "(a) eager copy", "(b) lazy, uffd"
    );
    let rows: [(&str, String, String); 5] = [
        (
            "time to first access",
            ms(a.first_access),
            ms(b.first_access),
        ),
        ("total restore time", ms(a.total), ms(b.total)),
        ("faults served", a.faults.to_string(), b.faults.to_string()),
        (
            "pages prefetched",
            a.prefetched.to_string(),
            b.prefetched.to_string(),
        ),
        (
            "dirty pages saved",
            a.dirty_saved.to_string(),
            b.dirty_saved.to_string(),
        ),
    ];
    for (name, x, y) in rows {
        println!("{name:<28} {x:>16} {y:>16}");
    }
}
