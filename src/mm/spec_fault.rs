//! The speculative fault path ([`FaultLocking::Speculative`]).
//!
//! The per-VMA path increments and decrements the faulting VMA's refcount:
//! one cache line that every thread faulting in that VMA writes. This path
//! writes nothing in the VMA. It reads the VMA's lock stamp, copies what
//! the fault needs, prepares the entry, and installs it under the PTE
//! table's lock only if the stamp has not moved; anything else falls back
//! to the per-VMA path (and from there to the mmap_lock).
//!
//! # The protocol
//!
//! 1. Pin the epoch; take the CPU's VMA hint if its range holds the
//!    address, or the first of the VMAs that followed it in its tree leaf
//!    holding the address ([`crate::mm::vma_hint`]), else find the VMA in
//!    the tree (and make it the hint, with the next two VMAs of its tree
//!    leaf, prefetched: a cache hint, no access). A hinted object that
//!    fails step 2's checks as not ours is replaced by the tree's.
//! 2. Read its stamp `s` (`Acquire`), then the mm sequence `m`
//!    (`Acquire`). Go on only if `s < m`: `s == m` means write-locked now,
//!    `s > m` a stamp newer than our view of the sequence. With `s < m`
//!    our `Acquire` of `m` synchronized with the end of section `s` (or a
//!    later one), so every change that section made to the VMA is
//!    visible. With range-locked writers `m` moves as above while the
//!    range lock's bias is on (its owner runs shared sections), then
//!    stays at `LOCKED`: a stamp at or above it is a writer's own lock,
//!    and one below it either the token its writer stored back with
//!    `Release` when it ended, which our `Acquire` load of `s` itself
//!    synchronized with, or a stamp of a shared section that ended
//!    before the raise to `LOCKED`, which our `Acquire` load of `m`
//!    synchronized with (`vma::seq`'s "Own write sections" and "The
//!    bias's owner runs shared sections").
//! 3. Snapshot: address space id, range, flags, "has an anon_vma", "has a
//!    shared object", "attached". The fault needs no more for anonymous
//!    private memory: a read maps the zero page, a write a zeroed frame.
//! 4. Bail out when the fault needs more than an install: an object (a
//!    shared mapping or a private mapping of a memfd), a write to a
//!    present read-only entry (copy-on-write: the reliability fixes live in
//!    the per-VMA path), a VMA registered for missing-page userfaults
//!    (only the locked paths deliver them), an access the flags refuse
//!    (the per-VMA path gives the verdict), or a fault that could map a
//!    2 MiB page (an eligible span whose PMD slot is empty: huge pages are
//!    installed only with the VMA held, see `mm::thp`). A span a PMD leaf
//!    maps is an entry present: the walk reports it `Taken`, a spurious
//!    fault if it satisfies the access.
//!
//!    A write in a VMA with no anon_vma yet (its first write) prepares
//!    one first, as the per-VMA path would (Linux's `vmf_anon_prepare`):
//!    try-lock the mmap_lock read side (else fall back), re-read the
//!    stamp under it (else fall back), run `anon_vma_prepare` (reuse a
//!    mergeable neighbour's anon_vma or make one, publish it by
//!    compare-exchange under the family's lock), drop the read side, and
//!    go on with the same snapshot: filling the pointer is no write
//!    section, so the stamp stays `s`. See "The first write" below.
//! 5. Walk to the PTE table, making each missing table on the way: it is
//!    linked under the lock of the table that holds its slot, after an
//!    `Acquire` fence and a re-read of the stamp (else fall back; see
//!    "Tables" below).
//! 6. Allocate and zero the frame, take the PTE table's lock, issue an
//!    `Acquire` fence, re-read the stamp: install only if it is still `s`
//!    (and the entry empty); else free the frame and fall back.
//!
//! Every writer that changes a VMA stamps it first (`VmaLock::write_lock`
//! stores the stamp, then a `Release` fence; `Edit::new_vma` stamps a
//! recycled object before it rewrites any field). Steps 3, 5 and 6
//! are a seqlock read: if any field we copied came from after a stamp, the fence
//! pair makes the re-read see that stamp.
//!
//! # Why each writer is safe
//!
//! The core argument (hazard 1 of the design notes) is one rule that no
//! writer can skip: `Edit::lock`, the only way a writer claims a VMA,
//! stamps it and then sweeps its range ([`PageTable::sweep`]): for every
//! page of the range it takes the lock of the PTE table covering it
//! (empty tables and tables shared with other VMAs included), or, where
//! none does, the lock of the table holding the empty slot above it.
//! Tables are linked and unlinked only under that slot lock. So for the
//! page we install into, the sweep and our install are ordered by one
//! lock: if the sweep locked our PTE table first, our lock acquisition
//! synchronizes with its release and our re-read sees the stamp; if it
//! found the slot empty, the table we walked was linked under the slot
//! lock after it (our `Acquire` walk synchronizes with the link, and the
//! re-read sees the stamp), or we link it ourselves and validate under
//! that lock. If ours comes first, our entry is in place before the
//! writer changes anything, and its passes treat it like any other. No
//! pass reads a table's emptiness without its lock (`move_ptes`,
//! `relink_pte_table`, fork's copy), so the rule holds twice over where
//! entries move. Stamps never repeat among the spaces sharing a VMA pool
//! ([`crate::vma::seq`]), so a stamp re-read equal to the snapshot's
//! names the same write section of the same space.
//!
//! With `WriterLocking::Range` the writers are the same edits under a range
//! lock: each still stamps and sweeps what it claims, in a write section
//! of its own, so a stamp at or above the sequence still means "a writer
//! may be changing this VMA" until that writer has stored its token back
//! (`mm/range_lock.rs`; the "range" rows of the matrix).
//!
//! One row per writer; each points at its cell of the loom matrix
//! (`loom_tests/matrix.rs`, reader "speculative fault"):
//!
//! | writer | why the install is ordered | cell |
//! |---|---|---|
//! | munmap | stamp and sweep; the zap runs under each table's lock, then empty tables go through the epoch, unlinked under their slot locks (hazard 3: a table we walked stays readable, its lock works, the stamp check fails); a table shared with a neighbour is not freed | `spec_fault_without_table_vs_munmap`, `spec_fault_without_upper_tables_vs_munmap`, `spec_fault_without_root_vs_munmap` (the root table's striped slot locks), `spec_fault_in_shared_table_vs_neighbour_munmap`, `spec_fault_vs_munmap` |
//! | mprotect, splits, merges | stamp and sweep every VMA they resize or change; entries rewritten under the locks | `spec_fault_in_shared_table_vs_mprotect`, `spec_fault_vs_mprotect_read`, `spec_fault_vs_split` |
//! | mremap move | stamp and sweep the source; entries move under both locks or a table (whose span the moved range covers) is relinked under its lock and both slot locks (hazard 4: a fault that walked in through the old PMD entry takes the same lock) | `spec_fault_in_shared_table_vs_mremap`, `spec_fault_vs_mremap` |
//! | mremap grow, shrink | stamp and sweep; a shrink zaps the tail as munmap | `spec_fault_vs_mremap_grow`, `_shrink` |
//! | mremap DONTUNMAP | stamp and sweep before the old VMA loses its anon_vma; an emptied table is locked too | `spec_fault_vs_mremap_dontunmap_over_empty_table` |
//! | MADV_DONTNEED, MADV_FREE | no stamp (hazard 9): an install after the zap is a fault after the madvise, which reads zero as a refill would | `spec_fault_vs_dontneed`, `spec_fault_vs_madv_free` |
//! | MADV_REMOVE, memfd shrink | cannot meet: they touch shared objects' pages, and we bail out of any VMA with an object | matrix reason |
//! | brk | stamp and sweep; a shrink is munmap's edit | `spec_fault_vs_brk_shrink` |
//! | mlock, set_anon_name | stamp and sweep (flags or name, often a split) | `spec_fault_vs_mlock`, `spec_fault_vs_set_anon_name` |
//! | uffd register | stamp and sweep: after `register` returns no earlier snapshot installs, so the handler's copy finds the page missing | `spec_fault_in_shared_table_vs_uffd_register`, `spec_fault_vs_uffd_register` |
//! | uffd unregister | cannot meet: a MISSING-registered VMA stops us at the flag check | matrix reason |
//! | uffd write-protect | entries rewritten under the PTE lock; we install only into empty entries | matrix reason |
//! | fork | stamp and sweep the parent's VMAs, then write-protect and copy table by table under the locks (hazard 10) | `spec_fault_vs_fork` |
//! | THP split | a split publishes a filled table of the leaf's own translations under the PMD lock: the walk reads the leaf (`Taken`) or the table, whose entries are all present, so there is nothing to install into | `lookup_vs_split` (`thp.rs`, shared) |
//! | THP fault | we never install a leaf, and fall back where one could be installed; a table we link and a leaf both go only into an empty slot under the PMD lock | matrix reason |
//! | anon_vma readers (merge decisions, fork's chains, mremap's offset choice, splits, brk, munmap's unlink) | a first write prepares under the mmap_lock read side, so every writer, all of which hold the write side, sees the anon_vma as it was before the prepare or after it, never in between (see "The first write") | `spec_first_write_vs_neighbour_merge`, `spec_first_write_vs_fork`, `spec_first_write_vs_munmap_reuse` |
//! | VMA reuse | a recycled object is stamped before any field changes and when detached; in another space of the fork family its stamp is that space's, never ours (hazard 5); one reached through a stale hint, taken back for another range, fails the range check | `spec_fault_vs_vma_reuse`, `spec_fault_vs_vma_reused_by_fork_child`, `spec_fault_through_hint_vs_vma_reuse_elsewhere` |
//!
//! # The first write
//!
//! A VMA's anon_vma goes from none to one without a write section, under
//! a read hold; it goes back (or changes) only while the VMA is
//! write-locked or detached. Writers read it before they claim the VMA:
//! a merge decides from its neighbours' anon_vmas (`merge::Proto`) and
//! only then stamps them, so a pointer filled between the decision and
//! the stamp would be filed in the reverse map under the VMA's old start
//! (and a merge that moves that start would not re-key it). The stamp
//! and sweep cannot order that, but the mmap_lock does: every writer
//! holds its write side from its decision to its end, and the prepare
//! holds the read side (as Linux's per-VMA fault does), try-locked, since
//! a writer may be waiting for it. Under it, the stamp re-read equal to
//! the snapshot's says that no writer has touched the object since
//! (stamps never repeat), so it is still this space's attached VMA,
//! over the range we copied, and stays so until we drop the read side:
//! the neighbour lookups and the link into the reverse map see a quiet
//! tree. A failed try-lock or stamp falls back with nothing changed.
//! Concurrent prepares of the same VMA (another speculative fault, a
//! per-VMA one, a huge fault) meet at the compare-exchange under the
//! family's lock: one links, the others adopt its anon_vma. After the
//! read side is dropped, a writer may run before our install; it stamps
//! the VMA, and the install's re-read under the PTE lock fails as for
//! any other writer.
//!
//! We also compare the address space id and the range: an object taken
//! back for a VMA at the same address (MAP_FIXED over part of the VMA)
//! passes those two, and the stamp alone rejects a snapshot of its old
//! life, the table check one of its new life.
//!
//! Tables (hazard 2): a PTE table may be shared by several VMAs (small
//! ones, and the ends of large ones) and by holes. Only our own VMA's
//! writers must be ordered with our install; installs of neighbours are
//! other entries under the same lock, and every pass over a shared table
//! touches only its own VMA's entries under that lock. A table may be
//! missing, or be made by a neighbour's fault (holding the neighbour's
//! VMA lock, not ours) after our VMA's writer swept: that is why the
//! sweep locks the empty slot and links take the same lock, so a table
//! linked after the sweep is seen only with the stamp. The tables of a
//! hole are freed (`free_pgtables`) under the same slot locks; nothing is
//! linked into a hole meanwhile, since every linker either holds a VMA
//! lock or the mmap_lock (it is in a VMA, not in the hole) or validates a
//! stamp that the writers which emptied the span changed before freeing.
//! So a speculative fault never leaves a table behind in a hole. The page
//! table object itself is made on first use: a writer that finds none
//! orders itself before its making ([`crate::lazy::LazyWith::peek_ordered`]).
//!
//! Checked by `loom_tests/spec_fault.rs` and `loom_tests/spec_writers.rs`
//! (the table above) and `tests/stress_spec.rs` (splits, fork, DONTNEED
//! under faults).
//!
//! # Shared-memory writes left on the path
//!
//! | write | where | why it is not contended |
//! |-------|-------|-------------------------|
//! | epoch pin / unpin | crossbeam's per-thread record; a global-epoch advance every 128 pins | the record is the thread's own line; the advance is amortized |
//! | `note_cpu` | the TLB's per-CPU slot, written once then only read | per-CPU line |
//! | VMA hint | the CPU's hint slot, written when its faults move to another VMA | per-CPU line |
//! | budget charge | the per-CPU stock; the shared count once per 256 frames | per-CPU line; the shared line is written once per 1 MiB charged |
//! | frame take | the per-CPU cache, its mutex and counts; the frame's refcount (a plain store); the global pool's lock once per 512 never-used frames (or 32 freed ones) | per-CPU line; never-used frames come in per-CPU spans of up to 512, so refcounts of one line belong to one CPU |
//! | frame zeroing | the frame | private until installed |
//! | PTE lock, entry, `used` | the table's 128-byte-aligned header and its entry | shared only by threads faulting in the same 2 MiB span (the `interleaved` workload measures that case) |
//! | stats | the per-CPU counter slot | per-CPU line |
//! | first write of a VMA: mmap_lock read side (try), the family's lock, its reverse-map index, the anon_vma's refcount, the VMA's anon_vma pointer; the anon_vma's id (`sync::counter::next_id`: the thread's block of ids, the process-wide count once per 1,024) | once per VMA, its first write (the per-VMA path wrote the same lines before, plus the VMA's refcount); the id count was written once per VMA until ids came in per-thread blocks | amortized over the VMA's pages: once per 64 faults in 256 KiB VMAs (but on a lent 16-core machine, 16 threads faulting 256 KiB VMAs ran at 0.5-0.8x the rate of 1 GiB ones in five rounds of six; not profiled there, and the mmap_lock's line, written about a million times a second then, is the first suspect: `docs/RESULTS.md`, "Small VMAs") |
//!
//! Nothing else is written in the VMA, the tree or the mm sequence. Finding
//! the CPU for the per-CPU slots writes nothing: it reads the thread's
//! rseq area ([`crate::percpu`]).
//!
//! # Locking
//!
//! No lock but the PTE table's, taken once to install (and, to make a
//! missing table, the lock of the table holding its slot); the VMA is neither
//! read-locked nor referenced (its stamp is validated instead). A first
//! write also try-locks the mmap_lock read side, and under it takes the
//! anon_vma family's lock, before any PTE lock, as the per-VMA path does.
//! Order: [`crate::mm`].

