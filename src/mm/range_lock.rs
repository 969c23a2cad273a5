//! The range lock of [`WriterLocking::Range`](crate::WriterLocking::Range):
//! a reader-writer lock over half-open address ranges.
//!
//! A holder locks a range shared or exclusive; two holds conflict when
//! their ranges overlap and one of them is exclusive. Requests are served
//! in arrival order among those they conflict with (a request waits for
//! every conflicting hold and every conflicting earlier request), so a
//! stream of writers on one part of the space never starves a reader of the
//! whole of it, and disjoint requests never wait for each other.
//!
//! # The protocol of range-locked writers
//!
//! What each writer locks (its *neighbourhood*, computed from the tree,
//! then re-validated with the lock held: if the neighbourhood grew, the
//! writer unlocks and retries with the larger range; the re-validation is
//! skipped when no range was held exclusive from before the computation
//! to the grant, [`RangeLock::quiet`], since every change to the tree and
//! the VMAs is made under an exclusive hold and nothing read can have
//! changed):
//! - mprotect, madvise that sets VMA flags and `set_anon_name` (one
//!   `Edit::modify` walk, `name::modify_each`), and an mmap into free
//!   space: its range `r` widened by one page on each side, plus the
//!   whole of every VMA overlapping that: the VMAs it may split or merge
//!   with. The page on each side makes two new
//!   mappings that would touch conflict, so they merge as one writer after
//!   the other would have.
//! - munmap, and an mmap over mapped pages (which unmaps them first): also
//!   the hole around `r` up to the VMAs on either side, where it frees page
//!   tables of every level (`Edit::free_pgtables` also clamps the limits
//!   of `free_tables_within` to what it holds). The hole is clamped to
//!   `r` rounded out to 512 GiB (a root entry's span,
//!   `pt::ROOT_ENTRY_SPAN`): the largest table freeing unlinks (a PUD
//!   table) covers one such aligned span and the root is never freed, so
//!   every table the whole hole would let it free lies inside the clamp,
//!   and is freed by it. A 2 MiB-aligned clamp was tried: it left
//!   upper-level tables linked (more page-table memory than the mmap_lock
//!   mode, which `tests/semantics/munmap.rs` catches). Without the clamp
//!   an unmap's hole reached the next thread's mapping wherever it was,
//!   so two threads unmapping alone in the space always met.
//! - an mmap without a hint (`Edit::begin_placed`, `mm/edit/range.rs`): the gap search skips
//!   candidates that, a page wider on each side, meet a range held or
//!   waited for ([`RangeLock::busy`]); the choice's neighbourhood is then
//!   try-locked (exclusive, so two placements never both hold one gap)
//!   and checked again under the lock (still free of VMAs and stack guard
//!   gaps, neighbourhood inside the hold), else the search runs again. No
//!   writer holds the whole space for it. A candidate skipped for a
//!   conflict may put the result one hold away from where a serial run
//!   would (a kernel makes no promise on placement); with no other writer
//!   the result is exactly the serial one.
//! - mremap in place (no `FIXED`, no `DONTUNMAP`, `mremap::range_edit`):
//!   `[old, old + max(old_len, new_len))`, a shrink with munmap's hole
//!   (it unmaps the tail with munmap's edit), a grow with mprotect's
//!   neighbourhood (it maps the pages after the VMA, merging into it and
//!   into a next VMA that touches them). A grow of a shared, locked or
//!   growsdown VMA, or one that must move, drops its hold before it
//!   changes anything and runs again on the whole space.
//! - brk (`brk::brk_edit`): a shrink `[new, old)` with munmap's hole, a
//!   growth `[old, new)` with mprotect's neighbourhood (the heap VMA it
//!   grows, or the pages it maps, and the margin page above). Every brk's
//!   hold contains the page on each side of the old break, so brks run
//!   one at a time; the break, read before the hold to know what to lock,
//!   is read again under it, and the writer starts over if another brk
//!   moved it (the loom model `range_brks_race`). After
//!   `mlockall(MCL_FUTURE)` it takes the whole space, as mmap does.
//! - every other writer (an mremap move, mlock (its limit check
//!   counts every locked VMA), mlockall, fork, exec reset, the stack,
//!   userfault registration, the space's drop) and every other mmap_lock
//!   reader (pinning, `vmas()`, pagemap, rmap walks) locks the whole space:
//!   correct and not scalable, the `MmapLock` behaviour.
//!
//! # The protocol of range-locked readers
//!
//! The mmap_lock readers that act on one range lock it shared
//! (`mm/range_read.rs`), computed from the tree and validated under the
//! lock as a writer's neighbourhood is (`edit::lock_validated`, one loop
//! for both):
//! - madvise's zaps (DONTNEED, DONTNEED_LOCKED, FREE, REMOVE, and
//!   WILLNEED's hole check) and the access precheck's locked retry: their
//!   range widened to the whole of every VMA it meets (`vma_hull`, the
//!   helper neighbourhoods are built from).
//! - the locked fault fallback and a forced access's page (they run the
//!   same `do_fault`): the neighbourhood a writer of the faulting
//!   VMA would lock (the VMA, a page on each side, the VMAs there), since
//!   a first anon_vma reads the neighbours' (`mm::anon_vma`); in a hole,
//!   from the page through the VMA above (the stack check reads that gap
//!   and that VMA), to the end of the space if there is none.
//!
//! Why it is enough: a reader reads only VMAs inside what it holds (and
//! the holes of its range); a writer that changes, splits, merges or
//! creates a VMA there holds a neighbourhood overlapping it (the whole of
//! every VMA it changes, and its range where it creates one), so the two
//! exclude each other. The widening to whole VMAs is, for the zaps,
//! redundant with the writers' rule (a writer of any VMA the zap meets
//! holds that VMA whole, so it meets the zap's range anyway) and costs no
//! concurrency: it keeps each side's argument on its own. The margin of
//! the fault's lock is not redundant: a writer splitting the neighbour
//! away from the faulting VMA holds only the neighbour
//! (`loom_tests/range_writers.rs`:
//! `range_fault_fallback_vs_mprotect_splitting_its_neighbour`).
//!
//! Page tables: a zap clears entries under each PTE table's lock and frees
//! no table; its pages' frames go after its own TLB flush (the gather), as
//! before. A writer beside it frees tables only inside its hole
//! (`Edit::free_pgtables` clamps floor and ceiling to the VMAs before and
//! after and to the range it holds), so no table a held VMA's addresses
//! use is freed, even when the zap has just emptied it; both update one
//! PTE table's count under its lock (`range_dontneed_vs_munmap_in_one_pte_table`).
//! Two zaps of one page meet as they did under the mmap_lock read side.
//!
//! Not converted (they still lock the whole space shared): the per-VMA
//! path's anon_vma try-read (`mm/anon_vma.rs`, another module's: it falls
//! back to the converted fallback when a writer holds anything), pinning
//! (device slices and guest-memory views: not reviewed in this change),
//! `vmas()`, pagemap and the rmap walk (they read the whole space or
//! reach other address spaces).
//!
//! Why it is enough: every tree store, VMA change and page-table free of a
//! writer lies inside its neighbourhood, and every VMA it reads to decide
//! lies wholly inside it; a neighbourhood is validated under the lock, and
//! only a holder of an overlapping range could change what it validated.
//! So two holders of disjoint ranges touch disjoint VMAs, tree ranges and
//! page tables, and each sees the tree (outside its range) as some serial
//! order would.
//!
//! The tree's commits run at once in different slots: in range mode the
//! VMA tree is a forest (`tree::RangeForest`, `src/tree/forest.rs`), one
//! tree per 512 GiB slot (a root entry's span, as the munmap clamp), each
//! with its own root, writer mutex and node cache on lines of its own. A
//! store takes the mutex of each slot it changes, one after the other, for
//! one path copy and root swap there; a VMA crossing a slot boundary is
//! stored clipped in each slot and read whole. Two writers in different
//! slots share no tree line; two in one slot take turns on its mutex, as
//! every writer did on the single tree. The range lock is what keeps
//! writers of overlapping ranges apart (a store crossing a boundary is one
//! atomic step per slot, per address, not for the whole range); lock-free
//! readers still see each address mapped by the old entry or the new. The
//! gap search of a placement visits the slots of its window and gives the
//! single tree's answer. What range writers still share: this lock's own
//! mutex (one short acquisition at lock and unlock, and the busy list a
//! placement reads), the mm sequence's write section (`MmLockSeq::join`),
//! and the slot of a writer in the same 512 GiB. Zaps, page-table frees,
//! TLB flushes, frame frees and VMA setup run under the range lock only.
//!
//! Why each lock-free reader stays correct: writers that overlap in time
//! share one write section of the mm sequence ([`MmLockSeq::join`]): it
//! becomes odd when the first writer starts and even when the last one
//! leaves, so a VMA stamped by any of them reads write-locked until all of
//! them are done, and the even value's `Release` store follows every
//! writer's changes (each leaves under the section's mutex, the last store
//! comes after). The per-VMA read lock, the speculative fault and the
//! prechecks compare stamps with the sequence exactly as with one writer:
//! the argument of `spec_fault` holds writer by writer, since each one
//! stamps and sweeps a VMA before changing it, and a VMA already stamped
//! in the shared section has had no reader since (a second writer may
//! then skip the stamp and sweep, as one writer does the second time).
//! The cost is liveness, not safety: while writers keep overlapping, a
//! VMA one of them changed stays write-locked for the lock-free readers,
//! which fall back to the locked paths (their range, shared). Translators
//! and device slices rely on the TLB flush each writer issues for its own
//! range (flushes serialize on the TLB's flush lock as before).
//!
//! [`MmLockSeq::join`]: crate::vma::seq::MmLockSeq::join
//!
//! # Locking
//!
//! The range lock replaces the mmap_lock as level 1 of the order in
//! [`crate::mm`]; its mutex is a leaf (never held while waiting for
//! anything but itself, except the gap search's lock-free tree reads).

