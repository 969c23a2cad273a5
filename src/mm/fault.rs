//! The page-fault path.
//!
//! Per-VMA mode (Linux 6.4+): pin the epoch, find the VMA in the tree
//! without locks, read-trylock it, re-validate it (the object may have been
//! recycled for another range or address space), check the access, then
//! walk and populate the page table, all without the mmap_lock. Whatever
//! cannot finish that way — the VMA is write-locked, the lookup raced a
//! writer, the VMA first needs an anon_vma and the mmap_lock cannot be
//! try-locked — is retried under the mmap_lock read side, which also
//! handles stack growth. Every outcome is counted in [`crate::Stats`].
//!
//! Frames: a read fault on private anonymous memory maps the shared zero
//! page (no frame, no anon_vma, like Linux); the first write gives the VMA
//! its anon_vma (first of all: a write that then fails keeps it, as in
//! Linux) and the page a zeroed frame; a write to a read-only entry
//! of a writable VMA reuses the frame if this entry holds its only
//! reference, else copies it (copy-on-write).
//!
//! Huge pages (`mm::thp`): in an eligible 2 MiB span whose PMD slot is
//! empty, a fault maps a huge frame (a write) or the huge zero page (a
//! read) with one PMD leaf; a write to a read-only leaf replaces the huge
//! zero page with a huge frame, reuses an exclusive page whole, or splits
//! the leaf and goes on as a 4 KiB copy-on-write.
//!
//! Object-backed VMAs ([`crate::Memfd`], shared anonymous memory): a page
//! at or past the object's end is SIGBUS, checked again under the PTE
//! lock against a racing shrink (`vma::mappings`); a shared mapping maps
//! the object's page (allocated on first touch, and for a file object
//! read from the host file then, a read error being SIGBUS; a shared
//! mapping that may write it marks it dirty for writeback, see
//! [`crate::file`]); a private one maps it
//! read-only and copies it into an anonymous frame on the first write,
//! as Linux's private file mappings do.
//!
//! Userfaults ([`crate::uffd`]): in a VMA with a `UFFD_*` flag, an empty
//! entry the handler must fill, or a write to an entry write-protected for
//! it, is queued for the handler under the VMA hold; the fault then drops
//! every lock, sleeps until woken, and runs again from the top. An
//! unregistered VMA pays one flag test.
//!
//! # Locking
//!
//! The per-VMA path holds one VMA read lock, then PTE-table locks; it only
//! try-locks the mmap_lock (for a first anon_vma), because a writer may
//! be waiting for that VMA. The fallback holds the mmap_lock read side
//! (with range writers: the neighbourhood of the VMA, shared, see
//! `range_read`).
//! The whole order is in [`crate::mm`].

use super::cow::wp_fault;
use crate::addr::page_align_down;
use crate::error::FaultError;
use crate::mm::anon_vma::anon_vma_prepare;
use crate::mm::soft_dirty;
use crate::mm::{Access, AddressSpace, FaultLocking};
use crate::phys::Pfn;
use crate::pt::{CheckedInstallError, Pte, PteFlags};
use crate::stats::Event;
use crate::uffd::{self, Waiter};
use crate::vma::lock::ReadLockError;
use crate::vma::{Shmem, VmFlags, Vma, VmaRef};

/// Lookups that found a detached VMA before the per-VMA path gives up.
const MAX_REWALKS: u32 = 8;

/// Why a step could not finish.
pub(crate) enum Step {
    /// Retry under the mmap_lock; the event says why.
    Retry(Event),
    /// The fault fails.
    Fail(FaultError),
    /// A userfault handler must resolve the page: drop every lock, wait,
    /// then run the whole fault again (Linux's `VM_FAULT_RETRY`).
    Wait(Waiter),
}

/// Why an attempt at the whole fault stopped.
enum Stop {
    /// The fault fails (already counted).
    Fail(FaultError),
    /// Wait for a userfault handler with no lock held, then retry.
    Wait(Waiter),
}

fn count_failure(mm: &AddressSpace, e: FaultError) -> FaultError {
    mm.stats.inc(match e {
        FaultError::NoMapping => Event::segv_maperr,
        FaultError::AccessDenied => Event::segv_accerr,
        FaultError::Bus | FaultError::Alignment | FaultError::HandlerGone => Event::sigbus,
        FaultError::OutOfMemory => Event::fault_oom,
    });
    e
}

