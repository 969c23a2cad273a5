//! `PAGEMAP_SCAN` (the ioctl on `/proc/pid/pagemap`, Linux 6.7): runs of
//! pages by category, and, with [`ScanFlags::WP_MATCHING`], write-protect
//! the written pages it reports in the same pass — the reset of dirty
//! tracking through an async write-protect handler
//! ([`UffdBuilder::wp_async`](super::UffdBuilder::wp_async)).
//!
//! Each page's categories are read and its protection set under its PTE
//! table's lock, and the TLB is flushed (translators included) before the
//! call returns. A store either ran before the protection, through a
//! translation the flush waits out, and its page is reported written now,
//! or it faults after it, clears the bit and is reported by the next scan:
//! no write falls between two scans.
//!
//! Devices write pinned pages without faulting (vm-memory slices,
//! `translate::guest`), so a page whose frame is pinned is reported
//! written and never write-protected while pinned (VFIO reports every
//! pinned page dirty the same way), and pinning clears the bit of an
//! async VMA's entry, as a write fault would: a pin taken after a reset
//! and dropped before the next scan is still reported by it. Both happen
//! under the PTE lock, so a pin and a scan of one page are ordered.
//!
//! Categories supported: `WPALLOWED`, `WRITTEN` (present and not
//! write-protected; an empty entry is never written, as there are no PTE
//! markers), `FILE` (the page of a shared object), `PRESENT` and
//! `PFNZERO`; aspace has no swap, huge pages or guard regions, so
//! `SWAPPED`, `HUGE` and `GUARD` never match, and soft-dirty is not
//! reported here. A VMA is WP-allowed when registered with
//! `WRITE_PROTECT` on an async handle, anonymous or not (Linux also asks
//! anonymous memory for `UFFD_FEATURE_WP_UNPOPULATED`).
//!
//! # Locking
//!
//! The mmap_lock read side, then each PTE table's lock in turn, then the
//! TLB flush. Order: [`crate::mm`].

use crate::addr::{page_align_up, Range, PAGE_SIZE};
use crate::error::{Error, Result};
use crate::mm::AddressSpace;
use crate::pt::{Pte, PteFlags};
use crate::tlb::Gather;
use crate::vma::{VmFlags, Vma, VmaRef};
use bitflags::bitflags;

bitflags! {
    /// Page categories (`PAGE_IS_*`, Linux's values).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct PageCategories: u64 {
        /// In a VMA whose pages the scan may write-protect.
        const WPALLOWED = 1 << 0;
        /// Present and not write-protected: written since the last reset.
        const WRITTEN = 1 << 1;
        /// A shared object's page.
        const FILE = 1 << 2;
        /// Present.
        const PRESENT = 1 << 3;
        /// Swapped out (never, in aspace).
        const SWAPPED = 1 << 4;
        /// Maps the shared zero page.
        const PFNZERO = 1 << 5;
        /// A huge page (never, in aspace).
        const HUGE = 1 << 6;
        /// Soft-dirty (not reported by this scan).
        const SOFT_DIRTY = 1 << 7;
        /// A guard region (never, in aspace).
        const GUARD = 1 << 8;
    }
}

bitflags! {
    /// `PM_SCAN_*` flags.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct ScanFlags: u64 {
        /// Write-protect the matching written pages as they are reported.
        const WP_MATCHING = 1 << 0;
        /// Fail with `EPERM` on a VMA the scan may not write-protect.
        const CHECK_WPASYNC = 1 << 1;
    }
}

/// The arguments of a scan (`struct pm_scan_arg` without the range).
/// A page matches when, after flipping `category_inverted`, it has every
/// category of `category_mask` and, if `category_anyof_mask` is not
/// empty, one of those.
#[derive(Clone, Copy, Debug, Default)]
pub struct ScanArgs {
    /// `PM_SCAN_*`.
    pub flags: ScanFlags,
    /// Categories tested inverted.
    pub category_inverted: PageCategories,
    /// Categories a page must all have.
    pub category_mask: PageCategories,
    /// Categories a page must have one of (if any).
    pub category_anyof_mask: PageCategories,
    /// Categories reported in each run (runs split where they differ).
    pub return_mask: PageCategories,
    /// Most pages reported (0: no limit).
    pub max_pages: u64,
    /// Most runs reported (`vec_len`); 0 reports nothing, as a null
    /// `vec` (a scan that only write-protects).
    pub max_regions: usize,
}

