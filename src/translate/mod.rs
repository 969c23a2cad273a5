//! Soft TLBs: guest memory at host speed.
//!
//! A [`Translator`] is one thread's TLB for an address space: a
//! direct-mapped cache of page → (frame memory, writable), filled by a
//! page-table walk and, on a miss or a write to a read-only entry, by
//! [`AddressSpace::fault`] exactly as a CPU would. A hit is a few
//! instructions and writes only the translator's own cache line.
//!
//! Flushes (munmap, mprotect, mremap, madvise, copy-on-write breaks, fork)
//! invalidate every translator before they return: see `tlb` for
//! the protocol and its argument.
//!
//! Frame memory is shared with other threads and other translators, so it
//! is only ever touched through 8-byte atomics (as `phys` does):
//! narrower stores and read-modify-writes are compare-and-swap loops on the
//! containing word. Concurrent guest stores to one page are a data race in
//! the guest, never undefined behaviour here. Loads are Acquire and stores
//! Release (plain moves on x86-64, whose order guests expect); the atomic
//! operations are `SeqCst`, like `lock`-prefixed instructions.
//!
//! The shared zero page is never cached: a read of a never-written page
//! walks the page table each time, so the write fault that replaces the
//! zero page (which, unlike a copy-on-write break, flushes nothing) never
//! leaves a translator reading stale zeros.
//!
//! # Locking
//!
//! A translator takes no lock on a hit; a miss walks the page table
//! lock-free and faults through `AddressSpace::fault`. Registration of its
//! slot takes the TLB flush lock (see [`crate::mm`] for the order).

mod atomic;
#[cfg(feature = "vm-memory")]
pub mod guest;
mod word;

pub use word::Scalar;
use word::{copy_in, copy_out, mask, word};

use crate::addr::PAGE_SIZE;
use crate::error::FaultError;
use crate::mm::{Access, AddressSpace};
use crate::pt::PteFlags;
use crate::sync::asymmetric;
use crate::sync::frame::Ordering as FrameOrdering;
use crate::sync::{AtomicU64, Ordering};
use crate::tlb::TranslatorRef;

/// Entries in a translator (direct-mapped by page number).
const ENTRIES: usize = 256;
const PAGE_MASK: u64 = !(PAGE_SIZE - 1);
/// Tag bits below the page number.
const VALID: u64 = 1;
const WRITABLE: u64 = 2;

/// One cached translation: `tag` is the page address | `VALID` (|
/// `WRITABLE`); `base` the frame's first byte.
#[derive(Clone, Copy)]
struct Entry {
    tag: u64,
    base: *mut u8,
}

const EMPTY: Entry = Entry {
    tag: 0,
    base: core::ptr::null_mut(),
};

#[inline(always)]
fn index(addr: u64) -> usize {
    (addr / PAGE_SIZE) as usize % ENTRIES
}

/// What a translation found inside an access.
#[derive(Clone, Copy)]
enum Lookup {
    /// A frame (its first byte).
    Frame(*mut u8),
    /// The shared zero page (reads only; never cached).
    Zero,
    /// No translation allows the access: fault.
    Fault,
}

/// One thread's soft TLB for an address space (see the [module
/// docs](self)). Made by [`AddressSpace::translator`]; not `Send`: it is
/// one CPU's state.
///
/// Every access returns a [`FaultError`] where a CPU would raise a signal:
/// `NoMapping`/`AccessDenied` (SIGSEGV) from the fault path, `Bus`
/// (SIGBUS) for a misaligned atomic operation.
///
/// ```
/// use aspace::{AddressSpace, Config, MapFlags, Prot};
/// let mm = AddressSpace::new(Config::default());
/// let a = mm.mmap(0, 8192, Prot::READ | Prot::WRITE,
///                 MapFlags::PRIVATE | MapFlags::ANONYMOUS).unwrap();
/// let mut t = mm.translator();
/// t.store::<u64>(a, 7).unwrap();
/// assert_eq!(t.fetch_add::<u64>(a, 1).unwrap(), 7);
/// assert_eq!(t.load::<u64>(a).unwrap(), 8);
/// t.write(a + 4094, b"hi!!").unwrap();           // crosses a page
/// assert_eq!(t.load::<u32>(a + 4094).unwrap(), u32::from_le_bytes(*b"hi!!"));
/// ```
///
/// A translator stays on its thread:
///
/// ```compile_fail
/// fn send<T: Send>(_: T) {}
/// let mm = aspace::AddressSpace::new(aspace::Config::default());
/// send(mm.translator());
/// ```
pub struct Translator<'a> {
    mm: &'a AddressSpace,
    /// `mm`'s flush generation.
    mm_gen: &'a AtomicU64,
    slot: TranslatorRef,
    /// The generation the entries belong to.
    gen: u64,
    /// [`asymmetric::expedited`], cached off the hot path.
    expedited: bool,
    entries: Box<[Entry; ENTRIES]>,
}

