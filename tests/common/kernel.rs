//! The real kernel as a [`Target`]: libc calls on a region of this process.
//!
//! # The region
//!
//! [`KernelTarget::new`] claims `pages + 2` pages at a fixed address in
//! `0x2000_0000_0000..` (below the PIE, the brk heap and the top-down mmap
//! area, so neither this process's allocator nor another test thread ever
//! places anything there by itself) with `MAP_FIXED_NOREPLACE`, then unmaps
//! the interior so that it is a real hole, and keeps one guard page at each
//! end (shared anonymous, read-only: it never merges with anything). Every
//! operation a test issues is checked by [`KernelTarget::assert_safe`]
//! before it reaches the kernel: anything that could change memory must lie
//! inside the interior, or have a shape the kernel rejects before it
//! changes anything (unaligned address, overflowing length, above the task
//! size). An operation that would break that rule is a bug of the test and
//! panics before the system call.
//!
//! # Placements
//!
//! The kernel places a mapping with no usable address at the top of this
//! process's mmap area, far from the region. [`KernelTarget::confine_placements`]
//! makes such placements comparable with aspace's: around every call
//! that may place a mapping (mmap without `MAP_FIXED`/`MAP_FIXED_NOREPLACE`,
//! a `MREMAP_MAYMOVE` mremap without `MREMAP_FIXED`), every free gap
//! above the region that the top-down search could reach is reserved
//! with an inaccessible `MAP_NORESERVE` filler (the gaps `/proc/self/maps`
//! shows, then what a one-page probe finds below `mmap_base` under the
//! stack), and the fillers are unmapped right after the call. So the
//! kernel searches the region's interior first and the free space below
//! the region next, as an aspace whose `mmap_base` is the region's end
//! ([`super::AspaceTarget::confined`]). Nothing allocates between the
//! filling and the call: a mapping the process made for itself then
//! would land in the region.
//!
//! # Loads and stores
//!
//! `read`/`write` go through a pipe: `write(pipe, addr, n)` makes the kernel
//! load from `addr` (`copy_from_user`) and `read(pipe, addr, n)` makes it
//! store to `addr` (`copy_to_user`). Those faults take the same path as
//! user-mode loads and stores (`do_user_addr_fault`: VMA lookup, access
//! check, stack expansion, read faults mapping the zero page, write faults
//! assigning an anon_vma, SIGBUS past a shared object becoming `EFAULT`),
//! but a bad address returns `EFAULT` instead of killing the test. Copies
//! are done one page at a time, stopping at the first page that faults:
//! like a real `memcpy`, the pages before it are already written.

use super::{page_align, Region, Res, Target, Vma, PAGE, TASK_SIZE};
use std::io::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;

/// First address tried for regions.
const REGION_BASE: u64 = 0x2000_0000_0000;
/// Distance between the regions of two targets.
const REGION_STRIDE: u64 = 1 << 32;

static NEXT_SLOT: AtomicU64 = AtomicU64::new(0);

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// The running kernel's release (`uname -r`).
pub fn kernel_release() -> String {
    // SAFETY: utsname is plain old data; all-zero bytes are a valid value.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid, writable utsname that uname fills in.
    if unsafe { libc::uname(&mut u) } != 0 {
        return "unknown".into();
    }
    let bytes: Vec<u8> = u
        .release
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The running kernel's (major, minor) version, (0, 0) if unknown.
pub fn kernel_version() -> (u32, u32) {
    let rel = kernel_release();
    let mut it = rel
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty());
    let major = it.next().and_then(|s| s.parse().ok()).unwrap_or(0);
    let minor = it.next().and_then(|s| s.parse().ok()).unwrap_or(0);
    (major, minor)
}

/// The locked-memory limit this process has in effect: `u64::MAX` with
/// `CAP_IPC_LOCK` (bit 14 of `CapEff` in /proc/self/status), else the soft
/// `RLIMIT_MEMLOCK` (`RLIM_INFINITY` is `u64::MAX` too).
pub fn process_memlock_limit() -> u64 {
    const CAP_IPC_LOCK: u32 = 14;
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let cap_eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    if cap_eff >> CAP_IPC_LOCK & 1 == 1 {
        return u64::MAX;
    }
    // SAFETY: rlimit is plain old data; getrlimit fills it in.
    let mut rl: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: `rl` is a valid, writable rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut rl) } != 0 {
        return u64::MAX;
    }
    rl.rlim_cur
}

