//! A vmalloc-style virtual-area allocator with per-CPU zones and lazy
//! purging.
//!
//! `alloc(size, align)` hands out a range of a fixed virtual window;
//! `free(range)` gives it back. Like Linux's vmalloc:
//!
//! - **Free space is a tree augmented with the largest free block below
//!   each node.** Each zone keeps its busy and lazily freed areas as the
//!   entries of a [`RangeTree`]; free space is exactly the tree's gaps, and
//!   the tree's gap annotations find the lowest fit in O(log n).
//! - **Lazy freeing.** A freed area is first only marked lazy: its
//!   translations may still sit in TLBs, so its addresses must not be
//!   handed out yet. Once the lazy total passes a threshold, a purge does
//!   *one* TLB flush over the span of everything lazy in the zone and only
//!   then erases those areas from the tree. An address is therefore never
//!   reused before the flush that covers its old mapping.
//! - **Zones.** The window is split into zones, each with its own lock,
//!   tree and lazy list. A thread allocates from its CPU's zone first
//!   (`crate::percpu::cpu_id`), then from the others; a free goes to the
//!   zone that owns the address. [`Mode::GlobalLock`] keeps one zone (one
//!   lock) for everything — the layout before "Mitigate a vmap lock
//!   contention" — for comparison.
//!
//! Every allocated range is disjoint from every live one; freeing an
//! unknown, partial or already freed range is an error and changes
//! nothing.
//!
//! ```
//! use aspace::vmap::{Vmap, VmapConfig};
//! let v = Vmap::new(VmapConfig::default()).unwrap();
//! let a = v.alloc(3 * 4096, 4096).unwrap();
//! let b = v.alloc(4096, 4096).unwrap();
//! assert!(!a.overlaps(&b));
//! v.free(a).unwrap();
//! assert!(v.free(a).is_err()); // double free
//! ```
//!
//! # Locking
//!
//! One lock per zone, never two at once; the zones are independent of the
//! address space's locks ([`crate::mm`]).

use crate::addr::{align_up, Range, PAGE_SIZE};
use crate::error::{Error, Result};
use crate::percpu::{cpu_id, nr_cpus};
use crate::reclaim::Reclaimer;
use crate::sync::counter::{AtomicU64, Ordering};
use crate::sync::Mutex;
use crate::tree::RangeTree;
use crossbeam_utils::CachePadded;

/// How the window is locked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Mode {
    /// One zone per CPU, each with its own lock (Linux 6.9's vmap nodes).
    #[default]
    PerCpu,
    /// One lock for the whole window (the old design).
    GlobalLock,
}

/// The most zones a [`Vmap`] takes ([`VmapConfig::zones`]): each is a
/// lock and a tree of its own, made up front.
pub const MAX_ZONES: usize = 4096;

/// Configuration of a [`Vmap`].
#[derive(Clone, Debug)]
pub struct VmapConfig {
    /// The virtual window `[start, end)` areas come from (page-aligned).
    pub window: Range,
    /// Locking mode.
    pub mode: Mode,
    /// Zones in PerCpu mode (default: one per CPU slot; at most
    /// [`MAX_ZONES`]).
    pub zones: usize,
    /// Lazily freed bytes in a zone that trigger its purge (default
    /// scaled like Linux's `lazy_max_pages`: log2(CPUs) x 32 MiB, split
    /// over the zones).
    pub lazy_max_bytes: u64,
}

impl Default for VmapConfig {
    fn default() -> Self {
        let cpus = nr_cpus();
        let log = (usize::BITS - cpus.leading_zeros()) as u64;
        VmapConfig {
            // x86-64's vmalloc area: 32 TiB.
            window: Range::new(0xffff_c900_0000_0000, 0xffff_e900_0000_0000),
            mode: Mode::PerCpu,
            zones: cpus.min(MAX_ZONES),
            lazy_max_bytes: (log * (32 << 20) / cpus as u64).max(1 << 20),
        }
    }
}

/// What a tree entry of a zone is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AreaState {
    /// Handed out.
    Busy,
    /// Freed, waiting for the purge (and its TLB flush).
    Lazy,
}

struct Zone {
    range: Range,
    /// Busy and lazy areas. Never read outside the zone's lock: its
    /// reclaimer frees replaced nodes at once.
    tree: RangeTree<AreaState>,
    /// What the lazy areas (in the tree) add up to.
    lazy: LazySummary,
}