/// A run of pages with the same reported categories (`struct page_region`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageRegion {
    /// First address.
    pub start: u64,
    /// First address past the run.
    pub end: u64,
    /// The run's categories, masked by `return_mask`.
    pub categories: PageCategories,
}

/// What a scan found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScanResult {
    /// The runs, in address order.
    pub regions: Vec<PageRegion>,
    /// Where the walk stopped (`walk_end`): the range's end, or the first
    /// page not reported when a limit was reached.
    pub walk_end: u64,
}

/// The walk's state: output so far and where it stopped.
struct Scan<'a> {
    args: &'a ScanArgs,
    out: ScanResult,
    pages: u64,
    /// Set when a limit stopped the walk.
    full: bool,
}

impl Scan<'_> {
    fn interesting(&self, c: PageCategories) -> bool {
        let c = c ^ self.args.category_inverted;
        c.contains(self.args.category_mask)
            && (self.args.category_anyof_mask.is_empty()
                || c.intersects(self.args.category_anyof_mask))
    }

    /// Reports `[start, end)` with `c` (Linux's `pagemap_scan_output`);
    /// returns the end of what was reported (less than `end` at a limit).
    fn output(&mut self, c: PageCategories, start: u64, end: u64) -> u64 {
        if self.args.max_regions == 0 {
            return end;
        }
        let c = c & self.args.return_mask;
        let mut end = end;
        let n = (end - start) / PAGE_SIZE;
        let limit = if self.args.max_pages == 0 {
            u64::MAX
        } else {
            self.args.max_pages
        };
        if self.pages.saturating_add(n) > limit {
            end -= (self.pages + n - limit) * PAGE_SIZE;
            self.full = true;
        }
        if end > start {
            let n_regions = self.out.regions.len();
            match self.out.regions.last_mut() {
                Some(last) if last.end == start && last.categories == c => last.end = end,
                _ if n_regions >= self.args.max_regions => {
                    self.full = true;
                    end = start;
                }
                _ => self.out.regions.push(PageRegion {
                    start,
                    end,
                    categories: c,
                }),
            }
        }
        self.pages += (end - start) / PAGE_SIZE;
        if self.full {
            self.out.walk_end = end;
        }
        end
    }

    /// Reports the empty pages `[start, end)` of a VMA of category `vc`.
    fn hole(&mut self, vc: PageCategories, start: u64, end: u64) {
        if start < end && !self.full && self.interesting(vc) {
            self.output(vc, start, end);
        }
    }
}

/// A present entry's categories in `vma` (held), Linux's
/// `pagemap_page_category`; `pinned`: a device may write the page.
fn page_categories(vma: &Vma, va: u64, pte: Pte, pinned: bool) -> PageCategories {
    let mut c = PageCategories::PRESENT;
    if !pte.flags().contains(PteFlags::UFFD_WP) || pinned {
        c |= PageCategories::WRITTEN;
    }
    if pte.pfn().is_zero_page() {
        c |= PageCategories::PFNZERO;
    }
    // SAFETY: the scan holds the mmap_lock read side.
    if let Some(shm) = unsafe { vma.shmem() } {
        if shm.resident(vma.pgoff_of(va)) == Some(pte.pfn()) {
            c |= PageCategories::FILE;
        }
    }
    c
}

