//! File objects (`Memfd::from_file`) and objects shared between spaces
//! made independently: a memory object made with `Memfd::new` maps into
//! any `AddressSpace::new` space; a sparse 1 GiB host file touched at one
//! page reads one page; 100 spaces mapping one library read it once and
//! share one copy; `MAP_SHARED` writes reach the host file after
//! `msync(MS_SYNC)`, munmap and drop; the handle's access mode (EACCES,
//! EBADF) and SIGBUS past the end of the file compared with the running
//! kernel on a real descriptor; maps lines of file mappings (device,
//! inode, path) against the kernel's; `memfd_create` and
//! `Read`/`Write`/`Seek`.

use aspace::{
    Access, AddressSpace, Config, Error, FaultError, FrameAllocator, MapFlags, Memfd, MemfdFlags,
    MsyncFlags, Prot,
};
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

const PAGE: u64 = 4096;
const RW: Prot = Prot::READ.union(Prot::WRITE);

/// A host file in the temporary directory, removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn new(tag: &str, bytes: &[u8]) -> TempFile {
        let p = std::env::temp_dir().join(format!("aspace-{}-{tag}", std::process::id()));
        std::fs::write(&p, bytes).unwrap();
        TempFile(p)
    }

    fn open(&self, write: bool) -> File {
        OpenOptions::new()
            .read(true)
            .write(write)
            .open(&self.0)
            .unwrap()
    }

    fn bytes(&self) -> Vec<u8> {
        std::fs::read(&self.0).unwrap()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `n` bytes of a pattern that differs on every page.
fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i / 7 + i / 4096 * 31) as u8 | 1).collect()
}

#[test]
fn objects_and_spaces_made_apart_map_each_other() {
    // Before the shared physical memory this was a bare EINVAL.
    let m = Memfd::new("apart", 2 * PAGE).unwrap();
    m.write_at(b"made apart", 100).unwrap();
    let a = AddressSpace::new(Config::default());
    let b = AddressSpace::new(Config::default());
    let pa = a.mmap_fd(0, 2 * PAGE, RW, MapFlags::SHARED, &m, 0).unwrap();
    let pb = b.mmap_fd(0, 2 * PAGE, RW, MapFlags::SHARED, &m, 0).unwrap();
    let mut buf = [0u8; 10];
    a.read(pa + 100, &mut buf).unwrap();
    assert_eq!(&buf, b"made apart");
    b.write(pb + PAGE, b"from b").unwrap();
    let mut six = [0u8; 6];
    a.read(pa + PAGE, &mut six).unwrap();
    assert_eq!(&six, b"from b", "one copy of the page for both spaces");
    m.read_at(&mut six, PAGE).unwrap();
    assert_eq!(&six, b"from b");
    // The pages are the object's: charged to it, not to the spaces.
    assert_eq!(m.frame_pool().used(), 2);
    assert_eq!((a.frames_used(), b.frames_used()), (0, 0));
    // A private copy is the writer's.
    let pp = a.mmap_fd(0, PAGE, RW, MapFlags::PRIVATE, &m, 0).unwrap();
    a.write(pp, b"mine").unwrap();
    assert_eq!((a.frames_used(), m.frame_pool().used()), (1, 2));
    // The object's pages outlive every handle while mapped, and stay
    // charged to its (dropped) allocator until they go.
    let pool = m.frame_pool().clone();
    drop(m);
    a.read(pa + PAGE, &mut six).unwrap();
    assert_eq!(&six, b"from b");
    drop((a, b));
    assert_eq!(
        pool.used(),
        0,
        "freed through the spaces, uncharged from the object"
    );
    // Physical memories of their own do not share: a clear error.
    let own = Arc::new(FrameAllocator::new(1 << 20, true));
    let apart = Memfd::new_in(&own, "own", PAGE).unwrap();
    let mm = AddressSpace::new(Config::default());
    let r = mm.mmap_fd(0, PAGE, RW, MapFlags::SHARED, &apart, 0);
    assert_eq!(r, Err(Error::CrossDevice));
    // A sibling allocator shares its physical memory, with its own budget.
    let sib = Arc::new(own.sibling(1 << 20));
    let on_own = AddressSpace::with_pool(Config::default(), sib);
    let p = on_own
        .mmap_fd(0, PAGE, RW, MapFlags::SHARED, &apart, 0)
        .unwrap();
    on_own.write(p, b"x").unwrap();
}

