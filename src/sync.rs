//! The one place that chooses synchronization primitives.
//!
//! Production builds use `std` atomics and `parking_lot` locks; builds with
//! `RUSTFLAGS="--cfg aspace_loom --cfg crossbeam_loom"` use loom's twins, so
//! the loom models in `loom_tests/` run the real code of the crate. No other
//! module names `std::sync`, `parking_lot` or `loom` directly. What loom
//! must not see is exported here as well, under names that say so:
//! [`counter`] (statistics and id generation), [`frame`] (guest data) and
//! [`once`] (process-wide constants). Unit tests (`cfg(test)`, never built
//! for loom) may still drive the code with `std` threads and channels.
//!
//! crossbeam-epoch is re-exported as [`epoch`]: under loom it is the crate's
//! loom flavour (its `loom` feature plus `--cfg crossbeam_loom`).

pub use crossbeam_epoch as epoch;

#[cfg(not(aspace_loom))]
mod imp {
    pub use std::sync::atomic::{
        fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
    };
    pub use std::sync::Arc;

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

    /// Shared access to a [`RwLock`]'s value without taking the lock.
    pub struct UnlockedRead<'a, T>(&'a T);

    /// Reads `l`'s value without locking it.
    ///
    /// # Safety
    /// While the returned guard lives, nothing may write the value: the
    /// caller's own protocol keeps every writer of it out (the range lock,
    /// for the mmap_lock's state).
    pub unsafe fn read_unlocked<T>(l: &RwLock<T>) -> UnlockedRead<'_, T> {
        // SAFETY: the pointer is valid for `l`'s lifetime; the caller
        // guarantees no writer exists while the shared reference lives.
        UnlockedRead(unsafe { &*l.data_ptr() })
    }

    impl<T> core::ops::Deref for UnlockedRead<'_, T> {
        type Target = T;
        fn deref(&self) -> &T {
            self.0
        }
    }

    /// Exclusive access to a [`RwLock`]'s value without taking the lock.
    pub struct UnlockedWrite<'a, T>(&'a mut T);

    /// Writes `l`'s value without locking it.
    ///
    /// # Safety
    /// While the returned guard lives, nothing else may read or write the
    /// value: the caller's own protocol keeps every other holder out (the
    /// range lock's whole space held exclusive, for the mmap_lock's
    /// state).
    pub unsafe fn write_unlocked<T>(l: &RwLock<T>) -> UnlockedWrite<'_, T> {
        // SAFETY: the pointer is valid for `l`'s lifetime; the caller
        // guarantees no other access while the exclusive reference lives.
        UnlockedWrite(unsafe { &mut *l.data_ptr() })
    }

    impl<T> core::ops::Deref for UnlockedWrite<'_, T> {
        type Target = T;
        fn deref(&self) -> &T {
            self.0
        }
    }

    impl<T> core::ops::DerefMut for UnlockedWrite<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            self.0
        }
    }

    /// A cell whose exclusive accesses the caller's own protocol orders
    /// (loom's twin checks that order in the models): `std`'s cell
    /// behind loom's API.
    #[derive(Debug, Default)]
    pub struct UnsafeCell<T>(core::cell::UnsafeCell<T>);

    impl<T> UnsafeCell<T> {
        /// Wraps `v`.
        pub const fn new(v: T) -> Self {
            Self(core::cell::UnsafeCell::new(v))
        }
        /// A pointer for exclusive access while it lives (loom tracks
        /// that access from here to the pointer's drop).
        #[inline(always)]
        pub fn get_mut(&self) -> MutPtr<T> {
            MutPtr(self.0.get())
        }
    }

    /// [`UnsafeCell::get_mut`]'s pointer.
    #[derive(Debug)]
    pub struct MutPtr<T>(*mut T);

    impl<T> MutPtr<T> {
        /// The value.
        ///
        /// # Safety
        /// As dereferencing a `*mut T`: no other access to the value
        /// while the reference lives.
        #[inline(always)]
        #[allow(clippy::mut_from_ref)]
        pub unsafe fn deref(&self) -> &mut T {
            // SAFETY: the caller's contract; the pointer came from a live
            // cell the caller keeps borrowed.
            unsafe { &mut *self.0 }
        }
    }

    /// A condition variable paired with [`Mutex`]: the userfault wait
    /// queue's sleepers (faults waiting for a handler, handlers waiting
    /// for events).
    #[derive(Debug, Default)]
    pub struct Condvar(parking_lot::Condvar);

    impl Condvar {
        /// A condition variable with no waiters.
        pub fn new() -> Self {
            Self(parking_lot::Condvar::new())
        }
        /// Releases `g`, sleeps until notified, and locks again.
        pub fn wait<'a, T>(&self, mut g: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
            self.0.wait(&mut g);
            g
        }
        /// [`wait`](Self::wait) for at most `d`; true if it timed out.
        pub fn wait_for<'a, T>(
            &self,
            mut g: MutexGuard<'a, T>,
            d: std::time::Duration,
        ) -> (MutexGuard<'a, T>, bool) {
            let r = self.0.wait_for(&mut g, d);
            (g, r.timed_out())
        }
        /// Wakes every sleeper.
        pub fn notify_all(&self) {
            self.0.notify_all();
        }
    }

    /// Spins for a few microseconds or until `done()` holds; returns
    /// whether it did. For a waiter about to sleep on a lock whose holders
    /// keep it for about a microsecond: a sleep and its wake-up cost two
    /// context switches, more than the hold itself.
    pub fn spin_briefly(mut done: impl FnMut() -> bool) -> bool {
        // Measured in time, not iterations: a pause takes 2 to 140 cycles
        // depending on the CPU.
        const BUDGET: std::time::Duration = std::time::Duration::from_micros(4);
        let start = std::time::Instant::now();
        loop {
            for _ in 0..32 {
                if done() {
                    return true;
                }
                core::hint::spin_loop();
            }
            if start.elapsed() >= BUDGET {
                return done();
            }
        }
    }

    /// How long a waiter has waited: started when it starts waiting,
    /// asked after each failed try whether a bound has passed (a lock that lets later
    /// requests go first bounds how long with it).
    #[derive(Debug)]
    pub struct Patience(std::time::Instant);

    impl Patience {
        /// Starts counting now.
        pub fn start() -> Self {
            Self(std::time::Instant::now())
        }
        /// True once `bound` has passed since [`start`](Self::start).
        pub fn run_out(&self, bound: std::time::Duration) -> bool {
            self.0.elapsed() >= bound
        }
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

/// The calling thread's id: unique in the process, never reused,
/// nonzero (a soft TLB's home thread, see `tlb`). Made on first use,
/// off the hot path; [`thread_id_if_made`] reads it.
#[cfg(not(aspace_loom))]
pub fn thread_id() -> u64 {
    THREAD_ID.with(|id| match id.get() {
        0 => {
            let new = counter::next_id();
            id.set(new);
            new
        }
        v => v,
    })
}

#[cfg(not(aspace_loom))]
thread_local!(static THREAD_ID: core::cell::Cell<u64> = const { core::cell::Cell::new(0) });

/// [`thread_id`] if the thread made it yet, else 0: one load of a
/// thread-local word (no lazy initialization, no destructor), for a hot
/// path that compares it with an id it knows.
#[cfg(not(aspace_loom))]
#[inline(always)]
pub fn thread_id_if_made() -> u64 {
    THREAD_ID.with(|id| id.get())
}

/// The calling (loom) thread's id: unique, never reused, nonzero. Loom
/// runs its threads on one OS thread, so this is loom's thread-local.
#[cfg(aspace_loom)]
pub fn thread_id() -> u64 {
    loom::thread_local!(static ID: u64 = counter::next_id());
    ID.with(|id| *id)
}

/// [`thread_id`] (under loom always made).
#[cfg(aspace_loom)]
pub fn thread_id_if_made() -> u64 {
    thread_id()
}

#[cfg(aspace_loom)]
mod imp {
    pub use loom::sync::atomic::{
        fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
    };
    pub use loom::sync::Arc;

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

    /// A reader-writer lock for loom models, with parking_lot's infallible
    /// API, built from a loom mutex, a condition variable and a loom cell
    /// rather than on `loom::sync::RwLock`. loom 0.7's own lock, when a
    /// writer acquires it, blocks every thread with a pending operation on
    /// the lock, a `try_read` included; a real `try_read` never waits for
    /// a holder, and the fault path relies on that (it try-locks the
    /// mmap_lock while holding a VMA read lock that a waiting writer
    /// polls). Here the state (reader count, or [`WRITER`]) sits behind a
    /// mutex that is held only for the instant of a check, never across a
    /// wait: `try_read` takes it, looks and leaves. `read` and `write`
    /// sleep on the condition variable instead of spinning, so a waiter
    /// adds no interleavings while the lock is held (a spinning waiter made
    /// every model that meets an mmap_lock writer many times larger).
    pub struct RwLock<T> {
        /// Reader count, or [`WRITER`].
        state: loom::sync::Mutex<usize>,
        changed: loom::sync::Condvar,
        data: loom::cell::UnsafeCell<T>,
    }

    const WRITER: usize = 1 << (usize::BITS - 1);

    // SAFETY: the lock hands out `&T` to readers on any thread (so T must
    // be Sync) and `&mut T` to one writer at a time (so T must be Send),
    // as std's RwLock requires.
    unsafe impl<T: Send> Send for RwLock<T> {}
    // SAFETY: as above.
    unsafe impl<T: Send + Sync> Sync for RwLock<T> {}

    impl<T> core::fmt::Debug for RwLock<T> {
        fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
            f.write_str("RwLock { .. }")
        }
    }

    /// Read guard of [`RwLock`].
    pub struct RwLockReadGuard<'a, T> {
        lock: &'a RwLock<T>,
        /// loom's tracked pointer: taken (and so released) before the
        /// lock is, or loom would see the next holder's access overlap it.
        data: Option<loom::cell::ConstPtr<T>>,
    }

    /// Write guard of [`RwLock`].
    pub struct RwLockWriteGuard<'a, T> {
        lock: &'a RwLock<T>,
        /// As in [`RwLockReadGuard`].
        data: Option<loom::cell::MutPtr<T>>,
    }

    impl<T> RwLock<T> {
        /// Wraps `v`.
        pub fn new(v: T) -> Self {
            RwLock {
                state: loom::sync::Mutex::new(0),
                changed: loom::sync::Condvar::new(),
                data: loom::cell::UnsafeCell::new(v),
            }
        }
        /// Shared lock.
        pub fn read(&self) -> RwLockReadGuard<'_, T> {
            let mut s = self.state.lock().unwrap();
            while *s & WRITER != 0 {
                s = self.changed.wait(s).unwrap();
            }
            *s += 1;
            drop(s);
            self.read_guard()
        }
        /// Exclusive lock.
        pub fn write(&self) -> RwLockWriteGuard<'_, T> {
            let mut s = self.state.lock().unwrap();
            while *s != 0 {
                s = self.changed.wait(s).unwrap();
            }
            *s = WRITER;
            drop(s);
            self.write_guard()
        }
        /// Shared lock without waiting for a holder.
        pub fn try_read(&self) -> Option<RwLockReadGuard<'_, T>> {
            let mut s = self.state.lock().unwrap();
            if *s & WRITER != 0 {
                return None;
            }
            *s += 1;
            drop(s);
            Some(self.read_guard())
        }
        fn read_guard(&self) -> RwLockReadGuard<'_, T> {
            RwLockReadGuard {
                lock: self,
                data: Some(self.data.get()),
            }
        }
        fn write_guard(&self) -> RwLockWriteGuard<'_, T> {
            RwLockWriteGuard {
                lock: self,
                data: Some(self.data.get_mut()),
            }
        }
    }

    impl<T> core::ops::Deref for RwLockReadGuard<'_, T> {
        type Target = T;
        fn deref(&self) -> &T {
            let p = self.data.as_ref().expect("held until drop");
            // SAFETY: the reader count this guard holds keeps writers out;
            // loom checks that through the cell's tracked pointer.
            unsafe { p.deref() }
        }
    }

    impl<T> Drop for RwLockReadGuard<'_, T> {
        fn drop(&mut self) {
            drop(self.data.take());
            let mut s = self.lock.state.lock().unwrap();
            *s -= 1;
            if *s == 0 {
                self.lock.changed.notify_all();
            }
        }
    }

    impl<T> core::ops::Deref for RwLockWriteGuard<'_, T> {
        type Target = T;
        fn deref(&self) -> &T {
            let p = self.data.as_ref().expect("held until drop");
            // SAFETY: this guard holds the writer bit: no other guard exists.
            unsafe { p.deref() }
        }
    }

    impl<T> core::ops::DerefMut for RwLockWriteGuard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            let p = self.data.as_ref().expect("held until drop");
            // SAFETY: as for `deref`, and `&mut self` makes it unique.
            unsafe { p.deref() }
        }
    }

    impl<T> Drop for RwLockWriteGuard<'_, T> {
        fn drop(&mut self) {
            drop(self.data.take());
            *self.lock.state.lock().unwrap() = 0;
            self.lock.changed.notify_all();
        }
    }

    /// Shared access to a [`RwLock`]'s value without taking the lock,
    /// through loom's tracked pointer: loom reports a write of the value
    /// while it lives as a data race.
    pub struct UnlockedRead<'a, T> {
        data: loom::cell::ConstPtr<T>,
        _lock: core::marker::PhantomData<&'a RwLock<T>>,
    }

    /// Reads `l`'s value without locking it.
    ///
    /// # Safety
    /// As the production build's: nothing may write the value while the
    /// guard lives.
    pub unsafe fn read_unlocked<T>(l: &RwLock<T>) -> UnlockedRead<'_, T> {
        UnlockedRead {
            data: l.data.get(),
            _lock: core::marker::PhantomData,
        }
    }

    impl<T> core::ops::Deref for UnlockedRead<'_, T> {
        type Target = T;
        fn deref(&self) -> &T {
            // SAFETY: the caller of `read_unlocked` keeps writers out;
            // loom checks that through the tracked pointer.
            unsafe { self.data.deref() }
        }
    }

    /// Exclusive access to a [`RwLock`]'s value without taking the lock,
    /// through loom's tracked pointer: loom reports any other access of
    /// the value while it lives as a data race.
    pub struct UnlockedWrite<'a, T> {
        data: loom::cell::MutPtr<T>,
        _lock: core::marker::PhantomData<&'a RwLock<T>>,
    }

    /// Writes `l`'s value without locking it.
    ///
    /// # Safety
    /// As the production build's: nothing else may access the value while
    /// the guard lives.
    pub unsafe fn write_unlocked<T>(l: &RwLock<T>) -> UnlockedWrite<'_, T> {
        UnlockedWrite {
            data: l.data.get_mut(),
            _lock: core::marker::PhantomData,
        }
    }

    impl<T> core::ops::Deref for UnlockedWrite<'_, T> {
        type Target = T;
        fn deref(&self) -> &T {
            // SAFETY: the caller of `write_unlocked` keeps every other
            // access out; loom checks that through the tracked pointer.
            unsafe { self.data.deref() }
        }
    }

    impl<T> core::ops::DerefMut for UnlockedWrite<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            // SAFETY: as for `deref`, and `&mut self` makes it unique.
            unsafe { self.data.deref() }
        }
    }

    /// loom's condition variable with the production one's API.
    #[derive(Debug, Default)]
    pub struct Condvar(loom::sync::Condvar);

    impl Condvar {
        /// A condition variable with no waiters.
        pub fn new() -> Self {
            Self(loom::sync::Condvar::new())
        }
        /// Releases `g`, sleeps until notified, and locks again.
        pub fn wait<'a, T>(&self, g: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
            self.0.wait(g).unwrap()
        }
        /// Wakes every sleeper.
        pub fn notify_all(&self) {
            self.0.notify_all();
        }
    }

    /// A cell whose accesses loom checks (the frame witnesses in `phys`,
    /// a tree's spare node memory), and its tracked pointer.
    pub use loom::cell::{MutPtr, UnsafeCell};

    /// One look at `done()` (a spin is a performance matter: the model
    /// checks that the caller stays correct whatever the look returns).
    pub fn spin_briefly(mut done: impl FnMut() -> bool) -> bool {
        done()
    }

    /// A waiter's patience under loom: out at the first failed try, so a
    /// model explores both what a waiter does before (later requests go
    /// first) and after (they wait behind it); time does not pass in a
    /// model.
    #[derive(Debug)]
    pub struct Patience;

    impl Patience {
        /// Starts counting.
        pub fn start() -> Self {
            Self
        }
        /// Always true (see the type's docs).
        pub fn run_out(&self, _bound: std::time::Duration) -> bool {
            true
        }
    }

    /// Waits until `done()` holds, yielding to loom's scheduler each try.
    pub fn wait_until(mut done: impl FnMut() -> bool) {
        while !done() {
            loom::thread::yield_now();
        }
    }
}

