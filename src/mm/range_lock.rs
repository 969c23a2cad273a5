//! The range lock of [`WriterLocking::Range`](crate::WriterLocking::Range):
//! a reader-writer lock over half-open address ranges.
//!
//! A holder locks a range shared or exclusive; two holds conflict when
//! their ranges overlap and one of them is exclusive. Disjoint requests
//! never wait for each other. Requests of the whole space are served in
//! arrival order among themselves (the gate, below), so a stream of
//! writers on one part of the space never starves a reader of the whole
//! of it; a shard's requests may barge (see "Barging").
//!
//! # Shards and the gate
//!
//! A lock with one list of holds makes every writer write its line twice
//! per call, and two writers terabytes apart then bounce it between their
//! CPUs at every mmap: on 2 cores that alone kept writers-only loops at
//! 1.0x from one thread to two. So the space is cut into shards of
//! 512 GiB, the forest's slots (`tree::RangeForest`): each keeps the
//! holds and requests of its part on lines of its own, and a request
//! holds a piece in each shard its range meets, taken in address order
//! (a request waits only at its lowest shard not yet held, holding only
//! lower ones, so no two requests wait for each other). A range writer's
//! neighbourhood lies in one shard, or two where it crosses a boundary.
//!
//! Requests of the whole space (every writer but the range writers, and
//! every reader but the range readers; also a range that meets more than
//! two shards) go through the gate instead, a per-CPU reader-writer lock
//! as Linux's `percpu_rw_semaphore`: a shard request adds one to its
//! CPU's count of requests inside, issues a light fence and goes on if
//! the gate is open (a load of a line only whole-space requests write); a
//! whole-space request waits its turn among whole-space requests, closes
//! the gate, issues a heavy fence (`sync::asymmetric`: `membarrier`, the
//! part `percpu_rw_semaphore` leaves to RCU) and waits until the counts
//! sum to zero. The fence pair orders like two `SeqCst` fences: either
//! the shard request's increment is visible to the closer's sum, or its
//! load sees the gate closed, and it leaves and waits for the gate to
//! open (a leaver likewise either is seen gone or sees the gate closed and
//! wakes the closer). After the gate closes no count rises
//! for good, so a sum read slot by slot is never below the number inside
//! when it ends. The gate stays closed while whole-space requests wait,
//! so they do not starve; shard requests inside are never held up by it.
//! A whole-space hold so excludes every range hold, shared ones too.
//!
//! A range writer's call thus writes its CPU's count, its shard's mutex
//! and holds, and its own VMAs; what two writers in different shards
//! share is only read (the gate's state). A writer takes its shard's
//! mutex twice per call (grant, release): its mark
//! ([`RangeLock::mark`]) and a placement's look for busy ranges
//! ([`RangeLock::busy_near`], in an empty shard) read words the mutex's
//! holders publish after each change (`Shard::publish`) instead of
//! taking it. See "What range writers share"
//! below for the rest of the path.
//!
//! # The bias
//!
//! A space changed by one thread at a time needs none of this. The first
//! thread to request anything holds the lock's bias (`range_bias`,
//! [`Config::range_bias`](crate::Config::range_bias)): its requests are
//! granted by a count on a line of its own, reach neither the gate nor
//! a shard, and its writers and range readers take the whole space
//! instead of computing and validating a neighbourhood
//! ([`MmapLock::bias_likely_mine`](super::mmap_lock::MmapLock::bias_likely_mine)).
//! Another thread's request revokes the bias first (waiting for the
//! owner's call to end; a try-lock fails instead, with
//! [`Wait::Bias`]), and the bias passes to it, or ends for good after
//! the configured handovers; only then do requests reach the shards,
//! which the owner never touched. A mark says nothing while the bias is
//! on ([`RangeLock::mark`]), since the owner changes the tree without
//! the shards' counts moving.
//!
//! After it, each shard has a bias of its own (`range_bias`'s "Slot
//! biases"): a request in one shard alone is granted by that shard's
//! bias while its owner (the first thread to request there) keeps it,
//! and the owner's writers and range readers take the whole slot and
//! compute their neighbourhood under it ([`RangeLock::slot_likely_mine`],
//! [`RangeLock::try_slot_owner`]); a request meeting two shards ends
//! both biases first ([`Wait::SlotBias`] for a try-lock that meets an
//! owner inside its call). The owner counts itself in at its bias alone,
//! not at the gate: the gate's closer, after its heavy fence, waits for
//! the bias count of every shard whose bias was ever granted
//! ([`RangeLock::owners_inside`]) to reach zero as for its own counts,
//! and an owner whose light fence shows the gate closed counts itself out and
//! takes the gate's path (`Bias::enter_ungated`).
//!
//! # Barging
//!
//! A shard's request is granted as soon as no conflicting range is held
//! there, ahead of earlier conflicting requests that still wait. In
//! strict arrival order, a release would hand the range to the waiter,
//! and the releaser's next request, queued behind it, would wait for its
//! whole call: two threads whose ranges meet (Linux's placement puts two
//! threads' mappings side by side) then take turns call by call, and
//! every turn whose waiter slept costs a wake-up, on a VM tens of
//! microseconds (a lock convoy: writers-only instantiation ran at 0.02x
//! from one thread to two on a 2-vCPU VM, `docs/RESULTS.md`, "Range
//! lock: barging"). Barging lets the thread that holds the lines run on.
//! It is bounded as Linux's rwsem bounds lock stealing (its handoff
//! bit): a request that has waited longer than [`HANDOFF_AFTER`] turns
//! *urgent*, and then no later conflicting request is granted before it
//! (they queue behind it as in arrival order), so no stream of requests
//! starves a waiter for longer than that. Whole-space requests at the
//! gate are urgent from the start: they keep arrival order.
//!
//! # Waiting
//!
//! A request that meets a conflicting hold waits on its shard's
//! condition variable. Holds last about a microsecond, less than a sleep
//! and its wake-up cost, so a request blocked by holds alone (not queued
//! behind an earlier conflicting request) first spins a few microseconds
//! with the shard's mutex dropped, watching the shard's release count,
//! and sleeps only if no release came (`Shard::wait_release`). The spin
//! decides only when to look again: what a waiter acts on it reads under
//! the mutex.
//!
//! # The protocol of range-locked writers
//!
//! What each writer locks (its *neighbourhood*, computed from the tree,
//! then re-validated with the lock held: if the neighbourhood grew, the
//! writer unlocks and retries with the larger range; the re-validation is
//! skipped when the hold lies in one shard and no range was held
//! exclusive there, nor the whole space by a writer, from before the
//! computation to the grant, [`RangeLock::mark`], since every change to
//! the tree and the VMAs is made under an exclusive hold of the shards it
//! touches and nothing read can have changed):
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
//!   waited for ([`RangeLock::busy_near`], in the shards the candidate
//!   meets); the choice's neighbourhood is then
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
//! tree per 512 GiB slot (a root entry's span, as the munmap clamp and the
//! lock's shards), each with its own root, writer mutex and node cache on
//! lines of its own. A store takes the mutex of each slot it changes, one
//! after the other, for one path copy and root swap there; a VMA crossing
//! a slot boundary is stored clipped in each slot and read whole. Two
//! writers in different slots share no tree line; two in one slot take
//! turns on its mutex, as every writer did on the single tree. The range
//! lock is what keeps writers of overlapping ranges apart (a store
//! crossing a boundary is one atomic step per slot, per address, not for
//! the whole range); lock-free readers still see each address mapped by
//! the old entry or the new. The gap search of a placement visits the
//! slots of its window and gives the single tree's answer.
//!
//! # What range writers share
//!
//! Two range writers in different 512 GiB slots (placement windows put
//! each CPU's mappings in its own, `Config::placement_window`) write no
//! common line in the lock (above; the owner of a slot's bias writes its
//! shard's bias line instead of its mutex and holds), the tree (its
//! slots) or the write section (below). Still shared: the gate's line,
//! the forest's bits of slots written and of slots whose entries reach
//! an end (each set once) and the mm's map count
//! are read (the count is per CPU, `MmState`), the VMA pool and the
//! memory budget are per CPU with a shared depot or count written once
//! per batch, the TLB's flush lock is taken by a writer that zaps
//! entries, and the allocator's arenas by tree nodes freed on another
//! thread through the epoch. Zaps, page-table frees, TLB flushes, frame
//! frees and VMA setup run under the range lock only.
//!
//! Why each lock-free reader stays correct: every writer runs a write
//! section of its own (`vma::seq`'s "Own write sections"; the bias's
//! owner, alone in the space, runs shared ones until the bias ends, and
//! the first own section then raises the sequence: "The bias's owner
//! runs shared sections"): the space's sequence stays at `LOCKED`, a
//! writer stamps each VMA it locks with
//! `LOCKED | token` (a value of its own) and, when it ends, stamps each of
//! them back to `token` with a `Release` compare-exchange. A stamp at or
//! above the sequence reads write-locked, as with one writer; a reader
//! whose `Acquire` load sees the token sees that writer's changes, and a
//! stamp never repeats on one object, so a snapshot's stamp re-read equal
//! still means no writer touched the VMA since. The per-VMA read lock, the
//! speculative fault and the prechecks thus compare stamps with the
//! sequence exactly as with one writer, and the argument of `spec_fault`
//! holds writer by writer, since each one stamps and sweeps a VMA before
//! changing it. A VMA is readable again as soon as its own writer is
//! done, whatever else runs (a section shared by overlapping writers kept
//! it write-locked while any of them ran, and at two busy threads that
//! was most of the time). Translators and device slices rely on the TLB
//! flush each writer issues for its own range (flushes serialize on the
//! TLB's flush lock as before).
//!
//! # Locking
//!
//! The range lock replaces the mmap_lock as level 1 of the order in
//! [`crate::mm`]. Inside it: the gate's mutex, then the shards' mutexes
//! in address order; each is held only for a check or an update of its
//! holds (or while sleeping on its condition variable, which releases
//! it), never across another lock or a wait for a hold.

