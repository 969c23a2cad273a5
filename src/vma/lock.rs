//! The per-VMA refcount lock (Linux 6.15's `vm_refcnt` design).
//!
//! One atomic counter per VMA, with the VMA's lock sequence beside it:
//!
//! | count               | meaning                                             |
//! |---------------------|-----------------------------------------------------|
//! | 0                   | detached (not in the tree, or free in the cache)    |
//! | 1                   | attached, unlocked                                  |
//! | 1 + n               | attached, n readers                                 |
//! | OFFSET + 1 + n      | a writer excludes readers, waiting for n to leave   |
//! | OFFSET + n          | a detacher waits for n transient readers            |
//!
//! Readers never wait: a read-trylock succeeds only if the count is
//! non-zero and stays at or below [`VMA_REF_LIMIT`] (so it fails whenever
//! the writer offset is present, and can never overflow into it), and if
//! the VMA's stamp is below the address space's current sequence.
//! Otherwise the caller falls back to the mmap_lock.
//!
//! The only writer is the holder of the mmap_lock write side. It
//! write-locks a VMA by adding the offset, waiting for the readers to
//! drain, stamping its section's value into the VMA, and removing the
//! offset. The VMA then stays write-locked — every reader sees a stamp at
//! or above the sequence and backs out — until the writer's section ends:
//! the mm's (odd) sequence, which releasing the mmap_lock advances past
//! every stamp at once; or, with range-locked writers, `LOCKED | token`,
//! which the writer's own end stamps back to `token`, VMA by VMA
//! ([`VmaLock::unlock_own`], `vma::seq`'s "Own write sections"; the
//! range lock's bias's owner runs shared sections, as the classic
//! writer).
//!
//! # Locking
//!
//! Orderings:
//! - the reader's increment is `Acquire`; the writer's removal of the
//!   offset is `Release`. A reader whose increment succeeds after a writer
//!   finished therefore sees the writer's stamp (and falls back) or, if the
//!   mm sequence moved on, the writer's changes to the VMA.
//! - the reader re-reads the mm sequence with `Acquire`, pairing with the
//!   `Release` increment in [`MmLockSeq::write_end`]: if the lock was just
//!   dropped, the reader also sees everything the writer did to the VMA.
//! - attach is a `Release` store of 1, so a reader whose increment succeeds
//!   sees the VMA fully initialized.
//! - the mm's `write_begin` is a read-modify-write, so it continues the
//!   release sequence of the previous `write_end`: a reader that reads an
//!   odd sequence (a writer is in a later section but has not locked this
//!   VMA) still sees everything earlier sections did to it.
//! - sequences are 64 bits and never wrap, so an old stamp never matches
//!   the current sequence again (with 32 bits, 2^31 write sections would
//!   let `write_lock` skip draining readers of a VMA it took for locked),
//!   and no two address spaces' write sections share a value
//!   ([`MmLockSeq`]), so a stamp names one section of one space: an
//!   object recycled into another space sharing the pool never carries a
//!   stamp its old life had.
//! - the stamp store is `Release`, so a reader that reads a stamp also
//!   sees what preceded it (a recycled object's detach from its old
//!   space).
//! - own sections: the unlock is a `Release` compare-exchange of the
//!   section's own locked stamp back to its token, and the reader's
//!   re-check loads the stamp with `Acquire`: a reader that sees the
//!   token sees every change the section made to the VMA. Only a stamp
//!   still the section's is unlocked: an object it freed and another
//!   writer took from the pool meanwhile keeps that writer's stamp.

use super::seq::MmLockSeq;
use crate::sync::{fence, wait_until, AtomicU32, AtomicU64, Ordering};

/// The writer ("exclude readers") bit of the count.
pub const VMA_LOCK_OFFSET: u32 = 0x4000_0000;
/// The largest count a reader may produce.
pub const VMA_REF_LIMIT: u32 = VMA_LOCK_OFFSET - 1;

/// Why a read-trylock failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadLockError {
    /// The VMA is detached: the tree changed; walk it again.
    Detached,
    /// A writer holds or is taking the VMA: fall back to the mmap_lock.
    WriteLocked,
    /// Too many readers: fall back to the mmap_lock.
    Overflow,
}

