//! Range operations on the entries of existing PTE tables: zap (unmap,
//! MADV_DONTNEED), change (mprotect) and lock-free iteration.

use super::{entry_span, index, PageTable, Pte, Table, LEVELS, VA_BITS};
use crate::addr::{Range, PAGE_SIZE};
use crate::phys::Pfn;
use crate::reclaim::Guard;
use crate::sync::Ordering;

impl PageTable {
    /// Visits every existing PTE table overlapping `r`, with the part of
    /// `r` it covers.
    fn for_each_table<'g>(&'g self, r: Range, g: &'g Guard, mut f: impl FnMut(&'g Table, Range)) {
        let end = r.end.min(1 << VA_BITS);
        let mut va = r.start;
        while va < end {
            // Walk down; an empty entry at `level` lets us skip its span.
            let Some(mut t) = self.child(&self.root, g) else {
                return; // no root: no table anywhere
            };
            let mut empty_at = None;
            for level in (1..LEVELS).rev() {
                match self.child(&t.entries[index(va, level)], g) {
                    Some(c) => t = c,
                    None => {
                        empty_at = Some(level);
                        break;
                    }
                }
            }
            let span = entry_span(empty_at.unwrap_or(1));
            let stop = ((va & !(span - 1)) + span).min(end);
            if empty_at.is_none() {
                f(t, Range::new(va, stop));
            }
            va = stop;
        }
    }

    /// Clears every present entry in `r` under each PTE table's lock and
    /// calls `release(va, frame)` for it once it is cleared, with the
    /// frame reference the entry held, now the caller's to drop (`None`
    /// for the zero page, which holds none).
    pub fn zap_range(&self, r: Range, g: &Guard, mut release: impl FnMut(u64, Option<Pfn>)) {
        self.rewrite_present(r, g, |_, _| Pte::NONE, |va, old| release(va, old.frame()));
    }

    /// Rewrites every present entry in `r` to `f(va, old)`, a present
    /// entry.
    pub fn change_range(&self, r: Range, g: &Guard, f: impl FnMut(u64, Pte) -> Pte) {
        self.rewrite_present(r, g, f, |_, _| {});
    }

    /// The locked loop of [`zap_range`](Self::zap_range) and
    /// [`change_range`](Self::change_range): under each PTE table's lock,
    /// for every present entry `old` in `r`, stores `new(va, old)` where it
    /// differs (keeping the table's count of used entries exact), then
    /// calls `after(va, old)`.
    fn rewrite_present(
        &self,
        r: Range,
        g: &Guard,
        mut new: impl FnMut(u64, Pte) -> Pte,
        mut after: impl FnMut(u64, Pte),
    ) {
        self.for_each_table(r, g, |t, part| {
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
        });
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
                    let _l = self.holder_lock(holder);
                    if e.load(Ordering::Acquire) != 0 {
                        continue; // linked meanwhile: sweep that table
                    }
                    // This slot and the empty ones after it in the same
                    // table, under the one acquisition.
                    let Some(h) = holder else {
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
    /// snapshot, each entry read whole).
    pub fn for_each_present(&self, r: Range, g: &Guard, mut f: impl FnMut(u64, Pte)) {
        self.for_each_table(r, g, |t, part| {
            let mut va = part.start;
            while va < part.end {
                let v = t.entries[index(va, 0)].load(Ordering::Acquire);
                if v != 0 {
                    f(va, Pte(v));
                }
                va += PAGE_SIZE;
            }
        });
    }
}
