//! The error and helper types a caller composes with: detailed memory
//! faults, conversions, `Debug`/`Display`, `vma_at`, `Stats` deltas and
//! `Config` validation.

use aspace::mm::config::MAX_TASK_SIZE;
use aspace::{
    AddressSpace, Config, ConfigError, Error, FaultError, MapFlags, MemoryFault, Prot, PAGE_SIZE,
};

const PAGE: u64 = PAGE_SIZE;

fn anon() -> MapFlags {
    MapFlags::PRIVATE | MapFlags::ANONYMOUS
}

#[test]
fn read_and_write_failures_say_where_why_and_how_far() {
    let mm = AddressSpace::new(Config::default());
    let a = mm
        .mmap(0, 3 * PAGE, Prot::READ | Prot::WRITE, anon())
        .unwrap();
    mm.munmap(a + 2 * PAGE, PAGE).unwrap();
    // Two pages written, then the hole.
    let e = mm
        .write(a + 100, &vec![7u8; 3 * PAGE as usize])
        .unwrap_err();
    assert_eq!(
        e,
        Error::Memory(MemoryFault {
            addr: a + 2 * PAGE,
            kind: FaultError::NoMapping,
            done: (2 * PAGE - 100) as usize,
        })
    );
    assert_eq!(e.errno(), 14);
    assert_eq!(e.name(), "EFAULT");
    // A read-only page before any hole: nothing is written.
    mm.mprotect(a + PAGE, PAGE, Prot::READ).unwrap();
    let e = mm.write(a, &vec![1u8; 2 * PAGE as usize]).unwrap_err();
    assert_eq!(
        e,
        Error::Memory(MemoryFault {
            addr: a + PAGE,
            kind: FaultError::AccessDenied,
            done: 0,
        })
    );
    let mut b = [0u8; 1];
    mm.read(a + 100, &mut b).unwrap();
    assert_eq!(b, [7]);
    // Past the task size: nothing is copied.
    let top = Config::default().task_size;
    let e = mm.read(top - 1, &mut [0u8; 2]).unwrap_err();
    assert_eq!(
        e,
        Error::Memory(MemoryFault {
            addr: top,
            kind: FaultError::NoMapping,
            done: 0,
        })
    );
}

#[test]
fn errors_convert_and_chain() {
    use std::error::Error as _;
    fn io_caller(mm: &AddressSpace) -> std::io::Result<()> {
        mm.munmap(1, PAGE)?;
        Ok(())
    }
    let mm = AddressSpace::new(Config::default());
    let e = io_caller(&mm).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(22));
    let e: Error = FaultError::Bus.into();
    assert_eq!(e, Error::PageFault(FaultError::Bus));
    assert_eq!(e.errno(), 14);
    assert!(e.source().is_some());
    assert_eq!(Error::from(FaultError::OutOfMemory).errno(), 12);
    assert_eq!(Error::AccessDenied.errno(), 13);
    assert_eq!(Error::from_errno(13), Some(Error::AccessDenied));
    assert!(Error::Inval.source().is_none());
}

#[test]
fn vma_at_debug_and_stats_delta() {
    let mm = AddressSpace::new(Config::default());
    let a = mm
        .mmap(0, 2 * PAGE, Prot::READ | Prot::WRITE, anon())
        .unwrap();
    let v = mm.vma_at(a + PAGE).unwrap();
    assert_eq!((v.start, v.end), (a, a + 2 * PAGE));
    assert_eq!(mm.vma_at(a + 2 * PAGE), None);
    let before = mm.stats();
    mm.write(a, &[1]).unwrap();
    let d = mm.stats() - before;
    // The first write of a VMA (the default speculative path gives it its
    // anon_vma).
    assert_eq!(d.faults(), 1);
    assert_eq!(d.spec_anon_vma_prepared, 1);
    assert!(d.to_string().contains("fault_speculative"), "{d}");
    assert_eq!((before - before).to_string(), "(no events)\n");
    let dbg = format!("{mm:?}");
    assert!(
        dbg.contains("map_count: 1") && dbg.contains("frames_used: 1"),
        "{dbg}"
    );
}