#[test]
fn touching_one_page_of_a_sparse_gib_file_reads_one_page() {
    let f = TempFile::new("sparse", b"");
    let file = f.open(true);
    file.set_len(1 << 30).unwrap();
    file.write_all_at(b"needle", 300 * PAGE + 8).unwrap();
    let obj = Memfd::from_file(&file, "sparse").unwrap();
    assert_eq!(obj.len(), 1 << 30);
    let mm = AddressSpace::new(Config::default());
    let a = mm
        .mmap_fd(0, 1 << 30, Prot::READ, MapFlags::PRIVATE, &obj, 0)
        .unwrap();
    let mut buf = [0u8; 6];
    mm.read(a + 300 * PAGE + 8, &mut buf).unwrap();
    assert_eq!(&buf, b"needle");
    assert_eq!(
        obj.file_stats().pages_read,
        1,
        "one page read from the host"
    );
    assert_eq!(obj.frame_pool().used(), 1, "one page in the page cache");
    assert_eq!(
        mm.frames_used(),
        0,
        "read-only: the object's page is mapped"
    );
}

#[test]
fn hundred_spaces_share_one_copy_of_a_library() {
    const PAGES: u64 = 16;
    let image = pattern((PAGES * PAGE) as usize - 100);
    let f = TempFile::new("lib", &image);
    let lib = Memfd::from_file(&f.open(false), "libfoo.so").unwrap();
    let spaces: Vec<AddressSpace> = (0..100)
        .map(|_| AddressSpace::new(Config::default()))
        .collect();
    let rx = Prot::READ | Prot::EXEC;
    for mm in &spaces {
        let a = mm
            .mmap_fd(0, PAGES * PAGE, rx, MapFlags::PRIVATE, &lib, 0)
            .unwrap();
        let mut got = vec![0u8; (PAGES * PAGE) as usize];
        mm.read(a, &mut got).unwrap();
        assert_eq!(&got[..image.len()], &image[..]);
        assert!(got[image.len()..].iter().all(|&b| b == 0), "zeros past EOF");
        assert_eq!(mm.frames_used(), 0);
    }
    assert_eq!(lib.file_stats().pages_read, PAGES, "each page read once");
    assert_eq!(lib.frame_pool().used(), PAGES, "one copy of each page");
}

#[test]
fn shared_writes_reach_the_host_after_msync_munmap_and_drop() {
    let f = TempFile::new("shared", &pattern(3 * PAGE as usize));
    let obj = Memfd::from_file(&f.open(true), "shared").unwrap();
    let mm = AddressSpace::new(Config::default());
    let a = mm
        .mmap_fd(0, 3 * PAGE, RW, MapFlags::SHARED, &obj, 0)
        .unwrap();
    let p = mm
        .mmap_fd(0, 3 * PAGE, RW, MapFlags::PRIVATE, &obj, 0)
        .unwrap();
    mm.write(a + 10, b"synced").unwrap();
    mm.write(p + PAGE, b"private").unwrap();
    let mut buf = [0u8; 6];
    obj.read_at(&mut buf, 10).unwrap();
    assert_eq!(&buf, b"synced", "a shared store is the object's at once");
    mm.msync(a, PAGE, MsyncFlags::SYNC).unwrap();
    assert_eq!(&f.bytes()[10..16], b"synced", "after msync(MS_SYNC)");
    // munmap of the shared mapping writes its range back.
    mm.write(a + 2 * PAGE, b"unmapped").unwrap();
    mm.munmap(a, 3 * PAGE).unwrap();
    assert_eq!(&f.bytes()[2 * PAGE as usize..][..8], b"unmapped");
    // A write by offset reaches the host when the object drops.
    obj.write_at(b"dropped", PAGE + 5).unwrap();
    drop(obj);
    mm.munmap(p, 3 * PAGE).unwrap();
    let host = f.bytes();
    assert_eq!(&host[PAGE as usize + 5..][..7], b"dropped");
    assert!(
        !host.windows(7).any(|w| w == b"private"),
        "a private copy never reaches the file"
    );
    assert_eq!(host.len(), 3 * PAGE as usize, "the size is kept");
}

/// The errno of a raw mmap call, or the address.
fn kernel_mmap(len: u64, prot: i32, flags: i32, fd: i32) -> Result<*mut libc::c_void, i32> {
    // SAFETY: a new mapping at an address of the kernel's choice.
    let p = unsafe { libc::mmap(core::ptr::null_mut(), len as usize, prot, flags, fd, 0) };
    if p == libc::MAP_FAILED {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap())
    } else {
        Ok(p)
    }
}

fn kernel_munmap(p: *mut libc::c_void, len: u64) {
    // SAFETY: `p` is a mapping of `len` bytes made by kernel_mmap.
    unsafe { libc::munmap(p, len as usize) };
}

fn kernel_mprotect(p: *mut libc::c_void, len: u64, prot: i32) -> Result<(), i32> {
    // SAFETY: `p` is our own mapping of `len` bytes.
    if unsafe { libc::mprotect(p, len as usize, prot) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap())
    }
}

