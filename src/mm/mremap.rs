//! mremap: shrink, grow in place, or move the page-table entries.
//!
//! # Locking
//!
//! The mmap_lock write side through `Edit` (with range writers, a shrink
//! or a grow in place locks only its range and neighbourhood, as munmap
//! and mprotect: `range_edit`); entries move under the source
//! and destination PTE-table locks, flushed per extent or once as
//! `Config::mremap_extent` says, and those of a shared object's VMA under
//! its mappings lock too (`vma::mappings`). Order: [`crate::mm`].

use super::edit::{Edit, Reach, VmaSpec};
use super::placement::Backing;
use super::{AddressSpace, MapFlags, MremapExtent, MremapFlags};
use crate::addr::{is_page_aligned, Range, PAGE_MASK, PAGE_SHIFT, PAGE_SIZE};
use crate::error::{Error, Result};
use crate::stats::Event;
use crate::tlb::Gather;
use crate::uffd::UFFD_FLAGS;
use crate::vma::{VmFlags, VmaRef};

/// `PAGE_ALIGN` with C's wrap-around (an overflowing length becomes 0).
fn page_align_wrapping(len: u64) -> u64 {
    len.wrapping_add(PAGE_MASK) & !PAGE_MASK
}

/// One mremap request: the call's arguments (page-aligned lengths once
/// checked), as the helpers below pass them along (`old_len` shrinks as a
/// move trims a tail).
#[derive(Clone, Copy)]
struct Request {
    old_addr: u64,
    old_len: u64,
    new_len: u64,
    flags: MremapFlags,
    /// The `FIXED` target or the `DONTUNMAP` hint.
    new_addr: u64,
}

impl AddressSpace {
    /// Resizes and/or moves a mapping, like `mremap(2)`. Returns the
    /// (possibly new) address.
    ///
    /// Shrinking unmaps the tail. Growing extends in place when the pages
    /// after the mapping are free, else moves it if `MAYMOVE` is given
    /// (page-table entries move; data is not copied). `MAYMOVE | FIXED`
    /// moves to `new_addr`, unmapping what is there. `DONTUNMAP` moves the
    /// pages but leaves the old mapping in place, empty.
    ///
    /// Errors as Linux: `EINVAL` for unknown flags, an unaligned address,
    /// a zero new length, `FIXED`/`DONTUNMAP` without `MAYMOVE`,
    /// `DONTUNMAP` with a resize, overlapping old and new ranges, or a zero
    /// old length on a private mapping; `EFAULT` if `old_addr` is not
    /// mapped or the old range crosses the end of its VMA; `ENOMEM` if a
    /// grow cannot be done in place and `MAYMOVE` is not given, no room is
    /// found, or the map count is too close to its limit. A shrink unmaps
    /// its tail with munmap's checks: `EINVAL` when the old range reaches
    /// past the task size (after a `FIXED` target was unmapped, as in
    /// Linux). `EPERM` when the new address (`FIXED`, or a free
    /// `DONTUNMAP` hint) is below `mmap_min_addr`, also after a `FIXED`
    /// target was unmapped.
    ///
    /// TLB flushes follow [`Config::mremap_extent`](crate::Config): with
    /// the default ([`MremapExtent::Batched`]) one flush covers the whole
    /// call (the move and whatever it unmaps), issued before any frame is
    /// freed and before the old range can be reused.
    pub fn mremap(
        &self,
        old_addr: u64,
        old_len: u64,
        new_len: u64,
        flags: MremapFlags,
        new_addr: u64,
    ) -> Result<u64> {
        let mut locked = false;
        let raw = Request {
            old_addr,
            old_len,
            new_len,
            flags,
            new_addr,
        };
        let new = self.mremap_locked(raw, &mut locked, true)?;
        // Locked memory that grew is populated as mlock would (not with
        // the lock held; errors ignored), as Linux's mremap ends.
        let (old_len, new_len) = (page_align_wrapping(old_len), page_align_wrapping(new_len));
        if locked && new_len > old_len {
            let _ = self.populate_locked(Range::new(new + old_len, new + new_len), true);
        }
        Ok(new)
    }

