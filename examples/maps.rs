//! Maps, writes, reads, protects, remaps and prints an address space.
//!
//! `cargo run --release --example maps`

use aspace::{Access, AddressSpace, Advice, Config, MapFlags, MremapFlags, Prot, PAGE_SIZE};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mm = AddressSpace::new(Config::default());
    let rw = Prot::READ | Prot::WRITE;
    let anon = MapFlags::PRIVATE | MapFlags::ANONYMOUS;

    let a = mm.mmap(0, 16 * PAGE_SIZE, rw, anon)?;
    mm.write(a + 100, b"hello, address space")?;
    let mut buf = [0u8; 20];
    mm.read(a + 100, &mut buf)?;
    println!("read back: {:?}", std::str::from_utf8(&buf)?);

    // Split into three VMAs, then merge back.
    mm.mprotect(a + 4 * PAGE_SIZE, 4 * PAGE_SIZE, Prot::READ)?;
    println!("\nafter mprotect of 4 pages in the middle:\n{}", mm.maps());
    println!(
        "store to the read-only part: {:?}",
        mm.write(a + 5 * PAGE_SIZE, b"x")
    );
    println!(
        "fault there: {:?}",
        mm.fault(a + 5 * PAGE_SIZE, Access::Write)
    );
    mm.mprotect(a + 4 * PAGE_SIZE, 4 * PAGE_SIZE, rw)?;

    // Move it: page-table entries move, the data comes along.
    let b = mm.mremap(a, 16 * PAGE_SIZE, 64 * PAGE_SIZE, MremapFlags::MAYMOVE, 0)?;
    mm.read(b + 100, &mut buf)?;
    println!("\nafter mremap to {b:#x}: {:?}", std::str::from_utf8(&buf)?);

    let shared = mm.mmap(0, 4 * PAGE_SIZE, rw, MapFlags::SHARED | MapFlags::ANONYMOUS)?;
    mm.write(shared, b"kept")?;
    mm.madvise(shared, PAGE_SIZE, Advice::DontNeed)?;
    mm.read(shared, &mut buf[..4])?;
    println!(
        "shared page after DONTNEED: {:?}",
        std::str::from_utf8(&buf[..4])?
    );

    let heap = mm.brk(0)?;
    mm.brk(heap + 10 * PAGE_SIZE)?;
    mm.write(heap, b"heap")?;

    println!("\n{}", mm.maps());
    let s = mm.stats();
    println!(
        "faults: {} per-VMA, {} under mmap_lock; frames in use: {}; page tables: {} bytes",
        s.fault_per_vma,
        s.fault_mmap_lock,
        mm.frames_used(),
        mm.page_table_bytes()
    );
    mm.munmap(b, 64 * PAGE_SIZE)?;
    mm.munmap(shared, 4 * PAGE_SIZE)?;
    Ok(())
}