#[test]
fn access_modes_match_the_kernel() {
    let f = TempFile::new("mode", &pattern(2 * PAGE as usize));
    let ro = f.open(false);
    let wo = OpenOptions::new().write(true).open(&f.0).unwrap();
    let obj = Memfd::from_file(&ro, "mode").unwrap();
    let wobj = Memfd::from_file(&wo, "mode").unwrap();
    let mm = AddressSpace::new(Config::default());
    let (pr, pw) = (libc::PROT_READ, libc::PROT_READ | libc::PROT_WRITE);
    let (sh, pv) = (libc::MAP_SHARED, libc::MAP_PRIVATE);
    let ours = |o: &Memfd, prot: Prot, flags: MapFlags| {
        mm.mmap_fd(0, 2 * PAGE, prot, flags, o, 0)
            .map_err(|e| e.errno())
    };
    // Shared writable mapping of a read-only handle: EACCES.
    let k = kernel_mmap(2 * PAGE, pw, sh, ro.as_raw_fd());
    assert_eq!(k.map(|_| ()), Err(libc::EACCES));
    assert_eq!(ours(&obj, RW, MapFlags::SHARED), Err(libc::EACCES));
    // Shared read-only mapping: allowed, but mprotect(PROT_WRITE) is
    // EACCES (no VM_MAYWRITE).
    let k = kernel_mmap(2 * PAGE, pr, sh, ro.as_raw_fd()).unwrap();
    let a = ours(&obj, Prot::READ, MapFlags::SHARED).unwrap();
    let kr = kernel_mprotect(k, 2 * PAGE, pw);
    let or = mm.mprotect(a, 2 * PAGE, RW).map_err(|e| e.errno());
    assert_eq!((kr, or), (Err(libc::EACCES), Err(libc::EACCES)));
    kernel_munmap(k, 2 * PAGE);
    // Private writable mapping of a read-only handle: allowed, and
    // written copy-on-write (the object keeps its bytes).
    let k = kernel_mmap(2 * PAGE, pw, pv, ro.as_raw_fd()).unwrap();
    let p = ours(&obj, RW, MapFlags::PRIVATE).unwrap();
    mm.write(p, b"cow").unwrap();
    kernel_munmap(k, 2 * PAGE);
    let mut b = [0u8; 3];
    obj.read_at(&mut b, 0).unwrap();
    assert_eq!(&b[..], &pattern(3)[..]);
    // Any mapping of a write-only handle: EACCES.
    for (kp, kf, op, of) in [
        (pr, pv, Prot::READ, MapFlags::PRIVATE),
        (pw, sh, RW, MapFlags::SHARED),
    ] {
        let k = kernel_mmap(PAGE, kp, kf, wo.as_raw_fd());
        assert_eq!(k.map(|_| ()), Err(libc::EACCES));
        assert_eq!(ours(&wobj, op, of), Err(libc::EACCES));
    }
    // Copies by offset: EBADF as pread/pwrite on those descriptors.
    let mut byte = [0u8; 1];
    // SAFETY: a one-byte buffer we own.
    let kr = unsafe { libc::pread(wo.as_raw_fd(), byte.as_mut_ptr().cast(), 1, 0) };
    assert_eq!(kr, -1);
    assert_eq!(wobj.read_at(&mut byte, 0), Err(Error::BadFd));
    // SAFETY: as above.
    let kw = unsafe { libc::pwrite(ro.as_raw_fd(), byte.as_ptr().cast(), 1, 0) };
    assert_eq!(
        (kw, std::io::Error::last_os_error().raw_os_error()),
        (-1, Some(libc::EBADF))
    );
    assert_eq!(obj.write_at(&byte, 0), Err(Error::BadFd));
}

/// Reads one byte of our own memory through `/proc/self/mem`: the
/// kernel's access there faults like a load but fails with EIO instead of
/// raising SIGBUS.
fn kernel_load(addr: u64) -> Result<u8, i32> {
    let mem = File::open("/proc/self/mem").unwrap();
    let mut b = [0u8; 1];
    mem.read_exact_at(&mut b, addr)
        .map(|_| b[0])
        .map_err(|e| e.raw_os_error().unwrap_or(0))
}

