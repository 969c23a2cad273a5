//! A translator's atomic operations on guest memory (`lock cmpxchg`,
//! `lock xadd`, `xchg`) at any alignment, faulting for write like any
//! store: an operand inside one 8-byte frame word is a compare-and-swap
//! loop on that word; one spanning two words goes to `split` (see there
//! for its exact guarantee); one splitting a 64-byte line or a page obeys
//! [`SplitLock`].
//!
//! # Locking
//!
//! Atomics on frame words, inside the translator's access section (see
//! the parent module); a spanning operand takes `split`'s stripe locks.
//! The lock order is in [`crate::mm`].

use super::split::{rmw2, words, SplitLock};
use super::word::{mask, word};
use super::{Lookup, Scalar, Translator, PAGE_MASK};
use crate::error::{FaultError, MemoryFault};
use crate::mm::Access;
use crate::sync::frame::Ordering as FrameOrdering;

impl Translator<'_> {
    /// An atomic read-modify-write of the `T` at `addr`: `f(current)`
    /// gives the new value, or `None` to leave it. Returns the previous
    /// value and whether it was replaced.
    fn rmw<T: Scalar>(
        &mut self,
        addr: u64,
        f: impl Fn(T) -> Option<T>,
    ) -> Result<(T, bool), MemoryFault> {
        let off = (addr & !PAGE_MASK) as usize;
        let shift = (off % 8) * 8;
        if off % 8 + T::SIZE > 8 {
            if (addr % 64) as usize + T::SIZE > 64 && self.mm.cfg.split_lock == SplitLock::Fatal {
                return Err(MemoryFault {
                    addr,
                    kind: FaultError::Alignment,
                    done: 0,
                });
            }
            return self.with_span(addr, T::SIZE, Access::Write, |x, y| {
                let (Lookup::Frame(a), Lookup::Frame(b)) = (x, y) else {
                    unreachable!("a write never translates to the zero page")
                };
                // SAFETY: both are writable frames of the span, `off`
                // inside the first page.
                let (lo, hi) = unsafe { words(a, b, off) };
                rmw2(lo, hi, shift as u32, f)
            });
        }
        let m = mask::<T>() << shift;
        self.with_span(addr, T::SIZE, Access::Write, |l, _| {
            let Lookup::Frame(base) = l else {
                unreachable!("a write never translates to the zero page")
            };
            // SAFETY: `base` is a writable frame, `off` inside the page.
            let w = unsafe { word(base, off) };
            let mut cur = w.load(FrameOrdering::SeqCst);
            loop {
                let old = T::from_bits(cur >> shift);
                let Some(new) = f(old) else {
                    return (old, false);
                };
                let next = (cur & !m) | (new.to_bits() << shift);
                match w.compare_exchange_weak(
                    cur,
                    next,
                    FrameOrdering::SeqCst,
                    FrameOrdering::SeqCst,
                ) {
                    Ok(_) => return (old, true),
                    Err(c) => cur = c,
                }
            }
        })
    }

    /// Atomically replaces the `T` at `addr` with `new` if it equals
    /// `current` (`lock cmpxchg`): `Ok(Ok(previous))` if it did,
    /// `Ok(Err(actual))` if not. The page must be writable, even when the
    /// comparison fails. Any alignment: an operand inside one 8-byte word
    /// is atomic against every access; one spanning two words is atomic
    /// against the other atomics that span words, and on x86-64 inside a
    /// 16-byte block against every access (across a 16-byte boundary an
    /// aligned access racing on the operand's own bytes may see it half
    /// done); one splitting a 64-byte line or a page follows
    /// [`Config::split_lock`](crate::Config::split_lock).
    pub fn compare_exchange<T: Scalar>(
        &mut self,
        addr: u64,
        current: T,
        new: T,
    ) -> Result<Result<T, T>, MemoryFault> {
        let (old, done) = self.rmw(addr, |v: T| (v == current).then_some(new))?;
        Ok(if done { Ok(old) } else { Err(old) })
    }

    /// Atomically adds `v` (wrapping) to the `T` at `addr` (`lock xadd`);
    /// returns the previous value. Alignment as for
    /// [`compare_exchange`](Self::compare_exchange).
    pub fn fetch_add<T: Scalar>(&mut self, addr: u64, v: T) -> Result<T, MemoryFault> {
        let add = v.to_bits();
        self.rmw(addr, |cur: T| {
            Some(T::from_bits(cur.to_bits().wrapping_add(add)))
        })
        .map(|(old, _)| old)
    }

    /// Atomically replaces the `T` at `addr` with `v` (`xchg`); returns
    /// the previous value. Alignment as for
    /// [`compare_exchange`](Self::compare_exchange).
    pub fn swap<T: Scalar>(&mut self, addr: u64, v: T) -> Result<T, MemoryFault> {
        self.rmw(addr, |_| Some(v)).map(|(old, _)| old)
    }
}
