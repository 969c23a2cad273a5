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
//! 1. Pin the epoch; find the VMA in the tree.
//! 2. Read its stamp `s` (`Acquire`), then the mm sequence `m`
//!    (`Acquire`). Go on only if `s < m`: `s == m` means write-locked now,
//!    `s > m` a stamp newer than our view of the sequence, `u64::MAX` an
//!    object never stamped. With `s < m` our `Acquire` of `m` synchronized
//!    with the end of section `s` (or a later one), so every change that
//!    section made to the VMA is visible.
//! 3. Snapshot: address space id, range, flags, "has an anon_vma", "has a
//!    shared object", "attached". The fault needs no more for anonymous
//!    private memory: a read maps the zero page, a write a zeroed frame.
//! 4. Bail out when the fault needs more than an install: no anon_vma yet
//!    (attaching one changes the VMA), an object (a shared mapping or a
//!    private mapping of a memfd), a write to a
//!    present read-only entry (copy-on-write: the reliability fixes live in
//!    the per-VMA path), a VMA registered for missing-page userfaults
//!    (only the locked paths deliver them), an access the flags refuse (the per-VMA path gives
//!    the verdict), no PTE table, or a PTE table whose 2 MiB span is not
//!    wholly inside the VMA (see "tables" below).
//! 5. Allocate and zero the frame, take the PTE table's lock, issue an
//!    `Acquire` fence, re-read the stamp: install only if it is still `s`
//!    (and the entry empty); else free the frame and fall back.
//!
//! Every writer that changes a VMA stamps it first (`VmaLock::write_lock`
//! stores the stamp, then a `Release` fence; `Edit::new_vma` stamps a
//! recycled object before it rewrites any field). Steps 3 and 5 are a
//! seqlock read: if any field we copied came from after a stamp, the fence
//! pair makes the re-read see that stamp.
//!
//! # Why each writer is safe
//!
//! The core argument (hazard 1 of the design notes): a writer that changes
//! what the fault would install stamps the VMA and afterwards takes the
//! lock of every existing PTE table of its range (`zap_range`,
//! `change_range`, `move_range` take it even for tables with no entries).
//! The two critical sections on our table are ordered by its lock. If the
//! writer's comes first, our lock acquisition synchronizes with its release
//! and our re-read sees the stamp: we abort. If ours comes first, the
//! writer's pass sees our entry and treats it like any other.
//!
//! - **munmap** stamps, detaches, zaps the range under each table's lock,
//!   then frees empty tables through the epoch (hazard 3: we hold a pin,
//!   so a table we walked to stays readable; its lock still works, and the
//!   stamp check then fails). An install before the zap is zapped and its
//!   frame freed.
//! - **mprotect** stamps (splitting if needed: the new VMA is stamped
//!   too) and rewrites the range's entries under each table's lock: our
//!   writable entry installed before is write-protected; after, we abort.
//! - **mremap** stamps the source, then moves entries under both tables'
//!   locks or relinks a whole table under its lock (hazard 4: a fault that
//!   walked to the table through its old PMD entry takes the same lock
//!   after the relink and sees the stamp). A table it skips because its
//!   count read zero without the lock is zapped with the old range, under
//!   the lock, so the argument is the munmap one.
//! - **split / merge** stamp every VMA they resize; the page stays covered
//!   with the same flags, but we abort anyway (a stale range is never used).
//! - **fork** stamps the parent's VMAs, then write-protects and copies
//!   their entries table by table under the locks (hazard 10): a writable
//!   entry we install is either seen by that pass or we see the stamp.
//! - **MADV_DONTNEED** zaps under the mmap_lock read side without stamping
//!   (hazard 9). An install racing it may land after the zap: that is a
//!   fault after the madvise, which DONTNEED allows (the page reads as
//!   zero, as it would after a refill). The per-VMA path races it the same
//!   way; a fault never reports an error because of it (we fall back).
//! - **VMA reuse** (hazard 5): a recycled object is stamped before any
//!   field changes, and it is stamped when detached, so the re-read differs
//!   from `s`; we also compare the address space id and the range. An
//!   object taken back for a VMA at the same address (MAP_FIXED over part
//!   of the VMA) passes those two: the stamp alone rejects a snapshot of
//!   its old life, and the table check one of its new life.
//!
//! Tables (hazard 2): we never create a table; and we use one only if its
//! 2 MiB span lies inside the VMA's snapshot range. Then whoever created
//! it faulted inside this VMA's range: either in this VMA, holding its read
//! lock or the mmap_lock (so every later writer of this VMA, which drains
//! readers or takes the mmap_lock, sees the table in its pass), or in a VMA
//! that covered part of the range later or earlier, which needed a writer
//! that stamped this VMA or ran entirely before it existed. A table shared
//! with a neighbour VMA could be created by the neighbour's fault after an
//! munmap of ours walked past its PMD slot, and then no lock would order
//! the two: we fall back there.
//!
//! Checked by `loom_tests/spec_fault.rs` (mprotect, a split, munmap,
//! mremap, and VMA reuse: `spec_fault_vs_vma_reuse`, where mmap(MAP_FIXED,
//! PROT_NONE) over the VMA's first page frees the object and takes it back
//! at once for the new VMA at the same address, under a speculative
//! attempt that looked it up before) and `tests/stress_spec.rs` (splits,
//! fork, DONTNEED under faults).
//!
//! # Shared-memory writes left on the path
//!
//! | write | where | why it is not contended |
//! |-------|-------|-------------------------|
//! | epoch pin / unpin | crossbeam's per-thread record; a global-epoch advance every 128 pins | the record is the thread's own line; the advance is amortized |
//! | `note_cpu` | the TLB's per-CPU slot, written once then only read | per-CPU line |
//! | budget charge | the per-CPU stock; the shared count once per 256 frames | per-CPU line; the shared line is written once per 1 MiB charged |
//! | frame take | the per-CPU cache, its mutex and counts; the frame's refcount (a plain store); the global pool's lock once per 512 never-used frames (or 32 freed ones) | per-CPU line; never-used frames come in per-CPU spans of up to 512, so refcounts of one line belong to one CPU |
//! | frame zeroing | the frame | private until installed |
//! | PTE lock, entry, `used` | the table's 128-byte-aligned header and its entry | shared only by threads faulting in the same 2 MiB span (the `interleaved` workload measures that case) |
//! | stats | the per-CPU counter slot | per-CPU line |
//!
//! Nothing is written in the VMA, the tree or the mm sequence. Finding
//! the CPU for the per-CPU slots writes nothing: it reads the thread's
//! rseq area ([`crate::percpu`]).
//!
//! # Locking
//!
//! No lock but the PTE table's, taken once to install; the VMA is neither
//! read-locked nor referenced (its stamp is validated instead). Order:
//! [`crate::mm`].

