//! Shared objects made on first use: [`LazyArc`], so that creating an
//! address space allocates nothing it does not need yet (its VMA pool, its
//! tree's node cache), and [`LazyWith`], made from arguments kept until
//! then and reached through `Deref` (its page table and TLB, which other
//! address spaces may hold through an `Arc` to zap a shared object's
//! pages: see [`crate::vma::Mappings`]).
//!
//! # Locking
//!
//! No lock: the pointer is installed once by a compare-and-swap
//! (`Release` on success, loads `Acquire`), through the loom facade
//! (`crate::sync`), and never changed again until drop.

use crate::sync::{Arc, AtomicPtr, Ordering};

/// An `Arc<T>` made (with `T::default()`) the first time it is needed, or
/// given at creation to share another owner's.
pub struct LazyArc<T> {
    /// From `Arc::into_raw`, or null before first use.
    ///
    /// Protected by: installed once, null to an `Arc`, by a
    /// compare-and-swap (`Release` on success: `T`'s initialization
    /// happens before any thread that loads the pointer with `Acquire`
    /// uses it); the loser of a race frees its own. Never changed again
    /// until drop, which releases this handle's reference.
    ptr: AtomicPtr<T>,
}

// SAFETY: a LazyArc is an `Option<Arc<T>>` that fills itself: sendable and
// shareable exactly when `Arc<T>` is.
unsafe impl<T: Send + Sync> Send for LazyArc<T> {}
// SAFETY: as for Send.
unsafe impl<T: Send + Sync> Sync for LazyArc<T> {}

impl<T: Default> LazyArc<T> {
    /// Nothing yet: [`get`](Self::get) makes it.
    pub fn new() -> Self {
        LazyArc {
            ptr: AtomicPtr::new(core::ptr::null_mut()),
        }
    }

    /// Shares `a` (allocates nothing).
    pub fn from_arc(a: Arc<T>) -> Self {
        LazyArc {
            ptr: AtomicPtr::new(Arc::into_raw(a) as *mut T),
        }
    }

    /// The value if it exists.
    #[inline]
    pub fn peek(&self) -> Option<&T> {
        // Acquire: pairs with the install's Release.
        let p = self.ptr.load(Ordering::Acquire);
        // SAFETY: a non-null pointer came from `Arc::into_raw`, and this
        // handle holds that reference until drop (`&mut self`).
        (!p.is_null()).then(|| unsafe { &*p })
    }

    /// The value, made now on first use.
    #[inline]
    pub fn get(&self) -> &T {
        match self.peek() {
            Some(v) => v,
            None => self.install(),
        }
    }

    /// Another reference, made now on first use.
    pub fn arc(&self) -> Arc<T> {
        let p: *const T = self.get();
        // SAFETY: `p` is from `Arc::into_raw` and this handle's reference
        // keeps it alive; the returned Arc owns the reference added here.
        unsafe {
            Arc::increment_strong_count(p);
            Arc::from_raw(p)
        }
    }

    /// Another reference if the value exists (to share it, not make it).
    pub fn shared(&self) -> Option<Arc<T>> {
        self.peek().is_some().then(|| self.arc())
    }

    #[cold]
    fn install(&self) -> &T {
        publish(&self.ptr, T::default())
    }
}

/// Installs `value` in the empty `ptr` as an `Arc`, or drops it if
/// another thread installed one first; returns the installed value, which
/// `ptr`'s owner holds (one reference) until it drops.
fn publish<T>(ptr: &AtomicPtr<T>, value: T) -> &T {
    let new = Arc::into_raw(Arc::new(value)) as *mut T;
    match ptr.compare_exchange(
        core::ptr::null_mut(),
        new,
        Ordering::AcqRel,
        Ordering::Acquire,
    ) {
        // SAFETY: published just now; held until the owner drops.
        Ok(_) => unsafe { &*new },
        Err(winner) => {
            // SAFETY: `new` was never published: its reference is ours.
            drop(unsafe { Arc::from_raw(new) });
            // SAFETY: the winner's, held until the owner drops.
            unsafe { &*winner }
        }
    }
}

impl<T: Default> Default for LazyArc<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Drop for LazyArc<T> {
    fn drop(&mut self) {
        let p = self.ptr.load(Ordering::Acquire);
        if !p.is_null() {
            // SAFETY: from `Arc::into_raw`: this handle's reference, given
            // back once.
            drop(unsafe { Arc::from_raw(p) });
        }
    }
}

/// An `Arc<T>` made by `init(&args)` on first dereference, so that a
/// value every address space has (its page table, its TLB) costs no
/// allocation until used, yet lives at a stable address that another
/// owner can share ([`arc`](Self::arc)) while the address space itself
/// moves.
///
/// Under loom the value is made at once (a plain `Arc`), so that models do
/// not spend their branch budget on a pointer load per use.
pub struct LazyWith<T, A> {
    /// From `Arc::into_raw`, or null before first use.
    ///
    /// Protected by: installed once, as [`LazyArc`]'s pointer.
    #[cfg(not(aspace_loom))]
    ptr: AtomicPtr<T>,
    /// The value (loom builds make it at once).
    /// Protected by: immutable.
    #[cfg(aspace_loom)]
    value: Arc<T>,
    /// What `init` makes the value from.
    /// Protected by: immutable.
    #[cfg_attr(aspace_loom, allow(dead_code))]
    args: A,
    /// Protected by: immutable.
    #[cfg_attr(aspace_loom, allow(dead_code))]
    init: fn(&A) -> T,
}

