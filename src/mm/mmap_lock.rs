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
//! exclusive) before the reader-writer lock, and range writers
//! ([`MmapLock::write_range`], [`MmapLock::try_write_range`]) lock their
//! range exclusive and the reader-writer lock's read side (the state it
//! guards is only read by them; their map-count changes are atomic). All
//! writers then share write sections of the sequence (`MmLockSeq::join`).
//! See `range_lock`'s module docs for the protocol.
//!
//! # Locking
//!
//! The mmap_lock comes before any VMA lock. A thread that holds a VMA read
//! lock must never block on the mmap_lock (the writer may be waiting for
//! that very VMA); it may only try-lock it.

use super::range_lock::{RangeGuard, RangeLock, WHOLE};
use crate::addr::Range;
use crate::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
pub(crate) use crate::vma::seq::MmLockSeq;
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

/// Read guard of [`MmapLock`].
pub struct MmapReadGuard<'a, T> {
    g: RwLockReadGuard<'a, T>,
    _range: Option<RangeGuard<'a>>,
}

/// The reader-writer lock's side a writer holds.
enum Side<'a, T> {
    /// The mmap_lock writer, or a whole-space writer in range mode.
    Write(RwLockWriteGuard<'a, T>),
    /// A range writer: it only reads the state.
    Read(RwLockReadGuard<'a, T>),
}

/// Write guard of [`MmapLock`]; dropping it ends (or leaves) the write
/// section.
pub struct MmapWriteGuard<'a, T> {
    g: Option<Side<'a, T>>,
    seq: &'a MmLockSeq,
    /// The range held in range mode (the whole space for a global writer).
    range: Option<RangeGuard<'a>>,
}

impl<T> MmapLock<T> {
    /// Wraps `v`.
    #[cfg(any(test, aspace_loom))]
    pub fn new(v: T) -> Self {
        Self::with_ranges(v, false)
    }

    /// Wraps `v`, with a range lock for range-locked writers if `ranges`.
    pub fn with_ranges(v: T, ranges: bool) -> Self {
        MmapLock {
            rw: RwLock::new(v),
            seq: MmLockSeq::new(),
            ranges: ranges.then(RangeLock::new),
        }
    }

    /// True with range-locked writers.
    #[inline]
    pub fn is_range_mode(&self) -> bool {
        self.ranges.is_some()
    }

    /// Locks `r` exclusive for a range writer (range mode only; `None`
    /// otherwise): its range, then the state's read side, then a share of
    /// the write section.
    pub(crate) fn write_range(&self, r: Range) -> Option<MmapWriteGuard<'_, T>> {
        let rg = self.ranges.as_ref()?.lock(r, true);
        Some(self.range_writer(rg))
    }

    /// Locks `r` exclusive for a range writer if nothing conflicts (range
    /// mode only).
    pub(crate) fn try_write_range(&self, r: Range) -> Option<MmapWriteGuard<'_, T>> {
        let rg = self.ranges.as_ref()?.try_lock(r, true)?;
        Some(self.range_writer(rg))
    }

    /// The range lock (range mode only).
    pub(crate) fn ranges(&self) -> Option<&RangeLock> {
        self.ranges.as_ref()
    }

    fn range_writer<'a>(&'a self, rg: RangeGuard<'a>) -> MmapWriteGuard<'a, T> {
        let g = self.rw.read();
        self.seq.join();
        MmapWriteGuard {
            g: Some(Side::Read(g)),
            seq: &self.seq,
            range: Some(rg),
        }
    }

    /// The sequence (for VMA read-trylocks).
    #[inline]
    pub fn seq(&self) -> &MmLockSeq {
        &self.seq
    }

    /// Takes the read side.
    pub fn read(&self) -> MmapReadGuard<'_, T> {
        let range = self.ranges.as_ref().map(|l| l.lock(WHOLE, false));
        MmapReadGuard {
            g: self.rw.read(),
            _range: range,
        }
    }

    /// Takes the read side for a reader of `r` only: in range mode `r`
    /// shared (the caller computed `r` to hold the whole of every VMA it
    /// reads, and validates that under the lock: `range_lock`'s module
    /// docs), otherwise the whole read side, as [`read`](Self::read).
    pub(crate) fn read_range(&self, r: Range) -> MmapReadGuard<'_, T> {
        let range = self.ranges.as_ref().map(|l| l.lock(r, false));
        MmapReadGuard {
            g: self.rw.read(),
            _range: range,
        }
    }

    /// Takes the read side if no writer holds or waits for it.
    pub fn try_read(&self) -> Option<MmapReadGuard<'_, T>> {
        let range = match &self.ranges {
            Some(l) => Some(l.try_lock(WHOLE, false)?),
            None => None,
        };
        self.rw
            .try_read()
            .map(|g| MmapReadGuard { g, _range: range })
    }

    /// Takes the write side and starts a write section (in range mode:
    /// the whole space, and a share of the write section).
    pub fn write(&self) -> MmapWriteGuard<'_, T> {
        let range = self.ranges.as_ref().map(|l| l.lock(WHOLE, true));
        let g = self.rw.write();
        if range.is_some() {
            self.seq.join();
        } else {
            self.seq.write_begin();
        }
        MmapWriteGuard {
            g: Some(Side::Write(g)),
            seq: &self.seq,
            range,
        }
    }
}

