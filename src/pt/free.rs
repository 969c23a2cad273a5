//! Freeing table pages: the empty tables of an unmapped range (Linux's
//! `free_pgtables`), retired through the epoch, and the whole tree when
//! the page table is dropped.

use super::{entry_span, PageTable, Table, ENTRIES, LEVELS, TABLE_BIT, TABLE_BYTES};
use crate::addr::Range;
use crate::reclaim::Guard;
use crate::sync::counter;
use crate::sync::Ordering;

impl PageTable {
    /// Frees the table pages whose whole span lies inside `r` and that map
    /// nothing. The caller guarantees no VMA covers `r`, so no fault walks
    /// there; lock-free walkers that still might are protected by the
    /// reclaimer.
    #[cfg(any(test, aspace_loom))]
    pub fn free_tables(&self, r: Range, g: &Guard) {
        self.free_tables_within(r, r, g);
    }

    /// Frees the empty table pages on the paths to `r` whose whole span
    /// lies inside `limits` (which holds `r`): Linux's `free_pgtables` with
    /// `limits` as its floor and ceiling. Only entries meeting `r` are
    /// visited, so unmapping a page below a huge gap costs a walk, not a
    /// scan of the gap. The caller guarantees no VMA covers `limits`.
    pub fn free_tables_within(&self, r: Range, limits: Range, g: &Guard) {
        debug_assert!(limits.start <= r.start && r.end <= limits.end);
        if let Some(root) = self.child(&self.root, g) {
            self.free_in(root, LEVELS - 1, 0, r, limits, g);
        }
    }

    /// Frees empty child tables of `t` (at `level`, covering addresses from
    /// `base`) that meet `r` and lie inside `limits`. The caller checks
    /// emptiness of `t` itself.
    fn free_in(&self, t: &Table, level: u32, base: u64, r: Range, limits: Range, g: &Guard) {
        if level == 0 {
            return;
        }
        let span = entry_span(level);
        // Only the entries whose span meets `r`.
        let first = (r.start.saturating_sub(base) / span).min(ENTRIES as u64) as usize;
        let last = (r.end.saturating_sub(base).div_ceil(span)).min(ENTRIES as u64) as usize;
        for i in first..last {
            let lo = base + i as u64 * span;
            let hi = lo.saturating_add(span);
            if hi <= r.start || lo >= r.end {
                continue;
            }
            let e = &t.entries[i];
            let Some(child) = self.child(e, g) else {
                continue;
            };
            self.free_in(child, level - 1, lo, r, limits, g);
            if lo >= limits.start && hi <= limits.end && child.is_empty() {
                let v = e.swap(0, Ordering::AcqRel);
                t.used.fetch_sub(1, Ordering::Relaxed);
                self.tables.local().fetch_sub(1, counter::Ordering::Relaxed);
                let ptr = (v & !TABLE_BIT) as *mut Table;
                // Uncharged now, freed after the grace period: the budget
                // may run ahead of the host by what the epoch holds back.
                self.budget.uncharge(TABLE_BYTES);
                // SAFETY: the entry held this table; the swap unlinked it,
                // so only walkers pinned before now can reach it, and the
                // reclaimer frees it after they are gone. We own it.
                unsafe {
                    self.reclaimer
                        .retire_with(g, ptr, |p| drop(Box::from_raw(p)));
                }
            }
        }
    }
}

impl Drop for PageTable {
    fn drop(&mut self) {
        self.budget.uncharge(TABLE_BYTES * self.table_pages());
        fn free(t: &Table, level: u32) {
            // An empty table has no child to free.
            if level == 0 || t.is_empty() {
                return;
            }
            for e in t.entries.iter() {
                let v = e.load(Ordering::Relaxed);
                if v != 0 {
                    let p = (v & !TABLE_BIT) as *mut Table;
                    // SAFETY: non-zero upper entries own a table from
                    // Box::into_raw; the page table is being dropped, so no
                    // walker can be inside it.
                    let child = unsafe { Box::from_raw(p) };
                    free(&child, level - 1);
                }
            }
        }
        let v = self.root.load(Ordering::Acquire);
        if v != 0 {
            // SAFETY: a non-zero root entry owns a table from Box::into_raw
            // (see `make_table`); nothing else can reach it any more.
            let root = unsafe { Box::from_raw((v & !TABLE_BIT) as *mut Table) };
            free(&root, LEVELS - 1);
        }
    }
}
