//! The speculative fault's row of writers that a review found able to
//! outrun it (issue 25's defects 2 to 4): userfault registration,
//! mremap(MREMAP_DONTUNMAP) over an empty PTE table, and an object
//! recycled by another space of a fork family. Each runs one speculative
//! attempt alone (`loom_door::speculative_fault`, as
//! `spec_fault::spec_fault_vs_vma_reuse` does, so the fallbacks' own races
//! stay in `fault.rs`) against the real writer, through src/sync.rs, and
//! checks what the writer must leave behind with
//! `loom_door::check_ptes`: every present entry in a VMA, writable only
//! where the VMA is, a private frame only where the VMA has an anon_vma.
//! Each names the mutation it catches (checked by breaking that line,
//! running the model and restoring it).
#![cfg(aspace_loom)]

mod common;
use common::{fixed, model, rw};

use aspace::{
    loom_door, Access, AddressSpace, Advice, Config, FaultLocking, MremapFlags, Prot, PAGE_SIZE,
};
use loom::sync::Arc;
use loom::thread;

/// A 2 MiB-aligned address.
const A: u64 = 0x4000_0000;
const PMD: u64 = 1 << 21;
/// Another 2 MiB-aligned address, in another 1 GiB span.
const C: u64 = 0x8000_0000;

use common::spec_space as space;

/// `[A, A + 2 MiB)` with its anon_vma and PTE table: page `A + PAGE_SIZE`
/// written, and with `empty` zapped again by MADV_DONTNEED (the table
/// stays, with no entry: the setup the emptiness shortcuts skipped).
fn setup(mm: &AddressSpace, empty: bool) {
    mm.mmap(A, PMD, rw(), fixed()).unwrap();
    mm.write(A + PAGE_SIZE, &[0x11]).unwrap();
    if empty {
        mm.madvise(A + PAGE_SIZE, PAGE_SIZE, Advice::DontNeed)
            .unwrap();
    }
}

fn spawn_spec(mm: &Arc<AddressSpace>, addr: u64) -> thread::JoinHandle<bool> {
    let m2 = mm.clone();
    thread::spawn(move || loom_door::speculative_fault(&m2, addr, Access::Write))
}

/// UFFDIO_REGISTER(MISSING) of the VMA races a speculative write fault at
/// `A`. Once `register` has returned, a page missing then stays missing
/// for the handler: its `UFFDIO_COPY` succeeds (a fault that validated
/// its stamp before the registration installed nothing after it, or a
/// lazily restored guest would read the fault's zeros instead of the
/// copy). Catches: the sweep in `Edit::lock` (src/mm/edit.rs,
/// `pt.sweep(r, &pt.pin())`) deleted: registration only stamps the VMA
/// and changes its flags, so without the sweep nothing orders the stamp
/// before the fault's re-read under the PTE lock.
#[test]
fn spec_fault_vs_uffd_register() {
    model(|| {
        let mm = space();
        setup(&mm, false);
        common::spec_vs_uffd_register(mm, A, PMD);
    });
}

/// mremap(MREMAP_DONTUNMAP) moves the VMA's pages to `C`, leaving the old
/// VMA in place with no anon_vma (as a fresh mapping), over a PTE table
/// MADV_DONTNEED emptied; a speculative write fault at `A` races it. A
/// private page may land in the old VMA only while it still has its
/// anon_vma (and then moves to `C`); one landing after the move would
/// sit in a VMA with no anon_vma, which fork does not copy (the parent
/// read 7 and the child 0). `C` is 2 MiB-aligned, so the emptied table
/// is relinked whole. Catches: both the sweep in `Edit::lock` deleted and
/// `relink_pte_table`'s count read moved back before the table's lock
/// (src/pt/moves.rs): the pre-fix code. Either one
/// alone keeps the install ordered, by design: the sweep is the rule, and
/// no pass reads a table's emptiness without its lock.
#[test]
fn spec_fault_vs_mremap_dontunmap_over_empty_table() {
    model(|| {
        let mm = space();
        setup(&mm, true);
        let t = spawn_spec(&mm, A);
        let flags = MremapFlags::MAYMOVE | MremapFlags::FIXED | MremapFlags::DONTUNMAP;
        assert_eq!(mm.mremap(A, PMD, PMD, flags, C), Ok(C));
        t.join().unwrap();
        loom_door::check_ptes(&mm).unwrap();
    });
}

