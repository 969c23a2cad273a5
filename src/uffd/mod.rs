//! Userfault handlers: [`Uffd`], Linux's `userfaultfd(2)` for an address
//! space, shaped after the `userfaultfd` crate with safe slices.
//!
//! Register a range for missing pages, write-protection or minor faults
//! ([`RegisterMode`]); a fault that needs the handler blocks the faulting
//! thread and queues an [`Event`]; a handler thread (any number of them,
//! on clones of one `Uffd`) reads it and resolves the page with
//! [`copy`](Uffd::copy), [`zeropage`](Uffd::zeropage),
//! [`continue_`](Uffd::continue_) or
//! [`remove_write_protection`](Uffd::remove_write_protection), which wake
//! the faults waiting there. With [`UffdBuilder::wp_async`] writes to
//! write-protected pages are only recorded, never delivered, and
//! [`AddressSpace::pagemap_scan`] reports and re-protects the written
//! pages (dirty tracking).
//!
//! ```
//! use aspace::{AddressSpace, Config, MapFlags, Prot, PAGE_SIZE};
//! use aspace::uffd::{Event, RegisterMode};
//! let mm = AddressSpace::new(Config::default());
//! let a = mm.mmap(0, 4 * PAGE_SIZE, Prot::READ | Prot::WRITE,
//!                 MapFlags::PRIVATE | MapFlags::ANONYMOUS).unwrap();
//! let uffd = mm.userfaultfd();
//! uffd.register_with_mode(a, 4 * PAGE_SIZE, RegisterMode::MISSING).unwrap();
//! std::thread::scope(|s| {
//!     let h = uffd.clone();
//!     s.spawn(move || {
//!         let Event::Pagefault { addr, .. } = h.read_event() else { unreachable!() };
//!         h.copy(&[7u8; PAGE_SIZE as usize], addr, true).unwrap();
//!     });
//!     let mut b = [0u8; 1];
//!     mm.read(a + 5, &mut b).unwrap(); // blocks until the handler copied
//!     assert_eq!(b, [7]);
//! });
//! ```
//!
//! The handle above borrows its space, for scoped threads; one made by
//! [`Uffd::owned`] from an `Arc<AddressSpace>` owns it, is `'static`, and
//! moves into a spawned handler thread.
//!
//! A fault waiting when its range is unregistered, unmapped or its last
//! handle dropped wakes and runs again, as Linux's does: where the range
//! is no longer registered it fills the page as any fault (zero page,
//! zeroed frame or the object's page), so a manager may drop its handle
//! after its last copy without failing a fault of the guest.
//!
//! Differences from Linux, each written where it applies: there are no
//! PTE markers, so write-protection covers present
//! pages only (anonymous memory without `UFFD_FEATURE_WP_UNPOPULATED`),
//! and a page first written after a scan is reported by the next one
//! because it appears without the bit; no fork, remap, remove or unmap
//! events (the features are off: a fork child and an mremap'd copy are
//! not registered); `UFFDIO_MOVE` and `UFFDIO_POISON` are not provided.
//!
//! # Locking
//!
//! - Register, unregister and the release of the last handle are mmap_lock
//!   writers (`mm/edit.rs`): they split and merge VMAs like mprotect and
//!   wake waiters under the write side, after the VMAs changed.
//! - Copy, zeropage, continue, write-protect and `pagemap_scan` hold the
//!   mmap_lock read side, then PTE-table locks; write-protection ends with
//!   one TLB flush before the call returns.
//! - The wait queue's lock (`crate::vma::userfault`) is a leaf, taken under any of the
//!   above or under a fault's VMA read lock; a fault sleeps on it with no
//!   other lock held.
//!
//! The whole order is in [`crate::mm`].

mod fault;
mod fill;
mod register;
mod scan;
mod wp;

pub(crate) use crate::vma::userfault::UffdCtx;
pub use crate::vma::userfault::{Event, FaultKind, ReadWrite};
pub(crate) use fault::{missing_fault, wp_fault, wp_is_async, Waiter};
pub use fill::FillError;
pub use register::{IoctlFlags, RegisterMode};
pub use scan::{PageCategories, PageRegion, ScanArgs, ScanFlags, ScanResult};
pub(crate) use wp::clear_wp_bits;

