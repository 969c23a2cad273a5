//! The soft TLB ([`aspace::Translator`]): every access kind, page
//! crossing, faults and their errors, copy-on-write after fork, and
//! invalidation by every kind of flush, on the translator's own thread and
//! on others; atomics between threads (the stress test against flushes
//! is in `translator_stress.rs`, faults, fetches, owned translators and
//! misaligned atomics in `translator_guest.rs`).

use aspace::{
    AddressSpace, Advice, Config, FaultError, MapFlags, MemoryFault, MremapFlags, Prot, Scalar,
    Translator, PAGE_SIZE,
};
use std::sync::{mpsc, Arc, Barrier};

const RW: Prot = Prot::READ.union(Prot::WRITE);
const A: u64 = 0x10_0000_0000;
const B: u64 = 0x20_0000_0000;

fn fixed() -> MapFlags {
    MapFlags::PRIVATE | MapFlags::ANONYMOUS | MapFlags::FIXED
}

/// The fault kind of a translator error.
fn kind<T>(r: Result<T, MemoryFault>) -> Result<T, FaultError> {
    r.map_err(|e| e.kind)
}

fn mm_with(pages: u64) -> AddressSpace {
    let mm = AddressSpace::new(Config::default());
    mm.mmap(A, pages * PAGE_SIZE, RW, fixed()).unwrap();
    mm
}

#[test]
fn scalars_of_every_width_round_trip() {
    let mm = mm_with(2);
    let mut t = mm.translator();
    t.store::<u64>(A, 0x1122_3344_5566_7788).unwrap();
    assert_eq!(t.load::<u64>(A).unwrap(), 0x1122_3344_5566_7788);
    assert_eq!(t.load::<u32>(A).unwrap(), 0x5566_7788);
    assert_eq!(t.load::<u32>(A + 4).unwrap(), 0x1122_3344);
    assert_eq!(t.load::<u16>(A + 2).unwrap(), 0x5566);
    assert_eq!(t.load::<u8>(A + 7).unwrap(), 0x11);
    t.store::<u8>(A + 1, 0xab).unwrap();
    t.store::<u16>(A + 4, 0xbeef).unwrap();
    t.store::<i32>(A + 8, -2).unwrap();
    t.store::<i8>(A + 12, -1).unwrap();
    t.store::<i16>(A + 14, -3).unwrap();
    t.store::<i64>(A + 16, -5).unwrap();
    assert_eq!(t.load::<u64>(A).unwrap(), 0x1122_beef_5566_ab88);
    assert_eq!(t.load::<i32>(A + 8).unwrap(), -2);
    assert_eq!(t.load::<u32>(A + 8).unwrap(), u32::MAX - 1);
    assert_eq!(t.load::<i8>(A + 12).unwrap(), -1);
    assert_eq!(t.load::<i16>(A + 14).unwrap(), -3);
    assert_eq!(t.load::<i64>(A + 16).unwrap(), -5);
    // The plain API sees the same bytes.
    let mut b = [0u8; 8];
    mm.read(A, &mut b).unwrap();
    assert_eq!(u64::from_le_bytes(b), 0x1122_beef_5566_ab88);
    mm.write(A + 24, &7u64.to_le_bytes()).unwrap();
    assert_eq!(t.load::<u64>(A + 24).unwrap(), 7);
}

#[test]
fn unaligned_and_page_crossing_scalars() {
    let mm = mm_with(2);
    let mut t = mm.translator();
    for addr in [A + 3, A + 4093, A + 4095, A + 4090, A + 4092] {
        t.store::<u64>(addr, 0x0102_0304_0506_0708 ^ addr).unwrap();
        assert_eq!(t.load::<u64>(addr).unwrap(), 0x0102_0304_0506_0708 ^ addr);
        let mut b = [0u8; 8];
        mm.read(addr, &mut b).unwrap();
        assert_eq!(u64::from_le_bytes(b), 0x0102_0304_0506_0708 ^ addr);
    }
    // Narrow ones across an 8-byte word inside a cached page (the hit
    // check also checks alignment).
    t.store::<u32>(A + 6, 0x1122_3344).unwrap();
    t.store::<u16>(A + 15, 0x5566).unwrap();
    assert_eq!(t.load::<u32>(A + 6).unwrap(), 0x1122_3344);
    assert_eq!(t.load::<u16>(A + 15).unwrap(), 0x5566);
    assert_eq!(t.load::<u16>(A + 7).unwrap(), 0x2233);
    let mut b = [0u8; 4];
    mm.read(A + 6, &mut b).unwrap();
    assert_eq!(u32::from_le_bytes(b), 0x1122_3344);
    t.store::<u32>(A + 4094, 0xa1b2_c3d4).unwrap();
    assert_eq!(t.load::<u32>(A + 4094).unwrap(), 0xa1b2_c3d4);
    assert_eq!(t.load::<u16>(A + 4095).unwrap(), 0xb2c3);
    assert_eq!(t.load::<u8>(A + 4097).unwrap(), 0xa1);
}