/// The largest task size works to its last page, and that page is not
/// the first one's (a 4-level page table addresses all of it).
#[test]
fn the_largest_task_size_reaches_its_last_page_apart_from_the_first() {
    let mm = AddressSpace::try_new(Config {
        task_size: MAX_TASK_SIZE,
        mmap_base: MAX_TASK_SIZE - (128 << 20),
        ..Config::default()
    })
    .unwrap();
    let fixed = MapFlags::PRIVATE | MapFlags::ANONYMOUS | MapFlags::FIXED;
    let (lo, hi) = (0x10_0000, MAX_TASK_SIZE - PAGE_SIZE);
    let rw = Prot::READ | Prot::WRITE;
    assert_eq!(mm.mmap(lo, PAGE_SIZE, rw, fixed), Ok(lo));
    assert_eq!(mm.mmap(hi, PAGE_SIZE, rw, fixed), Ok(hi));
    assert_eq!(
        mm.mmap(hi + PAGE_SIZE, PAGE_SIZE, rw, fixed),
        Err(Error::NoMem)
    );
    mm.write(hi, b"top").unwrap();
    mm.write(lo, b"low").unwrap();
    let mut b = [0u8; 3];
    mm.read(hi, &mut b).unwrap();
    assert_eq!(&b, b"top");
}

#[test]
fn config_validation() {
    assert_eq!(Config::default().validate(), Ok(()));
    assert_eq!(Config::x86_32().validate(), Ok(()));
    let field = |c: Config| c.validate().unwrap_err().field;
    let d = Config::default;
    assert_eq!(
        field(Config {
            task_size: 0,
            ..d()
        }),
        "task_size"
    );
    assert_eq!(
        field(Config {
            task_size: 12345,
            ..d()
        }),
        "task_size"
    );
    // Past 4-level paging's user half: memory mapped past 2^48 could
    // never be touched (5-level paging's 2^56 was accepted once).
    for task_size in [MAX_TASK_SIZE + PAGE_SIZE, 1 << 48, 1 << 56] {
        assert_eq!(
            field(Config {
                task_size,
                mmap_base: task_size - (128 << 20),
                ..d()
            }),
            "task_size"
        );
    }
    assert_eq!(
        field(Config {
            mmap_min_addr: 1 << 50,
            ..d()
        }),
        "mmap_min_addr"
    );
    assert_eq!(
        field(Config {
            mmap_base: 1 << 60,
            ..d()
        }),
        "mmap_base"
    );
    assert_eq!(
        field(Config {
            mmap_base: 0x1001,
            ..d()
        }),
        "mmap_base"
    );
    // A heap above the mmap area could never grow.
    assert_eq!(
        field(Config {
            brk_start: d().mmap_base,
            ..d()
        }),
        "brk_start"
    );
    assert_eq!(
        field(Config {
            brk_start: 0x1000,
            ..d()
        }),
        "brk_start"
    );
    assert_eq!(
        field(Config {
            stack_guard_gap: 100,
            ..d()
        }),
        "stack_guard_gap"
    );
    assert_eq!(
        field(Config {
            max_map_count: 0,
            ..d()
        }),
        "max_map_count"
    );
    let e: ConfigError = AddressSpace::try_new(Config {
        brk_start: 3,
        ..d()
    })
    .unwrap_err();
    assert!(e.to_string().contains("brk_start"), "{e}");
}

#[test]
fn a_32_bit_guest_layout() {
    let mm = AddressSpace::try_new(Config::x86_32()).unwrap();
    let a = mm.mmap(0, 1 << 20, Prot::READ, anon()).unwrap();
    assert!(a + (1 << 20) <= 0xf800_0000, "{a:#x}");
    let brk = mm.brk(0).unwrap();
    assert_eq!(brk, 0x0900_0000);
    assert_eq!(mm.brk(brk + (1 << 20)), Ok(brk + (1 << 20)));
    assert_eq!(
        mm.mmap(0xffff_e000, PAGE, Prot::READ, anon() | MapFlags::FIXED),
        Err(Error::NoMem)
    );
}
