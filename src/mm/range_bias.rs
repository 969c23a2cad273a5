//! The range lock's bias: a thread alone in an address space holds the
//! whole space for nothing.
//!
//! Most processes change their address space from one thread at a time.
//! For them the range lock's protocol (a neighbourhood computed, locked in
//! its shard, validated; a gate passed; a placement that avoids busy
//! ranges) is pure cost: at one thread a writers-only loop ran at 0.7x
//! `PerVma`'s rate, about 900 more instructions per mprotect or munmap.
//! So the first thread to lock anything becomes the bias's *owner*: its
//! requests, of any range, are granted by two read-modify-writes of a
//! line of the lock that only it writes, and its writers take the whole
//! space as the mmap_lock's writers do (`Edit::begin`), skipping the
//! neighbourhood. It
//! is biased locking as Java VMs had it (Kawachiya, Koseki and Onodera,
//! "Lock Reservation", OOPSLA 2002), with the revocation's handshake done
//! by an asymmetric fence pair instead of a safepoint.
//!
//! # Revocation
//!
//! Any other thread's request revokes the bias first. The owner's call
//! and the revoker meet as Dekker's two flags, ordered by
//! [`asymmetric`]'s pair (the owner's side is a compiler fence):
//! - the owner, entering, counts itself in (`depth`, a read-modify-write:
//!   a thread that lost the bias as it entered counts itself in and out
//!   beside the next owner), fences (light) and reads the word again: if
//!   it still names it, the revoker will see the count; else it counts
//!   itself out and takes the lock's usual path;
//! - the revoker, under the bias's mutex, marks the word `REVOKING`,
//!   fences (heavy) and reads the count: zero means the owner is out of
//!   every call and sees the mark when it tries to enter again; else it
//!   waits (the owner, counting itself out, fences and sees the mark, and
//!   wakes it under the mutex, so the wake cannot fall between the
//!   revoker's check and its sleep).
//!
//! Whoever finds the mark and the count at zero, under the mutex,
//! completes the revocation: the bias passes to it (a process whose main
//! thread set up the space and whose worker then does all the calls
//! keeps the fast path), at most `Config::range_bias_handovers` times
//! ([`DEFAULT_HANDOVERS`]); after that it is off for good, and every
//! request takes the range lock's usual path. The
//! owner's `Release` count-out, read `Acquire` by the completer, and the
//! completer's `Release` store of the word, read `Acquire` by every later
//! request, order the owner's changes before theirs.
//!
//! A try-lock never waits for the owner's call (the caller may hold a
//! VMA lock that call waits for): it marks the word, and if the owner is
//! inside, fails with what to wait for, as a conflicting hold makes it.
//!
//! # Slot biases
//!
//! Once the space's bias is off, every 512 GiB slot (a shard of the range
//! lock, a tree of the forest) has a bias of its own, the same [`Bias`]
//! one level down: claimed by the first request in that shard alone,
//! revoked by any other thread's request there, passed at most as many
//! times, then off for good. Threads that keep to slots of their own (a
//! runtime's threads, each placing in its CPU's window,
//! `Config::placement_window`) so keep a fast path after the space's
//! bias has ended. A request in the owner's shard alone is granted by
//! the shard's bias: its count, not the gate's per-CPU count, the
//! shard's mutex, holds or published words. The gate still keeps it
//! from whole-space requests: the owner, counted in, checks after its
//! light fence that the gate is open as well as that the word still
//! names it ([`Bias::enter_ungated`]; if closed, it counts itself out
//! and takes the gate's path, waiting for the opening), and the closer,
//! after its heavy fence, waits for the bias count of every shard whose
//! bias was ever granted (a bit each, set at the gate by the first
//! grant) to reach zero as for the gate's counts; the owner's last
//! count-out wakes it (the [`Watcher`] a shard's bias tells). The
//! owner's writers and range readers request the whole slot
//! ([`RangeLock::slot_likely_mine`](super::range_lock::RangeLock::slot_likely_mine))
//! and compute their neighbourhood under the grant, once: nothing to
//! mark, validate or skip as busy (`edit::lock_validated`,
//! `Edit::place_in_slot`). Not even that computation where it cannot
//! leave the slot: a range a page inside the slot, in a slot where no
//! entry ever reached an end (the forest's "Edges"), has every VMA it
//! may meet inside. Anything reaching past the slot takes the usual path.
//!
//! What the slot's owner still pays, beside the space's owner: its own
//! write sections (two slots' owners write at once, so
//! neither may move the space's sequence), the forest's slots, its
//! placement window, and a map count of its slot's (`mm::map_count`:
//! a load and a store, as the space owner's total, but folded into the
//! total past a batch). At one thread that path runs at about 0.94-0.96x
//! the space owner's (`docs/RESULTS.md`, "Slot biases", "The slot
//! owner's grant inline, past the gate", "The slot owner's map count;
//! the path's code footprint", "The slot owner's code, shared, and its
//! edits made in place" and "The slot owner's code in one copy").
//!
//! The protocol is the space's bias's, per shard:
//! - a request meeting two shards (a mapping across a boundary, or a
//!   neighbourhood holding a VMA that crosses one) ends the bias of each
//!   ([`Bias::end`]: revoked as above, waiting for the owner's call, then
//!   off for good, never passed to it), so a hold of pieces never meets
//!   an owner's grant;
//! - while a shard's bias is on, its requests never reach its mutex, and
//!   its holds and published words stay as they were when the bias began
//!   (nothing, since the space's bias held before); a mark there says
//!   nothing ([`RangeLock::mark`](super::range_lock::RangeLock::mark)),
//!   and a grant of the bias is never undisturbed;
//! - a try-lock that meets the owner inside its call fails with what to
//!   wait for (`Wait::SlotBias`), as at the space's bias.
//!
//! Loom: `range_slot_bias_placement_vs_owner_placing` (a placement that
//! looked while a slot's owner placed) and
//! `range_slot_bias_owner_vs_request_across_slots` (a mapping across two
//! slots ending the bias of one whose owner is inside its call), in
//! `loom_tests/range_writers.rs`.
//!
//! # Why the rest of the lock needs no change
//!
//! While the bias is on, no request reaches the shards or the gate: the
//! owner's are granted here, every other thread's waits here for the
//! bias to pass or to end. So the shards' holds and published words are
//! what they were when the bias began (nothing), and the first requests
//! after it ends find them so. Only two readers of the shards look
//! without requesting: a mark
//! ([`RangeLock::mark`](super::range_lock::RangeLock::mark)) says
//! nothing while the bias is on (the owner changes the tree without the
//! shards' counts moving), and a placement's look for busy ranges sees
//! nothing busy, and its try-lock then meets the bias.
//!
//! # The tree stays one tree while the bias holds
//!
//! Range mode's VMA tree is a forest of 512 GiB slots so that writers in
//! different slots commit at once; the owner is the only writer, so the
//! slots would only cost it (about 500 instructions of slot arithmetic
//! per instantiation). With the bias on, the space makes the forest
//! *unified* (`RangeForest::sliced_unified`): one tree, read and written
//! as in the other modes. The first writer that does not hold the bias
//! (a range writer, or a whole-space writer once the bias is off) splits
//! it into the slots before it writes (`Edit::begin`, `begin_range`,
//! `begin_placed`); the forest's module docs argue the split against
//! readers and writers, and `loom_tests/range_writers.rs`'s
//! `range_bias_split_vs_spec_fault` runs it against a speculative fault.
//! Correctness does not depend on when the split comes (a writer of the
//! one tree is as correct as one of the slots), only scaling does.
//!
//! # Cost
//!
//! The owner's request: a load of the word, an increment of the count
//! (a locked instruction on x86-64, on a line in the owner's cache), a
//! compiler fence, a second load, and a plain store of what it holds
//! (`owner_grant`, which refuses a hold nested in an exclusive one); its
//! release: that store, a decrement, a fence, a load. In range mode no
//! holder takes the mmap_lock's reader-writer lock besides (the range
//! lock keeps its state's writer apart from everyone), so these are the
//! only shared-memory writes of the owner's lock path, and the line is
//! written by the owner alone while the bias holds (the word by revokers,
//! a few times in the space's life; another thread reads the line only to
//! revoke). Every request after the bias
//! ends loads the word, a line no one writes any more.
//!
//! The owner's writers then run shared sections of the space's sequence
//! (`vma::seq`'s "The bias's owner runs shared sections"): a
//! read-modify-write of the sequence to begin and a store to end, as the
//! classic mode's writer, instead of an own section's token, its list of
//! the VMAs it locked and a compare-exchange on each of them at the end.
//! The sequence's line is read by every fault, so its two writes a call
//! are shared ones, as in the classic mode; an own section's unlocks
//! would write the lines of the VMAs those faults read instead. And the
//! owner's placements ignore `Config::placement_window` while the tree
//! is one tree (`mm::placement`): windows keep concurrent writers apart,
//! and there are none yet. At one thread, writers-only, these two (with
//! the grant inline and the shards' path out of line) took the
//! instantiation loop from 10,053 to 9,733 instructions an instance
//! (PerVma 9,314 in the same build: 0.96x; `docs/RESULTS.md`, "The
//! bias's owner runs shared sections").