/// The fault entry point.
pub(crate) fn handle(mm: &AddressSpace, addr: u64, access: Access) -> Result<(), FaultError> {
    mm.tlb.note_cpu();
    if addr >= mm.cfg.task_size {
        return Err(count_failure(mm, FaultError::NoMapping));
    }
    loop {
        match attempt(mm, addr, access) {
            Ok(()) => return Ok(()),
            Err(Stop::Fail(e)) => return Err(e),
            Err(Stop::Wait(w)) => w.wait(mm).map_err(|e| count_failure(mm, e))?,
        }
    }
}

/// One run of the fault through its paths.
fn attempt(mm: &AddressSpace, addr: u64, access: Access) -> Result<(), Stop> {
    if mm.cfg.fault_locking == FaultLocking::Speculative {
        match crate::mm::spec_fault::handle(mm, addr, access) {
            Ok(()) => return Ok(()),
            Err(why) => mm.stats.inc(why),
        }
    }
    if mm.cfg.fault_locking != FaultLocking::MmapLock {
        match per_vma(mm, addr, access) {
            Ok(r) => return r,
            Err(why) => mm.stats.inc(why),
        }
    }
    under_mmap_lock(mm, addr, access)
}

/// The per-VMA attempt: `Err(reason)` means "retry under the mmap_lock".
fn per_vma(mm: &AddressSpace, addr: u64, access: Access) -> Result<Result<(), Stop>, Event> {
    // One epoch pin for the whole fault: the page-table walk below pins
    // again, and a nested pin is only a counter increment (a fresh one
    // costs a full fence).
    let g = mm.tree.pin();
    let vma = lock_vma_under_rcu(mm, addr, &g)?;
    if !access.allowed_by(vma.flags()) {
        vma.lock.read_unlock();
        return Ok(Err(Stop::Fail(count_failure(mm, FaultError::AccessDenied))));
    }
    let r = do_fault(mm, &vma, addr, access, true);
    vma.lock.read_unlock();
    match r {
        Ok(()) => {
            mm.stats.inc(Event::fault_per_vma);
            Ok(Ok(()))
        }
        Err(Step::Retry(why)) => Err(why),
        Err(Step::Fail(e)) => Ok(Err(Stop::Fail(count_failure(mm, e)))),
        Err(Step::Wait(w)) => Ok(Err(Stop::Wait(w))),
    }
}

/// Finds and read-locks the VMA covering `addr` without the mmap_lock
/// (Linux's `lock_vma_under_rcu`).
fn lock_vma_under_rcu(
    mm: &AddressSpace,
    addr: u64,
    g: &crate::reclaim::Guard,
) -> Result<VmaRef, Event> {
    let seq = mm.mmap_lock.seq();
    let mut rewalks = 0;
    let vma = loop {
        let Some((_, v)) = mm.tree.find(addr, g) else {
            return Err(Event::retry_no_vma);
        };
        let v = *v;
        match v.lock.try_read(seq) {
            Ok(()) => break v,
            Err(ReadLockError::Detached) => {
                // Removed under us: the tree has changed, walk it again.
                mm.stats.inc(Event::retry_detached);
                rewalks += 1;
                if rewalks >= MAX_REWALKS {
                    return Err(Event::retry_no_vma);
                }
            }
            Err(ReadLockError::WriteLocked) => return Err(Event::retry_write_locked),
            Err(ReadLockError::Overflow) => return Err(Event::retry_overflow),
        }
    };
    // The object may have been recycled between the lookup and the lock:
    // it must still belong to this address space and cover `addr`.
    if vma.mm_id() != mm.id || !vma.range().contains(addr) {
        vma.lock.read_unlock();
        return Err(Event::retry_revalidate);
    }
    Ok(vma)
}

/// The fault under the mmap_lock read side (the MmapLock mode, and the
/// fallback of the per-VMA mode). Grows stacks.
fn under_mmap_lock(mm: &AddressSpace, addr: u64, access: Access) -> Result<(), Stop> {
    under_mmap_lock_inner(mm, addr, access).map_err(|e| match e {
        Stop::Fail(e) => Stop::Fail(count_failure(mm, e)),
        w => w,
    })
}