/// Stores a `T` at every offset of the first page of `A` and across into
/// the second (naturally aligned ones on the hit path, the others and
/// the page-crossing ones through the slow path): `mm.read` sees its
/// bytes and the bytes around it unchanged; the translator loads it back,
/// and loads what `mm.write` puts there next.
fn every_offset<T: Scalar>(mm: &AddressSpace, t: &mut Translator<'_>) {
    let size = std::mem::size_of::<T>() as u64;
    let around = |at: u64| (at.saturating_sub(8).max(A), at + size + 8);
    for off in 0..PAGE_SIZE {
        let at = A + off;
        let (lo, hi) = around(at);
        let background: Vec<u8> = (lo..hi)
            .map(|a| (a as u8).wrapping_mul(31) ^ 0x5a)
            .collect();
        mm.write(lo, &background).unwrap();
        let bits = 0x8192_a3b4_c5d6_e7f8 ^ off.wrapping_mul(0x0101_0101_0101_0101);
        let v = T::from_bits(bits);
        t.store::<T>(at, v).unwrap();
        let mut want = background.clone();
        let i = (at - lo) as usize;
        want[i..i + size as usize].copy_from_slice(&bits.to_le_bytes()[..size as usize]);
        let mut got = vec![0u8; want.len()];
        mm.read(lo, &mut got).unwrap();
        assert_eq!(got, want, "{size}-byte store at offset {off}");
        assert_eq!(t.load::<T>(at).unwrap(), v, "{size}-byte load at {off}");
        let other = !bits;
        mm.write(at, &other.to_le_bytes()[..size as usize]).unwrap();
        assert_eq!(
            t.load::<T>(at).unwrap(),
            T::from_bits(other),
            "{size}-byte load at {off} of what mm.write wrote"
        );
    }
}

#[test]
fn every_width_at_every_offset_matches_mm_read() {
    let mm = mm_with(2);
    let mut t = mm.translator();
    every_offset::<u8>(&mm, &mut t);
    every_offset::<u16>(&mm, &mut t);
    every_offset::<u32>(&mm, &mut t);
    every_offset::<u64>(&mm, &mut t);
    every_offset::<i16>(&mm, &mut t);
    every_offset::<i32>(&mm, &mut t);
}

#[test]
fn page_crossing_store_into_a_hole_writes_nothing() {
    let mm = mm_with(1);
    let mut t = mm.translator();
    t.store::<u64>(A + 4088, 0x55).unwrap();
    assert_eq!(
        kind(t.store::<u64>(A + 4092, !0)),
        Err(FaultError::NoMapping)
    );
    assert_eq!(t.load::<u64>(A + 4088).unwrap(), 0x55, "nothing written");
    assert_eq!(kind(t.load::<u64>(A + 4092)), Err(FaultError::NoMapping));
    // A read-only second page: also nothing written.
    mm.mmap(A + PAGE_SIZE, PAGE_SIZE, Prot::READ, fixed())
        .unwrap();
    assert_eq!(
        kind(t.store::<u32>(A + 4094, !0)),
        Err(FaultError::AccessDenied)
    );
    assert_eq!(t.load::<u64>(A + 4088).unwrap(), 0x55);
    assert_eq!(t.load::<u32>(A + 4094).unwrap(), 0);
}

