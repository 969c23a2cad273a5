//! The random call generator of `kernel_diff.rs`: calls aimed at the
//! current layout of a [`Region`] (mostly valid, some deliberately bad),
//! covering mmap (with its flags), munmap, mprotect, madvise, the lock
//! calls, mincore, msync, mremap and loads and stores, and two memory
//! objects (memfds): their mappings, `ftruncate`, `pwrite` and `pread`.

use super::ops::{ObjMapping, Op};
use super::*;

/// Interior pages of the region (under 2 MiB: no transparent huge page
/// fits, so residency compares page by page).
pub const PAGES: u64 = 384;
const MAP_LOCKED: u32 = 0x2000;
const MAP_STACK: u32 = 0x2_0000;
const MAP_DROPPABLE: u32 = 0x08;
const MAP_SYNC: u32 = 0x8_0000;
/// Pages of a memory object the generator aims at (sizes, offsets).
const OBJ_PAGES: u64 = 12;
const MLOCK_ONFAULT: u32 = 1;
const MADV_RANDOM: i32 = 1;
const MADV_SEQUENTIAL: i32 = 2;
const MADV_WILLNEED: i32 = 3;
const MADV_DONTFORK: i32 = 10;
const MADV_DOFORK: i32 = 11;
const MADV_HUGEPAGE: i32 = 14;
const MADV_NOHUGEPAGE: i32 = 15;
const MADV_DONTDUMP: i32 = 16;
const MADV_DODUMP: i32 = 17;
const MADV_WIPEONFORK: i32 = 18;
const MADV_KEEPONFORK: i32 = 19;
const MADV_POPULATE_READ: i32 = 22;
const MADV_POPULATE_WRITE: i32 = 23;
const MADV_DONTNEED_LOCKED: i32 = 24;

/// splitmix64.
pub struct Rng(pub u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
    /// True with probability `pct`%.
    fn pct(&mut self, pct: u64) -> bool {
        self.next() % 100 < pct
    }
    fn pick<T: Copy>(&mut self, v: &[T]) -> T {
        v[(self.next() % v.len() as u64) as usize]
    }
}

/// Generates calls for the canonical region, aimed at the current layout.
pub struct Gen {
    rng: Rng,
    r: Region,
    /// Interior VMAs after the last call (canonical addresses).
    pub vmas: Vec<Vma>,
}

impl Gen {
    /// A generator seeded with `seed`, aimed at `r`.
    pub fn new(seed: u64, r: Region) -> Self {
        Gen {
            rng: Rng(seed),
            r,
            vmas: Vec::new(),
        }
    }

    fn page(&mut self) -> u64 {
        self.r.page(self.rng.range(0, PAGES - 1))
    }

    fn len_pages(&mut self) -> u64 {
        match self.rng.next() % 20 {
            0..=13 => self.rng.range(1, 8),
            14..=17 => self.rng.range(9, 40),
            _ => self.rng.range(41, 160),
        }
    }

    /// A length in bytes: whole pages, sometimes an odd byte count.
    fn len(&mut self) -> u64 {
        let p = self.len_pages();
        if self.rng.pct(12) {
            p * PAGE - self.rng.range(1, PAGE - 1)
        } else {
            p * PAGE
        }
    }

    /// Clamps `[addr, addr + len)` to the interior (keeps odd lengths odd;
    /// leaves lengths whose page rounding overflows, which every call
    /// rejects).
    fn clamp(&self, addr: u64, len: u64) -> u64 {
        let room = self.r.hi.saturating_sub(addr);
        match page_align(len) {
            Some(l) if l > room => room,
            _ => len,
        }
    }

    fn vma(&mut self) -> Option<Vma> {
        let r = self.r;
        let inner: Vec<&Vma> = self
            .vmas
            .iter()
            .filter(|v| v.start >= r.lo && v.end <= r.hi)
            .collect();
        if inner.is_empty() {
            None
        } else {
            Some(inner[(self.rng.next() % inner.len() as u64) as usize].clone())
        }
    }

