//! TLB model: the CPUs of an address space, shootdowns, and an
//! mmu_gather-style batch of flushes and frames to free.
//!
//! Every thread that faults on or accesses an address space becomes one of
//! its CPUs (a per-CPU flag, set once, so the mask costs no shared write).
//! A user-mode access (`read`/`write`) is the simulated "TLB entry": while
//! it translates an address and copies bytes, it is counted in flight on
//! its CPU slot. A flush sends a shootdown to every other CPU in the mask
//! and waits until every access that began before the flush has ended,
//! exactly what an IPI-based flush guarantees. Only then are the gathered
//! frames freed, so a frame is never reused while an old translation of it
//! may still be in use.
//!
//! Several threads may share a CPU slot (more threads than slots), so a
//! slot counts its accesses in flight rather than keeping a parity. The
//! counts come in two buckets, like SRCU's: new accesses count in the
//! bucket `phase` names; a flush flips the phase and waits for the other
//! bucket to drain, twice (once per bucket). A bucket it waits for only
//! drains (new accesses go to the other one), so a flush cannot be starved
//! by a stream of later accesses.
//!
//! # Soft TLBs ([`crate::translate::Translator`])
//!
//! A translator caches translations across accesses, so unlike
//! `read`/`write` it holds TLB entries between them; a flush must make
//! every translator that may hold an entry of what it changed drop it,
//! without waiting for a translator that is idle (its thread may be
//! blocked for good), and without a shared write, an atomic
//! read-modify-write or a full fence on a hit. A flush reaches only the
//! translators that may hold an entry in the flushed range (a targeted
//! flush, as Linux's shootdown reaches only the CPUs in the mm's cpumask):
//! threads that each work on their own range do not empty, fence or wait
//! for each other. The design, per translator slot (registered here under
//! `flush_lock`):
//!
//! - The *summary* (`regions`, a line of its own, [`Regions`]): the 1 GiB
//!   regions (hashed into 64 bits) the translator may hold entries of. The
//!   translator grows it on a miss, before its walk: it stores the grown
//!   set (Release) and issues a full `SeqCst` fence, only when the walked
//!   page's region is new to it (the slow path). It empties it (Release)
//!   only after dropping all its entries.
//! - The hot line, which only this translator's accesses and the flushes
//!   that reach it touch: `gen`, the translator's generation, bumped
//!   (Release) by each flush that reaches it; `busy`, 1 while the
//!   translator is inside an access; `acked`, the last generation it
//!   dropped its entries for. An access stores `busy = 1`, issues a
//!   *light* fence, loads `gen` (and if it changed, drops its entries,
//!   empties its summary and stores `acked = gen`, Release), translates
//!   (a cache hit, or a page-table walk that fills the cache, after
//!   growing the summary), touches the frame, then stores `busy = 0`
//!   (Release). Both stores are of constants, so a hit carries no
//!   dependency through memory from one access to the next. A miss that
//!   must fault leaves the access first: the fault may flush, or wait for
//!   an mmap_lock writer that is flushing.
//! - A flush of the regions `M` (what its gather recorded), after
//!   changing the page table, issues a `SeqCst` fence, then loads each
//!   slot's summary (Acquire). A slot whose summary meets `M` *overlaps*:
//!   the flush bumps its `gen` to a `target`. If some slot overlaps, it
//!   issues a `SeqCst` fence and loads each such slot's `home`: a slot at
//!   home on the flushing thread needs nothing more. Only if some other
//!   slot overlaps, it then issues a *heavy* fence
//!   ([`crate::sync::asymmetric`]: `membarrier(2)`, a full barrier on
//!   every running thread, which is what an IPI is; if membarrier starts
//!   failing, the process switches to full fences on both sides, see
//!   there), and for each such slot waits until `busy == 0` or
//!   `acked >= target`. Slots that do not overlap it neither writes nor
//!   waits for.
//! - The *home* (on the summary's line, [`Published`]): the id
//!   ([`crate::sync::thread_id`], never reused, never 0) of the thread
//!   of the translator's last access, its maker's at first. The
//!   translator keeps a private copy; an access loads the calling
//!   thread's id (one thread-local word) and compares it with the copy in
//!   the same branch as its generation check, so a hit writes and reads
//!   no shared line for it. Only on the first access on another thread
//!   (the slow path: `enter_slow`) does it store the new home (Release),
//!   issue a `SeqCst` fence and load `gen` again, before any use of its
//!   entries.
//!
//! Why a slot that does not overlap holds no stale entry of `M`: take its
//! entry for a page `p` of `M` that it uses after the flush F changed
//! `p`'s translation. The walk W that filled it followed, in its program
//! order, a store S of a summary holding `p`'s region and a `SeqCst`
//! fence (the one after S, or an earlier one after the store that first
//! set that bit: the bit stays set until the summary is emptied, which
//! drops the entry). F changed the page table, then fenced, then loaded
//! the summary: the store-buffer pattern. If W's fence precedes F's in
//! the fence order, F's load reads S or a later value: one still holding
//! the bit (so the slot overlaps), or an emptied one, stored (Release)
//! after the translator dropped that entry, every access that used it
//! having ended before, so the Acquire load orders those uses before F's
//! frees. Otherwise W, after its fence, reads F's change: the entry is
//! not stale. So F may skip the slot.
//!
//! Why no stale entry survives in a slot that overlaps: take an access A
//! and the flush F. The light/heavy pair orders like two `SeqCst` fences.
//! If A's light fence comes after F's heavy fence, A's load of `gen` sees
//! the bump, so A drops its entries; its walk, ordered after that
//! Acquire load, sees the page-table change made before the Release bump.
//! Otherwise A's `busy = 1` is visible to F after the heavy fence, and F
//! waits until it reads `busy == 0` or `acked >= target`, both stored
//! (Release) after A ended: A's frame access happens before F returns and
//! before the gathered frames are freed. Every later access of that
//! translator loads `gen` after its own light fence, which follows that
//! store, so it sees the bump (were its fence before F's in the fence
//! order, F would have read its `busy = 1` rather than the earlier value)
//! and drops what A filled from the old page table. A translator that is
//! idle has `busy == 0`: F reads it once and goes on. F is not starved by
//! a translator that keeps accessing: its next access acknowledges the
//! bump. Translators registered after F took `flush_lock` see F's
//! page-table change through the lock (their summary starts empty).
//! Nothing here depends on the thread: a translator moved to another
//! thread between accesses (they are `Send`) is handed over with a
//! happens-before edge, so its next `busy = 1` follows its last
//! `busy = 0`, `acked` and summary, and its fences on the new thread pair
//! with F's like any other (membarrier interrupts every running thread of
//! the process).
//!
//! Why a slot at home on the flushing thread needs neither the heavy
//! fence nor the wait: F bumped its `gen`, fenced, then read `home` equal
//! to its own thread's id. No access of that translator is in progress on
//! F's thread (a flush never runs inside an access: a miss leaves the
//! access before it faults; were F a signal handler interrupting one, F
//! would read its own `busy = 1` and take the heavy fence and the wait,
//! as every flush did before), and the accesses it made there are sequenced
//! before F, so their uses of frames happen before F's frees; its later
//! accesses there are sequenced after F's bump and see it. An access on
//! another thread T: the last home the translator published before
//! that access (hand-overs order its publications) names T, stored by
//! that access or an earlier one on T, each followed by a `SeqCst` fence
//! and then that access's and every later access's load of `gen`. F read
//! F's id: a home stored on F after the translator came back from T (T's
//! accesses then happen before F), or one older than T's store. In the
//! latter case the store-buffer pattern against F's bump, fence and load
//! of `home` puts T's fence after F's in the fence order, so each of
//! those loads of `gen` sees the bump: T drops its entries before any
//! use, and walks after that Acquire load, so it sees F's page-table
//! change. Ids are never reused, so a
//! thread that ended cannot be mistaken for F. The skip therefore needs
//! no fence on the hit path: moving a translator costs its first access
//! on the new thread a full fence, and every access one thread-local load
//! and two ALU operations folded into the generation branch. A flush of
//! the thread's own translators (an emulator's MADV_DONTNEED of its own
//! guest memory, a JIT's mprotect) costs one `SeqCst` fence instead of a
//! membarrier and its IPIs. With another thread's translator overlapping
//! too, the flush takes the heavy fence and waits for that one only.
//!
//! Flushes of the whole space (teardown, and a gather that recorded no
//! range) pass [`Regions::ALL`] and reach every translator with a
//! non-empty summary; fork, exec's reset and munmap of everything reach
//! those whose summary meets what they changed, which is every one that
//! may hold an entry of it. With no translator overlapping, a flush does
//! none of this (no `gen` bump, no heavy fence, no wait). The shootdowns
//! counted in [`crate::Stats`] are then real: each translator of another
//! thread that a flush reaches counts one.
//!
//! Shared lines: a hit writes only its own slot's hot line (which a
//! flusher writes only when it reaches that slot) and reads nothing
//! another thread writes in steady state (not even the fence mode: a
//! switch to full fences bumps its generation instead, see
//! `asymmetric`'s "Watched light fences"); a miss whose
//! region is new, and the first access on another thread, write the
//! slot's published line (summary and home), which flushers only read;
//! the home check reads a thread-local word. A flush reads every slot's
//! published line and writes the hot lines of the slots it reaches.
//!
//! # Blocks
//!
//! A [`crate::translate::Block`] is an access section held across many
//! accesses (a guest basic block, as QEMU runs a translated block): it
//! stores its mark in `busy` ([`block_mark`]: `IN_BLOCK` tagged with its
//! thread's id), fences and checks its generation and home once at its
//! start, runs its hits with no further store or fence, and stores
//! `busy = 0` at its end. The argument above holds with "access" read as
//! "block": every frame use of the block lies between its `busy` store and
//! its `busy = 0` (Release), and a miss inside it ends the section before
//! it walks or faults (`busy = 0`) and begins a new one after (its mark,
//! the light fence, the generation and home check), so a flush that
//! reached the translator meanwhile is obeyed before any later hit. A
//! flush on another thread therefore waits for the block to end, as QEMU's
//! synced cross-vCPU TLB flush waits for the vCPU to reach a block
//! boundary: blocks must be short. A flush on the block's own thread while
//! it is open (a writer of the space called inside the block) would wait on
//! itself for ever; it is a rule of the API (`Block`'s docs), checked by
//! `shoot_translators` (one compare per reached slot, on the flush's slow
//! path, in every build), which aborts with a message rather than hang
//! when a reached slot's `busy` names a block of the flushing
//! thread (the id in it tells that block from one another thread is
//! opening before it rehomes the slot).
//!
//! # A thread stopped inside an access
//!
//! A flush waits for every access that may hold an old translation: a
//! `read`/`write` counted in the bucket it drains, a translator with
//! `busy == 1` that has not acknowledged. A thread stopped inside one
//! (descheduled, `SIGSTOP`ped, held by a debugger) therefore stalls every
//! flush of its address space until it runs again and leaves: a
//! preempted thread for a scheduling delay, a stopped one until it is
//! continued, and one never continued for ever. The flusher spins, then
//! yields, meanwhile, holding what its caller holds: the flush lock (the
//! space's other flushes queue behind it) and, for munmap, mprotect and
//! the other mmap_lock writers, the write side, so the space's writers
//! and the faults that need the mmap_lock wait too; other address spaces
//! are not affected. It is not a deadlock: an access takes no lock and
//! never waits (a translator's miss leaves the access before it faults),
//! so the stopped thread waits for nothing the flusher holds. Only the
//! access itself counts: a thread stopped between accesses, a translator
//! left idle, or one whose thread is blocked in a fault, stalls nothing,
//! and neither does the heavy fence, which interrupts only running CPUs
//! (a stopped thread passed a full barrier when it was switched out).
//! Linux differs here: a stopped thread uses no TLB entry, so its
//! shootdowns never wait for one; in aspace the access *is* the entry in
//! use, so stopping a thread mid-access is like stopping a CPU that holds
//! one.
//!
//! # Locking
//!
//! The flush lock is the innermost lock of the address space (see
//! [`crate::mm`]); it is taken under PTE-table locks only by mremap's
//! per-extent flushes. Accesses in flight take no lock.

