//! A simulated x86-64 4-level page table.
//!
//! Tables are 512 atomic 64-bit entries. Walkers (faults, user-mode
//! accesses) read entries lock-free with `Acquire`; missing tables are
//! installed by compare-and-swap (`Release`), so two faults racing on one
//! region agree on one table and the loser frees its own. Each last-level
//! (PTE) table has its own lock (Linux's split PTE locks): installs,
//! updates, zaps and moves of entries take it; lookups never do.
//!
//! Every table page is charged to the page table's [`Budget`] while it
//! exists: a fault that would need a table past the budget gets no table
//! (`install` fails) instead of growing the host without bound.
//!
//! Table pages are freed only through the [`Reclaimer`], and only where
//! the caller guarantees no VMA covers their span, so a lock-free walker
//! that is still inside one never touches freed memory. mremap may move a
//! whole PTE table to another PMD entry ([`PageTable::move_range`]): a
//! walker that reached it through the old entry keeps reading a live table.

use crate::addr::{Range, PAGE_SHIFT, PAGE_SIZE};
use crate::percpu::PerCpu;
use crate::phys::{Budget, Pfn};
use crate::reclaim::{Guard, Reclaimer};
use crate::sync::counter::AtomicI64;
use crate::sync::{Arc, AtomicU32, AtomicU64, Mutex, Ordering};
use bitflags::bitflags;

mod copy;

bitflags! {
    /// Page-table entry flags (x86-64 bit positions; COW is a software bit).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct PteFlags: u64 {
        /// The entry maps a frame.
        const PRESENT = 1 << 0;
        /// Stores are allowed.
        const WRITE = 1 << 1;
        /// User-mode access is allowed (cleared for PROT_NONE).
        const USER = 1 << 2;
        /// The page was accessed.
        const ACCESSED = 1 << 5;
        /// The page was written.
        const DIRTY = 1 << 6;
        /// Software bit: a private page shared copy-on-write.
        const COW = 1 << 9;
    }
}

/// A page-table entry: frame number and flags.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Pte(u64);

impl Pte {
    /// The empty entry.
    pub const NONE: Pte = Pte(0);

    /// An entry mapping `pfn` with `flags` (PRESENT is added).
    pub const fn new(pfn: Pfn, flags: PteFlags) -> Pte {
        Pte(((pfn as u64) << PAGE_SHIFT) | flags.bits() | PteFlags::PRESENT.bits())
    }

    /// The frame number.
    pub const fn pfn(self) -> Pfn {
        (self.0 >> PAGE_SHIFT) as Pfn
    }

    /// The flags.
    pub const fn flags(self) -> PteFlags {
        PteFlags::from_bits_retain(self.0 & (PAGE_SIZE - 1))
    }

    /// True if the entry maps a frame.
    pub const fn is_present(self) -> bool {
        self.0 & PteFlags::PRESENT.bits() != 0
    }

    /// True if stores are allowed.
    pub const fn is_writable(self) -> bool {
        self.0 & PteFlags::WRITE.bits() != 0
    }
}

impl core::fmt::Debug for Pte {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        if self.is_present() {
            write!(f, "Pte(pfn {}, {:?})", self.pfn(), self.flags())
        } else {
            f.write_str("Pte::NONE")
        }
    }
}

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

/// Entries per table.
const ENTRIES: usize = 512;
/// Levels below the root: the root is level 3, PTE tables level 0.
const LEVELS: u32 = 4;
/// Bits of virtual address translated (48).
const VA_BITS: u32 = PAGE_SHIFT + 9 * LEVELS;
/// Marks an upper-level entry as pointing to a table.
const TABLE_BIT: u64 = 1;

/// One table page. The lock is used only at level 0. `used` counts
/// non-empty entries (changed under the lock at level 0, by the installing
/// CAS and the unlinking writer above), so emptiness needs no scan.
///
/// The header is aligned to 128 bytes (a cache line and its prefetch
/// pair), so two tables' headers never share a line: faults of two
/// threads in PTE tables of their own write disjoint lines.
#[repr(align(128))]
struct Table {
    entries: Box<[AtomicU64]>,
    used: AtomicU32,
    lock: Mutex<()>,
}

impl Table {
    fn new() -> Box<Table> {
        Box::new(Table {
            entries: (0..ENTRIES).map(|_| AtomicU64::new(0)).collect(),
            used: AtomicU32::new(0),
            lock: Mutex::new(()),
        })
    }

