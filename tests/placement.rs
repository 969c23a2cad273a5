//! Placement with Linux 6.7+'s 2 MiB alignment (`mm/placement.rs`,
//! `# Huge-page alignment`), compared with the running kernel.
//!
//! Every case runs first on the kernel, on a region of this process whose
//! placements are confined (`KernelTarget::confine_placements`: the free
//! space above the region is reserved around each placing call, so the
//! kernel's top-down search starts at the region's top), then on an aspace
//! whose mmap area ends at the same region's end. The expected addresses
//! are written out from the rule, so a kernel that placed otherwise fails
//! the case as aspace would. The region starts 3 pages past a 4 GiB
//! boundary: its top is no 2 MiB boundary, so an aligned placement is
//! never also the plain top-down fit.
//!
//! One test function runs every case in turn, and the binary has no other
//! test: while the fillers are in place, a mapping another thread made (a
//! test thread's stack, a large allocation) would land in the region.
//! The aspace-only placement cases (a fresh default space, `MAP_32BIT`,
//! the fallback when the padded length fits nowhere) are in
//! `tests/semantics/mmap.rs`.

mod common;

use common::ops::ObjMapping;
use common::*;

const MB: u64 = 1 << 20;
const HUGE: u64 = 2 * MB;
/// Interior pages: 64 MiB.
const PAGES: u64 = 16 * 1024;
/// The region's start past a 4 GiB boundary.
const PHASE: u64 = 3 * PAGE;
const MAP_STACK: u32 = 0x2_0000;
const MAP_DROPPABLE: u32 = 0x08;
const MADV_NOHUGEPAGE: i32 = 15;

fn align_down(a: u64) -> u64 {
    a & !(HUGE - 1)
}

/// Runs `f` on the confined kernel target (when the kernel can be used
/// here), then on a confined aspace target at the same addresses.
fn on_both_confined(f: impl Fn(&mut dyn Target)) -> bool {
    let kernel_region = KernelTarget::new_at_phase(PAGES, PHASE).map(|mut k| {
        k.confine_placements();
        f(&mut k);
        k.region()
    });
    let region = kernel_region.unwrap_or(Region::new(
        aspace_target::DEFAULT_REGION_START + PHASE,
        PAGES,
    ));
    f(&mut AspaceTarget::confined(region));
    kernel_region.is_some()
}

/// Asserts a placement, with the layout on failure.
#[track_caller]
fn expect(t: &mut dyn Target, what: &str, got: Res<u64>, want: u64) {
    let r = t.region();
    if got != Ok(want) {
        panic!(
            "[{}] {what}: got {:?}, want {want:#x} (region {:#x}-{:#x}, top {:#x})\n{}",
            t.name(),
            got.map(|a| format!("{a:#x}")),
            r.lo,
            r.hi,
            r.hi,
            dump(t)
        );
    }
}

/// Maps `[start, end)` read-only shared (merges with nothing): a wall
/// that carves the interior into holes.
fn wall(t: &mut dyn Target, start: u64, end: u64) {
    let got = t.mmap(start, end - start, PROT_READ, SHARED_ANON | MAP_FIXED);
    assert_eq!(got, Ok(start), "[{}] wall {start:#x}-{end:#x}", t.name());
}

/// Unmaps the whole interior.
fn clear(t: &mut dyn Target) {
    let r = t.region();
    assert_eq!(t.munmap(r.lo, r.hi - r.lo), Ok(()), "[{}] clear", t.name());
}