/// A guard of the mmap_lock that may hold a range of the range lock.
pub(crate) trait RangeHold {
    /// [`RangeGuard::undisturbed_since`] of the range held (false if none).
    fn undisturbed_since(&self, mark: Option<u64>) -> bool;
}

impl<T> RangeHold for MmapWriteGuard<'_, T> {
    fn undisturbed_since(&self, mark: Option<u64>) -> bool {
        self.range
            .as_ref()
            .is_some_and(|r| r.undisturbed_since(mark))
    }
}

impl<T> RangeHold for MmapReadGuard<'_, T> {
    fn undisturbed_since(&self, mark: Option<u64>) -> bool {
        self._range
            .as_ref()
            .is_some_and(|r| r.undisturbed_since(mark))
    }
}

impl<'a, T> MmapWriteGuard<'a, T> {
    /// The sequence of this write section.
    #[inline]
    pub fn seq(&self) -> &'a MmLockSeq {
        self.seq
    }

    /// The range held: the whole space, except for a range writer.
    pub(crate) fn range(&self) -> Range {
        self.range.as_ref().map_or(WHOLE, RangeGuard::range)
    }

    /// True for a range writer (it may change only VMAs inside
    /// [`range`](Self::range), and not the state behind the lock).
    pub(crate) fn is_range_writer(&self) -> bool {
        matches!(self.g, Some(Side::Read(_)))
    }
}

impl<T> Drop for MmapWriteGuard<'_, T> {
    fn drop(&mut self) {
        // Release every VMA locked in this section (or leave the shared
        // one), then the lock itself, then the range.
        if self.range.is_some() {
            self.seq.leave();
        } else {
            self.seq.write_end();
        }
        drop(self.g.take());
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
        match self.g.as_ref().expect("guard holds the lock until dropped") {
            Side::Write(g) => g,
            Side::Read(g) => g,
        }
    }
}

impl<T> DerefMut for MmapWriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        match self.g.as_mut().expect("guard holds the lock until dropped") {
            Side::Write(g) => g,
            Side::Read(_) => panic!("a range writer changed the mm-wide state"),
        }
    }
}

#[cfg(all(test, not(aspace_loom)))]
mod tests {
    use super::*;

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
    fn range_writers_share_a_section_and_exclude_readers() {
        let l = MmapLock::with_ranges(5, true);
        let a = l.write_range(Range::new(0, 10)).unwrap();
        let b = l.write_range(Range::new(10, 20)).unwrap();
        assert!(a.is_range_writer() && a.seq().is_write_locked());
        assert!(l.try_read().is_none(), "a reader takes the whole space");
        drop(a);
        assert!(l.seq().is_write_locked(), "b is still in the section");
        drop(b);
        assert!(!l.seq().is_write_locked());
        assert_eq!(*l.try_read().unwrap(), 5);
        assert!(MmapLock::new(0).write_range(Range::new(0, 1)).is_none());
    }
}
