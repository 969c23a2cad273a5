//! Forced access: a debugger's or loader's reads and writes of another
//! task's memory (`ptrace(PTRACE_POKEDATA)`, `/proc/PID/mem`), with the
//! rules Linux's `FOLL_FORCE` gives `get_user_pages`.
//!
//! - A read needs the VMA readable, or at least `VM_MAYREAD` (so
//!   `PROT_NONE` and execute-only memory read).
//! - A write needs the VMA writable, or a copy-on-write mapping (private
//!   with `VM_MAYWRITE`, Linux's `is_cow_mapping`): the write then breaks
//!   copy-on-write as a write fault would, but the new private copy's
//!   entry stays read-only, because the VMA is. The VMA is neither split
//!   nor changed, and the copy is an ordinary anonymous page: reads and
//!   faults see it, fork shares it copy-on-write, and a later
//!   `mprotect(PROT_WRITE)` keeps it.
//! - A shared mapping that is not writable is refused, as is an address
//!   no VMA covers (no stack grows for a forced access, as in Linux since
//!   6.5).
//!
//! The written page is the one the entry maps once it is this mapping's
//! own: writable, or (Linux's `can_follow_write_pte`) read-only in a VMA
//! that is not writable but already written (dirty and soft-dirty, no
//! userfault write-protect bit) with its frame referenced by this entry
//! alone. Anything else runs the ordinary fault for write first.
//!
//! Userfault-registered ranges behave as for a fault: a missing page is
//! handed to the handler and the access waits for it. This differs from
//! Linux's `/proc/PID/mem` and `ptrace`, whose page lookup may not drop
//! the mmap_lock to wait, so a missing page of a registered range fails
//! there (`EIO`, seen on 6.18); the handler path is the one an emulator
//! serving its own faults needs.
//!
//! # Locking
//!
//! Each page is looked up, checked and copied under the mmap_lock read
//! side (as Linux's `access_remote_vm` holds it; with range writers, the
//! neighbourhood of the page's VMA shared, as the fault fallback's,
//! `range_read`: fork still takes the whole space), inside a counted
//! user-mode access ([`crate::tlb`]): no fork can share the page between
//! the check that it is this mapping's own and the write, and no zap can
//! free the frame under the copy. A fault that waits for a userfault
//! handler drops the lock first. Order: [`crate::mm`].

use super::access::{copy_in, copy_out};
use super::fault::{do_fault, Step};
use super::{Access, AddressSpace};
use crate::addr::PAGE_SIZE;
use crate::error::{Error, FaultError, MemoryFault, Result};
use crate::phys::Pfn;
use crate::pt::{Pte, PteFlags};
use crate::stats::Event;
use crate::vma::VmFlags;

impl AddressSpace {
    /// Reads `buf.len()` bytes at `addr` as a debugger does
    /// (`/proc/PID/mem`, `PTRACE_PEEKDATA`): like [`read`](Self::read),
    /// but a VMA that may be made readable (`VM_MAYREAD`: `PROT_NONE`,
    /// execute-only) reads too. Pages are faulted in as by a read fault.
    ///
    /// Stops at the first page that cannot be read (no VMA, or one
    /// without `VM_MAYREAD`): the error is [`Error::Memory`] with that
    /// address, the kind of fault and the bytes read before it, as
    /// `/proc/PID/mem` returns a short count (or `EIO` when it is 0).
    ///
    /// ```
    /// use aspace::{AddressSpace, Config, MapFlags, Prot};
    /// let mm = AddressSpace::new(Config::default());
    /// let a = mm.mmap(0, 4096, Prot::NONE,
    ///                 MapFlags::PRIVATE | MapFlags::ANONYMOUS).unwrap();
    /// let mut buf = [1u8; 8];
    /// assert!(mm.read(a, &mut buf).is_err());  // PROT_NONE
    /// mm.read_forced(a, &mut buf).unwrap();    // but VM_MAYREAD
    /// assert_eq!(buf, [0; 8]);
    /// ```
    pub fn read_forced(&self, addr: u64, buf: &mut [u8]) -> Result<()> {
        let len = buf.len();
        self.copy_forced(addr, len, Access::Read, copy_out(&self.frames, buf))
    }