/// No hint, an empty interior: which mappings are aligned, by length and
/// flags; hints (used, unusable, rounded to none).
fn lengths(t: &mut dyn Target) {
    let r = t.region();
    let top = r.hi;
    assert_ne!(top % HUGE, 0, "the region's top must be no 2 MiB boundary");
    let aligned = |len: u64| align_down(top - page_align(len).unwrap());
    let plain = |len: u64| top - page_align(len).unwrap();
    // (what, hint, length, prot, flags, where).
    let cases: [(&str, u64, u64, u32, u32, u64); 14] = [
        ("4 KiB private", 0, PAGE, RW, ANON, plain(PAGE)),
        ("1 MiB private", 0, MB, RW, ANON, plain(MB)),
        ("2 MiB private", 0, HUGE, RW, ANON, aligned(HUGE)),
        (
            "2 MiB less 100 bytes",
            0,
            HUGE - 100,
            RW,
            ANON,
            aligned(HUGE),
        ),
        (
            "2 MiB and a page",
            0,
            HUGE + PAGE,
            RW,
            ANON,
            plain(HUGE + PAGE),
        ),
        ("4 MiB private", 0, 2 * HUGE, RW, ANON, aligned(2 * HUGE)),
        (
            "6 MiB PROT_NONE",
            0,
            3 * HUGE,
            PROT_NONE,
            ANON,
            aligned(3 * HUGE),
        ),
        ("2 MiB shared", 0, HUGE, RW, SHARED_ANON, plain(HUGE)),
        (
            "2 MiB MAP_STACK",
            0,
            HUGE,
            RW,
            ANON | MAP_STACK,
            aligned(HUGE),
        ),
        (
            "2 MiB MAP_GROWSDOWN",
            0,
            HUGE,
            RW,
            ANON | MAP_GROWSDOWN,
            aligned(HUGE),
        ),
        (
            "2 MiB MAP_NORESERVE",
            0,
            HUGE,
            RW,
            ANON | MAP_NORESERVE,
            aligned(HUGE),
        ),
        (
            "2 MiB MAP_DROPPABLE",
            0,
            HUGE,
            RW,
            MAP_DROPPABLE | MAP_ANONYMOUS,
            aligned(HUGE),
        ),
        (
            "2 MiB MAP_POPULATE",
            0,
            HUGE,
            RW,
            ANON | MAP_POPULATE,
            aligned(HUGE),
        ),
        // A hint that rounds down to page 0 is no hint.
        ("2 MiB private, hint 0x5", 5, HUGE, RW, ANON, aligned(HUGE)),
    ];
    for (what, hint, len, prot, flags, want) in cases {
        let got = t.mmap(hint, len, prot, flags);
        expect(t, what, got, want);
        assert_eq!(t.munmap(want, len), Ok(()));
    }
    // A hint that cannot be used means the plain search, 2 MiB or not.
    wall(t, r.lo, r.lo + PAGE);
    let got = t.mmap(r.lo, HUGE, RW, ANON);
    expect(t, "2 MiB, hint on a mapping", got, plain(HUGE));
    assert_eq!(t.munmap(plain(HUGE), HUGE), Ok(()));
    // A usable hint is kept, unaligned.
    let h = r.lo + 5 * PAGE;
    let got = t.mmap(h, HUGE, RW, ANON);
    expect(t, "2 MiB, free hint", got, h);
    clear(t);
}

/// Holes: one that fits the mapping exactly is skipped for a larger one
/// below; one that fits the padded length takes the highest boundary in
/// it.
fn holes(t: &mut dyn Target) {
    let r = t.region();
    let b = align_down(r.hi);
    assert!(r.hi - b > PAGE, "room for a page above the top boundary");
    // An exact 2 MiB hole on boundaries, a wall below it, free below.
    wall(t, b, r.hi);
    wall(t, b - 2 * HUGE, b - HUGE);
    let got = t.mmap(0, HUGE, RW, ANON);
    expect(t, "2 MiB, exact hole above", got, b - 3 * HUGE);
    assert_eq!(t.munmap(b - 3 * HUGE, HUGE), Ok(()));
    let got = t.mmap(0, HUGE, RW, SHARED_ANON);
    expect(t, "2 MiB shared, exact hole above", got, b - HUGE);
    let got = t.mmap(0, MB, RW, ANON);
    expect(t, "1 MiB, below a filled hole", got, b - 2 * HUGE - MB);
    clear(t);
    // A hole of exactly 2 MiB more than the mapping: its upper boundary.
    wall(t, b, r.hi);
    wall(t, b - 3 * HUGE, b - 2 * HUGE);
    let got = t.mmap(0, HUGE, RW, ANON);
    expect(t, "2 MiB in a 4 MiB hole", got, b - HUGE);
    assert_eq!(t.munmap(b - HUGE, HUGE), Ok(()));
    let got = t.mmap(0, 2 * HUGE, RW, ANON);
    expect(t, "4 MiB, 4 MiB hole above", got, b - 5 * HUGE);
    clear(t);
    // A page short of the padded length: skipped.
    wall(t, b, r.hi);
    wall(t, b - 3 * HUGE, b - 2 * HUGE + PAGE);
    let got = t.mmap(0, HUGE, RW, ANON);
    expect(t, "2 MiB, hole a page short", got, b - 4 * HUGE);
    assert_eq!(t.munmap(b - 4 * HUGE, HUGE), Ok(()));
    let got = t.mmap(0, HUGE, RW, SHARED_ANON);
    expect(t, "2 MiB shared, hole a page short", got, b - HUGE);
    clear(t);
    // Unaligned ends, room for the padded length: the boundary in it.
    wall(t, b + PAGE, r.hi);
    wall(t, b - 3 * HUGE, b - 2 * HUGE + PAGE);
    let got = t.mmap(0, HUGE, RW, ANON);
    expect(t, "2 MiB, unaligned 4 MiB hole", got, b - HUGE);
    clear(t);
}