use crate::addr::{page_align_down, Range};
use crate::mm::vma_hint::AHEAD;
use crate::mm::{Access, AddressSpace};
use crate::phys::Pfn;
#[cfg(doc)]
use crate::pt::PageTable;
use crate::pt::{CheckedInstallError, Pte, PteFlags};
use crate::reclaim::Guard;
use crate::stats::Event;
use crate::sync::{fence, Ordering};
use crate::vma::{VmFlags, VmaRef};

/// One speculative attempt. `Err(reason)`: nothing changed, run the
/// per-VMA path. Never inlined: its own symbol for profiles (as the
/// compiler mostly left it anyway), at the cost of one call per fault.
#[inline(never)]
pub(crate) fn handle(mm: &AddressSpace, addr: u64, access: Access) -> Result<(), Event> {
    let g = mm.tree.pin();
    // The CPU's hint first (see `vma_hint`): validated as a tree result
    // is, and replaced by a tree walk where that fails.
    let (v, stamp, flags, range) =
        match mm.vma_hints.get(addr).map(|v| (v, candidate(mm, &v, addr))) {
            Some((v, Ok((stamp, flags, range)))) => (v, stamp, flags, range),
            Some((_, Err(Event::spec_abort_locked))) => return Err(Event::spec_abort_locked),
            _ => {
                let Some(around) = mm.tree.find_around(addr, &g) else {
                    return Err(Event::spec_abort_lookup);
                };
                let v = *around.entry().1;
                // Warm the next VMAs of the leaf: a thread faulting
                // through small VMAs in order reads the next one's fields
                // in this VMA's first write (the anon_vma reuse check),
                // and finds them among the hint's look-ahead later.
                for d in 1..=AHEAD as isize {
                    if let Some((_, n)) = around.nearby(d) {
                        n.prefetch();
                    }
                }
                let (stamp, flags, range) = candidate(mm, &v, addr)?;
                mm.vma_hints.set(&around);
                (v, stamp, flags, range)
            }
        };
    if !access.allowed_by(flags) {
        return Err(Event::spec_abort_lookup);
    }
    // A missing page of a registered VMA is the handler's: only the
    // locked paths deliver userfaults.
    if !v.is_anonymous() || flags.contains(VmFlags::UFFD_MISSING) {
        return Err(Event::spec_abort_needs_more);
    }
    if access == Access::Write && !v.has_anon_vma() {
        prepare_anon_vma(mm, &v, stamp, range, &g)?;
    }
    let page = page_align_down(addr);
    // Huge pages are installed only with the VMA held (`mm::thp`): where
    // one could be, the locked paths decide.
    let g = mm.pt.pin();
    if crate::mm::thp::eligible(mm, flags, range, true, addr) && mm.pt.pmd_none(addr, &g) {
        return Err(Event::spec_abort_needs_more);
    }
    // Seqlock read side, run under each lock the install goes through (a
    // table's slot lock where a table is missing, then the PTE lock): the
    // field loads above happen before the re-read (pairs with the Release
    // fence after the writer's stamp).
    let valid = || {
        fence(Ordering::Acquire);
        v.lock.stamp() == stamp
    };
    // The tree pin above covers the walk too; the nested pin above only
    // names the page table's reclaimer. One walk, making missing tables:
    // the install goes to the table found here (see `PteSlot` for why a
    // table unlinked meanwhile is safe).
    let slot = match mm.pt.slot_checked(page, &g, &valid) {
        Ok(s) => s,
        Err(CheckedInstallError::Invalid) => return Err(Event::spec_abort_stamp),
        // A 2 MiB page maps it: done if it satisfies us.
        Err(CheckedInstallError::Taken(e)) if access != Access::Write || e.is_writable() => {
            mm.stats.inc(Event::fault_spurious);
            return Ok(());
        }
        Err(_) => return Err(Event::spec_abort_table),
    };
    let cur = slot.get();
    if cur.is_present() {
        return if access != Access::Write || cur.is_writable() {
            mm.stats.inc(Event::fault_spurious);
            Ok(())
        } else {
            Err(Event::spec_abort_needs_more)
        };
    }
    let new = if access == Access::Write {
        let pfn = mm.frames.alloc().ok_or(Event::spec_abort_oom)?;
        Pte::new(pfn, PteFlags::from(flags) | crate::mm::soft_dirty::WRITTEN)
    } else {
        Pte::new(Pfn::ZERO_PAGE, PteFlags::from(flags) - PteFlags::WRITE)
    };
    let r = slot.install_checked(new, valid);
    if r.is_err() && !new.pfn().is_zero_page() {
        mm.frames.put(new.pfn());
    }
    match r {
        Ok(()) => {
            mm.stats.inc(Event::fault_speculative);
            Ok(())
        }
        Err(CheckedInstallError::NoTable) => Err(Event::spec_abort_table),
        Err(CheckedInstallError::Invalid) => Err(Event::spec_abort_stamp),
        // A racing fault installed first: done if it satisfies us.
        Err(CheckedInstallError::Taken(e)) if access != Access::Write || e.is_writable() => {
            mm.stats.inc(Event::fault_spurious);
            Ok(())
        }
        Err(CheckedInstallError::Taken(_)) => Err(Event::spec_abort_needs_more),
    }
}

