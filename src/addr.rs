//! Page size, alignment helpers and half-open address ranges.

use core::fmt;

/// log2 of the page size.
pub const PAGE_SHIFT: u32 = 12;
/// The page size: 4 KiB, as on x86-64.
pub const PAGE_SIZE: u64 = 1 << PAGE_SHIFT;
/// Mask of the offset-in-page bits.
pub const PAGE_MASK: u64 = PAGE_SIZE - 1;
/// Bytes mapped by one page-middle-directory entry (one PTE page): 2 MiB.
pub const PMD_SIZE: u64 = 1 << 21;
/// Bytes mapped by one page-upper-directory entry: 1 GiB.
pub const PUD_SIZE: u64 = 1 << 30;

/// True if `addr` is a multiple of the page size.
#[inline]
pub const fn is_page_aligned(addr: u64) -> bool {
    addr & PAGE_MASK == 0
}

/// Rounds `addr` down to a page boundary.
#[inline]
pub const fn page_align_down(addr: u64) -> u64 {
    addr & !PAGE_MASK
}

/// Rounds `len` up to a page boundary; `None` on overflow (Linux's
/// `PAGE_ALIGN(len) == 0` case).
#[inline]
pub const fn page_align_up(len: u64) -> Option<u64> {
    match len.checked_add(PAGE_MASK) {
        Some(v) => Some(v & !PAGE_MASK),
        None => None,
    }
}

/// Rounds `v` up to a multiple of `align` (a power of two); `None` on
/// overflow.
#[inline]
pub const fn align_up(v: u64, align: u64) -> Option<u64> {
    debug_assert!(align.is_power_of_two());
    match v.checked_add(align - 1) {
        Some(x) => Some(x & !(align - 1)),
        None => None,
    }
}

/// Rounds `v` down to a multiple of `align` (a power of two).
#[inline]
pub const fn align_down(v: u64, align: u64) -> u64 {
    debug_assert!(align.is_power_of_two());
    v & !(align - 1)
}

/// Number of pages in `len` bytes (rounded down).
#[inline]
pub const fn pages(len: u64) -> u64 {
    len >> PAGE_SHIFT
}

/// A half-open range of addresses `[start, end)`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Range {
    /// First address in the range.
    pub start: u64,
    /// First address past the range.
    pub end: u64,
}

impl Range {
    /// `[start, end)`. Callers keep `start <= end`.
    #[inline]
    pub const fn new(start: u64, end: u64) -> Self {
        Range { start, end }
    }

    /// `[start, start + len)`, or `None` if it overflows.
    #[inline]
    pub const fn from_len(start: u64, len: u64) -> Option<Self> {
        match start.checked_add(len) {
            Some(end) => Some(Range { start, end }),
            None => None,
        }
    }

    /// Length in bytes; 0 for an inverted range (`end < start`), which
    /// [`is_empty`](Self::is_empty) also calls empty.
    #[inline]
    pub const fn len(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }

    /// True if the range holds no address.
    #[inline]
    pub const fn is_empty(&self) -> bool {
        self.end <= self.start
    }

    /// True if `addr` lies inside.
    #[inline]
    pub const fn contains(&self, addr: u64) -> bool {
        self.start <= addr && addr < self.end
    }

    /// True if `other` lies entirely inside.
    #[inline]
    pub const fn contains_range(&self, other: &Range) -> bool {
        self.start <= other.start && other.end <= self.end
    }

    /// True if the two ranges share at least one address (an empty range
    /// shares none).
    #[inline]
    pub const fn overlaps(&self, other: &Range) -> bool {
        !self.is_empty() && !other.is_empty() && self.start < other.end && other.start < self.end
    }

    /// The common part, if any.
    #[inline]
    pub fn intersect(&self, other: &Range) -> Option<Range> {
        let r = Range::new(self.start.max(other.start), self.end.min(other.end));
        (!r.is_empty()).then_some(r)
    }
}

impl fmt::Debug for Range {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}..{:#x}", self.start, self.end)
    }
}

impl From<core::ops::Range<u64>> for Range {
    fn from(r: core::ops::Range<u64>) -> Self {
        Range::new(r.start, r.end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alignment_helpers() {
        assert!(is_page_aligned(0));
        assert!(is_page_aligned(8192));
        assert!(!is_page_aligned(8193));
        assert_eq!(page_align_down(8193), 8192);
        assert_eq!(page_align_up(1), Some(4096));
        assert_eq!(page_align_up(4096), Some(4096));
        assert_eq!(page_align_up(u64::MAX), None);
        assert_eq!(align_up(5, 4), Some(8));
        assert_eq!(align_up(u64::MAX, 2), None);
        assert_eq!(align_down(7, 4), 4);
        assert_eq!(pages(3 * PAGE_SIZE + 5), 3);
    }

    #[test]
    fn ranges() {
        let r = Range::new(10, 20);
        assert_eq!(r.len(), 10);
        assert!(r.contains(10) && r.contains(19) && !r.contains(20));
        assert!(r.overlaps(&Range::new(19, 30)));
        assert!(!r.overlaps(&Range::new(20, 30)));
        assert_eq!(r.intersect(&Range::new(15, 30)), Some(Range::new(15, 20)));
        assert_eq!(r.intersect(&Range::new(20, 30)), None);
        assert!(r.contains_range(&Range::new(12, 20)));
        assert_eq!(Range::from_len(u64::MAX, 1), None);
        assert!(Range::new(5, 5).is_empty());
        assert!(Range::new(6, 5).is_empty());
        assert_eq!(Range::new(6, 5).len(), 0);
    }
}
