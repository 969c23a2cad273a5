//! Loom model of the VMA pool's per-CPU caches (`src/vma/pool.rs`): a CPU
//! slot's cache is shared by the threads of its CPU and by threads that
//! moved off it mid-operation, and batches cross between it and the
//! global list, each under one lock at a time. Runs the real code through
//! src/sync.rs (under loom a cache keeps 2 objects and batches are 2, so
//! spills, refills and steals happen in a few steps). `./loom.sh --test
//! loom_pool` runs it.
#![cfg(aspace_loom)]

mod common;
use common::model;

use aspace::loom_door::{VmaObj, VmaPool};
use loom::sync::Arc;
use loom::thread;

/// Two threads share CPU slot 0, each taking two objects and giving one
/// back, one of them through slot 1 (it moved): from a pool whose slot 0
/// holds one free object and whose global list holds two (a spill), so
/// the threads race for the slot's object, for the refill from the global
/// list, and (once both are empty) to steal from the other slot or make
/// an object. Whatever the order, the two objects the threads keep are
/// distinct, and every other object made is free exactly once.
///
/// Mutation caught: in `CpuCache::pop` (src/vma/pool.rs), read the newest
/// object under one lock section and pop it under another
/// (`let v = self.free.lock().last().copied(); if v.is_some() {
/// self.free.lock().pop(); }`), as if the slot were the thread's own: both
/// threads take the slot's one object, and it is freed twice.
#[test]
fn pool_threads_share_a_cpu_cache() {
    model(|| {
        let p = Arc::new(VmaPool::new());
        let objs: Vec<VmaObj> = (0..3).map(|_| p.alloc_on(0).0).collect();
        for &v in &objs {
            p.free_on(0, v);
        }
        assert_eq!(p.allocated(), 3);
        p.check(&[]).unwrap();
        let run = |p: Arc<VmaPool>, free_cpu: usize| {
            let (a, _) = p.alloc_on(0);
            let (b, _) = p.alloc_on(0);
            p.free_on(free_cpu, a);
            b
        };
        let p2 = p.clone();
        let t = thread::spawn(move || run(p2, 1));
        let mine = run(p.clone(), 0);
        let theirs = t.join().unwrap();
        assert_ne!(mine, theirs, "one object held by both threads");
        p.check(&[mine, theirs]).unwrap();
    });
}
