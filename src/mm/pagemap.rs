//! What `/proc/pid/pagemap` shows: one [`PagemapEntry`] per page, in
//! Linux's 64-bit format, so that values compare bit for bit with the
//! kernel's.
//!
//! A page outside every VMA reads 0; a page inside a VMA with no entry
//! reads 0 too, or soft-dirty alone where the VMA has `VM_SOFTDIRTY`
//! (Linux's `pagemap_pte_hole`). A present entry reads present, its frame
//! number, soft-dirty (entry or VMA bit), uffd write-protected, exclusive
//! when one entry maps the frame (Linux's page mapcount of 1), and file
//! for a page of a shared object ([`Memfd`](crate::Memfd) or shared
//! anonymous memory, which Linux backs with a shmem file), also when a
//! private mapping maps it before its first write. The shared zero page
//! is present and nothing else (no `struct page` in Linux's view).
//! Nothing is ever swapped. A page of a 2 MiB page (a PMD leaf) reads as
//! its own subframe with the leaf's bits, as Linux's `pagemap_pmd_range`
//! reports it; the huge zero page is present and file (it is no
//! anonymous page), as there. `tests/thp.rs` compares them with the
//! kernel's.
//!
//! Linux shows frame numbers only to `CAP_SYS_ADMIN`; aspace always gives
//! its own [`Pfn`] (an index into the space's
//! [`FrameAllocator`](crate::FrameAllocator); the zero page is
//! [`Pfn::ZERO_PAGE`]).
//!
//! # Locking
//!
//! The mmap_lock read side, so every VMA's flags and object stay put;
//! entries are read lock-free (each one whole, as Linux reads each one
//! under its table's lock). A frame's sharing count is a snapshot. Order:
//! [`crate::mm`].

use super::AddressSpace;
use crate::addr::{is_page_aligned, pages, Range, PAGE_SHIFT, PAGE_SIZE};
use crate::error::{Error, Result};
use crate::phys::Pfn;
use crate::pt::PteFlags;
use crate::vma::VmFlags;

/// One page's `/proc/pid/pagemap` entry, in Linux's bit layout.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct PagemapEntry(u64);

impl PagemapEntry {
    /// Bits 0-54: the frame number of a present page.
    pub const PFN_MASK: u64 = (1 << 55) - 1;
    /// Bit 55: written since the last [`ClearRefs::SoftDirty`](crate::ClearRefs).
    pub const SOFT_DIRTY: u64 = 1 << 55;
    /// Bit 56: mapped by exactly one entry.
    pub const EXCLUSIVE: u64 = 1 << 56;
    /// Bit 57: write-protected for a userfault handler.
    pub const UFFD_WP: u64 = 1 << 57;
    /// Bit 61: a page of a shared object (file or shared anonymous).
    pub const FILE: u64 = 1 << 61;
    /// Bit 62: swapped out (never, in aspace).
    pub const SWAPPED: u64 = 1 << 62;
    /// Bit 63: present.
    pub const PRESENT: u64 = 1 << 63;

    /// An entry from its 64-bit value.
    pub const fn from_raw(v: u64) -> Self {
        PagemapEntry(v)
    }

    /// The 64-bit value, as read from `/proc/pid/pagemap`.
    pub const fn raw(self) -> u64 {
        self.0
    }

    /// The page is present.
    pub const fn is_present(self) -> bool {
        self.0 & Self::PRESENT != 0
    }

    /// The page was written since the last soft-dirty reset (or its VMA
    /// is new since then).
    pub const fn is_soft_dirty(self) -> bool {
        self.0 & Self::SOFT_DIRTY != 0
    }

    /// One entry maps the frame.
    pub const fn is_exclusive(self) -> bool {
        self.0 & Self::EXCLUSIVE != 0
    }

    /// The page belongs to a shared object.
    pub const fn is_file(self) -> bool {
        self.0 & Self::FILE != 0
    }