use crate::addr::Range;
use crate::sync::{Condvar, Mutex, MutexGuard};

/// The whole address space, as a lockable range.
pub(crate) const WHOLE: Range = Range {
    start: 0,
    end: u64::MAX,
};

/// One hold or waiting request.
#[derive(Clone, Copy, Debug)]
struct Hold {
    /// Arrival order (waiting requests) and identity (holds).
    ticket: u64,
    r: Range,
    exclusive: bool,
}

impl Hold {
    fn conflicts(&self, r: Range, exclusive: bool) -> bool {
        (self.exclusive || exclusive) && self.r.start < r.end && r.start < self.r.end
    }
}

#[derive(Debug, Default)]
struct State {
    next: u64,
    /// Releases so far (a placement waits for the next one).
    releases: u64,
    /// Exclusive holds granted so far: a holder that saw none held and
    /// this count unchanged by its own grant knows no one changed the
    /// space meanwhile ([`RangeLock::quiet`]).
    writes: u64,
    held: Vec<Hold>,
    waiting: Vec<Hold>,
}

impl State {
    fn grantable(&self, me: &Hold) -> bool {
        !self.held.iter().any(|h| h.conflicts(me.r, me.exclusive))
            && !self
                .waiting
                .iter()
                .any(|w| w.ticket < me.ticket && w.conflicts(me.r, me.exclusive))
    }

