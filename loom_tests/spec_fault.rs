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
//!
//! The munmap and mremap models race a read fault (it installs the zero
//! page): a write fault's frame allocation and release (the frame cache's
//! lock, which under loom every thread shares, and the frame's refcount)
//! kept the munmap model unfinished after 150 s at bound 2 (the read
//! fault's finishes in seconds), while the install they check is the same
//! entry store under the same PTE lock. A stale zero-page entry is seen
//! through the PTE table it keeps alive (`page_table_bytes`).
//!
//! The VMA-reuse model races the speculative attempt alone, without its
//! fallbacks, in a one-page VMA beside a neighbour that keeps its PTE
//! table (see there why).
#![cfg(aspace_loom)]

mod common;
use common::{fixed, model, rw};

use aspace::{loom_door, Access, AddressSpace, Error, FaultError, MremapFlags, Prot, PAGE_SIZE};
use loom::sync::Arc;
use loom::thread;

/// A 2 MiB-aligned address (its upper tables cover `B` too).
const A: u64 = 0x4000_0000;
const PMD: u64 = 1 << 21;
/// A page-aligned address that is not 2 MiB-aligned, in `A`'s 1 GiB.
const B: u64 = 0x5000_1000;

use common::spec_space as space;

/// An address space with the VMA `[A, A + 2 MiB)`, its anon_vma and PTE
/// table in place (page `A + PAGE_SIZE` written).
fn setup() -> Arc<AddressSpace> {
    let mm = space();
    mm.mmap(A, PMD, rw(), fixed()).unwrap();
    mm.write(A + PAGE_SIZE, &[0x11]).unwrap();
    mm
}

fn spawn_fault(
    mm: &Arc<AddressSpace>,
    addr: u64,
    access: Access,
) -> thread::JoinHandle<Result<(), FaultError>> {
    let m2 = mm.clone();
    thread::spawn(move || m2.fault(addr, access))
}

/// mprotect(PROT_READ) of the page races a store to it (a speculative
/// write fault, then the store through the new entry). Once mprotect has
/// returned no store may land: the page reads the same before and after
/// the storing thread is joined, and the store either landed before (and
/// is seen) or failed with EFAULT; unmapped, the page leaves no frame
/// behind. Catches: `mm.frames.put(new.pfn())` dropped from the abort path
/// of `spec_fault::handle` (an attempt that sees mprotect's stamp under the
/// PTE lock leaks its frame). (A writable entry installed after mprotect
/// is not observable here: user accesses re-check the VMA's flags.)
#[test]
fn spec_fault_vs_mprotect_read() {
    model(|| {
        let mm = setup();
        common::store_vs_mprotect_read(mm.clone(), A);
        mm.munmap(A, PMD).unwrap();
        assert_eq!(mm.frames_used(), 0, "a frame leaked");
    });
}

/// A split of the VMA elsewhere (mprotect(PROT_READ) of the neighbour
/// page stamps the VMA and cuts it in three) races a write fault at `A`,
/// which stays writable whatever the order. The fault must still succeed
/// and leave a writable page: an attempt that saw the new stamp under the
/// PTE lock falls back to the per-VMA path and installs there. Catches:
/// `Err(CheckedInstallError::Invalid) => Err(Event::spec_abort_stamp)` in
/// `spec_fault::handle` turned into `Ok(())` (an aborted attempt reported
/// as done, leaving nothing installed).
#[test]
fn spec_fault_vs_split() {
    model(|| {
        let mm = setup();
        let t = spawn_fault(&mm, A, Access::Write);
        mm.mprotect(A + PAGE_SIZE, PAGE_SIZE, Prot::READ).unwrap();
        let r = t.join().unwrap();
        assert_eq!(r, Ok(()));
        assert!(mm.translate(A).is_some(), "the fault installed nothing");
        mm.write(A, &[3]).unwrap();
        assert!(mm.write(A + PAGE_SIZE, &[1]).is_err());
        assert_eq!(mm.frames_used(), 2);
    });
}

