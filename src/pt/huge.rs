//! PMD leaves: a PMD entry that maps a 2 MiB page itself (Linux's
//! `pmd_trans_huge`), its install, its lock-free reading and its split
//! into a PTE table of 512 entries.
//!
//! A leaf lives in a PMD table's entry slot, whose lock (the PMD table's
//! `lock`, under which PTE tables are linked and unlinked too) covers
//! every change of it: the install (only into an empty slot), a change of
//! its flags, its zap, its move and its split. Readers load it lock-free
//! with `Acquire`, as they load any upper entry.
//!
//! A split stores, in one `Release` store under the slot lock, a fully
//! built PTE table whose 512 entries translate exactly as the leaf did
//! (its subframes, its flags): a walker holding the old value and one
//! reading the new agree on every address, so a split needs no TLB
//! flush, and it changes no frame reference (each subframe's reference,
//! held by the leaf, is now held by its PTE: see `phys::huge`). The
//! table is charged even past the budget (a split must not fail; Linux
//! deposits its table at the huge fault for the same reason) and made
//! before the lock is taken, since the slot lock is a leaf of the lock
//! order; if the leaf is gone once the lock is held, it is given back.

use super::walk::Make;
use super::{
    entry_span, index, is_leaf, leaf_pte, leaf_word, PageTable, Pte, Table, TABLE_BIT, TABLE_BYTES,
};
use crate::addr::PAGE_SIZE;
use crate::reclaim::Guard;
use crate::sync::counter;
use crate::sync::{AtomicU64, MutexGuard, Ordering};
use core::ptr::NonNull;

/// Bytes one PMD entry maps (2 MiB).
pub const HUGE_SIZE: u64 = entry_span(1);

use super::walk::CheckedInstallError;

