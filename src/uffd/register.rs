//! Registration: `UFFDIO_REGISTER`, `UFFDIO_UNREGISTER` and the release of
//! the last handle, as VMA edits with mprotect's split and merge rules.
//!
//! A registration sets the VMA's `UFFD_*` flags and its context pointer
//! together; VMAs registered to different contexts never merge (see
//! `mm/merge.rs`), and clearing a registration merges the range back with
//! its neighbours where Linux would.
//!
//! # Locking
//!
//! Each call is one mmap_lock writer (`Edit`); waiters are woken under it,
//! after the VMAs changed (a waiter that retries then finds the VMA
//! unregistered, or waits for the writer on the mmap_lock). Order:
//! [`crate::mm`].

use super::{validate_range, Uffd, UffdCtx, UFFD_FLAGS};
use crate::addr::Range;
use crate::error::{Error, Result};
use crate::mm::edit::Edit;
use crate::mm::AddressSpace;
use crate::sync::Arc;
use crate::vma::VmFlags;
use bitflags::bitflags;

bitflags! {
    /// Registration modes (`UFFDIO_REGISTER_MODE_*`, Linux's values).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct RegisterMode: u64 {
        /// Faults on pages that are not there (`MODE_MISSING`).
        const MISSING = 1 << 0;
        /// Writes to write-protected pages (`MODE_WP`).
        const WRITE_PROTECT = 1 << 1;
        /// Faults on pages the shared object has but this mapping does not
        /// map yet (`MODE_MINOR`): memfd and shared anonymous memory only.
        const MINOR = 1 << 2;
    }
}

bitflags! {
    /// The ioctls a registered range supports (the `ioctls` field
    /// `UFFDIO_REGISTER` returns, Linux's bit numbers). aspace provides no
    /// `UFFDIO_MOVE` or `UFFDIO_POISON`, so it never reports them.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct IoctlFlags: u64 {
        /// [`Uffd::wake`].
        const WAKE = 1 << 0x02;
        /// [`Uffd::copy`].
        const COPY = 1 << 0x03;
        /// [`Uffd::zeropage`].
        const ZEROPAGE = 1 << 0x04;
        /// [`Uffd::write_protect`] and [`Uffd::remove_write_protection`]
        /// (ranges registered with `WRITE_PROTECT`).
        const WRITE_PROTECT = 1 << 0x06;
        /// [`Uffd::continue_`] (ranges registered with `MINOR`).
        const CONTINUE = 1 << 0x07;
    }
}

impl RegisterMode {
    fn vm_flags(self) -> VmFlags {
        let mut f = VmFlags::empty();
        if self.contains(Self::MISSING) {
            f |= VmFlags::UFFD_MISSING;
        }
        if self.contains(Self::WRITE_PROTECT) {
            f |= VmFlags::UFFD_WP;
        }
        if self.contains(Self::MINOR) {
            f |= VmFlags::UFFD_MINOR;
        }
        f
    }
}

