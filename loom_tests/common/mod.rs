//! Helpers the loom model files share: the model runner (the bound and
//! branch limit come from the environment, which `loom.sh` sets; no model
//! pins its own), the small address-space configuration the models use,
//! and races more than one file runs.
#![allow(dead_code)]

use aspace::{
    loom_door, Access, AddressSpace, Advice, Config, Error, FaultError, FaultLocking, MapFlags,
    Prot, PAGE_SIZE,
};
use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::Arc;
use loom::thread;

/// The reverse-map check (`rmap::check_rmap`), shared with `tests/stress_spec.rs`.
#[path = "../../tests/common/rmap.rs"]
pub mod rmap;

/// Runs `f` under loom at the bound `loom.sh` sets.
pub fn model(f: impl Fn() + Sync + Send + 'static) {
    loom::model::Builder::new().check(f);
}

/// A space with a small budget whose reclamation is deferred to its drop,
/// so the epoch's internals stay out of the models' state space.
///
/// Faults take the per-VMA path (the fallback of the default speculative
/// one): these models check the per-VMA and mmap_lock protocols, and a
/// speculative attempt before each fault would multiply the interleavings
/// to explore; `spec_fault.rs` and `spec_writers.rs` model the
/// speculative path itself.
pub fn cfg() -> Config {
    Config {
        deferred_reclaim: true,
        memory_budget: 64 * PAGE_SIZE,
        fault_locking: FaultLocking::PerVma,
        ..Config::default()
    }
}

/// [`cfg`] with the speculative fault on: the space the models of that
/// path (`spec_fault.rs`, `spec_writers.rs`) race writers in.
pub fn spec_space() -> Arc<AddressSpace> {
    Arc::new(AddressSpace::new(Config {
        fault_locking: FaultLocking::Speculative,
        ..cfg()
    }))
}

/// Private anonymous memory at a fixed address.
pub fn fixed() -> MapFlags {
    MapFlags::PRIVATE | MapFlags::ANONYMOUS | MapFlags::FIXED
}

/// Read and write.
pub fn rw() -> Prot {
    Prot::READ | Prot::WRITE
}

/// A store of 2 at `a` (a writable page) races mprotect of the
/// page to read-only: no store may land after mprotect returns, and a
/// store that failed failed with EFAULT.
pub fn store_vs_mprotect_read(mm: Arc<AddressSpace>, a: u64) {
    let m2 = mm.clone();
    let t = thread::spawn(move || m2.write(a, &[2]));
    mm.mprotect(a, PAGE_SIZE, Prot::READ).unwrap();
    let (mut before, mut after) = ([0u8; 1], [0u8; 1]);
    mm.read(a, &mut before).unwrap();
    let r = t.join().unwrap();
    mm.read(a, &mut after).unwrap();
    assert_eq!(before, after, "a store landed after mprotect returned");
    match r {
        Ok(()) => assert_eq!(after, [2]),
        Err(e) => assert_eq!(e.errno(), Error::Fault.errno(), "{e:?}"),
    }
}

/// Writes the page at `a` once (its VMA gets an anon_vma, an object its
/// page), empties its entry again, and maps and touches a read-only
/// neighbour two pages up that keeps the page tables: a race on `a` then
/// makes and frees no table.
pub fn emptied_with_neighbour(mm: &AddressSpace, a: u64) {
    mm.write(a, &[1]).unwrap();
    mm.madvise(a, PAGE_SIZE, Advice::DontNeed).unwrap();
    mm.mmap(a + 2 * PAGE_SIZE, PAGE_SIZE, Prot::READ, fixed())
        .unwrap();
    mm.fault(a + 2 * PAGE_SIZE, Access::Read).unwrap();
}

/// A space where small VMAs share one PTE table: `[a, a + 2 pages)` (`a`
/// 2 MiB-aligned), its anon_vma made and its entry emptied again (the
/// table stays), and past a one-page hole `[a + 3 pages, a + 4 pages)`:
/// a table with no entry, whose span holds two VMAs and holes.
pub fn shared_table_space(a: u64) -> Arc<AddressSpace> {
    let mm = spec_space();
    mm.mmap(a, 2 * PAGE_SIZE, rw(), fixed()).unwrap();
    mm.write(a + PAGE_SIZE, &[1]).unwrap();
    mm.madvise(a + PAGE_SIZE, PAGE_SIZE, Advice::DontNeed)
        .unwrap();
    mm.mmap(a + 3 * PAGE_SIZE, PAGE_SIZE, rw(), fixed())
        .unwrap();
    mm
}

