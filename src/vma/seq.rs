//! The address space's lock sequence, which VMA lock stamps are compared
//! with (`mm->mm_lock_seq`).
//!
//! It lives beside the VMA lock because its whole meaning is the VMA
//! lock's: a VMA is write-locked exactly while its stamp equals an odd
//! sequence. The mmap_lock ([`crate::mm`]'s `mmap_lock` module) owns one
//! and moves it at each write section's start and end.
//!
//! # Values never repeat among address spaces
//!
//! A VMA object outlives its address space's use of it: the type-stable
//! pool hands a freed object to another space sharing the pool (a fork
//! family), and a speculative fault that snapshotted the object's stamp in
//! its old life compares it again later. If two spaces' sequences could
//! take the same value, the new owner's stamp could equal the snapshot
//! (ABA) and the fault would install into the old owner's table where no
//! VMA is any more. So the odd values of write sections are unique in the
//! process: each space takes them in blocks of [`BLOCK`] from one global
//! counter (written once per `BLOCK / 2` write sections), and its sequence
//! jumps to the next block when one runs out. A space's sequence still
//! only grows, which is all the VMA lock's comparisons need.
//!
//! # Own write sections (range-locked writers)
//!
//! With `WriterLocking::Range`, writers on disjoint ranges run at once, so
//! no one sequence can say when "the" writer is done. The space's
//! sequence then stays at [`LOCKED`] (even, and above every value a
//! section takes), and each writer, whole-space ones included, runs its
//! own section: it takes a [`token`] (a value unique in the process,
//! below `LOCKED`), stamps the VMAs it locks `LOCKED | token`, and when
//! it ends stamps each of them back to `token` (`Release`,
//! `VmaLock::unlock_own`). The readers' rule is the same in both modes: a
//! VMA is write-locked while its stamp is at or above the space's
//! sequence. So a VMA is readable again as soon as its own writer is
//! done, whatever other writers run; a stamp never repeats on one object
//! (each section's values are its own), so a stamp read equal to a
//! snapshot still means no writer has touched the VMA since.
//!
//! # The bias's owner runs shared sections
//!
//! While the range lock's bias is on (`mm::range_bias`), its owner is
//! the only holder of anything in the space, one call at a time: it is
//! the classic mode's writer, so it runs shared sections (the sequence
//! moves, and a section's end unlocks every VMA it locked at once, with
//! no list of them kept and no stamp put back). The space's sequence
//! then starts low as a classic one, and the first own section puts it
//! at [`LOCKED`] ([`MmLockSeq::own_sections_from_now`]). No shared
//! section runs after that: own sections start only once the bias is off
//! for good, and its last owner's section has ended by then (the bias's
//! revocation waits for it). The sequence only grows, so every stamp of
//! the shared sections reads unlocked from then on; the raise is a
//! `Release` store, so a reader whose `Acquire` load reads `LOCKED`
//! synchronizes with those sections' ends through the raiser, which saw
//! them when the bias passed.
//!
//! # Locking
//!
//! Only the holder of the mmap_lock's write side moves the sequence (with
//! range-locked writers only the bias's owner, and the raise to
//! [`LOCKED`]); any thread reads it. The lock order
//! is in [`crate::mm`].

use crate::sync::counter;
use crate::sync::{AtomicU64, Ordering};

/// The stamp bit of a VMA locked by an own write section, and the
/// sequence of a space with range-locked writers (module docs): every
/// such stamp is at or above it.
pub(crate) const LOCKED: u64 = 1 << 63;

/// A token for an own write section (module docs): unique in the
/// process, below [`LOCKED`], and never a value a shared sequence takes
/// (both come in blocks of one counter). A thread takes its tokens from a
/// block of its own, so the counter is written once per [`BLOCK`]
/// sections.
pub(crate) fn token() -> u64 {
    // Loom threads share the OS thread: each section takes a block.
    #[cfg(aspace_loom)]
    {
        next_block()
    }
    #[cfg(not(aspace_loom))]
    {
        thread_local! {
            static NEXT: core::cell::Cell<(u64, u64)> = const { core::cell::Cell::new((0, 0)) };
        }
        NEXT.with(|c| {
            let (mut next, mut end) = c.get();
            if next == end {
                next = next_block();
                end = next + BLOCK;
            }
            c.set((next + 1, end));
            next
        })
    }
}

/// Sequence values a space takes from the global counter at a time.
pub(crate) const BLOCK: u64 = 1 << 12;