use super::range_bias::{Bias, Entry, Watcher};
use crate::addr::Range;
use crate::percpu::{cpu_id, nr_cpus};
use crate::sync::{
    asymmetric, spin_briefly, AtomicBool, AtomicU64, Condvar, Mutex, MutexGuard, Ordering, Patience,
};
use crossbeam_utils::CachePadded;

/// [`State::quiet_word`] while a range is held exclusive.
const NOT_QUIET: u64 = u64::MAX;

/// How long a shard's request waits while later conflicting requests
/// go first ("Barging" in the module docs), before they wait behind it.
/// Half a millisecond, as `parking_lot` bounds its unfair unlocks: long
/// next to a call (about a microsecond), so turns change rarely, and
/// short next to what a caller notices.
pub(crate) const HANDOFF_AFTER: std::time::Duration = std::time::Duration::from_micros(500);

/// The whole address space, as a lockable range.
pub(crate) const WHOLE: Range = Range {
    start: 0,
    end: u64::MAX,
};

/// Shards a request may span before it takes the whole space instead: a
/// range writer's neighbourhood lies in one or two (a mapping across a
/// 512 GiB boundary); only a fault in a hole with nothing above, or a
/// mapping of more than 512 GiB, reaches more.
const MAX_PIECES: usize = 2;

/// One hold or waiting request, in one shard (or, with `r == WHOLE`, at
/// the gate).
#[derive(Clone, Copy, Debug)]
struct Hold {
    /// Arrival order (waiting requests) and identity (holds), per shard.
    ticket: u64,
    r: Range,
    exclusive: bool,
    /// A waiting request no later conflicting one may go before: one that
    /// has waited [`HANDOFF_AFTER`], or any at the gate.
    urgent: bool,
}

impl Hold {
    fn conflicts(&self, r: Range, exclusive: bool) -> bool {
        (self.exclusive || exclusive) && self.r.start < r.end && r.start < self.r.end
    }
}

/// The holds and requests of one shard, or of the whole space at the gate.
#[derive(Debug, Default)]
struct State {
    next: u64,
    /// Releases so far (a placement waits for the next one).
    releases: u64,
    /// Exclusive holds granted so far: a holder that saw none held and
    /// this count unchanged by its own grant knows no one changed the
    /// shard meanwhile ([`RangeLock::mark`]).
    writes: u64,
    held: Vec<Hold>,
    waiting: Vec<Hold>,
}

impl State {
    /// No conflicting hold, and no earlier conflicting request that is
    /// urgent: earlier ones that are not may be passed ("Barging").
    fn grantable(&self, me: &Hold) -> bool {
        !self.held.iter().any(|h| h.conflicts(me.r, me.exclusive))
            && !self
                .waiting
                .iter()
                .any(|w| w.urgent && w.ticket < me.ticket && w.conflicts(me.r, me.exclusive))
    }

    /// True if an earlier request that conflicts with `me` still waits
    /// (urgent or not): `me` then sleeps without spinning.
    fn queued_behind(&self, me: &Hold) -> bool {
        self.waiting
            .iter()
            .any(|w| w.ticket < me.ticket && w.conflicts(me.r, me.exclusive))
    }

    fn request(&mut self, r: Range, exclusive: bool, urgent: bool) -> Hold {
        self.next += 1;
        Hold {
            ticket: self.next,
            r,
            exclusive,
            urgent,
        }
    }

    /// Grants `me`; returns the exclusive grants before it.
    fn grant(&mut self, me: Hold) -> u64 {
        self.held.push(me);
        let before = self.writes;
        self.writes += u64::from(me.exclusive);
        before
    }

    /// Waits (`sleep`: for a change, returning the state relocked) until
    /// `me` (queued) is grantable, then grants it. A request that finds
    /// itself passed over after [`HANDOFF_AFTER`] turns urgent.
    fn wait_grant<'a>(
        mut st: MutexGuard<'a, State>,
        mut sleep: impl FnMut(MutexGuard<'a, State>) -> MutexGuard<'a, State>,
        mut me: Hold,
    ) -> (MutexGuard<'a, State>, u64) {
        if !st.grantable(&me) {
            let patience = Patience::start();
            st.waiting.push(me);
            loop {
                st = sleep(st);
                if st.grantable(&me) {
                    break;
                }
                if !me.urgent && patience.run_out(HANDOFF_AFTER) {
                    me.urgent = true;
                    let w = st.waiting.iter_mut().find(|w| w.ticket == me.ticket);
                    w.expect("a waiter stays queued until granted").urgent = true;
                }
            }
            let i = st
                .waiting
                .iter()
                .position(|w| w.ticket == me.ticket)
                .expect("a waiter stays queued until granted");
            // Requests behind this one may have waited only for it as a
            // request; now it is a hold, which they wait for anyway.
            st.waiting.remove(i);
        }
        let before = st.grant(me);
        (st, before)
    }

    /// Removes a hold of `r` (exclusive or not as given): the holder's
    /// own, or one equal to it, which is the same to every other request.
    fn release(&mut self, r: Range, exclusive: bool) {
        if let Some(i) = self
            .held
            .iter()
            .position(|h| h.r == r && h.exclusive == exclusive)
        {
            self.held.swap_remove(i);
        }
        self.releases += 1;
    }

    /// [`RangeLock::mark`]'s count: `None` if a range is held exclusive.
    fn quiet(&self) -> Option<u64> {
        (!self.held.iter().any(|h| h.exclusive)).then_some(self.writes)
    }

    /// [`quiet`](Self::quiet) as one word: [`NOT_QUIET`] for `None` (the
    /// count of grants never reaches it).
    fn quiet_word(&self) -> u64 {
        self.quiet().unwrap_or(NOT_QUIET)
    }

    /// The ranges held, then those waited for.
    fn ranges(&self) -> impl Iterator<Item = Range> + '_ {
        self.held.iter().chain(&self.waiting).map(|h| h.r)
    }

    /// A range held or waited for that meets `r`.
    fn meeting(&self, r: Range) -> Option<Range> {
        self.ranges().find(|h| h.start < r.end && r.start < h.end)
    }
}