use crate::sync::{
    asymmetric, counter, thread_id, thread_id_if_made, AtomicU64, Condvar, Mutex, MutexGuard,
    Ordering,
};

/// How many times the bias passes from one thread to another before it is
/// off for good, by default (`Config::range_bias_handovers`). Each pass
/// costs its revoker a heavy fence (a few microseconds, more with more
/// CPUs) and perhaps a wait for the owner's call; two threads that both
/// keep calling would pass it back and forth for ever. Java VMs likewise
/// stop biasing a class after some number of revocations.
pub(crate) const DEFAULT_HANDOVERS: u32 = 4;

/// The word before any request: the first one claims the bias.
const UNCLAIMED: u64 = u64::MAX - 2;
/// The word while a revoker waits for the owner's calls to end.
const REVOKING: u64 = u64::MAX - 1;
/// The word once the bias is off for good (or was never on).
const OFF: u64 = u64::MAX;

/// Who else waits for a bias's count to reach zero, told by every
/// count-out that reaches it (past its light fence): a slot's bias tells
/// the range lock's gate, whose closer waits for the owners counted in at
/// their slots' biases alone ([`Bias::enter_ungated`]); the space's bias
/// tells no one (`()`).
pub(crate) trait Watcher {
    /// Called after a count-out left the count at zero and fenced (light).
    fn counted_out(&self);
}

