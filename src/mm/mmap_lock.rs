//! The sequence-counted mmap_lock.
//!
//! A reader-writer lock plus a sequence number. Taking the write side makes
//! the sequence odd; every VMA the writer write-locks is stamped with that
//! value. Dropping the write side (or downgrading it) makes the sequence
//! even again with `Release` ordering, which unlocks every stamped VMA at
//! once: their stamps no longer match.
//!
//! With `WriterLocking::Range` the same type fronts a [`RangeLock`]: the
//! read side and the whole-space write side lock the whole range (shared or
//! exclusive) instead of the reader-writer lock, and range writers
//! ([`MmapLock::write_range`], [`MmapLock::try_write_range`]) and range
//! readers ([`MmapLock::read_range`]) lock only their range. The state
//! behind the reader-writer lock is written only by whole-space writers,
//! which the range lock keeps apart from every other holder, so no holder
//! takes the reader-writer lock in range mode (its count would be a line
//! every writer writes, and two more locked instructions a call for the
//! range lock's bias owner). Every writer then runs its own
//! write section (`vma::seq`'s "Own write sections"): it stamps the VMAs
//! it locks with its own value and unlocks each of them when it ends.
//! See `range_lock`'s module docs for the protocol.
//!
//! # Locking
//!
//! The mmap_lock comes before any VMA lock. A thread that holds a VMA read
//! lock must never block on the mmap_lock (the writer may be waiting for
//! that very VMA); it may only try-lock it.

use super::range_lock::{RangeGuard, RangeLock, Wait, WHOLE};
use crate::addr::Range;
use crate::sync::{
    read_unlocked, write_unlocked, RwLock, RwLockReadGuard, RwLockWriteGuard, UnlockedRead,
    UnlockedWrite,
};
pub(crate) use crate::vma::seq::MmLockSeq;
use crate::vma::seq::{token, LOCKED};
use crate::vma::VmaRef;
use core::cell::Cell;
use core::mem::ManuallyDrop;
use core::ops::{Deref, DerefMut};

/// The mmap_lock: a reader-writer lock over `T` plus an [`MmLockSeq`]
/// (and, with range-locked writers, a [`RangeLock`]).
#[derive(Debug)]
pub struct MmapLock<T> {
    rw: RwLock<T>,
    seq: MmLockSeq,
    /// `Some` with `WriterLocking::Range`.
    ranges: Option<RangeLock>,
}

/// The reader-writer lock's side a guard holds.
enum Side<'a, T> {
    /// The read side: an mmap_lock reader, or a whole-space reader in
    /// range mode.
    Read(RwLockReadGuard<'a, T>),
    /// The write side: the mmap_lock writer.
    Write(RwLockWriteGuard<'a, T>),
    /// None, for a whole-space writer in range mode: the range lock's
    /// whole space, held exclusive, keeps every other holder out.
    Whole(UnlockedWrite<'a, T>),
    /// None: a range holder or a whole-space reader in range mode, which
    /// only reads the state, and which the range lock keeps apart from
    /// every writer of it.
    Ranged(UnlockedRead<'a, T>),
}

impl<T> Deref for Side<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        match self {
            Side::Read(g) => g,
            Side::Write(g) => g,
            Side::Whole(g) => g,
            Side::Ranged(g) => g,
        }
    }
}

/// Read guard of [`MmapLock`].
pub struct MmapReadGuard<'a, T> {
    g: Side<'a, T>,
    _range: Option<RangeGuard<'a>>,
}

/// How a writer's VMA locks end (`vma::seq`).
enum Section<'a> {
    /// With the write side: the mm sequence's odd value, which the
    /// guard's drop advances past every stamp at once.
    Shared(&'a MmLockSeq),
    /// An own section: `LOCKED | token`, each VMA stamped back to `token`
    /// by the guard's drop.
    Own {
        token: u64,
        /// The VMAs this section stamped: a few in place (a range writer
        /// locks one to three, and this is on its path: no allocation,
        /// and a guard small enough to move cheaply), any more on the
        /// heap (boxed: one word in the guard instead of a `Vec`'s three).
        first: [Cell<Option<VmaRef>>; 3],
        #[allow(clippy::box_collection)]
        more: Cell<Option<Box<Vec<VmaRef>>>>,
    },
}