/// One shard's holds: the part of the space in one slot of `1 << shift`
/// bytes.
#[derive(Debug)]
struct Shard {
    /// The slot's bias ("Slot biases" in `range_bias`): once the space's
    /// bias is off, a request in this shard alone is granted or waits
    /// here while it is on, and reaches neither `state` nor the words
    /// below.
    bias: Bias,
    /// Protected by: itself.
    state: Mutex<State>,
    /// Signalled when a hold of this shard is released.
    released: Condvar,
    /// `state.releases`, stored under the mutex after each release, for
    /// waiters that spin before they sleep ([`Shard::wait_release`]).
    /// Only a hint of when to relock: what a waiter acts on it reads under
    /// the mutex, so `Relaxed` suffices.
    releases: AtomicU64,
    /// `state.quiet_word()`, stored (`Release`) under the mutex after each
    /// grant and release, so that [`RangeLock::mark`] reads it without
    /// the mutex (an `Acquire` load: see there).
    quiet: AtomicU64,
    /// Holds and waiting requests in `state`, stored under the mutex after
    /// each change: zero lets [`RangeLock::busy_near`] skip the mutex. A
    /// hint (the placement's try-lock decides), so `Relaxed`.
    occupied: AtomicU64,
    /// For shards `64 * j .. 64 * j + 64`, in shard `j`: a bit set for
    /// each whose bias was ever granted (so its owner may count itself in
    /// there, past the gate: [`RangeLock::owners_inside`] reads only
    /// those).
    /// Protected by: set (a load, and a read-modify-write the first time)
    /// after a grant of that bias, before its owner's first ungated
    /// entry; read by the gate's closer after its heavy fence.
    granted: AtomicU64,
}

impl Shard {
    /// An empty shard, with a bias as [`Bias::new`] makes it.
    fn new(bias: bool, handovers: u32) -> Self {
        Shard {
            bias: Bias::new(bias, handovers),
            state: Mutex::default(),
            released: Condvar::new(),
            releases: AtomicU64::new(0),
            quiet: AtomicU64::new(0),
            occupied: AtomicU64::new(0),
            granted: AtomicU64::new(0),
        }
    }

    /// Releases a hold of `r` and wakes the waiters.
    fn release(&self, r: Range, exclusive: bool) {
        let mut st = self.state.lock();
        st.release(r, exclusive);
        self.releases.store(st.releases, Ordering::Relaxed);
        self.publish(&st);
        drop(st);
        self.released.notify_all();
    }

    /// Stores the words read without the mutex (`quiet`, `occupied`) from
    /// `st`, this shard's locked state, after a change to its holds or
    /// requests.
    fn publish(&self, st: &State) {
        // Release: a mark that reads this word sees every change the
        // holders released before it made (they released under the
        // mutex, before this store).
        self.quiet.store(st.quiet_word(), Ordering::Release);
        let n = st.held.len() + st.waiting.len();
        self.occupied.store(n as u64, Ordering::Relaxed);
    }

    /// Waits for the next release after the state `st` shows, and returns
    /// the state relocked. Holds last about a microsecond (one writer's
    /// edit), less than a sleep and a wake-up cost (two context switches:
    /// at 2 threads on 2 cores they were 37% of range writers' CPU when
    /// their ranges met), so a waiter with `spin` first spins a few
    /// microseconds with the mutex dropped, watching `releases`; then (or
    /// at once without `spin`) it sleeps on `released`, the release count
    /// checked again under the mutex so that no wake-up is missed.
    fn wait_release<'a>(&'a self, st: MutexGuard<'a, State>, spin: bool) -> MutexGuard<'a, State> {
        let seen = st.releases;
        drop(st);
        let moved = spin && spin_briefly(|| self.releases.load(Ordering::Relaxed) != seen);
        let mut st = self.state.lock();
        if !moved && st.releases == seen {
            st = self.released.wait(st);
        }
        st
    }
}

/// The gate between requests of a few shards and requests of the whole
/// space (a per-CPU reader-writer lock, as Linux's `percpu_rw_semaphore`):
/// a shard request counts itself in its CPU's slot of `inside` and goes
/// on if the gate is open; a whole-space request closes the gate and
/// waits until every slot's count is back to zero. The two sides order
/// their count and flag accesses with an asymmetric fence pair
/// ([`asymmetric`]: a compiler fence on the shard side, `membarrier` on
/// the closer's). See the module docs.
struct Gate {
    /// Shard requests past the gate, per CPU slot (each on its own line).
    /// A request decrements the slot it incremented.
    /// Protected by: atomic read-modify-writes, each followed by a light
    /// fence; summed (`Acquire`) by a closer after its heavy fence.
    inside: Box<[CachePadded<AtomicU64>]>,
    /// [`asymmetric::expedited`], read once.
    /// Protected by: immutable after construction.
    expedited: bool,
    /// True while a whole-space request holds the space, waits for it, or
    /// drains the shard requests inside.
    /// Protected by: stored under `state`'s mutex (set before the closer's
    /// heavy fence, cleared with `Release`); read by shard requests
    /// without it, after their light fence.
    closed: AtomicBool,
    /// Twice the whole-space exclusive grants so far, plus one while one
    /// holds: the part of [`RangeLock::mark`] whole-space writers move.
    /// Protected by: written under `state`'s mutex (`AcqRel`); read by
    /// anyone (`Acquire`).
    gen: AtomicU64,
    /// The whole-space holds and requests (every range [`WHOLE`]).
    /// Protected by: itself.
    state: Mutex<State>,
    /// Signalled when a whole-space hold is released, the gate opens, or a
    /// shard request leaves while it is closed.
    changed: Condvar,
}

impl core::fmt::Debug for Gate {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Gate")
            .field("closed", &self.closed.load(Ordering::Relaxed))
            .finish()
    }
}

/// A slot's owner counted in at its bias alone ([`Bias::enter_ungated`])
/// tells the closer when it counts out, as [`Gate::leave`] does.
impl Watcher for Gate {
    #[inline]
    fn counted_out(&self) {
        if self.closed.load(Ordering::Relaxed) {
            // Under the mutex: see `leave`.
            let _st = self.state.lock();
            self.changed.notify_all();
        }
    }
}

impl Gate {
    fn new() -> Self {
        Gate {
            inside: (0..nr_cpus())
                .map(|_| CachePadded::new(AtomicU64::new(0)))
                .collect(),
            expedited: asymmetric::expedited(),
            closed: AtomicBool::new(false),
            gen: AtomicU64::new(0),
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        }
    }

    /// Counts a shard request in: `Some(slot)` to pass to
    /// [`leave`](Self::leave), or `None` if the gate is closed (with
    /// `wait`, it waits until it opens and tries again instead).
    fn enter(&self, wait: bool) -> Option<usize> {
        loop {
            let slot = cpu_id() & (self.inside.len() - 1);
            self.inside[slot].fetch_add(1, Ordering::Relaxed);
            // Pairs with the closer's heavy fence: either our increment is
            // visible to its sum, or its `closed` is visible to this load.
            asymmetric::light(self.expedited);
            // Acquire: pairs with the Release of the last opening, after
            // the last whole-space holder's changes.
            if !self.closed.load(Ordering::Acquire) {
                return Some(slot);
            }
            self.leave(slot);
            if !wait {
                return None;
            }
            self.wait_open();
        }
    }

    /// Waits until the gate is open (at once if it is).
    fn wait_open(&self) {
        let mut st = self.state.lock();
        while self.closed.load(Ordering::Acquire) {
            st = self.changed.wait(st);
        }
    }

    /// Counts a shard request out of `slot`; wakes a closer waiting for
    /// the requests inside to leave.
    fn leave(&self, slot: usize) {
        // Release: a closer whose sum reads this sees the holder's changes.
        self.inside[slot].fetch_sub(1, Ordering::Release);
        asymmetric::light(self.expedited);
        if self.closed.load(Ordering::Relaxed) {
            // Under the mutex: a closer checks the sum and sleeps under it,
            // so this wake cannot fall between its check and its sleep.
            let _st = self.state.lock();
            self.changed.notify_all();
        }
    }

