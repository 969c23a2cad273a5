//! The sequence-counted mmap_lock.
//!
//! A reader-writer lock plus a sequence number. Taking the write side makes
//! the sequence odd; every VMA the writer write-locks is stamped with that
//! value. Dropping the write side (or downgrading it) makes the sequence
//! even again with `Release` ordering, which unlocks every stamped VMA at
//! once: their stamps no longer match.
//!
//! # Locking
//!
//! The mmap_lock comes before any VMA lock. A thread that holds a VMA read
//! lock must never block on the mmap_lock (the writer may be waiting for
//! that very VMA); it may only try-lock it.

use crate::sync::{AtomicU64, Ordering, RwLock, RwLockReadGuard, RwLockWriteGuard};
use core::ops::{Deref, DerefMut};

/// An address space's lock sequence (`mm->mm_lock_seq`).
///
/// 64 bits, so it never wraps: a VMA stamped in an old write section can
/// never match the current sequence again (at one write section per
/// nanosecond, 2^63 sections take 292 years). With 32 bits, 2^31 sections
/// would bring an old stamp back, and `VmaLock::write_lock` would skip
/// draining readers of a VMA it believed already locked.
#[derive(Debug)]
pub struct MmLockSeq {
    seq: AtomicU64,
}

impl Default for MmLockSeq {
    fn default() -> Self {
        Self::new()
    }
}

impl MmLockSeq {
    /// Sequence 0, not write-locked.
    pub fn new() -> Self {
        MmLockSeq {
            seq: AtomicU64::new(0),
        }
    }

    /// The current sequence, `Acquire` (pairs with [`write_end`](Self::write_end)).
    #[inline]
    pub fn current(&self) -> u64 {
        self.seq.load(Ordering::Acquire)
    }

    /// The current sequence without ordering (early checks, the writer).
    #[inline]
    pub fn current_relaxed(&self) -> u64 {
        self.seq.load(Ordering::Relaxed)
    }

    /// Starts a write section (sequence becomes odd). Only the holder of
    /// the write lock calls this.
    ///
    /// A read-modify-write, not a plain store: it continues the release
    /// sequence headed by the previous section's [`write_end`]
    /// (Self::write_end). A reader whose `Acquire` load of
    /// [`current`](Self::current) returns this odd value then still
    /// synchronizes with that `write_end`, and sees every change the
    /// previous section made to the VMAs it did not lock in this one. A
    /// plain store would head no release sequence, and such a reader could
    /// act on stale VMA fields (the loom model
    /// `two_write_sections_vs_reader` catches it).
    pub fn write_begin(&self) {
        let prev = self.seq.fetch_add(1, Ordering::Relaxed);
        debug_assert!(prev & 1 == 0);
    }

    /// Ends a write section (sequence becomes even), releasing every VMA
    /// write lock taken in it.
    pub fn write_end(&self) {
        let s = self.seq.load(Ordering::Relaxed);
        debug_assert!(s & 1 == 1);
        self.seq.store(s + 1, Ordering::Release);
    }

    /// A sequence that starts at `seq` (even), for tests of values no
    /// real run reaches.
    #[cfg(all(test, not(aspace_loom)))]
    pub(crate) fn starting_at(seq: u64) -> Self {
        debug_assert!(seq & 1 == 0);
        MmLockSeq {
            seq: AtomicU64::new(seq),
        }
    }

    /// True inside a write section.
    pub fn is_write_locked(&self) -> bool {
        self.seq.load(Ordering::Relaxed) & 1 == 1
    }
}

/// The mmap_lock: a reader-writer lock over `T` plus an [`MmLockSeq`].
#[derive(Debug)]
pub struct MmapLock<T> {
    rw: RwLock<T>,
    seq: MmLockSeq,
}

/// Read guard of [`MmapLock`].
pub struct MmapReadGuard<'a, T> {
    g: RwLockReadGuard<'a, T>,
}

/// Write guard of [`MmapLock`]; dropping it ends the write section.
pub struct MmapWriteGuard<'a, T> {
    g: Option<RwLockWriteGuard<'a, T>>,
    seq: &'a MmLockSeq,
}

impl<T> MmapLock<T> {
    /// Wraps `v`.
    pub fn new(v: T) -> Self {
        MmapLock {
            rw: RwLock::new(v),
            seq: MmLockSeq::new(),
        }
    }

    /// The sequence (for VMA read-trylocks).
    #[inline]
    pub fn seq(&self) -> &MmLockSeq {
        &self.seq
    }

    /// Takes the read side.
    pub fn read(&self) -> MmapReadGuard<'_, T> {
        MmapReadGuard { g: self.rw.read() }
    }

    /// Takes the read side if no writer holds or waits for it.
    pub fn try_read(&self) -> Option<MmapReadGuard<'_, T>> {
        self.rw.try_read().map(|g| MmapReadGuard { g })
    }

    /// Takes the write side and starts a write section.
    pub fn write(&self) -> MmapWriteGuard<'_, T> {
        let g = self.rw.write();
        self.seq.write_begin();
        MmapWriteGuard {
            g: Some(g),
            seq: &self.seq,
        }
    }
}

impl<'a, T> MmapWriteGuard<'a, T> {
    /// The sequence of this write section.
    #[inline]
    pub fn seq(&self) -> &'a MmLockSeq {
        self.seq
    }
}

impl<T> Drop for MmapWriteGuard<'_, T> {
    fn drop(&mut self) {
        // Release every VMA locked in this section, then the lock itself.
        self.seq.write_end();
        drop(self.g.take());
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
        self.g.as_ref().expect("guard holds the lock until dropped")
    }
}

impl<T> DerefMut for MmapWriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.g.as_mut().expect("guard holds the lock until dropped")
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
        assert_eq!(l.seq().current(), 2);
    }
}
