//! Blocks: one access section around many loads and stores, as QEMU runs
//! a translated block, so that the per-access `enter`/`leave` (a store
//! of the `busy` word, the light fence, the generation and home check,
//! and the store that clears `busy`) is paid once per block.
//!
//! A [`Block`] stores `busy = block_mark(its thread's id)` and checks the
//! generation and home at its start (`Translator::enter_as`), and clears
//! `busy` when dropped. Inside it a hit is the entry check and one `mov`
//! of the frame. A miss, an unaligned or page-crossing access, a bulk
//! copy or an atomic leaves the section (`busy = 0`), runs the
//! translator's own call (which walks and faults outside any section, as
//! every miss does), then enters again (`busy` = the block's mark, the
//! fence, the generation and home check) before returning, so a flush
//! that reached the translator meanwhile is obeyed before the next hit.
//! The argument is in `tlb` ("Blocks").
//!
//! Shared lines: none new. The block's start and end write the
//! translator's own hot line (as every access does), and its hits write
//! nothing shared; the slow path writes what the plain call does.
//!
//! # Locking
//!
//! None. A flush on another thread that reaches the translator waits for
//! the block to end (it reads `busy != 0`); a writer of the space on the
//! block's own thread while the block is open would wait for ever (see
//! [`Block`]).

use super::word::{load, store};
use super::{perm, Busy, Scalar, Translator, PAGE_MASK};
use crate::error::MemoryFault;
use crate::mm::Access;
use crate::sync::thread_id;
use crate::tlb::block_mark;

impl<'a> Translator<'a> {
    /// Opens a block: an access section for many loads and stores (a
    /// guest basic block), whose hits cost only the entry check and the
    /// memory access. See [`Block`] for the rule that comes with it.
    ///
    /// ```
    /// use aspace::{AddressSpace, Config, MapFlags, Prot};
    /// let mm = AddressSpace::new(Config::default());
    /// let a = mm.mmap(0, 4096, Prot::READ | Prot::WRITE,
    ///                 MapFlags::PRIVATE | MapFlags::ANONYMOUS).unwrap();
    /// let mut t = mm.translator();
    /// {
    ///     let mut b = t.block();
    ///     b.store::<u32>(a, 1).unwrap(); // a miss: faults the page in
    ///     let x = b.load::<u32>(a).unwrap(); // a hit
    ///     b.store::<u32>(a + 4, x + 1).unwrap();
    /// } // the block ends: writers of `mm` may run again on this thread
    /// mm.munmap(a, 4096).unwrap();
    /// ```
    #[inline]
    pub fn block(&mut self) -> Block<'_, 'a> {
        let busy = self.enter_as(block_mark(thread_id()));
        Block { t: self, busy }
    }
}

/// An open access section of a [`Translator`] (made by
/// [`Translator::block`], ended when dropped): loads, stores and fetches
/// that hit the translator's cache run with no store, fence or check
/// of their own; everything else runs the translator's call between a
/// leave and a re-entry of the section. Results, faults and
/// [`MemoryFault`]s are exactly the translator's.
///
/// A flush (munmap, mprotect, mremap, madvise, a copy-on-write break,
/// fork...) on another thread that reaches this translator waits until
/// the block ends or misses, as QEMU's synced cross-vCPU TLB flush waits
/// for the vCPU to reach a block boundary: keep blocks short (a guest
/// basic block, tens of accesses), and never block inside one.
///
/// **Rule:** while a block is open, its thread must not call a writer of
/// the same address space (anything that may flush: `munmap`, `mprotect`,
/// `madvise`, `mremap`, `fork`, a write fault through
/// [`AddressSpace::write`](crate::AddressSpace::write) that breaks
/// copy-on-write...): the flush would wait for the block to end, which
/// never happens. The API cannot forbid it (the space is shared), so
/// the flush checks it and aborts the process with a message rather
/// than hang; end the block first (drop it), as an emulator leaves its translated block before a
/// syscall. Reads of the space and other translators are fine.
///
/// A `Block` stays on its thread (it is neither `Send` nor `Sync`): its
/// home check was done at its start.
///
/// Dropping the block ends the section; a block leaked with
/// [`mem::forget`](core::mem::forget) leaves it open, so flushes that
/// reach the translator wait until its next access (which opens and
/// closes a section of its own).
///
/// ```
/// use aspace::{AddressSpace, Config, FaultError, MapFlags, Prot};
/// let mm = AddressSpace::new(Config::default());
/// let a = mm.mmap(0, 8192, Prot::READ | Prot::WRITE,
///                 MapFlags::PRIVATE | MapFlags::ANONYMOUS).unwrap();
/// mm.mprotect(a + 4096, 4096, Prot::READ).unwrap();
/// let mut t = mm.translator();
/// let mut b = t.block();
/// for i in 0..16 {
///     b.store::<u16>(a + 2 * i, i as u16).unwrap();
/// }
/// assert_eq!(b.load::<u64>(a + 8).unwrap(), 0x0007_0006_0005_0004);
/// let e = b.store::<u8>(a + 4096, 1).unwrap_err(); // read-only page
/// assert_eq!((e.addr, e.kind), (a + 4096, FaultError::AccessDenied));
/// drop(b);
/// assert_eq!(t.load::<u16>(a + 30).unwrap(), 15);
/// ```
pub struct Block<'t, 'a> {
    t: &'t mut Translator<'a>,
    /// The translator's hot line, whose `busy` word is the block's mark while
    /// the block is open (and keeps the block off other threads).
    busy: Busy,
}