use crate::percpu::{cpu_id, PerCpu};
use crate::stats::{Event, StatCounters};
use crate::sync::{
    asymmetric, fence, thread_id, wait_until, Arc, AtomicBool, AtomicU64, AtomicUsize, Mutex,
    Ordering,
};
use crossbeam_utils::CachePadded;

mod gather;
mod regions;
pub(crate) use gather::Gather;
pub(crate) use regions::Regions;

/// One CPU's view of an address space.
#[derive(Default)]
pub(crate) struct CpuSlot {
    in_mask: AtomicBool,
    /// Accesses in flight on this slot, by the phase they began in.
    inflight: [AtomicU64; 2],
}

/// The line of a translator's slot that its accesses touch.
#[derive(Default)]
pub(crate) struct SlotHot {
    /// 1 while the translator is inside an access, a [`block_mark`] inside
    /// a block (a section of many accesses), else 0.
    pub(crate) busy: AtomicU64,
    /// The translator's generation: bumped by each flush that reaches it.
    pub(crate) gen: AtomicU64,
    /// The generation whose flush the translator has obeyed (dropped its
    /// entries for, at the start of an access).
    pub(crate) acked: AtomicU64,
}

/// The low bits of the `busy` word of a translator inside a block
/// ([`crate::translate::Block`]): an access section held across many
/// accesses, between them too. Flushes wait for it like for an access; one
/// on the block's own thread would wait for ever (module docs, "Blocks").
pub(crate) const IN_BLOCK: u64 = 2;