/// Steps 2 and 3 for a candidate `v` (from the tree or the CPU's hint):
/// its stamp, flags and range if it is, as of that stamp, the attached VMA of
/// this space covering `addr`.
#[inline(always)]
fn candidate(mm: &AddressSpace, v: &VmaRef, addr: u64) -> Result<(u64, VmFlags, Range), Event> {
    let stamp = v.lock.stamp();
    if stamp >= mm.mmap_lock.seq().current() {
        return Err(Event::spec_abort_locked);
    }
    // The snapshot (a VMA changes only after it is stamped).
    let range = v.range();
    let flags = v.flags();
    if v.mm_id() != mm.id || !range.contains(addr) || !v.lock.is_attached() {
        return Err(Event::spec_abort_lookup);
    }
    Ok((stamp, flags, range))
}

/// Step 4a: the first write of a VMA gives it its anon_vma here, as the
/// per-VMA path would (Linux's `vmf_anon_prepare`): under the mmap_lock
/// read side, only try-locked, with the stamp validated under it. Every
/// writer that reads or changes a VMA's anon_vma (merges, splits, fork,
/// mremap, munmap, reuse) holds the write side and stamps the VMAs it
/// changes, so a stamp still equal to the snapshot's under the read side
/// means the VMA is the one we copied, attached, and stays so until we
/// drop it: the same hold the per-VMA path's prepare has (its VMA read
/// lock adds nothing once the mmap_lock is held). The stamp does not
/// move (filling the pointer is no write section), so the install goes
/// on with the same snapshot.
/// `g` is the fault's own tree pin, which the prepare's neighbour lookup
/// reuses.
fn prepare_anon_vma(
    mm: &AddressSpace,
    v: &VmaRef,
    stamp: u64,
    range: Range,
    g: &Guard,
) -> Result<(), Event> {
    let Some(_st) = crate::mm::range_read::try_read_neighbours(mm, range) else {
        return Err(Event::spec_abort_needs_more);
    };
    // The read side synchronized with the last writer's release (with
    // range writers, of every writer whose range overlaps this VMA's
    // neighbourhood): a stamp any writer stored since the snapshot is
    // visible now.
    if v.lock.stamp() != stamp {
        return Err(Event::spec_abort_stamp);
    }
    crate::mm::anon_vma::anon_vma_prepare_held(mm, v, g);
    mm.stats.inc(Event::spec_anon_vma_prepared);
    Ok(())
}
