//! Forced access (`read_forced` / `write_forced`) against the kernel's own
//! `FOLL_FORCE`: the same mappings made in this process with libc and
//! accessed through `/proc/self/mem` (whose `pread`/`pwrite` force, unless
//! the kernel's `proc_mem.force_override` forbids it: then the kernel
//! half is skipped with a message), and in an aspace space. Both sides
//! must agree on the outcome (bytes done, or refused), on the bytes read
//! back, on the maps lines (no split, no protection change), on the
//! object's contents (a private mapping's write never reaches it), and on
//! what an ordinary read sees after `mprotect(PROT_READ | PROT_WRITE)`.
//! The aspace side also checks what the kernel cannot show from outside:
//! the copy's entry stays read-only (a translator store still faults).
//! `forced_copy.rs` checks the copy's later life.

use aspace::{
    AddressSpace, Config, Error, FaultError, MapFlags, Memfd, MemoryFault, Prot, PAGE_SIZE,
};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::os::unix::io::{AsRawFd, FromRawFd};

const P: u64 = PAGE_SIZE;
const PAGES: u64 = 3;

/// What a forced access did: all of it, or this many bytes (`/proc/PID/mem`
/// returns a short count, or `EIO` for none).
#[derive(Debug, PartialEq, Eq)]
enum Done {
    All,
    Part(usize),
}

/// The kernel's `/proc/self/mem`, if it forces: a write into a fresh
/// `r-x` private page must go through.
fn proc_mem() -> Option<File> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/proc/self/mem")
        .ok()?;
    let a = kmap(P, libc::PROT_READ | libc::PROT_EXEC, anon_flags(), -1);
    let r = f.write_at(b"x", a);
    // SAFETY: `a` is our own mapping of one page, used by no one else.
    unsafe { libc::munmap(a as *mut _, P as usize) };
    match r {
        Ok(1) => Some(f),
        other => {
            eprintln!(
                "forced_access: /proc/self/mem does not force ({other:?}): kernel half skipped"
            );
            None
        }
    }
}

fn anon_flags() -> i32 {
    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS
}

fn kmap(len: u64, prot: i32, flags: i32, fd: i32) -> u64 {
    // SAFETY: a new mapping placed by the kernel; nothing of ours is there.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), len as usize, prot, flags, fd, 0) };
    assert_ne!(p, libc::MAP_FAILED, "mmap");
    p as u64
}

fn kernel_done(r: std::io::Result<usize>, len: usize) -> Done {
    match r {
        Ok(n) if n == len => Done::All,
        Ok(n) => Done::Part(n),
        Err(e) if e.raw_os_error() == Some(libc::EIO) => Done::Part(0),
        Err(e) => panic!("/proc/self/mem: unexpected {e}"),
    }
}

fn aspace_done(r: aspace::Result<()>) -> Done {
    match r {
        Ok(()) => Done::All,
        Err(Error::Memory(m)) => Done::Part(m.done),
        Err(e) => panic!("forced access: unexpected {e:?}"),
    }
}

/// The `rwxp` columns of the maps lines starting in `[a, a + len)`.
fn perms(maps: &str, a: u64) -> Vec<String> {
    let len = PAGES * P;
    maps.lines()
        .filter_map(|l| {
            let (range, rest) = l.split_once(' ')?;
            let start = u64::from_str_radix(range.split_once('-')?.0, 16).ok()?;
            (a <= start && start < a + len).then(|| rest[..4].to_string())
        })
        .collect()
}

/// How a case's mapping is made.
#[derive(Clone, Copy, Debug)]
enum Backing {
    Anon,
    PrivateMemfd,
    SharedMemfd,
}

/// What both sides did in one case.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    maps_before: Vec<String>,
    write: Done,
    cross: Done,
    read: Done,
    bytes: Vec<u8>,
    maps_after: Vec<String>,
    object: Vec<u8>,
    after_mprotect: Vec<u8>,
}