/// A parent and its fork child share the VMA pool. The parent's VMA `O =
/// [A, A + 1 page)` is forked before it has an anon_vma (the child copies
/// no table, so checking it costs nothing), then written once and emptied
/// beside a read-only neighbour that keeps its PTE table
/// (`common::emptied_with_neighbour`). A speculative write fault in the
/// parent snapshots `O`, found by a tree walk (the CPU's hint is the
/// neighbour, faulted last); the parent unmaps `O` whole, so `O` goes
/// back to the pool while the table stays; the child's next mmap recycles
/// `O` and stamps it with its own sequence. When both spaces counted
/// their write sections from zero, the child's stamp (its second section,
/// after fork) equalled the parent's snapshot (fork's stamp, the parent's
/// second section) and the fault installed a page at `A`, where the
/// parent has no VMA any more. Catches: `write_begin` (src/vma/seq.rs)
/// counting each space's sections from its own zero again (`next = prev +
/// 1` without taking a fresh block from the process-wide counter).
///
/// The shape keeps the race small: a split of a 2 MiB VMA, four copied
/// tables and a lookup through the hint (whose range reads each meet the
/// child's stores) made the same race take 20 minutes at bound 2.
#[test]
fn spec_fault_vs_vma_reused_by_fork_child() {
    model(|| {
        let mm = space();
        mm.mmap(A, PAGE_SIZE, rw(), fixed()).unwrap();
        let child = mm.fork().unwrap();
        common::emptied_with_neighbour(&mm, A);
        let t = spawn_spec(&mm, A);
        mm.munmap(A, PAGE_SIZE).unwrap();
        child.mmap(C, PAGE_SIZE, rw(), fixed()).unwrap();
        t.join().unwrap();
        assert!(child.stats().vma_reused >= 1, "the object was recycled");
        loom_door::check_ptes(&mm).unwrap();
        loom_door::check_ptes(&child).unwrap();
    });
}

/// The rest of the speculative fault's row: one speculative write attempt
/// at `at` races `writer`, on a space set up as `setup` leaves it (with
/// `empty`, the PTE table has no entry). Afterwards every entry agrees
/// with the VMAs (`check_ptes`), and once everything is unmapped no frame
/// is left charged. Catches, in each writer that stamps (mremap grow and
/// shrink, brk, mlock, set_anon_name): `mm.frames.put(new.pfn())` dropped
/// from the abort path of `spec_fault::handle` (an attempt that sees the
/// writer's stamp under the PTE lock leaks its frame). The madvise models
/// name their own.
fn spec_vs(empty: bool, at: u64, writer: impl Fn(&AddressSpace) + Sync + Send + 'static) {
    model(move || {
        let mm = space();
        setup(&mm, empty);
        let t = spawn_spec(&mm, at);
        writer(&mm);
        t.join().unwrap();
        loom_door::check_ptes(&mm).unwrap();
        mm.munmap(A, 2 * PMD).unwrap();
        assert_eq!(mm.frames_used(), 0, "a frame leaked");
    });
}

/// mremap growing the VMA in place to 4 MiB: the fault's page stays
/// where it is, writable.
#[test]
fn spec_fault_vs_mremap_grow() {
    spec_vs(false, A, |mm| {
        assert_eq!(mm.mremap(A, PMD, 2 * PMD, MremapFlags::empty(), 0), Ok(A));
    });
}

/// mremap shrinking the VMA to its first page while the fault writes its
/// last: an install before the shrink is zapped with the tail, none after
/// (hazard: an entry left past the new end, `check_ptes`).
#[test]
fn spec_fault_vs_mremap_shrink() {
    spec_vs(false, A + PMD - PAGE_SIZE, |mm| {
        assert_eq!(mm.mremap(A, PMD, PAGE_SIZE, MremapFlags::empty(), 0), Ok(A));
    });
}

/// MADV_DONTNEED of the range (hazard 9: it does not stamp) over an
/// emptied table: the page may be installed after the zap, which is a
/// fault after the madvise, and reads zero either way. Catches: the zap
/// dropping the frames it clears (`gather.free_frame(pfn)` deleted in
/// `zap_range`, src/mm/edit/mod.rs): a page installed before the zap
/// leaks.
#[test]
fn spec_fault_vs_dontneed() {
    spec_vs(true, A, |mm| {
        mm.madvise(A, PMD, Advice::DontNeed).unwrap();
        let mut x = [9u8; 1];
        mm.read(A + PAGE_SIZE, &mut x).unwrap();
        assert_eq!(x, [0]);
    });
}

/// MADV_FREE of the range: it zaps like DONTNEED (a lazily freed private
/// page goes at once here), under the mmap_lock read side. Catches the
/// same deleted `gather.free_frame(pfn)`.
#[test]
fn spec_fault_vs_madv_free() {
    spec_vs(false, A, |mm| {
        mm.madvise(A, PMD, Advice::Free).unwrap();
    });
}

