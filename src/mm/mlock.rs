//! mlock, mlock2, munlock, mlockall, munlockall, and the memlock limit.
//!
//! Locking sets `VM_LOCKED` (and `VM_LOCKONFAULT` for `MLOCK_ONFAULT`) on
//! the VMAs of the range, splitting and merging as any flag change, then
//! populates the pages (not for on-fault locks). aspace never swaps, so a
//! lock changes what is resident and which calls refuse the range
//! (`MADV_DONTNEED`, `MADV_FREE`, `msync(MS_INVALIDATE)`), nothing else.
//!
//! `RLIMIT_MEMLOCK` ([`AddressSpace::set_memlock_limit`]) bounds the
//! locked pages (`mm->locked_vm`, here the size of the `VM_LOCKED` VMAs,
//! counted when a lock is asked for: locking is rare, and the count cannot
//! drift from the VMAs) as Linux's `mlock_future_ok` and `do_mlock` do.
//!
//! # Locking
//!
//! Flag changes hold the mmap_lock write side (through `Edit`); population
//! then runs as ordinary faults after it is released (each VMA looked up
//! under the read side); see [`crate::mm`].

use super::edit::Edit;
use super::AddressSpace;
use crate::addr::{page_align_down, Range, PAGE_SHIFT, PAGE_SIZE};
use crate::error::{Error, Result};
use crate::sync::Ordering;
use crate::vma::VmFlags;
use bitflags::bitflags;

bitflags! {
    /// `mlock2` flags (`MLOCK_*`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct MlockFlags: u32 {
        /// Lock pages as they are faulted in, without populating now
        /// (`MLOCK_ONFAULT`: `VM_LOCKONFAULT`).
        const ONFAULT = 1;
    }
}

bitflags! {
    /// `mlockall` flags (`MCL_*`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct MlockAllFlags: u32 {
        /// Lock every current mapping (`MCL_CURRENT`).
        const CURRENT = 1;
        /// Lock every future mapping (`MCL_FUTURE`).
        const FUTURE = 2;
        /// With either: lock on fault, do not populate (`MCL_ONFAULT`).
        const ONFAULT = 4;
    }
}

/// The lock flags of a VMA (`VM_LOCKED_MASK`).
const LOCKED_MASK: VmFlags = VmFlags::LOCKED.union(VmFlags::LOCKONFAULT);

/// The flags of a VMA with flags `f` after a lock change to `add` (empty
/// to unlock). Droppable memory keeps its flags: Linux's `mlock_fixup`
/// skips it without an error.
fn lock_flags(f: VmFlags, add: VmFlags) -> VmFlags {
    if f.contains(VmFlags::DROPPABLE) {
        f
    } else {
        (f - LOCKED_MASK) | add
    }
}

/// `mlock`'s page rounding: the start down to its page, the length grown
/// by the start's offset and rounded up (wrapping, as the kernel's
/// `PAGE_ALIGN`).
fn lock_range(addr: u64, len: u64) -> (u64, u64) {
    let start = page_align_down(addr);
    let len = len.wrapping_add(addr - start).wrapping_add(PAGE_SIZE - 1) & !(PAGE_SIZE - 1);
    (start, len)
}

impl AddressSpace {
    /// Locks the pages of `[addr, addr + len)` in memory and faults them
    /// in, like `mlock(2)`. `addr` is rounded down to its page.
    ///
    /// Errors as Linux's: `EPERM` when the memlock limit is 0; `ENOMEM`
    /// when the pages locked after the call (those of the range not
    /// locked yet, plus every locked page) would pass the memlock limit,
    /// or when the range is not fully mapped (the
    /// VMAs before the first hole are locked) or when a page cannot be
    /// faulted in (an inaccessible VMA: it stays locked); `EAGAIN` when a
    /// fault runs out of memory; `EINVAL` when the range wraps.
    pub fn mlock(&self, addr: u64, len: u64) -> Result<()> {
        self.mlock2(addr, len, MlockFlags::empty())
    }

