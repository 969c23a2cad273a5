//! Atomic operations whose operand spans two 8-byte frame words: inside
//! a 16-byte block one `lock cmpxchg16b` (x86-64), elsewhere two word
//! compare-and-swaps under a stripe lock; and the split-lock setting for
//! operands across a cache line or a page.
//!
//! # What is atomic
//!
//! Every operation here holds the stripe lock of each 64-byte host line
//! its operand touches (stripes chosen by the line's host address, so
//! two mappings of one frame share them; taken in stripe order, at most
//! two). So any two of them that overlap are serialized: a misaligned
//! `fetch_add` from several threads gives exact totals, a misaligned
//! `compare_exchange` lock works. Against operations that take no lock
//! (aligned atomics, stores):
//!
//! - an operand inside one 16-byte block is updated by one
//!   `lock cmpxchg16b` on x86-64, atomic against everything;
//! - an operand across a 16-byte boundary (or without `cmpxchg16b`) is
//!   read as two words and written by two compare-and-swaps, low word
//!   first, each merging only the operand's bytes: bytes outside the
//!   operand are never lost, but a racing unlocked access to the
//!   operand's own bytes may see the low part written and the high one
//!   not yet, or change the high part between the read and the write (the
//!   operation then keeps the racing high bytes' replacement by its own).
//!   x86 makes even these atomic; a guest that mixes aligned and split
//!   accesses to one operand is rare, and racy on hardware with split-lock
//!   detection anyway.
//!
//! # Locking
//!
//! The stripe locks are spin locks held across a few word operations on
//! frames already translated, inside the translator's access; nothing is
//! taken under them. They are guest data locks (`sync::frame`), invisible
//! to loom like the frame words.

use super::word::{mask, word};
use super::Scalar;
use crate::addr::PAGE_SIZE;
use crate::sync::frame::{AtomicU64 as FrameWord, Ordering as FrameOrdering};
use crossbeam_utils::CachePadded;

/// What a locked atomic operation whose operand splits a 64-byte cache
/// line (or a page) does: Linux's `split_lock_detect` boot parameter
/// ([`Config::split_lock`](crate::Config::split_lock)). Operands
/// misaligned inside a line always work, as on x86.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum SplitLock {
    /// The operation succeeds (`split_lock_detect=warn`, which only logs):
    /// atomic with respect to the translator's other misaligned atomics,
    /// as described in the `translate` module docs.
    #[default]
    Warn,
    /// The operation fails with
    /// [`FaultError::Alignment`](crate::FaultError::Alignment)
    /// (`SIGBUS`, `BUS_ADRALN`) and changes nothing
    /// (`split_lock_detect=fatal`).
    Fatal,
}

/// Stripe locks: 0 free, 1 held.
const STRIPES: usize = 64;
static LOCKS: [CachePadded<FrameWord>; STRIPES] =
    [const { CachePadded::new(FrameWord::new(0)) }; STRIPES];

fn stripe(p: *const FrameWord) -> usize {
    (p as usize / 64) % STRIPES
}

fn lock(i: usize) {
    let l = &LOCKS[i];
    while l
        .compare_exchange_weak(0, 1, FrameOrdering::Acquire, FrameOrdering::Relaxed)
        .is_err()
    {
        while l.load(FrameOrdering::Relaxed) != 0 {
            core::hint::spin_loop();
        }
    }
}

fn unlock(i: usize) {
    LOCKS[i].store(0, FrameOrdering::Release);
}

/// The read-modify-write of the `T` at byte `shift / 8` of the 16 bytes
/// `lo`, `hi` (two consecutive frame words, `lo` at the lower address, the
/// operand spanning both): `f(current)` gives the new value or `None`.
/// Returns the previous value and whether it was replaced.
pub(super) fn rmw2<T: Scalar>(
    lo: &FrameWord,
    hi: &FrameWord,
    shift: u32,
    f: impl Fn(T) -> Option<T>,
) -> (T, bool) {
    let (a, b) = (stripe(lo), stripe(hi));
    let (first, second) = (a.min(b), a.max(b));
    lock(first);
    if second != first {
        lock(second);
    }
    let block = lo as *const FrameWord as usize % 16 == 0;
    let r = if block && cmpxchg16b::available() {
        rmw_block(lo, shift, &f)
    } else {
        rmw_words(lo, hi, shift, &f)
    };
    if second != first {
        unlock(second);
    }
    unlock(first);
    r
}

/// The operand's value in the 16 bytes `v`, and its mask there.
fn split<T: Scalar>(v: u128, shift: u32) -> (T, u128) {
    let m = (mask::<T>() as u128) << shift;
    (T::from_bits(((v & m) >> shift) as u64), m)
}