/// Whether this kernel makes `PROT_EXEC`-only memory unreadable (x86-64
/// Linux gives it the execute-only protection key on CPUs with PKU): maps
/// one such page and has the kernel load from it (`write` to a pipe,
/// whose `copy_from_user` honours the key and fails with `EFAULT`).
pub fn kernel_exec_only() -> bool {
    static ANSWER: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ANSWER.get_or_init(|| {
        let len = 4096;
        // SAFETY: a fresh anonymous mapping at an address of the kernel's
        // choice; nothing else refers to it.
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len,
                libc::PROT_EXEC,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED, "mmap(PROT_EXEC)");
        let loads = kernel_loads(p as u64);
        // SAFETY: unmapping our own page, used no more.
        unsafe { libc::munmap(p, len) };
        !loads
    })
}

/// Whether the kernel can load the byte at `addr` of this process
/// (`write` to a pipe: `copy_from_user` honours protection keys and fails
/// with `EFAULT` instead of faulting us).
pub fn kernel_loads(addr: u64) -> bool {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: the kernel loads from `addr` with copy_from_user.
    let w = unsafe { libc::write(fds[1], addr as *const libc::c_void, 1) };
    // SAFETY: closing our own descriptors.
    unsafe {
        libc::close(fds[0]);
        libc::close(fds[1]);
    }
    w == 1
}

/// Prints the kernel version once per test binary, straight to stderr (not
/// through the test harness's capture, so it shows in every run).
pub fn banner() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = writeln!(
            std::io::stderr(),
            "kernel under comparison: Linux {} (uname -r)",
            kernel_release()
        );
    });
}

/// Says why the kernel side is skipped, once per reason, and returns None.
fn skip<T>(why: &str) -> Option<T> {
    let _ = writeln!(
        std::io::stderr(),
        "kernel side skipped: {why}; only aspace runs"
    );
    None
}

/// The real kernel, operating on a reserved region of this process.
pub struct KernelTarget {
    region: Region,
    /// Pipe used for kernel-mode copies: [read end, write end].
    pipe: [libc::c_int; 2],
    /// The last mapping the kernel placed outside the region (address,
    /// length), which only [`Target::unmap_outside`] may remove.
    outside: Option<(u64, u64)>,
    /// Memory objects' descriptors, made on first use.
    objs: Vec<Option<libc::c_int>>,
    /// Placements are confined to the region and below it (see the
    /// module's `# Placements`).
    confined: bool,
}

/// The fillers of one confined placement (see the module's
/// `# Placements`), unmapped on drop.
struct Fillers(Vec<(u64, u64)>);

impl Fillers {
    /// Reserves `[start, end)` (free, above the region).
    fn add(&mut self, start: u64, end: u64) {
        // SAFETY: MAP_FIXED_NOREPLACE creates an inaccessible mapping only
        // where nothing is mapped; no Rust object lives in a free range.
        let p = unsafe {
            libc::mmap(
                start as *mut libc::c_void,
                (end - start) as usize,
                libc::PROT_NONE,
                libc::MAP_PRIVATE
                    | libc::MAP_ANONYMOUS
                    | libc::MAP_NORESERVE
                    | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        assert_eq!(
            p as u64,
            start,
            "placement filler {start:#x}-{end:#x}: errno {} (did another thread map memory?)",
            errno()
        );
        self.0.push((start, end));
    }
}

impl Drop for Fillers {
    fn drop(&mut self) {
        for &(s, e) in &self.0 {
            // SAFETY: a filler this object mapped, used by nothing.
            let rc = unsafe { libc::munmap(s as *mut libc::c_void, (e - s) as usize) };
            assert_eq!(rc, 0, "munmap of a placement filler");
        }
    }
}

/// A one-page shared mapping where the kernel's search puts it (shared
/// anonymous memory merges with nothing and is never huge-aligned),
/// unmapped at once: where the next plain placement would go.
fn probe() -> u64 {
    // SAFETY: a fresh mapping at an address of the kernel's choice,
    // unmapped below; nothing refers to it.
    let p = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            PAGE as usize,
            libc::PROT_NONE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED, "placement probe: errno {}", errno());
    // SAFETY: the page just mapped.
    unsafe { libc::munmap(p, PAGE as usize) };
    p as u64
}

impl KernelTarget {
    /// Claims a region with `pages` interior pages, or explains on stderr
    /// why the kernel cannot be used here and returns None.
    pub fn new(pages: u64) -> Option<KernelTarget> {
        Self::new_at_phase(pages, 0)
    }