impl Watcher for () {
    #[inline(always)]
    fn counted_out(&self) {}
}

/// What a request found ([`Bias::enter`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Entry {
    /// The caller holds the bias and is counted in: its request is
    /// granted, and it calls [`Bias::exit`] when it releases it.
    Owner,
    /// The bias is off: the caller requests as usual.
    Off,
    /// Another thread's call must end first (only without `wait`):
    /// [`Bias::wait_revoked`], then request again.
    Revoking,
}

/// What a revoker found under the mutex ([`Bias::revoke`]).
enum Found {
    /// The bias is off for good.
    Off,
    /// No thread has claimed it.
    Unclaimed,
    /// Marked, and the owner is out of every call: the caller completes
    /// the revocation.
    OwnerOut,
    /// Marked, and the owner is inside a call (only without `wait`).
    OwnerInside,
    /// The word names the caller.
    Mine,
}

/// The bias of one range lock, or of one of its shards (see the module
/// docs). Not padded itself: the range lock keeps the space's on lines of
/// its own, and each shard's shares its shard's lines, which no one else
/// writes while that bias is on.
pub(crate) struct Bias {
    /// The owner's calls in progress, nested ones counted (and, for a
    /// moment, the one of a thread that lost the bias as it entered).
    /// Protected by: read-modify-writes by the thread(s) that read their
    /// id in the word (`Release` on the way out), each followed by a
    /// light fence; read by revokers after their heavy fence (`Acquire`).
    hot: Hot,
    /// [`asymmetric::expedited`], read once.
    /// Protected by: immutable after construction.
    expedited: bool,
    /// Handovers allowed before the bias ends.
    /// Protected by: immutable after construction.
    max_handovers: u32,
    /// The handovers so far; its mutex serializes revokers and the
    /// claim.
    /// Protected by: itself.
    handovers: Mutex<u32>,
    /// Signalled when a revocation can complete: the owner counted itself
    /// out of its last call, or a revocation completed.
    changed: Condvar,
}

