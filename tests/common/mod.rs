//! Shared harness of `kernel_diff.rs` and `semantics/` (and
//! `kernel_diff`'s random call generator, [`gen`]): the same
//! operations on the real kernel ([`kernel::KernelTarget`]) and on an
//! [`aspace::AddressSpace`] ([`AspaceTarget`]), with normalized results.
//!
//! Both targets work on a [`Region`]: one guard page (shared anonymous,
//! read-only, so it never merges), `pages` interior pages where tests
//! operate, one guard page. The aspace target is configured with Linux
//! x86-64's defaults and the same guard pages at the same addresses, so the
//! same call has the same meaning on both sides.
//!
//! Normalized results: `Ok(value)` or `Err(errno)`; layouts are the VMAs
//! inside the region as (start, end, perms `rwxp`/`rwxs`, offset, shared
//! object ordinal); data is the bytes loaded through `read`.
#![allow(dead_code)]

pub mod aspace_target;
pub mod gen;
pub mod kernel;
pub mod ops;

pub use aspace_target::AspaceTarget;
pub use kernel::KernelTarget;

use std::fmt;

/// The page size both sides use.
pub const PAGE: u64 = 4096;
/// Linux x86-64 `TASK_SIZE` with 4-level paging (also aspace's default).
pub const TASK_SIZE: u64 = (1 << 47) - PAGE;
/// The last page of the 64-bit address space.
pub const LAST_PAGE: u64 = !(PAGE - 1);

pub const PROT_NONE: u32 = 0;
pub const PROT_READ: u32 = 1;
pub const PROT_WRITE: u32 = 2;
pub const PROT_EXEC: u32 = 4;
pub const RW: u32 = PROT_READ | PROT_WRITE;

pub const MAP_SHARED: u32 = 0x01;
pub const MAP_PRIVATE: u32 = 0x02;
pub const MAP_FIXED: u32 = 0x10;
pub const MAP_ANONYMOUS: u32 = 0x20;
pub const MAP_GROWSDOWN: u32 = 0x100;
pub const MAP_NORESERVE: u32 = 0x4000;
pub const MAP_POPULATE: u32 = 0x8000;
pub const MAP_FIXED_NOREPLACE: u32 = 0x10_0000;
/// `MAP_PRIVATE | MAP_ANONYMOUS`.
pub const ANON: u32 = MAP_PRIVATE | MAP_ANONYMOUS;
/// `MAP_SHARED | MAP_ANONYMOUS`.
pub const SHARED_ANON: u32 = MAP_SHARED | MAP_ANONYMOUS;

pub const MREMAP_MAYMOVE: u32 = 1;
pub const MREMAP_FIXED: u32 = 2;
pub const MREMAP_DONTUNMAP: u32 = 4;

pub const MADV_NORMAL: i32 = 0;
pub const MADV_DONTNEED: i32 = 4;

pub const EPERM: i32 = 1;
pub const ENOMEM: i32 = 12;
pub const EFAULT: i32 = 14;
pub const EEXIST: i32 = 17;
pub const EINVAL: i32 = 22;

/// The guard pages at both ends of a region.
pub const GUARD_PROT: u32 = PROT_READ;
pub const GUARD_FLAGS: u32 = MAP_SHARED | MAP_ANONYMOUS | MAP_FIXED;

/// A normalized result: the value, or Linux's errno.
pub type Res<T> = Result<T, i32>;

/// `PAGE_ALIGN(len)`, None where it overflows.
pub fn page_align(len: u64) -> Option<u64> {
    len.checked_add(PAGE - 1).map(|l| l & !(PAGE - 1))
}

/// Where a test operates: `[start, lo)` and `[hi, end)` are guard pages,
/// `[lo, hi)` the interior.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    pub start: u64,
    pub lo: u64,
    pub hi: u64,
    pub end: u64,
}

impl Region {
    pub fn new(start: u64, pages: u64) -> Region {
        Region {
            start,
            lo: start + PAGE,
            hi: start + PAGE + pages * PAGE,
            end: start + 2 * PAGE + pages * PAGE,
        }
    }

    /// Interior pages.
    pub fn pages(&self) -> u64 {
        (self.hi - self.lo) / PAGE
    }

    /// Address of interior page `i`.
    pub fn page(&self, i: u64) -> u64 {
        self.lo + i * PAGE
    }

    pub fn contains(&self, addr: u64) -> bool {
        addr >= self.start && addr < self.end
    }
}

