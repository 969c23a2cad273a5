//! `Memfd` against the running kernel's `memfd_create`: the same random
//! sequence of `pwrite`, `pread` and `ftruncate` calls (offsets near page
//! boundaries, past the end, near the largest size, overflowing) made on
//! a real memfd and on a [`Memfd`], comparing every result, errno and byte
//! read; name checks; hostile arguments never panic; a stress test of
//! copies racing truncation; and the frames return to the pool. Then
//! mappings (`mmap_fd`) against the kernel's mmap of a memfd: bytes,
//! maps lines, merges, SIGBUS past the end (a private store there still
//! leaves an anon_vma, which decides later merges), flags of
//! `MAP_SHARED_VALIDATE`, and a shrink zapping the pages past the new end
//! in every mapping (two address spaces and a fork child), with faults
//! racing shrinks and growths.

use aspace::{FrameAllocator, Memfd};
use std::ffi::CString;
use std::sync::Arc;

const PAGE: u64 = 4096;

/// A real memfd of this process, closed on drop.
struct KernelFd(i32);

impl KernelFd {
    fn new(name: &str) -> Result<KernelFd, i32> {
        let c = CString::new(name).expect("no NUL in test names");
        // SAFETY: `c` is a valid NUL-terminated string.
        let fd = unsafe { libc::memfd_create(c.as_ptr(), 0) };
        if fd < 0 {
            Err(errno())
        } else {
            Ok(KernelFd(fd))
        }
    }
    fn truncate(&self, len: u64) -> Result<(), i32> {
        // SAFETY: plain syscall on our own descriptor.
        let r = unsafe { libc::ftruncate(self.0, len as i64) };
        if r < 0 {
            Err(errno())
        } else {
            Ok(())
        }
    }
    fn pread(&self, off: u64, buf: &mut [u8]) -> Result<usize, i32> {
        // SAFETY: `buf` is valid for `buf.len()` bytes of writes.
        let r = unsafe { libc::pread(self.0, buf.as_mut_ptr().cast(), buf.len(), off as i64) };
        if r < 0 {
            Err(errno())
        } else {
            Ok(r as usize)
        }
    }
    fn pwrite(&self, off: u64, data: &[u8]) -> Result<usize, i32> {
        // SAFETY: `data` is valid for `data.len()` bytes of reads.
        let r = unsafe { libc::pwrite(self.0, data.as_ptr().cast(), data.len(), off as i64) };
        if r < 0 {
            Err(errno())
        } else {
            Ok(r as usize)
        }
    }
    fn size(&self) -> u64 {
        // SAFETY: stat is plain old data, filled in by fstat.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: valid descriptor and writable stat.
        assert_eq!(unsafe { libc::fstat(self.0, &mut st) }, 0);
        st.st_size as u64
    }
}

impl Drop for KernelFd {
    fn drop(&mut self) {
        // SAFETY: our own descriptor, closed once.
        unsafe { libc::close(self.0) };
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn ours<T>(r: aspace::Result<T>) -> Result<T, i32> {
    r.map_err(|e| e.errno())
}

/// xorshift64*: a small deterministic generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// An offset or length that tends to land near page boundaries.
    fn offset(&mut self) -> u64 {
        match self.below(10) {
            0 => self.below(64 * PAGE),
            1 => i64::MAX as u64 - self.below(2 * PAGE),
            2 => (i64::MAX as u64).wrapping_add(self.below(3)),
            _ => (self.below(24) * PAGE)
                .wrapping_add(self.below(9))
                .wrapping_sub(4),
        }
    }
}

#[test]
fn names_as_memfd_create() {
    let long = "n".repeat(249);
    let too_long = "n".repeat(250);
    for name in ["", "x", long.as_str(), too_long.as_str()] {
        let k = KernelFd::new(name).map(|_| ());
        let m = ours(Memfd::new(name, 0)).map(|_| ());
        assert_eq!(m, k, "name of {} bytes", name.len());
    }
    assert_eq!(ours(Memfd::new("a\0b", 0)).map(|_| ()), Err(libc::EINVAL));
}

#[test]
fn random_calls_match_the_kernel() {
    for seed in 1..=40u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let k = KernelFd::new("diff").unwrap();
        let m = Memfd::new("diff", 0).unwrap();
        for step in 0..200 {
            let what = format!("seed {seed} step {step}");
            match rng.below(4) {
                0 => {
                    let len = match rng.below(4) {
                        0 => rng.offset(),
                        _ => rng.below(40 * PAGE),
                    };
                    assert_eq!(
                        ours(m.set_len(len)),
                        k.truncate(len),
                        "{what}: set_len {len}"
                    );
                }
                1 => {
                    let off = rng.offset();
                    let n = rng.below(3 * PAGE) as usize;
                    let data: Vec<u8> = (0..n).map(|_| rng.next() as u8 | 1).collect();
                    assert_eq!(
                        ours(m.write_at(&data, off)),
                        k.pwrite(off, &data),
                        "{what}: write_at {off:#x} {n}"
                    );
                }
                _ => {
                    let off = rng.offset();
                    let n = rng.below(3 * PAGE) as usize;
                    let (mut a, mut b) = (vec![0xeeu8; n], vec![0xeeu8; n]);
                    let r = ours(m.read_at(&mut a, off));
                    assert_eq!(r, k.pread(off, &mut b), "{what}: read_at {off:#x} {n}");
                    assert!(a == b, "{what}: bytes read at {off:#x}");
                }
            }
            assert_eq!(m.len(), k.size(), "{what}: size");
        }
    }
}