/// munmap of the whole VMA races a read fault in it. Either the fault
/// installs first (and the zap clears the entry) or it reports no mapping;
/// either way nothing is left behind: every PTE table of the range is
/// empty, so munmap frees them all (a stale entry would keep its table, and
/// the tables above it, alive), no frame stays charged, and the address
/// reads as unmapped. Catches: the stamp re-check in `spec_fault::handle`
/// (`v.lock.stamp() == stamp`) replaced by `true`: a fault that walked to
/// the table before the munmap then installs after the zap.
#[test]
fn spec_fault_vs_munmap() {
    model(|| {
        let mm = space();
        // The root table is made by the first mapping and never freed: the
        // baseline is a space whose only mapping has come and gone.
        mm.mmap(B, PAGE_SIZE, rw(), fixed()).unwrap();
        mm.write(B, &[1]).unwrap();
        mm.munmap(B, PAGE_SIZE).unwrap();
        let empty = mm.page_table_bytes();
        mm.mmap(A, PMD, rw(), fixed()).unwrap();
        mm.write(A + PAGE_SIZE, &[0x11]).unwrap();
        let t = spawn_fault(&mm, A, Access::Read);
        mm.munmap(A, PMD).unwrap();
        let r = t.join().unwrap();
        assert!(matches!(r, Ok(()) | Err(FaultError::NoMapping)), "{r:?}");
        assert_eq!(mm.page_table_bytes(), empty, "an entry outlived munmap");
        assert_eq!(mm.frames_used(), 0, "a frame leaked");
        let mut x = [0u8; 1];
        assert_eq!(
            mm.read(A, &mut x).map_err(|e| e.errno()),
            Err(Error::Fault.errno())
        );
    });
}

/// mremap moves the whole VMA to `B`, which is not 2 MiB-aligned, so its
/// entries move one by one (under the old and the new table's locks) and
/// the old PTE table, emptied, is freed; a read fault at the old address
/// races it. The fault either installs before the move (its entry moves
/// to `B`) or reports no mapping; nothing is left at the old address: the
/// old table is freed (the moved entries, at `B` and `B + PAGE_SIZE`, need
/// one new table: the count is unchanged), and the moved neighbour
/// keeps its data. Catches: the write-lock check in `spec_fault::handle`
/// (`stamp >= mm.mmap_lock.seq().current()`) replaced by `false`: a fault
/// that reads the stamp mremap has just set treats the VMA as stable, and
/// installs in the old table after the entries have moved.
#[test]
fn spec_fault_vs_mremap() {
    model(|| {
        let mm = setup();
        let before = mm.page_table_bytes();
        let t = spawn_fault(&mm, A, Access::Read);
        let flags = MremapFlags::MAYMOVE | MremapFlags::FIXED;
        assert_eq!(mm.mremap(A, PMD, PMD, flags, B), Ok(B));
        let r = t.join().unwrap();
        assert!(matches!(r, Ok(()) | Err(FaultError::NoMapping)), "{r:?}");
        assert_eq!(
            mm.page_table_bytes(),
            before,
            "the old PTE table outlived the move"
        );
        let mut x = [0u8; 1];
        mm.read(B + PAGE_SIZE, &mut x).unwrap();
        assert_eq!(x, [0x11], "the neighbour moved");
        assert_eq!(mm.frames_used(), 1);
        assert_eq!(
            mm.read(A, &mut x).map_err(|e| e.errno()),
            Err(Error::Fault.errno())
        );
    });
}

