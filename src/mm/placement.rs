//! Placement: where a mapping goes when the caller did not fix it (Linux's
//! `get_unmapped_area`): the hint, the top-down and bottom-up searches
//! through the tree's gap summaries, the 32-bit window, the guard gap of
//! stacks, and the 2 MiB alignment Linux gives mappings that transparent
//! huge pages could back.
//!
//! # Huge-page alignment
//!
//! Linux 6.7+ built with transparent huge pages (`CONFIG_TRANSPARENT_HUGEPAGE`,
//! whatever the mode in `/sys/kernel/mm/transparent_hugepage/enabled`)
//! places some mappings on a 2 MiB boundary
//! ([`Config::thp_placement`](crate::Config::thp_placement),
//! on by default). The search asks for the length plus 2 MiB and, in the
//! area `a` it finds, takes the 2 MiB boundary at or above it, or `a +
//! 2 MiB` when `a` is itself aligned (the address space is top-down, so
//! that is the highest boundary the padded area holds). A hole that fits
//! the mapping exactly is therefore skipped for a lower, larger one. When
//! the padded length fits nowhere, the plain search runs instead. Which
//! mappings, as measured on Linux 6.18 (THP mode `madvise`,
//! `tests/placement.rs` compares them with the running kernel):
//!
//! - private anonymous memory (`MAP_PRIVATE` or `MAP_DROPPABLE`) with no
//!   hint (0 after the hint is rounded to a page and to `mmap_min_addr`)
//!   and a page-rounded length that is a multiple of 2 MiB, whatever its
//!   other flags (`MAP_STACK`, `MAP_GROWSDOWN`, `MAP_32BIT`, `PROT_NONE`;
//!   `MADV_NOHUGEPAGE` and `PR_SET_THP_DISABLE` do not change it; in the
//!   bottom-up 32-bit window an aligned area still gives `a + 2 MiB`, as
//!   Linux decides that by the space's top-down layout). A
//!   hint, even one that cannot be used, means the plain search; so do
//!   other lengths. mremap moves (`MREMAP_MAYMOVE` growth, `DONTUNMAP`
//!   without a new address) follow the same rule with the new length;
//! - objects on file systems whose mmap aligns (`thp_get_unmapped_area`:
//!   ext2/3/4 and XFS), which host-file objects record when they are made
//!   ([`Memfd::from_file`](crate::Memfd::from_file)): when the mapped
//!   file range covers a whole 2 MiB-aligned 2 MiB of the file, the
//!   address gets the offset's position in its 2 MiB (`addr % 2 MiB ==
//!   offset % 2 MiB`), any length; a hint is kept if the padded length fits
//!   there;
//! - never shared anonymous memory, memfds, or host files on other file
//!   systems (tmpfs without huge pages, overlayfs, ...): they take the
//!   plain search.
//!
//! # Placement windows
//!
//! With [`Config::placement_window`](crate::Config::placement_window)
//! non-zero (off by default: it departs from Linux), a search first looks
//! top-down inside the window of the calling thread's per-CPU slot
//! ([`crate::percpu::cpu_id`]), `[mmap_base - (k + 1) * size, mmap_base -
//! k * size)` for slot `k`, and only then, if the window has no room, runs
//! Linux's search over the whole area. Concurrent writers on different
//! CPUs then place apart: with range-locked writers, two reservations that
//! Linux would put side by side (and whose equal `PROT_NONE` VMAs would
//! merge) made each writer's neighbourhood the other's range, so the two
//! threads waited on each other at every call. The window is read once
//! per search, with no shared write (the slot number is the CPU's); a
//! thread that migrates mid-search merely searches its old window. A hint
//! that can be used, `MAP_32BIT` and fixed addresses are not affected.
//! Nor is a placement by the range lock's bias's owner while the VMA tree
//! is still one tree (`mm::range_bias`): no other writer has run in the
//! space, so there is no one to place apart from, and a thread alone
//! places as Linux does.
//!
//! # Locking
//!
//! Called by mmap_lock writers with their `Edit`. Order: [`crate::mm`].