/// brk shrinking the heap, a 2 MiB-aligned `[A, A + 4 MiB)` made by brk
/// instead of mmap, while the fault writes in the part it gives back.
#[test]
fn spec_fault_vs_brk_shrink() {
    model(|| {
        let mm = Arc::new(AddressSpace::new(Config {
            fault_locking: FaultLocking::Speculative,
            brk_start: A,
            ..common::cfg()
        }));
        assert_eq!(mm.brk(A + 2 * PMD), Ok(A + 2 * PMD));
        mm.write(A + PMD, &[1]).unwrap();
        let t = spawn_spec(&mm, A + PMD + PAGE_SIZE);
        assert_eq!(mm.brk(A + PMD), Ok(A + PMD));
        t.join().unwrap();
        loom_door::check_ptes(&mm).unwrap();
        mm.brk(A).unwrap();
        assert_eq!(mm.frames_used(), 0, "a frame leaked");
    });
}

/// mlock of the VMA (a flag change, then populating its pages as faults).
#[test]
fn spec_fault_vs_mlock() {
    spec_vs(true, A, |mm| {
        mm.mlock(A, PAGE_SIZE).unwrap();
        assert!(mm.translate(A).is_some(), "mlock populates");
    });
}

/// prctl(PR_SET_VMA_ANON_NAME) of the faulting page (a split into three
/// VMAs and a name: stamps, no entry changes).
#[test]
fn spec_fault_vs_set_anon_name() {
    spec_vs(true, A, |mm| {
        mm.set_anon_name(A, PAGE_SIZE, Some("x")).unwrap();
    });
}

/// fork while the fault writes `A`: the child gets the page copy-on-write
/// (fork saw the entry) or not at all (the fault aborted on fork's stamp,
/// or landed after it, in the parent only). Either way a store through the
/// parent after fork never shows in the child (hazard 10: a writable entry
/// installed behind fork's copy pass would be shared writable). Catches:
/// fork's copy leaving the parent's entry writable (`let ro =
/// Pte::new(pfn, pte.flags() - PteFlags::WRITE)` in `copy_page_tables`,
/// src/mm/fork.rs, keeping `WRITE`): a page the fault installed before
/// the copy is then shared writable.
#[test]
fn spec_fault_vs_fork() {
    model(|| {
        let mm = space();
        setup(&mm, true);
        let t = spawn_spec(&mm, A);
        let child = mm.fork().unwrap();
        t.join().unwrap();
        mm.write(A, &[0x77]).unwrap();
        let mut x = [9u8; 1];
        child.read(A, &mut x).unwrap();
        assert_eq!(x, [0], "the parent's store reached the child");
        loom_door::check_ptes(&mm).unwrap();
        loom_door::check_ptes(&child).unwrap();
    });
}

/// [`spec_vs`] in small VMAs: one speculative write attempt at `A` in
/// `[A, A + 2 pages)`, whose PTE table it shares with a neighbour
/// (`common::shared_table_space`), races `writer` on that VMA. Afterwards
/// every entry agrees with the VMAs and, all unmapped, no frame is left.
/// Catches the same dropped `mm.frames.put(new.pfn())`.
fn spec_vs_small(writer: impl Fn(&AddressSpace) + Sync + Send + 'static) {
    model(move || {
        let mm = common::shared_table_space(A);
        let t = spawn_spec(&mm, A);
        writer(&mm);
        t.join().unwrap();
        loom_door::check_ptes(&mm).unwrap();
        mm.munmap(A, PMD).unwrap();
        mm.munmap(C, PMD).unwrap();
        assert_eq!(mm.frames_used(), 0, "a frame leaked");
    });
}

/// mprotect(PROT_READ) of the small VMA: no writable entry may appear in
/// it afterwards (`check_ptes`), though its table is shared.
#[test]
fn spec_fault_in_shared_table_vs_mprotect() {
    spec_vs_small(|mm| {
        mm.mprotect(A, 2 * PAGE_SIZE, Prot::READ).unwrap();
    });
}

/// mremap moving the small VMA to `C`: its entries move one by one out of
/// the shared table, which stays for the neighbour; no entry may be left
/// at the old address.
#[test]
fn spec_fault_in_shared_table_vs_mremap() {
    spec_vs_small(|mm| {
        let flags = MremapFlags::MAYMOVE | MremapFlags::FIXED;
        assert_eq!(mm.mremap(A, 2 * PAGE_SIZE, 2 * PAGE_SIZE, flags, C), Ok(C));
    });
}

