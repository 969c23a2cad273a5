//! munmap (and the unmap edit every operation that replaces mappings
//! shares), and the teardown of a whole address space (munmap of
//! everything, in bulk).
//!
//! # Locking
//!
//! The mmap_lock write side through `Edit`; see [`crate::mm`].

use super::edit::{Edit, Reach};
use super::AddressSpace;
use crate::addr::{is_page_aligned, page_align_up, Range};
use crate::error::{Error, Result};
use crate::tlb::Gather;

impl AddressSpace {
    /// Unmaps `[addr, addr + len)`, like `munmap(2)`: VMAs are split at
    /// both ends; unmapping a range with nothing mapped succeeds.
    ///
    /// Errors: `EINVAL` for an unaligned address, a zero length, or a range
    /// past the task size; `ENOMEM` when a split in the middle of a VMA
    /// would exceed `max_map_count`.
    pub fn munmap(&self, addr: u64, len: u64) -> Result<()> {
        let r = self.munmap_range(addr, len)?;
        let mut ed = Edit::begin_range(self, r, Reach::Hole);
        ed.unmap(r)
    }

    /// munmap's argument checks (Linux's `do_vmi_munmap`, which mremap's
    /// shrink also goes through): the page-aligned, non-empty range
    /// `[addr, addr + PAGE_ALIGN(len))` inside the task size, or `EINVAL`.
    pub(super) fn munmap_range(&self, addr: u64, len: u64) -> Result<Range> {
        let task = self.cfg.task_size;
        if !is_page_aligned(addr) || addr > task || len > task - addr {
            return Err(Error::Inval);
        }
        // With a page-aligned task size the rounded range stays inside it;
        // checked anyway, as the task size is the embedder's choice.
        match page_align_up(len) {
            Some(l) if l != 0 => Range::from_len(addr, l).ok_or(Error::Inval),
            _ => Err(Error::Inval),
        }
    }
}

impl Edit<'_> {
    /// Unmaps `[start, end)` (page-aligned, inside the task): Linux's
    /// `do_vmi_munmap` after argument checks. Splits at both ends, removes
    /// every VMA inside, zaps their pages and frees page tables; one TLB
    /// flush covers it all.
    pub(crate) fn unmap(&mut self, r: Range) -> Result<()> {
        let mut gather = self.gather();
        let res = self.unmap_into(r, &mut gather);
        gather.flush();
        res
    }

    /// [`unmap`](Self::unmap) with the flush left to `gather` (an operation
    /// that unmaps several ranges flushes once). The zapped frames are freed
    /// only when `gather` flushes; detached VMAs and page-table pages are
    /// safe to release first (VMA objects are type-stable and tables go
    /// through the epoch).
    pub(crate) fn unmap_into(&mut self, r: Range, gather: &mut Gather<'_>) -> Result<()> {
        let Some(first) = self.find_after(r.start) else {
            return Ok(());
        };
        if first.start() >= r.end {
            return Ok(());
        }
        // A middle split needs one more VMA; head/tail-only unmaps may run
        // at the limit.
        if first.start() < r.start
            && r.end < first.end()
            && self.map_count_at_least(self.mm().cfg.max_map_count)
        {
            return Err(Error::NoMem);
        }
        if first.start() < r.start {
            self.split(first, r.start, false)?;
        }
        // `first` starts below `r.end`, so `r.end > 0`.
        if let Some(last) = self.find(r.end - 1) {
            if last.end() > r.end {
                self.split(last, r.end, false)?;
            }
        }
        let victims = self.few_vmas_in(r);
        for &v in &victims {
            self.lock(v);
        }
        // Faults waiting for a userfault handler in the range are woken
        // once it is gone: they retry and find no mapping.
        let handlers: Vec<_> = victims
            .iter()
            .filter_map(|v| Some((v.uffd_arc()?, v.range())))
            .collect();
        // Point of no return: one store clears the range for readers.
        self.erase(r);
        self.zap(r, gather);
        self.detach_all(&victims);
        self.free_pgtables(r);
        for (ctx, vr) in handlers {
            ctx.wake(vr);
        }
        Ok(())
    }
}

impl Drop for AddressSpace {
    /// Teardown in bulk (Linux's `exit_mmap`): every entry is cleared and
    /// its frame reference dropped in one walk of each VMA's tables, with
    /// one TLB flush; VMAs leave their anon_vma families one family-lock
    /// acquisition per run of VMAs of the same family; the tree's nodes and
    /// the table pages are freed at once by their own drops, not retired
    /// one edit at a time.
    fn drop(&mut self) {
        let mut ed = Edit::begin(self);
        let all = ed.vmas_in(Range::new(0, u64::MAX));
        // `&mut self`: no user access or fault of this space is in flight
        // and none can start, so no translation of it is cached anywhere
        // and each frame may be released as its entry is cleared.
        let mut total = 0;
        // A space that never made its page table has no entry to clear.
        if let Some(pt) = self.pt.peek() {
            let pg = pt.pin();
            let pages = core::cell::Cell::new(0);
            for v in &all {
                pt.zap_range_huge(
                    v.range(),
                    &pg,
                    |_, frame| {
                        pages.set(pages.get() + 1);
                        if let Some(pfn) = frame {
                            self.frames.put(pfn);
                        }
                    },
                    |_, leaf| {
                        pages.set(pages.get() + crate::phys::HUGE_FRAMES as u64);
                        if let Some(head) = leaf.frame() {
                            self.frames.put_huge(head);
                        }
                    },
                );
            }
            total = pages.get();
        }
        if total > 0 {
            self.tlb.flush(&self.stats, total, crate::tlb::Regions::ALL);
        }
        ed.detach_all(&all);
        // Nothing reaches the tree or the tables any more: the tree's and
        // the page table's own drops free them directly.
    }
}