#[test]
fn clones_share_and_frames_return() {
    let pool = Arc::new(FrameAllocator::new(64 * PAGE, true));
    let m = Memfd::new_in(&pool, "shared", 8 * PAGE).unwrap();
    let c = m.clone();
    assert_eq!(m.write_at(b"abcd", PAGE - 2).unwrap(), 4);
    let mut buf = [0u8; 4];
    assert_eq!(c.read_at(&mut buf, PAGE - 2).unwrap(), 4);
    assert_eq!(&buf, b"abcd");
    assert_eq!(pool.used(), 2);
    c.set_len(PAGE - 1).unwrap();
    assert_eq!(pool.used(), 1, "the page past the end is freed");
    assert_eq!(m.len(), PAGE - 1);
    drop(m);
    assert_eq!(pool.used(), 1, "a clone keeps the object");
    drop(c);
    assert_eq!(pool.used(), 0);
    assert_eq!(pool.memory().used(), 0, "tree nodes uncharged");
}

#[test]
fn out_of_budget_is_enomem_or_short() {
    let pool = Arc::new(FrameAllocator::new(4 * PAGE, true));
    let m = Memfd::new_in(&pool, "small", 0).unwrap();
    let data = vec![7u8; (64 * PAGE) as usize];
    let n = m.write_at(&data, 0).unwrap();
    assert!(n > 0 && n < data.len(), "short write of {n}");
    assert_eq!(m.len(), n as u64, "grows only by what was written");
    let far = m.write_at(b"x", 1 << 40);
    assert!(matches!(far, Err(aspace::Error::NoMem)), "{far:?}");
}

#[test]
fn hostile_arguments_never_panic() {
    let m = Memfd::new("hostile", PAGE).unwrap();
    let vals = [
        0,
        1,
        PAGE - 1,
        PAGE,
        i64::MAX as u64 - PAGE,
        i64::MAX as u64,
        1 << 63,
        u64::MAX - PAGE + 1,
        u64::MAX,
    ];
    let mut buf = [0u8; 16];
    for &v in &vals {
        let _ = m.read_at(&mut buf, v);
        let _ = m.write_at(&buf[..1], v);
        let _ = m.set_len(v);
        assert!(m.len() <= i64::MAX as u64);
    }
}

#[test]
fn copies_racing_truncation() {
    // Writers fill pages with a non-zero byte while the object shrinks and
    // grows; a read never sees a byte past the size it returned, and
    // after a shrink to zero and a growth every byte reads as zero.
    let m = Memfd::new("race", 16 * PAGE).unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let threads: Vec<_> = (0..2)
        .map(|t| {
            let (m, stop) = (m.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut buf = vec![0u8; (2 * PAGE) as usize];
                let mut i = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let off = (i * 7 + t) % 14 * PAGE;
                    if t == 0 {
                        let _ = m.write_at(&[0x5a; 100], off);
                    } else {
                        let n = m.read_at(&mut buf, off).unwrap();
                        assert!(n <= buf.len());
                    }
                    i += 1;
                }
            })
        })
        .collect();
    for _ in 0..2000 {
        m.set_len(3 * PAGE).unwrap();
        m.set_len(16 * PAGE).unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    m.set_len(0).unwrap();
    m.set_len(16 * PAGE).unwrap();
    let mut buf = vec![1u8; (16 * PAGE) as usize];
    assert_eq!(m.read_at(&mut buf, 0).unwrap(), buf.len());
    assert!(
        buf.iter().all(|&b| b == 0),
        "a shrink to zero drops every byte"
    );
}

// ---- Mappings (`mmap_fd`) against the kernel's mmap of a memfd ----

use aspace::{Access, AddressSpace, Advice, Config, FaultError, MapFlags, Prot};

/// A kernel mapping of `fd` (anywhere), unmapped on drop.
struct KMap {
    ptr: *mut u8,
    len: usize,
}