/// The refcount lock of one VMA, on a cache line of its own.
#[repr(align(64))]
#[derive(Debug)]
pub struct VmaLock {
    refcnt: AtomicU32,
    /// The mm sequence of the write section that last locked this VMA
    /// (64 bits, like the mm's: it never wraps back to a current value).
    lock_seq: AtomicU64,
}

impl Default for VmaLock {
    fn default() -> Self {
        Self::new()
    }
}

impl VmaLock {
    /// A detached lock: count 0, no sequence stamped (0: below every
    /// sequence, so unlocked; a writer stamps an object before attaching
    /// it, so no reader reaches one that was never stamped).
    pub fn new() -> Self {
        VmaLock {
            refcnt: AtomicU32::new(0),
            lock_seq: AtomicU64::new(0),
        }
    }

    /// Lock-free read-trylock (Linux's `vma_start_read`).
    #[inline]
    pub fn try_read(&self, mm: &MmLockSeq) -> Result<(), ReadLockError> {
        // Cheap early bail-out; not relied upon.
        if self.lock_seq.load(Ordering::Relaxed) >= mm.current_relaxed() {
            return Err(ReadLockError::WriteLocked);
        }
        self.inc_limited()?;
        // Re-check with Acquire now that we hold a count: pairs with the
        // Release in write_end (and in the offset removal), and with an
        // own section's unlock (the stamp's own Acquire). A stamp below
        // the sequence is of a section that has ended (the sequence only
        // grows, and an own section's token is below `LOCKED`).
        if self.lock_seq.load(Ordering::Acquire) >= mm.current() {
            self.read_unlock();
            return Err(ReadLockError::WriteLocked);
        }
        Ok(())
    }

    /// Read-lock while holding the mmap_lock read side: no writer can
    /// exist, so only the limited increment can fail.
    #[cfg(test)]
    pub fn read_locked(&self) -> Result<(), ReadLockError> {
        self.inc_limited()
    }

    fn inc_limited(&self) -> Result<(), ReadLockError> {
        let mut cur = self.refcnt.load(Ordering::Relaxed);
        loop {
            if cur == 0 {
                return Err(ReadLockError::Detached);
            }
            if cur >= VMA_REF_LIMIT {
                return Err(if cur >= VMA_LOCK_OFFSET {
                    ReadLockError::WriteLocked
                } else {
                    ReadLockError::Overflow
                });
            }
            match self.refcnt.compare_exchange_weak(
                cur,
                cur + 1,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(()),
                Err(c) => cur = c,
            }
        }
    }

    /// Drops a read lock (Linux's `vma_end_read`). A waiting writer polls
    /// the count, so no wake-up is needed.
    #[inline]
    pub fn read_unlock(&self) {
        self.refcnt.fetch_sub(1, Ordering::Release);
    }

    /// Write-locks the VMA (Linux's `vma_start_write`). The caller holds
    /// the mmap_lock write side; `seq` is its section's locked stamp (the
    /// mm's odd sequence, or `LOCKED | token` for an own section: the
    /// write guard's `stamp()`). Waits for readers; idempotent within one
    /// write section; works on a detached VMA too (it only stamps it).
    /// Returns false if the VMA was already locked in this section
    /// (nothing was done).
    pub fn write_lock(&self, seq: u64) -> bool {
        if self.lock_seq.load(Ordering::Relaxed) == seq {
            return false;
        }
        let excluded = self.add_offset_if_attached();
        if excluded {
            wait_until(|| self.refcnt.load(Ordering::Acquire) == VMA_LOCK_OFFSET + 1);
        }
        // Release: a speculative fault whose snapshot reads this stamp
        // (`Acquire`) sees what happened before it, above all the
        // previous owner's detach when the object was recycled for
        // another space: it then reads the VMA detached or owned by that
        // space, never a stale life under a new stamp.
        self.lock_seq.store(seq, Ordering::Release);
        // Seqlock writer fence: a speculative fault that sees any change
        // made to the VMA after this point also sees the stamp when it
        // re-reads it after its own Acquire fence (`spec_fault`).
        fence(Ordering::Release);
        if excluded {
            // Release: readers that get in after this see the stamp.
            self.refcnt.fetch_sub(VMA_LOCK_OFFSET, Ordering::Release);
        }
        true
    }

