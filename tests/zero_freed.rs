//! No bytes leak through freed frames, whichever side clears them: spaces
//! on the process's shared physical memory, some clearing frames when
//! they free them (`Config::zero_freed`) and some leaving that to the
//! fault that takes them again, write patterns into every page, free them
//! (munmap, `MADV_DONTNEED`, dropping the space, copy-on-write breaks),
//! and check that every new anonymous page's first store finds the rest
//! of the page zero, all concurrently, so frames cross spaces, CPUs and
//! clearing policies.

use aspace::{AddressSpace, Advice, Config, MapFlags, Prot, Translator, PAGE_SIZE};
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
        let p = a + pg * PAGE_SIZE;
        tlb.store::<u8>(p + PAGE_SIZE - 1, pattern)
            .expect("first store");
        tlb.read(p, &mut page).expect("read the new page");
        if let Some(i) = page[..PAGE_SIZE as usize - 1].iter().position(|&b| b != 0) {
            panic!(
                "{what}: page {pg} of a new anonymous mapping has byte {:#x} at {i}",
                page[i]
            );
        }
        page.fill(pattern);
        tlb.write(p, &page).expect("fill");
    }
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
