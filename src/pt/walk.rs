//! Walking the table tree: finding (or creating, within the budget) the
//! table covering an address, and reading, installing and updating one
//! entry.

use super::{
    entry_span, index, is_leaf, is_table, leaf_pte, PageTable, Pte, Table, LEVELS, ROOT_STRIPES,
    TABLE_BIT, TABLE_BYTES, VA_BITS,
};
use crate::reclaim::Guard;
use crate::sync::counter;
use crate::sync::{AtomicU64, MutexGuard, Ordering};

/// Why [`PteSlot::install_checked`] or [`PageTable::install_checked_in`]
/// installed nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckedInstallError {
    /// No PTE table covers the address (none may be created, or the
    /// budget has no room for one).
    NoTable,
    /// The entry already holds this value.
    Taken(Pte),
    /// The caller's check failed under a table's lock.
    Invalid,
}

/// One entry of a PTE table, found by [`PageTable::slot_checked`]. The
/// table stays readable (and its lock usable) while the guard of the walk
/// is held, even if it is unlinked meanwhile: a caller that may race an
/// unlink validates under the lock that its view is still current.
pub struct PteSlot<'g> {
    table: &'g Table,
    entry: &'g AtomicU64,
}

impl PteSlot<'_> {
    /// The entry now (`Acquire`: a present entry's frame is initialized).
    pub fn get(&self) -> Pte {
        Pte(self.entry.load(Ordering::Acquire))
    }

    /// Installs `pte` if `valid()` holds when run under the table's lock
    /// and the entry is empty. The speculative fault validates its VMA
    /// snapshot in `valid`: a writer that changes the VMA stamps it first
    /// and then takes this same lock, so the check either sees the stamp
    /// or comes before the writer's pass over the table.
    pub fn install_checked(
        &self,
        pte: Pte,
        valid: impl FnOnce() -> bool,
    ) -> Result<(), CheckedInstallError> {
        let _l = self.table.lock.lock();
        if !valid() {
            return Err(CheckedInstallError::Invalid);
        }
        let cur = self.entry.load(Ordering::Relaxed);
        if cur != 0 {
            return Err(CheckedInstallError::Taken(Pte(cur)));
        }
        self.entry.store(pte.0, Ordering::Release);
        self.table.used_add_locked(1);
        Ok(())
    }
}

/// A walk's error with a PMD leaf it met turned into the 4 KiB view of
/// the page of `va` inside it (what the entry for `va` holds).
fn subpage_of(e: CheckedInstallError, va: u64) -> CheckedInstallError {
    match e {
        CheckedInstallError::Taken(leaf) if leaf.is_huge() => {
            CheckedInstallError::Taken(leaf.subpage(index(va, 0) as u32))
        }
        e => e,
    }
}

/// Whether a walk creates missing tables, and how it pays for them.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Make {
    /// Create nothing.
    No,
    /// Create tables within the budget; stop where it is spent.
    Charged,
    /// Create tables even past the budget (heap pages if the pool has no
    /// frame free): for moves whose source tables are freed right after
    /// (mremap), so the overshoot is transient.
    Forced,
}
/// Error from [`PageTable::install`]: the entry already held something, or
/// the address cannot be translated (`Pte::NONE`).
pub type InstallError = Pte;
impl PageTable {
    /// The table an upper-level entry points to, if any (`None` for an
    /// empty entry and for a PMD leaf).
    #[inline]
    pub(super) fn child<'g>(&'g self, e: &AtomicU64, _g: &'g Guard) -> Option<&'g Table> {
        let v = e.load(Ordering::Acquire);
        if !is_table(v) {
            return None;
        }
        // SAFETY: a non-zero upper entry holds a table page's address from
        // `alloc_table` (low bit set), published with Release after
        // initialization. The page is freed only through the reclaimer
        // after being unlinked, and the guard `_g` keeps it alive.
        Some(unsafe { &*((v & !TABLE_BIT) as *const Table) })
    }