    /// Writes `data` at `addr` as a debugger or loader does
    /// (`/proc/PID/mem`, `PTRACE_POKEDATA`): like [`write`](Self::write)
    /// where the VMA is writable; where it is not, a private mapping
    /// (copy-on-write, `VM_MAYWRITE`) gets a private copy of the page,
    /// written, whose entry stays read-only: the VMA is not split and its
    /// protection does not change (no `mprotect` around the write). A
    /// shared mapping that is not writable is refused.
    ///
    /// Page by page: stops at the first page that cannot be written, with
    /// [`Error::Memory`] naming that address, the kind of fault
    /// ([`FaultError::AccessDenied`] for a refused VMA,
    /// [`FaultError::NoMapping`] where none is) and the bytes written
    /// before it.
    ///
    /// ```
    /// use aspace::{AddressSpace, Config, MapFlags, Prot};
    /// let mm = AddressSpace::new(Config::default());
    /// let text = mm.mmap(0, 4096, Prot::READ | Prot::EXEC,
    ///                    MapFlags::PRIVATE | MapFlags::ANONYMOUS).unwrap();
    /// assert!(mm.write(text, &[0xcc]).is_err()); // r-x
    /// mm.write_forced(text, &[0xcc]).unwrap();   // a breakpoint
    /// let mut b = [0u8; 1];
    /// mm.read(text, &mut b).unwrap();
    /// assert_eq!(b, [0xcc]);
    /// assert!(mm.write(text, &[0]).is_err());    // still r-x
    /// assert_eq!(mm.vmas().len(), 1);            // and not split
    /// ```
    pub fn write_forced(&self, addr: u64, data: &[u8]) -> Result<()> {
        self.copy_forced(addr, data.len(), Access::Write, copy_in(&self.frames, data))
    }

    /// Walks `[addr, addr + len)` page by page; `f(pfn, offset in page,
    /// offset in buffer, bytes)` copies while the page is held.
    fn copy_forced(
        &self,
        addr: u64,
        len: usize,
        access: Access,
        mut f: impl FnMut(Pfn, usize, usize, usize),
    ) -> Result<()> {
        let mut b = 0;
        while b < len {
            // `b < len` fits the address space only while `a` stays below
            // the task size, checked before any sum.
            let a = addr
                .checked_add(b as u64)
                .filter(|&a| a < self.cfg.task_size);
            let fail = |at: u64, kind| {
                Error::Memory(MemoryFault {
                    addr: at,
                    kind,
                    done: b,
                })
            };
            let a = a.ok_or(fail(addr.saturating_add(b as u64), FaultError::NoMapping))?;
            let page = a & !(PAGE_SIZE - 1);
            let off = (a - page) as usize;
            let n = (PAGE_SIZE as usize - off).min(len - b);
            self.forced_page(page, access, |pfn| f(pfn, off, b, n))
                .map_err(|kind| fail(a, kind))?;
            b += n;
        }
        Ok(())
    }

