//! Soft TLBs: guest memory at host speed.
//!
//! A [`Translator`] is one CPU's TLB for an address space: a
//! direct-mapped cache of page → (frame memory, read/write/exec
//! permission), filled by a page-table walk and, on a miss or an access
//! its cached permission does not allow, by [`AddressSpace::fault`]
//! exactly as a CPU would. Instruction fetches ([`Translator::fetch`])
//! check execute permission: entries of VMAs without `PROT_EXEC` carry
//! x86-64's NX bit.
//!
//! A hit is a few instructions and writes one shared line: the
//! translator's own slot's hot line (`busy` set and cleared around the
//! access, and its generation read), which another thread writes only
//! when a flush reaches this translator. Its light fence is a compiler
//! fence with no load of the process's fence mode: the generation check
//! stands in for it (a switch to full fences bumps every translator's
//! generation, `sync::asymmetric`'s "Watched light fences"). It also reads
//! the calling thread's id (a thread-local word, compared with the
//! translator's home in the branch that checks its generation: one branch
//! for both) and the frame. The
//! entry check is one compare of tag, permissions and alignment. A miss
//! also counts
//! itself (`translator_walks` or `translator_huge_hits`) in the space's
//! statistics slot of its CPU, a line no other CPU writes; a miss in a
//! region new to the translator also grows its summary (its own line)
//! and issues a full fence.
//!
//! Flushes (munmap, mprotect, mremap, madvise, copy-on-write breaks, fork)
//! invalidate, before they return, every translator whose summary meets
//! the regions they changed: see `tlb` for the protocol and its argument.
//!
//! A [`Block`] ([`Translator::block`]) holds one access section across
//! many loads and stores, as QEMU runs a translated block: the `busy`
//! store, the light fence and the generation and home check happen once
//! at its start, the store that clears `busy` at its end, and each hit in
//! between is the entry check and the `mov` (no new shared line: its start
//! and end write the translator's own hot line, as an access does). A
//! flush that reaches the translator waits for the block to end, so
//! blocks must be short, and a writer of the space must not run on the
//! block's own thread while it is open (see [`Block`]).
//!
//! Frame memory is shared with other threads and other translators, so it
//! is only ever touched atomically: as 8-byte atomic words (as `phys`
//! does), and on x86-64 by narrower loads and stores that are single
//! aligned `mov` instructions (see `word`), so that every width's hit is
//! the 8-byte one's instructions. Concurrent guest stores to one page are
//! a data race in the guest, never undefined behaviour here. Loads are
//! Acquire and stores Release (plain moves on x86-64, whose order guests
//! expect); the atomic operations are `SeqCst`, like `lock`-prefixed
//! instructions, at any alignment inside a cache line (see `atomic` for
//! what a misaligned one guarantees, and [`SplitLock`] for operands
//! across lines and pages).
//!
//! A PMD leaf (a transparent huge page) is also cached as one 2 MiB
//! entry, in a small direct-mapped array beside the 4 KiB one: a 4 KiB
//! miss inside it fills the 4 KiB entry from it, with no walk
//! (`translator_huge_hits`; misses that walk count `translator_walks`).
//! It obeys the same flushes: dropped with the 4 KiB entries at every
//! generation change (a 2 MiB span lies inside one summary region). A split needs no flush (its 512 PTEs translate as
//! the leaf did, see `pt::huge`), so a 2 MiB entry cached before a split
//! stays right until a change of one of its pages, which flushes (a zap,
//! mprotect, a copy-on-write break, a write-protection); a change that
//! flushes nothing only adds rights, which the entry then lacks (its
//! accesses miss and walk). Loom builds never cache one: their frame
//! chunks are too small for a huge frame's 2 MiB to be contiguous.
//!
//! The shared zero page is never cached: a read of a never-written page
//! walks the page table each time, so the write fault that replaces the
//! zero page (which, unlike a copy-on-write break, flushes nothing) never
//! leaves a translator reading stale zeros.
//!
//! Every failing access returns a [`MemoryFault`]: the first byte that
//! could not be accessed (`si_addr`), why (the `si_code`), and the bytes
//! done before it.
//!
//! # Moving between threads
//!
//! A translator is `Send`; [`Translator::new_owned`] makes one that owns
//! its space (`'static`). The flush protocol is per access, and an access
//! runs on one thread from `busy = 1` to `busy = 0`: moving the translator
//! between accesses is a hand-over that happens-before its next access on
//! the new thread (a channel, a spawn or a join synchronizes), so the
//! argument in `tlb` holds unchanged: the new thread's `busy = 1` follows
//! the old thread's `busy = 0` and `acked` in the slot's modification
//! order, and its light fence, like any, pairs with every flush's heavy
//! fence (`membarrier` reaches every running thread of the process, and
//! a thread switched in or out passed a full barrier). Its first access
//! on the new thread also publishes that thread as its home (a store and
//! a full fence, off the hit path), so that a flush on the old thread no
//! longer takes it for its own and skips it (see `tlb`). Only the
//! `translator_shootdowns` statistic still counts the translator as its
//! maker thread's.
//!
//! # Locking
//!
//! A translator takes no lock on a hit; a miss walks the page table
//! lock-free and faults through `AddressSpace::fault`. Registration of its
//! slot takes the TLB flush lock (see [`crate::mm`] for the order). A
//! split-lock atomic takes a stripe spin lock (`atomic`), inside the
//! access, around a few word operations only.