/// Write guard of [`MmapLock`]; dropping it ends the write section.
pub struct MmapWriteGuard<'a, T> {
    /// Released (dropped) before the range, in `drop`.
    g: ManuallyDrop<Side<'a, T>>,
    section: Section<'a>,
    /// The range held in range mode (the whole space for a global writer).
    range: Option<RangeGuard<'a>>,
}

impl<T> MmapLock<T> {
    /// Wraps `v`.
    #[cfg(any(test, aspace_loom))]
    pub fn new(v: T) -> Self {
        Self::with_ranges(v, None)
    }

    /// Wraps `v`, with `ranges` for range-locked writers if given.
    pub(crate) fn with_ranges(v: T, ranges: Option<RangeLock>) -> Self {
        MmapLock {
            rw: RwLock::new(v),
            // A range lock whose bias may be on starts with the shared
            // sequence: the bias's owner runs shared sections (`section`).
            seq: match &ranges {
                Some(l) if l.bias_is_off() => MmLockSeq::own_sections(),
                _ => MmLockSeq::new(),
            },
            ranges,
        }
    }

    /// Wraps `v` with a range lock over `[0, space_end)` in shards of
    /// `1 << shift` bytes (loom models of range mode's locks).
    #[cfg(aspace_loom)]
    pub fn with_range_lock(v: T, shift: u32, space_end: u64) -> Self {
        Self::with_ranges(v, Some(RangeLock::new(shift, space_end)))
    }

    /// True with range-locked writers.
    #[inline]
    pub fn is_range_mode(&self) -> bool {
        self.ranges.is_some()
    }