/// One VMA as `/proc/self/maps` shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Vma {
    pub start: u64,
    pub end: u64,
    /// `rwxp` / `r--s` ...
    pub perms: String,
    /// The offset column (0 for private anonymous memory; the page offset
    /// in the object, in bytes, for shared anonymous memory).
    pub offset: u64,
    /// Identity of the shared object: the inode (kernel) or shmem id
    /// (aspace) before [`normalize`], then its rank of first appearance.
    pub obj: Option<u64>,
}

impl fmt::Debug for Vma {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:x}-{:x} {}", self.start, self.end, self.perms)?;
        if let Some(o) = self.obj {
            write!(f, " off={:x} obj#{o}", self.offset)?;
        } else if self.offset != 0 {
            write!(f, " off={:x}", self.offset)?;
        }
        Ok(())
    }
}

/// Replaces shared-object identities by their rank of first appearance, so
/// that kernel inodes and aspace ids compare.
pub fn normalize(mut v: Vec<Vma>) -> Vec<Vma> {
    let mut seen: Vec<u64> = Vec::new();
    for m in v.iter_mut() {
        if let Some(id) = m.obj {
            let rank = match seen.iter().position(|&x| x == id) {
                Some(r) => r,
                None => {
                    seen.push(id);
                    seen.len() - 1
                }
            };
            m.obj = Some(rank as u64);
        }
    }
    v
}

/// The `VmFlags` mnemonics of `/proc/pid/smaps` that aspace models.
pub const MODELLED_FLAGS: [&str; 22] = [
    "rd", "wr", "ex", "sh", "mr", "mw", "me", "ms", "gd", "ac", "nr", "lo", "sf", "hg", "nh", "sr",
    "rr", "dc", "wf", "lf", "dd", "dp",
];

/// Keeps only the modelled mnemonics, sorted.
pub fn comparable_flags(mut f: Vec<String>) -> Vec<String> {
    f.retain(|m| MODELLED_FLAGS.contains(&m.as_str()));
    f.sort();
    f
}

/// The operations both sides run. Flags are raw Linux bits, passed
/// unchanged to libc and to aspace (`from_bits_retain`).
pub trait Target {
    fn name(&self) -> &'static str;
    fn region(&self) -> Region;
    fn mmap(&mut self, addr: u64, len: u64, prot: u32, flags: u32) -> Res<u64>;
    fn munmap(&mut self, addr: u64, len: u64) -> Res<()>;
    fn mprotect(&mut self, addr: u64, len: u64, prot: u32) -> Res<()>;
    fn mremap(
        &mut self,
        old: u64,
        old_len: u64,
        new_len: u64,
        flags: u32,
        new_addr: u64,
    ) -> Res<u64>;
    fn madvise(&mut self, addr: u64, len: u64, advice: i32) -> Res<()>;
    /// Stores (write faults); EFAULT at the first page that cannot be
    /// written (the kernel side has written the pages before it).
    fn write(&mut self, addr: u64, data: &[u8]) -> Res<()>;
    /// Loads (read faults); EFAULT if a page cannot be read.
    fn read(&mut self, addr: u64, buf: &mut [u8]) -> Res<()>;
    /// Unmaps the mapping the last mmap/mremap placed outside the region
    /// (at `addr`, `len` bytes page-aligned).
    fn unmap_outside(&mut self, addr: u64, len: u64) -> Res<()>;
    /// The VMAs inside the region (guards included), normalized.
    fn layout(&mut self) -> Vec<Vma>;
    /// (start, end, modelled VmFlags mnemonics) of the VMAs in the region.
    fn vm_flags(&mut self) -> Option<Vec<(u64, u64, Vec<String>)>>;
    /// `mlock2` (flags 0 is `mlock`).
    fn mlock2(&mut self, addr: u64, len: u64, flags: u32) -> Res<()>;
    fn munlock(&mut self, addr: u64, len: u64) -> Res<()>;
    /// `msync` (anonymous memory: the argument and hole checks only).
    fn msync(&mut self, addr: u64, len: u64, flags: u32) -> Res<()>;
    /// `mincore` of `len` bytes: one entry per page, or the errno.
    fn mincore(&mut self, addr: u64, len: u64) -> Res<Vec<bool>>;
    /// Which of `pages` pages from `addr` have a page-table entry
    /// (`mincore`); None where the target cannot tell.
    fn resident(&mut self, addr: u64, pages: u64) -> Option<Vec<bool>>;
    /// The address space, on the aspace side.
    fn aspace(&self) -> Option<&aspace::AddressSpace>;
    /// `ftruncate` of memory object `obj` (one of [`OBJECTS`], made empty
    /// by `memfd_create` on first use).
    fn obj_truncate(&mut self, obj: u32, len: u64) -> Res<()>;
    /// `mmap` of a memory object.
    fn mmap_obj(&mut self, m: ops::ObjMapping) -> Res<u64>;
    /// `mmap` of host file `file` (open for reading; `name` is its path),
    /// from byte `off`: the kernel maps the file, aspace a file object
    /// made from it ([`aspace::Memfd::from_file`]).
    fn mmap_file(&mut self, m: ops::ObjMapping, file: &std::fs::File, name: &str) -> Res<u64>;
    /// `pwrite` to memory object `obj`: bytes written.
    fn obj_write(&mut self, obj: u32, off: u64, data: &[u8]) -> Res<usize>;
    /// `pread` from memory object `obj`: bytes read.
    fn obj_read(&mut self, obj: u32, off: u64, buf: &mut [u8]) -> Res<usize>;
}

