//! mmap: argument checks in Linux's order, placement, and the new VMA.

use super::edit::Edit;
use super::{next_id, AddressSpace, MapFlags, Prot};
use crate::addr::{is_page_aligned, page_align_down, page_align_up, Range, PAGE_SHIFT, PAGE_SIZE};
use crate::error::{Error, Result};
use crate::sync::Arc;
use crate::vma::{Shmem, VmFlags, VmaRef};

impl AddressSpace {
    /// Maps `len` bytes of anonymous memory, like `mmap(2)`.
    ///
    /// `addr` is a hint (0 for none) unless `FIXED` or `FIXED_NOREPLACE`
    /// is given. Returns the address of the mapping.
    ///
    /// Errors, in Linux's order: `EINVAL` for flags aspace does not know
    /// (Linux ignores unknown bits for `MAP_PRIVATE`; aspace rejects them)
    /// and for zero `len`; `ENOMEM` when the
    /// page-rounded length overflows, the map count is at its limit, the
    /// length or a fixed range exceeds the task size, or no gap fits;
    /// `EINVAL` for an unaligned fixed address; `EPERM` for a fixed address
    /// below `mmap_min_addr`; `EEXIST` when `FIXED_NOREPLACE` overlaps a
    /// mapping; `EINVAL` when neither `SHARED` nor `PRIVATE` is given, or
    /// `GROWSDOWN` is combined with `SHARED`; `EINVAL` also for
    /// `SHARED | PRIVATE` (Linux's `MAP_SHARED_VALIDATE`, which anonymous
    /// mappings do not accept); then `ENOMEM` when the memory budget has
    /// no room for the new VMA.
    pub fn mmap(&self, addr: u64, len: u64, prot: Prot, flags: MapFlags) -> Result<u64> {
        if !MapFlags::all().contains(flags) {
            return Err(Error::Inval);
        }
        // mmap takes only the access bits of `prot`; other bits are
        // ignored, as in Linux (mprotect rejects them).
        if len == 0 {
            return Err(Error::Inval);
        }
        let len = page_align_up(len).ok_or(Error::NoMem)?;
        let fixed = flags.intersects(MapFlags::FIXED | MapFlags::FIXED_NOREPLACE);
        let hint = if fixed {
            addr
        } else {
            self.round_hint_to_min(addr)
        };
        let mut ed = Edit::begin(self);
        // Linux checks `map_count > max`; we keep the inclusive rule
        // (the count never exceeds the limit), as Linux since late 2025.
        if ed.st.map_count >= self.cfg.max_map_count {
            return Err(Error::NoMem);
        }
        let addr = self.get_unmapped_area(&ed, hint, len, fixed, flags)?;
        if addr < self.cfg.mmap_min_addr {
            return Err(Error::Perm);
        }
        // get_unmapped_area keeps `addr + len` within the task size.
        let r = Range::from_len(addr, len).ok_or(Error::NoMem)?;
        if flags.contains(MapFlags::FIXED_NOREPLACE)
            && ed.find_after(addr).is_some_and(|v| v.start() < r.end)
        {
            return Err(Error::Exist);
        }
        // Anonymous memory takes exactly one of SHARED and PRIVATE (Linux's
        // MAP_SHARED_VALIDATE, both bits, is for files only).
        let shared = flags.contains(MapFlags::SHARED);
        if shared == flags.contains(MapFlags::PRIVATE) {
            return Err(Error::Inval);
        }
        if shared && flags.contains(MapFlags::GROWSDOWN) {
            return Err(Error::Inval);
        }

        let mut vf = VmFlags::from_prot(prot) | VmFlags::MAY;
        if shared {
            vf |= VmFlags::SHARED | VmFlags::MAYSHARE;
        }
        if flags.contains(MapFlags::GROWSDOWN) {
            vf |= VmFlags::GROWSDOWN;
        }
        if flags.contains(MapFlags::NORESERVE) {
            vf |= VmFlags::NORESERVE;
        }
        // Private writable memory is charged (Linux's accountable_mapping).
        if !shared && vf.contains(VmFlags::WRITE) && !vf.contains(VmFlags::NORESERVE) {
            vf |= VmFlags::ACCOUNT;
        }

        // The new VMA's metadata must fit the budget (Linux's
        // vm_area_alloc failing), checked before anything changes.
        if !ed.vma_room(1) {
            return Err(Error::NoMem);
        }
        // MAP_FIXED replaces what is there, data included.
        if fixed {
            ed.unmap(r)?;
            if ed.st.map_count >= self.cfg.max_map_count {
                return Err(Error::NoMem);
            }
        }
        let vma = if shared {
            let obj = Arc::new(Shmem::new(
                next_id(),
                len >> PAGE_SHIFT,
                self.frames.clone(),
            ));
            let v = ed.new_vma(r, 0, vf, None, Some(obj));
            ed.insert(v);
            v
        } else {
            ed.map_new(r, addr >> PAGE_SHIFT, vf, None, None)
        };
        let populate = flags.contains(MapFlags::POPULATE);
        let _ = vma;
        drop(ed);
        if populate {
            self.populate(r, vf);
        }
        Ok(addr)
    }

