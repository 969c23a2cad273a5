//! TLB model: the CPUs of an address space, shootdowns, and an
//! mmu_gather-style batch of flushes and frames to free.
//!
//! Every thread that faults on or accesses an address space becomes one of
//! its CPUs (a per-CPU flag, set once, so the mask costs no shared write).
//! A user-mode access (`read`/`write`) is the simulated "TLB entry": while
//! it translates an address and copies bytes, its CPU's access sequence is
//! odd. A flush sends a shootdown to every other CPU in the mask and waits
//! until each one is outside any access it began before the flush, exactly
//! what an IPI-based flush guarantees. Only then are the gathered frames
//! freed, so a frame is never reused while an old translation of it may
//! still be in use.

use crate::addr::Range;
use crate::percpu::{cpu_id, PerCpu};
use crate::phys::{FrameAllocator, Pfn};
use crate::stats::{Event, StatCounters};
use crate::sync::{fence, spin_hint, wait_until, AtomicBool, AtomicU64, Ordering};

/// Frames gathered before a flush is forced (bounds the batch's memory).
const GATHER_MAX_FRAMES: usize = 4096;

/// One CPU's view of an address space.
#[derive(Default)]
pub(crate) struct CpuSlot {
    in_mask: AtomicBool,
    access_seq: AtomicU64,
}

/// The CPUs of one address space.
pub(crate) struct TlbState {
    cpus: PerCpu<CpuSlot>,
    /// Simulated cost of one shootdown, in nanoseconds (0 = off).
    shootdown_cost_ns: u64,
}

/// While alive, the calling CPU is inside a user-mode access.
pub(crate) struct AccessGuard<'a> {
    slot: &'a CpuSlot,
}

impl Drop for AccessGuard<'_> {
    fn drop(&mut self) {
        // Release: the copy happens before a flusher sees the even value.
        self.slot.access_seq.fetch_add(1, Ordering::Release);
    }
}

impl TlbState {
    pub(crate) fn new(shootdown_cost_ns: u64) -> Self {
        TlbState {
            cpus: PerCpu::new(CpuSlot::default),
            shootdown_cost_ns,
        }
    }

    /// Adds the calling CPU to the mask (once: a load, then a store only
    /// the first time, so the hot path writes nothing shared).
    #[inline]
    pub(crate) fn note_cpu(&self) {
        let slot = self.cpus.local();
        if !slot.in_mask.load(Ordering::Relaxed) {
            slot.in_mask.store(true, Ordering::Relaxed);
        }
    }

    /// Begins a user-mode access on this CPU.
    #[inline]
    pub(crate) fn begin_access(&self) -> AccessGuard<'_> {
        let slot = self.cpus.local();
        if !slot.in_mask.load(Ordering::Relaxed) {
            slot.in_mask.store(true, Ordering::Relaxed);
        }
        // Threads outnumber CPU slots, so two threads may share one; a CPU
        // runs one user access at a time, so wait for the slot to be free
        // (even) and make it odd. Two unserialized accesses would leave
        // the sequence even and a flush would not wait for either.
        loop {
            let seq = slot.access_seq.load(Ordering::Relaxed);
            if seq & 1 == 0
                && slot
                    .access_seq
                    .compare_exchange_weak(seq, seq + 1, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
            {
                break;
            }
            spin_hint();
        }
        // Pairs with the fence in `flush`: either the flusher sees our odd
        // sequence, or we see the page-table change it made before it.
        fence(Ordering::SeqCst);
        AccessGuard { slot }
    }

    /// Flushes `pages` pages of translations on every CPU of the mask:
    /// counts the flush and one shootdown per other CPU, and waits for each
    /// to leave any access that began before this call.
    pub(crate) fn flush(&self, stats: &StatCounters, pages: u64) {
        fence(Ordering::SeqCst);
        stats.inc(Event::tlb_flushes);
        stats.add(Event::tlb_pages_flushed, pages);
        let me = cpu_id() % self.cpus.len();
        let mut shootdowns = 0;
        for cpu in 0..self.cpus.len() {
            let slot = self.cpus.get(cpu);
            if !slot.in_mask.load(Ordering::Relaxed) {
                continue;
            }
            // Another thread may share this CPU slot, so even our own slot
            // is waited for (the flusher itself is never inside an access);
            // only other slots count as shootdowns.
            if cpu != me {
                shootdowns += 1;
                spin_ns(self.shootdown_cost_ns);
            }
            let seq = slot.access_seq.load(Ordering::Acquire);
            if seq & 1 == 1 {
                wait_until(|| slot.access_seq.load(Ordering::Acquire) != seq);
            }
        }
        if shootdowns > 0 {
            stats.add(Event::tlb_shootdowns, shootdowns);
        }
    }
}

fn spin_ns(ns: u64) {
    if ns == 0 {
        return;
    }
    let t = std::time::Instant::now();
    while (t.elapsed().as_nanos() as u64) < ns {
        core::hint::spin_loop();
    }
}

/// A batch of unmapped ranges to flush and frames to free after the flush
/// (Linux's mmu_gather). Flushed once when finished, earlier only when full.
pub(crate) struct Gather<'a> {
    tlb: &'a TlbState,
    stats: &'a StatCounters,
    frames: &'a FrameAllocator,
    pending: Vec<Pfn>,
    pages: u64,
    range: Option<Range>,
}

impl<'a> Gather<'a> {
    pub(crate) fn new(
        tlb: &'a TlbState,
        stats: &'a StatCounters,
        frames: &'a FrameAllocator,
    ) -> Self {
        Gather {
            tlb,
            stats,
            frames,
            pending: Vec::new(),
            pages: 0,
            range: None,
        }
    }

    /// Records that the translation of `[va, va + 4 KiB)` was removed or
    /// changed.
    pub(crate) fn add_page(&mut self, va: u64) {
        self.pages += 1;
        let r = Range::new(va, va + crate::addr::PAGE_SIZE);
        self.range = Some(match self.range {
            Some(old) => Range::new(old.start.min(r.start), old.end.max(r.end)),
            None => r,
        });
    }

    /// Records a frame reference to drop after the flush.
    pub(crate) fn free_frame(&mut self, pfn: Pfn) {
        self.pending.push(pfn);
        if self.pending.len() >= GATHER_MAX_FRAMES {
            self.flush();
        }
    }

    /// Flushes what was gathered, then frees the frames.
    pub(crate) fn flush(&mut self) {
        if self.pages == 0 && self.pending.is_empty() {
            return;
        }
        self.tlb.flush(self.stats, self.pages);
        for pfn in self.pending.drain(..) {
            self.frames.put(pfn);
        }
        self.pages = 0;
        self.range = None;
    }
}

impl Drop for Gather<'_> {
    fn drop(&mut self) {
        self.flush();
    }
}