/// What the owner writes.
struct Hot {
    /// [`UNCLAIMED`], the owner's thread id, [`REVOKING`] or [`OFF`].
    /// Protected by: stored under `handovers`' mutex (`Release`), loaded
    /// by anyone (`Acquire`; the owner's re-check after its fence
    /// `Relaxed`).
    word: AtomicU64,
    /// See [`Bias::hot`].
    depth: AtomicU64,
    /// The owner's grants held ([`Bias::owner_grant`]): [`EXCLUSIVE`],
    /// or how many shared ones.
    /// Protected by: the owner alone, between its count-in and count-out
    /// (a revocation completes only at a count of zero, when the owner
    /// has put it back to zero); not seen by loom (nothing else reads it).
    holds: counter::AtomicU32,
}

/// [`Hot::holds`] while the owner holds an exclusive grant.
const EXCLUSIVE: u32 = 1 << 31;

impl core::fmt::Debug for Bias {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Bias")
            .field("word", &self.hot.word.load(Ordering::Relaxed))
            .finish()
    }
}

impl Bias {
    /// A bias the first request claims (`on`) and that passes between
    /// threads up to `max_handovers` times, or one that is off.
    pub(crate) fn new(on: bool, max_handovers: u32) -> Self {
        Bias {
            hot: Hot {
                word: AtomicU64::new(if on { UNCLAIMED } else { OFF }),
                depth: AtomicU64::new(0),
                holds: counter::AtomicU32::new(0),
            },
            expedited: asymmetric::expedited(),
            max_handovers,
            handovers: Mutex::new(0),
            changed: Condvar::new(),
        }
    }

    /// True if the calling thread holds the bias, or may claim it (no one
    /// has): a writer then takes the whole space, whose request this
    /// bias grants at once (if another thread got there first, that
    /// request simply takes the whole space the usual way). A hint: the
    /// request decides.
    #[inline]
    pub(crate) fn likely_mine(&self) -> bool {
        let w = self.hot.word.load(Ordering::Relaxed);
        w == thread_id_if_made() || w == UNCLAIMED
    }

    /// True once the bias is off for good: the range lock's shards hold
    /// every request from now on (`Acquire`: the last owner's changes
    /// are visible).
    #[inline]
    pub(crate) fn is_off(&self) -> bool {
        self.hot.word.load(Ordering::Acquire) == OFF
    }

    /// A request's first step: granted here if the caller holds the bias
    /// (or claims it, or it passes to the caller); [`Entry::Off`] if the
    /// bias is off; otherwise it revokes the bias, waiting for the
    /// owner's call to end with `wait`, failing with
    /// [`Entry::Revoking`] without.
    #[inline]
    pub(crate) fn enter(&self, wait: bool, watcher: &impl Watcher) -> Entry {
        let w = self.hot.word.load(Ordering::Acquire);
        if w == OFF {
            return Entry::Off;
        }
        if w == thread_id_if_made() && self.count_in(w, watcher) {
            return Entry::Owner;
        }
        self.enter_slow(wait, watcher)
    }

