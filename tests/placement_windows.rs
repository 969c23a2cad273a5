//! Per-CPU placement windows (`Config::placement_window`,
//! `mm/placement.rs`'s `# Placement windows`) through the public API.
//!
//! Each thread binds itself to one CPU first, so the window it places in
//! is known: the one of the per-CPU slot of the CPU it runs on
//! (`sched_getcpu`). The checks fail if a search ignored the window, used
//! another thread's, overlapped a live mapping, or did not fall back to
//! Linux's whole-area search when the window was full.
//!
//! The range lock's bias (`Config::range_bias`) is off in these spaces:
//! while it holds, its owner places as Linux does (no other writer to keep
//! apart), which `the_bias_owner_places_as_linux_until_another_thread_writes`
//! checks.

use aspace::{AddressSpace, Config, FaultLocking, MapFlags, Prot, Range, WriterLocking, PAGE_SIZE};
use std::sync::{Arc, Barrier};

const RW: Prot = Prot::READ.union(Prot::WRITE);
const KB: u64 = 1 << 10;

fn anon() -> MapFlags {
    MapFlags::PRIVATE | MapFlags::ANONYMOUS
}

fn space(writer_locking: WriterLocking, window: u64) -> Arc<AddressSpace> {
    Arc::new(AddressSpace::new(Config {
        fault_locking: FaultLocking::Speculative,
        writer_locking,
        placement_window: window,
        range_bias: false,
        ..Config::default()
    }))
}

/// The CPUs this thread may run on.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is a plain bit array, valid when zeroed.
    let mut set: libc::cpu_set_t = unsafe { core::mem::zeroed() };
    let size = core::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: `set` is a writable cpu_set_t of `size` bytes.
    assert_eq!(unsafe { libc::sched_getaffinity(0, size, &mut set) }, 0);
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `c` is below CPU_SETSIZE, the set's capacity.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

/// Binds the calling thread to `cpu` and returns the CPU it now runs on.
fn bind(cpu: usize) -> u64 {
    // SAFETY: as in `allowed_cpus`.
    let mut one: libc::cpu_set_t = unsafe { core::mem::zeroed() };
    // SAFETY: `cpu` came from the allowed set, so it is below CPU_SETSIZE.
    unsafe { libc::CPU_SET(cpu, &mut one) };
    let size = core::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: `one` is a valid cpu_set_t of `size` bytes; 0 is this thread.
    assert_eq!(unsafe { libc::sched_setaffinity(0, size, &one) }, 0);
    // SAFETY: no preconditions.
    let now = unsafe { libc::sched_getcpu() };
    assert_eq!(now, cpu as i32, "bound to {cpu}, running on {now}");
    cpu as u64
}

/// The window of `cpu`'s slot with windows of `size` bytes.
fn window_of(cpu: u64, size: u64) -> Range {
    let top = Config::default().mmap_base - cpu * size;
    Range::new(top - size, top)
}

/// Threads bound to different CPUs place (with the range lock and with
/// the mmap_lock) only inside their own windows, top-down from the
/// window's top, and never over each other.
#[test]
fn threads_on_different_cpus_place_in_their_own_windows() {
    let cpus: Vec<usize> = allowed_cpus().into_iter().take(2).collect();
    let size = 1 << 30;
    let len = 64 * KB;
    let n = 64u64;
    for locking in [WriterLocking::Range, WriterLocking::MmapLock] {
        let mm = space(locking, size);
        let start = Arc::new(Barrier::new(cpus.len()));
        let hs: Vec<_> = cpus
            .iter()
            .map(|&cpu| {
                let (mm, start) = (mm.clone(), start.clone());
                std::thread::spawn(move || {
                    let cpu = bind(cpu);
                    start.wait();
                    let placed: Vec<u64> = (0..n)
                        .map(|_| mm.mmap(0, len, RW, anon()).unwrap())
                        .collect();
                    (cpu, placed)
                })
            })
            .collect();
        let mut all: Vec<(u64, u64)> = Vec::new();
        for h in hs {
            let (cpu, placed) = h.join().unwrap();
            let w = window_of(cpu, size);
            // Alone in its window, each thread fills it from the top down.
            for (i, &a) in placed.iter().enumerate() {
                assert_eq!(a, w.end - (i as u64 + 1) * len, "{locking:?} cpu {cpu}");
            }
            all.extend(placed.iter().map(|&a| (a, a + len)));
        }
        all.sort_unstable();
        assert_eq!(all.len() as u64, n * cpus.len() as u64);
        assert!(
            all.windows(2).all(|p| p[0].1 <= p[1].0),
            "placements overlap"
        );
        // One VMA per window: each thread's mappings merged with its own
        // only.
        assert_eq!(mm.map_count(), cpus.len());
    }
}