impl AddressSpace {
    /// A soft TLB for the calling thread: loads, stores and atomics at
    /// cached translations, faulting like a CPU on a miss (see
    /// [`crate::translate`]).
    pub fn translator(&self) -> Translator<'_> {
        Translator::new(self)
    }
}

impl<'a> Translator<'a> {
    pub(crate) fn new(mm: &'a AddressSpace) -> Self {
        let expedited = asymmetric::expedited();
        mm.tlb.note_cpu();
        let slot = mm.tlb.register_translator();
        Translator {
            mm,
            mm_gen: mm.tlb.generation(),
            gen: slot.acked.load(Ordering::Relaxed),
            slot,
            expedited,
            entries: Box::new([EMPTY; ENTRIES]),
        }
    }

    /// Begins an access: publishes it, then drops every entry if a flush
    /// ran since the last one (see [`crate::tlb`]).
    #[inline(always)]
    fn enter(&mut self) {
        self.slot.busy.store(1, Ordering::Relaxed);
        asymmetric::light(self.expedited);
        let gen = self.mm_gen.load(Ordering::Acquire);
        if gen != self.gen {
            self.drop_entries(gen);
        }
    }

    /// Ends an access: everything it did happens before a flush that
    /// waits for it returns.
    #[inline(always)]
    fn leave(&mut self) {
        self.slot.busy.store(0, Ordering::Release);
    }

    /// Obeys the flushes up to `gen`, which the flushers may be waiting
    /// to hear (inside an access that began after them).
    #[cold]
    fn drop_entries(&mut self, gen: u64) {
        self.entries.fill(EMPTY);
        self.gen = gen;
        self.slot.acked.store(gen, Ordering::Release);
    }

    /// The cached frame of `addr`'s page if it allows the access.
    #[inline(always)]
    fn hit(&self, addr: u64, write: bool) -> Option<*mut u8> {
        let e = self.entries[index(addr)];
        let want = (addr & PAGE_MASK) | VALID;
        let ok = if write {
            e.tag == want | WRITABLE
        } else {
            e.tag & !WRITABLE == want
        };
        ok.then_some(e.base)
    }

    /// Inside an access: translates `page` from the cache, or walks the
    /// page table and caches what it finds.
    fn translate(&mut self, page: u64, write: bool) -> Lookup {
        if let Some(base) = self.hit(page, write) {
            return Lookup::Frame(base);
        }
        let (l, writable) = walk(self.mm, page, write);
        if let Lookup::Frame(base) = l {
            self.entries[index(page)] = Entry {
                tag: page | VALID | if writable { WRITABLE } else { 0 },
                base,
            };
        }
        l
    }

    /// Runs `f` on the translations of the (at most two) pages of
    /// `[addr, addr + len)`, `0 < len <= PAGE_SIZE`, inside one access,
    /// faulting pages in first as needed: `f` runs only once every page
    /// allows the access, so a store that fails has written nothing.
    fn with_span<R>(
        &mut self,
        addr: u64,
        len: usize,
        write: bool,
        f: impl FnOnce(Lookup, Lookup) -> R,
    ) -> Result<R, FaultError> {
        let end = addr
            .checked_add(len as u64)
            .filter(|&e| e <= self.mm.cfg.task_size)
            .ok_or(FaultError::NoMapping)?;
        let first = addr & PAGE_MASK;
        let last = (end - 1) & PAGE_MASK;
        let access = if write { Access::Write } else { Access::Read };
        let (a, b) = loop {
            self.enter();
            let a = self.translate(first, write);
            let b = if last == first {
                a
            } else {
                self.translate(last, write)
            };
            let missing = match (a, b) {
                (Lookup::Fault, _) => first,
                (_, Lookup::Fault) => last,
                _ => break (a, b),
            };
            // Fault outside the access: the fault may flush, or wait for
            // an mmap_lock writer that is flushing.
            self.leave();
            self.mm.fault(missing, access)?;
        };
        let r = f(a, b);
        self.leave();
        Ok(r)
    }