    /// The owner's entry at a slot's bias with nothing else counted: true
    /// if the caller holds the bias, counted itself in, and after its
    /// light fence still finds the word naming it and `closed` (the
    /// range lock's gate) clear. The gate's closer, having set `closed`
    /// and fenced (heavy), so either sees this count or is seen, and
    /// waits for it to reach zero as for the gate's own counts ("Slot
    /// biases" in the module docs). False: counted out again (the
    /// request then takes the gate's path).
    #[inline]
    pub(crate) fn enter_ungated(
        &self,
        closed: &crate::sync::AtomicBool,
        watcher: &impl Watcher,
    ) -> bool {
        let me = thread_id_if_made();
        let h = &self.hot;
        if h.word.load(Ordering::Relaxed) != me {
            return false;
        }
        h.depth.fetch_add(1, Ordering::Relaxed);
        // Pairs with a revoker's heavy fence and with the gate closer's:
        // either it sees the count, or these loads see its mark or flag.
        asymmetric::light(self.expedited);
        // Acquire (both): the word pairs with the `Release` store of the
        // completed revocation that passed the bias here, `closed` with
        // the last opening's, after the last whole-space holder's changes.
        if h.word.load(Ordering::Acquire) == me && !closed.load(Ordering::Acquire) {
            return true;
        }
        self.exit(watcher);
        false
    }

    /// True if some thread is counted in ([`enter`](Self::enter),
    /// [`enter_ungated`](Self::enter_ungated)); `Acquire`, pairing with
    /// the `Release` count-out of the owner's last call.
    pub(crate) fn counted_in(&self) -> bool {
        self.hot.depth.load(Ordering::Acquire) != 0
    }

    /// The owner's entry: counts itself in, then checks that no revoker
    /// marked the word before its count could be seen (the module docs'
    /// handshake). False: counted out again, revoked.
    ///
    /// The count is a read-modify-write, not a plain store, though only
    /// the owner counts itself in: a thread that read its own id just
    /// before a revocation completed still adds its one and takes it back
    /// after the new owner counted itself in (loom's
    /// `range_bias_owner_vs_revoking_writer` found a plain load and store
    /// losing the new owner's count that way).
    #[inline]
    fn count_in(&self, me: u64, watcher: &impl Watcher) -> bool {
        let h = &self.hot;
        h.depth.fetch_add(1, Ordering::Relaxed);
        // Pairs with the revoker's heavy fence: either it sees the count,
        // or this load sees its mark.
        asymmetric::light(self.expedited);
        if h.word.load(Ordering::Relaxed) == me {
            return true;
        }
        self.exit(watcher);
        false
    }

    /// Records a grant [`enter`](Self::enter) just made to the owner. The
    /// owner's grants nest (its count), but not inside an exclusive one,
    /// and an exclusive one not inside any: the range lock would deadlock
    /// there without the bias, and with it the mmap_lock's state would be
    /// lent as `&mut` beside another borrow (its holders take no other
    /// lock in range mode). So that is a bug of the caller, and panics
    /// (after counting the request out).
    #[inline]
    pub(crate) fn owner_grant(&self, exclusive: bool, watcher: &impl Watcher) {
        let h = &self.hot.holds;
        let held = h.load(counter::Ordering::Relaxed);
        if held & EXCLUSIVE != 0 || (exclusive && held != 0) {
            self.exit(watcher);
            panic!("a range-lock request nested inside an exclusive hold, or an exclusive one inside a hold, by the bias's owner: it deadlocks without the bias");
        }
        h.store(
            if exclusive { EXCLUSIVE } else { held + 1 },
            counter::Ordering::Relaxed,
        );
    }

    /// The owner's release of a grant [`owner_grant`](Self::owner_grant)
    /// recorded, then of its request ([`exit`](Self::exit)).
    #[inline]
    pub(crate) fn owner_release(&self, exclusive: bool, watcher: &impl Watcher) {
        let h = &self.hot.holds;
        let held = h.load(counter::Ordering::Relaxed);
        h.store(
            if exclusive { 0 } else { held - 1 },
            counter::Ordering::Relaxed,
        );
        self.exit(watcher);
    }

    /// The owner's release of a request [`enter`](Self::enter) granted.
    #[inline]
    pub(crate) fn exit(&self, watcher: &impl Watcher) {
        let h = &self.hot;
        // Release: the completer of a revocation (or the gate's closer),
        // reading the count `Acquire`, sees the owner's changes.
        let d = h.depth.fetch_sub(1, Ordering::Release) - 1;
        if d == 0 {
            // Pairs with the revoker's heavy fence (and the closer's):
            // either it sees the count at zero, or this load sees its
            // mark and wakes it.
            asymmetric::light(self.expedited);
            if h.word.load(Ordering::Relaxed) == REVOKING {
                self.wake_revoker();
            }
            watcher.counted_out();
        }
    }

