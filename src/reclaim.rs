//! Deferred reclamation for lock-free readers, behind one small type.
//!
//! Lock-free readers (tree walks, page-table walks, VMA lookups) may still
//! hold a pointer to memory a writer has just unlinked. Writers therefore
//! *retire* that memory instead of freeing it; it is freed once no reader
//! that could have seen it is still running.
//!
//! Three policies share one interface, chosen at run time per structure:
//! - [`Reclaimer::epoch`]: crossbeam-epoch, the production policy.
//! - [`Reclaimer::deferred`]: keep everything retired until the owner is
//!   dropped. Trivially safe, and tiny for loom: models that are not about
//!   reclamation use it so that epoch's internals do not explode their state
//!   space.
//! - [`Reclaimer::immediate`]: free at once, for structures that have no
//!   lock-free readers at all (every reader holds the writer's lock), such
//!   as the vmap allocator's zone trees.
//!
//! # Locking
//!
//! None of its own beyond the epoch: callers retire only memory they have
//! unlinked under their structure's writer lock. Order: [`crate::mm`].

use crate::sync::{epoch, Mutex};

/// A reader's pin. While it is alive, nothing retired after it was taken is
/// freed.
pub enum Guard {
    /// An epoch pin.
    Epoch(epoch::Guard),
    /// No pin is needed: the deferred policy frees nothing before its owner
    /// is dropped, and the immediate one has no lock-free readers.
    Deferred,
}

impl core::fmt::Debug for Guard {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Guard::Epoch(_) => "Guard::Epoch",
            Guard::Deferred => "Guard::Deferred",
        })
    }
}

/// A raw pointer to retired memory, made `Send` so a deferred closure can
/// carry it. Only [`Reclaimer::retire_with`] builds one.
struct SendPtr<T>(*mut T);
// SAFETY: the pointer is owned by the retire request (the writer unlinked it
// and handed ownership to the reclaimer), and `T: Send` is required by every
// constructor, so moving it to the thread that frees it is sound.
unsafe impl<T: Send> Send for SendPtr<T> {}

type Deferred = Box<dyn FnOnce() + Send>;

/// The reclamation policy of one structure.
pub struct Reclaimer {
    kind: Kind,
}

enum Kind {
    Epoch,
    Deferred(Mutex<Vec<Deferred>>),
    Immediate,
}

impl core::fmt::Debug for Reclaimer {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self.kind {
            Kind::Epoch => "Reclaimer::Epoch",
            Kind::Deferred(_) => "Reclaimer::Deferred",
            Kind::Immediate => "Reclaimer::Immediate",
        })
    }
}

impl Default for Reclaimer {
    fn default() -> Self {
        Self::epoch()
    }
}

impl Reclaimer {
    /// Epoch-based reclamation (crossbeam-epoch's global collector).
    pub fn epoch() -> Self {
        Reclaimer { kind: Kind::Epoch }
    }

    /// Keep retired memory until this reclaimer is dropped.
    pub fn deferred() -> Self {
        Reclaimer {
            kind: Kind::Deferred(Mutex::new(Vec::new())),
        }
    }

    /// Free retired memory at once.
    ///
    /// # Safety
    /// Only for a structure whose every reader is serialized with its
    /// writers (holds the same lock): a lock-free reader could still be
    /// using what a writer retires, and would read freed memory.
    pub unsafe fn immediate() -> Self {
        Reclaimer {
            kind: Kind::Immediate,
        }
    }

    /// True for the epoch policy.
    pub fn is_epoch(&self) -> bool {
        matches!(self.kind, Kind::Epoch)
    }

    /// Pins the calling thread: memory retired after this call stays valid
    /// while the guard lives.
    #[inline]
    pub fn pin(&self) -> Guard {
        match self.kind {
            Kind::Epoch => Guard::Epoch(epoch::pin()),
            Kind::Deferred(_) | Kind::Immediate => Guard::Deferred,
        }
    }

    /// Runs `free` once no reader pinned before this call can still be
    /// running (epoch), or when the reclaimer is dropped (deferred).
    pub fn defer(&self, guard: &Guard, free: impl FnOnce() + Send + 'static) {
        match (&self.kind, guard) {
            (Kind::Epoch, Guard::Epoch(g)) => g.defer(free),
            (Kind::Epoch, Guard::Deferred) => epoch::pin().defer(free),
            (Kind::Deferred(list), _) => list.lock().push(Box::new(free)),
            // No reader can hold what was retired (see `immediate`).
            (Kind::Immediate, _) => free(),
        }
    }

    /// Retires a heap object that readers may still reach.
    pub fn retire_box<T: Send + 'static>(&self, guard: &Guard, b: Box<T>) {
        self.defer(guard, move || drop(b));
    }

    /// Retires the object behind `ptr`, freeing it with `free` later.
    ///
    /// # Safety
    /// `ptr` must be unreachable for readers that pin after this call, and
    /// the caller must hand over ownership: nobody else frees it.
    pub unsafe fn retire_with<T: Send + 'static>(
        &self,
        guard: &Guard,
        ptr: *mut T,
        free: unsafe fn(*mut T),
    ) {
        let p = SendPtr(ptr);
        self.defer(guard, move || {
            let p = p;
            // SAFETY: the caller handed over ownership of `ptr` and it is
            // unreachable by readers that pinned after retirement; the
            // reclaimer runs this only after every earlier pin is gone.
            unsafe { free(p.0) }
        });
    }

    /// Asks the epoch collector to run what it can now (no-op for the
    /// deferred policy).
    pub fn flush(&self, guard: &Guard) {
        if let Guard::Epoch(g) = guard {
            g.flush();
        }
    }
}

impl Drop for Reclaimer {
    fn drop(&mut self) {
        if let Kind::Deferred(list) = &mut self.kind {
            for f in core::mem::take(list.get_mut()) {
                f();
            }
        }
    }
}

#[cfg(all(test, not(aspace_loom)))]
mod tests {
    use super::*;
    use crate::sync::{Arc, AtomicUsize, Ordering};

    #[test]
    fn deferred_frees_on_drop() {
        let n = Arc::new(AtomicUsize::new(0));
        let r = Reclaimer::deferred();
        let g = r.pin();
        let n2 = n.clone();
        r.defer(&g, move || {
            n2.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(n.load(Ordering::SeqCst), 0);
        drop(r);
        assert_eq!(n.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn immediate_frees_at_once() {
        let n = Arc::new(AtomicUsize::new(0));
        // SAFETY: nothing reads what is retired here.
        let r = unsafe { Reclaimer::immediate() };
        let g = r.pin();
        let n2 = n.clone();
        r.defer(&g, move || {
            n2.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(n.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn epoch_eventually_frees() {
        let n = Arc::new(AtomicUsize::new(0));
        let r = Reclaimer::epoch();
        {
            let g = r.pin();
            let n2 = n.clone();
            r.defer(&g, move || {
                n2.fetch_add(1, Ordering::SeqCst);
            });
            r.flush(&g);
        }
        for _ in 0..1000 {
            if n.load(Ordering::SeqCst) == 1 {
                break;
            }
            let g = r.pin();
            r.flush(&g);
        }
        assert_eq!(n.load(Ordering::SeqCst), 1);
    }
}
