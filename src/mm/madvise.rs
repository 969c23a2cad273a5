//! madvise.
//!
//! # Locking
//!
//! Zapping advices hold the mmap_lock read side (faults may refill pages
//! meanwhile, as in Linux; with range writers only their range widened to
//! whole VMAs, `range_read`) and PTE-table locks; advices that change VMA
//! flags hold the write side through `Edit` (with range writers only
//! their range's neighbourhood, as mprotect: `name::modify_each`). Order:
//! [`crate::mm`].

use super::{AddressSpace, Advice};
use crate::addr::{is_page_aligned, page_align_up, Range};
use crate::error::{Error, Result};
use crate::vma::{VmFlags, VmaRef};

impl AddressSpace {
    /// Gives advice about `[addr, addr + len)`, like `madvise(2)`; see
    /// [`Advice`] for what each does and the errors it adds.
    ///
    /// `DontNeed` drops the pages without changing the VMAs: private
    /// anonymous memory reads back as zero, shared memory keeps its
    /// contents (the shared object still holds the frames). Advice that
    /// sets VMA flags splits and merges VMAs as mprotect does. Mapped parts
    /// of a range with holes are still processed, then the call fails with
    /// `ENOMEM`, as Linux does; an error at a VMA (`EINVAL`, `EACCES`)
    /// stops there, the VMAs before it done. `EINVAL` for an unaligned
    /// address or an overflowing range.
    pub fn madvise(&self, addr: u64, len: u64, advice: Advice) -> Result<()> {
        if !is_page_aligned(addr) {
            return Err(Error::Inval);
        }
        let alen = page_align_up(len).unwrap_or(0);
        if len != 0 && alen == 0 {
            return Err(Error::Inval);
        }
        let end = addr.checked_add(alen).ok_or(Error::Inval)?;
        if end == addr {
            return Ok(());
        }
        let r = Range::new(addr, end);
        match advice {
            Advice::PopulateRead | Advice::PopulateWrite => {
                return self.madvise_populate(r, advice == Advice::PopulateWrite);
            }
            Advice::Collapse => return self.madvise_collapse(r),
            // These walk the VMAs below (WILLNEED only for its hole check).
            Advice::WillNeed
            | Advice::DontNeed
            | Advice::DontNeedLocked
            | Advice::Free
            | Advice::Remove => {}
            _ => return self.madvise_flags(r, advice),
        }
        // Linux runs DONTNEED under the mmap_lock read side: concurrent
        // faults may refill pages meanwhile, as they may in the kernel. In
        // range mode, only `r` and the whole VMAs it meets, shared
        // (`range_read`): writers elsewhere, even in the same page
        // tables, go on (a zap frees no table, and their frees stop at
        // the VMAs held here).
        let (_st, g) = super::range_read::read_vmas(self, r);
        let mut hole = false;
        let mut cursor = addr;
        let mut gather = crate::tlb::Gather::new(&self.tlb, &self.stats, &self.frames);
        for (vr, v) in self.tree.range(r, &g) {
            if vr.start > cursor {
                hole = true;
            }
            // An error stops the walk at this VMA, after the ones before
            // it were processed, as in Linux.
            if let Err(e) = zap_advice_allowed(v, advice) {
                gather.flush();
                return Err(e);
            }
            let part = vr
                .intersect(&r)
                .expect("range() yields intersecting entries");
            cursor = part.end;
            match advice {
                Advice::DontNeed | Advice::DontNeedLocked | Advice::Free => {
                    super::edit::zap_range(self, part, &mut gather);
                }
                Advice::Remove => {
                    super::edit::zap_range(self, part, &mut gather);
                    // SAFETY: madvise holds the mmap_lock read side (in range
                    // mode, over the whole of `v`: no writer changes it).
                    if let Some(shm) = unsafe { v.shmem() } {
                        let pages = v.pgoff_of(part.start)..v.pgoff_of(part.end);
                        shm.zero_range(pages);
                    }
                }
                // Anonymous memory and our shared objects have no backing
                // store to read ahead from: WILLNEED only reports holes.
                _ => {}
            }
        }
        gather.flush();
        if cursor < end {
            hole = true;
        }
        if hole {
            Err(Error::NoMem)
        } else {
            Ok(())
        }
    }
}

/// Whether a zapping advice applies to `v` (Linux's
/// `madvise_dontneed_free_valid_vma`, `madvise_free_single_vma` and
/// `madvise_remove` checks).
fn zap_advice_allowed(v: &VmaRef, advice: Advice) -> Result<()> {
    let f = v.flags();
    let locked = f.contains(VmFlags::LOCKED);
    match advice {
        Advice::DontNeed if locked => Err(Error::Inval),
        Advice::Free if locked || v.has_shmem() => Err(Error::Inval),
        Advice::Remove if locked || !v.has_shmem() => Err(Error::Inval),
        Advice::Remove if !f.contains(VmFlags::SHARED | VmFlags::MAYWRITE) => {
            Err(Error::AccessDenied)
        }
        _ => Ok(()),
    }
}

/// The flags advice `a` gives a VMA with flags `f`, or `EINVAL` where it
/// does not apply (Linux's `madvise_vma_behavior`).
fn advised_flags(v: &VmaRef, a: Advice) -> Result<VmFlags> {
    let f = v.flags();
    let seq = VmFlags::SEQ_READ | VmFlags::RAND_READ;
    Ok(match a {
        Advice::Normal => f - seq,
        Advice::Random => (f - seq) | VmFlags::RAND_READ,
        Advice::Sequential => (f - seq) | VmFlags::SEQ_READ,
        Advice::DontFork => f | VmFlags::DONTCOPY,
        Advice::DoFork => f - VmFlags::DONTCOPY,
        Advice::HugePage => (f - VmFlags::NOHUGEPAGE) | VmFlags::HUGEPAGE,
        Advice::NoHugePage => (f - VmFlags::HUGEPAGE) | VmFlags::NOHUGEPAGE,
        Advice::WipeOnFork if v.has_shmem() || f.contains(VmFlags::SHARED) => {
            return Err(Error::Inval)
        }
        Advice::WipeOnFork => f | VmFlags::WIPEONFORK,
        // Droppable memory is never copied into a child nor dumped.
        Advice::KeepOnFork | Advice::DoDump if f.contains(VmFlags::DROPPABLE) => {
            return Err(Error::Inval)
        }
        Advice::KeepOnFork => f - VmFlags::WIPEONFORK,
        Advice::DontDump => f | VmFlags::DONTDUMP,
        Advice::DoDump => f - VmFlags::DONTDUMP,
        _ => f,
    })
}

impl AddressSpace {
    /// Advice that changes VMA flags, under the mmap_lock write side:
    /// each VMA's part of `r` gets the new flags, splitting or merging.
    fn madvise_flags(&self, r: Range, advice: Advice) -> Result<()> {
        self.modify_each(r, |v| Ok((advised_flags(v, advice)?, v.name_arc())))
    }
}
