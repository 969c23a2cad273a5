//! A simulated x86-64 4-level page table.
//!
//! Tables are frames of the address space's frame pool, each 512 atomic
//! 64-bit entries (a real x86-64 table page), taken from the same per-CPU
//! caches as data frames: making a table on the fault path costs no heap
//! allocation, and tables use the budget's own memory. Walkers (faults,
//! user-mode accesses) read entries lock-free with `Acquire`. Each table has
//! its own lock. At level 0 it is Linux's split PTE lock: installs,
//! updates, zaps and moves of entries take it; lookups never do. Above,
//! it is the lock of the table's entry slots (the root table's 512 GiB
//! slots have striped locks of their own, `root_slots`, so that writers
//! and faults in different slots, as range-locked writers in their own
//! windows are, share no lock: `PageTable::slot_lock`; a sweep reads the
//! root slot empty under the stripe of the root table slot it would
//! reach, which the first link below a root made later takes): a missing
//! table is linked
//! (`Release`) and an empty one unlinked only under its slot's lock, so
//! two faults racing on one region agree on one table (the loser frees
//! its own), and a writer's sweep that finds a slot empty under that lock
//! is ordered before any table linked there later (`PageTable::sweep`,
//! the speculative fault's rule: see `mm::spec_fault`).
//!
//! Every table page is charged to the pool's budget while it is linked:
//! a fault that would need a table past the budget gets no table
//! (`install` fails) instead of growing the host without bound.
//!
//! An empty page table has no table at all: the root is made by the first
//! walk that creates a table, installed by the same compare-and-swap as
//! any upper-level entry, and then lives as long as the page table. Walks
//! that create nothing (lookups, zaps, copies from it, frees) find no root
//! and see an empty table.
//!
//! Table pages are freed only through the [`Reclaimer`], and only where
//! the caller guarantees no VMA covers their span: a page goes back to the
//! pool (and may become a data frame or another table) only once the
//! walkers that might still be inside it are gone. mremap may move a
//! whole PTE table to another PMD entry ([`PageTable::move_range`]): a
//! walker that reached it through the old entry keeps reading a live table.
//!
//! A PMD entry may instead be a leaf mapping 2 MiB (a transparent huge
//! page; `huge`): stored without the table bit, installed, changed and
//! split into a PTE table under the PMD table's lock (the same slot lock
//! tables are linked under). Every walker meets it: lookups return the
//! 4 KiB view of the page inside it, range passes zap or change it
//! whole where they cover its 2 MiB and split it first where they cover
//! part, moves relink it where both ends are 2 MiB-aligned, fork copies
//! it whole, and frees skip it. A split replaces the leaf with a full
//! table of the same translations in one `Release` store: a lock-free
//! walker sees either, and both translate every address alike.
//!
//! One mechanism per file: `entry` (the entry format), `huge` (PMD
//! leaves), `walk` (finding or
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
use crate::phys::FrameAllocator;
use crate::reclaim::{Guard, Reclaimer};
use crate::sync::counter::AtomicI64;
use crate::sync::{Arc, AtomicU64, Mutex, Ordering};
use crossbeam_utils::CachePadded;

mod copy;
mod entry;
mod free;
mod huge;
mod moves;
mod range;
mod walk;

pub use entry::{Pte, PteFlags};
pub use huge::HUGE_SIZE;
pub use walk::CheckedInstallError;

/// Entries per table.
const ENTRIES: usize = 512;
/// Levels below the root: the root is level 3, PTE tables level 0.
const LEVELS: u32 = 4;
/// Bits of virtual address translated (48).
const VA_BITS: u32 = PAGE_SHIFT + 9 * LEVELS;
/// Striped locks of the root table's slots (see `PageTable::slot_lock`):
/// neighbouring 512 GiB slots never share one. Four under loom, so that
/// in its models a slot's stripe, the next slot's and the root link's
/// (the first) are three different locks.
const ROOT_STRIPES: usize = if cfg!(aspace_loom) { 4 } else { 16 };
/// Marks an upper-level entry as pointing to a table.
const TABLE_BIT: u64 = 1;

/// True if the upper-level entry word `v` points to a table.
#[inline]
const fn is_table(v: u64) -> bool {
    v & TABLE_BIT != 0
}

/// True if the PMD entry word `v` is a leaf (a 2 MiB page): it is stored
/// as its [`Pte`] without the present bit, which would read as
/// [`TABLE_BIT`], and with [`PteFlags::HUGE`], so it is never 0.
#[inline]
const fn is_leaf(v: u64) -> bool {
    v != 0 && !is_table(v)
}