impl Uffd<'_> {
    /// Registers `[addr, addr + len)` for missing-page faults
    /// ([`register_with_mode`](Self::register_with_mode) with `MISSING`).
    pub fn register(&self, addr: u64, len: u64) -> Result<IoctlFlags> {
        self.register_with_mode(addr, len, RegisterMode::MISSING)
    }

    /// Registers the VMAs in `[addr, addr + len)` with `mode`
    /// (`UFFDIO_REGISTER`): VMAs are split at the range's ends and merged
    /// as mprotect does; holes between them are skipped. A VMA already
    /// registered here with every mode asked for is left alone; otherwise
    /// its modes become `mode`. Returns the ioctls the range supports.
    ///
    /// Errors, in Linux's order: `EINVAL` for a bad range (unaligned, zero
    /// length, below `mmap_min_addr`, past the task size), an empty or
    /// unknown `mode`, no VMA in the range, `MINOR` on a VMA without a
    /// shared object, or a droppable VMA; `EPERM` for a VMA that may never
    /// be written (no `MAYWRITE`); `EBUSY` for a VMA registered to another
    /// handle; `ENOMEM` if a split passes `max_map_count` (the VMAs before
    /// it stay registered, as in Linux).
    pub fn register_with_mode(
        &self,
        addr: u64,
        len: u64,
        mode: RegisterMode,
    ) -> Result<IoctlFlags> {
        let mm = self.mm();
        let r = validate_range(mm, addr, len)?;
        if mode.is_empty() || !RegisterMode::all().contains(mode) {
            return Err(Error::Inval);
        }
        let want = mode.vm_flags();
        let ctx = self.ctx();
        let mut ed = Edit::begin(mm);
        let vmas = ed.vmas_in(r);
        if vmas.is_empty() {
            return Err(Error::Inval);
        }
        for v in &vmas {
            let f = v.flags();
            if f.contains(VmFlags::DROPPABLE)
                || (mode.contains(RegisterMode::MINOR) && !v.has_shmem())
            {
                return Err(Error::Inval);
            }
            if !f.contains(VmFlags::MAYWRITE) {
                return Err(Error::Perm);
            }
            if !v.uffd_ptr().is_null() && v.uffd_ptr() != Arc::as_ptr(ctx) {
                return Err(Error::Busy);
            }
        }
        for_each_part(&mut ed, r, |ed, v, s, e| {
            if v.uffd_ptr() == Arc::as_ptr(ctx) && v.flags().contains(want) {
                return Ok(v.end());
            }
            let flags = (v.flags() - UFFD_FLAGS) | want;
            let cur = ed.modify_uffd(v, s, e, flags, v.name_arc(), Some(ctx.clone()))?;
            Ok(cur.end())
        })?;
        let mut ioctls = IoctlFlags::all();
        if !mode.contains(RegisterMode::MINOR) {
            ioctls -= IoctlFlags::CONTINUE;
        }
        if !mode.contains(RegisterMode::WRITE_PROTECT) {
            ioctls -= IoctlFlags::WRITE_PROTECT;
        }
        Ok(ioctls)
    }

    /// Unregisters the VMAs in `[addr, addr + len)` (`UFFDIO_UNREGISTER`):
    /// they are split and merged back as mprotect does, their pages lose
    /// write-protection (and become writable where the VMA and the page
    /// allow), and the faults waiting in the range wake and run again as
    /// ordinary faults (a missing page fills with zeros, or the object's
    /// page), as Linux's do.
    ///
    /// Errors: `EINVAL` for a bad range, no VMA in it, or a VMA registered
    /// to another handle; `ENOMEM` if a split passes `max_map_count`: the
    /// VMAs before it are unregistered and their waiters woken, the rest
    /// stay registered and their faults keep waiting for the handler.
    pub fn unregister(&self, addr: u64, len: u64) -> Result<()> {
        let mm = self.mm();
        let r = validate_range(mm, addr, len)?;
        let ctx = self.ctx();
        let mut ed = Edit::begin(mm);
        let vmas = ed.vmas_in(r);
        if vmas.is_empty() {
            return Err(Error::Inval);
        }
        if vmas
            .iter()
            .any(|v| !v.uffd_ptr().is_null() && v.uffd_ptr() != Arc::as_ptr(ctx))
        {
            return Err(Error::Inval);
        }
        let (done, res) = unregister_in(&mut ed, r, ctx);
        // The waiters of the unregistered part retry as ordinary faults;
        // those of a VMA that a failed split left registered keep waiting.
        ctx.wake(Range::new(r.start, done));
        res
    }
}

/// Clears `ctx`'s registrations in `r`, restoring write access to
/// write-protected pages. Returns how far it got: `r.end`, or on `ENOMEM`
/// the end of the last part it unregistered (`r.start` if none).
fn unregister_in(ed: &mut Edit<'_>, r: Range, ctx: &Arc<UffdCtx>) -> (u64, Result<()>) {
    let mm = ed.mm();
    let mut done = r.start;
    let res = for_each_part(ed, r, |ed, v, s, e| {
        if v.uffd_ptr() != Arc::as_ptr(ctx) {
            return Ok(v.end());
        }
        if v.flags().contains(VmFlags::UFFD_WP) {
            super::wp::unprotect(mm, Range::new(s, e), v.flags(), None);
        }
        let flags = v.flags() - UFFD_FLAGS;
        let cur = ed.modify_uffd(v, s, e, flags, v.name_arc(), None)?;
        done = e;
        Ok(cur.end())
    });
    (if res.is_ok() { r.end } else { done }, res)
}

/// Runs `f(ed, vma, s, e)` for each VMA meeting `r`, with `[s, e)` its
/// part of `r`, in address order; `f` returns the end of what it covered
/// (an edit may merge the part with the VMA after it). The VMAs are looked
/// up again after each edit, as mprotect does.
fn for_each_part(
    ed: &mut Edit<'_>,
    r: Range,
    mut f: impl FnMut(&mut Edit<'_>, crate::vma::VmaRef, u64, u64) -> Result<u64>,
) -> Result<()> {
    let mut at = r.start;
    while at < r.end {
        let Some(v) = ed.find_after(at) else {
            break;
        };
        if v.start() >= r.end {
            break;
        }
        let s = v.start().max(at);
        let e = v.end().min(r.end);
        at = f(ed, v, s, e)?.max(e);
    }
    Ok(())
}

/// The last handle of `ctx` is gone (Linux's `userfaultfd_release`): its
/// VMAs are unregistered, then the waiting faults wake and retry as
/// ordinary faults. No fault can queue in between: it would need a VMA
/// still registered, under a hold that the unregistering writer waited
/// out.
pub(super) fn release(mm: &AddressSpace, ctx: &Arc<UffdCtx>) {
    let mut ed = Edit::begin(mm);
    // Unregistering only merges and splits at VMA boundaries, so no split
    // (and no ENOMEM) happens here.
    let _ = unregister_in(&mut ed, Range::new(0, mm.cfg.task_size), ctx);
    ctx.release();
}