    /// Locks `r` exclusive for a range writer (range mode only; `None`
    /// otherwise).
    pub fn write_range(&self, r: Range) -> Option<MmapWriteGuard<'_, T>> {
        let rg = self.ranges.as_ref()?.lock(r, true);
        Some(self.range_writer(rg))
    }

    /// Locks `r` exclusive for a range writer if nothing conflicts (range
    /// mode only: `None` otherwise); `Err` says what to wait for.
    #[inline]
    pub(crate) fn try_write_range(&self, r: Range) -> Option<Result<MmapWriteGuard<'_, T>, Wait>> {
        let l = self.ranges.as_ref()?;
        Some(l.try_lock(r, true).map(|rg| self.range_writer(rg)))
    }

    /// The whole slot of `addr`, written, if the caller owns its bias
    /// ([`RangeLock::try_slot_owner`]); `None` otherwise (or outside
    /// range mode). Out of line, as [`write`](Self::write) is: every
    /// writer on the slot owner's path (mprotect's, munmap's, a placed
    /// mmap's) runs this one copy, which keeps that path's code within
    /// the instruction cache (`docs/RESULTS.md`, "The slot owner's code,
    /// shared, and its edits made in place").
    ///
    /// The section's token is taken before the request: nothing between
    /// the grant and the guard can then unwind, so the grant is built in
    /// registers, not kept in memory for an unwind's drop and copied out
    /// (read back in wider loads than its fields' stores, which the store
    /// buffer cannot forward: `docs/RESULTS.md`, "The slot owner's guard
    /// built in registers"). A token the request then finds no grant for
    /// is simply never used.
    #[inline(never)]
    pub(crate) fn write_slot(&self, addr: u64) -> Option<MmapWriteGuard<'_, T>> {
        let l = self.ranges.as_ref()?;
        let section = Section::own();
        let rg = l.try_slot_owner(addr)?;
        // A slot's owner is never the space's (`range_bias`): an own
        // section, as `section` gives every such writer.
        debug_assert!(!rg.is_biased());
        self.seq.own_sections_from_now();
        Some(MmapWriteGuard {
            g: ManuallyDrop::new(self.ranged()),
            section,
            range: Some(rg),
        })
    }

    /// True in range mode if the calling thread holds the range lock's
    /// bias or may claim it (`range_bias`): its writers and readers then
    /// take the whole space, granted at once, instead of computing,
    /// locking and validating a neighbourhood. A hint (the request
    /// decides): wrong, it costs a whole-space request, never correctness.
    #[inline]
    pub(crate) fn bias_likely_mine(&self) -> bool {
        self.ranges
            .as_ref()
            .is_some_and(RangeLock::bias_likely_mine)
    }

    /// The range lock (range mode only).
    pub(crate) fn ranges(&self) -> Option<&RangeLock> {
        self.ranges.as_ref()
    }

    #[inline]
    fn range_writer<'a>(&'a self, rg: RangeGuard<'a>) -> MmapWriteGuard<'a, T> {
        MmapWriteGuard {
            g: ManuallyDrop::new(self.ranged()),
            section: self.section(&rg),
            range: Some(rg),
        }
    }

    /// The write section of a range-mode writer granted `rg` (exclusive).
    ///
    /// A grant of the bias's owner is the only hold in the space
    /// (`Bias::owner_grant` refuses an exclusive one beside any other, and
    /// no other thread holds anything while the bias is on), so it runs a
    /// shared section as the classic mode's writer does: the sequence
    /// moves, and every VMA it locks is unlocked at once by the section's
    /// end, with no list to keep and no stamp to put back. Every other
    /// writer runs its own section; the first to do so puts the sequence
    /// at `LOCKED` for good ([`MmLockSeq::own_sections_from_now`]).
    #[inline]
    fn section(&self, rg: &RangeGuard<'_>) -> Section<'_> {
        if rg.is_biased() {
            self.seq.write_begin();
            Section::Shared(&self.seq)
        } else {
            self.seq.own_sections_from_now();
            Section::own()
        }
    }

    /// The state, read by a holder of a range (or of the whole space,
    /// shared) without the reader-writer lock.
    fn ranged(&self) -> Side<'_, T> {
        // SAFETY: called only for holders of the range lock (range mode).
        // The state is written only through a `Side::Whole` guard, which
        // `write` makes for the holder of the whole space exclusive: the
        // range lock keeps it apart from every other holder, and orders
        // its writes before their later grants (the gate's mutex and
        // `SeqCst` counts, or the bias's count, `range_lock`).
        Side::Ranged(unsafe { read_unlocked(&self.rw) })
    }

    /// The state, written by the holder of the whole space exclusive
    /// without the reader-writer lock.
    fn whole(&self) -> Side<'_, T> {
        // SAFETY: called only for the holder of the range lock's whole
        // space exclusive (range mode), which no other hold overlaps (the
        // bias's owner is refused a hold nested with it:
        // `Bias::owner_grant`); every access of the state in range mode
        // is under a hold, as `ranged`'s comment says.
        Side::Whole(unsafe { write_unlocked(&self.rw) })
    }

    /// The sequence (for VMA read-trylocks).
    #[inline]
    pub fn seq(&self) -> &MmLockSeq {
        &self.seq
    }

    /// Takes the read side.
    pub fn read(&self) -> MmapReadGuard<'_, T> {
        match &self.ranges {
            Some(l) => MmapReadGuard {
                _range: Some(l.lock(WHOLE, false)),
                g: self.ranged(),
            },
            None => MmapReadGuard {
                g: Side::Read(self.rw.read()),
                _range: None,
            },
        }
    }

    /// Takes the read side for a reader of `r` only: in range mode `r`
    /// shared (the caller computed `r` to hold the whole of every VMA it
    /// reads, and validates that under the lock: `range_lock`'s module
    /// docs), otherwise the whole read side, as [`read`](Self::read).
    pub(crate) fn read_range(&self, r: Range) -> MmapReadGuard<'_, T> {
        match &self.ranges {
            Some(l) => MmapReadGuard {
                _range: Some(l.lock(r, false)),
                g: self.ranged(),
            },
            None => self.read(),
        }
    }

    /// [`read_range`](Self::read_range) if nothing conflicts (without
    /// range mode: [`try_read`](Self::try_read)).
    pub(crate) fn try_read_range(&self, r: Range) -> Option<MmapReadGuard<'_, T>> {
        match &self.ranges {
            Some(l) => Some(MmapReadGuard {
                _range: Some(l.try_lock(r, false).ok()?),
                g: self.ranged(),
            }),
            None => self.try_read(),
        }
    }

    /// Takes the read side if no writer holds or waits for it.
    pub fn try_read(&self) -> Option<MmapReadGuard<'_, T>> {
        match &self.ranges {
            Some(l) => Some(MmapReadGuard {
                _range: Some(l.try_lock(WHOLE, false).ok()?),
                g: self.ranged(),
            }),
            None => self.rw.try_read().map(|g| MmapReadGuard {
                g: Side::Read(g),
                _range: None,
            }),
        }
    }

    /// Takes the write side and starts a write section (in range mode:
    /// the whole space, and a section of its own, or a shared one for the
    /// range lock's bias's owner: `section`).
    pub fn write(&self) -> MmapWriteGuard<'_, T> {
        match &self.ranges {
            Some(l) => {
                let range = l.lock(WHOLE, true);
                MmapWriteGuard {
                    section: self.section(&range),
                    g: ManuallyDrop::new(self.whole()),
                    range: Some(range),
                }
            }
            None => {
                let g = self.rw.write();
                self.seq.write_begin();
                MmapWriteGuard {
                    g: ManuallyDrop::new(Side::Write(g)),
                    section: Section::Shared(&self.seq),
                    range: None,
                }
            }
        }
    }
}