#[test]
fn bulk_read_and_write_cross_pages() {
    let mm = mm_with(4);
    let mut t = mm.translator();
    let data: Vec<u8> = (0..3 * PAGE_SIZE as usize + 100)
        .map(|i| (i * 7 + 3) as u8)
        .collect();
    t.write(A + 50, &data).unwrap();
    let mut back = vec![0u8; data.len()];
    t.read(A + 50, &mut back).unwrap();
    assert_eq!(back, data);
    let mut via_mm = vec![0u8; data.len()];
    mm.read(A + 50, &mut via_mm).unwrap();
    assert_eq!(via_mm, data);
    // Zero-length accesses succeed anywhere.
    t.read(0, &mut []).unwrap();
    t.write(0, &[]).unwrap();
    // A read running off the end: earlier pages are in the buffer.
    let mut big = vec![0xffu8; 2 * PAGE_SIZE as usize];
    let e = t.read(A + 3 * PAGE_SIZE, &mut big).unwrap_err();
    assert_eq!(
        (e.addr, e.kind, e.done),
        (A + 4 * PAGE_SIZE, FaultError::NoMapping, 4096)
    );
    assert_eq!(&big[..150], &data[data.len() - 150..]);
    assert!(big[150..PAGE_SIZE as usize].iter().all(|&b| b == 0));
    // A write running off the end writes the pages before the hole.
    let e = t.write(A + 4 * PAGE_SIZE - 8, &[9u8; 16]).unwrap_err();
    assert_eq!(
        (e.addr, e.kind, e.done),
        (A + 4 * PAGE_SIZE, FaultError::NoMapping, 8)
    );
    assert_eq!(
        t.load::<u64>(A + 4 * PAGE_SIZE - 8).unwrap(),
        0x0909_0909_0909_0909
    );
}

#[test]
fn errors_are_fault_kinds() {
    let mm = AddressSpace::new(Config::default());
    mm.mmap(A, PAGE_SIZE, Prot::READ, fixed()).unwrap();
    mm.mmap(B, PAGE_SIZE, Prot::NONE, fixed()).unwrap();
    let mut t = mm.translator();
    assert_eq!(t.load::<u64>(A).unwrap(), 0, "the zero page");
    assert_eq!(kind(t.store::<u64>(A, 1)), Err(FaultError::AccessDenied));
    assert_eq!(kind(t.swap::<u64>(A, 1)), Err(FaultError::AccessDenied));
    assert_eq!(kind(t.load::<u8>(B)), Err(FaultError::AccessDenied));
    assert_eq!(
        kind(t.load::<u8>(B + PAGE_SIZE)),
        Err(FaultError::NoMapping)
    );
    assert_eq!(
        kind(t.load::<u64>(u64::MAX - 3)),
        Err(FaultError::NoMapping)
    );
    assert_eq!(
        kind(t.read(u64::MAX - 3, &mut [0; 8])),
        Err(FaultError::NoMapping)
    );
    assert_eq!(kind(t.load::<u8>(1 << 62)), Err(FaultError::NoMapping));
}

#[test]
fn atomics_of_every_width() {
    let mm = mm_with(1);
    let mut t = mm.translator();
    t.store::<u64>(A, 0x10).unwrap();
    assert_eq!(t.compare_exchange::<u64>(A, 0x10, 0x20).unwrap(), Ok(0x10));
    assert_eq!(t.compare_exchange::<u64>(A, 0x10, 0x30).unwrap(), Err(0x20));
    assert_eq!(t.fetch_add::<u64>(A, u64::MAX).unwrap(), 0x20);
    assert_eq!(t.swap::<u64>(A, 5).unwrap(), 0x1f);
    // Narrow widths leave their neighbours alone and wrap in their width.
    t.store::<u64>(A + 8, 0x8877_6655_4433_22ff).unwrap();
    assert_eq!(t.fetch_add::<u8>(A + 8, 1).unwrap(), 0xff);
    assert_eq!(t.load::<u64>(A + 8).unwrap(), 0x8877_6655_4433_2200);
    assert_eq!(t.swap::<u16>(A + 10, 0xaaaa).unwrap(), 0x4433);
    assert_eq!(
        t.compare_exchange::<u32>(A + 12, 0x8877_6655, 1).unwrap(),
        Ok(0x8877_6655)
    );
    assert_eq!(t.load::<u64>(A + 8).unwrap(), 0x0000_0001_aaaa_2200);
    assert_eq!(t.fetch_add::<i32>(A + 12, -2).unwrap(), 1);
    assert_eq!(t.load::<i32>(A + 12).unwrap(), -1);
    // An atomic on a never-written page faults it in for write.
    assert_eq!(t.fetch_add::<u32>(A + 2048, 3).unwrap(), 0);
    assert_eq!(t.load::<u32>(A + 2048).unwrap(), 3);
}

