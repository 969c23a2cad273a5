//! brk: the heap.
//!
//! # Locking
//!
//! The mmap_lock write side (through `Edit`); growth that only moves the
//! heap VMA's end skips the anon_vma family lock (`Config::brk_fast_path`).

use super::edit::{Edit, VmaSpec};
use super::AddressSpace;
use crate::addr::{page_align_up, Range, PAGE_SHIFT, PAGE_SIZE};
use crate::error::Result;
use crate::vma::VmFlags;

/// Flags of the heap VMA (x86-64's VM_DATA_DEFAULT_FLAGS plus accounting;
/// `mm->def_flags` are added).
pub(crate) const BRK_FLAGS: VmFlags = VmFlags::READ
    .union(VmFlags::WRITE)
    .union(VmFlags::MAY)
    .union(VmFlags::ACCOUNT);

impl AddressSpace {
    /// Moves the program break, like `brk(2)`: returns the new break, or
    /// the old one if the move is not possible (below the heap start, into
    /// another mapping or its guard, past the map-count limit). `brk(0)`
    /// returns the current break. The `Result` is always `Ok`; it is kept
    /// for uniformity with the other calls.
    pub fn brk(&self, addr: u64) -> Result<u64> {
        let (brk, grown) = self.brk_locked(addr);
        // After mlockall(MCL_FUTURE) the new part is locked: populate it
        // as mlock would (not with the lock held; errors ignored).
        if let Some(r) = grown {
            let _ = self.populate_locked(r, true);
        }
        Ok(brk)
    }

    /// [`brk`](Self::brk) under the mmap_lock: the new break, and the
    /// range it added when that is locked.
    fn brk_locked(&self, addr: u64) -> (u64, Option<Range>) {
        let mut ed = Edit::begin(self);
        let old = ed.state().brk;
        if addr < ed.state().start_brk {
            return (old, None);
        }
        let (Some(newbrk), Some(oldbrk)) = (page_align_up(addr), page_align_up(old)) else {
            return (old, None);
        };
        if newbrk > self.cfg.task_size {
            return (old, None);
        }
        if newbrk == oldbrk {
            ed.state_mut().brk = addr;
            return (addr, None);
        }
        if newbrk < oldbrk {
            // Shrink: unmap the tail of the heap (which must be there).
            if ed.find_after(newbrk).is_none_or(|v| v.start() >= oldbrk) {
                return (old, None);
            }
            if let Some(v) = ed.find(newbrk).filter(|v| {
                v.start() < newbrk && v.end() == oldbrk && v.start() >= ed.state().start_brk
            }) {
                // Only the heap VMA's end moves, with nothing inserted:
                // shrink it in place (no split, so no anon_vma lock with
                // the fast path), then zap and free what it left.
                ed.lock(v);
                ed.set_range(v, v.start(), newbrk, v.pgoff());
                let r = Range::new(newbrk, oldbrk);
                let mut gather = ed.gather();
                ed.zap(r, &mut gather);
                gather.flush();
                drop(gather);
                ed.free_pgtables(r);
                ed.state_mut().brk = addr;
                return (addr, None);
            }
            if ed.unmap(Range::new(newbrk, oldbrk)).is_err() {
                return (old, None);
            }
            ed.state_mut().brk = addr;
            return (addr, None);
        }
        // Grow: within the memlock limit when mlockall(MCL_FUTURE) locks
        // the heap's growth.
        let flags = BRK_FLAGS | ed.state().def_flags;
        if !self.mlock_future_ok(&ed, flags, newbrk - oldbrk) {
            return (old, None);
        }
        // Stay one page below the next mapping (and its guard gap).
        // `newbrk <= task_size`, so `newbrk + PAGE_SIZE` cannot overflow;
        // the guard gap is the embedder's choice, so that sum saturates.
        if let Some(next) = ed.find_after(oldbrk) {
            let reach = (newbrk + PAGE_SIZE).saturating_add(self.cfg.stack_guard_gap);
            if next.start() < reach && newbrk + PAGE_SIZE > self.vm_start_gap(next) {
                return (old, None);
            }
        }
        let heap = ed.ending_at(oldbrk).filter(|v| {
            v.start() >= ed.state().start_brk
                && super::merge::flags_mergeable(v.flags(), flags)
                && v.name().is_none()
        });
        match heap {
            Some(v) => {
                // Only the end moves: nothing else changes owner.
                ed.lock(v);
                ed.set_range(v, v.start(), newbrk, v.pgoff());
                // Grown memory reads as written (Linux's do_brk_flags),
                // and with it the whole heap VMA.
                v.set_flags(v.flags() | VmFlags::SOFTDIRTY);
            }
            None => {
                if ed.map_count() >= self.cfg.max_map_count || !ed.vma_room(1) {
                    return (old, None);
                }
                let r = Range::new(oldbrk, newbrk);
                let v = ed.new_vma(VmaSpec::anon(
                    r,
                    oldbrk >> PAGE_SHIFT,
                    flags | VmFlags::SOFTDIRTY,
                ));
                ed.insert(v);
            }
        }
        ed.state_mut().brk = addr;
        let grown = flags
            .contains(VmFlags::LOCKED)
            .then(|| Range::new(oldbrk, newbrk));
        (addr, grown)
    }
}