/// The `busy` word of a block opened on the thread `id`
/// ([`crate::sync::thread_id`]): [`IN_BLOCK`] with the thread's id above
/// it, so that a flush tells a block open on its own thread (which it
/// would wait for ever) from one that another thread is opening while the
/// slot still names the flusher's thread as home.
#[inline(always)]
pub(crate) fn block_mark(id: u64) -> u64 {
    id << 2 | IN_BLOCK
}

/// One translator's state as flushes see it.
pub(crate) struct TranslatorSlot {
    /// Written by the translator's accesses; by a flusher only when it
    /// reaches this translator.
    pub(crate) hot: CachePadded<SlotHot>,
    /// What the translator publishes for flushers (written rarely, by
    /// the translator only): its summary and its home thread.
    published: CachePadded<Published>,
    /// The thread that made the translator ([`thread_token`]), for the
    /// shootdown count only: a translator moved to another thread
    /// (translators are `Send`) still counts as its maker's.
    owner: usize,
}

/// The line of a translator's slot that the translator writes off its
/// hit path (a miss in a new region, a first access on another thread,
/// the drop of its entries) and flushers read.
pub(crate) struct Published {
    /// The regions the translator may hold entries of ([`Regions`] bits):
    /// grown before a walk, emptied after dropping its entries.
    regions: AtomicU64,
    /// The thread ([`crate::sync::thread_id`]) the translator last
    /// accessed on (its maker's before its first access): stored, then a
    /// `SeqCst` fence, before its first access on another thread loads its
    /// generation (the home argument in the module docs).
    home: AtomicU64,
    /// Set by a switch of the process to full fences, before it bumps the
    /// generation ([`asymmetric::Watcher`]): the translator's accesses must
    /// then issue full fences. A `std` atomic even under loom, where no
    /// switch happens.
    fenced: std::sync::atomic::AtomicBool,
}

