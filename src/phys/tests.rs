//! Unit tests of the frame allocator and the budget.

use super::budget::STOCK_BATCH;
use super::*;

#[test]
fn alloc_free_and_refcounts() {
    let f = FrameAllocator::new(64 * PAGE_SIZE, true);
    let a = f.alloc().unwrap();
    assert_eq!(f.refcount(a), 1);
    f.get(a);
    assert!(!f.put(a));
    assert_eq!(f.used(), 1);
    assert!(f.put(a));
    assert_eq!(f.used(), 0);
}

#[test]
fn budget_exhaustion_and_room_again() {
    let f = FrameAllocator::new(40 * PAGE_SIZE, false);
    let v: Vec<Pfn> = (0..40).map(|_| f.alloc().unwrap()).collect();
    assert!(f.alloc().is_none());
    let mut sorted = v.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), 40, "no frame handed out twice");
    f.put(v[7]);
    assert_eq!(f.alloc(), Some(v[7]));
    for p in v {
        f.put(p);
    }
    assert_eq!(f.used(), 0);
}

#[test]
fn budget_stocks_are_drained_before_a_charge_fails() {
    let b = Arc::new(Budget::new(4 * STOCK_BATCH));
    // Another thread charges and gives back: its CPU slot keeps stock.
    let b2 = b.clone();
    std::thread::spawn(move || {
        assert!(b2.try_charge(PAGE_SIZE));
        b2.uncharge(PAGE_SIZE);
    })
    .join()
    .unwrap();
    assert_eq!(b.used(), 0);
    // All of the limit can still be charged here, and no more.
    assert!(b.try_charge(4 * STOCK_BATCH));
    assert!(!b.try_charge(1));
    assert_eq!(b.used(), 4 * STOCK_BATCH);
    b.uncharge(4 * STOCK_BATCH);
    assert_eq!(b.used(), 0);
    assert!(b.has_room(4 * STOCK_BATCH) && !b.has_room(4 * STOCK_BATCH + 1));
}

/// Metadata charges take from the CPU's stock when it holds the bytes: the
/// room check answers from it and the forced charge leaves the shared
/// count alone. Short of them, both fall back (the exact check, an add to
/// the shared count), `used` stays exact, and a full budget still refuses
/// until bytes are given back.
#[test]
fn metadata_charges_take_from_the_local_stock() {
    std::thread::spawn(|| {
        stay_on_this_cpu();
        let b = Budget::new(4 * STOCK_BATCH);
        assert!(b.has_room(4 * STOCK_BATCH) && !b.has_room(4 * STOCK_BATCH + 1));
        // A frame's charge takes a batch into this CPU's stock; its
        // uncharge goes back there.
        assert!(b.try_charge(PAGE_SIZE));
        b.uncharge(PAGE_SIZE);
        let shared = b.shared();
        assert_eq!((shared, b.used()), (STOCK_BATCH + PAGE_SIZE, 0));
        assert!(b.has_room(STOCK_BATCH));
        b.force_charge(STOCK_BATCH);
        assert_eq!(b.shared(), shared, "taken from the stock");
        assert_eq!(b.used(), STOCK_BATCH);
        // A page left in stock: a larger forced charge adds to the count.
        b.force_charge(2 * PAGE_SIZE);
        assert_eq!(b.shared(), shared + 2 * PAGE_SIZE);
        assert_eq!(b.used(), STOCK_BATCH + 2 * PAGE_SIZE);
        // The exact check past the stock, to the byte.
        let rest = b.limit() - b.used();
        assert!(b.has_room(rest) && !b.has_room(rest + 1));
        // The rest is charged (the stock's page drained), then nothing.
        assert!(b.try_charge(rest));
        assert_eq!(b.used(), b.limit());
        assert!(!b.has_room(1) && !b.try_charge(1));
        // Bytes given back are room again, answered from the stock, and
        // charged from it without passing the limit.
        b.uncharge(2 * PAGE_SIZE);
        assert!(b.has_room(2 * PAGE_SIZE) && !b.has_room(2 * PAGE_SIZE + 1));
        let shared = b.shared();
        b.force_charge(2 * PAGE_SIZE);
        assert_eq!(b.shared(), shared);
        assert_eq!(b.used(), b.limit());
        assert!(b.shared() <= b.limit());
    })
    .join()
    .unwrap();
}