    /// Adds the writer offset unless the count is 0 (detached: only attach,
    /// which needs the mmap_lock we hold, could raise it).
    fn add_offset_if_attached(&self) -> bool {
        let mut cur = self.refcnt.load(Ordering::Relaxed);
        loop {
            if cur == 0 {
                return false;
            }
            match self.refcnt.compare_exchange_weak(
                cur,
                cur + VMA_LOCK_OFFSET,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(c) => cur = c,
            }
        }
    }

    /// Ends an own write section's lock of this VMA (module docs): if its
    /// stamp is still `LOCKED | token`, stores `token` (`Release`: a
    /// reader that reads it sees the section's changes); a stamp another
    /// section took since (the object was freed and taken again) stays.
    pub fn unlock_own(&self, token: u64) {
        let _ = self.lock_seq.compare_exchange(
            token | super::seq::LOCKED,
            token,
            Ordering::Release,
            Ordering::Relaxed,
        );
    }

    /// True if the VMA is write-locked for readers of `mm`.
    #[cfg(test)]
    pub fn is_write_locked(&self, mm: &MmLockSeq) -> bool {
        self.lock_seq.load(Ordering::Relaxed) >= mm.current_relaxed()
    }

    /// Marks a detached VMA attached (count 0 → 1, Release: its
    /// initialization is visible to any reader that then locks it).
    pub fn mark_attached(&self) {
        debug_assert_eq!(
            self.refcnt.load(Ordering::Relaxed),
            0,
            "attach of an attached VMA"
        );
        self.refcnt.store(1, Ordering::Release);
    }

    /// Marks an attached VMA detached, waiting out readers that are in
    /// their short increment-and-check window; leaves the count at 0.
    pub fn mark_detached(&self) {
        if self.refcnt.fetch_sub(1, Ordering::AcqRel) == 1 {
            return;
        }
        // Readers hold counts: exclude new ones and wait for these.
        self.refcnt.fetch_add(VMA_LOCK_OFFSET, Ordering::Acquire);
        wait_until(|| self.refcnt.load(Ordering::Acquire) == VMA_LOCK_OFFSET);
        self.refcnt.fetch_sub(VMA_LOCK_OFFSET, Ordering::Release);
    }

    /// The stamp: the mm sequence of the write section that last locked
    /// this VMA (0 if never). `Acquire`, for the speculative
    /// fault's snapshot and validation (a read; it writes nothing).
    #[inline]
    pub fn stamp(&self) -> u64 {
        self.lock_seq.load(Ordering::Acquire)
    }

    /// True unless the count is 0.
    pub fn is_attached(&self) -> bool {
        self.refcnt.load(Ordering::Acquire) != 0
    }

    /// The raw count (tests and loom models).
    #[cfg(any(test, aspace_loom))]
    pub fn refcount(&self) -> u32 {
        self.refcnt.load(Ordering::Relaxed)
    }
}

#[cfg(all(test, not(aspace_loom)))]
mod tests {
    use super::super::seq::MmLockSeq;
    use super::*;
    use crate::mm::mmap_lock::MmapLock;

    #[test]
    fn states() {
        let mm = MmapLock::new(());
        let l = VmaLock::new();
        assert_eq!(l.try_read(mm.seq()), Err(ReadLockError::Detached));
        {
            let w = mm.write();
            l.write_lock(w.stamp());
            l.mark_attached();
            assert!(l.is_write_locked(w.seq()));
            assert_eq!(l.try_read(w.seq()), Err(ReadLockError::WriteLocked));
            l.write_lock(w.stamp()); // idempotent
            assert_eq!(l.refcount(), 1);
        }
        assert!(!l.is_write_locked(mm.seq()));
        l.try_read(mm.seq()).unwrap();
        l.try_read(mm.seq()).unwrap();
        assert_eq!(l.refcount(), 3);
        l.read_unlock();
        l.read_unlock();
        {
            let w = mm.write();
            l.write_lock(w.stamp());
            l.mark_detached();
        }
        assert_eq!(l.refcount(), 0);
        assert_eq!(l.try_read(mm.seq()), Err(ReadLockError::Detached));
    }

