//! brk: growing, shrinking, data kept, and the old break on failure.

use super::*;

/// aspace only: the test process's own brk belongs to its allocator.
#[test]
fn brk_grows_shrinks_keeps_data_and_fails_with_the_old_break() {
    let cfg = Config::default();
    let start = cfg.brk_start;
    let mm = AddressSpace::new(cfg);
    assert_eq!(mm.brk(0), Ok(start));
    // Grow by 3 pages and a bit: the heap VMA is page-rounded.
    let b1 = start + 3 * PAGE + 5;
    assert_eq!(mm.brk(b1), Ok(b1));
    assert_eq!(mm.brk(0), Ok(b1));
    let heap: Vec<_> = mm.vmas().into_iter().filter(|v| v.heap).collect();
    assert_eq!(heap.len(), 1);
    assert_eq!((heap[0].start, heap[0].end), (start, start + 4 * PAGE));
    assert_eq!(heap[0].prot, Prot::READ | Prot::WRITE);
    assert!(
        mm.maps()
            .lines()
            .any(|l| l.starts_with(&format!("{start:08x}-")) && l.ends_with(" [heap]")),
        "{}",
        mm.maps()
    );
    mm.write(start, b"heap data").unwrap();
    mm.write(start + 3 * PAGE, b"top").unwrap();
    // Shrink: the data below the new break survives, the rest is unmapped.
    assert_eq!(mm.brk(start + PAGE), Ok(start + PAGE));
    let mut buf = [0u8; 9];
    mm.read(start, &mut buf).unwrap();
    assert_eq!(&buf, b"heap data");
    assert_eq!(
        mm.read(start + 2 * PAGE, &mut buf).map_err(|e| e.errno()),
        Err(EFAULT)
    );
    // Grow again: the new part reads zero.
    assert_eq!(mm.brk(start + 4 * PAGE), Ok(start + 4 * PAGE));
    let mut top = [1u8; 3];
    mm.read(start + 3 * PAGE, &mut top).unwrap();
    assert_eq!(top, [0, 0, 0]);
    // A mapping 10 pages above the start: brk must stay a page below it.
    let anon = MapFlags::PRIVATE | MapFlags::ANONYMOUS | MapFlags::FIXED;
    mm.mmap(start + 10 * PAGE, PAGE, Prot::READ, anon).unwrap();
    let before = mm.vmas();
    let cur = start + 4 * PAGE;
    assert_eq!(
        mm.brk(start + 20 * PAGE),
        Ok(cur),
        "into a mapping: old break"
    );
    assert_eq!(
        mm.brk(start + 9 * PAGE + 1),
        Ok(cur),
        "less than a page below it: old break"
    );
    assert_eq!(mm.vmas().len(), before.len());
    assert_eq!(mm.brk(start + 9 * PAGE), Ok(start + 9 * PAGE));
    // Below the start of the heap: unchanged.
    assert_eq!(mm.brk(start - PAGE), Ok(start + 9 * PAGE));
    // Back to the start: the heap VMA goes away.
    assert_eq!(mm.brk(start), Ok(start));
    assert!(mm
        .vmas()
        .iter()
        .all(|v| v.end <= start || v.start >= start + PAGE));
}