    /// A range: random, or aimed at an existing VMA (whole, part, or
    /// reaching over its neighbours).
    fn range(&mut self) -> (u64, u64) {
        let aimed = if self.rng.pct(65) { self.vma() } else { None };
        let (addr, len) = match aimed {
            Some(v) => {
                let pages = (v.end - v.start) / PAGE;
                match self.rng.next() % 6 {
                    0 | 1 => (v.start, v.end - v.start),
                    2 => {
                        // Strictly inside (or the whole, for one page).
                        let s = self.rng.range(0, pages - 1);
                        let e = self.rng.range(s + 1, pages);
                        (v.start + s * PAGE, (e - s) * PAGE)
                    }
                    3 => {
                        // From the middle, past the end.
                        let s = self.rng.range(0, pages - 1);
                        (
                            v.start + s * PAGE,
                            (pages - s + self.rng.range(1, 12)) * PAGE,
                        )
                    }
                    4 => {
                        // From before the start, into the VMA.
                        let before = self.rng.range(1, 12) * PAGE;
                        let a = v.start.saturating_sub(before).max(self.r.lo);
                        (a, v.start - a + self.rng.range(1, pages) * PAGE)
                    }
                    _ => {
                        // Over several VMAs and holes.
                        let a = v
                            .start
                            .saturating_sub(self.rng.range(0, 4) * PAGE)
                            .max(self.r.lo);
                        (a, self.rng.range(pages, pages + 64) * PAGE)
                    }
                }
            }
            None => {
                let a = self.page();
                (a, self.len())
            }
        };
        let len = if self.rng.pct(8) && len > PAGE {
            len - self.rng.range(1, PAGE - 1)
        } else {
            len
        };
        (addr, self.clamp(addr, len))
    }

    /// A call shape the kernel rejects before doing anything:
    /// (addr, len) that is unaligned, empty, overflowing, or past the task
    /// size.
    fn bad_range(&mut self) -> (u64, u64) {
        let a = self.page();
        match self.rng.next() % 6 {
            0 => (a + self.rng.range(1, PAGE - 1), PAGE),
            1 => (a, 0),
            2 => (a, u64::MAX - self.rng.range(0, PAGE - 2)),
            3 => (TASK_SIZE + self.rng.range(0, 4) * PAGE, PAGE),
            4 => (LAST_PAGE, PAGE),
            _ => (a + self.rng.range(1, PAGE - 1), 0),
        }
    }

    fn prot(&mut self) -> u32 {
        match self.rng.next() % 20 {
            0..=8 => RW,
            9..=12 => PROT_READ,
            13..=14 => PROT_NONE,
            15 => PROT_WRITE,
            16 => PROT_EXEC,
            17 => PROT_READ | PROT_EXEC,
            _ => RW | PROT_EXEC,
        }
    }

    fn mmap(&mut self) -> Op {
        let prot = self.prot();
        let mut flags = match self.rng.next() % 44 {
            0..=29 => ANON,
            30..=37 => SHARED_ANON,
            38 => MAP_ANONYMOUS,                              // neither: EINVAL
            39..=41 => MAP_DROPPABLE | MAP_ANONYMOUS,         // Linux 6.11+
            42 => MAP_DROPPABLE | MAP_SHARED | MAP_ANONYMOUS, // unknown type: EINVAL
            _ => MAP_SHARED | MAP_PRIVATE | MAP_ANONYMOUS,    // MAP_SHARED_VALIDATE
        };
        if self.rng.pct(8) {
            flags |= MAP_POPULATE;
        }
        if self.rng.pct(10) {
            flags |= MAP_NORESERVE;
        }
        if self.rng.pct(5) {
            flags |= MAP_LOCKED;
        }
        if self.rng.pct(5) {
            flags |= MAP_STACK;
        }
        if self.rng.pct(if flags & MAP_SHARED != 0 { 2 } else { 8 }) {
            flags |= MAP_GROWSDOWN;
        }
        let (addr, len) = match self.rng.next() % 20 {
            0..=11 => {
                flags |= MAP_FIXED;
                let a = self.page();
                (a, self.len())
            }
            12..=13 => {
                flags |= MAP_FIXED_NOREPLACE;
                let a = self.page();
                (a, self.len())
            }
            14..=16 => {
                // A hint inside the region, sometimes unaligned.
                let a = self.page();
                let a = if self.rng.pct(20) {
                    a + self.rng.range(1, PAGE - 1)
                } else {
                    a
                };
                (a, self.len())
            }
            17 => {
                // No hint; now and then a multiple of 2 MiB, which Linux
                // places 2 MiB-aligned (it never fits in the region).
                let len = if self.rng.pct(25) {
                    self.rng.range(1, 2) * (2 << 20)
                } else {
                    self.len()
                };
                (0, len)
            }
            _ => {
                flags |= self.rng.pick(&[MAP_FIXED, MAP_FIXED_NOREPLACE, 0]);
                let (a, l) = self.bad_range();
                // Non-fixed with a huge length must fail: keep it > TASK_SIZE.
                if flags & (MAP_FIXED | MAP_FIXED_NOREPLACE) == 0 && l > PAGE {
                    (a, u64::MAX - self.rng.range(0, 2 * PAGE))
                } else {
                    (a, l)
                }
            }
        };
        let len = if flags & (MAP_FIXED | MAP_FIXED_NOREPLACE) != 0
            && addr >= self.r.lo
            && addr < self.r.hi
        {
            self.clamp(addr, len)
        } else {
            len
        };
        Op::Mmap {
            addr,
            len,
            prot,
            flags,
        }
    }

