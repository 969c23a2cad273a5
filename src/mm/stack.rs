//! Stack growth: a growsdown VMA extends down to a faulting address below
//! it, within the stack limit (`RLIMIT_STACK`) and the guard gap to the
//! mapping below (Linux's `expand_downwards` and `acct_stack_growth`).
//!
//! # Locking
//!
//! Growth takes the mmap_lock write side (as Linux's `expand_stack` does
//! since 6.5) and moves the VMA's start under its write lock; the fault
//! path calls it holding no lock. Order: [`crate::mm`].

use super::edit::Edit;
use super::AddressSpace;
use crate::addr::{page_align_down, pages};
use crate::sync::Ordering;
use crate::vma::VmFlags;

impl AddressSpace {
    /// The stack limit in bytes (`RLIMIT_STACK`'s soft limit): a growsdown
    /// VMA may grow to at most this size. Starts as
    /// [`Config::stack_limit`](super::Config::stack_limit).
    pub fn stack_limit(&self) -> u64 {
        self.stack_limit.load(Ordering::Relaxed)
    }

    /// Sets the stack limit, like `setrlimit(RLIMIT_STACK)`; `u64::MAX` is
    /// unlimited (`RLIM_INFINITY`). Applies to growth from now on: a stack
    /// already larger than the new limit keeps its pages but cannot grow.
    pub fn set_stack_limit(&self, bytes: u64) {
        self.stack_limit.store(bytes, Ordering::Relaxed);
    }

    /// Sets the initial stack pointer (`mm->start_stack`), as exec does
    /// after it builds the main thread's stack: the VMA containing `addr`
    /// (both ends inclusive, as Linux's `vma_is_initial_stack`) shows as
    /// `[stack]` in [`maps`](Self::maps) and [`VmaInfo::stack`](crate::VmaInfo::stack),
    /// whatever becomes of it (growth keeps the label, and after a split
    /// only the pieces that touch `addr` have it). 0, the default, means
    /// no initial stack, so no VMA is labelled. Fork children inherit it.
    ///
    /// ```
    /// use aspace::{AddressSpace, Config, MapFlags, Prot};
    /// let mm = AddressSpace::new(Config::default());
    /// let f = MapFlags::PRIVATE | MapFlags::ANONYMOUS | MapFlags::GROWSDOWN;
    /// let s = mm.mmap(0, 1 << 20, Prot::READ | Prot::WRITE, f).unwrap();
    /// mm.set_start_stack(s + (1 << 20) - 64);
    /// assert!(mm.maps().contains("[stack]"));
    /// ```
    pub fn set_start_stack(&self, addr: u64) {
        self.mmap_lock.write().start_stack = addr;
    }

    /// The initial stack pointer set by
    /// [`set_start_stack`](Self::set_start_stack) (0: none).
    pub fn start_stack(&self) -> u64 {
        self.mmap_lock.read().start_stack
    }
}

/// Grows the growsdown VMA above `addr` down to cover it. Fails (false)
/// when the grown VMA would exceed the stack limit, come closer than the
/// stack guard gap to an accessible mapping below that is not itself a
/// stack, overlap the mapping below, or go below `mmap_min_addr`. Takes
/// the mmap_lock for write.
pub(crate) fn expand_stack(mm: &AddressSpace, addr: u64) -> bool {
    let mut ed = Edit::begin(mm);
    let Some(v) = ed.find_after(addr) else {
        return false;
    };
    if v.start() <= addr {
        return true; // someone else grew it
    }
    if !v.flags().contains(VmFlags::GROWSDOWN) {
        return false;
    }
    let new_start = page_align_down(addr);
    if new_start < mm.cfg.mmap_min_addr {
        return false;
    }
    // acct_stack_growth: the whole VMA's size after growing, against the
    // limit read now (setrlimit may change it at any time).
    if v.end() - new_start > mm.stack_limit() {
        return false;
    }
    if let Some(prev) = ed.prev(v.start()) {
        if prev.end() > new_start {
            return false;
        }
        if !prev.flags().contains(VmFlags::GROWSDOWN)
            && prev.flags().accessible()
            && new_start - prev.end() < mm.cfg.stack_guard_gap
        {
            return false;
        }
    }
    let Some(pgoff) = v.pgoff().checked_sub(pages(v.start() - new_start)) else {
        return false;
    };
    ed.lock(v);
    // Growing a stack gives it an anon_vma, as Linux's expand_downwards.
    let _ = crate::mm::anon_vma::anon_vma_prepare(mm, &v, false);
    ed.set_range(v, new_start, v.end(), pgoff);
    true
}
