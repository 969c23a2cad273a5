//! Address regions: the coarse summary of addresses that a translator
//! publishes (what it may have cached) and that a flush compares (what it
//! changed), so that a flush reaches only the translators it concerns.
//!
//! A region is 1 GiB of address space (a PUD's span, so a 2 MiB entry
//! lies in one); region `n` is bit [`bit`]`(n)` of a [`Regions`] set: the
//! XOR of `n`'s 6-bit digits, so that the 64 regions of an aligned
//! 64 GiB take 64 distinct bits, and regions a power-of-two multiple of
//! 64 GiB apart take distinct ones (per-CPU placement windows are 1 TiB apart: with `n mod 64`
//! every thread's instances shared one bit, and each thread's flush
//! reached every other thread's translator). Two distinct regions may
//! still share a bit: a set over-approximates, which costs a needless
//! flush of a translator, never a missed one.

use crate::addr::Range;

/// log2 of a region's size (1 GiB).
const REGION_SHIFT: u32 = 30;

/// The bit of region `n`: its 6-bit digits XORed (a region number has at
/// most 34 bits).
#[inline(always)]
const fn bit(n: u64) -> u64 {
    let folded = n ^ (n >> 6) ^ (n >> 12) ^ (n >> 18) ^ (n >> 24) ^ (n >> 30);
    1 << (folded & 63)
}

/// A set of regions, one bit per region's [`bit`].
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
        Regions(bit(addr >> REGION_SHIFT))
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
        (first..=last).fold(Regions::NONE, |s, n| s.union(Regions(bit(n))))
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
    fn a_range_covers_its_regions_and_folds_into_64_bits() {
        let r = Regions::of_range(Range::new(G - 4096, G + 4096));
        assert_eq!(r, Regions(0b11));
        assert!(r.meets(Regions::of(G)) && r.meets(Regions::of(0)));
        assert!(!r.meets(Regions::of(2 * G)));
        // The 64 regions of an aligned 64 GiB take every bit once.
        for start in [0, 64, 1024, 1 << 20] {
            let all = (start..start + 64).fold(Regions::NONE, |s, n| {
                let b = Regions::of(n * G);
                assert!(!s.meets(b), "regions {start}..+64 share a bit");
                s.union(b)
            });
            assert_eq!(all, Regions::ALL);
        }
        // Regions 64 GiB and 1 TiB apart (placement windows): apart.
        assert!(!Regions::of(3 * G).meets(Regions::of(67 * G)));
        let top = 128 << 40; // the top of the lower half
        for k in 1..8u64 {
            let a = top - k * (1 << 40) - 6 * G;
            let b = top - (k + 1) * (1 << 40) - 6 * G;
            assert!(
                !Regions::of(a).meets(Regions::of(b)),
                "windows {k}, {}",
                k + 1
            );
        }
        // Distinct regions may share a bit (over-approximation).
        assert_eq!(Regions::of(0), Regions::of(65 * G));
        assert_eq!(Regions::of_range(Range::new(0, 64 * G)), Regions::ALL);
        assert_eq!(Regions::of_range(Range::new(5 * G, 5 * G)), Regions::NONE);
        // A range ending at the top of the address space: region
        // 2^34 - 1, digits 63 (five times) and 15.
        assert_eq!(
            Regions::of_range(Range::new(u64::MAX - 4095, u64::MAX)),
            Regions(1 << (63 ^ 15))
        );
    }
}