    /// [`new`](Self::new) with the region starting `phase` bytes (a page
    /// multiple below 4 GiB) past its usual 4 GiB-aligned address: with a
    /// phase that is no multiple of 2 MiB, a mapping placed right below
    /// the region shows whether its placement was 2 MiB-aligned.
    pub fn new_at_phase(pages: u64, phase: u64) -> Option<KernelTarget> {
        assert!(phase % PAGE == 0 && phase + (pages + 2) * PAGE <= REGION_STRIDE);
        if !cfg!(all(target_os = "linux", target_arch = "x86_64")) {
            return skip("not Linux x86-64");
        }
        banner();
        // SAFETY: sysconf has no memory-safety preconditions.
        let ps = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if ps != PAGE as libc::c_long {
            return skip(&format!("page size is {ps}, not 4096"));
        }
        if let Err(e) = std::fs::read_to_string("/proc/self/maps") {
            return skip(&format!("/proc/self/maps unreadable: {e}"));
        }
        let total = (pages + 2) * PAGE;
        let mut claimed = None;
        for _ in 0..64 {
            let slot = NEXT_SLOT.fetch_add(1, Ordering::Relaxed) % 4096;
            let want = REGION_BASE + slot * REGION_STRIDE + phase;
            // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing
            // mapping; it only creates a new inaccessible one if the whole
            // range is free. No Rust object lives in a free range.
            let p = unsafe {
                libc::mmap(
                    want as *mut libc::c_void,
                    total as usize,
                    libc::PROT_NONE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                match errno() {
                    libc::EEXIST => continue,
                    e => return skip(&format!("mmap of the test region failed, errno {e}")),
                }
            }
            if p as u64 != want {
                // A kernel before 4.17 takes MAP_FIXED_NOREPLACE as a hint.
                // SAFETY: `p` is the mapping the kernel just made for us.
                unsafe { libc::munmap(p, total as usize) };
                return skip("MAP_FIXED_NOREPLACE not supported (kernel < 4.17)");
            }
            claimed = Some(want);
            break;
        }
        let Some(start) = claimed else {
            return skip("no free slot for the test region");
        };
        let region = Region::new(start, pages);
        let mut fds = [0; 2];
        // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            // SAFETY: the region is ours (claimed above).
            unsafe { libc::munmap(start as *mut libc::c_void, total as usize) };
            return skip("pipe2 failed");
        }
        let t = KernelTarget {
            region,
            pipe: fds,
            outside: None,
            objs: vec![None; super::OBJECTS as usize],
            confined: false,
        };
        // Turn the interior into a hole and put the guards in place.
        // SAFETY: the interior lies in the region claimed above, where no
        // Rust object lives.
        let rc = unsafe {
            libc::munmap(
                region.lo as *mut libc::c_void,
                (region.hi - region.lo) as usize,
            )
        };
        assert_eq!(rc, 0, "munmap of the region interior");
        for g in [region.start, region.hi] {
            // SAFETY: MAP_FIXED on a guard page of the region claimed above
            // (it replaces our own PROT_NONE reservation only).
            let p = unsafe {
                libc::mmap(
                    g as *mut libc::c_void,
                    PAGE as usize,
                    super::GUARD_PROT as i32,
                    super::GUARD_FLAGS as i32,
                    -1,
                    0,
                )
            };
            assert_eq!(p as u64, g, "guard page mapping");
        }
        Some(t)
    }

