//! The memory budget: bytes of frames, table pages and metadata charged
//! against one limit, through per-CPU stocks; and, for the account it
//! belongs to, the count of data frames charged.
//!
//! The frame count lives in the stock's per-CPU slot, a line the charge
//! writes anyway, and is written under the frame cache's lock with a load
//! and a store, so counting a frame adds neither a line nor a locked
//! instruction to the fault path.
//!
//! Lines written: a charge (of a frame, a table page or a VMA's metadata)
//! and an uncharge write only their CPU slot's stock while it holds
//! enough and stays under two batches; metadata charges take from the
//! stock too ([`Budget::force_charge`]), and a writer's room check reads
//! only that stock when it holds the bytes ([`Budget::has_room`]), so an
//! mmap, mprotect or munmap loop on one CPU writes no shared line here.
//! The shared count is written when a stock runs dry (a batch taken; a
//! forced charge larger than the stock adds its bytes alone, since it may
//! pass the limit), when an uncharge leaves more than two batches in
//! stock (the excess given back), and when a charge that finds the count
//! full drains every stock. The exact room check (the stock short of the
//! bytes, as for fork's many VMAs) and [`Budget::used`] read every slot.

use crate::addr::PAGE_SIZE;
use crate::percpu::{cpu_id, PerCpu};
use crate::sync::counter::AtomicU64 as CounterU64;
use crate::sync::Ordering;

/// Bytes a CPU slot of a [`Budget`] takes from the shared count at once,
/// so that most charges write only the CPU's own cache line (1 MiB: a
/// thread faulting fresh pages writes the shared count once per 256).
pub(super) const STOCK_BATCH: u64 = 256 * PAGE_SIZE;

/// A memory budget: bytes charged by frames in use, page-table pages and
/// metadata, against a limit.
///
/// Charges are taken from a per-CPU stock refilled from the shared count in
/// batches (like memcg's per-CPU stock), so the common charge and uncharge
/// write no shared cache line. The shared count includes the stocks, so the
/// memory really in use never exceeds the limit (forced charges aside); a
/// charge that finds the shared count full drains every stock before it
/// fails.
pub struct Budget {
    /// The limit in bytes.
    ///
    /// Protected by: immutable after creation.
    limit: u64,
    /// Bytes charged, stocks included.
    ///
    /// Protected by: a counter atomic (`sync::counter`), `Relaxed`: the
    /// limit check is one read-modify-write, and nothing is ordered by it.
    charged: CounterU64,
    /// Each CPU slot's stock and frame counts.
    ///
    /// Protected by: see [`Slot`].
    slots: PerCpu<Slot>,
}

/// One CPU slot of a [`Budget`].
#[derive(Default)]
struct Slot {
    /// Bytes this slot took from `charged` and has not used yet.
    ///
    /// Protected by: a counter atomic, `Relaxed`, read-modify-written (a
    /// slot is shared by the threads of its CPU; see [`crate::percpu`]).
    stock: CounterU64,
    /// Data frames charged through this slot (taken from the frame cache
    /// of the same slot of the physical memory).
    ///
    /// Protected by: written only under the lock of that frame cache
    /// (`CpuFrames::cache`), by a `Relaxed` load and store (the lock
    /// serializes every writer; no locked add); read `Relaxed` by
    /// [`frames`](Budget::frames).
    frames_in: CounterU64,
    /// Data frames uncharged through this slot (freed into that cache).
    ///
    /// Protected by: as `frames_in`.
    frames_out: CounterU64,
}

impl core::fmt::Debug for Budget {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Budget")
            .field("limit", &self.limit)
            .field("used", &self.used())
            .finish()
    }
}

impl Budget {
    /// A budget of `limit` bytes.
    pub(crate) fn new(limit: u64) -> Self {
        Budget {
            limit,
            charged: CounterU64::new(0),
            slots: PerCpu::new(Slot::default),
        }
    }

    /// The limit in bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Charges `bytes`; false (and nothing charged) if that would pass the
    /// limit.
    pub(crate) fn try_charge(&self, bytes: u64) -> bool {
        let s = &self.slots.local().stock;
        if take_stock(s, bytes) {
            return true;
        }
        if let Some(more) = bytes.checked_add(STOCK_BATCH) {
            if self.reserve(more) {
                s.fetch_add(STOCK_BATCH, Ordering::Relaxed);
                return true;
            }
        }
        if self.reserve(bytes) {
            return true;
        }
        // Full: what other CPUs hold in stock is not in use.
        for st in self.slots.iter() {
            let x = st.stock.swap(0, Ordering::Relaxed);
            if x > 0 {
                self.charged.fetch_sub(x, Ordering::Relaxed);
            }
        }
        self.reserve(bytes)
    }

