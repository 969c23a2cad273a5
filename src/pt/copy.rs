//! fork's page-table copy, a PTE table at a time (Linux's
//! `copy_page_range` down to `copy_pte_range`).
//!
//! The walk goes down the source once per PTE table, skipping every range
//! whose upper-level entry is empty, finds or creates the destination's
//! PTE table once, and copies the table's present entries under both
//! tables' locks. Per entry it only loads, asks the caller what to store
//! (fork write-protects private entries and takes a frame reference, or
//! gives the child a copy of a page a device has pinned, which may fail
//! for want of memory) and stores; it never walks from the root per page.

use super::walk::Make;
use super::{entry_span, index, PageTable, Pte, PteFlags, Table};
use crate::addr::{Range, PAGE_SIZE};
use crate::reclaim::Guard;
use crate::sync::{MutexGuard, Ordering};

impl PageTable {
    /// Copies the present entries of `ranges` (page-aligned, sorted and
    /// disjoint: fork's VMAs) into `dst`, whose entries there must be
    /// empty. For each present entry, `f(va, pte)` returns `Some((source
    /// entry, destination entry))`: the entry to leave in this table
    /// (stored only if it differs) and the one to install in `dst`; or
    /// `None` if the entry cannot be copied (fork: no frame for a pinned
    /// page's copy). Returns the number of entries copied, or `Err(va)` for
    /// the first entry that could not be copied (`dst` cannot hold `va`,
    /// its entry there is taken, or `f` refused it); neither table changed
    /// at `va`, `f` has not run for anything after it, and what was copied
    /// before stays.
    ///
    /// Consecutive ranges inside one PTE table (many small VMAs) share one
    /// walk and one acquisition of both tables' locks; a range whose upper
    /// tables are missing is skipped a whole missing span at a time.
    ///
    /// The caller keeps every other writer out of the ranges in both
    /// tables (fork: the parent's mmap_lock write side and its VMAs
    /// write-locked; the child unpublished). Lock-free walkers of either
    /// table may run and see each entry before or after its change, never
    /// torn. Each source PTE table's lock is taken before the
    /// destination's, and nobody else holds two PTE locks of two page
    /// tables.
    pub fn copy_ranges(
        &self,
        dst: &PageTable,
        ranges: impl IntoIterator<Item = Range>,
        g: &Guard,
        dg: &Guard,
        mut f: impl FnMut(u64, Pte) -> Option<(Pte, Pte)>,
    ) -> Result<u64, u64> {
        let pmd = entry_span(1);
        let mut copied = 0;
        // The PTE table pair in use: its span's base, and the locked pair
        // (`None`: the source has no entries there).
        let mut cur: Option<(u64, Option<Locked<'_>>)> = None;
        for r in ranges {
            let mut va = r.start;
            while va < r.end {
                let base = va & !(pmd - 1);
                if cur.as_ref().is_none_or(|c| c.0 != base) {
                    cur = None;
                    if let Some(skip) = self.missing_span(va, g) {
                        va = va.saturating_add(skip).min(r.end);
                        continue;
                    }
                    if self.huge_at(va, g).is_some() {
                        // A 2 MiB page: copied whole where the range
                        // holds it (a VMA always does: leaves never
                        // straddle VMAs), else split first.
                        if va == base && r.end - base >= pmd {
                            if let Some(n) = self.copy_huge(dst, base, g, dg, &mut f)? {
                                copied += n;
                                va = base + pmd;
                                continue;
                            }
                        } else {
                            self.split_huge(va, g);
                        }
                    }
                    let src = self.pte_table(va, Make::No, g).expect("not missing");
                    // Emptiness is read under the table's lock, never
                    // without: an install racing the copy is then either
                    // counted here or made after the lock is dropped (and
                    // sees the stamps fork put on the VMAs first).
                    let src_lock = src.lock.lock();
                    let pair = if src.is_empty() {
                        None
                    } else {
                        let to = dst.pte_table(va, Make::Charged, dg).ok_or(va)?;
                        Some(Locked::new(src, src_lock, to))
                    };
                    cur = Some((base, pair));
                }
                let stop = (base + pmd).min(r.end);
                if let Some((_, Some(pair))) = &mut cur {
                    copied += pair.copy(Range::new(va, stop), &mut f)?;
                }
                va = stop;
            }
        }
        Ok(copied)
    }
}

impl PageTable {
    /// Copies the PMD leaf of the 2 MiB span at `base` into `dst` under
    /// the PMD table's lock: `f` runs for each of its 512 pages; if the
    /// entries it returns still form one leaf on each side (fork: the
    /// same write-protected flags over the same frames), one leaf is
    /// stored on each; else the source is split into the entries to keep
    /// and the destination gets a PTE table of the copies. `Ok(None)` if
    /// no leaf is there any more (the caller copies the table); `Err(va)`
    /// as [`copy_ranges`](Self::copy_ranges) (the source split, keeping
    /// what was copied before `va`).
    fn copy_huge(
        &self,
        dst: &PageTable,
        base: u64,
        g: &Guard,
        dg: &Guard,
        f: &mut impl FnMut(u64, Pte) -> Option<(Pte, Pte)>,
    ) -> Result<Option<u64>, u64> {
        let Some((pmd, e)) = self.pmd_slot(base, g) else {
            return Ok(None);
        };
        let Some((l, v, table)) = self.lock_leaf(pmd, e) else {
            return Ok(None);
        };
        let leaf = super::leaf_pte(v);
        let mut pairs = Vec::with_capacity(super::ENTRIES);
        let mut refused = None;
        for i in 0..super::ENTRIES as u32 {
            let va = base + u64::from(i) * PAGE_SIZE;
            match f(va, leaf.subpage(i)) {
                Some(p) => pairs.push(p),
                None => {
                    refused = Some(va);
                    break;
                }
            }
        }
        let as_leaf = |p: Pte| Pte::new(p.pfn(), p.flags() | PteFlags::HUGE);
        let forms_leaf = |side: &dyn Fn(&(Pte, Pte)) -> Pte| {
            let first = side(&pairs[0]);
            (first.pfn().is_zero_page() || first.pfn().get() % super::ENTRIES as u32 == 0)
                && pairs
                    .iter()
                    .enumerate()
                    .all(|(i, p)| side(p) == as_leaf(first).subpage(i as u32))
        };
        if refused.is_none() && forms_leaf(&|p| p.0) && forms_leaf(&|p| p.1) {
            let (keep, copy) = (as_leaf(pairs[0].0), as_leaf(pairs[0].1));
            dst.install_huge(base, copy, dg, || true)
                .map_err(|_| base)?;
            if keep != leaf {
                e.store(super::leaf_word(keep), Ordering::Release);
            }
            drop(l);
            self.free_unlinked_table(table);
            return Ok(Some(super::ENTRIES as u64));
        }
        // Split: the source keeps what `f` said for the pages copied and
        // its old entries after; the copies go into PTEs of `dst`.
        self.link_split(e, table, |i| {
            pairs.get(i).map_or(leaf.subpage(i as u32), |p| p.0)
        });
        drop(l);
        for (i, p) in pairs.iter().enumerate() {
            dst.install(base + i as u64 * PAGE_SIZE, p.1, dg)
                .map_err(|_| base + i as u64 * PAGE_SIZE)?;
        }
        match refused {
            Some(va) => Err(va),
            None => Ok(Some(pairs.len() as u64)),
        }
    }
}

/// A source PTE table and its destination, both locked (source first;
/// they belong to two page tables, so they are never the same table).
/// Adds the destination's new entries to its count when released.
struct Locked<'g> {
    src: &'g Table,
    dst: &'g Table,
    _src_lock: MutexGuard<'g, ()>,
    _dst_lock: MutexGuard<'g, ()>,
    added: u32,
}

