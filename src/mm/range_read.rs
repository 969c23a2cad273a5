//! Range-locked readers (`WriterLocking::Range`): the mmap_lock readers
//! that act on one range — madvise's zaps and the access precheck's
//! retry ([`read_vmas`]), the locked fault fallback and a forced access's
//! page ([`read_fault`]) — lock shared only the whole VMAs they read (and
//! the holes of their range), so they run beside writers on other ranges. In the other modes
//! they take the mmap_lock read side as before (the same calls, the same
//! cost). The protocol is in `range_lock`'s module docs.
//!
//! # Locking
//!
//! The range lock (shared), then the reader-writer lock's read side:
//! [`MmapLock::read_range`](super::mmap_lock::MmapLock::read_range). The
//! range is computed from the tree, locked, and computed again under the
//! lock (`edit::lock_validated`), as a writer's neighbourhood is.

use super::edit::{lock_validated, neighbourhood, vma_hull, Reach};
use super::mmap_lock::MmapReadGuard;
use super::{AddressSpace, MmState};
use crate::addr::{page_align_down, Range};
use crate::reclaim::Guard;

/// The mmap_lock read side for a reader of the VMAs overlapping `r` and of
/// its holes (madvise's zaps): in range mode `r` widened to the whole of
/// every VMA it meets, shared. With an epoch pin taken under it.
pub(crate) fn read_vmas(mm: &AddressSpace, r: Range) -> (MmapReadGuard<'_, MmState>, Guard) {
    read_locked(mm, r.start, Some(r), |pin| vma_hull(mm, r, pin))
}

/// The mmap_lock read side for the locked fault (or forced access) at
/// `addr`: in range mode,
/// shared, the neighbourhood a writer of the VMA covering `addr` would
/// lock (the VMA, a page on each side and the VMAs there: a first
/// anon_vma reads the neighbours, `mm::anon_vma`). Where no VMA covers
/// `addr`: from its page through the VMA above (the stack check reads the
/// gap and that VMA's flags), to the end of the space if there is none.
pub(crate) fn read_fault(mm: &AddressSpace, addr: u64) -> (MmapReadGuard<'_, MmState>, Guard) {
    read_locked(mm, addr, None, |pin| fault_range(mm, addr, pin))
}

/// The mmap_lock read side with an epoch pin: in range mode, `want`'s
/// range (as the tree is around `at`, and within `within` as
/// `edit::lock_validated` says) shared, validated under the lock.
fn read_locked<'a>(
    mm: &'a AddressSpace,
    at: u64,
    within: Option<Range>,
    want: impl Fn(&Guard) -> Range,
) -> (MmapReadGuard<'a, MmState>, Guard) {
    // The bias's owner: the whole space, granted at once (`range_bias`).
    if !mm.mmap_lock.is_range_mode() || mm.mmap_lock.bias_likely_mine() {
        let st = mm.mmap_lock.read();
        return (st, mm.tree.pin());
    }
    lock_validated(
        mm,
        at,
        within,
        want,
        |r| mm.mmap_lock.try_read_range(r),
        |r| mm.mmap_lock.read_range(r),
    )
}

/// The mmap_lock read side for a first anon_vma of the VMA over `vr`
/// (`mm::anon_vma`), only try-locked (the caller may hold a VMA lock a
/// writer waits for): in range mode the neighbourhood a writer of the
/// VMA would lock, shared, if it is still that under the lock (its
/// neighbours are what the prepare reads); otherwise the whole read side.
pub(crate) fn try_read_neighbours(
    mm: &AddressSpace,
    vr: Range,
) -> Option<MmapReadGuard<'_, MmState>> {
    if !mm.mmap_lock.is_range_mode() || mm.mmap_lock.bias_likely_mine() {
        return mm.mmap_lock.try_read();
    }
    let want = neighbourhood(mm, vr, Reach::Vmas, &mm.tree.pin());
    let st = mm.mmap_lock.try_read_range(want)?;
    let now = neighbourhood(mm, vr, Reach::Vmas, &mm.tree.pin());
    (want.start <= now.start && now.end <= want.end).then_some(st)
}

/// The range [`read_fault`] locks for `addr`, as the tree is now.
fn fault_range(mm: &AddressSpace, addr: u64, pin: &Guard) -> Range {
    let page = page_align_down(addr);
    match mm.tree.find_after(addr, pin) {
        Some((vr, _)) => {
            let n = neighbourhood(mm, vr, Reach::Vmas, pin);
            Range::new(n.start.min(page), n.end)
        }
        None => Range::new(page, u64::MAX),
    }
}