    /// Shard requests inside. After `closed` is set no count rises for
    /// good (an entrant that sees it leaves at once), so a sum read slot
    /// by slot is at least the number inside when it ends: zero means
    /// none is.
    fn inside(&self) -> u64 {
        self.inside
            .iter()
            .fold(0u64, |s, c| s.wrapping_add(c.load(Ordering::Acquire)))
    }

    /// A whole-space request: waits its turn among whole-space requests
    /// (arrival order: every one is urgent), closes the gate and waits for the
    /// shard requests inside to leave. Without `wait`, fails instead of
    /// waiting for either.
    fn close(&self, exclusive: bool, wait: bool, owners_inside: impl Fn() -> bool) -> Option<()> {
        let mut st = self.state.lock();
        // Urgent from the start: whole-space requests keep arrival order.
        let me = st.request(WHOLE, exclusive, true);
        if !wait && !st.grantable(&me) {
            return None;
        }
        let (mut st, _) = State::wait_grant(st, |st| self.changed.wait(st), me);
        if exclusive {
            // Odd while held: a mark taken now is not quiet, and a grant
            // that reads it moved knows a whole-space writer came between.
            self.gen.fetch_add(1, Ordering::AcqRel);
        }
        if !self.closed.load(Ordering::Relaxed) {
            self.closed.store(true, Ordering::Relaxed);
            // Pairs with the entrants' light fences (see `enter`), and
            // with the leavers' (a leaver that missed `closed` left before
            // our sum).
            asymmetric::heavy();
        }
        while self.inside() != 0 || owners_inside() {
            if !wait {
                self.open(st, me);
                return None;
            }
            st = self.changed.wait(st);
        }
        Some(())
    }

    /// Releases the whole-space hold `me`: the gate opens when no
    /// whole-space request holds or waits.
    fn open(&self, mut st: MutexGuard<'_, State>, me: Hold) {
        st.release(WHOLE, me.exclusive);
        if me.exclusive {
            self.gen.fetch_add(1, Ordering::AcqRel);
        }
        if st.held.is_empty() && st.waiting.is_empty() {
            // Release: an entrant that reads it sees this holder's changes.
            self.closed.store(false, Ordering::Release);
        }
        self.changed.notify_all();
    }
}

/// A reader-writer lock over address ranges (see the module docs).
#[derive(Debug)]
pub(crate) struct RangeLock {
    /// log2 of a shard's span.
    /// Protected by: immutable after construction.
    shift: u32,
    /// The shards, in address order; the last reaches the top of `u64`.
    /// Protected by: each shard's own mutex.
    shards: Box<[CachePadded<Shard>]>,
    /// Whole-space requests, and what keeps them apart from the shards'.
    gate: CachePadded<Gate>,
    /// The bias: while on, every request is granted or waits here, and
    /// none reaches the shards or the gate (`range_bias`).
    /// Protected by: its own lines and mutex.
    bias: CachePadded<Bias>,
}

/// [`RangeGuard::first`] of a request the bias granted.
const BIASED: u32 = u32::MAX - 1;

/// [`RangeGuard::n`] of a request its shard's bias granted ("Slot
/// biases" in `range_bias`): the shard `first`, through its bias.
const SLOT_BIASED: u8 = u8::MAX;

/// [`RangeGuard::slot`] of a request counted in at its shard's bias
/// alone, not at the gate ([`Bias::enter_ungated`]).
const UNGATED: u32 = u32::MAX;

/// A held range; dropping it releases the range. Kept small: it is part
/// of every writer's guard, which moves by value.
#[derive(Debug)]
pub(crate) struct RangeGuard<'a> {
    lock: &'a RangeLock,
    range: Range,
    /// The first shard held, `u32::MAX` for the whole space (through the
    /// gate), or [`BIASED`] (the bias's owner: everything, through
    /// nothing).
    first: u32,
    /// Shards held from `first` on (each holds the range clipped to it),
    /// or [`SLOT_BIASED`].
    n: u8,
    exclusive: bool,
    /// The gate's slot this request counted itself in, or [`UNGATED`].
    slot: u32,
    /// The exclusive grants of the first shard before this one.
    writes_before: u64,
}

/// A moment at which one shard had no exclusive hold and no whole-space
/// writer held the space ([`RangeLock::mark`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Mark {
    gen: u64,
    shard: usize,
    writes: u64,
}

/// What a failed try or a busy placement waits for ([`RangeLock::wait`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    /// The next release in a shard after it had `releases`.
    Shard { shard: usize, releases: u64 },
    /// The gate's opening.
    Gate,
    /// The end of the bias owner's call (`range_bias`).
    Bias,
    /// The end of the call of the owner of a shard's bias.
    SlotBias(usize),
}

impl RangeGuard<'_> {
    /// The range held.
    pub(crate) fn range(&self) -> Range {
        self.range
    }

    /// True if the bias granted this hold (`range_bias`).
    #[inline]
    pub(crate) fn is_biased(&self) -> bool {
        self.first == BIASED
    }

    /// The shard whose bias granted this hold to its owner ("Slot
    /// biases" in `range_bias`), if one did.
    #[inline]
    pub(crate) fn owned_slot(&self) -> Option<usize> {
        (self.n == SLOT_BIASED).then_some(self.first as usize)
    }

    /// True if a shard's bias granted this hold ("Slot biases" in
    /// `range_bias`).
    #[cfg(test)]
    pub(crate) fn is_slot_biased(&self) -> bool {
        self.n == SLOT_BIASED
    }

    /// True if the hold lies in the shard of `mark` alone, and neither a
    /// range was held exclusive there nor a whole-space writer held the
    /// space from the [`RangeLock::mark`] call that returned `mark` to
    /// this grant: no writer changed the tree or a VMA of that shard in
    /// between, so what the holder read of it then is what it would read
    /// now (`edit::lock_validated`).
    /// A grant of the bias holds no shard (`n == 0`), nor does one of a
    /// shard's bias (`n == SLOT_BIASED`), and so is never undisturbed:
    /// its owner may have held the bias since before the mark, or got it
    /// back since.
    pub(crate) fn undisturbed_since(&self, mark: Option<Mark>) -> bool {
        mark.is_some_and(|m| {
            self.n == 1
                && self.first as usize == m.shard
                && self.writes_before == m.writes
                && self.lock.gate.gen.load(Ordering::Acquire) == m.gen
        })
    }
}

impl Drop for RangeGuard<'_> {
    #[inline(never)]
    fn drop(&mut self) {
        if self.first == BIASED {
            self.lock.bias.owner_release(self.exclusive, &());
        } else {
            self.release();
        }
    }
}

impl RangeGuard<'_> {
    /// Drop's path without the bias: the gate, or the pieces and then
    /// the gate.
    #[inline(never)]
    fn release(&mut self) {
        let l = self.lock;
        if self.first == u32::MAX {
            let me = Hold {
                ticket: 0,
                r: WHOLE,
                exclusive: self.exclusive,
                urgent: true,
            };
            l.gate.open(l.gate.state.lock(), me);
            return;
        }
        if self.n == SLOT_BIASED {
            l.shards[self.first as usize]
                .bias
                .owner_release(self.exclusive, &*l.gate);
            if self.slot == UNGATED {
                return;
            }
        } else {
            for k in self.first as usize..self.first as usize + usize::from(self.n) {
                l.release_piece(k, l.clip(self.range, k), self.exclusive);
            }
        }
        l.gate.leave(self.slot as usize);
    }
}

impl RangeLock {
    /// An unlocked range lock over `[0, space_end)` (and above, in its
    /// last shard), in shards of `1 << shift` bytes, cut as the forest's
    /// slots (`tree::slot_geometry`: larger if more than 4096 would be
    /// needed), with no bias.
    #[cfg(any(test, aspace_loom))]
    pub(crate) fn new(shift: u32, space_end: u64) -> Self {
        Self::with_biases(shift, space_end, false, false, 0)
    }

    /// [`new`](Self::new), with a bias the first request claims if `bias`,
    /// passed between threads up to `handovers` times (`range_bias`).
    #[cfg(test)]
    pub(crate) fn with_bias(shift: u32, space_end: u64, bias: bool, handovers: u32) -> Self {
        Self::with_biases(shift, space_end, bias, bias, handovers)
    }

