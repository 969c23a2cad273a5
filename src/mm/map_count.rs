//! The number of VMAs (`mm->map_count`), counted where its writers are.
//!
//! With one writer at a time (the mmap_lock modes, and a whole-space
//! writer in range mode) the count is one total, and every read is exact.
//! Range-locked writers change it at once, and one count would be a line
//! that writers on disjoint ranges all write; so each counts in a part of
//! its own, which folds its changes into the shared total when they pass
//! [`MapCount::BATCH`] either way. The total is then within `BATCH` per
//! part of the count, and a limit check reads only the total unless it is
//! that close to the limit. Two kinds of part:
//!
//! - a CPU's (`percpu`), for a range writer of a neighbourhood: shared by
//!   the threads of that CPU, so a locked read-modify-write;
//! - a slot's, for the owner of that slot's bias ("Slot biases" in
//!   `range_bias`): only the owner writes it, while its grant lasts, so a
//!   load and a store, on a line no other writer touches. The bias orders
//!   one owner's last change before the next owner's first (the owner's
//!   `Release` count-out, the grant's `Acquire`), and before every
//!   whole-space holder's read (the gate's closer waits for the owners'
//!   counts). At one thread, writers-only, the CPU's part cost the slot
//!   owner's instantiation about 2% against the total alone
//!   (`docs/RESULTS.md`, "The slot owner's map count").
//!
//! The count is a statistic of the writers (`sync::counter` atomics): its
//! value after every writer is what one writer after another makes.

use crate::percpu::PerCpu;
use crate::sync::counter::{AtomicI64, Ordering::Relaxed};

/// Where a writer counts its VMAs ([`MapCount::add`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MapCounter {
    /// The total: a writer with the space to itself.
    Total,
    /// Its CPU's part: a range writer of a neighbourhood.
    Cpu,
    /// Slot `k`'s part: the owner of that slot's bias.
    SlotOwner(usize),
}

/// A slot's part of the count ([`MapCount::owners`]).
#[derive(Default)]
struct OwnerPart {
    /// Changes not yet in the total.
    count: AtomicI64,
    /// 1 once an owner counted here: the limit checks' slack counts the
    /// slots used, not every slot.
    used: AtomicI64,
}

/// The map count (see the module docs).
pub(crate) struct MapCount {
    /// Each CPU's changes not yet in `total`; `None` without range
    /// writers.
    /// Protected by: counter atomics, read-modify-written (a part is
    /// shared by the threads of its CPU, `percpu`).
    cpus: Option<PerCpu<AtomicI64>>,
    /// Each slot's changes by its bias's owner not yet in `total`
    /// (allocated by the first owner's change); `None` without range
    /// writers.
    /// Protected by: written (a load and a store) only by the owner of
    /// the slot's bias while it holds that bias's grant (module docs);
    /// read by anyone.
    owners: Option<PerCpu<OwnerPart>>,
    /// How many of `owners` were ever used.
    /// Protected by: a counter atomic, added to once per slot.
    owners_used: AtomicI64,
    /// The folded count.
    /// Protected by: a counter atomic.
    total: AtomicI64,
}

impl MapCount {
    /// A part's changes kept before they are folded into the total.
    const BATCH: i64 = 32;

    /// The most VMAs a range writer's call adds (an mremap's check asks
    /// for room for six, Linux's `map_count >= max - 5`).
    const RANGE_WORST: i64 = 6;

    /// Range writers at the limit at once that [`far_below`]'s margin
    /// covers.
    ///
    /// [`far_below`]: Self::far_below
    const IN_FLIGHT: i64 = 1024;

    /// Zero VMAs, counted in parts with range writers (per CPU, and for
    /// the owners of the biases of the range lock's `slots`, if given);
    /// allocates nothing until the first change.
    pub(crate) fn new(slots: Option<usize>) -> Self {
        MapCount {
            cpus: slots.map(|_| PerCpu::new(Default::default)),
            owners: slots.map(|n| PerCpu::indexed(n, Default::default)),
            owners_used: AtomicI64::new(0),
            total: AtomicI64::new(0),
        }
    }

    /// The parts that may hold changes not in the total: every CPU's,
    /// and every slot's an owner used.
    fn parts(&self) -> i64 {
        let cpus = self.cpus.as_ref().map_or(0, PerCpu::len) as i64;
        cpus + self.owners_used.load(Relaxed)
    }

    /// True if the count is so far below `limit` that range writers in
    /// flight cannot reach it: a range writer admitted only then checks
    /// the limit as if alone. Range writers check a count that others
    /// change at the same time, so two at the limit could each pass its
    /// check and together pass the limit; so each is admitted, once
    /// granted its range, only if the total, with every part's largest
    /// unfolded share and a margin of [`IN_FLIGHT`] calls of
    /// [`RANGE_WORST`] VMAs (a quarter of the limit if that is less),
    /// stays below the limit. Otherwise it runs as a whole-space writer,
    /// which reads the count exactly (`Edit::begin_range`, and
    /// `begin_range_mmap` for a placed mapping). The limit
    /// holds exactly unless more range writers than the margin covers
    /// are between their admission and their last change at once. Two
    /// loads (the total, the slots used); always true without range
    /// writers.
    ///
    /// [`IN_FLIGHT`]: Self::IN_FLIGHT
    /// [`RANGE_WORST`]: Self::RANGE_WORST
    pub(crate) fn far_below(&self, limit: usize) -> bool {
        if self.cpus.is_none() {
            return true;
        }
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let margin = (Self::RANGE_WORST * Self::IN_FLIGHT).min(limit / 4);
        let slack = (Self::BATCH + Self::RANGE_WORST) * self.parts();
        self.total
            .load(Relaxed)
            .saturating_add(slack)
            .saturating_add(margin)
            < limit
    }