/// A zone's lazily freed areas, summed: all a purge needs besides the tree
/// (which holds the areas themselves).
#[derive(Default)]
struct LazySummary {
    areas: usize,
    bytes: u64,
    /// The span covering them all (the purge's TLB flush range).
    span: Option<Range>,
}

impl LazySummary {
    fn add(&mut self, r: Range) {
        self.areas += 1;
        self.bytes += r.len();
        self.span = Some(match self.span {
            Some(s) => Range::new(s.start.min(r.start), s.end.max(r.end)),
            None => r,
        });
    }
}

/// Counters of a [`Vmap`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VmapStats {
    /// Successful allocations.
    pub allocs: u64,
    /// Successful frees.
    pub frees: u64,
    /// Allocations served by a zone other than the caller's.
    pub remote_allocs: u64,
    /// Purges (each does one TLB flush).
    pub purges: u64,
    /// Bytes covered by the purges' flushes.
    pub flushed_bytes: u64,
    /// Areas released by purges.
    pub purged_areas: u64,
}

#[derive(Default)]
struct Counters {
    allocs: AtomicU64,
    frees: AtomicU64,
    remote: AtomicU64,
    purges: AtomicU64,
    flushed: AtomicU64,
    purged: AtomicU64,
}

/// The allocator.
pub struct Vmap {
    zones: Box<[CachePadded<Mutex<Zone>>]>,
    window: Range,
    zone_size: u64,
    lazy_max: u64,
    stats: crate::percpu::PerCpu<Counters>,
}

impl core::fmt::Debug for Vmap {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Vmap")
            .field("window", &self.window)
            .field("zones", &self.zones.len())
            .finish()
    }
}

impl Vmap {
    /// An allocator over `cfg.window`. `EINVAL` if the window is empty or
    /// not page-aligned, or `cfg.zones` is above [`MAX_ZONES`]. Zones past
    /// the window's pages are not made (a one-page window has one zone).
    pub fn new(cfg: VmapConfig) -> Result<Self> {
        let w = cfg.window;
        if w.is_empty() || w.start % PAGE_SIZE != 0 || w.end % PAGE_SIZE != 0 {
            return Err(Error::Inval);
        }
        if cfg.mode == Mode::PerCpu && cfg.zones > MAX_ZONES {
            return Err(Error::Inval);
        }
        let n = match cfg.mode {
            Mode::GlobalLock => 1,
            Mode::PerCpu => cfg.zones.max(1) as u64,
        };
        let pages = w.len() / PAGE_SIZE;
        let zone_size = pages.div_ceil(n).max(1) * PAGE_SIZE;
        // Zones start a zone size apart until the window's end (checked:
        // a window may end at the top of the address space).
        let zones = (0..n)
            .map_while(|i| {
                let s = w.start.checked_add(i.checked_mul(zone_size)?)?;
                (s < w.end).then(|| {
                    // SAFETY: a zone's tree is read and written only under
                    // the zone's lock (`fit`, `free`, `purge`, `areas`), so
                    // it has no lock-free readers and may free at once.
                    let tree = RangeTree::with_reclaimer(unsafe { Reclaimer::immediate() });
                    CachePadded::new(Mutex::new(Zone {
                        range: Range::new(s, s.saturating_add(zone_size).min(w.end)),
                        tree,
                        lazy: LazySummary::default(),
                    }))
                })
            })
            .collect();
        Ok(Vmap {
            zones,
            window: w,
            zone_size,
            lazy_max: cfg.lazy_max_bytes,
            stats: crate::percpu::PerCpu::new(Counters::default),
        })
    }

    /// The window.
    pub fn window(&self) -> Range {
        self.window
    }

    /// Number of zones (locks).
    pub fn zones(&self) -> usize {
        self.zones.len()
    }

