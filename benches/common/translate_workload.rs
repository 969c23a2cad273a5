//! The soft-TLB workload shared by `benches/translate.rs` and
//! `examples/translate.rs`: 8-byte loads over a hot working set of 64
//! pages, each load on the next page (stride 4104 bytes), through a
//! translator, through `mm.read`, and as a plain loop over a `&[u64]` of
//! the same size (the physical limit); loads and stores of every width
//! (at every aligned slot of a word), a store then a load of the same
//! place, and a load+store pair loop (per call, and inside translator
//! blocks) against the same loop over a plain `Vec`;
//! and the cost of a flush with busy translators on two threads against
//! one with none.
#![allow(dead_code)]

use aspace::{AddressSpace, Config, MapFlags, Prot, Scalar, Translator, PAGE_SIZE};
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

/// The `T`-aligned offsets inside a word as a mask (`8 - T::SIZE`: 7
/// for a byte, 0 for a `u64`), hidden from the compiler so that every
/// width's loop does the same address arithmetic and no width's access
/// is known to sit at the start of its word.
#[inline(always)]
pub fn lanes<T: Scalar>() -> u64 {
    black_box(8 - T::SIZE as u64)
}

/// Address of access `i` of a `T` with `lanes` from [`lanes`]: on the
/// next page and word each time (as [`word`]), at the next `T`-aligned
/// slot of its word (`i & lanes`), so that narrow accesses land at every
/// byte a guest's may.
#[inline(always)]
pub fn slot(i: u64, lanes: u64) -> u64 {
    BASE + word(i) * 8 + (i & lanes)
}

/// `n` aligned loads of a `T` through a translator (each on the next
/// page, as [`translated`], at every aligned slot of a word in turn).
#[inline(never)]
pub fn loads_of<T: Scalar>(t: &mut Translator<'_>, n: u64) -> u64 {
    let lanes = lanes::<T>();
    let mut sum = 0u64;
    for i in 0..n {
        sum = sum.wrapping_add(t.load::<T>(slot(i, lanes)).unwrap().to_bits());
    }
    black_box(sum)
}

/// `n` aligned stores of a `T` through a translator (addresses as
/// [`loads_of`]).
#[inline(never)]
pub fn stores_of<T: Scalar>(t: &mut Translator<'_>, n: u64) {
    let lanes = lanes::<T>();
    for i in 0..n {
        t.store::<T>(slot(i, lanes), T::from_bits(i)).unwrap();
    }
}

/// `n` stores of a `T`, each followed by a load of the same `T` (the
/// load reads what the store just wrote: a guest's push and pop, or a
/// spilled register), addresses as [`loads_of`].
#[inline(never)]
pub fn store_loads_of<T: Scalar>(t: &mut Translator<'_>, n: u64) -> u64 {
    let lanes = lanes::<T>();
    let mut sum = 0u64;
    for i in 0..n {
        let a = slot(i, lanes);
        t.store::<T>(a, T::from_bits(i)).unwrap();
        sum = sum.wrapping_add(t.load::<T>(a).unwrap().to_bits());
    }
    black_box(sum)
}

/// `n` stores to the slice (the baseline of [`stores_of`]).
#[inline(never)]
pub fn plain_stores(s: &mut [u64], n: u64) {
    for i in 0..n {
        s[word(i) as usize] = i;
    }
    black_box(s);
}

/// `n` load+store pairs (an increment of a `u32` guest word, each on the
/// next page) through a translator.
#[inline(never)]
pub fn pairs(t: &mut Translator<'_>, n: u64) {
    for i in 0..n {
        let a = BASE + word(i) * 8;
        let v = t.load::<u32>(a).unwrap();
        t.store::<u32>(a, v.wrapping_add(1)).unwrap();
    }
}

/// Pairs per block in [`block_pairs`]: a guest basic block's worth of
/// memory accesses (32 accesses here).
pub const BLOCK_PAIRS: u64 = 16;

/// The pairs of [`pairs`] inside translator blocks
/// ([`Translator::block`]), one block per [`BLOCK_PAIRS`] pairs, as an
/// emulator opens one per translated guest block.
#[inline(never)]
pub fn block_pairs(t: &mut Translator<'_>, n: u64) {
    let mut i = 0;
    while i < n {
        let end = (i + BLOCK_PAIRS).min(n);
        let mut b = t.block();
        for j in i..end {
            let a = BASE + word(j) * 8;
            let v = b.load::<u32>(a).unwrap();
            b.store::<u32>(a, v.wrapping_add(1)).unwrap();
        }
        i = end;
    }
}

/// The same pairs over a plain `Vec<u32>` of the working set's size.
#[inline(never)]
pub fn plain_pairs(s: &mut [u32], n: u64) {
    for i in 0..n {
        let a = word(i) as usize * 2;
        s[a] = s[a].wrapping_add(1);
    }
    black_box(s);
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
/// started together: from the first start to the last end.
pub fn translated_threads(mm: &AddressSpace, threads: usize, n: u64) -> f64 {
    let go = Barrier::new(threads);
    std::thread::scope(|s| {
        let spans: Vec<(Instant, Instant)> = (0..threads)
            .map(|_| {
                let go = &go;
                s.spawn(move || {
                    let mut t = mm.translator();
                    translated(&mut t, WORDS); // warm the entries
                    go.wait();
                    let start = Instant::now();
                    translated(&mut t, n);
                    (start, Instant::now())
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect();
        let start = spans.iter().map(|s| s.0).min().unwrap();
        let end = spans.iter().map(|s| s.1).max().unwrap();
        (end - start).as_secs_f64()
    })
}

/// Who holds translators while [`flush_ns`] flushes.
#[derive(Clone, Copy, Debug)]
pub struct Translators {
    /// Other threads loading through a translator all the time.
    pub busy: usize,
    /// Other threads that hold a warm translator and sleep.
    pub idle: usize,
    /// Whether the flushing thread holds one too (warm, between accesses).
    pub own: bool,
}

/// Nanoseconds per flush (an mprotect of one working-set page to
/// read-only and back, divided by the flushes counted) while `tr` hold
/// translators.
pub fn flush_ns(mm: &AddressSpace, tr: Translators, pairs: u64) -> f64 {
    let stop = AtomicBool::new(false);
    let ready = Barrier::new(tr.busy + tr.idle + 1);
    let done = Barrier::new(tr.idle + 1);
    std::thread::scope(|s| {
        for i in 0..tr.busy + tr.idle {
            let (stop, ready, done) = (&stop, &ready, &done);
            s.spawn(move || {
                let mut t = mm.translator();
                translated(&mut t, WORDS);
                ready.wait();
                if i < tr.busy {
                    while !stop.load(Ordering::Relaxed) {
                        translated(&mut t, 4096);
                    }
                } else {
                    done.wait();
                }
            });
        }
        let mut own = tr.own.then(|| mm.translator());
        if let Some(t) = own.as_mut() {
            translated(t, WORDS);
        }
        ready.wait();
        let page = BASE + (PAGES - 1) * PAGE_SIZE;
        let before = mm.stats().tlb_flushes;
        let start = Instant::now();
        for _ in 0..pairs {
            mm.mprotect(page, PAGE_SIZE, Prot::READ).unwrap();
            mm.mprotect(page, PAGE_SIZE, Prot::READ | Prot::WRITE)
                .unwrap();
        }
        let el = start.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        done.wait();
        let flushes = (mm.stats().tlb_flushes - before).max(1);
        el * 1e9 / flushes as f64
    })
}