mod access;
mod atomic;
mod block;
#[cfg(feature = "vm-memory")]
pub mod guest;
mod split;
mod word;

pub use block::Block;
pub use split::SplitLock;
pub use word::Scalar;

use crate::addr::PAGE_SIZE;
use crate::error::{FaultError, MemoryFault};
use crate::mm::{Access, AddressSpace};
use crate::pt::PteFlags;
use crate::stats::Event;
use crate::sync::asymmetric;
use crate::sync::{thread_id, thread_id_if_made, Ordering};
use crate::tlb::{Regions, SlotHot, TranslatorRef};

/// The `busy` word inside one access.
const IN_ACCESS: u64 = 1;

/// A translator's `key` when its accesses must issue full fences: no
/// thread's id (ids count up from 1).
const FENCED: u64 = u64::MAX;

/// Entries in a translator (direct-mapped by page number).
const ENTRIES: usize = 256;
/// 2 MiB entries in a translator (direct-mapped by huge page number).
const HUGE_ENTRIES: usize = 8;
const PAGE_MASK: u64 = !(PAGE_SIZE - 1);
/// Bytes a 2 MiB entry covers (a PMD leaf).
const HUGE_SPAN: u64 = 2 << 20;
const HUGE_MASK: u64 = !(HUGE_SPAN - 1);
/// Permission bits of a tag, below the page number and above the
/// alignment bits of an 8-byte access (which a tag keeps zero, so that
/// the hit check also checks alignment). Write implies read (an entry is
/// writable only if it allows data access). An empty tag (0) allows
/// nothing, so never matches, not even page 0.
const R: u64 = 8;
const W: u64 = 16;
const X: u64 = 32;

/// The permission bits a tag must hold for an access.
#[inline(always)]
const fn perm(access: Access) -> u64 {
    match access {
        Access::Read => R,
        Access::Write => R | W,
        Access::Exec => X,
    }
}

/// One cached translation: `tag` is the page address | the permissions
/// the entry allows; `base` the frame's first byte.
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

#[inline(always)]
fn huge_index(addr: u64) -> usize {
    (addr / HUGE_SPAN) as usize % HUGE_ENTRIES
}

/// The permission bits of a tag for what an entry allows.
fn tag_bits((r, w, x): Perms) -> u64 {
    let bit = |ok: bool, b: u64| if ok { b } else { 0 };
    bit(r, R) | bit(w, W) | bit(x, X)
}

