//! Operations as data: printable (to reproduce a failing sequence) and
//! applicable to any [`Target`] with a normalized [`Outcome`].

use super::{
    page_align, pattern, Target, MAP_FIXED, MAP_FIXED_NOREPLACE, MREMAP_FIXED, MREMAP_MAYMOVE, PAGE,
};
use std::fmt;

/// The arguments of an `mmap` of memory object `obj` from byte `off`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ObjMapping {
    pub addr: u64,
    pub len: u64,
    pub prot: u32,
    pub flags: u32,
    pub obj: u32,
    pub off: u64,
}

/// One call.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Mmap {
        addr: u64,
        len: u64,
        prot: u32,
        flags: u32,
    },
    Munmap {
        addr: u64,
        len: u64,
    },
    Mprotect {
        addr: u64,
        len: u64,
        prot: u32,
    },
    Mremap {
        old: u64,
        old_len: u64,
        new_len: u64,
        flags: u32,
        new_addr: u64,
    },
    Madvise {
        addr: u64,
        len: u64,
        advice: i32,
    },
    /// Store `pattern(seed, addr, len)` at `addr`.
    Write {
        addr: u64,
        len: u64,
        seed: u64,
    },
    /// Load `len` bytes at `addr`.
    Read {
        addr: u64,
        len: u64,
    },
    /// `mlock2` (flags 0 is `mlock`).
    Mlock {
        addr: u64,
        len: u64,
        flags: u32,
    },
    Munlock {
        addr: u64,
        len: u64,
    },
    Msync {
        addr: u64,
        len: u64,
        flags: u32,
    },
    Mincore {
        addr: u64,
        len: u64,
    },
    /// `mmap` of a memory object.
    MmapObj(ObjMapping),
    /// `ftruncate` of memory object `obj`.
    Truncate {
        obj: u32,
        len: u64,
    },
    /// `pwrite` of `pattern(seed, off, len)` to memory object `obj`.
    ObjWrite {
        obj: u32,
        off: u64,
        len: u64,
        seed: u64,
    },
    /// `pread` of `len` bytes of memory object `obj`.
    ObjRead {
        obj: u32,
        off: u64,
        len: u64,
    },
}

fn prot_str(p: u32) -> String {
    if p == 0 {
        return "NONE".into();
    }
    let mut v = Vec::new();
    for (b, n) in [(1, "R"), (2, "W"), (4, "X")] {
        if p & b != 0 {
            v.push(n.to_string());
        }
    }
    let rest = p & !7;
    if rest != 0 {
        v.push(format!("{rest:#x}"));
    }
    v.join("|")
}

fn map_flags_str(f: u32) -> String {
    let names = [
        (0x01, "SHARED"),
        (0x02, "PRIVATE"),
        (0x10, "FIXED"),
        (0x20, "ANON"),
        (0x100, "GROWSDOWN"),
        (0x4000, "NORESERVE"),
        (0x8000, "POPULATE"),
        (0x10_0000, "FIXED_NOREPLACE"),
        (0x08, "DROPPABLE"),
        (0x2000, "LOCKED"),
        (0x2_0000, "STACK"),
        (0x8_0000, "SYNC"),
    ];
    let mut v: Vec<String> = names
        .iter()
        .filter(|(b, _)| f & b != 0)
        .map(|(_, n)| n.to_string())
        .collect();
    let known: u32 = names.iter().map(|(b, _)| b).sum();
    if f & !known != 0 {
        v.push(format!("{:#x}", f & !known));
    }
    if v.is_empty() {
        "0".into()
    } else {
        v.join("|")
    }
}

fn mremap_flags_str(f: u32) -> String {
    let mut v = Vec::new();
    for (b, n) in [(1, "MAYMOVE"), (2, "FIXED"), (4, "DONTUNMAP")] {
        if f & b != 0 {
            v.push(n.to_string());
        }
    }
    if f & !7 != 0 {
        v.push(format!("{:#x}", f & !7));
    }
    if v.is_empty() {
        "0".into()
    } else {
        v.join("|")
    }
}