#[test]
fn frames_and_metadata_share_the_budget() {
    let f = FrameAllocator::new(8 * PAGE_SIZE, true);
    f.memory().force_charge(6 * PAGE_SIZE);
    let v: Vec<Pfn> = std::iter::from_fn(|| f.alloc()).collect();
    assert_eq!(v.len(), 2);
    assert_eq!(f.memory().used(), 8 * PAGE_SIZE);
    for p in v {
        f.put(p);
    }
    f.memory().uncharge(6 * PAGE_SIZE);
    assert_eq!(f.memory().used(), 0);
}

#[test]
fn read_write_round_trips_and_zeroing() {
    let f = FrameAllocator::new(8 * PAGE_SIZE, true);
    let a = f.alloc().unwrap();
    let data: Vec<u8> = (0..100u8).collect();
    for off in [0usize, 1, 7, 8, 13, 4000, 3996] {
        f.write(a, off, &data[..(4096 - off).min(100)]);
        let mut back = vec![0u8; (4096 - off).min(100)];
        f.read(a, off, &mut back);
        assert_eq!(back, &data[..back.len()], "offset {off}");
    }
    let mut one = [0u8; 3];
    f.read(a, 2, &mut one);
    assert_eq!(
        one,
        [1, 2, 3],
        "the write at offset 1 left data[1..4] at 2..5"
    );
    f.put(a);
    // Never-used frames come first (they need no clearing), then `a`.
    let mut fresh = Vec::new();
    let b = loop {
        let p = f.alloc().expect("the freed frame is handed out again");
        if p == a {
            break p;
        }
        fresh.push(p);
    };
    for p in fresh {
        f.put(p);
    }
    let mut all = vec![1u8; 4096];
    f.read(b, 0, &mut all);
    assert!(all.iter().all(|&x| x == 0), "reused frame is zeroed");
    let c = f.alloc().unwrap();
    f.write(b, 0, &[9; 4096]);
    f.copy(c, b);
    f.read(c, 0, &mut all);
    assert!(all.iter().all(|&x| x == 9));
}

