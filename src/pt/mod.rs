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
//! An empty page table has no table at all: the root is made by the first
//! walk that creates a table, installed by the same compare-and-swap as
//! any upper-level entry, and then lives as long as the page table. Walks
//! that create nothing (lookups, zaps, copies from it, frees) find no root
//! and see an empty table.
//!
//! Table pages are freed only through the [`Reclaimer`], and only where
//! the caller guarantees no VMA covers their span, so a lock-free walker
//! that is still inside one never touches freed memory. mremap may move a
//! whole PTE table to another PMD entry ([`PageTable::move_range`]): a
//! walker that reached it through the old entry keeps reading a live table.
//!
//! One mechanism per file: `entry` (the entry format), `walk` (finding or
//! creating a table, one entry's lookup, install and update), `range`
//! (zap, change and iteration over a range), `moves` (mremap's
//! `move_page_tables`), `copy` (fork's `copy_page_range`), `free` (freeing
//! table pages).
//!
//! # Locking
//!
//! The PTE-table locks are level 5 of the crate's [lock
//! order](crate::mm#locking): taken under the mmap_lock or a VMA lock,
//! never the other way round, and two at once only by the mmap_lock writer
//! (mremap's move: source then destination) or by fork (the parent's
//! table, then the child's unpublished one). Under a PTE lock the callers
//! take only the frame allocator's locks and the TLB flush lock. Each
//! field below says what protects it.

use crate::addr::{PAGE_SHIFT, PAGE_SIZE};
use crate::percpu::PerCpu;
use crate::phys::Budget;
use crate::reclaim::{Guard, Reclaimer};
use crate::sync::counter::AtomicI64;
use crate::sync::{Arc, AtomicU32, AtomicU64, Mutex, Ordering};

mod copy;
mod entry;
mod free;
mod moves;
mod range;
mod walk;

pub use entry::{Pte, PteFlags};
pub use walk::CheckedInstallError;

/// Entries per table.
const ENTRIES: usize = 512;
/// Levels below the root: the root is level 3, PTE tables level 0.
const LEVELS: u32 = 4;
/// Bits of virtual address translated (48).
const VA_BITS: u32 = PAGE_SHIFT + 9 * LEVELS;
/// Marks an upper-level entry as pointing to a table.
const TABLE_BIT: u64 = 1;

/// One table page. The lock is used only at level 0. `used` counts
/// non-empty entries, so emptiness needs no scan.
///
/// The header is aligned to 128 bytes (a cache line and its prefetch
/// pair), so two tables' headers never share a line: faults of two
/// threads in PTE tables of their own write disjoint lines.
#[repr(align(128))]
struct Table {
    /// The 512 entries ([`Pte`] values at level 0; at upper levels a child
    /// table's address with [`TABLE_BIT`], or 0).
    ///
    /// Protected by: at level 0, `lock` for every change (stored with
    /// `Release`); read lock-free with `Acquire` under an epoch guard. At
    /// upper levels, filled once by a compare-and-swap (`AcqRel`) of any
    /// walker; emptied (`swap`, `AcqRel`) only by the mmap_lock writer
    /// where no VMA covers the span, or swung by mremap under the moved
    /// table's `lock`; the child is freed through the epoch.
    entries: Box<[AtomicU64]>,
    /// Non-empty entries.
    ///
    /// Protected by: at level 0, `lock` (plain load and store, `Relaxed`;
    /// see [`Table::used_add_locked`]); at upper levels, atomic `Relaxed`
    /// read-modify-writes by the installing walker and the unlinking
    /// writer. Read with `Acquire` only to compare with zero.
    used: AtomicU32,
    /// The split PTE lock (level 0 only; unused above).
    ///
    /// Protected by: immutable after creation (it is the lock).
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

/// Bytes one table costs here: its 512 entries (a real x86-64 table page
/// is exactly these 4 KiB) plus the header with its lock and count.
pub const TABLE_BYTES: u64 = PAGE_SIZE + core::mem::size_of::<Table>() as u64;

/// Span of one entry at `level` (level 0: a page).
const fn entry_span(level: u32) -> u64 {
    1 << (PAGE_SHIFT + 9 * level)
}

fn index(va: u64, level: u32) -> usize {
    ((va >> (PAGE_SHIFT + 9 * level)) as usize) & (ENTRIES - 1)
}

/// A 4-level page table.
pub struct PageTable {
    /// The top-level table, as an upper-level entry (the table's address
    /// with [`TABLE_BIT`], or 0): made by the first walk that creates a
    /// table, so an idle address space allocates no table at all. Never
    /// freed before the page table.
    ///
    /// Protected by: filled once, like any upper-level entry, by a
    /// compare-and-swap of the first creating walker (`Release` publishes
    /// the zeroed table; walkers load it with `Acquire`); the loser frees
    /// its table. Never emptied until drop (its contents: see `Table`'s
    /// fields).
    root: AtomicU64,
    /// Where unlinked table pages wait for the walkers that may still see
    /// them.
    ///
    /// Protected by: immutable after creation.
    reclaimer: Reclaimer,
    /// Table pages, the root included, per CPU (a slot may go negative;
    /// the sum counts).
    ///
    /// Protected by: statistics atomics (`sync::counter`, `Relaxed`).
    tables: PerCpu<AtomicI64>,
    /// The memory budget table pages are charged to.
    ///
    /// Protected by: immutable after creation (the budget is atomics, see
    /// [`Budget`]).
    budget: Arc<Budget>,
}

// SAFETY: tables are reached through atomic entries and freed only through
// the reclaimer; entry changes at level 0 happen under the table's lock.
unsafe impl Send for PageTable {}
// SAFETY: as for Send.
unsafe impl Sync for PageTable {}

impl PageTable {
    /// An empty page table whose table pages are retired through
    /// `reclaimer`, with no limit on its tables.
    #[cfg(any(test, aspace_loom))]
    pub fn new(reclaimer: Reclaimer) -> Self {
        Self::with_budget(reclaimer, Arc::new(Budget::unlimited()))
    }

    /// An empty page table whose table pages (the root included) are
    /// charged to `budget`. Allocates nothing: the root is made, and
    /// charged like any table, by the first walk that creates a table.
    pub fn with_budget(reclaimer: Reclaimer, budget: Arc<Budget>) -> Self {
        PageTable {
            root: AtomicU64::new(0),
            reclaimer,
            tables: PerCpu::new(|| AtomicI64::new(0)),
            budget,
        }
    }

    /// Pins the reclaimer: walks are safe while the guard lives.
    pub fn pin(&self) -> Guard {
        self.reclaimer.pin()
    }

    /// Table pages in use, the root included (none before the first table
    /// is made; the root stays from then on).
    pub fn table_pages(&self) -> u64 {
        self.tables
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

#[cfg(all(test, not(aspace_loom)))]
mod tests;
