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
    let b = f.alloc().unwrap();
    assert_eq!(a, b);
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