    /// [`new`](Self::new), with the space's bias if `space_bias` and the
    /// slots' biases if `slot_biases` (which, without the space's, hold
    /// from the start), each passed between threads up to `handovers`
    /// times (`range_bias`).
    pub(crate) fn with_biases(
        shift: u32,
        space_end: u64,
        space_bias: bool,
        slot_biases: bool,
        handovers: u32,
    ) -> Self {
        let (shift, n) = crate::tree::slot_geometry(shift, space_end);
        RangeLock {
            shift,
            shards: (0..n)
                .map(|_| CachePadded::new(Shard::new(slot_biases, handovers)))
                .collect(),
            gate: CachePadded::new(Gate::new()),
            bias: CachePadded::new(Bias::new(space_bias, handovers)),
        }
    }

    /// True if the calling thread holds the bias or may claim it: its
    /// writers take the whole space (granted at once), not a
    /// neighbourhood (`range_bias`). A hint.
    #[inline]
    pub(crate) fn bias_likely_mine(&self) -> bool {
        self.bias.likely_mine()
    }

    /// The number of shards (the forest's slots, `tree::slot_geometry`).
    pub(crate) fn slots(&self) -> usize {
        self.shards.len()
    }

    /// True once the bias is off for good, or if it was never on.
    pub(crate) fn bias_is_off(&self) -> bool {
        self.bias.is_off()
    }

    /// The whole slot (shard) of `addr`, if the space's bias is off and
    /// the calling thread holds that shard's bias or may claim it: its
    /// writers and readers there request the whole slot, granted at once,
    /// and compute their neighbourhood under it ("Slot biases" in
    /// `range_bias`). A hint, as [`bias_likely_mine`](Self::bias_likely_mine).
    #[inline]
    pub(crate) fn slot_likely_mine(&self, addr: u64) -> Option<Range> {
        let k = self.shard_of(addr);
        (self.bias.is_off() && self.shards[k].bias.likely_mine()).then(|| self.clip(WHOLE, k))
    }

