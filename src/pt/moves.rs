//! mremap's page-table move (Linux's `move_page_tables`): entries are
//! copied an extent at a time under both PTE locks, and whole PTE tables
//! are relinked to their new PMD entry where both spans are aligned.

use super::walk::Make;
use super::{entry_span, index, PageTable, PteFlags, Table};
use crate::addr::{Range, PAGE_SIZE};
use crate::reclaim::Guard;
use crate::sync::{AtomicU64, Ordering};

/// What [`PageTable::move_range`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MoveStats {
    /// Present entries moved, one by one or inside relinked tables.
    pub entries: u64,
    /// Entries moved one by one (copied, then cleared at the source).
    pub copied: u64,
    /// PTE tables moved whole by relinking their PMD entry.
    pub relinked: u64,
    /// Extents that moved at least one entry (`after_extent` calls).
    pub extents: u64,
}
impl PageTable {
    /// Moves the present entries of `[from, from + len)` to
    /// `[to, to + len)` (whose entries must be empty), like Linux's
    /// `move_page_tables`.
    ///
    /// The move goes in extents bounded by the next PMD boundary of both
    /// source and destination and by `max_extent` bytes (at least one
    /// page). An extent that is a whole PMD span at both ends moves by
    /// relinking the source's PTE table into the destination's empty PMD
    /// entry (no entry is copied); other extents copy their entries under
    /// both PTE tables' locks. For each extent that moved a present entry,
    /// `after_extent(source extent)` runs while those locks are still held
    /// (where Linux flushes the TLB, before dropping the PTLs).
    ///
    /// The caller keeps every other writer out of both ranges (Linux: the
    /// mmap_lock held for write and both VMAs write-locked); lock-free
    /// walkers may still run and see each entry at its old place, its new
    /// place or (briefly) both, never a torn or freed table. An entry whose
    /// destination is taken stays where it is (for the caller's unmap of
    /// the old range to release).
    pub fn move_range(
        &self,
        from: u64,
        to: u64,
        len: u64,
        max_extent: u64,
        g: &Guard,
        mut after_extent: impl FnMut(Range),
    ) -> MoveStats {
        let pmd = entry_span(1);
        let max = (max_extent & !(PAGE_SIZE - 1)).max(PAGE_SIZE);
        let mut st = MoveStats::default();
        let mut off = 0;
        while off < len {
            let (src, dst) = (from + off, to + off);
            if let Some(skip) = self.missing_span(src, g) {
                // No table maps the source here: nothing to move up to the
                // end of the missing table's span.
                off = off.saturating_add(skip).min(len);
                continue;
            }
            let n = (pmd - src % pmd)
                .min(pmd - dst % pmd)
                .min(len - off)
                .min(max);
            if self.huge_at(src, g).is_some() {
                // A 2 MiB page: moved whole where both ends are aligned
                // (Linux's move_huge_pmd), else split and moved as PTEs.
                if n == pmd {
                    if let Some(m) = self.move_huge(src, dst, g, &mut after_extent) {
                        st.entries += m;
                        st.extents += 1;
                        off += n;
                        continue;
                    }
                }
                self.split_huge(src, g);
            }
            let moved = if n == pmd {
                match self.relink_pte_table(src, dst, g, &mut after_extent) {
                    Some(m) => {
                        if m > 0 {
                            st.relinked += 1;
                        }
                        m
                    }
                    None => self.move_ptes(src, dst, n, g, &mut after_extent, &mut st),
                }
            } else {
                self.move_ptes(src, dst, n, g, &mut after_extent, &mut st)
            };
            if moved > 0 {
                st.entries += moved;
                st.extents += 1;
            }
            off += n;
        }
        st
    }