use crate::addr::{is_page_aligned, Range};
use crate::error::{Error, Result};
use crate::mm::AddressSpace;
use crate::sync::Arc;
use crate::vma::VmFlags;
use core::ops::Deref;

/// Every VMA flag a userfault registration sets (`__VM_UFFD_FLAGS`).
pub(crate) const UFFD_FLAGS: VmFlags = VmFlags::UFFD_MISSING
    .union(VmFlags::UFFD_WP)
    .union(VmFlags::UFFD_MINOR);

/// Features of a new [`Uffd`] (`UFFDIO_API`'s feature bits).
#[derive(Clone, Copy, Debug, Default)]
pub struct UffdBuilder {
    wp_async: bool,
}

impl UffdBuilder {
    /// No features: every registered fault is delivered.
    pub fn new() -> Self {
        Self::default()
    }

    /// `UFFD_FEATURE_WP_ASYNC`: a write to a page write-protected in a
    /// range registered with [`RegisterMode::WRITE_PROTECT`] clears the
    /// protection and goes on, with no event, so that
    /// [`AddressSpace::pagemap_scan`] can report it as written.
    pub fn wp_async(mut self, on: bool) -> Self {
        self.wp_async = on;
        self
    }

    /// The handle for `mm`, borrowing it.
    pub fn create(self, mm: &AddressSpace) -> Uffd<'_> {
        self.create_in(Box::new(mm))
    }

    /// The handle for the space `mm` owns (an `Arc<AddressSpace>`, or any
    /// owner that derefs to one): `'static` and `Send`, so it moves into
    /// a spawned handler thread (see [`Uffd::owned`]). It keeps the space
    /// alive; `mm` must deref to the same space every time.
    pub fn create_owned<M>(self, mm: M) -> Uffd<'static>
    where
        M: Deref<Target = AddressSpace> + Send + Sync + 'static,
    {
        self.create_in(Box::new(mm))
    }

    fn create_in(self, mm: SpaceRef<'_>) -> Uffd<'_> {
        Uffd {
            inner: Arc::new(Handle {
                mm,
                ctx: Arc::new(UffdCtx::new(self.wp_async)),
            }),
        }
    }
}

impl AddressSpace {
    /// A userfault handle with no features (`userfaultfd(2)` then
    /// `UFFDIO_API`); see [`UffdBuilder`] for the async write-protect mode.
    pub fn userfaultfd(&self) -> Uffd<'_> {
        UffdBuilder::new().create(self)
    }
}

/// A userfault handle: `Clone`, `Send` and `Sync`; its clones share one
/// queue, and any number of threads may read events and resolve faults
/// at once. `Uffd<'a>` borrows its space ([`AddressSpace::userfaultfd`]);
/// `Uffd<'static>` owns it ([`Uffd::owned`], from an `Arc<AddressSpace>`)
/// and may move into a spawned thread. Dropping the last clone releases it (Linux's
/// `userfaultfd_release`): its ranges are unregistered, then the waiting
/// faults wake and run again as ordinary faults (a missing anonymous page
/// reads zeros), with no SIGBUS.
#[derive(Clone)]
pub struct Uffd<'a> {
    inner: Arc<Handle<'a>>,
}

impl core::fmt::Debug for Uffd<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Uffd")
            .field("wp_async", &self.inner.ctx.wp_async)
            .finish_non_exhaustive()
    }
}

/// How a handle holds its space: a reference ([`UffdBuilder::create`]) or
/// an owner ([`UffdBuilder::create_owned`]).
type SpaceRef<'a> = Box<dyn Deref<Target = AddressSpace> + Send + Sync + 'a>;

/// What the clones of a [`Uffd`] share.
struct Handle<'a> {
    mm: SpaceRef<'a>,
    ctx: Arc<UffdCtx>,
}