    /// Adds `n` (may be negative) in `to`.
    #[inline]
    pub(crate) fn add(&self, n: isize, to: MapCounter) {
        let n = n as i64;
        match (to, &self.cpus, &self.owners) {
            (MapCounter::Cpu, Some(cpus), _) => {
                let s = cpus.local();
                let v = s.fetch_add(n, Relaxed) + n;
                if v.abs() > Self::BATCH {
                    self.total.fetch_add(s.swap(0, Relaxed), Relaxed);
                }
            }
            (MapCounter::SlotOwner(k), _, Some(owners)) => self.add_owner(owners.get(k), n),
            // The total, for a writer with the space to itself, whose
            // line is no one else's (every count remains the total plus
            // the parts'). The only writer of the total while it runs
            // (range writers, who fold their parts into it, are kept out
            // by its hold, which also orders it after them), so a load
            // and a store: no locked read-modify-write on every mmap and
            // munmap. Without range writers, every writer is one.
            _ => {
                let t = self.total.load(Relaxed);
                self.total.store(t + n, Relaxed);
            }
        }
    }

    /// Adds `n` to a slot's part, `p`, by its bias's owner: a load and a
    /// store (only the owner writes it), and the fold's read-modify-write
    /// of the total when it passes [`BATCH`](Self::BATCH).
    #[inline]
    fn add_owner(&self, p: &OwnerPart, n: i64) {
        if p.used.load(Relaxed) == 0 {
            p.used.store(1, Relaxed);
            self.owners_used.fetch_add(1, Relaxed);
        }
        let v = p.count.load(Relaxed) + n;
        if v.abs() > Self::BATCH {
            self.total.fetch_add(v, Relaxed);
            p.count.store(0, Relaxed);
        } else {
            p.count.store(v, Relaxed);
        }
    }

    /// The count: the total and every part's share of it.
    pub(crate) fn get(&self) -> usize {
        let cpus: i64 = self
            .cpus
            .iter()
            .flat_map(|s| s.iter())
            .map(|s| s.load(Relaxed))
            .sum();
        let owners: i64 = self
            .owners
            .iter()
            .flat_map(|s| s.iter())
            .map(|s| s.count.load(Relaxed))
            .sum();
        usize::try_from(self.total.load(Relaxed) + cpus + owners).unwrap_or(0)
    }

    /// True if the count is at least `limit`: the total alone decides
    /// unless it lies within the parts' slack of `limit`.
    pub(crate) fn at_least(&self, limit: usize) -> bool {
        let slack = Self::BATCH * self.parts();
        let (t, limit) = (self.total.load(Relaxed), limit as i64);
        if t + slack < limit {
            false
        } else if t - slack >= limit {
            true
        } else {
            self.get() as i64 >= limit
        }
    }
}

#[cfg(all(test, not(aspace_loom)))]
mod tests {
    use super::*;

    #[test]
    fn every_part_adds_up_to_the_count() {
        let c = MapCount::new(Some(4));
        c.add(3, MapCounter::Total);
        c.add(2, MapCounter::Cpu);
        c.add(5, MapCounter::SlotOwner(1));
        c.add(-1, MapCounter::SlotOwner(3));
        assert_eq!(c.get(), 9);
        // Past the batch, a slot's part folds into the total.
        for _ in 0..40 {
            c.add(1, MapCounter::SlotOwner(1));
        }
        assert_eq!(c.get(), 49);
        assert!(c.owners.as_ref().unwrap().get(1).count.load(Relaxed).abs() <= MapCount::BATCH);
        assert!(c.total.load(Relaxed) >= 3 + 45 - MapCount::BATCH);
    }

    #[test]
    fn the_slack_counts_the_slots_used() {
        let c = MapCount::new(Some(256));
        let cpus = c.cpus.as_ref().unwrap().len() as i64;
        assert_eq!(c.parts(), cpus);
        c.add(1, MapCounter::SlotOwner(7));
        c.add(1, MapCounter::SlotOwner(7));
        c.add(1, MapCounter::SlotOwner(200));
        assert_eq!(c.parts(), cpus + 2);
        // Near the limit the check reads every part.
        assert!(c.at_least(3));
        assert!(!c.at_least(4));
    }

    #[test]
    fn one_writer_at_a_time_counts_the_total_alone() {
        let c = MapCount::new(None);
        c.add(2, MapCounter::Total);
        c.add(-1, MapCounter::Total);
        assert_eq!((c.get(), c.total.load(Relaxed)), (1, 1));
        assert!(c.far_below(2));
        assert!(c.at_least(1) && !c.at_least(2));
    }
}