#[test]
fn fetch_add_from_two_threads_is_exact() {
    const N: u64 = 200_000;
    let mm = mm_with(1);
    let start = Barrier::new(2);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                let mut t = mm.translator();
                start.wait();
                for _ in 0..N {
                    t.fetch_add::<u64>(A, 1).unwrap();
                    t.fetch_add::<u16>(A + 8, 1).unwrap();
                    t.fetch_add::<u32>(A + 12, 1).unwrap();
                }
            });
        }
    });
    let mut t = mm.translator();
    assert_eq!(t.load::<u64>(A).unwrap(), 2 * N);
    assert_eq!(t.load::<u16>(A + 8).unwrap(), (2 * N) as u16);
    assert_eq!(t.load::<u16>(A + 10).unwrap(), 0, "neighbour untouched");
    assert_eq!(t.load::<u32>(A + 12).unwrap(), 2 * N as u32);
}

/// A lock built on compare_exchange and swap protects a non-atomic
/// read-modify-write done with plain loads and stores.
#[test]
fn compare_exchange_lock_between_threads() {
    const N: u64 = 20_000;
    let mm = mm_with(1);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                let mut t = mm.translator();
                for _ in 0..N {
                    while t.compare_exchange::<u32>(A, 0, 1).unwrap().is_err() {
                        std::hint::spin_loop();
                    }
                    let v = t.load::<u64>(A + 8).unwrap();
                    t.store::<u64>(A + 8, v + 1).unwrap();
                    assert_eq!(t.swap::<u32>(A, 0).unwrap(), 1);
                }
            });
        }
    });
    assert_eq!(mm.translator().load::<u64>(A + 8).unwrap(), 2 * N);
}

#[test]
fn zero_page_reads_see_a_later_write_from_another_thread() {
    let mm = mm_with(1);
    let mut t = mm.translator();
    assert_eq!(t.load::<u64>(A).unwrap(), 0);
    std::thread::scope(|s| {
        s.spawn(|| mm.translator().store::<u64>(A, 42).unwrap());
    });
    assert_eq!(t.load::<u64>(A).unwrap(), 42);
}

#[test]
fn copy_on_write_after_fork() {
    let mm = mm_with(1);
    let mut t = mm.translator();
    t.store::<u64>(A, 1).unwrap(); // a writable entry is cached
    let child = mm.fork().unwrap();
    let copies = mm.stats().cow_copies;
    t.store::<u64>(A, 2).unwrap(); // faults (write-protected) and copies
    assert_eq!(mm.stats().cow_copies, copies + 1);
    assert_eq!(t.load::<u64>(A).unwrap(), 2);
    let mut ct = child.translator();
    assert_eq!(
        ct.load::<u64>(A).unwrap(),
        1,
        "the child keeps the old frame"
    );
    ct.store::<u64>(A, 3).unwrap();
    assert_eq!(t.load::<u64>(A).unwrap(), 2);
    assert_eq!(ct.load::<u64>(A).unwrap(), 3);
    drop(ct);
    drop(child);
}

