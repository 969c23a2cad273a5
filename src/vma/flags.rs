//! A VMA's flags ([`VmFlags`], Linux's `VM_*` bits and their smaps
//! mnemonics) and the page-table bits they give its pages.
//!
//! # Locking
//!
//! None: plain values. A VMA stores its flags in an atomic written under
//! its write lock (see the parent module); the lock order is in
//! [`crate::mm`].

use bitflags::bitflags;

bitflags! {
    /// A VMA's flags (`VM_*`), with Linux's meanings.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct VmFlags: u32 {
        /// Readable.
        const READ = 0x1;
        /// Writable.
        const WRITE = 0x2;
        /// Executable.
        const EXEC = 0x4;
        /// Shared mapping.
        const SHARED = 0x8;
        /// mprotect may add READ.
        const MAYREAD = 0x10;
        /// mprotect may add WRITE.
        const MAYWRITE = 0x20;
        /// mprotect may add EXEC.
        const MAYEXEC = 0x40;
        /// Mapped MAP_SHARED.
        const MAYSHARE = 0x80;
        /// Grows down (a stack).
        const GROWSDOWN = 0x100;
        /// Pages are locked in memory (`mlock`, `MAP_LOCKED`).
        const LOCKED = 0x2000;
        /// Sequential access expected (`MADV_SEQUENTIAL`).
        const SEQ_READ = 0x8000;
        /// Random access expected (`MADV_RANDOM`).
        const RAND_READ = 0x1_0000;
        /// Not copied into fork children (`MADV_DONTFORK`).
        const DONTCOPY = 0x2_0000;
        /// With `LOCKED`: lock pages as they fault in (`MLOCK_ONFAULT`).
        const LOCKONFAULT = 0x8_0000;
        /// Charged against the commit limit (private writable).
        const ACCOUNT = 0x10_0000;
        /// Mapped with MAP_NORESERVE.
        const NORESERVE = 0x20_0000;
        /// Mapped with `MAP_SYNC`.
        const SYNC = 0x80_0000;
        /// Fork children get zero-filled memory here (`MADV_WIPEONFORK`).
        const WIPEONFORK = 0x200_0000;
        /// Left out of core dumps (`MADV_DONTDUMP`, `MAP_DROPPABLE`).
        const DONTDUMP = 0x400_0000;
        /// Pages may be dropped under memory pressure (`MAP_DROPPABLE`;
        /// Linux's `VM_DROPPABLE` is a bit above 32, this one is Linux's
        /// `VM_MIXEDMAP`, which aspace has no use for).
        const DROPPABLE = 0x1000_0000;
        /// Soft-dirty tracking bit; ignored when merging.
        const SOFTDIRTY = 0x800_0000;
        /// Registered with a userfault handler for missing pages
        /// (`UFFDIO_REGISTER_MODE_MISSING`).
        const UFFD_MISSING = 0x200;
        /// Registered with a userfault handler for write-protect faults
        /// (`UFFDIO_REGISTER_MODE_WP`).
        const UFFD_WP = 0x1000;
        /// Registered with a userfault handler for minor faults
        /// (`UFFDIO_REGISTER_MODE_MINOR`; Linux's bit 41 does not fit in 32
        /// bits, this is Linux's `VM_PFNMAP`, which aspace has no use for).
        const UFFD_MINOR = 0x400;
        /// Transparent huge pages asked for (`MADV_HUGEPAGE`).
        const HUGEPAGE = 0x2000_0000;
        /// No transparent huge pages (`MADV_NOHUGEPAGE`, `MAP_STACK`).
        const NOHUGEPAGE = 0x4000_0000;
        /// Execute-only: the mapping carries Linux's execute-only
        /// protection key, so data loads fault
        /// ([`Config::exec_only_pkey`](crate::Config::exec_only_pkey)).
        /// Linux keeps the key in `VM_PKEY_BIT0` (bit 32), past these 32
        /// bits; aspace uses the bit `VM_DENYWRITE` had.
        const EXEC_ONLY = 0x4000;
    }
}

/// `/proc/pid/smaps` `VmFlags` mnemonics, in the kernel's (bit) order.
const MNEMONICS: [(VmFlags, &str); 26] = [
    (VmFlags::READ, "rd"),
    (VmFlags::WRITE, "wr"),
    (VmFlags::EXEC, "ex"),
    (VmFlags::SHARED, "sh"),
    (VmFlags::MAYREAD, "mr"),
    (VmFlags::MAYWRITE, "mw"),
    (VmFlags::MAYEXEC, "me"),
    (VmFlags::MAYSHARE, "ms"),
    (VmFlags::GROWSDOWN, "gd"),
    (VmFlags::UFFD_MISSING, "um"),
    (VmFlags::UFFD_WP, "uw"),
    (VmFlags::LOCKED, "lo"),
    (VmFlags::SEQ_READ, "sr"),
    (VmFlags::RAND_READ, "rr"),
    (VmFlags::DONTCOPY, "dc"),
    (VmFlags::LOCKONFAULT, "lf"),
    (VmFlags::ACCOUNT, "ac"),
    (VmFlags::NORESERVE, "nr"),
    (VmFlags::SYNC, "sf"),
    (VmFlags::WIPEONFORK, "wf"),
    (VmFlags::DONTDUMP, "dd"),
    (VmFlags::SOFTDIRTY, "sd"),
    (VmFlags::HUGEPAGE, "hg"),
    (VmFlags::NOHUGEPAGE, "nh"),
    (VmFlags::DROPPABLE, "dp"),
    (VmFlags::UFFD_MINOR, "ui"),
];

impl VmFlags {
    /// The access bits (READ, WRITE, EXEC).
    pub const ACCESS: VmFlags = VmFlags::READ.union(VmFlags::WRITE).union(VmFlags::EXEC);
    /// The MAY bits a fresh mapping gets.
    pub const MAY: VmFlags = VmFlags::MAYREAD
        .union(VmFlags::MAYWRITE)
        .union(VmFlags::MAYEXEC);

    /// Any access at all (Linux's `vma_is_accessible`).
    pub fn accessible(self) -> bool {
        self.intersects(VmFlags::ACCESS)
    }

    /// The `/proc/pid/smaps` mnemonics of these flags (`rd`, `wr`, `lo`,
    /// ...), in the order the kernel prints them.
    pub fn mnemonics(self) -> Vec<&'static str> {
        MNEMONICS
            .iter()
            .filter(|(f, _)| self.contains(*f))
            .map(|&(_, m)| m)
            .collect()
    }
}

/// The page-table flags for pages of a VMA with these flags (x86-64: any
/// access implies read, so READ and EXEC both give USER; no EXEC gives
/// NX). Every entry is made from these or from an entry made so (fork,
/// copy-on-write and mremap keep the bits), so NX follows the VMA.
impl From<VmFlags> for crate::pt::PteFlags {
    fn from(vf: VmFlags) -> Self {
        use crate::pt::PteFlags;
        let mut f = PteFlags::PRESENT;
        if vf.accessible() {
            f |= PteFlags::USER;
        }
        if vf.contains(VmFlags::WRITE) {
            f |= PteFlags::WRITE;
        }
        if vf.contains(VmFlags::EXEC_ONLY) {
            f |= PteFlags::EXEC_ONLY;
        }
        if !vf.contains(VmFlags::EXEC) {
            f |= PteFlags::NX;
        }
        f
    }
}