    /// Wakes the revoker that waits for the owner's last count-out.
    #[cold]
    #[inline(never)]
    fn wake_revoker(&self) {
        // Under the mutex: the revoker checks the count and sleeps under
        // it, so this wake cannot fall between the two.
        let _n = self.handovers.lock();
        self.changed.notify_all();
    }

    #[cold]
    #[inline(never)]
    fn enter_slow(&self, wait: bool, watcher: &impl Watcher) -> Entry {
        let me = thread_id();
        let mut n = self.handovers.lock();
        loop {
            let (mut held, found) = self.revoke(n, wait, Some(me));
            return match found {
                Found::Off => Entry::Off,
                Found::Unclaimed => self.take(&mut held, me, false),
                Found::OwnerOut => self.take(&mut held, me, true),
                Found::OwnerInside => Entry::Revoking,
                Found::Mine => {
                    // Not reached: the bias passes only to the thread
                    // that completes a revocation (`take`, which returns
                    // at once), and `enter` tried ours first. Kept so that
                    // an owner never marks its own bias: inside a call of
                    // its own it would wait for itself.
                    drop(held);
                    if self.count_in(me, watcher) {
                        return Entry::Owner;
                    }
                    n = self.handovers.lock();
                    continue;
                }
            };
        }
    }

    /// The revoker's side of the handshake (module docs), under the
    /// mutex `n`: marks the word `REVOKING` if it names an owner (other
    /// than `me`), fences (heavy), and with `wait` waits until the
    /// owner's calls have ended. Says what it found; the caller completes
    /// a claim or revocation (or not) under the mutex it gets back.
    fn revoke<'a>(
        &'a self,
        mut n: MutexGuard<'a, u32>,
        wait: bool,
        me: Option<u64>,
    ) -> (MutexGuard<'a, u32>, Found) {
        let h = &self.hot;
        loop {
            let found = match h.word.load(Ordering::Acquire) {
                OFF => Found::Off,
                UNCLAIMED => Found::Unclaimed,
                // Acquire: pairs with the owner's last count-out.
                REVOKING if h.depth.load(Ordering::Acquire) == 0 => Found::OwnerOut,
                REVOKING if !wait => Found::OwnerInside,
                REVOKING => {
                    n = self.changed.wait(n);
                    continue;
                }
                w if Some(w) == me => Found::Mine,
                _owner => {
                    h.word.store(REVOKING, Ordering::Relaxed);
                    // Pairs with the owner's light fences (`count_in`,
                    // `exit`): either its count is visible to the load
                    // above in the next round, or it sees the mark.
                    asymmetric::heavy();
                    continue;
                }
            };
            return (n, found);
        }
    }

    /// Completes a claim or a revocation under the mutex (`n`): the bias
    /// passes to the caller, counted in, or (past the handovers) goes
    /// off for good. Wakes every waiter either way.
    fn take(&self, n: &mut u32, me: u64, handover: bool) -> Entry {
        let h = &self.hot;
        if handover {
            *n = n.saturating_add(1);
        }
        let e = if *n <= self.max_handovers {
            // Counted in before the word names us: a revoker that reads
            // the word under the mutex after us sees the count.
            h.depth.fetch_add(1, Ordering::Relaxed);
            h.word.store(me, Ordering::Release);
            Entry::Owner
        } else {
            h.word.store(OFF, Ordering::Release);
            Entry::Off
        };
        self.changed.notify_all();
        e
    }

    /// Turns the bias off for good, revoking it from its owner first (a
    /// request of a slot's bias that reaches beyond the slot: "Slot
    /// biases"). True once it is off; false without `wait` if the owner
    /// is inside a call (wait with [`wait_revoked`](Self::wait_revoked),
    /// then call again). The caller holds no grant of this bias: it never
    /// nests a request in its own (see [`owner_grant`](Self::owner_grant)).
    #[inline]
    pub(crate) fn end(&self, wait: bool) -> bool {
        self.is_off() || self.end_slow(wait)
    }

    #[cold]
    #[inline(never)]
    fn end_slow(&self, wait: bool) -> bool {
        // As `enter_slow`'s revoker, even if the caller owns it: it is
        // inside no call of it, so its count is zero.
        let (mut n, found) = self.revoke(self.handovers.lock(), wait, None);
        match found {
            Found::Off => return true,
            Found::OwnerInside => return false,
            Found::Unclaimed | Found::OwnerOut => {}
            Found::Mine => unreachable!("a revoker without an id finds none its own"),
        }
        *n = n.saturating_add(1);
        self.hot.word.store(OFF, Ordering::Release);
        self.changed.notify_all();
        true
    }

    /// Waits until a revocation that [`Entry::Revoking`] reported can
    /// complete (the owner's calls ended) or has completed.
    pub(crate) fn wait_revoked(&self) {
        let h = &self.hot;
        let mut n = self.handovers.lock();
        while h.word.load(Ordering::Acquire) == REVOKING && h.depth.load(Ordering::Acquire) != 0 {
            n = self.changed.wait(n);
        }
    }
}

