//! Loom models of a soft TLB ([`aspace::Translator`]) against the flushes
//! that must invalidate it, running the real AddressSpace through
//! src/sync.rs (deferred reclamation, as in `mm/fault.rs`). Under loom the
//! asymmetric fence pair is two `SeqCst` fences, the ordering that
//! `membarrier` provides.
//!
//! `./loom.sh --test loom_translator` runs them.
#![cfg(aspace_loom)]

mod common;
use common::{cfg, fixed, model, rw, store_vs_flush, store_vs_munmap_reuse};

use aspace::{AddressSpace, FaultError, Prot, Translator, PAGE_SIZE};
use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::Arc;
use loom::thread;

const A: u64 = 0x4000_0000;
const B: u64 = 0x5000_0000;
/// A page in `A`'s summary region, for a miss inside a block.
const C: u64 = A + 2 * PAGE_SIZE;
/// A page in another summary region than `A`'s (1 GiB regions).
const D: u64 = 0x8000_0000;

/// Against munmap of A, after which A's freed frame goes to a new page at
/// B: a store that starts after munmap returned fails (the flush dropped
/// the entry), and no store lands in the frame after munmap returned (B
/// reads zero).
///
/// Catches: deleting the wait in `tlb::shoot_translators`
/// (`if !done() { wait_until(done) }`): a store whose access began before
/// the flush lands in the frame after it was freed and reused. Also
/// catches replacing its `hot.gen.fetch_add` by a load (no translator drops
/// its entries): a later store goes through the stale entry.
///
/// The targeted flush: also catches deleting the `SeqCst` fence in
/// `TranslatorSlot::publish_regions` (src/tlb/mod.rs: the flush may read
/// the empty summary while the translator's first walk reads the old
/// entry), and deleting the call `self.slot.publish_regions(..)` in
/// `Translator::cover` (src/translate/mod.rs: the summary never covers
/// the walk).
#[test]
fn translator_store_vs_munmap() {
    store_vs_munmap_reuse(cfg, A, B);
}

/// Joins `t`, reading the byte at `A` before (mprotect has returned) and
/// after: they must agree, since no store may land after mprotect
/// returned.
fn join_with_a_unchanged(mm: &AddressSpace, t: thread::JoinHandle<()>) {
    let mut before = [0u8; 1];
    mm.read(A, &mut before).unwrap();
    t.join().unwrap();
    let mut after = [0u8; 1];
    mm.read(A, &mut after).unwrap();
    assert_eq!(before, after, "a store landed after mprotect returned");
}

/// Against mprotect(PROT_READ) of A: a store that starts after mprotect
/// returned is denied, and once mprotect has returned the page never
/// changes again.
///
/// Catches: deleting the wait in `tlb::shoot_translators` (a store
/// in flight lands after mprotect returned: the two reads differ), and
/// replacing its `hot.gen.fetch_add` by a load (a later store hits the stale
/// writable entry).
#[test]
fn translator_store_vs_mprotect_read() {
    store_vs_flush(
        cfg,
        A,
        |mm| mm.mprotect(A, PAGE_SIZE, Prot::READ).unwrap(),
        FaultError::AccessDenied,
        |mm| {
            let mut before = [0u8; 1];
            mm.read(A, &mut before).unwrap();
            before
        },
        |mm, before| {
            let mut after = [0u8; 1];
            mm.read(A, &mut after).unwrap();
            assert_eq!(before, after, "a store landed after mprotect returned");
        },
    );
}

/// An instruction fetch (a translator access with the exec bit) against
/// mprotect(PROT_READ) of an r-x page: a fetch that starts after mprotect
/// returned faults with `AccessDenied` (NX), whether its entry was cached
/// before or walked after.
///
/// Catches: deleting `f |= PteFlags::NX` in `From<VmFlags> for PteFlags`
/// (vma/flags.rs): mprotect's new entry lacks NX and the fetch after it
/// succeeds. Also catches replacing `slot.hot.gen.fetch_add` in
/// `tlb::shoot_translators` by a load (the cached exec entry is used
/// after the flush; seen failing with "fetched NX" once the page was made
/// a private page of its own, which the translator caches, where the
/// zero page it mapped before never was).
#[test]
fn translator_fetch_vs_mprotect_noexec() {
    loom::model(|| {
        let mm = Arc::new(AddressSpace::new(cfg()));
        // A private page of its own (not the zero page, which a
        // translator never caches), then r-x: the fetch caches its entry.
        mm.mmap(A, PAGE_SIZE, Prot::READ | Prot::WRITE | Prot::EXEC, fixed())
            .unwrap();
        mm.write(A, &[0x90]).unwrap();
        mm.mprotect(A, PAGE_SIZE, Prot::READ | Prot::EXEC).unwrap();
        let done = Arc::new(AtomicBool::new(false));
        let (m2, d2) = (mm.clone(), done.clone());
        let t = thread::spawn(move || {
            let mut tr = m2.translator();
            let _ = tr.fetch::<u8>(A); // fills the entry (unless flushed)
            let flushed = d2.load(Ordering::SeqCst);
            let r = tr.fetch::<u8>(A);
            if flushed {
                assert_eq!(
                    r.map_err(|e| e.kind),
                    Err(FaultError::AccessDenied),
                    "fetched NX"
                );
            }
        });
        mm.mprotect(A, PAGE_SIZE, Prot::READ).unwrap();
        done.store(true, Ordering::SeqCst);
        t.join().unwrap();
    });
}

