//! Write-protection for handlers (`UFFDIO_WRITEPROTECT`): the
//! [`PteFlags::UFFD_WP`] bit on present entries, which makes a write fault
//! even where the VMA allows it.
//!
//! Protecting takes write access away under each PTE table's lock and
//! flushes the TLB (and so every translator's cached writable entry,
//! through the generation the flush advances) before returning: after
//! [`Uffd::write_protect`] returns, no store through an old translation
//! is in flight. Removing the protection gives write access back only
//! where an ordinary fault would have kept it (a shared object's page in
//! a writable mapping, or a private page whose frame this entry alone
//! references), as Linux's `can_change_pte_writable` decides; the rest
//! stay read-only and copy on write as usual. Entries keep the bit across
//! mprotect (never made writable by it) and in the parent of a fork; a
//! fork child, an mremap'd copy and an unregistered range lose it.
//!
//! A 2 MiB page (PMD leaf) wholly inside the range is protected, and
//! un-protected, as one leaf (`pt::range`'s rewrite of a leaf keeps it
//! whole where its 512 new entries still form one), so a handler that
//! protects and un-protects whole huge pages never splits them; one only
//! partly inside is split first, as in Linux.
//!
//! # Locking
//!
//! The mmap_lock read side (the VMAs and their flags stay put), then
//! PTE-table locks, then the TLB flush. Order: [`crate::mm`].

use super::{validate_range, Uffd};
use crate::addr::Range;
use crate::error::{Error, Result};
use crate::mm::AddressSpace;
use crate::pt::{Pte, PteFlags};
use crate::tlb::Gather;
use crate::vma::{VmFlags, VmaRef};

/// Sets the bit on every present entry of `r`, taking write access away;
/// the entries that lose it go to `gather` for the flush.
pub(super) fn protect(mm: &AddressSpace, r: Range, gather: &mut Gather<'_>) {
    let g = mm.pt.pin();
    mm.pt.change_range(r, &g, |va, pte| {
        if pte.is_writable() {
            gather.add_page(va);
        }
        Pte::new(
            pte.pfn(),
            (pte.flags() - PteFlags::WRITE) | PteFlags::UFFD_WP,
        )
    });
}

/// Clears the bit in `r`, a part of a VMA with `flags`, giving write
/// access back where an ordinary write fault would keep the frame (see the
/// module docs). Nothing needs flushing: rights are only added. Pages
/// made writable are counted in `made_writable` if given.
pub(super) fn unprotect(
    mm: &AddressSpace,
    r: Range,
    flags: VmFlags,
    mut made_writable: Option<&mut u64>,
) {
    let g = mm.pt.pin();
    let frames = &mm.frames;
    let shared = flags.contains(VmFlags::SHARED);
    mm.pt.change_range(r, &g, |_, pte| {
        if !pte.flags().contains(PteFlags::UFFD_WP) {
            return pte;
        }
        let mut f = pte.flags() - PteFlags::UFFD_WP;
        let own = shared || (!pte.pfn().is_zero_page() && frames.refcount(pte.pfn()) == 1);
        if flags.contains(VmFlags::WRITE) && own {
            f |= PteFlags::WRITE;
            if let Some(n) = made_writable.as_deref_mut() {
                *n += 1;
            }
        }
        Pte::new(pte.pfn(), f)
    });
}

/// Clears the bit in `r` without giving write access (mremap's moved
/// entries: a write then takes the ordinary write-fault path).
pub(crate) fn clear_wp_bits(mm: &AddressSpace, r: Range) {
    let g = mm.pt.pin();
    mm.pt.change_range(r, &g, |_, pte| {
        Pte::new(pte.pfn(), pte.flags() - PteFlags::UFFD_WP)
    });
}

impl Uffd<'_> {
    /// Write-protects the present pages of `[addr, addr + len)`
    /// (`UFFDIO_WRITEPROTECT` with `MODE_WP`): a later write faults to the
    /// handler (or, with `wp_async`, is only recorded). Holes between VMAs
    /// are skipped.
    ///
    /// Errors: `EINVAL` for a bad range; `ENOENT` if no VMA meets the
    /// range or one that does is not registered with `WRITE_PROTECT` (the
    /// VMAs before it are protected, as in Linux).
    pub fn write_protect(&self, addr: u64, len: u64) -> Result<()> {
        self.change_wp(addr, len, true, false)
    }

    /// Removes write-protection from `[addr, addr + len)`
    /// (`UFFDIO_WRITEPROTECT` with mode 0), then, if `wake`, wakes the
    /// faults waiting there. Errors as [`write_protect`](Self::write_protect).
    pub fn remove_write_protection(&self, addr: u64, len: u64, wake: bool) -> Result<()> {
        self.change_wp(addr, len, false, wake)
    }

    fn change_wp(&self, addr: u64, len: u64, enable: bool, wake: bool) -> Result<()> {
        let mm = self.mm();
        let r = validate_range(mm, addr, len)?;
        {
            let _st = mm.mmap_lock.read();
            let g = mm.tree.pin();
            let vmas: Vec<VmaRef> = mm.tree.range(r, &g).map(|(_, v)| *v).collect();
            if vmas.is_empty() {
                return Err(Error::NoEnt);
            }
            let mut gather = Gather::new(&mm.tlb, &mm.stats, &mm.frames);
            let mut res = Ok(());
            for v in vmas {
                if !v.flags().contains(VmFlags::UFFD_WP) {
                    res = Err(Error::NoEnt);
                    break;
                }
                let part = v.range().intersect(&r).expect("the VMA meets the range");
                if enable {
                    protect(mm, part, &mut gather);
                } else {
                    unprotect(mm, part, v.flags(), None);
                }
            }
            gather.flush();
            res?;
        }
        if !enable && wake {
            self.ctx().wake(r);
        }
        Ok(())
    }
}