impl Op {
    /// Whether the call lets the kernel choose the address (when it
    /// succeeds): an mmap without a fixed address, an mremap that may move
    /// without `MREMAP_FIXED`.
    pub fn places(self) -> bool {
        match self {
            Op::Mmap { flags, .. } => flags & (MAP_FIXED | MAP_FIXED_NOREPLACE) == 0,
            Op::MmapObj(m) => m.flags & (MAP_FIXED | MAP_FIXED_NOREPLACE) == 0,
            Op::Mremap { flags, .. } => flags & MREMAP_MAYMOVE != 0 && flags & MREMAP_FIXED == 0,
            _ => false,
        }
    }
}

impl fmt::Debug for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Op::Mmap {
                addr,
                len,
                prot,
                flags,
            } => write!(
                f,
                "mmap({addr:#x}, {len:#x}, {}, {})",
                prot_str(prot),
                map_flags_str(flags)
            ),
            Op::Munmap { addr, len } => write!(f, "munmap({addr:#x}, {len:#x})"),
            Op::Mprotect { addr, len, prot } => {
                write!(f, "mprotect({addr:#x}, {len:#x}, {})", prot_str(prot))
            }
            Op::Mremap {
                old,
                old_len,
                new_len,
                flags,
                new_addr,
            } => write!(
                f,
                "mremap({old:#x}, {old_len:#x}, {new_len:#x}, {}, {new_addr:#x})",
                mremap_flags_str(flags)
            ),
            Op::Madvise { addr, len, advice } => {
                let a = match advice {
                    4 => "DONTNEED".to_string(),
                    0 => "NORMAL".to_string(),
                    a => a.to_string(),
                };
                write!(f, "madvise({addr:#x}, {len:#x}, {a})")
            }
            Op::Write { addr, len, seed } => {
                write!(f, "write({addr:#x}, {len:#x} bytes, pattern {seed})")
            }
            Op::Read { addr, len } => write!(f, "read({addr:#x}, {len:#x} bytes)"),
            Op::Mlock { addr, len, flags } => write!(f, "mlock2({addr:#x}, {len:#x}, {flags})"),
            Op::Munlock { addr, len } => write!(f, "munlock({addr:#x}, {len:#x})"),
            Op::Msync { addr, len, flags } => write!(f, "msync({addr:#x}, {len:#x}, {flags})"),
            Op::Mincore { addr, len } => write!(f, "mincore({addr:#x}, {len:#x})"),
            Op::MmapObj(m) => write!(
                f,
                "mmap({:#x}, {:#x}, {}, {}, memfd{}, {:#x})",
                m.addr,
                m.len,
                prot_str(m.prot),
                map_flags_str(m.flags),
                m.obj,
                m.off
            ),
            Op::Truncate { obj, len } => write!(f, "ftruncate(memfd{obj}, {len:#x})"),
            Op::ObjWrite {
                obj,
                off,
                len,
                seed,
            } => write!(
                f,
                "pwrite(memfd{obj}, {len:#x} bytes, pattern {seed}, {off:#x})"
            ),
            Op::ObjRead { obj, off, len } => {
                write!(f, "pread(memfd{obj}, {len:#x} bytes, {off:#x})")
            }
        }
    }
}

/// Bytes with a short Debug form.
#[derive(Clone, PartialEq, Eq)]
pub struct Bytes(pub Vec<u8>);

impl fmt::Debug for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let h = self.0.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
            (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
        });
        let zero = self.0.iter().all(|&b| b == 0);
        write!(
            f,
            "{} bytes{} fnv={h:016x} head={:02x?}",
            self.0.len(),
            if zero { " (all zero)" } else { "" },
            &self.0[..self.0.len().min(8)]
        )
    }
}