/// VMA reuse (hazard 5): mmap(MAP_FIXED, PROT_NONE) over the VMA `O =
/// [A, A + PAGE_SIZE)` races a speculative read fault there. The mmap
/// detaches and frees `O`, zaps its range (the PTE table stays: a
/// read-only neighbour two pages up maps in its span) and at once takes
/// the same object back from the pool for the new PROT_NONE VMA over the
/// same page. An attempt that looked the object up before (in the tree:
/// the CPU's hint is the neighbour, faulted last) holds a recycled object
/// at the same address, whose old life (read-write) passes every check
/// but the stamp. It must either complete before the zap (which clears
/// its entry) or abort: no page is ever present in the PROT_NONE VMA,
/// and the fault there is then denied. Catches: the stamp re-check in
/// `spec_fault::handle` (`v.lock.stamp() == stamp`) replaced by `true`:
/// the attempt installs the zero page through the old life's snapshot
/// after the zap. (Dropping the `mm_id`/`range.contains` check, or
/// `new_vma`'s stamp, is not caught: a snapshot of the new life is
/// PROT_NONE, which the access check refuses, and the object is stamped
/// by this section's detach already.)
///
/// The thread runs the speculative attempt alone
/// (`loom_door::speculative_fault`): behind it, the per-VMA and mmap_lock
/// fallbacks racing the same mmap did not finish at bound 1 in 240 s
/// (360,000 executions); alone it finishes at bound 2. The fallback's
/// verdict is checked after the join; its races with writers are
/// `loom_tests/fault.rs`'s models. The VMA is one page, replaced whole
/// (not the first page of a 2 MiB VMA, split off): no split, a one-entry
/// zap, and a tree lookup, whose reads meet fewer of the mmap's stores
/// than the hint's, take it from 73 s to about 25 s.
#[test]
fn spec_fault_vs_vma_reuse() {
    model(|| {
        let mm = space();
        mm.mmap(A, PAGE_SIZE, rw(), fixed()).unwrap();
        mm.mmap(A + 2 * PAGE_SIZE, PAGE_SIZE, Prot::READ, fixed())
            .unwrap();
        mm.fault(A + 2 * PAGE_SIZE, Access::Read).unwrap();
        let t = spawn_spec(&mm, A, Access::Read);
        mm.mmap(A, PAGE_SIZE, Prot::NONE, fixed()).unwrap();
        t.join().unwrap();
        assert!(mm.stats().vma_reused >= 1, "the object was recycled");
        assert_eq!(
            mm.mincore(A, PAGE_SIZE),
            Ok(vec![false]),
            "a page is mapped in the PROT_NONE VMA"
        );
        assert_eq!(mm.fault(A, Access::Read), Err(FaultError::AccessDenied));
    });
}

/// The speculative fault through a stale CPU hint (mm/vma_hint.rs): the
/// thread makes the VMA `[A, A + 2 MiB)` its hint, then faults at `A`,
/// while munmap removes the VMA and an mmap elsewhere (at `C`) takes its
/// object back, attached, in this space, with a stamp older than the
/// sequence once the mmap returns. Whatever the order, `A` is a hole
/// afterwards with no entry: an attempt that read the hint before the
/// munmap validates the object's new life and must reject it by its range.
/// Catches: `!range.contains(addr)` dropped from `spec_fault::candidate`
/// (the hint's own range test in `VmaHints::get` read the old life's
/// range): the zero page is installed at `A`, outside every VMA.
#[test]
fn spec_fault_through_hint_vs_vma_reuse_elsewhere() {
    const C: u64 = A + 2 * PMD;
    model(|| {
        let mm = setup();
        let m2 = mm.clone();
        let t = thread::spawn(move || {
            loom_door::set_vma_hint(&m2, A);
            loom_door::speculative_fault(&m2, A, Access::Read)
        });
        mm.munmap(A, PMD).unwrap();
        mm.mmap(C, PAGE_SIZE, rw(), fixed()).unwrap();
        t.join().unwrap();
        assert!(mm.stats().vma_reused >= 1, "the object was recycled");
        assert!(mm.translate(A).is_none(), "an entry at A, in the hole");
        loom_door::check_ptes(&mm).unwrap();
    });
}