    /// An mmap of a memory object: the placement, length, protection and
    /// flags of [`mmap`](Self::mmap), with a file's type (shared, private,
    /// `MAP_SHARED_VALIDATE`, sometimes with a flag it rejects) and an
    /// offset (sometimes unaligned).
    fn mmap_obj(&mut self) -> Op {
        let Op::Mmap {
            addr,
            len,
            prot,
            flags,
        } = self.mmap()
        else {
            unreachable!("mmap() makes an mmap")
        };
        let ty = match self.rng.next() % 20 {
            0..=8 => MAP_SHARED,
            9..=16 => MAP_PRIVATE,
            17..=18 => MAP_SHARED | MAP_PRIVATE,
            _ => MAP_SHARED | MAP_PRIVATE | MAP_SYNC, // EOPNOTSUPP
        };
        let flags = (flags & !(0x0f | MAP_ANONYMOUS)) | ty;
        let off = self.rng.range(0, OBJ_PAGES) * PAGE;
        let off = if self.rng.pct(4) {
            off + self.rng.range(1, PAGE - 1)
        } else {
            off
        };
        Op::MmapObj(ObjMapping {
            addr,
            len,
            prot,
            flags,
            obj: (self.rng.next() % u64::from(OBJECTS)) as u32,
            off,
        })
    }

    /// A size, offset or length in a memory object: whole pages, or an
    /// odd byte count, up to a few pages past [`OBJ_PAGES`].
    fn obj_bytes(&mut self) -> u64 {
        let pages = self.rng.range(0, OBJ_PAGES + 2);
        if self.rng.pct(30) {
            pages * PAGE + self.rng.range(1, PAGE - 1)
        } else {
            pages * PAGE
        }
    }

    /// `ftruncate` (shrinking or growing, mapped or not), `pwrite` or
    /// `pread` on a memory object.
    fn obj_op(&mut self) -> Op {
        let obj = (self.rng.next() % u64::from(OBJECTS)) as u32;
        match self.rng.next() % 10 {
            0..=4 => Op::Truncate {
                obj,
                len: self.obj_bytes(),
            },
            5..=7 => Op::ObjWrite {
                obj,
                off: self.obj_bytes(),
                len: self.rng.range(1, 2 * PAGE),
                seed: self.rng.next() % 1000,
            },
            _ => Op::ObjRead {
                obj,
                off: self.obj_bytes(),
                len: self.rng.range(1, 2 * PAGE),
            },
        }
    }

    fn munmap(&mut self) -> Op {
        let (addr, len) = if self.rng.pct(8) {
            self.bad_range()
        } else {
            self.range()
        };
        let len = if self.rng.pct(2) && addr < TASK_SIZE {
            TASK_SIZE
        } else {
            len
        };
        Op::Munmap { addr, len }
    }

    fn mprotect(&mut self) -> Op {
        let (addr, len) = if self.rng.pct(8) {
            self.bad_range()
        } else {
            self.range()
        };
        let prot = match self.rng.next() % 50 {
            0 => 0x10 | PROT_READ,        // unknown bit: EINVAL
            1 => 0x0100_0000 | PROT_READ, // PROT_GROWSDOWN
            2 => 0x0300_0000 | PROT_READ, // both: EINVAL
            _ => self.prot(),
        };
        Op::Mprotect { addr, len, prot }
    }

