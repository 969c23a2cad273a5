//! munmap.

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
        let task = self.cfg.task_size;
        if !is_page_aligned(addr) || addr > task || len > task - addr {
            return Err(Error::Inval);
        }
        let len = match page_align_up(len) {
            Some(l) if l != 0 => l,
            _ => return Err(Error::Inval),
        };
        let mut ed = Edit::begin(self);
        ed.unmap(Range::new(addr, addr + len))
    }
}