    /// [`mremap`](Self::mremap) under the mmap_lock, with the call's raw
    /// arguments; `locked` says whether the VMA it found was locked. With
    /// `try_range` (and range writers), a shrink or a grow in place runs
    /// as a range writer ([`range_edit`](Self::range_edit)); a call that
    /// turns out to need more (a move, a locked or shared VMA growing)
    /// drops that edit before it has changed anything and runs again on
    /// the whole space.
    fn mremap_locked(&self, raw: Request, locked: &mut bool, try_range: bool) -> Result<u64> {
        let Request {
            old_addr,
            old_len,
            new_len,
            flags,
            new_addr,
        } = raw;
        let task = self.cfg.task_size;
        if !MremapFlags::all().contains(flags) {
            return Err(Error::Inval);
        }
        if !is_page_aligned(old_addr) {
            return Err(Error::Inval);
        }
        let old_len = page_align_wrapping(old_len);
        let new_len = page_align_wrapping(new_len);
        if new_len == 0 || new_len > task {
            return Err(Error::Inval);
        }
        // Overflow: from here on `new_len <= task`; `new_addr + new_len <=
        // task` wherever `new_addr` is used; `old_addr` lies in a VMA (so
        // below the task size) once found, so `old_addr + new_len` is far
        // from overflowing. `old_addr + old_len` is used only once the old
        // range is known to end inside its VMA (`check_old_range`, or the
        // pieces of VMAs in `remap_move`), or through `shrunk_tail`.
        let implies_new = flags.intersects(MremapFlags::FIXED | MremapFlags::DONTUNMAP);
        let ranged = if try_range && !implies_new {
            self.range_edit(old_addr, old_len, new_len)
        } else {
            None
        };
        let in_range = ranged.is_some();
        let mut ed = ranged.unwrap_or_else(|| Edit::begin(self));
        if implies_new {
            if new_addr > task - new_len || !is_page_aligned(new_addr) {
                return Err(Error::Inval);
            }
            if !flags.contains(MremapFlags::MAYMOVE) {
                return Err(Error::Inval);
            }
            if flags.contains(MremapFlags::DONTUNMAP) && old_len != new_len {
                return Err(Error::Inval);
            }
            // Linux compares the raw ends (wrapping as unsigned longs do),
            // so a zero-length old range strictly inside the new one
            // overlaps it, unlike an empty `Range`.
            let (old_end, new_end) = (old_addr.wrapping_add(old_len), new_addr + new_len);
            if old_end > new_addr && new_end > old_addr {
                return Err(Error::Inval);
            }
            if ed.map_count_at_least(self.cfg.max_map_count.saturating_sub(3).saturating_sub(2)) {
                return Err(Error::NoMem);
            }
        }
        let Some(vma) = ed.find(old_addr) else {
            return Err(Error::Fault);
        };
        let vma_locked = vma.flags().contains(VmFlags::LOCKED);
        // A range writer grows only private anonymous memory, unlocked
        // (the memlock limit counts every locked VMA) and not a stack
        // (`RANGE_GROW_NOT`): anything else runs again on the whole
        // space, nothing changed.
        if in_range
            && new_len > old_len
            && (!vma.is_anonymous() || vma.flags().intersects(Self::RANGE_GROW_NOT))
        {
            drop(ed);
            return self.mremap_locked(raw, locked, false);
        }
        *locked = vma_locked;
        // Declared after `ed`, so dropped (and flushed) before the
        // mmap_lock is released: one flush for the whole call.
        let mut gather = ed.gather();
        let req = Request {
            old_addr,
            old_len,
            new_len,
            flags,
            new_addr,
        };
        // A FIXED move of the same size may span several VMAs (Linux
        // 6.17+): each piece moves to the same offset at the target, holes
        // stay holes.
        if flags.contains(MremapFlags::FIXED) && old_len == new_len {
            return self.remap_move(&mut ed, &mut gather, req);
        }
        // Only calls that will map something new (a grow, FIXED,
        // DONTUNMAP) check the old range, as far as it survives a shrink;
        // a plain shrink unmaps the tail like munmap (it may span VMAs) and
        // a same-size call does nothing.
        if implies_new || new_len > old_len {
            Self::check_old_range(vma, old_addr, old_len.min(new_len))?;
        }
        // Growing locked memory must fit the memlock limit.
        if vma_locked
            && new_len > old_len
            && !self.mlock_future_ok(&ed, VmFlags::LOCKED, new_len - old_len)
        {
            return Err(Error::Again);
        }
        if implies_new {
            return self.mremap_to(&mut ed, &mut gather, req);
        }
        if new_len == old_len {
            return Ok(old_addr);
        }
        if new_len < old_len {
            ed.unmap(self.shrunk_tail(old_addr, old_len, new_len)?)?;
            return Ok(old_addr);
        }
        let shared = vma.flags().contains(VmFlags::MAYSHARE);
        // Grow: in place if the mapping ends the VMA and the pages after
        // it are free.
        let delta = new_len - old_len;
        if old_addr + old_len == vma.end() && self.expandable(&ed, vma, delta) {
            let r = Range::new(vma.end(), vma.end() + delta);
            let pgoff = vma.pgoff_of(vma.end());
            ed.map_new(VmaSpec::like(&vma, r, pgoff));
            return Ok(old_addr);
        }
        if !flags.contains(MremapFlags::MAYMOVE) {
            return Err(Error::NoMem);
        }
        if in_range {
            // A move places and unmaps far from the held range.
            drop(gather);
            drop(ed);
            return self.mremap_locked(raw, locked, false);
        }
        let mflags = if shared {
            MapFlags::SHARED
        } else {
            MapFlags::PRIVATE
        };
        let backing = Backing::of_vma(&vma, old_addr);
        let dst = self.get_unmapped_area(&ed.view(), 0, new_len, false, mflags, backing)?;
        self.move_vma(&mut ed, &mut gather, vma, req, dst)
    }