    /// The PTE table covering `va`, creating missing tables if `create`.
    #[inline]
    pub(super) fn pte_table<'g>(
        &'g self,
        va: u64,
        create: Make,
        g: &'g Guard,
    ) -> Option<&'g Table> {
        self.table_at(va, 0, create, g)
    }

    /// The table at `level` (0: PTE table, 1: PMD table, ...) covering
    /// `va`, creating missing tables above it as `create` says. `None` if
    /// a table is missing and may not be created.
    pub(super) fn table_at<'g>(
        &'g self,
        va: u64,
        level: u32,
        create: Make,
        g: &'g Guard,
    ) -> Option<&'g Table> {
        self.table_checked(va, level, create, &|| true, g).ok()
    }

    /// [`table_at`](Self::table_at), linking each missing table only if
    /// `valid()` holds under the lock of the table that will hold it
    /// (`Invalid` if not; `NoTable` if a table is missing and may not be
    /// made; `Taken(leaf)` if a PMD leaf maps the span instead of a PTE
    /// table).
    pub(super) fn table_checked<'g>(
        &'g self,
        va: u64,
        level: u32,
        create: Make,
        valid: &dyn Fn() -> bool,
        g: &'g Guard,
    ) -> Result<&'g Table, CheckedInstallError> {
        if va >> VA_BITS != 0 {
            return Err(CheckedInstallError::NoTable);
        }
        let mut t = match self.child(&self.root, g) {
            Some(root) => root,
            None if create == Make::No => return Err(CheckedInstallError::NoTable),
            None => self.make_table(&self.root, None, create, valid, g)?,
        };
        for level in (level + 1..LEVELS).rev() {
            let e = &t.entries[index(va, level)];
            t = match self.child(e, g) {
                Some(c) => c,
                None if create == Make::No => return Err(CheckedInstallError::NoTable),
                None => {
                    let v = e.load(Ordering::Acquire);
                    if is_leaf(v) {
                        return Err(CheckedInstallError::Taken(leaf_pte(v)));
                    }
                    // Mutation the loom model
                    // `spec_fault_without_upper_tables_vs_munmap` catches:
                    // `level - 1` for `level` (a root slot linked under the
                    // root table's own lock, not the slot's stripe).
                    self.make_table(e, Some((t, level, va)), create, valid, g)?
                }
            };
        }
        Ok(t)
    }

    /// The lock under which an entry slot of `holder` goes from empty to a
    /// table and back: `level` is the level of `holder`'s entries and `va`
    /// an address in the slot (see [`slot_lock`](Self::slot_lock)). For
    /// the root slot (`None`), the lock a sweep reads it empty under: the
    /// stripe of `va`'s root table slot.
    pub(super) fn holder_lock<'a>(
        &'a self,
        holder: Option<&'a Table>,
        level: u32,
        va: u64,
    ) -> MutexGuard<'a, ()> {
        match holder {
            Some(t) => self.slot_lock(t, level, index(va, level)),
            // The root slot, read empty by a sweep: the stripe of `va`'s
            // root table slot, the lock the first link below the root in
            // that slot takes (`make_table`), so that sweeps in a space
            // with no root yet (a writers-only one) share no lock either.
            // Mutation the loom model `spec_fault_without_root_vs_munmap`
            // catches: `index(va, LEVELS - 1) + 1` (the sweep then misses
            // the link of the tables below a root made after it).
            None => self.root_slots[index(va, LEVELS - 1) % ROOT_STRIPES].lock(),
        }
    }

    /// The lock of slot `i` of `t`, a table above level 0 whose entries
    /// are at `level`: the table's own lock, except in the root table,
    /// whose slots (512 GiB each) take striped locks of their own, so
    /// that linking, unlinking and sweeping in one slot neither waits for
    /// nor writes the line of another's. Nothing holds all of a table's
    /// slots at once, so a lock per slot keeps every rule a table's lock
    /// kept (each is about one slot).
    pub(super) fn slot_lock<'a>(
        &'a self,
        t: &'a Table,
        level: u32,
        i: usize,
    ) -> MutexGuard<'a, ()> {
        if level == LEVELS - 1 {
            self.root_slots[i % ROOT_STRIPES].lock()
        } else {
            t.lock.lock()
        }
    }

    /// Creates the table entry `e` (of `parent`, or the root slot) points
    /// to, charging it as `create` says, and links it under the slot's
    /// lock if `valid()` holds there (`parent` is the holding table, the
    /// level of its entries and an address in the slot); if another walker linked one first,
    /// frees ours and returns theirs. `NoTable` if the budget refuses or
    /// the pool has no frame (a forced table then is a heap page).
    ///
    /// The link is made under the lock, not by a lock-free
    /// compare-and-swap, so that a writer's sweep that found `e` empty
    /// under the same lock (`PageTable::sweep`) is ordered before it.
    #[cold]
    fn make_table<'g>(
        &'g self,
        e: &AtomicU64,
        parent: Option<(&Table, u32, u64)>,
        create: Make,
        valid: &dyn Fn() -> bool,
        g: &'g Guard,
    ) -> Result<&'g Table, CheckedInstallError> {
        let budget = self.frames.memory();
        let forced = create == Make::Forced;
        if forced {
            budget.force_charge(TABLE_BYTES);
        } else if !budget.try_charge(TABLE_BYTES) {
            return Err(CheckedInstallError::NoTable);
        }
        let Some(new) = self.frames.alloc_table(forced) else {
            budget.uncharge(TABLE_BYTES);
            return Err(CheckedInstallError::NoTable);
        };
        let l = match parent {
            Some((t, level, va)) => self.holder_lock(Some(t), level, va),
            // The root: under one lock for every linker (they agree on
            // one root), the first stripe. It need not be the stripe a
            // sweep that found no root held: linking an empty root orders
            // nothing, and the first link below it, into its slot `i`, is
            // made under slot `i`'s stripe, which that sweep held.
            None => self.root_slots[0].lock(),
        };
        let cur = e.load(Ordering::Relaxed);
        let linked = if is_leaf(cur) {
            // A huge fault filled the slot with a 2 MiB page.
            Err(CheckedInstallError::Taken(leaf_pte(cur)))
        } else if cur != 0 {
            Ok(false)
        } else if !valid() {
            Err(CheckedInstallError::Invalid)
        } else {
            // Release: the zeroed table is visible to any walker that
            // loads the entry with Acquire (`child`).
            e.store(new.as_ptr() as u64 | TABLE_BIT, Ordering::Release);
            if let Some((p, ..)) = parent {
                p.used.fetch_add(1, Ordering::Relaxed);
            }
            Ok(true)
        };
        drop(l);
        if linked == Ok(true) {
            self.tables.local().fetch_add(1, counter::Ordering::Relaxed);
            // SAFETY: we just published `new`; see `child`.
            return Ok(unsafe { new.as_ref() });
        }
        // SAFETY: `new` was never published; it is ours alone.
        unsafe { self.frames.free_table(new) };
        budget.uncharge(TABLE_BYTES);
        linked?;
        // The entry was filled under the lock we held: its table is
        // initialized for us (the lock ordered its link before our load).
        Ok(self.child(e, g).expect("the winner's table is there"))
    }

    /// The entry for `va` (lock-free); `Pte::NONE` if absent or `va` is
    /// outside the 48-bit space. Inside a PMD leaf, the 4 KiB view of its
    /// page ([`Pte::subpage`]).
    #[inline]
    pub fn lookup(&self, va: u64, g: &Guard) -> Pte {
        let p = self.lookup_entry(va, g);
        if p.is_huge() {
            p.subpage(index(va, 0) as u32)
        } else {
            p
        }
    }

    /// The entry that maps `va` (lock-free), as it is: a PTE, or the PMD
    /// leaf whose 2 MiB hold `va` (with [`PteFlags::HUGE`](super::PteFlags::HUGE)
    /// and its first frame), for a reader that caches a leaf as one
    /// translation (a translator); `Pte::NONE` if absent.
    #[inline]
    pub fn lookup_entry(&self, va: u64, g: &Guard) -> Pte {
        let Some(pmd) = self.table_at(va, 1, Make::No, g) else {
            return Pte::NONE;
        };
        let e = &pmd.entries[index(va, 1)];
        let v = e.load(Ordering::Acquire);
        if is_table(v) {
            // SAFETY: as in `child` (the guard `g` keeps the table alive).
            let t = unsafe { &*((v & !TABLE_BIT) as *const Table) };
            Pte(t.entries[index(va, 0)].load(Ordering::Acquire))
        } else if v != 0 {
            leaf_pte(v)
        } else {
            Pte::NONE
        }
    }

    /// Installs `pte` for `va` if its entry is empty, creating tables as
    /// needed. `Err(existing)` if the entry is taken (a PMD leaf's 4 KiB
    /// view where one maps `va`), `Err(Pte::NONE)` if `va` cannot be
    /// translated or a missing table would pass the budget.
    pub fn install(&self, va: u64, pte: Pte, g: &Guard) -> Result<(), InstallError> {
        let t = match self.table_checked(va, 0, Make::Charged, &|| true, g) {
            Ok(t) => t,
            Err(CheckedInstallError::Taken(leaf)) => {
                return Err(leaf.subpage(index(va, 0) as u32));
            }
            Err(_) => return Err(Pte::NONE),
        };
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

    /// The entry for `va`, making the missing tables on the way within
    /// the budget, each linked only if `valid()` holds under the lock of
    /// the table that will hold it (the speculative fault validates its
    /// VMA snapshot there, as it does again under the PTE table's lock).
    pub fn slot_checked<'g>(
        &'g self,
        va: u64,
        g: &'g Guard,
        valid: &dyn Fn() -> bool,
    ) -> Result<PteSlot<'g>, CheckedInstallError> {
        let table = self
            .table_checked(va, 0, Make::Charged, valid, g)
            .map_err(|e| subpage_of(e, va))?;
        Ok(PteSlot {
            table,
            entry: &table.entries[index(va, 0)],
        })
    }

    /// The entry for `va`, creating missing tables as `create` says.
    fn slot_in<'g>(
        &'g self,
        va: u64,
        create: Make,
        g: &'g Guard,
    ) -> Result<PteSlot<'g>, CheckedInstallError> {
        let table = self
            .table_checked(va, 0, create, &|| true, g)
            .map_err(|e| subpage_of(e, va))?;
        Ok(PteSlot {
            table,
            entry: &table.entries[index(va, 0)],
        })
    }

    /// Installs `pte` for `va` as [`PteSlot::install_checked`] does,
    /// after one walk that, with `make_table`, makes the PTE table if none
    /// covers `va` (`NoTable`: no table, or no memory for one). An object
    /// fault re-checks the object's end in `valid` (`vma::mappings`).
    pub fn install_checked_in(
        &self,
        va: u64,
        pte: Pte,
        g: &Guard,
        make_table: bool,
        valid: impl FnOnce() -> bool,
    ) -> Result<(), CheckedInstallError> {
        let make = if make_table { Make::Charged } else { Make::No };
        self.slot_in(va, make, g)?.install_checked(pte, valid)
    }

    /// Under the PTE table's lock, replaces the entry for `va` with
    /// `f(current)` when that is `Some`. Returns the new entry, or `None`
    /// if nothing changed (including when no table exists). Inside a PMD
    /// leaf, `f` gets the page's 4 KiB view under the PMD table's lock,
    /// and the leaf is split only if `f` changes it (a 4 KiB change of a
    /// 2 MiB page, stored in the split's table under the same hold).
    pub fn update(&self, va: u64, g: &Guard, f: impl FnOnce(Pte) -> Option<Pte>) -> Option<Pte> {
        let Some(t) = self.pte_table(va, Make::No, g) else {
            return self.update_in_leaf(va, g, f);
        };
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

    /// [`update`](Self::update) where no PTE table covers `va`: a PMD
    /// leaf's page (see there), or nothing. The split's table is made
    /// before the PMD lock is taken (the lock order) and given back when
    /// `f` changes nothing.
    fn update_in_leaf(
        &self,
        va: u64,
        g: &Guard,
        f: impl FnOnce(Pte) -> Option<Pte>,
    ) -> Option<Pte> {
        let (pmd, e) = self.pmd_slot(va, g)?;
        if !is_leaf(e.load(Ordering::Acquire)) {
            // Split or linked since the walk: a table's entry now (or
            // nothing at all).
            self.pte_table(va, Make::No, g)?;
            return self.update(va, g, f);
        }
        let Some((l, v, table)) = self.lock_leaf(pmd, e) else {
            // Split or zapped since: `f` not called yet, so look again.
            return self.update(va, g, f);
        };
        let leaf = leaf_pte(v);
        let i = index(va, 0);
        let cur = leaf.subpage(i as u32);
        let new = f(cur);
        match new {
            Some(new) if new != cur => {
                self.link_split(
                    e,
                    table,
                    |j| if j == i { new } else { leaf.subpage(j as u32) },
                );
                drop(l);
            }
            _ => {
                drop(l);
                self.free_unlinked_table(table);
            }
        }
        new
    }

    /// If no table maps `va` at some level above the PTEs, the bytes from
    /// `va` to the end of that missing table's span; past the 48 bits the
    /// table addresses, the bytes to the top of the address space (2^64,
    /// so callers add it saturating): nothing is mapped there, and a loop
    /// that stepped a page at a time there never ended.
    pub(super) fn missing_span(&self, va: u64, g: &Guard) -> Option<u64> {
        if va >> VA_BITS != 0 {
            return Some(0u64.wrapping_sub(va));
        }
        let Some(mut t) = self.child(&self.root, g) else {
            // No root: nothing is mapped anywhere above `va`.
            return Some(entry_span(LEVELS) - va);
        };
        for level in (1..LEVELS).rev() {
            let e = &t.entries[index(va, level)];
            match self.child(e, g) {
                Some(c) => t = c,
                // A PMD leaf maps the span: nothing is missing.
                None if level == 1 && is_leaf(e.load(Ordering::Acquire)) => return None,
                None => {
                    let span = entry_span(level);
                    return Some(span - va % span);
                }
            }
        }
        None
    }
}