/// The same race through the hint's look-ahead (mm/vma_hint.rs): the
/// thread's hint is the read-only VMA `[A - 1 page, A)`, found by a walk
/// that also kept the next VMA of its leaf, `[A, A + 2 MiB)`; it faults
/// at `A`, which the hint misses and its look-ahead holds, while munmap
/// removes that VMA and an mmap at `C` takes its object back. As above,
/// `A` is a hole afterwards with no entry.
/// Catches: `!range.contains(addr)` dropped from `spec_fault::candidate`
/// (the look-ahead's own range test in `VmaHints::ahead` read the old
/// life's range): the zero page is installed at `A`, outside every VMA
/// (seen failing: `check_ptes` finds the entry at `A`).
#[test]
fn spec_fault_through_hint_look_ahead_vs_vma_reuse_elsewhere() {
    const C: u64 = A + 2 * PMD;
    model(|| {
        let mm = setup();
        mm.mmap(A - PAGE_SIZE, PAGE_SIZE, Prot::READ, fixed())
            .unwrap();
        let m2 = mm.clone();
        let t = thread::spawn(move || {
            loom_door::set_vma_hint(&m2, A - PAGE_SIZE);
            loom_door::speculative_fault(&m2, A, Access::Read)
        });
        mm.munmap(A, PMD).unwrap();
        mm.mmap(C, PAGE_SIZE, rw(), fixed()).unwrap();
        t.join().unwrap();
        assert!(mm.stats().vma_reused >= 1, "the object was recycled");
        assert!(mm.translate(A).is_none(), "an entry at A, in the hole");
        loom_door::check_ptes(&mm).unwrap();
    });
}

// Tables shared by several VMAs: the small VMAs below share the PTE table
// of `[A, A + 2 MiB)`, and each model races one speculative attempt alone
// (`loom_door::speculative_fault`, as the reuse model does) against the
// real writer.

use common::shared_table_space as shared_setup;

fn spawn_spec(mm: &Arc<AddressSpace>, addr: u64, access: Access) -> thread::JoinHandle<bool> {
    let m2 = mm.clone();
    thread::spawn(move || loom_door::speculative_fault(&m2, addr, access))
}

/// munmap of the neighbour `[A + 3 pages, A + 4 pages)` races a
/// speculative write fault at `A`, in the PTE table both VMAs share, with
/// no entry in it. The fault's page must stay mapped if it was installed:
/// munmap frees the empty tables of its hole only between its neighbours
/// (the floor is the end of the VMA before), so the shared table lives
/// on, and an attempt that walked to it installs into a linked table.
/// Catches: `Edit::free_pgtables` (src/mm/edit/mod.rs) ignoring the VMA
/// before the hole (`let floor = self.prev(..)..` made `let floor = 0;`):
/// the empty shared table is freed under the attempt, whose entry then
/// lands in an unlinked table (installed, yet `A` translates to nothing,
/// and its frame leaks).
#[test]
fn spec_fault_in_shared_table_vs_neighbour_munmap() {
    model(|| {
        let mm = shared_setup(A);
        let t = spawn_spec(&mm, A, Access::Write);
        mm.munmap(A + 3 * PAGE_SIZE, PAGE_SIZE).unwrap();
        let installed = t.join().unwrap();
        assert_eq!(mm.translate(A).is_some(), installed, "the entry was lost");
        loom_door::check_ptes(&mm).unwrap();
        mm.munmap(A, 2 * PAGE_SIZE).unwrap();
        assert_eq!(mm.frames_used(), 0, "a frame leaked");
    });
}

/// UFFDIO_REGISTER(MISSING) of the small VMA `[A, A + 2 pages)` races a
/// speculative write fault at `A`, in a PTE table it shares with its
/// neighbours. Registration changes no entry and locks no table but
/// through the sweep of `Edit::lock`, which must take the lock of a table
/// the VMA covers only in part. Once `register` has returned, a page
/// missing then stays missing: the handler's `UFFDIO_COPY` succeeds.
/// Catches: the PTE lock in `PageTable::sweep_at` (src/pt/range.rs,
/// `drop(t.lock.lock());`) deleted: the old rule, which swept only whole
/// 2 MiB spans inside the VMA, did the same for every small VMA.
#[test]
fn spec_fault_in_shared_table_vs_uffd_register() {
    model(|| common::spec_vs_uffd_register(shared_setup(A), A, 2 * PAGE_SIZE));
}

