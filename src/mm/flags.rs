//! The flag types of the public API, with Linux's bit values so that raw
//! syscall arguments convert directly.

use bitflags::bitflags;

bitflags! {
    /// Page protection (`PROT_*`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct Prot: u32 {
        /// Pages may be read.
        const READ = 0x1;
        /// Pages may be written.
        const WRITE = 0x2;
        /// Pages may be executed.
        const EXEC = 0x4;
        /// `PROT_SEM`: accepted for compatibility; no effect.
        const SEM = 0x8;
        /// mprotect only: extend the change down to the start of a
        /// growsdown mapping.
        const GROWSDOWN = 0x0100_0000;
        /// mprotect only: extend the change up to the end of a growsup
        /// mapping (not supported on x86-64: EINVAL).
        const GROWSUP = 0x0200_0000;
    }
}

impl Prot {
    /// No access (`PROT_NONE`).
    pub const NONE: Prot = Prot::empty();
    /// The access bits alone (READ, WRITE, EXEC).
    pub const ACCESS: Prot = Prot::READ.union(Prot::WRITE).union(Prot::EXEC);
}

bitflags! {
    /// Mapping flags (`MAP_*`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct MapFlags: u32 {
        /// Share the mapping with other mappers (`MAP_SHARED`).
        const SHARED = 0x01;
        /// Private copy-on-write mapping (`MAP_PRIVATE`).
        const PRIVATE = 0x02;
        /// Place the mapping exactly at the address, replacing what is
        /// there (`MAP_FIXED`).
        const FIXED = 0x10;
        /// Not backed by a file (`MAP_ANONYMOUS`).
        const ANONYMOUS = 0x20;
        /// Stack-like mapping that grows down (`MAP_GROWSDOWN`).
        const GROWSDOWN = 0x0100;
        /// Do not reserve swap (`MAP_NORESERVE`); accepted, no effect here.
        const NORESERVE = 0x4000;
        /// Fault every page in at mmap time (`MAP_POPULATE`).
        const POPULATE = 0x8000;
        /// Like FIXED, but fail with EEXIST instead of replacing
        /// (`MAP_FIXED_NOREPLACE`).
        const FIXED_NOREPLACE = 0x10_0000;
        /// `MAP_SHARED_VALIDATE` (both type bits): shared, rejecting unknown
        /// flags. Linux accepts it for files only: anonymous mappings get
        /// `EINVAL`.
        const SHARED_VALIDATE = 0x03;
        /// Place the mapping in the first 2 GiB, at or above 1 GiB when
        /// searching (`MAP_32BIT`; a fixed address is used as given).
        const BIT32 = 0x40;
        /// Lock the pages in memory and fault them in now (`MAP_LOCKED`:
        /// `VM_LOCKED`, as `mlock` after the mmap).
        const LOCKED = 0x2000;
        /// With `POPULATE`: do not populate (`MAP_NONBLOCK`).
        const NONBLOCK = 0x1_0000;
        /// A thread stack (`MAP_STACK`): no transparent huge pages
        /// (`VM_NOHUGEPAGE`, Linux 6.7+).
        const STACK = 0x2_0000;
        /// Huge pages from the hugetlb pool (`MAP_HUGETLB`). aspace has no
        /// pool, like a kernel with `nr_hugepages = 0`: `ENOMEM` (or
        /// `EINVAL` for a zero length or a huge page size, in bits 26..31,
        /// that x86-64 lacks).
        const HUGETLB = 0x4_0000;
        /// `MAP_SYNC`: recorded as `VM_SYNC`, as Linux does for anonymous
        /// memory (it is checked only for files mapped `SHARED_VALIDATE`).
        const SYNC = 0x8_0000;
        /// `MAP_DROPPABLE` (Linux 6.11+), a value of the type field
        /// ([`MapFlags::TYPE`]) instead of `SHARED`/`PRIVATE`: private
        /// anonymous memory whose pages the kernel may drop at any time
        /// (aspace never does: it has no memory pressure). The VMA gets
        /// `VM_DROPPABLE`, `VM_NORESERVE`, `VM_WIPEONFORK` and
        /// `VM_DONTDUMP`; mlock and mlockall leave it unlocked (and
        /// populate it). `EINVAL` with `LOCKED`, `GROWSDOWN` or `HUGETLB`.
        const DROPPABLE = 0x08;
    }
}