impl Section<'_> {
    fn own() -> Self {
        Section::Own {
            token: token(),
            first: Default::default(),
            more: Cell::new(None),
        }
    }
}

/// A guard of the mmap_lock that may hold a range of the range lock.
pub(crate) trait RangeHold {
    /// [`RangeGuard::undisturbed_since`] of the range held (false if none).
    fn undisturbed_since(&self, mark: Option<super::range_lock::Mark>) -> bool;
}

impl<T> RangeHold for MmapWriteGuard<'_, T> {
    fn undisturbed_since(&self, mark: Option<super::range_lock::Mark>) -> bool {
        self.range
            .as_ref()
            .is_some_and(|r| r.undisturbed_since(mark))
    }
}

impl<T> RangeHold for MmapReadGuard<'_, T> {
    fn undisturbed_since(&self, mark: Option<super::range_lock::Mark>) -> bool {
        self._range
            .as_ref()
            .is_some_and(|r| r.undisturbed_since(mark))
    }
}

impl<'a, T> MmapWriteGuard<'a, T> {
    /// The sequence of a shared section (classic mode).
    #[cfg(any(test, aspace_loom))]
    pub fn seq(&self) -> &'a MmLockSeq {
        match self.section {
            Section::Shared(seq) => seq,
            Section::Own { .. } => panic!("an own section has no sequence of its own"),
        }
    }

    /// The stamp this section writes into the VMAs it locks
    /// (`VmaLock::write_lock`): at or above the sequence until the section
    /// ends.
    #[inline]
    pub fn stamp(&self) -> u64 {
        match &self.section {
            Section::Shared(seq) => seq.current_relaxed(),
            Section::Own { token, .. } => token | LOCKED,
        }
    }

    /// Records `v`, which this section has just stamped
    /// (`VmaLock::write_lock` returned true), for an own section to
    /// unlock when it ends; nothing for a shared one.
    #[inline]
    pub(crate) fn stamped(&self, v: VmaRef) {
        if let Section::Own { first, more, .. } = &self.section {
            match first.iter().find(|s| s.get().is_none()) {
                Some(slot) => slot.set(Some(v)),
                None => {
                    let mut m = more.take().unwrap_or_default();
                    m.push(v);
                    more.set(Some(m));
                }
            }
        }
    }

    /// The slot whose bias granted this hold to its owner ("Slot biases"
    /// in `range_bias`), if one did.
    #[inline]
    pub(crate) fn owned_slot(&self) -> Option<usize> {
        self.range.as_ref().and_then(RangeGuard::owned_slot)
    }

    /// True if this writer holds the range lock's bias (`range_bias`).
    #[inline]
    pub(crate) fn holds_bias(&self) -> bool {
        self.range.as_ref().is_some_and(RangeGuard::is_biased)
    }

    /// The range held: the whole space, except for a range writer.
    pub(crate) fn range(&self) -> Range {
        self.range.as_ref().map_or(WHOLE, RangeGuard::range)
    }

    /// True for a range writer (it may change only VMAs inside
    /// [`range`](Self::range), and not the state behind the lock).
    pub(crate) fn is_range_writer(&self) -> bool {
        matches!(*self.g, Side::Ranged(_))
    }
}