    /// Makes `page` accessible to a forced `access` and runs `copy` on its
    /// frame, under the mmap_lock read side and inside a counted access.
    fn forced_page(
        &self,
        page: u64,
        access: Access,
        copy: impl FnOnce(Pfn),
    ) -> core::result::Result<(), FaultError> {
        let write = access == Access::Write;
        loop {
            // In range mode: the VMA's neighbourhood, shared (`range_read`).
            let (st, g) = super::range_read::read_fault(self, page);
            let Some((_, v)) = self.tree.find(page, &g) else {
                return Err(FaultError::NoMapping);
            };
            let v = *v;
            let flags = v.flags();
            if !force_allows(flags, write) {
                return Err(FaultError::AccessDenied);
            }
            loop {
                {
                    let pg = self.pt.pin();
                    let acc = self.tlb.begin_access();
                    let pte = self.pt.lookup(page, &pg);
                    if self.followable(pte, flags, write) {
                        acc.model_point();
                        copy(pte.pfn());
                        return Ok(());
                    }
                }
                match do_fault(self, &v, page, access, false) {
                    Ok(()) => self.stats.inc(Event::fault_mmap_lock),
                    // Under the mmap_lock nothing asks for a retry.
                    Err(Step::Retry(_)) => {}
                    Err(Step::Fail(e)) => return Err(e),
                    Err(Step::Wait(w)) => {
                        drop(g);
                        drop(st);
                        w.wait(self)?;
                        break; // the VMA may have changed: look again
                    }
                }
            }
        }
    }

    /// True if a forced access may use `pte` of a VMA with `flags` as it
    /// is (Linux's `follow_page_pte` with `can_follow_write_pte`).
    fn followable(&self, pte: Pte, flags: VmFlags, write: bool) -> bool {
        if !pte.is_present() {
            return false;
        }
        if !write || pte.is_writable() {
            return true;
        }
        // A read-only entry is written only where the VMA is not writable
        // (a writable VMA's read-only entry is copy-on-write, soft-dirty
        // or userfault protection: the fault decides) and the page is
        // already this mapping's own written copy. The mmap_lock keeps
        // fork from sharing it until the copy is done.
        let own = PteFlags::DIRTY | PteFlags::SOFT_DIRTY;
        !flags.contains(VmFlags::WRITE)
            && pte.flags().contains(own)
            && !pte.flags().contains(PteFlags::UFFD_WP)
            && pte.frame().is_some_and(|p| self.frames.refcount(p) == 1)
    }
}

/// Linux's `check_vma_flags` for `FOLL_FORCE`: a write needs `VM_WRITE` or
/// a copy-on-write mapping (private, `VM_MAYWRITE`); a read needs
/// `VM_READ` or `VM_MAYREAD`.
fn force_allows(flags: VmFlags, write: bool) -> bool {
    if write {
        flags.contains(VmFlags::WRITE)
            || flags & (VmFlags::SHARED | VmFlags::MAYWRITE) == VmFlags::MAYWRITE
    } else {
        flags.intersects(VmFlags::READ | VmFlags::MAYREAD)
    }
}

#[cfg(all(test, not(aspace_loom)))]
mod tests {
    use crate::{Access, AddressSpace, Config, MapFlags, Memfd, Prot, PAGE_SIZE};

    /// Forced writes into every kind of private page that is not writable
    /// (never faulted, the zero page, an object's page, `PROT_NONE`)
    /// leave only read-only entries in VMAs that are not writable, each
    /// private frame with its anon_vma (`check_ptes`), and one VMA each.
    #[test]
    fn forced_copies_stay_read_only() {
        let mm = AddressSpace::new(Config::default());
        let obj = Memfd::new_in(mm.frame_pool(), "t", 2 * PAGE_SIZE).unwrap();
        let anon = MapFlags::PRIVATE | MapFlags::ANONYMOUS;
        let rx = Prot::READ | Prot::EXEC;
        let len = 2 * PAGE_SIZE;
        let maps = [
            mm.mmap(0, len, rx, anon).unwrap(),
            mm.mmap(0, len, Prot::NONE, anon).unwrap(),
            mm.mmap_fd(0, len, Prot::READ, MapFlags::PRIVATE, &obj, 0)
                .unwrap(),
        ];
        for a in maps {
            mm.read_forced(a + PAGE_SIZE, &mut [0; 1]).unwrap();
            mm.write_forced(a + PAGE_SIZE - 1, &[7, 7]).unwrap();
            mm.check_ptes().unwrap();
            assert!(mm.fault(a, Access::Write).is_err());
        }
        assert_eq!(mm.vmas().len(), 3);
    }
}