#[cfg(all(test, not(aspace_loom)))]
pub(crate) mod tests {
    use super::*;
    use crate::addr::PAGE_SIZE;
    use crate::mm::range_lock::WHOLE;
    use crate::{Config, MapFlags, Prot, WriterLocking};

    const A: u64 = 0x4000_0000;

    /// Without the bias: its owner would lock the whole space.
    pub(crate) fn space() -> AddressSpace {
        AddressSpace::new(Config {
            writer_locking: WriterLocking::Range,
            range_bias: false,
            ..Config::default()
        })
    }

    fn map(mm: &AddressSpace, at: u64, pages: u64, prot: Prot) {
        let flags = MapFlags::PRIVATE | MapFlags::ANONYMOUS | MapFlags::FIXED;
        mm.mmap(at, pages * PAGE_SIZE, prot, flags).unwrap();
    }

    #[test]
    fn a_zap_locks_its_range_widened_to_whole_vmas_and_no_more() {
        let mm = space();
        map(&mm, A, 4, Prot::READ | Prot::WRITE);
        map(&mm, A + 8 * PAGE_SIZE, 4, Prot::READ);
        let r = Range::new(A + PAGE_SIZE, A + 9 * PAGE_SIZE);
        let (_st, _g) = read_vmas(&mm, r);
        let ranges = mm.mmap_lock.ranges().unwrap();
        assert_eq!(ranges.busy(), vec![Range::new(A, A + 12 * PAGE_SIZE)]);
        // A writer beyond, even in the same PTE table, is not held up; one
        // that would split a VMA read is.
        assert!(ranges
            .try_lock(Range::new(A + 13 * PAGE_SIZE, A + 14 * PAGE_SIZE), true)
            .is_ok());
        assert!(ranges
            .try_lock(Range::new(A + 11 * PAGE_SIZE, A + 12 * PAGE_SIZE), true)
            .is_err());
        assert!(
            ranges.try_lock(Range::new(A, A + 1), false).is_ok(),
            "readers share"
        );
        assert!(
            ranges.try_lock(WHOLE, false).is_err(),
            "a whole-space request waits for every range holder"
        );
    }

    #[test]
    fn a_fault_locks_its_vma_and_neighbours_or_the_gap_to_the_vma_above() {
        let mm = space();
        map(&mm, A, 4, Prot::READ | Prot::WRITE);
        map(&mm, A + 4 * PAGE_SIZE, 2, Prot::READ);
        map(&mm, A + 16 * PAGE_SIZE, 1, Prot::READ);
        // The VMA, a page on each side and the VMA touching it.
        assert_eq!(
            fault_range(&mm, A + PAGE_SIZE + 5, &mm.tree.pin()),
            Range::new(A - PAGE_SIZE, A + 6 * PAGE_SIZE)
        );
        // A hole: from its page through the VMA above.
        let (_st, _g) = read_fault(&mm, A + 10 * PAGE_SIZE);
        let busy = mm.mmap_lock.ranges().unwrap().busy();
        assert_eq!(
            busy,
            vec![Range::new(A + 10 * PAGE_SIZE, A + 18 * PAGE_SIZE)]
        );
        drop(_st);
        assert_eq!(
            fault_range(&mm, A + 20 * PAGE_SIZE, &mm.tree.pin()),
            Range::new(A + 20 * PAGE_SIZE, u64::MAX)
        );
    }

    /// The bias's owner reads with the whole space granted by the bias
    /// (nothing in the range lock's shards); once another thread's call
    /// ended the bias (no handovers), the same read holds its range there.
    #[test]
    fn the_bias_owner_locks_nothing_in_the_shards_until_another_thread_calls() {
        let mm = std::sync::Arc::new(AddressSpace::new(Config {
            writer_locking: WriterLocking::Range,
            range_bias: true,
            range_space_bias: true,
            range_bias_handovers: 0,
            ..Config::default()
        }));
        map(&mm, A, 4, Prot::READ | Prot::WRITE);
        assert!(mm.mmap_lock.bias_likely_mine());
        let r = Range::new(A, A + PAGE_SIZE);
        {
            let (_st, _g) = read_vmas(&mm, r);
            assert_eq!(mm.mmap_lock.ranges().unwrap().busy(), vec![]);
        }
        let m2 = mm.clone();
        std::thread::spawn(move || map(&m2, A + 8 * PAGE_SIZE, 1, Prot::READ))
            .join()
            .unwrap();
        assert!(!mm.mmap_lock.bias_likely_mine());
        let (_st, _g) = read_vmas(&mm, r);
        assert_eq!(
            mm.mmap_lock.ranges().unwrap().busy(),
            vec![Range::new(A, A + 4 * PAGE_SIZE)]
        );
    }
}
