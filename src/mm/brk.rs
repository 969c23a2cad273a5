//! brk: the heap.
//!
//! # Locking
//!
//! The mmap_lock write side (through `Edit`); growth that only moves the
//! heap VMA's end skips the anon_vma family lock (`Config::brk_fast_path`).
//!
//! With range-locked writers (`WriterLocking::Range`) a brk is a range
//! writer ([`brk_span`]): it holds the pages from the old break to the new
//! one and a page on each side (with the VMAs there, which it may grow,
//! shrink or merge with), a shrink also munmap's hole (it frees page
//! tables), a growth also the stack guard gap above the new break (its
//! check for a `MAP_GROWSDOWN` VMA there). Every such hold contains the
//! page on each side of the old break, so two brks always conflict and
//! run one after the other. The break itself ([`Heap`]) is read before
//! anything is held, to know what to lock, and read again under the hold:
//! if another brk moved it meanwhile, the writer unlocks and starts over.
//! After `mlockall(MCL_FUTURE)` a growth is locked memory, whose limit
//! counts every locked VMA: brk then takes the whole space.

use super::edit::{Edit, Reach, VmaSpec};
use super::AddressSpace;
use crate::addr::{page_align_up, Range, PAGE_SHIFT, PAGE_SIZE};
use crate::error::Result;
use crate::sync::{AtomicU64, Ordering::Relaxed};
use crate::vma::VmFlags;

/// The heap's bounds: `mm->start_brk` and `mm->brk`.
///
/// Protected by: written under the whole space (exec's reset,
/// `set_start_brk`, a fork's child) and, the break only, by a brk holding
/// the page on each side of the old break (every brk's hold does: see the
/// [module docs](self)); read under any hold that excludes those writers
/// (the whole space, or a brk's own hold), or without one as a guess that
/// the reader checks again under its hold. Atomics (relaxed: the range
/// lock's grant and release order them) since range writers elsewhere run
/// beside a brk.
#[derive(Debug)]
pub(crate) struct Heap {
    start: AtomicU64,
    brk: AtomicU64,
}

impl Heap {
    /// An empty heap at `start`.
    pub(crate) fn new(start: u64) -> Self {
        Heap {
            start: AtomicU64::new(start),
            brk: AtomicU64::new(start),
        }
    }

    /// The heap's start (`mm->start_brk`).
    pub(crate) fn start(&self) -> u64 {
        self.start.load(Relaxed)
    }

    /// The break (`mm->brk`).
    pub(crate) fn brk(&self) -> u64 {
        self.brk.load(Relaxed)
    }

    /// Moves the break.
    fn set_brk(&self, brk: u64) {
        self.brk.store(brk, Relaxed);
    }

    /// An empty heap at `start` (whole-space writers only).
    pub(crate) fn reset(&self, start: u64) {
        self.start.store(start, Relaxed);
        self.brk.store(start, Relaxed);
    }

    /// `from`'s bounds (a fork's child, whole space held on both).
    pub(crate) fn copy_from(&self, from: &Heap) {
        self.start.store(from.start(), Relaxed);
        self.brk.store(from.brk(), Relaxed);
    }

    /// Linux (6.7+, `vma_is_initial_heap`) prints `[heap]` for a VMA that
    /// overlaps `[start_brk, brk)`: one that merely ends at the heap's
    /// start, or starts at the break, is not the heap, and an empty heap
    /// has none.
    pub(crate) fn labels(&self, r: Range) -> bool {
        r.start < self.brk() && r.end > self.start()
    }
}

/// What a brk from the break `old` towards `addr` may change, for a heap
/// starting at `start`, and how far its neighbourhood reaches (the
/// [module docs](self)): a shrink `[new, old)` (rounded up to pages) with
/// munmap's hole; a growth `[old, new)` and the stack guard gap above it; a
/// call that moves no page (or fails before any check of the tree) the
/// empty range at the old break, whose neighbourhood is still its pages on
/// each side.
fn brk_span(start: u64, old: u64, addr: u64, task_size: u64, guard_gap: u64) -> (Range, Reach) {
    let (newbrk, oldbrk) = brk_pages(start, old, addr, task_size).unwrap_or_else(|| {
        // `old <= task_size`, so it rounds up without overflow.
        let oldbrk = page_align_up(old).unwrap_or(old);
        (oldbrk, oldbrk)
    });
    if newbrk < oldbrk {
        (Range::new(newbrk, oldbrk), Reach::Hole)
    } else if newbrk > oldbrk {
        // The grow check reads the next VMA below `newbrk + PAGE_SIZE`
        // plus the guard gap (the neighbourhood adds the page).
        let top = newbrk
            .saturating_add(PAGE_SIZE)
            .saturating_add(guard_gap)
            .min(task_size)
            .max(newbrk);
        (Range::new(oldbrk, top), Reach::Vmas)
    } else {
        (Range::new(oldbrk, oldbrk), Reach::Vmas)
    }
}