/// A flush of another region does not reach a translator: the thread's
/// translator caches `A`'s entry and stores through it twice while the
/// main thread write-protects `D` (another summary region), which
/// flushes. The second store hits (no walk): the flush neither bumped the
/// translator's generation (which would empty it) nor, therefore, waited
/// for it or issued the heavy fence, which happen only for a translator
/// it reached.
///
/// Catches: skipping the overlap check in `tlb::shoot_translators`
/// (`if Regions(slot.regions..).meets(regions)` made `if true`, the
/// untargeted flush): the bump empties the translator between its stores.
#[test]
fn translator_vs_disjoint_flush() {
    model(|| {
        let mm = Arc::new(AddressSpace::new(cfg()));
        for at in [A, D] {
            mm.mmap(at, PAGE_SIZE, rw(), fixed()).unwrap();
            mm.write(at, &[1]).unwrap();
        }
        let m2 = mm.clone();
        let t = thread::spawn(move || {
            let mut tr = m2.translator();
            tr.store::<u8>(A, 7).unwrap(); // walks, caches A
            let walks = m2.stats().translator_walks;
            tr.store::<u8>(A, 8).unwrap();
            assert_eq!(
                m2.stats().translator_walks,
                walks,
                "a flush of another region emptied the translator"
            );
        });
        mm.mprotect(D, PAGE_SIZE, Prot::READ).unwrap();
        t.join().unwrap();
        let mut x = [0u8; 1];
        mm.read(A, &mut x).unwrap();
        assert_eq!(x, [8]);
    });
}

/// A translator made (and filled) on the main thread, whose home the slot
/// therefore names, moves to another thread and stores there while the
/// main thread write-protects its page: the flush runs on the thread the
/// slot last named, so it may skip the heavy fence and the wait only if
/// the moved translator's first access published its new home (a store
/// and a `SeqCst` fence before it loads its generation). A store that
/// begins after mprotect returned is denied, and once mprotect has
/// returned the page never changes again.
///
/// Catches: deleting the `fence(SeqCst)` in `TranslatorSlot::rehome`
/// (src/tlb/mod.rs), or the call `self.slot.rehome(here)` in
/// `Translator::enter_slow` (src/translate/mod.rs): the flush reads the
/// old home, its own, skips the wait, and the moved translator's store,
/// begun before the flush through its stale writable entry, lands after
/// mprotect returned (seen failing: "a store landed after mprotect
/// returned").
#[test]
fn translator_moved_vs_own_flush() {
    model(|| {
        // A std `Arc`: what an owned translator holds.
        let mm = std::sync::Arc::new(AddressSpace::new(cfg()));
        mm.mmap(A, PAGE_SIZE, rw(), fixed()).unwrap();
        mm.write(A, &[1]).unwrap();
        let mut tr = Translator::new_owned(mm.clone());
        tr.store::<u8>(A, 2).unwrap(); // caches A writable, home: main
        let done = Arc::new(AtomicBool::new(false));
        let d2 = done.clone();
        let t = thread::spawn(move || {
            let _ = tr.store::<u8>(A, 7); // hits (unless flushed)
            let flushed = d2.load(Ordering::SeqCst);
            let r = tr.store::<u8>(A, 8);
            if flushed {
                assert_eq!(
                    r.map_err(|e| e.kind),
                    Err(FaultError::AccessDenied),
                    "a stale entry was used"
                );
            }
        });
        mm.mprotect(A, PAGE_SIZE, Prot::READ).unwrap();
        done.store(true, Ordering::SeqCst);
        join_with_a_unchanged(&mm, t);
    });
}

/// A flush of a page that two translators cache: the flushing thread's
/// own (at home there) and another thread's, loading then storing. The
/// own one needs no fence and no wait, the other both. mprotect to
/// read-only keeps the frame, so a store through the other's stale entry
/// that lands after mprotect returned shows: once mprotect has returned
/// the page never changes again. The own translator's next store, after
/// mprotect, sees the bump in program order and is denied.
///
/// Catches: the skip taken for every translator once one is at home
/// (`shoot_translators` emptying `reached` when any reached slot's `home`
/// is the flusher's thread, instead of dropping only those): the other
/// thread's store lands after mprotect returned (seen failing: "a store
/// landed after mprotect returned"). Also catches skipping the `gen` bump
/// for at-home slots (the own translator's store succeeds: "the own
/// translator used its stale entry").
#[test]
fn translator_elsewhere_vs_own_flush() {
    model(|| {
        let mm = Arc::new(AddressSpace::new(cfg()));
        mm.mmap(A, PAGE_SIZE, rw(), fixed()).unwrap();
        mm.write(A, &[1]).unwrap();
        let mut own = mm.translator();
        own.store::<u8>(A, 2).unwrap(); // caches A writable, home: main
        let m2 = mm.clone();
        let t = thread::spawn(move || {
            let mut tr = m2.translator();
            let _ = tr.load::<u8>(A); // fills the entry (unless flushed)
            let _ = tr.store::<u8>(A, 7);
        });
        mm.mprotect(A, PAGE_SIZE, Prot::READ).unwrap();
        let r = own.store::<u8>(A, 5).map_err(|e| e.kind);
        assert_eq!(
            r,
            Err(FaultError::AccessDenied),
            "the own translator used its stale entry"
        );
        join_with_a_unchanged(&mm, t);
    });
}

