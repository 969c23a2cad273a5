//! Loom models of the speculative fault (`FaultLocking::Speculative`)
//! against the writers it must not outrun, running the real AddressSpace
//! through src/sync.rs.
//!
//! Each model maps one 2 MiB-aligned, 2 MiB VMA (so its PTE table's span
//! lies inside it and the speculative path may install) and writes the
//! page after the faulting one first, so the PTE table and the anon_vma
//! exist before the threads start: the fault then takes the speculative
//! path to its install. Each names the one-line mutation it catches
//! (checked by breaking that line, running the model, restoring it).
#![cfg(aspace_loom)]

use aspace::{
    Access, AddressSpace, Config, FaultError, FaultLocking, MapFlags, MremapFlags, Prot, PAGE_SIZE,
};
use loom::sync::Arc;
use loom::thread;

/// 2 MiB-aligned addresses.
const A: u64 = 0x4000_0000;
const B: u64 = 0x5000_0000;
const PMD: u64 = 1 << 21;

/// At the bound loom.sh sets (LOOM_MAX_PREEMPTIONS).
fn model(f: impl Fn() + Sync + Send + 'static) {
    loom::model::Builder::new().check(f);
}

fn fixed() -> MapFlags {
    MapFlags::PRIVATE | MapFlags::ANONYMOUS | MapFlags::FIXED
}

fn rw() -> Prot {
    Prot::READ | Prot::WRITE
}

/// An address space with the VMA `[A, A + 2 MiB)`, its anon_vma and PTE
/// table in place (page `A + PAGE_SIZE` written).
fn setup() -> Arc<AddressSpace> {
    let mm = Arc::new(AddressSpace::new(Config {
        deferred_reclaim: true,
        fault_locking: FaultLocking::Speculative,
        memory_budget: 64 * PAGE_SIZE,
        ..Config::default()
    }));
    mm.mmap(A, PMD, rw(), fixed()).unwrap();
    mm.write(A + PAGE_SIZE, &[0x11]).unwrap();
    mm
}

fn spawn_fault(mm: &Arc<AddressSpace>, addr: u64) -> thread::JoinHandle<Result<(), FaultError>> {
    let m2 = mm.clone();
    thread::spawn(move || m2.fault(addr, Access::Write))
}

/// munmap of the faulting page (the VMA's start moves: a split at the
/// page boundary) races the fault. Either the fault installs first and the
/// munmap's zap frees the frame, or the fault sees the stamp and falls back
/// (then reports no mapping). Catches: `v.lock.stamp() == stamp` in
/// `spec_fault::handle`'s validation replaced by `true` (an install after
/// the zap leaks a frame behind an unmapped page).
#[test]
fn spec_fault_vs_munmap() {
    model(|| {
        let mm = setup();
        let t = spawn_fault(&mm, A);
        mm.munmap(A, PAGE_SIZE).unwrap();
        let r = t.join().unwrap();
        assert!(matches!(r, Ok(()) | Err(FaultError::NoMapping)), "{r:?}");
        assert_eq!(mm.translate(A), None, "no page behind the unmapped address");
        assert_eq!(mm.frames_used(), 1, "only the neighbour's frame");
    });
}

/// mprotect(PROT_READ) of the faulting page races a write fault. Whatever
/// the order, no writable entry remains behind a read-only VMA: a write
/// after both must fail. Catches: in `PageTable::install_checked`, running
/// `valid()` before taking the table's lock instead of after (the fault
/// validates, mprotect stamps and passes the table, the fault installs a
/// writable entry).
#[test]
fn spec_fault_vs_mprotect_read() {
    model(|| {
        let mm = setup();
        let t = spawn_fault(&mm, A);
        mm.mprotect(A, PAGE_SIZE, Prot::READ).unwrap();
        let r = t.join().unwrap();
        assert!(matches!(r, Ok(()) | Err(FaultError::AccessDenied)), "{r:?}");
        assert!(mm.write(A, &[1]).is_err(), "a writable entry survived");
        let mut x = [0u8; 1];
        mm.read(A, &mut x).unwrap();
        assert_eq!(x, [0]);
    });
}

