//! Address regions: the coarse summary of addresses that a translator
//! publishes (what it may have cached) and that a flush compares (what it
//! changed), so that a flush reaches only the translators it concerns.
//!
//! A region is 1 GiB of address space (a PUD's span, so a 2 MiB entry
//! lies in one); region `n` is bit `n mod 64` of a [`Regions`] set. Two
//! distinct regions may share a bit: a set over-approximates, which costs
//! a needless flush of a translator, never a missed one.

use crate::addr::Range;

/// log2 of a region's size (1 GiB).
const REGION_SHIFT: u32 = 30;

/// A set of regions, one bit per region number mod 64.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Regions(pub(crate) u64);

impl Regions {
    /// No region.
    pub(crate) const NONE: Regions = Regions(0);
    /// Every region (a flush of the whole space).
    pub(crate) const ALL: Regions = Regions(!0);

    /// The region of `addr`.
    #[inline(always)]
    pub(crate) fn of(addr: u64) -> Regions {
        Regions(1 << ((addr >> REGION_SHIFT) & 63))
    }

    /// The regions `r` touches (every one past 64 regions).
    pub(crate) fn of_range(r: Range) -> Regions {
        if r.start >= r.end {
            return Regions::NONE;
        }
        let (first, last) = (r.start >> REGION_SHIFT, (r.end - 1) >> REGION_SHIFT);
        if last - first >= 63 {
            return Regions::ALL;
        }
        (first..=last).fold(Regions::NONE, |s, n| s.union(Regions(1 << (n & 63))))
    }

    /// Both sets.
    #[inline(always)]
    pub(crate) fn union(self, o: Regions) -> Regions {
        Regions(self.0 | o.0)
    }

    /// Whether the sets share a region (bit).
    #[inline(always)]
    pub(crate) fn meets(self, o: Regions) -> bool {
        self.0 & o.0 != 0
    }

    /// Whether the set is empty.
    pub(crate) fn is_empty(self) -> bool {
        self.0 == 0
    }
}

#[cfg(all(test, not(aspace_loom)))]
mod tests {
    use super::*;

    const G: u64 = 1 << 30;

    #[test]
    fn a_range_covers_its_regions_and_wraps_mod_64() {
        let r = Regions::of_range(Range::new(G - 4096, G + 4096));
        assert_eq!(r, Regions(0b11));
        assert!(r.meets(Regions::of(G)) && r.meets(Regions::of(0)));
        assert!(!r.meets(Regions::of(2 * G)));
        // 64 GiB apart: the same bit.
        assert_eq!(Regions::of(3 * G), Regions::of(67 * G));
        assert_eq!(Regions::of_range(Range::new(0, 64 * G)), Regions::ALL);
        assert_eq!(Regions::of_range(Range::new(5 * G, 5 * G)), Regions::NONE);
        // A range ending at the top of the address space.
        assert_eq!(
            Regions::of_range(Range::new(u64::MAX - 4095, u64::MAX)),
            Regions(1 << 63)
        );
    }
}
