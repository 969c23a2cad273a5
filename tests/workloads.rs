//! The workloads (`aspace::workloads`) in every mode and on the kernel:
//! the instantiation workload's stored words read back before
//! `MADV_DONTNEED` and zero after it, pft faults every page, and no VMA
//! or frame is left behind.

use aspace::workloads::instantiate::{self, Kind, Params, Until};
use aspace::workloads::{pft, Kernel, Space, MODES};
use aspace::{AddressSpace, Advice, MapFlags, Prot};
use std::io;

fn params(kind: Kind) -> Params {
    Params {
        threads: 2,
        kind,
        until: Until::Instances(4),
        check: true,
        pin: false,
    }
}

#[test]
fn every_mode_reads_back_and_leaves_no_vma() {
    for mode in MODES {
        for kind in [Kind::Instances, Kind::WritersOnly] {
            let mm = mode.space();
            let s = instantiate::run(&mm, &params(kind))
                .unwrap_or_else(|e| panic!("{} {}: {e}", mode.name, kind.name()));
            assert_eq!(s.instances, 8, "{} {}", mode.name, kind.name());
            assert_eq!(s.cpu.len(), 2);
            assert_eq!(
                mm.map_count(),
                0,
                "{} {}: {}",
                mode.name,
                kind.name(),
                mm.maps()
            );
            assert!(mm.vmas().is_empty() && mm.maps().is_empty());
        }
    }
}

#[test]
fn stores_fault_in_only_while_the_instance_lives() {
    // Full instances fault pages in; their frames go back with each
    // MADV_DONTNEED and munmap.
    let mm = MODES[0].space();
    instantiate::run(&mm, &params(Kind::Instances)).expect("instances");
    assert_eq!(mm.frames_used(), 0, "frames left after the instances");
    let s = mm.stats();
    let stores = 8 * instantiate::ROUNDS * instantiate::PAGES;
    assert!(
        s.faults() >= stores,
        "{} faults for {stores} first stores",
        s.faults()
    );
}

#[test]
fn the_kernel_runs_the_same_program() {
    // SAFETY: only the driver uses it, on the mappings it makes.
    let k = unsafe { Kernel::new() };
    for kind in [Kind::Instances, Kind::WritersOnly] {
        let s = instantiate::run(&k, &params(kind)).expect("the kernel's instances");
        assert_eq!(s.instances, 8);
    }
}

/// aspace with a `MADV_DONTNEED` that does nothing: the check must see
/// the stored words survive it.
struct NoDontNeed(AddressSpace);

impl Space for NoDontNeed {
    type Cpu<'a> = aspace::Translator<'a>;
    fn mmap(&self, len: u64, prot: Prot, flags: MapFlags) -> io::Result<u64> {
        Space::mmap(&self.0, len, prot, flags)
    }
    fn mprotect(&self, addr: u64, len: u64, prot: Prot) -> io::Result<()> {
        Space::mprotect(&self.0, addr, len, prot)
    }
    fn munmap(&self, addr: u64, len: u64) -> io::Result<()> {
        Space::munmap(&self.0, addr, len)
    }
    fn madvise(&self, _addr: u64, _len: u64, _advice: Advice) -> io::Result<()> {
        Ok(())
    }
    fn cpu(&self) -> Self::Cpu<'_> {
        self.0.translator()
    }
}

#[test]
fn the_check_catches_a_dontneed_that_keeps_the_pages() {
    let mm = NoDontNeed(MODES[1].space());
    let e = instantiate::run(&mm, &params(Kind::Instances)).expect_err("pages kept");
    assert!(e.to_string().contains("after MADV_DONTNEED"), "{e}");
    // The failed instances were unmapped all the same.
    assert_eq!(mm.0.map_count(), 0, "{}", mm.0.maps());
}

#[test]
fn pft_faults_every_page_in_every_mode_and_on_the_kernel() {
    for layout in [
        pft::Layout::Single,
        pft::Layout::PerThread,
        pft::Layout::Interleaved,
    ] {
        for huge in [false, true] {
            let p = pft::Params {
                threads: 2,
                layout,
                bytes_per_thread: 4 << 20,
                huge,
                pin: false,
            };
            let pages = 2 * (4 << 20) / aspace::PAGE_SIZE;
            for mode in MODES {
                let mm = mode.space();
                let s = pft::run(&mm, &p).expect("pft");
                assert_eq!(s.faults, pages, "{} {layout:?}", mode.name);
                let st = mm.stats();
                // Huge: one fault per 2 MiB page the space mapped, the rest
                // of the stores hit it.
                let expect = if huge { st.thp_fault_alloc * 512 } else { 0 };
                assert!(
                    st.faults() + expect >= pages,
                    "{} {layout:?}: {st}",
                    mode.name
                );
                assert_eq!(mm.map_count(), 0, "{}", mm.maps());
                assert_eq!(mm.frames_used(), 0, "{} {layout:?}", mode.name);
            }
            // SAFETY: only the driver uses it, on the mappings it makes.
            let s = pft::run(&unsafe { Kernel::new() }, &p).expect("the kernel's pft");
            assert_eq!(s.faults, pages);
        }
    }
}
