//! Loom models of transparent huge pages: splitting a PMD leaf is a
//! writer (src/pt/huge.rs), met by lock-free walks, by a zap of the
//! whole leaf, and by a second split from another fault; and a
//! write-protect fault on a leaf, handed to a handler whole, met by the
//! handler's un-protection of the leaf. Runs the real
//! page table and address space through src/sync.rs; `./loom.sh thp`
//! runs them at the bound it sets.
//!
//! The loom frame pool is too small for a huge frame (64 pages), so the
//! address-space models use the huge zero page (a read fault in a
//! `MADV_HUGEPAGE` span), and a write into it, which finds no huge frame,
//! splits it and copies 4 KiB, as a write to a shared huge page does.
#![cfg(aspace_loom)]

mod common;
use common::{cfg, fixed, model, rw};

use aspace::loom_door::{PageTable, Pte, PteFlags};
use aspace::reclaim::Reclaimer;
use aspace::{AddressSpace, Advice, Pfn, Range, PAGE_SIZE};
use loom::sync::Arc;
use loom::thread;

const HUGE: u64 = 2 << 20;
/// A 2 MiB-aligned address.
const VA: u64 = 0x7f12_3440_0000;
const A: u64 = 0x4000_0000;

/// A page table with a PMD leaf at `VA` over frames 512..1024 (numbers
/// only: the page table never touches the frames).
fn with_leaf() -> Arc<PageTable> {
    let pt = Arc::new(PageTable::new(Reclaimer::deferred()));
    {
        let g = pt.pin();
        let leaf = Pte::new(
            Pfn::new(512),
            PteFlags::USER | PteFlags::WRITE | PteFlags::HUGE,
        );
        pt.install_huge(VA, leaf, &g, || true).unwrap();
    }
    pt
}

/// A lock-free lookup inside a leaf races its split: it reads the leaf
/// or the new table, and either translates the page to the same frame
/// with the same rights.
///
/// Mutation caught: in `PageTable::link_split` (src/pt/huge.rs), the
/// store that links the filled table with `Ordering::Relaxed` instead of
/// `Release`: the walker reaches the table with its entries' stores not
/// ordered before its loads (loom reports the causality violation).
#[test]
fn lookup_vs_split() {
    model(|| {
        let pt = with_leaf();
        let p2 = pt.clone();
        let t = thread::spawn(move || {
            let g = p2.pin();
            p2.lookup(VA + 3 * PAGE_SIZE, &g)
        });
        {
            let g = pt.pin();
            assert!(pt.split_huge(VA + 5 * PAGE_SIZE, &g));
        }
        let seen = t.join().unwrap();
        assert_eq!(
            seen,
            Pte::new(Pfn::new(515), PteFlags::USER | PteFlags::WRITE)
        );
        let g = pt.pin();
        assert_eq!(pt.huge_at(VA, &g), None);
        assert_eq!(pt.lookup(VA + 3 * PAGE_SIZE, &g), seen);
    });
}

/// A split (a 4 KiB change of a huge page: a fault under the VMA lock,
/// or `update`) races a zap of the whole leaf (MADV_DONTNEED under the
/// mmap_lock read side): either the zap takes the leaf whole, or it
/// zaps the split table's 512 entries; nothing stays mapped and every
/// page's reference is released once.
///
/// Mutation caught: deleting the re-check `if !is_leaf(v)` in
/// `PageTable::lock_leaf` (src/pt/huge.rs): a split that read the leaf
/// before the zap links a table of it after, and the zapped pages are
/// mapped again.
#[test]
fn split_vs_zap_of_the_leaf() {
    model(|| {
        let pt = with_leaf();
        let p2 = pt.clone();
        let t = thread::spawn(move || {
            let g = p2.pin();
            p2.split_huge(VA + 7 * PAGE_SIZE, &g);
        });
        let (mut pages, mut leaves) = (0, 0);
        {
            let g = pt.pin();
            pt.zap_range_huge(
                Range::new(VA, VA + HUGE),
                &g,
                |_, f| {
                    assert!(f.is_some());
                    pages += 1;
                },
                |_, _| leaves += 1,
            );
        }
        t.join().unwrap();
        assert_eq!(pages + 512 * leaves, 512, "each page released once");
        let g = pt.pin();
        for p in [0, 7, 511] {
            assert_eq!(pt.lookup(VA + p * PAGE_SIZE, &g), Pte::NONE);
        }
    });
}