/// The first write of a small VMA `V = [A + 2 pages, A + 4 pages)`, which
/// has no anon_vma yet, prepares one on the speculative path
/// (`spec_fault::prepare_anon_vma`) and installs its page. `N = [A, A +
/// 2 pages)` below is read-only; `mprotect` makes it writable, so it
/// merges into `V` (V's start moves down, re-keyed in the rmap only if V
/// had an anon_vma when the merge decided, which it reads before it
/// stamps V). Afterwards the entries agree with the VMAs and every page of
/// the merged VMA is in its family's rmap. Catches: the mmap_lock
/// try-lock in `prepare_anon_vma` deleted (`let Some(_st) =
/// mm.mmap_lock.try_read() else ...`): the anon_vma then appears between
/// the merge's decision and its move, filed under V's old start, and the
/// walk misses the merged pages.
#[test]
fn spec_first_write_vs_neighbour_merge() {
    model(|| {
        let mm = space();
        mm.mmap(A, 2 * PAGE_SIZE, Prot::READ, fixed()).unwrap();
        mm.mmap(A + 2 * PAGE_SIZE, 2 * PAGE_SIZE, rw(), fixed())
            .unwrap();
        let t = spawn_spec(&mm, A + 2 * PAGE_SIZE);
        mm.mprotect(A, 2 * PAGE_SIZE, rw()).unwrap();
        t.join().unwrap();
        assert_eq!(mm.vmas().len(), 1, "N merged into V");
        loom_door::check_ptes(&mm).unwrap();
        common::rmap::check_rmap(&mm);
    });
}

/// The first write of `V = [A, A + 2 pages)` (no anon_vma yet) races
/// munmap of `V` and an mmap at `B`, below `A`, that recycles `V`'s
/// object. The prepare must act only on the VMA it snapshotted: a freed
/// object given an anon_vma would keep it, filed under its old start, in
/// its next life. Afterwards the entries agree with the VMAs, every page
/// of a VMA with an anon_vma is in its family's rmap, and, all unmapped,
/// no frame is left. Catches: the stamp re-read under the mmap_lock in
/// `prepare_anon_vma` deleted (`if v.lock.stamp() != stamp { return
/// Err(..) }`): the prepare then links the freed object, and the VMA at
/// `B` inherits that link under `A`'s key, above `B`'s page offset, where
/// the walk does not look.
#[test]
fn spec_first_write_vs_munmap_reuse() {
    const B: u64 = 0x2000_0000;
    model(|| {
        let mm = space();
        mm.mmap(A, 2 * PAGE_SIZE, rw(), fixed()).unwrap();
        let t = spawn_spec(&mm, A);
        mm.munmap(A, 2 * PAGE_SIZE).unwrap();
        mm.mmap(B, 2 * PAGE_SIZE, rw(), fixed()).unwrap();
        t.join().unwrap();
        assert!(mm.stats().vma_reused >= 1, "the object was recycled");
        loom_door::check_ptes(&mm).unwrap();
        common::rmap::check_rmap(&mm);
        mm.munmap(B, 2 * PAGE_SIZE).unwrap();
        assert_eq!(mm.frames_used(), 0, "a frame leaked");
    });
}

/// The first write of `V = [A, A + 2 pages)` (no anon_vma yet) races
/// fork. Either the prepare and the install come first (the child gets a
/// chained anon_vma and the page copy-on-write: it reads 0 after the
/// parent stores 0x77, and the parent's walk lists the child) or fork
/// does (the install fails on fork's stamp; the child has no entry).
/// Afterwards both spaces' entries agree with their VMAs and both rmaps
/// are exact. Catches: fork's `link_anon_vmas(&dups, &self.stats)`
/// deleted (src/mm/fork.rs): a page installed before fork is copied into
/// a child VMA with no anon_vma.
#[test]
fn spec_first_write_vs_fork() {
    model(|| {
        let mm = space();
        mm.mmap(A, 2 * PAGE_SIZE, rw(), fixed()).unwrap();
        let t = spawn_spec(&mm, A);
        let child = mm.fork().unwrap();
        t.join().unwrap();
        if child.translate(A).is_some() {
            let hits = mm.rmap_walk(A);
            assert!(hits.iter().any(|h| h.mm_id == child.id()), "{hits:?}");
        }
        mm.write(A, &[0x77]).unwrap();
        let mut x = [9u8; 1];
        child.read(A, &mut x).unwrap();
        assert_eq!(x, [0], "the parent's store reached the child");
        loom_door::check_ptes(&mm).unwrap();
        loom_door::check_ptes(&child).unwrap();
        common::rmap::check_rmap(&mm);
        common::rmap::check_rmap(&child);
    });
}