    fn is_empty(&self) -> bool {
        self.used.load(Ordering::Acquire) == 0
    }

    /// Adds `delta` to `used` of a PTE table whose lock the caller holds.
    /// Every change of a level-0 count happens under that lock, so a plain
    /// load and store suffice (no locked read-modify-write per install);
    /// lock-free readers only compare the value with zero.
    fn used_add_locked(&self, delta: i32) {
        let v = self.used.load(Ordering::Relaxed);
        self.used
            .store(v.wrapping_add_signed(delta), Ordering::Relaxed);
    }
}

/// Why [`PageTable::install_checked`] installed nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckedInstallError {
    /// No PTE table covers the address (none is created).
    NoTable,
    /// The entry already holds this value.
    Taken(Pte),
    /// The caller's check failed under the table's lock.
    Invalid,
}

/// Bytes one table costs here: its 512 entries (a real x86-64 table page
/// is exactly these 4 KiB) plus the header with its lock and count.
pub const TABLE_BYTES: u64 = PAGE_SIZE + core::mem::size_of::<Table>() as u64;

/// Whether a walk creates missing tables, and how it pays for them.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Make {
    /// Create nothing.
    No,
    /// Create tables within the budget; stop where it is spent.
    Charged,
    /// Create tables even past the budget: for moves whose source tables
    /// are freed right after (mremap), so the overshoot is transient.
    Forced,
}

/// Span of one entry at `level` (level 0: a page).
const fn entry_span(level: u32) -> u64 {
    1 << (PAGE_SHIFT + 9 * level)
}

fn index(va: u64, level: u32) -> usize {
    ((va >> (PAGE_SHIFT + 9 * level)) as usize) & (ENTRIES - 1)
}

/// A 4-level page table.
pub struct PageTable {
    root: Box<Table>,
    reclaimer: Reclaimer,
    tables: PerCpu<AtomicI64>,
    budget: Arc<Budget>,
}

// SAFETY: tables are reached through atomic entries and freed only through
// the reclaimer; entry changes at level 0 happen under the table's lock.
unsafe impl Send for PageTable {}
// SAFETY: as for Send.
unsafe impl Sync for PageTable {}

/// Error from [`PageTable::install`]: the entry already held something, or
/// the address cannot be translated (`Pte::NONE`).
pub type InstallError = Pte;

impl PageTable {
    /// An empty page table whose table pages are retired through
    /// `reclaimer`, with no limit on its tables.
    #[cfg(any(test, aspace_loom))]
    pub fn new(reclaimer: Reclaimer) -> Self {
        Self::with_budget(reclaimer, Arc::new(Budget::unlimited()))
    }

    /// An empty page table whose table pages (the root included) are
    /// charged to `budget`. The root is charged even past the limit: an
    /// address space always has one.
    pub fn with_budget(reclaimer: Reclaimer, budget: Arc<Budget>) -> Self {
        budget.force_charge(TABLE_BYTES);
        PageTable {
            root: Table::new(),
            reclaimer,
            tables: PerCpu::new(|| AtomicI64::new(0)),
            budget,
        }
    }

    /// Pins the reclaimer: walks are safe while the guard lives.
    pub fn pin(&self) -> Guard {
        self.reclaimer.pin()
    }

    /// The table an upper-level entry points to, if any.
    #[inline]
    fn child<'g>(&'g self, e: &AtomicU64, _g: &'g Guard) -> Option<&'g Table> {
        let v = e.load(Ordering::Acquire);
        if v == 0 {
            return None;
        }
        // SAFETY: a non-zero upper entry holds a pointer from Box::into_raw
        // (low bit set) published with Release after initialization. The
        // table is freed only through the reclaimer after being unlinked,
        // and the guard `_g` keeps it alive.
        Some(unsafe { &*((v & !TABLE_BIT) as *const Table) })
    }

    /// The PTE table covering `va`, creating missing tables if `create`.
    #[inline]
    fn pte_table<'g>(&'g self, va: u64, create: Make, g: &'g Guard) -> Option<&'g Table> {
        self.table_at(va, 0, create, g)
    }

