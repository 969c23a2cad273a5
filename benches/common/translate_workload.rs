//! The soft-TLB workload shared by `benches/translate.rs` and
//! `examples/translate.rs`: 8-byte loads over a hot working set of 64
//! pages, each load on the next page (stride 4104 bytes), through a
//! translator, through `mm.read`, and as a plain loop over a `&[u64]` of
//! the same size (the physical limit); and the cost of a flush with busy
//! translators on two threads against one with none.
#![allow(dead_code)]

use aspace::{AddressSpace, Config, MapFlags, Prot, Translator, PAGE_SIZE};
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;
use std::time::Instant;

/// Pages in the working set.
pub const PAGES: u64 = 64;
/// 8-byte words in the working set.
pub const WORDS: u64 = PAGES * PAGE_SIZE / 8;
/// Where the working set is mapped.
pub const BASE: u64 = 0x10_0000_0000;

/// Word `i` of the access pattern: 513 words on, so each load lands on
/// the next page, at the next word.
#[inline(always)]
pub fn word(i: u64) -> u64 {
    (i * 513) & (WORDS - 1)
}

/// An address space with the working set mapped and written.
pub fn setup() -> AddressSpace {
    let mm = AddressSpace::new(Config::default());
    mm.mmap(
        BASE,
        PAGES * PAGE_SIZE,
        Prot::READ | Prot::WRITE,
        MapFlags::PRIVATE | MapFlags::ANONYMOUS | MapFlags::FIXED,
    )
    .unwrap();
    let bytes: Vec<u8> = (0..WORDS).flat_map(|w| w.to_le_bytes()).collect();
    mm.write(BASE, &bytes).unwrap();
    mm
}

/// The same working set as a plain slice.
pub fn slice() -> Vec<u64> {
    (0..WORDS).collect()
}

/// `n` loads from the slice.
#[inline(never)]
pub fn plain(s: &[u64], n: u64) -> u64 {
    let mut sum = 0u64;
    for i in 0..n {
        sum = sum.wrapping_add(s[word(i) as usize]);
    }
    black_box(sum)
}

/// `n` loads through a translator.
#[inline(never)]
pub fn translated(t: &mut Translator<'_>, n: u64) -> u64 {
    let mut sum = 0u64;
    for i in 0..n {
        sum = sum.wrapping_add(t.load::<u64>(BASE + word(i) * 8).unwrap());
    }
    black_box(sum)
}

/// `n` 8-byte `mm.read`s.
#[inline(never)]
pub fn mm_read(mm: &AddressSpace, n: u64) -> u64 {
    let mut sum = 0u64;
    let mut b = [0u8; 8];
    for i in 0..n {
        mm.read(BASE + word(i) * 8, &mut b).unwrap();
        sum = sum.wrapping_add(u64::from_le_bytes(b));
    }
    black_box(sum)
}

/// Seconds for `threads` threads to do `n` translated loads each, all
/// started together (wall time of the slowest).
pub fn translated_threads(mm: &AddressSpace, threads: usize, n: u64) -> f64 {
    let go = Barrier::new(threads + 1);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                let go = &go;
                s.spawn(move || {
                    let mut t = mm.translator();
                    translated(&mut t, WORDS); // warm the entries
                    go.wait();
                    translated(&mut t, n);
                    Instant::now()
                })
            })
            .collect();
        go.wait();
        let start = Instant::now();
        let end = hs.into_iter().map(|h| h.join().unwrap()).max().unwrap();
        (end - start).as_secs_f64()
    })
}

/// Nanoseconds per flush (an mprotect of one working-set page to
/// read-only and back, divided by the flushes counted), with `busy`
/// threads loading through translators meanwhile (0: no translators).
pub fn flush_ns(mm: &AddressSpace, busy: usize, pairs: u64) -> f64 {
    let stop = AtomicBool::new(false);
    let ready = Barrier::new(busy + 1);
    std::thread::scope(|s| {
        for _ in 0..busy {
            let (stop, ready) = (&stop, &ready);
            s.spawn(move || {
                let mut t = mm.translator();
                translated(&mut t, WORDS);
                ready.wait();
                while !stop.load(Ordering::Relaxed) {
                    translated(&mut t, 4096);
                }
            });
        }
        ready.wait();
        let page = BASE + (PAGES - 1) * PAGE_SIZE;
        let before = mm.stats().tlb_flushes;
        let start = Instant::now();
        for _ in 0..pairs {
            mm.mprotect(page, PAGE_SIZE, Prot::READ).unwrap();
            mm.mprotect(page, PAGE_SIZE, Prot::READ | Prot::WRITE).unwrap();
        }
        let el = start.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        let flushes = (mm.stats().tlb_flushes - before).max(1);
        el * 1e9 / flushes as f64
    })
}