/// [`under_mmap_lock`] with failures not yet counted.
fn under_mmap_lock_inner(mm: &AddressSpace, addr: u64, access: Access) -> Result<(), Stop> {
    loop {
        // In range mode: only the VMA's neighbourhood, shared (`range_read`).
        let (st, g) = crate::mm::range_read::read_fault(mm, addr);
        let Some((_, v)) = mm.tree.find_after(addr, &g) else {
            return Err(Stop::Fail(FaultError::NoMapping));
        };
        let v = *v;
        if v.start() > addr {
            if !v.flags().contains(VmFlags::GROWSDOWN) {
                return Err(Stop::Fail(FaultError::NoMapping));
            }
            drop(g);
            drop(st);
            if !crate::mm::stack::expand_stack(mm, addr) {
                return Err(Stop::Fail(FaultError::NoMapping));
            }
            continue;
        }
        if !access.allowed_by(v.flags()) {
            return Err(Stop::Fail(FaultError::AccessDenied));
        }
        let r = do_fault(mm, &v, addr, access, false);
        drop(st);
        return match r {
            Ok(()) => {
                mm.stats.inc(Event::fault_mmap_lock);
                Ok(())
            }
            Err(Step::Fail(e)) => Err(Stop::Fail(e)),
            Err(Step::Wait(w)) => Err(Stop::Wait(w)),
            // Under the mmap_lock nothing asks for a retry; be safe anyway.
            Err(Step::Retry(_)) => continue,
        };
    }
}

/// Populates the page of `addr` in `vma` for `access` (already checked:
/// by the VMA's access rights, or by a forced access's rules,
/// `mm/forced.rs`, which write into a VMA that is not writable).
pub(crate) fn do_fault(
    mm: &AddressSpace,
    vma: &Vma,
    addr: u64,
    access: Access,
    vma_locked: bool,
) -> Result<(), Step> {
    let page = page_align_down(addr);
    let g = mm.pt.pin();
    let flags = vma.flags();
    for _ in 0..4 {
        let pte = mm.pt.lookup(page, &g);
        if pte.is_present() {
            if access != Access::Write || pte.is_writable() {
                mm.stats.inc(Event::fault_spurious);
                return Ok(());
            }
            // A write to a read-only 2 MiB page: the huge zero page gets
            // a huge frame, an exclusive page is reused whole, else it is
            // split and 4 KiB copied, as Linux does (`mm::thp`).
            if let Some(leaf) = mm.pt.huge_at(page, &g) {
                // Write-protected for a handler: it gets the fault with
                // the leaf whole (Linux's `wp_huge_pmd`), and its
                // un-protection of the whole leaf keeps it whole; an
                // async context splits it (Linux too) and clears the
                // bit of the 4 KiB page below.
                if leaf.flags().contains(PteFlags::UFFD_WP)
                    && flags.contains(VmFlags::UFFD_WP)
                    && !uffd::wp_is_async(vma)
                {
                    uffd::wp_fault(mm, vma, page, pte, &g)?;
                    continue;
                }
                if !super::thp::huge_wp_fault(mm, vma, page, leaf, &g) {
                    mm.pt.split_huge(page, &g);
                }
                continue;
            }
            if pte.flags().contains(PteFlags::UFFD_WP) && flags.contains(VmFlags::UFFD_WP) {
                // Write-protected for a handler: queue the fault, or (an
                // async context) clear the bit and go on as a plain
                // write fault.
                uffd::wp_fault(mm, vma, page, pte, &g)?;
                continue;
            }
            if wp_fault(mm, vma, page, pte, vma_locked, &g)? {
                return Ok(());
            }
            continue;
        }
        // A write to an empty entry of a private VMA prepares its anon_vma
        // before anything else can fail (Linux's do_anonymous_page and
        // do_cow_fault): a store past an object's end, or one handed to a
        // userfault handler, still gives the VMA its anon_vma, which
        // decides its later merges.
        if access == Access::Write && !flags.contains(VmFlags::SHARED) {
            anon_vma_prepare(mm, vma, vma_locked).map_err(Step::Retry)?;
        }
        // The one test an unregistered VMA pays for userfaults here.
        if flags.intersects(VmFlags::UFFD_MISSING | VmFlags::UFFD_MINOR) {
            uffd::missing_fault(mm, vma, page, access)?;
        }
        // A 2 MiB page where the VMA, the mode and the empty PMD slot
        // allow one (`mm::thp`).
        if super::thp::huge_fault(mm, vma, addr, access, &g)? {
            return Ok(());
        }
        // SAFETY: `do_fault`'s caller holds `vma` (its read lock, or the
        // mmap_lock read side) until after the fault.
        let shm = unsafe { vma.shmem() };
        let new = if let Some(shm) = shm {
            let idx = vma.pgoff_of(page);
            if idx >= shm.npages() {
                return Err(Step::Fail(FaultError::Bus));
            }
            // A reference of our own: a shrink may drop the object's. A
            // shared mapping that may store to the page dirties it for a
            // file object's writeback.
            let writer = flags.contains(VmFlags::SHARED | VmFlags::MAYWRITE);
            let pfn = shm.get_frame(idx, writer).map_err(|e| {
                Step::Fail(if idx >= shm.npages() {
                    FaultError::Bus
                } else {
                    e
                })
            })?;
            if flags.contains(VmFlags::SHARED) {
                Pte::new(pfn, soft_dirty::shared_fault_flags(flags, access))
            } else if access != Access::Write {
                // A private mapping reads the object's page until its
                // first write (the entry stays read-only).
                Pte::new(pfn, PteFlags::from(flags) - PteFlags::WRITE)
            } else {
                // The first write copies the object's page (do_cow_fault),
                // readable while we hold our reference.
                let copy = mm.frames.alloc_uninit();
                if let Some(copy) = copy {
                    mm.frames.copy(copy, pfn);
                }
                mm.frames.put(pfn);
                let copy = copy.ok_or(Step::Fail(FaultError::OutOfMemory))?;
                Pte::new(copy, PteFlags::from(flags) | soft_dirty::WRITTEN)
            }
        } else if access != Access::Write {
            Pte::new(Pfn::ZERO_PAGE, PteFlags::from(flags) - PteFlags::WRITE)
        } else {
            let pfn = alloc_frame(mm)?;
            Pte::new(pfn, PteFlags::from(flags) | soft_dirty::WRITTEN)
        };
        match install(mm, vma, shm, page, new, &g) {
            Ok(()) => return Ok(()),
            Err(InstallError::PastEnd) => return Err(Step::Fail(FaultError::Bus)),
            // Inside a VMA every address translates: no table means none
            // could be had within the memory budget.
            Err(InstallError::NoTable) => return Err(Step::Fail(FaultError::OutOfMemory)),
            // A racing fault installed the page first: look again, even if
            // a DONTNEED or a zap has emptied the entry since (that is not
            // "no mapping": the VMA we hold still covers the page).
            Err(InstallError::Taken) => {}
        }
    }
    mm.stats.inc(Event::fault_spurious);
    Ok(())
}