impl<'g> Locked<'g> {
    fn new(src: &'g Table, _src_lock: MutexGuard<'g, ()>, dst: &'g Table) -> Self {
        let _dst_lock = dst.lock.lock();
        Locked {
            src,
            dst,
            _src_lock,
            _dst_lock,
            added: 0,
        }
    }

    /// Copies the present entries of `part` (inside this pair's span).
    /// `Err(va)` at a taken destination entry or one `f` refuses.
    fn copy(
        &mut self,
        part: Range,
        f: &mut impl FnMut(u64, Pte) -> Option<(Pte, Pte)>,
    ) -> Result<u64, u64> {
        let first = index(part.start, 0);
        let last = index(part.end - PAGE_SIZE, 0);
        let mut n = 0;
        for i in first..=last {
            let se = &self.src.entries[i];
            let old = se.load(Ordering::Relaxed);
            if old == 0 {
                continue;
            }
            let va = part.start + ((i - first) as u64) * PAGE_SIZE;
            let de = &self.dst.entries[i];
            if de.load(Ordering::Relaxed) != 0 {
                return Err(va);
            }
            let (keep, copy) = f(va, Pte(old)).ok_or(va)?;
            if keep.0 != old {
                se.store(keep.0, Ordering::Release);
            }
            de.store(copy.0, Ordering::Release);
            self.added += 1;
            n += 1;
        }
        Ok(n)
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        // One count update per table, before its lock is released.
        self.dst.used.fetch_add(self.added, Ordering::Relaxed);
    }
}