pub use imp::*;

/// Atomics for statistics and id generation, never part of a
/// synchronization protocol: plain `std` atomics even under loom, on
/// purpose. Invisible to loom, models do not spend their branch budget on
/// bookkeeping, and a `static` counter (which loom's atomics cannot be)
/// works in every build. Nothing may be ordered by these.
pub mod counter {
    pub use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, AtomicUsize, Ordering};

    /// A fresh id for an address space, an anon_vma or a memory object:
    /// unique in the process, never reused (an id only names; no protocol
    /// orders anything by it, and ids need not rise in the order they are
    /// made).
    ///
    /// Each thread takes ids from a block of [`ID_BLOCK`] it reserved in
    /// the process-wide count, so that the first write fault of a VMA
    /// (which makes its anon_vma) writes the count's shared line once per
    /// block, not once per VMA.
    pub fn next_id() -> u64 {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        // (next, end) of the thread's block; `next == end` when used up.
        std::thread_local!(static BLOCK: core::cell::Cell<(u64, u64)> =
            const { core::cell::Cell::new((0, 0)) });
        let take = |(next, end): (u64, u64)| {
            if next < end {
                (next, (next + 1, end))
            } else {
                let first = NEXT.fetch_add(ID_BLOCK, Ordering::Relaxed);
                (first, (first + 1, first + ID_BLOCK))
            }
        };
        // (A `const` cell without a destructor is reachable for the
        // thread's whole life.)
        BLOCK.with(|b| {
            let (id, rest) = take(b.get());
            b.set(rest);
            id
        })
    }

    /// Ids a thread reserves at a time ([`next_id`]).
    pub const ID_BLOCK: u64 = 1024;
}

