//! The fault path's side of userfaults: deciding that a fault needs the
//! handler, queuing it, and waiting with no lock held.
//!
//! `mm/fault.rs` calls in here only from a VMA with a `UFFD_*` flag (one
//! flag test on its paths), holding the VMA (its read lock or the
//! mmap_lock read side). The event is queued under that hold, so a writer
//! that unregisters or unmaps the range (which waits for the hold) finds
//! the waiter and wakes it. The fault then returns [`Step::Wait`] up to
//! `fault::handle`, which drops every lock before calling
//! [`Waiter::wait`] and then runs the whole fault again (Linux's
//! `VM_FAULT_RETRY`). The speculative path never comes here: it falls back
//! on a `UFFD_MISSING` VMA.
//!
//! # Locking
//!
//! Queuing takes the wait queue's leaf lock under the VMA hold; waiting
//! holds nothing else. Order: [`crate::mm`].

use crate::error::FaultError;
use crate::mm::fault::Step;
use crate::mm::{Access, AddressSpace};
use crate::pt::{Pte, PteFlags};
use crate::reclaim::Guard;
use crate::stats::Event as Stat;
use crate::sync::Arc;
use crate::vma::userfault::{Event, FaultKind, ReadWrite, UffdCtx};
use crate::vma::{VmFlags, Vma};

/// A fault queued for a handler, to wait on once its locks are dropped.
pub(crate) struct Waiter {
    ctx: Arc<UffdCtx>,
    ticket: u64,
    page: u64,
    kind: FaultKind,
}

impl Waiter {
    /// Sleeps until the page is woken (by a handler's resolution or
    /// wake, or by an unregister, munmap or release of the range); the
    /// fault then runs again, as an ordinary fault where the range is no
    /// longer registered. Never fails (Linux's woken fault returns
    /// `VM_FAULT_RETRY`). The caller holds no lock.
    ///
    /// The entry is looked at again first, after queuing: a handler that
    /// installed the page and woke the range between the fault's look and
    /// its queuing found no waiter to wake, but its install is visible
    /// now (the install precedes the wake's queue lock, which precedes
    /// ours), so the fault withdraws and retries instead of sleeping.
    pub(crate) fn wait(self, mm: &AddressSpace) -> Result<(), FaultError> {
        let g = mm.pt.pin();
        let pte = mm.pt.lookup(self.page, &g);
        drop(g);
        let needed = match self.kind {
            FaultKind::WriteProtect => pte.is_present() && pte.flags().contains(PteFlags::UFFD_WP),
            FaultKind::Missing | FaultKind::Minor => !pte.is_present(),
        };
        if !needed {
            self.ctx.cancel(self.ticket);
        } else {
            self.ctx.wait(self.ticket);
        }
        Ok(())
    }
}

/// Queues a fault at `page` of `vma` (held) for its handler.
///
/// `HandlerGone` only where `vma` is registered to no live context: its
/// flags without a context, or a released context. Neither happens: flags
/// and context are set together under the write lock, and a release
/// unregisters every VMA of its context (under their write locks, which
/// wait for this hold) before it marks the context released. Failing
/// there, rather than retrying, keeps a broken invariant from spinning.
fn deliver(mm: &AddressSpace, vma: &Vma, page: u64, kind: FaultKind, access: Access) -> Step {
    let Some(ctx) = vma.uffd_arc() else {
        return Step::Fail(FaultError::HandlerGone);
    };
    let ev = Event::Pagefault {
        kind,
        rw: if access == Access::Write {
            ReadWrite::Write
        } else {
            ReadWrite::Read
        },
        addr: page,
        thread_id: std::thread::current().id(),
    };
    match ctx.enqueue(page, ev) {
        Some(ticket) => {
            mm.stats.inc(Stat::userfaults);
            Step::Wait(Waiter {
                ctx,
                ticket,
                page,
                kind,
            })
        }
        None => Step::Fail(FaultError::HandlerGone),
    }
}

/// A fault on an empty entry of a VMA registered for missing or minor
/// faults: `Err(Step::Wait)` if the handler must resolve it, `Ok` to go on
/// (a page past an object's end is SIGBUS on the normal path, as Linux
/// checks the size first).
pub(crate) fn missing_fault(
    mm: &AddressSpace,
    vma: &Vma,
    page: u64,
    access: Access,
) -> Result<(), Step> {
    let flags = vma.flags();
    // SAFETY: the caller holds `vma` (read lock or mmap_lock).
    let kind = match unsafe { vma.shmem() } {
        None => flags
            .contains(VmFlags::UFFD_MISSING)
            .then_some(FaultKind::Missing),
        Some(shm) => {
            let idx = vma.pgoff_of(page);
            if idx >= shm.npages() {
                return Ok(());
            }
            if shm.has_frame(idx) {
                flags
                    .contains(VmFlags::UFFD_MINOR)
                    .then_some(FaultKind::Minor)
            } else {
                flags
                    .contains(VmFlags::UFFD_MISSING)
                    .then_some(FaultKind::Missing)
            }
        }
    };
    match kind {
        Some(k) => Err(deliver(mm, vma, page, k, access)),
        None => Ok(()),
    }
}

/// Whether the context `vma` (held) is registered to resolves
/// write-protect faults itself (`wp_async`), with no handler.
pub(crate) fn wp_is_async(vma: &Vma) -> bool {
    vma.uffd_arc().is_some_and(|c| c.wp_async)
}

/// A write to `pte`, write-protected for the handler of `vma` (held): an
/// async context only clears the bit (the caller looks again and handles
/// a plain write fault), else the fault waits for the handler.
pub(crate) fn wp_fault(
    mm: &AddressSpace,
    vma: &Vma,
    page: u64,
    pte: Pte,
    g: &Guard,
) -> Result<(), Step> {
    if !wp_is_async(vma) {
        return Err(deliver(
            mm,
            vma,
            page,
            FaultKind::WriteProtect,
            Access::Write,
        ));
    }
    // Nothing to flush: the bit only ever takes rights away.
    let cleared = mm.pt.update(page, g, |cur| {
        (cur == pte).then(|| Pte::new(pte.pfn(), pte.flags() - PteFlags::UFFD_WP))
    });
    if cleared.is_some() {
        mm.stats.inc(Stat::uffd_wp_async);
    }
    Ok(())
}
