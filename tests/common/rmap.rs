//! The reverse-map check the stress tests and the loom models share.

use aspace::{AddressSpace, PAGE_SIZE};

/// The reverse map is exact for `mm`: every page of every VMA with an
/// anon_vma is found by a walk of its family (`rmap_walk` lists this
/// space at that address). A VMA filed under a stale key (its start moved
/// without a re-key) or not filed at all fails. Call it with no writer of
/// `mm` running.
pub fn check_rmap(mm: &AddressSpace) {
    for v in mm.vmas().into_iter().filter(|v| v.anon_vma) {
        for a in (v.start..v.end).step_by(PAGE_SIZE as usize) {
            let hits = mm.rmap_walk(a);
            assert!(
                hits.iter().any(|h| h.mm_id == mm.id() && h.addr == a),
                "{a:#x} of {:#x}..{:#x} not in its family's rmap: {hits:?}",
                v.start,
                v.end
            );
        }
    }
}