/// One `lock cmpxchg16b` loop on the 16-aligned block at `lo`.
fn rmw_block<T: Scalar>(lo: &FrameWord, shift: u32, f: &impl Fn(T) -> Option<T>) -> (T, bool) {
    let p = lo.as_ptr() as *mut u128;
    let mut cur = (lo.load(FrameOrdering::SeqCst) as u128)
        // SAFETY: the word after `lo` is in the same 16-byte block, hence
        // in the same frame.
        | ((unsafe { &*(lo as *const FrameWord).add(1) }.load(FrameOrdering::SeqCst) as u128)
            << 64);
    loop {
        let (old, m) = split::<T>(cur, shift);
        let Some(new) = f(old) else {
            return (old, false);
        };
        let next = (cur & !m) | ((new.to_bits() as u128) << shift);
        // SAFETY: `p` is 16-aligned inside a live frame (the caller's
        // words), and every access to frame memory is atomic.
        match unsafe { cmpxchg16b::cas(p, cur, next) } {
            Ok(()) => return (old, true),
            Err(actual) => cur = actual,
        }
    }
}

/// Two word compare-and-swaps, low word first (see the module docs).
fn rmw_words<T: Scalar>(
    lo: &FrameWord,
    hi: &FrameWord,
    shift: u32,
    f: &impl Fn(T) -> Option<T>,
) -> (T, bool) {
    let sc = FrameOrdering::SeqCst;
    loop {
        let (l, h) = (lo.load(sc), hi.load(sc));
        let cur = l as u128 | (h as u128) << 64;
        let (old, m) = split::<T>(cur, shift);
        let Some(new) = f(old) else {
            return (old, false);
        };
        let next = (cur & !m) | ((new.to_bits() as u128) << shift);
        if lo.compare_exchange(l, next as u64, sc, sc).is_err() {
            continue;
        }
        let (hi_mask, hi_new) = ((m >> 64) as u64, (next >> 64) as u64);
        let _ = hi.fetch_update(sc, sc, |h| Some((h & !hi_mask) | (hi_new & hi_mask)));
        return (old, true);
    }
}

/// The two frame words holding an operand at byte `off` of the frame at
/// `a` that spans a word boundary: the second is in the frame at `b` if
/// the operand crosses the page.
///
/// # Safety
/// `a` (and `b`, when the operand crosses the page) are live frames;
/// `off < PAGE_SIZE`.
pub(super) unsafe fn words<'f>(
    a: *mut u8,
    b: *mut u8,
    off: usize,
) -> (&'f FrameWord, &'f FrameWord) {
    let first = off & !7;
    // SAFETY: the caller's contract.
    unsafe {
        let hi = if first + 8 < PAGE_SIZE as usize {
            word(a, first + 8)
        } else {
            word(b, 0)
        };
        (word(a, first), hi)
    }
}

/// `lock cmpxchg16b` (x86-64 with the feature; nothing elsewhere).
mod cmpxchg16b {
    /// True if the CPU has `cmpxchg16b` (checked once by std).
    #[inline]
    pub(super) fn available() -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            std::arch::is_x86_feature_detected!("cmpxchg16b")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }

    /// Replaces the 16 bytes at `p` with `new` if they equal `old`;
    /// else returns what they hold. SeqCst (a `lock`-prefixed
    /// instruction).
    ///
    /// # Safety
    /// `p` is 16-aligned, valid for reads and writes, accessed only
    /// atomically by others; [`available`] returned true.
    #[cfg(target_arch = "x86_64")]
    pub(super) unsafe fn cas(p: *mut u128, old: u128, new: u128) -> Result<(), u128> {
        let (mut lo, mut hi) = (old as u64, (old >> 64) as u64);
        // SAFETY: the caller's contract; rbx is reserved by LLVM, so the
        // new low word is swapped into it around the instruction and
        // restored after.
        unsafe {
            core::arch::asm!(
                "xchg {nlo}, rbx",
                "lock cmpxchg16b xmmword ptr [{p}]",
                "mov rbx, {nlo}",
                p = in(reg) p,
                nlo = inout(reg) new as u64 => _,
                in("rcx") (new >> 64) as u64,
                inout("rax") lo,
                inout("rdx") hi,
                options(nostack),
            );
        }
        let actual = lo as u128 | (hi as u128) << 64;
        if actual == old {
            Ok(())
        } else {
            Err(actual)
        }
    }

    /// Never called: [`available`] is false.
    #[cfg(not(target_arch = "x86_64"))]
    pub(super) unsafe fn cas(_: *mut u128, _: u128, _: u128) -> Result<(), u128> {
        unreachable!("cmpxchg16b is x86-64 only")
    }
}