impl KMap {
    fn new(fd: &KernelFd, len: u64, flags: i32, off: u64) -> Result<KMap, i32> {
        // SAFETY: a fresh mapping chosen by the kernel; touches nothing else.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd.0,
                off as i64,
            )
        };
        if p == libc::MAP_FAILED {
            Err(errno())
        } else {
            Ok(KMap {
                ptr: p.cast(),
                len: len as usize,
            })
        }
    }
    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: the mapping is ours, `len` bytes, and the tests keep
        // every access inside the object's size (no SIGBUS).
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
    fn dontneed(&self) {
        // SAFETY: our own mapping.
        let r = unsafe { libc::madvise(self.ptr.cast(), self.len, libc::MADV_DONTNEED) };
        assert_eq!(r, 0);
    }
    /// The kernel's errno for loading `n` bytes at `at` (0: fine), made
    /// through a pipe so a SIGBUS page reads as `EFAULT`.
    fn load_errno(&self, at: usize, n: usize) -> i32 {
        let mut fds = [0i32; 2];
        // SAFETY: a fresh pipe; the write copies from our mapping, and a
        // fault there returns EFAULT instead of a signal.
        unsafe {
            assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
            let r = libc::write(fds[1], self.ptr.add(at).cast(), n);
            let e = if r < 0 { errno() } else { 0 };
            libc::close(fds[0]);
            libc::close(fds[1]);
            e
        }
    }
    /// The kernel's errno for storing `data` at `at` (0: fine), made
    /// through a pipe so a SIGBUS page reads as `EFAULT`.
    fn store_errno(&self, at: usize, data: &[u8]) -> i32 {
        let mut fds = [0i32; 2];
        // SAFETY: a fresh pipe; the write copies from a local buffer and the
        // read stores into our mapping, where a fault returns EFAULT
        // instead of a signal.
        unsafe {
            assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
            let w = libc::write(fds[1], data.as_ptr().cast(), data.len());
            assert_eq!(w, data.len() as isize);
            let r = libc::read(fds[0], self.ptr.add(at).cast(), data.len());
            let e = if r < 0 { errno() } else { 0 };
            libc::close(fds[0]);
            libc::close(fds[1]);
            e
        }
    }
    /// `mprotect` of `len` bytes at `at` of this mapping.
    fn mprotect(&self, at: usize, len: usize, prot: i32) {
        // SAFETY: a range of our own mapping, where no Rust object lives.
        let r = unsafe { libc::mprotect(self.ptr.add(at).cast(), len, prot) };
        assert_eq!(r, 0, "mprotect: errno {}", errno());
    }
    /// The kernel's VMAs inside this mapping: the offsets of their ends
    /// from its start, with their lines from the permissions on.
    fn layout(&self) -> Vec<(u64, u64, String)> {
        let (lo, hi) = (self.ptr as u64, self.ptr as u64 + self.len as u64);
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        maps.lines()
            .filter_map(|l| {
                let mut r = l.split(['-', ' ']);
                let s = u64::from_str_radix(r.next()?, 16).ok()?;
                let e = u64::from_str_radix(r.next()?, 16).ok()?;
                (lo <= s && e <= hi).then(|| (s - lo, e - lo, strip_line(l)))
            })
            .collect()
    }
    /// The kernel's `/proc/self/maps` line for this mapping, from the
    /// permissions on (the addresses and inode differ by construction).
    fn maps_tail(&self) -> String {
        let start = format!("{:08x}-", self.ptr as u64);
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let line = maps
            .lines()
            .find(|l| l.starts_with(&start))
            .unwrap()
            .to_string();
        strip_line(&line)
    }
}

