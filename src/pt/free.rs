//! Freeing table pages: the empty tables of an unmapped range (Linux's
//! `free_pgtables`), retired through the epoch and given back after it to
//! the frame cache of the CPU that retired them, and the whole tree when
//! the page table is dropped.

use super::{entry_span, PageTable, Table, ENTRIES, LEVELS, TABLE_BIT, TABLE_BYTES};
use crate::addr::Range;
use crate::phys::FrameAllocator;
use crate::reclaim::Guard;
use crate::sync::counter;
use crate::sync::{Arc, Ordering};
use core::ptr::NonNull;

/// An unlinked table page on its way back to its pool after the grace
/// period, to the cache of the CPU that retired it.
struct Retired {
    frames: Arc<FrameAllocator>,
    table: NonNull<Table>,
    cpu: usize,
}

// SAFETY: the retired page is owned by this request alone (unlinked, and
// handed to the reclaimer); table pages are `Send`.
unsafe impl Send for Retired {}

impl Retired {
    fn free(self) {
        // SAFETY: the page came from `alloc_table` of this pool, was
        // unlinked before it was retired, and the reclaimer runs this only
        // once the walkers that might have reached it are gone.
        unsafe { self.frames.free_table_on(self.cpu, self.table) };
    }
}

impl PageTable {
    /// Retires `table`, just unlinked: uncharged and uncounted now, back
    /// in the pool once the walkers that may still be inside it are gone
    /// (the reclaimer runs the free after them). The budget may run ahead
    /// of the pool by what the epoch holds back (a taker that finds the
    /// pool dry flushes it).
    pub(super) fn retire_table(&self, table: NonNull<Table>, g: &Guard) {
        self.tables.local().fetch_sub(1, counter::Ordering::Relaxed);
        self.frames.memory().uncharge(TABLE_BYTES);
        let retired = Retired {
            frames: self.frames.clone(),
            table,
            // The deferred free may run on another thread: the page goes
            // back to this CPU, whose cache holds its lines.
            cpu: crate::percpu::cpu_id(),
        };
        self.reclaimer.defer(g, move || retired.free());
    }

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
            if self.free_in(root, LEVELS - 1, 0, r, limits, g) {
                // Hand what was retired to the collector now: the frames
                // come back to the pool once the epoch has moved on,
                // rather than when this thread's deferred list fills.
                self.reclaimer.flush(g);
            }
        }
    }

    /// Frees empty child tables of `t` (at `level`, covering addresses from
    /// `base`) that meet `r` and lie inside `limits`. The caller checks
    /// emptiness of `t` itself. True if any was freed.
    fn free_in(
        &self,
        t: &Table,
        level: u32,
        base: u64,
        r: Range,
        limits: Range,
        g: &Guard,
    ) -> bool {
        if level == 0 {
            return false;
        }
        let mut freed = false;
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
            freed |= self.free_in(child, level - 1, lo, r, limits, g);
            if lo >= limits.start && hi <= limits.end && child.is_empty() {
                // Unlinked under the lock its link was made under: a
                // speculative fault that finds the slot empty and links a
                // new table there validates its snapshot under this lock
                // after us (and sees the stamps of the writer that emptied
                // the span). No table is linked into an empty span's
                // tables meanwhile: every linker validates the same way,
                // or holds a VMA lock that keeps it out of the hole.
                let v = {
                    let _l = self.slot_lock(t, level, i);
                    t.used.fetch_sub(1, Ordering::Relaxed);
                    e.swap(0, Ordering::AcqRel)
                };
                let table = NonNull::new((v & !TABLE_BIT) as *mut Table).expect("a table");
                // The entry held this table; the swap unlinked it, so only
                // walkers pinned before now can reach it.
                self.retire_table(table, g);
                freed = true;
            }
        }
        freed
    }
}

impl Drop for PageTable {
    fn drop(&mut self) {
        self.frames
            .memory()
            .uncharge(TABLE_BYTES * self.table_pages());
        fn free(frames: &FrameAllocator, v: u64, level: u32) {
            let p = NonNull::new((v & !TABLE_BIT) as *mut Table).expect("a table");
            // SAFETY: a non-zero entry (or root) holds a table page from
            // `alloc_table`; the page table is being dropped, so no walker
            // can be inside it.
            let t = unsafe { p.as_ref() };
            // An empty table has no child to free.
            if level > 0 && !t.is_empty() {
                for e in t.entries.iter() {
                    let c = e.load(Ordering::Relaxed);
                    // A PMD leaf maps a page, not a table (its frames
                    // were released by the teardown's zap).
                    if super::is_table(c) {
                        free(frames, c, level - 1);
                    }
                }
            }
            // SAFETY: as above; nothing can reach it any more.
            unsafe { frames.free_table(p) };
        }
        let v = self.root.load(Ordering::Acquire);
        if v != 0 {
            free(&self.frames, v, LEVELS - 1);
        }
    }
}