impl<'a> Block<'_, 'a> {
    /// Loads a `T` at `addr`, as [`Translator::load`].
    #[inline]
    pub fn load<T: Scalar>(&mut self, addr: u64) -> Result<T, MemoryFault> {
        if let Some(base) = self.t.hit(addr, perm(Access::Read), T::SIZE as u64) {
            let off = (addr & !PAGE_MASK) as usize;
            // SAFETY: `base` is a cached frame, valid while the section
            // is open (a flush that frees it waits for `busy = 0`), `off`
            // inside the page and `T`-aligned (the hit checked it).
            let bits = unsafe { load::<T>(base, off) };
            return Ok(T::from_bits(bits));
        }
        load_miss(self.t, addr)
    }

    /// Stores `v` at `addr`, as [`Translator::store`].
    #[inline]
    pub fn store<T: Scalar>(&mut self, addr: u64, v: T) -> Result<(), MemoryFault> {
        if let Some(base) = self.t.hit(addr, perm(Access::Write), T::SIZE as u64) {
            let off = (addr & !PAGE_MASK) as usize;
            // SAFETY: as in `load`; the entry allows writing.
            unsafe { store::<T>(base, off, v.to_bits()) };
            return Ok(());
        }
        store_miss(self.t, addr, v)
    }

    /// Fetches the `T` at `addr` as instruction bytes, as
    /// [`Translator::fetch`] (a hit needs an entry with execute
    /// permission and natural alignment; anything else takes the
    /// translator's path).
    #[inline]
    pub fn fetch<T: Scalar>(&mut self, addr: u64) -> Result<T, MemoryFault> {
        if let Some(base) = self.t.hit(addr, perm(Access::Exec), T::SIZE as u64) {
            let off = (addr & !PAGE_MASK) as usize;
            // SAFETY: as in `load`; an entry with execute permission maps
            // a frame (the zero page is never cached).
            let bits = unsafe { load::<T>(base, off) };
            return Ok(T::from_bits(bits));
        }
        fetch_miss(self.t, addr)
    }

    /// [`Translator::read`] inside the block (between a leave and a
    /// re-entry of the section).
    pub fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), MemoryFault> {
        self.outside(|t| t.read(addr, buf))
    }

    /// [`Translator::write`] inside the block (between a leave and a
    /// re-entry of the section).
    pub fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), MemoryFault> {
        self.outside(|t| t.write(addr, data))
    }

    /// [`Translator::compare_exchange`] inside the block (between a leave
    /// and a re-entry of the section: an atomic costs what it costs
    /// outside a block, plus the re-entry).
    pub fn compare_exchange<T: Scalar>(
        &mut self,
        addr: u64,
        current: T,
        new: T,
    ) -> Result<Result<T, T>, MemoryFault> {
        self.outside(|t| t.compare_exchange(addr, current, new))
    }

    /// [`Translator::fetch_add`] inside the block (as
    /// [`compare_exchange`](Self::compare_exchange)).
    pub fn fetch_add<T: Scalar>(&mut self, addr: u64, v: T) -> Result<T, MemoryFault> {
        self.outside(|t| t.fetch_add(addr, v))
    }

    /// [`Translator::swap`] inside the block (as
    /// [`compare_exchange`](Self::compare_exchange)).
    pub fn swap<T: Scalar>(&mut self, addr: u64, v: T) -> Result<T, MemoryFault> {
        self.outside(|t| t.swap(addr, v))
    }

    /// [`outside`] for the calls off the hit path.
    fn outside<R>(&mut self, f: impl FnOnce(&mut Translator<'a>) -> R) -> R {
        outside(self.t, f)
    }
}

// The hit paths' misses: out of line, taking the translator (not the
// block, which then stays in registers) and the operands by value.

#[cold]
#[inline(never)]
fn load_miss<T: Scalar>(t: &mut Translator<'_>, addr: u64) -> Result<T, MemoryFault> {
    outside(t, |t| t.load(addr))
}

#[cold]
#[inline(never)]
fn store_miss<T: Scalar>(t: &mut Translator<'_>, addr: u64, v: T) -> Result<(), MemoryFault> {
    outside(t, |t| t.store(addr, v))
}

#[cold]
#[inline(never)]
fn fetch_miss<T: Scalar>(t: &mut Translator<'_>, addr: u64) -> Result<T, MemoryFault> {
    outside(t, |t| t.fetch(addr))
}

/// Runs `f` on the translator of an open block outside its section:
/// leaves it (a flush waiting for the block may go on; `f` may walk and
/// fault), then enters it again, checking the generation and home,
/// before any later hit. The block's `busy` handle stays valid: it is the
/// translator's slot's hot line, which never changes.
#[inline(always)]
fn outside<'a, R>(t: &mut Translator<'a>, f: impl FnOnce(&mut Translator<'a>) -> R) -> R {
    t.leave(Busy(&*t.slot.hot));
    let r = f(t);
    // Mutation the loom model `block_vs_munmap` catches: skipping this
    // re-entry (the hits after a miss run with `busy == 0`, so a flush
    // neither waits for them nor is obeyed by them).
    let _ = t.enter_as(block_mark(thread_id()));
    r
}

impl Drop for Block<'_, '_> {
    #[inline]
    fn drop(&mut self) {
        self.t.leave(self.busy);
    }
}

impl core::fmt::Debug for Block<'_, '_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Block")
            .field("translator", &self.t)
            .finish()
    }
}