    /// `mlock2(2)`: [`mlock`](Self::mlock), or with
    /// [`MlockFlags::ONFAULT`] a lock that takes pages as they fault in
    /// (nothing is populated now). `EINVAL` for unknown flags.
    pub fn mlock2(&self, addr: u64, len: u64, flags: MlockFlags) -> Result<()> {
        if !MlockFlags::all().contains(flags) {
            return Err(Error::Inval);
        }
        if !self.can_do_mlock() {
            return Err(Error::Perm);
        }
        let mut add = VmFlags::LOCKED;
        if flags.contains(MlockFlags::ONFAULT) {
            add |= VmFlags::LOCKONFAULT;
        }
        let (start, len) = lock_range(addr, len);
        self.apply_lock_flags(start, len, add)?;
        let end = start.saturating_add(len);
        self.populate_locked(Range::new(start, end), false)
    }

    /// Unlocks the pages of `[addr, addr + len)`, like `munlock(2)`;
    /// errors as [`mlock`](Self::mlock)'s (the VMAs before a hole are
    /// unlocked).
    pub fn munlock(&self, addr: u64, len: u64) -> Result<()> {
        let (start, len) = lock_range(addr, len);
        self.apply_lock_flags(start, len, VmFlags::empty())
    }

    /// Locks every mapping, like `mlockall(2)`: `CURRENT` locks (and
    /// populates, ignoring failures) the mappings there are, `FUTURE`
    /// makes new mappings (mmap, brk) locked, `ONFAULT` makes either lock
    /// on fault. `EINVAL` for no flags, unknown flags, or `ONFAULT` alone;
    /// `EPERM` when the memlock limit is 0; `ENOMEM` for `CURRENT` when
    /// the whole mapped size passes the memlock limit (nothing changes).
    pub fn mlockall(&self, flags: MlockAllFlags) -> Result<()> {
        if flags.is_empty()
            || !MlockAllFlags::all().contains(flags)
            || flags == MlockAllFlags::ONFAULT
        {
            return Err(Error::Inval);
        }
        if !self.can_do_mlock() {
            return Err(Error::Perm);
        }
        self.apply_mlockall(flags)?;
        if flags.contains(MlockAllFlags::CURRENT) {
            let _ = self.populate_locked(Range::new(0, self.cfg.task_size), true);
        }
        Ok(())
    }

    /// Unlocks every mapping and stops locking new ones, like
    /// `munlockall(2)`.
    pub fn munlockall(&self) -> Result<()> {
        self.apply_mlockall(MlockAllFlags::empty())
    }

    /// The locked-memory limit in bytes (`RLIMIT_MEMLOCK`'s soft limit).
    /// Starts as [`Config::memlock_limit`](super::Config::memlock_limit).
    pub fn memlock_limit(&self) -> u64 {
        self.memlock_limit.load(Ordering::Relaxed)
    }

    /// Sets the locked-memory limit, like `setrlimit(RLIMIT_MEMLOCK)`: 0
    /// refuses every lock with `EPERM`, `u64::MAX` is unlimited (as
    /// `RLIM_INFINITY`, or `CAP_IPC_LOCK`). Applies from the next lock on:
    /// pages locked already stay locked.
    pub fn set_memlock_limit(&self, bytes: u64) {
        self.memlock_limit.store(bytes, Ordering::Relaxed);
    }

    /// Bytes locked now (`VmLck` of `/proc/pid/status`): the size of the
    /// `VM_LOCKED` VMAs.
    pub fn locked_bytes(&self) -> u64 {
        let _st = self.mmap_lock.read();
        let g = self.tree.pin();
        self.tree
            .iter(&g)
            .filter(|(_, v)| v.flags().contains(VmFlags::LOCKED))
            .map(|(r, _)| r.len())
            .sum()
    }

    /// Linux's `can_do_mlock`: any lock at all is allowed.
    fn can_do_mlock(&self) -> bool {
        self.memlock_limit() != 0
    }

    /// Linux's `mlock_future_ok`: a new mapping (or growth) of `bytes`
    /// with flags `flags` keeps the locked pages within the limit. Under
    /// the mmap_lock write side (`ed`).
    pub(super) fn mlock_future_ok(&self, ed: &Edit<'_>, flags: VmFlags, bytes: u64) -> bool {
        // The flags first: no load of the limit for the common case.
        if !flags.contains(VmFlags::LOCKED) {
            return true;
        }
        let limit = self.memlock_limit();
        if limit == u64::MAX {
            return true;
        }
        let pages = (bytes >> PAGE_SHIFT).saturating_add(locked_in(ed, 0, u64::MAX));
        pages <= limit >> PAGE_SHIFT
    }

