//! mremap: shrink, grow in place, or move the page-table entries.

use super::edit::Edit;
use super::{AddressSpace, MapFlags, MremapFlags};
use crate::addr::{is_page_aligned, Range, PAGE_MASK, PAGE_SHIFT};
use crate::error::{Error, Result};
use crate::vma::{VmFlags, VmaRef};

/// `PAGE_ALIGN` with C's wrap-around (an overflowing length becomes 0).
fn page_align_wrapping(len: u64) -> u64 {
    len.wrapping_add(PAGE_MASK) & !PAGE_MASK
}

impl AddressSpace {
    /// Resizes and/or moves a mapping, like `mremap(2)`. Returns the
    /// (possibly new) address.
    ///
    /// Shrinking unmaps the tail. Growing extends in place when the pages
    /// after the mapping are free, else moves it if `MAYMOVE` is given
    /// (page-table entries move; data is not copied). `MAYMOVE | FIXED`
    /// moves to `new_addr`, unmapping what is there. `DONTUNMAP` moves the
    /// pages but leaves the old mapping in place, empty.
    ///
    /// Errors as Linux: `EINVAL` for unknown flags, an unaligned address,
    /// a zero new length, `FIXED`/`DONTUNMAP` without `MAYMOVE`,
    /// `DONTUNMAP` with a resize, overlapping old and new ranges, or a zero
    /// old length on a private mapping; `EFAULT` if `old_addr` is not
    /// mapped or the old range crosses the end of its VMA; `ENOMEM` if a
    /// grow cannot be done in place and `MAYMOVE` is not given, no room is
    /// found, or the map count is too close to its limit.
    pub fn mremap(
        &self,
        old_addr: u64,
        old_len: u64,
        new_len: u64,
        flags: MremapFlags,
        new_addr: u64,
    ) -> Result<u64> {
        let task = self.cfg.task_size;
        if !MremapFlags::all().contains(flags) {
            return Err(Error::Inval);
        }
        if !is_page_aligned(old_addr) {
            return Err(Error::Inval);
        }
        let old_len = page_align_wrapping(old_len);
        let new_len = page_align_wrapping(new_len);
        if new_len == 0 || new_len > task {
            return Err(Error::Inval);
        }
        let implies_new = flags.intersects(MremapFlags::FIXED | MremapFlags::DONTUNMAP);
        let mut ed = Edit::begin(self);
        if implies_new {
            if new_addr > task - new_len || !is_page_aligned(new_addr) {
                return Err(Error::Inval);
            }
            if !flags.contains(MremapFlags::MAYMOVE) {
                return Err(Error::Inval);
            }
            if flags.contains(MremapFlags::DONTUNMAP) && old_len != new_len {
                return Err(Error::Inval);
            }
            if Range::new(old_addr, old_addr.saturating_add(old_len))
                    .overlaps(&Range::new(new_addr, new_addr + new_len))
            {
                return Err(Error::Inval);
            }
            if ed.st.map_count + 2 >= self.cfg.max_map_count.saturating_sub(3) {
                return Err(Error::NoMem);
            }
        }
        let Some(vma) = ed.find(old_addr) else {
            return Err(Error::Fault);
        };
        if implies_new {
            return self.mremap_to(&mut ed, old_addr, old_len, new_len, flags, new_addr);
        }
        // Calls that map nothing new skip the remaining checks: a shrink
        // unmaps the tail like munmap (it may span VMAs).
        if new_len == old_len {
            return Ok(old_addr);
        }
        if new_len < old_len {
            ed.unmap(Range::new(old_addr + new_len, old_addr + old_len))?;
            return Ok(old_addr);
        }
        let shared = vma.flags().contains(VmFlags::MAYSHARE);
        Self::check_old_range(vma, old_addr, old_len)?;
        // Grow: in place if the mapping ends the VMA and the pages after
        // it are free.
        let delta = new_len - old_len;
        if old_addr + old_len == vma.end() && self.expandable(&ed, vma, delta) {
            let r = Range::new(vma.end(), vma.end() + delta);
            let pgoff = vma.pgoff_of(vma.end());
            ed.map_new(r, pgoff, vma.flags(), vma.anon_vma_arc(), vma.shmem_arc());
            return Ok(old_addr);
        }
        if !flags.contains(MremapFlags::MAYMOVE) {
            return Err(Error::NoMem);
        }
        let mflags = if shared {
            MapFlags::SHARED
        } else {
            MapFlags::PRIVATE
        };
        let dst = self.get_unmapped_area(&ed, 0, new_len, false, mflags)?;
        self.move_vma(&mut ed, vma, old_addr, old_len, new_len, dst, flags)
    }