    /// Panics unless the call can only change memory inside the region's
    /// interior. `ranges` are (addr, len, fixed): ranges the call may change
    /// if it succeeds; `fails_early` says the kernel rejects the call's
    /// shape before changing anything.
    fn assert_safe(&self, what: &str, ranges: &[(u64, u64)], fails_early: bool) {
        if fails_early {
            return;
        }
        for &(addr, len) in ranges {
            let inside = match page_align(len) {
                Some(l) => {
                    addr >= self.region.lo && addr <= self.region.hi && l <= self.region.hi - addr
                }
                None => true, // PAGE_ALIGN(len) wraps to 0: every call rejects it
            };
            let harmless = addr % PAGE != 0 || len == 0 || addr >= TASK_SIZE;
            assert!(
                inside || harmless,
                "test bug: {what} on {addr:#x}+{len:#x} could touch memory outside the test \
                 region {:#x}..{:#x}",
                self.region.lo,
                self.region.hi
            );
        }
    }

    /// [`assert_safe`](Self::assert_safe) for mlock's rounding: the start
    /// down to its page, the length grown by the offset and rounded up,
    /// wrapping as the kernel's `PAGE_ALIGN`.
    fn assert_lock_range(&self, what: &str, addr: u64, len: u64) {
        let start = addr & !(PAGE - 1);
        let l = len.wrapping_add(addr - start).wrapping_add(PAGE - 1) & !(PAGE - 1);
        // Nothing to lock, or an end that wraps (EINVAL).
        let fails_early = l == 0 || start.checked_add(l).is_none();
        self.assert_safe(what, &[(start, l)], fails_early);
    }

    /// Reads from/stores to `addr` through the pipe, one page at a time.
    fn copy(
        &mut self,
        addr: u64,
        len: usize,
        mut each: impl FnMut(&mut Self, u64, usize, usize) -> bool,
    ) -> Res<()> {
        let mut a = addr;
        let end = addr.checked_add(len as u64).ok_or(libc::EFAULT)?;
        while a < end {
            // The next page boundary (saturating in the last page of u64).
            let n = (a / PAGE + 1).saturating_mul(PAGE).min(end) - a;
            if !each(self, a, (a - addr) as usize, n as usize) {
                return Err(libc::EFAULT);
            }
            a += n;
        }
        Ok(())
    }

    /// Empties the pipe (after a copy that stopped half-way).
    fn drain(&mut self) {
        let mut scratch = [0u8; 4096];
        loop {
            let mut avail: libc::c_int = 0;
            // SAFETY: FIONREAD stores an int into `avail`.
            let rc = unsafe { libc::ioctl(self.pipe[0], libc::FIONREAD, &mut avail) };
            if rc != 0 || avail <= 0 {
                return;
            }
            let n = (avail as usize).min(scratch.len());
            // SAFETY: reading into our own stack buffer of at least n bytes.
            let r = unsafe { libc::read(self.pipe[0], scratch.as_mut_ptr().cast(), n) };
            if r <= 0 {
                return;
            }
        }
    }

    /// /proc/self/smaps `VmFlags` of every VMA inside the region, as
    /// (start, end, sorted mnemonics).
    pub fn smaps_flags(&self) -> Vec<(u64, u64, Vec<String>)> {
        let text = std::fs::read_to_string("/proc/self/smaps").expect("read /proc/self/smaps");
        for v in text.lines().filter_map(parse_maps_line) {
            self.check_straddle(v.start, v.end);
        }
        smaps_flags_in(&text, self.region.start, self.region.end)
    }

    /// From now on, placements the kernel chooses fall in the region or
    /// below it (see the module's `# Placements`).
    pub fn confine_placements(&mut self) {
        self.confined = true;
    }

    /// Reserves every gap above the region that the kernel's top-down
    /// search could reach, when placements are confined.
    fn fill_above(&self) -> Fillers {
        let mut fillers = Fillers(Vec::new());
        if !self.confined {
            return fillers;
        }
        let text = std::fs::read_to_string("/proc/self/maps").expect("read /proc/self/maps");
        let mut gaps = Vec::new();
        let mut prev = self.region.end;
        for line in text.lines() {
            let Some(v) = parse_maps_line(line) else {
                continue;
            };
            if v.end <= prev {
                continue;
            }
            // The gap below the stack holds `mmap_base`, which only a
            // probe finds.
            if line.ends_with("[stack]") || v.start >= TASK_SIZE {
                break;
            }
            if v.start > prev {
                gaps.push((prev, v.start));
            }
            prev = v.end;
        }
        // Room for the fillers of the gap under the stack, so that
        // nothing allocates once filling has begun.
        fillers.0.reserve(gaps.len() + 4);
        for (s, e) in gaps {
            fillers.add(s, e);
        }
        for _ in 0..4 {
            let p = probe();
            if p < self.region.end {
                return fillers;
            }
            assert!(
                p >= prev,
                "placement probe {p:#x} below the filled area's top {prev:#x}"
            );
            fillers.add(prev, p + PAGE);
            prev = p + PAGE;
        }
        panic!("placement probes keep landing above the test region");
    }