    /// An old stamp never matches a later sequence, however many write
    /// sections pass: 2^32 sections after a VMA was stamped, a writer must
    /// still drain its readers (with 32-bit sequences the stamp matched
    /// again and `write_lock` returned at once).
    #[test]
    fn stamp_never_matches_after_many_sections() {
        let l = VmaLock::new();
        l.mark_attached();
        let old = MmLockSeq::starting_at(6);
        old.write_begin();
        l.write_lock(old.current_relaxed());
        old.write_end();
        let later = MmLockSeq::starting_at(6 + (1 << 32));
        later.write_begin();
        assert!(!l.is_write_locked(&later), "an old stamp matched again");
        // A reader that got in before the writer must now be waited for.
        let done = std::sync::atomic::AtomicBool::new(false);
        l.try_read(&later).expect("not locked in this section yet");
        std::thread::scope(|s| {
            s.spawn(|| {
                l.write_lock(later.current_relaxed());
                done.store(true, Ordering::SeqCst);
            });
            std::thread::sleep(std::time::Duration::from_millis(20));
            assert!(
                !done.load(Ordering::SeqCst),
                "write_lock skipped a reader of a VMA stamped 2^32 sections ago"
            );
            l.read_unlock();
        });
        assert!(l.is_write_locked(&later));
    }

    #[test]
    fn reader_limit_never_reaches_offset() {
        let mm = MmapLock::new(());
        let l = VmaLock::new();
        l.mark_attached();
        l.refcnt.store(VMA_REF_LIMIT - 1, Ordering::Relaxed);
        l.try_read(mm.seq()).unwrap();
        assert_eq!(l.refcount(), VMA_REF_LIMIT);
        assert_eq!(l.try_read(mm.seq()), Err(ReadLockError::Overflow));
        assert!(l.refcount() < VMA_LOCK_OFFSET);
        assert_eq!(l.read_locked(), Err(ReadLockError::Overflow));
    }

    #[test]
    fn detach_waits_for_reader() {
        use std::sync::atomic::AtomicBool;
        use std::sync::Arc;
        let mm = Arc::new(MmapLock::new(()));
        let l = Arc::new(VmaLock::new());
        l.mark_attached();
        l.try_read(mm.seq()).unwrap();
        let done = Arc::new(AtomicBool::new(false));
        let h = {
            let (mm, l, done) = (mm.clone(), l.clone(), done.clone());
            std::thread::spawn(move || {
                let w = mm.write();
                l.write_lock(w.stamp());
                done.store(true, Ordering::SeqCst);
                l.mark_detached();
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(
            !done.load(Ordering::SeqCst),
            "writer must wait for the reader"
        );
        l.read_unlock();
        h.join().unwrap();
        assert_eq!(l.refcount(), 0);
    }

    #[test]
    fn writer_excludes_readers() {
        use std::sync::atomic::{AtomicBool, AtomicU32 as StdU32};
        use std::sync::Arc;
        let mm = Arc::new(MmapLock::new(()));
        let l = Arc::new(VmaLock::new());
        l.mark_attached();
        let inside = Arc::new(StdU32::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let reads = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let readers: Vec<_> = (0..3)
            .map(|_| {
                let (mm, l, inside, stop, reads) = (
                    mm.clone(),
                    l.clone(),
                    inside.clone(),
                    stop.clone(),
                    reads.clone(),
                );
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        if l.try_read(mm.seq()).is_ok() {
                            inside.fetch_add(1, Ordering::SeqCst);
                            reads.fetch_add(1, Ordering::Relaxed);
                            inside.fetch_sub(1, Ordering::SeqCst);
                            l.read_unlock();
                        }
                    }
                })
            })
            .collect();
        let t0 = std::time::Instant::now();
        let mut rounds = 0;
        while rounds < 2000 || (reads.load(Ordering::Relaxed) < 1000 && t0.elapsed().as_secs() < 5)
        {
            let w = mm.write();
            l.write_lock(w.stamp());
            assert_eq!(
                inside.load(Ordering::SeqCst),
                0,
                "a reader is inside a write-locked VMA"
            );
            drop(w);
            rounds += 1;
            std::thread::yield_now();
        }
        stop.store(true, Ordering::Relaxed);
        for h in readers {
            h.join().unwrap();
        }
        assert!(reads.load(Ordering::Relaxed) > 0);
        assert_eq!(l.refcount(), 1);
    }
}
