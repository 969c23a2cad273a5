//! Placement: where a mapping goes when the caller did not fix it (Linux's
//! `get_unmapped_area`): the hint, the top-down and bottom-up searches
//! through the tree's gap summaries, the 32-bit window, and the guard gap
//! of stacks.
//!
//! # Locking
//!
//! Called by mmap_lock writers with their `Edit`. Order: [`crate::mm`].

use super::edit::Edit;
use super::{AddressSpace, MapFlags};
use crate::addr::{is_page_aligned, page_align_down, page_align_up, Range, PAGE_SIZE};
use crate::error::{Error, Result};
use crate::vma::{VmFlags, VmaRef};

impl AddressSpace {
    /// Linux's `round_hint_to_min`, which mmap (not mremap) applies to a
    /// hint: page-aligned down, and raised to `mmap_min_addr` if below it.
    pub(super) fn round_hint_to_min(&self, hint: u64) -> u64 {
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
        if flags.contains(MapFlags::BIT32) {
            return self.unmapped_area_32bit(ed, hint, len);
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
        let low = self.cfg.mmap_base.max(min);
        self.unmapped_area_topdown(ed, len, min)
            .or_else(|| self.unmapped_area_bottomup(ed, len, low, task))
            .ok_or(Error::NoMem)
    }

    /// True if `r` is free and respects the stack guard gaps of its
    /// neighbours (`vm_start_gap(next)` / `vm_end_gap(prev)`).
    pub(super) fn range_usable(&self, ed: &Edit<'_>, r: Range) -> bool {
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

    pub(super) fn unmapped_area_topdown(&self, ed: &Edit<'_>, len: u64, low: u64) -> Option<u64> {
        let mut high = self.cfg.mmap_base.min(self.cfg.task_size);
        loop {
            if high < low || high - low < len {
                return None;
            }
            // The gap search keeps `s + len <= high`: no overflow below.
            let s = ed.free_area(low, high, len, true)?;
            match ed.find_after(s) {
                Some(next) if s + len > self.vm_start_gap(next) => {
                    // The gap below a stack is shortened by its guard gap.
                    high = self.vm_start_gap(next);
                }
                _ => return Some(s),
            }
        }
    }

    /// `MAP_32BIT` without a fixed address (x86-64's `find_start_end`
    /// without randomization): a hint that ends at or below 2 GiB and is
    /// free, else the lowest fit in `[1 GiB, 2 GiB)`.
    pub(super) fn unmapped_area_32bit(&self, ed: &Edit<'_>, hint: u64, len: u64) -> Result<u64> {
        const BEGIN: u64 = 0x4000_0000;
        const END: u64 = 0x8000_0000;
        if len > END {
            return Err(Error::NoMem);
        }
        // The hint was already rounded up to mmap_min_addr by the caller's
        // rules; here it is only rounded down to a page.
        let h = if hint != 0 && hint < self.cfg.mmap_min_addr {
            page_align_up(self.cfg.mmap_min_addr).unwrap_or(0)
        } else {
            hint & !(PAGE_SIZE - 1)
        };
        if h != 0 && h <= END - len && self.range_usable(ed, Range::new(h, h + len)) {
            return Ok(h);
        }
        let low = BEGIN.max(self.cfg.mmap_min_addr);
        self.unmapped_area_bottomup(ed, len, low, END.min(self.cfg.task_size))
            .ok_or(Error::NoMem)
    }

    /// The lowest fit of `len` bytes in `[low, high)`, keeping stack guard
    /// gaps.
    pub(super) fn unmapped_area_bottomup(
        &self,
        ed: &Edit<'_>,
        len: u64,
        low: u64,
        high: u64,
    ) -> Option<u64> {
        let mut low = low.max(PAGE_SIZE);
        loop {
            if high < low || high - low < len {
                return None;
            }
            // The gap search keeps `s + len <= high`: no overflow below.
            let s = ed.free_area(low, high, len, false)?;
            match ed.find_after(s) {
                Some(next) if s + len > self.vm_start_gap(next) => low = next.end(),
                _ => return Some(s),
            }
        }
    }
}