impl<T> Drop for MmapWriteGuard<'_, T> {
    fn drop(&mut self) {
        // Release every VMA locked in this section (at once, or one by
        // one for an own section), then the lock itself, then the range.
        match &self.section {
            Section::Shared(seq) => seq.write_end(),
            Section::Own { token, first, more } => {
                let more = more.take().map_or_else(Vec::new, |m| *m);
                for v in first.iter().map_while(Cell::get).chain(more) {
                    v.lock.unlock_own(*token);
                }
            }
        }
        // SAFETY: `g` is dropped once, here, and not used after.
        unsafe { ManuallyDrop::drop(&mut self.g) };
        drop(self.range.take());
    }
}

impl<T> Deref for MmapReadGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.g
    }
}

impl<T> Deref for MmapWriteGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.g
    }
}

impl<T> DerefMut for MmapWriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        match &mut *self.g {
            Side::Write(g) => g,
            Side::Whole(g) => g,
            Side::Read(_) | Side::Ranged(_) => panic!("a range writer changed the mm-wide state"),
        }
    }
}

#[cfg(all(test, not(aspace_loom)))]
mod tests {
    use super::*;

    fn ranged<T>(v: T) -> MmapLock<T> {
        MmapLock::with_ranges(v, Some(RangeLock::new(39, 1 << 47)))
    }

    #[test]
    fn sequence_parity() {
        let l = MmapLock::new(5);
        assert!(!l.seq().is_write_locked());
        {
            let mut w = l.write();
            assert!(w.seq().is_write_locked());
            *w += 1;
            assert!(l.try_read().is_none());
        }
        assert!(!l.seq().is_write_locked());
        assert_eq!(*l.read(), 6);
        let s = l.seq().current();
        assert!(
            s > 0 && s & 1 == 0,
            "one section ended: even and moved ({s})"
        );
    }

    #[test]
    fn range_writers_run_own_sections_and_exclude_readers() {
        let l = ranged(5);
        let a = l.write_range(Range::new(0, 10)).unwrap();
        let b = l.write_range(Range::new(10, 20)).unwrap();
        assert!(a.is_range_writer() && b.is_range_writer());
        assert_ne!(a.stamp(), b.stamp(), "each writer its own section");
        for s in [a.stamp(), b.stamp()] {
            assert!(s >= l.seq().current(), "a section's stamp reads locked");
        }
        assert!(l.try_read().is_none(), "a reader takes the whole space");
        assert_eq!(*a, 5, "range writers read the state");
        drop(a);
        assert!(l.try_read().is_none(), "b still holds its range");
        drop(b);
        assert_eq!(*l.try_read().unwrap(), 5);
        assert!(!l.seq().is_write_locked(), "the sequence never moves");
        *l.write() += 1;
        assert_eq!(*l.read_range(Range::new(0, 1)), 6);
        assert!(MmapLock::new(0).write_range(Range::new(0, 1)).is_none());
    }

    fn biased<T>(v: T) -> MmapLock<T> {
        MmapLock::with_ranges(v, Some(RangeLock::with_bias(39, 1 << 47, true, 0)))
    }

    /// In range mode nobody takes the reader-writer lock: the bias's
    /// owner writes and reads the state through its grants alone, its
    /// shared grants nest, and the state's changes stay.
    #[test]
    fn the_bias_owner_reads_and_writes_the_state_without_the_rw_lock() {
        let l = biased(5);
        *l.write() += 1;
        let r = l.read();
        let nested = l.try_read().expect("the owner's shared grants nest");
        assert_eq!((*r, *nested), (6, 6));
        drop((r, nested));
        assert!(
            l.rw.try_write().is_some(),
            "the reader-writer lock itself is never taken"
        );
    }

    /// The owner's request inside its own exclusive hold would deadlock
    /// without the bias (and lend the state twice with it): it panics.
    #[test]
    #[should_panic(expected = "nested inside an exclusive hold")]
    fn the_bias_owner_nesting_a_request_in_its_write_panics() {
        let l = biased(5);
        let _w = l.write();
        let _ = l.try_read();
    }

    /// So does an exclusive request inside the owner's shared hold (an
    /// upgrade).
    #[test]
    #[should_panic(expected = "an exclusive one inside a hold")]
    fn the_bias_owner_upgrading_its_read_panics() {
        let l = biased(5);
        let _r = l.read();
        let _ = l.write();
    }
}