/// What a translation found inside an access.
#[derive(Clone, Copy)]
enum Lookup {
    /// A frame (its first byte).
    Frame(*mut u8),
    /// The shared zero page (reads and fetches only; never cached).
    Zero,
    /// No translation allows the access: fault.
    Fault,
}

/// One CPU's soft TLB for an address space (see the [module
/// docs](self)). Made by [`AddressSpace::translator`] (borrowing the
/// space) or [`Translator::new_owned`] (holding an `Arc` of it, for a
/// `struct Cpu` of an emulator); `Send`, so it may move to another thread
/// between accesses.
///
/// Every access returns a [`MemoryFault`] where a CPU would raise a
/// signal: its [`kind`](MemoryFault::kind) is `NoMapping`/`AccessDenied`
/// (SIGSEGV) from the fault path, `Bus` (SIGBUS, `BUS_ADRERR`) for a page
/// with no backing, `Alignment` (SIGBUS, `BUS_ADRALN`) for a split lock
/// under [`SplitLock::Fatal`]; its [`addr`](MemoryFault::addr) is the
/// first byte that could not be accessed.
///
/// ```
/// use aspace::{AddressSpace, Config, FaultError, MapFlags, Prot};
/// let mm = AddressSpace::new(Config::default());
/// let a = mm.mmap(0, 8192, Prot::READ | Prot::WRITE,
///                 MapFlags::PRIVATE | MapFlags::ANONYMOUS).unwrap();
/// let mut t = mm.translator();
/// t.store::<u64>(a, 7).unwrap();
/// assert_eq!(t.fetch_add::<u64>(a, 1).unwrap(), 7);
/// assert_eq!(t.load::<u64>(a).unwrap(), 8);
/// t.write(a + 4094, b"hi!!").unwrap();           // crosses a page
/// assert_eq!(t.load::<u32>(a + 4094).unwrap(), u32::from_le_bytes(*b"hi!!"));
/// let e = t.store::<u64>(a + 8188, 1).unwrap_err(); // into the hole
/// assert_eq!((e.addr, e.kind, e.done), (a + 8192, FaultError::NoMapping, 0));
/// ```
///
/// An owned translator moves into a thread:
///
/// ```
/// use aspace::{AddressSpace, Config, MapFlags, Prot, Translator};
/// use std::sync::Arc;
/// let mm = Arc::new(AddressSpace::new(Config::default()));
/// let a = mm.mmap(0, 4096, Prot::READ | Prot::WRITE,
///                 MapFlags::PRIVATE | MapFlags::ANONYMOUS).unwrap();
/// struct Cpu { tlb: Translator<'static> }
/// let mut cpu = Cpu { tlb: Translator::new_owned(mm.clone()) };
/// std::thread::spawn(move || cpu.tlb.store::<u32>(a, 5).unwrap()).join().unwrap();
/// assert_eq!(mm.translator().load::<u32>(a).unwrap(), 5);
/// ```
pub struct Translator<'a> {
    mm: &'a AddressSpace,
    slot: TranslatorRef,
    /// The generation the entries belong to.
    gen: u64,
    /// The summary last published in the slot: the regions of the
    /// entries filled since they were last dropped.
    regions: Regions,
    /// The thread the slot names as the translator's home (its last
    /// access's, [`crate::sync::thread_id`], never 0).
    home: u64,
    /// What an access compares the calling thread's id with: `home` while
    /// its light fence may be a compiler fence ([`asymmetric::watch`]),
    /// else [`FENCED`], which no thread's id is, so that every access
    /// takes `enter_slow` and its full fence.
    key: u64,
    entries: [Entry; ENTRIES],
    /// PMD leaves cached as one translation each: `tag` is the 2 MiB
    /// span's address | its permissions, `base` its first byte. A miss of
    /// `entries` inside one fills the 4 KiB entry from it with no walk;
    /// dropped with `entries` (same generation, same flushes).
    huge: [Entry; HUGE_ENTRIES],
    /// An owned translator's space, which `mm` points into; declared last
    /// so that it is dropped after `Drop::drop` used `mm`.
    _owner: Option<std::sync::Arc<AddressSpace>>,
}

