//! The address space's lock sequence, which VMA lock stamps are compared
//! with (`mm->mm_lock_seq`).
//!
//! It lives beside the VMA lock because its whole meaning is the VMA
//! lock's: a VMA is write-locked exactly while its stamp equals an odd
//! sequence. The mmap_lock ([`crate::mm`]'s `mmap_lock` module) owns one
//! and moves it at each write section's start and end.
//!
//! # Locking
//!
//! Only the holder of the mmap_lock's write side moves the sequence; any
//! thread reads it. The lock order is in [`crate::mm`].

use crate::sync::{AtomicU64, Ordering};

/// An address space's lock sequence (`mm->mm_lock_seq`).
///
/// 64 bits, so it never wraps: a VMA stamped in an old write section can
/// never match the current sequence again (at one write section per
/// nanosecond, 2^63 sections take 292 years). With 32 bits, 2^31 sections
/// would bring an old stamp back, and `VmaLock::write_lock` would skip
/// draining readers of a VMA it believed already locked.
#[derive(Debug)]
pub struct MmLockSeq {
    /// Protected by: the mmap_lock's write side for stores (odd while a
    /// writer holds it); read by anyone (`Acquire` pairs with `write_end`).
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