    /// Copies the present entries of one extent (inside one PTE table at
    /// each end) under both tables' locks. Returns how many moved.
    fn move_ptes(
        &self,
        from: u64,
        to: u64,
        n: u64,
        g: &Guard,
        after_extent: &mut impl FnMut(Range),
        st: &mut MoveStats,
    ) -> u64 {
        let Some(src) = self.pte_table(from, Make::No, g) else {
            return 0;
        };
        // `used` counts this extent's entries too, and nobody else changes
        // them, so zero means there is nothing to move. Read under the
        // lock, never without: a racing install is then counted, or made
        // after the lock is dropped (and sees the caller's stamp).
        let _src_lock = src.lock.lock();
        if src.is_empty() {
            return 0;
        }
        let Some(dst) = self.pte_table(to, Make::Forced, g) else {
            return 0;
        };
        // Only the mmap_lock writer takes two PTE locks at once, so the
        // order between them cannot deadlock.
        let _dst_lock = (!core::ptr::eq(src, dst)).then(|| dst.lock.lock());
        let mut moved = 0;
        let mut o = 0;
        while o < n {
            let se = &src.entries[index(from + o, 0)];
            let v = se.load(Ordering::Relaxed);
            o += PAGE_SIZE;
            if v == 0 {
                continue;
            }
            let de = &dst.entries[index(to + o - PAGE_SIZE, 0)];
            if de.load(Ordering::Relaxed) != 0 {
                debug_assert!(false, "mremap destination entry was not empty");
                continue;
            }
            // A moved entry reads as written since the last soft-dirty
            // reset (Linux's move_soft_dirty_pte); a relinked table keeps
            // its entries' bits, as Linux's move_normal_pmd does.
            let v = v | PteFlags::SOFT_DIRTY.bits();
            // New place first: a walker finds the page at one place or
            // both while it moves, never at neither.
            de.store(v, Ordering::Release);
            dst.used_add_locked(1);
            se.store(0, Ordering::Release);
            src.used_add_locked(-1);
            moved += 1;
        }
        if moved > 0 {
            st.copied += moved;
            after_extent(Range::new(from, from + n));
        }
        moved
    }

    /// Moves the PMD leaf at the 2 MiB-aligned `from` to the empty slot
    /// at `to`: the new place first, then the old one cleared, each under
    /// its PMD table's lock, as a relink does. Returns the pages moved
    /// (512), `Some(0)` if the leaf went meanwhile, or `None` if the
    /// destination slot is taken (the caller splits and copies).
    fn move_huge(
        &self,
        from: u64,
        to: u64,
        g: &Guard,
        after_extent: &mut impl FnMut(Range),
    ) -> Option<u64> {
        let (src_pmd, se) = self.pmd_slot(from, g)?;
        let v = se.load(Ordering::Acquire);
        if !super::is_leaf(v) {
            return Some(0);
        }
        // A moved page reads as written since the last soft-dirty reset
        // (Linux's move_soft_dirty_pmd).
        let moved = v | PteFlags::SOFT_DIRTY.bits();
        self.swing_pmd(src_pmd, se, to, moved, g)?;
        after_extent(Range::new(from, from + entry_span(1)));
        Some(super::ENTRIES as u64)
    }

    /// Stores `v` into the empty PMD slot of `to`, then empties the slot
    /// `se` of `src_pmd` that held it: each under its PMD table's lock,
    /// as every link and unlink is made (see `make_table`), the new place
    /// first. `None` if the destination slot is taken.
    fn swing_pmd(&self, src_pmd: &Table, se: &AtomicU64, to: u64, v: u64, g: &Guard) -> Option<()> {
        let dst_pmd = self.table_at(to, 1, Make::Forced, g)?;
        let de = &dst_pmd.entries[index(to, 1)];
        {
            let _l = dst_pmd.lock.lock();
            de.compare_exchange(0, v, Ordering::AcqRel, Ordering::Acquire)
                .ok()?;
            dst_pmd.used.fetch_add(1, Ordering::Relaxed);
        }
        // A walker that read the old entry keeps using the (live) table
        // or page, and translates the old addresses to the same frames
        // until the caller's flush: exactly a stale TLB entry.
        {
            let _l = src_pmd.lock.lock();
            se.store(0, Ordering::Release);
            src_pmd.used.fetch_sub(1, Ordering::Relaxed);
        }
        Some(())
    }

    /// Moves the whole PTE table of the PMD-aligned 2 MiB span at `from`
    /// to the one at `to` by swinging the PMD entries. Returns the number
    /// of present entries it carried, or `None` if the destination already
    /// has a table (the caller copies entries instead).
    fn relink_pte_table(
        &self,
        from: u64,
        to: u64,
        g: &Guard,
        after_extent: &mut impl FnMut(Range),
    ) -> Option<u64> {
        let Some(src_pmd) = self.table_at(from, 1, Make::No, g) else {
            return Some(0);
        };
        let se = &src_pmd.entries[index(from, 1)];
        let Some(table) = self.child(se, g) else {
            return Some(0);
        };
        // Hold the table's lock over the count, the swing and the flush,
        // as Linux holds the PMD locks (nobody else may be changing its
        // entries; a racing install is counted or sees the caller's stamp).
        let _l = table.lock.lock();
        let count = u64::from(table.used.load(Ordering::Acquire));
        if count == 0 {
            // Nothing to move; the empty table is freed with the old range.
            return Some(0);
        }
        let v = se.load(Ordering::Relaxed);
        // The PTE lock held here is taken before the slot locks, as
        // everywhere.
        self.swing_pmd(src_pmd, se, to, v, g)?;
        after_extent(Range::new(from, from + entry_span(1)));
        Some(count)
    }
}