    /// Checks for calls that map something new: a zero old length only
    /// duplicates shared mappings, and the old range must not cross the end
    /// of its VMA.
    fn check_old_range(vma: VmaRef, old_addr: u64, old_len: u64) -> Result<()> {
        if old_len == 0 && !vma.flags().contains(VmFlags::MAYSHARE) {
            return Err(Error::Inval);
        }
        if old_len > vma.end() - old_addr {
            return Err(Error::Fault);
        }
        Ok(())
    }

    /// True if `vma` can grow by `delta` bytes at its end.
    fn expandable(&self, ed: &Edit<'_>, vma: VmaRef, delta: u64) -> bool {
        let Some(end) = vma.end().checked_add(delta) else {
            return false;
        };
        if end > self.cfg.task_size {
            return false;
        }
        match ed.find_after(vma.end()) {
            Some(next) => next.start() >= end && self.vm_start_gap(next) >= end,
            None => true,
        }
    }

    /// The FIXED / DONTUNMAP cases.
    fn mremap_to(
        &self,
        ed: &mut Edit<'_>,
        old_addr: u64,
        mut old_len: u64,
        new_len: u64,
        flags: MremapFlags,
        new_addr: u64,
    ) -> Result<u64> {
        if flags.contains(MremapFlags::FIXED) {
            ed.unmap(Range::new(new_addr, new_addr + new_len))?;
        }
        if new_len < old_len {
            ed.unmap(Range::new(old_addr + new_len, old_addr + old_len))?;
            old_len = new_len;
        }
        let Some(vma) = ed.find(old_addr) else {
            return Err(Error::Fault);
        };
        Self::check_old_range(vma, old_addr, old_len)?;
        let shared = vma.flags().contains(VmFlags::MAYSHARE);
        let dst = if flags.contains(MremapFlags::FIXED) {
            new_addr
        } else {
            let mflags = if shared {
                MapFlags::SHARED
            } else {
                MapFlags::PRIVATE
            };
            self.get_unmapped_area(ed, new_addr, new_len, false, mflags)?
        };
        self.move_vma(ed, vma, old_addr, old_len, new_len, dst, flags)
    }

    /// Moves `[old_addr, old_addr + old_len)` of `vma` to a new VMA of
    /// `new_len` bytes at `dst` (free): the page-table entries move, then
    /// the old range is unmapped (or, with DONTUNMAP, left empty).
    #[allow(clippy::too_many_arguments)]
    fn move_vma(
        &self,
        ed: &mut Edit<'_>,
        vma: VmaRef,
        old_addr: u64,
        old_len: u64,
        new_len: u64,
        dst: u64,
        flags: MremapFlags,
    ) -> Result<u64> {
        if ed.st.map_count >= self.cfg.max_map_count.saturating_sub(3) {
            return Err(Error::NoMem);
        }
        ed.lock(vma);
        // A VMA that never got an anon_vma takes the offset of its new
        // place (so it stays mergeable there); one that did keeps its own,
        // which its pages are indexed by.
        let pgoff = if vma.is_anonymous() && vma.anon_vma().is_none() {
            dst >> PAGE_SHIFT
        } else {
            vma.pgoff_of(old_addr)
        };
        let new = ed.map_new(
            Range::new(dst, dst + new_len),
            pgoff,
            vma.flags(),
            vma.anon_vma_arc(),
            vma.shmem_arc(),
        );
        let _ = new;
        let moved_len = old_len.min(new_len);
        if moved_len > 0 {
            let g = self.pt.pin();
            let moved = self.pt.move_range(old_addr, dst, moved_len, &g);
            let mut gather = ed.gather();
            for i in 0..moved {
                gather.add_page(old_addr + (i << PAGE_SHIFT));
            }
            gather.flush();
        }
        if old_len == 0 {
            return Ok(dst);
        }
        if flags.contains(MremapFlags::DONTUNMAP) {
            // The old VMA stays, empty; it is no longer charged, and if it
            // moved whole it no longer owns the anon_vma.
            let Some(old) = ed.find(old_addr) else {
                return Ok(dst);
            };
            ed.lock(old);
            old.set_flags(old.flags() - VmFlags::ACCOUNT);
            if old.start() == old_addr && old.end() == old_addr + old_len {
                old.set_anon_vma(None);
            }
            return Ok(dst);
        }
        ed.unmap(Range::new(old_addr, old_addr + old_len))?;
        Ok(dst)
    }
}