impl PageTable {
    /// The PMD table and entry slot covering `va`, if the PMD table
    /// exists (lock-free).
    pub(super) fn pmd_slot<'g>(
        &'g self,
        va: u64,
        g: &'g Guard,
    ) -> Option<(&'g Table, &'g AtomicU64)> {
        let pmd = self.table_at(va, 1, Make::No, g)?;
        Some((pmd, &pmd.entries[index(va, 1)]))
    }

    /// The PMD leaf mapping `va`, if one does (lock-free; with
    /// [`PteFlags::HUGE`](super::PteFlags::HUGE)).
    pub fn huge_at(&self, va: u64, g: &Guard) -> Option<Pte> {
        let (_, e) = self.pmd_slot(va, g)?;
        let v = e.load(Ordering::Acquire);
        is_leaf(v).then(|| leaf_pte(v))
    }

    /// True if no PTE table and no leaf fills the PMD slot of `va` (a
    /// missing PMD table counts as empty): where a huge fault may
    /// install.
    pub fn pmd_none(&self, va: u64, g: &Guard) -> bool {
        self.pmd_slot(va, g)
            .is_none_or(|(_, e)| e.load(Ordering::Acquire) == 0)
    }

    /// Installs the PMD leaf `pte` (a [`Pte`] of the 2 MiB-aligned span's
    /// first frame) for the span holding `va`, making the tables above it
    /// within the budget, if `valid()` holds under the PMD table's lock
    /// and the slot is empty. `Taken` (with what is there: a leaf, or
    /// [`Pte::NONE`] for a PTE table) if it is not.
    pub fn install_huge(
        &self,
        va: u64,
        pte: Pte,
        g: &Guard,
        valid: impl FnOnce() -> bool,
    ) -> Result<(), CheckedInstallError> {
        let pmd = self.table_checked(va, 1, Make::Charged, &|| true, g)?;
        let e = &pmd.entries[index(va, 1)];
        let _l = pmd.lock.lock();
        if !valid() {
            return Err(CheckedInstallError::Invalid);
        }
        let cur = e.load(Ordering::Relaxed);
        if cur != 0 {
            return Err(CheckedInstallError::Taken(if is_leaf(cur) {
                leaf_pte(cur)
            } else {
                Pte::NONE
            }));
        }
        // Release: the frame's contents (cleared) before the entry.
        e.store(leaf_word(pte), Ordering::Release);
        pmd.used.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Under the PMD table's lock, replaces the leaf covering `va` with
    /// `f(leaf)` (a leaf) when that is `Some`. Returns the new leaf, or
    /// `None` if nothing changed (no leaf there any more included).
    pub fn update_huge(
        &self,
        va: u64,
        g: &Guard,
        f: impl FnOnce(Pte) -> Option<Pte>,
    ) -> Option<Pte> {
        let (pmd, e) = self.pmd_slot(va, g)?;
        let _l = pmd.lock.lock();
        let v = e.load(Ordering::Relaxed);
        if !is_leaf(v) {
            return None;
        }
        let new = f(leaf_pte(v))?;
        debug_assert!(new.is_huge());
        e.store(leaf_word(new), Ordering::Release);
        Some(new)
    }

    /// Splits the PMD leaf covering `va`, if there is one, into a PTE
    /// table of the same 512 translations (see the module docs). True if
    /// this call split it.
    pub fn split_huge(&self, va: u64, g: &Guard) -> bool {
        let Some((pmd, e)) = self.pmd_slot(va, g) else {
            return false;
        };
        if !is_leaf(e.load(Ordering::Acquire)) {
            return false;
        }
        let Some((_l, v, new)) = self.lock_leaf(pmd, e) else {
            return false;
        };
        self.split_locked(e, v, new);
        true
    }

    /// Takes the lock of `pmd`, whose slot `e` held a leaf, with a table
    /// for a split made first (see the module docs): the guard, the leaf
    /// word and the table, or `None` (the table given back) if the slot
    /// holds no leaf any more.
    pub(super) fn lock_leaf<'t>(
        &self,
        pmd: &'t Table,
        e: &AtomicU64,
    ) -> Option<(MutexGuard<'t, ()>, u64, NonNull<Table>)> {
        let new = self.alloc_split_table();
        let l = pmd.lock.lock();
        let v = e.load(Ordering::Relaxed);
        if !is_leaf(v) {
            drop(l);
            self.free_unlinked_table(new);
            return None;
        }
        Some((l, v, new))
    }

    /// Splits the leaf `v` in slot `e`, whose PMD table's lock the caller
    /// holds, into `new` (from [`alloc_split_table`](Self::alloc_split_table)).
    pub(super) fn split_locked(&self, e: &AtomicU64, v: u64, new: NonNull<Table>) {
        debug_assert!(is_leaf(v));
        let leaf = leaf_pte(v);
        self.link_split(e, new, |i| leaf.subpage(i as u32));
    }

    /// Fills `new` (from [`alloc_split_table`](Self::alloc_split_table))
    /// with `entry(i)` for each of its 512 entries and links it into the
    /// PMD slot `e`, which held a leaf; the caller holds the slot's lock.
    pub(super) fn link_split(
        &self,
        e: &AtomicU64,
        new: NonNull<Table>,
        entry: impl Fn(usize) -> Pte,
    ) {
        // SAFETY: `new` is ours alone until the store below publishes it.
        let t = unsafe { new.as_ref() };
        let mut used = 0;
        for (i, w) in t.entries.iter().enumerate() {
            let p = entry(i);
            used += u32::from(p != Pte::NONE);
            w.store(p.0, Ordering::Relaxed);
        }
        t.used.store(used, Ordering::Relaxed);
        // Release: the filled table before the entry that points to it.
        // The slot stays used (leaf for table): its holder's count holds.
        e.store(new.as_ptr() as u64 | TABLE_BIT, Ordering::Release);
        self.tables.local().fetch_add(1, counter::Ordering::Relaxed);
        self.splits.local().fetch_add(1, counter::Ordering::Relaxed);
    }

    /// A zeroed table for a split, charged even past the budget, from the
    /// heap if the pool has no frame.
    pub(super) fn alloc_split_table(&self) -> NonNull<Table> {
        self.frames.memory().force_charge(TABLE_BYTES);
        self.frames
            .alloc_table(true)
            .expect("a forced table is a heap page when no frame is free")
    }

    /// Gives back a table from [`alloc_split_table`](Self::alloc_split_table)
    /// that was never linked.
    pub(super) fn free_unlinked_table(&self, t: NonNull<Table>) {
        // SAFETY: never published: nobody else can reach it.
        unsafe { self.frames.free_table(t) };
        self.frames.memory().uncharge(TABLE_BYTES);
    }

    /// Unlinks the PTE table of the 2 MiB span at `start` for a collapse
    /// (khugepaged's and `MADV_COLLAPSE`'s first step, Linux's
    /// `pmdp_collapse_flush`): under the PTE table's lock, `decide` gets
    /// its 512 entries and says whether to go on; if so the PMD slot is
    /// emptied under its lock and the table retired through the epoch.
    /// Returns the old entries, whose frame references are now the
    /// caller's; it flushes their translations, copies the pages and
    /// installs the leaf ([`install_huge`](Self::install_huge)) before
    /// dropping them. `None`: no table there, or `decide` refused.
    ///
    /// The caller keeps every other writer and fault out of the span (the
    /// mmap_lock write side and the VMA write-locked: a fault that finds
    /// the slot empty waits for the mmap_lock, and a speculative fault
    /// still inside the old table fails its stamp check).
    pub fn collapse_unlink(
        &self,
        start: u64,
        g: &Guard,
        decide: impl FnOnce(&[Pte]) -> bool,
    ) -> Option<Vec<Pte>> {
        let (pmd, e) = self.pmd_slot(start, g)?;
        let t = self.child(e, g)?;
        let _pte_lock = t.lock.lock();
        let old: Vec<Pte> = t
            .entries
            .iter()
            .map(|w| Pte(w.load(Ordering::Relaxed)))
            .collect();
        if !decide(&old) {
            return None;
        }
        {
            let _l = pmd.lock.lock();
            e.store(0, Ordering::Release);
            pmd.used.fetch_sub(1, Ordering::Relaxed);
        }
        self.retire_table(NonNull::from(t), g);
        Some(old)
    }

    /// PMD leaves split so far (`thp_split_pmd`).
    pub fn splits(&self) -> u64 {
        self.splits
            .iter()
            .map(|c| c.load(counter::Ordering::Relaxed))
            .sum::<i64>()
            .max(0) as u64
    }

    /// Calls `f(start, leaf)` for every PMD leaf whose 2 MiB span meets
    /// `[start, end)` (lock-free snapshot).
    pub fn for_each_huge(&self, start: u64, end: u64, g: &Guard, mut f: impl FnMut(u64, Pte)) {
        self.for_each_pmd(start, end, g, |va, v| {
            if is_leaf(v) {
                f(va, leaf_pte(v));
            }
        });
    }

    /// Calls `f(start)` for every 2 MiB span meeting `[start, end)` whose
    /// PMD slot is filled (a PTE table or a leaf: where
    /// [`pmd_none`](Self::pmd_none) is false), lock-free.
    pub fn for_each_filled_pmd(&self, start: u64, end: u64, g: &Guard, mut f: impl FnMut(u64)) {
        self.for_each_pmd(start, end, g, |va, v| {
            if v != 0 {
                f(va);
            }
        });
    }

    /// Calls `f(start, entry)` with the PMD entry of every 2 MiB span
    /// meeting `[start, end)` that a PMD table holds, stepping over a
    /// missing upper table's whole span at once (so an empty terabyte
    /// costs a few walks, not one per 2 MiB).
    fn for_each_pmd(&self, start: u64, end: u64, g: &Guard, mut f: impl FnMut(u64, u64)) {
        let mut va = start & !(HUGE_SIZE - 1);
        while va < end {
            match self.pmd_slot(va, g) {
                Some((_, e)) => {
                    f(va, e.load(Ordering::Acquire));
                    va = va.saturating_add(HUGE_SIZE);
                }
                None => match self.missing_span(va, g) {
                    Some(skip) => va = va.saturating_add(skip.max(PAGE_SIZE)),
                    None => va = va.saturating_add(HUGE_SIZE),
                },
            }
        }
    }
}