/// A space whose `[A, A + 2 MiB)` is one `MADV_HUGEPAGE` VMA mapped by
/// the huge zero page (a read fault).
fn zero_huge_space() -> Arc<AddressSpace> {
    let mm = Arc::new(AddressSpace::new(cfg()));
    mm.mmap(A, HUGE, rw(), fixed()).unwrap();
    mm.madvise(A, HUGE, Advice::HugePage).unwrap();
    mm.read(A, &mut [0]).unwrap();
    assert_eq!(mm.stats().thp_zero_page_mapped, 1);
    mm
}

/// Two write faults on two pages of one huge zero page race: each splits
/// it if it is still a leaf (no huge frame is free) and copies its page;
/// one split wins, and both writes are there after.
///
/// Mutation caught: as `split_vs_zap_of_the_leaf`, deleting the re-check
/// in `PageTable::lock_leaf`: the second split takes the first's table
/// for a leaf and maps frames that do not exist (the model panics).
#[test]
fn two_write_faults_split_one_leaf() {
    model(|| {
        let mm = zero_huge_space();
        let m2 = mm.clone();
        let t = thread::spawn(move || m2.write(A + PAGE_SIZE, &[1]).unwrap());
        mm.write(A + 2 * PAGE_SIZE, &[2]).unwrap();
        t.join().unwrap();
        let mut b = [0u8; 1];
        mm.read(A + PAGE_SIZE, &mut b).unwrap();
        assert_eq!(b, [1]);
        mm.read(A + 2 * PAGE_SIZE, &mut b).unwrap();
        assert_eq!(b, [2]);
        assert_eq!(mm.stats().thp_split_pmd, 1);
    });
}

/// A translator's load from the huge zero page races a write fault that
/// splits it (and copies another page): the load reads zero through the
/// leaf, the split table or a fresh walk, never an empty entry (which
/// would fault again) or another page.
///
/// (Translators' 2 MiB entries are not seen here: loom's small chunks
/// make no contiguous huge frame, and the huge zero page is never
/// cached. They add no protocol: dropped with the 4 KiB entries at each
/// flush; `tests/thp.rs`'s `a_translator_caches_a_huge_page_as_one_entry`
/// fails when `drop_entries` keeps them.)
///
/// Mutation caught: `link_split`'s `Release` made `Relaxed`, as in
/// `lookup_vs_split`: the translator's walk reads the new table's
/// entries unordered with their stores (loom reports the causality
/// violation; a reader that got an empty entry would fault again, which
/// the fault count forbids).
#[test]
fn translator_load_vs_split() {
    model(|| {
        let mm = zero_huge_space();
        let m2 = mm.clone();
        let t = thread::spawn(move || {
            let mut tr = m2.translator();
            tr.load::<u8>(A + 3 * PAGE_SIZE).unwrap()
        });
        let before = mm.stats().faults();
        mm.write(A + PAGE_SIZE, &[1]).unwrap();
        assert_eq!(t.join().unwrap(), 0);
        // Only the write faulted: the load found its page mapped.
        assert_eq!(mm.stats().faults() - before, 1);
    });
}

/// A write fault on a huge page write-protected whole for a handler
/// (here the huge zero page, protected after its read fault) races the
/// handler's un-protection of the whole 2 MiB with a wake, which may come
/// before the fault has queued: the fault is handed over with the leaf
/// whole (`mm/fault.rs`), and its waiter looks at the leaf again after
/// queuing (`uffd::Waiter::wait`), so it never sleeps past the
/// resolution; the write then lands.
///
/// Mutation caught: `Waiter::wait` sleeping without its second look
/// (`needed` forced true in src/uffd/fault.rs): an un-protection and wake
/// between the fault's look at the leaf and its queuing wake nobody, and
/// the fault sleeps forever (loom reports the deadlock).
#[test]
fn wp_fault_on_a_leaf_vs_unprotect() {
    use aspace::uffd::RegisterMode;
    model(|| {
        let mm = zero_huge_space();
        let uffd = mm.userfaultfd();
        uffd.register_with_mode(A, HUGE, RegisterMode::WRITE_PROTECT)
            .unwrap();
        uffd.write_protect(A, HUGE).unwrap();
        let m2 = mm.clone();
        let t = thread::spawn(move || m2.write(A + PAGE_SIZE, &[1]).unwrap());
        uffd.remove_write_protection(A, HUGE, true).unwrap();
        t.join().unwrap();
        let mut b = [0u8; 1];
        mm.read(A + PAGE_SIZE, &mut b).unwrap();
        assert_eq!(b, [1]);
        drop(uffd);
    });
}