// SAFETY: the raw pointers are frame addresses of `mm`'s allocator, valid
// while `mm` lives (which the borrow or `_owner` guarantees, whatever the
// thread) and only ever accessed atomically; the flush protocol holds
// across a move between accesses (module docs, "Moving between threads").
unsafe impl Send for Translator<'_> {}

impl AddressSpace {
    /// A soft TLB for the calling thread, borrowing the space: loads,
    /// stores and atomics at cached translations, faulting like a CPU on a
    /// miss (see [`crate::translate`]). See [`Translator::new_owned`] for
    /// one that owns an `Arc` of the space.
    pub fn translator(&self) -> Translator<'_> {
        Translator::new(self, None)
    }
}

impl Translator<'static> {
    /// A translator that holds `mm` (a `'static`, `Send` handle, for a
    /// CPU struct that also holds the space, or a thread of its own).
    pub fn new_owned(mm: std::sync::Arc<AddressSpace>) -> Self {
        let ptr: *const AddressSpace = &*mm;
        // SAFETY: `ptr` points into the Arc's allocation, which the
        // translator keeps alive in `_owner` for as long as it exists and
        // drops only after its last use of `mm` (field order); the space
        // is only ever reached through shared references.
        let space: &'static AddressSpace = unsafe { &*ptr };
        Translator::new(space, Some(mm))
    }
}

impl<'a> Translator<'a> {
    fn new(mm: &'a AddressSpace, owner: Option<std::sync::Arc<AddressSpace>>) -> Self {
        mm.tlb.note_cpu();
        let home = thread_id();
        let slot = mm.tlb.register_translator(home);
        // Registers for membarrier now, off the hot path, and for the
        // switch to full fences, which bumps the slot's generation.
        let key = if crate::tlb::watch_fences(&slot) {
            home
        } else {
            FENCED
        };
        Translator {
            mm,
            gen: slot.hot.acked.load(Ordering::Relaxed),
            regions: Regions::NONE,
            home,
            key,
            slot,
            entries: [EMPTY; ENTRIES],
            huge: [EMPTY; HUGE_ENTRIES],
            _owner: owner,
        }
    }

    /// Begins an access: publishes it, then drops every entry if a flush
    /// ran since the last one (see [`crate::tlb`]). Returns the slot's
    /// `busy` word for [`leave`](Self::leave), so that the hit path keeps
    /// it in a register rather than reload it after the frame access.
    #[inline(always)]
    fn enter(&mut self) -> Busy {
        self.enter_as(IN_ACCESS)
    }

    /// [`enter`](Self::enter), publishing `mark` ([`IN_ACCESS`] or a
    /// block's `tlb::block_mark`) as the `busy` word: flushes wait alike
    /// for both; a flush on the block's own thread tells a block it would
    /// wait on for ever (see [`Block`]).
    #[inline(always)]
    fn enter_as(&mut self, mark: u64) -> Busy {
        // The hot line's address, kept in a register across the compiler
        // fence (which would otherwise reload `self.slot`).
        let busy = Busy(&*self.slot.hot);
        busy.get().busy.store(mark, Ordering::Relaxed);
        // A compiler fence, with no load of the fence mode: the
        // generation check below stands in for it (a switch to full
        // fences bumps the generation, see `asymmetric`'s "Watched light
        // fences"); with full fences `key` sends every access to
        // `enter_slow`, which fences.
        asymmetric::light_watched();
        let gen = busy.get().gen.load(Ordering::Acquire);
        // One branch for a flush since the last access, for an access on
        // another thread than the last (a thread-local load, 0 on a
        // thread that never made its id, which no home is) and for full
        // fences.
        if (gen ^ self.gen) | (thread_id_if_made() ^ self.key) != 0 {
            self.enter_slow(gen);
        }
        busy
    }

