//! Accounts: the budgets that share one physical memory.
//!
//! A [`FrameAllocator`](super::FrameAllocator) is an account (a [`Budget`],
//! which also counts the data frames charged to it, in its per-CPU slots:
//! see `budget`) over a physical memory
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
//! through another account looks its owner's budget up in the registry
//! under the registry's lock, uncharges and counts the frame out there,
//! and then, under the lock again, frees the owner's slot if the owner's
//! allocator is gone and that was its last frame. An account whose
//! allocator was dropped while frames it charged live on stays in the
//! registry (as a zombie memcg does) until the last of them is freed;
//! only then is its number reused, so a record never names another
//! account. (Whichever of that last free and the allocator's drop takes
//! the lock second sees the frame counted out and frees the slot: the
//! count is written before the lock is taken.)
//!
//! # Locking
//!
//! The registry's mutex is a leaf of the frame allocator's locks: taken
//! with no other lock of `phys` held, and nothing is taken under it but
//! the budget's atomics.

use super::Budget;
use crate::sync::counter::{AtomicU64 as CounterU64, Ordering as CounterOrdering};
use crate::sync::{Arc, Mutex};

/// A registry slot: the account's budget (which also counts its data
/// frames), and whether its allocator still lives.
struct Slot {
    budget: Arc<Budget>,
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
    pub(super) fn register(&self, budget: Arc<Budget>) -> u32 {
        let mut slots = self.slots.lock();
        self.limits
            .fetch_add(budget.limit(), CounterOrdering::Relaxed);
        let slot = Some(Slot { budget, live: true });
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
                .fetch_sub(s.budget.limit(), CounterOrdering::Relaxed);
            if s.budget.frames() == 0 {
                slots[id as usize] = None;
            }
        }
    }

    /// The budget of account `id`, for a frame of it freed through
    /// another account.
    pub(super) fn budget(&self, id: u32) -> Option<Arc<Budget>> {
        let slots = self.slots.lock();
        let s = slots.get(id as usize).and_then(Option::as_ref);
        debug_assert!(s.is_some(), "frame charged to no account {id}");
        s.map(|s| s.budget.clone())
    }

    /// A frame of account `id` (whose budget is `budget`) was freed
    /// through another account and counted out: frees the slot if the
    /// account's allocator is gone and that was its last frame.
    pub(super) fn settle(&self, id: u32, budget: &Arc<Budget>) {
        let mut slots = self.slots.lock();
        if let Some(Some(s)) = slots.get(id as usize) {
            // `retire`, seeing our frame counted out already, may have
            // freed the slot, and another account taken the number.
            if !s.live && Arc::ptr_eq(&s.budget, budget) && budget.frames() == 0 {
                slots[id as usize] = None;
            }
        }
    }

    /// Sum of the live accounts' limits (what the caches may keep resident
    /// is a fraction of it).
    pub(super) fn live_limits(&self) -> u64 {
        self.limits.load(CounterOrdering::Relaxed)
    }
}