    /// Charges `bytes` even past the limit, for memory a caller cannot do
    /// without: an address space's root table, mremap's destination tables
    /// (its source tables are freed right after), and VMAs whose room was
    /// checked just before ([`has_room`](Self::has_room)). Taken from the
    /// CPU's stock when it holds them (which passes no limit: they are
    /// charged already), else added to the shared count.
    #[inline]
    pub(crate) fn force_charge(&self, bytes: u64) {
        self.force_charge_on(cpu_id(), bytes)
    }

    /// [`force_charge`](Self::force_charge) through CPU slot `cpu`, for a
    /// caller that read its CPU once for several per-CPU structures (any
    /// slot is correct; the caller's own keeps the line local).
    #[inline]
    pub(crate) fn force_charge_on(&self, cpu: usize, bytes: u64) {
        if !take_stock(&self.slots.get(cpu).stock, bytes) {
            self.charged.fetch_add(bytes, Ordering::Relaxed);
        }
    }

    /// True if `bytes` could be charged now (a hint: others may charge
    /// before the caller does). At once if the CPU's stock holds them:
    /// charging them from there does not add to the shared count, so it
    /// cannot take it past the limit. Else the exact check, which reads
    /// every CPU's stock. Makes no slots (an idle space's fork checks
    /// room before anything is charged).
    #[inline]
    pub(crate) fn has_room(&self, bytes: u64) -> bool {
        let local = self
            .slots
            .local_if_made()
            .map_or(0, |s| s.stock.load(Ordering::Relaxed));
        local >= bytes
            || self
                .used()
                .checked_add(bytes)
                .is_some_and(|t| t <= self.limit)
    }

    /// The shared count (stocks included), for tests of what a charge
    /// writes.
    #[cfg(test)]
    pub(super) fn shared(&self) -> u64 {
        self.charged.load(Ordering::Relaxed)
    }

    fn reserve(&self, bytes: u64) -> bool {
        self.charged
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
                c.checked_add(bytes).filter(|&t| t <= self.limit)
            })
            .is_ok()
    }

    /// Gives back `bytes` charged earlier.
    pub(crate) fn uncharge(&self, bytes: u64) {
        self.uncharge_on(cpu_id(), bytes)
    }

    /// [`uncharge`](Self::uncharge) through CPU slot `cpu` (as for
    /// [`force_charge_on`](Self::force_charge_on)).
    pub(crate) fn uncharge_on(&self, cpu: usize, bytes: u64) {
        let s = &self.slots.get(cpu).stock;
        let mut cur = s.fetch_add(bytes, Ordering::Relaxed) + bytes;
        // Keep one batch in stock; return the rest to the shared count.
        while cur > 2 * STOCK_BATCH {
            match s.compare_exchange_weak(cur, STOCK_BATCH, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => {
                    self.charged.fetch_sub(cur - STOCK_BATCH, Ordering::Relaxed);
                    return;
                }
                Err(c) => cur = c,
            }
        }
    }

    /// Bytes charged now (stocks not counted).
    pub fn used(&self) -> u64 {
        let stock: u64 = self
            .slots
            .iter()
            .map(|s| s.stock.load(Ordering::Relaxed))
            .sum();
        self.charged.load(Ordering::Relaxed).saturating_sub(stock)
    }

    /// Counts a data frame charged (`out` false) or uncharged (`out`
    /// true) through CPU slot `cpu`. The caller holds the lock of the frame
    /// cache of slot `cpu` of the physical memory, which every writer of
    /// the slot's counts holds.
    #[inline]
    pub(super) fn count_frame(&self, cpu: usize, out: bool) {
        let s = self.slots.get(cpu);
        let count = if out { &s.frames_out } else { &s.frames_in };
        count.store(
            count.load(Ordering::Relaxed).wrapping_add(1),
            Ordering::Relaxed,
        );
    }

    /// Counts `n` data frames as [`count_frame`](Self::count_frame) does
    /// one (a huge frame's 512).
    pub(super) fn count_frames(&self, cpu: usize, out: bool, n: u64) {
        let s = self.slots.get(cpu);
        let count = if out { &s.frames_out } else { &s.frames_in };
        count.store(
            count.load(Ordering::Relaxed).wrapping_add(n),
            Ordering::Relaxed,
        );
    }

    /// Data frames charged now (of the account this budget belongs to).
    pub(super) fn frames(&self) -> u64 {
        let (mut a, mut f) = (0u64, 0u64);
        for s in self.slots.iter() {
            a = a.wrapping_add(s.frames_in.load(Ordering::Relaxed));
            f = f.wrapping_add(s.frames_out.load(Ordering::Relaxed));
        }
        a.wrapping_sub(f).min(i64::MAX as u64)
    }
}

/// Takes `bytes` from stock `s`, if it holds them (they are charged
/// already: the shared count does not change).
#[inline]
fn take_stock(s: &CounterU64, bytes: u64) -> bool {
    let mut cur = s.load(Ordering::Relaxed);
    while cur >= bytes {
        match s.compare_exchange_weak(cur, cur - bytes, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return true,
            Err(c) => cur = c,
        }
    }
    false
}
