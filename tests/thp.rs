//! Transparent huge pages through the public API: which faults map 2 MiB
//! pages (mode, advice, `PR_SET_THP_DISABLE`), the fallback when no huge
//! frame is free, and that every byte survives the splits of munmap,
//! mprotect, madvise, mremap and fork's copy-on-write, with the kernel's
//! statistics counted.

use aspace::{
    AddressSpace, Advice, Config, FrameAllocator, MapFlags, MremapFlags, Prot, ThpMode, PAGE_SIZE,
};
use std::sync::Arc;

const HUGE: u64 = 2 << 20;
const BASE: u64 = 0x4000_0000;
const RW: Prot = Prot::READ.union(Prot::WRITE);

fn anon() -> MapFlags {
    MapFlags::PRIVATE | MapFlags::ANONYMOUS | MapFlags::FIXED
}

fn space(mode: ThpMode) -> AddressSpace {
    AddressSpace::new(Config {
        thp: mode,
        ..Config::default()
    })
}

/// `len` bytes at BASE, advised MADV_HUGEPAGE.
fn huge_region(mm: &AddressSpace, len: u64) -> u64 {
    huge_region_at(mm, BASE, len)
}

/// `len` bytes at `at`, advised MADV_HUGEPAGE.
fn huge_region_at(mm: &AddressSpace, at: u64, len: u64) -> u64 {
    let a = mm.mmap(at, len, RW, anon()).unwrap();
    mm.madvise(a, len, Advice::HugePage).unwrap();
    a
}

/// A byte pattern that differs in every page.
fn byte_at(addr: u64) -> u8 {
    ((addr >> 12) as u8) ^ 0x5a
}

/// Writes one distinct byte into every page of `[a, a + len)` (the first
/// fault of each 2 MiB span maps it huge).
fn fill(mm: &AddressSpace, a: u64, len: u64) {
    for p in (a..a + len).step_by(PAGE_SIZE as usize) {
        mm.write(p + 8, &[byte_at(p)]).unwrap();
    }
}

/// Checks the bytes [`fill`] wrote into `[a, a + len)`, as they were
/// written at `from` (a move's old address).
fn check_moved(mm: &AddressSpace, a: u64, len: u64, from: u64) {
    for off in (0..len).step_by(PAGE_SIZE as usize) {
        let mut b = [0u8; 2];
        mm.read(a + off + 7, &mut b).unwrap();
        assert_eq!(b, [0, byte_at(from + off)], "page {:#x}", a + off);
    }
}

fn check(mm: &AddressSpace, a: u64, len: u64) {
    check_moved(mm, a, len, a)
}

#[test]
fn a_write_fault_maps_2_mib_with_one_frame_of_512() {
    let mm = space(ThpMode::Madvise);
    let a = huge_region(&mm, 2 * HUGE);
    mm.write(a + 12345, b"hello").unwrap();
    let st = mm.stats();
    assert_eq!(st.thp_fault_alloc, 1);
    assert_eq!(st.thp_fault_fallback, 0);
    assert_eq!(mm.frames_used(), 512);
    assert_eq!(mm.anon_huge_pages(a), Some(HUGE));
    // The rest of the span reads zero without another fault.
    let faults = mm.stats().faults();
    let mut b = [1u8; 8];
    mm.read(a + HUGE - 8, &mut b).unwrap();
    assert_eq!(b, [0; 8]);
    assert_eq!(mm.stats().faults(), faults);
    // pagemap shows 512 consecutive frames, exclusive.
    let pm = mm.pagemap(a, HUGE).unwrap();
    let first = pm[0].pfn().unwrap().get();
    assert_eq!(first % 512, 0);
    for (i, e) in pm.iter().enumerate() {
        assert!(e.is_present() && e.is_exclusive());
        assert_eq!(e.pfn().unwrap().get(), first + i as u32);
    }
    // Whole munmap frees the huge frame.
    mm.munmap(a, 2 * HUGE).unwrap();
    assert_eq!(mm.frames_used(), 0);
    assert_eq!(mm.stats().thp_split_pmd, 0);
}

#[test]
fn a_huge_fault_into_a_reused_huge_frame_reads_zero() {
    // pft --thp's "used" frames: a huge page filled, unmapped whole (to
    // the huge list), then taken again by the next huge fault, which must
    // clear all of its 2 MiB.
    let pool = Arc::new(FrameAllocator::new(3 << 20, true));
    let mm = AddressSpace::with_pool(Config::default(), pool);
    let a = huge_region(&mm, HUGE);
    mm.write(a, &vec![0xa5; HUGE as usize]).unwrap();
    let old = mm.pagemap(a, PAGE_SIZE).unwrap()[0].pfn().unwrap();
    mm.munmap(a, HUGE).unwrap();
    let b = huge_region(&mm, HUGE);
    mm.write(b + 100, b"x").unwrap();
    // 3 MiB of memory hold one huge frame: the same one.
    assert_eq!(mm.pagemap(b, PAGE_SIZE).unwrap()[0].pfn(), Some(old));
    assert_eq!(mm.stats().thp_fault_alloc, 2);
    let mut got = vec![1u8; HUGE as usize];
    mm.read(b, &mut got).unwrap();
    got[100] = 0;
    assert!(
        got.iter().all(|&x| x == 0),
        "a reused huge frame kept bytes"
    );
}

#[test]
fn the_mode_the_advice_and_prctl_decide() {
    // never, and madvise without the advice: 4 KiB pages.
    for (mode, advise) in [(ThpMode::Never, true), (ThpMode::Madvise, false)] {
        let mm = space(mode);
        let a = mm.mmap(BASE, HUGE, RW, anon()).unwrap();
        if advise {
            mm.madvise(a, HUGE, Advice::HugePage).unwrap();
        }
        mm.write(a, b"x").unwrap();
        assert_eq!(mm.frames_used(), 1, "{mode:?}");
        assert_eq!(mm.anon_huge_pages(a), Some(0));
        assert_eq!(mm.stats().thp_fault_alloc, 0);
    }
    // always: no advice needed, but MADV_NOHUGEPAGE refuses.
    let mm = space(ThpMode::Always);
    let a = mm.mmap(BASE, 2 * HUGE, RW, anon()).unwrap();
    mm.madvise(a + HUGE, HUGE, Advice::NoHugePage).unwrap();
    mm.write(a, b"x").unwrap();
    mm.write(a + HUGE, b"x").unwrap();
    assert_eq!(mm.anon_huge_pages(a), Some(HUGE));
    assert_eq!(mm.anon_huge_pages(a + HUGE), Some(0));
    assert!(mm
        .vma_at(a + HUGE)
        .unwrap()
        .smaps_vmflags()
        .contains(" nh "));
    // PR_SET_THP_DISABLE: none from now on, inherited by fork.
    let mm = space(ThpMode::Always);
    mm.set_thp_disable(true);
    assert!(mm.thp_disable());
    assert!(mm.fork().unwrap().thp_disable());
    let a = mm.mmap(BASE, HUGE, RW, anon()).unwrap();
    mm.write(a, b"x").unwrap();
    assert_eq!(mm.anon_huge_pages(a), Some(0));
    mm.set_thp_disable(false);
    mm.munmap(a, HUGE).unwrap();
    let a = mm.mmap(BASE, HUGE, RW, anon()).unwrap();
    mm.write(a, b"x").unwrap();
    assert_eq!(mm.anon_huge_pages(a), Some(HUGE));
}

#[test]
fn a_span_not_wholly_inside_the_vma_gets_4k_pages() {
    let mm = space(ThpMode::Always);
    // 2 MiB starting 4 KiB past a boundary: no aligned span fits.
    let a = mm.mmap(BASE + PAGE_SIZE, HUGE, RW, anon()).unwrap();
    mm.write(a, b"x").unwrap();
    assert_eq!(mm.anon_huge_pages(a), Some(0));
    assert_eq!(mm.frames_used(), 1);
    // Shared memory is never huge here.
    let s = mm
        .mmap(
            BASE + 8 * HUGE,
            HUGE,
            RW,
            MapFlags::SHARED | MapFlags::ANONYMOUS | MapFlags::FIXED,
        )
        .unwrap();
    mm.write(s, b"x").unwrap();
    assert_eq!(mm.anon_huge_pages(s), Some(0));
}

#[test]
fn a_read_fault_maps_the_huge_zero_page_and_a_write_replaces_it() {
    let mm = space(ThpMode::Madvise);
    let a = huge_region(&mm, HUGE);
    let mut b = [7u8; 4];
    mm.read(a + 100, &mut b).unwrap();
    assert_eq!(b, [0; 4]);
    assert_eq!(mm.stats().thp_zero_page_mapped, 1);
    assert_eq!(mm.frames_used(), 0);
    // Not AnonHugePages: the zero page is nobody's.
    assert_eq!(mm.anon_huge_pages(a), Some(0));
    // A write gets a huge page of its own (Linux 6.14+).
    mm.write(a + PAGE_SIZE, b"w").unwrap();
    let st = mm.stats();
    assert_eq!((st.thp_fault_alloc, st.thp_split_pmd), (1, 0));
    assert_eq!(mm.frames_used(), 512);
    assert_eq!(mm.anon_huge_pages(a), Some(HUGE));
    mm.read(a + PAGE_SIZE, &mut b[..1]).unwrap();
    assert_eq!(&b[..1], b"w");
    mm.read(a + 2 * PAGE_SIZE, &mut b).unwrap();
    assert_eq!(b, [0; 4]);
}

