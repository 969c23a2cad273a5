//! Readers look up random addresses while a writer inserts, removes and
//! overwrites. Each value encodes the range it was stored for, so every
//! answer is checked: the returned range contains the address, and the
//! value names exactly that range (or, after a trimming store, a range
//! that contains it).

#[path = "common/rng.rs"]
mod rng;

use aspace::tree::RangeTree;
use aspace::Range;
use rng::XorShift;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SPACE: u64 = 1 << 24;

#[test]
fn readers_vs_writer_every_answer_checked() {
    let t: Arc<RangeTree<Range>> = Arc::new(RangeTree::new());
    let stop = Arc::new(AtomicBool::new(false));
    let checked = Arc::new(AtomicU64::new(0));
    let readers: Vec<_> = (0..2)
        .map(|i| {
            let (t, stop, checked) = (t.clone(), stop.clone(), checked.clone());
            std::thread::spawn(move || {
                let mut rng = XorShift::new(0x1234_5678 + i);
                while !stop.load(Ordering::Relaxed) {
                    let g = t.pin();
                    for _ in 0..64 {
                        let a = rng.next_u64() % SPACE;
                        if let Some((r, v)) = t.find(a, &g) {
                            assert!(r.contains(a), "{r:?} does not contain {a:#x}");
                            // A store may trim an entry: the value names the
                            // range it was stored for, which holds the part.
                            assert!(v.contains_range(&r), "{r:?} not within its value {v:?}");
                            checked.fetch_add(1, Ordering::Relaxed);
                        }
                        if let Some((r, v)) = t.find_after(a, &g) {
                            assert!(r.end > a && v.contains_range(&r));
                        }
                    }
                }
            })
        })
        .collect();
    let mut rng = XorShift::new(99);
    let t0 = Instant::now();
    let mut ops = 0u64;
    while t0.elapsed() < Duration::from_millis(1200) {
        let a = (rng.next_u64() % SPACE) & !0xfff;
        let len = 0x1000 * (1 + rng.next_u64() % 16);
        let r = Range::new(a, a + len);
        let mut w = t.writer();
        match rng.next_u64() % 3 {
            0 => {
                let _ = w.insert(r, r);
            }
            1 => {
                w.remove(a);
            }
            _ => {
                w.store(r, r);
            }
        }
        ops += 1;
    }
    stop.store(true, Ordering::Relaxed);
    for h in readers {
        h.join().unwrap();
    }
    t.check_invariants().unwrap();
    assert!(ops > 1000 && checked.load(Ordering::Relaxed) > 1000);
}