/// The first value of a fresh block of [`BLOCK`] sequence values, unique
/// in the process (a multiple of `BLOCK`, so even).
fn next_block() -> u64 {
    static NEXT: counter::AtomicU64 = counter::AtomicU64::new(BLOCK);
    // Uniqueness is all that matters: a read-modify-write on one atomic
    // hands out distinct values whatever the ordering. 2^64 values last
    // 584 years at one write section per nanosecond.
    NEXT.fetch_add(BLOCK, counter::Ordering::Relaxed)
}

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
    /// The end of the block of values this space owns (0: none yet).
    /// Protected by: the mmap_lock's write side (only the writer reads or
    /// stores it; an atomic only to be `Sync`, invisible to loom).
    block_end: counter::AtomicU64,
}

impl Default for MmLockSeq {
    fn default() -> Self {
        Self::new()
    }
}

impl MmLockSeq {
    /// Not write-locked, and above the stamp of a VMA never locked (0):
    /// sequence 2, even and below every value a section takes.
    pub fn new() -> Self {
        MmLockSeq {
            seq: AtomicU64::new(2),
            block_end: counter::AtomicU64::new(0),
        }
    }

    /// The sequence of a space whose writers run own sections (module
    /// docs): [`LOCKED`], for good.
    pub fn own_sections() -> Self {
        MmLockSeq {
            seq: AtomicU64::new(LOCKED),
            block_end: counter::AtomicU64::new(0),
        }
    }

    /// Puts the sequence at [`LOCKED`] for good, if it is not there yet:
    /// called at the start of every own section (module docs, "Own
    /// write sections"). Shared sections (the bias's owner's) may have
    /// run before, never after: the range lock's bias is off for good by
    /// the time anyone runs an own section, and its last owner's section
    /// has ended (the bias's revocation waited for it), so the store
    /// moves an even sequence up, and every stamp of those sections
    /// reads unlocked from then on. `Release`: a reader whose `Acquire`
    /// load reads `LOCKED` sees what those sections did (this writer saw
    /// it, through the bias's hand-off).
    #[inline]
    pub fn own_sections_from_now(&self) {
        if self.seq.load(Ordering::Relaxed) != LOCKED {
            debug_assert!(self.seq.load(Ordering::Relaxed) & 1 == 0);
            self.seq.store(LOCKED, Ordering::Release);
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
    ///
    /// The new value is the next one of this space's block, or the first
    /// of a fresh block (see the module docs: values never repeat among
    /// spaces).
    pub fn write_begin(&self) {
        let prev = self.seq.load(Ordering::Relaxed);
        debug_assert!(prev & 1 == 0);
        let mut next = prev + 1;
        if next >= self.block_end.load(counter::Ordering::Relaxed) {
            // Blocks are handed out in increasing order and this space's
            // values all lie in its earlier blocks, so `next` > `prev`.
            let b = next_block();
            self.block_end.store(b + BLOCK, counter::Ordering::Relaxed);
            next = b + 1;
        }
        let prev = self.seq.fetch_add(next - prev, Ordering::Relaxed);
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
            block_end: counter::AtomicU64::new(seq.saturating_add(BLOCK)),
        }
    }

    /// True inside a shared write section.
    #[cfg(any(test, aspace_loom))]
    pub fn is_write_locked(&self) -> bool {
        self.seq.load(Ordering::Relaxed) & 1 == 1
    }
}

#[cfg(all(test, not(aspace_loom)))]
mod tests {
    use super::*;

    /// Tokens are unique, below `LOCKED`, and never a value of a
    /// shared sequence (one counter hands out both).
    #[test]
    fn tokens_are_unique_and_apart_from_sequences() {
        let s = MmLockSeq::new();
        let mut seen = std::collections::HashSet::new();
        for _ in 0..3 * BLOCK {
            let t = token();
            assert!(t < LOCKED && seen.insert(t), "token {t}");
            s.write_begin();
            assert!(seen.insert(s.current()), "a token equalled a section");
            s.write_end();
        }
        let other = std::thread::spawn(|| (0..BLOCK).map(|_| token()).collect::<Vec<_>>());
        for t in other.join().unwrap() {
            assert!(seen.insert(t), "two threads took token {t}");
        }
        assert!(!MmLockSeq::own_sections().is_write_locked());
    }

    /// Two spaces' write sections never take the same value, however
    /// their sections interleave and across block boundaries (a fork
    /// family's stamps were small per-space counts that coincided).
    #[test]
    fn sections_of_two_spaces_never_share_a_value() {
        let (a, b) = (MmLockSeq::new(), MmLockSeq::new());
        let mut seen = std::collections::HashSet::new();
        for i in 0..3 * BLOCK {
            for s in [&a, &b].into_iter().take(if i % 3 == 0 { 2 } else { 1 }) {
                let before = s.current();
                s.write_begin();
                let v = s.current();
                assert!(v & 1 == 1 && v > before, "odd and growing");
                assert!(seen.insert(v), "value {v} taken twice");
                s.write_end();
            }
        }
    }
}