    /// [`enter`](Self::enter) after a flush, on a new thread or with full
    /// fences: with full fences (the process has no membarrier, or
    /// switched away from it), issues the light fence's full fence and
    /// loads the generation again; on a new thread, publishes it as the
    /// home (a store and a full fence, so a flush on the old home no
    /// longer skips this translator, see `tlb`) and loads the generation
    /// again, after that fence; then obeys the flushes.
    #[cold]
    #[inline(never)]
    fn enter_slow(&mut self, mut gen: u64) {
        if self.key == FENCED || self.slot.fenced() {
            // Mutation the unit test `a_switch_to_fences_reaches_translators`
            // catches: keeping `key` (the switched translator would go on
            // with compiler fences).
            self.key = FENCED;
            crate::sync::fence(Ordering::SeqCst);
            gen = self.slot.hot.gen.load(Ordering::Acquire);
        }
        let here = thread_id();
        if here != self.home {
            // Mutation the loom model `translator_moved_vs_own_flush`
            // catches: skipping the rehome (the slot keeps naming the
            // old thread, whose flushes then skip this translator).
            self.slot.rehome(here);
            self.home = here;
            if self.key != FENCED {
                self.key = here;
            }
            gen = self.slot.hot.gen.load(Ordering::Acquire);
        }
        if gen != self.gen {
            self.drop_entries(gen);
        }
    }

    /// Ends an access: everything it did happens before a flush that
    /// waits for it returns.
    #[inline(always)]
    fn leave(&self, busy: Busy) {
        busy.get().busy.store(0, Ordering::Release);
    }

    /// Obeys the flushes up to `gen`, which the flushers may be waiting
    /// to hear (inside an access that began after them): drops every
    /// entry, then empties the summary, which covered them.
    #[cold]
    fn drop_entries(&mut self, gen: u64) {
        self.entries.fill(EMPTY);
        self.huge.fill(EMPTY);
        self.regions = Regions::NONE;
        self.slot.clear_regions();
        self.gen = gen;
        self.slot.hot.acked.store(gen, Ordering::Release);
    }

    /// Before a walk of `page`: makes the summary cover its region
    /// (publishing it, with a full fence, only if that region is new).
    #[inline(always)]
    fn cover(&mut self, page: u64) {
        let r = Regions::of(page);
        if !self.regions.meets(r) {
            self.regions = self.regions.union(r);
            // Mutation the loom models catch: skipping this (a walk the
            // summary does not cover, so a flush skips this translator).
            self.slot.publish_regions(self.regions);
        }
    }

    /// The cached frame of `addr`'s page if it allows the access whose
    /// [`perm`] is `need` and `addr` is a multiple of `align` (a power of
    /// two up to 8). One compare: `tag ^ (addr | need)` is zero in the
    /// page bits iff the pages match, in the `need` bits iff the tag has
    /// them, and in the low bits iff `addr` is aligned (the tag's are
    /// zero); the offset's other bits are masked out.
    #[inline(always)]
    fn hit(&self, addr: u64, need: u64, align: u64) -> Option<*mut u8> {
        let e = &self.entries[index(addr)];
        ((e.tag ^ (addr | need)) & (PAGE_MASK | need | (align - 1)) == 0).then_some(e.base)
    }