/// mremap moves the whole VMA (its PTE table is relinked under the new
/// address) while the fault runs at the old address. The fault's page is
/// at the new address only if the fault reports success; a fault that
/// walked to the table through its old PMD entry and locks it after the
/// relink must see the stamp. Catches: in `PageTable::relink_pte_table`,
/// dropping the table's lock (`let _l = table.lock.lock();` removed), so
/// the fault's lock no longer orders it after mremap's stamp.
#[test]
fn spec_fault_vs_mremap() {
    model(|| {
        let mm = setup();
        let t = spawn_fault(&mm, A);
        let flags = MremapFlags::MAYMOVE | MremapFlags::FIXED;
        assert_eq!(mm.mremap(A, PMD, PMD, flags, B), Ok(B));
        let r = t.join().unwrap();
        assert!(matches!(r, Ok(()) | Err(FaultError::NoMapping)), "{r:?}");
        assert_eq!(mm.translate(A), None);
        let mut x = [0u8; 1];
        mm.read(B + PAGE_SIZE, &mut x).unwrap();
        assert_eq!(x, [0x11], "the neighbour moved");
        assert_eq!(
            mm.frames_used(),
            1 + u64::from(r.is_ok()),
            "a page appears at the new address only for a fault that succeeded"
        );
    });
}

/// A split that removes the faulting page from the VMA's end (munmap of
/// the last page: the VMA keeps its object and its end moves) races the
/// fault there. Catches: the stamp in `Edit::split`-style end moves not
/// taken before the change, i.e. `self.lock(v)` removed from
/// `Edit::set_range`'s callers is too broad; the checked line is the
/// validation's `v.lock.stamp() == stamp`, as for munmap, plus the span
/// check: `span < range.start || range.end - span < PMD_SIZE` replaced by
/// `false` (the snapshot then is of a VMA that no longer covers the whole
/// table, which the stamp still catches: this model passes with only that
/// mutation, so it is not claimed).
#[test]
fn spec_fault_vs_split() {
    model(|| {
        let mm = setup();
        let last = A + PMD - PAGE_SIZE;
        let t = spawn_fault(&mm, last);
        mm.munmap(last, PAGE_SIZE).unwrap();
        let r = t.join().unwrap();
        assert!(matches!(r, Ok(()) | Err(FaultError::NoMapping)), "{r:?}");
        assert_eq!(mm.translate(last), None);
        assert_eq!(mm.frames_used(), 1);
    });
}

/// The VMA object is recycled at once for the same range: mremap moves the
/// VMA away (detaching the object) and mmap maps a fresh VMA at the old
/// address from the type-stable cache. A fault that found the old object
/// must not install into the new VMA from its stale snapshot, nor into the
/// moved range. Catches: `!v.lock.is_attached()` dropped from the
/// snapshot check in `spec_fault::handle`.
#[test]
fn spec_fault_vs_vma_reuse() {
    model(|| {
        let mm = setup();
        let t = spawn_fault(&mm, A);
        let flags = MremapFlags::MAYMOVE | MremapFlags::FIXED;
        assert_eq!(mm.mremap(A, PMD, PMD, flags, B), Ok(B));
        mm.mmap(A, PMD, rw(), fixed()).unwrap();
        let r = t.join().unwrap();
        assert!(matches!(r, Ok(()) | Err(FaultError::NoMapping)), "{r:?}");
        assert!(mm.stats().vma_reused >= 1, "the object was recycled");
        // The fault either ran in the old VMA (its page moved to B) or in
        // the new one (its page is at A), never both, never neither.
        let at_a = mm.translate(A).is_some();
        let at_b = mm.translate(B).is_some();
        assert!(!(at_a && at_b), "one fault, two pages");
        assert_eq!(r.is_ok(), at_a || at_b, "{r:?} a={at_a} b={at_b}");
        assert_eq!(mm.frames_used(), 1 + u64::from(at_a || at_b));
    });
}