/// mremap moves: the new length decides, as for mmap, for private
/// anonymous memory whatever its flags; shared memory and memfds are not
/// aligned.
fn moves(t: &mut dyn Target) {
    let r = t.region();
    let top = r.hi;
    let at = r.lo + 4 * HUGE + 5 * PAGE;
    // A 1 MiB mapping that cannot grow in place.
    let small = |t: &mut dyn Target, prot: u32, flags: u32| {
        assert_eq!(t.mmap(at, MB, prot, flags | MAP_FIXED), Ok(at));
        wall(t, at + MB, at + MB + PAGE);
    };
    let cases: [(&str, u32, u64, u64); 3] = [
        ("1 -> 2 MiB", ANON, HUGE, align_down(top - HUGE)),
        ("1 -> 3 MiB", ANON, 3 * MB, top - 3 * MB),
        (
            "1 -> 2 MiB MAP_STACK",
            ANON | MAP_STACK,
            HUGE,
            align_down(top - HUGE),
        ),
    ];
    for (what, flags, new_len, want) in cases {
        small(t, RW, flags);
        let got = t.mremap(at, MB, new_len, MREMAP_MAYMOVE, 0);
        expect(t, what, got, want);
        clear(t);
    }
    small(t, RW, ANON);
    assert_eq!(t.madvise(at, MB, MADV_NOHUGEPAGE), Ok(()));
    let got = t.mremap(at, MB, HUGE, MREMAP_MAYMOVE, 0);
    expect(
        t,
        "1 -> 2 MiB, MADV_NOHUGEPAGE",
        got,
        align_down(top - HUGE),
    );
    clear(t);
    small(t, RW, SHARED_ANON);
    let got = t.mremap(at, MB, HUGE, MREMAP_MAYMOVE, 0);
    expect(t, "1 -> 2 MiB shared", got, top - HUGE);
    clear(t);
    // DONTUNMAP with no new address is a placement like any other.
    assert_eq!(t.mmap(at, HUGE, RW, ANON | MAP_FIXED), Ok(at));
    let got = t.mremap(at, HUGE, HUGE, MREMAP_MAYMOVE | MREMAP_DONTUNMAP, 0);
    expect(t, "2 MiB DONTUNMAP", got, align_down(top - HUGE));
    clear(t);
    // A memfd's private mapping.
    assert_eq!(t.obj_truncate(0, 8 * MB), Ok(()));
    let m = ObjMapping {
        addr: at,
        len: MB,
        prot: PROT_READ,
        flags: MAP_PRIVATE | MAP_FIXED,
        obj: 0,
        off: 0,
    };
    assert_eq!(t.mmap_obj(m), Ok(at));
    wall(t, at + MB, at + MB + PAGE);
    let got = t.mremap(at, MB, HUGE, MREMAP_MAYMOVE, 0);
    expect(t, "memfd 1 -> 2 MiB", got, top - HUGE);
    clear(t);
    // The exact hole is skipped by moves too.
    let b = align_down(r.hi);
    wall(t, b, r.hi);
    wall(t, b - 2 * HUGE, b - HUGE);
    small(t, RW, ANON);
    let got = t.mremap(at, MB, HUGE, MREMAP_MAYMOVE, 0);
    expect(t, "1 -> 2 MiB, exact hole above", got, b - 3 * HUGE);
    clear(t);
}

/// memfds (tmpfs without huge pages) are never aligned.
fn memfds(t: &mut dyn Target) {
    let top = t.region().hi;
    assert_eq!(t.obj_truncate(1, 8 * MB), Ok(()));
    for (what, flags, len, off) in [
        ("memfd shared 2 MiB", MAP_SHARED, HUGE, 0),
        ("memfd private 2 MiB", MAP_PRIVATE, HUGE, 0),
        (
            "memfd private 4 MiB from 4 KiB",
            MAP_PRIVATE,
            2 * HUGE,
            PAGE,
        ),
    ] {
        let m = ObjMapping {
            addr: 0,
            len,
            prot: PROT_READ,
            flags,
            obj: 1,
            off,
        };
        let got = t.mmap_obj(m);
        expect(t, what, got, top - len);
        assert_eq!(t.munmap(top - len, len), Ok(()));
    }
}