impl AddressSpace {
    /// Reports the pages of `[start, end)` that match `args` as runs, and
    /// with [`ScanFlags::WP_MATCHING`] write-protects the written ones in
    /// the same pass (`ioctl(PAGEMAP_SCAN)` on `/proc/self/pagemap`). See
    /// [`crate::uffd`] for dirty tracking with an async handle. Holes
    /// between VMAs are skipped; `end` is rounded up to a page. A VMA that
    /// may not be write-protected is skipped under `WP_MATCHING` (and
    /// fails the scan under `CHECK_WPASYNC`).
    ///
    /// Errors: `EINVAL` for an unaligned `start` or unknown flag or
    /// category bits; `EFAULT` for `end < start` or an end past the task
    /// size; `EPERM` under `CHECK_WPASYNC` (what was protected before that
    /// VMA stays so).
    ///
    /// ```
    /// use aspace::{AddressSpace, Config, MapFlags, Prot, PAGE_SIZE};
    /// use aspace::uffd::{PageCategories, ScanArgs};
    /// let mm = AddressSpace::new(Config::default());
    /// let a = mm.mmap(0, 4 * PAGE_SIZE, Prot::READ | Prot::WRITE,
    ///                 MapFlags::PRIVATE | MapFlags::ANONYMOUS).unwrap();
    /// mm.write(a + PAGE_SIZE, &[1]).unwrap();
    /// let args = ScanArgs {
    ///     category_mask: PageCategories::PRESENT,
    ///     return_mask: PageCategories::PRESENT,
    ///     max_regions: 8,
    ///     ..ScanArgs::default()
    /// };
    /// let r = mm.pagemap_scan(a, a + 4 * PAGE_SIZE, &args).unwrap();
    /// assert_eq!(r.regions.len(), 1);
    /// assert_eq!((r.regions[0].start, r.regions[0].end), (a + PAGE_SIZE, a + 2 * PAGE_SIZE));
    /// ```
    pub fn pagemap_scan(&self, start: u64, end: u64, args: &ScanArgs) -> Result<ScanResult> {
        if !ScanFlags::all().contains(args.flags)
            || !PageCategories::all().contains(
                args.category_inverted
                    | args.category_mask
                    | args.category_anyof_mask
                    | args.return_mask,
            )
            || start % PAGE_SIZE != 0
        {
            return Err(Error::Inval);
        }
        if end < start || end > self.cfg.task_size {
            return Err(Error::Fault);
        }
        let end = page_align_up(end).ok_or(Error::Fault)?;
        let wp = args.flags.contains(ScanFlags::WP_MATCHING);
        let mut scan = Scan {
            args,
            out: ScanResult {
                regions: Vec::new(),
                walk_end: end,
            },
            pages: 0,
            full: false,
        };
        if start == end {
            return Ok(scan.out);
        }
        let r = Range::new(start, end);
        let _st = self.mmap_lock.read();
        let g = self.tree.pin();
        let vmas: Vec<VmaRef> = self.tree.range(r, &g).map(|(_, v)| *v).collect();
        let mut gather = Gather::new(&self.tlb, &self.stats, &self.frames);
        let mut res = Ok(());
        for v in vmas {
            if scan.full {
                break;
            }
            let f = v.flags();
            let wp_allowed =
                f.contains(VmFlags::UFFD_WP) && v.uffd_arc().is_some_and(|c| c.wp_async);
            if !wp_allowed {
                if args.flags.contains(ScanFlags::CHECK_WPASYNC) {
                    res = Err(Error::Perm);
                    break;
                }
                if wp {
                    continue;
                }
            }
            let vc = if wp_allowed {
                PageCategories::WPALLOWED
            } else {
                PageCategories::empty()
            };
            // Linux's `pagemap_scan_is_interesting_vma`.
            let required = args.category_mask & PageCategories::WPALLOWED;
            if !(vc ^ args.category_inverted).contains(required) {
                continue;
            }
            let part = v.range().intersect(&r).expect("the VMA meets the range");
            let mut at = part.start;
            let pg = self.pt.pin();
            self.pt.change_range(part, &pg, |va, pte| {
                if scan.full {
                    return pte;
                }
                scan.hole(vc, at, va);
                at = va + PAGE_SIZE;
                if scan.full {
                    return pte;
                }
                let pinned = self.frames.maybe_pinned(pte.pfn());
                let c = vc | page_categories(&v, va, pte, pinned);
                if !scan.interesting(c) || scan.output(c, va, va + PAGE_SIZE) == va {
                    return pte;
                }
                if !wp || !c.contains(PageCategories::WRITTEN) || pinned {
                    return pte;
                }
                if pte.is_writable() {
                    gather.add_page(va);
                }
                Pte::new(
                    pte.pfn(),
                    (pte.flags() - PteFlags::WRITE) | PteFlags::UFFD_WP,
                )
            });
            scan.hole(vc, at, part.end);
        }
        gather.flush();
        res.map(|()| scan.out)
    }
}
