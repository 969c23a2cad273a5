//! What exec needs from an address space: emptying it for a new program
//! ([`AddressSpace::exec_reset`]) and placing the heap once the program's
//! end is known ([`AddressSpace::set_start_brk`]). The initial stack is an
//! ordinary growsdown mapping plus
//! [`set_start_stack`](AddressSpace::set_start_stack); the ELF loader that
//! uses all three is [`crate::exec`].
//!
//! # Locking
//!
//! Both take the mmap_lock write side (through `Edit`); see [`crate::mm`].

use super::edit::Edit;
use super::AddressSpace;
use crate::addr::{is_page_aligned, Range};
use crate::error::{Error, Result};
use crate::vma::VmFlags;

impl AddressSpace {
    /// Empties the space for a new program, as exec replaces a process's
    /// mm with a new one: every VMA is unmapped (as by `munmap` of the
    /// whole task, with one TLB flush), the heap goes back to
    /// [`Config::brk_start`](super::Config::brk_start) with nothing in it,
    /// the start stack to none, and the default flags of
    /// `mlockall(MCL_FUTURE)` are cleared. Resource limits
    /// ([`stack_limit`](Self::stack_limit),
    /// [`memlock_limit`](Self::memlock_limit)) stay, as rlimits survive
    /// exec; the event counters ([`stats`](Self::stats)) keep counting.
    ///
    /// The space stays the same object, so `Arc`s, owned translators and
    /// the fork relatives of the caller keep working. What held on to the
    /// old contents:
    /// - a [`Translator`](crate::Translator) loses every cached
    ///   translation in the unmap's shootdown; its next access faults in
    ///   the new layout (in Linux the other threads die in exec; an
    ///   emulator stops its other guest CPUs first);
    /// - a userfault handle's registrations go with their VMAs and its
    ///   pending faults are woken to retry (and fail); the handle itself
    ///   stays attached to this space, where in Linux it would keep the
    ///   old mm. Drop it, or build a fresh space with
    ///   [`with_pool`](Self::with_pool) if the old contents must live on;
    /// - a pinned page (a device slice) keeps its frame until unpinned, as
    ///   a long-term GUP pin outlives the mm it came from;
    /// - fork children and shared objects keep their own references to
    ///   the frames, so their contents are untouched.
    ///
    /// ```
    /// use aspace::{AddressSpace, Config, MapFlags, Prot};
    /// let mm = AddressSpace::new(Config::default());
    /// mm.mmap(0, 8192, Prot::READ, MapFlags::PRIVATE | MapFlags::ANONYMOUS).unwrap();
    /// mm.brk(mm.brk(0).unwrap() + 4096).unwrap();
    /// mm.exec_reset();
    /// assert_eq!(mm.map_count(), 0);
    /// assert_eq!(mm.brk(0).unwrap(), Config::default().brk_start);
    /// ```
    pub fn exec_reset(&self) {
        let mut ed = Edit::begin(self);
        // A range covering the whole task never splits a VMA, so the
        // unmap cannot fail on the map count.
        let all = Range::new(0, self.cfg.task_size);
        let unmapped = ed.unmap(all);
        debug_assert!(unmapped.is_ok());
        self.heap.reset(self.cfg.brk_start);
        let st = ed.state_mut();
        st.start_stack = 0;
        st.def_flags = VmFlags::empty();
    }

    /// Places the heap at `addr`, as exec does once the program's end of
    /// bss is known (Linux sets `mm->start_brk = mm->brk` to it, page
    /// aligned): [`brk`](Self::brk) then grows from `addr`, and fails
    /// below it.
    ///
    /// Errors: `EINVAL` for an address that is not page-aligned or not in
    /// `[mmap_min_addr, task_size)`; `EBUSY` when the current heap is not
    /// empty (its break is past its start: shrink it first, or
    /// [`exec_reset`](Self::exec_reset)), since moving the start under a
    /// heap VMA would orphan it.
    ///
    /// ```
    /// use aspace::{AddressSpace, Config};
    /// let mm = AddressSpace::new(Config::default());
    /// mm.set_start_brk(0x40_0000).unwrap();
    /// assert_eq!(mm.brk(0).unwrap(), 0x40_0000);
    /// assert_eq!(mm.brk(0x40_2000).unwrap(), 0x40_2000);
    /// assert_eq!(mm.brk(0x3f_f000).unwrap(), 0x40_2000); // below the start
    /// assert!(mm.set_start_brk(0x50_0000).is_err()); // the heap is in use
    /// ```
    pub fn set_start_brk(&self, addr: u64) -> Result<()> {
        if !is_page_aligned(addr) || addr < self.cfg.mmap_min_addr || addr >= self.cfg.task_size {
            return Err(Error::Inval);
        }
        // The whole space: no brk runs meanwhile.
        let _ed = Edit::begin(self);
        if self.heap.brk() != self.heap.start() {
            return Err(Error::Busy);
        }
        self.heap.reset(addr);
        Ok(())
    }
}