#[cfg(all(test, not(aspace_loom)))]
mod tests {
    use super::*;
    use crate::phys::Pfn;
    use crate::pt::PteFlags;
    use crate::reclaim::Reclaimer;

    const RW: PteFlags = PteFlags::WRITE.union(PteFlags::USER);

    #[test]
    fn copies_present_entries_across_tables_and_skips_holes() {
        let (a, b) = (
            PageTable::new(Reclaimer::epoch()),
            PageTable::new(Reclaimer::epoch()),
        );
        let (ga, gb) = (a.pin(), b.pin());
        // Entries in three PTE tables, one of them 1 GiB away (its upper
        // tables exist only there).
        let vas = [0x1000u64, 0x1ff000, 0x200000, 0x5000_0000, 0x5000_3000];
        for (i, &va) in vas.iter().enumerate() {
            a.install(va, Pte::new(Pfn::new(i as u32 + 10), RW), &ga)
                .unwrap();
        }
        let mut seen = Vec::new();
        let n = a
            .copy_ranges(&b, [Range::new(0x1000, 0x5000_3000)], &ga, &gb, |va, p| {
                seen.push(va);
                let ro = Pte::new(p.pfn(), p.flags() - PteFlags::WRITE);
                Some((ro, ro))
            })
            .unwrap();
        // The last entry lies at the range's end: not copied.
        assert_eq!(n, 4);
        assert_eq!(seen, &vas[..4]);
        for (i, &va) in vas[..4].iter().enumerate() {
            let want = Pte::new(Pfn::new(i as u32 + 10), PteFlags::USER);
            assert_eq!(a.lookup(va, &ga), want);
            assert_eq!(b.lookup(va, &gb), want);
        }
        assert_eq!(b.lookup(0x5000_3000, &gb), Pte::NONE);
        assert!(a.lookup(0x5000_3000, &ga).is_writable());
        // Tables were created in the copy only where entries were.
        assert_eq!(b.table_pages(), a.table_pages());
    }