impl TranslatorSlot {
    /// Records that the translator now accesses on the thread `id`,
    /// before that access loads its generation (module docs, "Why a slot
    /// at home on the flushing thread ..."). Called by the translator on
    /// its first access on a thread other than its last one.
    #[cold]
    pub(crate) fn rehome(&self, id: u64) {
        self.published.home.store(id, Ordering::Release);
        // Mutation the loom model `translator_moved_vs_own_flush`
        // catches: deleting this fence (the store-buffer pattern against
        // the flusher's bump, fence and load of `home`).
        fence(Ordering::SeqCst);
    }

    /// Adds `grown`'s regions to the summary before a walk, with the
    /// fence that makes the flushes of those regions see it or the walk
    /// see their page-table changes (module docs). Called by the
    /// translator only, with its whole summary, when it grew.
    #[cold]
    pub(crate) fn publish_regions(&self, grown: Regions) {
        self.published.regions.store(grown.0, Ordering::Release);
        fence(Ordering::SeqCst);
    }

    /// True once the process switched to full fences (read by the
    /// translator after it saw the generation that switch bumped).
    pub(crate) fn fenced(&self) -> bool {
        self.published
            .fenced
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Empties the summary: the translator has dropped all its entries
    /// (Release: the accesses that used them happen before a flusher that
    /// reads the empty summary).
    pub(crate) fn clear_regions(&self) {
        self.published.regions.store(0, Ordering::Release);
    }
}

/// A switch to full fences bumps the generation, like a flush that
/// reaches the translator, so that its next access's check fails and its
/// slow path sees the new mode (`asymmetric`, "Watched light fences").
impl asymmetric::Watcher for TranslatorSlot {
    fn switched(&self) {
        // Ordered before the bump (Release), which the translator's
        // Acquire load of the generation reads before it reads this.
        self.published
            .fenced
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.hot.gen.fetch_add(1, Ordering::Release);
    }
}

/// Registers `slot`'s translator for the switch to full fences (and the
/// process for membarrier); true if its accesses may fence with
/// [`asymmetric::light_watched`]. Under loom always true: that fence is a
/// full one there, and loom's `Arc` has no `std` weak reference.
pub(crate) fn watch_fences(slot: &TranslatorRef) -> bool {
    #[cfg(not(aspace_loom))]
    {
        let weak: std::sync::Weak<TranslatorSlot> = Arc::downgrade(slot);
        asymmetric::watch(weak as std::sync::Weak<dyn asymmetric::Watcher>)
    }
    #[cfg(aspace_loom)]
    {
        let _ = slot;
        true
    }
}

/// A number that no other live thread has.
fn thread_token() -> usize {
    thread_local!(static TOKEN: u8 = const { 0 });
    TOKEN.with(|t| t as *const u8 as usize)
}

/// A registered translator's slot (its lines padded inside).
pub(crate) type TranslatorRef = Arc<TranslatorSlot>;

/// The CPUs of one address space.
pub(crate) struct TlbState {
    cpus: PerCpu<CpuSlot>,
    /// The bucket new accesses count in (low bit); flipped by flushes.
    phase: AtomicUsize,
    /// Serializes flushes, so that each waits on a bucket no other flush
    /// has made current again, and holds the registered translators.
    /// Holders wait only for accesses, which never take it, and never wait
    /// for a page-table lock.
    flush_lock: Mutex<Vec<TranslatorRef>>,
    /// Simulated cost of one shootdown, in nanoseconds (0 = off).
    shootdown_cost_ns: u64,
}

/// While alive, the calling CPU is inside a user-mode access.
pub(crate) struct AccessGuard<'a> {
    count: &'a AtomicU64,
}

