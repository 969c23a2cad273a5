//! Dirty tracking through `PAGEMAP_SCAN`: the pages a scan reports
//! written, with or without the reset (write-protecting them again) in
//! the same pass. Shared by `uffd.rs` and `device_slices.rs`, which
//! include it with `#[path = "common/written.rs"] mod written;`.

use aspace::uffd::{PageCategories, ScanArgs, ScanFlags};
use aspace::{AddressSpace, PAGE_SIZE};
use std::collections::BTreeSet;

/// The scan of written pages, resetting them if `wp`.
pub fn written_args(wp: bool) -> ScanArgs {
    ScanArgs {
        flags: if wp {
            ScanFlags::WP_MATCHING | ScanFlags::CHECK_WPASYNC
        } else {
            ScanFlags::empty()
        },
        category_mask: PageCategories::WRITTEN,
        return_mask: PageCategories::WRITTEN,
        max_regions: usize::MAX,
        ..ScanArgs::default()
    }
}

/// The written pages of `[a, a + len)`, reset if `wp`.
pub fn pages_of(mm: &AddressSpace, a: u64, len: u64, wp: bool) -> BTreeSet<u64> {
    let r = mm.pagemap_scan(a, a + len, &written_args(wp)).unwrap();
    assert_eq!(r.walk_end, a + len);
    r.regions
        .iter()
        .flat_map(|g| (g.start..g.end).step_by(PAGE_SIZE as usize))
        .collect()
}
