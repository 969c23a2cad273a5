//! Page-table pages: frames whose 4 KiB hold a page table's 512 entries,
//! with the two fields a table needs beside them (its split lock and its
//! count of used entries), which Linux keeps in the table's `struct page`
//! and which live here in a per-frame array of each chunk.
//!
//! A table page is taken from the same per-CPU caches as data frames and
//! given back to them, so tables cost no heap allocation on the fault path
//! and their memory is the budget's own frames. Two exceptions are heap
//! pages: a table forced past the budget when no frame is free (mremap's
//! destination tables, whose source tables are freed right after), and
//! every table under loom, whose entries must be loom's atomics (frame
//! words are plain atomics loom cannot see).

use super::{FrameAllocator, Pfn, WORDS};
use crate::sync::{AtomicU32, AtomicU64, Mutex, Ordering};
use core::ptr::NonNull;

/// A page table's 512 entries: a frame's words, or a heap page's.
pub(crate) struct Entries(NonNull<[AtomicU64; WORDS]>);

impl core::ops::Deref for Entries {
    type Target = [AtomicU64; WORDS];
    #[inline(always)]
    fn deref(&self) -> &Self::Target {
        // SAFETY: the pointer is to a frame of the allocator (which outlives
        // every table page borrowed from it) or to the heap page its table
        // page owns; either is 512 aligned atomic words.
        unsafe { self.0.as_ref() }
    }
}

/// One page-table page: the entries and the per-frame fields beside them.
/// The page table's rules for each field are in [`crate::pt`]'s docs.
pub(crate) struct TablePage {
    /// The 512 entries ([`crate::pt::Pte`] values at level 0; at upper
    /// levels a child table page's address with the table bit, or 0).
    ///
    /// Protected by: the pointer is immutable; the entries, at level 0, by
    /// `lock` for every change (stored with `Release`, read lock-free with
    /// `Acquire` under an epoch guard); at upper levels by `lock` too:
    /// filled by any walker and emptied only by the mmap_lock writer where
    /// no VMA covers the span (or swung by mremap, also under the moved
    /// table's PTE lock), both under it. A table page is zero when handed
    /// out.
    pub(crate) entries: Entries,
    /// Non-empty entries.
    ///
    /// Protected by: at level 0, `lock` (plain load and store); at upper
    /// levels, atomic `Relaxed` read-modify-writes by the linking walker
    /// and the unlinking writer (under `lock` too). Read with `Acquire` only to compare with
    /// zero. Reset (`Relaxed`) by the allocator before the page is
    /// published.
    pub(crate) used: AtomicU32,
    /// The split PTE lock at level 0; above, the lock of the entry slots
    /// (see `entries`).
    ///
    /// Protected by: immutable (it is the lock); unlocked whenever the
    /// page is free.
    pub(crate) lock: Mutex<()>,
    /// The frame holding the entries; [`Pfn::ZERO_PAGE`] for a heap page.
    ///
    /// Protected by: immutable.
    frame: Pfn,
}

// SAFETY: the entries are atomics, shared by design; the pointer is to
// memory that lives as long as the allocator or the page itself.
unsafe impl Send for TablePage {}
// SAFETY: as for Send.
unsafe impl Sync for TablePage {}

impl TablePage {
    /// A heap page with zero entries.
    fn boxed() -> NonNull<TablePage> {
        let words: Box<[AtomicU64; WORDS]> = Box::new(core::array::from_fn(|_| AtomicU64::new(0)));
        let t = Box::new(TablePage {
            entries: Entries(NonNull::from(Box::leak(words))),
            used: AtomicU32::new(0),
            lock: Mutex::new(()),
            frame: Pfn::ZERO_PAGE,
        });
        NonNull::from(Box::leak(t))
    }

    /// The per-frame table fields of the chunk whose memory is `mem` and
    /// whose first frame is `first`.
    #[cfg(not(aspace_loom))]
    pub(super) fn chunk_pages(mem: *mut u8, first: usize) -> Box<[TablePage]> {
        use crate::addr::PAGE_SIZE;
        (0..super::CHUNK_FRAMES)
            .map(|i| {
                // SAFETY: frame `i` of the chunk is in bounds of its memory,
                // which is page-aligned and never null.
                let words = unsafe { NonNull::new_unchecked(mem.add(i * PAGE_SIZE as usize)) };
                TablePage {
                    entries: Entries(words.cast()),
                    used: AtomicU32::new(0),
                    lock: Mutex::new(()),
                    frame: Pfn::new((first + i) as u32),
                }
            })
            .collect()
    }
}