impl MapFlags {
    /// The mapping-type field (`MAP_TYPE`): `SHARED`, `PRIVATE` or
    /// `SHARED_VALIDATE`; other values are invalid.
    pub const TYPE: u32 = 0x0f;
    /// Shift of the huge page size (log2 of the size) in the flags, for
    /// `HUGETLB` (`MAP_HUGE_SHIFT`); 0 there means the default (2 MiB).
    pub const HUGE_SHIFT: u32 = 26;
}

bitflags! {
    /// mremap flags (`MREMAP_*`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct MremapFlags: u32 {
        /// The mapping may move (`MREMAP_MAYMOVE`).
        const MAYMOVE = 1;
        /// Move to exactly `new_addr` (`MREMAP_FIXED`; needs MAYMOVE).
        const FIXED = 2;
        /// Move the pages but keep the old mapping, empty
        /// (`MREMAP_DONTUNMAP`; needs MAYMOVE and equal lengths).
        const DONTUNMAP = 4;
    }
}

/// madvise advice (`MADV_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Advice {
    /// `MADV_NORMAL`: no special treatment (clears `Random` and
    /// `Sequential`).
    Normal,
    /// `MADV_RANDOM`: expect random access (`VM_RAND_READ`).
    Random,
    /// `MADV_SEQUENTIAL`: expect sequential access (`VM_SEQ_READ`).
    Sequential,
    /// `MADV_WILLNEED`: the pages will be needed soon (nothing to read
    /// ahead here: validates the range only).
    WillNeed,
    /// `MADV_DONTNEED`: drop the pages; private anonymous memory reads back
    /// as zero, shared memory keeps its contents. `EINVAL` on locked
    /// memory.
    DontNeed,
    /// `MADV_FREE`: the pages may be freed. aspace frees them at once (as
    /// if reclaimed right away, which Linux allows): they read back as
    /// zero. Private anonymous memory only (`EINVAL` otherwise, and on
    /// locked memory).
    Free,
    /// `MADV_REMOVE`: punch a hole in a shared mapping's object: its pages
    /// read back as zero in every mapping of it. `EINVAL` on private or
    /// locked memory, `EACCES` without `VM_MAYWRITE`. Unlike Linux, the
    /// object keeps the punched pages' frames (zeroed, since other
    /// mappings may still map them), so `mincore` reports them resident.
    Remove,
    /// `MADV_DONTFORK`: the VMA is not copied into fork children
    /// (`VM_DONTCOPY`).
    DontFork,
    /// `MADV_DOFORK`: undoes `DontFork`.
    DoFork,
    /// `MADV_HUGEPAGE`: ask for transparent huge pages (`VM_HUGEPAGE`):
    /// in [`ThpMode::Madvise`](crate::ThpMode::Madvise), the default,
    /// faults in such VMAs map 2 MiB pages (see `mm::thp`).
    HugePage,
    /// `MADV_NOHUGEPAGE`: no transparent huge pages (`VM_NOHUGEPAGE`):
    /// later faults map 4 KiB pages, whatever the mode (huge pages already
    /// mapped stay, as in Linux).
    NoHugePage,
    /// `MADV_WIPEONFORK`: fork children get this range zero-filled
    /// (`VM_WIPEONFORK`; private anonymous memory only, else `EINVAL`).
    WipeOnFork,
    /// `MADV_KEEPONFORK`: undoes `WipeOnFork`.
    KeepOnFork,
    /// `MADV_POPULATE_READ`: fault the pages in for reading (`EINVAL`
    /// without read permission, write-only and exec-only memory included;
    /// `ENOMEM` at a hole, `EFAULT` at `SIGBUS`).
    PopulateRead,
    /// `MADV_POPULATE_WRITE`: fault the pages in for writing, breaking
    /// copy-on-write (`EINVAL` without write permission).
    PopulateWrite,
    /// `MADV_DONTNEED_LOCKED`: `DontNeed` that also drops locked pages.
    DontNeedLocked,
    /// `MADV_DONTDUMP`: leave the range out of core dumps (`VM_DONTDUMP`;
    /// recorded only).
    DontDump,
    /// `MADV_DODUMP`: undoes `DontDump` (`EINVAL` on droppable memory,
    /// which is never dumped).
    DoDump,
    /// `MADV_COLLAPSE`: map each 2 MiB-aligned span inside the range with
    /// a huge page now, copying its 4 KiB pages into it, whatever the THP
    /// mode (`EINVAL` for memory that cannot have huge pages:
    /// `VM_NOHUGEPAGE`, shared or object-backed, userfault-registered, or
    /// `PR_SET_THP_DISABLE`; `ENOMEM` when no huge frame is free; see
    /// `mm::thp`).
    Collapse,
}

