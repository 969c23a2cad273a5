//! The AIM7-like brk workload shared by `examples/aim7brk.rs` and
//! `benches/brk.rs`: a parent with a written heap forks K children; each
//! child, driven by its own thread, repeats a job — grow the heap with brk,
//! touch every new page, shrink it back — for a fixed time or job count.
//! All children's heaps are chained to the parent's anon_vma, so they share
//! one anon_vma root and its lock (AIM7's forked tasks on one root).
#![allow(dead_code)]

use aspace::{AddressSpace, Config};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

const PAGE: u64 = 4096;

/// One run's settings.
#[derive(Clone, Debug)]
pub struct Params {
    /// Forked children (one thread each).
    pub children: usize,
    /// `Config::brk_fast_path`.
    pub fast_path: bool,
    /// Pages each job grows the heap by (and touches).
    pub grow_pages: u64,
    /// Pages of heap the parent writes before forking (the children share
    /// them copy-on-write).
    pub heap_pages: u64,
    /// Stop after this long...
    pub duration: Option<Duration>,
    /// ...or after this many jobs per child.
    pub jobs_per_child: Option<u64>,
}

/// What a run measured.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sample {
    /// Jobs completed by all children.
    pub jobs: u64,
    /// Wall time of the measured part (children running).
    pub elapsed: Duration,
    /// anon_vma lock acquisitions during it (all children).
    pub lock: u64,
    /// Of those, contended.
    pub contended: u64,
}

impl Sample {
    /// Jobs per minute.
    pub fn jobs_per_min(&self) -> f64 {
        self.jobs as f64 * 60.0 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// One job: grow by `grow` pages, touch them, shrink back.
fn job(mm: &AddressSpace, top: u64, grow: u64, tag: u8) {
    let new_top = top + grow * PAGE;
    let got = mm.brk(new_top).unwrap();
    assert_eq!(got, new_top, "brk grow failed");
    for p in 0..grow {
        mm.write(top + p * PAGE, &[tag; 8]).unwrap();
    }
    let got = mm.brk(top).unwrap();
    assert_eq!(got, top, "brk shrink failed");
}

/// Runs the workload once.
pub fn run(p: &Params) -> Sample {
    let cfg = Config {
        brk_fast_path: p.fast_path,
        ..Config::default()
    };
    let parent = AddressSpace::new(cfg);
    parent.prefault_frames((p.heap_pages + (p.children as u64 + 1) * (p.grow_pages + 8)) * PAGE);
    let base = parent.brk(0).unwrap();
    let top = base + p.heap_pages * PAGE;
    parent.brk(top).unwrap();
    for i in 0..p.heap_pages {
        parent.write(base + i * PAGE, &[1; 8]).unwrap();
    }
    let children: Vec<Arc<AddressSpace>> = (0..p.children)
        .map(|_| Arc::new(parent.fork().unwrap()))
        .collect();
    // Each child has written its own part of the heap once (as a real
    // task would), so its heap VMA is settled before measuring.
    for c in &children {
        c.write(base, &[2; 8]).unwrap();
    }
    let before: Vec<_> = children.iter().map(|c| c.stats()).collect();
    let start_line = Arc::new(Barrier::new(p.children + 1));
    let stop = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = children
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let (c, start_line, stop) = (c.clone(), start_line.clone(), stop.clone());
            let (grow, limit) = (p.grow_pages, p.jobs_per_child);
            std::thread::spawn(move || {
                start_line.wait();
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) && limit.is_none_or(|l| n < l) {
                    job(&c, top, grow, i as u8);
                    n += 1;
                }
                n
            })
        })
        .collect();
    start_line.wait();
    let t0 = Instant::now();
    if let Some(d) = p.duration {
        std::thread::sleep(d);
        stop.store(true, Ordering::Relaxed);
    }
    let jobs: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    let elapsed = t0.elapsed();
    let mut s = Sample {
        jobs,
        elapsed,
        ..Sample::default()
    };
    for (c, b) in children.iter().zip(&before) {
        let a = c.stats();
        s.lock += a.anon_vma_lock - b.anon_vma_lock;
        s.contended += a.anon_vma_lock_contended - b.anon_vma_lock_contended;
    }
    s
}