const ORIGINAL: &[u8] = b"ORIGINAL-OBJECT!";

/// One side of the comparison: the kernel or an aspace space.
trait Side {
    /// Maps `PAGES` pages; the object (if any) holds `ORIGINAL` at `P`.
    fn map(&mut self, prot: Prot, backing: Backing) -> u64;
    /// The `rwxp` columns of the maps lines in `[a, a + PAGES * P)`.
    fn perms(&self, a: u64) -> Vec<String>;
    fn read_forced(&self, at: u64, buf: &mut [u8]) -> Done;
    fn write_forced(&self, at: u64, data: &[u8]) -> Done;
    /// The object's bytes at `P`.
    fn object(&self) -> Vec<u8>;
    /// Checks after a forced write went through (none by default).
    fn after_write(&self, _a: u64, _prot: Prot) {}
    /// mprotect(PROT_READ | PROT_WRITE) of the mapping, then a plain read
    /// of `buf.len()` bytes at `at` (zeros if the mprotect failed).
    fn mprotect_rw_read(&self, a: u64, at: u64, buf: &mut [u8]);
}

/// The kernel side: libc on this process, forced through `/proc/self/mem`.
struct Kernel<'f> {
    mem: &'f File,
    obj: Option<File>,
}

impl Side for Kernel<'_> {
    fn map(&mut self, prot: Prot, backing: Backing) -> u64 {
        let len = PAGES * P;
        // SAFETY: memfd_create with a valid C string; the fd is ours.
        let fd = unsafe { libc::memfd_create(c"forced".as_ptr(), 0) };
        assert!(fd >= 0);
        // SAFETY: `fd` is a new descriptor owned by this File only.
        let f = unsafe { File::from_raw_fd(fd) };
        f.set_len(len).unwrap();
        f.write_at(ORIGINAL, P).unwrap();
        let (flags, fd) = match backing {
            Backing::Anon => (anon_flags(), -1),
            Backing::PrivateMemfd => (libc::MAP_PRIVATE, f.as_raw_fd()),
            Backing::SharedMemfd => (libc::MAP_SHARED, f.as_raw_fd()),
        };
        self.obj = Some(f);
        kmap(len, prot.bits() as i32, flags, fd)
    }
    fn perms(&self, a: u64) -> Vec<String> {
        perms(&std::fs::read_to_string("/proc/self/maps").unwrap(), a)
    }
    fn read_forced(&self, at: u64, buf: &mut [u8]) -> Done {
        kernel_done(self.mem.read_at(buf, at), buf.len())
    }
    fn write_forced(&self, at: u64, data: &[u8]) -> Done {
        kernel_done(self.mem.write_at(data, at), data.len())
    }
    fn object(&self) -> Vec<u8> {
        let mut v = vec![0u8; ORIGINAL.len()];
        let f = self.obj.as_ref().expect("mapped");
        f.read_at(&mut v, P).unwrap();
        v
    }
    fn mprotect_rw_read(&self, a: u64, at: u64, buf: &mut [u8]) {
        let len = (PAGES * P) as usize;
        // SAFETY: our own mapping of `len` bytes.
        let r = unsafe { libc::mprotect(a as *mut _, len, libc::PROT_READ | libc::PROT_WRITE) };
        if r == 0 {
            // SAFETY: readable now, and `[at, at + buf.len())` lies inside.
            unsafe { std::ptr::copy_nonoverlapping(at as *const u8, buf.as_mut_ptr(), buf.len()) };
        }
        // SAFETY: our own mapping, not used after this.
        unsafe { libc::munmap(a as *mut _, len) };
    }
}

/// The aspace side, with a shared view of the object to read it by.
struct Space {
    mm: AddressSpace,
    obj: Memfd,
    view: u64,
}

