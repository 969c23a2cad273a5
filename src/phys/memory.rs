//! The physical memory under the allocators: the frames, their chunks,
//! the caches and reference counts, and the registry of the accounts
//! over it; one per [`FrameAllocator::new`](super::FrameAllocator::new),
//! and the process's shared one, made on first use
//! ([`FrameAllocator::shared`](super::FrameAllocator::shared)).

use super::account::Registry;
use super::cache::{CpuFrames, Pool};
use super::chunk::{ChunkDir, DIR_CHUNKS};
use super::huge::HugeFree;
use super::{Pfn, CHUNK_FRAMES};
use crate::addr::PAGE_SIZE;
use crate::percpu::PerCpu;
use crate::sync::counter::AtomicU64 as CounterU64;
use crate::sync::{Arc, AtomicPtr, Mutex};

/// A physical memory: the frames, their chunks, caches and reference
/// counts, shared by every [`FrameAllocator`] made over it. Reached only
/// through an allocator (it is its `Deref` target).
pub struct Phys {
    /// Frame numbers available (the budget in frames).
    ///
    /// Protected by: immutable after creation.
    pub(super) frames: u64,
    /// Whether frames handed out again are cleared.
    ///
    /// Protected by: immutable after creation.
    pub(super) zero_new: bool,
    /// Two-level chunk directory, filled on first use.
    ///
    /// Protected by: each slot written once (null to a directory page,
    /// `Release`) under `grow`; read lock-free with `Acquire`.
    pub(super) dirs: Box<[AtomicPtr<ChunkDir>]>,
    /// Serializes obtaining chunks and directory pages from the system.
    ///
    /// Protected by: immutable after creation (it is the lock).
    pub(super) grow: Mutex<()>,
    /// The global pool of free and never-used frames.
    ///
    /// Protected by: its mutex.
    pub(super) pool: Mutex<Pool>,
    /// Held while free frames' memory is given back to the system (they
    /// are then in no list; see `release`).
    ///
    /// Protected by: immutable after creation (it is the lock).
    pub(super) releasing: Mutex<()>,
    /// Each CPU slot's cache of free and never-used frames, and its
    /// allocation and free counts.
    ///
    /// Protected by: each slot's mutex (see `CpuFrames`).
    pub(super) cpus: PerCpu<CpuFrames>,
    /// Bytes obtained from the system.
    ///
    /// Protected by: a counter atomic (`sync::counter`), `Relaxed`,
    /// added to under `grow`.
    pub(super) reserved: CounterU64,
    /// The accounts over this memory, by the number each data frame
    /// records.
    ///
    /// Protected by: its own mutex (see `account`).
    pub(super) accounts: Registry,
    /// Huge frames freed whole (first frame numbers), dirty ones apart
    /// from those cleared when freed: see `huge`.
    ///
    /// Protected by: its mutex.
    pub(super) huge: Mutex<HugeFree>,
}

// SAFETY: chunk memory is only reached through atomic word accesses or by
// the exclusive owner of a frame (zeroing a frame just allocated); the raw
// pointers inside `Chunk` are owned by the allocator.
unsafe impl Send for Phys {}
// SAFETY: as for Send: all shared state is atomics or behind mutexes.
unsafe impl Sync for Phys {}

/// Frame numbers of the process's shared physical memory (1 TiB of
/// frames: chunk memory is obtained only as frames are used, and the
/// directory costs a pointer per GiB).
#[cfg(not(aspace_loom))]
pub(super) const SHARED_PHYS_BYTES: u64 = 1 << 40;

impl Phys {
    pub(super) fn new(bytes: u64, zero_new: bool) -> Arc<Phys> {
        // Numbers from the zero page's up are never handed out.
        let frames = (bytes / PAGE_SIZE).min(u64::from(Pfn::ZERO_PAGE.get()) - 1);
        let nchunks = (frames as usize).div_ceil(CHUNK_FRAMES);
        Arc::new(Phys {
            frames,
            zero_new,
            dirs: (0..nchunks.div_ceil(DIR_CHUNKS))
                .map(|_| AtomicPtr::new(core::ptr::null_mut()))
                .collect(),
            grow: Mutex::new(()),
            pool: Mutex::new(Pool::new()),
            releasing: Mutex::new(()),
            cpus: PerCpu::new(CpuFrames::new),
            reserved: CounterU64::new(0),
            accounts: Registry::new(),
            huge: Mutex::new(HugeFree::default()),
        })
    }

    /// The process's shared physical memory (zeroing frames), made on
    /// first use and kept for the life of the process: its chunks'
    /// memory is given back to the system as frames are freed (`release`),
    /// so an idle one holds only its caches.
    #[cfg(not(aspace_loom))]
    pub(super) fn shared() -> Arc<Phys> {
        static SHARED: crate::sync::once::OnceLock<Arc<Phys>> = crate::sync::once::OnceLock::new();
        SHARED
            .get_or_init(|| Phys::new(SHARED_PHYS_BYTES, true))
            .clone()
    }
}