impl Drop for KMap {
    fn drop(&mut self) {
        // SAFETY: our own mapping, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// A maps line without its address range and inode.
fn strip_line(line: &str) -> String {
    let f: Vec<&str> = line.split_whitespace().collect();
    format!("{} {} {} {}", f[1], f[2], f[3], f[5..].join(" "))
}

fn our_line(mm: &AddressSpace, addr: u64) -> String {
    let v = mm.vmas().into_iter().find(|v| v.start == addr).unwrap();
    strip_line(&v.maps_line())
}

const RW: Prot = Prot::READ.union(Prot::WRITE);

#[test]
fn shared_and_private_mappings_match_the_kernel() {
    for seed in 1..=12u64 {
        let mut rng = Rng(seed.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1);
        let pages = 4 + rng.below(12);
        let size = pages * PAGE;
        let k = KernelFd::new("cow").unwrap();
        k.truncate(size).unwrap();
        let mm = AddressSpace::new(Config::default());
        let m = Memfd::new_in(mm.frame_pool(), "cow", size).unwrap();
        let (so, po) = (rng.below(pages) * PAGE, rng.below(pages) * PAGE);
        let (sl, pl) = (size - so, size - po);
        let mut ks = KMap::new(&k, sl, libc::MAP_SHARED, so).unwrap();
        let mut kp = KMap::new(&k, pl, libc::MAP_PRIVATE, po).unwrap();
        let s = mm.mmap_fd(0, sl, RW, MapFlags::SHARED, &m, so).unwrap();
        let p = mm.mmap_fd(0, pl, RW, MapFlags::PRIVATE, &m, po).unwrap();
        assert_eq!(our_line(&mm, s), ks.maps_tail(), "seed {seed}: shared line");
        assert_eq!(
            our_line(&mm, p),
            kp.maps_tail(),
            "seed {seed}: private line"
        );
        for step in 0..120 {
            let what = format!("seed {seed} step {step}");
            let byte = rng.next() as u8;
            let n = 1 + rng.below(300) as usize;
            match rng.below(6) {
                0 => {
                    let at = rng.below(sl - n as u64) as usize;
                    ks.bytes()[at..at + n].fill(byte);
                    mm.write(s + at as u64, &vec![byte; n]).unwrap();
                }
                1 => {
                    let at = rng.below(pl - n as u64) as usize;
                    kp.bytes()[at..at + n].fill(byte);
                    mm.write(p + at as u64, &vec![byte; n]).unwrap();
                }
                2 => {
                    let at = rng.below(size - n as u64);
                    k.pwrite(at, &vec![byte; n]).unwrap();
                    m.write_at(&vec![byte; n], at).unwrap();
                }
                3 => {
                    kp.dontneed();
                    mm.madvise(p, pl, Advice::DontNeed).unwrap();
                }
                _ => {
                    let mut ours = vec![0u8; pl as usize];
                    mm.read(p, &mut ours).unwrap();
                    assert!(ours == kp.bytes(), "{what}: private bytes");
                    let mut ours = vec![0u8; sl as usize];
                    mm.read(s, &mut ours).unwrap();
                    assert!(ours == ks.bytes(), "{what}: shared bytes");
                    let (mut a, mut b) = (vec![0u8; size as usize], vec![0u8; size as usize]);
                    m.read_at(&mut a, 0).unwrap();
                    k.pread(0, &mut b).unwrap();
                    assert!(a == b, "{what}: object bytes");
                }
            }
        }
    }
}

#[test]
fn past_the_end_is_sigbus_like_the_kernel() {
    let k = KernelFd::new("bus").unwrap();
    k.truncate(PAGE + 100).unwrap();
    let mm = AddressSpace::new(Config::default());
    let m = Memfd::new_in(mm.frame_pool(), "bus", PAGE + 100).unwrap();
    for (flags, ours) in [
        (libc::MAP_SHARED, MapFlags::SHARED),
        (libc::MAP_PRIVATE, MapFlags::PRIVATE),
    ] {
        let mut km = KMap::new(&k, 4 * PAGE, flags, 0).unwrap();
        let a = mm.mmap_fd(0, 4 * PAGE, RW, ours, &m, 0).unwrap();
        for page in 0..4u64 {
            let mut buf = [0u8; 8];
            let e = mm
                .read(a + page * PAGE + 8, &mut buf)
                .err()
                .map_or(0, |e| e.errno());
            assert_eq!(
                e,
                km.load_errno((page * PAGE + 8) as usize, 8),
                "page {page}"
            );
            let f = mm.fault(a + page * PAGE, Access::Read);
            assert_eq!(f.is_err(), page >= 2, "page {page}: {f:?}");
            if page >= 2 {
                assert_eq!(f, Err(FaultError::Bus));
            }
        }
        // Growing the object makes the pages fault in; shrinking it while
        // they are mapped (and written) makes them SIGBUS again.
        k.truncate(4 * PAGE).unwrap();
        m.set_len(4 * PAGE).unwrap();
        km.bytes()[3 * PAGE as usize] = 7;
        mm.write(a + 3 * PAGE, &[7]).unwrap();
        k.truncate(PAGE + 100).unwrap();
        m.set_len(PAGE + 100).unwrap();
        for page in 0..4u64 {
            let mut buf = [0u8; 8];
            let e = mm
                .read(a + page * PAGE, &mut buf)
                .err()
                .map_or(0, |e| e.errno());
            let ke = km.load_errno((page * PAGE) as usize, 8);
            assert_eq!(e, ke, "page {page} after the shrink");
        }
        assert_eq!(mm.fault(a + 3 * PAGE, Access::Read), Err(FaultError::Bus));
        mm.munmap(a, 4 * PAGE).unwrap();
    }
}

#[test]
fn contiguous_offsets_merge_like_the_kernel() {
    // Two fixed mappings of one object side by side: the kernel and ours
    // merge them when the offsets are contiguous, not otherwise.
    let k = KernelFd::new("merge").unwrap();
    k.truncate(8 * PAGE).unwrap();
    let mm = AddressSpace::new(Config::default());
    let m = Memfd::new_in(mm.frame_pool(), "merge", 8 * PAGE).unwrap();
    for (second_off, merges) in [(2 * PAGE, true), (5 * PAGE, false)] {
        let base = KMap::new(&k, 4 * PAGE, libc::MAP_SHARED, 0).unwrap();
        // SAFETY: replaces the upper half of our own mapping.
        let r = unsafe {
            libc::mmap(
                base.ptr.add(2 * PAGE as usize).cast(),
                (2 * PAGE) as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                k.0,
                second_off as i64,
            )
        };
        assert_ne!(r, libc::MAP_FAILED);
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let start = format!("{:08x}-", base.ptr as u64);
        let line = maps.lines().find(|l| l.starts_with(&start)).unwrap();
        let end = u64::from_str_radix(line.split(['-', ' ']).nth(1).unwrap(), 16).unwrap();
        assert_eq!(end - base.ptr as u64 == 4 * PAGE, merges, "kernel: {line}");

        let a = mm
            .mmap_fd(0, 4 * PAGE, RW, MapFlags::SHARED, &m, 0)
            .unwrap();
        let fixed = MapFlags::SHARED | MapFlags::FIXED;
        mm.mmap_fd(a + 2 * PAGE, 2 * PAGE, RW, fixed, &m, second_off)
            .unwrap();
        let v = mm.vmas().into_iter().find(|v| v.start == a).unwrap();
        assert_eq!(v.end - a == 4 * PAGE, merges, "ours: {}", v.maps_line());
        mm.munmap(a, 4 * PAGE).unwrap();
    }
}

#[test]
fn bad_offsets_and_lengths_match_the_kernel() {
    let k = KernelFd::new("bad").unwrap();
    k.truncate(PAGE).unwrap();
    let mm = AddressSpace::new(Config::default());
    let m = Memfd::new_in(mm.frame_pool(), "bad", PAGE).unwrap();
    let top = (i64::MAX as u64) & !(PAGE - 1);
    let cases = [
        (PAGE, 1u64),
        (PAGE, 100),
        (0, 0),
        (PAGE, top),
        (2 * PAGE, top - PAGE),
        (u64::MAX - PAGE, 0),
        (PAGE, 1 << 40),
    ];
    for (len, off) in cases {
        let kr = KMap::new(&k, len, libc::MAP_SHARED, off).map(|_| ());
        let ours = mm
            .mmap_fd(0, len, RW, MapFlags::SHARED, &m, off)
            .map(|a| mm.munmap(a, len).unwrap())
            .map_err(|e| e.errno());
        assert_eq!(ours, kr, "len {len:#x} offset {off:#x}");
    }
    // An object on another physical memory cannot be mapped: EXDEV, after
    // the offset's alignment (EINVAL) is checked.
    let pool = std::sync::Arc::new(aspace::FrameAllocator::new(1 << 20, true));
    let other = Memfd::new_in(&pool, "other", PAGE).unwrap();
    let r = mm.mmap_fd(0, PAGE, RW, MapFlags::SHARED, &other, 0);
    assert_eq!(r.map_err(|e| e.errno()), Err(libc::EXDEV));
    let r = mm.mmap_fd(0, PAGE, RW, MapFlags::SHARED, &other, u64::MAX);
    assert_eq!(r.map_err(|e| e.errno()), Err(libc::EINVAL));
}

#[test]
fn fork_shares_shared_and_copies_private() {
    let mm = AddressSpace::new(Config::default());
    let m = Memfd::new_in(mm.frame_pool(), "fork", 2 * PAGE).unwrap();
    m.write_at(b"object", 0).unwrap();
    let s = mm
        .mmap_fd(0, 2 * PAGE, RW, MapFlags::SHARED, &m, 0)
        .unwrap();
    let p = mm
        .mmap_fd(0, 2 * PAGE, RW, MapFlags::PRIVATE, &m, 0)
        .unwrap();
    mm.write(p, b"parent").unwrap();
    let child = mm.fork().unwrap();
    child.write(s, b"child!").unwrap();
    child.write(p + 6, b"++").unwrap();
    let mut buf = [0u8; 8];
    mm.read(s, &mut buf).unwrap();
    assert_eq!(
        &buf[..6],
        b"child!",
        "shared: the parent sees the child's write"
    );
    mm.read(p, &mut buf).unwrap();
    assert_eq!(
        &buf[..8],
        b"parent\0\0",
        "private: the child's write is its own"
    );
    child.read(p, &mut buf).unwrap();
    assert_eq!(&buf[..8], b"parent++");
    child.madvise(p, PAGE, Advice::DontNeed).unwrap();
    child.read(p, &mut buf).unwrap();
    assert_eq!(
        &buf[..6],
        b"child!",
        "after DONTNEED the object's bytes show"
    );
}

#[test]
fn shrink_zaps_every_mapping_like_the_kernel() {
    // Ours: the object mapped shared and private in two address spaces on
    // one pool, and in a fork child of the first. The kernel's: the same
    // two pairs of mappings in this process (the child's private mapping
    // holds what the parent's held at the fork, and nobody writes after).
    const PAGES: u64 = 6;
    let size = PAGES * PAGE;
    let k = KernelFd::new("zap").unwrap();
    k.truncate(size).unwrap();
    let pool = Arc::new(FrameAllocator::new(64 << 20, true));
    let a = AddressSpace::with_pool(Config::default(), pool.clone());
    let b = AddressSpace::with_pool(Config::default(), pool.clone());
    let m = Memfd::new_in(&pool, "zap", size).unwrap();
    let mut kmaps: Vec<KMap> = Vec::new();
    let mut ours: Vec<(&AddressSpace, u64)> = Vec::new();
    for mm in [&a, &b] {
        for (kf, of) in [
            (libc::MAP_SHARED, MapFlags::SHARED),
            (libc::MAP_PRIVATE, MapFlags::PRIVATE),
        ] {
            kmaps.push(KMap::new(&k, size, kf, 0).unwrap());
            ours.push((mm, mm.mmap_fd(0, size, RW, of, &m, 0).unwrap()));
        }
    }
    // Writes through the object, both shared mappings, and copy-on-write
    // copies in both private ones (pages 1, 2 and 4; 2 will hold the end).
    for page in 0..PAGES {
        let at = page * PAGE;
        k.pwrite(at + 20, &[0x10 + page as u8]).unwrap();
        m.write_at(&[0x10 + page as u8], at + 20).unwrap();
        for (i, km) in kmaps.iter_mut().enumerate() {
            let private = i % 2 == 1;
            if private && ![1, 2, 4].contains(&page) {
                continue;
            }
            let byte = 0x40 + (i as u8) * 0x10 + page as u8;
            // Past the coming end, too, in the partial page.
            for off in [30, 3000] {
                km.bytes()[(at + off) as usize] = byte;
                let (mm, base) = ours[i];
                mm.write(base + at + off, &[byte]).unwrap();
            }
        }
    }
    let c = a.fork().unwrap();
    // The child's mappings: same addresses as the parent's, compared with
    // the kernel's mappings of the parent's kind.
    let children = [(&c, ours[0].1, 0usize), (&c, ours[1].1, 1)];
    let end = 2 * PAGE + 100;
    k.truncate(end).unwrap();
    m.set_len(end).unwrap();
    let check = |what: &str| {
        let all = ours
            .iter()
            .enumerate()
            .map(|(i, &(mm, base))| (mm, base, i))
            .chain(children.iter().copied());
        for (mm, base, ki) in all {
            let km = &kmaps[ki];
            for page in 0..PAGES {
                let at = page * PAGE;
                let mut buf = vec![0u8; PAGE as usize];
                let e = mm.read(base + at, &mut buf).err().map_or(0, |e| e.errno());
                assert_eq!(
                    e,
                    km.load_errno(at as usize, PAGE as usize),
                    "{what}: mapping {ki} page {page}"
                );
                if e == 0 {
                    // SAFETY: the kernel said the page loads.
                    let kb = unsafe {
                        std::slice::from_raw_parts(km.ptr.add(at as usize), PAGE as usize)
                    };
                    assert!(buf == kb, "{what}: mapping {ki} page {page} bytes");
                }
            }
        }
    };
    check("after the shrink");
    k.truncate(size).unwrap();
    m.set_len(size).unwrap();
    check("after growing again");
    drop(kmaps);
    drop((a, b, c));
    drop(m);
    assert_eq!(pool.used(), 0, "every frame back");
}

#[test]
fn faults_racing_shrink_and_grow() {
    // Two threads fault and write the object's last two pages through a
    // shared and a private mapping in two address spaces while a third
    // shrinks and grows it. Every access either works or is SIGBUS; bytes
    // below the smallest end are never lost; after the race, every frame
    // not in the object or a mapping is back in the pool (a page mapped
    // after being freed would be counted twice or leak).
    let pool = Arc::new(FrameAllocator::new(64 << 20, true));
    let m = Memfd::new_in(&pool, "race", 4 * PAGE).unwrap();
    m.write_at(b"keep", 0).unwrap();
    let spaces: Vec<Arc<AddressSpace>> = (0..2)
        .map(|_| Arc::new(AddressSpace::with_pool(Config::default(), pool.clone())))
        .collect();
    let workers: Vec<_> = spaces
        .iter()
        .enumerate()
        .map(|(i, mm)| {
            let (mm, m) = (mm.clone(), m.clone());
            std::thread::spawn(move || {
                let flags = [MapFlags::SHARED, MapFlags::PRIVATE][i];
                let a = mm.mmap_fd(0, 4 * PAGE, RW, flags, &m, 0).unwrap();
                let (mut ok, mut bus) = (0u64, 0u64);
                for round in 0..20_000u64 {
                    let page = 2 + round % 2;
                    match mm.write(a + page * PAGE + 8, &[round as u8]) {
                        Ok(()) => ok += 1,
                        Err(e) => {
                            assert_eq!(e.errno(), libc::EFAULT, "{e}");
                            bus += 1;
                        }
                    }
                    let mut keep = [0u8; 4];
                    mm.read(a, &mut keep).unwrap();
                    assert_eq!(&keep, b"keep", "a byte below the end was lost");
                    if round % 64 == 0 {
                        mm.madvise(a, 4 * PAGE, Advice::DontNeed).unwrap();
                    }
                }
                mm.munmap(a, 4 * PAGE).unwrap();
                (ok, bus)
            })
        })
        .collect();
    let mut n = 0u64;
    while !workers.iter().all(|w| w.is_finished()) {
        m.set_len(PAGE + n % 3 * PAGE).unwrap();
        m.set_len(4 * PAGE).unwrap();
        // Let the workers see the whole object at times.
        std::thread::yield_now();
        n += 1;
    }
    println!("{n} shrinks");
    for w in workers {
        let (ok, bus) = w.join().unwrap();
        println!("{ok} writes, {bus} SIGBUS");
    }
    let mut keep = [0u8; 4];
    m.read_at(&mut keep, 0).unwrap();
    assert_eq!(&keep, b"keep");
    drop(spaces);
    m.set_len(0).unwrap();
    assert_eq!(pool.used(), 0, "a frame leaked or was freed twice");
}

#[test]
fn fork_racing_shrink() {
    // A fork copies a private mapping's entries (copy-on-write copies of
    // the object's pages included) while the object shrinks: whichever
    // comes first, once both are done neither the parent nor the child
    // maps a page past the end (the child's VMA is filed after the
    // parent's, so the shrink's pass reaches a copied entry). The window
    // is narrow on real threads: loom_memfd's `fork_vs_shrink` explores
    // it.
    let mm = Arc::new(AddressSpace::new(Config::default()));
    let m = Memfd::new_in(mm.frame_pool(), "fork-race", 4 * PAGE).unwrap();
    let a = mm
        .mmap_fd(0, 4 * PAGE, RW, MapFlags::PRIVATE, &m, 0)
        .unwrap();
    for round in 0..300 {
        m.set_len(4 * PAGE).unwrap();
        mm.write(a + 2 * PAGE, &[round as u8]).unwrap(); // a private copy
        mm.read(a + 3 * PAGE, &mut [0u8; 1]).unwrap(); // the object's page
        let forker = {
            let mm = mm.clone();
            std::thread::spawn(move || mm.fork().unwrap())
        };
        m.set_len(PAGE).unwrap();
        let child = forker.join().unwrap();
        for (who, s) in [("parent", &*mm), ("child", &child)] {
            for page in 1..4 {
                assert!(
                    s.translate(a + page * PAGE).is_none(),
                    "round {round}: {who} maps page {page} past the end"
                );
            }
        }
    }
}

#[test]
fn shared_validate_checks_flags_like_the_kernel() {
    // Each flag bit alone with each type, on a memfd: MAP_SHARED ignores
    // what it does not know, MAP_SHARED_VALIDATE rejects every bit outside
    // Linux's legacy set with EOPNOTSUPP.
    let k = KernelFd::new("validate").unwrap();
    k.truncate(PAGE).unwrap();
    let mm = AddressSpace::new(Config::default());
    let m = Memfd::new_in(mm.frame_pool(), "validate", PAGE).unwrap();
    // A free page for the fixed flags, on each side. The kernel's hole is
    // taken fresh for every call: another thread of this test binary may
    // map into it between our munmap and our mmap, and the kernel checks
    // MAP_FIXED_NOREPLACE's EEXIST before it validates flags.
    let hole = || {
        // SAFETY: a fresh anonymous page of our own, unmapped at once: its
        // address is free unless another thread races for it, which makes
        // the kernel's FIXED_NOREPLACE fail with EEXIST, not corrupt.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                PAGE as usize,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            libc::munmap(p, PAGE as usize);
            p as u64
        }
    };
    let ours_hole = mm
        .mmap(0, PAGE, RW, MapFlags::PRIVATE | MapFlags::ANONYMOUS)
        .unwrap();
    mm.munmap(ours_hole, PAGE).unwrap();
    for ty in [
        libc::MAP_SHARED,
        libc::MAP_SHARED_VALIDATE,
        libc::MAP_PRIVATE,
    ] {
        for bit in 4..32 {
            let extra = 1i32 << bit;
            // MAP_FIXED would replace whatever the kernel has there.
            if extra == libc::MAP_FIXED {
                continue;
            }
            let fixed = extra == libc::MAP_FIXED_NOREPLACE;
            let flags = ty | extra;
            let kernel_mmap = |khint: u64| {
                // SAFETY: a hint, or FIXED_NOREPLACE at a page just found
                // free: the kernel replaces nothing.
                let p = unsafe {
                    libc::mmap(
                        khint as *mut libc::c_void,
                        PAGE as usize,
                        libc::PROT_READ | libc::PROT_WRITE,
                        flags,
                        k.0,
                        0,
                    )
                };
                if p == libc::MAP_FAILED {
                    Err(errno())
                } else {
                    // SAFETY: the mapping just made.
                    unsafe { libc::munmap(p, PAGE as usize) };
                    Ok(())
                }
            };
            let (kr, ohint) = if fixed {
                // EEXIST on a page found free a moment ago is a race with
                // another test thread, never the answer for a free page:
                // try again at a fresh hole.
                let mut kr = kernel_mmap(hole());
                for _ in 0..100 {
                    if kr != Err(libc::EEXIST) {
                        break;
                    }
                    kr = kernel_mmap(hole());
                }
                (kr, ours_hole)
            } else {
                (kernel_mmap(0), 0)
            };
            let or = mm
                .mmap_fd(
                    ohint,
                    PAGE,
                    RW,
                    MapFlags::from_bits_retain(flags as u32),
                    &m,
                    0,
                )
                .map(|a| mm.munmap(a, PAGE).unwrap())
                .map_err(|e| e.errno());
            assert_eq!(or, kr, "type {ty:#x} flag {extra:#x}");
        }
    }
}

#[test]
fn private_pieces_of_one_object_share_an_anon_vma_like_the_kernel() {
    // A private mapping of an object split by mprotect: a store in the
    // first piece gives it an anon_vma; a store in the second reuses it
    // (Linux's `anon_vma_compatible` compares the file, not "anonymous"),
    // so an mprotect that makes them alike merges them again. With two
    // anon_vmas the kernel would keep them apart, and so would we.
    let k = KernelFd::new("anon-vma").unwrap();
    k.truncate(4 * PAGE).unwrap();
    let mut km = KMap::new(&k, 4 * PAGE, libc::MAP_PRIVATE, 0).unwrap();
    let mm = AddressSpace::new(Config::default());
    let m = Memfd::new_in(mm.frame_pool(), "anon-vma", 4 * PAGE).unwrap();
    let a = mm
        .mmap_fd(0, 4 * PAGE, RW, MapFlags::PRIVATE, &m, 0)
        .unwrap();
    let half = 2 * PAGE as usize;
    // SAFETY: the upper half of our own mapping.
    let r = unsafe { libc::mprotect(km.ptr.add(half).cast(), half, libc::PROT_READ) };
    assert_eq!(r, 0);
    mm.mprotect(a + 2 * PAGE, 2 * PAGE, Prot::READ).unwrap();
    // The store in the first piece, then one in the second after making it
    // writable again (a separate VMA still: mprotect back first would
    // merge before any anon_vma exists).
    km.bytes()[0] = 1;
    mm.write(a, &[1]).unwrap();
    // SAFETY: as above.
    let r = unsafe {
        libc::mprotect(
            km.ptr.add(half).cast(),
            half,
            libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC,
        )
    };
    assert_eq!(r, 0);
    mm.mprotect(a + 2 * PAGE, 2 * PAGE, RW | Prot::EXEC)
        .unwrap();
    km.bytes()[half] = 2;
    mm.write(a + 2 * PAGE, &[2]).unwrap();
    // Both pieces alike again: the kernel merges them; so must we.
    // SAFETY: as above.
    let r = unsafe {
        libc::mprotect(
            km.ptr.add(half).cast(),
            half,
            libc::PROT_READ | libc::PROT_WRITE,
        )
    };
    assert_eq!(r, 0);
    mm.mprotect(a + 2 * PAGE, 2 * PAGE, RW).unwrap();
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let start = format!("{:08x}-", km.ptr as u64);
    let line = maps.lines().find(|l| l.starts_with(&start)).unwrap();
    let end = u64::from_str_radix(line.split(['-', ' ']).nth(1).unwrap(), 16).unwrap();
    let ours = mm.vmas().into_iter().find(|v| v.start == a).unwrap();
    assert_eq!(
        (ours.end - a, strip_line(&ours.maps_line())),
        (end - km.ptr as u64, strip_line(line)),
        "the kernel's line: {line}"
    );
}

#[test]
fn failed_private_stores_past_the_end_prepare_an_anon_vma_like_the_kernel() {
    // A store past the object's end in a private mapping fails (SIGBUS),
    // but Linux's do_cow_fault has given the VMA its anon_vma first. Two
    // pieces so marked, apart (a piece with none between them), get two
    // anon_vmas and never merge again, while unmarked pieces would.
    let k = KernelFd::new("bus-anon").unwrap();
    k.truncate(PAGE).unwrap();
    let km = KMap::new(&k, 4 * PAGE, libc::MAP_PRIVATE, 0).unwrap();
    let mm = AddressSpace::new(Config::default());
    let m = Memfd::new_in(mm.frame_pool(), "bus-anon", PAGE).unwrap();
    let a = mm
        .mmap_fd(0, 4 * PAGE, RW, MapFlags::PRIVATE, &m, 0)
        .unwrap();
    let p = PAGE as usize;
    // Pieces [0, 2) RW, [2, 3) none, [3, 4) RW.
    km.mprotect(2 * p, p, libc::PROT_NONE);
    mm.mprotect(a + 2 * PAGE, PAGE, Prot::NONE).unwrap();
    // Stores past the end (page 0 is inside the object: not touched).
    for page in [1u64, 3] {
        let e = mm.write(a + page * PAGE + 8, &[1]).err().map(|e| e.errno());
        assert_eq!(e, Some(km.store_errno(page as usize * p + 8, &[1])));
        assert_eq!(e, Some(libc::EFAULT), "page {page}");
    }
    km.mprotect(0, 4 * p, libc::PROT_READ | libc::PROT_WRITE);
    mm.mprotect(a, 4 * PAGE, RW).unwrap();
    let ours: Vec<(u64, u64, String)> = mm
        .vmas()
        .into_iter()
        .filter(|v| a <= v.start && v.end <= a + 4 * PAGE)
        .map(|v| (v.start - a, v.end - a, strip_line(&v.maps_line())))
        .collect();
    let kernel = km.layout();
    assert_eq!(kernel.len(), 2, "the kernel keeps two pieces: {kernel:?}");
    assert_eq!(ours, kernel);
}