/// What a call gave, in a form both sides can be compared on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Success without a value.
    Done,
    /// An address inside the test region, as an offset from the region's
    /// start (so that runs on differently placed regions compare).
    At(u64),
    /// An address outside the test region, as a (wrapping) offset from
    /// the region's start: the harness loaded the new mapping's first
    /// pages (None = EFAULT) and unmapped it again. The offset compares
    /// only where placements are confined
    /// ([`KernelTarget::confine_placements`](super::KernelTarget::confine_placements));
    /// elsewhere the kernel's placement outside is its own.
    Outside(u64, Vec<Option<Bytes>>),
    /// Bytes loaded by a read.
    Loaded(Bytes),
    /// Residency by page (mincore).
    Resident(Vec<bool>),
    /// Bytes written by a `pwrite`.
    Count(usize),
    /// The errno.
    Err(i32),
}

/// Pages of an outside mapping loaded before unmapping it.
const OUTSIDE_PAGES: u64 = 8;

/// Runs `op` on `t`. An address result outside the region is loaded and
/// unmapped at once (see [`Outcome::Outside`]).
pub fn apply(t: &mut dyn Target, op: Op) -> Outcome {
    let r = t.region();
    let addr_result = |t: &mut dyn Target, res: Result<u64, i32>, len: u64| match res {
        Err(e) => Outcome::Err(e),
        Ok(a) if r.contains(a) => Outcome::At(a - r.start),
        Ok(a) => {
            let len = page_align(len).expect("a mapping that exists has a sane length");
            let mut pages = Vec::new();
            for i in 0..(len / PAGE).min(OUTSIDE_PAGES) {
                let mut b = vec![0u8; PAGE as usize];
                pages.push(t.read(a + i * PAGE, &mut b).ok().map(|_| Bytes(b)));
            }
            t.unmap_outside(a, len).unwrap_or_else(|e| {
                panic!(
                    "[{}] munmap of the outside mapping {a:#x}: errno {e}",
                    t.name()
                )
            });
            Outcome::Outside(a.wrapping_sub(r.start), pages)
        }
    };
    let unit = |res: Result<(), i32>| match res {
        Ok(()) => Outcome::Done,
        Err(e) => Outcome::Err(e),
    };
    match op {
        Op::Mmap {
            addr,
            len,
            prot,
            flags,
        } => {
            let res = t.mmap(addr, len, prot, flags);
            addr_result(t, res, len)
        }
        Op::Munmap { addr, len } => unit(t.munmap(addr, len)),
        Op::Mprotect { addr, len, prot } => unit(t.mprotect(addr, len, prot)),
        Op::Mremap {
            old,
            old_len,
            new_len,
            flags,
            new_addr,
        } => {
            let res = t.mremap(old, old_len, new_len, flags, new_addr);
            addr_result(t, res, new_len)
        }
        Op::Madvise { addr, len, advice } => unit(t.madvise(addr, len, advice)),
        Op::Write { addr, len, seed } => unit(t.write(addr, &pattern(seed, addr, len as usize))),
        Op::Read { addr, len } => {
            let mut b = vec![0u8; len as usize];
            match t.read(addr, &mut b) {
                Ok(()) => Outcome::Loaded(Bytes(b)),
                Err(e) => Outcome::Err(e),
            }
        }
        Op::Mlock { addr, len, flags } => unit(t.mlock2(addr, len, flags)),
        Op::Munlock { addr, len } => unit(t.munlock(addr, len)),
        Op::Msync { addr, len, flags } => unit(t.msync(addr, len, flags)),
        Op::Mincore { addr, len } => match t.mincore(addr, len) {
            Ok(v) => Outcome::Resident(v),
            Err(e) => Outcome::Err(e),
        },
        Op::MmapObj(m) => {
            let res = t.mmap_obj(m);
            addr_result(t, res, m.len)
        }
        Op::Truncate { obj, len } => unit(t.obj_truncate(obj, len)),
        Op::ObjWrite {
            obj,
            off,
            len,
            seed,
        } => match t.obj_write(obj, off, &pattern(seed, off, len as usize)) {
            Ok(n) => Outcome::Count(n),
            Err(e) => Outcome::Err(e),
        },
        Op::ObjRead { obj, off, len } => {
            let mut b = vec![0u8; len as usize];
            match t.obj_read(obj, off, &mut b) {
                Ok(n) => Outcome::Loaded(Bytes(b[..n].to_vec())),
                Err(e) => Outcome::Err(e),
            }
        }
    }
}