/// Memory objects (memfds) a target has: 0 and 1.
pub const OBJECTS: u32 = 2;

/// The name of memory object `obj` (`/memfd:NAME (deleted)` in maps).
pub fn obj_name(obj: u32) -> String {
    format!("kdiff{obj}")
}

/// A layout relative to the interior, in pages, for readable assertions:
/// (first page, end page, perms). Guards are left out.
pub fn rel_layout(t: &mut dyn Target) -> Vec<(i64, i64, String)> {
    let r = t.region();
    t.layout()
        .into_iter()
        .filter(|v| v.start >= r.lo && v.end <= r.hi)
        .map(|v| {
            (
                ((v.start - r.lo) / PAGE) as i64,
                ((v.end - r.lo) / PAGE) as i64,
                v.perms,
            )
        })
        .collect()
}

/// Asserts the interior layout, pages relative to the interior start.
#[track_caller]
pub fn assert_layout(t: &mut dyn Target, want: &[(i64, i64, &str)]) {
    let got = rel_layout(t);
    let want: Vec<(i64, i64, String)> = want
        .iter()
        .map(|&(s, e, p)| (s, e, p.to_string()))
        .collect();
    assert_eq!(
        got,
        want,
        "[{}] layout (pages relative to the interior start)\n{}",
        t.name(),
        dump(t)
    );
}

/// The full region layout, one line each.
pub fn dump(t: &mut dyn Target) -> String {
    let r = t.region();
    let mut s = String::new();
    for v in t.layout() {
        s.push_str(&format!(
            "    {:?}   (pages {}..{})\n",
            v,
            (v.start as i64 - r.lo as i64) / PAGE as i64,
            (v.end as i64 - r.lo as i64) / PAGE as i64
        ));
    }
    s
}

/// Reads `len` bytes, panicking with the target name on failure.
#[track_caller]
pub fn read_vec(t: &mut dyn Target, addr: u64, len: usize) -> Res<Vec<u8>> {
    let mut b = vec![0u8; len];
    t.read(addr, &mut b).map(|_| b)
}

/// A byte pattern that differs per (seed, address).
pub fn pattern(seed: u64, addr: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| {
            let x = (addr + i).wrapping_mul(0x9E37_79B9_7F4A_7C15)
                ^ seed.wrapping_mul(0xD1B5_4A32_D192_ED03);
            (x >> 56) as u8 | 1 // never 0, so zero-fill is always visible
        })
        .collect()
}

/// Runs `f` on the kernel (when it can be used here) and then on aspace,
/// each on a fresh region of `pages` interior pages. Expectations written
/// inside `f` are thereby checked against Linux itself, then required of
/// aspace. Returns whether the kernel side ran.
pub fn on_both(pages: u64, f: impl Fn(&mut dyn Target)) -> bool {
    on_both_if(true, pages, f)
}

/// [`on_both`] where the running kernel has the feature under test
/// (`kernel_has_it`), else on aspace alone. True if the kernel side ran.
pub fn on_both_if(kernel_has_it: bool, pages: u64, f: impl Fn(&mut dyn Target)) -> bool {
    if !kernel_has_it {
        f(&mut AspaceTarget::new(Region::new(
            aspace_target::DEFAULT_REGION_START,
            pages,
        )));
        return false;
    }
    let ran_kernel = match KernelTarget::new(pages) {
        Some(mut k) => {
            f(&mut k);
            true
        }
        None => false,
    };
    let mut a = AspaceTarget::new(Region::new(aspace_target::DEFAULT_REGION_START, pages));
    f(&mut a);
    ran_kernel
}