#[test]
fn a_write_to_the_huge_zero_page_with_no_huge_frame_splits_it() {
    // 1 MiB of memory: no huge frame at all.
    let pool = Arc::new(FrameAllocator::new(1 << 20, true));
    let mm = AddressSpace::with_pool(Config::default(), pool);
    let a = huge_region(&mm, HUGE);
    mm.read(a, &mut [0]).unwrap();
    mm.write(a + PAGE_SIZE, b"w").unwrap();
    let st = mm.stats();
    assert_eq!((st.thp_fault_fallback, st.thp_split_pmd), (1, 1));
    assert_eq!(mm.frames_used(), 1);
    let mut b = [0u8; 2];
    mm.read(a + PAGE_SIZE, &mut b).unwrap();
    assert_eq!(&b, b"w\0");
}

#[test]
fn an_exclusive_read_only_huge_page_is_reused_whole() {
    let mm = space(ThpMode::Madvise);
    let a = huge_region(&mm, HUGE);
    fill(&mm, a, HUGE);
    drop(mm.fork().unwrap());
    // Write-protected by the fork, shared no more.
    mm.write(a + 8, &[byte_at(a)]).unwrap();
    let st = mm.stats();
    assert_eq!((st.thp_split_pmd, st.cow_reuses), (0, 1));
    assert_eq!(mm.anon_huge_pages(a), Some(HUGE));
    check(&mm, a, HUGE);
}

#[test]
fn no_contiguous_memory_falls_back_to_4k_pages_counted() {
    // 3 MiB of memory: one huge frame, then no second.
    let pool = Arc::new(FrameAllocator::new(3 << 20, true));
    let mm = AddressSpace::with_pool(Config::default(), pool);
    let a = huge_region(&mm, 2 * HUGE);
    mm.write(a, b"a").unwrap();
    mm.write(a + HUGE, b"b").unwrap();
    let st = mm.stats();
    assert_eq!(st.thp_fault_alloc, 1);
    assert_eq!(st.thp_fault_fallback, 1);
    assert_eq!(mm.anon_huge_pages(a), Some(HUGE));
    let mut b = [0u8];
    mm.read(a + HUGE, &mut b).unwrap();
    assert_eq!(&b, b"b");
    assert_eq!(mm.frames_used(), 513);
    // Freed whole, the huge frame serves the next huge fault.
    mm.munmap(a, HUGE).unwrap();
    mm.write(a + HUGE + PAGE_SIZE, b"c").unwrap();
    let b2 = mm.mmap(BASE + 4 * HUGE, HUGE, RW, anon()).unwrap();
    mm.madvise(b2, HUGE, Advice::HugePage).unwrap();
    mm.write(b2, b"d").unwrap();
    assert_eq!(mm.stats().thp_fault_alloc, 2);
}

/// The calling thread bound to the CPU it runs on until dropped, when it
/// may run anywhere it could before.
struct BoundToThisCpu(libc::cpu_set_t);

impl BoundToThisCpu {
    fn new() -> Self {
        let size = core::mem::size_of::<libc::cpu_set_t>();
        // SAFETY: cpu_set_t is a plain bit array, valid when zeroed.
        let mut before: libc::cpu_set_t = unsafe { core::mem::zeroed() };
        // SAFETY: `before` is a writable cpu_set_t of `size` bytes; 0 is
        // this thread.
        assert_eq!(unsafe { libc::sched_getaffinity(0, size, &mut before) }, 0);
        // SAFETY: no preconditions; -1 on error.
        let cpu = usize::try_from(unsafe { libc::sched_getcpu() }).expect("sched_getcpu");
        // SAFETY: as `before`.
        let mut one: libc::cpu_set_t = unsafe { core::mem::zeroed() };
        // SAFETY: `cpu` is a CPU this thread runs on, below CPU_SETSIZE.
        unsafe { libc::CPU_SET(cpu, &mut one) };
        // SAFETY: `one` is a valid cpu_set_t of `size` bytes.
        assert_eq!(unsafe { libc::sched_setaffinity(0, size, &one) }, 0);
        BoundToThisCpu(before)
    }
}

impl Drop for BoundToThisCpu {
    fn drop(&mut self) {
        let size = core::mem::size_of::<libc::cpu_set_t>();
        // SAFETY: the set this thread had, a valid cpu_set_t.
        unsafe { libc::sched_setaffinity(0, size, &self.0) };
    }
}