#[test]
fn sigbus_past_the_end_of_the_file_matches_the_kernel() {
    // 5000 bytes: the second page is partial (readable, zeros past the
    // end), the third is past the end (SIGBUS).
    let bytes = pattern(5000);
    let f = TempFile::new("eof", &bytes);
    let file = f.open(false);
    let obj = Memfd::from_file(&file, "eof").unwrap();
    let mm = AddressSpace::new(Config::default());
    let k = kernel_mmap(
        3 * PAGE,
        libc::PROT_READ,
        libc::MAP_SHARED,
        file.as_raw_fd(),
    )
    .unwrap();
    let a = mm
        .mmap_fd(0, 3 * PAGE, Prot::READ, MapFlags::SHARED, &obj, 0)
        .unwrap();
    for off in [0, 4999, 5000, 2 * PAGE - 1, 2 * PAGE, 3 * PAGE - 1] {
        let kr = kernel_load(k as u64 + off);
        let mut b = [0u8; 1];
        let or = match mm.read(a + off, &mut b) {
            Ok(()) => Ok(b[0]),
            Err(Error::Memory(m)) if m.kind == FaultError::Bus => Err(libc::EIO),
            Err(e) => panic!("offset {off}: {e:?}"),
        };
        assert_eq!(or, kr, "offset {off}");
    }
    assert_eq!(mm.fault(a + 2 * PAGE, Access::Read), Err(FaultError::Bus));
    kernel_munmap(k, 3 * PAGE);
    // Growing the object (and the file) makes the page readable.
    let rw = Memfd::from_file(&f.open(true), "eof").unwrap();
    rw.set_len(3 * PAGE).unwrap();
    assert_eq!(
        f.bytes().len() as u64,
        3 * PAGE,
        "ftruncate reached the host"
    );
    let b = mm
        .mmap_fd(0, 3 * PAGE, Prot::READ, MapFlags::SHARED, &rw, 0)
        .unwrap();
    assert_eq!(mm.fault(b + 2 * PAGE, Access::Read), Ok(()));
}

#[test]
fn memfd_create_and_streams() {
    let mm = AddressSpace::new(Config::default());
    assert_eq!(
        mm.memfd_create("x", MemfdFlags::from_bits_retain(0x100))
            .map(|_| ()),
        Err(Error::Inval)
    );
    assert_eq!(
        mm.memfd_create("x", MemfdFlags::EXEC | MemfdFlags::NOEXEC_SEAL)
            .map(|_| ()),
        Err(Error::Inval)
    );
    let mut m = mm
        .memfd_create("stream", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
        .unwrap();
    assert_eq!(m.len(), 0);
    m.write_all(b"hello, ").unwrap();
    let mut dup = m.clone();
    dup.write_all(b"world").unwrap();
    assert_eq!(m.stream_position().unwrap(), 12, "clones share the offset");
    assert_eq!(m.seek(SeekFrom::Start(7)).unwrap(), 7);
    let mut s = String::new();
    m.read_to_string(&mut s).unwrap();
    assert_eq!(s, "world");
    assert_eq!(m.seek(SeekFrom::End(-12)).unwrap(), 0);
    let e = m.seek(SeekFrom::Current(-1)).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
    assert_eq!(
        m.stream_position().unwrap(),
        0,
        "a failed seek moves nothing"
    );
    // Charged to the space that made it.
    assert!(Arc::ptr_eq(m.frame_pool(), mm.frame_pool()));
    assert_eq!(mm.frames_used(), 1);
}

/// The kernel's `/proc/self/maps` line for `addr` (the one starting there).
fn kernel_maps_line(addr: u64) -> String {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let start = format!("{addr:x}-");
    maps.lines()
        .find(|l| l.starts_with(&start))
        .unwrap_or_else(|| panic!("no maps line at {addr:#x}"))
        .to_string()
}

#[test]
fn maps_lines_of_file_mappings_match_the_kernel() {
    let f = TempFile::new("maps", &pattern(3 * PAGE as usize));
    let file = f.open(false);
    let path = f.0.to_string_lossy().into_owned();
    let obj = Memfd::from_file(&file, &path).unwrap();
    let mm = AddressSpace::new(Config::default());
    for (prot, kprot, flags, kflags) in [
        (
            Prot::READ,
            libc::PROT_READ,
            MapFlags::PRIVATE,
            libc::MAP_PRIVATE,
        ),
        (
            Prot::READ,
            libc::PROT_READ,
            MapFlags::SHARED,
            libc::MAP_SHARED,
        ),
        (
            RW,
            libc::PROT_READ | libc::PROT_WRITE,
            MapFlags::PRIVATE,
            libc::MAP_PRIVATE,
        ),
    ] {
        // SAFETY: a new mapping at an address of the kernel's choice.
        let k = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                2 * PAGE as usize,
                kprot,
                kflags,
                file.as_raw_fd(),
                PAGE as i64,
            )
        };
        assert_ne!(k, libc::MAP_FAILED);
        let a = mm.mmap_fd(0, 2 * PAGE, prot, flags, &obj, PAGE).unwrap();
        let ours = mm.vmas().into_iter().find(|v| v.start == a).unwrap();
        let theirs = kernel_maps_line(k as u64);
        kernel_munmap(k, 2 * PAGE);
        let fields = |l: &str| {
            l.split_whitespace()
                .skip(1)
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        assert_eq!(fields(&ours.maps_line()), fields(&theirs), "{theirs}");
        mm.munmap(a, 2 * PAGE).unwrap();
    }
}