#[cfg(all(test, not(aspace_loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering as O};
    use std::sync::Arc;

    #[test]
    fn the_first_thread_owns_others_revoke_and_it_ends_after_the_handovers() {
        let b = Arc::new(Bias::new(true, DEFAULT_HANDOVERS));
        assert!(b.likely_mine(), "unclaimed");
        assert_eq!(b.enter(true, &()), Entry::Owner, "the first request claims");
        assert_eq!(b.enter(false, &()), Entry::Owner, "nested");
        b.exit(&());
        b.exit(&());
        assert!(b.likely_mine() && !b.is_off());
        let other = |b: &Arc<Bias>| {
            let b = b.clone();
            std::thread::spawn(move || {
                let e = b.enter(false, &());
                if e == Entry::Owner {
                    b.exit(&());
                }
                e
            })
            .join()
            .unwrap()
        };
        // Each new thread's request finds the owner out of its calls and
        // takes the bias at once, until the handovers are spent.
        for round in 1..=DEFAULT_HANDOVERS {
            assert_eq!(other(&b), Entry::Owner, "handover {round}");
            assert!(!b.likely_mine() && !b.is_off());
        }
        assert_eq!(other(&b), Entry::Off);
        assert!(b.is_off() && !b.likely_mine());
        assert_eq!(b.enter(true, &()), Entry::Off);
        assert_eq!(Bias::new(false, 1).enter(true, &()), Entry::Off);
        let once = Arc::new(Bias::new(true, 0));
        assert_eq!(once.enter(true, &()), Entry::Owner);
        once.exit(&());
        assert_eq!(
            other(&once),
            Entry::Off,
            "no handover: the first revocation ends it"
        );
    }

    #[test]
    fn a_revoker_waits_for_the_owners_call_and_a_try_does_not() {
        let b = Arc::new(Bias::new(true, DEFAULT_HANDOVERS));
        assert_eq!(b.enter(true, &()), Entry::Owner);
        let b2 = b.clone();
        let tried = std::thread::spawn(move || b2.enter(false, &()))
            .join()
            .unwrap();
        assert_eq!(tried, Entry::Revoking, "the owner is inside its call");
        let done = Arc::new(AtomicBool::new(false));
        let (b3, d3) = (b.clone(), done.clone());
        let t = std::thread::spawn(move || {
            b3.wait_revoked();
            let e = b3.enter(true, &());
            d3.store(true, O::SeqCst);
            if e == Entry::Owner {
                b3.exit(&());
            }
            e
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!done.load(O::SeqCst), "revoked while the owner was inside");
        assert_eq!(b.enter(false, &()), Entry::Revoking, "no entry once marked");
        b.exit(&());
        assert_eq!(t.join().unwrap(), Entry::Owner, "passed to the revoker");
    }
}