/// Waits (ten seconds at most) until `mm`'s budget is charged `bytes`,
/// asking the epoch's collector to run what it can meanwhile: a
/// page-table page retired by an unmap comes back (and is uncharged)
/// after a grace period, which threads pinned elsewhere in the process
/// may hold back.
fn memory_back_to(mm: &AddressSpace, bytes: u64) {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while mm.memory_used() > bytes && std::time::Instant::now() < until {
        crossbeam_epoch::pin().flush();
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(mm.memory_used(), bytes, "memory charged after the unmap");
}

/// Checks the counts of huge faults, rebuilt huge frames and fallbacks,
/// and that the huge page at `b` reads what [`check_written_once`] wrote.
fn check_rebuilt(mm: &AddressSpace, b: u64, (alloc, rebuilt, fallback): (u64, u64, u64)) {
    let st = mm.stats();
    let got = (
        st.thp_fault_alloc,
        st.thp_frame_rebuilt,
        st.thp_fault_fallback,
    );
    assert_eq!(got, (alloc, rebuilt, fallback), "{st}");
    assert_eq!(mm.anon_huge_pages(b), Some(HUGE));
    check_written_once(mm, b);
}

/// Reads every page of the huge page at `b`, whose first byte only was
/// written: a huge frame rebuilt from dirty 4 KiB frames must be cleared.
fn check_written_once(mm: &AddressSpace, b: u64) {
    let mut got = vec![1u8; HUGE as usize];
    mm.read(b, &mut got).unwrap();
    assert_eq!(got[0], b'd');
    got[0] = 0;
    let kept = got.iter().position(|&x| x != 0);
    assert_eq!(kept, None, "a rebuilt huge frame kept someone's bytes");
}

#[test]
fn a_huge_page_split_and_unmapped_page_by_page_is_rebuilt() {
    // 3 MiB of memory: one 512-aligned block, taken by the first huge
    // fault; the second span falls back to 4 KiB.
    let pool = Arc::new(FrameAllocator::new(3 << 20, true));
    let mm = AddressSpace::with_pool(Config::default(), pool);
    let a = huge_region(&mm, 2 * HUGE);
    fill(&mm, a, HUGE);
    mm.write(a + HUGE, b"b").unwrap();
    assert_eq!(mm.anon_huge_pages(a), Some(HUGE));
    assert_eq!(mm.stats().thp_fault_fallback, 1);
    // Split by the first munmap, then freed one 4 KiB frame at a time.
    for p in (a..a + HUGE).step_by(PAGE_SIZE as usize) {
        mm.munmap(p, PAGE_SIZE).unwrap();
    }
    assert_eq!(mm.stats().thp_split_pmd, 1);
    // The next huge fault gets the block back, rebuilt (Linux's buddy
    // allocator merges the freed pages into an order-9 block again).
    let b = huge_region_at(&mm, BASE + 4 * HUGE, HUGE);
    mm.write(b, b"d").unwrap();
    check_rebuilt(&mm, b, (2, 1, 1));
    let mut kept = [0u8];
    mm.read(a + HUGE, &mut kept).unwrap();
    assert_eq!(&kept, b"b");
}

#[test]
fn memory_churned_in_4k_pages_gets_a_huge_page_again() {
    // 8 MiB of memory (4 blocks of 512 frames), every block used by
    // 4 KiB pages (6 MiB faulted with no advice, in madvise mode, and
    // their tables), then the last 2 MiB freed: the frames of the last
    // block are all free again, those of the others are not.
    let pool = Arc::new(FrameAllocator::new(8 << 20, true));
    let mm = AddressSpace::with_pool(Config::default(), pool);
    // Which frames a fault takes depends on the CPU it runs on (each
    // CPU's cache takes its own runs of the pool's frames): bound to one
    // CPU, the 2 MiB unmapped below are the frames of one block, whatever
    // the other tests' threads do meanwhile.
    let _bound = BoundToThisCpu::new();
    let a = mm.mmap(BASE, 3 * HUGE, RW, anon()).unwrap();
    fill(&mm, a, 3 * HUGE);
    assert_eq!(mm.anon_huge_pages(a), Some(0));
    let charged = mm.memory_used();
    mm.munmap(a + 2 * HUGE, HUGE).unwrap();
    // The unmapped range's 512 frames are free at once; its PTE table is
    // retired to the epoch, and threads pinned elsewhere in this process
    // (the other tests) can hold its grace period back past the huge
    // fault's own ask (`settle`), which then finds no whole block and
    // falls back, as it should. Wait for the table here, so that the
    // counts below are the same on every run.
    memory_back_to(&mm, charged - HUGE - PAGE_SIZE);
    // Two huge faults: the first gets the free block, rebuilt; the
    // second finds none (every other block holds mapped pages) and falls
    // back to 4 KiB.
    let b = huge_region_at(&mm, BASE + 4 * HUGE, 2 * HUGE);
    mm.write(b, b"d").unwrap();
    mm.write(b + HUGE, b"d").unwrap();
    check_rebuilt(&mm, b, (1, 1, 1));
    // The 4 KiB pages still mapped kept their bytes.
    check(&mm, a, 2 * HUGE);
}

#[test]
fn partial_munmap_splits_and_keeps_every_other_byte() {
    let mm = space(ThpMode::Madvise);
    let a = huge_region(&mm, 2 * HUGE);
    fill(&mm, a, 2 * HUGE);
    assert_eq!(mm.anon_huge_pages(a), Some(2 * HUGE));
    let hole = a + 100 * PAGE_SIZE;
    mm.munmap(hole, PAGE_SIZE).unwrap();
    assert_eq!(mm.stats().thp_split_pmd, 1);
    assert_eq!(mm.anon_huge_pages(a), Some(0));
    assert_eq!(mm.anon_huge_pages(hole + PAGE_SIZE), Some(HUGE));
    check(&mm, a, hole - a);
    check(&mm, hole + PAGE_SIZE, a + 2 * HUGE - hole - PAGE_SIZE);
    assert_eq!(mm.frames_used(), 1023);
    assert!(mm.read(hole, &mut [0]).is_err());
    mm.munmap(a, 2 * HUGE).unwrap();
    assert_eq!(mm.frames_used(), 0);
}

#[test]
fn mprotect_of_part_splits_of_the_whole_keeps_the_leaf() {
    let mm = space(ThpMode::Madvise);
    let a = huge_region(&mm, 2 * HUGE);
    fill(&mm, a, 2 * HUGE);
    mm.mprotect(a, 2 * HUGE, Prot::READ).unwrap();
    assert_eq!(mm.anon_huge_pages(a), Some(2 * HUGE));
    assert_eq!(mm.stats().thp_split_pmd, 0);
    assert!(mm.write(a, b"x").is_err());
    mm.mprotect(a, 2 * HUGE, RW).unwrap();
    mm.write(a + 5, b"y").unwrap();
    assert_eq!(mm.anon_huge_pages(a), Some(2 * HUGE));
    // A page in the middle of the second span.
    mm.mprotect(a + HUGE + 3 * PAGE_SIZE, PAGE_SIZE, Prot::READ)
        .unwrap();
    assert_eq!(mm.stats().thp_split_pmd, 1);
    assert_eq!(mm.anon_huge_pages(a), Some(HUGE));
    assert_eq!(mm.anon_huge_pages(a + HUGE + 3 * PAGE_SIZE), Some(0));
    let mut b = [0u8];
    mm.read(a + 5, &mut b).unwrap();
    assert_eq!(&b, b"y");
    check(&mm, a + PAGE_SIZE, 2 * HUGE - PAGE_SIZE);
    assert!(mm.write(a + HUGE + 3 * PAGE_SIZE, b"z").is_err());
    mm.write(a + HUGE + 4 * PAGE_SIZE, b"z").unwrap();
}

#[test]
fn dontneed_of_part_splits_and_zeroes_only_that_part() {
    let mm = space(ThpMode::Madvise);
    let a = huge_region(&mm, HUGE);
    fill(&mm, a, HUGE);
    mm.madvise(a + 10 * PAGE_SIZE, 2 * PAGE_SIZE, Advice::DontNeed)
        .unwrap();
    assert_eq!(mm.stats().thp_split_pmd, 1);
    assert_eq!(mm.frames_used(), 510);
    let mut b = [9u8; 2];
    mm.read(a + 10 * PAGE_SIZE + 7, &mut b).unwrap();
    assert_eq!(b, [0, 0]);
    check(&mm, a, 10 * PAGE_SIZE);
    check(&mm, a + 12 * PAGE_SIZE, HUGE - 12 * PAGE_SIZE);
    // DONTNEED of a whole span drops the huge page.
    let c = mm.mmap(BASE + 4 * HUGE, HUGE, RW, anon()).unwrap();
    mm.madvise(c, HUGE, Advice::HugePage).unwrap();
    mm.write(c, b"x").unwrap();
    mm.madvise(c, HUGE, Advice::DontNeed).unwrap();
    assert_eq!(mm.stats().thp_split_pmd, 1);
    assert_eq!(mm.anon_huge_pages(c), Some(0));
    assert_eq!(mm.frames_used(), 510);
}

#[test]
fn madvise_flags_on_part_split_the_vma_and_the_page() {
    let mm = space(ThpMode::Madvise);
    let a = huge_region(&mm, HUGE);
    fill(&mm, a, HUGE);
    mm.madvise(a + PAGE_SIZE, PAGE_SIZE, Advice::NoHugePage)
        .unwrap();
    assert_eq!(mm.stats().thp_split_pmd, 1);
    assert_eq!(mm.anon_huge_pages(a), Some(0));
    check(&mm, a, HUGE);
}

#[test]
fn mremap_moves_aligned_huge_pages_whole_and_splits_unaligned_ones() {
    let mm = space(ThpMode::Madvise);
    let a = huge_region(&mm, 2 * HUGE);
    fill(&mm, a, 2 * HUGE);
    let mv = MremapFlags::MAYMOVE | MremapFlags::FIXED;
    let to = BASE + 16 * HUGE;
    assert_eq!(mm.mremap(a, 2 * HUGE, 2 * HUGE, mv, to), Ok(to));
    assert_eq!(mm.stats().thp_split_pmd, 0);
    assert_eq!(mm.anon_huge_pages(to), Some(2 * HUGE));
    check_moved(&mm, to, 2 * HUGE, a);
    // To a 4 KiB-aligned address: the pages are split and moved as PTEs.
    let odd = BASE + 32 * HUGE + PAGE_SIZE;
    assert_eq!(mm.mremap(to, 2 * HUGE, 2 * HUGE, mv, odd), Ok(odd));
    assert_eq!(mm.stats().thp_split_pmd, 2);
    assert_eq!(mm.anon_huge_pages(odd), Some(0));
    check_moved(&mm, odd, 2 * HUGE, a);
    assert_eq!(mm.frames_used(), 1024);
}

#[test]
fn fork_shares_huge_pages_and_a_write_copies_4k() {
    let mm = space(ThpMode::Madvise);
    let a = huge_region(&mm, HUGE);
    fill(&mm, a, HUGE);
    let child = mm.fork().unwrap();
    assert_eq!(mm.frames_used(), 512);
    assert_eq!(child.anon_huge_pages(a), Some(HUGE));
    assert_eq!(mm.anon_huge_pages(a), Some(HUGE));
    mm.write(a + 8, &[0xee]).unwrap();
    // The parent's page is split and one 4 KiB page copied.
    assert_eq!(mm.stats().thp_split_pmd, 1);
    assert_eq!(mm.stats().cow_copies, 1);
    assert_eq!(mm.frames_used(), 513);
    assert_eq!(mm.anon_huge_pages(a), Some(0));
    assert_eq!(child.anon_huge_pages(a), Some(HUGE));
    check(&child, a, HUGE);
    check(&mm, a + PAGE_SIZE, HUGE - PAGE_SIZE);
    // The child writes too: its leaf splits; its copy-on-write finds
    // most frames still shared with the parent.
    child.write(a + PAGE_SIZE + 8, &[0xdd]).unwrap();
    check(&mm, a + PAGE_SIZE, HUGE - PAGE_SIZE);
    drop(child);
    check(&mm, a + PAGE_SIZE, HUGE - PAGE_SIZE);
    mm.munmap(a, HUGE).unwrap();
    assert_eq!(mm.frames_used(), 0);
}

#[test]
fn soft_dirty_on_a_huge_page_as_linux() {
    let mm = space(ThpMode::Madvise);
    let a = huge_region(&mm, HUGE);
    fill(&mm, a, HUGE);
    mm.clear_refs(aspace::ClearRefs::SoftDirty);
    assert!(mm
        .pagemap(a, HUGE)
        .unwrap()
        .iter()
        .all(|e| !e.is_soft_dirty()));
    assert_eq!(mm.anon_huge_pages(a), Some(HUGE));
    // The write fault reuses the exclusive page whole, as Linux's
    // do_huge_pmd_wp_page does: the whole 2 MiB reads written.
    mm.write(a + 5 * PAGE_SIZE, b"s").unwrap();
    assert_eq!(mm.anon_huge_pages(a), Some(HUGE));
    assert_eq!(mm.stats().thp_split_pmd, 0);
    assert!(mm
        .pagemap(a, HUGE)
        .unwrap()
        .iter()
        .all(|e| e.is_soft_dirty()));
}

#[test]
fn forced_writes_into_a_read_only_huge_range() {
    let mm = space(ThpMode::Madvise);
    let a = huge_region(&mm, HUGE);
    fill(&mm, a, HUGE);
    mm.mprotect(a, HUGE, Prot::READ).unwrap();
    // ptrace's POKEDATA: a private copy of the page, the entry read-only.
    mm.write_forced(a + 3 * PAGE_SIZE + 8, &[0x77]).unwrap();
    let mut b = [0u8];
    mm.read(a + 3 * PAGE_SIZE + 8, &mut b).unwrap();
    assert_eq!(b, [0x77]);
    assert!(mm.write(a + 3 * PAGE_SIZE, b"x").is_err());
    check(&mm, a + 4 * PAGE_SIZE, HUGE - 4 * PAGE_SIZE);
    // Into an untouched read-only span: 4 KiB pages.
    let c = mm.mmap(BASE + 8 * HUGE, HUGE, Prot::READ, anon()).unwrap();
    mm.madvise(c, HUGE, Advice::HugePage).unwrap();
    mm.write_forced(c + 8, &[0x66]).unwrap();
    mm.read(c + 8, &mut b).unwrap();
    assert_eq!(b, [0x66]);
    assert_eq!(mm.anon_huge_pages(c), Some(0));
}

#[test]
fn translators_read_and_write_huge_pages() {
    let mm = space(ThpMode::Madvise);
    let a = huge_region(&mm, HUGE);
    let mut t = mm.translator();
    for i in 0..512u64 {
        t.store::<u64>(a + i * PAGE_SIZE + 16, i * 3).unwrap();
    }
    assert_eq!(mm.anon_huge_pages(a), Some(HUGE));
    mm.munmap(a + 7 * PAGE_SIZE, PAGE_SIZE).unwrap();
    for i in 0..512u64 {
        let r = t.load::<u64>(a + i * PAGE_SIZE + 16);
        if i == 7 {
            assert!(r.is_err());
        } else {
            assert_eq!(r.unwrap(), i * 3);
        }
    }
}

#[test]
fn the_budget_is_charged_2_mib() {
    let mm = space(ThpMode::Madvise);
    let before = mm.memory_used();
    let a = huge_region(&mm, HUGE);
    mm.write(a, b"x").unwrap();
    let used = mm.memory_used() - before;
    assert!((HUGE..HUGE + 64 * PAGE_SIZE).contains(&used), "{used}");
    mm.munmap(a, HUGE).unwrap();
    assert!(mm.memory_used() - before < 64 * PAGE_SIZE);
}

#[test]
fn madv_collapse_copies_4k_pages_into_a_huge_page() {
    // Never: faults map 4 KiB pages, MADV_COLLAPSE still collapses.
    let mm = space(ThpMode::Never);
    let a = mm.mmap(BASE, 2 * HUGE, RW, anon()).unwrap();
    fill(&mm, a, HUGE);
    // A hole in the second span: collapsed too (any number of empty
    // entries), reading zero.
    fill(&mm, a + HUGE, HUGE);
    mm.madvise(a + HUGE + 9 * PAGE_SIZE, PAGE_SIZE, Advice::DontNeed)
        .unwrap();
    assert_eq!(mm.anon_huge_pages(a), Some(0));
    assert_eq!(mm.frames_used(), 1023);
    mm.madvise(a, 2 * HUGE, Advice::Collapse).unwrap();
    assert_eq!(mm.stats().thp_collapse_alloc, 2);
    assert_eq!(mm.anon_huge_pages(a), Some(2 * HUGE));
    assert_eq!(mm.frames_used(), 1024);
    check(&mm, a, HUGE + 9 * PAGE_SIZE);
    check(&mm, a + HUGE + 10 * PAGE_SIZE, HUGE - 10 * PAGE_SIZE);
    let mut b = [1u8; 16];
    mm.read(a + HUGE + 9 * PAGE_SIZE, &mut b).unwrap();
    assert_eq!(b, [0; 16]);
    // Collapsing again is a no-op; the page tables went back.
    mm.madvise(a, 2 * HUGE, Advice::Collapse).unwrap();
    assert_eq!(mm.stats().thp_collapse_alloc, 2);
    mm.munmap(a, 2 * HUGE).unwrap();
    assert_eq!(mm.frames_used(), 0);
}

#[test]
fn madv_collapse_errors() {
    let mm = space(ThpMode::Madvise);
    let a = mm.mmap(BASE, HUGE, RW, anon()).unwrap();
    // No page table in the span: EINVAL, as Linux's SCAN_PMD_NULL.
    assert_eq!(
        mm.madvise(a, HUGE, Advice::Collapse),
        Err(aspace::Error::Inval)
    );
    mm.write(a, b"x").unwrap();
    mm.madvise(a, HUGE, Advice::NoHugePage).unwrap();
    assert_eq!(
        mm.madvise(a, HUGE, Advice::Collapse),
        Err(aspace::Error::Inval)
    );
    // No huge frame: ENOMEM, the pages unchanged.
    let pool = Arc::new(FrameAllocator::new(1 << 20, true));
    let small = AddressSpace::with_pool(Config::default(), pool);
    let b = small.mmap(BASE, HUGE, RW, anon()).unwrap();
    fill(&small, b, 16 * PAGE_SIZE);
    assert_eq!(
        small.madvise(b, HUGE, Advice::Collapse),
        Err(aspace::Error::NoMem)
    );
    check(&small, b, 16 * PAGE_SIZE);
    // A VMA that cannot have them stops the walk with EINVAL, before
    // the hole after it is seen.
    assert_eq!(
        mm.madvise(a, 2 * HUGE, Advice::Collapse),
        Err(aspace::Error::Inval)
    );
    // A hole after a collapsible VMA: ENOMEM, the VMA collapsed.
    let mm = space(ThpMode::Madvise);
    let a = mm.mmap(BASE, HUGE, RW, anon()).unwrap();
    mm.write(a, b"x").unwrap();
    assert_eq!(
        mm.madvise(a, 2 * HUGE, Advice::Collapse),
        Err(aspace::Error::NoMem)
    );
    assert_eq!(mm.anon_huge_pages(a), Some(HUGE));
}

#[test]
fn khugepaged_collapses_spans_within_max_ptes_none() {
    let mm = AddressSpace::new(Config {
        thp: ThpMode::Madvise,
        thp_max_ptes_none: 100,
        ..Config::default()
    });
    let a = mm.mmap(BASE, 3 * HUGE, RW, anon()).unwrap();
    // 4 KiB pages first (not advised yet), then the advice.
    fill(&mm, a, HUGE); // full
    fill(&mm, a + HUGE, HUGE - 100 * PAGE_SIZE); // 100 empty
    fill(&mm, a + 2 * HUGE, HUGE - 101 * PAGE_SIZE); // 101 empty
    assert_eq!(mm.khugepaged_scan(), 0, "madvise mode, no advice");
    mm.madvise(a, 3 * HUGE, Advice::HugePage).unwrap();
    assert_eq!(mm.khugepaged_scan(), 2);
    assert_eq!(mm.stats().thp_collapse_alloc, 2);
    assert_eq!(mm.anon_huge_pages(a), Some(2 * HUGE));
    check(&mm, a, 2 * HUGE - 100 * PAGE_SIZE);
    check(&mm, a + 2 * HUGE, HUGE - 101 * PAGE_SIZE);
    assert_eq!(mm.khugepaged_scan(), 0);
    // A fork child shares the collapsed pages.
    let child = mm.fork().unwrap();
    check(&child, a, HUGE);
}

#[test]
fn khugepaged_collapses_spans_within_max_ptes_shared() {
    let mm = AddressSpace::new(Config {
        thp: ThpMode::Madvise,
        thp_max_ptes_shared: 100,
        ..Config::default()
    });
    let a = mm.mmap(BASE, 3 * HUGE, RW, anon()).unwrap();
    fill(&mm, a, 3 * HUGE);
    // Shared copy-on-write with a child, then the parent's own copy of
    // every page but the last 100, 101 and 0 of each span.
    let child = mm.fork().unwrap();
    for (span, shared) in [(0, 100), (1, 101), (2, 0)] {
        let s = a + span * HUGE;
        fill(&mm, s, HUGE - shared * PAGE_SIZE);
    }
    mm.madvise(a, 3 * HUGE, Advice::HugePage).unwrap();
    assert_eq!(mm.khugepaged_scan(), 2);
    assert_eq!(mm.anon_huge_pages(a), Some(2 * HUGE));
    check(&mm, a, 3 * HUGE);
    check(&child, a, 3 * HUGE);
    // MADV_COLLAPSE ignores the limit, as Linux's: the span left (101
    // shared pages) is collapsed now.
    mm.madvise(a + HUGE, HUGE, Advice::Collapse).unwrap();
    assert_eq!(mm.anon_huge_pages(a), Some(3 * HUGE));
    check(&mm, a, 3 * HUGE);
    check(&child, a, 3 * HUGE);
}

/// `len` at `BASE` filled in 4 KiB pages (madvise mode, not advised
/// yet), then advised `MADV_HUGEPAGE`.
fn filled_then_advised(mm: &AddressSpace, len: u64) -> u64 {
    let a = mm.mmap(BASE, len, RW, anon()).unwrap();
    fill(mm, a, len);
    mm.madvise(a, len, Advice::HugePage).unwrap();
    a
}

#[test]
fn khugepaged_wants_a_referenced_page() {
    let mm = space(ThpMode::Madvise);
    let a = filled_then_advised(&mm, 2 * HUGE);
    // Every entry old: nothing referenced since the reset.
    mm.clear_refs(aspace::ClearRefs::Anon);
    assert_eq!(mm.khugepaged_scan(), 0);
    // A fault makes one entry of the first span young.
    let p = a + 5 * PAGE_SIZE;
    mm.madvise(p, PAGE_SIZE, Advice::DontNeed).unwrap();
    mm.write(p + 8, &[byte_at(p)]).unwrap();
    assert_eq!(mm.khugepaged_scan(), 1);
    assert_eq!(mm.anon_huge_pages(a), Some(HUGE));
    // MADV_COLLAPSE wants none, as Linux's.
    mm.madvise(a + HUGE, HUGE, Advice::Collapse).unwrap();
    assert_eq!(mm.anon_huge_pages(a), Some(2 * HUGE));
    check(&mm, a, 2 * HUGE);
}

#[test]
fn khugepaged_collapses_spans_with_no_writable_entry() {
    // Linux 6.18's khugepaged and MADV_COLLAPSE take anonymous spans none
    // of whose entries is writable (the kernel's answer to the same calls
    // is compared in `against_the_kernel`).
    let mm = space(ThpMode::Madvise);
    let a = filled_then_advised(&mm, 2 * HUGE);
    // The first span read-only; the second write-protected by a fork
    // whose child is gone (nothing shared any more).
    mm.mprotect(a, HUGE, Prot::READ).unwrap();
    drop(mm.fork().unwrap());
    assert_eq!(mm.khugepaged_scan(), 2);
    assert_eq!(mm.anon_huge_pages(a), Some(HUGE));
    assert_eq!(mm.anon_huge_pages(a + HUGE), Some(HUGE));
    check(&mm, a, 2 * HUGE);
}

/// The same calls on a region of this process and on a space, with
/// `AnonHugePages` of every VMA of the window compared between
/// `/proc/self/smaps` and [`AddressSpace::anon_huge_pages`].
mod against_the_kernel {
    use super::*;

    /// The window both sides work in (reserved `PROT_NONE` first).
    const WINDOW: u64 = 24 << 20;

    #[derive(Clone, Copy, Debug)]
    enum Op {
        /// Anonymous private read-write memory at an offset.
        Map(u64, u64),
        Advise(u64, u64, Advice),
        /// One byte into every page.
        WriteAll(u64, u64),
        Write(u64),
        Read(u64),
        /// A read of every page (the 4 KiB zero page, unadvised).
        ReadAll(u64, u64),
        Munmap(u64, u64),
        Protect(u64, u64, Prot),
        /// mremap of `len` at the first offset to the second.
        Move(u64, u64, u64),
        /// fork, the child kept alive to the end.
        Fork,
        /// `clear_refs` 1: every accessed bit cleared (no page referenced).
        ClearAccessed,
    }

    /// The kernel's mode, if it has THP at all (`None`: skip).
    fn kernel_mode() -> Option<ThpMode> {
        let s = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").ok()?;
        if s.contains("[always]") {
            Some(ThpMode::Always)
        } else if s.contains("[madvise]") {
            Some(ThpMode::Madvise)
        } else {
            None
        }
    }

    /// (offset, end offset, AnonHugePages bytes) of each VMA of the window
    /// at `base` in `/proc/self/smaps`.
    fn kernel_huge(base: u64) -> Vec<(u64, u64, u64)> {
        let text = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut out = Vec::new();
        let mut cur: Option<(u64, u64)> = None;
        for line in text.lines() {
            let head = line.split_whitespace().next().unwrap_or("");
            if let Some((a, b)) = head.split_once('-') {
                if let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) {
                    cur = clip(a, b, base);
                    continue;
                }
            }
            if let (Some((a, b)), Some(kb)) = (cur, line.strip_prefix("AnonHugePages:")) {
                let kb: u64 = kb.trim().trim_end_matches("kB").trim().parse().unwrap();
                out.push((a, b, kb * 1024));
            }
        }
        out
    }

    /// The part of VMA `[a, b)` in the window at `base`, as offsets.
    fn clip(a: u64, b: u64, base: u64) -> Option<(u64, u64)> {
        (a < base + WINDOW && b > base).then(|| (a.max(base) - base, b.min(base + WINDOW) - base))
    }

    /// The pagemap flag bits compared (soft-dirty, exclusive, uffd-wp,
    /// file or shared, present), not the frame numbers.
    const PM_FLAGS: u64 = (1 << 56) | (1 << 57) | (1 << 61) | (1 << 63);

    /// Pagemap flags of every page of the window at `base` in this
    /// process.
    fn kernel_pagemap(base: u64) -> Vec<u64> {
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::open("/proc/self/pagemap").unwrap();
        let mut buf = vec![0u8; (WINDOW / PAGE_SIZE * 8) as usize];
        f.read_exact_at(&mut buf, base / PAGE_SIZE * 8).unwrap();
        buf.chunks(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()) & PM_FLAGS)
            .collect()
    }

    fn aspace_pagemap(mm: &AddressSpace) -> Vec<u64> {
        mm.pagemap(BASE, WINDOW)
            .unwrap()
            .iter()
            .map(|e| e.raw() & PM_FLAGS)
            .collect()
    }

    /// Where two pagemaps differ: (page offset, kernel, aspace) of the
    /// first page that does, and how many do.
    fn pagemap_diff(k: &[u64], a: &[u64]) -> Option<(u64, u64, u64, usize)> {
        let diffs: Vec<usize> = (0..k.len()).filter(|&i| k[i] != a[i]).collect();
        let &i = diffs.first()?;
        Some((i as u64 * PAGE_SIZE, k[i], a[i], diffs.len()))
    }

    fn aspace_huge(mm: &AddressSpace) -> Vec<(u64, u64, u64)> {
        mm.vmas()
            .iter()
            .filter_map(|v| {
                let (a, b) = clip(v.start, v.end, BASE)?;
                Some((a, b, mm.anon_huge_pages(v.start).unwrap()))
            })
            .collect()
    }

    /// Runs `ops` in this process and on a space (each madvise's errno
    /// compared as it goes); returns both views after each op, or `None`
    /// if the kernel had no huge page where aspace mapped its first (no
    /// free 2 MiB: nothing to compare).
    #[allow(clippy::type_complexity)]
    fn run(ops: &[Op]) -> Option<Vec<(Op, Vec<(u64, u64, u64)>, Vec<(u64, u64, u64)>)>> {
        let mode = kernel_mode()?;
        let mm = space(mode);
        let mut children = Vec::new();
        mm.mmap(BASE, WINDOW, Prot::NONE, anon()).unwrap();
        // SAFETY: a fresh reservation of our own, unmapped at the end;
        // nothing else in the process uses it.
        let raw = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                (WINDOW + HUGE) as usize,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        assert_ne!(raw, libc::MAP_FAILED);
        let kb = (raw as u64).next_multiple_of(HUGE);
        let k = |off: u64| (kb + off) as *mut libc::c_void;
        // A hole left in the window (munmap, a move's source) is reserved
        // again at once on both sides: another test's thread may map
        // memory of its own there (a frame chunk), which our final munmap
        // of the window would take from under it. If one got there
        // first, the window is left mapped and nothing compared.
        let mut tainted = false;
        let rereserve = |off: u64, len: u64, tainted: &mut bool| {
            // SAFETY: a hole of our window; NOREPLACE touches nothing
            // mapped there.
            let p = unsafe {
                libc::mmap(
                    k(off),
                    len as usize,
                    libc::PROT_NONE,
                    libc::MAP_PRIVATE
                        | libc::MAP_ANONYMOUS
                        | libc::MAP_NORESERVE
                        | libc::MAP_FIXED_NOREPLACE,
                    -1,
                    0,
                )
            };
            if p != k(off) {
                *tainted = true;
            }
            mm.mmap(BASE + off, len, Prot::NONE, anon()).unwrap();
        };
        let mut views = Vec::new();
        let mut kernel_got_huge = true;
        let mut seen_huge = false;
        let mut pagemap_differ = Vec::new();
        for &op in ops {
            if tainted {
                break; // the window is no longer ours alone
            }
            // SAFETY: every libc call below names addresses inside our
            // own reservation, which only this function maps, or our own
            // child and pipe.
            unsafe {
                match op {
                    Op::Map(off, len) => {
                        let p = libc::mmap(
                            k(off),
                            len as usize,
                            libc::PROT_READ | libc::PROT_WRITE,
                            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                            -1,
                            0,
                        );
                        assert_eq!(p, k(off));
                        mm.mmap(BASE + off, len, RW, anon()).unwrap();
                    }
                    Op::Advise(off, len, a) => {
                        let r = libc::madvise(k(off), len as usize, a.to_raw());
                        let kernel = (r != 0).then(|| *libc::__errno_location());
                        let ours = mm.madvise(BASE + off, len, a).err().map(|e| e.errno());
                        // A collapse the kernel could not make at this
                        // moment (EAGAIN: no huge page free just then, or a
                        // page it could not isolate; ENOMEM) says nothing
                        // of ours, whose memory is its own: as a fault that
                        // found no free 2 MiB, the sequence is not compared.
                        if a == Advice::Collapse
                            && ours.is_none()
                            && matches!(kernel, Some(libc::EAGAIN | libc::ENOMEM))
                        {
                            kernel_got_huge = false;
                            break;
                        }
                        assert_eq!(kernel, ours, "{op:?}: errno");
                    }
                    Op::WriteAll(off, len) => {
                        for p in (off..off + len).step_by(PAGE_SIZE as usize) {
                            *(k(p) as *mut u8) = 1;
                            mm.write(BASE + p, &[1]).unwrap();
                        }
                    }
                    Op::Write(off) => {
                        *(k(off) as *mut u8) = 2;
                        mm.write(BASE + off, &[2]).unwrap();
                    }
                    Op::Read(off) => {
                        core::ptr::read_volatile(k(off) as *const u8);
                        mm.read(BASE + off, &mut [0]).unwrap();
                    }
                    Op::ReadAll(off, len) => {
                        for p in (off..off + len).step_by(PAGE_SIZE as usize) {
                            core::ptr::read_volatile(k(p) as *const u8);
                            mm.read(BASE + p, &mut [0]).unwrap();
                        }
                    }
                    Op::Munmap(off, len) => {
                        assert_eq!(libc::munmap(k(off), len as usize), 0);
                        mm.munmap(BASE + off, len).unwrap();
                        rereserve(off, len, &mut tainted);
                    }
                    Op::Protect(off, len, p) => {
                        assert_eq!(libc::mprotect(k(off), len as usize, p.bits() as i32), 0);
                        mm.mprotect(BASE + off, len, p).unwrap();
                    }
                    Op::Move(off, len, to) => {
                        let p = libc::mremap(
                            k(off),
                            len as usize,
                            len as usize,
                            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                            k(to),
                        );
                        assert_eq!(p, k(to));
                        let f = MremapFlags::MAYMOVE | MremapFlags::FIXED;
                        mm.mremap(BASE + off, len, len, f, BASE + to).unwrap();
                        rereserve(off, len, &mut tainted);
                    }
                    Op::Fork => {
                        let mut fds = [0; 2];
                        assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
                        let pid = libc::fork();
                        assert!(pid >= 0);
                        if pid == 0 {
                            // The child only waits for the pipe to close:
                            // async-signal-safe calls alone after fork.
                            libc::close(fds[1]);
                            let mut b = 0u8;
                            libc::read(fds[0], (&mut b as *mut u8).cast(), 1);
                            libc::_exit(0);
                        }
                        libc::close(fds[0]);
                        children.push((pid, fds[1], mm.fork().unwrap()));
                    }
                    Op::ClearAccessed => {
                        std::fs::write("/proc/self/clear_refs", "1").unwrap();
                        mm.clear_refs(aspace::ClearRefs::All);
                    }
                }
            }
            let (kv, av) = (kernel_huge(kb), aspace_huge(&mm));
            if let Some((off, k, a, n)) = pagemap_diff(&kernel_pagemap(kb), &aspace_pagemap(&mm)) {
                pagemap_differ.push(format!(
                    "{op:?}: {n} pages differ, first at +{off:#x}: kernel {k:#x}, aspace {a:#x}"
                ));
            }
            // The first huge page aspace maps: did the kernel get one
            // too (else it had no free 2 MiB, and nothing compares)?
            if !seen_huge && av.iter().any(|v| v.2 > 0) {
                seen_huge = true;
                // Only a fault may find no free 2 MiB and fall back; a
                // collapse that fails says so in its errno.
                let fault = matches!(
                    op,
                    Op::WriteAll(..) | Op::Write(_) | Op::Read(_) | Op::ReadAll(..)
                );
                kernel_got_huge = !fault || kv.iter().any(|v| v.2 > 0);
            }
            views.push((op, kv, av));
        }
        for (pid, fd, child) in children {
            drop(child);
            // SAFETY: our child and our pipe end.
            unsafe {
                libc::close(fd);
                libc::waitpid(pid, core::ptr::null_mut(), 0);
            }
        }
        if tainted {
            eprintln!("another mapping took a hole of the window: not compared");
            return None;
        }
        // SAFETY: our reservation, whole (its holes reserved again).
        unsafe { libc::munmap(raw, (WINDOW + HUGE) as usize) };
        if kernel_got_huge {
            // Pagemap flags of every page compared too (Linux's pagemap
            // of huge pages: each page present, exclusive while one
            // mapping holds it, soft-dirty with its PMD).
            assert!(
                pagemap_differ.is_empty(),
                "pagemap: {}",
                pagemap_differ.join("\n")
            );
        }
        if !kernel_got_huge {
            eprintln!("the kernel gave no huge page (no free 2 MiB?): not compared: {ops:?}");
            return None;
        }
        Some(views)
    }

    /// 4 MiB (two huge spans) at 2 MiB into the window, advised and
    /// written, then `then`.
    fn scenario(then: &[Op]) -> Vec<Op> {
        let mut ops = vec![
            Op::Map(HUGE, 2 * HUGE),
            Op::Advise(HUGE, 2 * HUGE, Advice::HugePage),
            Op::WriteAll(HUGE, 2 * HUGE),
        ];
        ops.extend_from_slice(then);
        ops
    }

    /// The same 4 MiB written in 4 KiB pages under `MADV_NOHUGEPAGE`,
    /// then advised `MADV_HUGEPAGE`, then `then`.
    fn scenario_4k(then: &[Op]) -> Vec<Op> {
        let mut ops = vec![
            Op::Map(HUGE, 2 * HUGE),
            Op::Advise(HUGE, 2 * HUGE, Advice::NoHugePage),
            Op::WriteAll(HUGE, 2 * HUGE),
            Op::Advise(HUGE, 2 * HUGE, Advice::HugePage),
        ];
        ops.extend_from_slice(then);
        ops
    }

    #[test]
    fn anon_huge_pages_per_vma_match_the_kernel() {
        let p = PAGE_SIZE;
        let cases: Vec<(&str, Vec<Op>)> = vec![
            ("fault", scenario(&[])),
            ("partial munmap", scenario(&[Op::Munmap(HUGE + 50 * p, p)])),
            ("whole-span munmap", scenario(&[Op::Munmap(HUGE, HUGE)])),
            (
                "partial mprotect",
                scenario(&[Op::Protect(2 * HUGE + 9 * p, 3 * p, Prot::READ)]),
            ),
            (
                "whole mprotect",
                scenario(&[Op::Protect(HUGE, 2 * HUGE, Prot::READ)]),
            ),
            (
                "partial dontneed",
                scenario(&[Op::Advise(HUGE + 3 * p, p, Advice::DontNeed)]),
            ),
            (
                "whole-span dontneed",
                scenario(&[Op::Advise(HUGE, HUGE, Advice::DontNeed)]),
            ),
            (
                "nohugepage on a page",
                scenario(&[Op::Advise(2 * HUGE + p, p, Advice::NoHugePage)]),
            ),
            (
                "aligned mremap",
                scenario(&[Op::Move(HUGE, 2 * HUGE, 6 * HUGE)]),
            ),
            (
                "unaligned mremap",
                scenario(&[Op::Move(HUGE, 2 * HUGE, 6 * HUGE + p)]),
            ),
            (
                "fork and a write",
                scenario(&[Op::Fork, Op::Write(HUGE + 5 * p), Op::Write(2 * HUGE)]),
            ),
            (
                "MADV_COLLAPSE of 4 KiB pages",
                vec![
                    Op::Map(HUGE, 2 * HUGE),
                    Op::WriteAll(HUGE, 2 * HUGE),
                    Op::Advise(HUGE, 2 * HUGE, Advice::Collapse),
                ],
            ),
            (
                "MADV_COLLAPSE after a partial dontneed",
                scenario(&[
                    Op::Advise(HUGE + 3 * p, 2 * p, Advice::DontNeed),
                    Op::Advise(HUGE, 2 * HUGE, Advice::Collapse),
                ]),
            ),
            (
                "MADV_COLLAPSE with an untouched span",
                vec![
                    Op::Map(HUGE, 2 * HUGE),
                    Op::WriteAll(2 * HUGE, HUGE),
                    Op::Advise(HUGE, 2 * HUGE, Advice::Collapse),
                ],
            ),
            (
                "MADV_COLLAPSE of part of a VMA, unaligned",
                vec![
                    Op::Map(HUGE, 2 * HUGE),
                    Op::WriteAll(HUGE, 2 * HUGE),
                    Op::Advise(HUGE + p, 2 * HUGE - p, Advice::Collapse),
                ],
            ),
            (
                // Linux's MADV_COLLAPSE ignores khugepaged's
                // max_ptes_shared (510 pages shared with the child here)
                // and referenced rules.
                "MADV_COLLAPSE of pages shared with a fork child",
                vec![
                    Op::Map(HUGE, 2 * HUGE),
                    Op::WriteAll(HUGE, 2 * HUGE),
                    Op::Fork,
                    Op::Write(HUGE + 5 * p),
                    Op::Write(HUGE + 9 * p),
                    Op::Advise(HUGE, 2 * HUGE, Advice::Collapse),
                ],
            ),
            (
                "MADV_COLLAPSE with no page referenced",
                vec![
                    Op::Map(HUGE, 2 * HUGE),
                    Op::WriteAll(HUGE, 2 * HUGE),
                    Op::ClearAccessed,
                    Op::Advise(HUGE, 2 * HUGE, Advice::Collapse),
                ],
            ),
            // Linux 6.18 collapses anonymous spans no PTE of which is
            // writable (khugepaged's SCAN_PAGE_RO rule is gone): 4 KiB
            // pages written unadvised, then advised and made read-only,
            // or write-protected by a fork.
            (
                "MADV_COLLAPSE of a read-only span",
                scenario_4k(&[
                    Op::Protect(HUGE, 2 * HUGE, Prot::READ),
                    Op::Advise(HUGE, 2 * HUGE, Advice::Collapse),
                ]),
            ),
            (
                "MADV_COLLAPSE of spans write-protected by fork",
                scenario_4k(&[
                    Op::Fork,
                    Op::Write(2 * HUGE + 7 * p),
                    Op::Advise(HUGE, 2 * HUGE, Advice::Collapse),
                ]),
            ),
            // A span of zero-page entries, or of none at all, is
            // collapsed when its VMA has an anon_vma (a written page
            // anywhere in it); with none, MADV_COLLAPSE fails with
            // EINVAL (Linux wants the anon_vma before it collapses
            // anonymous memory).
            (
                "MADV_COLLAPSE of zero-page spans, no anon_vma",
                vec![
                    Op::Map(HUGE, 2 * HUGE),
                    Op::Advise(HUGE, 2 * HUGE, Advice::NoHugePage),
                    Op::ReadAll(HUGE, 2 * HUGE),
                    Op::Advise(HUGE, 2 * HUGE, Advice::HugePage),
                    Op::Advise(HUGE, 2 * HUGE, Advice::Collapse),
                ],
            ),
            (
                "MADV_COLLAPSE of a zero-page span beside a written one",
                vec![
                    Op::Map(HUGE, 2 * HUGE),
                    Op::Advise(HUGE, 2 * HUGE, Advice::NoHugePage),
                    Op::ReadAll(HUGE, HUGE),
                    Op::WriteAll(2 * HUGE, HUGE),
                    Op::Advise(HUGE, 2 * HUGE, Advice::HugePage),
                    Op::Advise(HUGE, 2 * HUGE, Advice::Collapse),
                ],
            ),
            (
                "MADV_COLLAPSE of a span whose table is empty",
                vec![
                    Op::Map(HUGE, 2 * HUGE),
                    Op::Advise(HUGE, 2 * HUGE, Advice::NoHugePage),
                    Op::WriteAll(HUGE, 2 * HUGE),
                    // In two parts: a zap over a whole table's span frees
                    // the table in Linux 6.18 (`CONFIG_PT_RECLAIM`), which
                    // aspace does not (the table stays, empty).
                    Op::Advise(HUGE, HUGE - p, Advice::DontNeed),
                    Op::Advise(2 * HUGE - p, p, Advice::DontNeed),
                    Op::Advise(HUGE, 2 * HUGE, Advice::HugePage),
                    Op::Advise(HUGE, 2 * HUGE, Advice::Collapse),
                ],
            ),
            (
                "read fault then write",
                vec![
                    Op::Map(HUGE, 2 * HUGE),
                    Op::Advise(HUGE, 2 * HUGE, Advice::HugePage),
                    Op::WriteAll(2 * HUGE, HUGE),
                    Op::Read(HUGE + 7 * p),
                    Op::Write(HUGE + 9 * p),
                ],
            ),
        ];
        let mut compared = 0;
        let mut differ = Vec::new();
        for (name, ops) in &cases {
            let Some(views) = run(ops) else {
                continue;
            };
            for (op, kv, av) in views {
                compared += 1;
                if kv != av {
                    differ.push(format!(
                        "{name}: after {op:?}\n kernel {kv:x?}\n aspace {av:x?}"
                    ));
                }
            }
        }
        eprintln!("{compared} states compared, {} differ", differ.len());
        assert!(differ.is_empty(), "{}", differ.join("\n"));
    }
}