/// A full window (or a length larger than it) falls back to Linux's
/// search of the whole area; freeing room in the window brings placements
/// back into it.
#[test]
fn a_full_window_falls_back_to_the_whole_area() {
    let size = 1 << 20;
    let len = 256 * KB;
    let base = Config::default().mmap_base;
    for locking in [WriterLocking::Range, WriterLocking::MmapLock] {
        let cpu = *allowed_cpus().last().unwrap();
        let mm = space(locking, size);
        let got = std::thread::spawn(move || {
            let cpu = bind(cpu);
            let w = window_of(cpu, size);
            let fill: Vec<u64> = (0..size / len)
                .map(|_| mm.mmap(0, len, RW, anon()).unwrap())
                .collect();
            let expect_fill: Vec<u64> = (1..=size / len).map(|i| w.end - i * len).collect();
            assert_eq!(fill, expect_fill, "the window fills top-down");
            // The whole area's top-down fit: the top of the area, or just
            // below window 0 when that is the full one.
            let top = if cpu == 0 { base - size } else { base };
            let spill = mm.mmap(0, len, RW, anon()).unwrap();
            assert_eq!(spill, top - len, "cpu {cpu}: full window falls back");
            // (Not a multiple of 2 MiB: no huge-page alignment.)
            let big_len = size + len;
            let big = mm.mmap(0, big_len, RW, anon()).unwrap();
            // The highest gap that fits it: below the spill, unless the
            // window sits right under the spill's 256 KiB and the 768 KiB
            // between them is too small (slot 1).
            let below = if cpu == 1 { w.start } else { spill };
            assert_eq!(big, below - big_len, "longer than a window");
            // Room again in the window: the next placement goes there.
            mm.munmap(fill[1], len).unwrap();
            assert_eq!(mm.mmap(0, len, RW, anon()).unwrap(), fill[1]);
        });
        got.join().unwrap();
    }
}

/// Windows off: Linux's placement, each mapping right below the last,
/// whichever CPU makes it.
#[test]
fn windows_off_places_as_linux() {
    let cpus = allowed_cpus();
    let len = 64 * KB;
    let base = Config::default().mmap_base;
    let mm = space(WriterLocking::Range, 0);
    let cpu = *cpus.last().unwrap();
    std::thread::spawn(move || {
        bind(cpu);
        for i in 1..=4 {
            assert_eq!(mm.mmap(0, len, RW, anon()).unwrap(), base - i * len);
        }
        assert_eq!(mm.map_count(), 1);
    })
    .join()
    .unwrap();
}

/// A hint that can be used wins over the window; a window size that is
/// no page multiple is refused.
#[test]
fn a_usable_hint_wins_and_unaligned_windows_are_refused() {
    let mm = space(WriterLocking::Range, 1 << 30);
    let hint = 0x1000_0000;
    assert_eq!(mm.mmap(hint, PAGE_SIZE, RW, anon()), Ok(hint));
    let bad = Config {
        placement_window: PAGE_SIZE + 1,
        ..Config::default()
    };
    let e = AddressSpace::try_new(bad).unwrap_err();
    assert_eq!(e.field, "placement_window");
}

/// With the range lock's bias on, a thread alone in the space places as
/// Linux does, windows or not: each mapping right below the last, merged
/// with it. Once another thread has written (the bias ends with no
/// handover, and the tree is split), placements go to the calling CPU's
/// window. Fails if the owner's placements used the window, or if the
/// windows never came back after the bias ended (on CPU 1 or above: the
/// window of CPU 0 starts at the area's top).
#[test]
fn the_bias_owner_places_as_linux_until_another_thread_writes() {
    let size = 1 << 30;
    let len = 64 * KB;
    let base = Config::default().mmap_base;
    let mm = Arc::new(AddressSpace::new(Config {
        writer_locking: WriterLocking::Range,
        placement_window: size,
        range_bias: true,
        range_space_bias: true,
        range_bias_handovers: 0,
        ..Config::default()
    }));
    let cpu = *allowed_cpus().last().unwrap();
    let m = mm.clone();
    std::thread::spawn(move || {
        let cpu = bind(cpu);
        for i in 1..=4 {
            assert_eq!(m.mmap(0, len, RW, anon()).unwrap(), base - i * len);
        }
        assert_eq!(m.map_count(), 1, "the owner's mappings merge, as Linux's");
        cpu
    })
    .join()
    .unwrap();
    // Another thread's writer ends the bias.
    let m = mm.clone();
    std::thread::spawn(move || m.munmap(base - len, len).unwrap())
        .join()
        .unwrap();
    let m = mm.clone();
    std::thread::spawn(move || {
        let cpu = bind(cpu);
        let w = window_of(cpu, size);
        let a = m.mmap(0, len, RW, anon()).unwrap();
        // (Window 0's top is the area's: on a machine with one CPU the
        // two placements coincide, and this checks nothing more than
        // Linux's placement.)
        let expect = if cpu == 0 { base - len } else { w.end - len };
        assert_eq!(a, expect, "cpu {cpu}: back in the window");
    })
    .join()
    .unwrap();
}
