//! The entry format: [`Pte`], a frame number and x86-64 flag bits in one
//! 64-bit word, and its [`PteFlags`].

use crate::addr::{PAGE_SHIFT, PAGE_SIZE};
use crate::phys::Pfn;
use bitflags::bitflags;

bitflags! {
    /// Page-table entry flags (x86-64 bit positions).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct PteFlags: u64 {
        /// The entry maps a frame.
        const PRESENT = 1 << 0;
        /// Stores are allowed.
        const WRITE = 1 << 1;
        /// User-mode access is allowed (cleared for PROT_NONE).
        const USER = 1 << 2;
        /// The page was accessed.
        const ACCESSED = 1 << 5;
        /// The page was written.
        const DIRTY = 1 << 6;
        /// A PMD entry that maps 2 MiB itself (x86's page-size bit, PS):
        /// a transparent huge page. Only ever in entries that
        /// [`PageTable::huge_at`](super::PageTable::huge_at) returns;
        /// the 4 KiB views of its pages that lookups return lack it.
        const HUGE = 1 << 7;
        /// Write-protected for a userfault handler (`_PAGE_UFFD_WP`, x86's
        /// second software bit): a write faults even where the VMA allows
        /// it.
        const UFFD_WP = 1 << 10;
        /// Written since the last soft-dirty reset (`_PAGE_SOFT_DIRTY`,
        /// x86's third software bit).
        const SOFT_DIRTY = 1 << 11;
        /// The execute-only protection key (x86's key bits 59-62 holding
        /// key 1): data accesses fault, as PKRU makes them on a CPU with
        /// protection keys.
        const EXEC_ONLY = 1 << 59;
        /// No instruction fetch (x86-64's `_PAGE_NX`, bit 63): set for
        /// pages of VMAs without `VM_EXEC`, checked by translator fetches.
        const NX = 1 << 63;
    }
}

/// A page-table entry: frame number and flags.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Pte(
    /// The raw entry: frame number in bits 12 to 51, flags below and
    /// above.
    ///
    /// Protected by: nothing (a value, copied out of and into a table's
    /// entries, whose rules are in the [module docs](super#locking)).
    pub(super) u64,
);

impl Pte {
    /// The empty entry.
    pub const NONE: Pte = Pte(0);

    /// An entry mapping `pfn` with `flags` (PRESENT is added).
    pub const fn new(pfn: Pfn, flags: PteFlags) -> Pte {
        Pte(((pfn.get() as u64) << PAGE_SHIFT) | flags.bits() | PteFlags::PRESENT.bits())
    }

    /// The frame number.
    pub const fn pfn(self) -> Pfn {
        Pfn::new((self.0 >> PAGE_SHIFT) as u32)
    }

    /// The frame whose reference this entry holds: `None` if it maps
    /// nothing or maps the zero page (which is not reference-counted).
    pub const fn frame(self) -> Option<Pfn> {
        let pfn = self.pfn();
        if self.is_present() && !pfn.is_zero_page() {
            Some(pfn)
        } else {
            None
        }
    }

    /// The flags: the bits below the frame number and the high ones
    /// above it (52 to 63, where x86 keeps the protection key).
    pub const fn flags(self) -> PteFlags {
        const FRAME_FIELD: u64 = ((1 << 52) - 1) & !(PAGE_SIZE - 1);
        PteFlags::from_bits_retain(self.0 & !FRAME_FIELD)
    }

    /// True if the entry maps a frame.
    pub const fn is_present(self) -> bool {
        self.0 & PteFlags::PRESENT.bits() != 0
    }

    /// True for a PMD leaf (a 2 MiB page).
    pub const fn is_huge(self) -> bool {
        self.0 & PteFlags::HUGE.bits() != 0
    }

    /// The 4 KiB entry a PMD leaf means for its page `i` (0 to 511): the
    /// `i`th subframe (the zero page stays the zero page), the leaf's
    /// flags without [`PteFlags::HUGE`].
    pub const fn subpage(self, i: u32) -> Pte {
        let pfn = self.pfn();
        let pfn = if pfn.is_zero_page() {
            pfn
        } else {
            Pfn::new(pfn.get() + i)
        };
        Pte::new(
            pfn,
            PteFlags::from_bits_retain(self.flags().bits() & !PteFlags::HUGE.bits()),
        )
    }

    /// True if stores are allowed.
    pub const fn is_writable(self) -> bool {
        self.0 & PteFlags::WRITE.bits() != 0
    }
}

impl core::fmt::Debug for Pte {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        if self.is_present() {
            write!(f, "Pte(pfn {}, {:?})", self.pfn(), self.flags())
        } else {
            f.write_str("Pte::NONE")
        }
    }
}