    /// The raw `/proc/self/maps` lines of the region's VMAs.
    pub fn maps_lines(&self) -> Vec<String> {
        let text = std::fs::read_to_string("/proc/self/maps").expect("read /proc/self/maps");
        text.lines()
            .filter(|l| {
                parse_maps_line(l)
                    .is_some_and(|v| v.start >= self.region.start && v.end <= self.region.end)
            })
            .map(str::to_string)
            .collect()
    }

    fn check_straddle(&self, s: u64, e: u64) {
        let r = &self.region;
        let straddles = (s < r.start && e > r.start) || (s < r.end && e > r.end);
        assert!(
            !straddles,
            "harness invariant broken: VMA {s:#x}-{e:#x} crosses the edge of the test region {:#x}-{:#x}",
            r.start, r.end
        );
    }
}

/// The `VmFlags` of the VMAs of a `/proc/pid/smaps` text that lie inside
/// `[start, end)`, as (start, end, sorted mnemonics).
pub fn smaps_flags_in(text: &str, start: u64, end: u64) -> Vec<(u64, u64, Vec<String>)> {
    let mut out = Vec::new();
    let mut cur: Option<(u64, u64)> = None;
    for line in text.lines() {
        if let Some(v) = parse_maps_line(line) {
            cur = (v.start >= start && v.end <= end).then_some((v.start, v.end));
        } else if let Some(rest) = line.strip_prefix("VmFlags:") {
            if let Some((s, e)) = cur.take() {
                let mut f: Vec<String> = rest.split_whitespace().map(str::to_string).collect();
                f.sort();
                out.push((s, e, f));
            }
        }
    }
    out
}

/// Parses one `/proc/pid/maps` line into a [`Vma`] (shared-object identity
/// = the inode, to be normalized by the caller).
pub fn parse_maps_line(line: &str) -> Option<Vma> {
    let mut it = line.split_whitespace();
    let range = it.next()?;
    let (s, e) = range.split_once('-')?;
    let start = u64::from_str_radix(s, 16).ok()?;
    let end = u64::from_str_radix(e, 16).ok()?;
    let perms = it.next()?;
    if perms.len() != 4 {
        return None;
    }
    let offset = u64::from_str_radix(it.next()?, 16).ok()?;
    let _dev = it.next()?;
    let inode: u64 = it.next()?.parse().ok()?;
    Some(Vma {
        start,
        end,
        perms: perms.to_string(),
        offset,
        obj: (inode != 0).then_some(inode),
    })
}

impl Drop for KernelTarget {
    fn drop(&mut self) {
        let r = self.region;
        // SAFETY: the whole region is ours (claimed in new, never left);
        // nothing else was mapped into it.
        unsafe {
            libc::munmap(r.start as *mut libc::c_void, (r.end - r.start) as usize);
            libc::close(self.pipe[0]);
            libc::close(self.pipe[1]);
            for fd in self.objs.iter().flatten() {
                libc::close(*fd);
            }
        }
    }
}

impl KernelTarget {
    /// The descriptor of memory object `obj`, made (empty) on first use.
    fn obj(&mut self, obj: u32) -> libc::c_int {
        *self.objs[obj as usize].get_or_insert_with(|| {
            let name = std::ffi::CString::new(super::obj_name(obj)).expect("no NUL");
            // SAFETY: `name` is a valid NUL-terminated string.
            let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
            assert!(fd >= 0, "memfd_create: errno {}", errno());
            fd
        })
    }

