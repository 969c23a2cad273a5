//! Memory footprint: metadata bytes per VMA, and page-table bytes per
//! populated page (dense and sparse), against Linux's figures.
//!
//! `cargo run --release --example footprint`

use aspace::{Access, AddressSpace, Config, MapFlags, Prot, PAGE_SIZE};

fn main() {
    let rw = Prot::READ | Prot::WRITE;
    let anon = MapFlags::PRIVATE | MapFlags::ANONYMOUS;

    // Per VMA: map 10,000 VMAs that cannot merge (alternating protection).
    let mm = AddressSpace::new(Config::default());
    let base = 0x1000_0000u64;
    let n = 10_000u64;
    for i in 0..n {
        let prot = if i % 2 == 0 { rw } else { Prot::READ };
        mm.mmap(
            base + i * PAGE_SIZE,
            PAGE_SIZE,
            prot,
            anon | MapFlags::FIXED,
        )
        .unwrap();
    }
    assert_eq!(mm.map_count(), n as usize);
    let per_vma = mm.metadata_bytes_per_vma();
    println!(
        "metadata per VMA: {per_vma} bytes (VMA object {} + tree nodes; {} objects for {n} VMAs); Linux vm_area_struct: 192 bytes ({:.2}x)",
        AddressSpace::VMA_OBJECT_BYTES,
        mm.vma_objects(),
        per_vma as f64 / 192.0
    );

    // Dense: populate 1 GiB.
    let mm = AddressSpace::new(Config {
        zero_pages: false,
        memory_budget: 2 << 30,
        ..Config::default()
    });
    let len = 1u64 << 30;
    let a = mm.mmap(0, len, rw, anon).unwrap();
    for p in 0..len / PAGE_SIZE {
        mm.fault(a + p * PAGE_SIZE, Access::Write).unwrap();
    }
    let pages = len / PAGE_SIZE;
    println!(
        "page tables, 1 GiB dense: {:.2} bytes per populated page (Linux: ~8.0)",
        mm.page_table_bytes() as f64 / pages as f64
    );

    // Sparse: one page every 2 MiB over 1 GiB.
    let mm = AddressSpace::new(Config::default());
    let a = mm.mmap(0, len, rw, anon).unwrap();
    let mut n = 0;
    let mut off = 0;
    while off < len {
        mm.fault(a + off, Access::Write).unwrap();
        n += 1;
        off += 2 << 20;
    }
    println!(
        "page tables, one page per 2 MiB: {:.0} bytes per populated page (Linux: ~4096)",
        mm.page_table_bytes() as f64 / n as f64
    );
}
