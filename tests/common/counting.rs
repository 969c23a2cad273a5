//! A global allocator that counts what the calling thread allocates while
//! [`counted`] runs (tests run in parallel, so other threads' allocations
//! are not counted): how many, their bytes, the largest, and which are
//! not freed yet. A test binary installs it with
//! `#[path = "common/counting.rs"] mod counting;` and
//! `#[global_allocator] static ALLOC: counting::Counting = counting::Counting;`.
#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The allocator: the system's, with the calling thread's bookkeeping.
pub struct Counting;

/// Allocations tracked at once by [`still_live`] (more is a test failure).
const TRACKED: usize = 32;

/// What [`counted`] saw.
#[derive(Clone, Copy, Debug, Default)]
pub struct Counted {
    /// Allocations made.
    pub allocs: usize,
    /// Their bytes.
    pub bytes: usize,
    /// The largest one's bytes.
    pub largest: usize,
}

thread_local! {
    /// Whether this thread counts now.
    static ON: Cell<bool> = const { Cell::new(false) };
    /// What this thread's counted allocations were.
    static SEEN: Cell<Counted> = const {
        Cell::new(Counted { allocs: 0, bytes: 0, largest: 0 })
    };
    /// Addresses of this thread's counted allocations not yet freed (0:
    /// empty slot; `usize::MAX` in slot 0: overflow).
    static LIVE: Cell<[usize; TRACKED]> = const { Cell::new([0; TRACKED]) };
}

fn note_alloc(p: *mut u8, size: usize) {
    // `try_with`: the thread-locals may be gone while a thread exits.
    if p.is_null() || !ON.try_with(Cell::get).unwrap_or(false) {
        return;
    }
    SEEN.with(|s| {
        let c = s.get();
        s.set(Counted {
            allocs: c.allocs + 1,
            bytes: c.bytes + size,
            largest: c.largest.max(size),
        })
    });
    let mut live = LIVE.with(Cell::get);
    match live.iter().position(|&a| a == 0) {
        Some(i) => live[i] = p as usize,
        None => live[0] = usize::MAX,
    }
    LIVE.with(|l| l.set(live));
}

fn note_free(p: *mut u8) {
    let _ = LIVE.try_with(|l| {
        let mut live = l.get();
        if let Some(i) = live.iter().position(|&a| a == p as usize) {
            live[i] = 0;
            l.set(live);
        }
    });
}

// SAFETY: forwards to the system allocator; the bookkeeping allocates
// nothing (const-initialized thread-local cells). `alloc_zeroed` and
// `realloc` keep their default bodies, which call these two.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is the system allocator's.
        let p = unsafe { System.alloc(l) };
        note_alloc(p, l.size());
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        note_free(p);
        // SAFETY: as for alloc.
        unsafe { System.dealloc(p, l) }
    }
}

/// Runs `f` and returns its value and what it allocated on this thread;
/// those allocations are tracked until freed (see [`still_live`]).
pub fn counted<R>(f: impl FnOnce() -> R) -> (R, Counted) {
    LIVE.with(|l| l.set([0; TRACKED]));
    SEEN.with(|s| s.set(Counted::default()));
    ON.with(|o| o.set(true));
    let r = f();
    ON.with(|o| o.set(false));
    (r, SEEN.with(Cell::get))
}

/// How many of the allocations of the last [`counted`] are not freed yet.
pub fn still_live() -> usize {
    let live = LIVE.with(Cell::get);
    assert_ne!(live[0], usize::MAX, "more than {TRACKED} allocations");
    live.iter().filter(|&&a| a != 0).count()
}