    /// The table at `level` (0: PTE table, 1: PMD table, ...) covering
    /// `va`, creating missing tables above it as `create` says. `None` if
    /// a table is missing and may not be created.
    fn table_at<'g>(
        &'g self,
        va: u64,
        level: u32,
        create: Make,
        g: &'g Guard,
    ) -> Option<&'g Table> {
        if va >> VA_BITS != 0 {
            return None;
        }
        let mut t: &Table = &self.root;
        for level in (level + 1..LEVELS).rev() {
            let e = &t.entries[index(va, level)];
            t = match self.child(e, g) {
                Some(c) => c,
                None if create == Make::No => return None,
                None => {
                    if create == Make::Forced {
                        self.budget.force_charge(TABLE_BYTES);
                    } else if !self.budget.try_charge(TABLE_BYTES) {
                        return None;
                    }
                    let new = Box::into_raw(Table::new());
                    match e.compare_exchange(
                        0,
                        new as u64 | TABLE_BIT,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    ) {
                        Ok(_) => {
                            t.used.fetch_add(1, Ordering::Relaxed);
                            self.tables
                                .local()
                                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            // SAFETY: we just published `new`; see `child`.
                            unsafe { &*new }
                        }
                        Err(_) => {
                            // SAFETY: `new` was never published; we own it.
                            unsafe { drop(Box::from_raw(new)) };
                            self.budget.uncharge(TABLE_BYTES);
                            self.child(e, g).expect("the winner's table is there")
                        }
                    }
                }
            };
        }
        Some(t)
    }

    /// The entry for `va` (lock-free); `Pte::NONE` if absent or `va` is
    /// outside the 48-bit space.
    #[inline]
    pub fn lookup(&self, va: u64, g: &Guard) -> Pte {
        match self.pte_table(va, Make::No, g) {
            Some(t) => Pte(t.entries[index(va, 0)].load(Ordering::Acquire)),
            None => Pte::NONE,
        }
    }

    /// Installs `pte` for `va` if its entry is empty, creating tables as
    /// needed. `Err(existing)` if the entry is taken, `Err(Pte::NONE)` if
    /// `va` cannot be translated or a missing table would pass the budget.
    pub fn install(&self, va: u64, pte: Pte, g: &Guard) -> Result<(), InstallError> {
        let t = self.pte_table(va, Make::Charged, g).ok_or(Pte::NONE)?;
        let e = &t.entries[index(va, 0)];
        let _l = t.lock.lock();
        let cur = e.load(Ordering::Relaxed);
        if cur != 0 {
            return Err(Pte(cur));
        }
        e.store(pte.0, Ordering::Release);
        t.used_add_locked(1);
        Ok(())
    }

    /// Installs `pte` for `va` if a PTE table already covers it (none is
    /// created), `valid()` holds when run under that table's lock, and the
    /// entry is empty. The speculative fault validates its VMA snapshot in
    /// `valid`: a writer that changes the VMA stamps it first and then
    /// takes this same lock, so the check either sees the stamp or comes
    /// before the writer's pass over the table.
    pub fn install_checked(
        &self,
        va: u64,
        pte: Pte,
        g: &Guard,
        valid: impl FnOnce() -> bool,
    ) -> Result<(), CheckedInstallError> {
        let t = self
            .pte_table(va, Make::No, g)
            .ok_or(CheckedInstallError::NoTable)?;
        let e = &t.entries[index(va, 0)];
        let _l = t.lock.lock();
        if !valid() {
            return Err(CheckedInstallError::Invalid);
        }
        let cur = e.load(Ordering::Relaxed);
        if cur != 0 {
            return Err(CheckedInstallError::Taken(Pte(cur)));
        }
        e.store(pte.0, Ordering::Release);
        t.used_add_locked(1);
        Ok(())
    }

    /// Under the PTE table's lock, replaces the entry for `va` with
    /// `f(current)` when that is `Some`. Returns the new entry, or `None`
    /// if nothing changed (including when no table exists).
    pub fn update(&self, va: u64, g: &Guard, f: impl FnOnce(Pte) -> Option<Pte>) -> Option<Pte> {
        let t = self.pte_table(va, Make::No, g)?;
        let e = &t.entries[index(va, 0)];
        let _l = t.lock.lock();
        let old = e.load(Ordering::Relaxed);
        let new = f(Pte(old))?;
        e.store(new.0, Ordering::Release);
        match (old != 0, new.0 != 0) {
            (false, true) => t.used_add_locked(1),
            (true, false) => t.used_add_locked(-1),
            _ => {}
        }
        Some(new)
    }

    /// Visits every existing PTE table overlapping `r`, with the part of
    /// `r` it covers.
    fn for_each_table<'g>(&'g self, r: Range, g: &'g Guard, mut f: impl FnMut(&'g Table, Range)) {
        let end = r.end.min(1 << VA_BITS);
        let mut va = r.start;
        while va < end {
            // Walk down; an empty entry at `level` lets us skip its span.
            let mut t: &Table = &self.root;
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
    /// calls `f(va, old)` for it.
    pub fn zap_range(&self, r: Range, g: &Guard, mut f: impl FnMut(u64, Pte)) {
        self.for_each_table(r, g, |t, part| {
            let _l = t.lock.lock();
            let mut va = part.start;
            while va < part.end {
                let e = &t.entries[index(va, 0)];
                let old = e.load(Ordering::Relaxed);
                if old != 0 {
                    e.store(0, Ordering::Release);
                    t.used_add_locked(-1);
                    f(va, Pte(old));
                }
                va += PAGE_SIZE;
            }
        });
    }

    /// Rewrites every present entry in `r` to `f(va, old)`.
    pub fn change_range(&self, r: Range, g: &Guard, mut f: impl FnMut(u64, Pte) -> Pte) {
        self.for_each_table(r, g, |t, part| {
            let _l = t.lock.lock();
            let mut va = part.start;
            while va < part.end {
                let e = &t.entries[index(va, 0)];
                let old = e.load(Ordering::Relaxed);
                if old != 0 {
                    let new = f(va, Pte(old));
                    if new.0 != old {
                        e.store(new.0, Ordering::Release);
                    }
                }
                va += PAGE_SIZE;
            }
        });
    }

    /// Calls `f(va, pte)` for every present entry in `r` (lock-free
    /// snapshot).
    #[cfg(test)]
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
                off = (off + skip).min(len);
                continue;
            }
            let n = (pmd - src % pmd)
                .min(pmd - dst % pmd)
                .min(len - off)
                .min(max);
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

    /// If no table maps `va` at some level above the PTEs, the bytes from
    /// `va` to the end of that missing table's span.
    fn missing_span(&self, va: u64, g: &Guard) -> Option<u64> {
        if va >> VA_BITS != 0 {
            return Some(PAGE_SIZE);
        }
        let mut t: &Table = &self.root;
        for level in (1..LEVELS).rev() {
            match self.child(&t.entries[index(va, level)], g) {
                Some(c) => t = c,
                None => {
                    let span = entry_span(level);
                    return Some(span - va % span);
                }
            }
        }
        None
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
        // them, so zero means there is nothing to move.
        if src.is_empty() {
            return 0;
        }
        let Some(dst) = self.pte_table(to, Make::Forced, g) else {
            return 0;
        };
        // Only the mmap_lock writer takes two PTE locks at once, so the
        // order between them cannot deadlock.
        let _src_lock = src.lock.lock();
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
        let count = u64::from(table.used.load(Ordering::Acquire));
        if count == 0 {
            // Nothing to move; the empty table is freed with the old range.
            return Some(0);
        }
        let dst_pmd = self.table_at(to, 1, Make::Forced, g)?;
        let de = &dst_pmd.entries[index(to, 1)];
        // Hold the table's lock over the swing and the flush, as Linux
        // holds the PMD locks (nobody else may be changing its entries).
        let _l = table.lock.lock();
        let v = se.load(Ordering::Relaxed);
        de.compare_exchange(0, v, Ordering::AcqRel, Ordering::Acquire)
            .ok()?;
        dst_pmd.used.fetch_add(1, Ordering::Relaxed);
        // A walker that read the old entry keeps using the (live) table,
        // and translates the old addresses to the same frames until the
        // caller's flush: exactly a stale TLB entry.
        se.store(0, Ordering::Release);
        src_pmd.used.fetch_sub(1, Ordering::Relaxed);
        after_extent(Range::new(from, from + entry_span(1)));
        Some(count)
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
        self.free_in(&self.root, LEVELS - 1, 0, r, limits, g);
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
                self.tables
                    .local()
                    .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
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

    /// Table pages in use, the root included.
    pub fn table_pages(&self) -> u64 {
        1 + self
            .tables
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum::<i64>()
            .max(0) as u64
    }

    /// Bytes of table pages in use (4 KiB of entries each, as on x86-64,
    /// plus a small header).
    pub fn table_bytes(&self) -> u64 {
        self.table_pages() * TABLE_BYTES
    }
}

impl Drop for PageTable {
    fn drop(&mut self) {
        self.budget.uncharge(TABLE_BYTES * self.table_pages());
        fn free(t: &Table, level: u32) {
            // An empty table (an idle space's root) has no child to free.
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
        free(&self.root, LEVELS - 1);
    }
}

#[cfg(all(test, not(aspace_loom)))]
mod tests {
    use super::*;
    use crate::addr::PMD_SIZE;

    fn pt() -> PageTable {
        PageTable::new(Reclaimer::deferred())
    }

    #[test]
    fn install_lookup_update_zap() {
        let p = pt();
        let g = p.pin();
        let va = 0x7f00_0000_3000;
        assert_eq!(p.lookup(va, &g), Pte::NONE);
        let e = Pte::new(42, PteFlags::USER | PteFlags::WRITE);
        p.install(va, e, &g).unwrap();
        assert_eq!(p.install(va, Pte::new(1, PteFlags::USER), &g), Err(e));
        assert_eq!(p.lookup(va, &g).pfn(), 42);
        assert!(p.lookup(va, &g).is_writable());
        let ro = p
            .update(va, &g, |old| Some(Pte::new(old.pfn(), PteFlags::USER)))
            .unwrap();
        assert!(!ro.is_writable());
        assert_eq!(p.table_pages(), 4);
        let mut zapped = vec![];
        p.zap_range(Range::new(va - PAGE_SIZE, va + PAGE_SIZE), &g, |a, pte| {
            zapped.push((a, pte.pfn()))
        });
        assert_eq!(zapped, vec![(va, 42)]);
        assert_eq!(p.lookup(va, &g), Pte::NONE);
        p.free_tables(Range::new(0, 1 << 47), &g);
        assert_eq!(p.table_pages(), 1);
    }

    #[test]
    fn free_tables_within_frees_only_tables_inside_the_limits() {
        let p = pt();
        let g = p.pin();
        // Two pages in one PTE table, 2 MiB-aligned table at `base`.
        let base = 0x7f00_0000_0000;
        let (a, b) = (base + PAGE_SIZE, base + 7 * PAGE_SIZE);
        p.install(a, Pte::new(1, PteFlags::USER), &g).unwrap();
        p.install(b, Pte::new(2, PteFlags::USER), &g).unwrap();
        assert_eq!(p.table_pages(), 4);
        p.zap_range(Range::new(b, b + PAGE_SIZE), &g, |_, _| {});
        // The PTE table still maps `a`: nothing is freed however wide the
        // limits.
        p.free_tables_within(Range::new(b, b + PAGE_SIZE), Range::new(0, 1 << 47), &g);
        assert_eq!(p.table_pages(), 4);
        p.zap_range(Range::new(a, a + PAGE_SIZE), &g, |_, _| {});
        // Empty now, but limits that stop short of its 2 MiB span (a VMA
        // below `a` may still use it) keep it.
        let r = Range::new(a, a + PAGE_SIZE);
        p.free_tables_within(r, Range::new(a, 1 << 47), &g);
        assert_eq!(p.table_pages(), 4);
        // Limits covering the whole hole free the PTE, PMD and PUD tables
        // on the path, though the walk visits only `r`.
        p.free_tables_within(r, Range::new(0, 1 << 47), &g);
        assert_eq!(p.table_pages(), 1);
    }

    #[test]
    fn ranges_across_pmd_and_pud_boundaries() {
        let p = pt();
        let g = p.pin();
        let base = (1u64 << 30) - 4 * PAGE_SIZE; // crosses a 1 GiB boundary
        for i in 0..8 {
            p.install(base + i * PAGE_SIZE, Pte::new(i as Pfn, PteFlags::USER), &g)
                .unwrap();
        }
        let mut seen = vec![];
        p.for_each_present(Range::new(0, 1 << 40), &g, |va, pte| {
            seen.push((va, pte.pfn()))
        });
        assert_eq!(seen.len(), 8);
        assert!(seen.windows(2).all(|w| w[0].0 < w[1].0));
        p.change_range(Range::new(base, base + 8 * PAGE_SIZE), &g, |_, pte| {
            Pte::new(pte.pfn(), PteFlags::USER | PteFlags::WRITE)
        });
        assert!(p.lookup(base + 5 * PAGE_SIZE, &g).is_writable());
        // Move across a PMD boundary at both ends.
        let to = 5 * PMD_SIZE - 3 * PAGE_SIZE;
        let mut extents = vec![];
        let st = p.move_range(base, to, 8 * PAGE_SIZE, u64::MAX, &g, |r| extents.push(r));
        assert_eq!(
            (st.entries, st.copied, st.relinked, st.extents),
            (8, 8, 0, 3)
        );
        // Bounded by the source's 1 GiB (and PMD) boundary after 4 pages,
        // then by the destination's PMD boundary after 3 more.
        assert_eq!(
            extents,
            vec![
                Range::new(base, base + 3 * PAGE_SIZE),
                Range::new(base + 3 * PAGE_SIZE, base + 4 * PAGE_SIZE),
                Range::new(base + 4 * PAGE_SIZE, base + 8 * PAGE_SIZE),
            ]
        );
        for i in 0..8 {
            assert_eq!(p.lookup(to + i * PAGE_SIZE, &g).pfn(), i as Pfn);
            assert_eq!(p.lookup(base + i * PAGE_SIZE, &g), Pte::NONE);
        }
        p.free_tables(Range::new(0, 2 * PMD_SIZE), &g);
        p.free_tables(Range::new(1 << 29, 1 << 31), &g);
        let before = p.table_pages();
        p.zap_range(Range::new(to, to + 8 * PAGE_SIZE), &g, |_, _| {});
        p.free_tables(Range::new(0, 1 << 47), &g);
        assert!(before > 1);
        assert_eq!(p.table_pages(), 1);
    }

    #[test]
    fn move_relinks_whole_aligned_pte_tables() {
        let p = pt();
        let g = p.pin();
        let (from, to) = (4 * PMD_SIZE, 64 * PMD_SIZE);
        let n = 2 * 512 + 3;
        for i in 0..n {
            p.install(from + i * PAGE_SIZE, Pte::new(i as Pfn, PteFlags::USER), &g)
                .unwrap();
        }
        let tables = p.table_pages();
        let mut extents = 0;
        let st = p.move_range(from, to, n * PAGE_SIZE, u64::MAX, &g, |_| extents += 1);
        // Two tables swing whole; the 3-page tail is copied.
        assert_eq!(
            (st.entries, st.copied, st.relinked, st.extents),
            (n, 3, 2, 3)
        );
        assert_eq!(extents, 3);
        for i in 0..n {
            assert_eq!(p.lookup(to + i * PAGE_SIZE, &g).pfn(), i as Pfn);
            assert_eq!(p.lookup(from + i * PAGE_SIZE, &g), Pte::NONE);
        }
        // The relinked tables are not copies: only the tail's table is new.
        assert_eq!(p.table_pages(), tables + 1);
        // Extents capped at 64 pages never relink.
        let st = p.move_range(to, from, n * PAGE_SIZE, 64 * PAGE_SIZE, &g, |_| {});
        assert_eq!(
            (st.entries, st.copied, st.relinked, st.extents),
            (n, n, 0, 17)
        );
        // A destination that already has a table falls back to copying.
        let back = p.move_range(from, to, 512 * PAGE_SIZE, u64::MAX, &g, |_| {});
        assert_eq!((back.copied, back.relinked), (512, 0));
        // Holes are skipped: nothing moves, no extent is reported.
        let none = p.move_range(1 << 40, 1 << 41, 1 << 30, u64::MAX, &g, |_| {
            panic!("nothing to move")
        });
        assert_eq!(none, MoveStats::default());
    }

    #[test]
    fn out_of_range_addresses() {
        let p = pt();
        let g = p.pin();
        assert_eq!(p.lookup(1 << 48, &g), Pte::NONE);
        assert_eq!(
            p.install(!0xfff, Pte::new(1, PteFlags::USER), &g),
            Err(Pte::NONE)
        );
        p.zap_range(Range::new(1 << 47, u64::MAX), &g, |_, _| {
            panic!("nothing there")
        });
    }

    #[test]
    fn concurrent_installs_one_winner_per_address() {
        use std::sync::Arc;
        let p = Arc::new(PageTable::new(Reclaimer::epoch()));
        let hs: Vec<_> = (0..4u32)
            .map(|t| {
                let p = p.clone();
                std::thread::spawn(move || {
                    let g = p.pin();
                    let mut wins = 0;
                    for i in 0..2048u64 {
                        if p.install(0x1000_0000 + i * PAGE_SIZE, Pte::new(t, PteFlags::USER), &g)
                            .is_ok()
                        {
                            wins += 1;
                        }
                    }
                    wins
                })
            })
            .collect();
        let wins: u64 = hs.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(wins, 2048);
        // 2048 pages = 4 PTE tables + 1 PMD + 1 PUD + root.
        assert_eq!(p.table_pages(), 7);
    }
}
