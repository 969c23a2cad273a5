//! Accounts: the budgets that share one physical memory.
//!
//! A [`FrameAllocator`](super::FrameAllocator) is an account (a [`Budget`]
//! and a count of the data frames charged to it) over a physical memory
//! (`Phys`: the chunks, the caches, the reference counts). Several
//! allocators may share one physical memory, each with its own budget, so
//! that a frame one of them allocated can be mapped by a space charged to
//! another (memory objects and the address spaces mapping them: see
//! [`crate::memfd`]'s `# Charging`).
//!
//! Each data frame records the account it was charged to (its number in
//! the physical memory's registry), and is uncharged from that account
//! when its last reference goes, whoever drops it (as Linux's
//! `folio->memcg_data`). The common case, a frame freed through its own
//! account, reads the record and touches nothing shared; a frame freed
//! through another account looks its owner up in the registry under the
//! registry's lock. An account whose allocator was dropped while frames it
//! charged live on stays in the registry (as a zombie memcg does) until
//! the last of them is freed; only then is its number reused, so a
//! record never names another account.
//!
//! # Locking
//!
//! The registry's mutex is a leaf of the frame allocator's locks: taken
//! with no other lock of `phys` held, and nothing is taken under it but
//! the budget's atomics.

use super::Budget;
use crate::percpu::PerCpu;
use crate::sync::counter::{AtomicU64 as CounterU64, Ordering as CounterOrdering};
use crate::sync::{Arc, Mutex};

/// One account: a budget and the data frames charged to it.
pub(super) struct Account {
    /// The budget its frames, page tables and metadata are charged to.
    ///
    /// Protected by: immutable after creation (the budget is atomics).
    pub(super) budget: Arc<Budget>,
    /// Data frames charged, and uncharged, per CPU slot.
    ///
    /// Protected by: counter atomics, `Relaxed` (statistics of this
    /// account; the zombie check reads them under the registry's lock,
    /// where every uncharge of a zombie happens).
    allocs: PerCpu<CounterU64>,
    /// See `allocs`.
    frees: PerCpu<CounterU64>,
}

impl Account {
    pub(super) fn new(limit: u64) -> Self {
        Account {
            budget: Arc::new(Budget::new(limit)),
            allocs: PerCpu::new(|| CounterU64::new(0)),
            frees: PerCpu::new(|| CounterU64::new(0)),
        }
    }

    /// Counts a data frame charged to this account.
    #[inline]
    pub(super) fn count_alloc(&self) {
        self.allocs.local().fetch_add(1, CounterOrdering::Relaxed);
    }

    /// Uncharges a data frame of this account.
    #[inline]
    pub(super) fn uncharge_frame(&self) {
        self.budget.uncharge(crate::addr::PAGE_SIZE);
        self.frees.local().fetch_add(1, CounterOrdering::Relaxed);
    }

    /// Data frames charged now.
    pub(super) fn frames(&self) -> u64 {
        let sum = |c: &PerCpu<CounterU64>| -> u64 {
            c.iter()
                .map(|x| x.load(CounterOrdering::Relaxed))
                .fold(0u64, u64::wrapping_add)
        };
        sum(&self.allocs)
            .wrapping_sub(sum(&self.frees))
            .min(i64::MAX as u64)
    }
}

/// A registry slot: the account, and whether its allocator still lives.
struct Slot {
    account: Arc<Account>,
    live: bool,
}

/// The accounts of one physical memory, by number.
pub(super) struct Registry {
    /// Protected by: its mutex (see the module's `# Locking`).
    slots: Mutex<Vec<Option<Slot>>>,
    /// Sum of the live accounts' limits.
    ///
    /// Protected by: a counter atomic, changed under `slots`' mutex, read
    /// `Relaxed` (a sizing hint for the caches).
    limits: CounterU64,
}

impl Registry {
    pub(super) fn new() -> Self {
        Registry {
            slots: Mutex::new(Vec::new()),
            limits: CounterU64::new(0),
        }
    }

    /// Files a new account; returns its number.
    pub(super) fn register(&self, account: Arc<Account>) -> u32 {
        let mut slots = self.slots.lock();
        self.limits
            .fetch_add(account.budget.limit(), CounterOrdering::Relaxed);
        let slot = Some(Slot {
            account,
            live: true,
        });
        if let Some(i) = slots.iter().position(Option::is_none) {
            slots[i] = slot;
            return i as u32;
        }
        slots.push(slot);
        (slots.len() - 1) as u32
    }

    /// The allocator of account `id` is gone: the slot is freed now if no
    /// frame it charged lives, else by the free of the last one.
    pub(super) fn retire(&self, id: u32) {
        let mut slots = self.slots.lock();
        if let Some(Some(s)) = slots.get_mut(id as usize) {
            s.live = false;
            self.limits
                .fetch_sub(s.account.budget.limit(), CounterOrdering::Relaxed);
            if s.account.frames() == 0 {
                slots[id as usize] = None;
            }
        }
    }

    /// Uncharges a frame of account `id` freed through another account.
    pub(super) fn uncharge_foreign(&self, id: u32) {
        let mut slots = self.slots.lock();
        let Some(Some(s)) = slots.get(id as usize) else {
            debug_assert!(false, "frame charged to no account {id}");
            return;
        };
        s.account.uncharge_frame();
        if !s.live && s.account.frames() == 0 {
            slots[id as usize] = None;
        }
    }

    /// Sum of the live accounts' limits (what the caches may keep resident
    /// is a fraction of it).
    pub(super) fn live_limits(&self) -> u64 {
        self.limits.load(CounterOrdering::Relaxed)
    }
}