/// A block (`Translator::block`) against munmap of `A`, after which `A`'s
/// freed frame goes to a new page at `B`: the thread's translator caches
/// `A` writable, then opens a block that first loads `C` (a miss inside
/// the block: it leaves the section, walks, and re-enters), then stores
/// through `A`'s cached entry. A store that begins after munmap returned
/// fails, and no store lands in the frame after munmap returned (`B`
/// reads zero).
///
/// Catches: skipping the re-entry after a miss in `Block::outside`
/// (src/translate/block.rs, the `t.enter_as(..)` after `f(t)` deleted): the store after the miss hits the stale entry with
/// `busy == 0`, so munmap neither waits for it nor is obeyed by it (seen
/// failing: "a stale entry was used").
#[test]
fn block_vs_munmap() {
    model(|| {
        let mm = Arc::new(AddressSpace::new(cfg()));
        for at in [A, C] {
            mm.mmap(at, PAGE_SIZE, rw(), fixed()).unwrap();
            mm.write(at, &[1]).unwrap();
        }
        let done = Arc::new(AtomicBool::new(false));
        let (m2, d2) = (mm.clone(), done.clone());
        let t = thread::spawn(move || {
            let mut tr = m2.translator();
            let _ = tr.load::<u8>(A); // fills the entry (unless flushed)
            let mut b = tr.block();
            b.load::<u8>(C).unwrap(); // a miss: leaves and re-enters
            let flushed = d2.load(Ordering::SeqCst);
            let r = b.store::<u8>(A, 7);
            if flushed {
                assert_eq!(
                    r.map_err(|e| e.kind),
                    Err(FaultError::NoMapping),
                    "a stale entry was used"
                );
            }
        });
        mm.munmap(A, PAGE_SIZE).unwrap();
        done.store(true, Ordering::SeqCst);
        mm.mmap(B, PAGE_SIZE, rw(), fixed()).unwrap();
        mm.write(B, &[0]).unwrap(); // takes the frame `A` had
        t.join().unwrap();
        let mut x = [0xffu8; 1];
        mm.read(B, &mut x).unwrap();
        assert_eq!(x, [0], "a store landed in a freed frame");
    });
}

/// A block against mprotect(PROT_READ) of `A`: the thread's translator
/// caches `A` writable, then opens a block that stores through the entry
/// twice (both hits, no re-entry between them). A block that opens after
/// mprotect returned is denied its first store, a block open before it
/// makes mprotect wait for its end, and once mprotect has returned the
/// page never changes again.
///
/// Catches: leaving the generation check out of block entry
/// (`Translator::enter_as` skipping its `if (gen ^ self.gen) | ..`
/// branch's generation test for a block's mark, src/translate/mod.rs): a block opened
/// after mprotect stores through the stale writable entry (seen failing:
/// "a store landed after mprotect returned"; `block_vs_munmap` fails too,
/// "a stale entry was used"). Also catches deleting the wait in
/// `tlb::shoot_translators`, as `translator_store_vs_mprotect_read` does
/// for one access.
#[test]
fn block_vs_mprotect_read() {
    model(|| {
        let mm = Arc::new(AddressSpace::new(cfg()));
        mm.mmap(A, PAGE_SIZE, rw(), fixed()).unwrap();
        mm.write(A, &[1]).unwrap();
        let done = Arc::new(AtomicBool::new(false));
        let (m2, d2) = (mm.clone(), done.clone());
        let t = thread::spawn(move || {
            let mut tr = m2.translator();
            let _ = tr.load::<u8>(A); // fills the entry (unless flushed)
            let flushed = d2.load(Ordering::SeqCst);
            let mut b = tr.block();
            let r = b.store::<u8>(A, 7);
            let _ = b.store::<u8>(A, 8);
            if flushed {
                assert_eq!(
                    r.map_err(|e| e.kind),
                    Err(FaultError::AccessDenied),
                    "a stale entry was used"
                );
            }
        });
        mm.mprotect(A, PAGE_SIZE, Prot::READ).unwrap();
        done.store(true, Ordering::SeqCst);
        join_with_a_unchanged(&mm, t);
    });
}
