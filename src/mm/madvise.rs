//! madvise.

use super::{AddressSpace, Advice};
use crate::addr::{is_page_aligned, page_align_up, Range};
use crate::error::{Error, Result};
use crate::vma::VmFlags;

impl AddressSpace {
    /// Gives advice about `[addr, addr + len)`, like `madvise(2)`.
    ///
    /// `DontNeed` drops the pages without changing the VMAs: private
    /// anonymous memory reads back as zero, shared memory keeps its
    /// contents (the shared object still holds the frames). Mapped parts of
    /// a range with holes are still processed, then the call fails with
    /// `ENOMEM`, as Linux does. `EINVAL` for an unaligned address or an
    /// overflowing range.
    pub fn madvise(&self, addr: u64, len: u64, advice: Advice) -> Result<()> {
        if !is_page_aligned(addr) {
            return Err(Error::Inval);
        }
        let alen = page_align_up(len).unwrap_or(0);
        if len != 0 && alen == 0 {
            return Err(Error::Inval);
        }
        let end = addr.checked_add(alen).ok_or(Error::Inval)?;
        if end == addr {
            return Ok(());
        }
        let r = Range::new(addr, end);
        // Linux runs DONTNEED under the mmap_lock read side: concurrent
        // faults may refill pages meanwhile, as they may in the kernel.
        let _st = self.mmap_lock.read();
        let g = self.tree.pin();
        let mut hole = false;
        let mut cursor = addr;
        let mut gather = crate::tlb::Gather::new(&self.tlb, &self.stats, &self.frames);
        for (vr, v) in self.tree.range(r, &g) {
            if vr.start > cursor {
                hole = true;
            }
            // Locked pages cannot be dropped (Linux's
            // madvise_dontneed_free_valid_vma): EINVAL at this VMA, after
            // the ones before it were processed.
            if advice == Advice::DontNeed && v.flags().contains(VmFlags::LOCKED) {
                gather.flush();
                return Err(Error::Inval);
            }
            let part = vr
                .intersect(&r)
                .expect("range() yields intersecting entries");
            cursor = part.end;
            if advice == Advice::DontNeed {
                let _ = v.flags().contains(VmFlags::SHARED);
                super::edit::zap_range(self, part, &mut gather);
            }
        }
        gather.flush();
        if cursor < end {
            hole = true;
        }
        if hole {
            Err(Error::NoMem)
        } else {
            Ok(())
        }
    }
}