// SAFETY: a LazyWith is an `Option<Arc<T>>` that fills itself from `A`:
// sendable and shareable when both `Arc<T>` and `A` are.
unsafe impl<T: Send + Sync, A: Send> Send for LazyWith<T, A> {}
// SAFETY: as for Send (`A` is only read, by whoever makes the value).
unsafe impl<T: Send + Sync, A: Sync> Sync for LazyWith<T, A> {}

impl<T, A> LazyWith<T, A> {
    /// Nothing yet (under loom: made now): the first dereference makes
    /// `init(&args)`.
    pub fn new(args: A, init: fn(&A) -> T) -> Self {
        LazyWith {
            #[cfg(not(aspace_loom))]
            ptr: AtomicPtr::new(core::ptr::null_mut()),
            #[cfg(aspace_loom)]
            value: Arc::new(init(&args)),
            args,
            init,
        }
    }

    /// The value if it exists.
    #[inline]
    pub fn peek(&self) -> Option<&T> {
        #[cfg(not(aspace_loom))]
        {
            // Acquire: pairs with the install's Release.
            let p = self.ptr.load(Ordering::Acquire);
            // SAFETY: a non-null pointer came from `Arc::into_raw`, and
            // this handle holds that reference until drop.
            (!p.is_null()).then(|| unsafe { &*p })
        }
        #[cfg(aspace_loom)]
        Some(&self.value)
    }

    /// [`peek`](Self::peek), and if there is no value yet, a
    /// read-modify-write of the empty pointer: whoever makes the value
    /// later synchronizes with this call (its publishing compare-and-swap
    /// reads what this one wrote), so everything before this call happens
    /// before the value exists.
    pub fn peek_ordered(&self) -> Option<&T> {
        #[cfg(not(aspace_loom))]
        {
            if let Some(v) = self.peek() {
                return Some(v);
            }
            let null = core::ptr::null_mut();
            // AcqRel: Release for the later maker, Acquire for a value
            // made meanwhile.
            let p = match self
                .ptr
                .compare_exchange(null, null, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(p) | Err(p) => p,
            };
            // SAFETY: as in `peek`.
            (!p.is_null()).then(|| unsafe { &*p })
        }
        #[cfg(aspace_loom)]
        Some(&self.value)
    }

    /// Another reference to the value, made now on first use.
    pub fn arc(&self) -> Arc<T> {
        let p: *const T = &**self;
        // SAFETY: `p` is from `Arc::into_raw` (or the loom build's Arc)
        // and this handle's reference keeps it alive; the returned Arc
        // owns the reference added here.
        unsafe {
            Arc::increment_strong_count(p);
            Arc::from_raw(p)
        }
    }

    #[cfg(not(aspace_loom))]
    #[cold]
    fn install(&self) -> &T {
        publish(&self.ptr, (self.init)(&self.args))
    }
}

impl<T, A> core::ops::Deref for LazyWith<T, A> {
    type Target = T;

    /// The value, made now on first use.
    #[inline]
    fn deref(&self) -> &T {
        #[cfg(not(aspace_loom))]
        match self.peek() {
            Some(v) => v,
            None => self.install(),
        }
        #[cfg(aspace_loom)]
        &self.value
    }
}

impl<T, A> Drop for LazyWith<T, A> {
    fn drop(&mut self) {
        #[cfg(not(aspace_loom))]
        {
            let p = self.ptr.load(Ordering::Acquire);
            if !p.is_null() {
                // SAFETY: from `Arc::into_raw`: this handle's reference,
                // given back once.
                drop(unsafe { Arc::from_raw(p) });
            }
        }
    }
}

#[cfg(all(test, not(aspace_loom)))]
mod tests {
    use super::*;
    use crate::sync::counter::AtomicUsize;

    static MADE: AtomicUsize = AtomicUsize::new(0);
    static DROPPED: AtomicUsize = AtomicUsize::new(0);

    struct Tracked;
    impl Default for Tracked {
        fn default() -> Self {
            MADE.fetch_add(1, Ordering::Relaxed);
            Tracked
        }
    }
    impl Drop for Tracked {
        fn drop(&mut self) {
            DROPPED.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn racing_first_uses_make_one_value_and_leak_nothing() {
        for _ in 0..50 {
            let l = LazyArc::<Tracked>::new();
            assert!(l.peek().is_none() && l.shared().is_none());
            let start = std::sync::Barrier::new(4);
            let seen: Vec<usize> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..4)
                    .map(|_| {
                        s.spawn(|| {
                            start.wait();
                            l.get() as *const Tracked as usize
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            assert!(seen.iter().all(|&a| a == seen[0]), "one value for all");
            let alive = MADE.load(Ordering::Relaxed) - DROPPED.load(Ordering::Relaxed);
            assert_eq!(alive, 1, "the losers' values are dropped");
            // A sharer keeps it past the lazy handle, as a fork child does.
            let other = LazyArc::from_arc(l.shared().unwrap());
            drop(l);
            assert_eq!(
                MADE.load(Ordering::Relaxed) - DROPPED.load(Ordering::Relaxed),
                1
            );
            assert_eq!(other.get() as *const Tracked as usize, seen[0]);
            drop(other);
            assert_eq!(
                MADE.load(Ordering::Relaxed),
                DROPPED.load(Ordering::Relaxed)
            );
        }
    }
}