    #[test]
    fn a_taken_destination_entry_stops_the_copy_there() {
        let (a, b) = (
            PageTable::new(Reclaimer::epoch()),
            PageTable::new(Reclaimer::epoch()),
        );
        let (ga, gb) = (a.pin(), b.pin());
        for p in 0..4u64 {
            a.install(p * PAGE_SIZE, Pte::new(Pfn::new(p as u32 + 1), RW), &ga)
                .unwrap();
        }
        b.install(2 * PAGE_SIZE, Pte::new(Pfn::new(99), RW), &gb)
            .unwrap();
        let mut calls = 0;
        let res = a.copy_ranges(&b, [Range::new(0, 4 * PAGE_SIZE)], &ga, &gb, |_, p| {
            calls += 1;
            Some((p, p))
        });
        assert_eq!(res, Err(2 * PAGE_SIZE));
        assert_eq!(calls, 2);
        assert_eq!(b.lookup(PAGE_SIZE, &gb).pfn(), Pfn::new(2));
        assert_eq!(b.lookup(2 * PAGE_SIZE, &gb).pfn(), Pfn::new(99));
        assert_eq!(b.lookup(3 * PAGE_SIZE, &gb), Pte::NONE);
        // Out of the 48-bit space: nothing to copy from, nothing fails.
        assert_eq!(
            a.copy_ranges(
                &b,
                [Range::new(1 << 48, (1 << 48) + PAGE_SIZE)],
                &ga,
                &gb,
                |_, p| Some((p, p))
            ),
            Ok(0)
        );
    }

    #[test]
    fn an_entry_the_caller_refuses_stops_the_copy_there_unchanged() {
        let (a, b) = (
            PageTable::new(Reclaimer::epoch()),
            PageTable::new(Reclaimer::epoch()),
        );
        let (ga, gb) = (a.pin(), b.pin());
        for p in 0..3u64 {
            a.install(p * PAGE_SIZE, Pte::new(Pfn::new(p as u32 + 1), RW), &ga)
                .unwrap();
        }
        let res = a.copy_ranges(&b, [Range::new(0, 3 * PAGE_SIZE)], &ga, &gb, |va, p| {
            let ro = Pte::new(p.pfn(), PteFlags::USER);
            (va != PAGE_SIZE).then_some((ro, ro))
        });
        assert_eq!(res, Err(PAGE_SIZE));
        assert_eq!(a.lookup(0, &ga), Pte::new(Pfn::new(1), PteFlags::USER));
        assert_eq!(a.lookup(PAGE_SIZE, &ga), Pte::new(Pfn::new(2), RW));
        assert_eq!(b.lookup(PAGE_SIZE, &gb), Pte::NONE);
        assert_eq!(b.lookup(2 * PAGE_SIZE, &gb), Pte::NONE);
    }

    #[test]
    fn ranges_sharing_a_table_copy_only_their_own_entries() {
        let (a, b) = (
            PageTable::new(Reclaimer::epoch()),
            PageTable::new(Reclaimer::epoch()),
        );
        let (ga, gb) = (a.pin(), b.pin());
        for p in 0..16u64 {
            a.install(p * PAGE_SIZE, Pte::new(Pfn::new(p as u32 + 1), RW), &ga)
                .unwrap();
        }
        // Every other page, as one range each, then a range in a table
        // that does not exist.
        let ranges = (0..8u64)
            .map(|k| Range::new(2 * k * PAGE_SIZE, (2 * k + 1) * PAGE_SIZE))
            .chain([Range::new(1 << 40, (1 << 40) + PAGE_SIZE)]);
        let n = a
            .copy_ranges(&b, ranges, &ga, &gb, |_, p| Some((p, p)))
            .unwrap();
        assert_eq!(n, 8);
        for p in 0..16u64 {
            let want = if p % 2 == 0 {
                Pte::new(Pfn::new(p as u32 + 1), RW)
            } else {
                Pte::NONE
            };
            assert_eq!(b.lookup(p * PAGE_SIZE, &gb), want);
        }
        // The destination's count is exact: zapping empties its table.
        let mut zapped = 0;
        b.zap_range(Range::new(0, 16 * PAGE_SIZE), &gb, |_, _| zapped += 1);
        assert_eq!(zapped, 8);
        b.free_tables(Range::new(0, 1 << 47), &gb);
        assert_eq!(b.table_pages(), 1);
    }
}