    /// Reads `buf.len()` bytes at `addr` (any alignment; crossing pages
    /// that each fault in as needed). On an error, the bytes of the pages
    /// before the failing one are already in `buf`.
    pub fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), FaultError> {
        let mut done = 0;
        while done < buf.len() {
            let a = addr.checked_add(done as u64).ok_or(FaultError::NoMapping)?;
            let off = (a & !PAGE_MASK) as usize;
            let n = (PAGE_SIZE as usize - off).min(buf.len() - done);
            let chunk = &mut buf[done..done + n];
            self.with_span(a, n, false, |l, _| {
                copy_out(frame_of(l), off, chunk);
            })?;
            done += n;
        }
        Ok(())
    }

    /// Writes `data` at `addr` (any alignment; crossing pages that each
    /// fault in as needed, copy-on-write pages being copied). On an error,
    /// the pages before the failing one are written, as by a real
    /// `memcpy`.
    pub fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), FaultError> {
        let mut done = 0;
        while done < data.len() {
            let a = addr.checked_add(done as u64).ok_or(FaultError::NoMapping)?;
            let off = (a & !PAGE_MASK) as usize;
            let n = (PAGE_SIZE as usize - off).min(data.len() - done);
            let chunk = &data[done..done + n];
            self.with_span(a, n, true, |l, _| {
                if let Lookup::Frame(base) = l {
                    copy_in(base, off, chunk);
                }
            })?;
            done += n;
        }
        Ok(())
    }

    /// Loads a `T` at `addr`. Naturally aligned loads are single atomic
    /// loads; others (which may cross a page: both pages must be readable)
    /// are assembled from bytes and may tear, as a split load may on
    /// hardware.
    #[inline]
    pub fn load<T: Scalar>(&mut self, addr: u64) -> Result<T, FaultError> {
        if addr % T::SIZE as u64 == 0 {
            self.enter();
            if let Some(base) = self.hit(addr, false) {
                let off = (addr & !PAGE_MASK) as usize;
                // SAFETY: `base` is a cached frame, `off` inside the page.
                let w = unsafe { word(base, off) }.load(FrameOrdering::Acquire);
                self.leave();
                return Ok(T::from_bits(w >> ((off % 8) * 8)));
            }
            self.leave();
        }
        self.load_slow(addr)
    }

    #[inline(never)]
    fn load_slow<T: Scalar>(&mut self, addr: u64) -> Result<T, FaultError> {
        let mut b = [0u8; 8];
        let off = (addr & !PAGE_MASK) as usize;
        let split = (PAGE_SIZE as usize - off).min(T::SIZE);
        let buf = &mut b[..T::SIZE];
        self.with_span(addr, T::SIZE, false, |x, y| {
            let (lo, hi) = buf.split_at_mut(split);
            copy_out(frame_of(x), off, lo);
            copy_out(frame_of(y), 0, hi);
        })?;
        Ok(T::from_bits(u64::from_le_bytes(b)))
    }

    /// Stores `v` at `addr`. A store to a write-protected copy-on-write
    /// page faults and copies first. Naturally aligned stores are atomic;
    /// others (which may cross a page: both pages must be writable, or
    /// nothing is written) may tear.
    #[inline]
    pub fn store<T: Scalar>(&mut self, addr: u64, v: T) -> Result<(), FaultError> {
        if T::SIZE == 8 && addr % 8 == 0 {
            self.enter();
            if let Some(base) = self.hit(addr, true) {
                let off = (addr & !PAGE_MASK) as usize;
                // SAFETY: `base` is a cached frame, `off` inside the page.
                unsafe { word(base, off) }.store(v.to_bits(), FrameOrdering::Release);
                self.leave();
                return Ok(());
            }
            self.leave();
        }
        self.store_slow(addr, v)
    }

    #[inline(never)]
    fn store_slow<T: Scalar>(&mut self, addr: u64, v: T) -> Result<(), FaultError> {
        let b = v.to_bits().to_le_bytes();
        let off = (addr & !PAGE_MASK) as usize;
        let split = (PAGE_SIZE as usize - off).min(T::SIZE);
        let (lo, hi) = b[..T::SIZE].split_at(split);
        self.with_span(addr, T::SIZE, true, |x, y| {
            if let (Lookup::Frame(a), Lookup::Frame(b)) = (x, y) {
                copy_in(a, off, lo);
                copy_in(b, 0, hi);
            }
        })
    }
}

/// Walks `mm`'s page table for `page`: what it maps if that allows the
/// access, and whether the entry is writable.
fn walk(mm: &AddressSpace, page: u64, write: bool) -> (Lookup, bool) {
    let g = mm.pt.pin();
    let pte = mm.pt.lookup(page, &g);
    let f = pte.flags();
    let writable = f.contains(PteFlags::WRITE);
    if !pte.is_present()
        || !f.contains(PteFlags::USER)
        || f.contains(PteFlags::EXEC_ONLY)
        || (write && !writable)
    {
        return (Lookup::Fault, false);
    }
    if pte.pfn().is_zero_page() {
        return (Lookup::Zero, false);
    }
    (Lookup::Frame(mm.frames.frame_ptr(pte.pfn())), writable)
}

/// The frame a read copies from (`None`: zeros).
fn frame_of(l: Lookup) -> Option<*mut u8> {
    match l {
        Lookup::Frame(b) => Some(b),
        _ => None,
    }
}

impl Drop for Translator<'_> {
    fn drop(&mut self) {
        self.mm.tlb.unregister_translator(&self.slot);
    }
}

impl core::fmt::Debug for Translator<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let cached = self.entries.iter().filter(|e| e.tag & VALID != 0).count();
        f.debug_struct("Translator")
            .field("cached", &cached)
            .field("gen", &self.gen)
            .finish()
    }
}
