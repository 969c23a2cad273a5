//! Unit tests of the vmalloc-style allocator: bad windows, lowest fit and
//! errors, lazy areas and purging, spilling to remote zones.

use super::*;

fn small(mode: Mode, zones: usize, lazy_max: u64) -> Vmap {
    Vmap::new(VmapConfig {
        window: Range::new(0x1000_0000, 0x1000_0000 + 64 * PAGE_SIZE),
        mode,
        zones,
        lazy_max_bytes: lazy_max,
    })
    .unwrap()
}

#[test]
fn bad_windows_are_einval() {
    for window in [
        Range::new(0x1000, 0x1000),
        Range::new(0x1000, 0x2001),
        Range::new(0x1001, 0x3000),
    ] {
        let cfg = VmapConfig {
            window,
            ..VmapConfig::default()
        };
        assert_eq!(Vmap::new(cfg).err(), Some(Error::Inval));
    }
}

#[test]
fn lowest_fit_alignment_and_errors() {
    let v = small(Mode::GlobalLock, 1, 1 << 30);
    let a = v.alloc(1, 1).unwrap();
    assert_eq!(a, Range::new(0x1000_0000, 0x1000_1000));
    let b = v.alloc(PAGE_SIZE, 4 * PAGE_SIZE).unwrap();
    assert_eq!(b.start, 0x1000_4000);
    assert_eq!(v.alloc(0, 1), Err(Error::Inval));
    assert_eq!(v.alloc(1, 3), Err(Error::Inval));
    assert_eq!(v.alloc(65 * PAGE_SIZE, 1), Err(Error::NoMem));
    assert_eq!(
        v.free(Range::new(a.start, a.end + PAGE_SIZE)),
        Err(Error::Inval)
    );
    assert_eq!(v.free(Range::new(1, 2)), Err(Error::Inval));
    v.free(a).unwrap();
    assert_eq!(v.free(a), Err(Error::Inval), "double free");
}

#[test]
fn lazy_areas_are_not_reused_before_the_purge() {
    let v = small(Mode::GlobalLock, 1, 1 << 30);
    let a = v.alloc(PAGE_SIZE, 1).unwrap();
    v.free(a).unwrap();
    let b = v.alloc(PAGE_SIZE, 1).unwrap();
    assert_ne!(a, b, "a lazily freed area came back before its flush");
    assert_eq!(v.areas(), vec![(a, AreaState::Lazy), (b, AreaState::Busy)]);
    v.purge_all();
    assert_eq!(v.stats().purges, 1);
    assert_eq!(v.alloc(PAGE_SIZE, 1).unwrap(), a);
}

#[test]
fn purge_past_the_threshold_and_on_exhaustion() {
    let v = small(Mode::GlobalLock, 1, 2 * PAGE_SIZE);
    let rs: Vec<_> = (0..3).map(|_| v.alloc(PAGE_SIZE, 1).unwrap()).collect();
    for r in rs {
        v.free(r).unwrap();
    }
    let s = v.stats();
    assert_eq!(
        (s.purges, s.purged_areas, s.flushed_bytes),
        (1, 3, 3 * PAGE_SIZE)
    );
    // Exhaustion purges before failing.
    let w = small(Mode::GlobalLock, 1, 1 << 30);
    let all = w.alloc(64 * PAGE_SIZE, 1).unwrap();
    w.free(all).unwrap();
    assert_eq!(w.alloc(64 * PAGE_SIZE, 1).unwrap(), all);
}

#[test]
fn zones_spill_to_remote_zones() {
    // One home zone for all eight: a thread moved to another CPU would fill a second one locally.
    #[cfg(target_os = "linux")]
    crate::percpu::pin_to(crate::percpu::allowed_cpus()[0]);
    let v = small(Mode::PerCpu, 4, 1 << 30);
    assert_eq!(v.zones(), 4);
    let rs: Vec<_> = (0..8).map(|_| v.alloc(8 * PAGE_SIZE, 1).unwrap()).collect();
    assert!(v.alloc(PAGE_SIZE, 1).is_err());
    assert!(v.stats().remote_allocs >= 6);
    for w in rs.windows(2) {
        assert!(!w[0].overlaps(&w[1]));
    }
}
