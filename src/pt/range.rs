//! Range operations on the entries of existing PTE tables: zap (unmap,
//! MADV_DONTNEED), change (mprotect) and lock-free iteration.

use super::huge::HUGE_SIZE;
use super::walk::Make;
use super::{
    entry_span, index, is_leaf, leaf_pte, leaf_word, PageTable, Pte, PteFlags, Table, ENTRIES,
    LEVELS, VA_BITS,
};
use crate::addr::{Range, PAGE_SIZE};
use crate::phys::Pfn;
use crate::reclaim::Guard;
use crate::sync::{AtomicU64, Ordering};

/// What maps one PMD span's part of a range: a PTE table, or a PMD leaf
/// (its PMD table and slot).
enum Unit<'g> {
    Table(&'g Table),
    Leaf(&'g Table, &'g AtomicU64),
}

impl PageTable {
    /// Visits every existing PTE table and PMD leaf overlapping `r`, with
    /// the part of `r` it covers.
    fn for_each_unit<'g>(&'g self, r: Range, g: &'g Guard, mut f: impl FnMut(Unit<'g>, Range)) {
        let end = r.end.min(1 << VA_BITS);
        let mut va = r.start;
        while va < end {
            // Walk down; an empty entry at `level` lets us skip its span.
            let Some(mut t) = self.child(&self.root, g) else {
                return; // no root: no table anywhere
            };
            let mut empty_at = None;
            let mut leaf = None;
            for level in (1..LEVELS).rev() {
                let e = &t.entries[index(va, level)];
                match self.child(e, g) {
                    Some(c) => t = c,
                    None => {
                        if level == 1 && is_leaf(e.load(Ordering::Acquire)) {
                            leaf = Some(e);
                        }
                        empty_at = Some(level);
                        break;
                    }
                }
            }
            let span = entry_span(empty_at.unwrap_or(1));
            let stop = ((va & !(span - 1)) + span).min(end);
            match (empty_at, leaf) {
                (None, _) => f(Unit::Table(t), Range::new(va, stop)),
                (_, Some(e)) => f(Unit::Leaf(t, e), Range::new(va, stop)),
                _ => {}
            }
            va = stop;
        }
    }

    /// Clears every present entry in `r` under each PTE table's lock and
    /// calls `release(va, frame)` for it once it is cleared, with the
    /// frame reference the entry held, now the caller's to drop (`None`
    /// for the zero page, which holds none). A whole PMD leaf cleared
    /// releases its 512 pages one by one.
    pub fn zap_range(&self, r: Range, g: &Guard, release: impl FnMut(u64, Option<Pfn>)) {
        let release = core::cell::RefCell::new(release);
        self.zap_range_huge(
            r,
            g,
            |va, frame| (release.borrow_mut())(va, frame),
            |va, leaf| {
                for i in 0..ENTRIES as u32 {
                    (release.borrow_mut())(va + u64::from(i) * PAGE_SIZE, leaf.subpage(i).frame());
                }
            },
        );
    }

    /// [`zap_range`](Self::zap_range), with each whole PMD leaf cleared
    /// released by `release_huge(va, leaf)` instead (its 512 references,
    /// the caller's to drop together: see `phys::huge`).
    pub fn zap_range_huge(
        &self,
        r: Range,
        g: &Guard,
        mut release: impl FnMut(u64, Option<Pfn>),
        mut release_huge: impl FnMut(u64, Pte),
    ) {
        self.rewrite_present(
            r,
            g,
            |_, _| Pte::NONE,
            |va, old| release(va, old.frame()),
            &mut release_huge,
        );
    }

    /// Rewrites every present entry in `r` to `f(va, old)`, a present
    /// entry.
    pub fn change_range(&self, r: Range, g: &Guard, f: impl FnMut(u64, Pte) -> Pte) {
        self.rewrite_present(r, g, f, |_, _| {}, &mut |_, _| {});
    }

    /// The locked loop of [`zap_range`](Self::zap_range) and
    /// [`change_range`](Self::change_range): under each PTE table's lock,
    /// for every present entry `old` in `r`, stores `new(va, old)` where it
    /// differs (keeping the table's count of used entries exact), then
    /// calls `after(va, old)`; for a whole PMD leaf that `new` empties,
    /// `after_leaf(va, leaf)` once instead.
    fn rewrite_present(
        &self,
        r: Range,
        g: &Guard,
        mut new: impl FnMut(u64, Pte) -> Pte,
        mut after: impl FnMut(u64, Pte),
        after_leaf: &mut dyn FnMut(u64, Pte),
    ) {
        self.for_each_unit(r, g, |u, part| match u {
            Unit::Table(t) => rewrite_table(t, part, &mut new, &mut after),
            Unit::Leaf(pmd, e) => {
                self.rewrite_leaf(pmd, e, part, g, &mut new, &mut after, after_leaf)
            }
        });
    }

    /// [`rewrite_present`](Self::rewrite_present) over `part` of the span
    /// of the PMD leaf in slot `e` of `pmd`. Where `part` is the whole
    /// span, the 512 pages' new entries are computed under the PMD lock
    /// and stored as one leaf if they still form one (all empty: the
    /// leaf goes; the same flags over the same frames: the leaf changes),
    /// else as a PTE table of them (a split). Where `part` is less, the
    /// leaf is split first and its table rewritten as any other.
    #[allow(clippy::too_many_arguments)]
    fn rewrite_leaf(
        &self,
        pmd: &Table,
        e: &AtomicU64,
        part: Range,
        g: &Guard,
        new: &mut impl FnMut(u64, Pte) -> Pte,
        after: &mut impl FnMut(u64, Pte),
        after_leaf: &mut dyn FnMut(u64, Pte),
    ) {
        let base = part.start & !(HUGE_SIZE - 1);
        if part.start != base || part.end != base + HUGE_SIZE {
            self.split_huge(part.start, g);
            if let Some(t) = self.pte_table(part.start, Make::No, g) {
                rewrite_table(t, part, new, after);
            }
            return;
        }
        let Some((l, v, table)) = self.lock_leaf(pmd, e) else {
            // Split or zapped since the walk: rewrite what is there now.
            if let Some(t) = self.pte_table(part.start, Make::No, g) {
                rewrite_table(t, part, new, after);
            }
            return;
        };
        let leaf = leaf_pte(v);
        let vals: Vec<Pte> = (0..ENTRIES as u32)
            .map(|i| new(base + u64::from(i) * PAGE_SIZE, leaf.subpage(i)))
            .collect();
        let first = vals[0];
        let as_leaf = Pte::new(first.pfn(), first.flags() | PteFlags::HUGE);
        let mut used_table = false;
        if vals.iter().all(|p| *p == Pte::NONE) {
            e.store(0, Ordering::Release);
            pmd.used.fetch_sub(1, Ordering::Relaxed);
            after_leaf(base, leaf);
            drop(l);
            self.free_unlinked_table(table);
            return;
        } else if (first.pfn().is_zero_page() || first.pfn().get() % ENTRIES as u32 == 0)
            && vals
                .iter()
                .enumerate()
                .all(|(i, p)| *p == as_leaf.subpage(i as u32))
        {
            if as_leaf != leaf {
                e.store(leaf_word(as_leaf), Ordering::Release);
            }
        } else {
            self.link_split(e, table, |i| vals[i]);
            used_table = true;
        }
        for (i, _) in vals.iter().enumerate() {
            after(base + i as u64 * PAGE_SIZE, leaf.subpage(i as u32));
        }
        drop(l);
        if !used_table {
            self.free_unlinked_table(table);
        }
    }

    /// The writers' sweep (see `mm::edit::Edit::lock`): for every page
    /// of `r`, takes and releases either the lock of the PTE table that
    /// covers it (empty tables included) or, where there is none, the lock
    /// of the table holding the empty slot above it (the root slot's lock
    /// if there is no root), having seen the slot empty under that lock.
    ///
    /// An install made under a PTE lock before the sweep reached it is
    /// visible to the caller afterwards; one made after synchronizes with
    /// the sweep and sees everything the caller did before it. So does
    /// every table linked into a slot the sweep found empty, since links
    /// are made under the same lock (`make_table`): a walker that reaches
    /// such a table has synchronized with the sweep.
    pub fn sweep(&self, r: Range, g: &Guard) {
        let end = r.end.min(1 << VA_BITS);
        let mut va = r.start;
        while va < end {
            va = self.sweep_at(va, end, g);
        }
    }

    /// One step of [`sweep`](Self::sweep) at `va`: returns where the next
    /// step starts (the end of the PTE table or of the run of empty slots
    /// it locked, at most `end`).
    fn sweep_at(&self, va: u64, end: u64, g: &Guard) -> u64 {
        // `e` is a slot of `holder` (the root slot when `None`) whose
        // entries are tables of the level below `level`.
        let (mut holder, mut e, mut level) = (None::<&Table>, &self.root, LEVELS);
        loop {
            let span = entry_span(level);
            let next = (va & !(span - 1)).saturating_add(span).min(end);
            match self.child(e, g) {
                Some(t) if level == 1 => {
                    drop(t.lock.lock());
                    return next;
                }
                Some(t) => {
                    level -= 1;
                    holder = Some(t);
                    e = &t.entries[index(va, level)];
                }
                None => {
                    let _l = self.holder_lock(holder, level, va);
                    let v = e.load(Ordering::Acquire);
                    if is_leaf(v) {
                        // A PMD leaf: its slot lock, held now, is the
                        // lock of its entries.
                        return next;
                    }
                    if v != 0 {
                        continue; // linked meanwhile: sweep that table
                    }
                    // This slot and the empty ones after it in the same
                    // table, under the one acquisition (the root table's
                    // slots have a lock each: one slot).
                    let Some(h) = holder.filter(|_| level < LEVELS - 1) else {
                        return next;
                    };
                    let mut stop = next;
                    while stop < end
                        && index(stop, level) != 0
                        && h.entries[index(stop, level)].load(Ordering::Relaxed) == 0
                    {
                        stop = stop.saturating_add(span).min(end);
                    }
                    return stop;
                }
            }
        }
    }

    /// Calls `f(va, pte)` for every present entry in `r` (lock-free
    /// snapshot, each entry read whole; the pages of a PMD leaf as their
    /// 4 KiB views).
    pub fn for_each_present(&self, r: Range, g: &Guard, mut f: impl FnMut(u64, Pte)) {
        self.for_each_unit(r, g, |u, part| match u {
            Unit::Table(t) => {
                let mut va = part.start;
                while va < part.end {
                    let v = t.entries[index(va, 0)].load(Ordering::Acquire);
                    if v != 0 {
                        f(va, Pte(v));
                    }
                    va += PAGE_SIZE;
                }
            }
            Unit::Leaf(_, e) => {
                let v = e.load(Ordering::Acquire);
                let mut va = part.start;
                while va < part.end {
                    if is_leaf(v) {
                        f(va, leaf_pte(v).subpage(index(va, 0) as u32));
                    }
                    va += PAGE_SIZE;
                }
            }
        });
    }
}

/// The locked loop of `rewrite_present` over `part` of the PTE table `t`.
fn rewrite_table(
    t: &Table,
    part: Range,
    new: &mut impl FnMut(u64, Pte) -> Pte,
    after: &mut impl FnMut(u64, Pte),
) {
    let _l = t.lock.lock();
    let mut va = part.start;
    while va < part.end {
        let e = &t.entries[index(va, 0)];
        let old = e.load(Ordering::Relaxed);
        if old != 0 {
            let v = new(va, Pte(old)).0;
            if v != old {
                e.store(v, Ordering::Release);
                if v == 0 {
                    t.used_add_locked(-1);
                }
            }
            after(va, Pte(old));
        }
        va += PAGE_SIZE;
    }
}