/// The PMD leaf a leaf word holds.
#[inline]
const fn leaf_pte(v: u64) -> Pte {
    Pte(v | PteFlags::PRESENT.bits())
}

/// The word a PMD leaf is stored as (see [`is_leaf`]).
#[inline]
const fn leaf_word(p: Pte) -> u64 {
    (p.0 | PteFlags::HUGE.bits()) & !PteFlags::PRESENT.bits()
}

// One table page: a frame from the frame pool whose 512 words are the
// entries, with its count of non-empty entries (`used`, so emptiness needs
// no scan) and its split PTE lock (`lock`, level 0 only) in the frame's
// per-frame fields. What protects each is said at `phys::TablePage`.
use crate::phys::TablePage as Table;

impl Table {
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

/// Bytes one table costs: its frame (a real x86-64 table page is exactly
/// these 4 KiB of entries). Its lock and count are per-frame fields that
/// every frame has.
pub const TABLE_BYTES: u64 = PAGE_SIZE;

/// Span of one entry of the root table (512 GiB): the largest table page
/// that freeing ([`PageTable::free_tables_within`]) unlinks covers this
/// much, aligned; the root itself is never freed. So freeing the tables of
/// a range `r` touches nothing outside `r` rounded out to this alignment.
pub(crate) const ROOT_ENTRY_SPAN: u64 = entry_span(LEVELS - 1);

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
    /// Protected by: the first stripe of `root_slots`, under which the
    /// first creating walker fills it once (a sweep that finds it empty
    /// holds the stripe of its root table slot instead: see
    /// `holder_lock`), like any upper-level entry (`Release` publishes the
    /// zeroed table; walkers load it with `Acquire`); a walker that finds
    /// it filled under the lock frees its own table. Never emptied until
    /// drop (its contents: see `Table`'s fields).
    root: AtomicU64,
    /// The locks of the root table's slots, slot `i` taking stripe
    /// `i % ROOT_STRIPES`, each on a line of its own: the root table's
    /// own lock is never taken. They stand for the root slot's lock too:
    /// a sweep that finds no root takes the stripe of the root table slot
    /// its range lies in, and the root is linked under the first.
    ///
    /// Protected by: immutable (they are the locks).
    root_slots: [CachePadded<Mutex<()>>; ROOT_STRIPES],
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
    /// PMD leaves split into PTE tables, per CPU (`thp_split_pmd`).
    ///
    /// Protected by: statistics atomics (`sync::counter`, `Relaxed`).
    splits: PerCpu<AtomicI64>,
    /// The frame pool table pages come from, and whose budget they are
    /// charged to.
    ///
    /// Protected by: immutable after creation (the pool's own rules: see
    /// [`FrameAllocator`]).
    frames: Arc<FrameAllocator>,
}

// SAFETY: tables are reached through atomic entries and freed only through
// the reclaimer; entry changes at level 0 happen under the table's lock.
unsafe impl Send for PageTable {}
// SAFETY: as for Send.
unsafe impl Sync for PageTable {}

impl PageTable {
    /// An empty page table whose table pages are retired through
    /// `reclaimer`, on a frame pool of its own (1 GiB; 1 MiB under loom,
    /// where tables are heap pages charged to it).
    #[cfg(any(test, aspace_loom))]
    pub fn new(reclaimer: Reclaimer) -> Self {
        let bytes = if cfg!(aspace_loom) { 1 << 20 } else { 1 << 30 };
        Self::with_frames(reclaimer, Arc::new(FrameAllocator::new(bytes, false)))
    }

    /// An empty page table whose table pages (the root included) are
    /// frames of `frames`, charged to its budget. Allocates nothing: the
    /// root is made, and charged like any table, by the first walk that
    /// creates a table.
    pub fn with_frames(reclaimer: Reclaimer, frames: Arc<FrameAllocator>) -> Self {
        PageTable {
            root: AtomicU64::new(0),
            root_slots: core::array::from_fn(|_| CachePadded::new(Mutex::new(()))),
            reclaimer,
            tables: PerCpu::new(|| AtomicI64::new(0)),
            splits: PerCpu::new(|| AtomicI64::new(0)),
            frames,
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

    /// Bytes of table pages in use (4 KiB each, as on x86-64).
    pub fn table_bytes(&self) -> u64 {
        self.table_pages() * TABLE_BYTES
    }
}

#[cfg(all(test, not(aspace_loom)))]
mod tests;