impl Drop for Handle<'_> {
    fn drop(&mut self) {
        register::release(&self.mm, &self.ctx);
    }
}

impl Uffd<'static> {
    /// A handle with no features that owns its space (an
    /// `Arc<AddressSpace>`): `'static` and `Send`, so a spawned handler
    /// thread can own it, as the `userfaultfd` crate's handle is owned.
    /// [`AddressSpace::userfaultfd`] is the borrowing form.
    ///
    /// ```
    /// use aspace::{AddressSpace, Config, MapFlags, Prot, Uffd, PAGE_SIZE};
    /// use aspace::uffd::Event;
    /// use std::sync::Arc;
    /// let mm = Arc::new(AddressSpace::new(Config::default()));
    /// let a = mm.mmap(0, PAGE_SIZE, Prot::READ | Prot::WRITE,
    ///                 MapFlags::PRIVATE | MapFlags::ANONYMOUS).unwrap();
    /// let uffd = Uffd::owned(mm.clone());
    /// uffd.register(a, PAGE_SIZE).unwrap();
    /// let handler = std::thread::spawn(move || {
    ///     let Event::Pagefault { addr, .. } = uffd.read_event() else { unreachable!() };
    ///     uffd.copy(&[7u8; PAGE_SIZE as usize], addr, true).unwrap();
    /// });                                  // the handle goes with the thread
    /// let mut b = [0u8; 1];
    /// mm.read(a, &mut b).unwrap();          // waits for the handler
    /// assert_eq!(b, [7]);
    /// handler.join().unwrap();
    /// ```
    ///
    /// The borrowing handle cannot go to a spawned thread:
    ///
    /// ```compile_fail
    /// use aspace::{AddressSpace, Config};
    /// let mm = AddressSpace::new(Config::default());
    /// let uffd = mm.userfaultfd();
    /// std::thread::spawn(move || drop(uffd));
    /// ```
    pub fn owned<M>(mm: M) -> Self
    where
        M: Deref<Target = AddressSpace> + Send + Sync + 'static,
    {
        UffdBuilder::new().create_owned(mm)
    }
}

impl Uffd<'_> {
    fn mm(&self) -> &AddressSpace {
        &self.inner.mm
    }

    fn ctx(&self) -> &Arc<UffdCtx> {
        &self.inner.ctx
    }

    /// The next event, waiting for one (`read(2)` on a blocking
    /// userfaultfd).
    pub fn read_event(&self) -> Event {
        self.ctx()
            .read(true)
            .expect("a blocking read returns an event")
    }

    /// The next event if one is queued (`read(2)` with `O_NONBLOCK`, which
    /// fails with `EAGAIN` where this returns `None`).
    pub fn try_read_event(&self) -> Option<Event> {
        self.ctx().read(false)
    }

    /// The next event, waiting at most `timeout` for one (`poll(2)` then
    /// `read(2)`).
    #[cfg(not(aspace_loom))]
    pub fn read_event_timeout(&self, timeout: std::time::Duration) -> Option<Event> {
        self.ctx().read_timeout(timeout)
    }

    /// Wakes the faults waiting in `[addr, addr + len)` (`UFFDIO_WAKE`):
    /// they run again. `EINVAL` for a bad range.
    pub fn wake(&self, addr: u64, len: u64) -> Result<()> {
        let r = validate_range(self.mm(), addr, len)?;
        self.ctx().wake(r);
        Ok(())
    }
}

/// Linux's `validate_range` for userfaultfd ioctls: a page-aligned,
/// non-empty range at or above `mmap_min_addr` inside the task size, or
/// `EINVAL`.
fn validate_range(mm: &AddressSpace, addr: u64, len: u64) -> Result<Range> {
    let task = mm.cfg.task_size;
    if !is_page_aligned(addr)
        || !is_page_aligned(len)
        || len == 0
        || addr < mm.cfg.mmap_min_addr
        || addr >= task
        || len > task - addr
    {
        return Err(Error::Inval);
    }
    Ok(Range::new(addr, addr + len))
}