/// Why [`install`] installed nothing.
pub(crate) enum InstallError {
    /// The entry is taken (a racing fault or fill got there first).
    Taken,
    /// No page table could be had within the memory budget.
    NoTable,
    /// The page is at or past its object's end (a shrink raced us).
    PastEnd,
}

/// Installs `new` at `page` of `vma`, whose object (if any) is `shm`, for
/// a fault or a userfault fill; on failure drops the entry's frame
/// reference. An object's page is installed only if it is still below
/// the object's end, re-checked under the PTE lock: a shrink that lowered
/// the end zaps this table after us, or we see it (the argument is in
/// `vma::mappings`).
pub(crate) fn install(
    mm: &AddressSpace,
    vma: &Vma,
    shm: Option<&Shmem>,
    page: u64,
    new: Pte,
    g: &crate::reclaim::Guard,
) -> Result<(), InstallError> {
    let r = match shm {
        Some(shm) => {
            let idx = vma.pgoff_of(page);
            let expedited = crate::sync::asymmetric::expedited();
            let end_ok = || {
                crate::sync::asymmetric::light(expedited);
                idx < shm.npages()
            };
            mm.pt
                .install_checked_in(page, new, g, true, end_ok)
                .map_err(|e| match e {
                    CheckedInstallError::Invalid => InstallError::PastEnd,
                    CheckedInstallError::Taken(_) => InstallError::Taken,
                    CheckedInstallError::NoTable => InstallError::NoTable,
                })
        }
        None => mm.pt.install(page, new, g).map_err(|existing| {
            if existing == Pte::NONE {
                InstallError::NoTable
            } else {
                InstallError::Taken
            }
        }),
    };
    if r.is_err() && !new.pfn().is_zero_page() {
        mm.frames.put(new.pfn());
    }
    r
}

pub(super) fn alloc_frame(mm: &AddressSpace) -> Result<Pfn, Step> {
    mm.frames.alloc().ok_or(Step::Fail(FaultError::OutOfMemory))
}

impl AddressSpace {
    /// The page-fault entry point: resolves a fault at `addr` for `access`
    /// as the kernel would (per-VMA lock first, mmap_lock fallback).
    pub fn fault(&self, addr: u64, access: Access) -> Result<(), FaultError> {
        handle(self, addr, access)
    }
}
