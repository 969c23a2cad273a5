//! No bytes leak through freed frames, whichever side clears them: spaces
//! on the process's shared physical memory, some clearing frames when
//! they free them (`Config::zero_freed`) and some leaving that to the
//! fault that takes them again, write patterns into every page, free them
//! (munmap, `MADV_DONTNEED`, dropping the space, copy-on-write breaks),
//! and check that every new anonymous page's first store finds the rest
//! of the page zero, all concurrently, so frames cross spaces, CPUs and
//! clearing policies. The same for huge pages: 2 MiB frames freed whole
//! (kept in the huge lists, cleared at the free or by the next fault)
//! must show none of their last user's bytes to a new huge page.

use aspace::{AddressSpace, Advice, Config, MapFlags, Prot, ThpMode, Translator, PAGE_SIZE};
use std::sync::Arc;

const PAGES: u64 = 96;
const ROUNDS: usize = 40;

fn anon() -> MapFlags {
    MapFlags::PRIVATE | MapFlags::ANONYMOUS
}

fn space(zero_freed: bool) -> Arc<AddressSpace> {
    Arc::new(AddressSpace::new(Config {
        zero_freed,
        memory_budget: 64 << 20,
        ..Config::default()
    }))
}

/// Stores a byte at the end of each page of `[a, a + PAGES pages)` (its
/// first touch, a write fault), checks that the rest of the page reads
/// zero, then fills the whole page with `pattern`.
fn touch_check_fill(tlb: &mut Translator<'_>, a: u64, pattern: u8, what: &str) {
    let mut page = vec![0u8; PAGE_SIZE as usize];
    for pg in 0..PAGES {
        first_store_check_fill(tlb, a + pg * PAGE_SIZE, &mut page, pattern, what);
    }
}

/// Stores `pattern` into the last byte of the new page of `buf.len()`
/// bytes at `p` (its first touch: a write fault), checks that the rest
/// reads zero, then fills it with `pattern`.
fn first_store_check_fill(
    tlb: &mut Translator<'_>,
    p: u64,
    buf: &mut [u8],
    pattern: u8,
    what: &str,
) {
    let last = buf.len() - 1;
    tlb.store::<u8>(p + last as u64, pattern)
        .expect("first store");
    tlb.read(p, buf).expect("read the new page");
    if let Some(i) = buf[..last].iter().position(|&b| b != 0) {
        panic!(
            "{what}: the new page at {p:#x} has byte {:#x} at {i}",
            buf[i]
        );
    }
    buf.fill(pattern);
    tlb.write(p, buf).expect("fill");
}

fn worker(t: usize) {
    let rw = Prot::READ | Prot::WRITE;
    let len = PAGES * PAGE_SIZE;
    let mut mm = space(t % 2 == 0);
    for round in 0..ROUNDS {
        let pattern = 0x80 | ((t * ROUNDS + round) % 127) as u8;
        let a = mm.mmap(0, len, rw, anon()).expect("mmap");
        {
            let mut tlb = mm.translator();
            touch_check_fill(&mut tlb, a, pattern, "fresh mapping");
            match round % 4 {
                0 => mm.munmap(a, len).expect("munmap"),
                1 => {
                    // The same range again after DONTNEED: new zero pages.
                    mm.madvise(a, len, Advice::DontNeed).expect("dontneed");
                    touch_check_fill(&mut tlb, a, !pattern, "after MADV_DONTNEED");
                    mm.munmap(a, len).expect("munmap");
                }
                2 => {
                    // A child writes every page: the copies take frames
                    // that will be overwritten whole, and the parent's
                    // frames are freed when it unmaps them.
                    let child = mm.fork().expect("fork");
                    let mut ctlb = child.translator();
                    for pg in 0..PAGES {
                        ctlb.store::<u8>(a + pg * PAGE_SIZE, !pattern)
                            .expect("copy-on-write");
                    }
                    drop(ctlb);
                    mm.munmap(a, len).expect("munmap");
                    drop(child);
                }
                _ => {}
            }
        }
        if round % 4 == 3 {
            // Every frame of the space goes back at once.
            mm = space(t % 2 == 0);
        }
    }
}

#[test]
fn new_anonymous_pages_read_zero_whoever_used_their_frames() {
    let threads: Vec<_> = (0..4)
        .map(|t| std::thread::spawn(move || worker(t)))
        .collect();
    for h in threads {
        h.join().expect("worker");
    }
}

const HUGE: u64 = 2 << 20;

/// A 2 MiB-aligned `MADV_HUGEPAGE` region of `n` huge pages in `mm`.
fn huge_region(mm: &AddressSpace, n: u64) -> u64 {
    let m = mm
        .mmap(0, (n + 1) * HUGE, Prot::READ | Prot::WRITE, anon())
        .expect("mmap");
    let a = m.next_multiple_of(HUGE);
    mm.madvise(a, n * HUGE, Advice::HugePage)
        .expect("MADV_HUGEPAGE");
    a
}

fn huge_worker(t: usize) {
    const N: u64 = 3;
    let mut page = vec![0u8; HUGE as usize];
    for round in 0..12 {
        // Policies alternate per round and thread, so a huge frame freed
        // by one is taken by the other too (one shared physical memory).
        let mm = AddressSpace::new(Config {
            zero_freed: (t + round) % 2 == 0,
            thp: ThpMode::Madvise,
            memory_budget: 64 << 20,
            ..Config::default()
        });
        let pattern = 0x80 | ((t * 12 + round) % 127) as u8;
        for _ in 0..2 {
            let a = huge_region(&mm, N);
            let before = mm.stats().thp_fault_alloc;
            {
                let mut tlb = mm.translator();
                for h in 0..N {
                    // The first store maps the huge page; the rest of its
                    // 2 MiB must read zero.
                    let what = format!("thread {t} round {round}, huge page {h}");
                    first_store_check_fill(&mut tlb, a + h * HUGE, &mut page, pattern, &what);
                }
            }
            assert_eq!(
                mm.stats().thp_fault_alloc - before,
                N,
                "every first store mapped a huge page"
            );
            // Freed whole: back to the huge lists.
            mm.munmap(a, N * HUGE).expect("munmap");
        }
    }
}

#[test]
fn new_huge_pages_read_zero_whoever_used_their_frames() {
    let threads: Vec<_> = (0..2)
        .map(|t| std::thread::spawn(move || huge_worker(t)))
        .collect();
    for h in threads {
        h.join().expect("huge worker");
    }
}
