//! Userfault events and the wait queue: the context a registered VMA
//! points to ([`UffdCtx`]), the faults it has queued for handlers, and the
//! faulting threads asleep until a handler wakes their page. It lives
//! below `vma/`, like the other things a VMA points to, and needs only
//! `sync`; `crate::uffd` (the handler API) builds on it.
//!
//! A fault that needs the handler queues its event and a waiter slot in
//! one critical section of the queue lock (while it still holds its VMA),
//! then, with every other lock dropped, re-checks its page table entry and
//! sleeps until its slot is woken. A wake (`UFFDIO_WAKE`, a copy's, an
//! unregister's or munmap's) marks every slot in its range woken and takes
//! their still unread events out of the queue, as Linux's wake removes
//! them from `fault_pending_wqh`. A woken fault always runs again: where
//! the handler resolved the page it finds it, where the range was
//! unregistered it fills the page as any fault does, where it was
//! unmapped it gets SIGSEGV.
//!
//! Releasing the last handle (Linux's `userfaultfd_release`) first
//! unregisters every VMA of the context, then marks it released and wakes
//! every waiter: they retry as ordinary faults, so a manager may drop its
//! handle after its last copy without a fault of the guest failing.
//!
//! # Locking
//!
//! The queue lock is a leaf: nothing is taken while it is held (the
//! fault's re-check walks the page table lock-free, outside it). It may be
//! taken under any lock of the order in [`crate::mm`] (a fault queues
//! under its VMA read lock or the mmap_lock read side; unregister and
//! munmap wake under the mmap_lock write side).

use crate::addr::Range;
use crate::sync::{Condvar, Mutex};
use std::collections::VecDeque;

/// What kind of fault an event reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultKind {
    /// No page (`UFFDIO_REGISTER_MODE_MISSING`): resolve with
    /// [`copy`](crate::Uffd::copy) or [`zeropage`](crate::Uffd::zeropage).
    Missing,
    /// A write to a write-protected page (`UFFDIO_REGISTER_MODE_WP`):
    /// resolve with
    /// [`remove_write_protection`](crate::Uffd::remove_write_protection).
    WriteProtect,
    /// The object has the page but this mapping does not map it yet
    /// (`UFFDIO_REGISTER_MODE_MINOR`): resolve with
    /// [`continue_`](crate::Uffd::continue_).
    Minor,
}

/// The access that faulted (`UFFD_PAGEFAULT_FLAG_WRITE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReadWrite {
    /// A load.
    Read,
    /// A store.
    Write,
}

/// An event read from a [`Uffd`](crate::Uffd) (`struct uffd_msg`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// A page fault waiting for the handler (`UFFD_EVENT_PAGEFAULT`).
    Pagefault {
        /// Which registration mode the fault is for.
        kind: FaultKind,
        /// The faulting access.
        rw: ReadWrite,
        /// The faulting page: the address rounded down to its page, as
        /// Linux reports it without `UFFD_FEATURE_EXACT_ADDRESS`.
        addr: u64,
        /// The faulting thread (`UFFD_FEATURE_THREAD_ID`).
        thread_id: std::thread::ThreadId,
    },
}

struct Slot {
    ticket: u64,
    page: u64,
    /// A wake has covered the page: the fault retries.
    woken: bool,
}

struct Queue {
    /// Events not yet read, with the ticket of the fault that queued each.
    pending: VecDeque<(u64, Event)>,
    /// Faults between queuing and waking up.
    waiters: Vec<Slot>,
    next_ticket: u64,
    /// The last handle is gone (after its VMAs were unregistered): no
    /// fault may wait any more.
    released: bool,
}

/// A userfault context (`struct userfaultfd_ctx`): what registered VMAs
/// point to, shared by every clone of its [`Uffd`](crate::Uffd).
pub(crate) struct UffdCtx {
    /// Writes to write-protected pages only clear the protection
    /// (`UFFD_FEATURE_WP_ASYNC`).
    /// Protected by: immutable after creation.
    pub(crate) wp_async: bool,
    /// Protected by: itself (a leaf lock).
    queue: Mutex<Queue>,
    /// Handlers waiting for an event.
    events: Condvar,
    /// Faults waiting for a wake.
    wakes: Condvar,
}

