//! Loom models of `UFFDIO_WRITEPROTECT` (src/uffd/wp.rs) against writes to
//! the page it protects, through an async write-protect handler (the
//! dirty-tracking reset of `pagemap_scan`): a user-mode store (the fault
//! path once the entry is protected) and a translator's store through a
//! cached writable translation. Write-protect changes no VMA: it rewrites
//! present entries under their PTE locks and flushes.
//!
//! The rule both check: once `write_protect` has returned, a store that
//! changes the page is reported written by the next scan. Each catches:
//! `write_protect`'s flush covering nothing (`gather.add_page(va)`
//! deleted in src/uffd/wp.rs): a store whose access began before the
//! protection lands afterwards through the old writable translation,
//! unrecorded.
#![cfg(aspace_loom)]

mod common;
use common::{cfg, fixed, model, rw};

use aspace::uffd::{PageCategories, RegisterMode, ScanArgs};
use aspace::{AddressSpace, UffdBuilder, PAGE_SIZE};
use loom::sync::Arc;
use loom::thread;

const A: u64 = 0x4000_0000;

fn byte(mm: &AddressSpace) -> u8 {
    let mut x = [0u8; 1];
    mm.read(A, &mut x).unwrap();
    x[0]
}

fn reported_written(mm: &AddressSpace) -> bool {
    let args = ScanArgs {
        category_mask: PageCategories::WRITTEN,
        return_mask: PageCategories::WRITTEN,
        max_regions: 1,
        ..ScanArgs::default()
    };
    !mm.pagemap_scan(A, A + PAGE_SIZE, &args)
        .unwrap()
        .regions
        .is_empty()
}

fn store_vs_write_protect(translator: bool) {
    model(move || {
        let mm = Arc::new(AddressSpace::new(cfg()));
        mm.mmap(A, PAGE_SIZE, rw(), fixed()).unwrap();
        let uffd = UffdBuilder::new().wp_async(true).create(&mm);
        uffd.register_with_mode(A, PAGE_SIZE, RegisterMode::WRITE_PROTECT)
            .unwrap();
        mm.write(A, &[1]).unwrap();
        let m2 = mm.clone();
        let t = thread::spawn(move || {
            if translator {
                let mut tr = m2.translator();
                let _ = tr.load::<u8>(A); // caches the writable entry
                tr.store::<u8>(A, 2).unwrap();
            } else {
                m2.write(A, &[2]).unwrap();
            }
        });
        uffd.write_protect(A, PAGE_SIZE).unwrap();
        let seen = byte(&mm);
        t.join().unwrap();
        if byte(&mm) != seen {
            assert!(
                reported_written(&mm),
                "a store after the reset went unrecorded"
            );
        }
        drop(uffd);
    });
}

/// A user-mode store (per-VMA write fault on the protected entry).
#[test]
fn write_fault_vs_write_protect() {
    store_vs_write_protect(false);
}

/// A translator's store through a cached writable translation.
#[test]
fn translator_store_vs_write_protect() {
    store_vs_write_protect(true);
}