    fn madvise(&mut self) -> Op {
        let (addr, len) = if self.rng.pct(8) {
            self.bad_range()
        } else {
            self.range()
        };
        // Every advice aspace models but MADV_FREE, whose pages the kernel
        // frees only under memory pressure (aspace frees them at once, as
        // if reclaimed right away: the bytes are not comparable), and
        // MADV_REMOVE, whose punched pages aspace keeps, zeroed, in the
        // object (mincore sees them; tests/linux_surface.rs checks it
        // without mincore).
        let advice = match self.rng.next() % 40 {
            0..=19 => MADV_DONTNEED,
            20 => MADV_NORMAL,
            _ => self.rng.pick(&[
                MADV_RANDOM,
                MADV_SEQUENTIAL,
                MADV_WILLNEED,
                MADV_DONTFORK,
                MADV_DOFORK,
                MADV_HUGEPAGE,
                MADV_NOHUGEPAGE,
                MADV_DONTDUMP,
                MADV_DODUMP,
                MADV_WIPEONFORK,
                MADV_KEEPONFORK,
                MADV_POPULATE_READ,
                MADV_POPULATE_WRITE,
                MADV_DONTNEED_LOCKED,
            ]),
        };
        Op::Madvise { addr, len, advice }
    }

    /// mlock / mlock2 (ONFAULT, or an unknown flag) / munlock.
    fn lock(&mut self) -> Op {
        let (addr, len) = if self.rng.pct(8) {
            self.bad_range()
        } else {
            self.range()
        };
        // mlock rounds an unaligned start down instead of failing. The
        // offset stays in the start's page: added to a start already
        // unaligned (a bad range's), it could carry the start into the
        // page past the region, which mlock then locks (a zero length
        // still rounds up to a page).
        let addr = if self.rng.pct(5) {
            (addr & !(PAGE - 1)) + self.rng.range(1, PAGE - 1)
        } else {
            addr
        };
        // Clamped from the unaligned start: its rounded range stays inside.
        let len = self.clamp(addr, len);
        match self.rng.next() % 10 {
            0..=3 => Op::Mlock {
                addr,
                len,
                flags: 0,
            },
            4..=5 => Op::Mlock {
                addr,
                len,
                flags: if self.rng.pct(90) { MLOCK_ONFAULT } else { 2 },
            },
            _ => Op::Munlock { addr, len },
        }
    }

    /// msync or mincore (these only inspect), inside the region.
    fn inspect(&mut self) -> Op {
        let (addr, len) = if self.rng.pct(8) {
            self.bad_range()
        } else {
            self.range()
        };
        if self.rng.pct(50) {
            let flags = self.rng.pick(&[0, 1, 4, 2, 6, 3, 5, 8]);
            Op::Msync { addr, len, flags }
        } else {
            // Keep mincore inside the region: past it lie this process's
            // own mappings.
            let len = if addr >= self.r.start && addr < self.r.end {
                len.min(self.r.end - addr)
            } else {
                len
            };
            Op::Mincore { addr, len }
        }
    }