    /// The page is write-protected for a userfault handler.
    pub const fn is_uffd_wp(self) -> bool {
        self.0 & Self::UFFD_WP != 0
    }

    /// The page is swapped out (never, in aspace).
    pub const fn is_swapped(self) -> bool {
        self.0 & Self::SWAPPED != 0
    }

    /// The frame of a present page.
    pub fn pfn(self) -> Option<Pfn> {
        self.is_present()
            .then(|| Pfn::new((self.0 & Self::PFN_MASK) as u32))
    }
}

impl core::fmt::Debug for PagemapEntry {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "PagemapEntry({:#018x}", self.0)?;
        for (bit, name) in [
            (Self::PRESENT, " present"),
            (Self::SOFT_DIRTY, " soft-dirty"),
            (Self::EXCLUSIVE, " exclusive"),
            (Self::FILE, " file"),
            (Self::UFFD_WP, " uffd-wp"),
        ] {
            if self.0 & bit != 0 {
                f.write_str(name)?;
            }
        }
        f.write_str(")")
    }
}

impl AddressSpace {
    /// The pagemap entries of the pages of `[addr, addr + len)` (`len`
    /// rounded up to whole pages), like reading `/proc/pid/pagemap` at
    /// `addr / 4096 * 8`: holes read 0, and the range stops at the task
    /// size, as the file ends there. See the [module docs](crate::mm::pagemap)
    /// for each bit.
    ///
    /// Errors: `EINVAL` for an unaligned `addr`; `ENOMEM` if the entries
    /// would take more bytes than the space's memory budget (its pool's,
    /// on a shared pool; a length from an untrusted caller must not grow
    /// the host process past it; read a large range in pieces with
    /// [`pagemap_into`](Self::pagemap_into), into a buffer of your own) or
    /// do not fit in memory.
    pub fn pagemap(&self, addr: u64, len: u64) -> Result<Vec<PagemapEntry>> {
        if !is_page_aligned(addr) {
            return Err(Error::Inval);
        }
        let end = addr
            .saturating_add(len)
            .saturating_add(PAGE_SIZE - 1)
            .min(self.cfg.task_size)
            & !(PAGE_SIZE - 1);
        let n = pages(end.saturating_sub(addr));
        let bytes = n.saturating_mul(core::mem::size_of::<PagemapEntry>() as u64);
        if bytes > self.budget_bytes() {
            return Err(Error::NoMem);
        }
        let n = n as usize;
        let mut out = Vec::new();
        out.try_reserve_exact(n).map_err(|_| Error::NoMem)?;
        out.resize(n, PagemapEntry::default());
        let got = self.pagemap_into(addr, &mut out)?;
        out.truncate(got);
        Ok(out)
    }