impl Advice {
    /// Every advice, for conversions.
    const ALL: [Advice; 19] = [
        Advice::Normal,
        Advice::Random,
        Advice::Sequential,
        Advice::WillNeed,
        Advice::DontNeed,
        Advice::Free,
        Advice::Remove,
        Advice::DontFork,
        Advice::DoFork,
        Advice::HugePage,
        Advice::NoHugePage,
        Advice::WipeOnFork,
        Advice::KeepOnFork,
        Advice::PopulateRead,
        Advice::PopulateWrite,
        Advice::DontNeedLocked,
        Advice::DontDump,
        Advice::DoDump,
        Advice::Collapse,
    ];

    /// Linux's `MADV_*` number.
    pub const fn to_raw(self) -> i32 {
        match self {
            Advice::Normal => 0,
            Advice::Random => 1,
            Advice::Sequential => 2,
            Advice::WillNeed => 3,
            Advice::DontNeed => 4,
            Advice::Free => 8,
            Advice::Remove => 9,
            Advice::DontFork => 10,
            Advice::DoFork => 11,
            Advice::HugePage => 14,
            Advice::NoHugePage => 15,
            Advice::WipeOnFork => 18,
            Advice::KeepOnFork => 19,
            Advice::PopulateRead => 22,
            Advice::PopulateWrite => 23,
            Advice::DontNeedLocked => 24,
            Advice::DontDump => 16,
            Advice::Collapse => 25,
            Advice::DoDump => 17,
        }
    }

    /// The advice with Linux's number `raw`; `None` for one aspace does
    /// not know (madvise would fail with `EINVAL`).
    pub fn from_raw(raw: i32) -> Option<Advice> {
        Self::ALL.into_iter().find(|a| a.to_raw() == raw)
    }
}

/// The kind of access that faults.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    /// A load.
    Read,
    /// A store.
    Write,
    /// An instruction fetch.
    Exec,
}

impl Access {
    /// True if a VMA with `flags` allows this access (Linux's
    /// `access_error`, inverted; x86-64: any access bit allows a read).
    pub(crate) fn allowed_by(self, flags: crate::vma::VmFlags) -> bool {
        use crate::vma::VmFlags;
        match self {
            Access::Read => flags.accessible() && !flags.contains(VmFlags::EXEC_ONLY),
            Access::Write => flags.contains(VmFlags::WRITE),
            Access::Exec => flags.contains(VmFlags::EXEC),
        }
    }

    /// The protection bit this access needs.
    pub const fn required(self) -> Prot {
        match self {
            Access::Read => Prot::READ,
            Access::Write => Prot::WRITE,
            Access::Exec => Prot::EXEC,
        }
    }
}
