//! anon_vma: the reverse-map anchor of anonymous pages.
//!
//! A VMA gets an anon_vma on its first write fault (a read fault maps the
//! shared zero page and needs none). Whether two VMAs have one, and which,
//! decides whether they may merge, exactly as in Linux. The lock on the
//! family's root is modelled as a real lock with contention counters.

use crate::sync::{AtomicU64, Mutex, Ordering};

/// The reverse-map anchor shared by the VMAs whose anonymous pages it
/// covers.
pub struct AnonVma {
    id: u64,
    /// The root's lock (taken by writers that change which pages a VMA
    /// covers).
    lock: Mutex<()>,
    /// Lock acquisitions.
    pub(crate) acquisitions: AtomicU64,
}

impl AnonVma {
    pub(crate) fn new(id: u64) -> Self {
        AnonVma {
            id,
            lock: Mutex::new(()),
            acquisitions: AtomicU64::new(0),
        }
    }

    /// Identity (for debugging and tests).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Takes the root's lock (counted).
    pub(crate) fn lock(&self) -> crate::sync::MutexGuard<'_, ()> {
        self.acquisitions.fetch_add(1, Ordering::Relaxed);
        self.lock.lock()
    }

    /// Times the lock was taken.
    pub fn lock_acquisitions(&self) -> u64 {
        self.acquisitions.load(Ordering::Relaxed)
    }
}

impl core::fmt::Debug for AnonVma {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "AnonVma({})", self.id)
    }
}