impl Space {
    fn new() -> Space {
        let len = PAGES * P;
        let mm = AddressSpace::new(Config::default());
        let obj = Memfd::new_in(mm.frame_pool(), "forced", len).unwrap();
        let rw = Prot::READ | Prot::WRITE;
        let view = mm.mmap_fd(0, len, rw, MapFlags::SHARED, &obj, 0).unwrap();
        mm.write(view + P, ORIGINAL).unwrap();
        Space { mm, obj, view }
    }
}

impl Side for Space {
    fn map(&mut self, prot: Prot, backing: Backing) -> u64 {
        let (mm, len) = (&self.mm, PAGES * P);
        match backing {
            Backing::Anon => mm.mmap(0, len, prot, MapFlags::PRIVATE | MapFlags::ANONYMOUS),
            Backing::PrivateMemfd => mm.mmap_fd(0, len, prot, MapFlags::PRIVATE, &self.obj, 0),
            Backing::SharedMemfd => mm.mmap_fd(0, len, prot, MapFlags::SHARED, &self.obj, 0),
        }
        .unwrap()
    }
    fn perms(&self, a: u64) -> Vec<String> {
        perms(&self.mm.maps(), a)
    }
    fn read_forced(&self, at: u64, buf: &mut [u8]) -> Done {
        aspace_done(self.mm.read_forced(at, buf))
    }
    fn write_forced(&self, at: u64, data: &[u8]) -> Done {
        aspace_done(self.mm.write_forced(at, data))
    }
    fn object(&self) -> Vec<u8> {
        let mut v = vec![0u8; ORIGINAL.len()];
        self.mm.read(self.view + P, &mut v).unwrap();
        v
    }
    /// The copy's entry stays read-only while the VMA is: a store through
    /// a translator (which trusts the entry) still faults.
    fn after_write(&self, at: u64, prot: Prot) {
        if !prot.contains(Prot::WRITE) {
            let mut t = self.mm.translator();
            assert_eq!(
                t.store::<u8>(at, 0).map_err(|e| e.kind),
                Err(FaultError::AccessDenied)
            );
            assert!(self.mm.write(at, &[0]).is_err());
        }
    }
    fn mprotect_rw_read(&self, a: u64, at: u64, buf: &mut [u8]) {
        if self
            .mm
            .mprotect(a, PAGES * P, Prot::READ | Prot::WRITE)
            .is_ok()
        {
            self.mm.read(at, buf).unwrap();
        }
    }
}

/// One case on one side: map, (fault in by a forced read), write forced
/// in the middle page and across the first boundary, read back.
fn run_case(side: &mut impl Side, prot: Prot, backing: Backing, prefault: bool) -> Seen {
    let a = side.map(prot, backing);
    let maps_before = side.perms(a);
    if prefault {
        assert_eq!(side.read_forced(a + P, &mut [0u8; 1]), Done::All);
    }
    let write = side.write_forced(a + P + 5, b"hello");
    if write == Done::All {
        side.after_write(a + P + 5, prot);
    }
    let cross = side.write_forced(a + P - 2, b"abcd");
    let mut bytes = vec![0u8; 24];
    let read = side.read_forced(a + P - 4, &mut bytes);
    let maps_after = side.perms(a);
    let object = side.object();
    let mut after_mprotect = vec![0u8; 24];
    side.mprotect_rw_read(a, a + P - 4, &mut after_mprotect);
    Seen {
        maps_before,
        write,
        cross,
        read,
        bytes,
        maps_after,
        object,
        after_mprotect,
    }
}