    /// `mmap` of `fd` from `off` (`-1`: anonymous memory).
    fn mmap_fd(
        &mut self,
        addr: u64,
        len: u64,
        prot: u32,
        flags: u32,
        fd: i32,
        off: u64,
    ) -> Res<u64> {
        let placing = flags & (libc::MAP_FIXED | libc::MAP_FIXED_NOREPLACE) as u32 != 0;
        if placing {
            // get_unmapped_area rejects a fixed range past the task size.
            let fails_early = page_align(len).is_none_or(|l| l > TASK_SIZE || addr > TASK_SIZE - l);
            self.assert_safe("mmap", &[(addr, len)], fails_early);
        }
        let fillers = if placing {
            Fillers(Vec::new())
        } else {
            self.fill_above()
        };
        // SAFETY: a fixed placement lies inside the region this target
        // reserved (checked above) where no Rust object lives; a hint never
        // replaces anything. The kernel picks the address otherwise.
        let p = unsafe {
            libc::mmap(
                addr as *mut libc::c_void,
                len as usize,
                prot as i32,
                flags as i32,
                fd,
                off as i64,
            )
        };
        let res = self.note_placement(p, len);
        drop(fillers);
        res
    }

    /// The result of a call that returns an address; remembers a mapping
    /// placed outside the region.
    fn note_placement(&mut self, p: *mut libc::c_void, len: u64) -> Res<u64> {
        if p == libc::MAP_FAILED {
            return Err(errno());
        }
        let a = p as u64;
        if !self.region.contains(a) {
            self.outside = Some((a, page_align(len).expect("mapped length")));
        }
        Ok(a)
    }
}

/// A byte count from `read`/`write`-like calls, or the errno.
fn count(r: isize) -> Res<usize> {
    ret(r >= 0, r as usize)
}

fn ret<T>(rc: bool, v: T) -> Res<T> {
    if rc {
        Ok(v)
    } else {
        Err(errno())
    }
}

impl Target for KernelTarget {
    fn name(&self) -> &'static str {
        "kernel"
    }

    fn region(&self) -> Region {
        self.region
    }

    fn mmap(&mut self, addr: u64, len: u64, prot: u32, flags: u32) -> Res<u64> {
        self.mmap_fd(addr, len, prot, flags, -1, 0)
    }

    fn obj_truncate(&mut self, obj: u32, len: u64) -> Res<()> {
        let fd = self.obj(obj);
        // SAFETY: plain syscall on our own descriptor.
        ret(unsafe { libc::ftruncate(fd, len as i64) } == 0, ())
    }

    fn mmap_obj(&mut self, m: super::ops::ObjMapping) -> Res<u64> {
        let fd = self.obj(m.obj);
        self.mmap_fd(m.addr, m.len, m.prot, m.flags, fd, m.off)
    }

    fn mmap_file(
        &mut self,
        m: super::ops::ObjMapping,
        file: &std::fs::File,
        _name: &str,
    ) -> Res<u64> {
        use std::os::fd::AsRawFd;
        self.mmap_fd(m.addr, m.len, m.prot, m.flags, file.as_raw_fd(), m.off)
    }

    fn obj_write(&mut self, obj: u32, off: u64, data: &[u8]) -> Res<usize> {
        let fd = self.obj(obj);
        // SAFETY: `data` is valid for `data.len()` bytes of reads.
        count(unsafe { libc::pwrite(fd, data.as_ptr().cast(), data.len(), off as i64) })
    }