    /// The whole slot of `addr`, exclusive, if the caller owns that
    /// slot's bias: granted at its bias alone, inline ("Slot biases" in
    /// `range_bias`), else `None` (nothing held). A shard's bias names a
    /// thread only after the space's bias ended for good, so that needs
    /// no check.
    #[inline]
    pub(crate) fn try_slot_owner(&self, addr: u64) -> Option<RangeGuard<'_>> {
        let k = self.shard_of(addr);
        self.grant_ungated(k, self.clip(WHOLE, k), true)
    }

    /// `r` (inside shard `k`), granted by shard `k`'s bias to its owner,
    /// counted in there alone, past the gate (`Bias::enter_ungated`: the
    /// gate's closer waits for that count as for its own); `None`
    /// (nothing held) for anyone else, or while the gate is closed.
    #[inline]
    fn grant_ungated(&self, k: usize, r: Range, exclusive: bool) -> Option<RangeGuard<'_>> {
        let b = &self.shards[k].bias;
        if !b.enter_ungated(&self.gate.closed, &*self.gate) {
            return None;
        }
        b.owner_grant(exclusive, &*self.gate);
        Some(RangeGuard {
            lock: self,
            range: r,
            first: k as u32,
            n: SLOT_BIASED,
            exclusive,
            slot: UNGATED,
            writes_before: 0,
        })
    }

    /// Records that shard `k`'s bias was granted, before its owner can
    /// count itself in there past the gate (every owner's first grant
    /// comes through the gate: a claim, or a hand-over): a load, and a
    /// read-modify-write the first time only.
    fn note_granted(&self, k: usize) {
        let (word, bit) = (&self.shards[k / 64].granted, 1u64 << (k % 64));
        if word.load(Ordering::Relaxed) & bit == 0 {
            word.fetch_or(bit, Ordering::Relaxed);
        }
    }

    /// True if a slot's owner is counted in at its bias (past the gate,
    /// [`Bias::enter_ungated`]), for the gate's closer after its heavy
    /// fence: reads the bias of each shard whose bias was ever granted
    /// (`Shard::granted`), not every shard's. The fence pair orders an
    /// owner's `granted` bit, stored before its count-in, before this
    /// read, as it orders the count itself.
    fn owners_inside(&self) -> bool {
        let words = self.shards.len().div_ceil(64);
        self.shards[..words].iter().enumerate().any(|(j, sh)| {
            let mut bits = sh.granted.load(Ordering::Relaxed);
            while bits != 0 {
                let k = j * 64 + bits.trailing_zeros() as usize;
                if self.shards[k].bias.counted_in() {
                    return true;
                }
                bits &= bits - 1;
            }
            false
        })
    }

    /// The shard holding `addr`.
    fn shard_of(&self, addr: u64) -> usize {
        ((addr >> self.shift) as usize).min(self.shards.len() - 1)
    }

    /// The first and last shard `r` (non-empty) meets.
    fn shards_met(&self, r: Range) -> (usize, usize) {
        (self.shard_of(r.start), self.shard_of(r.end - 1))
    }

    /// True if `a` and `b` lie in one shard.
    pub(crate) fn same_shard(&self, a: u64, b: u64) -> bool {
        self.shard_of(a) == self.shard_of(b)
    }

    /// The shards `r` (non-empty) meets, or `None` if that is more than a
    /// request may hold piece by piece.
    fn pieces(&self, r: Range) -> Option<(usize, usize)> {
        let (first, last) = self.shards_met(r);
        (r != WHOLE && last - first < MAX_PIECES).then_some((first, last - first + 1))
    }

    /// `r` clipped to shard `k`.
    fn clip(&self, r: Range, k: usize) -> Range {
        let lo = (k as u64) << self.shift;
        let hi = if k + 1 == self.shards.len() {
            u64::MAX
        } else {
            ((k + 1) as u64) << self.shift
        };
        Range::new(r.start.max(lo), r.end.min(hi))
    }

    fn release_piece(&self, k: usize, r: Range, exclusive: bool) {
        self.shards[k].release(r, exclusive);
    }

    /// Locks `r`, exclusive or shared, waiting for conflicting holds and
    /// earlier conflicting requests.
    #[inline]
    pub(crate) fn lock(&self, r: Range, exclusive: bool) -> RangeGuard<'_> {
        match self.acquire(r, exclusive, true) {
            Ok(g) => g,
            Err(_) => unreachable!("a waiting lock does not fail"),
        }
    }

    /// Locks `r` if no hold or earlier request conflicts; else says what
    /// to [`wait`](Self::wait) for before trying again.
    pub(crate) fn try_lock(&self, r: Range, exclusive: bool) -> Result<RangeGuard<'_>, Wait> {
        self.acquire(r, exclusive, false)
    }

    /// The bias's answer inline (its owner's path is a few instructions),
    /// the shards' out of line. Always: left to the compiler, it stayed a
    /// call from `MmapLock::write`, whose entry and exit cost the space's
    /// owner 1.6% of a writers-only call (`docs/RESULTS.md`, "The space
    /// owner's grant inline").
    #[inline(always)]
    fn acquire(&self, r: Range, exclusive: bool, wait: bool) -> Result<RangeGuard<'_>, Wait> {
        match self.bias.enter(wait, &()) {
            Entry::Off => self.acquire_shards(r, exclusive, wait),
            Entry::Owner => {
                self.bias.owner_grant(exclusive, &());
                Ok(RangeGuard {
                    lock: self,
                    range: r,
                    first: BIASED,
                    n: 0,
                    exclusive,
                    slot: 0,
                    writes_before: 0,
                })
            }
            Entry::Revoking => Err(Wait::Bias),
        }
    }

    /// [`acquire`](Self::acquire) with the bias off: the gate, then the
    /// shards.
    #[inline(never)]
    fn acquire_shards(
        &self,
        r: Range,
        exclusive: bool,
        wait: bool,
    ) -> Result<RangeGuard<'_>, Wait> {
        // The guard is made only once the gate is passed (or closed by
        // this request): dropping it releases what it says it holds, so
        // a request refused at the gate must have none.
        let guard = |first: u32, slot: usize| RangeGuard {
            lock: self,
            range: r,
            first,
            n: 0,
            exclusive,
            slot: slot as u32,
            writes_before: 0,
        };
        let Some((first, n)) = (!r.is_empty()).then(|| self.pieces(r)).flatten() else {
            self.gate
                .close(exclusive, wait, || self.owners_inside())
                .ok_or(Wait::Gate)?;
            return Ok(guard(u32::MAX, 0));
        };
        // The owner of the shard's bias: granted there, past the gate.
        if n == 1 {
            if let Some(g) = self.grant_ungated(first, r, exclusive) {
                return Ok(g);
            }
        }
        let slot = self.gate.enter(wait).ok_or(Wait::Gate)?;
        // From here on, dropping `g` releases the pieces it counts and
        // leaves the gate.
        let mut g = guard(first as u32, slot);
        // The slots' biases: granted by the one of its shard, or turned
        // off in every shard it spans ("Slot biases" in `range_bias`).
        if n == 1 {
            let b = &self.shards[first].bias;
            match b.enter(wait, &*self.gate) {
                Entry::Off => {}
                Entry::Owner => {
                    self.note_granted(first);
                    b.owner_grant(exclusive, &*self.gate);
                    g.n = SLOT_BIASED;
                    return Ok(g);
                }
                Entry::Revoking => return Err(Wait::SlotBias(first)),
            }
        } else if let Some(k) = (first..first + n).find(|&k| !self.shards[k].bias.end(wait)) {
            return Err(Wait::SlotBias(k));
        }
        // Shards in address order: a request waits only at its lowest
        // shard not yet held, holding only lower ones, so no two wait
        // for each other.
        for k in first..first + n {
            let sh = &self.shards[k];
            let mut st = sh.state.lock();
            let me = st.request(self.clip(r, k), exclusive, false);
            let before = if wait {
                // Only a request that waits for holds alone spins: one
                // queued behind other requests (urgent or not) sleeps at
                // once, since N spinners on 16 cores cost more than they
                // save (as Linux lets one optimistic spinner spin per
                // rwsem).
                let (st, before) = State::wait_grant(
                    st,
                    |st| {
                        // Queued: placements see the request.
                        sh.publish(&st);
                        let spin = !st.queued_behind(&me);
                        sh.wait_release(st, spin)
                    },
                    me,
                );
                sh.publish(&st);
                before
            } else if st.grantable(&me) {
                let before = st.grant(me);
                sh.publish(&st);
                before
            } else {
                let releases = st.releases;
                drop(st);
                drop(g);
                return Err(Wait::Shard { shard: k, releases });
            };
            if k == first {
                g.writes_before = before;
            }
            g.n += 1;
        }
        Ok(g)
    }

    /// A mark for [`RangeGuard::undisturbed_since`], for a holder about to
    /// read the tree around `addr`: `None` if a whole-space writer holds
    /// the space or a range is held exclusive in `addr`'s shard now. Every
    /// change to the tree and the VMAs is made under an exclusive hold of
    /// the shards it touches (range writers hold their neighbourhood,
    /// every other writer the whole space), so a later grant in that shard
    /// alone that finds both counts unchanged was preceded by no change
    /// there since the mark. The shard's count is read without its mutex,
    /// from the word each grant and release stores under it
    /// (`Shard::publish`): that `Release` store follows every earlier
    /// holder's release in the mutex's order, so this `Acquire` load sees
    /// their changes; and the grant that later compares the count takes
    /// the mutex after this load, so it comes after that store in the
    /// mutex's order, and an unchanged count means no exclusive grant
    /// came between. The gate's count (read `Acquire` after a whole-space
    /// writer's last change) orders those of whole-space writers.
    ///
    /// While the bias is on, `None`: its owner changes the tree without
    /// the counts moving (`range_bias`).
    pub(crate) fn mark(&self, addr: u64) -> Option<Mark> {
        if !self.bias.is_off() {
            return None;
        }
        let gen = self.gate.gen.load(Ordering::Acquire);
        if gen & 1 == 1 {
            return None;
        }
        let shard = self.shard_of(addr);
        // As the space's bias: the owner of the shard's changes it
        // without the count moving. Once off, it stays off, and its last
        // owner's changes come before this `Acquire` load's.
        if !self.shards[shard].bias.is_off() {
            return None;
        }
        let writes = self.shards[shard].quiet.load(Ordering::Acquire);
        (writes != NOT_QUIET).then_some(Mark { gen, shard, writes })
    }

    /// A range held or waited for that meets `r` (a placement's
    /// candidate, a page wider on each side), and what to wait for before
    /// trying it again; looks at the shards `r` meets only. While the bias
    /// is on, nothing is (its owner's holds are not in the shards): the
    /// placement's try-lock then meets the bias.
    pub(crate) fn busy_near(&self, r: Range) -> Option<(Range, Wait)> {
        if r.is_empty() {
            return None;
        }
        let (first, last) = self.shards_met(r);
        (first..=last).find_map(|k| {
            // Nothing held or waited for (a hint: a request that comes
            // after this look is met by the placement's try-lock).
            if self.shards[k].occupied.load(Ordering::Relaxed) == 0 {
                return None;
            }
            let st = self.shards[k].state.lock();
            st.meeting(r).map(|m| {
                let w = Wait::Shard {
                    shard: k,
                    releases: st.releases,
                };
                (m, w)
            })
        })
    }

    /// Waits for what `w` names: a release in its shard after the one it
    /// counted (at once if one came since), or the gate's opening.
    pub(crate) fn wait(&self, w: Wait) {
        match w {
            Wait::Shard { shard, releases } => {
                let sh = &self.shards[shard];
                let mut st = sh.state.lock();
                while st.releases == releases {
                    st = sh.wait_release(st, true);
                }
            }
            Wait::Gate => self.gate.wait_open(),
            Wait::Bias => self.bias.wait_revoked(),
            Wait::SlotBias(k) => self.shards[k].bias.wait_revoked(),
        }
    }

    /// Every range held or waited for now, whole-space ones first, then
    /// each shard's pieces in shard order (tests).
    #[cfg(test)]
    pub(crate) fn busy(&self) -> Vec<Range> {
        let mut v: Vec<Range> = self.gate.state.lock().ranges().collect();
        for sh in self.shards.iter() {
            v.extend(sh.state.lock().ranges());
        }
        v
    }
}