use super::edit::View;
use super::{AddressSpace, MapFlags};
use crate::addr::{is_page_aligned, page_align_down, page_align_up, Range, PAGE_SHIFT, PAGE_SIZE};
use crate::error::{Error, Result};
use crate::vma::{VmFlags, Vma, VmaRef};

/// The alignment unit: a PMD entry's span, the size of a huge page.
const HUGE_SIZE: u64 = 2 << 20;

/// What is being placed, as far as its alignment goes (see the module's
/// `# Huge-page alignment`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Backing {
    /// Never aligned: shared anonymous memory, an object on a file system
    /// that does not align (a memfd).
    Plain,
    /// Private anonymous memory: aligned with no hint and a length that
    /// is a multiple of 2 MiB.
    Anon,
    /// An object on an aligning file system, mapped from this byte offset.
    File(u64),
}

impl Backing {
    /// What a VMA's memory is, `addr` being where a move takes it from.
    pub(crate) fn of_vma(vma: &Vma, addr: u64) -> Backing {
        match vma.shmem_arc() {
            None => Backing::Anon,
            Some(obj) if obj.aligns_placement() => Backing::File(vma.pgoff_of(addr) << PAGE_SHIFT),
            Some(_) => Backing::Plain,
        }
    }
}

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
    /// minimum), or a top-down search below `mmap_base` (then bottom-up),
    /// 2 MiB-aligned for what `backing` says (see the module docs).
    /// The result `a` has `a + len <= task_size`.
    pub(crate) fn get_unmapped_area(
        &self,
        ed: &View<'_>,
        hint: u64,
        len: u64,
        fixed: bool,
        flags: MapFlags,
        backing: Backing,
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
        if !self.cfg.thp_placement {
            return self.search(ed, hint, len, flags);
        }
        match backing {
            Backing::Anon if hint == 0 && len % HUGE_SIZE == 0 => {
                self.huge_aligned(ed, hint, len, 0, flags)
            }
            Backing::File(offset) => self.huge_aligned(ed, hint, len, offset, flags),
            _ => self.search(ed, hint, len, flags),
        }
    }

    /// The padded search of Linux's `__thp_get_unmapped_area`: room for
    /// `len + 2 MiB`, the mapping at the first address in it congruent to
    /// `offset` modulo 2 MiB, or 2 MiB up when the room itself starts on
    /// one (this space is top-down: the highest such address); a hint
    /// kept if the padded length fits there. The plain search when the
    /// file range covers no whole aligned 2 MiB or the padded length fits
    /// nowhere.
    fn huge_aligned(
        &self,
        ed: &View<'_>,
        hint: u64,
        len: u64,
        offset: u64,
        flags: MapFlags,
    ) -> Result<u64> {
        let padded = || -> Option<u64> {
            let off_end = offset.checked_add(len)?;
            let off_align = offset.checked_next_multiple_of(HUGE_SIZE)?;
            if off_end <= off_align || off_end - off_align < HUGE_SIZE {
                return None;
            }
            let len_pad = len.checked_add(HUGE_SIZE)?;
            offset.checked_add(len_pad)?;
            let room = self.search(ed, hint, len_pad, flags).ok()?;
            if room == hint {
                return Some(room);
            }
            // `room + len_pad <= task_size`: the sums below stay inside.
            match offset.wrapping_sub(room) & (HUGE_SIZE - 1) {
                0 => Some(room + HUGE_SIZE),
                up => Some(room + up),
            }
        };
        match padded() {
            Some(a) => Ok(a),
            None => self.search(ed, hint, len, flags),
        }
    }

    /// The search itself (Linux's `mm_get_unmapped_area`): the 32-bit
    /// window, a usable hint, top-down below `mmap_base`, then bottom-up
    /// above it.
    fn search(&self, ed: &View<'_>, hint: u64, len: u64, flags: MapFlags) -> Result<u64> {
        let task = self.cfg.task_size;
        if len > task {
            return Err(Error::NoMem);
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
        if let Some(w) = self.placement_window(min) {
            if let Some(s) = self.topdown_within(ed, len, w.start, w.end) {
                return Ok(s);
            }
        }
        self.unmapped_area_topdown(ed, len, min)
            .or_else(|| self.unmapped_area_bottomup(ed, len, low, task))
            .ok_or(Error::NoMem)
    }

    /// True if `r` is free and respects the stack guard gaps of its
    /// neighbours (`vm_start_gap(next)` / `vm_end_gap(prev)`).
    pub(super) fn range_usable(&self, ed: &View<'_>, r: Range) -> bool {
        match ed.find_after_below(r.start, self.gap_reach(r.end)) {
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

    /// How far above a range ending at `end` a VMA can still matter to it:
    /// one starting at or past this bound has its guard gap (growsdown)
    /// above `end` too. The bound of the placements' lookups of the VMA
    /// after a candidate.
    fn gap_reach(&self, end: u64) -> u64 {
        end.saturating_add(self.cfg.stack_guard_gap)
    }

    /// Where a search for a mapping with `hint` is likely to land: the
    /// hint, else the top of the calling thread's placement window, else
    /// just below `mmap_base` (a range writer's placement marks the range
    /// lock's shard there, `Edit::begin_placed`).
    pub(crate) fn placement_near(&self, hint: u64) -> u64 {
        if hint != 0 {
            return hint;
        }
        let min = self.cfg.mmap_min_addr.max(PAGE_SIZE);
        let top = self.cfg.mmap_base.min(self.cfg.task_size);
        self.placement_window(min)
            .map_or(top, |w| w.end)
            .saturating_sub(1)
    }

    /// The calling thread's placement window (module docs), or `None`
    /// when windows are off or the slot's window does not lie wholly in
    /// `[min, mmap_base)`.
    fn placement_window(&self, min: u64) -> Option<Range> {
        let size = self.cfg.placement_window;
        // While the tree is one tree, the bias's owner is the only
        // writer (`range_bias`): no one to place apart from.
        if size == 0 || self.tree.is_unified() {
            return None;
        }
        let slot = u64::try_from(crate::percpu::cpu_id()).ok()?;
        let top = self
            .cfg
            .mmap_base
            .min(self.cfg.task_size)
            .checked_sub(slot.checked_mul(size)?)?;
        let bottom = top.checked_sub(size)?;
        (bottom >= min).then(|| Range::new(bottom, top))
    }

    /// Linux's top-down search below `mmap_base`, down to `low`.
    pub(super) fn unmapped_area_topdown(&self, ed: &View<'_>, len: u64, low: u64) -> Option<u64> {
        let high = self.cfg.mmap_base.min(self.cfg.task_size);
        self.topdown_within(ed, len, low, high)
    }

    /// The highest fit of `len` bytes in `[low, high)`, keeping stack
    /// guard gaps.
    fn topdown_within(&self, ed: &View<'_>, len: u64, low: u64, mut high: u64) -> Option<u64> {
        loop {
            if high < low || high - low < len {
                return None;
            }
            // The gap search keeps `s + len <= high`: no overflow below.
            let s = ed.free_area(low, high, len, true)?;
            match ed.find_after_below(s, self.gap_reach(s + len)) {
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
    pub(super) fn unmapped_area_32bit(&self, ed: &View<'_>, hint: u64, len: u64) -> Result<u64> {
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
        ed: &View<'_>,
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
            match ed.find_after_below(s, self.gap_reach(s + len)) {
                Some(next) if s + len > self.vm_start_gap(next) => low = next.end(),
                _ => return Some(s),
            }
        }
    }
}