/// Where Linux's file rule puts `len` bytes of a file from `off` at the
/// top of a hole ending at `end` with room for the padded length:
/// congruent to `off` modulo 2 MiB, the highest such address.
fn file_rule(end: u64, len: u64, off: u64) -> u64 {
    let room = end - len - HUGE;
    match off.wrapping_sub(room) & (HUGE - 1) {
        0 => room + HUGE,
        up => room + up,
    }
}

/// Host files: on ext2/3/4 and XFS aligned when the mapped range covers
/// a whole aligned 2 MiB of the file (any length), at the offset's
/// position in its 2 MiB; a hint kept only if the padded length fits
/// there. On tmpfs never.
fn host_files(t: &mut dyn Target, file: &std::fs::File, name: &str, aligns: bool) {
    let r = t.region();
    let top = r.hi;
    let map = |t: &mut dyn Target, addr, len, off| {
        let m = ObjMapping {
            addr,
            len,
            prot: PROT_READ,
            flags: MAP_PRIVATE,
            obj: 0,
            off,
        };
        t.mmap_file(m, file, name)
    };
    let rule = |len: u64, off: u64, covers: bool| {
        if aligns && covers {
            file_rule(top, len, off)
        } else {
            top - len
        }
    };
    for (what, len, off, covers) in [
        ("file 2 MiB from 0", HUGE, 0, true),
        ("file 3 MiB from 0", 3 * MB, 0, true),
        ("file 4 MiB from 4 KiB", 2 * HUGE, PAGE, true),
        ("file 4 MiB from 1 MiB", 2 * HUGE, MB, true),
        ("file 2 MiB from 2 MiB", HUGE, HUGE, true),
        ("file 2 MiB from 4 KiB", HUGE, PAGE, false),
        ("file 3 MiB from 4 KiB", 3 * MB, PAGE, false),
        ("file 1 MiB from 0", MB, 0, false),
    ] {
        let want = rule(len, off, covers);
        let got = map(t, 0, len, off);
        expect(t, &format!("{what} ({name})"), got, want);
        assert_eq!(t.munmap(want, len), Ok(()));
    }
    // A hint with room for the mapping but not for the padded length.
    let h = r.lo + 8 * HUGE + PAGE;
    wall(t, h + HUGE + PAGE, h + HUGE + 2 * PAGE);
    let want = if aligns { file_rule(top, HUGE, 0) } else { h };
    let got = map(t, h, HUGE, 0);
    expect(t, &format!("file 2 MiB, tight hint ({name})"), got, want);
    clear(t);
}

/// A host file of 8 MiB in `dir`, removed on drop.
struct TempFile(std::path::PathBuf, std::fs::File);

impl TempFile {
    fn new(dir: &std::path::Path) -> Option<TempFile> {
        let path = dir.join(format!("aspace-placement-{}", std::process::id()));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .ok()?;
        file.set_len(8 * MB).ok()?;
        Some(TempFile(path, file))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The file system type of `dir` (`statfs`'s `f_type`).
fn fs_type(dir: &std::path::Path) -> Option<i64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: an all-zero statfs is a valid value of the C struct.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path, `st` is writable.
    (unsafe { libc::statfs(c.as_ptr(), &mut st) } == 0).then_some(st.f_type as i64)
}

#[test]
fn placement_matches_the_kernel() {
    let ran = on_both_confined(lengths);
    on_both_confined(holes);
    on_both_confined(moves);
    on_both_confined(memfds);
    // Host files: the temporary directory (ext4 here) and /dev/shm (tmpfs).
    const EXT: i64 = 0xEF53;
    const XFS: i64 = 0x5846_5342;
    const TMPFS: i64 = 0x0102_1994;
    let mut file_systems = 0;
    for dir in [std::env::temp_dir(), "/dev/shm".into()] {
        let aligns = match fs_type(&dir) {
            Some(EXT | XFS) => true,
            Some(TMPFS) => false,
            _ => continue,
        };
        let Some(tf) = TempFile::new(&dir) else {
            continue;
        };
        let name = tf.0.to_string_lossy().into_owned();
        on_both_confined(|t| host_files(t, &tf.1, &name, aligns));
        file_systems += 1;
    }
    eprintln!(
        "placement: kernel side {}, host files on {file_systems} file system(s)",
        if ran { "compared" } else { "skipped" }
    );
}