#[test]
fn concurrent_alloc_free_hands_out_each_frame_once() {
    let f = Arc::new(FrameAllocator::new(256 * PAGE_SIZE, false));
    let hs: Vec<_> = (0..4)
        .map(|t| {
            let f = f.clone();
            std::thread::spawn(move || {
                for i in 0..2000u32 {
                    let mut mine = Vec::new();
                    for _ in 0..8 {
                        let p = f.alloc().unwrap();
                        f.write(p, 0, &(t * 100_000 + i).to_le_bytes());
                        mine.push(p);
                    }
                    for &p in &mine {
                        let mut b = [0u8; 4];
                        f.read(p, 0, &mut b);
                        assert_eq!(u32::from_le_bytes(b), t * 100_000 + i, "frame shared");
                    }
                    for p in mine {
                        f.put(p);
                    }
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    assert_eq!(f.used(), 0);
}

#[test]
fn never_used_frames_reserved_by_one_cpu_are_found_by_another() {
    // 600 frames: the first allocation reserves the rest of chunk 0 (511
    // frames) for this CPU; chunk 1 holds the other 88.
    let f = FrameAllocator::new(600 * PAGE_SIZE, false);
    let first = f.alloc().unwrap();
    let here = (0..f.cpus.len())
        .find(|&i| !f.cpus.get(i).cache.lock().fresh.is_empty())
        .expect("a slot holds the rest of chunk 0");
    let there = (here + 1) % f.cpus.len();
    // Hand that span to another slot, as if another CPU had reserved it:
    // allocating here must find it there once the pool is dry.
    let span = core::mem::take(&mut f.cpus.get(here).cache.lock().fresh);
    assert_eq!(span.end - span.start, CHUNK_FRAMES as u64 - 1);
    f.cpus.get(there).cache.lock().fresh = span;
    let mut all: Vec<Pfn> = core::iter::once(first)
        .chain(core::iter::from_fn(|| f.alloc()))
        .collect();
    assert_eq!(
        all.len(),
        600,
        "every frame is handed out, wherever it was reserved"
    );
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 600, "no frame handed out twice");
    assert_eq!(f.used(), 600);
}

#[test]
fn table_pages_are_zeroed_frames_of_the_pool_not_counted_as_data() {
    // The free and the table must meet in one CPU cache, or a never-used frame may come first.
    stay_on_this_cpu();
    let f = FrameAllocator::new(4 * PAGE_SIZE, false);
    let a = f.alloc().unwrap();
    f.write(a, 0, &[0xff; 4096]);
    f.put(a);
    let t = f.alloc_table(false).unwrap();
    // SAFETY: just handed out, and ours until `free_table` below.
    let page = unsafe { t.as_ref() };
    assert_eq!(
        page.entries.as_ptr() as *mut u8,
        f.frame_ptr(a),
        "the freed frame's own words"
    );
    assert!(page.entries.iter().all(|e| e.load(Ordering::Relaxed) == 0));
    assert_eq!(page.used.load(Ordering::Relaxed), 0);
    assert_eq!(f.used(), 0, "a table page is not a data frame");
    // It holds one of the four frames: three data frames are left.
    let v: Vec<Pfn> = std::iter::from_fn(|| f.alloc()).collect();
    assert_eq!(v.len(), 3);
    // With no frame free, a table is refused unless a heap page may do.
    assert!(f.alloc_table(false).is_none());
    let h = f.alloc_table(true).unwrap();
    // SAFETY: as above.
    assert!(unsafe { h.as_ref() }
        .entries
        .iter()
        .all(|e| e.load(Ordering::Relaxed) == 0));
    // SAFETY: both came from `alloc_table` and are used no more.
    unsafe {
        f.free_table(h);
        f.free_table(t);
    }
    assert_eq!(f.alloc(), Some(a), "the table's frame is back in the pool");
}

/// Whether the host holds the memory of `pfn` now.
#[cfg(target_os = "linux")]
fn resident(f: &FrameAllocator, pfn: Pfn) -> bool {
    let mut v = 0u8;
    // SAFETY: the frame's 4096 bytes are a page of a mapping of ours;
    // mincore only reports on it, into the one byte it needs.
    let r = unsafe { libc::mincore(f.frame_ptr(pfn).cast(), PAGE_SIZE as usize, &mut v) };
    assert_eq!(r, 0, "mincore");
    v & 1 != 0
}

/// Takes all `n` frames of `f`'s memory, fills each with 0xa5 and frees
/// them all; returns them.
fn fill_and_free_all(f: &FrameAllocator, n: u64) -> Vec<Pfn> {
    let v: Vec<Pfn> = std::iter::from_fn(|| f.alloc()).collect();
    assert_eq!(v.len() as u64, n);
    for &p in &v {
        f.write(p, 0, &[0xa5; 4096]);
    }
    for &p in &v {
        f.put(p);
    }
    v
}

#[test]
fn freed_frames_past_the_mark_are_given_back_and_read_zero() {
    let n = 4096;
    let f = FrameAllocator::new(n * PAGE_SIZE, false);
    let v = fill_and_free_all(&f, n);
    // Resident now: at most the pool's mark and every CPU cache's fill.
    let kept = f.release_above() + f.cpus.len() * CACHE_MAX;
    assert!(kept < n as usize / 2);
    assert!(f.pool.lock().zeroed.len() >= n as usize - kept);
    #[cfg(target_os = "linux")]
    {
        let held = v.iter().filter(|&&p| resident(&f, p)).count();
        assert!(held <= kept, "{held} free frames resident, {kept} allowed");
    }
    // Handed out again (this pool does not clear frames), those given back
    // read zero and the others still hold their bytes.
    let w: Vec<Pfn> = std::iter::from_fn(|| f.alloc()).collect();
    assert_eq!(w.len() as u64, n);
    let mut zero = 0;
    for &p in &w {
        let mut b = [0u8; 4096];
        f.read(p, 0, &mut b);
        if b == [0; 4096] {
            zero += 1;
        } else {
            assert_eq!(b, [0xa5; 4096], "frame {p}");
        }
    }
    assert!(zero >= n as usize - kept, "{zero} frames read zero");
}

/// A frame is uncharged from the account that allocated it, whoever drops
/// its last reference; an account dropped while one of its frames lives
/// keeps its number until that frame goes, so a new account never
/// receives a charge that was not its own.
#[test]
fn a_frame_is_uncharged_from_its_own_account_whoever_frees_it() {
    let a = FrameAllocator::new(1 << 20, true);
    let b = a.sibling(1 << 20);
    assert!(a.shares_memory_with(&b));
    let p = a.alloc().unwrap();
    b.get(p);
    assert!(!a.put(p));
    assert_eq!((a.used(), b.used()), (1, 0));
    assert_eq!((a.memory().used(), b.memory().used()), (PAGE_SIZE, 0));
    assert_eq!(b.used_in_memory(), 1);
    drop(a);
    let c = b.sibling(1 << 20);
    assert!(b.put(p), "freed through another account");
    assert_eq!((b.used(), c.used()), (0, 0));
    assert_eq!((b.memory().used(), c.memory().used()), (0, 0));
    assert_eq!(c.used_in_memory(), 0);
    let q = c.alloc().unwrap();
    assert!(b.put(q));
    assert_eq!((c.used(), c.memory().used()), (0, 0));
}

/// Binds the calling test thread to the CPU it runs on, so that its
/// frees and allocations meet in one CPU cache.
pub(super) fn stay_on_this_cpu() {
    // SAFETY: sched_getcpu takes no arguments.
    let cpu = unsafe { libc::sched_getcpu() };
    assert!(cpu >= 0, "sched_getcpu");
    // SAFETY: cpu_set_t is a plain bit array, valid when zeroed; `cpu` is
    // a CPU number the kernel gave, below CPU_SETSIZE.
    unsafe {
        let mut set: libc::cpu_set_t = core::mem::zeroed();
        libc::CPU_SET(cpu as usize, &mut set);
        libc::sched_setaffinity(0, core::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

fn reads_zero(f: &FrameAllocator, p: Pfn) -> bool {
    let mut b = [0u8; 4096];
    f.read(p, 0, &mut b);
    b == [0; 4096]
}

/// With `zero_freed`, frames are cleared when a batch of them is freed,
/// before anyone takes them, and a zero-frame taker gets them without
/// clearing; the last partial batch waits dirty.
#[test]
fn zero_freed_clears_frames_in_batches_when_freed() {
    std::thread::spawn(|| {
        stay_on_this_cpu();
        let f = FrameAllocator::new(4096 * PAGE_SIZE, true).with_zero_freed(true);
        assert!(f.zeroes_freed());
        assert!(!FrameAllocator::new(4096 * PAGE_SIZE, false)
            .with_zero_freed(true)
            .zeroes_freed());
        let v: Vec<Pfn> = (0..2 * BATCH + 5).map(|_| f.alloc().unwrap()).collect();
        for &p in &v {
            f.write(p, 0, &[0xa5; 4096]);
        }
        for &p in &v {
            f.put(p);
        }
        // Free frames' memory is ours to inspect: the first two batches
        // were cleared by the frees themselves.
        let cleared = v.iter().filter(|&&p| reads_zero(&f, p)).count();
        assert_eq!(cleared, 2 * BATCH, "cleared at free");
        // A fault's frame is one of them (zero ones first), not a dirty
        // one and not a never-used one.
        let (p, dirty) = f.take(Use::Table, true).unwrap();
        assert!(!dirty && v.contains(&p) && reads_zero(&f, p));
        // A frame to be overwritten whole takes a dirty one.
        let (q, dirty) = f.take(Use::Table, false).unwrap();
        assert!(dirty && v.contains(&q) && !reads_zero(&f, q));
    })
    .join()
    .unwrap();
}

/// Without `zero_freed`, frees leave frames dirty; a zero-frame taker
/// prefers a never-used frame to clearing a dirty one, and a taker that
/// overwrites the frame takes the dirty one.
#[test]
fn zero_takers_prefer_zero_frames_and_copies_dirty_ones() {
    std::thread::spawn(|| {
        stay_on_this_cpu();
        let f = FrameAllocator::new(4096 * PAGE_SIZE, true);
        assert!(!f.zeroes_freed());
        let a = f.alloc().unwrap();
        f.write(a, 0, &[0xa5; 4096]);
        assert!(f.put(a));
        assert!(!reads_zero(&f, a), "not cleared at free");
        let b = f.alloc().unwrap();
        assert_ne!(a, b, "a never-used frame before a dirty one");
        assert!(reads_zero(&f, b));
        let c = f.alloc_uninit().unwrap();
        assert_eq!(c, a, "the dirty frame for a frame overwritten whole");
    })
    .join()
    .unwrap();
}

/// Frames cleared at free count as resident: past the pool's mark they
/// are given back to the system like dirty ones, and all read zero.
#[test]
fn cleared_frames_count_against_the_resident_mark() {
    std::thread::spawn(cleared_frames_on_one_cpu)
        .join()
        .unwrap();
}

fn cleared_frames_on_one_cpu() {
    stay_on_this_cpu();
    let n = 4096;
    let f = FrameAllocator::new(n * PAGE_SIZE, true).with_zero_freed(true);
    let v = fill_and_free_all(&f, n);
    let pool = f.pool.lock();
    assert!(pool.free.len() + pool.cleared.len() <= f.release_above());
    // A CPU cache keeps at most `ZEROED_MAX` of them: the rest went to
    // the pool, and what passed its mark was given back.
    assert!(pool.zeroed.len() >= n as usize - f.release_above() - cache::ZEROED_MAX - BATCH);
    drop(pool);
    assert!(v.iter().all(|&p| {
        reads_zero(&f, p) || {
            // Only the last partial batch of some CPU may still be dirty.
            let c = f.cpus.iter().any(|c| c.cache.lock().free.contains(&p));
            c
        }
    }));
}