/// UFFDIO_REGISTER(MISSING) of `[a, a + len)` races one speculative write
/// attempt at `a` (alone, `loom_door::speculative_fault`). Once
/// `register` has returned, a page missing then stays missing for the
/// handler: its `UFFDIO_COPY` succeeds; and every entry agrees with the
/// VMAs.
pub fn spec_vs_uffd_register(mm: Arc<AddressSpace>, a: u64, len: u64) {
    let uffd = mm.userfaultfd();
    let m2 = mm.clone();
    let t = thread::spawn(move || loom_door::speculative_fault(&m2, a, Access::Write));
    uffd.register(a, len).unwrap();
    let missing = mm.translate(a).is_none();
    let copied = uffd.copy(&[7; PAGE_SIZE as usize], a, false);
    t.join().unwrap();
    if missing {
        assert!(copied.is_ok(), "a page appeared after register: {copied:?}");
    }
    loom_door::check_ptes(&mm).unwrap();
    drop(uffd);
}

/// A translator against a flush (`translator.rs`, `range_writers.rs`): in
/// a space made with `config`, a thread's translator caches `a`'s writable
/// entry, then stores 7 through it, while the main thread runs `flush`.
/// The translator is new, so its first walk also grows its summary (from
/// empty to `a`'s region): the race of that growth, its fence and the
/// walk against the flush's page-table change, fence and summary load
/// (the targeted flush, src/tlb/mod.rs) is part of every run.
/// A store that begins after `flush` returned must fail with `denied`.
/// Then the main thread runs `after` (whose result is a snapshot), joins
/// the translator's thread and hands the snapshot to `check`.
pub fn store_vs_flush<S: 'static>(
    config: fn() -> Config,
    a: u64,
    flush: impl Fn(&AddressSpace) + Send + Sync + 'static,
    denied: FaultError,
    after: impl Fn(&AddressSpace) -> S + Send + Sync + 'static,
    check: impl Fn(&AddressSpace, S) + Send + Sync + 'static,
) {
    loom::model(move || {
        let mm = Arc::new(AddressSpace::new(config()));
        mm.mmap(a, PAGE_SIZE, rw(), fixed()).unwrap();
        mm.write(a, &[1]).unwrap();
        let done = Arc::new(AtomicBool::new(false));
        let (m2, d2) = (mm.clone(), done.clone());
        let t = thread::spawn(move || {
            let mut tr = m2.translator();
            let _ = tr.load::<u8>(a); // fills the entry (unless flushed)
            let flushed = d2.load(Ordering::SeqCst);
            let r = tr.store::<u8>(a, 7);
            if flushed {
                assert_eq!(r.map_err(|e| e.kind), Err(denied), "a stale entry was used");
            }
        });
        flush(&mm);
        done.store(true, Ordering::SeqCst);
        let snap = after(&mm);
        t.join().unwrap();
        check(&mm, snap);
    });
}

/// [`store_vs_flush`] with munmap of `a` as the flush: a store that begins
/// after munmap returned fails with `NoMapping`, and once the frame `a`
/// had is reused by a write at `b`, no store lands in it
/// (`translator.rs`, and `range_writers.rs` with a range-locked munmap).
pub fn store_vs_munmap_reuse(config: fn() -> Config, a: u64, b: u64) {
    store_vs_flush(
        config,
        a,
        move |mm| mm.munmap(a, PAGE_SIZE).unwrap(),
        FaultError::NoMapping,
        move |mm| {
            mm.mmap(b, PAGE_SIZE, rw(), fixed()).unwrap();
            mm.write(b, &[0]).unwrap(); // takes the frame `a` had
        },
        move |mm, ()| {
            let mut x = [0xffu8; 1];
            mm.read(b, &mut x).unwrap();
            assert_eq!(x, [0], "a store landed in a freed frame");
        },
    );
}