    /// Linux's `apply_vma_lock_flags`: the lock flags of every VMA of
    /// `[start, start + len)` become `add`, until the first hole
    /// (`ENOMEM`).
    fn apply_lock_flags(&self, start: u64, len: u64, add: VmFlags) -> Result<()> {
        let mut ed = Edit::begin(self);
        // do_mlock's limit check, before the range is looked at: the pages
        // of the range, plus those locked, less those of the range that
        // are locked already.
        let limit = self.memlock_limit();
        if add.contains(VmFlags::LOCKED) && limit != u64::MAX {
            let lock_limit = limit >> PAGE_SHIFT;
            let mut locked = (len >> PAGE_SHIFT) + locked_in(&ed, 0, u64::MAX);
            if locked > lock_limit {
                locked -= locked_in(&ed, start, start.saturating_add(len));
            }
            if locked > lock_limit {
                return Err(Error::NoMem);
            }
        }
        let end = start.checked_add(len).ok_or(Error::Inval)?;
        if end == start {
            return Ok(());
        }
        let Some(mut vma) = ed.find(start) else {
            return Err(Error::NoMem);
        };
        let mut nstart = start;
        loop {
            let tmp = vma.end().min(end);
            let newflags = lock_flags(vma.flags(), add);
            let cur = if newflags == vma.flags() {
                vma
            } else {
                ed.modify_flags(vma, nstart, tmp, newflags)?
            };
            nstart = tmp.max(cur.end());
            if nstart >= end {
                return Ok(());
            }
            match ed.find(nstart) {
                Some(next) if next.start() == nstart => vma = next,
                _ => return Err(Error::NoMem),
            }
        }
    }

    /// Linux's `apply_mlockall_flags`, after mlockall's limit check.
    fn apply_mlockall(&self, flags: MlockAllFlags) -> Result<()> {
        let mut ed = Edit::begin(self);
        let limit = self.memlock_limit();
        if flags.contains(MlockAllFlags::CURRENT) && limit != u64::MAX {
            // total_vm: every mapped page.
            let total: u64 = ed
                .vmas_in(Range::new(0, u64::MAX))
                .iter()
                .map(|v| (v.end() - v.start()) >> PAGE_SHIFT)
                .sum();
            if total > limit >> PAGE_SHIFT {
                return Err(Error::NoMem);
            }
        }
        let mut add = VmFlags::LOCKED;
        if flags.contains(MlockAllFlags::ONFAULT) {
            add |= VmFlags::LOCKONFAULT;
        }
        let future = if flags.contains(MlockAllFlags::FUTURE) {
            add
        } else {
            VmFlags::empty()
        };
        ed.state_mut().def_flags = future;
        if !flags.is_empty() && !flags.contains(MlockAllFlags::CURRENT) {
            return Ok(());
        }
        if !flags.contains(MlockAllFlags::CURRENT) {
            add = VmFlags::empty();
        }
        let mut cursor = 0;
        while let Some(v) = ed.find_after(cursor) {
            let newflags = lock_flags(v.flags(), add);
            let cur = if newflags == v.flags() {
                v
            } else {
                // Splitting is not needed (whole VMAs); a merge cannot
                // fail for want of map count.
                ed.modify_flags(v, v.start(), v.end(), newflags)
                    .unwrap_or(v)
            };
            cursor = cur.end();
        }
        Ok(())
    }
}

/// Pages of `VM_LOCKED` VMAs inside `[start, end)` (Linux's
/// `count_mm_mlocked_page_nr`; the whole space gives `mm->locked_vm`).
fn locked_in(ed: &Edit<'_>, start: u64, end: u64) -> u64 {
    if end <= start {
        return 0;
    }
    ed.vmas_in(Range::new(start, end))
        .iter()
        .filter(|v| v.flags().contains(VmFlags::LOCKED))
        .map(|v| (v.end().min(end) - v.start().max(start)) >> PAGE_SHIFT)
        .sum()
}