impl Drop for TablePage {
    fn drop(&mut self) {
        if self.frame.is_zero_page() {
            // SAFETY: a heap page owns its entries, leaked by `boxed`.
            unsafe { drop(Box::from_raw(self.entries.0.as_ptr())) };
        }
    }
}

impl FrameAllocator {
    /// A table page with zero entries and a zero count, not charged (its
    /// page table charges it): a frame from the pool, or `None` if none is
    /// free, unless `heap_if_dry` (then a heap page; always one under
    /// loom).
    #[cfg(not(aspace_loom))]
    pub(crate) fn alloc_table(&self, heap_if_dry: bool) -> Option<NonNull<TablePage>> {
        let Some((pfn, _)) = self.take(super::cache::Use::Table, false) else {
            return heap_if_dry.then(TablePage::boxed);
        };
        // Cleared even when known to be zero: the walks and installs that
        // follow then find its lines in this CPU's cache, as they found a
        // heap table just written (a walk waits for the entry it reads; the
        // clearing stores do not wait). Under callgrind's cache model this
        // took pft's last-level read misses in the fault path from about
        // 2000 to 6 per 16k faults.
        self.zero(pfn);
        let t = self.table_page(pfn);
        t.used.store(0, Ordering::Relaxed);
        Some(NonNull::from(t))
    }

    /// Under loom, a heap page (see the module docs).
    #[cfg(aspace_loom)]
    pub(crate) fn alloc_table(&self, _heap_if_dry: bool) -> Option<NonNull<TablePage>> {
        Some(TablePage::boxed())
    }

    /// Gives back a table page from [`alloc_table`](Self::alloc_table).
    ///
    /// # Safety
    /// `t` came from this allocator's `alloc_table`, nobody can reach it
    /// any more (walkers that might have are gone), and it is not used
    /// after this call.
    pub(crate) unsafe fn free_table(&self, t: NonNull<TablePage>) {
        // SAFETY: forwarded from the caller.
        unsafe { self.free_table_on(crate::percpu::cpu_id(), t) }
    }

    /// [`free_table`](Self::free_table) into the cache of CPU slot `cpu`:
    /// a table retired through the epoch goes back to the CPU that
    /// retired it (whose cache holds its lines), not to whichever thread
    /// ran the deferred free. Given to the other CPU, its 64 lines came
    /// from the retiring one when the page was next cleared: two threads
    /// instantiating in one process spent 14.5% of their cycles clearing
    /// frames, against 10.0% for two processes of one thread each
    /// (`docs/RESULTS.md`, "Retired page tables go back to their CPU").
    ///
    /// # Safety
    /// As for [`free_table`](Self::free_table).
    pub(crate) unsafe fn free_table_on(&self, cpu: usize, t: NonNull<TablePage>) {
        // SAFETY: `t` is a live table page (the caller's contract).
        let frame = unsafe { t.as_ref() }.frame;
        if frame.is_zero_page() {
            // SAFETY: a heap page comes from `Box::leak` in `boxed`, and
            // it is ours now.
            unsafe { drop(Box::from_raw(t.as_ptr())) };
        } else {
            // SAFETY: as above.
            if !self.zero_new && unsafe { t.as_ref() }.used.load(Ordering::Relaxed) != 0 {
                // A pool that does not clear frames would hand the entries
                // (host addresses of tables) to the next user as data.
                self.zero(frame);
            }
            self.use_exclusive(frame);
            self.give_on(cpu, frame, super::cache::Use::Table, false);
        }
    }

    /// The table fields of frame `pfn`.
    #[cfg(not(aspace_loom))]
    fn table_page(&self, pfn: Pfn) -> &TablePage {
        &self.chunk(pfn).tables[pfn.get() as usize % super::CHUNK_FRAMES]
    }
}
