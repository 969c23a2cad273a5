//! The one place that chooses synchronization primitives.
//!
//! Production builds use `std` atomics and `parking_lot` locks; builds with
//! `RUSTFLAGS="--cfg aspace_loom --cfg crossbeam_loom"` use loom's twins, so
//! the loom models in `loom_tests/` run the real code of the crate. No other
//! module names `std::sync`, `parking_lot` or `loom` directly.
//!
//! crossbeam-epoch is re-exported as [`epoch`]: under loom it is the crate's
//! loom flavour (its `loom` feature plus `--cfg crossbeam_loom`).

#![allow(dead_code)]

pub use crossbeam_epoch as epoch;

#[cfg(not(aspace_loom))]
mod imp {
    pub use std::sync::atomic::{
        fence, AtomicBool, AtomicI64, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize,
        Ordering,
    };
    pub use std::sync::Arc;
    pub use std::thread;

    /// A mutex whose `lock` never fails (parking_lot semantics).
    pub type Mutex<T> = parking_lot::Mutex<T>;
    /// Guard of [`Mutex`].
    pub type MutexGuard<'a, T> = parking_lot::MutexGuard<'a, T>;
    /// A reader-writer lock whose `read`/`write` never fail.
    pub type RwLock<T> = parking_lot::RwLock<T>;
    /// Read guard of [`RwLock`].
    pub type RwLockReadGuard<'a, T> = parking_lot::RwLockReadGuard<'a, T>;
    /// Write guard of [`RwLock`].
    pub type RwLockWriteGuard<'a, T> = parking_lot::RwLockWriteGuard<'a, T>;

    /// Interior mutability with loom's closure-based API, so that loom can
    /// check every access in model builds.
    #[derive(Debug, Default)]
    pub struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

    impl<T> UnsafeCell<T> {
        /// Wraps `v`.
        pub const fn new(v: T) -> Self {
            Self(std::cell::UnsafeCell::new(v))
        }
        /// Shared access to the contents through a raw pointer.
        #[inline(always)]
        pub fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
            f(self.0.get())
        }
        /// Exclusive access to the contents through a raw pointer.
        #[inline(always)]
        pub fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
            f(self.0.get())
        }
        /// Consumes the cell.
        pub fn into_inner(self) -> T {
            self.0.into_inner()
        }
    }

    /// Busy-wait hint inside a retry loop (a yield under loom).
    #[inline(always)]
    pub fn spin_hint() {
        std::hint::spin_loop();
    }

    /// Waits until `done()` holds: spins briefly, then yields the CPU.
    /// Used where the awaited party runs a short, non-blocking section
    /// (a reader inside a VMA, a fault finishing a PTE install).
    pub fn wait_until(mut done: impl FnMut() -> bool) {
        let backoff = crossbeam_utils::Backoff::new();
        while !done() {
            if backoff.is_completed() {
                std::thread::yield_now();
            } else {
                backoff.snooze();
            }
        }
    }
}

#[cfg(aspace_loom)]
mod imp {
    pub use loom::sync::atomic::{
        fence, AtomicBool, AtomicI64, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize,
        Ordering,
    };
    pub use loom::sync::Arc;
    pub use loom::thread;

    /// A loom mutex with parking_lot's infallible `lock`.
    #[derive(Debug)]
    pub struct Mutex<T>(loom::sync::Mutex<T>);
    /// Guard of [`Mutex`].
    pub type MutexGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

    impl<T> Mutex<T> {
        /// Wraps `v`.
        pub fn new(v: T) -> Self {
            Self(loom::sync::Mutex::new(v))
        }
        /// Locks; never fails.
        pub fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock().unwrap()
        }
        /// Tries to lock without waiting.
        pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
            self.0.try_lock().ok()
        }
        /// Consumes the mutex.
        pub fn into_inner(self) -> T {
            self.0.into_inner().unwrap()
        }
        /// Exclusive access without locking.
        pub fn get_mut(&mut self) -> &mut T {
            self.0.get_mut().unwrap()
        }
    }

    impl<T: Default> Default for Mutex<T> {
        fn default() -> Self {
            Self::new(T::default())
        }
    }

    /// A loom reader-writer lock with parking_lot's infallible API.
    #[derive(Debug)]
    pub struct RwLock<T>(loom::sync::RwLock<T>);
    /// Read guard of [`RwLock`].
    pub type RwLockReadGuard<'a, T> = loom::sync::RwLockReadGuard<'a, T>;
    /// Write guard of [`RwLock`].
    pub type RwLockWriteGuard<'a, T> = loom::sync::RwLockWriteGuard<'a, T>;

    impl<T> RwLock<T> {
        /// Wraps `v`.
        pub fn new(v: T) -> Self {
            Self(loom::sync::RwLock::new(v))
        }
        /// Shared lock.
        pub fn read(&self) -> RwLockReadGuard<'_, T> {
            self.0.read().unwrap()
        }
        /// Exclusive lock.
        pub fn write(&self) -> RwLockWriteGuard<'_, T> {
            self.0.write().unwrap()
        }
        /// Shared lock without waiting.
        pub fn try_read(&self) -> Option<RwLockReadGuard<'_, T>> {
            self.0.try_read().ok()
        }
        /// Exclusive lock without waiting.
        pub fn try_write(&self) -> Option<RwLockWriteGuard<'_, T>> {
            self.0.try_write().ok()
        }
        /// Exclusive access without locking.
        pub fn get_mut(&mut self) -> &mut T {
            self.0.get_mut().unwrap()
        }
    }

    pub use loom::cell::UnsafeCell;

    /// Busy-wait hint inside a retry loop: loom must see a yield here.
    #[inline(always)]
    pub fn spin_hint() {
        loom::thread::yield_now();
    }

    /// Waits until `done()` holds, yielding to loom's scheduler each try.
    pub fn wait_until(mut done: impl FnMut() -> bool) {
        while !done() {
            loom::thread::yield_now();
        }
    }
}

pub use imp::*;

/// Atomics for statistics and other counters that take part in no
/// synchronization protocol: plain `std` atomics even under loom, so that
/// models do not spend their branch budget on bookkeeping.
pub mod counter {
    pub use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
}
