//! munmap.
//!
//! # Locking
//!
//! The mmap_lock write side through `Edit`; see [`crate::mm`].

use super::edit::Edit;
use super::AddressSpace;
use crate::addr::{is_page_aligned, page_align_up, Range};
use crate::error::{Error, Result};

impl AddressSpace {
    /// Unmaps `[addr, addr + len)`, like `munmap(2)`: VMAs are split at
    /// both ends; unmapping a range with nothing mapped succeeds.
    ///
    /// Errors: `EINVAL` for an unaligned address, a zero length, or a range
    /// past the task size; `ENOMEM` when a split in the middle of a VMA
    /// would exceed `max_map_count`.
    pub fn munmap(&self, addr: u64, len: u64) -> Result<()> {
        let r = self.munmap_range(addr, len)?;
        let mut ed = Edit::begin(self);
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