impl AccessGuard<'_> {
    /// Under loom, a scheduling point between taking a translation and
    /// using it (the window in which a real CPU holds a TLB entry), so
    /// models can run a flush inside it. Nothing otherwise.
    #[inline]
    pub(crate) fn model_point(&self) {
        // A read-modify-write that changes nothing: it conflicts with a
        // flusher's load of the count, so loom tries the flush here.
        #[cfg(aspace_loom)]
        self.count.fetch_add(0, Ordering::Relaxed);
    }
}

impl Drop for AccessGuard<'_> {
    fn drop(&mut self) {
        // Release: the copy happens before a flusher sees the count drop.
        self.count.fetch_sub(1, Ordering::Release);
    }
}

impl TlbState {
    pub(crate) fn new(shootdown_cost_ns: u64) -> Self {
        TlbState {
            cpus: PerCpu::new(CpuSlot::default),
            phase: AtomicUsize::new(0),
            flush_lock: Mutex::new(Vec::new()),
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
        let count = &slot.inflight[self.phase.load(Ordering::Relaxed) & 1];
        count.fetch_add(1, Ordering::Relaxed);
        // Pairs with the fences in `flush`: either the flusher sees our
        // count, or we see the page-table change it made before it.
        fence(Ordering::SeqCst);
        AccessGuard { count }
    }

    /// Flushes `pages` pages of translations, in `regions`, on every CPU
    /// of the mask and every translator that may cache them: counts the
    /// flush and one shootdown per other CPU, and waits for each to leave
    /// any access that began before this call.
    pub(crate) fn flush(&self, stats: &StatCounters, pages: u64, regions: Regions) {
        fence(Ordering::SeqCst);
        stats.inc(Event::tlb_flushes);
        stats.add(Event::tlb_pages_flushed, pages);
        let me = cpu_id() % self.cpus.len();
        let mut shootdowns = 0;
        for cpu in 0..self.cpus.len() {
            if cpu != me && self.cpus.get(cpu).in_mask.load(Ordering::Relaxed) {
                shootdowns += 1;
                spin_ns(self.shootdown_cost_ns);
            }
        }
        if shootdowns > 0 {
            stats.add(Event::tlb_shootdowns, shootdowns);
        }
        // Wait out every access that may hold an old translation: whichever
        // bucket it counts in, one of the two rounds waits for it to drain.
        // Our own slot too: another thread may share it (the flusher itself
        // is never inside an access).
        let translators = self.flush_lock.lock();
        if !translators.is_empty() {
            let others = shoot_translators(&translators, regions);
            if others > 0 {
                stats.add(Event::translator_shootdowns, others);
            }
        }
        for _ in 0..2 {
            let old = self.phase.load(Ordering::Relaxed) & 1;
            self.phase.store(old ^ 1, Ordering::Relaxed);
            // An access that counted itself in `old` after this fence loaded
            // the phase before the flip, and reads the page table after it.
            fence(Ordering::SeqCst);
            for cpu in 0..self.cpus.len() {
                let slot = self.cpus.get(cpu);
                if !slot.in_mask.load(Ordering::Relaxed) {
                    continue;
                }
                let count = &slot.inflight[old];
                if count.load(Ordering::Acquire) != 0 {
                    wait_until(|| count.load(Ordering::Acquire) == 0);
                }
            }
        }
    }
}

impl TlbState {
    /// Registers a new translator: a slot the flushes will look at, with
    /// an empty summary (so none reaches it until it walks).
    /// `home` is the maker thread's [`crate::sync::thread_id`], the
    /// translator's home until it accesses on another thread.
    pub(crate) fn register_translator(&self, home: u64) -> TranslatorRef {
        let slot = Arc::new(TranslatorSlot {
            hot: CachePadded::new(SlotHot::default()),
            published: CachePadded::new(Published {
                regions: AtomicU64::new(0),
                home: AtomicU64::new(home),
                fenced: std::sync::atomic::AtomicBool::new(false),
            }),
            owner: thread_token(),
        });
        self.flush_lock.lock().push(slot.clone());
        slot
    }