/// Atomics on frame memory (guest data): plain `std` atomics even under
/// loom, which cannot model raw memory; the protocols that guard frames
/// (TLB flushes, refcounts) use the loom-checked atomics above.
pub mod frame {
    pub use std::sync::atomic::{AtomicU64, Ordering};
}

/// One-time initialization of process-wide constants (the CPU count): the
/// value is the same for every thread, so loom has nothing to explore; the
/// `std` cell is used even under loom, on purpose.
pub mod once {
    pub use std::sync::OnceLock;
}

pub mod asymmetric;

#[cfg(all(test, not(aspace_loom)))]
mod tests {
    use super::counter::{next_id, ID_BLOCK};
    use std::collections::HashSet;

    #[test]
    fn ids_are_unique_across_threads_and_blocks() {
        // Each thread uses up several blocks, so blocks are taken while
        // the others take theirs.
        let per = 3 * ID_BLOCK as usize + 7;
        let ids: Vec<Vec<u64>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| s.spawn(move || (0..per).map(|_| next_id()).collect::<Vec<_>>()))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut all = HashSet::new();
        for v in &ids {
            assert!(v.iter().all(|&id| id != 0), "ids are nonzero");
            assert!(v.windows(2).all(|w| w[0] < w[1]), "a thread's ids rise");
            all.extend(v.iter().copied());
        }
        assert_eq!(all.len(), 4 * per, "an id was handed out twice");
    }
}
