//! A consistency check of the page table against the VMAs, for tests and
//! loom models: what every writer must leave behind, whatever it raced.

use super::AddressSpace;
use crate::addr::Range;
use crate::vma::VmFlags;

impl AddressSpace {
    /// Checks every present page-table entry against the VMA over it:
    /// there is one; the entry is writable only if the VMA is; a private
    /// frame (not the zero page) of anonymous memory has an anon_vma to
    /// be found by (fork and the reverse map reach pages only through it).
    /// Returns the first violation found. Takes the mmap_lock read side,
    /// so call it with no writer of this space running.
    pub(crate) fn check_ptes(&self) -> Result<(), String> {
        let _st = self.mmap_lock.read();
        let Some(pt) = self.pt.peek() else {
            return Ok(());
        };
        let g = pt.pin();
        let tg = self.tree.pin();
        let mut bad = None;
        pt.for_each_present(Range::new(0, self.cfg.task_size), &g, |va, pte| {
            if bad.is_some() {
                return;
            }
            let Some((_, v)) = self.tree.find(va, &tg) else {
                bad = Some(format!("{va:#x}: {pte:?} where no VMA is"));
                return;
            };
            if pte.is_writable() && !v.flags().contains(VmFlags::WRITE) {
                bad = Some(format!("{va:#x}: writable {pte:?} in {v:?}"));
            } else if pte.frame().is_some() && v.is_anonymous() && !v.has_anon_vma() {
                bad = Some(format!("{va:#x}: private {pte:?} in {v:?}, no anon_vma"));
            }
        });
        bad.map_or(Ok(()), Err)
    }
}

#[cfg(all(test, not(aspace_loom)))]
mod tests {
    use crate::{AddressSpace, Config, MapFlags, Prot};

    /// A space after ordinary calls passes; an entry left where no VMA is
    /// any more fails.
    #[test]
    fn finds_an_entry_outside_every_vma() {
        let mm = AddressSpace::new(Config::default());
        let anon = MapFlags::PRIVATE | MapFlags::ANONYMOUS;
        let a = mm.mmap(0, 1 << 20, Prot::READ | Prot::WRITE, anon).unwrap();
        mm.write(a, &[1; 8192]).unwrap();
        mm.mprotect(a, 4096, Prot::READ).unwrap();
        mm.check_ptes().unwrap();
        // Remove the VMA from the tree behind the page table's back.
        {
            let mut ed = crate::mm::edit::Edit::begin(&mm);
            let v = ed.find(a).unwrap();
            ed.lock(v);
            ed.erase(v.range());
        }
        assert!(mm.check_ptes().unwrap_err().contains("no VMA"));
    }
}