#[test]
fn every_flush_invalidates_the_translator() {
    let mm = mm_with(4);
    let mut t = mm.translator();
    for p in 0..4 {
        t.store::<u64>(A + p * PAGE_SIZE, p + 1).unwrap();
    }
    // mprotect(PROT_READ): loads still hit, stores fault.
    mm.mprotect(A, PAGE_SIZE, Prot::READ).unwrap();
    assert_eq!(kind(t.store::<u64>(A, 9)), Err(FaultError::AccessDenied));
    assert_eq!(
        kind(t.fetch_add::<u64>(A, 1)),
        Err(FaultError::AccessDenied)
    );
    assert_eq!(t.load::<u64>(A).unwrap(), 1);
    mm.mprotect(A, PAGE_SIZE, Prot::NONE).unwrap();
    assert_eq!(kind(t.load::<u64>(A)), Err(FaultError::AccessDenied));
    mm.mprotect(A, PAGE_SIZE, RW).unwrap();
    t.store::<u64>(A, 10).unwrap();
    // madvise(DONTNEED): the page reads as zero again.
    mm.madvise(A + PAGE_SIZE, PAGE_SIZE, Advice::DontNeed)
        .unwrap();
    assert_eq!(t.load::<u64>(A + PAGE_SIZE).unwrap(), 0);
    // mremap: the old address is gone, the new one has the data.
    let to = mm
        .mremap(
            A + 2 * PAGE_SIZE,
            PAGE_SIZE,
            PAGE_SIZE,
            MremapFlags::MAYMOVE | MremapFlags::FIXED,
            B,
        )
        .unwrap();
    assert_eq!(to, B);
    assert_eq!(
        kind(t.load::<u64>(A + 2 * PAGE_SIZE)),
        Err(FaultError::NoMapping)
    );
    assert_eq!(t.load::<u64>(B).unwrap(), 3);
    // munmap, then a new mapping at the same address: zeros, not the old
    // frame.
    mm.munmap(A + 3 * PAGE_SIZE, PAGE_SIZE).unwrap();
    assert_eq!(
        kind(t.load::<u64>(A + 3 * PAGE_SIZE)),
        Err(FaultError::NoMapping)
    );
    mm.mmap(A + 3 * PAGE_SIZE, PAGE_SIZE, RW, fixed()).unwrap();
    assert_eq!(t.load::<u64>(A + 3 * PAGE_SIZE).unwrap(), 0);
    assert_eq!(t.load::<u64>(A).unwrap(), 10);
}

/// A thread of `s` with a translator of `mm` that stores each `(addr,
/// value)` of `first`, then, for each address received, stores 7 there
/// and sends the result. Returns once the first stores are done.
fn storer<'s>(
    s: &'s std::thread::Scope<'s, '_>,
    mm: &'s AddressSpace,
    first: &'static [(u64, u64)],
) -> (mpsc::Sender<u64>, mpsc::Receiver<Result<u64, MemoryFault>>) {
    let (cmd_tx, cmd_rx) = mpsc::channel::<u64>();
    let (res_tx, res_rx) = mpsc::channel();
    s.spawn(move || {
        let mut t = mm.translator();
        for &(addr, v) in first {
            t.store::<u64>(addr, v).unwrap();
        }
        res_tx.send(Ok(0)).unwrap();
        while let Ok(addr) = cmd_rx.recv() {
            res_tx.send(t.store::<u64>(addr, 7).map(|_| 0)).unwrap();
        }
    });
    res_rx.recv().unwrap().unwrap();
    (cmd_tx, res_rx)
}

/// A translator on another thread caches writable entries; after each
/// flush returns, its next access fails (or sees the new mapping), and
/// the flush counted a shootdown to it.
#[test]
fn flushes_reach_translators_on_other_threads() {
    let mm = mm_with(2);
    std::thread::scope(|s| {
        let (cmd_tx, res_rx) = storer(s, &mm, &[(A, 1), (A + PAGE_SIZE, 2)]);
        let mm = &mm;
        let before = mm.stats().translator_shootdowns;
        mm.mprotect(A, PAGE_SIZE, Prot::READ).unwrap();
        assert_eq!(mm.stats().translator_shootdowns, before + 1);
        cmd_tx.send(A).unwrap();
        assert_eq!(kind(res_rx.recv().unwrap()), Err(FaultError::AccessDenied));
        let mut x = [0u8; 8];
        mm.read(A, &mut x).unwrap();
        assert_eq!(u64::from_le_bytes(x), 1);
        mm.munmap(A + PAGE_SIZE, PAGE_SIZE).unwrap();
        cmd_tx.send(A + PAGE_SIZE).unwrap();
        assert_eq!(kind(res_rx.recv().unwrap()), Err(FaultError::NoMapping));
        drop(cmd_tx);
    });
}

