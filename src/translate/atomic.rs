//! A translator's atomic operations on guest memory (`lock cmpxchg`,
//! `lock xadd`, `xchg`): compare-and-swap loops on the containing 8-byte
//! frame word, faulting for write like any store, and SIGBUS for a
//! misaligned operand as Linux gives for split locks.
//!
//! # Locking
//!
//! None: atomics on frame words, inside the translator's access section
//! (see the parent module); the lock order is in [`crate::mm`].

use super::{mask, word, Lookup, Scalar, Translator, PAGE_MASK};
use crate::error::FaultError;
use crate::sync::frame::Ordering as FrameOrdering;

impl Translator<'_> {
    /// An atomic read-modify-write of the naturally aligned `T` at `addr`:
    /// `f(current)` gives the new value, or `None` to leave it. Returns
    /// the previous value and whether it was replaced.
    fn rmw<T: Scalar>(
        &mut self,
        addr: u64,
        f: impl Fn(T) -> Option<T>,
    ) -> Result<(T, bool), FaultError> {
        if addr % T::SIZE as u64 != 0 {
            return Err(FaultError::Bus);
        }
        let off = (addr & !PAGE_MASK) as usize;
        let shift = (off % 8) * 8;
        let m = mask::<T>() << shift;
        self.with_span(addr, T::SIZE, true, |l, _| {
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
    /// `Ok(Err(actual))` if not. `addr` must be naturally aligned, else
    /// `Err(FaultError::Bus)` (Linux's SIGBUS for split locks); the page
    /// must be writable, even when the comparison fails.
    pub fn compare_exchange<T: Scalar>(
        &mut self,
        addr: u64,
        current: T,
        new: T,
    ) -> Result<Result<T, T>, FaultError> {
        let (old, done) = self.rmw(addr, |v: T| (v == current).then_some(new))?;
        Ok(if done { Ok(old) } else { Err(old) })
    }

    /// Atomically adds `v` (wrapping) to the `T` at `addr` (`lock xadd`);
    /// returns the previous value. Alignment as for
    /// [`compare_exchange`](Self::compare_exchange).
    pub fn fetch_add<T: Scalar>(&mut self, addr: u64, v: T) -> Result<T, FaultError> {
        let add = v.to_bits();
        self.rmw(addr, |cur: T| {
            Some(T::from_bits(cur.to_bits().wrapping_add(add)))
        })
        .map(|(old, _)| old)
    }

    /// Atomically replaces the `T` at `addr` with `v` (`xchg`); returns
    /// the previous value. Alignment as for
    /// [`compare_exchange`](Self::compare_exchange).
    pub fn swap<T: Scalar>(&mut self, addr: u64, v: T) -> Result<T, FaultError> {
        self.rmw(addr, |_| Some(v)).map(|(old, _)| old)
    }
}
