//! Loom models of the fault path against mmap_lock writers, running the
//! real AddressSpace through src/sync.rs (deferred reclamation, so the
//! models explore the lock protocol rather than epoch internals).
//!
//! `./loom.sh fault` runs them. They drive the whole stack (tree, VMA
//! locks, page table, frames, TLB gather), so they run with a preemption
//! bound of 1 (about a minute on 2 cores); the lock-level models in
//! `vma_lock.rs` explore deeper.
#![cfg(aspace_loom)]

use aspace::{Access, AddressSpace, Config, Error, FaultError, MapFlags, Prot, PAGE_SIZE};
use loom::sync::Arc;
use loom::thread;

/// Preemption bound 1 keeps CI short. Bound 2 once exposed a livelock
/// inside loom: loom 0.7.3's own `RwLock`, when a writer acquires it,
/// blocks every thread with a pending operation on the lock, a `try_read`
/// included, so a fault holding its VMA read lock inside
/// `anon_vma_prepare`'s mmap_lock `try_read` waited for munmap, which
/// waited for that VMA's readers. A real `try_read` never blocks;
/// `sync.rs` now models the lock with an atomic whose `try_read` is one
/// compare-and-swap, and `fault_vs_munmap_same_page` passes at bound 2.
fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(1);
    b.max_branches = 20_000;
    b.check(f);
}

const A: u64 = 0x4000_0000;
const B: u64 = 0x5000_0000;

fn cfg() -> Config {
    Config {
        deferred_reclaim: true,
        memory_budget: 64 * PAGE_SIZE,
        ..Config::default()
    }
}

fn fixed() -> MapFlags {
    MapFlags::PRIVATE | MapFlags::ANONYMOUS | MapFlags::FIXED
}

fn rw() -> Prot {
    Prot::READ | Prot::WRITE
}

/// Model 3: a lock-free lookup races with munmap of its VMA and the
/// immediate reuse of the VMA object for another range. The fault either
/// completes in the old VMA before the munmap (which then frees the frame)
/// or reports no mapping; it never installs a page for an address its VMA
/// no longer covers, and never touches the new VMA.
#[test]
fn lookup_vs_detach_and_reuse() {
    model(|| {
        let mm = Arc::new(AddressSpace::new(cfg()));
        mm.mmap(A, PAGE_SIZE, rw(), fixed()).unwrap();
        let m2 = mm.clone();
        let t = thread::spawn(move || m2.fault(A, Access::Write));
        mm.munmap(A, PAGE_SIZE).unwrap();
        mm.mmap(B, PAGE_SIZE, rw(), fixed()).unwrap();
        let r = t.join().unwrap();
        assert!(matches!(r, Ok(()) | Err(FaultError::NoMapping)), "{r:?}");
        assert!(mm.stats().vma_reused >= 1, "the object was recycled");
        let mut x = [0u8; 1];
        assert_eq!(
            mm.read(A, &mut x).map_err(|e| e.errno()),
            Err(Error::Fault.errno())
        );
        assert_eq!(
            mm.frames_used(),
            0,
            "no frame behind the unmapped page or the new VMA"
        );
    });
}

/// Model 4: a store through the fault path races with munmap of the same
/// page. Either the store lands first and the munmap frees its frame, or
/// the store fails with EFAULT; no frame leaks, and the next mapping at the
/// address reads zero (the old frame's data is never seen again).
#[test]
fn fault_vs_munmap_same_page() {
    model(|| {
        let mm = Arc::new(AddressSpace::new(cfg()));
        mm.mmap(A, PAGE_SIZE, rw(), fixed()).unwrap();
        let m2 = mm.clone();
        let t = thread::spawn(move || m2.write(A, &[0x5a]));
        mm.munmap(A, PAGE_SIZE).unwrap();
        let r = t.join().unwrap();
        assert!(
            matches!(r.map_err(|e| e.errno()), Ok(()) | Err(14)),
            "{r:?}"
        );
        assert_eq!(mm.frames_used(), 0, "the frame was freed");
        mm.mmap(A, PAGE_SIZE, rw(), fixed()).unwrap();
        let mut x = [0xffu8; 1];
        mm.read(A, &mut x).unwrap();
        assert_eq!(x, [0], "a new mapping never shows the old frame");
    });
}