impl UffdCtx {
    pub(crate) fn new(wp_async: bool) -> Self {
        UffdCtx {
            wp_async,
            queue: Mutex::new(Queue {
                pending: VecDeque::new(),
                waiters: Vec::new(),
                next_ticket: 0,
                released: false,
            }),
            events: Condvar::new(),
            wakes: Condvar::new(),
        }
    }

    /// Queues `ev` for the handlers and a waiter slot for its page;
    /// returns the slot's ticket, or `None` once released (no handler
    /// will ever read the event).
    pub(crate) fn enqueue(&self, page: u64, ev: Event) -> Option<u64> {
        let mut q = self.queue.lock();
        if q.released {
            return None;
        }
        let ticket = q.next_ticket;
        q.next_ticket += 1;
        q.pending.push_back((ticket, ev));
        q.waiters.push(Slot {
            ticket,
            page,
            woken: false,
        });
        drop(q);
        self.events.notify_all();
        Some(ticket)
    }

    /// Withdraws a fault that found its page resolved before sleeping
    /// (its event too, if no handler has read it).
    pub(crate) fn cancel(&self, ticket: u64) {
        let mut q = self.queue.lock();
        q.pending.retain(|(t, _)| *t != ticket);
        q.waiters.retain(|s| s.ticket != ticket);
    }

    /// Sleeps until the fault's slot is woken; the fault then runs
    /// again.
    pub(crate) fn wait(&self, ticket: u64) {
        let mut q = self.queue.lock();
        loop {
            let i = q
                .waiters
                .iter()
                .position(|s| s.ticket == ticket)
                .expect("a queued fault keeps its slot until it wakes");
            if q.waiters[i].woken {
                q.waiters.swap_remove(i);
                return;
            }
            q = self.wakes.wait(q);
        }
    }

    /// Wakes the faults waiting in `r` (all of them for `None`) and
    /// removes their unread events: they run again (`UFFDIO_WAKE`).
    fn wake_in(&self, r: Option<Range>) {
        let mut q = self.queue.lock();
        let mut woken = Vec::new();
        for s in q.waiters.iter_mut() {
            if !s.woken && r.is_none_or(|r| r.contains(s.page)) {
                s.woken = true;
                woken.push(s.ticket);
            }
        }
        if !woken.is_empty() {
            q.pending.retain(|(t, _)| !woken.contains(t));
            drop(q);
            self.wakes.notify_all();
        }
    }

    /// Wakes the faults waiting in `r`: they run again (`UFFDIO_WAKE`,
    /// and the wake of an unregister or munmap of `r`).
    pub(crate) fn wake(&self, r: Range) {
        self.wake_in(Some(r));
    }

    /// The last handle is gone and no VMA is registered to the context
    /// any more: every waiting fault runs again (and fills its page as an
    /// ordinary fault), and no fault may queue from now on.
    pub(crate) fn release(&self) {
        self.queue.lock().released = true;
        self.wake_in(None);
    }

    /// The next event: waits for one if `block`.
    pub(crate) fn read(&self, block: bool) -> Option<Event> {
        let mut q = self.queue.lock();
        loop {
            if let Some((_, ev)) = q.pending.pop_front() {
                return Some(ev);
            }
            if !block {
                return None;
            }
            q = self.events.wait(q);
        }
    }

    /// The next event, waiting at most `d` for one.
    #[cfg(not(aspace_loom))]
    pub(crate) fn read_timeout(&self, d: std::time::Duration) -> Option<Event> {
        let deadline = std::time::Instant::now() + d;
        let mut q = self.queue.lock();
        loop {
            if let Some((_, ev)) = q.pending.pop_front() {
                return Some(ev);
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return None;
            }
            q = self.events.wait_for(q, left).0;
        }
    }
}