/// A flush reaches only the translators that may cache what it changed:
/// a translator on another thread that cached a page of `A`'s 1 GiB
/// region is left alone by an mprotect 1 GiB up (no shootdown counted,
/// and its entry stays: its next store does not walk), and reached by an
/// mprotect of its own page.
#[test]
fn flushes_reach_only_translators_of_the_flushed_regions() {
    let mm = mm_with(1);
    let far = A + (1 << 30);
    mm.mmap(far, PAGE_SIZE, RW, fixed()).unwrap();
    mm.write(far, &[1]).unwrap();
    std::thread::scope(|s| {
        let (cmd_tx, res_rx) = storer(s, &mm, &[(A, 1)]);
        let mm = &mm;
        let before = mm.stats();
        mm.mprotect(far, PAGE_SIZE, Prot::READ).unwrap();
        let after = mm.stats();
        assert_eq!(after.tlb_flushes, before.tlb_flushes + 1);
        assert_eq!(after.translator_shootdowns, before.translator_shootdowns);
        cmd_tx.send(A).unwrap();
        res_rx.recv().unwrap().unwrap();
        assert_eq!(
            mm.stats().translator_walks,
            before.translator_walks,
            "a flush of another region emptied the translator"
        );
        mm.mprotect(A, PAGE_SIZE, Prot::READ).unwrap();
        assert_eq!(
            mm.stats().translator_shootdowns,
            before.translator_shootdowns + 1
        );
        cmd_tx.send(A).unwrap();
        assert_eq!(kind(res_rx.recv().unwrap()), Err(FaultError::AccessDenied));
        drop(cmd_tx);
    });
}

/// A translator whose thread is blocked forever (here: until the flush
/// is done) does not hold up a flush.
#[test]
fn an_idle_translator_does_not_block_a_flush() {
    let mm = mm_with(1);
    let (ready_tx, ready_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        let mm = &mm;
        s.spawn(move || {
            let mut t = mm.translator();
            t.store::<u64>(A, 1).unwrap();
            ready_tx.send(()).unwrap();
            go_rx.recv().unwrap();
            assert_eq!(kind(t.load::<u64>(A)), Err(FaultError::NoMapping));
        });
        ready_rx.recv().unwrap();
        mm.munmap(A, PAGE_SIZE).unwrap(); // returns although t never runs
        assert_eq!(mm.frames_used(), 0);
        go_tx.send(()).unwrap();
    });
}

/// The address space translators borrow is shared by many; dropping a
/// translator unregisters it.
#[test]
fn many_translators_come_and_go() {
    let mm = Arc::new(mm_with(1));
    for i in 0..100u64 {
        let mut t = mm.translator();
        t.store::<u64>(A, i).unwrap();
        drop(t);
        mm.mprotect(A, PAGE_SIZE, RW).unwrap();
    }
    assert_eq!(mm.translator().load::<u64>(A).unwrap(), 99);
}

/// A flush on the translator's home thread (which needs no fence and no
/// wait for it) still drops its entries, and so does one on its maker's
/// thread after the translator moved to another (here ordered by
/// channels; the race of the move's first access with that flush is the
/// loom model `translator_moved_vs_own_flush`).
#[test]
fn flushes_on_the_home_thread_and_after_a_move() {
    let mm = Arc::new(mm_with(2));
    let mut t = aspace::Translator::new_owned(mm.clone());
    t.store::<u64>(A, 7).unwrap();
    // Own thread: the zap is seen in program order.
    mm.madvise(A, PAGE_SIZE, Advice::DontNeed).unwrap();
    assert_eq!(t.load::<u64>(A).unwrap(), 0);
    t.store::<u64>(A, 8).unwrap();
    let (to_main, from_thread) = mpsc::channel();
    let (to_thread, from_main) = mpsc::channel::<()>();
    let h = std::thread::spawn(move || {
        t.store::<u64>(A, 9).unwrap(); // rehomes, hits
        to_main.send(()).unwrap();
        from_main.recv().unwrap();
        kind(t.store::<u64>(A, 10))
    });
    from_thread.recv().unwrap();
    // The maker's thread, no longer the translator's home.
    mm.mprotect(A, PAGE_SIZE, Prot::READ).unwrap();
    to_thread.send(()).unwrap();
    assert_eq!(h.join().unwrap(), Err(FaultError::AccessDenied));
    let mut b = [0u8; 8];
    mm.read(A, &mut b).unwrap();
    assert_eq!(u64::from_le_bytes(b), 9);
}