    /// Inside an access: translates `page` from the cache (a 4 KiB
    /// entry, or a 2 MiB one, from which the 4 KiB entry is filled), or
    /// walks the page table and caches what it finds (a PMD leaf also as
    /// a 2 MiB entry).
    fn translate(&mut self, page: u64, access: Access) -> Lookup {
        let need = perm(access);
        if let Some(base) = self.hit(page, need, 1) {
            return Lookup::Frame(base);
        }
        let h = self.huge[huge_index(page)];
        if (h.tag ^ (page | need)) & (HUGE_MASK | need) == 0 {
            // SAFETY: a cached 2 MiB entry's base is the first byte of a
            // huge frame's contiguous 2 MiB (`huge_frame_ptr`); the offset
            // is below 2 MiB.
            let base = unsafe { h.base.add((page & !HUGE_MASK) as usize) };
            let tag = page | (h.tag & (R | W | X));
            self.entries[index(page)] = Entry { tag, base };
            self.mm.stats.inc(Event::translator_huge_hits);
            return Lookup::Frame(base);
        }
        self.mm.stats.inc(Event::translator_walks);
        self.cover(page);
        let (l, perms, huge) = walk(self.mm, page, access);
        if let Lookup::Frame(base) = l {
            let tag = tag_bits(perms);
            self.entries[index(page)] = Entry {
                tag: page | tag,
                base,
            };
            if let Some(span) = huge {
                self.huge[huge_index(page)] = Entry {
                    tag: (page & HUGE_MASK) | tag,
                    base: span,
                };
            }
        }
        l
    }

    /// Runs `f` on the translations of the (at most two) pages of
    /// `[addr, addr + len)`, `0 < len <= PAGE_SIZE`, inside one access,
    /// faulting pages in first as needed: `f` runs only once every page
    /// allows the access, so a store that fails has written nothing. The
    /// error's `done` is 0.
    fn with_span<R>(
        &mut self,
        addr: u64,
        len: usize,
        access: Access,
        f: impl FnOnce(Lookup, Lookup) -> R,
    ) -> Result<R, MemoryFault> {
        let fail = |addr, kind| MemoryFault {
            addr,
            kind,
            done: 0,
        };
        let first = addr & PAGE_MASK;
        let end = addr.checked_add(len as u64);
        let top = self.mm.cfg.task_size;
        let Some(end) = end.filter(|&e| e <= top) else {
            // Past user space: the part below it faults first, as on a
            // CPU; else the first byte past it is the faulting one.
            if addr < top {
                self.with_span(addr, (top - addr) as usize, access, nothing)?;
            }
            return Err(fail(top.max(addr), FaultError::NoMapping));
        };
        let last = (end - 1) & PAGE_MASK;
        let (a, busy) = loop {
            let busy = self.enter();
            let a = self.translate(first, access);
            let b = if last == first {
                a
            } else {
                self.translate(last, access)
            };
            let (missing, at) = match (a, b) {
                (Lookup::Fault, _) => (first, addr),
                (_, Lookup::Fault) => (last, last),
                _ => break ((a, b), busy),
            };
            // Fault outside the access: the fault may flush, or wait for
            // an mmap_lock writer that is flushing.
            self.leave(busy);
            self.mm
                .fault(missing, access)
                .map_err(|kind| fail(at, kind))?;
        };
        let r = f(a.0, a.1);
        self.leave(busy);
        Ok(r)
    }
}

/// Whether an entry allows (read, write, exec).
type Perms = (bool, bool, bool);

/// Walks `mm`'s page table for `page`: what it maps if that allows the
/// access, what the entry allows, and, if a PMD leaf of a huge frame maps
/// it, the first byte of the leaf's 2 MiB.
fn walk(mm: &AddressSpace, page: u64, access: Access) -> (Lookup, Perms, Option<*mut u8>) {
    let g = mm.pt.pin();
    let entry = mm.pt.lookup_entry(page, &g);
    let (pte, huge) = if entry.is_huge() {
        let sub = ((page & !HUGE_MASK) / PAGE_SIZE) as u32;
        (entry.subpage(sub), entry.frame())
    } else {
        (entry, None)
    };
    let (l, perms) = walk_entry(mm, pte, access);
    let span = match l {
        Lookup::Frame(_) => huge.and_then(|head| mm.frames.huge_frame_ptr(head)),
        _ => None,
    };
    (l, perms, span)
}