    /// Allocates `size` bytes (rounded up to pages) aligned to `align` (a
    /// power of two; at least a page). `EINVAL` for a zero size or a bad
    /// alignment; `ENOMEM` when no zone has room even after purging.
    pub fn alloc(&self, size: u64, align: u64) -> Result<Range> {
        if size == 0 || align == 0 || !align.is_power_of_two() {
            return Err(Error::Inval);
        }
        let size = align_up(size, PAGE_SIZE).ok_or(Error::NoMem)?;
        let align = align.max(PAGE_SIZE);
        if size > self.zone_size {
            return Err(Error::NoMem);
        }
        let home = cpu_id() % self.zones.len();
        // Local zone first, then the others; then purge everything and try
        // once more (Linux purges and retries before failing).
        for pass in 0..2 {
            for k in 0..self.zones.len() {
                let i = (home + k) % self.zones.len();
                let mut z = self.zones[i].lock();
                let found = Self::fit(&z, size, align).or_else(|| {
                    if pass == 1 && z.lazy.areas > 0 {
                        self.purge(&mut z);
                        Self::fit(&z, size, align)
                    } else {
                        None
                    }
                });
                if let Some(s) = found {
                    let r = Range::new(s, s + size);
                    z.tree
                        .writer()
                        .insert(r, AreaState::Busy)
                        .expect("a gap is free");
                    let c = self.stats.local();
                    c.allocs.fetch_add(1, Ordering::Relaxed);
                    if i != home {
                        c.remote.fetch_add(1, Ordering::Relaxed);
                    }
                    return Ok(r);
                }
            }
        }
        Err(Error::NoMem)
    }

    fn fit(z: &Zone, size: u64, align: u64) -> Option<u64> {
        let g = z.tree.pin();
        z.tree
            .gap_lowest(z.range.start, z.range.end, size, align, &g)
    }

    /// Frees an area returned by [`alloc`](Self::alloc). It is parked
    /// lazily and becomes reusable after the next purge of its zone.
    /// `EINVAL` (and no change) for a range that is not exactly a live
    /// area.
    pub fn free(&self, r: Range) -> Result<()> {
        if r.is_empty() || r.start < self.window.start || r.end > self.window.end {
            return Err(Error::Inval);
        }
        let i = ((r.start - self.window.start) / self.zone_size) as usize;
        let mut z = self.zones[i].lock();
        {
            let g = z.tree.pin();
            match z.tree.find(r.start, &g) {
                Some((e, AreaState::Busy)) if e == r => {}
                _ => return Err(Error::Inval),
            }
        }
        z.tree.writer().store(r, AreaState::Lazy);
        z.lazy.add(r);
        self.stats.local().frees.fetch_add(1, Ordering::Relaxed);
        if z.lazy.bytes > self.lazy_max {
            self.purge(&mut z);
        }
        Ok(())
    }

    /// Purges every zone's lazy areas now.
    pub fn purge_all(&self) {
        for z in self.zones.iter() {
            let mut z = z.lock();
            self.purge(&mut z);
        }
    }

    /// One TLB flush over the span of the zone's lazy areas, then they
    /// become free.
    fn purge(&self, z: &mut Zone) {
        let Some(span) = z.lazy.span else {
            return;
        };
        // The flush comes first: only after it may the addresses be reused.
        let c = self.stats.local();
        c.purges.fetch_add(1, Ordering::Relaxed);
        c.flushed.fetch_add(span.len(), Ordering::Relaxed);
        c.purged.fetch_add(z.lazy.areas as u64, Ordering::Relaxed);
        // One rebuild of the zone's tree instead of one edit per area.
        let purged = z.tree.writer().retain(|_, s| *s == AreaState::Busy);
        debug_assert_eq!(purged, z.lazy.areas);
        z.lazy = LazySummary::default();
    }

    /// Every busy and lazy area, in address order (free space is the
    /// rest of the window).
    pub fn areas(&self) -> Vec<(Range, AreaState)> {
        let mut out = Vec::new();
        for z in self.zones.iter() {
            let z = z.lock();
            let g = z.tree.pin();
            out.extend(z.tree.iter(&g).map(|(r, s)| (r, *s)));
        }
        out
    }

    /// Counters summed over CPUs.
    pub fn stats(&self) -> VmapStats {
        let mut s = VmapStats::default();
        for c in self.stats.iter() {
            s.allocs += c.allocs.load(Ordering::Relaxed);
            s.frees += c.frees.load(Ordering::Relaxed);
            s.remote_allocs += c.remote.load(Ordering::Relaxed);
            s.purges += c.purges.load(Ordering::Relaxed);
            s.flushed_bytes += c.flushed.load(Ordering::Relaxed);
            s.purged_areas += c.purged.load(Ordering::Relaxed);
        }
        s
    }
}

#[cfg(all(test, not(aspace_loom)))]
mod tests;