    fn mremap(&mut self) -> Op {
        let (old, mut old_len) = match self.vma() {
            Some(v) if self.rng.pct(85) => {
                let pages = (v.end - v.start) / PAGE;
                let s = if self.rng.pct(65) {
                    0
                } else {
                    self.rng.range(0, pages - 1)
                };
                let old = v.start + s * PAGE;
                let rest = pages - s;
                let l = match self.rng.next() % 20 {
                    0..=10 => rest * PAGE,
                    11..=14 => self.rng.range(1, rest) * PAGE,
                    15..=16 => (rest + self.rng.range(1, 8)) * PAGE, // crosses the VMA end
                    17 => 0,
                    _ => self.rng.range(1, rest) * PAGE - self.rng.range(1, PAGE - 1),
                };
                (old, l)
            }
            _ => {
                let a = self.page();
                (a, self.rng.range(1, 8) * PAGE)
            }
        };
        let old = if self.rng.pct(3) {
            old + self.rng.range(1, PAGE - 1)
        } else {
            old
        };
        old_len = self.clamp(old & !(PAGE - 1), old_len);
        let base_len = page_align(old_len).unwrap().max(PAGE);
        let mut new_len = match self.rng.next() % 40 {
            0..=5 => old_len,
            6..=15 => self.rng.range(1, (base_len / PAGE).max(1)) * PAGE,
            16..=30 => base_len + self.rng.range(1, 8) * PAGE,
            // Now and then 2 MiB: a move Linux places 2 MiB-aligned.
            31..=34 if self.rng.pct(20) => 2 << 20,
            31..=34 => base_len + self.rng.range(9, 64) * PAGE,
            35..=36 => base_len + self.rng.range(1, 3) * PAGE - self.rng.range(1, PAGE - 1),
            37 => 0,
            38 => u64::MAX - self.rng.range(0, PAGE - 2),
            _ => base_len,
        };
        let flags = match self.rng.next() % 50 {
            0..=11 => 0,
            12..=25 => MREMAP_MAYMOVE,
            26..=37 => MREMAP_MAYMOVE | MREMAP_FIXED,
            38..=42 => MREMAP_MAYMOVE | MREMAP_DONTUNMAP,
            43..=45 => MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP,
            46 => MREMAP_FIXED,
            47 => MREMAP_DONTUNMAP,
            48 => 8 | MREMAP_MAYMOVE,
            _ => MREMAP_FIXED | MREMAP_DONTUNMAP,
        };
        if flags & MREMAP_DONTUNMAP != 0 && self.rng.pct(85) {
            new_len = old_len;
        }
        let mut new_addr = 0;
        if flags & (MREMAP_FIXED | MREMAP_DONTUNMAP) != 0 {
            new_addr = match self.rng.next() % 20 {
                // Overlapping the old range.
                0..=1 => (old & !(PAGE - 1)) + self.rng.range(0, 2) * PAGE,
                2 => self.page() + self.rng.range(1, PAGE - 1),
                _ => self.page(),
            };
            let fits = page_align(new_len)
                .is_some_and(|l| l != 0 && new_addr <= self.r.hi && l <= self.r.hi - new_addr);
            if !fits
                && flags & MREMAP_FIXED != 0
                && new_addr % PAGE == 0
                && flags & MREMAP_MAYMOVE != 0
            {
                // Keep a possible destination inside the interior (one
                // starting past it moves to the interior's start).
                new_len = match page_align(new_len) {
                    Some(l) if l != 0 => self.r.hi.saturating_sub(new_addr).min(l),
                    _ => new_len,
                };
                if new_len == 0 {
                    new_len = PAGE;
                    new_addr = self.r.lo;
                }
            }
        } else if self.rng.pct(30) {
            new_addr = self.page(); // ignored without FIXED
        }
        Op::Mremap {
            old,
            old_len,
            new_len,
            flags,
            new_addr,
        }
    }

    fn access_range(&mut self) -> (u64, u64) {
        let base = match self.vma() {
            Some(v) if self.rng.pct(85) => {
                v.start + self.rng.range(0, (v.end - v.start) / PAGE - 1) * PAGE
            }
            _ => self.page(),
        };
        let off = if self.rng.pct(30) {
            self.rng.range(0, PAGE - 1)
        } else {
            0
        };
        let len = match self.rng.next() % 10 {
            0..=4 => self.rng.range(1, PAGE),
            5..=8 => self.rng.range(1, 3) * PAGE,
            _ => self.rng.range(1, 8) * PAGE,
        };
        let addr = base + off;
        (addr, len.min(self.r.end - addr))
    }

    pub fn op(&mut self) -> Op {
        if self.rng.pct(5) {
            return self.obj_op();
        }
        match self.rng.next() % 100 {
            0..=3 => self.mmap_obj(),
            4..=17 => self.mmap(),
            18..=27 => self.munmap(),
            28..=41 => self.mprotect(),
            42..=56 => self.mremap(),
            57..=65 => self.madvise(),
            66..=70 => self.lock(),
            71..=73 => self.inspect(),
            74..=90 => {
                let (addr, len) = self.access_range();
                Op::Write {
                    addr,
                    len,
                    seed: self.rng.next() % 1000,
                }
            }
            _ => {
                let (addr, len) = self.access_range();
                Op::Read { addr, len }
            }
        }
    }
}