    fn ticket(&mut self) -> u64 {
        self.next += 1;
        self.next
    }
}

/// A reader-writer lock over address ranges (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct RangeLock {
    /// Protected by: itself.
    state: Mutex<State>,
    /// Signalled when a hold is released.
    released: Condvar,
}

/// A held range; dropping it releases the range.
#[derive(Debug)]
pub(crate) struct RangeGuard<'a> {
    lock: &'a RangeLock,
    ticket: u64,
    range: Range,
    /// The exclusive holds granted before this one.
    writes_before: u64,
}

impl RangeGuard<'_> {
    /// The range held.
    pub(crate) fn range(&self) -> Range {
        self.range
    }

    /// True if no range was held exclusive from the [`RangeLock::quiet`]
    /// call that returned `mark` to this grant: no writer changed the
    /// tree or a VMA in between, so what the holder read from the tree
    /// then is what it would read now (`edit::lock_validated`).
    pub(crate) fn undisturbed_since(&self, mark: Option<u64>) -> bool {
        mark == Some(self.writes_before)
    }
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        let mut st = self.lock.state.lock();
        if let Some(i) = st.held.iter().position(|h| h.ticket == self.ticket) {
            st.held.swap_remove(i);
        }
        st.releases += 1;
        drop(st);
        self.lock.released.notify_all();
    }
}

impl RangeLock {
    /// An unlocked range lock.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Locks `r`, exclusive or shared, waiting for conflicting holds and
    /// earlier conflicting requests.
    pub(crate) fn lock(&self, r: Range, exclusive: bool) -> RangeGuard<'_> {
        let mut st = self.state.lock();
        let me = Hold {
            ticket: st.ticket(),
            r,
            exclusive,
        };
        if st.grantable(&me) {
            return self.grant(st, me);
        }
        st.waiting.push(me);
        loop {
            st = self.released.wait(st);
            if st.grantable(&me) {
                let i = st
                    .waiting
                    .iter()
                    .position(|w| w.ticket == me.ticket)
                    .expect("a waiter stays queued until granted");
                st.waiting.remove(i);
                // Requests behind this one may have waited only for it as
                // a request; now it is a hold, which they wait for anyway.
                return self.grant(st, me);
            }
        }
    }

    /// Locks `r` if no hold or earlier request conflicts.
    pub(crate) fn try_lock(&self, r: Range, exclusive: bool) -> Option<RangeGuard<'_>> {
        let mut st = self.state.lock();
        let me = Hold {
            ticket: st.ticket(),
            r,
            exclusive,
        };
        st.grantable(&me).then(|| self.grant(st, me))
    }

    fn grant<'a>(&'a self, mut st: MutexGuard<'_, State>, me: Hold) -> RangeGuard<'a> {
        st.held.push(me);
        let writes_before = st.writes;
        st.writes += u64::from(me.exclusive);
        RangeGuard {
            lock: self,
            ticket: me.ticket,
            range: me.r,
            writes_before,
        }
    }

    /// A mark for [`RangeGuard::undisturbed_since`]: `None` if some range
    /// is held exclusive now, else the count of exclusive grants so far.
    /// Every change to the tree and the VMAs is made under an exclusive
    /// hold (range writers hold their neighbourhood, every other writer
    /// the whole space), so a later grant that finds the count unchanged
    /// was preceded by no change since the mark; the mutex orders every
    /// earlier holder's changes before it.
    pub(crate) fn quiet(&self) -> Option<u64> {
        quiet_mark(&self.state.lock())
    }

    /// The ranges held or waited for now (every one conflicts with an
    /// exclusive request), the count of releases so far, and the
    /// [`quiet`](Self::quiet) mark of this moment.
    pub(crate) fn busy(&self) -> (Vec<Range>, u64, Option<u64>) {
        let st = self.state.lock();
        let v = st
            .held
            .iter()
            .chain(st.waiting.iter())
            .map(|h| h.r)
            .collect();
        (v, st.releases, quiet_mark(&st))
    }

    /// Waits until some hold is released after [`busy`](Self::busy) said
    /// `releases`.
    pub(crate) fn wait_release(&self, releases: u64) {
        let mut st = self.state.lock();
        while st.releases == releases {
            st = self.released.wait(st);
        }
    }
}