    /// Fills `buf` with the entries of the pages from `addr` on, like a
    /// `read` of `/proc/pid/pagemap`; returns how many it filled (fewer
    /// than `buf.len()` only at the task size). `EINVAL` for an unaligned
    /// `addr`.
    pub fn pagemap_into(&self, addr: u64, buf: &mut [PagemapEntry]) -> Result<usize> {
        if !is_page_aligned(addr) {
            return Err(Error::Inval);
        }
        let task = self.cfg.task_size;
        let n = (pages(task.saturating_sub(addr)) as usize).min(buf.len());
        if n == 0 {
            return Ok(0);
        }
        let buf = &mut buf[..n];
        buf.fill(PagemapEntry::default());
        // `n` pages from `addr` end at or below the task size.
        let r = Range::new(addr, addr + ((n as u64) << PAGE_SHIFT));
        let _st = self.mmap_lock.read();
        let tg = self.tree.pin();
        let g = self.pt.pin();
        let slot = |va: u64| ((va - addr) >> PAGE_SHIFT) as usize;
        for (vr, v) in self.tree.range(r, &tg) {
            let Some(part) = vr.intersect(&r) else {
                continue;
            };
            let vma_dirty = v.flags().contains(VmFlags::SOFTDIRTY);
            if vma_dirty {
                buf[slot(part.start)..slot(part.end)].fill(PagemapEntry(PagemapEntry::SOFT_DIRTY));
            }
            // SAFETY: the mmap_lock read side holds every VMA.
            let shm = unsafe { v.shmem() };
            self.pt.for_each_present(part, &g, |va, pte| {
                let pfn = pte.pfn();
                let f = pte.flags();
                let mut e = PagemapEntry::PRESENT | u64::from(pfn.get());
                if vma_dirty || f.contains(PteFlags::SOFT_DIRTY) {
                    e |= PagemapEntry::SOFT_DIRTY;
                }
                if f.contains(PteFlags::UFFD_WP) {
                    e |= PagemapEntry::UFFD_WP;
                }
                if pfn.is_zero_page() {
                    // The huge zero page is no anonymous page: Linux's
                    // pagemap_pmd_range reports it PM_FILE (the 4 KiB one,
                    // a special entry, it does not).
                    if self.pt.huge_at(va, &g).is_some() {
                        e |= PagemapEntry::FILE;
                    }
                } else {
                    // The object holds a reference of its own on its pages.
                    let file = shm.is_some_and(|s| s.resident(v.pgoff_of(va)) == Some(pfn));
                    if file {
                        e |= PagemapEntry::FILE;
                    }
                    if self.frames.refcount(pfn) == 1 + u32::from(file) {
                        e |= PagemapEntry::EXCLUSIVE;
                    }
                }
                buf[slot(va)] = PagemapEntry(e);
            });
        }
        Ok(n)
    }
}

#[cfg(all(test, not(aspace_loom)))]
mod tests {
    use super::*;
    use crate::pt::Pte;
    use crate::{Config, MapFlags, Prot};

    #[test]
    fn the_entries_of_a_huge_range_are_refused_not_allocated() {
        let mm = AddressSpace::new(Config {
            memory_budget: 1 << 20,
            ..Config::default()
        });
        // 2^35 entries (256 GiB), then 2 MiB of entries: both past the
        // 1 MiB budget. Without the check the second is allocated, and a
        // length of a few TiB grows the host by GiBs (the hostile suite
        // was killed by the OOM killer that way).
        assert_eq!(mm.pagemap(0, u64::MAX), Err(Error::NoMem));
        assert_eq!(mm.pagemap(0, 1 << 30), Err(Error::NoMem));
        assert_eq!(mm.pagemap(0, 1 << 29).map(|v| v.len()), Ok(1 << 17));
    }

    #[test]
    fn uffd_wp_entries_and_the_zero_page() {
        let mm = AddressSpace::new(Config::default());
        let a = mm
            .mmap(
                0,
                2 * PAGE_SIZE,
                Prot::READ | Prot::WRITE,
                MapFlags::PRIVATE | MapFlags::ANONYMOUS,
            )
            .unwrap();
        mm.write(a, b"w").unwrap();
        mm.read(a + PAGE_SIZE, &mut [0]).unwrap();
        let g = mm.pt.pin();
        mm.pt.update(a, &g, |p| {
            Some(Pte::new(
                p.pfn(),
                (p.flags() - PteFlags::WRITE) | PteFlags::UFFD_WP,
            ))
        });
        let pm = mm.pagemap(a, 2 * PAGE_SIZE).unwrap();
        assert!(pm[0].is_uffd_wp() && pm[0].is_present() && pm[0].is_exclusive());
        assert_eq!(pm[0].pfn(), Some(mm.pt.lookup(a, &g).pfn()));
        assert!(!pm[1].is_uffd_wp() && !pm[1].is_exclusive() && !pm[1].is_file());
        assert_eq!(pm[1].pfn(), Some(Pfn::ZERO_PAGE));
        assert!(!pm[0].is_swapped());
        assert_eq!(PagemapEntry::from_raw(pm[0].raw()), pm[0]);
    }
}