    /// Forgets a translator (it is outside any access).
    pub(crate) fn unregister_translator(&self, slot: &TranslatorRef) {
        let mut all = self.flush_lock.lock();
        if let Some(i) = all.iter().position(|s| Arc::ptr_eq(s, slot)) {
            all.swap_remove(i);
        }
    }
}

/// Makes every translator whose summary meets `regions` drop its entries,
/// and waits for the accesses that may still use one; the others it
/// leaves alone (the argument is in the module docs). Called after the
/// flush's `SeqCst` fence, under `flush_lock`. Returns how many
/// translators of other threads it reached.
fn shoot_translators(translators: &[TranslatorRef], regions: Regions) -> u64 {
    let mut reached: Vec<(&TranslatorSlot, u64)> = Vec::new();
    for slot in translators {
        // The overlap check: skipping it (reaching every slot) is the old
        // untargeted flush; inverting it misses stale entries.
        if Regions(slot.published.regions.load(Ordering::Acquire)).meets(regions) {
            // Flushers are serialized by `flush_lock`; the only other
            // writer, a switch to full fences, also adds one.
            let target = slot.hot.gen.fetch_add(1, Ordering::Release) + 1;
            reached.push((slot, target));
        }
    }
    if reached.is_empty() {
        return 0;
    }
    let me = thread_token();
    let others = reached.iter().filter(|(s, _)| s.owner != me).count() as u64;
    // A translator at home on this thread is outside any access, and its
    // next access elsewhere rehomes and then sees the bump (module docs):
    // it needs neither the heavy fence nor the wait.
    fence(Ordering::SeqCst);
    let here = thread_id();
    // Mutation the loom model `translator_elsewhere_vs_own_flush`
    // catches: skipping every reached slot (`retain(|_| false)`), i.e.
    // the skip taken while another thread's translator also overlaps.
    // `busy == 1` on the home thread itself is an access this flush
    // interrupted (a signal handler): never skipped, as before.
    reached.retain(|(s, _)| {
        let home = s.published.home.load(Ordering::Acquire);
        let busy = s.hot.busy.load(Ordering::Relaxed);
        // A block open on this very thread ends only after this flush
        // returns: waiting for it would never end (module docs, "Blocks").
        if busy == block_mark(here) {
            writer_inside_own_block();
        }
        home != here || busy != 0
    });
    if reached.is_empty() {
        return others;
    }
    asymmetric::heavy();
    for &(slot, target) in &reached {
        let done = || {
            slot.hot.busy.load(Ordering::Acquire) == 0
                || slot.hot.acked.load(Ordering::Acquire) >= target
        };
        if !done() {
            wait_until(done);
        }
    }
    others
}

/// A writer's flush reached a block open on its own thread: the wait
/// would never end. Aborts with a message rather than hang (a panic would
/// unwind through the writer's guards, whose own flushes would meet the
/// block again).
#[cold]
fn writer_inside_own_block() -> ! {
    eprintln!(
        "aspace: an address-space writer ran on the thread of an open translator Block; \
         its flush would wait for the block to end for ever (end the block first)"
    );
    std::process::abort()
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

#[cfg(all(test, not(aspace_loom)))]
mod tests {
    use super::*;
    use crate::percpu::{cpu_id, nr_cpus};
    use std::sync::mpsc;
    use std::sync::Arc;
    use std::time::Duration;

    /// Two threads that share a CPU slot are both inside an access: a
    /// flush must wait for both (a per-slot parity would read "idle").
    #[test]
    fn flush_waits_for_every_access_on_a_shared_slot() {
        let tlb = Arc::new(TlbState::new(0));
        // Among nr_cpus + 1 threads, two share a slot. Bound to one CPU
        // (where threads can be), so that no thread moves to another slot
        // after it said which slot it is in.
        #[cfg(target_os = "linux")]
        let one = crate::percpu::allowed_cpus()[0];
        let (id_tx, id_rx) = mpsc::channel();
        let mut cmds = Vec::new();
        let mut hs = Vec::new();
        for i in 0..=nr_cpus() {
            let (tx, rx) = mpsc::channel::<()>();
            let (tlb, id_tx) = (tlb.clone(), id_tx.clone());
            cmds.push(tx);
            hs.push(std::thread::spawn(move || {
                #[cfg(target_os = "linux")]
                crate::percpu::pin_to(one);
                id_tx.send((i, cpu_id() % nr_cpus())).unwrap();
                if rx.recv().is_err() {
                    return; // not picked
                }
                let g = tlb.begin_access();
                id_tx.send((i, usize::MAX)).unwrap(); // inside
                let _ = rx.recv(); // leave
                drop(g);
            }));
        }
        let mut by_slot = vec![Vec::new(); nr_cpus()];
        for _ in 0..=nr_cpus() {
            let (i, slot) = id_rx.recv().unwrap();
            by_slot[slot].push(i);
        }
        let pair = by_slot.iter().find(|v| v.len() >= 2).unwrap().clone();
        let (a, b) = (pair[0], pair[1]);
        for &t in &[a, b] {
            cmds[t].send(()).unwrap();
            assert_eq!(id_rx.recv().unwrap(), (t, usize::MAX));
        }
        let done = Arc::new(AtomicBool::new(false));
        let flusher = {
            let (tlb, done) = (tlb.clone(), done.clone());
            std::thread::spawn(move || {
                tlb.flush(&StatCounters::new(), 1, Regions::ALL);
                done.store(true, Ordering::SeqCst);
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !done.load(Ordering::SeqCst),
            "flush ignored running accesses"
        );
        cmds[b].send(()).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        assert!(
            !done.load(Ordering::SeqCst),
            "flush ignored a running access"
        );
        cmds[a].send(()).unwrap();
        flusher.join().unwrap();
        assert!(done.load(Ordering::SeqCst));
        drop(cmds);
        for h in hs {
            h.join().unwrap();
        }
    }
}