    /// Flags of a VMA a range-locked mremap does not grow.
    const RANGE_GROW_NOT: VmFlags = VmFlags::SHARED
        .union(VmFlags::MAYSHARE)
        .union(VmFlags::GROWSDOWN)
        .union(VmFlags::LOCKED)
        .union(VmFlags::LOCKONFAULT);

    /// With range writers, an mremap that stays in place (no `FIXED`, no
    /// `DONTUNMAP`) as a range writer of `[old_addr, old_addr +
    /// max(old_len, new_len))`: a shrink with the hole around it, as
    /// munmap (it unmaps the tail and frees tables there); a grow or a
    /// same-size call with its neighbours, as mprotect (a grow maps the
    /// pages after the VMA, merging with the next one if it touches).
    /// `None` (take the whole space): not in range mode, or a range that
    /// wraps or passes the task size (the whole-space path gives Linux's
    /// errors for it).
    fn range_edit(&self, old_addr: u64, old_len: u64, new_len: u64) -> Option<Edit<'_>> {
        if !self.mmap_lock.is_range_mode() {
            return None;
        }
        let r = Range::from_len(old_addr, old_len.max(new_len))?;
        if r.end > self.cfg.task_size {
            return None;
        }
        let reach = if new_len < old_len {
            Reach::Hole
        } else {
            Reach::Vmas
        };
        Some(Edit::begin_range(self, r, reach))
    }

    /// Moves every VMA piece of `[old_addr, old_addr + len)` to the same
    /// offset from `new_addr`; the first piece must start at `old_addr`.
    fn remap_move(&self, ed: &mut Edit<'_>, gather: &mut Gather<'_>, req: Request) -> Result<u64> {
        let Request {
            old_addr,
            old_len: len,
            flags,
            new_addr,
            ..
        } = req;
        let pieces: Vec<Range> = ed
            .vmas_in(Range::new(old_addr, old_addr + len))
            .iter()
            .filter_map(|v| v.range().intersect(&Range::new(old_addr, old_addr + len)))
            .collect();
        for p in pieces {
            let dst = new_addr + (p.start - old_addr);
            let piece = Request {
                old_addr: p.start,
                old_len: p.len(),
                new_len: p.len(),
                flags,
                new_addr: dst,
            };
            self.mremap_to(ed, gather, piece)?;
        }
        Ok(new_addr)
    }

    /// The tail a shrink unmaps, `[old_addr + new_len, old_addr +
    /// old_len)`, with munmap's checks: Linux's `shrink_vma` goes through
    /// `do_vmi_munmap`, so an old length reaching past the task size fails
    /// with `EINVAL` (the old range of a shrink is not checked against its
    /// VMA). `new_len < old_len`.
    fn shrunk_tail(&self, old_addr: u64, old_len: u64, new_len: u64) -> Result<Range> {
        let start = old_addr.checked_add(new_len).ok_or(Error::Inval)?;
        self.munmap_range(start, old_len - new_len)
    }

    /// Checks for calls that map something new: a zero old length only
    /// duplicates shared mappings, and the old range must not cross the end
    /// of its VMA.
    fn check_old_range(vma: VmaRef, old_addr: u64, old_len: u64) -> Result<()> {
        if old_len == 0 && !vma.flags().contains(VmFlags::MAYSHARE) {
            return Err(Error::Inval);
        }
        if old_len > vma.end() - old_addr {
            return Err(Error::Fault);
        }
        Ok(())
    }

    /// True if `vma` can grow by `delta` bytes at its end.
    fn expandable(&self, ed: &Edit<'_>, vma: VmaRef, delta: u64) -> bool {
        let Some(end) = vma.end().checked_add(delta) else {
            return false;
        };
        if end > self.cfg.task_size {
            return false;
        }
        // Only an intersecting VMA stops it: like a MAP_FIXED placement,
        // the growth ignores the stack guard gap of a VMA above.
        ed.find_after(vma.end())
            .is_none_or(|next| next.start() >= end)
    }

    /// The FIXED / DONTUNMAP cases.
    fn mremap_to(
        &self,
        ed: &mut Edit<'_>,
        gather: &mut Gather<'_>,
        mut req: Request,
    ) -> Result<u64> {
        let Request {
            old_addr,
            new_len,
            flags,
            new_addr,
            ..
        } = req;
        if flags.contains(MremapFlags::FIXED) {
            ed.unmap_into(Range::new(new_addr, new_addr + new_len), gather)?;
        }
        if new_len < req.old_len {
            ed.unmap_into(self.shrunk_tail(old_addr, req.old_len, new_len)?, gather)?;
            req.old_len = new_len;
        }
        let Some(vma) = ed.find(old_addr) else {
            return Err(Error::Fault);
        };
        let shared = vma.flags().contains(VmFlags::MAYSHARE);
        let dst = if flags.contains(MremapFlags::FIXED) {
            new_addr
        } else {
            let mflags = if shared {
                MapFlags::SHARED
            } else {
                MapFlags::PRIVATE
            };
            let backing = Backing::of_vma(&vma, old_addr);
            self.get_unmapped_area(&ed.view(), new_addr, new_len, false, mflags, backing)?
        };
        // Linux checks every placement against `mmap_min_addr`
        // (`security_mmap_addr`); unlike mmap, mremap does not first raise
        // a hint to it, so a free hint below it fails too.
        if dst < self.cfg.mmap_min_addr {
            return Err(Error::Perm);
        }
        self.move_vma(ed, gather, vma, req, dst)
    }

    /// Moves `[old_addr, old_addr + old_len)` of `vma` to a new VMA of
    /// `new_len` bytes at `dst` (free): the page-table entries move, then
    /// the old range is unmapped (or, with DONTUNMAP, left empty).
    fn move_vma(
        &self,
        ed: &mut Edit<'_>,
        gather: &mut Gather<'_>,
        vma: VmaRef,
        req: Request,
        dst: u64,
    ) -> Result<u64> {
        let Request {
            old_addr,
            old_len,
            new_len,
            flags,
            ..
        } = req;
        if ed.map_count_at_least(self.cfg.max_map_count.saturating_sub(3)) {
            return Err(Error::NoMem);
        }
        ed.lock(vma);
        // A VMA that never got an anon_vma takes the offset of its new
        // place (so it stays mergeable there); one that did keeps its own,
        // which its pages are indexed by.
        let pgoff = if vma.is_anonymous() && !vma.has_anon_vma() {
            dst >> PAGE_SHIFT
        } else {
            vma.pgoff_of(old_addr)
        };
        // The moved mapping leaves its userfault registration behind
        // (mremap_userfaultfd_prep without UFFD_FEATURE_EVENT_REMAP), and
        // its entries their write-protect bits.
        let registered = vma.flags().intersects(UFFD_FLAGS);
        ed.map_new(VmaSpec {
            flags: vma.flags() - UFFD_FLAGS,
            uffd: None,
            ..VmaSpec::like(&vma, Range::new(dst, dst + new_len), pgoff)
        });
        let moved_len = old_len.min(new_len);
        if moved_len > 0 {
            // A shrink of the object must not see the entries in flight
            // between two VMAs it visits in either order.
            let obj = vma.shmem_arc();
            let _moving = obj.as_ref().map(|o| o.mappings.lock());
            self.move_page_tables(gather, old_addr, dst, moved_len);
            if registered {
                crate::uffd::clear_wp_bits(self, Range::new(dst, dst + moved_len));
            }
        }
        if old_len == 0 {
            return Ok(dst);
        }
        if flags.contains(MremapFlags::DONTUNMAP) {
            // The old VMA stays, empty (and still charged: Linux puts the
            // charge back); if it moved whole it no longer owns the
            // anon_vma.
            let Some(old) = ed.find(old_addr) else {
                return Ok(dst);
            };
            ed.lock(old);
            if old.start() == old_addr && old.end() == old_addr + old_len {
                old.set_anon_vma(None);
            }
            // The lock stays with the pages: the whole old VMA (not split,
            // not merged) loses VM_LOCKED and VM_LOCKONFAULT, as Linux's
            // dontunmap_complete.
            old.set_flags(old.flags() - VmFlags::LOCKED - VmFlags::LOCKONFAULT);
            return Ok(dst);
        }
        // Linux's move_vma ignores a failure here (out of memory for the
        // split that unmapping part of a VMA needs): the move is done, the
        // old range stays mapped, empty, and the call succeeds.
        let _ = ed.unmap_into(Range::new(old_addr, old_addr + old_len), gather);
        Ok(dst)
    }

    /// Moves the page-table entries of `[from, from + len)` to `to` in
    /// extents as [`Config::mremap_extent`](crate::Config) says, flushing
    /// after each extent (under its page-table locks) or, when batched,
    /// leaving one flush over everything moved to `gather`.
    ///
    /// No frame is freed by a move, and until the flush a CPU may still
    /// translate an old address to the frame that now lives at the new
    /// one: it reads or writes the moved data, as if its access came just
    /// before the move. The caller's `gather` flushes before the mmap_lock
    /// is released, so the old range is never reused while such a
    /// translation is alive.
    fn move_page_tables(&self, gather: &mut Gather<'_>, from: u64, to: u64, len: u64) {
        let (max_extent, per_extent) = match self.cfg.mremap_extent {
            MremapExtent::Pages(n) => (n.max(1).saturating_mul(PAGE_SIZE), true),
            MremapExtent::Pmd => (u64::MAX, true),
            MremapExtent::Batched => (u64::MAX, false),
        };
        let g = self.pt.pin();
        let st = self.pt.move_range(from, to, len, max_extent, &g, |extent| {
            gather.add_range(extent);
            if per_extent {
                gather.flush();
            }
        });
        if st.copied > 0 {
            self.stats.add(Event::mremap_ptes_moved, st.copied);
        }
        if st.relinked > 0 {
            self.stats.add(Event::mremap_tables_relinked, st.relinked);
        }
    }
}
