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

use crate::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
pub(crate) use crate::vma::seq::MmLockSeq;
use core::ops::{Deref, DerefMut};

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
        let s = l.seq().current();
        assert!(
            s > 0 && s & 1 == 0,
            "one section ended: even and moved ({s})"
        );
    }
}