/// Every mapping kind both sides make: each must agree with the kernel,
/// and the ones a forced write may change must have changed.
#[test]
fn forced_access_matches_the_kernel() {
    let mem = proc_mem();
    let none = Prot::NONE;
    let r = Prot::READ;
    let rx = Prot::READ | Prot::EXEC;
    let cases = [
        (rx, Backing::Anon, false),
        (rx, Backing::Anon, true),
        (none, Backing::Anon, false),
        (none, Backing::Anon, true),
        (Prot::EXEC, Backing::Anon, true),
        (r, Backing::PrivateMemfd, false),
        (r, Backing::PrivateMemfd, true),
        (rx, Backing::PrivateMemfd, true),
        (r, Backing::SharedMemfd, false),
        (r, Backing::SharedMemfd, true),
        (none, Backing::SharedMemfd, true),
        (Prot::READ | Prot::WRITE, Backing::SharedMemfd, true),
    ];
    for (prot, backing, prefault) in cases {
        let what = format!("{prot:?} {backing:?} prefault {prefault}");
        let ours = run_case(&mut Space::new(), prot, backing, prefault);
        // Independent of the kernel: where the rules allow the write it
        // happened, without a split, and never reached a private
        // mapping's object.
        let shared_ro = matches!(backing, Backing::SharedMemfd) && !prot.contains(Prot::WRITE);
        assert_eq!(
            ours.maps_before, ours.maps_after,
            "{what}: split or changed"
        );
        assert_eq!(ours.maps_after.len(), 1, "{what}");
        if shared_ro {
            assert_eq!(ours.write, Done::Part(0), "{what}");
            assert_eq!(ours.object, ORIGINAL, "{what}");
        } else {
            assert_eq!(ours.write, Done::All, "{what}");
            assert_eq!(&ours.bytes[2..6], b"abcd", "{what}");
            assert_eq!(&ours.bytes[9..14], b"hello", "{what}");
            let object_written = matches!(backing, Backing::SharedMemfd);
            assert_eq!(ours.object != ORIGINAL, object_written, "{what}");
        }
        if let Some(mem) = &mem {
            let mut kernel = Kernel { mem, obj: None };
            let theirs = run_case(&mut kernel, prot, backing, prefault);
            assert_eq!(ours, theirs, "{what}: aspace (left) and the kernel (right)");
        }
    }
}

/// Where no VMA is, or a hole cuts the range: the count of bytes done
/// before it, as the kernel's short `/proc/self/mem` count.
#[test]
fn forced_access_stops_at_a_hole_like_the_kernel() {
    let mem = proc_mem();
    let mm = AddressSpace::new(Config::default());
    let a = mm
        .mmap(
            0,
            2 * P,
            Prot::READ,
            MapFlags::PRIVATE | MapFlags::ANONYMOUS,
        )
        .unwrap();
    mm.munmap(a + P, P).unwrap();
    let w = mm.write_forced(a + P - 4, b"12345678");
    assert_eq!(
        w,
        Err(Error::Memory(MemoryFault {
            addr: a + P,
            kind: FaultError::NoMapping,
            done: 4
        }))
    );
    let mut buf = [0u8; 8];
    let r = aspace_done(mm.read_forced(a + P - 4, &mut buf));
    assert_eq!(&buf[..4], b"1234");
    let past = aspace_done(mm.write_forced(a + P, b"x"));
    assert_eq!(past, Done::Part(0));
    if let Some(mem) = mem {
        let k = kmap(2 * P, libc::PROT_READ, anon_flags(), -1);
        // SAFETY: the upper page of our own mapping.
        unsafe { libc::munmap((k + P) as *mut _, P as usize) };
        assert_eq!(
            kernel_done(mem.write_at(b"12345678", k + P - 4), 8),
            Done::Part(4)
        );
        let mut kb = [0u8; 8];
        assert_eq!(kernel_done(mem.read_at(&mut kb, k + P - 4), 8), r);
        assert_eq!(kb, buf);
        assert_eq!(kernel_done(mem.write_at(b"x", k + P), 1), past);
        // SAFETY: our own mapping.
        unsafe { libc::munmap(k as *mut _, P as usize) };
    }
    // Past the task size: nothing, not a panic.
    let top = Config::default().task_size;
    assert!(matches!(
        mm.write_forced(top - 1, b"ab"),
        Err(Error::Memory(MemoryFault { done: 0, .. }))
    ));
    assert!(mm.read_forced(u64::MAX, &mut [0; 2]).is_err());
}