/// Threads store into their own pages of a huge range, through
/// translators (cached entries) and `write`, while the main thread
/// splits, changes and collapses the huge pages under them: mprotect of
/// parts, advice on parts (VMA splits), DONTNEED of pages nobody owns,
/// MADV_COLLAPSE and khugepaged passes. No store is lost: each thread's
/// pages hold its last values at the end.
#[test]
fn stores_survive_concurrent_splits_and_collapses() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let mm = Arc::new(space(ThpMode::Madvise));
    let len = 4 * HUGE;
    let a = huge_region(&mm, len);
    let pages = len / PAGE_SIZE;
    const THREADS: u64 = 2;
    let stop = Arc::new(AtomicBool::new(false));
    let started = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (mm, stop, started) = (mm.clone(), stop.clone(), started.clone());
            std::thread::spawn(move || {
                // Thread t owns the pages p with p % 4 == t; pages 2 and 3
                // (mod 4) are nobody's: the main thread zaps those.
                let mine: Vec<u64> = (0..pages).filter(|p| p % 4 == t).collect();
                let mut tr = mm.translator();
                let mut round = 0u64;
                while !stop.load(Ordering::Relaxed) || round < 3 {
                    round += 1;
                    for (i, &p) in mine.iter().enumerate() {
                        let v = round * 10_000 + p;
                        if i % 2 == 0 {
                            tr.store::<u64>(a + p * PAGE_SIZE + 64, v).unwrap();
                        } else {
                            mm.write(a + p * PAGE_SIZE + 64, &v.to_le_bytes()).unwrap();
                        }
                    }
                    if round == 1 {
                        started.fetch_add(1, Ordering::SeqCst);
                    }
                }
                (mine, round)
            })
        })
        .collect();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    // Every page written once: the huge pages exist before the churn.
    while started.load(Ordering::SeqCst) < THREADS {
        std::thread::yield_now();
    }
    for _ in 0..300 {
        let span = next(4) * HUGE;
        let off = next(HUGE / PAGE_SIZE) * PAGE_SIZE;
        match next(5) {
            0 => {
                // A flags change on a page splits its VMA and huge page.
                let p = if next(2) == 0 { RW | Prot::EXEC } else { RW };
                mm.mprotect(a + span + off, PAGE_SIZE, p).unwrap();
            }
            1 => {
                let adv = if next(2) == 0 {
                    Advice::NoHugePage
                } else {
                    Advice::HugePage
                };
                mm.madvise(a + span + off, PAGE_SIZE, adv).unwrap();
            }
            2 => {
                // A page nobody owns (2 or 3 mod 4).
                let p = (span + off) / PAGE_SIZE;
                let q = p - p % 4 + 2;
                if q < pages {
                    mm.madvise(a + q * PAGE_SIZE, PAGE_SIZE, Advice::DontNeed)
                        .unwrap();
                }
            }
            3 => {
                let _ = mm.madvise(a + span, HUGE, Advice::Collapse);
            }
            _ => {
                mm.mprotect(a, len, RW).unwrap();
                mm.madvise(a, len, Advice::HugePage).unwrap();
                mm.khugepaged_scan();
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        let (mine, round) = w.join().unwrap();
        for p in mine {
            let mut b = [0u8; 8];
            mm.read(a + p * PAGE_SIZE + 64, &mut b).unwrap();
            assert_eq!(u64::from_le_bytes(b), round * 10_000 + p, "page {p}");
        }
    }
    let st = mm.stats();
    assert!(st.thp_split_pmd > 0 && st.thp_collapse_alloc > 0, "{st}");
}

/// A translator caches a PMD leaf as one 2 MiB entry: after the first
/// access walks the table, every other page of the huge page is served
/// from it (`translator_huge_hits`), with no walk; a split (mprotect of
/// one page inside) and a munmap of part then invalidate it: the pages
/// left read their patterns, the unmapped ones fault, the protected one
/// refuses stores.
#[test]
fn a_translator_caches_a_huge_page_as_one_entry() {
    let mm = space(ThpMode::Madvise);
    let a = huge_region(&mm, HUGE);
    let mut t = mm.translator();
    t.store::<u64>(a, 1).unwrap();
    assert_eq!(mm.stats().thp_fault_alloc, 1);
    let before = mm.stats();
    for pg in 0..512 {
        t.store::<u64>(a + pg * PAGE_SIZE + 8, 0x1000 + pg).unwrap();
    }
    for pg in 0..512 {
        assert_eq!(t.load::<u64>(a + pg * PAGE_SIZE + 8).unwrap(), 0x1000 + pg);
    }
    let d = mm.stats() - before;
    assert_eq!(d.faults(), 0);
    // Page 0 was cached by the first store (it walked once, and cached
    // the leaf); every 4 KiB miss since (the other 511 pages, and the
    // loads of pages whose 4 KiB entries the stores' evicted) came from
    // the 2 MiB entry, with no walk.
    assert_eq!(d.translator_walks, 0, "{d}");
    assert!(d.translator_huge_hits >= 511, "{d}");
    // Split it: one page read-only; then unmap the last quarter.
    mm.mprotect(a + 100 * PAGE_SIZE, PAGE_SIZE, Prot::READ)
        .unwrap();
    assert_eq!(mm.stats().thp_split_pmd, 1);
    assert_eq!(mm.anon_huge_pages(a), Some(0));
    let e = t.store::<u64>(a + 100 * PAGE_SIZE + 8, 0).unwrap_err();
    assert_eq!(e.kind, aspace::FaultError::AccessDenied);
    mm.munmap(a + 384 * PAGE_SIZE, 128 * PAGE_SIZE).unwrap();
    for pg in 0..512 {
        let r = t.load::<u64>(a + pg * PAGE_SIZE + 8);
        if pg < 384 {
            assert_eq!(r.unwrap(), 0x1000 + pg, "page {pg} after the split");
        } else {
            let e = r.unwrap_err();
            assert_eq!(e.kind, aspace::FaultError::NoMapping, "page {pg}");
        }
    }
    // The split table's pages are walked again one by one (no leaf).
    let before = mm.stats();
    let mut t2 = mm.translator();
    for pg in 0..4 {
        t2.load::<u64>(a + pg * PAGE_SIZE).unwrap();
    }
    let d = mm.stats() - before;
    assert_eq!((d.translator_walks, d.translator_huge_hits), (4, 0), "{d}");
}

/// What a write-protected huge page went through: `AnonHugePages` of its
/// VMA after `UFFDIO_WRITEPROTECT` over the whole 2 MiB, while a write
/// into it waits for the handler, and after the handler un-protects the
/// whole 2 MiB; the fault's offset in the page; whether the write landed
/// (and only after the resolution).
#[derive(Debug, PartialEq, Eq)]
struct WpHuge {
    after_wp: u64,
    waiting: u64,
    after: u64,
    fault_off: u64,
    written: bool,
}

/// The byte a [`WpHuge`] run's waiting write stores, and where.
const WP_OFF: u64 = 5 * PAGE_SIZE + 100;

fn aspace_wp_huge() -> WpHuge {
    use aspace::uffd::{Event, FaultKind, ReadWrite, RegisterMode};
    let mm = space(ThpMode::Madvise);
    let a = huge_region(&mm, HUGE);
    fill(&mm, a, HUGE);
    assert_eq!(mm.stats().thp_fault_alloc, 1);
    let uffd = mm.userfaultfd();
    uffd.register_with_mode(a, HUGE, RegisterMode::WRITE_PROTECT)
        .unwrap();
    uffd.write_protect(a, HUGE).unwrap();
    let huge = || mm.anon_huge_pages(a).unwrap();
    let after_wp = huge();
    let (fault_off, waiting, before) = std::thread::scope(|s| {
        let w = s.spawn(|| mm.write(a + WP_OFF, &[0xee]).unwrap());
        let off = match uffd.read_event() {
            Event::Pagefault { kind, rw, addr, .. } => {
                assert_eq!((kind, rw), (FaultKind::WriteProtect, ReadWrite::Write));
                addr - a
            }
            e => panic!("unexpected {e:?}"),
        };
        let waiting = huge();
        let mut b = [0u8];
        mm.read(a + WP_OFF, &mut b).unwrap();
        uffd.remove_write_protection(a, HUGE, true).unwrap();
        w.join().unwrap();
        (off, waiting, b[0])
    });
    assert_eq!(mm.stats().thp_split_pmd, 0, "never split");
    let mut b = [0u8];
    mm.read(a + WP_OFF, &mut b).unwrap();
    // Writable whole again: more writes fault no more.
    let faults = mm.stats().faults();
    mm.write(a + 300 * PAGE_SIZE, &[1]).unwrap();
    assert_eq!(mm.stats().faults(), faults);
    assert!(uffd.try_read_event().is_none());
    WpHuge {
        after_wp,
        waiting,
        after: huge(),
        fault_off,
        written: before != 0xee && b[0] == 0xee,
    }
}

/// The same on the running kernel (its userfaultfd on a `MADV_HUGEPAGE`
/// page of this process); `None`, with the reason, where the kernel
/// gives no huge page or no userfaultfd.
#[cfg(target_os = "linux")]
fn kernel_wp_huge() -> Option<WpHuge> {
    const UFFDIO_API: libc::c_ulong = 0xc018_aa3f;
    const UFFDIO_REGISTER: libc::c_ulong = 0xc020_aa00;
    const UFFDIO_WRITEPROTECT: libc::c_ulong = 0xc018_aa06;
    const MODE_WP: u64 = 2;
    const EVENT_PAGEFAULT: u8 = 0x12;
    const PAGEFAULT_FLAG_WP: u64 = 2;
    /// `AnonHugePages` of the VMA of this process holding `addr`, bytes.
    fn smaps_huge(addr: u64) -> u64 {
        let text = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in text.lines() {
            if let Some((range, _)) = line.split_once(' ') {
                if let Some((s, e)) = range.split_once('-') {
                    if let (Ok(s), Ok(e)) = (u64::from_str_radix(s, 16), u64::from_str_radix(e, 16))
                    {
                        inside = (s..e).contains(&addr);
                        continue;
                    }
                }
            }
            if let Some(kb) = line.strip_prefix("AnonHugePages:").filter(|_| inside) {
                return kb
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .unwrap()
                    << 10;
            }
        }
        panic!("no VMA holds {addr:#x}")
    }
    let ioctl = |fd: i32, req: libc::c_ulong, arg: &mut [u64]| {
        // SAFETY: `arg` is the ioctl's argument struct (all u64 fields).
        unsafe { libc::ioctl(fd, req, arg.as_mut_ptr()) }
    };
    // SAFETY: a fresh private anonymous mapping, ours alone.
    let m = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            2 * HUGE as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(m, libc::MAP_FAILED);
    let a = (m as u64).next_multiple_of(HUGE);
    let p = a as *mut u8;
    // SAFETY: `[a, a + HUGE)` is inside the mapping.
    unsafe {
        assert_eq!(
            libc::madvise(p.cast(), HUGE as usize, libc::MADV_HUGEPAGE),
            0
        );
        for pg in 0..HUGE / PAGE_SIZE {
            p.add((pg * PAGE_SIZE) as usize).write_volatile(1);
        }
    }
    let unmap = || {
        // SAFETY: our mapping.
        unsafe { libc::munmap(m, 2 * HUGE as usize) };
    };
    if smaps_huge(a) != HUGE {
        eprintln!("the kernel gave no huge page here: skipped");
        unmap();
        return None;
    }
    // SAFETY: plain syscall.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC) } as i32;
    if fd < 0 {
        eprintln!("userfaultfd unavailable: skipped");
        unmap();
        return None;
    }
    assert_eq!(ioctl(fd, UFFDIO_API, &mut [0xaa, 0, 0]), 0);
    assert_eq!(ioctl(fd, UFFDIO_REGISTER, &mut [a, HUGE, MODE_WP, 0]), 0);
    assert_eq!(ioctl(fd, UFFDIO_WRITEPROTECT, &mut [a, HUGE, 1]), 0);
    let after_wp = smaps_huge(a);
    let (fault_off, waiting, before) = std::thread::scope(|s| {
        let at = a + WP_OFF;
        // SAFETY: inside the mapping; the store waits for the resolution.
        let w = s.spawn(move || unsafe { (at as *mut u8).write_volatile(0xee) });
        let mut msg = [0u64; 4];
        // SAFETY: reads one 32-byte uffd_msg into `msg`.
        let n = unsafe { libc::read(fd, msg.as_mut_ptr().cast(), 32) };
        assert_eq!(n, 32);
        assert_eq!(msg[0] as u8, EVENT_PAGEFAULT);
        assert_ne!(msg[1] & PAGEFAULT_FLAG_WP, 0, "a write-protect fault");
        let waiting = smaps_huge(a);
        // SAFETY: inside the mapping.
        let before = unsafe { (at as *const u8).read_volatile() };
        assert_eq!(ioctl(fd, UFFDIO_WRITEPROTECT, &mut [a, HUGE, 0]), 0);
        w.join().unwrap();
        (msg[2] - a, waiting, before)
    });
    // SAFETY: inside the mapping.
    let now = unsafe { ((a + WP_OFF) as *const u8).read_volatile() };
    let r = WpHuge {
        after_wp,
        waiting,
        after: smaps_huge(a),
        fault_off,
        written: before != 0xee && now == 0xee,
    };
    // SAFETY: our descriptor.
    unsafe { libc::close(fd) };
    unmap();
    Some(r)
}

/// A huge page write-protected whole for a userfault handler stays one
/// huge page through the protection, the write fault the handler gets,
/// and the un-protection of the whole 2 MiB, as on the running kernel.
#[test]
fn a_write_protected_huge_page_is_kept_whole_as_the_kernel_keeps_it() {
    let ours = aspace_wp_huge();
    let want = WpHuge {
        after_wp: HUGE,
        waiting: HUGE,
        after: HUGE,
        fault_off: WP_OFF & !(PAGE_SIZE - 1),
        written: true,
    };
    assert_eq!(ours, want);
    #[cfg(target_os = "linux")]
    if let Some(kernel) = kernel_wp_huge() {
        assert_eq!(ours, kernel, "aspace against the kernel");
    }
}

/// Populating a range of huge zero pages steps over each huge page whole,
/// as GUP does: one fault per 2 MiB, where a fault per 4 KiB made a
/// populate of terabytes (no frame used, one table per GiB) run for
/// minutes before the budget ended it. Read populates of 64 MiB through
/// `MADV_POPULATE_READ`, mlock and `MAP_POPULATE` each fault 32 times.
///
/// Faults here count those that found the page present (spurious).
///
/// Catches: `a = self.populated_past(a)` made `a += PAGE_SIZE` in the
/// populate loop every kind shares (`AddressSpace::populate_with`,
/// src/mm/populate.rs), or `populated_past` stepping a page: 16,384
/// faults.
#[test]
fn populating_huge_zero_pages_faults_once_per_huge_page() {
    let len = 64 << 20;
    let huge_pages = len / HUGE;
    let faults = |mm: &AddressSpace, what: &str, f: &dyn Fn(&AddressSpace, u64)| {
        let a = huge_region(mm, len);
        let before = calls(mm);
        f(mm, a);
        let n = calls(mm) - before;
        assert_eq!(n, huge_pages, "{what}: faults");
        assert_eq!(mm.frames_used(), 0, "{what}: only huge zero pages");
        mm.munmap(a, len).unwrap();
    };
    let mm = space(ThpMode::Madvise);
    faults(&mm, "MADV_POPULATE_READ", &|mm, a| {
        mm.madvise(a, len, Advice::PopulateRead).unwrap()
    });
    let ro = |mm: &AddressSpace, a: u64| mm.mprotect(a, len, Prot::READ).unwrap();
    faults(&mm, "mlock", &|mm, a| {
        ro(mm, a);
        mm.set_memlock_limit(u64::MAX);
        mm.mlock(a, len).unwrap();
    });
    let mm = space(ThpMode::Always);
    let populate = MapFlags::PRIVATE | MapFlags::ANONYMOUS | MapFlags::POPULATE;
    let before = calls(&mm);
    let a = mm.mmap(0, len + HUGE, Prot::READ, populate).unwrap();
    let n = calls(&mm) - before;
    // Placed 2 MiB-aligned (thp_placement); pages before the first huge
    // page, if any, one by one.
    assert!(n <= huge_pages + 1 + 512, "MAP_POPULATE: {n} faults");
    assert_eq!(mm.frames_used(), 0);
    mm.munmap(a, len + HUGE).unwrap();
}

/// Faults resolved, those that found the page already present included.
fn calls(mm: &AddressSpace) -> u64 {
    let st = mm.stats();
    st.faults() + st.fault_spurious
}