/// The new and the old break rounded up to pages, for a brk from `old`
/// towards `addr` with the heap starting at `start`; `None` when the call
/// fails before it looks at the tree (below the heap's start, rounding
/// past the top of the address space, past the task size). The one rule
/// both the brk and the range it locks ([`brk_span`]) follow.
fn brk_pages(start: u64, old: u64, addr: u64, task_size: u64) -> Option<(u64, u64)> {
    if addr < start {
        return None;
    }
    let (newbrk, oldbrk) = (page_align_up(addr)?, page_align_up(old)?);
    (newbrk <= task_size).then_some((newbrk, oldbrk))
}

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
        let mut ed = self.brk_edit(addr);
        let old = self.heap.brk();
        let Some((newbrk, oldbrk)) = brk_pages(self.heap.start(), old, addr, self.cfg.task_size)
        else {
            return (old, None);
        };
        if newbrk == oldbrk {
            self.heap.set_brk(addr);
            return (addr, None);
        }
        if newbrk < oldbrk {
            // Shrink: unmap the tail of the heap (which must be there).
            if ed.find_after(newbrk).is_none_or(|v| v.start() >= oldbrk) {
                return (old, None);
            }
            if let Some(v) = ed.find(newbrk).filter(|v| {
                v.start() < newbrk && v.end() == oldbrk && v.start() >= self.heap.start()
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
                // As munmap: faults waiting for a userfault handler in the
                // cut pages retry and find no mapping.
                if let Some(ctx) = v.uffd_arc() {
                    ctx.wake(r);
                }
                self.heap.set_brk(addr);
                return (addr, None);
            }
            if ed.unmap(Range::new(newbrk, oldbrk)).is_err() {
                return (old, None);
            }
            self.heap.set_brk(addr);
            return (addr, None);
        }
        // Grow: within the memlock limit when mlockall(MCL_FUTURE) locks
        // the heap's growth.
        let flags = BRK_FLAGS | ed.state().def_flags;
        if !self.mlock_future_ok(&ed, flags, newbrk - oldbrk) {
            return (old, None);
        }
        // Stay one page below the next mapping (and its guard gap).
        // `newbrk <= task_size`, whose page below the top `validate`
        // keeps (`new` takes a config as given: the sums saturate); the
        // guard gap is the embedder's choice, so that sum saturates too.
        if let Some(next) = ed.find_after(oldbrk) {
            let above = newbrk.saturating_add(PAGE_SIZE);
            let reach = above.saturating_add(self.cfg.stack_guard_gap);
            if next.start() < reach && above > self.vm_start_gap(next) {
                return (old, None);
            }
        }
        let heap = ed.ending_at(oldbrk).filter(|v| {
            v.start() >= self.heap.start()
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
                if ed.map_count_at_least(self.cfg.max_map_count) || !ed.vma_room(1) {
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
        self.heap.set_brk(addr);
        let grown = flags
            .contains(VmFlags::LOCKED)
            .then(|| Range::new(oldbrk, newbrk));
        (addr, grown)
    }

    /// The edit a brk to `addr` runs in: with range-locked writers (and no
    /// `mlockall(MCL_FUTURE)` in force) a range writer of [`brk_span`],
    /// computed from the break read before the hold and checked again
    /// under it; otherwise the whole space.
    fn brk_edit(&self, addr: u64) -> Edit<'_> {
        if !self.mmap_lock.is_range_mode() {
            return Edit::begin(self);
        }
        let span = |h: &Heap| {
            brk_span(
                h.start(),
                h.brk(),
                addr,
                self.cfg.task_size,
                self.cfg.stack_guard_gap,
            )
        };
        let mut want = span(&self.heap);
        loop {
            let ed = Edit::begin_range(self, want.0, want.1);
            if !ed.state().def_flags.is_empty() {
                // Growth would be locked memory, whose limit counts every
                // locked VMA.
                drop(ed);
                return Edit::begin(self);
            }
            // Mutation the loom model `range_brks_race` catches: trusting
            // the guess (another brk moved the break between the read and
            // the grant, and this one acts on the old heap).
            let now = span(&self.heap);
            if now == want {
                return ed;
            }
            want = now;
        }
    }
}