    fn obj_read(&mut self, obj: u32, off: u64, buf: &mut [u8]) -> Res<usize> {
        let fd = self.obj(obj);
        // SAFETY: `buf` is valid for `buf.len()` bytes of writes.
        count(unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), off as i64) })
    }

    fn munmap(&mut self, addr: u64, len: u64) -> Res<()> {
        // munmap rejects a range past the task size before anything.
        let fails_early = addr > TASK_SIZE || len > TASK_SIZE - addr;
        self.assert_safe("munmap", &[(addr, len)], fails_early);
        // SAFETY: the range is inside the reserved region (or the call is
        // rejected before any effect), where no Rust object lives.
        ret(
            unsafe { libc::munmap(addr as *mut libc::c_void, len as usize) } == 0,
            (),
        )
    }

    fn mprotect(&mut self, addr: u64, len: u64, prot: u32) -> Res<()> {
        self.assert_safe("mprotect", &[(addr, len)], false);
        // SAFETY: the range is inside the reserved region (or the call is
        // rejected before any effect); no Rust reference points there.
        ret(
            unsafe { libc::mprotect(addr as *mut libc::c_void, len as usize, prot as i32) } == 0,
            (),
        )
    }

    fn mremap(
        &mut self,
        old: u64,
        old_len: u64,
        new_len: u64,
        flags: u32,
        new_addr: u64,
    ) -> Res<u64> {
        let known = (libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED | libc::MREMAP_DONTUNMAP) as u32;
        let fixedish = flags & (libc::MREMAP_FIXED | libc::MREMAP_DONTUNMAP) as u32 != 0;
        let fails_early = flags & !known != 0
            || old % PAGE != 0
            || page_align(new_len).is_none_or(|l| l == 0)
            || (fixedish && (flags & libc::MREMAP_MAYMOVE as u32 == 0 || new_addr % PAGE != 0));
        let mut ranges = vec![(old, old_len)];
        if flags & libc::MREMAP_FIXED as u32 != 0 {
            ranges.push((new_addr, new_len));
        }
        self.assert_safe("mremap", &ranges, fails_early);
        let may_place =
            flags & libc::MREMAP_MAYMOVE as u32 != 0 && flags & libc::MREMAP_FIXED as u32 == 0;
        let fillers = if may_place {
            self.fill_above()
        } else {
            Fillers(Vec::new())
        };
        // SAFETY: the old range, and a FIXED destination, are inside the
        // reserved region (or the call fails before any effect); a
        // non-fixed move goes where the kernel finds a free gap.
        let p = unsafe {
            libc::mremap(
                old as *mut libc::c_void,
                old_len as usize,
                new_len as usize,
                flags as i32,
                new_addr as *mut libc::c_void,
            )
        };
        let res = self.note_placement(p, new_len);
        drop(fillers);
        res
    }

    fn madvise(&mut self, addr: u64, len: u64, advice: i32) -> Res<()> {
        self.assert_safe("madvise", &[(addr, len)], false);
        // SAFETY: the range is inside the reserved region (or the call is
        // rejected before any effect); no Rust object lives there.
        ret(
            unsafe { libc::madvise(addr as *mut libc::c_void, len as usize, advice) } == 0,
            (),
        )
    }

    fn write(&mut self, addr: u64, data: &[u8]) -> Res<()> {
        let r = self.region;
        let end = addr.checked_add(data.len() as u64);
        assert!(
            addr >= TASK_SIZE || (addr >= r.start && end.is_some_and(|e| e <= r.end)),
            "test bug: store to {addr:#x}+{:#x} outside the test region {:#x}..{:#x}",
            data.len(),
            r.start,
            r.end
        );
        let fds = self.pipe;
        let r = self.copy(addr, data.len(), |_, a, off, n| {
            // SAFETY: data[off..off + n] is a valid local buffer; the pipe
            // is empty and holds 64 KiB, so this never blocks.
            let w = unsafe { libc::write(fds[1], data[off..].as_ptr().cast(), n) };
            assert_eq!(w, n as isize, "pipe write from a local buffer");
            // SAFETY: the kernel stores into `a` with copy_to_user, which
            // checks the mapping and returns EFAULT rather than faulting
            // us; `a` is inside the reserved region, where no Rust object
            // lives.
            let r = unsafe { libc::read(fds[0], a as *mut libc::c_void, n) };
            r == n as isize
        });
        if r.is_err() {
            self.drain();
        }
        r
    }

    fn read(&mut self, addr: u64, buf: &mut [u8]) -> Res<()> {
        let fds = self.pipe;
        let len = buf.len();
        let r = self.copy(addr, len, |_, a, off, n| {
            // SAFETY: the kernel loads from `a` with copy_from_user, which
            // returns EFAULT instead of faulting us.
            let w = unsafe { libc::write(fds[1], a as *const libc::c_void, n) };
            if w != n as isize {
                return false;
            }
            // SAFETY: buf[off..off + n] is a valid writable local buffer.
            let r = unsafe { libc::read(fds[0], buf[off..].as_mut_ptr().cast(), n) };
            assert_eq!(r, n as isize, "pipe read into a local buffer");
            true
        });
        if r.is_err() {
            self.drain();
        }
        r
    }

    fn unmap_outside(&mut self, addr: u64, len: u64) -> Res<()> {
        assert_eq!(
            self.outside.take(),
            Some((addr, len)),
            "test bug: unmap_outside of a range the kernel did not just place"
        );
        // SAFETY: the kernel created exactly this mapping for the previous
        // call (a fresh area it chose); nothing of ours lives there.
        ret(
            unsafe { libc::munmap(addr as *mut libc::c_void, len as usize) } == 0,
            (),
        )
    }

    fn layout(&mut self) -> Vec<Vma> {
        let text = std::fs::read_to_string("/proc/self/maps").expect("read /proc/self/maps");
        let mut out = Vec::new();
        for line in text.lines() {
            let Some(v) = parse_maps_line(line) else {
                continue;
            };
            self.check_straddle(v.start, v.end);
            if v.start >= self.region.start && v.end <= self.region.end {
                out.push(v);
            }
        }
        super::normalize(out)
    }

    fn mlock2(&mut self, addr: u64, len: u64, flags: u32) -> Res<()> {
        self.assert_lock_range("mlock2", addr, len);
        // SAFETY: the page-rounded range is inside the region (checked
        // above); mlock2 only changes VMA flags and faults pages in there.
        let rc = unsafe { libc::syscall(libc::SYS_mlock2, addr, len, flags) };
        ret(rc == 0, ())
    }

    fn munlock(&mut self, addr: u64, len: u64) -> Res<()> {
        self.assert_lock_range("munlock", addr, len);
        // SAFETY: as in `mlock2`.
        let rc = unsafe { libc::syscall(libc::SYS_munlock, addr, len) };
        ret(rc == 0, ())
    }

    fn msync(&mut self, addr: u64, len: u64, flags: u32) -> Res<()> {
        self.assert_safe("msync", &[(addr, len)], false);
        // SAFETY: the range is inside the region (or rejected before any
        // effect), where only anonymous memory lives: nothing is written
        // back.
        let rc = unsafe { libc::syscall(libc::SYS_msync, addr, len, flags) };
        ret(rc == 0, ())
    }

    fn mincore(&mut self, addr: u64, len: u64) -> Res<Vec<bool>> {
        let n = len.div_ceil(PAGE).min(1 << 20) as usize;
        let mut v = vec![0u8; n];
        if len.div_ceil(PAGE) > 1 << 20 {
            // More pages than the buffer: only a call the kernel rejects
            // before writing (the test generates no other).
            assert!(addr % PAGE != 0 || addr.checked_add(len).is_none_or(|e| e > TASK_SIZE));
        }
        // SAFETY: mincore only reads page-table state and writes one byte
        // per page into `v`, which has that many (or fails first).
        let rc = unsafe { libc::syscall(libc::SYS_mincore, addr, len, v.as_mut_ptr()) };
        ret(rc == 0, v.into_iter().map(|b| b & 1 != 0).collect())
    }

    fn resident(&mut self, addr: u64, pages: u64) -> Option<Vec<bool>> {
        let mut v = vec![0u8; pages as usize];
        // SAFETY: mincore only reads page-table state of our own address
        // space and writes one byte per page into `v`, which has `pages`
        // bytes.
        let rc = unsafe {
            libc::mincore(
                addr as *mut libc::c_void,
                (pages * PAGE) as usize,
                v.as_mut_ptr(),
            )
        };
        assert_eq!(
            rc,
            0,
            "mincore({addr:#x}, {pages} pages): errno {}",
            errno()
        );
        Some(v.into_iter().map(|b| b & 1 != 0).collect())
    }

    fn aspace(&self) -> Option<&aspace::AddressSpace> {
        None
    }

    fn vm_flags(&mut self) -> Option<Vec<(u64, u64, Vec<String>)>> {
        Some(
            self.smaps_flags()
                .into_iter()
                .map(|(s, e, f)| (s, e, super::comparable_flags(f)))
                .collect(),
        )
    }
}