/// [`RangeLock::quiet`] on a locked state.
fn quiet_mark(st: &State) -> Option<u64> {
    (!st.held.iter().any(|h| h.exclusive)).then_some(st.writes)
}

#[cfg(all(test, not(aspace_loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    fn r(a: u64, b: u64) -> Range {
        Range::new(a, b)
    }

    #[test]
    fn disjoint_and_shared_holds_coexist_overlapping_exclusive_ones_do_not() {
        let l = RangeLock::new();
        let a = l.lock(r(0, 10), true);
        let _b = l.lock(r(10, 20), true);
        assert!(l.try_lock(r(9, 11), true).is_none());
        assert!(l.try_lock(r(5, 6), false).is_none());
        drop(a);
        let s1 = l.try_lock(r(0, 5), false).expect("free");
        let s2 = l.try_lock(r(0, 5), false).expect("shared with shared");
        assert!(l.try_lock(r(4, 5), true).is_none());
        drop(s1);
        assert!(l.try_lock(r(0, 10), true).is_none(), "s2 still holds");
        drop(s2);
        assert_eq!(
            l.try_lock(r(0, 10), true).map(|g| g.range()),
            Some(r(0, 10))
        );
    }

    #[test]
    fn a_waiter_blocks_later_conflicting_requests() {
        let l = Arc::new(RangeLock::new());
        let g = l.lock(r(0, 10), true);
        let got = Arc::new(AtomicBool::new(false));
        let t = {
            let (l, got) = (l.clone(), got.clone());
            std::thread::spawn(move || {
                let _w = l.lock(WHOLE, false);
                got.store(true, Ordering::SeqCst);
            })
        };
        // Wait until the whole-space reader is queued.
        while l.state.lock().waiting.is_empty() {
            std::thread::yield_now();
        }
        // A later writer far from the hold still queues behind the reader.
        assert!(l.try_lock(r(100, 200), true).is_none());
        assert!(!got.load(Ordering::SeqCst));
        drop(g);
        t.join().unwrap();
        assert!(got.load(Ordering::SeqCst));
        assert!(l.try_lock(r(100, 200), true).is_some());
    }

    #[test]
    fn busy_lists_holds_and_waiters_and_counts_releases() {
        let l = RangeLock::new();
        let g = l.lock(r(0, 10), true);
        let (busy, n, q) = l.busy();
        assert_eq!(busy, vec![r(0, 10)]);
        assert_eq!(q, None, "an exclusive hold: not quiet");
        drop(g);
        let (busy, m, q) = l.busy();
        assert!(busy.is_empty() && m == n + 1 && q == Some(1));
        l.wait_release(n); // returns at once: a release happened
    }

    #[test]
    fn a_grant_is_undisturbed_only_if_no_exclusive_hold_came_between() {
        let l = RangeLock::new();
        let mark = l.quiet();
        let s = l.lock(r(0, 10), false);
        assert!(s.undisturbed_since(mark), "a shared hold changes nothing");
        let mark = l.quiet();
        let w = l.lock(r(20, 30), true);
        assert!(w.undisturbed_since(mark), "its own grant does not count");
        assert_eq!(l.quiet(), None, "held exclusive");
        let late = l.lock(r(40, 50), true);
        assert!(!late.undisturbed_since(None));
        drop((w, late));
        let mark = l.quiet();
        drop(l.lock(r(60, 70), true)); // a writer came and went
        assert!(!l.lock(r(0, 10), false).undisturbed_since(mark));
        drop(s);
    }
}
