//! read/write: user-mode loads and stores.
//!
//! # Locking
//!
//! Takes no lock on the fast path: each page is translated by a lock-free
//! page-table walk, counted in flight on the thread's CPU slot (so a TLB
//! flush waits for it), and faulted in through [`crate::mm::fault`] on a
//! miss. The store precheck reads each VMA's flags under that VMA's read
//! lock, falling back to the mmap_lock read side.

use super::{Access, AddressSpace};
use crate::addr::{Range, PAGE_SIZE};
use crate::error::{Error, FaultError, MemoryFault, Result};
use crate::phys::{FrameAllocator, Pfn};
use crate::pt::PteFlags;
use crate::vma::{VmFlags, Vma};

/// The copy of a read: `(frame, offset in page, offset in buffer, bytes)`
/// into `buf`, zeros from the zero page.
pub(super) fn copy_out<'b>(
    frames: &'b FrameAllocator,
    buf: &'b mut [u8],
) -> impl FnMut(Pfn, usize, usize, usize) + 'b {
    move |pfn, off, b, n| {
        if pfn.is_zero_page() {
            buf[b..b + n].fill(0);
        } else {
            frames.read(pfn, off, &mut buf[b..b + n]);
        }
    }
}

/// The copy of a write: `(frame, offset in page, offset in data, bytes)`
/// from `data`.
pub(super) fn copy_in<'b>(
    frames: &'b FrameAllocator,
    data: &'b [u8],
) -> impl FnMut(Pfn, usize, usize, usize) + 'b {
    move |pfn, off, b, n| frames.write(pfn, off, &data[b..b + n])
}

impl AddressSpace {
    /// Reads `buf.len()` bytes at `addr` like user-mode loads: pages fault
    /// in on demand; `EFAULT` if a page is unmapped or not readable (bytes
    /// of earlier pages may already be in `buf`, as after a real fault).
    /// The error is [`Error::Memory`]: the faulting address, the kind of
    /// fault, and how many bytes were read before it.
    pub fn read(&self, addr: u64, buf: &mut [u8]) -> Result<()> {
        let len = buf.len();
        self.copy_user(addr, len, Access::Read, copy_out(&self.frames, buf))
    }

    /// Writes `data` at `addr` like user-mode stores: pages fault in on
    /// demand. `EFAULT`, writing nothing, if a page mapped before the first
    /// hole in the range is not writable. Otherwise `EFAULT` at the first
    /// page that cannot be written (a hole no stack grows into, or a page
    /// past the hole without write permission); the pages before it are
    /// written, as by a real `memcpy`. The error is [`Error::Memory`], as
    /// for [`read`](Self::read).
    pub fn write(&self, addr: u64, data: &[u8]) -> Result<()> {
        self.copy_user(addr, data.len(), Access::Write, copy_in(&self.frames, data))
    }

    /// Walks `[addr, addr + len)` page by page; `f(pfn, offset in page,
    /// offset in buffer, bytes)` copies while the translation is pinned.
    fn copy_user(
        &self,
        addr: u64,
        len: usize,
        access: Access,
        mut f: impl FnMut(Pfn, usize, usize, usize),
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let task = self.cfg.task_size;
        let fail = |at: u64, kind: FaultError, done: usize| {
            Error::Memory(MemoryFault {
                addr: at,
                kind,
                done,
            })
        };
        // Like Linux's access_ok: a range past the task size copies nothing.
        let end = addr
            .checked_add(len as u64)
            .filter(|&e| e <= task)
            .ok_or(fail(addr.max(task), FaultError::NoMapping, 0))?;
        self.precheck(Range::new(addr, end), access)?;
        let write = access == Access::Write;
        let mut a = addr;
        // `addr <= a < end <= task_size`: no sum below can overflow but
        // the page's end, where a task size `validate` refuses (`new`
        // takes one as given) puts the last page at the top.
        while a < end {
            let page = a & !(PAGE_SIZE - 1);
            let off = (a - page) as usize;
            let n = (page.saturating_add(PAGE_SIZE).min(end) - a) as usize;
            let b = (a - addr) as usize;
            loop {
                let g = self.pt.pin();
                let acc = self.tlb.begin_access();
                let pte = self.pt.lookup(page, &g);
                let f_ok = pte.is_present()
                    && pte.flags().contains(PteFlags::USER)
                    && !pte.flags().contains(PteFlags::EXEC_ONLY)
                    && (!write || pte.flags().contains(PteFlags::WRITE));
                if f_ok {
                    acc.model_point();
                    f(pte.pfn(), off, b, n);
                    break;
                }
                drop(acc);
                drop(g);
                self.fault(page, access).map_err(|kind| fail(a, kind, b))?;
            }
            a += n as u64;
        }
        Ok(())
    }

    /// Fails with `EFAULT` before touching anything if the mapped part of
    /// `r` that the access reaches before its first hole forbids `access`.
    /// From the first hole on, pages are left to the walk, as a real
    /// `memcpy` meets them: the fault path may grow a stack into the hole
    /// (and then fail on that stack's protection), or fail there.
    ///
    /// The tree is read without the mmap_lock, so a VMA found there may be
    /// changing or already recycled for another range: each one's flags are
    /// read under its read lock, after checking it still is the VMA the
    /// tree showed. If one cannot be locked (a writer holds it), the whole
    /// check runs again under the mmap_lock read side.
    fn precheck(&self, r: Range, access: Access) -> Result<()> {
        let seq = self.mmap_lock.seq();
        let locked_flags = |vr: Range, v: &Vma| {
            v.lock.try_read(seq).ok()?;
            let f = (v.mm_id() == self.id && v.range() == vr).then(|| v.flags());
            v.lock.read_unlock();
            f
        };
        if let Some(res) = self.precheck_with(r, access, locked_flags) {
            return res;
        }
        // Under the mmap_lock (in range mode: `r` widened to the whole VMAs
        // it meets, shared) no VMA it reads changes its range or flags.
        let (_st, _pin) = super::range_read::read_vmas(self, r);
        self.precheck_with(r, access, |_, v| Some(v.flags()))
            .unwrap_or(Ok(()))
    }

    /// The check of [`precheck`](Self::precheck), with each VMA's flags
    /// from `flags_of`; `None` if `flags_of` could not vouch for one.
    fn precheck_with(
        &self,
        r: Range,
        access: Access,
        mut flags_of: impl FnMut(Range, &Vma) -> Option<VmFlags>,
    ) -> Option<Result<()>> {
        let g = self.tree.pin();
        let mut next = r.start;
        for (vr, v) in self.tree.range(r, &g) {
            if vr.start > next {
                break; // a hole: the walk stops or grows a stack there
            }
            let f = flags_of(vr, v)?;
            let ok = match access {
                Access::Write => f.contains(VmFlags::WRITE),
                _ => f.accessible(),
            };
            if !ok {
                return Some(Err(Error::Memory(MemoryFault {
                    addr: vr.start.max(r.start),
                    kind: FaultError::AccessDenied,
                    done: 0,
                })));
            }
            next = vr.end;
        }
        Some(Ok(()))
    }
}