    /// Faults in every page of `r` as `MAP_POPULATE` does: write faults for
    /// private writable memory (breaking copy-on-write), read faults
    /// otherwise, nothing for inaccessible memory. Best effort, as in
    /// Linux (`__mm_populate` ignores errors and mmap still succeeds): the
    /// first fault that fails — the budget is spent on frames or page
    /// tables — ends it, and the rest stays unpopulated.
    pub(crate) fn populate(&self, r: Range, vf: VmFlags) {
        if !vf.accessible() {
            return;
        }
        let access = if vf.contains(VmFlags::WRITE) && !vf.contains(VmFlags::SHARED) {
            super::Access::Write
        } else {
            super::Access::Read
        };
        let mut a = r.start;
        // `a < r.end <= task_size`: `a + PAGE_SIZE` cannot overflow.
        while a < r.end {
            if self.fault(a, access).is_err() {
                break;
            }
            a += PAGE_SIZE;
        }
    }

    /// Linux's `round_hint_to_min`, which mmap (not mremap) applies to a
    /// hint: page-aligned down, and raised to `mmap_min_addr` if below it.
    fn round_hint_to_min(&self, hint: u64) -> u64 {
        let hint = page_align_down(hint);
        if hint != 0 && hint < self.cfg.mmap_min_addr {
            // `None` (a minimum in the last page) means no hint.
            page_align_up(self.cfg.mmap_min_addr).unwrap_or(0)
        } else {
            hint
        }
    }

    /// Linux's `get_unmapped_area`: a fixed address as given, a usable
    /// page-aligned hint (mmap has rounded it to `mmap_min_addr`; mremap
    /// passes its own, and the caller fails with `EPERM` below that
    /// minimum), or a top-down search below `mmap_base` (then bottom-up).
    /// The result `a` has `a + len <= task_size`.
    pub(crate) fn get_unmapped_area(
        &self,
        ed: &Edit<'_>,
        hint: u64,
        len: u64,
        fixed: bool,
        flags: MapFlags,
    ) -> Result<u64> {
        let task = self.cfg.task_size;
        if len > task {
            return Err(Error::NoMem);
        }
        if fixed {
            // The kernel hands a fixed address back as the result, and one
            // in the top 4095 bytes reads as an error value (-1 is EPERM).
            if hint > u64::MAX - 4095 {
                return Err(Error::from_errno((!hint + 1) as i32).unwrap_or(Error::Inval));
            }
            if hint > task - len {
                return Err(Error::NoMem);
            }
            if !is_page_aligned(hint) {
                return Err(Error::Inval);
            }
            return Ok(hint);
        }
        let min = self.cfg.mmap_min_addr.max(PAGE_SIZE);
        if hint != 0 {
            // The arch code rounds down. `h <= task - len` comes first, so
            // `h + len` cannot overflow.
            let h = page_align_down(hint);
            if h <= task - len && self.range_usable(ed, Range::new(h, h + len)) {
                return Ok(h);
            }
        }
        let _ = flags;
        self.unmapped_area_topdown(ed, len, min)
            .or_else(|| self.unmapped_area_bottomup(ed, len))
            .ok_or(Error::NoMem)
    }

    /// True if `r` is free and respects the stack guard gaps of its
    /// neighbours (`vm_start_gap(next)` / `vm_end_gap(prev)`).
    fn range_usable(&self, ed: &Edit<'_>, r: Range) -> bool {
        match ed.find_after(r.start) {
            Some(next) => r.end <= self.vm_start_gap(next) && next.start() >= r.end,
            None => true,
        }
    }

    /// Where `v` starts, counting the guard gap below a growsdown VMA.
    pub(crate) fn vm_start_gap(&self, v: VmaRef) -> u64 {
        if v.flags().contains(VmFlags::GROWSDOWN) {
            v.start().saturating_sub(self.cfg.stack_guard_gap)
        } else {
            v.start()
        }
    }

    fn unmapped_area_topdown(&self, ed: &Edit<'_>, len: u64, low: u64) -> Option<u64> {
        let mut high = self.cfg.mmap_base.min(self.cfg.task_size);
        loop {
            if high < low || high - low < len {
                return None;
            }
            // The gap search keeps `s + len <= high`: no overflow below.
            let s = ed.w.gap_highest(low, high, len, PAGE_SIZE, &ed.g)?;
            match ed.find_after(s) {
                Some(next) if s + len > self.vm_start_gap(next) => {
                    // The gap below a stack is shortened by its guard gap.
                    high = self.vm_start_gap(next);
                }
                _ => return Some(s),
            }
        }
    }

    fn unmapped_area_bottomup(&self, ed: &Edit<'_>, len: u64) -> Option<u64> {
        let mut low = self
            .cfg
            .mmap_base
            .max(self.cfg.mmap_min_addr)
            .max(PAGE_SIZE);
        let high = self.cfg.task_size;
        loop {
            if high < low || high - low < len {
                return None;
            }
            // The gap search keeps `s + len <= high`: no overflow below.
            let s = ed.w.gap_lowest(low, high, len, PAGE_SIZE, &ed.g)?;
            match ed.find_after(s) {
                Some(next) if s + len > self.vm_start_gap(next) => low = next.end(),
                _ => return Some(s),
            }
        }
    }
}
