//! The two calls that only inspect a range: mincore (which pages are
//! resident) and msync (anonymous memory has nothing to write back, so
//! only its argument checks and errors remain).
//!
//! # Locking
//!
//! Both hold the mmap_lock read side while they walk the VMAs; mincore
//! reads page-table entries lock-free under the page table's epoch. Order:
//! [`crate::mm`].

use super::AddressSpace;
use crate::addr::{is_page_aligned, PAGE_SIZE};
use crate::error::{Error, Result};
use crate::vma::VmFlags;
use bitflags::bitflags;

bitflags! {
    /// `msync` flags (`MS_*`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct MsyncFlags: u32 {
        /// Schedule the write-back (`MS_ASYNC`).
        const ASYNC = 1;
        /// Invalidate other mappings of the object (`MS_INVALIDATE`).
        const INVALIDATE = 2;
        /// Write back and wait (`MS_SYNC`).
        const SYNC = 4;
    }
}

impl AddressSpace {
    /// Which pages of `[addr, addr + len)` are resident, like `mincore(2)`:
    /// a page-table entry is present (the zero page counts), or the page of
    /// a shared mapping's object has a frame. One entry per page.
    ///
    /// Errors: `EINVAL` for an unaligned `addr`; `ENOMEM` when the range
    /// passes the task size or any page of it is unmapped.
    pub fn mincore(&self, addr: u64, len: u64) -> Result<Vec<bool>> {
        if !is_page_aligned(addr) {
            return Err(Error::Inval);
        }
        let end = addr
            .checked_add(len)
            .filter(|&e| e <= self.cfg.task_size)
            .ok_or(Error::NoMem)?;
        let npages = len.div_ceil(PAGE_SIZE);
        let _st = self.mmap_lock.read();
        let g = self.tree.pin();
        let pg = self.pt.pin();
        let mut out = Vec::with_capacity(npages.min(1 << 20) as usize);
        let mut a = addr;
        while a < end {
            let Some((_, v)) = self.tree.find(a, &g) else {
                return Err(Error::NoMem);
            };
            let stop = v.end().min(end);
            while a < stop {
                // SAFETY: mincore holds the mmap_lock read side.
                let shmem = unsafe { v.shmem() };
                let present = self.pt.lookup(a, &pg).is_present()
                    || shmem.is_some_and(|s| s.has_frame(v.pgoff_of(a)));
                out.push(present);
                a += PAGE_SIZE;
            }
        }
        Ok(out)
    }

    /// Checks an `msync(2)` of `[addr, addr + len)`; anonymous memory has
    /// nothing to write back, so only the errors remain, in Linux's order:
    /// `EINVAL` for unknown flags, an unaligned `addr`, or `ASYNC` with
    /// `SYNC`; `ENOMEM` when the range wraps or has an unmapped part;
    /// `EBUSY` for `INVALIDATE` on locked memory.
    pub fn msync(&self, addr: u64, len: u64, flags: MsyncFlags) -> Result<()> {
        if !MsyncFlags::all().contains(flags)
            || !is_page_aligned(addr)
            || flags.contains(MsyncFlags::ASYNC | MsyncFlags::SYNC)
        {
            return Err(Error::Inval);
        }
        let len = len.wrapping_add(PAGE_SIZE - 1) & !(PAGE_SIZE - 1);
        let end = addr.checked_add(len).ok_or(Error::NoMem)?;
        if end == addr {
            return Ok(());
        }
        let _st = self.mmap_lock.read();
        let g = self.tree.pin();
        let mut start = addr;
        let mut unmapped = false;
        loop {
            let Some((_, v)) = self.tree.find_after(start, &g) else {
                return Err(Error::NoMem);
            };
            if start < v.start() {
                if flags == MsyncFlags::ASYNC {
                    return Err(Error::NoMem);
                }
                start = v.start();
                if start >= end {
                    return Err(Error::NoMem);
                }
                unmapped = true;
            }
            if flags.contains(MsyncFlags::INVALIDATE) && v.flags().contains(VmFlags::LOCKED) {
                return Err(Error::Busy);
            }
            start = v.end();
            if start >= end {
                return if unmapped { Err(Error::NoMem) } else { Ok(()) };
            }
        }
    }
}
