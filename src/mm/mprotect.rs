//! mprotect: per-VMA changes with Linux's partial effects.
//!
//! # Locking
//!
//! The mmap_lock write side through `Edit`, then PTE-table locks for the
//! entries it changes; one TLB flush before the lock is released. Order:
//! [`crate::mm`].

use super::edit::{Edit, Reach};
use super::{AddressSpace, Prot};
use crate::addr::{is_page_aligned, page_align_up, Range};
use crate::error::{Error, Result};
use crate::pt::{Pte, PteFlags};
use crate::vma::{VmFlags, VmaRef};

impl AddressSpace {
    /// Changes the protection of `[addr, addr + len)`, like `mprotect(2)`.
    ///
    /// VMAs are split and merged as Linux does. Over a hole the VMAs before
    /// the hole are changed and the call then fails with `ENOMEM`, also as
    /// Linux does. Errors: `EINVAL` for an unaligned address, unknown bits
    /// or both GROWSDOWN and GROWSUP (GROWSUP does not exist on x86-64);
    /// `ENOMEM` for an overflowing range, a range starting in a hole, or a
    /// split past `max_map_count`; `EACCES` for a protection the mapping
    /// may not get.
    ///
    /// A private locked VMA that becomes writable is populated for writing
    /// (Linux breaks copy-on-write at once, so that locked memory does not
    /// fault later).
    pub fn mprotect(&self, addr: u64, len: u64, prot: Prot) -> Result<()> {
        let mut populate = Vec::new();
        let res = self.mprotect_locked(addr, len, prot, &mut populate);
        // After the mmap_lock is released, as faults need it; the pieces
        // already have their anon_vma, as in Linux.
        for r in populate {
            self.populate(r, VmFlags::READ | VmFlags::WRITE);
        }
        res
    }

    /// [`mprotect`](Self::mprotect) under the mmap_lock; the ranges to
    /// populate go to `populate`.
    fn mprotect_locked(
        &self,
        addr: u64,
        len: u64,
        prot: Prot,
        populate: &mut Vec<Range>,
    ) -> Result<()> {
        let grows = prot & (Prot::GROWSDOWN | Prot::GROWSUP);
        if grows == (Prot::GROWSDOWN | Prot::GROWSUP) {
            return Err(Error::Inval);
        }
        if !is_page_aligned(addr) {
            return Err(Error::Inval);
        }
        if len == 0 {
            return Ok(());
        }
        // Linux's `end <= start` after PAGE_ALIGN: a length that rounds up
        // past u64::MAX, or an end that does.
        let Some(end) = page_align_up(len).and_then(|l| addr.checked_add(l)) else {
            return Err(Error::NoMem);
        };
        if !Prot::all().contains(prot) {
            return Err(Error::Inval);
        }
        let want = VmFlags::from_prot_in(self, prot);
        let mut ed = if grows.is_empty() {
            // `addr < end` (a zero length returned above).
            Edit::begin_range(self, Range::new(addr, end), Reach::Vmas)
        } else {
            Edit::begin(self)
        };
        let Some(mut vma) = ed.find_after(addr) else {
            return Err(Error::NoMem);
        };
        let mut start = addr;
        if grows.contains(Prot::GROWSDOWN) {
            if vma.start() >= end {
                return Err(Error::NoMem);
            }
            start = vma.start();
            if !vma.flags().contains(VmFlags::GROWSDOWN) {
                return Err(Error::Inval);
            }
        } else {
            if vma.start() > start {
                return Err(Error::NoMem);
            }
            if grows.contains(Prot::GROWSUP) {
                // x86-64 has no VM_GROWSUP mappings.
                return Err(Error::Inval);
            }
        }
        let mut nstart = start;
        let mut gather = ed.gather();
        loop {
            let old = vma.flags();
            let newflags = old.difference(VmFlags::ACCESS | VmFlags::EXEC_ONLY) | want;
            // New access bits need the matching MAY bits (VM_MAY* = VM_* << 4).
            let may = VmFlags::from_bits_truncate((newflags.bits() >> 4) & VmFlags::ACCESS.bits());
            if !newflags
                .intersection(VmFlags::ACCESS)
                .difference(may)
                .is_empty()
            {
                return Err(Error::AccessDenied);
            }
            let tmp = vma.end().min(end);
            let cur = Self::mprotect_fixup(&mut ed, vma, nstart, tmp, newflags)?;
            // A private, locked (not on fault) VMA made writable.
            let lock = VmFlags::WRITE | VmFlags::SHARED | VmFlags::LOCKED | VmFlags::LOCKONFAULT;
            if old & lock == VmFlags::LOCKED && newflags.contains(VmFlags::WRITE) {
                ed.lock(cur);
                let _ = crate::mm::anon_vma::anon_vma_prepare(self, &cur, false);
                populate.push(Range::new(nstart, tmp));
            }
            self.change_protection(Range::new(nstart, tmp), cur, &mut gather);
            // A merge may have carried the changed VMA past `tmp`.
            nstart = tmp.max(cur.end());
            if nstart >= end {
                break;
            }
            match ed.find_after(nstart) {
                Some(next) if next.start() == nstart => vma = next,
                _ => return Err(Error::NoMem),
            }
        }
        gather.flush();
        Ok(())
    }

    /// Linux's `mprotect_fixup`: accounting flag, then merge or split.
    fn mprotect_fixup(
        ed: &mut Edit<'_>,
        vma: VmaRef,
        s: u64,
        e: u64,
        mut newflags: VmFlags,
    ) -> Result<VmaRef> {
        let old = vma.flags();
        if newflags == old {
            return Ok(vma);
        }
        if newflags.contains(VmFlags::WRITE) {
            if !old.intersects(
                VmFlags::ACCOUNT | VmFlags::WRITE | VmFlags::SHARED | VmFlags::NORESERVE,
            ) {
                newflags |= VmFlags::ACCOUNT;
            }
        } else if old.contains(VmFlags::ACCOUNT) && vma.is_anonymous() && !vma.has_anon_vma() {
            // Nothing was charged for pages yet: drop the charge.
            newflags.remove(VmFlags::ACCOUNT);
        }
        ed.modify_flags(vma, s, e, newflags)
    }

    /// Rewrites the present entries of `r` for the flags of `vma`; pages
    /// lose write access at once, and gain it only where the frame is the
    /// VMA's own (not the zero page, not shared copy-on-write).
    fn change_protection(&self, r: Range, vma: VmaRef, gather: &mut crate::tlb::Gather<'_>) {
        let flags = vma.flags();
        let shared = flags.contains(VmFlags::SHARED);
        let g = self.pt.pin();
        let frames = &self.frames;
        self.pt.change_range(r, &g, |va, pte| {
            let mut f = PteFlags::from(flags);
            // A page write-protected for a userfault handler stays so
            // (can_change_pte_writable), and keeps its bit.
            if f.contains(PteFlags::WRITE)
                && (pte.flags().contains(PteFlags::UFFD_WP)
                    || !shared && (pte.pfn().is_zero_page() || frames.refcount(pte.pfn()) != 1))
            {
                f.remove(PteFlags::WRITE);
            }
            // A clean entry after a soft-dirty reset stays write-protected,
            // so that its next write faults and is recorded.
            if crate::mm::soft_dirty::needs_write_fault(flags, pte.flags()) {
                f.remove(PteFlags::WRITE);
            }
            f |= pte.flags() & crate::mm::soft_dirty::KEPT;
            let new = Pte::new(pte.pfn(), f);
            if new != pte {
                gather.add_page(va);
            }
            new
        });
    }
}