#[cfg(all(test, not(aspace_loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU64 as StdU64, Ordering as O};
    use std::sync::Arc;

    fn r(a: u64, b: u64) -> Range {
        Range::new(a, b)
    }

    /// Shards of 1 MiB over 16 MiB.
    const SH: u64 = 1 << 20;

    fn small() -> RangeLock {
        RangeLock::new(20, 16 * SH)
    }

    #[test]
    fn disjoint_and_shared_holds_coexist_overlapping_exclusive_ones_do_not() {
        let l = small();
        let a = l.lock(r(0, 10), true);
        let _b = l.lock(r(10, 20), true);
        assert!(l.try_lock(r(9, 11), true).is_err());
        assert!(l.try_lock(r(5, 6), false).is_err());
        drop(a);
        let s1 = l.try_lock(r(0, 5), false).expect("free");
        let s2 = l.try_lock(r(0, 5), false).expect("shared with shared");
        assert!(l.try_lock(r(4, 5), true).is_err());
        drop(s1);
        assert!(l.try_lock(r(0, 10), true).is_err(), "s2 still holds");
        drop(s2);
        assert_eq!(l.try_lock(r(0, 10), true).map(|g| g.range()), Ok(r(0, 10)));
    }

    /// A shard's request passes earlier waiting requests it conflicts
    /// with (barging) until one of them is urgent; then it waits behind
    /// that one.
    #[test]
    fn a_request_barges_past_waiters_until_one_is_urgent() {
        let mut st = State::default();
        let h = st.request(r(0, 10), true, false);
        st.grant(h);
        let w = st.request(r(5, 15), true, false);
        assert!(!st.grantable(&w), "meets the hold");
        st.waiting.push(w);
        let n = st.request(r(12, 20), true, false);
        assert!(st.grantable(&n), "meets only a waiter that is not urgent");
        st.waiting[0].urgent = true;
        assert!(!st.grantable(&n), "behind an urgent waiter");
        let apart = st.request(r(15, 20), true, false);
        assert!(st.grantable(&apart), "meets neither");
        st.release(r(0, 10), true);
        assert!(st.grantable(&st.waiting[0]), "not behind itself");
    }

    /// Two threads keep a range held shared between them: each takes its
    /// hold again before the other lets go, so an exclusive request on
    /// it never finds the range free, and barging alone would let their
    /// requests pass it for as long as they go on. After
    /// [`HANDOFF_AFTER`] it turns urgent, their next requests wait behind
    /// it, and it gets in. Fails (after 10 s) with the handoff removed.
    #[test]
    fn a_waiter_passed_over_gets_in_after_the_handoff() {
        use std::time::{Duration, Instant};
        let l = Arc::new(small());
        let stop = Arc::new(AtomicBool::new(false));
        // Whether each reader holds, and whose turn it is to let go.
        let held = Arc::new([AtomicBool::new(false), AtomicBool::new(false)]);
        let turn = Arc::new(StdU64::new(0));
        let readers: Vec<_> = (0..2usize)
            .map(|i| {
                let (l, stop, held, turn) = (l.clone(), stop.clone(), held.clone(), turn.clone());
                std::thread::spawn(move || {
                    while !stop.load(O::SeqCst) {
                        let g = l.lock(r(0, 10), false);
                        held[i].store(true, O::SeqCst);
                        // Let go on our turn once the other holds; or
                        // after 2 ms, when the other waits (behind the
                        // urgent writer).
                        let t0 = Instant::now();
                        while !(turn.load(O::SeqCst) == i as u64 && held[1 - i].load(O::SeqCst))
                            && t0.elapsed() < Duration::from_millis(2)
                        {
                            std::hint::spin_loop();
                        }
                        held[i].store(false, O::SeqCst);
                        turn.store(1 - i as u64, O::SeqCst);
                        drop(g);
                    }
                })
            })
            .collect();
        // Both hold at some moment before the writer asks.
        while !(held[0].load(O::SeqCst) && held[1].load(O::SeqCst)) {
            std::hint::spin_loop();
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let writer = {
            let l = l.clone();
            std::thread::spawn(move || {
                let t0 = Instant::now();
                drop(l.lock(r(5, 6), true));
                tx.send(t0.elapsed()).unwrap();
            })
        };
        let waited = rx.recv_timeout(Duration::from_secs(10));
        stop.store(true, O::SeqCst);
        writer.join().unwrap();
        for t in readers {
            t.join().unwrap();
        }
        assert!(waited.is_ok(), "the writer starved for 10 s");
        assert!(l.busy().is_empty());
    }

    #[test]
    fn a_range_across_shards_holds_each_piece() {
        let l = small();
        let g = l.lock(r(SH - 8, SH + 8), true);
        assert_eq!(l.busy(), vec![r(SH - 8, SH), r(SH, SH + 8)]);
        assert!(l.try_lock(r(SH + 4, SH + 5), true).is_err(), "upper piece");
        assert!(l.try_lock(r(SH - 1, SH), true).is_err(), "lower piece");
        assert!(l.try_lock(r(SH + 8, SH + 9), true).is_ok(), "beside it");
        assert!(l.try_lock(r(0, SH - 8), true).is_ok(), "below it");
        drop(g);
        assert!(l.busy().is_empty());
        // More shards than a request holds piece by piece: the whole space.
        let big = l.lock(r(0, (MAX_PIECES as u64 + 1) * SH), false);
        assert_eq!(l.busy(), vec![WHOLE]);
        assert_eq!(
            l.try_lock(r(15 * SH, 15 * SH + 1), true).err(),
            Some(Wait::Gate)
        );
        drop(big);
        assert!(l.try_lock(r(15 * SH, 15 * SH + 1), true).is_ok());
    }

    /// A request refused at the closed gate, or by the whole space's
    /// holds, holds nothing: dropping what it made releases no one
    /// else's hold (a refused request once "opened" the gate and so
    /// removed the whole-space holder's hold).
    #[test]
    fn refused_requests_leave_whole_space_holds_alone() {
        let l = small();
        for exclusive in [true, false] {
            let w = l.lock(WHOLE, exclusive);
            for _ in 0..2 {
                assert_eq!(l.try_lock(r(0, 10), true).err(), Some(Wait::Gate));
                assert_eq!(l.try_lock(r(SH, SH + 10), false).err(), Some(Wait::Gate));
                assert_eq!(l.try_lock(WHOLE, true).err(), Some(Wait::Gate));
            }
            if !exclusive {
                // A second shared whole-space hold is granted, and
                // releasing it leaves the first in place.
                drop(l.try_lock(WHOLE, false).expect("shared with shared"));
                assert!(l.try_lock(r(0, 10), true).is_err(), "the first still holds");
            }
            assert!(l.gate.closed.load(Ordering::Relaxed), "still closed");
            drop(w);
            assert!(
                !l.gate.closed.load(Ordering::Relaxed),
                "opened by its holder"
            );
            drop(l.try_lock(r(0, 10), true).expect("free again"));
        }
    }

    /// A thread that requests the whole space (shared or `exclusive`),
    /// says when it is granted, and releases it at once; returned once
    /// its request has closed the gate.
    fn whole_space_request(
        l: &Arc<RangeLock>,
        exclusive: bool,
    ) -> (std::thread::JoinHandle<()>, Arc<AtomicBool>) {
        let granted = Arc::new(AtomicBool::new(false));
        let t = {
            let (l, granted) = (l.clone(), granted.clone());
            std::thread::spawn(move || {
                drop(l.lock(WHOLE, exclusive));
                granted.store(true, O::SeqCst);
            })
        };
        while !l.gate.closed.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        (t, granted)
    }

    #[test]
    fn a_whole_space_request_waits_for_every_range_and_blocks_later_ones() {
        let l = Arc::new(small());
        let g = l.lock(r(0, 10), true);
        let (t, got) = whole_space_request(&l, false);
        // A later writer far from the hold, in another shard, queues
        // behind the reader.
        assert_eq!(
            l.try_lock(r(9 * SH, 9 * SH + 1), true).err(),
            Some(Wait::Gate)
        );
        assert!(!got.load(O::SeqCst));
        drop(g);
        t.join().unwrap();
        assert!(got.load(O::SeqCst));
        assert!(l.try_lock(r(9 * SH, 9 * SH + 1), true).is_ok());
    }

    #[test]
    fn busy_near_names_a_meeting_range_and_what_to_wait_for() {
        let l = small();
        let g = l.lock(r(0, 10), true);
        let (m, w) = l.busy_near(r(5, SH + 1)).expect("meets the hold");
        assert_eq!(m, r(0, 10));
        assert_eq!(l.busy_near(r(10, 20)), None);
        drop(g);
        l.wait(w); // returns at once: a release happened
        assert_eq!(l.busy_near(r(5, SH + 1)), None);
    }

    #[test]
    fn a_grant_is_undisturbed_only_if_no_writer_came_between_in_its_shard() {
        let l = small();
        let mark = l.mark(0);
        let s = l.lock(r(0, 10), false);
        assert!(s.undisturbed_since(mark), "a shared hold changes nothing");
        let mark = l.mark(20);
        let w = l.lock(r(20, 30), true);
        assert!(w.undisturbed_since(mark), "its own grant does not count");
        assert_eq!(l.mark(25), None, "held exclusive");
        assert!(l.mark(SH).is_some(), "another shard is quiet");
        let late = l.lock(r(40, 50), true);
        assert!(!late.undisturbed_since(None));
        drop((w, late));
        let mark = l.mark(0);
        drop(l.lock(r(60, 70), true)); // a writer came and went
        assert!(!l.lock(r(0, 10), false).undisturbed_since(mark));
        // One in another shard does not disturb this one...
        let mark = l.mark(0);
        drop(l.lock(r(2 * SH, 2 * SH + 1), true));
        assert!(l.lock(r(0, 10), false).undisturbed_since(mark));
        // ...but a whole-space writer does (it waits for `s`), and a hold
        // across shards is never taken for undisturbed.
        drop(s);
        let mark = l.mark(0);
        drop(l.lock(WHOLE, true));
        assert!(!l.lock(r(0, 10), false).undisturbed_since(mark));
        let mark = l.mark(0);
        assert!(!l.lock(r(10, SH + 1), false).undisturbed_since(mark));
    }

    /// Threads lock random ranges (some across shards, some the whole
    /// space), shared or exclusive, and mark every unit of what they hold:
    /// an exclusive holder must find no other holder on its units, a
    /// shared one no exclusive holder.
    #[test]
    fn holds_exclude_each_other_under_contention() {
        holds_exclude_each_other(small());
    }

    /// As above with the biases on, passed around often before they end:
    /// the space's, then each shard's.
    #[test]
    fn holds_exclude_each_other_under_contention_through_the_biases() {
        holds_exclude_each_other(RangeLock::with_bias(20, 16 * SH, true, 200));
    }

    fn holds_exclude_each_other(l: RangeLock) {
        const UNITS: u64 = 64;
        const UNIT: u64 = SH / 4;
        let l = Arc::new(l);
        // Per unit: shared holders in the low bits, an exclusive one at bit 32.
        let units: Arc<Vec<StdU64>> = Arc::new((0..UNITS).map(|_| StdU64::new(0)).collect());
        let hs: Vec<_> = (0..4u64)
            .map(|t| {
                let (l, units) = (l.clone(), units.clone());
                std::thread::spawn(move || {
                    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (t + 1);
                    for _ in 0..20_000 {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let exclusive = x % 3 != 0;
                        let (a, n) = ((x >> 8) % UNITS, 1 + (x >> 20) % 6);
                        let (rr, span) = if x % 97 == 0 {
                            (WHOLE, 0..UNITS)
                        } else {
                            let b = (a + n).min(UNITS);
                            (r(a * UNIT, b * UNIT), a..b)
                        };
                        let _g = l.lock(rr, exclusive);
                        let add = if exclusive { 1 << 32 } else { 1 };
                        for u in span.clone() {
                            let prev = units[u as usize].fetch_add(add, O::SeqCst);
                            assert!(
                                prev == 0 || (!exclusive && prev < 1 << 32),
                                "unit {u} held {prev:#x} beside a new hold (exclusive {exclusive})"
                            );
                        }
                        for u in span {
                            units[u as usize].fetch_sub(add, O::SeqCst);
                        }
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert!(l.busy().is_empty());
        assert!(!l.gate.closed.load(Ordering::SeqCst));
    }

    /// Ends the space's bias: other threads' requests (in the last shard,
    /// whose bias the last of them claims) revoke it until its handovers
    /// are spent.
    fn end_the_space_bias(l: &Arc<RangeLock>) {
        while !l.bias_is_off() {
            let l = l.clone();
            std::thread::spawn(move || drop(l.lock(r(15 * SH, 15 * SH + 1), false)))
                .join()
                .unwrap();
        }
    }

    /// Runs `f` on a thread of its own and returns what it returns.
    fn elsewhere<T: Send + 'static>(l: &Arc<RangeLock>, f: fn(&RangeLock) -> T) -> T {
        let l = l.clone();
        std::thread::spawn(move || f(&l)).join().unwrap()
    }

    /// Once the space's bias is off, a request in one shard alone is
    /// granted by that shard's bias (nothing in the shard's state, no
    /// mark there), and another thread's request in that shard meets it
    /// while its owner holds; in another shard it claims that shard's.
    /// Released, the bias passes to the next thread's request there, and
    /// a request across two shards ends both for good.
    #[test]
    fn a_slot_bias_grants_its_owner_passes_over_and_ends_across_shards() {
        let l = Arc::new(RangeLock::with_bias(20, 16 * SH, true, 1));
        end_the_space_bias(&l);
        assert_eq!(l.slot_likely_mine(5), Some(r(0, SH)), "unclaimed");
        let g = l.lock(r(0, 10), true);
        assert!(g.is_slot_biased() && !g.is_biased());
        assert!(l.busy().is_empty(), "the shard's state is untouched");
        assert_eq!(l.mark(0), None);
        assert_eq!(l.mark(2 * SH), None, "an unclaimed shard's bias is on too");
        assert_eq!(
            elsewhere(&l, |l| l.try_lock(r(20, 30), true).err()),
            Some(Wait::SlotBias(0))
        );
        assert!(elsewhere(&l, |l| l
            .try_lock(r(SH, SH + 10), true)
            .is_ok_and(|g| g.is_slot_biased())));
        drop(g);
        assert!(
            elsewhere(&l, |l| l.lock(r(20, 30), true).is_slot_biased()),
            "passed over"
        );
        assert_eq!(l.slot_likely_mine(5), None);
        let across = l.lock(r(SH - 10, SH + 10), true);
        assert!(!across.is_slot_biased() && across.n == 2);
        assert_eq!(l.busy(), vec![r(SH - 10, SH), r(SH, SH + 10)]);
        drop(across);
        assert!(l.mark(0).is_some() && l.mark(SH).is_some(), "both off");
        assert!(!l.lock(r(0, 10), true).is_slot_biased());
        assert_eq!(l.slot_likely_mine(5), None);
    }

    /// Without the space's bias, each shard's bias holds from the start:
    /// the first request in a shard claims it (no space's bias to end
    /// first), and its owner's next request there is granted inline.
    #[test]
    fn without_the_space_bias_the_first_request_claims_its_slot() {
        let l = Arc::new(RangeLock::with_biases(20, 16 * SH, false, true, 1));
        assert!(l.bias_is_off());
        let g = l.lock(r(0, 10), true);
        assert!(g.is_slot_biased(), "the first request claims its slot");
        drop(g);
        assert_eq!(l.slot_likely_mine(5), Some(r(0, SH)));
        let g = l.try_slot_owner(5).expect("the owner's inline grant");
        assert!(g.is_slot_biased() && g.slot == UNGATED);
        assert!(
            elsewhere(&l, |l| l.slot_likely_mine(5).is_none()),
            "another thread's hint"
        );
    }

    /// A slot's owner is granted its whole slot at the bias alone, not
    /// counted at the gate (`try_slot_owner`); a whole-space request
    /// still waits for that grant's release, a whole-space try-lock
    /// fails while it lasts, and while the gate is closed the owner's
    /// inline grant refuses (its request then waits at the gate).
    #[test]
    fn a_slot_owner_counts_at_its_bias_and_the_gate_still_waits_for_it() {
        let l = Arc::new(RangeLock::with_bias(20, 16 * SH, true, 1));
        end_the_space_bias(&l);
        assert!(l.try_slot_owner(5).is_none(), "not claimed yet");
        drop(l.lock(r(0, 10), true));
        let g = l.try_slot_owner(5).expect("the owner's inline grant");
        assert!(g.is_slot_biased() && g.slot == UNGATED && g.range() == r(0, SH));
        assert_eq!(l.gate.inside(), 0, "not counted at the gate");
        assert!(
            elsewhere(&l, |l| l.try_slot_owner(5).is_none()),
            "not the owner"
        );
        assert_eq!(
            elsewhere(&l, |l| l.try_lock(WHOLE, false).err()),
            Some(Wait::Gate),
            "a whole-space try waits for the owner's grant"
        );
        let (closer, granted) = whole_space_request(&l, true);
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(
            !granted.load(O::SeqCst),
            "granted while the owner holds its slot"
        );
        // The gate is closed (its closer waits for `g`): the inline grant
        // refuses before it records a grant (one nested in `g` would panic).
        assert!(
            l.try_slot_owner(5).is_none(),
            "granted inline past a closed gate"
        );
        drop(g);
        closer.join().unwrap();
        assert!(granted.load(O::SeqCst));
        let g = l
            .try_slot_owner(5)
            .expect("the owner's again once it opens");
        drop(g);
        assert_eq!(l.gate.inside(), 0);
        assert!(!l.gate.closed.load(Ordering::SeqCst));
    }
}
