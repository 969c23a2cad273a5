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
use crate::addr::{is_page_aligned, Range, PAGE_SIZE};
use crate::error::{Error, Result};
use crate::sync::Arc;
use crate::vma::{Shmem, VmFlags};
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
    /// The bytes of the space's memory budget: its pool's, which is
    /// `Config::memory_budget` for a space of its own (a result buffer an
    /// untrusted length asks for is bounded by it).
    pub(crate) fn budget_bytes(&self) -> u64 {
        self.frames.budget().saturating_mul(PAGE_SIZE)
    }

    /// Which pages of `[addr, addr + len)` are resident, like `mincore(2)`:
    /// a page-table entry is present (the zero page counts), or the page of
    /// a shared mapping's object has a frame. One entry per page.
    ///
    /// Errors: `EINVAL` for an unaligned `addr`; `ENOMEM` when the range
    /// passes the task size, any page of it is unmapped, or its entries
    /// would take more bytes than the space's memory budget (its pool's, on
    /// a shared pool; a length from an untrusted caller must not grow the
    /// host process past it: use
    /// [`mincore_into`](Self::mincore_into) with a buffer of your own, as
    /// Linux writes into the caller's vector).
    pub fn mincore(&self, addr: u64, len: u64) -> Result<Vec<bool>> {
        let npages = self.mincore_pages(addr, len)?;
        if npages > self.budget_bytes() {
            return Err(Error::NoMem);
        }
        let mut out = Vec::new();
        let n = usize::try_from(npages).map_err(|_| Error::NoMem)?;
        out.try_reserve_exact(n).map_err(|_| Error::NoMem)?;
        out.resize(n, false);
        self.mincore_into(addr, len, &mut out)?;
        Ok(out)
    }

    /// [`mincore`](Self::mincore) into `vec`, which must hold an entry for
    /// each page of `[addr, addr + len)` (the entries past those are left
    /// alone). As in Linux, the pages before the first unmapped one are
    /// filled when the call fails with `ENOMEM` for it.
    ///
    /// Errors: `EINVAL` for an unaligned `addr`; `ENOMEM` when the range
    /// passes the task size or any page of it is unmapped; `EFAULT` when
    /// `vec` is shorter than the range (Linux's answer for a vector that
    /// cannot hold the result), checked before any page is looked at.
    pub fn mincore_into(&self, addr: u64, len: u64, vec: &mut [bool]) -> Result<()> {
        let npages = self.mincore_pages(addr, len)?;
        if npages > vec.len() as u64 {
            return Err(Error::Fault);
        }
        // `npages` pages from `addr` end at or below the task size.
        let r = Range::new(addr, addr + npages * PAGE_SIZE);
        let vec = &mut vec[..npages as usize];
        let slot = |va: u64| ((va - addr) / PAGE_SIZE) as usize;
        let _st = self.mmap_lock.read();
        let g = self.tree.pin();
        let pg = self.pt.pin();
        let mut at = r.start;
        while at < r.end {
            let Some((_, v)) = self.tree.find(at, &g) else {
                return Err(Error::NoMem);
            };
            let part = Range::new(at, v.end().min(r.end));
            vec[slot(part.start)..slot(part.end)].fill(false);
            self.pt
                .for_each_present(part, &pg, |va, _| vec[slot(va)] = true);
            // SAFETY: mincore holds the mmap_lock read side.
            if let Some(shm) = unsafe { v.shmem() } {
                for va in (part.start..part.end).step_by(PAGE_SIZE as usize) {
                    vec[slot(va)] |= shm.has_frame(v.pgoff_of(va));
                }
            }
            at = part.end;
        }
        Ok(())
    }

    /// The pages of a mincore of `[addr, addr + len)`, after Linux's
    /// checks of the range: `EINVAL` unaligned, `ENOMEM` past the task
    /// size.
    fn mincore_pages(&self, addr: u64, len: u64) -> Result<u64> {
        if !is_page_aligned(addr) {
            return Err(Error::Inval);
        }
        // The range rounded to whole pages (the same end for a page-aligned
        // task size; `new` takes any as given).
        let npages = len.div_ceil(PAGE_SIZE);
        npages
            .checked_mul(PAGE_SIZE)
            .and_then(|l| addr.checked_add(l))
            .filter(|&e| e <= self.cfg.task_size)
            .ok_or(Error::NoMem)?;
        Ok(npages)
    }

    /// `msync(2)` of `[addr, addr + len)`. With `SYNC`, the pages of file
    /// objects ([`Memfd::from_file`](crate::Memfd::from_file)) mapped
    /// shared in the range that are dirty are written back to their host
    /// files (`pwrite`), with no lock of the space held meanwhile, as
    /// Linux's `vfs_fsync_range`; anonymous memory and memory objects
    /// have nothing to write back, and `ASYNC` starts nothing (Linux since
    /// 2.6.19: the pages are already in the page cache). Errors in
    /// Linux's order: `EINVAL` for unknown flags, an unaligned `addr`, or
    /// `ASYNC` with `SYNC`; `ENOMEM` when the range wraps or has an
    /// unmapped part (after syncing the mapped ones); `EBUSY` for
    /// `INVALIDATE` on locked memory; the host's error (`EIO`) when a
    /// writeback fails.
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
        let mut sync = Vec::new();
        let r = self.msync_walk(addr, end, flags, &mut sync);
        for (obj, first, last) in sync {
            obj.writeback(first, last)?;
        }
        r
    }

    /// msync's walk of the VMAs of `[addr, end)` under the mmap_lock read
    /// side: its checks, and the object pages `SYNC` must write back,
    /// pushed on `sync` as (object, first page, end page).
    fn msync_walk(
        &self,
        addr: u64,
        end: u64,
        flags: MsyncFlags,
        sync: &mut Vec<(Arc<Shmem>, u64, u64)>,
    ) -> Result<()> {
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
            let stop = v.end().min(end);
            if flags.contains(MsyncFlags::SYNC) && v.flags().contains(VmFlags::SHARED) {
                if let Some(obj) = v.shmem_arc().filter(|o| o.host.is_some()) {
                    sync.push((obj, v.pgoff_of(start), v.pgoff_of(stop - PAGE_SIZE) + 1));
                }
            }
            start = v.end();
            if start >= end {
                return if unmapped { Err(Error::NoMem) } else { Ok(()) };
            }
        }
    }
}