use crate::addr::{page_align_down, Range, PMD_SIZE};
use crate::mm::{Access, AddressSpace};
use crate::phys::Pfn;
use crate::pt::{CheckedInstallError, Pte, PteFlags};
use crate::stats::Event;
use crate::sync::{fence, Ordering};
use crate::vma::VmFlags;

/// The span of the PTE tables a speculative fault may install into for a
/// VMA over `range`: the whole 2 MiB spans inside it (see "Tables" in the
/// module docs). The one rule both sides follow: the fault uses no other
/// table, and `Edit::lock` sweeps these tables' locks after stamping.
pub(crate) fn tables_of(range: Range) -> Option<Range> {
    let start = range.start.checked_add(PMD_SIZE - 1)? & !(PMD_SIZE - 1);
    let end = range.end & !(PMD_SIZE - 1);
    (start < end).then(|| Range::new(start, end))
}

/// One speculative attempt. `Err(reason)`: nothing changed, run the
/// per-VMA path.
pub(crate) fn handle(mm: &AddressSpace, addr: u64, access: Access) -> Result<(), Event> {
    let g = mm.tree.pin();
    let Some((_, v)) = mm.tree.find(addr, &g) else {
        return Err(Event::spec_abort_lookup);
    };
    let v = *v;
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
    if !access.allowed_by(flags) {
        return Err(Event::spec_abort_lookup);
    }
    // A missing page of a registered VMA is the handler's: only the
    // locked paths deliver userfaults.
    if !v.is_anonymous()
        || (access == Access::Write && !v.has_anon_vma())
        || flags.contains(VmFlags::UFFD_MISSING)
    {
        return Err(Event::spec_abort_needs_more);
    }
    let page = page_align_down(addr);
    if !tables_of(range).is_some_and(|t| t.contains(page)) {
        return Err(Event::spec_abort_table);
    }
    // The tree pin above covers the walk too; this nested pin only names
    // the page table's reclaimer. One walk: the install goes to the table
    // read here (see `PteSlot` for why a table unlinked meanwhile is safe).
    let g = mm.pt.pin();
    let slot = mm.pt.slot(page, &g).ok_or(Event::spec_abort_table)?;
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
    let r = slot.install_checked(new, || {
        // Seqlock read side: the field loads above happen before the
        // re-read (pairs with the Release fence after the writer's stamp).
        fence(Ordering::Acquire);
        v.lock.stamp() == stamp
    });
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