/// What the 4 KiB entry `pte` maps if it allows the access, and what it
/// allows.
fn walk_entry(mm: &AddressSpace, pte: crate::pt::Pte, access: Access) -> (Lookup, Perms) {
    let f = pte.flags();
    if !pte.is_present() || !f.contains(PteFlags::USER) {
        return (Lookup::Fault, (false, false, false));
    }
    // Execute-only pages (the protection key) allow no data access.
    let data = !f.contains(PteFlags::EXEC_ONLY);
    let perms = (
        data,
        data && f.contains(PteFlags::WRITE),
        !f.contains(PteFlags::NX),
    );
    let ok = match access {
        Access::Read => perms.0,
        Access::Write => perms.1,
        Access::Exec => perms.2,
    };
    if !ok {
        return (Lookup::Fault, perms);
    }
    if pte.pfn().is_zero_page() {
        return (Lookup::Zero, perms);
    }
    (Lookup::Frame(mm.frames.frame_ptr(pte.pfn())), perms)
}

/// A translator's hot line (its `busy` word and generation) during an
/// access (see [`Translator::enter`]).
#[derive(Clone, Copy)]
struct Busy(*const SlotHot);

impl Busy {
    #[inline(always)]
    fn get(&self) -> &SlotHot {
        // SAFETY: made by `enter` from the translator's slot, which the
        // translator holds (an `Arc`, never replaced) for as long as it
        // exists; a `Busy` lives only inside one access.
        unsafe { &*self.0 }
    }
}

/// What `with_span` runs to fault pages in only.
fn nothing(_: Lookup, _: Lookup) {}

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
        let cached = self.entries.iter().filter(|e| e.tag != 0).count();
        let huge = self.huge.iter().filter(|e| e.tag != 0).count();
        f.debug_struct("Translator")
            .field("cached", &cached)
            .field("cached_2m", &huge)
            .field("gen", &self.gen)
            .field("regions", &format_args!("{:#x}", self.regions.0))
            .field("owned", &self._owner.is_some())
            .finish()
    }
}

#[cfg(all(test, not(aspace_loom)))]
mod tests {
    use super::*;
    use crate::{Config, MapFlags, Prot};

    /// A switch of the process to full fences reaches a live translator
    /// through its generation (`asymmetric`'s "Watched light fences"): its
    /// next access takes the slow path and from then on fences in every
    /// access, on every thread, while it still translates and obeys
    /// flushes.
    #[test]
    fn a_switch_to_fences_reaches_translators() {
        let mm = AddressSpace::new(Config::default());
        let a = mm
            .mmap(
                0,
                2 * PAGE_SIZE,
                Prot::READ | Prot::WRITE,
                MapFlags::PRIVATE | MapFlags::ANONYMOUS,
            )
            .unwrap();
        let mut t = mm.translator();
        t.store::<u64>(a, 1).unwrap();
        t.store::<u64>(a + PAGE_SIZE, 2).unwrap();
        if asymmetric::expedited() {
            assert_eq!(t.key, t.home, "an expedited translator fenced");
        }
        asymmetric::Watcher::switched(&*t.slot);
        assert_eq!(t.load::<u64>(a).unwrap(), 1);
        assert_eq!(t.key, FENCED, "the switch did not reach the translator");
        mm.munmap(a + PAGE_SIZE, PAGE_SIZE).unwrap();
        let e = t.load::<u64>(a + PAGE_SIZE).unwrap_err();
        assert_eq!((e.addr, e.kind), (a + PAGE_SIZE, FaultError::NoMapping));
        let here = thread_id();
        let t = std::thread::scope(|s| {
            s.spawn(move || {
                t.store::<u64>(a, 3).unwrap();
                t
            })
            .join()
            .unwrap()
        });
        assert_ne!(t.home, here, "the access on the new thread rehomed");
        assert_eq!(t.key, FENCED, "a move to another thread unfenced it");
        assert_eq!(mm.translator().load::<u64>(a).unwrap(), 3);
    }
}
