//! `Memfd` against the running kernel's `memfd_create`: the same random
//! sequence of `pwrite`, `pread` and `ftruncate` calls (offsets near page
//! boundaries, past the end, near the largest size, overflowing) made on
//! a real memfd and on a [`Memfd`], comparing every result, errno and byte
//! read; name checks; hostile arguments never panic; a stress test of
//! copies racing truncation; and the frames return to the pool.

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
                        ours(m.write_at(off, &data)),
                        k.pwrite(off, &data),
                        "{what}: write_at {off:#x} {n}"
                    );
                }
                _ => {
                    let off = rng.offset();
                    let n = rng.below(3 * PAGE) as usize;
                    let (mut a, mut b) = (vec![0xeeu8; n], vec![0xeeu8; n]);
                    let r = ours(m.read_at(off, &mut a));
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
    assert_eq!(m.write_at(PAGE - 2, b"abcd").unwrap(), 4);
    let mut buf = [0u8; 4];
    assert_eq!(c.read_at(PAGE - 2, &mut buf).unwrap(), 4);
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
    let n = m.write_at(0, &data).unwrap();
    assert!(n > 0 && n < data.len(), "short write of {n}");
    assert_eq!(m.len(), n as u64, "grows only by what was written");
    let far = m.write_at(1 << 40, b"x");
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
        let _ = m.read_at(v, &mut buf);
        let _ = m.write_at(v, &buf[..1]);
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
                        let _ = m.write_at(off, &[0x5a; 100]);
                    } else {
                        let n = m.read_at(off, &mut buf).unwrap();
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
    assert_eq!(m.read_at(0, &mut buf).unwrap(), buf.len());
    assert!(
        buf.iter().all(|&b| b == 0),
        "a shrink to zero drops every byte"
    );
}