/// No PTE table yet: the small VMA `[A, A + 2 pages)` was never touched,
/// and a VMA at `B` keeps the PMD table above (same 1 GiB). munmap of the
/// VMA (which stamps it, sweeps, zaps nothing and frees the tables of
/// the hole) races a speculative read fault at `A`, which must make the
/// PTE table itself. The attempt either makes it before the sweep (which
/// then locks it, and the install is zapped or refused) or sees the stamp
/// when it would link one: afterwards no entry lies outside a VMA and no
/// table is left in the hole. Catches: the lock of the empty slot in
/// `PageTable::sweep_at` (src/pt/range.rs, `let _l =
/// self.holder_lock(holder, level, va);`) deleted: the attempt then links
/// a table and installs the zero page after munmap returned.
#[test]
fn spec_fault_without_table_vs_munmap() {
    without_tables_vs_munmap(A, Some(B));
}

/// The same race one level up, where the empty slot is the root table's:
/// the VMA that keeps the root table lies in another 512 GiB slot, so
/// neither the PUD, the PMD nor the PTE table above `A` exists, and the
/// sweep and the attempt's links meet at the root slot's striped lock
/// (`PageTable::slot_lock`). Catches: the link naming its slot one level
/// down (src/pt/walk.rs, `table_checked`: `Some((t, level, va))` made
/// `Some((t, level - 1, va))`, so a root slot's link takes the root
/// table's own lock while the sweep takes the slot's stripe): the attempt
/// then links the tables and installs the zero page after munmap
/// returned.
#[test]
fn spec_fault_without_upper_tables_vs_munmap() {
    without_tables_vs_munmap(A, Some(A + ROOT_SLOT));
}

/// The same race with no table at all: the space has never faulted, so
/// the sweep finds the root slot empty (under the stripe of the root
/// table slot its range lies in, stripe 1 here) and the attempt must link
/// the root itself (under stripe 0: an empty root orders nothing), then
/// the tables below it, the first under stripe 1. Either the root is made
/// (it is never freed) or nothing is. Catches: the sweep's stripe for a
/// missing root made the next one (src/pt/walk.rs, `holder_lock`:
/// `index(va, LEVELS - 1) + 1`): the sweep then misses the link below the
/// root, and the attempt installs the zero page after munmap returned.
#[test]
fn spec_fault_without_root_vs_munmap() {
    without_tables_vs_munmap(A + ROOT_SLOT, None);
}

/// A root table slot's span (512 GiB).
const ROOT_SLOT: u64 = 1 << 39;

/// The body of the three models above: the two-page VMA at `at` is
/// unmapped while a speculative read fault in it races; `keep` is where a
/// faulted VMA keeps the tables above the hole, if anywhere.
fn without_tables_vs_munmap(at: u64, keep: Option<u64>) {
    model(move || {
        let mm = space();
        if let Some(keep) = keep {
            mm.mmap(keep, PAGE_SIZE, rw(), fixed()).unwrap();
            mm.fault(keep, Access::Read).unwrap();
        }
        let tables = mm.page_table_bytes();
        mm.mmap(at, 2 * PAGE_SIZE, rw(), fixed()).unwrap();
        let t = spawn_spec(&mm, at, Access::Read);
        mm.munmap(at, 2 * PAGE_SIZE).unwrap();
        t.join().unwrap();
        loom_door::check_ptes(&mm).unwrap();
        // A root made by the attempt stays (a root is never freed).
        let root = if keep.is_none() && mm.page_table_bytes() > 0 {
            PAGE_SIZE
        } else {
            0
        };
        assert_eq!(
            mm.page_table_bytes(),
            tables + root,
            "a table was left in the hole"
        );
    });
}
